/* safetensors: u64 little-endian header length N, N bytes of JSON, then the
 * tensor bytes. The reader trusts nothing in the file: a checkpoint that
 * loads must load correctly, so every inconsistency is an error naming the
 * file and the tensor or field, found before any data is handed out. */
#include "cai_config.h"
#include "colossal/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this host would need byte swapping, which is not implemented"
#endif

#define FORMAT_ERR(path, fmt, ...) CAI_ERROR(CAI_ERR_FORMAT, "safetensors file '%s': " fmt, (path), __VA_ARGS__)

/* ------------------------------------------------------------ dtypes */

typedef struct {
    const char *name;
    size_t size;
    cai_dtype dtype; /* CAI_DTYPE_COUNT: no colossal equivalent */
} st_dtype;

/* Every byte-sized dtype of the format (the reference implementation's list). */
static const st_dtype k_dtypes[] = {
    {"BOOL", 1, CAI_DTYPE_COUNT},    {"U8", 1, CAI_DTYPE_U8},         {"I8", 1, CAI_DTYPE_COUNT},
    {"F8_E5M2", 1, CAI_DTYPE_COUNT}, {"F8_E4M3", 1, CAI_DTYPE_COUNT}, {"F8_E8M0", 1, CAI_DTYPE_COUNT},
    {"I16", 2, CAI_DTYPE_COUNT},     {"U16", 2, CAI_DTYPE_U16},       {"F16", 2, CAI_DTYPE_F16},
    {"BF16", 2, CAI_DTYPE_BF16},     {"I32", 4, CAI_DTYPE_I32},       {"U32", 4, CAI_DTYPE_COUNT},
    {"F32", 4, CAI_DTYPE_F32},       {"F64", 8, CAI_DTYPE_F64},       {"I64", 8, CAI_DTYPE_I64},
    {"U64", 8, CAI_DTYPE_COUNT},     {"C64", 8, CAI_DTYPE_COUNT},
};
#define N_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])

static const st_dtype *dtype_by_name(const char *name) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(k_dtypes[i].name, name) == 0) return &k_dtypes[i];
    return NULL;
}

const char *cai_safetensors_dtype_name(cai_dtype dtype) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (k_dtypes[i].dtype == dtype && dtype != CAI_DTYPE_COUNT) return k_dtypes[i].name;
    return NULL;
}

/* a * b, or 0 with *overflow set. */
static uint64_t mul_checked(uint64_t a, uint64_t b, int *overflow) {
    if (b && a > UINT64_MAX / b) {
        *overflow = 1;
        return 0;
    }
    return a * b;
}

static void shape_str(char *buf, size_t cap, int ndim, const uint64_t *shape) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%llu", d ? "," : "", (unsigned long long)shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* ------------------------------------------------------------ reader */

/* A name index: sorted (name, position) pairs, searched by bisection. */
typedef struct {
    const char *name;
    int index;
} name_idx;

static int cmp_name_idx(const void *a, const void *b) {
    return strcmp(((const name_idx *)a)->name, ((const name_idx *)b)->name);
}

static int name_index_find(const name_idx *ix, int n, const char *name) {
    name_idx key = {name, -1};
    const name_idx *hit = n > 0 ? bsearch(&key, ix, (size_t)n, sizeof *ix, cmp_name_idx) : NULL;
    return hit ? hit->index : -1;
}

struct cai_safetensors {
    char *path;
    unsigned char *map;
    size_t size;
    json_t *root; /* names and metadata strings point into it */
    cai_st_entry *entries;
    int n;
    name_idx *by_name;
    const char **meta_key, **meta_val;
    int n_meta;
};

static const char *k_fields[3] = {"dtype", "shape", "data_offsets"};

static cai_status parse_u64_array(const char *path, const char *name, const char *field, json_t *arr, size_t max_len,
                                  uint64_t *out, size_t *len) {
    if (!json_is_array(arr)) return FORMAT_ERR(path, "tensor '%s': field '%s' is not an array", name, field);
    size_t n = json_array_size(arr);
    if (n > max_len)
        return FORMAT_ERR(path, "tensor '%s': field '%s' has %zu entries (at most %zu)", name, field, n, max_len);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return FORMAT_ERR(path, "tensor '%s': %s[%zu] is not a non-negative integer", name, field, i);
        out[i] = (uint64_t)json_integer_value(v);
    }
    *len = n;
    return CAI_OK;
}

