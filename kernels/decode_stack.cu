/* A decode step of one token through a stack of Llama decoder layers in one
 * launch (colossal/ops.h decode_stack_fwd).
 *
 * At batch 1 a step is about 8 kernels a layer, each a few microseconds of
 * launch, ramp-up and tail that no bandwidth recovers (bench/RESULTS.md).
 * Here a grid of resident blocks walks every layer's phases, separated by
 * grid-wide barriers instead of kernel boundaries:
 *   1. RMSNorm (warp 0 of every block, into shared memory) and the QKV
 *      product, whose epilogue applies RoPE and writes the KV cache (a warp
 *      takes the two rows a rotation pairs);
 *   2. paged attention (paged.cuh's blocks, the grid walking their places);
 *   3. the output projection plus the residual;
 *   4. RMSNorm and the gate, up and SwiGLU products;
 *   5. the down projection plus the residual.
 * Before a barrier each warp issues the loads of its first weight rows of
 * the next product (weights are never written during the step), and the
 * output projection's rows are prefetched into L2 before attention, so the
 * weight stream does not stop at the barriers.
 *
 * Every result is computed in the order the separate kernels use: a warp
 * takes a product's row as k_gemv does (KS parts of 8-chunk batches, the
 * parts' warp sums added in order), the norms follow k_norm_fwd_reg or
 * k_norm_fwd by width, RoPE and the cache write k_rope_kv_write, and
 * attention runs paged.cuh's code for the same splits. So the stack's
 * output is bitwise the separate ops' (test_cuda_ops checks it on a GPU,
 * tests/gpu/decode_stack_emu.sh in a CPU emulation of this source). */
#include "paged.cuh"

CUK_EMU_BEGIN(dstack);

#define DS_NW PG_NW /* attention's blocks set the block size */
#define DS_NT PG_NT
#define DS_XS 16384 /* elements of the staged product input: C, Hq D and F at most */

/* ---------------------------------------------------------------- grid barrier */

/* Every block arrives, then leaves once all have: bar[0] counts arrivals
 * (the last one sets it back to 0), bar[1] is bumped once per barrier. The
 * fences make each block's writes before the barrier visible to every
 * block after it. Needs all blocks resident (a cooperative launch). */
CUK_INLINE void ds_sync(unsigned *bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned *gen = bar + 1;
        const unsigned g = *gen; /* read before arriving: it cannot move until this block has */
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            bar[0] = 0u;
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            unsigned v;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar + 1) : "memory");
            } while (v == g);
        }
        __threadfence();
    }
    __syncthreads();
}

/* ---------------------------------------------------------------- products */

/* A warp's walk over its tasks of one product: tasks o = gw, gw + nw, ...;
 * a row is KS parts (gemv.cu's gv_parts) of JB batches of 8 chunks, chunk u
 * of batch (p, j) being lane + 32 p + 32 KS (8 j + u) (k_gemv's order). A
 * task is row o, or two rows whose sums its epilogue takes together: with
 * w1 (the SwiGLU pair) the gate row's batches, then up's; with half > 0
 * (RoPE's pairs) rows (o / half) D + o % half and that plus half of w0. */
struct ds_mv {
    const uint4 *w0, *w1;
    int rows, nc, ks, jb, nb;
    int half, D;   /* RoPE's pairs: half of a head, the head dim; 0 otherwise */
    int gw, nw, T; /* this warp, the grid's warps, this warp's batches */
};

CUK_INLINE int ds_parts(int64_t K) { /* gemv.cu's gv_parts */
    int ks = 1;
    while (ks < 8 && (K >> 3) > (int64_t)32 * 8 * ks) ks *= 2;
    return ks;
}

CUK_INLINE ds_mv ds_mv_of(const void *w0, const void *w1, int64_t rows, int64_t K, int gw, int nw) {
    ds_mv m;
    m.w0 = (const uint4 *)w0;
    m.w1 = (const uint4 *)w1;
    m.rows = (int)rows;
    m.nc = (int)(K >> 3);
    m.ks = ds_parts(K);
    m.jb = (m.nc + 256 * m.ks - 1) / (256 * m.ks);
    m.nb = m.ks * m.jb * (w1 ? 2 : 1);
    m.half = m.D = 0;
    m.gw = gw;
    m.nw = nw;
    m.T = gw < m.rows ? (m.rows - gw + nw - 1) / nw * m.nb : 0;
    return m;
}

