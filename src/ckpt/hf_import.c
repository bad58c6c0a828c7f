/* Hugging Face import: open and check a whole directory first (config,
 * index, every shard, every tensor the mapping expects and nothing it does
 * not know), then rebuild each colossal parameter's global tensor from its
 * HF tensors by walking the same mapping table the exporter uses. */
#include "cai_config.h"
#include "colossal/ckpt.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "colossal/parallel.h"
#include "colossal/tensor.h"
#include "hf_internal.h"

struct cai_hf {
    char *dir;
    cai_hf_map_t *map;
    cai_safetensors_t **files;
    int n_files;
    int sharded;
    uint64_t total_size;
    json_t *index; /* the index's root; weight_map values name files */
    json_t *weight_map;
    int strip_transformer;       /* GPT-2 saved from GPT2Model: names without "transformer." */
    const cai_st_entry **tensor; /* per mapping entry */
    int *tensor_file;
};

const char *cai_hf_dir(const cai_hf_t *h) { return h ? h->dir : NULL; }
const cai_model_config *cai_hf_config(const cai_hf_t *h) { return h ? cai_hf_map_config(h->map) : NULL; }
const cai_hf_map_t *cai_hf_map(const cai_hf_t *h) { return h ? h->map : NULL; }
int cai_hf_file_count(const cai_hf_t *h) { return h ? h->n_files : 0; }

const cai_safetensors_t *cai_hf_file(const cai_hf_t *h, int i) {
    return h && i >= 0 && i < h->n_files ? h->files[i] : NULL;
}

int cai_hf_sharded(const cai_hf_t *h, uint64_t *total_size) {
    if (total_size) *total_size = h ? h->total_size : 0;
    return h ? h->sharded : 0;
}

const cai_st_entry *cai_hf_tensor(const cai_hf_t *h, const cai_hf_entry *e, const cai_safetensors_t **file) {
    const cai_hf_entry *base = h ? cai_hf_map_entry(h->map, 0) : NULL;
    const ptrdiff_t i = base && e ? e - base : -1;
    if (i < 0 || i >= cai_hf_map_count(h->map)) {
        if (file) *file = NULL;
        return NULL;
    }
    if (file) *file = h->files[h->tensor_file[i]];
    return h->tensor[i];
}

void cai_hf_close(cai_hf_t *h) {
    if (!h) return;
    for (int i = 0; i < h->n_files; i++) cai_safetensors_close(h->files[i]);
    cai_free(h->files);
    cai_free(h->tensor);
    cai_free(h->tensor_file);
    json_decref(h->index);
    cai_hf_map_free(h->map);
    free(h->dir);
    cai_free(h);
}

/* ------------------------------------------------------------ opening */

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int file_index(const cai_hf_t *h, const char *name) {
    for (int i = 0; i < h->n_files; i++)
        if (strcmp(base_name(cai_safetensors_path(h->files[i])), name) == 0) return i;
    return -1;
}