static cai_status parse_entry(const char *path, const char *name, json_t *obj, cai_st_entry *e) {
    if (!json_is_object(obj)) return FORMAT_ERR(path, "tensor '%s': entry is not a JSON object", name);
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        int known = 0;
        for (int f = 0; f < 3; f++) known |= strcmp(key, k_fields[f]) == 0;
        if (!known)
            return FORMAT_ERR(path, "tensor '%s': unexpected field '%s' (expected dtype, shape, data_offsets)", name,
                              key);
    }
    for (int f = 0; f < 3; f++)
        if (!json_object_get(obj, k_fields[f]))
            return FORMAT_ERR(path, "tensor '%s': missing field '%s'", name, k_fields[f]);

    json_t *dt = json_object_get(obj, "dtype");
    if (!json_is_string(dt)) return FORMAT_ERR(path, "tensor '%s': field 'dtype' is not a string", name);
    const st_dtype *d = dtype_by_name(json_string_value(dt));
    if (!d) {
        const char *s = json_string_value(dt);
        if (strcmp(s, "F4") == 0 || strcmp(s, "F6_E2M3") == 0 || strcmp(s, "F6_E3M2") == 0)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "safetensors file '%s': tensor '%s': sub-byte dtype '%s' is not "
                             "supported",
                             path, name, s);
        return FORMAT_ERR(path,
                          "tensor '%s': unknown dtype '%s' (known: BOOL U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 I16 U16 "
                          "F16 BF16 I32 U32 F32 F64 I64 U64 C64)",
                          name, s);
    }
    memset(e, 0, sizeof *e);
    e->name = name;
    e->dtype_name = d->name;
    e->dtype = d->dtype;
    e->elem_size = d->size;

    size_t len = 0;
    CAI_CALL(parse_u64_array(path, name, "shape", json_object_get(obj, "shape"), CAI_ST_MAX_DIMS, e->shape, &len));
    e->ndim = (int)len;
    uint64_t offs[2];
    CAI_CALL(parse_u64_array(path, name, "data_offsets", json_object_get(obj, "data_offsets"), 2, offs, &len));
    if (len != 2)
        return FORMAT_ERR(path, "tensor '%s': data_offsets has %zu entries (expected [begin, end])", name, len);
    e->begin = offs[0];
    e->end = offs[1];
    if (e->begin > e->end)
        return FORMAT_ERR(path, "tensor '%s': data_offsets [%llu, %llu) end before they begin", name,
                          (unsigned long long)e->begin, (unsigned long long)e->end);
    int overflow = 0;
    e->numel = 1;
    for (int i = 0; i < e->ndim; i++) e->numel = mul_checked(e->numel, e->shape[i], &overflow);
    uint64_t bytes = mul_checked(e->numel, e->elem_size, &overflow);
    char shp[256];
    shape_str(shp, sizeof shp, e->ndim, e->shape);
    if (overflow) return FORMAT_ERR(path, "tensor '%s': shape %s overflows 64 bits", name, shp);
    if (bytes != e->end - e->begin)
        return FORMAT_ERR(path, "tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, %llu) hold %llu",
                          name, shp, e->dtype_name, (unsigned long long)bytes, (unsigned long long)e->begin,
                          (unsigned long long)e->end, (unsigned long long)(e->end - e->begin));
    return CAI_OK;
}

static cai_status parse_metadata(cai_safetensors_t *st, json_t *meta) {
    if (!json_is_object(meta)) return FORMAT_ERR(st->path, "'__metadata__' is not a JSON object (%s)", "string map");
    size_t n = json_object_size(meta);
    CAI_CALL(cai_calloc((void **)&st->meta_key, n + 1, sizeof *st->meta_key, "safetensors metadata"));
    CAI_CALL(cai_calloc((void **)&st->meta_val, n + 1, sizeof *st->meta_val, "safetensors metadata"));
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val) {
        if (!json_is_string(val))
            return FORMAT_ERR(st->path, "'__metadata__' key '%s' is not a string (metadata maps strings to strings)",
                              key);
        st->meta_key[st->n_meta] = key;
        st->meta_val[st->n_meta++] = json_string_value(val);
    }
    return CAI_OK;
}

