/* Linear layers of 4 to 8 rows (a decode step's batch) on Hopper's tensor
 * cores: y[n] = W x[n] (+ bias) (+ residual), and a Llama MLP's gate, up
 * and SwiGLU in one pass over both weights.
 *
 * At these rows a product is a pass over the weights, and what counts is
 * keeping every SM's weight stream full. A block owns 128 weight rows (or
 * 64 gate and the same 64 up rows) and a stretch of K: one producer thread
 * loads 64-deep K slices of the weights and of x by TMA (128-byte swizzle)
 * into a ring of DG_STAGES buffers guarded by mbarriers, and two consumer
 * warpgroups multiply their 64 weight rows by x's rows (padded to 16) with
 * wgmma: the weights as A, x's rows as B, both K-major, f32 sums, straight
 * from shared memory. Up to 3 rows gemv.cu's CUDA-core kernels are faster
 * (at 2 and 3 rows by 1-5% a Llama 1B decode step on an H100; at 4 rows
 * this kernel is 5% faster); from 9 rows, and for small or shallow weights
 * at any rows, cuBLASLt's products are faster
 * (bench/RESULTS.md): the split products' fixed cost here
 * (partials, counter, the last block's sums) does not shrink with the
 * rows, and at 64 rows every block reading x whole made the LM head
 * L2-bound.
 *
 * Where a matrix has few 128-row tiles, S blocks split its K; each writes
 * its f32 partial tile to a workspace and the last to finish (a counter a
 * tile) adds the S partials in split order and applies the epilogue, so
 * the sums do not depend on which block finishes last. The SwiGLU pair
 * splits as the product of its gate alone does, so its two sums are the
 * products' bit for bit, each rounded to y's dtype before the SwiGLU.
 *
 * Programmatic dependent launch: the weights (which nothing in a step
 * writes) of the first slices are requested before the wait for the
 * previous kernel, x's slices after it.
 *
 * Built for sm_90a only (wgmma and TMA are arch-specific features): on
 * any other GPU cuk_dgemm_ready is 0 and the products stay on cuBLASLt. */
#include <cuda.h>
#include <cudaTypedefs.h>

#include "mma.cuh"

#define DG_BK 64 /* K elements a slice: one 128-byte swizzled row */
#define DG_BM 128
#define DG_NR 16 /* x's rows as wgmma's N: CUK_DGEMM_MAX_N padded */
#define DG_STAGES 4
#define DG_THREADS 384 /* a producer warpgroup and two consumers */
#define DG_MAX_SPLITS 8
#define DG_W_BYTES (DG_BM * DG_BK * 2)
#define DG_STAGE_BYTES (DG_W_BYTES + DG_NR * DG_BK * 2)
#define DG_SMEM (DG_STAGES * DG_STAGE_BYTES + 2 * DG_STAGES * 8 + 1024) /* + alignment slack */
#define DG_TILE_LD (DG_BM + 4) /* the f32 output tile's row stride: conflict-free stores from the fragments */
/* Taken for weights of at least DG_MIN_K columns and DG_MIN_WEIGHTS
 * elements: a Llama 1B shape's products (K 2048 and 8192, 4-263M
 * weights) gained 5-6% a decode step at 4-8 rows on an H100, GPT-2 124M's
 * (K 768 and 3072, 0.6-39M) lost 6-8% (bench/RESULTS.md): a block's stretch
 * of a shallow K is too few slices for the split's fixed cost. */
#define DG_MIN_K 2048
#define DG_MIN_WEIGHTS ((int64_t)4 << 20)

typedef struct {
    cuk_mat y, r; /* r.p NULL: no residual */
    const void *bias;
    int bias_dt;
    int64_t M; /* weight rows (output features) */
    int R;     /* rows of x */
    int KT;    /* K slices */
    int S;     /* blocks splitting K */
    int pair;  /* the halves of a block are 64 gate and the same 64 up rows */
    float *ws;
    unsigned *cnt;
} dg_args;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DG_DEVICE 1
#endif

