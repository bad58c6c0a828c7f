/* colossal-rlhf's algorithms: the objective the model hands each forward
 * to (rl_objective) and one step of each algorithm over the run's engine
 * (rl_step), plus the held-out evaluation. The objectives' formulas are
 * the rl module's (colossal/rl.h); what is here is where their inputs come
 * from: which rows a step takes, the reference model's log-probs, the
 * rollouts and their rewards. See docs/rlhf.md. */
#include "cai_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlhf.h"

/* ------------------------------------------------------------------ rows */

/* A language-model row of width T: inputs ids[0..n-2], targets ids[1..n-1]
 * where the target is a response token (rmask), CAI_IGNORE_INDEX elsewhere;
 * cm marks the counted positions. n <= T + 1. */
static void lm_row(const int32_t *ids, const uint8_t *rmask, int64_t n, int T, int32_t *tok, int32_t *tgt,
                   uint8_t *cm) {
    for (int t = 0; t < T; t++) {
        const int in = t < n - 1;
        tok[t] = in ? ids[t] : 0;
        cm[t] = (uint8_t)(in && rmask[t + 1]);
        tgt[t] = cm[t] ? ids[t + 1] : CAI_IGNORE_INDEX;
    }
}

/* A scored row: the whole sequence as input (n <= T), no targets; the
 * score is read at its last token. */
static void score_row(const int32_t *ids, int64_t n, int T, int32_t *tok, int32_t *tgt, uint8_t *cm, int32_t *last) {
    for (int t = 0; t < T; t++) {
        tok[t] = t < n ? ids[t] : 0;
        tgt[t] = CAI_IGNORE_INDEX;
        cm[t] = 0;
    }
    *last = (int32_t)(n - 1);
}

static void empty_row(int T, int32_t *tok, int32_t *tgt, uint8_t *cm, int32_t *last) {
    for (int t = 0; t < T; t++) {
        tok[t] = 0;
        tgt[t] = CAI_IGNORE_INDEX;
        cm[t] = 0;
    }
    if (last) *last = -1;
}

/* Item k of the concatenated per-epoch permutations of n items: epoch e is
 * a Fisher-Yates shuffle drawn from (seed, e), so a step's items depend on
 * (seed, step) only and a resumed run takes the same ones. */
static int64_t order_item(uint64_t seed, int64_t n, int64_t k, int64_t **perm, int64_t *perm_epoch) {
    const int64_t e = k / n;
    if (!*perm || *perm_epoch != e) {
        if (!*perm && cai_calloc((void **)perm, (size_t)n, sizeof **perm, "rlhf data order") != CAI_OK) return -1;
        for (int64_t i = 0; i < n; i++) (*perm)[i] = i;
        const uint64_t stream = cai_hash64("rlhf.order") + (uint64_t)e;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t r = (int64_t)(cai_rng_uniform(seed, stream, (uint64_t)i) * (float)(i + 1));
            if (r > i) r = i;
            const int64_t tmp = (*perm)[i];
            (*perm)[i] = (*perm)[r];
            (*perm)[r] = tmp;
        }
        *perm_epoch = e;
    }
    return (*perm)[k % n];
}

static int64_t *g_perm;
static int64_t g_perm_epoch = -1;

