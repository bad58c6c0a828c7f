/* The paged KV cache: the cache write and attention over it for a ragged
 * batch (prefill chunks and decode steps together), with any float dtype
 * for the cache and the activations; softmax statistics and accumulators
 * in f32.
 *
 * Attention, two kernels of one contract. Where q and the caches are both
 * bf16 or both f16 and D is 64 or 128, k_paged_tc (below) computes on the
 * tensor cores. Otherwise, on the CUDA cores: a block of 4 warps owns one
 * query token, one kv head and up to GH <= 4 of that head's query heads
 * (larger GQA groups take several blocks, which read the same rows from
 * L2; 8 heads in one block need too many registers to keep enough blocks
 * resident), so each K/V row read from the cache serves the group. Within
 * a warp, LPK = DMAX / 8 lanes share a key row, 8 dims each, and each lane
 * group keeps its own online softmax (max, sum, accumulators) over the
 * keys it visits, U keys per rescale. The groups merge through shuffles,
 * the warps through shared memory. Scores are kept in base 2 (q pre-scaled
 * by scale * log2 e).
 *
 * The CUDA-core kernels fetch rows two ways: where they are whole aligned 16-byte chunks
 * (D % 8 == 0, aligned caches), k_paged_pipe streams
 * tiles of keys into shared memory with cp.async, three tiles in flight, so
 * decode reads the cache at a good fraction of the memory bandwidth rather
 * than waiting on each load; k_paged, for the rest, loads into registers.
 *
 * Split-KV (flash-decoding): a decode token alone is one block per kv head,
 * far too few to read a long context at memory speed, so the keys of a
 * token are cut into chunks, one block each (grid.y), whose unnormalised
 * partials (max, sum, accumulators) go to the workspace. The last of a
 * token's splits to finish (a counter per block of the grid's x, which
 * that block sets back to 0) combines them, so a decode step has no merge
 * kernel; where the counters do not cover the grid, k_paged_reduce does.
 * The host picks the chunk from max_ctx and N (it cannot see ctx_len):
 * splits past a token's context exit at once.
 *
 * A call with prefill rows (more query rows than sequences) on the tensor
 * cores takes k_paged_prefill: tiles of a sequence's query tokens, each
 * K/V tile read once for a tile's rows. Elsewhere (the CUDA-core kernels)
 * prefill rows take a block per (token, kv head) that reads its whole
 * prefix, mostly from L2: exact, but a long prompt's keys are read once a
 * token. */
#include "cuda_common.cuh"
#include "mma.cuh"

CUK_EMU_BEGIN(paged);
#define PG_NW 4
#define PG_NT (PG_NW * 32)
#define PG_LOG2E 1.4426950408889634f
#define PG_FULL 0xffffffffu

/* Row i's sequence (the last s with q_start[s] <= i: a sequence without
 * queries starts where the next one does, and the next one wins) and the
 * number of keys it sees; false when the indices do not describe such a
 * row (reported when `report`). */
CUK_INLINE bool pg_locate(const cuk_paged &p, int64_t i, int64_t *s_out, int64_t *nk, bool report, cuk_errrec *err) {
    const int32_t *qs = p.qs;
    int64_t s, q0, ql, cl;
    /* a decode step: row i is sequence i's one query (three loads at once, not a search) */
    const int32_t a = i < p.S ? qs[i] : -1, b = i < p.S ? qs[i + 1] : -1, c = i < p.S ? p.cl[i] : 0;
    if (a == i && b == i + 1) {
        s = i, q0 = a, ql = 1, cl = c;
    } else {
        int64_t lo = 0, hi = p.S - 1;
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) >> 1;
            if (qs[mid] <= i) lo = mid;
            else hi = mid - 1;
        }
        s = lo, q0 = qs[s], ql = (int64_t)qs[s + 1] - q0, cl = p.cl[s];
    }
    const int64_t j = i - q0;
    *s_out = s;
    *nk = cl - ql + j + 1;
    if (j >= 0 && j < ql && ql <= cl && cl <= p.limit) return true;
    if (report) cuk_report(err, CUK_ERR_SEQ, s, ql, cl, p.limit);
    return false;
}

/* Elements [off, off + n) of a cache row chunk (n <= 8; the rest 0). */
template <int DT> CUK_INLINE void pg_ld(const void *base, int64_t off, int n, float *v) {
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = e < n ? cuk_ld1<DT>(base, off + e) : 0.0f;
}

/* ---------------------------------------------------------------- attention */

/* The block's place: token i, kv head g, the query heads [h0, h0 + nh) of
 * head chunk hc (blockIdx.x), keys [k0, k1) of split blockIdx.y. */
struct pg_task {
    int64_t i, g, h0, s, k0, k1, nk;
    int nh;
    bool ok;
};

template <int GH> CUK_INLINE pg_task pg_task_of(const cuk_paged &p, int64_t chunk, int nhc, cuk_errrec *err) {
    pg_task t;
    int64_t x = blockIdx.x;
    const int hc = (int)(x % nhc);
    x /= nhc;
    t.g = x % p.Hkv;
    t.i = x / p.Hkv;
    const int64_t G = p.q.H / p.Hkv, split = blockIdx.y;
    t.h0 = t.g * G + (int64_t)hc * GH;
    t.nh = (int)(G - (int64_t)hc * GH < GH ? G - (int64_t)hc * GH : GH);
    int64_t nk;
    t.ok = pg_locate(p, t.i, &t.s, &nk, threadIdx.x == 0 && split == 0 && t.g == 0 && hc == 0, err);
    t.nk = t.ok ? nk : 0;
    t.k0 = split * chunk;
    t.k1 = t.ok ? (t.k0 + chunk < nk ? t.k0 + chunk : nk) : 0;
    return t;
}

/* A block with no keys: with one split, the row of a bad sequence (zeros, as
 * reported); with several, a split past the context (nothing to leave). */
CUK_INLINE void pg_empty(const cuk_paged &p, const pg_task &t, int64_t splits, const unsigned *cnt) {
    /* merged in the kernel, a bad sequence's zeros come from its first split */
    if (splits != 1 && (!cnt || t.ok || blockIdx.y != 0)) return;
    cuk_pdl_wait();
    const int64_t D = p.q.D;
    for (int64_t e = threadIdx.x; e < t.nh * D; e += PG_NT)
        stf(p.o.p, p.o.dt, cuk_roff(p.o, 0, t.i, t.h0 + e / D) + e % D, 0.0f);
}

/* This lane's 8 dims of the block's query heads, pre-scaled into base 2. */
template <int GH> CUK_INLINE void pg_load_q(const cuk_paged &p, const pg_task &t, int d0, int nd, float (&qv)[GH][8]) {
    const float qscale = p.scale * PG_LOG2E;
#pragma unroll
    for (int h = 0; h < GH; h++) {
        const int64_t qo = h < t.nh ? cuk_roff(p.q, 0, t.i, t.h0 + h) + d0 : 0;
#pragma unroll
        for (int e = 0; e < 8; e++) qv[h][e] = h < t.nh && e < nd ? ldf(p.q.p, p.q.dt, qo + e) * qscale : 0.0f;
    }
}

