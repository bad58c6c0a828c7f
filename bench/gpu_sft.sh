#!/bin/sh
# SFT throughput on one GPU, colossal-sft beside PyTorch + transformers +
# peft (bench/torch_sft.py) in one invocation: the same randomly initialised
# Llama (a Hugging Face directory both load), the same tokenized rows
# (the embedded instruction set, colossal-data sft-example, as colossal-sft
# tokenizes it), full fine-tuning and LoRA (rank 16, alpha 32, on every
# projection of attention and the MLP) side by side.
#
#   bench/gpu_sft.sh OUTDIR BIN_DIR [MODEL ...]
#
# BIN_DIR holds colossal-pretrain, colossal-sft and colossal-data (their
# libraries on LD_LIBRARY_PATH). MODEL: a bench/configs name of family llama
# (default: llama-124m llama-1b). Each model fine-tunes SFT_STEPS steps
# (default 30; the median step time of the steps after the first 5) of
# SFT_BATCH rows (default: 16 for llama-124m, 8 otherwise) x SFT_SEQ
# positions (default 1024), bf16 compute (colossal: precision bf16, f32
# masters; PyTorch: f32 parameters under bf16 autocast for full
# fine-tuning, a bf16 base with f32 adapters for LoRA). TORCH_MODES
# (default "eager compile") picks the PyTorch runs. tokens/s counts every
# position of a row on both sides.
#
# Output: OUTDIR/results.jsonl (one line per run), the logs, and a table.
# BENCH_DEVICE=cpu with MODEL llama-tiny checks the script on a CPU build.
set -u
[ $# -ge 2 ] || { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 2; }
top=$(cd "$(dirname "$0")/.." && pwd)
case $1 in /*) OUT=$1 ;; *) OUT=$PWD/$1 ;; esac
bin=$(cd "$2" && pwd) || exit 2
shift 2
[ $# -gt 0 ] || set -- llama-124m llama-1b
DEVICE=${BENCH_DEVICE:-cuda}
PY=${PYTHON:-python3}
STEPS=${SFT_STEPS:-30}
SEQ=${SFT_SEQ:-1024}
WORK=${BENCH_WORK:-/tmp/colossal-sft-bench}
TORCH_MODES=${TORCH_MODES-eager compile}
LORA_TARGETS=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT" "$WORK"
RES=$OUT/results.jsonl
: >"$RES"
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*"; }
mpi="mpirun --allow-run-as-root -np 1 --bind-to none -x LD_LIBRARY_PATH"

# The tokenizer: a BPE learned on the embedded corpus (colossal-pretrain
# writes it to its run directory); the instruction set, once.
if [ ! -f "$WORK/tok/tokenizer/vocab.json" ]; then
    rm -rf "$WORK/tok"
    $mpi "$bin/colossal-pretrain" --config "$top/bench/configs/tiny.yaml" --run.device cpu --train.steps 1 \
        --optim.warmup_steps 0 --run.dir "$WORK/tok" --data.corpus_docs 4000 --data.corpus_vocab 4096 \
        --generate.tokens 0 >"$OUT/prepare.log" 2>&1 || { tail -20 "$OUT/prepare.log"; exit 1; }
fi
[ -f "$WORK/ex/train.jsonl" ] || "$bin/colossal-data" sft-example --out "$WORK/ex" --docs 8000 --seed 1234 \
    >>"$OUT/prepare.log" 2>&1 || { tail -20 "$OUT/prepare.log"; exit 1; }

# colossal_run MODEL NAME ARGS...: one colossal-sft run; appends its result.
colossal_run() {
    m=$1 name=$2
    shift 2
    rd=$WORK/run-$m-$name
    rm -rf "$rd"
    say "colossal-sft $m $name"
    # shellcheck disable=SC2086
    timeout "${RUN_TIMEOUT:-300}" $mpi "$bin/colossal-sft" --model.path "$WORK/hf-$m" \
        --model.tokenizer "$WORK/tok/tokenizer" --data.train "$WORK/ex/train.jsonl" --train.seq_len "$SEQ" \
        --train.micro_batch "$B" --train.steps "$STEPS" --optim.warmup_steps 2 --eval.interval 0 \
        --checkpoint.every 0 --precision bf16 --run.device "$DEVICE" --run.peak_tflops 989 \
        --log.timestamps false --run.dir "$rd" "$@" >"$OUT/colossal-$m-$name.log" 2>&1 ||
        { echo "colossal-sft $m $name failed:"; tail -8 "$OUT/colossal-$m-$name.log"; return 1; }
    "$PY" - "$rd/metrics.jsonl" "$m" "$name" "$B" "$SEQ" >>"$RES" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
st = [r["step_s"] for r in recs if r.get("kind") == "train"][5:]
med = statistics.median(st)
b, t = int(sys.argv[4]), int(sys.argv[5])
print(json.dumps({"model": sys.argv[2], "impl": "colossal", "run": sys.argv[3], "tokens_per_s": round(b * t / med, 1),
                  "step_ms": round(med * 1e3, 3), "batch": b, "seq_len": t}))
PY
}

torch_run() {
    m=$1 name=$2 mode=$3
    shift 3
    say "torch $m $name $mode"
    timeout "${TORCH_RUN_TIMEOUT:-400}" "$PY" "$top/bench/torch_sft.py" --hf "$WORK/hf-$m" \
        --data "$WORK/run-$m-full/data/train" --seq-len "$SEQ" --batch "$B" --steps $((STEPS - 5)) --warmup 5 \
        --mode "$mode" --device "$DEVICE" "$@" >"$OUT/torch-$m-$name-$mode.log" 2>&1 ||
        { echo "torch $m $name $mode failed:"; tail -8 "$OUT/torch-$m-$name-$mode.log"; return 1; }
    tail -1 "$OUT/torch-$m-$name-$mode.log" | sed 's/^RESULT //' |
        "$PY" -c "import json,sys; r=json.load(sys.stdin); r.update(model='$m', run='$name', batch=$B, seq_len=$SEQ); print(json.dumps(r))" >>"$RES"
}

for m in "$@"; do
    case $m in llama-124m) B=${SFT_BATCH:-16} ;; *) B=${SFT_BATCH:-8} ;; esac
    say "model $m: a random Llama of bench/configs/$m.yaml's shape"
    rm -rf "$WORK/hf-$m"
    "$PY" "$top/bench/torch_sft.py" --make-hf "$WORK/hf-$m" --config "$top/bench/configs/$m.yaml" \
        --seq-len "$SEQ" >"$OUT/make-$m.log" 2>&1 || { tail -5 "$OUT/make-$m.log"; continue; }
    colossal_run "$m" full
    colossal_run "$m" lora --lora.rank 16 --lora.alpha 32 --lora.targets "$LORA_TARGETS" --lora.export false
    [ -f "$WORK/run-$m-full/data/train.idx" ] || continue
    for mode in $TORCH_MODES; do
        torch_run "$m" full "$mode"
        torch_run "$m" lora "$mode" --lora-rank 16 --lora-alpha 32 --lora-targets "$LORA_TARGETS"
    done
    rm -rf "$WORK/hf-$m"
done

"$PY" - "$RES" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault((r["model"], r["run"]), {})[r["impl"]] = r
print(f"{'model':<11} {'run':<5} {'batch x seq':>11} {'colossal tok/s':>15} {'torch impl':>22} {'tok/s':>9} {'ratio':>6}")
for (m, run), d in by.items():
    c = d.get("colossal")
    ct = c["tokens_per_s"] if c else float("nan")
    shape = f"{(c or next(iter(d.values())))['batch']} x {(c or next(iter(d.values())))['seq_len']}"
    others = [(k, v) for k, v in d.items() if k != "colossal"] or [("-", None)]
    for k, v in others:
        tt = v["tokens_per_s"] if v else float("nan")
        print(f"{m:<11} {run:<5} {shape:>11} {ct:>15.0f} {k:>22} {tt:>9.0f} {ct / tt if v and c else float('nan'):>6.2f}")
PY
