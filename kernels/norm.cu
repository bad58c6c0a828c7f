/* LayerNorm and RMSNorm over the last dimension: one warp per row, row
 * statistics in f32, the same arithmetic order as the CPU backend.
 *
 * Fast paths (rows 16-byte aligned, activations of one dtype, rows up to
 * 2048 wide forward / 1024 backward): the row is loaded once with 16-byte
 * accesses into registers (K chunks of 8 per lane, K a template parameter),
 * and the backward computes dinp and the dweight/dbias partials of a fixed
 * block of rows in the same pass: each lane keeps per-column sums of its
 * columns over the rows of its warp, the warps of a block are added in warp
 * order in shared memory, and the block partials are added in block order
 * by cuk_colsum_final: a fixed order, no atomics, bitwise repeatable.
 * Otherwise (misaligned or mixed-dtype rows, wider rows) the general
 * kernels below: two passes over the row, parameter gradients as column
 * sums (elementwise.cu). */
#include "cuda_common.cuh"

#define ROWS_PER_BLOCK 8

__global__ void __launch_bounds__(32 * ROWS_PER_BLOCK)
    k_norm_fwd(cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w, int wdt, const void *b, int bdt,
               float eps, int rms) {
    const int lane = threadIdx.x & 31;
    const int64_t r = blockIdx.x * (int64_t)ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= x.rows) return;
    const int64_t C = x.cols, xo = r * x.ld, yo = r * y.ld;
    float m = 0.0f;
    if (!rms) {
        float s = 0.0f;
        for (int64_t c = lane; c < C; c += 32) s += ldf(x.p, x.dt, xo + c);
        m = warp_sum(s) / (float)C;
    }
    float v = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        float d = ldf(x.p, x.dt, xo + c) - m;
        v += d * d;
    }
    v = warp_sum(v);
    const float rs = 1.0f / sqrtf(v / (float)C + eps);
    for (int64_t c = lane; c < C; c += 32) {
        float xv = ldf(x.p, x.dt, xo + c), wv = ldf(w, wdt, c), o;
        if (rms) o = wv * (xv * rs);
        else o = (xv - m) * rs * wv + (b ? ldf(b, bdt, c) : 0.0f);
        stf(y.p, y.dt, yo + c, o);
    }
    if (lane == 0) {
        if (mean && !rms) mean[r] = m;
        if (rstd) rstd[r] = rs;
    }
}

extern "C" cudaError_t cuk_norm_fwd(cudaStream_t s, cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w,
                                    int wdt, const void *b, int bdt, float eps, int rms) {
    if (x.rows <= 0) return cudaSuccess;
    k_norm_fwd<<<(unsigned)cuk_cdiv(x.rows, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, 0, s>>>(y, mean, rstd, x, w, wdt, b,
                                                                                          bdt, eps, rms);
    return cudaGetLastError();
}

__global__ void __launch_bounds__(32 * ROWS_PER_BLOCK)
    k_norm_bwd(cuk_mat dx, cuk_mat dy, cuk_mat x, const void *w, int wdt, const float *mean, const float *rstd,
               int accum) {
    const int lane = threadIdx.x & 31;
    const int64_t r = blockIdx.x * (int64_t)ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= x.rows) return;
    const int64_t C = x.cols, xo = r * x.ld, go = r * dy.ld, dxo = r * dx.ld;
    const float m = mean ? mean[r] : 0.0f, rs = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        float g = ldf(dy.p, dy.dt, go + c) * ldf(w, wdt, c);
        sg += g;
        sgx += g * ((ldf(x.p, x.dt, xo + c) - m) * rs);
    }
    sg = warp_sum(sg);
    sgx = warp_sum(sgx);
    const float mg = mean ? sg / (float)C : 0.0f, mgx = sgx / (float)C;
    for (int64_t c = lane; c < C; c += 32) {
        float g = ldf(dy.p, dy.dt, go + c) * ldf(w, wdt, c);
        float val = rs * (g - mg - (ldf(x.p, x.dt, xo + c) - m) * rs * mgx);
        if (accum) val = ldf(dx.p, dx.dt, dxo + c) + val;
        stf(dx.p, dx.dt, dxo + c, val);
    }
}

