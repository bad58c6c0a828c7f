/* Transformer layers over the op table: attention and MLP sublayers, the
 * block, the embedding and the head with its fused cross-entropy. Every
 * function works on caller-provided buffers and allocates nothing.
 *
 * Tensor parallelism (Megatron's): the dims are the LOCAL head / hidden /
 * vocabulary counts. QKV and the MLP up/gate matmuls are column-parallel
 * (their outputs are this rank's heads or hidden units, complete), the two
 * output projections row-parallel (their outputs are partial sums, summed
 * over tp before the bias and the residual), so the forward has one
 * all-reduce per sublayer and the backward one more, for the input gradient
 * of each column-parallel matmul. tp = 1 is the degenerate case and keeps
 * the fused matmul + bias + residual kernel, which a partial sum cannot use.
 *
 * Sequence parallelism (split-gather) splits each of those all-reduces into
 * its two halves around the token-wise part of the block: the residual
 * stream and the norms hold this rank's block of tokens, the norm output is
 * all-gathered before a column-parallel matmul and a row-parallel product
 * reduce-scattered back to the rank's tokens; the backward runs the
 * conjugates (all-gather of d_stream, reduce-scatter of the input
 * gradient). The same bytes cross the network as with the all-reduces;
 * what is saved is the residual-stream activation memory, divided by tp. */
#include "cai_config.h"
#include "colossal/fp8.h"
#include "colossal/lora.h"
#include "colossal/model.h"
#include "colossal/ops.h"

#include <math.h>
#include <string.h>

cai_layer_ctx cai_layer_ctx_local(cai_device_t *dev) {
    cai_layer_ctx c = {dev, NULL, 1, 0, 0, NULL, NULL, NULL};
    return c;
}

static int tp_on(const cai_layer_ctx *cx) { return cx->tp_size > 1; }
static int sp_on(const cai_layer_ctx *cx) { return cx->tp_size > 1 && cx->seq_parallel; }

/* Block k of the tp blocks of tokens of a whole-sequence [B,T,X] buffer, as [1, B*T/tp, X]. */
static cai_status token_block(const cai_layer_ctx *cx, const cai_tensor *full, int k, cai_tensor *out) {
    const int64_t X = full->shape[full->ndim - 1], n = cai_tensor_numel(full) / X / cx->tp_size;
    cai_tensor flat;
    CAI_CALL(cai_tensor_reshape(full, 3, (int64_t[]){1, n * cx->tp_size, X}, &flat));
    return cai_tensor_narrow(&flat, 1, n * k, n, out);
}

/* full [B,T,X] = every rank's [1, B*T/tp, X] block, in rank order. */
static cai_status seq_gather(const cai_layer_ctx *cx, const cai_tensor *local, cai_tensor *full) {
    return cai_all_gather(cx->mesh, CAI_AXIS_TP, local->data, full->data, (size_t)cai_tensor_numel(local),
                          local->dtype);
}

/* local [1, B*T/tp, X] = this rank's block of the sum over tp of full. */
static cai_status seq_scatter(const cai_layer_ctx *cx, const cai_tensor *full, cai_tensor *local) {
    return cai_reduce_scatter(cx->mesh, CAI_AXIS_TP, full->data, local->data, (size_t)cai_tensor_numel(local),
                              full->dtype, CAI_RED_SUM);
}

/* The reduce-scatter in place: the sum lands in the first B*T/tp rows of
 * full, which *local then views. */
static cai_status seq_scatter_inplace(const cai_layer_ctx *cx, cai_tensor *full, cai_tensor *local) {
    CAI_CALL(token_block(cx, full, 0, local));
    return cai_reduce_scatter(cx->mesh, CAI_AXIS_TP, full->data, full->data, (size_t)cai_tensor_numel(local),
                              full->dtype, CAI_RED_SUM);
}

/* Sum a contiguous activation over the tp group, in place. */
static cai_status tp_sum(const cai_layer_ctx *cx, cai_tensor *t) {
    if (!tp_on(cx)) return CAI_OK;
    return cai_allreduce(cx->mesh, CAI_AXIS_TP, t->data, t->data, (size_t)cai_tensor_numel(t), t->dtype, CAI_RED_SUM);
}

/* out = inp + x W^T (+ b) for a row-parallel W: fused at tp = 1; otherwise
 * the partial product is summed over tp before the replicated bias and the
 * residual are added once. */
static cai_status row_parallel_residual(const cai_layer_ctx *cx, cai_block_scratch *s, const cai_fp8_layer *fp8,
                                        cai_fp8_site site, cai_tensor *out, const cai_tensor *x, const cai_tensor *w,
                                        const cai_tensor *b, const cai_tensor *inp) {
    cai_device_t *dev = cx->dev;
    const int f8 = cai_fp8_at(fp8, site);
    if (!tp_on(cx) && f8) return cai_fp8_linear_fwd(fp8, site, out, x, w, b, inp);
    if (!tp_on(cx)) return dev->ops->linear_residual_fwd(dev, out, x, w, b, inp);
    if (f8) CAI_CALL(cai_fp8_linear_fwd(fp8, site, &s->tp_out, x, w, NULL, NULL));
    else CAI_CALL(dev->ops->linear_fwd(dev, &s->tp_out, x, w, NULL));
    cai_tensor sum = s->tp_out;
    if (sp_on(cx)) CAI_CALL(seq_scatter_inplace(cx, &s->tp_out, &sum));
    else CAI_CALL(tp_sum(cx, &s->tp_out));
    if (b) CAI_CALL(dev->ops->bias_add(dev, &sum, b));
    return dev->ops->add(dev, out, &sum, inp);
}

/* The input of a column-parallel matmul: the norm output itself, or under
 * sequence parallelism every rank's tokens of it gathered into s->seq_full. */
static cai_status column_input(const cai_layer_ctx *cx, cai_block_scratch *s, const cai_tensor *ln,
                               const cai_tensor **x) {
    *x = ln;
    if (!sp_on(cx)) return CAI_OK;
    CAI_CALL(seq_gather(cx, ln, &s->seq_full));
    *x = &s->seq_full;
    return CAI_OK;
}

