/* Parallel HDF5 checkpoints: save and load of flat buffers laid out by the
 * parameter registry, and the model + optimizer convenience on top.
 *
 * A save creates every dataset first (collective metadata), then moves each
 * parameter's elements in pieces: every rank calls H5Dwrite the same number
 * of times per dataset (the maximum over ranks of its pieces; extra calls
 * carry empty selections), so all transfers are collective. Replicas of a
 * buffer (data-parallel ranks) each write a balanced slice of every
 * parameter, so the write bandwidth scales with the ranks. The checksum of
 * a tensor is the sum of per-element hashes keyed by the global index
 * (ck_xsum): each rank hashes what it wrote, an all-reduce adds them up. A
 * load reads each rank's whole shard and hashes the slice it would have
 * written under the load layout, so each element is checked exactly once
 * whatever the layout. See docs/checkpoint.md. */
#include "cai_config.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint_internal.h"

cai_ckpt_meta cai_ckpt_meta_init(void) {
    cai_ckpt_meta m;
    memset(&m, 0, sizeof m);
    m.loss_scale = 1.0;
    return m;
}

void cai_ckpt_meta_free(cai_ckpt_meta *meta) {
    if (!meta) return;
    free(meta->config_text);
    meta->config_text = NULL;
}

#if CAI_HAVE_HDF5

/* ------------------------------------------------------------ metadata tables */

typedef enum { K_INT, K_I64, K_U64, K_FLOAT, K_DOUBLE } field_kind;

typedef struct {
    const char *key;
    size_t off;
    field_kind kind;
} field;

static const field k_meta_fields[] = {
    {"step", offsetof(cai_ckpt_meta, step), K_I64},
    {"tokens", offsetof(cai_ckpt_meta, tokens), K_I64},
    {"consumed_samples", offsetof(cai_ckpt_meta, consumed_samples), K_I64},
    {"data_seed", offsetof(cai_ckpt_meta, data_seed), K_U64},
    {"rng.seed", offsetof(cai_ckpt_meta, rng_seed), K_U64},
    {"rng.offset", offsetof(cai_ckpt_meta, rng_offset), K_U64},
    {"loss_scaler.scale", offsetof(cai_ckpt_meta, loss_scale), K_DOUBLE},
    {"loss_scaler.good_steps", offsetof(cai_ckpt_meta, loss_scale_good_steps), K_I64},
    {"last_lr", offsetof(cai_ckpt_meta, last_lr), K_DOUBLE},
    {"last_loss", offsetof(cai_ckpt_meta, last_loss), K_DOUBLE},
    {"layout.world", offsetof(cai_ckpt_meta, world_size), K_INT},
    {"layout.dp", offsetof(cai_ckpt_meta, layout.dp), K_INT},
    {"layout.tp", offsetof(cai_ckpt_meta, layout.tp), K_INT},
    {"layout.pp", offsetof(cai_ckpt_meta, layout.pp), K_INT},
    {"layout.sp", offsetof(cai_ckpt_meta, layout.sp), K_INT},
    {"layout.ep", offsetof(cai_ckpt_meta, layout.ep), K_INT},
};

static const field k_model_fields[] = {
    {"model.vocab_size", offsetof(cai_model_config, vocab_size), K_INT},
    {"model.vocab_multiple", offsetof(cai_model_config, vocab_multiple), K_INT},
    {"model.n_layers", offsetof(cai_model_config, n_layers), K_INT},
    {"model.d_model", offsetof(cai_model_config, d_model), K_INT},
    {"model.n_heads", offsetof(cai_model_config, n_heads), K_INT},
    {"model.n_kv_heads", offsetof(cai_model_config, n_kv_heads), K_INT},
    {"model.ffn_hidden", offsetof(cai_model_config, ffn_hidden), K_INT},
    {"model.max_seq_len", offsetof(cai_model_config, max_seq_len), K_INT},
    {"model.tie_embeddings", offsetof(cai_model_config, tie_embeddings), K_INT},
    {"model.activation_checkpointing", offsetof(cai_model_config, activation_checkpointing), K_INT},
    {"model.rope_theta", offsetof(cai_model_config, rope_theta), K_FLOAT},
    {"model.norm_eps", offsetof(cai_model_config, norm_eps), K_FLOAT},
    {"model.init_std", offsetof(cai_model_config, init_std), K_FLOAT},
    {"model.seed", offsetof(cai_model_config, seed), K_U64},
};

static const field k_optim_fields[] = {
    {"optim.lr", offsetof(cai_adamw_config, schedule.lr), K_FLOAT},
    {"optim.min_lr", offsetof(cai_adamw_config, schedule.min_lr), K_FLOAT},
    {"optim.warmup_steps", offsetof(cai_adamw_config, schedule.warmup_steps), K_I64},
    {"optim.decay_steps", offsetof(cai_adamw_config, schedule.decay_steps), K_I64},
    {"optim.beta1", offsetof(cai_adamw_config, beta1), K_FLOAT},
    {"optim.beta2", offsetof(cai_adamw_config, beta2), K_FLOAT},
    {"optim.eps", offsetof(cai_adamw_config, eps), K_FLOAT},
    {"optim.weight_decay", offsetof(cai_adamw_config, weight_decay), K_FLOAT},
    {"optim.grad_clip", offsetof(cai_adamw_config, grad_clip), K_FLOAT},
};

#define NF(a) ((int)(sizeof(a) / sizeof((a)[0])))


