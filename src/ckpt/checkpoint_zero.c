/* Checkpoints of the training state a ZeRO engine holds. The F32 masters
 * and AdamW moments of this rank's shard go through the piece-wise
 * save/load (cai_ckpt_save_pieces): each element lives on one dp rank,
 * which writes it, and a load reads whatever elements this rank's shard
 * holds under the current layout, so the optimizer state reshards between
 * dp sizes, stages and offload settings. Stage 0 holds whole buffers (with
 * offload, host copies), which the dp replicas split as they do the
 * model's own. A reduce-only engine leaves the state in the model and the
 * caller's optimizer: cai_ckpt_save / cai_ckpt_load. The file is the same
 * either way (docs/checkpoint.md). */
#include "cai_config.h"

#include <stdlib.h>
#include <string.h>

#include "checkpoint_internal.h"

/* The buffers of an engine's state, for a save or a load. */
typedef struct {
    cai_ckpt_buffer b[4];
    const cai_ckpt_piece *pc[4]; /* NULL at stage 0: whole, replicated buffers */
    int npc[4];
    int n;
    cai_ckpt_piece *own[2]; /* the pieces at the masters' and at the moments' offsets */
} zstate;

static void zstate_free(zstate *s) {
    free(s->own[0]);
    free(s->own[1]);
    s->own[0] = s->own[1] = NULL;
}

static void push(zstate *s, cai_ckpt_buffer b, const cai_ckpt_piece *pc, int npc) {
    s->b[s->n] = b;
    s->pc[s->n] = pc;
    s->npc[s->n] = pc ? npc : 0;
    s->n++;
}

/* A save writes "model" (the working weights: the masters rounded into
 * param_dtype, exactly as the engine refreshes them) and, when that is not
 * F32, "master"; a load reads the masters from "master", or from "model"
 * in an f32 file, and re-derives the working weights. Not collective. */
static cai_status zstate_init(zstate *s, cai_zero_t *z, int save) {
    memset(s, 0, sizeof *s);
    cai_dtype pdt = cai_model_config_of(cai_zero_model(z))->param_dtype;
    cai_tensor master, m, v;
    cai_zero_shard_state(z, &master, &m, &v);
    cai_device_t *dev = master.device && master.device->kind != CAI_DEVICE_HOST ? master.device : NULL;
    int count = 0;
    const cai_zero_piece *zp = cai_zero_pieces(z, &count);
    const cai_ckpt_piece *mp = NULL, *sp = NULL;
    if (cai_zero_get_config(z)->stage >= 1) {
        CAI_CALL(cai_calloc((void **)&s->own[0], (size_t)count + 1, sizeof *s->own[0], "checkpoint master pieces"));
        CAI_CALL(cai_calloc((void **)&s->own[1], (size_t)count + 1, sizeof *s->own[1], "checkpoint moment pieces"));
        for (int k = 0; k < count; k++) {
            s->own[0][k] = (cai_ckpt_piece){zp[k].index, zp[k].param_offset, zp[k].master_offset, zp[k].count};
            s->own[1][k] = (cai_ckpt_piece){zp[k].index, zp[k].param_offset, zp[k].shard_offset, zp[k].count};
        }
        mp = s->own[0];
        sp = s->own[1];
    }
    /* `replicated` matters only at stage 0 (pieces are held by one rank). */
    cai_ckpt_buffer mb = {.group = "model",
                          .data = master.data,
                          .dev = dev,
                          .dtype = CAI_DTYPE_F32,
                          .file_dtype = CAI_DTYPE_F32,
                          .replicated = 1};
    if (save && pdt != CAI_DTYPE_F32) {
        cai_ckpt_buffer w = mb;
        w.file_dtype = pdt;
        push(s, w, mp, count);
        mb.group = "master";
    } else if (!save) {
        mb.group = "master";
        mb.alt_group = "model";
    }
    push(s, mb, mp, count);
    /* A tie copy held with its primary keeps its (unused) moments. */
    cai_ckpt_buffer ob = {.group = "optim/exp_avg",
                          .data = m.data,
                          .dev = dev,
                          .dtype = CAI_DTYPE_F32,
                          .file_dtype = CAI_DTYPE_F32,
                          .replicated = 1,
                          .skip_tie_copies = 1};
    push(s, ob, sp, count);
    ob.group = "optim/exp_avg_sq";
    ob.data = v.data;
    push(s, ob, sp, count);
    return CAI_OK;
}

