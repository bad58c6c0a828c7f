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

cai_status cai_ckpt_load_zero(cai_mesh_t *mesh, const char *path, cai_zero_t *zero, cai_optim_t *optim,
                              cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && zero, "cai_ckpt_load_zero: NULL argument");
    cai_model_t *model = cai_zero_model(zero);
    if (cai_zero_get_config(zero)->reduce_only) return cai_ckpt_load(mesh, path, model, optim, meta, stats);
    zstate s;
    cai_status st = zstate_init(&s, zero, 0);
    if (st == CAI_OK) st = cai_device_sync(cai_model_device(model));
    st = ck_agree(cai_mesh_comm(mesh, CAI_AXIS_WORLD), st);
    cai_ckpt_layout L = ck_model_layout(model);
    cai_ckpt_meta m = cai_ckpt_meta_init();
    if (st == CAI_OK)
        st = ck_load_checked(mesh, path, &L, s.b, s.pc, s.npc, s.n, cai_model_config_of(model), &m, stats);
    zstate_free(&s);
    CAI_CALL(st);
    /* The working weights (and at stages 1/2 every rank's copy of the
     * others' chunks) come from the masters just read. */
    st = cai_zero_state_loaded(zero);
    if (st == CAI_OK) cai_zero_set_step_count(zero, m.has_optim ? m.optim_step : m.step);
    if (st == CAI_OK && meta) *meta = m;
    else cai_ckpt_meta_free(&m);
    CAI_CALL(st);
    return CAI_OK;
}
