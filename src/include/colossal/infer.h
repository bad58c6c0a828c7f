/* The inference layer (src/infer/, above run): token sampling, batch-job
 * request and result lines, and the engine (a paged KV cache and a
 * continuous-batching scheduler over the model layer's weights). See
 * docs/infer.md. */
#ifndef COLOSSAL_INFER_H
#define COLOSSAL_INFER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "colossal/base.h"
#include "colossal/cluster.h"
#include "colossal/data.h"
#include "colossal/model.h"
#include "colossal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Sampling (src/infer/sample.c). Pure host code over one F32 logits row.
 * ====================================================================== */

#define CAI_SAMPLE_MAX_STOP 8      /* stop strings per request */
#define CAI_SAMPLE_MAX_STOP_IDS 16 /* stop token ids per request */
#define CAI_SAMPLE_MAX_LOGPROBS 20 /* top alternatives reported per token */

typedef struct {
    int max_new_tokens;       /* >= 1 */
    float temperature;        /* 0: greedy (argmax, lowest id among equals) */
    int top_k;                /* 0: off; tokens tied with the k-th largest logit stay (HF) */
    float top_p;              /* (0, 1]; 1: off */
    float min_p;              /* [0, 1]; 0: off (keep tokens with p >= min_p * p_max) */
    float repetition_penalty; /* > 0; 1: off. HF/CTRL: a logit of a token seen in the prompt or the
                               * output is divided by it when positive, multiplied when negative */
    float frequency_penalty;  /* [-2, 2]; 0: off. OpenAI: logit -= f * (times the token is in the output) */
    float presence_penalty;   /* [-2, 2]; 0: off. OpenAI: logit -= p when the token is in the output */
    uint64_t seed;            /* token k of the output draws cai_rng_uniform(seed, cai_hash64("cai.sample"), k) */
    int has_seed;             /* 0: the engine derives seed from the job seed and the request id */
    int32_t stop_ids[CAI_SAMPLE_MAX_STOP_IDS];
    int n_stop_ids;
    char *stop[CAI_SAMPLE_MAX_STOP]; /* stop strings (owned, malloc'd); the text ends before the match */
    int n_stop;
    int ignore_eos; /* 1: the end-of-text token does not finish the request */
    int logprobs;   /* -1: none; 0: the chosen token's log-probability; n: plus the top n (<= 20) */
} cai_sampling_params;

/* max_new_tokens 16, greedy, every filter and penalty off, no stops, no
 * logprobs, seed 0 (has_seed 0). */
cai_sampling_params cai_sampling_default(void);
/* Ranges above, plus non-empty stop strings and stop ids >= 0; the error
 * (CAI_ERR_INVALID_ARG) names the field ("temperature=-1: must be >= 0"). */
cai_status cai_sampling_check(const cai_sampling_params *p);
/* Deep copy (stop strings; dst is overwritten, not freed) / release of the
 * owned strings stop[0, n_stop). */
cai_status cai_sampling_copy(cai_sampling_params *dst, const cai_sampling_params *src);
void cai_sampling_free(cai_sampling_params *p);

/* Scratch for cai_sample over a vocabulary of up to `vocab` ids. */
typedef struct cai_sample_ws cai_sample_ws_t;
cai_status cai_sample_ws_create(cai_sample_ws_t **out, int64_t vocab);
void cai_sample_ws_free(cai_sample_ws_t *ws);

/* logprob and the alternatives are filled when p->logprobs >= 0 (0 and
 * n_top 0 otherwise). */
typedef struct {
    int32_t token;
    float logprob; /* log-softmax of the raw logits (before penalties and temperature) at token */
    int n_top;     /* min(logprobs, number of logits that are not -inf) when logprobs > 0 */
    int32_t top_ids[CAI_SAMPLE_MAX_LOGPROBS];
    float top_logprobs[CAI_SAMPLE_MAX_LOGPROBS]; /* descending; ties: lower id first */
} cai_sample_result;

/* The next token from logits[0, vocab) (penalised in place). history holds
 * the prompt's n_prompt ids followed by the output so far (n_history in
 * all): penalties read it (only when one is on). `step` is the index of
 * the token being drawn within the output (0 for the first), so a
 * request's draws do not depend on what else is batched with it. Order:
 * penalties, temperature, top-k, top-p, min-p (each as in Hugging Face's
 * logits processors), then one uniform draw u against the renormalised
 * distribution: the first token, in descending probability with the lower
 * id first among equals, at which the cumulative probability exceeds u.
 * Deterministic. A -inf logit is a masked token; NaN, +inf, an id out of
 * range in history, or every logit -inf is CAI_ERR_INVALID_ARG. Not
 * collective; one ws per thread. */