static cai_status write_fields(ck_h5 *h, const field *f, int n, const void *base) {
    const char *b = base;
    for (int i = 0; i < n; i++) {
        const void *p = b + f[i].off;
        switch (f[i].kind) {
        case K_INT: CAI_CALL(ck_h5_attr_i64(h, h->file, f[i].key, *(const int *)p)); break;
        case K_I64: CAI_CALL(ck_h5_attr_i64(h, h->file, f[i].key, *(const int64_t *)p)); break;
        case K_U64: CAI_CALL(ck_h5_attr_u64(h, h->file, f[i].key, *(const uint64_t *)p)); break;
        case K_FLOAT: CAI_CALL(ck_h5_attr_f64(h, h->file, f[i].key, *(const float *)p)); break;
        case K_DOUBLE: CAI_CALL(ck_h5_attr_f64(h, h->file, f[i].key, *(const double *)p)); break;
        }
    }
    return CAI_OK;
}

static cai_status read_fields(ck_h5 *h, const field *f, int n, void *base) {
    char *b = base;
    for (int i = 0; i < n; i++) {
        void *p = b + f[i].off;
        int64_t iv = 0;
        double dv = 0;
        switch (f[i].kind) {
        case K_INT:
            CAI_CALL(ck_h5_get_i64(h, h->file, f[i].key, &iv, NULL));
            *(int *)p = (int)iv;
            break;
        case K_I64: CAI_CALL(ck_h5_get_i64(h, h->file, f[i].key, (int64_t *)p, NULL)); break;
        case K_U64: CAI_CALL(ck_h5_get_u64(h, h->file, f[i].key, (uint64_t *)p, NULL)); break;
        case K_FLOAT:
            CAI_CALL(ck_h5_get_f64(h, h->file, f[i].key, &dv, NULL));
            *(float *)p = (float)dv;
            break;
        case K_DOUBLE: CAI_CALL(ck_h5_get_f64(h, h->file, f[i].key, (double *)p, NULL)); break;
        }
    }
    return CAI_OK;
}

/* Root attributes. `created` comes from rank 0: every rank must write the
 * same values. */
static cai_status write_meta(ck_h5 *h, const cai_ckpt_meta *m, int64_t created, const char *groups) {
    hid_t r = h->file;
    CAI_CALL(ck_h5_attr_str(h, r, "format", CAI_CKPT_FORMAT));
    CAI_CALL(ck_h5_attr_i64(h, r, "format_version", CAI_CKPT_VERSION));
    CAI_CALL(ck_h5_attr_str(h, r, "colossal_version", cai_version_string()));
    CAI_CALL(ck_h5_attr_i64(h, r, "created_unix", created));
    CAI_CALL(ck_h5_attr_str(h, r, "app", m->app));
    CAI_CALL(ck_h5_attr_str(h, r, "checksum", "xsum64"));
    CAI_CALL(ck_h5_attr_str(h, r, "tensor_groups", groups));
    CAI_CALL(write_fields(h, k_meta_fields, NF(k_meta_fields), m));
    CAI_CALL(ck_h5_attr_str(h, r, "layout.order", m->layout.order && *m->layout.order ? m->layout.order
                                                                                         : "pp,dp,ep,sp,tp"));
    CAI_CALL(ck_h5_attr_i64(h, r, "has_model", m->has_model));
    if (m->has_model) {
        CAI_CALL(ck_h5_attr_str(h, r, "model.family", cai_model_family_name(m->model.family)));
        CAI_CALL(ck_h5_attr_i64(h, r, "model.padded_vocab", cai_model_config_padded_vocab(&m->model)));
        CAI_CALL(ck_h5_attr_str(h, r, "model.param_dtype", cai_dtype_name(m->model.param_dtype)));
        CAI_CALL(ck_h5_attr_str(h, r, "model.act_dtype", cai_dtype_name(m->model.act_dtype)));
        CAI_CALL(write_fields(h, k_model_fields, NF(k_model_fields), &m->model));
    }
    CAI_CALL(ck_h5_attr_i64(h, r, "has_optim", m->has_optim));
    if (m->has_optim) {
        CAI_CALL(ck_h5_attr_str(h, r, "optim.kind", "adamw"));
        CAI_CALL(ck_h5_attr_str(h, r, "optim.schedule", cai_lr_kind_name(m->optim.schedule.kind)));
        CAI_CALL(write_fields(h, k_optim_fields, NF(k_optim_fields), &m->optim));
    }
    if (m->config_text) CAI_CALL(ck_h5_text_write(h, CK_CONFIG_DATASET, m->config_text));
    return CAI_OK;
}

