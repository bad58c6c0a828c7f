#!/bin/sh
# Scaling run, issue #9: data parallel with ZeRO stages on 1, 2, 4 (and 8)
# GPUs at a fixed per-GPU batch, and the collectives against PyTorch/NCCL.
#
#   bench/gpu_scaling.sh OUTDIR                 (from the repository root)
#
# 1. Collectives on all GPUs: `mpirun -np N colossal-check --bench --device
#    cuda --axes dp` (all-reduce, all-gather, reduce-scatter, 1 KiB..256 MiB
#    x4) and the same sizes through PyTorch's NCCL
#    (bench/torch_nccl_bench.py), bus bandwidth side by side.
# 2. colossal-pretrain, one rank per GPU (`mpirun --allow-run-as-root -np N`,
#    as a user inside an allocation), bf16 with f32 masters: for each ZeRO
#    setting in SCALE_STAGES (default "1 0 2 3 3o"; 3o = stage 3 + CPU
#    offload), each model in SCALE_MODELS (default "gpt2-350m llama-1b",
#    bench/configs: batch 16 and 8 sequences of 1024 per GPU) and each GPU
#    count in SCALE_GPUS (default: 1 2 4 8 up to `nvidia-smi -L`'s count):
#    tokens/s, MFU, peak memory per GPU (nvidia-smi) and the memory plan,
#    scaling efficiency against one GPU. SCALE_STEPS steps (default 10), the
#    first SCALE_SKIP (default 3) warm-up; median step time of the rest.
#
# The runs go in that order (ZeRO-1 first: the issue's goal) and stop being
# started when the time budget would
# be exceeded (BENCH_BUDGET_S, default 440 s: under run-all.sh's 500 s per
# part); skipped runs are listed as such. Each run has a `timeout`
# (RUN_TIMEOUT, default 90 s) and a failure does not stop the script.
# Output: the tables on stdout and OUTDIR/summary.md; OUTDIR/results.jsonl,
# colossal.log, collectives.log, metrics.jsonl, build.log.
# Environment: as bench/gpu_common.sh; BENCH_DEVICE=cpu with SCALE_GPUS="1 2"
# and SCALE_MODELS=tiny checks the script on a CPU build.
set -u
[ $# -ge 1 ] || { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 2; }
top=$(cd "$(dirname "$0")/.." && pwd)
case $1 in /*) OUT=$1 ;; *) OUT=$PWD/$1 ;; esac
BENCH_BUDGET_S=${BENCH_BUDGET_S:-440}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
. "$top/bench/gpu_common.sh"
: >"$RESULTS"
STEPS=${SCALE_STEPS:-10}
SKIP=${SCALE_SKIP:-3}
MODELS=${SCALE_MODELS:-gpt2-350m llama-1b}
STAGES=${SCALE_STAGES:-1 0 2 3 3o}
ngpu=$(gpu_count)
if [ -z "${SCALE_GPUS:-}" ]; then
    SCALE_GPUS=
    for n in 1 2 4 8; do [ "$n" -le "$ngpu" ] && SCALE_GPUS="$SCALE_GPUS $n"; done
fi
[ -n "$SCALE_GPUS" ] || { echo "gpu_scaling.sh: no GPU visible (nvidia-smi -L); set SCALE_GPUS for a CPU check" >&2; exit 1; }
maxg=0
for n in $SCALE_GPUS; do [ "$n" -gt "$maxg" ] && maxg=$n; done

machine_header | tee "$OUT/summary.md"
echo "GPUs: $ngpu visible; runs on:$SCALE_GPUS; models: $MODELS; ZeRO: $STAGES; $STEPS steps ($SKIP warm-up)" |
    tee -a "$OUT/summary.md"
gpu_build || exit 1
prepare_data || exit 1

# ---- 1. collectives on all GPUs
coll=$OUT/collectives.log
: >"$coll"
if [ "$maxg" -ge 2 ]; then
    sweep="--max_bytes ${SCALE_MAX_BYTES:-256M} --factor 4"
    say "colossal-check --bench on $maxg ranks"
    {
        echo "=== mpirun -np $maxg colossal-check --bench --device $DEVICE --axes dp --ops allreduce,allgather,reducescatter $sweep"
        timeout -k 10 120 mpirun $(mpi_args "$maxg") "$CHECK" --bench --device "$DEVICE" --axes dp \
            --ops allreduce,allgather,reducescatter $sweep 2>&1
        echo "=== exit $?"
    } >"$WORK/logs/check.log"
    cat "$WORK/logs/check.log" >>"$coll"
    say "torch NCCL bench on $maxg ranks"
    {
        echo "=== python3 -m torch.distributed.run --nproc_per_node $maxg bench/torch_nccl_bench.py $sweep"
        tdev=$DEVICE
        timeout -k 10 120 $PY -m torch.distributed.run --standalone --nproc_per_node "$maxg" \
            "$top/bench/torch_nccl_bench.py" --device "$tdev" --max-bytes "${SCALE_MAX_BYTES:-256M}" --factor 4 2>&1
        echo "=== exit $?"
    } >"$WORK/logs/torch_nccl.log"
    cat "$WORK/logs/torch_nccl.log" >>"$coll"
fi

# ---- 2. ZeRO x GPUs
est() {
    case $1 in
    *1b*) echo 45 ;;
    *350m*) echo 30 ;;
    *) echo 20 ;;
    esac
}
for z in $STAGES; do
    for m in $MODELS; do
        cfg=$top/bench/configs/$m.yaml
        [ -f "$cfg" ] || { say "no bench/configs/$m.yaml: skipped"; continue; }
        b=$(sed -n 's/^ *micro_batch: *\([0-9]*\).*/\1/p' "$cfg" | head -n 1)
        case $z in
        3o) zargs="--zero.stage=3 --zero.offload=true" ;;
        *) zargs="--zero.stage=$z" ;;
        esac
        for n in $SCALE_GPUS; do
            tag=s-$m-z$z-g$n
            e=$(est "$m")
            [ "$z" = 3o ] && e=$((e * 2))
            if have_time "$e"; then
                run_colossal "$tag" "$n" "$cfg" "$STEPS" "$SKIP" bench=scaling model_name="$m" zero="$z" \
                    batch="$b" -- $zargs
            else
                skip_run "$tag" bench=scaling model_name="$m" zero="$z" gpus="$n" batch="$b"
            fi
        done
    done
done

{
    $PY "$top/bench/gpu_report.py" scaling "$RESULTS"
    [ -s "$coll" ] && $PY "$top/bench/gpu_report.py" nccl "$WORK/logs/check.log" "$WORK/logs/torch_nccl.log"
} | tee -a "$OUT/summary.md"
echo
say "done; logs in $OUT"
