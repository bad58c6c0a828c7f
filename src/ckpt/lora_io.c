/* LoRA adapters in files (colossal/lora.h): a run's checkpoints (the
 * adapters and their AdamW moments in the colossal HDF5 format), the PEFT
 * adapter directory (adapter_model.safetensors + adapter_config.json, what
 * peft's PeftModel.from_pretrained loads onto the base model) both ways,
 * and the merged model as a Hugging Face export. */
#include "cai_config.h"
#include "colossal/ckpt.h"
#include "colossal/lora.h"
#include "colossal/optim.h"
#include "hf_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ADAPTER_FILE "adapter_model.safetensors"
#define ADAPTER_CONFIG "adapter_config.json"
#define PEFT_PREFIX "base_model.model."

/* ------------------------------------------------------------ checkpoints */

typedef struct {
    cai_lora_t *l;
    cai_optim_t *o;
} lora_state;

/* Every rank holds the adapters and moments whole: the dp replicas split the writing. */
static cai_status io(cai_mesh_t *mesh, const char *path, cai_lora_t *l, cai_optim_t *o, const cai_ckpt_meta *save,
                     cai_ckpt_meta *load, cai_ckpt_stats *stats) {
    cai_device_t *dev = cai_lora_device(l);
    cai_tensor t[3];
    cai_lora_flat(l, &t[0], NULL);
    cai_optim_state(o, &t[1], &t[2]);
    static const char *const groups[3] = {"lora", "lora_optim/exp_avg", "lora_optim/exp_avg_sq"};
    cai_ckpt_buffer b[3];
    for (int i = 0; i < 3; i++) {
        memset(&b[i], 0, sizeof b[i]);
        b[i].group = groups[i];
        b[i].data = t[i].data;
        b[i].dev = dev->kind == CAI_DEVICE_HOST ? NULL : dev;
        b[i].dtype = b[i].file_dtype = CAI_DTYPE_F32;
        b[i].replicated = 1;
    }
    cai_ckpt_layout L = {cai_lora_registry(l), cai_rank_view_single(), cai_lora_align_elems(l), CAI_AXIS_DP};
    if (save) return cai_ckpt_save_buffers(mesh, path, &L, b, 3, save, stats);
    return cai_ckpt_load_buffers(mesh, path, &L, b, 3, load, stats);
}

static cai_status write_lora(void *ctx, cai_mesh_t *mesh, const char *path, const cai_ckpt_meta *meta,
                             cai_ckpt_stats *stats) {
    lora_state *s = ctx;
    return io(mesh, path, s->l, s->o, meta, NULL, stats);
}

cai_status cai_lora_ckpt_save_step(cai_mesh_t *mesh, const char *dir, int keep, cai_lora_t *l, cai_optim_t *o,
                                   const cai_ckpt_meta *meta_in, char *path_out, size_t cap, cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && dir && l && o && meta_in, "cai_lora_ckpt_save_step: NULL argument");
    cai_ckpt_meta meta = *meta_in;
    meta.model = *cai_lora_model_config(l);
    meta.has_model = 1;
    meta.optim = *cai_optim_config(o);
    meta.has_optim = 1;
    meta.optim_step = cai_optim_step_count(o);
    lora_state s = {l, o};
    return cai_ckpt_save_step_with(mesh, dir, keep, meta.step, write_lora, &s, &meta, path_out, cap, stats);
}

cai_status cai_lora_ckpt_load(cai_mesh_t *mesh, const char *path, cai_lora_t *l, cai_optim_t *o, cai_ckpt_meta *meta,
                              cai_ckpt_stats *stats) {
    CAI_CHECK_ARG(mesh && path && l && o && meta, "cai_lora_ckpt_load: NULL argument");
    CAI_CALL(io(mesh, path, l, o, NULL, meta, stats));
    cai_optim_set_step_count(o, meta->has_optim && meta->optim_step ? meta->optim_step : meta->step);
    return cai_lora_params_updated(l);
}

/* ------------------------------------------------------------ PEFT: export */

/* The target_modules a PEFT config names: the run's own, except that
 * "all-linear" (which older peft versions do not know) is spelled out as
 * the modules it matched. */
