/* Byte-level BPE: the token table, encoding (special tokens, GPT-2
 * pre-tokenisation, rank-ordered merges with a word cache) and decoding. */
#include "cai_config.h"
#include "bpe_internal.h"

#include <stdlib.h>
#include <string.h>

/* The cache is a memo of word -> ids; it is dropped wholesale when it grows
 * past these bounds, which costs a little speed and keeps memory flat on
 * corpora with unbounded distinct words. */
#define BPE_CACHE_MAX_WORDS (1u << 20)
#define BPE_CACHE_MAX_IDS (1u << 24)
#define BPE_CACHE_MAX_WORD_BYTES 4096

/* ------------------------------------------------------------ token table */

cai_status cai_bpe_grow(cai_bpe_t *t, int32_t n_ids) {
    if (n_ids <= t->n_ids) return CAI_OK;
    if (n_ids > t->ids_cap) {
        size_t cap = (size_t)(t->ids_cap ? t->ids_cap : 256);
        while (cap < (size_t)n_ids) cap *= 2;
        if (cap > INT32_MAX) cap = INT32_MAX;
        void **const arrays[] = {(void **)&t->flags, (void **)&t->str_off, (void **)&t->str_len, (void **)&t->bytes_off,
                                 (void **)&t->bytes_len};
        const size_t elem[] = {sizeof *t->flags, sizeof *t->str_off, sizeof *t->str_len, sizeof *t->bytes_off,
                               sizeof *t->bytes_len};
        CAI_CALL(cai_bpe_resize_arrays(cap, 5, arrays, elem, "the token table"));
        t->ids_cap = (int32_t)cap;
    }
    for (int32_t i = t->n_ids; i < n_ids; i++) {
        t->flags[i] = 0;
        t->str_off[i] = t->bytes_off[i] = 0;
        t->str_len[i] = t->bytes_len[i] = 0;
    }
    t->n_ids = n_ids;
    return CAI_OK;
}

cai_status cai_bpe_alloc(int32_t n_ids, cai_bpe_t **out) {
    *out = NULL;
    CAI_CHECK_ARG(n_ids >= 0, "negative vocabulary size %d", (int)n_ids);
    cai_bpe_t *t = calloc(1, sizeof *t);
    if (!t) return CAI_ERROR(CAI_ERR_NOMEM, "cannot allocate a tokenizer");
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    cai_status st = cai_bpe_grow(t, n_ids);
    if (st == CAI_OK) st = bpe_u64map_init(&t->pair_rank, 1024);
    if (st != CAI_OK) {
        cai_bpe_free(t);
        CAI_CALL(st);
    }
    *out = t;
    return CAI_OK;
}

void cai_bpe_free(cai_bpe_t *t) {
    if (!t) return;
    free(t->flags);
    free(t->str_off);
    free(t->str_len);
    free(t->bytes_off);
    free(t->bytes_len);
    free(t->pool);
    bpe_strmap_free(&t->by_str);
    bpe_strmap_free(&t->by_bytes);
    free(t->merges);
    bpe_u64map_free(&t->pair_rank);
    free(t->special_ids);
    bpe_strmap_free(&t->cache);
    free(t->cache_ids);
    free(t->scratch);
    free(t);
}

static cai_status pool_append(cai_bpe_t *t, const void *p, size_t n, uint64_t *off) {
    CAI_CALL(cai_bpe_reserve((void **)&t->pool, &t->pool_cap, t->pool_len + n, 1, "token strings"));
    if (n) memcpy(t->pool + t->pool_len, p, n);
    *off = t->pool_len;
    t->pool_len += n;
    return CAI_OK;
}

