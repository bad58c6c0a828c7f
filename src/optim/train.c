/* The training step: one function over every step driver (the
 * single-process loop, the ZeRO / data-parallel engine's and the pipeline
 * executor's), with loss scaling, the overflow skip, global-norm clipping and
 * the learning-rate schedule around the driver's microbatch loop. */
#include "cai_config.h"
#include "colossal/optim.h"
#include "colossal/parallel.h"

#include <math.h>

/* ------------------------------------------------------------ the local driver */

cai_status cai_model_microbatches(cai_model_t *m, const int32_t *tokens, const int32_t *targets, int n_micro,
                                  float loss_scale, double *loss) {
    CAI_CHECK_ARG(m && tokens && targets && loss && n_micro >= 1, "cai_model_microbatches: bad argument");
    CAI_CALL(cai_model_zero_grad(m));
    int B = 0, T = 0;
    cai_model_shape(m, &B, &T);
    const size_t per = (size_t)B * (size_t)T; /* tokens per microbatch */
    const float w = loss_scale / (float)n_micro;
    double sum = 0.0;
    for (int k = 0; k < n_micro; k++) {
        float l = 0.0f;
        CAI_CALL(cai_model_forward_train(m, tokens + (size_t)k * per, targets + (size_t)k * per, w, &l));
        CAI_CALL(cai_model_backward(m, w));
        sum += (double)l / n_micro;
    }
    *loss = sum;
    return CAI_OK;
}

static cai_status local_forward_backward(const cai_step_driver *d, const int32_t *tokens, const int32_t *targets,
                                         int n_micro, float loss_scale, double *loss) {
    return cai_model_microbatches(d->model, tokens, targets, n_micro, loss_scale, loss);
}

static cai_status local_grad_sumsq(const cai_step_driver *d, double *sumsq) {
    cai_tensor grads;
    cai_model_flat(d->model, NULL, &grads, NULL);
    return cai_optim_grad_sumsq(d->optim, &grads, sumsq);
}

cai_status cai_local_driver(cai_model_t *m, cai_optim_t *o, cai_step_driver *out) {
    CAI_CHECK_ARG(m && o && out, "cai_local_driver: NULL argument");
    int first = 0, last = 0;
    cai_model_stage(m, NULL, NULL, &first, &last);
    if (!first || !last)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "the single-process driver runs a whole model on one rank; this model is one "
                         "pipeline stage (use the pipeline executor)");
    if (cai_model_view(m)->tp_size > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "the single-process driver reduces nothing; a tp=%d model needs the ZeRO / data-parallel "
                         "engine's driver (cai_zero_driver), which sums the gradients tensor parallelism leaves "
                         "partial",
                         cai_model_view(m)->tp_size);
    *out = (cai_step_driver){.name = "single-process",
                             .model = m,
                             .optim = o,
                             .forward_backward = local_forward_backward,
                             .grad_sumsq = local_grad_sumsq};
    return CAI_OK;
}

/* ------------------------------------------------------------ the ZeRO / data-parallel driver */

static cai_status drv_forward_backward(const cai_step_driver *d, const int32_t *tokens, const int32_t *targets,
                                       int n_micro, float loss_scale, double *loss) {
    return cai_zero_forward_backward(d->self, tokens, targets, n_micro, loss_scale, loss);
}
static cai_status drv_grad_sumsq(const cai_step_driver *d, double *sumsq) {
    return cai_zero_grad_sumsq(d->self, sumsq);
}
static cai_status drv_adamw_step(const cai_step_driver *d, const cai_adamw_params *p) {
    return cai_zero_step(d->self, p);
}
static int64_t drv_step_count(const cai_step_driver *d) { return cai_zero_step_count(d->self); }

cai_status cai_zero_driver(cai_zero_t *z, cai_optim_t *o, cai_step_driver *out) {
    CAI_CHECK_ARG(z && out, "cai_zero_driver: NULL argument");
    const int reduce_only = cai_zero_get_config(z)->reduce_only;
    CAI_CHECK_ARG(reduce_only == (o != NULL), "cai_zero_driver: %s",
                  reduce_only ? "a reduce-only engine needs the optimizer o that steps the model's buffers"
                              : "o is for reduce-only engines; this engine steps its own shards");
    *out = (cai_step_driver){.name = cai_zero_get_config(z)->stage ? "ZeRO" : "data parallel",
                             .self = z,
                             .model = cai_zero_model(z),
                             .optim = o,
                             .forward_backward = drv_forward_backward,
                             .grad_sumsq = drv_grad_sumsq,
                             .adamw_step = o ? NULL : drv_adamw_step,
                             .step_count = o ? NULL : drv_step_count};
    return CAI_OK;
}

/* ------------------------------------------------------------ the pipeline driver */

static cai_status pipe_forward_backward(const cai_step_driver *d, const int32_t *tokens, const int32_t *targets,
                                        int n_micro, float loss_scale, double *loss) {
    return cai_pipeline_forward_backward(d->self, tokens, targets, n_micro, loss_scale, loss);
}

/* Each stage's own parameters (tie copies at their primary, tp replicas at
 * replica 0), summed over pp and tp; the dp replicas hold the same averaged
 * gradients. */
