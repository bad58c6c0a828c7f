/* CPU backend: token/position embeddings and the fused softmax +
 * cross-entropy, both written for a vocabulary that may be sharded over
 * tensor-parallel ranks (vocab_offset = first global id held here). */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

cai_status cai_cpu_embedding_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *tokens, const cai_tensor *wte,
                                 const cai_tensor *wpe, int64_t vocab_offset, int64_t vocab_total, int64_t pos_offset) {
    static const char *op = "embedding_fwd";
    int64_t B, T;
    const int32_t *tok;
    cai_rows e, p = {0}, y;
    CAI_CALL(cai_ops_tokens(op, "tokens", tokens, CAI_HOST, &B, &T, &tok));
    CAI_CALL(cai_ops_rows(op, "wte", wte, CAI_HOST, CAI_F32, -1, &e));
    CAI_CALL(cai_ops_rows(op, "out", out, CAI_HOST, CAI_F32, e.cols, &y));
    if (y.rows != B * T)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: out is %s, expected %" PRId64 " rows (tokens %s)", op,
                         CAI_OPS_DESCRIBE(out), B * T, CAI_OPS_DESCRIBE(tokens));
    if (wpe) {
        CAI_CALL(cai_ops_rows(op, "wpe", wpe, CAI_HOST, CAI_F32, e.cols, &p));
        if (pos_offset < 0 || pos_offset + T > p.rows)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: positions [%" PRId64 ", %" PRId64 ") exceed wpe's %" PRId64
                             " rows (the model's maximum sequence length)",
                             op, pos_offset, pos_offset + T, p.rows);
    }
    for (int64_t n = 0; n < B * T; n++)
        if (tok[n] < 0 || (vocab_total > 0 && tok[n] >= vocab_total))
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: token id %d at batch %" PRId64 ", position %" PRId64
                             " is outside the vocabulary [0, %" PRId64 ")",
                             op, (int)tok[n], n / T, n % T, vocab_total);
    const int64_t C = e.cols;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, B *T)) schedule(static)
    for (int64_t n = 0; n < B * T; n++) {
        float *yr = cai_row_f32(&y, n);
        int64_t id = (int64_t)tok[n] - vocab_offset;
        if (id >= 0 && id < e.rows) memcpy(yr, cai_row_f32(&e, id), (size_t)C * sizeof(float));
        else memset(yr, 0, (size_t)C * sizeof(float));
        if (wpe) {
            const float *pr = cai_row_f32(&p, pos_offset + n % T);
#pragma omp simd
            for (int64_t c = 0; c < C; c++) yr[c] += pr[c];
        }
    }
    return CAI_OK;
}

cai_status cai_cpu_embedding_bwd(cai_device_t *dev, cai_tensor *dwte, cai_tensor *dwpe, const cai_tensor *dout,
                                 const cai_tensor *tokens, int64_t vocab_offset, int64_t pos_offset) {
    static const char *op = "embedding_bwd";
    int64_t B, T;
    const int32_t *tok;
    cai_rows dy, de = {0}, dp = {0};
    CAI_CALL(cai_ops_tokens(op, "tokens", tokens, CAI_HOST, &B, &T, &tok));
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_HOST, CAI_F32, -1, &dy));
    if (dy.rows != B * T)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dout is %s, expected %" PRId64 " rows (tokens %s)", op,
                         CAI_OPS_DESCRIBE(dout), B * T, CAI_OPS_DESCRIBE(tokens));
    if (dwte) CAI_CALL(cai_ops_rows(op, "dwte", dwte, CAI_HOST, CAI_F32, dy.cols, &de));
    if (dwpe) {
        CAI_CALL(cai_ops_rows(op, "dwpe", dwpe, CAI_HOST, CAI_F32, dy.cols, &dp));
        if (pos_offset < 0 || pos_offset + T > dp.rows)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: positions [%" PRId64 ", %" PRId64 ") exceed dwpe's %" PRId64 " rows", op, pos_offset,
                             pos_offset + T, dp.rows);
    }
    const int64_t C = dy.cols, BLK = cai_cpu_colblk(dev, C), nblk = (C + BLK - 1) / BLK;
    /* Column blocks: every thread walks all tokens in order for its columns,
     * so repeated tokens accumulate without atomics, deterministically. */
