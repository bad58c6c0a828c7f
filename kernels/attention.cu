/* Causal (or windowed, or full) multi-head / grouped-query attention,
 * flash-attention style: nothing T x T ever reaches device memory. The
 * forward keeps a running max and sum per query row (online softmax) and
 * saves only lse [B,Hq,Tq]; the backward recomputes the probabilities from
 * lse. All arithmetic is f32 on the CUDA cores (any float storage dtype), so
 * f32 results match the CPU backend to rounding; see docs/cuda.md for the
 * tensor-core path this leaves for later.
 *
 * Every kernel has the same shape: a block of 4 warps owns a tile of 32
 * rows (query rows in the forward and dQ kernels, key rows in the dK/dV
 * kernel) and walks the rows of the other side in chunks of 32, staged in
 * shared memory as f32 and zero-padded to DMAX (64, 128 or 256) dims:
 *   phase 1: lane = owned row, warp w = other rows 8w..8w+7: the 32 x 32
 *            score-like block (dot products over D) goes to shared memory;
 *   phase 2: warp w = owned rows 8w..8w+7, lane = dims lane + 32k: the
 *            owned rows' accumulators (registers) take their update.
 * The backward is two kernels so that every output row has one owner and
 * no atomics are needed (deterministic): dK/dV per key tile, looping over
 * the query heads of its kv group and the query rows that can see it; dQ
 * per query tile. D_i = rowsum(dO * O) is computed first into the caller's
 * workspace.
 *
 * These kernels serve f32 (and f16) inputs, exactly; bf16 inputs go to the
 * tensor-core versions in attention_tc.cu unless a.tc is clear (the GPU
 * tests' CAI_CUDA_ATTN_SIMT path, kernels/cuda_backend.h). */
#include "cuda_common.cuh"

#define TILE 32
#define NTH 128
#define RPW (TILE / (NTH / 32)) /* rows per warp in phase 2 */
#define SST (TILE + 1)          /* row stride of the 32 x 32 score blocks */

#define roff cuk_roff
#define visible cuk_visible

/* Rows [r0, r0 + 32) of head h into tile[32][DMAX + 4]; rows >= rlim and
 * dims >= D are zero. */
template <int DMAX>
__device__ __forceinline__ void load_tile(float *tile, const cuk_bthd &t, int64_t b, int64_t h, int64_t r0,
                                          int64_t rlim) {
    constexpr int LDS = DMAX + 4;
    for (int e = threadIdx.x; e < TILE * DMAX; e += NTH) {
        int rr = e / DMAX, d = e % DMAX;
        int64_t row = r0 + rr;
        float v = 0.0f;
        if (row < rlim && d < t.D) v = ldf(t.p, t.dt, roff(t, b, row, h) + d);
        tile[rr * LDS + d] = v;
    }
}

CUK_INLINE float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

template <int NK> CUK_INLINE void zero_acc(float (&acc)[RPW][NK]) {
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int kk = 0; kk < NK; kk++) acc[r][kk] = 0.0f;
}

/* Phase 1 of both backward kernels: this lane's own rows (oa, ob) against
 * the warp's 8 broadcast rows of the other side (ba, bb):
 * s[r] = oa . ba[8w + r], dp[r] = ob . bb[8w + r]. */
template <int DMAX>
CUK_INLINE void dual_dots(const float *oa, const float *ob, const float *ba, const float *bb, float (&s)[RPW],
                          float (&dp)[RPW]) {
    constexpr int LDS = DMAX + 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < RPW; r++) s[r] = dp[r] = 0.0f;
    const float4 *ra = (const float4 *)(oa + lane * LDS), *rb = (const float4 *)(ob + lane * LDS);
#pragma unroll 2
    for (int d4 = 0; d4 < DMAX / 4; d4++) {
        float4 va = ra[d4], vb = rb[d4];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            s[r] += dot4(va, ((const float4 *)(ba + (warp * RPW + r) * LDS))[d4]);
            dp[r] += dot4(vb, ((const float4 *)(bb + (warp * RPW + r) * LDS))[d4]);
        }
    }
}

template <int DMAX> static constexpr size_t fwd_smem() {
    return sizeof(float) * (3 * TILE * (DMAX + 4) + TILE * SST + 3 * TILE);
}
template <int DMAX> static constexpr size_t kv_smem() {
    return sizeof(float) * (4 * TILE * (DMAX + 4) + 2 * TILE * SST + 2 * TILE);
}
template <int DMAX> static constexpr size_t q_smem() {
    return sizeof(float) * (4 * TILE * (DMAX + 4) + TILE * SST + 2 * TILE);
}