static cai_status open_file(cai_hf_t *h, const char *name) {
    char path[CAI_HF_PATH_MAX];
    CAI_CALL(cai_hf_path(path, sizeof path, h->dir, name));
    cai_safetensors_t **f = realloc(h->files, (size_t)(h->n_files + 1) * sizeof *f);
    if (!f) return CAI_ERROR(CAI_ERR_NOMEM, "HF model '%s': %d files", h->dir, h->n_files + 1);
    h->files = f;
    CAI_CALL(cai_safetensors_open(&h->files[h->n_files], path));
    h->n_files++;
    return CAI_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The index: a weight_map of plain file names; every listed tensor is in
 * its file and every tensor of a file is listed there, so no tensor can be
 * read from the wrong shard. */
static cai_status open_index(cai_hf_t *h, const char *index_path) {
    json_error_t jerr;
    h->index = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!h->index)
        return CAI_ERROR(CAI_ERR_FORMAT, "'%s': invalid JSON at line %d, column %d: %s", index_path, jerr.line,
                         jerr.column, jerr.text);
    h->weight_map = json_object_get(h->index, "weight_map");
    if (!json_is_object(h->weight_map) || json_object_size(h->weight_map) == 0)
        return CAI_ERROR(CAI_ERR_FORMAT, "'%s': \"weight_map\" is missing or not a non-empty object", index_path);
    json_t *md = json_object_get(h->index, "metadata"), *ts = md ? json_object_get(md, "total_size") : NULL;
    if (ts && !(json_is_integer(ts) && json_integer_value(ts) >= 0))
        return CAI_ERROR(CAI_ERR_FORMAT, "'%s': metadata.total_size is not a non-negative integer", index_path);
    h->total_size = ts ? (uint64_t)json_integer_value(ts) : 0;
    h->sharded = 1;
    const size_t n = json_object_size(h->weight_map);
    const char **names = NULL;
    CAI_CALL(cai_calloc((void **)&names, n, sizeof *names, "index file names"));
    const char *key;
    json_t *v;
    size_t k = 0;
    cai_status st = CAI_OK;
    json_object_foreach(h->weight_map, key, v) {
        const char *file = json_string_value(v);
        if (!file || !*file || strchr(file, '/') || strcmp(file, "..") == 0 || strcmp(file, ".") == 0) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "'%s': weight_map[\"%s\"] must be the name of a file in the same directory",
                           index_path, key);
            goto done;
        }
        names[k++] = file;
    }
    /* shards in name order: model-00001-of-0000K first */
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++)
        if (i == 0 || strcmp(names[i], names[i - 1]) != 0) CAI_CALL_GOTO(open_file(h, names[i]), st, done);
    json_object_foreach(h->weight_map, key, v) {
        const cai_safetensors_t *f = h->files[file_index(h, json_string_value(v))];
        if (!cai_safetensors_find(f, key)) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "'%s' lists tensor '%s' in '%s', but that file does not hold it", index_path,
                           key, cai_safetensors_path(f));
            goto done;
        }
    }
    for (int i = 0; i < h->n_files; i++)
        for (int j = 0; j < cai_safetensors_count(h->files[i]); j++) {
            const char *t = cai_safetensors_entry(h->files[i], j)->name;
            const char *listed = json_string_value(json_object_get(h->weight_map, t));
            if (!listed || file_index(h, listed) != i) {
                st = CAI_ERROR(CAI_ERR_FORMAT, "'%s' holds tensor '%s', which '%s' %s%s",
                               cai_safetensors_path(h->files[i]), t, index_path,
                               listed ? "assigns to " : "does not list", listed ? listed : "");
                goto done;
            }
        }
done:
    cai_free((void *)names);
    return st;
}

