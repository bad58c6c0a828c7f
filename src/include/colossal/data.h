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
/* A tokenizer directory: vocab.json + merges.txt, else tokenizer.json when
 * there is no vocab.json (the error then names the missing vocab.json). */
cai_status cai_bpe_load_dir(const char *dir, cai_bpe_t **out);

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

/* Digit splitting, as Llama 3 / DeepSeek / Qwen tokenizers do (Hugging
 * Face's pre_tokenizer Sequence[Digits(individual_digits=true), ByteLevel]):
 * before step 2 above the segment is cut so that each numeric character
 * (Unicode \p{N}) stands alone and each run between them is one piece, and
 * GPT-2's pattern splits each piece on its own. " 42 apples" pre-tokenises
 * as " ", "4", "2", " apples", so no token ever joins a digit to anything.
 * Saved in tokenizer.json (cai_bpe_save) and restored by cai_bpe_load_hf
 * and cai_bpe_load_dir; vocab.json + merges.txt alone cannot record it. */
int cai_bpe_split_digits(const cai_bpe_t *tok);
void cai_bpe_set_split_digits(cai_bpe_t *tok, int on);

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
    uint64_t min_frequency; /* 0 or 1: any pair that occurs */
} cai_bpe_train_opts;

/* Streaming: feed documents one at a time (memory grows with the number of
 * distinct pre-tokens, not with the corpus), then finish. */
typedef struct cai_bpe_trainer cai_bpe_trainer_t;
cai_status cai_bpe_trainer_init(const cai_bpe_train_opts *opts, cai_bpe_trainer_t **out);
/* Pre-tokenise with digit splitting (cai_bpe_set_split_digits) and give the
 * trained tokenizer the option. Call before the first feed. */
cai_status cai_bpe_trainer_set_split_digits(cai_bpe_trainer_t *tr, int on);
cai_status cai_bpe_trainer_feed(cai_bpe_trainer_t *tr, const char *text, size_t len);
cai_status cai_bpe_trainer_finish(cai_bpe_trainer_t *tr, cai_bpe_t **out);
void cai_bpe_trainer_free(cai_bpe_trainer_t *tr);

/* All at once: texts[i] has lens[i] bytes (lens may be NULL: NUL-terminated). */
cai_status cai_bpe_train(const char *const *texts, const size_t *lens, size_t n_texts, const cai_bpe_train_opts *opts,
                         cai_bpe_t **out);

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

/* Only cai_preprocess is collective (over the communicator it is given);
 * everything else here touches the calling rank alone and is deterministic,
 * so ranks that call it with the same arguments agree without talking.
 * mpi.h stays outside the C linkage block: it carries its own. */
#ifdef __cplusplus
}
#endif
#include <mpi.h>
#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- tokens */

/* The one shape every tokenizer takes for the preprocessor: append the ids
 * of `text[0..len)` to `out` (cai_token_buf from the tokenizer section).
 * `ctx` is the tokenizer's own state, e.g. a cai_bpe_t for cai_bpe_encode. */
typedef cai_status (*cai_tokenize_fn)(void *ctx, const char *text, size_t len, cai_token_buf *out);

/* Byte-level fallback tokenizer used when no BPE vocabulary is given: each
 * UTF-8 byte is its own token (0..255) and CAI_BYTE_EOD ends a document.
 * `ctx` is unused. Not collective. */
#define CAI_BYTE_VOCAB 257
#define CAI_BYTE_EOD 256
cai_status cai_byte_tokenize(void *ctx, const char *text, size_t len, cai_token_buf *out);
/* Its inverse, appended to out: ids 0..255 are bytes, CAI_BYTE_EOD spells
 * nothing, anything else is an error naming the position. */
cai_status cai_byte_detokenize(const int32_t *ids, size_t n, cai_byte_buf *out);

/* ---------------------------------------------------------------- indexed datasets
 * Megatron-LM's MMIDIDX format, byte for byte. PREFIX.idx:
 *   9 bytes "MMIDIDX\0\0", u64 version (1), u8 dtype code, u64 sequence
 *   count S, u64 document count D (= documents + 1), int32 lengths[S],
 *   int64 byte pointers[S] into .bin, int64 document indices[D] (sequence
 *   index where each document starts; first 0, last S). All little endian.
 * PREFIX.bin: the tokens of every sequence back to back in the dtype. */

