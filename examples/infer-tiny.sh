#!/bin/sh
# colossal-infer on the model examples/pretrain-tiny.yaml trains (nothing is
# downloaded). First train it (about a minute on 2 CPU cores):
#
#   mpirun -np 2 colossal-pretrain --config examples/pretrain-tiny.yaml
#   sh examples/infer-tiny.sh [RUN_DIR] [RANKS]
#
# RUN_DIR (default runs/pretrain-tiny) holds checkpoints/ and tokenizer/.
# The script writes into RUN_DIR/infer:
#   requests.jsonl  a few prompts (native lines) and a chat in the OpenAI
#                   Batch format -> answers.jsonl (greedy and sampled)
#   arithmetic.jsonl  held-out multiple choice from the corpus' arithmetic
#                   drills ("Q: What is 6 times 7? A:" with the right answer
#                   and three near misses) -> the model's accuracy
#   heldout.txt     corpus documents under a seed the model never saw ->
#                   its perplexity
# Programs come from COLOSSAL_BIN (default: the PATH); RANKS ranks each
# (default 2: two data-parallel replicas).
set -e
run=${1:-runs/pretrain-tiny}
np=${2:-2}
bin=${COLOSSAL_BIN:+$COLOSSAL_BIN/}
launch=${MPIEXEC:-mpirun}
out=$run/infer
[ -d "$run/checkpoints" ] || {
    echo "no checkpoints in $run: train first (mpirun -np 2 colossal-pretrain --config examples/pretrain-tiny.yaml)" >&2
    exit 2
}
mkdir -p "$out"
infer() { $launch -n "$np" "${bin}colossal-infer" --model.path "$run/checkpoints" --run.dir "$out/run" "$@"; }

cat >"$out/requests.jsonl" <<'JSONL'
{"id": "story", "prompt": "Once upon a time,", "max_tokens": 48}
{"id": "sum", "prompt": "Q: What is 7 + 5? A:", "max_tokens": 4}
{"id": "sampled", "prompt": "One sunny morning,", "max_tokens": 48, "temperature": 0.8, "top_p": 0.95, "seed": 7}
{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about Mia."}], "max_tokens": 32}}
JSONL
rm -f "$out/answers.jsonl"
infer --infer.input "$out/requests.jsonl" --infer.output "$out/answers.jsonl" --infer.chat_template plain
echo "answers: $out/answers.jsonl"

# a x b for a, b in 2..9 (the drills' range), choices: the product and three
# near misses, the right one at a rotating place.
awk 'BEGIN {
    n = 0
    for (a = 2; a <= 9; a++) for (b = 2; b <= 9; b++) {
        p = a * b; c[0] = p; c[1] = p + 1; c[2] = p - 1; c[3] = p + a
        r = n % 4; line = sprintf("{\"id\": \"mul-%d-%d\", \"context\": \"Q: What is %d times %d? A:\", \"choices\": [", a, b, a, b)
        for (i = 0; i < 4; i++) line = line sprintf("%s\" %d\"", i ? ", " : "", c[(i - r + 4) % 4])
        print line sprintf("], \"answer\": %d}", r); n++
    }
}' >"$out/arithmetic.jsonl"
rm -f "$out/arithmetic-scores.jsonl"
infer --infer.score choice --infer.input "$out/arithmetic.jsonl" --infer.output "$out/arithmetic-scores.jsonl"

"${bin}colossal-data" corpus --out "$out/heldout.corpus" --docs 200 --seed 4321 --format text >/dev/null
awk 'BEGIN { RS = ""; ORS = "\n" } { gsub(/\n/, " "); print }' "$out/heldout.corpus" >"$out/heldout.txt"
rm -f "$out/heldout-scores.jsonl"
infer --infer.score perplexity --infer.input "$out/heldout.txt" --infer.output "$out/heldout-scores.jsonl"
