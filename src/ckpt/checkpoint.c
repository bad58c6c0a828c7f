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

#include "colossal/moe.h"
#include "checkpoint_internal.h"

cai_ckpt_meta cai_ckpt_meta_init(void) {
    cai_ckpt_meta m;
    memset(&m, 0, sizeof m);
    m.loss_scale = 1.0;
    return m;
}

int cai_ckpt_available(void) { return CAI_HAVE_HDF5; }

void cai_ckpt_meta_free(cai_ckpt_meta *meta) {
    if (!meta) return;
    free(meta->config_text);
    meta->config_text = NULL;
    free(meta->fp8_state);
    meta->fp8_state = NULL;
    meta->fp8_state_len = 0;
    free(meta->app_state);
    meta->app_state = NULL;
    meta->app_state_len = 0;
}

cai_ckpt_layout ck_model_layout(cai_model_t *model) {
    cai_ckpt_layout L = {cai_model_registry(model), *cai_model_view(model), cai_model_align_elems(model),
                         CAI_AXIS_DP_SP};
    return L;
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
    {"loss_scaler.hysteresis_left", offsetof(cai_ckpt_meta, loss_scale_hysteresis_left), K_I64},
    {"loss_scaler.overflows", offsetof(cai_ckpt_meta, loss_scale_overflows), K_I64},
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

/* Written only for a model with experts; a file without them is dense. */
static const field k_moe_fields[] = {
    {"model.moe.n_experts", offsetof(cai_model_config, moe.n_experts), K_INT},
    {"model.moe.top_k", offsetof(cai_model_config, moe.top_k), K_INT},
    {"model.moe.ffn", offsetof(cai_model_config, moe.ffn), K_INT},
    {"model.moe.n_shared", offsetof(cai_model_config, moe.n_shared), K_INT},
    {"model.moe.norm_topk", offsetof(cai_model_config, moe.norm_topk), K_INT},
    {"model.moe.capacity_factor", offsetof(cai_model_config, moe.capacity_factor), K_FLOAT},
    {"model.moe.aux_coef", offsetof(cai_model_config, moe.aux_coef), K_FLOAT},
    {"model.moe.z_coef", offsetof(cai_model_config, moe.z_coef), K_FLOAT},
    {"model.moe_every", offsetof(cai_model_config, moe_every), K_INT},
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
    CAI_CALL(
        ck_h5_attr_str(h, r, "layout.order", m->layout.order && *m->layout.order ? m->layout.order : "pp,dp,ep,sp,tp"));
    CAI_CALL(ck_h5_attr_i64(h, r, "has_model", m->has_model));
    if (m->has_model) {
        CAI_CALL(ck_h5_attr_str(h, r, "model.family", cai_model_family_name(m->model.family)));
        CAI_CALL(ck_h5_attr_i64(h, r, "model.padded_vocab", cai_model_config_padded_vocab(&m->model)));
        CAI_CALL(ck_h5_attr_str(h, r, "model.param_dtype", cai_dtype_name(m->model.param_dtype)));
        CAI_CALL(ck_h5_attr_str(h, r, "model.act_dtype", cai_dtype_name(m->model.act_dtype)));
        CAI_CALL(write_fields(h, k_model_fields, NF(k_model_fields), &m->model));
        if (m->model.moe.n_experts > 0) {
            CAI_CALL(write_fields(h, k_moe_fields, NF(k_moe_fields), &m->model));
            CAI_CALL(ck_h5_attr_str(h, r, "model.moe.router", cai_moe_router_name(m->model.moe.router)));
            CAI_CALL(ck_h5_attr_str(h, r, "model.moe.routing", cai_moe_routing_name(m->model.moe.routing)));
        }
    }
    CAI_CALL(ck_h5_attr_i64(h, r, "has_optim", m->has_optim));
    if (m->has_optim) {
        CAI_CALL(ck_h5_attr_str(h, r, "optim.kind", "adamw"));
        CAI_CALL(ck_h5_attr_str(h, r, "optim.schedule", cai_lr_kind_name(m->optim.schedule.kind)));
        CAI_CALL(write_fields(h, k_optim_fields, NF(k_optim_fields), &m->optim));
        CAI_CALL(ck_h5_attr_i64(h, r, "optim.step", m->optim_step > 0 ? m->optim_step : m->step));
    }
    if (m->config_text) CAI_CALL(ck_h5_text_write(h, CK_CONFIG_DATASET, m->config_text));
    if (m->fp8_state) CAI_CALL(ck_h5_f32_write(h, CK_FP8_DATASET, m->fp8_state, m->fp8_state_len));
    if (m->app_state) CAI_CALL(ck_h5_f32_write(h, CK_APP_DATASET, m->app_state, m->app_state_len));
    return CAI_OK;
}

/* ------------------------------------------------------------ metadata checks
 * Values no writer produces are refused on load, naming the file and the
 * attribute: a hand-edited or damaged checkpoint must not resume quietly
 * at step -7 or on a world of 0 ranks. */

#define CK_MAX_COUNT ((int64_t)1 << 53) /* steps, tokens, samples: beyond any run, exact in a double */

static cai_status bad_attr(const ck_h5 *h, const char *attr, long long value, const char *why) {
    return CAI_ERROR(CAI_ERR_FORMAT,
                     "checkpoint '%s': attribute '%s' is %lld: %s (no colossal writer produces it; "
                     "the file is damaged or was edited)",
                     h->path, attr, value, why);
}

static cai_status check_count(const ck_h5 *h, const char *attr, int64_t v) {
    if (v < 0) return bad_attr(h, attr, (long long)v, "negative");
    if (v > CK_MAX_COUNT) return bad_attr(h, attr, (long long)v, "past 2^53, more than any run reaches");
    return CAI_OK;
}

static cai_status check_meta_values(const ck_h5 *h, const cai_ckpt_meta *m) {
    CAI_CALL(check_count(h, "step", m->step));
    CAI_CALL(check_count(h, "tokens", m->tokens));
    CAI_CALL(check_count(h, "consumed_samples", m->consumed_samples));
    if (m->has_optim) {
        if (m->optim_step < 0) return bad_attr(h, "optim.step", (long long)m->optim_step, "negative");
        if (m->optim_step > m->step)
            return bad_attr(h, "optim.step", (long long)m->optim_step, "more optimizer updates than training steps");
    }
    const struct {
        const char *attr;
        int v;
    } axes[] = {{"layout.world", m->world_size}, {"layout.pp", m->layout.pp}, {"layout.dp", m->layout.dp},
                {"layout.sp", m->layout.sp},     {"layout.tp", m->layout.tp}, {"layout.ep", m->layout.ep}};
    for (size_t i = 0; i < sizeof axes / sizeof axes[0]; i++)
        if (axes[i].v <= 0) return bad_attr(h, axes[i].attr, axes[i].v, "a world or axis size must be at least 1");
    const long long prod = (long long)m->layout.pp * m->layout.dp * m->layout.sp * m->layout.tp;
    if (prod != m->world_size)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "checkpoint '%s': layout.pp*dp*sp*tp = %d*%d*%d*%d = %lld but layout.world is "
                         "%d (the axes disagree; the file is damaged or was edited)",
                         h->path, m->layout.pp, m->layout.dp, m->layout.sp, m->layout.tp, prod, m->world_size);
    if (m->layout.dp % m->layout.ep != 0)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "checkpoint '%s': layout.ep = %d does not divide layout.dp = %d (the axes "
                         "disagree; the file is damaged or was edited)",
                         h->path, m->layout.ep, m->layout.dp);
    if (!(m->loss_scale > 0 && m->loss_scale <= 1e300))
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "checkpoint '%s': attribute 'loss_scaler.scale' is %g, not a positive finite "
                         "number",
                         h->path, m->loss_scale);
    return CAI_OK;
}

