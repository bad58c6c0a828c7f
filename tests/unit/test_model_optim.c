/* Optimizer and training step: LR schedules, AdamW against a double
 * reference with the registry's decay flags and tie handling, the global
 * grad-norm partial sum (each element once), clipping, gradient
 * accumulation over microbatches, and non-finite steps failing loudly. */
#include "cai_config.h"
#include "colossal/model.h"
#include "colossal/ops.h"
#include "colossal/optim.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cai_device_t *dev;

/* cai_train_step over the single-process driver. */
static cai_status local_step(cai_model_t *m, cai_optim_t *o, const int32_t *tok, const int32_t *tgt, int n_micro,
                             cai_step_stats *st) {
    cai_step_driver d;
    CAI_CALL(cai_local_driver(m, o, &d));
    return cai_train_step(&d, NULL, NULL, tok, tgt, n_micro, st);
}

#define OK(expr)                                                                   \
    do {                                                                           \
        cai_status st_ = (expr);                                                   \
        ck_assert_msg(st_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

static cai_model_config tiny(cai_model_family f) {
    cai_model_config c = cai_model_config_default(f);
    c.vocab_size = 29;
    c.n_layers = 2;
    c.d_model = 8;
    c.n_heads = 2;
    c.n_kv_heads = f == CAI_MODEL_LLAMA ? 1 : 0;
    c.ffn_hidden = f == CAI_MODEL_LLAMA ? 12 : 0;
    c.max_seq_len = 8;
    c.seed = 5;
    c.init_std = 0.2f;
    return c;
}

static cai_model_t *make_model(const cai_model_config *c, int B, int T) {
    cai_model_options o = cai_model_options_default(c);
    o.batch = B;
    o.seq_len = T;
    cai_model_t *m = NULL;
    OK(cai_model_create(&m, dev, c, &o));
    return m;
}

static void batch(int n, int V, uint64_t seed, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)(cai_rng_uniform(seed, 1, (uint64_t)i) * (float)V) % V;
        tgt[i] = (int32_t)(cai_rng_uniform(seed, 2, (uint64_t)i) * (float)V) % V;
    }
    tgt[0] = CAI_IGNORE_INDEX;
}

static float *snapshot(const cai_tensor *t) {
    size_t b = cai_tensor_nbytes(t);
    float *p = malloc(b ? b : 1);
    memcpy(p, t->data, b);
    return p;
}

/* ------------------------------------------------------------ schedules */

START_TEST(lr_schedules) {
    cai_lr_schedule s = {.kind = CAI_LR_COSINE, .lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .decay_steps = 110};
    ck_assert_float_eq_tol(cai_lr_at(&s, 1), 0.1f, 1e-7f);
    ck_assert_float_eq_tol(cai_lr_at(&s, 5), 0.5f, 1e-7f);
    ck_assert_float_eq_tol(cai_lr_at(&s, 10), 1.0f, 1e-7f);
    ck_assert_float_eq_tol(cai_lr_at(&s, 60), 0.55f, 1e-6f);                               /* half way: the mean */
    ck_assert_float_eq_tol(cai_lr_at(&s, 35), 0.1f + 0.45f * (1.0f + sqrtf(0.5f)), 1e-6f); /* a quarter */
    ck_assert_float_eq_tol(cai_lr_at(&s, 110), 0.1f, 1e-7f);
    ck_assert_float_eq_tol(cai_lr_at(&s, 1000), 0.1f, 1e-7f);
    for (int64_t k = 11; k < 110; k++) ck_assert_float_le(cai_lr_at(&s, k + 1), cai_lr_at(&s, k));
    cai_lr_schedule c = {.kind = CAI_LR_CONSTANT, .lr = 3e-4f, .warmup_steps = 4};
    ck_assert_float_eq_tol(cai_lr_at(&c, 2), 1.5e-4f, 1e-10f);
    ck_assert_float_eq(cai_lr_at(&c, 4), 3e-4f);
    ck_assert_float_eq(cai_lr_at(&c, 5000), 3e-4f);
    c.warmup_steps = 0;
    ck_assert_float_eq(cai_lr_at(&c, 1), 3e-4f);
    cai_lr_kind k;
    OK(cai_lr_kind_parse("cosine", &k));
    ck_assert_int_eq(k, CAI_LR_COSINE);
    OK(cai_lr_kind_parse("linear", &k));
    ck_assert_int_eq(k, CAI_LR_LINEAR);
    ck_assert_int_eq(cai_lr_kind_parse("exponential", &k), CAI_ERR_CONFIG);
    /* Linear decay: straight line from lr at the end of warmup to min_lr at decay_steps. */
    cai_lr_schedule l = {.kind = CAI_LR_LINEAR, .lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .decay_steps = 110};
    ck_assert_float_eq_tol(cai_lr_at(&l, 5), 0.5f, 1e-7f);
    ck_assert_float_eq_tol(cai_lr_at(&l, 10), 1.0f, 1e-7f);
    ck_assert_float_eq_tol(cai_lr_at(&l, 35), 0.1f + 0.9f * 0.75f, 1e-6f);
    ck_assert_float_eq_tol(cai_lr_at(&l, 60), 0.55f, 1e-6f);
    ck_assert_float_eq_tol(cai_lr_at(&l, 110), 0.1f, 1e-7f);
    ck_assert_float_eq_tol(cai_lr_at(&l, 500), 0.1f, 1e-7f);
    for (int64_t j = 11; j < 110; j++) ck_assert_float_eq_tol(cai_lr_at(&l, j) - cai_lr_at(&l, j + 1), 0.009f, 1e-6f);

    /* A cosine that ends before its warmup is a configuration error. */
    cai_model_config mc = tiny(CAI_MODEL_LLAMA);
    cai_model_t *m = make_model(&mc, 1, 4);
    cai_adamw_config oc = cai_adamw_config_default();
    oc.schedule = s;
    oc.schedule.decay_steps = 5;
    cai_optim_t *o = NULL;
    ck_assert_int_eq(cai_optim_create_for_model(&o, m, &oc), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "decay_steps=5"));
    oc = cai_adamw_config_default();
    oc.beta2 = 1.0f;
    ck_assert_int_eq(cai_optim_create_for_model(&o, m, &oc), CAI_ERR_CONFIG);
    cai_error_clear();
    cai_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ AdamW */

