/* CPU emulation of the LayerNorm/RMSNorm, cross-entropy and RoPE fast-path
 * kernels (kernels/norm.cu, embed.cu, elementwise.cu), to check their index math,
 * row/chunk ownership, prefetching, partial chunks, shared-memory layouts
 * and reductions on a machine without a GPU (not a substitute for
 * tests/gpu/test_cuda_ops on a GPU). tests/gpu/normxent_emu.sh extracts
 * the kernels and the dtype helpers of cuda_common.cuh into kern.inc.
 *
 * Each block runs as blockDim fibers (emu_cuda.h); __syncthreads is a
 * barrier, shfl.xor exchanges through per-warp slots; shared memory
 * and outputs start poisoned with NaNs; ex2.approx is exp2f. References are
 * double precision on the same stored inputs; f32 outputs within 1e-5 of
 * the largest reference value, f16 2e-3, bf16 1e-2, padding columns
 * untouched, row maxima and target logits exact. */
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "emu_cuda.h"
/* the kernels' own C interface (the dtype and error codes, the views),
 * over the stub cuda_runtime.h that emu_common.sh writes */
#include "cuda_kernels.h"
static inline uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }
static std::mutex g_err_mu;
static inline void cuk_report(cuk_errrec *e, int code, int64_t a, int64_t b, int64_t c, int64_t d) {
    if (!e) return;
    std::lock_guard<std::mutex> g(g_err_mu);
    if (e->code == 0) *e = cuk_errrec{code, 0, a, b, c, d};
}

using emu::Warp;
struct Block {
    emu::Barrier bar;
    std::unique_ptr<Warp[]> w;
    float shm[32], shs[32], shx, shl;
    explicit Block(int n) : bar(n), w(new Warp[n / 32]) {}
};
Block *g_blk;
static inline void __syncthreads() { g_blk->bar.arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int m) {
    return emu::shfl_xor(g_blk->w[threadIdx.x >> 5], threadIdx.x & 31, v, m);
}
static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    return v;
}
static inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
    return v;
}

#include "kern.inc"

template <class F> static void launch(unsigned nblocks, unsigned nthreads, size_t smem, F f) {
    for (unsigned bi = 0; bi < nblocks; bi++) {
        auto blk = std::make_unique<Block>((int)nthreads);
        std::vector<unsigned char> sm(smem + 16, 0xff); /* NaN poison */
        blockIdx = {bi, 0, 0};
        blockDim = {nthreads, 1, 1};
        gridDim = {nblocks, 1, 1};
        g_blk = blk.get();
        g_smem = sm.data();
        emu::run_block(nthreads, f);
    }
}

/* ---------------------------------------------------------------- buffers */

static int esz(int dt) { return dt == CUK_F32 ? 4 : 2; }
static const char *dtname(int dt) { return dt == CUK_F32 ? "f32" : dt == CUK_BF16 ? "bf16" : "f16"; }
static double tol_of(int dt) { return dt == CUK_F32 ? 1e-5 : dt == CUK_BF16 ? 1e-2 : 2e-3; }

struct Buf {
    int dt;
    int64_t n;
    std::vector<unsigned char> b;
    Buf(int dt_, int64_t n_) : dt(dt_), n(n_), b((size_t)n_ * esz(dt_) + 64) { poison(); }
    void *p() { return b.data(); }
    float get(int64_t i) const { return ldf(b.data(), dt, i); }
    void set(int64_t i, float v) { stf(b.data(), dt, i, v); }
    void poison() {
        for (int64_t i = 0; i < n; i++) set(i, NAN);
    }
};

static std::mt19937 g_rng(12345);
static void fill_rand(Buf &b, double scale, double shift = 0.0) {
    std::normal_distribution<float> nd(0, 1);
    for (int64_t i = 0; i < b.n; i++) b.set(i, (float)(nd(g_rng) * scale + shift));
}

static int g_fail = 0, g_pass = 0;
static void expect(bool ok, const char *what) {
    if (ok) g_pass++;
    else {
        g_fail++;
        printf("  FAIL %s\n", what);
    }
}

