/* CPU backend: the mixture-of-experts row movement between token rows
 * [N, C] and expert-grouped rows [S, C] named by pos (I32 [N * k]).
 *
 * The F32 paths are the MoE layer's former host loops operation for
 * operation (same products, f32 sums in j order, the dot of the weight
 * gradient in double), so results match them bit for bit. BF16 and F16
 * convert each element to f32, compute the same way and round once on store.
 * Every output row is written by one loop iteration, so results do not depend
 * on the thread count; that needs the kept pos entries to be distinct, which
 * the host checks before writing (the device backends trust it). */
#include "cai_config.h"
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

static inline float load(const char *base, cai_dtype dt, int64_t i) {
    if (dt == CAI_DTYPE_F32) return ((const float *)base)[i];
    if (dt == CAI_DTYPE_BF16) return cai_bf16_to_f32(((const cai_bf16 *)base)[i]);
    return cai_f16_to_f32(((const cai_f16 *)base)[i]);
}

static inline void store(char *base, cai_dtype dt, int64_t i, float v) {
    if (dt == CAI_DTYPE_F32) ((float *)base)[i] = v;
    else if (dt == CAI_DTYPE_BF16) ((cai_bf16 *)base)[i] = cai_f32_to_bf16(v);
    else ((cai_f16 *)base)[i] = cai_f32_to_f16(v);
}

static inline size_t elem_bytes(cai_dtype dt) { return dt == CAI_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t); }

static inline char *row(const cai_rows *r, int64_t i) { return r->data + (size_t)(i * r->ld) * elem_bytes(r->dtype); }

/* A row matrix of any float dtype; with `like`, of like's dtype and width. */
static cai_status moe_rows(const char *op, const char *arg, const cai_tensor *t, const char *like_arg,
                           const cai_tensor *like, const cai_rows *like_rows, cai_rows *out) {
    CAI_CALL(cai_ops_rows(op, arg, t, CAI_HOST, CAI_ANYF, like_rows ? like_rows->cols : -1, out));
    if (like && t->dtype != like->dtype)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s but %s is %s; the rows must be of one dtype", op, arg,
                         CAI_OPS_DESCRIBE(t), like_arg, CAI_OPS_DESCRIBE(like));
    return CAI_OK;
}

/* pos against N token rows and S grouped rows: k = numel(pos) / N, every
 * entry < S, the kept (>= 0) entries distinct when `distinct`. */
static cai_status moe_pos(const char *op, const cai_tensor *pos, int64_t N, const char *s_arg, int64_t S, int distinct,
                          const int32_t **pd, int64_t *k) {
    char *data;
    CAI_CALL(cai_ops_vec(op, "pos", pos, CAI_HOST, CAI_I32, -1, &data));
    const int64_t n = cai_tensor_numel(pos);
    if (N == 0 ? n != 0 : n % N != 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: pos is %s, expected N * k elements for the %" PRId64 " token rows (k choices each)", op,
                         CAI_OPS_DESCRIBE(pos), N);
    const int32_t *p = (const int32_t *)(void *)data;
    for (int64_t i = 0; i < n; i++)
        if (p[i] >= S)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: pos[%" PRId64 "] = %d is past %s's %" PRId64 " rows", op, i,
                             p[i], s_arg, S);
    if (distinct && n > 0) {
        unsigned char *seen = calloc((size_t)(S > 0 ? S : 1), 1);
        if (!seen) return CAI_ERROR(CAI_ERR_NOMEM, "%s: %" PRId64 " bytes to check pos", op, S);
        int64_t dup = -1;
        for (int64_t i = 0; i < n && dup < 0; i++) {
            if (p[i] < 0) continue;
            if (seen[p[i]]) dup = i;
            seen[p[i]] = 1;
        }
        free(seen);
        if (dup >= 0)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: pos[%" PRId64
                             "] = %d repeats an earlier entry; each kept choice needs its own row "
                             "of %s",
                             op, dup, p[dup], s_arg);
    }
    *pd = p;
    *k = N > 0 ? n / N : 0;
    return CAI_OK;
}

