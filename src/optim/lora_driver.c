/* The LoRA step driver (colossal/lora.h): the microbatch loop over a model
 * whose base is frozen and whose adapters are the only trainable
 * parameters, their gradients averaged over the data-parallel replicas, and
 * AdamW over the adapters' own flat buffers. */
#include "cai_config.h"
#include "colossal/lora.h"
#include "colossal/optim.h"

typedef struct {
    cai_model_t *m;
    cai_lora_t *l;
    cai_optim_t *o;
    cai_mesh_t *mesh;
} lora_drv;

/* A microbatch's dropout key: the update it belongs to and its place in
 * the step, so a resumed run draws the same masks. */
static uint64_t dropout_key(const lora_drv *s, int k) {
    return ((uint64_t)(cai_optim_step_count(s->o) + 1) << 20) | (uint64_t)k;
}

static cai_status lora_forward_backward(const cai_step_driver *d, const int32_t *tokens, const int32_t *targets,
                                        int n_micro, float loss_scale, double *loss) {
    lora_drv *s = d->self;
    CAI_CALL(cai_lora_zero_grad(s->l));
    int B = 0, T = 0;
    cai_model_shape(s->m, &B, &T);
    const size_t per = (size_t)B * (size_t)T;
    const float w = loss_scale / (float)n_micro;
    double sum = 0.0;
    cai_status st = CAI_OK;
    for (int k = 0; k < n_micro && st == CAI_OK; k++) {
        float lk = 0.0f;
        cai_lora_set_dropout_key(s->l, dropout_key(s, k));
        st = cai_model_forward_train(s->m, tokens + (size_t)k * per, targets + (size_t)k * per, w, &lk);
        if (st == CAI_OK) st = cai_model_backward(s->m, w);
        sum += (double)lk / n_micro;
    }
    cai_lora_set_eval(s->l); /* evaluation forwards in between steps run without dropout */
    CAI_CALL(st);
    const int dp = s->mesh ? cai_mesh_size(s->mesh, CAI_AXIS_DP) : 1;
    if (dp > 1) {
        cai_tensor g;
        cai_lora_flat(s->l, NULL, &g);
        CAI_CALL(cai_allreduce(s->mesh, CAI_AXIS_DP, g.data, g.data, (size_t)cai_tensor_numel(&g), CAI_DTYPE_F32,
                               CAI_RED_SUM));
        cai_device_t *dev = cai_model_device(s->m);
        CAI_CALL(dev->ops->scale(dev, &g, 1.0f / (float)dp));
        CAI_CALL(cai_allreduce(s->mesh, CAI_AXIS_DP, &sum, &sum, 1, CAI_DTYPE_F64, CAI_RED_SUM));
        sum /= dp;
    }
    *loss = sum;
    return CAI_OK;
}

/* The adapters are replicated: every rank holds the whole reduced gradient. */
static cai_status lora_grad_sumsq(const cai_step_driver *d, double *sumsq) {
    lora_drv *s = d->self;
    cai_tensor g;
    cai_lora_flat(s->l, NULL, &g);
    return cai_optim_grad_sumsq(s->o, &g, sumsq);
}

static cai_status lora_adamw_step(const cai_step_driver *d, const cai_adamw_params *p) {
    lora_drv *s = d->self;
    cai_tensor params, grads;
    cai_lora_flat(s->l, &params, &grads);
    CAI_CALL(cai_optim_step(s->o, &params, &grads, NULL, p->grad_scale, NULL));
    return cai_lora_params_updated(s->l);
}

static int64_t lora_step_count(const cai_step_driver *d) { return cai_optim_step_count(((lora_drv *)d->self)->o); }

cai_status cai_lora_optim_create(cai_optim_t **out, cai_lora_t *l, cai_device_t *dev, const cai_adamw_config *cfg) {
    CAI_CHECK_ARG(out && l && dev && cfg, "cai_lora_optim_create: NULL argument");
    cai_rank_view v = cai_rank_view_single();
    return cai_optim_create(out, dev, cai_lora_registry(l), &v, cai_lora_align_elems(l), cfg);
}

cai_status cai_lora_driver(cai_model_t *m, cai_lora_t *l, cai_optim_t *o, cai_mesh_t *mesh, cai_step_driver *out,
                           void **state) {
    CAI_CHECK_ARG(m && l && o && out && state, "cai_lora_driver: NULL argument");
    int first = 0, last = 0;
    cai_model_stage(m, NULL, NULL, &first, &last);
    if (!first || !last || cai_model_view(m)->tp_size > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "the LoRA driver runs whole models replicated over data parallelism (tp = pp = 1); this "
                         "model is a pipeline stage or a tensor-parallel shard");
    lora_drv *s = NULL;
    CAI_CALL(cai_calloc((void **)&s, 1, sizeof *s, "LoRA driver"));
    *s = (lora_drv){m, l, o, mesh};
    *state = s;
    *out = (cai_step_driver){.name = "LoRA",
                             .self = s,
                             .model = m,
                             .optim = NULL, /* it steps the adapters' buffers, not the model's */
                             .forward_backward = lora_forward_backward,
                             .grad_sumsq = lora_grad_sumsq,
                             .adamw_step = lora_adamw_step,
                             .step_count = lora_step_count};
    return CAI_OK;
}