/* max |got - ref| / max |ref| over rows x cols of a row-major buffer with row stride ld */
static double relerr(const Buf &got, const std::vector<double> &ref, int64_t rows, int64_t cols, int64_t ld) {
    double mx = 0, me = 0;
    bool nan = false;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const double g = got.get(r * ld + c), e = ref[r * cols + c];
            mx = std::fmax(mx, std::fabs(e));
            if (std::isnan(g) != std::isnan(e)) nan = true;
            else if (!std::isnan(g)) me = std::fmax(me, std::fabs(g - e));
        }
    return nan ? 1e30 : mx > 0 ? me / mx : me;
}

static bool padding_nan(const Buf &b, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = cols; c < ld; c++)
            if (!std::isnan(b.get(r * ld + c))) return false;
    return true;
}

static void check(const char *what, double err, double tol) {
    char s[256];
    snprintf(s, sizeof s, "%s: err %.2e (tol %.0e)", what, err, tol);
    if (getenv("EMU_VERBOSE") || !(err <= tol)) printf("  %s\n", s);
    expect(err <= tol, s);
}

/* ---------------------------------------------------------------- norms */

template <int DT, int K>
static void norm_case(int64_t N, int64_t C, int64_t ld, int wdt, bool rms, bool bias, unsigned fgrid, int64_t rpb,
                      bool accum, bool inplace, bool dparams) {
    char name[200];
    snprintf(name, sizeof name, "%s %s K%d N%lld C%lld ld%lld w %s%s grid %u rpb %lld%s%s%s",
             rms ? "rmsnorm" : "layernorm", dtname(DT), K, (long long)N, (long long)C, (long long)ld, dtname(wdt),
             bias ? " bias" : "", fgrid, (long long)rpb, accum ? " +=" : "", inplace ? " in-place" : "",
             dparams ? " dparams" : "");
    Buf x(DT, N * ld), y(DT, N * ld), w(wdt, C), b(wdt, C);
    fill_rand(x, 2.0, 0.5);
    fill_rand(w, 1.0);
    fill_rand(b, 1.0);
    std::vector<float> mean(N, NAN), rstd(N, NAN);
    cuk_mat mx{x.p(), N, C, ld, DT}, my{y.p(), N, C, ld, DT};
    const size_t fsm = (rms ? 1 : 2) * (size_t)K * 64 * 16;
    const float eps = 1e-5f;
    if (rms)
        launch(fgrid, 32 * NW, fsm,
               [&] { k_norm_fwd_reg<DT, K, true>(my, NULL, rstd.data(), mx, w.p(), wdt, NULL, 0, eps); });
    else
        launch(fgrid, 32 * NW, fsm, [&] {
            k_norm_fwd_reg<DT, K, false>(my, mean.data(), rstd.data(), mx, w.p(), wdt, bias ? b.p() : NULL, wdt, eps);
        });
    std::vector<double> ry(N * C), rm(N), rr(N);
    for (int64_t r = 0; r < N; r++) {
        double s = 0, v = 0;
        for (int64_t c = 0; c < C; c++) s += x.get(r * ld + c);
        const double m = rms ? 0.0 : s / C;
        for (int64_t c = 0; c < C; c++) v += (x.get(r * ld + c) - m) * (x.get(r * ld + c) - m);
        const double rs = 1.0 / std::sqrt(v / C + eps);
        rm[r] = m;
        rr[r] = rs;
        for (int64_t c = 0; c < C; c++)
            ry[r * C + c] = (x.get(r * ld + c) - m) * rs * w.get(c) + (bias && !rms ? b.get(c) : 0.0);
    }
    char what[300];
    snprintf(what, sizeof what, "%s fwd out", name);
    check(what, relerr(y, ry, N, C, ld), tol_of(DT));
    snprintf(what, sizeof what, "%s fwd padding untouched", name);
    expect(padding_nan(y, N, C, ld), what);
    double em = 0, er = 0, mm = 0, mr = 0;
    for (int64_t r = 0; r < N; r++) {
        em = std::fmax(em, std::fabs(mean[r] - rm[r]));
        mm = std::fmax(mm, std::fabs(rm[r]));
        er = std::fmax(er, std::fabs(rstd[r] - rr[r]));
        mr = std::fmax(mr, std::fabs(rr[r]));
    }
    if (!rms) {
        snprintf(what, sizeof what, "%s fwd mean", name);
        check(what, em / mm, 1e-5);
    }
    snprintf(what, sizeof what, "%s fwd rstd", name);
    check(what, er / mr, 1e-5);

    /* backward on the same rows, statistics from the forward */
    Buf dy(DT, N * ld), dxb(DT, N * ld);
    fill_rand(dy, 1.0);
    Buf &dx = inplace ? dy : dxb;
    if (accum && !inplace) fill_rand(dx, 1.0);
    std::vector<double> prev(N * C);
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < C; c++) prev[r * C + c] = accum ? dx.get(r * ld + c) : 0.0;
    std::vector<double> dyv(N * C);
    for (int64_t i = 0; i < N * C; i++) dyv[i] = dy.get((i / C) * ld + i % C);
    const int64_t nb = (N + rpb - 1) / rpb;
    std::vector<float> pw(nb * C + 1, NAN), pb(nb * C + 1, NAN), dw0(C), db0(C);
    for (int64_t c = 0; c < C; c++) {
        dw0[c] = (float)(0.25 * (c % 7));
        db0[c] = (float)(-0.5 * (c % 3));
    }
    cuk_mat mdy{dy.p(), N, C, ld, DT}, mdx{dx.p(), N, C, ld, DT};
    const size_t bsm = (size_t)K * 64 * 16 * (1 + (dparams ? 2 * NW : 0));
    float *ppw = dparams ? pw.data() : NULL, *ppb = dparams && !rms ? pb.data() : NULL;
    if (rms)
        launch((unsigned)nb, 32 * NW, bsm,
               [&] { k_norm_bwd_reg<DT, K, true>(mdx, ppw, ppb, mdy, mx, w.p(), wdt, NULL, rstd.data(), accum, rpb); });
    else
        launch((unsigned)nb, 32 * NW, bsm, [&] {
            k_norm_bwd_reg<DT, K, false>(mdx, ppw, ppb, mdy, mx, w.p(), wdt, mean.data(), rstd.data(), accum, rpb);
        });
    std::vector<double> rdx(N * C), rdw(C, 0), rdb(C, 0);
    for (int64_t r = 0; r < N; r++) {
        const double m = rms ? 0.0 : mean[r], rs = rstd[r];
        double sg = 0, sgx = 0;
        for (int64_t c = 0; c < C; c++) {
            const double d = dyv[r * C + c], xh = (x.get(r * ld + c) - m) * rs, g = d * w.get(c);
            sg += g;
            sgx += g * xh;
            rdw[c] += d * xh;
            rdb[c] += d;
        }
        const double mg = rms ? 0.0 : sg / C, mgx = sgx / C;
        for (int64_t c = 0; c < C; c++) {
            const double xh = (x.get(r * ld + c) - m) * rs;
            rdx[r * C + c] = prev[r * C + c] + rs * (dyv[r * C + c] * w.get(c) - mg - xh * mgx);
        }
    }
    snprintf(what, sizeof what, "%s bwd dinp", name);
    check(what, relerr(dx, rdx, N, C, ld), tol_of(DT));
    snprintf(what, sizeof what, "%s bwd dinp padding untouched", name);
    expect(inplace || padding_nan(dx, N, C, ld) || accum, what);
    if (dparams) {
        /* cuk_colsum_final: block partials in block order, in double */
        double ew = 0, mw = 0, eb = 0, mb = 0;
        for (int64_t c = 0; c < C; c++) {
            double sw = 0, sb = 0;
            for (int64_t k = 0; k < nb; k++) {
                sw += pw[k * C + c];
                sb += pb[k * C + c];
            }
            const double gw = (float)((double)dw0[c] + sw), gb = (float)((double)db0[c] + sb);
            ew = std::fmax(ew, std::isnan(gw) ? 1e30 : std::fabs(gw - (dw0[c] + rdw[c])));
            mw = std::fmax(mw, std::fabs(dw0[c] + rdw[c]));
            if (!rms) {
                eb = std::fmax(eb, std::isnan(gb) ? 1e30 : std::fabs(gb - (db0[c] + rdb[c])));
                mb = std::fmax(mb, std::fabs(db0[c] + rdb[c]));
            }
        }
        snprintf(what, sizeof what, "%s bwd dweight", name);
        check(what, ew / mw, 1e-5);
        if (!rms) {
            snprintf(what, sizeof what, "%s bwd dbias", name);
            check(what, eb / mb, 1e-5);
        }
        snprintf(what, sizeof what, "%s bwd partials past the last block untouched", name);
        expect(std::isnan(pw[nb * C]), what);
    }
}

