/* The training engine the training apps share (train_common.h). */
#include "cai_config.h"

#include <stdio.h>
#include <stdlib.h>

#include "train_common.h"

const char *tc_schedules[CAI_LR_KIND_COUNT + 1];
const char *const tc_precisions[] = {"auto", "f32", "bf16", "f16", NULL}; /* TC_PRECISION_* */
const char *const tc_reduce_dtypes[] = {"f32", "bf16", "fp8", NULL};

void tc_fill_choices(void) {
    for (int i = 0; i < CAI_LR_KIND_COUNT; i++) tc_schedules[i] = cai_lr_kind_name((cai_lr_kind)i);
}

cai_adamw_config tc_optim_config(const tc_options *c, int64_t steps) {
    cai_adamw_config o = cai_adamw_config_default();
    o.schedule = (cai_lr_schedule){(cai_lr_kind)c->schedule, (float)c->lr, (float)c->min_lr, c->warmup,
                                   c->decay_steps ? c->decay_steps : steps};
    o.beta1 = (float)c->beta1;
    o.beta2 = (float)c->beta2;
    o.eps = (float)c->eps;
    o.weight_decay = (float)c->weight_decay;
    o.grad_clip = (float)c->grad_clip;
    return o;
}

cai_zero_config tc_zero_config(const tc_options *c) {
    cai_zero_config z;
    cai_zero_config_init(&z);
    z.stage = c->zero_stage;
    z.offload = c->zero_offload;
    z.bucket_bytes = (size_t)(c->zero_bucket_mb * 1048576.0);
    z.overlap = c->zero_overlap;
    z.reduce_dtype = c->zero_reduce_dtype == 1 ? CAI_DTYPE_BF16 : CAI_DTYPE_F32;
    z.reduce_fp8 = c->zero_reduce_dtype == 2;
    z.reduce_only = z.stage == 0 && !z.offload;
    return z;
}

/* The one loss-scale config: validated at start-up and the one that runs. */
cai_loss_scale_config tc_loss_scale_config(const tc_options *c) {
    cai_loss_scale_config l = cai_loss_scale_config_default();
    l.init_scale = (float)c->ls_init;
    l.growth_interval = c->ls_window;
    l.hysteresis = c->ls_hysteresis;
    l.min_scale = (float)c->ls_min;
    l.max_scale = (float)c->ls_max;
    return l;
}

cai_status tc_check(const tc_options *c, int64_t steps) {
    cai_loss_scale_config l = tc_loss_scale_config(c);
    CAI_CALL(cai_loss_scale_config_check(&l));
    cai_adamw_config o = tc_optim_config(c, steps);
    CAI_CALL(cai_adamw_config_check(&o));
    return CAI_OK;
}

void tc_apply_precision(const tc_options *c, const cai_device_t *dev, cai_model_config *m) {
    if (c->precision == TC_PRECISION_AUTO) return;
    cai_dtype dt = c->precision == TC_PRECISION_BF16  ? CAI_DTYPE_BF16
                   : c->precision == TC_PRECISION_F16 ? CAI_DTYPE_F16
                                                      : CAI_DTYPE_F32;
    m->param_dtype = dt;
    m->act_dtype = dev->kind == CAI_DEVICE_HOST ? CAI_DTYPE_F32 : dt;
}

cai_fp8_config tc_fp8_config(const tc_options *o) {
    cai_fp8_config f = cai_fp8_config_default();
    f.enabled = o->fp8 != 0;
    f.hybrid = o->fp8_format == 1;
    f.recipe = (cai_fp8_recipe_kind)o->fp8_recipe;
    f.amax_algo = (cai_fp8_amax_algo)o->fp8_amax_algo;
    f.amax_history = o->fp8_history;
    f.margin = o->fp8_margin;
    snprintf(f.layers, sizeof f.layers, "%s", o->fp8_layers ? o->fp8_layers : "auto");
    return f;
}

