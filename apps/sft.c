/* colossal-sft: supervised fine-tuning of a GPT-2 or Llama model on chat
 * conversations, loss on the assistant's tokens only.
 *
 *   mpirun -np N colossal-sft --model.path HF_DIR_OR_CHECKPOINT --data.train chat.jsonl [--key=value ...]
 *
 * The model starts from a Hugging Face directory or a colossal checkpoint;
 * chat JSONL is tokenized through the data layer's template into
 * run.dir/data (or a colossal-data sft-preprocess prefix is read as it is);
 * each row holds one conversation, padded (or, with data.packing, several
 * with their own positions and attention), with targets only on the
 * assistant's tokens (CAI_IGNORE_INDEX elsewhere). Epochs shuffle the rows
 * deterministically. The training engine and its layouts (dp with ZeRO
 * 0-3 and offload, tp, pp) are colossal-pretrain's (train_common.h): the
 * source's weights go into the engine's masters, the vocabulary grown by a
 * template's missing special tokens; the run module does the rest of the
 * job (signals, memory plan, checkpoints and resume, metrics.jsonl). See
 * docs/sft.md. */
#include "cai_config.h"

#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app_common.h"
#include "colossal/ckpt.h"
#include "colossal/data.h"
#include "colossal/run.h"
#include "lora_app.h"
#include "train_common.h"

/* ------------------------------------------------------------------ config */

typedef struct {
    char *model_path, *tokenizer;
    int act_ckpt;
    int dp, tp, pp, pp_schedule, pp_virtual, pp_slots;
    char *pp_layers;
    double watchdog;
    char *train_path, *valid_path, *chat_template;
    int overflow, packing;
    int64_t steps, data_seed;
    double epochs;
    int micro_batch, grad_accum, seq_len;
    int64_t eval_interval;
    tc_options tr;
    lora_app_options lora;
    cai_run_options run;
    cai_app_common common;
} sft_config;

#define F(key, type, field, def, doc, ...) \
    { key, type, offsetof(sft_config, field), def, doc, __VA_ARGS__, NULL, NULL }
#define S(key, field, def, doc) F(key, CAI_CFG_STRING, field, def, doc, CAI_CFG_NO_RANGE)
#define BIG 1e15

static const cai_config_field k_fields[] = {
    S("model.path", model_path, "",
      "Hugging Face directory (config.json, safetensors, tokenizer) or colossal checkpoint (file, or directory with "
      "`latest`) to fine-tune"),
    S("model.tokenizer", tokenizer, "",
      "tokenizer directory (tokenizer.json or vocab.json + merges.txt); empty: model.path's, or for a checkpoint its "
      "run directory's tokenizer/"),
    F("model.activation_checkpointing", CAI_CFG_BOOL, act_ckpt, "false",
      "keep only each layer's input and recompute it in backward", CAI_CFG_NO_RANGE),
    F("mesh.dp", CAI_CFG_INT, dp, "0", "data-parallel ranks; 0: world / (mesh.tp * mesh.pp)", 0, 1 << 20),
    F("mesh.tp", CAI_CFG_INT, tp, "1", "tensor-parallel ranks (Megatron-style: heads, MLP and vocabulary split)", 1,
      1 << 20),
    F("mesh.pp", CAI_CFG_INT, pp, "1",
      "pipeline stages (train.grad_accum microbatches go through the pipeline; ZeRO stage 0 or 1 without offload)", 1,
      1 << 20),
    TC_PP_FIELDS(sft_config, pp_schedule, pp_virtual, pp_layers, pp_slots),
    F("mesh.watchdog_timeout", CAI_CFG_DOUBLE, watchdog, "300",
      "seconds a collective may stall before every rank aborts naming the late one; 0: off", 0, 1e9),

    S("data.train", train_path, "",
      "chat JSONL file (messages, from/value, or prompt/completion lines; docs/sft.md), or the PREFIX of "
      "colossal-data sft-preprocess output (PREFIX.idx and PREFIX_loss_mask.idx)"),
    S("data.valid", valid_path, "",
      "held-out chat JSONL or sft-preprocess PREFIX for the masked eval loss; empty: none"),
    S("data.chat_template", chat_template, "plain",
      "chatml, llama3, plain, or a template file (JSONL input only; docs/sft.md)"),
    {"data.overflow", CAI_CFG_ENUM, offsetof(sft_config, overflow), "truncate",
     "a conversation longer than train.seq_len + 1 tokens: truncate or drop it (counted and reported)",
     CAI_CFG_NO_RANGE, cai_sft_overflow_names, NULL},
    F("data.packing", CAI_CFG_BOOL, packing, "false",
      "several conversations per row (first fit), each with its own positions and attention that does not cross "
      "into the others; needs train.grad_accum=1",
      CAI_CFG_NO_RANGE),

    F("train.epochs", CAI_CFG_DOUBLE, epochs, "3", "passes over the training rows (when train.steps is 0)", 1e-9, 1e9),
    F("train.steps", CAI_CFG_INT64, steps, "0", "optimizer steps; 0: train.epochs worth of rows", 0, BIG),
    F("train.micro_batch", CAI_CFG_INT, micro_batch, "8", "conversations per forward on each rank", 1, 1 << 20),
    F("train.grad_accum", CAI_CFG_INT, grad_accum, "1", "microbatches per step on each rank", 1, 1 << 20),
    F("train.seq_len", CAI_CFG_INT, seq_len, "0", "tokens per row; 0: the model's maximum", 0, 1 << 20),
    F("train.seed", CAI_CFG_INT64, data_seed, "1234", "row order seed (each epoch shuffles again)", 0, BIG),

    TC_OPTIM_FIELDS(sft_config, tr, "1e-4", "1e-4"),
    TC_ZERO_FIELDS(sft_config, tr),
    LORA_APP_FIELDS(sft_config, lora),

    F("eval.interval", CAI_CFG_INT64, eval_interval, "0",
      "masked loss over all of data.valid every this many steps and at the end; 0: at the end only", 0, BIG),

    CAI_RUN_FIELDS(sft_config, run, "runs/sft"),
    CAI_APP_COMMON_FIELDS(sft_config, common),
};
#undef F
#undef S
#undef BIG

