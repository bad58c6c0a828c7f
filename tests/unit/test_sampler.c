/* GPT sampling, blending, splits and the distributed sampler, each checked
 * against a reference computed here: samples against a plain flattened
 * token stream, split bounds against Megatron's documented examples,
 * blending against the weights at every prefix, and the sampler against
 * exact-once coverage per epoch across simulated data-parallel ranks. */
#include "cai_config.h"
#include "colossal/data.h"

#include "test_indexed_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static int is_permutation(const int64_t *a, int64_t n, int64_t lo) {
    char *seen = calloc((size_t)n + 1, 1);
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        if (a[i] < lo || a[i] >= lo + n || seen[a[i] - lo]) ok = 0;
        else seen[a[i] - lo] = 1;
    }
    free(seen);
    return ok;
}

/* ------------------------------------------------------------------ test datasets */

enum { MAXSEQ = 256, MAXLEN = 40 };
typedef struct {
    int n_docs, n_seq;
    int first[MAXSEQ + 1]; /* first sequence of each document */
    int len[MAXSEQ];
    int32_t tok[MAXSEQ][MAXLEN];
} tds;

/* Documents of 1-2 sequences, lengths 0..maxlen-1. mode 0: random ids in
 * [base, base + 100); mode 1: every token of document d is base + d. */
static void make_tds(tds *c, const char *name, int n_docs, int maxlen, uint32_t seed, int32_t base, int mode,
                     char *prefix, size_t cap) {
    memset(c, 0, sizeof *c);
    c->n_docs = n_docs;
    for (int d = 0; d < n_docs; d++) {
        c->first[d] = c->n_seq;
        const int k = 1 + (int)(lcg(&seed) % 2);
        for (int q = 0; q < k; q++) {
            const int s = c->n_seq++;
            ck_assert_int_lt(s, MAXSEQ);
            c->len[s] = (int)(lcg(&seed) % (uint32_t)maxlen);
            for (int t = 0; t < c->len[s]; t++) c->tok[s][t] = mode ? base + d : base + (int32_t)(lcg(&seed) % 100);
        }
    }
    c->first[n_docs] = c->n_seq;
    snprintf(prefix, cap, "%s/%s", g_dir, name);
    cai_indexed_builder_t *b;
    CK_CAI(cai_indexed_builder_init(&b, prefix, CAI_INDEXED_U16, 0));
    for (int d = 0; d < n_docs; d++) {
        for (int s = c->first[d]; s < c->first[d + 1]; s++) CK_CAI(cai_indexed_builder_add(b, c->tok[s], c->len[s]));
        CK_CAI(cai_indexed_builder_end_document(b));
    }
    CK_CAI(cai_indexed_builder_finish(b));
}

/* ------------------------------------------------------------------ shuffle */

START_TEST(shuffle_is_a_reproducible_uniform_permutation) {
    int64_t a[100], b[100];
    for (int i = 0; i < 100; i++) a[i] = b[i] = i;
    cai_data_shuffle(a, 100, 9, 1);
    cai_data_shuffle(b, 100, 9, 1);
    ck_assert(is_permutation(a, 100, 0));
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    for (int i = 0; i < 100; i++) b[i] = i;
    cai_data_shuffle(b, 100, 9, 2);
    ck_assert_int_ne(memcmp(a, b, sizeof a), 0);
    /* all 24 orders of 4 items, equally often (chi-square, 23 dof, p ~ 1e-4 bound) */
    int count[24] = {0};
    const int R = 24000;
    for (int r = 0; r < R; r++) {
        int64_t p[4] = {0, 1, 2, 3};
        cai_data_shuffle(p, 4, 1234, (uint64_t)r);
        const int code = (int)(p[0] * 64 + p[1] * 16 + p[2] * 4 + p[3]);
        static const int perms[24] = {27,  30,  39,  45,  54,  57,  75,  78,  99,  108, 114, 120,
                                      135, 141, 147, 156, 177, 180, 198, 201, 210, 216, 225, 228};
        int k = -1;
        for (int j = 0; j < 24; j++)
            if (perms[j] == code) k = j;
        ck_assert_int_ge(k, 0);
        count[k]++;
    }
    double chi = 0;
    for (int j = 0; j < 24; j++) chi += (count[j] - R / 24.0) * (count[j] - R / 24.0) / (R / 24.0);
    ck_assert_msg(chi < 60, "chi-square %.1f over 24 permutations", chi);
}
END_TEST

