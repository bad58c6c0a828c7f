#!/bin/sh
# Runs the CPU emulation of the embedding backward's dwte fast path
# (kernels/embed.cu: k_embed_tiles, k_embed_finish and the tile-length
# choice; tests/gpu/embed_emu.cpp). No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/embed_emu.sh
set -eu
command -v g++ >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs g++ and python3"; exit 77; }
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$top" "$dir" <<'PY'
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[1] + "/tests/gpu")
from emu_extract import common_parts, region, source, write
top, out = sys.argv[1], sys.argv[2]
embed = source(top, "kernels/embed.cu")
parts = common_parts(top) + [region(embed, "embed_dwte"), region(embed, "embed_tile_len")]
subs = [
    ("__shared__ uint32_t sk[EMB_CHUNK];", "uint32_t *sk = g_blk->sk;"),
    ("__shared__ int32_t sv[EMB_CHUNK];", "int32_t *sv = g_blk->sv;"),
]
write(out, parts, subs)
PY
g++ -std=c++20 -O1 -pthread -I"$dir" -o "$dir/embed_emu" "$top/tests/gpu/embed_emu.cpp"
"$dir/embed_emu" "$@"
