/* Flash-attention-2 style attention for bf16 (and f16) inputs on mma.sync
 * tensor-core instructions (sm_80+), head_dim 64 or 128, q/k/v (and dout)
 * rows 16-byte aligned. Same contract as attention.cu / attention_tc.cu
 * (causal with offset, sliding window, rows that see no key give O = 0 and
 * lse = -inf, GQA, any strides on B/T/H, lse f32 [B,Hq,Tq]); the host side
 * (cuda_attention.c) picks these kernels when cuk_attn_flash_ok() says so.
 *
 * Forward: a block of 4 warps owns 64 query rows (16 per warp) and walks
 * key tiles of 64 rows, loaded with 16-byte cp.async into padded shared
 * memory (row stride D + 8 elements: the 8 row addresses of an ldmatrix hit
 * distinct banks), double buffered. Q fragments stay in registers; S, the
 * online-softmax statistics and the O accumulator live in registers in the
 * mma accumulator layout; P is rounded to bf16 in registers and reused as
 * the A operand of P V (the accumulator layout of two adjacent n-tiles is
 * the A layout of one k-chunk). Scores are prescaled by scale * log2(e) so
 * the softmax uses exp2 (ex2.approx.ftz). Fully visible tiles skip the per-element mask.
 *
 * Backward (deterministic, no atomics, bitwise repeatable): D_i =
 * rowsum(dO * O) first, then a dK/dV kernel (a block owns 64 keys, 16 per
 * warp, and loops over the kv group's query heads and the query chunks
 * that can see the tile, computing S^T and dP^T directly so the key rows
 * are the mma rows) and a dQ kernel (a block owns 64 query rows and loops
 * over key tiles).
 *
 * Fragment layouts and the mma/ldmatrix helpers: mma.cuh. */
#include "cuda_common.cuh"
#include "mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define FL_NTH 128
#define FL_LOG2E 1.4426950408889634f
#define FL_LN2 0.6931471805599453f

CUK_EMU_BEGIN(flash);
/* Rows [r0, r0 + ROWS) of head h into s[ROWS][D + 8] with cp.async; rows
 * outside [0, rlim) are zero (plain stores; visible after the barrier). */
template <int ROWS, int D>
CUK_INLINE void fl_load(e16 *s, const cuk_bthd &t, int64_t b, int64_t h, int64_t r0, int64_t rlim) {
    constexpr int LD = D + 8, CPR = D / 8;
#pragma unroll
    for (int c = threadIdx.x; c < ROWS * CPR; c += FL_NTH) {
        const int rr = c / CPR, cc = c % CPR;
        const int64_t row = r0 + rr;
        e16 *dst = s + rr * LD + cc * 8;
        if (row >= 0 && row < rlim) mma_cp16(dst, (const e16 *)t.p + cuk_roff(t, b, row, h) + cc * 8);
        else *(uint4 *)dst = make_uint4(0u, 0u, 0u, 0u);
    }
}

/* Store columns 8n + 2t, +1 (n < ND) of one accumulator row, times mul:
 * one 4-byte (8-byte for f32) store per pair when the row is aligned for
 * it, with the same rounding as stf. */
template <int ND>
CUK_INLINE void fl_store_row(const cuk_bthd &t, int64_t off, const float (&acc)[ND][4], int half, float mul, int tq) {
    const bool f32 = t.dt == CUK_F32;
    const uintptr_t row = f32 ? (uintptr_t)((float *)t.p + off) : (uintptr_t)((uint16_t *)t.p + off);
    const bool pair = (row & (f32 ? 7u : 3u)) == 0;
#pragma unroll
    for (int n = 0; n < ND; n++) {
        const int64_t d = 8 * n + 2 * tq;
        const float x0 = acc[n][2 * half] * mul, x1 = acc[n][2 * half + 1] * mul;
        if (!pair) {
            stf(t.p, t.dt, off + d, x0);
            stf(t.p, t.dt, off + d + 1, x1);
        } else if (f32) {
            *(float2 *)((float *)t.p + off + d) = make_float2(x0, x1);
        } else {
            const uint32_t lo = t.dt == CUK_BF16 ? cuk_f32_to_bf16(x0) : cuk_f32_to_f16_mode(x0, 0, 0);
            const uint32_t hi = t.dt == CUK_BF16 ? cuk_f32_to_bf16(x1) : cuk_f32_to_f16_mode(x1, 0, 0);
            *(uint32_t *)((uint16_t *)t.p + off + d) = lo | hi << 16;
        }
    }
}

