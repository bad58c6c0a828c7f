/* FP8 linear layers in a model (colossal/fp8.h) on the CPU backend's
 * emulation: one FP8 linear against the f32 one within FP8's error, the
 * layer selection and config checks, a short GPT-2 and Llama training run
 * in FP8 tracking the f32 loss curve on the embedded corpus (byte tokens),
 * and a resumed run (weights, optimizer and FP8 state restored) continuing
 * bit for bit. */
#include "cai_config.h"
#include "colossal/data.h"
#include "colossal/fp8.h"
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

#define OK(expr)                                                                   \
    do {                                                                           \
        cai_status st_ = (expr);                                                   \
        ck_assert_msg(st_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

static float *randn(int64_t n, uint64_t stream, float scale) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = scale * (float)cai_rng_normal(99, stream, (uint64_t)i);
    return p;
}

static double rel(const float *got, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* Forward and backward of one FP8 linear (E4M3 x and W, E5M2 dy) against
 * f32: each operand carries a relative rounding error of RMS about
 * ulp / sqrt(12) (ulp 2^-3..2^-4 of the value for E4M3, 2^-2..2^-3 for
 * E5M2), and the two add in quadrature: ~3.5% for E4M3 x E4M3, ~6% with
 * E5M2. The bounds sit above that; a wrong scale would be far off. */
START_TEST(linear_matches_f32_within_fp8_error) {
    const int64_t N = 48, IC = 32, OC = 24;
    cai_fp8_config cfg = cai_fp8_config_default();
    cfg.enabled = 1;
    snprintf(cfg.layers, sizeof cfg.layers, "all");
    int64_t widths[CAI_FP8_SITE_COUNT][2] = {{IC, OC}, {IC, OC}, {IC, OC}, {0, 0}, {IC, OC}};
    for (int recipe = 0; recipe < 2; recipe++) {
        cfg.recipe = (cai_fp8_recipe_kind)recipe;
        cai_fp8_t *f = NULL;
        OK(cai_fp8_create(&f, dev, &cfg, 1, N, widths, NULL));
        const cai_fp8_layer *l = cai_fp8_layer_of(f, 0);
        ck_assert_ptr_nonnull(l);
        ck_assert(cai_fp8_at(l, CAI_FP8_SITE_QKV) && !cai_fp8_at(l, CAI_FP8_SITE_UP));
        float *x = randn(N * IC, 1, 2.0f), *w = randn(OC * IC, 2, 0.05f), *b = randn(OC, 3, 0.1f),
              *dy = randn(N * OC, 4, 1e-4f), *res = randn(N * OC, 5, 1.0f);
        float *y = calloc((size_t)(N * OC), 4), *yr = calloc((size_t)(N * OC), 4), *dx = calloc((size_t)(N * IC), 4),
              *dxr = calloc((size_t)(N * IC), 4), *dw = calloc((size_t)(OC * IC), 4),
              *dwr = calloc((size_t)(OC * IC), 4), *db = calloc((size_t)OC, 4), *dbr = calloc((size_t)OC, 4);
        cai_tensor X = cai_tensor_2d(dev, x, CAI_DTYPE_F32, N, IC), W = cai_tensor_2d(dev, w, CAI_DTYPE_F32, OC, IC),
                   B = cai_tensor_1d(dev, b, CAI_DTYPE_F32, OC), DY = cai_tensor_2d(dev, dy, CAI_DTYPE_F32, N, OC),
                   Y = cai_tensor_2d(dev, y, CAI_DTYPE_F32, N, OC), YR = cai_tensor_2d(dev, yr, CAI_DTYPE_F32, N, OC),
                   R = cai_tensor_2d(dev, res, CAI_DTYPE_F32, N, OC), DX = cai_tensor_2d(dev, dx, CAI_DTYPE_F32, N, IC),
                   DXR = cai_tensor_2d(dev, dxr, CAI_DTYPE_F32, N, IC),
                   DW = cai_tensor_2d(dev, dw, CAI_DTYPE_F32, OC, IC),
                   DWR = cai_tensor_2d(dev, dwr, CAI_DTYPE_F32, OC, IC), DB = cai_tensor_1d(dev, db, CAI_DTYPE_F32, OC),
                   DBR = cai_tensor_1d(dev, dbr, CAI_DTYPE_F32, OC);
        OK(cai_fp8_linear_fwd(l, CAI_FP8_SITE_QKV, &Y, &X, &W, &B, NULL));
        OK(dev->ops->linear_fwd(dev, &YR, &X, &W, &B));
        double ey = rel(y, yr, N * OC);
        OK(cai_fp8_linear_bwd(l, CAI_FP8_SITE_QKV, &DX, &DW, &DB, &DY, &X, &W, 0));
        OK(dev->ops->linear_bwd(dev, &DXR, &DWR, &DBR, &DY, &X, &W, 0));
        double ex = rel(dx, dxr, N * IC), ew = rel(dw, dwr, OC * IC);
        printf("fp8 linear (%s): relative RMS error y %.4f, dx %.4f, dw %.4f\n", recipe ? "current" : "delayed", ey, ex,
               ew);
        ck_assert(ey < 0.05 && ey > 1e-3); /* really quantised */
        ck_assert(ex < 0.1 && ew < 0.1);
        ck_assert(memcmp(db, dbr, (size_t)OC * 4) == 0); /* the bias gradient stays exact */
        /* with a residual, in place: out = residual + product + bias */
        memcpy(yr, res, (size_t)(N * OC) * 4);
        OK(cai_fp8_linear_fwd(l, CAI_FP8_SITE_QKV, &R, &X, &W, &B, &R));
        for (int64_t i = 0; i < N * OC; i++) ck_assert(fabsf(res[i] - (yr[i] + y[i])) <= 1e-5f * (1 + fabsf(res[i])));
        /* the state: scales set by the first cast, amaxes recorded, a step
         * rolls the history */
        size_t n;
        const float *st = cai_fp8_state(f, &n);
        ck_assert_uint_eq(n, (size_t)CAI_FP8_SITE_COUNT * 3 * CAI_FP8_META_STRIDE(1024));
        OK(cai_fp8_step(f));
        st = cai_fp8_state(f, &n);
        float amax_x = 0;
        for (int64_t i = 0; i < N * IC; i++) amax_x = fmaxf(amax_x, fabsf(x[i]));
        ck_assert(st[CAI_FP8_META_SCALE] == 448.0f / amax_x && st[2] == 0.0f && st[3] == amax_x);
        /* a site the state has no room for is refused */
        ck_assert_int_eq(cai_fp8_linear_fwd(l, CAI_FP8_SITE_UP, &Y, &X, &W, NULL, NULL), CAI_ERR_INVALID_ARG);
        float *bad = calloc(4, 4);
        ck_assert_int_eq(cai_fp8_set_state(f, bad, 4), CAI_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "amax_history"));
        free(bad);
        free(x), free(w), free(b), free(dy), free(res), free(y), free(yr), free(dx), free(dxr), free(dw), free(dwr);
        free(db), free(dbr);
        cai_fp8_free(f);
    }
}
END_TEST

START_TEST(config_selects_layers_and_refuses_bad_values) {
    cai_fp8_config c = cai_fp8_config_default();
    unsigned char on[6];
    OK(cai_fp8_config_check(&c, 6, on));
    unsigned char want_auto[6] = {0, 1, 1, 1, 1, 0};
    ck_assert(memcmp(on, want_auto, 6) == 0);
    snprintf(c.layers, sizeof c.layers, "0,2-3");
    OK(cai_fp8_config_check(&c, 6, on));
    unsigned char want_list[6] = {1, 0, 1, 1, 0, 0};
    ck_assert(memcmp(on, want_list, 6) == 0);
    snprintf(c.layers, sizeof c.layers, "auto");
    OK(cai_fp8_config_check(&c, 2, on));
    ck_assert(on[0] == 0 && on[1] == 0);
    const char *bad[] = {"3-9", "x", "1-", "2,", "-1", "4-2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(c.layers, sizeof c.layers, "%s", bad[i]);
        ck_assert_int_eq(cai_fp8_config_check(&c, 6, on), CAI_ERR_CONFIG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "fp8.layers"));
    }
    c = cai_fp8_config_default();
    c.amax_history = 0;
    ck_assert_int_eq(cai_fp8_config_check(&c, 6, on), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "fp8.amax_history"));
    c = cai_fp8_config_default();
    c.margin = -1;
    ck_assert_int_eq(cai_fp8_config_check(&c, 6, on), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "fp8.margin"));
}
END_TEST