cai_status cai_bpe_define(cai_bpe_t *t, int32_t id, const char *str, size_t len) {
    CAI_CHECK_ARG(id >= 0 && id < t->n_ids, "token id %d outside 0..%d", (int)id, (int)t->n_ids - 1);
    CAI_CHECK_ARG(len > 0 && len < UINT32_MAX, "token %d has an empty or oversized spelling", (int)id);
    CAI_CALL(pool_append(t, str, len, &t->str_off[id]));
    t->str_len[id] = (uint32_t)len;
    /* Decode the spelling in place at the end of the pool. */
    const uint8_t *s = (const uint8_t *)str;
    size_t nbytes = 0;
    int mapped = 1;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t l = cai_bpe_utf8_decode(s + i, len - i, &cp);
        if (cp == UINT32_MAX || cai_bpe_char_to_byte(cp) < 0) {
            mapped = 0;
            break;
        }
        i += l;
        nbytes++;
    }
    if (!mapped) { /* e.g. an added token outside GPT-2's alphabet: decodes verbatim */
        t->bytes_off[id] = t->str_off[id];
        t->bytes_len[id] = (uint32_t)len;
    } else {
        CAI_CALL(cai_bpe_reserve((void **)&t->pool, &t->pool_cap, t->pool_len + nbytes, 1, "token bytes"));
        s = (const uint8_t *)t->pool + t->str_off[id]; /* the pool may have moved */
        char *o = t->pool + t->pool_len;
        for (size_t i = 0, k = 0; i < len; k++) {
            uint32_t cp;
            i += cai_bpe_utf8_decode(s + i, len - i, &cp);
            o[k] = (char)cai_bpe_char_to_byte(cp);
        }
        t->bytes_off[id] = t->pool_len;
        t->bytes_len[id] = (uint32_t)nbytes;
        t->pool_len += nbytes;
    }
    t->flags[id] = BPE_TOKEN_PRESENT;
    return CAI_OK;
}

cai_status cai_bpe_define_bytes(cai_bpe_t *t, int32_t id, const void *bytes, size_t len) {
    cai_byte_buf sp = {0};
    cai_status st = cai_bpe_spell(bytes, len, &sp);
    if (st == CAI_OK) st = cai_bpe_define(t, id, sp.data, sp.len);
    cai_byte_buf_free(&sp);
    CAI_CALL(st);
    return CAI_OK;
}

cai_status cai_bpe_index(cai_bpe_t *t, const char *origin) {
    bpe_strmap_free(&t->by_str);
    CAI_CALL(bpe_strmap_init(&t->by_str, (size_t)t->n_ids));
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!(t->flags[id] & BPE_TOKEN_PRESENT)) continue;
        size_t len;
        const char *s = bpe_tok_str(t, id, &len);
        int64_t e;
        int ins;
        CAI_CALL(bpe_strmap_insert(&t->by_str, s, len, cai_bpe_hash_bytes(s, len), (uint64_t)id, &e, &ins));
        if (!ins)
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: token \"%.*s\" has two ids, %d and %d", origin, (int)len, s,
                             (int)t->by_str.vals[e], (int)id);
        size_t blen;
        const char *bytes = bpe_tok_bytes(t, id, &blen);
        if (blen == 1 && !(t->flags[id] & BPE_TOKEN_SPECIAL) && t->byte_id[(uint8_t)bytes[0]] < 0)
            t->byte_id[(uint8_t)bytes[0]] = id;
    }
    if (t->ignore_merges) {
        bpe_strmap_free(&t->by_bytes);
        CAI_CALL(bpe_strmap_init(&t->by_bytes, (size_t)t->n_ids));
        for (int32_t id = 0; id < t->n_ids; id++) {
            if ((t->flags[id] & (BPE_TOKEN_PRESENT | BPE_TOKEN_SPECIAL)) != BPE_TOKEN_PRESENT) continue;
            size_t len;
            const char *b = bpe_tok_bytes(t, id, &len);
            CAI_CALL(bpe_strmap_insert(&t->by_bytes, b, len, cai_bpe_hash_bytes(b, len), (uint64_t)id, NULL, NULL));
        }
    }
    return CAI_OK;
}

cai_status cai_bpe_push_merge(cai_bpe_t *t, int32_t a, int32_t b, int32_t result) {
    if (t->n_merges >= UINT32_MAX) return CAI_ERROR(CAI_ERR_FORMAT, "more than 2^32 merges");
    CAI_CALL(cai_bpe_reserve((void **)&t->merges, &t->merges_cap, t->n_merges + 1, sizeof *t->merges, "merge list"));
    t->merges[t->n_merges] = (bpe_merge){a, b, result};
    /* A pair listed twice keeps its last rank, as GPT-2 and Hugging Face do. */
    CAI_CALL(bpe_u64map_put(&t->pair_rank, bpe_pair_key(a, b), (uint64_t)t->n_merges));
    t->n_merges++;
    return CAI_OK;
}

