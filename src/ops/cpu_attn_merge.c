/* CPU backend: the online-softmax merge of two attention results computed
 * over disjoint key sets, the step that lets ring attention see the keys of
 * a sequence one block at a time (each block's rows normalised by their own
 * log-sum-exp, rescaled to the combined one). */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

/* An lse view [B,H,T] F32 with a contiguous last dimension. */
static cai_status lse_view(const char *op, const char *arg, const cai_tensor *t, const cai_bthd *like, int64_t st[2]) {
    CAI_CALL(cai_ops_check(op, arg, t, CAI_HOST, CAI_F32));
    if (t->ndim != 3 || t->shape[0] != like->B || t->shape[1] != like->H || t->shape[2] != like->T ||
        (t->shape[2] > 1 && t->stride[2] != 1))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: %s is %s, expected [%" PRId64 ",%" PRId64 ",%" PRId64
                         "] (B, heads, T of out) with a contiguous last dimension",
                         op, arg, CAI_OPS_DESCRIBE(t), like->B, like->H, like->T);
    st[0] = t->stride[0];
    st[1] = t->stride[1];
    return CAI_OK;
}

cai_status cai_cpu_attention_merge(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *blk_out,
                                   const cai_tensor *blk_lse) {
    static const char *op = "attention_merge";
    cai_bthd o, bo;
    int64_t ls[2], bs[2];
    CAI_CALL(cai_ops_bthd(op, "out", out, CAI_HOST, CAI_F32, &o));
    CAI_CALL(cai_ops_bthd(op, "blk_out", blk_out, CAI_HOST, CAI_F32, &bo));
    if (!cai_tensor_same_shape(out, blk_out))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: blk_out is %s but out is %s; they must match", op,
                         CAI_OPS_DESCRIBE(blk_out), CAI_OPS_DESCRIBE(out));
    CAI_CALL(lse_view(op, "lse", lse, &o, ls));
    CAI_CALL(lse_view(op, "blk_lse", blk_lse, &o, bs));
    float *L = lse->data;
    const float *BL = blk_lse->data;
    const int64_t rows = o.B * o.H, D = o.D;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, rows *o.T *D / 4096 + 1)) schedule(static)
    for (int64_t bh = 0; bh < rows; bh++) {
        int64_t b = bh / o.H, h = bh % o.H;
        for (int64_t t = 0; t < o.T; t++) {
            float *l = L + b * ls[0] + h * ls[1] + t;
            float bl = BL[b * bs[0] + h * bs[1] + t];
            float *y = (float *)o.data + (b * o.sb + t * o.st + h * o.sh);
            const float *x = (const float *)bo.data + (b * bo.sb + t * bo.st + h * bo.sh);
            if (bl == -INFINITY) continue;
            if (*l == -INFINITY) {
                memcpy(y, x, (size_t)D * sizeof(float));
                *l = bl;
                continue;
            }
            /* Computed in double: the two weights sum to 1 exactly enough
             * that sp merges stay within f32 rounding of one softmax. */
            double m = *l > bl ? *l : bl;
            double ea = exp((double)*l - m), eb = exp((double)bl - m), s = ea + eb;
            float wa = (float)(ea / s), wb = (float)(eb / s);
            for (int64_t d = 0; d < D; d++) y[d] = wa * y[d] + wb * x[d];
            *l = (float)(m + log(s));
        }
    }
    return CAI_OK;
}
