/* Attention op: forward (output and log-sum-exp) against a naive
 * double-precision softmax(q k^T) v; backward against central finite
 * differences of that reference (loss = sum(out * W)). Cases cover
 * multi-head on a fused GPT-2 style QKV buffer, grouped-query heads (6 query
 * heads over 2 kv heads) on a fused Llama style buffer, decoding against a
 * longer key sequence (causal offset), a sliding window, non-causal
 * attention and rows that see no key at all.
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
    int fused; /* q, k, v as views into one [B,T,(Hq+2Hkv)*D] buffer (needs Tq == Tk) */
} attn_case;

typedef struct {
    const attn_case *c;
    double *q, *k, *v, *W; /* dense [B,T,H,D] */
    double *out, *lse;
} attn_ref;

static int visible(const attn_case *c, int64_t i, int64_t j) {
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
                    if (!visible(c, i, j)) continue;
                    s[j] = scale * dot_d(qi, r->k + ((b * c->Tk + j) * c->Hkv + h / g) * D, D);
                    m = fmax(m, s[j]);
                }
                for (int64_t j = 0; j < c->Tk; j++) {
                    if (!visible(c, i, j)) continue;
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
    cai_attn_params p = {.scale = 0.0f, .causal = c->causal, .causal_offset = c->offset, .window = c->window};
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

/*                          B  Tq  Tk  Hq Hkv D  causal off win fused */
static const attn_case cases[] = {
    {2, 7, 7, 3, 3, 8, 1, 0, 0, 1},     /* GPT-2: MHA on fused QKV, odd T and heads */
    {1, 13, 13, 6, 2, 4, 1, 0, 0, 1},   /* Llama: GQA 6 query / 2 kv heads, fused */
    {2, 3, 9, 4, 2, 5, 1, 6, 0, 0},     /* decode 3 new tokens against 9 cached keys */
    {1, 9, 9, 2, 1, 6, 1, 0, 3, 0},     /* multi-query with a 3-key sliding window */
    {2, 5, 6, 2, 2, 3, 0, 0, 0, 0},     /* non-causal, Tq != Tk */
    {1, 4, 4, 2, 2, 4, 1, -2, 0, 0},    /* the first two rows see no key at all */
    {1, 70, 70, 2, 1, 4, 1, 0, 0, 1},   /* more query rows than one CPU block (64) */
    {1, 67, 90, 2, 2, 3, 1, 23, 40, 0}, /* several blocks, offset and window together */
};

START_TEST(attention_case) { check_case(&cases[_i]); }
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
    cai_device_free(dev);
}
END_TEST

static Suite *attention_suite(void) {
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, attention_case, 0, (int)(sizeof cases / sizeof *cases));
    tcase_add_test(tc, attention_shape_errors);
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
