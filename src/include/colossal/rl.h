/* Alignment: the objectives of reward modelling, DPO/SimPO, GRPO and PPO,
 * their data, the verifiable rewards and the scalar (reward / value) head
 * (src/rl/, the layer above run and beside infer; colossal-rlhf drives
 * them). See docs/rlhf.md.
 *
 * The objectives are functions of per-token log-probabilities and of
 * scalars, not of the model: the model computes each target token's
 * cross-entropy (logp = -CE) and takes back d(objective)/d(logp) per token
 * (cai_model_set_objective), so one forward/backward serves every
 * algorithm under every parallel layout the model runs. Arrays are host,
 * row-major: R rows of T positions; mask[r*T+t] = 1 where position t of row
 * r is a response token that counts, 0 elsewhere (prompt, padding). Every
 * function writes the gradient of the loss it returns with respect to its
 * inputs (the outputs named d*), accumulating nothing. Nothing here is
 * collective. */
#ifndef COLOSSAL_RL_H
#define COLOSSAL_RL_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Metrics an objective reports (fields it has no notion of stay 0). */
typedef struct {
    double loss;
    double accuracy;      /* rm, dpo: fraction of pairs with chosen scored above rejected */
    double margin;        /* rm: mean r_chosen - r_rejected; dpo: mean reward margin */
    double chosen_reward; /* dpo: mean beta * (pi_c - ref_c) (SimPO: its own reward) */
    double rejected_reward;
    double kl;            /* grpo: mean k3 estimate over counted tokens; ppo: mean logp_old - logp_ref */
    double clip_fraction; /* grpo, ppo: fraction of counted tokens whose ratio was clipped */
    double value_clip_fraction;
    double entropy_proxy; /* grpo, ppo: mean -logp over counted tokens */
    int64_t tokens;       /* counted tokens (mask sum) */
} cai_rl_stats;

/* ------------------------------------------------------------ reward model
 * Bradley-Terry: loss = mean over pairs of -log sigmoid(r_c - r_r). */
cai_status cai_rl_rm_loss(int n_pairs, const float *r_chosen, const float *r_rejected, float *d_chosen,
                          float *d_rejected, cai_rl_stats *stats);

/* -------------------------------------------------------------- DPO / SimPO
 * Inputs per pair: the summed response log-probs of the policy (pi_*) and
 * of the reference (ref_*; unused by SimPO) and the response lengths.
 * dpo:   h = beta * ((pi_c - ref_c) - (pi_r - ref_r))
 * simpo: h = beta * (pi_c / len_c - pi_r / len_r) - gamma
 * loss = mean over pairs of -(1 - eps) log sigmoid(h) - eps log sigmoid(-h)
 * (eps = label_smoothing, the conservative DPO of cDPO / TRL). */
typedef enum { CAI_RL_DPO = 0, CAI_RL_SIMPO } cai_rl_pref_loss;
typedef struct {
    cai_rl_pref_loss kind;
    double beta;            /* default 0.1 (dpo), 2.0 (simpo) */
    double label_smoothing; /* in [0, 0.5) */
    double gamma;           /* simpo's target margin, default 0.5 */
} cai_rl_dpo_config;
cai_rl_dpo_config cai_rl_dpo_config_default(cai_rl_pref_loss kind);
cai_status cai_rl_dpo_config_check(const cai_rl_dpo_config *c);
/* d_pi_c / d_pi_r: the gradient with respect to each summed log-prob (every
 * response token of the sequence receives it as its d(logp)). */
cai_status cai_rl_dpo_loss(const cai_rl_dpo_config *c, int n_pairs, const double *pi_c, const double *pi_r,
                           const double *ref_c, const double *ref_r, const int64_t *len_c, const int64_t *len_r,
                           float *d_pi_c, float *d_pi_r, cai_rl_stats *stats);

/* ------------------------------------------------------------ policy losses
 * Token-level clipped surrogate (PPO, GRPO): with ratio = exp(logp -
 * logp_old) and the row's (GRPO) or token's (PPO) advantage A,
 *   l_t = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
 *         + kl_coef * k3_t,   k3_t = exp(ref - logp) - (ref - logp) - 1
 * aggregated as agg says over the counted tokens of the R rows. */
