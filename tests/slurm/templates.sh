#!/bin/bash
# The sbatch templates in slurm/ on a real Slurm cluster: munged, slurmctld
# and two slurmd (nodes node1 and node2, two stand-in GPUs each) started on
# this host in a temporary directory (tests/slurm/cluster.sh) and stopped at
# the end. Skipped (77) unless root with slurm-wlm and munge installed.
#
# Every job runs the real colossal-pretrain / colossal-data with a tiny model
# under srun --mpi=pmix (mpirun for one job), submitted with sbatch --wait:
#   single     pretrain.sbatch, 1 node x 2 ranks: the uninterrupted reference
#   preempt    the same run, scancel --signal=USR1 --batch mid-run: the batch
#              shell forwards the signal, the app checkpoints and exits 3, the
#              script requeues, restart 1 resumes from `latest` and finishes;
#              its per-step losses equal the reference's, step for step
#   cancel     plain scancel mid-run: SIGTERM, checkpoint, no requeue
#   multinode  pretrain-multinode.sbatch, 2 nodes x 2 ranks
#   cpu        pretrain-cpu.sbatch, 2 nodes x 1 rank x 2 threads
#   mpirun     pretrain.sbatch with COLOSSAL_LAUNCHER=mpirun
#   array      batch-array.sbatch, 3 shards of a JSONL corpus through
#              colossal-data preprocess; the shards' tokens concatenated equal
#              the whole file preprocessed at once; a rerun skips done shards
#              and redoes a deleted one identically
#   infer      infer-array.sbatch, 3 tasks answering 30 requests with single's
#              checkpoint; every id once; a rerun of the array adds nothing
# For each pretrain job the MPI world size the app reports equals Slurm's
# SLURM_NTASKS (the helper's header line) and the node count SLURM_JOB_NUM_NODES.
#
# SLURM_KEEP=1 keeps the cluster directory (logs, job output) for a look.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@" # make check runs .sh tests with $(SHELL)
set -u
: "${top_srcdir:?run through make check}" "${top_builddir:?run through make check}"
. "$top_srcdir/tests/slurm/cluster.sh"
slurm_cluster_skip_reason && exit 77
for p in colossal-pretrain colossal-data colossal-infer; do
    [ -x "$top_builddir/apps/$p" ] || { echo "SKIP: $top_builddir/apps/$p is not built"; exit 77; }
done

T_START=$(date +%s)
W=$(mktemp -d "${TMPDIR:-/tmp}/colossal-slurm.XXXXXX")
slurm_cluster_up "$W" 2 || exit 1
echo "cluster up in $(($(date +%s) - T_START)) s: $(sinfo -h -N -o '%N %t %c CPUs %G' | tr '\n' ';')"
J=$W/jobs
mkdir -p "$J"
cd "$J" || exit 1

S=$top_srcdir/slurm
EX=$top_srcdir/examples/pretrain-tiny.yaml
export COLOSSAL_BIN=$top_builddir/apps
export COLOSSAL_ENV=$S/env/local.sh
# mpirun refuses root without these (make check exports them too).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# --time 30 min: the templates' warning signal (USR1 300 s before the end,
# up to 60 s earlier) must not fire on its own. --cpus-per-task=1 and the
# stand-in GPUs size the jobs to this host.
SB=(--time=30 --cpus-per-task=1)
TINY="--model.n_layers 2 --model.d_model 64 --model.n_heads 4 --train.seq_len 64 --train.micro_batch 4
  --optim.lr 2e-3 --optim.warmup_steps 2 --data.corpus_docs 600 --data.corpus_vocab 0 --generate.tokens 0
  --run.peak_tflops 1 --log.timestamps false --eval.interval 0 --log.interval 10"
STEPS=300