/* Megatron's codes (megatron/core/datasets/indexed_dataset.py, DType). */
typedef enum {
    CAI_INDEXED_U8 = 1,
    CAI_INDEXED_I8 = 2,
    CAI_INDEXED_I16 = 3,
    CAI_INDEXED_I32 = 4,
    CAI_INDEXED_I64 = 5,
    CAI_INDEXED_F64 = 6, /* valid in the format, refused for token data */
    CAI_INDEXED_F32 = 7, /* idem */
    CAI_INDEXED_U16 = 8
} cai_indexed_dtype;

#define CAI_INDEXED_HEADER_BYTES 34

/* Bytes per element (0 for an unknown code) and a name ("uint16", "?"). */
size_t cai_indexed_dtype_size(int code);
const char *cai_indexed_dtype_name(int code);
/* Megatron's choice for a vocabulary: uint16 below 65500 ids, else int32. */
cai_indexed_dtype cai_indexed_dtype_for_vocab(int64_t vocab_size);

typedef struct cai_indexed_dataset cai_indexed_dataset_t;

/* Open PREFIX.idx and PREFIX.bin read-only by mmap and validate them
 * completely before returning: magic, version, dtype code, array sizes
 * against the .idx size, document indices (start at 0, non-decreasing, end
 * at S), lengths >= 0, pointers contiguous (pointer[i+1] = pointer[i] +
 * length[i]*itemsize, pointer[0] = 0) and the .bin size equal to the end of
 * the last sequence. With vocab_size > 0 every token is also checked to lie
 * in [0, vocab_size) (one pass over the .bin). Any failure is
 * CAI_ERR_FORMAT (CAI_ERR_IO when a file cannot be opened) naming the file,
 * the field and the index. Not collective: every rank opens its own view. */
cai_status cai_indexed_open(cai_indexed_dataset_t **out, const char *prefix, int64_t vocab_size);
void cai_indexed_free(cai_indexed_dataset_t *ds);

const char *cai_indexed_prefix(const cai_indexed_dataset_t *ds);
cai_indexed_dtype cai_indexed_get_dtype(const cai_indexed_dataset_t *ds);
int64_t cai_indexed_num_sequences(const cai_indexed_dataset_t *ds);
/* Documents (the .idx's document count minus one). */
int64_t cai_indexed_num_documents(const cai_indexed_dataset_t *ds);
int64_t cai_indexed_num_tokens(const cai_indexed_dataset_t *ds);
/* Unchecked accessors (i in range is the caller's contract). */
int32_t cai_indexed_sequence_length(const cai_indexed_dataset_t *ds, int64_t i);
int64_t cai_indexed_sequence_pointer(const cai_indexed_dataset_t *ds, int64_t i);
/* document_indices[d], d in [0, num_documents]: the first sequence of
 * document d (and, for d = num_documents, the sequence count). */
int64_t cai_indexed_document_start(const cai_indexed_dataset_t *ds, int64_t d);
/* Tokens [offset, offset + count) of sequence `seq`, widened to int32.
 * Range-checked; an int64 token that does not fit int32 is CAI_ERR_FORMAT.
 * Not collective. */
cai_status cai_indexed_read(const cai_indexed_dataset_t *ds, int64_t seq, int64_t offset, int64_t count, int32_t *out);

/* Writer (Megatron's IndexedDatasetBuilder). Writes PREFIX.bin.tmp and
 * PREFIX.idx.tmp and renames both on finish, so a reader never sees half a
 * dataset. Ids outside the dtype's range, or >= vocab_size when
 * vocab_size > 0, are refused. Not collective. */
typedef struct cai_indexed_builder cai_indexed_builder_t;

cai_status cai_indexed_builder_init(cai_indexed_builder_t **out, const char *prefix, cai_indexed_dtype dtype,
                                    int64_t vocab_size);
/* One sequence; documents are closed by end_document (Megatron add_item). */
cai_status cai_indexed_builder_add(cai_indexed_builder_t *b, const int32_t *ids, int64_t n);
cai_status cai_indexed_builder_end_document(cai_indexed_builder_t *b);
/* One sequence that is a whole document. */
cai_status cai_indexed_builder_add_document(cai_indexed_builder_t *b, const int32_t *ids, int64_t n);
/* Every sequence and document of `ds`, which must have the same dtype
 * (Megatron add_index). A document left open in `b` is an error. */
cai_status cai_indexed_builder_append(cai_indexed_builder_t *b, const cai_indexed_dataset_t *ds);
int64_t cai_indexed_builder_num_tokens(const cai_indexed_builder_t *b);
/* Write the index and rename both files into place. Frees `b` whatever the
 * outcome (temporary files are removed on failure). */
