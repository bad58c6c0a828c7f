/* What the training apps (colossal-pretrain, colossal-sft) share: the
 * optimizer, ZeRO, precision and loss-scale keys, and the engine built from
 * them (model, AdamW, ZeRO engine, loss scaler, step driver) with its step,
 * checkpoint and header pieces. The apps differ in their data, their model's
 * source and their loss; what trains the model is this. */
#ifndef COLOSSAL_APP_TRAIN_COMMON_H
#define COLOSSAL_APP_TRAIN_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/ckpt.h"
#include "colossal/config.h"
#include "colossal/model.h"
#include "colossal/optim.h"
#include "colossal/parallel.h"
#include "colossal/run.h"

typedef struct {
    /* optim */
    int schedule; /* a cai_lr_kind */
    double lr, min_lr, beta1, beta2, eps, weight_decay, grad_clip;
    int64_t warmup, decay_steps;
    /* ZeRO and precision (docs/parallel.md) */
    int zero_stage, zero_offload, zero_overlap, zero_overlap_ctas, zero_reduce_dtype;
    int precision, ls_window, ls_hysteresis;
    double zero_bucket_mb, ls_init, ls_min, ls_max;
    /* FP8 linear layers (docs/fp8.md) */
    int fp8, fp8_format, fp8_recipe, fp8_amax_algo, fp8_history, fp8_margin;
    char *fp8_layers;
} tc_options;

enum { TC_PRECISION_AUTO = 0, TC_PRECISION_F32, TC_PRECISION_BF16, TC_PRECISION_F16 };

/* Choices of the enum keys; tc_fill_choices fills the schedules from the
 * library's names before the config is parsed. */
extern const char *tc_schedules[CAI_LR_KIND_COUNT + 1];
extern const char *const tc_precisions[];
extern const char *const tc_reduce_dtypes[];
void tc_fill_choices(void);

/* lo > hi is CAI_CFG_NO_RANGE, spelled out: a macro argument cannot be two. */
#define TC_FIELD(type, m, key, t, field, def, doc, lo, hi, choices) \
    { key, t, offsetof(type, m.field), def, doc, lo, hi, choices, NULL }
#define TC_BIG 1e15

/* optim.*: list TC_OPTIM_FIELDS(app_struct, member, "1e-3", "1e-4") in the
 * field table, `member` a tc_options; the defaults of optim.lr and
 * optim.min_lr (an app's cosine decays, never rises). */
#define TC_OPTIM_FIELDS(type, m, default_lr, default_min_lr)                                                          \
    TC_FIELD(type, m, "optim.schedule", CAI_CFG_ENUM, schedule, "cosine", "learning rate after the linear warmup",    \
             1.0, 0.0, tc_schedules),                                                                                 \
        TC_FIELD(type, m, "optim.lr", CAI_CFG_DOUBLE, lr, default_lr, "peak learning rate", 0, 10, NULL),             \
        TC_FIELD(type, m, "optim.min_lr", CAI_CFG_DOUBLE, min_lr, default_min_lr,                                     \
                 "learning rate at the end of the decay", 0, 10, NULL),                                               \
        TC_FIELD(type, m, "optim.warmup_steps", CAI_CFG_INT64, warmup, "20", "linear warmup steps", 0, TC_BIG, NULL), \
        TC_FIELD(type, m, "optim.decay_steps", CAI_CFG_INT64, decay_steps, "0",                                       \
                 "step at which the decay reaches min_lr; 0: train.steps", 0, TC_BIG, NULL),                          \
        TC_FIELD(type, m, "optim.beta1", CAI_CFG_DOUBLE, beta1, "0.9", "AdamW beta1", 0, 1, NULL),                    \
        TC_FIELD(type, m, "optim.beta2", CAI_CFG_DOUBLE, beta2, "0.95", "AdamW beta2", 0, 1, NULL),                   \
        TC_FIELD(type, m, "optim.eps", CAI_CFG_DOUBLE, eps, "1e-8", "AdamW epsilon", 0, 1, NULL),                     \
        TC_FIELD(type, m, "optim.weight_decay", CAI_CFG_DOUBLE, weight_decay, "0.1",                                  \
                 "decoupled weight decay (matrices only)", 0, 10, NULL),                                              \
        TC_FIELD(type, m, "optim.grad_clip", CAI_CFG_DOUBLE, grad_clip, "1.0",                                        \
                 "maximum global gradient norm; 0: no clipping", 0, 1e9, NULL)

