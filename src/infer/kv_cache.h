/* The paged KV cache's block pool (src/infer/kv_cache.c): reference-counted
 * blocks, a free list that keeps freed blocks' contents findable as long as
 * possible, and the prefix index that lets prompts share identical full
 * blocks. Host bookkeeping only; the KV tensors live in the engine. */
#ifndef CAI_INFER_KV_CACHE_H
#define CAI_INFER_KV_CACHE_H

#include <stdint.h>

#include "colossal/base.h"

typedef struct {
    int64_t n, bs;
    int32_t *ref;         /* holders of each block */
    int32_t *prev, *next; /* free list (doubly linked, oldest-freed first); -1 ends */
    int32_t head, tail;
    int64_t n_free;
    uint64_t *hash;  /* chained hash of a registered full block; 0: not registered */
    int32_t *parent; /* the block before it when it was registered (-1: first) */
    int32_t *tokens; /* [n, bs]: a registered block's tokens, to check a match exactly */
    int32_t *table;  /* open addressing, hash -> block; -1 empty, -2 deleted */
    int64_t table_cap;
} cai_kv_pool;

cai_status cai_kv_pool_init(cai_kv_pool *p, int64_t n_blocks, int64_t block_size);
void cai_kv_pool_free(cai_kv_pool *p);
/* A fresh block (ref 1; forgets what it held), or -1 when none is free. */
int32_t cai_kv_pool_alloc(cai_kv_pool *p);
/* Another holder of block b (taking it off the free list if it was there). */
void cai_kv_pool_retain(cai_kv_pool *p, int32_t b);
void cai_kv_pool_release(cai_kv_pool *p, int32_t b);
/* The chained hash of a full block of tokens after a block hashed `parent_hash` (0: first). */
uint64_t cai_kv_block_hash(uint64_t parent_hash, const int32_t *tokens, int64_t bs);
/* Register full block b (its tokens, parent block and chained hash); a hash
 * already registered keeps its block. */
void cai_kv_pool_register(cai_kv_pool *p, int32_t b, uint64_t h, int32_t parent, const int32_t *tokens);
/* The registered block with this hash, tokens and parent, or -1. */
int32_t cai_kv_pool_lookup(const cai_kv_pool *p, uint64_t h, int32_t parent, const int32_t *tokens);
/* Empty the prefix index: no block is found by lookup until registered
 * again (the weights that computed them changed). */
void cai_kv_pool_forget(cai_kv_pool *p);

#endif
