#!/bin/sh
# GPU MoE training throughput, issue #23: colossal-moe against transformers'
# MixtralForCausalLM (bench/torch_moe_train.py, torch.compile and eager) on
# the same model, batch and GPU, in one invocation.
#
#   bench/gpu_moe.sh OUTDIR [ITEM ...]        (from the repository root)
#
# ITEM: a config name in bench/configs (default: mixtral-0.6b, 8 experts
# top-2, 0.71B parameters, 0.25B active) or the path of a YAML file (a tiny
# one with precision f32 checks the script on a CPU: BENCH_DEVICE=cpu). Per
# ITEM, on one GPU: colossal-moe (BENCH_STEPS steps, default 30; the
# statistic is the median step time after the first BENCH_SKIP, default 5,
# read from its metrics.jsonl as gpu_train.sh reads colossal-pretrain's),
# then torch_moe_train.py: torch.compile and eager with f32 parameters under
# bf16 autocast (colossal's `precision: bf16`: bf16 compute, f32 masters),
# then torch.compile with bf16 parameters (transformers' experts code as it
# is, less optimizer work than colossal's), each BENCH_WARMUP (default 5)
# untimed steps then BENCH_STEPS - BENCH_WARMUP timed. The PyTorch runs are
# skipped, saying why, where transformers does not import.
#
# Output: a summary table (tokens/s, step time, MFU over the active
# parameters, peak GPU memory, colossal / each PyTorch run; target:
# colossal / torch.compile >= 1.2x) on stdout and in OUTDIR/summary.md;
# OUTDIR/results.jsonl (one JSON line per run), colossal.log, torch.log,
# metrics.jsonl (colossal's per-step records, router statistics included),
# build.log.
# Environment: see bench/gpu_common.sh (BENCH_DEVICE=cpu, BENCH_BUILD,
# BENCH_MAKE, BENCH_PREBUILT, BENCH_WORK, BENCH_BUDGET_S -- default 520
# here --, RUN_TIMEOUT, PYTHON). A BENCH_BUILD that already has
# apps/colossal-moe is used as it is (BENCH_MAKE=0 unless set); otherwise
# `make apps/colossal-moe` runs there after gpu_common.sh's build. Also
# TORCH_RUNS (MODE:PRECISION words, default "compile:amp eager:amp
# compile:bf16"; "none": colossal only), TORCH_ARGS (more
# torch_moe_train.py options, e.g. "--experts grouped_mm"), COLOSSAL_ARGS
# (more colossal-moe options), EST_COMPILE (seconds the budget reserves per
# torch.compile run, default 150), TORCH_RUN_TIMEOUT (default 300 s).
set -u
[ $# -ge 1 ] || { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 2; }
top=$(cd "$(dirname "$0")/.." && pwd)
case $1 in /*) OUT=$1 ;; *) OUT=$PWD/$1 ;; esac
shift
[ $# -gt 0 ] || set -- mixtral-0.6b
# colossal, two torch.compile runs and an eager one fit in 520 s; the runs
# still end by 560 s (gpu_common.sh's run_limit), under a 600 s command.
BENCH_BUDGET_S=${BENCH_BUDGET_S:-520}
. "$top/bench/gpu_common.sh"
STEPS=${BENCH_STEPS:-30}
SKIP=${BENCH_SKIP:-5}
WARM=${BENCH_WARMUP:-5}
TSTEPS=$((STEPS - WARM))
TORCH_RUNS=${TORCH_RUNS-compile:amp eager:amp compile:bf16}
[ "$TORCH_RUNS" = none ] && TORCH_RUNS=
TORCH_RUN_TIMEOUT=${TORCH_RUN_TIMEOUT:-300}
: >"$RESULTS"

{
    machine_header
    $PY -c 'import transformers; print("transformers", transformers.__version__)' 2>/dev/null
} | tee "$OUT/summary.md"

# moe_binary DIR: DIR's colossal-moe, the real binary rather than the
# libtool wrapper (as gpu_build takes colossal-pretrain).
moe_binary() {
    for f in "$1/apps/.libs/colossal-moe" "$1/apps/colossal-moe" "$1/colossal-moe"; do
        [ -x "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}
if [ -n "${BENCH_BUILD:-}" ] && [ -z "${BENCH_MAKE:-}" ] && moe_binary "$BENCH_BUILD" >/dev/null; then
    BENCH_MAKE=0
fi
gpu_build || exit 1
if [ -n "${BENCH_PREBUILT:-}" ] && MOE=$(moe_binary "$BENCH_PREBUILT"); then
    :
else
    mbuild=${BENCH_BUILD:-$top/build-gpu}
    if [ "${BENCH_MAKE:-1}" != 0 ]; then
        say "make apps/colossal-moe in $mbuild"
        (cd "$mbuild" && nice make -j"$NCPU" apps/colossal-moe) >>"$OUT/build.log" 2>&1 ||
            { grep -E "error|Error" "$OUT/build.log" | head -20; tail -10 "$OUT/build.log"; exit 1; }
    fi
    MOE=$(moe_binary "$mbuild") || { echo "gpu_moe.sh: $mbuild has no apps/colossal-moe" >&2; exit 1; }
fi
say "colossal-moe: $MOE"
prepare_data || exit 1

# Why the PyTorch runs cannot happen here (empty: they can).
TORCH_WHY=
if [ -n "$TORCH_RUNS" ] && ! TORCH_WHY=$($PY -c 'import torch, transformers' 2>&1); then
    TORCH_WHY="$PY cannot import torch and transformers: $(echo "$TORCH_WHY" | tail -n 1)"
    say "PyTorch runs skipped: $TORCH_WHY"
else
    TORCH_WHY=
fi

cfg_of() { case $1 in */* | *.yaml) echo "$1" ;; *) echo "$top/bench/configs/$1.yaml" ;; esac; }
name_of() { basename "$1" .yaml; }
batch_of() { sed -n 's/^ *micro_batch: *\([0-9]*\).*/\1/p' "$1" | head -n 1; }
precision_of() { sed -n 's/^precision: *\([a-z0-9]*\).*/\1/p' "$1" | head -n 1; }
est() {
    case $1 in
    compile) echo "${EST_COMPILE:-150}" ;;
    *) echo 60 ;;
    esac
}
status_of() {
    tail -n 1 "$RESULTS" | $PY -c 'import json, sys
r = json.load(sys.stdin)
print(r.get("status"), "%.0f tokens/s" % r["tokens_per_s"] if r.get("tokens_per_s") else "")' 2>/dev/null
}