#pragma omp parallel for num_threads(cai_cpu_threads(dev, nblk)) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * BLK, w = C - c0 < BLK ? C - c0 : BLK;
        for (int64_t n = 0; n < B * T; n++) {
            const float *g = cai_row_f32(&dy, n) + c0;
            if (dwte) {
                int64_t id = (int64_t)tok[n] - vocab_offset;
                if (id >= 0 && id < de.rows) {
                    float *r = cai_row_f32(&de, id) + c0;
#pragma omp simd
                    for (int64_t c = 0; c < w; c++) r[c] += g[c];
                }
            }
            if (dwpe) {
                float *r = cai_row_f32(&dp, pos_offset + n % T) + c0;
#pragma omp simd
                for (int64_t c = 0; c < w; c++) r[c] += g[c];
            }
        }
    }
    return CAI_OK;
}

/* ---------------------------------------------------------------- cross-entropy */

typedef struct {
    cai_rows x; /* logits */
    const int32_t *tgt;
    int64_t off, ncols; /* columns [0, ncols) are real vocabulary */
} xent_args;

static cai_status xent_check(const char *op, xent_args *a, const cai_tensor *logits, const cai_tensor *targets,
                             int64_t vocab_offset, int64_t valid_vocab) {
    char *p;
    CAI_CALL(cai_ops_rows(op, "logits", logits, CAI_HOST, CAI_F32, -1, &a->x));
    CAI_CALL(cai_ops_vec(op, "targets", targets, CAI_HOST, CAI_I32, a->x.rows, &p));
    CAI_CHECK_ARG(vocab_offset >= 0, "%s: vocab_offset %" PRId64 " is negative", op, vocab_offset);
    a->tgt = (const int32_t *)p;
    a->off = vocab_offset;
    int64_t nc = valid_vocab - vocab_offset;
    a->ncols = nc < 0 ? 0 : (nc > a->x.cols ? a->x.cols : nc);
    return CAI_OK;
}

static cai_status out_vec(const char *op, const char *arg, cai_tensor *t, int64_t n, float **out) {
    char *p = NULL;
    if (t) CAI_CALL(cai_ops_vec(op, arg, t, CAI_HOST, CAI_F32, n, &p));
    *out = (float *)p;
    return CAI_OK;
}

/* max and sum(exp(x - max)) over the valid columns of one row. */
static inline void row_stats(const float *x, int64_t n, float *mx, float *se) {
    float m = cai_k_max(x, n);
    *mx = m;
    *se = n > 0 ? cai_k_expsum(x, m, n) : 0.0f;
}

cai_status cai_cpu_xent_fwd(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, const cai_tensor *logits,
                            const cai_tensor *targets, int64_t vocab_offset, int64_t valid_vocab, int ignore_index) {
    static const char *op = "xent_fwd";
    xent_args a;
    float *pl, *plse;
    CAI_CALL(xent_check(op, &a, logits, targets, vocab_offset, valid_vocab));
    CAI_CALL(out_vec(op, "losses", losses, a.x.rows, &pl));
    CAI_CALL(out_vec(op, "lse", lse, a.x.rows, &plse));
    for (int64_t n = 0; n < a.x.rows; n++) {
        int64_t t = a.tgt[n];
        if (t == ignore_index) continue;
        if (t < a.off || t - a.off >= a.ncols)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: target %" PRId64 " of row %" PRId64
                             " is outside the valid "
                             "vocabulary [%" PRId64 ", %" PRId64 ") of these logits (ignore_index is %d)",
                             op, t, n, a.off, a.off + a.ncols, ignore_index);
    }
#pragma omp parallel for num_threads(cai_cpu_threads(dev, a.x.rows)) schedule(static)
    for (int64_t n = 0; n < a.x.rows; n++) {
        const float *x = cai_row_f32(&a.x, n);
        float mx, se;
        row_stats(x, a.ncols, &mx, &se);
        float l = mx + logf(se);
        if (plse) plse[n] = l;
        if (pl) pl[n] = a.tgt[n] == ignore_index ? 0.0f : l - x[a.tgt[n] - a.off];
    }
    return CAI_OK;
}

cai_status cai_cpu_xent_stats(cai_device_t *dev, cai_tensor *maxv, cai_tensor *sumexp, cai_tensor *target_logit,
                              const cai_tensor *logits, const cai_tensor *targets, int64_t vocab_offset,
                              int64_t valid_vocab, int ignore_index) {
    static const char *op = "xent_stats";
    xent_args a;
    float *pm, *ps, *pt;
    CAI_CALL(xent_check(op, &a, logits, targets, vocab_offset, valid_vocab));
    CAI_CALL(out_vec(op, "maxv", maxv, a.x.rows, &pm));
    CAI_CALL(out_vec(op, "sumexp", sumexp, a.x.rows, &ps));
    CAI_CALL(out_vec(op, "target_logit", target_logit, a.x.rows, &pt));
#pragma omp parallel for num_threads(cai_cpu_threads(dev, a.x.rows)) schedule(static)
    for (int64_t n = 0; n < a.x.rows; n++) {
        const float *x = cai_row_f32(&a.x, n);
        float mx, se;
        row_stats(x, a.ncols, &mx, &se);
        if (pm) pm[n] = mx;
        if (ps) ps[n] = se;
        if (pt) {
            int64_t t = (int64_t)a.tgt[n] - a.off;
            pt[n] = (a.tgt[n] != ignore_index && t >= 0 && t < a.ncols) ? x[t] : 0.0f;
        }
    }
    return CAI_OK;
}

