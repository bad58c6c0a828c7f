#!/bin/sh
# colossal-rlhf end to end on CPU with nothing downloaded (docs/rlhf.md): a
# tiny pretrained GPT-2 and the embedded arithmetic (colossal-data rl-example)
# under each algorithm. Data parallelism gives one rank's numbers (rm, dpo,
# grpo: 2 ranks x 1 microbatch against 1 rank x 2), DPO starts at log 2
# (policy = reference), a stopped GRPO run and a stopped reward-model run (its
# head in the checkpoint) resume to the uninterrupted run's rewards and
# losses, GRPO at ZeRO-1, at ZeRO-2 with offload and at ZeRO-2 under tp 2
# gives the stage-0 run's (the rollouts read the ZeRO engine's working
# weights), PPO trains, PPO scored by the reward model trained here rewards
# its scores (alone, and weighted beside exact match), gives the same run with
# its frozen models waiting in host memory, and resumes to the same rewards,
# and bad input is refused naming what is wrong.
. "$top_srcdir/tests/apps/sft_lib.sh"
RLHF_BIN="$top_builddir/apps/colossal-rlhf"
sft_setup
"$DATA_BIN" rl-example --out "$TMP/rl" --docs 300 --seed 7 --held_out 10 >"$TMP/out" 2>"$TMP/err" ||
    fail "rl-example failed"
for f in prompts_train prompts_held_out prefs_train prefs_held_out; do
    [ -s "$TMP/rl/$f.jsonl" ] || fail "rl-example wrote no $f.jsonl"
done

run_rl() {
    n=$1
    shift
    cai_launch "$n" "$RLHF_BIN" "$@"
}
# rl KEY FILE: "step value" of KEY in the kind rl records
rl() { grep '"kind":"rl"' "$2" | sed -n "s/.*\"step\":\([0-9]*\).*\"$1\":\([-+0-9.eE]*\).*/\1 \2/p"; }
# close KEY A B WHAT [FLOOR]: KEY of two runs' kind rl records within 1e-5
# relative to the larger of the value and FLOOR (default 1e-3; a margin, a
# difference of two rewards of order 0.1 that cancel, at the rewards' scale)
close() {
    rl "$1" "$2" >"$TMP/a"
    rl "$1" "$3" >"$TMP/b"
    [ -s "$TMP/a" ] || fail "no $1 records in $2"
    paste "$TMP/a" "$TMP/b" | awk -v k="$1" -v w="$4" -v f="${5:-1e-3}" '{d=$2-$4; if (d<0) d=-d; s=($2<0?-$2:$2); r=d/(s>f?s:f);
        if (r>m) m=r; n++} END{printf "%s: %d steps, max relative difference %s %.2e\n", k, n, w, m; exit !(n>0 && m<=1e-5)}' ||
        fail "$1 differs ($4) by more than 1e-5"
}
# same_rl A B WHAT: the kind rl records of two runs equal but for their timings
same_rl() {
    grep '"kind":"rl"' "$1" | sed 's/,"rollout_s".*//' >"$TMP/a"
    grep '"kind":"rl"' "$2" | sed 's/,"rollout_s".*//' >"$TMP/b"
    [ -s "$TMP/a" ] || fail "no rl records in $1"
    cmp -s "$TMP/a" "$TMP/b" || { diff "$TMP/a" "$TMP/b" >&2; fail "$3: the rl records differ"; }
}
RL="--model.path $TMP/pt/checkpoints --train.seq_len 64 --log.timestamps false --run.peak_tflops 1 --log.interval 1
  --optim.warmup_steps 1"
PREFS="--data.train $TMP/rl/prefs_train.jsonl --data.valid $TMP/rl/prefs_held_out.jsonl"
PROMPTS="--data.train $TMP/rl/prompts_train.jsonl --data.valid $TMP/rl/prompts_held_out.jsonl --eval.samples 8"
# Under the sanitizers (make check-sanitize: CAI_SANITIZE=1) the 1-vs-2-rank
# comparisons of rm, dpo and grpo with a reward model, whose data-parallel
# paths the grpo and dpo tp 2 / ZeRO-3 comparisons reach too, are left out,
# and GRPO trains 2 steps (stopped and resumed at 1) instead of 4 (at 2).
SAN=${CAI_SANITIZE:-0}

