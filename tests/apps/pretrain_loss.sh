#!/bin/sh
# Tiny pretraining on 1 and 2 ranks: the loss falls, validation runs, the
# progress line and metrics.jsonl carry what docs/pretrain.md promises, the
# written config.yaml reproduces the run's settings, samples are printed,
# and scripts/plot_metrics.py turns the metrics into a PNG.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

# shellcheck disable=SC2086
run_np 1 $TINY --data.corpus_vocab 320 --train.steps 40 --eval.interval 20 --eval.batches 2 --log.interval 10 \
    --generate.tokens 8 --run.dir "$TMP/r1"
expect_ok
M="$TMP/r1/metrics.jsonl"
[ -s "$M" ] || fail "no metrics.jsonl"
[ -s "$TMP/r1/config.yaml" ] || fail "no config.yaml"
[ -s "$TMP/r1/tokenizer/vocab.json" ] || fail "the trained tokenizer was not saved"
[ "$(field train loss "$M" | wc -l)" -eq 40 ] || fail "expected 40 train records"
[ "$(field eval val_loss "$M" | wc -l)" -eq 2 ] || fail "expected validation at steps 20 and 40"
expect_grep out '^step 10/40 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| grad norm [0-9.]+ \| [0-9.]+k? tok/s \| MFU [0-9.]+% \| mem [0-9]+ MiB \| ETA [0-9hms]+$' \
    "no progress line of the documented form"
expect_grep out '^eval at step 40 \| val loss [0-9.]+ \| val ppl [0-9.]+$'
expect_grep out 'tokenizer BPE trained on the corpus, vocabulary 3[0-9][0-9]'
expect_grep out '^samples \(greedy'
expect_grep out '^> Once upon a time,'
expect_grep out '^done: 40 steps'
grep -q '"kind":"end","status":"done"' "$M" || fail "no end record"
# The steady-state summary: 40 steps, 5 of them warm-up; the CPU backend
# reports no device memory (its memory is the progress line's RSS).
expect_grep out '^steady state: median step [0-9.]+ ms over 35 steps after 5 warm-up \| [0-9]+ tokens/s \| MFU [0-9.]+%$' \
    "no steady-state line of the documented form"
grep '"kind":"summary"' "$M" | grep -q '"warmup_steps":5,"steps":35,"median_step_s":[0-9.]*,"tokens_per_s":[0-9.]*,' ||
    fail "no summary record of the documented form"

# The loss falls: the mean of the last 5 steps is well below the first step,
# and so is the final validation loss.
field train loss "$M" | awk 'NR==1{first=$2} NR>35{s+=$2;n++} END{
    m=s/n; printf "first %.4f, last-5 mean %.4f\n", first, m; exit !(m < 0.85*first)}' ||
    fail "the training loss did not fall by 15%"
first=$(field train loss "$M" | awk 'NR==1{print $2}')
field eval val_loss "$M" | awk -v f="$first" 'END{printf "final val loss %.4f\n", $2; exit !($2 < 0.85*f)}' ||
    fail "the validation loss did not fall"

# 2 ranks from the effective config the first run wrote (same model, data
# and batch per rank; twice the global batch).
run_np 2 --config "$TMP/r1/config.yaml" --run.dir "$TMP/r2" --generate.tokens 0
expect_ok
expect_grep out 'tp=1 pp=1 dp=2'
expect_grep out 'batch: 8 sequences x 64 tokens = 512 tokens per step \(micro_batch 4 x grad_accum 1 x dp 2\)'
field train loss "$TMP/r2/metrics.jsonl" | awk 'NR==1{first=$2} NR>35{s+=$2;n++} END{exit !(n == 5 && s/n < 0.85*first)}' ||
    fail "the 2-rank training loss did not fall by 15%"
expect_no_grep out '^samples'

# The plotting script (matplotlib or its own PNG writer).
if command -v python3 >/dev/null 2>&1; then
    python3 "$top_srcdir/scripts/plot_metrics.py" "$M" -o "$TMP/loss.png" >"$TMP/out" 2>"$TMP/err" ||
        fail "plot_metrics.py failed"
    [ "$(head -c 8 "$TMP/loss.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "loss.png is not a PNG"
fi
echo "PASS"