cai_status cai_bpe_mark_special(cai_bpe_t *t, int32_t id) {
    CAI_CHECK_ARG(id >= 0 && id < t->n_ids && (t->flags[id] & BPE_TOKEN_PRESENT), "no token with id %d", (int)id);
    if (t->flags[id] & BPE_TOKEN_SPECIAL) return CAI_OK;
    CAI_CALL(cai_bpe_reserve((void **)&t->special_ids, &t->special_cap, t->n_special + 1, sizeof *t->special_ids,
                             "special tokens"));
    t->special_ids[t->n_special++] = id;
    t->flags[id] |= BPE_TOKEN_SPECIAL;
    t->bytes_off[id] = t->str_off[id];
    t->bytes_len[id] = t->str_len[id];
    t->special_first[(uint8_t)t->pool[t->str_off[id]]] = 1;
    /* A byte token turned special no longer stands for its byte. */
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] == id) t->byte_id[b] = -1;
    return CAI_OK;
}

cai_status cai_bpe_add_special(cai_bpe_t *t, const char *text, int32_t *id_out) {
    CAI_CHECK_ARG(t && text && text[0], "special token text must be non-empty");
    size_t len = strlen(text);
    int64_t e = bpe_strmap_find(&t->by_str, text, len, cai_bpe_hash_bytes(text, len));
    int32_t id;
    if (e >= 0) {
        id = (int32_t)t->by_str.vals[e];
    } else {
        CAI_CHECK_ARG(t->n_ids < INT32_MAX, "vocabulary is full");
        id = t->n_ids;
        CAI_CALL(cai_bpe_grow(t, id + 1));
        CAI_CALL(cai_bpe_define(t, id, text, len));
        size_t slen;
        const char *s = bpe_tok_str(t, id, &slen);
        CAI_CALL(bpe_strmap_insert(&t->by_str, s, slen, cai_bpe_hash_bytes(s, slen), (uint64_t)id, NULL, NULL));
    }
    CAI_CALL(cai_bpe_mark_special(t, id));
    if (id_out) *id_out = id;
    return CAI_OK;
}

cai_status cai_bpe_clone(const cai_bpe_t *src, cai_bpe_t **out) {
    cai_bpe_t *t;
    CAI_CALL(cai_bpe_alloc(src->n_ids, &t));
    cai_status st = CAI_OK;
    t->add_prefix_space = src->add_prefix_space;
    t->ignore_merges = src->ignore_merges;
    t->split_digits = src->split_digits;
    for (int32_t id = 0; id < src->n_ids && st == CAI_OK; id++) {
        if (!(src->flags[id] & BPE_TOKEN_PRESENT)) continue;
        size_t len;
        const char *s = bpe_tok_str(src, id, &len);
        st = cai_bpe_define(t, id, s, len);
    }
    if (st == CAI_OK) st = cai_bpe_index(t, "clone");
    for (size_t i = 0; i < src->n_merges && st == CAI_OK; i++)
        st = cai_bpe_push_merge(t, src->merges[i].a, src->merges[i].b, src->merges[i].result);
    for (size_t i = 0; i < src->n_special && st == CAI_OK; i++) st = cai_bpe_mark_special(t, src->special_ids[i]);
    if (st != CAI_OK) {
        cai_bpe_free(t);
        CAI_CALL(st);
    }
    *out = t;
    return CAI_OK;
}

/* ------------------------------------------------------------ queries */

int32_t cai_bpe_vocab_size(const cai_bpe_t *t) { return t->n_ids; }
size_t cai_bpe_merge_count(const cai_bpe_t *t) { return t->n_merges; }

int cai_bpe_is_special(const cai_bpe_t *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->flags[id] & BPE_TOKEN_SPECIAL);
}

cai_status cai_bpe_token_id(const cai_bpe_t *t, const char *spelling, int32_t *id) {
    size_t len = strlen(spelling);
    int64_t e = bpe_strmap_find(&t->by_str, spelling, len, cai_bpe_hash_bytes(spelling, len));
    if (e < 0) return CAI_ERROR(CAI_ERR_INVALID_ARG, "no token spelled \"%s\" in the vocabulary", spelling);
    *id = (int32_t)t->by_str.vals[e];
    return CAI_OK;
}

cai_status cai_bpe_token_bytes(const cai_bpe_t *t, int32_t id, const char **bytes, size_t *len) {
    if (id < 0 || id >= t->n_ids || !(t->flags[id] & BPE_TOKEN_PRESENT))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "token id %d is not in the vocabulary (size %d)", (int)id, (int)t->n_ids);
    *bytes = bpe_tok_bytes(t, id, len);
    return CAI_OK;
}

