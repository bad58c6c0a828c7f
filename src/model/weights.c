/* The weights object: the registry and one rank's parameter storage (F32
 * masters, the param_dtype working copy, the act_dtype compute copy), apart
 * from any execution state, so a training model and an inference engine
 * read the same buffers. */
#include "cai_config.h"
#include "model_internal.h"

#include <stdint.h>
#include <string.h>

static cai_tensor flat_view(cai_device_t *dev, void *base, cai_dtype dt, size_t offset, size_t n) {
    return cai_tensor_1d(dev, (char *)base + offset * cai_dtype_size(dt), dt, (int64_t)n);
}

static cai_status alloc_storage(cai_weights_t *w) {
    cai_device_t *dev = w->dev;
    const size_t n = w->n_flat;
    CAI_CALL(cai_device_alloc(dev, n * sizeof(float), "model master weights", (void **)&w->master));
    cai_dtype pd = w->cfg.param_dtype, ad = w->cfg.act_dtype;
    if (pd != CAI_DTYPE_F32) {
        CAI_CALL(cai_device_alloc(dev, n * cai_dtype_size(pd), "model working weights", &w->lowp));
        cai_tensor t = flat_view(dev, w->lowp, pd, 0, n);
        CAI_CALL(dev->ops->fill(dev, &t, 0.0f)); /* alignment gaps stay defined */
    }
    if (ad != pd) {
        CAI_CALL(cai_device_alloc(dev, n * cai_dtype_size(ad), "model compute weights", &w->work));
        cai_tensor t = flat_view(dev, w->work, ad, 0, n);
        CAI_CALL(dev->ops->fill(dev, &t, 0.0f));
    }
    w->compute = w->work ? w->work : w->lowp ? w->lowp : (void *)w->master;
    /* Initialise on the host, then move (a copy on the host device). */
    float *stage = NULL;
    cai_status st = CAI_OK;
    CAI_CALL(cai_device_alloc_staging(dev, n * sizeof(float), "model init staging", (void **)&stage));
    CAI_CALL_GOTO(cai_registry_init_flat(w->reg, &w->view, w->cfg.seed, w->align, stage, n), st, done);
    CAI_CALL_GOTO(cai_device_copy(dev, w->master, stage, n * sizeof(float),
                                  dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D),
                  st, done);
done:
    cai_device_dealloc_staging(dev, stage);
    return st;
}

cai_status cai_weights_create(cai_weights_t **out, cai_device_t *dev, const cai_model_config *cfg,
                              const cai_rank_view *view, size_t align_elems, int storage) {
    CAI_CHECK_ARG(out && dev && cfg && view, "cai_weights_create: NULL argument");
    *out = NULL;
    cai_weights_t *w = NULL;
    CAI_CALL(cai_calloc((void **)&w, 1, sizeof *w, "weights"));
    cai_status st = CAI_OK;
    w->dev = dev;
    w->view = *view;
    w->align = align_elems ? align_elems : 16;
    CAI_CALL_GOTO(cai_model_config_resolve(cfg, &w->cfg), st, fail);
    cai_registry_options ropt = {.n_layers = w->cfg.n_layers};
    CAI_CALL_GOTO(cai_registry_init(&w->reg, &ropt), st, fail);
    CAI_CALL_GOTO(cai_model_register_params(w->reg, &w->cfg), st, fail);
    CAI_CALL_GOTO(cai_registry_check_view(w->reg, &w->view), st, fail);
    w->n_params = cai_registry_count(w->reg);
    CAI_CALL_GOTO(cai_calloc((void **)&w->offsets, (size_t)w->n_params, sizeof *w->offsets, "weights offsets"), st,
                  fail);
    CAI_CALL_GOTO(cai_calloc((void **)&w->shards, (size_t)w->n_params, sizeof *w->shards, "weights shards"), st, fail);
    CAI_CALL_GOTO(cai_registry_local_layout(w->reg, &w->view, w->align, w->offsets, &w->n_flat), st, fail);
    for (int i = 0; i < w->n_params; i++)
        CAI_CALL_GOTO(cai_registry_shard(w->reg, i, &w->view, &w->shards[i]), st, fail);
    if (storage) {
        CAI_CALL_GOTO(alloc_storage(w), st, fail);
        CAI_CALL_GOTO(cai_weights_updated(w), st, fail);
    }
    *out = w;
    return CAI_OK;
fail:
    cai_weights_free(w);
    return st;
}

