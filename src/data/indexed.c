/* Megatron-LM indexed datasets (MMIDIDX): an mmap reader that validates
 * everything up front, so later reads never see inconsistent arrays, and a
 * builder that writes the same bytes Megatron's IndexedDatasetBuilder does.
 * The .idx arrays start at byte 34, so they are unaligned: every element is
 * loaded with memcpy instead of through a cast pointer. */
#include "cai_config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "colossal/data.h"

static const unsigned char k_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

/* ------------------------------------------------------------------ tokens */

cai_status cai_byte_tokenize(void *ctx, const char *text, size_t len, cai_token_buf *out) {
    (void)ctx;
    int32_t chunk[1024];
    const unsigned char *u = (const unsigned char *)text;
    for (size_t i = 0; i < len; i += 1024) {
        const size_t n = len - i < 1024 ? len - i : 1024;
        for (size_t k = 0; k < n; k++) chunk[k] = u[i + k];
        CAI_CALL(cai_token_buf_append(out, chunk, n));
    }
    return CAI_OK;
}

cai_status cai_byte_detokenize(const int32_t *ids, size_t n, cai_byte_buf *out) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == CAI_BYTE_EOD) continue;
        if (ids[i] < 0 || ids[i] >= 256)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "byte-level decode: id %d at %zu is not a byte", ids[i], i);
        if (out->len + 2 > out->cap) {
            size_t cap = out->cap ? 2 * out->cap : 256;
            char *p = realloc(out->data, cap);
            if (!p) return CAI_ERROR(CAI_ERR_NOMEM, "decoded text of %zu bytes", cap);
            out->data = p;
            out->cap = cap;
        }
        out->data[out->len++] = (char)ids[i];
    }
    return CAI_OK;
}

/* ------------------------------------------------------------------ dtypes */

size_t cai_indexed_dtype_size(int code) {
    switch (code) {
    case CAI_INDEXED_U8:
    case CAI_INDEXED_I8: return 1;
    case CAI_INDEXED_I16:
    case CAI_INDEXED_U16: return 2;
    case CAI_INDEXED_I32:
    case CAI_INDEXED_F32: return 4;
    case CAI_INDEXED_I64:
    case CAI_INDEXED_F64: return 8;
    default: return 0;
    }
}

const char *cai_indexed_dtype_name(int code) {
    switch (code) {
    case CAI_INDEXED_U8: return "uint8";
    case CAI_INDEXED_I8: return "int8";
    case CAI_INDEXED_I16: return "int16";
    case CAI_INDEXED_I32: return "int32";
    case CAI_INDEXED_I64: return "int64";
    case CAI_INDEXED_F64: return "float64";
    case CAI_INDEXED_F32: return "float32";
    case CAI_INDEXED_U16: return "uint16";
    default: return "?";
    }
}

cai_indexed_dtype cai_indexed_dtype_for_vocab(int64_t vocab_size) {
    return vocab_size > 0 && vocab_size < 65500 ? CAI_INDEXED_U16 : CAI_INDEXED_I32;
}

static int dtype_is_integer(int code) {
    return code != CAI_INDEXED_F32 && code != CAI_INDEXED_F64 && cai_indexed_dtype_size(code);
}

