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
    double norm_len;    /* CAI_RL_AGG_SUM_NORM's constant length (the max response length) */
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
 * scale_std (the population std; TRL and verl take torch.std, which divides
 * by G - 1), r - mean without it.
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

/* A reward model's scores: B rows of T tokens (host) through the model m
 * (one forward, no backward; m's objective is replaced), each scored by
 * the head at its position last[b] as the reward model's training read it
 * (a row's last token); last[b] < 0 marks an empty row, scored 0. m's
 * batch and sequence length must be B and T. Collective as m's forward. */
typedef struct cai_model cai_model_t;
cai_status cai_rl_head_score_rows(const cai_rl_head_t *h, cai_model_t *m, int B, int T, const int32_t *tokens,
                                  const int32_t *last, float *scores);

/* ------------------------------------------------- data and rewards
 * (rl_data.c, rewards.c) */

/* Preference pairs, one JSONL line each, in one of two spellings:
 *   {"context": [messages], "chosen": [messages], "rejected": [messages]}   (ColossalChat)
 *   {"prompt": "..." | [messages], "chosen": "..." | [messages], "rejected": ...}  (TRL)
 * Messages are {"role"|"from", "content"|"value"} as in chat JSONL (roles
 * system, user/human, assistant/gpt). A string prompt is one user turn, a
 * string response one assistant turn. The context is valid chat (an
 * optional system turn first, user and assistant alternating from the
 * user) and ends with a user turn; chosen and rejected are non-empty runs
 * of assistant turns. Other keys are ignored. Blank lines are skipped.
 * Failures are CAI_ERR_FORMAT "FILE:LINE: field 'rejected': ...". */
typedef struct {
    cai_chat_message *context, *chosen, *rejected;
    int n_context, n_chosen, n_rejected;
} cai_rl_pref;
cai_status cai_rl_pref_parse_line(const char *file, int64_t line, const char *text, size_t len, cai_rl_pref *out);
void cai_rl_pref_free(cai_rl_pref *p); /* frees and zeroes; zeroed ok */
/* Each side is cai_sft_encode(context + side): both start with the same
 * context tokens (the prompt colossal-infer would build) and their masks
 * mark the response tokens. */
cai_status cai_rl_pref_encode(const cai_chat_template_t *t, cai_bpe_t *tok, const cai_rl_pref *p,
                              cai_sft_tokens *chosen, cai_sft_tokens *rejected);
/* The overflow policy for a pair: a side of n tokens fits when n - 1 <=
 * seq_len (cai_sft_fit). CAI_SFT_TRUNCATE cuts the end of a longer side's
 * response; the pair is dropped when a side keeps no response token.
 * CAI_SFT_DROP drops the pair when either side is too long. */
cai_sft_fit_result cai_rl_pref_fit(cai_sft_tokens *chosen, cai_sft_tokens *rejected, int64_t seq_len,
                                   cai_sft_overflow policy);

/* A file of pairs, tokenized (tok NULL: bytes). The first bad line fails
 * the load, naming it. Not collective; not thread-safe on one tok. */
typedef struct cai_rl_pref_set cai_rl_pref_set_t;
typedef struct {
    int64_t lines;                    /* pairs read */
    int64_t kept, truncated, dropped; /* truncated pairs are among the kept */
} cai_rl_data_stats;
cai_status cai_rl_pref_set_load(const char *path, const cai_chat_template_t *t, cai_bpe_t *tok, int64_t seq_len,
                                cai_sft_overflow overflow, cai_rl_pref_set_t **out);
int64_t cai_rl_pref_set_size(const cai_rl_pref_set_t *s);
cai_status cai_rl_pref_set_pair(const cai_rl_pref_set_t *s, int64_t i, const cai_sft_tokens **chosen,
                                const cai_sft_tokens **rejected);
void cai_rl_pref_set_stats(const cai_rl_pref_set_t *s, cai_rl_data_stats *out);
void cai_rl_pref_set_free(cai_rl_pref_set_t *s); /* NULL ok */

/* Prompts for generation (GRPO, PPO), one JSONL line each:
 *   {"messages": [... ending with a user turn], "answer": "42"}
 *   {"prompt": "...", "answer": 42}
 * "answer" is optional (a string or a number, kept as text; null: none).
 * The messages follow the context rules above. */
typedef struct {
    cai_chat_message *messages;
    int n_messages;
    char *answer; /* NULL: none */
} cai_rl_prompt;
cai_status cai_rl_prompt_parse_line(const char *file, int64_t line, const char *text, size_t len, cai_rl_prompt *out);
void cai_rl_prompt_free(cai_rl_prompt *p); /* frees and zeroes; zeroed ok */
/* The prompt exactly as colossal-infer builds a chat request's: the
 * template's rendering with the generation prompt (appended to text) and
 * its tokens, special tokens recognised (appended to ids; tok NULL:
 * bytes). */
cai_status cai_rl_prompt_encode(const cai_chat_template_t *t, cai_bpe_t *tok, const cai_chat_message *msgs, int n,
                                cai_byte_buf *text, cai_token_buf *ids);

