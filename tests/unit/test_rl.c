/* The alignment objectives and the scalar head (colossal/rl.h): small
 * hand-computed cases, every gradient against central differences, the
 * invariants (DPO at the reference is log 2, the policy gradient at ratio 1
 * is -A/n, equal group rewards give nothing, GAE(1, 1) is the reward-to-go
 * minus the value), the head against plain loops and one AdamW step, and
 * every refused argument naming what it refused. */
#include "cai_config.h"
#include "colossal/rl.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OK(expr)                                                                   \
    do {                                                                           \
        cai_status st_ = (expr);                                                   \
        ck_assert_msg(st_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

#define FAILS(expr, needle)                                                                                      \
    do {                                                                                                         \
        cai_status st_ = (expr);                                                                                 \
        ck_assert_msg(st_ == CAI_ERR_INVALID_ARG, "%s gave %d, expected invalid argument (%s)", #expr, (int)st_, \
                      cai_error_message());                                                                      \
        ck_assert_msg(strstr(cai_error_message(), (needle)) != NULL, "%s: '%s' lacks '%s'", #expr,               \
                      cai_error_message(), (needle));                                                            \
        cai_error_clear();                                                                                       \
    } while (0)

#define NEAR(a, b, tol)                                                                                   \
    do {                                                                                                  \
        double a_ = (a), b_ = (b);                                                                        \
        ck_assert_msg(fabs(a_ - b_) <= (tol) * (1 + fabs(b_)), "%s = %.10g, expected %.10g", #a, a_, b_); \
    } while (0)

static double sp(double x) { return log1p(exp(-x)); } /* -log sigmoid(x) */

static uint64_t rs = 88172645463325252ull;
static double unif(void) { /* xorshift64 in [0, 1) */
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}

/* ------------------------------------------------------------ reward model */

static double rm_at(int n, const float *c, const float *r) {
    float dc[8], dr[8];
    cai_rl_stats s;
    OK(cai_rl_rm_loss(n, c, r, dc, dr, &s));
    return s.loss;
}

START_TEST(rm_hand_and_fd) {
    const float c[2] = {1, 0}, r[2] = {0, 2};
    float dc[2], dr[2];
    cai_rl_stats s;
    OK(cai_rl_rm_loss(2, c, r, dc, dr, &s));
    NEAR(s.loss, (sp(1) + sp(-2)) / 2, 1e-12);
    NEAR(s.accuracy, 0.5, 0);
    NEAR(s.margin, -0.5, 1e-12);
    NEAR(dc[0], -1 / (1 + exp(1.0)) / 2, 1e-7);
    NEAR(dr[1], 1 / (1 + exp(-2.0)) / 2, 1e-7);
    float x[6], y[6], gx[6], gy[6];
    for (int i = 0; i < 6; i++) x[i] = (float)(unif() * 4 - 2), y[i] = (float)(unif() * 4 - 2);
    OK(cai_rl_rm_loss(6, x, y, gx, gy, &s));
    for (int i = 0; i < 6; i++)
        for (int side = 0; side < 2; side++) {
            float *p = side ? y : x;
            const float keep = p[i], hp = keep + 1e-2f, hm = keep - 1e-2f;
            p[i] = hp;
            double lp = rm_at(6, x, y);
            p[i] = hm;
            double lm = rm_at(6, x, y);
            p[i] = keep;
            NEAR((side ? gy : gx)[i], (lp - lm) / ((double)hp - hm), 1e-5);
        }
}
END_TEST

/* -------------------------------------------------------------- DPO / SimPO */

START_TEST(dpo_hand) {
    cai_rl_dpo_config c = cai_rl_dpo_config_default(CAI_RL_DPO);
    ck_assert(c.beta == 0.1);
    const double pc = -10, pr = -11, rc = -12, rr = -10;
    float dc, dr;
    cai_rl_stats s;
    OK(cai_rl_dpo_loss(&c, 1, &pc, &pr, &rc, &rr, NULL, NULL, &dc, &dr, &s));
    NEAR(s.loss, sp(0.3), 1e-12);
    NEAR(s.chosen_reward, 0.2, 1e-12);
    NEAR(s.rejected_reward, -0.1, 1e-12);
    NEAR(s.margin, 0.3, 1e-12);
    NEAR(s.accuracy, 1, 0);
    NEAR(dc, -0.1 / (1 + exp(0.3)), 1e-7);
    NEAR(dr, 0.1 / (1 + exp(0.3)), 1e-7);
    /* label smoothing: -(1-e) log s(h) - e log s(-h) */
    c.label_smoothing = 0.1;
    OK(cai_rl_dpo_loss(&c, 1, &pc, &pr, &rc, &rr, NULL, NULL, &dc, &dr, &s));
    NEAR(s.loss, 0.9 * sp(0.3) + 0.1 * sp(-0.3), 1e-12);
    /* SimPO: h = beta (pi_c/len_c - pi_r/len_r) - gamma */
    cai_rl_dpo_config q = cai_rl_dpo_config_default(CAI_RL_SIMPO);
    ck_assert(q.beta == 2.0 && q.gamma == 0.5);
    const double sc = -6, sr = -8;
    const int64_t lc = 3, lr = 2;
    OK(cai_rl_dpo_loss(&q, 1, &sc, &sr, NULL, NULL, &lc, &lr, &dc, &dr, &s));
    NEAR(s.loss, sp(3.5), 1e-12);
    NEAR(s.chosen_reward, -4, 1e-12);
    NEAR(s.rejected_reward, -8, 1e-12);
    NEAR(s.margin, 4, 1e-12);
    NEAR(dc, -2.0 / 3 / (1 + exp(3.5)), 1e-7);
    NEAR(dr, 1.0 / (1 + exp(3.5)), 1e-7);
}
END_TEST

START_TEST(dpo_at_reference_is_log2) {
    double pc[4], pr[4];
    float dc[4], dr[4];
    for (int i = 0; i < 4; i++) pc[i] = -20 * unif(), pr[i] = -20 * unif();
    for (int ls = 0; ls < 2; ls++) {
        cai_rl_dpo_config c = cai_rl_dpo_config_default(CAI_RL_DPO);
        c.label_smoothing = ls ? 0.2 : 0;
        cai_rl_stats s;
        OK(cai_rl_dpo_loss(&c, 4, pc, pr, pc, pr, NULL, NULL, dc, dr, &s));
        NEAR(s.loss, log(2.0), 1e-12);
        NEAR(s.margin, 0, 1e-12);
        NEAR(s.accuracy, 0, 0);
        for (int i = 0; i < 4; i++) {
            NEAR(dc[i], -0.1 * (0.5 - c.label_smoothing) / 4, 1e-7);
            NEAR(dr[i], -dc[i], 1e-9);
        }
    }
}
END_TEST

static double dpo_at(const cai_rl_dpo_config *c, int n, const double *pc, const double *pr, const double *rc,
                     const double *rr, const int64_t *lc, const int64_t *lr) {
    float dc[8], dr[8];
    cai_rl_stats s;
    OK(cai_rl_dpo_loss(c, n, pc, pr, rc, rr, lc, lr, dc, dr, &s));
    return s.loss;
}

START_TEST(dpo_fd) {
    enum { n = 6 };
    double pc[n], pr[n], rc[n], rr[n];
    int64_t lc[n], lr[n];
    for (int i = 0; i < n; i++) {
        pc[i] = -30 * unif(), pr[i] = -30 * unif(), rc[i] = pc[i] + 4 * unif() - 2, rr[i] = pr[i] + 4 * unif() - 2;
        lc[i] = 1 + (int64_t)(20 * unif()), lr[i] = 1 + (int64_t)(20 * unif());
    }
    for (int k = 0; k < 3; k++) {
        cai_rl_dpo_config c = cai_rl_dpo_config_default(k == 2 ? CAI_RL_SIMPO : CAI_RL_DPO);
        c.label_smoothing = k == 1 ? 0.15 : 0;
        float dc[n], dr[n];
        cai_rl_stats s;
        OK(cai_rl_dpo_loss(&c, n, pc, pr, rc, rr, lc, lr, dc, dr, &s));
        for (int i = 0; i < n; i++)
            for (int side = 0; side < 2; side++) {
                double *p = side ? pr : pc, keep = p[i], h = 1e-4;
                p[i] = keep + h;
                double lp = dpo_at(&c, n, pc, pr, rc, rr, lc, lr);
                p[i] = keep - h;
                double lm = dpo_at(&c, n, pc, pr, rc, rr, lc, lr);
                p[i] = keep;
                NEAR((side ? dr : dc)[i], (lp - lm) / (2 * h), 1e-5);
            }
    }
}
END_TEST

/* ------------------------------------------------------------ policy losses */

START_TEST(policy_hand) {
    /* ratios 1.5 (A = 1: clipped to 1.2), 0.5 (A = 1: min keeps 0.5), 1.5
     * (A = -1: min keeps -1.5); one masked position */
    const float lp[4] = {logf(1.5f), logf(0.5f), logf(1.5f), 9}, old[4] = {0, 0, 0, 0};
    const float adv[4] = {1, 1, -1, 5};
    const uint8_t mask[4] = {1, 1, 1, 0};
    float d[4];
    cai_rl_policy_config c = cai_rl_policy_config_default();
    cai_rl_stats s;
    OK(cai_rl_policy_loss(&c, 1, 4, lp, old, NULL, adv, 1, mask, d, &s));
    NEAR(s.loss, (-1.2 - 0.5 + 1.5) / 3, 1e-7);
    NEAR(s.clip_fraction, 1.0 / 3, 1e-12);
    NEAR(s.kl, 0, 0);
    ck_assert_int_eq(s.tokens, 3);
    NEAR(s.entropy_proxy, -(log(1.5) * 2 + log(0.5)) / 3, 1e-7);
    NEAR(d[0], 0, 0);
    NEAR(d[1], -0.5 / 3, 1e-7);
    NEAR(d[2], 1.5 / 3, 1e-7);
    NEAR(d[3], 0, 0);
    /* clip-higher lets ratio 1.5 through under clip_high 0.6 */
    c.clip_high = 0.6;
    OK(cai_rl_policy_loss(&c, 1, 4, lp, old, NULL, adv, 1, mask, d, &s));
    NEAR(d[0], -1.5 / 3, 1e-7);
    NEAR(s.clip_fraction, 0, 0);
    /* k3 at ref = logp + 0.5: exp(0.5) - 0.5 - 1 */
    const float ref[4] = {lp[0] + 0.5f, lp[1] + 0.5f, lp[2] + 0.5f, 0};
    OK(cai_rl_policy_loss(&c, 1, 4, lp, old, ref, adv, 1, mask, d, &s));
    NEAR(s.kl, exp(0.5) - 1.5, 1e-6);
}
END_TEST

START_TEST(policy_ratio_one) {
    enum { R = 3, T = 5 };
    float lp[R * T], adv[R], d[R * T];
    uint8_t mask[R * T];
    int n = 0;
    for (int i = 0; i < R * T; i++) lp[i] = (float)(-3 * unif()), mask[i] = i % 4 != 0, n += mask[i];
    for (int r = 0; r < R; r++) adv[r] = (float)(2 * unif() - 1);
    cai_rl_policy_config c = cai_rl_policy_config_default();
    cai_rl_stats s;
    OK(cai_rl_policy_loss(&c, R, T, lp, lp, lp, adv, 0, mask, d, &s));
    double want = 0;
    for (int i = 0; i < R * T; i++) {
        NEAR(d[i], mask[i] ? -adv[i / T] / n : 0, 1e-7);
        want -= mask[i] ? adv[i / T] : 0;
    }
    NEAR(s.loss, want / n, 1e-7);
    NEAR(s.kl, 0, 1e-12);
    NEAR(s.clip_fraction, 0, 0);
    ck_assert_int_eq(s.tokens, n);
}
END_TEST

START_TEST(policy_empty) {
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
        for (int i = 0; i < 4; i++) NEAR(d[i], 0, 0);
        /* the second row is empty: it adds 0 */
        OK(cai_rl_policy_loss(&c, 2, 2, lp, lp, NULL, adv, 0, half, d, &s));
        const double want = agg == 0 ? -1 : agg == 1 ? -0.5 : -2.0 / 4;
        NEAR(s.loss, want, 1e-7);
        NEAR(d[2], 0, 0);
    }
    c.agg = CAI_RL_AGG_TOKEN_MEAN;
    c.denominator = 8;
    OK(cai_rl_policy_loss(&c, 2, 2, lp, lp, NULL, adv, 0, half, d, &s));
    NEAR(s.loss, -2.0 / 8, 1e-7);
    NEAR(d[0], -1.0 / 8, 1e-7);
}
END_TEST

static double policy_at(const cai_rl_policy_config *c, int R, int T, const float *lp, const float *old,
                        const float *ref, const float *adv, int per_tok, const uint8_t *mask) {
    float d[64];
    cai_rl_stats s;
    OK(cai_rl_policy_loss(c, R, T, lp, old, ref, adv, per_tok, mask, d, &s));
    return s.loss;
}

START_TEST(policy_fd) {
    enum { R = 4, T = 6 };
    float lp[R * T], old[R * T], ref[R * T], adv[R * T], d[R * T];
    uint8_t mask[R * T];
    for (int i = 0; i < R * T; i++) {
        lp[i] = (float)(-4 * unif());
        ref[i] = lp[i] + (float)(unif() - 0.5);
        /* ratios away from the clip boundaries, where the loss has a kink */
        double lr;
        do lr = 1.2 * unif() - 0.6;
        while (fabs(exp(lr) - 0.8) < 0.02 || fabs(exp(lr) - 1.2) < 0.02 || fabs(exp(lr) - 1.28) < 0.02);
        old[i] = lp[i] - (float)lr;
        adv[i] = (float)(2 * unif() - 1);
        mask[i] = (i % T) >= (i / T) && !(i / T == 3); /* ragged, the last row empty */
    }
    for (int k = 0; k < 5; k++) {
        cai_rl_policy_config c = cai_rl_policy_config_default();
        c.kl_coef = 0.04;
        c.clip_high = k == 1 ? 0.28 : 0.2;
        c.agg = k < 3 ? (cai_rl_agg)k : CAI_RL_AGG_TOKEN_MEAN;
        c.norm_len = T;
        c.denominator = k == 4 ? 37 : 0;
        const int per_tok = k == 3;
        cai_rl_stats s;
        OK(cai_rl_policy_loss(&c, R, T, lp, old, ref, adv, per_tok, mask, d, &s));
        ck_assert_msg(s.clip_fraction > 0 && s.clip_fraction < 1, "k=%d clip fraction %g", k, s.clip_fraction);
        for (int i = 0; i < R * T; i++) {
            const float keep = lp[i], hp = keep + 1e-3f, hm = keep - 1e-3f;
            lp[i] = hp;
            double a = policy_at(&c, R, T, lp, old, ref, adv, per_tok, mask);
            lp[i] = hm;
            double b = policy_at(&c, R, T, lp, old, ref, adv, per_tok, mask);
            lp[i] = keep;
            NEAR(d[i], (a - b) / ((double)hp - hm), 2e-5);
        }
    }
}
END_TEST

/* ---------------------------------------------------------- advantages, GAE */

START_TEST(group_adv) {
    const float r[8] = {1, 2, 3, 4, 5, 5, 5, 5};
    float a[8];
    uint8_t keep[2] = {9, 9};
    OK(cai_rl_group_advantages(2, 4, r, 1, 0.0f, a, keep));
    const double sd = sqrt(1.25);
    NEAR(a[0], -1.5 / sd, 1e-6);
    NEAR(a[3], 1.5 / sd, 1e-6);
    for (int i = 4; i < 8; i++) NEAR(a[i], 0, 0);
    ck_assert_int_eq(keep[0], 1);
    ck_assert_int_eq(keep[1], 0);
    OK(cai_rl_group_advantages(2, 4, r, 0, 1e-4f, a, NULL));
    NEAR(a[1], -0.5, 1e-7);
    NEAR(a[2], 0.5, 1e-7);
    OK(cai_rl_group_advantages(2, 4, r, 1, 0.5f, a, keep));
    NEAR(a[0], -1.5 / (sd + 0.5), 1e-6);
}
END_TEST

START_TEST(gae) {
    enum { R = 2, T = 6 };
    float rw[R * T], v[R * T], a[R * T], ret[R * T];
    const uint8_t mask[R * T] = {0, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1};
    for (int i = 0; i < R * T; i++) rw[i] = (float)(unif() - 0.5), v[i] = (float)unif();
    OK(cai_rl_gae(R, T, rw, v, mask, 1.0, 1.0, 0, a, ret));
    for (int r = 0; r < R; r++) {
        double togo = 0;
        for (int t = T - 1; t >= 0; t--) {
            const int i = r * T + t;
            if (!mask[i]) {
                NEAR(a[i], 0, 0);
                NEAR(ret[i], 0, 0);
                continue;
            }
            togo += rw[i];
            NEAR(a[i], togo - v[i], 1e-6);
            NEAR(ret[i], togo, 1e-6);
        }
    }
    /* gamma 0.9, lambda 0.95 on row 0's counted positions 1, 2, 4 */
    OK(cai_rl_gae(R, T, rw, v, mask, 0.9, 0.95, 0, a, ret));
    const double d4 = rw[4] - v[4], d2 = rw[2] + 0.9 * v[4] - v[2], d1 = rw[1] + 0.9 * v[2] - v[1];
    const double a4 = d4, a2 = d2 + 0.855 * a4, a1 = d1 + 0.855 * a2;
    NEAR(a[4], a4, 1e-6);
    NEAR(a[2], a2, 1e-6);
    NEAR(a[1], a1, 1e-6);
    NEAR(ret[1], a1 + v[1], 1e-6);
    OK(cai_rl_gae(R, T, rw, v, mask, 0.9, 0.95, 1, a, ret));
    double m = 0, ss = 0;
    int n = 0;
    for (int i = 0; i < R * T; i++)
        if (mask[i]) m += a[i], n++;
    m /= n;
    for (int i = 0; i < R * T; i++)
        if (mask[i]) ss += (a[i] - m) * (a[i] - m);
    NEAR(m, 0, 1e-6);
    NEAR(sqrt(ss / (n - 1)), 1, 1e-5);
    NEAR(ret[1], a1 + v[1], 1e-6); /* returns come from the raw advantages */
}
END_TEST

START_TEST(token_rewards) {
    const float score[2] = {2, -1}, old[6] = {-1, -2, -3, -1, -1, -1}, ref[6] = {-1.5f, -2, -2, -1, -1, -1};
    const uint8_t mask[6] = {1, 1, 0, 0, 0, 0};
    float rw[6];
    OK(cai_rl_token_rewards(2, 3, score, old, ref, mask, 0.1, rw));
    NEAR(rw[0], -0.05, 1e-7);
    NEAR(rw[1], 2, 1e-7);
    for (int i = 2; i < 6; i++) NEAR(rw[i], 0, 0); /* an empty row drops its score */
    OK(cai_rl_token_rewards(2, 3, score, NULL, NULL, mask, 0, rw));
    NEAR(rw[0], 0, 0);
    NEAR(rw[1], 2, 0);
}
END_TEST

static double value_at(int R, int T, const float *v, const float *vo, const float *ret, const uint8_t *m, double clip) {
    float d[64];
    cai_rl_stats s;
    OK(cai_rl_value_loss(R, T, v, vo, ret, m, clip, d, &s));
    return s.loss;
}

START_TEST(value_loss) {
    /* v - v_old = 0.5 clipped to 0.2: (0.2 - 1)^2 > (0.5 - 1)^2 takes the clipped term */
    const float v[3] = {0.5f, 0.1f, 3}, vo[3] = {0, 0, 0}, ret[3] = {1, 0.3f, 0};
    const uint8_t mask[3] = {1, 1, 0};
    float d[3];
    cai_rl_stats s;
    OK(cai_rl_value_loss(1, 3, v, vo, ret, mask, 0.2, d, &s));
    NEAR(s.loss, 0.5 * (0.64 + 0.04) / 2, 1e-6);
    NEAR(s.value_clip_fraction, 0.5, 0);
    ck_assert_int_eq(s.tokens, 2);
    NEAR(d[0], 0, 0);
    NEAR(d[1], (0.1 - 0.3) / 2, 1e-6);
    NEAR(d[2], 0, 0);
    enum { R = 3, T = 5 };
    float x[R * T], xo[R * T], rt[R * T], g[R * T];
    uint8_t m[R * T];
    for (int i = 0; i < R * T; i++) {
        xo[i] = (float)unif();
        double dv;
        do dv = unif() - 0.5;
        while (fabs(fabs(dv) - 0.2) < 0.01);
        x[i] = xo[i] + (float)dv;
        rt[i] = (float)(2 * unif() - 0.5);
        m[i] = i % 3 != 1;
    }
    OK(cai_rl_value_loss(R, T, x, xo, rt, m, 0.2, g, &s));
    ck_assert(s.value_clip_fraction > 0 && s.value_clip_fraction < 1);
    for (int i = 0; i < R * T; i++) {
        const float keep = x[i], hp = keep + 1e-3f, hm = keep - 1e-3f;
        x[i] = hp;
        double a = value_at(R, T, x, xo, rt, m, 0.2);
        x[i] = hm;
        double b = value_at(R, T, x, xo, rt, m, 0.2);
        x[i] = keep;
        NEAR(g[i], (a - b) / ((double)hp - hm), 2e-5);
    }
}
END_TEST

/* ------------------------------------------------------------ scalar head */

START_TEST(head) {
    enum { C = 5, N = 3 };
    cai_rl_head_t *h = NULL;
    OK(cai_rl_head_create(&h, C, 0.02f, 11));
    ck_assert_int_eq(cai_rl_head_width(h), C);
    float *w, *g, *m, *v;
    cai_rl_head_tensors(h, &w, &g, &m, &v);
    double sq = 0;
    for (int c = 0; c < C; c++) {
        NEAR(w[c], 0.02f * cai_rng_normal(11, 0, (uint64_t)c), 1e-9);
        NEAR(g[c] + m[c] + v[c], 0, 0);
        sq += w[c] * w[c];
    }
    ck_assert(sq > 0);
    float x[N * C], out[N], dout[N] = {0.5f, -1, 2}, dx[N * C];
    for (int i = 0; i < N * C; i++) x[i] = (float)(unif() - 0.5);
    OK(cai_rl_head_forward(h, N, x, out));
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int c = 0; c < C; c++) s += x[n * C + c] * w[c];
        NEAR(out[n], s, 1e-6);
    }
    OK(cai_rl_head_backward(h, N, x, dout, dx));
    OK(cai_rl_head_backward(h, N, x, dout, dx)); /* the weight gradient accumulates */
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int n = 0; n < N; n++) s += dout[n] * x[n * C + c];
        NEAR(g[c], 2 * s, 1e-6);
        for (int n = 0; n < N; n++) NEAR(dx[n * C + c], dout[n] * w[c], 1e-7);
    }
    /* one AdamW step: m = (1-b1) g', v = (1-b2) g'^2, w' = w (1 - lr wd)
     * - lr m/(1-b1) / (sqrt(v/(1-b2)) + eps), g' = 0.5 g */
    float w0[C], g0[C];
    memcpy(w0, w, sizeof w0);
    memcpy(g0, g, sizeof g0);
    OK(cai_rl_head_adamw(h, 1, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f));
    for (int c = 0; c < C; c++) {
        const double gs = 0.5 * g0[c], mm = 0.1 * gs, vv = 0.05 * gs * gs;
        NEAR(m[c], mm, 1e-6);
        NEAR(v[c], vv, 1e-6);
        const double want = w0[c] * (1 - 1e-3) - 1e-2 * (mm / 0.1) / (sqrt(vv / 0.05) + 1e-8);
        NEAR(w[c], want, 1e-6);
    }
    cai_rl_head_zero_grad(h);
    for (int c = 0; c < C; c++) NEAR(g[c], 0, 0);
    cai_rl_head_free(h);
    OK(cai_rl_head_create(&h, 3, 0, 1));
    cai_rl_head_tensors(h, &w, NULL, NULL, NULL);
    for (int c = 0; c < 3; c++) NEAR(w[c], 0, 0);
    cai_rl_head_free(h);
}
END_TEST

