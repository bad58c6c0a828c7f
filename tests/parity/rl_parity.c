/* The alignment objectives against an independent PyTorch reference
 * (tests/parity/rl_reference.py, docs/rlhf.md): random inputs from a fixed
 * seed go through the reward-model loss, DPO (with and without label
 * smoothing), SimPO, the GRPO policy loss under each aggregation and a PPO
 * step (token rewards, GAE, the clipped policy loss on per-token
 * advantages, the clipped value loss); inputs, losses and gradients go to
 * one safetensors file, for BATCHES batches drawn from different seeds
 * (names prefixed "b<k>.").
 *
 * Usage: rl_parity OUT.safetensors */
#include "cai_config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/ckpt.h"
#include "colossal/rl.h"

enum { P = 8, R = 12, T = 24, G = 4, BATCHES = 3, MAX_T = 256, MAX_META = 160 };

typedef struct {
    cai_st_tensor t[MAX_T];
    char names[MAX_T][64];
    int n;
    cai_st_meta meta[MAX_META];
    char kv[MAX_META][2][64];
    int n_meta;
    void *keep[MAX_T];
    int n_keep;
    char prefix[16]; /* "b<k>." for batch k */
} out_file;

/* Copies the data, so callers may reuse their buffers. */
static void put(out_file *o, const char *name, cai_dtype dt, int ndim, const int64_t *shape, const void *data) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
    void *p = malloc(n * cai_dtype_size(dt));
    memcpy(p, data, n * cai_dtype_size(dt));
    o->keep[o->n_keep++] = p;
    snprintf(o->names[o->n], sizeof o->names[o->n], "%s%s", o->prefix, name);
    cai_st_tensor *t = &o->t[o->n++];
    memset(t, 0, sizeof *t);
    t->name = o->names[o->n - 1];
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = (uint64_t)shape[d];
    t->data = p;
}

static void put1(out_file *o, const char *name, cai_dtype dt, int64_t n, const void *data) {
    put(o, name, dt, 1, &n, data);
}

static void put2(out_file *o, const char *name, cai_dtype dt, const void *data) {
    const int64_t shape[2] = {R, T};
    put(o, name, dt, 2, shape, data);
}

static void put_loss(out_file *o, const char *name, double loss) { put1(o, name, CAI_DTYPE_F64, 1, &loss); }

static void meta(out_file *o, const char *key, const char *fmt, ...) {
    snprintf(o->kv[o->n_meta][0], sizeof o->kv[0][0], "%s%s", o->prefix, key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->kv[o->n_meta][1], sizeof o->kv[0][1], fmt, ap);
    va_end(ap);
    o->meta[o->n_meta] = (cai_st_meta){o->kv[o->n_meta][0], o->kv[o->n_meta][1]};
    o->n_meta++;
}

static uint64_t g_seed; /* one per batch */
static float uni(uint64_t stream, uint64_t i) { return cai_rng_uniform(g_seed, stream, i); }
static float nrm(uint64_t stream, uint64_t i) { return cai_rng_normal(g_seed, stream, i); }

