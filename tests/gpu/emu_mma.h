/* The warp machinery of the tensor-core emulations (flash_emu.cpp,
 * paged_emu.cpp; gemv_emu.cpp uses the block and the shuffles): a block of
 * 4 warps (up to 8: Block(threads)), __syncthreads, shfl.xor, and the
 * wrappers of kernels/mma.cuh (cp.async as a synchronous copy, so a
 * missing wait is NOT caught; ldmatrix with and without .trans;
 * mma.m16n8k16 on bf16) implemented from the PTX ISA's fragment layouts,
 * independently of the kernels' helpers; bf16 only (f2bf rounds to
 * nearest even, as the GPU does). */
#ifndef CAI_TESTS_GPU_EMU_MMA_H
#define CAI_TESTS_GPU_EMU_MMA_H

#include "emu_cuda.h"

typedef uint16_t e16;
static inline float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static inline uint16_t f2bf(float f) {
    const uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x40;
    uint32_t r = x >> 16, d = x & 0xffff;
    if (d > 0x8000 || (d == 0x8000 && (r & 1))) r++;
    return (uint16_t)r;
}

// ---- block / warp machinery
struct Warp {
    emu::Barrier bar{32, true};
    uint64_t slot[32][12];
};
struct Block {
    emu::Barrier bar;
    Warp w[8];
    explicit Block(int threads = 128) : bar(threads) {}
};
Block *g_blk;
static inline void __syncthreads() { g_blk->bar.arrive_and_wait(); }
static inline int lane_() { return threadIdx.x & 31; }
static inline Warp &warp_() { return g_blk->w[threadIdx.x >> 5]; }
static inline float __shfl_xor_sync(unsigned, float v, int m) {
    Warp &w = warp_();
    int l = lane_();
    memcpy(&w.slot[l][0], &v, 4);
    w.bar.arrive_and_wait();
    float r;
    memcpy(&r, &w.slot[l ^ m][0], 4);
    w.bar.arrive_and_wait();
    return r;
}
static inline int __all_sync(unsigned, int pred) {
    Warp &w = warp_();
    w.slot[lane_()][0] = pred != 0;
    w.bar.arrive_and_wait();
    int all = 1;
    for (int i = 0; i < 32; i++) all &= (int)w.slot[i][0];
    w.bar.arrive_and_wait();
    return all;
}
static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    return v;
}
static inline void mma_cp16(void *dst, const void *src) { memcpy(dst, src, 16); }
static inline void mma_commit() {}
template <int N> static inline void mma_wait() {}
static inline void ldsm_(uint32_t (&r)[4], const e16 *p, bool trans) {
    Warp &w = warp_();
    int l = lane_();
    w.slot[l][0] = (uint64_t)(uintptr_t)p;
    w.bar.arrive_and_wait();
    for (int m = 0; m < 4; m++) {
        uint16_t v[2];
        for (int q = 0; q < 2; q++) {
            const e16 *row;
            int col;
            if (!trans) {
                row = (const e16 *)(uintptr_t)w.slot[8 * m + l / 4][0];
                col = 2 * (l % 4) + q;
            } else {
                row = (const e16 *)(uintptr_t)w.slot[8 * m + 2 * (l % 4) + q][0];
                col = l / 4;
            }
            v[q] = row[col];
        }
        r[m] = v[0] | ((uint32_t)v[1] << 16);
    }
    w.bar.arrive_and_wait();
}
static inline void mma_ldsm(uint32_t (&r)[4], const e16 *p) { ldsm_(r, p, false); }
static inline void mma_ldsm_t(uint32_t (&r)[4], const e16 *p) { ldsm_(r, p, true); }
template <bool F16> static inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    Warp &w = warp_();
    int l = lane_();
    for (int i = 0; i < 4; i++) w.slot[l][i] = a[i];
    w.slot[l][4] = b0;
    w.slot[l][5] = b1;
    w.bar.arrive_and_wait();
    float A[16][16], B[16][8];
    for (int t = 0; t < 32; t++) {
        int g = t >> 2, tq = t & 3;
        for (int i = 0; i < 4; i++) {
            uint32_t x = (uint32_t)w.slot[t][i];
            int row = g + ((i & 1) ? 8 : 0), k = 2 * tq + ((i & 2) ? 8 : 0);
            A[row][k] = bf2f(x & 0xffff);
            A[row][k + 1] = bf2f(x >> 16);
        }
        for (int i = 0; i < 2; i++) {
            uint32_t x = (uint32_t)w.slot[t][4 + i];
            int k = 2 * tq + 8 * i;
            B[k][g] = bf2f(x & 0xffff);
            B[k + 1][g] = bf2f(x >> 16);
        }
    }
    w.bar.arrive_and_wait();
    int g = l >> 2, tq = l & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + (e >= 2 ? 8 : 0), col = 2 * tq + (e & 1);
        float s = c[e];
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        c[e] = s;
    }
}
template <bool F16> static inline uint32_t mma_pack(float lo, float hi) {
    return f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
}
static inline float mma_ex2(float x) { return exp2f(x); } /* ex2.approx.ftz on the GPU */

#endif
