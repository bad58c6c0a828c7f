/* The data layer: byte-level BPE tokenizer, Megatron-compatible indexed
 * datasets, GPT-style sample packing/blending and a deterministic
 * distributed sampler, plus the embedded default corpus. */
#ifndef COLOSSAL_DATA_H
#define COLOSSAL_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "colossal/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Tokenizer (src/data/bpe*.c)
 * ====================================================================== */

/* Byte-level BPE exactly as GPT-2 (and Hugging Face's ByteLevel BPE) does it:
 *   1. special tokens (e.g. "<|endoftext|>") are cut out of the text first;
 *   2. each remaining segment is split into pre-tokens by GPT-2's pattern
 *      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      (Unicode classes from a generated table, src/data/bpe_unicode.c);
 *   3. each pre-token's bytes are merged pairwise by merge rank.
 * Any byte string is accepted, valid UTF-8 or not (an invalid byte counts as
 * one punctuation-like character), and decode(encode(x)) == x for every x when
 * the vocabulary holds all 256 byte tokens (GPT-2's and every trained one do).
 * Vocabulary files use GPT-2's spelling, where each byte is a printable
 * character (space is "\u0120" 'Ġ'), as in Hugging Face's vocab.json.
 *
 * None of these functions is collective: they touch only the calling rank.
 * A handle may be read by many threads at once, except that cai_bpe_encode*
 * updates the handle's word cache: give each encoding thread its own handle
 * (cai_bpe_clone). See docs/tokenizer.md. */
typedef struct cai_bpe cai_bpe_t;

/* Growable arrays the tokenizer appends to. Start zeroed ({0}); free with
 * the matching _free (which leaves the buffer zeroed and reusable). */
typedef struct {
    int32_t *ids;
    size_t len, cap;
} cai_token_buf;
typedef struct {
    char *data;
    size_t len, cap;
} cai_byte_buf;
void cai_token_buf_free(cai_token_buf *b);
void cai_byte_buf_free(cai_byte_buf *b);
/* Append n ids (grows the buffer). */
cai_status cai_token_buf_append(cai_token_buf *b, const int32_t *ids, size_t n);

/* --- loading ------------------------------------------------------------ */

/* Hugging Face / GPT-2 files: vocab.json (a JSON object token -> id, GPT-2's
 * encoder.json) and merges.txt (one "left right" pair per line in rank order,
 * an optional first line "#version: ..."; GPT-2's vocab.bpe). Malformed input
 * fails with CAI_ERR_FORMAT naming the file and line. No special tokens are
 * registered: add them with cai_bpe_add_special (GPT-2: "<|endoftext|>"). */
cai_status cai_bpe_load(const char *vocab_json_path, const char *merges_txt_path, cai_bpe_t **out);

/* A Hugging Face tokenizer.json whose model is BPE with GPT-2's byte-level
 * pre-tokeniser (pre_tokenizer ByteLevel with use_regex, no normalizer).
 * Every entry of added_tokens becomes a special token. Other pipelines fail
 * with CAI_ERR_UNSUPPORTED naming the field. */
cai_status cai_bpe_load_hf(const char *tokenizer_json_path, cai_bpe_t **out);

/* Register `text` as a special token: matched verbatim before
 * pre-tokenisation and decoded verbatim. Uses the vocabulary's id when the
 * vocabulary spells a token exactly `text`, else appends a new id.
 * *id_out (may be NULL) receives the id. */
cai_status cai_bpe_add_special(cai_bpe_t *tok, const char *text, int32_t *id_out);

/* Independent copy (own cache): one per encoding thread. */
cai_status cai_bpe_clone(const cai_bpe_t *tok, cai_bpe_t **out);
void cai_bpe_free(cai_bpe_t *tok);

/* --- encoding and decoding ---------------------------------------------- */

/* Append the ids of text[0..len) to *out. Special tokens in the text become
 * their ids. Fails (CAI_ERR_FORMAT) only if the vocabulary lacks a byte's
 * token. Not thread-safe on one handle (word cache). */
cai_status cai_bpe_encode(cai_bpe_t *tok, const char *text, size_t len, cai_token_buf *out);
/* Same, but special tokens are not recognised: "<|endoftext|>" in the text is
 * encoded as ordinary characters (use for untrusted text). */