/* ------------------------------------------------------------------ split */

START_TEST(split_follows_megatron) {
    int64_t b[4];
    /* the example in Megatron's get_split_indices docstring */
    CK_CAI(cai_data_split_ranges("90,9,1", 1000, b));
    ck_assert(b[0] == 0 && b[1] == 900 && b[2] == 990 && b[3] == 1000);
    CK_CAI(cai_data_split_ranges("98,2", 100, b));
    ck_assert(b[0] == 0 && b[1] == 98 && b[2] == 100 && b[3] == 100);
    /* 10/3 rounds to 3 three times; the missing one shifts every later bound */
    CK_CAI(cai_data_split_ranges("1,1,1", 10, b));
    ck_assert(b[1] == 4 && b[2] == 7 && b[3] == 10);
    /* Python's round: 2.5 -> 2 (half to even), then shifted by the excess */
    CK_CAI(cai_data_split_ranges("1,1", 5, b));
    ck_assert(b[1] == 3 && b[2] == 5 && b[3] == 5);
    CK_CAI(cai_data_split_ranges("0.98, 0.02, 0", 5000, b));
    ck_assert(b[1] == 4900 && b[2] == 5000);
    CK_CAI(cai_data_split_ranges("100", 7, b));
    ck_assert(b[1] == 7 && b[2] == 7 && b[3] == 7);
    /* clamped where Megatron's arithmetic would go negative */
    CK_CAI(cai_data_split_ranges("0,1,1", 3, b));
    ck_assert(b[0] == 0 && b[1] >= 0 && b[1] <= b[2] && b[2] <= b[3] && b[3] == 3);
    const char *bad[] = {"", "a,b", "1,-1", "1,2,3,4", "0,0", "1;2", "nan"};
    for (size_t i = 1; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(cai_data_split_ranges(bad[i], 10, b) == CAI_ERR_CONFIG, "split \"%s\" accepted", bad[i]);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "split"));
    }
}
END_TEST

/* ------------------------------------------------------------------ blending */

START_TEST(blending_realises_the_weights_at_every_prefix) {
    const double w[3] = {5, 3, 2}; /* unnormalised on purpose */
    enum { N = 2000 };
    int16_t di[N];
    int64_t dsi[N];
    CK_CAI(cai_data_blend_indices(w, 3, N, di, dsi));
    int64_t count[3] = {0, 0, 0};
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(dsi[i], count[di[i]]); /* running index into its dataset */
        count[di[i]]++;
        for (int k = 0; k < 3; k++) {
            const double want = w[k] / 10.0 * (i + 1);
            ck_assert_msg(fabs((double)count[k] - want) <= 1.0 + 1e-9, "prefix %d dataset %d: %lld vs %.2f", i + 1, k,
                          (long long)count[k], want);
        }
    }
    ck_assert_int_eq(count[0], 1000);
    ck_assert_int_eq(count[1], 600);
    ck_assert_int_eq(count[2], 400);
    /* a zero weight is never picked; bad weights are refused */
    const double w0[2] = {0, 1};
    CK_CAI(cai_data_blend_indices(w0, 2, 50, di, dsi));
    for (int i = 0; i < 50; i++) ck_assert_int_eq(di[i], 1);
    const double wn[2] = {1, -1}, wz[2] = {0, 0};
    ck_assert_int_eq(cai_data_blend_indices(wn, 2, 5, di, dsi), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_data_blend_indices(wz, 2, 5, di, dsi), CAI_ERR_INVALID_ARG);
}
END_TEST

/* ------------------------------------------------------------------ GPT samples */