#ifdef DG_DEVICE
CUK_INLINE void dg_bar_init(uint64_t *b, int n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(mma_smem(b)), "r"(n));
}
CUK_INLINE void dg_bar_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mma_smem(b)), "r"(bytes) : "memory");
}
CUK_INLINE void dg_bar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(mma_smem(b)) : "memory");
}
CUK_INLINE void dg_bar_wait(uint64_t *b, int parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(mma_smem(b)), "r"(parity)
            : "memory");
}
CUK_INLINE void dg_tma(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
        "[%2];" ::"r"(mma_smem(dst)),
        "l"((uint64_t)map), "r"(mma_smem(bar)), "r"(c0), "r"(c1)
        : "memory");
}
/* the two consumer warpgroups only (named barrier 1) */
CUK_INLINE void dg_sync_consumers() { asm volatile("bar.sync 1, 256;" ::: "memory"); }
/* a K-major operand in shared memory, 128-byte swizzle: rows of 128
 * bytes, groups of 8 rows 1024 bytes apart */
CUK_INLINE uint64_t dg_desc(const void *p) {
    const uint64_t a = mma_smem(p);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)(16 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

/* d (64 weight rows x 16 rows of x) += A B for one 16-deep k step; the
 * fence keeps the sums from being read before the wgmma that writes them
 * is waited for */
#define DG_OUTS "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define DG_MMA(TY)                                                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\nwgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY \
                 " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"                                  \
                 : DG_OUTS                                                                                         \
                 : "l"(da), "l"(db), "r"(1))
template <int DT> CUK_INLINE void dg_mma(float (&d)[8], uint64_t da, uint64_t db) {
    if (DT == CUK_BF16) DG_MMA("bf16");
    else DG_MMA("f16");
}
CUK_INLINE void dg_acc_fence(float (&d)[8]) { asm volatile("" : DG_OUTS::"memory"); }

CUK_INLINE void dg_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
CUK_INLINE void dg_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> CUK_INLINE void dg_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
#endif

/* The 8 sums of the output tile at (row, col): the block's own (tl), or
 * the S blocks' partials (p0, elems floats apart) added in split order. */
