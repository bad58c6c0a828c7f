/* Transformer layers over the op table: attention and MLP sublayers, the
 * block, the embedding and the head with its fused cross-entropy. Every
 * function works on caller-provided buffers and allocates nothing.
 *
 * Written for tensor parallelism with tp = 1 as the degenerate case: the
 * dims are the LOCAL head / hidden / vocabulary counts, QKV and the MLP
 * up/gate matmuls are column-parallel (their outputs are this rank's heads or
 * hidden units) and the two output projections row-parallel (their outputs
 * are partial sums). The comments marked "TP:" and "SP:" are where the
 * collectives go when those are implemented. */
#include "cai_config.h"
#include "colossal/model.h"
#include "colossal/ops.h"

#include <string.h>

/* Absent parameters (Llama biases, GPT-2's up projection) have data == NULL;
 * the ops take NULL for "none". */
static const cai_tensor *opt_in(const cai_tensor *t) { return t && t->data ? t : NULL; }
static cai_tensor *opt_out(cai_tensor *t) { return t && t->data ? t : NULL; }

static int is_gpt2(const cai_layer_dims *d) { return d->family == CAI_MODEL_GPT2; }

static int64_t qkv_width(const cai_layer_dims *d) { return (d->n_heads + 2 * d->n_kv_heads) * d->head_dim; }

static cai_attn_params causal_params(void) {
    cai_attn_params p = {.scale = 0.0f, .causal = 1, .causal_offset = 0, .window = 0};
    return p;
}

/* q [B,T,Hq,D], k and v [B,T,Hkv,D]: strided views into a fused [B,T,W] buffer. */
static cai_status split_qkv(const cai_layer_dims *d, const cai_tensor *qkv, cai_tensor *q, cai_tensor *k,
                            cai_tensor *v) {
    int64_t hq = d->n_heads * d->head_dim, hkv = d->n_kv_heads * d->head_dim;
    cai_tensor t;
    CAI_CALL(cai_tensor_narrow(qkv, 2, 0, hq, &t));
    CAI_CALL(cai_tensor_unflatten(&t, 2, d->head_dim, q));
    CAI_CALL(cai_tensor_narrow(qkv, 2, hq, hkv, &t));
    CAI_CALL(cai_tensor_unflatten(&t, 2, d->head_dim, k));
    CAI_CALL(cai_tensor_narrow(qkv, 2, hq + hkv, hkv, &t));
    CAI_CALL(cai_tensor_unflatten(&t, 2, d->head_dim, v));
    return CAI_OK;
}

/* ------------------------------------------------------------ norms */

static cai_status norm_fwd(cai_device_t *dev, const cai_layer_dims *d, cai_tensor *out, cai_tensor *mean,
                           cai_tensor *rstd, const cai_tensor *inp, const cai_tensor *w, const cai_tensor *b) {
    if (is_gpt2(d)) return dev->ops->layernorm_fwd(dev, out, mean, rstd, inp, w, opt_in(b), d->norm_eps);
    return dev->ops->rmsnorm_fwd(dev, out, rstd, inp, w, d->norm_eps);
}

static cai_status norm_bwd(cai_device_t *dev, const cai_layer_dims *d, cai_tensor *dinp, cai_tensor *dw, cai_tensor *db,
                           const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *w, const cai_tensor *mean,
                           const cai_tensor *rstd, int accum) {
    if (is_gpt2(d))
        return dev->ops->layernorm_bwd(dev, dinp, opt_out(dw), opt_out(db), dout, inp, w, mean, rstd, accum);
    return dev->ops->rmsnorm_bwd(dev, dinp, opt_out(dw), dout, inp, w, rstd, accum);
}

/* ------------------------------------------------------------ attention */

