/* Device helpers shared by the kernels: dtype loads and stores (f32 compute,
 * bf16/f16 storage rounded exactly as the host's cai_f32_to_bf16/_f16, so
 * both backends produce the same bits), Philox for stochastic rounding,
 * block reductions with a fixed combination order (deterministic), grid
 * helpers and the device-side error record. */
#ifndef CAI_CUDA_COMMON_CUH
#define CAI_CUDA_COMMON_CUH

#include "cuda_kernels.h"

#include <math.h>
#include <stdint.h>

#define CUK_INLINE __device__ __forceinline__

/* Regions of kernel source that the CPU emulators (the _emu.sh scripts in
 * tests/gpu) cut out and compile on the host:
 *   CUK_EMU_BEGIN(name); ... CUK_EMU_END(name);
 * each name once in a translation unit. They are code, not comments: an END
 * without its BEGIN, or a name used twice, fails to compile (here and in the
 * emulator), and emu_extract.py refuses a BEGIN without its END. */
#define CUK_EMU_BEGIN(name) enum { cuk_emu_begin_##name = 1 }
#define CUK_EMU_END(name) static_assert(cuk_emu_begin_##name == 1, "CUK_EMU_END(" #name ") after its BEGIN")

/* ---------------------------------------------------------------- number formats */
CUK_EMU_BEGIN(cuk_formats);

CUK_INLINE float cuk_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

CUK_INLINE uint32_t cuk_rne(uint32_t mant, uint32_t dropped, int shift) {
    uint32_t half = 1u << (shift - 1);
    return mant + (dropped > half || (dropped == half && (mant & 1u)));
}

CUK_INLINE uint32_t cuk_sr(uint32_t mant, uint32_t dropped, int shift, uint32_t rnd) {
    uint32_t mask = shift >= 32 ? 0xffffffffu : (1u << shift) - 1u;
    return mant + ((rnd & mask) < dropped);
}

CUK_INLINE uint16_t cuk_f32_to_bf16(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)cuk_rne(x >> 16, x & 0xffffu, 16);
}

CUK_INLINE uint16_t cuk_f32_to_bf16_sr(float f, uint32_t rnd) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) >= 0x7f800000u)
        return (uint16_t)((x >> 16) | ((x & 0x7fffffffu) > 0x7f800000u ? 0x0040u : 0u));
    return (uint16_t)cuk_sr(x >> 16, x & 0xffffu, 16, rnd);
}

CUK_INLINE float cuk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return __uint_as_float(sign);
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

/* Mirror of cai_f32_to_f16_mode_ (colossal/tensor.h), bit for bit. */
CUK_INLINE uint16_t cuk_f32_to_f16_mode(float f, int stochastic, uint32_t rnd) {
    uint32_t x = __float_as_uint(f);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    int e = (int)(ax >> 23) - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    uint32_t mant, dropped;
    int shift;
    if (e >= 1) {
        shift = 13;
        mant = ((uint32_t)e << 10) | ((ax & 0x7fffffu) >> 13);
        dropped = ax & 0x1fffu;
    } else {
        uint32_t full = (ax & 0x7fffffu) | (ax >= 0x00800000u ? 0x800000u : 0u);
        shift = 14 - e - (ax < 0x00800000u);
        if (shift >= 32) {
            mant = 0;
            dropped = full;
            shift = 32;
        } else {
            mant = full >> shift;
            dropped = full & ((1u << shift) - 1u);
        }
        if (shift >= 32 && !stochastic) return (uint16_t)sign;
    }
    uint32_t r = stochastic ? cuk_sr(mant, dropped, shift, rnd) : cuk_rne(mant, dropped, shift);
    return (uint16_t)(sign | r);
}

CUK_INLINE float ldf(const void *p, int dt, int64_t i) {
    if (dt == CUK_F32) return ((const float *)p)[i];
    if (dt == CUK_BF16) return cuk_bf16_to_f32(((const uint16_t *)p)[i]);
    return cuk_f16_to_f32(((const uint16_t *)p)[i]);
}

CUK_INLINE void stf(void *p, int dt, int64_t i, float v) {
    if (dt == CUK_F32) ((float *)p)[i] = v;
    else if (dt == CUK_BF16) ((uint16_t *)p)[i] = cuk_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = cuk_f32_to_f16_mode(v, 0, 0);
}

