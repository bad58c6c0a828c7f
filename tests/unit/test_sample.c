/* Token sampling against expectations computed by hand from Hugging Face's
 * and OpenAI's definitions (penalties, filters, log-probabilities), against
 * softmax for the empirical distribution of many draws, and against a
 * naive full-sort reference of the same definition on a 128256-token
 * vocabulary. */
#include "cai_config.h"
#include "colossal/infer.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK_CAI(expr)                                                                          \
    do {                                                                                      \
        cai_status ck_st_ = (expr);                                                           \
        if (ck_st_ != CAI_OK) {                                                               \
            cai_error_print(stderr);                                                          \
            ck_abort_msg("%s -> %s: %s", #expr, cai_status_str(ck_st_), cai_error_message()); \
        }                                                                                     \
    } while (0)

enum { MAXV = 64 };

/* One draw from a copy of logits (cai_sample penalises in place). */
static int32_t draw1(cai_sample_ws_t *ws, const cai_sampling_params *p, const float *logits, int64_t V,
                     const int32_t *hist, int64_t n_prompt, int64_t n_hist, int64_t step, cai_sample_result *res) {
    float z[MAXV];
    ck_assert_int_le(V, MAXV);
    memcpy(z, logits, (size_t)V * sizeof *z);
    cai_sample_result r;
    CK_CAI(cai_sample(ws, p, z, V, hist, n_prompt, n_hist, step, &r));
    if (res) *res = r;
    return r.token;
}

/* Frequencies of `n` draws at steps 0..n-1. */
static void histogram(cai_sample_ws_t *ws, const cai_sampling_params *p, const float *logits, int64_t V, int n,
                      double *freq) {
    for (int64_t i = 0; i < V; i++) freq[i] = 0;
    for (int s = 0; s < n; s++) freq[draw1(ws, p, logits, V, NULL, 0, 0, s, NULL)] += 1.0 / n;
}

static void softmax(const float *z, int64_t V, double T, double *out) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < V; i++) m = fmax(m, z[i] / T);
    for (int64_t i = 0; i < V; i++) s += out[i] = exp(z[i] / T - m);
    for (int64_t i = 0; i < V; i++) out[i] /= s;
}

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}
/* Roughly standard normal (sum of 4 uniforms, rescaled). */
static float gauss(uint32_t *s) {
    double u = 0;
    for (int i = 0; i < 4; i++) u += lcg(s) / 16777216.0;
    return (float)((u - 2.0) * sqrt(3.0));
}

static int32_t argmax(const float *z, int64_t V) {
    int64_t a = 0;
    for (int64_t i = 1; i < V; i++)
        if (z[i] > z[a]) a = i;
    return (int32_t)a;
}

/* ------------------------------------------------------------------ parameters */

#define EXPECT_BAD(stmt, prefix)                                                                                  \
    do {                                                                                                          \
        cai_sampling_params q = cai_sampling_default();                                                           \
        stmt;                                                                                                     \
        cai_error_clear();                                                                                        \
        ck_assert_int_eq(cai_sampling_check(&q), CAI_ERR_INVALID_ARG);                                            \
        ck_assert_msg(strncmp(cai_error_message(), prefix, strlen(prefix)) == 0, "'%s' does not start with '%s'", \
                      cai_error_message(), prefix);                                                               \
    } while (0)

