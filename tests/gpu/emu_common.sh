# Sourced by the *_emu.sh scripts: skips without g++ or python3, sets top
# (the source tree) and dir (a temporary directory removed on exit), and
# defines emu_build NAME [G++ FLAGS]: the Python on its standard input
# writes the kernels' header into $dir with emu_extract's helpers (common_parts,
# region, source, write; top and out are set), then g++ builds
# tests/gpu/NAME_emu.cpp into $dir/NAME_emu, with kernels/ on the include
# path (the emulations include cuda_kernels.h for the kernels' own types).
command -v g++ >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs g++ and python3"; exit 77; }
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# kernels/cuda_kernels.h, which the emulations include for the kernels'
# types, needs only these two names from the CUDA runtime
printf 'typedef int cudaError_t;\ntypedef struct CUstream_st *cudaStream_t;\n' >"$dir/cuda_runtime.h"
emu_build() {
    name=$1
    shift
    {
        cat <<'HEAD'
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[1] + "/tests/gpu")
from emu_extract import common_parts, region, source, write
top, out = sys.argv[1], sys.argv[2]
HEAD
        cat
    } | python3 - "$top" "$dir"
    g++ -std=c++20 -O1 -pthread -I"$dir" -I"$top/kernels" "$@" -o "$dir/${name}_emu" "$top/tests/gpu/${name}_emu.cpp"
}