static int cmp_offsets(const void *a, const void *b) {
    const cai_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The byte ranges must tile [0, data_len) exactly: sorted by offset, each
 * begins where the previous ended. */
static cai_status check_tiling(const cai_safetensors_t *st, uint64_t data_len) {
    uint64_t pos = 0;
    const char *prev = NULL;
    for (int i = 0; i < st->n; i++) {
        const cai_st_entry *e = &st->entries[i];
        if (e->begin < pos)
            return FORMAT_ERR(st->path,
                              "tensor '%s' at data_offsets [%llu, %llu) overlaps tensor '%s' which ends at "
                              "%llu",
                              e->name, (unsigned long long)e->begin, (unsigned long long)e->end, prev,
                              (unsigned long long)pos);
        if (e->begin > pos)
            return FORMAT_ERR(st->path, "data bytes [%llu, %llu) before tensor '%s' belong to no tensor (gap)",
                              (unsigned long long)pos, (unsigned long long)e->begin, e->name);
        pos = e->end;
        prev = e->name;
    }
    if (pos > data_len)
        return FORMAT_ERR(st->path,
                          "truncated: tensors need %llu data bytes but the file holds %llu after the header "
                          "(last tensor '%s')",
                          (unsigned long long)pos, (unsigned long long)data_len, prev ? prev : "");
    if (pos < data_len)
        return FORMAT_ERR(st->path, "%llu trailing bytes after the last tensor (tensors cover %llu of %llu data bytes)",
                          (unsigned long long)(data_len - pos), (unsigned long long)pos, (unsigned long long)data_len);
    return CAI_OK;
}

/* What a header that is not a JSON object starts with instead. */
static const char *non_object_kind(const unsigned char *h, uint64_t n) {
    if (n >= 3 && h[0] == 0xef && h[1] == 0xbb && h[2] == 0xbf) return "a UTF-8 byte-order mark (EF BB BF)";
    if (n >= 2 && ((h[0] == 0xfe && h[1] == 0xff) || (h[0] == 0xff && h[1] == 0xfe))) return "a UTF-16 byte-order mark";
    switch (h[0]) {
    case '[': return "a JSON array";
    case '"': return "a JSON string";
    case 't':
    case 'f': return "a JSON boolean";
    case 'n': return "JSON null";
    case ' ':
    case '\t':
    case '\r':
    case '\n': return "white space";
    case '\0': return "a zero byte";
    default: return (h[0] >= '0' && h[0] <= '9') || h[0] == '-' ? "a JSON number" : "something that is not JSON";
    }
}

/* The header field an integer at byte `pos` of the header belongs to (the
 * last "shape" or "data_offsets" key before it). */
static const char *field_at(const char *hdr, size_t n, size_t pos) {
    const char *best = "a header field";
    size_t at = 0;
    static const char *const keys[2] = {"\"shape\"", "\"data_offsets\""};
    for (int k = 0; k < 2; k++) {
        size_t kl = strlen(keys[k]);
        for (size_t i = 0; i + kl <= pos && i + kl <= n; i++)
            if (memcmp(hdr + i, keys[k], kl) == 0 && i >= at) {
                at = i;
                best = k == 0 ? "shape" : "data_offsets";
            }
    }
    return best;
}

static cai_status parse_header(cai_safetensors_t *st) {
    if (st->size == 0)
        return FORMAT_ERR(st->path,
                          "file is empty (0 bytes); a safetensors file starts with an 8-byte header "
                          "length%s",
                          "");
    if (st->size < 8) return FORMAT_ERR(st->path, "file is %zu bytes, shorter than the 8-byte header length", st->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | st->map[i];
    if (n > st->size - 8)
        return FORMAT_ERR(st->path,
                          "header length %llu exceeds the %zu bytes that follow it (header length past the "
                          "end of the file: bad header size or truncated file)",
                          (unsigned long long)n, st->size - 8);
    if (n > CAI_ST_MAX_HEADER)
        return FORMAT_ERR(st->path, "header length %llu exceeds the %u-byte limit", (unsigned long long)n,
                          CAI_ST_MAX_HEADER);
    const char *hdr = (const char *)st->map + 8;
    if (n == 0)
        return FORMAT_ERR(st->path,
                          "header is not a JSON object: the header length is 0 (header does not start "
                          "with '{')%s",
                          "");
    if (hdr[0] != '{')
        return FORMAT_ERR(st->path,
                          "header is not a JSON object: it starts with %s (header does not start with "
                          "'{', header length %llu)",
                          non_object_kind((const unsigned char *)hdr, n), (unsigned long long)n);
    json_error_t jerr;
    st->root = json_loadb(hdr, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!st->root && json_error_code(&jerr) == json_error_numeric_overflow)
        return FORMAT_ERR(st->path,
                          "header: an integer in '%s' near byte %d of the header is out of range (at or "
                          "past 2^63; no tensor shape or offset can be that large)",
                          field_at(hdr, (size_t)n, (size_t)(jerr.position > 0 ? jerr.position : 0)), jerr.position);
    if (!st->root)
        return FORMAT_ERR(st->path, "header is not valid JSON: %s (line %d, column %d, byte %d)", jerr.text, jerr.line,
                          jerr.column, jerr.position);
    if (!json_is_object(st->root)) return FORMAT_ERR(st->path, "header JSON is not an object (%s)", "{...}");

    size_t count = json_object_size(st->root);
    CAI_CALL(cai_calloc((void **)&st->entries, count + 1, sizeof *st->entries, "safetensors entries"));
    const char *key;
    json_t *val;
    json_object_foreach(st->root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            CAI_CALL(parse_metadata(st, val));
            continue;
        }
        if (!*key) return FORMAT_ERR(st->path, "a tensor has an empty name (the header key \"\"%s)", "");
        CAI_CALL(parse_entry(st->path, key, val, &st->entries[st->n]));
        st->n++;
    }
    /* transformers refuses any other format; so does colossal, rather than
     * load what the writer meant for another framework */
    const char *format = cai_safetensors_meta(st, "format");
    if (format && strcmp(format, "pt") != 0)
        return FORMAT_ERR(st->path,
                          "'__metadata__.format' is \"%s\"; only \"pt\" is accepted (transformers refuses "
                          "other values)",
                          format);
    const uint64_t data_len = st->size - 8 - n;
    for (int i = 0; i < st->n; i++)
        if (st->entries[i].end > data_len)
            return FORMAT_ERR(st->path,
                              "tensor '%s': data_offsets [%llu, %llu) out of range: the file holds %llu data "
                              "bytes after the header (truncated?)",
                              st->entries[i].name, (unsigned long long)st->entries[i].begin,
                              (unsigned long long)st->entries[i].end, (unsigned long long)data_len);
    qsort(st->entries, (size_t)st->n, sizeof *st->entries, cmp_offsets);
    CAI_CALL(check_tiling(st, data_len));
    const unsigned char *data = st->map + 8 + n;
    for (int i = 0; i < st->n; i++) st->entries[i].data = data + st->entries[i].begin;

    CAI_CALL(cai_calloc((void **)&st->by_name, (size_t)st->n + 1, sizeof *st->by_name, "safetensors index"));
    for (int i = 0; i < st->n; i++) st->by_name[i] = (name_idx){st->entries[i].name, i};
    qsort(st->by_name, (size_t)st->n, sizeof *st->by_name, cmp_name_idx);
    return CAI_OK;
}

cai_status cai_safetensors_open(cai_safetensors_t **out, const char *path) {
    CAI_CHECK_ARG(out && path, "cai_safetensors_open: NULL argument");
    *out = NULL;
    cai_safetensors_t *st = NULL;
    CAI_CALL(cai_calloc((void **)&st, 1, sizeof *st, "safetensors handle"));
    cai_status rc = CAI_OK;
    st->path = strdup(path);
    if (!st->path) {
        rc = CAI_ERROR(CAI_ERR_NOMEM, "cannot copy path '%s'", path);
        goto fail;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = CAI_ERROR(CAI_ERR_IO, "cannot open safetensors file '%s': %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        rc = CAI_ERROR(CAI_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
        close(fd);
        goto fail;
    }
    st->size = (size_t)sb.st_size;
    if (st->size > 0) {
        void *m = mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            rc = CAI_ERROR(CAI_ERR_IO, "cannot map '%s' (%zu bytes): %s", path, st->size, strerror(errno));
            close(fd);
            goto fail;
        }
        st->map = m;
    }
    close(fd); /* the mapping keeps the file alive */
    CAI_CALL_GOTO(parse_header(st), rc, fail);
    *out = st;
    return CAI_OK;
fail:
    cai_safetensors_close(st);
    return rc;
}

void cai_safetensors_close(cai_safetensors_t *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->size);
    if (st->root) json_decref(st->root);
    cai_free(st->entries);
    cai_free(st->by_name);
    cai_free(st->meta_key);
    cai_free(st->meta_val);
    free(st->path);
    cai_free(st);
}