/* Reads and checks the root attributes. */
cai_status ck_read_meta(ck_h5 *h, cai_ckpt_meta *m) {
    *m = cai_ckpt_meta_init();
    char buf[256];
    int found = 0;
    CAI_CALL(ck_h5_get_str(h, h->file, "format", buf, sizeof buf, &found));
    if (!found || strcmp(buf, CAI_CKPT_FORMAT) != 0)
        return CAI_ERROR(CAI_ERR_FORMAT, "'%s' is an HDF5 file but not a colossal checkpoint (its root attribute "
                         "'format' is %s%s%s, expected \"%s\")", h->path, found ? "\"" : "missing", found ? buf : "",
                         found ? "\"" : "", CAI_CKPT_FORMAT);
    int64_t v = 0;
    CAI_CALL(ck_h5_get_i64(h, h->file, "format_version", &v, NULL));
    if (v < 1 || v > CAI_CKPT_VERSION)
        return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' has format version %lld; this build reads version 1 to %d "
                         "(written by a newer colossal?)", h->path, (long long)v, CAI_CKPT_VERSION);
    m->format_version = (int)v;
    CAI_CALL(ck_h5_get_str(h, h->file, "colossal_version", m->colossal_version, sizeof m->colossal_version, NULL));
    CAI_CALL(ck_h5_get_i64(h, h->file, "created_unix", &m->created_unix, NULL));
    CAI_CALL(ck_h5_get_str(h, h->file, "app", m->app, sizeof m->app, NULL));
    CAI_CALL(read_fields(h, k_meta_fields, NF(k_meta_fields), m));
    CAI_CALL(ck_h5_get_i64(h, h->file, "has_model", &v, NULL));
    m->has_model = v != 0;
    if (m->has_model) {
        CAI_CALL(ck_h5_get_str(h, h->file, "model.family", buf, sizeof buf, NULL));
        if (cai_model_family_parse(buf, &m->model.family) != CAI_OK) {
            cai_error_clear();
            return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': model.family \"%s\" is not a model family this build "
                             "knows", h->path, buf);
        }
        CAI_CALL(read_fields(h, k_model_fields, NF(k_model_fields), &m->model));
        const char *dk[2] = {"model.param_dtype", "model.act_dtype"};
        cai_dtype *dv[2] = {&m->model.param_dtype, &m->model.act_dtype};
        for (int i = 0; i < 2; i++) {
            CAI_CALL(ck_h5_get_str(h, h->file, dk[i], buf, sizeof buf, NULL));
            if (cai_dtype_parse(buf, dv[i]) != CAI_OK) {
                cai_error_clear();
                return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': %s \"%s\" is not a dtype", h->path, dk[i], buf);
            }
        }
    }
    CAI_CALL(ck_h5_get_i64(h, h->file, "has_optim", &v, NULL));
    m->has_optim = v != 0;
    if (m->has_optim) {
        CAI_CALL(ck_h5_get_str(h, h->file, "optim.schedule", buf, sizeof buf, NULL));
        if (cai_lr_kind_parse(buf, &m->optim.schedule.kind) != CAI_OK) {
            cai_error_clear();
            return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': optim.schedule \"%s\" is unknown", h->path, buf);
        }
        CAI_CALL(read_fields(h, k_optim_fields, NF(k_optim_fields), &m->optim));
    }
    int found_text = 0;
    CAI_CALL(ck_h5_text_read(h, CK_CONFIG_DATASET, &m->config_text, &found_text));
    return CAI_OK;
}

/* The architecture must match for the tensors to mean anything; the error
 * names the first field that differs. Numerics that do not change shapes
 * (epsilon, RoPE base) only warn: continuing with a changed one is a
 * choice, not a corruption. */
static cai_status check_model(const char *path, const cai_ckpt_meta *m, const cai_model_config *want) {
    if (!m->has_model)
        return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' records no model config; cannot check it fits this model",
                         path);
    const cai_model_config *got = &m->model;
    if (got->family != want->family)
        return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' holds a %s model; this run builds %s (model.family)", path,
                         cai_model_family_name(got->family), cai_model_family_name(want->family));
    struct {
        const char *key;
        long long file, here;
    } f[] = {
        {"model.n_layers", got->n_layers, want->n_layers},
        {"model.d_model", got->d_model, want->d_model},
        {"model.n_heads", got->n_heads, want->n_heads},
        {"model.n_kv_heads", got->n_kv_heads, want->n_kv_heads},
        {"model.ffn_hidden", got->ffn_hidden, want->ffn_hidden},
        {"model.vocab_size", got->vocab_size, want->vocab_size},
        {"padded vocabulary (model.vocab_multiple)", cai_model_config_padded_vocab(got),
         cai_model_config_padded_vocab(want)},
        {"model.tie_embeddings", got->tie_embeddings, want->tie_embeddings},
        {"model.max_seq_len (train.seq_len)", want->family == CAI_MODEL_GPT2 ? got->max_seq_len : 0,
         want->family == CAI_MODEL_GPT2 ? want->max_seq_len : 0},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].file != f[i].here)
            return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' holds a different model: %s is %lld in the file, %lld "
                             "in this run", path, f[i].key, f[i].file, f[i].here);
    if (got->norm_eps != want->norm_eps)
        CAI_WARN("checkpoint '%s': model.norm_eps was %g, now %g", path, (double)got->norm_eps,
                 (double)want->norm_eps);
    if (want->family == CAI_MODEL_LLAMA && got->rope_theta != want->rope_theta)
        CAI_WARN("checkpoint '%s': model.rope_theta was %g, now %g", path, (double)got->rope_theta,
                 (double)want->rope_theta);
    return CAI_OK;
}

/* ------------------------------------------------------------ engine */

typedef struct {
    cai_mesh_t *mesh;
    MPI_Comm comm;
    int rank, size;
    const cai_ckpt_layout *L;
    const cai_ckpt_buffer *bufs;
    int nb, np;
    size_t total;       /* elements of the flat layout */
    size_t *off;        /* [np] flat offsets, SIZE_MAX when not held */
    cai_param_shard *sh; /* [np] */
    int *rep_q, *rep_r; /* [np] this rank's slot among the replicas of each parameter */
    hid_t *ds;          /* [nb * np] dataset of each (buffer, tie primary), -1 otherwise */
    cai_dtype *fdt;     /* [nb * np] file type of each dataset */
    int *rounds;        /* [nb * np] transfers per (buffer, parameter) */
    uint64_t *xs;       /* [nb * np] checksum partial sums */
    const char **group; /* [nb] the group each buffer uses in this file */
    ck_h5 h;
    ck_xfer x;
    char name[CAI_CKPT_NAME_MAX];
} engine;

static void engine_free(engine *e) {
    if (e->ds)
        for (int i = 0; i < e->nb * e->np; i++)
            if (e->ds[i] >= 0) H5Dclose(e->ds[i]);
    ck_xfer_free(&e->x);
    cai_free(e->off);
    cai_free(e->sh);
    cai_free(e->rep_q);
    cai_free(e->rep_r);
    cai_free(e->ds);
    cai_free(e->fdt);
    cai_free(e->rounds);
    cai_free(e->xs);
    free((void *)e->group);
}

