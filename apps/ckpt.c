/* colossal-ckpt: the checkpoint tool. The subcommand is argv[1]:
 *   inspect PATH   what a safetensors file, a Hugging Face directory or an
 *                  HDF5 checkpoint holds: tensors, shapes, dtypes, metadata
 *   verify PATH    check it completely (HF: every tensor the config needs,
 *                  nothing else, all finite; HDF5: every checksum)
 *   export         HDF5 checkpoint -> Hugging Face directory
 *   import         Hugging Face directory -> HDF5 checkpoint
 *   convert        either direction, or HF -> HF (another dtype or sharding)
 *   init           a freshly initialised model -> Hugging Face directory
 * Options after the subcommand go through the config module (--help per
 * subcommand, YAML files). Hugging Face files are read and written by rank
 * 0 (export reads the checkpoint there too); HDF5 inspect, verify and the
 * checkpoint write of import are collective over every rank. See
 * docs/huggingface.md. */
#include "cai_config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "app_common.h"
#include "colossal/base.h"
#include "colossal/ckpt.h"
#include "colossal/config.h"
#include "colossal/model.h"
#include "colossal/tensor.h"

/* ------------------------------------------------------------------ config */

static const char *const k_dtypes[] = {"f32", "bf16", "f16", NULL};
static const cai_dtype k_dtype_values[] = {CAI_DTYPE_F32, CAI_DTYPE_BF16, CAI_DTYPE_F16};
enum { TO_AUTO = 0, TO_HF, TO_HDF5 };
static const char *const k_to[] = {"auto", "hf", "hdf5", NULL};
static const char *const k_families[] = {"gpt2", "llama", NULL};
enum { TIE_AUTO = 0, TIE_YES, TIE_NO };
static const char *const k_tie[] = {"auto", "true", "false", NULL};

typedef struct {
    char *path, *input, *output, *tokenizer;
    int64_t max_shard;
    int dtype, to, tensors;
    /* init */
    int family, tie;
    int64_t vocab_size, vocab_multiple, n_layers, d_model, n_heads, n_kv_heads, ffn_hidden, max_seq_len, seed;
    double rope_theta, norm_eps, init_std;
    cai_app_common common;
} ckpt_config;

#define F(key, type, field, def, doc, ...) \
    { key, type, offsetof(ckpt_config, field), def, doc, __VA_ARGS__ }
#define BIG 1e15
#define DTYPE_FIELD                                                                                            \
    F("dtype", CAI_CFG_ENUM, dtype, "f32", "dtype of the exported weights (rounded to nearest even from f32)", \
      CAI_CFG_NO_RANGE, k_dtypes, NULL)
#define SHARD_FIELD                                                                                          \
    F("max_shard_size", CAI_CFG_BYTES, max_shard, "5GB",                                                     \
      "shard the weights above this size, with model.safetensors.index.json (5GB = 5e9 bytes, 2GiB = 2^31, " \
      "plain numbers are bytes)",                                                                            \
      1, 9.2e18, NULL, NULL)
#define TOKENIZER_FIELD                                                                                \
    F("tokenizer", CAI_CFG_STRING, tokenizer, "",                                                      \
      "directory with tokenizer.json or vocab.json + merges.txt to ship with the model (empty: none)", \
      CAI_CFG_NO_RANGE, NULL, NULL)

static const cai_config_field k_inspect[] = {
    F("path", CAI_CFG_STRING, path, NULL,
      "a .safetensors file, a Hugging Face directory or an HDF5 checkpoint "
      "(file or directory with `latest`); also accepted as the first argument",
      CAI_CFG_NO_RANGE, NULL, NULL),
    F("tensors", CAI_CFG_BOOL, tensors, "true", "list every tensor", CAI_CFG_NO_RANGE, NULL, NULL),
    CAI_APP_COMMON_FIELDS(ckpt_config, common),
};

static const cai_config_field k_verify[] = {
    F("path", CAI_CFG_STRING, path, NULL, "what to verify (as for inspect); also accepted as the first argument",
      CAI_CFG_NO_RANGE, NULL, NULL),
    CAI_APP_COMMON_FIELDS(ckpt_config, common),
};

static const cai_config_field k_export[] = {
    F("input", CAI_CFG_STRING, input, NULL, "HDF5 checkpoint: a file, or a directory whose `latest` names one",
      CAI_CFG_NO_RANGE, NULL, "checkpoint"),
    F("output", CAI_CFG_STRING, output, NULL, "Hugging Face directory to write", CAI_CFG_NO_RANGE, NULL, NULL),
    DTYPE_FIELD,
    SHARD_FIELD,
    TOKENIZER_FIELD,
    CAI_APP_COMMON_FIELDS(ckpt_config, common),
};

static const cai_config_field k_import[] = {
    F("input", CAI_CFG_STRING, input, NULL, "Hugging Face directory (config.json + safetensors)", CAI_CFG_NO_RANGE,
      NULL, NULL),
    F("output", CAI_CFG_STRING, output, NULL, "HDF5 checkpoint file to write", CAI_CFG_NO_RANGE, NULL, NULL),
    CAI_APP_COMMON_FIELDS(ckpt_config, common),
};

