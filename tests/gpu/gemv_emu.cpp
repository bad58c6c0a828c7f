/* CPU emulation of the decode-step products of kernels/gemv.cu (k_gemv
 * and the SwiGLU pair k_gemv_swiglu: up to 4 rows on the CUDA cores), to
 * check the lanes' chunk walk, the warps that share a long row (KS), the
 * tails of K and the epilogues on a machine without a GPU (not a
 * substitute for tests/gpu/test_cuda_ops on a GPU). tests/gpu/gemv_emu.sh
 * extracts the kernels into kern.inc and compiles this file with
 * g++ -std=c++20.
 *
 * Each block runs as 256 fibers (emu_cuda.h, emu_mma.h), blocks one after
 * another in reverse order. The reference sums the same 16-bit x and W in
 * double. Pass: every output within one unit in the last place of its
 * dtype at the reference, plus 1e-5 of the sum of the terms' magnitudes
 * (f32 accumulation); the columns past M of the output rows never
 * written; each SwiGLU pair bit for bit the two products and the SwiGLU
 * of their rounded outputs, as the kernel's comment promises.
 *   tests/gpu/gemv_emu.sh */
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
/* the kernels' C interface (cuk_mat, the dtype codes), over the stub
 * cuda_runtime.h that emu_common.sh writes */
#include "cuda_kernels.h"
#include "emu_mma.h"

#define __shared__ static
static inline uint4 __ldcs(const uint4 *p) { return *p; }
static inline uint4 __ldg(const uint4 *p) { return *p; }
#include "kern.inc"

static int g_fail, g_cases;

struct Prob {
    int dt; /* CUK_BF16 or CUK_F16 */
    int64_t N, M, K;
    int bias;     /* 0 none, 1 f32, 2 the data's dtype */
    int residual; /* 0 none, 1 separate, 2 in place (r = y) */
};

/* the kernels' own conversions (cuda_common.cuh) */
static float to_f(int dt, uint16_t h) { return dt == CUK_F16 ? cuk_f16_to_f32(h) : cuk_bf16_to_f32(h); }
static uint16_t from_f(int dt, float v) {
    return (uint16_t)(dt == CUK_F16 ? cuk_f32_to_f16_mode(v, 0, 0) : cuk_f32_to_bf16(v));
}

struct Data {
    Prob p;
    std::vector<uint16_t> x, w0, w1, r, y; /* x [N, K + 8] (a strided view), W [M, K], r and y [N, M + 3] */
    std::vector<float> bf;
    std::vector<uint16_t> bh;
    int64_t xld, yld;
    explicit Data(const Prob &q) : p(q) {
        std::mt19937 rng((unsigned)(q.N * 1000003 + q.M * 101 + q.K));
        std::normal_distribution<float> nd(0, 1);
        xld = q.K + 8;
        yld = q.M + 3;
        x.resize((size_t)(q.N * xld));
        w0.resize((size_t)(q.M * q.K));
        w1.resize(w0.size());
        r.resize((size_t)(q.N * yld));
        bf.resize((size_t)q.M);
        bh.resize((size_t)q.M);
        const float ws = 1.0f / std::sqrt((float)q.K);
        for (auto &v : x) v = from_f(q.dt, nd(rng));
        for (auto &v : w0) v = from_f(q.dt, nd(rng) * ws);
        for (auto &v : w1) v = from_f(q.dt, nd(rng) * ws);
        for (auto &v : r) v = from_f(q.dt, nd(rng));
        for (size_t i = 0; i < bf.size(); i++) bh[i] = from_f(q.dt, bf[i] = nd(rng));
        y.assign(r.size(), 0x7fff); /* NaN in both formats: unwritten */
        if (q.residual == 2) y = r;
    }
    cuk_mat mx() { return cuk_mat{x.data(), p.N, p.K, xld, p.dt}; }
    cuk_mat mw(int i) { return cuk_mat{i ? w1.data() : w0.data(), p.M, p.K, p.K, p.dt}; }
    cuk_mat my() { return cuk_mat{y.data(), p.N, p.M, yld, p.dt}; }
    cuk_mat mr() {
        if (!p.residual) return cuk_mat{};
        return p.residual == 2 ? my() : cuk_mat{r.data(), p.N, p.M, yld, p.dt};
    }
    const void *bias() const { return p.bias == 1 ? (const void *)bf.data() : p.bias == 2 ? bh.data() : nullptr; }
    int bias_dt() const { return p.bias == 2 ? p.dt : CUK_F32; }
    /* x[n] . W[o] in double, and the sum of the terms' magnitudes */
    double dot(int wi, int64_t n, int64_t o, double *mag) const {
        const std::vector<uint16_t> &w = wi ? w1 : w0;
        double s = 0, a = 0;
        for (int64_t k = 0; k < p.K; k++) {
            const double t = (double)to_f(p.dt, x[(size_t)(n * xld + k)]) * to_f(p.dt, w[(size_t)(o * p.K + k)]);
            s += t;
            a += std::fabs(t);
        }
        *mag = a;
        return s;
    }
};

