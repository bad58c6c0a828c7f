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
    float *master; /* F32; NULL without storage */
    void *lowp;    /* param_dtype working copy (NULL when F32) */
    void *work;    /* act_dtype compute copy when act_dtype differs from the working dtype */
    void *compute; /* what the layers read: master, lowp or work */
};

/* A block's parameters by name suffix ("h.<l>.<suffix>") and field. */
typedef struct {
    const char *suffix;
    size_t off; /* of the cai_tensor in cai_block_params */
} cai_block_field;
extern const cai_block_field cai_block_fields[];
extern const int cai_block_field_count;

int cai_weights_local_tie_primary(const cai_weights_t *w, int index);
cai_status cai_weights_refresh_compute(cai_weights_t *w);

#endif