/* Two AdamW steps over every parameter against a double-precision reference
 * written from the update rule, with the decay flag read per parameter from
 * the registry. */
START_TEST(adamw_matches_reference_with_decay_flags_and_ties) {
    for (int fam = 0; fam < CAI_MODEL_FAMILY_COUNT; fam++) {
        cai_model_config c = tiny((cai_model_family)fam);
        cai_model_t *m = make_model(&c, 2, 5);
        cai_adamw_config oc = cai_adamw_config_default();
        oc.schedule.lr = 1e-2f;
        oc.weight_decay = 0.5f;
        cai_optim_t *o = NULL;
        OK(cai_optim_create_for_model(&o, m, &oc));
        const cai_registry_t *reg = cai_model_registry(m);
        int np = cai_registry_count(reg);
        int32_t tok[10], tgt[10];
        batch(10, c.vocab_size, 1, tok, tgt);
        double **ref = calloc((size_t)np, sizeof *ref), **rm = calloc((size_t)np, sizeof *rm),
               **rv = calloc((size_t)np, sizeof *rv);
        for (int i = 0; i < np; i++) {
            cai_tensor w;
            OK(cai_model_param(m, cai_registry_param(reg, i)->name, &w, NULL));
            int64_t n = cai_tensor_numel(&w);
            ref[i] = calloc((size_t)n, sizeof(double));
            rm[i] = calloc((size_t)n, sizeof(double));
            rv[i] = calloc((size_t)n, sizeof(double));
            for (int64_t k = 0; k < n; k++) ref[i][k] = ((float *)w.data)[k];
        }
        const float gscale = 0.5f;
        for (int step = 1; step <= 2; step++) {
            OK(cai_model_zero_grad(m));
            OK(cai_model_forward(m, tok, tgt, NULL));
            OK(cai_model_backward(m, 1.0f));
            cai_tensor params, grads, lowp;
            cai_model_flat(m, &params, &grads, &lowp);
            int head = cai_registry_find(reg, "lm_head.weight");
            cai_tensor head_before;
            OK(cai_model_param(m, "lm_head.weight", &head_before, NULL));
            float *hb = snapshot(&head_before);
            float lr = 0;
            OK(cai_optim_step(o, &params, &grads, &lowp, gscale, &lr));
            ck_assert_float_eq(lr, 1e-2f);
            ck_assert_int_eq(cai_optim_step_count(o), step);
            double bc1 = 1 - pow(0.9, step), bc2 = 1 - pow(0.95, step);
            for (int i = 0; i < np; i++) {
                const cai_param_info *p = cai_registry_param(reg, i);
                cai_tensor w, g;
                OK(cai_model_param(m, p->name, &w, &g));
                const float *wp = w.data, *gp = g.data;
                if (i == head && c.tie_embeddings) {
                    /* The tie copy is left to the model: the optimizer does not touch it. */
                    ck_assert(memcmp(hb, wp, cai_tensor_nbytes(&w)) == 0);
                    continue;
                }
                int decay = p->ndim >= 2; /* matrices decay, norms and biases do not */
                ck_assert_int_eq(p->spec.weight_decay, decay);
                for (int64_t k = 0; k < cai_tensor_numel(&w); k++) {
                    double gk = (double)gp[k] * gscale;
                    rm[i][k] = 0.9 * rm[i][k] + 0.1 * gk;
                    rv[i][k] = 0.95 * rv[i][k] + 0.05 * gk * gk;
                    if (decay) ref[i][k] *= 1.0 - 1e-2 * 0.5;
                    ref[i][k] -= 1e-2 * (rm[i][k] / bc1) / (sqrt(rv[i][k] / bc2) + 1e-8);
                    ck_assert_msg(fabs(wp[k] - ref[i][k]) <= 2e-6 * (1 + fabs(ref[i][k])),
                                  "%s step %d %s[%lld]: %.8g vs reference %.8g", cai_model_family_name(c.family), step,
                                  p->name, (long long)k, (double)wp[k], ref[i][k]);
                }
            }
            free(hb);
            OK(cai_model_params_updated(m));
            if (c.tie_embeddings) {
                cai_tensor a, b;
                OK(cai_model_param(m, "wte.weight", &a, NULL));
                OK(cai_model_param(m, "lm_head.weight", &b, NULL));
                ck_assert(memcmp(a.data, b.data, cai_tensor_nbytes(&a)) == 0);
                for (int64_t k = 0; k < cai_tensor_numel(&b); k++) ref[head][k] = ((float *)b.data)[k];
            }
        }
        for (int i = 0; i < np; i++) {
            free(ref[i]);
            free(rm[i]);
            free(rv[i]);
        }
        free(ref);
        free(rm);
        free(rv);
        cai_optim_free(o);
        cai_model_free(m);
    }
}
END_TEST

