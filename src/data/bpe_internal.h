/* Internals of the byte-level BPE tokenizer (src/data/bpe*.c): hash maps,
 * character classes, and the tokenizer struct shared by the loader, the
 * encoder, the trainer and the writer. Not installed. */
#ifndef CAI_BPE_INTERNAL_H
#define CAI_BPE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/data.h"

/* ------------------------------------------------------------ char classes */

/* The four classes GPT-2's pattern distinguishes; generated tables use these
 * numbers (src/data/gen_bpe_unicode.py). */
enum { BPE_CLASS_OTHER = 0, BPE_CLASS_LETTER = 1, BPE_CLASS_NUMBER = 2, BPE_CLASS_SPACE = 3 };

extern const char cai_bpe_unicode_version[];
extern const uint8_t cai_bpe_ascii_class[128];
extern const uint32_t cai_bpe_class_runs[];
extern const size_t cai_bpe_class_run_count;

int cai_bpe_codepoint_class(uint32_t cp);

/* Decode one strictly valid UTF-8 character at s[0..n) (n >= 1). Returns its
 * length and stores the code point; a byte that does not start a valid
 * sequence (overlong, surrogate, > U+10FFFF, truncated, stray continuation)
 * is returned as a 1-byte character with code point UINT32_MAX. */
size_t cai_bpe_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);

/* End of the pre-token that starts at s[i] (i < n) under GPT-2's pattern
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * with each invalid byte taken as one character of class OTHER. */
size_t cai_bpe_pretoken_end(const uint8_t *s, size_t n, size_t i);
/* End of the piece that starts at s[i] (i < n) under Hugging Face's
 * Digits(individual_digits=true): a numeric character (\p{N}, Rust's
 * char::is_numeric) alone, else the run up to the next numeric character.
 * The GPT-2 pattern then splits each piece on its own (cai_bpe_pretoken_end
 * with n = the piece's end), as HF's Sequence[Digits, ByteLevel] does. */
size_t cai_bpe_digit_piece_end(const uint8_t *s, size_t n, size_t i);

/* GPT-2's reversible byte <-> printable character mapping (bytes_to_unicode). */
uint32_t cai_bpe_byte_to_char(uint8_t b);
/* Byte for a mapped character, or -1 when the character is not in the map. */
int cai_bpe_char_to_byte(uint32_t cp);

/* ------------------------------------------------------------ hashing */

uint64_t cai_bpe_hash_bytes(const void *p, size_t n);

/* Open-addressing map from 64-bit keys (a pair of token ids) to 64-bit values.
 * UINT64_MAX is reserved as the empty key. */
typedef struct {
    uint64_t *keys;
    uint64_t *vals;
    size_t cap; /* power of two */
    size_t count;
} bpe_u64map;

cai_status bpe_u64map_init(bpe_u64map *m, size_t expected);
void bpe_u64map_free(bpe_u64map *m);
/* Pointer to the value of key, or NULL. */
uint64_t *bpe_u64map_get(const bpe_u64map *m, uint64_t key);
/* Insert or overwrite. */
cai_status bpe_u64map_put(bpe_u64map *m, uint64_t key, uint64_t val);

static inline uint64_t bpe_pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

/* Open-addressing map from byte strings (copied into an owned pool) to
 * 64-bit values. */
typedef struct {
    uint64_t *slots; /* (hash >> 32) << 32 | (entry index + 1); 0 = empty */
    size_t cap;      /* power of two */
    uint64_t *hashes;
    uint64_t *key_off; /* offset of each key in pool */
    uint32_t *key_len;
    uint64_t *vals;
    size_t count, entries_cap;
    char *pool;
    size_t pool_len, pool_cap;
} bpe_strmap;

cai_status bpe_strmap_init(bpe_strmap *m, size_t expected);
void bpe_strmap_free(bpe_strmap *m);
void bpe_strmap_clear(bpe_strmap *m);
/* Index of the entry for key, or -1. */
int64_t bpe_strmap_find(const bpe_strmap *m, const void *key, size_t len, uint64_t hash);
/* Index of the entry for key, inserted with value `val` when absent
 * (*inserted says which). */
cai_status bpe_strmap_insert(bpe_strmap *m, const void *key, size_t len, uint64_t hash, uint64_t val, int64_t *index,
                             int *inserted);
static inline const char *bpe_strmap_key(const bpe_strmap *m, int64_t i) { return m->pool + m->key_off[i]; }