/* Every sample against the flattened stream of the document index. */
static void check_gpt_against_flat(const tds *c, const cai_gpt_dataset_t *g, int64_t T, int s0, int s1) {
    int64_t ndi, nsh;
    const int64_t *di = cai_gpt_dataset_document_index(g, &ndi);
    const int64_t *sh = cai_gpt_dataset_shuffle_index(g, &nsh);
    const int64_t nseq = s1 - s0, epochs = cai_gpt_dataset_epochs(g);
    ck_assert_int_eq(ndi, epochs * nseq);
    /* every sequence of the range exactly `epochs` times */
    int64_t *cnt = calloc((size_t)nseq, sizeof *cnt), flat_n = 0;
    for (int64_t k = 0; k < ndi; k++) {
        ck_assert(di[k] >= s0 && di[k] < s1);
        cnt[di[k] - s0]++;
        flat_n += c->len[di[k]];
    }
    for (int64_t k = 0; k < nseq; k++) ck_assert_int_eq(cnt[k], epochs);
    free(cnt);
    ck_assert_int_eq(nsh, cai_gpt_dataset_size(g));
    ck_assert(is_permutation(sh, nsh, 0));
    ck_assert_int_eq(cai_gpt_dataset_size(g), (flat_n - 1) / T);
    int32_t *flat = malloc((size_t)flat_n * sizeof *flat), *got = malloc((size_t)(T + 1) * sizeof *got);
    int64_t at = 0;
    for (int64_t k = 0; k < ndi; k++)
        for (int t = 0; t < c->len[di[k]]; t++) flat[at++] = c->tok[di[k]][t];
    for (int64_t i = 0; i < nsh; i++) {
        CK_CAI(cai_gpt_dataset_sample(g, i, got));
        ck_assert_msg(memcmp(got, flat + sh[i] * T, (size_t)(T + 1) * sizeof *got) == 0,
                      "sample %lld (window %lld) differs from the flattened stream", (long long)i, (long long)sh[i]);
    }
    free(flat);
    free(got);
}

START_TEST(gpt_samples_are_windows_of_the_shuffled_stream) {
    tds c;
    char prefix[300];
    make_tds(&c, "gpt", 40, 30, 3, 0, 0, prefix, sizeof prefix);
    cai_indexed_dataset_t *ds;
    CK_CAI(cai_indexed_open(&ds, prefix, 0));
    const int d0 = 5, d1 = 33, s0 = c.first[d0], s1 = c.first[d1];
    int64_t tpe = 0;
    for (int s = s0; s < s1; s++) tpe += c.len[s];
    const int64_t T = 16;
    /* one epoch; several epochs ending on a nearly full epoch; several
     * epochs ending on a sliver of one (separate final shuffle) */
    const int64_t asks[3] = {0, (3 * tpe - 1) / T - 1, (2 * tpe - 1) / T + 2};
    for (int a = 0; a < 3; a++) {
        cai_gpt_config cfg = {T, asks[a], 77};
        cai_gpt_dataset_t *g;
        CK_CAI(cai_gpt_dataset_init(&g, ds, d0, d1, &cfg));
        const int64_t e = cai_gpt_dataset_epochs(g);
        if (asks[a] == 0) {
            ck_assert_int_eq(e, 1);
        } else {
            /* Megatron's _get_num_epochs: the fewest epochs holding num_samples * T + 1 tokens */
            ck_assert_int_ge(e * tpe, asks[a] * T + 1);
            ck_assert_int_lt((e - 1) * tpe, asks[a] * T + 1);
            ck_assert_int_ge(cai_gpt_dataset_size(g), asks[a]);
        }
        check_gpt_against_flat(&c, g, T, s0, s1);
        /* Megatron's separate_final_epoch rule, recomputed here */
        int separate = 0;
        int64_t before = 0;
        if (e > 1) {
            before = ((e - 1) * tpe - 1) / T;
            separate = asks[a] - before < (int64_t)(0.8 * (double)((tpe - 1) / T));
        }
        ck_assert_int_eq(separate, a == 2);
        if (separate) {
            int64_t ndi, nsh;
            const int64_t *di = cai_gpt_dataset_document_index(g, &ndi);
            const int64_t *sh = cai_gpt_dataset_shuffle_index(g, &nsh);
            ck_assert(is_permutation(di + (e - 1) * (s1 - s0), s1 - s0, s0));
            ck_assert(is_permutation(sh, before, 0));
            ck_assert(is_permutation(sh + before, nsh - before, before));
        }
        /* same seed, same samples; another seed, another order */
        cai_gpt_dataset_t *g2, *g3;
        CK_CAI(cai_gpt_dataset_init(&g2, ds, d0, d1, &cfg));
        cfg.seed = 78;
        CK_CAI(cai_gpt_dataset_init(&g3, ds, d0, d1, &cfg));
        int64_t n1, n3;
        const int64_t *i1 = cai_gpt_dataset_shuffle_index(g, &n1), *i2 = cai_gpt_dataset_shuffle_index(g2, &n1);
        const int64_t *i3 = cai_gpt_dataset_shuffle_index(g3, &n3);
        ck_assert_int_eq(memcmp(i1, i2, (size_t)n1 * sizeof *i1), 0);
        ck_assert_int_ne(memcmp(i1, i3, (size_t)n1 * sizeof *i1), 0);
        int32_t x[17], y[17];
        for (int64_t i = 0; i < n1; i++) {
            CK_CAI(cai_gpt_dataset_sample(g, i, x));
            CK_CAI(cai_gpt_dataset_sample(g2, i, y));
            ck_assert_int_eq(memcmp(x, y, sizeof x), 0);
        }
        cai_gpt_dataset_free(g);
        cai_gpt_dataset_free(g2);
        cai_gpt_dataset_free(g3);
    }
    /* a batch is the samples split into inputs and shifted targets */
    cai_gpt_config cfg = {T, 0, 5};
    cai_gpt_dataset_t *g;
    CK_CAI(cai_gpt_dataset_init(&g, ds, 0, 40, &cfg));
    int64_t idx[3] = {4, 0, 7};
    int32_t in[3 * 16], tg[3 * 16], s[17];
    CK_CAI(cai_gpt_dataset_batch(g, idx, 3, in, tg));
    for (int b = 0; b < 3; b++) {
        CK_CAI(cai_gpt_dataset_sample(g, idx[b], s));
        ck_assert_int_eq(memcmp(in + 16 * b, s, 16 * sizeof *s), 0);
        ck_assert_int_eq(memcmp(tg + 16 * b, s + 1, 16 * sizeof *s), 0);
    }
    ck_assert_int_eq(cai_gpt_dataset_sample(g, cai_gpt_dataset_size(g), s), CAI_ERR_INVALID_ARG);
    cai_gpt_dataset_free(g);
    /* too few tokens for one sample */
    cfg.seq_len = 100000;
    ck_assert_int_eq(cai_gpt_dataset_init(&g, ds, 0, 40, &cfg), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "too few"));
    cfg.seq_len = 4;
    ck_assert_int_eq(cai_gpt_dataset_init(&g, ds, 3, 3, &cfg), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_gpt_dataset_init(&g, ds, 0, 41, &cfg), CAI_ERR_INVALID_ARG);
    cai_indexed_free(ds);
}
END_TEST

