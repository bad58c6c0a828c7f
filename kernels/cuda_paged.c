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
#include <stdlib.h>
#include <string.h>

/* Keys per split at least: one step of the kernels' key loop. A decode step of a few sequences has only
 * N * Hkv blocks per split, so short splits are what spreads it over the SMs (bench/RESULTS.md). */
#define PAGED_MIN_CHUNK 64
/* (token, split) partials at most: bounds the workspace (each holds Hq * (D + 2) floats) and turns split-KV off
 * for batches large enough to fill the GPU without it. */
#define PAGED_SPLIT_ROWS 2048
/* Blocks per SM a decode grid aims for before it stops splitting. */
#define PAGED_FILL 4

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

/* The kernels' view of checked paged_attention arguments and this call's split plan. */
static cuk_paged paged_plan(const cai_device_t *dev, const cai_paged_args *a, int64_t max_ctx, float scale,
                            int64_t *splits, int64_t *chunk) {
    const cai_bthd qq = a->q, oo = a->out, kc = a->kc, vc = a->vc;
    /* one block per (token, kv head, group of up to 4 of its query heads) and split */
    const int64_t groups = cdiv(a->Hq / (kc.H > 0 ? kc.H : 1), 4);
    *chunk = 1;
    *splits = plan_splits(a->N, max_ctx, a->N * kc.H * groups, cai_cuda_of(dev)->num_sms, chunk);
    const int64_t reach = a->max_blocks * a->bs;
    cuk_paged p = {.q = cai_cuda_bthd(&qq),
                   .o = cai_cuda_bthd(&oo),
                   .kc = kc.data,
                   .vc = vc.data,
                   .cdt = (int)kc.dtype,
                   .n_blocks = kc.B,
                   .bs = a->bs,
                   .Hkv = kc.H,
                   .bt = a->bt,
                   .qs = a->qs,
                   .cl = a->cl,
                   .S = a->S,
                   .max_blocks = a->max_blocks,
                   .limit = max_ctx < reach ? max_ctx : reach,
                   .scale = scale != 0.0f ? scale : 1.0f / sqrtf((float)a->D)};
    return p;
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
    const int64_t S = a.S, N = a.N, Hq = a.Hq, D = a.D;
    if (D > CUK_ATTN_MAX_D)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: head_dim %lld exceeds the CUDA kernels' maximum of %d", op,
                         (long long)D, CUK_ATTN_MAX_D);
    const size_t need = cai_cuda_paged_attention_workspace_bytes(dev, N, S, Hq, D, max_ctx);
    if (N > 0 && (!workspace || workspace_bytes < need))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: workspace of %zu bytes, need %zu", op, workspace_bytes, need);
    if (N == 0 || Hq == 0 || D == 0) return CAI_OK;
    int64_t splits, chunk;
    const cuk_paged p = paged_plan(dev, &a, max_ctx, scale, &splits, &chunk);
    float *ws = (float *)(((uintptr_t)workspace + 255) & ~(uintptr_t)255);
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_paged_attention(cai_cuda_of(dev)->stream, p, splits, chunk, ws, cai_cuda_of(dev)->paged_cnt,
                                       CAI_CUDA_PAGED_COUNTERS, cai_cuda_of(dev)->err));
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

/* ---------------------------------------------------------------- decode stack */

/* w: a contiguous [rows, cols] matrix of dtype dt on this backend. */
static int ds_mat(const cai_tensor *w, int dt, int64_t rows, int64_t cols) {
    return w && w->data && w->device && w->device->kind == CAI_CUDA && (int)w->dtype == dt && w->ndim == 2 &&
           w->shape[0] == rows && w->shape[1] == cols && w->stride[1] == 1 && w->stride[0] == cols;
}

/* Whether st is one the fused kernel takes (one token, 16-bit activations,
 * weights and caches of that dtype, the shapes decode_stack.cu handles),
 * with its arguments in a (the layers from l0 on, at most
 * CUK_DSTACK_MAX_LAYERS). Anything else, invalid calls included, goes
 * through the ops, which report what is wrong. */
