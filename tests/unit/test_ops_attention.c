/* Attention op: forward (output and log-sum-exp) against a naive
 * double-precision softmax(q k^T) v; backward against central finite
 * differences of that reference (loss = sum(out * W)). Cases cover
 * multi-head on a fused GPT-2 style QKV buffer, grouped-query heads (6 query
 * heads over 2 kv heads) on a fused Llama style buffer, decoding against a
 * longer key sequence (causal offset), a sliding window, non-causal
 * attention, rows that see no key at all, and document masking of packed
 * rows (also against plain attention run on each document alone).
 *
 * Tolerances (max abs error / max abs reference): forward 2e-6, lse 1e-6,
 * gradients 1e-4. */
#include "cai_config.h"
#include "colossal/ops.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "test_ops_util.h"

typedef struct {
    int64_t B, Tq, Tk, Hq, Hkv, D;
    int causal;
    int64_t offset, window;
    int fused;           /* q, k, v as views into one [B,T,(Hq+2Hkv)*D] buffer (needs Tq == Tk) */
    const int32_t *docs; /* [B,Tq] document ids (packed sequences), or NULL */
} attn_case;

typedef struct {
    const attn_case *c;
    double *q, *k, *v, *W; /* dense [B,T,H,D] */
    double *out, *lse;
} attn_ref;

static int visible(const attn_case *c, int64_t b, int64_t i, int64_t j) {
    if (c->docs && c->docs[b * c->Tq + i] != c->docs[b * c->Tq + j]) return 0;
    if (!c->causal) return 1;
    if (j > i + c->offset) return 0;
    if (c->window > 0 && i + c->offset - j >= c->window) return 0;
    return 1;
}

static void attn_forward(attn_ref *r) {
    const attn_case *c = r->c;
    const int64_t D = c->D, g = c->Hq / c->Hkv;
    double scale = 1.0 / sqrt((double)D), *s = dalloc(c->Tk);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Tq; i++) {
                const double *qi = r->q + ((b * c->Tq + i) * c->Hq + h) * D;
                double *oi = r->out + ((b * c->Tq + i) * c->Hq + h) * D, m = -INFINITY, sum = 0;
                for (int64_t d = 0; d < D; d++) oi[d] = 0;
                for (int64_t j = 0; j < c->Tk; j++) {
                    if (!visible(c, b, i, j)) continue;
                    s[j] = scale * dot_d(qi, r->k + ((b * c->Tk + j) * c->Hkv + h / g) * D, D);
                    m = fmax(m, s[j]);
                }
                for (int64_t j = 0; j < c->Tk; j++) {
                    if (!visible(c, b, i, j)) continue;
                    double p = exp(s[j] - m);
                    sum += p;
                    const double *vj = r->v + ((b * c->Tk + j) * c->Hkv + h / g) * D;
                    for (int64_t d = 0; d < D; d++) oi[d] += p * vj[d];
                }
                for (int64_t d = 0; d < D && sum > 0; d++) oi[d] /= sum;
                r->lse[(b * c->Hq + h) * c->Tq + i] = sum > 0 ? m + log(sum) : -INFINITY;
            }
    free(s);
}

static double attn_loss(void *ctx) {
    attn_ref *r = ctx;
    attn_forward(r);
    return dot_d(r->out, r->W, r->c->B * r->c->Tq * r->c->Hq * r->c->D);
}

/* Tensors for q, k, v (and their gradients) with the case's layout; `buf`
 * receives the storage (fused or three pieces). */
typedef struct {
    float *store;
    cai_tensor q, k, v;
} qkv_set;

