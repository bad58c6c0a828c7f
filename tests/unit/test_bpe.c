/* Byte-level BPE: pre-tokenisation, tokenizer.json / vocab.json + merges.txt
 * loading and errors, special tokens, round trips, training and saving.
 * GPT-2's real vocabulary is exercised in test_bpe_gpt2.c. */
#include "cai_config.h"
#include "colossal/data.h"
#include "data/bpe_internal.h"

#include <check.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_tmp[512];
static char g_fixture[1024];

/* ------------------------------------------------------------ helpers */

static cai_bpe_t *load_tiny(void) {
    cai_bpe_t *t = NULL;
    ck_assert_msg(cai_bpe_load_hf(g_fixture, &t) == CAI_OK, "%s", cai_error_message());
    return t;
}

static void expect_ids(cai_bpe_t *t, const char *text, const int32_t *want, size_t n) {
    cai_token_buf ids = {0};
    ck_assert_msg(cai_bpe_encode(t, text, strlen(text), &ids) == CAI_OK, "%s", cai_error_message());
    ck_assert_msg(ids.len == n, "\"%s\": %zu ids, want %zu", text, ids.len, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(ids.ids[i] == want[i], "\"%s\": id %zu is %d, want %d", text, i, ids.ids[i], want[i]);
    cai_byte_buf back = {0};
    ck_assert_int_eq(cai_bpe_decode(t, ids.ids, ids.len, &back), CAI_OK);
    ck_assert_uint_eq(back.len, strlen(text));
    ck_assert(memcmp(back.data, text, back.len) == 0);
    cai_byte_buf_free(&back);
    cai_token_buf_free(&ids);
}

static void check_roundtrip(cai_bpe_t *t, const char *s, size_t n) {
    cai_token_buf ids = {0};
    cai_byte_buf back = {0};
    ck_assert_msg(cai_bpe_encode(t, s, n, &ids) == CAI_OK, "%s", cai_error_message());
    ck_assert_int_eq(cai_bpe_decode(t, ids.ids, ids.len, &back), CAI_OK);
    ck_assert_uint_eq(back.len, n);
    ck_assert(n == 0 || memcmp(back.data, s, n) == 0);
    cai_byte_buf_free(&back);
    cai_token_buf_free(&ids);
}

static void write_file(const char *name, const char *text, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

/* The fixture with `from` replaced by `to` (first occurrence), as a file. */
static void fixture_variant(const char *from, const char *to, char *path, size_t cap) {
    char *s = read_text(g_fixture);
    char *at = strstr(s, from);
    ck_assert_ptr_nonnull(at);
    size_t n = strlen(s) + strlen(to) + 1;
    char *o = malloc(n);
    snprintf(o, n, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    write_file("variant.json", o, path, cap);
    free(o);
    free(s);
}

static uint32_t rnd(uint64_t stream, uint64_t i, uint32_t n) {
    return (uint32_t)(cai_rng_uniform(99, stream, i) * (float)n) % n;
}

/* ------------------------------------------------------------ pre-tokenisation */

static void expect_split(const char *text, const char *const *want, size_t n) {
    const uint8_t *s = (const uint8_t *)text;
    size_t len = strlen(text), i = 0, k = 0;
    while (i < len) {
        size_t e = cai_bpe_pretoken_end(s, len, i);
        ck_assert_msg(k < n, "\"%s\": extra piece \"%.*s\"", text, (int)(e - i), text + i);
        ck_assert_msg(e - i == strlen(want[k]) && memcmp(text + i, want[k], e - i) == 0,
                      "\"%s\": piece %zu is \"%.*s\", want \"%s\"", text, k, (int)(e - i), text + i, want[k]);
        i = e;
        k++;
    }
    ck_assert_uint_eq(k, n);
}

START_TEST(pretokenizer_follows_gpt2_pattern) {
    /* Expected splits from GPT-2's pattern run by Python's `regex` module. */
    expect_split("Hello world's  \n\n x 123abc   ",
                 (const char *[]){"Hello", " world", "'s", "  \n\n", " x", " 123", "abc", "   "}, 8);
    expect_split("I'm can'T we'LL 'll'd",
                 (const char *[]){"I", "'m", " can", "'", "T", " we", "'", "LL", " '", "ll", "'d"}, 11);
    expect_split(
        " \xc2\xa0"
        "a\xe3\x80\x80\xe3\x80\x80"
        "b\t\n",
        (const char *[]){" ", "\xc2\xa0", "a", "\xe3\x80\x80", "\xe3\x80\x80", "b", "\t\n"}, 7);
    expect_split("a\n\nb", (const char *[]){"a", "\n", "\n", "b"}, 4);
    expect_split("?\?!! ...'s", (const char *[]){"?\?!!", " ...'", "s"}, 3);
    /* e + combining acute (a mark, not a letter); Arabic-Indic digits; vulgar
     * fraction and Roman numeral (numbers); emoji (neither). */
    expect_split("e\xcc\x81t\xc3\xa9 \xd9\xa1\xd9\xa2 \xc2\xbd\xe2\x85\xa3x",
                 (const char *[]){"e", "\xcc\x81", "t\xc3\xa9", " \xd9\xa1\xd9\xa2", " \xc2\xbd\xe2\x85\xa3", "x"}, 6);
    expect_split(" \xf0\x9f\x99\x82\xf0\x9f\x99\x82 a", (const char *[]){" \xf0\x9f\x99\x82\xf0\x9f\x99\x82", " a"}, 2);
    expect_split("\r\n\r\n", (const char *[]){"\r\n\r\n"}, 1);
    expect_split("x  ", (const char *[]){"x", "  "}, 2);
    /* Invalid bytes are punctuation-like characters, one byte each. */
    expect_split("ab\xff\xfe cd \xc3", (const char *[]){"ab", "\xff\xfe", " cd", " \xc3"}, 4);
    expect_split(
        "\xe2\x82"
        "A",
        (const char *[]){"\xe2\x82", "A"}, 2);
}
END_TEST

START_TEST(unicode_classes_and_byte_map) {
    ck_assert_int_eq(cai_bpe_codepoint_class(0xE9), BPE_CLASS_LETTER);   /* é */
    ck_assert_int_eq(cai_bpe_codepoint_class(0x65E5), BPE_CLASS_LETTER); /* 日 */
    ck_assert_int_eq(cai_bpe_codepoint_class(0x0661), BPE_CLASS_NUMBER); /* Arabic-Indic 1 */
    ck_assert_int_eq(cai_bpe_codepoint_class(0x2163), BPE_CLASS_NUMBER); /* Roman numeral four (Nl) */
    ck_assert_int_eq(cai_bpe_codepoint_class(0x00BD), BPE_CLASS_NUMBER); /* ½ (No) */
    ck_assert_int_eq(cai_bpe_codepoint_class(0x00A0), BPE_CLASS_SPACE);
    ck_assert_int_eq(cai_bpe_codepoint_class(0x0085), BPE_CLASS_SPACE);
    ck_assert_int_eq(cai_bpe_codepoint_class(0x3000), BPE_CLASS_SPACE);
    ck_assert_int_eq(cai_bpe_codepoint_class(0x200B), BPE_CLASS_OTHER);  /* zero width space: Cf */
    ck_assert_int_eq(cai_bpe_codepoint_class(0x0301), BPE_CLASS_OTHER);  /* combining acute: Mn */
    ck_assert_int_eq(cai_bpe_codepoint_class(0x1F642), BPE_CLASS_OTHER); /* emoji */
    ck_assert_int_eq(cai_bpe_codepoint_class(0x10FFFF), BPE_CLASS_OTHER);
    ck_assert_int_eq(cai_bpe_codepoint_class(0x1D7CE), BPE_CLASS_NUMBER); /* mathematical bold digit zero */
    /* GPT-2's printable stand-ins: space is U+0120, newline U+010A, soft hyphen U+0143. */
    ck_assert_uint_eq(cai_bpe_byte_to_char(' '), 0x120);
    ck_assert_uint_eq(cai_bpe_byte_to_char('\n'), 0x10A);
    ck_assert_uint_eq(cai_bpe_byte_to_char(0xAD), 0x143);
    ck_assert_uint_eq(cai_bpe_byte_to_char('A'), 'A');
    int seen[324] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t c = cai_bpe_byte_to_char((uint8_t)b);
        ck_assert_uint_lt(c, 324);
        ck_assert_int_eq(seen[c]++, 0);
        ck_assert_int_eq(cai_bpe_char_to_byte(c), b);
    }
    ck_assert_int_eq(cai_bpe_char_to_byte(' '), -1);
    ck_assert_int_eq(cai_bpe_char_to_byte(324), -1);
}
END_TEST

/* ------------------------------------------------------------ loading */

/* Fixture ids: bytes 0..255 in GPT-2's order ('t' = 83, 'Ġ' = 220), then one
 * per merge: Ġt 256, he 257, Ġthe 258, lo 259, low 260, er 261, lower 262,
 * Ġlow 263, Ġlower 264, 's 265; <|endoftext|> 266 (added, special). */
START_TEST(hf_tokenizer_json_fixture) {
    cai_bpe_t *t = load_tiny();
    ck_assert_int_eq(cai_bpe_vocab_size(t), 267);
    ck_assert_uint_eq(cai_bpe_merge_count(t), 10);
    /* " lower": l o → lo, lo w → low, e r (rank 5) before Ġ low (rank 7),
     * low er → lower; "Ġ lower" is not a merge. */
    expect_ids(t, "the lower", (const int32_t[]){83, 257, 220, 262}, 4);
    expect_ids(t, " the", (const int32_t[]){258}, 1);
    expect_ids(t, "he's", (const int32_t[]){257, 265}, 2);
    expect_ids(t, "<|endoftext|>the<|endoftext|>", (const int32_t[]){266, 83, 257, 266}, 4);
    ck_assert(cai_bpe_is_special(t, 266));
    ck_assert(!cai_bpe_is_special(t, 265));
    int32_t id;
    ck_assert_int_eq(cai_bpe_token_id(t, "\xc4\xa0the", &id), CAI_OK); /* "Ġthe" */
    ck_assert_int_eq(id, 258);
    ck_assert_int_eq(cai_bpe_token_id(t, "<|endoftext|>", &id), CAI_OK);
    ck_assert_int_eq(id, 266);
    ck_assert_int_eq(cai_bpe_token_id(t, "nope", &id), CAI_ERR_INVALID_ARG);
    const char *b;
    size_t n;
    ck_assert_int_eq(cai_bpe_token_bytes(t, 258, &b, &n), CAI_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert(memcmp(b, " the", 4) == 0);
    /* Without special matching the marker is ordinary text. */
    cai_token_buf ids = {0};
    ck_assert_int_eq(cai_bpe_encode_ordinary(t, "<|endoftext|>", 13, &ids), CAI_OK);
    ck_assert_uint_gt(ids.len, 1);
    for (size_t i = 0; i < ids.len; i++) ck_assert_int_ne(ids.ids[i], 266);
    cai_token_buf_free(&ids);
    cai_bpe_free(t);
}
END_TEST

START_TEST(hf_options_prefix_space_and_ignore_merges) {
    char path[1024];
    cai_bpe_t *t;
    fixture_variant("\"add_prefix_space\": false", "\"add_prefix_space\": true", path, sizeof path);
    ck_assert_msg(cai_bpe_load_hf(path, &t) == CAI_OK, "%s", cai_error_message());
    /* Each segment reads as if it followed a space (the decoded text keeps it). */
    cai_token_buf ids = {0};
    ck_assert_int_eq(cai_bpe_encode(t, "the<|endoftext|>lower", 21, &ids), CAI_OK);
    ck_assert_uint_eq(ids.len, 4);
    ck_assert_int_eq(ids.ids[0], 258);
    ck_assert_int_eq(ids.ids[1], 266);
    ck_assert_int_eq(ids.ids[2], 220);
    ck_assert_int_eq(ids.ids[3], 262);
    cai_token_buf_free(&ids);
    cai_bpe_free(t);

    fixture_variant("\"ignore_merges\": false", "\"ignore_merges\": true", path, sizeof path);
    ck_assert_msg(cai_bpe_load_hf(path, &t) == CAI_OK, "%s", cai_error_message());
    /* " lower" is itself a token (264): taken whole instead of Ġ + lower. */
    expect_ids(t, "the lower", (const int32_t[]){83, 257, 264}, 3);
    cai_bpe_free(t);

    /* Newer files write merges as pairs. */
    fixture_variant("\"\xc4\xa0 t\"", "[\"\xc4\xa0\", \"t\"]", path, sizeof path);
    ck_assert_msg(cai_bpe_load_hf(path, &t) == CAI_OK, "%s", cai_error_message());
    expect_ids(t, " the", (const int32_t[]){258}, 1);
    cai_bpe_free(t);
}
END_TEST

START_TEST(hf_unsupported_pipelines_are_refused) {
    char path[1024];
    cai_bpe_t *t = NULL;
    fixture_variant("\"type\": \"BPE\"", "\"type\": \"WordPiece\"", path, sizeof path);
    ck_assert_int_eq(cai_bpe_load_hf(path, &t), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "model.type is \"WordPiece\""));
    fixture_variant("\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}", path, sizeof path);
    ck_assert_int_eq(cai_bpe_load_hf(path, &t), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "normalizer"));
    fixture_variant("\"byte_fallback\": false", "\"byte_fallback\": true", path, sizeof path);
    ck_assert_int_eq(cai_bpe_load_hf(path, &t), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "model.byte_fallback"));
    fixture_variant("\"merges\": [", "\"merges\": [\"zz q\",", path, sizeof path);
    ck_assert_int_eq(cai_bpe_load_hf(path, &t), CAI_ERR_FORMAT);
    ck_assert_msg(strstr(cai_error_message(), "model.merges[0]: token \"zz\"") != NULL, "%s", cai_error_message());
    fixture_variant("\"version\"", "\"version\" 1,", path, sizeof path);
    ck_assert_int_eq(cai_bpe_load_hf(path, &t), CAI_ERR_FORMAT);
    ck_assert_msg(strstr(cai_error_message(), "variant.json:2:") != NULL, "%s", cai_error_message());
    ck_assert_ptr_null(t);
    cai_error_clear();
}
END_TEST