START_TEST(blend_takes_each_part_at_its_weight) {
    tds a, b;
    char pa[300], pb[300];
    make_tds(&a, "blend_a", 30, 25, 8, 0, 0, pa, sizeof pa);
    make_tds(&b, "blend_b", 30, 25, 9, 1000, 0, pb, sizeof pb);
    cai_indexed_dataset_t *ds[2];
    CK_CAI(cai_indexed_open(&ds[0], pa, 0));
    CK_CAI(cai_indexed_open(&ds[1], pb, 0));
    const int64_t ranges[4] = {0, 30, 2, 28};
    const double w[2] = {0.7, 0.3};
    cai_gpt_config cfg = {12, 1000, 21};
    cai_gpt_dataset_t *g;
    CK_CAI(cai_gpt_blend_init(&g, 2, (const cai_indexed_dataset_t *const *)ds, ranges, w, &cfg));
    ck_assert_int_eq(cai_gpt_dataset_size(g), 1000);
    ck_assert_ptr_null(cai_gpt_dataset_document_index(g, NULL));
    int64_t n_from[2] = {0, 0};
    for (int64_t i = 0; i < 1000; i++) {
        int part;
        int64_t ps;
        CK_CAI(cai_gpt_dataset_source(g, i, &part, &ps));
        n_from[part]++;
    }
    ck_assert(llabs(n_from[0] - 700) <= 1 && llabs(n_from[1] - 300) <= 1);
    /* part i is a plain GPT dataset of exactly its share, seeded seed + i */
    cai_gpt_dataset_t *p[2];
    for (int k = 0; k < 2; k++) {
        cai_gpt_config pc = {12, n_from[k], 21 + (uint64_t)k};
        CK_CAI(cai_gpt_dataset_init(&p[k], ds[k], ranges[2 * k], ranges[2 * k + 1], &pc));
    }
    for (int64_t i = 0; i < 1000; i++) {
        int part;
        int64_t ps;
        int32_t x[13], y[13];
        CK_CAI(cai_gpt_dataset_source(g, i, &part, &ps));
        CK_CAI(cai_gpt_dataset_sample(g, i, x));
        CK_CAI(cai_gpt_dataset_sample(p[part], ps, y));
        ck_assert_int_eq(memcmp(x, y, sizeof x), 0);
        for (int t = 0; t < 13; t++) ck_assert(part == 0 ? x[t] < 100 : x[t] >= 1000);
    }
    cai_gpt_dataset_free(p[0]);
    cai_gpt_dataset_free(p[1]);
    cai_gpt_dataset_free(g);
    cfg.num_samples = 0;
    ck_assert_int_eq(cai_gpt_blend_init(&g, 2, (const cai_indexed_dataset_t *const *)ds, ranges, w, &cfg),
                     CAI_ERR_INVALID_ARG);
    cai_indexed_free(ds[0]);
    cai_indexed_free(ds[1]);
}
END_TEST

