/* colossal-data: the data tool. The subcommand is argv[1]:
 *   preprocess       text/JSONL -> Megatron .bin/.idx, in parallel over ranks
 *   train-tokenizer  learn a byte-level BPE vocabulary from text/JSONL
 *   corpus           write the embedded corpus as JSONL or text
 *   info             validate an indexed dataset and print what it holds
 *   sft-preprocess   chat JSONL -> token and loss-mask datasets, in parallel
 *   sft-example      write the embedded instruction set (train and held out)
 *   rl-example       its arithmetic as prompts and preference pairs (colossal-rlhf)
 *   encode           a tokenizer's ids for each string of a JSONL file (for
 *                    comparing against other implementations)
 * Options after the subcommand go through the config module, so each
 * subcommand has --help and YAML files like every other app. */
#include "cai_config.h"

#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app_common.h"
#include "colossal/base.h"
#include "colossal/config.h"
#include "colossal/data.h"
#include "colossal/rl.h"

#include <jansson.h>

/* ------------------------------------------------------------------ config
 * One struct for every subcommand; each schema lists only its own keys. */

enum { FMT_AUTO = 0, FMT_TEXT = 1, FMT_JSONL = 2 };
static const char *const k_formats[] = {"auto", "text", "jsonl", NULL};

typedef struct {
    char *input, *output, *json_key, *tokenizer, *eod, *data, *chat_template;
    int format, overflow, strict_keys, add_special_tokens, split_digits;
    double progress;
    int64_t vocab_size, min_frequency, docs, seed, seq_len, held_out;
    cai_app_common common;
} data_config;

#define F(key, type, field, def, doc, ...) \
    { key, type, offsetof(data_config, field), def, doc, __VA_ARGS__ }
#define FORMAT_FIELD(doc) \
    { "format", CAI_CFG_ENUM, offsetof(data_config, format), "auto", doc, CAI_CFG_NO_RANGE, k_formats, NULL }
#define BIG 1e15

static const cai_config_field k_preprocess[] = {
    F("input", CAI_CFG_STRING, input, NULL, "input files, comma-separated, read as one stream in order",
      CAI_CFG_NO_RANGE, NULL, NULL),
    F("output_prefix", CAI_CFG_STRING, output, NULL, "writes OUTPUT_PREFIX.bin and OUTPUT_PREFIX.idx", CAI_CFG_NO_RANGE,
      NULL, "output"),
    FORMAT_FIELD("text (documents separated by blank lines), jsonl, or auto (jsonl for .jsonl/.json files)"),
    F("json_key", CAI_CFG_STRING, json_key, "text", "JSONL: the key holding each document's text", CAI_CFG_NO_RANGE,
      NULL, NULL),
    F("tokenizer", CAI_CFG_STRING, tokenizer, "",
      "directory with vocab.json and merges.txt (BPE); empty: byte-level (256 bytes + end-of-document = 257)",
      CAI_CFG_NO_RANGE, NULL, NULL),
    F("eod", CAI_CFG_STRING, eod, "<|endoftext|>", "BPE: the special token appended to every document",
      CAI_CFG_NO_RANGE, NULL, NULL),
    F("progress", CAI_CFG_DOUBLE, progress, "10", "seconds between progress lines (0: none)", 0, 1e9, NULL, NULL),
    CAI_APP_COMMON_FIELDS(data_config, common),
};

static const cai_config_field k_train[] = {
    F("input", CAI_CFG_STRING, input, NULL, "input files, comma-separated", CAI_CFG_NO_RANGE, NULL, NULL),
    F("output", CAI_CFG_STRING, output, NULL, "directory for vocab.json, merges.txt and tokenizer.json",
      CAI_CFG_NO_RANGE, NULL, NULL),
    FORMAT_FIELD("text (documents separated by blank lines), jsonl, or auto (jsonl for .jsonl/.json files)"),
    F("json_key", CAI_CFG_STRING, json_key, "text", "JSONL: the key holding each document's text", CAI_CFG_NO_RANGE,
      NULL, NULL),
    F("vocab_size", CAI_CFG_INT64, vocab_size, "4096", "tokens in total: the special token, 256 bytes, then merges",
      257, 1 << 24, NULL, NULL),
    F("min_frequency", CAI_CFG_INT64, min_frequency, "2", "stop merging when no pair occurs this often", 0, BIG, NULL,
      NULL),
    F("eod", CAI_CFG_STRING, eod, "<|endoftext|>", "the special end-of-document token (id 0)", CAI_CFG_NO_RANGE, NULL,
      NULL),
    F("split_digits", CAI_CFG_BOOL, split_digits, "false",
      "every digit its own pre-token, never merged (Hugging Face Digits(individual_digits) before ByteLevel)",
      CAI_CFG_NO_RANGE, NULL, NULL),
    CAI_APP_COMMON_FIELDS(data_config, common),
};

