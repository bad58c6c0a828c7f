/* The alignment objectives (colossal/rl.h): reward model, DPO/SimPO, the
 * clipped policy loss, group advantages, GAE, token rewards and the value
 * loss. Everything is computed in double from the float inputs so that a
 * float64 reference sees the same numbers up to the final rounding. */
#include "cai_config.h"
#include "colossal/rl.h"

#include <math.h>
#include <string.h>

/* -log sigmoid(x) without overflow for large |x|. */
static double softplus_neg(double x) { return (x < 0 ? -x : 0.0) + log1p(exp(-fabs(x))); }

static double sigmoid(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

static void stats_clear(cai_rl_stats *s) {
    if (s) memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------ reward model */

cai_status cai_rl_rm_loss(int n_pairs, const float *r_chosen, const float *r_rejected, float *d_chosen,
                          float *d_rejected, cai_rl_stats *stats) {
    CAI_CHECK_ARG(n_pairs > 0, "cai_rl_rm_loss: n_pairs=%d must be > 0", n_pairs);
    CAI_CHECK_ARG(r_chosen && r_rejected, "cai_rl_rm_loss: r_chosen and r_rejected must not be NULL");
    CAI_CHECK_ARG(d_chosen && d_rejected, "cai_rl_rm_loss: d_chosen and d_rejected must not be NULL");
    double loss = 0, acc = 0, margin = 0;
    const double inv = 1.0 / n_pairs;
    for (int i = 0; i < n_pairs; i++) {
        const double d = (double)r_chosen[i] - (double)r_rejected[i];
        loss += softplus_neg(d);
        acc += d > 0;
        margin += d;
        const double g = -sigmoid(-d) * inv;
        d_chosen[i] = (float)g;
        d_rejected[i] = (float)-g;
    }
    stats_clear(stats);
    if (stats) {
        stats->loss = loss * inv;
        stats->accuracy = acc * inv;
        stats->margin = margin * inv;
    }
    return CAI_OK;
}

/* -------------------------------------------------------------- DPO / SimPO */

cai_rl_dpo_config cai_rl_dpo_config_default(cai_rl_pref_loss kind) {
    cai_rl_dpo_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.beta = kind == CAI_RL_SIMPO ? 2.0 : 0.1;
    c.label_smoothing = 0.0;
    c.gamma = 0.5;
    return c;
}

cai_status cai_rl_dpo_config_check(const cai_rl_dpo_config *c) {
    CAI_CHECK_ARG(c, "cai_rl_dpo_config_check: NULL config");
    if (c->kind != CAI_RL_DPO && c->kind != CAI_RL_SIMPO)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "dpo kind=%d is not a preference loss (0 dpo, 1 simpo)", (int)c->kind);
    if (!(c->beta > 0) || !isfinite(c->beta))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "dpo beta=%g must be finite and > 0", c->beta);
    if (!(c->label_smoothing >= 0 && c->label_smoothing < 0.5))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "dpo label_smoothing=%g must lie in [0, 0.5)", c->label_smoothing);
    if (!(c->gamma >= 0) || !isfinite(c->gamma))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "simpo gamma=%g must be finite and >= 0", c->gamma);
    return CAI_OK;
}