START_TEST(defaults_pass_and_each_check_error_names_its_field) {
    cai_sampling_params p = cai_sampling_default();
    ck_assert_int_eq(p.max_new_tokens, 16);
    ck_assert(p.temperature == 0.0f && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f);
    ck_assert(p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f);
    ck_assert(p.seed == 0 && p.has_seed == 0 && p.n_stop == 0 && p.n_stop_ids == 0 && p.logprobs == -1);
    ck_assert_ptr_null(p.stop[0]);
    CK_CAI(cai_sampling_check(&p));

    EXPECT_BAD(q.max_new_tokens = 0, "max_new_tokens=0: must be >= 1");
    EXPECT_BAD(q.temperature = -1, "temperature=-1: must be a finite number >= 0");
    EXPECT_BAD(q.temperature = NAN, "temperature=nan");
    EXPECT_BAD(q.temperature = INFINITY, "temperature=inf");
    EXPECT_BAD(q.top_k = -1, "top_k=-1: must be >= 0");
    EXPECT_BAD(q.top_p = 0, "top_p=0: must be in (0, 1]");
    EXPECT_BAD(q.top_p = 1.5f, "top_p=1.5");
    EXPECT_BAD(q.top_p = NAN, "top_p=nan");
    EXPECT_BAD(q.min_p = -0.5f, "min_p=-0.5: must be in [0, 1]");
    EXPECT_BAD(q.min_p = 1.5f, "min_p=1.5");
    EXPECT_BAD(q.repetition_penalty = 0, "repetition_penalty=0: must be a finite number > 0");
    EXPECT_BAD(q.repetition_penalty = INFINITY, "repetition_penalty=inf");
    EXPECT_BAD(q.frequency_penalty = 2.5f, "frequency_penalty=2.5: must be in [-2, 2]");
    EXPECT_BAD(q.presence_penalty = -3, "presence_penalty=-3: must be in [-2, 2]");
    EXPECT_BAD(q.n_stop = CAI_SAMPLE_MAX_STOP + 1, "n_stop=9: must be in [0, 8]");
    EXPECT_BAD(q.n_stop = -1, "n_stop=-1");
    EXPECT_BAD(q.n_stop = 1, "stop[0]: must be a non-empty string");
    EXPECT_BAD((q.n_stop = 1, q.stop[0] = (char *)""), "stop[0]: must be a non-empty string");
    EXPECT_BAD(q.n_stop_ids = CAI_SAMPLE_MAX_STOP_IDS + 1, "n_stop_ids=17: must be in [0, 16]");
    EXPECT_BAD((q.n_stop_ids = 2, q.stop_ids[1] = -4), "stop_ids[1]=-4: must be a token id >= 0");
    EXPECT_BAD(q.logprobs = -2, "logprobs=-2: must be in [-1, 20]");
    EXPECT_BAD(q.logprobs = 21, "logprobs=21");

    /* the edges of every range are accepted */
    p.temperature = 0;
    p.top_p = 1;
    p.min_p = 1;
    p.repetition_penalty = 1e-3f;
    p.frequency_penalty = -2;
    p.presence_penalty = 2;
    p.logprobs = CAI_SAMPLE_MAX_LOGPROBS;
    p.n_stop_ids = CAI_SAMPLE_MAX_STOP_IDS;
    p.max_new_tokens = 1;
    CK_CAI(cai_sampling_check(&p));

    /* cai_sample refuses bad parameters the same way */
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, 4));
    float z[4] = {0, 1, 2, 3};
    cai_sample_result r;
    p = cai_sampling_default();
    p.top_p = 2;
    ck_assert_int_eq(cai_sample(ws, &p, z, 4, NULL, 0, 0, 0, &r), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "top_p=2"));
    cai_sample_ws_free(ws);
}
END_TEST

START_TEST(copy_and_free_own_the_stop_strings) {
    cai_sampling_params a = cai_sampling_default(), b;
    a.n_stop = 2;
    a.stop[0] = strdup("\n\n");
    a.stop[1] = strdup("</s>");
    a.temperature = 0.7f;
    a.stop_ids[0] = 5;
    a.n_stop_ids = 1;
    CK_CAI(cai_sampling_copy(&b, &a));
    ck_assert_ptr_ne(b.stop[0], a.stop[0]);
    ck_assert_ptr_ne(b.stop[1], a.stop[1]);
    ck_assert_ptr_null(b.stop[2]);
    cai_sampling_free(&a);
    ck_assert_int_eq(a.n_stop, 0);
    ck_assert_ptr_null(a.stop[0]);
    ck_assert_str_eq(b.stop[0], "\n\n");
    ck_assert_str_eq(b.stop[1], "</s>");
    ck_assert_int_eq(b.n_stop, 2);
    ck_assert(b.temperature == 0.7f && b.n_stop_ids == 1 && b.stop_ids[0] == 5);
    CK_CAI(cai_sampling_check(&b));
    cai_sampling_free(&b);
    cai_sampling_free(&b); /* twice is harmless */
    cai_sampling_free(NULL);

    a = cai_sampling_default();
    a.n_stop = 99;
    ck_assert_int_eq(cai_sampling_copy(&b, &a), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "n_stop=99"));
    ck_assert_int_eq(cai_sampling_copy(&a, &a), CAI_ERR_INVALID_ARG);
}
END_TEST

/* ------------------------------------------------------------------ greedy and penalties */

START_TEST(greedy_is_the_argmax_lowest_id_on_ties_filters_ignored) {
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, 8));
    cai_sampling_params p = cai_sampling_default();
    const float z[5] = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f};
    ck_assert_int_eq(draw1(ws, &p, z, 5, NULL, 0, 0, 0, NULL), 1);
    p.top_k = 3;
    p.top_p = 0.01f;
    p.min_p = 0.9f;
    for (int s = 0; s < 20; s++) {
        p.seed = (uint64_t)s * 7919u;
        ck_assert_int_eq(draw1(ws, &p, z, 5, NULL, 0, 0, s, NULL), 1);
    }
    const float m[4] = {-INFINITY, -5.0f, -7.0f, -INFINITY};
    ck_assert_int_eq(draw1(ws, &p, m, 4, NULL, 0, 0, 0, NULL), 1);
    /* a smaller vocabulary than the workspace's */
    ck_assert_int_eq(draw1(ws, &p, z, 3, NULL, 0, 0, 0, NULL), 1);
    cai_sample_ws_free(ws);
}
END_TEST