static cai_status take_item(uint64_t seed, int64_t n, int64_t k, int64_t *out) {
    *out = order_item(seed, n, k, &g_perm, &g_perm_epoch);
    return *out < 0 ? CAI_ERROR(CAI_ERR_NOMEM, "rlhf: the data order of %lld items", (long long)n) : CAI_OK;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int dp_size(cai_run_t *run) { return cai_mesh_size(cai_run_mesh(run), CAI_AXIS_DP); }
static int dp_rank(cai_run_t *run) { return cai_mesh_rank(cai_run_mesh(run), CAI_AXIS_DP); }

/* ------------------------------------------------------------------ the objective */

static cai_status rm_objective(rl_job *j, cai_model_objective_io *io, int k) {
    const int B = io->batch, T = io->seq_len, P = B / 2;
    const int64_t C = io->hidden_size;
    const int32_t *last = j->last + (int64_t)k * B;
    for (int b = 0; b < B; b++) {
        if (last[b] < 0) return CAI_ERROR(CAI_ERR_INTERNAL, "rlhf rm: row %d of microbatch %d is empty", b, k);
        memcpy(j->hrow + (int64_t)b * C, io->hidden + ((int64_t)b * T + last[b]) * C, (size_t)C * sizeof(float));
    }
    CAI_CALL(cai_rl_head_forward(j->head, B, j->hrow, j->val));
    float *rc = j->rwd, *rr = rc + P, *dc = rr + P, *dr = dc + P;
    for (int p = 0; p < P; p++) {
        rc[p] = j->val[2 * p];
        rr[p] = j->val[2 * p + 1];
    }
    cai_rl_stats st;
    CAI_CALL(cai_rl_rm_loss(P, rc, rr, dc, dr, &st));
    for (int p = 0; p < P; p++) {
        j->dval[2 * p] = dc[p];
        j->dval[2 * p + 1] = dr[p];
    }
    float *dh = j->hrow + (int64_t)B * C;
    CAI_CALL(cai_rl_head_backward(j->head, B, j->hrow, j->dval, dh));
    for (int b = 0; b < B; b++)
        memcpy(io->dhidden + ((int64_t)b * T + last[b]) * C, dh + (int64_t)b * C, (size_t)C * sizeof(float));
    io->loss = st.loss;
    j->sums.pairs += P;
    j->sums.acc += st.accuracy * P;
    j->sums.margin += st.margin * P;
    return CAI_OK;
}

/* Per row: the summed log-prob of its counted tokens and their number. */
static void row_sums(const float *logp, const uint8_t *mask, int B, int T, double *sum, int64_t *len) {
    for (int b = 0; b < B; b++) {
        double s = 0;
        int64_t n = 0;
        for (int t = 0; t < T; t++)
            if (mask[(int64_t)b * T + t]) {
                s += logp[(int64_t)b * T + t];
                n++;
            }
        sum[b] = s;
        len[b] = n;
    }
}

static cai_status dpo_objective(rl_job *j, cai_model_objective_io *io, int k) {
    const int B = io->batch, T = io->seq_len, P = B / 2;
    const uint8_t *mask = j->mask + (int64_t)k * B * T;
    double *pi = j->pi, *ref = j->refsum + (int64_t)k * B;
    int64_t len[B];
    row_sums(j->logp, mask, B, T, pi, len);
    double pc[P], pr[P], rc[P], rr[P];
    int64_t lc[P], lr[P];
    for (int p = 0; p < P; p++) {
        pc[p] = pi[2 * p];
        pr[p] = pi[2 * p + 1];
        rc[p] = ref[2 * p];
        rr[p] = ref[2 * p + 1];
        lc[p] = len[2 * p];
        lr[p] = len[2 * p + 1];
    }
    const rl_config *c = j->cfg;
    cai_rl_dpo_config dc = cai_rl_dpo_config_default((cai_rl_pref_loss)c->dpo_loss);
    dc.beta = c->dpo_beta;
    dc.label_smoothing = c->dpo_smoothing;
    dc.gamma = c->dpo_gamma;
    float *dpc = j->dpi, *dpr = dpc + P;
    cai_rl_stats st;
    CAI_CALL(cai_rl_dpo_loss(&dc, P, pc, pr, rc, rr, lc, lr, dpc, dpr, &st));
    for (int b = 0; b < B; b++) {
        const float d = b % 2 ? dpr[b / 2] : dpc[b / 2];
        for (int t = 0; t < T; t++)
            if (mask[(int64_t)b * T + t]) io->dtoken_loss[(int64_t)b * T + t] = -d; /* logp = -token loss */
    }
    io->loss = st.loss;
    j->sums.pairs += P;
    j->sums.acc += st.accuracy * P;
    j->sums.margin += st.margin * P;
    j->sums.chosen += st.chosen_reward * P;
    j->sums.rejected += st.rejected_reward * P;
    return CAI_OK;
}

static cai_rl_policy_config policy_config(const rl_config *c) {
    cai_rl_policy_config pc = cai_rl_policy_config_default();
    pc.clip_low = c->clip_low;
    pc.clip_high = c->clip_high;
    pc.kl_coef = c->algo == RL_GRPO ? c->kl_coef : 0.0; /* ppo: the KL is in the reward */
    pc.agg = c->algo == RL_GRPO ? (cai_rl_agg)c->agg : CAI_RL_AGG_TOKEN_MEAN;
    pc.norm_len = c->max_new;
    return pc;
}

/* Each microbatch's mean is weighted by its share of the global count, so
 * that the driver's mean over microbatches and replicas is the global
 * batch's (a token mean over every counted token of every replica). */
static cai_status policy_objective(rl_job *j, cai_model_objective_io *io, int k) {
    const rl_config *c = j->cfg;
    const int B = io->batch, T = io->seq_len;
    const int64_t N = (int64_t)B * T, C = io->hidden_size;
    if (j->mb_count[k] == 0 || j->global_count <= 0) {
        io->loss = 0;
        return CAI_OK;
    }
    const double factor = j->count_scale * (double)j->mb_count[k] / j->global_count;
    const uint8_t *mask = j->mask + k * N;
    const float *old = c->passes == 1 && c->algo == RL_GRPO ? j->logp : j->old_logp + k * N;
    const float *ref = c->algo == RL_GRPO && c->kl_coef > 0 ? j->ref_logp + k * N : NULL;
    const float *adv = c->algo == RL_GRPO ? j->adv + (int64_t)k * B : j->adv + k * N;
    if (j->pass == 0) {
        /* The training forward must score exactly the tokens the engine
         * drew, at the positions it drew them (the engine's log-probs,
         * taken at temperature 1 only), and the first pass over a batch must
         * start at ratio 1. */
        const float *samp = j->samp_logp + k * N;
        for (int64_t n = 0; n < N; n++) {
            if (!mask[n]) continue;
            const double r = fabs(exp((double)j->logp[n] - (double)old[n]) - 1.0);
            const double d = isnan(samp[n]) ? 0.0 : fabs((double)j->logp[n] - (double)samp[n]);
            if (d > j->samp_diff) j->samp_diff = d;
            if (r > j->ratio_dev) j->ratio_dev = r;
        }
    }
    const cai_rl_policy_config pc = policy_config(c);
    cai_rl_stats st;
    CAI_CALL(cai_rl_policy_loss(&pc, B, T, j->logp, old, ref, adv, c->algo == RL_PPO, mask, j->dlogp, &st));
    for (int64_t n = 0; n < N; n++) io->dtoken_loss[n] = (float)(-factor * j->dlogp[n]);
    io->loss = factor * st.loss;
    j->sums.tokens += (double)st.tokens;
    j->sums.kl += st.kl * (double)st.tokens;
    j->sums.clip += st.clip_fraction * (double)st.tokens;
    j->sums.nlogp += st.entropy_proxy * (double)st.tokens;
    if (c->algo != RL_PPO) return CAI_OK;
    CAI_CALL(cai_rl_head_forward(j->head, N, io->hidden, j->val));
    cai_rl_stats vs;
    CAI_CALL(cai_rl_value_loss(B, T, j->val, j->old_val + k * N, j->ret + k * N, mask, c->value_clip, j->dval, &vs));
    const double vf = c->vf_coef * factor;
    for (int64_t n = 0; n < N; n++) j->dval[n] = (float)(vf * j->dval[n]);
    CAI_CALL(cai_rl_head_backward(j->head, N, io->hidden, j->dval, io->dhidden));
    (void)C;
    io->loss += vf * vs.loss;
    j->sums.vclip += vs.value_clip_fraction * (double)vs.tokens;
    return CAI_OK;
}

cai_status rl_objective(void *ctx, cai_model_objective_io *io) {
    rl_job *j = ctx;
    const int k = j->mb++;
    const int64_t N = (int64_t)io->batch * io->seq_len;
    if (k >= j->n_micro || io->batch != j->B || io->seq_len != j->T)
        return CAI_ERROR(CAI_ERR_INTERNAL, "rlhf objective: forward %d of a step of %d microbatches of [%d, %d]", k,
                         j->n_micro, j->B, j->T);
    for (int64_t n = 0; n < N; n++) j->logp[n] = io->targets[n] == CAI_IGNORE_INDEX ? 0.0f : -io->token_loss[n];
    switch (j->mode) {
    case RL_MODE_RECORD:
        memcpy(j->rec + k * N, j->logp, (size_t)N * sizeof(float));
        if (io->hidden) CAI_CALL(cai_rl_head_forward(j->head, N, io->hidden, j->rec_val + k * N));
        io->loss = 0;
        return CAI_OK;
    case RL_MODE_RM: return rm_objective(j, io, k);
    case RL_MODE_DPO: return dpo_objective(j, io, k);
    case RL_MODE_POLICY: return policy_objective(j, io, k);
    }
    return CAI_ERROR(CAI_ERR_INTERNAL, "rlhf objective: mode %d", (int)j->mode);
}

/* grpo and ppo score a response token by the distribution it was drawn
 * from, the logits over rollout.temperature (as TRL and verl do), the
 * reference's too; top-k and top-p truncations are not modelled. */
static float policy_logit_scale(const rl_job *j) {
    const rl_config *c = j->cfg;
    return c->algo == RL_GRPO || c->algo == RL_PPO ? (float)(1.0 / c->temperature) : 1.0f;
}

/* The engine's log-probs are of the raw logits, the training forward's of
 * the tempered ones: they are compared (sampler_logp_diff_max) only where
 * the two agree, at temperature 1. */
static int sampler_checked(const rl_job *j) { return j->sp.temperature == 1.0f; }

/* Forwards of every microbatch of the step on `m` (the policy or the
 * reference) in record mode: rec (and rec_val when want_values) hold the
 * result. */
static cai_status record(rl_job *j, cai_model_t *m, int want_values) {
    const cai_model_objective obj = {rl_objective, j, want_values, policy_logit_scale(j)};
    CAI_CALL(cai_model_set_objective(m, &obj));
    j->mode = RL_MODE_RECORD;
    j->mb = 0;
    const int64_t N = (int64_t)j->B * j->T;
    for (int k = 0; k < j->n_micro; k++) CAI_CALL(cai_model_forward(m, j->tok + k * N, j->tgt + k * N, NULL));
    return CAI_OK;
}

/* Sets the policy's objective for a training pass. */
static cai_status train_mode(rl_job *j, rl_mode mode, int want_hidden) {
    const cai_model_objective obj = {rl_objective, j, want_hidden, policy_logit_scale(j)};
    CAI_CALL(cai_model_set_objective(j->eng.model, &obj));
    j->mode = mode;
    j->mb = 0;
    return CAI_OK;
}

/* The head's gradient averaged over microbatches and replicas, then its
 * AdamW step at the learning rate the model's step used. */
static cai_status head_update(rl_job *j, cai_run_t *run, const cai_step_stats *st) {
    float *w, *g, *m, *v;
    cai_rl_head_tensors(j->head, &w, &g, &m, &v);
    const int64_t C = cai_rl_head_width(j->head);
    CAI_CALL(cai_allreduce(cai_run_mesh(run), CAI_AXIS_DP, g, g, (size_t)C, CAI_DTYPE_F32, CAI_RED_SUM));
    const float scale = 1.0f / (float)((int64_t)j->n_micro * dp_size(run));
    j->optim_steps++;
    if (st->skipped) return CAI_OK;
    const rl_config *c = j->cfg;
    return cai_rl_head_adamw(j->head, j->optim_steps, st->lr, (float)c->tr.beta1, (float)c->tr.beta2, (float)c->tr.eps,
                             0.0f, scale);
}

static cai_status reduce_sums(rl_job *j, cai_run_t *run) {
    return cai_allreduce(cai_run_mesh(run), CAI_AXIS_DP, (double *)&j->sums, (double *)&j->sums,
                         sizeof j->sums / sizeof(double), CAI_DTYPE_F64, CAI_RED_SUM);
}

/* ------------------------------------------------------------------ rm and dpo */

/* The step's pairs: this rank's microbatch k holds global pairs
 * base + rank * micro * accum + k * micro + [0, micro). */
static cai_status fill_pairs(rl_job *j, const cai_rl_pref_set_t *set, int64_t first, int64_t count, int shuffle,
                             uint64_t seed) {
    const int T = j->T, P = j->B / 2, score = j->cfg->algo == RL_RM;
    const int64_t n = cai_rl_pref_set_size(set), N = (int64_t)j->B * T;
    for (int k = 0; k < j->n_micro; k++)
        for (int p = 0; p < P; p++) {
            const int64_t at = first + (int64_t)k * P + p;
            for (int side = 0; side < 2; side++) {
                const int64_t row = (int64_t)k * j->B + 2 * p + side, off = k * N + (int64_t)(2 * p + side) * T;
                if (at >= first + count) {
                    empty_row(T, j->tok + off, j->tgt + off, j->mask + off, j->last + row);
                    continue;
                }
                int64_t item = at;
                if (shuffle) CAI_CALL(take_item(seed, n, at, &item));
                else item = at % n;
                const cai_sft_tokens *ch, *rj;
                CAI_CALL(cai_rl_pref_set_pair(set, item, &ch, &rj));
                const cai_sft_tokens *s = side ? rj : ch;
                if (score)
                    score_row(s->ids, (int64_t)s->len, T, j->tok + off, j->tgt + off, j->mask + off, j->last + row);
                else lm_row(s->ids, s->mask, (int64_t)s->len, T, j->tok + off, j->tgt + off, j->mask + off);
            }
        }
    return CAI_OK;
}

/* dpo: the reference's summed log-probs of every row of the step. */
static cai_status reference_sums(rl_job *j) {
    if (j->cfg->dpo_loss == CAI_RL_SIMPO) {
        memset(j->refsum, 0, (size_t)j->n_micro * j->B * sizeof *j->refsum);
        return CAI_OK;
    }
    CAI_CALL(record(j, j->ref, 0));
    const int64_t N = (int64_t)j->B * j->T;
    int64_t len[j->B];
    for (int k = 0; k < j->n_micro; k++)
        row_sums(j->rec + k * N, j->mask + k * N, j->B, j->T, j->refsum + (int64_t)k * j->B, len);
    return CAI_OK;
}

static cai_status pairs_step(rl_job *j, cai_run_t *run, int64_t step, cai_step_stats *st) {
    const rl_config *c = j->cfg;
    const int P = j->B / 2;
    const int64_t per_rank = (int64_t)P * j->n_micro, base = (step - 1) * per_rank * dp_size(run);
    CAI_CALL(fill_pairs(j, j->pref_train, base + dp_rank(run) * per_rank, per_rank, 1, (uint64_t)c->seed));
    memset(&j->sums, 0, sizeof j->sums);
    if (c->algo == RL_DPO) CAI_CALL(reference_sums(j));
    else cai_rl_head_zero_grad(j->head);
    CAI_CALL(train_mode(j, c->algo == RL_RM ? RL_MODE_RM : RL_MODE_DPO, c->algo == RL_RM));
    CAI_CALL(tc_engine_step(&j->eng, run, step, j->tok, j->tgt, j->n_micro, st));
    if (c->algo == RL_RM) CAI_CALL(head_update(j, run, st));
    else j->optim_steps++;
    CAI_CALL(reduce_sums(j, run));
    const double n = j->sums.pairs > 0 ? j->sums.pairs : 1;
    if (c->algo == RL_RM)
        cai_run_json(run,
                     "\"kind\":\"rl\",\"algo\":\"rm\",\"step\":%lld,\"loss\":%.9g,\"accuracy\":%.9g,\"margin\":%.9g",
                     (long long)step, (double)st->loss, j->sums.acc / n, j->sums.margin / n);
    else
        cai_run_json(run,
                     "\"kind\":\"rl\",\"algo\":\"%s\",\"step\":%lld,\"loss\":%.9g,\"accuracy\":%.9g,\"margin\":%.9g,"
                     "\"chosen_reward\":%.9g,\"rejected_reward\":%.9g",
                     c->dpo_loss == CAI_RL_SIMPO ? "simpo" : "dpo", (long long)step, (double)st->loss, j->sums.acc / n,
                     j->sums.margin / n, j->sums.chosen / n, j->sums.rejected / n);
    return CAI_OK;
}

/* Held-out pairs: rm, the reward head ranks chosen above rejected; dpo,
 * the implicit reward does (SimPO's: the length-normalised log-prob). Every
 * rank runs as many forwards (ZeRO-3 gathers over dp). */
static cai_status pairs_eval(rl_job *j, cai_run_t *run, double *acc, double *margin, int64_t *pairs) {
    const rl_config *c = j->cfg;
    const int P = j->B / 2, dp = dp_size(run), r = dp_rank(run);
    const int64_t n = cai_rl_pref_set_size(j->pref_valid), per_round = (int64_t)P * j->n_micro * dp;
    const int64_t N = (int64_t)j->B * j->T;
    double s[3] = {0, 0, 0}; /* correct, margin sum, pairs */
    for (int64_t at = 0; at < n; at += per_round) {
        const int64_t first = at + (int64_t)r * P * j->n_micro;
        const int64_t count = first >= n ? 0 : (n - first < (int64_t)P * j->n_micro ? n - first : P * j->n_micro);
        CAI_CALL(fill_pairs(j, j->pref_valid, first, count, 0, 0));
        if (c->algo == RL_RM) {
            CAI_CALL(record(j, j->eng.model, 1));
        } else {
            CAI_CALL(reference_sums(j));
            CAI_CALL(record(j, j->eng.model, 0));
        }
        for (int64_t q = 0; q < count; q++) {
            const int k = (int)(q / P), p = (int)(q % P);
            double sc, sr;
            if (c->algo == RL_RM) {
                const int64_t rc = (int64_t)k * j->B + 2 * p, rr = rc + 1;
                sc = j->rec_val[k * N + (rc - (int64_t)k * j->B) * j->T + j->last[rc]];
                sr = j->rec_val[k * N + (rr - (int64_t)k * j->B) * j->T + j->last[rr]];
            } else {
                double sum[2];
                int64_t len[2];
                row_sums(j->rec + k * N + (int64_t)2 * p * j->T, j->mask + k * N + (int64_t)2 * p * j->T, 2, j->T, sum,
                         len);
                const double *ref = j->refsum + (int64_t)k * j->B + 2 * p;
                if (c->dpo_loss == CAI_RL_SIMPO) {
                    sc = sum[0] / (double)(len[0] ? len[0] : 1);
                    sr = sum[1] / (double)(len[1] ? len[1] : 1);
                } else {
                    sc = c->dpo_beta * (sum[0] - ref[0]);
                    sr = c->dpo_beta * (sum[1] - ref[1]);
                }
            }
            s[0] += sc > sr;
            s[1] += sc - sr;
            s[2] += 1;
        }
    }
    CAI_CALL(cai_allreduce(cai_run_mesh(run), CAI_AXIS_DP, s, s, 3, CAI_DTYPE_F64, CAI_RED_SUM));
    *pairs = (int64_t)s[2];
    *acc = s[2] > 0 ? s[0] / s[2] : 0;
    *margin = s[2] > 0 ? s[1] / s[2] : 0;
    return CAI_OK;
}

/* ------------------------------------------------------------------ rollouts */

typedef struct {
    int32_t *ids; /* prompt then response */
    float *lp;    /* sampled rollouts: the engine's log-prob of each response token */
    int64_t n_prompt, n;
    double reward, exact;
    int64_t prompt;
} rl_sample;

/* The response's text for the rewards: its tokens decoded, cut before the
 * end-of-text token and the first stop string. */
static cai_status response_text(rl_job *j, const int32_t *ids, int64_t n, cai_byte_buf *out) {
    while (n > 0 && ids[n - 1] == j->eos) n--;
    out->len = 0;
    if (j->bpe) CAI_CALL(cai_bpe_decode(j->bpe, ids, (size_t)n, out));
    else {
        for (int64_t i = 0; i < n; i++) {
            if (out->len + 2 > out->cap) {
                size_t cap = out->cap ? 2 * out->cap : 256;
                char *p = realloc(out->data, cap);
                if (!p) return CAI_ERROR(CAI_ERR_NOMEM, "response text");
                out->data = p;
                out->cap = cap;
            }
            out->data[out->len++] = (char)(ids[i] & 0xff);
        }
    }
    if (!out->data) return CAI_OK;
    out->data[out->len] = 0;
    const char *stop = j->cfg->stop;
    if (*stop) {
        char *s = strstr(out->data, stop);
        if (s) {
            *s = 0;
            out->len = (size_t)(s - out->data);
        }
    }
    return CAI_OK;
}

/* Generates `samples` responses to each of `n_prompts` prompts (set items
 * items[i]) and scores them. temperature 0: greedy. Not collective beyond
 * the engine's tp axis. */
static cai_status rollout(rl_job *j, const cai_rl_prompt_set_t *set, const int64_t *items, int n_prompts, int samples,
                          int greedy, int64_t step, rl_sample *out, int64_t *gen_tokens) {
    const rl_config *c = j->cfg;
    for (int p = 0; p < n_prompts; p++) {
        const int32_t *ids;
        int64_t n;
        const char *text, *answer;
        CAI_CALL(cai_rl_prompt_set_get(set, items[p], &ids, &n, &text, &answer));
        for (int g = 0; g < samples; g++) {
            cai_sampling_params sp = j->sp;
            if (greedy) sp.temperature = 0;
            else if (sampler_checked(j)) sp.logprobs = 0; /* against the training forward's (policy_objective) */
            sp.has_seed = 1;
            sp.seed = mix64(mix64(mix64((uint64_t)c->seed ^ (uint64_t)step) ^ (uint64_t)items[p]) ^ (uint64_t)g);
            CAI_CALL(cai_engine_add(j->gen, (int64_t)p * samples + g, ids, n, &sp, 0));
            rl_sample *s = &out[p * samples + g];
            s->n_prompt = n;
            s->prompt = items[p];
        }
    }
    while (cai_engine_pending(j->gen) > 0) CAI_CALL(cai_engine_step(j->gen));
    cai_engine_output o;
    cai_byte_buf text = {0};
    cai_status st = CAI_OK;
    *gen_tokens = 0;
    while (st == CAI_OK && cai_engine_take(j->gen, &o)) {
        rl_sample *s = &out[o.tag];
        const int32_t *pids;
        int64_t pn;
        const char *ptext, *answer;
        st = cai_rl_prompt_set_get(set, s->prompt, &pids, &pn, &ptext, &answer);
        int32_t *grown = st == CAI_OK ? realloc(s->ids, (size_t)(pn + o.n_tokens) * sizeof *s->ids) : NULL;
        if (st == CAI_OK && !grown)
            st = CAI_ERROR(CAI_ERR_NOMEM, "rollout of %lld tokens", (long long)(pn + o.n_tokens));
        if (st == CAI_OK) {
            s->ids = grown;
            memcpy(s->ids, pids, (size_t)pn * sizeof *s->ids);
            memcpy(s->ids + pn, o.tokens, (size_t)o.n_tokens * sizeof *s->ids);
            s->n = pn + o.n_tokens;
            *gen_tokens += o.n_tokens;
            if (o.logprobs) {
                float *lp = realloc(s->lp, (size_t)(o.n_tokens > 0 ? o.n_tokens : 1) * sizeof *lp);
                if (!lp) st = CAI_ERROR(CAI_ERR_NOMEM, "rollout log-probs of %lld tokens", (long long)o.n_tokens);
                else {
                    s->lp = lp;
                    for (int64_t k = 0; k < o.n_tokens; k++) lp[k] = o.logprobs[k].logprob;
                }
            }
        }
        if (st == CAI_OK) {
            st = response_text(j, o.tokens, o.n_tokens, &text);
        }
        double parts[CAI_RL_MAX_REWARDS];
        s->reward = 0;
        if (st == CAI_OK && j->rewards.n > 0)
            st = cai_rl_reward_spec_eval(&j->rewards, ptext, text.data ? text.data : "", answer, &s->reward, parts);
        if (st == CAI_OK) s->exact = j->exact_part >= 0 && j->rewards.n > 0 ? parts[j->exact_part] : 0;
        cai_engine_output_free(&o);
    }
    free(text.data);
    return st;
}

/* ------------------------------------------------------------------ grpo and ppo */

/* rm_scores[i] = the reward model's score of rollout i (prompt then
 * response tokens as drawn, read at the last one), i < rows; the step's
 * row buffers hold the scored rows afterwards. */
static cai_status reward_model_scores(rl_job *j, const rl_sample *smp, int rows) {
    const int T = j->T;
    const int64_t R = (int64_t)j->n_micro * j->B, N = (int64_t)j->B * T;
    for (int64_t i = 0; i < R; i++) {
        const int64_t off = i * T;
        if (i >= rows) {
            empty_row(T, j->tok + off, j->tgt + off, j->mask + off, j->last + i);
            continue;
        }
        if (smp[i].n > T || smp[i].n < 1)
            return CAI_ERROR(CAI_ERR_INTERNAL, "reward.model: rollout %lld holds %lld tokens, train.seq_len=%d",
                             (long long)i, (long long)smp[i].n, T);
        score_row(smp[i].ids, smp[i].n, T, j->tok + off, j->tgt + off, j->mask + off, j->last + i);
    }
    for (int k = 0; k < j->n_micro; k++)
        CAI_CALL(cai_rl_head_score_rows(j->rm_head, j->rm, j->B, T, j->tok + k * N, j->last + (int64_t)k * j->B,
                                        j->rm_scores + (int64_t)k * j->B));
    return CAI_OK;
}

typedef enum { RL_PHASE_ROLLOUT = 0, RL_PHASE_SCORE, RL_PHASE_UPDATE } rl_phase;

/* placement.frozen=host: the frozen models' weights and the rollout pool
 * take turns in device memory, each given back before the other comes
 * (the plan counts the larger, not both). */
static cai_status swap_to(rl_job *j, rl_phase ph) {
    if (ph != RL_PHASE_SCORE) {
        if (j->ref) CAI_CALL(cai_model_offload(j->ref));
        if (j->rm) CAI_CALL(cai_model_offload(j->rm));
        if (ph == RL_PHASE_ROLLOUT) CAI_CALL(cai_engine_resume(j->gen));
        return CAI_OK;
    }
    CAI_CALL(cai_engine_suspend(j->gen));
    if (j->ref) CAI_CALL(cai_model_onload(j->ref));
    if (j->rm) CAI_CALL(cai_model_onload(j->rm));
    return CAI_OK;
}

/* The swaps' seconds add up in j->swap_s (the step's placement_s). */
static cai_status enter_phase(rl_job *j, rl_phase ph) {
    if (!j->frozen_on_host) return CAI_OK;
    const double t0 = cai_time_now();
    const cai_status st = swap_to(j, ph);
    j->swap_s += cai_time_now() - t0;
    return st;
}

/* A GPU's memory in use (MiB) as a phase ends; the host device's "free"
 * is the whole machine's, so nothing is noted there. */
static void note_memory(rl_job *j, cai_run_t *run, rl_phase ph) {
    cai_device_t *dev = cai_run_device(run);
    size_t free_b = 0, total_b = 0;
    if (dev->kind == CAI_DEVICE_HOST) return;
    if (cai_device_sync(dev) != CAI_OK || cai_device_mem_info(dev, &free_b, &total_b) != CAI_OK) {
        cai_error_clear();
        return;
    }
    j->device_used_mib[ph] = (double)(total_b - free_b) / 1048576.0;
}

static cai_status policy_step(rl_job *j, cai_run_t *run, int64_t step, cai_step_stats *st) {
    const rl_config *c = j->cfg;
    const int dp = dp_size(run), r = dp_rank(run), G = c->group, P = c->prompts / dp, rows = P * G;
    const int T = j->T, B = j->B;
    const int64_t N = (int64_t)B * T, R = (int64_t)j->n_micro * B;
    const int64_t n_set = cai_rl_prompt_set_size(j->prompt_train);
    int64_t items[P];
    for (int p = 0; p < P; p++)
        CAI_CALL(take_item((uint64_t)c->seed, n_set, (step - 1) * c->prompts + (int64_t)r * P + p, &items[p]));
    rl_sample *smp = NULL;
    CAI_CALL(cai_calloc((void **)&smp, (size_t)rows, sizeof *smp, "rollouts"));
    /* rollout_s, score_s and update_s leave out the swaps between the
     * phases (placement_s) */
    int64_t gen_tokens = 0;
    j->swap_s = 0;
    cai_status s = enter_phase(j, RL_PHASE_ROLLOUT);
    const double t0 = cai_time_now();
    if (s == CAI_OK) s = rollout(j, j->prompt_train, items, P, G, 0, step, smp, &gen_tokens);
    note_memory(j, run, RL_PHASE_ROLLOUT);
    const double t_roll = cai_time_now() - t0;
    if (s == CAI_OK) s = enter_phase(j, RL_PHASE_SCORE);
    const double t_s0 = cai_time_now();
    uint8_t keep[P > 0 ? P : 1];
    /* reward sum, reward^2 sum, exact sum, response tokens, samples, kept groups, reward model score sum */
    double rs[7] = {0, 0, 0, 0, 0, 0, 0};
    if (s == CAI_OK && j->rm) s = reward_model_scores(j, smp, rows);
    for (int i = 0; s == CAI_OK && i < rows; i++) {
        if (j->rm) {
            rs[6] += j->rm_scores[i];
            smp[i].reward += c->rm_weight * (double)j->rm_scores[i];
        }
        j->scores[i] = (float)smp[i].reward;
        rs[0] += smp[i].reward;
        rs[1] += smp[i].reward * smp[i].reward;
        rs[2] += smp[i].exact;
        rs[3] += (double)(smp[i].n - smp[i].n_prompt);
        rs[4] += 1;
    }
    if (s == CAI_OK && c->algo == RL_GRPO)
        s = cai_rl_group_advantages(P, G, j->scores, c->scale_std, 1e-4f, j->adv, keep);
    for (int p = 0; p < P; p++) {
        if (c->algo == RL_PPO || !c->filter) keep[p] = 1;
        rs[5] += keep[p];
    }
    /* rows: the samples in order, then empty ones up to n_micro * B */
    for (int64_t i = 0; s == CAI_OK && i < R; i++) {
        const int64_t off = i * T;
        if (i >= rows || !keep[i / G]) {
            empty_row(T, j->tok + off, j->tgt + off, j->mask + off, NULL);
            if (c->algo == RL_GRPO) j->adv[i] = 0;
            continue;
        }
        uint8_t rmask[T + 1];
        for (int64_t t = 0; t < smp[i].n && t <= T; t++) rmask[t] = (uint8_t)(t >= smp[i].n_prompt);
        lm_row(smp[i].ids, rmask, smp[i].n, T, j->tok + off, j->tgt + off, j->mask + off);
        /* position t predicts ids[t + 1], response token t + 1 - n_prompt */
        for (int t = 0; t < T; t++)
            j->samp_logp[off + t] = !j->mask[off + t] ? 0.0f
                                    : smp[i].lp       ? smp[i].lp[t + 1 - smp[i].n_prompt]
                                                      : NAN; /* greedy rollouts carry none */
    }
    for (int i = 0; i < rows; i++) {
        free(smp[i].ids);
        free(smp[i].lp);
    }
    free(smp);
    CAI_CALL(s);
    /* the global count the objectives' means are over */
    double local = 0;
    for (int k = 0; k < j->n_micro; k++) {
        int64_t cnt = 0;
        for (int b = 0; b < B; b++) {
            int64_t tokens = 0;
            for (int t = 0; t < T; t++) tokens += j->mask[k * N + (int64_t)b * T + t];
            if (c->algo == RL_PPO || c->agg == CAI_RL_AGG_TOKEN_MEAN) cnt += tokens;
            else cnt += tokens > 0;
        }
        j->mb_count[k] = cnt;
        local += (double)cnt;
    }
    double g[8] = {local, rs[0], rs[1], rs[2], rs[3], rs[4], rs[5], rs[6]};
    CAI_CALL(cai_allreduce(cai_run_mesh(run), CAI_AXIS_DP, g, g, 8, CAI_DTYPE_F64, CAI_RED_SUM));
    j->global_count = g[0];
    j->count_scale = (double)j->n_micro * dp;
    /* the old policy (several passes, or ppo's values) and the reference */
    const int need_old = c->passes > 1 || c->algo == RL_PPO;
    if (need_old) {
        CAI_CALL(record(j, j->eng.model, c->algo == RL_PPO));
        memcpy(j->old_logp, j->rec, (size_t)R * T * sizeof(float));
        if (c->algo == RL_PPO) memcpy(j->old_val, j->rec_val, (size_t)R * T * sizeof(float));
    }
    if (c->kl_coef > 0) {
        CAI_CALL(record(j, j->ref, 0));
        memcpy(j->ref_logp, j->rec, (size_t)R * T * sizeof(float));
    }
    note_memory(j, run, RL_PHASE_SCORE);
    const double t_score = cai_time_now() - t_s0;
    CAI_CALL(enter_phase(j, RL_PHASE_UPDATE));
    const double t1 = cai_time_now();
    if (c->algo == RL_PPO) {
        float *tr = j->rec; /* token rewards; rec is free again */
        CAI_CALL(cai_rl_token_rewards((int)R, T, j->scores, j->old_logp, c->kl_coef > 0 ? j->ref_logp : j->old_logp,
                                      j->mask, c->kl_coef, tr));
        CAI_CALL(cai_rl_gae((int)R, T, tr, j->old_val, j->mask, c->gamma, c->lambda, 0, j->adv, j->ret));
        if (c->whiten) {
            /* over every replica's counted tokens: a layout-independent batch */
            double m[3] = {0, 0, 0};
            for (int64_t n = 0; n < R * T; n++)
                if (j->mask[n]) {
                    m[0] += j->adv[n];
                    m[1] += (double)j->adv[n] * j->adv[n];
                    m[2] += 1;
                }
            CAI_CALL(cai_allreduce(cai_run_mesh(run), CAI_AXIS_DP, m, m, 3, CAI_DTYPE_F64, CAI_RED_SUM));
            const double mean = m[2] > 0 ? m[0] / m[2] : 0, var = m[2] > 0 ? m[1] / m[2] - mean * mean : 0;
            const double inv = 1.0 / sqrt((var > 0 ? var : 0) + 1e-8);
            for (int64_t n = 0; n < R * T; n++) j->adv[n] = j->mask[n] ? (float)((j->adv[n] - mean) * inv) : 0.0f;
        }
    }
    j->samp_diff = j->ratio_dev = 0;
    for (int e = 0; e < c->passes; e++) {
        j->pass = e;
        memset(&j->sums, 0, sizeof j->sums);
        if (j->head) cai_rl_head_zero_grad(j->head);
        CAI_CALL(train_mode(j, RL_MODE_POLICY, c->algo == RL_PPO));
        CAI_CALL(tc_engine_step(&j->eng, run, step, j->tok, j->tgt, j->n_micro, st));
        cai_engine_weights_changed(j->gen); /* its cached prompt blocks are the old policy's */
        if (j->head) CAI_CALL(head_update(j, run, st));
        else j->optim_steps++;
    }
    const double t_upd = cai_time_now() - t1;
    note_memory(j, run, RL_PHASE_UPDATE);
    CAI_CALL(reduce_sums(j, run));
    double dev[2] = {j->samp_diff, j->ratio_dev};
    CAI_CALL(cai_allreduce(cai_run_mesh(run), CAI_AXIS_DP, dev, dev, 2, CAI_DTYPE_F64, CAI_RED_MAX));
    const double n = g[5] > 0 ? g[5] : 1, mean = g[1] / n, var = g[2] / n - mean * mean, tk = j->sums.tokens;
    const double upd_tokens = (double)c->passes * R * T * dp;
    char rm_mean[64] = "", samp[32] = "null", mem[96] = "";
    if (j->rm) snprintf(rm_mean, sizeof rm_mean, ",\"rm_score_mean\":%.9g", g[7] / n);
    if (cai_run_device(run)->kind != CAI_DEVICE_HOST)
        snprintf(mem, sizeof mem, ",\"device_used_mib\":[%.1f,%.1f,%.1f],\"placement_s\":%.4f", j->device_used_mib[0],
                 j->device_used_mib[1], j->device_used_mib[2], j->swap_s);
    if (sampler_checked(j)) snprintf(samp, sizeof samp, "%.3g", dev[0]);
    cai_run_json(
        run,
        "\"kind\":\"rl\",\"algo\":\"%s\",\"step\":%lld,\"loss\":%.9g,\"reward_mean\":%.9g%s,\"reward_std\":%.6f,"
        "\"accuracy\":%.6f,\"response_len\":%.3f,\"kl\":%.6g,\"clip_fraction\":%.6f,\"value_clip_fraction\":%.6f,"
        "\"neg_logp\":%.6f,\"groups_kept\":%.0f,\"groups\":%d,\"rollout_s\":%.4f,\"score_s\":%.4f,\"update_s\":%.4f,"
        "\"rollout_tokens_per_s\":%.1f,\"update_tokens_per_s\":%.1f,\"sampler_logp_diff_max\":%s,"
        "\"ratio_dev_max\":%.3g%s",
        rl_algo_names[c->algo], (long long)step, (double)st->loss, mean, rm_mean, sqrt(var > 0 ? var : 0), g[3] / n,
        g[4] / n, tk > 0 ? j->sums.kl / tk : 0, tk > 0 ? j->sums.clip / tk : 0, tk > 0 ? j->sums.vclip / tk : 0,
        tk > 0 ? j->sums.nlogp / tk : 0, g[6], c->prompts, t_roll, t_score, t_upd,
        t_roll > 0 ? (double)gen_tokens * dp / t_roll : 0, t_upd > 0 ? upd_tokens / t_upd : 0, samp, dev[1], mem);
    return CAI_OK;
}

/* Greedy answers to the held-out prompts (eval.samples of them, 0: all),
 * dealt to the replicas: the mean reward and the exact-match accuracy. */
static cai_status prompts_eval(rl_job *j, cai_run_t *run, double *acc, double *reward, int64_t *count) {
    const int dp = dp_size(run), r = dp_rank(run);
    int64_t n = cai_rl_prompt_set_size(j->prompt_valid);
    if (j->cfg->eval_samples > 0 && j->cfg->eval_samples < n) n = j->cfg->eval_samples;
    CAI_CALL(enter_phase(j, RL_PHASE_ROLLOUT));
    enum { CHUNK = 64 };
    double s[3] = {0, 0, 0};
    int64_t items[CHUNK];
    rl_sample smp[CHUNK];
    for (int64_t at = r; at < n;) {
        int m = 0;
        for (; m < CHUNK && at < n; at += dp) items[m++] = at;
        memset(smp, 0, sizeof smp);
        int64_t gen = 0;
        cai_status st = rollout(j, j->prompt_valid, items, m, 1, 1, 0, smp, &gen);
        for (int i = 0; i < m; i++) {
            s[0] += smp[i].exact;
            s[1] += smp[i].reward;
            s[2] += 1;
            free(smp[i].ids);
            free(smp[i].lp);
        }
        CAI_CALL(st);
    }
    CAI_CALL(cai_allreduce(cai_run_mesh(run), CAI_AXIS_DP, s, s, 3, CAI_DTYPE_F64, CAI_RED_SUM));
    *count = (int64_t)s[2];
    *acc = s[2] > 0 ? s[0] / s[2] : 0;
    *reward = s[2] > 0 ? s[1] / s[2] : 0;
    return CAI_OK;
}

/* ------------------------------------------------------------------ entry points */

cai_status rl_step(rl_job *j, cai_run_t *run, int64_t step, cai_step_stats *st) {
    if (j->cfg->algo == RL_RM || j->cfg->algo == RL_DPO) return pairs_step(j, run, step, st);
    return policy_step(j, run, step, st);
}

cai_status rl_evaluate(rl_job *j, cai_run_t *run, int64_t step, int *ran) {
    const rl_config *c = j->cfg;
    *ran = 0;
    const int pairs = c->algo == RL_RM || c->algo == RL_DPO;
    if (pairs ? !j->pref_valid : !j->prompt_valid) return CAI_OK;
    double acc = 0, extra = 0;
    int64_t count = 0;
    if (pairs) CAI_CALL(pairs_eval(j, run, &acc, &extra, &count));
    else CAI_CALL(prompts_eval(j, run, &acc, &extra, &count));
    cai_run_json(run, "\"kind\":\"rl_eval\",\"algo\":\"%s\",\"step\":%lld,\"accuracy\":%.9g,\"%s\":%.9g,\"count\":%lld",
                 rl_algo_names[c->algo], (long long)step, acc, pairs ? "margin" : "reward_mean", extra,
                 (long long)count);
    if (cai_run_rank(run) == 0) {
        printf("eval at step %lld | held-out %s %lld/%lld = %.1f%% | %s %.4f\n", (long long)step,
               pairs ? "pairs ranked right" : "exact match", (long long)llround(acc * (double)count), (long long)count,
               100.0 * acc, pairs ? "mean margin" : "mean reward", extra);
        fflush(stdout);
    }
    return CAI_OK;
}
