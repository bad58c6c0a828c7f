/* colossal-rlhf's job, shared by its parts: rlhf.c (the keys, building the
 * models and the data, the run's hooks, main) and rlhf_algo.c (the
 * objective the model calls and the step of each algorithm). */
#ifndef COLOSSAL_APP_RLHF_H
#define COLOSSAL_APP_RLHF_H

#include <stdint.h>

#include "app_common.h"
#include "colossal/data.h"
#include "colossal/infer.h"
#include "colossal/rl.h"
#include "colossal/run.h"
#include "train_common.h"

enum { RL_RM = 0, RL_DPO, RL_GRPO, RL_PPO, RL_ALGO_COUNT };
enum { RL_PLACE_AUTO = 0, RL_PLACE_DEVICE, RL_PLACE_HOST };
/* grpo and ppo: rollouts read whole working weights, which stage 3 shards */
enum { RL_POLICY_MAX_ZERO = 2 };
extern const char *const rl_algo_names[];

typedef struct {
    char *model_path, *tokenizer, *eos;
    int act_ckpt, dp, tp;
    double watchdog;
    int algo;
    char *train_path, *valid_path, *chat_template;
    int overflow;
    int64_t steps, seed;
    double epochs;
    int micro_batch, grad_accum, seq_len;
    int64_t eval_interval;
    int eval_samples;
    /* dpo */
    int dpo_loss;
    double dpo_beta, dpo_smoothing, dpo_gamma;
    /* rm, ppo: the scalar head */
    double head_std;
    /* grpo, ppo */
    int prompts, group, passes, agg, scale_std, filter;
    double clip_low, clip_high, kl_coef;
    int max_new, top_k;
    double temperature, top_p;
    char *stop, *rewards;
    char *reward_model; /* an rm run's checkpoint scoring rollouts (resolved to its file); empty: none */
    double rm_weight;
    int64_t kv_memory;
    int placement; /* RL_PLACE_*: the frozen models' weights and the rollout pool */
    double gamma, lambda, vf_coef, value_clip;
    int whiten;
    tc_options tr;
    cai_run_options run;
    cai_app_common common;
} rl_config;

/* What the objective does with the forward it is handed. */
typedef enum {
    RL_MODE_RECORD = 0, /* keep each microbatch's log-probs (and values) for later; no gradient */
    RL_MODE_RM,
    RL_MODE_DPO,
    RL_MODE_POLICY /* grpo and ppo: the clipped surrogate (ppo: plus the value loss) */
} rl_mode;

/* Per-step statistics summed over microbatches (weights: pairs or tokens). */
typedef struct {
    double pairs, acc, margin, chosen, rejected;
    double tokens, kl, clip, vclip, nlogp;
} rl_sums;

typedef struct {
    const rl_config *cfg;
    cai_app_model_source src;
    cai_hf_t *h;
    char tokdir[4096];
    cai_bpe_t *bpe;
    int32_t eos;
    cai_chat_template_t *tmpl;
    cai_rl_pref_set_t *pref_train, *pref_valid;
    cai_rl_prompt_set_t *prompt_train, *prompt_valid;
    cai_rl_reward_spec rewards;
    int exact_part; /* the spec's exact_match part (accuracy), -1: none */

    tc_engine eng;
    cai_model_t *ref;            /* frozen reference (dpo; grpo and ppo with a KL term) */
    cai_rl_head_t *head;         /* rm: the reward head; ppo: the value head */
    cai_engine_t *gen;           /* grpo, ppo: rollouts over the policy's weights */
    cai_weights_t *gen_w;        /* zero.stage 1-2: the ZeRO engine's working weights the rollouts read */
    cai_app_model_source rm_src; /* reward.model: the rm checkpoint */
    float *rm_w;                 /* its score head's weight, read before anything is built */
    cai_model_t *rm;             /* the frozen reward model (the policy's architecture) */
    cai_rl_head_t *rm_head;
    float *rm_scores;          /* [n_micro * B]: the reward model's score of each rollout row */
    int frozen_on_host;        /* ref and rm in host memory except while they score; the pool only in rollouts */
    double device_used_mib[3]; /* a GPU's memory in use at the end of the step's rollout, scoring and update */
    double swap_s;             /* the step's seconds moving frozen weights and the pool (placement.frozen=host) */
    int64_t steps;
    int64_t optim_steps; /* updates a run makes (grpo/ppo: passes per step) */

    /* One step's microbatches: n_micro of [B, T]. */
    int B, T, n_micro;
    int32_t *tok, *tgt;
    uint8_t *mask;        /* [n_micro * B * T]: positions whose target counts */
    int32_t *last;        /* [n_micro * B]: rm: the row's last token */
    float *rec, *rec_val; /* RL_MODE_RECORD's output: log-probs, values */
    float *old_logp, *ref_logp, *old_val;
    float *samp_logp;            /* grpo, ppo: [n_micro * B * T] the rollout engine's log-prob of each counted target */
    int pass;                    /* grpo, ppo: the optimisation pass over the step's rollouts (0: the first) */
    double samp_diff, ratio_dev; /* the step's max |logp - samp_logp| and first-pass max |ratio - 1| */
    float *adv;                  /* grpo: [n_micro * B] per row; ppo: [n_micro * B * T] */
    float *ret;                  /* ppo: returns */
    float *scores;               /* grpo, ppo: [n_micro * B] row rewards */
    float *logp, *dlogp, *val, *dval, *hrow; /* objective scratch */
    double *pi, *refsum;                     /* dpo: per row */
    float *dpi, *rwd;                        /* dpo / rm: per pair */
    double count_scale;                      /* policy: this rank's microbatch count / the global count */
    double global_count;
    int64_t *mb_count; /* policy: each microbatch's counted tokens (or rows) */

    rl_mode mode;
    int mb; /* the microbatch the next objective call is */
    cai_model_t *rec_model;
    rl_sums sums;
    cai_sampling_params sp;
    cai_sample_ws_t *ws;
} rl_job;

/* rlhf_algo.c */
cai_status rl_objective(void *ctx, cai_model_objective_io *io);
cai_status rl_step(rl_job *j, cai_run_t *run, int64_t step, cai_step_stats *st);
cai_status rl_evaluate(rl_job *j, cai_run_t *run, int64_t step, int *ran);

#endif