/* The file and entry of HF tensor `name`, or NULL. */
static const cai_st_entry *lookup(const cai_hf_t *h, const char *name, int *file) {
    if (h->strip_transformer && strncmp(name, "transformer.", 12) == 0) name += 12;
    if (h->sharded) {
        const char *f = json_string_value(json_object_get(h->weight_map, name));
        int i = f ? file_index(h, f) : -1;
        *file = i;
        return i >= 0 ? cai_safetensors_find(h->files[i], name) : NULL;
    }
    *file = 0;
    return cai_safetensors_find(h->files[0], name);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Tensors transformers saves that are not weights: causal-mask buffers of
 * old GPT-2 checkpoints, RoPE frequencies of old Llama ones; and a tied head
 * some exporters write anyway (transformers re-ties it on load). */
static int ignorable(const cai_hf_t *h, const char *name) {
    const cai_model_config *c = cai_hf_map_config(h->map);
    if (c->family == CAI_MODEL_GPT2 && (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")))
        return 1;
    if (c->family == CAI_MODEL_LLAMA && ends_with(name, ".rotary_emb.inv_freq")) return 1;
    return c->tie_embeddings && strcmp(name, "lm_head.weight") == 0;
}

static void config_summary(const cai_model_config *c, char *buf, size_t cap) {
    if (c->family == CAI_MODEL_GPT2)
        snprintf(buf, cap, "vocab_size=%d n_positions=%d n_embd=%d n_layer=%d n_head=%d n_inner=%d", c->vocab_size,
                 c->max_seq_len, c->d_model, c->n_layers, c->n_heads, c->ffn_hidden);
    else
        snprintf(buf, cap,
                 "vocab_size=%d hidden_size=%d intermediate_size=%d num_hidden_layers=%d "
                 "num_attention_heads=%d num_key_value_heads=%d%s%.0d",
                 c->vocab_size, c->d_model, c->moe.n_experts > 0 ? c->moe.ffn : c->ffn_hidden, c->n_layers, c->n_heads,
                 c->n_kv_heads, c->moe.n_experts > 0 ? " num_local_experts=" : "", c->moe.n_experts);
}

static cai_status check_tensors(cai_hf_t *h, const char *where) {
    const cai_hf_map_t *m = h->map;
    const int n = cai_hf_map_count(m);
    char cfg_text[256];
    config_summary(cai_hf_map_config(m), cfg_text, sizeof cfg_text);
    CAI_CALL(cai_calloc((void **)&h->tensor, (size_t)n + 1, sizeof *h->tensor, "HF tensor table"));
    CAI_CALL(cai_calloc((void **)&h->tensor_file, (size_t)n + 1, sizeof *h->tensor_file, "HF tensor table"));
    if (cai_hf_map_config(m)->family == CAI_MODEL_GPT2) {
        int f;
        h->strip_transformer = !lookup(h, "transformer.wte.weight", &f) && lookup(h, "wte.weight", &f);
    }
    for (int i = 0; i < n; i++) {
        const cai_hf_entry *e = cai_hf_map_entry(m, i);
        int f = -1;
        const cai_st_entry *t = lookup(h, e->hf, &f);
        const char *shown = h->strip_transformer && strncmp(e->hf, "transformer.", 12) == 0 ? e->hf + 12 : e->hf;
        if (!t)
            return CAI_ERROR(CAI_ERR_FORMAT, "HF model '%s': tensor '%s' (colossal '%s') is missing: %s does not %s it",
                             h->dir, shown, e->colossal, where, h->sharded ? "list" : "hold");
        const char *fp = cai_safetensors_path(h->files[f]);
        if (t->ndim != e->ndim || t->shape[0] != e->hf_shape[0] || (e->ndim == 2 && t->shape[1] != e->hf_shape[1])) {
            char a[96], b[96];
            cai_hf_shape_str(a, sizeof a, t->ndim, t->shape);
            cai_hf_shape_str(b, sizeof b, e->ndim, e->hf_shape);
            return CAI_ERROR(CAI_ERR_FORMAT, "'%s': tensor '%s' has shape %s but config.json (%s) implies %s", fp,
                             shown, a, cfg_text, b);
        }
        if (t->dtype != CAI_DTYPE_F32 && t->dtype != CAI_DTYPE_BF16 && t->dtype != CAI_DTYPE_F16)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED, "'%s': tensor '%s' is %s; colossal imports F32, BF16 and F16", fp,
                             shown, t->dtype_name);
        h->tensor[i] = t;
        h->tensor_file[i] = f;
    }
    /* Anything else in the files means the directory is not the model
     * config.json describes (more layers, another architecture): refuse
     * rather than silently drop weights. */
    cai_status st = CAI_OK;
    for (int fi = 0; fi < h->n_files && st == CAI_OK; fi++) {
        const cai_safetensors_t *f = h->files[fi];
        const int count = cai_safetensors_count(f);
        unsigned char *used = NULL;
        CAI_CALL(cai_calloc((void **)&used, (size_t)count + 1, 1, "HF tensor flags"));
        for (int i = 0; i < n; i++)
            if (h->tensor_file[i] == fi) used[h->tensor[i] - cai_safetensors_entry(f, 0)] = 1;
        for (int j = 0; j < count && st == CAI_OK; j++) {
            const cai_st_entry *t = cai_safetensors_entry(f, j);
            if (used[j] || ignorable(h, t->name)) continue;
            st = CAI_ERROR(CAI_ERR_FORMAT,
                           "'%s': unexpected tensor '%s': it is not part of a %s with config.json's "
                           "sizes (%s%s)",
                           cai_safetensors_path(f), t->name, cai_hf_architecture(cai_hf_map_config(m)), cfg_text,
                           cai_hf_map_config(m)->tie_embeddings ? ", tied head" : "");
        }
        cai_free(used);
    }
    return st;
}

cai_status cai_hf_open(cai_hf_t **out, const char *dir) {
    CAI_CHECK_ARG(out && dir && *dir, "cai_hf_open: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return CAI_ERROR(CAI_ERR_IO, "HF model '%s' is not a directory", dir);
    cai_hf_t *h = NULL;
    CAI_CALL(cai_calloc((void **)&h, 1, sizeof *h, "HF model"));
    cai_status st = CAI_OK;
    char path[CAI_HF_PATH_MAX], where[CAI_HF_PATH_MAX + 8];
    h->dir = strdup(dir);
    if (!h->dir) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "HF model '%s'", dir);
        goto fail;
    }
    CAI_CALL_GOTO(cai_hf_path(path, sizeof path, dir, "config.json"), st, fail);
    cai_model_config cfg;
    CAI_CALL_GOTO(cai_hf_config_load(path, &cfg), st, fail);
    CAI_CALL_GOTO(cai_hf_map_create(&h->map, &cfg), st, fail);
    /* transformers' order: a single file wins over an index */
    CAI_CALL_GOTO(cai_hf_path(path, sizeof path, dir, CAI_HF_SINGLE_NAME), st, fail);
    if (cai_hf_file_exists(path)) {
        CAI_CALL_GOTO(open_file(h, CAI_HF_SINGLE_NAME), st, fail);
    } else {
        CAI_CALL_GOTO(cai_hf_path(path, sizeof path, dir, CAI_HF_INDEX_NAME), st, fail);
        if (!cai_hf_file_exists(path)) {
            char bin[CAI_HF_PATH_MAX];
            CAI_CALL_GOTO(cai_hf_path(bin, sizeof bin, dir, "pytorch_model.bin"), st, fail);
            if (cai_hf_file_exists(bin))
                st = CAI_ERROR(CAI_ERR_UNSUPPORTED,
                               "HF model '%s' has PyTorch pickle weights only (pytorch_model.bin); "
                               "colossal reads safetensors: re-save with save_pretrained(safe_serialization=True)",
                               dir);
            else
                st = CAI_ERROR(CAI_ERR_IO, "HF model '%s' has no weights: neither %s nor %s", dir, CAI_HF_SINGLE_NAME,
                               CAI_HF_INDEX_NAME);
            goto fail;
        }
        CAI_CALL_GOTO(open_index(h, path), st, fail);
    }
    snprintf(where, sizeof where, "'%s'", h->sharded ? path : cai_safetensors_path(h->files[0]));
    CAI_CALL_GOTO(check_tensors(h, where), st, fail);
    if (h->sharded && h->total_size) {
        uint64_t sum = 0;
        for (int i = 0; i < h->n_files; i++)
            for (int j = 0; j < cai_safetensors_count(h->files[i]); j++) {
                const cai_st_entry *e = cai_safetensors_entry(h->files[i], j);
                sum += e->end - e->begin;
            }
        /* transformers never checks it, and some hubs' indexes are off; say so, go on */
        if (sum != h->total_size)
            CAI_WARN("HF model '%s': %s says total_size %llu but the shards hold %llu tensor bytes", dir,
                     CAI_HF_INDEX_NAME, (unsigned long long)h->total_size, (unsigned long long)sum);
    }
    *out = h;
    return CAI_OK;
fail:
    cai_hf_close(h);
    return st;
}

/* ------------------------------------------------------------ reading */

/* The mapping entries for a parameter: its own, or its tie primary's (the
 * tied head reads the embedding). */
static int entries_for(const cai_hf_map_t *m, const char *name, const cai_hf_entry **first,
                       const cai_param_info **mine) {
    const cai_registry_t *reg = cai_hf_map_registry(m);
    const int idx = cai_registry_find(reg, name);
    *mine = idx >= 0 ? cai_registry_param(reg, idx) : NULL;
    int n = cai_hf_map_find(m, name, first);
    if (n == 0 && *mine && (*mine)->tie_primary != idx)
        n = cai_hf_map_find(m, cai_registry_param(reg, (*mine)->tie_primary)->name, first);
    return n;
}

/* Weights that are not finite are refused on import, naming the HF tensor,
 * its file and the first bad element (verify reports the same). */
static cai_status check_finite(const cai_hf_t *h, const cai_param_info *param, const cai_hf_entry *e, int n,
                               const float *dst) {
    const uint64_t cols = param->ndim == 1 ? 1 : param->shape[1];
    uint64_t bad = 0, first = 0;
    for (uint64_t i = 0; i < param->numel; i++)
        if (!isfinite(dst[i]) && !bad++) first = i;
    if (!bad) return CAI_OK;
    const uint64_t row = first / cols, col = first % cols;
    int k = 0;
    while (k + 1 < n && !(row >= e[k].row_begin && row < e[k].row_begin + e[k].rows)) k++;
    const uint64_t r = row - e[k].row_begin;
    const uint64_t at = e[k].transform == CAI_HF_TRANSPOSE ? col * e[k].rows + r : r * cols + col;
    const cai_safetensors_t *f = NULL;
    cai_hf_tensor(h, &e[k], &f);
    return CAI_ERROR(CAI_ERR_FORMAT,
                     "HF model '%s': tensor '%s' in '%s' holds %llu values that are not finite (the "
                     "first, element %llu, is %g); refusing to import it",
                     h->dir, e[k].hf, f ? cai_safetensors_path(f) : "?", (unsigned long long)bad,
                     (unsigned long long)at, (double)dst[first]);
}

cai_status cai_hf_read_param(cai_hf_t *h, const cai_param_info *param, float *dst) {
    CAI_CHECK_ARG(h && param && dst, "cai_hf_read_param: NULL argument");
    const cai_hf_entry *e = NULL;
    const cai_param_info *want = NULL;
    const int n = entries_for(h->map, param->name, &e, &want);
    if (n == 0 || !want)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "HF model '%s': parameter '%s' is not part of the %s config.json describes", h->dir,
                         param->name, cai_hf_architecture(cai_hf_map_config(h->map)));
    /* vocabulary rows may be padded to another multiple than the mapping's */
    const int vocab = e[0].transform == CAI_HF_VOCAB_ROWS;
    int same = param->ndim == want->ndim && (vocab ? param->shape[0] >= e[0].rows : param->shape[0] == want->shape[0]);
    for (int d = 1; d < CAI_PARAM_MAX_DIMS; d++) same &= param->shape[d] == want->shape[d];
    if (!same) {
        char a[96], b[96];
        cai_hf_shape_str(a, sizeof a, param->ndim, param->shape);
        cai_hf_shape_str(b, sizeof b, want->ndim, want->shape);
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "HF model '%s': parameter '%s' is asked for as %s but config.json gives "
                         "%s%s",
                         h->dir, param->name, a, b, vocab ? " (any padding of the vocabulary rows)" : "");
    }
    const uint64_t cols = param->ndim == 1 ? 1 : param->shape[1];
    memset(dst, 0, (size_t)param->numel * sizeof *dst);
    cai_status st = CAI_OK;
    void *raw = NULL;
    float *tmp = NULL;
    for (int k = 0; k < n && st == CAI_OK; k++) {
        const cai_st_entry *t = cai_hf_tensor(h, &e[k], NULL);
        const size_t numel = (size_t)t->numel, bytes = numel * t->elem_size;
        const void *src = t->data;
        /* foreign writers may leave a tensor unaligned in the mapping */
        if ((uintptr_t)src % t->elem_size != 0) {
            CAI_CALL_GOTO(cai_malloc(&raw, bytes + 64, "HF unaligned tensor"), st, done);
            memcpy(raw, src, bytes);
            src = raw;
        }
        if (e[k].transform != CAI_HF_TRANSPOSE) {
            CAI_CALL_GOTO(cai_convert_host(dst + e[k].row_begin * cols, CAI_DTYPE_F32, src, t->dtype, numel), st, done);
        } else {
            CAI_CALL_GOTO(cai_malloc((void **)&tmp, numel * sizeof *tmp + 64, "HF transpose"), st, done);
            CAI_CALL_GOTO(cai_convert_host(tmp, CAI_DTYPE_F32, src, t->dtype, numel), st, done);
            /* HF [in = cols, out = rows] -> colossal [out, in] */
            const uint64_t rows = e[k].rows, rb = e[k].row_begin;
            enum { BLK = 32 };
            for (uint64_t i0 = 0; i0 < cols; i0 += BLK)
                for (uint64_t o0 = 0; o0 < rows; o0 += BLK) {
                    const uint64_t i1 = i0 + BLK < cols ? i0 + BLK : cols, o1 = o0 + BLK < rows ? o0 + BLK : rows;
                    for (uint64_t i = i0; i < i1; i++)
                        for (uint64_t o = o0; o < o1; o++) dst[(rb + o) * cols + i] = tmp[i * rows + o];
                }
        }
    done:
        cai_free(raw);
        cai_free(tmp);
        raw = NULL;
        tmp = NULL;
    }
    CAI_CALL(st);
    CAI_CALL(check_finite(h, param, e, n, dst));
    return CAI_OK;
}