template <int DT, int K> static void norm_shape(int64_t N, int64_t C, int64_t ld) {
    norm_case<DT, K>(N, C, ld, DT, false, true, 3, 32, true, false, true);
    norm_case<DT, K>(N, C, ld, CUK_F32, false, false, 2, 13, false, false, true);
    norm_case<DT, K>(N, C, ld, DT, false, true, 1, 32, false, true, false);
    norm_case<DT, K>(N, C, ld, CUK_F32, true, false, 5, 32, false, false, true);
    norm_case<DT, K>(N, C, ld, DT, true, false, 2, 24, true, false, true);
}

template <int DT> static void norms() {
    norm_shape<DT, 1>(45, 100, 104);
    norm_shape<DT, 2>(40, 300, 304);
    norm_shape<DT, 3>(70, 768, 768);
    norm_shape<DT, 4>(70, 771, 776);
    norm_shape<DT, 4>(33, 1024, 1024);
}

/* ---------------------------------------------------------------- cross-entropy */

/* Logits [N, ld] with V columns (NaN beyond them) and, past row 0, a late
 * large maximum in row 1. */
static void fill_logits(Buf &x, int64_t N, int64_t V, int64_t ld, int64_t ncols) {
    fill_rand(x, 3.0);
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = V; c < ld; c++) x.set(r * ld + c, NAN);
    if (N > 1 && ncols > 40) x.set(1 * ld + ncols - 3, 40.0f);
}