static const cai_config_field k_encode[] = {
    F("tokenizer", CAI_CFG_STRING, tokenizer, NULL, "tokenizer directory (vocab.json + merges.txt, or tokenizer.json)",
      CAI_CFG_NO_RANGE, NULL, NULL),
    F("input", CAI_CFG_STRING, input, NULL, "JSONL: one JSON string, or an object with json_key, per line",
      CAI_CFG_NO_RANGE, NULL, NULL),
    F("output", CAI_CFG_STRING, output, NULL, "JSONL: {\"text\": ..., \"ids\": [...]} per input line", CAI_CFG_NO_RANGE,
      NULL, NULL),
    F("json_key", CAI_CFG_STRING, json_key, "text", "the key holding the text when a line is an object",
      CAI_CFG_NO_RANGE, NULL, NULL),
    CAI_APP_COMMON_FIELDS(data_config, common),
};

static const cai_config_field k_corpus[] = {
    F("out", CAI_CFG_STRING, output, NULL, "file to write", CAI_CFG_NO_RANGE, NULL, NULL),
    F("docs", CAI_CFG_INT64, docs, "10000", "number of documents", 0, BIG, NULL, NULL),
    F("seed", CAI_CFG_INT64, seed, "1234", "generator seed: the same seed gives the same corpus", 0, BIG, NULL, NULL),
    FORMAT_FIELD("jsonl ({\"text\": ...} per line), text (blank line between documents), or auto (by extension)"),
    CAI_APP_COMMON_FIELDS(data_config, common),
};

static const cai_config_field k_info[] = {
    F("data", CAI_CFG_STRING, data, NULL, "dataset prefix (PREFIX.bin, PREFIX.idx)", CAI_CFG_NO_RANGE, NULL, NULL),
    F("vocab_size", CAI_CFG_INT64, vocab_size, "0", "also check every token is below this (0: skip)", 0, BIG, NULL,
      NULL),
    F("seq_len", CAI_CFG_INT64, seq_len, "0", "also count GPT samples of this length, one epoch (0: skip)", 0, BIG,
      NULL, NULL),
    CAI_APP_COMMON_FIELDS(data_config, common),
};
static const cai_config_field k_sft_preprocess[] = {
    F("input", CAI_CFG_STRING, input, NULL, "chat JSONL files, comma-separated, read as one stream in order",
      CAI_CFG_NO_RANGE, NULL, NULL),
    F("output_prefix", CAI_CFG_STRING, output, NULL,
      "writes OUTPUT_PREFIX.{bin,idx} (tokens) and OUTPUT_PREFIX_loss_mask.{bin,idx} (uint8 masks)", CAI_CFG_NO_RANGE,
      NULL, "output"),
    F("tokenizer", CAI_CFG_STRING, tokenizer, "",
      "tokenizer directory (vocab.json + merges.txt, or tokenizer.json); empty: bytes (256 ids)", CAI_CFG_NO_RANGE,
      NULL, NULL),
    F("chat_template", CAI_CFG_STRING, chat_template, "chatml",
      "chatml, llama3, plain, or a template file (.json; docs/sft.md)", CAI_CFG_NO_RANGE, NULL, NULL),
    F("seq_len", CAI_CFG_INT64, seq_len, "0",
      "positions per training sequence: longer conversations (over seq_len + 1 tokens) follow --overflow; 0: no "
      "limit",
      0, BIG, NULL, NULL),
    {"overflow", CAI_CFG_ENUM, offsetof(data_config, overflow), "truncate",
     "a conversation longer than seq_len: truncate (keep its head, if an assistant token is left) or drop",
     CAI_CFG_NO_RANGE, cai_sft_overflow_names, NULL},
    F("strict_keys", CAI_CFG_BOOL, strict_keys, "false", "refuse keys other than the chat format's", CAI_CFG_NO_RANGE,
      NULL, NULL),
    F("add_special_tokens", CAI_CFG_BOOL, add_special_tokens, "false",
      "add the template's special tokens the tokenizer lacks and write the grown tokenizer to "
      "OUTPUT_PREFIX_tokenizer/ (the model's embedding must grow to its size)",
      CAI_CFG_NO_RANGE, NULL, NULL),
    F("progress", CAI_CFG_DOUBLE, progress, "10", "seconds between progress lines (0: none)", 0, 1e9, NULL, NULL),
    CAI_APP_COMMON_FIELDS(data_config, common),
};

