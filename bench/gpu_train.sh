#!/bin/sh
# GPU training throughput, issue #10: colossal-pretrain against an
# independent PyTorch reference (bench/torch_gpu_train.py, eager and
# torch.compile) on the same model, batch and GPU, in one invocation.
#
#   bench/gpu_train.sh OUTDIR [ITEM ...]        (from the repository root)
#
# ITEM: a config name in bench/configs (gpt2-124m, gpt2-350m, llama-124m,
# llama-1b; tiny and llama-tiny check the script on a CPU) -- one GPU,
# colossal then torch eager then torch.compile; or dp[:MODEL] (default
# MODEL gpt2-124m) -- 2 GPUs, data parallel at the same per-GPU batch:
# colossal ZeRO 0 and ZeRO 1 (mpirun -np 2) and torch DDP
# (python3 -m torch.distributed.run --nproc_per_node 2), each with its
# speedup over the same implementation on one GPU (measured here when the
# ITEM list did not already include MODEL).
# Default ITEMs: gpt2-124m gpt2-350m llama-124m dp.
#
# Every colossal run: bf16 working weights and compute with f32 masters
# (precision: bf16), run.peak_tflops 989, no validation or samples, the
# embedded corpus prepared once (bench/gpu_common.sh); BENCH_STEPS steps
# (default 30), of which the first BENCH_SKIP (default 5) are warm-up; the
# statistic is the median step time of the rest. PyTorch: BENCH_WARMUP
# (default 5) untimed steps (compilation included), then BENCH_STEPS - that
# timed ones.
#
# Output: a summary table on stdout and in OUTDIR/summary.md;
# OUTDIR/results.jsonl (one JSON line per run), colossal.log, torch.log,
# metrics.jsonl (every colossal run's per-step records), build.log.
# Environment: see bench/gpu_common.sh (BENCH_DEVICE=cpu, BENCH_BUILD,
# BENCH_MAKE, BENCH_WORK, BENCH_BUDGET_S, RUN_TIMEOUT, PYTHON), plus
# VARIANTS (extra one-GPU colossal runs of each model item, see
# variants(): e.g. VARIANTS="tune:CAI_CUBLASLT_AUTOTUNE=1"), DP_VARIANTS
# (the same for the 2-GPU ZeRO-0 runs of dp items), DP_CONCURRENT
# (1: also the one-GPU run beside another one-GPU run),
# EST_COMPILE (seconds the budget reserves per torch.compile run, default
# 150), TORCH_DDP_MODE (eager (default), compile, or none: no PyTorch runs
# in dp items), TORCH_MODES (default
# "eager compile"), TORCH_RUN_TIMEOUT (default 300 s per PyTorch run).
set -u
[ $# -ge 1 ] || { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 2; }
top=$(cd "$(dirname "$0")/.." && pwd)
case $1 in /*) OUT=$1 ;; *) OUT=$PWD/$1 ;; esac
shift
[ $# -gt 0 ] || set -- gpt2-124m gpt2-350m llama-124m dp
. "$top/bench/gpu_common.sh"
STEPS=${BENCH_STEPS:-30}
SKIP=${BENCH_SKIP:-5}
WARM=${BENCH_WARMUP:-5}
TSTEPS=$((STEPS - WARM))
TORCH_MODES=${TORCH_MODES-eager compile}  # set empty or "none": colossal only
[ "$TORCH_MODES" = none ] && TORCH_MODES=
# A cold torch.compile of GPT-2 350M takes minutes of CPU time.
TORCH_RUN_TIMEOUT=${TORCH_RUN_TIMEOUT:-300}
: >"$RESULTS"

machine_header | tee "$OUT/summary.md"
gpu_build || exit 1
prepare_data || exit 1

cfg_of() { echo "$top/bench/configs/$1.yaml"; }
batch_of() { sed -n 's/^ *micro_batch: *\([0-9]*\).*/\1/p' "$(cfg_of "$1")" | head -n 1; }
has_result() { grep -q "\"tag\": \"$1\".*\"status\": \"ok\"" "$RESULTS" 2>/dev/null; }

# Rough seconds per run for the budget (cold torch.compile is the long one).
est() {
    case $1 in
    compile) echo "${EST_COMPILE:-150}" ;;
    *350m* | *1b*) echo 75 ;;
    *) echo 50 ;;
    esac
}

# variants GPUS MODEL "NAME:SETTING[,SETTING...] ...": extra colossal runs
# of MODEL on GPUS GPUs, where a SETTING is a colossal-pretrain option
# (--key=value) or an environment variable (NAME=value) for that run only;
# ZeRO 0 unless a SETTING is --zero.stage=N (the results record which).
variants() {
    vg=$1 vm=$2
    vcfg=$(cfg_of "$vm")
    vb=$(batch_of "$vm")
    vtag=$([ "$vg" = 1 ] && echo c || echo "c-dp$vg")
    for var in $3; do
        vname=${var%%:*}
        if ! have_time "$(est "$vm")"; then
            skip_run "$vtag-$vname-$vm" bench=train model_name="$vm" impl="colossal-$vname" batch="$vb" \
                gpus="$vg" zero=0
            continue
        fi
        (
            vargs="" vzero=0
            for set in $(echo "${var#*:}" | tr ',' ' '); do
                # shellcheck disable=SC2163 # "$set" is NAME=value
                case $set in
                --zero.stage=*) vzero=${set#--zero.stage=} ;;
                --*) vargs="$vargs $set" ;;
                *=*) export "$set" ;;
                esac
            done
            # shellcheck disable=SC2086
            run_colossal "$vtag-$vname-$vm" "$vg" "$vcfg" "$STEPS" "$SKIP" bench=train model_name="$vm" \
                impl="colossal-$vname" batch="$vb" zero="$vzero" -- --zero.stage="$vzero" $vargs
        )
    done
}

