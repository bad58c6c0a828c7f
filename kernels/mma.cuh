/* Warp-level tensor-core building blocks shared by the attention kernels
 * (attention_flash.cu, paged.cu): the PTX wrappers for cp.async, ldmatrix
 * and mma.m16n8k16 with 16-bit inputs and f32 accumulators, and the
 * fragment loaders and products built on them. The CPU emulations
 * (tests/gpu: flash_emu.cpp, paged_emu.cpp) replace the wrappers with their own implementation
 * of the ISA layouts and compile the helpers between CUK_EMU_BEGIN(mma) and
 * CUK_EMU_END(mma) as they are.
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" with
 * .bf16/.f16 inputs), g = lane >> 2, t = lane & 3:
 *   A (16x16, row):  a0 = (row g,   k 2t..2t+1)   a1 = (row g+8, k 2t..2t+1)
 *                    a2 = (row g,   k 2t+8..+9)   a3 = (row g+8, k 2t+8..+9)
 *   B (16x8,  col):  b0 = (k 2t..2t+1, col g)     b1 = (k 2t+8..+9, col g)
 *   C (16x8,  f32):  c0,c1 = (row g, cols 2t, 2t+1)  c2,c3 = (row g+8, same cols)
 * the lower-index element in the low 16 bits of each b32. ldmatrix.x4:
 * lanes 8m..8m+7 give the row addresses of 8x8 matrix m; register m of
 * lane l receives matrix m's (row l/4, cols 2(l%4), +1), or with .trans
 * its (rows 2(l%4), +1, col l/4). */
#ifndef CAI_KERNELS_MMA_CUH
#define CAI_KERNELS_MMA_CUH

#include "cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef uint16_t e16; /* a bf16 or f16 element in shared memory */

/* ---------------------------------------------------------------- PTX wrappers */

CUK_INLINE uint32_t mma_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

CUK_INLINE void mma_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(mma_smem(dst)), "l"(src));
}
CUK_INLINE void mma_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> CUK_INLINE void mma_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

CUK_INLINE void mma_ldsm(uint32_t (&r)[4], const e16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mma_smem(p)));
}
CUK_INLINE void mma_ldsm_t(uint32_t (&r)[4], const e16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mma_smem(p)));
}

/* c (16x8 f32) += a (16x16) b (16x8) */
template <bool F16> CUK_INLINE void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if (F16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x on the MUFU unit with denormal results flushed to zero: exp2f()
 * wraps the same instruction in a range fix-up for results below 2^-126
 * (three more instructions per score), which a probability that small
 * does not need. */
CUK_INLINE float mma_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Two f32 as one b32 of the input type, `lo` in the low half (RNE). */
template <bool F16> CUK_INLINE uint32_t mma_pack(float lo, float hi) {
    if (F16) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&h;
    }
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}

CUK_EMU_BEGIN(mma);
/* A operand (16 rows x 16 k) from row-major shared memory [row][k] at
 * base (row 0, k 0), row stride LD: lanes 0-7 address rows 0-7 / k 0 (a0),
 * 8-15 rows 8-15 / k 0 (a1), 16-23 rows 0-7 / k 8 (a2), 24-31 rows 8-15 /
 * k 8 (a3). */
template <int LD> CUK_INLINE void mma_lda(uint32_t (&a)[4], const e16 *base, int lane) {
    mma_ldsm(a, base + (lane & 15) * LD + (lane >> 4) * 8);
}

/* B operands of two n-tiles (16 n x 16 k) from shared memory stored
 * [n][k] (K rows for S = Q K^T): matrix 0 = n 0-7 / k 0-7 (b0 of n-tile
 * 0), 1 = n 0-7 / k 8-15 (b1 of n-tile 0), 2 = n 8-15 / k 0-7 (b0 of
 * n-tile 1), 3 = n 8-15 / k 8-15 (b1 of n-tile 1). */
template <int LD> CUK_INLINE void mma_ldb_nk(uint32_t (&b)[4], const e16 *base, int lane) {
    mma_ldsm(b, base + ((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8);
}

/* B operands of two n-tiles (16 k x 16 n) from shared memory stored
 * [k][n] (V rows for O += P V), transposed by ldmatrix: matrix 0 = k 0-7 /
 * n 0-7 (b0 of n-tile 0), 1 = k 8-15 / n 0-7 (b1 of n-tile 0), 2 = k 0-7
 * / n 8-15 (b0 of n-tile 1), 3 = k 8-15 / n 8-15 (b1 of n-tile 1). */
template <int LD> CUK_INLINE void mma_ldb_kn(uint32_t (&b)[4], const e16 *base, int lane) {
    mma_ldsm_t(b, base + ((lane & 7) + (((lane >> 3) & 1) << 3)) * LD + (lane >> 4) * 8);
}

/* A operand for k-chunk kk from f32 accumulators of n-tiles 2kk and 2kk+1
 * (C layout: c0,c1 row g cols 2t..; c2,c3 row g+8), rounded to the input
 * type: that is exactly the A layout (a0 row g k 2t.., a1 row g+8, a2/a3
 * the same rows at k + 8, i.e. the second n-tile). */
template <bool F16> CUK_INLINE void mma_acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = mma_pack<F16>(c0[0], c0[1]);
    a[1] = mma_pack<F16>(c0[2], c0[3]);
    a[2] = mma_pack<F16>(c1[0], c1[1]);
    a[3] = mma_pack<F16>(c1[2], c1[3]);
}

/* acc[NT][4] (rows 16, cols 8 NT) += A(16 x K16 from shared [row][k]) *
 * B^T where B is stored [n][k] (NT/2 pairs of n-tiles). */
template <bool F16, int LD, int NT, int KC>
CUK_INLINE void mma_gemm_nk(float (&acc)[NT][4], const e16 *A, const e16 *B, int lane) {
#pragma unroll
    for (int kk = 0; kk < KC; kk++) {
        uint32_t a[4];
        mma_lda<LD>(a, A + kk * 16, lane);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t b[4];
            mma_ldb_nk<LD>(b, B + np * 16 * LD + kk * 16, lane);
            mma_16816<F16>(acc[2 * np], a, b[0], b[1]);
            mma_16816<F16>(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

/* acc[ND][4] (16 rows x 8 ND cols) += P B where P (16 x 16 KC) is given as
 * f32 accumulators p[2 KC][4] and B is stored [k][n] (row stride LD). */
template <bool F16, int LD, int ND, int KC>
CUK_INLINE void mma_gemm_pk(float (&acc)[ND][4], const float (&p)[2 * KC][4], const e16 *B, int lane) {
#pragma unroll
    for (int kk = 0; kk < KC; kk++) {
        uint32_t a[4];
        mma_acc_to_a<F16>(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < ND / 2; dp++) {
            uint32_t b[4];
            mma_ldb_kn<LD>(b, B + kk * 16 * LD + dp * 16, lane);
            mma_16816<F16>(acc[2 * dp], a, b[0], b[1]);
            mma_16816<F16>(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}
CUK_EMU_END(mma);

#endif