/* Token `i` of a .bin region as int64 (the widest integer type). */
static inline int64_t load_token(const unsigned char *p, int code, int64_t i) {
    switch (code) {
    case CAI_INDEXED_U8: return p[i];
    case CAI_INDEXED_I8: return (int8_t)p[i];
    case CAI_INDEXED_I16: {
        int16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case CAI_INDEXED_U16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case CAI_INDEXED_I32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    default: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    }
}

static void dtype_range(int code, int64_t *lo, int64_t *hi) {
    switch (code) {
    case CAI_INDEXED_U8:
        *lo = 0;
        *hi = UINT8_MAX;
        break;
    case CAI_INDEXED_I8:
        *lo = INT8_MIN;
        *hi = INT8_MAX;
        break;
    case CAI_INDEXED_I16:
        *lo = INT16_MIN;
        *hi = INT16_MAX;
        break;
    case CAI_INDEXED_U16:
        *lo = 0;
        *hi = UINT16_MAX;
        break;
    case CAI_INDEXED_I32:
        *lo = INT32_MIN;
        *hi = INT32_MAX;
        break;
    default:
        *lo = INT64_MIN;
        *hi = INT64_MAX;
        break;
    }
}

/* ------------------------------------------------------------------ reader */

struct cai_indexed_dataset {
    char *prefix, *idx_path, *bin_path;
    const unsigned char *idx; /* whole .idx mapping */
    size_t idx_size;
    const unsigned char *bin; /* whole .bin mapping (NULL when empty) */
    size_t bin_size;
    int dtype;
    size_t itemsize;
    int64_t n_seq, n_doc_entries; /* S and D from the header */
    const unsigned char *lengths, *pointers, *docs;
    int64_t n_tokens;
};

static char *join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

static cai_status map_file(const char *path, const unsigned char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CAI_ERROR(CAI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return CAI_ERROR(CAI_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return CAI_ERROR(CAI_ERR_IO, "%s: not a regular file", path);
    }
    *size = (size_t)st.st_size;
    if (*size > 0) {
        void *p = mmap(NULL, *size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return CAI_ERROR(CAI_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, *size, strerror(e));
        }
        *data = p;
    }
    close(fd); /* the mapping keeps the file alive */
    return CAI_OK;
}

static inline int32_t ld_i32(const unsigned char *p, int64_t i) {
    int32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}
static inline int64_t ld_i64(const unsigned char *p, int64_t i) {
    int64_t v;
    memcpy(&v, p + 8 * i, 8);
    return v;
}

/* Header and array sizes against the .idx size. */
static cai_status validate_header(cai_indexed_dataset_t *ds) {
    const char *f = ds->idx_path;
    if (ds->idx_size < CAI_INDEXED_HEADER_BYTES)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: truncated header: %zu bytes, the header alone is %d", f, ds->idx_size,
                         CAI_INDEXED_HEADER_BYTES);
    if (memcmp(ds->idx, k_magic, sizeof k_magic) != 0)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: bad magic: not a Megatron MMIDIDX index (expected \"MMIDIDX\\0\\0\")", f);
    uint64_t version, s, d;
    memcpy(&version, ds->idx + 9, 8);
    if (version != 1)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: version is %llu, only version 1 is defined", f,
                         (unsigned long long)version);
    ds->dtype = ds->idx[17];
    ds->itemsize = cai_indexed_dtype_size(ds->dtype);
    if (!ds->itemsize)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: dtype code %d is unknown (Megatron's codes are 1..8)", f, ds->dtype);
    if (!dtype_is_integer(ds->dtype))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: dtype code %d (%s) is not an integer type; token data needs one", f,
                         ds->dtype, cai_indexed_dtype_name(ds->dtype));
    memcpy(&s, ds->idx + 18, 8);
    memcpy(&d, ds->idx + 26, 8);
    /* 12 bytes per sequence + 8 per document entry must not overflow */
    const uint64_t room = (uint64_t)ds->idx_size - CAI_INDEXED_HEADER_BYTES;
    if (s > room / 12)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "%s: sequence count %llu needs %llu bytes of lengths and pointers but the file has %llu after "
                         "the header (truncated arrays or a corrupt count)",
                         f, (unsigned long long)s, (unsigned long long)(s > UINT64_MAX / 12 ? UINT64_MAX : s * 12),
                         (unsigned long long)room);
    if (d > (room - 12 * s) / 8)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "%s: document count %llu needs %llu bytes of document indices but only %llu remain after "
                         "%llu sequences (truncated arrays or a corrupt count)",
                         f, (unsigned long long)d, (unsigned long long)(d > UINT64_MAX / 8 ? UINT64_MAX : d * 8),
                         (unsigned long long)(room - 12 * s), (unsigned long long)s);
    const uint64_t want = CAI_INDEXED_HEADER_BYTES + 12 * s + 8 * d;
    /* Megatron's multimodal indexes append one int8 mode per sequence. */
    if ((uint64_t)ds->idx_size != want && (uint64_t)ds->idx_size != want + s)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: %zu bytes, but %llu sequences and %llu document entries make %llu (%s)",
                         f, ds->idx_size, (unsigned long long)s, (unsigned long long)d, (unsigned long long)want,
                         (uint64_t)ds->idx_size < want ? "truncated arrays" : "trailing bytes");
    if (d < 1)
        return CAI_ERROR(
            CAI_ERR_FORMAT,
            "%s: document count is 0; the document indices always hold a leading 0 (count = documents + 1)", f);
    ds->n_seq = (int64_t)s;
    ds->n_doc_entries = (int64_t)d;
    ds->lengths = ds->idx + CAI_INDEXED_HEADER_BYTES;
    ds->pointers = ds->lengths + 4 * s;
    ds->docs = ds->pointers + 8 * s;
    return CAI_OK;
}

