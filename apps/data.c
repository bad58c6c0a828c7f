/* colossal-data: the data tool. The subcommand is argv[1]:
 *   preprocess       text/JSONL -> Megatron .bin/.idx, in parallel over ranks
 *   train-tokenizer  learn a byte-level BPE vocabulary from text/JSONL
 *   corpus           write the embedded corpus as JSONL or text
 *   info             validate an indexed dataset and print what it holds
 * Options after the subcommand go through the config module, so each
 * subcommand has --help and YAML files like every other app. */
#include "cai_config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "app_common.h"
#include "colossal/base.h"
#include "colossal/config.h"
#include "colossal/data.h"

/* ------------------------------------------------------------------ config
 * One struct for every subcommand; each schema lists only its own keys. */

enum { FMT_AUTO = 0, FMT_TEXT = 1, FMT_JSONL = 2 };
static const char *const k_formats[] = {"auto", "text", "jsonl", NULL};

typedef struct {
    char *input, *output, *json_key, *tokenizer, *eod, *data;
    int format;
    double progress;
    int64_t vocab_size, min_frequency, docs, seed, seq_len;
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
    char vocab[4096], merges[4096];
    snprintf(vocab, sizeof vocab, "%s/vocab.json", cfg->tokenizer);
    snprintf(merges, sizeof merges, "%s/merges.txt", cfg->tokenizer);
    CAI_CALL(cai_bpe_load(vocab, merges, &t->bpe));
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

static cai_status run_preprocess(const cai_app *app, const data_config *cfg) {
    if (!cfg->output || !*cfg->output)
        return CAI_ERROR(CAI_ERR_CONFIG, "output_prefix: not given (--output-prefix DIR/NAME)");
    char *copy = NULL;
    const char **inputs = malloc(MAX_INPUTS * sizeof *inputs);
    if (!inputs) return CAI_ERROR(CAI_ERR_NOMEM, "input list");
    int n = 0;
    tokenizer tok = {0};
    cai_status st = parse_inputs(cfg, &copy, inputs, &n);
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

#define SUB(name, summary, fields, run) \
    { name, {"colossal-data " name, summary, fields, CAI_CFG_NFIELDS(fields)}, run }
static const subcommand k_subcommands[] = {
    SUB("preprocess", "tokenize text or JSONL into a Megatron indexed dataset (.bin/.idx), in parallel over MPI ranks",
        k_preprocess, run_preprocess),
    SUB("train-tokenizer", "learn a byte-level BPE vocabulary from text or JSONL (rank 0)", k_train, run_train),
    SUB("corpus", "write the embedded training corpus (stories and arithmetic) as JSONL or text", k_corpus, run_corpus),
    SUB("info", "validate an indexed dataset and print its size", k_info, run_info),
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