/* ------------------------------------------------------------ training */

enum { B = 4, T = 32, STEPS = 50 };

static cai_model_config small(cai_model_family f) {
    cai_model_config c = cai_model_config_default(f);
    c.vocab_size = 256; /* bytes of the embedded corpus */
    c.n_layers = 4;
    c.d_model = 48;
    c.n_heads = 4;
    c.n_kv_heads = f == CAI_MODEL_LLAMA ? 2 : 0;
    c.ffn_hidden = f == CAI_MODEL_LLAMA ? 96 : 0;
    c.max_seq_len = T;
    c.seed = 7;
    return c;
}

/* Batch `step` of byte tokens from the embedded corpus, documents joined. */
static void corpus_batch(int step, int32_t *tok, int32_t *tgt) {
    static char text[1 << 16];
    static size_t len = 0;
    if (!len) {
        for (int64_t d = 0; len < sizeof text - CAI_CORPUS_MAX_DOC - 1; d++) {
            size_t l;
            OK(cai_corpus_document(3, d, text + len, CAI_CORPUS_MAX_DOC, &l));
            len += l;
            text[len++] = '\n';
        }
    }
    size_t start = ((size_t)step * B * (T + 1)) % (len - B * (T + 1));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            tok[b * T + t] = (unsigned char)text[start + (size_t)b * (T + 1) + (size_t)t];
            tgt[b * T + t] = (unsigned char)text[start + (size_t)b * (T + 1) + (size_t)t + 1];
        }
}