template <int DT>
static void xent_case(int64_t N, int64_t V, int64_t ld, int64_t off, int64_t ncols, std::vector<int32_t> tgt,
                      int strict, bool inplace) {
    char name[200];
    snprintf(name, sizeof name, "xent %s N%lld V%lld ld%lld off %lld ncols %lld%s", dtname(DT), (long long)N,
             (long long)V, (long long)ld, (long long)off, (long long)ncols, inplace ? " in-place" : "");
    Buf x(DT, N * ld);
    fill_logits(x, N, V, ld, ncols);
    std::vector<float> loss(N, NAN), lse(N, NAN), mxv(N, NAN), sev(N, NAN), tlv(N, NAN);
    cuk_errrec err{};
    cuk_mat mx{x.p(), N, V, ld, DT};
    const int ignore = -100;
    launch((unsigned)N, XNT, 0, [&] {
        k_xent_fwd_vec<DT, false>(loss.data(), lse.data(), mxv.data(), sev.data(), tlv.data(), mx, tgt.data(), off,
                                  ncols, ignore, strict, &err, cuk_mat{}, 0.0f);
    });
    double el = 0, ml = 0, es = 0, ms = 0, ell = 0, mll = 0;
    bool exact = true, want_err = false;
    std::vector<double> rl(N);
    for (int64_t r = 0; r < N; r++) {
        double m = -INFINITY;
        for (int64_t c = 0; c < ncols; c++) m = std::fmax(m, x.get(r * ld + c));
        double s = 0;
        for (int64_t c = 0; c < ncols; c++) s += std::exp(x.get(r * ld + c) - m);
        const double l = m + std::log(s);
        rl[r] = l;
        const int64_t tl = (int64_t)tgt[r] - off;
        const bool ign = tgt[r] == ignore, inside = tl >= 0 && tl < ncols;
        if (!ign && !inside) want_err = true;
        const float xt = !ign && inside ? x.get(r * ld + tl) : 0.0f;
        const double lo = ign || !inside ? 0.0 : l - xt;
        exact &= mxv[r] == (float)m && tlv[r] == xt;
        el = std::fmax(el, std::fabs(lse[r] - l));
        ml = std::fmax(ml, std::fabs(l));
        es = std::fmax(es, std::fabs(sev[r] - s));
        ms = std::fmax(ms, std::fabs(s));
        ell = std::fmax(ell, std::fabs(loss[r] - lo));
        mll = std::fmax(mll, std::fabs(lo));
    }
    char what[300];
    snprintf(what, sizeof what, "%s fwd lse", name);
    check(what, el / ml, 1e-5);
    snprintf(what, sizeof what, "%s fwd losses", name);
    check(what, ell / (mll > 0 ? mll : 1), 1e-5);
    snprintf(what, sizeof what, "%s fwd sumexp", name);
    check(what, es / ms, 1e-5);
    snprintf(what, sizeof what, "%s fwd max and target logit exact", name);
    expect(exact, what);
    snprintf(what, sizeof what, "%s fwd target error reported iff expected", name);
    expect((err.code == CUK_ERR_TARGET) == (strict && want_err), what);

    /* backward from the kernel's lse; per-row scale */
    std::vector<float> dl(N);
    for (int64_t r = 0; r < N; r++) dl[r] = 0.5f + 0.25f * (float)r;
    Buf dxb(DT, N * ld);
    Buf &dx = inplace ? x : dxb;
    std::vector<double> ref(N * V);
    for (int64_t r = 0; r < N; r++) {
        const int64_t tl = (int64_t)tgt[r] - off;
        for (int64_t c = 0; c < V; c++) {
            double g = 0;
            if (tgt[r] != ignore && c < ncols) {
                g = dl[r] * std::exp((double)x.get(r * ld + c) - lse[r]);
                if (c == tl) g -= dl[r];
            }
            ref[r * V + c] = g;
        }
    }
    if (inplace)
        for (int64_t r = 0; r < N; r++)
            for (int64_t c = V; c < ld; c++) x.set(r * ld + c, NAN);
    cuk_mat mdx{dx.p(), N, V, ld, DT};
    launch((unsigned)N, XNT, 0,
           [&] { k_xent_bwd_vec<DT>(mdx, mx, lse.data(), tgt.data(), dl.data(), 0.0f, off, ncols, ignore); });
    snprintf(what, sizeof what, "%s bwd dlogits", name);
    check(what, relerr(dx, ref, N, V, ld), tol_of(DT));
    snprintf(what, sizeof what, "%s bwd padding untouched", name);
    expect(padding_nan(dx, N, V, ld), what);
}

