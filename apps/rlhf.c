/* colossal-rlhf: alignment of a GPT-2 or Llama model (usually one
 * colossal-sft made): a reward model, DPO / SimPO, GRPO with verifiable
 * rewards, or PPO.
 *
 *   mpirun -np N colossal-rlhf --rlhf.algo rm|dpo|grpo|ppo --model.path DIR_OR_CHECKPOINT --data.train FILE
 *
 * rm and dpo read preference JSONL (context, chosen, rejected); grpo and
 * ppo read prompt JSONL (messages or prompt, and the answer the rewards
 * check). The policy trains in colossal-pretrain's engine (train_common.h:
 * dp with ZeRO, tp) through an objective the model hands each forward to
 * (cai_model_set_objective); the reference is a frozen copy of
 * model.path; rollouts come from the inference engine reading the
 * policy's weights in place; the run module does the rest of the job
 * (signals, memory plan, checkpoints and resume, metrics.jsonl). See
 * docs/rlhf.md. */
#include "cai_config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colossal/ckpt.h"
#include "rlhf.h"

const char *const rl_algo_names[] = {"rm", "dpo", "grpo", "ppo", NULL};
static const char *const k_pref_losses[] = {"dpo", "simpo", NULL};
static const char *const k_aggs[] = {"token_mean", "seq_mean", "sum_norm", NULL};
static const char *const k_places[] = {"auto", "device", "host", NULL};

/* ------------------------------------------------------------------ config */

#define F(key, type, field, def, doc, ...) \
    { key, type, offsetof(rl_config, field), def, doc, __VA_ARGS__, NULL, NULL }
#define S(key, field, def, doc) F(key, CAI_CFG_STRING, field, def, doc, CAI_CFG_NO_RANGE)
#define E(key, field, def, doc, choices) \
    { key, CAI_CFG_ENUM, offsetof(rl_config, field), def, doc, CAI_CFG_NO_RANGE, choices, NULL }
#define BIG 1e15

