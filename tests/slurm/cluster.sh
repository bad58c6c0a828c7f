# A real Slurm cluster on this host, in a private directory (sourced by bash,
# not run).
#
#   . tests/slurm/cluster.sh
#   slurm_cluster_skip_reason && exit 77     # prints why when it cannot run here
#   slurm_cluster_up DIR [NODES]             # NODES slurmd daemons (default 1),
#                                            # each with SLURM_CLUSTER_GPUS
#                                            # stand-in GPUs (default 8)
#   sbatch ...                               # SLURM_CONF is exported
#   slurm_cluster_down                       # also installed as an EXIT trap;
#                                            # it first evals SLURM_CLUSTER_ON_DOWN
#
# For experiments: SLURM_CLUSTER_EXTRA_CONF (lines appended to slurm.conf),
# SLURM_CLUSTER_CRED_EXPIRE= (empty: Slurm's default credential lifetime).
#
# Everything lives under DIR: a fresh munge key and a munged on its own
# socket, slurm.conf, state, spool, logs and pid files; the daemons listen on
# free ports found at start-up. Nothing under /etc or /run is read or written,
# so it runs beside a system Slurm or munge, and several test clusters can run
# at once. Needs root (slurmd starts jobs as their owner).
#
# Several NODES are several slurmd daemons (-N NAME) on this one host, each
# with its own port and spool directory: the node names, allocation and srun
# launch are those of a multi-node job, though every rank shares one kernel.
#
# Settings chosen for a test rather than a site:
#   ProctrackType=proctrack/linuxproc, TaskPlugin=task/none  no cgroups needed
#   SelectType=select/cons_tres, CR_Core                      cores are the unit
#   OverSubscribe=FORCE:4                                     jobs share cores
#   AuthInfo cred_expire=10     a requeued job waits this long before it may
#                               start again (default 120 s)
#   SchedulerParameters sched_interval=2  the main scheduler pass that starts
#                               a requeued job once its begin time has come
#                               (default every 60 s)
#   FirstJobId=PORT*1000        job ids unique among the clusters running on
#                               this host at once (each has its own free port):
#                               OpenMPI names its shared-memory segments and
#                               session directories after the job id, so two
#                               clusters' "job 5" would map each other's
#                               segments (seen: a segfault in btl/vader)
#   TmpFS=DIR/tmp/%n            PMIx's per-step client directories: per node
#                               (several slurmd share /tmp here) and per cluster
#   Gres=gpu:N, gres.conf File=DIR/gpu[0-N-1]  stand-in GPUs (plain files),
#                               so the GPU templates run unchanged
#                               (--gpus-per-node). GPUs are never shared
#                               between jobs (OverSubscribe covers cores
#                               only), so there are enough of them for
#                               several GPU jobs per node at once.
#   KillWait=60                 SIGTERM to SIGKILL at a time limit or scancel:
#                               time for a checkpoint on a loaded machine
#                               (under ASan a 1.5 MB one took 8-15 s on the
#                               2-core CI machine, so 15 s is too short)
#   MinJobAge=5                 sbatch --wait polls every 2 s only while
#                               2 < MinJobAge/2 is false; otherwise it backs
#                               off to 8 s and 32 s. Finished jobs stay
#                               visible to scontrol at least this long.

SLURM_SBIN_PATH=/usr/sbin:/usr/local/sbin

# Prints why this host cannot run the cluster and returns 0; returns 1 when
# it can.
slurm_cluster_skip_reason() {
    if [ "$(id -u)" != 0 ]; then
        echo "SKIP: the Slurm tests start slurmd, which must run as root"
        return 0
    fi
    for p in slurmctld slurmd munged; do
        if ! PATH="$PATH:$SLURM_SBIN_PATH" command -v $p >/dev/null 2>&1; then
            echo "SKIP: $p is not installed (Debian: apt-get install slurm-wlm munge)"
            return 0
        fi
    done
    for p in sbatch srun scontrol sinfo squeue scancel munge; do
        if ! command -v $p >/dev/null 2>&1; then
            echo "SKIP: $p is not installed (Debian: apt-get install slurm-wlm munge)"
            return 0
        fi
    done
    return 1
}

