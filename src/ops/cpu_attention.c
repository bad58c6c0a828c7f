/* CPU backend: causal self-attention with multi-head and grouped-query
 * heads, flash-attention style: the forward keeps only the log-sum-exp of
 * each score row, the backward recomputes probabilities from it, so nothing
 * T x T outlives a call and the workspace is one score row per thread.
 *
 * Forward parallelises over (batch, head, query row); backward over (batch,
 * kv head), so each thread owns the dk/dv rows it accumulates and results do
 * not depend on the thread count. */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>
#include <string.h>
#include <stdint.h>

static int64_t row_floats(int64_t Tk) { return (Tk + 15) / 16 * 16; } /* 64-byte rows */

size_t cai_cpu_attention_workspace_bytes(const cai_device_t *dev, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                                         int64_t Hkv, int64_t D) {
    int nt = dev && dev->num_threads > 0 ? dev->num_threads : 1;
    return (size_t)nt * (size_t)row_floats(Tk) * sizeof(float) + 64;
}

typedef struct {
    cai_bthd q, k, v, o;
    float *lse; /* [B,Hq,Tq] */
    float scale;
    int causal;
    int64_t off, window, group;
    float *ws; /* per thread: row_floats(Tk) */
} attn_args;

static cai_status attn_check(const char *op, attn_args *a, const cai_tensor *out, const char *out_name,
                             const cai_tensor *lse, const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
                             const cai_attn_params *params, const cai_device_t *dev, void *workspace,
                             size_t workspace_bytes) {
    memset(a, 0, sizeof *a);
    CAI_CALL(cai_ops_bthd(op, "q", q, CAI_HOST, CAI_F32, &a->q));
    CAI_CALL(cai_ops_bthd(op, "k", k, CAI_HOST, CAI_F32, &a->k));
    CAI_CALL(cai_ops_bthd(op, "v", v, CAI_HOST, CAI_F32, &a->v));
    CAI_CALL(cai_ops_bthd(op, out_name, out, CAI_HOST, CAI_F32, &a->o));
    CAI_CHECK_ARG(params, "%s: NULL params", op);
    if (!cai_tensor_same_shape(k, v))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: k is %s but v is %s; they must match", op, CAI_OPS_DESCRIBE(k),
                         CAI_OPS_DESCRIBE(v));
    if (!cai_tensor_same_shape(q, out))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s but q is %s; they must match", op, out_name,
                         CAI_OPS_DESCRIBE(out), CAI_OPS_DESCRIBE(q));
    if (a->k.B != a->q.B || a->k.D != a->q.D)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: q is %s and k %s: batch and head_dim must match", op,
                         CAI_OPS_DESCRIBE(q), CAI_OPS_DESCRIBE(k));
    if (a->k.H <= 0 || a->q.H % a->k.H != 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %" PRId64 " query heads do not divide into groups over %" PRId64
                         " kv heads", op, a->q.H, a->k.H);
    a->group = a->q.H / a->k.H;
    if (lse) {
        char *p;
        CAI_CALL(cai_ops_vec(op, "lse", lse, CAI_HOST, CAI_F32, a->q.B * a->q.H * a->q.T, &p));
        a->lse = (float *)p;
    }
    a->scale = params->scale != 0.0f ? params->scale : 1.0f / sqrtf((float)(a->q.D > 0 ? a->q.D : 1));
    a->causal = params->causal;
    a->off = params->causal_offset;
    a->window = params->window;
    CAI_CHECK_ARG(a->window >= 0, "%s: window %" PRId64 " must be >= 0", op, a->window);
    size_t need = cai_cpu_attention_workspace_bytes(dev, a->q.B, a->q.T, a->k.T, a->q.H, a->k.H, a->q.D);
    if (workspace_bytes < need || !workspace)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: workspace of %zu bytes is too small, %zu needed (ask "
                         "attention_workspace_bytes for these sizes and this device)", op, workspace_bytes, need);
    uintptr_t w = ((uintptr_t)workspace + 63) & ~(uintptr_t)63;
    a->ws = (float *)w;
    return CAI_OK;
}

