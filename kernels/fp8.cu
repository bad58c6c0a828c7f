/* FP8 casts (docs/fp8.md): the amax of a tensor, the scale it implies, and
 * the cast to E4M3/E5M2 codes with an optional transposed copy (Hopper's
 * FP8 products read both operands K-major, so a backward needs dy^T, x^T
 * and W^T). Codes equal colossal/tensor.h's cai_f32_to_fp8 (hardware
 * conversion with saturation, round to nearest even; NaN keeps its sign). */
#include "cuda_common.cuh"
#include "cuda_kernels.h"

#include <cuda_fp8.h>

namespace {

struct umax_op {
    __device__ __forceinline__ unsigned operator()(unsigned a, unsigned b) const { return a > b ? a : b; }
};

/* |v| as f32 bits: for non-negative floats the bits order as the values,
 * and a NaN (made 0x7fc00000) sorts above +inf, so a max propagates it. */
__device__ __forceinline__ unsigned abs_bits(float v) {
    float a = fabsf(v);
    return a != a ? 0x7fc00000u : __float_as_uint(a);
}

/* The delayed recipe with a scale in place casts in one pass that also
 * records the amax (k_cast); otherwise k_amax measures it first and
 * k_scale sets the scale from it. Both kernels decide from meta[1] on the
 * device, before k_scale may change it; scratch[1] = 1 tells k_cast that
 * the amax is already recorded. */
__device__ __forceinline__ int fused(const float *meta, int current, int fuse) {
    return fuse && !current && meta[1] > 0.0f;
}

template <int DT>
__global__ void k_amax(const void *x, int64_t R, int64_t C, int64_t ld, const float *meta, int current, int fuse,
                       unsigned *scratch) {
    if (fused(meta, current, fuse)) return;
    __shared__ unsigned sh[32];
    unsigned m = 0;
    const int64_t n = R * C;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / C, c = i - r * C;
        unsigned b = abs_bits(cuk_ld1<DT>(x, r * ld + c));
        m = b > m ? b : m;
    }
    m = block_reduce(m, sh, 0u, umax_op());
    if (threadIdx.x == 0) atomicMax(scratch, m);
}

/* colossal/tensor.h's cai_fp8_scale_from_amax, the same f32 operations */
__device__ float scale_from_amax(float amax, float fmax, int margin, float prev) {
    if (!(amax > 0.0f) || isinf(amax)) return prev;
    float s = fmax / amax / ldexpf(1.0f, margin);
    return isfinite(s) && s > 0.0f ? s : prev;
}

__global__ void k_scale(unsigned *scratch, float *meta, float fmax, int margin, int current, int fuse) {
    if (fused(meta, current, fuse)) return;
    float amax = __uint_as_float(scratch[0]);
    if (current || !(meta[1] > 0.0f)) {
        float sc = scale_from_amax(amax, fmax, margin, 0.0f);
        meta[1] = sc;
        meta[0] = sc > 0.0f ? 1.0f / sc : 0.0f;
    }
    if (amax > meta[2] || amax != amax) meta[2] = amax;
    scratch[1] = 1;
}