cai_status cai_sample(cai_sample_ws_t *ws, const cai_sampling_params *p, float *logits, int64_t vocab,
                      const int32_t *history, int64_t n_prompt, int64_t n_history, int64_t step,
                      cai_sample_result *out);

/* ======================================================================
 * Batch-job lines (src/infer/request.c): requests in, results out, as
 * JSON lines. Two formats: colossal's own ({"id", "prompt" | "messages",
 * sampling fields}) and the OpenAI Batch API's ({"custom_id", "method",
 * "url", "body"}). Pure host code (jansson).
 * ====================================================================== */

typedef enum {
    CAI_JOB_AUTO = 0, /* per line: OpenAI when it has custom_id, else native */
    CAI_JOB_NATIVE,
    CAI_JOB_OPENAI,
    CAI_JOB_FORMAT_COUNT
} cai_job_format;
extern const char *const cai_job_format_names[]; /* "auto", "native", "openai" */

typedef struct {
    char *id;              /* "id" (a string, or an integer as its decimal text) or "custom_id" (a string) */
    cai_job_format format; /* NATIVE or OPENAI: how the result line is written */
    int chat;              /* 1: messages (OpenAI: /v1/chat/completions) */
    char *prompt;          /* text prompt (chat 0), NULL when prompt_ids is given */
    int32_t *prompt_ids;   /* "prompt_token_ids" / an OpenAI token-array prompt; NULL otherwise */
    int64_t n_prompt_ids;
    cai_chat_message *messages;
    int n_messages;
    char *model; /* OpenAI body.model (echoed in the response), may be NULL */
    char *url;   /* OpenAI url, may be NULL */
    cai_sampling_params sampling;
    int64_t line; /* 1-based line number in the input */
} cai_job_request;

/* Parse one line (without its newline; len bytes) of `file` (NULL:
 * "(input)"). A native line has exactly one of "prompt" (a string),
 * "messages" and "prompt_token_ids". An OpenAI line has "url"
 * "/v1/chat/completions" (body "messages") or "/v1/completions" (body
 * "prompt": a string, token ids, or a one-element array of either),
 * "body", and "method" "POST" when given. A message is {"role",
 * "content"} with content a string or OpenAI's text parts (joined with
 * "\n"). Sampling fields start from `defaults` (NULL:
 * cai_sampling_default()) and may be overridden per request: native
 * "max_new_tokens" | "max_tokens", "temperature", "top_k" (-1: off, as
 * vLLM), "top_p", "min_p", "repetition_penalty", "frequency_penalty",
 * "presence_penalty", "seed", "stop" (string or array; replaces the
 * defaults' stops), "stop_token_ids", "ignore_eos", "logprobs" (true: the
 * chosen token's, n: plus the top n), "top_logprobs" (n); OpenAI the same
 * inside body ("max_tokens" / "max_completion_tokens"; chat "logprobs" is
 * a bool with "top_logprobs" beside it, completions' an int; "n" must be
 * 1, "stream" false; "user" ignored). null is the same as an absent key.
 * An unknown key is refused when strict_keys (the error names it and
 * lists the known ones), ignored otherwise. Errors are CAI_ERR_FORMAT
 * naming file, line and field ("requests.jsonl:3: field 'temperature':
 * must be a number, not a string"; a value out of range carries
 * cai_sampling_check's message after the prefix); *out is zeroed on
 * failure, except that out->id (when the line had a readable id),
 * out->format (once known) and out->line are kept so the caller can write
 * an error result line for it. Free *out after success and failure alike. */
cai_status cai_job_request_parse(const char *file, int64_t line, const char *text, size_t len, cai_job_format format,
                                 const cai_sampling_params *defaults, int strict_keys, cai_job_request *out);
void cai_job_request_free(cai_job_request *r);

/* Chat templates (cai_chat_render, cai_chat_template_names) are in the data
 * layer: colossal/data.h. */

typedef struct {
    const char *id;
    cai_job_format format; /* NATIVE or OPENAI */
    int chat;              /* OpenAI: chat.completion (message) or text_completion (text) */
    const char *model;     /* OpenAI: echoed; NULL: "colossal" */
    const char *text;      /* generated text (not NUL-terminated: text_len bytes; invalid UTF-8 is replaced) */
    size_t text_len;
    const int32_t *token_ids;
    int64_t n_tokens;
    const char *finish_reason; /* "stop", "length", "error" */
    int64_t prompt_tokens;
    const cai_sample_result *logprobs; /* n_tokens entries, or NULL */
    const cai_bpe_t *tok;              /* spells logprob tokens; NULL: ids only */
    const char *error;                 /* finish_reason "error": the message */
} cai_job_result;