cai_status cai_indexed_builder_finish(cai_indexed_builder_t *b);
/* Give up: remove the temporary files and free. NULL is fine. */
void cai_indexed_builder_abort(cai_indexed_builder_t *b);

/* ---------------------------------------------------------------- preprocessing */

typedef enum {
    CAI_PREPROCESS_TEXT = 0, /* documents are runs of non-blank lines, separated by blank lines */
    CAI_PREPROCESS_JSONL = 1 /* one JSON object per line; the document is the string at json_key */
} cai_preprocess_format;

typedef struct {
    const char *const *inputs; /* read as one concatenated stream, in order */
    int n_inputs;
    cai_preprocess_format format;
    const char *json_key;      /* JSONL only; NULL means "text" */
    const char *output_prefix; /* writes output_prefix.bin / .idx */
    cai_tokenize_fn tokenize;
    void *tokenize_ctx;
    int64_t vocab_size;         /* picks the .bin dtype; ids must be below it */
    int32_t eod;                /* appended to every document; < 0: none */
    double progress_interval_s; /* rank 0 logs progress this often; 0: never */
} cai_preprocess_config;

typedef struct {
    int64_t documents, tokens;
    int64_t input_bytes, output_bytes; /* .bin + .idx */
    double seconds;
} cai_preprocess_stats;

/* Collective over `comm`. Tokenizes the inputs into one indexed dataset.
 * The concatenated input is cut into one byte range per rank, each start
 * moved forward to the next document start, so every document is read by
 * exactly one rank. Each rank writes PREFIX.part-R-of-P.{bin,idx}; then
 * all ranks write their part into the final files with MPI-IO at offsets
 * from a prefix sum, in document order, and the parts are removed. The
 * output is byte-identical for any number of ranks. An error on any rank
 * (malformed JSON names file:line) makes every rank return it: the others
 * get the failing rank's message, prefixed with its rank, and no final
 * files are left. Rank 0 logs progress at info level every
 * progress_interval_s. `stats` (may be NULL) holds the global totals on
 * every rank. */
cai_status cai_preprocess(const cai_preprocess_config *cfg, MPI_Comm comm, cai_preprocess_stats *stats);

/* Every document of the inputs, in order, split exactly as cai_preprocess
 * splits them (e.g. to train a tokenizer on the same documents). Stops at
 * the first error from `fn`. Not collective. */
typedef cai_status (*cai_document_fn)(void *ctx, const char *text, size_t len);
cai_status cai_preprocess_documents(const char *const *inputs, int n_inputs, cai_preprocess_format format,
                                    const char *json_key, cai_document_fn fn, void *ctx);

/* ---------------------------------------------------------------- sampling helpers */

/* Fisher-Yates over a[0..n) driven by Philox (key seed, counter
 * (stream, i)): the same permutation on every machine and rank. */
void cai_data_shuffle(int64_t *a, int64_t n, uint64_t seed, uint64_t stream);

/* Megatron's split: "98,2" or "949,50,1" (missing parts are 0; weights are
 * normalised) over n items -> bounds[0..3], split s = [bounds[s],
 * bounds[s+1]), with Megatron's rounding (each part rounded, the excess taken
 * off the later bounds). CAI_ERR_CONFIG for a malformed spec. */
typedef enum { CAI_SPLIT_TRAIN = 0, CAI_SPLIT_VALID = 1, CAI_SPLIT_TEST = 2 } cai_split;
cai_status cai_data_split_ranges(const char *spec, int64_t n, int64_t bounds[4]);

/* Megatron's blending: for each of `size` samples pick the dataset whose
 * target weight * max(i, 1) exceeds its count so far by the most (ties to the
 * lowest index; a zero weight is never picked). dataset_index[i] is that
 * dataset, dataset_sample_index[i] its running count. Weights are
 * normalised; all must be >= 0 with a positive sum. Not collective. */
cai_status cai_data_blend_indices(const double *weights, int n, int64_t size, int16_t *dataset_index,
                                  int64_t *dataset_sample_index);

/* ---------------------------------------------------------------- GPT samples
 * Megatron's GPTDataset: the sequences of a document range are repeated for
 * enough epochs and shuffled all together (the document index), flattened
 * and cut into windows of seq_len + 1 tokens that overlap by one token (the
 * sample index), and the windows are shuffled (the shuffle index). When the
 * last epoch would give fewer than 80% of an epoch's samples, its documents
 * and samples are shuffled separately, after the others, so a partial epoch
 * is not spread thinly over the whole run. Shuffles use cai_data_shuffle,
 * not numpy, so the order differs from Megatron's; the structure is the same. */