cai_status cai_ckpt_save_zero(cai_mesh_t *mesh, const char *path, cai_zero_t *zero, cai_optim_t *optim,
                              const cai_adamw_config *oc, const cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && zero, "cai_ckpt_save_zero: NULL argument");
    cai_model_t *model = cai_zero_model(zero);
    if (cai_zero_get_config(zero)->reduce_only) return cai_ckpt_save(mesh, path, model, optim, meta, stats);
    CAI_CHECK_ARG(oc, "cai_ckpt_save_zero: the engine holds the optimizer state; pass the AdamW config it steps with");
    cai_ckpt_meta m = meta ? *meta : cai_ckpt_meta_init();
    m.model = *cai_model_config_of(model);
    m.has_model = 1;
    m.has_optim = 1;
    m.optim = *oc;
    if (!meta) m.step = m.optim_step = cai_zero_step_count(zero);
    m.layout = *cai_mesh_layout(mesh);
    MPI_Comm comm = cai_mesh_comm(mesh, CAI_AXIS_WORLD);
    MPI_Comm_size(comm, &m.world_size);
    zstate s;
    cai_status st = zstate_init(&s, zero, 1);
    if (st == CAI_OK) st = cai_device_sync(cai_model_device(model));
    st = ck_agree(comm, st); /* a rank-local failure must not leave the others in the save */
    cai_ckpt_layout L = ck_model_layout(model);
    if (st == CAI_OK) st = cai_ckpt_save_pieces(mesh, path, &L, s.b, s.pc, s.npc, s.n, &m, stats);
    zstate_free(&s);
    CAI_CALL(st);
    return CAI_OK;
}

/* The masters (and unless masters_only the moments) of this rank's
 * pieces, then the working weights (and at stages 1/2 every rank's copy of
 * the others' chunks) from the masters just read. *m receives the file's
 * metadata. Collective over the mesh's world. */
static cai_status load_state(cai_mesh_t *mesh, const char *path, cai_zero_t *zero, int masters_only, cai_ckpt_meta *m,
                             cai_ckpt_stats *stats) {
    cai_model_t *model = cai_zero_model(zero);
    zstate s;
    cai_status st = zstate_init(&s, zero, 0);
    if (masters_only) s.n = 1; /* the masters come first; the moments stay as they are */
    if (st == CAI_OK) st = cai_device_sync(cai_model_device(model));
    st = ck_agree(cai_mesh_comm(mesh, CAI_AXIS_WORLD), st);
    cai_ckpt_layout L = ck_model_layout(model);
    *m = cai_ckpt_meta_init();
    if (st == CAI_OK) st = ck_load_checked(mesh, path, &L, s.b, s.pc, s.npc, s.n, cai_model_config_of(model), m, stats);
    zstate_free(&s);
    if (st == CAI_OK) st = cai_zero_state_loaded(zero);
    return st;
}

cai_status cai_ckpt_load_zero(cai_mesh_t *mesh, const char *path, cai_zero_t *zero, cai_optim_t *optim,
                              cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && zero, "cai_ckpt_load_zero: NULL argument");
    cai_model_t *model = cai_zero_model(zero);
    if (cai_zero_get_config(zero)->reduce_only) return cai_ckpt_load(mesh, path, model, optim, meta, stats);
    cai_ckpt_meta m;
    cai_status st = load_state(mesh, path, zero, 0, &m, stats);
    if (st == CAI_OK) cai_zero_set_step_count(zero, m.has_optim ? m.optim_step : m.step);
    if (st == CAI_OK && meta) *meta = m;
    else cai_ckpt_meta_free(&m);
    CAI_CALL(st);
    return CAI_OK;
}

/* The weights of a checkpoint (whole global tensors, read collectively:
 * every rank takes part in every read) for cai_zero_load_params. A file
 * vocabulary smaller than the model's fills the first rows; the added rows
 * start as the mean of the file's. */
typedef struct {
    cai_ckpt_file_t *f;
    const cai_registry_t *reg;
    float *scratch; /* a rank holding none of a tensor still reads it */
    int64_t file_vocab, vocab;
} ckpt_zero_src;