typedef struct {
    hid_t storage;
    char names[CAI_CKPT_NAME_MAX * 8];
    size_t used;
    int overflow;
} group_list;

/* The datasets under storage/ (each one tensor group's storage). */
static herr_t storage_cb(hid_t g, const char *name, const H5L_info_t *info, void *data) {
    (void)g;
    group_list *l = data;
    if (info->type != H5L_TYPE_HARD) return 0;
    hid_t o = H5Oopen(l->storage, name, H5P_DEFAULT);
    if (o < 0) return -1;
    const int is_ds = H5Iget_type(o) == H5I_DATASET;
    H5Oclose(o);
    if (!is_ds) return 0;
    size_t len = strlen(name) + 1;
    if (l->used + len > sizeof l->names) {
        l->overflow = 1;
        return 0;
    }
    memcpy(l->names + l->used, name, len);
    l->used += len;
    return 0;
}

/* tensor_groups (written by every save) must list exactly the groups whose
 * storage the file holds; a group the attribute does not list, or one it
 * lists that is not there, is a file no writer produced. */
static cai_status check_groups(ck_h5 *h) {
    char listed[1024];
    int found = 0;
    CAI_CALL(ck_h5_get_str(h, h->file, "tensor_groups", listed, sizeof listed, &found));
    if (!found) return CAI_OK; /* older files: nothing to compare with */
    group_list l;
    memset(&l, 0, sizeof l);
    htri_t has_storage = H5Lexists(h->file, "storage", H5P_DEFAULT);
    if (has_storage > 0) {
        l.storage = H5Gopen2(h->file, "storage", H5P_DEFAULT);
        if (l.storage < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot open the group storage", h->path);
        herr_t rc = H5Lvisit(l.storage, H5_INDEX_NAME, H5_ITER_INC, storage_cb, &l);
        H5Gclose(l.storage);
        if (rc < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot list the group storage", h->path);
    }
    /* every listed group: a name, once, with its storage */
    char seen[1024] = ",";
    for (const char *p = listed; *listed;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        char g[CAI_CKPT_NAME_MAX], key[CAI_CKPT_NAME_MAX + 2];
        if (len == 0 || len >= sizeof g)
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "checkpoint '%s': attribute 'tensor_groups' (\"%s\") holds an empty or "
                             "over-long group name",
                             h->path, listed);
        memcpy(g, p, len);
        g[len] = '\0';
        snprintf(key, sizeof key, ",%s,", g);
        if (strstr(seen, key))
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "checkpoint '%s': attribute 'tensor_groups' (\"%s\") lists group '%s' "
                             "twice",
                             h->path, listed, g);
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s,", g);
        int stored = 0;
        for (size_t k = 0; k < l.used; k += strlen(l.names + k) + 1) stored |= strcmp(l.names + k, g) == 0;
        if (!stored && !l.overflow)
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "checkpoint '%s': attribute 'tensor_groups' lists group '%s', but the "
                             "file has no storage/%s (unknown tensor group; damaged or edited)",
                             h->path, g, g);
        if (!q) break;
        p = q + 1;
    }
    for (size_t k = 0; k < l.used; k += strlen(l.names + k) + 1) {
        char key[CAI_CKPT_NAME_MAX + 2];
        snprintf(key, sizeof key, ",%s,", l.names + k);
        if (!strstr(seen, key))
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "checkpoint '%s' holds storage/%s, a tensor group its attribute "
                             "'tensor_groups' (\"%s\") does not list (unknown tensor group; damaged or edited)",
                             h->path, l.names + k, listed);
    }
    return CAI_OK;
}