/* zero.*, precision and loss_scale.* */
#define TC_ZERO_FIELDS(type, m)                                                                                                              \
    TC_FIELD(type, m, "zero.stage", CAI_CFG_INT, zero_stage, "0",                                                                            \
             "ZeRO stage over mesh.dp: 0 replicated, 1 optimizer state sharded, 2 + gradients, 3 + weights", 0, 3,                           \
             NULL),                                                                                                                          \
        TC_FIELD(type, m, "zero.offload", CAI_CFG_BOOL, zero_offload, "false",                                                               \
                 "keep f32 master weights and AdamW moments in host memory and step there", 1.0, 0.0, NULL),                                 \
        TC_FIELD(type, m, "zero.bucket_mb", CAI_CFG_DOUBLE, zero_bucket_mb, "25",                                                            \
                 "gradient bucket (MiB of f32 gradients) reduced as soon as its layers' backward finishes", 1e-3, 1e6,                       \
                 NULL),                                                                                                                      \
        TC_FIELD(                                                                                                                            \
            type, m, "zero.reduce_dtype", CAI_CFG_ENUM, zero_reduce_dtype, "f32",                                                            \
            "dtype gradient reductions move in: f32, bf16 (half the bytes), or fp8 (a quarter: E5M2 codes scaled per chunk, summed in f32)", \
            1.0, 0.0, tc_reduce_dtypes),                                                                                                     \
        TC_FIELD(type, m, "zero.overlap", CAI_CFG_BOOL, zero_overlap, "true",                                                                \
                 "reduce each bucket during the backward; false: all of them after it (for comparison)", 1.0, 0.0,                           \
                 NULL),                                                                                                                      \
        TC_FIELD(type, m, "zero.overlap_ctas", CAI_CFG_INT, zero_overlap_ctas, "4",                                                          \
                 "GPU: thread blocks NCCL may use for reductions that overlap the backward (the last bucket gets "                           \
                 "all); 0: no limit",                                                                                                        \
                 0, 64, NULL),                                                                                                               \
        TC_FIELD(type, m, "precision", CAI_CFG_ENUM, precision, "auto",                                                                      \
                 "auto (model.param_dtype / act_dtype), f32, bf16 or f16 (dynamic loss scaling); masters stay f32",                          \
                 1.0, 0.0, tc_precisions),                                                                                                   \
        TC_FIELD(type, m, "loss_scale.initial", CAI_CFG_DOUBLE, ls_init, "65536", "f16: initial loss scale", 1, 1e30,                        \
                 NULL),                                                                                                                      \
        TC_FIELD(type, m, "loss_scale.growth_interval", CAI_CFG_INT, ls_window, "1000",                                                      \
                 "f16: good steps before the scale doubles", 1, 1 << 30, NULL),                                                              \
        TC_FIELD(type, m, "loss_scale.hysteresis", CAI_CFG_INT, ls_hysteresis, "2",                                                          \
                 "f16: overflows tolerated before the scale halves", 1, 1 << 20, NULL),                                                      \
        TC_FIELD(type, m, "loss_scale.min", CAI_CFG_DOUBLE, ls_min, "1", "f16: smallest loss scale", 1e-30, 1e30,                            \
                 NULL),                                                                                                                      \
        TC_FIELD(type, m, "loss_scale.max", CAI_CFG_DOUBLE, ls_max, "16777216", "f16: largest loss scale", 1e-30,                            \
                 1e30, NULL),                                                                                                                \
        TC_FIELD(type, m, "fp8.enabled", CAI_CFG_BOOL, fp8, "false",                                                                         \
                 "FP8 matrix products in the linear layers of the blocks fp8.layers selects (docs/fp8.md)", 1.0, 0.0,                        \
                 NULL),                                                                                                                      \
        TC_FIELD(type, m, "fp8.format", CAI_CFG_ENUM, fp8_format, "hybrid",                                                                  \
                 "hybrid: E4M3 activations and weights, E5M2 gradients; e4m3: E4M3 everywhere", 1.0, 0.0,                                    \
                 cai_fp8_format_names),                                                                                                      \
        TC_FIELD(type, m, "fp8.recipe", CAI_CFG_ENUM, fp8_recipe, "delayed",                                                                 \
                 "delayed: scales from the amax history of earlier steps; current: from each tensor's own amax", 1.0,                        \
                 0.0, cai_fp8_recipe_names),                                                                                                 \
        TC_FIELD(type, m, "fp8.amax_algo", CAI_CFG_ENUM, fp8_amax_algo, "max",                                                               \
                 "delayed recipe: the amax a scale comes from, the history's max or its most recent", 1.0, 0.0,                              \
                 cai_fp8_amax_algo_names),                                                                                                   \
        TC_FIELD(type, m, "fp8.amax_history", CAI_CFG_INT, fp8_history, "1024", "steps of amax history per tensor", 1,                       \
                 65536, NULL),                                                                                                               \
        TC_FIELD(type, m, "fp8.margin", CAI_CFG_INT, fp8_margin, "0", "scale = fp8_max / amax / 2^margin", 0, 64,                            \
                 NULL),                                                                                                                      \
        TC_FIELD(type, m, "fp8.layers", CAI_CFG_STRING, fp8_layers, "auto",                                                                  \
                 "blocks in FP8: auto (all but the first and last), all, none, or a list like 1-4,7", 1.0, 0.0, NULL)

