/* CPU backend: the paged KV cache's write and attention. One task per
 * (query token, kv head): the group's query heads share each key and value
 * row read from the cache, which may be F32, BF16 or F16 (a 16-bit row is
 * converted once into the task's buffer). Scores are kept whole per task
 * (max_ctx floats per query head of the group), so the softmax is the
 * exact two-pass one. Scores (cai_cpu_dot) and P V (axpy8, rows in blocks
 * of eight) run in vector registers, where a running sum a score and a
 * scalar loop over P V kept a prefill's attention at about 80% of its
 * time (bench/RESULTS.md). A score's bits depend only on its query and key
 * rows, not on the batch. */
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

static inline float load(const void *base, cai_dtype dt, int64_t i) {
    if (dt == CAI_DTYPE_F32) return ((const float *)base)[i];
    if (dt == CAI_DTYPE_BF16) return cai_bf16_to_f32(((const cai_bf16 *)base)[i]);
    return cai_f16_to_f32(((const cai_f16 *)base)[i]);
}

/* y[d] += w x[d] for d < D, in blocks of eight that the compiler keeps in vector registers */
static inline void axpy8(float *restrict y, float w, const float *restrict x, int64_t D) {
    int64_t d = 0;
    for (; d + 8 <= D; d += 8)
        for (int u = 0; u < 8; u++) y[d + u] += w * x[d + u];
    for (; d < D; d++) y[d] += w * x[d];
}

/* Cache row elements [off, off + D) as f32: the cache itself where it is f32, else converted into buf. */
static inline const float *row_f32(const void *base, cai_dtype dt, int64_t off, int64_t D, float *buf) {
    if (dt == CAI_DTYPE_F32) return (const float *)base + off;
    for (int64_t d = 0; d < D; d++) buf[d] = load(base, dt, off + d);
    return buf;
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
    (void)n_tokens;
    (void)n_seqs;
    const int nt = dev && dev->num_threads > 0 ? dev->num_threads : 1;
    /* per thread: one score row per query head of a group (at most Hq) and D accumulators each, and a K and a V row */
    return (size_t)nt * ((size_t)Hq * ((size_t)max_ctx + (size_t)D) + 2 * (size_t)D) * sizeof(float) + 64;
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
    const int nt = cai_cpu_threads(dev, N * Hkv);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t task = 0; task < N * Hkv; task++) {
        const int64_t i = task / Hkv, g = task % Hkv;
        int64_t s = 0;
        while (qs[s + 1] <= i) s++; /* S is small; the rows of a sequence are adjacent tasks */
        const int64_t pos = cl[s] - (qs[s + 1] - qs[s]) + (i - qs[s]), nk = pos + 1;
        float *ws = (float *)workspace + (size_t)CAI_THREAD_ID() * ((size_t)Hq * (size_t)(max_ctx + D) + 2 * (size_t)D);
        float *acc = ws + group * max_ctx, *kbuf = acc + group * D, *vbuf = kbuf + D;
        const float *q0 = (const float *)qq.data + i * qq.st + g * group * qq.sh;
        for (int64_t j = 0; j < nk; j++) {
            const int64_t slot = (int64_t)bt[s * max_blocks + j / bs] * bs + j % bs;
            const float *kr = row_f32(kc.data, dt, (slot * Hkv + g) * D, D, kbuf);
            for (int64_t hh = 0; hh < group; hh++) ws[hh * max_ctx + j] = cai_cpu_dot(q0 + hh * qq.sh, kr, D) * sc;
        }
        for (int64_t hh = 0; hh < group; hh++) {
            float *sr = ws + hh * max_ctx, mx = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j < nk; j++) mx = sr[j] > mx ? sr[j] : mx;
            for (int64_t j = 0; j < nk; j++) {
                sr[j] = expf(sr[j] - mx);
                sum += sr[j];
            }
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j < nk; j++) sr[j] *= inv;
        }
        for (int64_t e = 0; e < group * D; e++) acc[e] = 0.0f;
        for (int64_t j = 0; j < nk; j++) {
            const int64_t slot = (int64_t)bt[s * max_blocks + j / bs] * bs + j % bs;
            const float *vr = row_f32(vc.data, dt, (slot * Hkv + g) * D, D, vbuf);
            for (int64_t hh = 0; hh < group; hh++) axpy8(acc + hh * D, ws[hh * max_ctx + j], vr, D);
        }
        for (int64_t hh = 0; hh < group; hh++) {
            float *o = (float *)oo.data + i * oo.st + (g * group + hh) * oo.sh;
            memcpy(o, acc + hh * D, (size_t)D * sizeof(float));
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