static const cai_config_field k_convert[] = {
    F("input", CAI_CFG_STRING, input, NULL, "a Hugging Face directory or an HDF5 checkpoint", CAI_CFG_NO_RANGE, NULL,
      NULL),
    F("output", CAI_CFG_STRING, output, NULL, "where to write", CAI_CFG_NO_RANGE, NULL, NULL),
    F("to", CAI_CFG_ENUM, to, "auto", "output format; auto: the other one than the input's", CAI_CFG_NO_RANGE, k_to,
      NULL),
    DTYPE_FIELD,
    SHARD_FIELD,
    TOKENIZER_FIELD,
    CAI_APP_COMMON_FIELDS(ckpt_config, common),
};

static const cai_config_field k_init[] = {
    F("output", CAI_CFG_STRING, output, NULL, "Hugging Face directory to write", CAI_CFG_NO_RANGE, NULL, NULL),
    F("model.family", CAI_CFG_ENUM, family, "gpt2", "gpt2 or llama", CAI_CFG_NO_RANGE, k_families, NULL),
    F("model.vocab_size", CAI_CFG_INT64, vocab_size, "50257", "real vocabulary", 1, 1 << 24, NULL, NULL),
    F("model.vocab_multiple", CAI_CFG_INT64, vocab_multiple, "128", "embedding rows padded to this (not exported)", 1,
      1 << 20, NULL, NULL),
    F("model.n_layers", CAI_CFG_INT64, n_layers, "12", "transformer blocks", 1, 1 << 16, NULL, NULL),
    F("model.d_model", CAI_CFG_INT64, d_model, "768", "hidden size", 1, 1 << 20, NULL, NULL),
    F("model.n_heads", CAI_CFG_INT64, n_heads, "12", "attention heads", 1, 1 << 16, NULL, NULL),
    F("model.n_kv_heads", CAI_CFG_INT64, n_kv_heads, "0", "key/value heads (0: n_heads)", 0, 1 << 16, NULL, NULL),
    F("model.ffn_hidden", CAI_CFG_INT64, ffn_hidden, "0", "MLP hidden size (0: the family's default)", 0, 1 << 24, NULL,
      NULL),
    F("model.max_seq_len", CAI_CFG_INT64, max_seq_len, "1024", "positions", 1, 1 << 24, NULL, NULL),
    F("model.rope_theta", CAI_CFG_DOUBLE, rope_theta, "10000", "Llama RoPE base", 1, 1e12, NULL, NULL),
    F("model.norm_eps", CAI_CFG_DOUBLE, norm_eps, "1e-5", "norm epsilon", 1e-12, 1, NULL, NULL),
    F("model.init_std", CAI_CFG_DOUBLE, init_std, "0.02", "init standard deviation", 1e-9, 10, NULL, NULL),
    F("model.tie_embeddings", CAI_CFG_ENUM, tie, "auto", "LM head tied to the embedding (auto: GPT-2 yes, Llama no)",
      CAI_CFG_NO_RANGE, k_tie, NULL),
    F("model.seed", CAI_CFG_INT64, seed, "1234", "initialisation seed", 0, BIG, NULL, NULL),
    DTYPE_FIELD,
    SHARD_FIELD,
    TOKENIZER_FIELD,
    CAI_APP_COMMON_FIELDS(ckpt_config, common),
};
#undef F
#undef BIG

/* ------------------------------------------------------------------ helpers */

static cai_status export_options(const ckpt_config *c, cai_hf_export_options *o) {
    *o = cai_hf_export_options_default();
    o->dtype = k_dtype_values[c->dtype];
    o->max_shard_bytes = (uint64_t)c->max_shard;
    o->tokenizer_dir = c->tokenizer && *c->tokenizer ? c->tokenizer : NULL;
    return CAI_OK;
}

static cai_status need(const char *value, const char *key) {
    if (!value || !*value) return CAI_ERROR(CAI_ERR_CONFIG, "%s: not given (--%s ...)", key, key);
    return CAI_OK;
}

typedef enum { KIND_MISSING = 0, KIND_SAFETENSORS, KIND_HF_DIR, KIND_HDF5, KIND_HDF5_DIR, KIND_OTHER } path_kind;

static int has_file(const char *dir, const char *name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* By content first: HDF5's signature, or a safetensors header (a
 * little-endian length followed by '{'); then by name, so that a damaged
 * file meant to be one of them gets that format's reader and its precise
 * message ("header length past the end of the file", "not an HDF5 file"). */
static path_kind classify(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) return KIND_MISSING;
    if (S_ISDIR(sb.st_mode)) {
        if (has_file(path, "config.json")) return KIND_HF_DIR;
        if (has_file(path, "latest")) return KIND_HDF5_DIR;
        return KIND_OTHER;
    }
    unsigned char head[9] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    if (n >= 8 && !memcmp(head, "\x89HDF\r\n\x1a\n", 8)) return KIND_HDF5;
    if (n == 9 && head[8] == '{') return KIND_SAFETENSORS;
    if (ends_with(path, ".safetensors")) return KIND_SAFETENSORS;
    if (ends_with(path, ".h5") || ends_with(path, ".hdf5")) return KIND_HDF5;
    return KIND_OTHER;
}

