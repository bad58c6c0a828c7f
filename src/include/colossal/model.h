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
#include "colossal/cluster.h"
#include "colossal/fp8.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"

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
    int layer;        /* transformer block index, -1 for none (required for CAI_PP_LAYER) */
    int expert;       /* expert index, -1 for dense parameters */
    int n_experts;    /* experts of this MoE layer, 0 for dense */
    int weight_decay; /* 1 or 0; -1: decay iff ndim >= 2 (resolved at registration) */
    cai_init_spec init;
    int tie_group; /* 0: untied; > 0: registered copies of one tensor (tied embeddings) */
    int seq_grad;  /* 1: its layer runs on the rank's sequence shard under sequence parallelism, so
                    * each rank's gradient covers its own tokens only (norm weights and biases) */
} cai_param_spec;

/* Replicated, dense, CAI_PP_LAYER with layer -1 (so pp_place or layer must be
 * set), weight decay auto, zeros init, untied. Start from this and override. */
cai_param_spec cai_param_spec_default(void);

typedef struct {
    const char *name; /* canonical name, owned by the registry */
    int index;        /* registration order */
    int ndim;
    uint64_t shape[CAI_PARAM_MAX_DIMS]; /* global shape; unused dims are 1 */
    uint64_t numel;                     /* global element count */
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
    int pp_chunks;           /* model chunks per pipeline rank (interleaved schedules); 0 means 1 */
    int pp_vshape;           /* 1 (pp_chunks = 2; zb-v): virtual stage k sits on rank k for k < pp and
                              * on rank 2*pp-1-k above, a V; 0: on rank k % pp */
    const int *layer_vstage; /* optional virtual stage of each layer (n_layers entries, from 0 up to
                              * pp * pp_chunks - 1 by steps of 0 or 1), e.g. from an uneven
                              * partition; NULL: balanced contiguous stages */
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
    int held;     /* this rank holds the parameter (owning pipeline rank and expert rank) */
    int pp_stage; /* owning pipeline rank */
    int ep_owner; /* owning expert-parallel rank, -1 for dense */
    int ndim;
    uint64_t global_shape[CAI_PARAM_MAX_DIMS];
    int split_dim; /* dimension the slabs are cut and concatenated along, -1 if none */
    int n_slabs;   /* 0 when not held; 3 for a fused QKV weight split over TP */
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

/* Checks the view itself (sizes >= 1, ranks in range, layer_vstage entries)
 * and that every registered parameter can be sharded under it: divisibility
 * over TP, QKV heads vs tp, experts vs ep, layers vs pp * chunks. The error
 * names the parameter and what would fit. */
cai_status cai_registry_check_view(const cai_registry_t *reg, const cai_rank_view *view);
/* Pipeline rank owning `layer` under `view`, and its virtual stage. */
cai_status cai_registry_layer_stage(const cai_registry_t *reg, const cai_rank_view *view, int layer, int *stage);
cai_status cai_registry_layer_vstage(const cai_registry_t *reg, const cai_rank_view *view, int layer, int *vstage);
/* The pipeline rank holding virtual stage k under view's placement. */
int cai_rank_view_vstage_rank(const cai_rank_view *view, int k);
/* Mesh axes besides dp over which parameter `index`'s gradient is a sum of
 * per-rank parts, as bits 1u << axis: tp for a seq_grad parameter that
 * every tp rank holds whole when sequence parallelism is on; 0 otherwise.
 * What the gradient sync reduces on top of the data-parallel replicas
 * (context parallelism and expert groups add their axes here). Pure. */
unsigned cai_registry_grad_axes(const cai_registry_t *reg, int index, const cai_rank_view *view, int seq_parallel);
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

/* ======================================================================
 * Layers and model families (src/model/layers.c, src/model/model.c)
 * GPT-2 and Llama from one layer set; explicit forward and backward over
 * preallocated buffers (llm.c style, sized once for (B, T) at create: the
 * step allocates nothing). See docs/model.md.
 *
 * Tensor parallelism (Megatron-style, docs/parallel.md): the layers take the
 * LOCAL head / hidden / vocabulary counts; QKV and the MLP up/gate are
 * column-parallel, the two output projections row-parallel with their
 * partial sums all-reduced over the tp axis, and the embedding and LM head
 * vocabulary-parallel (the cross-entropy combines per-row statistics over
 * tp and never gathers the logits); tp = 1 is the degenerate case and keeps
 * the fused kernels. A pipeline stage is a range of layers [layer_begin,
 * layer_end): the embedding runs on the first stage, the final norm, LM
 * head and loss on the last.
 * ====================================================================== */

typedef enum {
    CAI_MODEL_GPT2 = 0, /* LayerNorm, learned positions, GELU MLP, biases, tied embeddings */
    CAI_MODEL_LLAMA,    /* RMSNorm, RoPE, SwiGLU, grouped-query attention, untied head, no biases */
    CAI_MODEL_FAMILY_COUNT
} cai_model_family;

const char *cai_model_family_name(cai_model_family f);

/* What a block is built from: a family is one choice of each sublayer kind,
 * and the layers dispatch on the kinds, never on the family, so that a new
 * family (or an MoE MLP) is a new row of cai_model_family_kinds and the
 * sublayer functions of its new kinds. */
typedef enum { CAI_NORM_LAYERNORM = 0, CAI_NORM_RMSNORM } cai_norm_kind;
typedef enum { CAI_MLP_GELU = 0, CAI_MLP_SWIGLU } cai_mlp_kind;
typedef enum { CAI_POS_LEARNED = 0, CAI_POS_ROPE } cai_pos_kind;
typedef struct {
    cai_norm_kind norm; /* LayerNorm (weight and bias, mean and rstd kept) or RMSNorm (weight, rstd) */
    cai_mlp_kind mlp;   /* fc + GELU (tanh) + proj, or gate/up + SwiGLU + proj */
    cai_pos_kind pos;   /* learned position embedding added to the tokens', or RoPE on q and k */
} cai_block_kinds;

/* GPT-2: LayerNorm, GELU, learned positions; Llama: RMSNorm, SwiGLU, RoPE. */
cai_block_kinds cai_model_family_kinds(cai_model_family f);
cai_status cai_model_family_parse(const char *name, cai_model_family *out); /* "gpt2", "llama" */

/* Loss targets equal to this are skipped (PyTorch's default ignore_index). */
#define CAI_IGNORE_INDEX (-100)

/* A mixture-of-experts MLP (colossal/moe.h, docs/moe.md): its configuration,
 * which the model configuration holds for its MoE blocks. */
typedef enum {
    CAI_MOE_ROUTER_SOFTMAX = 0,  /* p = softmax(logits), top-k of p; weights p / sum (Mixtral, norm_topk) */
    CAI_MOE_ROUTER_TOPK_SOFTMAX, /* top-k of the logits, weights = softmax over those k (always sum 1) */
    CAI_MOE_ROUTER_SIGMOID,      /* s = sigmoid(logits), top-k of s; weights s / sum (DeepSeek-V3, norm_topk) */
    CAI_MOE_ROUTER_COUNT
} cai_moe_router;

typedef enum {
    CAI_MOE_DROPLESS = 0, /* every assignment is computed */
    CAI_MOE_CAPACITY,     /* at most ceil(capacity_factor * N * top_k / E) per expert, first tokens first */
    CAI_MOE_ROUTING_COUNT
} cai_moe_routing;

typedef struct {
    int n_experts; /* E */
    int top_k;     /* experts per token, 1 <= top_k <= E */
    int ffn;       /* hidden size of each expert */
    int n_shared;  /* shared (always-on) experts, one SwiGLU MLP of hidden n_shared * ffn; 0: none */
    cai_moe_router router;
    int norm_topk; /* softmax / sigmoid routers: divide the k weights by their sum */
    cai_moe_routing routing;
    float capacity_factor; /* CAI_MOE_CAPACITY only; > 0 */
    float aux_coef;        /* load-balancing loss coefficient (0: off) */
    float z_coef;          /* router z-loss coefficient (0: off) */
} cai_moe_config;

typedef struct {
    cai_model_family family;
    int vocab_size;     /* real vocabulary: token ids are < vocab_size */
    int vocab_multiple; /* embedding/head rows padded to a multiple of this; 0 means 128 */
    int n_layers;
    int d_model;
    int n_heads;
    int n_kv_heads;     /* grouped-query attention; 0 means n_heads; must divide n_heads */
    int ffn_hidden;     /* MLP hidden size; 0: GPT-2 4*d_model, Llama 256-multiple of 8*d_model/3 */
    int max_seq_len;    /* learned positions (GPT-2) / RoPE tables (Llama) */
    float rope_theta;   /* Llama; 0 means 10000 */
    float norm_eps;     /* 0 means 1e-5 */
    int tie_embeddings; /* LM head shares the token embedding */
    float init_std;     /* N(0, std^2) init; residual projections get std/sqrt(2 n_layers); 0 means 0.02 */
    uint64_t seed;      /* parameter init (layout invariant, see the registry) */
    /* Mixed precision (docs/model.md). Master weights, gradients and
     * optimizer state are always F32. param_dtype: the working copy of the
     * weights the layers read (F32, BF16, F16; BF16/F16 are refreshed from
     * the masters by the optimizer with round-to-nearest-even). act_dtype:
     * activations and the dtype the ops compute in; when it differs from
     * param_dtype the working weights are converted once per update (the CPU
     * backend computes in F32 only, so BF16 params run as F32 compute over
     * bf16-rounded weights there). */
    cai_dtype param_dtype;
    cai_dtype act_dtype;
    int activation_checkpointing; /* keep only each layer's input; re-run its fwd inside bwd */
    /* Mixture of experts (llama family): moe.n_experts > 0 makes the MLP of
     * every moe_every-th block (layers l with l % moe_every == 0; 0 means
     * 1) an MoE sublayer; moe.ffn 0 means ffn_hidden. n_experts 0: dense. */
    cai_moe_config moe;
    int moe_every;
} cai_model_config;

/* The family's defaults (GPT-2: the 124M model with vocabulary 50257;
 * Llama: a 12-layer d=768 model with 4 KV heads, vocabulary 32000). F32
 * everywhere, no checkpointing, seed 1234. */
cai_model_config cai_model_config_default(cai_model_family family);
/* Fill in the "0 means" defaults and validate; errors name the field and
 * what would fit (heads vs d_model, kv heads vs heads, dtypes, ...). */
cai_status cai_model_config_resolve(const cai_model_config *in, cai_model_config *out);
/* vocab_size rounded up to vocab_multiple (after resolve). */
int64_t cai_model_config_padded_vocab(const cai_model_config *cfg);

/* Register every parameter of the family exactly once, in order: embeddings,
 * then per layer, then final norm and head (canonical names in
 * docs/model.md). `reg` must have been created with n_layers = cfg->n_layers. */
cai_status cai_model_register_params(cai_registry_t *reg, const cai_model_config *cfg);

/* ---------------------------------------------------------------- layers
 * The building blocks the model runs. Each sublayer is residual:
 * fwd: out = inp + f(norm(inp)); bwd: d_stream holds d(out) on entry and
 * d(inp) on exit. Parameter gradients are ACCUMULATED (+=). All tensors are
 * on the context's device; activations [B, T, C] in act dtype. With
 * tp_size > 1 the layers are collective over the tp axis of cx->mesh (every
 * rank of a tp group calls them in the same order). */

/* Attention over a sequence sharded across ranks (ring attention and
 * Ulysses, colossal/seq_parallel.h, provide it): the attention sublayer
 * calls fwd/bwd in place of ops->attention_fwd/bwd, with its local q, k, v
 * [B,T,H,D] views, out and lse [B,Hq,T] (the same number of elements
 * whatever layout the hook keeps in it) and the causal params. Collective
 * as the hook says. */
typedef struct cai_attn_hook {
    cai_status (*fwd)(void *ctx, cai_tensor *out, cai_tensor *lse, const cai_tensor *q, const cai_tensor *k,
                      const cai_tensor *v, const cai_attn_params *params);
    cai_status (*bwd)(void *ctx, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv, const cai_tensor *dout,
                      const cai_tensor *q, const cai_tensor *k, const cai_tensor *v, const cai_tensor *out,
                      const cai_tensor *lse, const cai_attn_params *params);
    void *ctx;
} cai_attn_hook;

/* Where a layer runs: the device and, for tensor parallelism, the mesh whose
 * tp axis the layers' collectives use (mesh may be NULL when tp_size = 1).
 * seq_parallel (tp > 1 only): Megatron's sequence parallelism, Colossal-AI's
 * split-gather mode. The residual stream, the norms and the bias + residual
 * adds hold B*T/tp tokens per rank (rank r the r-th contiguous block of the
 * flattened [B*T] tokens); the all-reduces of plain tp become an all-gather
 * of the norm output before each column-parallel matmul and a
 * reduce-scatter of each row-parallel product, and the backward the
 * conjugates. The norms' weight gradients then cover this rank's tokens
 * only: the layers leave them partial, and the gradient sync sums them over
 * tp once per step (cai_registry_grad_axes; the ZeRO engine does it). */
typedef struct {
    cai_device_t *dev;
    cai_mesh_t *mesh;
    int tp_size, tp_rank;
    int seq_parallel;
    /* Packed rows (cai_model_set_packing), or NULL: I32 [B,T] on dev, the
     * same on every tp rank. positions feed RoPE and the learned position
     * embeddings in place of pos_offset + t; doc_ids mask the attention
     * (cai_attn_params.doc_ids). Not with seq_parallel. */
    const cai_tensor *positions, *doc_ids;
    /* A sharded sequence's attention (cai_model_set_seq_attention), or NULL. */
    const cai_attn_hook *attn;
} cai_layer_ctx;

/* Single-device context (tp = 1). */
cai_layer_ctx cai_layer_ctx_local(cai_device_t *dev);

typedef struct {
    cai_block_kinds kinds;
    int64_t B, T;       /* T: local sequence length */
    int64_t pos_offset; /* position of local token 0 (sequence parallel, decoding) */
    int64_t C;          /* d_model */
    int64_t n_heads;    /* local query heads (n_heads / tp) */
    int64_t n_kv_heads; /* local KV heads */
    int64_t head_dim;
    int64_t ffn;          /* local MLP hidden size (ffn_hidden / tp) */
    int64_t vocab_local;  /* padded vocabulary rows held here (head/embedding) */
    int64_t vocab_offset; /* global id of local row 0 */
    int64_t vocab_valid;  /* real vocabulary size (logit columns >= this are padding) */
    float norm_eps;
    cai_dtype act_dtype;
    int tp; /* ranks the head / hidden / vocabulary counts are split over (sizes the TP buffers) */
    int sp; /* sequence parallel over those tp ranks: the residual-stream buffers hold B*T/tp tokens */
} cai_layer_dims;

/* Weights of one transformer block (views into the model's flat buffer).
 * Absent ones (biases for Llama, up_w for GPT-2) have data == NULL. grads
 * uses the same struct for the gradients. */
typedef struct {
    cai_tensor ln1_w, ln1_b;           /* [C] */
    cai_tensor qkv_w, qkv_b;           /* [(Hq + 2 Hkv) D, C], [(Hq + 2 Hkv) D]: fused q|k|v rows */
    cai_tensor proj_w, proj_b;         /* [C, Hq D], [C] */
    cai_tensor ln2_w, ln2_b;           /* [C] */
    cai_tensor fc_w, fc_b;             /* mlp.fc: GPT-2 fc [F, C], [F]; Llama gate [F, C] */
    cai_tensor up_w;                   /* Llama up [F, C] */
    cai_tensor mlp_proj_w, mlp_proj_b; /* [C, F], [C] */
    const struct cai_lora_layer *lora; /* the block's LoRA adapters (colossal/lora.h), or NULL; weights only */
    const struct cai_fp8_layer *fp8;   /* the block's FP8 state (colossal/fp8.h) when it runs in FP8, else NULL */
} cai_block_params;

/* What one block's forward saves for its backward. With d->sp the
 * residual-stream tensors (ln1, ln2, res_mid and the norm statistics) hold
 * this rank's B*T/tp tokens, [1, B*T/tp, C]. */
typedef struct {
    cai_tensor ln1, ln1_mean, ln1_rstd; /* [B,T,C], [B*T], [B*T] (mean unused by RMSNorm) */
    cai_tensor qkv;                     /* [B,T,(Hq+2Hkv)D], q and k after RoPE */
    cai_tensor att, att_lse;            /* [B,T,Hq D], [B,Hq,T] */
    cai_tensor res_mid;                 /* [B,T,C] residual after attention */
    cai_tensor ln2, ln2_mean, ln2_rstd;
    cai_tensor fc;  /* [B,T,F] GPT-2 pre-GELU / Llama gate */
    cai_tensor up;  /* [B,T,F] Llama up */
    cai_tensor act; /* [B,T,F] GELU / SwiGLU output */
} cai_block_acts;

/* Buffers shared by every block (not kept between fwd and bwd). */
typedef struct {
    cai_tensor dln;                /* [B,T,C] */
    cai_tensor datt;               /* [B,T,Hq D] */
    cai_tensor dqkv;               /* [B,T,(Hq+2Hkv)D] */
    cai_tensor dact, dfc, dup;     /* [B,T,F] (dup Llama only) */
    cai_tensor rope_cos, rope_sin; /* [max_pos, D/2] F32 (Llama) */
    cai_tensor tp_out;             /* [B,T,C] tp > 1: a row-parallel product before its all-reduce */
    /* d->sp: the whole sequence's norm output (gathered for a column-parallel
     * matmul; the embedding's partial sum before its reduce-scatter) and the
     * whole sequence's d_stream. */
    cai_tensor seq_full, seq_grad;
    void *attn_ws;
    size_t attn_ws_bytes;
} cai_block_scratch;

/* A split backward (zero-bubble pipeline schedules) runs a block's
 * backward in two passes: the input pass (cai_block_bwd_input) writes
 * d(input) and the norms' weight gradients and keeps here the output
 * gradients of the block's matmuls; the weight pass (cai_block_bwd_weight),
 * later, multiplies them by the saved activations into the matmuls' weight
 * and bias gradients. Both passes together accumulate the same gradients as
 * cai_block_bwd. Under sequence parallelism d_proj and d_mlp hold the whole
 * sequence's. */
typedef struct {
    cai_tensor d_proj;   /* [B,T,C] d(attention output projection) */
    cai_tensor dqkv;     /* [B,T,(Hq+2Hkv)D] after RoPE's backward */
    cai_tensor d_mlp;    /* [B,T,C] d(MLP output projection) */
    cai_tensor dfc, dup; /* [B,T,F] d(fc / gate), d(up) (Llama only) */
} cai_block_wgrad;

/* Allocate acts / scratch for `dims` from a device arena (max_pos sizes the
 * RoPE tables, which this computes). */
size_t cai_block_acts_bytes(const cai_device_t *dev, const cai_layer_dims *d);
cai_status cai_block_acts_carve(cai_device_t *dev, cai_arena_t *arena, const cai_layer_dims *d, cai_block_acts *acts);
size_t cai_block_scratch_bytes(const cai_device_t *dev, const cai_layer_dims *d, int64_t max_pos);
cai_status cai_block_scratch_carve(cai_device_t *dev, cai_arena_t *arena, const cai_layer_dims *d, int64_t max_pos,
                                   double rope_theta, cai_block_scratch *s);
size_t cai_block_wgrad_bytes(const cai_device_t *dev, const cai_layer_dims *d);
cai_status cai_block_wgrad_carve(cai_device_t *dev, cai_arena_t *arena, const cai_layer_dims *d, cai_block_wgrad *w);

/* Attention sublayer: out = inp + proj(attention(rope(qkv(norm1(inp))))). */
cai_status cai_attn_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p, cai_block_acts *a,
                        cai_block_scratch *s, const cai_tensor *inp, cai_tensor *out);