cai_status cai_attn_fwd(cai_device_t *dev, const cai_layer_dims *d, const cai_block_params *p, cai_block_acts *a,
                        cai_block_scratch *s, const cai_tensor *inp, cai_tensor *out) {
    const cai_ops *ops = dev->ops;
    CAI_CALL(norm_fwd(dev, d, &a->ln1, &a->ln1_mean, &a->ln1_rstd, inp, &p->ln1_w, &p->ln1_b));
    /* SP: all-gather a->ln1 over the sequence shards before the column-parallel matmul. */
    CAI_CALL(ops->linear_fwd(dev, &a->qkv, &a->ln1, &p->qkv_w, opt_in(&p->qkv_b)));
    cai_tensor q, k, v, att4;
    CAI_CALL(split_qkv(d, &a->qkv, &q, &k, &v));
    if (!is_gpt2(d)) {
        /* Rotated in place: backward needs only the rotated q and k. */
        CAI_CALL(ops->rope_fwd(dev, &q, &q, &s->rope_cos, &s->rope_sin, NULL, d->pos_offset));
        CAI_CALL(ops->rope_fwd(dev, &k, &k, &s->rope_cos, &s->rope_sin, NULL, d->pos_offset));
    }
    CAI_CALL(cai_tensor_unflatten(&a->att, 2, d->head_dim, &att4));
    cai_attn_params ap = causal_params();
    CAI_CALL(ops->attention_fwd(dev, &att4, &a->att_lse, &q, &k, &v, &ap, s->attn_ws, s->attn_ws_bytes));
    /* TP: the row-parallel projection gives partial sums, which must be
     * all-reduced over tp (SP: reduce-scatter) before the bias and the
     * residual are added once. The fused op (product + bias + residual in
     * one matmul) is valid only because the block runs with tp = 1 today; a
     * TP implementation must split it again: linear_fwd without bias into a
     * [B,T,C] scratch (carve one then), all-reduce, then bias_add and add. */
    CAI_CALL(ops->linear_residual_fwd(dev, out, &a->att, &p->proj_w, opt_in(&p->proj_b), inp));
    return CAI_OK;
}

cai_status cai_attn_bwd(cai_device_t *dev, const cai_layer_dims *d, const cai_block_params *p, cai_block_params *g,
                        const cai_block_acts *a, cai_block_scratch *s, const cai_tensor *inp, cai_tensor *d_stream) {
    const cai_ops *ops = dev->ops;
    /* d(out) reaches both the residual (unchanged, stays in d_stream) and the projection. */
    CAI_CALL(
        ops->linear_bwd(dev, &s->datt, opt_out(&g->proj_w), opt_out(&g->proj_b), d_stream, &a->att, &p->proj_w, 0));
    cai_tensor q, k, v, dq, dk, dv, att4, datt4;
    CAI_CALL(split_qkv(d, &a->qkv, &q, &k, &v));
    CAI_CALL(split_qkv(d, &s->dqkv, &dq, &dk, &dv));
    CAI_CALL(cai_tensor_unflatten(&a->att, 2, d->head_dim, &att4));
    CAI_CALL(cai_tensor_unflatten(&s->datt, 2, d->head_dim, &datt4));
    cai_attn_params ap = causal_params();
    CAI_CALL(ops->attention_bwd(dev, &dq, &dk, &dv, &datt4, &q, &k, &v, &att4, &a->att_lse, &ap, s->attn_ws,
                                s->attn_ws_bytes));
    if (!is_gpt2(d)) {
        CAI_CALL(ops->rope_bwd(dev, &dq, &dq, &s->rope_cos, &s->rope_sin, NULL, d->pos_offset));
        CAI_CALL(ops->rope_bwd(dev, &dk, &dk, &s->rope_cos, &s->rope_sin, NULL, d->pos_offset));
    }
    CAI_CALL(ops->linear_bwd(dev, &s->dln, opt_out(&g->qkv_w), opt_out(&g->qkv_b), &s->dqkv, &a->ln1, &p->qkv_w, 0));
    /* TP: all-reduce s->dln over tp (SP: reduce-scatter) -- the column-parallel input gradient is partial. */
    CAI_CALL(norm_bwd(dev, d, d_stream, &g->ln1_w, &g->ln1_b, &s->dln, inp, &p->ln1_w, &a->ln1_mean, &a->ln1_rstd, 1));
    return CAI_OK;
}