static const char *kind_name(path_kind k) {
    switch (k) {
    case KIND_SAFETENSORS: return "a safetensors file";
    case KIND_HF_DIR: return "a Hugging Face directory";
    case KIND_HDF5: return "an HDF5 checkpoint";
    case KIND_HDF5_DIR: return "a checkpoint directory";
    case KIND_MISSING: return "not there (no such file or directory)";
    default: return "neither safetensors, a Hugging Face directory nor an HDF5 checkpoint";
    }
}

/* Why a path of KIND_OTHER is neither: which check of each format failed. */
static void other_detail(const char *path, char *buf, size_t cap) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(buf, cap, "%s", strerror(errno));
        return;
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(buf, cap, "a directory with neither config.json (Hugging Face) nor `latest` (checkpoints)");
        return;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(buf, cap, "not a regular file");
        return;
    }
    if (sb.st_size == 0) {
        snprintf(buf, cap, "the file is empty (0 bytes)");
        return;
    }
    unsigned char head[4096];
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    size_t zeros = 0;
    while (zeros < n && head[zeros] == 0) zeros++;
    if (zeros == n && n > 0) {
        snprintf(buf, cap, "its first %zu bytes are all zero (no HDF5 signature, no safetensors header)", n);
        return;
    }
    /* the safetensors reader names the check that failed */
    cai_safetensors_t *st = NULL;
    if (cai_safetensors_open(&st, path) == CAI_OK) {
        cai_safetensors_close(st);
        snprintf(buf, cap, "no HDF5 signature at byte 0");
        return;
    }
    snprintf(buf, cap, "no HDF5 signature at byte 0, and as safetensors: %s", cai_error_message());
    cai_error_clear();
}

/* The error for a path that is not what `verb` takes. */
static cai_status not_recognised(const char *verb, const char *path, path_kind k, cai_status code, const char *wanted) {
    if (k == KIND_MISSING) return CAI_ERROR(CAI_ERR_IO, "%s: '%s' is %s", verb, path, kind_name(k));
    char detail[1200] = "";
    if (k == KIND_OTHER) other_detail(path, detail, sizeof detail);
    return CAI_ERROR(code, "%s: '%s' is %s%s%s%s%s", verb, path, kind_name(k), *detail ? ": " : "", detail,
                     wanted ? ", not " : "", wanted ? wanted : "");
}

static void print_shape(char *buf, size_t cap, int ndim, const uint64_t *shape) {
    size_t u = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && u < cap; d++)
        u += (size_t)snprintf(buf + u, cap - u, "%s%llu", d ? "," : "", (unsigned long long)shape[d]);
    if (u < cap) snprintf(buf + u, cap - u, "]");
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* ------------------------------------------------------------------ safetensors / HF */

static cai_status inspect_safetensors(const char *path, int list) {
    cai_safetensors_t *st;
    CAI_CALL(cai_safetensors_open(&st, path));
    uint64_t bytes = 0;
    for (int i = 0; i < cai_safetensors_count(st); i++)
        bytes += cai_safetensors_entry(st, i)->end - cai_safetensors_entry(st, i)->begin;
    printf("%s: safetensors, %d tensors, %llu bytes of data\n", path, cai_safetensors_count(st),
           (unsigned long long)bytes);
    for (int i = 0; i < cai_safetensors_meta_count(st); i++) {
        const char *k, *v;
        cai_safetensors_meta_at(st, i, &k, &v);
        printf("  metadata %s = %s\n", k, v);
    }
    if (list) {
        printf("  %-48s %-8s %-20s %12s %12s\n", "tensor", "dtype", "shape", "offset", "bytes");
        for (int i = 0; i < cai_safetensors_count(st); i++) {
            const cai_st_entry *e = cai_safetensors_entry(st, i);
            char sh[96];
            print_shape(sh, sizeof sh, e->ndim, e->shape);
            printf("  %-48s %-8s %-20s %12llu %12llu\n", e->name, e->dtype_name, sh, (unsigned long long)e->begin,
                   (unsigned long long)(e->end - e->begin));
        }
    }
    cai_safetensors_close(st);
    return CAI_OK;
}

static void print_model_config(const cai_model_config *c) {
    printf("  colossal model: %s, vocabulary %d, %d layers, d_model %d, %d heads (%d kv), ffn %d, max_seq_len %d, ",
           cai_model_family_name(c->family), c->vocab_size, c->n_layers, c->d_model, c->n_heads, c->n_kv_heads,
           c->ffn_hidden, c->max_seq_len);
    if (c->family == CAI_MODEL_LLAMA) printf("rope_theta %g, ", (double)c->rope_theta);
    printf("norm_eps %g, %s head\n", (double)c->norm_eps, c->tie_embeddings ? "tied" : "untied");
}

