/* Parallel preprocessing under mpiexec (3 ranks): the output is
 * byte-identical on 1, 2 and 3 ranks, for text and JSONL, one file or
 * several; every document holds exactly its bytes plus the end-of-document
 * token (or exactly its BPE encoding plus the eod id); hand-made text
 * files split where the format says; and an error in one rank's slice
 * stops every rank with the failing file and line named. */
#include "cai_config.h"
#include "colossal/data.h"

#include "../unit/test_indexed_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NDOCS = 300, SEED = 11 };

static int same_files(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static int same_dataset(const char *pa, const char *pb) {
    char a[400], b[400];
    snprintf(a, sizeof a, "%s.bin", pa);
    snprintf(b, sizeof b, "%s.bin", pb);
    if (!same_files(a, b)) return 0;
    snprintf(a, sizeof a, "%s.idx", pa);
    snprintf(b, sizeof b, "%s.idx", pb);
    return same_files(a, b);
}

/* Preprocess on the first `k` ranks of the world (the others wait). */
static cai_status run_on(int k, const char *const *inputs, int n, cai_preprocess_format fmt, const char *out,
                         cai_preprocess_stats *stats) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, g_rank < k ? 0 : MPI_UNDEFINED, g_rank, &sub);
    cai_status st = CAI_OK;
    if (sub != MPI_COMM_NULL) {
        cai_preprocess_config cfg = {inputs,       n, fmt, "text", out, cai_byte_tokenize, NULL, CAI_BYTE_VOCAB,
                                     CAI_BYTE_EOD, 0};
        st = cai_preprocess(&cfg, sub, stats);
        MPI_Comm_free(&sub);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return st;
}