/* Visible key range [lo, hi] for query row i; empty when hi < lo. */
static inline void key_range(const attn_args *a, int64_t i, int64_t *lo, int64_t *hi) {
    int64_t last = a->k.T - 1, first = 0;
    if (a->causal) {
        int64_t lim = i + a->off;
        if (lim < last) last = lim;
        if (a->window > 0 && lim - a->window + 1 > first) first = lim - a->window + 1;
    }
    *lo = first;
    *hi = last;
}

static inline const float *rowp(const cai_bthd *t, int64_t b, int64_t s, int64_t h) {
    return (const float *)t->data + b * t->sb + s * t->st + h * t->sh;
}

static inline float dot(const float *x, const float *y, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < n; d++) s += x[d] * y[d];
    return s;
}

cai_status cai_cpu_attention_fwd(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *q,
                                 const cai_tensor *k, const cai_tensor *v, const cai_attn_params *params,
                                 void *workspace, size_t workspace_bytes) {
    attn_args a;
    CAI_CALL(attn_check("attention_fwd", &a, out, "out", lse, q, k, v, params, dev, workspace, workspace_bytes));
    const int64_t B = a.q.B, Hq = a.q.H, Tq = a.q.T, D = a.q.D, nrows = B * Hq * Tq;
    const int64_t stride_ws = row_floats(a.k.T);
#pragma omp parallel for num_threads(cai_cpu_threads(dev, nrows)) schedule(dynamic, 8)
    for (int64_t r = 0; r < nrows; r++) {
        int64_t i = r % Tq, h = (r / Tq) % Hq, b = r / (Tq * Hq), hk = h / a.group;
        float *s = a.ws + (int64_t)CAI_THREAD_ID() * stride_ws;
        const float *qi = rowp(&a.q, b, i, h);
        float *oi = (float *)rowp(&a.o, b, i, h);
        int64_t lo, hi;
        key_range(&a, i, &lo, &hi);
        for (int64_t d = 0; d < D; d++) oi[d] = 0.0f;
        if (hi < lo) {
            if (a.lse) a.lse[(b * Hq + h) * Tq + i] = -INFINITY;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t j = lo; j <= hi; j++) {
            float sj = a.scale * dot(qi, rowp(&a.k, b, j, hk), D);
            s[j] = sj;
            if (sj > mx) mx = sj;
        }
        float sum = 0.0f;
        for (int64_t j = lo; j <= hi; j++) {
            float p = expf(s[j] - mx);
            sum += p;
            const float *vj = rowp(&a.v, b, j, hk);
#pragma omp simd
            for (int64_t d = 0; d < D; d++) oi[d] += p * vj[d];
        }
        float inv = 1.0f / sum;
        for (int64_t d = 0; d < D; d++) oi[d] *= inv;
        if (a.lse) a.lse[(b * Hq + h) * Tq + i] = mx + logf(sum);
    }
    return CAI_OK;
}

