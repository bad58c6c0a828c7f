/* Megatron indexed datasets: the builder's bytes checked against an
 * independent parse of the format, round trips in every integer dtype,
 * merging, the reader's validation on hand-corrupted files (each corruption
 * gives its own error, never a crash), and the embedded corpus (determinism,
 * variety, arithmetic that is actually right, both file formats). */
#include "cai_config.h"
#include "colossal/data.h"

#include "test_indexed_util.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Deterministic test tokens: a tiny LCG so the reference does not use the
 * library's RNG. */
static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

typedef struct {
    int n_docs;
    int seqs_per_doc[16];
    int len[64];
    int32_t tok[64][40];
    int n_seq;
} corpus_t;

/* Documents of 1..3 sequences, lengths 0..39 (zero-length sequences
 * included: the format allows them), ids in [0, maxid]. */
static void make_corpus(corpus_t *c, uint32_t seed, int32_t minid, int32_t maxid) {
    memset(c, 0, sizeof *c);
    c->n_docs = 12;
    for (int d = 0; d < c->n_docs; d++) {
        c->seqs_per_doc[d] = 1 + (int)(lcg(&seed) % 3);
        for (int k = 0; k < c->seqs_per_doc[d]; k++) {
            const int s = c->n_seq++;
            c->len[s] = (int)(lcg(&seed) % 40);
            for (int t = 0; t < c->len[s]; t++)
                c->tok[s][t] = (int32_t)(minid + (int64_t)(lcg(&seed) % (uint64_t)((int64_t)maxid - minid + 1)));
        }
    }
}

static void build(const corpus_t *c, const char *prefix, cai_indexed_dtype dt, int64_t vocab) {
    cai_indexed_builder_t *b;
    CK_CAI(cai_indexed_builder_init(&b, prefix, dt, vocab));
    for (int d = 0, s = 0; d < c->n_docs; d++) {
        for (int k = 0; k < c->seqs_per_doc[d]; k++, s++) CK_CAI(cai_indexed_builder_add(b, c->tok[s], c->len[s]));
        CK_CAI(cai_indexed_builder_end_document(b));
    }
    CK_CAI(cai_indexed_builder_finish(b));
}

static uint64_t rd_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* ------------------------------------------------------------------ format */

START_TEST(dtype_codes_are_megatrons) {
    /* megatron/core/datasets/indexed_dataset.py, class DType */
    static const struct {
        int code;
        const char *name;
        size_t size;
    } k[] = {{1, "uint8", 1}, {2, "int8", 1},    {3, "int16", 2},   {4, "int32", 4},
             {5, "int64", 8}, {6, "float64", 8}, {7, "float32", 4}, {8, "uint16", 2}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        ck_assert_str_eq(cai_indexed_dtype_name(k[i].code), k[i].name);
        ck_assert_uint_eq(cai_indexed_dtype_size(k[i].code), k[i].size);
    }
    ck_assert_uint_eq(cai_indexed_dtype_size(0), 0);
    ck_assert_uint_eq(cai_indexed_dtype_size(9), 0);
    /* optimal_dtype: uint16 below 65500 */
    ck_assert_int_eq(cai_indexed_dtype_for_vocab(257), CAI_INDEXED_U16);
    ck_assert_int_eq(cai_indexed_dtype_for_vocab(50257), CAI_INDEXED_U16);
    ck_assert_int_eq(cai_indexed_dtype_for_vocab(65499), CAI_INDEXED_U16);
    ck_assert_int_eq(cai_indexed_dtype_for_vocab(65500), CAI_INDEXED_I32);
    ck_assert_int_eq(cai_indexed_dtype_for_vocab(128256), CAI_INDEXED_I32);
}
END_TEST