/* Rotation pairs (j, j + half) of `heads` heads of D = 2 half rows each in w. */
CUK_INLINE ds_mv ds_mv_pairs(const void *w, int64_t heads, int64_t half, int64_t K, int gw, int nw) {
    ds_mv m = ds_mv_of(w, w, heads * half, K, gw, nw);
    m.half = (int)half;
    m.D = (int)(2 * half);
    return m;
}

struct ds_pos {
    int o, c0, stride; /* the row, this lane's first chunk of the batch and the step between its chunks */
    int m, p, j;       /* matrix (0, or 1 for up), part, batch of the part */
};

CUK_INLINE ds_pos ds_at(const ds_mv &m, int t, int lane) {
    ds_pos q;
    const int i = t / m.nb, per = m.ks * m.jb;
    int r = t - i * m.nb;
    q.o = m.gw + i * m.nw;
    q.m = r / per;
    r -= q.m * per;
    q.p = r / m.jb;
    q.j = r - q.p * m.jb;
    q.stride = 32 * m.ks;
    q.c0 = lane + 32 * q.p + q.stride * 8 * q.j;
    return q;
}

CUK_INLINE void ds_load(const ds_mv &m, int t, int lane, uint4 (&w)[8]) {
    if (t >= m.T) return;
    const ds_pos q = ds_at(m, t, lane);
    const int64_t r = m.half ? (int64_t)(q.o / m.half) * m.D + q.o % m.half + q.m * m.half : q.o;
    const uint4 *row = (q.m && !m.half ? m.w1 : m.w0) + r * m.nc;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int c = q.c0 + q.stride * u;
        w[u] = c < m.nc ? __ldcs(row + c) : make_uint4(0u, 0u, 0u, 0u); /* read once: do not keep in cache */
    }
}

/* The product's rows of this warp against x (staged in shared memory):
 * batch 0 is already in A (ds_load before the barrier); two batches in
 * flight. epi(o, gate_or_only, up) gets each row's sums on lane 0. */
template <int DT, class E> CUK_INLINE void ds_run(const ds_mv &m, const uint16_t *xs, int lane, uint4 (&A)[8], E epi) {
    float acc = 0.0f, tot = 0.0f, r0 = 0.0f;
    const uint4 *x4 = (const uint4 *)xs;
    uint4 B[8];
    auto step = [&](const uint4(&w)[8], int t) {
        const ds_pos q = ds_at(m, t, lane);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int c = q.c0 + q.stride * u;
            if (c >= m.nc) break;
            float wf[8], xf[8];
            cuk_unpack8<DT>(w[u], wf);
            cuk_unpack8<DT>(x4[c], xf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc = fmaf(wf[e], xf[e], acc);
        }
        if (q.j != m.jb - 1) return;
        const float s = warp_sum(acc);
        acc = 0.0f;
        tot = q.p == 0 ? s : tot + s;
        if (q.p != m.ks - 1) return;
        if (m.w1 && q.m == 0) {
            r0 = tot;
            return;
        }
        if (lane == 0) epi(q.o, m.w1 ? r0 : tot, tot);
    };
    for (int t = 0; t < m.T; t += 2) {
        ds_load(m, t + 1, lane, B);
        step(A, t);
        if (t + 1 >= m.T) break;
        ds_load(m, t + 2, lane, A);
        step(B, t + 1);
    }
}

/* ---------------------------------------------------------------- norm, staging, RoPE */

/* Element i of a 16-bit vector other blocks wrote during this launch (from L2). */
template <int DT> CUK_INLINE float ds_ld1(const uint16_t *p, int64_t i) {
    const uint16_t h = __ldcg((const unsigned short *)p + i);
    return DT == CUK_BF16 ? cuk_bf16_to_f32(h) : cuk_f16_to_f32(h);
}

/* RMSNorm of x [C] into xs (dtype DT, as rmsnorm_fwd stores it) by one
 * warp: k_norm_fwd_reg's order where C <= 2048 (its chunks of 8 columns a
 * lane), else k_norm_fwd's (columns lane + 32 k). */