/* F32 [n] weights (NULL allowed when `optional`). */
static cai_status moe_weights(const char *op, const char *arg, const cai_tensor *t, int64_t n, int optional,
                              float **out) {
    *out = NULL;
    if (!t && optional) return CAI_OK;
    char *data;
    CAI_CALL(cai_ops_vec(op, arg, t, CAI_HOST, CAI_F32, n, &data));
    *out = (float *)(void *)data;
    return CAI_OK;
}

CPU_OP(moe_permute)(cai_device_t *dev, cai_tensor *xe, const cai_tensor *x, const cai_tensor *pos) {
    static const char op[] = "moe_permute";
    cai_rows xr, er;
    const int32_t *p;
    int64_t k;
    CAI_CALL(moe_rows(op, "x", x, NULL, NULL, NULL, &xr));
    CAI_CALL(moe_rows(op, "xe", xe, "x", x, &xr, &er));
    CAI_CALL(moe_pos(op, pos, xr.rows, "xe", er.rows, 1, &p, &k));
    const int64_t n = xr.rows * k;
    const size_t bytes = (size_t)xr.cols * elem_bytes(xr.dtype);
    const int nt = cai_cpu_threads(dev, n);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++)
        if (p[i] >= 0) memcpy(row(&er, p[i]), row(&xr, i / k), bytes);
    return CAI_OK;
}

CPU_OP(moe_combine_fwd)(cai_device_t *dev, cai_tensor *y, const cai_tensor *ye, const cai_tensor *pos,
                        const cai_tensor *w, int accum) {
    static const char op[] = "moe_combine_fwd";
    cai_rows yr, er;
    const int32_t *p;
    int64_t k;
    float *wd;
    CAI_CALL(moe_rows(op, "y", y, NULL, NULL, NULL, &yr));
    CAI_CALL(moe_rows(op, "ye", ye, "y", y, &yr, &er));
    CAI_CALL(moe_pos(op, pos, yr.rows, "ye", er.rows, 0, &p, &k));
    CAI_CALL(moe_weights(op, "w", w, yr.rows * k, 1, &wd));
    const int64_t N = yr.rows, C = yr.cols;
    const cai_dtype dt = yr.dtype;
    const int nt = cai_cpu_threads(dev, N);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t t = 0; t < N; t++) {
        if (dt == CAI_DTYPE_F32) {
            /* in place, choice by choice: vectorises over c */
            float *dst = (float *)(void *)row(&yr, t);
            if (!accum) memset(dst, 0, (size_t)C * sizeof(float));
            for (int64_t j = 0; j < k; j++) {
                const int32_t r = p[t * k + j];
                if (r < 0) continue;
                const float *src = (const float *)(void *)row(&er, r);
                if (wd) {
                    const float wj = wd[t * k + j];
                    for (int64_t c = 0; c < C; c++) dst[c] += wj * src[c];
                } else {
                    for (int64_t c = 0; c < C; c++) dst[c] += src[c];
                }
            }
            continue;
        }
        char *dst = row(&yr, t);
        for (int64_t c = 0; c < C; c++) {
            float acc = accum ? load(dst, dt, c) : 0.0f;
            for (int64_t j = 0; j < k; j++) {
                const int32_t r = p[t * k + j];
                if (r < 0) continue;
                const float v = load(row(&er, r), dt, c);
                if (wd) acc += wd[t * k + j] * v;
                else acc += v;
            }
            store(dst, dt, c, acc);
        }
    }
    return CAI_OK;
}