typedef struct {
    cai_model_t *m;
    cai_optim_t *o;
    cai_step_driver d;
    cai_adamw_config oc;
} run_t;

static void run_init(run_t *r, cai_model_family fam, const cai_fp8_config *fp8) {
    cai_model_config c = small(fam);
    cai_model_options mo = cai_model_options_default(&c);
    mo.batch = B;
    mo.seq_len = T;
    OK(cai_model_create(&r->m, dev, &c, &mo));
    if (fp8) OK(cai_model_set_fp8(r->m, fp8, NULL));
    r->oc = cai_adamw_config_default();
    r->oc.schedule.lr = 3e-3f;
    r->oc.schedule.warmup_steps = 5;
    r->oc.schedule.decay_steps = STEPS;
    OK(cai_optim_create_for_model(&r->o, r->m, &r->oc));
    OK(cai_local_driver(r->m, r->o, &r->d));
}

static void run_free(run_t *r) {
    cai_optim_free(r->o);
    cai_model_free(r->m);
}

static float run_step(run_t *r, int step) {
    int32_t tok[B * T], tgt[B * T];
    corpus_batch(step, tok, tgt);
    cai_step_stats st;
    OK(cai_train_step(&r->d, NULL, NULL, tok, tgt, 1, &st));
    return st.loss;
}

/* Emulated FP8 (the CPU backend's products of decoded codes) tracks f32:
 * the mean loss of the last 10 steps within 3% of f32's. */
