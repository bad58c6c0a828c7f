/* Attention on the tensor cores for bf16 inputs: the same algorithm, tiles
 * and ownership as attention.cu (a block of 4 warps owns 32 rows and walks
 * the other side in chunks of 32; online softmax forward; a dK/dV kernel
 * and a dQ kernel backward, no atomics), with the two matrix products of
 * each chunk on WMMA 16x16x16 bf16 fragments accumulating in f32:
 *   forward   S = Q K^T, then O += P V (O kept in shared memory, since the
 *             online softmax rescales its rows);
 *   dK/dV     S = Q K^T, dP = dO V^T, then dV += P^T dO, dK += dS^T Q
 *             (accumulators stay in registers for the whole block);
 *   dQ        S, dP as above, then dQ += dS K.
 * P and dS are rounded to bf16 before their product, as flash-attention
 * does; softmax statistics, lse and every accumulation stay f32. */
#include "cuda_common.cuh"

#include <cuda_bf16.h>
#include <mma.h>
#include <type_traits>

using namespace nvcuda;

#define TILE 32
#define NTH 128
#define RPW 8  /* rows per warp in the softmax pass */
#define SLD 36 /* f32 score rows (multiple of 4 floats for WMMA) */
#define PLD 40 /* bf16 probability rows (multiple of 8 elements) */

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_frag;

/* Rows [r0, r0 + 32) of head h as bf16 into tile[32][DMAX + 8]; rows >=
 * rlim and dims >= D are zero. bf16 inputs convert exactly. */
template <int DMAX>
__device__ __forceinline__ void load_bf(bf16 *tile, const cuk_bthd &t, int64_t b, int64_t h, int64_t r0, int64_t rlim) {
    constexpr int LDE = DMAX + 8;
    for (int e = threadIdx.x; e < TILE * DMAX; e += NTH) {
        int rr = e / DMAX, d = e % DMAX;
        int64_t row = r0 + rr;
        float v = 0.0f;
        if (row < rlim && d < t.D) v = ldf(t.p, t.dt, cuk_roff(t, b, row, h) + d);
        tile[rr * LDE + d] = __float2bfloat16_rn(v);
    }
}

/* out[32][SLD] = X Y^T over DMAX dims (X, Y: 32 bf16 rows each); warp w
 * computes the 16 x 16 block (w / 2, w % 2). */
template <int DMAX> __device__ __forceinline__ void tc_scores(float *out, const bf16 *X, const bf16 *Y) {
    constexpr int LDE = DMAX + 8;
    const int w = threadIdx.x >> 5, mi = w >> 1, ni = w & 1;
    acc_frag acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int d = 0; d < DMAX; d += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, X + mi * 16 * LDE + d, LDE);
        wmma::load_matrix_sync(fb, Y + ni * 16 * LDE + d, LDE);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + mi * 16 * SLD + ni * 16, acc, SLD, wmma::mem_row_major);
}

/* acc (a 32 x DMAX tile, warp w holding blocks w, w + 4, ...) += A B with
 * A 32 x 32 bf16 ([row][k] at A[row * PLD + k], or transposed: A[k * PLD +
 * row]) and B 32 x DMAX bf16 rows. */
template <int DMAX, bool ATRANS>
__device__ __forceinline__ void tc_accumulate(acc_frag (&acc)[DMAX / 32], const bf16 *A, const bf16 *B) {
    constexpr int LDE = DMAX + 8;
    typedef typename std::conditional<ATRANS, wmma::col_major, wmma::row_major>::type a_layout;
    const int w = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < DMAX / 32; t++) {
        const int f = w + 4 * t, mi = f & 1, ni = f >> 1;
#pragma unroll
        for (int kk = 0; kk < TILE; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, a_layout> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
            wmma::load_matrix_sync(fa, ATRANS ? A + kk * PLD + mi * 16 : A + mi * 16 * PLD + kk, PLD);
            wmma::load_matrix_sync(fb, B + kk * LDE + ni * 16, LDE);
            wmma::mma_sync(acc[t], fa, fb, acc[t]);
        }
    }
}

template <int DMAX> __device__ __forceinline__ void tc_store(float *O, const acc_frag (&acc)[DMAX / 32]) {
    constexpr int OLD = DMAX + 4;
    const int w = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < DMAX / 32; t++) {
        const int f = w + 4 * t, mi = f & 1, ni = f >> 1;
        wmma::store_matrix_sync(O + mi * 16 * OLD + ni * 16, acc[t], OLD, wmma::mem_row_major);
    }
}