cai_status cai_attn_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                        cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s, const cai_tensor *inp,
                        cai_tensor *d_stream);
/* MLP sublayer: out = inp + mlp(norm2(inp)); reads inp = a->res_mid when called from a block. */
cai_status cai_mlp_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p, cai_block_acts *a,
                       cai_block_scratch *s, const cai_tensor *inp, cai_tensor *out);
cai_status cai_mlp_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p, cai_block_params *g,
                       const cai_block_acts *a, cai_block_scratch *s, const cai_tensor *inp, cai_tensor *d_stream);
/* A transformer block: attention then MLP (a->res_mid holds the middle). */
cai_status cai_block_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p, cai_block_acts *a,
                         cai_block_scratch *s, const cai_tensor *inp, cai_tensor *out);
cai_status cai_block_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                         cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s, const cai_tensor *inp,
                         cai_tensor *d_stream);
/* The two passes of a split backward (cai_block_wgrad): the input pass
 * reads and writes d_stream as cai_block_bwd does and fills w; the weight
 * pass reads w and a, which must be untouched in between. */
cai_status cai_block_bwd_input(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                               cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s, cai_block_wgrad *w,
                               const cai_tensor *inp, cai_tensor *d_stream);
cai_status cai_block_bwd_weight(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_block_params *p,
                                cai_block_params *g, const cai_block_acts *a, cai_block_scratch *s,
                                const cai_block_wgrad *w);