cai_status cai_rl_dpo_loss(const cai_rl_dpo_config *c, int n_pairs, const double *pi_c, const double *pi_r,
                           const double *ref_c, const double *ref_r, const int64_t *len_c, const int64_t *len_r,
                           float *d_pi_c, float *d_pi_r, cai_rl_stats *stats) {
    CAI_CALL(cai_rl_dpo_config_check(c));
    CAI_CHECK_ARG(n_pairs > 0, "cai_rl_dpo_loss: n_pairs=%d must be > 0", n_pairs);
    CAI_CHECK_ARG(pi_c && pi_r, "cai_rl_dpo_loss: pi_c and pi_r must not be NULL");
    CAI_CHECK_ARG(d_pi_c && d_pi_r, "cai_rl_dpo_loss: d_pi_c and d_pi_r must not be NULL");
    const int simpo = c->kind == CAI_RL_SIMPO;
    if (simpo) {
        CAI_CHECK_ARG(len_c && len_r, "cai_rl_dpo_loss: simpo needs len_c and len_r (NULL given)");
        for (int i = 0; i < n_pairs; i++)
            CAI_CHECK_ARG(len_c[i] > 0 && len_r[i] > 0,
                          "cai_rl_dpo_loss: pair %d: len_c=%lld, len_r=%lld must be > 0 for simpo", i,
                          (long long)len_c[i], (long long)len_r[i]);
    } else {
        CAI_CHECK_ARG(ref_c && ref_r, "cai_rl_dpo_loss: dpo needs ref_c and ref_r (NULL given)");
    }
    const double beta = c->beta, eps = c->label_smoothing, inv = 1.0 / n_pairs;
    double loss = 0, acc = 0, margin = 0, chosen = 0, rejected = 0;
    for (int i = 0; i < n_pairs; i++) {
        double rc, rr, sc, sr; /* implicit rewards and dh/dpi */
        if (simpo) {
            sc = beta / (double)len_c[i];
            sr = beta / (double)len_r[i];
            rc = sc * pi_c[i];
            rr = sr * pi_r[i];
        } else {
            sc = sr = beta;
            rc = beta * (pi_c[i] - ref_c[i]);
            rr = beta * (pi_r[i] - ref_r[i]);
        }
        const double h = simpo ? rc - rr - c->gamma : beta * ((pi_c[i] - ref_c[i]) - (pi_r[i] - ref_r[i]));
        loss += (1 - eps) * softplus_neg(h) + eps * softplus_neg(-h);
        const double dh = (-(1 - eps) * sigmoid(-h) + eps * sigmoid(h)) * inv;
        d_pi_c[i] = (float)(dh * sc);
        d_pi_r[i] = (float)(-dh * sr);
        acc += rc > rr;
        margin += rc - rr;
        chosen += rc;
        rejected += rr;
    }
    stats_clear(stats);
    if (stats) {
        stats->loss = loss * inv;
        stats->accuracy = acc * inv;
        stats->margin = margin * inv;
        stats->chosen_reward = chosen * inv;
        stats->rejected_reward = rejected * inv;
    }
    return CAI_OK;
}

/* ------------------------------------------------------------ policy losses */

cai_rl_policy_config cai_rl_policy_config_default(void) {
    cai_rl_policy_config c;
    memset(&c, 0, sizeof c);
    c.clip_low = 0.2;
    c.clip_high = 0.2;
    c.kl_coef = 0.0;
    c.agg = CAI_RL_AGG_TOKEN_MEAN;
    c.norm_len = 0.0;
    c.denominator = 0.0;
    return c;
}

cai_status cai_rl_policy_config_check(const cai_rl_policy_config *c) {
    CAI_CHECK_ARG(c, "cai_rl_policy_config_check: NULL config");
    if (!(c->clip_low >= 0) || !isfinite(c->clip_low) || !(c->clip_high >= 0) || !isfinite(c->clip_high))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "policy clip_low=%g, clip_high=%g must be finite and >= 0", c->clip_low,
                         c->clip_high);
    if (!(c->kl_coef >= 0) || !isfinite(c->kl_coef))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "policy kl_coef=%g must be finite and >= 0", c->kl_coef);
    if ((int)c->agg < CAI_RL_AGG_TOKEN_MEAN || (int)c->agg > CAI_RL_AGG_SUM_NORM)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "policy agg=%d is not an aggregation (0 token mean, 1 seq mean, 2 sum norm)", (int)c->agg);
    if (c->agg == CAI_RL_AGG_SUM_NORM && (!(c->norm_len > 0) || !isfinite(c->norm_len)))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "policy norm_len=%g must be finite and > 0 for the sum-norm aggregation",
                         c->norm_len);
    if (!(c->denominator >= 0) || !isfinite(c->denominator))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "policy denominator=%g must be finite and >= 0 (0: agg decides)",
                         c->denominator);
    return CAI_OK;
}