static const cai_config_schema k_schema = {"colossal-sft",
                                           "fine-tune a GPT-2 or Llama model on chat data, loss on the assistant's "
                                           "tokens",
                                           k_fields, CAI_CFG_NFIELDS(k_fields)};

/* ------------------------------------------------------------------ the model's source */

typedef struct {
    cai_app_model_source m;
    cai_hf_t *h;          /* a Hugging Face directory, opened for the import */
    char tokenizer[4096]; /* directory; "" for byte-level */
} sft_source;

/* Every rank opens the same files: a failure is everyone's. */
static cai_status open_source(const sft_config *c, sft_source *s) {
    CAI_CALL(cai_app_model_source_open(c->model_path, &s->m));
    if (s->m.hf) CAI_CALL(cai_hf_open(&s->h, c->model_path));
    if (strcmp(c->tokenizer, "bytes") == 0) return CAI_OK;
    return cai_app_model_tokenizer_dir(&s->m, c->model_path, c->tokenizer, s->tokenizer, sizeof s->tokenizer);
}

/* The weights before the engine takes them (a LoRA run's frozen base).
 * Collective over the world (a checkpoint is read with MPI-IO). */
static cai_status load_weights(void *ctx, cai_run_t *run, cai_model_t *m) {
    sft_source *s = ctx;
    if (s->m.hf) return cai_hf_import_model(s->h, m);
    CAI_CALL(cai_ckpt_load_weights(cai_run_mesh(run), s->m.ckpt, cai_model_weights(m), NULL, NULL));
    return cai_model_params_updated(m);
}

/* ------------------------------------------------------------------ data */

typedef struct {
    cai_bpe_t *bpe; /* NULL: byte-level */
    cai_chat_template_t *tmpl;
    cai_sft_dataset_t *train, *valid;
    cai_sft_loader_t *loader;
    int64_t global_batch, local_batch;
    int32_t *tokens, *targets;    /* [local_batch, seq_len] */
    int32_t *positions, *doc_ids; /* the same, packed rows only */
    cai_sft_preprocess_stats pre; /* tokenizing data.train (JSONL input) */
    int added;                    /* special tokens added to the tokenizer */
    int source_vocab;             /* the source model's vocabulary (the model's may be larger) */
    char source[800];
} sft_data;