/* The ranks holding the same elements of a parameter, along the layout's
 * replica axis. Experts are replicated only over their expert-data-parallel
 * group (dp / ep), not over the whole dp axis. */
static void replica_slot(const engine *e, const cai_param_info *info, int *q, int *r) {
    cai_axis ax = e->L->replica_axis;
    *q = 0;
    *r = 1;
    if (ax == CAI_AXIS_COUNT) return;
    if (info->spec.expert >= 0 && e->L->view.ep_size > 1 && (ax == CAI_AXIS_DP || ax == CAI_AXIS_DP_SP)) {
        int eq = cai_mesh_rank(e->mesh, CAI_AXIS_EDP), er = cai_mesh_size(e->mesh, CAI_AXIS_EDP);
        int sq = ax == CAI_AXIS_DP_SP ? cai_mesh_rank(e->mesh, CAI_AXIS_SP) : 0;
        int sr = ax == CAI_AXIS_DP_SP ? cai_mesh_size(e->mesh, CAI_AXIS_SP) : 1;
        *q = sq * er + eq;
        *r = sr * er;
        return;
    }
    *q = cai_mesh_rank(e->mesh, ax);
    *r = cai_mesh_size(e->mesh, ax);
}

static cai_status engine_init(engine *e, cai_mesh_t *mesh, const cai_ckpt_layout *L, const cai_ckpt_buffer *bufs,
                              int nb) {
    memset(e, 0, sizeof *e);
    e->h.file = e->h.bf16 = -1;
    e->mesh = mesh;
    e->comm = cai_mesh_comm(mesh, CAI_AXIS_WORLD);
    MPI_Comm_rank(e->comm, &e->rank);
    MPI_Comm_size(e->comm, &e->size);
    e->L = L;
    e->bufs = bufs;
    e->nb = nb;
    e->np = cai_registry_count(L->reg);
    int np = e->np, n = nb * np;
    CAI_CALL(cai_registry_check_view(L->reg, &L->view));
    for (int b = 0; b < nb; b++) {
        const cai_ckpt_buffer *B = &bufs[b];
        CAI_CHECK_ARG(B->group && *B->group, "checkpoint buffer %d has no group name", b);
        CAI_CHECK_ARG(ck_file_dtype_ok(B->dtype) && ck_file_dtype_ok(B->file_dtype),
                      "checkpoint buffer %s: dtypes %s (memory) and %s (file) must be f32, bf16 or f16", B->group,
                      cai_dtype_name(B->dtype), cai_dtype_name(B->file_dtype));
        CAI_CHECK_ARG(B->flat_begin <= B->flat_end, "checkpoint buffer %s: flat range [%zu, %zu) is reversed",
                      B->group, B->flat_begin, B->flat_end);
    }
    CAI_CALL(cai_calloc((void **)&e->off, (size_t)np + 1, sizeof *e->off, "checkpoint offsets"));
    CAI_CALL(cai_calloc((void **)&e->sh, (size_t)np + 1, sizeof *e->sh, "checkpoint shards"));
    CAI_CALL(cai_calloc((void **)&e->rep_q, (size_t)np + 1, sizeof *e->rep_q, "checkpoint replicas"));
    CAI_CALL(cai_calloc((void **)&e->rep_r, (size_t)np + 1, sizeof *e->rep_r, "checkpoint replicas"));
    CAI_CALL(cai_calloc((void **)&e->ds, (size_t)n + 1, sizeof *e->ds, "checkpoint datasets"));
    CAI_CALL(cai_calloc((void **)&e->fdt, (size_t)n + 1, sizeof *e->fdt, "checkpoint dataset types"));
    CAI_CALL(cai_calloc((void **)&e->rounds, (size_t)n + 1, sizeof *e->rounds, "checkpoint rounds"));
    CAI_CALL(cai_calloc((void **)&e->xs, (size_t)n + 1, sizeof *e->xs, "checkpoint checksums"));
    e->group = calloc((size_t)nb + 1, sizeof *e->group);
    if (!e->group) return CAI_ERROR(CAI_ERR_NOMEM, "checkpoint group table");
    for (int i = 0; i < n; i++) e->ds[i] = -1;
    CAI_CALL(cai_registry_local_layout(L->reg, &L->view, L->align_elems, e->off, &e->total));
    for (int i = 0; i < np; i++) {
        CAI_CALL(cai_registry_shard(L->reg, i, &L->view, &e->sh[i]));
        replica_slot(e, cai_registry_param(L->reg, i), &e->rep_q[i], &e->rep_r[i]);
    }
    for (int b = 0; b < nb; b++) {
        const cai_ckpt_buffer *B = &bufs[b];
        if (B->flat_end > e->total)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "checkpoint buffer %s: flat range ends at %zu beyond the layout's "
                             "%zu elements", B->group, B->flat_end, e->total);
        e->group[b] = B->group;
    }
    return CAI_OK;
}

static int is_primary(const engine *e, int i) { return cai_registry_param(e->L->reg, i)->tie_primary == i; }

/* Local elements [*lo, *hi) of parameter i that buffer b holds. */
static void held_range(const engine *e, int b, int i, uint64_t *lo, uint64_t *hi) {
    *lo = *hi = 0;
    if (e->off[i] == SIZE_MAX || e->sh[i].local_numel == 0) return;
    const cai_ckpt_buffer *B = &e->bufs[b];
    uint64_t off = e->off[i], n = e->sh[i].local_numel;
    uint64_t fb = B->flat_begin, fe = B->flat_end == 0 && fb == 0 ? e->total : B->flat_end;
    uint64_t a = fb > off ? fb - off : 0, z = fe > off ? fe - off : 0;
    if (z > n) z = n;
    if (a < z) *lo = a, *hi = z;
}

