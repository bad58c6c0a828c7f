/* Layers: every sublayer's backward (attention, MLP, block, embedding,
 * head + cross-entropy) against central finite differences of its own
 * forward, for GPT-2 and Llama (GQA, RoPE with a position offset), on tiny
 * odd shapes. The objective sum(out * R) is accumulated in double from the
 * f32 outputs so the difference quotient is limited by f32 rounding of the
 * outputs only. */
#include "cai_config.h"
#include "colossal/model.h"
#include "colossal/ops.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cai_device_t *dev;

/* The layers run on one device here (tp = 1). */
static const cai_layer_ctx *lctx(void) {
    static cai_layer_ctx c;
    c = cai_layer_ctx_local(dev);
    return &c;
}

static void fill_normal(cai_tensor *t, uint64_t stream, float mean, float std) {
    float *p = t->data;
    for (int64_t i = 0; i < cai_tensor_numel(t); i++) p[i] = mean + std * cai_rng_normal(99, stream, (uint64_t)i);
}

static cai_tensor make(cai_arena_t *a, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    cai_tensor t;
    int64_t shape[3] = {d0, d1, d2};
    cai_status st = cai_tensor_arena(&t, a, dev, CAI_DTYPE_F32, ndim, shape);
    ck_assert_msg(st == CAI_OK, "%s", cai_error_message());
    memset(t.data, 0, cai_tensor_nbytes(&t));
    return t;
}

/* Everything one layer test needs: dims, weights and grads, acts, scratch,
 * input, output and the random cotangent R. */
typedef struct {
    cai_arena_t arena;
    cai_layer_dims d;
    cai_block_params w, g;
    cai_block_acts acts;
    cai_block_scratch s;
    cai_tensor inp, out, r, dstream;
} fixture;

#define N_FIELDS 14
static cai_tensor *field(cai_block_params *p, int i) {
    cai_tensor *f[N_FIELDS] = {&p->ln1_w, &p->ln1_b, &p->qkv_w, &p->qkv_b, &p->proj_w,     &p->proj_b,     &p->ln2_w,
                               &p->ln2_b, &p->fc_w,  &p->fc_b,  &p->up_w,  &p->mlp_proj_w, &p->mlp_proj_b, NULL};
    return f[i];
}
static const char *field_name[N_FIELDS] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w",     "proj_b",     "ln2_w",
                                           "ln2_b", "fc_w",  "fc_b",  "up_w",  "mlp_proj_w", "mlp_proj_b", NULL};

static cai_layer_dims dims_for(cai_model_family f, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t F) {
    cai_layer_dims d;
    memset(&d, 0, sizeof d);
    d.kinds = cai_model_family_kinds(f);
    d.B = B;
    d.T = T;
    d.C = H * D;
    d.n_heads = H;
    d.n_kv_heads = Hkv;
    d.head_dim = D;
    d.ffn = F;
    d.norm_eps = 1e-5f;
    d.act_dtype = CAI_DTYPE_F32;
    d.pos_offset = f == CAI_MODEL_LLAMA ? 3 : 0;
    return d;
}