/* ------------------------------------------------------------ MLP */

cai_status cai_mlp_fwd(cai_device_t *dev, const cai_layer_dims *d, const cai_block_params *p, cai_block_acts *a,
                       cai_block_scratch *s, const cai_tensor *inp, cai_tensor *out) {
    const cai_ops *ops = dev->ops;
    CAI_CALL(norm_fwd(dev, d, &a->ln2, &a->ln2_mean, &a->ln2_rstd, inp, &p->ln2_w, &p->ln2_b));
    /* SP: all-gather a->ln2 here. */
    if (is_gpt2(d)) {
        /* fc is column-parallel: each rank's hidden units are complete, so
         * the GELU needs no communication and fuses into the matmul (a->fc
         * keeps the GELU input for backward). */
        CAI_CALL(ops->linear_gelu_fwd(dev, &a->act, &a->fc, &a->ln2, &p->fc_w, opt_in(&p->fc_b)));
    } else {
        CAI_CALL(ops->linear_fwd(dev, &a->fc, &a->ln2, &p->fc_w, NULL));
        CAI_CALL(ops->linear_fwd(dev, &a->up, &a->ln2, &p->up_w, NULL));
        CAI_CALL(ops->swiglu_fwd(dev, &a->act, &a->fc, &a->up));
    }
    /* TP: mlp_proj is row-parallel, its products are partial sums to
     * all-reduce over tp (SP: reduce-scatter) before bias and residual; the
     * fused op is valid only with tp = 1 (today) and a TP implementation
     * must split it as in cai_attn_fwd (linear_fwd into a scratch, all-reduce,
     * bias_add, add). */
    CAI_CALL(ops->linear_residual_fwd(dev, out, &a->act, &p->mlp_proj_w, opt_in(&p->mlp_proj_b), inp));
    return CAI_OK;
}

cai_status cai_mlp_bwd(cai_device_t *dev, const cai_layer_dims *d, const cai_block_params *p, cai_block_params *g,
                       const cai_block_acts *a, cai_block_scratch *s, const cai_tensor *inp, cai_tensor *d_stream) {
    const cai_ops *ops = dev->ops;
    if (is_gpt2(d)) {
        /* mlp_proj is row-parallel: its input gradient dout W is complete on
         * each rank for the rank's own hidden units, so no collective sits
         * between the matmul and the GELU backward and the two fuse into one
         * op writing dfc directly (s->dact is not used).
         * SP: all-gather d_stream before this op. */
        CAI_CALL(ops->linear_bwd_dgelu(dev, &s->dfc, opt_out(&g->mlp_proj_w), opt_out(&g->mlp_proj_b), d_stream,
                                       &a->act, &p->mlp_proj_w, &a->fc));
        CAI_CALL(ops->linear_bwd(dev, &s->dln, opt_out(&g->fc_w), opt_out(&g->fc_b), &s->dfc, &a->ln2, &p->fc_w, 0));
    } else {
        CAI_CALL(ops->linear_bwd(dev, &s->dact, opt_out(&g->mlp_proj_w), opt_out(&g->mlp_proj_b), d_stream, &a->act,
                                 &p->mlp_proj_w, 0));
        CAI_CALL(ops->swiglu_bwd(dev, &s->dfc, &s->dup, &s->dact, &a->fc, &a->up));
        CAI_CALL(ops->linear_bwd(dev, &s->dln, opt_out(&g->fc_w), NULL, &s->dfc, &a->ln2, &p->fc_w, 0));
        CAI_CALL(ops->linear_bwd(dev, &s->dln, opt_out(&g->up_w), NULL, &s->dup, &a->ln2, &p->up_w, 1));
    }
    /* TP: all-reduce s->dln over tp (SP: reduce-scatter). */
    CAI_CALL(norm_bwd(dev, d, d_stream, &g->ln2_w, &g->ln2_b, &s->dln, inp, &p->ln2_w, &a->ln2_mean, &a->ln2_rstd, 1));
    return CAI_OK;
}

