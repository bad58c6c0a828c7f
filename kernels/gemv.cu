/* Linear layers of a few rows (a decode step's batch): y[n] = W x[n]
 * (+ bias) (+ residual) for n < N <= CUK_GEMV_MAX_N, 16-bit data, f32
 * accumulation.
 *
 * At a handful of rows the product is a pass over the weights, and what
 * counts is how many bytes of them are in flight. cuBLASLt's kernels for
 * these shapes read the H200's HBM at 1.2 to 2.8 TB/s (bench/RESULTS.md);
 * here a warp (or, for long rows, KS warps) owns FP output features (one
 * at one or two rows of x, four at three or four), each lane streams
 * 16-byte chunks of their rows with eight loads issued before any is used,
 * and the rows of x (a few KB, read by every warp) come from L1/L2, each
 * chunk widened once for the FP features. The warp's lanes then sum their
 * partials with shuffles.
 *
 * Programmatic dependent launch: a product is launched so that it may start
 * before its predecessor in the stream has finished; it issues its first
 * weight loads (which nothing in the step writes) and only then waits for
 * the predecessor (cuk_pdl_wait) before it reads x, so the weight
 * stream's latency overlaps the previous kernel's tail. Each product lets
 * its successor launch as soon as its own blocks have started, so a
 * product that follows a product (the down projection after the SwiGLU
 * pair) has its first weight loads in flight while this one's last blocks
 * stream theirs (1.8% off a Llama 1B decode step at batch 1 against a
 * trigger after the last loads, bench/RESULTS.md). Neither changes the
 * per-lane order of the sums. */
#include "cuda_common.cuh"

CUK_EMU_BEGIN(gemv);
#define GV_WARPS 8
#define GV_UNROLL 8

/* acc[r][n] += dot(w chunk of row r, x[n] chunk c) for the R rows a warp
 * walks together: x's chunk is loaded and widened once for all of them. */
template <int DT, int NB, int R>
CUK_INLINE void gv_fma(float (&acc)[R][NB], const uint4 (&wu)[R], const cuk_mat &x, int N, int64_t c) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; r++) cuk_unpack8<DT>(wu[r], wf[r]);
#pragma unroll
    for (int n = 0; n < NB; n++) {
        if (n >= N) break;
        const uint4 xu = __ldg((const uint4 *)((const uint16_t *)x.p + n * x.ld) + c);
        float xf[8];
        cuk_unpack8<DT>(xu, xf);
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r][n] = fmaf(wf[r][e], xf[e], acc[r][n]);
    }
}

/* A warp's walk over R weight rows of nc chunks each. KS warps share the
 * rows where they are long: warp part p takes the 512-byte stretches p,
 * p + KS, ... (lane l the chunks l + 32 (p + KS j)), so a lane has at most
 * GV_UNROLL chunks in flight per pass (GV_UNROLL / R of each row) however
 * long the rows, and a grid of a few thousand rows still keeps every SM's
 * loads in flight. A lane adds its chunks of a row in order whatever R,
 * so the sums do not depend on how many rows a warp walks. The successor
 * may launch from the start; the first pass's loads are issued before the
 * wait for the previous kernel. Leaves the warp's sums in acc, in every
 * lane. */
template <int DT, int NB, int KS, int R>
CUK_INLINE void gv_walk(float (&acc)[R][NB], const uint4 *const (&row)[R], int64_t nc, const cuk_mat &x, int N,
                        int lane, int warp) {
    constexpr int U = GV_UNROLL / R > 0 ? GV_UNROLL / R : 1;
    const int64_t step = 32 * KS;
    cuk_pdl_trigger();
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < NB; n++) acc[r][n] = 0.0f;
    int64_t c = lane + 32 * (warp % KS);
    uint4 wu[U][R];
    bool pending = c + step * (U - 1) < nc;
    if (pending) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) wu[u][r] = __ldcs(row[r] + c + step * u); /* read once: not kept in cache */
    }
    cuk_pdl_wait();
    for (; c + step * (U - 1) < nc; c += step * U) {
        if (!pending) {
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) wu[u][r] = __ldcs(row[r] + c + step * u);
        }
        pending = false;
