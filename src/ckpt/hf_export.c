/* Hugging Face export: walk the mapping table, ask the source for each
 * colossal tensor once, cut/transposes it into the HF layout, convert the
 * dtype and stream it into its shard. At most one parameter (plus one HF
 * tensor in two dtypes) is in memory at a time, so a model larger than the
 * host's free memory twice over still exports. */
#include "cai_config.h"
#include "colossal/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colossal/tensor.h"
#include "hf_internal.h"

cai_hf_export_options cai_hf_export_options_default(void) {
    cai_hf_export_options o;
    memset(&o, 0, sizeof o);
    o.dtype = CAI_DTYPE_F32;
    return o;
}

static uint64_t entry_numel(const cai_hf_entry *e) {
    return e->ndim == 1 ? e->hf_shape[0] : e->hf_shape[0] * e->hf_shape[1];
}

/* src is the colossal tensor [R, cols] (or [R]); out gets the entry's HF
 * layout in F32. */
static void to_hf_layout(const cai_hf_entry *e, const cai_param_info *p, const float *src, float *out) {
    const uint64_t cols = p->ndim == 1 ? 1 : p->shape[1], rb = e->row_begin, rows = e->rows;
    if (e->transform != CAI_HF_TRANSPOSE) {
        memcpy(out, src + rb * cols, (size_t)(rows * cols) * sizeof *out);
        return;
    }
    /* out[i][o] = src[rb + o][i]: blocked so both sides stay in cache */
    enum { BLK = 32 };
    for (uint64_t o0 = 0; o0 < rows; o0 += BLK)
        for (uint64_t i0 = 0; i0 < cols; i0 += BLK) {
            const uint64_t o1 = o0 + BLK < rows ? o0 + BLK : rows, i1 = i0 + BLK < cols ? i0 + BLK : cols;
            for (uint64_t o = o0; o < o1; o++)
                for (uint64_t i = i0; i < i1; i++) out[i * rows + o] = src[(rb + o) * cols + i];
        }
}

typedef struct {
    const cai_hf_map_t *map;
    cai_hf_source_fn source;
    void *ctx;
    cai_dtype dtype;
    float *param_buf, *hf_buf;
    void *conv_buf;
    const char *cached; /* colossal name whose tensor is in param_buf */
} exporter;

static cai_status put_entry(exporter *x, cai_st_writer_t *w, const cai_hf_entry *e) {
    const cai_registry_t *reg = cai_hf_map_registry(x->map);
    const cai_param_info *p = cai_registry_param(reg, cai_registry_find(reg, e->colossal));
    if (!x->cached || strcmp(x->cached, e->colossal) != 0) {
        x->cached = NULL;
        CAI_CALL(x->source(x->ctx, p, x->param_buf));
        x->cached = e->colossal;
    }
    to_hf_layout(e, p, x->param_buf, x->hf_buf);
    const void *data = x->hf_buf;
    if (x->dtype != CAI_DTYPE_F32) {
        CAI_CALL(cai_convert_host(x->conv_buf, x->dtype, x->hf_buf, CAI_DTYPE_F32, (size_t)entry_numel(e)));
        data = x->conv_buf;
    }
    CAI_CALL(cai_safetensors_writer_put(w, e->hf, data));
    return CAI_OK;
}

static void shard_name(char *buf, size_t cap, int k, int n) {
    snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k + 1, n);
}

static cai_status write_shard(exporter *x, const char *path, int first, int count) {
    cai_st_tensor *t = NULL;
    CAI_CALL(cai_calloc((void **)&t, (size_t)count + 1, sizeof *t, "HF shard descriptors"));
    for (int i = 0; i < count; i++) {
        const cai_hf_entry *e = cai_hf_map_entry(x->map, first + i);
        t[i].name = e->hf;
        t[i].dtype = x->dtype;
        t[i].ndim = e->ndim;
        t[i].shape[0] = e->hf_shape[0];
        t[i].shape[1] = e->hf_shape[1];
    }
    cai_st_writer_t *w = NULL;
    const cai_st_meta meta[1] = {{"format", "pt"}};
    cai_status st = cai_safetensors_writer_open(&w, path, t, count, meta, 1);
    cai_free(t);
    CAI_CALL(st);
    for (int i = 0; i < count; i++) {
        st = put_entry(x, w, cai_hf_map_entry(x->map, first + i));
        if (st != CAI_OK) {
            cai_error_push(__FILE__, __LINE__, __func__, "put_entry");
            cai_safetensors_writer_abort(w);
            return st;
        }
    }
    CAI_CALL(cai_safetensors_writer_close(w));
    return CAI_OK;
}