__device__ __forceinline__ uint8_t to_fp8(float v, int e5m2) {
    if (v != v) return (uint8_t)((__float_as_uint(v) >> 24 & 0x80u) | 0x7fu);
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

/* 32x32 tiles, 32x8 threads, each block looping over tiles: codes written
 * row-wise to q and, through shared memory, row-wise to qt. Without a
 * recorded amax (scratch[1] == 0) the block's max |x| goes into meta[2]
 * (one atomic per block; the bits of a non-negative float order as its
 * value). */
template <int DT>
__global__ void __launch_bounds__(256) k_cast(const void *x, int64_t R, int64_t C, int64_t ld, float *meta, int e5m2,
                                              uint8_t *q, uint8_t *qt, const unsigned *scratch) {
    __shared__ uint8_t tile[32][33];
    __shared__ unsigned sh[8];
    const float s = meta[1] > 0.0f ? meta[1] : 1.0f;
    const int record = scratch[1] == 0;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t tiles_c = (C + 31) / 32, n_tiles = tiles_c * ((R + 31) / 32);
    unsigned m = 0;
    for (int64_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const int64_t r0 = t / tiles_c * 32, c0 = t % tiles_c * 32;
#pragma unroll
        for (int k = 0; k < 32; k += 8) {
            int64_t r = r0 + ty + k, c = c0 + tx;
            if (r < R && c < C) {
                float v = cuk_ld1<DT>(x, r * ld + c);
                unsigned b = abs_bits(v);
                m = b > m ? b : m;
                uint8_t code = to_fp8(v * s, e5m2);
                if (q) q[r * C + c] = code;
                tile[ty + k][tx] = code;
            }
        }
        if (qt) {
            __syncthreads();
#pragma unroll
            for (int k = 0; k < 32; k += 8) {
                int64_t c = c0 + ty + k, r = r0 + tx;
                if (r < R && c < C) qt[c * R + r] = tile[tx][ty + k];
            }
            __syncthreads();
        }
    }
    if (!record) return;
    m = warp_reduce(m, umax_op());
    if (tx == 0) sh[ty] = m;
    __syncthreads();
    if (tx == 0 && ty == 0) {
        for (int w = 1; w < 8; w++) m = sh[w] > m ? sh[w] : m;
        atomicMax((unsigned *)&meta[2], m);
    }
}

/* The same cast for rows of whole 16-byte chunks (C and ld multiples of 8,
 * x 16-byte aligned): 64x64 tiles, each thread loading 8 elements at once
 * and storing their 8 codes at once; qt's rows are gathered from the tile
 * in shared memory and stored 8 codes at a time where R allows. The
 * one-element kernel above moves about 1.1 TB/s on an H200 (bench/RESULTS.md);
 * this one is what the 16-bit activations and weights of a model take. */
#define CV_T 64
#define CV_S 68 /* a tile row's bytes: 4-byte aligned, odd in words (2-way conflicts at most) */
template <int DT>
__global__ void __launch_bounds__(256) k_cast_vec(const void *x, int64_t R, int64_t C, int64_t ld, float *meta,
                                                  int e5m2, uint8_t *q, uint8_t *qt, const unsigned *scratch) {
    __shared__ __align__(16) uint8_t tile[CV_T * CV_S];
    __shared__ unsigned sh[32];
    const float s = meta[1] > 0.0f ? meta[1] : 1.0f;
    const int record = scratch[1] == 0;
    const int tid = threadIdx.x;
    const int64_t tiles_c = (C + CV_T - 1) / CV_T, n_tiles = tiles_c * ((R + CV_T - 1) / CV_T);
    unsigned m = 0;
    for (int64_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const int64_t r0 = t / tiles_c * CV_T, c0 = t % tiles_c * CV_T;
        float v[2][8];
        int ok[2];
#pragma unroll
        for (int k = 0; k < 2; k++) { /* issue both loads before converting */
            const int i = tid + k * 256, rr = i >> 3, cc = (i & 7) * 8;
            ok[k] = r0 + rr < R && c0 + cc < C;
            if (ok[k]) cuk_ld8<DT>(x, (r0 + rr) * ld + c0 + cc, v[k]);
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            if (!ok[k]) continue;
            const int i = tid + k * 256, rr = i >> 3, cc = (i & 7) * 8;
            uint32_t w[2] = {0, 0};
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const unsigned b = abs_bits(v[k][e]);
                m = b > m ? b : m;
                w[e >> 2] |= (uint32_t)to_fp8(v[k][e] * s, e5m2) << (8 * (e & 3));
            }
            if (q) *(uint2 *)(q + (r0 + rr) * C + c0 + cc) = make_uint2(w[0], w[1]);
            if (qt) {
                uint32_t *d = (uint32_t *)(tile + rr * CV_S + cc);
                d[0] = w[0];
                d[1] = w[1];
            }
        }
        if (qt) {
            __syncthreads();
#pragma unroll
            for (int k = 0; k < 2; k++) { /* qt row c0 + cr, its columns r0 + rc .. + 7 */
                const int i = tid + k * 256, cr = i >> 3, rc = (i & 7) * 8;
                const int64_t c = c0 + cr, r = r0 + rc;
                if (c >= C || r >= R) continue;
                const int n = R - r < 8 ? (int)(R - r) : 8;
                uint8_t b[8];
#pragma unroll
                for (int j = 0; j < 8; j++) b[j] = tile[(rc + j) * CV_S + cr];
                uint8_t *d = qt + c * R + r;
                if (n == 8 && (R & 7) == 0) {
                    *(uint2 *)d =
                        make_uint2((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24,
                                   (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24);
                } else {
                    for (int j = 0; j < n; j++) d[j] = b[j];
                }
            }
            __syncthreads();
        }
    }
    if (!record) return;
    m = block_reduce(m, sh, 0u, umax_op());
    if (tid == 0) atomicMax((unsigned *)&meta[2], m);
}

template <int DT>
cudaError_t launch(cuk_mat x, float *meta, unsigned *scratch, int e5m2, int current, int margin, uint8_t *q,
                   uint8_t *qt, cudaStream_t s) {
    cudaError_t e = cudaMemsetAsync(scratch, 0, 2 * sizeof(unsigned), s);
    if (e != cudaSuccess) return e;
    const int64_t n = x.rows * x.cols;
    if (n == 0) return cudaSuccess;
    const int fuse = q || qt;
    int blocks = (int)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
    k_amax<DT><<<blocks, 256, 0, s>>>(x.p, x.rows, x.cols, x.ld, meta, current, fuse, scratch);
    k_scale<<<1, 1, 0, s>>>(scratch, meta, e5m2 ? 57344.0f : 448.0f, margin, current, fuse);
    if (!fuse) return cudaGetLastError();
    if (x.cols % 8 == 0 && x.ld % 8 == 0 && (uintptr_t)x.p % 16 == 0 && (uintptr_t)q % 8 == 0 &&
        (uintptr_t)qt % 8 == 0) {
        const int64_t tiles = ((x.cols + CV_T - 1) / CV_T) * ((x.rows + CV_T - 1) / CV_T);
        k_cast_vec<DT><<<(unsigned)(tiles < 8192 ? tiles : 8192), 256, 0, s>>>(x.p, x.rows, x.cols, x.ld, meta, e5m2, q,
                                                                               qt, scratch);
        return cudaGetLastError();
    }
    const int64_t tiles = ((x.cols + 31) / 32) * ((x.rows + 31) / 32);
    dim3 block(32, 8);
    k_cast<DT><<<(unsigned)(tiles < 2048 ? tiles : 2048), block, 0, s>>>(x.p, x.rows, x.cols, x.ld, meta, e5m2, q, qt,
                                                                         scratch);
    return cudaGetLastError();
}

/* y = beta y + sum_s decode(q[s]) * inv_s, in order of s, each product and
 * sum rounded on its own (no FMA), as the host computes it. A block reads
 * the senders' factors (NaN where a sender overflowed) into shared memory
 * DQ_CHUNK at a time, and the format and beta are template arguments, so
 * the inner loop is the decode, one multiply and one add (a form that read
 * meta[s] per element with both choices made at run time summed E5M2
 * without beta wrongly on sm_90 under nvcc 13.0; bench/RESULTS.md). */
#define DQ_CHUNK 1024
template <bool E5M2, bool ACC>
__global__ void __launch_bounds__(256)
    k_dequant_sum(float *y, const uint8_t *q, const float *metas, int64_t S, int64_t n, int64_t stride) {
    __shared__ float inv[DQ_CHUNK];
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    /* the same trip count in every thread of a block: the barriers below */
    for (int64_t base = (int64_t)blockIdx.x * blockDim.x; base < n; base += step) {
        const int64_t i = base + threadIdx.x;
        float acc = ACC && i < n ? y[i] : 0.0f;
        for (int64_t s0 = 0; s0 < S; s0 += DQ_CHUNK) {
            const int ns = S - s0 < DQ_CHUNK ? (int)(S - s0) : DQ_CHUNK;
            __syncthreads(); /* the previous chunk's factors are no longer read */
            for (int k = threadIdx.x; k < ns; k += blockDim.x) {
                const float *m = metas + (s0 + k) * stride;
                inv[k] = isfinite(m[2]) ? m[0] : __int_as_float(0x7fc00000);
            }
            __syncthreads();
            if (i < n)
                for (int k = 0; k < ns; k++) {
                    const __half_raw h =
                        __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q[(s0 + k) * n + i], E5M2 ? __NV_E5M2 : __NV_E4M3);
                    acc = __fadd_rn(acc, __fmul_rn(__half2float(__half(h)), inv[k]));
                }
        }
        if (i < n) y[i] = acc;
    }
}

} // namespace