template <int ND> CUK_INLINE void fl_zero(float (&acc)[ND][4]) {
#pragma unroll
    for (int n = 0; n < ND; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

/* Every (row, col) of the rows x cols block at (i0, j0) visible and in range? */
CUK_INLINE bool fl_full(const cuk_attn &a, int64_t i0, int64_t ilim, int rows, int64_t j0, int64_t jlim, int cols) {
    if (i0 + rows > ilim || j0 + cols > jlim) return false;
    if (!a.causal) return true;
    if (j0 + cols - 1 > i0 + a.off) return false;
    return a.window <= 0 || j0 >= i0 + rows - 1 + a.off - a.window + 1;
}

/* The query tile of this block (the forward and dQ grids: B * Hq * ntiles
 * blocks, the longest causal tiles first for a better tail) and the key
 * tiles of BN rows that its rows may see, from jlo. */
struct fl_qtile {
    int64_t b, h, hk, i0, jlo, jhi, nkt;
};
CUK_INLINE fl_qtile fl_qtile_of(const cuk_bthd &q, const cuk_bthd &k, const cuk_attn &a, int64_t ntiles, int BM,
                                int BN) {
    fl_qtile t;
    const int64_t qt = ntiles - 1 - (int64_t)blockIdx.x % ntiles, bh = (int64_t)blockIdx.x / ntiles;
    t.b = bh / q.H;
    t.h = bh % q.H;
    t.hk = t.h / (q.H / k.H);
    t.i0 = qt * BM;
    const int64_t ilast = t.i0 + BM - 1 < q.T - 1 ? t.i0 + BM - 1 : q.T - 1;
    cuk_key_span(a, t.i0, ilast, k.T, &t.jlo, &t.jhi);
    t.nkt = t.jhi >= t.jlo ? (t.jhi - t.jlo + BN) / BN : 0;
    return t;
}

/* Start loading the next K and V tiles (rows [jn, jn + BN), when `more`)
 * into buffer buf ^ 1, then wait for buffer buf's and synchronise. */
template <int BN, int D>
CUK_INLINE void fl_next_kv(e16 *Ks, e16 *Vs, const cuk_bthd &k, const cuk_bthd &v, int64_t b, int64_t hk, int buf,
                           bool more, int64_t jn, int64_t jlim) {
    if (more) {
        fl_load<BN, D>(Ks + (buf ^ 1) * BN * (D + 8), k, b, hk, jn, jlim);
        fl_load<BN, D>(Vs + (buf ^ 1) * BN * (D + 8), v, b, hk, jn, jlim);
        mma_commit();
        mma_wait<1>();
    } else {
        mma_wait<0>();
    }
    __syncthreads();
}

/* The masks in registers: row r of a tile sees the columns [lo, hi] of
 * the other side; made relative to the tile's first column c0 and clamped
 * to [0, n) so the per-element test is two int compares. */
struct fl_span {
    int lo, hi;
};
CUK_INLINE fl_span fl_rel(int64_t lo, int64_t hi, int64_t c0, int n) {
    const int64_t l = lo - c0, h = hi - c0;
    fl_span r;
    r.lo = l < 0 ? 0 : l > n ? n : (int)l;
    r.hi = h < -1 ? -1 : h >= n ? n - 1 : (int)h;
    return r;
}
/* Keys of query row i (up to jhi) per cuk_visible, relative to key j0. */
CUK_INLINE fl_span fl_keys_of(const cuk_attn &a, int64_t i, int64_t jhi, int64_t j0, int n) {
    int64_t lo = j0, hi = jhi;
    if (a.causal) {
        if (i + a.off < hi) hi = i + a.off;
        if (a.window > 0) lo = i + a.off - a.window + 1;
    }
    return fl_rel(lo, hi, j0, n);
}
/* Query rows (up to ihi) that see key row j (none when j >= Tk), relative to query i0. */
CUK_INLINE fl_span fl_queries_of(const cuk_attn &a, int64_t j, int64_t Tk, int64_t ihi, int64_t i0, int n) {
    int64_t lo = i0, hi = j < Tk ? ihi : i0 - 1;
    if (a.causal) {
        lo = j - a.off;
        if (a.window > 0 && j - a.off + a.window - 1 < hi) hi = j - a.off + a.window - 1;
    }
    return fl_rel(lo, hi, i0, n);
}

template <int D> static constexpr size_t fl_fwd_smem() { return (size_t)5 * 64 * (D + 8) * sizeof(e16); }
template <int D, int QC> static constexpr size_t fl_kv_smem() {
    return (size_t)(2 * 64 + 4 * QC) * (D + 8) * sizeof(e16) + 4 * QC * sizeof(float);
}
template <int D> static constexpr size_t fl_q_smem() { return (size_t)6 * 64 * (D + 8) * sizeof(e16); }

/* ---------------------------------------------------------------- forward */

template <int D, bool F16, int MINB = 1>
__global__ void __launch_bounds__(FL_NTH, MINB)
    k_fl_fwd(cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a, int64_t ntiles, float sl2) {
    constexpr int LD = D + 8, BM = 64, BN = 64, KD = D / 16, ND = D / 8, NN = BN / 8;
    extern __shared__ __align__(128) unsigned char fl_sm[];
    e16 *Qs = (e16 *)fl_sm, *Ks = Qs + BM * LD, *Vs = Ks + 2 * BN * LD; /* K/V buffer x at +x*BN*LD */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const fl_qtile qt = fl_qtile_of(q, k, a, ntiles, BM, BN);
    const int64_t b = qt.b, h = qt.h, hk = qt.hk, Tq = q.T, i0 = qt.i0, jlo = qt.jlo, jhi = qt.jhi, nkt = qt.nkt;

    fl_load<BM, D>(Qs, q, b, h, i0, Tq);
    if (nkt > 0) {
        fl_load<BN, D>(Ks, k, b, hk, jlo, jhi + 1);
        fl_load<BN, D>(Vs, v, b, hk, jlo, jhi + 1);
    }
    mma_commit();
    mma_wait<0>();
    __syncthreads();
    uint32_t qf[KD][4]; /* A fragments of this warp's 16 query rows, k-chunk kk = dims 16kk.. */
#pragma unroll
    for (int kk = 0; kk < KD; kk++) mma_lda<LD>(qf[kk], Qs + warp * 16 * LD + kk * 16, lane);

    float oacc[ND][4]; /* C layout: O rows g / g+8 of the warp, dims 8n + 2t, +1 */
    fl_zero(oacc);
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f}; /* rows g, g+8; l: this thread's part */
    const int64_t ri[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};

    for (int64_t it = 0; it < nkt; it++) {
        const int buf = (int)(it & 1);
        const int64_t j0 = jlo + it * BN;
        fl_next_kv<BN, D>(Ks, Vs, k, v, b, hk, buf, it + 1 < nkt, j0 + BN, jhi + 1);
        const e16 *Kb = Ks + buf * BN * LD, *Vb = Vs + buf * BN * LD;

        float s[NN][4]; /* C layout: S rows g / g+8, keys j0 + 8n + 2t, +1 */
        fl_zero(s);
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
#pragma unroll
            for (int np = 0; np < NN / 2; np++) {
                uint32_t bb[4];
                mma_ldb_nk<LD>(bb, Kb + np * 16 * LD + kk * 16, lane);
                mma_16816<F16>(s[2 * np], qf[kk], bb[0], bb[1]);
                mma_16816<F16>(s[2 * np + 1], qf[kk], bb[2], bb[3]);
            }
        }
        const bool full = fl_full(a, i0, Tq, BM, j0, jhi + 1, BN);
        const fl_span sp[2] = {fl_keys_of(a, ri[0], jhi, j0, BN), fl_keys_of(a, ri[1], jhi, j0, BN)};
        /* raw scores stay unscaled (masked ones -inf): the scale, positive,
         * commutes with the max and folds into one FFMA before the exponent */
        if (!full)
#pragma unroll
            for (int n = 0; n < NN; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = 8 * n + 2 * tq + (e & 1); /* key j0 + c */
                    if (c < sp[e >> 1].lo || c > sp[e >> 1].hi) s[n][e] = -INFINITY;
                }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NN; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            /* the 4 threads of a quad (same g) hold a row's 64 scores */
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(mrow[r], mx * sl2);      /* running max in the log2 domain */
            const float mu = mnew == -INFINITY ? 0.0f : mnew; /* a row with no key yet: p = 0, no NaN */
            const float corr = mma_ex2(mrow[r] - mu);
            mrow[r] = mnew;
            float ls = 0.0f;
#pragma unroll
            for (int n = 0; n < NN; n++) {
                const float p0 = mma_ex2(fmaf(s[n][2 * r], sl2, -mu)), p1 = mma_ex2(fmaf(s[n][2 * r + 1], sl2, -mu));
                s[n][2 * r] = p0;
                s[n][2 * r + 1] = p1;
                ls += p0 + p1;
            }
            lrow[r] = lrow[r] * corr + ls;
#pragma unroll
            for (int n = 0; n < ND; n++) {
                oacc[n][2 * r] *= corr;
                oacc[n][2 * r + 1] *= corr;
            }
        }
        mma_gemm_pk<F16, LD, ND, BN / 16>(oacc, s, Vb, lane); /* O += P V, P rounded to the input type */
        __syncthreads();                                      /* before the next prefetch overwrites buf */
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int64_t i = ri[r];
        if (i >= Tq) continue;
        if (lse && tq == 0) lse[(b * q.H + h) * Tq + i] = l > 0.0f ? mrow[r] * FL_LN2 + logf(l) : -INFINITY;
        fl_store_row<ND>(o, cuk_roff(o, b, i, h), oacc, r, l > 0.0f ? 1.0f / l : 0.0f, tq);
    }
}

