#!/bin/sh
# suite-lock: shared
# The merged LoRA export read the Hugging Face way: test_lora_logits makes a
# tiny GPT-2 and Llama with adapters, exports the merged model and writes
# the adapter model's logits; hf_reference.py (an independent forward by
# Hugging Face names and layouts) must reproduce them within 1e-5, and the
# PEFT adapter imported onto the base must give the same logits bitwise.
# Exit 77 (SKIP) without a python with torch.
: "${top_srcdir:?run under make check, or export top_srcdir and top_builddir}"
: "${top_builddir:?run under make check, or export top_srcdir and top_builddir}"
if [ -z "$PYTHON_TORCH" ] || [ "$PYTHON_TORCH" = none ]; then
    echo "SKIP: no python3 with torch (configure PYTHON_TORCH=none)"
    exit 77
fi
d=$(mktemp -d "${TMPDIR:-/tmp}/lora-hf.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
for fam in gpt2 llama; do
    "$top_builddir/tests/unit/test_lora_logits" make $fam "$d/base-$fam" "$d/adapter-$fam" "$d/merged-$fam" \
        "$d/$fam.logits" || exit 1
    "$top_builddir/tests/unit/test_lora_logits" logits "$d/base-$fam" "$d/adapter-$fam" "$d/$fam.again" || exit 1
    cmp -s "$d/$fam.logits" "$d/$fam.again" || { echo "FAIL $fam: base + PEFT adapter logits differ"; exit 1; }
    OMP_NUM_THREADS=1 "$PYTHON_TORCH" "$top_srcdir/tests/parity/hf_reference.py" check "$d/merged-$fam" \
        "$d/$fam.logits" || exit 1
done