cai_status tc_engine_create(tc_engine *e, cai_run_t *run, const tc_options *o, int64_t steps,
                            const cai_model_config *resolved, cai_model_options *mo, tc_init_fn init, void *init_ctx) {
    e->zc = tc_zero_config(o);
    cai_zero_model_options(&e->zc, mo);
    CAI_CALL(cai_model_create(&e->model, cai_run_device(run), resolved, mo));
    if (o->fp8) {
        const cai_fp8_config f = tc_fp8_config(o);
        CAI_CALL(cai_model_set_fp8(e->model, &f, cai_run_mesh(run)));
        if (cai_run_rank(run) == 0)
            printf("fp8: blocks '%s' of %d in FP8 (%s, %s recipe, amax %s over %d steps, margin %d)\n", f.layers,
                   resolved->n_layers, cai_fp8_format_names[f.hybrid], cai_fp8_recipe_names[f.recipe],
                   cai_fp8_amax_algo_names[f.amax_algo], f.amax_history, f.margin);
    }
    /* before the engine: stage 0 keeps (and offload copies) the model's weights as they are now */
    if (init) CAI_CALL(init(init_ctx, run, e->model));
    e->oc = tc_optim_config(o, steps);
    if (e->zc.reduce_only) CAI_CALL(cai_optim_create_for_model(&e->optim, e->model, &e->oc));
    CAI_CALL(cai_zero_create(&e->zero, cai_run_mesh(run), e->model, &e->zc));
    return CAI_OK;
}

cai_status tc_engine_ready(tc_engine *e, cai_run_t *run, const tc_options *o, const cai_model_config *resolved,
                           int zero_driver) {
    if (zero_driver) CAI_CALL(cai_zero_driver(e->zero, e->optim, &e->driver));
    e->scaled = resolved->param_dtype == CAI_DTYPE_F16 || resolved->act_dtype == CAI_DTYPE_F16;
    cai_loss_scale_config lsc = tc_loss_scale_config(o);
    cai_loss_scaler_init(&e->scaler, &lsc);
    /* At ep > 1 the dp ranks hold different experts: no replicas to compare. */
    if (e->zc.reduce_only && cai_model_view(e->model)->ep_size <= 1)
        CAI_CALL(cai_dp_check_replicas(cai_run_mesh(run), e->model));
    return CAI_OK;
}

void tc_engine_free(tc_engine *e) {
    cai_optim_free(e->optim);
    cai_zero_free(e->zero);
    cai_model_free(e->model);
    e->optim = NULL;
    e->zero = NULL;
    e->model = NULL;
}

cai_status tc_engine_step(tc_engine *e, cai_run_t *run, int64_t step, const int32_t *tokens, const int32_t *targets,
                          int n_micro, cai_step_stats *st) {
    CAI_CALL(cai_train_step(&e->driver, &e->oc, e->scaled ? &e->scaler : NULL, tokens, targets, n_micro, st));
    if (st->skipped && cai_run_rank(run) == 0)
        printf("step %lld skipped: gradients overflowed at loss scale %g (now %g)\n", (long long)step,
               (double)st->loss_scale, (double)e->scaler.scale);
    return CAI_OK;
}

cai_status tc_engine_save(tc_engine *e, cai_run_t *run, cai_ckpt_meta *m, const char *dir, int keep, char *path,
                          size_t cap, cai_ckpt_stats *st) {
    /* Fewer than `step` when f16 steps were skipped: the schedule follows the updates. */
    m->optim_step = e->optim ? cai_optim_step_count(e->optim) : cai_zero_step_count(e->zero);
    if (e->scaled) {
        m->loss_scale = e->scaler.scale;
        m->loss_scale_good_steps = e->scaler.good_steps;
        m->loss_scale_hysteresis_left = e->scaler.hysteresis_left;
        m->loss_scale_overflows = e->scaler.overflows;
    }
    /* the FP8 scaling state rides along; it stays the model's */
    size_t n = 0;
    if (cai_model_fp8(e->model)) CAI_CALL(cai_fp8_gather_state(cai_model_fp8(e->model)));
    const float *fp8 = cai_fp8_state(cai_model_fp8(e->model), &n);
    m->fp8_state = (float *)fp8;
    m->fp8_state_len = n;
    cai_status s = cai_ckpt_save_step_zero(cai_run_mesh(run), dir, keep, e->zero, e->optim, &e->oc, m, path, cap, st);
    m->fp8_state = NULL;
    m->fp8_state_len = 0;
    return s;
}