static cai_status write_index(const char *dir, const cai_hf_map_t *map, const int *shard_of, int n_shards,
                              uint64_t total) {
    json_t *root = json_object(), *md = json_object(), *wm = json_object();
    int bad = !root || !md || !wm;
    bad |= json_object_set_new(md, "total_size", json_integer((json_int_t)total));
    bad |= json_object_set_new(root, "metadata", md);
    bad |= json_object_set_new(root, "weight_map", wm);
    char name[64];
    for (int i = 0; !bad && i < cai_hf_map_count(map); i++) {
        shard_name(name, sizeof name, shard_of[i], n_shards);
        bad |= json_object_set_new(wm, cai_hf_map_entry(map, i)->hf, json_string(name));
    }
    /* transformers writes the weight_map sorted by tensor name */
    char *text = bad ? NULL : json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (!text) return CAI_ERROR(CAI_ERR_NOMEM, "cannot build %s", CAI_HF_INDEX_NAME);
    char path[CAI_HF_PATH_MAX];
    cai_status st = cai_hf_path(path, sizeof path, dir, CAI_HF_INDEX_NAME);
    if (st == CAI_OK) st = cai_hf_write_file(path, text, strlen(text));
    free(text);
    CAI_CALL(st);
    return CAI_OK;
}

/* Weight files of an earlier export into the same directory would be read
 * by transformers (model.safetensors wins over an index) or confuse a
 * reader: remove the ones this export did not write. */
static cai_status remove_stale(const char *dir, int n_shards) {
    DIR *d = opendir(dir);
    if (!d) return CAI_ERROR(CAI_ERR_IO, "cannot list '%s': %s", dir, strerror(errno));
    cai_status st = CAI_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && st == CAI_OK) {
        const char *n = de->d_name;
        unsigned k = 0, of = 0;
        char tail[32] = "";
        int stale = 0;
        if (strcmp(n, CAI_HF_SINGLE_NAME) == 0) stale = n_shards > 1;
        else if (strcmp(n, CAI_HF_INDEX_NAME) == 0) stale = n_shards == 1;
        else if (sscanf(n, "model-%u-of-%u%31s", &k, &of, tail) == 3 && strcmp(tail, ".safetensors") == 0)
            stale = n_shards == 1 || (int)of != n_shards;
        if (!stale) continue;
        char path[CAI_HF_PATH_MAX];
        st = cai_hf_path(path, sizeof path, dir, n);
        if (st == CAI_OK && unlink(path) != 0 && errno != ENOENT)
            st = CAI_ERROR(CAI_ERR_IO, "cannot remove the stale weight file '%s': %s", path, strerror(errno));
    }
    closedir(d);
    return st;
}

/* ------------------------------------------------------------ tokenizer */

static const char *const k_tok_files[] = {
    "tokenizer.json",          "vocab.json",       "merges.txt", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json"};
#define N_TOK_FILES (sizeof k_tok_files / sizeof k_tok_files[0])

typedef struct {
    int bos, eos;
    const char *bos_text, *eos_text; /* static strings */
    long long max_id;
    char max_tok[64];
    int have[N_TOK_FILES]; /* which of k_tok_files the tokenizer directory holds */
} tok_info;

static void note_token(tok_info *t, const char *text, long long id) {
    static const struct {
        const char *text;
        int bos, eos;
    } k_special[] = {
        {"<|endoftext|>", 1, 1}, {"<s>", 1, 0}, {"</s>", 0, 1}, {"<|begin_of_text|>", 1, 0}, {"<|end_of_text|>", 0, 1}};
    if (id > t->max_id) {
        t->max_id = id;
        snprintf(t->max_tok, sizeof t->max_tok, "%s", text);
    }
    for (size_t i = 0; i < sizeof k_special / sizeof k_special[0]; i++)
        if (strcmp(text, k_special[i].text) == 0) {
            if (k_special[i].bos && t->bos < 0) t->bos = (int)id, t->bos_text = k_special[i].text;
            if (k_special[i].eos && t->eos < 0) t->eos = (int)id, t->eos_text = k_special[i].text;
        }
}

static cai_status scan_vocab(const char *path, json_t *vocab, tok_info *t) {
    if (!json_is_object(vocab))
        return CAI_ERROR(CAI_ERR_FORMAT, "tokenizer '%s': the vocabulary is not an object", path);
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return CAI_ERROR(CAI_ERR_FORMAT, "tokenizer '%s': token \"%s\" has no non-negative integer id", path, k);
        note_token(t, k, (long long)json_integer_value(v));
    }
    return CAI_OK;
}

