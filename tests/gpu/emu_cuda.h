/* What the CPU emulations of the CUDA kernels (tests/gpu/*_emu.cpp) share:
 * the CUDA keywords as no-ops and the thread/block coordinates as
 * thread-locals that the emulated launch sets for each emulated thread
 * (one std::thread per CUDA thread of a block, so barriers and shuffles
 * can be emulated with real synchronisation). */
#ifndef CAI_TESTS_GPU_EMU_CUDA_H
#define CAI_TESTS_GPU_EMU_CUDA_H

#include <cstdint>
#include <cstring>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
thread_local unsigned char *g_smem; /* the emulated block's dynamic shared memory */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x)
#define CUK_INLINE static inline
/* The region markers of kernels/cuda_common.cuh, kept by the extraction */
#define CUK_EMU_BEGIN(name) enum { cuk_emu_begin_##name = 1 }
#define CUK_EMU_END(name) static_assert(cuk_emu_begin_##name == 1, "CUK_EMU_END(" #name ") after its BEGIN")

/* CUDA's vector types and bit casts that the kernels use */
struct uint2 {
    uint32_t x, y;
};
struct uint4 {
    uint32_t x, y, z, w;
};
static inline uint2 make_uint2(uint32_t a, uint32_t b) { return uint2{a, b}; }
struct float4 {
    float x, y, z, w;
};
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#endif