/* The slice of parameter i this rank writes from buffer b. */
static void write_range(const engine *e, int b, int i, uint64_t *a, uint64_t *z) {
    uint64_t lo, hi;
    held_range(e, b, i, &lo, &hi);
    if (e->bufs[b].replicated) ck_replica_chunk(lo, hi, e->rep_q[i], e->rep_r[i], a, z);
    else *a = lo, *z = hi;
}

/* Local range this rank reads into buffer b for parameter i (tie copies
 * read their primary's dataset). */
static void read_range(const engine *e, int b, int i, uint64_t *lo, uint64_t *hi) {
    const cai_param_info *info = cai_registry_param(e->L->reg, i);
    if (e->bufs[b].skip_tie_copies && info->tie_primary != i && e->off[info->tie_primary] != SIZE_MAX) {
        *lo = *hi = 0;
        return;
    }
    held_range(e, b, i, lo, hi);
}

static ck_mem mem_of(const engine *e, int b, int i) {
    const cai_ckpt_buffer *B = &e->bufs[b];
    size_t msz = cai_dtype_size(B->dtype);
    /* Element 0 of the shard sits at flat offset off[i]; the buffer starts at flat_begin. */
    ck_mem m = {(char *)B->data + ((ptrdiff_t)e->off[i] - (ptrdiff_t)B->flat_begin) * (ptrdiff_t)msz, B->dtype,
                B->dev};
    return m;
}

static uint64_t pieces(const engine *e, uint64_t a, uint64_t z) { return z > a ? (z - a + e->x.piece - 1) / e->x.piece : 0; }

static const char *dataset_name(engine *e, int b, int i) {
    snprintf(e->name, sizeof e->name, "%s/%s", e->group[b], cai_registry_param(e->L->reg, i)->name);
    return e->name;
}

/* The members of i's tie group in registration order (i alone when untied). */
static int members(const engine *e, int i, int *out, int max) {
    const cai_param_info *info = cai_registry_param(e->L->reg, i);
    if (info->spec.tie_group <= 0) {
        out[0] = i;
        return 1;
    }
    return cai_registry_tie_members(e->L->reg, info->spec.tie_group, out, max);
}

#define MAX_TIE 16

/* Transfers per (buffer, parameter): the maximum over ranks of the pieces. */
static cai_status agree_rounds(engine *e, int write) {
    for (int b = 0; b < e->nb; b++)
        for (int i = 0; i < e->np; i++) {
            uint64_t a = 0, z = 0;
            if (write) {
                if (is_primary(e, i)) write_range(e, b, i, &a, &z);
            } else {
                read_range(e, b, i, &a, &z);
            }
            e->rounds[b * e->np + i] = (int)pieces(e, a, z);
        }
    CAI_CALL_MPI(MPI_Allreduce(MPI_IN_PLACE, e->rounds, e->nb * e->np, MPI_INT, MPI_MAX, e->comm));
    return CAI_OK;
}

/* Every transfer of dataset (b, p): for each tie member, its rounds. A rank
 * that has failed keeps taking part with empty selections so the others do
 * not hang in a collective; the failure is agreed on afterwards. */
static cai_status move_dataset(engine *e, int b, int p, int write, cai_status st) {
    int mem[MAX_TIE];
    int nm = members(e, p, mem, MAX_TIE);
    hid_t ds = e->ds[b * e->np + p];
    cai_dtype fdt = e->fdt[b * e->np + p];
    char what[CAI_CKPT_NAME_MAX];
    snprintf(what, sizeof what, "%s", dataset_name(e, b, p));
    for (int k = 0; k < nm; k++) {
        int i = mem[k];
        uint64_t a = 0, z = 0, wa = 0, wz = 0;
        if (write) {
            if (i != p) continue; /* copies are not stored */
            write_range(e, b, i, &a, &z);
        } else {
            read_range(e, b, i, &a, &z);
            if (i == p) write_range(e, b, i, &wa, &wz);
        }
        ck_mem m = mem_of(e, b, i);
        for (int r = 0; r < e->rounds[b * e->np + i]; r++) {
            uint64_t pa = a + (uint64_t)r * e->x.piece, pz = pa + e->x.piece < z ? pa + e->x.piece : z;
            if (st != CAI_OK || pa >= z) pa = pz = 0;
            cai_status s = ck_xfer_piece(&e->x, ds, what, &e->sh[i], pa, pz, write, fdt, st == CAI_OK ? &m : NULL,
                                         wa, wz, i == p ? &e->xs[b * e->np + p] : NULL);
            if (s != CAI_OK && st == CAI_OK) st = s;
        }
    }
    return st;
}

/* "/"-separated path of groups exists. Collective (metadata reads). */
static cai_status path_exists(ck_h5 *h, const char *path, int *exists) {
    char part[CAI_CKPT_NAME_MAX];
    size_t len = strlen(path);
    *exists = 0;
    if (len >= sizeof part) return CAI_OK;
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        memcpy(part, path, i);
        part[i] = '\0';
        htri_t ex = H5Lexists(h->file, part, H5P_DEFAULT);
        if (ex < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot look up %s", h->path, part);
        if (ex == 0) return CAI_OK;
    }
    *exists = 1;
    return CAI_OK;
}

static cai_status sum_checksums(engine *e) {
    CAI_CALL_MPI(MPI_Allreduce(MPI_IN_PLACE, e->xs, e->nb * e->np, MPI_UINT64_T, MPI_SUM, e->comm));
    return CAI_OK;
}

static void stats_fill(const engine *e, cai_ckpt_stats *s, double t0) {
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->seconds = cai_time_now() - t0;
    s->io_seconds = e->x.io.io_seconds;
    s->rank_bytes = e->x.io.bytes;
    s->n_transfers = e->x.io.n_transfers;
    s->n_collective = e->x.io.n_collective;
    for (int b = 0; b < e->nb; b++)
        for (int p = 0; p < e->np; p++)
            if (is_primary(e, p)) {
                s->n_datasets++;
                s->bytes += cai_registry_param(e->L->reg, p)->numel * cai_dtype_size(e->fdt[b * e->np + p]);
            }
}

