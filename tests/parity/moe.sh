#!/bin/sh
# suite-lock: shared
# The MoE sublayer against a PyTorch reference (docs/moe.md): colossal's
# moe_driver writes six routings' inputs, weights, outputs, losses and
# gradients; moe_reference.py recomputes them in float64. Exit 77 (SKIP)
# when configure found no python with torch.
: "${top_srcdir:?run under make check, or export top_srcdir and top_builddir}"
: "${top_builddir:?run under make check, or export top_srcdir and top_builddir}"
if [ -z "$PYTHON_TORCH" ] || [ "$PYTHON_TORCH" = none ]; then
    echo "SKIP: no python3 with torch (configure PYTHON_TORCH=none)"
    exit 77
fi
out=$top_builddir/tests/parity/moe.safetensors
rm -f "$out"
"$top_builddir/tests/parity/moe_driver" "$out" || exit 1
OMP_NUM_THREADS=1 "$PYTHON_TORCH" "$top_srcdir/tests/parity/moe_reference.py" "$out" || exit 1
rm -f "$out"