cai_status cai_rl_policy_loss(const cai_rl_policy_config *c, int R, int T, const float *logp, const float *logp_old,
                              const float *logp_ref, const float *adv, int adv_per_token, const uint8_t *mask,
                              float *dlogp, cai_rl_stats *stats) {
    CAI_CALL(cai_rl_policy_config_check(c));
    CAI_CHECK_ARG(R > 0 && T > 0, "cai_rl_policy_loss: R=%d, T=%d must be > 0", R, T);
    CAI_CHECK_ARG(logp && logp_old && adv && mask && dlogp,
                  "cai_rl_policy_loss: logp, logp_old, adv, mask and dlogp must not be NULL");
    CAI_CHECK_ARG(logp_ref || c->kl_coef == 0, "cai_rl_policy_loss: logp_ref is NULL but kl_coef=%g is not 0",
                  c->kl_coef);
    int64_t n_tok = 0;
    for (int64_t i = 0; i < (int64_t)R * T; i++) n_tok += mask[i] != 0;
    const double lo = 1.0 - c->clip_low, hi = 1.0 + c->clip_high;
    double loss = 0, kl = 0, ent = 0;
    int64_t clipped = 0;
    for (int r = 0; r < R; r++) {
        int64_t n_row = 0;
        for (int t = 0; t < T; t++) n_row += mask[(int64_t)r * T + t] != 0;
        /* The weight of each of the row's token losses in the returned loss;
         * an empty row has no token to weigh. */
        double w = 0;
        if (c->denominator > 0) w = 1.0 / c->denominator;
        else if (c->agg == CAI_RL_AGG_TOKEN_MEAN) w = n_tok > 0 ? 1.0 / (double)n_tok : 0;
        else if (c->agg == CAI_RL_AGG_SEQ_MEAN) w = n_row > 0 ? 1.0 / ((double)R * (double)n_row) : 0;
        else w = 1.0 / ((double)R * c->norm_len);
        for (int t = 0; t < T; t++) {
            const int64_t i = (int64_t)r * T + t;
            if (!mask[i]) {
                dlogp[i] = 0;
                continue;
            }
            const double a = adv_per_token ? adv[i] : adv[r];
            const double lp = logp[i], ratio = exp(lp - (double)logp_old[i]);
            const double cr = ratio < lo ? lo : ratio > hi ? hi : ratio;
            const double u = ratio * a, cl = cr * a;
            /* min() takes the clipped branch only where it is strictly
             * smaller; there its gradient is 0 (the clamp is saturated,
             * since cl != u needs cr != ratio). On a tie both branches carry
             * the unclipped gradient. */
            double l, g;
            if (cl < u) {
                l = -cl;
                g = 0;
                clipped++;
            } else {
                l = -u;
                g = -a * ratio;
            }
            if (logp_ref) {
                const double x = (double)logp_ref[i] - lp, ex = exp(x), k3 = ex - x - 1;
                kl += k3;
                l += c->kl_coef * k3;
                g += c->kl_coef * (1 - ex);
            }
            ent -= lp;
            loss += w * l;
            dlogp[i] = (float)(w * g);
        }
    }
    stats_clear(stats);
    if (stats) {
        stats->loss = loss;
        stats->tokens = n_tok;
        if (n_tok > 0) {
            stats->kl = kl / (double)n_tok;
            stats->entropy_proxy = ent / (double)n_tok;
            stats->clip_fraction = (double)clipped / (double)n_tok;
        }
    }
    return CAI_OK;
}

/* ---------------------------------------------------------- advantages, GAE */

cai_status cai_rl_group_advantages(int n_groups, int G, const float *rewards, int scale_std, float eps, float *adv,
                                   uint8_t *keep) {
    CAI_CHECK_ARG(n_groups > 0 && G > 0, "cai_rl_group_advantages: n_groups=%d, G=%d must be > 0", n_groups, G);
    CAI_CHECK_ARG(rewards && adv, "cai_rl_group_advantages: rewards and adv must not be NULL");
    CAI_CHECK_ARG(eps >= 0 && isfinite(eps), "cai_rl_group_advantages: eps=%g must be finite and >= 0", (double)eps);
    for (int g = 0; g < n_groups; g++) {
        const float *r = rewards + (int64_t)g * G;
        float *a = adv + (int64_t)g * G;
        int equal = 1;
        double mean = 0;
        for (int i = 0; i < G; i++) {
            mean += r[i];
            equal &= r[i] == r[0];
        }
        mean /= G;
        double var = 0;
        for (int i = 0; i < G; i++) var += ((double)r[i] - mean) * ((double)r[i] - mean);
        const double scale = scale_std ? 1.0 / (sqrt(var / G) + (double)eps) : 1.0;
        for (int i = 0; i < G; i++) a[i] = equal ? 0.0f : (float)(((double)r[i] - mean) * scale);
        if (keep) keep[g] = !equal;
    }
    return CAI_OK;
}

