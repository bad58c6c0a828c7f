/* colossal-pretrain internals shared by apps/pretrain*.c: the config struct
 * and the pieces main() strings together (data, reporting, sampling). */
#ifndef COLOSSAL_APP_PRETRAIN_H
#define COLOSSAL_APP_PRETRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "app_common.h"
#include "colossal/cluster.h"
#include "colossal/data.h"
#include "colossal/model.h"
#include "colossal/optim.h"
#include "colossal/run.h"
#include "train_common.h"

typedef struct {
    /* model */
    int family, n_layers, d_model, n_heads, n_kv_heads, ffn_hidden, vocab_size, vocab_multiple, tie;
    int param_dtype, act_dtype, act_ckpt;
    double rope_theta, norm_eps, init_std;
    int64_t model_seed;
    /* mesh */
    int dp, tp, pp, sp;
    int sp_mode;     /* index into k_sp_modes: 0 off, 1 split_gather, 2 all_to_all, 3 ring */
    int pp_schedule; /* a cai_pp_style (k_pp_schedules) */
    int pp_virtual;  /* model chunks per rank; 0: the schedule's default */
    int pp_slots;    /* activation slots; 0: what the schedule keeps in flight */
    char *pp_layers; /* layers per virtual stage, "4,4,3,5", or empty for an even split */
    char *pp_trace;  /* Chrome trace of the last step's pipeline, or empty */
    double watchdog;
    /* train */
    int64_t steps, data_seed;
    int micro_batch, grad_accum, seq_len;
    /* eval */
    int64_t eval_interval;
    int eval_batches;
    /* data */
    char *data_path, *split, *tokenizer, *eod;
    int64_t corpus_docs, corpus_seed;
    int corpus_vocab;
    int corpus_split_digits;
    /* generate */
    char *prompts;
    int gen_tokens;
    /* optim.*, zero.*, precision, loss_scale.* */
    tc_options tr;
    /* run.*, log.interval, checkpoint.*, train.stop_at, train.mem_limit */
    cai_run_options run;
    cai_app_common common;
} pt_config;

enum { PT_TIE_AUTO = 0, PT_TIE_FALSE = 1, PT_TIE_TRUE = 2 };

/* ------------------------------------------------------------------ data
 * (apps/pretrain_data.c) */

typedef struct {
    cai_bpe_t *bpe;     /* NULL: byte-level */
    int64_t vocab_size; /* ids are below this */
    int32_t eod;
} pt_tokenizer;

typedef struct {
    pt_tokenizer tok;
    cai_gpt_data_t *data;
    cai_gpt_dataset_t *train, *valid;
    cai_sampler_t *sampler;    /* train: this rank's slice of every global batch */
    int64_t global_batch;      /* samples per step */
    int64_t local_batch;       /* this rank's samples per step: micro_batch * grad_accum */
    int64_t valid_samples;     /* samples per evaluation (0: no validation split) */
    int64_t *indices;          /* local_batch sample indices of the current step */
    int32_t *tokens, *targets; /* [local_batch, seq_len] */
    char source[512];          /* what the data is, for the log */
} pt_data;

/* Collective over MPI_COMM_WORLD: tokenizer, then the embedded corpus
 * written and preprocessed into cfg->dir/data when no data path is given,
 * then the train/valid datasets and the train sampler. vocab_size receives
 * the vocabulary the model needs. */
cai_status pt_data_init(pt_data *d, const pt_config *cfg, cai_mesh_t *mesh, int64_t *vocab_size);
void pt_data_free(pt_data *d);
/* Continue the train sampler after `consumed` samples (resuming). Not
 * collective. */
cai_status pt_data_seek(pt_data *d, const pt_config *cfg, cai_mesh_t *mesh, int64_t consumed);
/* This rank's tokens and targets of the next global batch into d->tokens,
 * d->targets. Not collective. */
cai_status pt_data_next(pt_data *d);
/* Tokens and targets of validation batch `b` for this dp rank. */
cai_status pt_data_valid_batch(pt_data *d, int64_t b, int dp_rank);
/* Append the ids of text to out / the text of ids to out. */
cai_status pt_encode(pt_tokenizer *t, const char *text, cai_token_buf *out);
cai_status pt_decode(const pt_tokenizer *t, const int32_t *ids, size_t n, cai_byte_buf *out);

/* ------------------------------------------------------------------ samples
 * (apps/pretrain_generate.c) */

/* Greedy continuations of cfg->prompts, printed to stdout when `print`.
 * Uses the model's (B, T) buffers. Not collective by itself, but a ZeRO-3
 * model gathers each layer over dp in its forward: then every dp rank runs
 * it (the same greedy tokens everywhere) and one prints. */
cai_status pt_generate(cai_model_t *m, cai_mesh_t *mesh, pt_tokenizer *tok, const pt_config *cfg, int print);

#endif
