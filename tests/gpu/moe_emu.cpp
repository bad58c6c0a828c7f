/* CPU emulation of the mixture-of-experts kernels (kernels/moe.cu:
 * k_moe_permute, k_moe_combine_fwd, k_moe_combine_bwd), to check their
 * index math, partial 8-chunks, strided rows, dropped and out-of-range
 * positions, grid-stride walks and the dw reduction on a machine without a
 * GPU (not a substitute for tests/gpu/test_cuda_ops on a GPU).
 * tests/gpu/moe_emu.sh extracts the kernels and the dtype helpers of
 * cuda_common.cuh into kern.inc.
 *
 * Each block runs as blockDim fibers (emu_cuda.h); __syncthreads is a
 * barrier, shfl.xor exchanges through per-warp slots. Every kernel runs
 * with blocks of 32, 64 and 256 threads and fewer blocks than items (the
 * grid-stride loops), in every float dtype, on the vector and element-wise
 * paths. Checks: permute's rows bitwise, y bitwise against the same f32
 * sums in j order (g++ here contracts nothing), dye bitwise, dw within
 * 1e-5 of the sum of |products| (the double-precision dot), rows and
 * padding that pos does not name untouched, a pos past the grouped rows
 * reported (CUK_ERR_MOE_POS with the assignment, the pos and S). */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "emu_cuda.h"
/* the kernels' own C interface (the dtype and error codes, the views),
 * over the stub cuda_runtime.h that emu_common.sh writes */
#include "cuda_kernels.h"
static inline void cuk_report(cuk_errrec *e, int code, int64_t a, int64_t b, int64_t c, int64_t d) {
    if (e && e->code == 0) *e = cuk_errrec{code, 0, a, b, c, d};
}