typedef struct {
    int64_t seq_len;     /* tokens per sample are seq_len + 1 (inputs and shifted targets) */
    int64_t num_samples; /* at least this many; 0: one epoch */
    uint64_t seed;
} cai_gpt_config;

typedef struct cai_gpt_dataset cai_gpt_dataset_t;

/* Documents [doc_begin, doc_end) of `ds` (which must outlive the result).
 * CAI_ERR_INVALID_ARG when the range holds fewer than seq_len + 1 tokens.
 * Not collective: every rank builds the same indices. */
cai_status cai_gpt_dataset_init(cai_gpt_dataset_t **out, const cai_indexed_dataset_t *ds, int64_t doc_begin,
                                int64_t doc_end, const cai_gpt_config *cfg);
/* A weighted blend of n parts (document ranges doc_ranges[2i], [2i+1] of
 * ds[i]) of exactly cfg->num_samples (> 0) samples, chosen by
 * cai_data_blend_indices; each part gets exactly as many samples as the
 * blend takes from it (part i shuffles with seed + i). Weight 0 parts are
 * allowed and never built. Not collective. */
cai_status cai_gpt_blend_init(cai_gpt_dataset_t **out, int n, const cai_indexed_dataset_t *const *ds,
                              const int64_t *doc_ranges, const double *weights, const cai_gpt_config *cfg);
void cai_gpt_dataset_free(cai_gpt_dataset_t *ds);

int64_t cai_gpt_dataset_size(const cai_gpt_dataset_t *ds);
int64_t cai_gpt_dataset_seq_len(const cai_gpt_dataset_t *ds);
/* Epochs over the documents (single datasets; the largest part for a blend). */
int64_t cai_gpt_dataset_epochs(const cai_gpt_dataset_t *ds);
/* Sample i: seq_len + 1 tokens. Not collective. */
cai_status cai_gpt_dataset_sample(const cai_gpt_dataset_t *ds, int64_t i, int32_t *tokens);
/* n samples as model inputs and targets, both [n, seq_len]: targets are the
 * inputs shifted by one token. */
cai_status cai_gpt_dataset_batch(const cai_gpt_dataset_t *ds, const int64_t *indices, int64_t n, int32_t *inputs,
                                 int32_t *targets);
/* Where sample i of a blend comes from (a single dataset answers 0, i). */
cai_status cai_gpt_dataset_source(const cai_gpt_dataset_t *ds, int64_t i, int *part, int64_t *part_sample);
/* Introspection for tests and tools (NULL for a blend): the document index
 * (sequence ids, epochs * sequences) and the shuffle index. */
const int64_t *cai_gpt_dataset_document_index(const cai_gpt_dataset_t *ds, int64_t *n);
const int64_t *cai_gpt_dataset_shuffle_index(const cai_gpt_dataset_t *ds, int64_t *n);

/* Everything a training app needs from a data path in one call. */
typedef struct {
    /* Megatron's --data-path: "PREFIX" or "W1 PREFIX1 W2 PREFIX2 ..."
     * (whitespace or commas between items). */
    const char *paths;
    const char *split; /* "98,2,0"; applied to each prefix's documents */
    int64_t seq_len;
    uint64_t seed;
    int64_t vocab_size;     /* > 0: every token is checked on open */
    int64_t num_samples[3]; /* per split; 0: one epoch (single prefix only) */
} cai_gpt_data_config;

typedef struct cai_gpt_data cai_gpt_data_t;

/* Opens every prefix and builds train/valid/test samples. A split whose
 * documents are empty everywhere is absent (NULL from cai_gpt_data_get).
 * Not collective (deterministic, so all ranks agree). */
cai_status cai_gpt_data_init(cai_gpt_data_t **out, const cai_gpt_data_config *cfg);
cai_gpt_dataset_t *cai_gpt_data_get(const cai_gpt_data_t *d, cai_split split);
void cai_gpt_data_free(cai_gpt_data_t *d);

/* ---------------------------------------------------------------- distributed sampler
 * An endless stream of dataset indices: position p holds sample
 * perm_e[p mod N] of epoch e = p / N (identity without shuffle, else a
 * Philox permutation per epoch). Global batch k is positions [kG, (k+1)G);
 * data-parallel rank r takes the contiguous slice [kG + rG/dp, kG +
 * (r+1)G/dp). Batches may straddle epochs, so every sample is seen exactly
 * once per epoch and nothing is dropped. State is one number (consumed
 * samples), so resuming is exact. No communication: every dp rank computes
 * its own slice from the same config. */
