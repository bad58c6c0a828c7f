#!/bin/sh
# FP8 training acceptance, issue #26: the same model, data and seed trained
# twice on one GPU -- bf16 (the config's precision) and FP8 (fp8.enabled:
# hybrid formats, delayed scaling, the first and last blocks in bf16) --
# and the two loss curves side by side.
#
#   bench/gpu_fp8.sh OUTDIR [MODEL [STEPS]]     (from the repository root)
#
# MODEL: a config in bench/configs (default gpt2-124m); STEPS default 500,
# the cosine schedule decaying over them. The verdict: the FP8 run's mean
# train loss over the last 50 steps within FP8_TOL (default 0.02, i.e. 2%)
# of bf16's; the script exits 1 otherwise. Throughput of each run is in
# the summary too (median step time after 5 warm-up steps; for the side by
# side with torch.compile use bench/gpu_train.sh with
# VARIANTS="fp8:--fp8.enabled=true").
#
# Output: OUTDIR/summary.md (the verdict and every 25th step of both
# curves), OUTDIR/fp8_curve.csv (step, bf16 loss, FP8 loss, every step),
# OUTDIR/results.jsonl, colossal.log, metrics.jsonl. Environment: as
# bench/gpu_common.sh; RUN_TIMEOUT defaults to 200 s per run here.
set -u
[ $# -ge 1 ] || { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 2; }
top=$(cd "$(dirname "$0")/.." && pwd)
case $1 in /*) OUT=$1 ;; *) OUT=$PWD/$1 ;; esac
MODEL=${2:-gpt2-124m}
STEPS=${3:-500}
TOL=${FP8_TOL:-0.02}
RUN_TIMEOUT=${RUN_TIMEOUT:-200}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-440}
. "$top/bench/gpu_common.sh"
: >"$RESULTS"
cfg=$top/bench/configs/$MODEL.yaml
[ -f "$cfg" ] || { echo "no config $cfg"; exit 2; }

machine_header | tee "$OUT/summary.md"
gpu_build || exit 1
prepare_data || exit 1

COMMON="--log.interval=25 --optim.warmup_steps=20 --optim.decay_steps=$STEPS"
# shellcheck disable=SC2086
run_colossal "bf16-$MODEL" 1 "$cfg" "$STEPS" 5 bench=fp8 model_name="$MODEL" impl=colossal-bf16 -- $COMMON
# shellcheck disable=SC2086
run_colossal "fp8-$MODEL" 1 "$cfg" "$STEPS" 5 bench=fp8 model_name="$MODEL" impl=colossal-fp8 -- $COMMON \
    --fp8.enabled=true

$PY - "$WORK/runs/bf16-$MODEL/metrics.jsonl" "$WORK/runs/fp8-$MODEL/metrics.jsonl" "$OUT/fp8_curve.csv" "$TOL" \
    "$RESULTS" <<'PYEOF' | tee -a "$OUT/summary.md"
import json, sys
ref_path, fp8_path, csv_path, tol, results = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]

def losses(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("kind") == "train" and "loss" in r:
                    out[r["step"]] = r["loss"]
    except OSError as e:
        print(f"cannot read {path}: {e}")
    return out

ref, fp8 = losses(ref_path), losses(fp8_path)
steps = sorted(set(ref) & set(fp8))
speed = {}
with open(results) as f:
    for line in f:
        r = json.loads(line)
        speed[r.get("impl")] = r.get("tokens_per_s")
if not steps:
    print("FAIL: no common train steps (see colossal.log)")
    sys.exit(1)
with open(csv_path, "w") as f:
    f.write("step,bf16,fp8\n")
    for s in steps:
        f.write(f"{s},{ref[s]},{fp8[s]}\n")
tail = steps[-50:]
mr = sum(ref[s] for s in tail) / len(tail)
mf = sum(fp8[s] for s in tail) / len(tail)
gap = abs(mf - mr) / mr
print()
print("| step | bf16 loss | fp8 loss | fp8 / bf16 |")
print("|---:|---:|---:|---:|")
for s in steps:
    if s % 25 == 0 or s == steps[-1]:
        print(f"| {s} | {ref[s]:.4f} | {fp8[s]:.4f} | {fp8[s] / ref[s]:.4f} |")
sb, sf = speed.get("colossal-bf16"), speed.get("colossal-fp8")
if sb and sf:
    print(f"\nthroughput: bf16 {sb:.0f} tokens/s, fp8 {sf:.0f} tokens/s ({sf / sb:.2f}x)")
verdict = "PASS" if gap <= tol else "FAIL"
print(f"\n{verdict}: mean train loss over steps {tail[0]}-{tail[-1]}: bf16 {mr:.4f}, fp8 {mf:.4f} "
      f"({100 * gap:.2f}% apart; tolerance {100 * tol:.1f}%)")
sys.exit(0 if gap <= tol else 1)
PYEOF