/* Reads and checks the root attributes. */
cai_status ck_read_meta(ck_h5 *h, cai_ckpt_meta *m) {
    *m = cai_ckpt_meta_init();
    char buf[256];
    int found = 0;
    CAI_CALL(ck_h5_get_str(h, h->file, "format", buf, sizeof buf, &found));
    if (!found || strcmp(buf, CAI_CKPT_FORMAT) != 0)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "'%s' is an HDF5 file but not a colossal checkpoint (its root attribute "
                         "'format' is %s%s%s, expected \"%s\")",
                         h->path, found ? "\"" : "missing", found ? buf : "", found ? "\"" : "", CAI_CKPT_FORMAT);
    int64_t v = 0;
    CAI_CALL(ck_h5_get_i64(h, h->file, "format_version", &v, NULL));
    if (v < 1 || v > CAI_CKPT_VERSION)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "checkpoint '%s' has format version %lld; this build reads version 1 to %d "
                         "(written by a newer colossal?)",
                         h->path, (long long)v, CAI_CKPT_VERSION);
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
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "checkpoint '%s': model.family \"%s\" is not a model family this build "
                             "knows",
                             h->path, buf);
        }
        CAI_CALL(read_fields(h, k_model_fields, NF(k_model_fields), &m->model));
        int64_t experts = 0;
        int has_moe = 0;
        CAI_CALL(ck_h5_get_i64(h, h->file, "model.moe.n_experts", &experts, &has_moe));
        if (has_moe && experts > 0) {
            CAI_CALL(read_fields(h, k_moe_fields, NF(k_moe_fields), &m->model));
            const char *mk[2] = {"model.moe.router", "model.moe.routing"};
            for (int i = 0; i < 2; i++) {
                CAI_CALL(ck_h5_get_str(h, h->file, mk[i], buf, sizeof buf, NULL));
                cai_status ps = i == 0 ? cai_moe_router_parse(buf, &m->model.moe.router)
                                       : cai_moe_routing_parse(buf, &m->model.moe.routing);
                if (ps != CAI_OK) {
                    cai_error_clear();
                    return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': %s \"%s\" is unknown", h->path, mk[i], buf);
                }
            }
        }
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
        /* Optional (files written before it existed): then every step was an update. */
        int found = 0;
        CAI_CALL(ck_h5_get_i64(h, h->file, "optim.step", &m->optim_step, &found));
        if (!found) m->optim_step = m->step;
    }
    CAI_CALL(check_meta_values(h, m));
    CAI_CALL(check_groups(h));
    int found_text = 0;
    CAI_CALL(ck_h5_text_read(h, CK_CONFIG_DATASET, &m->config_text, &found_text));
    CAI_CALL(ck_h5_f32_read(h, CK_FP8_DATASET, &m->fp8_state, &m->fp8_state_len));
    CAI_CALL(ck_h5_f32_read(h, CK_APP_DATASET, &m->app_state, &m->app_state_len));
    return CAI_OK;
}

/* The architecture must match for the tensors to mean anything; the error
 * names the first field that differs. Numerics that do not change shapes
 * (epsilon, RoPE base) only warn: continuing with a changed one is a
 * choice, not a corruption. */
cai_status ck_check_model(const char *path, const cai_ckpt_meta *m, const cai_model_config *want) {
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
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "checkpoint '%s' holds a different model: %s is %lld in the file, %lld "
                             "in this run",
                             path, f[i].key, f[i].file, f[i].here);
    if (got->norm_eps != want->norm_eps)
        CAI_WARN("checkpoint '%s': model.norm_eps was %g, now %g", path, (double)got->norm_eps, (double)want->norm_eps);
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
    const cai_ckpt_piece *const *pieces; /* [nb] or NULL: ZeRO shards (cai_ckpt_save_pieces) */
    const int *n_pieces;
    int nb, np;
    size_t total;        /* elements of the flat layout */
    size_t *off;         /* [np] flat offsets, SIZE_MAX when not held */
    cai_param_shard *sh; /* [np] */
    int *rep_q, *rep_r;  /* [np] this rank's slot among the replicas of each parameter */
    int flat_split;      /* every parameter is whole here: replicas split each storage into contiguous ranges */
    uint64_t *soff;      /* [nb * np] storage offset of each tensor (tie primaries) */
    uint64_t *slen;      /* [nb] elements of each group's storage */
    hid_t *storage;      /* [nb] */
    hid_t *ds;           /* [nb * np] tensor datasets (tie primaries), -1 otherwise */
    cai_dtype *fdt;      /* [nb] element type of each group in the file */
    uint64_t *xs;        /* [nb * np] checksum partial sums */
    const char **group;  /* [nb] the group each buffer uses in this file */
    ck_h5 h;
    ck_xfer x;
    char name[CAI_CKPT_NAME_MAX];
} engine;

static void engine_free(engine *e) {
    if (e->ds)
        for (int i = 0; i < e->nb * e->np; i++)
            if (e->ds[i] >= 0) H5Dclose(e->ds[i]);
    if (e->storage)
        for (int b = 0; b < e->nb; b++)
            if (e->storage[b] >= 0) H5Dclose(e->storage[b]);
    ck_xfer_free(&e->x);
    cai_free(e->off);
    cai_free(e->sh);
    cai_free(e->rep_q);
    cai_free(e->rep_r);
    cai_free(e->soff);
    cai_free(e->slen);
    cai_free(e->storage);
    cai_free(e->ds);
    cai_free(e->fdt);
    cai_free(e->xs);
    free((void *)e->group);
    /* Idempotent: the file handle and the communicator stay, the rest goes. */
    ck_h5 h = e->h;
    MPI_Comm comm = e->comm;
    int rank = e->rank, size = e->size;
    memset(e, 0, sizeof *e);
    e->h = h;
    e->comm = comm;
    e->rank = rank;
    e->size = size;
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

static int is_primary(const engine *e, int i) { return cai_registry_param(e->L->reg, i)->tie_primary == i; }

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
        CAI_CHECK_ARG(B->group && *B->group && strncmp(B->group, "storage", 7) != 0,
                      "checkpoint buffer %d: group name \"%s\" is empty or reserved", b, B->group ? B->group : "");
        CAI_CHECK_ARG(ck_file_dtype_ok(B->dtype) && ck_file_dtype_ok(B->file_dtype),
                      "checkpoint buffer %s: dtypes %s (memory) and %s (file) must be f32, bf16 or f16", B->group,
                      cai_dtype_name(B->dtype), cai_dtype_name(B->file_dtype));
        CAI_CHECK_ARG(B->flat_begin <= B->flat_end, "checkpoint buffer %s: flat range [%zu, %zu) is reversed", B->group,
                      B->flat_begin, B->flat_end);
    }
    CAI_CALL(cai_calloc((void **)&e->off, (size_t)np + 1, sizeof *e->off, "checkpoint offsets"));
    CAI_CALL(cai_calloc((void **)&e->sh, (size_t)np + 1, sizeof *e->sh, "checkpoint shards"));
    CAI_CALL(cai_calloc((void **)&e->rep_q, (size_t)np + 1, sizeof *e->rep_q, "checkpoint replicas"));
    CAI_CALL(cai_calloc((void **)&e->rep_r, (size_t)np + 1, sizeof *e->rep_r, "checkpoint replicas"));
    CAI_CALL(cai_calloc((void **)&e->soff, (size_t)n + 1, sizeof *e->soff, "checkpoint storage offsets"));
    CAI_CALL(cai_calloc((void **)&e->slen, (size_t)nb + 1, sizeof *e->slen, "checkpoint storage sizes"));
    CAI_CALL(cai_calloc((void **)&e->storage, (size_t)nb + 1, sizeof *e->storage, "checkpoint storages"));
    CAI_CALL(cai_calloc((void **)&e->ds, (size_t)n + 1, sizeof *e->ds, "checkpoint datasets"));
    CAI_CALL(cai_calloc((void **)&e->fdt, (size_t)nb + 1, sizeof *e->fdt, "checkpoint dataset types"));
    CAI_CALL(cai_calloc((void **)&e->xs, (size_t)n + 1, sizeof *e->xs, "checkpoint checksums"));
    e->group = calloc((size_t)nb + 1, sizeof *e->group);
    if (!e->group) return CAI_ERROR(CAI_ERR_NOMEM, "checkpoint group table");
    for (int i = 0; i < n; i++) e->ds[i] = -1;
    for (int b = 0; b < nb; b++) e->storage[b] = -1;
    CAI_CALL(cai_registry_local_layout(L->reg, &L->view, L->align_elems, e->off, &e->total));
    e->flat_split = L->replica_axis != CAI_AXIS_COUNT;
    for (int i = 0; i < np; i++) {
        const cai_param_info *info = cai_registry_param(L->reg, i);
        CAI_CALL(cai_registry_shard(L->reg, i, &L->view, &e->sh[i]));
        replica_slot(e, info, &e->rep_q[i], &e->rep_r[i]);
        if (e->off[i] == SIZE_MAX || e->sh[i].local_numel != info->numel || info->spec.expert >= 0) e->flat_split = 0;
    }
    /* The storage a save writes: tensors in registration order, each
     * starting at a multiple of align_elems like the flat buffers, so a
     * whole-model replica's slice of the storage is one contiguous block in
     * memory as well as in the file (the few padding elements between
     * tensors are never written nor read). */
    uint64_t align = L->align_elems ? L->align_elems : 1;
    for (int b = 0; b < nb; b++) {
        const cai_ckpt_buffer *B = &bufs[b];
        if (B->flat_end > e->total)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "checkpoint buffer %s: flat range ends at %zu beyond the layout's "
                             "%zu elements",
                             B->group, B->flat_end, e->total);
        e->group[b] = B->group;
        e->fdt[b] = B->file_dtype;
        for (int p = 0; p < np; p++)
            if (is_primary(e, p)) {
                e->soff[b * np + p] = (e->slen[b] + align - 1) / align * align;
                e->slen[b] = e->soff[b * np + p] + cai_registry_param(L->reg, p)->numel;
            }
    }
    return CAI_OK;
}

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