const char *cai_safetensors_path(const cai_safetensors_t *st) { return st ? st->path : NULL; }
int cai_safetensors_count(const cai_safetensors_t *st) { return st ? st->n : 0; }

const cai_st_entry *cai_safetensors_entry(const cai_safetensors_t *st, int i) {
    if (!st || i < 0 || i >= st->n) return NULL;
    return &st->entries[i];
}

const cai_st_entry *cai_safetensors_find(const cai_safetensors_t *st, const char *name) {
    if (!st || !name) return NULL;
    int i = name_index_find(st->by_name, st->n, name);
    return i < 0 ? NULL : &st->entries[i];
}

cai_status cai_safetensors_get(const cai_safetensors_t *st, const char *name, const cai_st_entry **out) {
    CAI_CHECK_ARG(st && name && out, "cai_safetensors_get: NULL argument");
    *out = cai_safetensors_find(st, name);
    if (!*out) return FORMAT_ERR(st->path, "no tensor named '%s' (the file has %d tensors)", name, st->n);
    return CAI_OK;
}

const char *cai_safetensors_meta(const cai_safetensors_t *st, const char *key) {
    for (int i = 0; st && key && i < st->n_meta; i++)
        if (strcmp(st->meta_key[i], key) == 0) return st->meta_val[i];
    return NULL;
}