/* ------------------------------------------------------------ refusals */

START_TEST(refusals) {
    float f[8] = {0}, d[8], e[8];
    double x[2] = {0}, y[2] = {0};
    int64_t len[2] = {1, 0};
    uint8_t mk[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    cai_rl_stats s;
    FAILS(cai_rl_rm_loss(0, f, f, d, e, &s), "n_pairs=0");
    FAILS(cai_rl_rm_loss(2, NULL, f, d, e, &s), "r_chosen");
    FAILS(cai_rl_rm_loss(2, f, f, d, NULL, &s), "d_chosen");

    cai_rl_dpo_config c = cai_rl_dpo_config_default(CAI_RL_DPO);
    c.beta = 0;
    FAILS(cai_rl_dpo_config_check(&c), "beta=0 must be finite and > 0");
    c = cai_rl_dpo_config_default(CAI_RL_DPO);
    c.label_smoothing = 0.5;
    FAILS(cai_rl_dpo_config_check(&c), "label_smoothing=0.5 must lie in [0, 0.5)");
    c.label_smoothing = -0.1;
    FAILS(cai_rl_dpo_loss(&c, 1, x, y, x, y, NULL, NULL, d, e, &s), "label_smoothing");
    c = cai_rl_dpo_config_default(CAI_RL_SIMPO);
    c.gamma = -1;
    FAILS(cai_rl_dpo_config_check(&c), "gamma=-1");
    c.gamma = 0.5;
    c.kind = (cai_rl_pref_loss)7;
    FAILS(cai_rl_dpo_config_check(&c), "kind=7");
    FAILS(cai_rl_dpo_config_check(NULL), "NULL config");
    c = cai_rl_dpo_config_default(CAI_RL_DPO);
    FAILS(cai_rl_dpo_loss(&c, 0, x, y, x, y, NULL, NULL, d, e, &s), "n_pairs=0");
    FAILS(cai_rl_dpo_loss(&c, 1, NULL, y, x, y, NULL, NULL, d, e, &s), "pi_c");
    FAILS(cai_rl_dpo_loss(&c, 1, x, y, NULL, y, NULL, NULL, d, e, &s), "ref_c");
    FAILS(cai_rl_dpo_loss(&c, 1, x, y, x, y, NULL, NULL, NULL, e, &s), "d_pi_c");
    c = cai_rl_dpo_config_default(CAI_RL_SIMPO);
    FAILS(cai_rl_dpo_loss(&c, 1, x, y, NULL, NULL, NULL, len, d, e, &s), "len_c");
    FAILS(cai_rl_dpo_loss(&c, 1, x, y, NULL, NULL, len + 1, len, d, e, &s), "len_c=0");

    cai_rl_policy_config p = cai_rl_policy_config_default();
    p.clip_low = -0.1;
    FAILS(cai_rl_policy_config_check(&p), "clip_low=-0.1");
    p = cai_rl_policy_config_default();
    p.clip_high = NAN;
    FAILS(cai_rl_policy_config_check(&p), "clip_high=nan");
    p = cai_rl_policy_config_default();
    p.kl_coef = -1;
    FAILS(cai_rl_policy_config_check(&p), "kl_coef=-1");
    p = cai_rl_policy_config_default();
    p.agg = (cai_rl_agg)3;
    FAILS(cai_rl_policy_config_check(&p), "agg=3");
    p.agg = CAI_RL_AGG_SUM_NORM;
    FAILS(cai_rl_policy_config_check(&p), "norm_len=0");
    p = cai_rl_policy_config_default();
    p.denominator = -2;
    FAILS(cai_rl_policy_config_check(&p), "denominator=-2");
    FAILS(cai_rl_policy_config_check(NULL), "NULL config");
    p = cai_rl_policy_config_default();
    FAILS(cai_rl_policy_loss(&p, 0, 2, f, f, f, f, 0, mk, d, &s), "R=0");
    FAILS(cai_rl_policy_loss(&p, 2, -1, f, f, f, f, 0, mk, d, &s), "T=-1");
    FAILS(cai_rl_policy_loss(&p, 2, 2, f, NULL, f, f, 0, mk, d, &s), "logp_old");
    FAILS(cai_rl_policy_loss(&p, 2, 2, f, f, f, f, 0, NULL, d, &s), "mask");
    FAILS(cai_rl_policy_loss(&p, 2, 2, f, f, f, f, 0, mk, NULL, &s), "dlogp");
    p.kl_coef = 0.1;
    FAILS(cai_rl_policy_loss(&p, 2, 2, f, f, NULL, f, 0, mk, d, &s), "logp_ref is NULL but kl_coef=0.1");

    uint8_t keep[2];
    FAILS(cai_rl_group_advantages(0, 4, f, 1, 0, d, keep), "n_groups=0");
    FAILS(cai_rl_group_advantages(2, 0, f, 1, 0, d, keep), "G=0");
    FAILS(cai_rl_group_advantages(2, 4, NULL, 1, 0, d, keep), "rewards");
    FAILS(cai_rl_group_advantages(2, 4, f, 1, -1, d, keep), "eps=-1");

    FAILS(cai_rl_gae(0, 2, f, f, mk, 1, 1, 0, d, e), "R=0");
    FAILS(cai_rl_gae(2, 2, f, NULL, mk, 1, 1, 0, d, e), "values");
    FAILS(cai_rl_gae(2, 2, f, f, mk, 1.5, 1, 0, d, e), "gamma=1.5 must lie in [0, 1]");
    FAILS(cai_rl_gae(2, 2, f, f, mk, 1, -0.5, 0, d, e), "lambda=-0.5 must lie in [0, 1]");

    FAILS(cai_rl_token_rewards(2, 0, f, f, f, mk, 0.1, d), "T=0");
    FAILS(cai_rl_token_rewards(2, 2, NULL, f, f, mk, 0.1, d), "score");
    FAILS(cai_rl_token_rewards(2, 2, f, f, f, mk, -0.1, d), "kl_coef=-0.1");
    FAILS(cai_rl_token_rewards(2, 2, f, f, NULL, mk, 0.1, d), "logp_ref must not be NULL");

    FAILS(cai_rl_value_loss(2, 0, f, f, f, mk, 0.2, d, &s), "T=0");
    FAILS(cai_rl_value_loss(2, 2, f, f, NULL, mk, 0.2, d, &s), "returns");
    FAILS(cai_rl_value_loss(2, 2, f, f, f, mk, -0.2, d, &s), "clip=-0.2");

    cai_rl_head_t *h = NULL;
    FAILS(cai_rl_head_create(&h, 0, 0.1f, 1), "C=0");
    FAILS(cai_rl_head_create(&h, 4, -1, 1), "std=-1");
    FAILS(cai_rl_head_create(NULL, 4, 0.1f, 1), "NULL out");
    OK(cai_rl_head_create(&h, 4, 0.1f, 1));
    FAILS(cai_rl_head_forward(h, 0, f, d), "N=0");
    FAILS(cai_rl_head_forward(h, 1, NULL, d), "hidden");
    FAILS(cai_rl_head_backward(h, 1, f, NULL, d), "dout");
    FAILS(cai_rl_head_adamw(h, 0, 1e-3f, 0.9f, 0.95f, 1e-8f, 0, 1), "step=0");
    FAILS(cai_rl_head_adamw(h, 1, -1e-3f, 0.9f, 0.95f, 1e-8f, 0, 1), "lr=-0.001");
    FAILS(cai_rl_head_adamw(h, 1, 1e-3f, 1, 0.95f, 1e-8f, 0, 1), "beta1=1");
    FAILS(cai_rl_head_adamw(h, 1, 1e-3f, 0.9f, 0.95f, 0, 0, 1), "eps=0");
    FAILS(cai_rl_head_adamw(h, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, -1, 1), "weight_decay=-1");
    FAILS(cai_rl_head_adamw(h, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0, INFINITY), "grad_scale=inf");
    cai_rl_head_free(h);
}
END_TEST

int main(void) {
    Suite *s = suite_create("rl");
    TCase *tc = tcase_create("objectives");
    tcase_add_test(tc, rm_hand_and_fd);
    tcase_add_test(tc, dpo_hand);
    tcase_add_test(tc, dpo_at_reference_is_log2);
    tcase_add_test(tc, dpo_fd);
    tcase_add_test(tc, policy_hand);
    tcase_add_test(tc, policy_ratio_one);
    tcase_add_test(tc, policy_empty);
    tcase_add_test(tc, policy_fd);
    tcase_add_test(tc, group_adv);
    tcase_add_test(tc, gae);
    tcase_add_test(tc, token_rewards);
    tcase_add_test(tc, value_loss);
    tcase_add_test(tc, head);
    tcase_add_test(tc, refusals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
