/* config.json <-> cai_model_config, and the small file helpers the HF
 * export and import share. Keys are those transformers' GPT2Config and
 * LlamaConfig read; optional keys take transformers' own defaults, so a
 * directory means the same model here as there. */
#include "cai_config.h"
#include "colossal/ckpt.h"
#include "colossal/moe.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_internal.h"

/* ------------------------------------------------------------ files */

cai_status cai_hf_path(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "path '%s/%s' is longer than %zu bytes", dir, name, cap - 1);
    return CAI_OK;
}

int cai_hf_file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

cai_status cai_hf_mkdirs(const char *dir) {
    char p[CAI_HF_PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return CAI_ERROR(CAI_ERR_INVALID_ARG, "directory name '%s' is empty or too long", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return CAI_ERROR(CAI_ERR_IO, "cannot create directory '%s': %s", p, strerror(errno));
        p[i] = c;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return CAI_ERROR(CAI_ERR_IO, "'%s' exists but is not a directory", dir);
    return CAI_OK;
}

cai_status cai_hf_write_file(const char *path, const void *data, size_t len) {
    char tmp[CAI_HF_PATH_MAX + 32];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) return CAI_ERROR(CAI_ERR_INVALID_ARG, "path '%s' is too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return CAI_ERROR(CAI_ERR_IO, "cannot create '%s' (for '%s'): %s", tmp, path, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return CAI_ERROR(CAI_ERR_IO, "writing '%s' failed: %s", tmp, w < 0 ? strerror(e) : "no progress");
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return CAI_ERROR(CAI_ERR_IO, "flushing '%s' failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return CAI_ERROR(CAI_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(e));
    }
    return CAI_OK;
}

cai_status cai_hf_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return CAI_ERROR(CAI_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    cai_status st = CAI_OK;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? 2 * cap : 65536 + 1;
            char *p = realloc(buf, cap);
            if (!p) {
                st = CAI_ERROR(CAI_ERR_NOMEM, "reading '%s': %zu bytes", path, cap);
                break;
            }
            buf = p;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) st = CAI_ERROR(CAI_ERR_IO, "reading '%s' failed", path);
            break;
        }
    }
    fclose(f);
    if (st != CAI_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return CAI_OK;
}

double cai_hf_float_json(float f) {
    char buf[48];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) return strtod(buf, NULL);
    }
    return (double)f;
}

/* ------------------------------------------------------------ writing */

static const char *torch_dtype_name(cai_dtype dt) {
    switch (dt) {
    case CAI_DTYPE_F32: return "float32";
    case CAI_DTYPE_BF16: return "bfloat16";
    case CAI_DTYPE_F16: return "float16";
    default: return NULL;
    }
}

static int set(json_t *o, const char *key, json_t *v) { return v ? json_object_set_new(o, key, v) : -1; }