/* Largest id and special tokens, from tokenizer.json (vocabulary and
 * added_tokens) or else vocab.json. */
static cai_status scan_tokenizer(const char *tok_dir, tok_info *t) {
    char path[CAI_HF_PATH_MAX];
    CAI_CALL(cai_hf_path(path, sizeof path, tok_dir, "tokenizer.json"));
    int have_tj = cai_hf_file_exists(path);
    if (!have_tj) CAI_CALL(cai_hf_path(path, sizeof path, tok_dir, "vocab.json"));
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return CAI_ERROR(CAI_ERR_FORMAT, "tokenizer '%s': invalid JSON at line %d: %s", path, jerr.line, jerr.text);
    cai_status st = CAI_OK;
    if (have_tj) {
        json_t *model = json_object_get(root, "model");
        st = scan_vocab(path, model ? json_object_get(model, "vocab") : NULL, t);
        json_t *added = json_object_get(root, "added_tokens");
        for (size_t i = 0; st == CAI_OK && json_is_array(added) && i < json_array_size(added); i++) {
            json_t *a = json_array_get(added, i);
            json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
            if (!json_is_integer(id) || !json_is_string(content))
                st = CAI_ERROR(CAI_ERR_FORMAT, "tokenizer '%s': added_tokens[%zu] lacks an integer id or a content",
                               path, i);
            else note_token(t, json_string_value(content), (long long)json_integer_value(id));
        }
    } else {
        st = scan_vocab(path, root, t);
    }
    json_decref(root);
    return st;
}

static cai_status copy_file(const char *from, const char *to) {
    char *data = NULL;
    size_t len = 0;
    CAI_CALL(cai_hf_read_file(from, &data, &len));
    cai_status st = cai_hf_write_file(to, data, len);
    free(data);
    CAI_CALL(st);
    return CAI_OK;
}

static cai_status write_tokenizer_config(const char *path, const cai_model_config *cfg, const tok_info *t,
                                         int have_vocab_merges) {
    json_t *o = json_object();
    /* GPT2Tokenizer(Fast) reads vocab.json + merges.txt or tokenizer.json;
     * without the pair, the generic fast class reads tokenizer.json. */
    int bad = !o || json_object_set_new(o, "tokenizer_class",
                                        json_string(have_vocab_merges ? "GPT2Tokenizer" : "PreTrainedTokenizerFast"));
    bad |= json_object_set_new(o, "model_max_length", json_integer(cfg->max_seq_len));
    if (t->bos >= 0) bad |= json_object_set_new(o, "bos_token", json_string(t->bos_text));
    if (t->eos >= 0) bad |= json_object_set_new(o, "eos_token", json_string(t->eos_text));
    if (t->eos >= 0 && strcmp(t->eos_text, "<|endoftext|>") == 0)
        bad |= json_object_set_new(o, "unk_token", json_string(t->eos_text)); /* GPT-2's convention */
    bad |= json_object_set_new(o, "add_prefix_space", json_false());
    bad |= json_object_set_new(o, "clean_up_tokenization_spaces", json_false());
    char *text = bad ? NULL : json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text) return CAI_ERROR(CAI_ERR_NOMEM, "cannot build tokenizer_config.json");
    cai_status st = cai_hf_write_file(path, text, strlen(text));
    free(text);
    CAI_CALL(st);
    return CAI_OK;
}

/* Checked before any file is written, so a tokenizer that does not fit the
 * model leaves the directory alone. */
