/* Tensors, devices and low-precision number formats.
 *
 * A cai_device_t is where memory lives and where ops run: the host (CPU
 * backend, OpenBLAS + OpenMP) or a CUDA GPU (kernels/, built with
 * --with-cuda). Each device carries its op
 * table (colossal/ops.h), so model code never asks which backend it runs on.
 *
 * A cai_tensor is a small value type: a view (data pointer, dtype, shape,
 * strides in elements) over memory owned by someone else, usually one large
 * device allocation carved up by an arena. Views never allocate; only
 * cai_tensor_alloc does. Shapes are row-major: the last dimension varies
 * fastest, and "contiguous" means stride[ndim-1] == 1 and
 * stride[i] == stride[i+1] * shape[i+1].
 *
 * bf16 and f16 are stored as raw uint16_t bit patterns. Conversions from f32
 * round to nearest, ties to even (IEEE 754 default), keep NaN a (quiet) NaN
 * with its sign, overflow to infinity and handle subnormals exactly; the
 * stochastic variants round up with probability equal to the discarded
 * fraction, so E[round(x)] == x.
 *
 * Nothing in this header is collective. */
#ifndef COLOSSAL_TENSOR_H
#define COLOSSAL_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "colossal/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ number formats */

typedef uint16_t cai_bf16; /* bit pattern: 1 sign, 8 exponent (bias 127), 7 mantissa */
typedef uint16_t cai_f16;  /* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa */

static inline uint32_t cai_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float cai_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float cai_bf16_to_f32(cai_bf16 h) { return cai_bits_f32((uint32_t)h << 16); }

/* Shared by the RNE and stochastic paths: `mant` is the truncated magnitude
 * (exponent and mantissa fields already in place, so a carry out of the
 * mantissa correctly bumps the exponent, up to infinity), `dropped` the
 * discarded low bits and `shift` how many there were. */
static inline uint32_t cai_round_rne_(uint32_t mant, uint32_t dropped, int shift) {
    uint32_t half = 1u << (shift - 1);
    return mant + (dropped > half || (dropped == half && (mant & 1u)));
}

static inline uint32_t cai_round_sr_(uint32_t mant, uint32_t dropped, int shift, uint32_t rnd) {
    uint32_t mask = shift >= 32 ? 0xffffffffu : (1u << shift) - 1u;
    return mant + ((rnd & mask) < dropped);
}

/* f32 -> bf16, round to nearest even. */
static inline cai_bf16 cai_f32_to_bf16(float f) {
    uint32_t x = cai_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (cai_bf16)((x >> 16) | 0x0040u); /* quiet NaN */
    return (cai_bf16)cai_round_rne_(x >> 16, x & 0xffffu, 16);
}

/* f32 -> bf16, stochastic: `rnd` supplies 16 uniform random bits (the low ones). */
static inline cai_bf16 cai_f32_to_bf16_sr(float f, uint32_t rnd) {
    uint32_t x = cai_f32_bits(f);
    if ((x & 0x7fffffffu) >= 0x7f800000u) /* Inf stays Inf, NaN stays NaN */
        return (cai_bf16)((x >> 16) | ((x & 0x7fffffffu) > 0x7f800000u ? 0x0040u : 0u));
    return (cai_bf16)cai_round_sr_(x >> 16, x & 0xffffu, 16, rnd);
}