/* d(out) of a row-parallel product: d_stream, or under sequence
 * parallelism every rank's tokens of it gathered into s->seq_grad. */
static cai_status row_output_grad(const cai_layer_ctx *cx, cai_block_scratch *s, const cai_tensor *d_stream,
                                  const cai_tensor **dout) {
    *dout = d_stream;
    if (!sp_on(cx)) return CAI_OK;
    CAI_CALL(seq_gather(cx, d_stream, &s->seq_grad));
    *dout = &s->seq_grad;
    return CAI_OK;
}

/* As row_output_grad, kept in `keep` for a split backward's weight pass
 * (NULL: not split). d_stream itself cannot be kept: the norm's backward
 * adds into it before the weight pass runs. */
static cai_status row_output_grad_kept(const cai_layer_ctx *cx, cai_block_scratch *s, const cai_tensor *d_stream,
                                       cai_tensor *keep, const cai_tensor **dout) {
    if (!keep) return row_output_grad(cx, s, d_stream, dout);
    *dout = keep;
    if (sp_on(cx)) return seq_gather(cx, d_stream, keep);
    return cai_device_copy(cx->dev, keep->data, d_stream->data, cai_tensor_nbytes(d_stream),
                           cx->dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2D);
}

/* The norm's input gradient from a column-parallel matmul's partial one
 * (this rank's heads / hidden units / vocabulary columns): summed over tp,
 * or under sequence parallelism reduce-scattered to this rank's tokens. */
static cai_status column_input_grad(const cai_layer_ctx *cx, cai_tensor *dln_full, cai_tensor *dln) {
    *dln = *dln_full;
    if (sp_on(cx)) return seq_scatter_inplace(cx, dln_full, dln);
    return tp_sum(cx, dln_full);
}

/* Absent parameters (Llama biases, GPT-2's up projection) have data == NULL;
 * the ops take NULL for "none". */
static const cai_tensor *opt_in(const cai_tensor *t) { return t && t->data ? t : NULL; }
static cai_tensor *opt_out(cai_tensor *t) { return t && t->data ? t : NULL; }

/* A block's linear layer, through the FP8 products where the block runs in
 * FP8 (colossal/fp8.h). */
static cai_status lin_fwd(cai_device_t *dev, const cai_block_params *p, cai_fp8_site site, cai_tensor *out,
                          const cai_tensor *x, const cai_tensor *w, const cai_tensor *b) {
    if (cai_fp8_at(p->fp8, site)) return cai_fp8_linear_fwd(p->fp8, site, out, x, w, b, NULL);
    return dev->ops->linear_fwd(dev, out, x, w, b);
}
static cai_status lin_bwd(cai_device_t *dev, const cai_block_params *p, cai_fp8_site site, cai_tensor *dinp,
                          cai_tensor *dw, cai_tensor *db, const cai_tensor *dout, const cai_tensor *x,
                          const cai_tensor *w, int accum_dinp) {
    if (cai_fp8_at(p->fp8, site)) return cai_fp8_linear_bwd(p->fp8, site, dinp, dw, db, dout, x, w, accum_dinp);
    return dev->ops->linear_bwd(dev, dinp, dw, db, dout, x, w, accum_dinp);
}

static int layernorm(const cai_layer_dims *d) { return d->kinds.norm == CAI_NORM_LAYERNORM; }
static int rope(const cai_layer_dims *d) { return d->kinds.pos == CAI_POS_ROPE; }

static int64_t qkv_width(const cai_layer_dims *d) { return (d->n_heads + 2 * d->n_kv_heads) * d->head_dim; }

static cai_attn_params causal_params(const cai_layer_ctx *cx) {
    cai_attn_params p = {.scale = 0.0f, .causal = 1, .causal_offset = 0, .window = 0, .doc_ids = cx->doc_ids};
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
    if (layernorm(d)) return dev->ops->layernorm_fwd(dev, out, mean, rstd, inp, w, opt_in(b), d->norm_eps);
    return dev->ops->rmsnorm_fwd(dev, out, rstd, inp, w, d->norm_eps);
}

/* Under sequence parallelism the weight and bias gradients cover this
 * rank's tokens only; they stay partial here (summed over tp once per step
 * by the gradient sync: cai_registry_grad_axes), which keeps collectives
 * out of every microbatch's backward. */
static cai_status norm_bwd(cai_device_t *dev, const cai_layer_dims *d, cai_tensor *dinp, cai_tensor *dw, cai_tensor *db,
                           const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *w, const cai_tensor *mean,
                           const cai_tensor *rstd, int accum) {
    if (layernorm(d))
        return dev->ops->layernorm_bwd(dev, dinp, opt_out(dw), opt_out(db), dout, inp, w, mean, rstd, accum);
    return dev->ops->rmsnorm_bwd(dev, dinp, opt_out(dw), dout, inp, w, rstd, accum);
}

/* ------------------------------------------------------------ attention */