/* A prefix sft-preprocess wrote, or else a chat JSONL file to tokenize. */
static int is_prefix(const char *path) {
    char p[4200], mask[4200];
    if (snprintf(p, sizeof p, "%s.idx", path) >= (int)sizeof p || access(p, R_OK) != 0) return 0;
    if (cai_sft_mask_prefix(path, mask, sizeof mask) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    return snprintf(p, sizeof p, "%s.idx", mask) < (int)sizeof p && access(p, R_OK) == 0;
}

/* The template's special tokens as tokens of the vocabulary: one the
 * vocabulary spells keeps its id; the others are added at the end of it
 * (in the template's order, the same ids on every rank and every start), and
 * *vocab grows to cover the tokenizer (these, or tokens an sft-preprocess
 * --add-special-tokens tokenizer already added): the model's embedding
 * (and an untied LM head) then gets rows set to the mean of the source's
 * rows when its weights are loaded (cai_hf_import_zero,
 * cai_ckpt_load_zero_weights). */
static cai_status grow_template(const sft_config *c, sft_data *d, const char *tok_dir, int *vocab) {
    if (!d->bpe) return CAI_OK;
    d->source_vocab = *vocab;
    const char *missing[32];
    int n = 0;
    cai_chat_template_missing_tokens(d->tmpl, d->bpe, missing, 32, &n);
    for (int i = 0; i < n && i < 32; i++) {
        int32_t id;
        if (cai_bpe_token_id(d->bpe, missing[i], &id) == CAI_OK)
            CAI_CALL(cai_bpe_add_special(d->bpe, missing[i], NULL));
        else cai_error_clear();
    }
    cai_chat_template_missing_tokens(d->tmpl, d->bpe, missing, 32, &n);
    if (n > 0 && lora_app_on(&c->lora))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "data.chat_template=%s needs special tokens the tokenizer %s lacks (first: %s); a LoRA run "
                         "keeps the embedding frozen, so it cannot learn rows for them: add them in a full "
                         "fine-tuning run first, or use a template whose tokens the vocabulary has (plain needs none)",
                         c->chat_template, tok_dir, missing[0]);
    if (n > 0) CAI_CALL(cai_chat_template_add_tokens(d->tmpl, d->bpe, &d->added));
    if (cai_bpe_vocab_size(d->bpe) <= *vocab) return CAI_OK;
    if (lora_app_on(&c->lora))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "the tokenizer %s holds %d tokens, the model %s %d; a LoRA run keeps the embedding frozen, so "
                         "it cannot grow: use the model's own tokenizer",
                         tok_dir, cai_bpe_vocab_size(d->bpe), c->model_path, *vocab);
    *vocab = cai_bpe_vocab_size(d->bpe);
    return CAI_OK;
}

/* mkdir -p: the run directory does not exist before the run starts. */
static cai_status make_dirs(const char *path) {
    char p[4200];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return CAI_ERROR(CAI_ERR_CONFIG, "%s: too long", path);
    for (char *q = p + 1;; q++) {
        const char c = *q;
        if (c != '/' && c != 0) continue;
        *q = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return CAI_ERROR(CAI_ERR_IO, "%s: cannot create the directory: %s", p, strerror(errno));
        *q = c;
        if (!c) return CAI_OK;
    }
}

/* path -> a dataset: a prefix as it is; JSONL tokenized into
 * run.dir/data/NAME first. Collective over the world. */
static cai_status open_dataset(const sft_config *c, sft_data *d, const char *path, const char *name, int64_t vocab,
                               cai_sft_dataset_t **out, cai_sft_data_stats *stats, cai_sft_preprocess_stats *ps) {
    char prefix[4200];
    if (is_prefix(path)) {
        snprintf(prefix, sizeof prefix, "%s", path);
    } else {
        if (access(path, R_OK) != 0)
            return CAI_ERROR(CAI_ERR_CONFIG, "data.%s=%s: cannot read it: %s", name, path, strerror(errno));
        char dir[4096];
        if (snprintf(dir, sizeof dir, "%s/data", c->run.dir) >= (int)sizeof dir)
            return CAI_ERROR(CAI_ERR_CONFIG, "run.dir=%s is too long", c->run.dir);
        CAI_CALL(make_dirs(dir));
        snprintf(prefix, sizeof prefix, "%s/%s", dir, name);
        const char *inputs[1] = {path};
        const cai_sft_preprocess_config pc = {
            inputs, 1, prefix, d->tmpl, d->bpe, c->seq_len, (cai_sft_overflow)c->overflow, 1, 0};
        CAI_CALL(cai_sft_preprocess(&pc, MPI_COMM_WORLD, ps)); /* errors name the file, line and field */
    }
    const cai_sft_data_config dc = {
        prefix, c->seq_len, c->packing, (cai_sft_overflow)c->overflow, (uint64_t)c->data_seed, 0, vocab};
    CAI_CALL(cai_sft_dataset_init(out, &dc));
    cai_sft_dataset_stats(*out, stats);
    if (stats->rows == 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "data.%s=%s: no conversation with an assistant token to train fits", name,
                         path);
    return CAI_OK;
}

/* Before the run starts (its step count follows from the rows): collective
 * over the world, whose ranks are the dp ranks. */