template <int DT>
CUK_INLINE void ds_norm(const void *x, int64_t C, const void *w, int wdt, float eps, uint16_t *xs, int lane) {
    if (C <=
        2048) { /* the chunks read twice (L2 hits) rather than held: the registers carry the next product's loads */
        const uint4 *x4 = (const uint4 *)x;
        const float m = 0.0f;
        float var = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int c0 = 8 * (lane + 32 * k);
            if (c0 >= C) break;
            float v[8];
            cuk_unpack8<DT>(__ldcg(x4 + c0 / 8), v);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float d = v[e] - m;
                var += d * d;
            }
        }
        var = warp_sum(var);
        const float rs = 1.0f / sqrtf(var / (float)C + eps);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int c0 = 8 * (lane + 32 * k);
            if (c0 >= C) break;
            float v[8], o[8];
            cuk_unpack8<DT>(__ldcg(x4 + c0 / 8), v);
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = ldf(w, wdt, c0 + e) * (v[e] * rs);
            cuk_st8<DT>(xs, c0, o);
        }
        return;
    }
    const uint16_t *xh = (const uint16_t *)x;
    const float m = 0.0f;
    float var = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        const float d = ds_ld1<DT>(xh, c) - m;
        var += d * d;
    }
    var = warp_sum(var);
    const float rs = 1.0f / sqrtf(var / (float)C + eps);
    for (int64_t c = lane; c < C; c += 32) cuk_st1<DT>(xs, c, ldf(w, wdt, c) * (ds_ld1<DT>(xh, c) * rs));
}

/* xs[0, n) = v[0, n) (n % 8 == 0), read from L2, by the whole block. */
CUK_INLINE void ds_stage(uint16_t *xs, const void *v, int64_t n) {
    for (int64_t c = threadIdx.x; c < n / 8; c += DS_NT) ((uint4 *)xs)[c] = __ldcg((const uint4 *)v + c);
}

/* RoPE and the cache write for the step's one token in the QKV product's
 * epilogue, as k_rope_kv_write computes them from the product's stored
 * (rounded) values: a pair o = (head h, j) of rotated rows with sums s1, s2,
 * or value row o (value head h = o / D). The cache holds the values as
 * stored, as kv_cache_write reads them back. */
template <int DT> CUK_INLINE void ds_rope_pair(const cuk_dstack &a, const cuk_dlayer &ly, int o, float s1, float s2) {
    const int64_t half = a.cos.cols, D = a.qk.D, Hkv = a.v.H, Hq = a.qk.H - Hkv, h = o / half, j = o % half;
    const int64_t slot = a.slots[0], p = a.pos[0];
    const bool bad = p < 0 || p >= a.cos.rows;
    if (o == 0 && slot >= a.n_slots) cuk_report(a.err, CUK_ERR_SLOT, 0, slot, a.n_slots, 0);
    if (o == 0 && bad) cuk_report(a.err, CUK_ERR_POSITION, 0, p, a.cos.rows, 0);
    const float x1 = cuk_round16<DT>(s1 + 0.0f), x2 = cuk_round16<DT>(s2 + 0.0f); /* k_gemv's zero bias */
    float y1 = 0.0f, y2 = 0.0f;
    if (!bad) {
        const float c = ((const float *)a.cos.p)[p * a.cos.ld + j],
                    s = 1.0f * ((const float *)a.sin.p)[p * a.sin.ld + j];
        y1 = x1 * c - x2 * s;
        y2 = x2 * c + x1 * s;
    }
    const int64_t r = h * a.qk.sh + j;
    cuk_st1<DT>(a.qk.p, r, y1);
    cuk_st1<DT>(a.qk.p, r + half, y2);
    if (h < Hq || slot < 0 || slot >= a.n_slots) return;
    const int64_t dst = (slot * Hkv + (h - Hq)) * D + j;
    cuk_st1<DT>(ly.kc, dst, y1);
    cuk_st1<DT>(ly.kc, dst + half, y2);
}

template <int DT> CUK_INLINE void ds_value_row(const cuk_dstack &a, const cuk_dlayer &ly, int o, float s) {
    const int64_t D = a.qk.D, Hkv = a.v.H, slot = a.slots[0];
    const float v = s + 0.0f;
    cuk_st1<DT>(a.v.p, (o / D) * a.v.sh + o % D, v);
    if (slot >= 0 && slot < a.n_slots) cuk_st1<DT>(ly.vc, (slot * Hkv + o / D) * D + o % D, v);
}

