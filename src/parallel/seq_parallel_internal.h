/* Shared by ring_attention.c and ulysses.c: workspace carving and the
 * argument checks both modes make. */
#ifndef CAI_SEQ_PARALLEL_INTERNAL_H
#define CAI_SEQ_PARALLEL_INTERNAL_H

#include "colossal/seq_parallel.h"

/* A bump allocator over the caller's workspace; each piece 256-byte
 * aligned. With base NULL it only counts (the *_workspace_bytes queries
 * walk the same carving as the passes, so the two cannot disagree). */
typedef struct {
    char *base;
    size_t used, cap;
} sp_carve;

void *sp_take(sp_carve *c, size_t bytes);

/* The local shapes of q, k, v (and out/dout like q), checked against each
 * other and against sp = the axis size: every rank's q [B,Tl,Hq,D], k and
 * v [B,Tl,Hkv,D], all on cx->dev in one dtype. */
typedef struct {
    int64_t B, Tl, Hq, Hkv, D;
    int sp, rank;
    cai_dtype dtype;
    size_t es;
} sp_dims;

cai_status sp_dims_check(const char *op, const cai_sp_ctx *cx, const cai_tensor *q, const cai_tensor *k,
                         const cai_tensor *v, const cai_tensor *out, const char *out_name, sp_dims *d);
/* lse: contiguous F32 [d0, d1, d2]. */
cai_status sp_lse_check(const char *op, const cai_tensor *lse, int64_t d0, int64_t d1, int64_t d2);
/* The workspace is at least `need` bytes. */
cai_status sp_ws_check(const char *op, const cai_sp_ctx *cx, size_t need);
cai_sp_attn_shape sp_shape(const sp_dims *d);
/* The local dims of a whole-problem shape (rank 0, dtype unset). */
sp_dims sp_dims_of(const cai_sp_attn_shape *s, size_t es);
/* A mode's carving of its workspace pieces into `w`: counted into *bytes
 * (may be NULL); with cx also checked against cx's workspace and carved
 * from it. */
typedef void (*sp_carve_fn)(sp_carve *c, cai_device_t *dev, const sp_dims *d, void *w);
cai_status sp_carve_workspace(const char *op, sp_carve_fn carve, const cai_sp_ctx *cx, cai_device_t *dev,
                              const sp_dims *d, void *w, size_t *bytes);
/* The checks every mode makes (sizes >= 1, heads a multiple of kv heads). */
cai_status sp_shape_basic(const char *mode, const cai_sp_attn_shape *s);
/* "seq_len A or B at sp P; sp that fits seq_len: 1, 2, ..." for a sequence
 * length n that must be a multiple of unit_per_sp * sp. */
size_t sp_fitting(char *buf, size_t cap, int64_t n, int64_t unit_per_sp, int sp);

#endif