template <int DMAX> __device__ __forceinline__ void tc_zero(acc_frag (&acc)[DMAX / 32]) {
#pragma unroll
    for (int t = 0; t < DMAX / 32; t++) wmma::fill_fragment(acc[t], 0.0f);
}

/* Rows [r0, r0 + 32) of O[32][DMAX + 4] (times scale[row] when given) into head h of t. */
template <int DMAX>
__device__ __forceinline__ void write_rows(const cuk_bthd &t, int64_t b, int64_t h, int64_t r0, int64_t rlim,
                                           const float *O, const float *scale) {
    constexpr int OLD = DMAX + 4;
    for (int e = threadIdx.x; e < TILE * DMAX; e += NTH) {
        int rr = e / DMAX, d = e % DMAX;
        int64_t row = r0 + rr;
        if (row >= rlim || d >= t.D) continue;
        float v = O[rr * OLD + d];
        if (scale) v *= scale[rr];
        stf(t.p, t.dt, cuk_roff(t, b, row, h) + d, v);
    }
}

/* P and dS of a 32 x 32 block from S and dP ([q][k], f32) for queries i0..
 * and keys j0..; Lq/Dq are lse and D of the 32 query rows. P may be NULL. */
__device__ __forceinline__ void tc_probs(bf16 *P, bf16 *dS, const float *S, const float *dP, const float *Lq,
                                         const float *Dq, int64_t i0, int64_t ilim, int64_t j0, int64_t jlim,
                                         const cuk_attn &a) {
    for (int e = threadIdx.x; e < TILE * TILE; e += NTH) {
        const int qi = e >> 5, kj = e & 31;
        const int64_t i = i0 + qi, j = j0 + kj;
        const bool vis = i < ilim && j < jlim && cuk_visible(a, i, j);
        const float p = vis ? expf(a.scale * S[qi * SLD + kj] - Lq[qi]) : 0.0f;
        const float ds = vis ? p * (dP[qi * SLD + kj] - Dq[qi]) * a.scale : 0.0f;
        if (P) P[qi * PLD + kj] = __float2bfloat16_rn(p);
        dS[qi * PLD + kj] = __float2bfloat16_rn(ds);
    }
}

/* Byte sizes of the shared-memory carve-ups (every piece a multiple of 32 bytes). */
template <int DMAX> __host__ __device__ constexpr size_t tile_bf() { return (size_t)TILE * (DMAX + 8) * sizeof(bf16); }
template <int DMAX> __host__ __device__ constexpr size_t tile_o() { return (size_t)TILE * (DMAX + 4) * sizeof(float); }
__host__ __device__ constexpr size_t tile_s() { return (size_t)TILE * SLD * sizeof(float); }
__host__ __device__ constexpr size_t tile_p() { return (size_t)TILE * PLD * sizeof(bf16); }
template <int DMAX> static constexpr size_t tc_fwd_smem() {
    return 3 * tile_bf<DMAX>() + tile_s() + tile_o<DMAX>() + tile_p() + 3 * TILE * sizeof(float);
}
template <int DMAX> static constexpr size_t tc_kv_smem() {
    return 4 * tile_bf<DMAX>() + 2 * tile_s() + 2 * tile_p() + tile_o<DMAX>() + 2 * TILE * sizeof(float);
}
template <int DMAX> static constexpr size_t tc_q_smem() {
    return 4 * tile_bf<DMAX>() + 2 * tile_s() + tile_p() + tile_o<DMAX>() + 2 * TILE * sizeof(float);
}

/* ---------------------------------------------------------------- forward */

