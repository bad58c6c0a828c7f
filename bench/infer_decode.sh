#!/bin/sh
# Decode throughput on one GPU, colossal's engine beside Hugging Face
# transformers' generate() with a static cache, in one invocation, on the
# same random-weight shapes: GPT-2 124M and a Llama 1B shape (16 layers,
# d 2048, 32 heads / 8 kv, ffn 8192, vocab 128256), bf16, prompt 128,
# 256 new tokens, batch 1, 16, 64, 256.
#
#   bench/infer_decode.sh OUTDIR [BIN_DIR]
#
# BIN_DIR holds infer_bench (default build-gpu/bench). Prints one JSON line
# per run (OUTDIR/results.jsonl) and a table: tokens/s of each, their ratio,
# and colossal's step time against the HBM roofline (the weight bytes a step
# reads / the HBM bandwidth; an untied input embedding only a row per
# sequence), with the part of the step the host spent outside waiting for
# the device. INFER_BATCHES, INFER_MODELS (gpt2,llama) and INFER_HF=0 narrow
# it. INFER_HBM_TBPS: the roofline's bandwidth, default the H200's 4.8 TB/s
# (issue #20's definition), 3.35 on a GPU nvidia-smi names an H100.
set -u
out=${1:?usage: bench/infer_decode.sh OUTDIR [BIN_DIR]}
bin=${2:-build-gpu/bench}
mkdir -p "$out"
batches=${INFER_BATCHES:-1,16,64,256}
models=${INFER_MODELS:-gpt2,llama}
res=$out/results.jsonl
: >"$res"
hbm=${INFER_HBM_TBPS:-}
if [ -z "$hbm" ]; then
    case $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) in
    *H100*) hbm=3.35 ;;
    *) hbm=4.8 ;;
    esac
fi
shape() {
    case $1 in
    gpt2) echo "gpt2 12 768 12 12 3072 50257" ;;
    llama) echo "llama 16 2048 32 8 8192 128256" ;;
    esac
}
for m in $(echo "$models" | tr ',' ' '); do
    s=$(shape "$m")
    # shellcheck disable=SC2086
    timeout 300 "$bin/infer_bench" $s --batches "$batches" --hbm "$hbm" >>"$res" 2>"$out/colossal-$m.err" ||
        { echo "infer_bench $m failed:"; tail -5 "$out/colossal-$m.err"; }
    if [ "${INFER_HF:-1}" = 1 ]; then
        # shellcheck disable=SC2086
        timeout 300 python3 "$(dirname "$0")/hf_generate_bench.py" $s --batches "$batches" >>"$res" \
            2>"$out/hf-$m.err" || { echo "transformers $m failed:"; tail -5 "$out/hf-$m.err"; }
    fi
done
python3 - "$res" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault((r["family"], r["batch"]), {})[r["impl"]] = r
hbm = next((r["hbm_tbps"] for r in rows if "hbm_tbps" in r), None)
if hbm:
    print(f"roofline at {hbm} TB/s")
print(f"{'model':<6} {'batch':>5} {'colossal tok/s':>15} {'transformers':>13} {'ratio':>7} {'step ms':>8} {'host ms':>8} {'roofline ms':>11} {'of roofline':>11}")
for (fam, b), d in sorted(by.items()):
    c, h = d.get("colossal"), d.get("transformers-static")
    ct = c["decode_tokens_per_s"] if c else float("nan")
    ht = h["decode_tokens_per_s"] if h else float("nan")
    print(f"{fam:<6} {b:>5} {ct:>15.1f} {ht:>13.1f} {ct / ht if h and c else float('nan'):>7.2f} "
          f"{c['decode_step_ms'] if c else float('nan'):>8.3f} {c.get('decode_host_ms', float('nan')) if c else float('nan'):>8.3f} "
          f"{c['roofline_step_ms'] if c else float('nan'):>11.3f} "
          f"{100 * c['roofline_frac'] if c else float('nan'):>10.1f}%")
PY
