/* The KV block pool: see kv_cache.h. Freed blocks go to the tail of the free
 * list and are reused from its head, so a block a finished request left
 * behind stays findable by the prefix index for as long as possible. */
#include "cai_config.h"
#include "kv_cache.h"

#include <string.h>

static void unlink_free(cai_kv_pool *p, int32_t b) {
    int32_t pr = p->prev[b], nx = p->next[b];
    if (pr >= 0) p->next[pr] = nx;
    else p->head = nx;
    if (nx >= 0) p->prev[nx] = pr;
    else p->tail = pr;
    p->prev[b] = p->next[b] = -1;
    p->n_free--;
}

static void push_free(cai_kv_pool *p, int32_t b) {
    p->prev[b] = p->tail;
    p->next[b] = -1;
    if (p->tail >= 0) p->next[p->tail] = b;
    else p->head = b;
    p->tail = b;
    p->n_free++;
}

cai_status cai_kv_pool_init(cai_kv_pool *p, int64_t n_blocks, int64_t block_size) {
    memset(p, 0, sizeof *p);
    CAI_CHECK_ARG(n_blocks >= 1 && n_blocks < INT32_MAX / 2 && block_size >= 1, "kv pool: %lld blocks of %lld",
                  (long long)n_blocks, (long long)block_size);
    p->n = n_blocks;
    p->bs = block_size;
    p->table_cap = 16;
    while (p->table_cap < 2 * n_blocks) p->table_cap *= 2;
    CAI_CALL(cai_calloc((void **)&p->ref, (size_t)n_blocks, sizeof *p->ref, "kv pool refs"));
    CAI_CALL(cai_calloc((void **)&p->prev, (size_t)n_blocks, sizeof *p->prev, "kv pool list"));
    CAI_CALL(cai_calloc((void **)&p->next, (size_t)n_blocks, sizeof *p->next, "kv pool list"));
    CAI_CALL(cai_calloc((void **)&p->hash, (size_t)n_blocks, sizeof *p->hash, "kv pool hashes"));
    CAI_CALL(cai_calloc((void **)&p->parent, (size_t)n_blocks, sizeof *p->parent, "kv pool parents"));
    CAI_CALL(cai_calloc((void **)&p->tokens, (size_t)(n_blocks * block_size), sizeof *p->tokens, "kv pool tokens"));
    CAI_CALL(cai_calloc((void **)&p->table, (size_t)p->table_cap, sizeof *p->table, "kv pool index"));
    for (int64_t i = 0; i < p->table_cap; i++) p->table[i] = -1;
    p->head = p->tail = -1;
    for (int32_t b = 0; b < (int32_t)n_blocks; b++) push_free(p, b);
    return CAI_OK;
}

void cai_kv_pool_free(cai_kv_pool *p) {
    cai_free(p->ref);
    cai_free(p->prev);
    cai_free(p->next);
    cai_free(p->hash);
    cai_free(p->parent);
    cai_free(p->tokens);
    cai_free(p->table);
    memset(p, 0, sizeof *p);
}

static int64_t slot_of(const cai_kv_pool *p, uint64_t h) { return (int64_t)(h & (uint64_t)(p->table_cap - 1)); }

static void unregister(cai_kv_pool *p, int32_t b) {
    if (!p->hash[b]) return;
    for (int64_t i = slot_of(p, p->hash[b]), k = 0; k < p->table_cap; k++, i = (i + 1) & (p->table_cap - 1)) {
        if (p->table[i] == -1) break;
        if (p->table[i] == b) {
            p->table[i] = -2;
            break;
        }
    }
    p->hash[b] = 0;
}

int32_t cai_kv_pool_alloc(cai_kv_pool *p) {
    if (p->head < 0) return -1;
    int32_t b = p->head;
    unlink_free(p, b);
    unregister(p, b);
    p->ref[b] = 1;
    return b;
}

void cai_kv_pool_retain(cai_kv_pool *p, int32_t b) {
    if (p->ref[b]++ == 0) unlink_free(p, b);
}

void cai_kv_pool_release(cai_kv_pool *p, int32_t b) {
    if (--p->ref[b] == 0) push_free(p, b);
}

uint64_t cai_kv_block_hash(uint64_t parent_hash, const int32_t *tokens, int64_t bs) {
    uint64_t h = 1469598103934665603ull ^ (parent_hash * 0x9e3779b97f4a7c15ull);
    for (int64_t i = 0; i < bs; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int k = 0; k < 4; k++) {
            h ^= (t >> (8 * k)) & 0xffu;
            h *= 1099511628211ull;
        }
    }
    return h ? h : 1; /* 0 means "not registered" */
}

void cai_kv_pool_register(cai_kv_pool *p, int32_t b, uint64_t h, int32_t parent, const int32_t *tokens) {
    if (p->hash[b] || cai_kv_pool_lookup(p, h, parent, tokens) >= 0) return;
    int64_t i = slot_of(p, h);
    while (p->table[i] >= 0) i = (i + 1) & (p->table_cap - 1);
    p->table[i] = b;
    p->hash[b] = h;
    p->parent[b] = parent;
    memcpy(p->tokens + (size_t)b * (size_t)p->bs, tokens, (size_t)p->bs * sizeof *tokens);
}

void cai_kv_pool_forget(cai_kv_pool *p) {
    for (int64_t i = 0; i < p->table_cap; i++) p->table[i] = -1;
    for (int64_t b = 0; b < p->n; b++) p->hash[b] = 0;
}

int32_t cai_kv_pool_lookup(const cai_kv_pool *p, uint64_t h, int32_t parent, const int32_t *tokens) {
    for (int64_t i = slot_of(p, h), k = 0; k < p->table_cap; k++, i = (i + 1) & (p->table_cap - 1)) {
        int32_t b = p->table[i];
        if (b == -1) return -1;
        if (b >= 0 && p->hash[b] == h && p->parent[b] == parent &&
            memcmp(p->tokens + (size_t)b * (size_t)p->bs, tokens, (size_t)p->bs * sizeof *tokens) == 0)
            return b;
    }
    return -1;
}
