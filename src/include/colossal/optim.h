/* Optimizer: AdamW over a model's flat parameter buffer, learning-rate
 * schedules, global gradient norm and clipping, loss scaling, and the
 * training step over a step driver. See docs/model.md ("Optimizer").
 *
 * The optimizer works on the flat local layout the registry defines
 * (cai_registry_local_layout), one segment per held parameter, so a ZeRO
 * partition or a pipeline stage is just a different view. It owns the F32
 * moments m and v (same layout as the parameters). */
#ifndef COLOSSAL_OPTIM_H
#define COLOSSAL_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/model.h"
#include "colossal/ops.h"
#include "colossal/parallel.h"
#include "colossal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CAI_LR_CONSTANT = 0, /* lr after warmup */
    CAI_LR_COSINE,       /* cosine from lr to min_lr over [warmup_steps, decay_steps], min_lr after */
    CAI_LR_LINEAR,       /* straight line from lr to min_lr over [warmup_steps, decay_steps], min_lr after */
    CAI_LR_KIND_COUNT
} cai_lr_kind;

typedef struct {
    cai_lr_kind kind;
    float lr;             /* peak learning rate */
    float min_lr;         /* cosine floor */
    int64_t warmup_steps; /* linear warmup: step s (1-based) gets lr * s / warmup_steps */
    int64_t decay_steps;  /* step at which the cosine reaches min_lr (>= warmup_steps) */
} cai_lr_schedule;

/* Learning rate of update `step` (1 for the first). Pure. */
float cai_lr_at(const cai_lr_schedule *s, int64_t step);
const char *cai_lr_kind_name(cai_lr_kind k);
cai_status cai_lr_kind_parse(const char *name, cai_lr_kind *out); /* "constant", "cosine", "linear" */

typedef struct {
    cai_lr_schedule schedule;
    float beta1, beta2, eps;
    float weight_decay; /* decoupled; applied to parameters whose registry flag says so */
    float grad_clip;    /* max global gradient norm; <= 0 turns clipping off */
} cai_adamw_config;

/* lr 3e-4 constant, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, clip 1.0. */
cai_adamw_config cai_adamw_config_default(void);
/* CAI_ERR_CONFIG naming the optim.* key that is out of its domain (e.g. a
 * decay that ends before the warmup). Pure: apps call it before any work. */
cai_status cai_adamw_config_check(const cai_adamw_config *c);

typedef struct cai_optim cai_optim_t;

/* One optimizer for the parameters `view` holds, in the flat layout
 * cai_registry_local_layout(reg, view, align_elems) gives; m and v start at
 * zero, the step counter at 0. A tie copy whose primary is held on this
 * rank is not updated (the model keeps it equal to the primary). Not
 * collective. */
cai_status cai_optim_create(cai_optim_t **out, cai_device_t *dev, const cai_registry_t *reg, const cai_rank_view *view,
                            size_t align_elems, const cai_adamw_config *cfg);
/* The same for a model's registry, view and alignment. */
cai_status cai_optim_create_for_model(cai_optim_t **out, cai_model_t *model, const cai_adamw_config *cfg);
void cai_optim_free(cai_optim_t *o);

const cai_adamw_config *cai_optim_config(const cai_optim_t *o);
/* Updates taken so far (the next step uses step + 1). Set it when resuming. */
int64_t cai_optim_step_count(const cai_optim_t *o);
void cai_optim_set_step_count(cai_optim_t *o, int64_t step);
/* The moments, F32 flat buffers in the parameter layout (checkpointing). */
void cai_optim_state(cai_optim_t *o, cai_tensor *m, cai_tensor *v);

/* This rank's partial sum of squared gradients, counting each parameter
 * element once in the whole job: TP replicas only on replica 0, tie copies
 * only at the tie primary. Not collective: a parallel caller all-reduces the
 * sum (over TP, PP and the ZeRO dp shards), then takes the square root. */
cai_status cai_optim_grad_sumsq(cai_optim_t *o, const cai_tensor *grads, double *sumsq);