/* Embedding: out [B,T,C] = wte[tokens] (+ wpe[pos_offset + t]); tokens I32
 * [B,T] on the device. wpe data NULL for Llama. Vocabulary-parallel: wte
 * holds rows [vocab_offset, vocab_offset + vocab_local); with tp > 1 each
 * rank looks up its own rows (zeros elsewhere, wpe added on tp rank 0) and
 * the sum over tp is the embedding. */
cai_status cai_embed_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_tensor *wte, const cai_tensor *wpe,
                         cai_block_scratch *s, const cai_tensor *tokens, cai_tensor *out);
cai_status cai_embed_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, cai_tensor *dwte, cai_tensor *dwpe,
                         cai_block_scratch *s, const cai_tensor *tokens, const cai_tensor *dout);

/* Head: final norm, LM head (no bias) and the fused cross-entropy. */
typedef struct {
    cai_tensor lnf, lnf_mean, lnf_rstd; /* [B,T,C] (whole sequence under d->sp), [B*T], [B*T] (B*T/tp under d->sp) */
    cai_tensor logits;                  /* [B,T,Vl]; overwritten by dlogits in backward */
    cai_tensor losses, lse;             /* [B*T] F32 per-token loss (0 where ignored), log-sum-exp */
    cai_tensor loss_sum;                /* [1] F32 */
    /* tp > 1: per-row statistics of the local vocabulary shard (device,
     * [B*T] F32 each: max, sum of exp(logit - max), target logit) and their
     * host copies, [tp][3][B*T] F32, gathered over tp, plus the host lse
     * and losses [B*T] each and the targets [B*T] I32. */
    cai_tensor xs_max, xs_sum, xs_tgt;
    float *xs_host;
    int32_t *xs_targets;
    int logits_hold_grad; /* cai_head_fwd_train ran: logits already hold their gradient */
    /* Multiplies the logits before the cross-entropy and their gradient
     * after it; 0 or 1: none. A sampling temperature t is 1/t here. */
    float logit_scale;
} cai_head_acts;

