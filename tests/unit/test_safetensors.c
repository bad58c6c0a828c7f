/* safetensors: round trips of every colossal dtype, the file layout checked
 * byte by byte with an independent JSON parse, the streaming writer, strict
 * rejection of hand-crafted corrupt files, and interop with the reference
 * (Hugging Face) library: a committed file it wrote, plus a live two-way check
 * where python3 has safetensors and torch. */
#include "cai_config.h"
#include "colossal/ckpt.h"

#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256];

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

/* ------------------------------------------------------------ canonical tensors */

/* The same tensors tests/data/safetensors/reference.py builds with torch;
 * values spelled out as IEEE bit patterns so neither side derives them from
 * the other. */
typedef struct {
    const char *name, *st_dtype;
    cai_dtype dtype; /* CAI_DTYPE_COUNT: colossal cannot write it */
    int ndim;
    uint64_t shape[2];
    size_t nbytes;
    unsigned char bytes[64];
} canon;

#define N_CANON 11

static void put_bytes(canon *c, const void *src, size_t n) {
    memcpy(c->bytes, src, n);
    c->nbytes = n;
}

static void canonical(canon out[N_CANON]) {
    memset(out, 0, sizeof(canon) * N_CANON);
    float f32[12];
    for (int i = 0; i < 12; i++) f32[i] = (float)(i - 5) * 0.25f;
    out[0] = (canon){"embed.f32", "F32", CAI_DTYPE_F32, 2, {3, 4}, 0, {0}};
    put_bytes(&out[0], f32, sizeof f32);
    const uint16_t bf16[5] = {0x3F80, 0xC020, 0x4049, 0x3C00, 0x8000}; /* 1, -2.5, 3.140625, 2^-7, -0 */
    out[1] = (canon){"norm.bf16", "BF16", CAI_DTYPE_BF16, 1, {5, 0}, 0, {0}};
    put_bytes(&out[1], bf16, sizeof bf16);
    const uint16_t f16[4] = {0x3800, 0xBC00, 0x7BFF, 0x0001}; /* 0.5, -1, 65504, 2^-24 */
    out[2] = (canon){"half.f16", "F16", CAI_DTYPE_F16, 2, {2, 2}, 0, {0}};
    put_bytes(&out[2], f16, sizeof f16);
    const double f64[2] = {M_PI, -1e300};
    out[3] = (canon){"double.f64", "F64", CAI_DTYPE_F64, 1, {2, 0}, 0, {0}};
    put_bytes(&out[3], f64, sizeof f64);
    const int64_t i64[3] = {-1, (int64_t)1 << 40, 7};
    out[4] = (canon){"ids.i64", "I64", CAI_DTYPE_I64, 1, {3, 0}, 0, {0}};
    put_bytes(&out[4], i64, sizeof i64);
    const int32_t i32[2] = {-7, 2147483647};
    out[5] = (canon){"pos.i32", "I32", CAI_DTYPE_I32, 2, {2, 1}, 0, {0}};
    put_bytes(&out[5], i32, sizeof i32);
    const uint8_t u8[4] = {0, 1, 254, 255};
    out[6] = (canon){"bytes.u8", "U8", CAI_DTYPE_U8, 1, {4, 0}, 0, {0}};
    put_bytes(&out[6], u8, sizeof u8);
    const float scalar = 42.0f;
    out[7] = (canon){"scalar.f32", "F32", CAI_DTYPE_F32, 0, {0, 0}, 0, {0}};
    put_bytes(&out[7], &scalar, sizeof scalar);
    out[8] = (canon){"empty.f32", "F32", CAI_DTYPE_F32, 2, {0, 3}, 0, {0}};
    const uint8_t mask[3] = {1, 0, 1};
    out[9] = (canon){"mask.bool", "BOOL", CAI_DTYPE_COUNT, 1, {3, 0}, 0, {0}};
    put_bytes(&out[9], mask, sizeof mask);
    const int8_t i8[2] = {-128, 127};
    out[10] = (canon){"q.i8", "I8", CAI_DTYPE_COUNT, 1, {2, 0}, 0, {0}};
    put_bytes(&out[10], i8, sizeof i8);
}

