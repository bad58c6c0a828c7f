#!/bin/sh
# suite-lock: shared
# Runs the CPU emulation of the mixture-of-experts kernels (kernels/moe.cu:
# k_moe_permute, k_moe_combine_fwd, k_moe_combine_bwd; tests/gpu/moe_emu.cpp)
# against host references. No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/moe_emu.sh
set -eu
. "$(dirname "$0")/emu_common.sh"
emu_build moe <<'PY'
moe = source(top, "kernels/moe.cu")
parts = common_parts(top) + [region(moe, "moe")]
subs = [("__shared__ float sh[32];", "float *sh = g_blk->sh;")]
write(out, parts, subs)
PY
"$dir/moe_emu" "$@"
