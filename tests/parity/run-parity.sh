#!/bin/sh
# Runs the colossal parity driver for one model family, then the PyTorch
# reference on what it wrote. Exit 77 (automake SKIP) when no python with
# torch was found by configure. Usage: run-parity.sh gpt2|llama
family=$1
: "${top_srcdir:?run under make check, or export top_srcdir and top_builddir}"
: "${top_builddir:?run under make check, or export top_srcdir and top_builddir}"
if [ -z "$PYTHON_TORCH" ] || [ "$PYTHON_TORCH" = none ]; then
    echo "SKIP: no python3 with torch (configure PYTHON_TORCH=none)"
    exit 77
fi
out=$top_builddir/tests/parity/$family.safetensors
rm -f "$out"
"$top_builddir/tests/parity/parity_driver" "$family" "$out" || exit 1
# The reference runs in float64 on one thread: its result must not depend on
# the machine's thread count.
OMP_NUM_THREADS=1 "$PYTHON_TORCH" "$top_srcdir/tests/parity/torch_reference.py" "$out" || exit 1
rm -f "$out"