static void expect_load_error(const char *vocab, const char *merges, cai_status want, const char *msg) {
    char vp[1024], mp[1024];
    write_file("vocab.json", vocab, vp, sizeof vp);
    write_file("merges.txt", merges, mp, sizeof mp);
    cai_bpe_t *t = NULL;
    cai_status st = cai_bpe_load(vp, mp, &t);
    ck_assert_msg(st == want, "want %s, got %s: %s", cai_status_str(want), cai_status_str(st), cai_error_message());
    ck_assert_msg(strstr(cai_error_message(), msg) != NULL, "message \"%s\" lacks \"%s\"", cai_error_message(), msg);
    ck_assert_ptr_null(t);
    cai_error_clear();
}

START_TEST(malformed_files_name_file_and_line) {
    const char *good = "{\"a\": 0,\n \"b\": 1,\n \"ab\": 2}\n";
    expect_load_error("{\"a\": 0,\n \"b\" 1}", "", CAI_ERR_FORMAT, "vocab.json:2: expected ':' after a token");
    expect_load_error("{\"a\": 0,\n\n \"b\": 0}", "", CAI_ERR_FORMAT,
                      "vocab.json:3: id 0 of token \"b\" is already used by \"a\" (line 1)");
    expect_load_error("{\"a\": 0,\n \"a\": 1}", "", CAI_ERR_FORMAT,
                      "vocab.json:2: token \"a\" appears again (first on line 1)");
    expect_load_error("{\"a\": 0,\n \"b\": 1.5}", "", CAI_ERR_FORMAT, "vocab.json:2: the id of token \"b\" must be");
    expect_load_error("{\"a\": 0,\n \"b\": -3}", "", CAI_ERR_FORMAT, "vocab.json:2: token \"b\" has id -3");
    expect_load_error("{\"a\": 0,\n \"\\ud800\": 1}", "", CAI_ERR_FORMAT, "vocab.json:2: \\uD800 is a high surrogate");
    expect_load_error("{\"a\": 0}\n,", "", CAI_ERR_FORMAT, "vocab.json:2: expected the end of the file");
    expect_load_error("{}", "", CAI_ERR_FORMAT, "the vocabulary is empty");
    expect_load_error(good, "#version: 0.2\na b\nb a b\n", CAI_ERR_FORMAT,
                      "merges.txt:3: expected two tokens separated by one space, found \"b a b\"");
    expect_load_error(good, "#version: 0.2\n\na zz\n", CAI_ERR_FORMAT,
                      "merges.txt:3: token \"zz\" of merge \"a zz\" is not in");
    expect_load_error(good, "b a\n", CAI_ERR_FORMAT, "merges.txt:1: merge \"b a\" makes \"ba\", which is not in");
    expect_load_error(good, "a  b\n", CAI_ERR_FORMAT, "merges.txt:1: expected two tokens");
    char vp[1024];
    snprintf(vp, sizeof vp, "%s/absent.json", g_tmp);
    cai_bpe_t *t = NULL;
    ck_assert_int_eq(cai_bpe_load(vp, vp, &t), CAI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "absent.json"));
    cai_error_clear();
}
END_TEST

