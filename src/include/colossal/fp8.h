/* FP8 training of a model's transformer blocks (src/model/fp8.c, model
 * layer; the numerics in colossal/tensor.h, the casts and products in the
 * op table; docs/fp8.md).
 *
 * In a block that runs in FP8, each of its linear layers (QKV, attention
 * output projection, MLP fc / gate, up and output projection) computes
 *   y = (fp8(x sx) fp8(W sw)^T) / (sx sw)            forward, E4M3 x and W
 *   dx = (fp8(dy sg) fp8(W sw)) / (sg sw)             backward, dy in E5M2
 *   dW += (fp8(dy sg)^T fp8(x sx)) / (sg sx)          ("hybrid") or E4M3
 * with f32 accumulation, bias and residual added in the activation dtype,
 * f32/bf16 master weights and gradients unchanged. Each linear keeps three
 * scaling states (x, W, dy; colossal/tensor.h's meta). With the delayed
 * recipe the scales come from the amax history of earlier steps; a
 * tensor's very first cast (no scale yet) scales from its own amax. With
 * the current recipe every cast scales from its own amax.
 *
 * The states of every layer of the model (all global layers, so that one
 * array means the same under any pp/tp layout) form one F32 array
 * [n_layers][CAI_FP8_SITE_COUNT][3][2 + H], held on the device and
 * mirrored on the host. cai_fp8_step, once per optimizer step, reduces the
 * step's amaxes over the mesh (max: every rank then derives the same
 * scales) and advances the recipe; the array is what checkpoints store. */
#ifndef COLOSSAL_FP8_H
#define COLOSSAL_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/cluster.h"
#include "colossal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CAI_FP8_SITE_QKV = 0,
    CAI_FP8_SITE_ATTN_PROJ,
    CAI_FP8_SITE_FC, /* GPT-2 fc, Llama gate */
    CAI_FP8_SITE_UP, /* Llama up */
    CAI_FP8_SITE_MLP_PROJ,
    CAI_FP8_SITE_COUNT
} cai_fp8_site;

enum { CAI_FP8_OP_X = 0, CAI_FP8_OP_W, CAI_FP8_OP_G, CAI_FP8_OPERANDS };

#define CAI_FP8_LAYERS_MAX 256 /* bytes of the layer selection text, with the NUL */

typedef struct {
    int enabled;
    int hybrid; /* 1: gradients in E5M2 (Transformer Engine's HYBRID); 0: E4M3 everywhere */
    cai_fp8_recipe_kind recipe;
    cai_fp8_amax_algo amax_algo;
    int amax_history; /* H >= 1: steps of amax kept (delayed recipe) */
    int margin;       /* scale = fp8_max / amax / 2^margin */
    /* Blocks in FP8: "auto" (all but the first and the last, as Transformer
     * Engine recommends; with fewer than 3 blocks none), "all", "none", or a
     * comma list of block indices and ranges "a-b". The embedding and the
     * LM head always stay in the activation dtype. */
    char layers[CAI_FP8_LAYERS_MAX];
} cai_fp8_config;

/* Off; hybrid, delayed, max over 1024 steps, margin 0, layers "auto". */
cai_fp8_config cai_fp8_config_default(void);
/* Checks the fields (recipe, algorithm, history 1..65536, margin 0..64, the
 * layer list against n_layers) and fills on[n_layers] (1: FP8). Errors name
 * the field. Pure. */
cai_status cai_fp8_config_check(const cai_fp8_config *c, int n_layers, unsigned char *on);
/* "e4m3" (0) or "hybrid" (1); "delayed" / "current"; "max" / "most_recent". */
extern const char *const cai_fp8_format_names[];
extern const char *const cai_fp8_recipe_names[];
extern const char *const cai_fp8_amax_algo_names[];

typedef struct cai_fp8 cai_fp8_t;
typedef struct cai_fp8_layer cai_fp8_layer;

/* Rows: the tokens a block's matmuls see (B*T); widths[site] = {in, out}
 * of each local linear (0 where the family has none). mesh (may be NULL)
 * is whose world cai_fp8_step reduces over. Allocates the states and the
 * cast buffers on dev. Not collective. */