cai_status cai_attn_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p, cai_block_acts *a,
                        cai_block_scratch *s, const cai_tensor *inp, cai_tensor *out) {
    cai_device_t *dev = cx->dev;
    const cai_ops *ops = dev->ops;
    CAI_CALL(norm_fwd(dev, d, &a->ln1, &a->ln1_mean, &a->ln1_rstd, inp, &p->ln1_w, &p->ln1_b));
    const cai_tensor *x;
    CAI_CALL(column_input(cx, s, &a->ln1, &x));
    CAI_CALL(lin_fwd(dev, p, CAI_FP8_SITE_QKV, &a->qkv, x, &p->qkv_w, opt_in(&p->qkv_b)));
    CAI_CALL(cai_lora_fwd(p->lora, CAI_LORA_SITE_QKV, x, &a->qkv));
    cai_tensor q, k, v, att4;
    CAI_CALL(split_qkv(d, &a->qkv, &q, &k, &v));
    if (rope(d)) {
        /* Rotated in place: backward needs only the rotated q and k. */
        CAI_CALL(ops->rope_fwd(dev, &q, &q, &s->rope_cos, &s->rope_sin, cx->positions, d->pos_offset));
        CAI_CALL(ops->rope_fwd(dev, &k, &k, &s->rope_cos, &s->rope_sin, cx->positions, d->pos_offset));
    }
    CAI_CALL(cai_tensor_unflatten(&a->att, 2, d->head_dim, &att4));
    cai_attn_params ap = causal_params(cx);
    if (cx->attn) CAI_CALL(cx->attn->fwd(cx->attn->ctx, &att4, &a->att_lse, &q, &k, &v, &ap));
    else CAI_CALL(ops->attention_fwd(dev, &att4, &a->att_lse, &q, &k, &v, &ap, s->attn_ws, s->attn_ws_bytes));
    CAI_CALL(row_parallel_residual(cx, s, p->fp8, CAI_FP8_SITE_ATTN_PROJ, out, &a->att, &p->proj_w, opt_in(&p->proj_b),
                                   inp));
    CAI_CALL(cai_lora_fwd(p->lora, CAI_LORA_SITE_ATTN_PROJ, &a->att, out));
    return CAI_OK;
}

/* Matmul weight gradients are written here unless w is set (a split
 * backward's input pass): then the output gradients they need are kept in
 * w and cai_block_bwd_weight computes them. */
static cai_tensor *wgrad_now(const cai_block_wgrad *w, cai_tensor *g) { return w ? NULL : opt_out(g); }

static cai_status attn_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                           cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s, cai_block_wgrad *w,
                           const cai_tensor *inp, cai_tensor *d_stream) {
    cai_device_t *dev = cx->dev;
    const cai_ops *ops = dev->ops;
    /* d(out) reaches both the residual (unchanged, stays in d_stream) and
     * the projection; d(out) over the whole sequence is the same on every tp
     * rank, so the replicated bias' gradient is complete everywhere. */
    const cai_tensor *dout, *x;
    CAI_CALL(row_output_grad_kept(cx, s, d_stream, w ? &w->d_proj : NULL, &dout));
    CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_ATTN_PROJ, &s->datt, wgrad_now(w, &g->proj_w), wgrad_now(w, &g->proj_b), dout,
                     &a->att, &p->proj_w, 0));
    CAI_CALL(cai_lora_bwd(p->lora, CAI_LORA_SITE_ATTN_PROJ, &a->att, dout, &s->datt));
    cai_tensor *dqkv = w ? &w->dqkv : &s->dqkv;
    cai_tensor q, k, v, dq, dk, dv, att4, datt4;
    CAI_CALL(split_qkv(d, &a->qkv, &q, &k, &v));
    CAI_CALL(split_qkv(d, dqkv, &dq, &dk, &dv));
    CAI_CALL(cai_tensor_unflatten(&a->att, 2, d->head_dim, &att4));
    CAI_CALL(cai_tensor_unflatten(&s->datt, 2, d->head_dim, &datt4));
    cai_attn_params ap = causal_params(cx);
    if (cx->attn) CAI_CALL(cx->attn->bwd(cx->attn->ctx, &dq, &dk, &dv, &datt4, &q, &k, &v, &att4, &a->att_lse, &ap));
    else
        CAI_CALL(ops->attention_bwd(dev, &dq, &dk, &dv, &datt4, &q, &k, &v, &att4, &a->att_lse, &ap, s->attn_ws,
                                    s->attn_ws_bytes));
    if (rope(d)) {
        CAI_CALL(ops->rope_bwd(dev, &dq, &dq, &s->rope_cos, &s->rope_sin, cx->positions, d->pos_offset));
        CAI_CALL(ops->rope_bwd(dev, &dk, &dk, &s->rope_cos, &s->rope_sin, cx->positions, d->pos_offset));
    }
    /* Sequence parallel: the norm output is gathered again rather than kept
     * whole from the forward (what keeps the saved activations at B*T/tp);
     * the input gradient alone does not read it. */
    if (w) CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_QKV, &s->dln, NULL, NULL, dqkv, NULL, &p->qkv_w, 0));
    else {
        CAI_CALL(column_input(cx, s, &a->ln1, &x));
        CAI_CALL(
            lin_bwd(dev, p, CAI_FP8_SITE_QKV, &s->dln, opt_out(&g->qkv_w), opt_out(&g->qkv_b), dqkv, x, &p->qkv_w, 0));
    }
    /* LoRA runs at tp = 1 only, where the linear's input is the norm output itself. */
    CAI_CALL(cai_lora_bwd(p->lora, CAI_LORA_SITE_QKV, &a->ln1, dqkv, &s->dln));
    /* The column-parallel input gradient covers this rank's heads only. */
    cai_tensor dln;
    CAI_CALL(column_input_grad(cx, &s->dln, &dln));
    CAI_CALL(norm_bwd(cx->dev, d, d_stream, &g->ln1_w, &g->ln1_b, &dln, inp, &p->ln1_w, &a->ln1_mean, &a->ln1_rstd, 1));
    return CAI_OK;
}

cai_status cai_attn_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                        cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s, const cai_tensor *inp,
                        cai_tensor *d_stream) {
    return attn_bwd(cx, d, p, g, a, s, NULL, inp, d_stream);
}

/* ------------------------------------------------------------ MLP */

/* Each MLP kind's part between the norm output x (the whole sequence) and
 * the row-parallel output projection's input a->act; backward, from d(out)
 * to the projection's and its own weight gradients and this rank's partial
 * input gradient s->dln. */