static json_t *target_list(const cai_lora_t *l) {
    json_t *arr = json_array();
    const char *const *names;
    const int n = cai_lora_targets(l, &names);
    int all = 0;
    for (int i = 0; i < n; i++) all |= strcmp(names[i], "all-linear") == 0;
    if (!all) {
        for (int i = 0; i < n; i++) json_array_append_new(arr, json_string(names[i]));
        return arr;
    }
    for (int i = 0; i < cai_lora_count(l); i++) {
        const char *m = cai_lora_get(l, i)->hf_module;
        /* "model.layers.3.self_attn.q_proj" -> "self_attn.q_proj": past the layer number */
        const char *p = m;
        for (int dots = 0; *p && dots < 3; p++)
            if (*p == '.') dots++;
        int seen = 0;
        for (size_t k = 0; k < json_array_size(arr); k++)
            seen |= strcmp(json_string_value(json_array_get(arr, k)), p) == 0;
        if (!seen) json_array_append_new(arr, json_string(p));
    }
    return arr;
}

cai_status cai_lora_export_peft(const char *dir, const cai_lora_t *l, const char *base_model) {
    CAI_CHECK_ARG(dir && *dir && l, "cai_lora_export_peft: NULL argument");
    const int n = cai_lora_count(l), r = cai_lora_config_of(l)->rank;
    const cai_registry_t *reg = cai_lora_registry(l);
    cai_st_tensor *t = NULL;
    char(*names)[CAI_HF_NAME_MAX] = NULL;
    float *host = NULL;
    cai_status st = cai_calloc((void **)&t, (size_t)(2 * n + 1), sizeof *t, "PEFT tensors");
    if (st == CAI_OK) st = cai_calloc((void **)&names, (size_t)(2 * n + 1), sizeof *names, "PEFT names");
    if (st == CAI_OK) st = cai_calloc((void **)&host, cai_lora_numel(l) + 1, sizeof *host, "PEFT adapter values");
    float *at = host;
    for (int i = 0; st == CAI_OK && i < n; i++) {
        const cai_lora_adapter *a = cai_lora_get(l, i);
        float *A = at, *B = at + (size_t)r * (size_t)a->in;
        at = B + (size_t)a->rows * (size_t)r;
        st = cai_lora_read(l, i, A, B);
        snprintf(names[2 * i], CAI_HF_NAME_MAX, PEFT_PREFIX "%s.lora_A.weight", a->hf_module);
        snprintf(names[2 * i + 1], CAI_HF_NAME_MAX, PEFT_PREFIX "%s.lora_B.weight", a->hf_module);
        t[2 * i] = (cai_st_tensor){names[2 * i], CAI_DTYPE_F32, 2, {(uint64_t)r, (uint64_t)a->in}, A};
        t[2 * i + 1] = (cai_st_tensor){names[2 * i + 1], CAI_DTYPE_F32, 2, {(uint64_t)a->rows, (uint64_t)r}, B};
    }
    (void)reg;
    char path[CAI_HF_PATH_MAX];
    if (st == CAI_OK) st = cai_hf_mkdirs(dir);
    if (st == CAI_OK) st = cai_hf_path(path, sizeof path, dir, ADAPTER_FILE);
    if (st == CAI_OK) st = cai_safetensors_write(path, t, 2 * n, NULL, 0);
    cai_free(t);
    cai_free(names);
    cai_free(host);
    CAI_CALL(st);

    const cai_lora_config *c = cai_lora_config_of(l);
    const int gpt2 = cai_lora_model_config(l)->family == CAI_MODEL_GPT2;
    json_t *o = json_object();
    json_object_set_new(o, "peft_type", json_string("LORA"));
    json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(o, "base_model_name_or_path", json_string(base_model ? base_model : ""));
    json_object_set_new(o, "r", json_integer(c->rank));
    json_object_set_new(o, "lora_alpha", json_real(cai_hf_float_json(c->alpha)));
    json_object_set_new(o, "lora_dropout", json_real(cai_hf_float_json(c->dropout)));
    json_object_set_new(o, "target_modules", target_list(l));
    json_object_set_new(o, "bias", json_string("none"));
    /* GPT-2's Conv1D weights are [in, out]; lora_A / lora_B are nn.Linear-shaped either way */
    json_object_set_new(o, "fan_in_fan_out", json_boolean(gpt2));
    json_object_set_new(o, "inference_mode", json_true());
    json_object_set_new(o, "init_lora_weights", json_true());
    json_object_set_new(o, "modules_to_save", json_null());
    json_object_set_new(o, "layers_to_transform", json_null());
    json_object_set_new(o, "layers_pattern", json_null());
    json_object_set_new(o, "use_rslora", json_false());
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!text) return CAI_ERROR(CAI_ERR_NOMEM, "cannot build %s", ADAPTER_CONFIG);
    st = cai_hf_path(path, sizeof path, dir, ADAPTER_CONFIG);
    if (st == CAI_OK) st = cai_hf_write_file(path, text, strlen(text));
    free(text);
    return st;
}