CUK_EMU_END(cuk_formats);

/* ---------------------------------------------------------------- Philox-4x32-10 (as src/base/rng.c) */

CUK_INLINE uint32_t cuk_sr_bits(uint64_t key, uint64_t counter_hi, uint64_t g) {
    uint64_t counter_lo = g >> 2;
    uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
    uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
#pragma unroll
    for (int round = 0; round < 10; round++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    uint32_t w = (uint32_t)(g & 3);
    return w == 0 ? c0 : w == 1 ? c1 : w == 2 ? c2 : c3;
}

/* ---------------------------------------------------------------- reductions */

struct cuk_add_op {
    template <typename T> __device__ __forceinline__ T operator()(T x, T y) const { return x + y; }
};
struct cuk_max_op {
    __device__ __forceinline__ float operator()(float x, float y) const { return fmaxf(x, y); }
};

template <typename T, typename Op> CUK_INLINE T warp_reduce(T v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide reduction (blockDim.x a multiple of 32, <= 1024); every thread
 * gets the result. `sh` holds 32 values. The order of combination depends
 * only on blockDim, so results are reproducible. */
template <typename T, typename Op> CUK_INLINE T block_reduce(T v, T *sh, T identity, Op op) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : identity;
    return warp_reduce(v, op);
}

CUK_INLINE float warp_sum(float v) { return warp_reduce(v, cuk_add_op()); }

/* Programmatic dependent launch (sm_90): a kernel launched with the
 * attribute may start before its predecessor ends, and must wait
 * (cuk_pdl_wait: the predecessor complete, its writes visible) before it
 * reads what the predecessor writes; a predecessor lets it start early with
 * cuk_pdl_trigger (else at its own end). Both are no-ops otherwise. */
CUK_INLINE void cuk_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
CUK_INLINE void cuk_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
CUK_INLINE float warp_max(float v) { return warp_reduce(v, cuk_max_op()); }
CUK_INLINE float block_sum(float v, float *sh) { return block_reduce(v, sh, 0.0f, cuk_add_op()); }
CUK_INLINE float block_max(float v, float *sh) { return block_reduce(v, sh, -INFINITY, cuk_max_op()); }
CUK_INLINE double block_sum_d(double v, double *sh) { return block_reduce(v, sh, 0.0, cuk_add_op()); }

/* ---------------------------------------------------------------- errors */

CUK_INLINE void cuk_report(cuk_errrec *e, int code, int64_t a, int64_t b, int64_t c, int64_t d) {
    if (!e) return;
    if (atomicCAS(&e->code, 0, code) == 0) {
        e->a = a;
        e->b = b;
        e->c = c;
        e->d = d;
        __threadfence_system();
    }
}

/* ---------------------------------------------------------------- attention */

CUK_INLINE int64_t cuk_roff(const cuk_bthd &t, int64_t b, int64_t s, int64_t h) {
    return b * t.sb + s * t.st + h * t.sh;
}

/* Query row i may see key row j (docs/ops.md: causal offset and window). */
CUK_INLINE bool cuk_visible(const cuk_attn &a, int64_t i, int64_t j) {
    if (!a.causal) return true;
    int64_t lim = i + a.off;
    if (j > lim) return false;
    if (a.window > 0 && j < lim - a.window + 1) return false;
    return true;
}

/* Keys [*jlo, *jhi] that query rows [i0, ilast] may see, for a block's loop. */
CUK_INLINE void cuk_key_span(const cuk_attn &a, int64_t i0, int64_t ilast, int64_t Tk, int64_t *jlo, int64_t *jhi) {
    *jlo = 0;
    *jhi = Tk - 1;
    if (a.causal) {
        if (ilast + a.off < *jhi) *jhi = ilast + a.off;
        if (a.window > 0 && i0 + a.off - a.window + 1 > *jlo) *jlo = i0 + a.off - a.window + 1;
    }
}

/* Query rows [*ilo, *ihi] that may see keys [j0, jlast]. */
CUK_INLINE void cuk_query_span(const cuk_attn &a, int64_t j0, int64_t jlast, int64_t Tq, int64_t *ilo, int64_t *ihi) {
    *ilo = 0;
    *ihi = Tq - 1;
    if (a.causal) {
        if (j0 - a.off > *ilo) *ilo = j0 - a.off;
        if (a.window > 0 && jlast - a.off + a.window - 1 < *ihi) *ihi = jlast - a.off + a.window - 1;
    }
}

/* Raise the dynamic shared-memory limits of a family of three kernels
 * (forward, dK/dV, dQ) above the default 48 KB. */
template <class A, class B, class C>
static cudaError_t cuk_smem_limits(A *ka, size_t sa, B *kb, size_t sb, C *kc, size_t sc) {
    const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
    cudaError_t e = cudaFuncSetAttribute(ka, at, (int)sa);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(kb, at, (int)sb);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(kc, at, (int)sc);
    return e;
}

/* Setup() once per device (the current one): function attributes such as
 * a kernel's shared-memory limit are set per device. Idempotent: a race
 * only repeats it. */
template <cudaError_t (*Setup)(void)> static cudaError_t cuk_once_per_device(void) {
    enum { MAXDEV = 256 };
    static volatile int ready[MAXDEV];
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < MAXDEV && ready[dev]) return cudaSuccess;
    e = Setup();
    if (e == cudaSuccess && dev >= 0 && dev < MAXDEV) ready[dev] = 1;
    return e;
}

