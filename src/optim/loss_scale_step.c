/* The training step over a ZeRO / data-parallel engine: loss scaling,
 * overflow skip, global-norm clipping and the learning-rate schedule on top
 * of the engine's reductions and sharded AdamW (colossal/parallel.h), or of
 * a cai_optim_t over the model's own buffers for a reduce-only engine. */
#include "cai_config.h"
#include "colossal/optim.h"
#include "colossal/parallel.h"

#include <math.h>

cai_status cai_train_step_zero(cai_zero_t *z, cai_optim_t *o, const cai_adamw_config *cfg, cai_loss_scaler *scaler,
                               const int32_t *tokens, const int32_t *targets, int n_micro, cai_zero_step_stats *out) {
    CAI_CHECK_ARG(z && (cfg || o), "cai_train_step_zero: NULL argument");
    const int own = cai_zero_get_config(z)->reduce_only;
    CAI_CHECK_ARG(own == (o != NULL), "cai_train_step_zero: %s",
                  own ? "a reduce-only engine needs the optimizer o"
                      : "o is for reduce-only engines; this engine "
                        "steps its own shards");
    if (o) cfg = cai_optim_config(o);
    CAI_CHECK_ARG(cfg->beta1 >= 0 && cfg->beta1 < 1 && cfg->beta2 >= 0 && cfg->beta2 < 1 && cfg->eps > 0,
                  "cai_train_step_zero: betas (%g, %g) must lie in [0, 1) and eps %g be > 0", (double)cfg->beta1,
                  (double)cfg->beta2, (double)cfg->eps);
    const float scale = scaler ? scaler->scale : 1.0f;
    double loss = 0, sumsq = 0;
    CAI_CALL(cai_zero_forward_backward(z, tokens, targets, n_micro, scale, &loss));
    CAI_CALL(cai_zero_grad_sumsq(z, &sumsq));
    /* Both come out of all-reduces: every rank sees the same values, so
     * every rank takes the same branch below. */
    const double norm = sqrt(sumsq) / scale;
    const int overflow = !isfinite(sumsq) || !isfinite(loss);
    const int64_t next = (o ? cai_optim_step_count(o) : cai_zero_step_count(z)) + 1;
    cai_zero_step_stats st = {(float)loss, (float)norm, 0.0f, scale, 0};
    if (overflow && !scaler)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "training step %lld: loss %g, gradient norm %g is not finite on some rank; nothing was "
                         "updated (lower the learning rate, check the data, or train f16 with loss scaling)",
                         (long long)next, loss, norm);
    if (scaler && !cai_loss_scaler_update(scaler, overflow)) {
        st.skipped = 1;
        CAI_DEBUG("step %lld skipped: gradients overflowed at loss scale %g; next scale %g", (long long)next,
                  (double)scale, (double)scaler->scale);
        if (out) *out = st;
        return CAI_OK;
    }
    const float gscale = cai_clip_coef(norm, (double)cfg->grad_clip) / scale;
    if (o) {
        cai_model_t *m = cai_zero_model(z);
        cai_tensor params, grads, lowp;
        cai_model_flat(m, &params, &grads, &lowp);
        CAI_CALL(cai_optim_step(o, &params, &grads, &lowp, gscale, &st.lr));
        CAI_CALL(cai_model_params_updated(m));
    } else {
        cai_adamw_params p = {
            .lr = cai_lr_at(&cfg->schedule, next),
            .beta1 = cfg->beta1,
            .beta2 = cfg->beta2,
            .eps = cfg->eps,
            .weight_decay = cfg->weight_decay,
            .step = next,
            .grad_scale = gscale,
        };
        CAI_CALL(cai_zero_step(z, &p));
        st.lr = p.lr;
    }
    if (out) *out = st;
    return CAI_OK;
}