/* A lane's query dims and an empty online softmax (no key seen). */
template <int GH>
CUK_INLINE void pg_start(const cuk_paged &p, const pg_task &t, int d0, int nd, float (&qv)[GH][8], float (&m)[GH],
                         float (&l)[GH], float (&acc)[GH][8]) {
    pg_load_q<GH>(p, t, d0, nd, qv);
#pragma unroll
    for (int h = 0; h < GH; h++) {
#pragma unroll
        for (int e = 0; e < 8; e++) acc[h][e] = 0.0f;
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
}

/* Score of one key per lane group for each head: the group's partial dots
 * summed over its LPK lanes (nh is the block's, so the shuffles stay
 * warp-uniform). */
template <int LPK, int GH>
CUK_INLINE void pg_scores(const float (&qv)[GH][8], const float (&k)[8], bool valid, int nh, float (&sc)[GH]) {
#pragma unroll
    for (int h = 0; h < GH; h++) {
        if (h >= nh) break;
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) d = fmaf(qv[h][e], k[e], d);
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(PG_FULL, d, o);
        sc[h] = valid ? d : -INFINITY;
    }
}

/* The online softmax step of a lane group over U keys at once (one rescale of the accumulators per U keys). */
template <int GH, int U>
CUK_INLINE void pg_update(const float (&sc)[U][GH], const float (&vv)[U][8], int nh, float (&m)[GH], float (&l)[GH],
                          float (&acc)[GH][8]) {
#pragma unroll
    for (int h = 0; h < GH; h++) {
        if (h >= nh) break;
        float mx = m[h];
#pragma unroll
        for (int u = 0; u < U; u++) mx = fmaxf(mx, sc[u][h]);
        if (mx == -INFINITY) continue; /* no key of this group yet */
        const float corr = exp2f(m[h] - mx);
        float pu[U], ps = 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            pu[u] = exp2f(sc[u][h] - mx);
            ps += pu[u];
        }
        l[h] = l[h] * corr + ps;
        m[h] = mx;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float a = acc[h][e] * corr;
#pragma unroll
            for (int u = 0; u < U; u++) a = fmaf(pu[u], vv[u][e], a);
            acc[h][e] = a;
        }
    }
}

/* Shared memory of the merge: per warp and head the accumulators, max and sum. */
template <int DMAX, int GH> __host__ __device__ constexpr int pg_merge_floats() { return PG_NW * GH * (DMAX + 2); }

/* The block's warps' states (sm: per warp and head the accumulators at
 * [(w GH + h) DMAX], the maxima at PG_NW GH DMAX + w GH + h, the sums
 * after them) combined: written to o when this split is the token's only
 * one (the merge leaves such a token alone: a batch of short contexts
 * skips it), else as the partial (row r = (i * Hq + hq) * splits + split:
 * acc at ws_acc[r * D], max and sum at ws_ml[2 r]). With counters (cnt),
 * the token's last split to finish merges the partials of the block's
 * heads. */
