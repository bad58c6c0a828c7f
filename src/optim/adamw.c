/* AdamW over the registry's flat local layout, learning-rate schedules and
 * the global gradient norm's local partial sum. */
#include "cai_config.h"
#include "colossal/optim.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ schedules */

static const char *const k_lr_names[CAI_LR_KIND_COUNT] = {
    [CAI_LR_CONSTANT] = "constant",
    [CAI_LR_COSINE] = "cosine",
    [CAI_LR_LINEAR] = "linear",
};

const char *cai_lr_kind_name(cai_lr_kind k) {
    if ((int)k < 0 || k >= CAI_LR_KIND_COUNT) return "?";
    return k_lr_names[k];
}

cai_status cai_lr_kind_parse(const char *name, cai_lr_kind *out) {
    CAI_CHECK_ARG(name && out, "cai_lr_kind_parse: NULL argument");
    for (int k = 0; k < CAI_LR_KIND_COUNT; k++)
        if (strcmp(name, k_lr_names[k]) == 0) {
            *out = (cai_lr_kind)k;
            return CAI_OK;
        }
    return CAI_ERROR(CAI_ERR_CONFIG, "unknown learning-rate schedule '%s' (known: constant, cosine, linear)", name);
}

float cai_lr_at(const cai_lr_schedule *s, int64_t step) {
    if (!s) return 0.0f;
    if (step < 1) step = 1;
    if (s->warmup_steps > 0 && step <= s->warmup_steps)
        return (float)((double)s->lr * (double)step / (double)s->warmup_steps);
    if (s->kind == CAI_LR_CONSTANT) return s->lr;
    if (step >= s->decay_steps) return s->min_lr;
    double span = (double)(s->decay_steps - s->warmup_steps);
    double progress = span > 0 ? (double)(step - s->warmup_steps) / span : 1.0;
    double c = s->kind == CAI_LR_LINEAR ? 1.0 - progress : 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
    return (float)(s->min_lr + c * ((double)s->lr - s->min_lr));
}

cai_adamw_config cai_adamw_config_default(void) {
    cai_adamw_config c;
    memset(&c, 0, sizeof c);
    c.schedule.kind = CAI_LR_CONSTANT;
    c.schedule.lr = 3e-4f;
    c.beta1 = 0.9f;
    c.beta2 = 0.95f;
    c.eps = 1e-8f;
    c.weight_decay = 0.1f;
    c.grad_clip = 1.0f;
    return c;
}

cai_status cai_adamw_config_check(const cai_adamw_config *c) {
    const cai_lr_schedule *s = &c->schedule;
    if ((int)s->kind < 0 || s->kind >= CAI_LR_KIND_COUNT)
        return CAI_ERROR(CAI_ERR_CONFIG, "optim.schedule=%d is not a schedule (constant, cosine, linear)",
                         (int)s->kind);
    if (!(s->lr >= 0) || !isfinite(s->lr) || !(s->min_lr >= 0) || !isfinite(s->min_lr))
        return CAI_ERROR(CAI_ERR_CONFIG, "optim.lr=%g and optim.min_lr=%g must be finite and >= 0", (double)s->lr,
                         (double)s->min_lr);
    if (s->warmup_steps < 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "optim.warmup_steps=%lld must be >= 0", (long long)s->warmup_steps);
    if (s->kind != CAI_LR_CONSTANT && s->decay_steps < s->warmup_steps)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "optim.decay_steps=%lld must be >= optim.warmup_steps=%lld for the cosine "
                         "decaying schedules",
                         (long long)s->decay_steps, (long long)s->warmup_steps);
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1))
        return CAI_ERROR(CAI_ERR_CONFIG, "optim.beta1=%g, optim.beta2=%g must lie in [0, 1)", (double)c->beta1,
                         (double)c->beta2);
    if (!(c->eps > 0) || !isfinite(c->eps))
        return CAI_ERROR(CAI_ERR_CONFIG, "optim.eps=%g must be finite and > 0", (double)c->eps);
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        return CAI_ERROR(CAI_ERR_CONFIG, "optim.weight_decay=%g must be finite and >= 0", (double)c->weight_decay);
    if (!isfinite(c->grad_clip))
        return CAI_ERROR(CAI_ERR_CONFIG, "optim.grad_clip=%g must be finite (<= 0 turns clipping off)",
                         (double)c->grad_clip);
    return CAI_OK;
}

/* ------------------------------------------------------------ optimizer */

/* A contiguous range of the flat buffer that counts toward the norm. */
typedef struct {
    size_t off, n;
} norm_range;

typedef struct {
    size_t off, n;
    int decay;  /* registry weight-decay flag */
    int update; /* 0 for a tie copy whose primary is held here (the model copies it) */
} segment;

struct cai_optim {
    cai_device_t *dev;
    cai_adamw_config cfg;
    int64_t step;
    size_t n_flat;
    float *m, *v;
    segment *segs;
    int n_segs;
    cai_adamw_span *spans; /* per step, the updated segments of the buffers passed */
    norm_range *norm;
    int n_norm;
    double *acc; /* device scalar for sumsq */
};

