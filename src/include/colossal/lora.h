/* LoRA: low-rank adapters on a frozen base model (src/model/lora.c, model
 * layer; the optimizer's driver in src/optim/lora_driver.c and the file
 * formats in src/ckpt/lora_io.c). See docs/sft.md "LoRA".
 *
 * An adapter on a linear layer y = x W^T (+ b), W [out, in], adds
 * scale * B (A (drop(x))) with A [r, in], B [out, r] and scale = alpha / r
 * (PEFT's LoraLayer, bias "none", no rsLoRA). Targets are Hugging Face
 * module names, matched as PEFT matches target_modules: a module's full
 * name equals the target or ends with "." + target, so "c_proj" is GPT-2's
 * attention and MLP projections and "attn.c_proj" the attention one only.
 * Llama's q_proj / k_proj / v_proj sit on the query / key / value rows of
 * colossal's fused QKV weight; GPT-2's c_attn on the whole of it (as in
 * transformers, where c_attn is one Conv1D).
 *
 * A is initialised like PEFT's (kaiming-uniform with a = sqrt(5): uniform
 * in +-1/sqrt(in)), B with zeros, so a fresh adapter changes nothing.
 * Adapter weights, gradients and optimizer state are F32; the base model
 * keeps its weights as they are and, created with
 * cai_model_options.frozen, has no gradient buffer at all.
 *
 * Dropout (PEFT's lora_dropout, inverted: kept inputs scaled by 1/(1-p))
 * acts on the adapter's input only, while a dropout key is set
 * (cai_lora_set_dropout_key, which the LoRA driver does for every
 * microbatch of a training step) and never after cai_lora_set_eval; the
 * mask of element (token n, feature j) is a pure function of (seed, key,
 * adapter, n, j), so the backward (and its recompute under activation
 * checkpointing) sees the forward's mask and a resumed run the same masks.
 * Nothing here is collective. */
#ifndef COLOSSAL_LORA_H
#define COLOSSAL_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/model.h"
#include "colossal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CAI_LORA_MAX_TARGETS 16
#define CAI_LORA_TARGET_MAX 64 /* bytes of one target name, NUL included */

typedef struct {
    int rank;      /* r >= 1 (0 means no LoRA: callers do not create one) */
    float alpha;   /* scale = alpha / rank; 0 means alpha = rank (scale 1) */
    float dropout; /* in [0, 1) */
    /* Hugging Face module names, comma separated ("q_proj,v_proj"); "all-linear": every adapted
     * projection of the family (PEFT's keyword; never the LM head). */
    const char *targets;
    uint64_t seed;         /* A's initialisation and the dropout masks */
    uint64_t dropout_rank; /* mixed into the masks: data-parallel ranks draw different ones */
} cai_lora_config;

/* rank 8, alpha 16, dropout 0.05, targets "q_proj,v_proj" (PEFT's Llama
 * defaults), seed 1234. */
cai_lora_config cai_lora_config_default(void);

/* Where in a block an adapter acts (the layers dispatch on these). */
typedef enum {
    CAI_LORA_SITE_QKV = 0, /* attn.qkv: rows [row_offset, row_offset + rows) of the fused output */
    CAI_LORA_SITE_ATTN_PROJ,
    CAI_LORA_SITE_FC, /* GPT-2 fc / Llama gate */
    CAI_LORA_SITE_UP,
    CAI_LORA_SITE_MLP_PROJ,
    CAI_LORA_SITE_COUNT
} cai_lora_site;

typedef struct cai_lora cai_lora_t;
/* One block's adapters, what cai_block_params.lora points at. */
typedef struct cai_lora_layer cai_lora_layer;

typedef struct {
    int layer;
    cai_lora_site site;
    int64_t row_offset, rows, in; /* B is [rows, r], A [r, in] */
    const char *hf_module;        /* "model.layers.3.self_attn.q_proj", "transformer.h.0.attn.c_attn" */
    const char *param;            /* the colossal weight it adapts: "h.3.attn.qkv.weight" */
    int a_index, b_index;         /* in cai_lora_registry */
} cai_lora_adapter;