static cai_status pipe_grad_sumsq(const cai_step_driver *d, double *sumsq) {
    double s = 0;
    cai_mesh_t *mesh = cai_pipeline_mesh(d->self);
    cai_zero_t *z = cai_pipeline_zero(d->self);
    if (z) {
        CAI_CALL(cai_zero_grad_sumsq(z, &s)); /* over dp shards and tp */
    } else {
        cai_tensor grads;
        cai_model_flat(d->model, NULL, &grads, NULL);
        CAI_CALL(cai_optim_grad_sumsq(d->optim, &grads, &s));
        if (cai_mesh_size(mesh, CAI_AXIS_TP) > 1)
            CAI_CALL(cai_allreduce(mesh, CAI_AXIS_TP, &s, &s, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    }
    CAI_CALL(cai_allreduce(mesh, CAI_AXIS_PP, &s, &s, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    *sumsq = s;
    return CAI_OK;
}
static cai_status pipe_adamw_step(const cai_step_driver *d, const cai_adamw_params *p) {
    return cai_zero_step(cai_pipeline_zero(d->self), p);
}
static int64_t pipe_step_count(const cai_step_driver *d) { return cai_zero_step_count(cai_pipeline_zero(d->self)); }

cai_status cai_pipeline_driver(cai_pipeline_t *p, cai_optim_t *o, cai_step_driver *out) {
    CAI_CHECK_ARG(p && out, "cai_pipeline_driver: NULL argument");
    cai_zero_t *z = cai_pipeline_zero(p);
    const int steps_itself = z && !cai_zero_get_config(z)->reduce_only;
    CAI_CHECK_ARG(steps_itself == (o == NULL), "cai_pipeline_driver: %s",
                  steps_itself ? "o must be NULL: the attached ZeRO engine steps its own shards"
                               : "needs the optimizer o that steps the stage's own buffers");
    *out = (cai_step_driver){.name = z ? "pipeline (ZeRO)" : "pipeline",
                             .self = p,
                             .model = cai_pipeline_model(p),
                             .optim = o,
                             .forward_backward = pipe_forward_backward,
                             .grad_sumsq = pipe_grad_sumsq,
                             .adamw_step = o ? NULL : pipe_adamw_step,
                             .step_count = o ? NULL : pipe_step_count};
    return CAI_OK;
}

/* ------------------------------------------------------------ the step */

static cai_status apply_update(const cai_step_driver *d, const cai_adamw_config *cfg, int64_t next, float gscale,
                               float *lr) {
    if (d->optim) {
        cai_tensor params, grads, lowp;
        cai_model_flat(d->model, &params, &grads, &lowp);
        CAI_CALL(cai_optim_step(d->optim, &params, &grads, &lowp, gscale, lr));
        return cai_model_params_updated(d->model);
    }
    cai_adamw_params p = {
        .lr = cai_lr_at(&cfg->schedule, next),
        .beta1 = cfg->beta1,
        .beta2 = cfg->beta2,
        .eps = cfg->eps,
        .weight_decay = cfg->weight_decay,
        .step = next,
        .grad_scale = gscale,
    };
    CAI_CALL(d->adamw_step(d, &p));
    *lr = p.lr;
    return CAI_OK;
}

cai_status cai_train_step(const cai_step_driver *d, const cai_adamw_config *cfg, cai_loss_scaler *scaler,
                          const int32_t *tokens, const int32_t *targets, int n_micro, cai_step_stats *out) {
    CAI_CHECK_ARG(d && d->forward_backward && d->grad_sumsq && tokens && targets, "cai_train_step: NULL argument");
    CAI_CHECK_ARG(n_micro >= 1, "cai_train_step: n_micro=%d must be >= 1", n_micro);
    CAI_CHECK_ARG(d->optim ? d->model != NULL : d->adamw_step && d->step_count,
                  "cai_train_step: the %s driver has neither an optimizer nor a step of its own", d->name);
    if (d->optim) cfg = cai_optim_config(d->optim);
    CAI_CHECK_ARG(cfg, "cai_train_step: the %s driver steps its own state and needs the AdamW config", d->name);
    CAI_CHECK_ARG(cfg->beta1 >= 0 && cfg->beta1 < 1 && cfg->beta2 >= 0 && cfg->beta2 < 1 && cfg->eps > 0,
                  "cai_train_step: betas (%g, %g) must lie in [0, 1) and eps %g be > 0", (double)cfg->beta1,
                  (double)cfg->beta2, (double)cfg->eps);
    const float scale = scaler ? scaler->scale : 1.0f;
    double loss = 0, sumsq = 0;
    CAI_CALL(d->forward_backward(d, tokens, targets, n_micro, scale, &loss));
    CAI_CALL(d->grad_sumsq(d, &sumsq));
    /* FP8 scales for the next step from this one's amaxes (collective, so
     * before any branch a rank could take alone) */
    if (cai_model_fp8(d->model)) CAI_CALL(cai_fp8_step(cai_model_fp8(d->model)));
    /* Both come out of the driver's reductions: every rank sees the same
     * values, so every rank takes the same branch below. */
    const double norm = sqrt(sumsq) / scale;
    const int overflow = !isfinite(sumsq) || !isfinite(loss);
    const int64_t next = (d->optim ? cai_optim_step_count(d->optim) : d->step_count(d)) + 1;
    cai_step_stats st = {(float)loss, (float)norm, 0.0f, scale, 0};
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
    CAI_CALL(apply_update(d, cfg, next, gscale, &st.lr));
    if (out) *out = st;
    return CAI_OK;
}
