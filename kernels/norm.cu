/* LayerNorm and RMSNorm over the last dimension: one warp per row, row
 * statistics in f32, the same arithmetic order as the CPU backend.
 *
 * Fast paths (rows 16-byte aligned, activations of one dtype, rows up to
 * 2048 wide forward / 1024 backward): a lane holds K chunks of 8 columns
 * (columns 8 (lane + 32 k) ..), loaded with 16-byte accesses into raw
 * registers and converted only after all of a row's loads are issued; each
 * warp issues its next row's loads before working on the current row;
 * weight and bias are staged once per block in shared memory as f32. The
 * forward is a grid of resident blocks walking rows grid-stride. The
 * backward computes dinp and the dweight/dbias partials of a fixed block of
 * rows in the same pass: each lane adds its columns' terms into its own
 * slots of its warp's partials in shared memory, the warps of a block are
 * added in warp order, and the block partials in block order by
 * cuk_colsum_final: a fixed order, no atomics, bitwise repeatable.
 * Otherwise (misaligned or mixed-dtype rows, wider rows) the general
 * kernels below: two passes over the row, parameter gradients as column
 * sums (elementwise.cu). tests/gpu/normxent_emu.sh runs the fast-path
 * kernels on the CPU against a double reference. */
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
    k_norm_bwd<<<(unsigned)cuk_cdiv(x.rows, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, 0, s>>>(dx, dy, x, w, wdt, mean, rstd,
                                                                                          accum);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- fast paths */
CUK_EMU_BEGIN(norm_fwd);

#define NW 8 /* warps per block of the fast paths */

/* 8 elements of a row as stored (one 16-byte access of bf16/f16, two of
 * f32). A row's loads go into these raw registers and are converted only
 * afterwards: a conversion right after each load (inside its bounds
 * branch) made every 16-byte load of a lane wait for the one before. */
template <int DT> struct raw8 { uint4 q[DT == CUK_F32 ? 2 : 1]; };

template <int DT> CUK_INLINE void raw_zero(raw8<DT> &r) {
    r.q[0] = make_uint4(0u, 0u, 0u, 0u);
    if constexpr (DT == CUK_F32) r.q[1] = r.q[0];
}

/* Elements [i, i + n) of p, zeros after (n >= 8: one 16-byte aligned chunk). */
template <int DT> CUK_INLINE void raw_ld(raw8<DT> &r, const void *p, int64_t i, int n) {
    if (n >= 8) {
        const uint4 *s = (const uint4 *)((const char *)p + i * (DT == CUK_F32 ? 4 : 2));
        r.q[0] = s[0];
        if constexpr (DT == CUK_F32) r.q[1] = s[1];
        return;
    }
    uint32_t u[8];
    if constexpr (DT == CUK_F32) {
        const uint32_t *s = (const uint32_t *)p + i;
#pragma unroll
        for (int e = 0; e < 8; e++) u[e] = e < n ? s[e] : 0u;
        r.q[1] = make_uint4(u[4], u[5], u[6], u[7]);
    } else {
        const uint16_t *s = (const uint16_t *)p + i;
#pragma unroll
        for (int k = 0; k < 4; k++)
            u[k] = (2 * k < n ? (uint32_t)s[2 * k] : 0u) | (2 * k + 1 < n ? (uint32_t)s[2 * k + 1] << 16 : 0u);
    }
    r.q[0] = make_uint4(u[0], u[1], u[2], u[3]);
}

/* The same conversions as cuk_ld8 (so the same f32 values). */
template <int DT> CUK_INLINE void raw_cvt(const raw8<DT> &r, float *v) {
    if constexpr (DT == CUK_F32) {
        const uint4 a = r.q[0], b = r.q[1];
        v[0] = __uint_as_float(a.x);
        v[1] = __uint_as_float(a.y);
        v[2] = __uint_as_float(a.z);
        v[3] = __uint_as_float(a.w);
        v[4] = __uint_as_float(b.x);
        v[5] = __uint_as_float(b.y);
        v[6] = __uint_as_float(b.z);
        v[7] = __uint_as_float(b.w);
    } else {
        const uint32_t w[4] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint16_t lo = (uint16_t)(w[k] & 0xffffu), hi = (uint16_t)(w[k] >> 16);
            v[2 * k] = DT == CUK_BF16 ? cuk_bf16_to_f32(lo) : cuk_f16_to_f32(lo);
            v[2 * k + 1] = DT == CUK_BF16 ? cuk_bf16_to_f32(hi) : cuk_f16_to_f32(hi);
        }
    }
}

