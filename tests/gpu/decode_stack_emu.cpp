/* CPU emulation of kernels/decode_stack.cu (tests/gpu/decode_stack_emu.sh).
 *
 * A decode token goes through a small stack of Llama layers twice: as the
 * separate kernels decode_stack_fwd is defined by (what the CUDA ops launch
 * for one token: k_norm_fwd_reg, k_gemv, k_rope_kv_write, k_paged_pipe with
 * the group size the launcher picks, k_gemv_swiglu), each grid run block by
 * block, and as k_decode_stack over a grid whose blocks run together (its
 * grid barriers need every block resident). The residual stream and every
 * layer's caches must agree bit for bit, so the fused kernel's indexing,
 * phases, barriers and prefetches are checked without a GPU; test_cuda_ops
 * checks the same on a GPU. The kernels' text comes from kernels/ through
 * emu_extract.py. */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "emu_cuda.h"

#include "cuda_kernels.h"

#define __grid_constant__
#define __noinline__

template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcs(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
static inline void __threadfence() {}
/* fibers switch only where a thread waits, so a read-modify-write is atomic */
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned o = *p;
    *p = o + v;
    return o;
}
static inline void cuk_report(cuk_errrec *e, int code, int64_t a, int64_t b, int64_t c, int64_t d) {
    if (e && e->code == 0) *e = cuk_errrec{code, 0, a, b, c, d};
}
static inline int64_t cuk_roff(const cuk_bthd &t, int64_t b, int64_t s, int64_t h) {
    return b * t.sb + s * t.st + h * t.sh;
}

// ---- block / warp machinery: a block's barriers and shared memory
using emu::Warp;
struct Block {
    std::unique_ptr<emu::Barrier> bar;
    Warp w[8];
    alignas(16) unsigned char big[48 * 1024]; /* a kernel's static shared memory */
    alignas(16) unsigned char dyn[16 * 1024]; /* its dynamic shared memory */
    float gv_sm[2 * 8 * 8];
    int last;
};
static std::vector<std::unique_ptr<Block>> g_blocks;
static Block *g_blk;

static inline void __syncthreads() { g_blk->bar->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int m) {
    return emu::shfl_xor(g_blk->w[threadIdx.x >> 5], threadIdx.x & 31, v, m);
}
/* cuda_common.cuh's warp_reduce order */
static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(~0u, v, o);
    return v;
}
static inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
    return v;
}

#include "kern.inc"

static void on_block(unsigned b) {
    g_blk = g_blocks[b].get();
    g_smem = g_blk->dyn;
}

/* Fresh blocks with shared memory poisoned (NaN bytes): a read of what no
 * thread wrote shows. */
static void make_blocks(unsigned n, unsigned nthreads) {
    g_blocks.clear();
    for (unsigned b = 0; b < n; b++) {
        auto blk = std::make_unique<Block>();
        blk->bar = std::make_unique<emu::Barrier>((int)nthreads);
        memset(blk->big, 0xff, sizeof blk->big);
        memset(blk->dyn, 0xff, sizeof blk->dyn);
        g_blocks.push_back(std::move(blk));
    }
}

/* A grid whose blocks run one after another (kernels that do not wait on each other). */
template <class F> static void launch(dim3 grid, unsigned nthreads, F body) {
    gridDim = grid;
    blockDim = dim3(nthreads);
    const std::function<void()> fn = body;
    for (unsigned y = 0; y < grid.y; y++)
        for (unsigned x = 0; x < grid.x; x++) {
            make_blocks(1, nthreads);
            on_block(0);
            blockIdx = dim3(x, y);
            emu::run_block(nthreads, fn);
        }
}

/* A grid whose blocks run together (a cooperative launch). */
template <class F> static void launch_together(unsigned nblocks, unsigned nthreads, F body) {
    gridDim = dim3(nblocks);
    blockDim = dim3(nthreads);
    make_blocks(nblocks, nthreads);
    emu::g_on_block = on_block;
    emu::run_grid(nblocks, nthreads, body);
    emu::g_on_block = nullptr;
}