/* Ranges of a shard counted in the global norm: the TP replica 0 of each
 * slab (fused QKV with replicated KV heads has per-slab replicas; the slabs
 * of a dim-0 split are consecutive row blocks of the local tensor) and only
 * at the tie primary. */
static int norm_ranges(const cai_param_info *info, const cai_param_shard *sh, size_t off, norm_range *out) {
    if (info->tie_primary != info->index) return 0;
    if (sh->n_slabs <= 1 || sh->split_dim != 0) {
        if (sh->n_slabs >= 1 && sh->slab[0].replica_rank != 0) return 0;
        out[0].off = off;
        out[0].n = (size_t)sh->local_numel;
        return 1;
    }
    uint64_t row = sh->local_numel / sh->local_shape[0];
    int k = 0;
    size_t pos = off;
    for (int s = 0; s < sh->n_slabs; s++) {
        size_t n = (size_t)(sh->slab[s].count[0] * row);
        if (sh->slab[s].replica_rank == 0) {
            if (k > 0 && out[k - 1].off + out[k - 1].n == pos) out[k - 1].n += n;
            else out[k++] = (norm_range){pos, n};
        }
        pos += n;
    }
    return k;
}

void cai_optim_free(cai_optim_t *o) {
    if (!o) return;
    cai_device_dealloc(o->dev, o->m);
    cai_device_dealloc(o->dev, o->v);
    cai_device_dealloc(o->dev, o->acc);
    cai_free(o->segs);
    cai_free(o->spans);
    cai_free(o->norm);
    cai_free(o);
}

cai_status cai_optim_create(cai_optim_t **out, cai_device_t *dev, const cai_registry_t *reg, const cai_rank_view *view,
                            size_t align_elems, const cai_adamw_config *cfg) {
    CAI_CHECK_ARG(out && dev && reg && view && cfg, "cai_optim_create: NULL argument");
    *out = NULL;
    CAI_CALL(cai_adamw_config_check(cfg));
    cai_optim_t *o = NULL;
    CAI_CALL(cai_calloc((void **)&o, 1, sizeof *o, "optimizer"));
    cai_status st = CAI_OK;
    size_t *offsets = NULL;
    o->dev = dev;
    o->cfg = *cfg;
    int n = cai_registry_count(reg);
    CAI_CALL_GOTO(cai_calloc((void **)&offsets, (size_t)n + 1, sizeof *offsets, "optimizer offsets"), st, fail);
    CAI_CALL_GOTO(cai_registry_local_layout(reg, view, align_elems, offsets, &o->n_flat), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&o->segs, (size_t)n + 1, sizeof *o->segs, "optimizer segments"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&o->spans, (size_t)n + 1, sizeof *o->spans, "optimizer spans"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&o->norm, (size_t)n * CAI_SHARD_MAX_SLABS + 1, sizeof *o->norm,
                             "optimizer norm ranges"),
                  st, fail);
    for (int i = 0; i < n; i++) {
        if (offsets[i] == SIZE_MAX) continue;
        const cai_param_info *info = cai_registry_param(reg, i);
        cai_param_shard sh;
        CAI_CALL_GOTO(cai_registry_shard(reg, i, view, &sh), st, fail);
        if (sh.local_numel == 0) continue;
        segment *s = &o->segs[o->n_segs++];
        s->off = offsets[i];
        s->n = (size_t)sh.local_numel;
        s->decay = info->spec.weight_decay;
        s->update = !(info->tie_primary != i && offsets[info->tie_primary] != SIZE_MAX);
        o->n_norm += norm_ranges(info, &sh, offsets[i], o->norm + o->n_norm);
    }
    if (o->n_flat) {
        CAI_CALL_GOTO(cai_device_alloc(dev, o->n_flat * sizeof(float), "AdamW first moment", (void **)&o->m), st, fail);
        CAI_CALL_GOTO(cai_device_alloc(dev, o->n_flat * sizeof(float), "AdamW second moment", (void **)&o->v), st,
                      fail);
        cai_tensor tm = cai_tensor_1d(dev, o->m, CAI_DTYPE_F32, (int64_t)o->n_flat);
        cai_tensor tv = cai_tensor_1d(dev, o->v, CAI_DTYPE_F32, (int64_t)o->n_flat);
        CAI_CALL_GOTO(dev->ops->fill(dev, &tm, 0.0f), st, fail);
        CAI_CALL_GOTO(dev->ops->fill(dev, &tv, 0.0f), st, fail);
    }
    CAI_CALL_GOTO(cai_device_alloc(dev, sizeof(double), "grad-norm accumulator", (void **)&o->acc), st, fail);
    cai_free(offsets);
    *out = o;
    return CAI_OK;
fail:
    cai_free(offsets);
    cai_optim_free(o);
    return st;
}