static void make_qkv(cai_device_t *dev, const attn_case *c, qkv_set *s) {
    int64_t nq = c->B * c->Tq * c->Hq * c->D, nk = c->B * c->Tk * c->Hkv * c->D;
    s->store = falloc(nq + 2 * nk);
    if (c->fused) {
        int64_t W = (c->Hq + 2 * c->Hkv) * c->D;
        cai_tensor all = cai_tensor_3d(dev, s->store, CAI_DTYPE_F32, c->B, c->Tq, W), t;
        ck_assert_int_eq(cai_tensor_narrow(&all, 2, 0, c->Hq * c->D, &t), CAI_OK);
        ck_assert_int_eq(cai_tensor_unflatten(&t, 2, c->D, &s->q), CAI_OK);
        ck_assert_int_eq(cai_tensor_narrow(&all, 2, c->Hq * c->D, c->Hkv * c->D, &t), CAI_OK);
        ck_assert_int_eq(cai_tensor_unflatten(&t, 2, c->D, &s->k), CAI_OK);
        ck_assert_int_eq(cai_tensor_narrow(&all, 2, (c->Hq + c->Hkv) * c->D, c->Hkv * c->D, &t), CAI_OK);
        ck_assert_int_eq(cai_tensor_unflatten(&t, 2, c->D, &s->v), CAI_OK);
    } else {
        s->q = cai_tensor_4d(dev, s->store, CAI_DTYPE_F32, c->B, c->Tq, c->Hq, c->D);
        s->k = cai_tensor_4d(dev, s->store + nq, CAI_DTYPE_F32, c->B, c->Tk, c->Hkv, c->D);
        s->v = cai_tensor_4d(dev, s->store + nq + nk, CAI_DTYPE_F32, c->B, c->Tk, c->Hkv, c->D);
    }
}

static float *elem(const cai_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
    return (float *)t->data + b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
}

/* dense double [B,T,H,D] <-> strided float tensor */
static void put(const cai_tensor *t, double *x) {
    int64_t i = 0;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t s = 0; s < t->shape[1]; s++)
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t d = 0; d < t->shape[3]; d++, i++) {
                    *elem(t, b, s, h, d) = (float)x[i];
                    x[i] = *elem(t, b, s, h, d);
                }
}

static float *get(const cai_tensor *t) {
    float *f = falloc(cai_tensor_numel(t));
    int64_t i = 0;
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t s = 0; s < t->shape[1]; s++)
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t d = 0; d < t->shape[3]; d++) f[i++] = *elem(t, b, s, h, d);
    return f;
}

typedef struct {
    float *out, *lse, *dq, *dk, *dv;
} attn_result;

/* Run fwd + bwd on `dev`; returns dense copies of everything it produced. */
static attn_result run_attention(cai_device_t *dev, const attn_case *c, attn_ref *r) {
    const cai_ops *ops = dev->ops;
    int64_t nq = c->B * c->Tq * c->Hq * c->D;
    qkv_set in, grad;
    make_qkv(dev, c, &in);
    make_qkv(dev, c, &grad);
    put(&in.q, r->q);
    put(&in.k, r->k);
    put(&in.v, r->v);
    float *fo = falloc(nq), *fl = falloc(c->B * c->Hq * c->Tq), *fW = falloc(nq);
    for (int64_t i = 0; i < nq; i++) fW[i] = (float)r->W[i];
    cai_tensor to = cai_tensor_4d(dev, fo, CAI_DTYPE_F32, c->B, c->Tq, c->Hq, c->D);
    cai_tensor tdo = cai_tensor_4d(dev, fW, CAI_DTYPE_F32, c->B, c->Tq, c->Hq, c->D);
    cai_tensor tl = cai_tensor_3d(dev, fl, CAI_DTYPE_F32, c->B, c->Hq, c->Tq);
    cai_tensor tdocs = cai_tensor_2d(dev, (void *)c->docs, CAI_DTYPE_I32, c->B, c->Tq);
    cai_attn_params p = {.scale = 0.0f,
                         .causal = c->causal,
                         .causal_offset = c->offset,
                         .window = c->window,
                         .doc_ids = c->docs ? &tdocs : NULL};
    size_t wsb = ops->attention_workspace_bytes(dev, c->B, c->Tq, c->Tk, c->Hq, c->Hkv, c->D);
    void *ws = malloc(wsb);
    /* garbage in the gradient buffers: the op overwrites them */
    for (int64_t i = 0; i < nq + 2 * c->B * c->Tk * c->Hkv * c->D; i++) grad.store[i] = NAN;
    ASSERT_OK(ops->attention_fwd(dev, &to, &tl, &in.q, &in.k, &in.v, &p, ws, wsb));
    ASSERT_OK(ops->attention_bwd(dev, &grad.q, &grad.k, &grad.v, &tdo, &in.q, &in.k, &in.v, &to, &tl, &p, ws, wsb));
    ck_assert_int_eq(ops->attention_fwd(dev, &to, &tl, &in.q, &in.k, &in.v, &p, ws, wsb / 2), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "workspace of"));
    cai_error_clear();
    attn_result res = {.out = fo, .lse = fl, .dq = get(&grad.q), .dk = get(&grad.k), .dv = get(&grad.v)};
    free(fW);
    free(ws);
    free(in.store);
    free(grad.store);
    return res;
}

