/* CPU backend: causal self-attention with multi-head and grouped-query
 * heads, flash-attention style: the forward keeps only the log-sum-exp of
 * each score row and the backward recomputes probabilities from it, so
 * nothing T x T outlives a call. Work is done in blocks of QB query rows:
 * scores S = Q_blk K^T over the keys the block can see, then P V, all as
 * sgemm calls inside OpenMP tasks (OpenBLAS itself is single-threaded, see
 * cpu_matmul.c); the workspace holds two QB x Tk blocks per thread.
 *
 * Forward tasks are (batch, head, query block); backward tasks are (batch,
 * kv head), so one thread owns the dk/dv rows it accumulates and results
 * do not depend on the thread count. */
#include "cai_config.h"
#include "cpu_internal.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { QB = 64 }; /* query rows per block */

static int64_t row_floats(int64_t Tk) { return (Tk + 15) / 16 * 16; } /* 64-byte rows */

size_t cai_cpu_attention_workspace_bytes(const cai_device_t *dev, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                                         int64_t Hkv, int64_t D) {
    int nt = dev && dev->num_threads > 0 ? dev->num_threads : 1;
    int64_t rows = Tq < QB ? Tq : QB;
    return (size_t)nt * 2 * (size_t)rows * (size_t)row_floats(Tk) * sizeof(float) + 64;
}

typedef struct {
    cai_bthd q, k, v, o;
    float *lse; /* [B,Hq,Tq] */
    float scale;
    int causal;
    int64_t off, window, group;
    const int32_t *docs; /* [B,Tq] document ids, or NULL */
    float *ws;           /* per thread: two blocks of min(Tq, QB) x row_floats(Tk) */
} attn_args;

/* Document ids are only meaningful for self-attention with the causal mask
 * aligned top-left; each row's ids must form contiguous runs so a query's
 * visible keys stay one range (key_range). */
static cai_status doc_check(const char *op, attn_args *a, const cai_tensor *doc_ids) {
    CAI_CHECK_ARG(a->causal && a->off == 0 && a->q.T == a->k.T,
                  "%s: doc_ids need causal self-attention (causal 1, causal_offset 0, Tq == Tk); got causal %d, "
                  "causal_offset %" PRId64 ", Tq %" PRId64 ", Tk %" PRId64,
                  op, a->causal, a->off, a->q.T, a->k.T);
    char *p;
    if (doc_ids->ndim != 2 || doc_ids->shape[0] != a->q.B || doc_ids->shape[1] != a->q.T)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: doc_ids is %s but must be [%" PRId64 ",%" PRId64 "] (B, T of q)", op,
                         CAI_OPS_DESCRIBE(doc_ids), a->q.B, a->q.T);
    CAI_CALL(cai_ops_vec(op, "doc_ids", doc_ids, CAI_HOST, CAI_I32, a->q.B * a->q.T, &p));
    a->docs = (const int32_t *)p;
    for (int64_t b = 0; b < a->q.B; b++)
        for (int64_t t = 1; t < a->q.T; t++) {
            int32_t prev = a->docs[b * a->q.T + t - 1], cur = a->docs[b * a->q.T + t];
            if (cur < prev)
                return CAI_ERROR(CAI_ERR_INVALID_ARG,
                                 "%s: doc_ids[%" PRId64 ",%" PRId64
                                 "] = %d after %d: ids must not decrease along a "
                                 "row (each document one contiguous run)",
                                 op, b, t, (int)cur, (int)prev);
        }
    return CAI_OK;
}

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
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: %" PRId64 " query heads do not divide into groups over %" PRId64 " kv heads", op, a->q.H,
                         a->k.H);
    if (a->q.D < 1 || a->q.B < 1 || a->q.T < 1 || a->k.T < 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: empty attention (q %s, k %s)", op, CAI_OPS_DESCRIBE(q),
                         CAI_OPS_DESCRIBE(k));
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
    if (params->doc_ids) CAI_CALL(doc_check(op, a, params->doc_ids));
    size_t need = cai_cpu_attention_workspace_bytes(dev, a->q.B, a->q.T, a->k.T, a->q.H, a->k.H, a->q.D);
    if (workspace_bytes < need || !workspace)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: workspace of %zu bytes is too small, %zu needed (ask "
                         "attention_workspace_bytes for these sizes and this device)",
                         op, workspace_bytes, need);
    uintptr_t w = ((uintptr_t)workspace + 63) & ~(uintptr_t)63;
    a->ws = (float *)w;
    return CAI_OK;
}