static const cai_config_field k_fields[] = {
    E("rlhf.algo", algo, "grpo",
      "rm (reward model on preference pairs), dpo (DPO or SimPO on preference pairs), grpo (group-relative policy "
      "optimisation with verifiable rewards) or ppo (actor-critic with a value head and GAE)",
      rl_algo_names),
    S("model.path", model_path, "",
      "Hugging Face directory or colossal checkpoint (file, or directory with `latest`): the policy's start and the "
      "frozen reference"),
    S("model.tokenizer", tokenizer, "",
      "tokenizer directory; empty: model.path's, or for a checkpoint its run directory's tokenizer/"),
    S("model.eos", eos, "<|endoftext|>", "end-of-text token (finishes a rollout); absent from the tokenizer: none"),
    F("model.activation_checkpointing", CAI_CFG_BOOL, act_ckpt, "false",
      "keep only each layer's input and recompute it in backward", CAI_CFG_NO_RANGE),
    F("mesh.dp", CAI_CFG_INT, dp, "0", "data-parallel ranks; 0: world / mesh.tp", 0, 1 << 20),
    F("mesh.tp", CAI_CFG_INT, tp, "1", "tensor-parallel ranks", 1, 1 << 20),
    F("mesh.watchdog_timeout", CAI_CFG_DOUBLE, watchdog, "300",
      "seconds a collective may stall before every rank aborts naming the late one; 0: off", 0, 1e9),

    S("data.train", train_path, "",
      "rm, dpo: preference JSONL ({context, chosen, rejected} or {prompt, chosen, rejected}); grpo, ppo: prompt "
      "JSONL ({messages | prompt, answer}); docs/rlhf.md"),
    S("data.valid", valid_path, "",
      "held-out file of the same kind: pairs ranked right (rm, dpo) or exact-match accuracy of greedy answers "
      "(grpo, ppo); empty: none"),
    S("data.chat_template", chat_template, "plain", "chatml, llama3, plain, or a template file (docs/sft.md)"),
    {"data.overflow", CAI_CFG_ENUM, offsetof(rl_config, overflow), "truncate",
     "a pair longer than train.seq_len: truncate or drop it (counted and reported)", CAI_CFG_NO_RANGE,
     cai_sft_overflow_names, NULL},

    F("train.steps", CAI_CFG_INT64, steps, "0",
      "steps (rm, dpo: optimizer steps; grpo, ppo: rollout batches); 0: train.epochs worth of pairs or prompts", 0,
      BIG),
    F("train.epochs", CAI_CFG_DOUBLE, epochs, "1", "passes over data.train when train.steps is 0", 1e-9, 1e9),
    F("train.micro_batch", CAI_CFG_INT, micro_batch, "4",
      "rm, dpo: pairs per forward (two rows each); grpo, ppo: rows per forward", 1, 1 << 20),
    F("train.grad_accum", CAI_CFG_INT, grad_accum, "1", "rm, dpo: microbatches per step on each rank", 1, 1 << 20),
    F("train.seq_len", CAI_CFG_INT, seq_len, "0",
      "tokens per row; 0: the model's maximum (grpo, ppo: prompt + rollout.max_new_tokens must fit)", 0, 1 << 20),
    F("train.seed", CAI_CFG_INT64, seed, "1234", "data order and rollout sampling seed", 0, BIG),

    E("dpo.loss", dpo_loss, "dpo", "dpo (against the reference) or simpo (reference-free, length-normalised)",
      k_pref_losses),
    F("dpo.beta", CAI_CFG_DOUBLE, dpo_beta, "0.1", "inverse temperature of the implicit reward (simpo: try 2)", 1e-9,
      1e6),
    F("dpo.label_smoothing", CAI_CFG_DOUBLE, dpo_smoothing, "0", "assumed label noise (conservative DPO), [0, 0.5)", 0,
      0.4999),
    F("dpo.gamma", CAI_CFG_DOUBLE, dpo_gamma, "0.5", "simpo: target reward margin", 0, 1e6),
    F("rm.head_std", CAI_CFG_DOUBLE, head_std, "0",
      "rm, ppo: the scalar head's initial N(0, std) weights; 0: zeros (every score starts at 0)", 0, 10),

    F("rollout.prompts", CAI_CFG_INT, prompts, "8", "grpo, ppo: prompts per step over all replicas", 1, 1 << 20),
    F("rollout.samples", CAI_CFG_INT, group, "4", "grpo, ppo: responses per prompt (grpo's group size)", 1, 1 << 16),
    F("rollout.passes", CAI_CFG_INT, passes, "1", "grpo, ppo: optimizer steps over each rollout batch", 1, 1 << 16),
    F("rollout.max_new_tokens", CAI_CFG_INT, max_new, "16", "grpo, ppo: response length limit", 1, 1 << 20),
    F("rollout.temperature", CAI_CFG_DOUBLE, temperature, "1.0",
      "grpo, ppo: sampling temperature (the training forward scores logits / temperature)", 1e-6, 100),
    F("rollout.top_p", CAI_CFG_DOUBLE, top_p, "1.0", "grpo, ppo: nucleus sampling, (0, 1]", 1e-6, 1),
    F("rollout.top_k", CAI_CFG_INT, top_k, "0", "grpo, ppo: top-k sampling; 0: off", 0, 1 << 24),
    S("rollout.stop", stop, "\n", "grpo, ppo: a stop string ending a response (empty: none)"),
    {"rollout.kv_memory", CAI_CFG_BYTES, offsetof(rl_config, kv_memory), "auto",
     "grpo, ppo: the rollout engine's KV-cache pool; auto: half the GPU memory free after the models are built "
     "(256 MiB on the host)",
     CAI_CFG_NO_RANGE, cai_config_bytes_auto, NULL},
    E("placement.frozen", placement, "auto",
      "grpo, ppo: where the reference's and reward model's weights wait between scorings; device: always in device "
      "memory beside the rollout KV pool; host: in host memory while the pool rolls out, and the pool given back "
      "while they score and the policy trains (the two take turns); auto: device when the memory plan fits "
      "train.mem_limit, else host",
      k_places),
    S("reward.functions", rewards, "exact_match,format:0.1",
      "grpo, ppo: verifiable rewards summed with weights, name[:weight] comma-separated (exact_match, format); "
      "empty with reward.model: none"),
    S("reward.model", reward_model, "",
      "grpo, ppo: a reward model (an rlhf.algo=rm run's checkpoint: file, or directory with `latest`; the policy's "
      "architecture and vocabulary) whose score of prompt + response, times reward.model_weight, is added to the "
      "verifiable rewards; empty: none"),
    F("reward.model_weight", CAI_CFG_DOUBLE, rm_weight, "1", "grpo, ppo: the reward model's score's weight", -1e6, 1e6),
    F("policy.clip_low", CAI_CFG_DOUBLE, clip_low, "0.2", "grpo, ppo: ratio clip below 1", 0, 1),
    F("policy.clip_high", CAI_CFG_DOUBLE, clip_high, "0.2", "grpo, ppo: ratio clip above 1 (DAPO: 0.28)", 0, 10),
    F("policy.kl_coef", CAI_CFG_DOUBLE, kl_coef, "0.04",
      "grpo: k3 KL-to-reference coefficient in the loss; ppo: per-token KL penalty in the reward; 0: no reference", 0,
      1e3),
    E("grpo.loss_agg", agg, "token_mean",
      "token_mean (every counted token of the batch weighs the same, DAPO), seq_mean (each response's mean, GRPO) "
      "or sum_norm (sum over max_new_tokens, Dr. GRPO)",
      k_aggs),
    F("grpo.scale_std", CAI_CFG_BOOL, scale_std, "true", "divide group advantages by the group's std",
      CAI_CFG_NO_RANGE),
    F("grpo.filter_groups", CAI_CFG_BOOL, filter, "false",
      "drop groups whose rewards are all equal from the update (DAPO dynamic sampling's filter)", CAI_CFG_NO_RANGE),
    F("ppo.gamma", CAI_CFG_DOUBLE, gamma, "1.0", "discount", 0, 1),
    F("ppo.lambda", CAI_CFG_DOUBLE, lambda, "0.95", "GAE lambda", 0, 1),
    F("ppo.vf_coef", CAI_CFG_DOUBLE, vf_coef, "0.1", "value loss coefficient", 0, 1e6),
    F("ppo.value_clip", CAI_CFG_DOUBLE, value_clip, "0.2", "value clip around the old values", 0, 1e6),
    F("ppo.whiten", CAI_CFG_BOOL, whiten, "true", "normalise advantages over the batch's counted tokens",
      CAI_CFG_NO_RANGE),

    TC_OPTIM_FIELDS(rl_config, tr, "1e-5", "1e-6"),
    TC_ZERO_FIELDS(rl_config, tr),

    F("eval.interval", CAI_CFG_INT64, eval_interval, "0",
      "held-out evaluation every this many steps, before the first and at the end; 0: before and at the end", 0, BIG),
    F("eval.samples", CAI_CFG_INT, eval_samples, "0", "grpo, ppo: held-out prompts scored; 0: all", 0, 1 << 30),

    CAI_RUN_FIELDS(rl_config, run, "runs/rlhf"),
    CAI_APP_COMMON_FIELDS(rl_config, common),
};
#undef F
#undef S
#undef E
#undef BIG

static const cai_config_schema k_schema = {"colossal-rlhf",
                                           "align a GPT-2 or Llama model: reward model, DPO/SimPO, GRPO or PPO",
                                           k_fields, CAI_CFG_NFIELDS(k_fields)};

/* ------------------------------------------------------------------ checks */

static int is_policy(const rl_config *c) { return c->algo == RL_GRPO || c->algo == RL_PPO; }