void cai_weights_free(cai_weights_t *w) {
    if (!w) return;
    cai_device_dealloc_staging(w->dev, w->host);
    cai_device_dealloc(w->dev, w->master);
    cai_device_dealloc(w->dev, w->lowp);
    cai_device_dealloc(w->dev, w->work);
    cai_free(w->offsets);
    cai_free(w->shards);
    cai_registry_free(w->reg);
    cai_free(w);
}

const cai_model_config *cai_weights_config(const cai_weights_t *w) { return &w->cfg; }
const cai_registry_t *cai_weights_registry(const cai_weights_t *w) { return w->reg; }
const cai_rank_view *cai_weights_view(const cai_weights_t *w) { return &w->view; }
cai_device_t *cai_weights_device(const cai_weights_t *w) { return w->dev; }
size_t cai_weights_align_elems(const cai_weights_t *w) { return w->align; }
int cai_weights_have_storage(const cai_weights_t *w) { return w->compute != NULL; }
int cai_weights_compute_only(const cai_weights_t *w) { return w && w->compute_only; }

cai_status cai_weights_check_writable(const cai_weights_t *w, const char *what) {
    CAI_CHECK_ARG(w, "%s: NULL weights", what);
    if (w->offloaded)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: the weights wait in host memory (onload them first)", what);
    if (w->bound)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: the weights are views of storage another owns (a ZeRO engine's working weights, "
                         "cai_weights_bind_compute); write through their owner",
                         what);
    if (w->compute_only)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: the weights keep only the copy the layers read (cai_weights_keep_compute); "
                         "their F32 masters are gone, so nothing can be written into them",
                         what);
    if (!w->master)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: the weights have no storage (external parameters: write through their owner)", what);
    return CAI_OK;
}
int cai_weights_offloaded(const cai_weights_t *w) { return w && w->offloaded; }

/* The storage's buffers in order: masters, working copy, compute copy
 * (0 bytes: the dtype needs none, or compute_only keeps only the last
 * that exists). */
static void storage_parts(const cai_weights_t *w, size_t bytes[3]) {
    const cai_dtype pd = w->cfg.param_dtype, ad = w->cfg.act_dtype;
    bytes[0] = w->n_flat * sizeof(float);
    bytes[1] = pd != CAI_DTYPE_F32 ? w->n_flat * cai_dtype_size(pd) : 0;
    bytes[2] = ad != pd ? w->n_flat * cai_dtype_size(ad) : 0;
    if (w->compute_only) {
        if (bytes[1] || bytes[2]) bytes[0] = 0;
        if (bytes[2]) bytes[1] = 0;
    }
}

cai_status cai_weights_keep_compute(cai_weights_t *w) {
    if (w && w->compute_only) return CAI_OK;
    CAI_CALL(cai_weights_check_writable(w, "cai_weights_keep_compute"));
    if (w->compute == (void *)w->master) return CAI_OK; /* F32 layers read the masters */
    CAI_CALL(cai_device_sync(w->dev));                  /* nothing in flight still converts from them */
    if (w->compute != w->lowp) {
        cai_device_dealloc(w->dev, w->lowp);
        w->lowp = NULL;
    }
    cai_device_dealloc(w->dev, w->master);
    w->master = NULL;
    w->compute_only = 1;
    return CAI_OK;
}

cai_status cai_weights_bind_compute(cai_weights_t *w, void *compute, const size_t *offsets) {
    CAI_CHECK_ARG(w && compute && offsets, "cai_weights_bind_compute: NULL argument");
    if (w->master || w->compute || w->offloaded)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_weights_bind_compute: the weights object has storage of its own");
    for (int i = 0; i < w->n_params; i++)
        if ((w->offsets[i] == SIZE_MAX) != (offsets[i] == SIZE_MAX))
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "cai_weights_bind_compute: parameter '%s' is %s here but %s in the storage bound",
                             cai_registry_param(w->reg, i)->name, w->offsets[i] == SIZE_MAX ? "not held" : "held",
                             offsets[i] == SIZE_MAX ? "absent" : "present");
    for (int i = 0; i < w->n_params; i++) w->offsets[i] = offsets[i];
    /* An owner that updates only a tie's primary (ZeRO) leaves the copy
     * stale: every tie copy held here reads its primary. */
    for (int i = 0; i < w->n_params; i++) {
        const int p = w->offsets[i] == SIZE_MAX ? -1 : cai_weights_local_tie_primary(w, i);
        if (p >= 0) w->offsets[i] = w->offsets[p];
    }
    w->compute = compute;
    w->bound = 1;
    w->compute_only = 1;
    return CAI_OK;
}