/* xent_fwd_bwd's one kernel (k_xent_fwd_vec FUSED): losses and lse as the
 * forward's, dlogits with one scale as the backward's, each row read again
 * after its statistics; in place too (the logits' own buffer). */
template <int DT>
static void xent_fused_case(int64_t N, int64_t V, int64_t ld, int64_t off, int64_t ncols, std::vector<int32_t> tgt,
                            bool inplace) {
    char name[200], what[300];
    snprintf(name, sizeof name, "xent fused %s N%lld V%lld ld%lld off %lld ncols %lld%s", dtname(DT), (long long)N,
             (long long)V, (long long)ld, (long long)off, (long long)ncols, inplace ? " in-place" : "");
    Buf x(DT, N * ld);
    fill_logits(x, N, V, ld, ncols);
    const int ignore = -100;
    const float sc = 0.37f;
    std::vector<double> rl(N), rloss(N), ref(N * V);
    for (int64_t r = 0; r < N; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < ncols; c++) m = std::fmax(m, x.get(r * ld + c));
        for (int64_t c = 0; c < ncols; c++) s += std::exp(x.get(r * ld + c) - m);
        rl[r] = m + std::log(s);
        const int64_t tl = (int64_t)tgt[r] - off;
        const bool ign = tgt[r] == ignore;
        rloss[r] = ign ? 0.0 : rl[r] - x.get(r * ld + tl);
        for (int64_t c = 0; c < V; c++) {
            double g = 0;
            if (!ign && c < ncols) {
                g = sc * std::exp((double)x.get(r * ld + c) - rl[r]);
                if (c == tl) g -= sc;
            }
            ref[r * V + c] = g;
        }
    }
    std::vector<float> loss(N, NAN), lse(N, NAN);
    Buf dxb(DT, N * ld);
    Buf &dx = inplace ? x : dxb;
    cuk_errrec err{};
    cuk_mat mx{x.p(), N, V, ld, DT}, mdx{dx.p(), N, V, ld, DT};
    launch((unsigned)N, XNT, 0, [&] {
        k_xent_fwd_vec<DT, true>(loss.data(), lse.data(), nullptr, nullptr, nullptr, mx, tgt.data(), off, ncols, ignore,
                                 1, &err, mdx, sc);
    });
    double el = 0, ml = 0, ell = 0, mll = 0;
    for (int64_t r = 0; r < N; r++) {
        el = std::fmax(el, std::fabs(lse[r] - rl[r]));
        ml = std::fmax(ml, std::fabs(rl[r]));
        ell = std::fmax(ell, std::fabs(loss[r] - rloss[r]));
        mll = std::fmax(mll, std::fabs(rloss[r]));
    }
    snprintf(what, sizeof what, "%s lse", name);
    check(what, el / ml, 1e-5);
    snprintf(what, sizeof what, "%s losses", name);
    check(what, ell / (mll > 0 ? mll : 1), 1e-5);
    snprintf(what, sizeof what, "%s no target error", name);
    expect(err.code == 0, what);
    snprintf(what, sizeof what, "%s dlogits", name);
    check(what, relerr(dx, ref, N, V, ld), tol_of(DT));
    snprintf(what, sizeof what, "%s padding untouched", name);
    expect(padding_nan(dx, N, V, ld), what);
}

