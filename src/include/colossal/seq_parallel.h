/* Sequence-parallel attention over the mesh's sp axis (parallel layer;
 * docs/sequence-parallel.md): the two modes that shard a long sequence's
 * attention itself, beside tensor parallelism's split-gather mode.
 *
 *  - Ring attention (context parallelism; src/parallel/ring_attention.c):
 *    each rank keeps the queries of its shard; key/value blocks travel
 *    around the sp ring with non-blocking point-to-point, the next block's
 *    transfer in flight while the current block's attention runs, and the
 *    partial results merge by their log-sum-exp (ops->attention_merge).
 *    Causal load balance comes from the zigzag split: with the sequence cut
 *    into 2*sp chunks, rank r holds chunks r and 2*sp-1-r, one early and one
 *    late, so every rank scores the same number of (query, key) pairs. The
 *    backward passes the key/value blocks again, with their gradients
 *    travelling beside them, each block's attention_bwd using the global
 *    log-sum-exp.
 *  - Ulysses (DeepSpeed's all-to-all; src/parallel/ulysses.c): rank r holds
 *    tokens [r*T/sp, (r+1)*T/sp); an all-to-all turns q/k/v's sequence
 *    shards into head shards (every token, n_heads/sp heads), attention
 *    runs on the whole sequence of those heads, and a second all-to-all
 *    returns the output to sequence shards. Key/value heads split the same
 *    way when sp divides them, else (sp a multiple of n_kv_heads) each is
 *    replicated on sp/n_kv_heads ranks and its gradient summed back.
 *
 * Every fwd/bwd is collective over the context's axis: all its ranks call
 * them in the same order with the same shapes. Nothing here allocates:
 * scratch comes from a caller workspace sized by the *_workspace_bytes
 * functions, which validate the shapes first (before any allocation). */
#ifndef COLOSSAL_SEQ_PARALLEL_H
#define COLOSSAL_SEQ_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/cluster.h"
#include "colossal/model.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The whole attention problem and the sp ranks that share it. */
typedef struct {
    int64_t batch;   /* B */
    int64_t seq_len; /* T: the whole sequence, all shards together */
    int64_t n_heads, n_kv_heads, head_dim;
    int sp; /* ranks on the sp axis */
} cai_sp_attn_shape;

/* Where the collectives run and the scratch they use: axis is normally
 * CAI_AXIS_SP; workspace holds at least the bytes the mode's
 * *_workspace_bytes gave for these shapes on this device. */
typedef struct {
    cai_mesh_t *mesh;
    cai_axis axis;
    cai_device_t *dev;
    void *workspace;
    size_t workspace_bytes;
} cai_sp_ctx;

/* Validation, pure (no MPI): seq_len divisible by 2*sp (ring) or sp
 * (Ulysses); for Ulysses also n_heads divisible by sp and n_kv_heads either
 * divisible by sp or dividing it. Failures are CAI_ERR_LAYOUT naming the
 * values and what would fit (the nearest sequence lengths, the sp sizes). */
cai_status cai_ring_attn_validate(const cai_sp_attn_shape *s);
cai_status cai_ulysses_validate(const cai_sp_attn_shape *s);

/* Validate, then the scratch bytes fwd and bwd need on `dev` (the max of
 * both). Not collective. */
cai_status cai_ring_attn_workspace_bytes(cai_device_t *dev, const cai_sp_attn_shape *s, size_t *bytes);
cai_status cai_ulysses_workspace_bytes(cai_device_t *dev, const cai_sp_attn_shape *s, size_t *bytes);

/* ---- ring attention. Tl = seq_len / sp tokens per rank, in the zigzag
 * layout (cai_zigzag_shard). q [B,Tl,Hq,D], k and v [B,Tl,Hkv,D], out like
 * q, lse [B,Hq,Tl] F32 contiguous (the log-sum-exp over the whole
 * sequence's keys, what bwd needs); strided views into a fused QKV buffer
 * are fine, as for ops->attention_fwd. params: scale and causal (0 or 1)
 * only; causal_offset, window and doc_ids must be 0 / NULL. The causal
 * mask is the whole sequence's, by global position. dq/dk/dv are
 * overwritten. Collective over cx->axis. */