static void fixture_init(fixture *fx, const cai_layer_dims *d) {
    memset(fx, 0, sizeof *fx);
    fx->d = *d;
    size_t bytes = cai_block_acts_bytes(dev, d) + cai_block_scratch_bytes(dev, d, 32) + (1u << 20);
    ck_assert_int_eq(cai_device_arena_init(dev, &fx->arena, bytes, "layer test"), CAI_OK);
    ck_assert_int_eq(cai_block_acts_carve(dev, &fx->arena, d, &fx->acts), CAI_OK);
    ck_assert_int_eq(cai_block_scratch_carve(dev, &fx->arena, d, 32, 10000.0, &fx->s), CAI_OK);
    int gpt2 = d->kinds.norm == CAI_NORM_LAYERNORM;
    int64_t C = d->C, W = (d->n_heads + 2 * d->n_kv_heads) * d->head_dim, A = d->n_heads * d->head_dim, F = d->ffn;
    int64_t rows[N_FIELDS] = {C, C, W, W, C, C, C, C, F, F, F, C, C, 0};
    int64_t cols[N_FIELDS] = {0, 0, C, 0, A, 0, 0, 0, C, 0, C, F, 0, 0};
    int present[N_FIELDS] = {1, gpt2, 1, gpt2, 1, gpt2, 1, gpt2, 1, gpt2, !gpt2, 1, gpt2, 0};
    for (int i = 0; field(&fx->w, i); i++) {
        if (!present[i]) continue;
        int nd = cols[i] ? 2 : 1;
        *field(&fx->w, i) = make(&fx->arena, nd, rows[i], cols[i], 0);
        *field(&fx->g, i) = make(&fx->arena, nd, rows[i], cols[i], 0);
        int is_norm_w = i == 0 || i == 6;
        /* Weights large enough that attention is not uniform and norms see real scales. */
        fill_normal(field(&fx->w, i), 100 + (uint64_t)i, is_norm_w ? 1.0f : 0.0f, is_norm_w ? 0.2f : 0.3f);
    }
    fx->inp = make(&fx->arena, 3, d->B, d->T, C);
    fx->out = make(&fx->arena, 3, d->B, d->T, C);
    fx->r = make(&fx->arena, 3, d->B, d->T, C);
    fx->dstream = make(&fx->arena, 3, d->B, d->T, C);
    fill_normal(&fx->inp, 1, 0.0f, 1.0f);
    fill_normal(&fx->r, 2, 0.0f, 1.0f);
}

static void fixture_free(fixture *fx) { cai_device_arena_free(dev, &fx->arena); }

typedef enum { SUB_ATTN, SUB_MLP, SUB_BLOCK } sublayer;

static void run_fwd(fixture *fx, sublayer which) {
    cai_status st;
    if (which == SUB_ATTN) st = cai_attn_fwd(lctx(), &fx->d, &fx->w, &fx->acts, &fx->s, &fx->inp, &fx->out);
    else if (which == SUB_MLP) st = cai_mlp_fwd(lctx(), &fx->d, &fx->w, &fx->acts, &fx->s, &fx->inp, &fx->out);
    else st = cai_block_fwd(lctx(), &fx->d, &fx->w, &fx->acts, &fx->s, &fx->inp, &fx->out);
    ck_assert_msg(st == CAI_OK, "fwd: %s", cai_error_message());
}

static double dot(const cai_tensor *a, const cai_tensor *b) {
    const float *x = a->data, *y = b->data;
    double s = 0;
    for (int64_t i = 0; i < cai_tensor_numel(a); i++) s += (double)x[i] * (double)y[i];
    return s;
}

static double objective(fixture *fx, sublayer which) {
    run_fwd(fx, which);
    return dot(&fx->out, &fx->r);
}

/* Central difference of `obj` in element i of `x` against analytic[i]. */
typedef double (*obj_fn)(void *ctx);

static void check_fd(const char *what, float *x, const float *analytic, int64_t n, obj_fn obj, void *ctx, float eps,
                     double atol, double rtol, int max_samples) {
    int64_t step = n <= max_samples ? 1 : n / max_samples;
    for (int64_t i = (n > max_samples) ? (step / 2) : 0; i < n; i += step) {
        float save = x[i];
        x[i] = save + eps;
        double lp = obj(ctx);
        x[i] = save - eps;
        double lm = obj(ctx);
        x[i] = save;
        double fd = (lp - lm) / (2.0 * (double)eps);
        double err = fabs(fd - (double)analytic[i]);
        double tol = atol + rtol * fabs(fd);
        ck_assert_msg(err <= tol, "%s[%lld]: analytic %.7g vs finite difference %.7g (err %.3g > tol %.3g)", what,
                      (long long)i, (double)analytic[i], fd, err, tol);
    }
}

typedef struct {
    fixture *fx;
    sublayer which;
} sub_ctx;

static double sub_obj(void *c) {
    sub_ctx *s = c;
    return objective(s->fx, s->which);
}