static cai_status mlp_gelu_fwd(const cai_layer_ctx *cx, const cai_block_params *p, cai_block_acts *a,
                               const cai_tensor *x) {
    /* fc is column-parallel: each rank's hidden units are complete, so the
     * GELU needs no communication and fuses into the matmul (a->fc keeps
     * the GELU input for backward). An adapter on fc adds before the GELU. */
    cai_device_t *dev = cx->dev;
    if (!cai_lora_at(p->lora, CAI_LORA_SITE_FC)) {
        if (cai_fp8_at(p->fp8, CAI_FP8_SITE_FC))
            return cai_fp8_linear_gelu_fwd(p->fp8, CAI_FP8_SITE_FC, &a->act, &a->fc, x, &p->fc_w, opt_in(&p->fc_b));
        return dev->ops->linear_gelu_fwd(dev, &a->act, &a->fc, x, &p->fc_w, opt_in(&p->fc_b));
    }
    CAI_CALL(lin_fwd(dev, p, CAI_FP8_SITE_FC, &a->fc, x, &p->fc_w, opt_in(&p->fc_b)));
    CAI_CALL(cai_lora_fwd(p->lora, CAI_LORA_SITE_FC, x, &a->fc));
    return dev->ops->gelu_fwd(dev, &a->act, &a->fc);
}

static cai_status mlp_gelu_bwd(const cai_layer_ctx *cx, const cai_block_params *p, cai_block_params *g,
                               const cai_block_acts *a, cai_block_scratch *s, cai_block_wgrad *w,
                               const cai_tensor *dout) {
    cai_device_t *dev = cx->dev;
    cai_tensor *dfc = w ? &w->dfc : &s->dfc;
    /* mlp_proj is row-parallel: its input gradient dout W is complete on
     * each rank for the rank's own hidden units, so no collective sits
     * between the matmul and the GELU backward and the two fuse into one op
     * writing dfc directly (s->dact is not used). */
    if (cai_lora_at(p->lora, CAI_LORA_SITE_MLP_PROJ)) {
        /* the adapter's input gradient joins before the GELU: unfused
         * (gelu_bwd may run in place) */
        CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_MLP_PROJ, &s->dact, wgrad_now(w, &g->mlp_proj_w),
                         wgrad_now(w, &g->mlp_proj_b), dout, &a->act, &p->mlp_proj_w, 0));
        CAI_CALL(cai_lora_bwd(p->lora, CAI_LORA_SITE_MLP_PROJ, &a->act, dout, &s->dact));
        CAI_CALL(dev->ops->gelu_bwd(dev, dfc, &a->fc, &s->dact));
    } else if (cai_fp8_at(p->fp8, CAI_FP8_SITE_MLP_PROJ)) {
        CAI_CALL(cai_fp8_linear_bwd_dgelu(p->fp8, CAI_FP8_SITE_MLP_PROJ, dfc, wgrad_now(w, &g->mlp_proj_w),
                                          wgrad_now(w, &g->mlp_proj_b), dout, &a->act, &p->mlp_proj_w, &a->fc));
    } else {
        CAI_CALL(dev->ops->linear_bwd_dgelu(dev, dfc, wgrad_now(w, &g->mlp_proj_w), wgrad_now(w, &g->mlp_proj_b), dout,
                                            &a->act, &p->mlp_proj_w, &a->fc));
    }
    if (w) CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_FC, &s->dln, NULL, NULL, dfc, NULL, &p->fc_w, 0));
    else {
        const cai_tensor *x;
        CAI_CALL(column_input(cx, s, &a->ln2, &x));
        CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_FC, &s->dln, opt_out(&g->fc_w), opt_out(&g->fc_b), dfc, x, &p->fc_w, 0));
    }
    return cai_lora_bwd(p->lora, CAI_LORA_SITE_FC, &a->ln2, dfc, &s->dln);
}

static cai_status mlp_swiglu_fwd(const cai_layer_ctx *cx, const cai_block_params *p, cai_block_acts *a,
                                 const cai_tensor *x) {
    cai_device_t *dev = cx->dev;
    CAI_CALL(lin_fwd(dev, p, CAI_FP8_SITE_FC, &a->fc, x, &p->fc_w, NULL));
    CAI_CALL(lin_fwd(dev, p, CAI_FP8_SITE_UP, &a->up, x, &p->up_w, NULL));
    CAI_CALL(cai_lora_fwd(p->lora, CAI_LORA_SITE_FC, x, &a->fc));
    CAI_CALL(cai_lora_fwd(p->lora, CAI_LORA_SITE_UP, x, &a->up));
    return dev->ops->swiglu_fwd(dev, &a->act, &a->fc, &a->up);
}

static cai_status mlp_swiglu_bwd(const cai_layer_ctx *cx, const cai_block_params *p, cai_block_params *g,
                                 const cai_block_acts *a, cai_block_scratch *s, cai_block_wgrad *w,
                                 const cai_tensor *dout) {
    cai_device_t *dev = cx->dev;
    const cai_ops *ops = dev->ops;
    cai_tensor *dfc = w ? &w->dfc : &s->dfc, *dup = w ? &w->dup : &s->dup;
    CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_MLP_PROJ, &s->dact, wgrad_now(w, &g->mlp_proj_w),
                     wgrad_now(w, &g->mlp_proj_b), dout, &a->act, &p->mlp_proj_w, 0));
    CAI_CALL(cai_lora_bwd(p->lora, CAI_LORA_SITE_MLP_PROJ, &a->act, dout, &s->dact));
    CAI_CALL(ops->swiglu_bwd(dev, dfc, dup, &s->dact, &a->fc, &a->up));
    const cai_tensor *x = NULL;
    if (!w) CAI_CALL(column_input(cx, s, &a->ln2, &x));
    CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_FC, &s->dln, wgrad_now(w, &g->fc_w), NULL, dfc, x, &p->fc_w, 0));
    CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_UP, &s->dln, wgrad_now(w, &g->up_w), NULL, dup, x, &p->up_w, 1));
    CAI_CALL(cai_lora_bwd(p->lora, CAI_LORA_SITE_FC, &a->ln2, dfc, &s->dln));
    return cai_lora_bwd(p->lora, CAI_LORA_SITE_UP, &a->ln2, dup, &s->dln);
}