template <int DMAX, int GH>
CUK_INLINE void pg_combine(const cuk_paged &p, const pg_task &t, int64_t splits, int64_t chunk, float *sm,
                           float *ws_acc, float *ws_ml, unsigned *cnt) {
    static_assert(pg_merge_floats<DMAX, GH>() >= GH * (CUK_PAGED_FUSE_SPLITS + 1), "the merge's wt and inv fit in sm");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *sm_acc = sm, *sm_m = sm + PG_NW * GH * DMAX, *sm_l = sm_m + PG_NW * GH;
    __syncthreads();
    const int64_t D = p.q.D, Hq = p.q.H;
    for (int e = tid; e < t.nh * D; e += PG_NT) {
        const int h = (int)(e / D), d = (int)(e % D);
        float mx = -INFINITY, L = 0.0f, A = 0.0f;
#pragma unroll
        for (int w = 0; w < PG_NW; w++) mx = fmaxf(mx, sm_m[w * GH + h]);
        if (mx != -INFINITY)
#pragma unroll
            for (int w = 0; w < PG_NW; w++) {
                const float wt = exp2f(sm_m[w * GH + h] - mx);
                L += sm_l[w * GH + h] * wt;
                A += sm_acc[(w * GH + h) * DMAX + d] * wt;
            }
        const int64_t hq = t.h0 + h;
        if (splits == 1 || t.nk <= chunk) {
            stf(p.o.p, p.o.dt, cuk_roff(p.o, 0, t.i, hq) + d, L > 0.0f ? A / L : 0.0f);
        } else {
            const int64_t r = (t.i * Hq + hq) * splits + blockIdx.y;
            ws_acc[r * D + d] = A;
            if (d == 0) {
                ws_ml[2 * r] = mx;
                ws_ml[2 * r + 1] = L;
            }
        }
    }
    if (splits == 1 || t.nk <= chunk || !cnt) return;
    __shared__ int last;
    const int64_t ns = (t.nk + chunk - 1) / chunk; /* the splits that hold keys, this one among them */
    __threadfence();                               /* this block's partials before its count */
    __syncthreads();
    if (tid == 0) {
        last = atomicAdd(cnt + blockIdx.x, 1u) + 1 == (unsigned)ns;
        if (last) cnt[blockIdx.x] = 0u; /* every split has counted: ready for the next call */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* warp w weighs the splits of heads w, w + PG_NW, ... (no block barrier per head), then the block combines
     * the rows */
    constexpr int QL = CUK_PAGED_FUSE_SPLITS / 32;
    float *wt = sm, *inv = sm + GH * CUK_PAGED_FUSE_SPLITS;
    for (int h = warp; h < t.nh; h += PG_NW) {
        const int64_t r0 = (t.i * Hq + t.h0 + h) * splits;
        float mq[QL], lq[QL], mx = -INFINITY;
#pragma unroll
        for (int k = 0; k < QL; k++) {
            const int64_t q = lane + 32 * k;
            mq[k] = q < ns ? __ldcg(ws_ml + 2 * (r0 + q)) : -INFINITY;
            lq[k] = q < ns ? __ldcg(ws_ml + 2 * (r0 + q) + 1) : 0.0f;
            mx = fmaxf(mx, mq[k]);
        }
        mx = warp_max(mx);
        float L = 0.0f;
#pragma unroll
        for (int k = 0; k < QL; k++) {
            const float w = mx == -INFINITY || lane + 32 * k >= ns ? 0.0f : exp2f(mq[k] - mx);
            wt[h * CUK_PAGED_FUSE_SPLITS + lane + 32 * k] = w;
            L += lq[k] * w;
        }
        L = warp_sum(L);
        if (lane == 0) inv[h] = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    for (int e = tid; e < t.nh * D; e += PG_NT) {
        const int h = (int)(e / D), d = (int)(e % D);
        const int64_t r0 = (t.i * Hq + t.h0 + h) * splits;
        float A = 0.0f;
        for (int64_t q = 0; q < ns; q++)
            A = fmaf(__ldcg(ws_acc + (r0 + q) * D + d), wt[h * CUK_PAGED_FUSE_SPLITS + q], A);
        stf(p.o.p, p.o.dt, cuk_roff(p.o, 0, t.i, t.h0 + h) + d, A * inv[h]);
    }
}

/* Merge the lane groups of each warp (shuffles), then the warps (through
 * sm, which the caller has finished with: pg_combine). */
template <int DMAX, int GH>
CUK_INLINE void pg_finish(const cuk_paged &p, const pg_task &t, int64_t splits, int64_t chunk, float *sm,
                          float (&m)[GH], float (&l)[GH], float (&acc)[GH][8], float *ws_acc, float *ws_ml,
                          unsigned *cnt) {
    constexpr int LPK = DMAX / 8;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, kg = lane / LPK, d0 = (lane % LPK) * 8;
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1)
#pragma unroll
        for (int h = 0; h < GH; h++) {
            const float mo = __shfl_xor_sync(PG_FULL, m[h], o), lo = __shfl_xor_sync(PG_FULL, l[h], o);
            float ao[8];
#pragma unroll
            for (int e = 0; e < 8; e++) ao[e] = __shfl_xor_sync(PG_FULL, acc[h][e], o);
            const float mx = fmaxf(m[h], mo);
            if (mx != -INFINITY) {
                const float wa = exp2f(m[h] - mx), wb = exp2f(mo - mx);
                l[h] = l[h] * wa + lo * wb;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[h][e] = acc[h][e] * wa + ao[e] * wb;
                m[h] = mx;
            }
        }
    float *sm_acc = sm, *sm_m = sm + PG_NW * GH * DMAX, *sm_l = sm_m + PG_NW * GH;
    if (kg == 0) {
#pragma unroll
        for (int h = 0; h < GH; h++) {
#pragma unroll
            for (int e = 0; e < 8; e++) sm_acc[(warp * GH + h) * DMAX + d0 + e] = acc[h][e];
            if (d0 == 0) {
                sm_m[warp * GH + h] = m[h];
                sm_l[warp * GH + h] = l[h];
            }
        }
    }
    pg_combine<DMAX, GH>(p, t, splits, chunk, sm, ws_acc, ws_ml, cnt);
}

/* The cache row of key position j of sequence s, kv head g (element
 * offset), or -1 for a block id outside the pool (reported when `report`). */
CUK_INLINE int64_t pg_row_of(const cuk_paged &p, const int32_t *bt, int64_t s, int64_t g, int64_t j, int bs_log2,
                             bool report, cuk_errrec *err) {
    const int bs = (int)p.bs, jj = (int)j, bi = bs_log2 >= 0 ? jj >> bs_log2 : jj / bs;
    const int32_t blk = bt[bi];
    if (blk < 0 || blk >= p.n_blocks) {
        if (report) cuk_report(err, CUK_ERR_BLOCK, s, bi, blk, p.n_blocks);
        return -1;
    }
    return (((int64_t)blk * bs + (jj - bi * bs)) * p.Hkv + g) * p.q.D;
}

/* The key loop of the tiled kernels: tiles of TK keys' K and V rows stream
 * into shared memory with cp.async, NS tiles in flight, and body(st, fl)
 * runs on each in order (st: the stage's K rows at ROWB-byte strides, its
 * V rows TK * ROWB bytes after them; fl: a flag per row, 0 for a key past
 * the block's range or in a bad block, whose row is zeros). Tile n goes to
 * stage n % NS. This thread copies the 16-byte chunks tid + NT k of each
 * tile (the first dchunks of a row: dims past D are never read), whose
 * block ids it reads a tile ahead, so that a tile's copies never wait for
 * the block table. start() runs once, after the first tile's block ids are
 * read and the predecessor is waited for (cuk_pdl_wait), before any copy.
 * On return the stages are free for other use. */
template <int ES, int TK, int ROWB, int NS, class Start, class Body>
CUK_INLINE void pg_stream(const cuk_paged &p, const pg_task &t, int bs_log2, char *tiles, int *flags, cuk_errrec *err,
                          Start start, Body body) {
    constexpr int CPR = ROWB / 16 < 1 ? 1 : ROWB / 16, LPT = (TK * CPR + PG_NT - 1) / PG_NT, STAGEB = 2 * TK * ROWB;
    const int tid = threadIdx.x, bs = (int)p.bs, dchunks = (int)(p.q.D * ES / 16);
    const int64_t D = p.q.D;
    const int32_t *bt = p.bt + t.s * p.max_blocks;
    const int ntiles = (int)((t.k1 - t.k0 + TK - 1) / TK);
    int32_t nb[LPT];
    auto fetch = [&](int n) {
#pragma unroll
        for (int k = 0; k < LPT; k++) {
            const int c = tid + PG_NT * k;
            const int j = (int)(t.k0 + n * TK) + c / CPR;
            nb[k] = c < TK * CPR && j < t.k1 ? bt[bs_log2 >= 0 ? j >> bs_log2 : j / bs] : -1;
        }
    };
    auto issue = [&](int n) {
        char *st = tiles + (n % NS) * STAGEB;
        int *fl = flags + (n % NS) * TK;
#pragma unroll
        for (int k = 0; k < LPT; k++) {
            const int c = tid + PG_NT * k, r = c / CPR, cc = c % CPR;
            if (c >= TK * CPR || cc >= dchunks) continue;
            const int j = (int)(t.k0 + n * TK) + r; /* 32-bit: no 64-bit division per copy */
            const int32_t blk = nb[k];
            bool good = j < t.k1;
            if (good && (blk < 0 || blk >= p.n_blocks)) {
                if (cc == 0) cuk_report(err, CUK_ERR_BLOCK, t.s, j / bs, blk, p.n_blocks);
                good = false;
            }
            char *dk = st + r * ROWB + cc * 16, *dv = dk + TK * ROWB;
            if (good) {
                const int jo = bs_log2 >= 0 ? j & (bs - 1) : j % bs;
                const int64_t row = (((int64_t)blk * bs + jo) * p.Hkv + t.g) * D;
                mma_cp16(dk, (const char *)p.kc + row * ES + cc * 16);
                mma_cp16(dv, (const char *)p.vc + row * ES + cc * 16);
            } else {
                *(uint4 *)dk = make_uint4(0u, 0u, 0u, 0u);
                *(uint4 *)dv = make_uint4(0u, 0u, 0u, 0u);
            }
            if (cc == 0) fl[r] = good;
        }
    };
    fetch(0);
    /* launched as a programmatic dependent of the cache write: q and the caches are its to write, the indices the
     * host's */
    cuk_pdl_wait();
    start();
#pragma unroll
    for (int n = 0; n < NS - 1; n++) {
        if (n > 0) fetch(n);
        if (n < ntiles) issue(n);
        mma_commit();
    }
    fetch(NS - 1);
    for (int n = 0; n < ntiles; n++) {
        __syncthreads(); /* every warp is done with the stage the next copies refill */
        if (n + NS - 1 < ntiles) issue(n + NS - 1);
        fetch(n + NS);
        mma_commit();
        mma_wait<NS - 1>();
        __syncthreads(); /* tile n, its zeros and flags, visible to all */
        body((const char *)(tiles + (n % NS) * STAGEB), (const int *)(flags + (n % NS) * TK));
    }
    mma_wait<0>();
    __syncthreads();
}

/* The fast path, for cache rows that are whole 16-byte chunks (D % 8 == 0,
 * 16-byte aligned caches): pg_stream's tiles, so the loads of later tiles
 * overlap the arithmetic on this one and no registers wait on them. Lane
 * group kg of warp w takes rows kg + KPW (w + NW u), u < U, of each tile. */
template <int DT> __host__ __device__ constexpr int pg_es() { return DT == CUK_F32 ? 4 : 2; }
template <int DT> __host__ __device__ constexpr int pg_u() { return DT == CUK_F32 ? 1 : 2; }
template <int DT, int DMAX> __host__ __device__ constexpr int pg_tk() { return PG_NW * (32 / (DMAX / 8)) * pg_u<DT>(); }
#define PG_NS 3
template <int DT, int DMAX, int GH> __host__ __device__ constexpr int pg_pipe_bytes() {
    return PG_NS * 2 * pg_tk<DT, DMAX>() * DMAX * pg_es<DT>() > pg_merge_floats<DMAX, GH>() * 4
               ? PG_NS * 2 * pg_tk<DT, DMAX>() * DMAX * pg_es<DT>()
               : pg_merge_floats<DMAX, GH>() * 4;
}

/* Four blocks an SM (at most 128 registers a thread, U = 2): the score
 * and softmax steps are latency-bound, so residency beats a longer U (64
 * bf16 decodes over 2000 keys, GQA 4, on an H200: 1.2 TB/s from the cache
 * with U = 3 at three blocks an SM, 1.4 TB/s like this). */
template <int DT, int DMAX, int GH>
__global__ void __launch_bounds__(PG_NT, 4)
    k_paged_pipe(cuk_paged p, int64_t splits, int64_t chunk, int nhc, int bs_log2, float *ws_acc, float *ws_ml,
                 unsigned *cnt, cuk_errrec *err) {
    constexpr int ES = pg_es<DT>(), U = pg_u<DT>(), LPK = DMAX / 8, KPW = 32 / LPK, TK = pg_tk<DT, DMAX>();
    constexpr int ROWB = DMAX * ES; /* bytes of a row in the tiles */
    __shared__ float4 smem[pg_pipe_bytes<DT, DMAX, GH>() / 16];
    __shared__ int flags[PG_NS][TK];
    char *tiles = (char *)smem;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kg = lane / LPK, dl = lane % LPK;
    cuk_pdl_trigger(); /* the output projection starts its weight reads now (gemv.cu) */
    const pg_task t = pg_task_of<GH>(p, chunk, nhc, err);
    if (t.k0 >= t.k1) {
        pg_empty(p, t, splits, cnt);
        return;
    }
    const int64_t D = p.q.D;
    const int d0 = dl * 8, nd = D - d0 >= 8 ? 8 : 0; /* D % 8 == 0 here */
    float qv[GH][8], acc[GH][8], m[GH], l[GH];
    auto start = [&] { pg_start<GH>(p, t, d0, nd, qv, m, l, acc); };
    auto tile = [&](const char *st, const int *fl) {
        float sc[U][GH], vv[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int r = kg + KPW * (warp + PG_NW * u);
            float kk[8];
            if (nd) {
                cuk_ld8<DT>(st + r * ROWB, d0, kk);
                cuk_ld8<DT>(st + TK * ROWB + r * ROWB, d0, vv[u]);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) kk[e] = vv[u][e] = 0.0f;
            }
            pg_scores<LPK, GH>(qv, kk, fl[r] != 0, t.nh, sc[u]);
        }
        pg_update<GH, U>(sc, vv, t.nh, m, l, acc);
    };
    pg_stream<ES, TK, ROWB, PG_NS>(p, t, bs_log2, tiles, &flags[0][0], err, start, tile);
    /* the tiles are done with: the merge reuses their memory */
    pg_finish<DMAX, GH>(p, t, splits, chunk, (float *)smem, m, l, acc, ws_acc, ws_ml, cnt);
}