/* ---------------------------------------------------------------- backward */

/* D_i = rowsum(dO * O), one warp per row, any dtypes. */
__global__ void k_fl_dvec(float *dvec, cuk_bthd g, cuk_bthd o, int64_t rows) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int lane = threadIdx.x & 31;
    const int64_t i = r % g.T, bh = r / g.T, h = bh % g.H, b = bh / g.H;
    const int64_t og = cuk_roff(g, b, i, h), oo = cuk_roff(o, b, i, h);
    float acc = 0.0f;
    for (int64_t d = lane; d < g.D; d += 32) acc += ldf(g.p, g.dt, og + d) * ldf(o.p, o.dt, oo + d);
    acc = warp_sum(acc);
    if (lane == 0) dvec[r] = acc;
}

/* The same with 16-byte loads when dO and O are 16-bit of one dtype with
 * aligned rows (fl_view_ok) and D <= 256: D / 8 lanes per row, so a warp
 * covers 32 * 8 / D rows (4 at D 64). The one-warp-per-row kernel above
 * reads only 64 bytes per warp per load, far from the memory bandwidth. The
 * lanes of a row add in a fixed butterfly order: repeatable, though not
 * bitwise the other kernel's order. */
template <bool F16> __global__ void k_fl_dvec_vec(float *dvec, cuk_bthd g, cuk_bthd o, int64_t rows) {
    const int lpr = (int)(g.D >> 3), lane = threadIdx.x & 31, sub = lane % lpr;
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / lpr;
    float acc = 0.0f;
    if (r < rows) {
        const int64_t i = r % g.T, bh = r / g.T, h = bh % g.H, b = bh / g.H;
        float x[8], y[8];
        cuk_ld8<F16 ? CUK_F16 : CUK_BF16>(g.p, cuk_roff(g, b, i, h) + sub * 8, x);
        cuk_ld8<F16 ? CUK_F16 : CUK_BF16>(o.p, cuk_roff(o, b, i, h) + sub * 8, y);
#pragma unroll
        for (int e = 0; e < 8; e++) acc += x[e] * y[e];
    }
    /* lpr is a power of two dividing 32: the xor partners stay within the row's lanes */
    for (int m = lpr >> 1; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    if (r < rows && sub == 0) dvec[r] = acc;
}

/* dK, dV for 64 keys (16 per warp); loops over the kv group's query heads
 * and chunks of QC query rows, double buffered. The products are
 * transposed (keys are the mma rows): S^T = K Q^T, dP^T = V dO^T,
 * dV += P^T dO, dK += dS^T Q. */
template <int D, int QC, bool F16, int MINB = 1>
__global__ void __launch_bounds__(FL_NTH, MINB)
    k_fl_bwd_kv(cuk_bthd dk, cuk_bthd dv, cuk_bthd g, cuk_bthd q, cuk_bthd k, cuk_bthd v, const float *lse,
                const float *dvec, cuk_attn a, int64_t ntiles, float sl2) {
    constexpr int LD = D + 8, BN = 64, KD = D / 16, ND = D / 8, NQ = QC / 8;
    extern __shared__ __align__(128) unsigned char fl_sm[];
    e16 *Ks = (e16 *)fl_sm, *Vs = Ks + BN * LD, *Qs = Vs + BN * LD,
        *Gs = Qs + 2 * QC * LD;                                 /* Q/dO buffer x at +x*QC*LD */
    float *Ls = (float *)(Gs + 2 * QC * LD), *Ds = Ls + 2 * QC; /* buffer x at +x*QC */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int64_t kt = (int64_t)blockIdx.x % ntiles, bh = (int64_t)blockIdx.x / ntiles;
    const int64_t b = bh / k.H, hk = bh % k.H, group = q.H / k.H;
    const int64_t Tq = q.T, Tk = k.T, j0 = kt * BN;
    const int64_t jlast = j0 + BN - 1 < Tk - 1 ? j0 + BN - 1 : Tk - 1;
    int64_t ilo, ihi;
    cuk_query_span(a, j0, jlast, Tq, &ilo, &ihi);
    const int64_t nq = ihi >= ilo ? (ihi - ilo + QC) / QC : 0, total = group * nq;

    /* lse (log2 domain) and D of query row i0 + tid of head h; rows past
     * the span get lse = +inf, i.e. P = 0 */
    auto stats = [&](int64_t it, float &l2, float &dd) {
        const int64_t h = hk * group + it / nq, i = ilo + (it % nq) * QC + tid;
        l2 = INFINITY;
        dd = 0.0f;
        if (i <= ihi) {
            const int64_t row = (b * q.H + h) * Tq + i;
            l2 = lse[row] * FL_LOG2E;
            dd = dvec[row];
            if (l2 == -INFINITY) l2 = INFINITY;
        }
    };
    fl_load<BN, D>(Ks, k, b, hk, j0, Tk);
    fl_load<BN, D>(Vs, v, b, hk, j0, Tk);
    if (total > 0) {
        fl_load<QC, D>(Qs, q, b, hk * group, ilo, ihi + 1);
        fl_load<QC, D>(Gs, g, b, hk * group, ilo, ihi + 1);
        if (tid < QC) stats(0, Ls[tid], Ds[tid]);
    }
    mma_commit();

    float kacc[ND][4], vacc[ND][4]; /* C layout: dK/dV rows (keys) g / g+8 of the warp, dims 8n + 2t, +1 */
    fl_zero(kacc);
    fl_zero(vacc);
    const int64_t kj[2] = {j0 + warp * 16 + gq, j0 + warp * 16 + gq + 8};
    const e16 *Kw = Ks + warp * 16 * LD, *Vw = Vs + warp * 16 * LD;

    for (int64_t it = 0; it < total; it++) {
        const int buf = (int)(it & 1);
        const int64_t i0 = ilo + (it % nq) * QC;
        float nl = 0.0f, nd = 0.0f;
        if (it + 1 < total) {
            const int64_t h1 = hk * group + (it + 1) / nq, i1 = ilo + ((it + 1) % nq) * QC;
            fl_load<QC, D>(Qs + (buf ^ 1) * QC * LD, q, b, h1, i1, ihi + 1);
            fl_load<QC, D>(Gs + (buf ^ 1) * QC * LD, g, b, h1, i1, ihi + 1);
            mma_commit();
            if (tid < QC) stats(it + 1, nl, nd);
            mma_wait<1>();
        } else {
            mma_wait<0>();
        }
        __syncthreads();
        const e16 *Qb = Qs + buf * QC * LD, *Gb = Gs + buf * QC * LD;
        const float *Lb = Ls + buf * QC, *Db = Ds + buf * QC;

        float s[NQ][4], dp[NQ][4]; /* C layout: rows = keys g / g+8, cols = queries i0 + 8n + 2t, +1 */
        fl_zero(s);
        fl_zero(dp);
        mma_gemm_nk<F16, LD, NQ, KD>(s, Kw, Qb, lane);  /* S^T = K Q^T */
        mma_gemm_nk<F16, LD, NQ, KD>(dp, Vw, Gb, lane); /* dP^T = V dO^T */
        const bool full = fl_full(a, i0, ihi + 1, QC, j0, Tk, BN);
        const fl_span sp[2] = {fl_queries_of(a, kj[0], Tk, ihi, i0, QC), fl_queries_of(a, kj[1], Tk, ihi, i0, QC)};
#pragma unroll
        for (int n = 0; n < NQ; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = 8 * n + 2 * tq + (e & 1); /* query i0 + c */
                float p = mma_ex2(fmaf(s[n][e], sl2, -Lb[c]));
                if (!full && (c < sp[e >> 1].lo || c > sp[e >> 1].hi)) p = 0.0f;
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - Db[c]); /* dS^T without the scale (applied to dK at the end) */
            }
        mma_gemm_pk<F16, LD, ND, QC / 16>(vacc, s, Gb, lane);  /* dV += P^T dO */
        mma_gemm_pk<F16, LD, ND, QC / 16>(kacc, dp, Qb, lane); /* dK += dS^T Q */
        if (it + 1 < total && tid < QC) {                      /* buffer buf^1 was last read in it - 1 */
            Ls[(buf ^ 1) * QC + tid] = nl;
            Ds[(buf ^ 1) * QC + tid] = nd;
        }
        __syncthreads();
    }
    mma_wait<0>();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t j = kj[r];
        if (j >= Tk) continue;
        if (dk.p) fl_store_row<ND>(dk, cuk_roff(dk, b, j, hk), kacc, r, a.scale, tq);
        if (dv.p) fl_store_row<ND>(dv, cuk_roff(dv, b, j, hk), vacc, r, 1.0f, tq);
    }
}

