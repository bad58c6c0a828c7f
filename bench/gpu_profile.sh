#!/bin/sh
# Where a training step's GPU time goes, issue #10: one colossal-pretrain
# run under Nsight Compute (ncu, hardware clocks left alone), two reports.
#
#   bench/gpu_profile.sh OUTDIR [CONFIG]      (from the repository root)
#
# CONFIG: a name in bench/configs (default gpt2-124m).
# 1. kernels.txt: every kernel of PROF_STEPS (default 2; 1000 launches each) steady-state steps
#    (after PROF_SKIP_LAUNCHES launches, default 3000, i.e. past the
#    warm-up steps), timed one by one (gpu__time_duration), summed per
#    kernel name and divided by the number of steps: the per-step budget
#    by kernel, largest first (bench/gpu_profile.py).
# 2. detail.txt: the Speed-of-Light, compute, memory, occupancy, launch
#    warp-state (stall reasons) and instruction sections for the kernels
#    whose names match PROF_DETAIL (default the flash-attention forward and
#    backward kernels), PROF_DETAIL_COUNT launches (default 3) after
#    PROF_DETAIL_SKIP matching ones (default 11: the last layer's forward,
#    then the first dK/dV and dQ kernels of the backward).
# Environment: as bench/gpu_train.sh (bench/gpu_common.sh); NCU (default
# ncu on PATH, else the newest /opt/nvidia/nsight-compute/*/ncu).
set -u
[ $# -ge 1 ] || { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 2; }
top=$(cd "$(dirname "$0")/.." && pwd)
case $1 in /*) OUT=$1 ;; *) OUT=$PWD/$1 ;; esac
model=${2:-gpt2-124m}
. "$top/bench/gpu_common.sh"
NCU=${NCU:-$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)}
[ -n "$NCU" ] || { echo "gpu_profile: no ncu"; exit 1; }
SKIPL=${PROF_SKIP_LAUNCHES:-3000}
STEPS=${PROF_STEPS:-2}
DETAIL=${PROF_DETAIL:-regex:k_fl_(fwd|bwd)}
gpu_build || exit 1
prepare_data || exit 1
cfg=$top/bench/configs/$model.yaml
run() { # run LOGNAME NCU-ARGS...: one colossal-pretrain run of 20 steps under ncu
    name=$1
    shift
    rm -rf "$WORK/runs/prof"
    timeout -k 10 "$(run_limit 300)" mpirun $(mpi_args 1) "$NCU" --clock-control none "$@" \
        "$PRETRAIN" --config "$cfg" --run.dir="$WORK/runs/prof" --run.device="$DEVICE" --train.steps=20 \
        $DATA_ARGS >"$OUT/$name.log" 2>&1
    say "$name: rc $? ($(tail -n 1 "$OUT/$name.log" | cut -c1-120))"
}
# A launch budget that covers STEPS steps whatever the model (counted from
# the report: the script divides by the number of optimizer steps seen).
run kernels --metrics gpu__time_duration.sum --launch-skip "$SKIPL" --launch-count $((STEPS * 1000)) \
    --csv --print-units base --log-file "$OUT/kernels.csv"
$PY "$top/bench/gpu_profile.py" "$OUT/kernels.csv" | tee "$OUT/kernels.txt"
run detail -k "$DETAIL" --launch-skip "${PROF_DETAIL_SKIP:-11}" --launch-count "${PROF_DETAIL_COUNT:-3}" --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --print-details all --log-file "$OUT/detail.txt"
grep -E "k_fl_|Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Pipe|Stall|Issued|Shared" \
    "$OUT/detail.txt" | head -120