/* The general path (any D, unaligned caches): each lane group loads its
 * keys' row chunks straight into registers, U keys before any is used. */
template <int DT, int DMAX, int GH, int U>
__global__ void __launch_bounds__(PG_NT) k_paged(cuk_paged p, int64_t splits, int64_t chunk, int nhc, int bs_log2,
                                                 float *ws_acc, float *ws_ml, unsigned *cnt, cuk_errrec *err) {
    constexpr int LPK = DMAX / 8, KPW = 32 / LPK, STEP = PG_NW * KPW * U;
    __shared__ float sm[pg_merge_floats<DMAX, GH>()];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, kg = lane / LPK, dl = lane % LPK;
    cuk_pdl_trigger();
    const pg_task t = pg_task_of<GH>(p, chunk, nhc, err);
    if (t.k0 >= t.k1) {
        pg_empty(p, t, splits, cnt);
        return;
    }
    const int64_t D = p.q.D;
    const int d0 = dl * 8;
    const int nd = D - d0 >= 8 ? 8 : D - d0 > 0 ? (int)(D - d0) : 0;
    float qv[GH][8], acc[GH][8], m[GH], l[GH];
    pg_start<GH>(p, t, d0, nd, qv, m, l, acc);
    const int32_t *bt = p.bt + t.s * p.max_blocks;
    for (int64_t jb = t.k0; jb < t.k1; jb += STEP) {
        float kk[U][8], vv[U][8];
        bool valid[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t j = jb + (u * PG_NW + warp) * KPW + kg;
            const int64_t row = j < t.k1 ? pg_row_of(p, bt, t.s, t.g, j, bs_log2, dl == 0, err) : -1;
            valid[u] = row >= 0;
            pg_ld<DT>(p.kc, row + d0, valid[u] ? nd : 0, kk[u]);
            pg_ld<DT>(p.vc, row + d0, valid[u] ? nd : 0, vv[u]);
        }
        float sc[U][GH];
#pragma unroll
        for (int u = 0; u < U; u++) pg_scores<LPK, GH>(qv, kk[u], valid[u], t.nh, sc[u]);
        pg_update<GH, U>(sc, vv, t.nh, m, l, acc);
    }
    pg_finish<DMAX, GH>(p, t, splits, chunk, sm, m, l, acc, ws_acc, ws_ml, cnt);
}

/* The tensor-core path (16-bit q and caches, D 64 or 128): a block owns one
 * query token, one kv head and up to 16 of its query heads, which are the
 * rows of the m16n8k16 products (rows past the group are zeros): S = Q K^T
 * and O += P V as in attention_flash.cu, so a key costs the block two mma
 * per 16 dims instead of a lane group's dot products and shuffles per
 * head. Tiles of PGT_TK keys stream into padded shared memory (row stride
 * D + 8: the 8 row addresses of an ldmatrix hit distinct banks) with
 * cp.async, PGT_NS tiles in flight; warp w takes keys [16 w, 16 w + 16) of
 * each tile and keeps its own online softmax (rows g and g + 8 per lane,
 * the max agreed within a quad) in the accumulator layout. Scores are
 * scaled by scale * log2 e in f32 after the product (q enters the mma as
 * it is); P is rounded to q's type for P V, as flash attention does. The
 * warps meet in pg_combine, whose splits and merge are the CUDA-core
 * kernels'. */