static cai_status data_init(const sft_config *c, sft_data *d, sft_source *s, const cai_app *app, int dp) {
    /* the model holds one packing for every forward until it is set again,
     * and the step driver runs its microbatches without a call in between */
    if (c->packing && c->grad_accum > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "data.packing=true with train.grad_accum=%d: a packed row's positions and documents are "
                         "set on the model once per step, so a step takes one microbatch; set train.grad_accum=1 "
                         "(a larger train.micro_batch, or more ranks, gives the same batch)",
                         c->grad_accum);
    CAI_CALL(cai_chat_template_open(c->chat_template, &d->tmpl));
    if (*s->tokenizer) CAI_CALL(cai_bpe_load_dir(s->tokenizer, &d->bpe));
    CAI_CALL(grow_template(c, d, s->tokenizer, &s->m.config.vocab_size));
    /* colossal-infer finds a checkpoint's tokenizer beside it */
    if (d->bpe && app->rank == 0) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/tokenizer", c->run.dir);
        CAI_CALL(make_dirs(dir));
        CAI_CALL(cai_bpe_save(d->bpe, dir));
    }
    const int64_t vocab = s->m.config.vocab_size;
    cai_sft_data_stats ts, vs;
    cai_sft_preprocess_stats vps;
    CAI_CALL(open_dataset(c, d, c->train_path, "train", vocab, &d->train, &ts, &d->pre));
    if (*c->valid_path) CAI_CALL(open_dataset(c, d, c->valid_path, "valid", vocab, &d->valid, &vs, &vps));
    d->local_batch = (int64_t)c->micro_batch * c->grad_accum;
    d->global_batch = d->local_batch * dp;
    size_t n = (size_t)d->local_batch * (size_t)c->seq_len;
    CAI_CALL(cai_calloc((void **)&d->tokens, n, sizeof *d->tokens, "SFT batch tokens"));
    CAI_CALL(cai_calloc((void **)&d->targets, n, sizeof *d->targets, "SFT batch targets"));
    if (c->packing) {
        CAI_CALL(cai_calloc((void **)&d->positions, n, sizeof *d->positions, "SFT batch positions"));
        CAI_CALL(cai_calloc((void **)&d->doc_ids, n, sizeof *d->doc_ids, "SFT batch document ids"));
    }
    char pre[160] = "";
    if (d->pre.conversations)
        snprintf(pre, sizeof pre, " (of %lld read: %lld truncated, %lld dropped at tokenizing, data.overflow=%s)",
                 (long long)d->pre.conversations, (long long)d->pre.truncated, (long long)d->pre.dropped,
                 cai_sft_overflow_names[c->overflow]);
    snprintf(d->source, sizeof d->source,
             "%s: %lld conversations%s in %lld rows (%lld truncated, %lld dropped), %lld of %lld tokens trained "
             "(%.1f%%), template %s%s",
             c->train_path, (long long)ts.documents, pre, (long long)ts.rows, (long long)ts.truncated,
             (long long)ts.dropped, (long long)ts.trained_tokens, (long long)ts.tokens,
             ts.tokens ? 100.0 * (double)ts.trained_tokens / (double)ts.tokens : 0.0, cai_chat_template_name(d->tmpl),
             d->added ? " (its special tokens added to the tokenizer)" : "");
    return CAI_OK;
}

/* The loader from `consumed` rows on (0: the start; resuming: where the
 * checkpoint was). Not collective. */
static cai_status data_seek(const sft_config *c, sft_data *d, cai_mesh_t *mesh, int64_t consumed) {
    cai_sft_loader_free(d->loader);
    d->loader = NULL;
    return cai_sft_loader_init(&d->loader, d->train, d->global_batch, cai_mesh_size(mesh, CAI_AXIS_DP),
                               cai_mesh_rank(mesh, CAI_AXIS_DP), (uint64_t)c->data_seed, consumed);
}

static void data_free(sft_data *d) {
    cai_sft_loader_free(d->loader);
    cai_sft_dataset_free(d->train);
    cai_sft_dataset_free(d->valid);
    cai_chat_template_free(d->tmpl);
    cai_bpe_free(d->bpe);
    cai_free(d->tokens);
    cai_free(d->targets);
    cai_free(d->positions);
    cai_free(d->doc_ids);
}

/* ------------------------------------------------------------------ the job's hooks */

typedef struct {
    const sft_config *cfg;
    sft_source src;
    sft_data data;
    tc_engine eng;
    cai_pipeline_t *pipe; /* mesh.pp > 1: the driver runs the schedule */
    tc_pp pp;             /* mesh.pp > 1 */
    lora_app lora;        /* a LoRA run: the adapters, their optimizer and driver (eng holds the frozen model) */
    int64_t steps;
} sft_job;

