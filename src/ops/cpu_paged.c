/* CPU backend: the paged KV cache's write and attention. A task is a tile
 * of one sequence's query tokens (PG_ROWS rows of (token, head), or one
 * token where a group alone has more heads) against one kv head: each key
 * and value row read from the cache, which may be F32, BF16 or F16, is
 * converted once and serves every row of the tile, where a task a token
 * read a prompt's prefix once per token. Keys go in blocks of PG_KB,
 * transposed, through cai_k_scores16 (four rows a pass) and values through
 * cai_k_pv, the vectorised clones of cpu_kernels.c. Scores are kept whole
 * per row (max_ctx floats), so the softmax is the exact two-pass one. A
 * score and an output element are each one fma chain in a fixed order over
 * their own query row and the keys, so their bits do not depend on the
 * batch, the tile or the rows beside them. The last tiles, which see the
 * most keys, go first. */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline void store(void *base, cai_dtype dt, int64_t i, float x) {
    if (dt == CAI_DTYPE_F32) ((float *)base)[i] = x;
    else if (dt == CAI_DTYPE_BF16) ((cai_bf16 *)base)[i] = cai_f32_to_bf16(x);
    else ((cai_f16 *)base)[i] = cai_f32_to_f16(x);
}

enum { PG_ROWS = 16, PG_KB = 16 };
_Static_assert(PG_KB == 16, "cai_k_keys_t16 and cai_k_scores16 take 16 keys");

static int64_t tile_tokens(int64_t group) { return group >= PG_ROWS ? 1 : PG_ROWS / group; }
static int64_t row_cap(int64_t Hq) { return Hq > PG_ROWS ? Hq : PG_ROWS; }
static int64_t score_stride(int64_t max_ctx) { return (max_ctx + PG_KB - 1) / PG_KB * PG_KB; }
/* a thread's floats: a score row, D accumulators and a sum a row, PG_KB keys transposed and PG_KB V rows */
static size_t thread_floats(int64_t Hq, int64_t D, int64_t max_ctx) {
    return (size_t)row_cap(Hq) * (size_t)(score_stride(max_ctx) + D + 1) + 2 * (size_t)PG_KB * (size_t)D;
}
/* the tile list: (sequence, first token) a tile, at most one a token */
static size_t list_bytes(int64_t n_tokens) { return ((size_t)n_tokens * 2 * sizeof(int32_t) + 63) / 64 * 64; }

/* PG_KB cache rows from key kb on (zeros past nk), as f32: keys transposed into kt[d][u] (kt non-null), values
 * straight into vb[u][d] (else) */
static void gather(float *kt, float *vb, const void *kc, const void *vc, cai_dtype dt, const int32_t *bt, int64_t bs,
                   int64_t Hkv, int64_t g, int64_t D, int64_t kb, int64_t nk) {
    const size_t es = dt == CAI_DTYPE_F32 ? 4 : 2;
    const void *rows[PG_KB];
    for (int64_t u = 0; u < PG_KB; u++) {
        const int64_t j = kb + u, off = j < nk ? (((int64_t)bt[j / bs] * bs + j % bs) * Hkv + g) * D : -1;
        rows[u] = off < 0 ? NULL : (const char *)(kt ? kc : vc) + (size_t)off * es;
    }
    if (kt) {
        cai_k_keys_t16(kt, rows, dt, D);
        return;
    }
    for (int64_t u = 0; u < PG_KB; u++) {
        float *v = vb + u * D;
        if (!rows[u]) memset(v, 0, (size_t)D * sizeof(float));
        else if (dt == CAI_DTYPE_F32) memcpy(v, rows[u], (size_t)D * sizeof(float));
        else if (dt == CAI_DTYPE_BF16)
            for (int64_t d = 0; d < D; d++) v[d] = cai_bf16_to_f32(((const cai_bf16 *)rows[u])[d]);
        else
            for (int64_t d = 0; d < D; d++) v[d] = cai_f16_to_f32(((const cai_f16 *)rows[u])[d]);
    }
}