int cai_safetensors_meta_count(const cai_safetensors_t *st) { return st ? st->n_meta : 0; }

void cai_safetensors_meta_at(const cai_safetensors_t *st, int i, const char **key, const char **value) {
    int ok = st && i >= 0 && i < st->n_meta;
    if (key) *key = ok ? st->meta_key[i] : NULL;
    if (value) *value = ok ? st->meta_val[i] : NULL;
}

cai_status cai_safetensors_read(const cai_safetensors_t *st, const char *name, cai_dtype dtype, int ndim,
                                const uint64_t *shape, void *dst) {
    const cai_st_entry *e;
    CAI_CALL(cai_safetensors_get(st, name, &e));
    int same = e->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = e->shape[d] == shape[d];
    if (e->dtype != dtype || !same) {
        char have[256], want[256];
        shape_str(have, sizeof have, e->ndim, e->shape);
        shape_str(want, sizeof want, ndim, shape);
        const char *want_dt = cai_safetensors_dtype_name(dtype);
        return FORMAT_ERR(st->path, "tensor '%s' is %s %s but %s %s was expected", name, e->dtype_name, have,
                          want_dt ? want_dt : "?", want);
    }
    if (e->end > e->begin) memcpy(dst, e->data, (size_t)(e->end - e->begin));
    return CAI_OK;
}

/* ------------------------------------------------------------ writer */

struct cai_st_writer {
    char *path, *tmp;
    int fd;
    int n;
    char **names;
    uint64_t *pos, *nbytes; /* absolute file offset and length of each tensor */
    unsigned char *done;
    name_idx *by_name;
};

typedef struct {
    const cai_st_tensor *t;
    size_t elem;
    int index;
} order_item;

/* Largest element first keeps every tensor aligned to its element size
 * (the header block is padded to 8 bytes); then names, for a stable file. */
static int cmp_layout(const void *a, const void *b) {
    const order_item *x = a, *y = b;
    if (x->elem != y->elem) return x->elem > y->elem ? -1 : 1;
    return strcmp(x->t->name, y->t->name);
}