static void free_result(attn_result *r) {
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
}

static void check_case(const attn_case *c) {
    cai_device_t *dev = test_device(2), *dev1 = test_device(1), *dev3 = test_device(3);
    ck_assert(dev && dev1 && dev3);
    int64_t nq = c->B * c->Tq * c->Hq * c->D, nk = c->B * c->Tk * c->Hkv * c->D, nl = c->B * c->Hq * c->Tq;
    attn_ref r = {.c = c,
                  .q = drandn(nq, 100, 1.0),
                  .k = drandn(nk, 101, 1.0),
                  .v = drandn(nk, 102, 1.0),
                  .W = drandn(nq, 103, 1.0),
                  .out = dalloc(nq),
                  .lse = dalloc(nl)};
    attn_result got = run_attention(dev, c, &r);
    attn_forward(&r);
    ASSERT_REL(got.out, r.out, nq, 2e-6);
    for (int64_t i = 0; i < nl; i++) {
        if (isinf(r.lse[i])) ck_assert(isinf(got.lse[i]) && got.lse[i] < 0);
        else
            ck_assert_msg(fabs(got.lse[i] - r.lse[i]) <= 1e-6 * fmax(1.0, fabs(r.lse[i])), "lse[%ld] %g vs %g", (long)i,
                          (double)got.lse[i], r.lse[i]);
    }
    double *gq = dalloc(nq), *gk = dalloc(nk), *gv = dalloc(nk);
    fd_grad(attn_loss, &r, r.q, nq, 1e-5, gq);
    fd_grad(attn_loss, &r, r.k, nk, 1e-5, gk);
    fd_grad(attn_loss, &r, r.v, nk, 1e-5, gv);
    ASSERT_REL(got.dq, gq, nq, 1e-4);
    ASSERT_REL(got.dk, gk, nk, 1e-4);
    ASSERT_REL(got.dv, gv, nk, 1e-4);
    /* bitwise the same on 1 and 3 threads */
    attn_result g1 = run_attention(dev1, c, &r), g3 = run_attention(dev3, c, &r);
    ck_assert_mem_eq(g1.out, g3.out, (size_t)nq * 4);
    ck_assert_mem_eq(g1.dq, g3.dq, (size_t)nq * 4);
    ck_assert_mem_eq(g1.dk, g3.dk, (size_t)nk * 4);
    ck_assert_mem_eq(g1.dv, g3.dv, (size_t)nk * 4);
    free_result(&got);
    free_result(&g1);
    free_result(&g3);
    free(r.q);
    free(r.k);
    free(r.v);
    free(r.W);
    free(r.out);
    free(r.lse);
    free(gq);
    free(gk);
    free(gv);
    cai_device_free(dev);
    cai_device_free(dev1);
    cai_device_free(dev3);
}

/* Packed rows: documents of 1 to 40 tokens, the last one padding. */
static const int32_t docs_2x9[] = {0, 0, 0, 1, 1, 2, 2, 2, 2, /**/ 5, 6, 6, 6, 6, 6, 6, 7, 7};
static const int32_t docs_1x13[] = {3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 9, 9};
static int32_t docs_1x70[70], docs_1x67[67];