/* Packed rows in the form cai_model_set_packing takes: the data layer
 * marks padding with document -1; the model wants document ids that never
 * decrease along a row, so the padding after the last conversation becomes
 * a document of its own (positions from 0). Its targets are ignored and it
 * comes last, so it changes nothing that is trained. */
static cai_status set_packing(sft_job *j, int64_t rows) {
    sft_data *d = &j->data;
    if (!d->positions) return CAI_OK;
    const int T = j->cfg->seq_len;
    for (int64_t r = 0; r < rows; r++) {
        int32_t *pos = d->positions + r * T, *doc = d->doc_ids + r * T, last = -1, pad = -1, p = 0;
        for (int t = 0; t < T; t++) {
            if (doc[t] >= 0) {
                last = doc[t];
                pad = -1;
                continue;
            }
            if (pad < 0) {
                pad = last + 1;
                p = 0;
            }
            doc[t] = pad;
            pos[t] = p++;
        }
    }
    return cai_model_set_packing(j->eng.model, d->positions, d->doc_ids);
}

static cai_status step_hook(void *ctx, cai_run_t *run, int64_t step, cai_step_stats *st) {
    sft_job *j = ctx;
    CAI_CALL(cai_sft_loader_next(j->data.loader, j->data.tokens, j->data.targets, j->data.positions, j->data.doc_ids));
    CAI_CALL(set_packing(j, j->data.local_batch));
    return tc_engine_step(&j->eng, run, step, j->data.tokens, j->data.targets, j->cfg->grad_accum, st);
}

/* The masked loss over every held-out row: the mean over the assistant's
 * tokens (each microbatch's mean weighted by its trained tokens). Rows are
 * dealt to dp ranks in turn (their tp and pp ranks take the same rows); a
 * rank short of rows runs a batch with every target ignored (a ZeRO-3
 * forward gathers weights over dp: every rank runs as many forwards).
 * Collective over the world. */
static cai_status eval_hook(void *ctx, cai_run_t *run, int64_t step, double *loss, int *ran) {
    (void)step;
    sft_job *j = ctx;
    *ran = j->data.valid != NULL;
    if (!*ran) return CAI_OK;
    cai_mesh_t *mesh = cai_run_mesh(run);
    const int dp = cai_mesh_size(mesh, CAI_AXIS_DP), r = cai_mesh_rank(mesh, CAI_AXIS_DP);
    const int B = j->cfg->micro_batch, T = j->cfg->seq_len;
    const int64_t rows = cai_sft_dataset_size(j->data.valid), per_round = (int64_t)B * dp;
    double sums[2] = {0, 0}; /* loss * trained tokens, trained tokens */
    int64_t idx[B];
    for (int64_t at = 0; at < rows; at += per_round) {
        int64_t n = 0;
        for (int b = 0; b < B; b++) {
            int64_t row = at + (int64_t)r * B + b;
            if (row < rows) idx[n++] = row;
        }
        for (size_t i = 0; i < (size_t)B * (size_t)T; i++) {
            j->data.targets[i] = CAI_IGNORE_INDEX;
            if (j->data.doc_ids) j->data.doc_ids[i] = -1; /* a row past the end: padding only */
        }
        if (n)
            CAI_CALL(cai_sft_dataset_batch(j->data.valid, idx, n, j->data.tokens, j->data.targets, j->data.positions,
                                           j->data.doc_ids));
        CAI_CALL(set_packing(j, B));
        int64_t trained = 0;
        for (size_t i = 0; i < (size_t)B * (size_t)T; i++) trained += j->data.targets[i] != CAI_IGNORE_INDEX;
        double l = 0;
        if (j->pipe) {
            CAI_CALL(cai_pipeline_eval(j->pipe, j->data.tokens, j->data.targets, 1, &l));
        } else {
            float f = 0;
            CAI_CALL(cai_model_forward(j->eng.model, j->data.tokens, j->data.targets, &f));
            l = f;
        }
        sums[0] += l * (double)trained;
        sums[1] += (double)trained;
    }
    CAI_CALL(cai_allreduce(mesh, CAI_AXIS_DP, sums, sums, 2, CAI_DTYPE_F64, CAI_RED_SUM));
    *loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    return CAI_OK;
}

static cai_status save_hook(void *ctx, cai_run_t *run, cai_ckpt_meta *m, const char *dir, int keep, char *path,
                            size_t cap, cai_ckpt_stats *st) {
    sft_job *j = ctx;
    m->consumed_samples = cai_sft_loader_consumed(j->data.loader);
    m->data_seed = (uint64_t)j->cfg->data_seed;
    if (j->lora.l) return lora_app_save(&j->lora, run, m, dir, keep, path, cap, st);
    return tc_engine_save(&j->eng, run, m, dir, keep, path, cap, st);
}

