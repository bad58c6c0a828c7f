/* The step driver of a model with experts (docs/moe.md): the microbatch
 * loop on a whole model, then the gradient sync that averages dense
 * gradients over dp and sums an expert's over its edp replicas (its owner
 * already holds every ep rank's tokens), and the global gradient norm with
 * each expert counted once (summed over ep). */
#include "cai_config.h"
#include "colossal/moe.h"
#include "colossal/optim.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    cai_mesh_t *mesh;
    cai_moe_grad_sync_t *gs;
    size_t *expert_off, *expert_n; /* this rank's expert parameters in the flat buffer */
    int n_expert;
} moe_driver;

static cai_status moe_forward_backward(const cai_step_driver *d, const int32_t *tokens, const int32_t *targets,
                                       int n_micro, float loss_scale, double *loss) {
    moe_driver *s = d->self;
    cai_model_t *m = d->model;
    double sum = 0.0;
    CAI_CALL(cai_model_microbatches(m, tokens, targets, n_micro, loss_scale, &sum));
    cai_tensor grads;
    cai_model_flat(m, NULL, &grads, NULL);
    CAI_CALL(cai_moe_grad_sync_run(s->gs, cai_model_device(m), grads.data));
    CAI_CALL(cai_allreduce(s->mesh, CAI_AXIS_DP, &sum, &sum, 1, CAI_DTYPE_F64, CAI_RED_AVG));
    *loss = sum;
    return CAI_OK;
}

/* The optimizer's count (tp replicas once, dense parameters the same on
 * every dp rank) with the experts' part replaced by its sum over ep: each
 * ep rank holds other experts. */
static cai_status moe_grad_sumsq(const cai_step_driver *d, double *sumsq) {
    moe_driver *s = d->self;
    cai_tensor grads;
    cai_model_flat(d->model, NULL, &grads, NULL);
    double total = 0.0, ex = 0.0;
    CAI_CALL(cai_optim_grad_sumsq(d->optim, &grads, &total));
    cai_device_t *dev = cai_model_device(d->model);
    if (cai_mesh_rank(s->mesh, CAI_AXIS_TP) == 0) /* experts are whole on every tp rank */
        for (int i = 0; i < s->n_expert; i++) {
            const float *g = (const float *)grads.data + s->expert_off[i];
            cai_tensor acc = cai_tensor_1d(dev, &ex, CAI_DTYPE_F64, 1);
            cai_tensor gt = cai_tensor_1d(dev, (void *)g, CAI_DTYPE_F32, (int64_t)s->expert_n[i]);
            CAI_CALL(dev->ops->sumsq(dev, &acc, &gt));
        }
    double all = ex;
    CAI_CALL(cai_allreduce(s->mesh, CAI_AXIS_EP, &all, &all, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    double v = total - ex + all;
    CAI_CALL(cai_allreduce(s->mesh, CAI_AXIS_TP, &v, &v, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    CAI_CALL(cai_allreduce(s->mesh, CAI_AXIS_PP, &v, &v, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    *sumsq = v;
    return CAI_OK;
}

cai_status cai_moe_driver_create(cai_model_t *m, cai_optim_t *o, cai_mesh_t *mesh, cai_step_driver *out) {
    CAI_CHECK_ARG(m && o && mesh && out, "cai_moe_driver_create: NULL argument");
    int first = 0, last = 0;
    cai_model_stage(m, NULL, NULL, &first, &last);
    if (!first || !last || cai_model_external_params(m) || cai_model_seq_parallel(m))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "the expert-parallel driver runs whole models (pp=1) whose buffers it owns (ZeRO stage 0) "
                         "without split-gather sequence parallelism; ZeRO stages 1-3 at ep > 1 run on the ZeRO "
                         "engine's driver (cai_zero_driver), which shards experts over edp");
    moe_driver *s = NULL;
    cai_status st = CAI_OK;
    const cai_registry_t *reg = cai_model_registry(m);
    const cai_rank_view *view = cai_model_view(m);
    const int n = cai_registry_count(reg);
    size_t *offsets = NULL, total = 0;
    CAI_CALL(cai_calloc((void **)&s, 1, sizeof *s, "moe driver"));
    s->mesh = mesh;
    CAI_CALL_GOTO(cai_moe_grad_sync_create(&s->gs, mesh, reg, view, cai_model_align_elems(m)), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&offsets, (size_t)n + 1, sizeof *offsets, "moe driver offsets"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&s->expert_off, (size_t)n + 1, sizeof *s->expert_off, "moe driver"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&s->expert_n, (size_t)n + 1, sizeof *s->expert_n, "moe driver"), st, fail);
    CAI_CALL_GOTO(cai_registry_local_layout(reg, view, cai_model_align_elems(m), offsets, &total), st, fail);
    for (int i = 0; i < n; i++) {
        if (offsets[i] == SIZE_MAX || cai_registry_param(reg, i)->spec.n_experts == 0) continue;
        cai_param_shard sh;
        CAI_CALL_GOTO(cai_registry_shard(reg, i, view, &sh), st, fail);
        s->expert_off[s->n_expert] = offsets[i];
        s->expert_n[s->n_expert++] = (size_t)sh.local_numel;
    }
    cai_free(offsets);
    *out = (cai_step_driver){.name = "expert parallel",
                             .self = s,
                             .model = m,
                             .optim = o,
                             .forward_backward = moe_forward_backward,
                             .grad_sumsq = moe_grad_sumsq};
    return CAI_OK;
fail:
    cai_free(offsets);
    cai_step_driver tmp = {.self = s};
    cai_moe_driver_free(&tmp);
    return st;
}

void cai_moe_driver_free(cai_step_driver *d) {
    if (!d || !d->self) return;
    moe_driver *s = d->self;
    cai_moe_grad_sync_free(s->gs);
    cai_free(s->expert_off);
    cai_free(s->expert_n);
    cai_free(s);
    d->self = NULL;
}
