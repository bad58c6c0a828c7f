/* Tokenizer throughput on one core: GPT-2 encode (fresh handle, then with a
 * warm word cache), decode, and BPE training, beside the reference GPT-2
 * encoder (tests/data/bpe/ref_encode.py: the merge loop of GPT-2's
 * encoder.py, with its per-word cache) on a slice of the same text, whose ids
 * must equal ours. Results: bench/RESULTS.md.
 *
 *   tokenizer_bench [--vocab DIR] [--mb 32] [--train-mb 8] [--train-vocab 8192]
 *                   [--reference-mb 2] [--suffix .py]... [--out DIR] [PATH...]
 *
 * PATHs are files or directories (read recursively in name order, keeping
 * names that end with a --suffix when any is given) whose contents make the
 * corpus, one document per file, up to --mb MB; default
 * /usr/share/common-licenses. DIR holds GPT-2's encoder.json and vocab.bpe
 * (tests/data/bpe/fetch-gpt2-vocab.sh); default $CAI_GPT2_VOCAB_DIR or
 * build/gpt2-vocab. --out DIR keeps what bench/tokenizer_hf_compare.py needs
 * to compare with Hugging Face tokenizers: the corpus, colossal's GPT-2 ids,
 * the trained tokenizer (saved in HF format) and its ids on the first
 * documents. Single process, not collective. */
#include "cai_config.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "colossal/base.h"
#include "colossal/data.h"

typedef struct {
    char *data;
    size_t len, cap;
    size_t *doc_end; /* end offset of each document */
    size_t ndocs, docs_cap;
    size_t limit;
    const char *suffix[8]; /* when walking directories: only names ending so */
    int nsuffix;
} corpus;

static int wanted(const corpus *c, const char *name) {
    if (!c->nsuffix) return 1;
    size_t n = strlen(name);
    for (int i = 0; i < c->nsuffix; i++) {
        size_t k = strlen(c->suffix[i]);
        if (n >= k && strcmp(name + n - k, c->suffix[i]) == 0) return 1;
    }
    return 0;
}

static int add_file(corpus *c, const char *path) {
    if (c->len >= c->limit) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t before = c->len;
    for (;;) {
        if (c->len + 65536 > c->cap) {
            c->cap = (c->cap + 65536) * 2;
            c->data = realloc(c->data, c->cap);
            if (!c->data) return -1;
        }
        size_t got = fread(c->data + c->len, 1, 65536, f);
        c->len += got;
        if (got == 0 || c->len >= c->limit) break;
    }
    fclose(f);
    if (c->len > c->limit) c->len = c->limit;
    if (c->len == before) return 0;
    if (c->ndocs == c->docs_cap) {
        c->docs_cap = c->docs_cap ? 2 * c->docs_cap : 256;
        c->doc_end = realloc(c->doc_end, c->docs_cap * sizeof *c->doc_end);
        if (!c->doc_end) return -1;
    }
    c->doc_end[c->ndocs++] = c->len;
    return 0;
}

static int add_path(corpus *c, const char *path, int top) {
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    if (S_ISREG(sb.st_mode)) return top || wanted(c, path) ? add_file(c, path) : 0;
    if (!S_ISDIR(sb.st_mode)) return 0;
    struct dirent **ents;
    int n = scandir(path, &ents, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (ents[i]->d_name[0] != '.' && c->len < c->limit) {
            char sub[4096];
            snprintf(sub, sizeof sub, "%s/%s", path, ents[i]->d_name);
            if (add_path(c, sub, 0) != 0) return -1;
        }
        free(ents[i]);
    }
    free(ents);
    return 0;
}

/* Records: u64 count, then the items (bytes or int32 ids). */
static void put_record(FILE *f, const void *p, size_t count, size_t size) {
    uint64_t n = count;
    if (fwrite(&n, sizeof n, 1, f) != 1 || (count && fwrite(p, size, count, f) != count)) {
        fprintf(stderr, "tokenizer_bench: write failed\n");
        exit(1);
    }
}

static FILE *open_out(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    return f;
}

static void die(const char *what) {
    fprintf(stderr, "tokenizer_bench: %s\n", what);
    cai_error_print(stderr);
    exit(1);
}

/* Encode every document once; returns seconds. */
static double encode_all(cai_bpe_t *tok, const corpus *c, cai_token_buf *ids, size_t *doc_tok_end) {
    ids->len = 0;
    double t0 = cai_time_now();
    size_t start = 0;
    for (size_t d = 0; d < c->ndocs; d++) {
        if (cai_bpe_encode(tok, c->data + start, c->doc_end[d] - start, ids) != CAI_OK) die("encode failed");
        doc_tok_end[d] = ids->len;
        start = c->doc_end[d];
    }
    return cai_time_now() - t0;
}

/* The reference encoder on the first documents up to `mb` MB; returns its
 * encoding seconds (start-up excluded) or -1. Checks its ids against ours. */