static uint64_t max_numel(const cai_registry_t *reg) {
    uint64_t m = 1;
    for (int i = 0; i < cai_registry_count(reg); i++)
        if (cai_registry_param(reg, i)->numel > m) m = cai_registry_param(reg, i)->numel;
    return m;
}

cai_status cai_hf_import(cai_hf_t *h, const cai_registry_t *reg, cai_hf_sink_fn sink, void *ctx) {
    CAI_CHECK_ARG(h && sink, "cai_hf_import: NULL argument");
    if (!reg) reg = cai_hf_map_registry(h->map);
    float *buf = NULL;
    CAI_CALL(cai_malloc((void **)&buf, (size_t)max_numel(reg) * sizeof *buf, "HF import tensor"));
    cai_status st = CAI_OK;
    for (int i = 0; i < cai_registry_count(reg) && st == CAI_OK; i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        st = cai_hf_read_param(h, p, buf);
        if (st == CAI_OK) st = sink(ctx, p, buf);
    }
    cai_free(buf);
    CAI_CALL(st);
    return CAI_OK;
}

/* The model must be the architecture config.json describes; the error names
 * the first field that differs. */
static cai_status check_model_config(const cai_hf_t *h, const cai_model_config *mc) {
    const cai_model_config *hc = cai_hf_map_config(h->map);
    if (mc->family != hc->family)
        return CAI_ERROR(CAI_ERR_CONFIG, "HF import from '%s': the model is %s but config.json describes %s", h->dir,
                         cai_model_family_name(mc->family), cai_hf_architecture(hc));
    const int gpt2 = hc->family == CAI_MODEL_GPT2;
    /* a Mixtral's dense ffn_hidden is unused: every layer is an MoE block */
    const int moe = hc->moe.n_experts > 0;
    const struct {
        const char *field, *hf;
        int model, file;
    } f[] = {
        {"vocab_size", "vocab_size", mc->vocab_size, hc->vocab_size},
        {"n_layers", gpt2 ? "n_layer" : "num_hidden_layers", mc->n_layers, hc->n_layers},
        {"d_model", gpt2 ? "n_embd" : "hidden_size", mc->d_model, hc->d_model},
        {"n_heads", gpt2 ? "n_head" : "num_attention_heads", mc->n_heads, hc->n_heads},
        {"n_kv_heads", gpt2 ? "n_head" : "num_key_value_heads", mc->n_kv_heads, hc->n_kv_heads},
        {moe ? "moe.ffn" : "ffn_hidden", gpt2 ? "n_inner" : "intermediate_size", moe ? mc->moe.ffn : mc->ffn_hidden,
         moe ? hc->moe.ffn : hc->ffn_hidden},
        {"moe.n_experts", "num_local_experts", mc->moe.n_experts, hc->moe.n_experts},
        {"moe.top_k", "num_experts_per_tok", moe ? mc->moe.top_k : 0, moe ? hc->moe.top_k : 0},
        {"moe.every", "num_local_experts (every layer)", moe ? (mc->moe_every > 1 ? mc->moe_every : 1) : 0,
         moe ? 1 : 0},
        /* learned positions are weights; RoPE tables are not */
        {"max_seq_len", "n_positions", gpt2 ? mc->max_seq_len : 0, gpt2 ? hc->max_seq_len : 0},
        {"tie_embeddings", "tie_word_embeddings", mc->tie_embeddings, hc->tie_embeddings},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].model != f[i].file)
            return CAI_ERROR(CAI_ERR_CONFIG, "HF import from '%s': model.%s=%d but config.json has %s=%d", h->dir,
                             f[i].field, f[i].model, f[i].hf, f[i].file);
    if (mc->norm_eps != hc->norm_eps || (!gpt2 && mc->rope_theta != hc->rope_theta))
        CAI_WARN("HF import from '%s': the model computes with norm_eps %g, rope_theta %g; config.json says %g, %g",
                 h->dir, (double)mc->norm_eps, (double)mc->rope_theta, (double)hc->norm_eps, (double)hc->rope_theta);
    return CAI_OK;
}