/* dQ for 64 query rows (16 per warp), looping over key tiles of 64:
 * S = Q K^T, dP = dO V^T, dQ += dS K. */
template <int D, bool F16, int MINB = 1>
__global__ void __launch_bounds__(FL_NTH, MINB)
    k_fl_bwd_q(cuk_bthd dq, cuk_bthd g, cuk_bthd q, cuk_bthd k, cuk_bthd v, const float *lse, const float *dvec,
               cuk_attn a, int64_t ntiles, float sl2) {
    constexpr int LD = D + 8, BM = 64, BN = 64, KD = D / 16, ND = D / 8, NN = BN / 8;
    extern __shared__ __align__(128) unsigned char fl_sm[];
    e16 *Qs = (e16 *)fl_sm, *Gs = Qs + BM * LD, *Ks = Gs + BM * LD, *Vs = Ks + 2 * BN * LD;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const fl_qtile qt = fl_qtile_of(q, k, a, ntiles, BM, BN);
    const int64_t b = qt.b, h = qt.h, hk = qt.hk, Tq = q.T, i0 = qt.i0, jlo = qt.jlo, jhi = qt.jhi, nkt = qt.nkt;

    fl_load<BM, D>(Qs, q, b, h, i0, Tq);
    fl_load<BM, D>(Gs, g, b, h, i0, Tq);
    if (nkt > 0) {
        fl_load<BN, D>(Ks, k, b, hk, jlo, jhi + 1);
        fl_load<BN, D>(Vs, v, b, hk, jlo, jhi + 1);
    }
    mma_commit();
    const int64_t ri[2] = {i0 + warp * 16 + gq, i0 + warp * 16 + gq + 8};
    float l2[2], dd[2]; /* rows g, g+8: lse in the log2 domain (+inf: P = 0), D */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l2[r] = INFINITY;
        dd[r] = 0.0f;
        if (ri[r] < Tq) {
            const int64_t row = (b * q.H + h) * Tq + ri[r];
            l2[r] = lse[row] * FL_LOG2E;
            dd[r] = dvec[row];
            if (l2[r] == -INFINITY) l2[r] = INFINITY;
        }
    }
    float qacc[ND][4]; /* C layout: dQ rows g / g+8 of the warp, dims 8n + 2t, +1 */
    fl_zero(qacc);
    const e16 *Qw = Qs + warp * 16 * LD, *Gw = Gs + warp * 16 * LD;

    for (int64_t it = 0; it < nkt; it++) {
        const int buf = (int)(it & 1);
        const int64_t j0 = jlo + it * BN;
        fl_next_kv<BN, D>(Ks, Vs, k, v, b, hk, buf, it + 1 < nkt, j0 + BN, jhi + 1);
        const e16 *Kb = Ks + buf * BN * LD, *Vb = Vs + buf * BN * LD;
        float s[NN][4], dp[NN][4]; /* C layout: rows = queries g / g+8, cols = keys j0 + 8n + 2t, +1 */
        fl_zero(s);
        fl_zero(dp);
        mma_gemm_nk<F16, LD, NN, KD>(s, Qw, Kb, lane);  /* S = Q K^T */
        mma_gemm_nk<F16, LD, NN, KD>(dp, Gw, Vb, lane); /* dP = dO V^T */
        const bool full = fl_full(a, i0, Tq, BM, j0, jhi + 1, BN);
        const fl_span sp[2] = {fl_keys_of(a, ri[0], jhi, j0, BN), fl_keys_of(a, ri[1], jhi, j0, BN)};
#pragma unroll
        for (int n = 0; n < NN; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, c = 8 * n + 2 * tq + (e & 1); /* key j0 + c */
                float p = mma_ex2(fmaf(s[n][e], sl2, -l2[r]));
                if (!full && (c < sp[r].lo || c > sp[r].hi)) p = 0.0f;
                dp[n][e] = p * (dp[n][e] - dd[r]); /* dS without the scale */
            }
        mma_gemm_pk<F16, LD, ND, BN / 16>(qacc, dp, Kb, lane); /* dQ += dS K */
        __syncthreads();
    }
    mma_wait<0>();