# reward model: 1 rank x 2 microbatches = 2 ranks x 1
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo rm $RL $PREFS --train.steps 6 --train.micro_batch 2 --train.grad_accum 2 --optim.lr 1e-3 \
    --rm.head_std 0.02 --checkpoint.every 3 --run.dir "$TMP/rm1"
expect_ok
expect_grep out '^eval at step 6 \| held-out pairs ranked right [0-9]+/[0-9]+'
# shellcheck disable=SC2086
if [ "$SAN" != 1 ]; then
    # shellcheck disable=SC2086
    run_rl 2 --rlhf.algo rm $RL $PREFS --train.steps 6 --train.micro_batch 2 --optim.lr 1e-3 --rm.head_std 0.02 \
        --run.dir "$TMP/rm2"
    expect_ok
    close loss "$TMP/rm1/metrics.jsonl" "$TMP/rm2/metrics.jsonl" "rm, 1 vs 2 ranks"
    close margin "$TMP/rm1/metrics.jsonl" "$TMP/rm2/metrics.jsonl" "rm, 1 vs 2 ranks" 0.1
fi
# stopped at step 3 and resumed: the head and its moments come back
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo rm $RL $PREFS --train.steps 6 --train.micro_batch 2 --train.grad_accum 2 --optim.lr 1e-3 \
    --rm.head_std 0.02 --checkpoint.every 3 --train.stop_at 3 --run.dir "$TMP/rm3"
expect_rc 3
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo rm $RL $PREFS --train.steps 6 --train.micro_batch 2 --train.grad_accum 2 --optim.lr 1e-3 \
    --rm.head_std 0.02 --checkpoint.every 3 --resume latest --run.dir "$TMP/rm3"
expect_ok
same_rl "$TMP/rm1/metrics.jsonl" "$TMP/rm3/metrics.jsonl" "rm resumed at step 3"

# DPO: the policy starts as the reference, so the first loss is log 2
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo dpo $RL $PREFS --train.steps 4 --train.micro_batch 2 --train.grad_accum 2 --optim.lr 1e-4 \
    --run.dir "$TMP/dpo1"
expect_ok
rl loss "$TMP/dpo1/metrics.jsonl" | awk 'NR==1{d=$2-log(2); if (d<0) d=-d; printf "dpo step 1 loss %s (log 2 %.7f)\n", $2, log(2);
    exit !(d<1e-6)}' || fail "the first DPO loss is not log 2"
if [ "$SAN" != 1 ]; then
    # shellcheck disable=SC2086
    run_rl 2 --rlhf.algo dpo $RL $PREFS --train.steps 4 --train.micro_batch 2 --optim.lr 1e-4 --run.dir "$TMP/dpo2"
    expect_ok
    close loss "$TMP/dpo1/metrics.jsonl" "$TMP/dpo2/metrics.jsonl" "dpo, 1 vs 2 ranks"
fi
# tensor parallel (vocabulary-parallel cross-entropy under the objective) and ZeRO-3
# shellcheck disable=SC2086
run_rl 2 --rlhf.algo dpo $RL $PREFS --train.steps 4 --train.micro_batch 2 --train.grad_accum 2 --optim.lr 1e-4 \
    --mesh.tp 2 --run.dir "$TMP/dpo-tp2"
expect_ok
close loss "$TMP/dpo1/metrics.jsonl" "$TMP/dpo-tp2/metrics.jsonl" "dpo, tp 2"
# shellcheck disable=SC2086
run_rl 2 --rlhf.algo dpo $RL $PREFS --train.steps 4 --train.micro_batch 2 --optim.lr 1e-4 --zero.stage 3 \
    --run.dir "$TMP/dpo-z3"
expect_ok
close loss "$TMP/dpo1/metrics.jsonl" "$TMP/dpo-z3/metrics.jsonl" "dpo, ZeRO-3 over 2 ranks"
# SimPO needs no reference
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo dpo --dpo.loss simpo --dpo.beta 2 $RL $PREFS --train.steps 2 --train.micro_batch 2 \
    --run.dir "$TMP/simpo"