/* The written bytes, parsed here by hand from the format description. */
START_TEST(builder_writes_the_megatron_layout) {
    corpus_t c;
    make_corpus(&c, 7, 0, 60000);
    char prefix[300], path[320];
    path_in(prefix, sizeof prefix, "layout");
    build(&c, prefix, CAI_INDEXED_U16, 0);
    size_t ni, nb;
    snprintf(path, sizeof path, "%s.idx", prefix);
    unsigned char *idx = slurp(path, &ni);
    snprintf(path, sizeof path, "%s.bin", prefix);
    unsigned char *bin = slurp(path, &nb);
    ck_assert_int_eq(memcmp(idx, "MMIDIDX\0\0", 9), 0);
    ck_assert_uint_eq(rd_u64(idx + 9), 1);
    ck_assert_int_eq(idx[17], 8);
    const uint64_t S = rd_u64(idx + 18), D = rd_u64(idx + 26);
    ck_assert_uint_eq(S, (uint64_t)c.n_seq);
    ck_assert_uint_eq(D, (uint64_t)c.n_docs + 1);
    ck_assert_uint_eq(ni, 34 + 4 * S + 8 * S + 8 * D);
    const unsigned char *len = idx + 34, *ptr = len + 4 * S, *doc = ptr + 8 * S;
    uint64_t at = 0;
    for (uint64_t s = 0; s < S; s++) {
        uint32_t l = (uint32_t)len[4 * s] | (uint32_t)len[4 * s + 1] << 8 | (uint32_t)len[4 * s + 2] << 16 |
                     (uint32_t)len[4 * s + 3] << 24;
        ck_assert_uint_eq(l, (uint32_t)c.len[s]);
        ck_assert_uint_eq(rd_u64(ptr + 8 * s), at);
        for (uint32_t t = 0; t < l; t++) {
            const unsigned v = bin[at + 2 * t] | (unsigned)bin[at + 2 * t + 1] << 8;
            ck_assert_uint_eq(v, (unsigned)c.tok[s][t]);
        }
        at += 2 * l;
    }
    ck_assert_uint_eq(at, nb);
    uint64_t first = 0;
    ck_assert_uint_eq(rd_u64(doc), 0);
    for (int d = 0; d < c.n_docs; d++) {
        first += (uint64_t)c.seqs_per_doc[d];
        ck_assert_uint_eq(rd_u64(doc + 8 * (d + 1)), first);
    }
    free(idx);
    free(bin);
}
END_TEST

START_TEST(round_trip_every_integer_dtype) {
    static const struct {
        cai_indexed_dtype dt;
        int32_t lo, hi;
    } k[] = {{CAI_INDEXED_U8, 0, 255},
             {CAI_INDEXED_I8, -128, 127},
             {CAI_INDEXED_I16, -32768, 32767},
             {CAI_INDEXED_U16, 0, 65535},
             {CAI_INDEXED_I32, -2000000000, 2000000000},
             {CAI_INDEXED_I64, -2000000000, 2000000000}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        corpus_t c;
        make_corpus(&c, 100 + (uint32_t)i, k[i].lo, k[i].hi);
        c.tok[0][0] = k[i].lo; /* the extremes survive */
        c.len[0] = c.len[0] < 2 ? 2 : c.len[0];
        c.tok[0][1] = k[i].hi;
        char prefix[300];
        path_in(prefix, sizeof prefix, cai_indexed_dtype_name(k[i].dt));
        build(&c, prefix, k[i].dt, 0);
        cai_indexed_dataset_t *ds;
        CK_CAI(cai_indexed_open(&ds, prefix, 0));
        ck_assert_int_eq(cai_indexed_get_dtype(ds), k[i].dt);
        ck_assert_int_eq(cai_indexed_num_sequences(ds), c.n_seq);
        ck_assert_int_eq(cai_indexed_num_documents(ds), c.n_docs);
        int64_t tokens = 0, s = 0;
        for (int d = 0; d < c.n_docs; d++) {
            ck_assert_int_eq(cai_indexed_document_start(ds, d), s);
            s += c.seqs_per_doc[d];
        }
        ck_assert_int_eq(cai_indexed_document_start(ds, c.n_docs), c.n_seq);
        for (int q = 0; q < c.n_seq; q++) {
            int32_t got[40];
            ck_assert_int_eq(cai_indexed_sequence_length(ds, q), c.len[q]);
            CK_CAI(cai_indexed_read(ds, q, 0, c.len[q], got));
            for (int t = 0; t < c.len[q]; t++) ck_assert_int_eq(got[t], c.tok[q][t]);
            if (c.len[q] > 3) { /* partial reads */
                CK_CAI(cai_indexed_read(ds, q, 2, c.len[q] - 3, got));
                for (int t = 0; t < c.len[q] - 3; t++) ck_assert_int_eq(got[t], c.tok[q][t + 2]);
            }
            tokens += c.len[q];
        }
        ck_assert_int_eq(cai_indexed_num_tokens(ds), tokens);
        int32_t one;
        ck_assert_int_eq(cai_indexed_read(ds, c.n_seq, 0, 0, &one), CAI_ERR_INVALID_ARG);
        ck_assert_int_eq(cai_indexed_read(ds, 0, 0, c.len[0] + 1, &one), CAI_ERR_INVALID_ARG);
        cai_indexed_free(ds);
    }
}
END_TEST

