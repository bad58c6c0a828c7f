#!/bin/sh
# suite-lock: shared
# LoRA against an independent PyTorch reference (docs/sft.md "LoRA"):
# lora_parity writes tiny GPT-2 and Llama models with adapters on every
# linear, their logits, loss and adapter gradients; lora_reference.py
# recomputes them in float64. Exit 77 (SKIP) without a python with torch.
: "${top_srcdir:?run under make check, or export top_srcdir and top_builddir}"
: "${top_builddir:?run under make check, or export top_srcdir and top_builddir}"
if [ -z "$PYTHON_TORCH" ] || [ "$PYTHON_TORCH" = none ]; then
    echo "SKIP: no python3 with torch (configure PYTHON_TORCH=none)"
    exit 77
fi
out=$top_builddir/tests/parity/lora.safetensors
rm -f "$out"
"$top_builddir/tests/parity/lora_parity" "$out" || exit 1
OMP_NUM_THREADS=1 "$PYTHON_TORCH" "$top_srcdir/tests/parity/lora_reference.py" "$out" || exit 1
rm -f "$out"
