/* colossal-infer internals shared by apps/infer*.c: the config, the model
 * and tokenizer it loads, the requests this replica serves and the output
 * every replica's results reach through world rank 0. */
#ifndef COLOSSAL_APP_INFER_H
#define COLOSSAL_APP_INFER_H

#include <stdint.h>
#include <mpi.h>
#include <stdio.h>

#include "app_common.h"
#include "colossal/infer.h"
#include "colossal/run.h"

enum { IJ_SCORE_NONE = 0, IJ_SCORE_PERPLEXITY, IJ_SCORE_CHOICE };
enum { IJ_ON_ERROR_LINE = 0, IJ_ON_ERROR_FAIL };
enum { IJ_DTYPE_AUTO = 0, IJ_DTYPE_F32, IJ_DTYPE_BF16, IJ_DTYPE_F16 };

typedef struct {
    char *model_path, *tokenizer, *eos, *bos;
    int dtype;
    int tp, dp;
    double watchdog;
    char *input, *output, *shard, *chat_template;
    int format, on_error, strict_keys, score;
    int block_size, max_batch, max_tokens_per_step, kv_dtype, prefix_sharing;
    int64_t kv_memory, n_blocks, seed;
    double progress;
    /* request defaults */
    int max_new_tokens, top_k, logprobs;
    double temperature, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty;
    cai_run_options run;
    cai_app_common common;
} ij_config;

typedef struct {
    cai_bpe_t *bpe; /* NULL: byte-level */
    int32_t eos, bos;
    char source[4096];
} ij_tokenizer;

cai_status ij_encode(const ij_tokenizer *t, const char *text, size_t len, cai_token_buf *out);
cai_status ij_decode(void *tok, const int32_t *ids, size_t n, cai_byte_buf *out);

/* The input file's lines (every rank reads them). */
typedef struct {
    char *data;
    size_t size;
    size_t *start, *len; /* per line, without the newline */
    int64_t n;
} ij_lines;
cai_status ij_lines_read(const char *path, ij_lines *out);
void ij_lines_free(ij_lines *l);

/* Results travel to world rank 0, the only writer of the output file: each
 * line is written whole with one write(2), and a rerun skips the ids it
 * holds. */
typedef struct {
    MPI_Comm world;
    int rank, writer_count; /* writers: the tp-rank-0 ranks */
    int is_writer;
    int fd;       /* rank 0 */
    int64_t done; /* rank 0: lines written by every replica */
    int64_t tokens;
    int finished_writers;
} ij_output;
cai_status ij_output_open(ij_output *o, const char *path, MPI_Comm world, int is_writer);
/* A writer's line (with its newline); `tokens` counts generated tokens for the progress line. */
cai_status ij_output_emit(ij_output *o, const char *line, size_t len, int64_t tokens);
/* Rank 0: write what other writers sent. Not collective. */
cai_status ij_output_poll(ij_output *o);
/* Collective over the world: every writer says it is done; rank 0 writes the rest. */
cai_status ij_output_close(ij_output *o);

/* The output path of shard i of n ({shard} replaced, or ".i-of-n" before the extension). */
cai_status ij_shard_path(const char *output, int shard, int n_shards, char *out, size_t cap);
/* infer.shard "i/n", else SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT (from SLURM_ARRAY_TASK_MIN), else 0/1. */
cai_status ij_shard(const char *spec, int *shard, int *n_shards);

/* Scoring jobs (apps/infer_score.c). */
typedef struct {
    const ij_config *cfg;
    cai_engine_t *engine;
    ij_tokenizer *tok;
    ij_output *out;
    const cai_model_config *model;
    const cai_chat_template_t *chat; /* how messages become a prompt */
    int replica, n_replicas, shard, n_shards;
    const char *out_path;
    MPI_Comm tp_comm; /* MPI_COMM_NULL at tp = 1 */
    int stopped_by;   /* the signal that stopped the job, 0: none */
} ij_job;
cai_status ij_score(ij_job *j);

#endif
