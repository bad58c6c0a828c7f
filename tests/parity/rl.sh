#!/bin/sh
# suite-lock: shared
# The alignment objectives against independent PyTorch references
# (docs/rlhf.md): rl_parity writes random inputs with the losses and
# gradients of RM, DPO, SimPO, GRPO and PPO; rl_reference.py recomputes them
# in float64 with autograd. Exit 77 (SKIP) without a python with torch.
: "${top_srcdir:?run under make check, or export top_srcdir and top_builddir}"
: "${top_builddir:?run under make check, or export top_srcdir and top_builddir}"
if [ -z "$PYTHON_TORCH" ] || [ "$PYTHON_TORCH" = none ]; then
    echo "SKIP: no python3 with torch (configure PYTHON_TORCH=none)"
    exit 77
fi
out=$top_builddir/tests/parity/rl.safetensors
rm -f "$out"
"$top_builddir/tests/parity/rl_parity" "$out" || exit 1
OMP_NUM_THREADS=1 "$PYTHON_TORCH" "$top_srcdir/tests/parity/rl_reference.py" "$out" || exit 1
rm -f "$out"