extern "C" cudaError_t cuk_norm_bwd_dinp(cudaStream_t s, cuk_mat dx, cuk_mat dy, cuk_mat x, const void *w, int wdt,
                                         const float *mean, const float *rstd, int accum) {
    if (x.rows <= 0) return cudaSuccess;
    k_norm_bwd<<<(unsigned)cuk_cdiv(x.rows, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, 0, s>>>(dx, dy, x, w, wdt, mean,
                                                                                          rstd, accum);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- fast paths */

/* 8 elements of a parameter vector of any dtype (a warp-uniform branch). */
CUK_INLINE void ld8_any(const void *p, int dt, int64_t i, int n, float *v) {
    if (dt == CUK_F32) cuk_ld8_tail<CUK_F32>(p, i, n, v);
    else if (dt == CUK_BF16) cuk_ld8_tail<CUK_BF16>(p, i, n, v);
    else cuk_ld8_tail<CUK_F16>(p, i, n, v);
}

/* Columns of lane's chunk k: [8 * (lane + 32 k), + n). */
#define CHUNK_N(C, lane, k) ((int)((C) - 8 * (int64_t)((lane) + 32 * (k)) < 8 ? (C) - 8 * (int64_t)((lane) + 32 * (k)) : 8))

template <int DT, int K, bool RMS>
__global__ void __launch_bounds__(32 * ROWS_PER_BLOCK)
    k_norm_fwd_reg(cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w, int wdt, const void *b, int bdt,
                   float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t r = blockIdx.x * (int64_t)ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= x.rows) return;
    const int64_t C = x.cols, xo = r * x.ld, yo = r * y.ld;
    float v[K][8];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int n = CHUNK_N(C, lane, k);
        if (n > 0) cuk_ld8_tail<DT>(x.p, xo + 8 * (lane + 32 * k), n, v[k]);
        else
#pragma unroll
            for (int e = 0; e < 8; e++) v[k][e] = 0.0f;
    }
    float m = 0.0f;
    if (!RMS) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) sum += v[k][e];
        m = warp_sum(sum) / (float)C;
    }
    float var = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int n = CHUNK_N(C, lane, k);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float d = e < n ? v[k][e] - m : 0.0f;
            var += d * d;
        }
    }
    var = warp_sum(var);
    const float rs = 1.0f / sqrtf(var / (float)C + eps);
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int n = CHUNK_N(C, lane, k);
        if (n <= 0) continue;
        const int64_t c0 = 8 * (int64_t)(lane + 32 * k);
        float wv[8], bv[8], o[8];
        ld8_any(w, wdt, c0, n, wv);
        if (!RMS && b) ld8_any(b, bdt, c0, n, bv);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            if (RMS) o[e] = wv[e] * (v[k][e] * rs);
            else o[e] = (v[k][e] - m) * rs * wv[e] + (b ? bv[e] : 0.0f);
        }
        cuk_st8_tail<DT>(y.p, yo + c0, n, o);
    }
    if (lane == 0) {
        if (mean && !RMS) mean[r] = m;
        if (rstd) rstd[r] = rs;
    }
}

template <int DT, int K>
static void launch_fwd_reg(cudaStream_t s, unsigned nb, cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w,
                           int wdt, const void *b, int bdt, float eps, int rms) {
    if (rms) k_norm_fwd_reg<DT, K, true><<<nb, 32 * ROWS_PER_BLOCK, 0, s>>>(y, mean, rstd, x, w, wdt, b, bdt, eps);
    else k_norm_fwd_reg<DT, K, false><<<nb, 32 * ROWS_PER_BLOCK, 0, s>>>(y, mean, rstd, x, w, wdt, b, bdt, eps);
}