cai_status cai_fp8_create(cai_fp8_t **out, cai_device_t *dev, const cai_fp8_config *cfg, int n_layers, int64_t rows,
                          const int64_t widths[CAI_FP8_SITE_COUNT][2], cai_mesh_t *mesh);
void cai_fp8_free(cai_fp8_t *f);
/* The layer's FP8 state, NULL when the block does not run in FP8. */
const cai_fp8_layer *cai_fp8_layer_of(const cai_fp8_t *f, int layer);
const cai_fp8_config *cai_fp8_config_of(const cai_fp8_t *f);

/* 1 when this site of the block runs in FP8 (l may be NULL). */
int cai_fp8_at(const cai_fp8_layer *l, cai_fp8_site site);
/* out [N,OC] = FP8 product of inp [N,IC] and weight [OC,IC] + bias (may be
 * NULL) + residual (may be NULL; out may be residual itself). */
cai_status cai_fp8_linear_fwd(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *out, const cai_tensor *inp,
                              const cai_tensor *weight, const cai_tensor *bias, const cai_tensor *residual);
/* As ops->linear_bwd (dinp = or += with accum_dinp, dweight and dbias +=,
 * any may be NULL), the products in FP8. */
cai_status cai_fp8_linear_bwd(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *dinp, cai_tensor *dweight,
                              cai_tensor *dbias, const cai_tensor *dout, const cai_tensor *inp,
                              const cai_tensor *weight, int accum_dinp);
/* As ops->linear_gelu_fwd (pre = inp weight^T + bias, act = gelu(pre)) and
 * ops->linear_bwd_dgelu's input side (dpre = gelu'(pre) * (dout weight),
 * dweight and dbias +=), the products in FP8 with the GELU in their
 * epilogue where the backend fuses it. */
cai_status cai_fp8_linear_gelu_fwd(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *act, cai_tensor *pre,
                                   const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias);
cai_status cai_fp8_linear_bwd_dgelu(const cai_fp8_layer *l, cai_fp8_site site, cai_tensor *dpre, cai_tensor *dweight,
                                    cai_tensor *dbias, const cai_tensor *dout, const cai_tensor *inp,
                                    const cai_tensor *weight, const cai_tensor *pre);

/* The device bytes cai_fp8_create and the linears' weight codes take on a
 * rank (the memory planner's FP8 row): runs [n_layers][CAI_FP8_SITE_COUNT]
 * marks the linears the rank runs through FP8 when their block is
 * selected. Not collective. */
cai_status cai_fp8_plan_bytes(const cai_device_t *dev, const cai_fp8_config *cfg, int n_layers, int64_t rows,
                              const int64_t widths[CAI_FP8_SITE_COUNT][2], const unsigned char *runs, size_t *bytes);
/* The weights' codes are cast at their first use after a cai_fp8_step,
 * cai_fp8_set_state or cai_fp8_weights_changed and reused until the next
 * one (cai_model_params_updated calls cai_fp8_weights_changed: every
 * change of the weights goes through it). */
void cai_fp8_weights_changed(cai_fp8_t *f);
/* The device bytes f holds now (what cai_fp8_plan_bytes plans, once every
 * linear the rank runs has run). */
size_t cai_fp8_device_bytes(const cai_fp8_t *f);
/* End of an optimizer step: the amaxes reduced (max) over the mesh's world,
 * then every state advanced by the recipe (cai_fp8_meta_update). Collective
 * over the world of the mesh given at create. */
cai_status cai_fp8_step(cai_fp8_t *f);
/* The device's state into the host mirror, reduced (max) over the mesh's
 * world as cai_fp8_step would, without advancing the recipe: what a
 * checkpoint must hold when forwards (an evaluation) ran since the last
 * step, so that a resumed run's next step sees the same amaxes. Collective
 * over the world of the mesh given at create. */
cai_status cai_fp8_gather_state(cai_fp8_t *f);
/* The state array (host mirror, as of the last cai_fp8_step,
 * cai_fp8_gather_state or cai_fp8_set_state) and its length. */
const float *cai_fp8_state(const cai_fp8_t *f, size_t *n);
/* Replace the state (a checkpoint's); n must be this model's length. */
cai_status cai_fp8_set_state(cai_fp8_t *f, const float *state, size_t n);

#ifdef __cplusplus
}
#endif
#endif
