#!/bin/sh
# colossal-sft with a chat template whose special tokens the vocabulary
# lacks (chatml on a 320-token BPE): the tokens are added to the tokenizer
# and the embedding (and an untied LM head) grows by their rows, each the
# mean of the source's rows (transformers' resize_token_embeddings with
# mean initialisation); the other rows are the source's bitwise. The run
# trains, resumes bit-exactly, trains from sft-preprocess --add-special-tokens
# output as from the JSONL, tp 2 gives the 1-rank run, and the Hugging
# Face export carries the grown vocabulary (config.json, tokenizer) and
# answers in colossal-infer as the checkpoint does.
. "$top_srcdir/tests/apps/sft_lib.sh"
sft_setup
export_hf() { # CHECKPOINTS TOKENIZER OUT
    $MPIEXEC -n 1 "$top_builddir/apps/colossal-ckpt" export --input "$1" --output "$3" --tokenizer "$2" \
        >"$TMP/out" 2>"$TMP/err" || fail "export of $1 failed"
}
export_hf "$TMP/pt/checkpoints" "$TMP/pt/tokenizer" "$TMP/pt-hf"
SFT="--data.train $TMP/ex/train.jsonl --data.valid $TMP/ex/held_out.jsonl --data.chat_template chatml $SFT_TINY
  --train.micro_batch 2 --train.grad_accum 2"
# Under the sanitizers (make check-sanitize: CAI_SANITIZE=1) the Llama source
# pretrains 2 steps instead of 10 and the chatml runs train 4 steps (stopped
# and resumed at 2) instead of 12 (at 6), and the tp 2 comparison is left out.
SAN=${CAI_SANITIZE:-0}
LS=10
TS=12
[ "$SAN" != 1 ] || {
    LS=2
    TS=4
}
LR0="--optim.lr 0 --optim.min_lr 0 --optim.warmup_steps 0 --train.steps 1 --checkpoint.every 1 --eval.interval 0"