static cai_status load_hook(void *ctx, cai_run_t *run, const char *path, cai_ckpt_meta *m, cai_ckpt_stats *st) {
    sft_job *j = ctx;
    if (j->lora.l) CAI_CALL(lora_app_load(&j->lora, run, path, m, st));
    else CAI_CALL(tc_engine_load(&j->eng, run, path, m, st));
    if (m->data_seed != (uint64_t)j->cfg->data_seed)
        CAI_WARN("%s was trained with train.seed=%llu, this run uses %lld: the row order changes from here", path,
                 (unsigned long long)m->data_seed, (long long)j->cfg->data_seed);
    return data_seek(j->cfg, &j->data, cai_run_mesh(run), m->consumed_samples);
}

/* ------------------------------------------------------------------ building */

/* Decided from the config alone, alike on every rank, before anything is
 * read: the layout and what the engine cannot do here. */
static cai_status check_config(const sft_config *c, int world, cai_layout *L) {
    const int rest = c->tp * c->pp;
    *L = (cai_layout){c->pp, c->dp ? c->dp : (world % rest ? 0 : world / rest), 1, 1, c->tp, NULL};
    CAI_CALL(cai_layout_validate(world, L, NULL));
    if (!*c->train_path) return CAI_ERROR(CAI_ERR_CONFIG, "data.train is required (a chat JSONL file or a prefix)");
    if (c->pp > 1 && (c->tr.zero_stage > 1 || c->tr.zero_offload))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "mesh.pp=%d composes with dp and tp at ZeRO stage 0 or 1 without offload: zero.stage=%d "
                         "zero.offload=%s (stages 2/3 reduce and gather per microbatch inside the engine's own loop)",
                         c->pp, c->tr.zero_stage, c->tr.zero_offload ? "true" : "false");
    if (lora_app_on(&c->lora) && rest > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "lora.rank=%d with mesh.tp=%d mesh.pp=%d: LoRA runs data parallel only (mesh.tp=1 mesh.pp=1)",
                         c->lora.rank, c->tp, c->pp);
    return lora_app_check(&c->lora, &c->tr);
}

static tc_pp_options pp_options(const sft_config *c) {
    return (tc_pp_options){c->pp, c->pp_schedule, c->pp_virtual, c->pp_slots, c->pp_layers};
}

/* The layout against the source's architecture, once it is known. */
static cai_status check_model_layout(const sft_config *c, const cai_model_config *m, int world, const cai_layout *L) {
    cai_model_config resolved;
    CAI_CALL(cai_model_config_resolve(m, &resolved));
    cai_layout_model lm = {resolved.n_heads, resolved.n_kv_heads, c->pp > 1 ? 0 : resolved.n_layers, 0, 0, 0};
    CAI_CALL(cai_layout_validate(world, L, &lm));
    if (resolved.ffn_hidden % c->tp != 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "mesh.tp=%d does not divide %s's ffn_hidden=%d (the MLP splits over tp)",
                         c->tp, c->model_path, resolved.ffn_hidden);
    if (c->pp <= 1) return CAI_OK;
    const tc_pp_options po = pp_options(c);
    return tc_pp_layout(&po, resolved.n_layers, c->grad_accum, c->act_ckpt, NULL, NULL);
}

static cai_run_config run_config(const sft_config *c, const cai_layout *layout, int64_t steps) {
    cai_run_config r = {.program = "colossal-sft", .schema = &k_schema, .app_cfg = c, .opt = &c->run, .steps = steps};
    cai_mesh_config_init(&r.mesh);
    r.mesh.layout = *layout;
    r.mesh.watchdog_timeout_s = c->watchdog;
    r.mesh.nccl_overlap_ctas = c->tr.zero_overlap_ctas;
    return r;
}

/* The model's config from its source with this run's sequence length and
 * precision, planned against train.mem_limit; then the engine with the
 * source's weights. */