/* Decided from the config alone, alike on every rank. */
static cai_status check_config(const rl_config *c, int world, cai_layout *L) {
    *L = (cai_layout){1, c->dp ? c->dp : (world % c->tp ? 0 : world / c->tp), 1, 1, c->tp, NULL};
    CAI_CALL(cai_layout_validate(world, L, NULL));
    if (!*c->model_path) return CAI_ERROR(CAI_ERR_CONFIG, "model.path is required (an SFT'd model, usually)");
    if (!*c->train_path)
        return CAI_ERROR(CAI_ERR_CONFIG, "data.train is required (%s JSONL)", is_policy(c) ? "prompt" : "preference");
    if (c->tr.fp8) return CAI_ERROR(CAI_ERR_UNSUPPORTED, "fp8.enabled=true: colossal-rlhf trains in bf16/f32");
    if (*c->reward_model && !is_policy(c))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "reward.model=%s with rlhf.algo=%s: a reward model scores grpo and ppo rollouts only",
                         c->reward_model, rl_algo_names[c->algo]);
    if (c->placement == RL_PLACE_HOST && !is_policy(c))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "placement.frozen=host with rlhf.algo=%s: frozen models take turns with the rollout pool "
                         "of grpo and ppo only",
                         rl_algo_names[c->algo]);
    if (is_policy(c)) {
        if (c->tr.zero_stage > RL_POLICY_MAX_ZERO)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "rlhf.algo=%s with zero.stage=%d: rollouts read the policy's whole working weights in "
                             "place, which zero.stage=3 keeps sharded; use zero.stage <= %d (with zero.offload if "
                             "memory is short; rm and dpo take every stage)",
                             rl_algo_names[c->algo], c->tr.zero_stage, RL_POLICY_MAX_ZERO);
        if (c->prompts % L->dp != 0)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "rollout.prompts=%d is not a multiple of mesh.dp=%d (each replica "
                             "takes as many)",
                             c->prompts, L->dp);
        if (c->grad_accum != 1)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "train.grad_accum=%d with rlhf.algo=%s: a step's microbatches are its rollouts "
                             "(rollout.prompts x rollout.samples rows in train.micro_batch-row pieces)",
                             c->grad_accum, rl_algo_names[c->algo]);
        if (c->algo == RL_GRPO && c->group < 2)
            return CAI_ERROR(CAI_ERR_CONFIG, "rollout.samples=%d: grpo's advantages compare a group of >= 2", c->group);
    }
    return CAI_OK;
}

/* ------------------------------------------------------------------ source, tokenizer, data */

static cai_status open_source(rl_job *j) {
    const rl_config *c = j->cfg;
    CAI_CALL(cai_app_model_source_open(c->model_path, &j->src));
    if (j->src.hf) CAI_CALL(cai_hf_open(&j->h, c->model_path));
    j->eos = -1;
    if (strcmp(c->tokenizer, "bytes") == 0) {
        j->eos = CAI_BYTE_EOD;
        return CAI_OK;
    }
    CAI_CALL(cai_app_model_tokenizer_dir(&j->src, c->model_path, c->tokenizer, j->tokdir, sizeof j->tokdir));
    CAI_CALL(cai_bpe_load_dir(j->tokdir, &j->bpe));
    /* as colossal-infer: the end-of-text token the vocabulary spells is special */
    if (*c->eos && cai_bpe_token_id(j->bpe, c->eos, &j->eos) == CAI_OK)
        CAI_CALL(cai_bpe_add_special(j->bpe, c->eos, &j->eos));
    else cai_error_clear();
    return CAI_OK;
}

/* The architecture fields a reward model must share with the policy for
 * its weights to load into the policy's shapes and its ids to be the
 * policy's tokens. */
static cai_status rm_match(const char *rm, const char *policy, const cai_model_config *a, const cai_model_config *b) {
    const struct {
        const char *name;
        int rm, pol;
    } f[] = {{"family", (int)a->family, (int)b->family},   {"vocab_size", a->vocab_size, b->vocab_size},
             {"n_layers", a->n_layers, b->n_layers},       {"d_model", a->d_model, b->d_model},
             {"n_heads", a->n_heads, b->n_heads},          {"n_kv_heads", a->n_kv_heads, b->n_kv_heads},
             {"ffn_hidden", a->ffn_hidden, b->ffn_hidden}, {"tie_embeddings", a->tie_embeddings, b->tie_embeddings}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].rm != f[i].pol)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "reward.model=%s: its %s is %d, the policy's (model.path=%s) %d: the reward model must "
                             "be the policy's architecture and vocabulary (an rm run from the same model)",
                             rm, f[i].name, f[i].rm, policy, f[i].pol);
    return CAI_OK;
}

/* The reward model's tokenizer (the one its rm run read: its model.tokenizer,
 * or its model.path's) must be the policy's token for token, or its scores
 * would be of other text. A tokenizer no longer where the rm run found it
 * is left to the vocabulary size check, with a warning. */
static cai_status rm_tokenizer_match(const rl_job *j, const char *rm, const rl_config *rc) {
    const int rm_bytes = strcmp(rc->tokenizer, "bytes") == 0;
    if (rm_bytes || !j->bpe) {
        if (rm_bytes == !j->bpe) return CAI_OK;
        return CAI_ERROR(CAI_ERR_CONFIG, "reward.model=%s reads %s tokens, the policy %s", rm,
                         rm_bytes ? "byte-level" : "BPE", j->bpe ? "BPE ones" : "byte-level ones");
    }
    cai_app_model_source src;
    char dir[4096];
    cai_bpe_t *tok = NULL;
    if (cai_app_model_source_open(rc->model_path, &src) != CAI_OK ||
        cai_app_model_tokenizer_dir(&src, rc->model_path, rc->tokenizer, dir, sizeof dir) != CAI_OK ||
        cai_bpe_load_dir(dir, &tok) != CAI_OK) {
        CAI_WARN(
            "reward.model=%s: the tokenizer of its rm run (model.path=%s) cannot be read (%s); only its "
            "vocabulary size is checked against the policy's",
            rm, rc->model_path, cai_error_message());
        cai_error_clear();
        return CAI_OK;
    }
    const int32_t V = cai_bpe_vocab_size(tok);
    cai_status st = CAI_OK;
    if (V != cai_bpe_vocab_size(j->bpe))
        st = CAI_ERROR(CAI_ERR_CONFIG, "reward.model=%s: its tokenizer %s holds %d tokens, the policy's %s %d", rm, dir,
                       (int)V, j->tokdir, (int)cai_bpe_vocab_size(j->bpe));
    for (int32_t id = 0; st == CAI_OK && id < V; id++) {
        const char *a, *b;
        size_t na, nb;
        if (cai_bpe_token_bytes(tok, id, &a, &na) != CAI_OK || cai_bpe_token_bytes(j->bpe, id, &b, &nb) != CAI_OK) {
            cai_error_clear();
            continue;
        }
        if (na != nb || memcmp(a, b, na) != 0)
            st = CAI_ERROR(CAI_ERR_CONFIG,
                           "reward.model=%s: its tokenizer %s spells token %d otherwise than the policy's %s: the "
                           "reward model must read the policy's tokens",
                           rm, dir, (int)id, j->tokdir);
    }
    cai_bpe_free(tok);
    return st;
}