cai_status cai_hf_import_weights(cai_hf_t *h, cai_weights_t *w) {
    CAI_CHECK_ARG(h && w, "cai_hf_import_weights: NULL argument");
    CAI_CALL(cai_weights_check_writable(w, "HF import"));
    CAI_CALL(check_model_config(h, cai_weights_config(w)));
    const cai_registry_t *reg = cai_weights_registry(w);
    cai_device_t *dev = cai_weights_device(w);
    const uint64_t maxn = max_numel(reg);
    float *global = NULL, *local = NULL;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_malloc((void **)&global, (size_t)maxn * sizeof *global, "HF import tensor"), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&local, (size_t)maxn * sizeof *local, "HF import shard"), st, done);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        const cai_param_shard *sh = cai_weights_shard(w, i);
        if (!sh->held) continue;
        CAI_CALL_GOTO(cai_hf_read_param(h, p, global), st, done);
        cai_shard_extract(sh, sizeof(float), global, local);
        cai_tensor master;
        CAI_CALL_GOTO(cai_weights_param_view(w, i, 0, &master), st, done);
        CAI_CALL_GOTO(cai_device_copy(dev, master.data, local, (size_t)sh->local_numel * sizeof *local, CAI_COPY_H2D),
                      st, done);
    }
    CAI_CALL_GOTO(cai_weights_updated(w), st, done);