cai_status cai_cpu_attention_bwd(cai_device_t *dev, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv,
                                 const cai_tensor *dout, const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
                                 const cai_tensor *out, const cai_tensor *lse, const cai_attn_params *params,
                                 void *workspace, size_t workspace_bytes) {
    static const char *op = "attention_bwd";
    attn_args a;
    CAI_CALL(attn_check(op, &a, (cai_tensor *)out, "out", lse, q, k, v, params, dev, workspace, workspace_bytes));
    CAI_CHECK_ARG(a.lse, "%s: lse from the forward pass is required", op);
    cai_bthd gdo, gdq = {0}, gdk = {0}, gdv = {0};
    CAI_CALL(cai_ops_bthd(op, "dout", dout, CAI_HOST, CAI_F32, &gdo));
    if (!cai_tensor_same_shape(dout, q))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dout is %s but q is %s", op, CAI_OPS_DESCRIBE(dout),
                         CAI_OPS_DESCRIBE(q));
    if (dq) {
        CAI_CALL(cai_ops_bthd(op, "dq", dq, CAI_HOST, CAI_F32, &gdq));
        if (!cai_tensor_same_shape(dq, q))
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dq is %s but q is %s", op, CAI_OPS_DESCRIBE(dq),
                             CAI_OPS_DESCRIBE(q));
    }
    if (dk) {
        CAI_CALL(cai_ops_bthd(op, "dk", dk, CAI_HOST, CAI_F32, &gdk));
        if (!cai_tensor_same_shape(dk, k))
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dk is %s but k is %s", op, CAI_OPS_DESCRIBE(dk),
                             CAI_OPS_DESCRIBE(k));
    }
    if (dv) {
        CAI_CALL(cai_ops_bthd(op, "dv", dv, CAI_HOST, CAI_F32, &gdv));
        if (!cai_tensor_same_shape(dv, v))
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dv is %s but v is %s", op, CAI_OPS_DESCRIBE(dv),
                             CAI_OPS_DESCRIBE(v));
    }
    const int64_t B = a.q.B, Hq = a.q.H, Hkv = a.k.H, Tq = a.q.T, Tk = a.k.T, D = a.q.D;
    const int64_t stride_ws = row_floats(Tk);
    const float scale = a.scale;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, B * Hkv)) schedule(dynamic, 1)
    for (int64_t bk = 0; bk < B * Hkv; bk++) {
        int64_t b = bk / Hkv, hk = bk % Hkv;
        float *p = a.ws + (int64_t)CAI_THREAD_ID() * stride_ws;
        for (int64_t j = 0; j < Tk; j++) {
            if (dk) {
                float *r = (float *)rowp(&gdk, b, j, hk);
                for (int64_t d = 0; d < D; d++) r[d] = 0.0f;
            }
            if (dv) {
                float *r = (float *)rowp(&gdv, b, j, hk);
                for (int64_t d = 0; d < D; d++) r[d] = 0.0f;
            }
        }
        for (int64_t h = hk * a.group; h < (hk + 1) * a.group; h++) {
            for (int64_t i = 0; i < Tq; i++) {
                const float *qi = rowp(&a.q, b, i, h), *oi = rowp(&a.o, b, i, h), *doi = rowp(&gdo, b, i, h);
                float *dqi = dq ? (float *)rowp(&gdq, b, i, h) : NULL;
                if (dqi)
                    for (int64_t d = 0; d < D; d++) dqi[d] = 0.0f;
                int64_t lo, hi;
                key_range(&a, i, &lo, &hi);
                if (hi < lo) continue;
                float L = a.lse[(b * Hq + h) * Tq + i];
                float Di = dot(doi, oi, D);
                for (int64_t j = lo; j <= hi; j++) p[j] = expf(scale * dot(qi, rowp(&a.k, b, j, hk), D) - L);
                for (int64_t j = lo; j <= hi; j++) {
                    const float *vj = rowp(&a.v, b, j, hk), *kj = rowp(&a.k, b, j, hk);
                    float pj = p[j];
                    float ds = pj * (dot(doi, vj, D) - Di) * scale;
                    if (dqi) {
#pragma omp simd
                        for (int64_t d = 0; d < D; d++) dqi[d] += ds * kj[d];
                    }
                    if (dk) {
                        float *dkj = (float *)rowp(&gdk, b, j, hk);
#pragma omp simd
                        for (int64_t d = 0; d < D; d++) dkj[d] += ds * qi[d];
                    }
                    if (dv) {
                        float *dvj = (float *)rowp(&gdv, b, j, hk);
#pragma omp simd
                        for (int64_t d = 0; d < D; d++) dvj[d] += pj * doi[d];
                    }
                }
            }
        }
    }
    return CAI_OK;
}