START_TEST(small_vocabulary_without_byte_tokens) {
    /* Loads fine; text it cannot spell is refused, never silently dropped. */
    char vp[1024], mp[1024];
    write_file("vocab.json", "{\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0120\": 3, \"\\u0120ab\": 4}", vp, sizeof vp);
    write_file("merges.txt", "#version: 0.2\r\na b\r\n\\u0120 ab\r\n\xc4\xa0 ab\r\n", mp, sizeof mp);
    cai_bpe_t *t = NULL;
    ck_assert_int_eq(cai_bpe_load(vp, mp, &t), CAI_ERR_FORMAT); /* "\u0120" is not an escape in merges.txt */
    write_file("merges.txt", "#version: 0.2\r\na b\r\n\xc4\xa0 ab\r\n", mp, sizeof mp);
    ck_assert_msg(cai_bpe_load(vp, mp, &t) == CAI_OK, "%s", cai_error_message());
    expect_ids(t, "ab abab", (const int32_t[]){2, 4, 2}, 3);
    cai_token_buf ids = {0};
    ck_assert_int_eq(cai_bpe_encode(t, "abc", 3, &ids), CAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "no token for byte 0x63"));
    int32_t bad[] = {1, 7};
    cai_byte_buf out = {0};
    ck_assert_int_eq(cai_bpe_decode(t, bad, 2, &out), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "token id 7 at position 1"));
    cai_error_clear();
    cai_byte_buf_free(&out);
    cai_token_buf_free(&ids);
    cai_bpe_free(t);
}
END_TEST

/* ------------------------------------------------------------ specials, round trips */

START_TEST(special_tokens_leftmost_longest) {
    cai_bpe_t *t = load_tiny();
    int32_t s1, s2, eot;
    ck_assert_int_eq(cai_bpe_add_special(t, "<s>", &s1), CAI_OK);
    ck_assert_int_eq(cai_bpe_add_special(t, "<s>x", &s2), CAI_OK);
    ck_assert_int_eq(cai_bpe_add_special(t, "<|endoftext|>", &eot), CAI_OK); /* already one: same id */
    ck_assert_int_eq(s1, 267);
    ck_assert_int_eq(s2, 268);
    ck_assert_int_eq(eot, 266);
    ck_assert_int_eq(cai_bpe_vocab_size(t), 269);
    /* 'a' = 64, 'b' = 65, 'x' = 87 in GPT-2's byte order. */
    expect_ids(t, "a<s>xb<s>", (const int32_t[]){64, s2, 65, s1}, 4);
    expect_ids(t, "<s<s>>", (const int32_t[]){27, 82, s1, 29}, 4);
    /* A clone encodes the same and is independent. */
    cai_bpe_t *c;
    ck_assert_int_eq(cai_bpe_clone(t, &c), CAI_OK);
    cai_bpe_free(t);
    expect_ids(c, "a<s>xb<s> the lower<|endoftext|>", (const int32_t[]){64, s2, 65, s1, 258, 220, 262, 266}, 8);
    ck_assert(cai_bpe_is_special(c, s1));
    cai_bpe_free(c);
}
END_TEST