/* Tensors colossal can write, as writer descriptors. */
static int writable(const canon *c, cai_st_tensor *t) {
    int n = 0;
    for (int i = 0; i < N_CANON; i++) {
        if (c[i].dtype == CAI_DTYPE_COUNT) continue;
        memset(&t[n], 0, sizeof t[n]);
        t[n].name = c[i].name;
        t[n].dtype = c[i].dtype;
        t[n].ndim = c[i].ndim;
        for (int d = 0; d < c[i].ndim; d++) t[n].shape[d] = c[i].shape[d];
        t[n].data = c[i].bytes;
        n++;
    }
    return n;
}

/* Every tensor in the file is a canonical one with identical dtype, shape and bytes. */
static void check_against_canonical(const cai_safetensors_t *st, int expect_count) {
    canon c[N_CANON];
    canonical(c);
    ck_assert_int_eq(cai_safetensors_count(st), expect_count);
    for (int i = 0; i < N_CANON; i++) {
        const cai_st_entry *e = cai_safetensors_find(st, c[i].name);
        if (!e) {
            ck_assert_msg(c[i].dtype == CAI_DTYPE_COUNT || expect_count == N_CANON, "%s missing", c[i].name);
            continue;
        }
        ck_assert_str_eq(e->dtype_name, c[i].st_dtype);
        ck_assert_int_eq(e->dtype, c[i].dtype);
        ck_assert_int_eq(e->ndim, c[i].ndim);
        for (int d = 0; d < c[i].ndim; d++) ck_assert_uint_eq(e->shape[d], c[i].shape[d]);
        ck_assert_uint_eq(e->end - e->begin, c[i].nbytes);
        if (c[i].nbytes) ck_assert_mem_eq(e->data, c[i].bytes, c[i].nbytes);
    }
    ck_assert_str_eq(cai_safetensors_meta(st, "format"), "pt");
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int count_tmp_files(void) {
    int n = 0;
    DIR *d = opendir(g_dir);
    struct dirent *ent;
    while (d && (ent = readdir(d)))
        if (strstr(ent->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

/* ------------------------------------------------------------ writer */

START_TEST(round_trip_every_dtype) {
    canon c[N_CANON];
    canonical(c);
    cai_st_tensor t[N_CANON + 1];
    int n = writable(c, t);
    const uint16_t u16[3] = {0, 1, 65535};
    t[n] = (cai_st_tensor){.name = "extra.u16", .dtype = CAI_DTYPE_U16, .ndim = 1, .shape = {3}, .data = u16};
    n++;
    char path[512];
    path_in(path, sizeof path, "round.safetensors");
    cai_st_meta meta[2] = {{"step", "10"}, {"format", "pt"}};
    ck_assert_msg(cai_safetensors_write(path, t, n, meta, 2) == CAI_OK, "%s", cai_error_message());
    ck_assert_int_eq(count_tmp_files(), 0);

    cai_safetensors_t *st = NULL;
    ck_assert_msg(cai_safetensors_open(&st, path) == CAI_OK, "%s", cai_error_message());
    check_against_canonical(st, n);
    const cai_st_entry *e = cai_safetensors_find(st, "extra.u16");
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->dtype, CAI_DTYPE_U16);
    ck_assert_mem_eq(e->data, u16, sizeof u16);
    ck_assert_str_eq(cai_safetensors_meta(st, "step"), "10");
    ck_assert_int_eq(cai_safetensors_meta_count(st), 2);
    ck_assert_ptr_null(cai_safetensors_find(st, "nope"));
    ck_assert_int_eq(cai_safetensors_get(st, "nope", &e), CAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "no tensor named 'nope'"));
    /* Entries come in data order. */
    for (int i = 1; i < cai_safetensors_count(st); i++)
        ck_assert_uint_eq(cai_safetensors_entry(st, i)->begin, cai_safetensors_entry(st, i - 1)->end);

    float back[12];
    const uint64_t shp[2] = {3, 4}, wrong[2] = {4, 3};
    ck_assert_int_eq(cai_safetensors_read(st, "embed.f32", CAI_DTYPE_F32, 2, shp, back), CAI_OK);
    ck_assert_mem_eq(back, c[0].bytes, sizeof back);
    ck_assert_int_eq(cai_safetensors_read(st, "embed.f32", CAI_DTYPE_F32, 2, wrong, back), CAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "tensor 'embed.f32' is F32 [3,4] but F32 [4,3] was expected"));
    ck_assert_int_eq(cai_safetensors_read(st, "embed.f32", CAI_DTYPE_BF16, 2, shp, back), CAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "is F32 [3,4] but BF16 [3,4]"));
    cai_safetensors_close(st);

    /* The bytes on disk, checked without the reader: 8-byte aligned header,
     * space padding, offsets tiling the data, each tensor aligned to its size. */
    size_t len;
    unsigned char *raw = slurp(path, &len);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | raw[i];
    ck_assert_uint_eq((8 + hn) % 8, 0);
    ck_assert_int_eq(raw[8], '{');
    json_error_t jerr;
    json_t *root = json_loadb((const char *)raw + 8, hn, 0, &jerr);
    ck_assert_msg(root != NULL, "%s", jerr.text);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "__metadata__"), "format")), "pt");
    ck_assert_int_eq((int)json_object_size(root), n + 1);
    uint64_t covered = 0;
    for (int i = 0; i < n; i++) {
        json_t *ent = json_object_get(root, t[i].name);
        ck_assert_ptr_nonnull(ent);
        uint64_t b = (uint64_t)json_integer_value(json_array_get(json_object_get(ent, "data_offsets"), 0));
        uint64_t en = (uint64_t)json_integer_value(json_array_get(json_object_get(ent, "data_offsets"), 1));
        ck_assert_str_eq(json_string_value(json_object_get(ent, "dtype")), cai_safetensors_dtype_name(t[i].dtype));
        ck_assert_uint_eq(json_array_size(json_object_get(ent, "shape")), (size_t)t[i].ndim);
        ck_assert_uint_eq(b % cai_dtype_size(t[i].dtype), 0);
        ck_assert_uint_le(8 + hn + en, len);
        if (en > b) ck_assert_mem_eq(raw + 8 + hn + b, t[i].data, en - b);
        covered += en - b;
    }
    ck_assert_uint_eq(8 + hn + covered, len);
    uint64_t last = 8 + hn - 1; /* the JSON ends in '}', then fewer than 8 spaces of padding */
    while (raw[last] == ' ') last--;
    ck_assert_int_eq(raw[last], '}');
    ck_assert_uint_lt(8 + hn - 1 - last, 8);
    json_decref(root);
    free(raw);
}
END_TEST

