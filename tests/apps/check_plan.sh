#!/bin/sh
# colossal-check --plan on one process with a small GPT-2 for 8 ranks (link
# costs given, so nothing depends on other ranks; no assertion reads a time):
# every listed layout multiplies to 8 ranks and divides the model and the
# batch, the winner fits the memory limit and every row's verdict agrees
# with its bytes, a lower limit changes the winner, a limit nothing fits is
# refused naming the smallest layout's bytes, the pipelines the trainer does
# not run are marked and never win, FP8 linears add their bytes to every
# layout, and bad input fails with a message.
. "$top_srcdir/tests/apps/check_lib.sh"

MODEL="--model.n_layers 4 --model.d_model 64 --model.n_heads 4 --model.vocab_size 256 --plan.seq_len 32
  --plan.global_batch 8 --plan.bandwidth 10 --plan.latency 20 --plan.cores 2"

# rows: "MiB verdict dp tp pp v mb_count mb_size sched zero" of every numbered row.
rows() {
    awk '$1 ~ /^[0-9]+$/ {
        split($8, mb, /[=x]/)
        printf "%s %s %s %s %s %s %s %s %s %s\n", $10, $17, substr($2, 4), substr($3, 4), substr($4, 4),
            substr($6, 3), mb[2], mb[3], substr($5, 7), substr($7, 6)
    }' "$TMP/out"
}

# check_rows LIMIT_MIB: the layouts divide and the verdicts agree with the limit.
check_rows() {
    rows >"$TMP/rows"
    [ -s "$TMP/rows" ] || fail "no layout rows"
    awk -v lim="$1" '{
        mib = $1; v = $2; dp = $3; tp = $4; pp = $5; virt = $6; m = $7; b = $8
        if (dp * tp * pp != 8) { print "ranks: " $0; bad = 1 }
        if (4 % tp || 4 % (pp * virt)) { print "model does not divide: " $0; bad = 1 }
        if (dp * m * b != 8) { print "batch does not divide: " $0; bad = 1 }
        if (lim > 0 && (v == "fits" || v == "not-run") && mib > lim) { print "over the limit but " v ": " $0; bad = 1 }
        if (v == "over-memory" && !(lim > 0 && mib > lim - 0.05)) { print "within the limit but refused: " $0; bad = 1 }
        if (v == "not-run" && !($9 == "interleaved" || $9 == "zb-h1" || $9 == "zb-v" || $10 > 0)) {
            print "runnable but not-run: " $0; bad = 1
        }
    } END { exit bad }' "$TMP/rows" >"$TMP/bad" || fail "bad rows: $(cat "$TMP/bad")"
}

winner_mib() { sed -n 's/^winner: .*: \([0-9.]*\) MiB per rank.*/\1/p' "$TMP/out"; }

# shellcheck disable=SC2086
run_np 1 --plan --np 8 $MODEL --plan.pp_schedules gpipe,1f1b --plan.pp_zero 0
expect_ok
expect_grep out '^layout plan: gpt2, 4 layers, d_model 64, 4 heads \(4 kv\), vocab 256; 8 ranks, global batch 8 x 32'
expect_grep out '^costs: block forward [0-9.]+ s, backward [0-9.]+ s \(split: weight pass [0-9.]+ s\)'
expect_grep out '^ +1 dp=.* fits +wins: '
expect_grep out '^winner: mesh.dp=[0-9]+ mesh.tp=[0-9]+ mesh.pp=[0-9]+'
expect_grep out ' indivisible +model.n_layers=4 is not divisible by pp=8'
expect_grep out ' indivisible +model.n_heads=4 is not divisible by tp=8'
expect_grep out 'not-run +fits, but colossal-pretrain does not run the interleaved schedule yet'
expect_grep out 'not-run +fits, but colossal-pretrain does not run ZeRO stage 2 with pipelines yet'
expect_no_grep out 'versions and capabilities' "--plan also ran --info"
check_rows 0
free=$(winner_mib)
n_free=$(rows | grep -c ' fits ')
echo "  no limit: winner $free MiB, $n_free layouts fit and run"

# FP8 linears (blocks 1-2 of 4): every layout holds their casts and weight
# codes besides, so the same rows sum to more bytes
sum_mib() { rows | awk '{ s += $1 } END { printf "%.4f", s }'; }
plain=$(sum_mib)
# shellcheck disable=SC2086
run_np 1 --plan --np 8 $MODEL --plan.pp_schedules gpipe,1f1b --plan.pp_zero 0 --plan.fp8 true
expect_ok
expect_grep out "^layout plan: gpt2, .*; FP8 linears in blocks 'auto'"
check_rows 0
with=$(sum_mib)
awk -v a="$plain" -v b="$with" 'BEGIN { exit !(b > a) }' || fail "FP8 linears added no bytes ($with MiB against $plain)"
echo "  FP8 linears: the rows sum to $with MiB against $plain"