done:
    cai_free(global);
    cai_free(local);
    return st;
}

cai_status cai_hf_import_model(cai_hf_t *h, cai_model_t *m) {
    CAI_CHECK_ARG(h && m, "cai_hf_import_model: NULL argument");
    if (cai_model_external_params(m))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "HF import: this model's parameters live in external storage (ZeRO)");
    return cai_hf_import_weights(h, cai_model_weights(m));
}

void cai_ckpt_grow_vocab_rows(const cai_param_info *param, float *global, int64_t source_vocab, int64_t vocab) {
    if (!param->spec.vocab_parallel || param->spec.tp_split_dim != 0 || source_vocab <= 0 || vocab <= source_vocab ||
        (uint64_t)vocab > param->shape[0])
        return;
    const size_t cols = (size_t)(param->numel / param->shape[0]);
    for (size_t c = 0; c < cols; c++) {
        double sum = 0; /* in row order: the same value on every rank and layout */
        for (int64_t r = 0; r < source_vocab; r++) sum += global[(size_t)r * cols + c];
        const float mean = (float)(sum / (double)source_vocab);
        for (int64_t r = source_vocab; r < vocab; r++) global[(size_t)r * cols + c] = mean;
    }
}

typedef struct {
    cai_hf_t *h;
    int64_t file_vocab, vocab;
} hf_zero_src;

