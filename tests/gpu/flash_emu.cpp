/* CPU emulation of kernels/attention_flash.cu, to check its fragment
 * indexing, masks and pipelining logic on a machine without a GPU (not a
 * substitute for tests/gpu/test_cuda_ops on a GPU). tests/gpu/flash_emu.sh
 * extracts the kernels (everything from the fragment helpers to the
 * launchers) into kern.inc and compiles this file with g++ -std=c++20.
 *
 * Each block runs as 128 fibers (emu_cuda.h); __syncthreads is a barrier;
 * the warp-collective instructions (ldmatrix, ldmatrix.trans,
 * mma.m16n8k16, shfl.xor) exchange operands through per-warp slots and
 * implement the PTX ISA fragment layouts independently of the kernel's
 * helpers. cp.async copies synchronously (so a missing wait is NOT
 * caught). Shared memory starts poisoned with NaNs. The reference is
 * double-precision attention on the same bf16 inputs; pass: relative
 * error < 1e-2 for out/dq/dk/dv, lse within 1e-4 and the same -inf rows.
 *   tests/gpu/flash_emu.sh [case]   (about a minute for all cases on one core) */
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <functional>
#include <memory>
#include "emu_mma.h"
/* the kernels' own C interface (the dtype and error codes, the views),
 * over the stub cuda_runtime.h that emu_common.sh writes */
#include "cuda_kernels.h"
#define FL_NTH 128
#define FL_LOG2E 1.4426950408889634f
#define FL_LN2 0.6931471805599453f
static inline uint16_t cuk_f32_to_bf16(float f) { return f2bf(f); }
struct float2 {
    float x, y;
};
static inline float2 make_float2(float a, float b) { return float2{a, b}; }