static double run_reference(const corpus *c, const cai_token_buf *ids, const size_t *doc_tok_end, const char *vocab_dir,
                            const char *srcdir, double mb, size_t *ref_bytes) {
    char cases[] = "/tmp/cai_tokbench_XXXXXX";
    int fd = mkstemp(cases);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    size_t start = 0, ndocs = 0;
    *ref_bytes = 0;
    while (ndocs < c->ndocs && *ref_bytes < mb * 1e6) {
        for (size_t k = start; k < c->doc_end[ndocs]; k++) fprintf(f, "%02x", (unsigned char)c->data[k]);
        fputc('\n', f);
        *ref_bytes += c->doc_end[ndocs] - start;
        start = c->doc_end[ndocs++];
    }
    fclose(f);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "CAI_REF_TIMING=1 python3 '%s/tests/data/bpe/ref_encode.py' '%s' '%s'", srcdir, vocab_dir,
             cases);
    FILE *p = popen(cmd, "r");
    if (!p) {
        remove(cases);
        return -1;
    }
    size_t cap = 1 << 24, d = 0, mismatches = 0;
    char *line = malloc(cap);
    double secs = -1;
    while (fgets(line, (int)cap, p)) {
        if (strncmp(line, "encode_seconds=", 15) == 0) {
            secs = atof(line + 15);
            continue;
        }
        if (d >= ndocs) continue;
        size_t k = d ? doc_tok_end[d - 1] : 0;
        char *q = line, *end;
        for (long v; (v = strtol(q, &end, 10)), end != q; q = end, k++)
            if (k >= doc_tok_end[d] || ids->ids[k] != v) mismatches++;
        if (k != doc_tok_end[d]) mismatches++;
        d++;
    }
    free(line);
    int rc = pclose(p);
    remove(cases);
    if (rc != 0 || d != ndocs) return -1;
    if (mismatches) printf("reference ids: %zu documents, %zu ids DIFFER from colossal's\n", ndocs, mismatches);
    else printf("reference ids: %zu documents, identical to colossal's\n", ndocs);
    return secs;
}

