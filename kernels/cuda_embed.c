/* CUDA backend: embeddings and the fused softmax + cross-entropy
 * (validation here, kernels in embed.cu). Token ids and targets live on the
 * device, so their values are checked by the kernels: a bad one is written
 * as zeros and reported by the next cai_device_sync or device-to-host copy
 * (docs/cuda.md), where the CPU backend fails the call itself. */
#include "cai_config.h"
#include "cuda_internal.h"

#include <string.h>

#define STREAM(dev) (cai_cuda_of(dev)->stream)

cai_status cai_cuda_embedding_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *tokens, const cai_tensor *wte,
                                  const cai_tensor *wpe, int64_t vocab_offset, int64_t vocab_total,
                                  int64_t pos_offset) {
    static const char *op = "embedding_fwd";
    int64_t B, T;
    const int32_t *tok;
    cai_rows e, p, y;
    memset(&p, 0, sizeof p);
    CAI_CALL(cai_ops_tokens(op, "tokens", tokens, CAI_CUDA, &B, &T, &tok));
    CAI_CALL(cai_ops_rows(op, "wte", wte, CAI_CUDA, CAI_ANYF, -1, &e));
    CAI_CALL(cai_ops_rows(op, "out", out, CAI_CUDA, CAI_ANYF, e.cols, &y));
    if (y.rows != B * T)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: out is %s, expected %" PRId64 " rows (tokens %s)", op,
                         CAI_OPS_DESCRIBE(out), B * T, CAI_OPS_DESCRIBE(tokens));
    if (wpe) {
        CAI_CALL(cai_ops_rows(op, "wpe", wpe, CAI_CUDA, CAI_ANYF, e.cols, &p));
        if (pos_offset < 0 || pos_offset + T > p.rows)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: positions [%" PRId64 ", %" PRId64 ") exceed wpe's %" PRId64
                             " rows (the model's maximum sequence length)",
                             op, pos_offset, pos_offset + T, p.rows);
    }
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_embedding_fwd(STREAM(dev), cai_cuda_mat(&y), tok, T > 0 ? T : 1, cai_cuda_mat(&e),
                                     cai_cuda_mat(&p), vocab_offset, vocab_total, pos_offset, cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_embedding_bwd(cai_device_t *dev, cai_tensor *dwte, cai_tensor *dwpe, const cai_tensor *dout,
                                  const cai_tensor *tokens, int64_t vocab_offset, int64_t pos_offset) {
    static const char *op = "embedding_bwd";
    int64_t B, T;
    const int32_t *tok;
    cai_rows dy, de, dp;
    memset(&de, 0, sizeof de);
    memset(&dp, 0, sizeof dp);
    CAI_CALL(cai_ops_tokens(op, "tokens", tokens, CAI_CUDA, &B, &T, &tok));
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_CUDA, CAI_ANYF, -1, &dy));
    if (dy.rows != B * T)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dout is %s, expected %" PRId64 " rows (tokens %s)", op,
                         CAI_OPS_DESCRIBE(dout), B * T, CAI_OPS_DESCRIBE(tokens));
    if (dwte) CAI_CALL(cai_ops_rows(op, "dwte", dwte, CAI_CUDA, CAI_F32, dy.cols, &de));
    if (dwpe) {
        CAI_CALL(cai_ops_rows(op, "dwpe", dwpe, CAI_CUDA, CAI_F32, dy.cols, &dp));
        if (pos_offset < 0 || pos_offset + T > dp.rows)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: positions [%" PRId64 ", %" PRId64 ") exceed dwpe's %" PRId64 " rows", op, pos_offset,
                             pos_offset + T, dp.rows);
    }
    cai_cuda_impl *c = cai_cuda_of(dev);
    if (dwte) {
        size_t need = cuk_embedding_bwd_scratch(dy.rows, de.rows, dy.cols);
        if (need > c->scratch_bytes)
            return CAI_ERROR(CAI_ERR_NOMEM,
                             "%s: sorting %" PRId64
                             " tokens needs %zu bytes of device scratch, this "
                             "device has %zu (raise CAI_CUDA_SCRATCH_MB)",
                             op, dy.rows, need, c->scratch_bytes);
        CAI_CHECK_ARG(dy.rows < INT32_MAX && de.rows < INT32_MAX,
                      "%s: %" PRId64 " tokens or %" PRId64 " vocabulary rows exceed the sort's 32-bit indices", op,
                      dy.rows, de.rows);
    }
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_embedding_bwd(c->stream, cai_cuda_mat(&de), cai_cuda_mat(&dp), cai_cuda_mat(&dy), tok,
                                     T > 0 ? T : 1, vocab_offset, pos_offset, c->scratch, c->scratch_bytes));
    return CAI_OK;
}

/* ---------------------------------------------------------------- cross-entropy */

typedef struct {
    cai_rows x;
    const int32_t *tgt;
    int64_t off, ncols;
} xent_args;

static cai_status xent_check(const char *op, xent_args *a, const cai_tensor *logits, const cai_tensor *targets,
                             int64_t vocab_offset, int64_t valid_vocab) {
    char *p;
    CAI_CALL(cai_ops_rows(op, "logits", logits, CAI_CUDA, CAI_ANYF, -1, &a->x));
    CAI_CALL(cai_ops_vec(op, "targets", targets, CAI_CUDA, CAI_I32, a->x.rows, &p));
    CAI_CHECK_ARG(vocab_offset >= 0, "%s: vocab_offset %" PRId64 " is negative", op, vocab_offset);
    a->tgt = (const int32_t *)p;
    a->off = vocab_offset;
    int64_t nc = valid_vocab - vocab_offset;
    a->ncols = nc < 0 ? 0 : (nc > a->x.cols ? a->x.cols : nc);
    return CAI_OK;
}

