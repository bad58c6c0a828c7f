/* Linear layers of a few rows (a decode step's batch): y[n] = W x[n]
 * (+ bias) (+ residual) for n < N <= CUK_GEMV_MAX_N, 16-bit data, f32
 * accumulation.
 *
 * At a handful of rows the product is a pass over the weights, and what
 * counts is how many bytes of them are in flight. cuBLASLt's kernels for
 * these shapes read the H200's HBM at 1.2 to 2.8 TB/s (bench/RESULTS.md);
 * here a warp (or, for long rows, KS warps) owns one output feature, each
 * lane streams 16-byte chunks of its row with eight loads issued before any
 * is used, and the rows of x (a few KB, read by every warp) come from
 * L1/L2. The warp's lanes then sum their partials with shuffles.
 *
 * Programmatic dependent launch: a product is launched so that it may start
 * before its predecessor in the stream has finished; it issues its first
 * weight loads (which nothing in the step writes) and only then waits for
 * the predecessor (cuk_pdl_wait) before it reads x, so the weight
 * stream's latency overlaps the previous kernel's tail. Each product lets
 * its own successor start once its loads are all issued. Neither changes
 * the per-lane order of the sums. */
#include "cuda_common.cuh"

CUK_EMU_BEGIN(gemv);
#define GV_WARPS 8
#define GV_UNROLL 8

/* acc[n] += dot(w chunk, x[n] chunk c) */
template <int DT, int NB> CUK_INLINE void gv_fma(float *acc, const uint4 &wu, const cuk_mat &x, int N, int64_t c) {
    float wf[8];
    cuk_unpack8<DT>(wu, wf);
#pragma unroll
    for (int n = 0; n < NB; n++) {
        if (n >= N) break;
        const uint4 xu = __ldg((const uint4 *)((const uint16_t *)x.p + n * x.ld) + c);
        float xf[8];
        cuk_unpack8<DT>(xu, xf);
#pragma unroll
        for (int e = 0; e < 8; e++) acc[n] = fmaf(wf[e], xf[e], acc[n]);
    }
}

/* KS warps share a row where it is long: warp part p of the row takes the
 * 512-byte stretches p, p + KS, ... (lane l the chunks l + 32 (p + KS j)),
 * so a lane has at most GV_UNROLL chunks in flight per pass however long
 * the row, and a grid of a few thousand rows still keeps every SM's loads
 * in flight. The parts' sums meet in shared memory, added in part order;
 * with KS = 1 a warp visits a row as it always has. */
template <int NB, int KS> CUK_INLINE bool gv_combine(float (&acc)[NB], float *sm, int lane, int warp) {
    if (KS == 1) return lane == 0;
    if (lane == 0)
#pragma unroll
        for (int n = 0; n < NB; n++) sm[warp * NB + n] = acc[n];
    __syncthreads();
    if (lane != 0 || warp % KS != 0) return false;
#pragma unroll
    for (int n = 0; n < NB; n++) {
        float v = sm[warp * NB + n];
#pragma unroll
        for (int q = 1; q < KS; q++) v += sm[(warp + q) * NB + n];
        acc[n] = v;
    }
    return true;
}