static cai_status inspect_hf(const char *dir, int list) {
    cai_hf_t *h = NULL;
    cai_status st = cai_hf_open(&h, dir);
    if (st != CAI_OK) {
        /* Still show what is there: inspect is for looking, verify for verdicts. */
        printf("%s: not importable as a colossal model:\n  %s\n", dir, cai_error_message());
        cai_error_clear();
        char p[4200];
        const char *names[2] = {"model.safetensors", NULL};
        snprintf(p, sizeof p, "%s/%s", dir, names[0]);
        if (has_file(dir, names[0])) return inspect_safetensors(p, list);
        return CAI_OK;
    }
    const cai_model_config *c = cai_hf_config(h);
    uint64_t total = 0;
    const int sharded = cai_hf_sharded(h, &total);
    printf("%s: Hugging Face %s (config.json), weights in %d file%s", dir, cai_hf_architecture(c), cai_hf_file_count(h),
           cai_hf_file_count(h) == 1 ? "" : "s");
    if (sharded) printf(" (model.safetensors.index.json, total_size %llu bytes)", (unsigned long long)total);
    printf("\n");
    print_model_config(c);
    const cai_hf_map_t *map = cai_hf_map(h);
    uint64_t params = 0;
    for (int i = 0; i < cai_hf_map_count(map); i++) {
        const cai_hf_entry *e = cai_hf_map_entry(map, i);
        params += e->ndim == 1 ? e->hf_shape[0] : e->hf_shape[0] * e->hf_shape[1];
    }
    printf("  %d tensors, %.3f M parameters\n", cai_hf_map_count(map), (double)params / 1e6);
    if (list) {
        printf("  %-48s %-5s %-14s %-32s %s\n", "tensor", "dtype", "shape", "file", "colossal (transform)");
        for (int i = 0; i < cai_hf_map_count(map); i++) {
            const cai_hf_entry *e = cai_hf_map_entry(map, i);
            const cai_safetensors_t *f = NULL;
            const cai_st_entry *t = cai_hf_tensor(h, e, &f);
            char sh[96], how[96];
            print_shape(sh, sizeof sh, t->ndim, t->shape);
            if (e->transform == CAI_HF_QKV_SLICE || e->transform == CAI_HF_VOCAB_ROWS)
                snprintf(how, sizeof how, "%s %llu..%llu", cai_hf_transform_name(e->transform),
                         (unsigned long long)e->row_begin, (unsigned long long)(e->row_begin + e->rows));
            else snprintf(how, sizeof how, "%s", cai_hf_transform_name(e->transform));
            printf("  %-48s %-5s %-14s %-32s %s (%s)\n", t->name, t->dtype_name, sh, base_name(cai_safetensors_path(f)),
                   e->colossal, how);
        }
    }
    cai_hf_close(h);
    return CAI_OK;
}

typedef struct {
    uint64_t tensors, elements;
} weight_count;

/* The import refuses weights that are not finite (naming the tensor); this
 * counts what passed. */
static cai_status count_weights(void *ctx, const cai_param_info *p, const float *src) {
    (void)src;
    weight_count *wc = ctx;
    wc->tensors++;
    wc->elements += p->numel;
    return CAI_OK;
}

static cai_status verify_hf(const char *dir) {
    cai_hf_t *h;
    CAI_CALL(cai_hf_open(&h, dir));
    weight_count fc = {0, 0};
    const double t0 = cai_time_now();
    cai_status st = cai_hf_import(h, NULL, count_weights, &fc);
    if (st == CAI_OK)
        printf(
            "%s: ok: %s with every tensor config.json needs (%d in %d file%s), nothing else, %llu weights all "
            "finite (%.2f s)\n",
            dir, cai_hf_architecture(cai_hf_config(h)), cai_hf_map_count(cai_hf_map(h)), cai_hf_file_count(h),
            cai_hf_file_count(h) == 1 ? "" : "s", (unsigned long long)fc.elements, cai_time_now() - t0);
    cai_hf_close(h);
    CAI_CALL(st);
    return CAI_OK;
}

static cai_status verify_safetensors(const char *path) {
    cai_safetensors_t *st;
    CAI_CALL(cai_safetensors_open(&st, path)); /* validates the whole layout */
    uint64_t bad = 0, checked = 0;
    const char *first = NULL;
    for (int i = 0; i < cai_safetensors_count(st); i++) {
        const cai_st_entry *e = cai_safetensors_entry(st, i);
        if (e->dtype != CAI_DTYPE_F32 && e->dtype != CAI_DTYPE_BF16 && e->dtype != CAI_DTYPE_F16) continue;
        const unsigned char *p = e->data;
        for (uint64_t k = 0; k < e->numel; k++) {
            float x;
            if (e->dtype == CAI_DTYPE_F32) {
                memcpy(&x, p + 4 * k, 4);
            } else {
                uint16_t b;
                memcpy(&b, p + 2 * k, 2);
                x = e->dtype == CAI_DTYPE_BF16 ? cai_bf16_to_f32(b) : cai_f16_to_f32(b);
            }
            if (!isfinite(x) && !bad++) first = e->name;
        }
        checked += e->numel;
    }
    cai_status rc = CAI_OK;
    if (bad)
        rc = CAI_ERROR(CAI_ERR_FORMAT, "safetensors file '%s': %llu values are not finite, the first in '%s'", path,
                       (unsigned long long)bad, first);
    else
        printf("%s: ok: valid safetensors, %d tensors, %llu floating-point values all finite\n", path,
               cai_safetensors_count(st), (unsigned long long)checked);
    cai_safetensors_close(st);
    return rc;
}