static const cai_config_field k_sft_example[] = {
    F("out", CAI_CFG_STRING, output, NULL, "directory for train.jsonl and held_out.jsonl", CAI_CFG_NO_RANGE, NULL,
      NULL),
    F("docs", CAI_CFG_INT64, docs, "5000", "conversations in both files together", 0, BIG, NULL, NULL),
    F("seed", CAI_CFG_INT64, seed, "1234", "generator seed: the same seed gives the same files", 0, BIG, NULL, NULL),
    F("held_out", CAI_CFG_INT64, held_out, "10", "percent of the conversations held out", 0, 100, NULL, NULL),
    CAI_APP_COMMON_FIELDS(data_config, common),
};
static const cai_config_field k_rl_example[] = {
    F("out", CAI_CFG_STRING, output, NULL,
      "directory for prompts_{train,held_out}.jsonl and prefs_{train,held_out}.jsonl", CAI_CFG_NO_RANGE, NULL, NULL),
    F("docs", CAI_CFG_INT64, docs, "5000",
      "conversations of the instruction set to draw from (its arithmetic ones are written)", 0, BIG, NULL, NULL),
    F("seed", CAI_CFG_INT64, seed, "1234", "generator seed: the same seed gives the same files", 0, BIG, NULL, NULL),
    F("held_out", CAI_CFG_INT64, held_out, "10", "percent of the conversations held out", 0, 100, NULL, NULL),
    CAI_APP_COMMON_FIELDS(data_config, common),
};
#undef BIG
#undef F

typedef struct {
    const char *name;
    cai_config_schema schema;
    cai_status (*run)(const cai_app *app, const data_config *cfg);
} subcommand;

/* ------------------------------------------------------------------ helpers */

/* Split "a,b,c" in place; returns the count. */
static int split_list(char *s, const char **out, int max) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ",")) {
        while (*tok == ' ') tok++;
        if (*tok) out[n++] = tok;
    }
    return n;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcasecmp(s + a - b, suffix) == 0;
}

static cai_preprocess_format pick_format(int fmt, const char *first_path) {
    if (fmt == FMT_TEXT) return CAI_PREPROCESS_TEXT;
    if (fmt == FMT_JSONL) return CAI_PREPROCESS_JSONL;
    return ends_with(first_path, ".jsonl") || ends_with(first_path, ".json") || ends_with(first_path, ".ndjson")
               ? CAI_PREPROCESS_JSONL
               : CAI_PREPROCESS_TEXT;
}

enum { MAX_INPUTS = 4096 };

static cai_status parse_inputs(const data_config *cfg, char **copy, const char **inputs, int *n) {
    if (!cfg->input || !*cfg->input)
        return CAI_ERROR(CAI_ERR_CONFIG, "input: no input files given (--input a.jsonl,b.jsonl)");
    *copy = strdup(cfg->input);
    if (!*copy) return CAI_ERROR(CAI_ERR_NOMEM, "input list");
    *n = split_list(*copy, inputs, MAX_INPUTS);
    if (*n == 0) return CAI_ERROR(CAI_ERR_CONFIG, "input: \"%s\" names no file", cfg->input);
    return CAI_OK;
}

/* The one place tokenization is chosen: BPE from a directory, else bytes. */
typedef struct {
    cai_bpe_t *bpe;
    cai_tokenize_fn fn;
    void *ctx;
    int64_t vocab_size;
    int32_t eod;
} tokenizer;

static cai_status bpe_tokenize(void *ctx, const char *text, size_t len, cai_token_buf *out) {
    /* Document text is data: "<|endoftext|>" inside it stays ordinary text. */
    return cai_bpe_encode_ordinary((cai_bpe_t *)ctx, text, len, out);
}