fail() {
    echo "FAIL: $*" >&2
    for f in "$J"/*.out "$J"/*.err "$J"/*.sbatch; do
        [ -s "$f" ] && { echo "--- $(basename "$f"):" >&2; tail -n 25 "$f" >&2; }
    done
    for f in "$W"/log/slurmctld.log "$W"/log/slurmd-*.log; do
        echo "--- $(basename "$f") (errors):" >&2
        grep -i error "$f" | tail -n 10 >&2
    done
    exit 1
}

# submit NAME SBATCH_ARGS...: sbatch --wait in the background; the job's
# stdout/stderr go to NAME.out/NAME.err, sbatch's own output to NAME.sbatch,
# its exit status to NAME.rc and the wall time to NAME.time.
submit() {
    local name=$1
    shift
    echo "+ sbatch --wait $*"
    (
        t0=$(date +%s)
        sbatch --wait --output="$J/$name.out" --error="$J/$name.err" "$@" >"$J/$name.sbatch" 2>&1 &
        echo $! >"$J/$name.pid"
        wait $!
        rc=$?
        echo $(($(date +%s) - t0)) >"$J/$name.time"
        echo $rc >"$J/$name.rc"
    ) &
}

# On the way out (pass or fail): an sbatch --wait whose controller is gone
# retries forever, so stop those still waiting before the cluster goes.
stop_submits() {
    local f
    for f in "$J"/*.pid; do
        [ -e "${f%.pid}.rc" ] || kill "$(cat "$f")" 2>/dev/null
    done
}
SLURM_CLUSTER_ON_DOWN=stop_submits

# wait_file FILE SECONDS WHAT
wait_file() {
    slurm_wait_for "$2" "$3" test -s "$1" || fail "$3: nothing after $2 s"
}

job_id() {
    wait_file "$J/$1.sbatch" 60 "$1 submitted"
    sed -n 's/^Submitted batch job \([0-9]*\).*/\1/p' "$J/$1.sbatch"
}

# finished NAME [RC]: the job's sbatch --wait returned (RC).
finished() {
    wait_file "$J/$1.rc" 400 "$1 finished"
    local rc
    rc=$(cat "$J/$1.rc")
    [ -z "${2:-}" ] || [ "$rc" = "$2" ] || fail "$1: sbatch --wait returned $rc, expected $2"
    echo "ok: $1 (sbatch --wait returned $rc after $(cat "$J/$1.time") s)"
}

expect() { grep -Eq -- "$2" "$J/$1" || fail "$1 lacks /$2/"; }
expect_not() { ! grep -Eq -- "$2" "$J/$1" || fail "$1 unexpectedly has /$2/"; }

# size NAME RANKS NODES: Slurm's view (the helper's header: SLURM_NTASKS,
# SLURM_JOB_NUM_NODES) and MPI's (the app's header: world size, nodes by
# MPI_COMM_TYPE_SHARED) agree with each other and with what was asked.
size() {
    local slurm mpi
    slurm=$(sed -n 's/^colossal-job: .* restart 0: \([0-9]*\) node(s) .*, \([0-9]*\) task(s),.*/\2 \1/p' "$J/$1.out")
    mpi=$(sed -n 's/^colossal-pretrain [^:]*: \([0-9]*\) ranks\{0,1\} on \([0-9]*\) nodes\{0,1\},.*/\1 \2/p' "$J/$1.out" |
        head -n 1)
    [ "$slurm" = "$2 $3" ] || fail "$1: Slurm gave '$slurm' (tasks nodes), expected '$2 $3'"
    [ "$mpi" = "$slurm" ] || fail "$1: the app's MPI world is '$mpi' (ranks nodes), Slurm's is '$slurm'"
}

# losses FILE: "step loss" for each train record of a metrics.jsonl.
losses() {
    grep '"kind":"train"' "$1" | sed -n 's/.*"step":\([0-9]*\).*"loss":\([-+0-9.eE]*\).*/\1 \2/p'
}

# ---------------------------------------------------------------- submit all
CKPT="--checkpoint.every 100"
# shellcheck disable=SC2086
submit single "${SB[@]}" --nodes=1 --ntasks-per-node=2 --gpus-per-node=2 \
    "$S/pretrain.sbatch" "$EX" $TINY $CKPT --train.steps $STEPS --run.dir single