/* The rlhf config a checkpoint was written under (its stored config text). */
static cai_status stored_config(const char *path, const char *text, rl_config *out) {
    cai_status st = cai_config_defaults(&k_schema, out);
    if (st == CAI_OK && text) st = cai_config_load_yaml_string(&k_schema, out, text, path);
    if (st != CAI_OK) cai_config_free(&k_schema, out);
    return st;
}

/* reward.model: read and checked from its metadata alone, before anything
 * is built; its score head comes from the file's app_state (the rm run's
 * head, its moments ignored). The key is rewritten to the resolved file,
 * so config.yaml and every checkpoint name the exact file a resume must
 * score with. Not collective. */
static cai_status open_reward_model(rl_job *j, rl_config *c) {
    const char *given = c->reward_model;
    if (!*given) return CAI_OK;
    if (access(given, R_OK) != 0) return CAI_ERROR(CAI_ERR_CONFIG, "reward.model=%s: no such file or directory", given);
    char cfgjson[4200];
    snprintf(cfgjson, sizeof cfgjson, "%s/config.json", given);
    if (access(cfgjson, R_OK) == 0)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "reward.model=%s is a Hugging Face directory: it takes a colossal-rlhf --rlhf.algo rm "
                         "checkpoint (its score head rides in the checkpoint)",
                         given);
    cai_app_model_source *s = &j->rm_src;
    memset(s, 0, sizeof *s);
    CAI_CALL(cai_ckpt_resolve(given, s->ckpt, sizeof s->ckpt));
    cai_ckpt_file_t *f = NULL;
    CAI_CALL(cai_ckpt_open(&f, MPI_COMM_SELF, s->ckpt));
    const cai_ckpt_meta *m = cai_ckpt_file_meta(f);
    const int64_t C = m->model.d_model;
    cai_status st = CAI_OK;
    rl_config rc;
    memset(&rc, 0, sizeof rc);
    int parsed = 0;
    if (!m->has_model) st = CAI_ERROR(CAI_ERR_CONFIG, "reward.model=%s: %s records no model config", given, s->ckpt);
    else if (strcmp(m->app, "colossal-rlhf") != 0 || !m->config_text || !m->app_state ||
             m->app_state_len != (size_t)(3 * C + 1))
        st = CAI_ERROR(CAI_ERR_CONFIG,
                       "reward.model=%s: %s is not a reward model checkpoint (written by %s, %s score head): train one "
                       "with colossal-rlhf --rlhf.algo rm",
                       given, s->ckpt, *m->app ? m->app : "an unnamed app", m->app_state ? "a foreign" : "no");
    else if ((st = stored_config(s->ckpt, m->config_text, &rc)) == CAI_OK) {
        parsed = 1;
        if (rc.algo != RL_RM)
            st = CAI_ERROR(CAI_ERR_CONFIG,
                           "reward.model=%s: %s was written by rlhf.algo=%s, not rm: its head is not a score head",
                           given, s->ckpt, rl_algo_names[rc.algo]);
    }
    if (st == CAI_OK) st = rm_match(s->ckpt, c->model_path, &m->model, &j->src.config);
    if (st == CAI_OK) st = rm_tokenizer_match(j, s->ckpt, &rc);
    if (st == CAI_OK) {
        s->config = m->model;
        st = cai_calloc((void **)&j->rm_w, (size_t)C, sizeof *j->rm_w, "reward model head");
    }
    if (st == CAI_OK) memcpy(j->rm_w, m->app_state, (size_t)C * sizeof *j->rm_w);
    if (parsed) cai_config_free(&k_schema, &rc);
    cai_ckpt_close(f);
    CAI_CALL(st);
    char *resolved = strdup(s->ckpt);
    if (!resolved) return CAI_ERROR(CAI_ERR_NOMEM, "reward.model path");
    free(c->reward_model);
    c->reward_model = resolved;
    return CAI_OK;
}