/* ---------------------------------------------------------------- forward */

template <int DMAX>
__global__ void __launch_bounds__(NTH)
    k_attn_fwd(cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a, int64_t ntiles) {
    constexpr int LDS = DMAX + 4, NK = DMAX / 32;
    extern __shared__ float4 smem4[];
    float *Qs = (float *)smem4, *Ks = Qs + TILE * LDS, *Vs = Ks + TILE * LDS, *Ss = Vs + TILE * LDS;
    float *row_m = Ss + TILE * SST, *row_l = row_m + TILE, *row_c = row_l + TILE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* Longest (latest) causal tiles first: better tail balance. */
    const int64_t qt = ntiles - 1 - (int64_t)blockIdx.x % ntiles, bh = (int64_t)blockIdx.x / ntiles;
    const int64_t b = bh / q.H, h = bh % q.H, hk = h / (q.H / k.H);
    const int64_t Tq = q.T, Tk = k.T, i0 = qt * TILE;

    load_tile<DMAX>(Qs, q, b, h, i0, Tq);
    if (tid < TILE) {
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.0f;
    }
    const int64_t ilast = i0 + TILE - 1 < Tq - 1 ? i0 + TILE - 1 : Tq - 1;
    int64_t jlo, jhi;
    cuk_key_span(a, i0, ilast, Tk, &jlo, &jhi);
    float acc[RPW][NK];
    zero_acc(acc);

    for (int64_t j0 = jlo; j0 <= jhi; j0 += TILE) {
        __syncthreads();
        load_tile<DMAX>(Ks, k, b, hk, j0, jhi + 1);
        load_tile<DMAX>(Vs, v, b, hk, j0, jhi + 1);
        __syncthreads();
        { /* phase 1: scores, lane = query row */
            const int64_t i = i0 + lane;
            float s[RPW];
#pragma unroll
            for (int r = 0; r < RPW; r++) s[r] = 0.0f;
            const float4 *qr = (const float4 *)(Qs + lane * LDS);
#pragma unroll 4
            for (int d4 = 0; d4 < DMAX / 4; d4++) {
                float4 qv = qr[d4];
#pragma unroll
                for (int r = 0; r < RPW; r++) s[r] += dot4(qv, ((const float4 *)(Ks + (warp * RPW + r) * LDS))[d4]);
            }
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                int64_t j = j0 + warp * RPW + r;
                bool vis = i < Tq && j <= jhi && visible(a, i, j);
                Ss[(warp * RPW + r) * SST + lane] = vis ? a.scale * s[r] : -INFINITY;
            }
        }
        __syncthreads();
        /* online softmax: warp w updates rows 8w..8w+7, lane = key */
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int il = warp * RPW + r;
            float sv = Ss[lane * SST + il];
            float mold = row_m[il], mnew = fmaxf(mold, warp_max(sv));
            float p = mnew == -INFINITY ? 0.0f : expf(sv - mnew);
            float ps = warp_sum(p);
            Ss[lane * SST + il] = p;
            if (lane == 0) {
                float corr = mnew == -INFINITY ? 1.0f : expf(mold - mnew);
                row_l[il] = row_l[il] * corr + ps;
                row_m[il] = mnew;
                row_c[il] = corr;
            }
        }
        __syncthreads();
        /* phase 2: O rows of this warp += P V */
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            float c = row_c[warp * RPW + r];
#pragma unroll
            for (int kk = 0; kk < NK; kk++) acc[r][kk] *= c;
        }
#pragma unroll 2
        for (int jj = 0; jj < TILE; jj++) {
            float vv[NK];
#pragma unroll
            for (int kk = 0; kk < NK; kk++) vv[kk] = Vs[jj * LDS + lane + 32 * kk];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                float p = Ss[jj * SST + warp * RPW + r];
#pragma unroll
                for (int kk = 0; kk < NK; kk++) acc[r][kk] += p * vv[kk];
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int il = warp * RPW + r;
        const int64_t i = i0 + il;
        if (i >= Tq) continue;
        float l = row_l[il], m = row_m[il];
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int64_t oo = roff(o, b, i, h);
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            int d = lane + 32 * kk;
            if (d < o.D) stf(o.p, o.dt, oo + d, acc[r][kk] * inv);
        }
        if (lane == 0 && lse) lse[(b * q.H + h) * Tq + i] = l > 0.0f ? m + logf(l) : -INFINITY;
    }
}

/* ---------------------------------------------------------------- backward */