/* One AdamW update of every local parameter: step count + 1, lr from the
 * schedule, g = grad * grad_scale (the clip coefficient, see cai_clip_coef),
 * decoupled weight decay where the registry says so, bias correction.
 * params (F32 masters) and grads share the flat layout; params_lowp (BF16 /
 * F16 working copy, may be NULL) receives the updated weights rounded to
 * nearest even. *lr_used may be NULL. Not collective. */
cai_status cai_optim_step(cai_optim_t *o, cai_tensor *params, const cai_tensor *grads, cai_tensor *params_lowp,
                          float grad_scale, float *lr_used);

/* ======================================================================
 * Loss scaling
 * (src/optim/loss_scale.c; docs/parallel.md)
 * ====================================================================== */

/* Dynamic loss scaling for f16 (Megatron's DynamicGradScaler): the loss
 * (hence every gradient) is multiplied by `scale` so small f16 gradients do
 * not flush to zero; a step whose gradients overflow is skipped. After
 * `hysteresis` overflows (counted since the last growth) every further
 * overflow multiplies the scale by backoff_factor; after growth_interval
 * consecutive good steps the scale grows by growth_factor and the
 * hysteresis budget refills. The scale stays within [min_scale, max_scale]. */
typedef struct {
    int dynamic;          /* 0: the scale stays init_scale (bf16/f32 use 1) */
    float init_scale;     /* 2^16 */
    float growth_factor;  /* 2 */
    float backoff_factor; /* 0.5 */
    int growth_interval;  /* 1000 good steps */
    int hysteresis;       /* 2 */
    float min_scale;      /* 1 */
    float max_scale;      /* 2^24 */
} cai_loss_scale_config;

/* The defaults above, dynamic. Pure. */
cai_loss_scale_config cai_loss_scale_config_default(void);
/* A static scale of 1: what bf16 and f32 training use. Pure. */
cai_loss_scale_config cai_loss_scale_config_none(void);
/* Errors name the field and the range that would fit. Pure. */
cai_status cai_loss_scale_config_check(const cai_loss_scale_config *c);

typedef struct {
    cai_loss_scale_config cfg;
    float scale;         /* multiply the loss by this */
    int good_steps;      /* consecutive steps without overflow since the last growth or overflow */
    int hysteresis_left; /* overflows still tolerated before the scale backs off */
    int64_t overflows;   /* skipped steps so far */
} cai_loss_scaler;

void cai_loss_scaler_init(cai_loss_scaler *s, const cai_loss_scale_config *cfg);
/* Record one step. `overflow` must already be agreed by every rank (an
 * inf/NaN anywhere in the global gradient). Returns 1 when the step's update
 * is to be applied, 0 when it must be skipped; the scale for the next step
 * is s->scale. Pure (not collective). */
int cai_loss_scaler_update(cai_loss_scaler *s, int overflow);

/* ======================================================================
 * The training step (src/optim/train.c)
 * ====================================================================== */

typedef struct {
    float loss;       /* mean cross-entropy over the step's microbatches and replicas */
    float grad_norm;  /* global, unscaled, before clipping (inf/NaN on overflow) */
    float lr;         /* learning rate used (0 when skipped) */
    float loss_scale; /* the scale this step ran with (1 without a scaler) */
    int skipped;      /* 1: the gradients overflowed under a scaler and nothing was updated */
} cai_step_stats;

/* ======================================================================
 * Step drivers: what cai_train_step runs a step on.
 *
 * A driver owns the microbatch loop and the gradient sync of one layout:
 * forward and backward of every microbatch, the reductions over the axes
 * the gradients are partial on, the global gradient norm and, when it
 * holds the optimizer state itself, the AdamW update of its shard. The
 * step around it (loss scaling, overflow skip, clipping, the learning-rate
 * schedule) is cai_train_step's, the same for every driver. Drivers: the
 * single-process loop (cai_local_driver), the ZeRO / data-parallel engine
 * (cai_zero_driver, over colossal/parallel.h's engine) and, per stage, the
 * pipeline executor.
 * ====================================================================== */