/* ------------------------------------------------------------ PEFT: import */

static cai_status cfg_err(const char *path, const char *field, const char *what) {
    return CAI_ERROR(CAI_ERR_FORMAT, "%s: field '%s': %s", path, field, what);
}

cai_status cai_lora_peft_config(const char *dir, cai_lora_config *out, char *targets, size_t cap) {
    CAI_CHECK_ARG(dir && out && targets && cap, "cai_lora_peft_config: NULL argument");
    char path[CAI_HF_PATH_MAX];
    CAI_CALL(cai_hf_path(path, sizeof path, dir, ADAPTER_CONFIG));
    if (!cai_hf_file_exists(path))
        return CAI_ERROR(CAI_ERR_IO, "%s: no such file (a PEFT adapter directory holds %s and %s)", path,
                         ADAPTER_CONFIG, ADAPTER_FILE);
    char *text = NULL;
    size_t len = 0;
    CAI_CALL(cai_hf_read_file(path, &text, &len));
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    free(text);
    if (!o) return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: not valid JSON: %s", path, je.line, je.text);
    cai_status st = CAI_OK;
    json_t *v;
    *out = cai_lora_config_default();
    if (!json_is_object(o)) st = CAI_ERROR(CAI_ERR_FORMAT, "%s: not a JSON object", path);
    else if (!json_is_string(v = json_object_get(o, "peft_type")) || strcmp(json_string_value(v), "LORA") != 0)
        st = cfg_err(path, "peft_type", "must be \"LORA\" (colossal imports LoRA adapters only)");
    else if (!json_is_integer(v = json_object_get(o, "r")) || json_integer_value(v) < 1 ||
             json_integer_value(v) > 1 << 20)
        st = cfg_err(path, "r", "must be an integer >= 1");
    if (st == CAI_OK) {
        out->rank = (int)json_integer_value(json_object_get(o, "r"));
        v = json_object_get(o, "lora_alpha");
        if (!json_is_number(v) || !(json_number_value(v) > 0)) st = cfg_err(path, "lora_alpha", "must be a number > 0");
        else out->alpha = (float)json_number_value(v);
    }
    if (st == CAI_OK && (v = json_object_get(o, "lora_dropout")) && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) >= 1)
            st = cfg_err(path, "lora_dropout", "must be a number in [0, 1)");
        else out->dropout = (float)json_number_value(v);
    }
    if (st == CAI_OK && (v = json_object_get(o, "bias")) &&
        !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
        st = cfg_err(path, "bias", "must be \"none\" (colossal's adapters have no bias)");
    static const char *const flags[] = {"use_dora", "use_rslora"};
    for (int i = 0; st == CAI_OK && i < 2; i++)
        if ((v = json_object_get(o, flags[i])) && !json_is_false(v) && !json_is_null(v))
            st = cfg_err(path, flags[i], "must be false (not supported)");
    static const char *const patterns[] = {"rank_pattern", "alpha_pattern"};
    for (int i = 0; st == CAI_OK && i < 2; i++)
        if ((v = json_object_get(o, patterns[i])) && !json_is_null(v) &&
            !(json_is_object(v) && json_object_size(v) == 0))
            st = cfg_err(path, patterns[i], "per-module ranks or alphas are not supported (must be empty)");
    if (st == CAI_OK && (v = json_object_get(o, "layers_to_transform")) && !json_is_null(v))
        st = cfg_err(path, "layers_to_transform", "must be null (adapters on every layer)");
    if (st == CAI_OK) {
        v = json_object_get(o, "target_modules");
        size_t at = 0;
        targets[0] = '\0';
        if (json_is_string(v) && strcmp(json_string_value(v), "all-linear") == 0) {
            snprintf(targets, cap, "all-linear");
        } else if (!json_is_array(v) || json_array_size(v) == 0) {
            st = cfg_err(path, "target_modules",
                         json_is_string(v) ? "a string is a regular expression in peft, which colossal does not "
                                             "match; list the module names"
                                           : "must be a non-empty list of module names");
        } else {
            for (size_t i = 0; st == CAI_OK && i < json_array_size(v); i++) {
                json_t *e = json_array_get(v, i);
                if (!json_is_string(e)) {
                    char f[64];
                    snprintf(f, sizeof f, "target_modules[%zu]", i);
                    st = cfg_err(path, f, "must be a string");
                    break;
                }
                int k = snprintf(targets + at, cap - at, "%s%s", i ? "," : "", json_string_value(e));
                if (k < 0 || (size_t)k >= cap - at) st = cfg_err(path, "target_modules", "too long");
                else at += (size_t)k;
            }
        }
        out->targets = targets;
    }
    json_decref(o);
    return st;
}