/* The slice of parameter i this rank writes from buffer b (and whose
 * checksum it computes on load). Replicas of whole parameters split the
 * group's storage into contiguous ranges, so each writes one range of the
 * file; replicas of shards split each shard. */
static void write_range(const engine *e, int b, int i, uint64_t *a, uint64_t *z) {
    uint64_t lo, hi;
    held_range(e, b, i, &lo, &hi);
    *a = lo, *z = hi;
    if (!e->bufs[b].replicated || lo >= hi) return;
    if (!e->flat_split) {
        ck_replica_chunk(lo, hi, e->rep_q[i], e->rep_r[i], a, z);
        return;
    }
    uint64_t c0, c1, s0 = e->soff[b * e->np + i];
    ck_replica_chunk(0, e->slen[b], e->rep_q[i], e->rep_r[i], &c0, &c1);
    uint64_t x0 = c0 > s0 ? c0 - s0 : 0, x1 = c1 > s0 ? c1 - s0 : 0;
    *a = x0 > lo ? x0 : lo;
    *z = x1 < hi ? x1 : hi;
    if (*a > *z) *a = *z;
}

/* Local range this rank reads into buffer b for parameter i (tie copies
 * read their primary's tensor). */
static void read_range(const engine *e, int b, int i, uint64_t *lo, uint64_t *hi) {
    const cai_param_info *info = cai_registry_param(e->L->reg, i);
    if (e->bufs[b].skip_tie_copies && info->tie_primary != i && e->off[info->tie_primary] != SIZE_MAX) {
        *lo = *hi = 0;
        return;
    }
    held_range(e, b, i, lo, hi);
}

static const cai_ckpt_piece *pieces_of(const engine *e, int b, int *n) {
    *n = e->pieces && e->pieces[b] ? e->n_pieces[b] : 0;
    return e->pieces ? e->pieces[b] : NULL;
}

static ck_mem mem_of(const engine *e, int b) {
    const cai_ckpt_buffer *B = &e->bufs[b];
    uint64_t len = B->flat_end == 0 && B->flat_begin == 0 ? e->total : B->flat_end - B->flat_begin;
    int np = 0;
    const cai_ckpt_piece *pc = pieces_of(e, b, &np);
    if (pc) {
        len = 0;
        for (int k = 0; k < np; k++)
            if (pc[k].buffer_offset + pc[k].count > len) len = pc[k].buffer_offset + pc[k].count;
    }
    ck_mem m = {B->data, len, B->dtype, B->dev};
    return m;
}

static const char *tensor_name(engine *e, int b, int i) {
    snprintf(e->name, sizeof e->name, "%s/%s", e->group[b], cai_registry_param(e->L->reg, i)->name);
    return e->name;
}

static void storage_name(const char *group, char *out, size_t cap) { snprintf(out, cap, "storage/%s", group); }

/* Segments of parameter i's local elements [a, z): storage index of its
 * tensor (that of its tie primary p), memory index in buffer b. On a read
 * the part inside the write window [wa, wz) of replica-0 slabs is hashed;
 * on a write (writers_only) all of it. */
