#!/bin/sh
# Tensor parallelism through colossal-pretrain (GPT-2, tied embeddings, the
# same global batch of 8 sequences everywhere):
# - tp=2 (dp=1) and tp=2 x dp=2 reproduce the 1-rank run: every step's train
#   loss and both validation losses within 1e-5 relative, and tp=2 prints
#   the same greedy samples (the argmax over vocabulary shards);
# - the step-6 checkpoint of a tp=2 x dp=2 run resumes bitwise on the same
#   layout and continues within 1e-5 on tp=1 x dp=4 and tp=4 x dp=1; a
#   tp=2 x dp=2 ZeRO-3 checkpoint continues within 1e-5 at tp=1 under ZeRO-1;
# - its Hugging Face export is byte-identical to the export of the same
#   weights saved again by a tp=1 run;
# - Llama with grouped-query attention (4 query, 2 key/value heads) at tp=2
#   reproduces its 1-rank run;
# - split-gather sequence parallelism (GPT-2 tp=2 x dp=2 under ZeRO-2, Llama
#   tp=2) reproduces the 1-rank runs, and its checkpoint resumes without it;
# - a tp that does not split the heads, and sequence parallelism without
#   tp, are refused before any work.
. "$top_srcdir/tests/apps/pretrain_lib.sh"
CKPT_BIN="$top_builddir/apps/colossal-ckpt"

CFG="$TINY --train.steps 12 --eval.interval 6 --eval.batches 2 --log.interval 100"

# shellcheck disable=SC2086
run_np 1 $CFG --train.grad_accum 2 --run.dir "$TMP/a" --generate.tokens 8
expect_ok
grep '^> ' "$TMP/out" >"$TMP/samples-a"
# shellcheck disable=SC2086
run_np 2 $CFG --mesh.tp 2 --train.grad_accum 2 --run.dir "$TMP/tp2" --generate.tokens 8
expect_ok
expect_grep out 'tp=2 pp=1 dp=1'
grep '^> ' "$TMP/out" >"$TMP/samples-tp2"
[ -s "$TMP/samples-a" ] && cmp -s "$TMP/samples-a" "$TMP/samples-tp2" ||
    fail "greedy samples at tp=2 differ from the 1-rank run's: $(cat "$TMP/samples-tp2")"
# shellcheck disable=SC2086
run_np 4 $CFG --mesh.tp 2 --run.dir "$TMP/tp2dp2" --checkpoint.every 100
expect_ok
expect_grep out 'tp=2 pp=1 dp=2'
for run in tp2 tp2dp2; do
    compare train loss $run 12
    compare eval val_loss $run 2
done
field train loss "$TMP/a/metrics.jsonl" | awk 'NR==1{f=$2} END{exit !($2 < 0.9*f)}' || fail "the loss did not fall"

# Checkpoint at tp=2 x dp=2, resume on the same and on other layouts.
# shellcheck disable=SC2086
run_np 4 $CFG --mesh.tp 2 --run.dir "$TMP/b" --checkpoint.every 100 --train.stop_at 6
expect_rc 3
cp "$TMP/b/checkpoints/step-00000006.h5" "$TMP/step6.h5"
# shellcheck disable=SC2086
run_np 4 $CFG --mesh.tp 2 --run.dir "$TMP/b" --checkpoint.every 100 --resume latest
expect_ok
same_losses "$TMP/tp2dp2/metrics.jsonl" "$TMP/b/metrics.jsonl" "the tp=2 x dp=2 resume"
echo "resume on tp=2 x dp=2: train and validation losses bitwise equal"
# shellcheck disable=SC2086
run_np 4 $CFG --run.dir "$TMP/dp4" --train.micro_batch 2 --resume "$TMP/step6.h5"
expect_ok
expect_grep err 'saved on 4 ranks \(tp=2 pp=1 dp=2\)'
close_losses "$TMP/a/metrics.jsonl" "$TMP/dp4/metrics.jsonl" 6 1e-5 "tp=1 x dp=4 from the tp=2 checkpoint"
# shellcheck disable=SC2086
run_np 4 $CFG --mesh.tp 4 --train.grad_accum 2 --run.dir "$TMP/tp4" --resume "$TMP/step6.h5"
expect_ok
close_losses "$TMP/a/metrics.jsonl" "$TMP/tp4/metrics.jsonl" 6 1e-5 "tp=4 x dp=1 from the tp=2 checkpoint"