START_TEST(builder_refuses_what_does_not_fit) {
    char prefix[300];
    path_in(prefix, sizeof prefix, "refuse");
    cai_indexed_builder_t *b;
    CK_CAI(cai_indexed_builder_init(&b, prefix, CAI_INDEXED_U16, 0));
    const int32_t big[2] = {5, 65536}, neg[1] = {-1};
    ck_assert_int_eq(cai_indexed_builder_add(b, big, 2), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "65536"));
    ck_assert_int_eq(cai_indexed_builder_add(b, neg, 1), CAI_ERR_INVALID_ARG);
    cai_indexed_builder_abort(b);
    CK_CAI(cai_indexed_builder_init(&b, prefix, CAI_INDEXED_I32, 1000));
    const int32_t v[2] = {999, 1000};
    ck_assert_int_eq(cai_indexed_builder_add(b, v, 2), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "vocabulary"));
    CK_CAI(cai_indexed_builder_add(b, v, 1));
    /* a sequence outside any document */
    ck_assert_int_eq(cai_indexed_builder_finish(b), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "end_document"));
    /* nothing was left behind */
    char path[320];
    snprintf(path, sizeof path, "%s.bin.tmp", prefix);
    ck_assert_int_ne(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s.bin", prefix);
    ck_assert_int_ne(access(path, F_OK), 0);
    ck_assert_int_eq(cai_indexed_builder_init(&b, prefix, CAI_INDEXED_F32, 0), CAI_ERR_INVALID_ARG);
}
END_TEST

/* Appending datasets (Megatron add_index) gives the same bytes as writing
 * every document into one builder. */