cai_status cai_cpu_xent_bwd(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits, const cai_tensor *lse,
                            const cai_tensor *targets, const cai_tensor *dlosses, float dloss_scale,
                            int64_t vocab_offset, int64_t valid_vocab, int ignore_index) {
    static const char *op = "xent_bwd";
    xent_args a;
    cai_rows dx;
    char *pl, *pd = NULL;
    CAI_CALL(xent_check(op, &a, logits, targets, vocab_offset, valid_vocab));
    CAI_CALL(cai_ops_rows(op, "dlogits", dlogits, CAI_HOST, CAI_F32, a.x.cols, &dx));
    CAI_CALL(cai_ops_same_rows(op, "dlogits", &dx, "logits", &a.x));
    CAI_CALL(cai_ops_vec(op, "lse", lse, CAI_HOST, CAI_F32, a.x.rows, &pl));
    if (dlosses) CAI_CALL(cai_ops_vec(op, "dlosses", dlosses, CAI_HOST, CAI_F32, a.x.rows, &pd));
    const float *L = (const float *)pl, *dl = (const float *)pd;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, a.x.rows)) schedule(static)
    for (int64_t n = 0; n < a.x.rows; n++) {
        const float *x = cai_row_f32(&a.x, n);
        float *g = cai_row_f32(&dx, n);
        if (a.tgt[n] == ignore_index) {
            memset(g, 0, (size_t)dx.cols * sizeof(float));
            continue;
        }
        float sc = dl ? dl[n] : dloss_scale, ln = L[n];
        int64_t t = (int64_t)a.tgt[n] - a.off;
        cai_k_exp_store(g, x, ln, sc, a.ncols);
        for (int64_t j = a.ncols; j < dx.cols; j++) g[j] = 0.0f;
        if (t >= 0 && t < a.ncols) g[t] -= sc;
    }
    return CAI_OK;
}

/* The two ops one after the other: a CPU's caches hold no row of a real
 * vocabulary anyway, and the results are the two ops' by construction. */
cai_status cai_cpu_xent_fwd_bwd(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, cai_tensor *dlogits,
                                const cai_tensor *logits, const cai_tensor *targets, float dloss_scale,
                                int64_t vocab_offset, int64_t valid_vocab, int ignore_index) {
    CAI_CHECK_ARG(lse, "xent_fwd_bwd: lse is NULL (the op writes it)");
    CAI_CALL(cai_cpu_xent_fwd(dev, losses, lse, logits, targets, vocab_offset, valid_vocab, ignore_index));
    return cai_cpu_xent_bwd(dev, dlogits, logits, lse, targets, NULL, dloss_scale, vocab_offset, valid_vocab,
                            ignore_index);
}

/* The scan order decides nothing: the rule (NaN first, then the larger
 * value, then the lower id) is a total order, as on the device. */
cai_status cai_cpu_argmax_rows(cai_device_t *dev, cai_tensor *idx, cai_tensor *maxv, const cai_tensor *logits,
                               int64_t vocab_offset, int64_t valid_vocab) {
    cai_argmax_args a;
    CAI_CALL(
        cai_ops_argmax_rows_args("argmax_rows", CAI_HOST, CAI_F32, idx, maxv, logits, vocab_offset, valid_vocab, &a));
#pragma omp parallel for num_threads(cai_cpu_threads(dev, a.x.rows)) schedule(static)
    for (int64_t n = 0; n < a.x.rows; n++) {
        const float *x = cai_row_f32(&a.x, n);
        int64_t best = -1;
        float m = -INFINITY;
        for (int64_t j = 0; j < a.ncols; j++) {
            const float v = x[j];
            if (isnan(v)) {
                best = j;
                m = v;
                break;
            }
            if (best < 0 || v > m) {
                best = j;
                m = v;
            }
        }
        a.idx[n] = best < 0 ? -1 : (int32_t)(a.off + best);
        a.maxv[n] = m;
    }
    return CAI_OK;
}
