/* LoRA in a training app (lora_app.h). */
#include "cai_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lora_app.h"

int lora_app_on(const lora_app_options *o) { return o->rank > 0 || (o->init && *o->init); }

cai_status lora_app_check(const lora_app_options *o, const tc_options *tr) {
    if (!lora_app_on(o)) return CAI_OK;
    if (tr->zero_stage > 0 || tr->zero_offload)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "LoRA (lora.rank=%d%s%s) with zero.stage=%d%s: the adapters are the only trainable "
                         "parameters and small; they train replicated with zero.stage=0 and no offload",
                         o->rank, *o->init ? ", lora.init=" : "", o->init, tr->zero_stage,
                         tr->zero_offload ? " and zero.offload=true" : "");
    if (tr->precision == TC_PRECISION_F16)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "LoRA with precision=f16: a LoRA run has no dynamic loss scaling; use precision bf16 or "
                         "f32");
    return CAI_OK;
}

cai_status lora_app_create(lora_app *a, const lora_app_options *o, cai_device_t *dev, const cai_model_config *resolved,
                           uint64_t seed, int dp_rank) {
    cai_lora_config lc = cai_lora_config_default();
    lc.seed = seed;
    lc.dropout_rank = (uint64_t)dp_rank;
    lc.dropout = (float)o->dropout;
    if (*o->init) {
        CAI_CALL(cai_lora_peft_config(o->init, &lc, a->targets, sizeof a->targets));
        if (o->rank && o->rank != lc.rank)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "lora.rank=%d but lora.init=%s holds rank %d adapters (leave lora.rank at 0 to take the "
                             "file's)",
                             o->rank, o->init, lc.rank);
        lc.dropout = (float)o->dropout;
        lc.seed = seed;
        lc.dropout_rank = (uint64_t)dp_rank;
    } else {
        lc.rank = o->rank;
        lc.alpha = (float)o->alpha;
        snprintf(a->targets, sizeof a->targets, "%s",
                 *o->targets                           ? o->targets
                 : resolved->family == CAI_MODEL_LLAMA ? "q_proj,v_proj"
                                                       : "c_attn");
        lc.targets = a->targets;
    }
    return cai_lora_create(&a->l, dev, resolved, &lc);
}

cai_status lora_app_engine(lora_app *a, const lora_app_options *o, tc_engine *e, cai_run_t *run, const tc_options *tr,
                           int64_t steps, const cai_model_config *resolved, cai_model_options *mo, tc_init_fn init,
                           void *init_ctx) {
    mo->frozen = 1;
    CAI_CALL(cai_model_create(&e->model, cai_run_device(run), resolved, mo));
    if (init) CAI_CALL(init(init_ctx, run, e->model));
    CAI_CALL(cai_model_keep_compute(e->model)); /* the base never changes: no masters, no second copy */
    CAI_CALL(cai_model_set_lora(e->model, a->l));
    if (*o->init) CAI_CALL(cai_lora_import_peft(o->init, a->l));
    e->oc = tc_optim_config(tr, steps);
    CAI_CALL(cai_lora_optim_create(&a->o, a->l, cai_run_device(run), &e->oc));
    CAI_CALL(cai_lora_driver(e->model, a->l, a->o, cai_run_mesh(run), &e->driver, &a->driver_state));
    e->scaled = 0;
    return CAI_OK;
}

cai_status lora_app_save(lora_app *a, cai_run_t *run, cai_ckpt_meta *m, const char *dir, int keep, char *path,
                         size_t cap, cai_ckpt_stats *st) {
    return cai_lora_ckpt_save_step(cai_run_mesh(run), dir, keep, a->l, a->o, m, path, cap, st);
}

cai_status lora_app_load(lora_app *a, cai_run_t *run, const char *path, cai_ckpt_meta *m, cai_ckpt_stats *st) {
    return cai_lora_ckpt_load(cai_run_mesh(run), path, a->l, a->o, m, st);
}

cai_status lora_app_export(lora_app *a, cai_model_t *m, const char *run_dir, const char *base_model,
                           const char *tokenizer_dir) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/lora/adapter", run_dir);
    CAI_CALL(cai_lora_export_peft(dir, a->l, base_model));
    snprintf(dir, sizeof dir, "%s/lora/merged", run_dir);
    cai_hf_export_options eo = cai_hf_export_options_default();
    eo.tokenizer_dir = tokenizer_dir;
    CAI_CALL(cai_lora_export_merged(dir, m, a->l, &eo, NULL));
    printf("lora: wrote %s/lora/adapter (PEFT) and %s/lora/merged (Hugging Face, merged)\n", run_dir, run_dir);
    fflush(stdout);
    return CAI_OK;
}

void lora_app_print(const lora_app *a, const cai_model_t *m) {
    const cai_lora_config *c = cai_lora_config_of(a->l);
    size_t pbytes = 0, act = 0;
    cai_model_memory(m, &pbytes, &act);
    printf(
        "lora: rank %d, alpha %g (scale %g), dropout %g, targets %s: %d adapters, %llu trainable parameters; "
        "base frozen (%.1f MiB weights, no gradients or optimizer state)\n",
        c->rank, (double)c->alpha, (double)cai_lora_scale(a->l), (double)c->dropout, c->targets, cai_lora_count(a->l),
        (unsigned long long)cai_lora_numel(a->l), (double)pbytes / 1048576.0);
}

void lora_app_free(lora_app *a) {
    cai_optim_free(a->o);
    cai_lora_free(a->l);
    free(a->driver_state);
    a->o = NULL;
    a->l = NULL;
    a->driver_state = NULL;
}
