/* Ring attention (context parallelism) over the sp axis; the scheme is in
 * colossal/seq_parallel.h and docs/sequence-parallel.md.
 *
 * With the zigzag split every step but the first needs only half of the
 * (query, key) pairs, and which half follows from the source rank s of the
 * key/value block at rank r (chunks a = r, b = 2sp-1-r; the source's s and
 * 2sp-1-s):
 *  - s == r: the rank's own tokens, in increasing global order, so the
 *    global causal mask is the local one (causal_offset 0);
 *  - s < r:  chunk s precedes both query chunks and chunk 2sp-1-s follows
 *    both: all queries see the first key chunk, none the second;
 *  - s > r:  both key chunks lie between a and b: the second query chunk
 *    sees all keys, the first none.
 * So each step is one unmasked attention call on 2c x c or c x 2c pairs,
 * which is the balance the split exists for. */
#include "cai_config.h"

#include <inttypes.h>
#include <stdio.h>

#include "seq_parallel_internal.h"

enum { TAG_KV = 0x5241, TAG_DKV = 0x5242 };

typedef struct {
    void *kv[2], *dkv[2]; /* K then V, [B,Tl,Hkv,D] each; dK then dV likewise */
    void *acc, *blk;      /* [B,Tl,Hq,D]: dq accumulator; a block's out (fwd) or dq (bwd) */
    void *dk_blk;         /* [B,Tl,Hkv,D] twice: a block's dk, dv */
    float *lse_blk;       /* [B,Hq,Tl] */
    void *attn_ws;
    size_t attn_ws_bytes;
} ring_ws;

static void ring_carve(sp_carve *c, cai_device_t *dev, const sp_dims *d, void *wp) {
    ring_ws *w = wp;
    const size_t nq = (size_t)(d->B * d->Tl * d->Hq * d->D) * d->es;
    const size_t nk = (size_t)(d->B * d->Tl * d->Hkv * d->D) * d->es;
    const int64_t c2 = d->Tl / 2 > 0 ? d->Tl / 2 : 1;
    size_t a = dev->ops->attention_workspace_bytes(dev, d->B, d->Tl, d->Tl, d->Hq, d->Hkv, d->D);
    size_t b = dev->ops->attention_workspace_bytes(dev, d->B, d->Tl, c2, d->Hq, d->Hkv, d->D);
    size_t e = dev->ops->attention_workspace_bytes(dev, d->B, c2, d->Tl, d->Hq, d->Hkv, d->D);
    w->attn_ws_bytes = a > b ? (a > e ? a : e) : (b > e ? b : e);
    for (int i = 0; i < 2; i++) w->kv[i] = sp_take(c, 2 * nk), w->dkv[i] = sp_take(c, 2 * nk);
    w->acc = sp_take(c, nq);
    w->blk = sp_take(c, nq);
    w->dk_blk = sp_take(c, 2 * nk);
    w->lse_blk = sp_take(c, (size_t)(d->B * d->Hq * d->Tl) * sizeof(float));
    w->attn_ws = sp_take(c, w->attn_ws_bytes);
}

cai_status cai_ring_attn_validate(const cai_sp_attn_shape *s) {
    static const char *mode = "ring attention";
    CAI_CALL(sp_shape_basic(mode, s));
    if (s->seq_len % (2 * s->sp)) {
        char fit[256];
        sp_fitting(fit, sizeof fit, s->seq_len, 2, s->sp);
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "%s: seq_len %" PRId64
                         " is not divisible by 2*sp = %d (the zigzag split gives each rank "
                         "two chunks); %s",
                         mode, s->seq_len, 2 * s->sp, fit);
    }
    return CAI_OK;
}

cai_status cai_ring_attn_workspace_bytes(cai_device_t *dev, const cai_sp_attn_shape *s, size_t *bytes) {
    CAI_CHECK_ARG(dev && bytes, "ring attention: dev and bytes are required");
    CAI_CALL(cai_ring_attn_validate(s));
    sp_dims d = sp_dims_of(s, 4);
    ring_ws w;
    return sp_carve_workspace("ring attention", ring_carve, NULL, dev, &d, &w, bytes);
}