static void check_sublayer(cai_model_family fam, sublayer which, const cai_layer_dims *d) {
    fixture fx;
    fixture_init(&fx, d);
    /* Analytic: d_stream starts as d(out) = R and ends as d(inp). */
    run_fwd(&fx, which);
    memcpy(fx.dstream.data, fx.r.data, cai_tensor_nbytes(&fx.r));
    cai_status st;
    if (which == SUB_ATTN) st = cai_attn_bwd(lctx(), &fx.d, &fx.w, &fx.g, &fx.acts, &fx.s, &fx.inp, &fx.dstream);
    else if (which == SUB_MLP) st = cai_mlp_bwd(lctx(), &fx.d, &fx.w, &fx.g, &fx.acts, &fx.s, &fx.inp, &fx.dstream);
    else st = cai_block_bwd(lctx(), &fx.d, &fx.w, &fx.g, &fx.acts, &fx.s, &fx.inp, &fx.dstream);
    ck_assert_msg(st == CAI_OK, "bwd: %s", cai_error_message());
    sub_ctx ctx = {&fx, which};
    char what[96];
    snprintf(what, sizeof what, "%s/%d d(inp)", cai_model_family_name(fam), (int)which);
    check_fd(what, fx.inp.data, fx.dstream.data, cai_tensor_numel(&fx.inp), sub_obj, &ctx, 1e-2f, 2e-3, 1e-2, 40);
    int uses[N_FIELDS] = {which != SUB_MLP,  which != SUB_MLP,
                          which != SUB_MLP,  which != SUB_MLP,
                          which != SUB_MLP,  which != SUB_MLP,
                          which != SUB_ATTN, which != SUB_ATTN,
                          which != SUB_ATTN, which != SUB_ATTN,
                          which != SUB_ATTN, which != SUB_ATTN,
                          which != SUB_ATTN, 0};
    for (int i = 0; field(&fx.w, i); i++) {
        cai_tensor *w = field(&fx.w, i), *g = field(&fx.g, i);
        if (!w->data) continue;
        if (!uses[i]) {
            /* A sublayer leaves the other sublayer's gradients alone. */
            const float *gp = g->data;
            for (int64_t k = 0; k < cai_tensor_numel(g); k++) ck_assert(gp[k] == 0.0f);
            continue;
        }
        snprintf(what, sizeof what, "%s/%d %s", cai_model_family_name(fam), (int)which, field_name[i]);
        check_fd(what, w->data, g->data, cai_tensor_numel(w), sub_obj, &ctx, 1e-2f, 2e-3, 1e-2, 30);
    }
    fixture_free(&fx);
}

START_TEST(gpt2_attention_backward_matches_finite_differences) {
    cai_layer_dims d = dims_for(CAI_MODEL_GPT2, 2, 5, 3, 3, 4, 20);
    check_sublayer(CAI_MODEL_GPT2, SUB_ATTN, &d);
}
END_TEST

START_TEST(llama_gqa_attention_backward_matches_finite_differences) {
    cai_layer_dims d = dims_for(CAI_MODEL_LLAMA, 2, 7, 4, 2, 4, 13);
    check_sublayer(CAI_MODEL_LLAMA, SUB_ATTN, &d);
}
END_TEST

START_TEST(gpt2_mlp_backward_matches_finite_differences) {
    cai_layer_dims d = dims_for(CAI_MODEL_GPT2, 2, 3, 3, 3, 3, 19);
    check_sublayer(CAI_MODEL_GPT2, SUB_MLP, &d);
}
END_TEST

START_TEST(llama_mlp_backward_matches_finite_differences) {
    cai_layer_dims d = dims_for(CAI_MODEL_LLAMA, 1, 5, 3, 1, 4, 13);
    check_sublayer(CAI_MODEL_LLAMA, SUB_MLP, &d);
}
END_TEST

START_TEST(blocks_backward_match_finite_differences) {
    cai_layer_dims g = dims_for(CAI_MODEL_GPT2, 1, 5, 3, 3, 4, 11);
    check_sublayer(CAI_MODEL_GPT2, SUB_BLOCK, &g);
    cai_layer_dims l = dims_for(CAI_MODEL_LLAMA, 2, 3, 6, 2, 2, 9);
    check_sublayer(CAI_MODEL_LLAMA, SUB_BLOCK, &l);
}
END_TEST

/* ------------------------------------------------------------ embedding */

typedef struct {
    cai_layer_dims d;
    cai_tensor wte, wpe, tokens, out, r;
} embed_ctx;

static double embed_obj(void *c) {
    embed_ctx *e = c;
    ck_assert_int_eq(cai_embed_fwd(lctx(), &e->d, &e->wte, e->wpe.data ? &e->wpe : NULL, NULL, &e->tokens, &e->out),
                     CAI_OK);
    return dot(&e->out, &e->r);
}