static cai_status tokenizer_open(tokenizer *t, const data_config *cfg) {
    memset(t, 0, sizeof *t);
    if (!cfg->tokenizer || !*cfg->tokenizer) {
        t->fn = cai_byte_tokenize;
        t->vocab_size = CAI_BYTE_VOCAB;
        t->eod = CAI_BYTE_EOD;
        return CAI_OK;
    }
    /* The directory's tokenizer.json says whether digits are split. */
    CAI_CALL(cai_bpe_load_dir(cfg->tokenizer, &t->bpe));
    cai_status st = cai_bpe_add_special(t->bpe, cfg->eod, &t->eod);
    if (st != CAI_OK) {
        cai_bpe_free(t->bpe);
        t->bpe = NULL;
        CAI_CALL(st);
    }
    t->fn = bpe_tokenize;
    t->ctx = t->bpe;
    t->vocab_size = cai_bpe_vocab_size(t->bpe);
    return CAI_OK;
}

/* ------------------------------------------------------------------ subcommands */

/* The output prefix and the input list of a preprocessing subcommand;
 * *copy and *inputs are the caller's to free, failure or not. */
static cai_status preprocess_args(const data_config *cfg, char **copy, const char ***inputs, int *n) {
    *copy = NULL;
    *inputs = NULL;
    *n = 0;
    if (!cfg->output || !*cfg->output)
        return CAI_ERROR(CAI_ERR_CONFIG, "output_prefix: not given (--output-prefix DIR/NAME)");
    *inputs = malloc(MAX_INPUTS * sizeof **inputs);
    if (!*inputs) return CAI_ERROR(CAI_ERR_NOMEM, "input list");
    return parse_inputs(cfg, copy, *inputs, n);
}

static cai_status run_preprocess(const cai_app *app, const data_config *cfg) {
    char *copy;
    const char **inputs;
    int n;
    tokenizer tok = {0};
    cai_status st = preprocess_args(cfg, &copy, &inputs, &n);
    if (st == CAI_OK) st = tokenizer_open(&tok, cfg);
    /* Every rank parsed the same arguments and read the same vocabulary, so
     * a failure so far is the same everywhere. */
    if (st == CAI_OK) {
        cai_preprocess_config pc = {inputs,
                                    n,
                                    pick_format(cfg->format, inputs[0]),
                                    cfg->json_key,
                                    cfg->output,
                                    tok.fn,
                                    tok.ctx,
                                    tok.vocab_size,
                                    tok.eod,
                                    cfg->progress};
        cai_preprocess_stats stats;
        st = cai_preprocess(&pc, MPI_COMM_WORLD, &stats);
        if (st == CAI_OK && app->rank == 0)
            printf(
                "preprocess: %lld documents, %lld tokens (%s, vocabulary %lld) from %.2f MB in %.2f s: %.2f MB/s "
                "on %d rank%s -> %s.bin, %s.idx\n",
                (long long)stats.documents, (long long)stats.tokens,
                cai_indexed_dtype_name(cai_indexed_dtype_for_vocab(tok.vocab_size)), (long long)tok.vocab_size,
                (double)stats.input_bytes / 1e6, stats.seconds,
                stats.seconds > 0 ? (double)stats.input_bytes / 1e6 / stats.seconds : 0.0, app->size,
                app->size == 1 ? "" : "s", cfg->output, cfg->output);
    }
    cai_bpe_free(tok.bpe);
    free(copy);
    free(inputs);
    return st;
}

typedef struct {
    cai_bpe_trainer_t *tr;
    int64_t docs, bytes;
} train_state;

static cai_status feed_trainer(void *ctx, const char *text, size_t len) {
    train_state *t = ctx;
    t->docs++;
    t->bytes += (int64_t)len;
    return cai_bpe_trainer_feed(t->tr, text, len);
}

/* Rank 0 trains (the trainer is serial); the others wait for its result. */
static cai_status run_train(const cai_app *app, const data_config *cfg) {
    if (app->rank != 0) return CAI_OK;
    if (!cfg->output || !*cfg->output) return CAI_ERROR(CAI_ERR_CONFIG, "output: not given (--output DIR)");
    char *copy = NULL;
    const char **inputs = malloc(MAX_INPUTS * sizeof *inputs);
    if (!inputs) return CAI_ERROR(CAI_ERR_NOMEM, "input list");
    int n = 0;
    train_state ts = {0};
    cai_bpe_t *tok = NULL;
    const char *specials[1] = {cfg->eod};
    cai_bpe_train_opts opts = {(size_t)cfg->vocab_size, specials, 1, (uint64_t)cfg->min_frequency};
    const double t0 = cai_time_now();
    cai_status st = parse_inputs(cfg, &copy, inputs, &n);
    if (st == CAI_OK) st = cai_bpe_trainer_init(&opts, &ts.tr);
    if (st == CAI_OK) st = cai_bpe_trainer_set_split_digits(ts.tr, cfg->split_digits);
    if (st == CAI_OK)
        st = cai_preprocess_documents(inputs, n, pick_format(cfg->format, inputs[0]), cfg->json_key, feed_trainer, &ts);
    if (st == CAI_OK) st = cai_bpe_trainer_finish(ts.tr, &tok);
    if (st == CAI_OK) st = cai_bpe_save(tok, cfg->output);
    if (st == CAI_OK)
        printf(
            "train-tokenizer: %lld documents, %.2f MB -> %d tokens (%zu merges) in %.2f s -> %s/vocab.json, "
            "%s/merges.txt, %s/tokenizer.json\n",
            (long long)ts.docs, (double)ts.bytes / 1e6, cai_bpe_vocab_size(tok), cai_bpe_merge_count(tok),
            cai_time_now() - t0, cfg->output, cfg->output, cfg->output);
    cai_bpe_free(tok);
    cai_bpe_trainer_free(ts.tr);
    free(copy);
    free(inputs);
    return st;
}