static cai_status add_segments(engine *e, int b, int i, uint64_t a, uint64_t z, uint64_t m_at_a, int write, uint64_t wa,
                               uint64_t wz, ck_run **runs, size_t *cap, ck_segs *out) {
    if (a >= z) return CAI_OK;
    int p = cai_registry_param(e->L->reg, i)->tie_primary;
    ck_box boxes[CK_MAX_BOXES];
    size_t nr = 0;
    int nbox = ck_range_boxes(&e->sh[i], a, z, write, boxes);
    CAI_CALL(ck_box_runs(&e->sh[i], boxes, nbox, runs, cap, &nr));
    /* m of local element l is m_at_a + (l - a), kept in unsigned arithmetic (l >= a). */
    uint64_t s0 = e->soff[b * e->np + p], m0 = m_at_a - a;
    for (size_t k = 0; k < nr; k++) {
        const ck_run *r = &(*runs)[k];
        /* cut at the window so each segment is hashed entirely or not at all */
        uint64_t cuts[4] = {r->l, r->l + r->n, wa, wz}, lo = r->l;
        while (lo < r->l + r->n) {
            uint64_t hi = r->l + r->n;
            for (int c = 2; c < 4; c++)
                if (cuts[c] > lo && cuts[c] < hi) hi = cuts[c];
            int hash = write || (r->writer && lo >= wa && hi <= wz && i == p);
            ck_seg g = {s0 + r->g + (lo - r->l), m0 + lo, hi - lo, p, hash};
            CAI_CALL(ck_segs_push(out, g));
            lo = hi;
        }
    }
    return CAI_OK;
}

/* The segments of group b for a write (pass -1) or a read pass (0: tie
 * primaries and untied parameters, 1: tie copies, which read a tensor a
 * primary may read too and so need their own transfers). */
static cai_status group_segments(engine *e, int b, int pass, ck_segs *out, int *m_in_order) {
    ck_run *runs = NULL;
    size_t cap = 0;
    cai_status st = CAI_OK;
    const cai_ckpt_buffer *B = &e->bufs[b];
    int n_pc = 0;
    const cai_ckpt_piece *pcs = pieces_of(e, b, &n_pc);
    if (pcs) {
        /* A ZeRO shard: each piece is written by its only holder and read
         * back to it; its elements are all this rank's to checksum. */
        for (int k = 0; k < n_pc && st == CAI_OK; k++) {
            const cai_ckpt_piece *pc = &pcs[k];
            int i = pc->index;
            if (i < 0 || i >= e->np || e->off[i] == SIZE_MAX || pc->param_offset + pc->count > e->sh[i].local_numel) {
                st = CAI_ERROR(CAI_ERR_INVALID_ARG,
                               "checkpoint buffer %s: piece %d (parameter %d, elements [%zu, "
                               "%zu)) is not a held parameter's range",
                               B->group, k, i, pc->param_offset, pc->param_offset + pc->count);
                break;
            }
            if ((pass < 0 || pass == 0) != is_primary(e, i)) continue;
            const cai_param_info *info = cai_registry_param(e->L->reg, i);
            if (pass == 1 && B->skip_tie_copies && e->off[info->tie_primary] != SIZE_MAX) continue;
            uint64_t a = pc->param_offset, z = a + pc->count;
            st = add_segments(e, b, i, a, z, pc->buffer_offset, pass < 0, a, z, &runs, &cap, out);
        }
    }
    for (int i = 0; i < e->np && st == CAI_OK && !pcs; i++) {
        uint64_t a = 0, z = 0, wa = 0, wz = 0;
        if (pass < 0) {
            if (!is_primary(e, i)) continue;
            write_range(e, b, i, &a, &z);
        } else {
            if (is_primary(e, i) != (pass == 0)) continue;
            read_range(e, b, i, &a, &z);
            if (pass == 0) write_range(e, b, i, &wa, &wz);
        }
        st = add_segments(e, b, i, a, z, e->off[i] - B->flat_begin + a, pass < 0, wa, wz, &runs, &cap, out);
    }
    free(runs);
    if (st == CAI_OK) ck_segs_sort(out, m_in_order);
    return st;
}

#if CAI_TEST_HOOKS
/* Test hook, only in builds configured --enable-test-hooks (docs/checkpoint.md):
 * the knob CAI_CKPT_TEST_STALL=N[:R] makes rank R (default: the last) stop
 * for 10 minutes after its N-th write transfer, so a test can kill it in
 * the middle of a save. */
static cai_status test_stall(const engine *e, const char *tmp) {
    const char *v = NULL;
    CAI_CALL(cai_knob_str("CAI_CKPT_TEST_STALL", &v));
    int want = -1, who = e->size - 1;
    if (!*v) return CAI_OK;
    if (sscanf(v, "%d:%d", &want, &who) < 1 || want < 1)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "CAI_CKPT_TEST_STALL='%s': expected N[:R], a transfer count N >= 1 and "
                         "optionally the rank R that stalls",
                         v);
    if (e->x.io.n_transfers == want && e->rank == who) {
        fprintf(stderr, "checkpoint test hook: rank %d (pid %ld) stalls after %d transfer%s of %s\n", e->rank,
                (long)getpid(), want, want == 1 ? "" : "s", tmp);
        fflush(stderr);
        for (int k = 0; k < 600; k++) sleep(1);
    }
    return CAI_OK;
}
#endif

/* All transfers of group b (pass as in group_segments). Every rank makes
 * the same number of calls: the maximum over ranks of its pieces (agreed
 * here). A rank that has failed keeps taking part with empty selections so
 * the others do not hang; the failure is agreed on afterwards. */
static cai_status move_group(engine *e, int b, int pass, cai_status st, const char *tmp_for_hook) {
    ck_segs segs = {0};
    int in_order = 1;
    size_t *starts = NULL, np = 0;
    if (st == CAI_OK) st = group_segments(e, b, pass, &segs, &in_order);
    if (st == CAI_OK) st = ck_segs_pieces(&segs, e->x.piece, &starts, &np);
    int rounds = st == CAI_OK ? (int)np : 0;
    if (MPI_Allreduce(MPI_IN_PLACE, &rounds, 1, MPI_INT, MPI_MAX, e->comm) != MPI_SUCCESS && st == CAI_OK)
        st = CAI_ERROR(CAI_ERR_MPI, "checkpoint: agreeing on the transfers of group %s failed", e->group[b]);
    char what[CAI_CKPT_NAME_MAX + 32];
    snprintf(what, sizeof what, "tensors of %s", e->group[b]);
    ck_mem mem = mem_of(e, b);
    for (int r = 0; r < rounds; r++) {
        int mine = st == CAI_OK && (size_t)r < np;
        const ck_seg *g = mine ? segs.v + starts[r] : NULL;
        size_t n = mine ? starts[r + 1] - starts[r] : 0;
        cai_status s = ck_xfer_segs(&e->x, e->storage[b], e->fdt[b], g, n, pass < 0, st == CAI_OK ? &mem : NULL,
                                    in_order, e->soff + b * e->np, e->xs + b * e->np, what);
        if (s != CAI_OK && st == CAI_OK) st = s;
#if CAI_TEST_HOOKS
        if (pass < 0 && tmp_for_hook && st == CAI_OK) st = test_stall(e, tmp_for_hook);
#endif
    }
    free(starts);
    ck_segs_free(&segs);
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
                s->bytes += cai_registry_param(e->L->reg, p)->numel * cai_dtype_size(e->fdt[b]);
            }
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