cai_status cai_rl_gae(int R, int T, const float *rewards, const float *values, const uint8_t *mask, double gamma,
                      double lambda, int whiten, float *adv, float *returns) {
    CAI_CHECK_ARG(R > 0 && T > 0, "cai_rl_gae: R=%d, T=%d must be > 0", R, T);
    CAI_CHECK_ARG(rewards && values && mask && adv && returns,
                  "cai_rl_gae: rewards, values, mask, adv and returns must not be NULL");
    CAI_CHECK_ARG(gamma >= 0 && gamma <= 1, "cai_rl_gae: gamma=%g must lie in [0, 1]", gamma);
    CAI_CHECK_ARG(lambda >= 0 && lambda <= 1, "cai_rl_gae: lambda=%g must lie in [0, 1]", lambda);
    double sum = 0;
    int64_t n = 0;
    for (int r = 0; r < R; r++) {
        double next_v = 0, last = 0;
        for (int t = T - 1; t >= 0; t--) {
            const int64_t i = (int64_t)r * T + t;
            if (!mask[i]) {
                adv[i] = returns[i] = 0;
                continue;
            }
            const double v = values[i];
            last = (double)rewards[i] + gamma * next_v - v + gamma * lambda * last;
            next_v = v;
            adv[i] = (float)last;
            returns[i] = (float)(last + v);
            sum += last;
            n++;
        }
    }
    if (whiten && n > 0) {
        /* TRL's masked_whiten: the unbiased variance, 1e-8 under the root. */
        const double mean = sum / (double)n;
        double ss = 0;
        for (int64_t i = 0; i < (int64_t)R * T; i++)
            if (mask[i]) ss += ((double)adv[i] - mean) * ((double)adv[i] - mean);
        const double var = n > 1 ? ss / (double)(n - 1) : 0, s = 1.0 / sqrt(var + 1e-8);
        for (int64_t i = 0; i < (int64_t)R * T; i++)
            if (mask[i]) adv[i] = (float)(((double)adv[i] - mean) * s);
    }
    return CAI_OK;
}

cai_status cai_rl_token_rewards(int R, int T, const float *score, const float *logp_old, const float *logp_ref,
                                const uint8_t *mask, double kl_coef, float *rewards) {
    CAI_CHECK_ARG(R > 0 && T > 0, "cai_rl_token_rewards: R=%d, T=%d must be > 0", R, T);
    CAI_CHECK_ARG(score && mask && rewards, "cai_rl_token_rewards: score, mask and rewards must not be NULL");
    CAI_CHECK_ARG(kl_coef >= 0 && isfinite(kl_coef), "cai_rl_token_rewards: kl_coef=%g must be finite and >= 0",
                  kl_coef);
    CAI_CHECK_ARG(kl_coef == 0 || (logp_old && logp_ref),
                  "cai_rl_token_rewards: logp_old and logp_ref must not be NULL when kl_coef=%g is not 0", kl_coef);
    for (int r = 0; r < R; r++) {
        int last = -1;
        for (int t = 0; t < T; t++) {
            const int64_t i = (int64_t)r * T + t;
            rewards[i] = 0;
            if (!mask[i]) continue;
            if (kl_coef != 0) rewards[i] = (float)(-kl_coef * ((double)logp_old[i] - (double)logp_ref[i]));
            last = t;
        }
        if (last >= 0) {
            const int64_t i = (int64_t)r * T + last;
            rewards[i] = (float)((double)rewards[i] + (double)score[r]);
        }
    }
    return CAI_OK;
}

cai_status cai_rl_value_loss(int R, int T, const float *values, const float *values_old, const float *returns,
                             const uint8_t *mask, double clip, float *dvalues, cai_rl_stats *stats) {
    CAI_CHECK_ARG(R > 0 && T > 0, "cai_rl_value_loss: R=%d, T=%d must be > 0", R, T);
    CAI_CHECK_ARG(values && values_old && returns && mask && dvalues,
                  "cai_rl_value_loss: values, values_old, returns, mask and dvalues must not be NULL");
    CAI_CHECK_ARG(clip >= 0 && isfinite(clip), "cai_rl_value_loss: clip=%g must be finite and >= 0", clip);
    int64_t n = 0, clipped = 0;
    for (int64_t i = 0; i < (int64_t)R * T; i++) n += mask[i] != 0;
    const double w = n > 0 ? 1.0 / (double)n : 0;
    double loss = 0;
    for (int64_t i = 0; i < (int64_t)R * T; i++) {
        if (!mask[i]) {
            dvalues[i] = 0;
            continue;
        }
        const double v = values[i], vo = values_old[i], ret = returns[i], dv = v - vo;
        const double vc = vo + (dv < -clip ? -clip : dv > clip ? clip : dv);
        const double e1 = v - ret, e2 = vc - ret;
        /* The clipped term's gradient is 0 where the clamp saturates. */
        if (e2 * e2 > e1 * e1) {
            loss += 0.5 * e2 * e2;
            dvalues[i] = (float)(w * e2 * (dv >= -clip && dv <= clip));
            clipped++;
        } else {
            loss += 0.5 * e1 * e1;
            dvalues[i] = (float)(w * e1);
        }
    }
    stats_clear(stats);
    if (stats) {
        stats->loss = loss * w;
        stats->tokens = n;
        stats->value_clip_fraction = n > 0 ? (double)clipped / (double)n : 0;
    }
    return CAI_OK;
}