/* One result line, '\n' included, appended to out (a NUL kept after
 * out->len). Native: {"id", "text", "token_ids", "finish_reason", "usage":
 * {"prompt_tokens", "completion_tokens", "total_tokens"}, ["logprobs":
 * [{"token_id", ["token"], "logprob", "top_logprobs": [{"token_id",
 * ["token"], "logprob"}]}]], ["error"]}. OpenAI: {"id": "batch_req_<id>",
 * "custom_id", "response": {"status_code": 200, "request_id": "<id>",
 * "body": {"id": "chatcmpl-<id>" | "cmpl-<id>", "object", "created",
 * "model", "choices": [{"index", "message" | "text", "logprobs",
 * "finish_reason"}], "usage"}}, "error": null} as the Batch API writes
 * them, logprobs in OpenAI's chat ({"content": [{"token", "logprob",
 * "bytes", "top_logprobs"}]}) or completions ({"tokens",
 * "token_logprobs", "top_logprobs", "text_offset"}) shape, tokens spelled
 * "token_id:N" (vLLM's spelling) when tok is NULL. A failed request:
 * "response": {"status_code": 400, "request_id", "body": {"error":
 * {"message", "type": "invalid_request_error", "param", "code"}}} and
 * "error": {"code": "invalid_request", "message"}. Strings with invalid
 * UTF-8 get U+FFFD per maximal ill-formed subsequence; a logprob of -inf
 * is written -9999 (JSON has no infinity; vLLM's value). */
cai_status cai_job_result_line(const cai_job_result *r, cai_byte_buf *out);

/* Ids already answered in an output file: a rerun skips them. Each
 * complete line's "custom_id", else its "id" (a string, or an integer as
 * its decimal text), is added to `done`; blank lines are skipped; a
 * complete line that is not such a result is CAI_ERR_FORMAT naming the
 * file and line (never dropped). A last line without its newline (a
 * writer killed mid-line) is cut off the file so that appending continues
 * whole lines. Missing file: nothing added. lines_kept (results read) and
 * bytes_cut may be NULL. */
typedef struct cai_id_set cai_id_set_t;
cai_status cai_id_set_create(cai_id_set_t **out);
void cai_id_set_free(cai_id_set_t *s);
cai_status cai_id_set_add(cai_id_set_t *s, const char *id); /* duplicates are kept once */
int cai_id_set_has(const cai_id_set_t *s, const char *id);
size_t cai_id_set_count(const cai_id_set_t *s);
cai_status cai_job_output_scan(const char *path, cai_id_set_t *done, int64_t *lines_kept, int64_t *bytes_cut);

/* Multiple-choice items for scoring: {"id" (string or integer), "context"
 * (a string, may be empty), "choices": [at least 2 non-empty strings],
 * "answer": index (optional)}; other keys are ignored. Errors as for
 * request lines; on failure *out is zeroed except id (when readable) and
 * line. */
typedef struct {
    char *id, *context;
    char **choices;
    int n_choices;
    int answer; /* -1 when absent */
    int64_t line;
} cai_choice_item;
cai_status cai_choice_item_parse(const char *file, int64_t line, const char *text, size_t len, cai_choice_item *out);
void cai_choice_item_free(cai_choice_item *c);

/* ======================================================================
 * The engine (src/infer/engine.c, src/infer/kv_cache.c): continuous
 * batching over a paged KV cache. One engine serves one model replica:
 * under tensor parallelism every rank of the tp group runs the same calls
 * with the same requests (the collectives are over the mesh's tp axis) and
 * draws the same tokens.
 * ====================================================================== */

typedef struct {
    int block_size;          /* tokens per KV block (default 16) */
    int64_t n_blocks;        /* blocks in the pool; 0: as many as kv_memory holds */
    size_t kv_memory;        /* bytes for the pool when n_blocks is 0 (default 256 MiB) */
    cai_dtype kv_dtype;      /* F32, BF16 or F16; CAI_DTYPE_COUNT: the activations' dtype */
    int max_batch;           /* sequences in one step (default 64) */
    int max_tokens_per_step; /* query tokens in one step: prefill chunks plus decodes (default 2048) */
    int max_score_rows;      /* log-probability rows of scored prompts per step (default 512) */
    int prefix_sharing;      /* 1: prompts share the cached blocks of identical prefixes (default 1) */
    int32_t eos_id;          /* end of text; -1: none */
    uint64_t seed;           /* requests without a seed draw from (seed, their tag) */
    int graphs;              /* 1: decode steps replay a device graph per batch-size bucket (powers of two up to
                              * max_batch) where the backend has graphs and tp = 1 (default 1) */
} cai_engine_options;