START_TEST(random_bytes_round_trip) {
    cai_bpe_t *t = load_tiny();
    ck_assert_int_eq(cai_bpe_add_special(t, "<s>", NULL), CAI_OK);
    /* Pieces that stress every branch of the pattern, plus raw random bytes. */
    static const char *const pieces[] = {" ",
                                         "  ",
                                         "\n",
                                         "\t",
                                         "'s",
                                         "'ll",
                                         "'",
                                         "lower",
                                         "the",
                                         "é",
                                         "\xcc\x81",
                                         "日本",
                                         "١٢",
                                         "½",
                                         "🙂",
                                         "\xc2\xa0",
                                         "\xe3\x80\x80",
                                         "\xff",
                                         "\xc3",
                                         "\xe2\x82",
                                         "\xed\xa0\x80",
                                         "\xf4\x90\x80\x80",
                                         "<s>",
                                         "<",
                                         "123",
                                         "?!",
                                         "\r\n",
                                         "\xc0\xaf"};
    const size_t np = sizeof pieces / sizeof *pieces;
    char buf[4096];
    for (uint64_t c = 0; c < 3000; c++) {
        size_t n = 0;
        uint32_t count = rnd(1, c, 40);
        for (uint32_t k = 0; k < count; k++) {
            if (rnd(2, c * 64 + k, 4) == 0) {
                buf[n++] = (char)rnd(3, c * 64 + k, 256);
            } else {
                const char *p = pieces[rnd(4, c * 64 + k, (uint32_t)np)];
                memcpy(buf + n, p, strlen(p));
                n += strlen(p);
            }
        }
        check_roundtrip(t, buf, n);
    }
    check_roundtrip(t, "", 0);
    cai_bpe_free(t);
}
END_TEST

/* ------------------------------------------------------------ saving */

static void same_encodings(cai_bpe_t *a, cai_bpe_t *b, const char *const *texts, size_t n) {
    for (size_t i = 0; i < n; i++) {
        cai_token_buf x = {0}, y = {0};
        ck_assert_int_eq(cai_bpe_encode(a, texts[i], strlen(texts[i]), &x), CAI_OK);
        ck_assert_int_eq(cai_bpe_encode(b, texts[i], strlen(texts[i]), &y), CAI_OK);
        ck_assert_msg(x.len == y.len && (!x.len || memcmp(x.ids, y.ids, x.len * sizeof *x.ids) == 0), "\"%s\" differs",
                      texts[i]);
        cai_token_buf_free(&x);
        cai_token_buf_free(&y);
    }
}

START_TEST(save_reloads_in_both_formats) {
    cai_bpe_t *t = load_tiny();
    char dir[600], vp[700], mp[700], hp[700];
    snprintf(dir, sizeof dir, "%s/saved", g_tmp);
    ck_assert_msg(cai_bpe_save(t, dir) == CAI_OK, "%s", cai_error_message());
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    snprintf(mp, sizeof mp, "%s/merges.txt", dir);
    snprintf(hp, sizeof hp, "%s/tokenizer.json", dir);
    char *merges = read_text(mp);
    ck_assert_str_eq(merges,
                     "#version: 0.2\n\xc4\xa0 t\nh e\n\xc4\xa0t he\nl o\nlo w\ne r\nlow er\n\xc4\xa0 low\n"
                     "\xc4\xa0low er\n' s\n");
    free(merges);
    cai_bpe_t *a, *b;
    ck_assert_msg(cai_bpe_load(vp, mp, &a) == CAI_OK, "%s", cai_error_message());
    ck_assert_msg(cai_bpe_load_hf(hp, &b) == CAI_OK, "%s", cai_error_message());
    ck_assert_int_eq(cai_bpe_vocab_size(a), 267);
    ck_assert(!cai_bpe_is_special(a, 266)); /* vocab.json does not say which tokens are special */
    ck_assert(cai_bpe_is_special(b, 266));  /* tokenizer.json does */
    ck_assert_int_eq(cai_bpe_add_special(a, "<|endoftext|>", NULL), CAI_OK);
    const char *texts[] = {"the lower's <|endoftext|> \xff\xfe x", "  he's\n\n lower  ", ""};
    same_encodings(t, a, texts, 3);
    same_encodings(t, b, texts, 3);
    cai_bpe_free(a);
    cai_bpe_free(b);
    cai_bpe_free(t);
    unlink(vp), unlink(mp), unlink(hp), rmdir(dir);
}
END_TEST

/* ------------------------------------------------------------ training */

START_TEST(train_hand_example) {
    /* The classic example: "aaabdaaabac" is one pre-token. Counts: aa 4 → merge;
     * then (aa,a) 2 ties (a,b) 2: the smaller ids win → ab; then aa ab (2);
     * then all pairs count 1 and the smallest ids win: (a,c), then (d,aaab).
     * Bytes are ids 0..255 in GPT-2 order: a 64, b 65, c 66, d 67. */
    const char *corpus[] = {"aaabdaaabac"};
    cai_bpe_train_opts o = {.vocab_size = 261};
    cai_bpe_t *t;
    ck_assert_msg(cai_bpe_train(corpus, NULL, 1, &o, &t) == CAI_OK, "%s", cai_error_message());
    ck_assert_int_eq(cai_bpe_vocab_size(t), 261);
    ck_assert_uint_eq(t->n_merges, 5);
    const bpe_merge want[] = {{64, 64, 256}, {64, 65, 257}, {256, 257, 258}, {64, 66, 259}, {67, 258, 260}};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(t->merges[i].a, want[i].a);
        ck_assert_int_eq(t->merges[i].b, want[i].b);
        ck_assert_int_eq(t->merges[i].result, want[i].result);
    }
    expect_ids(t, "aaabdaaabac", (const int32_t[]){258, 260, 259}, 3);
    cai_bpe_free(t);

    o.vocab_size = 100;
    ck_assert_int_eq(cai_bpe_train(corpus, NULL, 1, &o, &t), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "use at least 256"));
    /* A corpus too small for the size asked for gives a smaller vocabulary. */
    o.vocab_size = 5000;
    ck_assert_int_eq(cai_bpe_train(corpus, NULL, 1, &o, &t), CAI_OK);
    ck_assert_int_eq(cai_bpe_vocab_size(t), 263); /* the whole word is one token */
    cai_bpe_free(t);
    /* Pairs seen fewer than min_frequency times are not merged: aa, ab, aa+ab only. */
    o.min_frequency = 2;
    ck_assert_int_eq(cai_bpe_train(corpus, NULL, 1, &o, &t), CAI_OK);
    ck_assert_int_eq(cai_bpe_vocab_size(t), 259);
    ck_assert_uint_eq(cai_bpe_merge_count(t), 3);
    cai_bpe_free(t);
    cai_error_clear();
}
END_TEST