static cai_status validate_arrays(cai_indexed_dataset_t *ds) {
    const char *f = ds->idx_path;
    const int64_t S = ds->n_seq, D = ds->n_doc_entries;
    int64_t prev = ld_i64(ds->docs, 0);
    if (prev != 0) return CAI_ERROR(CAI_ERR_FORMAT, "%s: document_indices[0] is %lld, must be 0", f, (long long)prev);
    for (int64_t d = 1; d < D; d++) {
        int64_t v = ld_i64(ds->docs, d);
        if (v < prev || v > S)
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "%s: document_indices[%lld] is %lld, outside [%lld, %lld] (must be non-decreasing "
                             "sequence indices)",
                             f, (long long)d, (long long)v, (long long)prev, (long long)S);
        prev = v;
    }
    if (prev != S)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: last document index is %lld but there are %lld sequences", f,
                         (long long)prev, (long long)S);
    int64_t expect = 0, tokens = 0;
    const int64_t isz = (int64_t)ds->itemsize;
    for (int64_t i = 0; i < S; i++) {
        int32_t len = ld_i32(ds->lengths, i);
        int64_t ptr = ld_i64(ds->pointers, i);
        if (len < 0)
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: sequence_lengths[%lld] is %d (negative)", f, (long long)i, len);
        if (ptr < 0 || (uint64_t)ptr > ds->bin_size || (uint64_t)len * (uint64_t)isz > ds->bin_size - (uint64_t)ptr)
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "%s: sequence_pointers[%lld] = %lld with length %d runs past the end of %s (%zu bytes)", f,
                             (long long)i, (long long)ptr, len, ds->bin_path, ds->bin_size);
        if (ptr != expect)
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "%s: sequence_pointers[%lld] is %lld but the lengths before it put it at %lld "
                             "(lengths and pointers inconsistent)",
                             f, (long long)i, (long long)ptr, (long long)expect);
        expect += (int64_t)len * isz;
        tokens += len;
    }
    if ((uint64_t)expect != ds->bin_size)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: %zu bytes, but the index %s describes %lld bytes of %s tokens",
                         ds->bin_path, ds->bin_size, f, (long long)expect, cai_indexed_dtype_name(ds->dtype));
    ds->n_tokens = tokens;
    return CAI_OK;
}

static cai_status validate_tokens(const cai_indexed_dataset_t *ds, int64_t vocab_size) {
    /* Walk sequence by sequence so the error can name the sequence. */
    for (int64_t i = 0; i < ds->n_seq; i++) {
        const unsigned char *p = ds->bin + ld_i64(ds->pointers, i);
        const int32_t len = ld_i32(ds->lengths, i);
        for (int32_t t = 0; t < len; t++) {
            int64_t v = load_token(p, ds->dtype, t);
            if (v < 0 || v >= vocab_size)
                return CAI_ERROR(CAI_ERR_FORMAT,
                                 "%s: token %lld at position %d of sequence %lld is outside the vocabulary [0, %lld)",
                                 ds->bin_path, (long long)v, t, (long long)i, (long long)vocab_size);
        }
    }
    return CAI_OK;
}

cai_status cai_indexed_open(cai_indexed_dataset_t **out, const char *prefix, int64_t vocab_size) {
    CAI_CHECK_ARG(out != NULL && prefix != NULL && *prefix, "cai_indexed_open needs an output and a path prefix");
    *out = NULL;
    cai_indexed_dataset_t *ds = calloc(1, sizeof *ds);
    if (!ds) return CAI_ERROR(CAI_ERR_NOMEM, "indexed dataset handle");
    cai_status st = CAI_OK;
    ds->prefix = join(prefix, "");
    ds->idx_path = join(prefix, ".idx");
    ds->bin_path = join(prefix, ".bin");
    if (!ds->prefix || !ds->idx_path || !ds->bin_path) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "paths for %s", prefix);
        goto fail;
    }
    CAI_CALL_GOTO(map_file(ds->idx_path, &ds->idx, &ds->idx_size), st, fail);
    CAI_CALL_GOTO(map_file(ds->bin_path, &ds->bin, &ds->bin_size), st, fail);
    CAI_CALL_GOTO(validate_header(ds), st, fail);
    CAI_CALL_GOTO(validate_arrays(ds), st, fail);
    if (vocab_size > 0) CAI_CALL_GOTO(validate_tokens(ds, vocab_size), st, fail);
    if (ds->bin) madvise((void *)ds->bin, ds->bin_size, MADV_RANDOM);
    *out = ds;
    return CAI_OK;
