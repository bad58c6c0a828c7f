/* colossal-pretrain data: the tokenizer, the embedded corpus when no data
 * path is given, the train/valid datasets and this rank's slice of every
 * global batch. */
#include "cai_config.h"

#include <errno.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pretrain.h"

static cai_status mkdir_p(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return CAI_ERROR(CAI_ERR_CONFIG, "run.dir: path too long (%zu bytes)", strlen(path));
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return CAI_ERROR(CAI_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    return CAI_OK;
}

/* ------------------------------------------------------------------ tokenizer */

static cai_status bpe_load_dir(pt_tokenizer *t, const char *dir, const char *eod) {
    CAI_CALL(cai_bpe_load_dir(dir, &t->bpe));
    CAI_CALL(cai_bpe_add_special(t->bpe, eod, &t->eod));
    t->vocab_size = cai_bpe_vocab_size(t->bpe);
    return CAI_OK;
}

cai_status pt_encode(pt_tokenizer *t, const char *text, cai_token_buf *out) {
    /* Document text is data: "<|endoftext|>" inside it stays ordinary text. */
    if (t->bpe) return cai_bpe_encode_ordinary(t->bpe, text, strlen(text), out);
    return cai_byte_tokenize(NULL, text, strlen(text), out);
}

static cai_status encode_fn(void *ctx, const char *text, size_t len, cai_token_buf *out) {
    pt_tokenizer *t = ctx;
    if (t->bpe) return cai_bpe_encode_ordinary(t->bpe, text, len, out);
    return cai_byte_tokenize(NULL, text, len, out);
}

cai_status pt_decode(const pt_tokenizer *t, const int32_t *ids, size_t n, cai_byte_buf *out) {
    if (t->bpe) return cai_bpe_decode(t->bpe, ids, n, out);
    return cai_byte_detokenize(ids, n, out);
}

/* Rank 0 learns a BPE vocabulary from the embedded corpus and saves it. */
static cai_status train_corpus_tokenizer(const pt_config *cfg, const char *out_dir) {
    cai_bpe_train_opts opts = {(size_t)cfg->corpus_vocab, (const char *const[]){cfg->eod}, 1, 2};
    cai_bpe_trainer_t *tr = NULL;
    cai_bpe_t *bpe = NULL;
    char *doc = malloc(CAI_CORPUS_MAX_DOC);
    cai_status st = doc ? CAI_OK : CAI_ERROR(CAI_ERR_NOMEM, "corpus document buffer");
    if (st == CAI_OK) CAI_CALL_GOTO(cai_bpe_trainer_init(&opts, &tr), st, done);
    if (st == CAI_OK) CAI_CALL_GOTO(cai_bpe_trainer_set_split_digits(tr, cfg->corpus_split_digits), st, done);
    for (int64_t i = 0; i < cfg->corpus_docs && st == CAI_OK; i++) {
        size_t len = 0;
        CAI_CALL_GOTO(cai_corpus_document((uint64_t)cfg->corpus_seed, i, doc, CAI_CORPUS_MAX_DOC, &len), st, done);
        CAI_CALL_GOTO(cai_bpe_trainer_feed(tr, doc, len), st, done);
    }
    if (st == CAI_OK) CAI_CALL_GOTO(cai_bpe_trainer_finish(tr, &bpe), st, done);
    if (st == CAI_OK) CAI_CALL_GOTO(cai_bpe_save(bpe, out_dir), st, done);
done:
    cai_bpe_free(bpe);
    cai_bpe_trainer_free(tr);
    free(doc);
    return st;
}

/* ------------------------------------------------------------------ corpus */

/* The embedded corpus, written by rank 0 and preprocessed by every rank
 * into dir/data/corpus.{bin,idx}; the tokenizer is trained first when asked. */
static cai_status path_join(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return CAI_ERROR(CAI_ERR_CONFIG, "run.dir: path %s/%s is too long", dir, name);
    return CAI_OK;
}

static void prepare_corpus(pt_data *d, const pt_config *cfg, int rank, char *prefix, size_t cap) {
    enum { PATH = 4096 };
    char data_dir[PATH], jsonl[PATH], tok_dir[PATH];
    cai_status st = path_join(data_dir, PATH, cfg->run.dir, "data");
    if (st == CAI_OK) st = path_join(jsonl, PATH, data_dir, "corpus.jsonl");
    if (st == CAI_OK) st = path_join(prefix, cap, data_dir, "corpus");
    if (st == CAI_OK) st = path_join(tok_dir, PATH, cfg->run.dir, "tokenizer");
    cai_app_check_all(st, 2);
    int train_tok = !*cfg->tokenizer && cfg->corpus_vocab > 0;
    if (rank == 0) {
        st = mkdir_p(data_dir);
        if (st == CAI_OK)
            st = cai_corpus_write(jsonl, cfg->corpus_docs, (uint64_t)cfg->corpus_seed, CAI_PREPROCESS_JSONL);
        if (st == CAI_OK && train_tok) st = train_corpus_tokenizer(cfg, tok_dir);
    }
    cai_app_check_all(st, 1);
    if (train_tok) cai_app_check_all(bpe_load_dir(&d->tok, tok_dir, cfg->eod), 1);
    const char *inputs[] = {jsonl};
    cai_preprocess_config pc = {inputs,    1,       CAI_PREPROCESS_JSONL, "text",     prefix,
                                encode_fn, &d->tok, d->tok.vocab_size,    d->tok.eod, 0};
    cai_preprocess_stats ps;
    cai_app_check_all(cai_preprocess(&pc, MPI_COMM_WORLD, &ps), 1);
    snprintf(d->source, sizeof d->source,
             "embedded corpus (%lld documents, seed %lld) -> %.200s: %lld tokens; tokenizer %s, vocabulary %lld",
             (long long)ps.documents, (long long)cfg->corpus_seed, prefix, (long long)ps.tokens,
             d->tok.bpe ? (train_tok ? "BPE trained on the corpus" : "BPE") : "byte-level",
             (long long)d->tok.vocab_size);
}

/* ------------------------------------------------------------------ datasets */

cai_status pt_data_init(pt_data *d, const pt_config *cfg, cai_mesh_t *mesh, int64_t *vocab_size) {
    memset(d, 0, sizeof *d);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int dp = cai_mesh_size(mesh, CAI_AXIS_DP);
    d->local_batch = (int64_t)cfg->micro_batch * cfg->grad_accum;
    d->global_batch = d->local_batch * dp;

    d->tok.vocab_size = CAI_BYTE_VOCAB;
    d->tok.eod = CAI_BYTE_EOD;
    if (*cfg->tokenizer) cai_app_check_all(bpe_load_dir(&d->tok, cfg->tokenizer, cfg->eod), 1);

    char prefix[4096];
    const char *paths = cfg->data_path;
    if (!*paths) {
        prepare_corpus(d, cfg, rank, prefix, sizeof prefix);
        paths = prefix;
    } else {
        snprintf(d->source, sizeof d->source, "%.400s; tokenizer %s, vocabulary %lld", paths,
                 d->tok.bpe ? "BPE" : "byte-level", (long long)d->tok.vocab_size);
    }
    *vocab_size = cfg->vocab_size > 0 ? cfg->vocab_size : d->tok.vocab_size;
    if (*vocab_size < d->tok.vocab_size)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.vocab_size=%lld is smaller than the tokenizer's %lld ids",
                         (long long)*vocab_size, (long long)d->tok.vocab_size);

    int64_t valid = cfg->eval_interval > 0 ? (int64_t)cfg->eval_batches * d->global_batch : 0;
    cai_gpt_data_config gc = {paths,
                              cfg->split,
                              cfg->seq_len,
                              (uint64_t)cfg->data_seed,
                              *vocab_size,
                              {cfg->steps * d->global_batch, valid > 0 ? valid : d->global_batch, d->global_batch}};
    CAI_CALL(cai_gpt_data_init(&d->data, &gc));
    d->train = cai_gpt_data_get(d->data, CAI_SPLIT_TRAIN);
    d->valid = cai_gpt_data_get(d->data, CAI_SPLIT_VALID);
    if (!d->train)
        return CAI_ERROR(CAI_ERR_CONFIG, "data.split=\"%s\" leaves no documents of %s for training", cfg->split, paths);
    d->valid_samples = d->valid ? valid : 0;
    if (cfg->eval_interval > 0 && !d->valid)
        CAI_WARN("data.split=\"%s\" leaves no validation documents: validation is off", cfg->split);

    CAI_CALL(pt_data_seek(d, cfg, mesh, 0));
    size_t n = (size_t)d->local_batch * (size_t)cfg->seq_len;
    CAI_CALL(cai_malloc((void **)&d->indices, (size_t)d->local_batch * sizeof *d->indices, "batch indices"));
    CAI_CALL(cai_malloc((void **)&d->tokens, n * sizeof *d->tokens, "batch tokens"));
    CAI_CALL(cai_malloc((void **)&d->targets, n * sizeof *d->targets, "batch targets"));
    return CAI_OK;
}

