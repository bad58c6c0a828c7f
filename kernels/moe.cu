/* Mixture-of-experts data movement between token rows [N, C] and rows
 * grouped by expert [S, C] (ops.h: moe_permute, moe_combine_fwd/_bwd).
 * Memory-bound: one block per token row or per assignment, its threads
 * across the columns. No atomics: every output element is written by one
 * thread, sums over a token's choices run in j order and dw's dot product
 * is a block reduction of fixed shape, so results are bitwise repeatable
 * and the f32 sums follow the CPU's order. */
#include "cuda_common.cuh"

static cudaError_t launched(void) { return cudaGetLastError(); }

/* One block per item (assignment or token row), walked grid-stride past the cap. */
static dim3 item_grid(int64_t n) {
    const int64_t cap = (int64_t)1 << 20;
    return dim3((unsigned)(n < cap ? n : cap), 1, 1);
}

/* A warp multiple covering `units` per-thread pieces of a row, 32 to 256:
 * a row wider than 256 pieces is walked by the block. */
static int row_threads(int64_t units) {
    int64_t t = (units + 31) / 32 * 32;
    if (t < 32) t = 32;
    if (t > 256) t = 256;
    return (int)t;
}

/* ---------------------------------------------------------------- kernels
 * (one region, which tests/gpu/moe_emu.sh compiles on the host) */
CUK_EMU_BEGIN(moe);

/* The grouped row of assignment i, or -1 when dropped. A row past the S
 * grouped rows would write outside the buffer: it is skipped and reported
 * (block-uniform, so callers may branch on it around block reductions). */
CUK_INLINE int64_t moe_row(const int32_t *pos, int64_t i, int64_t S, cuk_errrec *err) {
    const int32_t r = pos[i];
    if (r < 0) return -1;
    if (r >= S) {
        if (threadIdx.x == 0) cuk_report(err, CUK_ERR_MOE_POS, i, r, S, 0);
        return -1;
    }
    return r;
}

/* A bitwise row copy in units of U (16, 8, 4 or 2 bytes, the widest that
 * every row start and the row length allow); ld in bytes. */
template <typename U>
__global__ void __launch_bounds__(256)
    k_moe_permute(char *xe, int64_t xe_ld, int64_t S, const char *x, int64_t x_ld, int64_t units, const int32_t *pos,
                  int64_t n, int64_t k, cuk_errrec *err) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = moe_row(pos, i, S, err);
        if (r < 0) continue;
        const U *src = (const U *)(x + (i / k) * x_ld);
        U *dst = (U *)(xe + r * xe_ld);
#pragma unroll 4
        for (int64_t c = threadIdx.x; c < units; c += blockDim.x) dst[c] = src[c];
    }
}

/* One block per token row t; each thread owns its columns through all k
 * choices, so the sum runs in j order with one rounding at the store. */
template <int DT, bool VEC>
__global__ void __launch_bounds__(256) k_moe_combine_fwd(cuk_mat y, cuk_mat ye, const int32_t *pos, int64_t k,
                                                         const float *w, int accum, cuk_errrec *err) {
    const int64_t C = y.cols;
    for (int64_t t = blockIdx.x; t < y.rows; t += gridDim.x) {
        if (VEC) {
            for (int64_t c = (int64_t)threadIdx.x * 8; c < C; c += (int64_t)blockDim.x * 8) {
                const int m = C - c < 8 ? (int)(C - c) : 8;
                float acc[8], v[8];
                if (accum) {
                    cuk_ld8_tail<DT>(y.p, t * y.ld + c, m, acc);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[e] = 0.0f;
                }
                for (int64_t j = 0; j < k; j++) {
                    const int64_t r = moe_row(pos, t * k + j, ye.rows, err);
                    if (r < 0) continue;
                    const float wj = w ? w[t * k + j] : 1.0f;
                    cuk_ld8_tail<DT>(ye.p, r * ye.ld + c, m, v);
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[e] += wj * v[e];
                }
                cuk_st8_tail<DT>(y.p, t * y.ld + c, m, acc);
            }
        } else {
            for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
                float acc = accum ? cuk_ld1<DT>(y.p, t * y.ld + c) : 0.0f;
                for (int64_t j = 0; j < k; j++) {
                    const int64_t r = moe_row(pos, t * k + j, ye.rows, err);
                    if (r < 0) continue;
                    const float wj = w ? w[t * k + j] : 1.0f;
                    acc += wj * cuk_ld1<DT>(ye.p, r * ye.ld + c);
                }
                cuk_st1<DT>(y.p, t * y.ld + c, acc);
            }
        }
    }
}

/* One block per assignment i: its threads scale dy's row into dye's and
 * sum their columns' products, then one block reduction gives dw[i]. The
 * block size depends only on C, so the reduction tree is fixed. Each
 * element is loaded before it is stored, so dye may be ye itself. */