static cai_status hf_zero_read(void *ctx, const cai_param_info *param, float *dst) {
    hf_zero_src *s = ctx;
    if (!dst) return CAI_OK;
    CAI_CALL(cai_hf_read_param(s->h, param, dst));
    cai_ckpt_grow_vocab_rows(param, dst, s->file_vocab, s->vocab);
    return CAI_OK;
}

cai_status cai_hf_import_zero(cai_hf_t *h, cai_zero_t *z) {
    CAI_CHECK_ARG(h && z, "cai_hf_import_zero: NULL argument");
    const cai_model_config *mc = cai_model_config_of(cai_zero_model(z));
    const int file_vocab = cai_hf_map_config(h->map)->vocab_size;
    if (mc->vocab_size < file_vocab)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "HF import from '%s': model.vocab_size=%d is smaller than config.json's vocab_size=%d", h->dir,
                         mc->vocab_size, file_vocab);
    cai_model_config same = *mc; /* a larger vocabulary grows; the rest must be config.json's */
    same.vocab_size = file_vocab;
    CAI_CALL(check_model_config(h, &same));
    hf_zero_src s = {h, file_vocab, mc->vocab_size};
    return cai_zero_load_params(z, hf_zero_read, &s);
}

cai_status cai_hf_import_flat(cai_hf_t *h, const cai_registry_t *reg, float *flat, size_t flat_count,
                              size_t align_elems) {
    CAI_CHECK_ARG(h && reg && flat, "cai_hf_import_flat: NULL argument");
    const cai_rank_view single = cai_rank_view_single();
    size_t *off = NULL, total = 0;
    CAI_CALL(cai_calloc((void **)&off, (size_t)cai_registry_count(reg) + 1, sizeof *off, "flat offsets"));
    cai_status st = cai_registry_local_layout(reg, &single, align_elems, off, &total);
    if (st == CAI_OK && total > flat_count)
        st = CAI_ERROR(CAI_ERR_INVALID_ARG,
                       "HF import: the flat buffer has %zu floats, the registry's layout needs %zu", flat_count, total);
    if (st == CAI_OK) memset(flat, 0, total * sizeof *flat);
    for (int i = 0; st == CAI_OK && i < cai_registry_count(reg); i++)
        st = cai_hf_read_param(h, cai_registry_param(reg, i), flat + off[i]);
    cai_free(off);
    CAI_CALL(st);
    return CAI_OK;
}