START_TEST(streaming_writer_takes_tensors_in_any_order) {
    canon c[N_CANON];
    canonical(c);
    cai_st_tensor t[N_CANON];
    int n = writable(c, t);
    char path[512];
    path_in(path, sizeof path, "stream.safetensors");
    cai_st_writer_t *w = NULL;
    ck_assert_int_eq(cai_safetensors_writer_open(&w, path, t, n, NULL, 0), CAI_OK);
    ck_assert_int_eq(access(path, F_OK), -1); /* nothing visible until close */
    for (int i = n - 1; i >= 0; i--) ck_assert_int_eq(cai_safetensors_writer_put(w, t[i].name, t[i].data), CAI_OK);
    ck_assert_int_eq(cai_safetensors_writer_put(w, t[0].name, t[0].data), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "'embed.f32' was already written"));
    ck_assert_int_eq(cai_safetensors_writer_put(w, "ghost", t[0].data), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "'ghost' was not declared"));
    ck_assert_int_eq(cai_safetensors_writer_close(w), CAI_OK);
    cai_safetensors_t *st = NULL;
    ck_assert_int_eq(cai_safetensors_open(&st, path), CAI_OK);
    check_against_canonical(st, n);
    cai_safetensors_close(st);

    /* A tensor never put: close fails, leaves no file behind. */
    path_in(path, sizeof path, "partial.safetensors");
    ck_assert_int_eq(cai_safetensors_writer_open(&w, path, t, n, NULL, 0), CAI_OK);
    ck_assert_int_eq(cai_safetensors_writer_put(w, t[1].name, t[1].data), CAI_OK);
    ck_assert_int_eq(cai_safetensors_writer_close(w), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "was declared but never written"));
    ck_assert_int_eq(access(path, F_OK), -1);
    ck_assert_int_eq(count_tmp_files(), 0);
    cai_error_clear();
}
END_TEST