typedef enum {
    CAI_RL_AGG_TOKEN_MEAN = 0, /* sum over all counted tokens / their count (DAPO) */
    CAI_RL_AGG_SEQ_MEAN,       /* mean over rows of each row's token mean (GRPO's paper) */
    CAI_RL_AGG_SUM_NORM        /* sum over tokens / (R * norm_len) (Dr. GRPO) */
} cai_rl_agg;
typedef struct {
    double clip_low, clip_high; /* default 0.2, 0.2 (DAPO's clip-higher: 0.2, 0.28) */
    double kl_coef;             /* default 0 (PPO puts the KL in the reward), GRPO 0.04 */
    cai_rl_agg agg;
    double norm_len; /* CAI_RL_AGG_SUM_NORM's constant length (the max response length) */
    double denominator; /* > 0: divide the summed token losses by this instead (the counted
                         * tokens of the whole global batch, so microbatches and replicas
                         * add up to the global token mean); 0: agg as above */
} cai_rl_policy_config;
cai_rl_policy_config cai_rl_policy_config_default(void);
cai_status cai_rl_policy_config_check(const cai_rl_policy_config *c);
/* adv: [R] per row when adv_per_token is 0 (GRPO), [R*T] when 1 (PPO).
 * logp_ref may be NULL when kl_coef is 0. Writes dlogp [R*T] (0 where mask
 * is 0). */
cai_status cai_rl_policy_loss(const cai_rl_policy_config *c, int R, int T, const float *logp, const float *logp_old,
                              const float *logp_ref, const float *adv, int adv_per_token, const uint8_t *mask,
                              float *dlogp, cai_rl_stats *stats);

/* ---------------------------------------------------------- advantages, GAE
 * GRPO: rewards of n_groups groups of G samples each ([n_groups*G], group
 * members adjacent); adv = (r - group mean) / (group std + eps) with
 * scale_std (population std, as TRL and DeepSeekMath), r - mean without it.
 * keep[g] (may be NULL) = 0 for groups whose rewards are all equal (their
 * advantages are 0: DAPO drops them from the batch). */
cai_status cai_rl_group_advantages(int n_groups, int G, const float *rewards, int scale_std, float eps, float *adv,
                                   uint8_t *keep);
/* PPO: per row, the token rewards [R*T] and values [R*T] over the counted
 * positions (masked positions skipped, the last counted token's next value
 * 0) give GAE advantages and returns (adv + value), both [R*T], 0 where
 * mask is 0. whiten: advantages normalised to mean 0, std 1 over counted
 * tokens. */
cai_status cai_rl_gae(int R, int T, const float *rewards, const float *values, const uint8_t *mask, double gamma,
                      double lambda, int whiten, float *adv, float *returns);
/* PPO's token rewards: -kl_coef * (logp_old - logp_ref) at every counted
 * token plus score[r] at the row's last counted token. */
cai_status cai_rl_token_rewards(int R, int T, const float *score, const float *logp_old, const float *logp_ref,
                                const uint8_t *mask, double kl_coef, float *rewards);
/* Clipped value loss: 0.5 * mean over counted tokens of max((v - ret)^2,
 * (v_old + clip(v - v_old, -clip, clip) - ret)^2); dvalues [R*T]. */
cai_status cai_rl_value_loss(int R, int T, const float *values, const float *values_old, const float *returns,
                             const uint8_t *mask, double clip, float *dvalues, cai_rl_stats *stats);

/* ------------------------------------------------------------ scalar head
 * A linear map from the final normed hidden state to one number per
 * position, score = h . w (no bias, transformers' *ForSequenceClassification
 * `score.weight` [1, C]); the reward model reads it at a row's last token,
 * the critic at every response token. F32 weights, gradient and AdamW state
 * of its own (C floats each); nothing is collective (the caller averages
 * the gradient over data-parallel replicas, cai_rl_head_grad). */
typedef struct cai_rl_head cai_rl_head_t;
/* Initialised from N(0, std) with seed (std 0: zeros). */
cai_status cai_rl_head_create(cai_rl_head_t **out, int64_t C, float std, uint64_t seed);
void cai_rl_head_free(cai_rl_head_t *h);
int64_t cai_rl_head_width(const cai_rl_head_t *h);
/* hidden: host [N, C]; out [N]. */
cai_status cai_rl_head_forward(const cai_rl_head_t *h, int64_t N, const float *hidden, float *out);
/* d(out) [N] -> d(hidden) [N, C] (overwritten) and the weight gradient
 * (accumulated). */
cai_status cai_rl_head_backward(cai_rl_head_t *h, int64_t N, const float *hidden, const float *dout, float *dhidden);
/* The weight, its gradient and the AdamW moments (each [C]), for
 * checkpoints, gradient reduction and tests. */
void cai_rl_head_tensors(cai_rl_head_t *h, float **w, float **grad, float **m, float **v);
void cai_rl_head_zero_grad(cai_rl_head_t *h);
/* AdamW step `step` (1-based) with the given hyperparameters on w; the
 * gradient is multiplied by grad_scale first (clipping's factor). */
cai_status cai_rl_head_adamw(cai_rl_head_t *h, int64_t step, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float grad_scale);

/* ------------------------------------------------- data and rewards
 * (rl_data.c, rewards.c) */

#ifdef __cplusplus
}
#endif
#endif