/* Every rank reads the data (small: pairs and prompts, tokenized here). */
static cai_status data_init(rl_job *j, rl_config *c) {
    CAI_CALL(cai_chat_template_open(c->chat_template, &j->tmpl));
    if (j->bpe) {
        const char *missing[8];
        int n = 0;
        cai_chat_template_missing_tokens(j->tmpl, j->bpe, missing, 8, &n);
        if (n > 0)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "data.chat_template=%s needs special tokens the tokenizer %s lacks (first: %s): "
                             "fine-tune with this template in colossal-sft first (it adds them), then align that model",
                             c->chat_template, j->tokdir, missing[0]);
    }
    if (is_policy(c)) {
        j->exact_part = -1;
        if (*c->rewards || !*c->reward_model) {
            CAI_CALL(cai_rl_reward_spec_parse(c->rewards, &j->rewards));
            j->exact_part = cai_rl_reward_spec_find(&j->rewards, "exact_match");
        }
        /* the reward model scores the whole row, prompt and response, as its training scored a pair's side */
        const int64_t max_prompt = (int64_t)c->seq_len + (*c->reward_model ? 0 : 1) - c->max_new;
        if (max_prompt < 2)
            return CAI_ERROR(CAI_ERR_CONFIG, "train.seq_len=%d leaves no room for a prompt before %d new tokens",
                             c->seq_len, c->max_new);
        CAI_CALL(cai_rl_prompt_set_load(c->train_path, j->tmpl, j->bpe, max_prompt, &j->prompt_train));
        if (*c->valid_path)
            CAI_CALL(cai_rl_prompt_set_load(c->valid_path, j->tmpl, j->bpe, max_prompt, &j->prompt_valid));
        if (cai_rl_prompt_set_size(j->prompt_train) == 0)
            return CAI_ERROR(CAI_ERR_CONFIG, "data.train=%s: no prompt fits train.seq_len=%d with %d new tokens",
                             c->train_path, c->seq_len, c->max_new);
        return CAI_OK;
    }
    /* a scored row holds the whole pair side; a language-model row one token fewer */
    const int64_t fit = c->algo == RL_RM ? c->seq_len - 1 : c->seq_len;
    CAI_CALL(cai_rl_pref_set_load(c->train_path, j->tmpl, j->bpe, fit, (cai_sft_overflow)c->overflow, &j->pref_train));
    if (*c->valid_path)
        CAI_CALL(
            cai_rl_pref_set_load(c->valid_path, j->tmpl, j->bpe, fit, (cai_sft_overflow)c->overflow, &j->pref_valid));
    if (cai_rl_pref_set_size(j->pref_train) == 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "data.train=%s: no pair fits train.seq_len=%d", c->train_path, c->seq_len);
    return CAI_OK;
}

/* ------------------------------------------------------------------ the job's hooks */

static cai_status step_hook(void *ctx, cai_run_t *run, int64_t step, cai_step_stats *st) {
    return rl_step(ctx, run, step, st);
}

static cai_status eval_hook(void *ctx, cai_run_t *run, int64_t step, double *loss, int *ran) {
    *loss = 0;
    int done = 0;
    CAI_CALL(rl_evaluate(ctx, run, step, &done));
    *ran = 0; /* its own record (kind rl_eval): an accuracy, not a loss */
    return CAI_OK;
}

/* The head (weight and AdamW moments) and the update count ride in the
 * checkpoint's app_state; the data position is the step. */
static cai_status save_hook(void *ctx, cai_run_t *run, cai_ckpt_meta *m, const char *dir, int keep, char *path,
                            size_t cap, cai_ckpt_stats *st) {
    rl_job *j = ctx;
    m->data_seed = (uint64_t)j->cfg->seed;
    m->consumed_samples = 0;
    float *state = NULL;
    if (j->head) {
        const int64_t C = cai_rl_head_width(j->head);
        float *w, *g, *mm, *v;
        cai_rl_head_tensors(j->head, &w, &g, &mm, &v);
        CAI_CALL(cai_calloc((void **)&state, (size_t)(3 * C + 1), sizeof *state, "rlhf head state"));
        memcpy(state, w, (size_t)C * sizeof *state);
        memcpy(state + C, mm, (size_t)C * sizeof *state);
        memcpy(state + 2 * C, v, (size_t)C * sizeof *state);
        state[3 * C] = (float)j->optim_steps;
        m->app_state = state;
        m->app_state_len = (size_t)(3 * C + 1);
    }
    cai_status s = tc_engine_save(&j->eng, run, m, dir, keep, path, cap, st);
    m->app_state = NULL;
    m->app_state_len = 0;
    free(state);
    return s;
}

static cai_status load_hook(void *ctx, cai_run_t *run, const char *path, cai_ckpt_meta *m, cai_ckpt_stats *st) {
    rl_job *j = ctx;
    CAI_CALL(tc_engine_load(&j->eng, run, path, m, st));
    cai_engine_weights_changed(j->gen);
    if (m->data_seed != (uint64_t)j->cfg->seed)
        CAI_WARN("%s was trained with train.seed=%llu, this run uses %lld: data and rollouts change from here", path,
                 (unsigned long long)m->data_seed, (long long)j->cfg->seed);
    j->optim_steps = m->optim_step;
    if (is_policy(j->cfg)) {
        /* the rewards a resumed run gives are the stopped run's only with the same reward model */
        rl_config was;
        CAI_CALL(stored_config(path, m->config_text, &was));
        const int same = strcmp(was.reward_model, j->cfg->reward_model) == 0 && was.rm_weight == j->cfg->rm_weight;
        cai_status s =
            same ? CAI_OK
                 : CAI_ERROR(CAI_ERR_CONFIG,
                             "%s was trained with reward.model=\"%s\" reward.model_weight=%g, this run gives "
                             "reward.model=\"%s\" reward.model_weight=%g: its rewards would not continue the run's",
                             path, was.reward_model, was.rm_weight, j->cfg->reward_model, j->cfg->rm_weight);
        cai_config_free(&k_schema, &was);
        CAI_CALL(s);
    }
    if (!j->head) return CAI_OK;
    const int64_t C = cai_rl_head_width(j->head);
    if (!m->app_state || m->app_state_len != (size_t)(3 * C + 1))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: dataset app_state holds %zu values, the %s head needs %lld", path,
                         m->app_state_len, rl_algo_names[j->cfg->algo], (long long)(3 * C + 1));
    float *w, *g, *mm, *v;
    cai_rl_head_tensors(j->head, &w, &g, &mm, &v);
    memcpy(w, m->app_state, (size_t)C * sizeof *w);
    memcpy(mm, m->app_state + C, (size_t)C * sizeof *mm);
    memcpy(v, m->app_state + 2 * C, (size_t)C * sizeof *v);
    j->optim_steps = (int64_t)m->app_state[3 * C];
    return CAI_OK;
}

/* ------------------------------------------------------------------ building */