#define PGT_TK 64
#define PGT_NS 2
template <int D> __host__ __device__ constexpr int pgt_tile_bytes() { return PGT_NS * 2 * PGT_TK * (D + 8) * 2; }
template <int D> __host__ __device__ constexpr int pgt_smem() {
    return pgt_tile_bytes<D>() + PGT_NS * PGT_TK * 4 > pg_merge_floats<D, CUK_PAGED_TC_HEADS>() * 4
               ? pgt_tile_bytes<D>() + PGT_NS * PGT_TK * 4
               : pg_merge_floats<D, CUK_PAGED_TC_HEADS>() * 4;
}

/* Q as the A operand of a warp's rows g and g + 8 (the lane's rows at
 * element offsets r0 and r1 of q; -1: a row of zeros), dims 2 tq (+ 8) of
 * each 16, and its accumulators and softmax state cleared. */
template <int KC, int ND>
CUK_INLINE void pgt_begin(uint32_t (&qa)[KC][4], float (&acc)[ND][4], float (&m)[2], float (&l)[2], const e16 *q,
                          int64_t r0, int64_t r1, int tq) {
#pragma unroll
    for (int kk = 0; kk < KC; kk++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t r = e & 1 ? r1 : r0;
            qa[kk][e] = r >= 0 ? *(const uint32_t *)(q + r + kk * 16 + (e >> 1) * 8 + 2 * tq) : 0u;
        }
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
}

/* A warp's scores for NP pairs of 8-key n-tiles over MT m-tiles of 16
 * rows: s = Q K^T, Q as the A fragments qa (KC chunks of 16 dims), the
 * keys' rows at ks (stride LD). A key fragment loaded once serves every
 * m-tile. */
template <bool F16, int LD, int KC, int NP, int MT>
CUK_INLINE void pgt_scores(float (&s)[MT][2 * NP][4], const uint32_t (&qa)[MT][KC][4], const e16 *ks, int lane) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2 * NP; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KC; kk++)
#pragma unroll
        for (int np = 0; np < NP; np++) {
            uint32_t b[4];
            mma_ldb_nk<LD>(b, ks + np * 16 * LD + kk * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816<F16>(s[mt][2 * np], qa[mt][kk], b[0], b[1]);
                mma_16816<F16>(s[mt][2 * np + 1], qa[mt][kk], b[2], b[3]);
            }
        }
}

/* One tile's step of an m-tile's online softmax: s holds the scores in
 * base 2 (rows g and g + 8 of the lane, -inf where masked); the rows' max
 * is agreed within the quad, m, l and acc are rescaled, and s becomes P. */
template <int ND, int NT>
CUK_INLINE void pgt_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&acc)[ND][4]) {
    float mx[2] = {-INFINITY, -INFINITY}, corr[2];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(PG_FULL, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(PG_FULL, mx[r], 2));
        const float mn = fmaxf(m[r], mx[r]); /* -inf while the row has seen no key */
        corr[r] = mn == -INFINITY ? 1.0f : mma_ex2(m[r] - mn);
        m[r] = mn;
        l[r] *= corr[r];
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1;
            const float pr = m[r] == -INFINITY ? 0.0f : mma_ex2(s[nt][e] - m[r]);
            s[nt][e] = pr;
            l[r] += pr;
        }
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] *= corr[e >> 1];
}

/* O += P V over MT m-tiles: P as f32 n-tiles rounded to the input type,
 * the tile's V rows at vs (stride LD); a V fragment loaded once serves
 * every m-tile. */