# ZeRO-3 shards of tp shards: saved at tp=2 x dp=2, resumed at tp=1 under ZeRO-1.
# shellcheck disable=SC2086
run_np 4 $CFG --mesh.tp 2 --zero.stage 3 --run.dir "$TMP/z3" --checkpoint.every 100 --train.stop_at 6
expect_rc 3
# shellcheck disable=SC2086
run_np 2 $CFG --zero.stage 1 --run.dir "$TMP/z1" --resume "$TMP/z3/checkpoints"
expect_ok
close_losses "$TMP/a/metrics.jsonl" "$TMP/z1/metrics.jsonl" 6 1e-5 "tp=1 ZeRO-1 from a tp=2 ZeRO-3 checkpoint"

# The same weights through a tp=1 save: resumed on one rank into another
# run directory with nothing left to train, the run saves them there.
# shellcheck disable=SC2086
run_np 1 $CFG --train.steps 6 --train.grad_accum 2 --run.dir "$TMP/re" --checkpoint.every 100 --resume "$TMP/step6.h5"
expect_ok
[ -f "$TMP/re/checkpoints/step-00000006.h5" ] || fail "the tp=1 run wrote no step-6 checkpoint"
for c in step6 re; do
    src="$TMP/step6.h5"
    [ $c = re ] && src="$TMP/re/checkpoints/step-00000006.h5"
    echo "+ colossal-ckpt export --input $src"
    $MPIEXEC -n 1 --oversubscribe "$CKPT_BIN" export --input "$src" --output "$TMP/hf-$c" >"$TMP/out" 2>"$TMP/err" ||
        fail "export of $c: $(cat "$TMP/err")"
done
cmp "$TMP/hf-step6/model.safetensors" "$TMP/hf-re/model.safetensors" ||
    fail "the export of the tp=2 checkpoint differs from the tp=1 save of the same weights"
echo "HF export of the tp=2 checkpoint: byte-identical to the tp=1 save's"

# Llama, grouped-query attention.
LLAMA="$CFG --model.family llama --model.n_kv_heads 2 --train.steps 6 --eval.interval 0"
# shellcheck disable=SC2086
run_np 1 $LLAMA --train.grad_accum 2 --run.dir "$TMP/la"
expect_ok
# shellcheck disable=SC2086
run_np 2 $LLAMA --mesh.tp 2 --train.grad_accum 2 --run.dir "$TMP/lb"
expect_ok
close_losses "$TMP/la/metrics.jsonl" "$TMP/lb/metrics.jsonl" 0 1e-5 "llama tp=2"

# Split-gather sequence parallelism.
# shellcheck disable=SC2086
run_np 4 $CFG --mesh.tp 2 --mesh.sp_mode split_gather --zero.stage 2 --run.dir "$TMP/sp" --checkpoint.every 6 \
    --generate.tokens 8
expect_ok
grep '^> ' "$TMP/out" >"$TMP/samples-sp"
cmp -s "$TMP/samples-a" "$TMP/samples-sp" || fail "greedy samples with sp_mode=split_gather differ: $(cat "$TMP/samples-sp")"
compare train loss sp 12
compare eval val_loss sp 2
# shellcheck disable=SC2086
run_np 2 $CFG --mesh.tp 2 --train.grad_accum 2 --run.dir "$TMP/sp-off" --resume "$TMP/sp/checkpoints/step-00000006.h5"
expect_ok
close_losses "$TMP/a/metrics.jsonl" "$TMP/sp-off/metrics.jsonl" 6 1e-5 "tp=2 without sp from an sp checkpoint"
# shellcheck disable=SC2086
run_np 2 $LLAMA --mesh.tp 2 --mesh.sp_mode split_gather --train.grad_accum 2 --run.dir "$TMP/lsp"
expect_ok
close_losses "$TMP/la/metrics.jsonl" "$TMP/lsp/metrics.jsonl" 0 1e-5 "llama tp=2 sp_mode=split_gather"
# shellcheck disable=SC2086
run_np 2 $CFG --mesh.sp_mode split_gather --run.dir "$TMP/bad-sp"
expect_rc 2
expect_grep err 'mesh.sp_mode=split_gather.*mesh.tp=1'

# shellcheck disable=SC2086
run_np 4 $LLAMA --mesh.tp 4 --run.dir "$TMP/bad"
expect_rc 2
expect_grep err 'n_kv_heads|kv.heads'
[ ! -d "$TMP/bad/checkpoints" ] || fail "the refused run started work"
echo "PASS"
