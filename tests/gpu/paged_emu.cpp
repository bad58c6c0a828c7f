/* CPU emulation of the paged-attention kernels of kernels/paged.cu (the
 * tensor-core k_paged_tc, the CUDA-core k_paged_pipe it stands beside, the
 * in-kernel split merge and k_paged_reduce, and the prefill's query tiles,
 * k_paged_prefill, with its tile search), to check the fragment
 * indexing, the per-warp online softmax, the masks, the head chunks and
 * the split bookkeeping on a machine without a GPU (not a substitute for
 * tests/gpu/test_cuda_ops on a GPU). tests/gpu/paged_emu.sh extracts the
 * kernels into kern.inc and compiles this file with g++ -std=c++20.
 *
 * Each block runs as 128 fibers (emu_cuda.h, emu_mma.h); blocks run one
 * after another, in an order that puts a token's splits apart, so the
 * merge always meets partials written by blocks that ran earlier (the
 * fences are no-ops here). Static __shared__ arrays become function
 * statics (one block at a time); the dynamic area starts as NaN poison.
 * The reference is double-precision attention over the same bf16 q, K and
 * V. Pass: every output row within 1e-2 of the largest reference value for
 * the tensor-core kernel (P is rounded to bf16 before P V), 1e-5 for the
 * CUDA-core kernel (f32 throughout); the merge counters back at 0; a bad
 * block id reported and its keys left out.
 *   tests/gpu/paged_emu.sh [case] */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "emu_cuda.h"
/* the kernels' own C interface (cuk_paged, the dtype and error codes),
 * over the stub cuda_runtime.h that emu_common.sh writes */
#include "cuda_kernels.h"
static inline void cuk_report(cuk_errrec *e, int code, int64_t a, int64_t b, int64_t c, int64_t d) {
    if (e && e->code == 0) *e = cuk_errrec{code, 0, a, b, c, d};
}
static inline int64_t cuk_roff(const cuk_bthd &t, int64_t b, int64_t s, int64_t h) {
    return b * t.sb + s * t.st + h * t.sh;
}
#include "emu_mma.h"

#define __shared__ static
#define CUK_FOR_RC(rows_, cols_)                                                      \
    for (int64_t r = blockIdx.y; r < (rows_); r += gridDim.y)                         \
        for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < (cols_); \
             c += (int64_t)gridDim.x * blockDim.x)
static inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
    return v;
}
template <class Op> static inline float block_red(float v, float *sh, float id, Op op) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(~0u, v, o));
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : id;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(~0u, v, o));
    return v;
}
static inline float block_max(float v, float *sh) {
    return block_red(v, sh, -INFINITY, [](float a, float b) { return fmaxf(a, b); });
}
static inline float block_sum(float v, float *sh) {
    return block_red(v, sh, 0.0f, [](float a, float b) { return a + b; });
}
static inline void __threadfence() {}
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned o = *p;
    *p = o + v;
    return o;
}
static inline float __ldcg(const float *p) { return *p; }
#include "kern.inc"

/* Runs f as every block of grid (x, y), x outermost in reverse order
 * within each y sweep reversed on odd x, so a token's splits do not run
 * back to back in grid order. */
template <class F> static void launch(dim3 grid, size_t smem, F f) {
    gridDim = grid;
    blockDim = dim3(128, 1, 1);
    for (int64_t xi = (int64_t)grid.x - 1; xi >= 0; xi--)
        for (unsigned yi = 0; yi < grid.y; yi++) {
            const unsigned y = xi % 2 ? grid.y - 1 - yi : yi;
            auto blk = std::make_unique<Block>();
            std::vector<unsigned char> sm(smem + 128, 0xff); /* NaN poison */
            g_smem = (unsigned char *)(((uintptr_t)sm.data() + 127) & ~(uintptr_t)127);
            blockIdx = dim3((unsigned)xi, y, 1);
            g_blk = blk.get();
            emu::run_block(128, f);
        }
}

struct Case {
    std::vector<int> ql, ctx; /* per sequence: query rows, context length */
    int Hq, Hkv, D, bs;
    int64_t chunk; /* keys a split; 0: one split */
    bool counters; /* the in-kernel merge (else k_paged_reduce) */
    int bad_seq;   /* >= 0: this sequence's second table column names a block outside the pool */
};