/* Checks shared by fwd and bwd; carves the workspace. */
static cai_status ring_setup(const char *op, const cai_sp_ctx *cx, const cai_tensor *q, const cai_tensor *k,
                             const cai_tensor *v, const cai_tensor *out, const cai_tensor *lse,
                             const cai_attn_params *params, sp_dims *d, ring_ws *w) {
    CAI_CALL(sp_dims_check(op, cx, q, k, v, out, "out", d));
    cai_sp_attn_shape s = sp_shape(d);
    CAI_CALL(cai_ring_attn_validate(&s));
    CAI_CALL(sp_lse_check(op, lse, d->B, d->Hq, d->Tl));
    CAI_CHECK_ARG(params && (params->causal == 0 || params->causal == 1) && params->causal_offset == 0 &&
                      params->window == 0 && !params->doc_ids,
                  "%s: params must be given with causal 0 or 1 and no causal_offset, window or doc_ids (the mask is "
                  "the whole sequence's by global position)",
                  op);
    CAI_CHECK_ARG(cx->dev->ops->attention_merge, "%s: the %s backend has no attention_merge", op,
                  cx->dev->ops->backend);
    return sp_carve_workspace(op, ring_carve, cx, cx->dev, d, w, NULL);
}

/* Sends buf to the next rank and receives the previous rank's into rbuf.
 * Even ranks post the send first and odd ranks the receive, so that a
 * backend that runs point-to-point operations in issue order (NCCL on one
 * stream) still pairs every send with a posted receive around the ring. */
static cai_status ring_exchange(const cai_sp_ctx *cx, const sp_dims *d, const void *sbuf, void *rbuf, size_t count,
                                int tag, cai_request_t *req[2]) {
    const int next = (d->rank + 1) % d->sp, prev = (d->rank + d->sp - 1) % d->sp;
    if (d->rank % 2 == 0) {
        CAI_CALL(cai_isend(cx->mesh, cx->axis, sbuf, count, d->dtype, next, tag, &req[0]));
        CAI_CALL(cai_irecv(cx->mesh, cx->axis, rbuf, count, d->dtype, prev, tag, &req[1]));
    } else {
        CAI_CALL(cai_irecv(cx->mesh, cx->axis, rbuf, count, d->dtype, prev, tag, &req[1]));
        CAI_CALL(cai_isend(cx->mesh, cx->axis, sbuf, count, d->dtype, next, tag, &req[0]));
    }
    return CAI_OK;
}

static cai_status ring_wait(cai_request_t *req[2]) {
    cai_status st = CAI_OK;
    for (int i = 0; i < 2; i++)
        if (req[i]) {
            cai_status s = cai_wait(req[i]);
            req[i] = NULL;
            if (st == CAI_OK) st = s;
        }
    return st;
}

static cai_tensor bthd(const sp_dims *d, void *p, int64_t T, int64_t H) {
    return cai_tensor_4d(NULL, p, d->dtype, d->B, T, H, d->D);
}

static cai_tensor on(cai_tensor t, cai_device_t *dev) {
    t.device = dev;
    return t;
}

/* The pair (K, V) or (dK, dV) in one buffer. */
static void kv_views(cai_device_t *dev, const sp_dims *d, void *buf, cai_tensor *k, cai_tensor *v) {
    const size_t nk = (size_t)(d->B * d->Tl * d->Hkv * d->D) * d->es;
    *k = on(bthd(d, buf, d->Tl, d->Hkv), dev);
    *v = on(bthd(d, (char *)buf + nk, d->Tl, d->Hkv), dev);
}

static cai_tensor narrow_t(const cai_tensor *t, int dim, int64_t start, int64_t len) {
    cai_tensor o;
    cai_tensor_narrow(t, dim, start, len, &o); /* bounds fixed by the caller's shapes */
    return o;
}

/* y += x for [B, n, H, D] views whose batch slices are contiguous (halves
 * of contiguous buffers): axpy takes rows of one stride only. */
static cai_status axpy_batches(cai_device_t *dev, const sp_dims *d, cai_tensor *y, const cai_tensor *x) {
    for (int64_t b = 0; b < d->B; b++) {
        cai_tensor yb = narrow_t(y, 0, b, 1), xb = narrow_t(x, 0, b, 1);
        CAI_CALL(dev->ops->axpy(dev, &yb, 1.0f, &xb));
    }
    return CAI_OK;
}

typedef enum { BLK_OWN, BLK_ALL, BLK_FIRST_KEYS, BLK_LAST_QUERIES } blk_kind;

static blk_kind block_kind(const sp_dims *d, int causal, int src) {
    if (src == d->rank) return BLK_OWN;
    if (!causal) return BLK_ALL;
    return src < d->rank ? BLK_FIRST_KEYS : BLK_LAST_QUERIES;
}