template <int DT>
static bool fwd_reg(cudaStream_t s, int64_t kneed, cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w,
                    int wdt, const void *b, int bdt, float eps, int rms) {
    const unsigned nb = (unsigned)cuk_cdiv(x.rows, ROWS_PER_BLOCK);
    if (kneed <= 1) launch_fwd_reg<DT, 1>(s, nb, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 2) launch_fwd_reg<DT, 2>(s, nb, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 3) launch_fwd_reg<DT, 3>(s, nb, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 4) launch_fwd_reg<DT, 4>(s, nb, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 6) launch_fwd_reg<DT, 6>(s, nb, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 8) launch_fwd_reg<DT, 8>(s, nb, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else return false;
    return true;
}

/* Chunks of 8 per lane a row of C columns needs. */
static int64_t lane_chunks(int64_t C) { return cuk_cdiv(cuk_cdiv(C, 8), 32); }

static bool float_dt(int dt) { return dt == CUK_F32 || dt == CUK_BF16 || dt == CUK_F16; }

extern "C" cudaError_t cuk_norm_fwd_fast(cudaStream_t s, cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w,
                                         int wdt, const void *b, int bdt, float eps, int rms, int *done) {
    *done = 0;
    if (x.rows <= 0 || x.cols <= 0) return cudaSuccess;
    const int64_t kneed = lane_chunks(x.cols);
    if (kneed > 8 || x.dt != y.dt || !float_dt(x.dt) || !float_dt(wdt) || (b && !rms && !float_dt(bdt))) return cudaSuccess;
    if (!cuk_vec_ok(x) || !cuk_vec_ok(y) || !cuk_ptr16(w) || (b && !rms && !cuk_ptr16(b))) return cudaSuccess;
    if (rms) b = NULL;
    bool ok = x.dt == CUK_F32    ? fwd_reg<CUK_F32>(s, kneed, y, mean, rstd, x, w, wdt, b, bdt, eps, rms)
              : x.dt == CUK_BF16 ? fwd_reg<CUK_BF16>(s, kneed, y, mean, rstd, x, w, wdt, b, bdt, eps, rms)
                                 : fwd_reg<CUK_F16>(s, kneed, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    *done = ok;
    return cudaGetLastError();
}

/* Backward: a block of ROWS_PER_BLOCK warps owns rows [blockIdx.x * rpb, + rpb);
 * warp wp takes rows r0 + wp, r0 + wp + ROWS_PER_BLOCK, ... in order. */
template <int DT, int K, bool RMS>
__global__ void __launch_bounds__(32 * ROWS_PER_BLOCK)
    k_norm_bwd_reg(cuk_mat dx, float *pw, float *pb, cuk_mat dy, cuk_mat x, const void *w, int wdt, const float *mean,
                   const float *rstd, int accum, int64_t rpb) {
    extern __shared__ float sh[]; /* [ROWS_PER_BLOCK][C] */
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int64_t C = x.cols, r0 = blockIdx.x * rpb, r1 = r0 + rpb < x.rows ? r0 + rpb : x.rows;
    float aw[K][8], ab[K][8];
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int e = 0; e < 8; e++) aw[k][e] = ab[k][e] = 0.0f;
    for (int64_t r = r0 + wp; r < r1; r += ROWS_PER_BLOCK) {
        const float m = RMS ? 0.0f : mean[r], rs = rstd[r];
        float g[K][8], xh[K][8];
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int n = CHUNK_N(C, lane, k);
            if (n <= 0) continue;
            const int64_t c0 = 8 * (int64_t)(lane + 32 * k);
            float wv[8];
            cuk_ld8_tail<DT>(dy.p, r * dy.ld + c0, n, g[k]);
            cuk_ld8_tail<DT>(x.p, r * x.ld + c0, n, xh[k]);
            ld8_any(w, wdt, c0, n, wv);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float d = g[k][e], xc = xh[k][e] - m;
                xh[k][e] = xc;   /* keep x - mean; the CPU's order multiplies by rstd where used */
                ab[k][e] += d;
                aw[k][e] += d * (xc * rs);
                g[k][e] = d * wv[e];
                if (e < n) {
                    sg += g[k][e];
                    sgx += g[k][e] * (xc * rs);
                }
            }
        }
        sg = warp_sum(sg);
        sgx = warp_sum(sgx);
        if (!dx.p) continue;
        const float mg = RMS ? 0.0f : sg / (float)C, mgx = sgx / (float)C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int n = CHUNK_N(C, lane, k);
            if (n <= 0) continue;
            const int64_t c0 = 8 * (int64_t)(lane + 32 * k);
            float o[8], prev[8];
            if (accum) cuk_ld8_tail<DT>(dx.p, r * dx.ld + c0, n, prev);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float val = rs * (g[k][e] - mg - xh[k][e] * rs * mgx);
                o[e] = accum ? prev[e] + val : val;
            }
            cuk_st8_tail<DT>(dx.p, r * dx.ld + c0, n, o);
        }
    }
    if (!pw && !pb) return;
    /* warp partials -> block partial, warps added in order */
    for (int pass = 0; pass < 2; pass++) {
        float *out = pass == 0 ? pw : pb;
        if (!out) continue;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int n = CHUNK_N(C, lane, k);
            const int64_t c0 = 8 * (int64_t)(lane + 32 * k);
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (e < n) sh[wp * C + c0 + e] = pass == 0 ? aw[k][e] : ab[k][e];
        }
        __syncthreads();
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = 0.0f;
            for (int q = 0; q < ROWS_PER_BLOCK; q++) acc += sh[q * C + c];
            out[blockIdx.x * C + c] = acc;
        }
        __syncthreads();
    }
}