static bool close_to(int dt, float got, double want, double mag) {
    const double ulp = std::ldexp(1.0, std::ilogb(std::fabs(want) + 1e-30) - (dt == CUK_F16 ? 10 : 7));
    return std::fabs((double)got - want) <= ulp + 1e-5 * mag;
}

static void report(const char *what, int bad) {
    g_cases++;
    if (bad) g_fail++;
    printf("%s %s\n", bad ? "FAIL" : "ok  ", what);
}

template <class K> static void launch(unsigned grid, K kern) {
    gridDim = dim3(grid);
    blockDim = dim3(256);
    for (int64_t b = (int64_t)grid - 1; b >= 0; b--) {
        auto blk = std::make_unique<Block>(256);
        g_blk = blk.get();
        blockIdx = dim3((unsigned)b);
        emu::run_block(256, kern);
    }
}

/* Each output against the double reference (the product, its bias and
 * residual); the padding columns past M untouched (NaN) unless in place;
 * with FP features a warp, bit for bit what one feature a warp gives. */
template <int DT, int NB, int KS, int FP> static void gemv_case(const Prob &p) {
    char what[160];
    snprintf(what, sizeof what, "k_gemv %s N %ld M %ld K %ld KS %d FP %d bias %d residual %d",
             DT == CUK_F16 ? "f16" : "bf16", (long)p.N, (long)p.M, (long)p.K, KS, FP, p.bias, p.residual);
    Data d(p);
    const std::vector<uint16_t> r0 = p.residual == 2 ? d.y : d.r;
    const cuk_mat y = d.my(), x = d.mx(), w = d.mw(0), r = d.mr();
    const void *b = d.bias();
    const int bdt = d.bias_dt(), N = (int)p.N;
    int bad = 0;
    if (FP > 1) {
        launch(gv_grid(p.M, KS, 1), [&] { k_gemv<DT, NB, KS, 1>(y, x, w, b, bdt, r, N); });
        const std::vector<uint16_t> one = d.y;
        if (p.residual == 2) std::copy(r0.begin(), r0.end(), d.y.begin()); /* the views keep pointing at d.y */
        else std::fill(d.y.begin(), d.y.end(), (uint16_t)0x7fff);
        launch(gv_grid(p.M, KS, FP), [&] { k_gemv<DT, NB, KS, FP>(y, x, w, b, bdt, r, N); });
        for (size_t i = 0; i < one.size(); i++)
            if (one[i] != d.y[i] && bad++ < 3) printf("  element %zu differs from one feature a warp\n", i);
    } else {
        launch(gv_grid(p.M, KS, FP), [&] { k_gemv<DT, NB, KS, FP>(y, x, w, b, bdt, r, N); });
    }
    for (int64_t n = 0; n < p.N; n++)
        for (int64_t o = 0; o < d.yld; o++) {
            const uint16_t got = d.y[(size_t)(n * d.yld + o)];
            if (o >= p.M) {
                const uint16_t want = p.residual == 2 ? r0[(size_t)(n * d.yld + o)] : (uint16_t)0x7fff;
                if (got != want && bad++ < 3) printf("  row %ld column %ld past M was written\n", (long)n, (long)o);
                continue;
            }
            double mag, v = d.dot(0, n, o, &mag);
            if (p.bias == 1) v += d.bf[(size_t)o];
            if (p.bias == 2) v += to_f(p.dt, d.bh[(size_t)o]);
            if (p.residual) v += to_f(p.dt, r0[(size_t)(n * d.yld + o)]);
            if (!close_to(p.dt, to_f(p.dt, got), v, mag) && bad++ < 3)
                printf("  row %ld feature %ld: %g, want %g\n", (long)n, (long)o, to_f(p.dt, got), v);
        }
    report(what, bad);
}

/* The pair against the two products (FG features a warp, the same KS)
 * and the SwiGLU, bit for bit, and the double reference. */
