# Shared helpers for the colossal-sft end-to-end tests (sourced, not run):
# pretrain_lib.sh's (TMP, fail, expect_*, field, same_losses) plus a tiny
# pretrained model and the embedded instruction set.
. "$top_srcdir/tests/apps/pretrain_lib.sh"
SFT_BIN="$top_builddir/apps/colossal-sft"
DATA_BIN="$top_builddir/apps/colossal-data"

# run_sft N ARGS...: colossal-sft on N ranks; stdout in $TMP/out, stderr in
# $TMP/err, exit status in $RC.
run_sft() {
    n=$1
    shift
    cai_launch "$n" "$SFT_BIN" "$@"
}

# sft_setup: $TMP/pt (a 2-layer GPT-2, BPE of 320 tokens, 60 steps, its
# checkpoint and tokenizer) and $TMP/ex/{train,held_out}.jsonl.
# SFT_PT_STEPS (default 60) shortens the pretraining for a script that needs
# only a checkpoint of the right shape, not a trained one.
sft_setup() {
    pt_steps=${SFT_PT_STEPS:-60}
    # shellcheck disable=SC2086
    run_np 1 $TINY --data.corpus_vocab 320 --train.steps $pt_steps --eval.interval 0 --checkpoint.every $pt_steps \
        --run.dir "$TMP/pt"
    expect_ok
    "$DATA_BIN" sft-example --out "$TMP/ex" --docs 300 --seed 7 --held-out 10 >"$TMP/out" 2>"$TMP/err" ||
        fail "sft-example failed"
}

SFT_TINY="--train.seq_len 64 --train.micro_batch 4 --optim.lr 1e-3 --optim.warmup_steps 2 --log.timestamps false
  --run.peak_tflops 1"

# close_losses REF GOT WHAT: the train and validation losses of two
# metrics.jsonl files agree within 1e-5 relative (layouts that sum in
# another order).
close_losses() {
    for kind in "train loss" "eval val_loss"; do
        # shellcheck disable=SC2086
        field $kind "$1" >"$TMP/a"
        # shellcheck disable=SC2086
        field $kind "$2" >"$TMP/b"
        paste "$TMP/a" "$TMP/b" | awk -v k="$kind" -v w="$3" '{d=$2-$4; if (d<0) d=-d; r=d/($2>0?$2:1); if (r>m) m=r; n++}
            END{printf "%s: %d records, max relative difference %s %.2e\n", k, n, w, m; exit !(n>0 && m<=1e-5)}' ||
            fail "$kind differs ($3) by more than 1e-5"
    done
}