START_TEST(writer_rejects_bad_requests) {
    float x[2] = {1, 2};
    cai_st_tensor t[2] = {{.name = "a", .dtype = CAI_DTYPE_F32, .ndim = 1, .shape = {2}, .data = x},
                          {.name = "a", .dtype = CAI_DTYPE_F32, .ndim = 1, .shape = {2}, .data = x}};
    char path[512];
    path_in(path, sizeof path, "bad.safetensors");
    ck_assert_int_eq(cai_safetensors_write(path, t, 2, NULL, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "tensor name 'a' is used twice"));
    cai_st_meta m = {"format", "tf"};
    ck_assert_int_eq(cai_safetensors_write(path, t, 1, &m, 1), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "metadata format 'tf' would be rejected by transformers"));
    t[0].name = "__metadata__";
    ck_assert_int_eq(cai_safetensors_write(path, t, 1, NULL, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "'__metadata__' is reserved"));
    t[0].name = "a";
    t[0].ndim = 9;
    ck_assert_int_eq(cai_safetensors_write(path, t, 1, NULL, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "has 9 dims"));
    ck_assert_int_eq(access(path, F_OK), -1);
    ck_assert_int_eq(count_tmp_files(), 0);
    /* Zero tensors is a valid file. */
    ck_assert_int_eq(cai_safetensors_write(path, NULL, 0, NULL, 0), CAI_OK);
    cai_safetensors_t *st = NULL;
    ck_assert_int_eq(cai_safetensors_open(&st, path), CAI_OK);
    ck_assert_int_eq(cai_safetensors_count(st), 0);
    cai_safetensors_close(st);
    cai_error_clear();
}
END_TEST

/* ------------------------------------------------------------ reader strictness */

/* Writes 8-byte length (header_len, or the JSON's length when UINT64_MAX),
 * the JSON, then data_len bytes of data. */