static cai_run_config run_config(const rl_config *c, const cai_layout *layout, int64_t steps) {
    cai_run_config r = {.program = "colossal-rlhf", .schema = &k_schema, .app_cfg = c, .opt = &c->run, .steps = steps};
    cai_mesh_config_init(&r.mesh);
    r.mesh.layout = *layout;
    r.mesh.watchdog_timeout_s = c->watchdog;
    r.mesh.nccl_overlap_ctas = c->tr.zero_overlap_ctas;
    return r;
}

/* model.path's weights into a model. Collective over the world. */
static cai_status load_source(rl_job *j, cai_run_t *run, cai_model_t *m) {
    if (j->src.hf) return cai_hf_import_model(j->h, m);
    CAI_CALL(cai_ckpt_load_weights(cai_run_mesh(run), j->src.ckpt, cai_model_weights(m), NULL, NULL));
    return cai_model_params_updated(m);
}

/* Stop strings need the output's text. */
static cai_status decode_text(void *ctx, const int32_t *ids, size_t n, cai_byte_buf *out) {
    return cai_bpe_decode(ctx, ids, n, out);
}

static cai_status alloc_f32(float **p, size_t n, const char *what) {
    return cai_calloc((void **)p, n, sizeof **p, what);
}

static cai_status build(rl_job *j, rl_config *c, cai_run_t *run) {
    cai_model_config m = j->src.config, resolved;
    if (c->seq_len > m.max_seq_len)
        return CAI_ERROR(CAI_ERR_CONFIG, "train.seq_len=%d: %s holds positions up to %d", c->seq_len, c->model_path,
                         m.max_seq_len);
    m.activation_checkpointing = c->act_ckpt;
    tc_apply_precision(&c->tr, cai_run_device(run), &m);
    CAI_CALL(cai_model_config_resolve(&m, &resolved));
    const int dp = cai_mesh_size(cai_run_mesh(run), CAI_AXIS_DP);
    j->T = c->seq_len;
    if (is_policy(c)) {
        j->B = c->micro_batch;
        const int rows = c->prompts / dp * c->group;
        j->n_micro = (rows + j->B - 1) / j->B;
    } else {
        j->B = 2 * c->micro_batch;
        j->n_micro = c->grad_accum;
    }
    const cai_rank_view view = cai_run_view(run);
    /* The rollout engine's KV pool: rollout.kv_memory; auto, 256 MiB on the
     * host and on a GPU half of what is free once the models exist (0 here:
     * it fits by construction, so the plan leaves it out). */
    const size_t host_kv = (size_t)256 << 20;
    const int on_host = cai_run_device(run)->kind == CAI_DEVICE_HOST;
    size_t kv = 0;
    if (is_policy(c)) kv = c->kv_memory != CAI_CFG_BYTES_AUTO ? (size_t)c->kv_memory : on_host ? host_kv : 0;
    const int want_ref = c->algo == RL_DPO ? c->dpo_loss == CAI_RL_DPO : is_policy(c) && c->kl_coef > 0;
    cai_mem_plan_request q = {.model = resolved,
                              .batch = j->B,
                              .seq_len = j->T,
                              .view = view,
                              .dp = dp,
                              .zero = tc_zero_config(&c->tr),
                              .dev = cai_run_device(run),
                              .frozen_models = want_ref + (*c->reward_model != 0),
                              .rollout_bytes = kv,
                              .zero_max_stage = is_policy(c) ? RL_POLICY_MAX_ZERO : 0,
                              .frozen_on_host = c->placement == RL_PLACE_HOST};
    if (c->placement == RL_PLACE_AUTO && is_policy(c) && q.frozen_models > 0 && !cai_run_plan_fits(run, &q)) {
        cai_mem_plan_request h = q;
        h.frozen_on_host = 1;
        q.frozen_on_host = cai_run_plan_fits(run, &h);
    }
    j->frozen_on_host = q.frozen_on_host && q.frozen_models > 0;
    CAI_CALL(cai_run_plan_memory(run, &q));
    cai_model_options mo = cai_model_options_default(&resolved);
    mo.batch = j->B;
    mo.seq_len = j->T;
    mo.view = view;
    mo.mesh = cai_run_mesh(run);
    /* The frozen models first: loading one holds its F32 masters beside the
     * copy it keeps (6 bytes a bf16 parameter, then 2), so that peak comes
     * while the device holds at most the other frozen model's kept copy,
     * not the policy's training state (the plan's frozen_load). With host
     * placement each leaves the device as soon as it is loaded. The
     * reference is a frozen copy of model.path. */
    if (want_ref) {
        cai_model_options ro = mo;
        ro.frozen = 1;
        ro.external_params = 0;
        ro.weights = NULL;
        CAI_CALL(cai_model_create(&j->ref, cai_run_device(run), &resolved, &ro));
        CAI_CALL(load_source(j, run, j->ref));
        CAI_CALL(cai_model_keep_compute(j->ref));
        if (j->frozen_on_host) CAI_CALL(cai_model_offload(j->ref));
    }
    if (*c->reward_model) {
        cai_model_options ro = mo;
        ro.frozen = 1;
        ro.external_params = 0;
        ro.weights = NULL;
        CAI_CALL(cai_model_create(&j->rm, cai_run_device(run), &resolved, &ro));
        CAI_CALL(cai_ckpt_load_weights(cai_run_mesh(run), j->rm_src.ckpt, cai_model_weights(j->rm), NULL, NULL));
        CAI_CALL(cai_model_params_updated(j->rm));
        CAI_CALL(cai_model_keep_compute(j->rm));
        if (j->frozen_on_host) CAI_CALL(cai_model_offload(j->rm));
        CAI_CALL(cai_rl_head_create(&j->rm_head, resolved.d_model, 0.0f, 0));
        float *w;
        cai_rl_head_tensors(j->rm_head, &w, NULL, NULL, NULL);
        memcpy(w, j->rm_w, (size_t)resolved.d_model * sizeof *w);
    }
    /* the policy; the rollouts come first, and an auto pool sizes itself in what the models leave */
    CAI_CALL(tc_engine_create(&j->eng, run, &c->tr, j->optim_steps, &resolved, &mo, NULL, NULL));
    if (j->src.hf) CAI_CALL(cai_hf_import_zero(j->h, j->eng.zero));
    else CAI_CALL(cai_ckpt_load_zero_weights(cai_run_mesh(run), j->src.ckpt, j->eng.zero));
    CAI_CALL(tc_engine_ready(&j->eng, run, &c->tr, &resolved, 1));
    if (c->algo == RL_RM || c->algo == RL_PPO)
        CAI_CALL(cai_rl_head_create(&j->head, resolved.d_model, (float)c->head_std, (uint64_t)c->seed));
    if (is_policy(c)) {
        cai_engine_options eo = cai_engine_options_default();
        eo.kv_memory = kv;
        if (!kv) {
            /* a pool that holds every rollout of a step keeps them all in one batch */
            size_t free_b = 0, total_b = 0;
            eo.kv_memory = host_kv;
            if (cai_device_mem_info(cai_run_device(run), &free_b, &total_b) == CAI_OK) eo.kv_memory = free_b / 2;
            cai_error_clear();
        }
        eo.max_batch = c->prompts / dp * c->group;
        eo.eos_id = j->eos;
        eo.seed = (uint64_t)c->seed;
        /* stage 0: the model's own working weights; 1-2: the ZeRO engine's (stage 3 is refused) */
        if (c->tr.zero_stage > 0) CAI_CALL(cai_zero_working_weights(j->eng.zero, &j->gen_w));
        CAI_CALL(cai_engine_create(&j->gen, j->gen_w ? j->gen_w : cai_model_weights(j->eng.model),
                                   cai_mesh_size(cai_run_mesh(run), CAI_AXIS_TP) > 1 ? cai_run_mesh(run) : NULL, &eo));
        if (j->bpe) cai_engine_set_decoder(j->gen, decode_text, j->bpe);
        j->sp = cai_sampling_default();
        j->sp.max_new_tokens = c->max_new;
        j->sp.temperature = (float)c->temperature;
        j->sp.top_p = (float)c->top_p;
        j->sp.top_k = c->top_k;
        if (*c->stop) {
            j->sp.stop[0] = c->stop;
            j->sp.n_stop = 1;
        }
        if (j->eos >= 0) {
            j->sp.stop_ids[0] = j->eos;
            j->sp.n_stop_ids = 1;
        }
    }
    /* the step's buffers */
    const size_t R = (size_t)j->n_micro * (size_t)j->B, N = R * (size_t)j->T, C = (size_t)resolved.d_model;
    const size_t BT = (size_t)j->B * (size_t)j->T;
    CAI_CALL(cai_calloc((void **)&j->tok, N, sizeof *j->tok, "rlhf tokens"));
    CAI_CALL(cai_calloc((void **)&j->tgt, N, sizeof *j->tgt, "rlhf targets"));
    CAI_CALL(cai_calloc((void **)&j->mask, N, 1, "rlhf masks"));
    CAI_CALL(cai_calloc((void **)&j->last, R, sizeof *j->last, "rlhf last tokens"));
    CAI_CALL(alloc_f32(&j->rec, N, "rlhf log-probs"));
    CAI_CALL(alloc_f32(&j->rec_val, N, "rlhf values"));
    CAI_CALL(alloc_f32(&j->old_logp, N, "rlhf old log-probs"));
    CAI_CALL(alloc_f32(&j->ref_logp, N, "rlhf reference log-probs"));
    CAI_CALL(alloc_f32(&j->old_val, N, "rlhf old values"));
    CAI_CALL(alloc_f32(&j->samp_logp, N, "rlhf sampler log-probs"));
    CAI_CALL(alloc_f32(&j->adv, N, "rlhf advantages"));
    CAI_CALL(alloc_f32(&j->ret, N, "rlhf returns"));
    CAI_CALL(alloc_f32(&j->scores, R, "rlhf rewards"));
    CAI_CALL(alloc_f32(&j->rm_scores, R, "rlhf reward model scores"));
    CAI_CALL(alloc_f32(&j->logp, BT, "rlhf objective"));
    CAI_CALL(alloc_f32(&j->dlogp, BT, "rlhf objective"));
    CAI_CALL(alloc_f32(&j->val, BT, "rlhf objective"));
    CAI_CALL(alloc_f32(&j->dval, BT, "rlhf objective"));
    CAI_CALL(alloc_f32(&j->hrow, 2 * (size_t)j->B * C, "rlhf objective"));
    CAI_CALL(alloc_f32(&j->dpi, (size_t)j->B, "rlhf objective"));
    CAI_CALL(alloc_f32(&j->rwd, 2 * (size_t)j->B, "rlhf objective"));
    CAI_CALL(cai_calloc((void **)&j->pi, (size_t)j->B, sizeof *j->pi, "rlhf objective"));
    CAI_CALL(cai_calloc((void **)&j->refsum, R, sizeof *j->refsum, "rlhf reference sums"));
    CAI_CALL(cai_calloc((void **)&j->mb_count, (size_t)j->n_micro, sizeof *j->mb_count, "rlhf counts"));
    return CAI_OK;
}