/* Lane `lane`'s K chunks of a row: columns 8 (lane + 32 k) .. + 8 of the row at element `off`. */
template <int DT, int K> CUK_INLINE void ld_row(raw8<DT> *r, const void *p, int64_t off, int lane, int C) {
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int c0 = 8 * (lane + 32 * k);
        if (c0 < C) raw_ld<DT>(r[k], p, off + c0, C - c0);
        else raw_zero<DT>(r[k]);
    }
}

/* A parameter vector (any float dtype; NULL: zeros) as f32 in shared memory,
 * laid out so that lane l's chunk k (columns 8 (l + 32 k) .. + 8) is the
 * float4s [64 k + l] and [64 k + 32 + l]: a warp reads 512 consecutive bytes
 * per access, without bank conflicts. Zeros past C. */
CUK_INLINE void param_to_smem(float4 *s, const void *p, int dt, int C, int K) {
    for (int q = threadIdx.x; q < K * 64; q += blockDim.x) {
        const int k2 = q >> 5, c = 8 * ((k2 >> 1) * 32 + (q & 31)) + 4 * (k2 & 1);
        float f[4];
#pragma unroll
        for (int e = 0; e < 4; e++) f[e] = p && c + e < C ? ldf(p, dt, c + e) : 0.0f;
        s[q] = make_float4(f[0], f[1], f[2], f[3]);
    }
}

CUK_INLINE void smem_ld8(const float4 *s, int k, int lane, float *v) {
    const float4 a = s[64 * k + lane], b = s[64 * k + 32 + lane];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
    v[4] = b.x;
    v[5] = b.y;
    v[6] = b.z;
    v[7] = b.w;
}

CUK_INLINE void smem_st8(float4 *s, int k, int lane, const float *v) {
    s[64 * k + lane] = make_float4(v[0], v[1], v[2], v[3]);
    s[64 * k + 32 + lane] = make_float4(v[4], v[5], v[6], v[7]);
}

/* Forward: warps walk rows grid-stride (a grid of resident blocks), each
 * issuing the loads of its next row before working on the current one, so
 * a row's worth of 16-byte loads per warp is always in flight; weight and
 * bias are staged once per block in shared memory as f32. Per row the
 * arithmetic of the general kernel: mean, then the centred variance, in
 * f32, a lane's columns in order then the warp's butterfly. */
/* Resident blocks per SM the forward asks the register allocator for, by
 * the bytes of a row a lane holds (the most blocks that fit without
 * spilling, as -Xptxas -v reports): 4 blocks (64 registers) up to 48
 * bytes (d_model 768 in bf16), 3 up to 64, 2 up to 96. */
#define FWD_LANE_BYTES(DT, K) ((K) * ((DT) == CUK_F32 ? 32 : 16))
#define FWD_MINB(DT, K) \
    (FWD_LANE_BYTES(DT, K) <= 48 ? 4 : FWD_LANE_BYTES(DT, K) <= 64 ? 3 : FWD_LANE_BYTES(DT, K) <= 96 ? 2 : 1)