#pragma unroll
    for (int r = 0; r < 2; r++)
        if (ri[r] < Tq) fl_store_row<ND>(dq, cuk_roff(dq, b, ri[r], h), qacc, r, a.scale, tq);
}

CUK_EMU_END(flash);

/* ---------------------------------------------------------------- launchers */

/* The dK/dV kernel walks the queries in chunks of FL_KV_QC rows: with 64
 * its four unrolled products overflow the instruction cache (Nsight Compute
 * puts the largest stall on instruction fetch), with 32 the loop body fits
 * and head_dim 64 needs 128 registers without spills. */
#define FL_KV_QC 32

/* Minimum resident blocks per SM (__launch_bounds__) of the forward, dK/dV
 * and dQ kernels. At head_dim 64 they are latency-bound (under one eligible
 * warp per scheduler in Nsight Compute), so they are compiled for 4 blocks
 * (16 warps) per SM: register caps of 128, a few bytes of spill. At 128 the
 * accumulators need the registers of one block. */
template <int D> struct fl_minb {
    static constexpr int fwd = D == 64 ? 4 : 1, kv = D == 64 ? 4 : 1, q = D == 64 ? 4 : 1;
};

/* The kernels' shared memory exceeds the default 48 KB for head_dim 128
 * (and the backward at 64): raise the limit once per device. */