/* ---------------------------------------------------------------- the kernel */

/* Attention's grid places (one token: kv head and head chunk, then split)
 * walked by the blocks. */
template <int DT, int DMAX, int GH>
__device__ __noinline__ void ds_attention(const cuk_dstack &a, const cuk_dlayer &ly, pg_pipe_smem<DT, DMAX, GH> &sm) {
    const int64_t gx = a.v.H * a.nhc, units = gx * a.splits;
    float *ws_acc = a.splits > 1 ? a.ws : nullptr;
    float *ws_ml = a.splits > 1 ? a.ws + (a.qk.H - a.v.H) * a.splits * a.qk.D : nullptr;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        pg_pipe_block<DT, DMAX, GH>(a.attn, ly.kc, ly.vc, a.splits, a.chunk, a.nhc, a.bs_log2, ws_acc, ws_ml,
                                    a.splits > 1 ? a.cnt : nullptr, a.err, (unsigned)(u % gx), (unsigned)(u / gx), sm);
        __syncthreads(); /* the next place refills the tiles */
    }
}

template <int DT, int DMAX, int GH> union ds_smem {
    pg_pipe_smem<DT, DMAX, GH> pg;
    uint16_t xs[DS_XS];
};

template <int DT, int DMAX, int GH>
__global__ void __launch_bounds__(DS_NT, 4) k_decode_stack(const __grid_constant__ cuk_dstack a) {
    __shared__ __align__(16) ds_smem<DT, DMAX, GH> sm;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = (int)gridDim.x * DS_NW, gw = (int)blockIdx.x * DS_NW + warp;
    const int64_t C = a.C, F = a.F, Hq = a.qk.H - a.v.H, D = a.qk.D, Hkv = a.v.H;
    uint4 A[8];
    const int64_t half = D / 2, Hr = a.qk.H; /* rotated heads: the queries' and the keys' */
    ds_mv mv = ds_mv_pairs(a.layer[0].qkv, Hr, half, C, gw, nw);
    ds_load(mv, 0, lane, A);
    for (int l = 0; l < a.L; l++) {
        const cuk_dlayer &ly = a.layer[l];
        /* 1. norm, QKV with RoPE and the cache write: the rotated heads' row pairs, then the values' rows */
        if (warp == 0) ds_norm<DT>(a.x, C, ly.ln1, a.wdt, a.eps, sm.xs, lane);
        __syncthreads();
        ds_run<DT>(mv, sm.xs, lane, A, [&](int o, float s1, float s2) { ds_rope_pair<DT>(a, ly, o, s1, s2); });
        /* value row 0 goes to the first warp with one pair fewer */
        mv = ds_mv_of((const uint16_t *)ly.qkv + Hr * D * C, nullptr, Hkv * D, C,
                      (gw + nw - (int)(Hr * half % nw)) % nw, nw);
        ds_load(mv, 0, lane, A);
        ds_run<DT>(mv, sm.xs, lane, A, [&](int o, float s, float) { ds_value_row<DT>(a, ly, o, s); });
        /* the output projection's rows start towards L2 */
        for (int64_t o = gw; o < C; o += nw) {
            const char *row = (const char *)ly.proj + o * Hq * D * 2;
            for (int64_t b = 128 * lane; b < Hq * D * 2; b += 128 * 32)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(row + b));
        }
        ds_sync(a.bar);
        /* 2. attention */
        ds_attention<DT, DMAX, GH>(a, ly, sm.pg);
        mv = ds_mv_of(ly.proj, nullptr, C, Hq * D, gw, nw);
        ds_load(mv, 0, lane, A);
        ds_sync(a.bar);
        /* 3. output projection + residual */
        ds_stage(sm.xs, a.att, Hq * D);
        __syncthreads();
        ds_run<DT>(mv, sm.xs, lane, A, [&](int o, float r, float) {
            float v = r + 0.0f;
            v += ds_ld1<DT>((const uint16_t *)a.x, o);
            cuk_st1<DT>(a.x, o, v);
        });
        mv = ds_mv_of(ly.gate, ly.up, F, C, gw, nw);
        ds_load(mv, 0, lane, A);
        ds_sync(a.bar);
        /* 4. norm, gate, up, SwiGLU */
        if (warp == 0) ds_norm<DT>(a.x, C, ly.ln2, a.wdt, a.eps, sm.xs, lane);
        __syncthreads();
        ds_run<DT>(mv, sm.xs, lane, A, [&](int o, float rg, float ru) {
            const float g = cuk_round16<DT>(rg), u = cuk_round16<DT>(ru);
            cuk_st1<DT>(a.act, o, g / (1.0f + expf(-g)) * u); /* swiglu_fwd's expression */
        });
        mv = ds_mv_of(ly.down, nullptr, C, F, gw, nw);
        ds_load(mv, 0, lane, A);
        ds_sync(a.bar);
        /* 5. down projection + residual */
        ds_stage(sm.xs, a.act, F);
        __syncthreads();
        ds_run<DT>(mv, sm.xs, lane, A, [&](int o, float r, float) {
            float v = r + 0.0f;
            v += ds_ld1<DT>((const uint16_t *)a.x, o);
            cuk_st1<DT>(a.x, o, v);
        });
        if (l + 1 < a.L) {
            mv = ds_mv_pairs(a.layer[l + 1].qkv, Hr, half, C, gw, nw);
            ds_load(mv, 0, lane, A);
        }
        ds_sync(a.bar);
    }
}