cai_status tc_engine_load(tc_engine *e, cai_run_t *run, const char *path, cai_ckpt_meta *m, cai_ckpt_stats *st) {
    CAI_CALL(cai_ckpt_load_zero(cai_run_mesh(run), path, e->zero, e->optim, m, st));
    cai_fp8_t *fp8 = cai_model_fp8(e->model);
    cai_status fs = CAI_OK;
    if (fp8 && m->fp8_state) fs = cai_fp8_set_state(fp8, m->fp8_state, m->fp8_state_len);
    else if (fp8 && cai_run_rank(run) == 0)
        printf("fp8: %s holds no FP8 scaling state; the scales start afresh\n", path);
    free(m->fp8_state);
    m->fp8_state = NULL;
    m->fp8_state_len = 0;
    CAI_CALL(fs);
    if (e->scaled) { /* f16: the dynamic loss scale continues where it was */
        e->scaler.scale = (float)m->loss_scale;
        e->scaler.good_steps = (int)m->loss_scale_good_steps;
        e->scaler.hysteresis_left = (int)m->loss_scale_hysteresis_left;
        e->scaler.overflows = m->loss_scale_overflows;
    }
    return CAI_OK;
}

void tc_engine_print_optim(const tc_engine *e) {
    const cai_adamw_config *oc = &e->oc;
    printf("optim: AdamW lr %g, %s to %g over %lld steps after %lld warmup, betas (%g, %g), weight decay %g, clip %g\n",
           (double)oc->schedule.lr, cai_lr_kind_name(oc->schedule.kind), (double)oc->schedule.min_lr,
           (long long)oc->schedule.decay_steps, (long long)oc->schedule.warmup_steps, (double)oc->beta1,
           (double)oc->beta2, (double)oc->weight_decay, (double)oc->grad_clip);
}

void tc_engine_print_zero(const tc_engine *e, const tc_options *c, int dp) {
    const cai_model_config *mc = cai_model_config_of(e->model);
    cai_zero_stats zs;
    cai_zero_get_stats(e->zero, &zs);
    printf("zero: stage %d%s over dp %d, %d gradient bucket%s of <= %g MiB%s; weights %s, compute %s%s\n",
           c->zero_stage, c->zero_offload ? " + CPU offload" : "", dp, zs.n_buckets, zs.n_buckets == 1 ? "" : "s",
           c->zero_bucket_mb,
           c->zero_reduce_dtype == 1   ? " reduced in bf16"
           : c->zero_reduce_dtype == 2 ? " reduced as FP8 (E5M2)"
                                       : "",
           cai_dtype_name(mc->param_dtype), cai_dtype_name(mc->act_dtype), e->scaled ? ", dynamic loss scaling" : "");
}

/* ------------------------------------------------------------------ pipelines */

