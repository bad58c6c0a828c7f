#!/bin/sh
# colossal-moe end to end: a Mixtral-style model trains on the embedded
# corpus with its experts over ep = 2 (the loss falls, a "moe" record per
# step with the router statistics, no drops when dropless, drops under a
# small capacity), and bad input is refused before anything is allocated,
# naming the key and what would fit.
. "$top_srcdir/tests/apps/pretrain_lib.sh"
PRETRAIN_BIN="$top_builddir/apps/colossal-moe"
MOE="--model.n_layers 2 --model.d_model 64 --model.n_heads 4 --model.n_kv_heads 2 --moe.experts 4 --moe.ffn 64
  --train.seq_len 32 --train.micro_batch 4 --optim.lr 3e-3 --optim.warmup_steps 2 --data.corpus_docs 1500
  --data.corpus_vocab 0 --eval.interval 0 --run.peak_tflops 1 --log.timestamps false"

# shellcheck disable=SC2086
run_np 2 $MOE --mesh.ep 2 --train.steps 30 --run.dir "$TMP/ep2"
expect_ok
M="$TMP/ep2/metrics.jsonl"
[ "$(grep -c '"kind":"moe"' "$M")" -eq 30 ] || fail "expected 30 moe records in $M"
field train loss "$M" >"$TMP/loss"
first=$(head -n 1 "$TMP/loss" | cut -d' ' -f2)
last=$(tail -n 1 "$TMP/loss" | cut -d' ' -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || fail "loss did not fall: $first -> $last"
field moe dropped_fraction "$M" | awk '$2 != 0 { bad = 1 } END { exit bad }' || fail "dropless routing dropped"
field moe tokens_per_expert_mean "$M" | awk '$2 != 128.0 { bad = 1 } END { exit bad }' ||
    fail "tokens per expert: 2 ranks x 128 tokens x top-2 / 4 experts is 128 on average"
expect_grep out 'expert parallel driver'

# shellcheck disable=SC2086
run_np 2 $MOE --moe.routing capacity --moe.capacity_factor 0.5 --train.steps 3 --run.dir "$TMP/cap"
expect_ok
field moe dropped_fraction "$TMP/cap/metrics.jsonl" | awk '$2 < 0.3 { bad = 1 } END { exit bad }' ||
    fail "capacity 0.5 keeps at most half of the assignments"

# shellcheck disable=SC2086
run_np 2 $MOE --moe.experts 3 --mesh.ep 2 --run.dir "$TMP/x"
expect_rc 2
expect_grep err 'experts|ep=2'
expect_no_grep out '^step'

# shellcheck disable=SC2086
run_np 1 $MOE --moe.top_k 5 --run.dir "$TMP/x"
expect_rc 2
expect_grep err 'moe\.top_k=5 must be between 1 and moe\.n_experts=4'

# shellcheck disable=SC2086
run_np 1 $MOE --moe.routing capacity --moe.capacity_factor 0 --run.dir "$TMP/x"
expect_rc 2
expect_grep err 'moe\.capacity_factor=0 must be > 0'

# shellcheck disable=SC2086
run_np 2 $MOE --mesh.ep 2 --zero.stage 1 --run.dir "$TMP/x"
expect_rc 2
expect_grep err 'mesh\.ep=2 runs at zero\.stage=0'
echo PASS