/*                          B  Tq  Tk  Hq Hkv D  causal off win fused */
static const attn_case cases[] = {
    {2, 7, 7, 3, 3, 8, 1, 0, 0, 1, NULL},        /* GPT-2: MHA on fused QKV, odd T and heads */
    {1, 13, 13, 6, 2, 4, 1, 0, 0, 1, NULL},      /* Llama: GQA 6 query / 2 kv heads, fused */
    {2, 3, 9, 4, 2, 5, 1, 6, 0, 0, NULL},        /* decode 3 new tokens against 9 cached keys */
    {1, 9, 9, 2, 1, 6, 1, 0, 3, 0, NULL},        /* multi-query with a 3-key sliding window */
    {2, 5, 6, 2, 2, 3, 0, 0, 0, 0, NULL},        /* non-causal, Tq != Tk */
    {1, 4, 4, 2, 2, 4, 1, -2, 0, 0, NULL},       /* the first two rows see no key at all */
    {1, 70, 70, 2, 1, 4, 1, 0, 0, 1, NULL},      /* more query rows than one CPU block (64) */
    {1, 67, 90, 2, 2, 3, 1, 23, 40, 0, NULL},    /* several blocks, offset and window together */
    {2, 9, 9, 3, 3, 4, 1, 0, 0, 1, docs_2x9},    /* packed GPT-2: documents end mid-row */
    {1, 13, 13, 6, 2, 4, 1, 0, 0, 1, docs_1x13}, /* packed Llama GQA */
    {1, 70, 70, 2, 1, 4, 1, 0, 0, 0, docs_1x70}, /* documents across the 64-row block edge */
    {1, 67, 67, 2, 2, 3, 1, 0, 5, 0, docs_1x67}, /* documents and a sliding window */
};

static void fill_docs(void) {
    /* 1x70: documents of 30, 40 tokens (the second crosses row 64); 1x67:
     * runs of 1, 2, ..., 11 tokens, so the window and the document start
     * alternate in bounding a row's keys */
    for (int i = 0; i < 70; i++) docs_1x70[i] = i < 30 ? 0 : 1;
    for (int i = 0, d = 0, left = 1, len = 1; i < 67; i++) {
        docs_1x67[i] = d;
        if (--left == 0) left = ++len, d++;
    }
}

START_TEST(attention_case) {
    fill_docs();
    check_case(&cases[_i]);
}
END_TEST

START_TEST(attention_shape_errors) {
    cai_device_t *dev = test_device(1);
    float buf[256] = {0};
    char ws[1024];
    cai_tensor q = cai_tensor_4d(dev, buf, CAI_DTYPE_F32, 1, 2, 3, 4),
               k = cai_tensor_4d(dev, buf, CAI_DTYPE_F32, 1, 2, 2, 4);
    cai_tensor o = cai_tensor_4d(dev, buf + 64, CAI_DTYPE_F32, 1, 2, 3, 4);
    cai_attn_params p = {.causal = 1};
    ck_assert_int_eq(dev->ops->attention_fwd(dev, &o, NULL, &q, &k, &k, &p, ws, sizeof ws), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "attention_fwd: 3 query heads do not divide into groups over 2 kv heads");
    cai_error_clear();
    /* document ids that decrease, of the wrong shape or with a mask they do not fit */
    cai_tensor q2 = cai_tensor_4d(dev, buf, CAI_DTYPE_F32, 1, 4, 2, 4),
               o2 = cai_tensor_4d(dev, buf + 64, CAI_DTYPE_F32, 1, 4, 2, 4);
    int32_t bad[4] = {0, 1, 1, 0}, good[4] = {0, 0, 1, 1};
    cai_tensor tbad = cai_tensor_2d(dev, bad, CAI_DTYPE_I32, 1, 4),
               tgood = cai_tensor_2d(dev, good, CAI_DTYPE_I32, 1, 4),
               tshape = cai_tensor_2d(dev, good, CAI_DTYPE_I32, 2, 2),
               tf32 = cai_tensor_2d(dev, buf, CAI_DTYPE_F32, 1, 4);
    p = (cai_attn_params){.causal = 1, .doc_ids = &tbad};
    ck_assert_int_eq(dev->ops->attention_fwd(dev, &o2, NULL, &q2, &q2, &q2, &p, ws, sizeof ws), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(),
                     "attention_fwd: doc_ids[0,3] = 0 after 1: ids must not decrease along a row "
                     "(each document one contiguous run)");
    cai_error_clear();
    p.doc_ids = &tshape;
    ck_assert_int_eq(dev->ops->attention_fwd(dev, &o2, NULL, &q2, &q2, &q2, &p, ws, sizeof ws), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "but must be [1,4] (B, T of q)"));
    cai_error_clear();
    p.doc_ids = &tf32;
    ck_assert_int_eq(dev->ops->attention_fwd(dev, &o2, NULL, &q2, &q2, &q2, &p, ws, sizeof ws), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "doc_ids"));
    cai_error_clear();
    p = (cai_attn_params){.causal = 0, .doc_ids = &tgood};
    ck_assert_int_eq(dev->ops->attention_fwd(dev, &o2, NULL, &q2, &q2, &q2, &p, ws, sizeof ws), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "doc_ids need causal self-attention"));
    cai_error_clear();
    p = (cai_attn_params){.causal = 1, .causal_offset = 2, .doc_ids = &tgood};
    ck_assert_int_eq(dev->ops->attention_fwd(dev, &o2, NULL, &q2, &q2, &q2, &p, ws, sizeof ws), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "causal_offset 2"));
    cai_error_clear();
    cai_device_free(dev);
}
END_TEST

