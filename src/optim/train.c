/* The single-process training step: the composition every app's loop and
 * the parity tests share. */
#include "cai_config.h"
#include "colossal/optim.h"

#include <math.h>

cai_status cai_train_step(cai_model_t *m, cai_optim_t *o, const int32_t *tokens, const int32_t *targets, int n_micro,
                          cai_step_stats *stats) {
    CAI_CHECK_ARG(m && o && tokens && targets, "cai_train_step: NULL argument");
    CAI_CHECK_ARG(n_micro >= 1, "cai_train_step: n_micro=%d must be >= 1", n_micro);
    int first = 0, last = 0;
    cai_model_stage(m, NULL, NULL, &first, &last);
    if (!first || !last)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "cai_train_step runs a whole model on one rank; this model is one "
                         "pipeline stage (use the pipeline executor)");
    CAI_CALL(cai_model_zero_grad(m));
    int B = 0, T = 0;
    cai_model_shape(m, &B, &T);
    size_t per = (size_t)B * (size_t)T; /* tokens per microbatch */
    double loss = 0.0;
    for (int k = 0; k < n_micro; k++) {
        float l = 0.0f;
        const float gs = 1.0f / (float)n_micro;
        CAI_CALL(cai_model_forward_train(m, tokens + (size_t)k * per, targets + (size_t)k * per, gs, &l));
        CAI_CALL(cai_model_backward(m, gs));
        loss += (double)l / n_micro;
    }
    cai_tensor params, grads, lowp;
    cai_model_flat(m, &params, &grads, &lowp);
    double sumsq = 0.0;
    CAI_CALL(cai_optim_grad_sumsq(o, &grads, &sumsq));
    double norm = sqrt(sumsq);
    if (!isfinite(norm) || !isfinite(loss))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "training step %lld: loss %g, gradient norm %g is not finite; the "
                         "update was skipped (lower the learning rate, check the data, or use bf16 over f16)",
                         (long long)cai_optim_step_count(o) + 1, loss, norm);
    float coef = cai_clip_coef(norm, (double)cai_optim_config(o)->grad_clip);
    float lr = 0.0f;
    CAI_CALL(cai_optim_step(o, &params, &grads, &lowp, coef, &lr));
    CAI_CALL(cai_model_params_updated(m));
    if (stats) {
        stats->loss = (float)loss;
        stats->grad_norm = (float)norm;
        stats->lr = lr;
    }
    return CAI_OK;
}
