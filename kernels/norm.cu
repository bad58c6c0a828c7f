/* LayerNorm and RMSNorm over the last dimension: one warp per row, row
 * statistics in f32 registers (two passes over the row, the second from
 * L1/L2), the same arithmetic order as the CPU backend. Parameter gradients
 * are column sums (elementwise.cu, deterministic). */
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