fail:
    cai_indexed_free(ds);
    return st;
}

void cai_indexed_free(cai_indexed_dataset_t *ds) {
    if (!ds) return;
    if (ds->idx) munmap((void *)ds->idx, ds->idx_size);
    if (ds->bin) munmap((void *)ds->bin, ds->bin_size);
    free(ds->prefix);
    free(ds->idx_path);
    free(ds->bin_path);
    free(ds);
}

const char *cai_indexed_prefix(const cai_indexed_dataset_t *ds) { return ds->prefix; }
cai_indexed_dtype cai_indexed_get_dtype(const cai_indexed_dataset_t *ds) { return (cai_indexed_dtype)ds->dtype; }
int64_t cai_indexed_num_sequences(const cai_indexed_dataset_t *ds) { return ds->n_seq; }
int64_t cai_indexed_num_documents(const cai_indexed_dataset_t *ds) { return ds->n_doc_entries - 1; }
int64_t cai_indexed_num_tokens(const cai_indexed_dataset_t *ds) { return ds->n_tokens; }
int32_t cai_indexed_sequence_length(const cai_indexed_dataset_t *ds, int64_t i) { return ld_i32(ds->lengths, i); }
int64_t cai_indexed_sequence_pointer(const cai_indexed_dataset_t *ds, int64_t i) { return ld_i64(ds->pointers, i); }
int64_t cai_indexed_document_start(const cai_indexed_dataset_t *ds, int64_t d) { return ld_i64(ds->docs, d); }

cai_status cai_indexed_read(const cai_indexed_dataset_t *ds, int64_t seq, int64_t offset, int64_t count, int32_t *out) {
    CAI_CHECK_ARG(ds && (out || count == 0), "cai_indexed_read: NULL argument");
    CAI_CHECK_ARG(seq >= 0 && seq < ds->n_seq, "%s: sequence %lld out of range [0, %lld)", ds->prefix, (long long)seq,
                  (long long)ds->n_seq);
    const int32_t len = ld_i32(ds->lengths, seq);
    CAI_CHECK_ARG(offset >= 0 && count >= 0 && offset <= len && count <= len - offset,
                  "%s: tokens [%lld, %lld) of sequence %lld, which has %d", ds->prefix, (long long)offset,
                  (long long)(offset + count), (long long)seq, len);
    const unsigned char *p = ds->bin + ld_i64(ds->pointers, seq) + (size_t)offset * ds->itemsize;
    switch (ds->dtype) {
    case CAI_INDEXED_U16:
        for (int64_t i = 0; i < count; i++) out[i] = (int32_t)load_token(p, CAI_INDEXED_U16, i);
        break;
    case CAI_INDEXED_I32: memcpy(out, p, (size_t)count * 4); break;
    case CAI_INDEXED_I64:
        for (int64_t i = 0; i < count; i++) {
            int64_t v = load_token(p, CAI_INDEXED_I64, i);
            if (v < INT32_MIN || v > INT32_MAX)
                return CAI_ERROR(CAI_ERR_FORMAT, "%s: token %lld at position %lld of sequence %lld does not fit int32",
                                 ds->bin_path, (long long)v, (long long)(offset + i), (long long)seq);
            out[i] = (int32_t)v;
        }
        break;
    default:
        for (int64_t i = 0; i < count; i++) out[i] = (int32_t)load_token(p, ds->dtype, i);
    }
    return CAI_OK;
}

/* ------------------------------------------------------------------ builder */

