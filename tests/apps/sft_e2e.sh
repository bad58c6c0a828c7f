#!/bin/sh
# colossal-sft end to end on CPU with nothing downloaded: a tiny pretrained
# checkpoint (and its Hugging Face export: the same run) fine-tuned on the
# embedded instruction set on 1 and 2 ranks
# (data parallel: the same losses within 1e-5), the masked loss falls and is
# evaluated on the held-out file, a stopped run resumes bit-exactly, a
# preprocessed prefix trains as the JSONL does, packed rows give the
# unpacked masked loss, and the Hugging Face export
# answers held-out questions through colossal-infer as the checkpoint does
# (the accuracy before and after is examples/sft-tiny.sh's).
. "$top_srcdir/tests/apps/sft_lib.sh"
sft_setup
SFT="--model.path $TMP/pt/checkpoints --data.train $TMP/ex/train.jsonl --data.valid $TMP/ex/held_out.jsonl
  --train.steps 24 --eval.interval 12 --checkpoint.every 12 $SFT_TINY --train.micro_batch 2 --train.grad_accum 2"

# shellcheck disable=SC2086
run_sft 1 $SFT --run.dir "$TMP/s1"
expect_ok
expect_grep out '^data: .*train.jsonl: [0-9]+ conversations \(of [0-9]+ read: [0-9]+ truncated, [0-9]+ dropped at tokenizing.*\) in [0-9]+ rows .* tokens trained .*template plain'
expect_grep out '^eval at step 24 \| val loss [0-9.]+'
M1="$TMP/s1/metrics.jsonl"
[ "$(field train loss "$M1" | wc -l)" -eq 24 ] || fail "expected 24 train records"
field train loss "$M1" | awk 'NR==1{f=$2} NR>19{s+=$2;n++} END{printf "first %.4f, last-5 mean %.4f\n", f, s/n;
    exit !(s/n < 0.8*f)}' || fail "the masked loss did not fall by 20%"
[ -s "$TMP/s1/tokenizer/vocab.json" ] || fail "no tokenizer beside the checkpoints"

# From the Hugging Face export of the same pretrained checkpoint: the same
# weights and tokens, the same run.
$MPIEXEC -n 1 "$top_builddir/apps/colossal-ckpt" export --input "$TMP/pt/checkpoints" --output "$TMP/pt-hf" \
    --tokenizer "$TMP/pt/tokenizer" >"$TMP/out" 2>"$TMP/err" || fail "export of the pretrained checkpoint failed"
# shellcheck disable=SC2086
run_sft 1 $SFT --model.path "$TMP/pt-hf" --run.dir "$TMP/s5"
expect_ok
expect_grep out "^model: gpt2 from .*pt-hf \\(Hugging Face"
same_losses "$M1" "$TMP/s5/metrics.jsonl" "starting from the Hugging Face export"

# Two data-parallel ranks: the same global batches in the same microbatches
# (a step's loss is the mean of its microbatches' masked means, each over
# that microbatch's trained tokens), the same losses.
# shellcheck disable=SC2086
run_sft 2 $SFT --train.grad_accum 1 --run.dir "$TMP/s2"
expect_ok
close_losses "$M1" "$TMP/s2/metrics.jsonl" "1 vs 2 ranks"

# Stopped after step 12 (checkpoint, exit 3), resumed: bitwise the
# uninterrupted run.
# shellcheck disable=SC2086
run_sft 1 $SFT --train.stop_at 12 --run.dir "$TMP/s3"
expect_rc 3
# shellcheck disable=SC2086
run_sft 1 $SFT --resume latest --run.dir "$TMP/s3"
expect_ok
same_losses "$M1" "$TMP/s3/metrics.jsonl" "resumed at step 12"

# The sft-preprocess output trains exactly as the JSONL it came from.
"$DATA_BIN" sft-preprocess --input "$TMP/ex/train.jsonl" --output-prefix "$TMP/pre" --tokenizer "$TMP/pt/tokenizer" \
    --chat-template plain --seq-len 64 >"$TMP/out" 2>"$TMP/err" || fail "sft-preprocess failed"