static cai_status pairs(out_file *o) {
    float rc[P], rr[P], dc[P], dr[P];
    double pc[P], pr[P], qc[P], qr[P];
    int64_t lc[P], lr[P];
    for (int i = 0; i < P; i++) {
        rc[i] = 2 * nrm(1, i);
        rr[i] = 2 * nrm(2, i);
        lc[i] = 1 + (int64_t)(40 * uni(3, i));
        lr[i] = 1 + (int64_t)(40 * uni(4, i));
        pc[i] = -(double)lc[i] * (0.5 + 2 * uni(5, i));
        pr[i] = -(double)lr[i] * (0.5 + 2 * uni(6, i));
        qc[i] = pc[i] + 3 * nrm(7, i);
        qr[i] = pr[i] + 3 * nrm(8, i);
    }
    cai_rl_stats s;
    CAI_CALL(cai_rl_rm_loss(P, rc, rr, dc, dr, &s));
    put1(o, "rm.r_chosen", CAI_DTYPE_F32, P, rc);
    put1(o, "rm.r_rejected", CAI_DTYPE_F32, P, rr);
    put_loss(o, "rm.loss", s.loss);
    put1(o, "rm.d_chosen", CAI_DTYPE_F32, P, dc);
    put1(o, "rm.d_rejected", CAI_DTYPE_F32, P, dr);

    put1(o, "pref.pi_c", CAI_DTYPE_F64, P, pc);
    put1(o, "pref.pi_r", CAI_DTYPE_F64, P, pr);
    put1(o, "pref.ref_c", CAI_DTYPE_F64, P, qc);
    put1(o, "pref.ref_r", CAI_DTYPE_F64, P, qr);
    put1(o, "pref.len_c", CAI_DTYPE_I64, P, lc);
    put1(o, "pref.len_r", CAI_DTYPE_I64, P, lr);
    static const char *const names[3] = {"dpo", "dpo_ls", "simpo"};
    for (int k = 0; k < 3; k++) {
        cai_rl_dpo_config c = cai_rl_dpo_config_default(k == 2 ? CAI_RL_SIMPO : CAI_RL_DPO);
        if (k == 1) c.label_smoothing = 0.1;
        if (k == 2) c.label_smoothing = 0.05;
        CAI_CALL(cai_rl_dpo_loss(&c, P, pc, pr, qc, qr, lc, lr, dc, dr, &s));
        char key[64];
        snprintf(key, sizeof key, "%s.beta", names[k]);
        meta(o, key, "%.17g", c.beta);
        snprintf(key, sizeof key, "%s.label_smoothing", names[k]);
        meta(o, key, "%.17g", c.label_smoothing);
        snprintf(key, sizeof key, "%s.gamma", names[k]);
        meta(o, key, "%.17g", c.gamma);
        snprintf(key, sizeof key, "%s.loss", names[k]);
        put_loss(o, key, s.loss);
        snprintf(key, sizeof key, "%s.d_pi_c", names[k]);
        put1(o, key, CAI_DTYPE_F32, P, dc);
        snprintf(key, sizeof key, "%s.d_pi_r", names[k]);
        put1(o, key, CAI_DTYPE_F32, P, dr);
    }
    return CAI_OK;
}

