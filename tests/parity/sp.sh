#!/bin/sh
# Ring attention and Ulysses against a PyTorch reference
# (docs/sequence-parallel.md): sp_driver runs both on 2 and 4 ranks, causal
# and not, and writes the whole sequence's inputs, outputs and gradients;
# sp_reference.py recomputes them in float64. Exit 77 (SKIP) when configure
# found no python with torch.
: "${top_srcdir:?run under make check, or export top_srcdir and top_builddir}"
: "${top_builddir:?run under make check, or export top_srcdir and top_builddir}"
: "${MPIEXEC:=mpiexec}"
if [ -z "$PYTHON_TORCH" ] || [ "$PYTHON_TORCH" = none ]; then
    echo "SKIP: no python3 with torch (configure PYTHON_TORCH=none)"
    exit 77
fi
for np in 2 4; do
    out=$top_builddir/tests/parity/sp$np.safetensors
    rm -f "$out"
    $MPIEXEC -n "$np" --oversubscribe "$top_builddir/tests/parity/sp_driver" "$out" || exit 1
    OMP_NUM_THREADS=1 "$PYTHON_TORCH" "$top_srcdir/tests/parity/sp_reference.py" "$out" || exit 1
    rm -f "$out"
done