# shellcheck disable=SC2086
submit preempt "${SB[@]}" --nodes=1 --ntasks-per-node=2 --gpus-per-node=2 \
    "$S/pretrain.sbatch" "$EX" $TINY $CKPT --train.steps $STEPS --run.dir preempt
# shellcheck disable=SC2086
submit cancel "${SB[@]}" --nodes=1 --ntasks-per-node=2 --gpus-per-node=2 \
    "$S/pretrain.sbatch" "$EX" $TINY $CKPT --train.steps 100000 --run.dir cancel
# The two "nodes" share one kernel, so OpenMPI's shared-memory segments of
# node1's and node2's local rank 0 would collide: TCP between every rank.
# shellcheck disable=SC2086
OMPI_MCA_btl=self,tcp submit multinode "${SB[@]}" --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 \
    "$S/pretrain-multinode.sbatch" "$EX" $TINY --train.steps 20 --run.dir multinode
# shellcheck disable=SC2086
OMPI_MCA_btl=self,tcp submit cpu --time=30 --nodes=2 --ntasks-per-node=1 --cpus-per-task=2 \
    "$S/pretrain-cpu.sbatch" "$EX" $TINY --train.steps 20 --run.dir cpu
# shellcheck disable=SC2086
COLOSSAL_LAUNCHER=mpirun submit mpirun "${SB[@]}" --nodes=1 --ntasks-per-node=2 --gpus-per-node=2 \
    "$S/pretrain.sbatch" "$EX" $TINY --train.steps 20 --run.dir mpirun

"$COLOSSAL_BIN/colossal-data" corpus --out corpus.jsonl --docs 100 --seed 7 >/dev/null || fail "colossal-data corpus"
submit array "${SB[@]}" --array=0-2 --ntasks-per-node=1 --output="$J/array-%a.out" --error="$J/array-%a.err" \
    "$S/batch-array.sbatch" corpus.jsonl shards colossal-data preprocess --input '{shard}' --output-prefix '{out}'

# ---------------------------------------------------------------- signals
# Whichever of preempt and cancel reaches step 10 first gets its signal
# first; both must be signalled mid-run.
pid=$(job_id preempt)
cid=$(job_id cancel)
p_sent=0
c_sent=0
i=0
while [ $p_sent = 0 ] || [ $c_sent = 0 ]; do
    if [ $p_sent = 0 ] && grep -q '^step  *10/' "$J/preempt.out" 2>/dev/null; then
        echo "+ scancel --signal=USR1 --batch $pid"
        scancel --signal=USR1 --batch "$pid" || fail "scancel --signal=USR1 --batch $pid"
        p_sent=1
    fi
    if [ $c_sent = 0 ] && grep -q '^step  *10/' "$J/cancel.out" 2>/dev/null; then
        echo "+ scancel $cid"
        scancel "$cid" || fail "scancel $cid"
        c_sent=1
    fi
    i=$((i + 1))
    [ $i -le 1500 ] || fail "preempt or cancel did not reach step 10 within 300 s"
    sleep 0.2
done

# ---------------------------------------------------------------- cancel
slurm_wait_for 180 "cancel's batch shell to decide" grep -q 'colossal-job: .* step exited' "$J/cancel.out" ||
    fail "cancel: the batch script did not report its decision"
# A requeued job is PENDING (and listed by squeue) before its batch script
# has even exited; a cancelled one never is. (Its CANCELLED state itself is
# not checked: the record may be purged MinJobAge = 5 s after the scancel.)
slurm_wait_for 30 "cancel's job to leave the running states" \
    sh -c "[ -z \"\$(squeue -h -j $cid -t RUNNING,COMPLETING 2>/dev/null)\" ]" ||
    fail "cancel: job $cid is still running"
[ -z "$(squeue -h -j "$cid" -t PENDING,REQUEUED,REQUEUE_HOLD 2>/dev/null)" ] ||
    fail "cancel: job $cid was requeued: $(squeue -j "$cid")"