cai_status cai_bpe_encode_ordinary(cai_bpe_t *tok, const char *text, size_t len, cai_token_buf *out);

/* Append the bytes of ids[0..n) to *out (no terminator). An id outside the
 * vocabulary fails with CAI_ERR_INVALID_ARG naming it and its position. */
cai_status cai_bpe_decode(const cai_bpe_t *tok, const int32_t *ids, size_t n, cai_byte_buf *out);

/* --- queries ------------------------------------------------------------ */

/* Largest id + 1 (the embedding table's row count). */
int32_t cai_bpe_vocab_size(const cai_bpe_t *tok);
size_t cai_bpe_merge_count(const cai_bpe_t *tok);
/* Id of a token by its vocabulary spelling ("Hello", "\u0120world") or of a
 * special token by its text; CAI_ERR_INVALID_ARG when there is none. */
cai_status cai_bpe_token_id(const cai_bpe_t *tok, const char *spelling, int32_t *id);
/* Bytes token `id` decodes to (not NUL-terminated, owned by tok). */
cai_status cai_bpe_token_bytes(const cai_bpe_t *tok, int32_t id, const char **bytes, size_t *len);
int cai_bpe_is_special(const cai_bpe_t *tok, int32_t id);

/* --- training ----------------------------------------------------------- */

/* Learn a tokenizer from a corpus, like Hugging Face's ByteLevelBPETokenizer
 * trainer: ids 0..n_special-1 are the special tokens (in the given order),
 * the next 256 are the bytes (ordered by their GPT-2 spelling), then one
 * token per merge, learned by repeatedly merging the most frequent adjacent
 * pair over the pre-tokenised word counts (ties: the smaller pair of ids).
 * Special tokens in the corpus are cut out and not learned from. Training
 * stops at vocab_size tokens, or earlier when no pair occurs at least
 * min_frequency times (then a warning is logged and the vocabulary is
 * smaller). Pair counts are updated incrementally, so a merge costs time in
 * proportion to the words it touches. */
typedef struct {
    size_t vocab_size;                 /* total, specials and the 256 bytes included */
    const char *const *special_tokens; /* e.g. {"<|endoftext|>"}; may be NULL */
    size_t n_special;
    uint64_t min_frequency;            /* 0 or 1: any pair that occurs */
} cai_bpe_train_opts;

/* Streaming: feed documents one at a time (memory grows with the number of
 * distinct pre-tokens, not with the corpus), then finish. */
typedef struct cai_bpe_trainer cai_bpe_trainer_t;
cai_status cai_bpe_trainer_init(const cai_bpe_train_opts *opts, cai_bpe_trainer_t **out);
cai_status cai_bpe_trainer_feed(cai_bpe_trainer_t *tr, const char *text, size_t len);
cai_status cai_bpe_trainer_finish(cai_bpe_trainer_t *tr, cai_bpe_t **out);
void cai_bpe_trainer_free(cai_bpe_trainer_t *tr);

/* All at once: texts[i] has lens[i] bytes (lens may be NULL: NUL-terminated). */
cai_status cai_bpe_train(const char *const *texts, const size_t *lens, size_t n_texts,
                         const cai_bpe_train_opts *opts, cai_bpe_t **out);

/* --- saving ------------------------------------------------------------- */

/* Write dir/vocab.json, dir/merges.txt (GPT-2 / Hugging Face format, loadable
 * by cai_bpe_load and by transformers' GPT2Tokenizer) and dir/tokenizer.json
 * (loadable by cai_bpe_load_hf and Hugging Face tokenizers; it also records
 * the special tokens). Creates dir if missing; each file is written to a
 * temporary name and renamed when complete. */
cai_status cai_bpe_save(const cai_bpe_t *tok, const char *dir);

/* ====================================================== end of tokenizer */

/* ======================================================================
 * Datasets, sampling, corpus (src/data/indexed*.c, sampler*.c, corpus*.c)
 * ====================================================================== */

/* ======================================================= end of datasets */

#ifdef __cplusplus
}
#endif
#endif
