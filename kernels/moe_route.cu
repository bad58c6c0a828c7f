/* The mixture-of-experts router on the device (ops.h moe_route, moe_assign,
 * moe_router_sums, moe_router_bwd), so a training step routes without a
 * round trip to the host: the forward copies back only the experts' counts
 * and the losses' sums, the backward nothing.
 *
 * A token's routing and its logit gradient are a thread's (E and k are
 * small: a few dozen values, read from L1), with the CPU backend's own
 * per-token code (src/ops/moe_route_math.h). The assignment is one block:
 * for each expert in turn the block counts its choices per thread span and
 * scans the counts, so every choice gets its rank among the expert's
 * earlier ones in index order, as on the CPU. The sums are a block per
 * column with a fixed reduction tree. No atomics but the error report:
 * every result is the same bits every run. */
#include "cuda_common.cuh"

#include "../src/ops/moe_route_math.h"

static cudaError_t launched(void) { return cudaGetLastError(); }

static unsigned token_blocks(int64_t n, int threads) {
    const int64_t b = (n + threads - 1) / threads, cap = 65535;
    return (unsigned)(b < 1 ? 1 : b < cap ? b : cap);
}

__global__ void __launch_bounds__(128)
    k_moe_route(const float *logits, float *probs, float *lse, int32_t *sel, float *wts, int64_t N, int64_t E,
                int64_t k, int fn, int norm_topk, cuk_errrec *err) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < N; t += (int64_t)gridDim.x * blockDim.x) {
        const int bad = cai_moe_route_token(fn, norm_topk, E, k, logits + t * E, sel + t * k, wts + t * k,
                                            probs + t * E, lse + t);
        if (bad < 0) continue;
        cuk_report(err, CUK_ERR_MOE_LOGIT, t, bad, E, 0);
        /* valid experts with no weight, so later kernels index nothing wild */
        for (int64_t j = 0; j < k; j++) {
            sel[t * k + j] = (int32_t)j;
            wts[t * k + j] = 0.0f;
        }
        for (int64_t e = 0; e < E; e++) probs[t * E + e] = 0.0f;
        lse[t] = 0.0f;
    }
}

/* An exclusive scan of v over the block (1024 threads); *total gets the sum. */
__device__ int64_t block_exclusive_scan(int64_t v, int64_t *warp_sums, int64_t *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int64_t u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    if (lane == 31) warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        const int64_t w = warp_sums[lane];
        int64_t wi = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int64_t u = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += u;
        }
        warp_sums[lane] = wi - w;
        if (lane == 31) warp_sums[32] = wi;
    }
    __syncthreads();
    const int64_t r = warp_sums[warp] + inc - v;
    *total = warp_sums[32];
    __syncthreads(); /* warp_sums is reused by the next scan */
    return r;
}

__global__ void __launch_bounds__(1024)
    k_moe_assign(const int32_t *sel, int32_t *pos, int64_t *load, int64_t *kept, int64_t n, int64_t E,
                 int64_t capacity, cuk_errrec *err) {
    __shared__ int64_t warp_sums[33];
    const int64_t span = (n + blockDim.x - 1) / blockDim.x;
    const int64_t b0 = min(n, (int64_t)threadIdx.x * span), b1 = min(n, b0 + span);
    for (int64_t i = b0; i < b1; i++)
        if (sel[i] < 0 || sel[i] >= E) {
            cuk_report(err, CUK_ERR_MOE_SEL, i, sel[i], E, 0);
            pos[i] = -1;
        }
    int64_t start = 0;
    for (int64_t x = 0; x < E; x++) {
        int64_t c = 0;
        for (int64_t i = b0; i < b1; i++) c += sel[i] == x;
        int64_t total;
        int64_t rank = block_exclusive_scan(c, warp_sums, &total);
        for (int64_t i = b0; i < b1 && c; i++)
            if (sel[i] == x) {
                pos[i] = rank < capacity ? (int32_t)(start + rank) : -1;
                rank++;
                c--;
            }
        const int64_t kx = total < capacity ? total : capacity;
        if (threadIdx.x == 0) {
            load[x] = total;
            kept[x] = kx;
        }
        start += kx;
    }
}

/* Block b < E sums column b of probs (sigmoid: each row divided by its
 * sum), block E the squares of lse; 256 threads, a fixed tree. */
__global__ void __launch_bounds__(256)
    k_moe_router_sums(double *sums, const float *probs, const float *lse, int64_t N, int64_t E, int fn) {
    __shared__ double part[8];
    const int64_t col = blockIdx.x;
    double acc = 0.0;
    for (int64_t t = threadIdx.x; t < N; t += blockDim.x) {
        if (col == E) {
            acc += (double)lse[t] * lse[t];
            continue;
        }
        const float *p = probs + t * E;
        double norm = 1.0;
        if (fn == CAI_MOE_FN_SIGMOID) {
            norm = 0.0;
            for (int64_t e = 0; e < E; e++) norm += p[e];
        }
        acc += p[col] / norm;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int w = 0; w < 8; w++) s += part[w];
        sums[col] = s;
    }
}

__global__ void __launch_bounds__(128)
    k_moe_router_bwd(float *dlogits, const float *logits, const float *probs, const float *lse, const int32_t *sel,
                     const float *wts, const float *dw, const int64_t *load, int64_t N, int64_t E, int64_t k, int fn,
                     int norm_topk, double aux_scale, double z_scale) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < N; t += (int64_t)gridDim.x * blockDim.x)
        cai_moe_router_bwd_token(fn, norm_topk, N, E, k, logits + t * E, probs + t * E, lse[t], sel + t * k,
                                 wts + t * k, dw + t * k, load, aux_scale, z_scale, dlogits + t * E);
}

cudaError_t cuk_moe_route(cudaStream_t s, const float *logits, float *probs, float *lse, int32_t *sel, float *wts,
                          int64_t N, int64_t E, int64_t k, int fn, int norm_topk, cuk_errrec *err) {
    if (N == 0) return cudaSuccess;
    k_moe_route<<<token_blocks(N, 128), 128, 0, s>>>(logits, probs, lse, sel, wts, N, E, k, fn, norm_topk, err);
    return launched();
}

cudaError_t cuk_moe_assign(cudaStream_t s, const int32_t *sel, int32_t *pos, int64_t *load, int64_t *kept, int64_t n,
                           int64_t E, int64_t capacity, cuk_errrec *err) {
    k_moe_assign<<<1, 1024, 0, s>>>(sel, pos, load, kept, n, E, capacity, err);
    return launched();
}

cudaError_t cuk_moe_router_sums(cudaStream_t s, double *sums, const float *probs, const float *lse, int64_t N,
                                int64_t E, int fn) {
    k_moe_router_sums<<<(unsigned)(E + 1), 256, 0, s>>>(sums, probs, lse, N, E, fn);
    return launched();
}

cudaError_t cuk_moe_router_bwd(cudaStream_t s, float *dlogits, const float *logits, const float *probs,
                               const float *lse, const int32_t *sel, const float *wts, const float *dw,
                               const int64_t *load, int64_t N, int64_t E, int64_t k, int fn, int norm_topk,
                               double aux_scale, double z_scale) {
    if (N == 0) return cudaSuccess;
    k_moe_router_bwd<<<token_blocks(N, 128), 128, 0, s>>>(dlogits, logits, probs, lse, sel, wts, dw, load, N, E, k,
                                                           fn, norm_topk, aux_scale, z_scale);
    return launched();
}
