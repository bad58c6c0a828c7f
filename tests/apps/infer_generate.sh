#!/bin/sh
# colossal-infer end to end on a tiny pretrained checkpoint: greedy results
# equal colossal-pretrain's full-forward samples; native and OpenAI Batch
# lines; the same results (greedy and seeded) whatever max_batch,
# block_size, the KV dtype, dp replicas, tensor parallelism or the source
# (HDF5 checkpoint or its Hugging Face export).
set -e
. "$top_srcdir/tests/apps/infer_lib.sh"
pretrain_tiny

python3 - "$TMP/req.jsonl" "$PROMPT_A" "$PROMPT_B" <<'PY'
import json, sys
path, a, b = sys.argv[1:4]
words = ["Once", "The cat", "Q: What is 3 plus 4? A:", "A dog", "In the", "Tom had"]
with open(path, "w") as f:
    f.write(json.dumps({"id": "a", "prompt": a, "max_tokens": 16}) + "\n")
    f.write(json.dumps({"id": "b", "prompt": b, "max_tokens": 16}) + "\n")
    for i in range(30):
        w = words[i % len(words)] + " " * (i // len(words))
        if i % 3 == 0:
            f.write(json.dumps({"id": "g%d" % i, "prompt": w, "max_tokens": 12}) + "\n")
        elif i % 3 == 1:
            f.write(json.dumps({"id": "s%d" % i, "prompt": w, "max_tokens": 12, "temperature": 0.9,
                                "top_p": 0.95, "seed": i}) + "\n")
        else:
            f.write(json.dumps({"custom_id": "o%d" % i, "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "tiny", "messages": [{"role": "user", "content": w}],
                                         "max_tokens": 10, "temperature": 0.7, "seed": 100 + i,
                                         "logprobs": True, "top_logprobs": 2}}) + "\n")
PY
N=$(wc -l <"$TMP/req.jsonl")

run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/base.jsonl"
expect_ok
[ "$(wc -l <"$TMP/base.jsonl")" -eq "$N" ] || fail "expected $N result lines"
expect_grep out "$N/$N requests"

# Greedy "a" and "b" continue exactly as the pretrain samples (full forward per token).
python3 - "$TMP/base.jsonl" "$TMP/pretrain.out" "$PROMPT_A" "$PROMPT_B" <<'PY' || fail "greedy text differs from colossal-pretrain's samples"
import json, sys
res = {}
for line in open(sys.argv[1]):
    o = json.loads(line)
    res[o.get("custom_id", o.get("id"))] = o
out = open(sys.argv[2]).read().split("\n")
for key, prompt in (("a", sys.argv[3]), ("b", sys.argv[4])):
    sample = [l for l in out if l.startswith("> " + prompt)]
    assert sample, "no pretrain sample for " + prompt
    want = sample[0][len("> " + prompt):]
    got = res[key]["text"]
    # the sample line ends at a newline the text may hold
    assert got.split("\n")[0] == want, (key, got, want)
    assert res[key]["finish_reason"] in ("length", "stop")
    assert len(res[key]["token_ids"]) == res[key]["usage"]["completion_tokens"]
o = res["o2"]
assert o["response"]["status_code"] == 200 and o["error"] is None
body = o["response"]["body"]
assert body["object"] == "chat.completion" and body["model"] == "tiny"
ch = body["choices"][0]
assert ch["message"]["role"] == "assistant" and isinstance(ch["message"]["content"], str)
assert len(ch["logprobs"]["content"]) == body["usage"]["completion_tokens"]
assert all(len(t["top_logprobs"]) == 2 for t in ch["logprobs"]["content"])
texts = {res[k]["text"] for k in res if k.startswith("g")}
assert len(texts) > 1, "every greedy request gave the same text"
PY
same_as_base() {
    same_results "$TMP/base.jsonl" "$1" >&2 || fail "$2: results differ from the first run"
}

run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/b1.jsonl" --infer.max_batch 1 \
    --infer.block_size 256 --infer.prefix_sharing false
expect_ok
same_as_base "$TMP/b1.jsonl" "max_batch 1, block_size 256, no prefix sharing"

run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/small.jsonl" --infer.block_size 4 \
    --infer.kv_blocks 40 --infer.max_tokens_per_step 16
expect_ok
same_as_base "$TMP/small.jsonl" "40 blocks of 4, 16 tokens a step (preemption, chunked prefill)"
expect_grep out "[1-9][0-9]* preemptions"

run_infer 2 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/dp2.jsonl"
expect_ok
same_as_base "$TMP/dp2.jsonl" "dp=2"

run_infer 2 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/tp2.jsonl" --mesh.tp 2
expect_ok
same_as_base "$TMP/tp2.jsonl" "tp=2"

# The Hugging Face export of the same checkpoint.
echo "+ colossal-ckpt export"
$MPIEXEC -n 1 "$CKPT_BIN" export --input "$TMP/run/checkpoints" --output "$TMP/hf" --tokenizer "$TMP/run/tokenizer" >"$TMP/out" 2>"$TMP/err" ||
    fail "export failed"
run_infer 1 --model.path "$TMP/hf" --infer.input "$TMP/req.jsonl" \
    --infer.output "$TMP/hf.jsonl"
expect_ok
same_as_base "$TMP/hf.jsonl" "the Hugging Face export"

# A bf16 cache: the same machinery; the lines are whole and every id answered.
run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/bf16.jsonl" --infer.kv_dtype bf16
expect_ok
[ "$(wc -l <"$TMP/bf16.jsonl")" -eq "$N" ] || fail "bf16 cache: expected $N result lines"
echo "PASS"