/* ------------------------------------------------------------ grad norm and clipping */

START_TEST(grad_norm_counts_each_element_once) {
    for (int fam = 0; fam < CAI_MODEL_FAMILY_COUNT; fam++) {
        cai_model_config c = tiny((cai_model_family)fam);
        cai_model_t *m = make_model(&c, 1, 4);
        cai_optim_t *o = NULL;
        cai_adamw_config oc = cai_adamw_config_default();
        OK(cai_optim_create_for_model(&o, m, &oc));
        cai_tensor grads;
        cai_model_flat(m, NULL, &grads, NULL);
        /* Ones everywhere, alignment gaps included: the sum of squares is
         * the count of elements that belong to the job's norm. */
        float *g = grads.data;
        for (int64_t k = 0; k < cai_tensor_numel(&grads); k++) g[k] = 1.0f;
        const cai_registry_t *reg = cai_model_registry(m);
        double want = 0;
        for (int i = 0; i < cai_registry_count(reg); i++) {
            const cai_param_info *p = cai_registry_param(reg, i);
            if (p->tie_primary == i) want += (double)p->numel;
        }
        double got = 0;
        OK(cai_optim_grad_sumsq(o, &grads, &got));
        ck_assert_double_eq(got, want);
        ck_assert_double_lt(want, (double)cai_tensor_numel(&grads));
        cai_optim_free(o);
        cai_model_free(m);
    }
}
END_TEST