cai_status cai_ring_attn_fwd(const cai_sp_ctx *cx, cai_tensor *out, cai_tensor *lse, const cai_tensor *q,
                             const cai_tensor *k, const cai_tensor *v, const cai_attn_params *params) {
    static const char *op = "ring_attn_fwd";
    sp_dims d;
    ring_ws w;
    CAI_CALL(ring_setup(op, cx, q, k, v, out, lse, params, &d, &w));
    cai_device_t *dev = cx->dev;
    const cai_ops *ops = dev->ops;
    const int64_t Tl = d.Tl, c = Tl / 2;
    const size_t kv_count = (size_t)(2 * d.B * Tl * d.Hkv * d.D);
    cai_tensor kb, vb;
    kv_views(dev, &d, w.kv[0], &kb, &vb);
    CAI_CALL(ops->copy(dev, &kb, k));
    CAI_CALL(ops->copy(dev, &vb, v));
    const cai_attn_params plain = {.scale = params->scale};
    cai_request_t *req[2] = {NULL, NULL};
    cai_status st = CAI_OK;
    for (int i = 0; i < d.sp && st == CAI_OK; i++) {
        const int cur = i & 1, src = (d.rank - i + d.sp) % d.sp;
        if (i + 1 < d.sp)
            CAI_CALL_GOTO(ring_exchange(cx, &d, w.kv[cur], w.kv[cur ^ 1], kv_count, TAG_KV, req), st, out);
        kv_views(dev, &d, w.kv[cur], &kb, &vb);
        blk_kind kind = block_kind(&d, params->causal, src);
        if (kind == BLK_OWN) {
            cai_attn_params p = {.scale = params->scale, .causal = params->causal};
            CAI_CALL_GOTO(ops->attention_fwd(dev, out, lse, q, &kb, &vb, &p, w.attn_ws, w.attn_ws_bytes), st, out);
        } else {
            const int64_t nq = kind == BLK_LAST_QUERIES ? c : Tl, nkey = kind == BLK_FIRST_KEYS ? c : Tl;
            cai_tensor qv = kind == BLK_LAST_QUERIES ? narrow_t(q, 1, c, c) : *q;
            cai_tensor ov = kind == BLK_LAST_QUERIES ? narrow_t(out, 1, c, c) : *out;
            cai_tensor lv = kind == BLK_LAST_QUERIES ? narrow_t(lse, 2, c, c) : *lse;
            cai_tensor kk = narrow_t(&kb, 1, 0, nkey), vv = narrow_t(&vb, 1, 0, nkey);
            cai_tensor bo = on(bthd(&d, w.blk, nq, d.Hq), dev);
            cai_tensor bl = on(cai_tensor_3d(NULL, w.lse_blk, CAI_DTYPE_F32, d.B, d.Hq, nq), dev);
            CAI_CALL_GOTO(ops->attention_fwd(dev, &bo, &bl, &qv, &kk, &vv, &plain, w.attn_ws, w.attn_ws_bytes), st,
                          out);
            CAI_CALL_GOTO(ops->attention_merge(dev, &ov, &lv, &bo, &bl), st, out);
        }
        CAI_CALL_GOTO(ring_wait(req), st, out);
    }
out:
    if (st != CAI_OK) ring_wait(req); /* a posted exchange completes before its buffers are given back */
    return st;
}