size_t cai_head_acts_bytes(const cai_device_t *dev, const cai_layer_dims *d);
/* Carves the device buffers; with d->tp > 1 also allocates the host
 * statistics (free them with cai_head_acts_release). */
cai_status cai_head_acts_carve(cai_device_t *dev, cai_arena_t *arena, const cai_layer_dims *d, cai_head_acts *h);
void cai_head_acts_release(cai_head_acts *h);
/* Logits for inp [B,T,C]; with targets (I32 [B,T] on the device, NULL for
 * logits only) also the per-token losses and their sum in h->loss_sum.
 * lnf_b and head_w are the final-norm bias (data NULL for RMSNorm) and the
 * LM head [Vl, C]. */
cai_status cai_head_fwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_tensor *lnf_w,
                        const cai_tensor *lnf_b, const cai_tensor *head_w, cai_head_acts *h, cai_block_scratch *s,
                        const cai_tensor *inp, const cai_tensor *targets);
/* As cai_head_fwd with targets, for a training step: the loss's gradient
 * (dloss_scale as cai_head_bwd's) is computed in the same pass over the
 * logits (ops->xent_fwd_bwd), which it overwrites; cai_head_bwd then starts
 * from it and ignores its own dloss_scale. */
cai_status cai_head_fwd_train(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_tensor *lnf_w,
                              const cai_tensor *lnf_b, const cai_tensor *head_w, cai_head_acts *h, cai_block_scratch *s,
                              const cai_tensor *inp, const cai_tensor *targets, float dloss_scale);