/* An adapter tensor as F32, from F32, BF16 or F16. */
static cai_status read_f32(const cai_safetensors_t *sf, const char *name, uint64_t d0, uint64_t d1, float *dst) {
    const cai_st_entry *e;
    CAI_CALL(cai_safetensors_get(sf, name, &e));
    if (e->ndim != 2 || e->shape[0] != d0 || e->shape[1] != d1)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: tensor '%s' is %dD [%llu, %llu], the adapter needs [%llu, %llu]",
                         cai_safetensors_path(sf), name, e->ndim, (unsigned long long)e->shape[0],
                         (unsigned long long)(e->ndim > 1 ? e->shape[1] : 0), (unsigned long long)d0,
                         (unsigned long long)d1);
    const unsigned char *src = e->data;
    for (uint64_t i = 0; i < e->numel; i++) {
        if (e->dtype == CAI_DTYPE_F32) {
            memcpy(&dst[i], src + 4 * i, 4);
        } else if (e->dtype == CAI_DTYPE_BF16 || e->dtype == CAI_DTYPE_F16) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = e->dtype == CAI_DTYPE_BF16 ? cai_bf16_to_f32(h) : cai_f16_to_f32(h);
        } else {
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: tensor '%s' is %s; adapters are F32, BF16 or F16",
                             cai_safetensors_path(sf), name, e->dtype_name);
        }
        if (!isfinite(dst[i]))
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: tensor '%s' element %llu is not finite", cai_safetensors_path(sf),
                             name, (unsigned long long)i);
    }
    return CAI_OK;
}