template <int DT, int K>
static void launch_bwd_reg(cudaStream_t s, unsigned nb, size_t smem, cuk_mat dx, float *pw, float *pb, cuk_mat dy,
                           cuk_mat x, const void *w, int wdt, const float *mean, const float *rstd, int accum,
                           int64_t rpb) {
    if (!mean)
        k_norm_bwd_reg<DT, K, true><<<nb, 32 * ROWS_PER_BLOCK, smem, s>>>(dx, pw, pb, dy, x, w, wdt, mean, rstd, accum,
                                                                          rpb);
    else
        k_norm_bwd_reg<DT, K, false><<<nb, 32 * ROWS_PER_BLOCK, smem, s>>>(dx, pw, pb, dy, x, w, wdt, mean, rstd,
                                                                           accum, rpb);
}

template <int DT>
static void bwd_reg(cudaStream_t s, int64_t kneed, unsigned nb, size_t smem, cuk_mat dx, float *pw, float *pb,
                    cuk_mat dy, cuk_mat x, const void *w, int wdt, const float *mean, const float *rstd, int accum,
                    int64_t rpb) {
    if (kneed <= 1) launch_bwd_reg<DT, 1>(s, nb, smem, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    else if (kneed <= 2) launch_bwd_reg<DT, 2>(s, nb, smem, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    else if (kneed <= 3) launch_bwd_reg<DT, 3>(s, nb, smem, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    else launch_bwd_reg<DT, 4>(s, nb, smem, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
}

/* Rows per block of the fused backward: 32 (a few blocks per SM at GPT-2
 * sizes), more when the block partials would not fit the scratch. A
 * function of the shape and the scratch size only, so the order of the
 * parameter-gradient sums is fixed. */
#define BWD_RPB 32

extern "C" cudaError_t cuk_norm_bwd_fast(cudaStream_t s, cuk_mat dx, float *dw, float *db, cuk_mat dy, cuk_mat x,
                                         const void *w, int wdt, const float *mean, const float *rstd, int accum,
                                         float *scratch, size_t scratch_floats, int *done) {
    *done = 0;
    if (x.rows <= 0 || x.cols <= 0) return cudaSuccess;
    const int64_t C = x.cols, kneed = lane_chunks(C);
    if (kneed > 4 || dy.dt != x.dt || (dx.p && dx.dt != x.dt) || !float_dt(x.dt) || !float_dt(wdt)) return cudaSuccess;
    if (!cuk_vec_ok(x) || !cuk_vec_ok(dy) || (dx.p && !cuk_vec_ok(dx)) || !cuk_ptr16(w)) return cudaSuccess;
    if (!dx.p) accum = 0; /* dinp's old value is read only when dinp is written */
    const int64_t per = (dw ? 1 : 0) + (db ? 1 : 0);
    int64_t rpb = BWD_RPB, nb = cuk_cdiv(x.rows, rpb);
    if (per > 0) {
        const int64_t maxb = (int64_t)(scratch_floats / (size_t)(per * C));
        if (maxb < 1) return cudaSuccess;
        if (nb > maxb) {
            rpb = cuk_cdiv(x.rows, maxb);
            nb = cuk_cdiv(x.rows, rpb);
        }
    }
    if (nb > 2147483647) return cudaSuccess;
    float *pw = dw ? scratch : NULL, *pb = db ? scratch + (dw ? nb * C : 0) : NULL;
    const size_t smem = per > 0 ? (size_t)ROWS_PER_BLOCK * (size_t)C * sizeof(float) : 0;
    if (x.dt == CUK_F32) bwd_reg<CUK_F32>(s, kneed, (unsigned)nb, smem, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    else if (x.dt == CUK_BF16)
        bwd_reg<CUK_BF16>(s, kneed, (unsigned)nb, smem, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    else bwd_reg<CUK_F16>(s, kneed, (unsigned)nb, smem, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    *done = 1;
    return cuk_colsum_final(s, pw, pb, nb, C, dw, db);
}