cai_status cai_hf_config_json(const cai_model_config *cfg_in, cai_dtype dtype, int bos_token_id, int eos_token_id,
                              char **out) {
    CAI_CHECK_ARG(cfg_in && out, "cai_hf_config_json: NULL argument");
    *out = NULL;
    cai_model_config c;
    CAI_CALL(cai_model_config_resolve(cfg_in, &c));
    CAI_CALL(cai_hf_mixtral_check(&c));
    const int moe = c.family == CAI_MODEL_LLAMA && c.moe.n_experts > 0;
    const char *arch = cai_hf_architecture(&c), *tdt = torch_dtype_name(dtype);
    if (!arch)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "config.json: family %s has no HF architecture",
                         cai_model_family_name(c.family));
    if (!tdt)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "config.json: export dtype %s (F32, BF16 or F16)", cai_dtype_name(dtype));
    json_t *o = json_object(), *archs = json_array();
    int bad = !o || !archs || json_array_append_new(archs, json_string(arch));
    bad |= set(o, "architectures", archs);
    bad |= set(o, "model_type", json_string(cai_hf_model_type(&c)));
    bad |= set(o, "vocab_size", json_integer(c.vocab_size));
    if (c.family == CAI_MODEL_GPT2) {
        bad |= set(o, "n_positions", json_integer(c.max_seq_len));
        bad |= set(o, "n_embd", json_integer(c.d_model));
        bad |= set(o, "n_layer", json_integer(c.n_layers));
        bad |= set(o, "n_head", json_integer(c.n_heads));
        /* null means 4 * n_embd to transformers: keep that spelling for the default */
        bad |= set(o, "n_inner", c.ffn_hidden == 4 * c.d_model ? json_null() : json_integer(c.ffn_hidden));
        bad |= set(o, "activation_function", json_string("gelu_new"));
        bad |= set(o, "layer_norm_epsilon", json_real(cai_hf_float_json(c.norm_eps)));
        bad |= set(o, "initializer_range", json_real(cai_hf_float_json(c.init_std)));
        /* colossal trains without dropout; fine-tuning in transformers should see the same model */
        bad |= set(o, "resid_pdrop", json_real(0.0));
        bad |= set(o, "embd_pdrop", json_real(0.0));
        bad |= set(o, "attn_pdrop", json_real(0.0));
        bad |= set(o, "scale_attn_weights", json_true());
        bad |= set(o, "scale_attn_by_inverse_layer_idx", json_false());
        bad |= set(o, "reorder_and_upcast_attn", json_false());
    } else {
        bad |= set(o, "hidden_size", json_integer(c.d_model));
        /* Mixtral: every layer is an MoE block, the size is each expert's */
        bad |= set(o, "intermediate_size", json_integer(moe ? c.moe.ffn : c.ffn_hidden));
        bad |= set(o, "num_hidden_layers", json_integer(c.n_layers));
        bad |= set(o, "num_attention_heads", json_integer(c.n_heads));
        bad |= set(o, "num_key_value_heads", json_integer(c.n_kv_heads));
        bad |= set(o, "head_dim", json_integer(c.d_model / c.n_heads));
        bad |= set(o, "hidden_act", json_string("silu"));
        bad |= set(o, "max_position_embeddings", json_integer(c.max_seq_len));
        bad |= set(o, "rms_norm_eps", json_real(cai_hf_float_json(c.norm_eps)));
        bad |= set(o, "rope_theta", json_real(cai_hf_float_json(c.rope_theta)));
        bad |= set(o, "rope_scaling", json_null());
        bad |= set(o, "attention_bias", json_false());
        bad |= set(o, "attention_dropout", json_real(0.0));
        bad |= set(o, "mlp_bias", json_false());
        bad |= set(o, "pretraining_tp", json_integer(1));
        bad |= set(o, "initializer_range", json_real(cai_hf_float_json(c.init_std)));
        if (moe) {
            bad |= set(o, "num_local_experts", json_integer(c.moe.n_experts));
            bad |= set(o, "num_experts_per_tok", json_integer(c.moe.top_k));
            bad |= set(o, "router_aux_loss_coef", json_real(cai_hf_float_json(c.moe.aux_coef)));
            bad |= set(o, "output_router_logits", json_false());
            bad |= set(o, "router_jitter_noise", json_real(0.0));
            bad |= set(o, "sliding_window", json_null());
        }
    }
    bad |= set(o, "tie_word_embeddings", json_boolean(c.tie_embeddings));
    /* Without a tokenizer the ids are unknown: an explicit null, because an
     * absent key makes transformers assume its own defaults (GPT-2: 50256,
     * Llama: 1 and 2), which may lie outside this model's vocabulary. */
    bad |= set(o, "bos_token_id", bos_token_id >= 0 ? json_integer(bos_token_id) : json_null());
    bad |= set(o, "eos_token_id", eos_token_id >= 0 ? json_integer(eos_token_id) : json_null());
    bad |= set(o, "use_cache", json_true());
    bad |= set(o, "torch_dtype", json_string(tdt));
    char *text = bad ? NULL : json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!text) return CAI_ERROR(CAI_ERR_NOMEM, "config.json: cannot build the JSON text");
    size_t n = strlen(text);
    char *t = realloc(text, n + 2); /* end with a newline, as transformers does */
    if (!t) {
        free(text);
        return CAI_ERROR(CAI_ERR_NOMEM, "config.json: %zu bytes", n + 2);
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    *out = t;
    return CAI_OK;
}

/* ------------------------------------------------------------ reading */

typedef struct {
    const char *path;
    json_t *root;
} cfg_reader;

