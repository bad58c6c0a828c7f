/* A reward model's scores (cai_rl_head_score_rows) against the model's
 * logits: with the head's weight set to a row v of a tied GPT-2's token
 * embedding, h . w at a position is that position's logit of token v, which
 * a plain forward computes by another path (the LM head's matmul). Rows of
 * different lengths and an empty row check where each score is read. */
#include "cai_config.h"
#include "colossal/model.h"
#include "colossal/rl.h"

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

START_TEST(scores_are_the_head_at_each_rows_last_token) {
    enum { B = 3, T = 7, V = 50, C = 12, TOKEN = 17 };
    cai_model_config c = cai_model_config_default(CAI_MODEL_GPT2);
    c.vocab_size = V;
    c.n_layers = 2;
    c.d_model = C;
    c.n_heads = 3;
    c.n_kv_heads = 0;
    c.ffn_hidden = 0;
    c.max_seq_len = T;
    c.init_std = 0.3f;
    c.seed = 11;
    ck_assert_int_eq(c.tie_embeddings, 1);
    cai_model_options o = cai_model_options_default(&c);
    o.batch = B;
    o.seq_len = T;
    cai_model_t *m = NULL;
    OK(cai_model_create(&m, dev, &c, &o));
    /* two fixed rows (lengths 4 and 7, padded with 0) and an empty one */
    const int32_t tok[B * T] = {5, 9, 23, 41, 0, 0, 0, 3, 3, 48, 12, 30, 7, 19, 0, 0, 0, 0, 0, 0, 0};
    const int32_t last[B] = {3, 6, -1};
    cai_tensor wte;
    OK(cai_model_param(m, "wte.weight", &wte, NULL));
    ck_assert_int_eq(wte.dtype, CAI_DTYPE_F32);
    cai_rl_head_t *h = NULL;
    OK(cai_rl_head_create(&h, C, 0.0f, 0));
    float *w;
    cai_rl_head_tensors(h, &w, NULL, NULL, NULL);
    memcpy(w, (const float *)wte.data + (int64_t)TOKEN * C, C * sizeof *w);
    float scores[B] = {-1, -1, -1};
    OK(cai_rl_head_score_rows(h, m, B, T, tok, last, scores));
    /* the logits of a plain forward (no objective) of the same rows */
    OK(cai_model_set_objective(m, NULL));
    int32_t tgt[B * T];
    for (int n = 0; n < B * T; n++) tgt[n] = 1;
    OK(cai_model_forward(m, tok, tgt, NULL));
    cai_tensor logits;
    OK(cai_model_logits(m, &logits));
    ck_assert_int_eq(logits.dtype, CAI_DTYPE_F32);
    const int64_t Vp = logits.shape[logits.ndim - 1];
    ck_assert_int_ge(Vp, V);
    const float *lg = logits.data;
    for (int b = 0; b < 2; b++) {
        const double want = lg[((int64_t)b * T + last[b]) * Vp + TOKEN];
        printf("row %d: score %.9g, logit of token %d at position %d %.9g\n", b, (double)scores[b], TOKEN, last[b],
               want);
        ck_assert_msg(fabs(want) > 1e-3, "row %d: logit %g too small to tell positions apart", b, want);
        ck_assert_msg(fabs((double)scores[b] - want) <= 1e-5 * fmax(1.0, fabs(want)), "row %d: score %.9g, logit %.9g",
                      b, (double)scores[b], want);
        /* the neighbouring position's logit differs: the score is read at last[b] */
        const double prev = lg[((int64_t)b * T + last[b] - 1) * Vp + TOKEN];
        ck_assert_msg(fabs(prev - want) > 1e-4, "row %d: positions %d and %d score alike", b, last[b] - 1, last[b]);
    }
    ck_assert_float_eq(scores[2], 0.0f);
    /* a last position past the row is refused */
    const int32_t bad[B] = {3, T, -1};
    ck_assert_int_eq(cai_rl_head_score_rows(h, m, B, T, tok, bad, scores), CAI_ERR_INVALID_ARG);
    cai_error_clear();
    cai_rl_head_free(h);
    cai_model_free(m);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("rl_score");
    TCase *tc = tcase_create("score");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, scores_are_the_head_at_each_rows_last_token);
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