size_t cai_weights_device_bytes(const cai_weights_t *w) {
    if (!w || !w->compute || w->bound) return 0;
    size_t b[3];
    storage_parts(w, b);
    return b[0] + b[1] + b[2];
}

cai_status cai_weights_offload(cai_weights_t *w) {
    CAI_CHECK_ARG(w, "cai_weights_offload: NULL weights");
    if (w->offloaded) return CAI_OK;
    if (!w->compute) return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_weights_offload: the weights object has no storage");
    if (w->bound)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "cai_weights_offload: the weights are views of storage another owns "
                         "(cai_weights_bind_compute)");
    cai_device_t *dev = w->dev;
    size_t b[3];
    storage_parts(w, b);
    if (!w->host) CAI_CALL(cai_device_alloc_staging(dev, b[0] + b[1] + b[2], "offloaded model weights", &w->host));
    void *part[3] = {w->master, w->lowp, w->work};
    const cai_copy_kind kind = dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H;
    size_t at = 0;
    for (int k = 0; k < 3; k++) {
        if (b[k]) CAI_CALL(cai_device_copy(dev, (char *)w->host + at, part[k], b[k], kind));
        at += b[k];
    }
    CAI_CALL(cai_device_sync(dev)); /* the copies have landed and nothing in flight reads the storage */
    cai_device_dealloc(dev, w->master);
    cai_device_dealloc(dev, w->lowp);
    cai_device_dealloc(dev, w->work);
    w->master = NULL;
    w->lowp = w->work = w->compute = NULL;
    w->offloaded = 1;
    return CAI_OK;
}

cai_status cai_weights_onload(cai_weights_t *w) {
    CAI_CHECK_ARG(w, "cai_weights_onload: NULL weights");
    if (!w->offloaded) return CAI_OK;
    cai_device_t *dev = w->dev;
    size_t b[3];
    storage_parts(w, b);
    void **part[3] = {(void **)&w->master, &w->lowp, &w->work};
    static const char *what[3] = {"model master weights", "model working weights", "model compute weights"};
    const cai_copy_kind kind = dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D;
    cai_status st = CAI_OK;
    size_t at = 0;
    for (int k = 0; k < 3 && st == CAI_OK; k++) {
        if (b[k]) st = cai_device_alloc(dev, b[k], what[k], part[k]);
        /* ordered before any op that reads them; the host copy stays unchanged until the next offload */
        if (st == CAI_OK && b[k]) st = cai_device_copy(dev, *part[k], (char *)w->host + at, b[k], kind);
        at += b[k];
    }
    if (st != CAI_OK) {
        for (int k = 0; k < 3; k++) {
            cai_device_dealloc(dev, *part[k]);
            *part[k] = NULL;
        }
        return st;
    }
    w->compute = w->work ? w->work : w->lowp ? w->lowp : (void *)w->master;
    w->offloaded = 0;
    return CAI_OK;
}

int64_t cai_weights_held(const cai_weights_t *w, int index) {
    if (index < 0 || index >= w->n_params || w->offsets[index] == SIZE_MAX) return -1;
    return (int64_t)w->shards[index].local_numel;
}

const cai_param_shard *cai_weights_shard(const cai_weights_t *w, int index) {
    return index >= 0 && index < w->n_params ? &w->shards[index] : NULL;
}

void cai_weights_flat(const cai_weights_t *w, cai_tensor *master, cai_tensor *lowp) {
    if (master) {
        if (w->master) *master = flat_view(w->dev, w->master, CAI_DTYPE_F32, 0, w->n_flat);
        else *master = cai_tensor_1d(w->dev, NULL, CAI_DTYPE_F32, 0);
    }
    if (lowp) {
        if (w->lowp) *lowp = flat_view(w->dev, w->lowp, w->cfg.param_dtype, 0, w->n_flat);
        else memset(lowp, 0, sizeof *lowp);
    }
}

