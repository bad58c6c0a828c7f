/* BPE training: count pre-tokenised words, then repeatedly merge the most
 * frequent adjacent pair. Pair counts and the words each pair occurs in are
 * kept up to date per merge (only the words holding the merged pair are
 * visited), and a max-heap with lazy deletion picks the next pair. */
#include "cai_config.h"
#include "bpe_internal.h"

#include <stdlib.h>
#include <string.h>

struct cai_bpe_trainer {
    size_t vocab_size;
    uint64_t min_frequency;
    int split_digits;
    int fed; /* a document was counted: the pre-tokenisation is fixed */
    char **specials;
    size_t *special_len;
    size_t n_special;
    uint8_t special_first[256];
    bpe_strmap words; /* pre-token bytes -> occurrence count */
};

cai_status cai_bpe_trainer_init(const cai_bpe_train_opts *opts, cai_bpe_trainer_t **out) {
    CAI_CHECK_ARG(opts && out, "cai_bpe_trainer_init: NULL argument");
    *out = NULL;
    size_t base = 256 + opts->n_special;
    CAI_CHECK_ARG(opts->vocab_size >= base && opts->vocab_size < INT32_MAX,
                  "vocab_size %zu cannot hold the 256 byte tokens plus %zu special tokens: use at least %zu",
                  opts->vocab_size, opts->n_special, base);
    CAI_CHECK_ARG(opts->n_special == 0 || opts->special_tokens, "n_special is %zu but special_tokens is NULL",
                  opts->n_special);
    for (size_t i = 0; i < opts->n_special; i++) {
        CAI_CHECK_ARG(opts->special_tokens[i] && opts->special_tokens[i][0], "special token %zu is empty", i);
        for (size_t k = 0; k < i; k++)
            CAI_CHECK_ARG(strcmp(opts->special_tokens[i], opts->special_tokens[k]) != 0,
                          "special token \"%s\" is listed twice", opts->special_tokens[i]);
    }
    cai_bpe_trainer_t *tr = calloc(1, sizeof *tr);
    if (!tr) return CAI_ERROR(CAI_ERR_NOMEM, "cannot allocate a BPE trainer");
    tr->vocab_size = opts->vocab_size;
    tr->min_frequency = opts->min_frequency ? opts->min_frequency : 1;
    cai_status st = bpe_strmap_init(&tr->words, 1 << 16);
    if (st == CAI_OK && opts->n_special) {
        tr->specials = calloc(opts->n_special, sizeof *tr->specials);
        tr->special_len = calloc(opts->n_special, sizeof *tr->special_len);
        if (!tr->specials || !tr->special_len) st = CAI_ERROR(CAI_ERR_NOMEM, "cannot copy special tokens");
    }
    for (size_t i = 0; st == CAI_OK && i < opts->n_special; i++) {
        size_t len = strlen(opts->special_tokens[i]);
        tr->specials[i] = malloc(len + 1);
        if (!tr->specials[i]) {
            st = CAI_ERROR(CAI_ERR_NOMEM, "cannot copy special token %zu", i);
            break;
        }
        memcpy(tr->specials[i], opts->special_tokens[i], len + 1);
        tr->special_len[i] = len;
        tr->special_first[(uint8_t)tr->specials[i][0]] = 1;
        tr->n_special++;
    }
    if (st != CAI_OK) {
        cai_bpe_trainer_free(tr);
        CAI_CALL(st);
    }
    *out = tr;
    return CAI_OK;
}

void cai_bpe_trainer_free(cai_bpe_trainer_t *tr) {
    if (!tr) return;
    for (size_t i = 0; i < tr->n_special; i++) free(tr->specials[i]);
    free(tr->specials);
    free(tr->special_len);
    bpe_strmap_free(&tr->words);
    free(tr);
}

static cai_status count_words(cai_bpe_trainer_t *tr, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t piece = tr->split_digits ? cai_bpe_digit_piece_end(s, n, i) : n;
        while (i < piece) {
            size_t e = cai_bpe_pretoken_end(s, piece, i);
            int64_t idx;
            int ins;
            CAI_CALL(bpe_strmap_insert(&tr->words, s + i, e - i, cai_bpe_hash_bytes(s + i, e - i), 1, &idx, &ins));
            if (!ins) tr->words.vals[idx]++;
            i = e;
        }
    }
    return CAI_OK;
}