/* Gradients of dloss_scale * sum of per-token losses (dloss_scale = 1/valid
 * tokens for the mean; after cai_head_fwd_train, the scale it was given),
 * or, with dlosses (F32 [B*T] on the device, non-NULL), of sum over tokens
 * of dlosses[n] * loss[n]; dhidden (act dtype [B,T,C], may be NULL) is
 * added to the gradient of the final norm's output (a scalar head's on
 * h->lnf). d_stream [B,T,C] is OVERWRITTEN with d(inp); dlnf_* and dhead_w
 * accumulate. s is the blocks' scratch (s->dln and, with d->sp, the
 * sequence buffers). */
cai_status cai_head_bwd(const cai_layer_ctx *cx, const cai_layer_dims *d, const cai_tensor *lnf_w,
                        const cai_tensor *head_w, cai_tensor *dlnf_w, cai_tensor *dlnf_b, cai_tensor *dhead_w,
                        cai_head_acts *h, cai_block_scratch *s, const cai_tensor *inp, const cai_tensor *targets,
                        float dloss_scale, const cai_tensor *dlosses, const cai_tensor *dhidden, cai_tensor *d_stream);

/* --------------------------------------------------------------- weights
 * The registry and one rank's parameter storage apart from any execution
 * state (src/model/weights.c): F32 masters, the param_dtype working copy
 * and the act_dtype copy the layers read, in the registry's flat local
 * layout. A training model (cai_model_options.weights) and an inference
 * engine use one weights object without a copy, so an update through
 * either is what the other reads next. Not collective. */

typedef struct cai_weights cai_weights_t;

/* Resolve the config, register its parameters, check the view and lay out
 * the flat buffers (alignment align_elems, 0 means 16); with `storage`
 * also allocate them on dev and initialise them from cfg->seed (the same
 * numbers as cai_model_create's). */
cai_status cai_weights_create(cai_weights_t **out, cai_device_t *dev, const cai_model_config *cfg,
                              const cai_rank_view *view, size_t align_elems, int storage);
void cai_weights_free(cai_weights_t *w);
const cai_model_config *cai_weights_config(const cai_weights_t *w); /* resolved */
const cai_registry_t *cai_weights_registry(const cai_weights_t *w);
const cai_rank_view *cai_weights_view(const cai_weights_t *w);
cai_device_t *cai_weights_device(const cai_weights_t *w);
size_t cai_weights_align_elems(const cai_weights_t *w);
int cai_weights_have_storage(const cai_weights_t *w); /* a copy the layers read; 0 also while offloaded */
/* Device bytes of the storage (masters, working and compute copies); 0
 * without storage or while offloaded. */
size_t cai_weights_device_bytes(const cai_weights_t *w);
/* Weights that will not change again (a frozen model's, once loaded) need
 * only the copy the layers read: this frees the F32 masters and the working
 * copy where the compute copy is a buffer of its own (bf16 weights: 6
 * bytes a parameter become 2). Afterwards the weights are read, offloaded
 * and onloaded as before, but never written: loaders, updates and master
 * views refuse, naming this call. A no-op where the layers read the F32
 * masters. Not collective. */
cai_status cai_weights_keep_compute(cai_weights_t *w);
int cai_weights_compute_only(const cai_weights_t *w);
/* Weights made without storage (cai_weights_create, storage 0) can read
 * another owner's compute copy in place, e.g. a ZeRO engine's whole
 * working weights (cai_zero_working_weights): `compute` in the act dtype,
 * offsets[i] parameter i's element offset in it (SIZE_MAX exactly where
 * this view holds none). A tie copy reads its primary, since an owner may
 * update only the primary. Such weights are read-only and never offloaded
 * or freed here; device bytes 0. Not collective. */
cai_status cai_weights_bind_compute(cai_weights_t *w, void *compute, const size_t *offsets);
/* CAI_OK when the F32 masters are on the device to be written (what a
 * loader needs); otherwise an error that names `what` and the reason: no
 * storage, offloaded, or compute only. */
cai_status cai_weights_check_writable(const cai_weights_t *w, const char *what);
/* Weights not needed for a while (an RL job's frozen reference and reward
 * model during rollouts and updates) can wait in pinned host memory:
 * offload copies the storage there (allocated at the first offload and kept
 * for the next) and frees the device's; onload allocates it again and
 * copies it back, bit for bit. Views taken before onload (param views, an
 * engine over these weights) point at the old storage: a model re-binds
 * its own (cai_model_offload / cai_model_onload). Both are no-ops in the
 * state they lead to. Not collective. */
cai_status cai_weights_offload(cai_weights_t *w);
cai_status cai_weights_onload(cai_weights_t *w);
int cai_weights_offloaded(const cai_weights_t *w);
/* Local elements of parameter `index` held here, -1 when not held. */
int64_t cai_weights_held(const cai_weights_t *w, int index);
const cai_param_shard *cai_weights_shard(const cai_weights_t *w, int index);
/* The F32 master flat buffer and the working copy (data NULL when F32). */
void cai_weights_flat(const cai_weights_t *w, cai_tensor *master, cai_tensor *lowp);
/* Parameter `index`'s local shard: the F32 master (compute 0) or what the
 * layers read (compute 1, act dtype). Not held: an error naming it. */
cai_status cai_weights_param_view(const cai_weights_t *w, int index, int compute, cai_tensor *out);
/* The same by canonical name; a name this family does not register gives
 * a zeroed tensor (data NULL: an absent bias). */
cai_status cai_weights_find(const cai_weights_t *w, const char *name, int compute, cai_tensor *out);
/* Compute views of layer `layer`'s parameters (absent ones data NULL). */
cai_status cai_weights_block(const cai_weights_t *w, int layer, cai_block_params *out);
/* After writing masters: tie copies follow their primaries, the working
 * and compute copies are refreshed. */