static cai_status build(sft_job *j, sft_config *c, cai_run_t *run) {
    cai_model_config m = j->src.m.config, resolved;
    if (c->seq_len > m.max_seq_len)
        return CAI_ERROR(CAI_ERR_CONFIG, "train.seq_len=%d: %s holds positions up to %d", c->seq_len, c->model_path,
                         m.max_seq_len);
    m.activation_checkpointing = c->act_ckpt;
    tc_apply_precision(&c->tr, cai_run_device(run), &m);
    CAI_CALL(cai_model_config_resolve(&m, &resolved));
    const int lora = lora_app_on(&c->lora);
    cai_rank_view view = cai_run_view(run);
    if (c->pp > 1) {
        const tc_pp_options po = pp_options(c);
        CAI_CALL(tc_pp_init(&j->pp, &po, resolved.n_layers, c->grad_accum, c->act_ckpt, view.pp_rank));
        tc_pp_view(&j->pp, &view);
    }
    if (lora)
        CAI_CALL(lora_app_create(&j->lora, &c->lora, cai_run_device(run), &resolved, (uint64_t)c->data_seed,
                                 cai_mesh_rank(cai_run_mesh(run), CAI_AXIS_DP)));
    cai_mem_plan_request q = {.model = resolved,
                              .batch = c->micro_batch,
                              .seq_len = c->seq_len,
                              .view = view,
                              .dp = cai_mesh_size(cai_run_mesh(run), CAI_AXIS_DP),
                              .zero = tc_zero_config(&c->tr),
                              .dev = cai_run_device(run),
                              .lora_flat = lora ? (size_t)cai_lora_numel(j->lora.l) : 0,
                              .pp_inflight = j->pp.slots,
                              .pp_microbatches = c->pp > 1 ? c->grad_accum : 0,
                              .pp_split = c->pp > 1 && tc_pp_split_backward(&j->pp)};
    const cai_fp8_config f8 = tc_fp8_config(&c->tr);
    q.fp8 = &f8;
    if (c->pp > 1) CAI_CALL(cai_pipeline_boundaries_shared(cai_run_mesh(run), cai_run_device(run), &q.pp_shared));
    if (lora) {
        cai_tensor g;
        cai_lora_flat(j->lora.l, NULL, &g);
        q.lora_flat = (size_t)cai_tensor_numel(&g);
    }
    CAI_CALL(cai_run_plan_memory(run, &q));
    cai_model_options mo = cai_model_options_default(&resolved);
    mo.batch = c->micro_batch;
    mo.seq_len = c->seq_len;
    mo.view = view;
    mo.mesh = cai_run_mesh(run);
    if (c->pp > 1) {
        mo.act_slots = j->pp.slots;
        mo.split_backward = tc_pp_split_backward(&j->pp);
    }
    if (lora) {
        CAI_CALL(
            lora_app_engine(&j->lora, &c->lora, &j->eng, run, &c->tr, j->steps, &resolved, &mo, load_weights, &j->src));
        return data_seek(c, &j->data, cai_run_mesh(run), 0);
    }
    /* the source's weights into the engine's masters at any stage and layout */
    CAI_CALL(tc_engine_create(&j->eng, run, &c->tr, j->steps, &resolved, &mo, NULL, NULL));
    if (j->src.m.hf) CAI_CALL(cai_hf_import_zero(j->src.h, j->eng.zero));
    else CAI_CALL(cai_ckpt_load_zero_weights(cai_run_mesh(run), j->src.m.ckpt, j->eng.zero));
    if (c->pp > 1) {
        CAI_CALL(cai_pipeline_create(&j->pipe, cai_run_mesh(run), j->eng.model, (cai_pp_style)c->pp_schedule));
        CAI_CALL(cai_pipeline_set_zero(j->pipe, j->eng.zero));
        CAI_CALL(cai_pipeline_driver(j->pipe, j->eng.optim, &j->eng.driver));
    }
    CAI_CALL(tc_engine_ready(&j->eng, run, &c->tr, &resolved, c->pp <= 1));
    return data_seek(c, &j->data, cai_run_mesh(run), 0);
}