#pragma unroll
        for (int u = 0; u < U; u++) gv_fma<DT, NB, R>(acc, wu[u], x, N, c + step * u);
    }
    for (; c < nc; c += step) {
        uint4 t[R];
#pragma unroll
        for (int r = 0; r < R; r++) t[r] = __ldcs(row[r] + c);
        gv_fma<DT, NB, R>(acc, t, x, N, c);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < NB; n++) acc[r][n] = warp_sum(acc[r][n]);
}

/* The KS parts' sums meet in shared memory, added in part order, into
 * every lane of the rows' first warp (the one that returns true). */
template <int CNT, int KS> CUK_INLINE bool gv_combine(float *acc, float *sm, int lane, int warp) {
    if (KS == 1) return true;
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < CNT; i++) sm[warp * CNT + i] = acc[i];
    __syncthreads();
    if (warp % KS != 0) return false;
#pragma unroll
    for (int i = 0; i < CNT; i++) {
        float v = sm[warp * CNT + i];
#pragma unroll
        for (int q = 1; q < KS; q++) v += sm[(warp + q) * CNT + i];
        acc[i] = v;
    }
    return true;
}

/* acc[i] for a lane-dependent i, without a local-memory array. */
template <int CNT> CUK_INLINE float gv_pick(const float *acc, int i) {
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < CNT; j++)
        if (j == i) v = acc[j];
    return v;
}

/* FP consecutive output features a warp (with KS parts, a group of KS
 * warps): at several rows of x, widening x's chunks is as much work as the
 * products, and walking FP weight rows at once shares it. The lanes store
 * the FP x N outputs, one each. */