static cai_status check_tokenizer(const char *tok_dir, const cai_model_config *cfg, tok_info *t) {
    char path[CAI_HF_PATH_MAX];
    for (size_t i = 0; i < N_TOK_FILES; i++) {
        CAI_CALL(cai_hf_path(path, sizeof path, tok_dir, k_tok_files[i]));
        t->have[i] = cai_hf_file_exists(path);
    }
    if (!t->have[0] && !(t->have[1] && t->have[2]))
        return CAI_ERROR(CAI_ERR_IO,
                         "tokenizer directory '%s' holds neither tokenizer.json nor vocab.json + "
                         "merges.txt",
                         tok_dir);
    CAI_CALL(scan_tokenizer(tok_dir, t));
    if (t->max_id >= cfg->vocab_size)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "tokenizer '%s' has token id %lld (\"%s\") but the model's vocab_size is %d: "
                         "its logits could never produce that token",
                         tok_dir, t->max_id, t->max_tok, cfg->vocab_size);
    return CAI_OK;
}

static cai_status copy_tokenizer(const char *dir, const char *tok_dir, const cai_model_config *cfg, const tok_info *t,
                                 int *n_files) {
    char from[CAI_HF_PATH_MAX], to[CAI_HF_PATH_MAX];
    char real_from[CAI_HF_PATH_MAX], real_to[CAI_HF_PATH_MAX];
    const int same_dir = realpath(tok_dir, real_from) && realpath(dir, real_to) && strcmp(real_from, real_to) == 0;
    for (size_t i = 0; i < N_TOK_FILES; i++) {
        if (!t->have[i]) continue;
        (*n_files)++;
        if (same_dir) continue;
        CAI_CALL(cai_hf_path(from, sizeof from, tok_dir, k_tok_files[i]));
        CAI_CALL(cai_hf_path(to, sizeof to, dir, k_tok_files[i]));
        CAI_CALL(copy_file(from, to));
    }
    if (!t->have[3]) {
        CAI_CALL(cai_hf_path(to, sizeof to, dir, "tokenizer_config.json"));
        CAI_CALL(write_tokenizer_config(to, cfg, t, t->have[1] && t->have[2]));
        (*n_files)++;
    }
    return CAI_OK;
}

/* ------------------------------------------------------------ export */

