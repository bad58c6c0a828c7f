/* What the CPU emulations of the CUDA kernels (tests/gpu/*_emu.cpp) share:
 * the CUDA keywords as no-ops and the thread/block coordinates as
 * thread-locals that the emulated launch sets for each emulated thread
 * (one std::thread per CUDA thread of a block, so barriers and shuffles
 * can be emulated with real synchronisation). */
#ifndef CAI_TESTS_GPU_EMU_CUDA_H
#define CAI_TESTS_GPU_EMU_CUDA_H

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

#endif