const char *const tc_pp_schedules[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", NULL};

cai_status tc_pp_layout(const tc_pp_options *o, int n_layers, int grad_accum, int act_ckpt, cai_pp_spec *spec_out,
                        int *stage_of) {
    cai_pp_spec spec = {.pp = o->pp,
                        .virtual_stages = o->virtual_stages ? o->virtual_stages
                                                            : cai_pp_style_default_virtual((cai_pp_style)o->schedule),
                        .microbatches = grad_accum,
                        .style = (cai_pp_style)o->schedule};
    const int split = spec.style == CAI_PP_ZB_H1 || spec.style == CAI_PP_ZB_V;
    if (split && o->slots > 0)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "pp.act_slots=%d: %s keeps every forward's activations until its weight pass and never "
                         "recomputes; leave pp.act_slots at 0",
                         o->slots, tc_pp_schedules[o->schedule]);
    if (split && act_ckpt)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "model.activation_checkpointing=true: %s's weight passes read every layer's saved "
                         "activations; turn checkpointing off or use 1f1b",
                         tc_pp_schedules[o->schedule]);
    if (spec.style == CAI_PP_ZB_V && spec.virtual_stages != 2)
        return CAI_ERROR(CAI_ERR_CONFIG, "pp.virtual=%d: pp.schedule=zb-v runs two model chunks per rank, in a V",
                         spec.virtual_stages);
    if (spec.style != CAI_PP_INTERLEAVED && spec.style != CAI_PP_ZB_V && spec.virtual_stages != 1)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "pp.virtual=%d: pp.schedule=%s runs one model chunk per rank (interleaved runs more)",
                         spec.virtual_stages, tc_pp_schedules[o->schedule]);
    cai_status st = cai_pp_spec_validate(&spec);
    if (st != CAI_OK) {
        cai_error_push(__FILE__, __LINE__, __func__, "train.grad_accum is the pipeline's microbatches per step");
        return st;
    }
    const int V = spec.pp * spec.virtual_stages, L = n_layers;
    if (!o->layers || !o->layers[0]) {
        if (L % V != 0) {
            int lo = L / V * V, hi = (L / V + 1) * V;
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "model.n_layers=%d does not divide over mesh.pp=%d x pp.virtual=%d = %d virtual stages "
                             "(%d or %d layers would; or give each stage's count in pp.layers)",
                             L, spec.pp, spec.virtual_stages, V, lo > 0 ? lo : hi, hi);
        }
        if (stage_of)
            for (int l = 0; l < L; l++) stage_of[l] = l / (L / V);
    } else {
        const char *s = o->layers;
        int k = 0, sum = 0;
        while (*s) {
            char *end = NULL;
            long n = strtol(s, &end, 10);
            if (end == s || n < 1 || n > L)
                return CAI_ERROR(CAI_ERR_CONFIG,
                                 "pp.layers=\"%s\": entry %d is not a layer count in [1, %d] (comma-separated, one per "
                                 "virtual stage)",
                                 o->layers, k + 1, L);
            if (stage_of)
                for (long i = 0; i < n && sum + i < L; i++) stage_of[sum + i] = k;
            sum += (int)n;
            k++;
            s = *end == ',' ? end + 1 : end;
            if (*end && *end != ',')
                return CAI_ERROR(CAI_ERR_CONFIG, "pp.layers=\"%s\": '%c' after entry %d (counts separated by commas)",
                                 o->layers, *end, k);
        }
        if (k != V || sum != L)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "pp.layers=\"%s\" gives %d virtual stages of %d layers in all; mesh.pp=%d x "
                             "pp.virtual=%d needs %d counts summing to model.n_layers=%d",
                             o->layers, k, sum, spec.pp, spec.virtual_stages, V, L);
    }
    if (spec_out) *spec_out = spec;
    return CAI_OK;
}

cai_status tc_pp_init(tc_pp *p, const tc_pp_options *o, int n_layers, int grad_accum, int act_ckpt, int pp_rank) {
    CAI_CALL(cai_calloc((void **)&p->stage_of, (size_t)n_layers, sizeof *p->stage_of, "pipeline layer split"));
    CAI_CALL(tc_pp_layout(o, n_layers, grad_accum, act_ckpt, &p->spec, p->stage_of));
    CAI_CALL(cai_pipeline_slots_needed(&p->spec, pp_rank, &p->slots_needed));
    p->slots = o->slots > 0 && o->slots < p->slots_needed ? o->slots : p->slots_needed;
    return CAI_OK;
}

void tc_pp_view(const tc_pp *p, cai_rank_view *v) {
    v->pp_chunks = p->spec.virtual_stages;
    v->layer_vstage = p->stage_of;
    v->pp_vshape = p->spec.style == CAI_PP_ZB_V;
}

int tc_pp_split_backward(const tc_pp *p) { return p->spec.style == CAI_PP_ZB_H1 || p->spec.style == CAI_PP_ZB_V; }

void tc_pp_free(tc_pp *p) {
    cai_free(p->stage_of);
    p->stage_of = NULL;
}