static int ds_prepare(cai_device_t *dev, const cai_decode_stack *st, int64_t l0, cuk_dstack *a) {
    static const char op[] = "decode_stack_fwd";
    cai_rows x, qkv, att, act;
    cai_paged_args pa;
    cai_kv_write_args kw;
    cai_cuda_rope r;
    cai_tensor k;
    if (!st || !st->layers || st->n_layers < 1 || !st->x || !st->qkv || !st->att || !st->act) return 0;
    const int dt = (int)st->x->dtype;
    if (dt != CAI_DTYPE_BF16 && dt != CAI_DTYPE_F16) return 0;
    if (cai_ops_rows(op, "x", st->x, CAI_CUDA, dt, -1, &x) || x.rows != 1) return 0;
    if (cai_ops_rows(op, "qkv", st->qkv, CAI_CUDA, dt, -1, &qkv) || qkv.rows != 1) return 0;
    if (cai_ops_rows(op, "att", st->att, CAI_CUDA, dt, -1, &att) || att.rows != 1) return 0;
    if (cai_ops_rows(op, "act", st->act, CAI_CUDA, dt, -1, &act) || act.rows != 1) return 0;
    const cai_decode_layer *y0 = &st->layers[0];
    if (!y0->k_cache || !y0->v_cache || (int)y0->k_cache->dtype != dt || (int)y0->v_cache->dtype != dt) return 0;
    if (cai_ops_paged_attention_args(op, CAI_CUDA, dt, st->att_heads, st->q, y0->k_cache, y0->v_cache, st->block_tables,
                                     st->q_start, st->ctx_len, st->max_ctx, &pa) ||
        pa.N != 1 || pa.S != 1)
        return 0;
    if (cai_ops_rope_kv_keys(op, st->qk, y0->k_cache, &k) ||
        cai_ops_kv_cache_write_args(op, CAI_CUDA, dt, y0->k_cache, y0->v_cache, &k, st->v, st->slots, &kw) ||
        cai_cuda_rope_args(op, st->qk, "qk", st->qk, "qk", st->cos, st->sin, st->positions, 0, &r) || !r.pos ||
        !cuk_rope_kv_write_fits(r.x, cai_cuda_bthd(&kw.v), r.cos, r.sin, r.per_batch))
        return 0;
    const int64_t C = x.cols, Hq = pa.Hq, Hkv = pa.kc.H, D = pa.D, QKV = (Hq + 2 * Hkv) * D;
    if (qkv.cols != QKV || att.cols != Hq * D || r.x.p != qkv.data || r.x.H != Hq + Hkv) return 0;
    const size_t need = cai_cuda_paged_attention_workspace_bytes(dev, 1, 1, Hq, D, st->max_ctx);
    if (!st->workspace || st->workspace_bytes < need) return 0;
    const int64_t F = act.cols,
                  L = st->n_layers - l0 < CUK_DSTACK_MAX_LAYERS ? st->n_layers - l0 : CUK_DSTACK_MAX_LAYERS;
    const int wdt = y0->ln1_w ? (int)y0->ln1_w->dtype : -1;
    memset(a, 0, sizeof *a);
    for (int64_t l = 0; l < L; l++) {
        const cai_decode_layer *y = &st->layers[l0 + l];
        const cai_tensor *n[] = {y->ln1_w, y->ln2_w}, *c[] = {y->k_cache, y->v_cache};
        for (int j = 0; j < 2; j++) {
            if (!n[j] || !n[j]->data || !n[j]->device || n[j]->device->kind != CAI_CUDA || (int)n[j]->dtype != wdt ||
                n[j]->ndim != 1 || n[j]->shape[0] != C || n[j]->stride[0] != 1)
                return 0;
            if (!c[j] || !c[j]->data || (int)c[j]->dtype != dt || c[j]->ndim != 4 ||
                c[j]->device != y0->k_cache->device)
                return 0;
            for (int d = 0; d < 4; d++)
                if (c[j]->shape[d] != y0->k_cache->shape[d] || c[j]->stride[d] != y0->k_cache->stride[d]) return 0;
        }
        if (!ds_mat(y->qkv_w, dt, QKV, C) || !ds_mat(y->proj_w, dt, C, Hq * D) || !ds_mat(y->gate_w, dt, F, C) ||
            !ds_mat(y->up_w, dt, F, C) || !ds_mat(y->down_w, dt, C, F))
            return 0;
        a->layer[l] = (cuk_dlayer){.ln1 = y->ln1_w->data,
                                   .ln2 = y->ln2_w->data,
                                   .qkv = y->qkv_w->data,
                                   .proj = y->proj_w->data,
                                   .gate = y->gate_w->data,
                                   .up = y->up_w->data,
                                   .down = y->down_w->data,
                                   .kc = y->k_cache->data,
                                   .vc = y->v_cache->data};
    }
    cai_cuda_impl *c = cai_cuda_of(dev);
    int64_t splits, chunk;
    a->attn = paged_plan(dev, &pa, st->max_ctx, 0.0f, &splits, &chunk);
    a->L = (int)L;
    a->dt = dt;
    a->wdt = wdt;
    a->C = C;
    a->F = F;
    a->eps = st->eps;
    a->x = x.data;
    a->qkv = qkv.data;
    a->att = att.data;
    a->act = act.data;
    a->qk = r.x;
    a->v = cai_cuda_bthd(&kw.v);
    a->cos = r.cos;
    a->sin = r.sin;
    a->pos = r.pos;
    a->slots = kw.slots;
    a->n_slots = kw.kc.B * kw.kc.T;
    a->splits = splits;
    a->chunk = chunk;
    a->n_cnt = CAI_CUDA_PAGED_COUNTERS;
    a->nhc = (int)cdiv(Hq / Hkv, 4);
    a->bs_log2 = -1;
    if ((pa.bs & (pa.bs - 1)) == 0) /* a shift instead of a division per key, as the attention launcher */
        for (a->bs_log2 = 0; (1ll << a->bs_log2) < pa.bs; a->bs_log2++) continue;
    a->ws = (float *)(((uintptr_t)st->workspace + 255) & ~(uintptr_t)255);
    a->cnt = c->paged_cnt;
    a->bar = c->paged_cnt + CAI_CUDA_PAGED_COUNTERS;
    a->err = c->err;
    return cuk_decode_stack_fits(a);
}