template <bool F16, int LD, int ND, int NT, int MT>
CUK_INLINE void pgt_pv(float (&acc)[MT][ND][4], const float (&pr)[MT][NT][4], const e16 *vs, int lane) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) mma_acc_to_a<F16>(a[mt], pr[mt][2 * kk], pr[mt][2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < ND / 2; dp++) {
            uint32_t b[4];
            mma_ldb_kn<LD>(b, vs + kk * 16 * LD + dp * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816<F16>(acc[mt][2 * dp], a[mt], b[0], b[1]);
                mma_16816<F16>(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

template <int D, bool F16>
__global__ void __launch_bounds__(PG_NT, D <= 64 ? 4 : 3)
    k_paged_tc(cuk_paged p, int64_t splits, int64_t chunk, int nhc, int bs_log2, float *ws_acc, float *ws_ml,
               unsigned *cnt, cuk_errrec *err) {
    constexpr int GH = CUK_PAGED_TC_HEADS, LD = D + 8, TK = PGT_TK, KC = D / 16, ND = D / 8;
    static_assert(TK == 16 * PG_NW, "a warp's 16 keys a tile");
    extern __shared__ __align__(16) unsigned char pgt_sm[];
    e16 *tiles = (e16 *)pgt_sm;
    int *flags = (int *)(pgt_sm + pgt_tile_bytes<D>());
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    cuk_pdl_trigger(); /* the output projection starts its weight reads now (gemv.cu) */
    const pg_task t = pg_task_of<GH>(p, chunk, nhc, err);
    if (t.k0 >= t.k1) {
        pg_empty(p, t, splits, cnt);
        return;
    }
    const float sl2 = p.scale * PG_LOG2E;
    float acc[1][ND][4], m[2], l[2];
    uint32_t qa[1][KC][4]; /* rows g and g + 8 of the block's heads */
    auto start = [&] {
        pgt_begin(qa[0], acc[0], m, l, (const e16 *)p.q.p, g < t.nh ? cuk_roff(p.q, 0, t.i, t.h0 + g) : -1,
                  g + 8 < t.nh ? cuk_roff(p.q, 0, t.i, t.h0 + g + 8) : -1, tq);
    };
    auto tile = [&](const char *st, const int *fl) {
        const e16 *ks = (const e16 *)st + 16 * warp * LD, *vs = ks + TK * LD;
        fl += 16 * warp;
        float s[1][2][4];
        pgt_scores<F16, LD, KC, 1, 1>(s, qa, ks, lane);
        /* s[nt][e]: head row g + 8 (e >> 1), key 8 nt + 2 tq + (e & 1) of the warp's 16 */
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[0][nt][e] = fl[8 * nt + 2 * tq + (e & 1)] ? s[0][nt][e] * sl2 : -INFINITY;
        pgt_softmax<ND, 2>(s[0], m, l, acc[0]);
        pgt_pv<F16, LD, ND, 2, 1>(acc, s, vs, lane);
    };
    pg_stream<2, TK, 2 * LD, PGT_NS>(p, t, bs_log2, (char *)tiles, flags, err, start, tile);
    /* the tiles are done with: the merge reuses their memory */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(PG_FULL, l[r], 1);
        l[r] += __shfl_xor_sync(PG_FULL, l[r], 2);
    }
    float *sm = (float *)pgt_sm, *sm_m = sm + PG_NW * GH * D, *sm_l = sm_m + PG_NW * GH;
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) sm[(warp * GH + g + 8 * (e >> 1)) * D + 8 * n + 2 * tq + (e & 1)] = acc[0][n][e];
    if (tq == 0)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            sm_m[warp * GH + g + 8 * r] = m[r];
            sm_l[warp * GH + g + 8 * r] = l[r];
        }
    pg_combine<D, GH>(p, t, splits, chunk, sm, ws_acc, ws_ml, cnt);
}

/* Prefill on the tensor cores (k_paged_prefill): tiles of query rows. A
 * block owns one kv head and pgp_rows (query token, query head) rows of
 * one sequence: TQ = pgp_rows / G consecutive query tokens with all G
 * heads of the group, token-major, as the rows of mma.m16n8k16. Each K/V
 * tile read from the cache then serves TQ tokens, where a block a token
 * reads the prefix TQ times over: a prompt's bytes read grow with the
 * square of its length, as its work does, but TQ times fewer.
 * Warp w takes MT m-tiles of 16 rows, [16 (w + PG_NW mt), + 16): a key or
 * V fragment read from shared memory serves all of them, and every warp
 * has rows near the diagonal. At head_dim 128 the accumulators of two
 * m-tiles would not fit the registers: one. Each warp takes every key of
 * each tile, with the online softmax and the fragment helpers of
 * k_paged_tc; it masks only a tile that reaches past its first row's
 * keys or holds a bad block, and skips the tiles past its last row's.
 * Tiles run last first, so the longest start first. No splits: a
 * prefill's grid has tiles enough. */
template <int D> __host__ __device__ constexpr int pgp_mt() { return D <= 64 ? 2 : 1; }
template <int D> __host__ __device__ constexpr int pgp_rows() { return 16 * PG_NW * pgp_mt<D>(); }
static_assert(pgp_rows<128>() >= CUK_PAGED_PREFILL_ROWS && pgp_rows<64>() >= CUK_PAGED_PREFILL_ROWS,
              "a block takes every head of a group the host sends here");

/* This block's sequence and first query token: tile b of the batch,
 * counting ceil(ql / TQ) tiles a sequence in order, b = the grid's last
 * block first. q_start lives on the device, so the block scans it (a pass
 * over PG_NT sequences at a time). False past the last tile. */
CUK_INLINE bool pgp_tile(const cuk_paged &p, int TQ, int64_t *s_out, int64_t *j0_out) {
    __shared__ int sc[2][PG_NT];
    __shared__ int64_t hit[2];
    const int tid = threadIdx.x;
    const int64_t b = (int64_t)gridDim.x - 1 - blockIdx.x;
    int64_t base = 0; /* tiles of the sequences before this pass */
    if (tid == 0) hit[0] = -1;
    for (int64_t s0 = 0; s0 < p.S; s0 += PG_NT) {
        const int64_t s = s0 + tid;
        const int ql = s < p.S ? p.qs[s + 1] - p.qs[s] : 0, n = ql > 0 ? (ql + TQ - 1) / TQ : 0;
        /* inclusive scan of n over the pass (Hillis-Steele, double-buffered) */
        int cur = 0;
        sc[0][tid] = n;
        __syncthreads();
        for (int o = 1; o < PG_NT; o <<= 1) {
            sc[cur ^ 1][tid] = sc[cur][tid] + (tid >= o ? sc[cur][tid - o] : 0);
            cur ^= 1;
            __syncthreads();
        }
        const int64_t incl = base + sc[cur][tid], excl = incl - n;
        if (n > 0 && b >= excl && b < incl) hit[0] = s, hit[1] = (b - excl) * TQ;
        base += sc[cur][PG_NT - 1];
        __syncthreads(); /* hit[] and the pass's total seen by all before sc is reused */
        if (hit[0] >= 0 || b < base) break;
    }
    __syncthreads();
    *s_out = hit[0];
    *j0_out = hit[1];
    return hit[0] >= 0;
}

template <int D> __host__ __device__ constexpr int pgp_smem() { return pgt_tile_bytes<D>() + PGT_NS * PGT_TK * 4; }

template <int D, bool F16>
__global__ void __launch_bounds__(PG_NT, 2) k_paged_prefill(cuk_paged p, int bs_log2, cuk_errrec *err) {
    constexpr int LD = D + 8, TK = PGT_TK, KC = D / 16, ND = D / 8, MT = pgp_mt<D>();
    static_assert(TK == 64, "a tile is 8 n-tiles of keys, two per lane");
    extern __shared__ __align__(16) unsigned char pgt_sm[];
    e16 *tiles = (e16 *)pgt_sm;
    int *flags = (int *)(pgt_sm + pgt_tile_bytes<D>());
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    cuk_pdl_trigger();
    const int G = (int)(p.q.H / p.Hkv);
    const int TQ = pgp_rows<D>() / G;
    pg_task t;
    if (!pgp_tile(p, TQ, &t.s, &t.i)) return;
    const int64_t q0 = p.qs[t.s];
    const int ql = p.qs[t.s + 1] - p.qs[t.s], cl = p.cl[t.s], j0 = (int)t.i;
    const int tok_end = j0 + TQ < ql ? j0 + TQ : ql; /* the tile's tokens: [j0, tok_end) */
    t.g = blockIdx.y;
    t.h0 = t.g * G;
    t.nh = G;
    t.i = q0 + j0;
    if (!(ql <= cl && cl <= p.limit)) { /* zero rows, as the decode kernels leave a bad sequence */
        if (j0 == 0 && t.g == 0 && threadIdx.x == 0) cuk_report(err, CUK_ERR_SEQ, t.s, ql, cl, p.limit);
        for (int64_t e = threadIdx.x; e < (int64_t)(tok_end - j0) * G * D; e += PG_NT)
            stf(p.o.p, p.o.dt, cuk_roff(p.o, 0, t.i + e / (G * D), t.h0 + e / D % G) + e % D, 0.0f);
        return;
    }
    t.ok = true;
    t.k0 = 0;
    t.k1 = t.nk = cl - ql + tok_end; /* the last token's keys */
    /* a row's token; ok: a row of this tile; sees: the keys its token sees */
    auto tok_of = [&](int row) { return row / G; };
    auto ok = [&](int row) { return tok_of(row) < TQ && j0 + tok_of(row) < ql; };
    auto sees = [&](int row) { return cl - ql + j0 + tok_of(row) + 1; };
    /* this lane's rows g and g + 8 of each m-tile */
    int64_t qo[MT][2];
    int lim[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = 16 * (warp + PG_NW * mt) + g + 8 * r;
            qo[mt][r] = ok(row) ? cuk_roff(p.q, 0, t.i + tok_of(row), t.h0 + row % G) : -1;
            lim[mt][r] = ok(row) ? sees(row) : 0;
        }
    /* the warp's rows grow with their token: wl, the keys its last valid row sees; wmin, those every row sees */
    const int r_first = 16 * warp, r_last = 16 * (warp + PG_NW * (MT - 1)) + 15;
    int last = r_last < TQ * G ? r_last : TQ * G - 1;
    if (j0 + tok_of(last) >= ql) last = (ql - 1 - j0) * G;
    const int wl = ok(r_first) ? sees(last) : 0, wmin = ok(r_last) ? sees(r_first) : 0;
    const float sl2 = p.scale * PG_LOG2E;
    float acc[MT][ND][4], m[MT][2], l[MT][2];
    uint32_t qa[MT][KC][4];
    auto start = [&] {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            pgt_begin(qa[mt], acc[mt], m[mt], l[mt], (const e16 *)p.q.p, qo[mt][0], qo[mt][1], tq);
    };
    int kb = 0; /* the tile's first key */
    auto tile = [&](const char *st, const int *fl) {
        const int k0 = kb;
        kb += TK;
        if (k0 >= wl) return; /* none of the warp's rows sees this tile's keys */
        const e16 *ks = (const e16 *)st, *vs = ks + TK * LD;
        float s[MT][8][4];
        pgt_scores<F16, LD, KC, 4, MT>(s, qa, ks, lane);
        /* s[mt][nt][e]: row g + 8 (e >> 1) of m-tile mt, key 8 nt + 2 tq + (e & 1) of the tile */
        if (__all_sync(PG_FULL, fl[lane] && fl[lane + 32]) && k0 + TK <= wmin) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mt][nt][e] *= sl2;
        } else {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int kt = 8 * nt + 2 * tq + (e & 1);
                        s[mt][nt][e] = fl[kt] && k0 + kt < lim[mt][e >> 1] ? s[mt][nt][e] * sl2 : -INFINITY;
                    }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) pgt_softmax<ND, 8>(s[mt], m[mt], l[mt], acc[mt]);
        pgt_pv<F16, LD, ND, 8, MT>(acc, s, vs, lane);
    };
    pg_stream<2, TK, 2 * LD, PGT_NS>(p, t, bs_log2, (char *)tiles, flags, err, start, tile);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(PG_FULL, lr, 1);
            lr += __shfl_xor_sync(PG_FULL, lr, 2);
            l[mt][r] = lr > 0.0f ? 1.0f / lr : 0.0f;
        }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < ND; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (qo[mt][e >> 1] >= 0) {
                    const int row = 16 * (warp + PG_NW * mt) + g + 8 * (e >> 1);
                    stf(p.o.p, p.o.dt, cuk_roff(p.o, 0, t.i + tok_of(row), t.h0 + row % G) + 8 * n + 2 * tq + (e & 1),
                        acc[mt][n][e] * l[mt][e >> 1]);
                }
}