# A limit just under that winner's bytes: it is refused, another wins.
limit=$(awk -v w="$free" 'BEGIN { printf "%.0f", w * 1048576 - 65536 }')
# shellcheck disable=SC2086
run_np 1 --plan --np 8 $MODEL --plan.pp_schedules gpipe,1f1b --plan.pp_zero 0 --plan.memory "$limit"
expect_ok
lim_mib=$(awk -v l="$limit" 'BEGIN { printf "%.4f", l / 1048576 }')
check_rows "$lim_mib"
got=$(winner_mib)
awk -v g="$got" -v l="$lim_mib" 'BEGIN { exit !(g <= l) }' || fail "the winner ($got MiB) is over the limit ($lim_mib MiB)"
n_lim=$(rows | grep -c ' fits ')
[ "$n_lim" -lt "$n_free" ] || fail "the limit did not remove any layout ($n_lim of $n_free still fit)"
expect_grep out ' over-memory +does not fit: [0-9.]+ MiB on pp rank [0-9]+ is [0-9.]+ MiB over the limit'
echo "  limit $lim_mib MiB: winner $got MiB, $n_lim layouts fit and run"

# Nothing fits: refused, naming the smallest layout and its bytes.
# shellcheck disable=SC2086
run_np 1 --plan --np 8 $MODEL --plan.memory 64K
expect_fail
smallest=$(rows | awk 'NR == 1 || $1 < m { m = $1 } END { printf "%.1f", m }')
expect_grep err "no layout of 8 ranks fits the memory limit of 0.1 MiB per rank; the smallest, dp=.*, needs $smallest MiB"

# The trainer's pipelines (the defaults: interleaved, zb-h1, zb-v and ZeRO 1
# run under pp, ZeRO 2 and 3 do not; the zero-bubble schedules never with
# activation checkpointing); with every stage allowed nothing is marked.
# shellcheck disable=SC2086
run_np 1 --plan --np 8 $MODEL
expect_ok
expect_grep out 'sched=interleaved v=2 .* fits '
expect_grep out 'sched=zb-h1 v=1 .* ckpt=off .* fits '
expect_grep out 'sched=zb-v v=2 .* ckpt=off .* fits '
expect_no_grep out 'sched=zb-[hv]1* .* ckpt=on' "a zero-bubble layout with activation checkpointing is listed"
expect_grep out 'pp=2 .* zero=1 .* fits '
expect_grep out 'pp=2 .* zero=2 .* not-run '
# shellcheck disable=SC2086
run_np 1 --plan --np 8 $MODEL --plan.pp_zero 3
expect_ok
expect_no_grep out ' not-run ' "every layout runs, yet one is marked not-run"

# Bad input.
# shellcheck disable=SC2086
run_np 1 --plan --np 7 $MODEL
expect_fail
expect_grep err 'no layout of 7 ranks divides the model and the batch \(dp=7 tp=1 pp=1: plan.global_batch=8 is not divisible by dp=7'
# shellcheck disable=SC2086
run_np 1 --plan --np 8 $MODEL --model.n_experts_typo 3
expect_fail
expect_grep err 'model.n_experts_typo'
# shellcheck disable=SC2086
run_np 1 --plan --np 8 $MODEL --plan.pp_schedules 1f1b,zigzag
expect_fail
expect_grep err "unknown pipeline schedule 'zigzag'"
# shellcheck disable=SC2086
run_np 1 --plan --np 8 $MODEL --model.d_model 66
expect_fail
expect_grep err 'd_model'
printf 'model:\n  n_layers: 4\n  d_model: 64\n  n_heads: 4\n  n_hidden: 3\n' >"$TMP/model.yaml"
run_np 1 --plan --np 8 --config "$TMP/model.yaml" --plan.bandwidth 10 --plan.latency 20
expect_fail
expect_grep err 'model.n_hidden'

# Two ranks measure together and print once.
# shellcheck disable=SC2086
run_np 2 --plan --np 8 $MODEL
expect_ok
[ "$(count_grep out '^winner: ')" -eq 1 ] || fail "two ranks printed the plan twice"
expect_grep out 'measured with 2 ranks x'
echo "PASS"