# skip_why TAG WHY FIELD=VALUE...: a run that cannot happen on this machine.
skip_why() {
    sw_tag=$1 sw_why=$2
    shift 2
    $PY -c 'import json, sys
r = {"tag": sys.argv[1], "status": "skipped: " + sys.argv[2]}
for f in sys.argv[3:]:
    k, _, v = f.partition("=")
    r[k] = v
print(json.dumps(r))' "$sw_tag" "$sw_why" "$@" >>"$RESULTS"
    say "$sw_tag: skipped ($sw_why)"
}

# run_torch_moe TAG [FIELD=VALUE ...] -- [torch_moe_train.py args ...]: one
# GPU; the log goes to $OUT/torch.log, one result line to $RESULTS.
run_torch_moe() {
    tag=$1
    shift
    take_fields "$@"
    shift "$nf"
    [ "${1:-}" = -- ] && shift
    log=$WORK/logs/$tag.log
    smi_start
    t=$(date +%s)
    timeout -k 10 "$(run_limit "$TORCH_RUN_TIMEOUT")" $PY "$top/bench/torch_moe_train.py" --device "$DEVICE" "$@" \
        >"$log" 2>&1
    rc=$?
    t=$(($(date +%s) - t))
    smi_stop
    { echo "=== $tag: rc $rc, ${t}s: torch_moe_train.py $*"; cat "$log"; } >>"$OUT/torch.log"
    $PY "$top/bench/gpu_report.py" torch --log "$log" --smi "$SMI_FILE" --field tag="$tag" --field gpus=1 \
        --field rc="$rc" --field wall_s="$t" $fields >>"$RESULTS"
    say "$tag: $(status_of) (${t}s)"
}