/* Tokens name their document, so each split's samples show which
 * documents they came from. */
START_TEST(data_path_and_split_keep_documents_apart) {
    tds a, b;
    char pa[300], pb[300];
    make_tds(&a, "split_a", 50, 20, 4, 0, 1, pa, sizeof pa);
    make_tds(&b, "split_b", 60, 20, 5, 1000, 1, pb, sizeof pb);
    cai_gpt_data_config cfg = {pa, "80,20,0", 8, 3, 2000, {0, 0, 0}};
    cai_gpt_data_t *d;
    CK_CAI(cai_gpt_data_init(&d, &cfg));
    ck_assert_ptr_null(cai_gpt_data_get(d, CAI_SPLIT_TEST));
    for (int s = 0; s < 2; s++) {
        cai_gpt_dataset_t *g = cai_gpt_data_get(d, (cai_split)s);
        ck_assert_ptr_nonnull(g);
        for (int64_t i = 0; i < cai_gpt_dataset_size(g); i++) {
            int32_t x[9];
            CK_CAI(cai_gpt_dataset_sample(g, i, x));
            for (int t = 0; t < 9; t++) ck_assert(s == 0 ? x[t] < 40 : (x[t] >= 40 && x[t] < 50));
        }
    }
    cai_gpt_data_free(d);

    char blend[700];
    snprintf(blend, sizeof blend, "0.25 %s, 0.75 %s", pa, pb);
    cai_gpt_data_config bc = {blend, "90,10", 8, 3, 2000, {400, 100, 0}};
    CK_CAI(cai_gpt_data_init(&d, &bc));
    const int64_t want[2] = {400, 100};
    const int bound_a[3] = {0, 45, 50}, bound_b[3] = {0, 54, 60};
    for (int s = 0; s < 2; s++) {
        cai_gpt_dataset_t *g = cai_gpt_data_get(d, (cai_split)s);
        ck_assert_int_eq(cai_gpt_dataset_size(g), want[s]);
        int64_t from_b = 0;
        for (int64_t i = 0; i < want[s]; i++) {
            int32_t x[9];
            CK_CAI(cai_gpt_dataset_sample(g, i, x));
            const int is_b = x[0] >= 1000;
            from_b += is_b;
            for (int t = 0; t < 9; t++) {
                const int doc = is_b ? x[t] - 1000 : x[t];
                const int *bd = is_b ? bound_b : bound_a;
                ck_assert(doc >= bd[s] && doc < bd[s + 1]);
            }
        }
        ck_assert(llabs(from_b - (int64_t)(0.75 * (double)want[s])) <= 1);
    }
    cai_gpt_data_free(d);

    /* errors name what is wrong */
    cai_gpt_data_config e1 = {"0.5 only_a_weight 0.5", "1", 8, 1, 0, {10, 0, 0}};
    ck_assert_int_eq(cai_gpt_data_init(&d, &e1), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "pairs"));
    snprintf(blend, sizeof blend, "x %s y %s", pa, pb);
    cai_gpt_data_config e2 = {blend, "1", 8, 1, 0, {10, 0, 0}};
    ck_assert_int_eq(cai_gpt_data_init(&d, &e2), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "\"x\" is not a weight"));
    snprintf(blend, sizeof blend, "1 %s 1 %s", pa, pb);
    cai_gpt_data_config e3 = {blend, "1", 8, 1, 0, {0, 0, 0}};
    ck_assert_int_eq(cai_gpt_data_init(&d, &e3), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "sample count"));
    cai_gpt_data_config e4 = {pa, "1", 8, 1, 40, {0, 0, 0}};
    ck_assert_int_eq(cai_gpt_data_init(&d, &e4), CAI_ERR_FORMAT); /* token 49 >= vocab 40 */
}
END_TEST

