#!/bin/sh
# Prefill throughput on one GPU: colossal's engine (prompt tokens over the
# steps that prefill them, bench/infer_bench.c) beside Hugging Face
# transformers' forward over the same prompts (its default attention,
# logits of the last position only), on the random-weight shapes of
# bench/infer_decode.sh, bf16, one invocation.
#
#   bench/infer_prefill.sh OUTDIR [BIN_DIR]
#
# INFER_MODELS (gpt2,llama), INFER_PREFILLS (PROMPTxBATCH pairs, default
# 512x8,2048x1,2048x4,8192x1) and INFER_HF=0 narrow it. Prints one JSON line
# per run (OUTDIR/prefill.jsonl) and a table of tokens/s and their ratio.
set -u
out=${1:?usage: bench/infer_prefill.sh OUTDIR [BIN_DIR]}
bin=${2:-build-gpu/bench}
mkdir -p "$out"
models=${INFER_MODELS:-gpt2,llama}
runs=${INFER_PREFILLS:-512x8,2048x1,2048x4,8192x1}
res=$out/prefill.jsonl
: >"$res"
for m in $(echo "$models" | tr ',' ' '); do
    case $m in
    gpt2) s="gpt2 12 768 12 12 3072 50257" ;;
    llama) s="llama 16 2048 32 8 8192 128256" ;;
    *) echo "unknown model $m"; exit 2 ;;
    esac
    for r in $(echo "$runs" | tr ',' ' '); do
        p=${r%x*} b=${r#*x}
        # shellcheck disable=SC2086
        timeout 300 "$bin/infer_bench" $s --batches "$b" --prompt "$p" --new 2 >>"$res" 2>"$out/colossal-$m-$r.err" ||
            { echo "infer_bench $m $r failed:"; tail -5 "$out/colossal-$m-$r.err"; }
        if [ "${INFER_HF:-1}" = 1 ]; then
            # shellcheck disable=SC2086
            timeout 300 python3 "$(dirname "$0")/hf_generate_bench.py" $s --batches "$b" --prompt "$p" --new 2 \
                --prefill >>"$res" 2>"$out/hf-$m-$r.err" || { echo "transformers $m $r failed:"; tail -5 "$out/hf-$m-$r.err"; }
        fi
    done
done
python3 - "$res" <<'PY'
import json, sys
by = {}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l)
        by.setdefault((r["family"], r["prompt"], r["batch"]), {})[r["impl"]] = r["prefill_tokens_per_s"]
print(f"{'model':<6} {'prompt':>6} {'batch':>5} {'colossal tok/s':>15} {'transformers':>13} {'ratio':>7}")
nan = float("nan")
for (fam, p, b), d in sorted(by.items()):
    c, h = d.get("colossal", nan), d.get("transformers-forward", nan)
    print(f"{fam:<6} {p:>6} {b:>5} {c:>15.1f} {h:>13.1f} {c / h if h == h and h > 0 else nan:>7.2f}")
PY
