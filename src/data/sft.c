/* Conversations to tokens with a loss mask, the overflow policy, and the
 * parallel preprocessing of chat JSONL into a token dataset and a mask
 * dataset that share their document boundaries. */
#include "cai_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/data.h"
#include "preprocess_internal.h"

const char *const cai_sft_overflow_names[] = {"truncate", "drop", NULL};

cai_sft_fit_result cai_sft_fit(cai_sft_tokens *t, int64_t seq_len, cai_sft_overflow policy) {
    cai_sft_fit_result res = CAI_SFT_KEPT;
    if (seq_len > 0 && t->len > (size_t)seq_len + 1) {
        if (policy == CAI_SFT_DROP) return CAI_SFT_DROPPED;
        t->len = (size_t)seq_len + 1;
        res = CAI_SFT_TRUNCATED;
    }
    /* token 0 is never a target: only 1.. can be learned */
    for (size_t i = 1; i < t->len; i++)
        if (t->mask[i]) return res;
    return CAI_SFT_DROPPED;
}

cai_status cai_sft_mask_prefix(const char *prefix, char *out, size_t cap) {
    CAI_CHECK_ARG(prefix && out, "cai_sft_mask_prefix: no prefix");
    const int n = snprintf(out, cap, "%s_loss_mask", prefix);
    if (n < 0 || (size_t)n >= cap) return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: prefix too long", prefix);
    return CAI_OK;
}

/* ------------------------------------------------------------------ preprocessing */

typedef struct {
    const cai_sft_preprocess_config *cfg;
    cai_sft_tokens toks;
    /* conversations, truncated, dropped, trained tokens (this rank) */
    int64_t counts[4];
} sft_pp;

static cai_status sft_document(void *ctx, const char *file, int64_t line, const char *text, size_t len,
                               cai_token_buf *streams, int *keep) {
    sft_pp *p = ctx;
    cai_chat_conversation conv;
    CAI_CALL(cai_chat_parse_line(file, line, text, len, p->cfg->strict_keys, &conv));
    cai_status st = cai_sft_encode(p->cfg->chat_template, p->cfg->tokenizer, conv.messages, conv.n_messages, &p->toks);
    cai_chat_conversation_free(&conv);
    if (st != CAI_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cai_error_message());
        return CAI_ERROR(st, "%s:%lld: %s", file, (long long)line, msg);
    }
    p->counts[0]++;
    const cai_sft_fit_result fit = cai_sft_fit(&p->toks, p->cfg->seq_len, p->cfg->overflow);
    *keep = fit != CAI_SFT_DROPPED;
    p->counts[1] += fit == CAI_SFT_TRUNCATED;
    p->counts[2] += fit == CAI_SFT_DROPPED;
    if (!*keep) return CAI_OK;
    CAI_CALL(cai_token_buf_append(&streams[0], p->toks.ids, p->toks.len));
    /* sized by the ids, then overwritten with the masks */
    CAI_CALL(cai_token_buf_append(&streams[1], p->toks.ids, p->toks.len));
    for (size_t i = 0; i < p->toks.len; i++) {
        streams[1].ids[i] = p->toks.mask[i];
        p->counts[3] += p->toks.mask[i];
    }
    return CAI_OK;
}

cai_status cai_sft_preprocess(const cai_sft_preprocess_config *cfg, MPI_Comm comm, cai_sft_preprocess_stats *stats) {
    CAI_CHECK_ARG(cfg && cfg->inputs && cfg->n_inputs > 0 && cfg->output_prefix && *cfg->output_prefix &&
                      cfg->chat_template,
                  "cai_sft_preprocess needs inputs, an output prefix and a chat template");
    CAI_CHECK_ARG(cfg->overflow >= 0 && cfg->overflow < CAI_SFT_OVERFLOW_COUNT, "sft preprocess: overflow policy %d",
                  (int)cfg->overflow);
    char mask[4200];
    CAI_CALL(cai_sft_mask_prefix(cfg->output_prefix, mask, sizeof mask));
    const int64_t vocab = cfg->tokenizer ? cai_bpe_vocab_size(cfg->tokenizer) : 256;
    sft_pp p = {cfg, {0}, {0}};
    cai_pp_config pc = {.inputs = cfg->inputs,
                        .n_inputs = cfg->n_inputs,
                        .format = CAI_PREPROCESS_JSONL,
                        .json_key = NULL,
                        .n_streams = 2,
                        .prefixes = {cfg->output_prefix, mask},
                        .dtypes = {cai_indexed_dtype_for_vocab(vocab), CAI_INDEXED_U8},
                        .vocab = {vocab, 2},
                        .document = sft_document,
                        .ctx = &p,
                        .progress_interval_s = cfg->progress_interval_s};
    cai_preprocess_stats ps;
    cai_status st = cai_pp_run(&pc, comm, &ps);
    cai_sft_tokens_free(&p.toks);
    CAI_CALL(st);
    int64_t glob[4];
    CAI_CALL_MPI(MPI_Allreduce(p.counts, glob, 4, MPI_INT64_T, MPI_SUM, comm));
    if (stats) {
        stats->conversations = glob[0];
        stats->written = ps.documents;
        stats->truncated = glob[1];
        stats->dropped = glob[2];
        stats->tokens = ps.tokens;
        stats->trained_tokens = glob[3];
        stats->input_bytes = ps.input_bytes;
        stats->seconds = ps.seconds;
    }
    return CAI_OK;
}