/* Whether every group of st's layers fits the fused kernel; a then holds
 * the first group's arguments (the groups are checked last to first). */
static int ds_prepare_all(cai_device_t *dev, const cai_decode_stack *st, cuk_dstack *a) {
    if (!dev || dev->kind != CAI_CUDA || cai_cuda_of(dev)->dstack_off || !a || !st || st->n_layers < 1) return 0;
    for (int64_t l0 = (st->n_layers - 1) / CUK_DSTACK_MAX_LAYERS * CUK_DSTACK_MAX_LAYERS; l0 >= 0;
         l0 -= CUK_DSTACK_MAX_LAYERS)
        if (!ds_prepare(dev, st, l0, a)) return 0;
    return 1;
}

int cai_cuda_decode_stack_fused(cai_device_t *dev, const cai_decode_stack *st) {
    cuk_dstack *a = malloc(sizeof *a);
    const int fused = ds_prepare_all(dev, st, a);
    free(a);
    return fused;
}

/* The fused launch where it applies, else the ops. A GPU that refuses the
 * cooperative launch (too few resident blocks, say) outside a graph capture
 * gets the ops from then on: the refusal leaves nothing half done, since a
 * grid that does not start writes nothing. */
cai_status cai_cuda_decode_stack_fwd(cai_device_t *dev, const cai_decode_stack *st) {
    static const char op[] = "decode_stack_fwd";
    cuk_dstack *a = malloc(sizeof *a); /* about 10 KB, the kernel's parameter */
    if (!a) return CAI_ERROR(CAI_ERR_NOMEM, "%s: %zu bytes of host memory", op, sizeof *a);
    if (!ds_prepare_all(dev, st, a)) {
        free(a);
        return cai_ops_decode_stack_composed(dev, st);
    }
    cai_cuda_impl *c = cai_cuda_of(dev);
    cai_status rc = cai_cuda_enter(dev, op);
    for (int64_t l0 = 0; rc == CAI_OK && l0 < st->n_layers; l0 += CUK_DSTACK_MAX_LAYERS) {
        if (l0 > 0) (void)ds_prepare(dev, st, l0, a); /* group 0 is already in a */
        const cudaError_t e = cuk_decode_stack(c->stream, a);
        if (e == cudaSuccess) continue;
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        if (l0 == 0 && cudaStreamIsCapturing(c->stream, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone &&
            (e == cudaErrorCooperativeLaunchTooLarge || e == cudaErrorNotSupported)) {
            (void)cudaGetLastError();
            c->dstack_off = 1;
            free(a);
            return cai_ops_decode_stack_composed(dev, st);
        }
        rc = cai_cuda_launch_status(e, op, "cuk_decode_stack", __FILE__, __LINE__);
    }
    free(a);
    return rc;
}