/* A file of prompts, tokenized; prompts of more than max_prompt_len tokens
 * (<= 0: no limit) are counted as dropped and left out. */
typedef struct cai_rl_prompt_set cai_rl_prompt_set_t;
cai_status cai_rl_prompt_set_load(const char *path, const cai_chat_template_t *t, cai_bpe_t *tok,
                                  int64_t max_prompt_len, cai_rl_prompt_set_t **out);
int64_t cai_rl_prompt_set_size(const cai_rl_prompt_set_t *s);
/* Item i's tokens, rendered text and answer (NULL when the line had none);
 * the pointers live as long as the set. */
cai_status cai_rl_prompt_set_get(const cai_rl_prompt_set_t *s, int64_t i, const int32_t **ids, int64_t *n,
                                 const char **text, const char **answer);
void cai_rl_prompt_set_stats(const cai_rl_prompt_set_t *s, cai_rl_data_stats *out); /* truncated stays 0 */
void cai_rl_prompt_set_free(cai_rl_prompt_set_t *s);                                /* NULL ok */

/* ------------------------------------------------------------ rewards
 * Verifiable rewards of a response, by name. Builtins:
 *   exact_match  1 when the response's final answer equals the reference
 *                answer, else 0. The final answer is the number after the
 *                last "The answer is" (any case) when there is one, else
 *                the last number in the text (commas between digits and
 *                a leading '-' belong to it); numbers compare as numbers
 *                after commas and a trailing '.' are stripped, other
 *                answers as trimmed strings. A NULL reference is
 *                CAI_ERR_INVALID_ARG.
 *   format       1 when the trimmed response is exactly "The answer is
 *                <integer>." (the embedded instruction set's form), else 0.
 * A function writes a reward to *reward; ctx is the one registered. */
#define CAI_RL_MAX_REWARDS 8
typedef cai_status (*cai_rl_reward_fn)(void *ctx, const char *prompt, const char *response, const char *answer,
                                       double *reward);
/* Adds a reward to the registry (a name taken is refused). The registry is
 * process-wide: register before parsing specs, from one thread. */
cai_status cai_rl_reward_register(const char *name, cai_rl_reward_fn fn, void *ctx);
/* The registry's names, comma separated, for messages (cap bytes). */
void cai_rl_reward_names(char *buf, size_t cap);

/* A weighted sum of rewards: names[i] with weights[i]. */
typedef struct {
    int n;
    char *names[CAI_RL_MAX_REWARDS];
    double weights[CAI_RL_MAX_REWARDS];
    cai_rl_reward_fn fns[CAI_RL_MAX_REWARDS];
    void *ctxs[CAI_RL_MAX_REWARDS];
} cai_rl_reward_spec;
/* "exact_match,format:0.1": comma-separated name[:weight], the weight a
 * finite number (default 1). Unknown names (the message lists the known
 * ones), empty or malformed tokens and repeated names are refused
 * (CAI_ERR_CONFIG). */
cai_status cai_rl_reward_spec_parse(const char *spec, cai_rl_reward_spec *out);
int cai_rl_reward_spec_find(const cai_rl_reward_spec *s, const char *name); /* index or -1 */
/* total = sum of weights[i] * reward i; parts[i] (may be NULL) the
 * unweighted rewards. */
cai_status cai_rl_reward_spec_eval(const cai_rl_reward_spec *s, const char *prompt, const char *response,
                                   const char *answer, double *total, double *parts);
void cai_rl_reward_spec_free(cai_rl_reward_spec *s); /* zeroed spec ok */
/* The builtins themselves (ctx unused), and the final answer the
 * exact_match reward reads from a response (cap bytes; "" when none). */
cai_status cai_rl_reward_exact_match(void *ctx, const char *prompt, const char *response, const char *answer,
                                     double *reward);
cai_status cai_rl_reward_format(void *ctx, const char *prompt, const char *response, const char *answer,
                                double *reward);
void cai_rl_extract_answer(const char *response, char *buf, size_t cap);

/* ------------------------------------------------------------ embedded examples
 * From cai_sft_example_conversation (same config, same split, and as in
 * cai_sft_example_write a training line whose question is also a held-out
 * question, cai_sft_example_held_questions, is left out): the arithmetic
 * conversations only. Prompt lines {"messages": [user turn],
 * "answer": "N"}; preference lines {"context": [user turn], "chosen":
 * [assistant "The answer is N."], "rejected": [assistant "The answer is
 * M."]} with M a wrong number fixed by (seed, i), or (about one pair in
 * five) a malformed answer instead. Either path may be NULL to skip it;
 * *n_train / *n_held (may be NULL) count the lines. Written under
 * temporary names and renamed. Deterministic. */
cai_status cai_rl_example_prompts_write(const cai_sft_example_config *cfg, const char *train_path,
                                        const char *held_path, int64_t *n_train, int64_t *n_held);
cai_status cai_rl_example_prefs_write(const cai_sft_example_config *cfg, const char *train_path, const char *held_path,
                                      int64_t *n_train, int64_t *n_held);

#ifdef __cplusplus
}
#endif
#endif
