/* What ring attention and Ulysses share: the workspace carving, the checks
 * of the local q/k/v/out shapes against the sp axis, and the zigzag layout
 * (docs/sequence-parallel.md). */
#include "cai_config.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "seq_parallel_internal.h"

void *sp_take(sp_carve *c, size_t bytes) {
    size_t at = (c->used + 255) & ~(size_t)255;
    c->used = at + bytes;
    return c->base ? c->base + at : NULL;
}

static const char *describe(const cai_tensor *t) { return cai_tensor_describe(t, (char[160]){0}, 160); }

static cai_status want_bthd(const char *op, const char *arg, const cai_tensor *t, const cai_sp_ctx *cx,
                            cai_dtype dtype) {
    if (!t) return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is NULL", op, arg);
    if (t->ndim != 4 || t->device != cx->dev || t->dtype != dtype)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: %s is %s on %s; expected [B,T_local,heads,head_dim] of q's dtype on %s", op, arg,
                         describe(t), t->device ? t->device->name : "host", cx->dev->name);
    return CAI_OK;
}

cai_status sp_dims_check(const char *op, const cai_sp_ctx *cx, const cai_tensor *q, const cai_tensor *k,
                         const cai_tensor *v, const cai_tensor *out, const char *out_name, sp_dims *d) {
    CAI_CHECK_ARG(cx && cx->mesh && cx->dev, "%s: the context needs a mesh and a device", op);
    CAI_CHECK_ARG(q, "%s: q is NULL", op);
    CAI_CALL(want_bthd(op, "q", q, cx, q->dtype));
    CAI_CALL(want_bthd(op, "k", k, cx, q->dtype));
    CAI_CALL(want_bthd(op, "v", v, cx, q->dtype));
    if (out) CAI_CALL(want_bthd(op, out_name, out, cx, q->dtype));
    sp_dims r = {.B = q->shape[0],
                 .Tl = q->shape[1],
                 .Hq = q->shape[2],
                 .Hkv = k->shape[2],
                 .D = q->shape[3],
                 .sp = cai_mesh_size(cx->mesh, cx->axis),
                 .rank = cai_mesh_rank(cx->mesh, cx->axis),
                 .dtype = q->dtype,
                 .es = cai_dtype_size(q->dtype)};
    if (!cai_tensor_same_shape(k, v) || k->shape[0] != r.B || k->shape[1] != r.Tl || k->shape[3] != r.D)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: q is %s, k %s, v %s; k and v must be [%" PRId64 ",%" PRId64 ",kv_heads,%" PRId64
                         "] alike",
                         op, describe(q), describe(k), describe(v), r.B, r.Tl, r.D);
    if (out && !cai_tensor_same_shape(out, q))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s but q is %s; they must match", op, out_name, describe(out),
                         describe(q));
    *d = r;
    return CAI_OK;
}

cai_status sp_lse_check(const char *op, const cai_tensor *lse, int64_t d0, int64_t d1, int64_t d2) {
    if (!lse || lse->ndim != 3 || lse->dtype != CAI_DTYPE_F32 || !cai_tensor_is_contiguous(lse) ||
        lse->shape[0] != d0 || lse->shape[1] != d1 || lse->shape[2] != d2)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: lse is %s, expected contiguous f32[%" PRId64 ",%" PRId64 ",%" PRId64 "]", op,
                         lse ? describe(lse) : "NULL", d0, d1, d2);
    return CAI_OK;
}

cai_status sp_ws_check(const char *op, const cai_sp_ctx *cx, size_t need) {
    if (!cx->workspace || cx->workspace_bytes < need)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: workspace of %zu bytes is too small, %zu needed (ask the mode's "
                         "*_workspace_bytes for these shapes and this device)",
                         op, cx->workspace ? cx->workspace_bytes : 0, need);
    return CAI_OK;
}