finished cancel
expect cancel.out 'SIGTERM: Slurm is ending the job'
expect cancel.out '^stopped by SIGTERM after step [0-9]+ of 100000'
k=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\) .*/\1/p' "$J/cancel.out")
expect cancel.out "^checkpoint at step $k: "
expect cancel.out "status 3 \(checkpoint written\); the job is ending, not requeueing"
[ "$(cat cancel/checkpoints/latest)" = "step-$(printf %08d "$k").h5" ] ||
    fail "cancel: latest is '$(cat cancel/checkpoints/latest)', expected the step $k checkpoint"
size cancel 2 1

# ---------------------------------------------------------------- results
finished single 0
expect single.out "^done: $STEPS steps"
expect single.out 'colossal-job: .* step finished'
size single 2 1

finished preempt 0
expect preempt.out "job $pid, restart 0:"
expect preempt.out 'colossal-job: .* SIGUSR1 \(time limit near'
expect preempt.out '^stopped by SIGUSR1 after step [0-9]+ of '"$STEPS"
k=$(sed -n 's/^stopped by SIGUSR1 after step \([0-9]*\) .*/\1/p' "$J/preempt.out")
[ "$k" -lt "$STEPS" ] || fail "preempt: the first run was not stopped early"
expect preempt.out "^checkpoint at step $k: preempt/checkpoints/step-0*$k.h5"
expect preempt.out "status 3 \(checkpoint written\): requeueing job $pid"
expect preempt.out "job $pid, restart 1:"
expect preempt.err "resumed from preempt/checkpoints/step-0*$k.h5: step $k,"
expect preempt.out "^done: $((STEPS - k)) steps"
size preempt 2 1
# The interrupted run continued exactly: the same loss at every step as the
# uninterrupted one, each step once.
losses single/metrics.jsonl >single.losses
losses preempt/metrics.jsonl >preempt.losses
[ "$(wc -l <single.losses)" = "$STEPS" ] || fail "single: $(wc -l <single.losses) train records, expected $STEPS"
cmp -s single.losses preempt.losses || {
    diff single.losses preempt.losses | head -n 10 >&2
    fail "preempt: the losses differ from the uninterrupted run (first lines of the diff above)"
}
t_req=$(sed -n 's/^colossal-job: \([0-9-]* [0-9:]*\) step exited with status 3.*requeueing.*/\1/p' "$J/preempt.out")
t_re=$(sed -n 's/^colossal-job: \([0-9-]* [0-9:]*\) job [0-9]*, restart 1:.*/\1/p' "$J/preempt.out")
echo "preempt: stopped at step $k of $STEPS, requeued, restarted $(($(date -d "$t_re" +%s) - $(date -d "$t_req" +%s))) s" \
    "later, resumed and matched the reference loss at all $STEPS steps"

finished multinode 0
expect multinode.out '^done: 20 steps'
size multinode 4 2
expect multinode.out 'node\(s\) node\[1-2\]'

finished cpu 0
expect cpu.out '^done: 20 steps'
size cpu 2 2
# --cpus-per-task=2 reached the ranks (SRUN_CPUS_PER_TASK, OMP_NUM_THREADS).
expect cpu.out 'device host \(2 threads'
expect cpu.out 'GPUs per node none'

finished mpirun 0
expect mpirun.out 'launcher mpirun'
expect mpirun.out '^done: 20 steps'
size mpirun 2 1

# ---------------------------------------------------------------- array
finished array 0
for i in 0 1 2; do
    expect "array-$i.out" "shard $i of 3: lines"
    expect "array-$i.out" 'colossal-job: .* step finished'
    [ -e "shards/shard-0000$i.done" ] || fail "array: shard $i has no .done"
done
cat shards/shard-0000[0-2].in.jsonl | cmp -s - corpus.jsonl || fail "array: the shards do not add up to the input"
# Reference: the whole file preprocessed at once. Byte-level tokens per
# document, so the shards' token streams concatenated must equal it.
"$COLOSSAL_BIN/colossal-data" preprocess --input corpus.jsonl --output-prefix whole >/dev/null 2>&1 ||
    fail "array: preprocessing the whole corpus"