cai_status cai_bpe_trainer_set_split_digits(cai_bpe_trainer_t *tr, int on) {
    CAI_CHECK_ARG(tr, "cai_bpe_trainer_set_split_digits: NULL trainer");
    CAI_CHECK_ARG(!tr->fed || tr->split_digits == (on != 0),
                  "cai_bpe_trainer_set_split_digits: words were already counted with digit splitting %s",
                  tr->split_digits ? "on" : "off");
    tr->split_digits = on != 0;
    return CAI_OK;
}

cai_status cai_bpe_trainer_feed(cai_bpe_trainer_t *tr, const char *text, size_t len) {
    CAI_CHECK_ARG(tr && (text || !len), "cai_bpe_trainer_feed: NULL argument");
    tr->fed = 1;
    const uint8_t *s = (const uint8_t *)text;
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        size_t best = 0;
        if (tr->special_first[s[i]])
            for (size_t k = 0; k < tr->n_special; k++)
                if (tr->special_len[k] > best && tr->special_len[k] <= len - i &&
                    memcmp(tr->specials[k], s + i, tr->special_len[k]) == 0)
                    best = tr->special_len[k];
        if (!best) {
            i++;
            continue;
        }
        CAI_CALL(count_words(tr, s + seg, i - seg));
        i += best;
        seg = i;
    }
    CAI_CALL(count_words(tr, s + seg, len - seg));
    return CAI_OK;
}

/* ------------------------------------------------------------ merging */

typedef struct {
    uint32_t *v;
    uint32_t n, cap;
} u32vec;

typedef struct {
    int64_t count;
    int32_t a, b;
    uint32_t pair;
} heap_entry;

typedef struct {
    /* words */
    size_t n_words;
    int64_t *wcount;
    uint64_t *woff;
    uint32_t *wlen;
    uint32_t *wstamp;
    int32_t *syms;
    /* pairs */
    bpe_u64map index; /* (a, b) -> pair number */
    int32_t *pa, *pb;
    int64_t *pcount;
    u32vec *where;
    uint32_t *pstamp;
    size_t n_pairs, pairs_cap;
    uint32_t *touched;
    size_t n_touched, touched_cap;
    uint32_t stamp;
    /* heap */
    heap_entry *heap;
    size_t n_heap, heap_cap;
} train_state;

static void state_free(train_state *s) {
    free(s->wcount);
    free(s->woff);
    free(s->wlen);
    free(s->wstamp);
    free(s->syms);
    bpe_u64map_free(&s->index);
    free(s->pa);
    free(s->pb);
    free(s->pcount);
    for (size_t i = 0; i < s->n_pairs; i++) free(s->where[i].v);
    free(s->where);
    free(s->pstamp);
    free(s->touched);
    free(s->heap);
}

static inline int heap_before(const heap_entry *x, const heap_entry *y) {
    if (x->count != y->count) return x->count > y->count;
    if (x->a != y->a) return x->a < y->a;
    return x->b < y->b;
}

static void sift_down(heap_entry *h, size_t n, size_t i) {
    heap_entry v = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_before(&h[c + 1], &h[c])) c++;
        if (!heap_before(&h[c], &v)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

static cai_status heap_push(train_state *s, uint32_t p) {
    CAI_CALL(cai_bpe_reserve((void **)&s->heap, &s->heap_cap, s->n_heap + 1, sizeof *s->heap, "BPE pair heap"));
    heap_entry v = {s->pcount[p], s->pa[p], s->pb[p], p};
    size_t i = s->n_heap++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        if (!heap_before(&v, &s->heap[par])) break;
        s->heap[i] = s->heap[par];
        i = par;
    }
    s->heap[i] = v;
    return CAI_OK;
}

static heap_entry heap_pop(train_state *s) {
    heap_entry top = s->heap[0];
    s->heap[0] = s->heap[--s->n_heap];
    if (s->n_heap) sift_down(s->heap, s->n_heap, 0);
    return top;
}

