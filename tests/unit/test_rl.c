/* The alignment objectives and the scalar head (colossal/rl.h): small cases
 * computed by hand, every gradient against central differences of the
 * returned loss, the invariants the algorithms rest on (DPO at the
 * reference is log 2, the surrogate at ratio 1 is -A/n per token, equal
 * rewards give no advantage, GAE with gamma = lambda = 1 is reward-to-go
 * minus value), the head's AdamW bitwise against the model optimizer's, and
 * every refused argument naming itself. */
#include "cai_config.h"
#include "colossal/model.h"
#include "colossal/ops.h"
#include "colossal/rl.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK(expr)                                                                   \
    do {                                                                           \
        cai_status st_ = (expr);                                                   \
        ck_assert_msg(st_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

#define FAILS(expr, needle)                                                                                 \
    do {                                                                                                    \
        cai_status st_ = (expr);                                                                            \
        ck_assert_msg(st_ == CAI_ERR_INVALID_ARG, "%s gave %d, expected INVALID_ARG (%s)", #expr, (int)st_, \
                      cai_error_message());                                                                 \
        ck_assert_msg(strstr(cai_error_message(), (needle)) != NULL, "%s: '%s' lacks '%s'", #expr,          \
                      cai_error_message(), (needle));                                                       \
        cai_error_clear();                                                                                  \
    } while (0)

#define NEAR(a, b, tol)                                                                                   \
    do {                                                                                                  \
        double a_ = (a), b_ = (b);                                                                        \
        ck_assert_msg(fabs(a_ - b_) <= (tol) * (1.0 + fabs(b_)), "%s = %.9g, expected %.9g", #a, a_, b_); \
    } while (0)

/* Inputs on a grid of 2^-12 and a step of 2^-10, so x +- h is exact in
 * float and the central difference sees only the loss's own curvature. */
#define FD_H (1.0 / 1024.0)
static float grid(uint64_t seed, uint64_t i, double scale) {
    return (float)(round(scale * cai_rng_normal(seed, 1, i) * 4096.0) / 4096.0);
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ------------------------------------------------------------ reward model */

START_TEST(rm_loss_by_hand_and_by_differences) {
    const float rc[2] = {1.0f, 0.0f}, rr[2] = {0.0f, 0.0f};
    float dc[2], dr[2];
    cai_rl_stats s;
    OK(cai_rl_rm_loss(2, rc, rr, dc, dr, &s));
    NEAR(s.loss, 0.5 * (log1p(exp(-1.0)) + log(2.0)), 1e-12);
    NEAR(s.accuracy, 0.5, 0);
    NEAR(s.margin, 0.5, 1e-12);
    NEAR(dc[0], -0.5 * sigm(-1.0), 1e-7);
    NEAR(dc[1], -0.25, 1e-7);
    NEAR(dr[0], 0.5 * sigm(-1.0), 1e-7);
    NEAR(dr[1], 0.25, 1e-7);

    enum { N = 6 };
    float c[N], r[N], gc[N], gr[N];
    for (int i = 0; i < N; i++) {
        c[i] = grid(11, (uint64_t)i, 2.0);
        r[i] = grid(12, (uint64_t)i, 2.0);
    }
    OK(cai_rl_rm_loss(N, c, r, gc, gr, &s));
    for (int side = 0; side < 2; side++)
        for (int i = 0; i < N; i++) {
            float *x = side ? r : c, x0 = x[i];
            cai_rl_stats sp, sm;
            x[i] = (float)(x0 + FD_H);
            OK(cai_rl_rm_loss(N, c, r, gc + 0 * N, gr + 0 * N, &sp));
            x[i] = (float)(x0 - FD_H);
            OK(cai_rl_rm_loss(N, c, r, gc, gr, &sm));
            x[i] = x0;
            OK(cai_rl_rm_loss(N, c, r, gc, gr, &s));
            NEAR((side ? gr : gc)[i], (sp.loss - sm.loss) / (2 * FD_H), 1e-5);
        }
}
END_TEST

/* -------------------------------------------------------------- DPO / SimPO */

START_TEST(dpo_at_the_reference_is_log2) {
    enum { N = 3 };
    const double pi_c[N] = {-10, -20, -3}, pi_r[N] = {-12, -5, -7};
    float dc[N], dr[N];
    cai_rl_stats s;
    for (int k = 0; k < 2; k++) {
        cai_rl_dpo_config c = cai_rl_dpo_config_default(CAI_RL_DPO);
        ck_assert_double_eq(c.beta, 0.1);
        c.label_smoothing = k ? 0.2 : 0;
        OK(cai_rl_dpo_loss(&c, N, pi_c, pi_r, pi_c, pi_r, NULL, NULL, dc, dr, &s));
        NEAR(s.loss, log(2.0), 1e-12);
        NEAR(s.margin, 0, 1e-12);
        NEAR(s.accuracy, 0, 0);
        /* dL/dh = -(1 - eps) / 2 + eps / 2 at h = 0, times beta / n. */
        for (int i = 0; i < N; i++) {
            NEAR(dc[i], (-(1 - c.label_smoothing) + c.label_smoothing) * 0.5 * 0.1 / N, 1e-7);
            NEAR(dr[i], -dc[i], 0);
        }
    }
}
END_TEST

START_TEST(dpo_and_simpo_by_hand) {
    const double pi_c = -4, pi_r = -6, ref_c = -5, ref_r = -5;
    const int64_t lc = 2, lr = 3;
    float dc, dr;
    cai_rl_stats s;
    cai_rl_dpo_config c = cai_rl_dpo_config_default(CAI_RL_DPO);
    c.beta = 0.5;
    c.label_smoothing = 0.1;
    OK(cai_rl_dpo_loss(&c, 1, &pi_c, &pi_r, &ref_c, &ref_r, NULL, NULL, &dc, &dr, &s));
    /* h = 0.5 * ((1) - (-1)) = 1 */
    NEAR(s.loss, 0.9 * log1p(exp(-1.0)) + 0.1 * log1p(exp(1.0)), 1e-12);
    NEAR(s.chosen_reward, 0.5, 1e-12);
    NEAR(s.rejected_reward, -0.5, 1e-12);
    NEAR(s.margin, 1.0, 1e-12);
    NEAR(s.accuracy, 1.0, 0);
    NEAR(dc, 0.5 * (-0.9 * sigm(-1.0) + 0.1 * sigm(1.0)), 1e-7);
    NEAR(dr, -dc, 0);

    c = cai_rl_dpo_config_default(CAI_RL_SIMPO);
    ck_assert_double_eq(c.beta, 2.0);
    ck_assert_double_eq(c.gamma, 0.5);
    OK(cai_rl_dpo_loss(&c, 1, &pi_c, &pi_r, NULL, NULL, &lc, &lr, &dc, &dr, &s));
    /* h = 2 * (-2 - (-2)) - 0.5 = -0.5 */
    NEAR(s.loss, log1p(exp(0.5)), 1e-12);
    NEAR(s.chosen_reward, -4.0, 1e-12);
    NEAR(s.rejected_reward, -4.0, 1e-12);
    NEAR(dc, -sigm(0.5) * 2.0 / 2.0, 1e-7);
    NEAR(dr, sigm(0.5) * 2.0 / 3.0, 1e-7);
}
END_TEST

START_TEST(dpo_gradients_match_differences) {
    enum { N = 5 };
    double pc[N], pr[N], rc[N], rr[N];
    int64_t lc[N], lr[N];
    for (int i = 0; i < N; i++) {
        pc[i] = -20 + 8 * cai_rng_normal(21, 0, (uint64_t)i);
        pr[i] = -20 + 8 * cai_rng_normal(21, 1, (uint64_t)i);
        rc[i] = pc[i] + 3 * cai_rng_normal(21, 2, (uint64_t)i);
        rr[i] = pr[i] + 3 * cai_rng_normal(21, 3, (uint64_t)i);
        lc[i] = 3 + i;
        lr[i] = 9 - i;
    }
    for (int k = 0; k < 4; k++) {
        cai_rl_dpo_config c = cai_rl_dpo_config_default(k < 2 ? CAI_RL_DPO : CAI_RL_SIMPO);
        c.label_smoothing = k % 2 ? 0.25 : 0;
        float gc[N], gr[N], t1[N], t2[N];
        cai_rl_stats s, sp, sm;
        OK(cai_rl_dpo_loss(&c, N, pc, pr, rc, rr, lc, lr, gc, gr, &s));
        const double h = 1e-5;
        for (int side = 0; side < 2; side++)
            for (int i = 0; i < N; i++) {
                double *x = side ? pr : pc, x0 = x[i];
                x[i] = x0 + h;
                OK(cai_rl_dpo_loss(&c, N, pc, pr, rc, rr, lc, lr, t1, t2, &sp));
                x[i] = x0 - h;
                OK(cai_rl_dpo_loss(&c, N, pc, pr, rc, rr, lc, lr, t1, t2, &sm));
                x[i] = x0;
                NEAR((side ? gr : gc)[i], (sp.loss - sm.loss) / (2 * h), 1e-6);
            }
    }
}
END_TEST

/* ------------------------------------------------------------ policy losses */

START_TEST(surrogate_at_ratio_one_is_minus_advantage_over_n) {
    enum { R = 2, T = 4 };
    const float logp[R * T] = {-1, -2, -0.5f, -3, -1.5f, -0.25f, -4, -2};
    const float adv[R] = {1.5f, -0.5f};
    const uint8_t mask[R * T] = {0, 1, 1, 1, 1, 1, 0, 0};
    float d[R * T];
    cai_rl_stats s;
    cai_rl_policy_config c = cai_rl_policy_config_default();
    ck_assert_double_eq(c.clip_low, 0.2);
    ck_assert_double_eq(c.clip_high, 0.2);
    ck_assert_int_eq(c.agg, CAI_RL_AGG_TOKEN_MEAN);
    OK(cai_rl_policy_loss(&c, R, T, logp, logp, NULL, adv, 0, mask, d, &s));
    ck_assert_int_eq(s.tokens, 5);
    NEAR(s.loss, -(3 * 1.5 - 2 * 0.5) / 5.0, 1e-12);
    NEAR(s.clip_fraction, 0, 0);
    NEAR(s.entropy_proxy, (2 + 0.5 + 3 + 1.5 + 0.25) / 5.0, 1e-12);
    for (int i = 0; i < R * T; i++) NEAR(d[i], mask[i] ? -adv[i / T] / 5.0 : 0.0, 1e-7);

    /* Sequence mean: row weights 1/(R * n_row); sum-norm: 1/(R * norm_len). */
    c.agg = CAI_RL_AGG_SEQ_MEAN;
    OK(cai_rl_policy_loss(&c, R, T, logp, logp, NULL, adv, 0, mask, d, &s));
    NEAR(s.loss, -(1.5 - 0.5) / 2.0, 1e-12);
    NEAR(d[1], -1.5 / 6.0, 1e-7);
    NEAR(d[5], 0.5 / 4.0, 1e-7);
    c.agg = CAI_RL_AGG_SUM_NORM;
    c.norm_len = 8;
    OK(cai_rl_policy_loss(&c, R, T, logp, logp, NULL, adv, 0, mask, d, &s));
    NEAR(s.loss, -(3 * 1.5 - 2 * 0.5) / 16.0, 1e-12);
    NEAR(d[3], -1.5 / 16.0, 1e-7);
    c.denominator = 20;
    OK(cai_rl_policy_loss(&c, R, T, logp, logp, NULL, adv, 0, mask, d, &s));
    NEAR(s.loss, -(3 * 1.5 - 2 * 0.5) / 20.0, 1e-12);
    NEAR(d[4], 0.5 / 20.0, 1e-7);
    ck_assert_float_eq(d[0], 0.0f);
    ck_assert_float_eq(d[6], 0.0f);
}
END_TEST

START_TEST(surrogate_clips_in_the_direction_of_the_advantage) {
    /* ratio 1.5 and 0.5, each with A > 0 and A < 0: the clipped term is taken
     * for (1.5, A > 0) and (0.5, A < 0), whose gradient is then 0. */
    enum { R = 1, T = 4 };
    const float lo[T] = {0, 0, 0, 0};
    const float lp[T] = {(float)log(1.5), (float)log(1.5), (float)log(0.5), (float)log(0.5)};
    const float adv[T] = {2, -2, 2, -2};
    const uint8_t mask[T] = {1, 1, 1, 1};
    float d[T];
    cai_rl_stats s;
    cai_rl_policy_config c = cai_rl_policy_config_default();
    OK(cai_rl_policy_loss(&c, R, T, lp, lo, NULL, adv, 1, mask, d, &s));
    const double r1 = exp((double)lp[0]), r2 = exp((double)lp[2]);
    NEAR(s.loss, (-1.2 * 2 + r1 * 2 - r2 * 2 + 0.8 * 2) / 4.0, 1e-12);
    NEAR(s.clip_fraction, 0.5, 0);
    ck_assert_float_eq(d[0], 0.0f);
    NEAR(d[1], 2 * r1 / 4.0, 1e-7);
    NEAR(d[2], -2 * r2 / 4.0, 1e-7);
    ck_assert_float_eq(d[3], 0.0f);

    /* clip-higher: 0.2 / 0.6 leaves ratio 1.5 unclipped for A > 0. */
    c.clip_high = 0.6;
    OK(cai_rl_policy_loss(&c, R, T, lp, lo, NULL, adv, 1, mask, d, &s));
    NEAR(s.clip_fraction, 0.25, 0);
    NEAR(d[0], -2 * r1 / 4.0, 1e-7);
}
END_TEST

START_TEST(empty_rows_add_nothing) {
    const float lp[4] = {-1, -2, -3, -4}, adv[2] = {1, -1};
    const uint8_t none[4] = {0, 0, 0, 0}, half[4] = {1, 1, 0, 0};
    float d[4] = {7, 7, 7, 7};
    cai_rl_policy_config c = cai_rl_policy_config_default();
    cai_rl_stats s;
    for (int agg = 0; agg < 3; agg++) {
        c.agg = (cai_rl_agg)agg;
        c.norm_len = 2;
        OK(cai_rl_policy_loss(&c, 2, 2, lp, lp, NULL, adv, 0, none, d, &s));
        NEAR(s.loss, 0, 0);
        ck_assert_int_eq(s.tokens, 0);
        for (int i = 0; i < 4; i++) ck_assert_float_eq(d[i], 0.0f);
        /* the second row is empty: it adds 0, and the sequence mean still
         * divides by R (TRL's per-row mean with the count clamped to 1) */
        OK(cai_rl_policy_loss(&c, 2, 2, lp, lp, NULL, adv, 0, half, d, &s));
        NEAR(s.loss, agg == 0 ? -1.0 : agg == 1 ? -0.5 : -0.5, 1e-12);
        ck_assert_float_eq(d[2], 0.0f);
    }
}
END_TEST

START_TEST(k3_term_by_hand) {
    const float lp = -1.0f, old = -1.0f, ref = -1.5f, adv = 0;
    const uint8_t m = 1;
    float d;
    cai_rl_stats s;
    cai_rl_policy_config c = cai_rl_policy_config_default();
    c.kl_coef = 0.04;
    OK(cai_rl_policy_loss(&c, 1, 1, &lp, &old, &ref, &adv, 0, &m, &d, &s));
    const double x = -0.5, k3 = exp(x) - x - 1;
    NEAR(s.kl, k3, 1e-12);
    NEAR(s.loss, 0.04 * k3, 1e-12);
    NEAR(d, 0.04 * (1 - exp(x)), 1e-7);
}
END_TEST

START_TEST(policy_gradients_match_differences) {
    enum { R = 3, T = 7 };
    float lp[R * T], old[R * T], ref[R * T], advt[R * T], d[R * T];
    const float advr[R] = {0.75f, -1.25f, 0.5f};
    uint8_t mask[R * T];
    const double lnlo = log(0.8), lnhi = log(1.28);
    for (int i = 0; i < R * T; i++) {
        old[i] = grid(31, (uint64_t)i, 1.0) - 2.0f;
        float dx = grid(32, (uint64_t)i, 0.3);
        /* no ratio within reach of a clip boundary: the loss is smooth there */
        while (fabs(dx - lnlo) < 8 * FD_H || fabs(dx - lnhi) < 8 * FD_H) dx += (float)(16 * FD_H);
        lp[i] = old[i] + dx;
        ref[i] = lp[i] + grid(33, (uint64_t)i, 0.4);
        advt[i] = grid(34, (uint64_t)i, 1.0);
        mask[i] = (i % T) >= 1 + (i / T) && (i % T) != 5;
    }
    for (int k = 0; k < 5; k++) {
        cai_rl_policy_config c = cai_rl_policy_config_default();
        c.clip_high = 0.28;
        c.kl_coef = k == 4 ? 0 : 0.04;
        c.agg = k == 1 ? CAI_RL_AGG_SEQ_MEAN : k == 2 ? CAI_RL_AGG_SUM_NORM : CAI_RL_AGG_TOKEN_MEAN;
        c.norm_len = T;
        c.denominator = k == 3 ? 37 : 0;
        const int per_token = k >= 3;
        const float *adv = per_token ? advt : advr;
        cai_rl_stats s, sp, sm;
        OK(cai_rl_policy_loss(&c, R, T, lp, old, ref, adv, per_token, mask, d, &s));
        ck_assert_msg(s.clip_fraction > 0 && s.clip_fraction < 1, "case %d: clip fraction %g", k, s.clip_fraction);
        float tmp[R * T];
        for (int i = 0; i < R * T; i++) {
            if (!mask[i]) {
                ck_assert_float_eq(d[i], 0.0f);
                continue;
            }
            const float x0 = lp[i];
            lp[i] = (float)(x0 + FD_H);
            OK(cai_rl_policy_loss(&c, R, T, lp, old, ref, adv, per_token, mask, tmp, &sp));
            lp[i] = (float)(x0 - FD_H);
            OK(cai_rl_policy_loss(&c, R, T, lp, old, ref, adv, per_token, mask, tmp, &sm));
            lp[i] = x0;
            NEAR(d[i], (sp.loss - sm.loss) / (2 * FD_H), 2e-6);
        }
    }
}
END_TEST

/* ---------------------------------------------------------- advantages, GAE */

START_TEST(group_advantages_by_hand) {
    const float r[8] = {0, 1, 0, 1, 3, 3, 3, 3};
    float a[8];
    uint8_t keep[2] = {9, 9};
    OK(cai_rl_group_advantages(2, 4, r, 1, 1e-4f, a, keep));
    /* mean 0.5, population std 0.5 */
    for (int i = 0; i < 4; i++) NEAR(a[i], (r[i] - 0.5) / (0.5 + (double)1e-4f), 1e-7);
    for (int i = 4; i < 8; i++) ck_assert_float_eq(a[i], 0.0f);
    ck_assert_int_eq(keep[0], 1);
    ck_assert_int_eq(keep[1], 0);
    OK(cai_rl_group_advantages(2, 4, r, 0, 1e-4f, a, NULL));
    for (int i = 0; i < 4; i++) NEAR(a[i], r[i] - 0.5, 0);
    for (int i = 4; i < 8; i++) ck_assert_float_eq(a[i], 0.0f);
    const float r3[3] = {1, 2, 6};
    OK(cai_rl_group_advantages(1, 3, r3, 1, 0, a, keep));
    const double sd = sqrt((4.0 + 1.0 + 9.0) / 3.0);
    NEAR(a[0], -2 / sd, 1e-7);
    NEAR(a[2], 3 / sd, 1e-7);
    ck_assert_int_eq(keep[0], 1);
}
END_TEST

START_TEST(gae_with_unit_discounts_is_reward_to_go_minus_value) {
    enum { R = 2, T = 6 };
    const uint8_t mask[R * T] = {0, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1};
    float rew[R * T], val[R * T], adv[R * T], ret[R * T];
    for (int i = 0; i < R * T; i++) {
        rew[i] = grid(41, (uint64_t)i, 1.0);
        val[i] = grid(42, (uint64_t)i, 1.0);
    }
    OK(cai_rl_gae(R, T, rew, val, mask, 1.0, 1.0, 0, adv, ret));
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            const int i = r * T + t;
            if (!mask[i]) {
                ck_assert_float_eq(adv[i], 0.0f);
                ck_assert_float_eq(ret[i], 0.0f);
                continue;
            }
            double togo = 0;
            for (int u = t; u < T; u++)
                if (mask[r * T + u]) togo += rew[r * T + u];
            NEAR(adv[i], togo - val[i], 1e-6);
            NEAR(ret[i], togo, 1e-6);
        }
    /* gamma 0.5, lambda 0.5 on row 0's counted positions 1, 2, 4 by hand:
     * deltas skip position 3, the last one has next value 0. */
    OK(cai_rl_gae(R, T, rew, val, mask, 0.5, 0.5, 0, adv, ret));
    const double d4 = rew[4] - val[4];
    const double d2 = rew[2] + 0.5 * val[4] - val[2];
    const double d1 = rew[1] + 0.5 * val[2] - val[1];
    const double a4 = d4, a2 = d2 + 0.25 * a4, a1 = d1 + 0.25 * a2;
    NEAR(adv[4], a4, 1e-6);
    NEAR(adv[2], a2, 1e-6);
    NEAR(adv[1], a1, 1e-6);
    NEAR(ret[1], a1 + val[1], 1e-6);
    /* whitened: mean 0 and (unbiased) std 1 over the counted tokens */
    OK(cai_rl_gae(R, T, rew, val, mask, 0.9, 0.95, 1, adv, ret));
    double s1 = 0, s2 = 0;
    int n = 0;
    for (int i = 0; i < R * T; i++)
        if (mask[i]) {
            s1 += adv[i];
            s2 += (double)adv[i] * adv[i];
            n++;
        } else {
            ck_assert_float_eq(adv[i], 0.0f);
        }
    NEAR(s1 / n, 0, 1e-6);
    NEAR((s2 - s1 * s1 / n) / (n - 1), 1, 1e-6);
}
END_TEST

START_TEST(token_rewards_by_hand) {
    enum { R = 2, T = 4 };
    const uint8_t mask[R * T] = {0, 1, 1, 0, 0, 0, 0, 0};
    const float score[R] = {2, 5};
    const float old[R * T] = {0, -1, -2, 0, 0, 0, 0, 0}, ref[R * T] = {0, -1.5f, -1, 0, 0, 0, 0, 0};
    float rw[R * T];
    OK(cai_rl_token_rewards(R, T, score, old, ref, mask, 0.1, rw));
    NEAR(rw[1], -0.1 * 0.5, 1e-7);
    NEAR(rw[2], 0.1 + 2, 1e-7);
    for (int i = 0; i < R * T; i++)
        if (i != 1 && i != 2) ck_assert_float_eq(rw[i], 0.0f);
    OK(cai_rl_token_rewards(R, T, score, NULL, NULL, mask, 0, rw));
    ck_assert_float_eq(rw[1], 0.0f);
    ck_assert_float_eq(rw[2], 2.0f);
}
END_TEST

START_TEST(value_loss_by_hand_and_by_differences) {
    /* v - v_old = 0.5 past clip 0.2: clipped prediction 0.2; ret 1:
     * (0.5 - 1)^2 = 0.25 < (0.2 - 1)^2 = 0.64, so the clipped one counts
     * and carries no gradient. Second token: inside the clip range. */
    const float v[2] = {0.5f, 0.1f}, vo[2] = {0, 0}, ret[2] = {1, -1};
    const uint8_t mask[2] = {1, 1};
    float d[2];
    cai_rl_stats s;
    OK(cai_rl_value_loss(1, 2, v, vo, ret, mask, 0.2, d, &s));
    NEAR(s.loss, 0.5 * (0.64 + 1.21) / 2, 1e-7);
    NEAR(s.value_clip_fraction, 0.5, 0);
    ck_assert_float_eq(d[0], 0.0f);
    NEAR(d[1], 1.1 / 2, 1e-7);

    enum { R = 2, T = 8 };
    float vv[R * T], vold[R * T], rr[R * T], dv[R * T], tmp[R * T];
    uint8_t m[R * T];
    for (int i = 0; i < R * T; i++) {
        vold[i] = grid(51, (uint64_t)i, 1.0);
        float dx = grid(52, (uint64_t)i, 0.3);
        while (fabs(fabs(dx) - 0.2) < 8 * FD_H) dx += (float)(16 * FD_H);
        vv[i] = vold[i] + dx;
        rr[i] = grid(53, (uint64_t)i, 1.0);
        m[i] = i % 5 != 2;
    }
    OK(cai_rl_value_loss(R, T, vv, vold, rr, m, 0.2, dv, &s));
    ck_assert(s.value_clip_fraction > 0 && s.value_clip_fraction < 1);
    for (int i = 0; i < R * T; i++) {
        cai_rl_stats sp, sm;
        const float x0 = vv[i];
        vv[i] = (float)(x0 + FD_H);
        OK(cai_rl_value_loss(R, T, vv, vold, rr, m, 0.2, tmp, &sp));
        vv[i] = (float)(x0 - FD_H);
        OK(cai_rl_value_loss(R, T, vv, vold, rr, m, 0.2, tmp, &sm));
        vv[i] = x0;
        NEAR(dv[i], (sp.loss - sm.loss) / (2 * FD_H), 2e-6);
        if (!m[i]) ck_assert_float_eq(dv[i], 0.0f);
    }
}
END_TEST

/* ------------------------------------------------------------ scalar head */

START_TEST(head_init_forward_backward) {
    cai_rl_head_t *h = NULL;
    float *w, *g, *m, *v;
    OK(cai_rl_head_create(&h, 5, 0, 1));
    ck_assert_int_eq(cai_rl_head_width(h), 5);
    cai_rl_head_tensors(h, &w, &g, &m, &v);
    for (int i = 0; i < 5; i++) {
        ck_assert_float_eq(w[i], 0.0f);
        ck_assert_float_eq(g[i], 0.0f);
        ck_assert_float_eq(m[i], 0.0f);
        ck_assert_float_eq(v[i], 0.0f);
    }
    cai_rl_head_free(h);

    enum { C = 4096 };
    cai_rl_head_t *h2 = NULL;
    OK(cai_rl_head_create(&h, C, 0.02f, 7));
    OK(cai_rl_head_create(&h2, C, 0.02f, 7));
    float *w2;
    cai_rl_head_tensors(h, &w, NULL, NULL, NULL);
    cai_rl_head_tensors(h2, &w2, NULL, NULL, NULL);
    ck_assert_int_eq(memcmp(w, w2, C * sizeof *w), 0);
    double s1 = 0, s2 = 0;
    for (int i = 0; i < C; i++) {
        s1 += w[i];
        s2 += (double)w[i] * w[i];
    }
    NEAR(s1 / C, 0, 0.0015);               /* 5 sigma of the sample mean */
    NEAR(sqrt(s2 / C), 0.02, 0.06 * 0.02); /* about 5 sigma of the sample std */
    cai_rl_head_free(h2);
    OK(cai_rl_head_create(&h2, C, 0.02f, 8));
    cai_rl_head_tensors(h2, &w2, NULL, NULL, NULL);
    ck_assert_int_ne(memcmp(w, w2, C * sizeof *w), 0);
    cai_rl_head_free(h2);
    cai_rl_head_free(h);

    OK(cai_rl_head_create(&h, 3, 0, 1));
    cai_rl_head_tensors(h, &w, &g, NULL, NULL);
    w[0] = 1;
    w[1] = -2;
    w[2] = 0.5f;
    const float hid[2 * 3] = {1, 2, 3, -1, 0, 4};
    float out[2], dh[2 * 3];
    OK(cai_rl_head_forward(h, 2, hid, out));
    ck_assert_float_eq(out[0], -1.5f);
    ck_assert_float_eq(out[1], 1.0f);
    const float dout[2] = {2, -1};
    OK(cai_rl_head_backward(h, 2, hid, dout, dh));
    const float want_dh[6] = {2, -4, 1, -1, 2, -0.5f};
    for (int i = 0; i < 6; i++) ck_assert_float_eq(dh[i], want_dh[i]);
    const float want_g[3] = {3, 4, 2};
    for (int i = 0; i < 3; i++) ck_assert_float_eq(g[i], want_g[i]);
    OK(cai_rl_head_backward(h, 2, hid, dout, dh)); /* accumulates */
    for (int i = 0; i < 3; i++) ck_assert_float_eq(g[i], 2 * want_g[i]);
    cai_rl_head_zero_grad(h);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(g[i], 0.0f);
    cai_rl_head_free(h);
}
END_TEST

START_TEST(head_adamw_steps_as_the_model_optimizer) {
    enum { C = 37 };
    cai_device_t *dev = NULL;
    OK(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    cai_rl_head_t *h = NULL;
    OK(cai_rl_head_create(&h, C, 0.5f, 3));
    float *w, *g, *m, *v;
    cai_rl_head_tensors(h, &w, &g, &m, &v);
    float rw[C], rg[C], rm[C] = {0}, rv[C] = {0};
    double dw[C], dm[C] = {0}, dv[C] = {0};
    memcpy(rw, w, sizeof rw);
    for (int i = 0; i < C; i++) dw[i] = w[i];
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    for (int step = 1; step <= 4; step++) {
        for (int i = 0; i < C; i++) g[i] = rg[i] = cai_rng_normal(9, (uint64_t)step, (uint64_t)i);
        OK(cai_rl_head_adamw(h, step, lr, b1, b2, eps, wd, gs));
        cai_adamw_params p = {
            .lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd, .step = step, .grad_scale = gs};
        cai_adamw_span sp = {rw, rg, rm, rv, NULL, C, 1};
        OK(cai_adamw_spans(dev, &sp, 1, CAI_DTYPE_F32, &p, 0));
        ck_assert_int_eq(memcmp(w, rw, sizeof rw), 0);
        ck_assert_int_eq(memcmp(m, rm, sizeof rm), 0);
        ck_assert_int_eq(memcmp(v, rv, sizeof rv), 0);
        /* and torch.optim.AdamW's formula in double */
        for (int i = 0; i < C; i++) {
            const double gi = (double)rg[i] * gs;
            dw[i] -= (double)lr * wd * dw[i];
            dm[i] = b1 * dm[i] + (1 - (double)b1) * gi;
            dv[i] = b2 * dv[i] + (1 - (double)b2) * gi * gi;
            dw[i] -= lr * (dm[i] / (1 - pow(b1, step))) / (sqrt(dv[i] / (1 - pow(b2, step))) + eps);
            NEAR(w[i], dw[i], 1e-5);
        }
    }
    cai_rl_head_free(h);
    cai_device_free(dev);
}
END_TEST

/* ------------------------------------------------------------ refusals */

START_TEST(refused_arguments_name_themselves) {
    float f[4] = {0}, d[4];
    double x[2] = {0};
    int64_t len[2] = {1, 1}, zero_len[2] = {0, 1};
    uint8_t mask[4] = {1, 1, 1, 1}, keep[2];
    cai_rl_stats s;

    FAILS(cai_rl_rm_loss(0, f, f, d, d, &s), "n_pairs=0");
    FAILS(cai_rl_rm_loss(1, NULL, f, d, d, &s), "r_chosen");
    FAILS(cai_rl_rm_loss(1, f, f, NULL, d, &s), "d_chosen");

    cai_rl_dpo_config c = cai_rl_dpo_config_default(CAI_RL_DPO);
    OK(cai_rl_dpo_config_check(&c));
    FAILS(cai_rl_dpo_config_check(NULL), "NULL");
    c.beta = 0;
    FAILS(cai_rl_dpo_config_check(&c), "beta=0 must be finite and > 0");
    c.beta = NAN;
    FAILS(cai_rl_dpo_config_check(&c), "beta");
    c = cai_rl_dpo_config_default(CAI_RL_DPO);
    c.label_smoothing = 0.5;
    FAILS(cai_rl_dpo_config_check(&c), "label_smoothing=0.5 must lie in [0, 0.5)");
    c.label_smoothing = -0.1;
    FAILS(cai_rl_dpo_config_check(&c), "label_smoothing");
    c = cai_rl_dpo_config_default(CAI_RL_DPO);
    c.kind = (cai_rl_pref_loss)7;
    FAILS(cai_rl_dpo_config_check(&c), "kind=7");
    c = cai_rl_dpo_config_default(CAI_RL_SIMPO);
    c.gamma = -1;
    FAILS(cai_rl_dpo_config_check(&c), "gamma=-1");
    c = cai_rl_dpo_config_default(CAI_RL_DPO);
    c.beta = -1;
    FAILS(cai_rl_dpo_loss(&c, 1, x, x, x, x, NULL, NULL, d, d, &s), "beta=-1");
    c.beta = 0.1;
    FAILS(cai_rl_dpo_loss(&c, 0, x, x, x, x, NULL, NULL, d, d, &s), "n_pairs=0");
    FAILS(cai_rl_dpo_loss(&c, 1, NULL, x, x, x, NULL, NULL, d, d, &s), "pi_c");
    FAILS(cai_rl_dpo_loss(&c, 1, x, x, NULL, x, NULL, NULL, d, d, &s), "ref_c");
    FAILS(cai_rl_dpo_loss(&c, 1, x, x, x, x, NULL, NULL, NULL, d, &s), "d_pi_c");
    c = cai_rl_dpo_config_default(CAI_RL_SIMPO);
    OK(cai_rl_dpo_loss(&c, 1, x, x, NULL, NULL, len, len, d, d, &s));
    FAILS(cai_rl_dpo_loss(&c, 1, x, x, NULL, NULL, NULL, len, d, d, &s), "len_c");
    FAILS(cai_rl_dpo_loss(&c, 2, x, x, NULL, NULL, zero_len, len, d, d, &s), "len_c=0");

    cai_rl_policy_config p = cai_rl_policy_config_default();
    OK(cai_rl_policy_config_check(&p));
    FAILS(cai_rl_policy_config_check(NULL), "NULL");
    p.clip_low = -0.1;
    FAILS(cai_rl_policy_config_check(&p), "clip_low=-0.1");
    p = cai_rl_policy_config_default();
    p.clip_high = INFINITY;
    FAILS(cai_rl_policy_config_check(&p), "clip_high=inf");
    p = cai_rl_policy_config_default();
    p.kl_coef = -1;
    FAILS(cai_rl_policy_config_check(&p), "kl_coef=-1 must be finite and >= 0");
    p = cai_rl_policy_config_default();
    p.agg = (cai_rl_agg)3;
    FAILS(cai_rl_policy_config_check(&p), "agg=3");
    p = cai_rl_policy_config_default();
    p.agg = CAI_RL_AGG_SUM_NORM;
    FAILS(cai_rl_policy_config_check(&p), "norm_len=0 must be finite and > 0");
    p = cai_rl_policy_config_default();
    p.denominator = -2;
    FAILS(cai_rl_policy_config_check(&p), "denominator=-2");
    p = cai_rl_policy_config_default();
    FAILS(cai_rl_policy_loss(&p, 0, 4, f, f, NULL, f, 0, mask, d, &s), "R=0");
    FAILS(cai_rl_policy_loss(&p, 1, -1, f, f, NULL, f, 0, mask, d, &s), "T=-1");
    FAILS(cai_rl_policy_loss(&p, 1, 4, NULL, f, NULL, f, 0, mask, d, &s), "logp");
    FAILS(cai_rl_policy_loss(&p, 1, 4, f, f, NULL, f, 0, NULL, d, &s), "mask");
    p.kl_coef = 0.04;
    FAILS(cai_rl_policy_loss(&p, 1, 4, f, f, NULL, f, 0, mask, d, &s), "logp_ref is NULL but kl_coef=0.04");
    p.kl_coef = -1;
    FAILS(cai_rl_policy_loss(&p, 1, 4, f, f, f, f, 0, mask, d, &s), "kl_coef=-1");

    FAILS(cai_rl_group_advantages(0, 4, f, 1, 1e-4f, d, keep), "n_groups=0");
    FAILS(cai_rl_group_advantages(1, 0, f, 1, 1e-4f, d, keep), "G=0");
    FAILS(cai_rl_group_advantages(1, 4, NULL, 1, 1e-4f, d, keep), "rewards");
    FAILS(cai_rl_group_advantages(1, 4, f, 1, -1e-4f, d, keep), "eps=");

    FAILS(cai_rl_gae(0, 4, f, f, mask, 1, 1, 0, d, d), "R=0");
    FAILS(cai_rl_gae(1, 0, f, f, mask, 1, 1, 0, d, d), "T=0");
    FAILS(cai_rl_gae(1, 4, f, NULL, mask, 1, 1, 0, d, d), "values");
    FAILS(cai_rl_gae(1, 4, f, f, mask, 1.5, 1, 0, d, d), "gamma=1.5 must lie in [0, 1]");
    FAILS(cai_rl_gae(1, 4, f, f, mask, 1, -0.1, 0, d, d), "lambda=-0.1 must lie in [0, 1]");
    FAILS(cai_rl_gae(1, 4, f, f, mask, NAN, 1, 0, d, d), "gamma=nan");

    FAILS(cai_rl_token_rewards(0, 4, f, f, f, mask, 0.1, d), "R=0");
    FAILS(cai_rl_token_rewards(1, 4, NULL, f, f, mask, 0.1, d), "score");
    FAILS(cai_rl_token_rewards(1, 4, f, f, f, mask, -0.1, d), "kl_coef=-0.1");
    FAILS(cai_rl_token_rewards(1, 4, f, NULL, f, mask, 0.1, d), "logp_old and logp_ref");

    FAILS(cai_rl_value_loss(1, 0, f, f, f, mask, 0.2, d, &s), "T=0");
    FAILS(cai_rl_value_loss(1, 4, f, NULL, f, mask, 0.2, d, &s), "values_old");
    FAILS(cai_rl_value_loss(1, 4, f, f, f, mask, -0.2, d, &s), "clip=-0.2");

    cai_rl_head_t *h = NULL;
    FAILS(cai_rl_head_create(NULL, 4, 0, 1), "out");
    FAILS(cai_rl_head_create(&h, 0, 0, 1), "C=0");
    ck_assert_ptr_null(h);
    FAILS(cai_rl_head_create(&h, 4, -1, 1), "std=-1");
    OK(cai_rl_head_create(&h, 4, 0, 1));
    FAILS(cai_rl_head_forward(h, 0, f, d), "N=0");
    FAILS(cai_rl_head_forward(h, 1, NULL, d), "hidden");
    FAILS(cai_rl_head_backward(h, 1, f, NULL, d), "dout");
    FAILS(cai_rl_head_adamw(h, 0, 1e-3f, 0.9f, 0.95f, 1e-8f, 0, 1), "step=0");
    FAILS(cai_rl_head_adamw(h, 1, -1e-3f, 0.9f, 0.95f, 1e-8f, 0, 1), "lr=");
    FAILS(cai_rl_head_adamw(h, 1, 1e-3f, 1.0f, 0.95f, 1e-8f, 0, 1), "beta1=1");
    FAILS(cai_rl_head_adamw(h, 1, 1e-3f, 0.9f, 0.95f, 0, 0, 1), "eps=0");
    FAILS(cai_rl_head_adamw(h, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, -0.1f, 1), "weight_decay=");
    FAILS(cai_rl_head_adamw(h, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0, NAN), "grad_scale=nan");
    cai_rl_head_free(h);
    cai_rl_head_free(NULL);
}
END_TEST

/* A reward model's scores (cai_rl_head_score_rows) against the model's
 * logits: with the head's weight set to a row v of a tied GPT-2's token
 * embedding, h . w at a position is that position's logit of token v, which
 * a plain forward computes by another path (the LM head's matmul). Rows of
 * different lengths and an empty row check where each score is read. */
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
    cai_device_t *dev = NULL;
    OK(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
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
    cai_device_free(dev);
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("rl");
    TCase *tc = tcase_create("objectives");
    tcase_add_test(tc, rm_loss_by_hand_and_by_differences);
    tcase_add_test(tc, dpo_at_the_reference_is_log2);
    tcase_add_test(tc, dpo_and_simpo_by_hand);
    tcase_add_test(tc, dpo_gradients_match_differences);
    tcase_add_test(tc, surrogate_at_ratio_one_is_minus_advantage_over_n);
    tcase_add_test(tc, surrogate_clips_in_the_direction_of_the_advantage);
    tcase_add_test(tc, empty_rows_add_nothing);
    tcase_add_test(tc, k3_term_by_hand);
    tcase_add_test(tc, policy_gradients_match_differences);
    tcase_add_test(tc, group_advantages_by_hand);
    tcase_add_test(tc, gae_with_unit_discounts_is_reward_to_go_minus_value);
    tcase_add_test(tc, token_rewards_by_hand);
    tcase_add_test(tc, value_loss_by_hand_and_by_differences);
    suite_add_tcase(s, tc);
    tc = tcase_create("head");
    tcase_set_timeout(tc, 60); /* the scores test runs a model */
    tcase_add_test(tc, head_init_forward_backward);
    tcase_add_test(tc, head_adamw_steps_as_the_model_optimizer);
    tcase_add_test(tc, scores_are_the_head_at_each_rows_last_token);
    suite_add_tcase(s, tc);
    tc = tcase_create("refusals");
    tcase_add_test(tc, refused_arguments_name_themselves);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
