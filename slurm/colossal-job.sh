# Shared by the colossal sbatch templates (sourced from the batch script, not
# run): fabric environment, threads, the launcher, and the preemption flow.
#
#   colossal_job_start         header line, env file, CPU/thread settings,
#                              COLOSSAL_LAUNCH (the launcher as an array)
#   colossal_job_run CMD...    run the job step, handle Slurm's warning signal;
#                              after a checkpoint requeue the job and exit the
#                              script, otherwise return the step's status
#   colossal_bin NAME          path of a colossal executable
#
# Settings (environment; sbatch passes the submitting shell's environment):
#   COLOSSAL_ENV          fabric environment file to source
#                         (default: env/infiniband.sh next to this file)
#   COLOSSAL_BIN          directory of the colossal executables (default: PATH)
#   COLOSSAL_LAUNCHER     srun (default) or mpirun
#   COLOSSAL_CHECKPOINT_STATUS  the apps' exit status for "checkpoint written
#                         after a stop signal, run me again" (default 3)
#   COLOSSAL_MAX_RESTARTS stop requeueing after this many restarts (default 100)
#
# Preemption flow (docs/slurm.md): the templates ask for --signal=B:USR1@N, so
# N seconds before the time limit Slurm signals this batch shell only. bash
# runs a trap only between commands, so the step runs in the background and
# the shell waits for it; the USR1 trap forwards the signal to the step
# (srun and mpirun both pass SIGUSR1 on to every rank), the ranks agree at
# the next step boundary, write a checkpoint and exit with
# COLOSSAL_CHECKPOINT_STATUS, and the shell then puts the job back in the
# queue with `scontrol requeue` (same job id, SLURM_RESTART_COUNT + 1, logs
# appended with --open-mode=append). The restarted app resumes from its
# checkpoint directory's `latest` (the pretrain templates pass
# --checkpoint.resume=auto).
#
# The same status after a signal sent to the ranks directly (scancel
# --signal=USR1 without --batch) requeues too. SIGTERM to the whole job
# (scancel, the time limit itself, PreemptMode=CANCEL/REQUEUE) reaches every
# rank from Slurm directly, so the trap does not forward it (a second SIGTERM
# would kill a rank mid-checkpoint) and the script does not requeue: a
# cancelled job stays cancelled, and Slurm's own preemption requeues by
# itself. Ranks get KillWait seconds (slurm.conf, default 30) between SIGTERM
# and SIGKILL.

COLOSSAL_SLURM_DIR=${COLOSSAL_SLURM_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}

# Until the step runs, a USR1 (a job whose --time is shorter than the
# warning time gets it at once) must not kill the shell, whose default action
# for it is to exit. Forwarding it later would kill ranks that have not yet
# installed their handlers, so it is only reported.
_colossal_early_usr1=0
trap '_colossal_early_usr1=1' USR1

colossal_log() { echo "colossal-job: $(date '+%F %T') $*"; }

colossal_die() {
    echo "colossal-job: error: $*" >&2
    exit 2
}

colossal_bin() {
    if [ -n "${COLOSSAL_BIN:-}" ]; then
        echo "$COLOSSAL_BIN/$1"
    else
        command -v "$1" || colossal_die "$1 is not on PATH (install colossal, or set COLOSSAL_BIN to its directory)"
    fi
}

colossal_job_start() {
    [ -n "${SLURM_JOB_ID:-}" ] || colossal_die "not inside a Slurm job (submit with sbatch, or run inside salloc)"
    COLOSSAL_ENV=${COLOSSAL_ENV:-$COLOSSAL_SLURM_DIR/env/infiniband.sh}
    [ -r "$COLOSSAL_ENV" ] || colossal_die "cannot read the fabric environment file $COLOSSAL_ENV (set COLOSSAL_ENV)"
    # shellcheck disable=SC1090
    . "$COLOSSAL_ENV"

    # Since Slurm 22.05 srun no longer inherits the job's --cpus-per-task;
    # without this every rank would get one CPU.
    if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
        export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
        # The CPU ops run one OpenMP team per rank (run.threads=0 follows this).
        export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
    fi

    # srun --mpi=pmix: Slurm starts every rank and its PMIx server wires up
    # MPI (Debian's OpenMPI is built with PMIx; --mpi=pmi2 and --mpi=none
    # fail in MPI_Init). Inside the same allocation mpirun works too: it
    # reads the node list and tasks per node from Slurm and starts its
    # daemons through srun. Ranks pick their GPU from the node-local rank
    # (MPI_COMM_TYPE_SHARED), which is why the templates ask for
    # --gpus-per-node and never --gpus-per-task (that would hide a node's
    # other GPUs from each rank and break CUDA IPC between them).
    case ${COLOSSAL_LAUNCHER:-srun} in
    # --kill-on-bad-exit: a rank that crashes ends the step at once instead
    # of leaving the others blocked in a collective until the time limit.
    srun) COLOSSAL_LAUNCH=(srun --mpi=pmix --kill-on-bad-exit=1) ;;
    mpirun)
        COLOSSAL_LAUNCH=(mpirun -np "${SLURM_NTASKS:?}")
        [ -z "${SLURM_NTASKS_PER_NODE:-}" ] || COLOSSAL_LAUNCH+=(--map-by "ppr:${SLURM_NTASKS_PER_NODE}:node")
        ;;
    *) colossal_die "COLOSSAL_LAUNCHER=$COLOSSAL_LAUNCHER: use srun or mpirun" ;;
    esac

    colossal_log "job ${SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+ (array task $SLURM_ARRAY_TASK_ID)}, restart" \
        "${SLURM_RESTART_COUNT:-0}: ${SLURM_JOB_NUM_NODES:-1} node(s) ${SLURM_JOB_NODELIST:-?}," \
        "${SLURM_NTASKS:-1} task(s), ${SLURM_CPUS_PER_TASK:-1} CPU(s) per task," \
        "GPUs per node ${SLURM_GPUS_PER_NODE:-none}${CUDA_VISIBLE_DEVICES:+ (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)};" \
        "launcher ${COLOSSAL_LAUNCH[*]}; env $COLOSSAL_ENV"
}