static cai_status unknown_mlp(const cai_layer_dims *d) {
    return CAI_ERROR(CAI_ERR_INVALID_ARG, "layer dims: unknown MLP kind %d", (int)d->kinds.mlp);
}

cai_status cai_mlp_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p, cai_block_acts *a,
                       cai_block_scratch *s, const cai_tensor *inp, cai_tensor *out) {
    CAI_CALL(norm_fwd(cx->dev, d, &a->ln2, &a->ln2_mean, &a->ln2_rstd, inp, &p->ln2_w, &p->ln2_b));
    const cai_tensor *x;
    CAI_CALL(column_input(cx, s, &a->ln2, &x));
    switch (d->kinds.mlp) {
    case CAI_MLP_GELU: CAI_CALL(mlp_gelu_fwd(cx, p, a, x)); break;
    case CAI_MLP_SWIGLU: CAI_CALL(mlp_swiglu_fwd(cx, p, a, x)); break;
    default: return unknown_mlp(d);
    }
    CAI_CALL(row_parallel_residual(cx, s, p->fp8, CAI_FP8_SITE_MLP_PROJ, out, &a->act, &p->mlp_proj_w,
                                   opt_in(&p->mlp_proj_b), inp));
    CAI_CALL(cai_lora_fwd(p->lora, CAI_LORA_SITE_MLP_PROJ, &a->act, out));
    return CAI_OK;
}

static cai_status mlp_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                          cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s, cai_block_wgrad *w,
                          const cai_tensor *inp, cai_tensor *d_stream) {
    const cai_tensor *dout;
    CAI_CALL(row_output_grad_kept(cx, s, d_stream, w ? &w->d_mlp : NULL, &dout));
    switch (d->kinds.mlp) {
    case CAI_MLP_GELU: CAI_CALL(mlp_gelu_bwd(cx, p, g, a, s, w, dout)); break;
    case CAI_MLP_SWIGLU: CAI_CALL(mlp_swiglu_bwd(cx, p, g, a, s, w, dout)); break;
    default: return unknown_mlp(d);
    }
    cai_tensor dln;
    CAI_CALL(column_input_grad(cx, &s->dln, &dln));
    CAI_CALL(norm_bwd(cx->dev, d, d_stream, &g->ln2_w, &g->ln2_b, &dln, inp, &p->ln2_w, &a->ln2_mean, &a->ln2_rstd, 1));
    return CAI_OK;
}

cai_status cai_mlp_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p, cai_block_params *g,
                       const cai_block_acts *a, cai_block_scratch *s, const cai_tensor *inp, cai_tensor *d_stream) {
    return mlp_bwd(cx, d, p, g, a, s, NULL, inp, d_stream);
}

/* ------------------------------------------------------------ block */

cai_status cai_block_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p, cai_block_acts *a,
                         cai_block_scratch *s, const cai_tensor *inp, cai_tensor *out) {
    CAI_CALL(cai_attn_fwd(cx, d, p, a, s, inp, &a->res_mid));
    CAI_CALL(cai_mlp_fwd(cx, d, p, a, s, &a->res_mid, out));
    return CAI_OK;
}

cai_status cai_block_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                         cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s, const cai_tensor *inp,
                         cai_tensor *d_stream) {
    CAI_CALL(cai_mlp_bwd(cx, d, p, g, a, s, &a->res_mid, d_stream));
    CAI_CALL(cai_attn_bwd(cx, d, p, g, a, s, inp, d_stream));
    return CAI_OK;
}

cai_status cai_block_bwd_input(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                               cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s, cai_block_wgrad *w,
                               const cai_tensor *inp, cai_tensor *d_stream) {
    CAI_CHECK_ARG(w, "cai_block_bwd_input: NULL weight-pass stash");
    CAI_CALL(mlp_bwd(cx, d, p, g, a, s, w, &a->res_mid, d_stream));
    CAI_CALL(attn_bwd(cx, d, p, g, a, s, w, inp, d_stream));
    return CAI_OK;
}

/* The kept output gradients against the saved inputs, in the order the
 * fused backward accumulates them; under sequence parallelism the norm
 * outputs are gathered over tp again (every tp rank runs this pass at the
 * same point of its list). */
cai_status cai_block_bwd_weight(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                                cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s,
                                const cai_block_wgrad *w) {
    CAI_CHECK_ARG(w, "cai_block_bwd_weight: NULL weight-pass stash");
    cai_device_t *dev = cx->dev;
    const cai_tensor *x;
    CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_MLP_PROJ, NULL, opt_out(&g->mlp_proj_w), opt_out(&g->mlp_proj_b), &w->d_mlp,
                     &a->act, &p->mlp_proj_w, 0));
    CAI_CALL(column_input(cx, s, &a->ln2, &x));
    switch (d->kinds.mlp) {
    case CAI_MLP_GELU:
        CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_FC, NULL, opt_out(&g->fc_w), opt_out(&g->fc_b), &w->dfc, x, &p->fc_w, 0));
        break;
    case CAI_MLP_SWIGLU:
        CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_FC, NULL, opt_out(&g->fc_w), NULL, &w->dfc, x, &p->fc_w, 0));
        CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_UP, NULL, opt_out(&g->up_w), NULL, &w->dup, x, &p->up_w, 0));
        break;
    default: return unknown_mlp(d);
    }
    CAI_CALL(lin_bwd(dev, p, CAI_FP8_SITE_ATTN_PROJ, NULL, opt_out(&g->proj_w), opt_out(&g->proj_b), &w->d_proj,
                     &a->att, &p->proj_w, 0));
    CAI_CALL(column_input(cx, s, &a->ln1, &x));
    return lin_bwd(dev, p, CAI_FP8_SITE_QKV, NULL, opt_out(&g->qkv_w), opt_out(&g->qkv_b), &w->dqkv, x, &p->qkv_w, 0);
}

/* ------------------------------------------------------------ embedding */