typedef struct {
    int64_t dataset_size; /* N */
    int64_t global_batch; /* G, divisible by dp_size */
    int dp_size, dp_rank;
    int shuffle;
    uint64_t seed;
} cai_sampler_config;

typedef struct cai_sampler cai_sampler_t;

cai_status cai_sampler_init(cai_sampler_t **out, const cai_sampler_config *cfg, int64_t consumed_samples);
/* This rank's G/dp indices of the next global batch; consumed += G. */
cai_status cai_sampler_next(cai_sampler_t *s, int64_t *indices);
int64_t cai_sampler_consumed(const cai_sampler_t *s);
int64_t cai_sampler_local_batch(const cai_sampler_t *s);
void cai_sampler_free(cai_sampler_t *s);

/* ---------------------------------------------------------------- embedded corpus
 * A generator of short English documents so a model can be trained with no
 * download: templated stories and arithmetic word problems with their
 * answers. Document i depends only on (seed, i). Never contains a blank line
 * or a NUL, so it round-trips through both preprocessing formats. */
#define CAI_CORPUS_MAX_DOC 4096

/* Write document `index` into buf (NUL-terminated, < CAI_CORPUS_MAX_DOC
 * bytes; cap must be at least that). *len excludes the NUL. Not collective. */
cai_status cai_corpus_document(uint64_t seed, int64_t index, char *buf, size_t cap, size_t *len);
/* Documents [0, n_docs) to `path` as JSONL ({"text": ...} per line) or text
 * (documents separated by one blank line). Written under a temporary name
 * and renamed. Not collective. */
cai_status cai_corpus_write(const char *path, int64_t n_docs, uint64_t seed, cai_preprocess_format format);

/* A file written under PATH.tmp and renamed to PATH when complete, so a
 * reader never sees half of it: open (path NULL: a no-op file whose f is
 * NULL), write to f, then close with the status so far (not CAI_OK: the
 * temporary file is removed). Not collective. */
typedef struct {
    const char *path;
    char *tmp;
    FILE *f;
} cai_out_file;
cai_status cai_out_file_open(cai_out_file *o, const char *path);
cai_status cai_out_file_close(cai_out_file *o, cai_status st);

/* ======================================================= end of datasets */

/* ======================================================================
 * Chat data for supervised fine-tuning (src/data/chat.c, sft*.c)
 * docs/sft.md describes the formats. Nothing here is collective except
 * cai_sft_preprocess.
 * ====================================================================== */

/* Shared by the line-oriented JSON readers (chat data here, batch-job lines
 * in colossal-infer). A CAI_ERR_FORMAT error "FILE:LINE: message" recorded
 * at src_file:src_line in func. */