/* Add delta to the count of pair (a, b) as seen in word w. */
static cai_status pair_change(train_state *s, int32_t a, int32_t b, int64_t delta, uint32_t w) {
    uint64_t key = bpe_pair_key(a, b);
    uint64_t *slot = bpe_u64map_get(&s->index, key);
    uint32_t p;
    if (slot) {
        p = (uint32_t)*slot;
    } else {
        if (s->n_pairs >= UINT32_MAX) return CAI_ERROR(CAI_ERR_NOMEM, "more than 2^32 distinct pairs");
        if (s->n_pairs + 1 > s->pairs_cap) {
            size_t nc = s->pairs_cap ? s->pairs_cap * 2 : 4096;
            void **const arrays[] = {(void **)&s->pa, (void **)&s->pb, (void **)&s->pcount, (void **)&s->pstamp,
                                     (void **)&s->where};
            const size_t elem[] = {sizeof *s->pa, sizeof *s->pb, sizeof *s->pcount, sizeof *s->pstamp,
                                   sizeof *s->where};
            CAI_CALL(cai_bpe_resize_arrays(nc, 5, arrays, elem, "the BPE pair table"));
            s->pairs_cap = nc;
        }
        p = (uint32_t)s->n_pairs++;
        s->pa[p] = a;
        s->pb[p] = b;
        s->pcount[p] = 0;
        s->pstamp[p] = 0;
        s->where[p] = (u32vec){0};
        CAI_CALL(bpe_u64map_put(&s->index, key, p));
    }
    s->pcount[p] += delta;
    if (delta <= 0) return CAI_OK;
    u32vec *wv = &s->where[p];
    if (!wv->n || wv->v[wv->n - 1] != w) {
        if (wv->n == wv->cap) {
            uint32_t nc = wv->cap ? wv->cap * 2 : 4;
            uint32_t *nv = realloc(wv->v, (size_t)nc * sizeof *nv);
            if (!nv) return CAI_ERROR(CAI_ERR_NOMEM, "cannot grow the word list of a pair to %u", (unsigned)nc);
            wv->v = nv;
            wv->cap = nc;
        }
        wv->v[wv->n++] = w;
    }
    if (s->pstamp[p] != s->stamp) {
        s->pstamp[p] = s->stamp;
        CAI_CALL(cai_bpe_reserve((void **)&s->touched, &s->touched_cap, s->n_touched + 1, sizeof *s->touched,
                                 "BPE touched pairs"));
        s->touched[s->n_touched++] = p;
    }
    return CAI_OK;
}

/* Replace every (a, b) in word w by x, updating the counts of the pairs that
 * disappear and appear around each occurrence. */
static cai_status merge_in_word(train_state *s, uint32_t w, int32_t a, int32_t b, int32_t x) {
    int32_t *sym = s->syms + s->woff[w];
    uint32_t n = s->wlen[w], o = 0;
    int64_t c = s->wcount[w];
    for (uint32_t i = 0; i < n;) {
        if (i + 1 < n && sym[i] == a && sym[i + 1] == b) {
            if (o > 0) {
                CAI_CALL(pair_change(s, sym[o - 1], a, -c, w));
                CAI_CALL(pair_change(s, sym[o - 1], x, c, w));
            }
            if (i + 2 < n) {
                CAI_CALL(pair_change(s, b, sym[i + 2], -c, w));
                CAI_CALL(pair_change(s, x, sym[i + 2], c, w));
            }
            CAI_CALL(pair_change(s, a, b, -c, w));
            sym[o++] = x;
            i += 2;
        } else {
            sym[o++] = sym[i++];
        }
    }
    s->wlen[w] = o;
    return CAI_OK;
}