static cai_status ckpt_zero_read(void *ctx, const cai_param_info *param, float *dst) {
    ckpt_zero_src *s = ctx;
    /* a tie copy is stored once, under its primary's name */
    const char *stored = cai_registry_param(s->reg, param->tie_primary)->name;
    char name[CAI_CKPT_NAME_MAX];
    snprintf(name, sizeof name, "master/%s", stored);
    if (!cai_ckpt_find(s->f, name)) snprintf(name, sizeof name, "model/%s", stored);
    const cai_ckpt_entry *e = cai_ckpt_find(s->f, name);
    if (!e)
        return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' has no tensor model/%s", cai_ckpt_path(s->f), param->name);
    /* fewer vocabulary rows: the same columns */
    const int fewer_rows = param->spec.vocab_parallel && param->spec.tp_split_dim == 0 && e->ndim == param->ndim &&
                           e->ndim == 2 && e->shape[1] == param->shape[1] && e->shape[0] < param->shape[0];
    if (e->numel != param->numel && !fewer_rows)
        return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': tensor %s holds %llu elements, this model's %s %llu",
                         cai_ckpt_path(s->f), name, (unsigned long long)e->numel, param->name,
                         (unsigned long long)param->numel);
    float *to = dst ? dst : s->scratch;
    CAI_CALL(cai_ckpt_read(s->f, name, CAI_DTYPE_F32, to));
    if (!dst) return CAI_OK;
    memset(dst + e->numel, 0, (size_t)(param->numel - e->numel) * sizeof *dst);
    cai_ckpt_grow_vocab_rows(param, dst, s->file_vocab, s->vocab);
    return CAI_OK;
}

cai_status cai_ckpt_load_zero_weights(cai_mesh_t *mesh, const char *path, cai_zero_t *zero) {
    CAI_CHECK_ARG(mesh && path && zero, "cai_ckpt_load_zero_weights: NULL argument");
    const cai_model_config *mc = cai_model_config_of(cai_zero_model(zero));
    const cai_registry_t *reg = cai_model_registry(cai_zero_model(zero));
    ckpt_zero_src s = {.reg = reg};
    CAI_CALL(cai_ckpt_open(&s.f, cai_mesh_comm(mesh, CAI_AXIS_WORLD), path));
    cai_ckpt_meta m = *cai_ckpt_file_meta(s.f);
    cai_status st = CAI_OK;
    s.file_vocab = m.model.vocab_size;
    s.vocab = mc->vocab_size;
    if (s.vocab < s.file_vocab)
        st = CAI_ERROR(CAI_ERR_CONFIG, "checkpoint '%s' holds a vocabulary of %lld; this model's %lld is smaller", path,
                       (long long)s.file_vocab, (long long)s.vocab);
    const int64_t file_rows = cai_model_config_padded_vocab(&m.model);
    /* a larger vocabulary grows; the rest must be the file's */
    m.model.vocab_size = mc->vocab_size;
    m.model.vocab_multiple = mc->vocab_multiple;
    if (st == CAI_OK) st = ck_check_model(path, &m, mc);
    if (st == CAI_OK && s.file_vocab == s.vocab && file_rows == cai_model_config_padded_vocab(mc)) {
        /* the same shapes: the resume path's hyperslab reads of this rank's pieces */
        cai_ckpt_close(s.f);
        cai_ckpt_meta fm;
        st = load_state(mesh, path, zero, 1, &fm, NULL);
        cai_ckpt_meta_free(&fm);
        CAI_CALL(st);
        return CAI_OK;
    }
    uint64_t most = 0;
    for (int i = 0; i < cai_registry_count(reg); i++)
        if (cai_registry_param(reg, i)->numel > most) most = cai_registry_param(reg, i)->numel;
    if (st == CAI_OK) st = cai_malloc((void **)&s.scratch, (size_t)most * sizeof(float), "checkpoint read scratch");
    if (st == CAI_OK) st = cai_zero_load_params(zero, ckpt_zero_read, &s);
    cai_free(s.scratch);
    cai_ckpt_close(s.f);
    CAI_CALL(st);
    return CAI_OK;
}