/* ------------------------------------------------------------ block */

cai_status cai_block_fwd(cai_device_t *dev, const cai_layer_dims *d, const cai_block_params *p, cai_block_acts *a,
                         cai_block_scratch *s, const cai_tensor *inp, cai_tensor *out) {
    CAI_CALL(cai_attn_fwd(dev, d, p, a, s, inp, &a->res_mid));
    CAI_CALL(cai_mlp_fwd(dev, d, p, a, s, &a->res_mid, out));
    return CAI_OK;
}

cai_status cai_block_bwd(cai_device_t *dev, const cai_layer_dims *d, const cai_block_params *p, cai_block_params *g,
                         const cai_block_acts *a, cai_block_scratch *s, const cai_tensor *inp, cai_tensor *d_stream) {
    CAI_CALL(cai_mlp_bwd(dev, d, p, g, a, s, &a->res_mid, d_stream));
    CAI_CALL(cai_attn_bwd(dev, d, p, g, a, s, inp, d_stream));
    return CAI_OK;
}

/* ------------------------------------------------------------ embedding */

cai_status cai_embed_fwd(cai_device_t *dev, const cai_layer_dims *d, const cai_tensor *wte, const cai_tensor *wpe,
                         const cai_tensor *tokens, cai_tensor *out) {
    /* TP: vocab-parallel rows outside this shard come out zero; all-reduce out over tp. */
    return dev->ops->embedding_fwd(dev, out, tokens, wte, opt_in(wpe), d->vocab_offset, d->vocab_valid, d->pos_offset);
}

cai_status cai_embed_bwd(cai_device_t *dev, const cai_layer_dims *d, cai_tensor *dwte, cai_tensor *dwpe,
                         const cai_tensor *tokens, const cai_tensor *dout) {
    return dev->ops->embedding_bwd(dev, opt_out(dwte), opt_out(dwpe), dout, tokens, d->vocab_offset, d->pos_offset);
}

/* ------------------------------------------------------------ head + loss */

/* The head's forward; grad_scale non-NULL: the loss gradient too, in the
 * same pass over the logits (in place). */
static cai_status head_fwd(cai_device_t *dev, const cai_layer_dims *d, const cai_tensor *lnf_w, const cai_tensor *lnf_b,
                           const cai_tensor *head_w, cai_head_acts *h, const cai_tensor *inp, const cai_tensor *targets,
                           const float *grad_scale) {
    const cai_ops *ops = dev->ops;
    h->logits_hold_grad = 0;
    CAI_CALL(norm_fwd(dev, d, &h->lnf, &h->lnf_mean, &h->lnf_rstd, inp, lnf_w, lnf_b));
    /* SP: all-gather h->lnf; TP: the head is vocab-parallel, each rank has its logit columns. */
    CAI_CALL(ops->linear_fwd(dev, &h->logits, &h->lnf, head_w, NULL));
    if (!targets) return CAI_OK;
    /* TP: replace by xent_stats + all-reduce of max and sum-exp over tp. */
    if (grad_scale) {
        CAI_CALL(ops->xent_fwd_bwd(dev, &h->losses, &h->lse, &h->logits, &h->logits, targets, *grad_scale,
                                   d->vocab_offset, d->vocab_valid, CAI_IGNORE_INDEX));
        h->logits_hold_grad = 1;
    } else {
        CAI_CALL(ops->xent_fwd(dev, &h->losses, &h->lse, &h->logits, targets, d->vocab_offset, d->vocab_valid,
                               CAI_IGNORE_INDEX));
    }
    CAI_CALL(ops->fill(dev, &h->loss_sum, 0.0f));
    CAI_CALL(ops->sum(dev, &h->loss_sum, &h->losses));
    return CAI_OK;
}