static cai_status run_corpus(const cai_app *app, const data_config *cfg) {
    if (app->rank != 0) return CAI_OK;
    if (!cfg->output || !*cfg->output) return CAI_ERROR(CAI_ERR_CONFIG, "out: not given (--out FILE)");
    const cai_preprocess_format fmt = pick_format(cfg->format, cfg->output);
    CAI_CALL(cai_corpus_write(cfg->output, cfg->docs, (uint64_t)cfg->seed, fmt));
    struct stat st;
    const long long bytes = stat(cfg->output, &st) == 0 ? (long long)st.st_size : -1;
    printf("corpus: %lld documents (seed %lld, %s) -> %s (%lld bytes)\n", (long long)cfg->docs, (long long)cfg->seed,
           fmt == CAI_PREPROCESS_JSONL ? "jsonl" : "text", cfg->output, bytes);
    return CAI_OK;
}

static cai_status run_info(const cai_app *app, const data_config *cfg) {
    if (app->rank != 0) return CAI_OK;
    if (!cfg->data || !*cfg->data) return CAI_ERROR(CAI_ERR_CONFIG, "data: not given (--data PREFIX)");
    cai_indexed_dataset_t *ds;
    CAI_CALL(cai_indexed_open(&ds, cfg->data, cfg->vocab_size));
    const int64_t docs = cai_indexed_num_documents(ds), seqs = cai_indexed_num_sequences(ds);
    const int64_t tokens = cai_indexed_num_tokens(ds);
    int32_t longest = 0;
    for (int64_t i = 0; i < seqs; i++)
        if (cai_indexed_sequence_length(ds, i) > longest) longest = cai_indexed_sequence_length(ds, i);
    printf("%s: valid Megatron indexed dataset\n", cfg->data);
    printf("  dtype       %s (code %d)\n", cai_indexed_dtype_name(cai_indexed_get_dtype(ds)),
           (int)cai_indexed_get_dtype(ds));
    printf("  documents   %lld\n", (long long)docs);
    printf("  sequences   %lld\n", (long long)seqs);
    printf("  tokens      %lld (mean %.1f per document, longest sequence %d)\n", (long long)tokens,
           docs ? (double)tokens / (double)docs : 0.0, longest);
    if (cfg->vocab_size > 0) printf("  vocabulary  every token below %lld\n", (long long)cfg->vocab_size);
    cai_status st = CAI_OK;
    if (cfg->seq_len > 0) {
        cai_gpt_config gc = {cfg->seq_len, 0, 1};
        cai_gpt_dataset_t *g = NULL;
        st = cai_gpt_dataset_init(&g, ds, 0, docs, &gc);
        if (st == CAI_OK)
            printf("  samples     %lld of %lld + 1 tokens per epoch\n", (long long)cai_gpt_dataset_size(g),
                   (long long)cfg->seq_len);
        cai_gpt_dataset_free(g);
    }
    cai_indexed_free(ds);
    return st;
}

/* The template's special tokens the tokenizer lacks: an error naming
 * them, or (add_special_tokens) added and the tokenizer saved beside the
 * output so that training uses the same ids. */