cai_engine_options cai_engine_options_default(void);

typedef struct cai_engine cai_engine_t;

/* Over `w` (read live: an update of the weights is what the next step
 * uses) on w's device; mesh's tp axis must match w's view (NULL when tp =
 * 1); the whole model on this rank (pp = 1). Allocates the KV pool and the
 * step buffers once. Not collective. */
cai_status cai_engine_create(cai_engine_t **out, cai_weights_t *w, cai_mesh_t *mesh, const cai_engine_options *opt);
void cai_engine_free(cai_engine_t *e);

/* Queue a request: the prompt's ids (copied), its sampling (copied), and
 * `tag`, the caller's handle. score = 1: no generation; the request
 * finishes once its prompt has been read, with the log-probability of
 * every prompt token after the first given those before it. A prompt the
 * model's context cannot hold (with at least one new token) or the pool
 * cannot hold is refused (CAI_ERR_INVALID_ARG naming the sizes). */
cai_status cai_engine_add(cai_engine_t *e, int64_t tag, const int32_t *prompt, int64_t n_prompt,
                          const cai_sampling_params *sp, int score);

/* The weights changed (an optimizer step, a load): blocks cached for
 * prefix sharing hold keys and values the old weights computed, so the
 * prefix index forgets them and later prompts compute theirs again.
 * Sequences still running keep what they hold. Not collective. */
void cai_engine_weights_changed(cai_engine_t *e);
/* Between uses (an RL job's scoring and training phases) the engine can
 * give back the device memory it holds beside the weights: the KV pool, the
 * step buffers and the decode graphs. Suspend needs no sequence running
 * (step until cai_engine_pending is 0); queued requests and finished
 * outputs stay. Resume allocates them again (the same sizes; graphs are
 * captured again at their first replay). Stepping a suspended engine fails.
 * Both are no-ops in the state they lead to. Not collective. */
cai_status cai_engine_suspend(cai_engine_t *e);
cai_status cai_engine_resume(cai_engine_t *e);
int cai_engine_suspended(const cai_engine_t *e);
/* Bytes of device memory the engine holds beside the weights (the KV pool
 * and the step buffers); 0 while suspended. */
size_t cai_engine_device_bytes(const cai_engine_t *e);
/* Stop strings need text: the engine asks `decode` for the output so far
 * after each token of a request that has stop strings. */
typedef cai_status (*cai_decode_fn)(void *ctx, const int32_t *ids, size_t n, cai_byte_buf *out);
void cai_engine_set_decoder(cai_engine_t *e, cai_decode_fn decode, void *ctx);

/* One step: schedule (running sequences first, then waiting ones, within
 * max_batch and max_tokens_per_step; a prompt longer than what is left is
 * prefilled in chunks; when the pool runs out the newest running sequence
 * is preempted and later recomputed), run the forward, sample. Collective
 * over tp. */
cai_status cai_engine_step(cai_engine_t *e);
/* Requests queued or running. */
int64_t cai_engine_pending(const cai_engine_t *e);

typedef struct {
    int64_t tag;
    int32_t *tokens; /* generated ids (the stop id that finished it included) */
    int64_t n_tokens;
    int64_t n_prompt;
    cai_sample_result *logprobs; /* n_tokens entries when the request asked for logprobs, else NULL */
    float *prompt_logprobs;      /* score requests: n_prompt - 1 entries */
    const char *finish_reason;   /* "stop" (eos, stop id or stop string) or "length" */
    int stop_string;             /* index of the stop string that matched, -1: none */
    int64_t preemptions;
} cai_engine_output;

/* Take the next finished request (1), or 0 when none is waiting to be taken.
 * Release it with cai_engine_output_free. */
int cai_engine_take(cai_engine_t *e, cai_engine_output *out);
void cai_engine_output_free(cai_engine_output *o);

typedef struct {
    int64_t steps, prefill_tokens, decode_tokens, generated, prefix_hit_tokens, preemptions, cow_copies;
    int64_t graphs;   /* decode graphs captured */
    int64_t suspends; /* cai_engine_suspend calls that gave device memory back */
    int64_t blocks_total, blocks_free;
    /* Seconds the host waited for the device at the ends of steps, from
     * the last launch to the results' arrival (the rest of a step's time
     * is the host's own: scheduling, launches, sampling). */
    double device_wait_s;
} cai_engine_stats;
void cai_engine_get_stats(const cai_engine_t *e, cai_engine_stats *st);

#ifdef __cplusplus
}
#endif
#endif