/* Test hook (docs/checkpoint.md): CAI_CKPT_TEST_STALL=N[:R] makes rank R
 * (default: the last) stop for 10 minutes after writing N tensors, so a test
 * can kill it in the middle of a save. */
static void test_stall(const engine *e, int done, const char *tmp) {
    const char *env = getenv("CAI_CKPT_TEST_STALL");
    if (!env || !*env) return;
    int n = -1, r = e->size - 1;
    if (sscanf(env, "%d:%d", &n, &r) < 1 || done != n || e->rank != r) return;
    fprintf(stderr, "checkpoint test hook: rank %d (pid %ld) stalls after %d tensors of %s\n", e->rank,
            (long)getpid(), done, tmp);
    fflush(stderr);
    for (int i = 0; i < 600; i++) sleep(1);
}

static cai_status tmp_path(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    int n = slash ? snprintf(out, cap, "%.*s/.%s.tmp", (int)(slash - path), path, slash + 1)
                  : snprintf(out, cap, ".%s.tmp", path);
    if (n < 0 || (size_t)n >= cap) return CAI_ERROR(CAI_ERR_INVALID_ARG, "checkpoint path '%s' is too long", path);
    return CAI_OK;
}

/* fsync the directory holding `path`, so a rename survives a crash. */
static cai_status sync_dir_of(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? (slash == path ? "/" : path) : ".");
    return ck_sync_dir(dir);
}

cai_status cai_ckpt_save_buffers(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                 const cai_ckpt_buffer *bufs, int n_bufs, const cai_ckpt_meta *meta,
                                 cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && *path && layout && layout->reg && (bufs || n_bufs == 0) && n_bufs >= 0 && meta,
                  "cai_ckpt_save_buffers: NULL argument");
    CAI_CHECK_ARG(meta->has_model, "cai_ckpt_save_buffers: meta->has_model must be set (the model config is part of "
                  "every checkpoint)");
    double t0 = cai_time_now();
    engine e;
    cai_status st = engine_init(&e, mesh, layout, bufs, n_bufs);
    char tmp[4096] = "";
    if (st == CAI_OK) st = tmp_path(path, tmp, sizeof tmp);
    ck_xfer_init(&e.x, &e.h, CK_PIECE_BYTES / 4);
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail);

    int64_t created = (int64_t)time(NULL);
    int mrc = MPI_Bcast(&created, 1, MPI_INT64_T, 0, e.comm);
    CAI_CALL_GOTO(mrc == MPI_SUCCESS ? CAI_OK : cai_error_mpi(mrc, __FILE__, __LINE__, __func__, "MPI_Bcast"), st,
                  fail);
    char groups[1024] = "";
    for (int b = 0; b < n_bufs; b++)
        snprintf(groups + strlen(groups), sizeof groups - strlen(groups), "%s%s", b ? "," : "", bufs[b].group);

    CAI_CALL_GOTO(ck_h5_create(&e.h, e.comm, tmp), st, fail);
    {
        cai_ckpt_meta m = *meta;
        if (m.world_size == 0) {
            m.layout = *cai_mesh_layout(mesh);
            m.world_size = e.size;
        }
        CAI_CALL_GOTO(write_meta(&e.h, &m, created, groups), st, fail);
    }
    for (int b = 0; b < n_bufs; b++) {
        CAI_CALL_GOTO(ck_h5_group(&e.h, bufs[b].group), st, fail);
        for (int p = 0; p < e.np; p++) {
            if (!is_primary(&e, p)) continue;
            const cai_param_info *info = cai_registry_param(layout->reg, p);
            e.fdt[b * e.np + p] = bufs[b].file_dtype;
            CAI_CALL_GOTO(ck_h5_dataset_create(&e.h, dataset_name(&e, b, p), bufs[b].file_dtype, info->ndim,
                                               info->shape, &e.ds[b * e.np + p]), st, fail);
        }
    }
    CAI_CALL_GOTO(agree_rounds(&e, 1), st, fail);
    int done = 0;
    cai_status local = CAI_OK;
    for (int b = 0; b < n_bufs; b++)
        for (int p = 0; p < e.np; p++) {
            if (e.ds[b * e.np + p] < 0) continue;
            local = move_dataset(&e, b, p, 1, local);
            test_stall(&e, ++done, tmp);
        }
    CAI_CALL_GOTO(ck_agree(e.comm, local), st, fail);
    CAI_CALL_GOTO(sum_checksums(&e), st, fail);
    for (int k = 0; k < n_bufs * e.np; k++)
        if (e.ds[k] >= 0) {
            CAI_CALL_GOTO(ck_h5_attr_u64(&e.h, e.ds[k], "xsum64", e.xs[k]), st, fail);
            H5Dclose(e.ds[k]);
            e.ds[k] = -1;
        }
    CAI_CALL_GOTO(ck_h5_flush(&e.h), st, fail);
    st = ck_h5_close(&e.h);
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail);
    /* Complete and closed on every rank: now it may take its name. */
    if (e.rank == 0) {
        if (rename(tmp, path) != 0)
            st = CAI_ERROR(CAI_ERR_IO, "cannot rename checkpoint '%s' to '%s': %s", tmp, path, strerror(errno));
        else
            st = sync_dir_of(path);
    }
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail);
    stats_fill(&e, stats, t0);
    engine_free(&e);
    return CAI_OK;
fail:
    engine_free(&e);
    ck_h5_close(&e.h);
    if (e.rank == 0 && *tmp) unlink(tmp);
    return st;
}