cai_status cai_optim_create_for_model(cai_optim_t **out, cai_model_t *model, const cai_adamw_config *cfg) {
    CAI_CHECK_ARG(model, "cai_optim_create_for_model: NULL model");
    CAI_CALL(cai_optim_create(out, cai_model_device(model), cai_model_registry(model), cai_model_view(model),
                              cai_model_align_elems(model), cfg));
    return CAI_OK;
}

const cai_adamw_config *cai_optim_config(const cai_optim_t *o) { return &o->cfg; }
int64_t cai_optim_step_count(const cai_optim_t *o) { return o->step; }
void cai_optim_set_step_count(cai_optim_t *o, int64_t step) { o->step = step < 0 ? 0 : step; }

void cai_optim_state(cai_optim_t *o, cai_tensor *m, cai_tensor *v) {
    if (m) *m = cai_tensor_1d(o->dev, o->m, CAI_DTYPE_F32, (int64_t)o->n_flat);
    if (v) *v = cai_tensor_1d(o->dev, o->v, CAI_DTYPE_F32, (int64_t)o->n_flat);
}

static cai_status check_flat(const cai_optim_t *o, const char *what, const cai_tensor *t, int want_f32) {
    CAI_CHECK_ARG(t && (t->data || o->n_flat == 0), "optimizer: %s is NULL", what);
    if (cai_tensor_numel(t) != (int64_t)o->n_flat || !cai_tensor_is_contiguous(t) ||
        (want_f32 && t->dtype != CAI_DTYPE_F32)) {
        char buf[160];
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "optimizer: %s is %s, expected a contiguous %s[%zu] in the flat "
                         "parameter layout",
                         what, cai_tensor_describe(t, buf, sizeof buf), want_f32 ? "f32" : "bf16/f16", o->n_flat);
    }
    return CAI_OK;
}

static cai_tensor sub(const cai_optim_t *o, const cai_tensor *flat, size_t off, size_t n) {
    return cai_tensor_1d(o->dev, (char *)flat->data + off * cai_dtype_size(flat->dtype), flat->dtype, (int64_t)n);
}

cai_status cai_optim_grad_sumsq(cai_optim_t *o, const cai_tensor *grads, double *sumsq) {
    CAI_CHECK_ARG(o && sumsq, "cai_optim_grad_sumsq: NULL argument");
    CAI_CALL(check_flat(o, "grads", grads, 1));
    cai_device_t *dev = o->dev;
    cai_tensor acc = cai_tensor_1d(dev, o->acc, CAI_DTYPE_F64, 1);
    const double zero = 0.0; /* fill takes float dtypes only; the accumulator is f64 */
    CAI_CALL(
        cai_device_copy(dev, o->acc, &zero, sizeof zero, dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D));
    for (int i = 0; i < o->n_norm; i++) {
        cai_tensor g = sub(o, grads, o->norm[i].off, o->norm[i].n);
        CAI_CALL(dev->ops->sumsq(dev, &acc, &g));
    }
    CAI_CALL(
        cai_device_copy(dev, sumsq, o->acc, sizeof *sumsq, dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H));
    return CAI_OK;
}

cai_status cai_optim_step(cai_optim_t *o, cai_tensor *params, const cai_tensor *grads, cai_tensor *params_lowp,
                          float grad_scale, float *lr_used) {
    CAI_CHECK_ARG(o, "cai_optim_step: NULL optimizer");
    CAI_CALL(check_flat(o, "params", params, 1));
    CAI_CALL(check_flat(o, "grads", grads, 1));
    if (params_lowp && !params_lowp->data) params_lowp = NULL;
    if (params_lowp) CAI_CALL(check_flat(o, "params_lowp", params_lowp, 0));
    CAI_CHECK_ARG(isfinite(grad_scale), "cai_optim_step: grad_scale %g is not finite", (double)grad_scale);
    cai_device_t *dev = o->dev;
    int64_t step = o->step + 1;
    cai_adamw_params p = {
        .lr = cai_lr_at(&o->cfg.schedule, step),
        .beta1 = o->cfg.beta1,
        .beta2 = o->cfg.beta2,
        .eps = o->cfg.eps,
        .weight_decay = o->cfg.weight_decay,
        .step = step,
        .grad_scale = grad_scale,
    };
    int n = 0;
    const size_t les = params_lowp ? cai_dtype_size(params_lowp->dtype) : 0;
    for (int i = 0; i < o->n_segs; i++) {
        const segment *g = &o->segs[i];
        if (!g->update) continue;
        o->spans[n++] = (cai_adamw_span){(float *)params->data + g->off,
                                         (const float *)grads->data + g->off,
                                         o->m + g->off,
                                         o->v + g->off,
                                         params_lowp ? (char *)params_lowp->data + g->off * les : NULL,
                                         g->n,
                                         g->decay};
    }
    CAI_CALL(cai_adamw_spans(dev, o->spans, n, params_lowp ? params_lowp->dtype : CAI_DTYPE_F32, &p, 0));
    o->step = step;
    if (lr_used) *lr_used = p.lr;
    return CAI_OK;
}