expect_ok
expect_no_grep out 'reference: a frozen copy'

# GRPO: 8 prompts x 4 samples a step; 1 rank (2 microbatches of 16) = 2
# ranks (one of 16 each): every rollout is drawn from (seed, step, prompt,
# sample), so the rewards agree and the losses within rounding
GS=4
[ "$SAN" != 1 ] || GS=2
G="--rlhf.algo grpo $RL $PROMPTS --train.steps $GS --rollout.prompts 8 --rollout.samples 4 --train.micro_batch 16
  --optim.lr 1e-4 --checkpoint.every $((GS / 2))"
# shellcheck disable=SC2086
run_rl 1 $G --run.dir "$TMP/g1"
expect_ok
expect_grep out '^eval at step 0 \| held-out exact match [0-9]+/8'
# the training forward scores exactly the tokens the engine drew, at the
# positions it drew them (its log-probs agree with the engine's), and the
# single pass over each batch starts at ratio 1
# sampler_agrees RUN WHAT: every step's training forward scores the tokens
# the engine drew with the engine's log-probs (within 1e-4)
sampler_agrees() {
    rl sampler_logp_diff_max "$TMP/$1/metrics.jsonl" | awk -v w="$2" '{if (!($2 < 1e-4)) bad=1; n++}
        END{printf "%s: %d steps, sampler vs training log-prob max %s\n", w, n, $2; exit !(n=='"$GS"' && !bad)}' ||
        fail "$2: the training forward's log-probs are not the sampled tokens' (sampler_logp_diff_max >= 1e-4)"
}
sampler_agrees g1 grpo
rl ratio_dev_max "$TMP/g1/metrics.jsonl" | awk -v want="$GS" '{if ($2 != 0) bad=1; n++} END{exit !(n==want && !bad)}' ||
    fail "grpo: the first pass's ratio is not exactly 1"
# shellcheck disable=SC2086
run_rl 2 $G --run.dir "$TMP/g2"
expect_ok
close reward_mean "$TMP/g1/metrics.jsonl" "$TMP/g2/metrics.jsonl" "grpo, 1 vs 2 ranks"
close loss "$TMP/g1/metrics.jsonl" "$TMP/g2/metrics.jsonl" "grpo, 1 vs 2 ranks"
if [ "$SAN" != 1 ]; then
    # ZeRO-1, and ZeRO-2 with its optimizer on the host: the rollouts read
    # the ZeRO engine's whole working weights in place, refreshed every
    # step, and give the stage-0 run's rewards and losses
    for z in 1 2; do
        off=false
        [ "$z" = 2 ] && off=true
        # shellcheck disable=SC2086
        run_rl 2 $G --zero.stage $z --zero.offload $off --run.dir "$TMP/gz$z"
        expect_ok
        sampler_agrees "gz$z" "grpo, zero.stage=$z" # the rollouts read this step's weights
        close reward_mean "$TMP/g2/metrics.jsonl" "$TMP/gz$z/metrics.jsonl" "grpo, zero.stage=$z offload=$off"
        close loss "$TMP/g2/metrics.jsonl" "$TMP/gz$z/metrics.jsonl" "grpo, zero.stage=$z offload=$off"
    done
    # and under tp 2, where each rank's working weights are its shards
    for z in 0 2; do
        # shellcheck disable=SC2086
        run_rl 2 $G --mesh.tp 2 --zero.stage $z --run.dir "$TMP/gt$z"
        expect_ok
    done
    sampler_agrees gt2 "grpo, tp 2, zero.stage=2"
    close reward_mean "$TMP/gt0/metrics.jsonl" "$TMP/gt2/metrics.jsonl" "grpo, tp 2, zero.stage=2"
    close loss "$TMP/gt0/metrics.jsonl" "$TMP/gt2/metrics.jsonl" "grpo, tp 2, zero.stage=2"
fi
# killed after the middle step (its checkpoint) and resumed: the same
# rollouts, rewards and losses as the uninterrupted run
# shellcheck disable=SC2086
run_rl 1 $G --train.stop_at $((GS / 2)) --run.dir "$TMP/g3"
expect_rc 3
# shellcheck disable=SC2086
run_rl 1 $G --resume latest --run.dir "$TMP/g3"
expect_ok
same_rl "$TMP/g1/metrics.jsonl" "$TMP/g3/metrics.jsonl" "grpo resumed at step $((GS / 2))"