extern "C" cudaError_t cuk_fp8_dequant_sum(float *y, const uint8_t *q, const float *metas, int64_t S, int64_t n,
                                           int64_t stride, int e5m2, int accumulate, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    const int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    if (e5m2 && accumulate) k_dequant_sum<true, true><<<blocks, 256, 0, s>>>(y, q, metas, S, n, stride);
    else if (e5m2) k_dequant_sum<true, false><<<blocks, 256, 0, s>>>(y, q, metas, S, n, stride);
    else if (accumulate) k_dequant_sum<false, true><<<blocks, 256, 0, s>>>(y, q, metas, S, n, stride);
    else k_dequant_sum<false, false><<<blocks, 256, 0, s>>>(y, q, metas, S, n, stride);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_fp8_cast(cuk_mat x, float *meta, void *amax_scratch, int e5m2, int current, int margin,
                                    uint8_t *q, uint8_t *qt, cudaStream_t s) {
    unsigned *a = (unsigned *)amax_scratch;
    if (x.dt == CUK_BF16) return launch<CUK_BF16>(x, meta, a, e5m2, current, margin, q, qt, s);
    if (x.dt == CUK_F16) return launch<CUK_F16>(x, meta, a, e5m2, current, margin, q, qt, s);
    return launch<CUK_F32>(x, meta, a, e5m2, current, margin, q, qt, s);
}