cai_status pt_data_seek(pt_data *d, const pt_config *cfg, cai_mesh_t *mesh, int64_t consumed) {
    cai_sampler_config sc = {cai_gpt_dataset_size(d->train),
                             d->global_batch,
                             cai_mesh_size(mesh, CAI_AXIS_DP),
                             cai_mesh_rank(mesh, CAI_AXIS_DP),
                             0,
                             (uint64_t)cfg->data_seed};
    cai_sampler_free(d->sampler);
    d->sampler = NULL;
    CAI_CALL(cai_sampler_init(&d->sampler, &sc, consumed));
    return CAI_OK;
}

void pt_data_free(pt_data *d) {
    cai_sampler_free(d->sampler);
    cai_gpt_data_free(d->data);
    cai_bpe_free(d->tok.bpe);
    cai_free(d->indices);
    cai_free(d->tokens);
    cai_free(d->targets);
    memset(d, 0, sizeof *d);
}

cai_status pt_data_next(pt_data *d) {
    CAI_CALL(cai_sampler_next(d->sampler, d->indices));
    CAI_CALL(cai_gpt_dataset_batch(d->train, d->indices, d->local_batch, d->tokens, d->targets));
    return CAI_OK;
}

cai_status pt_data_valid_batch(pt_data *d, int64_t b, int dp_rank) {
    int64_t n = cai_gpt_dataset_size(d->valid);
    /* The same contiguous dp slicing as the train sampler, without shuffling:
     * every evaluation reads the same samples. */
    for (int64_t j = 0; j < d->local_batch; j++)
        d->indices[j] = (b * d->global_batch + dp_rank * d->local_batch + j) % n;
    CAI_CALL(cai_gpt_dataset_batch(d->valid, d->indices, d->local_batch, d->tokens, d->targets));
    return CAI_OK;
}