static void print_header(sft_job *j, cai_run_t *run, const cai_app *app) {
    const sft_config *c = j->cfg;
    const cai_model_config *mc = cai_model_config_of(j->eng.model);
    const int dp = cai_mesh_size(cai_run_mesh(run), CAI_AXIS_DP);
    char layout[128];
    cai_layout_str(cai_mesh_layout(cai_run_mesh(run)), layout, sizeof layout);
    printf("colossal-sft %s: %d rank%s, %s, device %s\n", cai_version_string(), app->size, app->size == 1 ? "" : "s",
           layout, cai_run_device(run)->name);
    char grown[96] = "";
    if (j->data.source_vocab && mc->vocab_size > j->data.source_vocab)
        snprintf(grown, sizeof grown, ", grown from %d: the added rows start as the mean of the source's",
                 j->data.source_vocab);
    printf("model: %s from %s (%s, %d layers, d_model %d, vocab %d%s), tokenizer %s\n",
           cai_model_family_name(mc->family), c->model_path, j->src.m.hf ? "Hugging Face" : "checkpoint", mc->n_layers,
           mc->d_model, mc->vocab_size, grown, *j->src.tokenizer ? j->src.tokenizer : "byte-level");
    printf("data: %s\n", j->data.source);
    if (j->data.valid)
        printf("eval: masked loss over %lld held-out rows of %s\n", (long long)cai_sft_dataset_size(j->data.valid),
               c->valid_path);
    printf(
        "batch: %lld rows x %d tokens per step (micro_batch %d x grad_accum %d x dp %d); %lld steps = "
        "%.2f epochs\n",
        (long long)j->data.global_batch, c->seq_len, c->micro_batch, c->grad_accum, dp, (long long)j->steps,
        (double)(j->steps * j->data.global_batch) / (double)cai_sft_dataset_size(j->data.train));
    if (j->pipe)
        printf(
            "pipeline: %s over pp %d x %d chunk%s, %d microbatches a step (train.grad_accum); activation slots %d of "
            "the %d in flight%s; boundaries over %s\n",
            tc_pp_schedules[c->pp_schedule], c->pp, j->pp.spec.virtual_stages,
            j->pp.spec.virtual_stages == 1 ? "" : "s", c->grad_accum, j->pp.slots, j->pp.slots_needed,
            j->pp.slots < j->pp.slots_needed ? " (the others recompute their forward)" : "",
            cai_pipeline_transport(j->pipe));
    tc_engine_print_optim(&j->eng);
    if (j->lora.l) lora_app_print(&j->lora, j->eng.model);
    else tc_engine_print_zero(&j->eng, &c->tr, dp);
    printf("run dir: %s (config.yaml, metrics.jsonl, tokenizer/)\n", c->run.dir);
    fflush(stdout);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    cai_run_signals_install(); /* first: a signal during start-up waits for the first step */
    tc_fill_choices();
    sft_config cfg;
    cai_app app;
    cai_app_init(&app, &argc, &argv, &k_schema, &cfg, offsetof(sft_config, common));
    cai_layout layout;
    cai_app_check_all(check_config(&cfg, app.size, &layout), 2);
    sft_job job = {.cfg = &cfg};
    cai_app_check_all(open_source(&cfg, &job.src), 2);
    cai_app_check_all(check_model_layout(&cfg, &job.src.m.config, app.size, &layout), 2);
    if (cfg.seq_len == 0) cfg.seq_len = job.src.m.config.max_seq_len;

    cai_app_check_all(data_init(&cfg, &job.data, &job.src, &app, layout.dp), 2);
    job.steps = cfg.steps ? cfg.steps
                          : (int64_t)((cfg.epochs * (double)cai_sft_dataset_size(job.data.train) +
                                       (double)job.data.global_batch - 1) /
                                      (double)job.data.global_batch);
    cai_app_check_all(tc_check(&cfg.tr, job.steps), 2); /* the schedule's length is known now */
    cai_run_t *run = NULL;
    cai_run_config rc = run_config(&cfg, &layout, job.steps);
    cai_app_check_all(cai_run_init(&run, &rc, MPI_COMM_WORLD), 1);
    cai_app_check_all(build(&job, &cfg, run), 2);
    cai_run_hooks hooks = {&job, step_hook, eval_hook, save_hook, load_hook};
    cai_app_check_all(cai_run_resume(run, &hooks), 1);
    if (job.lora.l) cai_app_check(cai_run_set_adapters(run, (int64_t)cai_lora_numel(job.lora.l)));
    cai_app_check(cai_run_start(run, job.eng.model, cfg.seq_len, job.data.global_batch * cfg.seq_len));
    if (app.rank == 0) print_header(&job, run, &app);
    cai_app_check(cai_run_train(run, &hooks, cfg.eval_interval ? cfg.eval_interval : job.steps));
    cai_app_check(cai_run_finish(run));
    if (job.lora.l && cfg.lora.export_on && !cai_run_stopped_by(run) && app.rank == 0)
        cai_app_check(lora_app_export(&job.lora, job.eng.model, cfg.run.dir, cfg.model_path,
                                      *job.src.tokenizer ? job.src.tokenizer : NULL));

    int exit_code = cai_run_exit_code(run);
    cai_pipeline_free(job.pipe);
    tc_pp_free(&job.pp);
    tc_engine_free(&job.eng);
    lora_app_free(&job.lora);
    data_free(&job.data);
    cai_hf_close(job.src.h);
    cai_run_free(run);
    int rc_final = cai_app_finalize(&k_schema, &cfg);
    return exit_code ? exit_code : rc_final;
}