/* ------------------------------------------------------------ byte buffers */

cai_status cai_bpe_reserve(void **buf, size_t *cap, size_t need, size_t elem, const char *what);
cai_status cai_byte_buf_append(cai_byte_buf *b, const void *p, size_t n);
/* Resize n parallel arrays (element sizes elem[i]) to count elements each. */
cai_status cai_bpe_resize_arrays(size_t count, size_t n, void **const arrays[], const size_t elem[], const char *what);

/* ------------------------------------------------------------ the model */

enum { BPE_TOKEN_PRESENT = 1, BPE_TOKEN_SPECIAL = 2 };

typedef struct {
    int32_t a, b, result;
} bpe_merge;

struct cai_bpe {
    /* Tokens by id. `str` is the vocabulary's spelling (GPT-2's mapped
     * characters, e.g. "\u0120world"); `bytes` is what the token decodes to. */
    int32_t n_ids; /* largest id + 1 */
    int32_t ids_cap;
    uint8_t *flags;    /* BPE_TOKEN_* per id */
    uint64_t *str_off; /* into pool */
    uint32_t *str_len;
    uint64_t *bytes_off; /* into pool */
    uint32_t *bytes_len;
    char *pool; /* spellings and bytes, appended */
    size_t pool_len, pool_cap;
    bpe_strmap by_str;    /* vocabulary spelling -> id */
    int32_t byte_id[256]; /* single-byte token of each byte, -1 if none */

    bpe_merge *merges; /* in rank order */
    size_t n_merges, merges_cap;
    bpe_u64map pair_rank; /* (a, b) -> rank */

    /* Special (added) tokens, matched verbatim before pre-tokenisation. */
    int32_t *special_ids;
    size_t n_special, special_cap;
    uint8_t special_first[256]; /* a special token starts with this byte */

    int add_prefix_space; /* HF ByteLevel option: prepend ' ' to each segment */
    int ignore_merges;    /* HF BPE option: a word that is a token is kept whole */
    int split_digits;     /* HF Digits(individual_digits) before ByteLevel */
    bpe_strmap by_bytes;  /* decoded bytes -> id, only when ignore_merges */

    /* Encoder state (the reason encode needs a non-const handle). */
    bpe_strmap cache; /* word bytes -> (offset << 24 | count) into cache_ids */
    int32_t *cache_ids;
    size_t cache_ids_len, cache_ids_cap;
    void *scratch; /* merge workspace, grown on demand */
    size_t scratch_cap;
};

/* An empty tokenizer with `n_ids` absent tokens. */
cai_status cai_bpe_alloc(int32_t n_ids, cai_bpe_t **out);
/* Define absent token `id` (< n_ids) with its vocabulary spelling; its bytes
 * are the spelling mapped back through GPT-2's byte table, or the spelling
 * itself when it has characters outside that table. */
cai_status cai_bpe_define(cai_bpe_t *tok, int32_t id, const char *str, size_t len);
/* Same, from the token's bytes (spelling computed). */
cai_status cai_bpe_define_bytes(cai_bpe_t *tok, int32_t id, const void *bytes, size_t len);
/* Grow to n_ids ids (new ones absent). */
cai_status cai_bpe_grow(cai_bpe_t *tok, int32_t n_ids);
/* After all tokens are defined: build the spelling map and byte table. */
cai_status cai_bpe_index(cai_bpe_t *tok, const char *origin);
/* Append merge (a, b) -> result in rank order. */
cai_status cai_bpe_push_merge(cai_bpe_t *tok, int32_t a, int32_t b, int32_t result);
/* Make `id` a special token decoding to its spelling verbatim. */
cai_status cai_bpe_mark_special(cai_bpe_t *tok, int32_t id);

static inline const char *bpe_tok_str(const cai_bpe_t *t, int32_t id, size_t *len) {
    *len = t->str_len[id];
    return t->pool + t->str_off[id];
}
static inline const char *bpe_tok_bytes(const cai_bpe_t *t, int32_t id, size_t *len) {
    *len = t->bytes_len[id];
    return t->pool + t->bytes_off[id];
}

/* UTF-8 encode one code point into out (at least 4 bytes); returns length. */
size_t cai_bpe_utf8_encode(uint32_t cp, char *out);
/* GPT-2 spelling of raw bytes: each byte as its mapped character, in UTF-8. */
cai_status cai_bpe_spell(const void *bytes, size_t n, cai_byte_buf *out);

#endif