struct cai_indexed_builder {
    char *prefix, *bin_tmp, *idx_tmp;
    FILE *bin;
    int dtype;
    size_t itemsize;
    int64_t lo, hi, vocab;
    int32_t *lengths;
    int64_t n_seq, cap_seq;
    int64_t *docs; /* document indices, docs[0] = 0 */
    int64_t n_docs, cap_docs;
    int64_t n_tokens;
    unsigned char *scratch; /* ids converted to the file dtype */
    size_t scratch_cap;
};

static cai_status grow(void **p, int64_t *cap, int64_t need, size_t elem, const char *what) {
    if (need <= *cap) return CAI_OK;
    int64_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return CAI_ERROR(CAI_ERR_NOMEM, "indexed builder: %lld %s", (long long)c, what);
    *p = q;
    *cap = c;
    return CAI_OK;
}

cai_status cai_indexed_builder_init(cai_indexed_builder_t **out, const char *prefix, cai_indexed_dtype dtype,
                                    int64_t vocab_size) {
    CAI_CHECK_ARG(out && prefix && *prefix, "cai_indexed_builder_init needs an output and a path prefix");
    *out = NULL;
    CAI_CHECK_ARG(dtype_is_integer(dtype), "%s: dtype code %d (%s) is not an integer token type", prefix, (int)dtype,
                  cai_indexed_dtype_name(dtype));
    cai_indexed_builder_t *b = calloc(1, sizeof *b);
    if (!b) return CAI_ERROR(CAI_ERR_NOMEM, "indexed builder");
    cai_status st = CAI_OK;
    b->prefix = join(prefix, "");
    b->bin_tmp = join(prefix, ".bin.tmp");
    b->idx_tmp = join(prefix, ".idx.tmp");
    if (!b->prefix || !b->bin_tmp || !b->idx_tmp) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "paths for %s", prefix);
        goto fail;
    }
    b->dtype = dtype;
    b->itemsize = cai_indexed_dtype_size(dtype);
    dtype_range(dtype, &b->lo, &b->hi);
    b->vocab = vocab_size;
    if (vocab_size > 0) {
        if (b->lo < 0) b->lo = 0;
        if (b->hi > vocab_size - 1) b->hi = vocab_size - 1;
    }
    if (b->hi > INT32_MAX) b->hi = INT32_MAX; /* ids arrive as int32 anyway */
    CAI_CALL_GOTO(grow((void **)&b->docs, &b->cap_docs, 1, sizeof *b->docs, "document indices"), st, fail);
    b->docs[0] = 0;
    b->n_docs = 1;
    b->bin = fopen(b->bin_tmp, "wb");
    if (!b->bin) {
        st = CAI_ERROR(CAI_ERR_IO, "%s: cannot create: %s", b->bin_tmp, strerror(errno));
        goto fail;
    }
    setvbuf(b->bin, NULL, _IOFBF, 1 << 20);
    *out = b;
    return CAI_OK;
fail:
    cai_indexed_builder_abort(b);
    return st;
}

cai_status cai_indexed_builder_add(cai_indexed_builder_t *b, const int32_t *ids, int64_t n) {
    CAI_CHECK_ARG(b && (ids || n == 0) && n >= 0, "cai_indexed_builder_add: bad arguments");
    CAI_CHECK_ARG(n <= INT32_MAX, "%s: a sequence of %lld tokens exceeds the format's int32 length", b->prefix,
                  (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < b->lo || ids[i] > b->hi)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: token id %d (position %lld of sequence %lld) does not fit [%lld, %lld] (%s%s)",
                             b->prefix, ids[i], (long long)i, (long long)b->n_seq, (long long)b->lo, (long long)b->hi,
                             cai_indexed_dtype_name(b->dtype), b->vocab > 0 ? ", vocabulary" : "");
    CAI_CALL(grow((void **)&b->lengths, &b->cap_seq, b->n_seq + 1, sizeof *b->lengths, "sequence lengths"));
    const size_t bytes = (size_t)n * b->itemsize;
    const void *src = ids;
    if (b->dtype != CAI_INDEXED_I32 && n > 0) {
        if (bytes > b->scratch_cap) {
            unsigned char *s = realloc(b->scratch, bytes);
            if (!s) return CAI_ERROR(CAI_ERR_NOMEM, "indexed builder: %zu bytes of scratch", bytes);
            b->scratch = s;
            b->scratch_cap = bytes;
        }
        for (int64_t i = 0; i < n; i++) {
            switch (b->dtype) {
            case CAI_INDEXED_U8: b->scratch[i] = (uint8_t)ids[i]; break;
            case CAI_INDEXED_I8: {
                int8_t v = (int8_t)ids[i];
                memcpy(b->scratch + i, &v, 1);
                break;
            }
            case CAI_INDEXED_I16: {
                int16_t v = (int16_t)ids[i];
                memcpy(b->scratch + 2 * i, &v, 2);
                break;
            }
            case CAI_INDEXED_U16: {
                uint16_t v = (uint16_t)ids[i];
                memcpy(b->scratch + 2 * i, &v, 2);
                break;
            }
            default: {
                int64_t v = ids[i];
                memcpy(b->scratch + 8 * i, &v, 8);
                break;
            }
            }
        }
        src = b->scratch;
    }
    if (n > 0 && fwrite(src, 1, bytes, b->bin) != bytes)
        return CAI_ERROR(CAI_ERR_IO, "%s: write of %zu bytes failed: %s", b->bin_tmp, bytes, strerror(errno));
    b->lengths[b->n_seq++] = (int32_t)n;
    b->n_tokens += n;
    return CAI_OK;
}