/* ------------------------------------------------------------ encoding */

static inline void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = v;
    return top;
}

static inline void push_pair(const cai_bpe_t *t, uint64_t *heap, size_t *nh, const int32_t *sym, int32_t pos,
                             int32_t next) {
    const uint64_t *r = bpe_u64map_get(&t->pair_rank, bpe_pair_key(sym[pos], sym[next]));
    if (r) heap_push(heap, nh, (*r << 32) | (uint32_t)pos);
}

/* Merge the bytes of one pre-token: lowest rank first, leftmost first among
 * equal ranks, over a linked list so each merge is O(log n). */
static cai_status bpe_word(cai_bpe_t *t, const uint8_t *w, size_t n, cai_token_buf *out) {
    for (size_t k = 0; k < n; k++)
        if (t->byte_id[w[k]] < 0)
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "the vocabulary has no token for byte 0x%02x, so text containing "
                             "it cannot be encoded",
                             w[k]);
    if (n == 1) return cai_token_buf_append(out, &t->byte_id[w[0]], 1);
    if (t->ignore_merges) {
        int64_t e = bpe_strmap_find(&t->by_bytes, w, n, cai_bpe_hash_bytes(w, n));
        if (e >= 0) {
            int32_t id = (int32_t)t->by_bytes.vals[e];
            return cai_token_buf_append(out, &id, 1);
        }
    }
    CAI_CHECK_ARG(n < INT32_MAX, "pre-token of %zu bytes is too long", n);
    size_t need = n * 3 * sizeof(int32_t) + 3 * n * sizeof(uint64_t) + 64;
    CAI_CALL(cai_bpe_reserve(&t->scratch, &t->scratch_cap, need, 1, "BPE merge workspace"));
    uint64_t *heap = t->scratch;
    int32_t *sym = (int32_t *)(heap + 3 * n), *next = sym + n;
    size_t nh = 0;
    for (size_t k = 0; k < n; k++) {
        sym[k] = t->byte_id[w[k]];
        next[k] = k + 1 < n ? (int32_t)(k + 1) : -1;
    }
    int32_t *prev = next + n;
    for (size_t k = 0; k < n; k++) prev[k] = (int32_t)k - 1;
    for (size_t k = 0; k + 1 < n; k++) push_pair(t, heap, &nh, sym, (int32_t)k, (int32_t)k + 1);
    while (nh) {
        uint64_t top = heap_pop(heap, &nh);
        int32_t pos = (int32_t)(uint32_t)top, q = next[pos];
        const bpe_merge *m = &t->merges[top >> 32];
        if (sym[pos] < 0 || q < 0 || sym[pos] != m->a || sym[q] != m->b) continue; /* stale entry */
        sym[pos] = m->result;
        sym[q] = -1;
        next[pos] = next[q];
        if (next[q] >= 0) prev[next[q]] = pos;
        if (prev[pos] >= 0) push_pair(t, heap, &nh, sym, prev[pos], pos);
        if (next[pos] >= 0) push_pair(t, heap, &nh, sym, pos, next[pos]);
    }
    size_t count = 0;
    for (int32_t k = 0; k >= 0; k = next[k]) sym[count++] = sym[k];
    return cai_token_buf_append(out, sym, count);
}

static cai_status encode_word(cai_bpe_t *t, const uint8_t *w, size_t n, cai_token_buf *out) {
    if (n > BPE_CACHE_MAX_WORD_BYTES) return bpe_word(t, w, n, out);
    uint64_t h = cai_bpe_hash_bytes(w, n);
    int64_t e = bpe_strmap_find(&t->cache, w, n, h);
    if (e >= 0) {
        uint64_t v = t->cache.vals[e];
        size_t count = (size_t)(v & 0xFFFFFF);
        const int32_t *ids = t->cache_ids + (v >> 24);
        if (out->len + count > out->cap) return cai_token_buf_append(out, ids, count);
        for (size_t k = 0; k < count; k++) out->ids[out->len + k] = ids[k]; /* usually 1 or 2 ids */
        out->len += count;
        return CAI_OK;
    }
    size_t before = out->len;
    CAI_CALL(bpe_word(t, w, n, out));
    size_t count = out->len - before;
    if (t->cache.count >= BPE_CACHE_MAX_WORDS || t->cache_ids_len + count > BPE_CACHE_MAX_IDS) {
        bpe_strmap_clear(&t->cache);
        t->cache_ids_len = 0;
    }
    if (!t->cache.cap) CAI_CALL(bpe_strmap_init(&t->cache, 4096));
    CAI_CALL(cai_bpe_reserve((void **)&t->cache_ids, &t->cache_ids_cap, t->cache_ids_len + count, sizeof(int32_t),
                             "BPE word cache"));
    memcpy(t->cache_ids + t->cache_ids_len, out->ids + before, count * sizeof(int32_t));
    CAI_CALL(bpe_strmap_insert(&t->cache, w, n, h, ((uint64_t)t->cache_ids_len << 24) | count, NULL, NULL));
    t->cache_ids_len += count;
    return CAI_OK;
}

