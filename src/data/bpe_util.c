/* Tokenizer plumbing: UTF-8, character classes, GPT-2's byte mapping, the
 * pre-tokeniser, hash maps and growable buffers. */
#include "cai_config.h"
#include "bpe_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ UTF-8 */

size_t cai_bpe_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1Fu, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0Fu, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07u, min = 0x10000;
    } else {
        *cp = UINT32_MAX;
        return 1;
    }
    if (len > n) {
        *cp = UINT32_MAX;
        return 1;
    }
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            *cp = UINT32_MAX;
            return 1;
        }
        v = (v << 6) | (s[k] & 0x3Fu);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) {
        *cp = UINT32_MAX;
        return 1;
    }
    *cp = v;
    return len;
}

size_t cai_bpe_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ------------------------------------------------------------ classes */

int cai_bpe_codepoint_class(uint32_t cp) {
    if (cp < 128) return cai_bpe_ascii_class[cp];
    if (cp > 0x10FFFF) return BPE_CLASS_OTHER;
    /* Last run whose first code point is <= cp. */
    size_t lo = 0, hi = cai_bpe_class_run_count;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((cai_bpe_class_runs[mid] >> 2) <= cp) lo = mid;
        else hi = mid;
    }
    return (int)(cai_bpe_class_runs[lo] & 3u);
}

/* Class and length of the character at s[0..n). */
static inline int char_at(const uint8_t *s, size_t n, size_t *len) {
    if (s[0] < 0x80) {
        *len = 1;
        return cai_bpe_ascii_class[s[0]];
    }
    uint32_t cp;
    *len = cai_bpe_utf8_decode(s, n, &cp);
    return cp == UINT32_MAX ? BPE_CLASS_OTHER : cai_bpe_codepoint_class(cp);
}

/* End of the run of characters of class `cls` starting at i. */
static size_t run_end(const uint8_t *s, size_t n, size_t i, int cls) {
    while (i < n) {
        size_t len;
        if (char_at(s + i, n - i, &len) != cls) break;
        i += len;
    }
    return i;
}

size_t cai_bpe_pretoken_end(const uint8_t *s, size_t n, size_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        uint8_t c1 = s[i + 1];
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
        if (i + 2 < n) {
            uint8_t c2 = s[i + 2];
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
        }
    }
    size_t len;
    if (s[i] == ' ' && i + 1 < n) {
        int next = char_at(s + i + 1, n - i - 1, &len);
        if (next != BPE_CLASS_SPACE) return run_end(s, n, i + 1 + len, next);
    }
    int cls = char_at(s + i, n - i, &len);
    if (cls != BPE_CLASS_SPACE) return run_end(s, n, i + len, cls);
    /* \s+(?!\S) backs off one character so that a final space can lead the
     * next word; a lone whitespace character before a word stands alone (\s+). */
    size_t last = i, j = i + len;
    while (j < n) {
        size_t l;
        if (char_at(s + j, n - j, &l) != BPE_CLASS_SPACE) break;
        last = j;
        j += l;
    }
    if (j == n || last == i) return j;
    return last;
}

size_t cai_bpe_digit_piece_end(const uint8_t *s, size_t n, size_t i) {
    size_t len;
    if (char_at(s + i, n - i, &len) == BPE_CLASS_NUMBER) return i + len;
    for (i += len; i < n; i += len)
        if (char_at(s + i, n - i, &len) == BPE_CLASS_NUMBER) break;
    return i;
}

/* ------------------------------------------------------------ byte mapping */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 take 256, 257, ... in byte order. */
static int printable_latin1(unsigned b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t cai_bpe_byte_to_char(uint8_t b) {
    if (printable_latin1(b)) return b;
    if (b <= 0x20) return 256u + b;                              /* 33 controls and space */
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu); /* DEL, C1, NBSP */
    return 256u + 67u;                                           /* 0xAD, soft hyphen */
}