cai_status cai_head_fwd(cai_device_t *dev, const cai_layer_dims *d, const cai_tensor *lnf_w, const cai_tensor *lnf_b,
                        const cai_tensor *head_w, cai_head_acts *h, const cai_tensor *inp, const cai_tensor *targets) {
    return head_fwd(dev, d, lnf_w, lnf_b, head_w, h, inp, targets, NULL);
}

cai_status cai_head_fwd_train(cai_device_t *dev, const cai_layer_dims *d, const cai_tensor *lnf_w,
                              const cai_tensor *lnf_b, const cai_tensor *head_w, cai_head_acts *h,
                              const cai_tensor *inp, const cai_tensor *targets, float dloss_scale) {
    CAI_CHECK_ARG(targets, "cai_head_fwd_train: targets are NULL (a training step has them)");
    return head_fwd(dev, d, lnf_w, lnf_b, head_w, h, inp, targets, &dloss_scale);
}

cai_status cai_head_bwd(cai_device_t *dev, const cai_layer_dims *d, const cai_tensor *lnf_w, const cai_tensor *head_w,
                        cai_tensor *dlnf_w, cai_tensor *dlnf_b, cai_tensor *dhead_w, cai_head_acts *h,
                        const cai_tensor *inp, const cai_tensor *targets, float dloss_scale, cai_tensor *dln,
                        cai_tensor *d_stream) {
    const cai_ops *ops = dev->ops;
    /* In place: the logits are not needed once their gradient exists
     * (cai_head_fwd_train has made it already). */
    if (!h->logits_hold_grad)
        CAI_CALL(ops->xent_bwd(dev, &h->logits, &h->logits, &h->lse, targets, NULL, dloss_scale, d->vocab_offset,
                               d->vocab_valid, CAI_IGNORE_INDEX));
    h->logits_hold_grad = 0;
    CAI_CALL(ops->linear_bwd(dev, dln, opt_out(dhead_w), NULL, &h->logits, &h->lnf, head_w, 0));
    /* TP: all-reduce dln over tp (vocab-parallel head). */
    CAI_CALL(norm_bwd(dev, d, d_stream, dlnf_w, dlnf_b, dln, inp, lnf_w, &h->lnf_mean, &h->lnf_rstd, 0));
    return CAI_OK;
}

/* ------------------------------------------------------------ buffers */

/* Carves tensors from an arena, or (arena NULL) only adds up the bytes the
 * same carving would take, so sizing and carving cannot drift apart. */
typedef struct {
    cai_device_t *dev;
    cai_arena_t *arena;
    size_t bytes;
} carver;

#define CARVE_ALIGN 64

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static cai_status carve(carver *c, cai_tensor *t, cai_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    int64_t shape[3] = {d0, d1, d2};
    if (!c->arena) {
        cai_tensor tmp;
        CAI_CALL(cai_tensor_init(&tmp, c->dev, NULL, dt, ndim, shape));
        c->bytes += round_up(cai_tensor_nbytes(&tmp), CARVE_ALIGN);
        memset(t, 0, sizeof *t);
        return CAI_OK;
    }
    CAI_CALL(cai_tensor_arena(t, c->arena, c->dev, dt, ndim, shape));
    return CAI_OK;
}

static cai_status carve_raw(carver *c, size_t bytes, void **out) {
    if (!c->arena) {
        c->bytes += round_up(bytes, CARVE_ALIGN);
        *out = NULL;
        return CAI_OK;
    }
    *out = NULL;
    if (bytes == 0) return CAI_OK;
    CAI_CALL(cai_arena_alloc(c->arena, bytes, CARVE_ALIGN, out));
    return CAI_OK;
}