/* HF -> HF through the import and export paths: another dtype, shard size
 * or tokenizer; one tensor in memory at a time. */
static cai_status hf_source(void *ctx, const cai_param_info *p, float *dst) {
    return cai_hf_read_param((cai_hf_t *)ctx, p, dst);
}

static cai_status convert_hf_to_hf(const ckpt_config *c) {
    cai_hf_export_options o;
    CAI_CALL(export_options(c, &o));
    /* the tokenizer travels along unless another one is given */
    if (!o.tokenizer_dir && (has_file(c->input, "tokenizer.json") ||
                             (has_file(c->input, "vocab.json") && has_file(c->input, "merges.txt"))))
        o.tokenizer_dir = c->input;
    cai_hf_t *h;
    CAI_CALL(cai_hf_open(&h, c->input));
    cai_hf_export_stats s;
    cai_status st = cai_hf_export(c->output, cai_hf_config(h), hf_source, h, &o, &s);
    if (st == CAI_OK)
        printf("convert: %s -> %s: %d tensors, %.1f MB of %s in %d file%s, %d tokenizer file%s, %.2f s\n", c->input,
               c->output, s.n_tensors, (double)s.total_bytes / 1e6, k_dtypes[c->dtype], s.n_files,
               s.n_files == 1 ? "" : "s", s.tokenizer_files, s.tokenizer_files == 1 ? "" : "s", s.seconds);
    cai_hf_close(h);
    CAI_CALL(st);
    return CAI_OK;
}

/* ------------------------------------------------------------------ HDF5 checkpoints
 * Through the checkpoint layer's inspection API (cai_ckpt_open/read/verify)
 * and its flat-buffer writer: global tensors by name, so the layout the
 * checkpoint was saved under does not matter. */

/* A file, or a directory's `latest`; then opened collectively over comm. */
static cai_status ckpt_open(MPI_Comm comm, const char *path, cai_ckpt_file_t **f) {
    char file[4200];
    CAI_CALL(cai_ckpt_resolve(path, file, sizeof file));
    CAI_CALL(cai_ckpt_open(f, comm, file));
    return CAI_OK;
}

static void print_ckpt_meta(const cai_ckpt_meta *m) {
    printf("  format %d, written by colossal %s%s%s at unix time %lld on %d rank%s\n", m->format_version,
           m->colossal_version, *m->app ? " / " : "", m->app, (long long)m->created_unix, m->world_size,
           m->world_size == 1 ? "" : "s");
    char lay[128];
    cai_layout_str(&m->layout, lay, sizeof lay);
    printf("  step %lld, tokens %lld, samples %lld, layout %s, %s\n", (long long)m->step, (long long)m->tokens,
           (long long)m->consumed_samples, lay, m->has_optim ? "with optimizer state" : "weights only");
    if (m->has_model) print_model_config(&m->model);
}

/* Collective over MPI_COMM_WORLD; rank 0 prints. */
static cai_status inspect_hdf5(const cai_app *app, const char *path, int list) {
    cai_ckpt_file_t *f;
    CAI_CALL(ckpt_open(MPI_COMM_WORLD, path, &f));
    if (app->rank == 0) {
        uint64_t elems = 0;
        for (int i = 0; i < cai_ckpt_count(f); i++) elems += cai_ckpt_entry_at(f, i)->numel;
        printf("%s: colossal HDF5 checkpoint, %d tensors, %.3f M elements\n", cai_ckpt_path(f), cai_ckpt_count(f),
               (double)elems / 1e6);
        print_ckpt_meta(cai_ckpt_file_meta(f));
        if (list) {
            for (int i = 0; i < cai_ckpt_attr_count(f); i++) {
                const char *k, *v;
                cai_ckpt_attr_at(f, i, &k, &v);
                if (strchr(v, '\n')) continue; /* the embedded config text: shown by its size only */
                printf("  attribute %s = %s\n", k, v);
            }
            printf("  %-56s %-6s %-20s %s\n", "tensor", "dtype", "shape", "checksum");
            for (int i = 0; i < cai_ckpt_count(f); i++) {
                const cai_ckpt_entry *e = cai_ckpt_entry_at(f, i);
                char sh[96];
                print_shape(sh, sizeof sh, e->ndim, e->shape);
                if (e->has_checksum)
                    printf("  %-56s %-6s %-20s %016llx\n", e->name, e->dtype_desc, sh, (unsigned long long)e->checksum);
                else printf("  %-56s %-6s %-20s none\n", e->name, e->dtype_desc, sh);
            }
        }
    }
    cai_ckpt_close(f);
    return CAI_OK;
}