cai_status cai_weights_updated(cai_weights_t *w);

/* ----------------------------------------------------------------- model */

typedef struct cai_model cai_model_t;
struct cai_lora;

typedef struct {
    int batch;              /* B: sequences per forward */
    int seq_len;            /* T: local tokens per sequence (<= max_seq_len) */
    cai_rank_view view;     /* TP selects the shard; PP the stage's layer range; EP the experts of MoE layers */
    cai_mesh_t *mesh;       /* tp > 1: the mesh whose tp axis (size and rank as in view) the layers use */
    int seq_parallel;       /* tp > 1: split-gather sequence parallelism (cai_layer_ctx); B*T % tp == 0 */
    size_t align_elems;     /* flat-buffer alignment of every parameter, elements; 0 means 16 */
    int external_params;    /* 1: the caller owns parameter and gradient storage (ZeRO, see
                             * "External parameter storage" below); 0: the model allocates it */
    cai_weights_t *weights; /* NULL: the model creates its own; else it uses these (same config, view
                             * and alignment, with storage; not freed by the model) and allocates
                             * only gradients and activations */
    int act_slots;          /* activation sets: forwards (of one chunk each) whose backward is still to
                             * run (a pipeline's in-flight microbatches x chunks); 0 means 1 */
    int split_backward;     /* 1: each slot can also keep its layers' matmul output gradients from
                             * cai_model_backward_input to cai_model_backward_weight (zero-bubble
                             * schedules; cai_model_split_backward_bytes more); not with activation
                             * checkpointing; external_params must keep the gradients bound from one
                             * pass to the other (ZeRO 0/1 bind them once) */
    const struct cai_moe_exchange *moe_exchange; /* view.ep_size > 1: moves an MoE layer's tokens over ep
                                                  * (cai_moe_ep_exchange_init); NULL at ep = 1 */
    int frozen; /* 1: the parameters are not trained (LoRA's base): no gradient buffer, no
                 * weight gradients computed; backward still yields input gradients */
} cai_model_options;

/* B = 1, T = max_seq_len, the single-rank view. */
cai_model_options cai_model_options_default(const cai_model_config *cfg);

/* Resolve the config, register the parameters, allocate params (F32
 * masters), grads, working copies and every activation buffer for (B, T),
 * and initialise the parameters from cfg->seed. Not collective. */
cai_status cai_model_create(cai_model_t **out, cai_device_t *dev, const cai_model_config *cfg,
                            const cai_model_options *opt);
void cai_model_free(cai_model_t *m);

const cai_model_config *cai_model_config_of(const cai_model_t *m); /* resolved */
/* The weights the model reads (its own or the shared ones); without
 * storage under external_params. */
cai_weights_t *cai_model_weights(const cai_model_t *m);
const cai_registry_t *cai_model_registry(const cai_model_t *m);
const cai_rank_view *cai_model_view(const cai_model_t *m);
cai_device_t *cai_model_device(const cai_model_t *m);
int64_t cai_model_padded_vocab(const cai_model_t *m);
/* The global vocabulary ids [offset, offset + count) of this rank's
 * embedding / LM head rows and logit columns (the registry's tp shard). */
void cai_model_vocab_shard(const cai_model_t *m, int64_t *offset, int64_t *count);
/* The (B, T) the activation buffers were sized for. */
void cai_model_shape(const cai_model_t *m, int *batch, int *seq_len);
size_t cai_model_align_elems(const cai_model_t *m);
/* This stage's layers [begin, end) (of all its chunks: the first one's
 * begin, the last one's end) and whether it holds the embedding / head. */
void cai_model_stage(const cai_model_t *m, int *layer_begin, int *layer_end, int *is_first, int *is_last);
/* Model chunks: with view.pp_chunks = v a rank holds v runs of layers
 * (virtual stage c * pp + pp_rank is its chunk c). cai_model_chunk gives
 * chunk c's layers [begin, end) and whether it runs the embedding / head. */
int cai_model_chunk_count(const cai_model_t *m);
cai_status cai_model_chunk(const cai_model_t *m, int chunk, int *layer_begin, int *layer_end, int *is_first,
                           int *is_last);
/* Forward, backward and cai_model_stage_io / cai_model_logits act on the
 * selected chunk and activation slot (initially 0, 0): a forward into slot k
 * keeps its activations there until its backward, whatever runs in the
 * other slots meanwhile. The parameter gradients and d_stream are shared. */
cai_status cai_model_select(cai_model_t *m, int chunk, int slot);
int cai_model_slot_count(const cai_model_t *m);
/* Bytes of parameters+grads+working copies and of activations (for logs
 * and the memory plan's checks); both 0 while offloaded. */
void cai_model_memory(const cai_model_t *m, size_t *param_bytes, size_t *act_bytes);
/* A frozen model with weights of its own (an RL reference or reward
 * model) lends its device memory out between uses: offload moves the
 * weights to host memory (cai_weights_offload) and unbinds every view, so a
 * forward fails until onload brings them back and re-binds the views. The
 * activation arena, which holds nothing between forwards, is given back
 * with them and allocated again (new addresses: views of it taken before
 * onload are stale). Not collective. */
cai_status cai_model_offload(cai_model_t *m);
cai_status cai_model_onload(cai_model_t *m);
int cai_model_offloaded(const cai_model_t *m);
/* Once a frozen model with weights of its own is loaded, keep only the
 * copy its layers read (cai_weights_keep_compute): forwards give the same
 * bits, and master views and params_updated refuse from then on. Not
 * collective. */
cai_status cai_model_keep_compute(cai_model_t *m);
/* The activation arena cai_model_create allocates for a rank whose
 * largest chunk has n_local layers (last: with the head) and `slots`
 * activation sets (cai_model_options.act_slots; 0 means 1) at (batch,
 * seq_len) under view and seq_parallel, before any model exists: every
 * layer's activations kept (full) or only one set per slot (recompute,
 * activation checkpointing). The vocabulary shard is taken as the largest
 * of the registry's. Not collective. */
cai_status cai_model_activation_bytes(const cai_device_t *dev, const cai_model_config *cfg, const cai_rank_view *view,
                                      int batch, int seq_len, int seq_parallel, int n_local, int last, int slots,
                                      size_t *full, size_t *recompute);