/* dvec[b,h,i] = sum_d dO * O, one warp per row. */
__global__ void k_attn_dvec(float *dvec, cuk_bthd g, cuk_bthd o) {
    const int lane = threadIdx.x & 31;
    const int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= o.B * o.H * o.T) return;
    const int64_t i = row % o.T, bh = row / o.T, h = bh % o.H, b = bh / o.H;
    const int64_t go = roff(g, b, i, h), oo = roff(o, b, i, h);
    float s = 0.0f;
    for (int64_t d = lane; d < o.D; d += 32) s += ldf(g.p, g.dt, go + d) * ldf(o.p, o.dt, oo + d);
    s = warp_sum(s);
    if (lane == 0) dvec[row] = s;
}

template <int DMAX>
__global__ void __launch_bounds__(NTH)
    k_attn_bwd_kv(cuk_bthd dk, cuk_bthd dv, cuk_bthd g, cuk_bthd q, cuk_bthd k, cuk_bthd v, const float *lse,
                  const float *dvec, cuk_attn a, int64_t ntiles) {
    constexpr int LDS = DMAX + 4, NK = DMAX / 32;
    extern __shared__ float4 smem4[];
    float *Ks = (float *)smem4, *Vs = Ks + TILE * LDS, *Qs = Vs + TILE * LDS, *Gs = Qs + TILE * LDS;
    float *Ps = Gs + TILE * LDS, *Ds = Ps + TILE * SST, *Lc = Ds + TILE * SST, *Dc = Lc + TILE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* Early key tiles are seen by the most queries: schedule them first. */
    const int64_t kt = (int64_t)blockIdx.x % ntiles, bh = (int64_t)blockIdx.x / ntiles;
    const int64_t b = bh / k.H, hk = bh % k.H, group = q.H / k.H;
    const int64_t Tq = q.T, Tk = k.T, j0 = kt * TILE;
    const int64_t jlast = j0 + TILE - 1 < Tk - 1 ? j0 + TILE - 1 : Tk - 1;

    load_tile<DMAX>(Ks, k, b, hk, j0, Tk);
    load_tile<DMAX>(Vs, v, b, hk, j0, Tk);
    int64_t ilo, ihi;
    cuk_query_span(a, j0, jlast, Tq, &ilo, &ihi);
    float ak[RPW][NK], av[RPW][NK];
    zero_acc(ak);
    zero_acc(av);

    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        for (int64_t i0 = ilo; i0 <= ihi; i0 += TILE) {
            __syncthreads();
            load_tile<DMAX>(Qs, q, b, h, i0, ihi + 1);
            load_tile<DMAX>(Gs, g, b, h, i0, ihi + 1);
            if (tid < TILE) {
                int64_t i = i0 + tid, row = (b * q.H + h) * Tq + i;
                Lc[tid] = i <= ihi ? lse[row] : 0.0f;
                Dc[tid] = i <= ihi ? dvec[row] : 0.0f;
            }
            __syncthreads();
            { /* phase 1: lane = key row, warp = query rows 8w.. */
                const int64_t j = j0 + lane;
                float s[RPW], dp[RPW];
                dual_dots<DMAX>(Ks, Vs, Qs, Gs, s, dp);
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    const int il = warp * RPW + r;
                    const int64_t i = i0 + il;
                    bool vis = i <= ihi && j <= jlast && visible(a, i, j);
                    float p = vis ? expf(a.scale * s[r] - Lc[il]) : 0.0f;
                    Ps[il * SST + lane] = p;
                    Ds[il * SST + lane] = vis ? p * (dp[r] - Dc[il]) * a.scale : 0.0f;
                }
            }
            __syncthreads();
            /* phase 2: dV += P^T dO, dK += dS^T Q for this warp's key rows */
#pragma unroll 2
            for (int ii = 0; ii < TILE; ii++) {
                float qv[NK], gv[NK];
#pragma unroll
                for (int kk = 0; kk < NK; kk++) {
                    qv[kk] = Qs[ii * LDS + lane + 32 * kk];
                    gv[kk] = Gs[ii * LDS + lane + 32 * kk];
                }
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    float p = Ps[ii * SST + warp * RPW + r], ds = Ds[ii * SST + warp * RPW + r];
#pragma unroll
                    for (int kk = 0; kk < NK; kk++) {
                        av[r][kk] += p * gv[kk];
                        ak[r][kk] += ds * qv[kk];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int64_t j = j0 + warp * RPW + r;
        if (j >= Tk) continue;
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            int d = lane + 32 * kk;
            if (d >= k.D) continue;
            if (dk.p) stf(dk.p, dk.dt, roff(dk, b, j, hk) + d, ak[r][kk]);
            if (dv.p) stf(dv.p, dv.dt, roff(dv, b, j, hk) + d, av[r][kk]);
        }
    }
}