/* kern<<<grid, block, smem, s>>>(args...), with the programmatic-launch
 * attribute (cuk_pdl_wait) when pdl. */
template <class... P, class... A>
static cudaError_t cuk_launch(cudaStream_t s, int pdl, void (*kern)(P...), dim3 grid, unsigned block, size_t smem,
                              A... args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = grid;
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    if (pdl) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, kern, args...);
}

/* ---------------------------------------------------------------- grids */

/* Rows on grid.y (grid-stride beyond 65535), columns on grid.x. */
static inline dim3 cuk_rows_grid(int64_t rows, int64_t cols, int threads) {
    int64_t gx = (cols + threads - 1) / threads, gy = rows;
    if (gx > 4096) gx = 4096;
    if (gx < 1) gx = 1;
    if (gy > 65535) gy = 65535;
    if (gy < 1) gy = 1;
    return dim3((unsigned)gx, (unsigned)gy, 1);
}

#define CUK_FOR_RC(rows_, cols_)                                                      \
    for (int64_t r = blockIdx.y; r < (rows_); r += gridDim.y)                         \
        for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < (cols_); \
             c += (int64_t)gridDim.x * blockDim.x)

static inline int64_t cuk_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---------------------------------------------------------------- 16-byte vector access (fast paths) */

/* Chunks of 8 consecutive elements (16 bytes of bf16/f16, two 16-byte
 * accesses of f32) with the dtype a template parameter, so the hot loops
 * have no per-element dtype switch. The element index must make the address
 * 16-byte aligned (callers check with cuk_vec_ok). Conversions are the
 * scalar helpers above, so the bits are the same as the general paths'. */
CUK_EMU_BEGIN(cuk_vec);
template <int DT> CUK_INLINE float cuk_ld1(const void *p, int64_t i) {
    if (DT == CUK_F32) return ((const float *)p)[i];
    if (DT == CUK_BF16) return cuk_bf16_to_f32(((const uint16_t *)p)[i]);
    return cuk_f16_to_f32(((const uint16_t *)p)[i]);
}

template <int DT> CUK_INLINE void cuk_st1(void *p, int64_t i, float v) {
    if (DT == CUK_F32) ((float *)p)[i] = v;
    else if (DT == CUK_BF16) ((uint16_t *)p)[i] = cuk_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = cuk_f32_to_f16_mode(v, 0, 0);
}

/* v as stored in a 16-bit tensor of dtype DT and read back */
template <int DT> CUK_INLINE float cuk_round(float v) {
    return DT == CUK_BF16 ? cuk_bf16_to_f32(cuk_f32_to_bf16(v)) : cuk_f16_to_f32(cuk_f32_to_f16_mode(v, 0, 0));
}

/* Eight 16-bit values (bf16 or f16, DT) held in 16 bytes, widened. */
template <int DT> CUK_INLINE void cuk_unpack8(const uint4 &u, float *v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint16_t lo = (uint16_t)(w[k] & 0xffffu), hi = (uint16_t)(w[k] >> 16);
        v[2 * k] = DT == CUK_BF16 ? cuk_bf16_to_f32(lo) : cuk_f16_to_f32(lo);
        v[2 * k + 1] = DT == CUK_BF16 ? cuk_bf16_to_f32(hi) : cuk_f16_to_f32(hi);
    }
}