/* ------------------------------------------------------------ load */

/* Open the datasets of every buffer and check them against the registry. */
static cai_status open_datasets(engine *e) {
    for (int b = 0; b < e->nb; b++) {
        const cai_ckpt_buffer *B = &e->bufs[b];
        int ex = 0;
        CAI_CALL(path_exists(&e->h, B->group, &ex));
        if (!ex && B->alt_group) {
            CAI_CALL(path_exists(&e->h, B->alt_group, &ex));
            if (ex) e->group[b] = B->alt_group;
        }
        if (!ex)
            return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' has no tensor group '%s'%s%s%s", e->h.path, B->group,
                             B->alt_group ? " (nor '" : "", B->alt_group ? B->alt_group : "",
                             B->alt_group ? "')" : "");
        for (int p = 0; p < e->np; p++) {
            if (!is_primary(e, p)) continue;
            const cai_param_info *info = cai_registry_param(e->L->reg, p);
            const char *name = dataset_name(e, b, p);
            htri_t has = H5Lexists(e->h.file, name, H5P_DEFAULT);
            if (has <= 0)
                return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' has no tensor %s (a checkpoint of another model, or "
                                 "damaged)", e->h.path, name);
            hid_t ds = H5Dopen2(e->h.file, name, H5P_DEFAULT);
            if (ds < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot open tensor %s", e->h.path, name);
            e->ds[b * e->np + p] = ds;
            int nd = 0;
            uint64_t shape[CAI_CKPT_MAX_DIMS];
            cai_dtype dt;
            char desc[96];
            CAI_CALL(ck_h5_dataset_info(&e->h, ds, name, &nd, shape, &dt, desc, sizeof desc));
            int same = nd == info->ndim;
            for (int d = 0; same && d < nd; d++) same = shape[d] == info->shape[d];
            if (!same) {
                char fs[128] = "", ms[128] = "";
                for (int d = 0; d < nd; d++)
                    snprintf(fs + strlen(fs), sizeof fs - strlen(fs), "%s%llu", d ? ", " : "",
                             (unsigned long long)shape[d]);
                for (int d = 0; d < info->ndim; d++)
                    snprintf(ms + strlen(ms), sizeof ms - strlen(ms), "%s%llu", d ? ", " : "",
                             (unsigned long long)info->shape[d]);
                return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': tensor %s has shape [%s] but the model expects "
                                 "[%s]", e->h.path, name, fs, ms);
            }
            if (!ck_file_dtype_ok(dt))
                return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': tensor %s has element type %s (expected f32, bf16 "
                                 "or f16)", e->h.path, name, desc);
            e->fdt[b * e->np + p] = dt;
        }
    }
    return CAI_OK;
}

static cai_status load_impl(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                            const cai_ckpt_buffer *bufs, int n_bufs, cai_ckpt_meta *meta_out,
                            const cai_model_config *expect, cai_ckpt_stats *stats) {
    double t0 = cai_time_now();
    engine e;
    cai_ckpt_meta meta = cai_ckpt_meta_init();
    cai_status st = engine_init(&e, mesh, layout, bufs, n_bufs);
    ck_xfer_init(&e.x, &e.h, CK_PIECE_BYTES / 4);
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail);
    CAI_CALL_GOTO(ck_h5_open(&e.h, e.comm, path), st, fail);
    CAI_CALL_GOTO(ck_read_meta(&e.h, &meta), st, fail);
    if (expect) CAI_CALL_GOTO(check_model(path, &meta, expect), st, fail);
    CAI_CALL_GOTO(open_datasets(&e), st, fail);
    CAI_CALL_GOTO(agree_rounds(&e, 0), st, fail);
    cai_status local = CAI_OK;
    for (int b = 0; b < n_bufs; b++)
        for (int p = 0; p < e.np; p++)
            if (e.ds[b * e.np + p] >= 0) local = move_dataset(&e, b, p, 0, local);
    CAI_CALL_GOTO(ck_agree(e.comm, local), st, fail);
    CAI_CALL_GOTO(sum_checksums(&e), st, fail);
    int n_bad = 0;
    char first[CAI_CKPT_NAME_MAX] = "";
    uint64_t want = 0, got = 0;
    for (int b = 0; b < n_bufs; b++)
        for (int p = 0; p < e.np; p++) {
            hid_t ds = e.ds[b * e.np + p];
            if (ds < 0) continue;
            uint64_t stored = 0;
            CAI_CALL_GOTO(ck_h5_get_u64(&e.h, ds, "xsum64", &stored, NULL), st, fail);
            if (stored != e.xs[b * e.np + p] && n_bad++ == 0) {
                snprintf(first, sizeof first, "%s", dataset_name(&e, b, p));
                want = stored;
                got = e.xs[b * e.np + p];
            }
        }
    if (n_bad) {
        st = CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': tensor %s is corrupt: its data hashes to %016llx but "
                       "%016llx was stored when it was written (%d tensor%s bad)", path, first,
                       (unsigned long long)got, (unsigned long long)want, n_bad, n_bad == 1 ? "" : "s");
        goto fail;
    }
    stats_fill(&e, stats, t0);
    engine_free(&e);
    st = ck_h5_close(&e.h);
    if (st != CAI_OK) goto out;
    if (meta_out) {
        *meta_out = meta;
        return CAI_OK;
    }
    cai_ckpt_meta_free(&meta);
    return CAI_OK;
fail:
    engine_free(&e);
    ck_h5_close(&e.h);
out:
    cai_ckpt_meta_free(&meta);
    return st;
}

cai_status cai_ckpt_load_buffers(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                 const cai_ckpt_buffer *bufs, int n_bufs, cai_ckpt_meta *meta,
                                 cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && *path && layout && layout->reg && (bufs || n_bufs == 0) && n_bufs >= 0,
                  "cai_ckpt_load_buffers: NULL argument");
    return load_impl(mesh, path, layout, bufs, n_bufs, meta, NULL, stats);
}