START_TEST(repetition_penalty_divides_positive_multiplies_negative) {
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, 8));
    cai_sampling_params p = cai_sampling_default();
    p.repetition_penalty = 2.0f;
    cai_sample_result r;

    /* positive: 2 / 2 = 1 < 1.5; the prompt counts */
    float a[4] = {2.0f, 1.5f, 0.0f, -1.0f};
    const int32_t h0[1] = {0};
    ck_assert_int_eq(draw1(ws, &p, a, 4, h0, 1, 1, 0, NULL), 1);
    ck_assert_int_eq(draw1(ws, &p, a, 4, NULL, 0, 0, 0, NULL), 0); /* no history, no penalty */
    CK_CAI(cai_sample(ws, &p, a, 4, h0, 1, 1, 0, &r));
    ck_assert(a[0] == 1.0f && a[1] == 1.5f && a[2] == 0.0f && a[3] == -1.0f);

    /* negative: -1 * 2 = -2 < -1.5; the output counts */
    const float b[3] = {-1.0f, -1.5f, -3.0f};
    ck_assert_int_eq(draw1(ws, &p, b, 3, NULL, 0, 0, 0, NULL), 0);
    ck_assert_int_eq(draw1(ws, &p, b, 3, h0, 0, 1, 0, NULL), 1);

    /* each distinct token once, however often it occurs */
    float c[3] = {2.0f, 0.9f, 0.0f};
    const int32_t h4[5] = {0, 0, 2, 0, 0};
    CK_CAI(cai_sample(ws, &p, c, 3, h4, 2, 5, 0, &r));
    ck_assert_int_eq(r.token, 0);
    ck_assert(c[0] == 1.0f && c[1] == 0.9f && c[2] == 0.0f);

    /* a penalty below 1 rewards repetition */
    p.repetition_penalty = 0.5f;
    const float d[2] = {1.0f, 1.5f};
    ck_assert_int_eq(draw1(ws, &p, d, 2, h0, 1, 1, 0, NULL), 0);
    const float e[2] = {-1.0f, -0.6f};
    ck_assert_int_eq(draw1(ws, &p, e, 2, h0, 1, 1, 0, NULL), 0);
    cai_sample_ws_free(ws);
}
END_TEST

START_TEST(frequency_and_presence_count_the_output_only) {
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, 8));
    cai_sampling_params p = cai_sampling_default();
    cai_sample_result r;
    const float z[3] = {1.0f, 0.8f, 0.0f};
    const int32_t h[3] = {0, 0, 0};
    float w[3];

    p.frequency_penalty = 0.5f;
    /* all three in the prompt: no penalty */
    memcpy(w, z, sizeof w);
    CK_CAI(cai_sample(ws, &p, w, 3, h, 3, 3, 0, &r));
    ck_assert_int_eq(r.token, 0);
    ck_assert(w[0] == 1.0f);
    /* two in the output: 1 - 2 * 0.5 = 0 */
    memcpy(w, z, sizeof w);
    CK_CAI(cai_sample(ws, &p, w, 3, h, 1, 3, 0, &r));
    ck_assert_int_eq(r.token, 1);
    ck_assert_float_eq_tol(w[0], 0.0f, 1e-7f);
    ck_assert(w[1] == 0.8f && w[2] == 0.0f);

    /* presence: once, however often */
    p.frequency_penalty = 0;
    p.presence_penalty = 0.3f;
    ck_assert_int_eq(draw1(ws, &p, z, 3, h, 1, 3, 0, NULL), 1); /* 0.7 < 0.8 */
    ck_assert_int_eq(draw1(ws, &p, z, 3, h, 3, 3, 0, NULL), 0);
    p.presence_penalty = 0.1f;
    ck_assert_int_eq(draw1(ws, &p, z, 3, h, 1, 3, 0, NULL), 0); /* 0.9 > 0.8 */
    /* negative values encourage */
    p.presence_penalty = 0;
    p.frequency_penalty = -1.0f;
    const int32_t h1[2] = {2, 2};
    ck_assert_int_eq(draw1(ws, &p, z, 3, h1, 0, 2, 0, NULL), 2); /* 0 + 2 */

    /* all three, in HF's then OpenAI's order: token 0 is in the output
     * twice (3 / 2 - 2 * 0.25 - 0.5 = 0.5), token 1 in the prompt only
     * (2 / 2 = 1), token 2 unseen (1); the tie goes to the lower id */
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.5f;
    float x[3] = {3.0f, 2.0f, 1.0f};
    const int32_t h2[3] = {1, 0, 0};
    CK_CAI(cai_sample(ws, &p, x, 3, h2, 1, 3, 0, &r));
    ck_assert_int_eq(r.token, 1);
    ck_assert(x[0] == 0.5f && x[1] == 1.0f && x[2] == 1.0f);
    cai_sample_ws_free(ws);
}
END_TEST

/* ------------------------------------------------------------------ filters */

START_TEST(top_k_one_is_greedy_at_any_temperature_and_seed) {
    enum { V = 1000 };
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, V));
    float z[V], w[V];
    uint32_t s = 12345;
    for (int i = 0; i < V; i++) z[i] = 2.0f * gauss(&s);
    const int32_t best = argmax(z, V);
    cai_sampling_params p = cai_sampling_default();
    p.top_k = 1;
    const float temps[] = {0.3f, 1.0f, 5.0f, 100.0f};
    cai_sample_result r;
    for (int t = 0; t < 4; t++)
        for (uint64_t seed = 1; seed <= 3; seed++)
            for (int step = 0; step < 20; step++) {
                p.temperature = temps[t];
                p.seed = seed;
                memcpy(w, z, sizeof w);
                CK_CAI(cai_sample(ws, &p, w, V, NULL, 0, 0, step, &r));
                ck_assert_int_eq(r.token, best);
            }
    cai_sample_ws_free(ws);
}
END_TEST