/* Collective over MPI_COMM_WORLD: the checksums are recomputed by all ranks. */
static cai_status verify_hdf5(const cai_app *app, const char *path) {
    cai_ckpt_file_t *f;
    CAI_CALL(ckpt_open(MPI_COMM_WORLD, path, &f));
    const double t0 = cai_time_now();
    int bad = 0;
    cai_status st = cai_ckpt_verify(f, NULL, &bad);
    if (st == CAI_OK && app->rank == 0)
        printf("%s: ok: %d tensors, every checksum matches (%.2f s on %d rank%s)\n", cai_ckpt_path(f),
               cai_ckpt_count(f), cai_time_now() - t0, app->size, app->size == 1 ? "" : "s");
    cai_ckpt_close(f);
    CAI_CALL(st);
    return CAI_OK;
}

/* The fp32 masters when the run kept low-precision weights, else the
 * weights themselves (an f32 run stores only "model"). */
static cai_status ckpt_source(void *ctx, const cai_param_info *p, float *dst) {
    cai_ckpt_file_t *f = ctx;
    char name[CAI_CKPT_NAME_MAX];
    snprintf(name, sizeof name, "master/%s", p->name);
    const cai_ckpt_entry *e = cai_ckpt_find(f, name);
    if (!e) {
        snprintf(name, sizeof name, "model/%s", p->name);
        e = cai_ckpt_find(f, name);
    }
    if (!e)
        return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' has no tensor 'master/%s' or 'model/%s'", cai_ckpt_path(f),
                         p->name, p->name);
    if (e->numel != p->numel) {
        char a[96], b[96];
        print_shape(a, sizeof a, e->ndim, e->shape);
        print_shape(b, sizeof b, p->ndim, p->shape);
        return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': tensor '%s' is %s but its model config gives %s",
                         cai_ckpt_path(f), name, a, b);
    }
    CAI_CALL(cai_ckpt_read(f, name, CAI_DTYPE_F32, dst));
    return CAI_OK;
}

/* Rank 0 reads (its own MPI_COMM_SELF handle) and writes; the others wait. */
static cai_status export_hdf5(const cai_app *app, const ckpt_config *c) {
    if (app->rank != 0) return CAI_OK;
    cai_hf_export_options o;
    CAI_CALL(export_options(c, &o));
    cai_ckpt_file_t *f;
    CAI_CALL(ckpt_open(MPI_COMM_SELF, c->input, &f));
    const cai_ckpt_meta *m = cai_ckpt_file_meta(f);
    cai_status st = CAI_OK;
    cai_hf_export_stats s;
    if (!m->has_model)
        st = CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' records no model config; nothing says what to export",
                       cai_ckpt_path(f));
    if (st == CAI_OK) st = cai_hf_export(c->output, &m->model, ckpt_source, f, &o, &s);
    if (st == CAI_OK)
        printf(
            "export: %s (step %lld) -> %s: %s, %d tensors, %.1f MB of %s in %d file%s, %d tokenizer file%s, "
            "%.2f s\n",
            cai_ckpt_path(f), (long long)m->step, c->output, cai_hf_architecture(&m->model), s.n_tensors,
            (double)s.total_bytes / 1e6, k_dtypes[c->dtype], s.n_files, s.n_files == 1 ? "" : "s", s.tokenizer_files,
            s.tokenizer_files == 1 ? "" : "s", s.seconds);
    cai_ckpt_close(f);
    CAI_CALL(st);
    return CAI_OK;
}

/* Collective over MPI_COMM_WORLD: every rank reads the HF directory into
 * the single-rank flat layout (read-only mmaps), then all write the
 * checkpoint together, each a slice (data-parallel replicas). A weights-only
 * F32 checkpoint: "model/<name>", loadable by cai_ckpt_load into a model of
 * any layout and param_dtype. */