# shellcheck disable=SC2086
run_sft 1 $SFT --data.train "$TMP/pre" --run.dir "$TMP/s4"
expect_ok
same_losses "$M1" "$TMP/s4/metrics.jsonl" "training from the preprocessed prefix"

# Packed rows (several conversations per row, positions restarting,
# attention kept within each): at the same weights (lr 0) the masked
# held-out loss equals the unpacked one over the same tokens in fewer rows.
# A 128-token model, so that rows have room for more than one conversation.
# shellcheck disable=SC2086
run_np 1 $TINY --data.corpus_vocab 320 --train.seq_len 128 --train.steps 30 --eval.interval 0 --checkpoint.every 30 \
    --run.dir "$TMP/pt128"
expect_ok
for pk in true false; do
    # shellcheck disable=SC2086
    run_sft 1 $SFT --model.path "$TMP/pt128/checkpoints" --train.seq_len 128 --train.grad_accum 1 --train.steps 1 \
        --optim.lr 0 --optim.min_lr 0 --optim.warmup_steps 0 --checkpoint.every 0 --data.packing $pk \
        --run.dir "$TMP/pack-$pk"
    expect_ok
    sed -n 's/^eval: masked loss over \([0-9]*\) held-out rows.*/\1/p' "$TMP/out" >"$TMP/rows-$pk"
done
[ "$(cat "$TMP/rows-true")" -lt "$(cat "$TMP/rows-false")" ] || fail "packing put no two held-out conversations in a row"
field eval val_loss "$TMP/pack-true/metrics.jsonl" >"$TMP/a"
field eval val_loss "$TMP/pack-false/metrics.jsonl" >"$TMP/b"
paste "$TMP/a" "$TMP/b" | awk -v r1="$(cat "$TMP/rows-true")" -v r2="$(cat "$TMP/rows-false")" '{d=$2-$4; if (d<0) d=-d;
    printf "held-out loss packed (%d rows) %s, unpacked (%d rows) %s\n", r1, $2, r2, $4; exit !(NR==1 && d/$4<=1e-5)}' ||
    fail "the packed held-out loss differs from the unpacked one by more than 1e-5"

# Export, then greedy answers to held-out arithmetic questions.
echo "+ colossal-ckpt export"
$MPIEXEC -n 1 "$top_builddir/apps/colossal-ckpt" export --input "$TMP/s1/checkpoints" --output "$TMP/hf" \
    --tokenizer "$TMP/s1/tokenizer" >"$TMP/out" 2>"$TMP/err" || fail "export failed"
grep '"content":"The answer is [-0-9]*\."}\]}$' "$TMP/ex/held_out.jsonl" | head -n 8 | awk '{
    i = index($0, ",{\"role\":\"assistant\"")
    printf "{\"id\":\"q%d\",\"messages\":%s],\"max_tokens\":12,\"stop\":[\"\\n\"]}\n", NR, substr($0, 13, i - 13)
}' >"$TMP/q.jsonl"
[ -s "$TMP/q.jsonl" ] || fail "no held-out arithmetic question"
# the export answers as the fine-tuned checkpoint does (greedy: the same tokens)
for m in hf s1/checkpoints; do
    $MPIEXEC -n 1 "$top_builddir/apps/colossal-infer" --model.path "$TMP/$m" --infer.input "$TMP/q.jsonl" \
        --infer.output "$TMP/a-${m%%/*}.jsonl" --infer.chat_template plain --run.dir "$TMP/inf-${m%%/*}" \
        >"$TMP/out" 2>"$TMP/err" || fail "colossal-infer on $m failed"
    [ "$(wc -l <"$TMP/a-${m%%/*}.jsonl")" -eq "$(wc -l <"$TMP/q.jsonl")" ] || fail "$m: not every question answered"
    sed 's/"usage".*//' "$TMP/a-${m%%/*}.jsonl" | sort >"$TMP/a-${m%%/*}.sorted"
done
cmp -s "$TMP/a-hf.sorted" "$TMP/a-s1.sorted" || fail "the export answers otherwise than the checkpoint"
echo "PASS"