START_TEST(top_k_keeps_every_token_tied_with_the_kth) {
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, 8));
    cai_sampling_params p = cai_sampling_default();
    p.temperature = 1.0f;
    p.top_k = 1;
    const float z[4] = {1.0f, 1.0f, 1.0f, 0.0f};
    double f[4];
    histogram(ws, &p, z, 4, 3000, f);
    ck_assert(f[3] == 0.0);
    for (int i = 0; i < 3; i++) ck_assert_double_eq_tol(f[i], 1.0 / 3, 0.04);
    /* top_k = 2 on [3, 2, 1, 0]: renormalised over the first two */
    p.top_k = 2;
    const float y[4] = {3.0f, 2.0f, 1.0f, 0.0f};
    histogram(ws, &p, y, 4, 20000, f);
    ck_assert(f[2] == 0.0 && f[3] == 0.0);
    ck_assert_double_eq_tol(f[0], 1.0 / (1.0 + exp(-1.0)), 0.012);
    cai_sample_ws_free(ws);
}
END_TEST

/* Past the heap's reach the cut is made inside one bucket of d = (z_max -
 * z) / T, 1/64 wide: by selection among distinct logits there, and with
 * every tie of the k-th kept. */
START_TEST(a_large_top_k_cuts_exactly) {
    enum { V = 3000, N = 6000 };
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, V));
    float *z = malloc(V * sizeof *z), *w = malloc(V * sizeof *w);
    ck_assert(z && w);
    cai_sampling_params p = cai_sampling_default();
    p.temperature = 1.0f;
    cai_sample_result r;
    /* ids 1000.. descend by 1e-5 within one bucket; k = 1100 keeps 1000..1099 */
    for (int i = 0; i < V; i++) z[i] = i < 1000 ? 2.0f : i < 2000 ? 1.0f - (float)(i - 1000) * 1e-5f : -5.0f;
    p.top_k = 1100;
    int near = 0;
    for (int s = 0; s < N; s++) {
        memcpy(w, z, V * sizeof *w);
        CK_CAI(cai_sample(ws, &p, w, V, NULL, 0, 0, s, &r));
        ck_assert_int_lt(r.token, 1100);
        near += r.token >= 1050;
    }
    ck_assert_int_gt(near, 50);
    /* ids 1000..1199 tie: every one stays, for a k past the heap's reach and within it */
    for (int i = 1000; i < V; i++) z[i] = i < 1200 ? 1.0f : -5.0f;
    const int ks[2] = {1100, 1010};
    for (int t = 0; t < 2; t++) {
        p.top_k = ks[t];
        int tied = 0, past = 0;
        for (int s = 0; s < N; s++) {
            memcpy(w, z, V * sizeof *w);
            CK_CAI(cai_sample(ws, &p, w, V, NULL, 0, 0, s, &r));
            ck_assert_int_lt(r.token, 1200);
            tied += r.token >= 1000;
            past += r.token >= 1150;
        }
        /* 200 e / (1000 e^2 + 200 e) = 0.0686 of the draws */
        ck_assert_double_eq_tol(tied / (double)N, 200.0 / (1000.0 * exp(1.0) + 200.0), 0.012);
        ck_assert_int_gt(past, 20);
    }
    free(z);
    free(w);
    cai_sample_ws_free(ws);
}
END_TEST

START_TEST(top_p_keeps_the_smallest_set_reaching_p) {
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, 8));
    cai_sampling_params p = cai_sampling_default();
    p.temperature = 1.0f;
    const float z[4] = {logf(0.5f), logf(0.25f), logf(0.15f), logf(0.1f)};
    double f[4];

    /* 0.5 < 0.7 keeps the second; 0.75 >= 0.7 drops the third */
    p.top_p = 0.7f;
    histogram(ws, &p, z, 4, 20000, f);
    ck_assert(f[2] == 0.0 && f[3] == 0.0);
    ck_assert_double_eq_tol(f[0], 2.0 / 3, 0.012);
    /* 0.75 < 0.8 keeps the third */
    p.top_p = 0.8f;
    histogram(ws, &p, z, 4, 20000, f);
    ck_assert(f[3] == 0.0);
    ck_assert_double_eq_tol(f[2], 0.15 / 0.9, 0.012);
    /* after top_k = 3 the probabilities are renormalised over three: the
     * first holds 0.556 < 0.8, the first two 0.833 >= 0.8 */
    p.top_k = 3;
    histogram(ws, &p, z, 4, 20000, f);
    ck_assert(f[2] == 0.0 && f[3] == 0.0);
    p.top_k = 0;
    p.top_p = 0.95f;
    histogram(ws, &p, z, 4, 20000, f);
    ck_assert_double_eq_tol(f[3], 0.1, 0.012);

    cai_sample_ws_free(ws);
}
END_TEST