/* ---------------------------------------------------------------- AdamW */

/* k_adamw_vec against k_adamw on the same inputs, bit for bit (w, m, v and
 * the rounded copy): arrays starting 0-3 elements past a 16-byte boundary
 * (the head done one by one), lengths with and without a tail, tiny ones. */
template <int LDT> static void adamw_case(int64_t n, int mis) {
    char what[160];
    snprintf(what, sizeof what, "adamw vec %s n %lld, %d elements past a 16-byte boundary: k_adamw's bits",
             LDT == CUK_F32 ? "no copy" : dtname(LDT), (long long)n, mis);
    auto arr = [&](std::vector<float> &store) {
        store.assign((size_t)n + 16, 0.0f);
        uintptr_t a = ((uintptr_t)store.data() + 15) & ~(uintptr_t)15;
        return (float *)a + mis;
    };
    std::vector<float> sw1, sw2, sg, sm1, sm2, sv1, sv2;
    float *w1 = arr(sw1), *w2 = arr(sw2), *g = arr(sg), *m1 = arr(sm1), *m2 = arr(sm2), *v1 = arr(sv1), *v2 = arr(sv2);
    std::mt19937 rng(7 + (unsigned)n);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < n; i++) {
        w1[i] = w2[i] = nd(rng);
        g[i] = nd(rng) * 0.1f;
        m1[i] = m2[i] = nd(rng) * 0.01f;
        v1[i] = v2[i] = std::fabs(nd(rng)) * 1e-4f;
    }
    std::vector<uint16_t> sl1((size_t)n + 16, 0xffff), sl2((size_t)n + 16, 0xffff);
    uint16_t *l1 = (uint16_t *)(((uintptr_t)sl1.data() + 7) & ~(uintptr_t)7) + mis,
             *l2 = (uint16_t *)(((uintptr_t)sl2.data() + 7) & ~(uintptr_t)7) + mis;
    void *lp1 = LDT == CUK_F32 ? nullptr : l1;
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, step = 6e-4f / 0.1f, bc2 = std::sqrt(0.0975f), decay = 0.99994f;
    launch((unsigned)((n + 63) / 64), 64, 0,
           [&] { k_adamw(w1, g, CUK_F32, m1, v1, lp1, LDT, n, b1, b2, eps, step, bc2, decay, 0.5f); });
    const uint32_t head = (uint32_t)std::min<int64_t>(mis ? 4 - mis : 0, n);
    const int64_t quads = (n - head) / 4, threads = quads > 8 ? quads : 8;
    launch((unsigned)((threads + 63) / 64), 64, 0, [&] {
        k_adamw_vec<LDT>(w2, g, m2, v2, LDT == CUK_F32 ? nullptr : l2, (uint32_t)n, head, b1, b2, eps, step, bc2, decay,
                         0.5f);
    });
    bool same = std::memcmp(w1, w2, (size_t)n * 4) == 0 && std::memcmp(m1, m2, (size_t)n * 4) == 0 &&
                std::memcmp(v1, v2, (size_t)n * 4) == 0 && std::memcmp(w1 + n, w2 + n, 4 * 4) == 0;
    if (LDT != CUK_F32) same &= std::memcmp(l1, l2, ((size_t)n + 4) * 2) == 0;
    expect(same, what);
}