static cai_status sft_tokens(const cai_app *app, const data_config *cfg, const cai_chat_template_t *t, cai_bpe_t *bpe) {
    const char *missing[32];
    int n = 0;
    cai_chat_template_missing_tokens(t, bpe, missing, 32, &n);
    /* a token the vocabulary spells (vocab.json lists added tokens without
     * marking them special) keeps its id: registering it grows nothing */
    for (int i = 0; i < n && i < 32; i++) {
        int32_t id;
        if (cai_bpe_token_id(bpe, missing[i], &id) == CAI_OK) CAI_CALL(cai_bpe_add_special(bpe, missing[i], NULL));
        else cai_error_clear();
    }
    cai_chat_template_missing_tokens(t, bpe, missing, 32, &n);
    if (n == 0) return CAI_OK;
    char list[1024] = "";
    for (int i = 0, used = 0; i < n && i < 32 && used < (int)sizeof list - 80; i++)
        used += snprintf(list + used, sizeof list - (size_t)used, "%s%s", i ? ", " : "", missing[i]);
    if (!cfg->add_special_tokens)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "chat template %s needs special tokens the tokenizer %s lacks: %s (--add-special-tokens "
                         "adds them and writes the grown tokenizer; the model's embedding must grow with it)",
                         cai_chat_template_name(t), cfg->tokenizer, list);
    const int32_t before = cai_bpe_vocab_size(bpe);
    int added = 0;
    CAI_CALL(cai_chat_template_add_tokens(t, bpe, &added));
    char dir[4200];
    snprintf(dir, sizeof dir, "%s_tokenizer", cfg->output);
    cai_status st = app->rank == 0 ? cai_bpe_save(bpe, dir) : CAI_OK;
    if (st == CAI_OK && app->rank == 0)
        printf("sft-preprocess: added %s (%d new ids: vocabulary %d -> %d) -> %s/\n", list, added, (int)before,
               (int)cai_bpe_vocab_size(bpe), dir);
    return st;
}

static cai_status run_sft_preprocess(const cai_app *app, const data_config *cfg) {
    char *copy;
    const char **inputs;
    int n;
    cai_bpe_t *bpe = NULL;
    cai_chat_template_t *t = NULL;
    cai_status st = preprocess_args(cfg, &copy, &inputs, &n);
    if (st == CAI_OK) st = cai_chat_template_open(cfg->chat_template, &t);
    if (st == CAI_OK && cfg->tokenizer && *cfg->tokenizer) st = cai_bpe_load_dir(cfg->tokenizer, &bpe);
    if (st == CAI_OK && bpe) st = sft_tokens(app, cfg, t, bpe);
    /* the same arguments and files on every rank: a failure so far is everywhere */
    if (st == CAI_OK) {
        const cai_sft_preprocess_config pc = {
            inputs,       n, cfg->output, t, bpe, cfg->seq_len, (cai_sft_overflow)cfg->overflow, cfg->strict_keys,
            cfg->progress};
        cai_sft_preprocess_stats s;
        st = cai_sft_preprocess(&pc, MPI_COMM_WORLD, &s);
        if (st == CAI_OK && app->rank == 0) {
            char limit[96] = "no length limit";
            if (cfg->seq_len > 0)
                snprintf(limit, sizeof limit, "seq_len %lld: %lld truncated, %lld dropped (--overflow %s)",
                         (long long)cfg->seq_len, (long long)s.truncated, (long long)s.dropped,
                         cai_sft_overflow_names[cfg->overflow]);
            else if (s.dropped)
                snprintf(limit, sizeof limit, "no length limit, %lld dropped with nothing to learn",
                         (long long)s.dropped);
            printf(
                "sft-preprocess: %lld conversations -> %lld written (%s); %lld tokens, %lld trained (%.1f%%), "
                "template %s, %.2f s on %d rank%s -> %s.{bin,idx}, %s_loss_mask.{bin,idx}\n",
                (long long)s.conversations, (long long)s.written, limit, (long long)s.tokens,
                (long long)s.trained_tokens, s.tokens ? 100.0 * (double)s.trained_tokens / (double)s.tokens : 0.0,
                cai_chat_template_name(t), s.seconds, app->size, app->size == 1 ? "" : "s", cfg->output, cfg->output);
        }
    }
    cai_chat_template_free(t);
    cai_bpe_free(bpe);
    free(copy);
    free(inputs);
    return st;
}