template <int DT, int NB, int KS, int FP>
__global__ void __launch_bounds__(GV_WARPS * 32)
    k_gemv(cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r, int N) {
    __shared__ float sm[KS > 1 ? GV_WARPS * FP * NB : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t o0 = ((int64_t)blockIdx.x * (GV_WARPS / KS) + warp / KS) * FP;
    if (KS == 1 && o0 >= w.rows) return; /* with parts, every warp reaches the barrier */
    const uint4 *row[FP];
#pragma unroll
    for (int f = 0; f < FP; f++)
        row[f] = (const uint4 *)((const uint16_t *)w.p + (o0 + f < w.rows ? o0 + f : 0) * w.ld);
    float acc[FP][NB];
    gv_walk<DT, NB, KS, FP>(acc, row, o0 < w.rows ? w.cols >> 3 : 0, x, N, lane, warp);
    if (!gv_combine<FP * NB, KS>(&acc[0][0], sm, lane, warp)) return;
    for (int i = lane; i < FP * NB; i += 32) {
        const int f = i / NB, n = i % NB;
        const int64_t o = o0 + f;
        const float s = gv_pick<FP * NB>(&acc[0][0], i);
        if (n >= N || o >= w.rows) continue;
        float v = s + (bias ? ldf(bias, bias_dt, o) : 0.0f);
        if (r.p) v += cuk_ld1<DT>(r.p, n * r.ld + o);
        cuk_st1<DT>(y.p, n * y.ld + o, v);
    }
}

/* A Llama MLP's gate and up rows of output feature o in one warp (with KS
 * parts, a group of KS warps): each lane visits its chunks in k_gemv's
 * order, so the two sums are k_gemv's bit for bit whatever k_gemv's FP;
 * one launch instead of three (two products and the SwiGLU). */
template <int DT, int NB, int KS>
__global__ void __launch_bounds__(GV_WARPS * 32) k_gemv_swiglu(cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, int N) {
    __shared__ float sm[KS > 1 ? GV_WARPS * 2 * NB : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t o = (int64_t)blockIdx.x * (GV_WARPS / KS) + warp / KS;
    if (KS == 1 && o >= wg.rows) return;
    const int64_t oc = o < wg.rows ? o : 0;
    const uint4 *const row[2] = {(const uint4 *)((const uint16_t *)wg.p + oc * wg.ld),
                                 (const uint4 *)((const uint16_t *)wu.p + oc * wu.ld)};
    float acc[2][NB];
    gv_walk<DT, NB, KS, 2>(acc, row, o < wg.rows ? wg.cols >> 3 : 0, x, N, lane, warp);
    if (!gv_combine<2 * NB, KS>(&acc[0][0], sm, lane, warp) || o >= wg.rows) return;
    for (int n = lane; n < NB; n += 32) {
        const float g = cuk_round<DT>(gv_pick<NB>(acc[0], n)), u = cuk_round<DT>(gv_pick<NB>(acc[1], n));
        if (n < N) cuk_st1<DT>(y.p, n * y.ld + o, g / (1.0f + expf(-g)) * u); /* swiglu_fwd's expression */
    }
}

/* Blocks for M output features, FP a warp, KS warps a row. */
static unsigned gv_grid(int64_t M, int ks, int fp) {
    const int64_t per = (int64_t)(GV_WARPS / ks) * fp;
    return (unsigned)((M + per - 1) / per);
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
    return cuk_gemv_fits(y, x, wg, none) && cuk_gemv_fits(y, x, wu, none) && cuk_pair_layout(y, wg, wu);
}

/* Output features a warp walks at once, by the rows of x: one at one or
 * two rows, four at three and four, where widening x's chunks once per
 * feature made the products slower than cuBLASLt's (bench/RESULTS.md).
 * The pair walks one gate and one up row whatever the rows. */
static int gv_feats(int N) { return N <= 2 ? 1 : 4; }

/* Warps a row (a power of two up to GV_WARPS): enough that a lane has at
 * most GV_UNROLL chunks of it, and where FP features a warp leave fewer
 * blocks than SMs, more, until there are not. The products and the SwiGLU
 * pair choose alike (by the products' FP), so their sums agree bit for
 * bit. */
static int gv_parts(int64_t K, int64_t M, int fp) {
    int ks = 1;
    while (ks < GV_WARPS && (K >> 3) > (int64_t)32 * GV_UNROLL * ks) ks *= 2;
    while (fp > 1 && ks < GV_WARPS && gv_grid(M, ks, fp) < (unsigned)cuk_sm_count()) ks *= 2;
    return ks;
}

/* kern<NB> for the bucket of N rows (NB the smallest of 1, 2, 4 that holds N) */
#define GV_BY_N(N, CALL) ((N) == 1 ? CALL(1) : (N) == 2 ? CALL(2) : CALL(CUK_GEMV_MAX_N))

template <int DT, int KS>
static cudaError_t gemv_swiglu_ks(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, int pdl) {
    const unsigned g = gv_grid(wg.rows, KS, 1);
    const int N = (int)x.rows;
#define GV_CALL(NB) gv_launch(s, pdl, k_gemv_swiglu<DT, NB, KS>, g, y, x, wg, wu, N)
    return GV_BY_N(N, GV_CALL);
#undef GV_CALL
}

template <int DT>
static cudaError_t gemv_swiglu_dt(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, int pdl) {
    switch (gv_parts(wg.cols, wg.rows, gv_feats((int)x.rows))) {
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
    return x.rows >= 1 && x.rows <= CUK_GEMV_MAX_N && cuk_few_rows_layout(y, x, w, r);
}

template <int DT, int KS, int FP>
static cudaError_t gemv_fp(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r,
                           int pdl) {
    const unsigned g = gv_grid(w.rows, KS, FP);
    const int N = (int)x.rows;
#define GV_CALL(NB) gv_launch(s, pdl, k_gemv<DT, NB, KS, FP>, g, y, x, w, bias, bias_dt, r, N)
    return GV_BY_N(N, GV_CALL);
#undef GV_CALL
}

template <int DT, int KS>
static cudaError_t gemv_ks(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r,
                           int pdl) {
    return gv_feats((int)x.rows) == 1 ? gemv_fp<DT, KS, 1>(s, y, x, w, bias, bias_dt, r, pdl)
                                      : gemv_fp<DT, KS, 4>(s, y, x, w, bias, bias_dt, r, pdl);
}

template <int DT>
static cudaError_t gemv_dt(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r,
                           int pdl) {
    switch (gv_parts(w.cols, w.rows, gv_feats((int)x.rows))) {
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