START_TEST(embedding_backward_matches_finite_differences) {
    for (int fam = 0; fam < CAI_MODEL_FAMILY_COUNT; fam++) {
        cai_arena_t a;
        ck_assert_int_eq(cai_device_arena_init(dev, &a, 1 << 20, "embed test"), CAI_OK);
        embed_ctx e;
        memset(&e, 0, sizeof e);
        e.d = dims_for((cai_model_family)fam, 2, 5, 1, 1, 7, 1);
        e.d.vocab_local = 16;
        e.d.vocab_valid = 11;
        e.d.pos_offset = 2;
        e.wte = make(&a, 2, 16, 7, 0);
        cai_tensor dwte = make(&a, 2, 16, 7, 0), dwpe = {0};
        fill_normal(&e.wte, 5, 0, 1);
        if (fam == CAI_MODEL_GPT2) {
            e.wpe = make(&a, 2, 9, 7, 0);
            dwpe = make(&a, 2, 9, 7, 0);
            fill_normal(&e.wpe, 6, 0, 1);
        }
        cai_tensor tok;
        int64_t shape[2] = {2, 5};
        ck_assert_int_eq(cai_tensor_arena(&tok, &a, dev, CAI_DTYPE_I32, 2, shape), CAI_OK);
        int32_t ids[10] = {3, 10, 3, 0, 7, 7, 1, 3, 10, 2}; /* repeats: the scatter must add */
        memcpy(tok.data, ids, sizeof ids);
        e.tokens = tok;
        e.out = make(&a, 3, 2, 5, 7);
        e.r = make(&a, 3, 2, 5, 7);
        fill_normal(&e.r, 7, 0, 1);
        ck_assert_int_eq(cai_embed_bwd(lctx(), &e.d, &dwte, dwpe.data ? &dwpe : NULL, NULL, &e.tokens, &e.r), CAI_OK);
        check_fd("dwte", e.wte.data, dwte.data, cai_tensor_numel(&e.wte), embed_obj, &e, 1e-2f, 1e-4, 1e-3, 200);
        if (fam == CAI_MODEL_GPT2)
            check_fd("dwpe", e.wpe.data, dwpe.data, cai_tensor_numel(&e.wpe), embed_obj, &e, 1e-2f, 1e-4, 1e-3, 200);
        /* Out-of-range tokens are an error, not a silent zero row. */
        ((int32_t *)tok.data)[4] = 11;
        ck_assert_int_eq(cai_embed_fwd(lctx(), &e.d, &e.wte, e.wpe.data ? &e.wpe : NULL, NULL, &e.tokens, &e.out),
                         CAI_ERR_INVALID_ARG);
        cai_error_clear();
        cai_device_arena_free(dev, &a);
    }
}
END_TEST

/* ------------------------------------------------------------ head + loss */

typedef struct {
    cai_layer_dims d;
    cai_head_acts h;
    cai_tensor lnf_w, lnf_b, head_w, inp, targets;
} head_ctx;

static double head_obj(void *c) {
    head_ctx *e = c;
    ck_assert_int_eq(cai_head_fwd(lctx(), &e->d, &e->lnf_w, &e->lnf_b, &e->head_w, &e->h, NULL, &e->inp, &e->targets),
                     CAI_OK);
    const float *l = e->h.losses.data;
    double s = 0;
    for (int64_t i = 0; i < cai_tensor_numel(&e->h.losses); i++) s += l[i];
    return s;
}