int main(int argc, char **argv) {
    const char *vocab_dir = getenv("CAI_GPT2_VOCAB_DIR") ? getenv("CAI_GPT2_VOCAB_DIR") : "build/gpt2-vocab";
    const char *srcdir = getenv("top_srcdir") ? getenv("top_srcdir") : ".";
    const char *out_dir = NULL;
    double mb = 32, train_mb = 8, ref_mb = 2;
    size_t train_vocab = 8192;
    corpus c = {0};
    int npaths = 0;
    const char *paths[256];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] == '-' && i + 1 >= argc) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--vocab") == 0) vocab_dir = argv[++i];
        else if (strcmp(a, "--mb") == 0) mb = atof(argv[++i]);
        else if (strcmp(a, "--train-mb") == 0) train_mb = atof(argv[++i]);
        else if (strcmp(a, "--train-vocab") == 0) train_vocab = (size_t)atol(argv[++i]);
        else if (strcmp(a, "--reference-mb") == 0) ref_mb = atof(argv[++i]);
        else if (strcmp(a, "--out") == 0) out_dir = argv[++i];
        else if (strcmp(a, "--suffix") == 0 && c.nsuffix < 8) c.suffix[c.nsuffix++] = argv[++i];
        else if (a[0] == '-') {
            fprintf(stderr,
                    "usage: %s [--vocab DIR] [--mb 32] [--train-mb 8] [--train-vocab 8192] "
                    "[--reference-mb 2] [--suffix .txt]... [--out DIR] [PATH...]\n",
                    argv[0]);
            return 2;
        } else if (npaths < 256) paths[npaths++] = a;
    }
    if (!npaths) paths[npaths++] = "/usr/share/common-licenses";
    c.limit = (size_t)(mb * 1e6);
    for (int i = 0; i < npaths; i++)
        if (add_path(&c, paths[i], 1) != 0) die("out of memory reading the corpus");
    if (!c.len) die("empty corpus");
    printf("corpus: %.1f MB in %zu documents\n", c.len / 1e6, c.ndocs);

    char vocab[4096], merges[4096];
    snprintf(vocab, sizeof vocab, "%s/encoder.json", vocab_dir);
    snprintf(merges, sizeof merges, "%s/vocab.bpe", vocab_dir);
    cai_bpe_t *tok;
    double t0 = cai_time_now();
    if (cai_bpe_load(vocab, merges, &tok) != CAI_OK || cai_bpe_add_special(tok, "<|endoftext|>", NULL) != CAI_OK)
        die("cannot load GPT-2's vocabulary (tests/data/bpe/fetch-gpt2-vocab.sh fetches it)");
    printf("load: GPT-2 vocabulary (%d tokens, %zu merges) in %.3f s\n", cai_bpe_vocab_size(tok),
           cai_bpe_merge_count(tok), cai_time_now() - t0);

    cai_token_buf ids = {0};
    size_t *doc_tok_end = malloc(c.ndocs * sizeof *doc_tok_end);
    double cold = encode_all(tok, &c, &ids, doc_tok_end);
    double warm = encode_all(tok, &c, &ids, doc_tok_end);
    printf("encode, fresh handle: %.1f MB/s (%zu tokens, %.2f bytes/token)\n", c.len / 1e6 / cold, ids.len,
           (double)c.len / (double)ids.len);
    printf("encode, warm cache:   %.1f MB/s\n", c.len / 1e6 / warm);

    if (out_dir) {
        mkdir(out_dir, 0777);
        FILE *fc = open_out(out_dir, "corpus.bin"), *fi = open_out(out_dir, "gpt2_ids.bin");
        size_t start = 0;
        for (size_t d = 0; d < c.ndocs; d++) {
            put_record(fc, c.data + start, c.doc_end[d] - start, 1);
            size_t t0i = d ? doc_tok_end[d - 1] : 0;
            put_record(fi, ids.ids + t0i, doc_tok_end[d] - t0i, sizeof(int32_t));
            start = c.doc_end[d];
        }
        fclose(fc);
        fclose(fi);
    }

    cai_byte_buf out = {0};
    t0 = cai_time_now();
    if (cai_bpe_decode(tok, ids.ids, ids.len, &out) != CAI_OK) die("decode failed");
    double dsec = cai_time_now() - t0;
    if (out.len != c.len || memcmp(out.data, c.data, c.len) != 0) die("decode(encode(corpus)) differs");
    printf("decode: %.1f MB/s (round trip exact)\n", c.len / 1e6 / dsec);

    /* Training on a prefix of the corpus. */
    cai_bpe_train_opts o = {.vocab_size = train_vocab,
                            .special_tokens = (const char *[]){"<|endoftext|>"},
                            .n_special = 1};
    cai_bpe_trainer_t *tr;
    size_t tlen = c.len < (size_t)(train_mb * 1e6) ? c.len : (size_t)(train_mb * 1e6);
    if (cai_bpe_trainer_init(&o, &tr) != CAI_OK) die("trainer init");
    t0 = cai_time_now();
    size_t start = 0;
    for (size_t d = 0; d < c.ndocs && start < tlen; d++) {
        size_t end = c.doc_end[d] < tlen ? c.doc_end[d] : tlen;
        if (cai_bpe_trainer_feed(tr, c.data + start, end - start) != CAI_OK) die("trainer feed");
        start = end;
    }
    double count_s = cai_time_now() - t0;
    cai_bpe_t *trained;
    t0 = cai_time_now();
    if (cai_bpe_trainer_finish(tr, &trained) != CAI_OK) die("trainer finish");
    double merge_s = cai_time_now() - t0;
    cai_bpe_trainer_free(tr);
    fflush(stdout);
    printf("train: %.1f MB counted at %.1f MB/s; %zu merges (vocab %d) in %.2f s (%.0f merges/s)\n", tlen / 1e6,
           tlen / 1e6 / count_s, cai_bpe_merge_count(trained), cai_bpe_vocab_size(trained), merge_s,
           cai_bpe_merge_count(trained) / merge_s);
    if (out_dir) { /* the trained tokenizer and its ids on the first 2 MB */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/trained", out_dir);
        if (cai_bpe_save(trained, dir) != CAI_OK) die("save");
        FILE *f = open_out(out_dir, "trained_ids.bin");
        cai_token_buf tids = {0};
        size_t begin = 0;
        for (size_t d = 0; d < c.ndocs && begin < 2000000; d++) {
            tids.len = 0;
            if (cai_bpe_encode(trained, c.data + begin, c.doc_end[d] - begin, &tids) != CAI_OK) die("encode");
            put_record(f, tids.ids, tids.len, sizeof(int32_t));
            begin = c.doc_end[d];
        }
        fclose(f);
        cai_token_buf_free(&tids);
    }
    cai_bpe_free(trained);

    size_t ref_bytes = 0;
    double ref = ref_mb > 0 ? run_reference(&c, &ids, doc_tok_end, vocab_dir, srcdir, ref_mb, &ref_bytes) : -1;
    if (ref > 0) {
        double ref_rate = ref_bytes / 1e6 / ref;
        printf("reference (python3 ref_encode.py, GPT-2 encoder.py algorithm): %.2f MB/s on %.1f MB\n", ref_rate,
               ref_bytes / 1e6);
        printf("ratio colossal/reference: fresh %.1fx, warm %.1fx\n", c.len / 1e6 / cold / ref_rate,
               c.len / 1e6 / warm / ref_rate);
    } else if (ref_mb > 0) {
        printf("reference: not run (python3 or %s/tests/data/bpe/ref_encode.py unavailable)\n", srcdir);
    }
    cai_byte_buf_free(&out);
    cai_token_buf_free(&ids);
    free(doc_tok_end);
    free(c.data);
    free(c.doc_end);
    cai_bpe_free(tok);
    return 0;
}