static inline uint16_t cuk_f32_to_f16_mode(float, int, int) { abort(); } /* the emulation runs bf16 only */
static inline float ldf(const void *p, int dt, int64_t i) {
    if (dt == CUK_F32) return ((const float *)p)[i];
    return bf2f(((const uint16_t *)p)[i]);
}
static inline void stf(void *p, int dt, int64_t i, float v) {
    if (dt == CUK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = f2bf(v);
}
static inline int64_t cuk_roff(const cuk_bthd &t, int64_t b, int64_t s, int64_t h) {
    return b * t.sb + s * t.st + h * t.sh;
}
static inline bool cuk_visible(const cuk_attn &a, int64_t i, int64_t j) {
    if (!a.causal) return true;
    int64_t lim = i + a.off;
    if (j > lim) return false;
    if (a.window > 0 && j < lim - a.window + 1) return false;
    return true;
}
static inline void cuk_key_span(const cuk_attn &a, int64_t i0, int64_t ilast, int64_t Tk, int64_t *jlo, int64_t *jhi) {
    *jlo = 0;
    *jhi = Tk - 1;
    if (a.causal) {
        if (ilast + a.off < *jhi) *jhi = ilast + a.off;
        if (a.window > 0 && i0 + a.off - a.window + 1 > *jlo) *jlo = i0 + a.off - a.window + 1;
    }
}
static inline void cuk_query_span(const cuk_attn &a, int64_t j0, int64_t jlast, int64_t Tq, int64_t *ilo,
                                  int64_t *ihi) {
    *ilo = 0;
    *ihi = Tq - 1;
    if (a.causal) {
        if (j0 - a.off > *ilo) *ilo = j0 - a.off;
        if (a.window > 0 && jlast - a.off + a.window - 1 < *ihi) *ihi = jlast - a.off + a.window - 1;
    }
}

template <class A, class B, class C> static int cuk_smem_limits(A *, size_t, B *, size_t, C *, size_t) { return 0; }
#include "kern.inc"
#include <random>
#include <algorithm>

template <class F> static void launch(int64_t nblocks, size_t smem, F f) {
    for (int64_t bi = 0; bi < nblocks; bi++) {
        auto blk = std::make_unique<Block>();
        std::vector<unsigned char> sm(smem + 128, 0xff); /* NaN poison */
        unsigned char *base = (unsigned char *)(((uintptr_t)sm.data() + 127) & ~(uintptr_t)127);
        blockIdx = {(unsigned)bi, 0, 0};
        blockDim = {128, 1, 1};
        g_blk = blk.get();
        g_smem = base;
        emu::run_block(128, f);
    }
}

static double maxrel(const std::vector<float> &got, const std::vector<double> &ref, const char *what) {
    double mx = 0, me = 0;
    int64_t bad = -1;
    for (size_t i = 0; i < ref.size(); i++) {
        mx = std::max(mx, std::fabs(ref[i]));
        double e = std::fabs(got[i] - ref[i]);
        if (!(e <= me)) {
            if (std::isnan(e) && bad < 0) bad = i;
            if (!std::isnan(e)) me = e;
        }
    }
    double r = mx > 0 ? me / mx : me;
    printf("  %-6s err %.2e%s\n", what, r, bad >= 0 ? "  NaN!" : "");
    return bad >= 0 ? 1e9 : r;
}

static int run_case(int B, int Tq, int Tk, int Hq, int Hkv, int D, int causal, int64_t off, int64_t window,
                    bool fused) {
    printf("case B%d T%d/%d H%d/%d D%d causal %d off %lld win %lld fused %d\n", B, Tq, Tk, Hq, Hkv, D, causal,
           (long long)off, (long long)window, fused);
    std::mt19937 rng(B * 1000 + Tq + D);
    std::normal_distribution<float> nd(0, 1);
    auto mk = [&](int T, int H, std::vector<uint16_t> &buf, cuk_bthd &t, int64_t rowlen, int64_t coloff, bool own) {
        if (own) {
            buf.resize((size_t)B * T * H * D);
            for (auto &x : buf) x = f2bf(nd(rng));
            rowlen = H * D;
            coloff = 0;
        }
        t = cuk_bthd{buf.data() + coloff, B, T, H, D, (int64_t)T * rowlen, rowlen, D, CUK_BF16};
    };
    std::vector<uint16_t> qb, kb, vb, gb, fb;
    cuk_bthd q, k, v, g;
    if (fused) {
        int64_t W = (Hq + 2 * Hkv) * D;
        fb.resize((size_t)B * Tq * W);
        for (auto &x : fb) x = f2bf(nd(rng));
        mk(Tq, Hq, fb, q, W, 0, false);
        mk(Tk, Hkv, fb, k, W, Hq * D, false);
        mk(Tk, Hkv, fb, v, W, (Hq + Hkv) * D, false);
    } else {
        mk(Tq, Hq, qb, q, 0, 0, true);
        mk(Tk, Hkv, kb, k, 0, 0, true);
        mk(Tk, Hkv, vb, v, 0, 0, true);
    }
    mk(Tq, Hq, gb, g, 0, 0, true);
    cuk_attn a{1.0f / std::sqrt((float)D), causal, off, window, 1};
    std::vector<float> o((size_t)B * Tq * Hq * D, NAN), lse((size_t)B * Hq * Tq, NAN), dq((size_t)B * Tq * Hq * D, NAN),
        dk((size_t)B * Tk * Hkv * D, NAN), dv((size_t)B * Tk * Hkv * D, NAN), dvec((size_t)B * Hq * Tq);
    cuk_bthd to{o.data(), B, Tq, Hq, D, (int64_t)Tq * Hq * D, Hq * D, D, CUK_F32};
    cuk_bthd tdq{dq.data(), B, Tq, Hq, D, (int64_t)Tq * Hq * D, Hq * D, D, CUK_F32};
    cuk_bthd tdk{dk.data(), B, Tk, Hkv, D, (int64_t)Tk * Hkv * D, Hkv * D, D, CUK_F32};
    cuk_bthd tdv{dv.data(), B, Tk, Hkv, D, (int64_t)Tk * Hkv * D, Hkv * D, D, CUK_F32};
    float sl2 = a.scale * FL_LOG2E;
    int64_t ntq = (Tq + 63) / 64, ntk = (Tk + 63) / 64;
    if (D == 64) {
        launch(B * Hq * ntq, fl_fwd_smem<64>(), [&] { k_fl_fwd<64, false>(to, lse.data(), q, k, v, a, ntq, sl2); });
    } else {
        launch(B * Hq * ntq, fl_fwd_smem<128>(), [&] { k_fl_fwd<128, false>(to, lse.data(), q, k, v, a, ntq, sl2); });
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < Tq; i++) {
                double s = 0;
                for (int d = 0; d < D; d++)
                    s += (double)ldf(g.p, 1, cuk_roff(g, b, i, h) + d) * o[cuk_roff(to, b, i, h) + d];
                dvec[((size_t)b * Hq + h) * Tq + i] = (float)s;
            }
    if (D == 64) {
        launch(B * Hkv * ntk, fl_kv_smem<64, 32>(),
               [&] { k_fl_bwd_kv<64, 32, false>(tdk, tdv, g, q, k, v, lse.data(), dvec.data(), a, ntk, sl2); });
        launch(B * Hq * ntq, fl_q_smem<64>(),
               [&] { k_fl_bwd_q<64, false>(tdq, g, q, k, v, lse.data(), dvec.data(), a, ntq, sl2); });
    } else {
        launch(B * Hkv * ntk, fl_kv_smem<128, 32>(),
               [&] { k_fl_bwd_kv<128, 32, false>(tdk, tdv, g, q, k, v, lse.data(), dvec.data(), a, ntk, sl2); });
        launch(B * Hq * ntq, fl_q_smem<128>(),
               [&] { k_fl_bwd_q<128, false>(tdq, g, q, k, v, lse.data(), dvec.data(), a, ntq, sl2); });
    }
    // reference in double
    std::vector<double> ro(o.size(), 0), rl(lse.size()), rdq(dq.size(), 0), rdk(dk.size(), 0), rdv(dv.size(), 0);
    int grp = Hq / Hkv;
    auto L = [&](const cuk_bthd &t, int b, int i, int h, int d) {
        return (double)ldf(t.p, 1, cuk_roff(t, b, i, h) + d);
    };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int hk = h / grp;
            for (int i = 0; i < Tq; i++) {
                std::vector<double> s(Tk, -INFINITY);
                double mx = -INFINITY;
                for (int j = 0; j < Tk; j++)
                    if (cuk_visible(a, i, j)) {
                        double x = 0;
                        for (int d = 0; d < D; d++) x += L(q, b, i, h, d) * L(k, b, j, hk, d);
                        s[j] = x * a.scale;
                        mx = std::max(mx, s[j]);
                    }
                size_t li = ((size_t)b * Hq + h) * Tq + i;
                if (mx == -INFINITY) {
                    rl[li] = -INFINITY;
                    continue;
                }
                double sum = 0;
                for (int j = 0; j < Tk; j++)
                    if (s[j] > -INFINITY) sum += std::exp(s[j] - mx);
                rl[li] = mx + std::log(sum);
                std::vector<double> p(Tk, 0);
                for (int j = 0; j < Tk; j++)
                    if (s[j] > -INFINITY) p[j] = std::exp(s[j] - rl[li]);
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (int j = 0; j < Tk; j++) acc += p[j] * L(v, b, j, hk, d);
                    ro[cuk_roff(to, b, i, h) + d] = acc;
                }
                double Di = 0;
                for (int d = 0; d < D; d++) Di += L(g, b, i, h, d) * ro[cuk_roff(to, b, i, h) + d];
                for (int j = 0; j < Tk; j++) {
                    if (p[j] == 0) continue;
                    double dp = 0;
                    for (int d = 0; d < D; d++) dp += L(g, b, i, h, d) * L(v, b, j, hk, d);
                    double ds = p[j] * (dp - Di);
                    for (int d = 0; d < D; d++) {
                        rdq[cuk_roff(tdq, b, i, h) + d] += a.scale * ds * L(k, b, j, hk, d);
                        rdk[cuk_roff(tdk, b, j, hk) + d] += a.scale * ds * L(q, b, i, h, d);
                        rdv[cuk_roff(tdv, b, j, hk) + d] += p[j] * L(g, b, i, h, d);
                    }
                }
            }
        }
    // lse: compare with -inf handled
    int lbad = 0;
    double lerr = 0;
    for (size_t i = 0; i < rl.size(); i++) {
        if (std::isinf(rl[i]) || std::isinf(lse[i])) {
            if (rl[i] != lse[i]) lbad++;
        } else lerr = std::max(lerr, std::fabs(rl[i] - lse[i]));
    }
    printf("  lse    abs err %.2e, inf mismatches %d\n", lerr, lbad);
    double e = std::max({maxrel(o, ro, "out"), maxrel(dq, rdq, "dq"), maxrel(dk, rdk, "dk"), maxrel(dv, rdv, "dv")});
    bool ok = e < 1e-2 && lbad == 0 && lerr < 1e-4;
    printf("  %s\n", ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    int fails = 0;
    int which = argc > 1 ? atoi(argv[1]) : -1;
    int c = 0;
#define CASE(...)                                                \
    if (which < 0 || which == c) fails += run_case(__VA_ARGS__); \
    c++;
    CASE(1, 77, 77, 2, 1, 64, 1, 0, 0, true)
    CASE(1, 130, 130, 2, 2, 128, 1, 0, 0, true)
    CASE(1, 40, 70, 2, 2, 128, 0, 0, 0, false)
    CASE(1, 100, 150, 2, 1, 64, 1, 50, 40, false)
    CASE(1, 70, 70, 1, 1, 128, 1, -5, 0, false)
    CASE(1, 200, 200, 2, 2, 128, 1, 0, 70, true)
    CASE(1, 150, 90, 2, 1, 64, 0, 0, 0, false)
    CASE(1, 129, 129, 4, 1, 64, 1, 3, 0, true)
    CASE(1, 128, 128, 1, 1, 64, 1, 0, 0, false)
    CASE(2, 50, 200, 2, 1, 64, 1, 150, 20, false)
    CASE(1, 100, 100, 2, 2, 128, 1, -70, 0, false)
    CASE(2, 65, 65, 6, 2, 64, 1, 0, 0, true)
    CASE(1, 150, 150, 2, 1, 64, 1, -70, 0, false)
    CASE(1, 130, 200, 4, 2, 64, 0, 0, 0, false)
    CASE(1, 100, 160, 2, 1, 128, 1, 60, 50, false)
    printf("%d failed\n", fails);
    return fails != 0;
}