START_TEST(append_equals_writing_everything_at_once) {
    corpus_t a, b;
    make_corpus(&a, 11, 0, 1000);
    make_corpus(&b, 12, 0, 1000);
    char pa[300], pb[300], pall[300], pmerged[300];
    path_in(pa, sizeof pa, "part_a");
    path_in(pb, sizeof pb, "part_b");
    path_in(pall, sizeof pall, "all");
    path_in(pmerged, sizeof pmerged, "merged");
    build(&a, pa, CAI_INDEXED_U16, 0);
    build(&b, pb, CAI_INDEXED_U16, 0);
    cai_indexed_builder_t *w;
    CK_CAI(cai_indexed_builder_init(&w, pall, CAI_INDEXED_U16, 0));
    const corpus_t *both[2] = {&a, &b};
    for (int k = 0; k < 2; k++)
        for (int d = 0, s = 0; d < both[k]->n_docs; d++) {
            for (int q = 0; q < both[k]->seqs_per_doc[d]; q++, s++)
                CK_CAI(cai_indexed_builder_add(w, both[k]->tok[s], both[k]->len[s]));
            CK_CAI(cai_indexed_builder_end_document(w));
        }
    CK_CAI(cai_indexed_builder_finish(w));
    cai_indexed_dataset_t *da, *db;
    CK_CAI(cai_indexed_open(&da, pa, 0));
    CK_CAI(cai_indexed_open(&db, pb, 0));
    CK_CAI(cai_indexed_builder_init(&w, pmerged, CAI_INDEXED_U16, 0));
    CK_CAI(cai_indexed_builder_append(w, da));
    CK_CAI(cai_indexed_builder_append(w, db));
    CK_CAI(cai_indexed_builder_finish(w));
    cai_indexed_free(da);
    cai_indexed_free(db);
    const char *ext[2] = {".idx", ".bin"};
    for (int e = 0; e < 2; e++) {
        char p1[320], p2[320];
        snprintf(p1, sizeof p1, "%s%s", pall, ext[e]);
        snprintf(p2, sizeof p2, "%s%s", pmerged, ext[e]);
        size_t n1, n2;
        unsigned char *x = slurp(p1, &n1), *y = slurp(p2, &n2);
        ck_assert_uint_eq(n1, n2);
        ck_assert_int_eq(memcmp(x, y, n1), 0);
        free(x);
        free(y);
    }
    /* a dtype mismatch is refused */
    CK_CAI(cai_indexed_builder_init(&w, pmerged, CAI_INDEXED_I32, 0));
    CK_CAI(cai_indexed_open(&da, pa, 0));
    ck_assert_int_eq(cai_indexed_builder_append(w, da), CAI_ERR_INVALID_ARG);
    cai_indexed_free(da);
    cai_indexed_builder_abort(w);
}
END_TEST

START_TEST(empty_dataset_opens) {
    char prefix[300];
    path_in(prefix, sizeof prefix, "empty");
    cai_indexed_builder_t *b;
    CK_CAI(cai_indexed_builder_init(&b, prefix, CAI_INDEXED_U16, 0));
    CK_CAI(cai_indexed_builder_finish(b));
    cai_indexed_dataset_t *ds;
    CK_CAI(cai_indexed_open(&ds, prefix, 10));
    ck_assert_int_eq(cai_indexed_num_sequences(ds), 0);
    ck_assert_int_eq(cai_indexed_num_documents(ds), 0);
    cai_indexed_free(ds);
}
END_TEST

/* ------------------------------------------------------------------ corruption */

typedef struct {
    const char *what;
    int file;   /* 0: .idx, 1: .bin */
    long at;    /* byte offset to overwrite (-1: none) */
    int nbytes; /* 1 or 8 or 4 */
    int64_t value;
    long truncate_to; /* -1: keep size; else new size (negative counts from the end: -2 - n) */
    long append;      /* extra zero bytes at the end */
    int64_t vocab;
    cai_status want;
    const char *needle;
} corruption;

static void put_le(unsigned char *p, int n, int64_t v) {
    for (int i = 0; i < n; i++) p[i] = (unsigned char)((uint64_t)v >> (8 * i));
}

