/* The parallel preprocessing engine behind cai_preprocess and
 * cai_sft_preprocess (src/data/indexed_preprocess.c): inputs cut into one
 * byte range per rank at document starts, each document turned into one
 * sequence in each of up to CAI_PP_MAX_STREAMS indexed datasets that share
 * their document boundaries, partial datasets merged with MPI-IO. Not a
 * public interface. */
#ifndef CAI_DATA_PREPROCESS_INTERNAL_H
#define CAI_DATA_PREPROCESS_INTERNAL_H

#include "colossal/data.h"

#define CAI_PP_MAX_STREAMS 2

/* One document in (its text; `file` and 1-based `line` where it starts),
 * one sequence per stream out, appended to streams[s] (which arrive empty).
 * *keep = 0 leaves the document out of every stream. */
typedef cai_status (*cai_pp_document_fn)(void *ctx, const char *file, int64_t line, const char *text, size_t len,
                                         cai_token_buf *streams, int *keep);

typedef struct {
    const char *const *inputs;
    int n_inputs;
    cai_preprocess_format format;
    const char *json_key; /* JSONL: the string at this key is the document; NULL: the whole line, unparsed */
    int n_streams;
    const char *prefixes[CAI_PP_MAX_STREAMS]; /* each writes PREFIX.bin / PREFIX.idx */
    cai_indexed_dtype dtypes[CAI_PP_MAX_STREAMS];
    int64_t vocab[CAI_PP_MAX_STREAMS]; /* values must lie below this (> 0) */
    cai_pp_document_fn document;
    void *ctx;
    double progress_interval_s;
} cai_pp_config;

/* Collective over comm, with cai_preprocess's guarantees (output independent
 * of the rank count, every rank returns the first failure, nothing left
 * behind on failure). stats (may be NULL) counts stream 0. */
cai_status cai_pp_run(const cai_pp_config *cfg, MPI_Comm comm, cai_preprocess_stats *stats);

/* The agreement step cai_pp_run uses between phases: every rank learns
 * whether any failed and gets the first failing rank's message. */
cai_status cai_pp_agree(MPI_Comm comm, cai_status st, const char *phase);

#endif
