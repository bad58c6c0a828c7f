/* Ulysses (DeepSpeed's all-to-all sequence parallelism) over the sp axis;
 * the scheme is in colossal/seq_parallel.h and docs/sequence-parallel.md.
 *
 * Rank j's head shard: query heads [j*Hq/sp, (j+1)*Hq/sp) and kv heads
 * from floor(j*Hkv/sp), max(1, Hkv/sp) of them. With g = Hq/Hkv query
 * heads per kv head, the query shard's heads all map into that kv range in
 * both GQA cases (sp divides Hkv, or Hkv divides sp), so attention on the
 * shard keeps the group ratio. */
#include "cai_config.h"

#include <inttypes.h>
#include <stdio.h>

#include "seq_parallel_internal.h"

typedef struct {
    void *send, *recv;          /* staging for one all-to-all: B*Tl*Hq*D elements each */
    void *q, *k, *v, *o, *dout; /* head shards over the whole sequence */
    void *dq, *dk, *dv;
    void *attn_ws;
    size_t attn_ws_bytes;
} uly_ws;

static int64_t kv_width(const sp_dims *d) { return d->Hkv >= d->sp ? d->Hkv / d->sp : 1; }
static int64_t kv_start(const sp_dims *d, int j) { return (int64_t)j * d->Hkv / d->sp; }

static void uly_carve(sp_carve *c, cai_device_t *dev, const sp_dims *d, void *wp) {
    uly_ws *w = wp;
    const int64_t T = d->Tl * d->sp, Hs = d->Hq / d->sp, Hk = kv_width(d);
    const size_t nq = (size_t)(d->B * T * Hs * d->D) * d->es, nk = (size_t)(d->B * T * Hk * d->D) * d->es;
    w->attn_ws_bytes = dev->ops->attention_workspace_bytes(dev, d->B, T, T, Hs, Hk, d->D);
    w->send = sp_take(c, nq);
    w->recv = sp_take(c, nq);
    w->q = sp_take(c, nq), w->o = sp_take(c, nq), w->dout = sp_take(c, nq), w->dq = sp_take(c, nq);
    w->k = sp_take(c, nk), w->v = sp_take(c, nk), w->dk = sp_take(c, nk), w->dv = sp_take(c, nk);
    w->attn_ws = sp_take(c, w->attn_ws_bytes);
}

cai_status cai_ulysses_validate(const cai_sp_attn_shape *s) {
    static const char *mode = "Ulysses";
    CAI_CALL(sp_shape_basic(mode, s));
    if (s->seq_len % s->sp) {
        char fit[256];
        sp_fitting(fit, sizeof fit, s->seq_len, 1, s->sp);
        return CAI_ERROR(CAI_ERR_LAYOUT, "%s: seq_len %" PRId64 " is not divisible by sp = %d; %s", mode, s->seq_len,
                         s->sp, fit);
    }
    char fit[256];
    size_t len = 0;
    for (int p = 1; p <= 64 && len < sizeof fit; p++)
        if (s->n_heads % p == 0 && (s->n_kv_heads % p == 0 || p % s->n_kv_heads == 0))
            len += (size_t)snprintf(fit + len, sizeof fit - len, "%s%d", len ? ", " : "", p);
    if (s->n_heads % s->sp)
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "%s: %" PRId64
                         " heads are not divisible by sp = %d (each rank takes whole heads); sp "
                         "that fits: %s",
                         mode, s->n_heads, s->sp, fit);
    if (s->n_kv_heads % s->sp && s->sp % s->n_kv_heads)
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "%s: %" PRId64
                         " kv heads neither split over sp = %d nor replicate evenly onto it (sp must "
                         "divide the kv heads or be a multiple of them); sp that fits: %s",
                         mode, s->n_kv_heads, s->sp, fit);
    return CAI_OK;
}

cai_status cai_ulysses_workspace_bytes(cai_device_t *dev, const cai_sp_attn_shape *s, size_t *bytes) {
    CAI_CHECK_ARG(dev && bytes, "Ulysses: dev and bytes are required");
    CAI_CALL(cai_ulysses_validate(s));
    sp_dims d = sp_dims_of(s, 4);
    uly_ws w;
    return sp_carve_workspace("Ulysses", uly_carve, NULL, dev, &d, &w, bytes);
}