template <int DMAX>
__global__ void __launch_bounds__(NTH)
    k_tc_fwd(cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a, int64_t ntiles) {
    constexpr int OLD = DMAX + 4, NF = 2 * DMAX / 16;
    extern __shared__ __align__(128) unsigned char smem_tc[];
    bf16 *Qe = (bf16 *)smem_tc, *Ke = (bf16 *)(smem_tc + tile_bf<DMAX>()),
         *Ve = (bf16 *)(smem_tc + 2 * tile_bf<DMAX>());
    float *Sf = (float *)(smem_tc + 3 * tile_bf<DMAX>());
    float *Of = (float *)((unsigned char *)Sf + tile_s());
    bf16 *Pe = (bf16 *)((unsigned char *)Of + tile_o<DMAX>());
    float *row_m = (float *)((unsigned char *)Pe + tile_p()), *row_l = row_m + TILE, *row_c = row_l + TILE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t qt = ntiles - 1 - (int64_t)blockIdx.x % ntiles, bh = (int64_t)blockIdx.x / ntiles;
    const int64_t b = bh / q.H, h = bh % q.H, hk = h / (q.H / k.H);
    const int64_t Tq = q.T, Tk = k.T, i0 = qt * TILE;

    load_bf<DMAX>(Qe, q, b, h, i0, Tq);
    for (int e = tid; e < TILE * OLD; e += NTH) Of[e] = 0.0f;
    if (tid < TILE) {
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.0f;
    }
    const int64_t ilast = i0 + TILE - 1 < Tq - 1 ? i0 + TILE - 1 : Tq - 1;
    int64_t jlo, jhi;
    cuk_key_span(a, i0, ilast, Tk, &jlo, &jhi);
    for (int64_t j0 = jlo; j0 <= jhi; j0 += TILE) {
        __syncthreads();
        load_bf<DMAX>(Ke, k, b, hk, j0, jhi + 1);
        load_bf<DMAX>(Ve, v, b, hk, j0, jhi + 1);
        __syncthreads();
        tc_scores<DMAX>(Sf, Qe, Ke);
        __syncthreads();
        /* online softmax: warp w updates rows 8w..8w+7, lane = key */
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int il = warp * RPW + r;
            const int64_t i = i0 + il, j = j0 + lane;
            const bool vis = i < Tq && j <= jhi && cuk_visible(a, i, j);
            const float sv = vis ? a.scale * Sf[il * SLD + lane] : -INFINITY;
            const float mold = row_m[il], mnew = fmaxf(mold, warp_max(sv));
            const float p = mnew == -INFINITY ? 0.0f : expf(sv - mnew);
            const float ps = warp_sum(p);
            Pe[il * PLD + lane] = __float2bfloat16_rn(p);
            if (lane == 0) {
                const float corr = mnew == -INFINITY ? 1.0f : expf(mold - mnew);
                row_l[il] = row_l[il] * corr + ps;
                row_m[il] = mnew;
                row_c[il] = corr;
            }
        }
        __syncthreads();
        for (int e = tid; e < TILE * DMAX; e += NTH) Of[(e / DMAX) * OLD + e % DMAX] *= row_c[e / DMAX];
        __syncthreads();
        /* O += P V, the accumulator round-trips through shared memory */
        for (int f = warp; f < NF; f += NTH / 32) {
            const int mi = f & 1, ni = f >> 1;
            acc_frag acc;
            wmma::load_matrix_sync(acc, Of + mi * 16 * OLD + ni * 16, OLD, wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < TILE; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, Pe + mi * 16 * PLD + kk, PLD);
                wmma::load_matrix_sync(fb, Ve + kk * (DMAX + 8) + ni * 16, DMAX + 8);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(Of + mi * 16 * OLD + ni * 16, acc, OLD, wmma::mem_row_major);
        }
    }
    __syncthreads();
    if (tid < TILE) {
        const float l = row_l[tid];
        if (lse && i0 + tid < Tq) lse[(b * q.H + h) * Tq + i0 + tid] = l > 0.0f ? row_m[tid] + logf(l) : -INFINITY;
        row_c[tid] = l > 0.0f ? 1.0f / l : 0.0f;
    }
    __syncthreads();
    write_rows<DMAX>(o, b, h, i0, Tq, Of, row_c);
}

/* ---------------------------------------------------------------- backward */

