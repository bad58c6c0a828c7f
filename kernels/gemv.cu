/* Linear layers of a few rows (a decode step's batch): y[n] = W x[n]
 * (+ bias) (+ residual) for n < N <= CUK_GEMV_MAX_N, 16-bit data, f32
 * accumulation; optionally with the RMSNorm of x in front (x[n] * rstd[n]
 * * gamma, rounded to the data type as the norm kernel stores it) and
 * optionally gated: two weights (gate, up) read side by side and
 * silu(gate x) * (up x) stored, each product rounded first, as
 * linear_fwd, linear_fwd and swiglu_fwd would give.
 *
 * At a handful of rows the product is a pass over the weights, and what
 * counts is how many bytes of them are in flight and that the stream never
 * stops. A warp owns an output feature at a time; each lane streams
 * 16-byte chunks of its row, U at once, and the next batch of chunks (of
 * this row or the warp's next one) is issued before the current one is
 * used. One wave of blocks, each with an equal share of the rows.
 * The rows of x (a few KB, read by every warp) come from L1/L2, or, normed,
 * from shared memory, where each block writes them once.
 *
 * Programmatic dependent launch: the kernel lets its successor start
 * (griddepcontrol.launch_dependents) and issues its first weight loads
 * before it waits for its predecessor (griddepcontrol.wait), since the
 * weights do not depend on it; launched with the attribute, a product's
 * weight stream starts while the previous kernel finishes. The per-lane
 * order of the products and the warp's sums do not depend on the grid, so
 * the results are those of one row per warp. */
#include "cuda_common.cuh"

#define GV_WARPS 8

CUK_INLINE void gv_let_successor_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
CUK_INLINE void gv_wait_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

struct gv_args {
    cuk_mat y, x, w, w2, r; /* w2.p: the up weights of a gated product */
    const void *bias;
    int bias_dt;
    const void *gamma; /* the RMSNorm weight (x normed first), or NULL */
    int gamma_dt;
    float eps;
    int N;
};

/* The lane's U chunks of batch b of row o (zeros past the row). */
template <int U> CUK_INLINE void gv_load(uint4 (&wu)[U], const cuk_mat &w, int64_t o, int64_t b, int lane) {
    const uint4 *wr = (const uint4 *)((const uint16_t *)w.p + o * w.ld);
    const int64_t nc = w.cols >> 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t c = b * 32 * U + lane + 32 * u;
        wu[u] = c < nc ? __ldcs(wr + c) : make_uint4(0u, 0u, 0u, 0u); /* read once: do not keep in cache */
    }
}

/* x chunk c of row n: from shared memory when normed there, else global. */
template <bool NORM> CUK_INLINE uint4 gv_x(const gv_args &a, const uint4 *xs, int64_t nc, int n, int64_t c) {
    if (NORM) return xs[n * nc + c];
    return __ldg((const uint4 *)((const uint16_t *)a.x.p + n * a.x.ld) + c);
}

/* acc[n] += dot(chunks, x[n] chunks) for batch b. */
template <int DT, int NB, int U, bool NORM>
CUK_INLINE void gv_fma(float (&acc)[NB], const uint4 (&wu)[U], const gv_args &a, const uint4 *xs, int64_t b, int lane) {
    const int64_t nc = a.w.cols >> 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t c = b * 32 * U + lane + 32 * u;
        if (c >= nc) break;
        float wf[8];
        cuk_unpack8<DT>(wu[u], wf);
#pragma unroll
        for (int n = 0; n < NB; n++) {
            if (n >= a.N) break;
            float xf[8];
            cuk_unpack8<DT>(gv_x<NORM>(a, xs, nc, n, c), xf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[n] = fmaf(wf[e], xf[e], acc[n]);
        }
    }
}

/* Row n of x normed into xs, by one warp, with the norm kernel's order of
 * operations (k_norm_fwd_reg: a lane's chunks lane + 32 k in order, then
 * the warp's butterfly; w * (x * rstd)), so the bits are the same. */
template <int DT> CUK_INLINE void gv_norm_row(const gv_args &a, uint4 *xs, int n, int lane) {
    const int64_t C = a.x.cols, nc = C >> 3;
    const uint16_t *xr = (const uint16_t *)a.x.p + n * a.x.ld;
    float var = 0.0f;
    for (int64_t c = lane; c < nc; c += 32) {
        float v[8];
        cuk_unpack8<DT>(*(const uint4 *)(xr + 8 * c), v);
#pragma unroll
        for (int e = 0; e < 8; e++) var += v[e] * v[e];
    }
    var = warp_sum(var);
    const float rs = 1.0f / sqrtf(var / (float)C + a.eps);
    for (int64_t c = lane; c < nc; c += 32) {
        float v[8], o[8];
        cuk_unpack8<DT>(*(const uint4 *)(xr + 8 * c), v);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = ldf(a.gamma, a.gamma_dt, 8 * c + e) * (v[e] * rs);
        cuk_st8<DT>(xs + n * nc + c, 0, o);
    }
}