cai_status cai_embed_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_tensor *wte, const cai_tensor *wpe,
                         cai_block_scratch *s, const cai_tensor *tokens, cai_tensor *out) {
    cai_device_t *dev = cx->dev;
    /* Rows outside this rank's vocabulary shard come out zero; the
     * replicated positions are added by one rank so the sum has them once. */
    const cai_tensor *pos = cx->tp_rank == 0 ? opt_in(wpe) : NULL;
    if (sp_on(cx)) {
        CAI_CALL(dev->ops->embedding_fwd(dev, &s->seq_full, tokens, wte, pos, d->vocab_offset, d->vocab_valid,
                                         d->pos_offset));
        return seq_scatter(cx, &s->seq_full, out);
    }
    if (pos && cx->positions) {
        /* Per-token positions: the position rows are gathered like tokens
         * from wpe, through dln (free until the first block's backward). */
        cai_tensor *prow = &s->dln;
        CAI_CALL(dev->ops->embedding_fwd(dev, out, tokens, wte, NULL, d->vocab_offset, d->vocab_valid, 0));
        CAI_CALL(dev->ops->embedding_fwd(dev, prow, cx->positions, pos, NULL, 0, pos->shape[0], 0));
        CAI_CALL(dev->ops->add(dev, out, out, prow));
    } else
        CAI_CALL(dev->ops->embedding_fwd(dev, out, tokens, wte, pos, d->vocab_offset, d->vocab_valid, d->pos_offset));
    return tp_sum(cx, out);
}

cai_status cai_embed_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, cai_tensor *dwte, cai_tensor *dwpe,
                         cai_block_scratch *s, const cai_tensor *tokens, const cai_tensor *dout) {
    /* dout over the whole sequence is the same on every tp rank: each finds
     * the full gradient of the positions and of its own vocabulary rows. */
    cai_device_t *dev = cx->dev;
    const cai_tensor *dfull;
    CAI_CALL(row_output_grad(cx, s, dout, &dfull));
    if (cx->positions && opt_out(dwpe)) {
        CAI_CALL(dev->ops->embedding_bwd(dev, opt_out(dwte), NULL, dfull, tokens, d->vocab_offset, 0));
        return dev->ops->embedding_bwd(dev, dwpe, NULL, dfull, cx->positions, 0, 0);
    }
    return dev->ops->embedding_bwd(dev, opt_out(dwte), opt_out(dwpe), dfull, tokens, d->vocab_offset, d->pos_offset);
}

/* ------------------------------------------------------------ head + loss */

/* The vocabulary-parallel cross-entropy's combine step: every tp rank's
 * per-row (max, sum of exp(logit - max), target logit) gathered on the
 * host, lse = M + log(sum_r s_r exp(m_r - M)) and loss = lse - target logit
 * in double, in rank order (the same numbers on every rank), then lse and
 * the losses back to the device. Three [B*T] rows per rank cross the
 * network, never the logits. */
static cai_status tp_xent_combine(const cai_layer_ctx *cx, const cai_layer_dims *d, cai_head_acts *h,
                                  const cai_tensor *targets) {
    cai_device_t *dev = cx->dev;
    const size_t N = (size_t)(d->B * d->T), tp = (size_t)cx->tp_size;
    const int host = dev->kind == CAI_DEVICE_HOST;
    float *all = h->xs_host, *mine = all + (size_t)cx->tp_rank * 3 * N;
    float *lse = all + tp * 3 * N, *loss = lse + N;
    CAI_CALL(cai_device_copy(dev, mine, h->xs_max.data, N * sizeof(float), host ? CAI_COPY_H2H : CAI_COPY_D2H));
    CAI_CALL(cai_device_copy(dev, mine + N, h->xs_sum.data, N * sizeof(float), host ? CAI_COPY_H2H : CAI_COPY_D2H));
    CAI_CALL(cai_device_copy(dev, mine + 2 * N, h->xs_tgt.data, N * sizeof(float), host ? CAI_COPY_H2H : CAI_COPY_D2H));
    CAI_CALL(
        cai_device_copy(dev, h->xs_targets, targets->data, N * sizeof(int32_t), host ? CAI_COPY_H2H : CAI_COPY_D2H));
    CAI_CALL(cai_all_gather(cx->mesh, CAI_AXIS_TP, mine, all, 3 * N, CAI_DTYPE_F32));
    for (size_t n = 0; n < N; n++) {
        double M = -INFINITY, S = 0, t = 0;
        for (size_t r = 0; r < tp; r++) M = fmax(M, (double)all[r * 3 * N + n]);
        for (size_t r = 0; r < tp; r++) {
            const double m = all[r * 3 * N + n];
            if (m > -INFINITY) S += (double)all[r * 3 * N + N + n] * exp(m - M);
            t += all[r * 3 * N + 2 * N + n];
        }
        lse[n] = (float)(M + log(S));
        loss[n] = h->xs_targets[n] == CAI_IGNORE_INDEX ? 0.0f : (float)(M + log(S) - t);
    }
    CAI_CALL(cai_device_copy(dev, h->lse.data, lse, N * sizeof(float), host ? CAI_COPY_H2H : CAI_COPY_H2D));
    CAI_CALL(cai_device_copy(dev, h->losses.data, loss, N * sizeof(float), host ? CAI_COPY_H2H : CAI_COPY_H2D));
    return CAI_OK;
}

static int logit_scaled(const cai_head_acts *h) { return h->logit_scale > 0.0f && h->logit_scale != 1.0f; }

/* The head's forward; grad_scale non-NULL: the loss gradient too, in the
 * same pass over the logits (in place). */