static json_t *present(const cfg_reader *r, const char *key) {
    json_t *v = json_object_get(r->root, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* An integer key in [min, max]; `def` when absent and not `required`. */
static cai_status get_int(const cfg_reader *r, const char *key, int required, long long def, long long min,
                          long long max, int *out) {
    json_t *v = present(r, key);
    if (!v) {
        if (required)
            return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': key \"%s\" is missing (an integer is required)",
                             r->path, key);
        *out = (int)def;
        return CAI_OK;
    }
    if (!json_is_integer(v))
        return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': key \"%s\" must be an integer", r->path, key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': \"%s\": %lld is out of range [%lld, %lld]", r->path, key,
                         (long long)x, min, max);
    *out = (int)x;
    return CAI_OK;
}

static cai_status get_float(const cfg_reader *r, const char *key, double def, float *out) {
    json_t *v = present(r, key);
    if (!v) {
        *out = (float)def;
        return CAI_OK;
    }
    if (!json_is_number(v))
        return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': key \"%s\" must be a number", r->path, key);
    double x = json_number_value(v);
    if (!isfinite(x) || x <= 0 || x > 3.4e38)
        return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': \"%s\": %g must be positive and finite", r->path, key, x);
    *out = (float)x;
    return CAI_OK;
}

static cai_status get_bool(const cfg_reader *r, const char *key, int def, int *out) {
    json_t *v = present(r, key);
    if (!v) {
        *out = def;
        return CAI_OK;
    }
    if (!json_is_boolean(v))
        return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': key \"%s\" must be true or false", r->path, key);
    *out = json_is_true(v);
    return CAI_OK;
}

static cai_status get_str(const cfg_reader *r, const char *key, const char *def, const char **out) {
    json_t *v = present(r, key);
    if (!v) {
        *out = def;
        return CAI_OK;
    }
    if (!json_is_string(v))
        return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': key \"%s\" must be a string", r->path, key);
    *out = json_string_value(v);
    return CAI_OK;
}

/* A boolean feature colossal does not implement must have its default. */
static cai_status want_bool(const cfg_reader *r, const char *key, int def, const char *why) {
    int v;
    CAI_CALL(get_bool(r, key, def, &v));
    if (v != def)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "config.json '%s': \"%s\": %s is not supported (%s)", r->path, key,
                         v ? "true" : "false", why);
    return CAI_OK;
}

static const struct {
    const char *arch;
    cai_model_family family;
    int mixtral;
} k_archs[] = {
    {"GPT2LMHeadModel", CAI_MODEL_GPT2, 0},
    {"GPT2Model", CAI_MODEL_GPT2, 0},
    {"LlamaForCausalLM", CAI_MODEL_LLAMA, 0},
    {"MixtralForCausalLM", CAI_MODEL_LLAMA, 1},
};
#define N_ARCHS (sizeof k_archs / sizeof k_archs[0])
#define ARCH_LIST "GPT2LMHeadModel, GPT2Model, LlamaForCausalLM, MixtralForCausalLM"

/* *mixtral: a Llama with an MoE block in every layer. */
static cai_status pick_family(const cfg_reader *r, cai_model_family *family, int *mixtral) {
    json_t *archs = present(r, "architectures");
    const char *mt = NULL;
    CAI_CALL(get_str(r, "model_type", NULL, &mt));
    int found = 0;
    if (archs) {
        if (!json_is_array(archs) || json_array_size(archs) == 0)
            return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': \"architectures\" must be a non-empty list of names",
                             r->path);
        const char *first = NULL;
        for (size_t i = 0; i < json_array_size(archs) && !found; i++) {
            const char *a = json_string_value(json_array_get(archs, i));
            if (!a)
                return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': architectures[%zu] is not a string", r->path, i);
            if (!first) first = a;
            for (size_t k = 0; k < N_ARCHS && !found; k++)
                if (strcmp(a, k_archs[k].arch) == 0) {
                    *family = k_archs[k].family;
                    *mixtral = k_archs[k].mixtral;
                    found = 1;
                }
        }
        if (!found)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED, "config.json '%s': unknown architecture \"%s\" (colossal reads %s)",
                             r->path, first, ARCH_LIST);
    }
    if (mt) {
        cai_model_family f;
        int mx = 0;
        if (strcmp(mt, "gpt2") == 0) {
            f = CAI_MODEL_GPT2;
        } else if (strcmp(mt, "llama") == 0) {
            f = CAI_MODEL_LLAMA;
        } else if (strcmp(mt, "mixtral") == 0) {
            f = CAI_MODEL_LLAMA;
            mx = 1;
        } else {
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "config.json '%s': unknown model_type \"%s\" (colossal reads gpt2, llama and "
                             "mixtral)",
                             r->path, mt);
        }
        if (found && (f != *family || mx != *mixtral))
            return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': model_type \"%s\" contradicts architectures (%s)",
                             r->path, mt,
                             *family == CAI_MODEL_GPT2 ? "gpt2"
                             : *mixtral                ? "mixtral"
                                                       : "llama");
        *family = f;
        *mixtral = mx;
        found = 1;
    }
    if (!found)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "config.json '%s': neither \"architectures\" nor \"model_type\" says what "
                         "model this is",
                         r->path);
    return CAI_OK;
}