static inline float cai_f16_to_f32(cai_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return cai_bits_f32(sign | 0x7f800000u | (m << 13)); /* Inf / NaN (payload kept) */
    if (e == 0) {
        if (m == 0) return cai_bits_f32(sign);
        /* subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return cai_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* The f16 encoder behind both rounding modes (stochastic when `stochastic`). */
static inline cai_f16 cai_f32_to_f16_mode_(float f, int stochastic, uint32_t rnd) {
    uint32_t x = cai_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return (cai_f16)(sign | 0x7c00u);
        return (cai_f16)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* quiet NaN */
    }
    int e = (int)(ax >> 23) - 127 + 15; /* f16 biased exponent */
    if (e >= 31) return (cai_f16)(sign | 0x7c00u);
    uint32_t mant, dropped;
    int shift;
    if (e >= 1) {
        shift = 13;
        mant = ((uint32_t)e << 10) | ((ax & 0x7fffffu) >> 13);
        dropped = ax & 0x1fffu;
    } else {
        /* f16 subnormal: units of 2^-24; a carry into bit 10 yields the smallest normal. */
        uint32_t full = (ax & 0x7fffffu) | (ax >= 0x00800000u ? 0x800000u : 0u);
        shift = 14 - e - (ax < 0x00800000u); /* f32 subnormals have exponent 1, not 0 */
        if (shift >= 32) {
            mant = 0;
            dropped = full;
            shift = 32;
        } else {
            mant = full >> shift;
            dropped = full & ((1u << shift) - 1u);
        }
        if (shift >= 32 && !stochastic) return (cai_f16)sign; /* < 2^-32: far below half a unit */
    }
    uint32_t r = stochastic ? cai_round_sr_(mant, dropped, shift, rnd) : cai_round_rne_(mant, dropped, shift);
    return (cai_f16)(sign | r);
}

/* f32 -> f16, round to nearest even. */
static inline cai_f16 cai_f32_to_f16(float f) { return cai_f32_to_f16_mode_(f, 0, 0); }
/* f32 -> f16, stochastic: `rnd` supplies uniform random bits (all 32 may be used
 * for values in the subnormal range). */
static inline cai_f16 cai_f32_to_f16_sr(float f, uint32_t rnd) { return cai_f32_to_f16_mode_(f, 1, rnd); }

/* ------------------------------------------------------------------ FP8
 * The two OCP 8-bit float formats Hopper's tensor cores multiply (docs/fp8.md):
 * E4M3 (bias 7, no infinities, NaN S.1111.111, largest 448, smallest
 * subnormal 2^-9) and E5M2 (bias 15, IEEE-like with infinities and NaNs,
 * largest 57344, smallest subnormal 2^-16). Encoding rounds to nearest even
 * and saturates: any finite value or infinity beyond the largest magnitude
 * becomes +-largest (NVIDIA's __NV_SATFINITE); a NaN becomes the format's
 * NaN S.1111111 with its sign. Every float value of a code converts to f32
 * exactly. */
typedef enum { CAI_FP8_E4M3 = 0, CAI_FP8_E5M2, CAI_FP8_FORMAT_COUNT } cai_fp8_format;

/* 448 (E4M3) or 57344 (E5M2). */
static inline float cai_fp8_max(cai_fp8_format f) { return f == CAI_FP8_E5M2 ? 57344.0f : 448.0f; }
static inline int cai_fp8_mbits_(cai_fp8_format f) { return f == CAI_FP8_E5M2 ? 2 : 3; }
static inline int cai_fp8_bias_(cai_fp8_format f) { return f == CAI_FP8_E5M2 ? 15 : 7; }

static inline uint8_t cai_f32_to_fp8(float x, cai_fp8_format f) {
    uint32_t u = cai_f32_bits(x), sign = (u >> 24) & 0x80u, ax = u & 0x7fffffffu;
    const uint32_t max_code = f == CAI_FP8_E5M2 ? 0x7bu : 0x7eu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
    if (ax == 0x7f800000u) return (uint8_t)(sign | max_code);
    const int mb = cai_fp8_mbits_(f), e = (int)(ax >> 23) - 127 + cai_fp8_bias_(f);
    uint32_t mant, dropped;
    int shift;
    if (e >= 1) {
        if (e > 31) return (uint8_t)(sign | max_code);
        shift = 23 - mb;
        mant = ((uint32_t)e << mb) | ((ax & 0x7fffffu) >> shift);
        dropped = ax & ((1u << shift) - 1u);
    } else {
        /* subnormal: units of 2^(1 - bias - mb); a carry gives the smallest normal */
        uint32_t full = (ax & 0x7fffffu) | (ax >= 0x00800000u ? 0x800000u : 0u);
        shift = 24 - mb - e;
        if (shift > 31) return (uint8_t)sign; /* below half the smallest subnormal */
        mant = full >> shift;
        dropped = full & ((1u << shift) - 1u);
    }
    uint32_t r = cai_round_rne_(mant, dropped, shift);
    return (uint8_t)(sign | (r > max_code ? max_code : r));
}

static inline float cai_fp8_to_f32(uint8_t b, cai_fp8_format f) {
    const int mb = cai_fp8_mbits_(f), bias = cai_fp8_bias_(f);
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24, mag = b & 0x7fu;
    const uint32_t e = mag >> mb, m = mag & ((1u << mb) - 1u);
    if (f == CAI_FP8_E4M3 ? mag == 0x7fu : e == 0x1fu) {
        if (f == CAI_FP8_E5M2 && m == 0) return cai_bits_f32(sign | 0x7f800000u);
        return cai_bits_f32(sign | 0x7fc00000u);
    }
    if (e == 0) { /* m * 2^(1 - bias - mb), exact */
        float v = (float)m * cai_bits_f32((uint32_t)(127 + 1 - bias - mb) << 23);
        return sign ? -v : v;
    }
    return cai_bits_f32(sign | ((e - (uint32_t)bias + 127u) << 23) | (m << (23 - mb)));
}

/* Per-tensor scaling (Transformer Engine's recipes): a tensor x is stored as
 * fp8(x * scale) and multiplied back by 1 / scale after the product.
 * scale = fp8_max / amax / 2^margin: the largest magnitude lands 2^margin
 * below the format's largest value. */
typedef enum {
    CAI_FP8_DELAYED = 0, /* scale from the amax history of earlier steps (one pass over the tensor) */
    CAI_FP8_CURRENT,     /* scale from the tensor's own amax at each cast (an extra pass) */
    CAI_FP8_RECIPE_COUNT
} cai_fp8_recipe_kind;
typedef enum {
    CAI_FP8_AMAX_MAX = 0,     /* the largest amax in the history */
    CAI_FP8_AMAX_MOST_RECENT, /* the last step's amax */
    CAI_FP8_AMAX_ALGO_COUNT
} cai_fp8_amax_algo;

/* The scaling state of one tensor ("meta"), F32 [CAI_FP8_META_LEN(H)]:
 * [0] 1/scale, [1] scale, [2 ...] the amax history, newest first; slot 2 is
 * the running maximum of the step in progress. scale 0 means no scale yet:
 * the next cast scales from the tensor's own amax (the first step of a
 * delayed recipe). 1/scale comes first because cuBLASLt reads it through a
 * scale pointer that must be 16-byte aligned (a meta that starts at a
 * multiple of 16 bytes, as CAI_FP8_META_STRIDE keeps them). */
#define CAI_FP8_META_LEN(h) (2 + (h))
/* Floats between consecutive metas in one buffer: a multiple of 4. */
#define CAI_FP8_META_STRIDE(h) ((CAI_FP8_META_LEN(h) + 3) / 4 * 4)
#define CAI_FP8_META_SCALE_INV 0
#define CAI_FP8_META_SCALE 1
#define CAI_FP8_META_AMAX 2

/* fp8_max / amax / 2^margin; prev when amax is 0, not finite, or the
 * quotient is not a positive finite number. Pure. */
float cai_fp8_scale_from_amax(float amax, cai_fp8_format f, int margin, float prev);
/* End of a step for meta [CAI_FP8_META_LEN(history)] (the running maximum
 * complete, e.g. reduced over ranks): the new scale from the history (algo)
 * with cai_fp8_scale_from_amax, its inverse, then the history shifts one
 * slot older and the newest slot restarts at 0. Pure. */
void cai_fp8_meta_update(float *meta, int history, cai_fp8_format f, cai_fp8_amax_algo algo, int margin);
/* Host cast of n values: q[i] = fp8(x[i] * scale); returns max |x[i]| over the
 * non-NaN values (a NaN gives NaN). Pure. */
float cai_fp8_quantize_host(uint8_t *q, const float *x, size_t n, float scale, cai_fp8_format f);
const char *cai_fp8_format_name(cai_fp8_format f); /* "e4m3", "e5m2" */

/* Host-memory buffer conversion between F32, BF16 and F16 (any pair, including
 * same-type copies), round to nearest even. Used by checkpoint import/export
 * and by the CPU backend's copy op. Buffers must not overlap. */
cai_status cai_convert_host(void *dst, cai_dtype dst_dtype, const void *src, cai_dtype src_dtype, size_t n);
/* Stochastic rounding of f32 host data to BF16 or F16 (F32 -> F32 copies).
 * The random bits of element i depend only on (seed, stream, index_offset + i)
 * (word g % 4 of Philox-4x32 block g / 4, g = index_offset + i), so the result
 * does not depend on how a buffer is split across ranks or threads: pass the
 * global index of the first element. */
uint32_t cai_sr_bits(uint64_t seed, uint64_t stream, uint64_t g);
cai_status cai_convert_host_sr(void *dst, cai_dtype dst_dtype, const float *src, size_t n, uint64_t seed,
                               uint64_t stream, uint64_t index_offset);

/* ------------------------------------------------------------------ devices */

typedef enum { CAI_DEVICE_HOST = 0, CAI_DEVICE_CUDA = 1 } cai_device_kind;

typedef enum { CAI_COPY_H2H = 0, CAI_COPY_H2D, CAI_COPY_D2H, CAI_COPY_D2D } cai_copy_kind;

struct cai_ops;

/* Public so model code can write dev->ops->matmul(dev, ...); treat the fields
 * as read-only. Create with cai_device_init, release with cai_device_free. */
typedef struct cai_device {
    cai_device_kind kind;
    int ordinal;               /* CUDA device index; 0 for the host */
    int num_threads;           /* host: threads every op (and BLAS) uses; >= 1 */
    const struct cai_ops *ops; /* this backend's op table, never NULL */
    void *impl;                /* backend-private state (CUDA stream, cuBLASLt handle) */
    char name[64];             /* e.g. "host (2 threads, OpenBLAS 0.3.21)" */
    /* Allocations made for this device so far (read with
     * cai_device_alloc_count): updated atomically by the allocators. */
    uint64_t n_allocs;
    uint64_t alloc_bytes;
} cai_device_t;

/* Create a device. Host: `num_threads` <= 0 means the OpenMP default
 * (OMP_NUM_THREADS or the core count); it also sets OpenBLAS's thread count.
 * CUDA: `ordinal` picks the GPU; fails with CAI_ERR_UNSUPPORTED in builds
 * without CUDA. Not collective. */
cai_status cai_device_init(cai_device_t **out, cai_device_kind kind, int ordinal, int num_threads);
void cai_device_free(cai_device_t *dev);
const char *cai_device_kind_name(cai_device_kind kind);

/* Device memory, 64-byte aligned (256 on CUDA). Zero bytes gives NULL. */
cai_status cai_device_alloc(cai_device_t *dev, size_t bytes, const char *what, void **out);
void cai_device_dealloc(cai_device_t *dev, void *ptr);
/* Host memory suited for staging transfers to/from this device (pinned on
 * CUDA, plain aligned memory on the host device). */
cai_status cai_device_alloc_staging(cai_device_t *dev, size_t bytes, const char *what, void **out);
void cai_device_dealloc_staging(cai_device_t *dev, void *ptr);
/* Ordered with the device's ops; the host device copies synchronously. */
cai_status cai_device_copy(cai_device_t *dev, void *dst, const void *src, size_t bytes, cai_copy_kind kind);
/* Wait until every op issued on the device has finished (no-op on the host). */
cai_status cai_device_sync(cai_device_t *dev);
/* The CUDA stream (a cudaStream_t) every op of a CUDA device runs on, in
 * order; NULL for the host device. Hand it to cai_mesh_set_cuda_stream so
 * device collectives wait for the kernels that produce their inputs without
 * a device synchronisation. Not collective. */
void *cai_device_stream(const cai_device_t *dev);

/* How many memory allocations this device has made since cai_device_init
 * (*bytes, may be NULL: their total size; frees do not subtract). Counts
 * every cai_device_alloc, cai_device_alloc_staging and arena of non-zero
 * size, on the host as on CUDA, and on CUDA also the backend's own buffers
 * made at init (cuBLASLt workspace, scratch, error record): every
 * cudaMalloc / cudaHostAlloc of the backend. The check behind "no device
 * allocation after the first training step" (tests/gpu/test_gpu_train.c).
 * Thread-safe; not collective. */
uint64_t cai_device_alloc_count(const cai_device_t *dev, uint64_t *bytes);
/* Free and total memory of the device in bytes (CUDA: cudaMemGetInfo, which
 * sees every allocation on the GPU, also those made outside colossal, e.g.
 * by NCCL; host: available and total physical memory). */
cai_status cai_device_mem_info(cai_device_t *dev, size_t *free_bytes, size_t *total_bytes);

/* An arena whose memory is one device allocation: carve activations,
 * parameters and workspaces out of it with cai_arena_alloc / cai_tensor_arena.
 * Release with cai_device_arena_free. */
cai_status cai_device_arena_init(cai_device_t *dev, cai_arena_t *arena, size_t capacity, const char *name);
void cai_device_arena_free(cai_device_t *dev, cai_arena_t *arena);

/* ------------------------------------------------------------------ tensors */

#define CAI_TENSOR_MAX_DIMS 6

typedef struct cai_tensor {
    void *data;           /* address of element [0,...,0]; NULL only for empty tensors */
    cai_device_t *device; /* where `data` lives; NULL means host memory */
    cai_dtype dtype;
    int ndim; /* 0 (scalar) .. CAI_TENSOR_MAX_DIMS */
    int64_t shape[CAI_TENSOR_MAX_DIMS];
    int64_t stride[CAI_TENSOR_MAX_DIMS]; /* in elements, >= 0 */
    int owns_data;                       /* set by cai_tensor_alloc only */
} cai_tensor;

/* Contiguous view over `data`. Fails for ndim out of range or negative sizes. */
cai_status cai_tensor_init(cai_tensor *t, cai_device_t *dev, void *data, cai_dtype dtype, int ndim,
                           const int64_t *shape);
/* Allocate device memory for a contiguous tensor (zero-filled) that
 * cai_tensor_free releases. For hot paths prefer views into an arena. */
cai_status cai_tensor_alloc(cai_tensor *t, cai_device_t *dev, cai_dtype dtype, int ndim, const int64_t *shape,
                            const char *what);
/* Contiguous tensor carved from a device arena (not zeroed); freed with the arena. */
cai_status cai_tensor_arena(cai_tensor *t, cai_arena_t *arena, cai_device_t *dev, cai_dtype dtype, int ndim,
                            const int64_t *shape);
/* Releases memory from cai_tensor_alloc; a no-op for views. Resets *t. */
void cai_tensor_free(cai_tensor *t);

/* Infallible contiguous views for the common ranks. */
cai_tensor cai_tensor_1d(cai_device_t *dev, void *data, cai_dtype dtype, int64_t d0);
cai_tensor cai_tensor_2d(cai_device_t *dev, void *data, cai_dtype dtype, int64_t d0, int64_t d1);
cai_tensor cai_tensor_3d(cai_device_t *dev, void *data, cai_dtype dtype, int64_t d0, int64_t d1, int64_t d2);
cai_tensor cai_tensor_4d(cai_device_t *dev, void *data, cai_dtype dtype, int64_t d0, int64_t d1, int64_t d2,
                         int64_t d3);

int64_t cai_tensor_numel(const cai_tensor *t);
/* numel * element size (the bytes the elements occupy when contiguous). */
size_t cai_tensor_nbytes(const cai_tensor *t);
int cai_tensor_is_contiguous(const cai_tensor *t);
int cai_tensor_same_shape(const cai_tensor *a, const cai_tensor *b);
/* "f32[4,7,13]" plus ", strides [..]" when not contiguous; for error messages. */
const char *cai_tensor_describe(const cai_tensor *t, char *buf, size_t len);

/* View of elements [start, start+len) along `dim` (negative dims count from
 * the end). Shares memory; the result is generally not contiguous. */
cai_status cai_tensor_narrow(const cai_tensor *t, int dim, int64_t start, int64_t len, cai_tensor *out);
/* Split dimension `dim` of size n into [n / inner, inner] (always possible
 * for any strides), e.g. [B,T,C] -> [B,T,H,D] with inner = D. */
cai_status cai_tensor_unflatten(const cai_tensor *t, int dim, int64_t inner, cai_tensor *out);
/* New shape over the same elements; requires a contiguous tensor. One entry
 * may be -1 (inferred). */
cai_status cai_tensor_reshape(const cai_tensor *t, int ndim, const int64_t *shape, cai_tensor *out);
/* Swap two dimensions (a strided view; copy it to make it contiguous). */
cai_status cai_tensor_transpose(const cai_tensor *t, int dim0, int dim1, cai_tensor *out);
/* Rows [start, start+len) of dimension 0 (contiguous if t is). */
cai_status cai_tensor_slice0(const cai_tensor *t, int64_t start, int64_t len, cai_tensor *out);

#ifdef __cplusplus
}
#endif
#endif