// ---- data
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand() { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}
template <int DT> static uint16_t h16(float f) {
    return DT == CUK_BF16 ? cuk_f32_to_bf16(f) : cuk_f32_to_f16_mode(f, 0, 0);
}
template <int DT> static std::vector<uint16_t> rnd16(size_t n, float scale) {
    std::vector<uint16_t> v(n);
    for (auto &e : v) e = h16<DT>(scale * urand());
    return v;
}

struct Case {
    int L;
    int64_t C, Hq, Hkv, D, F, bs, ctx, max_ctx, splits, chunk;
    unsigned blocks; /* the fused kernel's grid */
};

struct Layer {
    std::vector<uint16_t> ln1, ln2, qkv, proj, gate, up, down, kc, vc;
};

static cuk_mat mat(void *p, int64_t rows, int64_t cols, int dt) { return cuk_mat{p, rows, cols, cols, dt}; }

/* The separate kernels of one layer, launched as the CUDA ops launch them for one token. */
template <int DT, int DMAX, int GH>
static void paged_grid(const cuk_paged &p, const Case &c, int nhc, int bs_log2, float *ws, unsigned *cnt,
                       cuk_errrec *err) {
    float *wa = c.splits > 1 ? ws : nullptr, *wm = c.splits > 1 ? ws + c.Hq * c.splits * c.D : nullptr;
    launch(dim3((unsigned)(c.Hkv * nhc), (unsigned)c.splits), PG_NT, [&] {
        k_paged_pipe<DT, DMAX, GH>(p, c.splits, c.chunk, nhc, bs_log2, wa, wm, c.splits > 1 ? cnt : nullptr, err);
    });
}

template <int DT, int K> static void norm_k(cuk_mat y, float *rstd, cuk_mat x, const void *w, float eps) {
    launch(dim3(1), 32 * NW, [&] { k_norm_fwd_reg<DT, K, true>(y, nullptr, rstd, x, w, DT, nullptr, 0, eps); });
}
/* cuk_norm_fwd_fast's choice for one row: k_norm_fwd_reg up to 8 chunks a lane, else k_norm_fwd */
template <int DT> static void norm(cuk_mat y, float *rstd, cuk_mat x, const void *w, float eps) {
    const int64_t k = ((x.cols + 7) / 8 + 31) / 32;
    if (k > 8)
        launch(dim3(1), 32 * ROWS_PER_BLOCK, [&] { k_norm_fwd(y, nullptr, rstd, x, w, DT, nullptr, 0, eps, 1); });
    else if (k <= 1) norm_k<DT, 1>(y, rstd, x, w, eps);
    else if (k <= 2) norm_k<DT, 2>(y, rstd, x, w, eps);
    else if (k <= 3) norm_k<DT, 3>(y, rstd, x, w, eps);
    else if (k <= 4) norm_k<DT, 4>(y, rstd, x, w, eps);
    else if (k <= 6) norm_k<DT, 6>(y, rstd, x, w, eps);
    else norm_k<DT, 8>(y, rstd, x, w, eps);
}

/* k_gemv (w1 NULL) or k_gemv_swiglu over the launcher's grid for the row split KS. */
template <int DT, int KS> static void gemv_ks(cuk_mat y, cuk_mat x, cuk_mat w, cuk_mat w1, cuk_mat r) {
    launch(dim3((unsigned)((w.rows + 8 / KS - 1) / (8 / KS))), GV_WARPS * 32, [&] {
        if (w1.p) k_gemv_swiglu<DT, 1, KS>(y, x, w, w1, 1);
        else k_gemv<DT, 1, KS>(y, x, w, nullptr, 0, r, 1);
    });
}
template <int DT> static void gemv(cuk_mat y, cuk_mat x, cuk_mat w, cuk_mat w1, cuk_mat r) {
    switch (ds_parts(w.cols)) {
    case 1: return gemv_ks<DT, 1>(y, x, w, w1, r);
    case 2: return gemv_ks<DT, 2>(y, x, w, w1, r);
    case 4: return gemv_ks<DT, 4>(y, x, w, w1, r);
    default: return gemv_ks<DT, 8>(y, x, w, w1, r);
    }
}