template <int DT, int NB, int U, bool NORM, bool GATED>
__global__ void __launch_bounds__(GV_WARPS * 32) k_gemv(gv_args a) {
    extern __shared__ uint4 xs[]; /* normed x [N][K / 8] */
    gv_let_successor_start();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t M = a.w.rows, nc = a.w.cols >> 3, nb = (nc + 32 * U - 1) / (32 * U);
    /* the block's rows [r0, r1): an equal share; its warps take every GV_WARPS-th */
    const int64_t r0 = M * blockIdx.x / gridDim.x, r1 = M * (blockIdx.x + 1) / gridDim.x;
    const int64_t o0 = r0 + warp, mine = o0 < r1 ? (r1 - o0 + GV_WARPS - 1) / GV_WARPS : 0;
    const int64_t items = mine * nb; /* (row, batch) pairs, row-major */
    auto row = [&](int64_t i) { return o0 + GV_WARPS * (i / nb); };
    uint4 A[U], B[U], A2[U], B2[U];
    if (items > 0) {
        gv_load<U>(A, a.w, row(0), 0, lane);
        if (GATED) gv_load<U>(A2, a.w2, row(0), 0, lane);
    }
    gv_wait_predecessor();
    if (NORM) {
        for (int n = warp; n < a.N; n += GV_WARPS) gv_norm_row<DT>(a, xs, n, lane);
        __syncthreads();
    }
    float acc[NB], acc2[NB];
#pragma unroll
    for (int n = 0; n < NB; n++) acc[n] = acc2[n] = 0.0f;
    /* the end of item i: with its row's last batch, the warp's sums are stored */
    auto finish = [&](int64_t i) {
        if ((i + 1) % nb != 0) return;
        const int64_t o = row(i);
#pragma unroll
        for (int n = 0; n < NB; n++) {
            acc[n] = warp_sum(acc[n]);
            if (GATED) acc2[n] = warp_sum(acc2[n]);
        }
        if (lane == 0) {
            const float bv = a.bias ? ldf(a.bias, a.bias_dt, o) : 0.0f;
            for (int n = 0; n < a.N; n++) {
                float v = acc[n] + bv;
                if (GATED) {
                    /* each product rounded as linear_fwd stores it, then swiglu_fwd's formula */
                    uint16_t gb, ub;
                    cuk_st1<DT>(&gb, 0, v);
                    cuk_st1<DT>(&ub, 0, acc2[n] + 0.0f);
                    const float gf = cuk_ld1<DT>(&gb, 0), uf = cuk_ld1<DT>(&ub, 0);
                    v = gf / (1.0f + expf(-gf)) * uf;
                } else if (a.r.p) {
                    v += cuk_ld1<DT>(a.r.p, n * a.r.ld + o);
                }
                cuk_st1<DT>(a.y.p, n * a.y.ld + o, v);
            }
        }
#pragma unroll
        for (int n = 0; n < NB; n++) acc[n] = acc2[n] = 0.0f;
    };
    for (int64_t i = 0; i < items; i += 2) {
        if (i + 1 < items) {
            gv_load<U>(B, a.w, row(i + 1), (i + 1) % nb, lane);
            if (GATED) gv_load<U>(B2, a.w2, row(i + 1), (i + 1) % nb, lane);
        }
        gv_fma<DT, NB, U, NORM>(acc, A, a, xs, i % nb, lane);
        if (GATED) gv_fma<DT, NB, U, NORM>(acc2, A2, a, xs, i % nb, lane);
        finish(i);
        if (i + 1 >= items) break;
        if (i + 2 < items) {
            gv_load<U>(A, a.w, row(i + 2), (i + 2) % nb, lane);
            if (GATED) gv_load<U>(A2, a.w2, row(i + 2), (i + 2) % nb, lane);
        }
        gv_fma<DT, NB, U, NORM>(acc, B, a, xs, (i + 1) % nb, lane);
        if (GATED) gv_fma<DT, NB, U, NORM>(acc2, B2, a, xs, (i + 1) % nb, lane);
        finish(i + 1);
    }
}