cai_status cai_hf_export(const char *dir, const cai_model_config *cfg, cai_hf_source_fn source, void *ctx,
                         const cai_hf_export_options *opt_in, cai_hf_export_stats *stats) {
    CAI_CHECK_ARG(dir && *dir && cfg && source, "cai_hf_export: NULL argument");
    const double t0 = cai_time_now();
    cai_hf_export_options opt = opt_in ? *opt_in : cai_hf_export_options_default();
    if (opt.dtype != CAI_DTYPE_F32 && opt.dtype != CAI_DTYPE_BF16 && opt.dtype != CAI_DTYPE_F16)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "HF export to '%s': dtype %s (F32, BF16 or F16)", dir,
                         cai_dtype_name(opt.dtype));
    const uint64_t max_shard = opt.max_shard_bytes ? opt.max_shard_bytes : CAI_HF_DEFAULT_SHARD_BYTES;
    const size_t esz = cai_dtype_size(opt.dtype);

    cai_hf_map_t *map = NULL;
    CAI_CALL(cai_hf_map_create(&map, cfg));
    const cai_model_config *rc = cai_hf_map_config(map);
    const cai_registry_t *reg = cai_hf_map_registry(map);
    const int n = cai_hf_map_count(map);
    exporter x = {map, source, ctx, opt.dtype, NULL, NULL, NULL, NULL};
    int *shard_of = NULL, n_shards = 1;
    cai_status st = CAI_OK;
    tok_info tok = {-1, -1, NULL, NULL, -1, "", {0}};
    const int with_tok = opt.tokenizer_dir && *opt.tokenizer_dir;
    int tok_files = 0;
    char *config = NULL;

    /* Plan the shards in table order: a new file when the next tensor would
     * overflow a non-empty one (transformers' rule), so a single tensor
     * larger than the limit gets a file of its own. */
    CAI_CALL_GOTO(cai_calloc((void **)&shard_of, (size_t)n + 1, sizeof *shard_of, "HF shard plan"), st, done);
    uint64_t total = 0, max_param = 0, max_entry = 0;
    for (int i = 0; i < n; i++) {
        const cai_hf_entry *e = cai_hf_map_entry(map, i);
        total += entry_numel(e) * esz;
        if (entry_numel(e) > max_entry) max_entry = entry_numel(e);
    }
    for (int i = 0; i < cai_registry_count(reg); i++)
        if (cai_registry_param(reg, i)->numel > max_param) max_param = cai_registry_param(reg, i)->numel;
    if (total > max_shard) {
        uint64_t fill = 0;
        int k = 0;
        for (int i = 0; i < n; i++) {
            uint64_t b = entry_numel(cai_hf_map_entry(map, i)) * esz;
            if (fill > 0 && fill + b > max_shard) {
                k++;
                fill = 0;
            }
            fill += b;
            shard_of[i] = k;
        }
        n_shards = k + 1;
    }

    if (with_tok) CAI_CALL_GOTO(check_tokenizer(opt.tokenizer_dir, rc, &tok), st, done);
    CAI_CALL_GOTO(cai_hf_mkdirs(dir), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&x.param_buf, (size_t)max_param * sizeof(float) + 64, "HF export tensor"), st,
                  done);
    CAI_CALL_GOTO(cai_malloc((void **)&x.hf_buf, (size_t)max_entry * sizeof(float) + 64, "HF export tensor"), st, done);
    if (opt.dtype != CAI_DTYPE_F32)
        CAI_CALL_GOTO(cai_malloc(&x.conv_buf, (size_t)max_entry * esz + 64, "HF export conversion"), st, done);

    char path[CAI_HF_PATH_MAX], name[64];
    for (int k = 0, first = 0; k < n_shards; k++) {
        int count = 0;
        while (first + count < n && shard_of[first + count] == k) count++;
        if (n_shards == 1) snprintf(name, sizeof name, "%s", CAI_HF_SINGLE_NAME);
        else shard_name(name, sizeof name, k, n_shards);
        CAI_CALL_GOTO(cai_hf_path(path, sizeof path, dir, name), st, done);
        CAI_CALL_GOTO(write_shard(&x, path, first, count), st, done);
        first += count;
    }
    if (n_shards > 1) CAI_CALL_GOTO(write_index(dir, map, shard_of, n_shards, total), st, done);
    CAI_CALL_GOTO(remove_stale(dir, n_shards), st, done);
    if (with_tok) CAI_CALL_GOTO(copy_tokenizer(dir, opt.tokenizer_dir, rc, &tok, &tok_files), st, done);
    /* config.json last: a directory is a model only once every file it
     * refers to is in place. */
    CAI_CALL_GOTO(cai_hf_config_json(rc, opt.dtype, tok.bos, tok.eos, &config), st, done);
    CAI_CALL_GOTO(cai_hf_path(path, sizeof path, dir, "config.json"), st, done);
    CAI_CALL_GOTO(cai_hf_write_file(path, config, strlen(config)), st, done);
    if (stats) {
        stats->n_files = n_shards;
        stats->n_tensors = n;
        stats->total_bytes = total;
        stats->tokenizer_files = tok_files;
        stats->seconds = cai_time_now() - t0;
    }
done:
    free(config);
    cai_free(x.param_buf);
    cai_free(x.hf_buf);
    cai_free(x.conv_buf);
    cai_free(shard_of);
    cai_hf_map_free(map);
    return st;
}

/* ------------------------------------------------------------ sources */

static cai_status model_source(void *ctx, const cai_param_info *p, float *dst) {
    cai_model_t *m = ctx;
    cai_tensor master;
    CAI_CALL(cai_model_param(m, p->name, &master, NULL));
    if ((uint64_t)cai_tensor_numel(&master) != p->numel || master.dtype != CAI_DTYPE_F32)
        return CAI_ERROR(CAI_ERR_INTERNAL, "HF export: the model's '%s' has %lld %s elements, the config gives %llu",
                         p->name, (long long)cai_tensor_numel(&master), cai_dtype_name(master.dtype),
                         (unsigned long long)p->numel);
    CAI_CALL(cai_device_copy(cai_model_device(m), dst, master.data, (size_t)p->numel * sizeof *dst, CAI_COPY_D2H));
    return CAI_OK;
}