/* AdamW with its schedule decaying over `steps` unless optim.decay_steps. */
cai_adamw_config tc_optim_config(const tc_options *o, int64_t steps);
/* Stage 0 without offload keeps the model's own buffers and optimizer; the
 * engine then only reduces the gradient buckets. */
cai_zero_config tc_zero_config(const tc_options *o);
cai_loss_scale_config tc_loss_scale_config(const tc_options *o);
/* The optimizer and loss-scale keys, checked before anything is built. */
cai_status tc_check(const tc_options *o, int64_t steps);
/* precision=f32/bf16/f16 sets the working weights; the CPU backend computes
 * in f32 over them, a GPU in the same dtype. */
void tc_apply_precision(const tc_options *o, const cai_device_t *dev, cai_model_config *m);
/* The fp8.* keys as a cai_fp8_config (enabled = fp8.enabled). */
cai_fp8_config tc_fp8_config(const tc_options *o);

/* What trains the model. */
typedef struct {
    cai_model_t *model;
    cai_optim_t *optim; /* stage 0 without offload; else the engine holds the optimizer state */
    cai_zero_t *zero;   /* gradient buckets and ZeRO */
    cai_step_driver driver;
    cai_adamw_config oc;
    cai_zero_config zc;
    cai_loss_scaler scaler;
    int scaled; /* f16: dynamic loss scaling */
} tc_engine;

/* Weights into a new model (an import) before the engine takes them. */
typedef cai_status (*tc_init_fn)(void *ctx, cai_run_t *run, cai_model_t *m);

/* The model (options `mo`, which this completes with the engine's), its
 * weights from `init` when given (else its own initialisation), the
 * optimizer and the ZeRO engine over dp. `init` takes effect at ZeRO stage
 * 0 only: stages >= 1 initialise their shards from the registry; weights
 * for any stage go into the engine afterwards (cai_zero_load_params,
 * cai_hf_import_zero, cai_ckpt_load_zero_weights). Collective over dp. */
cai_status tc_engine_create(tc_engine *e, cai_run_t *run, const tc_options *o, int64_t steps,
                            const cai_model_config *resolved, cai_model_options *mo, tc_init_fn init, void *init_ctx);
/* Then, once the app has set e->driver or asks for the ZeRO engine's
 * (zero_driver): the loss scaler, and at stage 0 the dp replicas checked
 * equal. Collective over dp. */
cai_status tc_engine_ready(tc_engine *e, cai_run_t *run, const tc_options *o, const cai_model_config *resolved,
                           int zero_driver);
void tc_engine_free(tc_engine *e);
/* One optimizer step over n_micro microbatches of [B, T] tokens and
 * targets; rank 0 reports a step f16 overflow skipped. Collective over the
 * driver's axes. */
cai_status tc_engine_step(tc_engine *e, cai_run_t *run, int64_t step, const int32_t *tokens, const int32_t *targets,
                          int n_micro, cai_step_stats *st);
/* Checkpoint: the optimizer's step count and the loss scale into `m`, then
 * the weights and optimizer state under any layout. Collective over the
 * world. */
