/* The paged KV cache's kernels and launchers: the cache write, attention
 * over the cache (paged.cuh: the design and the per-block code, which the
 * decode-stack kernel shares) and the split-KV merge. */
#include "paged.cuh"

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

CUK_EMU_BEGIN(paged_pipe);
template <int DT, int DMAX, int GH>
__global__ void __launch_bounds__(PG_NT, 4)
    k_paged_pipe(cuk_paged p, int64_t splits, int64_t chunk, int nhc, int bs_log2, float *ws_acc, float *ws_ml,
                 unsigned *cnt, cuk_errrec *err) {
    __shared__ pg_pipe_smem<DT, DMAX, GH> sm;
    cuk_pdl_trigger(); /* the output projection starts its weight reads now (gemv.cu) */
    pg_pipe_block<DT, DMAX, GH>(p, p.kc, p.vc, splits, chunk, nhc, bs_log2, ws_acc, ws_ml, cnt, err, blockIdx.x,
                                blockIdx.y, sm);
}

CUK_EMU_END(paged_pipe);

/* The general path (any D, unaligned caches): each lane group loads its
 * keys' row chunks straight into registers, U keys before any is used. */
template <int DT, int DMAX, int GH, int U>
__global__ void __launch_bounds__(PG_NT) k_paged(cuk_paged p, int64_t splits, int64_t chunk, int nhc, int bs_log2,
                                                 float *ws_acc, float *ws_ml, unsigned *cnt, cuk_errrec *err) {
    constexpr int LPK = DMAX / 8, KPW = 32 / LPK, STEP = PG_NW * KPW * U;
    __shared__ float sm[pg_merge_floats<DMAX, GH>()];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, kg = lane / LPK, dl = lane % LPK;
    cuk_pdl_trigger();
    const pg_task t = pg_task_of<GH>(p, chunk, nhc, blockIdx.x, blockIdx.y, err);
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

template <int DT, int DMAX, int GH>
static cudaError_t pg_launch(cudaStream_t s, const cuk_paged &p, int64_t splits, int64_t chunk, float *ws,
                             unsigned *cnt, int64_t n_cnt, cuk_errrec *err) {
    /* fewer keys in flight per lane where the group's registers are many */
    constexpr int U = GH >= 4 || DT == CUK_F32 ? 2 : 4;
    const int64_t N = p.q.T, Hq = p.q.H, D = p.q.D, G = Hq / p.Hkv;
    const int nhc = (int)((G + GH - 1) / GH);
    const bool pipe = D % 8 == 0 && cuk_ptr16(p.kc) && cuk_ptr16(p.vc);
    int bs_log2 = -1; /* a shift instead of a division per key */
    if ((p.bs & (p.bs - 1)) == 0) {
        bs_log2 = 0;
        while ((1ll << bs_log2) < p.bs) bs_log2++;
    }
    float *ws_acc = splits > 1 ? ws : nullptr, *ws_ml = splits > 1 ? ws + N * Hq * splits * D : nullptr;
    const dim3 grid((unsigned)(N * p.Hkv * nhc), (unsigned)splits, 1);
    /* the merge in the kernel: a counter per grid column and wt in the merge's shared memory */
    unsigned *c = splits > 1 && splits <= CUK_PAGED_FUSE_SPLITS && cnt && (int64_t)grid.x <= n_cnt ? cnt : nullptr;
    if (pipe) k_paged_pipe<DT, DMAX, GH><<<grid, PG_NT, 0, s>>>(p, splits, chunk, nhc, bs_log2, ws_acc, ws_ml, c, err);
    else k_paged<DT, DMAX, GH, U><<<grid, PG_NT, 0, s>>>(p, splits, chunk, nhc, bs_log2, ws_acc, ws_ml, c, err);
    if (splits > 1 && !c) k_paged_reduce<<<(unsigned)(N * Hq), PG_NT, 0, s>>>(p, splits, chunk, ws_acc, ws_ml);
    return cudaGetLastError();
}

template <int DT, int DMAX>
static cudaError_t pg_group(cudaStream_t s, const cuk_paged &p, int64_t splits, int64_t chunk, float *ws, unsigned *cnt,
                            int64_t n_cnt, cuk_errrec *err) {
    const int64_t G = p.q.H / p.Hkv;
    if (G <= 1) return pg_launch<DT, DMAX, 1>(s, p, splits, chunk, ws, cnt, n_cnt, err);
    if (G <= 2) return pg_launch<DT, DMAX, 2>(s, p, splits, chunk, ws, cnt, n_cnt, err);
    return pg_launch<DT, DMAX, 4>(s, p, splits, chunk, ws, cnt, n_cnt, err);
}

template <int DT>
static cudaError_t pg_dim(cudaStream_t s, const cuk_paged &p, int64_t splits, int64_t chunk, float *ws, unsigned *cnt,
                          int64_t n_cnt, cuk_errrec *err) {
    if (p.q.D <= 64) return pg_group<DT, 64>(s, p, splits, chunk, ws, cnt, n_cnt, err);
    if (p.q.D <= 128) return pg_group<DT, 128>(s, p, splits, chunk, ws, cnt, n_cnt, err);
    return pg_group<DT, 256>(s, p, splits, chunk, ws, cnt, n_cnt, err);
}

extern "C" cudaError_t cuk_paged_attention(cudaStream_t s, cuk_paged p, int64_t splits, int64_t chunk, float *ws,
                                           unsigned *cnt, int64_t n_cnt, cuk_errrec *err) {
    if (p.q.T <= 0 || p.q.H <= 0 || p.q.D <= 0) return cudaSuccess;
    if (p.q.D > CUK_ATTN_MAX_D || p.Hkv <= 0 || p.bs <= 0 || splits < 1 || splits > CUK_PAGED_MAX_SPLITS || chunk < 1 ||
        (splits > 1 && !ws))
        return cudaErrorInvalidValue;
    if (p.cdt == CUK_F32) return pg_dim<CUK_F32>(s, p, splits, chunk, ws, cnt, n_cnt, err);
    if (p.cdt == CUK_BF16) return pg_dim<CUK_BF16>(s, p, splits, chunk, ws, cnt, n_cnt, err);
    return pg_dim<CUK_F16>(s, p, splits, chunk, ws, cnt, n_cnt, err);
}