START_TEST(each_corruption_gets_its_own_error) {
    /* 3 documents: seqs {2,1,1}, lengths 3,2,4,1 (uint16) */
    char good[300];
    path_in(good, sizeof good, "good");
    cai_indexed_builder_t *b;
    CK_CAI(cai_indexed_builder_init(&b, good, CAI_INDEXED_U16, 0));
    const int32_t t[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 500};
    CK_CAI(cai_indexed_builder_add(b, t, 3));
    CK_CAI(cai_indexed_builder_add(b, t + 3, 2));
    CK_CAI(cai_indexed_builder_end_document(b));
    CK_CAI(cai_indexed_builder_add_document(b, t + 5, 4));
    CK_CAI(cai_indexed_builder_add_document(b, t + 9, 1));
    CK_CAI(cai_indexed_builder_finish(b));
    const long S = 4, L = 34, P = 34 + 4 * S, DI = 34 + 12 * S;
    const corruption k[] = {
        {"magic", 0, 0, 1, 'X', -1, 0, 0, CAI_ERR_FORMAT, "bad magic"},
        {"version", 0, 9, 8, 2, -1, 0, 0, CAI_ERR_FORMAT, "version is 2"},
        {"dtype code unknown", 0, 17, 1, 9, -1, 0, 0, CAI_ERR_FORMAT, "dtype code 9 is unknown"},
        {"dtype code zero", 0, 17, 1, 0, -1, 0, 0, CAI_ERR_FORMAT, "dtype code 0 is unknown"},
        {"dtype float", 0, 17, 1, 6, -1, 0, 0, CAI_ERR_FORMAT, "not an integer type"},
        {"dtype changes sizes", 0, 17, 1, 4, -1, 0, 0, CAI_ERR_FORMAT, "sequence_pointers[1] is 6"},
        {"header cut", 0, -1, 0, 0, 20, 0, 0, CAI_ERR_FORMAT, "truncated header"},
        {"arrays cut", 0, -1, 0, 0, -2 - 5, 0, 0, CAI_ERR_FORMAT, "truncated arrays"},
        {"trailing", 0, -1, 0, 0, -1, 3, 0, CAI_ERR_FORMAT, "trailing bytes"},
        {"huge sequence count", 0, 18, 8, INT64_MAX, -1, 0, 0, CAI_ERR_FORMAT, "sequence count"},
        {"sequence count too big", 0, 18, 8, 5, -1, 0, 0, CAI_ERR_FORMAT, "document count"},
        {"huge document count", 0, 26, 8, (int64_t)1 << 60, -1, 0, 0, CAI_ERR_FORMAT, "document count"},
        {"zero document count", 0, 26, 8, 0, -1, 0, 0, CAI_ERR_FORMAT, "trailing bytes"},
        {"first doc index", 0, DI, 8, 1, -1, 0, 0, CAI_ERR_FORMAT, "document_indices[0] is 1"},
        {"doc index decreasing", 0, DI + 16, 8, 1, -1, 0, 0, CAI_ERR_FORMAT, "document_indices[2] is 1"},
        {"doc index past end", 0, DI + 16, 8, 9, -1, 0, 0, CAI_ERR_FORMAT, "document_indices[2] is 9"},
        {"last doc index", 0, DI + 24, 8, 3, -1, 0, 0, CAI_ERR_FORMAT, "last document index is 3"},
        {"negative length", 0, L + 4, 4, -2, -1, 0, 0, CAI_ERR_FORMAT, "sequence_lengths[1] is -2"},
        {"length too long", 0, L + 4, 4, 3, -1, 0, 0, CAI_ERR_FORMAT, "sequence_pointers[2] is 10"},
        {"last length past bin", 0, L + 12, 4, 2, -1, 0, 0, CAI_ERR_FORMAT, "runs past the end"},
        {"pointer past bin", 0, P + 8, 8, 1000, -1, 0, 0, CAI_ERR_FORMAT, "sequence_pointers[1] = 1000"},
        {"negative pointer", 0, P + 8, 8, -4, -1, 0, 0, CAI_ERR_FORMAT, "sequence_pointers[1] = -4"},
        {"pointer inconsistent", 0, P + 8, 8, 8, -1, 0, 0, CAI_ERR_FORMAT, "inconsistent"},
        {"bin truncated", 1, -1, 0, 0, -2 - 2, 0, 0, CAI_ERR_FORMAT, "runs past the end"},
        {"bin trailing", 1, -1, 0, 0, -1, 2, 0, CAI_ERR_FORMAT, "describes 20 bytes"},
        {"token outside vocabulary", 1, 18, 2, 500, -1, 0, 500, CAI_ERR_FORMAT,
         "token 500 at position 0 of sequence 3"},
    };
    char bad[300];
    path_in(bad, sizeof bad, "bad");
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        for (int f = 0; f < 2; f++) {
            char src[320], dst[320];
            snprintf(src, sizeof src, "%s%s", good, f ? ".bin" : ".idx");
            snprintf(dst, sizeof dst, "%s%s", bad, f ? ".bin" : ".idx");
            size_t n;
            unsigned char *p = slurp(src, &n);
            p = realloc(p, n + 16);
            if (f == k[i].file) {
                if (k[i].at >= 0) put_le(p + k[i].at, k[i].nbytes, k[i].value);
                if (k[i].truncate_to >= 0) n = (size_t)k[i].truncate_to;
                if (k[i].truncate_to < -1) n -= (size_t)(-2 - k[i].truncate_to);
                memset(p + n, 0, (size_t)k[i].append);
                n += (size_t)k[i].append;
            }
            spit(dst, p, n);
            free(p);
        }
        cai_indexed_dataset_t *ds = NULL;
        cai_error_clear();
        cai_status st = cai_indexed_open(&ds, bad, k[i].vocab);
        ck_assert_msg(st == k[i].want, "%s: got %s (%s)", k[i].what, cai_status_str(st), cai_error_message());
        ck_assert_ptr_null(ds);
        ck_assert_msg(strstr(cai_error_message(), k[i].needle) != NULL, "%s: message \"%s\" lacks \"%s\"", k[i].what,
                      cai_error_message(), k[i].needle);
        /* The message names the file it is about. */
        ck_assert_msg(strstr(cai_error_message(), "/bad.") != NULL, "%s: message \"%s\" names no file", k[i].what,
                      cai_error_message());
    }
    /* The uncorrupted copy still opens, with the vocabulary check on. */
    cai_indexed_dataset_t *ds;
    CK_CAI(cai_indexed_open(&ds, good, 501));
    cai_indexed_free(ds);
    ck_assert_int_eq(cai_indexed_open(&ds, good, 500), CAI_ERR_FORMAT);
    char missing[300];
    path_in(missing, sizeof missing, "no_such_dataset");
    ck_assert_int_eq(cai_indexed_open(&ds, missing, 0), CAI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "no_such_dataset.idx"));
}
END_TEST