START_TEST(head_and_loss_backward_match_finite_differences) {
    for (int fam = 0; fam < CAI_MODEL_FAMILY_COUNT; fam++) {
        cai_arena_t a;
        head_ctx e;
        memset(&e, 0, sizeof e);
        e.d = dims_for((cai_model_family)fam, 2, 3, 1, 1, 5, 1);
        e.d.vocab_local = 16;
        e.d.vocab_valid = 13;
        ck_assert_int_eq(cai_device_arena_init(dev, &a, cai_head_acts_bytes(dev, &e.d) + (1 << 20), "head"), CAI_OK);
        ck_assert_int_eq(cai_head_acts_carve(dev, &a, &e.d, &e.h), CAI_OK);
        e.lnf_w = make(&a, 1, 5, 0, 0);
        fill_normal(&e.lnf_w, 8, 1.0f, 0.2f);
        cai_tensor dlnf_w = make(&a, 1, 5, 0, 0), dlnf_b = {0};
        if (fam == CAI_MODEL_GPT2) {
            e.lnf_b = make(&a, 1, 5, 0, 0);
            fill_normal(&e.lnf_b, 9, 0.0f, 0.2f);
            dlnf_b = make(&a, 1, 5, 0, 0);
        }
        e.head_w = make(&a, 2, 16, 5, 0);
        fill_normal(&e.head_w, 10, 0.0f, 0.5f);
        cai_tensor dhead = make(&a, 2, 16, 5, 0);
        e.inp = make(&a, 3, 2, 3, 5);
        fill_normal(&e.inp, 11, 0.0f, 1.0f);
        int64_t shape[2] = {2, 3};
        ck_assert_int_eq(cai_tensor_arena(&e.targets, &a, dev, CAI_DTYPE_I32, 2, shape), CAI_OK);
        int32_t t[6] = {12, CAI_IGNORE_INDEX, 0, 5, 5, CAI_IGNORE_INDEX};
        memcpy(e.targets.data, t, sizeof t);
        cai_tensor dstream = make(&a, 3, 2, 3, 5), dln = make(&a, 3, 2, 3, 5);
        /* d_stream is overwritten, whatever it held. */
        fill_normal(&dstream, 12, 5.0f, 1.0f);
        fill_normal(&dln, 13, 5.0f, 1.0f);
        head_obj(&e);
        const float *losses = e.h.losses.data;
        ck_assert(losses[1] == 0.0f && losses[5] == 0.0f);
        /* The loss of row 0 from its logits, independently: lse over the 13 real columns minus the target. */
        const float *lg = e.h.logits.data;
        double mx = -1e30, se = 0;
        for (int v = 0; v < 13; v++) mx = fmax(mx, lg[v]);
        for (int v = 0; v < 13; v++) se += exp(lg[v] - mx);
        ck_assert_double_eq_tol(losses[0], mx + log(se) - lg[12], 1e-5);
        cai_block_scratch sc = {.dln = dln};
        ck_assert_int_eq(cai_head_bwd(lctx(), &e.d, &e.lnf_w, &e.head_w, &dlnf_w, dlnf_b.data ? &dlnf_b : NULL, &dhead,
                                      &e.h, &sc, &e.inp, &e.targets, 1.0f, NULL, NULL, &dstream),
                         CAI_OK);
        /* Padded vocabulary rows of the head get no gradient. */
        const float *dh = dhead.data;
        for (int64_t k = 13 * 5; k < 16 * 5; k++) ck_assert(dh[k] == 0.0f);
        check_fd("head d(inp)", e.inp.data, dstream.data, 30, head_obj, &e, 1e-2f, 2e-3, 1e-2, 30);
        check_fd("head dlnf_w", e.lnf_w.data, dlnf_w.data, 5, head_obj, &e, 1e-2f, 2e-3, 1e-2, 30);
        if (fam == CAI_MODEL_GPT2)
            check_fd("head dlnf_b", e.lnf_b.data, dlnf_b.data, 5, head_obj, &e, 1e-2f, 2e-3, 1e-2, 30);
        check_fd("head dW", e.head_w.data, dhead.data, 80, head_obj, &e, 1e-2f, 2e-3, 1e-2, 80);
        cai_device_arena_free(dev, &a);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("layers");
    TCase *tc = tcase_create("fd");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gpt2_attention_backward_matches_finite_differences);
    tcase_add_test(tc, llama_gqa_attention_backward_matches_finite_differences);
    tcase_add_test(tc, gpt2_mlp_backward_matches_finite_differences);
    tcase_add_test(tc, llama_mlp_backward_matches_finite_differences);
    tcase_add_test(tc, blocks_backward_match_finite_differences);
    tcase_add_test(tc, embedding_backward_matches_finite_differences);
    tcase_add_test(tc, head_and_loss_backward_match_finite_differences);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1) != CAI_OK) {
        cai_error_print(stderr);
        MPI_Finalize();
        return 1;
    }
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cai_device_free(dev);
    MPI_Finalize();
    return failed ? 1 : 0;
}