static cai_status run_sft_example(const cai_app *app, const data_config *cfg) {
    if (app->rank != 0) return CAI_OK;
    if (!cfg->output || !*cfg->output) return CAI_ERROR(CAI_ERR_CONFIG, "out: not given (--out DIR)");
    if (mkdir(cfg->output, 0777) != 0 && errno != EEXIST)
        return CAI_ERROR(CAI_ERR_IO, "%s: cannot create the directory: %s", cfg->output, strerror(errno));
    char train[4200], held[4200];
    snprintf(train, sizeof train, "%s/train.jsonl", cfg->output);
    snprintf(held, sizeof held, "%s/held_out.jsonl", cfg->output);
    const cai_sft_example_config ec = {cfg->docs, (uint64_t)cfg->seed, (int)cfg->held_out};
    int64_t nt = 0, nh = 0, left = 0;
    CAI_CALL(cai_sft_example_write(&ec, train, held, &nt, &nh, &left));
    printf(
        "sft-example: %lld conversations (seed %lld) -> %s (%lld), %s (%lld); %lld training conversation%s left "
        "out for asking held-out questions\n",
        (long long)cfg->docs, (long long)cfg->seed, train, (long long)nt, held, (long long)nh, (long long)left,
        left == 1 ? "" : "s");
    return CAI_OK;
}

static cai_status run_rl_example(const cai_app *app, const data_config *cfg) {
    if (app->rank != 0) return CAI_OK;
    if (!cfg->output || !*cfg->output) return CAI_ERROR(CAI_ERR_CONFIG, "out: not given (--out DIR)");
    if (mkdir(cfg->output, 0777) != 0 && errno != EEXIST)
        return CAI_ERROR(CAI_ERR_IO, "%s: cannot create the directory: %s", cfg->output, strerror(errno));
    char pt[4200], ph[4200], qt[4200], qh[4200];
    snprintf(pt, sizeof pt, "%s/prompts_train.jsonl", cfg->output);
    snprintf(ph, sizeof ph, "%s/prompts_held_out.jsonl", cfg->output);
    snprintf(qt, sizeof qt, "%s/prefs_train.jsonl", cfg->output);
    snprintf(qh, sizeof qh, "%s/prefs_held_out.jsonl", cfg->output);
    const cai_sft_example_config ec = {cfg->docs, (uint64_t)cfg->seed, (int)cfg->held_out};
    int64_t nt = 0, nh = 0, mt = 0, mh = 0;
    CAI_CALL(cai_rl_example_prompts_write(&ec, pt, ph, &nt, &nh));
    CAI_CALL(cai_rl_example_prefs_write(&ec, qt, qh, &mt, &mh));
    printf(
        "rl-example: %lld conversations (seed %lld), %lld arithmetic -> prompts %s (%lld), %s (%lld); pairs %s "
        "(%lld), %s (%lld)\n",
        (long long)cfg->docs, (long long)cfg->seed, (long long)(nt + nh), pt, (long long)nt, ph, (long long)nh, qt,
        (long long)mt, qh, (long long)mh);
    return CAI_OK;
}

/* Rank 0 encodes each line's text with cai_bpe_encode (special tokens
 * recognised, as Hugging Face's encode does with added tokens). */
static cai_status encode_line(const data_config *cfg, cai_bpe_t *bpe, const char *line, long lineno, FILE *out,
                              cai_token_buf *ids) {
    json_error_t err;
    json_t *v = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!v) return CAI_ERROR(CAI_ERR_FORMAT, "%s:%ld: %s", cfg->input, lineno, err.text);
    json_t *text = json_is_object(v) ? json_object_get(v, cfg->json_key) : v;
    cai_status st = CAI_OK;
    if (!json_is_string(text))
        st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%ld: expected a JSON string or an object with a string \"%s\"", cfg->input,
                       lineno, cfg->json_key);
    ids->len = 0;
    if (st == CAI_OK) st = cai_bpe_encode(bpe, json_string_value(text), json_string_length(text), ids);
    json_t *row = st == CAI_OK ? json_pack("{s:O, s:[]}", "text", text, "ids") : NULL;
    json_t *list = row ? json_object_get(row, "ids") : NULL;
    for (size_t i = 0; list && i < ids->len; i++)
        if (json_array_append_new(list, json_integer(ids->ids[i])) != 0) list = NULL;
    char *s = list ? json_dumps(row, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    if (st == CAI_OK && !s) st = CAI_ERROR(CAI_ERR_NOMEM, "%s:%ld: cannot render the ids", cfg->input, lineno);
    if (st == CAI_OK && fprintf(out, "%s\n", s) < 0)
        st = CAI_ERROR(CAI_ERR_IO, "%s: write failed: %s", cfg->output, strerror(errno));
    free(s);
    json_decref(row);
    json_decref(v);
    return st;
}