cai_status cai_hf_export_model(const char *dir, cai_model_t *m, const cai_hf_export_options *opt,
                               cai_hf_export_stats *stats) {
    CAI_CHECK_ARG(dir && m, "cai_hf_export_model: NULL argument");
    const cai_registry_t *reg = cai_model_registry(m);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        if (p->tie_primary != i) continue; /* never exported */
        cai_param_shard sh;
        CAI_CALL(cai_registry_shard(reg, i, cai_model_view(m), &sh));
        if (!sh.held || sh.local_numel != p->numel)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "HF export to '%s': this rank holds %s of parameter '%s' (pipeline "
                             "or tensor-parallel shard); export from a model holding every parameter whole, or from "
                             "a checkpoint (colossal-ckpt export)",
                             dir, sh.held ? "part" : "none", p->name);
    }
    CAI_CALL(cai_hf_export(dir, cai_model_config_of(m), model_source, m, opt, stats));
    return CAI_OK;
}

typedef struct {
    const cai_registry_t *reg;
    const float *flat;
    const size_t *offsets;
} flat_src;

static cai_status flat_source(void *ctx, const cai_param_info *p, float *dst) {
    const flat_src *f = ctx;
    const int i = cai_registry_find(f->reg, p->name);
    memcpy(dst, f->flat + f->offsets[i], (size_t)p->numel * sizeof *dst);
    return CAI_OK;
}

/* Every parameter of the mapping's registry is in `reg` with the same shape. */
static cai_status check_registry(const cai_registry_t *want, const cai_registry_t *reg, const cai_model_config *cfg) {
    for (int i = 0; i < cai_registry_count(want); i++) {
        const cai_param_info *w = cai_registry_param(want, i);
        const int j = cai_registry_find(reg, w->name);
        if (j < 0)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "HF export: parameter '%s' of the %s config (%d layers) is not in the "
                             "registry",
                             w->name, cai_model_family_name(cfg->family), cfg->n_layers);
        const cai_param_info *p = cai_registry_param(reg, j);
        if (p->ndim != w->ndim || memcmp(p->shape, w->shape, sizeof p->shape) != 0) {
            char a[96], b[96];
            cai_hf_shape_str(a, sizeof a, p->ndim, p->shape);
            cai_hf_shape_str(b, sizeof b, w->ndim, w->shape);
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "HF export: parameter '%s' is %s in the registry but the config "
                             "(vocab %d padded to a multiple of %d, d_model %d, %d/%d heads, ffn %d) gives %s",
                             w->name, a, cfg->vocab_size, cfg->vocab_multiple, cfg->d_model, cfg->n_heads,
                             cfg->n_kv_heads, cfg->ffn_hidden, b);
        }
    }
    return CAI_OK;
}

cai_status cai_hf_export_flat(const char *dir, const cai_model_config *cfg, const cai_registry_t *reg,
                              const float *flat, size_t flat_count, size_t align_elems,
                              const cai_hf_export_options *opt, cai_hf_export_stats *stats) {
    CAI_CHECK_ARG(dir && cfg && reg && flat, "cai_hf_export_flat: NULL argument");
    cai_hf_map_t *map = NULL;
    CAI_CALL(cai_hf_map_create(&map, cfg));
    size_t *offsets = NULL, total = 0;
    const cai_rank_view single = cai_rank_view_single();
    cai_status st = check_registry(cai_hf_map_registry(map), reg, cai_hf_map_config(map));
    if (st == CAI_OK)
        st = cai_calloc((void **)&offsets, (size_t)cai_registry_count(reg) + 1, sizeof *offsets, "flat offsets");
    if (st == CAI_OK) st = cai_registry_local_layout(reg, &single, align_elems, offsets, &total);
    if (st == CAI_OK && total > flat_count)
        st = CAI_ERROR(CAI_ERR_INVALID_ARG,
                       "HF export: the flat buffer has %zu floats, the registry's layout needs %zu", flat_count, total);
    if (st == CAI_OK) {
        flat_src f = {reg, flat, offsets};
        st = cai_hf_export(dir, cfg, flat_source, &f, opt, stats);
    }
    if (st != CAI_OK) cai_error_push(__FILE__, __LINE__, __func__, "cai_hf_export_flat");
    cai_free(offsets);
    cai_hf_map_free(map);
    return st;
}
