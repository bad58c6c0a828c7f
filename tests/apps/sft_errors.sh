#!/bin/sh
# colossal-sft refuses bad input with exit 2 and a message naming the file,
# line and field: a malformed JSONL line, a conversation with no assistant
# turn, a model path that is not there, a template that does not exist or
# needs tokens the vocabulary lacks, and what is not built (packing over
# several microbatches, ZeRO stages >= 1); an offload run (stage 0) trains.
. "$top_srcdir/tests/apps/sft_lib.sh"
sft_setup
ok='{"messages":[{"role":"user","content":"What is 1 + 1?"},{"role":"assistant","content":"The answer is 2."}]}'
printf '%s\n{"messages": [oops\n' "$ok" >"$TMP/bad.jsonl"
printf '%s\n{"messages":[{"role":"user","content":"hi"}]}\n' "$ok" >"$TMP/noasst.jsonl"
BASE="--model.path $TMP/pt/checkpoints --train.steps 2 $SFT_TINY"

# refused NAME PATTERN ARGS...: exit 2 on 2 ranks, stderr matching PATTERN.
refused() {
    what=$1
    pattern=$2
    shift 2
    # shellcheck disable=SC2086
    run_sft 2 $BASE --run.dir "$TMP/r" "$@"
    expect_rc 2
    expect_grep err "$pattern" "$what: stderr lacks /$pattern/"
}
refused "malformed line" "bad.jsonl:2: not valid JSON" --data.train "$TMP/bad.jsonl"
refused "no assistant turn" "noasst.jsonl:2: field 'messages': no assistant turn" --data.train "$TMP/noasst.jsonl"
refused "missing model" "model.path=$TMP/nothere: no such file or directory" --data.train "$TMP/ex/train.jsonl" \
    --model.path "$TMP/nothere"
refused "unknown template" 'chat template "nosuch": not one of' --data.train "$TMP/ex/train.jsonl" \
    --data.chat_template nosuch
refused "template tokens missing" "data.chat_template=chatml needs special tokens .* lacks \(first: <\|im_start\|>\)" \
    --data.train "$TMP/ex/train.jsonl" --data.chat_template chatml
refused "missing data" "data.train=$TMP/none.jsonl: cannot read it" --data.train "$TMP/none.jsonl"
refused "packing with grad_accum" "data.packing=true with train.grad_accum=2: .* set train.grad_accum=1" \
    --data.train "$TMP/ex/train.jsonl" --data.packing true --train.grad_accum 2
refused "zero stage 2" "zero.stage=2: colossal-sft loads the model's weights before" --data.train "$TMP/ex/train.jsonl" \
    --zero.stage 2

# stage 0 with the optimizer on the host trains
# shellcheck disable=SC2086
run_sft 2 $BASE --run.dir "$TMP/off" --data.train "$TMP/ex/train.jsonl" --zero.offload true
expect_ok
expect_grep out "^zero: stage 0 \+ CPU offload over dp 2"
echo "PASS"