static cai_status load_words(train_state *s, const bpe_strmap *words, const int32_t *byte_id) {
    size_t n = words->count, total = 0;
    for (size_t w = 0; w < n; w++) total += words->key_len[w];
    s->n_words = n;
    s->wcount = malloc((n ? n : 1) * sizeof *s->wcount);
    s->woff = malloc((n ? n : 1) * sizeof *s->woff);
    s->wlen = malloc((n ? n : 1) * sizeof *s->wlen);
    s->wstamp = calloc(n ? n : 1, sizeof *s->wstamp);
    s->syms = malloc((total ? total : 1) * sizeof *s->syms);
    if (!s->wcount || !s->woff || !s->wlen || !s->wstamp || !s->syms)
        return CAI_ERROR(CAI_ERR_NOMEM, "cannot hold %zu distinct words (%zu bytes) for BPE training", n, total);
    CAI_CALL(bpe_u64map_init(&s->index, 1 << 16));
    size_t off = 0;
    for (size_t w = 0; w < n; w++) {
        const uint8_t *k = (const uint8_t *)bpe_strmap_key(words, (int64_t)w);
        s->wcount[w] = (int64_t)words->vals[w];
        s->woff[w] = off;
        s->wlen[w] = words->key_len[w];
        for (uint32_t i = 0; i < s->wlen[w]; i++) s->syms[off + i] = byte_id[k[i]];
        for (uint32_t i = 0; i + 1 < s->wlen[w]; i++)
            CAI_CALL(pair_change(s, s->syms[off + i], s->syms[off + i + 1], s->wcount[w], (uint32_t)w));
        off += s->wlen[w];
    }
    s->n_touched = 0;
    CAI_CALL(cai_bpe_reserve((void **)&s->heap, &s->heap_cap, s->n_pairs + 1, sizeof *s->heap, "BPE pair heap"));
    for (size_t p = 0; p < s->n_pairs; p++) s->heap[p] = (heap_entry){s->pcount[p], s->pa[p], s->pb[p], (uint32_t)p};
    s->n_heap = s->n_pairs;
    for (size_t i = s->n_heap / 2; i-- > 0;) sift_down(s->heap, s->n_heap, i);
    return CAI_OK;
}

/* Token for the concatenation of a and b: an existing one when another merge
 * already spelled the same bytes (Hugging Face's trainer does the same). */
static cai_status token_for(cai_bpe_t *t, bpe_strmap *by_bytes, int32_t a, int32_t b, cai_byte_buf *tmp, int32_t *id) {
    size_t la, lb;
    const char *pa = bpe_tok_bytes(t, a, &la);
    tmp->len = 0;
    CAI_CALL(cai_byte_buf_append(tmp, pa, la));
    const char *pb = bpe_tok_bytes(t, b, &lb);
    CAI_CALL(cai_byte_buf_append(tmp, pb, lb));
    uint64_t h = cai_bpe_hash_bytes(tmp->data, tmp->len);
    int64_t e = bpe_strmap_find(by_bytes, tmp->data, tmp->len, h);
    if (e >= 0) {
        *id = (int32_t)by_bytes->vals[e];
        return CAI_OK;
    }
    *id = t->n_ids;
    CAI_CALL(cai_bpe_grow(t, *id + 1));
    CAI_CALL(cai_bpe_define_bytes(t, *id, tmp->data, tmp->len));
    CAI_CALL(bpe_strmap_insert(by_bytes, tmp->data, tmp->len, h, (uint64_t)*id, NULL, NULL));
    return CAI_OK;
}

