/* CPU backend: the AdamW update, elementwise over any contiguous shard. */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>

cai_status cai_cpu_adamw(cai_device_t *dev, cai_tensor *param, const cai_tensor *grad, cai_tensor *m, cai_tensor *v,
                         cai_tensor *param_lowp, const cai_adamw_params *p, int apply_decay) {
    static const char *op = "adamw";
    char *pp, *pg, *pm, *pv, *pl = NULL;
    CAI_CHECK_ARG(p, "%s: NULL hyper-parameters", op);
    CAI_CHECK_ARG(p->step >= 1, "%s: step %" PRId64 " must start at 1 (bias correction divides by 1 - beta^step)", op,
                  p->step);
    CAI_CHECK_ARG(p->beta1 >= 0 && p->beta1 < 1 && p->beta2 >= 0 && p->beta2 < 1,
                  "%s: betas (%g, %g) must lie in [0, 1)", op, p->beta1, p->beta2);
    CAI_CALL(cai_ops_vec(op, "param", param, CAI_HOST, CAI_F32, -1, &pp));
    int64_t n = cai_tensor_numel(param);
    CAI_CALL(cai_ops_vec(op, "grad", grad, CAI_HOST, CAI_F32, n, &pg));
    CAI_CALL(cai_ops_vec(op, "m", m, CAI_HOST, CAI_F32, n, &pm));
    CAI_CALL(cai_ops_vec(op, "v", v, CAI_HOST, CAI_F32, n, &pv));
    cai_dtype ldt = CAI_DTYPE_F32;
    if (param_lowp) {
        CAI_CALL(cai_ops_vec(op, "param_lowp", param_lowp, CAI_HOST, CAI_ANYF, n, &pl));
        ldt = param_lowp->dtype;
    }
    float *w = (float *)pp, *mm = (float *)pm, *vv = (float *)pv;
    const float *g = (const float *)pg;
    /* Bias corrections in double: beta^step underflows gracefully, and the
     * same numbers come out on every rank and shard. */
    const double bc1 = 1.0 - pow((double)p->beta1, (double)p->step);
    const double bc2 = 1.0 - pow((double)p->beta2, (double)p->step);
    const float step_size = (float)(p->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float decay = apply_decay ? 1.0f - p->lr * p->weight_decay : 1.0f;
    const float b1 = p->beta1, b2 = p->beta2, eps = p->eps, gs = p->grad_scale;
#pragma omp parallel for simd num_threads(cai_cpu_threads(dev, n / 4096 + 1)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        float mi = b1 * mm[i] + (1.0f - b1) * gi;
        float vi = b2 * vv[i] + (1.0f - b2) * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        w[i] = w[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
    if (pl) CAI_CALL(cai_convert_host(pl, ldt, w, CAI_DTYPE_F32, (size_t)n));
    return CAI_OK;
}