static int run_case(const Case &c, int mode) {
    const bool tc = mode != 1, pf = mode == 2;
    const int S = (int)c.ql.size(), Hq = c.Hq, Hkv = c.Hkv, D = c.D, G = Hq / Hkv, bs = c.bs;
    int N = 0, max_ctx = 0;
    for (int s = 0; s < S; s++) N += c.ql[s], max_ctx = std::max(max_ctx, c.ctx[s]);
    const int max_blocks = (max_ctx + bs - 1) / bs;
    std::mt19937 rng(Hq * 131 + D * 7 + N);
    std::normal_distribution<float> nd(0, 1);
    int n_blocks = 2;
    for (int s = 0; s < S; s++) n_blocks += (c.ctx[s] + bs - 1) / bs;
    std::vector<int32_t> perm(n_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> bt((size_t)S * max_blocks, -1), qs(S + 1, 0), cl(c.ctx.begin(), c.ctx.end());
    for (int s = 0, u = 0; s < S; s++) {
        qs[s + 1] = qs[s] + c.ql[s];
        for (int b = 0; b < (c.ctx[s] + bs - 1) / bs; b++) bt[(size_t)s * max_blocks + b] = perm[u++];
    }
    if (c.bad_seq >= 0) bt[(size_t)c.bad_seq * max_blocks + 1] = n_blocks + 5;
    /* q as a strided view of a wider row (the engine's qkv rows) */
    const int64_t qrow = (int64_t)(Hq + 2 * Hkv) * D;
    std::vector<uint16_t> qb((size_t)N * qrow), kb((size_t)n_blocks * bs * Hkv * D), vb(kb.size());
    for (auto &x : qb) x = f2bf(nd(rng));
    for (auto &x : kb) x = f2bf(nd(rng));
    for (auto &x : vb) x = f2bf(nd(rng));
    std::vector<float> o((size_t)N * Hq * D, NAN);
    const float scale = 1.0f / std::sqrt((float)D);
    cuk_paged p{};
    p.q = cuk_bthd{qb.data(), 1, N, Hq, D, N * qrow, qrow, D, CUK_BF16};
    p.o = cuk_bthd{o.data(), 1, N, Hq, D, (int64_t)N * Hq * D, (int64_t)Hq * D, D, CUK_F32};
    p.kc = kb.data();
    p.vc = vb.data();
    p.cdt = CUK_BF16;
    p.n_blocks = n_blocks;
    p.bs = bs;
    p.Hkv = Hkv;
    p.bt = bt.data();
    p.qs = qs.data();
    p.cl = cl.data();
    p.S = S;
    p.max_blocks = max_blocks;
    p.limit = (int64_t)max_blocks * bs;
    p.scale = scale;
    p.tc = tc;
    p.prefill = pf;
    const int64_t chunk = pf || c.chunk <= 0 ? max_ctx : c.chunk, splits = (max_ctx + chunk - 1) / chunk;
    const int heads = tc ? CUK_PAGED_TC_HEADS : CUK_PAGED_HEADS, nhc = (G + heads - 1) / heads;
    const dim3 grid((unsigned)(N * Hkv * nhc), (unsigned)splits, 1);
    std::vector<float> ws(splits > 1 ? (size_t)N * Hq * splits * (D + 2) : 1, NAN);
    std::vector<unsigned> cnt(grid.x, 0u);
    float *ws_acc = splits > 1 ? ws.data() : nullptr,
          *ws_ml = splits > 1 ? ws.data() + (size_t)N * Hq * splits * D : nullptr;
    unsigned *cn = splits > 1 && c.counters ? cnt.data() : nullptr;
    int bl = -1;
    if ((bs & (bs - 1)) == 0)
        for (bl = 0; (1 << bl) < bs; bl++) {
        }
    cuk_errrec err{};
    printf("%s: S %d N %d Hq/Hkv %d/%d D %d bs %d ctx max %d, %lld split(s) of %lld%s%s\n",
           pf   ? "pref"
           : tc ? "tc  "
                : "pipe",
           S, N, Hq, Hkv, D, bs, max_ctx, (long long)splits, (long long)chunk,
           splits > 1 ? (c.counters ? ", merged in the kernel" : ", k_paged_reduce") : "",
           c.bad_seq >= 0 ? ", a bad block" : "");
    if (pf) {
        const int TQ = (D == 64 ? pgp_rows<64>() : pgp_rows<128>()) / G;
        const dim3 pg((unsigned)((N + S * (TQ - 1) + TQ - 1) / TQ), (unsigned)Hkv, 1);
        if (D == 64) launch(pg, pgp_smem<64>(), [&] { k_paged_prefill<64, false>(p, bl, &err); });
        else launch(pg, pgp_smem<128>(), [&] { k_paged_prefill<128, false>(p, bl, &err); });
    } else if (tc) {
        if (D == 64)
            launch(grid, pgt_smem<64>(),
                   [&] { k_paged_tc<64, false>(p, splits, chunk, nhc, bl, ws_acc, ws_ml, cn, &err); });
        else
            launch(grid, pgt_smem<128>(),
                   [&] { k_paged_tc<128, false>(p, splits, chunk, nhc, bl, ws_acc, ws_ml, cn, &err); });
    } else {
        if (D == 64 && G >= 2)
            launch(grid, 0, [&] { k_paged_pipe<CUK_BF16, 64, 4>(p, splits, chunk, nhc, bl, ws_acc, ws_ml, cn, &err); });
        else if (D == 64)
            launch(grid, 0, [&] { k_paged_pipe<CUK_BF16, 64, 1>(p, splits, chunk, nhc, bl, ws_acc, ws_ml, cn, &err); });
        else
            launch(grid, 0,
                   [&] { k_paged_pipe<CUK_BF16, 128, 4>(p, splits, chunk, nhc, bl, ws_acc, ws_ml, cn, &err); });
    }
    if (!pf && splits > 1 && !cn)
        launch(dim3((unsigned)(N * Hq), 1, 1), 0, [&] { k_paged_reduce(p, splits, chunk, ws_acc, ws_ml); });

    /* the reference, without the keys of a bad block */
    std::vector<double> ref(o.size());
    double mx = 0;
    for (int s = 0; s < S; s++)
        for (int j = 0; j < c.ql[s]; j++) {
            const int i = qs[s] + j, nk = c.ctx[s] - c.ql[s] + j + 1;
            for (int h = 0; h < Hq; h++) {
                std::vector<double> sc(nk, -INFINITY);
                double m = -INFINITY;
                for (int k = 0; k < nk; k++) {
                    const int32_t blk = bt[(size_t)s * max_blocks + k / bs];
                    if (blk < 0 || blk >= n_blocks) continue;
                    const size_t row = (((size_t)blk * bs + k % bs) * Hkv + h / G) * D;
                    double d = 0;
                    for (int e = 0; e < D; e++) d += (double)bf2f(qb[(size_t)i * qrow + h * D + e]) * bf2f(kb[row + e]);
                    sc[k] = d * scale;
                    m = std::max(m, sc[k]);
                }
                double L = 0;
                std::vector<double> acc(D, 0.0);
                for (int k = 0; k < nk; k++) {
                    if (sc[k] == -INFINITY) continue;
                    const int32_t blk = bt[(size_t)s * max_blocks + k / bs];
                    const size_t row = (((size_t)blk * bs + k % bs) * Hkv + h / G) * D;
                    const double w = std::exp(sc[k] - m);
                    L += w;
                    for (int e = 0; e < D; e++) acc[e] += w * bf2f(vb[row + e]);
                }
                for (int e = 0; e < D; e++) {
                    ref[((size_t)i * Hq + h) * D + e] = L > 0 ? acc[e] / L : 0.0;
                    mx = std::max(mx, std::fabs(ref[((size_t)i * Hq + h) * D + e]));
                }
            }
        }
    double worst = 0;
    size_t at = 0;
    bool nan = false;
    for (size_t e = 0; e < o.size(); e++) {
        if (std::isnan(o[e])) nan = true;
        const double d = std::fabs(o[e] - ref[e]);
        if (d > worst) worst = d, at = e;
    }
    const double rel = mx > 0 ? worst / mx : worst, tol = tc ? 1e-2 : 1e-5;
    int fails = 0;
    printf("  err %.2e (row %zu head %zu dim %zu)%s\n", rel, at / ((size_t)Hq * D), at / D % Hq, at % D,
           nan ? "  NaN!" : "");
    if (nan || !(rel <= tol)) fails++;
    for (unsigned x = 0; x < grid.x; x++)
        if (cnt[x] != 0u) {
            printf("  FAIL: counter %u left at %u\n", x, cnt[x]);
            fails++;
            break;
        }
    const int want = c.bad_seq >= 0 ? CUK_ERR_BLOCK : CUK_ERR_NONE;
    if (err.code != want || (want && (err.a != c.bad_seq || err.b != 1 || err.c != n_blocks + 5))) {
        printf("  FAIL: error record %d (%lld, %lld, %lld), want %d\n", err.code, (long long)err.a, (long long)err.b,
               (long long)err.c, want);
        fails++;
    }
    printf("  %s\n", fails ? "FAIL" : "ok");
    return fails;
}

int main(int argc, char **argv) {
    const int which = argc > 1 ? atoi(argv[1]) : -1;
    const Case cases[] = {
        /* decode, Llama 1B heads (GQA 4), contexts across 1..300, splits merged in the kernel */
        {{1, 1, 1, 1, 1}, {1, 17, 64, 130, 300}, 32, 8, 64, 16, 64, true, -1},
        /* the same through k_paged_reduce */
        {{1, 1, 1}, {5, 64, 200}, 32, 8, 64, 16, 128, false, -1},
        /* a group of 16 heads, head_dim 128, one split over 200 keys */
        {{1, 1}, {200, 77}, 16, 1, 128, 16, 0, true, -1},
        /* a group of 32: two head chunks; a prefill chunk of 3 rows beside a decode row; block size 12 */
        {{3, 1}, {40, 100}, 32, 1, 64, 12, 64, true, -1},
        /* multi-head (a group of 1, GPT-2), a bad block id in sequence 1's table */
        {{1, 1}, {90, 150}, 4, 4, 64, 16, 64, true, 1},
        /* a prefill of 70 rows (every row's own prefix) at head_dim 128, GQA 2 */
        {{70}, {70}, 4, 2, 128, 16, 0, true, -1},
        /* chunked prefill after a cached prefix, Llama 1B heads (GQA 4: 16 tokens a tile), beside decode rows */
        {{1, 37, 1, 20}, {50, 200, 9, 20}, 32, 8, 128, 16, 0, true, -1},
        /* GPT-2 heads (a group of 1: 128 tokens a tile at head_dim 64), a prompt over two tiles, block size 12 */
        {{150, 2}, {150, 90}, 4, 4, 64, 12, 0, true, -1},
        /* a chunk of 20 over a cached prefix of 180, GQA 4: its first tiles are open to every row, and a bad block
           id in the first */
        {{20, 1}, {200, 90}, 8, 2, 64, 16, 0, true, 0},
        /* a group of 3 (42 tokens a tile, two rows left over) and a bad block id in a prefilling sequence */
        {{50, 5}, {50, 70}, 6, 2, 64, 16, 0, true, 1},
    };
    /* a group of 32 (four tokens a tile); 140 sequences, so the tile search takes two passes, the prefill last */
    Case many{std::vector<int>(139, 1), std::vector<int>(139, 3), 32, 1, 64, 16, 0, true, -1};
    many.ql.push_back(5);
    many.ctx.push_back(12);
    std::vector<Case> all(std::begin(cases), std::end(cases));
    all.push_back(many);
    int fails = 0, n = 0;
    for (const Case &c : all) {
        if (which < 0 || which == n) {
            fails += run_case(c, 0);
            fails += run_case(c, 1);
            int N = 0;
            for (int q : c.ql) N += q;
            if (N > (int)c.ql.size()) fails += run_case(c, 2);
        }
        n++;
    }
    printf("%d failed\n", fails);
    return fails != 0;
}