/* ------------------------------------------------------------------ distributed sampler */

/* Positions [from, from + steps*G) read back from dp simulated ranks. */
static int64_t *run_ranks(int64_t N, int64_t G, int dp, int shuffle, uint64_t seed, int64_t consumed, int steps) {
    int64_t *out = malloc((size_t)(steps * G) * sizeof *out);
    const int64_t local = G / dp;
    for (int r = 0; r < dp; r++) {
        cai_sampler_config sc = {N, G, dp, r, shuffle, seed};
        cai_sampler_t *s;
        CK_CAI(cai_sampler_init(&s, &sc, consumed));
        ck_assert_int_eq(cai_sampler_local_batch(s), local);
        for (int k = 0; k < steps; k++) {
            CK_CAI(cai_sampler_next(s, out + k * G + r * local));
            ck_assert_int_eq(cai_sampler_consumed(s), consumed + (k + 1) * G);
        }
        cai_sampler_free(s);
    }
    return out;
}

START_TEST(sampler_covers_every_sample_once_per_epoch) {
    const int64_t N = 103, G = 12;
    const int dp = 3, steps = 30; /* 360 positions: 3 full epochs and a part */
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        int64_t *all = run_ranks(N, G, dp, shuffle, 5, 0, steps);
        for (int e = 0; e < 3; e++) {
            ck_assert_msg(is_permutation(all + e * N, N, 0), "epoch %d is not a permutation (shuffle %d)", e, shuffle);
            if (!shuffle)
                for (int64_t i = 0; i < N; i++) ck_assert_int_eq(all[e * N + i], i);
        }
        if (shuffle) /* epochs are shuffled differently */
            ck_assert_int_ne(memcmp(all, all + N, (size_t)N * sizeof *all), 0);
        /* the same seed on another dp layout reads the same global stream */
        int64_t *other = run_ranks(N, G, shuffle ? 4 : 2, shuffle, 5, 0, steps);
        ck_assert_int_eq(memcmp(all, other, (size_t)(steps * G) * sizeof *all), 0);
        free(other);
        /* resuming from any consumed count continues the same stream */
        const int64_t resume[3] = {5 * G, 7, 2 * N + 1};
        for (int k = 0; k < 3; k++) {
            const int more = 8;
            int64_t *tail = run_ranks(N, G, dp, shuffle, 5, resume[k], more);
            int64_t *ref = run_ranks(N, G, 1, shuffle, 5, 0, (int)((resume[k] + more * G) / G) + 1);
            ck_assert_int_eq(memcmp(tail, ref + resume[k], (size_t)(more * G) * sizeof *tail), 0);
            free(tail);
            free(ref);
        }
        free(all);
    }
    int64_t *a = run_ranks(N, G, dp, 1, 5, 0, 9), *b = run_ranks(N, G, dp, 1, 6, 0, 9);
    ck_assert_int_ne(memcmp(a, b, (size_t)(9 * G) * sizeof *a), 0);
    free(a);
    free(b);
    cai_sampler_t *s;
    cai_sampler_config bad = {N, 10, 3, 0, 0, 0};
    ck_assert_int_eq(cai_sampler_init(&s, &bad, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "multiple"));
    cai_sampler_config bad2 = {N, 12, 3, 3, 0, 0};
    ck_assert_int_eq(cai_sampler_init(&s, &bad2, 0), CAI_ERR_INVALID_ARG);
    cai_sampler_config bad3 = {0, 12, 3, 0, 0, 0};
    ck_assert_int_eq(cai_sampler_init(&s, &bad3, 0), CAI_ERR_INVALID_ARG);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, shuffle_is_a_reproducible_uniform_permutation);
    tcase_add_test(tc, split_follows_megatron);
    tcase_add_test(tc, blending_realises_the_weights_at_every_prefix);
    tcase_add_test(tc, gpt_samples_are_windows_of_the_shuffled_stream);
    tcase_add_test(tc, blend_takes_each_part_at_its_weight);
    tcase_add_test(tc, data_path_and_split_keep_documents_apart);
    tcase_add_test(tc, sampler_covers_every_sample_once_per_epoch);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) { return run_suite(&argc, &argv, make_suite); }