/* What split_backward adds to that arena for n_local layers and `slots`
 * slots. Not collective. */
cai_status cai_model_split_backward_bytes(const cai_device_t *dev, const cai_model_config *cfg,
                                          const cai_rank_view *view, int batch, int seq_len, int seq_parallel,
                                          int n_local, int slots, size_t *bytes);

/* The device bytes FP8 training adds on this rank (cai_fp8_plan_bytes for
 * the linears its layers run in FP8; 0 when f8 is NULL or off). Not
 * collective. */
cai_status cai_model_fp8_bytes(const cai_device_t *dev, const cai_registry_t *reg, const cai_model_config *cfg,
                               const cai_rank_view *view, int batch, int seq_len, int seq_parallel,
                               const cai_fp8_config *f8, size_t *bytes);

/* The flat buffers (laid out by cai_registry_local_layout with this model's
 * view and align_elems): F32 master weights, F32 gradients, and the
 * param_dtype working copy (data NULL when param_dtype is F32: the layers
 * read the masters). */
void cai_model_flat(cai_model_t *m, cai_tensor *params, cai_tensor *grads, cai_tensor *params_lowp);

/* Views of one parameter's local shard by canonical name: the F32 master and
 * its gradient (either output may be NULL). Writes into the master take
 * effect after cai_model_params_updated. With tied embeddings held on one
 * stage the head uses wte.weight, so lm_head.weight's gradient stays zero and
 * wte.weight's holds both contributions (as in PyTorch). */
cai_status cai_model_param(cai_model_t *m, const char *name, cai_tensor *master, cai_tensor *grad);
/* After editing master weights (loading a checkpoint, a parity test): copy
 * tie primaries to their local copies and refresh the working copies. */
cai_status cai_model_params_updated(cai_model_t *m);

cai_status cai_model_zero_grad(cai_model_t *m);

/* Forward over this stage. tokens: host [B,T] I32 (first stage; others may
 * pass NULL and must have written the stage input, cai_model_stage_io).
 * targets: host [B,T] I32, CAI_IGNORE_INDEX to skip (last stage; NULL for
 * logits only). *loss (may be NULL) receives the mean cross-entropy over
 * non-ignored targets (0 when every target is ignored). Token ids must be in
 * [0, vocab_size) and targets in [0, vocab_size) or ignored; the error names
 * the position. */
/* Packed rows (several documents per row): positions and doc_ids, host
 * arrays [B,T] I32, hold for every forward and backward from now on (the
 * backward's recompute and split passes see the same), until called with
 * both NULL. Positions feed RoPE or the learned position embeddings in place
 * of 0..T-1; attention does not cross documents (cai_attn_params.doc_ids).
 * Accepted form, per row: doc ids never decrease (every document one
 * contiguous run; padding may be a document of its own), positions are 0 at
 * a document's first token and count up by one within it; anything else is
 * CAI_ERR_INVALID_ARG naming the entry. Under tensor parallelism every tp
 * rank passes the same arrays. Refused (CAI_ERR_UNSUPPORTED) with sequence
 * parallelism and with more than one activation slot (pipeline schedules),
 * and attention on the CUDA backend refuses document masking. */
cai_status cai_model_set_packing(cai_model_t *m, const int32_t *positions, const int32_t *doc_ids);
/* A sequence sharded over ranks (ring attention, Ulysses): the model's T
 * tokens of every row sit at the global `positions` (host [T] I32, e.g.
 * cai_zigzag_positions), which feed RoPE and the learned position
 * embeddings, and attention runs through `hook` (which must outlive its
 * use). Holds for every forward and backward until called with hook NULL.
 * Refused with packing and with split-gather sequence parallelism. */
cai_status cai_model_set_seq_attention(cai_model_t *m, const cai_attn_hook *hook, const int32_t *positions);
cai_status cai_model_forward(cai_model_t *m, const int32_t *tokens, const int32_t *targets, float *loss);
/* As cai_model_forward, for a training step whose cai_model_backward will
 * take grad_scale: the last stage computes the loss's gradient in the same
 * pass over the logits as the loss (one read of [B,T,V] instead of two; the
 * logits are gone, cai_model_logits refuses), and the backward starts from
 * it; backward with another grad_scale is refused. Same numbers as
 * cai_model_forward + cai_model_backward(grad_scale). */
cai_status cai_model_forward_train(cai_model_t *m, const int32_t *tokens, const int32_t *targets, float grad_scale,
                                   float *loss);
/* The last forward's logits [B, T, local vocab] in act dtype (last stage):
 * the columns of this rank's vocabulary shard (cai_model_vocab_shard; all
 * of the padded vocabulary at tp = 1); global ids >= vocab_size are
 * padding. Valid until the next backward, which overwrites them with their
 * gradient. */
cai_status cai_model_logits(cai_model_t *m, cai_tensor *logits);
/* Backward of grad_scale * (mean loss of the last forward) over this stage:
 * parameter gradients ACCUMULATE (microbatches add up; pass 1/n for a mean
 * over n of them). Requires a forward with targets on the last stage. */
cai_status cai_model_backward(cai_model_t *m, float grad_scale);
/* ---- objectives other than the mean cross-entropy (alignment,
 * colossal/rl.h). With an objective set, every forward with targets on the
 * last stage hands the objective each target's cross-entropy (-log p of
 * the target token, 0 where ignored) and, when it asks, the final normed
 * hidden states; the objective returns its value (what forward reports as
 * the loss) and its gradient with respect to those inputs, and backward
 * (grad_scale) runs from grad_scale times that gradient. Any target
 * pattern works, all ignored too (a scalar head reads the hidden states
 * only). cai_model_forward_train takes the unfused path. The host arrays
 * are the model's, valid during the call. */