CPU_OP(kv_cache_write)(cai_device_t *dev, cai_tensor *k_cache, cai_tensor *v_cache, const cai_tensor *k,
                       const cai_tensor *v, const cai_tensor *slots) {
    static const char op[] = "kv_cache_write";
    cai_kv_write_args a;
    CAI_CALL(cai_ops_kv_cache_write_args(op, CAI_HOST, CAI_F32, k_cache, v_cache, k, v, slots, &a));
    const cai_bthd kc = a.kc, vc = a.vc, kk = a.k, vv = a.v;
    const int32_t *sl = a.slots;
    const int64_t n_slots = kc.B * kc.T, N = kk.T, H = kk.H, D = kk.D;
    for (int64_t i = 0; i < N; i++)
        if (sl[i] >= n_slots)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: slots[%lld] = %d is past the cache's %lld slots", op,
                             (long long)i, sl[i], (long long)n_slots);
    const cai_dtype dt = k_cache->dtype;
    const int nt = cai_cpu_threads(dev, N);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < N; i++) {
        if (sl[i] < 0) continue;
        for (int64_t h = 0; h < H; h++) {
            const float *ks = (const float *)kk.data + i * kk.st + h * kk.sh;
            const float *vs = (const float *)vv.data + i * vv.st + h * vv.sh;
            const int64_t base = ((int64_t)sl[i] * H + h) * D;
            for (int64_t d = 0; d < D; d++) {
                store(kc.data, dt, base + d, ks[d]);
                store(vc.data, dt, base + d, vs[d]);
            }
        }
    }
    return CAI_OK;
}

size_t cai_cpu_paged_attention_workspace_bytes(const cai_device_t *dev, int64_t n_tokens, int64_t n_seqs, int64_t Hq,
                                               int64_t D, int64_t max_ctx) {
    (void)n_seqs;
    const int nt = dev && dev->num_threads > 0 ? dev->num_threads : 1;
    return list_bytes(n_tokens) + (size_t)nt * thread_floats(Hq, D, max_ctx) * sizeof(float) + 64;
}