int cai_bpe_char_to_byte(uint32_t cp) {
    if (cp < 256) return printable_latin1(cp) ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(0x7F + cp - 256 - 33);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

cai_status cai_bpe_spell(const void *bytes, size_t n, cai_byte_buf *out) {
    const uint8_t *p = bytes;
    CAI_CALL(cai_bpe_reserve((void **)&out->data, &out->cap, out->len + 2 * n + 1, 1, "token spelling"));
    for (size_t i = 0; i < n; i++) out->len += cai_bpe_utf8_encode(cai_bpe_byte_to_char(p[i]), out->data + out->len);
    return CAI_OK;
}

/* ------------------------------------------------------------ buffers */

cai_status cai_bpe_reserve(void **buf, size_t *cap, size_t need, size_t elem, const char *what) {
    if (need <= *cap) return CAI_OK;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    if (nc > SIZE_MAX / elem) return CAI_ERROR(CAI_ERR_NOMEM, "%s: %zu elements of %zu bytes overflow", what, nc, elem);
    void *p = realloc(*buf, nc * elem);
    if (!p) return CAI_ERROR(CAI_ERR_NOMEM, "cannot grow %s to %zu bytes", what, nc * elem);
    *buf = p;
    *cap = nc;
    return CAI_OK;
}

cai_status cai_bpe_resize_arrays(size_t count, size_t n, void **const arrays[], const size_t elem[], const char *what) {
    for (size_t i = 0; i < n; i++) {
        /* An array that moved keeps its new block even if a later one fails: nothing leaks. */
        void *p = count > SIZE_MAX / elem[i] ? NULL : realloc(*arrays[i], count * elem[i]);
        if (!p) return CAI_ERROR(CAI_ERR_NOMEM, "cannot grow %s to %zu entries", what, count);
        *arrays[i] = p;
    }
    return CAI_OK;
}

cai_status cai_byte_buf_append(cai_byte_buf *b, const void *p, size_t n) {
    CAI_CALL(cai_bpe_reserve((void **)&b->data, &b->cap, b->len + n, 1, "byte buffer"));
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return CAI_OK;
}

cai_status cai_token_buf_append(cai_token_buf *b, const int32_t *ids, size_t n) {
    CAI_CALL(cai_bpe_reserve((void **)&b->ids, &b->cap, b->len + n, sizeof(int32_t), "token buffer"));
    if (n) memcpy(b->ids + b->len, ids, n * sizeof(int32_t));
    b->len += n;
    return CAI_OK;
}

void cai_token_buf_free(cai_token_buf *b) {
    free(b->ids);
    memset(b, 0, sizeof *b);
}

void cai_byte_buf_free(cai_byte_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------ hashing */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return x;
}

uint64_t cai_bpe_hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x100000001b3ull;
    return mix64(h);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

cai_status bpe_u64map_init(bpe_u64map *m, size_t expected) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expected * 2);
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->vals = malloc(m->cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        bpe_u64map_free(m);
        return CAI_ERROR(CAI_ERR_NOMEM, "cannot allocate a %zu-slot pair map", expected * 2);
    }
    memset(m->keys, 0xFF, m->cap * sizeof *m->keys);
    return CAI_OK;
}

void bpe_u64map_free(bpe_u64map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

uint64_t *bpe_u64map_get(const bpe_u64map *m, uint64_t key) {
    if (!m->cap) return NULL;
    size_t mask = m->cap - 1, i = (size_t)mix64(key) & mask;
    for (;;) {
        if (m->keys[i] == key) return &m->vals[i];
        if (m->keys[i] == UINT64_MAX) return NULL;
        i = (i + 1) & mask;
    }
}

static void u64map_place(uint64_t *keys, uint64_t *vals, size_t cap, uint64_t key, uint64_t val) {
    size_t mask = cap - 1, i = (size_t)mix64(key) & mask;
    while (keys[i] != UINT64_MAX && keys[i] != key) i = (i + 1) & mask;
    keys[i] = key;
    vals[i] = val;
}

cai_status bpe_u64map_put(bpe_u64map *m, uint64_t key, uint64_t val) {
    uint64_t *v = bpe_u64map_get(m, key);
    if (v) {
        *v = val;
        return CAI_OK;
    }
    if (!m->cap || (m->count + 1) * 2 > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 16;
        uint64_t *nk = malloc(nc * sizeof *nk), *nv = malloc(nc * sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return CAI_ERROR(CAI_ERR_NOMEM, "cannot grow a pair map to %zu slots", nc);
        }
        memset(nk, 0xFF, nc * sizeof *nk);
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i] != UINT64_MAX) u64map_place(nk, nv, nc, m->keys[i], m->vals[i]);
        free(m->keys);
        free(m->vals);
        m->keys = nk;
        m->vals = nv;
        m->cap = nc;
    }
    u64map_place(m->keys, m->vals, m->cap, key, val);
    m->count++;
    return CAI_OK;
}