static cai_status write_all(int fd, const void *buf, uint64_t len, uint64_t off, const char *path, const char *what) {
    const unsigned char *p = buf;
    while (len > 0) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t w = pwrite(fd, p, chunk, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return CAI_ERROR(CAI_ERR_IO, "writing %s to '%s' at byte %llu failed: %s", what, path,
                             (unsigned long long)off, w < 0 ? strerror(errno) : "no progress");
        p += w;
        off += (uint64_t)w;
        len -= (uint64_t)w;
    }
    return CAI_OK;
}

static cai_status check_descriptors(const char *path, const cai_st_tensor *t, int n, const cai_st_meta *meta,
                                    int n_meta) {
    CAI_CHECK_ARG(n >= 0 && (n == 0 || t), "safetensors '%s': %d tensors but no array", path, n);
    CAI_CHECK_ARG(n_meta >= 0 && (n_meta == 0 || meta), "safetensors '%s': %d metadata entries but no array", path,
                  n_meta);
    for (int i = 0; i < n; i++) {
        CAI_CHECK_ARG(t[i].name && t[i].name[0], "safetensors '%s': tensor %d has no name", path, i);
        CAI_CHECK_ARG(strcmp(t[i].name, "__metadata__") != 0, "safetensors '%s': '__metadata__' is reserved", path);
        CAI_CHECK_ARG(cai_safetensors_dtype_name(t[i].dtype) != NULL, "safetensors '%s': tensor '%s' has dtype %d",
                      path, t[i].name, (int)t[i].dtype);
        CAI_CHECK_ARG(t[i].ndim >= 0 && t[i].ndim <= CAI_ST_MAX_DIMS,
                      "safetensors '%s': tensor '%s' has %d dims (0..%d)", path, t[i].name, t[i].ndim, CAI_ST_MAX_DIMS);
    }
    for (int i = 0; i < n_meta; i++) {
        CAI_CHECK_ARG(meta[i].key && meta[i].value, "safetensors '%s': metadata entry %d is incomplete", path, i);
        if (strcmp(meta[i].key, "format") == 0 && strcmp(meta[i].value, "pt") != 0)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "safetensors '%s': metadata format '%s' would be rejected by "
                             "transformers (it must be \"pt\")",
                             path, meta[i].value);
    }
    return CAI_OK;
}

/* Builds the header JSON and the data layout; fills the writer's tables. */
static cai_status build_header(cai_st_writer_t *w, const cai_st_tensor *t, const cai_st_meta *meta, int n_meta,
                               char **json_out, uint64_t *data_len) {
    cai_status rc = CAI_OK;
    order_item *items = NULL;
    json_t *root = json_object(), *md = json_object();
    if (!root || !md) {
        json_decref(root);
        json_decref(md);
        return CAI_ERROR(CAI_ERR_NOMEM, "safetensors '%s': cannot build the header", w->path);
    }
    json_object_set_new(root, "__metadata__", md);
    json_object_set_new(md, "format", json_string("pt"));
    for (int i = 0; i < n_meta; i++) {
        if (strcmp(meta[i].key, "format") == 0) continue;
        json_t *v = json_string(meta[i].value);
        if (!v || json_object_set_new(md, meta[i].key, v) != 0) {
            rc = CAI_ERROR(CAI_ERR_INVALID_ARG, "safetensors '%s': metadata '%s' is not valid UTF-8", w->path,
                           meta[i].key);
            goto done;
        }
    }
    CAI_CALL_GOTO(cai_calloc((void **)&items, (size_t)w->n + 1, sizeof *items, "safetensors layout"), rc, done);
    for (int i = 0; i < w->n; i++) items[i] = (order_item){&t[i], cai_dtype_size(t[i].dtype), i};
    qsort(items, (size_t)w->n, sizeof *items, cmp_layout);
    uint64_t pos = 0;
    for (int k = 0; k < w->n; k++) {
        const cai_st_tensor *x = items[k].t;
        int overflow = 0;
        uint64_t numel = 1;
        json_t *entry = json_object(), *shape = json_array(), *offs = json_array();
        for (int d = 0; d < x->ndim; d++) {
            numel = mul_checked(numel, x->shape[d], &overflow);
            json_array_append_new(shape, json_integer((json_int_t)x->shape[d]));
        }
        uint64_t bytes = mul_checked(numel, items[k].elem, &overflow);
        if (overflow || bytes > (uint64_t)INT64_MAX - pos) {
            json_decref(entry), json_decref(shape), json_decref(offs);
            rc = CAI_ERROR(CAI_ERR_INVALID_ARG, "safetensors '%s': tensor '%s' is too large", w->path, x->name);
            goto done;
        }
        json_array_append_new(offs, json_integer((json_int_t)pos));
        json_array_append_new(offs, json_integer((json_int_t)(pos + bytes)));
        json_object_set_new(entry, "dtype", json_string(cai_safetensors_dtype_name(x->dtype)));
        json_object_set_new(entry, "shape", shape);
        json_object_set_new(entry, "data_offsets", offs);
        if (json_object_get(root, x->name)) {
            json_decref(entry);
            rc = CAI_ERROR(CAI_ERR_INVALID_ARG, "safetensors '%s': tensor name '%s' is used twice", w->path, x->name);
            goto done;
        }
        if (json_object_set_new(root, x->name, entry) != 0) { /* releases entry */
            rc = CAI_ERROR(CAI_ERR_INVALID_ARG, "safetensors '%s': tensor name '%s' is not valid UTF-8", w->path,
                           x->name);
            goto done;
        }
        int i = items[k].index;
        w->pos[i] = pos; /* relative for now */
        w->nbytes[i] = bytes;
        pos += bytes;
    }
    *json_out = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!*json_out) rc = CAI_ERROR(CAI_ERR_NOMEM, "safetensors '%s': cannot serialise the header", w->path);
    *data_len = pos;