typedef struct cai_step_driver cai_step_driver;
struct cai_step_driver {
    const char *name;   /* for messages */
    void *self;         /* the driver's state */
    cai_model_t *model; /* the model it runs */
    cai_optim_t *optim; /* the optimizer over the model's own flat buffers that steps, or NULL: adamw_step */
    /* Zero the gradients, run n_micro microbatches (tokens, targets: host
     * [n_micro, B, T]) with the loss gradient multiplied by loss_scale and
     * weighted so the reduced gradients are the global-batch mean's, reduce
     * them over every axis they are partial on; *loss: the mean loss over
     * microbatches and replicas. Collective over the driver's axes. */
    cai_status (*forward_backward)(const cai_step_driver *d, const int32_t *tokens, const int32_t *targets, int n_micro,
                                   float loss_scale, double *loss);
    /* Squared global gradient norm (each element of the job once), the same
     * on every rank; not finite when any gradient is. */
    cai_status (*grad_sumsq)(const cai_step_driver *d, double *sumsq);
    /* AdamW over the driver's own state (optim NULL); p->step is the next update. */
    cai_status (*adamw_step)(const cai_step_driver *d, const cai_adamw_params *p);
    int64_t (*step_count)(const cai_step_driver *d); /* updates so far (optim NULL) */
};

/* The engine as a step driver. `o` is the optimizer over the model's own
 * buffers for a reduce-only engine and must be NULL otherwise (the engine
 * steps its shards). Not collective; the driver is valid while z is. */
cai_status cai_zero_driver(cai_zero_t *z, cai_optim_t *o, cai_step_driver *out);

/* The microbatch loop of a whole model with no reduction: gradients
 * zeroed, then for each of n_micro microbatches (tokens, targets: host
 * [n_micro, B, T]) a training forward and backward with the loss gradient
 * scaled by loss_scale / n_micro; *loss the mean loss. What the
 * single-process driver runs; others reduce after it. Collective as the
 * model's layers are. */
cai_status cai_model_microbatches(cai_model_t *m, const int32_t *tokens, const int32_t *targets, int n_micro,
                                  float loss_scale, double *loss);

/* The single-process driver: the microbatch loop on a whole model (pp = 1,
 * tp = 1) with no reduction, `o` stepping the model's flat buffers. Not
 * collective. */
cai_status cai_local_driver(cai_model_t *m, cai_optim_t *o, cai_step_driver *out);

/* The pipeline executor as a driver: `o` steps this stage's own flat
 * buffers (every stage updates its parameters; tied copies receive the
 * same summed gradient, so they stay equal), or, with a ZeRO stage-1
 * engine attached (cai_pipeline_set_zero), o is NULL and the engine steps
 * its shards. Not collective. */
cai_status cai_pipeline_driver(cai_pipeline_t *p, cai_optim_t *o, cai_step_driver *out);

/* A model with experts (colossal/moe.h) at any ep that divides dp, with tp
 * and ZeRO stage 0: the microbatch loop on the whole model (pp = 1), then
 * dense gradients averaged over dp and experts' summed over edp and divided
 * by dp (cai_moe_grad_sync_run); the gradient norm counts each expert once
 * (summed over ep). `o` steps the model's own buffers. Free with
 * cai_moe_driver_free. Not collective. ZeRO stages 1-3 at ep > 1 run on
 * the engine's driver instead (cai_zero_driver: experts' optimizer state
 * sharded over edp, colossal/parallel.h). */
cai_status cai_moe_driver_create(cai_model_t *m, cai_optim_t *o, cai_mesh_t *mesh, cai_step_driver *out);
void cai_moe_driver_free(cai_step_driver *d);

/* One training step on any driver: forward and backward of n_micro
 * microbatches with the loss scaled by scaler->scale (NULL: 1), the global
 * gradient norm, then either a skipped step (the norm or loss is not
 * finite: the scaler backs off when dynamic; without a scaler
 * CAI_ERR_INVALID_ARG, nothing updated) or clipping to cfg->grad_clip and
 * AdamW with the learning rate of the next update, through the driver's
 * optimizer (cfg may then be NULL: its config is used) or its own sharded
 * step. The same decision on every rank. stats may be NULL. Collective
 * over the driver's axes. */
cai_status cai_train_step(const cai_step_driver *d, const cai_adamw_config *cfg, cai_loss_scaler *scaler,
                          const int32_t *tokens, const int32_t *targets, int n_micro, cai_step_stats *stats);

/* ====================================================== end of the training step */

#ifdef __cplusplus
}
#endif
#endif