static cai_status head_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_tensor *lnf_w,
                           const cai_tensor *lnf_b, const cai_tensor *head_w, cai_head_acts *h, const cai_tensor *inp,
                           const cai_tensor *targets, const float *grad_scale) {
    cai_device_t *dev = cx->dev;
    const cai_ops *ops = dev->ops;
    h->logits_hold_grad = 0;
    if (sp_on(cx)) {
        /* The norm writes this rank's block of h->lnf, gathered in place:
         * the LM head and its backward read the whole sequence. */
        cai_tensor own;
        CAI_CALL(token_block(cx, &h->lnf, cx->tp_rank, &own));
        CAI_CALL(norm_fwd(dev, d, &own, &h->lnf_mean, &h->lnf_rstd, inp, lnf_w, lnf_b));
        CAI_CALL(seq_gather(cx, &own, &h->lnf));
    } else {
        CAI_CALL(norm_fwd(dev, d, &h->lnf, &h->lnf_mean, &h->lnf_rstd, inp, lnf_w, lnf_b));
    }
    /* Vocabulary-parallel: each rank makes its own logit columns. */
    CAI_CALL(ops->linear_fwd(dev, &h->logits, &h->lnf, head_w, NULL));
    if (logit_scaled(h)) CAI_CALL(ops->scale(dev, &h->logits, h->logit_scale));
    if (!targets) return CAI_OK;
    if (tp_on(cx)) {
        CAI_CALL(ops->xent_stats(dev, &h->xs_max, &h->xs_sum, &h->xs_tgt, &h->logits, targets, d->vocab_offset,
                                 d->vocab_valid, CAI_IGNORE_INDEX));
        CAI_CALL(tp_xent_combine(cx, d, h, targets));
        if (grad_scale) {
            CAI_CALL(ops->xent_bwd(dev, &h->logits, &h->logits, &h->lse, targets, NULL, *grad_scale, d->vocab_offset,
                                   d->vocab_valid, CAI_IGNORE_INDEX));
            h->logits_hold_grad = 1;
        }
    } else if (grad_scale) {
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

cai_status cai_head_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_tensor *lnf_w,
                        const cai_tensor *lnf_b, const cai_tensor *head_w, cai_head_acts *h, cai_block_scratch *s,
                        const cai_tensor *inp, const cai_tensor *targets) {
    (void)s;
    return head_fwd(cx, d, lnf_w, lnf_b, head_w, h, inp, targets, NULL);
}

cai_status cai_head_fwd_train(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_tensor *lnf_w,
                              const cai_tensor *lnf_b, const cai_tensor *head_w, cai_head_acts *h, cai_block_scratch *s,
                              const cai_tensor *inp, const cai_tensor *targets, float dloss_scale) {
    (void)s;
    CAI_CHECK_ARG(targets, "cai_head_fwd_train: targets are NULL (a training step has them)");
    return head_fwd(cx, d, lnf_w, lnf_b, head_w, h, inp, targets, &dloss_scale);
}

cai_status cai_head_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_tensor *lnf_w,
                        const cai_tensor *head_w, cai_tensor *dlnf_w, cai_tensor *dlnf_b, cai_tensor *dhead_w,
                        cai_head_acts *h, cai_block_scratch *s, const cai_tensor *inp, const cai_tensor *targets,
                        float dloss_scale, const cai_tensor *dlosses, const cai_tensor *dhidden, cai_tensor *d_stream) {
    cai_device_t *dev = cx->dev;
    const cai_ops *ops = dev->ops;
    /* In place: the logits are not needed once their gradient exists
     * (cai_head_fwd_train has made it already). h->lse is the whole
     * vocabulary's under tp. */
    if (!h->logits_hold_grad)
        CAI_CALL(ops->xent_bwd(dev, &h->logits, &h->logits, &h->lse, targets, dlosses, dloss_scale, d->vocab_offset,
                               d->vocab_valid, CAI_IGNORE_INDEX));
    h->logits_hold_grad = 0;
    /* The gradient is of the scaled logits; the product's is scale times it. */
    if (logit_scaled(h)) CAI_CALL(ops->scale(dev, &h->logits, h->logit_scale));
    CAI_CALL(ops->linear_bwd(dev, &s->dln, opt_out(dhead_w), NULL, &h->logits, &h->lnf, head_w, 0));
    /* Each rank's input gradient covers its vocabulary columns only. */
    cai_tensor dln;
    CAI_CALL(column_input_grad(cx, &s->dln, &dln));
    /* After the reduction over tp: every rank holds the whole dhidden. */
    if (dhidden) CAI_CALL(ops->add(dev, &dln, &dln, dhidden));
    CAI_CALL(norm_bwd(cx->dev, d, d_stream, dlnf_w, dlnf_b, &dln, inp, lnf_w, &h->lnf_mean, &h->lnf_rstd, 0));
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
    CAI_CHECK_ARG((d->kinds.norm == CAI_NORM_LAYERNORM || d->kinds.norm == CAI_NORM_RMSNORM) &&
                      (d->kinds.mlp == CAI_MLP_GELU || d->kinds.mlp == CAI_MLP_SWIGLU) &&
                      (d->kinds.pos == CAI_POS_LEARNED || d->kinds.pos == CAI_POS_ROPE),
                  "layer dims: unknown sublayer kinds (norm %d, mlp %d, positions %d)", (int)d->kinds.norm,
                  (int)d->kinds.mlp, (int)d->kinds.pos);
    CAI_CHECK_ARG(d->B >= 1 && d->T >= 1 && d->C >= 1 && d->n_heads >= 1 && d->n_kv_heads >= 1 && d->head_dim >= 1 &&
                      d->ffn >= 1,
                  "layer dims: B=%lld T=%lld C=%lld heads=%lld kv_heads=%lld head_dim=%lld ffn=%lld must all be >= 1",
                  (long long)d->B, (long long)d->T, (long long)d->C, (long long)d->n_heads, (long long)d->n_kv_heads,
                  (long long)d->head_dim, (long long)d->ffn);
    CAI_CHECK_ARG(d->n_heads % d->n_kv_heads == 0, "layer dims: %lld query heads are not a multiple of %lld kv heads",
                  (long long)d->n_heads, (long long)d->n_kv_heads);
    CAI_CHECK_ARG(d->tp >= 0, "layer dims: tp=%d must be >= 1 (0 means 1)", d->tp);
    CAI_CHECK_ARG(!d->sp || (d->tp > 1 && (d->B * d->T) % d->tp == 0),
                  "layer dims: sequence parallelism needs tp > 1 dividing B*T=%lld tokens (tp=%d)",
                  (long long)(d->B * d->T), d->tp);
    return CAI_OK;
}