/* Storage and tensor datasets of every buffer: storage/<group> holds the
 * group's tensors back to back; <group>/<name> is a view of global shape. */
static cai_status create_datasets(engine *e) {
    char sname[CAI_CKPT_NAME_MAX], parent[CAI_CKPT_NAME_MAX];
    for (int b = 0; b < e->nb; b++) {
        storage_name(e->group[b], sname, sizeof sname);
        snprintf(parent, sizeof parent, "%s", sname);
        *strrchr(parent, '/') = '\0';
        CAI_CALL(ck_h5_group(&e->h, parent));
        CAI_CALL(ck_h5_group(&e->h, e->group[b]));
        CAI_CALL(ck_h5_storage_create(&e->h, sname, e->fdt[b], e->slen[b], &e->storage[b]));
        char src[CAI_CKPT_NAME_MAX + 1];
        snprintf(src, sizeof src, "/%s", sname);
        for (int p = 0; p < e->np; p++) {
            if (!is_primary(e, p)) continue;
            const cai_param_info *info = cai_registry_param(e->L->reg, p);
            hid_t *ds = &e->ds[b * e->np + p];
            CAI_CALL(ck_h5_virtual_create(&e->h, tensor_name(e, b, p), e->fdt[b], info->ndim, info->shape, src,
                                          e->soff[b * e->np + p], e->slen[b], ds));
            CAI_CALL(ck_h5_attr_str(&e->h, *ds, "storage", src));
            CAI_CALL(ck_h5_attr_u64(&e->h, *ds, "storage_offset", e->soff[b * e->np + p]));
        }
    }
    return CAI_OK;
}

cai_status cai_ckpt_save_buffers(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                 const cai_ckpt_buffer *bufs, int n_bufs, const cai_ckpt_meta *meta,
                                 cai_ckpt_stats *stats) {
    return cai_ckpt_save_pieces(mesh, path, layout, bufs, NULL, NULL, n_bufs, meta, stats);
}

cai_status cai_ckpt_save_pieces(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                                int n_bufs, const cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && *path && layout && layout->reg && (bufs || n_bufs == 0) && n_bufs >= 0 && meta &&
                      (!pieces || n_pieces),
                  "cai_ckpt_save_buffers: NULL argument");
    CAI_CHECK_ARG(meta->has_model,
                  "cai_ckpt_save_buffers: meta->has_model must be set (the model config is part of "
                  "every checkpoint)");
    double t0 = cai_time_now();
    int agreed = 0;
    engine e;
    cai_status st = engine_init(&e, mesh, layout, bufs, n_bufs);
    e.pieces = pieces;
    e.n_pieces = n_pieces;
    char tmp[4096] = "";
    if (st == CAI_OK) st = tmp_path(path, tmp, sizeof tmp);
    ck_xfer_init(&e.x, &e.h, CK_PIECE_BYTES / 4);
    /* Room for the whole file, and a reserved metadata region: see
     * ck_h5_reserve_meta (a full disk fails agreed, never inside HDF5). */
    uint64_t meta_bytes = ck_h5_meta_estimate(st == CAI_OK ? (size_t)(e.nb * (e.np + 1)) : 0), bytes = meta_bytes;
    for (int b = 0; st == CAI_OK && b < e.nb; b++) bytes += e.slen[b] * cai_dtype_size(e.fdt[b]);
    if (st == CAI_OK && e.rank == 0) st = ck_space_check(tmp, bytes);
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail_agreed);

    int64_t created = (int64_t)time(NULL);
    int mrc = MPI_Bcast(&created, 1, MPI_INT64_T, 0, e.comm);
    CAI_CALL_GOTO(mrc == MPI_SUCCESS ? CAI_OK : cai_error_mpi(mrc, __FILE__, __LINE__, __func__, "MPI_Bcast"), st,
                  fail);
    char groups[1024] = "";
    for (int b = 0; b < n_bufs; b++)
        snprintf(groups + strlen(groups), sizeof groups - strlen(groups), "%s%s", b ? "," : "", bufs[b].group);

    st = ck_h5_create(&e.h, e.comm, tmp);
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail_agreed);
    st = e.rank == 0 ? ck_h5_reserve(&e.h, 0, meta_bytes, "its metadata") : CAI_OK;
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail_agreed);
    {
        cai_ckpt_meta m = *meta;
        if (m.world_size == 0) {
            m.layout = *cai_mesh_layout(mesh);
            m.world_size = e.size;
        }
        CAI_CALL_GOTO(write_meta(&e.h, &m, created, groups), st, fail);
    }
    CAI_CALL_GOTO(create_datasets(&e), st, fail);
    for (int b = 0; st == CAI_OK && e.rank == 0 && b < e.nb; b++)
        st = ck_h5_reserve_dataset(&e.h, e.storage[b], e.slen[b] * cai_dtype_size(e.fdt[b]), e.group[b]);
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail_agreed);
    cai_status local = CAI_OK;
    for (int b = 0; b < n_bufs; b++) local = move_group(&e, b, -1, local, tmp);
    CAI_CALL_GOTO(ck_agree(e.comm, local), st, fail_agreed);
    CAI_CALL_GOTO(sum_checksums(&e), st, fail);
    for (int k = 0; k < n_bufs * e.np; k++)
        if (e.ds[k] >= 0) CAI_CALL_GOTO(ck_h5_attr_u64(&e.h, e.ds[k], "xsum64", e.xs[k]), st, fail);
    stats_fill(&e, stats, t0);
    engine_free(&e); /* closes the datasets before the file */
    st = ck_h5_flush(&e.h);
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail_agreed);
    st = ck_h5_close(&e.h);
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail_agreed);
    /* Complete and closed on every rank: now it may take its name. */
    if (e.rank == 0) {
        if (rename(tmp, path) != 0)
            st = CAI_ERROR(CAI_ERR_IO, "cannot rename checkpoint '%s' to '%s': %s", tmp, path, strerror(errno));
        else st = sync_dir_of(path);
    }
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail_agreed);
    if (stats) stats->seconds = cai_time_now() - t0;
    return CAI_OK;