cai_status tc_engine_save(tc_engine *e, cai_run_t *run, cai_ckpt_meta *m, const char *dir, int keep, char *path,
                          size_t cap, cai_ckpt_stats *st);
/* Any layout: the optimizer state reshards onto this run's dp, stage and
 * offload; the loss scale continues. Collective over the world. */
cai_status tc_engine_load(tc_engine *e, cai_run_t *run, const char *path, cai_ckpt_meta *m, cai_ckpt_stats *st);
/* The header's optim: and zero: lines (rank 0). */
void tc_engine_print_optim(const tc_engine *e);
void tc_engine_print_zero(const tc_engine *e, const tc_options *o, int dp);

/* ------------------------------------------------------------------ pipelines (mesh.pp > 1) */

/* pp.schedule's choices, in cai_pp_style order (colossal/schedule.h). */
extern const char *const tc_pp_schedules[];

/* pp.schedule, pp.virtual, pp.layers and pp.act_slots into the app struct's
 * fields (an int, an int, a char *, an int). */
#define TC_PP_FIELD(type, key, t, field, def, doc, lo, hi, choices) \
    { key, t, offsetof(type, field), def, doc, lo, hi, choices, NULL }
#define TC_PP_FIELDS(type, schedule, virtual_stages, layers, slots)                                                   \
    TC_PP_FIELD(type, "pp.schedule", CAI_CFG_ENUM, schedule, "1f1b",                                                  \
                "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1 or zb-v (zero bubble: each backward split into "  \
                "an input pass and a weight pass that fills the bubbles; zb-v runs two chunks per rank in a V)",      \
                1.0, 0.0, tc_pp_schedules),                                                                           \
        TC_PP_FIELD(type, "pp.virtual", CAI_CFG_INT, virtual_stages, "0",                                             \
                    "model chunks per pipeline rank (interleaved: >= 2, virtual stage k sits on rank k % mesh.pp; "   \
                    "zb-v: 2, in a V); 0: 2 for interleaved and zb-v, else 1",                                        \
                    0, 1024, NULL),                                                                                   \
        TC_PP_FIELD(type, "pp.layers", CAI_CFG_STRING, layers, "",                                                    \
                    "layers of each virtual stage in order, comma-separated (mesh.pp x pp.virtual counts summing to " \
                    "the model's layers); empty: an even split",                                                      \
                    1.0, 0.0, NULL),                                                                                  \
        TC_PP_FIELD(type, "pp.act_slots", CAI_CFG_INT, slots, "0",                                                    \
                    "microbatch activations a pipeline rank keeps for its backward; 0: as many as the schedule has "  \
                    "in flight (nothing recomputed); fewer: the rest recompute their forward",                        \
                    0, 1 << 20, NULL)

/* The pipeline keys the apps share; `layers` may be NULL or empty (an even
 * split), slots 0 (what the schedule keeps in flight). */
typedef struct {
    int pp, schedule, virtual_stages, slots;
    const char *layers;
} tc_pp_options;

/* The pipeline's spec (train.grad_accum microbatches) and, when stage_of
 * is given (n_layers entries), the virtual stage of each layer from
 * pp.layers or an even split. Refuses what the executor would not run:
 * microbatches the schedule cannot take, chunk counts it does not run,
 * layers that do not fill the virtual stages, a split backward with
 * recompute. Not collective. */
cai_status tc_pp_layout(const tc_pp_options *o, int n_layers, int grad_accum, int act_ckpt, cai_pp_spec *spec,
                        int *stage_of);

/* This rank's part of a pipeline: the layer split and activation slots. */
typedef struct {
    cai_pp_spec spec;
    int *stage_of;           /* virtual stage of each layer */
    int slots, slots_needed; /* this rank's activation slots, and the schedule's in-flight peak */
} tc_pp;

/* tc_pp_layout for pipeline rank pp_rank, and its activation slots. */
cai_status tc_pp_init(tc_pp *p, const tc_pp_options *o, int n_layers, int grad_accum, int act_ckpt, int pp_rank);
/* The view's chunks and layer split (it must outlive the view). */
void tc_pp_view(const tc_pp *p, cai_rank_view *v);
/* Whether the schedule splits each backward into input and weight passes. */
int tc_pp_split_backward(const tc_pp *p);
void tc_pp_free(tc_pp *p);

#endif