one_gpu() {
    m=$1
    cfg=$(cfg_of "$m")
    b=$(batch_of "$m")
    if has_result "c-$m"; then :
    elif have_time "$(est "$m")"; then
        run_colossal "c-$m" 1 "$cfg" "$STEPS" "$SKIP" bench=train model_name="$m" impl=colossal batch="$b" zero=0 --
    else
        skip_run "c-$m" bench=train model_name="$m" impl=colossal batch="$b" gpus=1
    fi
    [ "${IN_DP:-0}" = 1 ] || variants 1 "$m" "${VARIANTS:-}"
    for mode in $TORCH_MODES; do
        has_result "t-$mode-$m" && continue
        if have_time "$(est "$mode")"; then
            run_torch "t-$mode-$m" 1 bench=train model_name="$m" batch="$b" -- --config "$cfg" --mode "$mode" \
                --steps "$TSTEPS" --warmup "$WARM" --tag "$m"
        else
            skip_run "t-$mode-$m" bench=train model_name="$m" impl="torch-$mode" batch="$b" gpus=1
        fi
    done
}

data_parallel() {
    m=$1
    cfg=$(cfg_of "$m")
    b=$(batch_of "$m")
    ngpu=$(gpu_count)
    if [ "$DEVICE" = cuda ] && [ "$ngpu" -lt 2 ]; then
        say "dp:$m needs 2 GPUs, this machine has $ngpu"
        return
    fi
    # The one-GPU baselines, unless this invocation measured them already.
    saved_modes=$TORCH_MODES
    TORCH_MODES=${TORCH_DDP_MODE:-eager}
    [ "$TORCH_MODES" = none ] && TORCH_MODES=
    IN_DP=1
    one_gpu "$m"
    IN_DP=0
    TORCH_MODES=$saved_modes
    for z in 0 1; do
        if have_time "$(est "$m")"; then
            run_colossal "c-dp2-z$z-$m" 2 "$cfg" "$STEPS" "$SKIP" bench=train model_name="$m" impl=colossal \
                batch="$b" zero="$z" -- --zero.stage="$z"
        else
            skip_run "c-dp2-z$z-$m" bench=train model_name="$m" impl=colossal batch="$b" gpus=2 zero="$z"
        fi
    done
    # DP_CONCURRENT=1: the one-GPU run again while a second one-GPU run
    # trains on GPU 1 (no communication): what two busy GPUs of the machine
    # lose without any collective (power, clocks, host), to tell that part
    # of the data-parallel loss from the reductions' part.
    if [ "${DP_CONCURRENT:-0}" = 1 ] && have_time "$(est "$m")"; then
        (
            CUDA_VISIBLE_DEVICES=1 timeout -k 10 "$(run_limit "$RUN_TIMEOUT")" mpirun $(mpi_args 1) "$PRETRAIN" \
                --config "$cfg" --run.dir="$WORK/runs/c-1gpu-other-$m" --run.device="$DEVICE" \
                --train.steps="$((STEPS + 10))" $DATA_ARGS >"$WORK/logs/c-1gpu-other-$m.log" 2>&1
        ) &
        other=$!
        run_colossal "c-1gpu-busy2-$m" 1 "$cfg" "$STEPS" "$SKIP" bench=train model_name="$m" \
            impl=colossal-1gpu-beside-another batch="$b" zero=0 --
        wait "$other"
    fi
    variants 2 "$m" "${DP_VARIANTS:-}"
    mode=${TORCH_DDP_MODE:-eager}
    [ "$mode" = none ] && return
    if have_time "$(est "$mode")"; then
        run_torch "t-ddp2-$mode-$m" 2 bench=train model_name="$m" batch="$b" base_impl="torch-$mode" -- \
            --config "$cfg" --mode "$mode" --steps "$TSTEPS" --warmup "$WARM" --tag "$m"
    else
        skip_run "t-ddp2-$mode-$m" bench=train model_name="$m" impl="torch-$mode-ddp2" batch="$b" gpus=2
    fi
}

for item in "$@"; do
    case $item in
    dp) data_parallel gpt2-124m ;;
    dp:*) data_parallel "${item#dp:}" ;;
    *)
        [ -f "$(cfg_of "$item")" ] || { say "no bench/configs/$item.yaml: skipped"; continue; }
        one_gpu "$item"
        ;;
    esac
done

$PY "$top/bench/gpu_report.py" train "$RESULTS" | tee -a "$OUT/summary.md"
echo
say "done; logs in $OUT"