template <int DT, int NB, int KS, int FG> static void swiglu_case(int64_t N, int64_t M, int64_t K) {
    char what[160];
    snprintf(what, sizeof what, "k_gemv_swiglu %s N %ld M %ld K %ld KS %d (products FP %d)",
             DT == CUK_F16 ? "f16" : "bf16", (long)N, (long)M, (long)K, KS, FG);
    Data d(Prob{DT, N, M, K, 0, 0});
    const cuk_mat y = d.my(), x = d.mx(), wg = d.mw(0), wu = d.mw(1);
    const int n_ = (int)N;
    launch(gv_grid(M, KS, 1), [&] { k_gemv_swiglu<DT, NB, KS>(y, x, wg, wu, n_); });
    const std::vector<uint16_t> pair = d.y;
    launch(gv_grid(M, KS, FG), [&] { k_gemv<DT, NB, KS, FG>(y, x, wg, nullptr, CUK_F32, cuk_mat{}, n_); });
    const std::vector<uint16_t> g = d.y;
    launch(gv_grid(M, KS, FG), [&] { k_gemv<DT, NB, KS, FG>(y, x, wu, nullptr, CUK_F32, cuk_mat{}, n_); });
    int bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < M; o++) {
            const size_t i = (size_t)(n * d.yld + o);
            const float gg = to_f(DT, g[i]), uu = to_f(DT, d.y[i]);
            const uint16_t want = from_f(DT, gg / (1.0f + expf(-gg)) * uu);
            double mg, mu;
            const double rg = d.dot(0, n, o, &mg), ru = d.dot(1, n, o, &mu);
            if (pair[i] != want && bad++ < 3)
                printf("  row %ld feature %ld: %g, the three steps give %g\n", (long)n, (long)o, to_f(DT, pair[i]),
                       to_f(DT, want));
            if ((!close_to(DT, gg, rg, mg) || !close_to(DT, uu, ru, mu)) && bad++ < 3)
                printf("  row %ld feature %ld: gate %g up %g, want %g %g\n", (long)n, (long)o, gg, uu, rg, ru);
        }
    report(what, bad);
}

int main() {
    /* one row, two, three (NB 4: a row past N unused), four; a row of 25
     * chunks (a lane's tail), rows that 2, 4 and 8 warps share (8192 and
     * 16384 elements: two passes a warp part), bias in f32 and in the
     * data's dtype, residual apart and in place; features past the last
     * block's warps (M 21), and with four features a warp past M within
     * the last warp's four (M 21, 45 and 13) */
    gemv_case<CUK_BF16, 1, 1, 1>({CUK_BF16, 1, 21, 200, 1, 0});
    gemv_case<CUK_BF16, 4, 2, 1>({CUK_BF16, 3, 21, 4104, 2, 2});
    gemv_case<CUK_BF16, 4, 4, 1>({CUK_BF16, 4, 12, 8192, 0, 1});
    gemv_case<CUK_BF16, 2, 8, 1>({CUK_BF16, 2, 5, 16392, 1, 1});
    gemv_case<CUK_F16, 4, 1, 1>({CUK_F16, 4, 21, 264, 0, 1});
    gemv_case<CUK_F16, 2, 2, 1>({CUK_F16, 2, 13, 4104, 2, 2});
    gemv_case<CUK_BF16, 4, 1, 4>({CUK_BF16, 4, 21, 200, 1, 2});
    gemv_case<CUK_BF16, 4, 2, 4>({CUK_BF16, 3, 45, 264, 2, 1});
    gemv_case<CUK_F16, 4, 4, 4>({CUK_F16, 4, 13, 8192, 0, 2});
    gemv_case<CUK_BF16, 4, 8, 4>({CUK_BF16, 3, 21, 16392, 0, 0});
    swiglu_case<CUK_BF16, 4, 1, 1>(4, 21, 1032);
    swiglu_case<CUK_BF16, 1, 4, 1>(1, 12, 8200);
    swiglu_case<CUK_F16, 2, 2, 1>(2, 21, 4104);
    swiglu_case<CUK_BF16, 4, 2, 4>(3, 21, 1032);
    swiglu_case<CUK_BF16, 4, 4, 4>(4, 13, 8200);
    swiglu_case<CUK_F16, 4, 8, 4>(3, 45, 16392);
    printf("%d of %d cases pass\n", g_cases - g_fail, g_cases);
    return g_fail ? 1 : 0;
}