cai_status bpe_strmap_init(bpe_strmap *m, size_t expected) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expected * 2);
    m->slots = calloc(m->cap, sizeof *m->slots);
    if (!m->slots) return CAI_ERROR(CAI_ERR_NOMEM, "cannot allocate a %zu-slot string map", m->cap);
    return CAI_OK;
}

void bpe_strmap_free(bpe_strmap *m) {
    free(m->slots);
    free(m->hashes);
    free(m->key_off);
    free(m->key_len);
    free(m->vals);
    free(m->pool);
    memset(m, 0, sizeof *m);
}

void bpe_strmap_clear(bpe_strmap *m) {
    if (m->slots) memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->count = 0;
    m->pool_len = 0;
}

static inline int bytes_equal(const char *a, const char *b, size_t n) {
    while (n >= 8) {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y) return 0;
        a += 8, b += 8, n -= 8;
    }
    while (n--)
        if (*a++ != *b++) return 0;
    return 1;
}

/* Slots carry the hash's high half so that a probe touches the entry
 * arrays and the key pool only on a likely match. */
static inline uint64_t slot_of(uint64_t hash, size_t e) { return (hash & 0xFFFFFFFF00000000ull) | (e + 1); }

int64_t bpe_strmap_find(const bpe_strmap *m, const void *key, size_t len, uint64_t hash) {
    if (!m->cap) return -1;
    size_t mask = m->cap - 1, i = (size_t)hash & mask;
    uint64_t tag = hash & 0xFFFFFFFF00000000ull;
    for (;;) {
        uint64_t s = m->slots[i];
        if (!s) return -1;
        if ((s & 0xFFFFFFFF00000000ull) == tag) {
            size_t e = (size_t)(uint32_t)s - 1;
            if (m->key_len[e] == len && bytes_equal(m->pool + m->key_off[e], key, len)) return (int64_t)e;
        }
        i = (i + 1) & mask;
    }
}

static cai_status strmap_rehash(bpe_strmap *m, size_t nc) {
    uint64_t *ns = calloc(nc, sizeof *ns);
    if (!ns) return CAI_ERROR(CAI_ERR_NOMEM, "cannot grow a string map to %zu slots", nc);
    for (size_t e = 0; e < m->count; e++) {
        size_t i = (size_t)m->hashes[e] & (nc - 1);
        while (ns[i]) i = (i + 1) & (nc - 1);
        ns[i] = slot_of(m->hashes[e], e);
    }
    free(m->slots);
    m->slots = ns;
    m->cap = nc;
    return CAI_OK;
}

cai_status bpe_strmap_insert(bpe_strmap *m, const void *key, size_t len, uint64_t hash, uint64_t val, int64_t *index,
                             int *inserted) {
    int64_t e = bpe_strmap_find(m, key, len, hash);
    if (inserted) *inserted = e < 0;
    if (e >= 0) {
        if (index) *index = e;
        return CAI_OK;
    }
    if (m->count + 1 >= UINT32_MAX || len > UINT32_MAX)
        return CAI_ERROR(CAI_ERR_NOMEM, "string map full (%zu entries, key of %zu bytes)", m->count, len);
    if (!m->cap || (m->count + 1) * 2 > m->cap) CAI_CALL(strmap_rehash(m, m->cap ? m->cap * 2 : 16));
    if (m->count + 1 > m->entries_cap) {
        size_t nc = m->entries_cap ? m->entries_cap * 2 : 16;
        void **const arrays[] = {(void **)&m->hashes, (void **)&m->key_off, (void **)&m->key_len, (void **)&m->vals};
        const size_t elem[] = {sizeof *m->hashes, sizeof *m->key_off, sizeof *m->key_len, sizeof *m->vals};
        CAI_CALL(cai_bpe_resize_arrays(nc, 4, arrays, elem, "a string map"));
        m->entries_cap = nc;
    }
    CAI_CALL(cai_bpe_reserve((void **)&m->pool, &m->pool_cap, m->pool_len + len + 1, 1, "string map keys"));
    size_t ne = m->count++;
    memcpy(m->pool + m->pool_len, key, len);
    m->pool[m->pool_len + len] = 0;
    m->key_off[ne] = m->pool_len;
    m->key_len[ne] = (uint32_t)len;
    m->hashes[ne] = hash;
    m->vals[ne] = val;
    m->pool_len += len + 1;
    size_t i = (size_t)hash & (m->cap - 1);
    while (m->slots[i]) i = (i + 1) & (m->cap - 1);
    m->slots[i] = slot_of(hash, ne);
    if (index) *index = (int64_t)ne;
    return CAI_OK;
}