done:
    cai_free(items);
    json_decref(root);
    return rc;
}

static void writer_free(cai_st_writer_t *w) {
    if (!w) return;
    for (int i = 0; w->names && i < w->n; i++) free(w->names[i]);
    cai_free(w->names);
    cai_free(w->pos);
    cai_free(w->nbytes);
    cai_free(w->done);
    cai_free(w->by_name);
    free(w->path);
    free(w->tmp);
    cai_free(w);
}

void cai_safetensors_writer_abort(cai_st_writer_t *w) {
    if (!w) return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
    }
    writer_free(w);
}

cai_status cai_safetensors_writer_open(cai_st_writer_t **out, const char *path, const cai_st_tensor *tensors, int n,
                                       const cai_st_meta *meta, int n_meta) {
    CAI_CHECK_ARG(out && path, "cai_safetensors_writer_open: NULL argument");
    *out = NULL;
    CAI_CALL(check_descriptors(path, tensors, n, meta, n_meta));
    cai_st_writer_t *w = NULL;
    CAI_CALL(cai_calloc((void **)&w, 1, sizeof *w, "safetensors writer"));
    w->fd = -1;
    w->n = n;
    cai_status rc = CAI_OK;
    char *json = NULL;
    size_t tmp_len = strlen(path) + 32;
    w->path = strdup(path);
    w->tmp = malloc(tmp_len);
    if (!w->path || !w->tmp) {
        rc = CAI_ERROR(CAI_ERR_NOMEM, "safetensors '%s': cannot allocate the writer", path);
        goto fail;
    }
    snprintf(w->tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
    CAI_CALL_GOTO(cai_calloc((void **)&w->names, (size_t)n + 1, sizeof *w->names, "safetensors names"), rc, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&w->pos, (size_t)n + 1, sizeof *w->pos, "safetensors offsets"), rc, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&w->nbytes, (size_t)n + 1, sizeof *w->nbytes, "safetensors sizes"), rc, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&w->done, (size_t)n + 1, 1, "safetensors flags"), rc, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&w->by_name, (size_t)n + 1, sizeof *w->by_name, "safetensors index"), rc, fail);
    for (int i = 0; i < n; i++) {
        w->names[i] = strdup(tensors[i].name);
        if (!w->names[i]) {
            rc = CAI_ERROR(CAI_ERR_NOMEM, "safetensors '%s': cannot copy names", path);
            goto fail;
        }
        w->by_name[i] = (name_idx){w->names[i], i};
    }
    qsort(w->by_name, (size_t)n, sizeof *w->by_name, cmp_name_idx);

    uint64_t data_len = 0;
    CAI_CALL_GOTO(build_header(w, tensors, meta, n_meta, &json, &data_len), rc, fail);
    size_t jlen = strlen(json), pad = (8 - (8 + jlen) % 8) % 8;
    uint64_t hlen = jlen + pad;
    unsigned char head[8];
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(hlen >> (8 * i));
    for (int i = 0; i < n; i++) w->pos[i] += 8 + hlen;

    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        rc = CAI_ERROR(CAI_ERR_IO, "cannot create '%s' (for '%s'): %s", w->tmp, path, strerror(errno));
        goto fail;
    }
    CAI_CALL_GOTO(write_all(w->fd, head, 8, 0, w->tmp, "the header length"), rc, fail);
    CAI_CALL_GOTO(write_all(w->fd, json, jlen, 8, w->tmp, "the header"), rc, fail);
    CAI_CALL_GOTO(write_all(w->fd, "        ", pad, 8 + jlen, w->tmp, "the header padding"), rc, fail);
    if (ftruncate(w->fd, (off_t)(8 + hlen + data_len)) != 0) {
        rc = CAI_ERROR(CAI_ERR_IO, "cannot size '%s' to %llu bytes: %s", w->tmp,
                       (unsigned long long)(8 + hlen + data_len), strerror(errno));
        goto fail;
    }
    free(json);
    *out = w;
    return CAI_OK;