static cai_status encode_words(cai_bpe_t *t, const uint8_t *s, size_t n, cai_token_buf *out) {
    for (size_t i = 0; i < n;) {
        size_t piece = t->split_digits ? cai_bpe_digit_piece_end(s, n, i) : n;
        while (i < piece) {
            size_t e = cai_bpe_pretoken_end(s, piece, i);
            CAI_CALL(encode_word(t, s + i, e - i, out));
            i = e;
        }
    }
    return CAI_OK;
}

static cai_status encode_segment(cai_bpe_t *t, const uint8_t *s, size_t n, cai_token_buf *out) {
    if (!n || !t->add_prefix_space || s[0] == ' ') return encode_words(t, s, n, out);
    /* Hugging Face's add_prefix_space: the segment reads as if a space preceded it. */
    cai_byte_buf spaced = {0};
    cai_status st = cai_byte_buf_append(&spaced, " ", 1);
    if (st == CAI_OK) st = cai_byte_buf_append(&spaced, s, n);
    if (st == CAI_OK) st = encode_words(t, (const uint8_t *)spaced.data, spaced.len, out);
    cai_byte_buf_free(&spaced);
    CAI_CALL(st);
    return CAI_OK;
}

cai_status cai_bpe_encode_ordinary(cai_bpe_t *t, const char *text, size_t len, cai_token_buf *out) {
    CAI_CHECK_ARG(t && out && (text || !len), "cai_bpe_encode_ordinary: NULL argument");
    CAI_CALL(encode_segment(t, (const uint8_t *)text, len, out));
    return CAI_OK;
}

cai_status cai_bpe_encode(cai_bpe_t *t, const char *text, size_t len, cai_token_buf *out) {
    CAI_CHECK_ARG(t && out && (text || !len), "cai_bpe_encode: NULL argument");
    const uint8_t *s = (const uint8_t *)text;
    if (!t->n_special) {
        CAI_CALL(encode_segment(t, s, len, out));
        return CAI_OK;
    }
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        if (!t->special_first[s[i]]) {
            i++;
            continue;
        }
        /* Leftmost, then longest special token. */
        int32_t best = -1;
        size_t best_len = 0;
        for (size_t k = 0; k < t->n_special; k++) {
            int32_t id = t->special_ids[k];
            size_t sl;
            const char *sp = bpe_tok_str(t, id, &sl);
            if (sl > best_len && sl <= len - i && memcmp(sp, s + i, sl) == 0) best = id, best_len = sl;
        }
        if (best < 0) {
            i++;
            continue;
        }
        CAI_CALL(encode_segment(t, s + seg, i - seg, out));
        CAI_CALL(cai_token_buf_append(out, &best, 1));
        i += best_len;
        seg = i;
    }
    CAI_CALL(encode_segment(t, s + seg, len - seg, out));
    return CAI_OK;
}

int cai_bpe_split_digits(const cai_bpe_t *t) { return t ? t->split_digits : 0; }

void cai_bpe_set_split_digits(cai_bpe_t *t, int on) {
    if (t) t->split_digits = on != 0;
}

/* ------------------------------------------------------------ decoding */

cai_status cai_bpe_decode(const cai_bpe_t *t, const int32_t *ids, size_t n, cai_byte_buf *out) {
    CAI_CHECK_ARG(t && out && (ids || !n), "cai_bpe_decode: NULL argument");
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !(t->flags[id] & BPE_TOKEN_PRESENT))
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "token id %d at position %zu is not in the vocabulary (ids 0..%d)",
                             (int)id, i, (int)t->n_ids - 1);
        size_t len;
        const char *b = bpe_tok_bytes(t, id, &len);
        CAI_CALL(cai_byte_buf_append(out, b, len));
    }
    return CAI_OK;
}