template <int DMAX>
__global__ void __launch_bounds__(NTH) k_attn_bwd_q(cuk_bthd dq, cuk_bthd g, cuk_bthd q, cuk_bthd k, cuk_bthd v,
                                                    const float *lse, const float *dvec, cuk_attn a, int64_t ntiles) {
    constexpr int LDS = DMAX + 4, NK = DMAX / 32;
    extern __shared__ float4 smem4[];
    float *Qs = (float *)smem4, *Gs = Qs + TILE * LDS, *Ks = Gs + TILE * LDS, *Vs = Ks + TILE * LDS;
    float *Ds = Vs + TILE * LDS, *Lr = Ds + TILE * SST, *Dr = Lr + TILE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t qt = ntiles - 1 - (int64_t)blockIdx.x % ntiles, bh = (int64_t)blockIdx.x / ntiles;
    const int64_t b = bh / q.H, h = bh % q.H, hk = h / (q.H / k.H);
    const int64_t Tq = q.T, Tk = k.T, i0 = qt * TILE;

    load_tile<DMAX>(Qs, q, b, h, i0, Tq);
    load_tile<DMAX>(Gs, g, b, h, i0, Tq);
    if (tid < TILE) {
        int64_t i = i0 + tid, row = (b * q.H + h) * Tq + i;
        Lr[tid] = i < Tq ? lse[row] : 0.0f;
        Dr[tid] = i < Tq ? dvec[row] : 0.0f;
    }
    const int64_t ilast = i0 + TILE - 1 < Tq - 1 ? i0 + TILE - 1 : Tq - 1;
    int64_t jlo, jhi;
    cuk_key_span(a, i0, ilast, Tk, &jlo, &jhi);
    float acc[RPW][NK];
    zero_acc(acc);

    for (int64_t j0 = jlo; j0 <= jhi; j0 += TILE) {
        __syncthreads();
        load_tile<DMAX>(Ks, k, b, hk, j0, jhi + 1);
        load_tile<DMAX>(Vs, v, b, hk, j0, jhi + 1);
        __syncthreads();
        { /* phase 1: lane = query row, warp = key rows 8w.. */
            const int64_t i = i0 + lane;
            float s[RPW], dp[RPW];
            dual_dots<DMAX>(Qs, Gs, Ks, Vs, s, dp);
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const int64_t j = j0 + warp * RPW + r;
                bool vis = i < Tq && j <= jhi && visible(a, i, j);
                float p = vis ? expf(a.scale * s[r] - Lr[lane]) : 0.0f;
                Ds[(warp * RPW + r) * SST + lane] = vis ? p * (dp[r] - Dr[lane]) * a.scale : 0.0f;
            }
        }
        __syncthreads();
        /* phase 2: dQ rows of this warp += dS K */
#pragma unroll 2
        for (int jj = 0; jj < TILE; jj++) {
            float kv[NK];
#pragma unroll
            for (int kk = 0; kk < NK; kk++) kv[kk] = Ks[jj * LDS + lane + 32 * kk];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                float ds = Ds[jj * SST + warp * RPW + r];
#pragma unroll
                for (int kk = 0; kk < NK; kk++) acc[r][kk] += ds * kv[kk];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int64_t i = i0 + warp * RPW + r;
        if (i >= Tq) continue;
        const int64_t oo = roff(dq, b, i, h);
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            int d = lane + 32 * kk;
            if (d < dq.D) stf(dq.p, dq.dt, oo + d, acc[r][kk]);
        }
    }
}

/* ---------------------------------------------------------------- launchers */

template <int DMAX> static cudaError_t setup_one(void) {
    return cuk_smem_limits(k_attn_fwd<DMAX>, fwd_smem<DMAX>(), k_attn_bwd_kv<DMAX>, kv_smem<DMAX>(), k_attn_bwd_q<DMAX>,
                           q_smem<DMAX>());
}

extern "C" cudaError_t cuk_attn_setup(void) {
    cudaError_t e = setup_one<64>();
    if (e == cudaSuccess) e = setup_one<128>();
    if (e == cudaSuccess) e = setup_one<256>();
    if (e == cudaSuccess) e = cuk_attn_tc_setup();
    return e;
}