cai_status cai_error_line(const char *file, int64_t line, const char *src_file, int src_line, const char *func,
                          const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* "an object", "a string", "null", ...: a jansson value's kind for messages. */
struct json_t;
const char *cai_json_kind(const struct json_t *v);

/* One turn of a conversation: role and content, NUL-terminated. */
typedef struct {
    char *role, *content;
} cai_chat_message;

/* ---------------------------------------------------------------- templates
 * How messages become text. A message renders as
 *     prefix(role) + content + end(role) + suffix(role)
 * after `bos` at the start of the conversation; "{role}" in a prefix,
 * end or suffix is replaced by the message's role. The generation prompt
 * (what inference appends to ask for the assistant's turn) must be where
 * the assistant's prefix starts: the rest of that prefix, the content and
 * the end are what the model learns to write (loss mask 1); everything
 * else, the suffix included, is context (mask 0). With `trim`, content is
 * stripped of surrounding whitespace first (Meta's Llama 3 template does).
 * Built in:
 *   "chatml"  <|im_start|>{role}\n ... <|im_end|> \n   (generation prompt
 *             "<|im_start|>assistant\n")
 *   "llama3"  <|begin_of_text|>, then <|start_header_id|>{role}<|end_header_id|>\n\n
 *             ... <|eot_id|>, content trimmed
 *   "plain"   "{role}: " ... "\n"; generation prompt "assistant:" (so the
 *             assistant learns " answer\n")
 * A template file is a JSON object with the keys "bos", "prefix", "end",
 * "suffix" (strings, default ""), "generation_prompt" (default: the
 * assistant's prefix), "trim" (boolean), "special_tokens" (the strings, of
 * two bytes or more, the tokenizer must hold as special tokens) and "roles" ({"system"|"user"|
 * "assistant": {"prefix", "end", "suffix"}} overriding the defaults for one
 * role). Unknown keys are refused. */
typedef struct cai_chat_template_s cai_chat_template_t;

/* "chatml", "llama3", "plain", or the path of a template file (a name
 * with '/' or ending in ".json"). A file that does not parse fails with
 * CAI_ERR_FORMAT naming the file and the field. */
cai_status cai_chat_template_open(const char *name_or_path, cai_chat_template_t **out);
void cai_chat_template_free(cai_chat_template_t *t);
/* The builtin's name or the file's path. */
const char *cai_chat_template_name(const cai_chat_template_t *t);
/* Append the messages (and the generation prompt when generation_prompt is
 * set) to out, keeping a NUL after out->len (not counted). */
cai_status cai_chat_template_render(const cai_chat_template_t *t, const cai_chat_message *msgs, int n,
                                    int generation_prompt, cai_byte_buf *out);

/* Special tokens: the template's list; those `tok` lacks as special tokens
 * (missing[] points into the template, cap entries at most; *n_missing is
 * the full count); and registering them all with cai_bpe_add_special. A
 * string the vocabulary already spells keeps its id; the others get new ids
 * at the end, so *n_new > 0 means the embedding must grow to
 * cai_bpe_vocab_size(tok) rows. */
int cai_chat_template_n_special(const cai_chat_template_t *t);
const char *cai_chat_template_special(const cai_chat_template_t *t, int i);
void cai_chat_template_missing_tokens(const cai_chat_template_t *t, const cai_bpe_t *tok, const char **missing, int cap,
                                      int *n_missing);
cai_status cai_chat_template_add_tokens(const cai_chat_template_t *t, cai_bpe_t *tok, int *n_new);

/* The builtins by number, for callers with an enum option (colossal-infer). */
typedef enum { CAI_CHAT_PLAIN = 0, CAI_CHAT_CHATML, CAI_CHAT_LLAMA3, CAI_CHAT_COUNT } cai_chat_template;
extern const char *const cai_chat_template_names[]; /* "plain", "chatml", "llama3" */
/* Builtin `t` with the generation prompt (cai_chat_template_render). */
cai_status cai_chat_render(cai_chat_template t, const cai_chat_message *msgs, int n, cai_byte_buf *out);

/* ---------------------------------------------------------------- conversations
 * One JSONL line is one conversation, in one of these spellings:
 *   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
 *   {"messages": [{"from": "system"|"human"|"assistant", "content": "..."}]}  (ColossalChat)
 *   {"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}]}     (ShareGPT)
 *   {"prompt": "...", "completion": "..."}  (either may also be a messages array)
 * Roles are normalised to system, user and assistant. Rules: an optional
 * system turn first, then user and assistant alternating, starting with the
 * user and ending with the assistant; content a non-empty string. Other
 * top-level keys (ids, sources) and other message keys are ignored unless
 * strict_keys. Failures are CAI_ERR_FORMAT naming file, line and field:
 * "train.jsonl:17: field 'messages[2].role': 'bot' is not one of
 * system|user|assistant". */
typedef struct {
    cai_chat_message *messages;
    int n_messages;
} cai_chat_conversation;

cai_status cai_chat_parse_line(const char *file, int64_t line, const char *text, size_t len, int strict_keys,
                               cai_chat_conversation *out);
/* Frees and zeroes; safe on a zeroed or failed conversation. */
void cai_chat_conversation_free(cai_chat_conversation *c);

/* ---------------------------------------------------------------- tokens and loss masks */

/* Token ids with a loss mask: mask[i] = 1 when token i is one the model is
 * trained to predict (assistant content and end). */
typedef struct {
    int32_t *ids;
    uint8_t *mask;
    size_t len, cap;
} cai_sft_tokens;
void cai_sft_tokens_free(cai_sft_tokens *t);

/* Render and tokenize a conversation into *out (replacing what it held).
 * Context (everything up to and including a generation prompt: system and
 * user turns, template pieces) is encoded as one piece with special tokens
 * recognised, as colossal-infer encodes a prompt, so the tokens before the
 * first assistant turn are exactly those of the prompt inference builds
 * (later turns differ only where a piece boundary changes a merge). The
 * assistant's learned part (its prefix after the generation prompt, and the
 * content) is encoded as ordinary text (a "<|im_end|>" written in it stays
 * text), its end with special tokens. The tokens decode to the rendering
 * byte for byte. tok NULL: bytes (ids 0..255, no special tokens).
 * Not thread-safe on one tok (cai_bpe_encode). */
cai_status cai_sft_encode(const cai_chat_template_t *t, cai_bpe_t *tok, const cai_chat_message *msgs, int n,
                          cai_sft_tokens *out);

/* A conversation of n tokens trains n - 1 positions (inputs 0..n-2,
 * targets 1..n-1), so it fits a sequence of seq_len positions when
 * n <= seq_len + 1. Longer: CAI_SFT_DROP leaves it out; CAI_SFT_TRUNCATE
 * keeps the first seq_len + 1 tokens, unless none of targets 1..seq_len
 * is trained, then it is dropped too. */
typedef enum { CAI_SFT_TRUNCATE = 0, CAI_SFT_DROP = 1, CAI_SFT_OVERFLOW_COUNT } cai_sft_overflow;
extern const char *const cai_sft_overflow_names[]; /* "truncate", "drop" */
typedef enum { CAI_SFT_KEPT = 0, CAI_SFT_TRUNCATED, CAI_SFT_DROPPED } cai_sft_fit_result;
/* Apply the policy to t in place (seq_len <= 0: no limit). A conversation
 * with nothing trained among tokens 1.. is dropped whatever its length. */
cai_sft_fit_result cai_sft_fit(cai_sft_tokens *t, int64_t seq_len, cai_sft_overflow policy);

/* ---------------------------------------------------------------- preprocessing
 * Chat JSONL -> two Megatron indexed datasets with the same document
 * boundaries: PREFIX.{bin,idx} holds the tokens (one sequence per
 * conversation), PREFIX_loss_mask.{bin,idx} the masks (uint8, 0 or 1).
 * Dropped conversations are in neither. */
typedef struct {
    const char *const *inputs;
    int n_inputs;
    const char *output_prefix;
    const cai_chat_template_t *chat_template;
    cai_bpe_t *tokenizer; /* NULL: bytes */
    int64_t seq_len;      /* <= 0: no limit */
    cai_sft_overflow overflow;
    int strict_keys;
    double progress_interval_s;
} cai_sft_preprocess_config;

typedef struct {
    int64_t conversations; /* read */
    int64_t written, truncated, dropped;
    int64_t tokens, trained_tokens; /* written */
    int64_t input_bytes;
    double seconds;
} cai_sft_preprocess_stats;

/* The mask dataset's prefix for a token dataset's prefix (cap bytes). */
cai_status cai_sft_mask_prefix(const char *prefix, char *out, size_t cap);

/* Collective over comm, with cai_preprocess's guarantees: the output does
 * not depend on the number of ranks, every rank returns the first error
 * (a bad line names file, line and field), and a failure leaves no output.
 * stats (may be NULL) holds the global counts on every rank. */
cai_status cai_sft_preprocess(const cai_sft_preprocess_config *cfg, MPI_Comm comm, cai_sft_preprocess_stats *stats);

/* ---------------------------------------------------------------- packed batches
 * Rows of seq_len positions built from a preprocessed dataset. Packed: the
 * conversations, in an order shuffled by `seed`, go first-fit into rows (a
 * conversation goes into the first row with room for it, a new row when
 * none has); unpacked: one conversation per row. Each row holds, per
 * position: the input token, its target (the next token, or
 * CAI_IGNORE_INDEX (-100) where that token is not trained or past the
 * conversation), the position within its conversation (from 0) and the
 * conversation's index within the row (0, 1, ...; -1 on padding, whose
 * input token is pad_id). Conversations longer than seq_len + 1 tokens
 * follow the overflow policy again, so one dataset serves several lengths.
 * The rows are fixed by (dataset, seq_len, packed, seed); epochs shuffle
 * their order (cai_sft_loader). Not collective: ranks agree by
 * construction. */
typedef struct {
    const char *prefix; /* from cai_sft_preprocess */
    int64_t seq_len;
    int packed;
    cai_sft_overflow overflow;
    uint64_t seed;
    int32_t pad_id;
    int64_t vocab_size; /* > 0: every token is checked to be below it */
} cai_sft_data_config;

typedef struct {
    int64_t documents; /* in the dataset */
    int64_t rows, truncated, dropped;
    int64_t tokens, trained_tokens, padding; /* input positions over all rows */
} cai_sft_data_stats;

typedef struct cai_sft_dataset cai_sft_dataset_t;

/* Opens both datasets and checks that they agree (documents, lengths, mask
 * values 0/1); a mismatch names the file and the document. */
cai_status cai_sft_dataset_init(cai_sft_dataset_t **out, const cai_sft_data_config *cfg);
void cai_sft_dataset_free(cai_sft_dataset_t *ds);
int64_t cai_sft_dataset_size(const cai_sft_dataset_t *ds); /* rows */
int64_t cai_sft_dataset_seq_len(const cai_sft_dataset_t *ds);
void cai_sft_dataset_stats(const cai_sft_dataset_t *ds, cai_sft_data_stats *stats);
/* The documents (dataset indices) of row r, in row order. */
const int64_t *cai_sft_dataset_row_documents(const cai_sft_dataset_t *ds, int64_t r, int64_t *n);
/* n rows, each array [n, seq_len] (any of them may be NULL). */
cai_status cai_sft_dataset_batch(const cai_sft_dataset_t *ds, const int64_t *rows, int64_t n, int32_t *tokens,
                                 int32_t *targets, int32_t *positions, int32_t *doc_ids);

/* Batches over epochs: cai_sampler over the rows (shuffled per epoch with
 * `seed`, global batch split over dp ranks), resumable from the count of
 * rows consumed by all ranks together. */
typedef struct cai_sft_loader cai_sft_loader_t;
cai_status cai_sft_loader_init(cai_sft_loader_t **out, const cai_sft_dataset_t *ds, int64_t global_batch, int dp_size,
                               int dp_rank, uint64_t seed, int64_t consumed);
/* This rank's global_batch / dp_size rows, arrays [that, seq_len]. */
cai_status cai_sft_loader_next(cai_sft_loader_t *l, int32_t *tokens, int32_t *targets, int32_t *positions,
                               int32_t *doc_ids);
int64_t cai_sft_loader_consumed(const cai_sft_loader_t *l);
int64_t cai_sft_loader_local_batch(const cai_sft_loader_t *l);
void cai_sft_loader_free(cai_sft_loader_t *l);

/* ---------------------------------------------------------------- embedded instruction set
 * Conversations generated from the embedded corpus's vocabulary: arithmetic
 * questions answered in a fixed format ("The answer is N.") and requests to
 * continue a story. Conversation i depends only on (seed, i); whether it is
 * held out is a function of (seed, i) too (about held_out_percent of them),
 * so a train file and a held-out file never share a conversation. */
typedef struct {
    int64_t n;
    uint64_t seed;
    int held_out_percent; /* 0..100 */
} cai_sft_example_config;

/* Conversation i (user and assistant turns; *held_out says which split). */
cai_status cai_sft_example_conversation(const cai_sft_example_config *cfg, int64_t i, cai_chat_conversation *out,
                                        int *held_out);
/* The question and answer of an arithmetic conversation: its last user
 * turn, when the assistant's reply to it is exactly "The answer is N.".
 * Returns 0 (outputs untouched) for any other conversation; *question
 * points into c. */
int cai_sft_example_arithmetic(const cai_chat_conversation *c, const char **question, long long *answer);

/* A sorted set of distinct questions. */
typedef struct {
    char **q;
    int64_t n;
} cai_sft_question_set;

/* The questions (cai_sft_example_arithmetic) of the held-out arithmetic
 * conversations among 0..cfg->n-1. The question space is small, so the
 * same question recurs under another conversation: a split by
 * conversation alone would train on questions it holds out, and the
 * writers of training files leave out what asks one of these. Free with
 * cai_sft_question_set_free (a zeroed set is fine). */
cai_status cai_sft_example_held_questions(const cai_sft_example_config *cfg, cai_sft_question_set *out);
int cai_sft_question_set_has(const cai_sft_question_set *s, const char *question);
/* Whether any user turn of c is in s. */
int cai_sft_question_set_asked(const cai_sft_question_set *s, const cai_chat_conversation *c);
void cai_sft_question_set_free(cai_sft_question_set *s);

/* Conversations 0..n-1 as {"messages": [...]} lines: the held-out ones to
 * held_out_path, the training ones to train_path less every one that asks
 * a held-out question in any user turn (cai_sft_example_held_questions),
 * so a held-out score is on questions no training line asks. Either path
 * may be NULL to skip it. *n_train / *n_held count the lines, *n_left_out
 * the training conversations left out (each may be NULL). Written under
 * temporary names and renamed. */
cai_status cai_sft_example_write(const cai_sft_example_config *cfg, const char *train_path, const char *held_out_path,
                                 int64_t *n_train, int64_t *n_held, int64_t *n_left_out);

#ifdef __cplusplus
}
#endif
#endif