START_TEST(tiny_top_p_keeps_the_most_likely_token_alone) {
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, MAXV));
    cai_sampling_params p = cai_sampling_default();
    p.temperature = 1.0f;
    p.top_p = 1e-6f;
    float z[MAXV];
    uint32_t s = 99;
    for (int i = 0; i < MAXV; i++) z[i] = 0.3f * gauss(&s);
    const int32_t best = argmax(z, MAXV);
    for (int step = 0; step < 200; step++) ck_assert_int_eq(draw1(ws, &p, z, MAXV, NULL, 0, 0, step, NULL), best);
    /* ties at the top: the lower id */
    const float t[3] = {2.0f, 2.0f, 1.9f};
    for (int step = 0; step < 200; step++) ck_assert_int_eq(draw1(ws, &p, t, 3, NULL, 0, 0, step, NULL), 0);
    cai_sample_ws_free(ws);
}
END_TEST

START_TEST(min_p_is_relative_to_the_maximum_after_temperature) {
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, 8));
    cai_sampling_params p = cai_sampling_default();
    /* p / p_max = 1, 0.25, 0.1 at temperature 1; 1, 0.5, 0.316 at 2 */
    const float z[3] = {0.0f, -logf(4.0f), -logf(10.0f)};
    double f[3];
    p.temperature = 1.0f;
    p.min_p = 0.2f;
    histogram(ws, &p, z, 3, 20000, f);
    ck_assert(f[2] == 0.0);
    ck_assert_double_eq_tol(f[1], 0.2, 0.012);
    p.min_p = 0.3f;
    histogram(ws, &p, z, 3, 2000, f);
    ck_assert(f[1] == 0.0 && f[2] == 0.0);
    p.temperature = 2.0f;
    histogram(ws, &p, z, 3, 20000, f);
    ck_assert(f[2] > 0.0);
    const double r = 1.0 / sqrt(10.0);
    ck_assert_double_eq_tol(f[2], r / (1.5 + r), 0.012);
    p.min_p = 0.4f;
    histogram(ws, &p, z, 3, 20000, f);
    ck_assert(f[2] == 0.0);
    ck_assert_double_eq_tol(f[1], 1.0 / 3, 0.012);
    /* either side of min_p within one bucket of d (1/64 wide) */
    const float y[3] = {0.0f, logf(0.2505f), logf(0.2495f)};
    p.temperature = 1.0f;
    p.min_p = 0.25f;
    histogram(ws, &p, y, 3, 2000, f);
    ck_assert(f[1] > 0.0 && f[2] == 0.0);
    p.min_p = 1.0f; /* only the maximum (and its ties) */
    histogram(ws, &p, z, 3, 1000, f);
    ck_assert(f[1] == 0.0 && f[2] == 0.0);
    cai_sample_ws_free(ws);
}
END_TEST

/* ------------------------------------------------------------------ the draw */

START_TEST(draws_follow_the_softmax) {
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, 8));
    cai_sampling_params p = cai_sampling_default();
    p.seed = 2024;
    const float z[5] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f};
    const float temps[3] = {1.0f, 0.5f, 3.0f};
    enum { N = 20000 };
    /* top_k 5 cuts nothing but takes the small-k path */
    for (int t = 0; t < 6; t++) {
        p.temperature = temps[t % 3];
        p.top_k = t < 3 ? 0 : 5;
        double f[5], q[5], chi2 = 0, worst = 0;
        histogram(ws, &p, z, 5, N, f);
        softmax(z, 5, temps[t % 3], q);
        for (int i = 0; i < 5; i++) {
            chi2 += N * (f[i] - q[i]) * (f[i] - q[i]) / q[i];
            worst = fmax(worst, fabs(f[i] - q[i]));
        }
        /* 4 degrees of freedom: P(chi2 > 23.5) = 1e-4; 0.012 is over 3.5 sigma */
        ck_assert_msg(chi2 < 23.5 && worst < 0.012, "T=%g top_k=%d: chi2 %g, max |f - p| %g", (double)p.temperature,
                      p.top_k, chi2, worst);
    }
    cai_sample_ws_free(ws);
}
END_TEST

START_TEST(a_draw_depends_on_seed_and_step_only) {
    enum { V = 50, N = 200 };
    cai_sample_ws_t *ws, *big;
    CK_CAI(cai_sample_ws_create(&ws, V));
    CK_CAI(cai_sample_ws_create(&big, 4 * V));
    float z[V];
    uint32_t s = 7;
    for (int i = 0; i < V; i++) z[i] = 0.2f * gauss(&s);
    cai_sampling_params p = cai_sampling_default();
    p.temperature = 1.0f;
    p.top_k = 30;
    p.top_p = 0.9f;
    p.seed = 42;
    int32_t seq[N], seen[V] = {0};
    int distinct = 0;
    for (int step = 0; step < N; step++) {
        seq[step] = draw1(ws, &p, z, V, NULL, 0, 0, step, NULL);
        ck_assert_int_eq(draw1(big, &p, z, V, NULL, 0, 0, step, NULL), seq[step]);
        if (!seen[seq[step]]++) distinct++;
    }
    ck_assert_int_ge(distinct, 10);
    /* again, out of order, after unrelated penalised draws on the same workspace */
    cai_sampling_params pen = p;
    pen.repetition_penalty = 1.7f;
    pen.frequency_penalty = 1.0f;
    const int32_t h[6] = {3, 4, 4, 9, 3, 1};
    for (int step = N - 1; step >= 0; step--) {
        draw1(ws, &pen, z, V, h, 2, 6, step, NULL);
        ck_assert_int_eq(draw1(ws, &p, z, V, NULL, 0, 0, step, NULL), seq[step]);
    }
    p.seed = 43;
    int differ = 0;
    for (int step = 0; step < N; step++) differ += draw1(ws, &p, z, V, NULL, 0, 0, step, NULL) != seq[step];
    ck_assert_int_ge(differ, N / 2);
    cai_sample_ws_free(ws);
    cai_sample_ws_free(big);
}
END_TEST