template <int D, bool F16> static cudaError_t fl_setup_one(void) {
    return cuk_smem_limits(k_fl_fwd<D, F16, fl_minb<D>::fwd>, fl_fwd_smem<D>(),
                           k_fl_bwd_kv<D, FL_KV_QC, F16, fl_minb<D>::kv>, fl_kv_smem<D, FL_KV_QC>(),
                           k_fl_bwd_q<D, F16, fl_minb<D>::q>, fl_q_smem<D>());
}

static cudaError_t fl_setup_all(void) {
    cudaError_t e = fl_setup_one<64, false>();
    if (e == cudaSuccess) e = fl_setup_one<128, false>();
    if (e == cudaSuccess) e = fl_setup_one<64, true>();
    if (e == cudaSuccess) e = fl_setup_one<128, true>();
    return e;
}
static cudaError_t fl_setup(void) { return cuk_once_per_device<fl_setup_all>(); }

static int fl_view_ok(const cuk_bthd *t, int dt) {
    return t->dt == dt && ((uintptr_t)t->p & 15) == 0 && t->sb % 8 == 0 && t->st % 8 == 0 && t->sh % 8 == 0;
}

extern "C" int cuk_attn_flash_ok(const cuk_bthd *q, const cuk_bthd *k, const cuk_bthd *v, const cuk_bthd *dout) {
    if (q->dt != CUK_BF16 && q->dt != CUK_F16) return 0;
    if (q->D != 64 && q->D != 128) return 0;
    return fl_view_ok(q, q->dt) && fl_view_ok(k, q->dt) && fl_view_ok(v, q->dt) && (!dout || fl_view_ok(dout, q->dt));
}