cai_status cai_ring_attn_bwd(const cai_sp_ctx *cx, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv,
                             const cai_tensor *dout, const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
                             const cai_tensor *out, const cai_tensor *lse, const cai_attn_params *params) {
    static const char *op = "ring_attn_bwd";
    sp_dims d;
    ring_ws w;
    CAI_CALL(ring_setup(op, cx, q, k, v, out, lse, params, &d, &w));
    sp_dims dd;
    CAI_CALL(sp_dims_check(op, cx, dq, dk, dv, dout, "dout", &dd));
    CAI_CHECK_ARG(cai_tensor_same_shape(dq, q) && cai_tensor_same_shape(dk, k) && dd.dtype == d.dtype,
                  "%s: dq, dk, dv must have the shapes and dtype of q, k, v", op);
    cai_device_t *dev = cx->dev;
    const cai_ops *ops = dev->ops;
    const int64_t Tl = d.Tl, c = Tl / 2;
    const size_t kv_count = (size_t)(2 * d.B * Tl * d.Hkv * d.D);
    cai_tensor kb, vb, acc = on(bthd(&d, w.acc, Tl, d.Hq), dev);
    kv_views(dev, &d, w.kv[0], &kb, &vb);
    CAI_CALL(ops->copy(dev, &kb, k));
    CAI_CALL(ops->copy(dev, &vb, v));
    const cai_attn_params plain = {.scale = params->scale};
    cai_request_t *kreq[2] = {NULL, NULL}, *dreq[2] = {NULL, NULL};
    cai_status st = CAI_OK;
    for (int i = 0; i < d.sp; i++) {
        const int cur = i & 1, src = (d.rank - i + d.sp) % d.sp;
        if (i + 1 < d.sp)
            CAI_CALL_GOTO(ring_exchange(cx, &d, w.kv[cur], w.kv[cur ^ 1], kv_count, TAG_KV, kreq), st, fail);
        kv_views(dev, &d, w.kv[cur], &kb, &vb);
        cai_tensor dkacc, dvacc;
        kv_views(dev, &d, w.dkv[cur], &dkacc, &dvacc);
        blk_kind kind = block_kind(&d, params->causal, src);
        if (kind == BLK_OWN) {
            /* The first step starts the accumulators: dq, and this block's dk/dv. */
            cai_attn_params p = {.scale = params->scale, .causal = params->causal};
            CAI_CALL_GOTO(ops->attention_bwd(dev, &acc, &dkacc, &dvacc, dout, q, &kb, &vb, out, lse, &p, w.attn_ws,
                                             w.attn_ws_bytes),
                          st, fail);
        } else {
            const int last = kind == BLK_LAST_QUERIES;
            const int64_t nq = last ? c : Tl, nkey = kind == BLK_FIRST_KEYS ? c : Tl;
            cai_tensor qv = last ? narrow_t(q, 1, c, c) : *q, ov = last ? narrow_t(out, 1, c, c) : *out;
            cai_tensor dov = last ? narrow_t(dout, 1, c, c) : *dout;
            cai_tensor lv = *lse;
            if (last) {
                /* attention_bwd takes a contiguous lse: the second half's copy. */
                lv = on(cai_tensor_3d(NULL, w.lse_blk, CAI_DTYPE_F32, d.B, d.Hq, c), dev);
                cai_tensor half = narrow_t(lse, 2, c, c);
                CAI_CALL_GOTO(ops->copy(dev, &lv, &half), st, fail);
            }
            cai_tensor kk = narrow_t(&kb, 1, 0, nkey), vv = narrow_t(&vb, 1, 0, nkey);
            cai_tensor bdq = on(bthd(&d, w.blk, nq, d.Hq), dev);
            const size_t nkb = (size_t)(d.B * nkey * d.Hkv * d.D) * d.es;
            cai_tensor bdk = on(bthd(&d, w.dk_blk, nkey, d.Hkv), dev);
            cai_tensor bdv = on(bthd(&d, (char *)w.dk_blk + nkb, nkey, d.Hkv), dev);
            CAI_CALL_GOTO(ops->attention_bwd(dev, &bdq, &bdk, &bdv, &dov, &qv, &kk, &vv, &ov, &lv, &plain, w.attn_ws,
                                             w.attn_ws_bytes),
                          st, fail);
            cai_tensor accv = last ? narrow_t(&acc, 1, c, c) : acc;
            CAI_CALL_GOTO(axpy_batches(dev, &d, &accv, &bdq), st, fail);
            /* This block's dk/dv accumulator arrives from the previous rank
             * while the block's gradients are computed. */
            CAI_CALL_GOTO(ring_wait(dreq), st, fail);
            cai_tensor dka = narrow_t(&dkacc, 1, 0, nkey), dva = narrow_t(&dvacc, 1, 0, nkey);
            CAI_CALL_GOTO(axpy_batches(dev, &d, &dka, &bdk), st, fail);
            CAI_CALL_GOTO(axpy_batches(dev, &d, &dva, &bdv), st, fail);
        }
        CAI_CALL_GOTO(ring_wait(kreq), st, fail);
        /* Pass the accumulator on (after the last step: to the rank it
         * belongs to) and take the next one. */
        if (d.sp > 1)
            CAI_CALL_GOTO(ring_exchange(cx, &d, w.dkv[cur], w.dkv[cur ^ 1], kv_count, TAG_DKV, dreq), st, fail);
    }
    CAI_CALL_GOTO(ring_wait(dreq), st, fail);
    cai_tensor fk, fv;
    kv_views(dev, &d, w.dkv[d.sp > 1 ? d.sp & 1 : 0], &fk, &fv);
    CAI_CALL(ops->copy(dev, dk, &fk));
    CAI_CALL(ops->copy(dev, dv, &fv));
    CAI_CALL(ops->copy(dev, dq, &acc));
    return CAI_OK;
fail:
    ring_wait(kreq);
    ring_wait(dreq);
    return st;
}