fail_agreed:
    agreed = 1;
fail:
    engine_free(&e);
    ck_h5_close(&e.h);
    if (e.rank == 0 && *tmp) unlink(tmp);
    /* A failure every rank saw: none returns (and perhaps ends the job)
     * before rank 0 has removed the temporary file. */
    if (agreed) MPI_Barrier(e.comm);
    return st;
}

/* ------------------------------------------------------------ load */

/* Open every buffer's storage and tensors and check them against the
 * registry: group present, shapes, element types, storage ranges. The
 * tensors' places come from the file (storage_offset). */
static cai_status open_datasets(engine *e) {
    char sname[CAI_CKPT_NAME_MAX];
    for (int b = 0; b < e->nb; b++) {
        const cai_ckpt_buffer *B = &e->bufs[b];
        int ex = 0;
        storage_name(B->group, sname, sizeof sname);
        CAI_CALL(path_exists(&e->h, sname, &ex));
        if (!ex && B->alt_group) {
            storage_name(B->alt_group, sname, sizeof sname);
            CAI_CALL(path_exists(&e->h, sname, &ex));
            if (ex) e->group[b] = B->alt_group;
        }
        if (!ex)
            return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' has no tensor group '%s'%s%s%s", e->h.path, B->group,
                             B->alt_group ? " (nor '" : "", B->alt_group ? B->alt_group : "", B->alt_group ? "')" : "");
        e->storage[b] = H5Dopen2(e->h.file, sname, H5P_DEFAULT);
        if (e->storage[b] < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot open %s", e->h.path, sname);
        int nd = 0;
        uint64_t shape[CAI_CKPT_MAX_DIMS];
        char desc[96];
        CAI_CALL(ck_h5_dataset_info(&e->h, e->storage[b], sname, &nd, shape, &e->fdt[b], desc, sizeof desc));
        if (nd != 1 || !ck_file_dtype_ok(e->fdt[b]))
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "checkpoint '%s': %s should be one-dimensional f32, bf16 or f16, not "
                             "%d-dimensional %s",
                             e->h.path, sname, nd, desc);
        e->slen[b] = shape[0];
        for (int p = 0; p < e->np; p++) {
            if (!is_primary(e, p)) continue;
            const cai_param_info *info = cai_registry_param(e->L->reg, p);
            const char *name = tensor_name(e, b, p);
            int has = 0;
            CAI_CALL(path_exists(&e->h, name, &has));
            if (!has)
                return CAI_ERROR(CAI_ERR_FORMAT,
                                 "checkpoint '%s' has no tensor %s (a checkpoint of another model, or "
                                 "damaged)",
                                 e->h.path, name);
            hid_t ds = H5Dopen2(e->h.file, name, H5P_DEFAULT);
            if (ds < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot open tensor %s", e->h.path, name);
            e->ds[b * e->np + p] = ds;
            cai_dtype dt;
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
                return CAI_ERROR(CAI_ERR_FORMAT,
                                 "checkpoint '%s': tensor %s has shape [%s] but the model expects "
                                 "[%s]",
                                 e->h.path, name, fs, ms);
            }
            if (dt != e->fdt[b])
                return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': tensor %s has element type %s, its storage %s",
                                 e->h.path, name, desc, cai_dtype_name(e->fdt[b]));
            uint64_t so = 0;
            CAI_CALL(ck_h5_get_u64(&e->h, ds, "storage_offset", &so, NULL));
            if (so > e->slen[b] || info->numel > e->slen[b] - so)
                return CAI_ERROR(CAI_ERR_FORMAT,
                                 "checkpoint '%s': tensor %s claims elements [%llu, %llu) of %s, which "
                                 "holds %llu",
                                 e->h.path, name, (unsigned long long)so, (unsigned long long)(so + info->numel), sname,
                                 (unsigned long long)e->slen[b]);
            e->soff[b * e->np + p] = so;
        }
    }
    return CAI_OK;
}

static cai_status load_impl(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                            const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                            int n_bufs, cai_ckpt_meta *meta_out, const cai_model_config *expect,
                            cai_ckpt_stats *stats) {
    double t0 = cai_time_now();
    engine e;
    cai_ckpt_meta meta = cai_ckpt_meta_init();
    cai_status st = engine_init(&e, mesh, layout, bufs, n_bufs);
    e.pieces = pieces;
    e.n_pieces = n_pieces;
    ck_xfer_init(&e.x, &e.h, CK_PIECE_BYTES / 4);
    CAI_CALL_GOTO(ck_agree(e.comm, st), st, fail);
    CAI_CALL_GOTO(ck_h5_open(&e.h, e.comm, path, 0), st, fail);
    CAI_CALL_GOTO(ck_read_meta(&e.h, &meta), st, fail);
    if (expect) CAI_CALL_GOTO(ck_check_model(path, &meta, expect), st, fail);
    CAI_CALL_GOTO(open_datasets(&e), st, fail);
    cai_status local = CAI_OK;
    for (int b = 0; b < n_bufs; b++)
        for (int pass = 0; pass < 2; pass++) local = move_group(&e, b, pass, local, NULL);
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
                snprintf(first, sizeof first, "%s", tensor_name(&e, b, p));
                want = stored;
                got = e.xs[b * e.np + p];
            }
        }
    if (n_bad) {
        st = CAI_ERROR(CAI_ERR_FORMAT,
                       "checkpoint '%s': tensor %s is corrupt: its data hashes to %016llx but "
                       "%016llx was stored when it was written (%d tensor%s bad)",
                       path, first, (unsigned long long)got, (unsigned long long)want, n_bad, n_bad == 1 ? "" : "s");
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
                                 const cai_ckpt_buffer *bufs, int n_bufs, cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    return cai_ckpt_load_pieces(mesh, path, layout, bufs, NULL, NULL, n_bufs, meta, stats);
}

cai_status cai_ckpt_load_pieces(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                                int n_bufs, cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && *path && layout && layout->reg && (bufs || n_bufs == 0) && n_bufs >= 0 &&
                      (!pieces || n_pieces),
                  "cai_ckpt_load_buffers: NULL argument");
    return load_impl(mesh, path, layout, bufs, pieces, n_pieces, n_bufs, meta, NULL, stats);
}