template <int DT, int DMAX> static int run_case(int idx, const Case &c) {
    const int64_t C = c.C, Hq = c.Hq, Hkv = c.Hkv, D = c.D, F = c.F, QKV = (Hq + 2 * Hkv) * D;
    const int64_t nb = (c.ctx + c.bs - 1) / c.bs, n_blocks = nb + 3, max_blocks = nb + 1;
    const int64_t cache = n_blocks * c.bs * Hkv * D;
    std::vector<Layer> ly(c.L);
    for (auto &y : ly) {
        y.ln1 = rnd16<DT>(C, 1.0f);
        y.ln2 = rnd16<DT>(C, 1.0f);
        y.qkv = rnd16<DT>(QKV * C, 1.7f / sqrtf((float)C));
        y.proj = rnd16<DT>(C * Hq * D, 1.7f / sqrtf((float)(Hq * D)));
        y.gate = rnd16<DT>(F * C, 1.7f / sqrtf((float)C));
        y.up = rnd16<DT>(F * C, 1.7f / sqrtf((float)C));
        y.down = rnd16<DT>(C * F, 1.7f / sqrtf((float)F));
        y.kc = rnd16<DT>(cache, 1.0f);
        y.vc = rnd16<DT>(cache, 1.0f);
    }
    const std::vector<uint16_t> x0 = rnd16<DT>(C, 1.0f);
    std::vector<int32_t> bt(max_blocks, -1);
    for (int64_t b = 0; b < nb; b++) bt[b] = (int32_t)((b * 7 + 2) % n_blocks); /* scattered, distinct */
    const int32_t pos = (int32_t)(c.ctx - 1), slot = (int32_t)(bt[pos / c.bs] * c.bs + pos % c.bs);
    const int32_t qs[2] = {0, 1}, cl[1] = {(int32_t)c.ctx};
    std::vector<float> cs(c.max_ctx * D / 2), sn(c.max_ctx * D / 2);
    for (int64_t r = 0; r < c.max_ctx; r++) /* k_rope_tables */
        for (int64_t i = 0; i < D / 2; i++) {
            const double ang = (double)r * pow(10000.0, -(double)(2 * i) / (double)D);
            cs[r * D / 2 + i] = (float)cos(ang);
            sn[r * D / 2 + i] = (float)sin(ang);
        }
    const float eps = 1e-5f;
    const int G = (int)(Hq / Hkv), nhc = (G + 3) / 4;
    int bs_log2 = -1;
    if ((c.bs & (c.bs - 1)) == 0)
        for (bs_log2 = 0; (1ll << bs_log2) < c.bs; bs_log2++) continue;

    /* ---- the separate kernels */
    std::vector<Layer> sep = ly;
    std::vector<uint16_t> x = x0, ln(C), qkv(QKV), att(Hq * D), g(F), u(F), act(F);
    std::vector<float> rstd(1), ws(Hq * c.splits * (D + 2) + 64);
    std::vector<unsigned> cnt(CUK_PAGED_FUSE_SPLITS * 8 + 64, 0u), bar(2, 0u);
    cuk_errrec err{};
    const cuk_mat none{};
    const cuk_bthd qk{qkv.data(), 1, 1, Hq + Hkv, D, QKV, QKV, D, DT};
    const cuk_bthd vv{qkv.data() + (Hq + Hkv) * D, 1, 1, Hkv, D, QKV, QKV, D, DT};
    const cuk_bthd qv{qkv.data(), 1, 1, Hq, D, QKV, QKV, D, DT}, ov{att.data(), 1, 1, Hq, D, Hq * D, Hq * D, D, DT};
    const cuk_mat csm{cs.data(), c.max_ctx, D / 2, D / 2, CUK_F32}, snm{sn.data(), c.max_ctx, D / 2, D / 2, CUK_F32};
    const int64_t reach = max_blocks * c.bs;
    cuk_paged p{qv,
                ov,
                nullptr,
                nullptr,
                DT,
                n_blocks,
                c.bs,
                Hkv,
                bt.data(),
                qs,
                cl,
                1,
                max_blocks,
                c.max_ctx < reach ? c.max_ctx : reach,
                1.0f / sqrtf((float)D)};
    for (int l = 0; l < c.L; l++) {
        Layer &y = sep[l];
        norm<DT>(mat(ln.data(), 1, C, DT), rstd.data(), mat(x.data(), 1, C, DT), y.ln1.data(), eps);
        gemv<DT>(mat(qkv.data(), 1, QKV, DT), mat(ln.data(), 1, C, DT), mat(y.qkv.data(), QKV, C, DT), none, none);
        const int64_t work = (Hq + Hkv) * (D / 16) + Hkv * (D / 8);
        launch(dim3((unsigned)((work + 127) / 128)), 128, [&] {
            k_rope_kv_write<DT>(qk, vv, csm, snm, &pos, 1.0f, y.kc.data(), y.vc.data(), DT, n_blocks * c.bs, &slot,
                                &err);
        });
        p.kc = y.kc.data();
        p.vc = y.vc.data();
        if (G <= 1) paged_grid<DT, DMAX, 1>(p, c, nhc, bs_log2, ws.data(), cnt.data(), &err);
        else if (G <= 2) paged_grid<DT, DMAX, 2>(p, c, nhc, bs_log2, ws.data(), cnt.data(), &err);
        else paged_grid<DT, DMAX, 4>(p, c, nhc, bs_log2, ws.data(), cnt.data(), &err);
        gemv<DT>(mat(x.data(), 1, C, DT), mat(att.data(), 1, Hq * D, DT), mat(y.proj.data(), C, Hq * D, DT), none,
                 mat(x.data(), 1, C, DT));
        norm<DT>(mat(ln.data(), 1, C, DT), rstd.data(), mat(x.data(), 1, C, DT), y.ln2.data(), eps);
        gemv<DT>(mat(act.data(), 1, F, DT), mat(ln.data(), 1, C, DT), mat(y.gate.data(), F, C, DT),
                 mat(y.up.data(), F, C, DT), none);
        gemv<DT>(mat(x.data(), 1, C, DT), mat(act.data(), 1, F, DT), mat(y.down.data(), C, F, DT), none,
                 mat(x.data(), 1, C, DT));
    }
    const std::vector<uint16_t> x_sep = x;

    /* ---- the one launch, from the same start */
    std::vector<Layer> fus = ly;
    x = x0;
    std::fill(cnt.begin(), cnt.end(), 0u);
    auto a = std::make_unique<cuk_dstack>();
    *a = cuk_dstack{};
    a->L = c.L;
    a->dt = DT;
    a->wdt = DT;
    a->C = C;
    a->F = F;
    a->eps = eps;
    a->x = x.data();
    a->qkv = qkv.data();
    a->att = att.data();
    a->act = act.data();
    a->qk = qk;
    a->v = vv;
    a->cos = csm;
    a->sin = snm;
    a->pos = &pos;
    a->slots = &slot;
    a->n_slots = n_blocks * c.bs;
    a->attn = p;
    a->splits = c.splits;
    a->chunk = c.chunk;
    a->n_cnt = (int64_t)cnt.size();
    a->nhc = nhc;
    a->bs_log2 = bs_log2;
    a->ws = ws.data();
    a->cnt = cnt.data();
    a->bar = bar.data();
    a->err = &err;
    for (int l = 0; l < c.L; l++) {
        Layer &y = fus[l];
        a->layer[l] = cuk_dlayer{y.ln1.data(), y.ln2.data(),  y.qkv.data(), y.proj.data(), y.gate.data(),
                                 y.up.data(),  y.down.data(), y.kc.data(),  y.vc.data()};
    }
    const cuk_dstack &ar = *a;
    launch_together(c.blocks, DS_NT, [&] { k_decode_stack<DT, DMAX, 4>(ar); });

    int bad = 0, finite = 1, moved = 0;
    for (int64_t i = 0; i < C; i++) {
        const float f = DT == CUK_BF16 ? cuk_bf16_to_f32(x_sep[i]) : cuk_f16_to_f32(x_sep[i]);
        finite &= std::isfinite(f);
        moved |= x_sep[i] != x0[i];
    }
    if (x != x_sep) bad++;
    for (int l = 0; l < c.L; l++)
        if (fus[l].kc != sep[l].kc || fus[l].vc != sep[l].vc) bad++;
    if (!finite || !moved || err.code != 0) bad++;
    const bool counters_clear = std::all_of(cnt.begin(), cnt.end(), [](unsigned v) { return v == 0u; }) && bar[0] == 0u;
    if (!counters_clear) bad++;
    printf("case %d: %s L%d C%lld H%lld/%lld D%lld F%lld bs%lld ctx %lld splits %lld, %u blocks: %s%s%s%s\n", idx,
           DT == CUK_BF16 ? "bf16" : "f16", c.L, (long long)C, (long long)Hq, (long long)Hkv, (long long)D,
           (long long)F, (long long)c.bs, (long long)c.ctx, (long long)c.splits, c.blocks,
           bad ? "FAIL" : "ok (bitwise)", x != x_sep ? " [x differs]" : "",
           !finite || !moved ? " [x not finite or unchanged]" : "", err.code ? " [a kernel reported an error]" : "");
    if (!counters_clear) printf("  counters or barrier not left at zero\n");
    for (int l = 0; l < c.L; l++)
        if (fus[l].kc != sep[l].kc || fus[l].vc != sep[l].vc) printf("  layer %d caches differ\n", l);
    return bad != 0;
}