static void setup_inputs(void) {
    if (g_rank == 0) {
        char p[300];
        path_in(p, sizeof p, "corpus.jsonl");
        CK_CAI(cai_corpus_write(p, NDOCS, SEED, CAI_PREPROCESS_JSONL));
        path_in(p, sizeof p, "corpus.txt");
        CK_CAI(cai_corpus_write(p, NDOCS, SEED, CAI_PREPROCESS_TEXT));
        /* the same JSONL cut into three files, one of them empty */
        size_t n;
        path_in(p, sizeof p, "corpus.jsonl");
        unsigned char *all = slurp(p, &n);
        size_t cut = 0;
        for (int lines = 0; lines < 100; cut++)
            if (all[cut] == '\n') lines++;
        path_in(p, sizeof p, "part1.jsonl");
        spit(p, all, cut);
        path_in(p, sizeof p, "part2.jsonl");
        spit(p, "", 0);
        path_in(p, sizeof p, "part3.jsonl");
        spit(p, all + cut, n - cut);
        free(all);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

START_TEST(output_does_not_depend_on_the_rank_count) {
    setup_inputs();
    char jsonl[300], txt[300], p1[300], p2[300], p3[300];
    path_in(jsonl, sizeof jsonl, "corpus.jsonl");
    path_in(txt, sizeof txt, "corpus.txt");
    const char *in_j[1] = {jsonl}, *in_t[1] = {txt};
    char outs[3][300];
    cai_preprocess_stats stats[3];
    for (int k = 1; k <= 3; k++) {
        snprintf(outs[k - 1], sizeof outs[k - 1], "%s/json_np%d", g_dir, k);
        CK_CAI(run_on(k, in_j, 1, CAI_PREPROCESS_JSONL, outs[k - 1], &stats[k - 1]));
    }
    path_in(p1, sizeof p1, "text_np1");
    path_in(p3, sizeof p3, "text_np3");
    CK_CAI(run_on(1, in_t, 1, CAI_PREPROCESS_TEXT, p1, NULL));
    CK_CAI(run_on(3, in_t, 1, CAI_PREPROCESS_TEXT, p3, NULL));
    char f1[300], f2[300], f3[300];
    path_in(f1, sizeof f1, "part1.jsonl");
    path_in(f2, sizeof f2, "part2.jsonl");
    path_in(f3, sizeof f3, "part3.jsonl");
    const char *parts[3] = {f1, f2, f3};
    path_in(p2, sizeof p2, "parts_np3");
    CK_CAI(run_on(3, parts, 3, CAI_PREPROCESS_JSONL, p2, NULL));
    if (g_rank == 0) {
        ck_assert_msg(same_dataset(outs[0], outs[1]), "JSONL: 1 rank and 2 ranks differ");
        ck_assert_msg(same_dataset(outs[0], outs[2]), "JSONL: 1 rank and 3 ranks differ");
        ck_assert_msg(same_dataset(p1, p3), "text: 1 rank and 3 ranks differ");
        ck_assert_msg(same_dataset(outs[0], p1), "the text and JSONL forms of one corpus differ");
        ck_assert_msg(same_dataset(outs[0], p2), "three input files differ from one");
        /* no partial or temporary files are left behind */
        DIR *d = opendir(g_dir);
        struct dirent *e;
        while ((e = readdir(d)))
            ck_assert_msg(!strstr(e->d_name, ".part-") && !strstr(e->d_name, ".tmp"), "left behind: %s", e->d_name);
        closedir(d);
    }
    /* stats are global and identical on every rank of the run */
    size_t in_bytes;
    free(slurp(jsonl, &in_bytes));
    ck_assert_int_eq(stats[2].documents, NDOCS);
    ck_assert_int_eq(stats[2].input_bytes, (int64_t)in_bytes);
    int64_t tokens = 0;
    char *doc = malloc(CAI_CORPUS_MAX_DOC);
    for (int i = 0; i < NDOCS; i++) {
        size_t len;
        CK_CAI(cai_corpus_document(SEED, i, doc, CAI_CORPUS_MAX_DOC, &len));
        tokens += (int64_t)len + 1;
    }
    free(doc);
    ck_assert_int_eq(stats[2].tokens, tokens);
    if (g_rank < 2) ck_assert_int_eq(stats[1].tokens, tokens);
    MPI_Barrier(MPI_COMM_WORLD);
}
END_TEST

/* Each document: its bytes, then the end-of-document token. */
START_TEST(documents_hold_their_bytes_and_eod) {
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s/json_np3", g_dir);
    cai_indexed_dataset_t *ds;
    CK_CAI(cai_indexed_open(&ds, prefix, CAI_BYTE_VOCAB));
    ck_assert_int_eq(cai_indexed_get_dtype(ds), CAI_INDEXED_U16);
    ck_assert_int_eq(cai_indexed_num_documents(ds), NDOCS);
    ck_assert_int_eq(cai_indexed_num_sequences(ds), NDOCS);
    char *doc = malloc(CAI_CORPUS_MAX_DOC);
    int32_t *tok = malloc((CAI_CORPUS_MAX_DOC + 1) * sizeof *tok);
    int64_t total = 0;
    for (int i = 0; i < NDOCS; i++) {
        size_t len;
        CK_CAI(cai_corpus_document(SEED, i, doc, CAI_CORPUS_MAX_DOC, &len));
        ck_assert_int_eq(cai_indexed_document_start(ds, i), i);
        ck_assert_int_eq(cai_indexed_sequence_length(ds, i), (int32_t)len + 1);
        CK_CAI(cai_indexed_read(ds, i, 0, (int64_t)len + 1, tok));
        for (size_t t = 0; t < len; t++) ck_assert_int_eq(tok[t], (unsigned char)doc[t]);
        ck_assert_int_eq(tok[len], CAI_BYTE_EOD);
        total += (int64_t)len + 1;
    }
    ck_assert_int_eq(cai_indexed_num_tokens(ds), total);
    free(doc);
    free(tok);
    cai_indexed_free(ds);
    MPI_Barrier(MPI_COMM_WORLD);
}
END_TEST

/* Blank lines (also whitespace-only and CRLF ones) separate documents,
 * leading and repeated ones included; the cut points of 3 ranks fall inside
 * these few bytes. */
START_TEST(text_documents_split_at_blank_lines) {
    static const char text[] = "\n\n  \nfirst doc\nstill first\n\n\n\t \nsecond\r\n \r\nthird a\nthird b\r\n\nx\n\n";
    static const char *const want[] = {"first doc\nstill first", "second", "third a\nthird b", "x"};
    char in[300], out[300];
    path_in(in, sizeof in, "blank.txt");
    if (g_rank == 0) spit(in, text, sizeof text - 1);
    MPI_Barrier(MPI_COMM_WORLD);
    const char *inputs[1] = {in};
    for (int k = 1; k <= 3; k++) {
        snprintf(out, sizeof out, "%s/blank_np%d", g_dir, k);
        CK_CAI(run_on(k, inputs, 1, CAI_PREPROCESS_TEXT, out, NULL));
        cai_indexed_dataset_t *ds;
        CK_CAI(cai_indexed_open(&ds, out, 0));
        ck_assert_int_eq(cai_indexed_num_documents(ds), 4);
        for (int d = 0; d < 4; d++) {
            int32_t tok[64];
            const int n = (int)strlen(want[d]);
            ck_assert_int_eq(cai_indexed_sequence_length(ds, d), n + 1);
            CK_CAI(cai_indexed_read(ds, d, 0, n + 1, tok));
            for (int t = 0; t < n; t++) ck_assert_int_eq(tok[t], (unsigned char)want[d][t]);
        }
        cai_indexed_free(ds);
    }
    /* fewer documents than ranks, and no documents at all */
    path_in(in, sizeof in, "one.jsonl");
    if (g_rank == 0) spit(in, "{\"text\": \"a\"}\n", 14);
    MPI_Barrier(MPI_COMM_WORLD);
    path_in(out, sizeof out, "one");
    CK_CAI(run_on(3, inputs, 1, CAI_PREPROCESS_JSONL, out, NULL));
    cai_indexed_dataset_t *ds;
    CK_CAI(cai_indexed_open(&ds, out, 0));
    ck_assert_int_eq(cai_indexed_num_documents(ds), 1);
    ck_assert_int_eq(cai_indexed_num_tokens(ds), 2);
    cai_indexed_free(ds);
    path_in(in, sizeof in, "none.jsonl");
    if (g_rank == 0) spit(in, "\n  \n", 4);
    MPI_Barrier(MPI_COMM_WORLD);
    path_in(out, sizeof out, "none");
    CK_CAI(run_on(3, inputs, 1, CAI_PREPROCESS_JSONL, out, NULL));
    CK_CAI(cai_indexed_open(&ds, out, 0));
    ck_assert_int_eq(cai_indexed_num_documents(ds), 0);
    cai_indexed_free(ds);
    MPI_Barrier(MPI_COMM_WORLD);
}
END_TEST

static cai_status bpe_tok(void *ctx, const char *text, size_t len, cai_token_buf *out) {
    return cai_bpe_encode_ordinary((cai_bpe_t *)ctx, text, len, out);
}

/* The library's BPE through the tokenizer callback: each document is
 * exactly cai_bpe_encode_ordinary of its text plus the special eod, and
 * the output still does not depend on the rank count. */
START_TEST(bpe_tokenization_matches_the_tokenizer) {
    enum { TRAIN = 200 };
    char **texts = malloc(TRAIN * sizeof *texts);
    for (int i = 0; i < TRAIN; i++) {
        size_t len;
        texts[i] = malloc(CAI_CORPUS_MAX_DOC);
        CK_CAI(cai_corpus_document(SEED, i, texts[i], CAI_CORPUS_MAX_DOC, &len));
    }
    const char *special[1] = {"<|endoftext|>"};
    cai_bpe_train_opts opts = {400, special, 1, 2};
    cai_bpe_t *bpe;
    CK_CAI(cai_bpe_train((const char *const *)texts, NULL, TRAIN, &opts, &bpe));
    for (int i = 0; i < TRAIN; i++) free(texts[i]);
    free(texts);
    int32_t eod;
    CK_CAI(cai_bpe_token_id(bpe, "<|endoftext|>", &eod));
    char in[300], out[2][300];
    path_in(in, sizeof in, "corpus.jsonl");
    const char *inputs[1] = {in};
    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof out[k], "%s/bpe_np%d", g_dir, k ? g_size : 1);
        MPI_Comm sub;
        MPI_Comm_split(MPI_COMM_WORLD, k || g_rank == 0 ? 0 : MPI_UNDEFINED, g_rank, &sub);
        if (sub != MPI_COMM_NULL) {
            cai_preprocess_config cfg = {inputs,  1,   CAI_PREPROCESS_JSONL,    NULL, out[k],
                                         bpe_tok, bpe, cai_bpe_vocab_size(bpe), eod,  0};
            CK_CAI(cai_preprocess(&cfg, sub, NULL));
            MPI_Comm_free(&sub);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    if (g_rank == 0) {
        ck_assert_msg(same_dataset(out[0], out[1]), "BPE: 1 rank and %d ranks differ", g_size);
        cai_indexed_dataset_t *ds;
        CK_CAI(cai_indexed_open(&ds, out[1], cai_bpe_vocab_size(bpe)));
        ck_assert_int_eq(cai_indexed_num_documents(ds), NDOCS);
        char *doc = malloc(CAI_CORPUS_MAX_DOC);
        int32_t *got = malloc((CAI_CORPUS_MAX_DOC + 1) * sizeof *got);
        int64_t bytes = 0;
        for (int i = 0; i < NDOCS; i++) {
            size_t len;
            cai_token_buf want = {0};
            CK_CAI(cai_corpus_document(SEED, i, doc, CAI_CORPUS_MAX_DOC, &len));
            CK_CAI(cai_bpe_encode_ordinary(bpe, doc, len, &want));
            ck_assert_int_eq(cai_indexed_sequence_length(ds, i), (int32_t)want.len + 1);
            CK_CAI(cai_indexed_read(ds, i, 0, (int64_t)want.len + 1, got));
            ck_assert_int_eq(memcmp(got, want.ids, want.len * sizeof *got), 0);
            ck_assert_int_eq(got[want.len], eod);
            bytes += (int64_t)len;
            cai_token_buf_free(&want);
        }
        ck_assert_int_lt(cai_indexed_num_tokens(ds), bytes * 3 / 4); /* 400 tokens already compress */
        free(doc);
        free(got);
        cai_indexed_free(ds);
    }
    cai_bpe_free(bpe);
    MPI_Barrier(MPI_COMM_WORLD);
}
END_TEST

/* A bad line near the end lies in the last rank's slice: every rank
 * returns an error, the failing one names file and line, nothing is left. */
START_TEST(a_bad_line_stops_every_rank) {
    static const struct {
        const char *line, *needle;
    } k[] = {{"{\"text\": \"unterminated}", "not valid JSON"},
             {"{\"body\": \"no text key\"}", "no \"text\" key"},
             {"{\"text\": 42}", "\"text\" is not a string"},
             {"[\"an array\"]", "must be an object"}};
    char in[300], out[300], src[300];
    path_in(src, sizeof src, "corpus.jsonl");
    path_in(in, sizeof in, "bad.jsonl");
    path_in(out, sizeof out, "bad_out");
    const char *inputs[1] = {in};
    for (size_t c = 0; c < sizeof k / sizeof k[0]; c++) {
        if (g_rank == 0) {
            /* corpus lines 1..NDOCS with line NDOCS-2 replaced */
            size_t n;
            unsigned char *all = slurp(src, &n);
            FILE *f = fopen(in, "wb");
            int line = 1;
            for (size_t i = 0, start = 0; i < n; i++)
                if (all[i] == '\n') {
                    if (line == NDOCS - 2) fprintf(f, "%s\n", k[c].line);
                    else fwrite(all + start, 1, i + 1 - start, f);
                    start = i + 1;
                    line++;
                }
            fclose(f);
            free(all);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        cai_error_clear();
        cai_status st = run_on(g_size, inputs, 1, CAI_PREPROCESS_JSONL, out, NULL);
        ck_assert_int_eq(st, CAI_ERR_FORMAT);
        char where[400];
        snprintf(where, sizeof where, "bad.jsonl:%d:", NDOCS - 2);
        /* every rank carries the cause; the others also name the rank */
        ck_assert_msg(strstr(cai_error_message(), where) != NULL, "%s", cai_error_message());
        ck_assert_msg(strstr(cai_error_message(), k[c].needle) != NULL, "%s", cai_error_message());
        char who[32];
        snprintf(who, sizeof who, "rank %d failed", g_size - 1);
        ck_assert_msg((strstr(cai_error_message(), who) != NULL) == (g_rank != g_size - 1), "%s", cai_error_message());
        if (g_rank == 0) {
            DIR *d = opendir(g_dir);
            struct dirent *e;
            while ((e = readdir(d))) ck_assert_msg(strncmp(e->d_name, "bad_out", 7) != 0, "left behind: %s", e->d_name);
            closedir(d);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    /* a missing input fails on every rank alike */
    path_in(in, sizeof in, "no_such_input.jsonl");
    ck_assert_int_eq(run_on(g_size, inputs, 1, CAI_PREPROCESS_JSONL, out, NULL), CAI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "no_such_input.jsonl"));
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("preprocess");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, output_does_not_depend_on_the_rank_count);
    tcase_add_test(tc, documents_hold_their_bytes_and_eod);
    tcase_add_test(tc, text_documents_split_at_blank_lines);
    tcase_add_test(tc, bpe_tokenization_matches_the_tokenizer);
    tcase_add_test(tc, a_bad_line_stops_every_rank);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) { return run_suite(&argc, &argv, make_suite); }