template <int DMAX>
static cudaError_t fwd_launch(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a) {
    int64_t nt = cuk_cdiv(q.T, TILE);
    k_attn_fwd<DMAX><<<(unsigned)(q.B * q.H * nt), NTH, fwd_smem<DMAX>(), s>>>(o, lse, q, k, v, a, nt);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_attn_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v,
                                    cuk_attn a) {
    if (q.B * q.H * q.T <= 0) return cudaSuccess;
    if (cuk_attn_tc_ok(&q, &k, &v, NULL, a)) return cuk_attn_tc_fwd(s, o, lse, q, k, v, a);
    if (q.D <= 64) return fwd_launch<64>(s, o, lse, q, k, v, a);
    if (q.D <= 128) return fwd_launch<128>(s, o, lse, q, k, v, a);
    if (q.D <= 256) return fwd_launch<256>(s, o, lse, q, k, v, a);
    return cudaErrorInvalidValue;
}

template <int DMAX>
static cudaError_t bwd_launch(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd g, cuk_bthd q, cuk_bthd k,
                              cuk_bthd v, const float *lse, const float *dvec, cuk_attn a) {
    if ((dk.p || dv.p) && k.B * k.H * k.T > 0) {
        int64_t nt = cuk_cdiv(k.T, TILE);
        k_attn_bwd_kv<DMAX>
            <<<(unsigned)(k.B * k.H * nt), NTH, kv_smem<DMAX>(), s>>>(dk, dv, g, q, k, v, lse, dvec, a, nt);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    if (dq.p && q.B * q.H * q.T > 0) {
        int64_t nt = cuk_cdiv(q.T, TILE);
        k_attn_bwd_q<DMAX><<<(unsigned)(q.B * q.H * nt), NTH, q_smem<DMAX>(), s>>>(dq, g, q, k, v, lse, dvec, a, nt);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_attn_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd dout, cuk_bthd q,
                                    cuk_bthd k, cuk_bthd v, cuk_bthd o, const float *lse, float *dvec, cuk_attn a) {
    int64_t rows = q.B * q.H * q.T;
    if (rows > 0) {
        k_attn_dvec<<<(unsigned)cuk_cdiv(rows, 8), 256, 0, s>>>(dvec, dout, o);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    if (cuk_attn_tc_ok(&q, &k, &v, &dout, a)) return cuk_attn_tc_bwd(s, dq, dk, dv, dout, q, k, v, lse, dvec, a);
    if (q.D <= 64) return bwd_launch<64>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a);
    if (q.D <= 128) return bwd_launch<128>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a);
    if (q.D <= 256) return bwd_launch<256>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a);
    return cudaErrorInvalidValue;
}

/* attention_merge: one warp per (b, h, t) row. Every lane reads both lse
 * values before lane 0 replaces the row's; the weights in double, as the
 * CPU backend computes them. */
__global__ void k_attn_merge(cuk_bthd o, float *lse, int64_t lsb, int64_t lsh, cuk_bthd x, const float *xlse,
                             int64_t xsb, int64_t xsh) {
    const int64_t row = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= o.B * o.H * o.T) return;
    const int64_t t = row % o.T, h = (row / o.T) % o.H, b = row / (o.T * o.H);
    float *l = lse + b * lsb + h * lsh + t;
    const float la = *l, lb = xlse[b * xsb + h * xsh + t];
    __syncwarp();
    if (lb == -INFINITY) return;
    const int64_t yo = b * o.sb + t * o.st + h * o.sh, xo = b * x.sb + t * x.st + h * x.sh;
    float wa = 0.0f, wb = 1.0f, ln = lb;
    if (la != -INFINITY) {
        double m = fmax((double)la, (double)lb), ea = exp((double)la - m), eb = exp((double)lb - m), sum = ea + eb;
        wa = (float)(ea / sum);
        wb = (float)(eb / sum);
        ln = (float)(m + log(sum));
    }
    for (int64_t d = lane; d < o.D; d += 32) {
        float xv = ldf(x.p, x.dt, xo + d);
        stf(o.p, o.dt, yo + d, la == -INFINITY ? xv : wa * ldf(o.p, o.dt, yo + d) + wb * xv);
    }
    if (lane == 0) *l = ln;
}

extern "C" cudaError_t cuk_attn_merge(cudaStream_t s, cuk_bthd o, float *lse, int64_t lsb, int64_t lsh, cuk_bthd x,
                                      const float *xlse, int64_t xsb, int64_t xsh) {
    int64_t rows = o.B * o.H * o.T;
    if (rows <= 0) return cudaSuccess;
    k_attn_merge<<<(unsigned)cuk_cdiv(rows, 8), 256, 0, s>>>(o, lse, lsb, lsh, x, xlse, xsb, xsh);
    return cudaGetLastError();
}
