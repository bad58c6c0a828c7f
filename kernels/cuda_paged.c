/* CUDA backend: the paged KV cache's write and attention (validation, the
 * split-KV plan and the workspace here; kernels in paged.cu). Shapes,
 * dtypes and layouts are checked as the CPU backend checks them, with the
 * same messages. The index tensors' values (slots, block tables, q_start,
 * ctx_len) live on the device and are trusted here: reading them would
 * synchronise every layer of every step. The kernels look at them instead:
 * a slot or block id out of range, or a sequence whose queries and ctx_len
 * do not fit, is reported at the next synchronisation (cai_device_sync or a
 * device-to-host copy) with its row left alone or zeroed, where the CPU
 * backend fails the call itself.
 *
 * Split-KV plan: a decode step has a handful of tokens, so one block per
 * (token, kv head) would leave most SMs idle on a long context. The keys of
 * each token are cut into `splits` chunks of `chunk` positions, one block
 * each, when the batch is small enough for the partials to stay modest and
 * too small to fill the GPU: splits = min(max_ctx / PAGED_MIN_CHUNK,
 * PAGED_SPLIT_ROWS / N, PAGED_FILL x SMs / one split's blocks), at least 2,
 * else one pass. A token's last split merges the partials, counted in the
 * device's paged_cnt, where the grid's columns fit there (cuk_paged_attention). Only max_ctx and N are known here
 * (ctx_len is on the device), so a short context leaves its later splits empty; they exit at once. */
#include "cai_config.h"
#include "cuda_internal.h"

#include <math.h>

/* Keys per split at least: one step of the kernels' key loop. A decode step of a few sequences has only
 * N * Hkv blocks per split, so short splits are what spreads it over the SMs (bench/RESULTS.md). */
#define PAGED_MIN_CHUNK 64
/* (token, split) partials at most: bounds the workspace (each holds Hq * (D + 2) floats) and turns split-KV off
 * for batches large enough to fill the GPU without it. */
#define PAGED_SPLIT_ROWS 2048
/* Blocks per SM a decode grid aims for before it stops splitting (2 measured 2% faster than 4 at batch 16 and 5.5%
 * at batch 64 on an H100, Llama 1B shape: bench/RESULTS.md). */
#define PAGED_FILL 2
/* Blocks an SM holds at once (the launch bounds of the head_dim-64 kernels; the tensor-core one at head_dim 128
 * holds 3): a grid of at most that many per SM is about one wave. */
#define PAGED_WAVE 4

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The most splits a token may get for this max_ctx (1: never split). */
static int64_t max_splits(int64_t max_ctx) {
    const int64_t p = max_ctx > 0 ? cdiv(max_ctx, PAGED_MIN_CHUNK) : 1;
    return p < CUK_PAGED_MAX_SPLITS ? p : CUK_PAGED_MAX_SPLITS;
}

/* This call's splits and chunk; N * splits <= min(N * max_splits, PAGED_SPLIT_ROWS) when splits > 1, which is what
 * the workspace holds, so a workspace sized for more tokens fits fewer. `blocks` is the grid of one split: splits
 * stop where the grid covers the SMs PAGED_FILL times over, since past that a batch keeps the GPU busy by itself and
 * every split only adds partials to merge. */
static int64_t plan_splits(int64_t N, int64_t max_ctx, int64_t blocks, int64_t sms, int64_t *chunk) {
    int64_t p = max_splits(max_ctx);
    if (N > 0 && p > PAGED_SPLIT_ROWS / N) p = PAGED_SPLIT_ROWS / N;
    const int64_t fill = blocks > 0 ? cdiv(PAGED_FILL * sms, blocks) : 1;
    if (p > fill) p = fill;
    *chunk = max_ctx > 0 ? max_ctx : 1;
    if (p <= 1) return 1;
    *chunk = cdiv(cdiv(max_ctx, p), 64) * 64; /* whole steps of the kernel's key loop */
    return cdiv(max_ctx, *chunk);
}

size_t cai_cuda_paged_attention_workspace_bytes(const cai_device_t *dev, int64_t n_tokens, int64_t n_seqs, int64_t Hq,
                                                int64_t D, int64_t max_ctx) {
    (void)dev;
    (void)n_seqs;
    const int64_t p = max_splits(max_ctx);
    int64_t rows = n_tokens > 0 && p > 1 ? n_tokens * p : 0;
    if (rows > PAGED_SPLIT_ROWS) rows = PAGED_SPLIT_ROWS;
    return (size_t)rows * (size_t)(Hq > 0 ? Hq : 0) * (size_t)((D > 0 ? D : 0) + 2) * sizeof(float) + 256;
}

