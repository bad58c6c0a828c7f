#!/bin/sh
# FP8 training acceptance, issue #26: the same model, data and seed trained
# on one GPU in bf16 (the config's precision) and in one or more FP8 recipes
# (by default one: fp8.enabled with its defaults -- hybrid formats, delayed
# scaling, the first and last blocks in bf16), the loss curves side by side.
#
#   bench/gpu_fp8.sh OUTDIR [MODEL [STEPS]]     (from the repository root)
#
# MODEL: a config in bench/configs (default gpt2-124m); STEPS default 500,
# the cosine schedule decaying over them. The verdict, per recipe: its mean
# train loss over the last 50 steps within FP8_TOL (default 0.02, i.e. 2%)
# of bf16's; the script exits 1 when the first recipe fails. Throughput of
# each run is in the summary too (median step time after 5 warm-up steps;
# for the side by side with torch.compile use bench/gpu_train.sh with
# VARIANTS="fp8:--fp8.enabled=true").
#
# FP8_VARIANTS: space-separated NAME=ARGS, ARGS comma-separated options added
# to --fp8.enabled=true, e.g. "fp8= margin1=--fp8.margin=1
# e4m3=--fp8.format=e4m3" (default "fp8="). BF16_SEEDS: further seeds
# (e.g. "2 3") of the bf16 run; FP8_SEEDS: further seeds of every FP8
# recipe. With several seeds the verdict compares a recipe's mean over its
# seeds with bf16's mean over its seeds, and the summary gives the spread
# the bf16 runs show by seed alone.
#
# Output: OUTDIR/summary.md (the verdicts and every 25th step of the
# curves), OUTDIR/fp8_curve.csv (step, then one loss column per run, every
# step), OUTDIR/results.jsonl, colossal.log, metrics.jsonl. Environment: as
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
runs="bf16-$MODEL"
# shellcheck disable=SC2086
run_colossal "bf16-$MODEL" 1 "$cfg" "$STEPS" 5 bench=fp8 model_name="$MODEL" impl=colossal-bf16 -- $COMMON
for seed in ${BF16_SEEDS:-}; do
    # shellcheck disable=SC2086
    run_colossal "bf16s$seed-$MODEL" 1 "$cfg" "$STEPS" 5 bench=fp8 model_name="$MODEL" impl=colossal-bf16-seed$seed -- \
        $COMMON --train.seed="$seed"
    runs="$runs bf16s$seed-$MODEL"
done
for v in ${FP8_VARIANTS:-fp8=}; do
    name=${v%%=*}
    extra=$(echo "${v#*=}" | tr ',' ' ')
    # shellcheck disable=SC2086
    run_colossal "$name-$MODEL" 1 "$cfg" "$STEPS" 5 bench=fp8 model_name="$MODEL" impl="colossal-$name" -- $COMMON \
        --fp8.enabled=true $extra
    runs="$runs $name-$MODEL"
    for seed in ${FP8_SEEDS:-}; do
        # shellcheck disable=SC2086
        run_colossal "$name-s$seed-$MODEL" 1 "$cfg" "$STEPS" 5 bench=fp8 model_name="$MODEL" \
            impl="colossal-$name-seed$seed" -- $COMMON --fp8.enabled=true $extra --train.seed="$seed"
        runs="$runs $name-s$seed-$MODEL"
    done
done

# shellcheck disable=SC2086
$PY - "$WORK/runs" "$OUT/fp8_curve.csv" "$TOL" "$RESULTS" $runs <<'PYEOF' | tee -a "$OUT/summary.md"
import json, os, sys
runs_dir, csv_path, tol, results = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
names = sys.argv[5:]

def losses(name):
    out = {}
    path = os.path.join(runs_dir, name, "metrics.jsonl")
    try:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("kind") == "train" and "loss" in r:
                    out[r["step"]] = r["loss"]
    except OSError as e:
        print(f"cannot read {path}: {e}")
    return out

curves = {n: losses(n) for n in names}
steps = sorted(set.intersection(*(set(c) for c in curves.values())))
speed = {}
with open(results) as f:
    for line in f:
        r = json.loads(line)
        speed[r.get("tag")] = r.get("tokens_per_s")
if not steps:
    print("FAIL: no common train steps (see colossal.log)")
    sys.exit(1)
with open(csv_path, "w") as f:
    f.write("step," + ",".join(names) + "\n")
    for s in steps:
        f.write(f"{s}," + ",".join(str(curves[n][s]) for n in names) + "\n")
ref = curves[names[0]]
tail = steps[-50:]
mean = {n: sum(curves[n][s] for s in tail) / len(tail) for n in names}
print()
print("| step | " + " | ".join(names) + " |")
print("|---:|" + "---:|" * len(names))
for s in steps:
    if s % 25 == 0 or s == steps[-1]:
        print(f"| {s} | " + " | ".join(f"{curves[n][s]:.4f}" for n in names) + " |")
print()
print(f"| run | mean loss, steps {tail[0]}-{tail[-1]} | against {names[0]} | tokens/s |")
print("|---|---:|---:|---:|")
for n in names:
    sp = speed.get(n)
    print(f"| {n} | {mean[n]:.4f} | {100 * (mean[n] - mean[names[0]]) / mean[names[0]]:+.2f}% | "
          f"{sp:.0f} |" if sp else f"| {n} | {mean[n]:.4f} | "
          f"{100 * (mean[n] - mean[names[0]]) / mean[names[0]]:+.2f}% | |")
# runs by recipe: "bf16s2-m" and "fp8-s2-m" are seeds of "bf16-m" and "fp8-m"
def recipe(n):
    base = n.split("-")[0]
    return "bf16" if base.startswith("bf16") else base
groups = {}
for n in names:
    groups.setdefault(recipe(n), []).append(n)
def gmean(g):
    return sum(mean[n] for n in groups[g]) / len(groups[g])
b = gmean("bf16")
if len(groups["bf16"]) > 1:
    vals = [mean[n] for n in groups["bf16"]]
    print(f"\nbf16 over {len(vals)} seeds: mean {b:.4f}, runs {min(vals):.4f}-{max(vals):.4f} "
          f"({100 * (max(vals) - min(vals)) / b:.2f}% apart by seed alone)")
first = None
for g in groups:
    if g == "bf16":
        continue
    m = gmean(g)
    gap = abs(m - b) / b
    verdict = "PASS" if gap <= tol else "FAIL"
    print(f"\n{verdict} {g}: mean train loss over steps {tail[0]}-{tail[-1]}: bf16 {b:.4f} "
          f"({len(groups['bf16'])} seeds), fp8 {m:.4f} ({len(groups[g])} seeds; {100 * gap:.2f}% apart; "
          f"tolerance {100 * tol:.1f}%)")
    if first is None:
        first = gap <= tol
sys.exit(0 if first in (None, True) else 1)
PYEOF