one_model() {
    cfg=$1
    m=$(name_of "$cfg")
    b=$(batch_of "$cfg")
    if have_time "$(est colossal)"; then
        echo "=== c-$m: the binary is colossal-moe ($MOE)" >>"$OUT/colossal.log"
        # run_colossal starts $PRETRAIN: colossal-moe for this run.
        saved=$PRETRAIN
        PRETRAIN=$MOE
        # shellcheck disable=SC2086 # COLOSSAL_ARGS: words
        run_colossal "c-$m" 1 "$cfg" "$STEPS" "$SKIP" bench=moe model_name="$m" impl=colossal batch="$b" \
            precision="$(precision_of "$cfg")" -- \
            ${COLOSSAL_ARGS:-}
        PRETRAIN=$saved
    else
        skip_run "c-$m" bench=moe model_name="$m" impl=colossal batch="$b" gpus=1
    fi
    for run in $TORCH_RUNS; do
        mode=${run%%:*}
        prec=${run#*:}
        [ "$prec" = "$run" ] && prec=amp
        impl=torch-$mode$([ "$prec" = amp ] || echo "-$prec")
        tag=t-${impl#torch-}-$m
        if [ -n "$TORCH_WHY" ]; then
            skip_why "$tag" "$TORCH_WHY" bench=moe model_name="$m" impl="$impl" batch="$b" gpus=1
        elif have_time "$(est "$mode")"; then
            # shellcheck disable=SC2086 # TORCH_ARGS: words
            run_torch_moe "$tag" bench=moe model_name="$m" impl="$impl" batch="$b" -- --config "$cfg" \
                --mode "$mode" --precision "$prec" --steps "$TSTEPS" --warmup "$WARM" --tag "$m" ${TORCH_ARGS:-}
        else
            skip_run "$tag" bench=moe model_name="$m" impl="$impl" batch="$b" gpus=1
        fi
    done
}

for item in "$@"; do
    cfg=$(cfg_of "$item")
    [ -f "$cfg" ] || { say "no $cfg: skipped"; continue; }
    one_model "$cfg"
done

# The table: every run of every model, colossal / each, and the target.
$PY - "$RESULTS" <<'EOF' | tee -a "$OUT/summary.md"
import json
import sys

rows = []
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("bench") == "moe":
        rows.append(r)


def ok(r):
    return bool(r and r.get("tokens_per_s")) and not str(r.get("status", "")).startswith(("failed", "skipped"))


PRECISION = {(True, "bf16"): "bf16, f32 masters", (False, "amp"): "bf16 autocast, f32 params",
             (False, "bf16"): "bf16 params"}


def mem(r):
    parts = ["%.1f" % (r["smi_peak_mib"] / 1024) if r.get("smi_peak_mib") else "-"]
    if r.get("peak_alloc_mib") is not None:
        parts.append("alloc %.1f" % (r["peak_alloc_mib"] / 1024))
    return ", ".join(parts)


print("\n## MoE training on one GPU: tokens/s, median step, MFU over the active parameters (6 N_active + 12 L T d "
      "per token, peak 989 TFLOP/s), peak GPU memory in GiB (nvidia-smi incl. the CUDA context; torch: also "
      "max_memory_allocated)\n")
print("| model | batch | impl | precision | tokens/s | step ms | MFU (active) | peak mem GiB | colossal / this "
      "| status |")
print("|---|---|---|---|---|---|---|---|---|---|")
models = []
for r in rows:
    if r.get("model_name") not in models:
        models.append(r.get("model_name"))
goals = []
for m in models:
    mine = [r for r in rows if r.get("model_name") == m]
    col = next((r for r in mine if r.get("impl") == "colossal"), None)
    ref = next((r for r in mine if ok(r) and r.get("flops_per_token") and r.get("impl", "").startswith("torch")),
               None)
    for r in mine:
        mfu = "-"
        if ok(r) and ref:
            mfu = "%.1f%%" % (100 * r["tokens_per_s"] * ref["flops_per_token"] / 989e12)
        ratio = "%.2fx" % (col["tokens_per_s"] / r["tokens_per_s"]) if ok(col) and ok(r) and r is not col else "-"
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            m, r.get("batch", "-"), r.get("impl"),
            PRECISION.get((r is col, r.get("precision")), r.get("precision", "-")),
            "%.0f" % r["tokens_per_s"] if ok(r) else "-", "%.1f" % (1e3 * r["step_s_median"]) if ok(r) else "-",
            mfu, mem(r), ratio, str(r.get("status", "?"))[:160]))
    if ref and ok(col) and col.get("params") != ref.get("params_total"):
        goals.append("WARNING: %s: colossal has %s parameters, transformers %s: not the same model"
                     % (m, col.get("params"), ref.get("params_total")))
    if ref:
        goals.append("%s: %.1fM parameters, %.1fM active per token (%d experts, top-%d); experts in PyTorch: %s"
                     % (m, ref["params_total"] / 1e6, ref["params_active"] / 1e6, ref["experts"], ref["top_k"],
                        ref.get("experts_impl")))
    if ok(col):
        s = "%s: colossal %.0f tokens/s" % (m, col["tokens_per_s"])
        for impl in ("torch-compile", "torch-eager", "torch-compile-bf16"):
            t = next((r for r in mine if r.get("impl") == impl and ok(r)), None)
            if t is None:
                continue
            x = col["tokens_per_s"] / t["tokens_per_s"]
            s += "; / %s %.2fx" % (impl, x)
            if impl == "torch-compile":
                s += " (target >= 1.2x: %s)" % ("met" if x >= 1.2 else "NOT met")
        goals.append(s)
if goals:
    print()
    for g in goals:
        print("- " + g)
EOF
echo
say "done; logs in $OUT"