CUK_INLINE void dg_sums8(float (&v)[8], const float *tl, const float *p0, int S, int elems, int row, int col) {
    if (!p0) {
        const float4 a = *(const float4 *)(tl + row * DG_TILE_LD + col);
        const float4 b = *(const float4 *)(tl + row * DG_TILE_LD + col + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
    /* four splits' loads in flight at a time: all eight would spill */
    const float *p = p0 + row * DG_BM + col;
#pragma unroll
    for (int q0 = 0; q0 < DG_MAX_SPLITS; q0 += 4) {
        float4 lo[4], hi[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (q0 + q < S) {
                lo[q] = __ldcg((const float4 *)(p + (size_t)(q0 + q) * elems));
                hi[q] = __ldcg((const float4 *)(p + (size_t)(q0 + q) * elems + 4));
            }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if (q0 + q >= S) break;
            if (q0 + q == 0) {
                v[0] = lo[0].x, v[1] = lo[0].y, v[2] = lo[0].z, v[3] = lo[0].w;
                v[4] = hi[0].x, v[5] = hi[0].y, v[6] = hi[0].z, v[7] = hi[0].w;
            } else {
                v[0] += lo[q].x, v[1] += lo[q].y, v[2] += lo[q].z, v[3] += lo[q].w;
                v[4] += hi[q].x, v[5] += hi[q].y, v[6] += hi[q].z, v[7] += hi[q].w;
            }
        }
    }
}

/* Block b: tile b / S (128 weight rows from f0, or 64 of each weight for
 * the pair), K slices of split b % S. A stage holds the two 64-row weight
 * tiles, then x's rows; consumer c multiplies tile c. */
template <int DT>
__global__ void __launch_bounds__(DG_THREADS, 2)
    k_dgemm(const __grid_constant__ CUtensorMap tw0, const __grid_constant__ CUtensorMap tw1,
            const __grid_constant__ CUtensorMap tx, dg_args a) {
#ifdef DG_DEVICE
    extern __shared__ uint8_t dg_raw[];
    uint8_t *base = dg_raw + ((1024 - (mma_smem(dg_raw) & 1023)) & 1023);
    uint64_t *full = (uint64_t *)(base + DG_STAGES * DG_STAGE_BYTES), *empty = full + DG_STAGES;
    __shared__ int last;
    const int tile = blockIdx.x / a.S, split = blockIdx.x % a.S;
    const int kt0 = (int)((int64_t)split * a.KT / a.S), kt1 = (int)((int64_t)(split + 1) * a.KT / a.S);
    const int n = kt1 - kt0;
    const int f0 = tile * (a.pair ? DG_BM / 2 : DG_BM); /* the block's first output feature */
    if (threadIdx.x == 0) {
        for (int s = 0; s < DG_STAGES; s++) {
            dg_bar_init(&full[s], 1);
            dg_bar_init(&empty[s], 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 128) { /* producer */
        if (threadIdx.x == 0) {
            const int r1 = a.pair ? f0 : f0 + DG_BM / 2;
            const int pre = n < DG_STAGES ? n : DG_STAGES;
            for (int p = 0; p < pre; p++) {
                uint8_t *st = base + p * DG_STAGE_BYTES;
                dg_bar_expect(&full[p], DG_STAGE_BYTES);
                dg_tma(st, &tw0, &full[p], (kt0 + p) * DG_BK, f0);
                dg_tma(st + DG_W_BYTES / 2, &tw1, &full[p], (kt0 + p) * DG_BK, r1);
            }
            cuk_pdl_wait();
            for (int p = 0; p < pre; p++)
                dg_tma(base + p * DG_STAGE_BYTES + DG_W_BYTES, &tx, &full[p], (kt0 + p) * DG_BK, 0);
            for (int p = pre; p < n; p++) {
                const int s = p % DG_STAGES, ph = (p / DG_STAGES) & 1;
                uint8_t *st = base + s * DG_STAGE_BYTES;
                dg_bar_wait(&empty[s], ph ^ 1);
                dg_bar_expect(&full[s], DG_STAGE_BYTES);
                dg_tma(st, &tw0, &full[s], (kt0 + p) * DG_BK, f0);
                dg_tma(st + DG_W_BYTES / 2, &tw1, &full[s], (kt0 + p) * DG_BK, r1);
                dg_tma(st + DG_W_BYTES, &tx, &full[s], (kt0 + p) * DG_BK, 0);
            }
        }
        cuk_pdl_trigger();
        return;
    }
    cuk_pdl_wait(); /* the residual, the workspace and the counters */
    const int c = threadIdx.x / 128 - 1, t = threadIdx.x % 128;
    float d[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int prev = -1;
    for (int p = 0; p < n; p++) {
        const int s = p % DG_STAGES, ph = (p / DG_STAGES) & 1;
        dg_bar_wait(&full[s], ph);
        dg_wg_fence();
        const uint8_t *w = base + s * DG_STAGE_BYTES + c * (DG_W_BYTES / 2),
                      *x = base + s * DG_STAGE_BYTES + DG_W_BYTES;
#pragma unroll
        for (int k = 0; k < DG_BK / 16; k++) dg_mma<DT>(d, dg_desc(w + k * 32), dg_desc(x + k * 32));
        dg_wg_commit();
        dg_wg_wait<1>(); /* the previous slice's products are done: its buffer goes back */
        if (prev >= 0) dg_bar_arrive(&empty[prev]);
        prev = s;
    }
    dg_wg_wait<0>();
    dg_acc_fence(d);
    cuk_pdl_trigger();
    /* the fragments into an f32 tile [16][128] over the ring, once both
     * consumers are done reading it */
    float *tl = (float *)base;
    dg_sync_consumers();
    {
        const int warp = t / 32, lane = t % 32, f = c * 64 + warp * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < DG_NR / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                tl[(8 * j + 2 * (lane % 4) + (e & 1)) * DG_TILE_LD + f + (e >> 1) * 8] = d[4 * j + e];
    }
    dg_sync_consumers();
    /* The epilogue walks chunks of 8 features, a chunk's loads issued
     * before its stores (y may be the residual). */
    const int ct = threadIdx.x - 128, elems = a.R * DG_BM;
    const float *p0 = nullptr;
    if (a.S > 1) {
        float *part = a.ws + ((size_t)tile * a.S + split) * elems;
        for (int i = ct; i < elems / 4; i += 256) {
            const int row = i / (DG_BM / 4), col = i % (DG_BM / 4) * 4;
            __stcg((float4 *)(part + row * DG_BM + col), *(const float4 *)(tl + row * DG_TILE_LD + col));
        }
        __threadfence();
        dg_sync_consumers();
        if (ct == 0) last = atomicAdd(&a.cnt[tile], 1u) == (unsigned)a.S - 1;
        dg_sync_consumers();
        if (!last) return;
        __threadfence();
        if (ct == 0) a.cnt[tile] = 0; /* zero for the next call */
        p0 = a.ws + (size_t)tile * a.S * elems;
    }
    if (!a.pair) {
        for (int i = ct; i < a.R * (DG_BM / 8); i += 256) {
            const int row = i / (DG_BM / 8), col = i % (DG_BM / 8) * 8;
            const int64_t o = f0 + col;
            float v[8], b[8], r[8];
            dg_sums8(v, tl, p0, a.S, elems, row, col);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                b[e] = a.bias && o + e < a.M ? ldf(a.bias, a.bias_dt, o + e) : 0.0f;
                r[e] = a.r.p && o + e < a.M ? cuk_ld1<DT>(a.r.p, row * a.r.ld + o + e) : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) {
                if (o + e >= a.M) continue;
                float v1 = v[e]; /* k_gemv's order: the sum, the bias, the residual */
                if (a.bias) v1 += b[e];
                if (a.r.p) v1 += r[e];
                cuk_st1<DT>(a.y.p, row * a.y.ld + o + e, v1);
            }
        }
        return;
    }
    for (int i = ct; i < a.R * (DG_BM / 16); i += 256) {
        const int row = i / (DG_BM / 16), col = i % (DG_BM / 16) * 8;
        float g[8], u[8];
        dg_sums8(g, tl, p0, a.S, elems, row, col);
        dg_sums8(u, tl, p0, a.S, elems, row, DG_BM / 2 + col);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            if (f0 + col + e >= a.M) continue;
            const float gr = cuk_round<DT>(g[e]), ur = cuk_round<DT>(u[e]);
            cuk_st1<DT>(a.y.p, row * a.y.ld + f0 + col + e, gr / (1.0f + expf(-gr)) * ur); /* swiglu_fwd's expression */
        }
    }
#else
    __trap();
#endif
}

/* ---------------------------------------------------------------- host */

static PFN_cuTensorMapEncodeTiled_v12000 dg_encode_fn;

/* W or x [rows, K] (row stride ld) as a TMA map of boxes DG_BK x box_rows
 * elements; rows and K past the ends read as zeros */
static bool dg_map(CUtensorMap *m, const cuk_mat &t, int box_rows) {
    const cuuint64_t dims[2] = {(cuuint64_t)t.cols, (cuuint64_t)t.rows}, strides[1] = {(cuuint64_t)t.ld * 2};
    const cuuint32_t box[2] = {DG_BK, (cuuint32_t)box_rows}, es[2] = {1, 1};
    return dg_encode_fn(m, t.dt == CUK_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                        t.p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int cuk_dgemm_ready(void) {
    static int cache[64]; /* 0 unknown, 1 ready, 2 not */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (cache[dev]) return cache[dev] == 1;
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDriverEntryPointQueryResult q;
    bool ok = major == 9 && minor == 0 &&
              cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&dg_encode_fn, 12000,
                                               cudaEnableDefault, &q) == cudaSuccess &&
              q == cudaDriverEntryPointSuccess && dg_encode_fn;
    ok = ok &&
         cudaFuncSetAttribute(k_dgemm<CUK_BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, DG_SMEM) == cudaSuccess &&
         cudaFuncSetAttribute(k_dgemm<CUK_F16>, cudaFuncAttributeMaxDynamicSharedMemorySize, DG_SMEM) == cudaSuccess;
    (void)cudaGetLastError(); /* a missing image is an answer, not an error */
    cache[dev] = ok ? 1 : 2;
    return ok;
}

/* Blocks splitting K: about one block an SM over the 128-row tiles, each
 * split at least two slices, at most DG_MAX_SPLITS (the last block reads
 * every partial). The pair, with twice the tiles, splits alike. */
static int dg_splits(int64_t M, int64_t K) {
    const int64_t T = cuk_cdiv(M, DG_BM), KT = cuk_cdiv(K, DG_BK);
    int64_t S = (cuk_sm_count() + T / 2) / T;
    if (S > DG_MAX_SPLITS) S = DG_MAX_SPLITS;
    if (S > KT / 2) S = KT / 2;
    return S < 1 ? 1 : (int)S;
}

/* Whether ws_bytes and the counters hold the partials of R rows by M
 * weight rows (pair: gate and up of M rows each). */
static bool dg_ws_fits(int64_t R, int64_t M, int64_t K, int pair, size_t ws_bytes) {
    const int S = dg_splits(M, K);
    const int64_t tiles = pair ? cuk_cdiv(M, DG_BM / 2) : cuk_cdiv(M, DG_BM);
    return S == 1 || (tiles <= CUK_DGEMM_COUNTERS && (size_t)tiles * S * R * DG_BM * sizeof(float) <= ws_bytes);
}

int cuk_dgemm_fits(cuk_mat y, cuk_mat x, cuk_mat w, cuk_mat r, size_t ws_bytes) {
    if (x.rows < CUK_DGEMM_MIN_N || x.rows > CUK_DGEMM_MAX_N || !cuk_few_rows_layout(y, x, w, r)) return 0;
    if (w.cols < DG_MIN_K || w.rows * w.cols < DG_MIN_WEIGHTS || w.rows >= ((int64_t)1 << 30)) return 0;
    return dg_ws_fits(x.rows, w.rows, w.cols, 0, ws_bytes) && cuk_dgemm_ready();
}

int cuk_dgemm_swiglu_fits(cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, size_t ws_bytes) {
    const cuk_mat none = {0};
    return cuk_dgemm_fits(y, x, wg, none, ws_bytes) && cuk_dgemm_fits(y, x, wu, none, ws_bytes) &&
           cuk_pair_layout(y, wg, wu) && dg_ws_fits(x.rows, wg.rows, wg.cols, 1, ws_bytes);
}

static cudaError_t dg_run(cudaStream_t s, const cuk_mat &y, const cuk_mat &x, const cuk_mat &w0, const cuk_mat &w1,
                          const void *bias, int bias_dt, const cuk_mat &r, int pair, void *ws, unsigned *cnt, int pdl) {
    dg_args a;
    a.y = y;
    a.r = r;
    a.bias = bias;
    a.bias_dt = bias_dt;
    a.M = w0.rows;
    a.R = (int)x.rows;
    a.KT = (int)cuk_cdiv(w0.cols, DG_BK);
    a.S = dg_splits(w0.rows, w0.cols);
    a.pair = pair;
    a.ws = (float *)ws;
    a.cnt = cnt;
    const unsigned grid = (unsigned)(cuk_cdiv(w0.rows, pair ? DG_BM / 2 : DG_BM) * a.S);
    CUtensorMap t0, t1, tx;
    if (!dg_map(&t0, w0, DG_BM / 2) || !dg_map(&t1, w1, DG_BM / 2) || !dg_map(&tx, x, DG_NR))
        return cudaErrorInvalidValue;
    return w0.dt == CUK_BF16 ? cuk_launch(s, pdl, k_dgemm<CUK_BF16>, dim3(grid), DG_THREADS, DG_SMEM, t0, t1, tx, a)
                             : cuk_launch(s, pdl, k_dgemm<CUK_F16>, dim3(grid), DG_THREADS, DG_SMEM, t0, t1, tx, a);
}

cudaError_t cuk_dgemm(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r,
                      void *ws, unsigned *cnt, int pdl) {
    return dg_run(s, y, x, w, w, bias, bias_dt, r, 0, ws, cnt, pdl);
}

cudaError_t cuk_dgemm_swiglu(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, void *ws, unsigned *cnt,
                             int pdl) {
    const cuk_mat none = {0};
    return dg_run(s, y, x, wg, wu, NULL, 0, none, 1, ws, cnt, pdl);
}
