#!/bin/sh
# colossal-sft refuses bad input with exit 2 and a message naming the file,
# line and field: a malformed JSONL line, a conversation with no assistant
# turn, a model path that is not there, a template that does not exist or
# needs tokens a LoRA run cannot add, layouts the model or the pipeline
# does not fit, and what is not built (packing over several microbatches,
# ZeRO stages 2/3 or offload with a pipeline, LoRA with tensor or pipeline
# parallelism); an offload run (stage 0) trains.
. "$top_srcdir/tests/apps/sft_lib.sh"
# Under the sanitizers (make check-sanitize: CAI_SANITIZE=1) the source model
# pretrains 2 steps: the refusals need its shape only; the plain suite trains it 60.
[ "${CAI_SANITIZE:-0}" != 1 ] || SFT_PT_STEPS=2
sft_setup
ok='{"messages":[{"role":"user","content":"What is 1 + 1?"},{"role":"assistant","content":"The answer is 2."}]}'
printf '%s\n{"messages": [oops\n' "$ok" >"$TMP/bad.jsonl"
printf '%s\n{"messages":[{"role":"user","content":"hi"}]}\n' "$ok" >"$TMP/noasst.jsonl"
BASE="--model.path $TMP/pt/checkpoints --train.steps 2 $SFT_TINY"

# refused NAME PATTERN ARGS...: exit 2 on $NP ranks, stderr matching PATTERN.
# Under the sanitizers the refusals that do not depend on the rank count run
# on 1 rank (a 2-rank ASan launch costs half again as much, and mpiexec waits
# 2 s after it: Makefile.am, odls_base_sigkill_timeout); the plain suite runs
# them on 2 ranks, and the layout refusals from "zero stage 2 with a pipeline"
# on, which need 2 ranks, keep a 2-rank refusal under the sanitizers.
NP=2
[ "${CAI_SANITIZE:-0}" != 1 ] || NP=1
refused() {
    what=$1
    pattern=$2
    shift 2
    # shellcheck disable=SC2086
    run_sft $NP $BASE --run.dir "$TMP/r" "$@"
    expect_rc 2
    expect_grep err "$pattern" "$what: stderr lacks /$pattern/"
}
refused "malformed line" "bad.jsonl:2: not valid JSON" --data.train "$TMP/bad.jsonl"
refused "no assistant turn" "noasst.jsonl:2: field 'messages': no assistant turn" --data.train "$TMP/noasst.jsonl"
refused "missing model" "model.path=$TMP/nothere: no such file or directory" --data.train "$TMP/ex/train.jsonl" \
    --model.path "$TMP/nothere"
refused "unknown template" 'chat template "nosuch": not one of' --data.train "$TMP/ex/train.jsonl" \
    --data.chat_template nosuch
refused "template tokens with LoRA" "data.chat_template=chatml needs special tokens .* lacks \(first: <\|im_start\|>\); a LoRA run keeps the embedding frozen" \
    --data.train "$TMP/ex/train.jsonl" --data.chat_template chatml --lora.rank 4
refused "missing data" "data.train=$TMP/none.jsonl: cannot read it" --data.train "$TMP/none.jsonl"
refused "packing with grad_accum" "data.packing=true with train.grad_accum=2: .* set train.grad_accum=1" \
    --data.train "$TMP/ex/train.jsonl" --data.packing true --train.grad_accum 2
NP=2
refused "zero stage 2 with a pipeline" "mesh.pp=2 composes with dp and tp at ZeRO stage 0 or 1 without offload: zero.stage=2" \
    --data.train "$TMP/ex/train.jsonl" --zero.stage 2 --mesh.pp 2 --train.grad_accum 2
refused "LoRA with tp" "lora.rank=4 with mesh.tp=2 mesh.pp=1: LoRA runs data parallel only" \
    --data.train "$TMP/ex/train.jsonl" --lora.rank 4 --mesh.tp 2
refused "pp.layers that do not sum to the layers" 'pp.layers="2,1" gives 2 virtual stages of 3 layers in all' \
    --data.train "$TMP/ex/train.jsonl" --mesh.pp 2 --train.grad_accum 2 --pp.layers 2,1
refused "pipeline too long for the layers" "model.n_layers=2 does not divide over mesh.pp=2 x pp.virtual=2" \
    --data.train "$TMP/ex/train.jsonl" --mesh.pp 2 --pp.schedule interleaved --train.grad_accum 2

# stage 0 with the optimizer on the host trains
# shellcheck disable=SC2086
run_sft 2 $BASE --run.dir "$TMP/off" --data.train "$TMP/ex/train.jsonl" --zero.offload true
expect_ok
expect_grep out "^zero: stage 0 \+ CPU offload over dp 2"
echo "PASS"