fail:
    free(json);
    cai_safetensors_writer_abort(w);
    return rc;
}

cai_status cai_safetensors_writer_put(cai_st_writer_t *w, const char *name, const void *data) {
    CAI_CHECK_ARG(w && name, "cai_safetensors_writer_put: NULL argument");
    int idx = name_index_find(w->by_name, w->n, name);
    CAI_CHECK_ARG(idx >= 0, "safetensors '%s': tensor '%s' was not declared when the writer was opened", w->path, name);
    CAI_CHECK_ARG(!w->done[idx], "safetensors '%s': tensor '%s' was already written", w->path, name);
    CAI_CHECK_ARG(data || w->nbytes[idx] == 0, "safetensors '%s': tensor '%s' has no data", w->path, name);
    CAI_CALL(write_all(w->fd, data, w->nbytes[idx], w->pos[idx], w->tmp, name));
    w->done[idx] = 1;
    return CAI_OK;
}

cai_status cai_safetensors_writer_close(cai_st_writer_t *w) {
    CAI_CHECK_ARG(w != NULL, "cai_safetensors_writer_close: writer is NULL");
    cai_status rc = CAI_OK;
    for (int i = 0; i < w->n; i++)
        if (!w->done[i]) {
            rc = CAI_ERROR(CAI_ERR_INVALID_ARG,
                           "safetensors '%s': tensor '%s' was declared but never written; "
                           "nothing was saved",
                           w->path, w->names[i]);
            goto fail;
        }
    if (fsync(w->fd) != 0) {
        rc = CAI_ERROR(CAI_ERR_IO, "fsync of '%s' failed: %s", w->tmp, strerror(errno));
        goto fail;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        rc = CAI_ERROR(CAI_ERR_IO, "closing '%s' failed: %s", w->tmp, strerror(errno));
        unlink(w->tmp);
        goto fail;
    }
    if (rename(w->tmp, w->path) != 0) {
        rc = CAI_ERROR(CAI_ERR_IO, "cannot rename '%s' to '%s': %s", w->tmp, w->path, strerror(errno));
        unlink(w->tmp);
        goto fail;
    }
    writer_free(w);
    return CAI_OK;
fail:
    cai_safetensors_writer_abort(w);
    return rc;
}

cai_status cai_safetensors_write(const char *path, const cai_st_tensor *tensors, int n, const cai_st_meta *meta,
                                 int n_meta) {
    cai_st_writer_t *w = NULL;
    CAI_CALL(cai_safetensors_writer_open(&w, path, tensors, n, meta, n_meta));
    for (int i = 0; i < n; i++) {
        cai_status rc = cai_safetensors_writer_put(w, tensors[i].name, tensors[i].data);
        if (rc != CAI_OK) {
            cai_error_push(__FILE__, __LINE__, __func__, "cai_safetensors_writer_put");
            cai_safetensors_writer_abort(w);
            return rc;
        }
    }
    CAI_CALL(cai_safetensors_writer_close(w));
    return CAI_OK;
}
