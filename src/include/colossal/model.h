/* The model layer: the parameter registry, then layers and model families.
 *
 * The registry (first section) is the single source of truth about
 * parameters: every parameter is registered once with a canonical name, its
 * GLOBAL shape, dtype and shard spec. Allocation, ZeRO flattening, gradient
 * buckets, checkpoint hyperslabs and HF export all derive from it; no code
 * computes another rank's offsets by hand -- it asks the registry with that
 * rank's view. See docs/registry.md. */
#ifndef COLOSSAL_MODEL_H
#define COLOSSAL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Parameter registry (src/model/registry.c, src/model/registry_init.c)
 * Pure bookkeeping: nothing in this section is collective or touches MPI.
 * ====================================================================== */

#define CAI_PARAM_MAX_DIMS 4
#define CAI_PARAM_NAME_MAX 128 /* bytes including the terminating NUL */
#define CAI_SHARD_MAX_SLABS 3  /* a fused QKV shard is one slab per section */

typedef enum {
    CAI_INIT_ZEROS = 0,
    CAI_INIT_ONES,
    CAI_INIT_NORMAL,          /* N(0, std^2) */
    CAI_INIT_NORMAL_RESIDUAL, /* N(0, (std / sqrt(2 * n_layers))^2): GPT-2's residual projections */
    CAI_INIT_COUNT
} cai_init_kind;

typedef struct {
    cai_init_kind kind;
    float std;
} cai_init_spec;

/* Which pipeline rank owns a parameter. */
typedef enum {
    CAI_PP_LAYER = 0, /* the rank owning spec.layer */
    CAI_PP_FIRST,     /* the rank owning layer 0 (embeddings) */
    CAI_PP_LAST,      /* the rank owning the last layer (final norm, LM head) */
    CAI_PP_COUNT
} cai_pp_place;

/* A fused [q | k | v] weight split over TP by whole heads: along the split
 * dimension it holds n_q_heads*head_dim query rows, then n_kv_heads*head_dim
 * key rows, then as many value rows. All zero: not fused. */
typedef struct {
    int n_q_heads, n_kv_heads, head_dim;
} cai_qkv_groups;

typedef struct {
    int tp_split_dim;   /* dimension split over TP; -1: every TP rank holds all of it */
    int vocab_parallel; /* the split dimension is a vocabulary: uneven (balanced) splits allowed */
    cai_qkv_groups qkv; /* fused QKV head grouping along tp_split_dim */
    cai_pp_place pp_place;
    int layer;          /* transformer block index, -1 for none (required for CAI_PP_LAYER) */
    int expert;         /* expert index, -1 for dense parameters */
    int n_experts;      /* experts of this MoE layer, 0 for dense */
    int weight_decay;   /* 1 or 0; -1: decay iff ndim >= 2 (resolved at registration) */
    cai_init_spec init;
    int tie_group;      /* 0: untied; > 0: registered copies of one tensor (tied embeddings) */
} cai_param_spec;

/* Replicated, dense, CAI_PP_LAYER with layer -1 (so pp_place or layer must be
 * set), weight decay auto, zeros init, untied. Start from this and override. */
cai_param_spec cai_param_spec_default(void);

typedef struct {
    const char *name;     /* canonical name, owned by the registry */
    int index;            /* registration order */
    int ndim;
    uint64_t shape[CAI_PARAM_MAX_DIMS]; /* global shape; unused dims are 1 */
    uint64_t numel;       /* global element count */
    cai_dtype dtype;
    cai_param_spec spec;  /* weight_decay resolved to 0/1 */
    int tie_primary;      /* first-registered member of its tie group (itself when untied) */
    uint64_t init_stream; /* RNG stream of every element: hash of the tie primary's name */
} cai_param_info;

typedef struct {
    int n_layers; /* transformer blocks: layer-index range, residual init scale, pipeline partition */
} cai_registry_options;

/* Where one rank sits, as far as parameters care. sp and dp do not shard
 * parameters here (ZeRO shards the flat local buffer over dp on top). */
typedef struct {
    int tp_size, tp_rank;
    int pp_size, pp_rank;
    int ep_size, ep_rank;
    int pp_chunks;          /* model chunks per pipeline rank (interleaved schedules); 0 means 1 */
    const int *layer_stage; /* optional pipeline rank of each layer (n_layers entries), e.g. from
                             * the pipeline partitioner; NULL: balanced contiguous chunks with
                             * chunk v on rank v % pp_size */
} cai_rank_view;

/* tp = pp = ep = 1: the single-rank view every shard is a slice of. */
cai_rank_view cai_rank_view_single(void);

/* A box of the global tensor. Slabs of one shard are concatenated along the
 * shard's split dimension, in order, to form the local tensor. */
typedef struct {
    uint64_t offset[CAI_PARAM_MAX_DIMS];
    uint64_t count[CAI_PARAM_MAX_DIMS];
    int replicas;     /* TP ranks holding this same slab: 1 when unique */
    int replica_rank; /* this rank's index among them; replica 0 writes checkpoints */
} cai_hyperslab;