template <int DT, int K, bool RMS>
__global__ void __launch_bounds__(32 * NW, FWD_MINB(DT, K))
    k_norm_fwd_reg(cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w, int wdt, const void *b, int bdt,
                   float eps) {
    extern __shared__ float4 sprm[]; /* weight [K * 64], then bias (LayerNorm) */
    cuk_pdl_trigger();               /* a decode step's next product starts its weight reads now (gemv.cu) */
    const int lane = threadIdx.x & 31, C = (int)x.cols;
    const int64_t step = (int64_t)gridDim.x * NW;
    int64_t r = blockIdx.x * (int64_t)NW + (threadIdx.x >> 5);
    raw8<DT> nx[K];
    if (r < x.rows) ld_row<DT, K>(nx, x.p, r * x.ld, lane, C); /* in flight while the parameters are staged */
    param_to_smem(sprm, w, wdt, C, K);
    if (!RMS) param_to_smem(sprm + K * 64, b, bdt, C, K);
    __syncthreads();
    for (; r < x.rows; r += step) {
        float v[K][8];
#pragma unroll
        for (int k = 0; k < K; k++) raw_cvt<DT>(nx[k], v[k]);
        if (r + step < x.rows) ld_row<DT, K>(nx, x.p, (r + step) * x.ld, lane, C);
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
            const int n = C - 8 * (lane + 32 * k);
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
            const int c0 = 8 * (lane + 32 * k);
            if (c0 >= C) continue;
            float wv[8], bv[8], o[8];
            smem_ld8(sprm, k, lane, wv);
            if (!RMS) smem_ld8(sprm + K * 64, k, lane, bv);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                if (RMS) o[e] = wv[e] * (v[k][e] * rs);
                else o[e] = (v[k][e] - m) * rs * wv[e] + bv[e]; /* bv 0 without bias, as the general kernel */
            }
            cuk_st8_tail<DT>(y.p, r * y.ld + c0, C - c0, o);
        }
        if (lane == 0) {
            if (mean && !RMS) mean[r] = m;
            if (rstd) rstd[r] = rs;
        }
    }
}

CUK_EMU_END(norm_fwd);

/* Per-device caches of the launchers (ordinals below 64; others are not cached). */
#define NDEV_CACHE 64
static int cur_dev(void) {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= NDEV_CACHE) return -1;
    return dev;
}

/* Blocks of a grid-stride kernel that are resident at once on the current device. */
template <class F> static int64_t resident_blocks(F *kern, size_t smem, int *cache) {
    const int dev = cur_dev();
    int occ = dev >= 0 ? cache[dev] : 0;
    if (occ <= 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 32 * NW, smem) != cudaSuccess) {
            (void)cudaGetLastError();
            occ = 0;
        }
        if (occ < 1) occ = 1;
        if (dev >= 0) cache[dev] = occ;
    }
    return (int64_t)occ * cuk_sm_count();
}

template <int DT, int K, bool RMS>
static void launch_fwd_k(cudaStream_t s, cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w, int wdt,
                         const void *b, int bdt, float eps) {
    static int occ[NDEV_CACHE];
    const size_t smem = (RMS ? 1 : 2) * (size_t)K * 64 * sizeof(float4);
    const int64_t nb = cuk_cdiv(x.rows, NW), cap = resident_blocks(k_norm_fwd_reg<DT, K, RMS>, smem, occ);
    k_norm_fwd_reg<DT, K, RMS>
        <<<(unsigned)(nb < cap ? nb : cap), 32 * NW, smem, s>>>(y, mean, rstd, x, w, wdt, b, bdt, eps);
}

template <int DT, int K>
static void launch_fwd_reg(cudaStream_t s, cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w, int wdt,
                           const void *b, int bdt, float eps, int rms) {
    if (rms) launch_fwd_k<DT, K, true>(s, y, mean, rstd, x, w, wdt, b, bdt, eps);
    else launch_fwd_k<DT, K, false>(s, y, mean, rstd, x, w, wdt, b, bdt, eps);
}