cai_status ck_load_checked(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                           const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                           int n_bufs, const cai_model_config *expect, cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    cai_status st = load_impl(mesh, path, layout, bufs, pieces, n_pieces, n_bufs, meta, expect, stats);
    if (st != CAI_OK && strstr(cai_error_message(), "has no tensor group 'optim/")) {
        /* Say what to do rather than which group is missing. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cai_error_message());
        cai_error_clear();
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: it holds weights only, no optimizer state to resume from", msg);
    }
    return st;
}

/* ------------------------------------------------------------ model + optimizer */

static cai_device_t *buffer_device(cai_model_t *model) {
    cai_device_t *dev = cai_model_device(model);
    return dev->kind == CAI_DEVICE_HOST ? NULL : dev;
}

/* The AdamW moments as two buffers at out[0..1]; returns 2. A tie copy the
 * optimizer does not update keeps its (unused, zero) moments on load. */
static int optim_buffers(cai_optim_t *optim, cai_device_t *dev, cai_ckpt_buffer *out) {
    cai_tensor mt, vt;
    cai_optim_state(optim, &mt, &vt);
    out[0] = (cai_ckpt_buffer){.group = "optim/exp_avg",
                               .data = mt.data,
                               .dev = dev,
                               .dtype = CAI_DTYPE_F32,
                               .file_dtype = CAI_DTYPE_F32,
                               .replicated = 1,
                               .skip_tie_copies = 1};
    out[1] = out[0];
    out[1].group = "optim/exp_avg_sq";
    out[1].data = vt.data;
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
        bufs[n++] = (cai_ckpt_buffer){.group = "model",
                                      .data = lowp.data,
                                      .dev = dev,
                                      .dtype = lowp.dtype,
                                      .file_dtype = lowp.dtype,
                                      .replicated = 1};
    bufs[n++] = (cai_ckpt_buffer){.group = lowp.data ? "master" : "model",
                                  .data = params.data,
                                  .dev = dev,
                                  .dtype = CAI_DTYPE_F32,
                                  .file_dtype = CAI_DTYPE_F32,
                                  .replicated = 1};
    if (optim) n += optim_buffers(optim, dev, bufs + n);
    cai_ckpt_layout L = ck_model_layout(model);
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
    bufs[n++] = (cai_ckpt_buffer){.group = "master",
                                  .alt_group = "model",
                                  .data = params.data,
                                  .dev = dev,
                                  .dtype = CAI_DTYPE_F32,
                                  .file_dtype = CAI_DTYPE_F32,
                                  .replicated = 1};
    if (optim) n += optim_buffers(optim, dev, bufs + n);
    cai_ckpt_layout L = ck_model_layout(model);
    cai_ckpt_meta m;
    CAI_CALL(cai_device_sync(cai_model_device(model)));
    CAI_CALL(ck_load_checked(mesh, path, &L, bufs, NULL, NULL, n, cai_model_config_of(model), &m, stats));
    cai_status st = cai_model_params_updated(model);
    if (st == CAI_OK && optim) cai_optim_set_step_count(optim, m.has_optim ? m.optim_step : m.step);
    if (st == CAI_OK && meta) *meta = m;
    else cai_ckpt_meta_free(&m);
    CAI_CALL(st);
    return CAI_OK;
}

#else /* !CAI_HAVE_HDF5 */

#define NO_HDF5(fn)                                                              \
    CAI_ERROR(CAI_ERR_UNSUPPORTED,                                               \
              "%s: this build has no parallel HDF5, so no checkpoints (install " \
              "libhdf5-openmpi-dev and re-run configure)",                       \
              fn)

cai_status ck_check_model(const char *path, const cai_ckpt_meta *m, const cai_model_config *want) {
    (void)m;
    (void)want;
    return NO_HDF5(path);
}

cai_status cai_ckpt_save_buffers(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                 const cai_ckpt_buffer *bufs, int n_bufs, const cai_ckpt_meta *meta,
                                 cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_save_buffers");
}
cai_status cai_ckpt_load_buffers(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                 const cai_ckpt_buffer *bufs, int n_bufs, cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_load_buffers");
}
cai_status cai_ckpt_save_pieces(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                                int n_bufs, const cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_save_pieces");
}
cai_status cai_ckpt_load_pieces(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                                const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                                int n_bufs, cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_load_pieces");
}
cai_status cai_ckpt_save(cai_mesh_t *mesh, const char *path, cai_model_t *model, cai_optim_t *optim,
                         const cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_save");
}
cai_status ck_load_checked(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                           const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                           int n_bufs, const cai_model_config *expect, cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_load");
}
cai_status cai_ckpt_load(cai_mesh_t *mesh, const char *path, cai_model_t *model, cai_optim_t *optim,
                         cai_ckpt_meta *meta, cai_ckpt_stats *stats) {
    return NO_HDF5("cai_ckpt_load");
}

#endif

cai_status cai_ckpt_load_weights(cai_mesh_t *mesh, const char *path, cai_weights_t *w, cai_ckpt_meta *meta,
                                 cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && w, "cai_ckpt_load_weights: NULL argument");
    CAI_CALL(cai_weights_check_writable(w, "cai_ckpt_load_weights"));
    cai_tensor master;
    cai_weights_flat(w, &master, NULL);
    cai_device_t *dev = cai_weights_device(w);
    const cai_ckpt_buffer buf = {.group = "master",
                                 .alt_group = "model",
                                 .data = master.data,
                                 .dev = dev->kind == CAI_DEVICE_HOST ? NULL : dev,
                                 .dtype = CAI_DTYPE_F32,
                                 .file_dtype = CAI_DTYPE_F32,
                                 .replicated = 1};
    const cai_ckpt_layout L = {cai_weights_registry(w), *cai_weights_view(w), cai_weights_align_elems(w),
                               CAI_AXIS_DP_SP};
    cai_ckpt_meta m;
    CAI_CALL(cai_device_sync(dev));
    CAI_CALL(ck_load_checked(mesh, path, &L, &buf, NULL, NULL, 1, cai_weights_config(w), &m, stats));
    cai_status st = cai_weights_updated(w);
    if (st == CAI_OK && meta) *meta = m;
    else cai_ckpt_meta_free(&m);
    return st;
}