typedef struct {
    int held;       /* this rank holds the parameter (owning pipeline rank and expert rank) */
    int pp_stage;   /* owning pipeline rank */
    int ep_owner;   /* owning expert-parallel rank, -1 for dense */
    int ndim;
    uint64_t global_shape[CAI_PARAM_MAX_DIMS];
    int split_dim;  /* dimension the slabs are cut and concatenated along, -1 if none */
    int n_slabs;    /* 0 when not held; 3 for a fused QKV weight split over TP */
    cai_hyperslab slab[CAI_SHARD_MAX_SLABS];
    uint64_t local_shape[CAI_PARAM_MAX_DIMS];
    uint64_t local_numel; /* 0 when not held */
} cai_param_shard;

typedef struct cai_registry cai_registry_t;

cai_status cai_registry_init(cai_registry_t **out, const cai_registry_options *opt);
void cai_registry_free(cai_registry_t *reg);

/* Registers a parameter; errors name it and the offending field (bad name,
 * duplicate, shape, split dimension, QKV grouping vs shape, layer or expert
 * range, tie-group mismatch). `index_out` may be NULL. */
cai_status cai_registry_add(cai_registry_t *reg, const char *name, int ndim, const uint64_t *shape, cai_dtype dtype,
                            const cai_param_spec *spec, int *index_out);

int cai_registry_count(const cai_registry_t *reg);
int cai_registry_n_layers(const cai_registry_t *reg);
/* NULL when out of range. Iterating 0..count-1 is registration order: the
 * order ZeRO flattening and gradient buckets use. */
const cai_param_info *cai_registry_param(const cai_registry_t *reg, int index);
/* -1 when absent; cai_registry_lookup reports the miss as an error instead. */
int cai_registry_find(const cai_registry_t *reg, const char *name);
cai_status cai_registry_lookup(const cai_registry_t *reg, const char *name, int *index_out);
uint64_t cai_registry_global_numel(const cai_registry_t *reg);
/* Indices of tie_group's members in registration order (up to max); returns
 * the member count. */
int cai_registry_tie_members(const cai_registry_t *reg, int tie_group, int *indices, int max);

/* Checks the view itself (sizes >= 1, ranks in range, layer_stage entries)
 * and that every registered parameter can be sharded under it: divisibility
 * over TP, QKV heads vs tp, experts vs ep, layers vs pp * chunks. The error
 * names the parameter and what would fit. */
cai_status cai_registry_check_view(const cai_registry_t *reg, const cai_rank_view *view);
/* Pipeline rank owning `layer` under `view`. */
cai_status cai_registry_layer_stage(const cai_registry_t *reg, const cai_rank_view *view, int layer, int *stage);
/* The local shard of parameter `index` on the rank described by `view`. */
cai_status cai_registry_shard(const cai_registry_t *reg, int index, const cai_rank_view *view, cai_param_shard *out);
/* Element offsets of every held parameter in one flat local buffer, in
 * registration order, each rounded up to `align_elems` (0 means 1);
 * offsets[i] = SIZE_MAX for parameters this rank does not hold. The total
 * (rounded up too) sizes a buffer of any element type: params, grads, master
 * weights and optimizer states share the offsets. `offsets` may be NULL. */
cai_status cai_registry_local_layout(const cai_registry_t *reg, const cai_rank_view *view, size_t align_elems,
                                     size_t *offsets, size_t *total_elems);

/* Copy this shard's elements out of / into a global tensor in row-major
 * order (elem_size bytes each; unaligned pointers are fine). Not held: no-op. */
void cai_shard_extract(const cai_param_shard *shard, size_t elem_size, const void *global, void *local);
void cai_shard_insert(const cai_param_shard *shard, size_t elem_size, const void *local, void *global);
/* Global row-major index of local element `local_index` (< local_numel). */
uint64_t cai_shard_global_index(const cai_param_shard *shard, uint64_t local_index);

/* Layout-invariant initialisation: element g (global row-major index) of a
 * parameter is f(seed, init_stream, g) via cai_rng_normal, so the shard
 * materialised under any view equals the same slice of the single-rank
 * tensor bit for bit. Writes local_numel floats (out_count must be at least
 * that). */
cai_status cai_registry_init_local(const cai_registry_t *reg, int index, const cai_rank_view *view, uint64_t seed,
                                   float *out, size_t out_count);
/* Initialise every held parameter into a flat buffer laid out by
 * cai_registry_local_layout(reg, view, align_elems, ...); alignment gaps are
 * zeroed. */
cai_status cai_registry_init_flat(const cai_registry_t *reg, const cai_rank_view *view, uint64_t seed,
                                  size_t align_elems, float *flat, size_t flat_count);
/* The standard deviation actually used (residual scaling applied); 0 for
 * zeros/ones. */
float cai_registry_init_std(const cai_registry_t *reg, int index);

const char *cai_init_kind_name(cai_init_kind kind);

/* ====================================================== end of registry */

#ifdef __cplusplus
}
#endif
#endif
