#!/bin/sh
# Runs the CPU emulation of the embedding backward's dwte fast path
# (kernels/embed.cu: k_embed_tiles, k_embed_finish and the tile-length
# choice; tests/gpu/embed_emu.cpp). No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/embed_emu.sh
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$top" "$dir" <<'PY'
import sys
top, out = sys.argv[1], sys.argv[2]
def cut(text, start, stop):
    a = text.index(start)
    return text[a:text.index(stop, a)]
common = open(top + "/kernels/cuda_common.cuh").read()
embed = open(top + "/kernels/embed.cu").read()
parts = [
    cut(common, "/* ---------------------------------------------------------------- number formats */",
        "/* ---------------------------------------------------------------- Philox"),
    cut(common, "template <int DT> CUK_INLINE float cuk_ld1", "static inline int cuk_dt_size"),
    cut(embed, "/* ---- dwte fast path: tiles of sorted positions.", "/* dwpe's fast path"),
    cut(embed, "static int64_t emb_ldp(int64_t cols)", "/* The minimum: sort buffers"),
]
src = "\n".join(parts)
subs = [
    ("__shared__ uint32_t sk[EMB_CHUNK];", "uint32_t *sk = g_blk->sk;"),
    ("__shared__ int32_t sv[EMB_CHUNK];", "int32_t *sv = g_blk->sv;"),
]
for a, b in subs:
    assert a in src, a
    src = src.replace(a, b)
open(out + "/kern.inc", "w").write(src)
PY
g++ -std=c++20 -O1 -pthread -I"$dir" -o "$dir/embed_emu" "$top/tests/gpu/embed_emu.cpp"
"$dir/embed_emu" "$@"