/* ------------------------------------------------------------------ corpus */

static int check_arith_line(const char *line) {
    int a, b, c;
    if (sscanf(line, "Q: What is %d + %d? A: %d", &a, &b, &c) == 3) return a + b == c;
    if (sscanf(line, "Q: What is %d - %d? A: %d", &a, &b, &c) == 3) return a - b == c && c >= 0;
    if (sscanf(line, "Q: What is %d times %d? A: %d", &a, &b, &c) == 3) return a * b == c;
    if (sscanf(line, "Q: What is %d divided by %d? A: %d", &a, &b, &c) == 3) return b && a == b * c;
    if (sscanf(line, "Answer: %d + %d = %d.", &a, &b, &c) == 3) return a + b == c;
    if (sscanf(line, "Answer: %d - %d = %d.", &a, &b, &c) == 3) return a - b == c && c >= 0;
    if (sscanf(line, "Answer: %d x %d = %d.", &a, &b, &c) == 3) return a * b == c;
    return -1; /* not arithmetic */
}

START_TEST(corpus_is_deterministic_varied_and_right) {
    enum { N = 2000 };
    char *a = malloc(CAI_CORPUS_MAX_DOC), *b = malloc(CAI_CORPUS_MAX_DOC);
    char **seen = calloc(N, sizeof *seen);
    int checked = 0, stories = 0, distinct = 0;
    size_t total = 0;
    for (int i = 0; i < N; i++) {
        size_t la, lb;
        CK_CAI(cai_corpus_document(42, i, a, CAI_CORPUS_MAX_DOC, &la));
        CK_CAI(cai_corpus_document(42, i, b, CAI_CORPUS_MAX_DOC, &lb));
        ck_assert_uint_eq(la, lb);
        ck_assert_int_eq(memcmp(a, b, la), 0);
        ck_assert_uint_eq(strlen(a), la);
        ck_assert_uint_gt(la, 20);
        ck_assert_msg(strstr(a, "\n\n") == NULL && a[la - 1] != '\n' && a[0] != '\n', "doc %d has a blank line", i);
        total += la;
        char *copy = strdup(a);
        for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
            int r = check_arith_line(line);
            ck_assert_msg(r != 0, "doc %d: wrong arithmetic: %s", i, line);
            if (r == 1) checked++;
        }
        free(copy);
        if (strstr(a, "The end.") || strstr(a, "friend")) stories++;
        int dup = 0;
        for (int j = 0; j < distinct && !dup; j++) dup = !strcmp(seen[j], a);
        if (!dup) seen[distinct++] = strdup(a);
    }
    ck_assert_int_gt(checked, N / 2);
    ck_assert_int_gt(stories, N / 4);
    ck_assert_int_ge(distinct, N - 5);
    /* another seed, other documents */
    size_t la;
    int same = 0;
    for (int i = 0; i < 50; i++) {
        CK_CAI(cai_corpus_document(42, i, a, CAI_CORPUS_MAX_DOC, &la));
        CK_CAI(cai_corpus_document(43, i, b, CAI_CORPUS_MAX_DOC, &la));
        same += !strcmp(a, b);
    }
    ck_assert_int_lt(same, 3);
    ck_assert_int_eq(cai_corpus_document(1, 0, a, 100, &la), CAI_ERR_INVALID_ARG);
    for (int j = 0; j < distinct; j++) free(seen[j]);
    free(seen);
    free(a);
    free(b);
    printf("corpus: %d documents, mean %.0f bytes, %d arithmetic lines verified\n", N, (double)total / N, checked);
}
END_TEST

