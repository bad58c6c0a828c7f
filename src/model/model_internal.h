/* Shared by the model layer's files: the weights object's fields and the
 * block parameter names. */
#ifndef CAI_MODEL_INTERNAL_H
#define CAI_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdio.h>

#include "colossal/model.h"
#include "colossal/ops.h"

struct cai_weights {
    cai_model_config cfg; /* resolved */
    cai_device_t *dev;
    cai_registry_t *reg;
    cai_rank_view view;
    size_t align;
    int n_params;
    size_t *offsets; /* per registry index; SIZE_MAX when not held */
    cai_param_shard *shards;
    size_t n_flat;
    float *master;    /* F32; NULL without storage */
    void *lowp;       /* param_dtype working copy (NULL when F32) */
    void *work;       /* act_dtype compute copy when act_dtype differs from the working dtype */
    void *compute;    /* what the layers read: master, lowp or work */
    void *host;       /* cai_weights_offload: the three in pinned host memory (kept for the next offload) */
    int offloaded;    /* the device holds none of them */
    int compute_only; /* cai_weights_keep_compute: the masters and working copy are gone */
    int bound;        /* cai_weights_bind_compute: compute is another owner's (never freed here) */
};

/* A block's parameters by name suffix ("h.<l>.<suffix>") and field. */
typedef struct {
    const char *suffix;
    size_t off; /* of the cai_tensor in cai_block_params */
} cai_block_field;
extern const cai_block_field cai_block_fields[];
extern const int cai_block_field_count;

/* The MoE blocks of a model (model_moe.c). */
struct cai_moe_exchange;
typedef struct cai_model_moe cai_model_moe;
typedef cai_status (*cai_model_moe_bind_fn)(void *ctx, const char *name, cai_tensor *w, cai_tensor *g);
/* What a model with MoE blocks refuses, before anything is allocated. */
cai_status cai_model_moe_check(const cai_model_config *cfg, const cai_rank_view *view, int seq_parallel,
                               int split_backward, const struct cai_moe_exchange *ex);
/* NULL (*out) for a dense model; n_sets activation sets of every MoE layer. */
cai_status cai_model_moe_create(cai_model_moe **out, cai_device_t *dev, const cai_model_config *cfg,
                                const cai_rank_view *view, const struct cai_moe_exchange *ex, int64_t n_tokens,
                                int n_local, const int *local_layer, int n_sets);
void cai_model_moe_free(cai_model_moe *mm);
/* The MoE blocks' activation sets hold nothing between a frozen model's
 * forwards: freed while its weights wait in host memory (cai_model_offload)
 * and carved anew before they come back. Both no-ops in the state they
 * lead to. */
void cai_model_moe_release_acts(cai_model_moe *mm);
cai_status cai_model_moe_restore_acts(cai_model_moe *mm);
int cai_model_moe_is_layer(const cai_model_moe *mm, int local_layer);
size_t cai_model_moe_bytes(const cai_model_moe *mm);
int cai_model_moe_local_layers(const cai_model_moe *mm);
/* Binds local layer li's (global `layer`) MoE weight and gradient views through `bind`. */
cai_status cai_model_moe_bind(cai_model_moe *mm, int li, int layer, cai_model_moe_bind_fn bind, void *ctx);
/* A MoE block's second half: out = inp + moe(rmsnorm(inp)) into activation
 * set `set`; train: its router statistics count. */
cai_status cai_model_moe_block_fwd(cai_model_moe *mm, const cai_layer_ctx *lcx, const cai_layer_dims *d, int li,
                                   int set, const cai_block_params *p, cai_block_acts *a, cai_block_scratch *s,
                                   const cai_tensor *inp, cai_tensor *out, int train);
cai_status cai_model_moe_block_bwd(cai_model_moe *mm, const cai_layer_ctx *lcx, const cai_layer_dims *d, int li,
                                   int set, const cai_block_params *p, cai_block_params *g, const cai_block_acts *a,
                                   cai_block_scratch *s, const cai_tensor *inp, cai_tensor *d_stream, float loss_scale);
/* aux_coef * aux + z_coef * z of activation sets [first, first + n). */
double cai_model_moe_loss(const cai_model_moe *mm, int first_set, int n_sets);
cai_model_moe *cai_model_moe_of(const cai_model_t *m);

int cai_weights_local_tie_primary(const cai_weights_t *w, int index);
cai_status cai_weights_refresh_compute(cai_weights_t *w);

#endif