# PPO with the value head on the policy, rollouts at temperature 0.7
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo ppo $RL $PROMPTS --train.steps 3 --rollout.prompts 8 --rollout.samples 2 --train.micro_batch 8 \
    --optim.lr 1e-4 --rollout.passes 2 --rollout.temperature 0.7 --run.dir "$TMP/ppo"
expect_ok
[ "$(rl loss "$TMP/ppo/metrics.jsonl" | wc -l)" -eq 3 ] || fail "ppo: expected 3 rl records"
rl value_clip_fraction "$TMP/ppo/metrics.jsonl" | awk '{if ($2 != $2+0) exit 1}' || fail "ppo: no value statistics"
# two passes: the recorded old log-probs are the first pass's own, both of
# the logits over the temperature
rl ratio_dev_max "$TMP/ppo/metrics.jsonl" | awk '{if ($2 != 0) bad=1; n++} END{exit !(n==3 && !bad)}' ||
    fail "ppo: the first pass over a batch does not start at ratio 1"
# the engine's log-probs are of the raw logits: compared at temperature 1 only
[ "$(grep -c '"sampler_logp_diff_max":null' "$TMP/ppo/metrics.jsonl")" -eq 3 ] ||
    fail "ppo at temperature 0.7: sampler_logp_diff_max should be null (not comparable)"

# PPO scored by the reward model rm1 trained (its step-6 weights and score
# head, frozen). With no verifiable rewards the reward is the RM's score,
# so each step's reward mean is its RM score mean
RMP="--rlhf.algo ppo $RL $PROMPTS --rollout.prompts 4 --rollout.samples 2 --train.micro_batch 8 --optim.lr 1e-4
  --rollout.max_new_tokens 8 --checkpoint.every 1 --train.steps 2 --reward.model $TMP/rm1/checkpoints"
# shellcheck disable=SC2086
run_rl 1 $RMP --reward.functions "" --run.dir "$TMP/ppo-rm"
expect_ok
expect_grep out "^reward model: $TMP/rm1/checkpoints/step-0*6.h5 "
# placement.frozen=host: the reference's and the reward model's weights
# wait in host memory while the engine rolls out, and the engine's pool is
# given back while they score and the policy trains; the same run to the
# bit (every rl record, the evaluations included)
# shellcheck disable=SC2086
run_rl 1 $RMP --reward.functions "" --placement.frozen host --run.dir "$TMP/ppo-rm-host"
expect_ok
expect_grep out "^placement: frozen models' weights in host memory except while they score"
expect_grep out "^  frozen models' weights +[0-9.]+ MiB  host; device while they score"
expect_grep out '^  rollout KV pool +[0-9.]+ MiB  device during rollouts, in turn with the frozen weights'
same_rl "$TMP/ppo-rm/metrics.jsonl" "$TMP/ppo-rm-host/metrics.jsonl" "ppo with its frozen models on the host"
grep '"kind":"rl_eval"' "$TMP/ppo-rm/metrics.jsonl" >"$TMP/a"
grep '"kind":"rl_eval"' "$TMP/ppo-rm-host/metrics.jsonl" >"$TMP/b"
[ -s "$TMP/a" ] && cmp -s "$TMP/a" "$TMP/b" || fail "ppo with its frozen models on the host: the evaluations differ"
rl reward_mean "$TMP/ppo-rm/metrics.jsonl" >"$TMP/a"
rl rm_score_mean "$TMP/ppo-rm/metrics.jsonl" >"$TMP/b"
paste "$TMP/a" "$TMP/b" | awk '{d=$2-$4; if (d<0) d=-d; if (d>1e-6*($4<0?-$4:$4)+1e-9 || $4==0) bad=1; n++}
    END{printf "ppo with a reward model: %d steps, reward mean = RM score mean\n", n; exit !(n==2 && !bad)}' ||
    fail "ppo with reward.model alone: reward_mean is not the RM's score mean (or the score is 0)"