static cai_status check_dims(const cai_layer_dims *d) {
    CAI_CHECK_ARG(d != NULL, "layer dims are NULL");
    CAI_CHECK_ARG(d->family >= 0 && d->family < CAI_MODEL_FAMILY_COUNT, "layer dims: unknown family %d",
                  (int)d->family);
    CAI_CHECK_ARG(d->B >= 1 && d->T >= 1 && d->C >= 1 && d->n_heads >= 1 && d->n_kv_heads >= 1 && d->head_dim >= 1 &&
                      d->ffn >= 1,
                  "layer dims: B=%lld T=%lld C=%lld heads=%lld kv_heads=%lld head_dim=%lld ffn=%lld must all be >= 1",
                  (long long)d->B, (long long)d->T, (long long)d->C, (long long)d->n_heads, (long long)d->n_kv_heads,
                  (long long)d->head_dim, (long long)d->ffn);
    CAI_CHECK_ARG(d->n_heads % d->n_kv_heads == 0, "layer dims: %lld query heads are not a multiple of %lld kv heads",
                  (long long)d->n_heads, (long long)d->n_kv_heads);
    return CAI_OK;
}

static cai_status carve_acts(carver *c, const cai_layer_dims *d, cai_block_acts *a) {
    CAI_CALL(check_dims(d));
    memset(a, 0, sizeof *a);
    const cai_dtype at = d->act_dtype, f32 = CAI_DTYPE_F32;
    const int64_t B = d->B, T = d->T, N = B * T, C = d->C, F = d->ffn;
    CAI_CALL(carve(c, &a->ln1, at, 3, B, T, C));
    if (is_gpt2(d)) CAI_CALL(carve(c, &a->ln1_mean, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &a->ln1_rstd, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &a->qkv, at, 3, B, T, qkv_width(d)));
    CAI_CALL(carve(c, &a->att, at, 3, B, T, d->n_heads * d->head_dim));
    CAI_CALL(carve(c, &a->att_lse, f32, 3, B, d->n_heads, T));
    CAI_CALL(carve(c, &a->res_mid, at, 3, B, T, C));
    CAI_CALL(carve(c, &a->ln2, at, 3, B, T, C));
    if (is_gpt2(d)) CAI_CALL(carve(c, &a->ln2_mean, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &a->ln2_rstd, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &a->fc, at, 3, B, T, F));
    if (!is_gpt2(d)) CAI_CALL(carve(c, &a->up, at, 3, B, T, F));
    CAI_CALL(carve(c, &a->act, at, 3, B, T, F));
    return CAI_OK;
}

size_t cai_block_acts_bytes(const cai_device_t *dev, const cai_layer_dims *d) {
    carver c = {(cai_device_t *)dev, NULL, 0};
    cai_block_acts a;
    if (carve_acts(&c, d, &a) != CAI_OK) return 0;
    return c.bytes;
}

cai_status cai_block_acts_carve(cai_device_t *dev, cai_arena_t *arena, const cai_layer_dims *d, cai_block_acts *acts) {
    CAI_CHECK_ARG(dev && arena && acts, "cai_block_acts_carve: NULL argument");
    carver c = {dev, arena, 0};
    CAI_CALL(carve_acts(&c, d, acts));
    return CAI_OK;
}