/* ------------------------------------------------------------ model + optimizer */

static cai_ckpt_layout model_layout(cai_model_t *model) {
    cai_ckpt_layout L = {cai_model_registry(model), *cai_model_view(model), cai_model_align_elems(model),
                         CAI_AXIS_DP_SP};
    return L;
}

static cai_device_t *buffer_device(cai_model_t *model) {
    cai_device_t *dev = cai_model_device(model);
    return dev->kind == CAI_DEVICE_HOST ? NULL : dev;
}

/* The AdamW moments as two buffers at out[0..1]; returns 2. A tie copy the
 * optimizer does not update keeps its (unused, zero) moments on load. */
static int optim_buffers(cai_optim_t *optim, cai_device_t *dev, cai_ckpt_buffer *out) {
    cai_tensor mt, vt;
    cai_optim_state(optim, &mt, &vt);
    out[0] = (cai_ckpt_buffer){"optim/exp_avg", NULL, mt.data, dev, CAI_DTYPE_F32, CAI_DTYPE_F32, 0, 0, 1, 1};
    out[1] = (cai_ckpt_buffer){"optim/exp_avg_sq", NULL, vt.data, dev, CAI_DTYPE_F32, CAI_DTYPE_F32, 0, 0, 1, 1};
    return 2;
}

cai_status cai_ckpt_save(cai_mesh_t *mesh, const char *path, cai_model_t *model, cai_optim_t *optim,
                         const cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && model, "cai_ckpt_save: NULL argument");
    cai_ckpt_meta m = meta ? *meta : cai_ckpt_meta_init();
    m.model = *cai_model_config_of(model);
    m.has_model = 1;
    m.has_optim = optim != NULL;
    if (optim) {
        m.optim = *cai_optim_config(optim);
        if (!meta) m.step = cai_optim_step_count(optim);
    }
    m.layout = *cai_mesh_layout(mesh);
    MPI_Comm_size(cai_mesh_comm(mesh, CAI_AXIS_WORLD), &m.world_size);

    cai_tensor params, grads, lowp;
    cai_model_flat(model, &params, &grads, &lowp);
    cai_device_t *dev = buffer_device(model);
    cai_ckpt_buffer bufs[4];
    int n = 0;
    if (lowp.data)
        bufs[n++] = (cai_ckpt_buffer){"model", NULL, lowp.data, dev, lowp.dtype, lowp.dtype, 0, 0, 1, 0};
    bufs[n++] = (cai_ckpt_buffer){lowp.data ? "master" : "model", NULL, params.data, dev, CAI_DTYPE_F32,
                                  CAI_DTYPE_F32, 0, 0, 1, 0};
    if (optim) n += optim_buffers(optim, dev, bufs + n);
    cai_ckpt_layout L = model_layout(model);
    CAI_CALL(cai_device_sync(cai_model_device(model)));
    CAI_CALL(cai_ckpt_save_buffers(mesh, path, &L, bufs, n, &m, stats));
    return CAI_OK;
}

cai_status cai_ckpt_load(cai_mesh_t *mesh, const char *path, cai_model_t *model, cai_optim_t *optim,
                         cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && model, "cai_ckpt_load: NULL argument");
    cai_tensor params, grads, lowp;
    cai_model_flat(model, &params, &grads, &lowp);
    cai_device_t *dev = buffer_device(model);
    cai_ckpt_buffer bufs[3];
    int n = 0;
    /* The fp32 masters are the state; the working copy is refreshed from
     * them below. An f32 run's file has only "model". */
    bufs[n++] = (cai_ckpt_buffer){"master", "model", params.data, dev, CAI_DTYPE_F32, CAI_DTYPE_F32, 0, 0, 1, 0};
    if (optim) n += optim_buffers(optim, dev, bufs + n);
    cai_ckpt_layout L = model_layout(model);
    cai_ckpt_meta m;
    CAI_CALL(cai_device_sync(cai_model_device(model)));
    cai_status st = load_impl(mesh, path, &L, bufs, n, &m, cai_model_config_of(model), stats);
    if (st != CAI_OK && optim && strstr(cai_error_message(), "has no tensor group 'optim/")) {
        /* Say what to do rather than which group is missing. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cai_error_message());
        cai_error_clear();
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: it holds weights only, no optimizer state to resume from", msg);
    }
    CAI_CALL(st);
    st = cai_model_params_updated(model);
    if (st == CAI_OK && optim) cai_optim_set_step_count(optim, m.step);
    if (st == CAI_OK && meta) *meta = m;
    else cai_ckpt_meta_free(&m);
    CAI_CALL(st);
    return CAI_OK;
}

#else /* !CAI_HAVE_HDF5 */

#define NO_HDF5(fn)                                                                                                 \
    CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: this build has no parallel HDF5, so no checkpoints (install "               \
              "libhdf5-openmpi-dev and re-run configure)", fn)

cai_status cai_ckpt_save_buffers(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                 const cai_ckpt_buffer *bufs, int n_bufs, const cai_ckpt_meta *meta,
                                 cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_save_buffers");
}
cai_status cai_ckpt_load_buffers(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                 const cai_ckpt_buffer *bufs, int n_bufs, cai_ckpt_meta *meta,
                                 cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_load_buffers");
}
cai_status cai_ckpt_save(cai_mesh_t *mesh, const char *path, cai_model_t *model, cai_optim_t *optim,
                         const cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_save");
}
cai_status cai_ckpt_load(cai_mesh_t *mesh, const char *path, cai_model_t *model, cai_optim_t *optim,
                         cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_load");
}

#endif