static cai_status import_hdf5(const cai_app *app, const ckpt_config *c) {
    cai_hf_t *h = NULL;
    cai_mesh_t *mesh = NULL;
    float *flat = NULL;
    enum { ALIGN = 16 };
    const double t0 = cai_time_now();
    cai_status st = cai_hf_open(&h, c->input);
    const cai_registry_t *reg = st == CAI_OK ? cai_hf_map_registry(cai_hf_map(h)) : NULL;
    const cai_rank_view single = cai_rank_view_single();
    size_t total = 0;
    if (st == CAI_OK) st = cai_registry_local_layout(reg, &single, ALIGN, NULL, &total);
    if (st == CAI_OK) st = cai_malloc((void **)&flat, total * sizeof *flat, "imported weights");
    if (st == CAI_OK) st = cai_hf_import_flat(h, reg, flat, total, ALIGN);
    /* The checkpoint write is collective: stop together if any rank failed. */
    int ok = st == CAI_OK, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (st == CAI_OK && !all_ok) st = CAI_ERROR(CAI_ERR_IO, "import: another rank could not read '%s'", c->input);
    if (all_ok) {
        cai_mesh_config mc;
        cai_mesh_config_init(&mc);
        mc.layout.dp = app->size;
        st = cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc);
    }
    if (all_ok && st == CAI_OK) {
        cai_ckpt_meta meta = cai_ckpt_meta_init();
        meta.model = *cai_hf_config(h);
        meta.has_model = 1;
        meta.layout = *cai_mesh_layout(mesh);
        meta.world_size = app->size;
        snprintf(meta.app, sizeof meta.app, "colossal-ckpt import");
        const cai_ckpt_layout L = {reg, single, ALIGN, CAI_AXIS_DP};
        const cai_ckpt_buffer b = {
            .group = "model", .data = flat, .dtype = CAI_DTYPE_F32, .file_dtype = CAI_DTYPE_F32, .replicated = 1};
        cai_ckpt_stats s;
        st = cai_ckpt_save_buffers(mesh, c->output, &L, &b, 1, &meta, &s);
        if (st == CAI_OK && app->rank == 0)
            printf("import: %s -> %s: %s, %d tensors, %.1f MB, %.2f s (write %.2f s on %d rank%s)\n", c->input,
                   c->output, cai_hf_architecture(&meta.model), s.n_datasets, (double)s.bytes / 1e6,
                   cai_time_now() - t0, s.seconds, app->size, app->size == 1 ? "" : "s");
    }
    if (mesh) cai_mesh_free(mesh);
    cai_free(flat);
    cai_hf_close(h);
    CAI_CALL(st);
    return CAI_OK;
}

/* ------------------------------------------------------------------ subcommands */

static cai_status run_inspect(const cai_app *app, const ckpt_config *c) {
    CAI_CALL(need(c->path, "path"));
    const path_kind k = classify(c->path);
    if (k == KIND_HDF5 || k == KIND_HDF5_DIR) return inspect_hdf5(app, c->path, c->tensors);
    if (app->rank != 0) return CAI_OK;
    switch (k) {
    case KIND_SAFETENSORS: return inspect_safetensors(c->path, c->tensors);
    case KIND_HF_DIR: return inspect_hf(c->path, c->tensors);
    default: return not_recognised("inspect", c->path, k, CAI_ERR_FORMAT, NULL);
    }
}

static cai_status run_verify(const cai_app *app, const ckpt_config *c) {
    CAI_CALL(need(c->path, "path"));
    const path_kind k = classify(c->path);
    if (k == KIND_HDF5 || k == KIND_HDF5_DIR) return verify_hdf5(app, c->path);
    if (app->rank != 0) return CAI_OK;
    switch (k) {
    case KIND_SAFETENSORS: return verify_safetensors(c->path);
    case KIND_HF_DIR: return verify_hf(c->path);
    default: return not_recognised("verify", c->path, k, CAI_ERR_FORMAT, NULL);
    }
}

static cai_status run_export(const cai_app *app, const ckpt_config *c) {
    CAI_CALL(need(c->input, "input"));
    CAI_CALL(need(c->output, "output"));
    const path_kind k = classify(c->input);
    if (k != KIND_HDF5 && k != KIND_HDF5_DIR)
        return not_recognised("export: input", c->input, k, CAI_ERR_CONFIG, "an HDF5 checkpoint");
    return export_hdf5(app, c);
}

static cai_status run_import(const cai_app *app, const ckpt_config *c) {
    CAI_CALL(need(c->input, "input"));
    CAI_CALL(need(c->output, "output"));
    const path_kind k = classify(c->input);
    if (k != KIND_HF_DIR)
        return not_recognised("import: input", c->input, k, CAI_ERR_CONFIG, "a Hugging Face directory (config.json)");
    return import_hdf5(app, c);
}

static cai_status run_convert(const cai_app *app, const ckpt_config *c) {
    CAI_CALL(need(c->input, "input"));
    CAI_CALL(need(c->output, "output"));
    const path_kind k = classify(c->input);
    if (k != KIND_HF_DIR && k != KIND_HDF5 && k != KIND_HDF5_DIR)
        return not_recognised("convert: input", c->input, k, CAI_ERR_CONFIG, NULL);
    const int to = c->to != TO_AUTO ? c->to : k == KIND_HF_DIR ? TO_HDF5 : TO_HF;
    if (k == KIND_HF_DIR && to == TO_HF) return app->rank == 0 ? convert_hf_to_hf(c) : CAI_OK;
    if (k == KIND_HF_DIR) return run_import(app, c);
    if (to == TO_HF) return run_export(app, c);
    return CAI_ERROR(CAI_ERR_CONFIG, "convert: '%s' is already an HDF5 checkpoint; --to hf exports it", c->input);
}

typedef struct {
    const cai_registry_t *reg;
    uint64_t seed;
} init_ctx;

static cai_status init_source(void *ctx, const cai_param_info *p, float *dst) {
    const init_ctx *ic = ctx;
    const cai_rank_view single = cai_rank_view_single();
    CAI_CALL(cai_registry_init_local(ic->reg, cai_registry_find(ic->reg, p->name), &single, ic->seed, dst,
                                     (size_t)p->numel));
    return CAI_OK;
}