template <int DT>
static bool fwd_reg(cudaStream_t s, int64_t kneed, cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w,
                    int wdt, const void *b, int bdt, float eps, int rms) {
    if (kneed <= 1) launch_fwd_reg<DT, 1>(s, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 2) launch_fwd_reg<DT, 2>(s, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 3) launch_fwd_reg<DT, 3>(s, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 4) launch_fwd_reg<DT, 4>(s, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 6) launch_fwd_reg<DT, 6>(s, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    else if (kneed <= 8) launch_fwd_reg<DT, 8>(s, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
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
    if (kneed > 8 || x.dt != y.dt || !float_dt(x.dt) || !float_dt(wdt) || (b && !rms && !float_dt(bdt)))
        return cudaSuccess;
    if (!cuk_vec_ok(x) || !cuk_vec_ok(y)) return cudaSuccess;
    if (rms) b = NULL;
    bool ok = x.dt == CUK_F32    ? fwd_reg<CUK_F32>(s, kneed, y, mean, rstd, x, w, wdt, b, bdt, eps, rms)
              : x.dt == CUK_BF16 ? fwd_reg<CUK_BF16>(s, kneed, y, mean, rstd, x, w, wdt, b, bdt, eps, rms)
                                 : fwd_reg<CUK_F16>(s, kneed, y, mean, rstd, x, w, wdt, b, bdt, eps, rms);
    *done = ok;
    return cudaGetLastError();
}

CUK_EMU_BEGIN(norm_bwd);
/* Backward: a block of NW warps owns rows [blockIdx.x * rpb, + rpb); warp wp
 * takes rows r0 + wp, r0 + wp + NW, ... in order, issuing the loads of its
 * next row (dout, x, and dinp when accumulating) before working on the
 * current one (16-bit rows, or narrow f32 rows: the registers allow it).
 * Each lane adds its columns' dweight/dbias terms of its rows into its own
 * slots of the warp's partials in shared memory (registers would not leave
 * room for the prefetch); at the end the warps' partials are added in warp
 * order into the block partial, and cuk_colsum_final adds the block
 * partials in block order: a fixed order, no atomics. */
/* Two resident blocks per SM (128 registers) for 16-bit rows up to 768
 * columns; wider or f32 rows need more registers for the prefetch. */
#define BWD_MINB(DT, K) ((DT) != CUK_F32 && (K) <= 3 ? 2 : 1)

template <int DT, int K, bool RMS>
__global__ void __launch_bounds__(32 * NW, BWD_MINB(DT, K))
    k_norm_bwd_reg(cuk_mat dx, float *pw, float *pb, cuk_mat dy, cuk_mat x, const void *w, int wdt, const float *mean,
                   const float *rstd, int accum, int64_t rpb) {
    constexpr bool PF = DT != CUK_F32 || K <= 2;
    /* weight [K * 64], then per warp: dweight partial [K * 64], dbias partial [K * 64] */
    extern __shared__ float4 sbw[];
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, C = (int)x.cols;
    const int64_t r0 = blockIdx.x * rpb, r1 = r0 + rpb < x.rows ? r0 + rpb : x.rows;
    const bool par = pw || pb, din = dx.p != NULL, acc = din && accum;
    float4 *saw = sbw + K * 64 + wp * 2 * K * 64, *sab = saw + K * 64;
    raw8<DT> ndy[K], nxx[K], npv[K];
#pragma unroll
    for (int k = 0; k < K; k++) raw_zero<DT>(npv[k]); /* copied each row even when not loaded */
    float nm = 0.0f, nrs = 0.0f;
    int64_t r = r0 + wp;
    if (PF && r < r1) {
        ld_row<DT, K>(ndy, dy.p, r * dy.ld, lane, C);
        ld_row<DT, K>(nxx, x.p, r * x.ld, lane, C);
        if (acc) ld_row<DT, K>(npv, dx.p, r * dx.ld, lane, C);
        nm = RMS ? 0.0f : mean[r];
        nrs = rstd[r];
    }
    param_to_smem(sbw, w, wdt, C, K);
    if (par)
#pragma unroll
        for (int k = 0; k < 2 * K; k++) {
            saw[32 * k + lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            sab[32 * k + lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    __syncthreads();
    for (; r < r1; r += NW) {
        raw8<DT> cdy[K], cxx[K], cpv[K];
        float m, rs;
        if (PF) {
#pragma unroll
            for (int k = 0; k < K; k++) {
                cdy[k] = ndy[k];
                cxx[k] = nxx[k];
                cpv[k] = npv[k];
            }
            m = nm;
            rs = nrs;
            const int64_t rn = r + NW;
            if (rn < r1) {
                ld_row<DT, K>(ndy, dy.p, rn * dy.ld, lane, C);
                ld_row<DT, K>(nxx, x.p, rn * x.ld, lane, C);
                if (acc) ld_row<DT, K>(npv, dx.p, rn * dx.ld, lane, C);
                nm = RMS ? 0.0f : mean[rn];
                nrs = rstd[rn];
            }
        } else {
            ld_row<DT, K>(cdy, dy.p, r * dy.ld, lane, C);
            ld_row<DT, K>(cxx, x.p, r * x.ld, lane, C);
            if (acc) ld_row<DT, K>(cpv, dx.p, r * dx.ld, lane, C);
            m = RMS ? 0.0f : mean[r];
            rs = rstd[r];
        }
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            if (8 * (lane + 32 * k) >= C) continue; /* past the row: contributes nothing */
            float d[8], xv[8], wv[8];
            raw_cvt<DT>(cdy[k], d);
            raw_cvt<DT>(cxx[k], xv);
            smem_ld8(sbw, k, lane, wv);
            if (par) {
                float aw[8], ab[8];
                smem_ld8(saw, k, lane, aw);
                smem_ld8(sab, k, lane, ab);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    aw[e] += d[e] * ((xv[e] - m) * rs);
                    ab[e] += d[e];
                }
                smem_st8(saw, k, lane, aw);
                smem_st8(sab, k, lane, ab);
            }
            /* past C within the chunk d = w = 0: the terms are exact zeros */
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float g = d[e] * wv[e];
                sg += g;
                sgx += g * ((xv[e] - m) * rs);
            }
        }
        if (!din) continue;
        sg = warp_sum(sg);
        sgx = warp_sum(sgx);
        const float mg = RMS ? 0.0f : sg / (float)C, mgx = sgx / (float)C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c0 = 8 * (lane + 32 * k);
            if (c0 >= C) continue;
            float d[8], xv[8], wv[8], pv[8], o[8];
            raw_cvt<DT>(cdy[k], d);
            raw_cvt<DT>(cxx[k], xv);
            smem_ld8(sbw, k, lane, wv);
            if (acc) raw_cvt<DT>(cpv[k], pv);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float val = rs * (d[e] * wv[e] - mg - (xv[e] - m) * rs * mgx);
                o[e] = acc ? pv[e] + val : val;
            }
            cuk_st8_tail<DT>(dx.p, r * dx.ld + c0, C - c0, o);
        }
    }
    if (!par) return;
    /* the warps' partials, added in warp order, into this block's partial */
    __syncthreads();
    for (int q = threadIdx.x; q < K * 64; q += 32 * NW) {
        const int k2 = q >> 5, c = 8 * ((k2 >> 1) * 32 + (q & 31)) + 4 * (k2 & 1);
        if (c >= C) continue;
        for (int pass = 0; pass < 2; pass++) {
            float *out = pass == 0 ? pw : pb;
            if (!out) continue;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int v = 0; v < NW; v++) {
                const float4 t = sbw[K * 64 + v * 2 * K * 64 + pass * K * 64 + q];
                a.x += t.x;
                a.y += t.y;
                a.z += t.z;
                a.w += t.w;
            }
            float *o = out + blockIdx.x * (int64_t)C + c;
            const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (c + e < C) o[e] = av[e];
        }
    }
}