sp_dims sp_dims_of(const cai_sp_attn_shape *s, size_t es) {
    return (sp_dims){.B = s->batch,
                     .Tl = s->seq_len / s->sp,
                     .Hq = s->n_heads,
                     .Hkv = s->n_kv_heads,
                     .D = s->head_dim,
                     .sp = s->sp,
                     .es = es};
}

cai_status sp_carve_workspace(const char *op, sp_carve_fn carve, const cai_sp_ctx *cx, cai_device_t *dev,
                              const sp_dims *d, void *w, size_t *bytes) {
    sp_carve c = {0};
    carve(&c, dev, d, w);
    if (bytes) *bytes = c.used;
    if (!cx) return CAI_OK;
    CAI_CALL(sp_ws_check(op, cx, c.used));
    c = (sp_carve){.base = cx->workspace, .cap = cx->workspace_bytes};
    carve(&c, dev, d, w);
    return CAI_OK;
}

cai_sp_attn_shape sp_shape(const sp_dims *d) {
    return (cai_sp_attn_shape){
        .batch = d->B, .seq_len = d->Tl * d->sp, .n_heads = d->Hq, .n_kv_heads = d->Hkv, .head_dim = d->D, .sp = d->sp};
}

cai_status sp_shape_basic(const char *mode, const cai_sp_attn_shape *s) {
    CAI_CHECK_ARG(s, "%s: shape is NULL", mode);
    if (s->batch < 1 || s->seq_len < 1 || s->n_heads < 1 || s->n_kv_heads < 1 || s->head_dim < 1 || s->sp < 1)
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "%s: batch %" PRId64 ", seq_len %" PRId64 ", heads %" PRId64 ", kv heads %" PRId64
                         ", head_dim %" PRId64 " and sp %d must all be at least 1",
                         mode, s->batch, s->seq_len, s->n_heads, s->n_kv_heads, s->head_dim, s->sp);
    if (s->n_heads % s->n_kv_heads)
        return CAI_ERROR(CAI_ERR_LAYOUT, "%s: %" PRId64 " heads are not a multiple of %" PRId64 " kv heads", mode,
                         s->n_heads, s->n_kv_heads);
    return CAI_OK;
}

size_t sp_fitting(char *buf, size_t cap, int64_t n, int64_t unit_per_sp, int sp) {
    size_t len = 0;
    const int64_t m = unit_per_sp * sp;
    int64_t lo = n / m * m, hi = lo + m;
    len += (size_t)snprintf(buf + len, cap - len, "seq_len %" PRId64 " or %" PRId64 " at sp %d", lo ? lo : hi,
                            lo ? hi : hi + m, sp);
    int any = 0;
    for (int p = 1; p <= 64 && len < cap; p++)
        if (n % (unit_per_sp * p) == 0) {
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", any ? ", " : "; sp that fits seq_len: ", p);
            any = 1;
        }
    return len;
}

/* ------------------------------------------------------------ zigzag */

static cai_status zigzag_check(const char *op, const cai_tensor *local, const cai_tensor *full, int sp, int rank) {
    CAI_CHECK_ARG(local && full, "%s: local and full are required", op);
    CAI_CHECK_ARG(sp >= 1 && rank >= 0 && rank < sp, "%s: rank %d is not in [0, sp = %d)", op, rank, sp);
    int ok = local->ndim == full->ndim && local->ndim >= 2;
    for (int i = 0; ok && i < local->ndim; i++)
        if (i != 1 && local->shape[i] != full->shape[i]) ok = 0;
    if (!ok)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: local %s and full %s must agree on every dimension but 1 (sequence)",
                         op, describe(local), describe(full));
    const int64_t T = full->shape[1];
    if (T % (2 * sp) || local->shape[1] != T / sp)
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "%s: full holds %" PRId64 " tokens and local %" PRId64
                         "; the zigzag split needs tokens divisible by 2*sp = %d and local = tokens/sp",
                         op, T, local->shape[1], 2 * sp);
    return CAI_OK;
}

