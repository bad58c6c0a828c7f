/* CPU backend: the online-softmax merge of two attention results computed
 * over disjoint key sets, the step that lets ring attention see the keys of
 * a sequence one block at a time (each block's rows normalised by their own
 * log-sum-exp, rescaled to the combined one). */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

cai_status cai_cpu_attention_merge(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *blk_out,
                                   const cai_tensor *blk_lse) {
    static const char *op = "attention_merge";
    cai_bthd o, bo;
    int64_t ls[2], bs[2];
    CAI_CALL(cai_ops_merge_args(op, out, lse, blk_out, blk_lse, CAI_HOST, CAI_F32, &o, &bo, ls, bs));
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