int cuk_gemv_fits(cuk_mat y, cuk_mat x, cuk_mat w, cuk_mat r) {
    const auto a16 = [](const void *p) { return ((uintptr_t)p & 15) == 0; };
    if (x.rows < 1 || x.rows > CUK_GEMV_MAX_N || w.rows < 1 || w.cols < 8) return 0;
    if (w.dt != CUK_BF16 && w.dt != CUK_F16) return 0;
    if (x.dt != w.dt || y.dt != w.dt || (r.p && r.dt != w.dt)) return 0;
    return w.cols % 8 == 0 && w.ld % 8 == 0 && x.ld % 8 == 0 && a16(w.p) && a16(x.p);
}

int cuk_gemv_norm_fits(cuk_mat y, cuk_mat x, cuk_mat w) {
    const cuk_mat none = {0};
    return cuk_gemv_fits(y, x, w, none) && x.rows * x.cols * 2 <= CUK_GEMV_NORM_MAX_BYTES;
}

/* Launched with programmatic stream serialization where the device has it
 * (sm_90+): see the file's comment. */
template <class K> static cudaError_t gv_launch(cudaStream_t s, K kern, const gv_args &a, unsigned grid, size_t smem) {
    static int pdl = -1;
    if (pdl < 0) {
        int dev = 0, major = 0;
        pdl = cudaGetDevice(&dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
        (void)cudaGetLastError();
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(GV_WARPS * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    if (pdl) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, kern, a);
}

/* Blocks of kern resident on an SM at once with smem bytes (cached per
 * kernel and size; the device of the first call). */
template <class K> static int gv_resident(K kern, size_t smem) {
    static int occ[2] = {0, 0};
    static size_t at[2] = {0, 0};
    const int slot = smem > 0;
    if (occ[slot] <= 0 || at[slot] != smem) {
        int o = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kern, GV_WARPS * 32, smem) != cudaSuccess) o = 1;
        (void)cudaGetLastError();
        occ[slot] = o > 0 ? o : 1;
        at[slot] = smem;
    }
    return occ[slot];
}

template <int DT, int NB, bool NORM, bool GATED> static cudaError_t gv_shape(cudaStream_t s, gv_args a) {
    /* gated: two weight streams, so half the chunks each to stay in registers */
    constexpr int U = GATED ? 4 : 8;
    const auto kern = k_gemv<DT, NB, U, NORM, GATED>;
    const size_t smem = NORM ? (size_t)a.N * (size_t)a.x.cols * 2 : 0;
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    /* one wave, every block resident from the start with an equal share of rows */
    int64_t blocks = (int64_t)gv_resident(kern, smem) * cuk_sm_count();
    if (blocks > a.w.rows) blocks = a.w.rows;
    const unsigned grid = (unsigned)blocks;
    return gv_launch(s, kern, a, grid, smem);
}

template <int DT, bool NORM, bool GATED> static cudaError_t gv_rows(cudaStream_t s, const gv_args &a) {
    if (a.N == 1) return gv_shape<DT, 1, NORM, GATED>(s, a);
    if (a.N == 2) return gv_shape<DT, 2, NORM, GATED>(s, a);
    if (a.N <= 4) return gv_shape<DT, 4, NORM, GATED>(s, a);
    return gv_shape<DT, CUK_GEMV_MAX_N, NORM, GATED>(s, a);
}

template <bool NORM, bool GATED> static cudaError_t gv_dt(cudaStream_t s, const gv_args &a) {
    return a.w.dt == CUK_BF16 ? gv_rows<CUK_BF16, NORM, GATED>(s, a) : gv_rows<CUK_F16, NORM, GATED>(s, a);
}

cudaError_t cuk_gemv(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r) {
    gv_args a = {};
    a.y = y;
    a.x = x;
    a.w = w;
    a.r = r;
    a.bias = bias;
    a.bias_dt = bias_dt;
    a.N = (int)x.rows;
    return gv_dt<false, false>(s, a);
}

cudaError_t cuk_gemv_norm(cudaStream_t s, cuk_mat y, cuk_mat x, const void *gamma, int gamma_dt, float eps, cuk_mat w,
                          cuk_mat w_up) {
    gv_args a = {};
    a.y = y;
    a.x = x;
    a.w = w;
    a.w2 = w_up;
    a.gamma = gamma;
    a.gamma_dt = gamma_dt;
    a.eps = eps;
    a.N = (int)x.rows;
    return w_up.p ? gv_dt<true, true>(s, a) : gv_dt<true, false>(s, a);
}