template <int DT> CUK_INLINE void cuk_ld8(const void *p, int64_t i, float *v) {
    if (DT == CUK_F32) {
        const float4 *q = (const float4 *)((const float *)p + i);
        float4 a = q[0], b = q[1];
        v[0] = a.x;
        v[1] = a.y;
        v[2] = a.z;
        v[3] = a.w;
        v[4] = b.x;
        v[5] = b.y;
        v[6] = b.z;
        v[7] = b.w;
    } else {
        cuk_unpack8<DT>(*(const uint4 *)((const uint16_t *)p + i), v);
    }
}

template <int DT> CUK_INLINE void cuk_st8(void *p, int64_t i, const float *v) {
    if (DT == CUK_F32) {
        float4 *q = (float4 *)((float *)p + i);
        q[0] = make_float4(v[0], v[1], v[2], v[3]);
        q[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = DT == CUK_BF16 ? cuk_f32_to_bf16(v[2 * k]) : cuk_f32_to_f16_mode(v[2 * k], 0, 0);
            uint32_t hi = DT == CUK_BF16 ? cuk_f32_to_bf16(v[2 * k + 1]) : cuk_f32_to_f16_mode(v[2 * k + 1], 0, 0);
            w[k] = lo | (hi << 16);
        }
        *(uint4 *)((uint16_t *)p + i) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

/* Up to 8 elements [i, i + n): the whole chunk by vector when n == 8, else element by element. */
template <int DT> CUK_INLINE void cuk_ld8_tail(const void *p, int64_t i, int n, float *v) {
    if (n >= 8) {
        cuk_ld8<DT>(p, i, v);
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = k < n ? cuk_ld1<DT>(p, i + k) : 0.0f;
}

template <int DT> CUK_INLINE void cuk_st8_tail(void *p, int64_t i, int n, const float *v) {
    if (n >= 8) {
        cuk_st8<DT>(p, i, v);
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < n) cuk_st1<DT>(p, i + k, v[k]);
}

CUK_EMU_END(cuk_vec);

static inline int cuk_dt_size(int dt) { return dt == CUK_F32 || dt == CUK_I32 ? 4 : dt == CUK_F64 ? 8 : 2; }

/* A row view every 8-element chunk of which starts 16-byte aligned. */
static inline bool cuk_vec_ok(const cuk_mat &m) {
    const int64_t es = cuk_dt_size(m.dt);
    return ((uintptr_t)m.p & 15u) == 0 && (m.rows <= 1 || ((m.ld * es) & 15) == 0);
}

static inline bool cuk_ptr16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* What the few-row products (gemv.cu, dgemm.cu) need besides their row
 * count: x, W, y (and r) of one 16-bit dtype, K and the row strides of x
 * and W multiples of 8, x and W 16-byte aligned. */
static inline bool cuk_few_rows_layout(cuk_mat y, cuk_mat x, cuk_mat w, cuk_mat r) {
    if (w.rows < 1 || w.cols < 8 || (w.dt != CUK_BF16 && w.dt != CUK_F16)) return false;
    if (x.dt != w.dt || y.dt != w.dt || (r.p && r.dt != w.dt)) return false;
    return w.cols % 8 == 0 && w.ld % 8 == 0 && x.ld % 8 == 0 && cuk_ptr16(w.p) && cuk_ptr16(x.p);
}
/* A SwiGLU pair's weights laid out alike, y one column a feature. */
static inline bool cuk_pair_layout(cuk_mat y, cuk_mat wg, cuk_mat wu) {
    return wu.rows == wg.rows && wu.cols == wg.cols && y.cols == wg.rows;
}

/* Number of SMs of the current device (cached per ordinal): grids of the
 * fast paths are a few waves of resident blocks, walked grid-stride. */
static inline int cuk_sm_count(void) {
    static int cache[64];
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 132;
    if (dev >= 0 && dev < 64 && cache[dev] > 0) return cache[dev];
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    if (dev >= 0 && dev < 64) cache[dev] = n;
    return n;
}

#endif