/* Local chunk i (0 or 1) of the rank and the same tokens in full. */
static cai_status zigzag_pair(const cai_tensor *local, const cai_tensor *full, int sp, int rank, int i, cai_tensor *lv,
                              cai_tensor *fv) {
    const int64_t c = full->shape[1] / (2 * sp);
    const int64_t chunk = i == 0 ? rank : 2 * sp - 1 - rank;
    CAI_CALL(cai_tensor_narrow(local, 1, i * c, c, lv));
    CAI_CALL(cai_tensor_narrow(full, 1, chunk * c, c, fv));
    return CAI_OK;
}

/* Copies the rank's two chunks between local and full, either way. */
static cai_status zigzag_move(const char *op, cai_device_t *dev, const cai_tensor *local, const cai_tensor *full,
                              int sp, int rank, int to_local) {
    CAI_CALL(zigzag_check(op, local, full, sp, rank));
    for (int i = 0; i < 2; i++) {
        cai_tensor lv, fv;
        CAI_CALL(zigzag_pair(local, full, sp, rank, i, &lv, &fv));
        CAI_CALL(to_local ? dev->ops->copy(dev, &lv, &fv) : dev->ops->copy(dev, &fv, &lv));
    }
    return CAI_OK;
}

cai_status cai_zigzag_shard(cai_device_t *dev, cai_tensor *local, const cai_tensor *full, int sp, int rank) {
    return zigzag_move("zigzag_shard", dev, local, full, sp, rank, 1);
}

cai_status cai_zigzag_unshard(cai_device_t *dev, cai_tensor *full, const cai_tensor *local, int sp, int rank) {
    return zigzag_move("zigzag_unshard", dev, local, full, sp, rank, 0);
}

cai_status cai_zigzag_positions(int64_t seq_len, int sp, int rank, int32_t *positions) {
    CAI_CHECK_ARG(positions, "zigzag_positions: positions is NULL");
    CAI_CHECK_ARG(sp >= 1 && rank >= 0 && rank < sp, "zigzag_positions: rank %d is not in [0, sp = %d)", rank, sp);
    if (seq_len < 1 || seq_len % (2 * sp) || seq_len > INT32_MAX)
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "zigzag_positions: seq_len %" PRId64 " is not a positive multiple of 2*sp = %d", seq_len,
                         2 * sp);
    const int64_t c = seq_len / (2 * sp);
    for (int64_t i = 0; i < c; i++) {
        positions[i] = (int32_t)(rank * c + i);
        positions[c + i] = (int32_t)((2 * sp - 1 - rank) * c + i);
    }
    return CAI_OK;
}

/* ------------------------------------------------------------ model hook */

static cai_status hook_fwd(void *ctx, cai_tensor *out, cai_tensor *lse, const cai_tensor *q, const cai_tensor *k,
                           const cai_tensor *v, const cai_attn_params *params) {
    const cai_sp_attention *a = ctx;
    if (a->mode == CAI_SP_RING) return cai_ring_attn_fwd(&a->cx, out, lse, q, k, v, params);
    /* Ulysses keeps [B, Hq/sp, T] in the layer's [B, Hq, T/sp] buffer. */
    cai_tensor l;
    CAI_CALL(cai_tensor_reshape(lse, 3,
                                (const int64_t[]){a->shape.batch, a->shape.n_heads / a->shape.sp, a->shape.seq_len},
                                &l));
    return cai_ulysses_attn_fwd(&a->cx, out, &l, q, k, v, params);
}