static cai_status policy(out_file *o) {
    static float lp[R * T], old[R * T], ref[R * T], rw[R], adv[R], d[R * T];
    static float val[R * T], vold[R * T], score[R], trw[R * T], tadv[R * T], ret[R * T], wadv[R * T], wret[R * T];
    static uint8_t mask[R * T], keep[R / G];
    /* each row: a prompt, a response of its own length, padding; row 5 has
     * no response at all */
    for (int r = 0; r < R; r++) {
        const int p = 2 + (int)(5 * uni(10, r)), len = r == 5 ? 0 : 1 + (int)((T - p) * uni(11, r));
        for (int t = 0; t < T; t++) {
            const int64_t i = (int64_t)r * T + t;
            /* odd batches leave a hole inside longer responses (GAE skips it) */
            mask[i] = t >= p && t < p + len && !((g_seed & 1) && len > 3 && t == p + 2);
            lp[i] = -0.05f - 3 * uni(12, i);
            old[i] = lp[i] + 0.3f * nrm(13, i);
            ref[i] = lp[i] + 0.3f * nrm(14, i);
            vold[i] = nrm(15, i);
            val[i] = vold[i] + 0.3f * nrm(16, i);
        }
        /* the last group's rewards are all equal (DAPO drops it) */
        rw[r] = r >= R - G ? 1.0f : (float)(int)(3 * uni(17, r)) + 0.25f * (float)(r % G);
        score[r] = 2 * nrm(18, r);
    }
    put2(o, "pol.logp", CAI_DTYPE_F32, lp);
    put2(o, "pol.logp_old", CAI_DTYPE_F32, old);
    put2(o, "pol.logp_ref", CAI_DTYPE_F32, ref);
    put2(o, "pol.mask", CAI_DTYPE_U8, mask);
    put1(o, "grpo.rewards", CAI_DTYPE_F32, R, rw);
    CAI_CALL(cai_rl_group_advantages(R / G, G, rw, 1, 1e-4f, adv, keep));
    put1(o, "grpo.adv", CAI_DTYPE_F32, R, adv);
    put1(o, "grpo.keep", CAI_DTYPE_U8, R / G, keep);
    meta(o, "grpo.G", "%d", G);
    meta(o, "grpo.eps", "%.17g", (double)1e-4f);
    cai_rl_stats s;
    static const char *const names[5] = {"grpo_token", "grpo_seq", "grpo_sum", "grpo_denom", "grpo_high"};
    for (int k = 0; k < 5; k++) {
        cai_rl_policy_config c = cai_rl_policy_config_default();
        c.kl_coef = 0.04;
        c.agg = k < 3 ? (cai_rl_agg)k : CAI_RL_AGG_TOKEN_MEAN;
        c.norm_len = T;
        if (k == 3) c.denominator = 150;
        if (k == 4) c.clip_high = 0.28;
        CAI_CALL(cai_rl_policy_loss(&c, R, T, lp, old, ref, adv, 0, mask, d, &s));
        char key[64];
        static const char *const agg[3] = {"token", "seq", "sum"};
        snprintf(key, sizeof key, "%s.agg", names[k]);
        meta(o, key, "%s", agg[c.agg]);
        snprintf(key, sizeof key, "%s.clip_high", names[k]);
        meta(o, key, "%.17g", c.clip_high);
        snprintf(key, sizeof key, "%s.denominator", names[k]);
        meta(o, key, "%.17g", c.denominator);
        snprintf(key, sizeof key, "%s.loss", names[k]);
        put_loss(o, key, s.loss);
        snprintf(key, sizeof key, "%s.dlogp", names[k]);
        put2(o, key, CAI_DTYPE_F32, d);
        if (k == 0) {
            put_loss(o, "grpo_token.kl", s.kl);
            put_loss(o, "grpo_token.clip_fraction", s.clip_fraction);
        }
    }
    meta(o, "grpo.kl_coef", "0.04");
    meta(o, "grpo.clip_low", "0.2");
    meta(o, "grpo.norm_len", "%d", T);

    const double kl_coef = 0.05, gamma = 0.99, lambda = 0.95, vclip = 0.2;
    meta(o, "ppo.kl_coef", "%.17g", kl_coef);
    meta(o, "ppo.gamma", "%.17g", gamma);
    meta(o, "ppo.lambda", "%.17g", lambda);
    meta(o, "ppo.value_clip", "%.17g", vclip);
    meta(o, "ppo.clip", "0.2");
    put2(o, "ppo.values", CAI_DTYPE_F32, val);
    put2(o, "ppo.values_old", CAI_DTYPE_F32, vold);
    put1(o, "ppo.score", CAI_DTYPE_F32, R, score);
    CAI_CALL(cai_rl_token_rewards(R, T, score, old, ref, mask, kl_coef, trw));
    CAI_CALL(cai_rl_gae(R, T, trw, vold, mask, gamma, lambda, 0, tadv, ret));
    CAI_CALL(cai_rl_gae(R, T, trw, vold, mask, gamma, lambda, 1, wadv, wret));
    put2(o, "ppo.rewards", CAI_DTYPE_F32, trw);
    put2(o, "ppo.adv", CAI_DTYPE_F32, tadv);
    put2(o, "ppo.returns", CAI_DTYPE_F32, ret);
    put2(o, "ppo.adv_whitened", CAI_DTYPE_F32, wadv);
    cai_rl_policy_config c = cai_rl_policy_config_default();
    CAI_CALL(cai_rl_policy_loss(&c, R, T, lp, old, NULL, tadv, 1, mask, d, &s));
    put_loss(o, "ppo.loss", s.loss);
    put2(o, "ppo.dlogp", CAI_DTYPE_F32, d);
    put_loss(o, "ppo.clip_fraction", s.clip_fraction);
    CAI_CALL(cai_rl_value_loss(R, T, val, vold, ret, mask, vclip, d, &s));
    put_loss(o, "ppo.value_loss", s.loss);
    put2(o, "ppo.dvalues", CAI_DTYPE_F32, d);
    put_loss(o, "ppo.value_clip_fraction", s.value_clip_fraction);
    return CAI_OK;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: rl_parity OUT.safetensors\n");
        return 2;
    }
    static out_file o;
    cai_status st = CAI_OK;
    for (int b = 0; b < BATCHES && st == CAI_OK; b++) {
        g_seed = 1234 + (uint64_t)b;
        snprintf(o.prefix, sizeof o.prefix, "b%d.", b);
        st = pairs(&o);
        if (st == CAI_OK) st = policy(&o);
    }
    o.prefix[0] = 0;
    meta(&o, "batches", "%d", BATCHES);
    if (st == CAI_OK) st = cai_safetensors_write(argv[1], o.t, o.n, o.meta, o.n_meta);
    if (st != CAI_OK) cai_error_print(stderr);
    for (int i = 0; i < o.n_keep; i++) free(o.keep[i]);
    return st == CAI_OK ? 0 : 1;
}