/* One segment [t0, t0+n) of batch row b of a dense [B,T,H,D] float tensor. */
static cai_tensor segment(const cai_tensor *t, int64_t b, int64_t t0, int64_t n) {
    cai_tensor rb, seg;
    ck_assert_int_eq(cai_tensor_narrow(t, 0, b, 1, &rb), CAI_OK);
    ck_assert_int_eq(cai_tensor_narrow(&rb, 1, t0, n, &seg), CAI_OK);
    return seg;
}

/* The packed op equals plain causal attention run on every document alone:
 * outputs, lse and all three gradients. */
START_TEST(attention_docs_per_document) {
    cai_device_t *dev = test_device(2);
    const cai_ops *ops = dev->ops;
    enum { B = 2, T = 9, Hq = 4, Hkv = 2, D = 4 };
    const int64_t nq = B * T * Hq * D, nk = B * T * Hkv * D;
    float *q = falloc(nq), *k = falloc(nk), *v = falloc(nk), *dout = falloc(nq);
    double *r = drandn(nq + 2 * nk + nq, 7, 1.0);
    for (int64_t i = 0; i < nq; i++) q[i] = (float)r[i], dout[i] = (float)r[nq + 2 * nk + i];
    for (int64_t i = 0; i < nk; i++) k[i] = (float)r[nq + i], v[i] = (float)r[nq + nk + i];
    float *o[2], *lse[2], *dq[2], *dk[2], *dv[2];
    for (int w = 0; w < 2; w++) {
        o[w] = falloc(nq), dq[w] = falloc(nq), dk[w] = falloc(nk), dv[w] = falloc(nk);
        lse[w] = falloc(B * Hq * T);
    }
    cai_tensor tq = cai_tensor_4d(dev, q, CAI_DTYPE_F32, B, T, Hq, D),
               tk = cai_tensor_4d(dev, k, CAI_DTYPE_F32, B, T, Hkv, D),
               tv = cai_tensor_4d(dev, v, CAI_DTYPE_F32, B, T, Hkv, D),
               tdo = cai_tensor_4d(dev, dout, CAI_DTYPE_F32, B, T, Hq, D);
    cai_tensor to = cai_tensor_4d(dev, o[0], CAI_DTYPE_F32, B, T, Hq, D),
               tl = cai_tensor_3d(dev, lse[0], CAI_DTYPE_F32, B, Hq, T);
    cai_tensor tdq = cai_tensor_4d(dev, dq[0], CAI_DTYPE_F32, B, T, Hq, D),
               tdk = cai_tensor_4d(dev, dk[0], CAI_DTYPE_F32, B, T, Hkv, D),
               tdv = cai_tensor_4d(dev, dv[0], CAI_DTYPE_F32, B, T, Hkv, D);
    cai_tensor tdocs = cai_tensor_2d(dev, (void *)docs_2x9, CAI_DTYPE_I32, B, T);
    cai_attn_params packed = {.causal = 1, .doc_ids = &tdocs}, plain = {.causal = 1};
    size_t wsb = ops->attention_workspace_bytes(dev, B, T, T, Hq, Hkv, D);
    void *ws = malloc(wsb);
    ASSERT_OK(ops->attention_fwd(dev, &to, &tl, &tq, &tk, &tv, &packed, ws, wsb));
    ASSERT_OK(ops->attention_bwd(dev, &tdq, &tdk, &tdv, &tdo, &tq, &tk, &tv, &to, &tl, &packed, ws, wsb));
    cai_tensor ao = cai_tensor_4d(dev, o[1], CAI_DTYPE_F32, B, T, Hq, D),
               adq = cai_tensor_4d(dev, dq[1], CAI_DTYPE_F32, B, T, Hq, D),
               adk = cai_tensor_4d(dev, dk[1], CAI_DTYPE_F32, B, T, Hkv, D),
               adv = cai_tensor_4d(dev, dv[1], CAI_DTYPE_F32, B, T, Hkv, D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t0 = 0, n; t0 < T; t0 += n) {
            for (n = 1; t0 + n < T && docs_2x9[b * T + t0 + n] == docs_2x9[b * T + t0]; n++) {
            }
            cai_tensor sq = segment(&tq, b, t0, n), sk = segment(&tk, b, t0, n), sv = segment(&tv, b, t0, n),
                       sdo = segment(&tdo, b, t0, n), so = segment(&ao, b, t0, n), sdq = segment(&adq, b, t0, n),
                       sdk = segment(&adk, b, t0, n), sdv = segment(&adv, b, t0, n);
            float sl[Hq * T];
            cai_tensor tsl = cai_tensor_3d(dev, sl, CAI_DTYPE_F32, 1, Hq, n);
            ASSERT_OK(ops->attention_fwd(dev, &so, &tsl, &sq, &sk, &sv, &plain, ws, wsb));
            ASSERT_OK(ops->attention_bwd(dev, &sdq, &sdk, &sdv, &sdo, &sq, &sk, &sv, &so, &tsl, &plain, ws, wsb));
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t i = 0; i < n; i++) lse[1][(b * Hq + h) * T + t0 + i] = sl[h * n + i];
        }
    float *got[5] = {o[0], lse[0], dq[0], dk[0], dv[0]}, *want[5] = {o[1], lse[1], dq[1], dk[1], dv[1]};
    int64_t len[5] = {nq, B * Hq * T, nq, nk, nk};
    for (int w = 0; w < 5; w++)
        for (int64_t i = 0; i < len[w]; i++)
            ck_assert_msg(fabsf(got[w][i] - want[w][i]) <= 1e-6f * fmaxf(1.0f, fabsf(want[w][i])), "%d[%ld]: %g vs %g",
                          w, (long)i, (double)got[w][i], (double)want[w][i]);
    for (int w = 0; w < 2; w++) free(o[w]), free(lse[w]), free(dq[w]), free(dk[w]), free(dv[w]);
    free(q), free(k), free(v), free(dout), free(r), free(ws);
    cai_device_free(dev);
}
END_TEST