cai_status cai_indexed_builder_end_document(cai_indexed_builder_t *b) {
    CAI_CHECK_ARG(b != NULL, "builder is NULL");
    CAI_CALL(grow((void **)&b->docs, &b->cap_docs, b->n_docs + 1, sizeof *b->docs, "document indices"));
    b->docs[b->n_docs++] = b->n_seq;
    return CAI_OK;
}

cai_status cai_indexed_builder_add_document(cai_indexed_builder_t *b, const int32_t *ids, int64_t n) {
    CAI_CALL(cai_indexed_builder_add(b, ids, n));
    CAI_CALL(cai_indexed_builder_end_document(b));
    return CAI_OK;
}

cai_status cai_indexed_builder_append(cai_indexed_builder_t *b, const cai_indexed_dataset_t *ds) {
    CAI_CHECK_ARG(b && ds, "cai_indexed_builder_append: NULL argument");
    CAI_CHECK_ARG(ds->dtype == b->dtype, "%s: cannot append %s (%s) to a %s dataset", b->prefix, ds->prefix,
                  cai_indexed_dtype_name(ds->dtype), cai_indexed_dtype_name(b->dtype));
    CAI_CHECK_ARG(b->docs[b->n_docs - 1] == b->n_seq,
                  "%s: a document is still open (%lld sequences after the last end_document); end it first", b->prefix,
                  (long long)(b->n_seq - b->docs[b->n_docs - 1]));
    const int64_t S = ds->n_seq, D = ds->n_doc_entries;
    CAI_CHECK_ARG(S <= INT64_MAX - b->n_seq, "%s: too many sequences", b->prefix);
    if (b->vocab > 0)
        for (int64_t i = 0; i < S; i++) {
            const unsigned char *p = ds->bin + ld_i64(ds->pointers, i);
            for (int32_t t = 0; t < ld_i32(ds->lengths, i); t++) {
                int64_t v = load_token(p, ds->dtype, t);
                if (v < b->lo || v > b->hi)
                    return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: token %lld of sequence %lld does not fit [%lld, %lld]",
                                     ds->bin_path, (long long)v, (long long)i, (long long)b->lo, (long long)b->hi);
            }
        }
    CAI_CALL(grow((void **)&b->lengths, &b->cap_seq, b->n_seq + S, sizeof *b->lengths, "sequence lengths"));
    CAI_CALL(grow((void **)&b->docs, &b->cap_docs, b->n_docs + D - 1, sizeof *b->docs, "document indices"));
    for (int64_t i = 0; i < S; i++) b->lengths[b->n_seq + i] = ld_i32(ds->lengths, i);
    for (int64_t d = 1; d < D; d++) b->docs[b->n_docs++] = b->n_seq + ld_i64(ds->docs, d);
    b->n_seq += S;
    b->n_tokens += ds->n_tokens;
    if (ds->bin_size && fwrite(ds->bin, 1, ds->bin_size, b->bin) != ds->bin_size)
        return CAI_ERROR(CAI_ERR_IO, "%s: write of %zu bytes failed: %s", b->bin_tmp, ds->bin_size, strerror(errno));
    return CAI_OK;
}

