#!/bin/sh
# Inference on the GPU machine, in one call: the CUDA paged-KV ops against
# the CPU ones (test_cuda_ops paged), colossal-infer's greedy continuations
# on the GPU (f32 and bf16) against transformers' generate() on the same
# exported weights (GPT-2 and Llama with GQA: tests/gpu/hf_transformers.py
# requests / generate), then bench/infer_decode.sh (decode tokens/s beside
# transformers' static-cache generate).
#
#   tests/gpu/infer-run.sh OUTDIR [PREBUILT]
#
# PREBUILT (default .device/infer) holds bin/ (test_cuda_ops, colossal-infer,
# infer_bench), lib/ (libcolossal-core.so.0), the Hugging Face exports hf/
# and hf-llama/ and req.jsonl (prompts as text).
set -u
out=${1:-/tmp/infer-out}
pre=${2:-.device/infer}
top=$PWD
mkdir -p "$out"
export LD_LIBRARY_PATH="$top/$pre/lib:$top/.device/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
b=$top/$pre/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 180 "$b/test_cuda_ops" paged >"$out/ops.log" 2>&1
echo "test_cuda_ops paged exit $?"
grep -E "FAIL|passed|device error" "$out/ops.log" | tail -n 12
for m in hf hf-llama; do
    python3 tests/gpu/hf_transformers.py requests "$pre/$m" "$pre/req.jsonl" "$out/req-$m.jsonl" || continue
    for dt in f32 bf16; do
        timeout 90 "$b/colossal-infer" --model.path "$pre/$m" --infer.input "$out/req-$m.jsonl" \
            --infer.output "$out/$m-$dt.jsonl" --model.dtype "$dt" --run.device cuda --run.dir "$out/run" \
            --infer.progress 0 --log.timestamps false >"$out/$m-$dt.log" 2>&1
        echo "colossal-infer $m $dt exit $? ($(wc -l <"$out/$m-$dt.jsonl" 2>/dev/null) lines)"
        tail -n 2 "$out/$m-$dt.log" | cut -c1-200
        timeout 120 python3 tests/gpu/hf_transformers.py --device cuda --dtype "$dt" generate "$pre/$m" \
            "$out/req-$m.jsonl" "$out/$m-$dt.jsonl" 2>&1 | tail -n 6
    done
done
INFER_BATCHES=${INFER_BATCHES:-1,16,64,256} sh bench/infer_decode.sh "$out/bench" "$b"