/* attention_merge: attention over the keys in two blocks, merged by the
 * blocks' log-sum-exp in either order, equals attention over all keys
 * (output and lse). The causal offset -1 leaves row 0 seeing no key at all
 * (output 0, lse -inf after the merge too), rows 1-4 only the first block
 * (the second block's lse is -inf: the merge keeps them, or takes them when
 * merged second); out and lse are narrowed views of wider buffers. */
START_TEST(attention_merge_blocks) {
    cai_device_t *dev = test_device(2);
    const cai_ops *ops = dev->ops;
    enum { B = 2, Tq = 8, Tk = 9, A = 4, Hq = 4, Hkv = 2, D = 8, W = Tq + 3 };
    const int64_t nq = B * Tq * Hq * D, nk = B * Tk * Hkv * D;
    double *r = drandn(nq + 2 * nk, 11, 1.0);
    float *q = to_f(r, nq), *k = to_f(r + nq, nk), *v = to_f(r + nq + nk, nk);
    cai_tensor tq = cai_tensor_4d(dev, q, CAI_DTYPE_F32, B, Tq, Hq, D),
               tk = cai_tensor_4d(dev, k, CAI_DTYPE_F32, B, Tk, Hkv, D),
               tv = cai_tensor_4d(dev, v, CAI_DTYPE_F32, B, Tk, Hkv, D);
    size_t wsb = ops->attention_workspace_bytes(dev, B, Tq, Tk, Hq, Hkv, D);
    void *ws = malloc(wsb);
    float *o_all = falloc(nq), *l_all = falloc(B * Hq * Tq);
    cai_tensor to_all = cai_tensor_4d(dev, o_all, CAI_DTYPE_F32, B, Tq, Hq, D),
               tl_all = cai_tensor_3d(dev, l_all, CAI_DTYPE_F32, B, Hq, Tq);
    ASSERT_OK(ops->attention_fwd(dev, &to_all, &tl_all, &tq, &tk, &tv,
                                 &(cai_attn_params){.causal = 1, .causal_offset = -1}, ws, wsb));
    ck_assert(isinf(l_all[0]) && l_all[0] < 0);
    for (int order = 0; order < 2; order++) {
        /* out [B,W,Hq,D] and lse [B,Hq,W]: the results live in rows [2, 2+Tq). */
        float *ow = falloc(B * W * Hq * D), *lw = falloc(B * Hq * W), *ob = falloc(nq), *lb = falloc(B * Hq * Tq);
        cai_tensor tow = cai_tensor_4d(dev, ow, CAI_DTYPE_F32, B, W, Hq, D),
                   tlw = cai_tensor_3d(dev, lw, CAI_DTYPE_F32, B, Hq, W), to, tl;
        ASSERT_OK(cai_tensor_narrow(&tow, 1, 2, Tq, &to));
        ASSERT_OK(cai_tensor_narrow(&tlw, 2, 2, Tq, &tl));
        cai_tensor tob = cai_tensor_4d(dev, ob, CAI_DTYPE_F32, B, Tq, Hq, D),
                   tlb = cai_tensor_3d(dev, lb, CAI_DTYPE_F32, B, Hq, Tq);
        for (int blk = 0; blk < 2; blk++) {
            int first = order == 0 ? blk : 1 - blk; /* which key block this pass sees */
            int64_t k0 = first == 0 ? 0 : A, nkb = first == 0 ? A : Tk - A;
            cai_tensor kb, vb;
            ASSERT_OK(cai_tensor_narrow(&tk, 1, k0, nkb, &kb));
            ASSERT_OK(cai_tensor_narrow(&tv, 1, k0, nkb, &vb));
            cai_attn_params p = {.causal = 1, .causal_offset = -1 - k0};
            if (blk == 0) {
                ASSERT_OK(ops->attention_fwd(dev, &to, NULL, &tq, &kb, &vb, &p, ws, wsb));
                ASSERT_OK(ops->attention_fwd(dev, &tob, &tlb, &tq, &kb, &vb, &p, ws, wsb));
                ASSERT_OK(ops->copy(dev, &tl, &tlb));
            } else {
                ASSERT_OK(ops->attention_fwd(dev, &tob, &tlb, &tq, &kb, &vb, &p, ws, wsb));
                ASSERT_OK(ops->attention_merge(dev, &to, &tl, &tob, &tlb));
            }
        }
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < Tq; t++)
                for (int64_t h = 0; h < Hq; h++) {
                    float lg = lw[(b * Hq + h) * W + 2 + t], le = l_all[(b * Hq + h) * Tq + t];
                    if (isinf(le))
                        ck_assert_msg(isinf(lg) && lg < 0, "order %d lse[%ld,%ld,%ld] %g", order, (long)b, (long)h,
                                      (long)t, (double)lg);
                    else
                        ck_assert_msg(fabsf(lg - le) <= 1e-6f * fmaxf(1.0f, fabsf(le)), "order %d lse %g vs %g", order,
                                      (double)lg, (double)le);
                    for (int64_t d = 0; d < D; d++) {
                        float g = ow[((b * W + 2 + t) * Hq + h) * D + d], e = o_all[((b * Tq + t) * Hq + h) * D + d];
                        ck_assert_msg(fabsf(g - e) <= 1e-6f * fmaxf(1.0f, fabsf(e)), "order %d out %g vs %g", order,
                                      (double)g, (double)e);
                    }
                }
        free(ow), free(lw), free(ob), free(lb);
    }
    /* Shapes that disagree are refused, naming the argument. */
    float small[4];
    cai_tensor bad = cai_tensor_3d(dev, small, CAI_DTYPE_F32, 1, 1, 4), to2 = to_all;
    ck_assert_int_eq(ops->attention_merge(dev, &to2, &bad, &to_all, &tl_all), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "lse"));
    cai_error_clear();
    free(o_all), free(l_all), free(ws), free(q), free(k), free(v), free(r);
    cai_device_free(dev);
}
END_TEST

static Suite *attention_suite(void) {
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, attention_case, 0, (int)(sizeof cases / sizeof *cases));
    tcase_add_test(tc, attention_shape_errors);
    tcase_add_test(tc, attention_docs_per_document);
    tcase_add_test(tc, attention_merge_blocks);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    SRunner *sr = srunner_create(attention_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