static cai_status uly_setup(const char *op, const cai_sp_ctx *cx, const cai_tensor *q, const cai_tensor *k,
                            const cai_tensor *v, const cai_tensor *out, const cai_tensor *lse,
                            const cai_attn_params *params, sp_dims *d, uly_ws *w) {
    CAI_CALL(sp_dims_check(op, cx, q, k, v, out, "out", d));
    cai_sp_attn_shape s = sp_shape(d);
    CAI_CALL(cai_ulysses_validate(&s));
    CAI_CALL(sp_lse_check(op, lse, d->B, d->Hq / d->sp, s.seq_len));
    CAI_CHECK_ARG(params && !params->doc_ids, "%s: params are required and doc_ids are not supported", op);
    return sp_carve_workspace(op, uly_carve, cx, cx->dev, d, w, NULL);
}

static cai_tensor view4(cai_device_t *dev, const sp_dims *d, void *p, int64_t T, int64_t H) {
    cai_tensor t = cai_tensor_4d(NULL, p, d->dtype, d->B, T, H, d->D);
    t.device = dev;
    return t;
}

static cai_tensor narrow_t(const cai_tensor *t, int dim, int64_t start, int64_t len) {
    cai_tensor o;
    cai_tensor_narrow(t, dim, start, len, &o); /* bounds fixed by the caller's shapes */
    return o;
}

/* Staging block j ([B,Tl,w,D], contiguous) and its part of x: with
 * seq_dim the tokens [j*Tl, (j+1)*Tl) of a head shard, else the heads of
 * rank j (the kv head map when kv) of a sequence shard. Every `step`-th
 * block; to_stage copies x's part into the block, else the reverse. */
static cai_status stage_blocks(cai_device_t *dev, const sp_dims *d, void *stage, const cai_tensor *x, int seq_dim,
                               int kv, int step, int to_stage) {
    const int64_t wd = kv ? kv_width(d) : d->Hq / d->sp, blk = d->B * d->Tl * wd * d->D;
    for (int j = 0; j < d->sp; j += step) {
        cai_tensor part = seq_dim ? narrow_t(x, 1, j * d->Tl, d->Tl) : narrow_t(x, 2, kv ? kv_start(d, j) : j * wd, wd);
        cai_tensor b = view4(dev, d, (char *)stage + (size_t)(j * blk) * d->es, d->Tl, wd);
        CAI_CALL(to_stage ? dev->ops->copy(dev, &b, &part) : dev->ops->copy(dev, &part, &b));
    }
    return CAI_OK;
}

/* Sequence shard x [B,Tl,H,D] -> head shard xs [B,T,w,D]. */
static cai_status seq_to_heads(const cai_sp_ctx *cx, const sp_dims *d, const uly_ws *w, const cai_tensor *x,
                               cai_tensor *xs, int kv) {
    const int64_t blk = d->B * d->Tl * (kv ? kv_width(d) : d->Hq / d->sp) * d->D;
    CAI_CALL(stage_blocks(cx->dev, d, w->send, x, 0, kv, 1, 1));
    CAI_CALL(cai_all_to_all(cx->mesh, cx->axis, w->send, w->recv, (size_t)blk, d->dtype));
    CAI_CALL(stage_blocks(cx->dev, d, w->recv, xs, 1, kv, 1, 0));
    return CAI_OK;
}

/* The reverse: head shard xs [B,T,w,D] -> sequence shard x [B,Tl,H,D].
 * Replicated kv heads (sp > Hkv) come back from sp/Hkv ranks each: their
 * gradients are summed into the first block of each run. */
static cai_status heads_to_seq(const cai_sp_ctx *cx, const sp_dims *d, const uly_ws *w, const cai_tensor *xs,
                               cai_tensor *x, int kv) {
    cai_device_t *dev = cx->dev;
    const int64_t blk = d->B * d->Tl * (kv ? kv_width(d) : d->Hq / d->sp) * d->D;
    CAI_CALL(stage_blocks(dev, d, w->send, xs, 1, kv, 1, 1));
    CAI_CALL(cai_all_to_all(cx->mesh, cx->axis, w->send, w->recv, (size_t)blk, d->dtype));
    const int rep = kv && d->sp > d->Hkv ? d->sp / (int)d->Hkv : 1;
    for (int j = 0; j < d->sp && rep > 1; j += rep) {
        cai_tensor sum = cai_tensor_1d(NULL, (char *)w->recv + (size_t)(j * blk) * d->es, d->dtype, blk);
        sum.device = dev;
        for (int r = 1; r < rep; r++) {
            cai_tensor part = cai_tensor_1d(NULL, (char *)w->recv + (size_t)((j + r) * blk) * d->es, d->dtype, blk);
            part.device = dev;
            CAI_CALL(dev->ops->axpy(dev, &sum, 1.0f, &part));
        }
    }
    CAI_CALL(stage_blocks(dev, d, w->recv, x, 0, kv, rep, 0));
    return CAI_OK;
}