cat shards/shard-0000[0-2].bin | cmp -s - whole.bin || fail "array: shard tokens differ from the whole-file tokens"
docs=0
for i in 0 1 2; do
    n=$("$COLOSSAL_BIN/colossal-data" info --data "shards/shard-0000$i" | sed -n 's/^ *documents *\([0-9]*\).*/\1/p')
    [ "$n" = "$(wc -l <"shards/shard-0000$i.in.jsonl")" ] || fail "array: shard $i has $n documents"
    docs=$((docs + n))
done
[ "$docs" = 100 ] || fail "array: $docs documents in the shards, expected 100"
# Rerun: done shards are skipped; a deleted one is redone alone (its array
# index alone, COLOSSAL_SHARDS giving the shard count) and comes out equal.
cp shards/shard-00001.bin shard1.bin
rm -f shards/shard-00001.*
rm -f array-*.out array-*.err
submit rerun "${SB[@]}" --array=0-2 --ntasks-per-node=1 --output="$J/array-%a.out" --error="$J/array-%a.err" \
    "$S/batch-array.sbatch" corpus.jsonl shards colossal-data preprocess --input '{shard}' --output-prefix '{out}'
finished rerun 0
expect array-0.out 'shard 0 of 3 is already done'
expect array-2.out 'shard 2 of 3 is already done'
expect array-1.out 'shard 1 of 3: lines'
cmp -s shard1.bin shards/shard-00001.bin || fail "array: the redone shard 1 differs"
rm -f shards/shard-00001.*
COLOSSAL_SHARDS=3 submit rerun1 "${SB[@]}" --array=1 --ntasks-per-node=1 --output="$J/array1-%a.out" \
    "$S/batch-array.sbatch" corpus.jsonl shards colossal-data preprocess --input '{shard}' --output-prefix '{out}'
finished rerun1 0
expect array1-1.out 'shard 1 of 3: lines'
cmp -s shard1.bin shards/shard-00001.bin || fail "array: shard 1 redone alone differs"

# ---------------------------------------------------------------- infer array
# single's checkpoint answers 30 requests in 3 array tasks; a rerun of the
# whole array skips every id already answered.
for i in $(seq 0 29); do
    printf '{"id": "q%02d", "prompt": "Once upon a time %d", "max_tokens": 8, "ignore_eos": true}\n' "$i" "$i"
done >requests.jsonl
infer_array() {
    submit "$1" "${SB[@]}" --array=0-2 --ntasks-per-node=1 --gpus-per-node=0 --output="$J/$1-%a.out" \
        --error="$J/$1-%a.err" "$S/infer-array.sbatch" single/checkpoints requests.jsonl 'answers/out-{shard}.jsonl' \
        --model.tokenizer bytes --run.device cpu --log.timestamps false
    finished "$1" 0
}
infer_array infer
for i in 0 1 2; do
    expect "infer-$i.out" "task $i of 3"
    expect "infer-$i.out" "10/10 requests"
    [ "$(wc -l <"answers/out-$i-of-3.jsonl")" = 10 ] || fail "infer array: task $i wrote $(wc -l <"answers/out-$i-of-3.jsonl") lines"
done
ids=$(cat answers/out-*-of-3.jsonl | sed -n 's/^{"id":"\(q[0-9]*\)".*/\1/p' | sort -u | wc -l)
[ "$ids" = 30 ] || fail "infer array: $ids distinct ids answered, expected 30"
infer_array infer-rerun
for i in 0 1 2; do expect "infer-rerun-$i.out" "0/0 requests"; done
[ "$(cat answers/out-*-of-3.jsonl | wc -l)" = 30 ] || fail "infer array: the rerun added lines"

wait
# Under --enable-sanitizers the ranks report to the jobs' stderr.
for f in "$J"/*.err; do
    ! grep -Eq 'Sanitizer|runtime error:' "$f" || fail "sanitizer report in $(basename "$f")"
done
echo "PASS: all templates in $(($(date +%s) - T_START)) s"