static cai_status run_init(const cai_app *app, const ckpt_config *c) {
    CAI_CALL(need(c->output, "output"));
    if (app->rank != 0) return CAI_OK;
    cai_model_config m = cai_model_config_default((cai_model_family)c->family);
    m.vocab_size = (int)c->vocab_size;
    m.vocab_multiple = (int)c->vocab_multiple;
    m.n_layers = (int)c->n_layers;
    m.d_model = (int)c->d_model;
    m.n_heads = (int)c->n_heads;
    m.n_kv_heads = (int)c->n_kv_heads;
    m.ffn_hidden = (int)c->ffn_hidden;
    m.max_seq_len = (int)c->max_seq_len;
    m.rope_theta = (float)c->rope_theta;
    m.norm_eps = (float)c->norm_eps;
    m.init_std = (float)c->init_std;
    m.seed = (uint64_t)c->seed;
    if (c->tie != TIE_AUTO) m.tie_embeddings = c->tie == TIE_YES;
    cai_model_config r;
    CAI_CALL(cai_model_config_resolve(&m, &r));
    cai_hf_export_options o;
    CAI_CALL(export_options(c, &o));
    /* The registry's layout-invariant init, one global tensor at a time:
     * no model (and no activations) is ever allocated. */
    cai_registry_t *reg = NULL;
    cai_registry_options ro = {r.n_layers};
    CAI_CALL(cai_registry_init(&reg, &ro));
    cai_status st = cai_model_register_params(reg, &r);
    cai_hf_export_stats s;
    init_ctx ic = {reg, r.seed};
    if (st == CAI_OK) st = cai_hf_export(c->output, &r, init_source, &ic, &o, &s);
    if (st == CAI_OK)
        printf("init: %s (seed %llu) -> %s: %d tensors, %.1f MB of %s in %d file%s, %.2f s\n", cai_hf_architecture(&r),
               (unsigned long long)r.seed, c->output, s.n_tensors, (double)s.total_bytes / 1e6, k_dtypes[c->dtype],
               s.n_files, s.n_files == 1 ? "" : "s", s.seconds);
    cai_registry_free(reg);
    CAI_CALL(st);
    return CAI_OK;
}

typedef struct {
    const char *name;
    cai_config_schema schema;
    cai_status (*run)(const cai_app *app, const ckpt_config *cfg);
    int positional_path; /* argv[2] may be the path */
} subcommand;

#define SUB(name, summary, fields, run, pos) \
    { name, {"colossal-ckpt " name, summary, fields, CAI_CFG_NFIELDS(fields)}, run, pos }
static const subcommand k_subcommands[] = {
    SUB("inspect", "list what a safetensors file, Hugging Face directory or HDF5 checkpoint holds", k_inspect,
        run_inspect, 1),
    SUB("verify", "check a Hugging Face directory, safetensors file or HDF5 checkpoint completely", k_verify,
        run_verify, 1),
    SUB("export", "HDF5 checkpoint -> Hugging Face directory (config.json, safetensors, tokenizer)", k_export,
        run_export, 0),
    SUB("import", "Hugging Face directory -> HDF5 checkpoint", k_import, run_import, 0),
    SUB("convert", "between a Hugging Face directory and an HDF5 checkpoint, or HF -> HF in another dtype/sharding",
        k_convert, run_convert, 0),
    SUB("init", "write a freshly initialised GPT-2 or Llama as a Hugging Face directory", k_init, run_init, 0),
};
#undef SUB
#define N_SUB (sizeof k_subcommands / sizeof k_subcommands[0])

int main(int argc, char **argv) {
    const subcommand *sub =
        &k_subcommands[cai_app_subcommand(argc, argv, "colossal-ckpt", "[PATH] [--key value ...]", k_subcommands, N_SUB,
                                          sizeof *k_subcommands, offsetof(subcommand, name),
                                          offsetof(subcommand, schema.summary))];
    /* The subcommand becomes the program name; `inspect PATH` becomes
     * `--path PATH` (the config module takes no positional arguments). */
    static char **sargv; /* static: still reachable if a failure exits from inside the run */
    sargv = calloc((size_t)argc + 2, sizeof *sargv);
    if (!sargv) return 1;
    int sargc = 0;
    sargv[sargc++] = argv[1];
    int k = 2;
    static char path_flag[] = "--path";
    if (sub->positional_path && argc > 2 && argv[2][0] != '-') {
        sargv[sargc++] = path_flag;
        sargv[sargc++] = argv[k++];
    }
    while (k < argc) sargv[sargc++] = argv[k++];
    char **pargv = sargv;
    ckpt_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cai_app app;
    cai_app_init(&app, &sargc, &pargv, &sub->schema, &cfg, offsetof(ckpt_config, common));
    cai_app_check_all(sub->run(&app, &cfg), 1);
    free(sargv);
    return cai_app_finalize(&sub->schema, &cfg);
}