int64_t cai_indexed_builder_num_tokens(const cai_indexed_builder_t *b) { return b ? b->n_tokens : 0; }

static cai_status write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n)
        return CAI_ERROR(CAI_ERR_IO, "%s: write of %zu bytes failed: %s", path, n, strerror(errno));
    return CAI_OK;
}

static cai_status write_index(cai_indexed_builder_t *b) {
    FILE *f = fopen(b->idx_tmp, "wb");
    if (!f) return CAI_ERROR(CAI_ERR_IO, "%s: cannot create: %s", b->idx_tmp, strerror(errno));
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    cai_status st = CAI_OK;
    unsigned char hdr[CAI_INDEXED_HEADER_BYTES];
    const uint64_t version = 1, s = (uint64_t)b->n_seq, d = (uint64_t)b->n_docs;
    memcpy(hdr, k_magic, 9);
    memcpy(hdr + 9, &version, 8);
    hdr[17] = (unsigned char)b->dtype;
    memcpy(hdr + 18, &s, 8);
    memcpy(hdr + 26, &d, 8);
    CAI_CALL_GOTO(write_all(f, hdr, sizeof hdr, b->idx_tmp), st, done);
    CAI_CALL_GOTO(write_all(f, b->lengths, (size_t)b->n_seq * 4, b->idx_tmp), st, done);
    int64_t ptr = 0;
    for (int64_t i = 0; i < b->n_seq; i++) {
        CAI_CALL_GOTO(write_all(f, &ptr, 8, b->idx_tmp), st, done);
        ptr += (int64_t)b->lengths[i] * (int64_t)b->itemsize;
    }
    CAI_CALL_GOTO(write_all(f, b->docs, (size_t)b->n_docs * 8, b->idx_tmp), st, done);
done:
    if (fclose(f) != 0 && st == CAI_OK) st = CAI_ERROR(CAI_ERR_IO, "%s: close failed: %s", b->idx_tmp, strerror(errno));
    return st;
}

static cai_status rename_into_place(const char *tmp, const char *prefix, const char *ext) {
    char *dst = join(prefix, ext);
    if (!dst) return CAI_ERROR(CAI_ERR_NOMEM, "path for %s%s", prefix, ext);
    cai_status st = CAI_OK;
    if (rename(tmp, dst) != 0) st = CAI_ERROR(CAI_ERR_IO, "rename %s -> %s failed: %s", tmp, dst, strerror(errno));
    free(dst);
    return st;
}

cai_status cai_indexed_builder_finish(cai_indexed_builder_t *b) {
    CAI_CHECK_ARG(b != NULL, "builder is NULL");
    cai_status st = CAI_OK;
    if (b->docs[b->n_docs - 1] != b->n_seq) {
        st = CAI_ERROR(CAI_ERR_INVALID_ARG,
                       "%s: %lld sequences were added after the last end_document; every sequence must belong to a "
                       "document",
                       b->prefix, (long long)(b->n_seq - b->docs[b->n_docs - 1]));
        goto fail;
    }
    FILE *bin = b->bin;
    b->bin = NULL;
    if (fclose(bin) != 0) {
        st = CAI_ERROR(CAI_ERR_IO, "%s: close failed: %s", b->bin_tmp, strerror(errno));
        goto fail;
    }
    CAI_CALL_GOTO(write_index(b), st, fail);
    CAI_CALL_GOTO(rename_into_place(b->bin_tmp, b->prefix, ".bin"), st, fail);
    CAI_CALL_GOTO(rename_into_place(b->idx_tmp, b->prefix, ".idx"), st, fail);
    cai_indexed_builder_abort(b); /* frees; the temporary names no longer exist */
    return CAI_OK;
fail:
    cai_indexed_builder_abort(b);
    return st;
}

void cai_indexed_builder_abort(cai_indexed_builder_t *b) {
    if (!b) return;
    if (b->bin) fclose(b->bin);
    if (b->bin_tmp) unlink(b->bin_tmp);
    if (b->idx_tmp) unlink(b->idx_tmp);
    free(b->prefix);
    free(b->bin_tmp);
    free(b->idx_tmp);
    free(b->lengths);
    free(b->docs);
    free(b->scratch);
    free(b);
}