/* Parse the targets against the family, register the adapters (their own
 * registry: "h.<l>.<module>.lora_a.weight" [r, in] and ".lora_b.weight"
 * [out, r], layer-placed, replicated), allocate F32 masters and gradients
 * on dev and initialise them from lc->seed. A target that matches no module
 * is CAI_ERR_CONFIG naming it and the module names the family has. cfg is
 * resolved here. Not collective. */
cai_status cai_lora_create(cai_lora_t **out, cai_device_t *dev, const cai_model_config *cfg, const cai_lora_config *lc);
void cai_lora_free(cai_lora_t *l);

const cai_lora_config *cai_lora_config_of(const cai_lora_t *l); /* targets: the normalised list */
float cai_lora_scale(const cai_lora_t *l);
cai_device_t *cai_lora_device(const cai_lora_t *l);
const cai_model_config *cai_lora_model_config(const cai_lora_t *l); /* the base's, resolved */
int cai_lora_count(const cai_lora_t *l);
const cai_lora_adapter *cai_lora_get(const cai_lora_t *l, int i);
/* The targets as given, split (n_targets of them). */
int cai_lora_targets(const cai_lora_t *l, const char *const **names);
const cai_registry_t *cai_lora_registry(const cai_lora_t *l);
size_t cai_lora_align_elems(const cai_lora_t *l);
/* Trainable elements (A and B of every adapter) and the flat layout's size. */
uint64_t cai_lora_numel(const cai_lora_t *l);
/* F32 masters and gradients, laid out by cai_registry_local_layout(
 * cai_lora_registry(l), single view, cai_lora_align_elems(l)). */
void cai_lora_flat(cai_lora_t *l, cai_tensor *params, cai_tensor *grads);
cai_status cai_lora_zero_grad(cai_lora_t *l);
/* Block `layer`'s adapters (NULL: out of range). */
const cai_lora_layer *cai_lora_layer_of(const cai_lora_t *l, int layer);

/* Host copies of adapter i's A [r, in] and B [rows, r] (row-major F32);
 * either may be NULL. write puts them into the masters. */
cai_status cai_lora_read(const cai_lora_t *l, int i, float *a, float *b);
cai_status cai_lora_write(cai_lora_t *l, int i, const float *a, const float *b);
/* w: colossal parameter `name`'s global F32 tensor [out, in] (host): adds
 * scale * B A of every adapter on it (the merged weight). Parameters
 * without adapters are left alone. */
cai_status cai_lora_merge(const cai_lora_t *l, const char *name, float *w);

/* Sizes the adapters' scratch for (batch, seq_len) microbatches in the
 * activations' dtype; the model calls it from cai_model_set_lora. With bf16
 * or f16 activations the matmuls read a copy of the adapters in that dtype
 * (their gradients still accumulate in F32) and dropout is refused. */
cai_status cai_lora_prepare(cai_lora_t *l, int batch, int seq_len, cai_dtype act_dtype);
/* After the F32 masters changed (an optimizer step, a load; cai_lora_write
 * does it itself): refresh the activations'-dtype copy (none with f32
 * activations). */
cai_status cai_lora_params_updated(cai_lora_t *l);
/* Dropout on with this key (a training microbatch's), or off. */
void cai_lora_set_dropout_key(cai_lora_t *l, uint64_t key);
void cai_lora_set_eval(cai_lora_t *l);

/* For the layers: the adapters of block `ll` at `site` (none: nothing
 * happens). x [B,T,in] is the linear's input, y [B,T,W] its whole output
 * (the adapters add into their rows). Backward: dy [B,T,W] the output's
 * gradient; the adapters' A and B gradients accumulate and dx [B,T,in]
 * (already holding the base linear's input gradient) gets theirs added. */
int cai_lora_at(const cai_lora_layer *ll, cai_lora_site site);
cai_status cai_lora_fwd(const cai_lora_layer *ll, cai_lora_site site, const cai_tensor *x, cai_tensor *y);
cai_status cai_lora_bwd(const cai_lora_layer *ll, cai_lora_site site, const cai_tensor *x, const cai_tensor *dy,
                        cai_tensor *dx);