cai_status cai_ring_attn_fwd(const cai_sp_ctx *cx, cai_tensor *out, cai_tensor *lse, const cai_tensor *q,
                             const cai_tensor *k, const cai_tensor *v, const cai_attn_params *params);
cai_status cai_ring_attn_bwd(const cai_sp_ctx *cx, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv,
                             const cai_tensor *dout, const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
                             const cai_tensor *out, const cai_tensor *lse, const cai_attn_params *params);

/* ---- Ulysses. Rank r holds tokens [r*Tl, (r+1)*Tl): q, k, v, out as for
 * the ring; lse [B, Hq/sp, T] F32 contiguous (the head shard's statistics
 * over the whole sequence, as many elements as [B,Hq,Tl]). params as
 * ops->attention_fwd takes them (causal, offset, window), except doc_ids
 * (refused). bwd exchanges q, k, v, out and dout again rather than keeping
 * the head-sharded copies from fwd. Collective over cx->axis. */
cai_status cai_ulysses_attn_fwd(const cai_sp_ctx *cx, cai_tensor *out, cai_tensor *lse, const cai_tensor *q,
                                const cai_tensor *k, const cai_tensor *v, const cai_attn_params *params);
cai_status cai_ulysses_attn_bwd(const cai_sp_ctx *cx, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv,
                                const cai_tensor *dout, const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
                                const cai_tensor *out, const cai_tensor *lse, const cai_attn_params *params);

/* ---- the zigzag layout. With c = T/(2*sp), rank r holds chunks r and
 * 2*sp-1-r: global tokens [r*c, (r+1)*c) then [(2*sp-1-r)*c, (2*sp-r)*c).
 * shard: local [B, 2c, ...] = rank's tokens of full [B, T, ...] (dimension
 * 1 is the sequence; any strides, via ops->copy). unshard: the reverse,
 * writing the rank's tokens into full and leaving the others. positions:
 * the 2c global positions of the rank's tokens (for RoPE's positions
 * tensor, I32 [2c]). Not collective. */
cai_status cai_zigzag_shard(cai_device_t *dev, cai_tensor *local, const cai_tensor *full, int sp, int rank);
cai_status cai_zigzag_unshard(cai_device_t *dev, cai_tensor *full, const cai_tensor *local, int sp, int rank);
cai_status cai_zigzag_positions(int64_t seq_len, int sp, int rank, int32_t *positions);

/* ---- a model's attention over the sp axis (cai_model_set_seq_attention).
 * Each rank runs the model on its T/sp tokens of every row: ring takes the
 * zigzag chunks, Ulysses the rank's contiguous block. */
typedef enum { CAI_SP_ULYSSES = 1, CAI_SP_RING = 2 } cai_sp_mode;

typedef struct {
    cai_attn_hook hook; /* what the model calls; ctx points at this struct */
    cai_sp_ctx cx;
    cai_sp_mode mode;
    cai_sp_attn_shape shape;
} cai_sp_attention;

/* Validates the mode's shape (heads as the layers hold them: n_heads / tp),
 * then allocates its workspace on dev and fills a, which must not move
 * while the model uses a->hook. sp is the mesh's axis size. Not collective. */
cai_status cai_sp_attention_init(cai_sp_attention *a, cai_mesh_t *mesh, cai_axis axis, cai_device_t *dev,
                                 cai_sp_mode mode, const cai_sp_attn_shape *s);
void cai_sp_attention_free(cai_sp_attention *a);
/* The global positions of the rank's T/sp tokens ([T/sp] I32). Not collective. */
cai_status cai_sp_positions(cai_sp_mode mode, int64_t seq_len, int sp, int rank, int32_t *positions);
/* The rank's tokens of `rows` host rows of seq_len ids: local [rows, T/sp]. Not collective. */
cai_status cai_sp_shard_rows(cai_sp_mode mode, const int32_t *full, int64_t rows, int64_t seq_len, int sp, int rank,
                             int32_t *local);

#ifdef __cplusplus
}
#endif
#endif