CUK_EMU_END(dstack);

/* ---------------------------------------------------------------- launch */

int cuk_decode_stack_fits(const cuk_dstack *a) {
    const int64_t Hkv = a->v.H, Hq = a->qk.H - Hkv, D = a->qk.D;
    if (a->dt != CUK_BF16 && a->dt != CUK_F16) return 0;
    if (a->L < 1 || a->L > CUK_DSTACK_MAX_LAYERS || Hkv < 1 || Hq < Hkv || Hq % Hkv != 0 || Hq / Hkv > 4) return 0;
    if (D % 8 != 0 || D > 128 || a->C % 8 != 0 || a->F % 8 != 0 || (Hq * D) % 8 != 0) return 0;
    if (a->C > DS_XS || a->F > DS_XS || Hq * D > DS_XS) return 0;
    if (a->cos.cols * 2 != D || a->cos.cols % 8 != 0) return 0;
    if (a->splits > 1 && (a->splits > CUK_PAGED_FUSE_SPLITS || !a->cnt || Hkv * a->nhc > a->n_cnt)) return 0;
    for (int l = 0; l < a->L; l++) {
        const cuk_dlayer *y = &a->layer[l];
        const void *ps[] = {y->qkv, y->proj, y->gate, y->up, y->down, y->kc, y->vc};
        for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++)
            if (!cuk_ptr16(ps[k])) return 0;
    }
    return cuk_ptr16(a->x) && cuk_ptr16(a->qkv) && cuk_ptr16(a->att) && cuk_ptr16(a->act);
}

template <int DT, int DMAX, int GH> static cudaError_t ds_launch(cudaStream_t s, const cuk_dstack &a) {
    auto kern = k_decode_stack<DT, DMAX, GH>;
    int occ = 0, dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, DS_NT, 0);
    if (e != cudaSuccess) return e;
    if (occ < 1) return cudaErrorLaunchOutOfResources;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3((unsigned)(occ * sms));
    cfg.blockDim = dim3(DS_NT);
    cfg.stream = s;
    at[0].id = cudaLaunchAttributeCooperative; /* every block resident: the grid barriers need it */
    at[0].val.cooperative = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, a);
}

/* Four query heads a block whatever the group: paged.cuh computes each head
 * alike for any GH (pg_u does not depend on it), so the results are those
 * of the separate kernel's choice, with one instantiation fewer to build. */
template <int DT> static cudaError_t ds_dim(cudaStream_t s, const cuk_dstack &a) {
    if (a.qk.D <= 64) return ds_launch<DT, 64, 4>(s, a);
    return ds_launch<DT, 128, 4>(s, a);
}

extern "C" cudaError_t cuk_decode_stack(cudaStream_t s, const cuk_dstack *a) {
    if (!cuk_decode_stack_fits(a)) return cudaErrorInvalidValue;
    return a->dt == CUK_BF16 ? ds_dim<CUK_BF16>(s, *a) : ds_dim<CUK_F16>(s, *a);
}