typedef struct {
    int batch, seq_len;      /* B, T of the forward */
    int64_t hidden_size;     /* C */
    const int32_t *targets;  /* [B*T] as given to forward */
    const float *token_loss; /* [B*T] */
    const float *hidden;     /* [B*T*C] F32, or NULL when the objective did not ask */
    float *dtoken_loss;      /* [B*T] out, zeroed before the call */
    float *dhidden;          /* [B*T*C] out, zeroed before the call; NULL when not asked */
    double loss;             /* out */
} cai_model_objective_io;
typedef struct {
    cai_status (*fn)(void *ctx, cai_model_objective_io *io);
    void *ctx;
    int want_hidden;
    /* The token losses are of logit_scale * logits (0: 1): an RL
     * objective scores tokens drawn at temperature t with 1/t, so that its
     * log-probabilities are of the distribution they were drawn from. */
    float logit_scale;
} cai_model_objective;
/* obj NULL: the mean cross-entropy again. Allocates the objective's host
 * and device buffers (B*T*(2 + 2C) host floats; with want_hidden B*T*C
 * F32 plus B*T*C act-dtype on the device), which the memory plan does not
 * count. Refused with more than one activation slot (pipeline schedules),
 * a sequence sharded over ranks (the objectives sum over whole rows) and,
 * with want_hidden, split-gather sequence parallelism. Not collective. */
cai_status cai_model_set_objective(cai_model_t *m, const cai_model_objective *obj);

/* The same backward in two passes (split_backward models; zero-bubble
 * pipeline schedules). The input pass does everything cai_model_backward
 * does (d(input) in d_stream, the head's, the embedding's and the norms'
 * gradients) except the blocks' matmul weight gradients, which the weight
 * pass of the same chunk and slot adds later; other slots' forwards and
 * passes may run in between, and the slot cannot take a forward until its
 * weight pass has run. Together they accumulate what cai_model_backward
 * does. Hooks: a block unit's PRE_BACKWARD fires in the input pass, its
 * POST_BACKWARD after its weight pass. */
cai_status cai_model_backward_input(cai_model_t *m, float grad_scale);
cai_status cai_model_backward_weight(cai_model_t *m);
int cai_model_split_backward(const cai_model_t *m);

/* LoRA (colossal/lora.h): every block runs its adapters of `lora` (NULL:
 * none) from now on, in forward, backward (checkpointed and split too) and
 * evaluation. The model must be whole on this rank's tensor axis (tp = 1);
 * `lora` must be made for the same architecture and outlive its use here.
 * Not collective. */
cai_status cai_model_set_lora(cai_model_t *m, struct cai_lora *lora);
/* Run the blocks `cfg` selects in FP8 (colossal/fp8.h; cfg->enabled 0 or
 * NULL: none, the state freed). The model owns the FP8 state, sized for
 * its B*T rows and local widths; mesh (may be NULL) is whose world
 * cai_fp8_step reduces the amaxes over. Not collective. */
cai_status cai_model_set_fp8(cai_model_t *m, const cai_fp8_config *cfg, cai_mesh_t *mesh);
/* The model's FP8 state, or NULL. */
cai_fp8_t *cai_model_fp8(const cai_model_t *m);

/* Pipeline stage boundary of the selected chunk and slot, [B,T,C] in act
 * dtype: `input` (non-first stages write it before forward), `output`
 * (non-last stages read it after forward), `d_stream` (non-last stages write d(output) there before
 * backward; non-first stages read d(input) there after it). */
cai_status cai_model_stage_io(cai_model_t *m, cai_tensor *input, cai_tensor *output, cai_tensor *d_stream);

/* ---- units, hooks and external parameter storage
 * (docs/model.md "Hooks"; used by gradient buckets and ZeRO, src/parallel/).
 * A unit is what runs as one piece: the embedding (first stage), each block,
 * the head with the final norm and loss (last stage), numbered from 0 in
 * forward order. None of this is collective; a hook may be. */

typedef enum {
    CAI_MODEL_PRE_FORWARD = 0, /* before a unit's forward */
    CAI_MODEL_POST_FORWARD,    /* after it */
    CAI_MODEL_PRE_BACKWARD,    /* before its backward (and its checkpointed re-forward) */
    CAI_MODEL_POST_BACKWARD,   /* after it: the unit's gradient contributions are all written */
    CAI_MODEL_EVENT_COUNT
} cai_model_event;

int cai_model_unit_count(const cai_model_t *m);
/* Registry indices of the parameters unit `unit` reads and whose gradients
 * its backward accumulates into, in registration order (a tied head lists
 * the embedding it reads); returns how many (at most `max` are written). */
int cai_model_unit_params(const cai_model_t *m, int unit, int *indices, int max);

/* Hooks are called at every event of every unit from cai_model_forward /
 * backward, in the order they were added (a ZeRO engine's, later a pipeline
 * executor's or a profiler's); the first error stops the pass and is
 * returned from it. At most CAI_MODEL_MAX_HOOKS; adding the same (fn, ctx)
 * twice is refused, as is removing one that is not there. */
#define CAI_MODEL_MAX_HOOKS 8
typedef cai_status (*cai_model_hook_fn)(void *ctx, cai_model_t *m, cai_model_event ev, int unit);
cai_status cai_model_add_hook(cai_model_t *m, cai_model_hook_fn fn, void *ctx);
cai_status cai_model_remove_hook(cai_model_t *m, cai_model_hook_fn fn, void *ctx);

/* External parameter storage (cai_model_options.external_params = 1): the
 * model allocates and initialises no parameter, gradient or working-copy
 * buffer; cai_model_flat gives empty views, cai_model_param fails,
 * cai_model_zero_grad and cai_model_params_updated do nothing. Before a unit
 * runs, its parameters must be bound (typically from the PRE_FORWARD /
 * PRE_BACKWARD hook): `compute` holds the local shard in act dtype as the
 * registry shapes it, `grad` its F32 gradient (accumulated into by
 * backward). NULL unbinds. A unit whose parameters are not all bound (or,
 * before backward, whose gradients are not) fails naming the parameter:
 * unbound optional tensors would otherwise read as absent biases. */
cai_status cai_model_bind_param(cai_model_t *m, int index, void *compute, float *grad);
int cai_model_external_params(const cai_model_t *m);
/* 1 when the model runs split-gather sequence parallelism (tp > 1 and
 * cai_model_options.seq_parallel): which gradients it leaves partial
 * (cai_registry_grad_axes). */
int cai_model_seq_parallel(const cai_model_t *m);

/* ====================================================== end of model */

#ifdef __cplusplus
}
#endif
#endif