/* ------------------------------------------------------------------ log-probabilities */

START_TEST(logprobs_are_the_raw_log_softmax) {
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, 8));
    cai_sampling_params p = cai_sampling_default();
    const float z[5] = {-INFINITY, 2.0f, 3.0f, 0.5f, 1.0f};
    const double lse = log(exp(1.0) + exp(2.0) + exp(3.0) + exp(0.5));
    cai_sample_result r;

    draw1(ws, &p, z, 5, NULL, 0, 0, 0, &r);
    ck_assert_int_eq(r.token, 2);
    ck_assert(r.logprob == 0.0f && r.n_top == 0); /* not asked for */

    p.logprobs = 0;
    draw1(ws, &p, z, 5, NULL, 0, 0, 0, &r);
    ck_assert_double_eq_tol(r.logprob, 3.0 - lse, 1e-6);
    ck_assert_int_eq(r.n_top, 0);

    p.logprobs = 3;
    draw1(ws, &p, z, 5, NULL, 0, 0, 0, &r);
    ck_assert_int_eq(r.n_top, 3);
    const int32_t ids[3] = {2, 1, 4};
    const double raw[3] = {3.0, 2.0, 1.0};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(r.top_ids[i], ids[i]);
        ck_assert_double_eq_tol(r.top_logprobs[i], raw[i] - lse, 1e-6);
    }
    ck_assert(r.top_logprobs[0] == r.logprob);

    /* penalised away from the argmax, still reported from the raw logits */
    p.repetition_penalty = 10.0f;
    const int32_t h[1] = {2};
    draw1(ws, &p, z, 5, h, 1, 1, 0, &r);
    ck_assert_int_eq(r.token, 1);
    ck_assert_double_eq_tol(r.logprob, 2.0 - lse, 1e-6);
    ck_assert_int_eq(r.top_ids[0], 2);
    ck_assert_double_eq_tol(r.top_logprobs[0], 3.0 - lse, 1e-6);

    /* more asked for than there are unmasked tokens */
    p.repetition_penalty = 1.0f;
    p.logprobs = 5;
    draw1(ws, &p, z, 5, NULL, 0, 0, 0, &r);
    ck_assert_int_eq(r.n_top, 4);
    ck_assert_int_eq(r.top_ids[3], 3);

    /* ties: the lower id first */
    const float t[3] = {1.0f, 1.0f, 0.0f};
    p.logprobs = 2;
    draw1(ws, &p, t, 3, NULL, 0, 0, 0, &r);
    ck_assert(r.top_ids[0] == 0 && r.top_ids[1] == 1);
    ck_assert_double_eq_tol(r.top_logprobs[1], 1.0 - log(2 * exp(1.0) + 1.0), 1e-6);

    /* sampled: the raw logit's log-softmax, not the tempered one */
    p.temperature = 0.5f;
    p.logprobs = 1;
    for (int step = 0; step < 50; step++) {
        draw1(ws, &p, z, 5, NULL, 0, 0, step, &r);
        ck_assert_int_ne(r.token, 0);
        ck_assert_double_eq_tol(r.logprob, (double)z[r.token] - lse, 1e-6);
    }

    /* large logits do not overflow */
    const float g[3] = {1000.0f, 999.0f, -1000.0f};
    p.temperature = 0;
    p.logprobs = 2;
    draw1(ws, &p, g, 3, NULL, 0, 0, 0, &r);
    ck_assert_double_eq_tol(r.logprob, -log1p(exp(-1.0)), 1e-6);
    ck_assert_double_eq_tol(r.top_logprobs[1], -1.0 - log1p(exp(-1.0)), 1e-6);
    cai_sample_ws_free(ws);
}
END_TEST

/* ------------------------------------------------------------------ masks and errors */