static cai_status carve_scratch(carver *c, const cai_layer_dims *d, int64_t max_pos, cai_block_scratch *s) {
    CAI_CALL(check_dims(d));
    memset(s, 0, sizeof *s);
    const cai_dtype at = d->act_dtype;
    const int64_t B = d->B, T = d->T, C = d->C, F = d->ffn;
    CAI_CALL(carve(c, &s->dln, at, 3, B, T, C));
    CAI_CALL(carve(c, &s->datt, at, 3, B, T, d->n_heads * d->head_dim));
    CAI_CALL(carve(c, &s->dqkv, at, 3, B, T, qkv_width(d)));
    CAI_CALL(carve(c, &s->dact, at, 3, B, T, F));
    if (is_gpt2(d)) {
        if (c->arena) s->dfc = s->dact; /* GPT-2 needs one [B,T,F] gradient: linear_bwd_dgelu writes dfc directly */
    } else {
        CAI_CALL(carve(c, &s->dfc, at, 3, B, T, F));
        CAI_CALL(carve(c, &s->dup, at, 3, B, T, F));
        CAI_CHECK_ARG(d->head_dim % 2 == 0, "layer dims: RoPE needs an even head_dim, got %lld",
                      (long long)d->head_dim);
        CAI_CHECK_ARG(max_pos >= d->pos_offset + d->T,
                      "layer dims: RoPE tables for %lld positions cannot cover "
                      "positions up to %lld",
                      (long long)max_pos, (long long)(d->pos_offset + d->T));
        CAI_CALL(carve(c, &s->rope_cos, CAI_DTYPE_F32, 2, max_pos, d->head_dim / 2, 0));
        CAI_CALL(carve(c, &s->rope_sin, CAI_DTYPE_F32, 2, max_pos, d->head_dim / 2, 0));
    }
    s->attn_ws_bytes = c->dev->ops->attention_workspace_bytes(c->dev, B, T, T, d->n_heads, d->n_kv_heads, d->head_dim);
    CAI_CALL(carve_raw(c, s->attn_ws_bytes, &s->attn_ws));
    return CAI_OK;
}

size_t cai_block_scratch_bytes(const cai_device_t *dev, const cai_layer_dims *d, int64_t max_pos) {
    carver c = {(cai_device_t *)dev, NULL, 0};
    cai_block_scratch s;
    if (carve_scratch(&c, d, max_pos, &s) != CAI_OK) return 0;
    return c.bytes;
}

cai_status cai_block_scratch_carve(cai_device_t *dev, cai_arena_t *arena, const cai_layer_dims *d, int64_t max_pos,
                                   double rope_theta, cai_block_scratch *s) {
    CAI_CHECK_ARG(dev && arena && s, "cai_block_scratch_carve: NULL argument");
    carver c = {dev, arena, 0};
    CAI_CALL(carve_scratch(&c, d, max_pos, s));
    if (!is_gpt2(d)) CAI_CALL(dev->ops->rope_tables(dev, &s->rope_cos, &s->rope_sin, rope_theta));
    return CAI_OK;
}

static cai_status carve_head(carver *c, const cai_layer_dims *d, cai_head_acts *h) {
    CAI_CALL(check_dims(d));
    CAI_CHECK_ARG(d->vocab_local >= 1 && d->vocab_valid >= 1,
                  "layer dims: vocab_local=%lld vocab_valid=%lld must "
                  "be >= 1",
                  (long long)d->vocab_local, (long long)d->vocab_valid);
    memset(h, 0, sizeof *h);
    const cai_dtype at = d->act_dtype, f32 = CAI_DTYPE_F32;
    const int64_t B = d->B, T = d->T, N = B * T;
    CAI_CALL(carve(c, &h->lnf, at, 3, B, T, d->C));
    if (is_gpt2(d)) CAI_CALL(carve(c, &h->lnf_mean, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &h->lnf_rstd, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &h->logits, at, 3, B, T, d->vocab_local));
    CAI_CALL(carve(c, &h->losses, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &h->lse, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &h->loss_sum, f32, 1, 1, 0, 0));
    return CAI_OK;
}

size_t cai_head_acts_bytes(const cai_device_t *dev, const cai_layer_dims *d) {
    carver c = {(cai_device_t *)dev, NULL, 0};
    cai_head_acts h;
    if (carve_head(&c, d, &h) != CAI_OK) return 0;
    return c.bytes;
}

cai_status cai_head_acts_carve(cai_device_t *dev, cai_arena_t *arena, const cai_layer_dims *d, cai_head_acts *h) {
    CAI_CHECK_ARG(dev && arena && h, "cai_head_acts_carve: NULL argument");
    carver c = {dev, arena, 0};
    CAI_CALL(carve_head(&c, d, h));
    return CAI_OK;
}