START_TEST(corpus_files_hold_the_documents) {
    enum { N = 37 };
    char pj[300], pt[300];
    path_in(pj, sizeof pj, "corpus.jsonl");
    path_in(pt, sizeof pt, "corpus.txt");
    CK_CAI(cai_corpus_write(pj, N, 5, CAI_PREPROCESS_JSONL));
    CK_CAI(cai_corpus_write(pt, N, 5, CAI_PREPROCESS_TEXT));
    char *doc = malloc(CAI_CORPUS_MAX_DOC);
    /* JSONL: parsed back with jansson */
    FILE *f = fopen(pj, "r");
    char line[8192];
    int i = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        ck_assert_ptr_nonnull(o);
        size_t len;
        CK_CAI(cai_corpus_document(5, i, doc, CAI_CORPUS_MAX_DOC, &len));
        ck_assert_str_eq(json_string_value(json_object_get(o, "text")), doc);
        json_decref(o);
        i++;
    }
    fclose(f);
    ck_assert_int_eq(i, N);
    /* text: documents separated by exactly one blank line */
    size_t n;
    unsigned char *txt = slurp(pt, &n);
    size_t at = 0;
    for (i = 0; i < N; i++) {
        size_t len;
        CK_CAI(cai_corpus_document(5, i, doc, CAI_CORPUS_MAX_DOC, &len));
        ck_assert_int_eq(memcmp(txt + at, doc, len), 0);
        at += len;
        ck_assert_int_eq(txt[at++], '\n');
        if (i + 1 < N) ck_assert_int_eq(txt[at++], '\n');
    }
    ck_assert_uint_eq(at, n);
    free(txt);
    free(doc);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("indexed");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, dtype_codes_are_megatrons);
    tcase_add_test(tc, builder_writes_the_megatron_layout);
    tcase_add_test(tc, round_trip_every_integer_dtype);
    tcase_add_test(tc, builder_refuses_what_does_not_fit);
    tcase_add_test(tc, append_equals_writing_everything_at_once);
    tcase_add_test(tc, empty_dataset_opens);
    tcase_add_test(tc, each_corruption_gets_its_own_error);
    tcase_add_test(tc, corpus_is_deterministic_varied_and_right);
    tcase_add_test(tc, corpus_files_hold_the_documents);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) { return run_suite(&argc, &argv, make_suite); }