static void write_raw(const char *path, const char *json, uint64_t header_len, size_t data_len) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t n = header_len == UINT64_MAX ? strlen(json) : header_len;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(n >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(json, 1, strlen(json), f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

static void expect_rejected(const char *json, uint64_t header_len, size_t data_len, cai_status want,
                            const char *message) {
    static int k;
    char path[512], name[64];
    snprintf(name, sizeof name, "corrupt%d.safetensors", k++);
    path_in(path, sizeof path, name);
    write_raw(path, json, header_len, data_len);
    cai_safetensors_t *st = (cai_safetensors_t *)&k; /* must be reset to NULL */
    cai_error_clear();
    cai_status got = cai_safetensors_open(&st, path);
    ck_assert_msg(got == want, "%s: got status %d (%s), want %d", message, got, cai_error_message(), want);
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(cai_error_message(), message), "message '%s' lacks '%s'", cai_error_message(), message);
    ck_assert_msg(strstr(cai_error_message(), path), "message '%s' does not name the file", cai_error_message());
}

#define T1(name, dt, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}"

START_TEST(corrupt_files_are_rejected_with_the_reason) {
    /* Length and framing. */
    char path[512];
    path_in(path, sizeof path, "short.safetensors");
    FILE *f = fopen(path, "wb");
    fwrite("\x10\0\0", 1, 3, f);
    fclose(f);
    cai_safetensors_t *st = NULL;
    ck_assert_int_eq(cai_safetensors_open(&st, path), CAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "file is 3 bytes, shorter than the 8-byte header length"));
    ck_assert_ptr_nonnull(strstr(cai_error_message(), path));
    path_in(path, sizeof path, "empty.safetensors");
    f = fopen(path, "wb");
    fclose(f);
    ck_assert_int_eq(cai_safetensors_open(&st, path), CAI_ERR_FORMAT);
    ck_assert_msg(strstr(cai_error_message(), "file is empty (0 bytes)") && strstr(cai_error_message(), path), "%s",
                  cai_error_message());
    path_in(path, sizeof path, "missing.safetensors");
    ck_assert_int_eq(cai_safetensors_open(&st, path), CAI_ERR_IO);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "cannot open safetensors file"));

    const char *good = "{" T1("a", "F32", "[2]", "0", "8") "}";
    expect_rejected(good, 1000, 8, CAI_ERR_FORMAT, "header length 1000 exceeds the");
    expect_rejected(good, (uint64_t)1 << 62, 8, CAI_ERR_FORMAT, "exceeds the");
    expect_rejected(good, 1000, 8, CAI_ERR_FORMAT, "header length past the end of the file");
    expect_rejected(good, UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "tensor 'a': data_offsets [0, 8) out of range: the file holds 4 data bytes");
    expect_rejected(good, UINT64_MAX, 12, CAI_ERR_FORMAT, "4 trailing bytes after the last tensor");
    expect_rejected("[1, 2]", UINT64_MAX, 0, CAI_ERR_FORMAT, "header does not start with '{'");
    expect_rejected("", UINT64_MAX, 0, CAI_ERR_FORMAT, "header does not start with '{'");
    /* not a JSON object: named by what it is instead */
    expect_rejected("[1, 2]", UINT64_MAX, 0, CAI_ERR_FORMAT,
                    "header is not a JSON object: it starts with a JSON array");
    expect_rejected("42", UINT64_MAX, 0, CAI_ERR_FORMAT, "header is not a JSON object: it starts with a JSON number");
    expect_rejected("\xef\xbb\xbf{" T1("a", "F32", "[1]", "0", "4") "}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "header is not a JSON object: it starts with a UTF-8 byte-order mark (EF BB BF)");
    expect_rejected("", UINT64_MAX, 0, CAI_ERR_FORMAT, "header is not a JSON object: the header length is 0");

    /* JSON syntax and structure. */
    expect_rejected("{\"a\": {\"dtype\": \"F32\",", UINT64_MAX, 0, CAI_ERR_FORMAT, "header is not valid JSON");
    expect_rejected("{" T1("a", "F32", "[1]", "0", "4") "} x", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "header is not valid JSON");
    expect_rejected("{" T1("a", "F32", "[1]", "0", "4") "," T1("a", "F32", "[1]", "4", "8") "}", UINT64_MAX, 8,
                    CAI_ERR_FORMAT, "header is not valid JSON: duplicate object key");
    expect_rejected("{\"a\": 3}", UINT64_MAX, 0, CAI_ERR_FORMAT, "tensor 'a': entry is not a JSON object");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "tensor 'a': missing field 'shape'");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", UINT64_MAX, 4,
                    CAI_ERR_FORMAT, "tensor 'a': unexpected field 'x'");
    expect_rejected("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "tensor 'a': field 'dtype' is not a string");
    expect_rejected("{" T1("a", "F128", "[1]", "0", "4") "}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "tensor 'a': unknown dtype 'F128'");
    expect_rejected("{" T1("a", "F4", "[2]", "0", "1") "}", UINT64_MAX, 1, CAI_ERR_UNSUPPORTED,
                    "tensor 'a': sub-byte dtype 'F4' is not supported");
    expect_rejected("{" T1("a", "F32", "[-1]", "0", "4") "}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "tensor 'a': shape[0] is not a non-negative integer");
    expect_rejected("{" T1("a", "F32", "[1.0]", "0", "4") "}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "tensor 'a': shape[0] is not a non-negative integer");
    expect_rejected("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "tensor 'a': data_offsets has 1 entries");
    expect_rejected("{" T1("a", "F32", "[1]", "8", "4") "}", UINT64_MAX, 8, CAI_ERR_FORMAT,
                    "tensor 'a': data_offsets [8, 4) end before they begin");
    expect_rejected("{\"__metadata__\":{\"format\":\"pt\",\"n\":3}," T1("a", "F32", "[1]", "0", "4") "}", UINT64_MAX, 4,
                    CAI_ERR_FORMAT, "'__metadata__' key 'n' is not a string");
    expect_rejected("{\"__metadata__\":[]}", UINT64_MAX, 0, CAI_ERR_FORMAT, "'__metadata__' is not a JSON object");
    expect_rejected("{\"__metadata__\":{\"format\":\"tf\"}," T1("a", "F32", "[1]", "0", "4") "}", UINT64_MAX, 4,
                    CAI_ERR_FORMAT, "'__metadata__.format' is \"tf\"; only \"pt\" is accepted");
    expect_rejected("{" T1("", "F32", "[1]", "0", "4") "}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "a tensor has an empty name");
    /* integers of 2^64: a format message, not the JSON library's */
    expect_rejected("{" T1("a", "F32", "[18446744073709551616]", "0", "4") "}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "an integer in 'shape' near byte");
    expect_rejected("{" T1("a", "F32", "[1]", "0", "18446744073709551616") "}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "an integer in 'data_offsets' near byte");
    expect_rejected("{" T1("a", "F32", "[1]", "0", "9223372036854775807") "}", UINT64_MAX, 4, CAI_ERR_FORMAT,
                    "tensor 'a': shape [1] of F32 needs 4 bytes but data_offsets");

    /* Sizes and the tiling of the data section. */
    expect_rejected("{" T1("w", "F32", "[3]", "0", "8") "}", UINT64_MAX, 8, CAI_ERR_FORMAT,
                    "tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 8) hold 8");
    expect_rejected("{" T1("w", "BF16", "[2,2]", "0", "16") "}", UINT64_MAX, 16, CAI_ERR_FORMAT,
                    "tensor 'w': shape [2,2] of BF16 needs 8 bytes");
    expect_rejected("{" T1("w", "F32", "[4294967296,4294967296]", "0", "8") "}", UINT64_MAX, 8, CAI_ERR_FORMAT,
                    "overflows 64 bits");
    expect_rejected("{" T1("a", "F32", "[2]", "0", "8") "," T1("b", "F32", "[2]", "4", "12") "}", UINT64_MAX, 12,
                    CAI_ERR_FORMAT, "tensor 'b' at data_offsets [4, 12) overlaps tensor 'a' which ends at 8");
    expect_rejected("{" T1("a", "F32", "[1]", "0", "4") "," T1("b", "F32", "[1]", "8", "12") "}", UINT64_MAX, 12,
                    CAI_ERR_FORMAT, "data bytes [4, 8) before tensor 'b' belong to no tensor (gap)");
    expect_rejected("{" T1("a", "F32", "[1]", "4", "8") "}", UINT64_MAX, 8, CAI_ERR_FORMAT,
                    "data bytes [0, 4) before tensor 'a' belong to no tensor");
    cai_error_clear();
}
END_TEST

START_TEST(foreign_but_valid_files_are_accepted) {
    /* Unpadded header, unaligned data, dtypes colossal cannot compute with,
     * an empty tensor between two others, no metadata at all. */
    char path[512];
    path_in(path, sizeof path, "foreign.safetensors");
    write_raw(path,
              "{" T1("m", "BOOL", "[3]", "0", "3") "," T1("z", "F32", "[0]", "3", "3") "," T1("h", "F16", "[2]", "3",
                                                                                              "7") "}",
              UINT64_MAX, 7);
    cai_safetensors_t *st = NULL;
    ck_assert_msg(cai_safetensors_open(&st, path) == CAI_OK, "%s", cai_error_message());
    ck_assert_int_eq(cai_safetensors_count(st), 3);
    const cai_st_entry *m = cai_safetensors_find(st, "m"), *h = cai_safetensors_find(st, "h");
    ck_assert_int_eq(m->dtype, CAI_DTYPE_COUNT);
    ck_assert_str_eq(m->dtype_name, "BOOL");
    ck_assert_int_eq(h->dtype, CAI_DTYPE_F16);
    const unsigned char want[4] = {3, 4, 5, 6}; /* write_raw's data bytes are their own positions */
    ck_assert_mem_eq(h->data, want, 4);
    ck_assert_ptr_null(cai_safetensors_meta(st, "format"));
    cai_safetensors_close(st);
}
END_TEST

/* ------------------------------------------------------------ reference library */

static int python_has_reference(void) {
    return system("python3 -c 'import safetensors.torch, torch' >/dev/null 2>&1") == 0;
}

START_TEST(interop_with_the_reference_library) {
    const char *src = getenv("top_srcdir");
    char script[1024], fixture[1024], ours[512], theirs[512];
    snprintf(script, sizeof script, "%s/tests/data/safetensors/reference.py", src ? src : "..");
    snprintf(fixture, sizeof fixture, "%s/tests/data/safetensors/torch_written.safetensors", src ? src : "..");

    /* A file the reference library wrote (torch 2.11, committed). */
    cai_safetensors_t *st = NULL;
    if (access(fixture, R_OK) == 0) {
        ck_assert_msg(cai_safetensors_open(&st, fixture) == CAI_OK, "%s", cai_error_message());
        check_against_canonical(st, N_CANON);
        ck_assert_str_eq(cai_safetensors_meta(st, "producer"), "safetensors.torch");
        cai_safetensors_close(st);
    } else {
        fprintf(stderr, "test_safetensors: %s not found; committed-fixture check skipped\n", fixture);
    }

    /* Our file, for the reference reader (CAI_SAFETENSORS_EXPORT keeps a copy for a remote check). */
    canon c[N_CANON];
    canonical(c);
    cai_st_tensor t[N_CANON];
    int n = writable(c, t);
    path_in(ours, sizeof ours, "ours.safetensors");
    ck_assert_int_eq(cai_safetensors_write(ours, t, n, NULL, 0), CAI_OK);
    const char *export_path = getenv("CAI_SAFETENSORS_EXPORT");
    if (export_path) ck_assert_int_eq(cai_safetensors_write(export_path, t, n, NULL, 0), CAI_OK);

    if (!python_has_reference()) {
        fprintf(stderr, "test_safetensors: python3 lacks safetensors/torch; live reference check skipped\n");
        return;
    }
    path_in(theirs, sizeof theirs, "theirs.safetensors");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "python3 '%s' --write '%s' --check '%s'", script, theirs, ours);
    ck_assert_msg(system(cmd) == 0, "reference check failed: %s", cmd);
    ck_assert_int_eq(cai_safetensors_open(&st, theirs), CAI_OK);
    check_against_canonical(st, N_CANON);
    cai_safetensors_close(st);
}
END_TEST

static void remove_dir(void) {
    DIR *d = opendir(g_dir);
    struct dirent *ent;
    char path[512];
    while (d && (ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        path_in(path, sizeof path, ent->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(g_dir);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    snprintf(g_dir, sizeof g_dir, "%s/cai_st_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        MPI_Finalize();
        return 1;
    }
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, round_trip_every_dtype);
    tcase_add_test(tc, streaming_writer_takes_tensors_in_any_order);
    tcase_add_test(tc, writer_rejects_bad_requests);
    tcase_add_test(tc, corrupt_files_are_rejected_with_the_reason);
    tcase_add_test(tc, foreign_but_valid_files_are_accepted);
    tcase_add_test(tc, interop_with_the_reference_library);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    remove_dir();
    MPI_Finalize();
    return failed ? 1 : 0;
}
