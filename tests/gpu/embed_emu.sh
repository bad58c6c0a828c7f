#!/bin/sh
# suite-lock: shared
# Runs the CPU emulation of the embedding backward's dwte fast path
# (kernels/embed.cu: k_embed_tiles, k_embed_finish and the tile-length
# choice; tests/gpu/embed_emu.cpp). No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/embed_emu.sh
set -eu
. "$(dirname "$0")/emu_common.sh"
emu_build embed <<'PY'
embed = source(top, "kernels/embed.cu")
parts = common_parts(top) + [region(embed, "embed_dwte"), region(embed, "embed_tile_len")]
subs = [
    ("__shared__ uint32_t sk[EMB_CHUNK];", "uint32_t *sk = g_blk->sk;"),
    ("__shared__ int32_t sv[EMB_CHUNK];", "int32_t *sv = g_blk->sv;"),
]
write(out, parts, subs)
PY
"$dir/embed_emu" "$@"