using emu::Warp;
struct Block {
    emu::Barrier bar;
    std::unique_ptr<Warp[]> w;
    float sh[32];
    explicit Block(int n) : bar(n), w(new Warp[n / 32]) {
        for (float &v : sh) v = NAN;
    }
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
/* cuda_common.cuh's block_reduce with the sum */
static inline float block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

#include "kern.inc"

template <class F> static void launch(unsigned nblocks, unsigned nthreads, F f) {
    for (unsigned bi = 0; bi < nblocks; bi++) {
        auto blk = std::make_unique<Block>((int)nthreads);
        blockIdx = {bi, 0, 0};
        blockDim = {nthreads, 1, 1};
        gridDim = {nblocks, 1, 1};
        g_blk = blk.get();
        emu::run_block(nthreads, f);
    }
}

static int esz(int dt) { return dt == CUK_F32 ? 4 : 2; }
static const char *dtname(int dt) { return dt == CUK_F32 ? "f32" : dt == CUK_BF16 ? "bf16" : "f16"; }

/* rows x ld elements, 16-byte aligned, random values (already of the dtype) */
struct Buf {
    int dt;
    int64_t rows, cols, ld;
    std::vector<uint4> b;
    Buf(int dt_, int64_t rows_, int64_t cols_, int64_t ld_)
        : dt(dt_), rows(rows_), cols(cols_), ld(ld_), b((size_t)(rows_ * ld_ * esz(dt_) + 15) / 16 + 1) {}
    void *p() { return b.data(); }
    float get(int64_t r, int64_t c) const { return ldf(b.data(), dt, r * ld + c); }
    void set(int64_t r, int64_t c, float v) { stf(b.data(), dt, r * ld + c, v); }
    cuk_mat mat() { return cuk_mat{p(), rows, cols, ld, dt}; }
    size_t bytes() const { return (size_t)(rows * ld * esz(dt)); }
};

static std::mt19937 g_rng(777);
static void fill(Buf &b) {
    std::normal_distribution<float> nd(0, 1);
    for (int64_t r = 0; r < b.rows; r++)
        for (int64_t c = 0; c < b.ld; c++) b.set(r, c, nd(g_rng));
}

static int g_fail, g_pass;
static void expect(bool ok, const char *what) {
    if (ok) g_pass++;
    else {
        g_fail++;
        printf("  FAIL %s\n", what);
    }
}

template <int DT, bool VEC>
static void run_case(int64_t N, int64_t k, int64_t C, int64_t pad, unsigned nt, unsigned nblocks, bool bad) {
    const int64_t S = N * k + 3, ld = C + pad;
    char tag[160];
    snprintf(tag, sizeof tag, "%s %s N%lld k%lld C%lld ld%lld threads %u blocks %u%s", dtname(DT),
             VEC ? "vec" : "scalar", (long long)N, (long long)k, (long long)C, (long long)ld, nt, nblocks,
             bad ? " bad pos" : "");
    /* pos: a shuffled permutation of S rows, some dropped, one past S when bad */
    std::vector<int32_t> perm(S), pos(N * k);
    for (int64_t i = 0; i < S; i++) perm[i] = (int32_t)i;
    std::shuffle(perm.begin(), perm.end(), g_rng);
    for (int64_t i = 0; i < N * k; i++) pos[i] = g_rng() % 4 == 0 ? -1 : perm[i];
    int64_t bad_i = -1;
    if (bad) {
        bad_i = N * k / 2;
        pos[bad_i] = (int32_t)(S + 2);
    }
    auto kept = [&](int64_t i) { return pos[i] >= 0 && pos[i] < S; };
    std::vector<float> w(N * k);
    std::normal_distribution<float> nd(0, 1);
    for (float &v : w) v = nd(g_rng);

    /* permute */
    Buf x(DT, N, C, ld), xe(DT, S, C, ld);
    fill(x);
    fill(xe);
    Buf xe0 = xe;
    cuk_errrec err{};
    {
        const int64_t es = esz(DT);
        const int64_t units = C * es / 2; /* the narrowest unit: every layout allows it */
        launch(nblocks, nt, [&] {
            k_moe_permute<uint16_t>((char *)xe.p(), ld * es, S, (const char *)x.p(), ld * es, units, pos.data(), N * k,
                                    k, &err);
        });
        bool ok = true;
        std::vector<int> named(S, 0);
        for (int64_t i = 0; i < N * k; i++)
            if (kept(i)) named[pos[i]] = 1;
        for (int64_t i = 0; i < N * k; i++)
            if (kept(i))
                ok &=
                    memcmp((char *)xe.p() + pos[i] * ld * es, (char *)x.p() + (i / k) * ld * es, (size_t)(C * es)) == 0;
        for (int64_t r = 0; r < S; r++)
            ok &= memcmp((char *)xe.p() + r * ld * es + (named[r] ? C * es : 0),
                         (char *)xe0.p() + r * ld * es + (named[r] ? C * es : 0),
                         (size_t)((named[r] ? pad : ld) * es)) == 0;
        char what[200];
        snprintf(what, sizeof what, "permute %s", tag);
        expect(ok, what);
        if ((C * es) % 16 == 0 && (ld * es) % 16 == 0) { /* the 16-byte unit on the same data */
            Buf xe2 = xe0;
            launch(nblocks, nt, [&] {
                k_moe_permute<uint4>((char *)xe2.p(), ld * es, S, (const char *)x.p(), ld * es, C * es / 16, pos.data(),
                                     N * k, k, nullptr);
            });
            snprintf(what, sizeof what, "permute 16-byte units %s", tag);
            expect(memcmp(xe2.p(), xe.p(), xe.bytes()) == 0, what);
        }
    }
    auto check_err = [&](const char *op) {
        char what[200];
        snprintf(what, sizeof what, "%s error record %s", op, tag);
        if (bad) expect(err.code == CUK_ERR_MOE_POS && err.a == bad_i && err.b == S + 2 && err.c == S, what);
        else expect(err.code == 0, what);
        err = cuk_errrec{};
    };
    check_err("permute");

    /* combine forward, accum 0/1, w and w NULL */
    Buf ye(DT, S, C, ld);
    fill(ye);
    for (int accum = 0; accum <= 1; accum++)
        for (int wn = 0; wn <= 1; wn++) {
            Buf y(DT, N, C, ld);
            fill(y);
            Buf y0 = y;
            const float *wp = wn ? nullptr : w.data();
            launch(nblocks, nt, [&] { k_moe_combine_fwd<DT, VEC>(y.mat(), ye.mat(), pos.data(), k, wp, accum, &err); });
            bool ok = true;
            for (int64_t t = 0; t < N; t++)
                for (int64_t c = 0; c < ld; c++) {
                    if (c >= C) {
                        ok &= memcmp((char *)y.p() + (t * ld + c) * esz(DT), (char *)y0.p() + (t * ld + c) * esz(DT),
                                     (size_t)esz(DT)) == 0;
                        continue;
                    }
                    float acc = accum ? y0.get(t, c) : 0.0f;
                    for (int64_t j = 0; j < k; j++) {
                        if (!kept(t * k + j)) continue;
                        const float wj = wp ? wp[t * k + j] : 1.0f;
                        acc += wj * ye.get(pos[t * k + j], c);
                    }
                    Buf one(DT, 1, 1, 1);
                    one.set(0, 0, acc);
                    ok &= memcmp((char *)y.p() + (t * ld + c) * esz(DT), one.p(), (size_t)esz(DT)) == 0;
                }
            char what[200];
            snprintf(what, sizeof what, "combine_fwd accum %d%s %s", accum, wn ? " w NULL" : "", tag);
            expect(ok, what);
            check_err("combine_fwd");
        }

    /* combine backward */
    Buf dy(DT, N, C, ld), dye(DT, S, C, ld);
    fill(dy);
    fill(dye);
    Buf dye0 = dye;
    std::vector<float> dw(N * k, NAN);
    launch(nblocks, nt, [&] {
        k_moe_combine_bwd<DT, VEC>(dye.mat(), dw.data(), dy.mat(), ye.mat(), pos.data(), k, w.data(), &err);
    });
    bool ok_dye = true, ok_dw = true;
    std::vector<int> named(S, 0);
    for (int64_t i = 0; i < N * k; i++) {
        if (!kept(i)) {
            ok_dw &= dw[i] == 0.0f;
            continue;
        }
        named[pos[i]] = 1;
        double dot = 0.0, mag = 0.0;
        for (int64_t c = 0; c < C; c++) {
            const float d = dy.get(i / k, c);
            Buf one(DT, 1, 1, 1);
            one.set(0, 0, w[i] * d);
            ok_dye &= memcmp((char *)dye.p() + (pos[i] * ld + c) * esz(DT), one.p(), (size_t)esz(DT)) == 0;
            dot += (double)d * ye.get(pos[i], c);
            mag += std::fabs((double)d * ye.get(pos[i], c));
        }
        ok_dw &= std::fabs(dw[i] - dot) <= 1e-5 * mag + 1e-30;
    }
    for (int64_t r = 0; r < S; r++) {
        const int64_t from = named[r] ? C : 0;
        ok_dye &= memcmp((char *)dye.p() + (r * ld + from) * esz(DT), (char *)dye0.p() + (r * ld + from) * esz(DT),
                         (size_t)((ld - from) * esz(DT))) == 0;
    }
    char what[200];
    snprintf(what, sizeof what, "combine_bwd dye %s", tag);
    expect(ok_dye, what);
    snprintf(what, sizeof what, "combine_bwd dw %s", tag);
    expect(ok_dw, what);
    check_err("combine_bwd");
}

template <int DT> static void run_dtype() {
    struct Shape {
        int64_t N, k, C, pad;
    };
    const Shape shapes[] = {{1, 1, 8, 0}, {5, 2, 64, 0}, {7, 8, 73, 7}, {3, 2, 300, 4}, {4, 3, 13, 3}};
    const unsigned threads[] = {32, 64, 256};
    for (const Shape &s : shapes)
        for (unsigned nt : threads) {
            const unsigned nb = s.N * s.k > 3 ? 3 : 1; /* fewer blocks than items: grid-stride */
            const bool aligned = (s.C + s.pad) * esz(DT) % 16 == 0;
            run_case<DT, false>(s.N, s.k, s.C, s.pad, nt, nb, false);
            if (aligned) run_case<DT, true>(s.N, s.k, s.C, s.pad, nt, nb, false);
        }
    run_case<DT, false>(6, 2, 40, 0, 64, 4, true);
    if (40 * esz(DT) % 16 == 0) run_case<DT, true>(6, 2, 40, 0, 64, 4, true);
}

int main() {
    run_dtype<CUK_F32>();
    run_dtype<CUK_BF16>();
    run_dtype<CUK_F16>();
    printf("moe_emu: %d checks passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