static void job_free(rl_job *j) {
    cai_engine_free(j->gen);
    cai_weights_free(j->gen_w);
    cai_rl_head_free(j->head);
    cai_rl_head_free(j->rm_head);
    cai_model_free(j->rm);
    cai_model_free(j->ref);
    tc_engine_free(&j->eng);
    cai_rl_pref_set_free(j->pref_train);
    cai_rl_pref_set_free(j->pref_valid);
    cai_rl_prompt_set_free(j->prompt_train);
    cai_rl_prompt_set_free(j->prompt_valid);
    cai_rl_reward_spec_free(&j->rewards);
    cai_chat_template_free(j->tmpl);
    cai_bpe_free(j->bpe);
    cai_hf_close(j->h);
    void *bufs[] = {j->tok,      j->tgt,       j->mask,    j->last,     j->rec, j->rec_val, j->old_logp,
                    j->ref_logp, j->samp_logp, j->old_val, j->adv,      j->ret, j->scores,  j->logp,
                    j->dlogp,    j->val,       j->dval,    j->hrow,     j->dpi, j->rwd,     j->pi,
                    j->refsum,   j->mb_count,  j->rm_w,    j->rm_scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static void print_header(rl_job *j, cai_run_t *run, const cai_app *app) {
    const rl_config *c = j->cfg;
    const cai_model_config *mc = cai_model_config_of(j->eng.model);
    const int dp = cai_mesh_size(cai_run_mesh(run), CAI_AXIS_DP);
    char layout[128];
    cai_layout_str(cai_mesh_layout(cai_run_mesh(run)), layout, sizeof layout);
    printf("colossal-rlhf %s: %s, %d rank%s, %s, device %s\n", cai_version_string(), rl_algo_names[c->algo], app->size,
           app->size == 1 ? "" : "s", layout, cai_run_device(run)->name);
    printf("model: %s from %s (%s, %d layers, d_model %d, vocab %d), tokenizer %s%s\n",
           cai_model_family_name(mc->family), c->model_path, j->src.hf ? "Hugging Face" : "checkpoint", mc->n_layers,
           mc->d_model, mc->vocab_size, j->bpe ? j->tokdir : "byte-level",
           j->ref ? "; reference: a frozen copy of it" : "");
    if (is_policy(c)) {
        printf("data: %s: %lld prompts", c->train_path, (long long)cai_rl_prompt_set_size(j->prompt_train));
        if (j->prompt_valid)
            printf("; held out %s: %lld", c->valid_path, (long long)cai_rl_prompt_set_size(j->prompt_valid));
        printf("\nrollouts: %d prompts x %d samples a step, up to %d new tokens, temperature %g, rewards %s\n",
               c->prompts, c->group, c->max_new, c->temperature, *c->rewards ? c->rewards : "none");
        if (j->rm) printf("reward model: %s (score x %g added to the rewards)\n", c->reward_model, c->rm_weight);
        printf("batch: %d rows a step (%d microbatches of %d on each of %d replicas), %d pass%s\n",
               c->prompts * c->group, j->n_micro, j->B, dp, c->passes, c->passes == 1 ? "" : "es");
        if (j->ref || j->rm)
            printf("placement: %s\n", j->frozen_on_host ? "frozen models' weights in host memory except while they "
                                                          "score; the rollout KV pool only during rollouts"
                                                        : "frozen models and the rollout KV pool in device memory");
    } else {
        printf("data: %s: %lld pairs", c->train_path, (long long)cai_rl_pref_set_size(j->pref_train));
        if (j->pref_valid) printf("; held out %s: %lld", c->valid_path, (long long)cai_rl_pref_set_size(j->pref_valid));
        printf("\nbatch: %lld pairs x %d tokens per step (micro_batch %d x grad_accum %d x dp %d)\n",
               (long long)c->micro_batch * c->grad_accum * dp, c->seq_len, c->micro_batch, c->grad_accum, dp);
    }
    tc_engine_print_optim(&j->eng);
    tc_engine_print_zero(&j->eng, &c->tr, dp);
    printf("run dir: %s (config.yaml, metrics.jsonl)\n", c->run.dir);
    fflush(stdout);
}

/* Steps from the data when train.steps is 0. */
static int64_t job_steps(const rl_job *j, const rl_config *c, int dp) {
    if (c->steps) return c->steps;
    const double items =
        is_policy(c) ? (double)cai_rl_prompt_set_size(j->prompt_train) : (double)cai_rl_pref_set_size(j->pref_train);
    const double per_step = is_policy(c) ? c->prompts : (double)c->micro_batch * c->grad_accum * dp;
    const int64_t s = (int64_t)((c->epochs * items + per_step - 1) / per_step);
    return s > 0 ? s : 1;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    cai_run_signals_install(); /* first: a signal during start-up waits for the first step */
    tc_fill_choices();
    rl_config cfg;
    cai_app app;
    cai_app_init(&app, &argc, &argv, &k_schema, &cfg, offsetof(rl_config, common));
    cai_layout layout;
    cai_app_check_all(check_config(&cfg, app.size, &layout), 2);
    rl_job job = {.cfg = &cfg};
    cai_app_check_all(open_source(&job), 2);
    cai_app_check_all(open_reward_model(&job, &cfg), 2);
    if (cfg.seq_len == 0) cfg.seq_len = job.src.config.max_seq_len;
    cai_app_check_all(data_init(&job, &cfg), 2);
    job.steps = job_steps(&job, &cfg, layout.dp);
    job.optim_steps = job.steps * (is_policy(&cfg) ? cfg.passes : 1); /* the schedule's length */
    cai_app_check_all(tc_check(&cfg.tr, job.optim_steps), 2);
    cai_run_t *run = NULL;
    cai_run_config rc = run_config(&cfg, &layout, job.steps);
    cai_app_check_all(cai_run_init(&run, &rc, MPI_COMM_WORLD), 1);
    cai_app_check_all(build(&job, &cfg, run), 2);
    job.optim_steps = 0;
    cai_run_hooks hooks = {&job, step_hook, eval_hook, save_hook, load_hook};
    cai_app_check_all(cai_run_resume(run, &hooks), 1);
    cai_app_check(
        cai_run_start(run, job.eng.model, cfg.seq_len, (int64_t)job.n_micro * job.B * cfg.seq_len * layout.dp));
    if (app.rank == 0) print_header(&job, run, &app);
    int ran = 0;
    if (cai_run_first_step(run) == 1) cai_app_check(rl_evaluate(&job, run, 0, &ran));
    cai_app_check(cai_run_train(run, &hooks, cfg.eval_interval ? cfg.eval_interval : job.steps));
    cai_app_check(cai_run_finish(run));
    const int exit_code = cai_run_exit_code(run);
    job_free(&job);
    cai_run_free(run);
    const int rc_final = cai_app_finalize(&k_schema, &cfg);
    return exit_code ? exit_code : rc_final;
}