#define BIG 1000000000LL

static cai_status parse_gpt2(const cfg_reader *r, cai_model_config *c) {
    CAI_CALL(get_int(r, "vocab_size", 1, 0, 1, BIG, &c->vocab_size));
    if (present(r, "n_positions") || !present(r, "n_ctx"))
        CAI_CALL(get_int(r, "n_positions", 1, 0, 1, BIG, &c->max_seq_len));
    else CAI_CALL(get_int(r, "n_ctx", 1, 0, 1, BIG, &c->max_seq_len)); /* configs older than transformers 4 */
    CAI_CALL(get_int(r, "n_embd", 1, 0, 1, BIG, &c->d_model));
    CAI_CALL(get_int(r, "n_layer", 1, 0, 1, BIG, &c->n_layers));
    CAI_CALL(get_int(r, "n_head", 1, 0, 1, BIG, &c->n_heads));
    c->n_kv_heads = c->n_heads;
    CAI_CALL(get_int(r, "n_inner", 0, 0, 1, BIG, &c->ffn_hidden)); /* null or absent: 4 * n_embd */
    const char *act;
    CAI_CALL(get_str(r, "activation_function", "gelu_new", &act));
    /* gelu_pytorch_tanh is the same function as gelu_new, computed by one torch kernel */
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "config.json '%s': activation_function \"%s\" is not supported (colossal's "
                         "GPT-2 uses the tanh GELU, \"gelu_new\")",
                         r->path, act);
    CAI_CALL(get_float(r, "layer_norm_epsilon", 1e-5, &c->norm_eps));
    CAI_CALL(get_float(r, "initializer_range", 0.02, &c->init_std));
    CAI_CALL(get_bool(r, "tie_word_embeddings", 1, &c->tie_embeddings));
    CAI_CALL(want_bool(r, "scale_attn_weights", 1, "colossal always scales scores by 1/sqrt(head_dim)"));
    CAI_CALL(want_bool(r, "scale_attn_by_inverse_layer_idx", 0, "colossal does not scale by layer"));
    CAI_CALL(want_bool(r, "add_cross_attention", 0, "colossal's GPT-2 is decoder-only"));
    return CAI_OK;
}

static cai_status parse_llama(const cfg_reader *r, cai_model_config *c) {
    CAI_CALL(get_int(r, "vocab_size", 1, 0, 1, BIG, &c->vocab_size));
    CAI_CALL(get_int(r, "hidden_size", 1, 0, 1, BIG, &c->d_model));
    CAI_CALL(get_int(r, "intermediate_size", 1, 0, 1, BIG, &c->ffn_hidden));
    CAI_CALL(get_int(r, "num_hidden_layers", 1, 0, 1, BIG, &c->n_layers));
    CAI_CALL(get_int(r, "num_attention_heads", 1, 0, 1, BIG, &c->n_heads));
    CAI_CALL(get_int(r, "num_key_value_heads", 0, c->n_heads, 1, BIG, &c->n_kv_heads));
    CAI_CALL(get_int(r, "max_position_embeddings", 1, 0, 1, BIG, &c->max_seq_len));
    int head_dim = 0;
    CAI_CALL(get_int(r, "head_dim", 0, 0, 1, BIG, &head_dim));
    if (head_dim && (long long)head_dim * c->n_heads != c->d_model)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "config.json '%s': head_dim %d differs from hidden_size / "
                         "num_attention_heads = %d / %d (colossal derives the head size)",
                         r->path, head_dim, c->d_model, c->n_heads);
    const char *act;
    CAI_CALL(get_str(r, "hidden_act", "silu", &act));
    if (strcmp(act, "silu") != 0)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "config.json '%s': hidden_act \"%s\" is not supported (colossal's Llama "
                         "MLP is SwiGLU, \"silu\")",
                         r->path, act);
    CAI_CALL(get_float(r, "rms_norm_eps", 1e-6, &c->norm_eps));
    CAI_CALL(get_float(r, "rope_theta", 10000.0, &c->rope_theta));
    CAI_CALL(get_float(r, "initializer_range", 0.02, &c->init_std));
    CAI_CALL(get_bool(r, "tie_word_embeddings", 0, &c->tie_embeddings));
    if (present(r, "rope_scaling"))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "config.json '%s': \"rope_scaling\" is set; colossal implements plain "
                         "RoPE only",
                         r->path);
    CAI_CALL(want_bool(r, "attention_bias", 0, "colossal's Llama has no attention biases"));
    CAI_CALL(want_bool(r, "mlp_bias", 0, "colossal's Llama has no MLP biases"));
    int tp = 1;
    CAI_CALL(get_int(r, "pretraining_tp", 0, 1, 1, BIG, &tp)); /* only changes how HF slices matmuls */
    return CAI_OK;
}