/* One block per (token, query head): the splits that saw keys, combined
 * with weights exp2(max_p - max), one per split in shared memory. */
__global__ void __launch_bounds__(PG_NT)
    k_paged_reduce(cuk_paged p, int64_t splits, int64_t chunk, const float *ws_acc, const float *ws_ml) {
    __shared__ float wt[CUK_PAGED_MAX_SPLITS];
    __shared__ float red[32];
    cuk_pdl_trigger(); /* the output projection starts its weight reads now (gemv.cu) */
    const int tid = threadIdx.x;
    const int64_t Hq = p.q.H, D = p.q.D, i = blockIdx.x / Hq, h = blockIdx.x % Hq, o0 = cuk_roff(p.o, 0, i, h);
    int64_t s, nk;
    if (!pg_locate(p, i, &s, &nk, false, nullptr)) {
        for (int64_t d = tid; d < D; d += PG_NT) stf(p.o.p, p.o.dt, o0 + d, 0.0f);
        return;
    }
    const int64_t ns = (nk + chunk - 1) / chunk < splits ? (nk + chunk - 1) / chunk : splits;
    if (ns <= 1) return; /* written by its one split */
    const int64_t r0 = (i * Hq + h) * splits;
    float mx = -INFINITY;
    for (int64_t q = tid; q < ns; q += PG_NT) mx = fmaxf(mx, ws_ml[2 * (r0 + q)]);
    mx = block_max(mx, red);
    float L = 0.0f;
    for (int64_t q = tid; q < ns; q += PG_NT) {
        const float w = mx == -INFINITY ? 0.0f : exp2f(ws_ml[2 * (r0 + q)] - mx);
        wt[q] = w;
        L += ws_ml[2 * (r0 + q) + 1] * w;
    }
    L = block_sum(L, red); /* its barriers also publish wt */
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int64_t d = tid; d < D; d += PG_NT) {
        float A = 0.0f;
        for (int64_t q = 0; q < ns; q++) A = fmaf(ws_acc[(r0 + q) * D + d], wt[q], A);
        stf(p.o.p, p.o.dt, o0 + d, A * inv);
    }
}

CUK_EMU_END(paged);

/* ---------------------------------------------------------------- cache write */

__global__ void k_kv_cache_write(void *kc, void *vc, int cdt, int64_t n_slots, cuk_bthd k, cuk_bthd v,
                                 const int32_t *slots, cuk_errrec *err) {
    const int64_t H = k.H, D = k.D;
    CUK_FOR_RC(k.T * H, D) {
        const int64_t i = r / H, h = r % H, slot = slots[i];
        if (slot < 0) continue;
        if (slot >= n_slots) {
            if (h == 0 && c == 0) cuk_report(err, CUK_ERR_SLOT, i, slot, n_slots, 0);
            continue;
        }
        const int64_t dst = (slot * H + h) * D + c;
        stf(kc, cdt, dst, ldf(k.p, k.dt, cuk_roff(k, 0, i, h) + c));
        stf(vc, cdt, dst, ldf(v.p, v.dt, cuk_roff(v, 0, i, h) + c));
    }
}

extern "C" cudaError_t cuk_kv_cache_write(cudaStream_t s, void *kc, void *vc, int cdt, int64_t n_slots, cuk_bthd k,
                                          cuk_bthd v, const int32_t *slots, cuk_errrec *err) {
    if (k.T <= 0 || k.H <= 0 || k.D <= 0) return cudaSuccess;
    k_kv_cache_write<<<cuk_rows_grid(k.T * k.H, k.D, 128), 128, 0, s>>>(kc, vc, cdt, n_slots, k, v, slots, err);
    return cudaGetLastError();
}

/* A shift instead of a division per key where the block size is a power of two (else -1). */
static int pg_bs_log2(int64_t bs) {
    if ((bs & (bs - 1)) != 0) return -1;
    int b = 0;
    while ((1ll << b) < bs) b++;
    return b;
}

/* The grid (a column per token, kv head and chunk of heads, a row per split), the workspace's partials and the
 * counters of the in-kernel merge (NULL where they do not cover the grid's columns: k_paged_reduce merges). */
struct pg_grid {
    dim3 grid;
    int nhc;
    float *ws_acc, *ws_ml;
    unsigned *cnt;
};
static pg_grid pg_grid_of(const cuk_paged &p, int heads, int64_t splits, float *ws, unsigned *cnt, int64_t n_cnt) {
    const int64_t N = p.q.T, Hq = p.q.H, D = p.q.D, G = Hq / p.Hkv;
    pg_grid r;
    r.nhc = (int)((G + heads - 1) / heads);
    r.grid = dim3((unsigned)(N * p.Hkv * r.nhc), (unsigned)splits, 1);
    r.ws_acc = splits > 1 ? ws : nullptr;
    r.ws_ml = splits > 1 ? ws + N * Hq * splits * D : nullptr;
    r.cnt = splits > 1 && splits <= CUK_PAGED_FUSE_SPLITS && cnt && (int64_t)r.grid.x <= n_cnt ? cnt : nullptr;
    return r;
}