cai_status cai_cuda_kv_cache_write(cai_device_t *dev, cai_tensor *k_cache, cai_tensor *v_cache, const cai_tensor *k,
                                   const cai_tensor *v, const cai_tensor *slots) {
    static const char op[] = "kv_cache_write";
    cai_kv_write_args a;
    CAI_CALL(cai_ops_kv_cache_write_args(op, CAI_CUDA, CAI_ANYF, k_cache, v_cache, k, v, slots, &a));
    const cai_bthd kc = a.kc, vc = a.vc, kk = a.k, vv = a.v;
    const int32_t *sl = a.slots;
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_kv_cache_write(cai_cuda_of(dev)->stream, kc.data, vc.data, (int)kc.dtype, kc.B * kc.T,
                                      cai_cuda_bthd(&kk), cai_cuda_bthd(&vv), sl, cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_paged_attention(cai_device_t *dev, cai_tensor *out, const cai_tensor *q, const cai_tensor *k_cache,
                                    const cai_tensor *v_cache, const cai_tensor *block_tables,
                                    const cai_tensor *q_start, const cai_tensor *ctx_len, int64_t max_ctx, float scale,
                                    void *workspace, size_t workspace_bytes) {
    static const char op[] = "paged_attention";
    /* q_start[0] = 0, q_start[S] = N and the other index values are the device's to trust: shapes only here */
    cai_paged_args a;
    CAI_CALL(cai_ops_paged_attention_args(op, CAI_CUDA, CAI_ANYF, out, q, k_cache, v_cache, block_tables, q_start,
                                          ctx_len, max_ctx, &a));
    const cai_bthd qq = a.q, oo = a.out, kc = a.kc, vc = a.vc;
    const int32_t *bt = a.bt, *qs = a.qs, *cl = a.cl;
    const int64_t S = a.S, N = a.N, Hq = a.Hq, D = a.D, bs = a.bs, max_blocks = a.max_blocks;
    if (D > CUK_ATTN_MAX_D)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: head_dim %lld exceeds the CUDA kernels' maximum of %d", op,
                         (long long)D, CUK_ATTN_MAX_D);
    const size_t need = cai_cuda_paged_attention_workspace_bytes(dev, N, S, Hq, D, max_ctx);
    if (N > 0 && (!workspace || workspace_bytes < need))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: workspace of %zu bytes, need %zu", op, workspace_bytes, need);
    if (N == 0 || Hq == 0 || D == 0) return CAI_OK;
    const int64_t reach = max_blocks * bs;
    cuk_paged p = {.q = cai_cuda_bthd(&qq),
                   .o = cai_cuda_bthd(&oo),
                   .kc = kc.data,
                   .vc = vc.data,
                   .cdt = (int)kc.dtype,
                   .n_blocks = kc.B,
                   .bs = bs,
                   .Hkv = kc.H,
                   .bt = bt,
                   .qs = qs,
                   .cl = cl,
                   .S = S,
                   .max_blocks = max_blocks,
                   .limit = max_ctx < reach ? max_ctx : reach,
                   .scale = scale != 0.0f ? scale : 1.0f / sqrtf((float)D)};
    p.tc = cuk_paged_tc_ok(&p);
    /* more query rows than sequences: a prefill chunk is in the batch, and query tiles read each key once a tile
     * instead of once a token (decode rows in the same call take a tile each, unsplit) */
    p.prefill = p.tc && N > S && Hq / kc.H <= CUK_PAGED_PREFILL_ROWS;
    /* one block per (token, kv head, group of its query heads) and split */
    const int64_t groups = cdiv(Hq / (kc.H > 0 ? kc.H : 1), p.tc ? CUK_PAGED_TC_HEADS : CUK_PAGED_HEADS);
    int64_t chunk = 1;
    const int64_t sms = cai_cuda_of(dev)->num_sms,
                  splits = p.prefill ? 1 : plan_splits(N, max_ctx, N * kc.H * groups, sms, &chunk);
    /* Started early (programmatic launch), a grid of one wave finds its sequences and first blocks while the cache
     * write runs; larger grids (batches 64 and 256) measured slower that way (bench/RESULTS.md). */
    const int pdl = cai_cuda_of(dev)->pdl && !p.prefill && N * kc.H * groups * splits <= PAGED_WAVE * sms;
    float *ws = (float *)(((uintptr_t)workspace + 255) & ~(uintptr_t)255);
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_paged_attention(cai_cuda_of(dev)->stream, p, splits, chunk, ws, cai_cuda_of(dev)->paged_cnt,
                                       CAI_CUDA_PAGED_COUNTERS, pdl, cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_rope_kv_cache_write(cai_device_t *dev, cai_tensor *qk, cai_tensor *k_cache, cai_tensor *v_cache,
                                        const cai_tensor *v, const cai_tensor *slots, const cai_tensor *cos,
                                        const cai_tensor *sin, const cai_tensor *positions) {
    static const char op[] = "rope_kv_cache_write";
    cai_tensor k;
    cai_kv_write_args a;
    cai_cuda_rope r;
    CAI_CALL(cai_ops_rope_kv_keys(op, qk, k_cache, &k));
    CAI_CALL(cai_ops_kv_cache_write_args(op, CAI_CUDA, CAI_ANYF, k_cache, v_cache, &k, v, slots, &a));
    CAI_CALL(cai_cuda_rope_args(op, qk, "qk", qk, "qk", cos, sin, positions, 0, &r));
    cudaStream_t s = cai_cuda_of(dev)->stream;
    CAI_CALL(cai_cuda_enter(dev, op));
    if (!r.pos || !cuk_rope_kv_write_fits(r.x, cai_cuda_bthd(&a.v), r.cos, r.sin, r.per_batch)) {
        CUK_LAUNCH(op, cuk_rope(s, r.y, r.x, r.cos, r.sin, r.pos, r.per_batch, 0, 1.0f, cai_cuda_of(dev)->err));
        CUK_LAUNCH(op, cuk_kv_cache_write(s, a.kc.data, a.vc.data, (int)a.kc.dtype, a.kc.B * a.kc.T,
                                          cai_cuda_bthd(&a.k), cai_cuda_bthd(&a.v), a.slots, cai_cuda_of(dev)->err));
        return CAI_OK;
    }
    CUK_LAUNCH(op, cuk_rope_kv_write(s, r.x, cai_cuda_bthd(&a.v), r.cos, r.sin, r.pos, a.kc.data, a.vc.data,
                                     (int)a.kc.dtype, a.kc.B * a.kc.T, a.slots, cai_cuda_of(dev)->err));
    return CAI_OK;
}