template <int DMAX>
__global__ void __launch_bounds__(NTH)
    k_tc_bwd_kv(cuk_bthd dk, cuk_bthd dv, cuk_bthd g, cuk_bthd q, cuk_bthd k, cuk_bthd v, const float *lse,
                const float *dvec, cuk_attn a, int64_t ntiles) {
    extern __shared__ __align__(128) unsigned char smem_tc[];
    unsigned char *p = smem_tc;
    bf16 *Ke = (bf16 *)p, *Ve = (bf16 *)(p + tile_bf<DMAX>()), *Qe = (bf16 *)(p + 2 * tile_bf<DMAX>());
    bf16 *Ge = (bf16 *)(p + 3 * tile_bf<DMAX>());
    p += 4 * tile_bf<DMAX>();
    float *Sf = (float *)p, *DPf = (float *)(p + tile_s());
    p += 2 * tile_s();
    bf16 *Pe = (bf16 *)p, *DSe = (bf16 *)(p + tile_p());
    p += 2 * tile_p();
    float *Of = (float *)p, *Lc = (float *)(p + tile_o<DMAX>()), *Dc = Lc + TILE;
    const int tid = threadIdx.x;
    const int64_t kt = (int64_t)blockIdx.x % ntiles, bh = (int64_t)blockIdx.x / ntiles;
    const int64_t b = bh / k.H, hk = bh % k.H, group = q.H / k.H;
    const int64_t Tq = q.T, Tk = k.T, j0 = kt * TILE;
    const int64_t jlast = j0 + TILE - 1 < Tk - 1 ? j0 + TILE - 1 : Tk - 1;

    load_bf<DMAX>(Ke, k, b, hk, j0, Tk);
    load_bf<DMAX>(Ve, v, b, hk, j0, Tk);
    int64_t ilo, ihi;
    cuk_query_span(a, j0, jlast, Tq, &ilo, &ihi);
    acc_frag fk[DMAX / 32], fv[DMAX / 32];
    tc_zero<DMAX>(fk);
    tc_zero<DMAX>(fv);
    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        for (int64_t i0 = ilo; i0 <= ihi; i0 += TILE) {
            __syncthreads();
            load_bf<DMAX>(Qe, q, b, h, i0, ihi + 1);
            load_bf<DMAX>(Ge, g, b, h, i0, ihi + 1);
            if (tid < TILE) {
                int64_t i = i0 + tid, row = (b * q.H + h) * Tq + i;
                Lc[tid] = i <= ihi ? lse[row] : 0.0f;
                Dc[tid] = i <= ihi ? dvec[row] : 0.0f;
            }
            __syncthreads();
            tc_scores<DMAX>(Sf, Qe, Ke);  /* S[q][k] */
            tc_scores<DMAX>(DPf, Ge, Ve); /* dP[q][k] */
            __syncthreads();
            tc_probs(Pe, DSe, Sf, DPf, Lc, Dc, i0, ihi + 1, j0, jlast + 1, a);
            __syncthreads();
            tc_accumulate<DMAX, true>(fv, Pe, Ge);  /* dV += P^T dO */
            tc_accumulate<DMAX, true>(fk, DSe, Qe); /* dK += dS^T Q */
        }
    }
    __syncthreads();
    if (dk.p) {
        tc_store<DMAX>(Of, fk);
        __syncthreads();
        write_rows<DMAX>(dk, b, hk, j0, Tk, Of, NULL);
        __syncthreads();
    }
    if (dv.p) {
        tc_store<DMAX>(Of, fv);
        __syncthreads();
        write_rows<DMAX>(dv, b, hk, j0, Tk, Of, NULL);
    }
}

template <int DMAX>
__global__ void __launch_bounds__(NTH) k_tc_bwd_q(cuk_bthd dq, cuk_bthd g, cuk_bthd q, cuk_bthd k, cuk_bthd v,
                                                  const float *lse, const float *dvec, cuk_attn a, int64_t ntiles) {
    extern __shared__ __align__(128) unsigned char smem_tc[];
    unsigned char *p = smem_tc;
    bf16 *Qe = (bf16 *)p, *Ge = (bf16 *)(p + tile_bf<DMAX>()), *Ke = (bf16 *)(p + 2 * tile_bf<DMAX>());
    bf16 *Ve = (bf16 *)(p + 3 * tile_bf<DMAX>());
    p += 4 * tile_bf<DMAX>();
    float *Sf = (float *)p, *DPf = (float *)(p + tile_s());
    p += 2 * tile_s();
    bf16 *DSe = (bf16 *)p;
    p += tile_p();
    float *Of = (float *)p, *Lr = (float *)(p + tile_o<DMAX>()), *Dr = Lr + TILE;
    const int tid = threadIdx.x;
    const int64_t qt = ntiles - 1 - (int64_t)blockIdx.x % ntiles, bh = (int64_t)blockIdx.x / ntiles;
    const int64_t b = bh / q.H, h = bh % q.H, hk = h / (q.H / k.H);
    const int64_t Tq = q.T, Tk = k.T, i0 = qt * TILE;

    load_bf<DMAX>(Qe, q, b, h, i0, Tq);
    load_bf<DMAX>(Ge, g, b, h, i0, Tq);
    if (tid < TILE) {
        int64_t i = i0 + tid, row = (b * q.H + h) * Tq + i;
        Lr[tid] = i < Tq ? lse[row] : 0.0f;
        Dr[tid] = i < Tq ? dvec[row] : 0.0f;
    }
    const int64_t ilast = i0 + TILE - 1 < Tq - 1 ? i0 + TILE - 1 : Tq - 1;
    int64_t jlo, jhi;
    cuk_key_span(a, i0, ilast, Tk, &jlo, &jhi);
    acc_frag fq[DMAX / 32];
    tc_zero<DMAX>(fq);
    for (int64_t j0 = jlo; j0 <= jhi; j0 += TILE) {
        __syncthreads();
        load_bf<DMAX>(Ke, k, b, hk, j0, jhi + 1);
        load_bf<DMAX>(Ve, v, b, hk, j0, jhi + 1);
        __syncthreads();
        tc_scores<DMAX>(Sf, Qe, Ke);
        tc_scores<DMAX>(DPf, Ge, Ve);
        __syncthreads();
        tc_probs(NULL, DSe, Sf, DPf, Lr, Dr, i0, Tq, j0, jhi + 1, a);
        __syncthreads();
        tc_accumulate<DMAX, false>(fq, DSe, Ke); /* dQ += dS K */
    }
    __syncthreads();
    tc_store<DMAX>(Of, fq);
    __syncthreads();
    write_rows<DMAX>(dq, b, h, i0, Tq, Of, NULL);
}