CPU_OP(moe_combine_bwd)(cai_device_t *dev, cai_tensor *dye, cai_tensor *dw, const cai_tensor *dy, const cai_tensor *ye,
                        const cai_tensor *pos, const cai_tensor *w) {
    static const char op[] = "moe_combine_bwd";
    cai_rows dr, der, er;
    const int32_t *p;
    int64_t k;
    float *wd, *dwd;
    CAI_CALL(moe_rows(op, "dy", dy, NULL, NULL, NULL, &dr));
    CAI_CALL(moe_rows(op, "ye", ye, "dy", dy, &dr, &er));
    CAI_CALL(moe_rows(op, "dye", dye, "dy", dy, &dr, &der));
    /* pos must fit the shorter of the two grouped buffers */
    const int short_ye = er.rows < der.rows;
    CAI_CALL(moe_pos(op, pos, dr.rows, short_ye ? "ye" : "dye", short_ye ? er.rows : der.rows, 1, &p, &k));
    const int64_t n = dr.rows * k, C = dr.cols;
    CAI_CALL(moe_weights(op, "w", w, n, 0, &wd));
    CAI_CALL(moe_weights(op, "dw", dw, n, 0, &dwd));
    const cai_dtype dt = dr.dtype;
    const int nt = cai_cpu_threads(dev, n);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const int32_t r = p[i];
        double dot = 0.0;
        if (r >= 0) {
            const char *d = row(&dr, i / k), *e = row(&er, r);
            char *o = row(&der, r);
            if (dt == CAI_DTYPE_F32) {
                const float *df = (const float *)(const void *)d, *ef = (const float *)(const void *)e;
                float *of = (float *)(void *)o;
                for (int64_t c = 0; c < C; c++) {
                    of[c] = wd[i] * df[c];
                    dot += (double)df[c] * ef[c];
                }
            } else {
                for (int64_t c = 0; c < C; c++) {
                    const float dc = load(d, dt, c);
                    store(o, dt, c, wd[i] * dc);
                    dot += (double)dc * load(e, dt, c);
                }
            }
        }
        dwd[i] = (float)dot;
    }
    return CAI_OK;
}

/* Block g of a grouped product: its rows of `t` (rows past the blocks are
 * left alone). */
static cai_status block_rows(const char *op, const char *arg, const cai_tensor *t, int64_t off, int64_t n,
                             cai_tensor *out) {
    if (!t) return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is NULL", op, arg);
    if (off + n > t->shape[0])
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: the blocks need %lld rows of %s, which has %lld", op,
                         (long long)(off + n), arg, (long long)t->shape[0]);
    return cai_tensor_slice0(t, off, n, out);
}

static cai_status grouped_args(const char *op, const cai_tensor *weight, const int64_t *rows, int n) {
    if (n < 0 || (n > 0 && (!weight || !rows)))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %d blocks with weight %p, rows %p", op, n, (const void *)weight,
                         (const void *)rows);
    for (int g = 0; g < n; g++)
        if (rows[g] < 0) return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: block %d has %lld rows", op, g, (long long)rows[g]);
    return CAI_OK;
}

/* The host has no grouped kernel: one linear_fwd per block. */
cai_status cai_cpu_grouped_linear_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp,
                                      const cai_tensor *weight, const int64_t *rows, int n) {
    static const char *op = "grouped_linear_fwd";
    CAI_CALL(grouped_args(op, weight, rows, n));
    for (int64_t g = 0, off = 0; g < n; off += rows[g], g++) {
        if (!rows[g]) continue;
        cai_tensor x, y;
        CAI_CALL(block_rows(op, "inp", inp, off, rows[g], &x));
        CAI_CALL(block_rows(op, "out", out, off, rows[g], &y));
        CAI_CALL(cai_cpu_linear_fwd(dev, &y, &x, &weight[g], NULL));
    }
    return CAI_OK;
}

cai_status cai_cpu_grouped_linear_bwd(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout,
                                      const cai_tensor *inp, const cai_tensor *weight, const int64_t *rows, int n,
                                      int accum) {
    static const char *op = "grouped_linear_bwd";
    CAI_CALL(grouped_args(op, weight, rows, n));
    if (!dweight && n > 0) return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dweight is NULL", op);
    for (int64_t g = 0, off = 0; g < n; off += rows[g], g++) {
        if (!rows[g]) continue;
        cai_tensor dx, dy, x;
        CAI_CALL(block_rows(op, "dout", dout, off, rows[g], &dy));
        CAI_CALL(block_rows(op, "inp", inp, off, rows[g], &x));
        if (dinp) CAI_CALL(block_rows(op, "dinp", dinp, off, rows[g], &dx));
        CAI_CALL(cai_cpu_linear_bwd(dev, dinp ? &dx : NULL, &dweight[g], NULL, &dy, &x, &weight[g], accum));
    }
    return CAI_OK;
}