static cai_status out_vec(const char *op, const char *arg, cai_tensor *t, int64_t n, float **out) {
    char *p = NULL;
    if (t) CAI_CALL(cai_ops_vec(op, arg, t, CAI_CUDA, CAI_F32, n, &p));
    *out = (float *)p;
    return CAI_OK;
}

cai_status cai_cuda_xent_fwd(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, const cai_tensor *logits,
                             const cai_tensor *targets, int64_t vocab_offset, int64_t valid_vocab, int ignore_index) {
    static const char *op = "xent_fwd";
    xent_args a;
    float *pl, *plse;
    CAI_CALL(xent_check(op, &a, logits, targets, vocab_offset, valid_vocab));
    CAI_CALL(out_vec(op, "losses", losses, a.x.rows, &pl));
    CAI_CALL(out_vec(op, "lse", lse, a.x.rows, &plse));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_xent_fwd(STREAM(dev), pl, plse, NULL, NULL, NULL, cai_cuda_mat(&a.x), a.tgt, a.off, a.ncols,
                                ignore_index, 1, cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_xent_stats(cai_device_t *dev, cai_tensor *maxv, cai_tensor *sumexp, cai_tensor *target_logit,
                               const cai_tensor *logits, const cai_tensor *targets, int64_t vocab_offset,
                               int64_t valid_vocab, int ignore_index) {
    static const char *op = "xent_stats";
    xent_args a;
    float *pm, *ps, *pt;
    CAI_CALL(xent_check(op, &a, logits, targets, vocab_offset, valid_vocab));
    CAI_CALL(out_vec(op, "maxv", maxv, a.x.rows, &pm));
    CAI_CALL(out_vec(op, "sumexp", sumexp, a.x.rows, &ps));
    CAI_CALL(out_vec(op, "target_logit", target_logit, a.x.rows, &pt));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_xent_fwd(STREAM(dev), NULL, NULL, pm, ps, pt, cai_cuda_mat(&a.x), a.tgt, a.off, a.ncols,
                                ignore_index, 0, NULL));
    return CAI_OK;
}

cai_status cai_cuda_xent_bwd(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits, const cai_tensor *lse,
                             const cai_tensor *targets, const cai_tensor *dlosses, float dloss_scale,
                             int64_t vocab_offset, int64_t valid_vocab, int ignore_index) {
    static const char *op = "xent_bwd";
    xent_args a;
    cai_rows dx;
    char *pl, *pd = NULL;
    CAI_CALL(xent_check(op, &a, logits, targets, vocab_offset, valid_vocab));
    CAI_CALL(cai_ops_rows(op, "dlogits", dlogits, CAI_CUDA, CAI_ANYF, a.x.cols, &dx));
    CAI_CALL(cai_ops_same_rows(op, "dlogits", &dx, "logits", &a.x));
    CAI_CALL(cai_ops_vec(op, "lse", lse, CAI_CUDA, CAI_F32, a.x.rows, &pl));
    if (dlosses) CAI_CALL(cai_ops_vec(op, "dlosses", dlosses, CAI_CUDA, CAI_F32, a.x.rows, &pd));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_xent_bwd(STREAM(dev), cai_cuda_mat(&dx), cai_cuda_mat(&a.x), (const float *)pl, a.tgt,
                                (const float *)pd, dloss_scale, a.off, a.ncols, ignore_index));
    return CAI_OK;
}

cai_status cai_cuda_xent_fwd_bwd(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, cai_tensor *dlogits,
                                 const cai_tensor *logits, const cai_tensor *targets, float dloss_scale,
                                 int64_t vocab_offset, int64_t valid_vocab, int ignore_index) {
    static const char *op = "xent_fwd_bwd";
    xent_args a;
    cai_rows dx;
    float *pl, *plse;
    CAI_CHECK_ARG(lse, "%s: lse is NULL (the op writes it)", op);
    CAI_CALL(xent_check(op, &a, logits, targets, vocab_offset, valid_vocab));
    CAI_CALL(out_vec(op, "losses", losses, a.x.rows, &pl));
    CAI_CALL(out_vec(op, "lse", lse, a.x.rows, &plse));
    CAI_CALL(cai_ops_rows(op, "dlogits", dlogits, CAI_CUDA, CAI_ANYF, a.x.cols, &dx));
    CAI_CALL(cai_ops_same_rows(op, "dlogits", &dx, "logits", &a.x));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_xent_fwd_bwd(STREAM(dev), pl, plse, cai_cuda_mat(&dx), cai_cuda_mat(&a.x), a.tgt, dloss_scale,
                                    a.off, a.ncols, ignore_index, cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_argmax_rows(cai_device_t *dev, cai_tensor *idx, cai_tensor *maxv, const cai_tensor *logits,
                                int64_t vocab_offset, int64_t valid_vocab) {
    static const char op[] = "argmax_rows";
    cai_argmax_args a;
    CAI_CALL(cai_ops_argmax_rows_args(op, CAI_CUDA, CAI_ANYF, idx, maxv, logits, vocab_offset, valid_vocab, &a));
    CAI_CALL(cai_cuda_enter(dev, op));
    cai_cuda_impl *c = cai_cuda_of(dev);
    CUK_LAUNCH(op, cuk_argmax_rows(STREAM(dev), a.idx, a.maxv, cai_cuda_mat(&a.x), a.off, a.ncols, c->scratch,
                                   c->scratch_bytes));
    return CAI_OK;
}