START_TEST(masked_tokens_are_never_drawn) {
    enum { V = 8 };
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, V));
    cai_sampling_params p = cai_sampling_default();
    const float z[V] = {-INFINITY, 0.1f, -INFINITY, 0.0f, -INFINITY, -0.2f, 0.3f, -INFINITY};
    /* a masked token in the output with a negative frequency penalty stays masked */
    const int32_t h[4] = {0, 2, 2, 7};
    p.frequency_penalty = -2.0f;
    p.repetition_penalty = 0.5f;
    const float temps[3] = {0.0f, 1.0f, 50.0f};
    for (int t = 0; t < 3; t++) {
        p.temperature = temps[t];
        for (int k = 0; k <= V; k += 4) {
            p.top_k = k;
            for (int step = 0; step < 500; step++) {
                const int32_t tok = draw1(ws, &p, z, V, h, 1, 4, step, NULL);
                ck_assert_msg(isfinite(z[tok]), "T=%g top_k=%d step %d drew masked %d", (double)temps[t], k, step, tok);
            }
        }
    }
    float all[3] = {-INFINITY, -INFINITY, -INFINITY};
    cai_sample_result r;
    ck_assert_int_eq(cai_sample(ws, &p, all, 3, NULL, 0, 0, 0, &r), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "all 3 logits are -inf"));
    cai_sample_ws_free(ws);
}
END_TEST