/* Words of the synthetic corpora: syllables glued, Zipf-like frequencies. */
static void make_word(uint32_t k, char *w) {
    static const char *const syl[] = {"ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "an", "er", "th", "ing", "qu"};
    w[0] = 0;
    uint32_t n = 1 + k % 4, h = (k + 1) * 2654435761u;
    for (uint32_t i = 0; i < n; i++) strcat(w, syl[((h >> (5 * i)) & 31) % 13]);
}

static char *make_corpus(uint64_t seed, size_t nwords, int punctuation) {
    char *s = malloc(nwords * 20 + 1), w[64];
    size_t n = 0;
    for (size_t i = 0; i < nwords; i++) {
        float u = cai_rng_uniform(seed, 5, i);
        make_word((uint32_t)(600.0f * u * u), w);
        if (i) s[n++] = ' ';
        memcpy(s + n, w, strlen(w));
        n += strlen(w);
        if (punctuation && rnd(seed, i, 9) == 0) s[n++] = ",.!'"[rnd(seed + 1, i, 4)];
        if (punctuation && rnd(seed + 2, i, 23) == 0) n += (size_t)sprintf(s + n, " %u", rnd(seed + 3, i, 2000));
    }
    s[n] = 0;
    return s;
}

/* Reference trainer: recount every pair over every word before each merge. */
START_TEST(train_matches_naive_recount) {
    char *corpus = make_corpus(7, 6000, 0);
    cai_bpe_train_opts o = {.vocab_size = 256 + 250};
    cai_bpe_t *t;
    const char *texts[] = {corpus};
    ck_assert_msg(cai_bpe_train(texts, NULL, 1, &o, &t) == CAI_OK, "%s", cai_error_message());
    /* Words: the text split before each space (its pre-tokens here). */
    enum { MAXW = 1024, MAXL = 32, MAXT = 512 };
    static int32_t sym[MAXW][MAXL];
    int len[MAXW], nw = 0;
    long cnt[MAXW];
    static char tokbytes[MAXT][2 * MAXL];
    for (int b = 0; b < 256; b++) {
        uint32_t c = cai_bpe_byte_to_char((uint8_t)b); /* id = rank of the stand-in character */
        int id = 0;
        for (int o2 = 0; o2 < 256; o2++) id += cai_bpe_byte_to_char((uint8_t)o2) < c;
        tokbytes[id][0] = (char)b;
        tokbytes[id][1] = 0;
    }
    for (const char *p = corpus; *p;) {
        const char *e = strchr(p + 1, ' ');
        if (!e) e = p + strlen(p);
        int found = -1;
        for (int w = 0; w < nw; w++) {
            int same = len[w] == (int)(e - p);
            for (int i = 0; same && i < len[w]; i++) same = tokbytes[sym[w][i]][0] == p[i];
            if (same) found = w;
        }
        if (found < 0) {
            ck_assert_int_lt(nw, MAXW);
            found = nw++;
            len[found] = (int)(e - p);
            cnt[found] = 0;
            for (int i = 0; i < len[found]; i++)
                for (int id = 0; id < 256; id++)
                    if (tokbytes[id][0] == p[i] && !tokbytes[id][1]) sym[found][i] = id;
        }
        cnt[found]++;
        p = e;
    }
    int ntok = 256;
    for (size_t m = 0; m < t->n_merges; m++) {
        static long pc[MAXT][MAXT];
        memset(pc, 0, sizeof pc);
        for (int w = 0; w < nw; w++) /* every pair, counted from scratch */
            for (int i = 0; i + 1 < len[w]; i++) pc[sym[w][i]][sym[w][i + 1]] += cnt[w];
        long best = 0;
        int ba = 0, bb = 0;
        for (int a = 0; a < ntok; a++) /* first maximum = smallest ids among ties */
            for (int b = 0; b < ntok; b++)
                if (pc[a][b] > best) best = pc[a][b], ba = a, bb = b;
        char joined[4 * MAXL];
        snprintf(joined, sizeof joined, "%s%s", tokbytes[ba], tokbytes[bb]);
        ck_assert_uint_lt(strlen(joined), 2 * MAXL);
        int x = -1;
        for (int id = 0; id < ntok; id++)
            if (strcmp(tokbytes[id], joined) == 0) x = id;
        if (x < 0) {
            ck_assert_int_lt(ntok, MAXT);
            x = ntok++;
            memcpy(tokbytes[x], joined, strlen(joined) + 1);
        }
        ck_assert_msg(t->merges[m].a == ba && t->merges[m].b == bb && t->merges[m].result == x,
                      "merge %zu: trainer (%d,%d)->%d, recount (%d,%d)->%d", m, t->merges[m].a, t->merges[m].b,
                      t->merges[m].result, ba, bb, x);
        for (int w = 0; w < nw; w++) {
            int o2 = 0;
            for (int i = 0; i < len[w];) {
                if (i + 1 < len[w] && sym[w][i] == ba && sym[w][i + 1] == bb) sym[w][o2++] = x, i += 2;
                else sym[w][o2++] = sym[w][i++];
            }
            len[w] = o2;
        }
    }
    ck_assert_int_eq(ntok, cai_bpe_vocab_size(t));
    cai_bpe_free(t);
    free(corpus);
}
END_TEST

START_TEST(trained_tokenizer_reaches_size_and_is_lossless) {
    enum { DOCS = 40 };
    char *docs[DOCS];
    size_t total = 0;
    cai_bpe_train_opts o = {.vocab_size = 1200,
                            .special_tokens = (const char *[]){"<|endoftext|>", "<pad>"},
                            .n_special = 2};
    cai_bpe_trainer_t *tr;
    ck_assert_int_eq(cai_bpe_trainer_init(&o, &tr), CAI_OK);
    for (int d = 0; d < DOCS; d++) {
        docs[d] = make_corpus(100 + (uint64_t)d, 1500, 1);
        total += strlen(docs[d]);
        /* Documents joined by the marker, which must not be learned from. */
        ck_assert_int_eq(cai_bpe_trainer_feed(tr, docs[d], strlen(docs[d])), CAI_OK);
        ck_assert_int_eq(cai_bpe_trainer_feed(tr, "<|endoftext|>", 13), CAI_OK);
    }
    cai_bpe_t *t;
    ck_assert_msg(cai_bpe_trainer_finish(tr, &t) == CAI_OK, "%s", cai_error_message());
    cai_bpe_trainer_free(tr);
    ck_assert_int_eq(cai_bpe_vocab_size(t), 1200);
    ck_assert(cai_bpe_is_special(t, 0) && cai_bpe_is_special(t, 1));
    for (int32_t id = 2; id < 1200; id++) {
        const char *b;
        size_t n;
        ck_assert_int_eq(cai_bpe_token_bytes(t, id, &b, &n), CAI_OK);
        for (size_t i = 0; i + 1 < n; i++) ck_assert(!(b[i] == '<' && b[i + 1] == '|'));
    }
    size_t ntokens = 0;
    for (int d = 0; d < DOCS; d++) {
        cai_token_buf ids = {0};
        ck_assert_int_eq(cai_bpe_encode(t, docs[d], strlen(docs[d]), &ids), CAI_OK);
        ntokens += ids.len;
        cai_byte_buf back = {0};
        ck_assert_int_eq(cai_bpe_decode(t, ids.ids, ids.len, &back), CAI_OK);
        ck_assert(back.len == strlen(docs[d]) && memcmp(back.data, docs[d], back.len) == 0);
        cai_byte_buf_free(&back);
        cai_token_buf_free(&ids);
    }
    /* The corpus has a few hundred distinct words: most become single tokens. */
    ck_assert_msg(ntokens * 4 < total, "%zu tokens for %zu bytes", ntokens, total);
    expect_ids(t, "<|endoftext|><pad>", (const int32_t[]){0, 1}, 2);

    char dir[600], vp[700], mp[700], hp[700];
    snprintf(dir, sizeof dir, "%s/trained", g_tmp);
    ck_assert_int_eq(cai_bpe_save(t, dir), CAI_OK);
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    snprintf(mp, sizeof mp, "%s/merges.txt", dir);
    snprintf(hp, sizeof hp, "%s/tokenizer.json", dir);
    cai_bpe_t *a, *b;
    ck_assert_msg(cai_bpe_load(vp, mp, &a) == CAI_OK, "%s", cai_error_message());
    ck_assert_msg(cai_bpe_load_hf(hp, &b) == CAI_OK, "%s", cai_error_message());
    ck_assert_int_eq(cai_bpe_add_special(a, "<|endoftext|>", NULL), CAI_OK);
    ck_assert_int_eq(cai_bpe_add_special(a, "<pad>", NULL), CAI_OK);
    ck_assert(cai_bpe_is_special(b, 1));
    const char *texts[] = {docs[0], docs[1], "<|endoftext|>kalo mine, 123!<pad>"};
    same_encodings(t, a, texts, 3);
    same_encodings(t, b, texts, 3);
    cai_bpe_free(a);
    cai_bpe_free(b);
    unlink(vp), unlink(mp), unlink(hp), rmdir(dir);
    for (int d = 0; d < DOCS; d++) free(docs[d]);
    cai_bpe_free(t);
}
END_TEST

/* ------------------------------------------------------------ digit splitting */

/* Pieces under Sequence[Digits(individual_digits), ByteLevel], as the
 * encoder cuts them. */
static void expect_digit_split(const char *text, const char *const *want, size_t n) {
    const uint8_t *s = (const uint8_t *)text;
    size_t len = strlen(text), i = 0, k = 0;
    while (i < len) {
        size_t piece = cai_bpe_digit_piece_end(s, len, i);
        while (i < piece) {
            size_t e = cai_bpe_pretoken_end(s, piece, i);
            ck_assert_msg(k < n, "\"%s\": extra piece \"%.*s\"", text, (int)(e - i), text + i);
            ck_assert_msg(e - i == strlen(want[k]) && memcmp(text + i, want[k], e - i) == 0,
                          "\"%s\": piece %zu is \"%.*s\", want \"%s\"", text, k, (int)(e - i), text + i, want[k]);
            i = e;
            k++;
        }
    }
    ck_assert_uint_eq(k, n);
}

static int is_digit_byte(char c) { return c >= '0' && c <= '9'; }

/* Every token of `text` that holds an ASCII digit is that digit alone. */
static size_t expect_digits_alone(cai_bpe_t *t, const char *text, size_t len) {
    cai_token_buf ids = {0};
    ck_assert_msg(cai_bpe_encode(t, text, len, &ids) == CAI_OK, "%s", cai_error_message());
    size_t digits = 0;
    for (size_t i = 0; i < ids.len; i++) {
        const char *b;
        size_t n;
        ck_assert_int_eq(cai_bpe_token_bytes(t, ids.ids[i], &b, &n), CAI_OK);
        for (size_t j = 0; j < n; j++)
            if (is_digit_byte(b[j])) {
                ck_assert_msg(n == 1, "token %d \"%.*s\" joins a digit to other bytes", ids.ids[i], (int)n, b);
                digits++;
            }
    }
    cai_token_buf_free(&ids);
    check_roundtrip(t, text, len);
    return digits;
}

/* Arithmetic lines between words of make_corpus (numbers among them). */
static char *make_number_corpus(uint64_t seed, size_t n) {
    char *words = make_corpus(seed, n, 1);
    char *s = malloc(n * 64 + strlen(words) + 2);
    size_t len = (size_t)sprintf(s, "%s\n", words);
    free(words);
    for (size_t i = 0; i < n; i++) {
        unsigned a = rnd(seed, i, 180), b = rnd(seed + 1, i, 180);
        len += (size_t)sprintf(s + len, "What is %u plus %u? The answer is %u. x%u=%u,%u\n", a, b, a + b, a % 10, b * 7,
                               1000 + a);
    }
    s[len] = 0;
    return s;
}

START_TEST(digit_split_pieces_match_hf_digits_then_byte_level) {
    /* Digits isolates each numeric character first; the GPT-2 pattern then
     * runs on each piece alone, so a space never leads a digit and the space
     * run before a digit is not backed off. */
    expect_digit_split(" 42 apples", (const char *[]){" ", "4", "2", " apples"}, 4);
    expect_digit_split("a  1", (const char *[]){"a", "  ", "1"}, 3);
    expect_split("a  1", (const char *[]){"a", " ", " 1"}, 3);
    expect_digit_split("x2y", (const char *[]){"x", "2", "y"}, 3);
    expect_digit_split("12.5%", (const char *[]){"1", "2", ".", "5", "%"}, 5);
    expect_digit_split("it's 3's", (const char *[]){"it", "'s", " ", "3", "'s"}, 5);
    /* \p{N} beyond ASCII: superscript two and one half (No), Arabic-Indic three (Nd). */
    expect_digit_split("x\xc2\xb2\xc2\xbd \xd9\xa3", (const char *[]){"x", "\xc2\xb2", "\xc2\xbd", " ", "\xd9\xa3"}, 5);
    expect_digit_split("no digits here", (const char *[]){"no", " digits", " here"}, 3);
    expect_digit_split("7", (const char *[]){"7"}, 1);
}
END_TEST

START_TEST(digit_split_training_never_merges_digits) {
    char *corpus = make_number_corpus(31, 3000);
    cai_bpe_train_opts o = {.vocab_size = 700, .special_tokens = (const char *[]){"<|endoftext|>"}, .n_special = 1};
    cai_bpe_trainer_t *tr;
    ck_assert_int_eq(cai_bpe_trainer_init(&o, &tr), CAI_OK);
    ck_assert_int_eq(cai_bpe_trainer_set_split_digits(tr, 1), CAI_OK);
    ck_assert_int_eq(cai_bpe_trainer_feed(tr, corpus, strlen(corpus)), CAI_OK);
    /* The words are counted: the pre-tokenisation can no longer change. */
    ck_assert_int_eq(cai_bpe_trainer_set_split_digits(tr, 0), CAI_ERR_INVALID_ARG);
    cai_error_clear();
    cai_bpe_t *t;
    ck_assert_msg(cai_bpe_trainer_finish(tr, &t) == CAI_OK, "%s", cai_error_message());
    cai_bpe_trainer_free(tr);
    ck_assert_int_eq(cai_bpe_split_digits(t), 1);
    /* No token of the whole vocabulary holds a digit with anything else. */
    int32_t v = cai_bpe_vocab_size(t);
    ck_assert_int_eq(v, 700);
    for (int32_t id = 0; id < v; id++) {
        const char *b;
        size_t n;
        ck_assert_int_eq(cai_bpe_token_bytes(t, id, &b, &n), CAI_OK);
        for (size_t j = 0; j < n; j++)
            ck_assert_msg(!is_digit_byte(b[j]) || n == 1, "token %d \"%.*s\"", id, (int)n, b);
    }
    /* 3 + 3 + 3 digits at most: "What is 7 plus 9? The answer is 16." has 4. */
    const char *q = "What is 127 plus 45? The answer is 172.";
    ck_assert_uint_eq(expect_digits_alone(t, q, strlen(q)), 8);
    ck_assert_uint_eq(expect_digits_alone(t, corpus, strlen(corpus)) > 3000 * 8, 1);
    /* Bytes of every kind, digits dense among them, decode back exactly. */
    char buf[512];
    for (uint64_t r = 0; r < 200; r++) {
        size_t n = rnd(40, r, sizeof buf);
        for (size_t i = 0; i < n; i++) {
            uint32_t k = rnd(41 + r, i, 4);
            buf[i] = k == 0 ? (char)('0' + rnd(42 + r, i, 10)) : k == 1 ? ' ' : (char)rnd(43 + r, i, 256);
        }
        expect_digits_alone(t, buf, n);
    }
    /* The same merges without the option join digits again. */
    cai_bpe_set_split_digits(t, 0);
    ck_assert_int_eq(cai_bpe_split_digits(t), 0);
    cai_token_buf ids = {0};
    ck_assert_int_eq(cai_bpe_encode(t, " 4", 2, &ids), CAI_OK);
    ck_assert_uint_eq(ids.len, 2); /* " " and "4": no merge " 4" was learned */
    cai_token_buf_free(&ids);
    cai_bpe_set_split_digits(t, 1);

    /* Without the option, the same corpus learns number tokens. */
    cai_bpe_t *plain;
    const char *texts[] = {corpus};
    ck_assert_int_eq(cai_bpe_train(texts, NULL, 1, &o, &plain), CAI_OK);
    ck_assert_int_eq(cai_bpe_split_digits(plain), 0);
    ck_assert_int_eq(cai_bpe_encode(plain, " 172", 4, &ids), CAI_OK);
    ck_assert_uint_lt(ids.len, 4);
    cai_token_buf_free(&ids);
    cai_bpe_free(plain);

    /* Saved and loaded, through each loader, the option stays. */
    char dir[600], vp[700], mp[700], hp[700];
    snprintf(dir, sizeof dir, "%s/digits", g_tmp);
    ck_assert_int_eq(cai_bpe_save(t, dir), CAI_OK);
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    snprintf(mp, sizeof mp, "%s/merges.txt", dir);
    snprintf(hp, sizeof hp, "%s/tokenizer.json", dir);
    char *json = read_text(hp);
    ck_assert_msg(strstr(json,
                         "\"pre_tokenizer\": {\n  \"type\": \"Sequence\",\n  \"pretokenizers\": [\n   {\n    "
                         "\"type\": \"Digits\",\n    \"individual_digits\": true\n   },\n   {\n    \"type\": "
                         "\"ByteLevel\",\n    \"add_prefix_space\": false,") != NULL,
                  "%s", json);
    free(json);
    cai_bpe_t *h, *d, *c, *bare;
    ck_assert_msg(cai_bpe_load_hf(hp, &h) == CAI_OK, "%s", cai_error_message());
    ck_assert_msg(cai_bpe_load_dir(dir, &d) == CAI_OK, "%s", cai_error_message());
    ck_assert_int_eq(cai_bpe_clone(d, &c), CAI_OK);
    ck_assert_int_eq(cai_bpe_split_digits(h), 1);
    ck_assert_int_eq(cai_bpe_split_digits(d), 1);
    ck_assert_int_eq(cai_bpe_split_digits(c), 1);
    ck_assert_int_eq(cai_bpe_add_special(d, "<|endoftext|>", NULL), CAI_OK);
    ck_assert_int_eq(cai_bpe_add_special(c, "<|endoftext|>", NULL), CAI_OK);
    const char *same[] = {q, corpus, "<|endoftext|>a  1 x\xc2\xb2 2024-12-04"};
    same_encodings(t, h, same, 3);
    same_encodings(t, d, same, 3);
    same_encodings(t, c, same, 3);
    /* vocab.json + merges.txt alone cannot say it (GPT-2's format). */
    ck_assert_int_eq(cai_bpe_load(vp, mp, &bare), CAI_OK);
    ck_assert_int_eq(cai_bpe_split_digits(bare), 0);
    cai_bpe_free(bare);
    cai_bpe_free(h);
    cai_bpe_free(d);
    cai_bpe_free(c);
    unlink(vp), unlink(mp), unlink(hp), rmdir(dir);
    cai_bpe_free(t);
    free(corpus);
}
END_TEST

static const char k_byte_level[] =
    "{\n  \"type\": \"ByteLevel\",\n  \"add_prefix_space\": false,\n  \"trim_offsets\": "
    "true,\n  \"use_regex\": true\n }";

static void expect_pre_tokenizer_error(const char *pre, cai_status want, const char *field) {
    char path[1024], repl[1024];
    snprintf(repl, sizeof repl, "%s", pre);
    fixture_variant(k_byte_level, repl, path, sizeof path);
    cai_bpe_t *t = NULL;
    cai_status st = cai_bpe_load_hf(path, &t);
    ck_assert_msg(st == want, "%s: want %s, got %s: %s", pre, cai_status_str(want), cai_status_str(st),
                  cai_error_message());
    ck_assert_msg(strstr(cai_error_message(), "variant.json") && strstr(cai_error_message(), field),
                  "message \"%s\" lacks the file or \"%s\"", cai_error_message(), field);
    ck_assert_ptr_null(t);
    cai_error_clear();
}

START_TEST(digit_split_read_from_hf_and_malformed_refused) {
    char path[1024];
    /* Hugging Face's own spelling of the Sequence (as tokenizers writes it). */
    fixture_variant(k_byte_level,
                    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", \"individual_digits\": true}, "
                    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": "
                    "true}]}",
                    path, sizeof path);
    cai_bpe_t *t = NULL, *plain = load_tiny();
    ck_assert_msg(cai_bpe_load_hf(path, &t) == CAI_OK, "%s", cai_error_message());
    ck_assert_int_eq(cai_bpe_split_digits(t), 1);
    ck_assert_int_eq(cai_bpe_split_digits(plain), 0);
    cai_token_buf a = {0}, b = {0};
    ck_assert_int_eq(cai_bpe_encode(t, "a 12", 4, &a), CAI_OK);
    cai_bpe_set_split_digits(plain, 1);
    ck_assert_int_eq(cai_bpe_encode(plain, "a 12", 4, &b), CAI_OK);
    ck_assert_uint_eq(a.len, b.len);
    ck_assert(memcmp(a.ids, b.ids, a.len * sizeof *a.ids) == 0);
    ck_assert_uint_ge(a.len, 4); /* "a", " ", "1", "2" at least */
    cai_token_buf_free(&a);
    cai_token_buf_free(&b);
    cai_bpe_free(t);
    cai_bpe_free(plain);

    expect_pre_tokenizer_error("{\"type\": \"Sequence\"}", CAI_ERR_FORMAT, "pre_tokenizer.pretokenizers");
    expect_pre_tokenizer_error("{\"type\": \"Sequence\", \"pretokenizers\": {}}", CAI_ERR_FORMAT,
                               "pre_tokenizer.pretokenizers");
    expect_pre_tokenizer_error("{\"type\": \"Sequence\", \"pretokenizers\": [7, {\"type\": \"ByteLevel\"}]}",
                               CAI_ERR_FORMAT, "pre_tokenizer.pretokenizers[0]");
    expect_pre_tokenizer_error(
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
        "\"individual_digits\": \"yes\"}, {\"type\": \"ByteLevel\"}]}",
        CAI_ERR_FORMAT, "pre_tokenizer.pretokenizers[0].individual_digits");
    expect_pre_tokenizer_error(
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
        "\"individual_digits\": false}, {\"type\": \"ByteLevel\"}]}",
        CAI_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].individual_digits");
    expect_pre_tokenizer_error(
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
        "\"individual_digits\": true}, {\"type\": \"Whitespace\"}]}",
        CAI_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1].type");
    expect_pre_tokenizer_error(
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
        "\"individual_digits\": true}, [1]]}",
        CAI_ERR_FORMAT, "pre_tokenizer.pretokenizers[1]");
    expect_pre_tokenizer_error(
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
        "\"individual_digits\": true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": true}]}",
        CAI_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1].add_prefix_space");
    expect_pre_tokenizer_error(
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
        "\"individual_digits\": true}]}",
        CAI_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers has 1 entries");

    /* A directory read from vocab.json + merges.txt refuses a broken Digits
     * entry in the tokenizer.json beside them, naming that file. */
    cai_bpe_t *tiny = load_tiny();
    char dir[600], hp[700], vp[700], mp[700];
    snprintf(dir, sizeof dir, "%s/bad_digits", g_tmp);
    ck_assert_int_eq(cai_bpe_save(tiny, dir), CAI_OK);
    cai_bpe_free(tiny);
    snprintf(hp, sizeof hp, "%s/tokenizer.json", dir);
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    snprintf(mp, sizeof mp, "%s/merges.txt", dir);
    FILE *f = fopen(hp, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(
        "{\"model\": {\"type\": \"BPE\"}, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
        "[{\"type\": \"Digits\"}, {\"type\": \"ByteLevel\"}]}}",
        f);
    fclose(f);
    ck_assert_int_eq(cai_bpe_load_dir(dir, &t), CAI_ERR_FORMAT);
    ck_assert_msg(strstr(cai_error_message(), "bad_digits/tokenizer.json") &&
                      strstr(cai_error_message(), "pre_tokenizer.pretokenizers[0].individual_digits"),
                  "%s", cai_error_message());
    ck_assert_ptr_null(t);
    cai_error_clear();
    unlink(vp), unlink(mp), unlink(hp), rmdir(dir);
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *src = getenv("top_srcdir");
    snprintf(g_fixture, sizeof g_fixture, "%s/tests/data/bpe/tiny_tokenizer.json", src ? src : "..");
    snprintf(g_tmp, sizeof g_tmp, "%s/cai_bpe_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        MPI_Finalize();
        return 1;
    }
    Suite *s = suite_create("bpe");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, pretokenizer_follows_gpt2_pattern);
    tcase_add_test(tc, unicode_classes_and_byte_map);
    tcase_add_test(tc, hf_tokenizer_json_fixture);
    tcase_add_test(tc, hf_options_prefix_space_and_ignore_merges);
    tcase_add_test(tc, hf_unsupported_pipelines_are_refused);
    tcase_add_test(tc, malformed_files_name_file_and_line);
    tcase_add_test(tc, small_vocabulary_without_byte_tokens);
    tcase_add_test(tc, special_tokens_leftmost_longest);
    tcase_add_test(tc, random_bytes_round_trip);
    tcase_add_test(tc, save_reloads_in_both_formats);
    tcase_add_test(tc, train_hand_example);
    tcase_add_test(tc, train_matches_naive_recount);
    tcase_add_test(tc, trained_tokenizer_reaches_size_and_is_lossless);
    tcase_add_test(tc, digit_split_pieces_match_hf_digits_then_byte_level);
    tcase_add_test(tc, digit_split_training_never_merges_digits);
    tcase_add_test(tc, digit_split_read_from_hf_and_malformed_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    char path[1024];
    static const char *const leftovers[] = {"vocab.json", "merges.txt", "variant.json"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", g_tmp, leftovers[i]);
        unlink(path);
    }
    rmdir(g_tmp);
    MPI_Finalize();
    return failed ? 1 : 0;
}