static cai_status train(cai_bpe_trainer_t *tr, cai_bpe_t *t, train_state *s, size_t *distinct_tokens) {
    bpe_strmap by_bytes = {0};
    cai_byte_buf tmp = {0};
    cai_status st;
    CAI_CALL_GOTO(bpe_strmap_init(&by_bytes, tr->vocab_size), st, done);
    /* Specials first, then the bytes in the order of their spelling. */
    for (size_t k = 0; k < tr->n_special; k++)
        CAI_CALL_GOTO(cai_bpe_define(t, (int32_t)k, tr->specials[k], tr->special_len[k]), st, done);
    int32_t byte_id[256];
    for (int b = 0; b < 256; b++) {
        uint32_t c = cai_bpe_byte_to_char((uint8_t)b);
        int rank = 0;
        for (int o = 0; o < 256; o++) rank += cai_bpe_byte_to_char((uint8_t)o) < c;
        byte_id[b] = (int32_t)tr->n_special + rank;
        uint8_t byte = (uint8_t)b;
        CAI_CALL_GOTO(cai_bpe_define_bytes(t, byte_id[b], &byte, 1), st, done);
        CAI_CALL_GOTO(bpe_strmap_insert(&by_bytes, &byte, 1, cai_bpe_hash_bytes(&byte, 1), (uint64_t)byte_id[b], NULL,
                                        NULL),
                      st, done);
    }
    CAI_CALL_GOTO(load_words(s, &tr->words, byte_id), st, done);
    size_t tokens = tr->n_special + 256;
    while (tokens < tr->vocab_size && s->n_heap) {
        heap_entry top = heap_pop(s);
        uint32_t p = top.pair;
        if (s->pcount[p] != top.count) { /* stale: its count fell since it was pushed */
            if (s->pcount[p] > 0) CAI_CALL_GOTO(heap_push(s, p), st, done);
            continue;
        }
        if ((uint64_t)top.count < tr->min_frequency) break;
        int32_t x;
        int32_t before = t->n_ids;
        CAI_CALL_GOTO(token_for(t, &by_bytes, top.a, top.b, &tmp, &x), st, done);
        tokens += t->n_ids > before;
        CAI_CALL_GOTO(cai_bpe_push_merge(t, top.a, top.b, x), st, done);
        s->stamp++;
        s->n_touched = 0;
        /* Take the word list: merging may append to other pairs' lists (and
         * reallocate the array of lists), never to this pair's. */
        u32vec wl = s->where[p];
        s->where[p] = (u32vec){0};
        for (uint32_t k = 0; k < wl.n && st == CAI_OK; k++) {
            uint32_t w = wl.v[k];
            if (s->wstamp[w] == s->stamp) continue;
            s->wstamp[w] = s->stamp;
            st = merge_in_word(s, w, top.a, top.b, x);
        }
        free(wl.v);
        if (st != CAI_OK) goto done;
        s->pcount[p] = 0;
        for (size_t k = 0; k < s->n_touched; k++)
            if (s->pcount[s->touched[k]] > 0) CAI_CALL_GOTO(heap_push(s, s->touched[k]), st, done);
    }
    *distinct_tokens = tokens;
    st = CAI_OK;
done:
    bpe_strmap_free(&by_bytes);
    cai_byte_buf_free(&tmp);
    return st;
}

cai_status cai_bpe_trainer_finish(cai_bpe_trainer_t *tr, cai_bpe_t **out) {
    CAI_CHECK_ARG(tr && out, "cai_bpe_trainer_finish: NULL argument");
    *out = NULL;
    double t0 = cai_time_now();
    cai_bpe_t *t;
    CAI_CALL(cai_bpe_alloc((int32_t)(tr->n_special + 256), &t));
    train_state s = {0};
    size_t tokens = 0;
    cai_status st;
    CAI_CALL_GOTO(train(tr, t, &s, &tokens), st, fail);
    CAI_CALL_GOTO(cai_bpe_index(t, "trained vocabulary"), st, fail);
    for (size_t k = 0; k < tr->n_special; k++) CAI_CALL_GOTO(cai_bpe_mark_special(t, (int32_t)k), st, fail);
    if (tokens < tr->vocab_size)
        CAI_WARN(
            "BPE training stopped at %zu tokens of the %zu asked for: no pair occurs %llu or more times in "
            "the corpus (%zu distinct words)",
            tokens, tr->vocab_size, (unsigned long long)tr->min_frequency, s.n_words);
    CAI_DEBUG("trained byte-level BPE: %zu tokens, %zu merges from %zu distinct words in %.2f s", tokens, t->n_merges,
              s.n_words, cai_time_now() - t0);
    state_free(&s);
    t->split_digits = tr->split_digits;
    *out = t;
    return CAI_OK;
fail:
    state_free(&s);
    cai_bpe_free(t);
    return st;
}

cai_status cai_bpe_train(const char *const *texts, const size_t *lens, size_t n_texts, const cai_bpe_train_opts *opts,
                         cai_bpe_t **out) {
    CAI_CHECK_ARG(texts || !n_texts, "cai_bpe_train: texts is NULL");
    cai_bpe_trainer_t *tr;
    CAI_CALL(cai_bpe_trainer_init(opts, &tr));
    cai_status st = CAI_OK;
    for (size_t i = 0; i < n_texts && st == CAI_OK; i++)
        st = cai_bpe_trainer_feed(tr, texts[i], lens ? lens[i] : strlen(texts[i]));
    if (st == CAI_OK) st = cai_bpe_trainer_finish(tr, out);
    cai_bpe_trainer_free(tr);
    CAI_CALL(st);
    return CAI_OK;
}