template <int D, bool F16>
static cudaError_t fl_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a) {
    const int64_t nt = cuk_cdiv(q.T, 64);
    const unsigned grid = (unsigned)(q.B * q.H * nt);
    k_fl_fwd<D, F16, fl_minb<D>::fwd>
        <<<grid, FL_NTH, fl_fwd_smem<D>(), s>>>(o, lse, q, k, v, a, nt, a.scale * FL_LOG2E);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_attn_flash_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v,
                                          cuk_attn a) {
    if (q.B * q.H * q.T <= 0) return cudaSuccess;
    cudaError_t e = fl_setup();
    if (e != cudaSuccess) return e;
    const bool f16 = q.dt == CUK_F16;
    if (q.D == 64) return f16 ? fl_fwd<64, true>(s, o, lse, q, k, v, a) : fl_fwd<64, false>(s, o, lse, q, k, v, a);
    return f16 ? fl_fwd<128, true>(s, o, lse, q, k, v, a) : fl_fwd<128, false>(s, o, lse, q, k, v, a);
}

template <int D, bool F16>
static cudaError_t fl_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd g, cuk_bthd q, cuk_bthd k,
                          cuk_bthd v, const float *lse, const float *dvec, cuk_attn a) {
    const float sl2 = a.scale * FL_LOG2E;
    if ((dk.p || dv.p) && k.B * k.H * k.T > 0) {
        const int64_t nt = cuk_cdiv(k.T, 64);
        const unsigned grid = (unsigned)(k.B * k.H * nt);
        k_fl_bwd_kv<D, FL_KV_QC, F16, fl_minb<D>::kv>
            <<<grid, FL_NTH, fl_kv_smem<D, FL_KV_QC>(), s>>>(dk, dv, g, q, k, v, lse, dvec, a, nt, sl2);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    if (dq.p && q.B * q.H * q.T > 0) {
        const int64_t nt = cuk_cdiv(q.T, 64);
        const unsigned grid = (unsigned)(q.B * q.H * nt);
        k_fl_bwd_q<D, F16, fl_minb<D>::q><<<grid, FL_NTH, fl_q_smem<D>(), s>>>(dq, g, q, k, v, lse, dvec, a, nt, sl2);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_attn_flash_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd dout,
                                          cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_bthd o, const float *lse, float *dvec,
                                          cuk_attn a) {
    const int64_t rows = q.B * q.H * q.T;
    if (rows > 0) {
        if (dout.dt == o.dt && fl_view_ok(&dout, dout.dt) && fl_view_ok(&o, o.dt) && (q.D == 64 || q.D == 128)) {
            const int64_t lanes = rows * (q.D >> 3);
            if (o.dt == CUK_F16)
                k_fl_dvec_vec<true><<<(unsigned)cuk_cdiv(lanes, 256), 256, 0, s>>>(dvec, dout, o, rows);
            else k_fl_dvec_vec<false><<<(unsigned)cuk_cdiv(lanes, 256), 256, 0, s>>>(dvec, dout, o, rows);
        } else {
            k_fl_dvec<<<(unsigned)cuk_cdiv(rows, 8), 256, 0, s>>>(dvec, dout, o, rows);
        }
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    cudaError_t e = fl_setup();
    if (e != cudaSuccess) return e;
    const bool f16 = q.dt == CUK_F16;
    if (q.D == 64)
        return f16 ? fl_bwd<64, true>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a)
                   : fl_bwd<64, false>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a);
    return f16 ? fl_bwd<128, true>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a)
               : fl_bwd<128, false>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a);
}