# rows FROM TO NAMES...: in TO's safetensors, every tensor NAME has FROM's
# rows bitwise and two more rows, each the mean of FROM's (f32 of the f64
# mean, within 1e-7); config.json and tokenizer.json say 322 tokens.
rows() {
    from=$1
    to=$2
    shift 2
    python3 - "$from" "$to" "$@" <<'EOF' || fail "the grown rows are not the source's rows and their mean"
import json, struct, sys
def load(d):
    b = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", v
        s, e = v["data_offsets"]
        x = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
        c = v["shape"][-1] if len(v["shape"]) > 1 else 1
        out[k] = [x[i * c:(i + 1) * c] for i in range(len(x) // c)]
    return out
f32 = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]
src, dst = load(sys.argv[1]), load(sys.argv[2])
for name in sys.argv[3:]:
    a, b = src[name], dst[name]
    assert len(b) == len(a) + 2, (name, len(a), len(b))
    assert b[:len(a)] == a, name + ": the source's rows changed"
    mean = [f32(sum(r[j] for r in a) / len(a)) for j in range(len(a[0]))]
    d = max(abs(x - m) for row in b[len(a):] for x, m in zip(row, mean))
    print("%s: %d rows kept bitwise, 2 added rows within %.1e of the mean of the source's" % (name, len(a), d))
    assert d <= 1e-7, d
c = json.load(open(sys.argv[2] + "/config.json"))
t = json.load(open(sys.argv[2] + "/tokenizer.json"))
added = {a["content"]: a["id"] for a in t["added_tokens"]}
print("config.json vocab_size %d, tokenizer %d tokens, added %s" % (c["vocab_size"], len(t["model"]["vocab"]), added))
assert c["vocab_size"] == 322 and len(t["model"]["vocab"]) == 322
assert added.get("<|im_start|>") == 320 and added.get("<|im_end|>") == 321
EOF
}

# GPT-2 (tied head): at lr 0 the checkpoint holds the grown embedding.
# shellcheck disable=SC2086
run_sft 1 $SFT $LR0 --model.path "$TMP/pt-hf" --run.dir "$TMP/g0"
expect_ok
expect_grep out "template chatml \\(its special tokens added to the tokenizer\\)"
expect_grep out "^model: gpt2 .*vocab 322, grown from 320"
export_hf "$TMP/g0/checkpoints" "$TMP/g0/tokenizer" "$TMP/g0-hf"
rows "$TMP/pt-hf" "$TMP/g0-hf" transformer.wte.weight

# Llama (untied head), started from a colossal checkpoint: both grow.
# shellcheck disable=SC2086
run_np 1 $TINY --model.family llama --data.corpus_vocab 320 --train.steps $LS --eval.interval 0 --checkpoint.every $LS \
    --run.dir "$TMP/llama"
expect_ok
export_hf "$TMP/llama/checkpoints" "$TMP/llama/tokenizer" "$TMP/llama-hf"
# shellcheck disable=SC2086
run_sft 1 $SFT $LR0 --model.path "$TMP/llama/checkpoints" --run.dir "$TMP/l0"
expect_ok
export_hf "$TMP/l0/checkpoints" "$TMP/l0/tokenizer" "$TMP/l0-hf"
rows "$TMP/llama-hf" "$TMP/l0-hf" model.embed_tokens.weight lm_head.weight

# Training: the masked loss falls; stopped at the middle step and resumed,
# bitwise the same; tp 2 (vocabulary-parallel rows) the 1-rank run.
RUN="$SFT --model.path $TMP/pt-hf --train.steps $TS --eval.interval $((TS / 2)) --checkpoint.every $((TS / 2))"
# shellcheck disable=SC2086
run_sft 1 $RUN --run.dir "$TMP/t1"
expect_ok
field train loss "$TMP/t1/metrics.jsonl" | awk 'NR==1{f=$2} END{printf "chatml: loss %.4f -> %.4f\n", f, $2; exit !($2 < f)}' ||
    fail "the masked loss did not fall"
# shellcheck disable=SC2086
run_sft 1 $RUN --train.stop_at $((TS / 2)) --run.dir "$TMP/t2"
expect_rc 3
# shellcheck disable=SC2086
run_sft 1 $RUN --resume latest --run.dir "$TMP/t2"
expect_ok
same_losses "$TMP/t1/metrics.jsonl" "$TMP/t2/metrics.jsonl" "chatml run resumed at step $((TS / 2))"
# sft-preprocess --add-special-tokens output with its grown tokenizer: the
# model grows to that tokenizer, the same run.
"$DATA_BIN" sft-preprocess --input "$TMP/ex/train.jsonl" --output-prefix "$TMP/pre" --tokenizer "$TMP/pt/tokenizer" \
    --chat-template chatml --add-special-tokens --seq-len 64 >"$TMP/out" 2>"$TMP/err" || fail "sft-preprocess failed"
# shellcheck disable=SC2086
run_sft 1 $RUN --data.train "$TMP/pre" --model.tokenizer "$TMP/pre_tokenizer" --run.dir "$TMP/t4"
expect_ok
expect_grep out "^model: gpt2 .*vocab 322, grown from 320"
same_losses "$TMP/t1/metrics.jsonl" "$TMP/t4/metrics.jsonl" "chatml from the sft-preprocess prefix"
# the plain suite runs tp 2 on the grown vocabulary; sft_parallel's tp 2 runs under the sanitizers
if [ "$SAN" != 1 ]; then
    # shellcheck disable=SC2086
    run_sft 2 $RUN --mesh.tp 2 --run.dir "$TMP/t3"
    expect_ok
    close_losses "$TMP/t1/metrics.jsonl" "$TMP/t3/metrics.jsonl" "chatml: 1 rank vs tp 2"
fi

# The export answers chat requests as the checkpoint does (greedy).
export_hf "$TMP/t1/checkpoints" "$TMP/t1/tokenizer" "$TMP/t1-hf"
grep '"content":"The answer is [-0-9]*\."}\]}$' "$TMP/ex/held_out.jsonl" | head -n 4 | awk '{
    i = index($0, ",{\"role\":\"assistant\"")
    printf "{\"id\":\"q%d\",\"messages\":%s],\"max_tokens\":8}\n", NR, substr($0, 13, i - 13)
}' >"$TMP/q.jsonl"
[ -s "$TMP/q.jsonl" ] || fail "no held-out arithmetic question"
for m in t1-hf t1/checkpoints; do
    tag=${m%%/*}
    $MPIEXEC -n 1 "$top_builddir/apps/colossal-infer" --model.path "$TMP/$m" --infer.input "$TMP/q.jsonl" \
        --infer.output "$TMP/a-$tag.jsonl" --infer.chat_template chatml --run.dir "$TMP/inf-$tag" \
        >"$TMP/out" 2>"$TMP/err" || fail "colossal-infer on $m failed"
    [ "$(wc -l <"$TMP/a-$tag.jsonl")" -eq 4 ] || fail "$m: not every question answered"
    sed 's/"usage".*//' "$TMP/a-$tag.jsonl" | sort >"$TMP/a-$tag.sorted"
done
cmp -s "$TMP/a-t1.sorted" "$TMP/a-t1-hf.sorted" || fail "the export answers otherwise than the checkpoint"
echo "PASS"