/* HF module names of the family's adaptable linears in layer 0 ("..." with
 * the layer as {l}): what an unmatched target's error lists. */
const char *cai_lora_family_modules(cai_model_family f);

#ifdef __cplusplus
}
#endif

/* ======================================================================
 * Training and files: the optimizer's driver (src/optim/lora_driver.c) and
 * the checkpoint / PEFT / merged-export formats (src/ckpt/lora_io.c).
 * ====================================================================== */
#include "colossal/ckpt.h"
#include "colossal/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* AdamW over the adapters' flat layout (the base has no optimizer state).
 * Not collective. */
cai_status cai_lora_optim_create(cai_optim_t **out, cai_lora_t *l, cai_device_t *dev, const cai_adamw_config *cfg);
/* The step driver of a LoRA run: model m (whole, frozen, cai_model_set_lora
 * done) replicated over the dp axis of `mesh` (NULL: one rank); each
 * microbatch's dropout key is (next update, microbatch); the adapters'
 * gradients are averaged over dp after the microbatches. *state is the
 * driver's, free() it after. Collective over dp in cai_train_step. */
cai_status cai_lora_driver(cai_model_t *m, cai_lora_t *l, cai_optim_t *o, cai_mesh_t *mesh, cai_step_driver *out,
                           void **state);

/* A LoRA run's checkpoint, DIR/step-<N>.h5 with the checkpoint directory's
 * protocol (cai_ckpt_save_step_with): groups "lora/<name>" (the adapters'
 * F32 weights) and "lora_optim/exp_avg|exp_avg_sq/<name>", the base
 * model's config and the AdamW config as attributes; the base weights are
 * not in it (they come from the run's model.path). meta: step, tokens,
 * data position, config text as the app fills them. Collective over the
 * mesh's world. */
cai_status cai_lora_ckpt_save_step(cai_mesh_t *mesh, const char *dir, int keep, cai_lora_t *l, cai_optim_t *o,
                                   const cai_ckpt_meta *meta, char *path_out, size_t cap, cai_ckpt_stats *stats);
/* Reads the adapters and moments (shapes and checksums checked, errors
 * naming the file and tensor) and sets o's step count. Collective. */
cai_status cai_lora_ckpt_load(cai_mesh_t *mesh, const char *path, cai_lora_t *l, cai_optim_t *o, cai_ckpt_meta *meta,
                              cai_ckpt_stats *stats);

/* PEFT's adapter directory: adapter_model.safetensors (F32
 * "base_model.model.<module>.lora_A.weight" [r, in] and ".lora_B.weight"
 * [out, r]) and adapter_config.json (peft_type LORA, task_type CAUSAL_LM,
 * r, lora_alpha, lora_dropout, target_modules, bias none, fan_in_fan_out
 * true for GPT-2's Conv1D, base_model_name_or_path). Not collective. */
cai_status cai_lora_export_peft(const char *dir, const cai_lora_t *l, const char *base_model);
/* adapter_config.json into a config (rank, alpha, dropout, targets into
 * `targets`, cap bytes); anything colossal cannot reproduce (another
 * peft_type, DoRA, rsLoRA, bias, per-module ranks, a target regex, layer
 * subsets) is CAI_ERR_FORMAT naming the file and field. */
cai_status cai_lora_peft_config(const char *dir, cai_lora_config *out, char *targets, size_t cap);
/* adapter_model.safetensors into l's adapters (made from that config):
 * every adapter's A and B present with its shape (F32, BF16 or F16), and
 * no tensor left over; errors name the file and tensor. */
cai_status cai_lora_import_peft(const char *dir, cai_lora_t *l);
/* The merged model W + scale B A as a Hugging Face directory, through
 * cai_hf_export (m whole on this rank). Not collective. */
cai_status cai_lora_export_merged(const char *dir, cai_model_t *m, const cai_lora_t *l,
                                  const cai_hf_export_options *opt, cai_hf_export_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