int main(int argc, char **argv) {
    const int only = argc > 1 ? atoi(argv[1]) : -1;
    /* L, C, Hq, Hkv, D, F, bs, ctx, max_ctx, splits, chunk, blocks */
    const Case cases[] = {
        {2, 256, 4, 2, 64, 512, 16, 40, 64, 1, 64, 5},    /* one split; group 2 (the launcher's GH 2) */
        {2, 256, 8, 2, 64, 1024, 16, 150, 256, 4, 64, 7}, /* four splits merged by the last one */
        {1, 512, 4, 1, 128, 8192, 32, 70, 128, 2, 64, 3}, /* D 128, rows of 8192 over 4 warp parts */
        {1, 128, 4, 4, 32, 256, 8, 1, 16, 1, 16, 2},      /* the first token, group 1, D 32 < DMAX */
        {3, 384, 16, 2, 64, 768, 16, 200, 512, 8, 64, 4}, /* group 8 (two head chunks), 8 splits */
        {1, 2304, 4, 2, 64, 512, 16, 20, 64, 1, 64, 3},   /* a norm wider than 2048: k_norm_fwd's order */
    };
    int fails = 0, n = 0;
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        if (only >= 0 && i != only) continue;
        const Case &c = cases[i];
        n++;
        if (i == 2) fails += run_case<CUK_F16, 128>(i, c);
        else fails += run_case<CUK_BF16, 64>(i, c);
    }
    printf("%d of %d cases bitwise equal\n", n - fails, n);
    return fails ? 1 : 0;
}