START_TEST(nan_infinity_and_bad_history_are_refused) {
    cai_sample_ws_t *ws, *fresh;
    CK_CAI(cai_sample_ws_create(&ws, 8));
    cai_sampling_params p = cai_sampling_default();
    cai_sample_result r;
    float z[6] = {0, 1, 2, NAN, 4, 5};
    ck_assert_int_eq(cai_sample(ws, &p, z, 6, NULL, 0, 0, 0, &r), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "logits[3] is NaN"));
    p.temperature = 1.0f;
    ck_assert_int_eq(cai_sample(ws, &p, z, 6, NULL, 0, 0, 0, &r), CAI_ERR_INVALID_ARG);
    z[3] = 3;
    z[2] = INFINITY;
    ck_assert_int_eq(cai_sample(ws, &p, z, 6, NULL, 0, 0, 0, &r), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "logits[2] is +inf"));
    /* a NaN met through the history, with penalties on */
    z[2] = 2;
    z[5] = NAN;
    p.presence_penalty = 1;
    const int32_t h[4] = {1, 2, 5, 0};
    ck_assert_int_eq(cai_sample(ws, &p, z, 6, h, 1, 4, 0, &r), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "logits[5] is NaN"));
    z[5] = 5;
    const int32_t bad[3] = {1, 6, 0};
    ck_assert_int_eq(cai_sample(ws, &p, z, 6, bad, 1, 3, 0, &r), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "history[1]=6 is not a token id in [0, 6)"));
    ck_assert_int_eq(cai_sample(ws, &p, z, 6, h, 5, 4, 0, &r), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_sample(ws, &p, z, 9, NULL, 0, 0, 0, &r), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "vocab=9"));
    ck_assert_int_eq(cai_sample(ws, &p, z, 6, NULL, 0, 0, -1, &r), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_sample_ws_create(&fresh, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(fresh);

    /* the failed calls left the workspace as a fresh one */
    CK_CAI(cai_sample_ws_create(&fresh, 8));
    const float y[6] = {0.5f, 1, 2, 3, 4, 5};
    const int32_t h2[3] = {4, 5, 4};
    p.frequency_penalty = 0.7f;
    for (int step = 0; step < 100; step++) {
        cai_sample_result a, b;
        draw1(ws, &p, y, 6, h2, 1, 3, step, &a);
        draw1(fresh, &p, y, 6, h2, 1, 3, step, &b);
        ck_assert_int_eq(a.token, b.token);
    }
    cai_sample_ws_free(fresh);
    cai_sample_ws_free(ws);
}
END_TEST

/* ------------------------------------------------------------------ a naive reference at full size */

typedef struct {
    double d;
    int32_t id;
} ref_t;

static int ref_cmp(const void *a, const void *b) {
    const ref_t *x = a, *y = b;
    if (x->d != y->d) return x->d < y->d ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The definition with one full sort of d = (z_max - z) / T and libm's
 * exp: HF's top-k (ties kept), top-p over the renormalised top-k set,
 * min-p (p >= min_p p_max, i.e. d <= -log(min_p)), then the walk. */
static int32_t ref_draw(const ref_t *o, int64_t V, const cai_sampling_params *p, int64_t step) {
    int64_t n_s = V;
    if (p->top_k > 0 && p->top_k < V) {
        n_s = p->top_k;
        while (n_s < V && o[n_s].d == o[p->top_k - 1].d) n_s++;
    }
    double Z = 0;
    for (int64_t j = 0; j < n_s; j++) Z += exp(-o[j].d);
    int64_t L = n_s;
    if (p->top_p < 1) {
        double cum = 0;
        int64_t j = 0;
        while (j < n_s && cum < p->top_p * Z) cum += exp(-o[j++].d);
        L = j;
    }
    if (p->min_p > 0) {
        int64_t j = 1;
        while (j < L && o[j].d <= -log(p->min_p)) j++;
        L = j;
    }
    double total = 0, cum = 0;
    for (int64_t j = 0; j < L; j++) total += exp(-o[j].d);
    const double target = cai_rng_uniform(p->seed, cai_hash64("cai.sample"), (uint64_t)step) * total;
    for (int64_t j = 0; j < L; j++)
        if ((cum += exp(-o[j].d)) > target) return o[j].id;
    return o[L - 1].id;
}

START_TEST(full_vocabulary_matches_a_naive_reference) {
    enum { V = 128256, STEPS = 40 };
    cai_sample_ws_t *ws;
    CK_CAI(cai_sample_ws_create(&ws, V));
    float *z = malloc(V * sizeof *z), *w = malloc(V * sizeof *w);
    ref_t *o = malloc(V * sizeof *o);
    ck_assert(z && w && o);
    /* quantise 1: logits on a 0.5 grid, so that they tie often; 2: also
     * masked, the first blocks wholly and a third of the rest */
    static const struct {
        float T;
        int k;
        float top_p, min_p;
        int quantise;
    } cfg[] = {
        {0.8f, 50, 0.9f, 0.0f, 0},    {1.0f, 0, 0.95f, 0.0f, 0},    {1.3f, 0, 1.0f, 0.05f, 0},
        {0.7f, 1000, 0.9f, 0.01f, 0}, {1.0f, 0, 1.0f, 0.0f, 0},     {2.0f, 40000, 1.0f, 0.0f, 0},
        {1.0f, 50, 0.9f, 0.0f, 1},    {1.0f, 700, 0.97f, 0.0f, 1},  {0.6f, 0, 0.8f, 0.02f, 1},
        {5.0f, 64, 1.0f, 0.0f, 1},    {0.05f, 0, 1.0f, 0.0f, 0},    {1.0f, 100000, 0.99f, 0.0f, 1},
        {1.0f, 1024, 1.0f, 0.0f, 1},  {1.0f, 1025, 1.0f, 0.0f, 1},  {1.0f, 5000, 1.0f, 0.03f, 0},
        {0.9f, 3000, 0.95f, 0.0f, 2}, {1.0f, 0, 0.9f, 0.0f, 2},     {0.8f, 20, 1.0f, 0.1f, 2},
        {3.0f, 0, 1.0f, 0.0f, 2},     {0.5f, 2000, 0.7f, 0.05f, 0},
    };
    cai_sample_result r;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        /* LLM-like: a broad bulk and a few standouts; quantised logits tie often */
        uint32_t s = 1000u + (uint32_t)c;
        for (int i = 0; i < V; i++) {
            z[i] = 2.5f * gauss(&s) + ((lcg(&s) & 1023) == 0 ? 8.0f : 0.0f);
            if (cfg[c].quantise) z[i] = roundf(z[i] * 2.0f) / 2.0f;
            if (cfg[c].quantise == 2 && (i < 3000 || lcg(&s) % 3 == 0)) z[i] = -INFINITY;
        }
        cai_sampling_params p = cai_sampling_default();
        p.temperature = cfg[c].T;
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.seed = 77 + c;
        p.logprobs = 0;
        const float zmax = z[argmax(z, V)];
        for (int i = 0; i < V; i++) o[i] = (ref_t){((double)zmax - (double)z[i]) * (1.0 / p.temperature), i};
        qsort(o, V, sizeof *o, ref_cmp);
        int distinct = 0;
        int32_t prev = -1;
        for (int step = 0; step < STEPS; step++) {
            memcpy(w, z, V * sizeof *w);
            CK_CAI(cai_sample(ws, &p, w, V, NULL, 0, 0, step, &r));
            ck_assert_msg(r.token == ref_draw(o, V, &p, step), "config %zu step %d: %d, the reference %d", c, step,
                          r.token, ref_draw(o, V, &p, step));
            ck_assert(isfinite(z[r.token]));
            distinct += r.token != prev;
            prev = r.token;
        }
        ck_assert_msg(c == 10 || distinct > 1, "config %zu never varied", c);
    }
    free(z);
    free(w);
    free(o);
    cai_sample_ws_free(ws);
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("sample");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, defaults_pass_and_each_check_error_names_its_field);
    tcase_add_test(tc, copy_and_free_own_the_stop_strings);
    tcase_add_test(tc, greedy_is_the_argmax_lowest_id_on_ties_filters_ignored);
    tcase_add_test(tc, repetition_penalty_divides_positive_multiplies_negative);
    tcase_add_test(tc, frequency_and_presence_count_the_output_only);
    tcase_add_test(tc, top_k_one_is_greedy_at_any_temperature_and_seed);
    tcase_add_test(tc, top_k_keeps_every_token_tied_with_the_kth);
    tcase_add_test(tc, a_large_top_k_cuts_exactly);
    tcase_add_test(tc, top_p_keeps_the_smallest_set_reaching_p);
    tcase_add_test(tc, tiny_top_p_keeps_the_most_likely_token_alone);
    tcase_add_test(tc, min_p_is_relative_to_the_maximum_after_temperature);
    tcase_add_test(tc, draws_follow_the_softmax);
    tcase_add_test(tc, a_draw_depends_on_seed_and_step_only);
    tcase_add_test(tc, logprobs_are_the_raw_log_softmax);
    tcase_add_test(tc, masked_tokens_are_never_drawn);
    tcase_add_test(tc, nan_infinity_and_bad_history_are_refused);
    tcase_add_test(tc, full_vocabulary_matches_a_naive_reference);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