static cudaError_t pg_reduce(cudaStream_t s, const cuk_paged &p, int64_t splits, int64_t chunk, const pg_grid &g) {
    if (splits > 1 && !g.cnt)
        k_paged_reduce<<<(unsigned)(p.q.T * p.q.H), PG_NT, 0, s>>>(p, splits, chunk, g.ws_acc, g.ws_ml);
    return cudaGetLastError();
}

template <int DT, int DMAX, int GH>
static cudaError_t pg_launch(cudaStream_t s, const cuk_paged &p, int64_t splits, int64_t chunk, float *ws,
                             unsigned *cnt, int64_t n_cnt, int pdl, cuk_errrec *err) {
    /* fewer keys in flight per lane where the group's registers are many */
    constexpr int U = GH >= 4 || DT == CUK_F32 ? 2 : 4;
    const bool pipe = p.q.D % 8 == 0 && cuk_ptr16(p.kc) && cuk_ptr16(p.vc);
    const int bs_log2 = pg_bs_log2(p.bs);
    const pg_grid g = pg_grid_of(p, CUK_PAGED_HEADS, splits, ws, cnt, n_cnt);
    const cudaError_t e = pipe ? cuk_launch(s, pdl, k_paged_pipe<DT, DMAX, GH>, g.grid, PG_NT, 0, p, splits, chunk,
                                            g.nhc, bs_log2, g.ws_acc, g.ws_ml, g.cnt, err)
                               : cuk_launch(s, pdl, k_paged<DT, DMAX, GH, U>, g.grid, PG_NT, 0, p, splits, chunk, g.nhc,
                                            bs_log2, g.ws_acc, g.ws_ml, g.cnt, err);
    return e != cudaSuccess ? e : pg_reduce(s, p, splits, chunk, g);
}

extern "C" int cuk_paged_tc_ok(const cuk_paged *p) {
    const int dt = p->cdt;
    if ((dt != CUK_BF16 && dt != CUK_F16) || p->q.dt != dt || (p->q.D != 64 && p->q.D != 128)) return 0;
    return cuk_ptr16(p->kc) && cuk_ptr16(p->vc) && ((uintptr_t)p->q.p & 3) == 0 && p->q.sb % 2 == 0 &&
           p->q.st % 2 == 0 && p->q.sh % 2 == 0;
}

/* D 128 needs more than the default 48 KB of dynamic shared memory. */
static cudaError_t pgt_setup_all(void) {
    const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
    cudaError_t e = cudaFuncSetAttribute(k_paged_tc<128, false>, at, pgt_smem<128>());
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k_paged_tc<128, true>, at, pgt_smem<128>());
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k_paged_prefill<128, false>, at, pgp_smem<128>());
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k_paged_prefill<128, true>, at, pgp_smem<128>());
    return e;
}

/* Query tiles: at most ceil((N + S (TQ - 1)) / TQ) of them, a grid row per kv head. */
template <int D, bool F16> static cudaError_t pgp_launch(cudaStream_t s, const cuk_paged &p, cuk_errrec *err) {
    const int64_t TQ = pgp_rows<D>() / (p.q.H / p.Hkv), tiles = (p.q.T + p.S * (TQ - 1) + TQ - 1) / TQ;
    k_paged_prefill<D, F16>
        <<<dim3((unsigned)tiles, (unsigned)p.Hkv, 1), PG_NT, pgp_smem<D>(), s>>>(p, pg_bs_log2(p.bs), err);
    return cudaGetLastError();
}

template <int D, bool F16>
static cudaError_t pgt_launch(cudaStream_t s, const cuk_paged &p, int64_t splits, int64_t chunk, float *ws,
                              unsigned *cnt, int64_t n_cnt, int pdl, cuk_errrec *err) {
    const pg_grid g = pg_grid_of(p, CUK_PAGED_TC_HEADS, splits, ws, cnt, n_cnt);
    const cudaError_t e = cuk_launch(s, pdl, k_paged_tc<D, F16>, g.grid, PG_NT, pgt_smem<D>(), p, splits, chunk, g.nhc,
                                     pg_bs_log2(p.bs), g.ws_acc, g.ws_ml, g.cnt, err);
    return e != cudaSuccess ? e : pg_reduce(s, p, splits, chunk, g);
}

template <int DT, int DMAX>
static cudaError_t pg_group(cudaStream_t s, const cuk_paged &p, int64_t splits, int64_t chunk, float *ws, unsigned *cnt,
                            int64_t n_cnt, int pdl, cuk_errrec *err) {
    const int64_t G = p.q.H / p.Hkv;
    if (G <= 1) return pg_launch<DT, DMAX, 1>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
    if (G <= 2) return pg_launch<DT, DMAX, 2>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
    return pg_launch<DT, DMAX, 4>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
}

template <int DT>
static cudaError_t pg_dim(cudaStream_t s, const cuk_paged &p, int64_t splits, int64_t chunk, float *ws, unsigned *cnt,
                          int64_t n_cnt, int pdl, cuk_errrec *err) {
    if (p.q.D <= 64) return pg_group<DT, 64>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
    if (p.q.D <= 128) return pg_group<DT, 128>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
    return pg_group<DT, 256>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
}

extern "C" cudaError_t cuk_paged_attention(cudaStream_t s, cuk_paged p, int64_t splits, int64_t chunk, float *ws,
                                           unsigned *cnt, int64_t n_cnt, int pdl, cuk_errrec *err) {
    if (p.q.T <= 0 || p.q.H <= 0 || p.q.D <= 0) return cudaSuccess;
    if (p.q.D > CUK_ATTN_MAX_D || p.Hkv <= 0 || p.bs <= 0 || splits < 1 || splits > CUK_PAGED_MAX_SPLITS || chunk < 1 ||
        (splits > 1 && !ws))
        return cudaErrorInvalidValue;
    if (p.tc) {
        if (!cuk_paged_tc_ok(&p)) return cudaErrorInvalidValue;
        const cudaError_t e = p.q.D == 128 ? cuk_once_per_device<pgt_setup_all>() : cudaSuccess;
        if (e != cudaSuccess) return e;
        const bool f16 = p.cdt == CUK_F16;
        if (p.prefill) {
            if (p.q.H / p.Hkv > CUK_PAGED_PREFILL_ROWS) return cudaErrorInvalidValue;
            if (p.q.D == 64) return f16 ? pgp_launch<64, true>(s, p, err) : pgp_launch<64, false>(s, p, err);
            return f16 ? pgp_launch<128, true>(s, p, err) : pgp_launch<128, false>(s, p, err);
        }
        if (p.q.D == 64)
            return f16 ? pgt_launch<64, true>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err)
                       : pgt_launch<64, false>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
        return f16 ? pgt_launch<128, true>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err)
                   : pgt_launch<128, false>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
    }
    if (p.cdt == CUK_F32) return pg_dim<CUK_F32>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
    if (p.cdt == CUK_BF16) return pg_dim<CUK_BF16>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
    return pg_dim<CUK_F16>(s, p, splits, chunk, ws, cnt, n_cnt, pdl, err);
}