/* Visible key range [lo, hi] for query row i of batch b; empty when hi < lo. */
static inline void key_range(const attn_args *a, int64_t b, int64_t i, int64_t *lo, int64_t *hi) {
    int64_t last = a->k.T - 1, first = 0;
    if (a->causal) {
        int64_t lim = i + a->off;
        if (lim < last) last = lim;
        if (a->window > 0 && lim - a->window + 1 > first) first = lim - a->window + 1;
    }
    if (a->docs) {
        /* the scan back is O(document length), small next to the row's scores */
        const int32_t *row = a->docs + b * a->q.T;
        int64_t s = i;
        while (s > first && row[s - 1] == row[i]) s--;
        if (s > first) first = s;
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

static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

/* Probabilities of query rows [i0, i0+m) of head (b, h) over keys [klo, klo+nk):
 * S = scale Q K^T by sgemm into p (row stride ld), then per row either
 * (lse == NULL) a fresh softmax whose log-sum-exp goes to lse_out, or
 * exp(S - lse[r]) from the forward's statistics. Masked entries are 0. */
static void block_probs(const attn_args *a, int64_t b, int64_t h, int64_t i0, int64_t m, int64_t klo, int64_t nk,
                        float *p, int64_t ld, const float *lse, float *lse_out) {
    int64_t hk = h / a->group;
    gemm(0, 1, m, nk, a->q.D, a->scale, rowp(&a->q, b, i0, h), a->q.st, rowp(&a->k, b, klo, hk), a->k.st, 0.0f, p, ld);
    for (int64_t r = 0; r < m; r++) {
        float *pr = p + r * ld;
        int64_t lo, hi;
        key_range(a, b, i0 + r, &lo, &hi);
        lo -= klo;
        hi -= klo;
        if (hi < lo) {
            memset(pr, 0, (size_t)nk * sizeof(float));
            if (lse_out) lse_out[r] = -INFINITY;
            continue;
        }
        if (lo > 0) memset(pr, 0, (size_t)lo * sizeof(float));
        if (hi + 1 < nk) memset(pr + hi + 1, 0, (size_t)(nk - hi - 1) * sizeof(float));
        if (lse) {
            cai_k_exp_store(pr + lo, pr + lo, lse[r], 1.0f, hi - lo + 1);
        } else {
            float mx = cai_k_max(pr + lo, hi - lo + 1);
            float sum = cai_k_expsum(pr + lo, mx, hi - lo + 1);
            cai_k_exp_store(pr + lo, pr + lo, mx, 1.0f / sum, hi - lo + 1);
            lse_out[r] = mx + logf(sum);
        }
    }
}

/* Keys any row of the block [i0, i0+m) can see: rows' ranges move right
 * monotonically (document starts too, ids never decreasing), so the union is [lo(i0), hi(i0+m-1)]. */
static void block_keys(const attn_args *a, int64_t b, int64_t i0, int64_t m, int64_t *klo, int64_t *nk) {
    int64_t lo0, hi0, lo1, hi1;
    key_range(a, b, i0, &lo0, &hi0);
    key_range(a, b, i0 + m - 1, &lo1, &hi1);
    if (lo0 < 0) lo0 = 0;
    if (hi1 >= a->k.T) hi1 = a->k.T - 1;
    *klo = lo0;
    *nk = hi1 >= lo0 ? hi1 - lo0 + 1 : 0;
}

static void zero_rows(const cai_bthd *t, int64_t b, int64_t s0, int64_t n, int64_t h) {
    for (int64_t s = s0; s < s0 + n; s++) memset((float *)rowp(t, b, s, h), 0, (size_t)t->D * sizeof(float));
}

cai_status cai_cpu_attention_fwd(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *q,
                                 const cai_tensor *k, const cai_tensor *v, const cai_attn_params *params,
                                 void *workspace, size_t workspace_bytes) {
    attn_args a;
    CAI_CALL(attn_check("attention_fwd", &a, out, "out", lse, q, k, v, params, dev, workspace, workspace_bytes));
    const int64_t B = a.q.B, Hq = a.q.H, Tq = a.q.T, D = a.q.D, nblk = (Tq + QB - 1) / QB;
    const int64_t ld = row_floats(a.k.T), rows = Tq < QB ? Tq : QB, per_thread = 2 * rows * ld;
    const int64_t ntask = B * Hq * nblk;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, ntask)) schedule(dynamic, 1)
    for (int64_t task = 0; task < ntask; task++) {
        int64_t blk = task % nblk, h = (task / nblk) % Hq, b = task / (nblk * Hq);
        int64_t i0 = blk * QB, m = Tq - i0 < QB ? Tq - i0 : QB, klo, nk;
        float *p = a.ws + (int64_t)CAI_THREAD_ID() * per_thread, *lrow = p + rows * ld;
        block_keys(&a, b, i0, m, &klo, &nk);
        if (nk == 0) {
            zero_rows(&a.o, b, i0, m, h);
            for (int64_t r = 0; r < m && a.lse; r++) a.lse[(b * Hq + h) * Tq + i0 + r] = -INFINITY;
            continue;
        }
        block_probs(&a, b, h, i0, m, klo, nk, p, ld, NULL, lrow);
        gemm(0, 0, m, D, nk, 1.0f, p, ld, rowp(&a.v, b, klo, h / a.group), a.v.st, 0.0f, (float *)rowp(&a.o, b, i0, h),
             a.o.st);
        if (a.lse) memcpy(a.lse + (b * Hq + h) * Tq + i0, lrow, (size_t)m * sizeof(float));
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
    const cai_tensor *grads[3] = {dq, dk, dv}, *like[3] = {q, k, v};
    cai_bthd *views[3] = {&gdq, &gdk, &gdv};
    static const char *names[3] = {"dq", "dk", "dv"};
    for (int g = 0; g < 3; g++) {
        if (!grads[g]) continue;
        CAI_CALL(cai_ops_bthd(op, names[g], grads[g], CAI_HOST, CAI_F32, views[g]));
        if (!cai_tensor_same_shape(grads[g], like[g]))
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s but must be shaped like %s", op, names[g],
                             CAI_OPS_DESCRIBE(grads[g]), CAI_OPS_DESCRIBE(like[g]));
    }
    const int64_t B = a.q.B, Hq = a.q.H, Hkv = a.k.H, Tq = a.q.T, Tk = a.k.T, D = a.q.D;
    const int64_t nblk = (Tq + QB - 1) / QB, ld = row_floats(Tk), rows = Tq < QB ? Tq : QB, per_thread = 2 * rows * ld;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, B *Hkv)) schedule(dynamic, 1)
    for (int64_t bk = 0; bk < B * Hkv; bk++) {
        int64_t b = bk / Hkv, hk = bk % Hkv;
        float *p = a.ws + (int64_t)CAI_THREAD_ID() * per_thread, *ds = p + rows * ld;
        if (dk) zero_rows(&gdk, b, 0, Tk, hk);
        if (dv) zero_rows(&gdv, b, 0, Tk, hk);
        for (int64_t h = hk * a.group; h < (hk + 1) * a.group; h++) {
            for (int64_t blk = 0; blk < nblk; blk++) {
                int64_t i0 = blk * QB, m = Tq - i0 < QB ? Tq - i0 : QB, klo, nk;
                block_keys(&a, b, i0, m, &klo, &nk);
                if (nk == 0) {
                    if (dq) zero_rows(&gdq, b, i0, m, h);
                    continue;
                }
                block_probs(&a, b, h, i0, m, klo, nk, p, ld, a.lse + (b * Hq + h) * Tq + i0, NULL);
                /* dP = dO V^T; dS = P (dP - rowsum(dO o O)) scale */
                gemm(0, 1, m, nk, D, 1.0f, rowp(&gdo, b, i0, h), gdo.st, rowp(&a.v, b, klo, hk), a.v.st, 0.0f, ds, ld);
                for (int64_t r = 0; r < m; r++) {
                    float Di = dot(rowp(&gdo, b, i0 + r, h), rowp(&a.o, b, i0 + r, h), D);
                    float *pr = p + r * ld, *dr = ds + r * ld;
#pragma omp simd
                    for (int64_t j = 0; j < nk; j++) dr[j] = pr[j] * (dr[j] - Di) * a.scale;
                }
                if (dq)
                    gemm(0, 0, m, D, nk, 1.0f, ds, ld, rowp(&a.k, b, klo, hk), a.k.st, 0.0f,
                         (float *)rowp(&gdq, b, i0, h), gdq.st);
                if (dk)
                    gemm(1, 0, nk, D, m, 1.0f, ds, ld, rowp(&a.q, b, i0, h), a.q.st, 1.0f,
                         (float *)rowp(&gdk, b, klo, hk), gdk.st);
                if (dv)
                    gemm(1, 0, nk, D, m, 1.0f, p, ld, rowp(&gdo, b, i0, h), gdo.st, 1.0f,
                         (float *)rowp(&gdv, b, klo, hk), gdv.st);
            }
        }
    }
    return CAI_OK;
}