/* MixtralConfig's keys on top of Llama's; absent ones take its defaults
 * (num_experts_per_tok 2, router_aux_loss_coef 0.001) except the expert
 * count, which no default can guess. Mixtral has no z-loss. */
static cai_status parse_mixtral(const cfg_reader *r, cai_model_config *c) {
    CAI_CALL(parse_llama(r, c));
    if (!present(r, "rms_norm_eps")) c->norm_eps = 1e-5f; /* MixtralConfig's defaults, not Llama's */
    if (!present(r, "rope_theta")) c->rope_theta = 1e6f;
    c->moe = cai_moe_config_default();
    CAI_CALL(get_int(r, "num_local_experts", 1, 0, 1, 1 << 20, &c->moe.n_experts));
    CAI_CALL(get_int(r, "num_experts_per_tok", 0, 2, 1, c->moe.n_experts, &c->moe.top_k));
    c->moe.ffn = c->ffn_hidden;
    c->moe.router = CAI_MOE_ROUTER_SOFTMAX;
    c->moe.norm_topk = 1;
    c->moe.routing = CAI_MOE_DROPLESS;
    c->moe.z_coef = 0.0f;
    c->moe_every = 1;
    json_t *v = present(r, "router_aux_loss_coef");
    if (v && (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0))
        return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': \"router_aux_loss_coef\" must be a number >= 0", r->path);
    c->moe.aux_coef = v ? (float)json_number_value(v) : 0.001f;
    int window = 0;
    CAI_CALL(get_int(r, "sliding_window", 0, 0, 1, BIG, &window));
    if (window && window < c->max_seq_len)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "config.json '%s': \"sliding_window\": %d < max_position_embeddings %d; colossal's "
                         "attention is full causal (null, or a window >= the positions, is expressible)",
                         r->path, window, c->max_seq_len);
    return CAI_OK;
}

cai_status cai_hf_config_load(const char *path, cai_model_config *out) {
    CAI_CHECK_ARG(path && out, "cai_hf_config_load: NULL argument");
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (!cai_hf_file_exists(path))
            return CAI_ERROR(CAI_ERR_IO, "config.json '%s' does not exist or is not a file", path);
        return CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': invalid JSON at line %d, column %d: %s", path, jerr.line,
                         jerr.column, jerr.text);
    }
    cfg_reader r = {path, root};
    cai_status st = CAI_OK;
    if (!json_is_object(root)) {
        st = CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s': the top level is not an object", path);
        goto done;
    }
    cai_model_family family = CAI_MODEL_GPT2;
    int mixtral = 0;
    CAI_CALL_GOTO(pick_family(&r, &family, &mixtral), st, done);
    cai_model_config c = cai_model_config_default(family);
    CAI_CALL_GOTO(family == CAI_MODEL_GPT2 ? parse_gpt2(&r, &c)
                  : mixtral                ? parse_mixtral(&r, &c)
                                           : parse_llama(&r, &c),
                  st, done);
    c.vocab_multiple = 0;
    st = cai_model_config_resolve(&c, out);
    if (st != CAI_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", cai_error_message());
        st = CAI_ERROR(CAI_ERR_FORMAT, "config.json '%s' describes a model colossal cannot build: %s", path, why);
    }
done:
    json_decref(root);
    return st;
}