# grpo takes it too; 2 replicas score their halves of the same rollouts
GRM_RANKS="1 2"
[ "$SAN" != 1 ] || GRM_RANKS=1
for n in $GRM_RANKS; do
    # shellcheck disable=SC2086
    run_rl $n --rlhf.algo grpo $RL $PROMPTS --rollout.prompts 4 --rollout.samples 2 --train.micro_batch 8 \
        --rollout.max_new_tokens 8 --train.steps 2 --reward.model "$TMP/rm1/checkpoints" --reward.functions "" \
        --run.dir "$TMP/grpo-rm$n"
    expect_ok
done
[ "$SAN" = 1 ] ||
    close rm_score_mean "$TMP/grpo-rm1/metrics.jsonl" "$TMP/grpo-rm2/metrics.jsonl" "grpo with a reward model, 1 vs 2 ranks"
rl reward_mean "$TMP/grpo-rm1/metrics.jsonl" >"$TMP/a"
rl rm_score_mean "$TMP/grpo-rm1/metrics.jsonl" >"$TMP/b"
paste "$TMP/a" "$TMP/b" | awk '{d=$2-$4; if (d<0) d=-d; if (d>1e-6*($4<0?-$4:$4)+1e-9 || $4==0) bad=1; n++}
    END{exit !(n==2 && !bad)}' || fail "grpo with reward.model alone: reward_mean is not the RM's score mean"
# both: reward = 0.5 x RM score + exact match; step 1's rollouts (same
# seed, same policy) are the first run's, so are their RM scores
# shellcheck disable=SC2086
run_rl 1 $RMP --train.steps 1 --reward.functions exact_match --reward.model_weight 0.5 --run.dir "$TMP/ppo-rm-w"
expect_ok
rl rm_score_mean "$TMP/ppo-rm/metrics.jsonl" | sed -n 1p >"$TMP/a"
rl rm_score_mean "$TMP/ppo-rm-w/metrics.jsonl" >"$TMP/b"
rl reward_mean "$TMP/ppo-rm-w/metrics.jsonl" >"$TMP/c"
rl accuracy "$TMP/ppo-rm-w/metrics.jsonl" >"$TMP/d"
paste "$TMP/a" "$TMP/b" "$TMP/c" "$TMP/d" | awk '{s=$2; if (s<0) s=-s; e=0.5*$4+$8-$6; if (e<0) e=-e; d=$2-$4; if (d<0) d=-d;
    printf "ppo, reward.model_weight 0.5 + exact_match: RM score %s (alone: %s), reward %s, exact match %s\n", $4, $2, $6, $8;
    exit !(NR==1 && d<=1e-6*s && e<=1e-6*(s+1))}' || fail "ppo: reward_mean is not 0.5 x rm_score_mean + exact match"
# stopped after step 1 and resumed: the same rollouts and rewards; a resume
# naming another reward model is refused
# shellcheck disable=SC2086
run_rl 1 $RMP --reward.functions "" --train.stop_at 1 --run.dir "$TMP/ppo-rm2"
expect_rc 3
# shellcheck disable=SC2086
run_rl 1 $RMP --reward.functions "" --reward.model "$TMP/rm1/checkpoints/step-00000003.h5" --resume latest \
    --run.dir "$TMP/ppo-rm2"