typedef struct {
    cai_tensor q, k, v, o, dout, dq, dk, dv;
} uly_views;

static uly_views views_of(cai_device_t *dev, const sp_dims *d, const uly_ws *w) {
    const int64_t T = d->Tl * d->sp, Hs = d->Hq / d->sp, Hk = kv_width(d);
    return (uly_views){.q = view4(dev, d, w->q, T, Hs),
                       .k = view4(dev, d, w->k, T, Hk),
                       .v = view4(dev, d, w->v, T, Hk),
                       .o = view4(dev, d, w->o, T, Hs),
                       .dout = view4(dev, d, w->dout, T, Hs),
                       .dq = view4(dev, d, w->dq, T, Hs),
                       .dk = view4(dev, d, w->dk, T, Hk),
                       .dv = view4(dev, d, w->dv, T, Hk)};
}

cai_status cai_ulysses_attn_fwd(const cai_sp_ctx *cx, cai_tensor *out, cai_tensor *lse, const cai_tensor *q,
                                const cai_tensor *k, const cai_tensor *v, const cai_attn_params *params) {
    static const char *op = "ulysses_attn_fwd";
    sp_dims d;
    uly_ws w;
    CAI_CALL(uly_setup(op, cx, q, k, v, out, lse, params, &d, &w));
    cai_device_t *dev = cx->dev;
    uly_views s = views_of(dev, &d, &w);
    CAI_CALL(seq_to_heads(cx, &d, &w, q, &s.q, 0));
    CAI_CALL(seq_to_heads(cx, &d, &w, k, &s.k, 1));
    CAI_CALL(seq_to_heads(cx, &d, &w, v, &s.v, 1));
    CAI_CALL(dev->ops->attention_fwd(dev, &s.o, lse, &s.q, &s.k, &s.v, params, w.attn_ws, w.attn_ws_bytes));
    CAI_CALL(heads_to_seq(cx, &d, &w, &s.o, out, 0));
    return CAI_OK;
}

cai_status cai_ulysses_attn_bwd(const cai_sp_ctx *cx, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv,
                                const cai_tensor *dout, const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
                                const cai_tensor *out, const cai_tensor *lse, const cai_attn_params *params) {
    static const char *op = "ulysses_attn_bwd";
    sp_dims d, dd;
    uly_ws w;
    CAI_CALL(uly_setup(op, cx, q, k, v, out, lse, params, &d, &w));
    CAI_CALL(sp_dims_check(op, cx, dq, dk, dv, dout, "dout", &dd));
    CAI_CHECK_ARG(cai_tensor_same_shape(dq, q) && cai_tensor_same_shape(dk, k) && dd.dtype == d.dtype,
                  "%s: dq, dk, dv must have the shapes and dtype of q, k, v", op);
    cai_device_t *dev = cx->dev;
    uly_views s = views_of(dev, &d, &w);
    CAI_CALL(seq_to_heads(cx, &d, &w, q, &s.q, 0));
    CAI_CALL(seq_to_heads(cx, &d, &w, k, &s.k, 1));
    CAI_CALL(seq_to_heads(cx, &d, &w, v, &s.v, 1));
    CAI_CALL(seq_to_heads(cx, &d, &w, out, &s.o, 0));
    CAI_CALL(seq_to_heads(cx, &d, &w, dout, &s.dout, 0));
    CAI_CALL(dev->ops->attention_bwd(dev, &s.dq, &s.dk, &s.dv, &s.dout, &s.q, &s.k, &s.v, &s.o, lse, params, w.attn_ws,
                                     w.attn_ws_bytes));
    CAI_CALL(heads_to_seq(cx, &d, &w, &s.dq, dq, 0));
    CAI_CALL(heads_to_seq(cx, &d, &w, &s.dk, dk, 1));
    CAI_CALL(heads_to_seq(cx, &d, &w, &s.dv, dv, 1));
    return CAI_OK;
}