static cai_status run_encode(const cai_app *app, const data_config *cfg) {
    if (app->rank != 0) return CAI_OK;
    if (!cfg->tokenizer || !*cfg->tokenizer) return CAI_ERROR(CAI_ERR_CONFIG, "tokenizer: not given (--tokenizer DIR)");
    if (!cfg->input || !*cfg->input) return CAI_ERROR(CAI_ERR_CONFIG, "input: not given (--input FILE)");
    if (!cfg->output || !*cfg->output) return CAI_ERROR(CAI_ERR_CONFIG, "output: not given (--output FILE)");
    /* tokenizer.json when there is one: what Hugging Face loads, added tokens included. */
    char hf[4200];
    snprintf(hf, sizeof hf, "%s/tokenizer.json", cfg->tokenizer);
    cai_bpe_t *bpe = NULL;
    if (access(hf, R_OK) == 0) CAI_CALL(cai_bpe_load_hf(hf, &bpe));
    else CAI_CALL(cai_bpe_load_dir(cfg->tokenizer, &bpe));
    FILE *in = fopen(cfg->input, "rb"), *out = in ? fopen(cfg->output, "wb") : NULL;
    cai_status st = CAI_OK;
    if (!in) st = CAI_ERROR(CAI_ERR_IO, "cannot open %s: %s", cfg->input, strerror(errno));
    else if (!out) st = CAI_ERROR(CAI_ERR_IO, "cannot create %s: %s", cfg->output, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0, rows = 0;
    cai_token_buf ids = {0};
    while (st == CAI_OK) {
        ssize_t n = getline(&line, &cap, in);
        if (n < 0) break;
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n) continue;
        st = encode_line(cfg, bpe, line, lineno, out, &ids);
        rows++;
    }
    if (out && fclose(out) != 0 && st == CAI_OK)
        st = CAI_ERROR(CAI_ERR_IO, "%s: close failed: %s", cfg->output, strerror(errno));
    if (in) fclose(in);
    if (st == CAI_OK)
        printf("encode: %ld strings with %s (digits split: %s) -> %s\n", rows, cfg->tokenizer,
               cai_bpe_split_digits(bpe) ? "yes" : "no", cfg->output);
    free(line);
    cai_token_buf_free(&ids);
    cai_bpe_free(bpe);
    return st;
}

#define SUB(name, summary, fields, run) \
    { name, {"colossal-data " name, summary, fields, CAI_CFG_NFIELDS(fields)}, run }
static const subcommand k_subcommands[] = {
    SUB("preprocess", "tokenize text or JSONL into a Megatron indexed dataset (.bin/.idx), in parallel over MPI ranks",
        k_preprocess, run_preprocess),
    SUB("train-tokenizer", "learn a byte-level BPE vocabulary from text or JSONL (rank 0)", k_train, run_train),
    SUB("corpus", "write the embedded training corpus (stories and arithmetic) as JSONL or text", k_corpus, run_corpus),
    SUB("info", "validate an indexed dataset and print its size", k_info, run_info),
    SUB("sft-preprocess",
        "tokenize chat JSONL with a chat template into token and loss-mask datasets (.bin/.idx), in parallel over "
        "MPI ranks",
        k_sft_preprocess, run_sft_preprocess),
    SUB("sft-example", "write the embedded chat instruction set (arithmetic and stories) as train and held-out JSONL",
        k_sft_example, run_sft_example),
    SUB("rl-example",
        "write the embedded instruction set's arithmetic as prompts (answers) and preference pairs, train and held out",
        k_rl_example, run_rl_example),
    SUB("encode", "write a tokenizer's ids for each string of a JSONL file (rank 0)", k_encode, run_encode),
};
#undef SUB
#define N_SUB (sizeof k_subcommands / sizeof k_subcommands[0])

int main(int argc, char **argv) {
    const subcommand *sub =
        &k_subcommands[cai_app_subcommand(argc, argv, "colossal-data", "[--key value ...]", k_subcommands, N_SUB,
                                          sizeof *k_subcommands, offsetof(subcommand, name),
                                          offsetof(subcommand, schema.summary))];
    /* The subcommand becomes the program name for the config parser. */
    int sargc = argc - 1;
    char **sargv = argv + 1;
    data_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cai_app app;
    cai_app_init(&app, &sargc, &sargv, &sub->schema, &cfg, offsetof(data_config, common));
    cai_app_check_all(sub->run(&app, &cfg), 1);
    return cai_app_finalize(&sub->schema, &cfg);
}