CPU_OP(paged_attention)(cai_device_t *dev, cai_tensor *out, const cai_tensor *q, const cai_tensor *k_cache,
                        const cai_tensor *v_cache, const cai_tensor *block_tables, const cai_tensor *q_start,
                        const cai_tensor *ctx_len, int64_t max_ctx, float scale, void *workspace,
                        size_t workspace_bytes) {
    static const char op[] = "paged_attention";
    cai_paged_args a;
    CAI_CALL(cai_ops_paged_attention_args(op, CAI_HOST, CAI_F32, out, q, k_cache, v_cache, block_tables, q_start,
                                          ctx_len, max_ctx, &a));
    const cai_bthd qq = a.q, oo = a.out, kc = a.kc, vc = a.vc;
    const int32_t *bt = a.bt, *qs = a.qs, *cl = a.cl;
    const int64_t S = a.S, N = a.N, Hq = a.Hq, Hkv = a.Hkv, D = a.D, bs = a.bs;
    const int64_t max_blocks = a.max_blocks, n_blocks = kc.B, group = Hq / Hkv;
    /* The host can afford to check the index values the device backends trust. */
    if (qs[0] != 0 || qs[S] != N)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: q_start runs from %d to %d; it must run from 0 to N = %lld", op,
                         qs[0], qs[S], (long long)N);
    for (int64_t s = 0; s < S; s++) {
        const int64_t ql = qs[s + 1] - qs[s];
        if (ql < 0 || cl[s] < ql || cl[s] > max_ctx || cl[s] > max_blocks * bs)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: sequence %lld has %lld queries and ctx_len %d (need queries <= ctx_len <= max_ctx "
                             "%lld and <= %lld blocks of %lld)",
                             op, (long long)s, (long long)ql, cl[s], (long long)max_ctx, (long long)max_blocks,
                             (long long)bs);
        for (int64_t b = 0; b < (cl[s] + bs - 1) / bs; b++)
            if (bt[s * max_blocks + b] < 0 || bt[s * max_blocks + b] >= n_blocks)
                return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: block_tables[%lld, %lld] = %d is not a block of the %lld",
                                 op, (long long)s, (long long)b, bt[s * max_blocks + b], (long long)n_blocks);
    }
    const size_t need = cai_cpu_paged_attention_workspace_bytes(dev, N, S, Hq, D, max_ctx);
    if (N > 0 && (!workspace || workspace_bytes < need))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: workspace of %zu bytes, need %zu", op, workspace_bytes, need);
    const float sc = scale != 0.0f ? scale : 1.0f / sqrtf((float)D);
    const cai_dtype dt = kc.dtype;
    const int64_t TQ = tile_tokens(group), lds = score_stride(max_ctx), cap = row_cap(Hq);
    int32_t *tl = (int32_t *)workspace;
    int64_t n_tiles = 0;
    for (int64_t s = 0; s < S; s++)
        for (int64_t j0 = 0; j0 < qs[s + 1] - qs[s]; j0 += TQ, n_tiles++) {
            tl[2 * n_tiles] = (int32_t)s;
            tl[2 * n_tiles + 1] = (int32_t)j0;
        }
    float *const wsb = (float *)((char *)workspace + list_bytes(N));
    const size_t tf = thread_floats(Hq, D, max_ctx);
    const int nt = cai_cpu_threads(dev, n_tiles * Hkv);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t task = 0; task < n_tiles * Hkv; task++) {
        const int64_t tile = n_tiles - 1 - task / Hkv, g = task % Hkv;
        const int64_t s = tl[2 * tile], j0 = tl[2 * tile + 1], ql = qs[s + 1] - qs[s];
        const int64_t ntok = ql - j0 < TQ ? ql - j0 : TQ, rows = ntok * group;
        /* token t of the tile (row r = t group + head) sees keys [0, first + t) */
        const int64_t first = cl[s] - ql + j0 + 1, nk = first + ntok - 1;
        const int32_t *bts = bt + s * max_blocks;
        float *scores = wsb + (size_t)CAI_THREAD_ID() * tf, *acc = scores + cap * lds, *sums = acc + cap * D,
              *kt = sums + cap, *vb = kt + PG_KB * D;
        const float *q0 = (const float *)qq.data + (qs[s] + j0) * qq.st + g * group * qq.sh;
        for (int64_t kb = 0; kb < nk; kb += PG_KB) {
            gather(kt, NULL, kc.data, vc.data, dt, bts, bs, Hkv, g, D, kb, nk);
            for (int64_t r0 = 0; r0 < rows; r0 += 4) {
                const float *qr[4];
                const int n = rows - r0 < 4 ? (int)(rows - r0) : 4;
                for (int r = 0; r < n; r++) qr[r] = q0 + (r0 + r) / group * qq.st + (r0 + r) % group * qq.sh;
                cai_k_scores16(scores + r0 * lds + kb, lds, qr, n, kt, D);
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            float *sr = scores + r * lds;
            const int64_t n = first + r / group;
            for (int64_t j = 0; j < n; j++) sr[j] *= sc;
            const float mx = cai_k_max(sr, n);
            sums[r] = cai_k_exp_store(sr, sr, mx, 1.0f, n);
        }
        memset(acc, 0, (size_t)(rows * D) * sizeof(float));
        for (int64_t kb = 0; kb < nk; kb += PG_KB) {
            gather(NULL, vb, kc.data, vc.data, dt, bts, bs, Hkv, g, D, kb, nk);
            for (int64_t r = 0; r < rows; r++) {
                const int64_t n = first + r / group - kb; /* the row's keys in this block */
                if (n > 0) cai_k_pv(acc + r * D, scores + r * lds + kb, n < PG_KB ? (int)n : PG_KB, vb, D);
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            float *o = (float *)oo.data + (qs[s] + j0 + r / group) * oo.st + (g * group + r % group) * oo.sh;
            const float inv = 1.0f / sums[r];
            for (int64_t d = 0; d < D; d++) o[d] = acc[r * D + d] * inv;
        }
    }
    return CAI_OK;
}

/* The host has no launches to save: the two ops. */
CPU_OP(rope_kv_cache_write)(cai_device_t *dev, cai_tensor *qk, cai_tensor *k_cache, cai_tensor *v_cache,
                            const cai_tensor *v, const cai_tensor *slots, const cai_tensor *cos, const cai_tensor *sin,
                            const cai_tensor *positions) {
    static const char op[] = "rope_kv_cache_write";
    cai_tensor k;
    cai_kv_write_args a;
    CAI_CALL(cai_ops_rope_kv_keys(op, qk, k_cache, &k));
    CAI_CALL(cai_ops_kv_cache_write_args(op, CAI_HOST, CAI_F32, k_cache, v_cache, &k, v, slots, &a));
    CAI_CALL(cai_cpu_rope_fwd(dev, qk, qk, cos, sin, positions, 0));
    return cai_cpu_kv_cache_write(dev, k_cache, v_cache, &k, v, slots);
}