cai_status cai_weights_param_view(const cai_weights_t *w, int index, int compute, cai_tensor *out) {
    CAI_CHECK_ARG(w && out, "cai_weights_param_view: NULL argument");
    const cai_param_info *info = cai_registry_param(w->reg, index);
    CAI_CHECK_ARG(info, "cai_weights_param_view: no parameter %d", index);
    if (w->offsets[index] == SIZE_MAX)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s' is not held by this rank (pipeline rank %d of %d)",
                         info->name, w->view.pp_rank, w->view.pp_size);
    if (!compute && w->compute_only)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s': the weights keep only the copy the layers read (cai_weights_keep_compute); "
                         "its F32 master is gone",
                         info->name);
    const cai_param_shard *sh = &w->shards[index];
    int64_t shape[CAI_PARAM_MAX_DIMS];
    for (int d = 0; d < sh->ndim; d++) shape[d] = (int64_t)sh->local_shape[d];
    const cai_dtype dt = compute ? w->cfg.act_dtype : CAI_DTYPE_F32;
    void *base = compute ? w->compute : (void *)w->master;
    void *data = base ? (char *)base + w->offsets[index] * cai_dtype_size(dt) : NULL;
    CAI_CALL(cai_tensor_init(out, w->dev, data, dt, sh->ndim, shape));
    return CAI_OK;
}

cai_status cai_weights_find(const cai_weights_t *w, const char *name, int compute, cai_tensor *out) {
    CAI_CHECK_ARG(w && name && out, "cai_weights_find: NULL argument");
    int idx = cai_registry_find(w->reg, name);
    if (idx < 0) {
        memset(out, 0, sizeof *out);
        return CAI_OK;
    }
    return cai_weights_param_view(w, idx, compute, out);
}

/* Index of the tie primary of `index` if it differs and is held here, else -1. */
int cai_weights_local_tie_primary(const cai_weights_t *w, int index) {
    const cai_param_info *info = cai_registry_param(w->reg, index);
    if (!info || info->tie_primary == index) return -1;
    return w->offsets[info->tie_primary] != SIZE_MAX ? info->tie_primary : -1;
}

cai_status cai_weights_block(const cai_weights_t *w, int layer, cai_block_params *out) {
    CAI_CHECK_ARG(w && out, "cai_weights_block: NULL argument");
    memset(out, 0, sizeof *out);
    for (int f = 0; f < cai_block_field_count; f++) {
        char name[CAI_PARAM_NAME_MAX];
        snprintf(name, sizeof name, "h.%d.%s", layer, cai_block_fields[f].suffix);
        CAI_CALL(cai_weights_find(w, name, 1, (cai_tensor *)((char *)out + cai_block_fields[f].off)));
    }
    return CAI_OK;
}

cai_status cai_weights_updated(cai_weights_t *w) {
    CAI_CHECK_ARG(w, "cai_weights_updated: NULL weights");
    if (w->compute_only || w->offloaded) return cai_weights_check_writable(w, "cai_weights_updated");
    if (!w->master) return CAI_OK;
    cai_device_t *dev = w->dev;
    for (int i = 0; i < w->n_params; i++) {
        int p = w->offsets[i] == SIZE_MAX ? -1 : cai_weights_local_tie_primary(w, i);
        if (p < 0) continue;
        cai_tensor dst = flat_view(dev, w->master, CAI_DTYPE_F32, w->offsets[i], w->shards[i].local_numel);
        cai_tensor src = flat_view(dev, w->master, CAI_DTYPE_F32, w->offsets[p], w->shards[p].local_numel);
        CAI_CALL(dev->ops->copy(dev, &dst, &src));
    }
    if (w->lowp) {
        cai_tensor master = flat_view(dev, w->master, CAI_DTYPE_F32, 0, w->n_flat);
        cai_tensor lowp = flat_view(dev, w->lowp, w->cfg.param_dtype, 0, w->n_flat);
        CAI_CALL(dev->ops->copy(dev, &lowp, &master));
    }
    CAI_CALL(cai_weights_refresh_compute(w));
    return CAI_OK;
}

/* The compute copy follows the working weights (or the masters when the
 * working weights are F32): one conversion at the boundary per update. */
cai_status cai_weights_refresh_compute(cai_weights_t *w) {
    if (!w->work) return CAI_OK;
    cai_device_t *dev = w->dev;
    cai_tensor work = flat_view(dev, w->work, w->cfg.act_dtype, 0, w->n_flat);
    cai_tensor src = w->lowp ? flat_view(dev, w->lowp, w->cfg.param_dtype, 0, w->n_flat)
                             : flat_view(dev, w->master, CAI_DTYPE_F32, 0, w->n_flat);
    CAI_CALL(dev->ops->copy(dev, &work, &src));
    return CAI_OK;
}