static cai_status hook_bwd(void *ctx, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv, const cai_tensor *dout,
                           const cai_tensor *q, const cai_tensor *k, const cai_tensor *v, const cai_tensor *out,
                           const cai_tensor *lse, const cai_attn_params *params) {
    const cai_sp_attention *a = ctx;
    if (a->mode == CAI_SP_RING) return cai_ring_attn_bwd(&a->cx, dq, dk, dv, dout, q, k, v, out, lse, params);
    cai_tensor l;
    CAI_CALL(cai_tensor_reshape(lse, 3,
                                (const int64_t[]){a->shape.batch, a->shape.n_heads / a->shape.sp, a->shape.seq_len},
                                &l));
    return cai_ulysses_attn_bwd(&a->cx, dq, dk, dv, dout, q, k, v, out, &l, params);
}

cai_status cai_sp_attention_init(cai_sp_attention *a, cai_mesh_t *mesh, cai_axis axis, cai_device_t *dev,
                                 cai_sp_mode mode, const cai_sp_attn_shape *s) {
    CAI_CHECK_ARG(a && mesh && dev && s, "cai_sp_attention_init: NULL argument");
    CAI_CHECK_ARG(mode == CAI_SP_RING || mode == CAI_SP_ULYSSES, "cai_sp_attention_init: unknown mode %d", (int)mode);
    CAI_CHECK_ARG(s->sp == cai_mesh_size(mesh, axis), "cai_sp_attention_init: shape's sp %d is not the %s axis' %d",
                  s->sp, cai_axis_name(axis), cai_mesh_size(mesh, axis));
    memset(a, 0, sizeof *a);
    size_t bytes = 0;
    if (mode == CAI_SP_RING) CAI_CALL(cai_ring_attn_workspace_bytes(dev, s, &bytes));
    else CAI_CALL(cai_ulysses_workspace_bytes(dev, s, &bytes));
    void *ws = NULL;
    CAI_CALL(cai_device_alloc(dev, bytes, mode == CAI_SP_RING ? "ring attention workspace" : "Ulysses workspace", &ws));
    a->cx = (cai_sp_ctx){mesh, axis, dev, ws, bytes};
    a->mode = mode;
    a->shape = *s;
    a->hook = (cai_attn_hook){hook_fwd, hook_bwd, a};
    return CAI_OK;
}

void cai_sp_attention_free(cai_sp_attention *a) {
    if (!a || !a->cx.dev) return;
    cai_device_dealloc(a->cx.dev, a->cx.workspace);
    memset(a, 0, sizeof *a);
}

cai_status cai_sp_positions(cai_sp_mode mode, int64_t seq_len, int sp, int rank, int32_t *positions) {
    if (mode == CAI_SP_RING) return cai_zigzag_positions(seq_len, sp, rank, positions);
    CAI_CHECK_ARG(positions && sp >= 1 && rank >= 0 && rank < sp, "cai_sp_positions: rank %d of sp %d", rank, sp);
    if (seq_len < 1 || seq_len % sp || seq_len > INT32_MAX)
        return CAI_ERROR(CAI_ERR_LAYOUT, "cai_sp_positions: seq_len %" PRId64 " is not a positive multiple of sp = %d",
                         seq_len, sp);
    const int64_t n = seq_len / sp;
    for (int64_t i = 0; i < n; i++) positions[i] = (int32_t)(rank * n + i);
    return CAI_OK;
}

cai_status cai_sp_shard_rows(cai_sp_mode mode, const int32_t *full, int64_t rows, int64_t seq_len, int sp, int rank,
                             int32_t *local) {
    CAI_CHECK_ARG(full && local && rows >= 0, "cai_sp_shard_rows: NULL argument");
    const int64_t n = seq_len / (sp > 0 ? sp : 1);
    int32_t *pos = NULL;
    CAI_CALL(cai_malloc((void **)&pos, (size_t)(n > 0 ? n : 1) * sizeof *pos, "sequence shard positions"));
    cai_status st = cai_sp_positions(mode, seq_len, sp, rank, pos);
    for (int64_t r = 0; st == CAI_OK && r < rows; r++)
        for (int64_t i = 0; i < n; i++) local[r * n + i] = full[r * seq_len + pos[i]];
    cai_free(pos);
    return st;
}