template <int LDT> static void adamws() {
    const int64_t ns[] = {1, 3, 5, 8, 37, 1000, 4099};
    for (int64_t n : ns)
        for (int mis = 0; mis < 4; mis++) adamw_case<LDT>(n, mis);
}

/* ---------------------------------------------------------------- RoPE */

/* k_rope_vec on q and k views of a fused QKV buffer [B, T, (Hq + 2 Hkv) D]
 * (in place, as the model calls it), forward and backward (sign -1), with
 * explicit positions one of which is out of the table: every rotated value
 * bit for bit the float formula of k_rope rounded to DT, the bad token's
 * head zeroed and reported, v and everything else untouched. */
template <int DT> static void rope_case(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, float sign) {
    char name[160], what[240];
    snprintf(name, sizeof name, "rope %s B%lld T%lld Hq%lld Hkv%lld D%lld sign %+.0f", dtname(DT), (long long)B,
             (long long)T, (long long)Hq, (long long)Hkv, (long long)D, sign);
    const int64_t half = D / 2, W = (Hq + 2 * Hkv) * D, maxpos = T + 3;
    Buf qkv(DT, B * T * W);
    fill_rand(qkv, 2.0);
    std::vector<float> orig(B * T * W), cs(maxpos * half), sn(maxpos * half);
    for (int64_t i = 0; i < B * T * W; i++) orig[i] = qkv.get(i);
    for (int64_t p = 0; p < maxpos; p++)
        for (int64_t i = 0; i < half; i++) {
            const double a = (double)p * std::pow(10000.0, -2.0 * (double)i / (double)D);
            cs[p * half + i] = (float)std::cos(a);
            sn[p * half + i] = (float)std::sin(a);
        }
    std::vector<int32_t> pos(B * T);
    for (int64_t i = 0; i < B * T; i++) pos[i] = (int32_t)((i * 5 + 1) % maxpos);
    const int64_t badtok = B * T > 2 ? 2 : 0;
    pos[badtok] = (int32_t)(maxpos + 4);
    cuk_mat mc{cs.data(), maxpos, half, half, CUK_F32}, ms{sn.data(), maxpos, half, half, CUK_F32};
    cuk_errrec err{};
    for (int which = 0; which < 2; which++) { /* q, then k */
        const int64_t H = which ? Hkv : Hq, c0 = which ? Hq * D : 0;
        cuk_bthd v{(unsigned char *)qkv.p() + c0 * (DT == CUK_F32 ? 4 : 2), B, T, H, D, T * W, W, D, DT};
        const int64_t chunks = B * T * H * (half / 8);
        launch((unsigned)((chunks + 63) / 64), 64, 0,
               [&] { k_rope_vec<DT>(v, v, mc, ms, pos.data(), 1, 0, sign, &err); });
    }
    bool exact = true, rest = true;
    for (int64_t bt = 0; bt < B * T; bt++)
        for (int64_t col = 0; col < W; col++) {
            const int64_t idx = bt * W + col, h = col / D, i = col % D;
            const float got = qkv.get(idx);
            if (h >= Hq + Hkv) { /* v: untouched */
                rest &= std::memcmp(&got, &orig[idx], 4) == 0;
                continue;
            }
            float want = 0.0f;
            if (bt != badtok) {
                const int64_t p = pos[bt], k = i % half;
                const float x1 = orig[bt * W + h * D + k], x2 = orig[bt * W + h * D + k + half];
                const float c = cs[p * half + k], s = sign * sn[p * half + k];
                want = i < half ? x1 * c - x2 * s : x2 * c + x1 * s;
            }
            Buf one(DT, 1);
            one.set(0, want);
            const float wr = one.get(0);
            exact &= std::memcmp(&got, &wr, 4) == 0;
        }
    snprintf(what, sizeof what, "%s: rotated q and k bit for bit, bad position zeroed", name);
    expect(exact, what);
    snprintf(what, sizeof what, "%s: v untouched", name);
    expect(rest, what);
    snprintf(what, sizeof what, "%s: bad position reported", name);
    expect(err.code == CUK_ERR_POSITION && err.a == badtok, what);
}