CUK_EMU_END(norm_bwd);

template <int DT, int K, bool RMS>
static cudaError_t launch_bwd_k(cudaStream_t s, unsigned nb, bool par, cuk_mat dx, float *pw, float *pb, cuk_mat dy,
                                cuk_mat x, const void *w, int wdt, const float *mean, const float *rstd, int accum,
                                int64_t rpb) {
    /* weight, plus each warp's two partials when there are parameter gradients */
    const size_t smem = (size_t)K * 64 * sizeof(float4) * (1 + (par ? 2 * NW : 0));
    static size_t allowed[NDEV_CACHE]; /* the limit raised so far on each device (0: the default 48 KB) */
    const int dev = cur_dev();
    if (smem > 48 * 1024 && (dev < 0 || smem > allowed[dev])) {
        cudaError_t e =
            cudaFuncSetAttribute(k_norm_bwd_reg<DT, K, RMS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        if (dev >= 0) allowed[dev] = smem;
    }
    k_norm_bwd_reg<DT, K, RMS><<<nb, 32 * NW, smem, s>>>(dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    return cudaGetLastError();
}

template <int DT, int K>
static cudaError_t launch_bwd_reg(cudaStream_t s, unsigned nb, bool par, cuk_mat dx, float *pw, float *pb, cuk_mat dy,
                                  cuk_mat x, const void *w, int wdt, const float *mean, const float *rstd, int accum,
                                  int64_t rpb) {
    if (!mean) return launch_bwd_k<DT, K, true>(s, nb, par, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    return launch_bwd_k<DT, K, false>(s, nb, par, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
}

template <int DT>
static cudaError_t bwd_reg(cudaStream_t s, int64_t kneed, unsigned nb, bool par, cuk_mat dx, float *pw, float *pb,
                           cuk_mat dy, cuk_mat x, const void *w, int wdt, const float *mean, const float *rstd,
                           int accum, int64_t rpb) {
    if (kneed <= 1) return launch_bwd_reg<DT, 1>(s, nb, par, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    if (kneed <= 2) return launch_bwd_reg<DT, 2>(s, nb, par, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    if (kneed <= 3) return launch_bwd_reg<DT, 3>(s, nb, par, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    return launch_bwd_reg<DT, 4>(s, nb, par, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
}

/* Rows per block of the fused backward: 32, more for tall inputs (about 512
 * blocks: two waves of resident blocks on an H200 and half the partials of
 * 32-row blocks for cuk_colsum_final to add), more again when the block
 * partials would not fit the scratch. A function of the shape and the
 * scratch size only, so the order of the parameter-gradient sums is fixed. */
#define BWD_RPB 32
#define BWD_BLOCKS 512

extern "C" cudaError_t cuk_norm_bwd_fast(cudaStream_t s, cuk_mat dx, float *dw, float *db, cuk_mat dy, cuk_mat x,
                                         const void *w, int wdt, const float *mean, const float *rstd, int accum,
                                         float *scratch, size_t scratch_floats, int *done) {
    *done = 0;
    if (x.rows <= 0 || x.cols <= 0) return cudaSuccess;
    const int64_t C = x.cols, kneed = lane_chunks(C);
    if (kneed > 4 || dy.dt != x.dt || (dx.p && dx.dt != x.dt) || !float_dt(x.dt) || !float_dt(wdt)) return cudaSuccess;
    if (!cuk_vec_ok(x) || !cuk_vec_ok(dy) || (dx.p && !cuk_vec_ok(dx))) return cudaSuccess;
    if (!dx.p) accum = 0; /* dinp's old value is read only when dinp is written */
    const int64_t per = (dw ? 1 : 0) + (db ? 1 : 0);
    int64_t rpb = cuk_cdiv(x.rows, BWD_BLOCKS);
    if (rpb < BWD_RPB) rpb = BWD_RPB;
    int64_t nb = cuk_cdiv(x.rows, rpb);
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
    cudaError_t e;
    if (x.dt == CUK_F32)
        e = bwd_reg<CUK_F32>(s, kneed, (unsigned)nb, per > 0, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    else if (x.dt == CUK_BF16)
        e = bwd_reg<CUK_BF16>(s, kneed, (unsigned)nb, per > 0, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    else e = bwd_reg<CUK_F16>(s, kneed, (unsigned)nb, per > 0, dx, pw, pb, dy, x, w, wdt, mean, rstd, accum, rpb);
    if (e != cudaSuccess) return e;
    *done = 1;
    return cuk_colsum_final(s, pw, pb, nb, C, dw, db);
}