/* ---------------------------------------------------------------- launchers */

template <int DMAX> static cudaError_t tc_setup_one(void) {
    return cuk_smem_limits(k_tc_fwd<DMAX>, tc_fwd_smem<DMAX>(), k_tc_bwd_kv<DMAX>, tc_kv_smem<DMAX>(), k_tc_bwd_q<DMAX>,
                           tc_q_smem<DMAX>());
}

extern "C" cudaError_t cuk_attn_tc_setup(void) {
    cudaError_t e = tc_setup_one<64>();
    if (e == cudaSuccess) e = tc_setup_one<128>();
    if (e == cudaSuccess) e = tc_setup_one<256>();
    return e;
}

extern "C" int cuk_attn_tc_ok(const cuk_bthd *q, const cuk_bthd *k, const cuk_bthd *v, const cuk_bthd *dout,
                              cuk_attn a) {
    return a.tc && q->dt == CUK_BF16 && k->dt == CUK_BF16 && v->dt == CUK_BF16 && (!dout || dout->dt == CUK_BF16) &&
           q->D <= CUK_ATTN_MAX_D;
}

template <int DMAX>
static cudaError_t tc_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a) {
    int64_t nt = cuk_cdiv(q.T, TILE);
    k_tc_fwd<DMAX><<<(unsigned)(q.B * q.H * nt), NTH, tc_fwd_smem<DMAX>(), s>>>(o, lse, q, k, v, a, nt);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_attn_tc_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v,
                                       cuk_attn a) {
    if (q.D <= 64) return tc_fwd<64>(s, o, lse, q, k, v, a);
    if (q.D <= 128) return tc_fwd<128>(s, o, lse, q, k, v, a);
    return tc_fwd<256>(s, o, lse, q, k, v, a);
}

template <int DMAX>
static cudaError_t tc_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd g, cuk_bthd q, cuk_bthd k,
                          cuk_bthd v, const float *lse, const float *dvec, cuk_attn a) {
    if ((dk.p || dv.p) && k.B * k.H * k.T > 0) {
        int64_t nt = cuk_cdiv(k.T, TILE);
        k_tc_bwd_kv<DMAX>
            <<<(unsigned)(k.B * k.H * nt), NTH, tc_kv_smem<DMAX>(), s>>>(dk, dv, g, q, k, v, lse, dvec, a, nt);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    if (dq.p && q.B * q.H * q.T > 0) {
        int64_t nt = cuk_cdiv(q.T, TILE);
        k_tc_bwd_q<DMAX><<<(unsigned)(q.B * q.H * nt), NTH, tc_q_smem<DMAX>(), s>>>(dq, g, q, k, v, lse, dvec, a, nt);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_attn_tc_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd dout, cuk_bthd q,
                                       cuk_bthd k, cuk_bthd v, const float *lse, const float *dvec, cuk_attn a) {
    if (q.D <= 64) return tc_bwd<64>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a);
    if (q.D <= 128) return tc_bwd<128>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a);
    return tc_bwd<256>(s, dq, dk, dv, dout, q, k, v, lse, dvec, a);
}