template <int DT> static void ropes() {
    rope_case<DT>(2, 5, 4, 2, 64, 1.0f);
    rope_case<DT>(1, 7, 3, 1, 128, -1.0f);
    rope_case<DT>(3, 2, 2, 2, 16, 1.0f);
}

template <int DT> static void xents() {
    xent_fused_case<DT>(7, 300, 312, 0, 290, {5, -100, 289, 288, 0, 100, 17}, false);
    xent_fused_case<DT>(7, 300, 312, 0, 290, {5, -100, 289, 288, 0, 100, 17}, true);
    xent_fused_case<DT>(3, 50304, 50304, 0, 50257, {50256, -100, 31}, true);
    xent_fused_case<DT>(3, 4100, 4104, 0, 4099, {4098, 4096, 0}, false);
    xent_case<DT>(7, 300, 312, 0, 290, {5, -100, 289, 288, 0, 100, 17}, 1, false);
    xent_case<DT>(7, 300, 312, 0, 290, {5, -100, 289, 288, 0, 100, 17}, 1, true);
    xent_case<DT>(3, 50304, 50304, 0, 50257, {50256, -100, 31}, 1, false);
    xent_case<DT>(2, 64, 64, 0, 64, {63, 8}, 1, true);
    xent_case<DT>(5, 200, 200, 100, 190, {150, 99, 289, 290, -100}, 1, false); /* shard, targets outside */
    xent_case<DT>(5, 200, 200, 100, 190, {150, 99, 289, 290, -100}, 0, false);
    xent_case<DT>(3, 4100, 4104, 0, 4099, {4098, 4096, 0}, 1, false);
    xent_case<DT>(2, 8, 8, 0, 5, {4, 0}, 1, false); /* only a partial chunk */
}

int main() {
    norms<CUK_F32>();
    norms<CUK_BF16>();
    norms<CUK_F16>();
    xents<CUK_F32>();
    xents<CUK_BF16>();
    xents<CUK_F16>();
    ropes<CUK_BF16>();
    ropes<CUK_F16>();
    adamws<CUK_F32>();
    adamws<CUK_BF16>();
    adamws<CUK_F16>();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
