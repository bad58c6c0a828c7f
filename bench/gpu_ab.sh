#!/bin/sh
# One-GPU training speed of two source trees of colossal side by side, in
# one invocation: bench/gpu_train.sh of each tree (colossal only, no
# PyTorch) on the same model, alternating A, B, A, B, ... so that drift of
# the machine (clocks, temperature) falls on both alike.
#
#   bench/gpu_ab.sh OUTDIR TREE_A TREE_B [MODEL] [ROUNDS]
#
# TREE_A/B: source trees with their autotools output (tests/gpu/snapshot.sh
# makes them from a commit); each is built once, in TREE/build-gpu. MODEL:
# a config of bench/configs (default gpt2-124m); ROUNDS (default 3). Prints
# each run's tokens/s and the ratio B/A of the medians over the rounds.
# Environment as bench/gpu_train.sh (BENCH_STEPS, BENCH_SKIP, ...).
set -eu
[ $# -ge 3 ] || { sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 2; }
out=$1
mkdir -p "$out"
out=$(cd "$out" && pwd)
a=$(cd "$2" && pwd)
b=$(cd "$3" && pwd)
model=${4:-gpt2-124m}
rounds=${5:-3}
for r in $(seq 1 "$rounds"); do
    for t in a b; do
        tree=$a
        [ $t = b ] && tree=$b
        make=0
        [ "$r" = 1 ] && make=1
        (cd "$tree" && BENCH_MAKE=$make TORCH_MODES=none sh bench/gpu_train.sh "$out/$t-$r" "$model") \
            >"$out/$t-$r.log" 2>&1 || { tail -20 "$out/$t-$r.log"; exit 1; }
    done
done
python3 - "$out" "$rounds" "$model" "$(cat "$a/REVISION" 2>/dev/null || echo A)" \
    "$(cat "$b/REVISION" 2>/dev/null || echo B)" <<'PY' | tee "$out/summary.md"
import json, statistics, sys
out, rounds, model, ra, rb = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
tps = {"a": [], "b": []}
for r in range(1, rounds + 1):
    for t in "ab":
        with open(f"{out}/{t}-{r}/results.jsonl") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        got = [x["tokens_per_s"] for x in rows if x.get("tokens_per_s")]
        if not got:
            sys.exit(f"{t}-{r}: no tokens/s in results.jsonl")
        tps[t].append(got[0])
ma, mb = statistics.median(tps["a"]), statistics.median(tps["b"])
print(f"| {model} | A {ra} | B {rb} |")
print("|---|---:|---:|")
for r in range(rounds):
    print(f"| round {r + 1} tokens/s | {tps['a'][r]:.0f} | {tps['b'][r]:.0f} |")
print(f"| median | {ma:.0f} | {mb:.0f} |")
print(f"\nB/A = {mb / ma:.4f}")
PY