cai_status cai_lora_import_peft(const char *dir, cai_lora_t *l) {
    CAI_CHECK_ARG(dir && l, "cai_lora_import_peft: NULL argument");
    char path[CAI_HF_PATH_MAX];
    CAI_CALL(cai_hf_path(path, sizeof path, dir, ADAPTER_FILE));
    if (!cai_hf_file_exists(path))
        return CAI_ERROR(CAI_ERR_IO, "%s: no such file (colossal reads PEFT adapters saved as safetensors)", path);
    cai_safetensors_t *sf = NULL;
    CAI_CALL(cai_safetensors_open(&sf, path));
    const int n = cai_lora_count(l), r = cai_lora_config_of(l)->rank;
    int used = 0;
    float *A = NULL, *B = NULL;
    cai_status st = CAI_OK;
    for (int i = 0; st == CAI_OK && i < n; i++) {
        const cai_lora_adapter *a = cai_lora_get(l, i);
        char na[CAI_HF_NAME_MAX], nb[CAI_HF_NAME_MAX];
        snprintf(na, sizeof na, PEFT_PREFIX "%s.lora_A.weight", a->hf_module);
        snprintf(nb, sizeof nb, PEFT_PREFIX "%s.lora_B.weight", a->hf_module);
        cai_free(A);
        cai_free(B);
        A = B = NULL;
        st = cai_calloc((void **)&A, (size_t)r * (size_t)a->in, sizeof *A, "PEFT lora_A");
        if (st == CAI_OK) st = cai_calloc((void **)&B, (size_t)a->rows * (size_t)r, sizeof *B, "PEFT lora_B");
        if (st == CAI_OK) st = read_f32(sf, na, (uint64_t)r, (uint64_t)a->in, A);
        if (st == CAI_OK) st = read_f32(sf, nb, (uint64_t)a->rows, (uint64_t)r, B);
        if (st == CAI_OK) st = cai_lora_write(l, i, A, B);
        used += 2;
    }
    /* a tensor no adapter took (another module, a bias, embeddings) would be silently lost */
    for (int k = 0; st == CAI_OK && used != cai_safetensors_count(sf) && k < cai_safetensors_count(sf); k++) {
        const char *name = cai_safetensors_entry(sf, k)->name;
        int known = 0;
        for (int i = 0; i < n && !known; i++) {
            const char *m = cai_lora_get(l, i)->hf_module;
            size_t pl = strlen(PEFT_PREFIX), ml = strlen(m);
            known = strncmp(name, PEFT_PREFIX, pl) == 0 && strncmp(name + pl, m, ml) == 0 &&
                    (!strcmp(name + pl + ml, ".lora_A.weight") || !strcmp(name + pl + ml, ".lora_B.weight"));
        }
        if (!known)
            st = CAI_ERROR(CAI_ERR_FORMAT,
                           "%s: tensor '%s' belongs to no adapter of target_modules '%s' (colossal imports lora_A / "
                           "lora_B of the targeted linears only)",
                           path, name, cai_lora_config_of(l)->targets);
    }
    cai_free(A);
    cai_free(B);
    cai_safetensors_close(sf);
    return st;
}

/* ------------------------------------------------------------ merged export */

typedef struct {
    cai_model_t *m;
    const cai_lora_t *l;
} merged_src;

/* The base's F32 masters, or the copy its layers read when it keeps only
 * that (cai_model_keep_compute): the weights the adapters were trained on. */
static cai_status merged_source(void *ctx, const cai_param_info *p, float *dst) {
    merged_src *s = ctx;
    cai_device_t *dev = cai_model_device(s->m);
    const cai_weights_t *w = cai_model_weights(s->m);
    const cai_copy_kind kind = dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H;
    if (!cai_weights_compute_only(w)) {
        cai_tensor master;
        CAI_CALL(cai_model_param(s->m, p->name, &master, NULL));
        CAI_CALL(cai_device_copy(dev, dst, master.data, (size_t)p->numel * sizeof *dst, kind));
        return cai_lora_merge(s->l, p->name, dst);
    }
    cai_tensor t;
    CAI_CALL(cai_weights_find(w, p->name, 1, &t));
    const size_t es = cai_dtype_size(t.dtype);
    if (t.dtype == CAI_DTYPE_F32) {
        CAI_CALL(cai_device_copy(dev, dst, t.data, (size_t)p->numel * es, kind));
    } else {
        void *narrow = NULL;
        CAI_CALL(cai_malloc(&narrow, (size_t)p->numel * es, "merged export staging"));
        cai_status st = cai_device_copy(dev, narrow, t.data, (size_t)p->numel * es, kind);
        if (st == CAI_OK) st = cai_device_sync(dev);
        if (st == CAI_OK) st = cai_convert_host(dst, CAI_DTYPE_F32, narrow, t.dtype, (size_t)p->numel);
        cai_free(narrow);
        CAI_CALL(st);
    }
    return cai_lora_merge(s->l, p->name, dst);
}

cai_status cai_lora_export_merged(const char *dir, cai_model_t *m, const cai_lora_t *l,
                                  const cai_hf_export_options *opt, cai_hf_export_stats *stats) {
    CAI_CHECK_ARG(dir && m && l, "cai_lora_export_merged: NULL argument");
    const cai_rank_view *v = cai_model_view(m);
    if (v->tp_size > 1 || v->pp_size > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "merged LoRA export to '%s' needs the whole model on this rank", dir);
    merged_src s = {m, l};
    return cai_hf_export(dir, cai_model_config_of(m), merged_source, &s, opt, stats);
}