template <int DT, bool VEC>
__global__ void __launch_bounds__(256)
    k_moe_combine_bwd(cuk_mat dye, float *dw, cuk_mat dy, cuk_mat ye, const int32_t *pos, int64_t k, const float *w,
                      cuk_errrec *err) {
    __shared__ float sh[32];
    const int64_t C = dy.cols, n = dy.rows * k, S = ye.rows < dye.rows ? ye.rows : dye.rows;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = moe_row(pos, i, S, err);
        if (r < 0) {
            if (threadIdx.x == 0) dw[i] = 0.0f;
            continue;
        }
        const int64_t t = i / k;
        const float wi = w[i];
        float dot = 0.0f;
        if (VEC) {
            for (int64_t c = (int64_t)threadIdx.x * 8; c < C; c += (int64_t)blockDim.x * 8) {
                const int m = C - c < 8 ? (int)(C - c) : 8;
                float d[8], v[8], o[8];
                cuk_ld8_tail<DT>(dy.p, t * dy.ld + c, m, d);
                cuk_ld8_tail<DT>(ye.p, r * ye.ld + c, m, v);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    o[e] = wi * d[e];
                    dot += d[e] * v[e];
                }
                cuk_st8_tail<DT>(dye.p, r * dye.ld + c, m, o);
            }
        } else {
            for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
                const float d = cuk_ld1<DT>(dy.p, t * dy.ld + c), v = cuk_ld1<DT>(ye.p, r * ye.ld + c);
                cuk_st1<DT>(dye.p, r * dye.ld + c, wi * d);
                dot += d * v;
            }
        }
        dot = block_sum(dot, sh);
        if (threadIdx.x == 0) dw[i] = dot;
    }
}

CUK_EMU_END(moe);

/* ---------------------------------------------------------------- launchers */

template <typename U>
static cudaError_t permute_as(cudaStream_t s, cuk_mat xe, cuk_mat x, int64_t es, const int32_t *pos, int64_t n,
                              int64_t k, cuk_errrec *err) {
    const int64_t units = x.cols * es / (int64_t)sizeof(U);
    k_moe_permute<U><<<item_grid(n), row_threads(units), 0, s>>>((char *)xe.p, xe.ld * es, xe.rows, (const char *)x.p,
                                                                 x.ld * es, units, pos, n, k, err);
    return launched();
}

extern "C" cudaError_t cuk_moe_permute(cudaStream_t s, cuk_mat xe, cuk_mat x, const int32_t *pos, int64_t k,
                                       cuk_errrec *err) {
    const int64_t n = x.rows * k;
    if (n <= 0 || x.cols <= 0) return cudaSuccess;
    const int64_t es = cuk_dt_size(x.dt);
    const uintptr_t a =
        (uintptr_t)x.p | (uintptr_t)xe.p | (uintptr_t)(x.cols * es) | (uintptr_t)(x.ld * es) | (uintptr_t)(xe.ld * es);
    if ((a & 15u) == 0) return permute_as<uint4>(s, xe, x, es, pos, n, k, err);
    if ((a & 7u) == 0) return permute_as<uint2>(s, xe, x, es, pos, n, k, err);
    if ((a & 3u) == 0) return permute_as<uint32_t>(s, xe, x, es, pos, n, k, err);
    return permute_as<uint16_t>(s, xe, x, es, pos, n, k, err);
}

/* ---------------------------------------------------------------- dtype dispatch */

/* kern<DT, VEC> over the three float dtypes; VEC: 8-element chunks with
 * 16-byte accesses (every row view cuk_vec_ok), else one element a step. */
#define MOE_LAUNCH(kern, dt, vec, grid, nt, ...)                            \
    do {                                                                    \
        if ((dt) == CUK_F32) {                                              \
            if (vec) kern<CUK_F32, true><<<grid, nt, 0, s>>>(__VA_ARGS__);  \
            else kern<CUK_F32, false><<<grid, nt, 0, s>>>(__VA_ARGS__);     \
        } else if ((dt) == CUK_BF16) {                                      \
            if (vec) kern<CUK_BF16, true><<<grid, nt, 0, s>>>(__VA_ARGS__); \
            else kern<CUK_BF16, false><<<grid, nt, 0, s>>>(__VA_ARGS__);    \
        } else {                                                            \
            if (vec) kern<CUK_F16, true><<<grid, nt, 0, s>>>(__VA_ARGS__);  \
            else kern<CUK_F16, false><<<grid, nt, 0, s>>>(__VA_ARGS__);     \
        }                                                                   \
        return launched();                                                  \
    } while (0)

extern "C" cudaError_t cuk_moe_combine_fwd(cudaStream_t s, cuk_mat y, cuk_mat ye, const int32_t *pos, int64_t k,
                                           const float *w, int accum, cuk_errrec *err) {
    if (y.rows <= 0 || y.cols <= 0) return cudaSuccess;
    const bool vec = cuk_vec_ok(y) && cuk_vec_ok(ye);
    const int nt = row_threads(vec ? cuk_cdiv(y.cols, 8) : y.cols);
    MOE_LAUNCH(k_moe_combine_fwd, y.dt, vec, item_grid(y.rows), nt, y, ye, pos, k, w, accum, err);
}

extern "C" cudaError_t cuk_moe_combine_bwd(cudaStream_t s, cuk_mat dye, float *dw, cuk_mat dy, cuk_mat ye,
                                           const int32_t *pos, int64_t k, const float *w, cuk_errrec *err) {
    const int64_t n = dy.rows * k;
    if (n <= 0) return cudaSuccess;
    const bool vec = cuk_vec_ok(dye) && cuk_vec_ok(dy) && cuk_vec_ok(ye);
    const int nt = row_threads(vec ? cuk_cdiv(dy.cols, 8) : dy.cols);
    MOE_LAUNCH(k_moe_combine_bwd, dy.dt, vec, item_grid(n), nt, dye, dw, dy, ye, pos, k, w, err);
}