START_TEST(train_step_clips_by_the_global_norm) {
    cai_model_config c = tiny(CAI_MODEL_GPT2);
    cai_model_t *m = make_model(&c, 2, 6);
    cai_adamw_config oc = cai_adamw_config_default();
    oc.grad_clip = 0.05f;
    cai_optim_t *o = NULL;
    OK(cai_optim_create_for_model(&o, m, &oc));
    int32_t tok[12], tgt[12];
    batch(12, c.vocab_size, 4, tok, tgt);
    cai_step_stats st;
    OK(local_step(m, o, tok, tgt, 1, &st));
    /* The gradients of the step are still in the buffer: recompute the norm. */
    const cai_registry_t *reg = cai_model_registry(m);
    double ss = 0;
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        if (p->tie_primary != i) continue;
        cai_tensor g;
        OK(cai_model_param(m, p->name, NULL, &g));
        for (int64_t k = 0; k < cai_tensor_numel(&g); k++) ss += (double)((float *)g.data)[k] * ((float *)g.data)[k];
    }
    ck_assert_double_eq_tol(st.grad_norm, sqrt(ss), 1e-5 * sqrt(ss));
    ck_assert_double_gt(sqrt(ss), 0.05);
    /* First moment after one step is (1 - beta1) * g * clip coefficient. */
    double coef = 0.05 / (sqrt(ss) + 1e-6);
    cai_tensor mstate, grads;
    cai_optim_state(o, &mstate, NULL);
    cai_model_flat(m, NULL, &grads, NULL);
    const float *mm = mstate.data, *gg = grads.data;
    for (int64_t k = 0; k < cai_tensor_numel(&grads); k += 7)
        ck_assert_double_eq_tol(mm[k], 0.1 * coef * gg[k], 1e-6 * fabs(gg[k]) + 1e-12);
    cai_optim_free(o);
    cai_model_free(m);
}
END_TEST

START_TEST(microbatches_accumulate_to_the_mean) {
    cai_model_config c = tiny(CAI_MODEL_LLAMA);
    const int B = 2, T = 5, n = B * T;
    int32_t tok[20], tgt[20];
    batch(2 * n, c.vocab_size, 8, tok, tgt);
    /* Each microbatch alone. */
    float la, lb;
    float *ga, *gb;
    cai_model_t *m = make_model(&c, B, T);
    cai_tensor grads;
    cai_model_flat(m, NULL, &grads, NULL);
    OK(cai_model_zero_grad(m));
    OK(cai_model_forward(m, tok, tgt, &la));
    OK(cai_model_backward(m, 1.0f));
    ga = snapshot(&grads);
    OK(cai_model_zero_grad(m));
    OK(cai_model_forward(m, tok + n, tgt + n, &lb));
    OK(cai_model_backward(m, 1.0f));
    gb = snapshot(&grads);
    /* Both in one step (clipping off, lr 0: the parameters stay put). */
    cai_adamw_config oc = cai_adamw_config_default();
    oc.grad_clip = 0;
    oc.schedule.lr = 0;
    cai_optim_t *o = NULL;
    OK(cai_optim_create_for_model(&o, m, &oc));
    cai_step_stats st;
    OK(local_step(m, o, tok, tgt, 2, &st));
    ck_assert_double_eq_tol(st.loss, 0.5 * (la + lb), 1e-6);
    const float *g = grads.data;
    for (int64_t k = 0; k < cai_tensor_numel(&grads); k++)
        ck_assert_double_eq_tol(g[k], 0.5 * ((double)ga[k] + gb[k]), 1e-6 * (fabs(ga[k]) + fabs(gb[k])) + 1e-9);
    free(ga);
    free(gb);
    cai_optim_free(o);
    cai_model_free(m);
}
END_TEST

START_TEST(non_finite_step_fails_without_updating) {
    cai_model_config c = tiny(CAI_MODEL_GPT2);
    cai_model_t *m = make_model(&c, 1, 4);
    cai_optim_t *o = NULL;
    cai_adamw_config oc = cai_adamw_config_default();
    OK(cai_optim_create_for_model(&o, m, &oc));
    cai_tensor w;
    OK(cai_model_param(m, "h.0.mlp.fc.weight", &w, NULL));
    ((float *)w.data)[3] = NAN;
    OK(cai_model_params_updated(m));
    cai_tensor params;
    cai_model_flat(m, &params, NULL, NULL);
    float *before = snapshot(&params);
    int32_t tok[4] = {1, 2, 3, 4}, tgt[4] = {2, 3, 4, 5};
    ck_assert_int_eq(local_step(m, o, tok, tgt, 1, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "not finite"));
    ck_assert_int_eq(cai_optim_step_count(o), 0);
    ck_assert(memcmp(before, params.data, cai_tensor_nbytes(&params)) == 0);
    cai_error_clear();
    free(before);
    cai_optim_free(o);
    cai_model_free(m);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("model_optim");
    TCase *tc = tcase_create("optim");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, lr_schedules);
    tcase_add_test(tc, adamw_matches_reference_with_decay_flags_and_ties);
    tcase_add_test(tc, grad_norm_counts_each_element_once);
    tcase_add_test(tc, train_step_clips_by_the_global_norm);
    tcase_add_test(tc, microbatches_accumulate_to_the_mean);
    tcase_add_test(tc, non_finite_step_fails_without_updating);
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