/* Tokens of the residual stream held here: B*T, or B*T/tp under sequence parallelism. */
static int64_t stream_rows(const cai_layer_dims *d) { return d->sp ? d->B * d->T / d->tp : d->B * d->T; }

static cai_status carve_acts(carver *c, const cai_layer_dims *d, cai_block_acts *a) {
    CAI_CALL(check_dims(d));
    memset(a, 0, sizeof *a);
    const cai_dtype at = d->act_dtype, f32 = CAI_DTYPE_F32;
    const int64_t B = d->B, T = d->T, C = d->C, F = d->ffn;
    /* The residual stream's tensors: [B,T,C], or this rank's [1, B*T/tp, C]. */
    const int64_t sb = d->sp ? 1 : B, st = d->sp ? stream_rows(d) : T, N = stream_rows(d);
    CAI_CALL(carve(c, &a->ln1, at, 3, sb, st, C));
    if (layernorm(d)) CAI_CALL(carve(c, &a->ln1_mean, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &a->ln1_rstd, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &a->qkv, at, 3, B, T, qkv_width(d)));
    CAI_CALL(carve(c, &a->att, at, 3, B, T, d->n_heads * d->head_dim));
    CAI_CALL(carve(c, &a->att_lse, f32, 3, B, d->n_heads, T));
    CAI_CALL(carve(c, &a->res_mid, at, 3, sb, st, C));
    CAI_CALL(carve(c, &a->ln2, at, 3, sb, st, C));
    if (layernorm(d)) CAI_CALL(carve(c, &a->ln2_mean, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &a->ln2_rstd, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &a->fc, at, 3, B, T, F));
    if (d->kinds.mlp == CAI_MLP_SWIGLU) CAI_CALL(carve(c, &a->up, at, 3, B, T, F));
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
    if (d->tp > 1) CAI_CALL(carve(c, &s->tp_out, at, 3, B, T, C));
    if (d->sp) {
        CAI_CALL(carve(c, &s->seq_full, at, 3, B, T, C));
        CAI_CALL(carve(c, &s->seq_grad, at, 3, B, T, C));
    }
    CAI_CALL(carve(c, &s->dact, at, 3, B, T, F));
    if (d->kinds.mlp == CAI_MLP_GELU) {
        if (c->arena) s->dfc = s->dact; /* one [B,T,F] gradient: linear_bwd_dgelu writes dfc directly */
    } else {
        CAI_CALL(carve(c, &s->dfc, at, 3, B, T, F));
        CAI_CALL(carve(c, &s->dup, at, 3, B, T, F));
    }
    if (rope(d)) {
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

static cai_status carve_wgrad(carver *c, const cai_layer_dims *d, cai_block_wgrad *w) {
    CAI_CALL(check_dims(d));
    memset(w, 0, sizeof *w);
    const cai_dtype at = d->act_dtype;
    const int64_t B = d->B, T = d->T, C = d->C, F = d->ffn;
    CAI_CALL(carve(c, &w->d_proj, at, 3, B, T, C));
    CAI_CALL(carve(c, &w->dqkv, at, 3, B, T, qkv_width(d)));
    CAI_CALL(carve(c, &w->d_mlp, at, 3, B, T, C));
    CAI_CALL(carve(c, &w->dfc, at, 3, B, T, F));
    if (d->kinds.mlp == CAI_MLP_SWIGLU) CAI_CALL(carve(c, &w->dup, at, 3, B, T, F));
    return CAI_OK;
}

size_t cai_block_wgrad_bytes(const cai_device_t *dev, const cai_layer_dims *d) {
    carver c = {(cai_device_t *)dev, NULL, 0};
    cai_block_wgrad w;
    if (carve_wgrad(&c, d, &w) != CAI_OK) return 0;
    return c.bytes;
}

cai_status cai_block_wgrad_carve(cai_device_t *dev, cai_arena_t *arena, const cai_layer_dims *d, cai_block_wgrad *w) {
    CAI_CHECK_ARG(dev && arena && w, "cai_block_wgrad_carve: NULL argument");
    carver c = {dev, arena, 0};
    return carve_wgrad(&c, d, w);
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
    if (rope(d)) CAI_CALL(dev->ops->rope_tables(dev, &s->rope_cos, &s->rope_sin, rope_theta));
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
    if (layernorm(d)) CAI_CALL(carve(c, &h->lnf_mean, f32, 1, stream_rows(d), 0, 0));
    CAI_CALL(carve(c, &h->lnf_rstd, f32, 1, stream_rows(d), 0, 0));
    CAI_CALL(carve(c, &h->logits, at, 3, B, T, d->vocab_local));
    CAI_CALL(carve(c, &h->losses, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &h->lse, f32, 1, N, 0, 0));
    CAI_CALL(carve(c, &h->loss_sum, f32, 1, 1, 0, 0));
    if (d->tp > 1) {
        CAI_CALL(carve(c, &h->xs_max, f32, 1, N, 0, 0));
        CAI_CALL(carve(c, &h->xs_sum, f32, 1, N, 0, 0));
        CAI_CALL(carve(c, &h->xs_tgt, f32, 1, N, 0, 0));
        if (c->arena) {
            CAI_CALL(cai_calloc((void **)&h->xs_host, (size_t)N * (3 * (size_t)d->tp + 2), sizeof(float),
                                "cross-entropy statistics over tp"));
            CAI_CALL(cai_calloc((void **)&h->xs_targets, (size_t)N, sizeof(int32_t), "cross-entropy targets"));
        }
    }
    return CAI_OK;
}

void cai_head_acts_release(cai_head_acts *h) {
    if (!h) return;
    cai_free(h->xs_host);
    cai_free(h->xs_targets);
    h->xs_host = NULL;
    h->xs_targets = NULL;
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
    cai_status st = carve_head(&c, d, h);
    if (st != CAI_OK) cai_head_acts_release(h);
    return st;
}