# Trap handlers: remember what arrived; only USR1 goes on to the step.
_colossal_on_usr1() {
    _colossal_trapped=1
    if [ -z "$_colossal_step" ]; then
        _colossal_early_usr1=1
        return
    fi
    _colossal_usr1=1
    colossal_log "SIGUSR1 (time limit near, or scancel --signal=USR1 --batch): asking the step to checkpoint and stop"
    kill -USR1 "$_colossal_step" 2>/dev/null
}

_colossal_on_term() {
    _colossal_trapped=1
    _colossal_term=1
    colossal_log "SIGTERM: Slurm is ending the job and signals the ranks itself; waiting for the step"
}

colossal_job_run() {
    _colossal_term=0
    _colossal_usr1=0
    _colossal_step=
    trap _colossal_on_usr1 USR1
    trap _colossal_on_term TERM
    if [ $_colossal_early_usr1 = 1 ]; then
        colossal_log "SIGUSR1 arrived before the step started (--time shorter than the --signal warning" \
            "time?): not forwarded; the run goes on until the time limit's SIGTERM"
    fi
    colossal_log "step: $*"
    "$@" &
    _colossal_step=$!
    # `wait` returns early (status > 128) when a trap runs; wait again until
    # the step itself has ended. 127 after a trap means the previous wait
    # already collected the step's status.
    local rc=127 r
    while :; do
        _colossal_trapped=0
        wait "$_colossal_step" 2>/dev/null
        r=$?
        if [ $r = 127 ] && ! kill -0 "$_colossal_step" 2>/dev/null; then break; fi
        rc=$r
        [ $_colossal_trapped = 1 ] || break
    done
    trap - USR1 TERM
    local ckpt=${COLOSSAL_CHECKPOINT_STATUS:-3}
    if [ "$rc" = "$ckpt" ]; then
        # The app checkpointed after a stop signal and asks to be run again:
        # requeue, unless Slurm is ending the job (this shell got SIGTERM).
        if [ $_colossal_term = 1 ]; then
            colossal_log "step exited with status $rc (checkpoint written); the job is ending, not requeueing"
            return "$rc"
        fi
        if [ "${SLURM_RESTART_COUNT:-0}" -ge "${COLOSSAL_MAX_RESTARTS:-100}" ]; then
            colossal_log "step exited with status $rc (checkpoint written); not requeueing after" \
                "${SLURM_RESTART_COUNT} restarts (COLOSSAL_MAX_RESTARTS=${COLOSSAL_MAX_RESTARTS:-100})"
            return "$rc"
        fi
        colossal_log "step exited with status $rc (checkpoint written): requeueing job $SLURM_JOB_ID"
        if scontrol requeue "$SLURM_JOB_ID"; then
            exit 0
        fi
        colossal_log "scontrol requeue failed (is the job requeueable? sbatch --requeue); resubmit to resume"
        return "$rc"
    fi
    if [ "$rc" = 0 ] && [ $_colossal_usr1 = 1 ]; then
        colossal_log "step exited with status 0 after SIGUSR1: stopped without a checkpoint" \
            "(checkpoint.every is 0?), so there is nothing to requeue from"
    elif [ "$rc" = 0 ]; then
        colossal_log "step finished"
    else
        colossal_log "step failed with status $rc"
    fi
    return "$rc"
}