template <int DT, int NB, int KS>
__global__ void __launch_bounds__(GV_WARPS * 32)
    k_gemv(cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r, int N) {
    __shared__ float sm[KS > 1 ? GV_WARPS * NB : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t o = (int64_t)blockIdx.x * (GV_WARPS / KS) + warp / KS;
    if (KS == 1 && o >= w.rows) return; /* with parts, every warp reaches the barrier */
    const bool live = o < w.rows;
    const uint4 *wr = (const uint4 *)((const uint16_t *)w.p + (live ? o : 0) * w.ld);
    const int64_t nc = live ? w.cols >> 3 : 0, step = 32 * KS;
    float acc[NB];
#pragma unroll
    for (int n = 0; n < NB; n++) acc[n] = 0.0f;
    int64_t c = lane + 32 * (warp % KS);
    uint4 wu[GV_UNROLL];
    const bool first = c + step * (GV_UNROLL - 1) < nc;
    if (first) {
#pragma unroll
        for (int u = 0; u < GV_UNROLL; u++) wu[u] = __ldcs(wr + c + step * u); /* read once: do not keep in cache */
    }
    cuk_pdl_wait();
    if (first) {
#pragma unroll
        for (int u = 0; u < GV_UNROLL; u++) gv_fma<DT, NB>(acc, wu[u], x, N, c + step * u);
        c += step * GV_UNROLL;
    }
    for (; c + step * (GV_UNROLL - 1) < nc; c += step * GV_UNROLL) {
#pragma unroll
        for (int u = 0; u < GV_UNROLL; u++) wu[u] = __ldcs(wr + c + step * u);
#pragma unroll
        for (int u = 0; u < GV_UNROLL; u++) gv_fma<DT, NB>(acc, wu[u], x, N, c + step * u);
    }
    for (; c < nc; c += step) gv_fma<DT, NB>(acc, __ldcs(wr + c), x, N, c);
    cuk_pdl_trigger();
#pragma unroll
    for (int n = 0; n < NB; n++) acc[n] = warp_sum(acc[n]);
    if (!gv_combine<NB, KS>(acc, sm, lane, warp) || !live) return;
    const float b = bias ? ldf(bias, bias_dt, o) : 0.0f;
    for (int n = 0; n < N; n++) {
        float v = acc[n] + b;
        if (r.p) v += cuk_ld1<DT>(r.p, n * r.ld + o);
        cuk_st1<DT>(y.p, n * y.ld + o, v);
    }
}

/* A Llama MLP's gate and up rows of output feature o in one warp: half
 * the unroll per matrix keeps the loads in flight per warp (and the
 * registers) as k_gemv's, and each lane visits its chunks in k_gemv's
 * order, so the two sums are k_gemv's bit for bit; one launch instead of
 * three (two products and the SwiGLU). */
#define GS_UNROLL (GV_UNROLL / 2)
template <int DT> CUK_INLINE float gv_round(float v) {
    return DT == CUK_BF16 ? cuk_bf16_to_f32(cuk_f32_to_bf16(v)) : cuk_f16_to_f32(cuk_f32_to_f16_mode(v, 0, 0));
}

template <int DT, int NB, int KS>
__global__ void __launch_bounds__(GV_WARPS * 32) k_gemv_swiglu(cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, int N) {
    __shared__ float sm[KS > 1 ? 2 * GV_WARPS * NB : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t o = (int64_t)blockIdx.x * (GV_WARPS / KS) + warp / KS;
    if (KS == 1 && o >= wg.rows) return;
    const bool live = o < wg.rows;
    const uint4 *gr = (const uint4 *)((const uint16_t *)wg.p + (live ? o : 0) * wg.ld);
    const uint4 *ur = (const uint4 *)((const uint16_t *)wu.p + (live ? o : 0) * wu.ld);
    const int64_t nc = live ? wg.cols >> 3 : 0, step = 32 * KS;
    float ag[NB], au[NB];
#pragma unroll
    for (int n = 0; n < NB; n++) ag[n] = au[n] = 0.0f;
    int64_t c = lane + 32 * (warp % KS);
    uint4 gw[GS_UNROLL], uw[GS_UNROLL];
    bool pending = c + step * (GS_UNROLL - 1) < nc;
    if (pending) {
#pragma unroll
        for (int u = 0; u < GS_UNROLL; u++) {
            gw[u] = __ldcs(gr + c + step * u);
            uw[u] = __ldcs(ur + c + step * u);
        }
    }
    cuk_pdl_wait();
    for (; c + step * (GS_UNROLL - 1) < nc; c += step * GS_UNROLL) {
        if (!pending) {
#pragma unroll
            for (int u = 0; u < GS_UNROLL; u++) {
                gw[u] = __ldcs(gr + c + step * u);
                uw[u] = __ldcs(ur + c + step * u);
            }
        }
        pending = false;
#pragma unroll
        for (int u = 0; u < GS_UNROLL; u++) {
            gv_fma<DT, NB>(ag, gw[u], x, N, c + step * u);
            gv_fma<DT, NB>(au, uw[u], x, N, c + step * u);
        }
    }
    for (; c < nc; c += step) {
        gv_fma<DT, NB>(ag, __ldcs(gr + c), x, N, c);
        gv_fma<DT, NB>(au, __ldcs(ur + c), x, N, c);
    }
    cuk_pdl_trigger();
#pragma unroll
    for (int n = 0; n < NB; n++) {
        ag[n] = warp_sum(ag[n]);
        au[n] = warp_sum(au[n]);
    }
    const bool mine = gv_combine<NB, KS>(ag, sm, lane, warp);
    gv_combine<NB, KS>(au, sm + (KS > 1 ? GV_WARPS * NB : 0), lane, warp);
    if (!mine || !live) return;
    for (int n = 0; n < N; n++) {
        const float g = gv_round<DT>(ag[n]), u = gv_round<DT>(au[n]);
        cuk_st1<DT>(y.p, n * y.ld + o, g / (1.0f + expf(-g)) * u); /* swiglu_fwd's expression */
    }
}

CUK_EMU_END(gemv);

/* kern<<<grid, GV_WARPS * 32>>>(args...), with the programmatic-launch
 * attribute when pdl. */
template <class... P, class... A>
static cudaError_t gv_launch(cudaStream_t s, int pdl, void (*kern)(P...), unsigned grid, A... args) {
    return cuk_launch(s, pdl, kern, dim3(grid), GV_WARPS * 32, 0, args...);
}

int cuk_gemv_swiglu_fits(cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu) {
    const cuk_mat none = {0};
    return cuk_gemv_fits(y, x, wg, none) && cuk_gemv_fits(y, x, wu, none) && wu.rows == wg.rows && wu.cols == wg.cols &&
           y.cols == wg.rows;
}

/* Warps a row (a power of two up to GV_WARPS): enough that a lane has at
 * most GV_UNROLL chunks of it. The products and the SwiGLU pair choose
 * alike, so their sums agree bit for bit. */
static int gv_parts(int64_t K) {
    int ks = 1;
    while (ks < GV_WARPS && (K >> 3) > (int64_t)32 * GV_UNROLL * ks) ks *= 2;
    return ks;
}

template <int DT, int KS>
static cudaError_t gemv_swiglu_ks(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, int pdl) {
    const unsigned g = (unsigned)((wg.rows + GV_WARPS / KS - 1) / (GV_WARPS / KS));
    const int N = (int)x.rows;
    if (N == 1) return gv_launch(s, pdl, k_gemv_swiglu<DT, 1, KS>, g, y, x, wg, wu, N);
    if (N == 2) return gv_launch(s, pdl, k_gemv_swiglu<DT, 2, KS>, g, y, x, wg, wu, N);
    if (N <= 4) return gv_launch(s, pdl, k_gemv_swiglu<DT, 4, KS>, g, y, x, wg, wu, N);
    return gv_launch(s, pdl, k_gemv_swiglu<DT, CUK_GEMV_MAX_N, KS>, g, y, x, wg, wu, N);
}

template <int DT>
static cudaError_t gemv_swiglu_dt(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, int pdl) {
    switch (gv_parts(wg.cols)) {
    case 1: return gemv_swiglu_ks<DT, 1>(s, y, x, wg, wu, pdl);
    case 2: return gemv_swiglu_ks<DT, 2>(s, y, x, wg, wu, pdl);
    case 4: return gemv_swiglu_ks<DT, 4>(s, y, x, wg, wu, pdl);
    default: return gemv_swiglu_ks<DT, 8>(s, y, x, wg, wu, pdl);
    }
}

cudaError_t cuk_gemv_swiglu(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, int pdl) {
    return wg.dt == CUK_BF16 ? gemv_swiglu_dt<CUK_BF16>(s, y, x, wg, wu, pdl)
                             : gemv_swiglu_dt<CUK_F16>(s, y, x, wg, wu, pdl);
}

int cuk_gemv_fits(cuk_mat y, cuk_mat x, cuk_mat w, cuk_mat r) {
    const auto a16 = [](const void *p) { return ((uintptr_t)p & 15) == 0; };
    if (x.rows < 1 || x.rows > CUK_GEMV_MAX_N || w.rows < 1 || w.cols < 8) return 0;
    if (w.dt != CUK_BF16 && w.dt != CUK_F16) return 0;
    if (x.dt != w.dt || y.dt != w.dt || (r.p && r.dt != w.dt)) return 0;
    return w.cols % 8 == 0 && w.ld % 8 == 0 && x.ld % 8 == 0 && a16(w.p) && a16(x.p);
}

template <int DT, int KS>
static cudaError_t gemv_ks(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r,
                           int pdl) {
    const unsigned g = (unsigned)((w.rows + GV_WARPS / KS - 1) / (GV_WARPS / KS));
    const int N = (int)x.rows;
    if (N == 1) return gv_launch(s, pdl, k_gemv<DT, 1, KS>, g, y, x, w, bias, bias_dt, r, N);
    if (N == 2) return gv_launch(s, pdl, k_gemv<DT, 2, KS>, g, y, x, w, bias, bias_dt, r, N);
    if (N <= 4) return gv_launch(s, pdl, k_gemv<DT, 4, KS>, g, y, x, w, bias, bias_dt, r, N);
    return gv_launch(s, pdl, k_gemv<DT, CUK_GEMV_MAX_N, KS>, g, y, x, w, bias, bias_dt, r, N);
}

template <int DT>
static cudaError_t gemv_dt(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r,
                           int pdl) {
    switch (gv_parts(w.cols)) {
    case 1: return gemv_ks<DT, 1>(s, y, x, w, bias, bias_dt, r, pdl);
    case 2: return gemv_ks<DT, 2>(s, y, x, w, bias, bias_dt, r, pdl);
    case 4: return gemv_ks<DT, 4>(s, y, x, w, bias, bias_dt, r, pdl);
    default: return gemv_ks<DT, 8>(s, y, x, w, bias, bias_dt, r, pdl);
    }
}

cudaError_t cuk_gemv(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r,
                     int pdl) {
    return w.dt == CUK_BF16 ? gemv_dt<CUK_BF16>(s, y, x, w, bias, bias_dt, r, pdl)
                            : gemv_dt<CUK_F16>(s, y, x, w, bias, bias_dt, r, pdl);
}