expect_rc 1
expect_grep err "trained with reward.model=.*rm1/checkpoints/step-0*6.h5.*this run gives reward.model=.*step-0*3.h5"
# shellcheck disable=SC2086
run_rl 1 $RMP --reward.functions "" --resume latest --run.dir "$TMP/ppo-rm2"
expect_ok
same_rl "$TMP/ppo-rm/metrics.jsonl" "$TMP/ppo-rm2/metrics.jsonl" "ppo with a reward model resumed at step 1"
# refused before anything is built: a checkpoint with no score head, a ppo
# run's (a value head), the key under rm or dpo
# shellcheck disable=SC2086
run_rl 1 $RMP --reward.model "$TMP/pt/checkpoints" --run.dir "$TMP/bad"
expect_rc 2
expect_grep err "reward.model=$TMP/pt/checkpoints: .*step-0*60.h5 is not a reward model checkpoint"
# shellcheck disable=SC2086
run_rl 1 $RMP --reward.model "$TMP/ppo-rm/checkpoints" --run.dir "$TMP/bad"
expect_rc 2
expect_grep err "reward.model=$TMP/ppo-rm/checkpoints: .* written by rlhf.algo=ppo, not rm"
# a policy reading other tokens than the reward model (two ids swapped)
mkdir -p "$TMP/tok2"
cp "$TMP/pt/tokenizer/merges.txt" "$TMP/tok2/"
sed -e 's/^"!": 1,$/"!": 2,/' -e 's/^"\\"": 2,$/"\\"": 1,/' "$TMP/pt/tokenizer/vocab.json" >"$TMP/tok2/vocab.json"
# shellcheck disable=SC2086
run_rl 1 $RMP --model.tokenizer "$TMP/tok2" --run.dir "$TMP/bad"
expect_rc 2
expect_grep err "reward.model=.*step-0*6.h5: its tokenizer .* spells token 1 otherwise than the policy's .*tok2"
# a policy of another width than the reward model
# shellcheck disable=SC2086
run_np 1 $TINY --model.d_model 32 --data.corpus_vocab 320 --train.steps 2 --eval.interval 0 --checkpoint.every 2 \
    --run.dir "$TMP/pt32"
expect_ok
# shellcheck disable=SC2086
run_rl 1 $RMP --model.path "$TMP/pt32/checkpoints" --run.dir "$TMP/bad"
expect_rc 2
expect_grep err "reward.model=.*step-0*6.h5: its d_model is 64, the policy's \(model.path=$TMP/pt32/checkpoints\) 32"
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo dpo $RL $PREFS --reward.model "$TMP/rm1/checkpoints" --run.dir "$TMP/bad"
expect_rc 2
expect_grep err "reward.model=$TMP/rm1/checkpoints with rlhf.algo=dpo"
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo dpo $RL $PREFS --placement.frozen host --run.dir "$TMP/bad"
expect_rc 2
expect_grep err "placement.frozen=host with rlhf.algo=dpo"

# The memory plan counts the reference and the rollout KV pool beside the
# policy, and a limit they do not fit names the pool size that would
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo grpo $RL $PROMPTS --policy.kl_coef 0.04 --rollout.kv_memory 64MiB --train.mem_limit 40MiB \
    --run.dir "$TMP/bad"
expect_rc 2
expect_grep out '^  frozen models +[0-9.]+ MiB  device'
expect_grep out '^  rollout KV pool +64.00 MiB  device'
expect_grep err 'memory plan: .*frozen models [0-9.]+, rollout KV pool 64.0\) exceeds .* rollout.kv_memory=[0-9]+MiB'
expect_no_grep err 'zero\.stage=3' "grpo's refusal offers zero.stage=3, which grpo refuses"

# Bad input
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo grpo $RL $PROMPTS --zero.stage 3 --run.dir "$TMP/bad"
expect_rc 2
expect_grep err 'zero.stage=3.*rollouts read the policy'"'"'s whole working weights in place'
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo grpo $RL $PROMPTS --reward.functions exact_match,no_such_reward --run.dir "$TMP/bad"
expect_rc 2
expect_grep err 'no_such_reward'
expect_grep err 'exact_match'
head -n 2 "$TMP/rl/prefs_train.jsonl" >"$TMP/badprefs.jsonl"
echo '{"context": [{"role": "user", "content": "What is 2 + 2?"}], "chosen": [{"role": "assistant", "content": "4"}]}' \
    >>"$TMP/badprefs.jsonl"
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo dpo $RL --data.train "$TMP/badprefs.jsonl" --run.dir "$TMP/bad"
expect_rc 2
expect_grep err 'badprefs.jsonl:3: .*rejected'
echo '{"messages": [{"role": "system", "content": "Be brief."}], "answer": "4"}' >"$TMP/badprompts.jsonl"
# shellcheck disable=SC2086
run_rl 1 --rlhf.algo grpo $RL --data.train "$TMP/badprompts.jsonl" --run.dir "$TMP/bad"
expect_rc 2
expect_grep err 'badprompts.jsonl:1: .*user'
echo "PASS"
