# Shared helpers for the colossal-infer end-to-end tests (sourced, not run).
# The test harness exports top_builddir, top_srcdir and MPIEXEC.
: "${top_builddir:?top_builddir must be set (run through make check)}"
: "${MPIEXEC:=mpiexec}"
. "$top_srcdir/tests/apps/launch_lib.sh"
INFER_BIN="$top_builddir/apps/colossal-infer"
PRETRAIN_BIN="$top_builddir/apps/colossal-pretrain"
CKPT_BIN="$top_builddir/apps/colossal-ckpt"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/colossal-infer-test.XXXXXX")
trap '[ -n "$KEEP_TMP" ] || rm -rf "$TMP"' EXIT

fail() {
    echo "FAIL: $*" >&2
    for f in "$TMP"/out "$TMP"/err; do
        [ -s "$f" ] && { echo "--- $(basename "$f"):" >&2; tail -n 40 "$f" >&2; }
    done
    exit 1
}

# A tiny GPT-2 trained for a few steps on the embedded corpus with a
# 300-token BPE, its checkpoint in $TMP/run/checkpoints and its greedy
# samples of PROMPTS in $TMP/pretrain.out.
PROMPT_A="Once upon a time,"
PROMPT_B="Q: What is 7 times 8? A:"
pretrain_tiny() {
    echo "+ colossal-pretrain (tiny, 2 ranks)"
    $MPIEXEC -n 2 --oversubscribe "$PRETRAIN_BIN" --model.n_layers 2 --model.d_model 64 --model.n_heads 4 \
        --train.seq_len 64 --train.micro_batch 4 --optim.lr 3e-3 --optim.warmup_steps 2 --train.steps 80 \
        --data.corpus_docs 1500 --data.corpus_vocab 300 --generate.tokens 16 \
        --generate.prompts "$PROMPT_A|$PROMPT_B" --checkpoint.every 80 --run.dir "$TMP/run" \
        --run.peak_tflops 1 --log.timestamps false >"$TMP/pretrain.out" 2>"$TMP/err" || fail "pretrain failed"
    [ -f "$TMP/run/checkpoints/latest" ] || fail "pretrain wrote no checkpoint"
}

# run_infer N ARGS...: colossal-infer on N ranks over the tiny checkpoint;
# stdout in $TMP/out, stderr in $TMP/err, exit status in $RC.
run_infer() {
    n=$1
    shift
    cai_launch "$n" "$INFER_BIN" --model.path "$TMP/run/checkpoints" --log.timestamps false \
        --run.dir "$TMP/infer-run" --infer.progress 0 "$@"
}

expect_ok() { [ "$RC" -eq 0 ] || fail "expected exit 0, got $RC"; }
expect_fail() { [ "$RC" -ne 0 ] || fail "expected a failure, got exit 0"; }
expect_grep() { grep -Eq -- "$2" "$TMP/$1" || fail "${3:-$1 lacks /$2/}"; }

# same_results BASE OTHER: the result lines of the two files, keyed by id,
# are equal but for the OpenAI "created" time and log-probabilities, which
# may differ by 1e-3 (their last bits depend on the batch and the tp split a
# row was computed in). Prints the first difference.
same_results() {
    python3 - "$1" "$2" <<'PY'
import json, sys
def load(path):
    rows = {}
    for line in open(path):
        o = json.loads(line)
        o.get("response", {}).get("body", {}).pop("created", None)
        rows[o.get("custom_id", o.get("id"))] = o
    return rows
def diff(a, b, where):
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-3
        return None if ok else f"{where}: {a} vs {b}"
    if type(a) is not type(b):
        return f"{where}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            d = diff(a[k], b[k], f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff(x, y, f"{where}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{where}: {a!r} vs {b!r}"
d = diff(load(sys.argv[1]), load(sys.argv[2]), "results")
if d:
    print(d[:400])
    sys.exit(1)
PY
}