# A TCP port nothing listens on now (from /proc/net/tcp*: the local port in
# hex, state 0A = LISTEN), at or above $1.
_slurm_free_port() {
    local port=$1 hex
    while :; do
        hex=$(printf '%04X' "$port")
        if ! cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '{print $2, $4}' | grep -q ":$hex 0A$"; then
            echo "$port"
            return
        fi
        port=$((port + 1))
    done
}

# slurm_wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.2 s.
slurm_wait_for() {
    local limit=$(($1 * 5)) what=$2 i=0
    shift 2
    until "$@" >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt $limit ]; then
            echo "slurm cluster: $what did not happen within $((limit / 5)) s" >&2
            return 1
        fi
        sleep 0.2
    done
}

_slurm_all_idle() {
    # Every node answers and is idle (or partly allocated by a leftover).
    [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -cvE '^(idle|mix|alloc)$')" = 0 ] &&
        [ "$(sinfo -h -N -o '%t' 2>/dev/null | wc -l)" -ge "$SLURM_CLUSTER_NODES" ]
}

# slurm_cluster_up DIR [NODES]: start munged, slurmctld and NODES slurmd;
# export SLURM_CONF and wait until sinfo shows every node idle.
slurm_cluster_up() {
    SLURM_CLUSTER_DIR=$1
    SLURM_CLUSTER_NODES=${2:-1}
    SLURM_CLUSTER_GPUS=${SLURM_CLUSTER_GPUS:-8}
    local D=$SLURM_CLUSTER_DIR host node_line hw mem ctl_port node_port nodes n g
    trap slurm_cluster_down EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    mkdir -p "$D/munge" "$D/state" "$D/log"
    # munged checks that every directory above its socket is not writable by
    # others (sticky /tmp is fine) and that the key is private.
    chmod 711 "$D" "$D/munge"
    dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 2>/dev/null
    chmod 400 "$D/munge/munge.key"
    MUNGE_SOCKET=$D/munge/munge.socket
    PATH="$PATH:$SLURM_SBIN_PATH" munged --force --socket="$MUNGE_SOCKET" --key-file="$D/munge/munge.key" \
        --log-file="$D/log/munged.log" --pid-file="$D/munge/munged.pid" --seed-file="$D/munge/munged.seed" ||
        { echo "slurm cluster: munged did not start:" >&2; cat "$D/log/munged.log" >&2; return 1; }
    slurm_wait_for 10 "munged's socket" test -S "$MUNGE_SOCKET" || return 1

    host=$(hostname -s)
    node_line=$(PATH="$PATH:$SLURM_SBIN_PATH" slurmd -C | head -n 1)
    # "NodeName=host CPUs=.. Boards=.. ... RealMemory=.." -> the hardware part.
    hw=${node_line#NodeName=* }
    # Slurm drains a node that reports less memory than configured; leave
    # some slack for what the kernel keeps.
    mem=${hw##*RealMemory=}
    hw="${hw%RealMemory=*}RealMemory=$((mem * 9 / 10)) Gres=gpu:$SLURM_CLUSTER_GPUS"
    ctl_port=$(_slurm_free_port $((20000 + $$ % 20000)))
    node_port=$(_slurm_free_port $((ctl_port + 1)))
    if [ "$SLURM_CLUSTER_NODES" = 1 ]; then
        SLURM_CLUSTER_NODE_NAMES=$host
        nodes="NodeName=$host NodeAddr=127.0.0.1 Port=$node_port $hw"
    else
        SLURM_CLUSTER_NODE_NAMES=
        nodes=
        n=1
        while [ $n -le "$SLURM_CLUSTER_NODES" ]; do
            SLURM_CLUSTER_NODE_NAMES="$SLURM_CLUSTER_NODE_NAMES node$n"
            nodes="${nodes}NodeName=node$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$node_port $hw
"
            node_port=$(_slurm_free_port $((node_port + 1)))
            n=$((n + 1))
        done
    fi
    cat >"$D/slurm.conf" <<EOF
# Generated by tests/slurm/cluster.sh for a throw-away cluster on $host.
ClusterName=colossaltest
FirstJobId=$((ctl_port * 1000))
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET${SLURM_CLUSTER_CRED_EXPIRE-,cred_expire=10}
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
TmpFS=$D/tmp/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=${SLURMD_DEBUG:-info}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=60
MinJobAge=5
InactiveLimit=0
SlurmdTimeout=60
GresTypes=gpu
$nodes
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
${SLURM_CLUSTER_EXTRA_CONF:-}
EOF
    # Stand-in GPUs: plain files where device files would be (gres/gpu drops
    # a GPU without a File). Jobs ask for --gpus-per-node as on a GPU
    # cluster and Slurm allocates them; with task/none nothing is bound.
    g=0
    while [ $g -lt "$SLURM_CLUSTER_GPUS" ]; do
        : >"$D/gpu$g"
        g=$((g + 1))
    done
    echo "Name=gpu File=$D/gpu[0-$((SLURM_CLUSTER_GPUS - 1))]" >"$D/gres.conf"
    SLURM_CONF=$D/slurm.conf
    export SLURM_CONF
    PATH="$PATH:$SLURM_SBIN_PATH" slurmctld -f "$SLURM_CONF" -i ||
        { echo "slurm cluster: slurmctld did not start:" >&2; tail -n 20 "$D/log/slurmctld.log" >&2; return 1; }
    if [ "$SLURM_CLUSTER_NODES" = 1 ]; then
        mkdir -p "$D/spool/$host" "$D/tmp/$host"
        PATH="$PATH:$SLURM_SBIN_PATH" slurmd -f "$SLURM_CONF" ||
            { echo "slurm cluster: slurmd did not start:" >&2; tail -n 20 "$D/log/slurmd-$host.log" >&2; return 1; }
    else
        for n in $SLURM_CLUSTER_NODE_NAMES; do
            mkdir -p "$D/spool/$n" "$D/tmp/$n"
            PATH="$PATH:$SLURM_SBIN_PATH" slurmd -f "$SLURM_CONF" -N "$n" ||
                { echo "slurm cluster: slurmd $n did not start:" >&2; tail -n 20 "$D/log/slurmd-$n.log" >&2; return 1; }
        done
    fi
    if ! slurm_wait_for 30 "every node idle in sinfo" _slurm_all_idle; then
        sinfo -N >&2
        tail -n 20 "$D/log/slurmctld.log" >&2
        return 1
    fi
}

# Wait (10 s at most) for the given processes to exit; SIGKILL what is left.
_slurm_reap() {
    local i=0 pid alive
    while [ $i -lt 50 ]; do
        alive=
        for pid in "$@"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ -n "$alive" ] || return 0
        sleep 0.2
        i=$((i + 1))
    done
    for pid in "$@"; do
        kill -KILL "$pid" 2>/dev/null
    done
    return 0
}

# Stop everything slurm_cluster_up started, by the pids the daemons wrote:
# jobs first (so no slurmstepd outlives its slurmd), then the daemons, then
# munged; then remove the directory unless SLURM_KEEP is set.
slurm_cluster_down() {
    local rc=$? D=${SLURM_CLUSTER_DIR:-} f pid
    trap - EXIT
    [ -n "$D" ] || return $rc
    # The caller's own clean-up (e.g. clients that would retry forever
    # against a controller that is about to go).
    eval "${SLURM_CLUSTER_ON_DOWN:-:}"
    if [ -f "$D/slurmctld.pid" ]; then
        scancel --full --quiet --user="$(id -un)" 2>/dev/null
        # Jobs are gone from squeue once their processes have been reaped.
        # shellcheck disable=SC2016 # expanded by sh at every poll
        slurm_wait_for 20 "every job ended" sh -c '[ -z "$(squeue -h 2>/dev/null)" ]' || true
    fi
    # All at once, then wait for all: each takes a few seconds to stop.
    local pids=()
    for f in "$D"/slurmd-*.pid "$D/slurmctld.pid"; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        kill "$pid" 2>/dev/null && pids+=("$pid")
    done
    _slurm_reap "${pids[@]}"
    # munged last: the daemons authenticate their last messages through it.
    if [ -f "$D/munge/munged.pid" ]; then
        pid=$(cat "$D/munge/munged.pid")
        kill "$pid" 2>/dev/null && _slurm_reap "$pid"
    fi
    if [ -n "${SLURM_KEEP:-}" ]; then
        echo "slurm cluster: kept $D" >&2
    else
        rm -rf "$D"
    fi
    SLURM_CLUSTER_DIR=
    return $rc
}