START_TEST(training_tracks_f32_loss_curve) {
    const char *recipes[] = {"delayed", "current"};
    for (int fam = 0; fam < CAI_MODEL_FAMILY_COUNT; fam++)
        for (int rc = 0; rc < 2; rc++) {
            cai_fp8_config f8 = cai_fp8_config_default();
            f8.enabled = 1;
            f8.recipe = (cai_fp8_recipe_kind)rc;
            f8.amax_history = 16;
            run_t ref, fp;
            run_init(&ref, (cai_model_family)fam, NULL);
            run_init(&fp, (cai_model_family)fam, &f8);
            double first = 0, tail_ref = 0, tail_fp = 0, max_dev = 0;
            for (int s = 0; s < STEPS; s++) {
                float lr = run_step(&ref, s), lf = run_step(&fp, s);
                if (s == 0) first = lr;
                if (s >= STEPS - 10) {
                    tail_ref += lr / 10;
                    tail_fp += lf / 10;
                }
                double dv = fabs(lf - lr) / lr;
                if (dv > max_dev) max_dev = dv;
            }
            double gap = fabs(tail_fp - tail_ref) / tail_ref;
            printf(
                "%s fp8 %s: loss %.3f -> f32 %.4f, fp8 %.4f over the last 10 of %d steps (%.2f%% apart; largest "
                "single-step gap %.2f%%)\n",
                cai_model_family_name((cai_model_family)fam), recipes[rc], first, tail_ref, tail_fp, STEPS, 100 * gap,
                100 * max_dev);
            ck_assert(tail_ref < 0.75 * first); /* it learned */
            ck_assert_msg(gap < 0.03, "fp8 tail loss %.4f vs f32 %.4f", tail_fp, tail_ref);
            /* and FP8 did run: the scales differ from the untouched 0 */
            size_t n;
            const float *st = cai_fp8_state(cai_model_fp8(fp.m), &n);
            size_t per_layer = n / 4;
            ck_assert(st[CAI_FP8_META_SCALE] == 0.0f &&
                      st[per_layer + CAI_FP8_META_SCALE] > 0.0f); /* block 0 stays f32 ("auto"), block 1 is FP8 */
            /* the memory plan's FP8 row is what the model holds after a step */
            const cai_model_config c = small((cai_model_family)fam);
            size_t planned = 0;
            OK(cai_model_fp8_bytes(dev, cai_model_registry(fp.m), &c, cai_model_view(fp.m), B, T, 0, &f8, &planned));
            ck_assert_uint_eq(planned, cai_fp8_device_bytes(cai_model_fp8(fp.m)));
            ck_assert_uint_gt(planned, 0);
            run_free(&ref);
            run_free(&fp);
        }
}
END_TEST

/* Stop after K steps, carry the weights, the optimizer and the FP8 state
 * into a fresh model, continue: the losses and weights equal an
 * uninterrupted run's bit for bit. (tests/mpi/test_fp8_ckpt.c does the
 * same through an HDF5 checkpoint.) */
START_TEST(resume_with_fp8_state_is_bit_exact) {
    enum { K = 6, M = 6 };
    cai_fp8_config f8 = cai_fp8_config_default();
    f8.enabled = 1;
    f8.amax_history = 4;
    snprintf(f8.layers, sizeof f8.layers, "all");
    run_t a, b;
    run_init(&a, CAI_MODEL_GPT2, &f8);
    float la[K + M], lb[M];
    for (int s = 0; s < K + M; s++) {
        la[s] = run_step(&a, s);
        if (s == K - 1) {
            run_init(&b, CAI_MODEL_GPT2, &f8);
            cai_tensor pa, pb, ga, gb;
            cai_model_flat(a.m, &pa, &ga, NULL);
            cai_model_flat(b.m, &pb, &gb, NULL);
            memcpy(pb.data, pa.data, cai_tensor_nbytes(&pa));
            OK(cai_model_params_updated(b.m));
            cai_tensor ma, va, mb, vb;
            cai_optim_state(a.o, &ma, &va);
            cai_optim_state(b.o, &mb, &vb);
            memcpy(mb.data, ma.data, cai_tensor_nbytes(&ma));
            memcpy(vb.data, va.data, cai_tensor_nbytes(&va));
            cai_optim_set_step_count(b.o, cai_optim_step_count(a.o));
            size_t n;
            const float *st = cai_fp8_state(cai_model_fp8(a.m), &n);
            OK(cai_fp8_set_state(cai_model_fp8(b.m), st, n));
        }
        if (s >= K) lb[s - K] = run_step(&b, s);
    }
    for (int s = 0; s < M; s++)
        ck_assert_msg(la[K + s] == lb[s], "step %d: %.9g vs resumed %.9g", K + s, la[K + s], lb[s]);
    cai_tensor pa, pb;
    cai_model_flat(a.m, &pa, NULL, NULL);
    cai_model_flat(b.m, &pb, NULL, NULL);
    ck_assert(memcmp(pa.data, pb.data, cai_tensor_nbytes(&pa)) == 0);
    run_free(&a);
    run_free(&b);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("fp8_model");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, linear_matches_f32_within_fp8_error);
    tcase_add_test(tc, config_selects_layers_and_refuses_bad_values);
    tcase_add_test(tc, training_tracks_f32_loss_curve);
    tcase_add_test(tc, resume_with_fp8_state_is_bit_exact);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    dev = NULL;
    if (cai_device_init(&dev, CAI_DEVICE_HOST, 0, 2) != CAI_OK) return 1;
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cai_device_free(dev);
    MPI_Finalize();
    return failed ? 1 : 0;
}
