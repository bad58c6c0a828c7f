/* LoRA in a training app (colossal-sft): the lora.* keys and what a LoRA run
 * builds instead of the full fine-tuning engine — a frozen model with the
 * adapters (colossal/lora.h), AdamW over the adapters only and the LoRA
 * step driver — with its checkpoints, resume and end-of-run exports (the
 * PEFT adapter directory and the merged Hugging Face model). docs/sft.md
 * "LoRA". */
#ifndef COLOSSAL_APP_LORA_APP_H
#define COLOSSAL_APP_LORA_APP_H

#include "colossal/lora.h"
#include "train_common.h"

typedef struct {
    int rank;
    double alpha, dropout;
    char *targets, *init;
    int export_on;
} lora_app_options;

#define LORA_APP_FIELD(type, m, key, t, field, def, doc, lo, hi) \
    { key, t, offsetof(type, m.field), def, doc, lo, hi, NULL, NULL }
/* lora.*: list LORA_APP_FIELDS(app_struct, member) in the field table. */
#define LORA_APP_FIELDS(type, m)                                                                                       \
    LORA_APP_FIELD(type, m, "lora.rank", CAI_CFG_INT, rank, "0",                                                       \
                   "LoRA adapter rank r; 0: full fine-tuning (every weight trains) unless lora.init is set", 0,        \
                   65536),                                                                                             \
        LORA_APP_FIELD(type, m, "lora.alpha", CAI_CFG_DOUBLE, alpha, "16",                                             \
                       "LoRA alpha: the adapters are scaled by alpha / rank", 0, 1e9),                                 \
        LORA_APP_FIELD(type, m, "lora.dropout", CAI_CFG_DOUBLE, dropout, "0",                                          \
                       "dropout on the adapters' input during training steps (never in evaluation)", 0, 0.999),        \
        LORA_APP_FIELD(type, m, "lora.targets", CAI_CFG_STRING, targets, "",                                           \
                       "Hugging Face module names to adapt, comma separated, matched as PEFT's target_modules (Llama " \
                       "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj; GPT-2 c_attn c_proj attn.c_proj "     \
                       "mlp.c_proj c_fc; all-linear); empty: PEFT's default (Llama q_proj,v_proj; GPT-2 c_attn)",      \
                       1.0, 0.0),                                                                                      \
        LORA_APP_FIELD(                                                                                                \
            type, m, "lora.init", CAI_CFG_STRING, init, "",                                                            \
            "PEFT adapter directory (adapter_config.json, adapter_model.safetensors) to continue training; "           \
            "its r, lora_alpha and target_modules are the run's",                                                      \
            1.0, 0.0),                                                                                                 \
        LORA_APP_FIELD(type, m, "lora.export", CAI_CFG_BOOL, export_on, "true",                                        \
                       "at the end of a LoRA run write run.dir/lora/adapter (PEFT) and run.dir/lora/merged (Hugging "  \
                       "Face, W + scale B A)",                                                                         \
                       1.0, 0.0)

typedef struct {
    cai_lora_t *l;
    cai_optim_t *o;
    void *driver_state;
    char targets[1024];
} lora_app;

/* A LoRA run: lora.rank > 0 or lora.init set. */
int lora_app_on(const lora_app_options *o);
/* What a LoRA run refuses, from the config alone (ZeRO stages, offload, f16). */
cai_status lora_app_check(const lora_app_options *o, const tc_options *tr);
/* The adapters for the resolved model: from lora.* or lora.init's config.
 * Not collective (every rank reads the same files). */
cai_status lora_app_create(lora_app *a, const lora_app_options *o, cai_device_t *dev, const cai_model_config *resolved,
                           uint64_t seed, int dp_rank);
/* The engine of a LoRA run in `e` (model frozen, weights from init, the
 * adapters attached and imported from lora.init, AdamW over them, the LoRA
 * driver). Collective over the world (init may read a checkpoint). */
cai_status lora_app_engine(lora_app *a, const lora_app_options *o, tc_engine *e, cai_run_t *run, const tc_options *tr,
                           int64_t steps, const cai_model_config *resolved, cai_model_options *mo, tc_init_fn init,
                           void *init_ctx);
cai_status lora_app_save(lora_app *a, cai_run_t *run, cai_ckpt_meta *m, const char *dir, int keep, char *path,
                         size_t cap, cai_ckpt_stats *st);
cai_status lora_app_load(lora_app *a, cai_run_t *run, const char *path, cai_ckpt_meta *m, cai_ckpt_stats *st);
/* rank 0: run_dir/lora/adapter and run_dir/lora/merged (tokenizer_dir's
 * files copied when not empty). */
cai_status lora_app_export(lora_app *a, cai_model_t *m, const char *run_dir, const char *base_model,
                           const char *tokenizer_dir);
void lora_app_print(const lora_app *a, const cai_model_t *m);
void lora_app_free(lora_app *a);

#endif
