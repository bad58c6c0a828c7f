/* Hugging Face export/import: the mapping tables against independently
 * spelled HF names and shapes, bitwise round trips of tiny GPT-2 and Llama
 * (GQA, tied and untied) models, the exported directory checked structurally
 * (config.json keys and values, tensor names/shapes/dtypes, Conv1D
 * transposition and QKV slicing element by element), sharding with the index
 * read back, bf16/f16 export, pipeline-stage import, checkpoints written the
 * way older transformers did, tokenizer files, and a specific error for each
 * corrupt or mismatched input. */
#include "cai_config.h"
#include "colossal/ckpt.h"

#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "colossal/data.h"
#include "colossal/model.h"
#include "colossal/tensor.h"
#include "test_hf_util.h"

static char g_root[256];
static cai_device_t *g_dev;

static void dir_in(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_root, name);
    mkdir(buf, 0755);
}

static void file_in(char *buf, size_t cap, const char *dir, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
}

/* ------------------------------------------------------------ tiny models */

static cai_model_config tiny_gpt2(int tied) {
    cai_model_config c = cai_model_config_default(CAI_MODEL_GPT2);
    c.vocab_size = 50; /* padded to 64: padding rows must not leak */
    c.vocab_multiple = 64;
    c.n_layers = 2;
    c.d_model = 32;
    c.n_heads = 4;
    c.n_kv_heads = 0;
    c.ffn_hidden = 0; /* 4 * 32 */
    c.max_seq_len = 16;
    c.tie_embeddings = tied;
    c.seed = 11;
    return c;
}

static cai_model_config tiny_llama(int tied) {
    cai_model_config c = cai_model_config_default(CAI_MODEL_LLAMA);
    c.vocab_size = 37; /* padded to 128 */
    c.vocab_multiple = 0;
    c.n_layers = 2;
    c.d_model = 32;
    c.n_heads = 4;
    c.n_kv_heads = 2; /* GQA */
    c.ffn_hidden = 48;
    c.max_seq_len = 16;
    c.rope_theta = 500000.0f;
    c.norm_eps = 1e-6f;
    c.tie_embeddings = tied;
    c.seed = 12;
    return c;
}

static cai_model_t *make_model(const cai_model_config *cfg, const cai_rank_view *view) {
    cai_model_options o = cai_model_options_default(cfg);
    o.batch = 1;
    o.seq_len = 8;
    if (view) o.view = *view;
    cai_model_t *m = NULL;
    OK(cai_model_create(&m, g_dev, cfg, &o));
    return m;
}

/* Every element away from its init with the test's own stream (norm
 * weights near 1, the rest ~N(0, 0.1)), padding rows included. */
static void perturb(cai_model_t *m, uint64_t seed) {
    const cai_registry_t *reg = cai_model_registry(m);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        if (p->tie_primary != i) continue;
        cai_tensor t;
        OK(cai_model_param(m, p->name, &t, NULL));
        float *buf = malloc((size_t)p->numel * sizeof *buf);
        for (uint64_t k = 0; k < p->numel; k++) {
            float z = cai_rng_normal(seed, cai_hash64(p->name), k);
            buf[k] = p->ndim == 1 && strstr(p->name, "bias") == NULL ? 1.0f + 0.2f * z : 0.1f * z;
        }
        OK(cai_device_copy(g_dev, t.data, buf, (size_t)p->numel * sizeof *buf, CAI_COPY_H2D));
        free(buf);
    }
    OK(cai_model_params_updated(m));
}

static float *master_copy(cai_model_t *m, const char *name, uint64_t *numel) {
    cai_tensor t;
    OK(cai_model_param(m, name, &t, NULL));
    *numel = (uint64_t)cai_tensor_numel(&t);
    float *buf = malloc((size_t)*numel * sizeof *buf + 4);
    OK(cai_device_copy(g_dev, buf, t.data, (size_t)*numel * sizeof *buf, CAI_COPY_D2H));
    return buf;
}

/* Rows [0, vocab) of vocabulary tensors and everything else bitwise equal;
 * the destination's padding rows exactly zero. `round` maps the source
 * through a dtype first (F32: identity). */
static void expect_same_weights(cai_model_t *src, cai_model_t *dst, cai_dtype round) {
    const cai_registry_t *reg = cai_model_registry(src);
    const cai_model_config *c = cai_model_config_of(src);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        uint64_t n1, n2;
        float *a = master_copy(src, p->name, &n1), *b = master_copy(dst, p->name, &n2);
        ck_assert_uint_eq(n1, n2);
        const int vocab = !strcmp(p->name, "wte.weight") || !strcmp(p->name, "lm_head.weight");
        const uint64_t real = vocab ? (uint64_t)c->vocab_size * p->shape[1] : n1;
        for (uint64_t k = 0; k < n1; k++) {
            float want = 0.0f;
            if (k < real) {
                want = a[k];
                if (round == CAI_DTYPE_BF16) want = cai_bf16_to_f32(cai_f32_to_bf16(want));
                if (round == CAI_DTYPE_F16) want = cai_f16_to_f32(cai_f32_to_f16(want));
            }
            ck_assert_msg(memcmp(&want, &b[k], sizeof want) == 0, "%s[%llu]: %.9g imported as %.9g", p->name,
                          (unsigned long long)k, (double)want, (double)b[k]);
        }
        free(a);
        free(b);
    }
}

/* ------------------------------------------------------------ expected HF tables
 * Spelled out from transformers' GPT2LMHeadModel / LlamaForCausalLM module
 * trees (independently of src/ckpt/hf_map.c). */

typedef struct {
    char name[128];
    int ndim;
    uint64_t shape[2];
} hf_want;

static int want_gpt2(hf_want *w, int L, uint64_t V, uint64_t T, uint64_t C, int tied) {
    int n = 0;
#define W1(nm, a) (snprintf(w[n].name, sizeof w[n].name, "%s", nm), w[n].ndim = 1, w[n].shape[0] = (a), n++)
#define W2(nm, a, b) \
    (snprintf(w[n].name, sizeof w[n].name, "%s", nm), w[n].ndim = 2, w[n].shape[0] = (a), w[n].shape[1] = (b), n++)
    W2("transformer.wte.weight", V, C);
    W2("transformer.wpe.weight", T, C);
    char b[128];
    for (int l = 0; l < L; l++) {
#define P(s) (snprintf(b, sizeof b, "transformer.h.%d.%s", l, s), b)
        W1(P("ln_1.weight"), C);
        W1(P("ln_1.bias"), C);
        W2(P("attn.c_attn.weight"), C, 3 * C); /* Conv1D: [in, out] */
        W1(P("attn.c_attn.bias"), 3 * C);
        W2(P("attn.c_proj.weight"), C, C);
        W1(P("attn.c_proj.bias"), C);
        W1(P("ln_2.weight"), C);
        W1(P("ln_2.bias"), C);
        W2(P("mlp.c_fc.weight"), C, 4 * C);
        W1(P("mlp.c_fc.bias"), 4 * C);
        W2(P("mlp.c_proj.weight"), 4 * C, C);
        W1(P("mlp.c_proj.bias"), C);
#undef P
    }
    W1("transformer.ln_f.weight", C);
    W1("transformer.ln_f.bias", C);
    if (!tied) W2("lm_head.weight", V, C);
    return n;
}

static int want_llama(hf_want *w, int L, uint64_t V, uint64_t C, uint64_t Hkv, uint64_t D, uint64_t F, int tied) {
    int n = 0;
    W2("model.embed_tokens.weight", V, C);
    char b[128];
    for (int l = 0; l < L; l++) {
#define P(s) (snprintf(b, sizeof b, "model.layers.%d.%s", l, s), b)
        W2(P("self_attn.q_proj.weight"), C, C); /* nn.Linear: [out, in] */
        W2(P("self_attn.k_proj.weight"), Hkv * D, C);
        W2(P("self_attn.v_proj.weight"), Hkv * D, C);
        W2(P("self_attn.o_proj.weight"), C, C);
        W2(P("mlp.gate_proj.weight"), F, C);
        W2(P("mlp.up_proj.weight"), F, C);
        W2(P("mlp.down_proj.weight"), C, F);
        W1(P("input_layernorm.weight"), C);
        W1(P("post_attention_layernorm.weight"), C);
#undef P
    }
    W1("model.norm.weight", C);
    if (!tied) W2("lm_head.weight", V, C);
    return n;
#undef W1
#undef W2
}

static int find_want(const hf_want *w, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(w[i].name, name)) return i;
    return -1;
}

START_TEST(mapping_tables_are_the_hf_module_trees) {
    hf_want w[64];
    for (int tied = 0; tied < 2; tied++) {
        cai_model_config g = tiny_gpt2(tied);
        cai_hf_map_t *m;
        OK(cai_hf_map_create(&m, &g));
        int n = want_gpt2(w, 2, 50, 16, 32, tied);
        ck_assert_int_eq(cai_hf_map_count(m), n);
        for (int i = 0; i < n; i++) {
            const cai_hf_entry *e = cai_hf_map_entry(m, i);
            ck_assert_str_eq(e->hf, w[i].name);
            ck_assert_int_eq(e->ndim, w[i].ndim);
            ck_assert_uint_eq(e->hf_shape[0], w[i].shape[0]);
            if (e->ndim == 2) ck_assert_uint_eq(e->hf_shape[1], w[i].shape[1]);
            /* exactly the Conv1D weights are transposed */
            const int conv = e->ndim == 2 && strstr(e->hf, "transformer.h.") != NULL;
            ck_assert_int_eq(e->transform == CAI_HF_TRANSPOSE, conv);
            ck_assert_ptr_eq(cai_hf_map_find_hf(m, e->hf), e);
        }
        const cai_hf_entry *first;
        ck_assert_int_eq(cai_hf_map_find(m, "h.1.attn.qkv.weight", &first), 1);
        ck_assert_str_eq(first->hf, "transformer.h.1.attn.c_attn.weight");
        ck_assert_int_eq(cai_hf_map_find(m, "lm_head.weight", &first), tied ? 0 : 1);
        ck_assert_int_eq(cai_hf_map_find(m, "wte.weight", &first), 1);
        ck_assert_int_eq(first->transform, CAI_HF_VOCAB_ROWS);
        ck_assert_uint_eq(first->rows, 50);
        cai_hf_map_free(m);
    }
    for (int tied = 0; tied < 2; tied++) {
        cai_model_config l = tiny_llama(tied);
        cai_hf_map_t *m;
        OK(cai_hf_map_create(&m, &l));
        int n = want_llama(w, 2, 37, 32, 2, 8, 48, tied);
        ck_assert_int_eq(cai_hf_map_count(m), n);
        for (int i = 0; i < n; i++) {
            const cai_hf_entry *e = cai_hf_map_entry(m, i);
            int k = find_want(w, n, e->hf);
            ck_assert_msg(k >= 0, "unexpected HF name %s", e->hf);
            ck_assert_int_eq(e->ndim, w[k].ndim);
            ck_assert_uint_eq(e->hf_shape[0], w[k].shape[0]);
            if (e->ndim == 2) ck_assert_uint_eq(e->hf_shape[1], w[k].shape[1]);
            ck_assert_int_ne(e->transform, CAI_HF_TRANSPOSE);
        }
        const cai_hf_entry *q;
        ck_assert_int_eq(cai_hf_map_find(m, "h.0.attn.qkv.weight", &q), 3);
        ck_assert_str_eq(q[0].hf, "model.layers.0.self_attn.q_proj.weight");
        ck_assert_str_eq(q[1].hf, "model.layers.0.self_attn.k_proj.weight");
        ck_assert_str_eq(q[2].hf, "model.layers.0.self_attn.v_proj.weight");
        ck_assert_uint_eq(q[0].row_begin, 0);
        ck_assert_uint_eq(q[1].row_begin, 32);
        ck_assert_uint_eq(q[2].row_begin, 48);
        ck_assert_int_eq(cai_hf_map_find(m, "h.1.mlp.fc.weight", &q), 1);
        ck_assert_str_eq(q->hf, "model.layers.1.mlp.gate_proj.weight");
        cai_hf_map_free(m);
    }
}
END_TEST

/* ------------------------------------------------------------ round trips */

static void export_model(cai_model_t *m, const char *dir, cai_dtype dt, uint64_t shard) {
    cai_hf_export_options o = cai_hf_export_options_default();
    o.dtype = dt;
    o.max_shard_bytes = shard;
    cai_hf_export_stats s;
    OK(cai_hf_export_model(dir, m, &o, &s));
    ck_assert_int_ge(s.n_files, 1);
}

static cai_model_t *import_fresh(const char *dir, const cai_model_config *like) {
    cai_hf_t *h;
    OK(cai_hf_open(&h, dir));
    cai_model_config c = *cai_hf_config(h);
    c.vocab_multiple = like->vocab_multiple; /* any padding imports */
    c.seed = like->seed + 1000;              /* different init: the import must overwrite all */
    cai_model_t *m = make_model(&c, NULL);
    OK(cai_hf_import_model(h, m));
    cai_hf_close(h);
    return m;
}

/* A perturbed model of cfg exported (F32) into a new directory `name`. */
static cai_model_t *exported(const char *name, const cai_model_config *cfg, uint64_t seed, uint64_t shard, char *dir,
                             size_t cap) {
    dir_in(dir, cap, name);
    cai_model_t *m = make_model(cfg, NULL);
    perturb(m, seed);
    export_model(m, dir, CAI_DTYPE_F32, shard);
    return m;
}

START_TEST(round_trip_is_bitwise) {
    const cai_model_config cfgs[4] = {tiny_gpt2(1), tiny_gpt2(0), tiny_llama(0), tiny_llama(1)};
    for (int k = 0; k < 4; k++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/rt%d", g_root, k);
        cai_model_t *a = make_model(&cfgs[k], NULL);
        perturb(a, 100 + (uint64_t)k);
        export_model(a, dir, CAI_DTYPE_F32, 0);
        cai_model_t *b = import_fresh(dir, &cfgs[k]);
        expect_same_weights(a, b, CAI_DTYPE_F32);
        /* the imported config is the exported one */
        const cai_model_config *x = cai_model_config_of(a), *y = cai_model_config_of(b);
        ck_assert_int_eq(x->family, y->family);
        ck_assert_int_eq(x->vocab_size, y->vocab_size);
        ck_assert_int_eq(x->n_layers, y->n_layers);
        ck_assert_int_eq(x->d_model, y->d_model);
        ck_assert_int_eq(x->n_heads, y->n_heads);
        ck_assert_int_eq(x->n_kv_heads, y->n_kv_heads);
        ck_assert_int_eq(x->ffn_hidden, y->ffn_hidden);
        ck_assert_int_eq(x->max_seq_len, y->max_seq_len);
        ck_assert_int_eq(x->tie_embeddings, y->tie_embeddings);
        ck_assert(x->norm_eps == y->norm_eps);
        ck_assert(x->rope_theta == y->rope_theta || x->family == CAI_MODEL_GPT2);
        ck_assert(x->init_std == y->init_std);
        /* and a second export of the import is byte-identical */
        char dir2[512], f1[600], f2[600], cmd[1400];
        snprintf(dir2, sizeof dir2, "%s/rt%d_again", g_root, k);
        export_model(b, dir2, CAI_DTYPE_F32, 0);
        file_in(f1, sizeof f1, dir, "model.safetensors");
        file_in(f2, sizeof f2, dir2, "model.safetensors");
        snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", f1, f2);
        ck_assert_msg(system(cmd) == 0, "re-export differs: %s", cmd);
        cai_model_free(a);
        cai_model_free(b);
    }
}
END_TEST

/* ------------------------------------------------------------ structure */

static json_t *load_json(const char *dir, const char *name) {
    char p[600];
    file_in(p, sizeof p, dir, name);
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    ck_assert_msg(j != NULL, "%s: %s", p, e.text);
    return j;
}

static void expect_int(json_t *o, const char *k, long long v) {
    json_t *x = json_object_get(o, k);
    ck_assert_msg(json_is_integer(x) && json_integer_value(x) == v, "config.json %s: want %lld", k, v);
}

static void expect_str(json_t *o, const char *k, const char *v) {
    json_t *x = json_object_get(o, k);
    ck_assert_msg(json_is_string(x) && !strcmp(json_string_value(x), v), "config.json %s: want \"%s\"", k, v);
}

static void expect_bool(json_t *o, const char *k, int v) {
    json_t *x = json_object_get(o, k);
    ck_assert_msg(json_is_boolean(x) && json_is_true(x) == v, "config.json %s: want %s", k, v ? "true" : "false");
}

static void expect_float(json_t *o, const char *k, float v) {
    json_t *x = json_object_get(o, k);
    ck_assert_msg(json_is_number(x) && (float)json_number_value(x) == v, "config.json %s: want %g", k, (double)v);
}

static void expect_arch(json_t *o, const char *arch) {
    json_t *a = json_object_get(o, "architectures");
    ck_assert(json_is_array(a) && json_array_size(a) == 1);
    ck_assert_str_eq(json_string_value(json_array_get(a, 0)), arch);
}

/* The tensor `hf` of the file, as F32 (it is F32 in these tests). */
static const float *tensor_f32(const cai_safetensors_t *st, const char *hf, uint64_t d0, uint64_t d1) {
    const cai_st_entry *e = cai_safetensors_find(st, hf);
    ck_assert_msg(e != NULL, "%s missing", hf);
    ck_assert_int_eq(e->dtype, CAI_DTYPE_F32);
    ck_assert_uint_eq(e->shape[0], d0);
    if (d1) ck_assert_uint_eq(e->shape[1], d1);
    return e->data;
}

START_TEST(gpt2_directory_is_what_transformers_expects) {
    char dir[512], f[600];
    cai_model_config cfg = tiny_gpt2(1);
    cai_model_t *m = exported("gpt2_struct", &cfg, 7, 0, dir, sizeof dir);

    json_t *c = load_json(dir, "config.json");
    expect_arch(c, "GPT2LMHeadModel");
    expect_str(c, "model_type", "gpt2");
    expect_int(c, "vocab_size", 50); /* the real vocabulary, not the padded 64 */
    expect_int(c, "n_positions", 16);
    expect_int(c, "n_embd", 32);
    expect_int(c, "n_layer", 2);
    expect_int(c, "n_head", 4);
    ck_assert(json_is_null(json_object_get(c, "n_inner")));
    expect_str(c, "activation_function", "gelu_new");
    expect_float(c, "layer_norm_epsilon", 1e-5f);
    expect_bool(c, "tie_word_embeddings", 1);
    expect_bool(c, "scale_attn_weights", 1);
    expect_str(c, "torch_dtype", "float32");
    ck_assert(json_is_null(json_object_get(c, "bos_token_id"))); /* no tokenizer given: not transformers' default */
    ck_assert(json_is_null(json_object_get(c, "eos_token_id")));
    json_decref(c);

    file_in(f, sizeof f, dir, "model.safetensors");
    cai_safetensors_t *st;
    OK(cai_safetensors_open(&st, f));
    ck_assert_str_eq(cai_safetensors_meta(st, "format"), "pt");
    hf_want w[64];
    const int n = want_gpt2(w, 2, 50, 16, 32, 1);
    ck_assert_int_eq(cai_safetensors_count(st), n); /* no lm_head: tied */
    for (int i = 0; i < n; i++) {
        const cai_st_entry *e = cai_safetensors_find(st, w[i].name);
        ck_assert_msg(e != NULL, "%s missing", w[i].name);
        ck_assert_int_eq(e->ndim, w[i].ndim);
        for (int d = 0; d < e->ndim; d++) ck_assert_uint_eq(e->shape[d], w[i].shape[d]);
    }
    /* Conv1D: HF c_attn[i][j] = colossal qkv[j][i]; its columns are Q | K | V */
    for (int l = 0; l < 2; l++) {
        static const char *const pairs[3][2] = {{"attn.qkv.weight", "attn.c_attn.weight"},
                                                {"mlp.fc.weight", "mlp.c_fc.weight"},
                                                {"mlp.proj.weight", "mlp.c_proj.weight"}};
        for (int p = 0; p < 3; p++) {
            char cn[128], hn[128];
            snprintf(cn, sizeof cn, "h.%d.%s", l, pairs[p][0]);
            snprintf(hn, sizeof hn, "transformer.h.%d.%s", l, pairs[p][1]);
            uint64_t numel;
            float *src = master_copy(m, cn, &numel);
            const cai_param_info *pi =
                cai_registry_param(cai_model_registry(m), cai_registry_find(cai_model_registry(m), cn));
            const uint64_t out = pi->shape[0], in = pi->shape[1];
            const float *hf = tensor_f32(st, hn, in, out);
            for (uint64_t i = 0; i < in; i++)
                for (uint64_t o = 0; o < out; o++)
                    ck_assert_msg(memcmp(&hf[i * out + o], &src[o * in + i], 4) == 0, "%s[%llu][%llu]", hn,
                                  (unsigned long long)i, (unsigned long long)o);
            free(src);
        }
    }
    uint64_t numel;
    float *wte = master_copy(m, "wte.weight", &numel);
    const float *hw = tensor_f32(st, "transformer.wte.weight", 50, 32);
    ck_assert(memcmp(hw, wte, 50 * 32 * sizeof(float)) == 0); /* the first 50 of 64 rows */
    free(wte);
    float *bias = master_copy(m, "h.1.attn.qkv.bias", &numel);
    ck_assert(memcmp(tensor_f32(st, "transformer.h.1.attn.c_attn.bias", 96, 0), bias, 96 * sizeof(float)) == 0);
    free(bias);
    cai_safetensors_close(st);
    cai_model_free(m);
}
END_TEST

START_TEST(llama_directory_is_what_transformers_expects) {
    char dir[512], f[600];
    cai_model_config cfg = tiny_llama(0);
    cai_model_t *m = exported("llama_struct", &cfg, 8, 0, dir, sizeof dir);

    json_t *c = load_json(dir, "config.json");
    expect_arch(c, "LlamaForCausalLM");
    expect_str(c, "model_type", "llama");
    expect_int(c, "vocab_size", 37);
    expect_int(c, "hidden_size", 32);
    expect_int(c, "intermediate_size", 48);
    expect_int(c, "num_hidden_layers", 2);
    expect_int(c, "num_attention_heads", 4);
    expect_int(c, "num_key_value_heads", 2);
    expect_int(c, "max_position_embeddings", 16);
    expect_float(c, "rms_norm_eps", 1e-6f);
    expect_float(c, "rope_theta", 500000.0f);
    expect_str(c, "hidden_act", "silu");
    expect_bool(c, "tie_word_embeddings", 0);
    expect_bool(c, "attention_bias", 0);
    expect_str(c, "torch_dtype", "float32");
    ck_assert(json_is_null(json_object_get(c, "rope_scaling")));
    json_decref(c);

    file_in(f, sizeof f, dir, "model.safetensors");
    cai_safetensors_t *st;
    OK(cai_safetensors_open(&st, f));
    hf_want w[64];
    const int n = want_llama(w, 2, 37, 32, 2, 8, 48, 0);
    ck_assert_int_eq(cai_safetensors_count(st), n);
    for (int i = 0; i < n; i++) {
        const cai_st_entry *e = cai_safetensors_find(st, w[i].name);
        ck_assert_msg(e != NULL, "%s missing", w[i].name);
        for (int d = 0; d < e->ndim; d++) ck_assert_uint_eq(e->shape[d], w[i].shape[d]);
    }
    /* q/k/v_proj are the fused rows: 32 query, 16 key, 16 value (GQA) */
    uint64_t numel;
    float *qkv = master_copy(m, "h.1.attn.qkv.weight", &numel);
    ck_assert(memcmp(tensor_f32(st, "model.layers.1.self_attn.q_proj.weight", 32, 32), qkv, 32 * 32 * 4) == 0);
    ck_assert(memcmp(tensor_f32(st, "model.layers.1.self_attn.k_proj.weight", 16, 32), qkv + 32 * 32, 16 * 32 * 4) ==
              0);
    ck_assert(memcmp(tensor_f32(st, "model.layers.1.self_attn.v_proj.weight", 16, 32), qkv + 48 * 32, 16 * 32 * 4) ==
              0);
    free(qkv);
    float *head = master_copy(m, "lm_head.weight", &numel);
    ck_assert(memcmp(tensor_f32(st, "lm_head.weight", 37, 32), head, 37 * 32 * 4) == 0);
    free(head);
    float *gate = master_copy(m, "h.0.mlp.fc.weight", &numel);
    ck_assert(memcmp(tensor_f32(st, "model.layers.0.mlp.gate_proj.weight", 48, 32), gate, 48 * 32 * 4) == 0);
    free(gate);
    cai_safetensors_close(st);

    /* config.json reads back to the same model */
    cai_model_config back;
    file_in(f, sizeof f, dir, "config.json");
    OK(cai_hf_config_load(f, &back));
    ck_assert_int_eq(back.family, CAI_MODEL_LLAMA);
    ck_assert_int_eq(back.n_kv_heads, 2);
    ck_assert(back.rope_theta == 500000.0f && back.norm_eps == 1e-6f);
    cai_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ sharding */

START_TEST(sharded_export_reads_back_through_the_index) {
    char dir[512], f[600];
    cai_model_config cfg = tiny_llama(0);
    const uint64_t limit = 12000; /* bytes: the model is ~54 KB in f32 */
    cai_model_t *m = exported("sharded", &cfg, 9, limit, dir, sizeof dir);
    file_in(f, sizeof f, dir, "model.safetensors");
    ck_assert_msg(access(f, F_OK) != 0, "a sharded export must not leave model.safetensors");

    json_t *idx = load_json(dir, "model.safetensors.index.json");
    json_t *wm = json_object_get(idx, "weight_map");
    const json_int_t total = json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size"));
    hf_want w[64];
    const int n = want_llama(w, 2, 37, 32, 2, 8, 48, 0);
    ck_assert_int_eq((int)json_object_size(wm), n);
    /* every shard: the right name, holds exactly what the index maps to it, under the limit */
    int n_files = 0;
    uint64_t sum = 0;
    for (int k = 1;; k++) {
        char name[64];
        int found = 0;
        for (int K = 1; K <= 64 && !found; K++) {
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k, K);
            file_in(f, sizeof f, dir, name);
            found = access(f, F_OK) == 0;
            if (found) n_files = K;
        }
        if (!found) break;
        cai_safetensors_t *st;
        OK(cai_safetensors_open(&st, f));
        uint64_t bytes = 0;
        for (int j = 0; j < cai_safetensors_count(st); j++) {
            const cai_st_entry *e = cai_safetensors_entry(st, j);
            ck_assert_str_eq(json_string_value(json_object_get(wm, e->name)), name);
            bytes += e->end - e->begin;
        }
        ck_assert_msg(bytes <= limit || cai_safetensors_count(st) == 1, "shard %s holds %llu bytes", name,
                      (unsigned long long)bytes);
        sum += bytes;
        cai_safetensors_close(st);
    }
    ck_assert_int_ge(n_files, 4);
    ck_assert_uint_eq(sum, (uint64_t)total);
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) ck_assert_msg(find_want(w, n, key) >= 0, "index lists %s", key);
    json_decref(idx);

    cai_hf_t *h;
    OK(cai_hf_open(&h, dir));
    uint64_t ts = 0;
    ck_assert_int_eq(cai_hf_sharded(h, &ts), 1);
    ck_assert_uint_eq(ts, (uint64_t)total);
    ck_assert_int_eq(cai_hf_file_count(h), n_files);
    cai_hf_close(h);
    cai_model_t *b = import_fresh(dir, &cfg);
    expect_same_weights(m, b, CAI_DTYPE_F32);
    cai_model_free(b);

    /* exporting unsharded into the same directory removes shards and index */
    export_model(m, dir, CAI_DTYPE_F32, 0);
    DIR *d = opendir(dir);
    struct dirent *de;
    while ((de = readdir(d)))
        ck_assert_msg(strncmp(de->d_name, "model-", 6) != 0 && strcmp(de->d_name, "model.safetensors.index.json"),
                      "stale %s", de->d_name);
    closedir(d);
    b = import_fresh(dir, &cfg);
    expect_same_weights(m, b, CAI_DTYPE_F32);
    cai_model_free(b);
    cai_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ dtypes */

START_TEST(bf16_and_f16_exports_round_to_nearest_even) {
    const cai_dtype dts[2] = {CAI_DTYPE_BF16, CAI_DTYPE_F16};
    const char *torch[2] = {"bfloat16", "float16"};
    cai_model_config cfg = tiny_gpt2(1);
    cai_model_t *m = make_model(&cfg, NULL);
    perturb(m, 10);
    for (int k = 0; k < 2; k++) {
        char dir[512], f[600];
        snprintf(dir, sizeof dir, "%s/dtype%d", g_root, k);
        export_model(m, dir, dts[k], 0);
        json_t *c = load_json(dir, "config.json");
        expect_str(c, "torch_dtype", torch[k]);
        json_decref(c);
        file_in(f, sizeof f, dir, "model.safetensors");
        cai_safetensors_t *st;
        OK(cai_safetensors_open(&st, f));
        for (int j = 0; j < cai_safetensors_count(st); j++)
            ck_assert_int_eq(cai_safetensors_entry(st, j)->dtype, dts[k]);
        /* one Conv1D weight element by element: RNE of the transposed master */
        uint64_t numel;
        float *src = master_copy(m, "h.0.mlp.fc.weight", &numel); /* [128, 32] */
        const cai_st_entry *e = cai_safetensors_find(st, "transformer.h.0.mlp.c_fc.weight");
        ck_assert_uint_eq(e->shape[0], 32);
        ck_assert_uint_eq(e->shape[1], 128);
        const uint16_t *h = e->data;
        for (uint64_t i = 0; i < 32; i++)
            for (uint64_t o = 0; o < 128; o++) {
                float x = src[o * 32 + i];
                uint16_t want = k == 0 ? cai_f32_to_bf16(x) : cai_f32_to_f16(x);
                ck_assert_uint_eq(h[i * 128 + o], want);
            }
        free(src);
        cai_safetensors_close(st);
        cai_model_t *b = import_fresh(dir, &cfg);
        expect_same_weights(m, b, dts[k]);
        cai_model_free(b);
    }
    cai_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ other sources and sinks */

START_TEST(flat_buffer_export_and_import_match_the_model) {
    char d1[512], d2[512], f1[600], f2[600], cmd[1400];
    dir_in(d1, sizeof d1, "from_model");
    dir_in(d2, sizeof d2, "from_flat");
    cai_model_config cfg = tiny_llama(0);
    cai_model_t *m = make_model(&cfg, NULL);
    perturb(m, 11);
    export_model(m, d1, CAI_DTYPE_F32, 0);
    cai_tensor params;
    cai_model_flat(m, &params, NULL, NULL);
    const size_t count = (size_t)cai_tensor_numel(&params);
    float *flat = malloc(count * sizeof *flat);
    OK(cai_device_copy(g_dev, flat, params.data, count * sizeof *flat, CAI_COPY_D2H));
    OK(cai_hf_export_flat(d2, cai_model_config_of(m), cai_model_registry(m), flat, count, cai_model_align_elems(m),
                          NULL, NULL));
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "config.json" : "model.safetensors";
        file_in(f1, sizeof f1, d1, name);
        file_in(f2, sizeof f2, d2, name);
        snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", f1, f2);
        ck_assert_msg(system(cmd) == 0, "%s differs between model and flat export", name);
    }
    /* import into a flat buffer: the model's layout, padding rows zero */
    float *back = malloc(count * sizeof *back);
    cai_hf_t *h;
    OK(cai_hf_open(&h, d2));
    OK(cai_hf_import_flat(h, cai_model_registry(m), back, count, cai_model_align_elems(m)));
    const cai_registry_t *reg = cai_model_registry(m);
    size_t *off = calloc((size_t)cai_registry_count(reg), sizeof *off), total;
    cai_rank_view single = cai_rank_view_single();
    OK(cai_registry_local_layout(reg, &single, cai_model_align_elems(m), off, &total));
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        const int vocab = !strcmp(p->name, "wte.weight") || !strcmp(p->name, "lm_head.weight");
        const uint64_t real = vocab ? 37 * p->shape[1] : p->numel;
        ck_assert_msg(memcmp(back + off[i], flat + off[i], real * 4) == 0, "%s", p->name);
        for (uint64_t k = real; k < p->numel; k++) ck_assert(back[off[i] + k] == 0.0f);
    }
    /* a registry that disagrees with the config is named */
    cai_model_config other = cfg;
    other.ffn_hidden = 64;
    EXPECT_ERR(cai_hf_export_flat(d2, &other, reg, flat, count, cai_model_align_elems(m), NULL, NULL),
               CAI_ERR_INVALID_ARG, "h.0.mlp.fc.weight", "[48,32]", "[64,32]");
    EXPECT_ERR(cai_hf_export_flat(d2, &cfg, reg, flat, count - 100, cai_model_align_elems(m), NULL, NULL),
               CAI_ERR_INVALID_ARG, "flat buffer");
    free(off);
    free(back);
    free(flat);
    cai_hf_close(h);
    cai_model_free(m);
}
END_TEST

START_TEST(pipeline_stage_imports_its_own_layers) {
    char dir[512];
    cai_model_config cfg = tiny_gpt2(1);
    cfg.n_layers = 4;
    cai_model_t *a = exported("pp", &cfg, 12, 0, dir, sizeof dir);
    cai_hf_t *h;
    OK(cai_hf_open(&h, dir));
    for (int stage = 0; stage < 2; stage++) {
        cai_rank_view v = cai_rank_view_single();
        v.pp_size = 2;
        v.pp_rank = stage;
        cai_model_config c2 = cfg;
        c2.seed = 999;
        cai_model_t *s = make_model(&c2, &v);
        OK(cai_hf_import_model(h, s));
        const cai_registry_t *reg = cai_model_registry(s);
        int held = 0;
        for (int i = 0; i < cai_registry_count(reg); i++) {
            cai_param_shard sh;
            OK(cai_registry_shard(reg, i, &v, &sh));
            if (!sh.held) continue;
            held++;
            const cai_param_info *p = cai_registry_param(reg, i);
            uint64_t n1, n2;
            float *x = master_copy(a, p->name, &n1), *y = master_copy(s, p->name, &n2);
            const int vocab = !strcmp(p->name, "wte.weight") || !strcmp(p->name, "lm_head.weight");
            ck_assert_msg(memcmp(x, y, (vocab ? 50 * 32 : n1) * 4) == 0, "stage %d: %s", stage, p->name);
            free(x);
            free(y);
        }
        /* stage 1 holds the tied head: its copy comes from wte */
        ck_assert_int_eq(cai_registry_find(reg, "lm_head.weight") >= 0, 1);
        ck_assert_int_gt(held, 10);
        /* and cannot export on its own */
        EXPECT_ERR(cai_hf_export_model(dir, s, NULL, NULL), CAI_ERR_UNSUPPORTED, "pipeline");
        cai_model_free(s);
    }
    cai_hf_close(h);
    cai_model_free(a);
}
END_TEST

/* ------------------------------------------------------------ rewriting files */

/* The tensors of a file as writer descriptors pointing into its mapping. */
typedef struct {
    cai_safetensors_t *st;
    cai_st_tensor t[256];
    char names[256][128];
    int n;
} file_copy;

static void copy_open(file_copy *c, const char *path) {
    memset(c, 0, sizeof *c);
    OK(cai_safetensors_open(&c->st, path));
    c->n = cai_safetensors_count(c->st);
    for (int i = 0; i < c->n; i++) {
        const cai_st_entry *e = cai_safetensors_entry(c->st, i);
        snprintf(c->names[i], sizeof c->names[i], "%s", e->name);
        c->t[i].name = c->names[i];
        c->t[i].dtype = e->dtype;
        c->t[i].ndim = e->ndim;
        memcpy(c->t[i].shape, e->shape, sizeof e->shape);
        c->t[i].data = e->data;
    }
}

static int copy_find(const file_copy *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->names[i], name)) return i;
    return -1;
}

static void copy_drop(file_copy *c, const char *name) {
    int i = copy_find(c, name);
    ck_assert_int_ge(i, 0);
    memmove(&c->t[i], &c->t[i + 1], (size_t)(c->n - i - 1) * sizeof c->t[0]);
    memmove(c->names[i], c->names[i + 1], (size_t)(c->n - i - 1) * sizeof c->names[0]);
    c->n--;
    for (int k = 0; k < c->n; k++) c->t[k].name = c->names[k];
}

static void copy_write(file_copy *c, const char *path) {
    OK(cai_safetensors_write(path, c->t, c->n, NULL, 0));
    cai_safetensors_close(c->st);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[600];
    file_in(p, sizeof p, dir, name);
    FILE *f = fopen(p, "w");
    ck_assert(f != NULL);
    fputs(text, f);
    fclose(f);
}

static void write_json(const char *dir, const char *name, json_t *j) {
    char *text = json_dumps(j, JSON_INDENT(2));
    write_text(dir, name, text);
    free(text);
}

/* config.json with one key set to a JSON value (NULL: removed). */
static void edit_config(const char *dir, const char *key, const char *json_value) {
    json_t *c = load_json(dir, "config.json");
    if (json_value) {
        json_error_t e;
        json_object_set_new(c, key, json_loads(json_value, JSON_DECODE_ANY, &e));
    } else {
        json_object_del(c, key);
    }
    write_json(dir, "config.json", c);
    json_decref(c);
}

/* A GPT-2 directory as the original hub checkpoint is laid out: saved from
 * GPT2Model (no "transformer." prefix), causal-mask buffers h.N.attn.bias
 * and attn.masked_bias included; plus a tied lm_head some tools write. */
START_TEST(older_checkpoint_layouts_import) {
    char dir[512], f[600];
    cai_model_config cfg = tiny_gpt2(1);
    cai_model_t *m = exported("legacy", &cfg, 13, 0, dir, sizeof dir);
    file_in(f, sizeof f, dir, "model.safetensors");
    file_copy c;
    copy_open(&c, f);
    for (int i = 0; i < c.n; i++)
        if (!strncmp(c.names[i], "transformer.", 12)) memmove(c.names[i], c.names[i] + 12, strlen(c.names[i]) - 11);
    static float mask[16 * 16], masked_bias = -1e4f;
    for (int i = 0; i < 16 * 16; i++) mask[i] = (float)(i % 16 <= i / 16);
    for (int l = 0; l < 2; l++) {
        snprintf(c.names[c.n], sizeof c.names[0], "h.%d.attn.bias", l);
        c.t[c.n] = (cai_st_tensor){c.names[c.n], CAI_DTYPE_F32, 4, {1, 1, 16, 16}, mask};
        c.n++;
        snprintf(c.names[c.n], sizeof c.names[0], "h.%d.attn.masked_bias", l);
        c.t[c.n] = (cai_st_tensor){c.names[c.n], CAI_DTYPE_F32, 0, {0}, &masked_bias};
        c.n++;
    }
    snprintf(c.names[c.n], sizeof c.names[0], "lm_head.weight");
    c.t[c.n] = c.t[copy_find(&c, "wte.weight")];
    c.t[c.n].name = c.names[c.n];
    c.n++;
    for (int i = 0; i < c.n; i++) c.t[i].name = c.names[i];
    copy_write(&c, f);
    edit_config(dir, "architectures", "[\"GPT2Model\"]");
    edit_config(dir, "n_positions", NULL);
    edit_config(dir, "n_ctx", "16"); /* pre-4.0 spelling */
    cai_model_t *b = import_fresh(dir, &cfg);
    expect_same_weights(m, b, CAI_DTYPE_F32);
    cai_model_free(b);
    cai_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ errors */

static void fresh_export(const char *name, const cai_model_config *cfg, uint64_t shard, char *dir, size_t cap) {
    cai_model_free(exported(name, cfg, 14, shard, dir, cap));
}

START_TEST(missing_and_misshapen_tensors_name_file_and_tensor) {
    char dir[512], f[600];
    cai_hf_t *h = NULL;
    cai_model_config cfg = tiny_llama(0);

    fresh_export("err_missing", &cfg, 0, dir, sizeof dir);
    file_in(f, sizeof f, dir, "model.safetensors");
    file_copy c;
    copy_open(&c, f);
    copy_drop(&c, "model.layers.1.mlp.up_proj.weight");
    copy_write(&c, f);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "model.layers.1.mlp.up_proj.weight", "h.1.mlp.up.weight", f,
               "missing");

    fresh_export("err_shape", &cfg, 0, dir, sizeof dir);
    file_in(f, sizeof f, dir, "model.safetensors");
    copy_open(&c, f);
    int k = copy_find(&c, "model.layers.0.self_attn.k_proj.weight");
    c.t[k].shape[0] = 8; /* one kv head instead of two: [8, 32] holds the first 256 floats */
    c.t[k].shape[1] = 32;
    copy_write(&c, f);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, f, "model.layers.0.self_attn.k_proj.weight", "[8,32]", "[16,32]",
               "num_key_value_heads=2");

    /* the config is what disagrees: more layers than the file holds */
    fresh_export("err_layers", &cfg, 0, dir, sizeof dir);
    edit_config(dir, "num_hidden_layers", "3");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "model.layers.2.", "missing");
    /* fewer: the extra layer's tensors are unexpected */
    edit_config(dir, "num_hidden_layers", "1");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "unexpected tensor", "model.layers.1.");

    /* a dtype colossal cannot compute with */
    fresh_export("err_dtype", &cfg, 0, dir, sizeof dir);
    file_in(f, sizeof f, dir, "model.safetensors");
    copy_open(&c, f);
    k = copy_find(&c, "model.norm.weight");
    c.t[k].dtype = CAI_DTYPE_I32;
    copy_write(&c, f);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_UNSUPPORTED, f, "model.norm.weight", "I32");

    /* weights that are not finite: opening succeeds (values are not read),
     * importing refuses, naming tensor, file and element */
    fresh_export("err_nan", &cfg, 0, dir, sizeof dir);
    file_in(f, sizeof f, dir, "model.safetensors");
    copy_open(&c, f);
    k = copy_find(&c, "model.layers.1.mlp.down_proj.weight");
    const uint64_t nel = c.t[k].shape[0] * c.t[k].shape[1];
    float *w = malloc(nel * sizeof *w);
    ck_assert_ptr_nonnull(w);
    memcpy(w, c.t[k].data, nel * sizeof *w);
    w[37] = NAN;
    w[40] = INFINITY;
    c.t[k].data = w;
    copy_write(&c, f);
    OK(cai_hf_open(&h, dir));
    cai_model_config nc = *cai_hf_config(h);
    cai_model_t *nm = make_model(&nc, NULL);
    EXPECT_ERR(cai_hf_import_model(h, nm), CAI_ERR_FORMAT, "tensor 'model.layers.1.mlp.down_proj.weight'", f,
               "holds 2 values that are not finite (the first, element 37, is nan)");
    cai_model_free(nm);
    cai_hf_close(h);
    h = NULL;
    free(w);

    /* a truncated file: the safetensors reader names it */
    fresh_export("err_trunc", &cfg, 0, dir, sizeof dir);
    file_in(f, sizeof f, dir, "model.safetensors");
    ck_assert_int_eq(truncate(f, 4000), 0);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, f);

    /* no weights at all */
    unlink(f);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_IO, "no weights", dir);
    ck_assert_ptr_null(h);
}
END_TEST

START_TEST(bad_config_json_names_the_key) {
    char dir[512], f[600];
    cai_hf_t *h = NULL;
    cai_model_config g = tiny_gpt2(1);
    fresh_export("cfg_gpt2", &g, 0, dir, sizeof dir);
    file_in(f, sizeof f, dir, "config.json");
    edit_config(dir, "architectures", "[\"BertForMaskedLM\"]");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_UNSUPPORTED, f, "unknown architecture", "BertForMaskedLM");
    edit_config(dir, "architectures", NULL);
    edit_config(dir, "model_type", "\"bert\"");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_UNSUPPORTED, f, "model_type", "bert");
    edit_config(dir, "model_type", "\"llama\"");
    edit_config(dir, "architectures", "[\"GPT2LMHeadModel\"]");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "contradicts");
    edit_config(dir, "model_type", "\"gpt2\"");
    edit_config(dir, "n_embd", NULL);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, f, "\"n_embd\"", "missing");
    edit_config(dir, "n_embd", "\"32\"");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "\"n_embd\"", "integer");
    edit_config(dir, "n_embd", "30"); /* 30 / 4 heads */
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, f, "n_heads");
    edit_config(dir, "n_embd", "32");
    edit_config(dir, "activation_function", "\"relu\"");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_UNSUPPORTED, "activation_function", "relu");
    edit_config(dir, "activation_function", "\"gelu_pytorch_tanh\""); /* the same function */
    OK(cai_hf_open(&h, dir));
    cai_hf_close(h);
    h = NULL;
    write_text(dir, "config.json", "{\"model_type\": \"gpt2\",");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, f, "invalid JSON");

    cai_model_config l = tiny_llama(0);
    fresh_export("cfg_llama", &l, 0, dir, sizeof dir);
    edit_config(dir, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0}");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_UNSUPPORTED, "rope_scaling");
    edit_config(dir, "rope_scaling", "null");
    edit_config(dir, "attention_bias", "true");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_UNSUPPORTED, "attention_bias");
    edit_config(dir, "attention_bias", "false");
    edit_config(dir, "head_dim", "16");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_UNSUPPORTED, "head_dim");
    edit_config(dir, "head_dim", NULL);
    /* optional keys take transformers' defaults */
    edit_config(dir, "rms_norm_eps", NULL);
    edit_config(dir, "num_key_value_heads", "2");
    OK(cai_hf_open(&h, dir));
    ck_assert(cai_hf_config(h)->norm_eps == 1e-6f);
    cai_hf_close(h);
    h = NULL;
    ck_assert_ptr_null(h);
}
END_TEST

START_TEST(broken_index_is_named) {
    char dir[512], f[600], idx[600];
    cai_hf_t *h = NULL;
    cai_model_config cfg = tiny_gpt2(0);
    fresh_export("idx", &cfg, 16000, dir, sizeof dir);
    file_in(idx, sizeof idx, dir, "model.safetensors.index.json");
    json_t *orig = load_json(dir, "model.safetensors.index.json");
    json_t *wm = json_object_get(orig, "weight_map");
    const char *shard1 = json_string_value(json_object_get(wm, "transformer.wte.weight"));
    char shard1_copy[64];
    snprintf(shard1_copy, sizeof shard1_copy, "%s", shard1);
    const char *other = json_string_value(json_object_get(wm, "transformer.ln_f.bias"));
    ck_assert_str_ne(shard1, other);

    /* names a file that is not there */
    json_t *j = json_deep_copy(orig);
    json_object_set_new(json_object_get(j, "weight_map"), "transformer.wte.weight",
                        json_string("model-missing.safetensors"));
    write_json(dir, "model.safetensors.index.json", j);
    json_decref(j);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_IO, "model-missing.safetensors");

    /* lists a tensor under the wrong shard */
    j = json_deep_copy(orig);
    json_object_set_new(json_object_get(j, "weight_map"), "transformer.wte.weight", json_string(other));
    write_json(dir, "model.safetensors.index.json", j);
    json_decref(j);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, idx, "transformer.wte.weight", other);

    /* drops a tensor from the map: the shard holds one the index does not list */
    j = json_deep_copy(orig);
    json_object_del(json_object_get(j, "weight_map"), "transformer.wte.weight");
    write_json(dir, "model.safetensors.index.json", j);
    json_decref(j);
    file_in(f, sizeof f, dir, shard1_copy);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, f, "transformer.wte.weight", "does not list");

    /* a path outside the directory */
    j = json_deep_copy(orig);
    json_object_set_new(json_object_get(j, "weight_map"), "transformer.wte.weight", json_string("../x.safetensors"));
    write_json(dir, "model.safetensors.index.json", j);
    json_decref(j);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "transformer.wte.weight", "same directory");

    /* not JSON */
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": ");
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, idx, "invalid JSON");

    /* restored: opens */
    write_json(dir, "model.safetensors.index.json", orig);
    json_decref(orig);
    OK(cai_hf_open(&h, dir));
    cai_hf_close(h);
}
END_TEST

START_TEST(model_must_match_config) {
    char dir[512];
    cai_model_config cfg = tiny_llama(0);
    fresh_export("mismatch", &cfg, 0, dir, sizeof dir);
    cai_hf_t *h;
    OK(cai_hf_open(&h, dir));
    cai_model_config c = cfg;
    c.n_layers = 3;
    cai_model_t *m = make_model(&c, NULL);
    EXPECT_ERR(cai_hf_import_model(h, m), CAI_ERR_CONFIG, "model.n_layers=3", "num_hidden_layers=2");
    cai_model_free(m);
    c = cfg;
    c.tie_embeddings = 1;
    m = make_model(&c, NULL);
    EXPECT_ERR(cai_hf_import_model(h, m), CAI_ERR_CONFIG, "tie_word_embeddings");
    cai_model_free(m);
    c = tiny_gpt2(1);
    m = make_model(&c, NULL);
    EXPECT_ERR(cai_hf_import_model(h, m), CAI_ERR_CONFIG, "LlamaForCausalLM");
    cai_model_free(m);
    /* vocab padding, seed and the RoPE table length are free */
    c = cfg;
    c.vocab_multiple = 8;
    c.max_seq_len = 12;
    c.seed = 5;
    m = make_model(&c, NULL);
    OK(cai_hf_import_model(h, m));
    cai_model_free(m);
    cai_hf_close(h);
}
END_TEST

/* ------------------------------------------------------------ tokenizer */

START_TEST(tokenizer_files_travel_with_the_model) {
    char tok[512], dir[512], f[600];
    dir_in(tok, sizeof tok, "tokenizer");
    const char *texts[3] = {"the cat sat on the mat", "the dog sat on the log", "a cat and a dog"};
    const char *specials[1] = {"<|endoftext|>"};
    cai_bpe_train_opts o = {280, specials, 1, 1};
    cai_bpe_t *bpe;
    OK(cai_bpe_train(texts, NULL, 3, &o, &bpe));
    OK(cai_bpe_save(bpe, tok));
    int32_t eot;
    OK(cai_bpe_token_id(bpe, "<|endoftext|>", &eot));
    const int vocab = cai_bpe_vocab_size(bpe);
    cai_bpe_free(bpe);

    cai_model_config cfg = tiny_gpt2(1);
    cfg.vocab_size = vocab;
    cai_model_t *m = make_model(&cfg, NULL);
    dir_in(dir, sizeof dir, "with_tok");
    cai_hf_export_options eo = cai_hf_export_options_default();
    eo.tokenizer_dir = tok;
    cai_hf_export_stats s;
    OK(cai_hf_export_model(dir, m, &eo, &s));
    ck_assert_int_eq(s.tokenizer_files, 4); /* vocab.json, merges.txt, tokenizer.json + a tokenizer_config.json */
    const char *files[4] = {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        file_in(f, sizeof f, dir, files[i]);
        ck_assert_msg(access(f, R_OK) == 0, "%s not exported", files[i]);
    }
    char cmd[1400], a[600];
    file_in(a, sizeof a, tok, "merges.txt");
    file_in(f, sizeof f, dir, "merges.txt");
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, f);
    ck_assert(system(cmd) == 0);
    json_t *c = load_json(dir, "config.json");
    expect_int(c, "bos_token_id", eot);
    expect_int(c, "eos_token_id", eot);
    json_decref(c);
    json_t *tc = load_json(dir, "tokenizer_config.json");
    expect_str(tc, "eos_token", "<|endoftext|>");
    expect_str(tc, "tokenizer_class", "GPT2Tokenizer");
    expect_int(tc, "model_max_length", 16);
    json_decref(tc);
    /* the exported tokenizer loads and still knows its special token */
    char vj[600], mt[600];
    file_in(vj, sizeof vj, dir, "vocab.json");
    file_in(mt, sizeof mt, dir, "merges.txt");
    OK(cai_bpe_load(vj, mt, &bpe));
    ck_assert_int_eq(cai_bpe_vocab_size(bpe), vocab);
    cai_bpe_free(bpe);
    cai_model_free(m);

    /* a vocabulary larger than the model's is refused before anything is written */
    cfg.vocab_size = vocab - 1;
    m = make_model(&cfg, NULL);
    dir_in(dir, sizeof dir, "tok_too_big");
    EXPECT_ERR(cai_hf_export_model(dir, m, &eo, NULL), CAI_ERR_CONFIG, "vocab_size", tok);
    file_in(f, sizeof f, dir, "config.json");
    ck_assert_msg(access(f, F_OK) != 0, "a failed export must not leave config.json");
    eo.tokenizer_dir = g_root; /* no tokenizer files there */
    EXPECT_ERR(cai_hf_export_model(dir, m, &eo, NULL), CAI_ERR_IO, "neither tokenizer.json");
    eo.tokenizer_dir = NULL;
    eo.dtype = CAI_DTYPE_I32;
    EXPECT_ERR(cai_hf_export_model(dir, m, &eo, NULL), CAI_ERR_INVALID_ARG, "i32");
    cai_model_free(m);
}
END_TEST

static void remove_tree(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "test_hf: could not remove %s\n", path);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    snprintf(g_root, sizeof g_root, "%s/cai_hf_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_root) || cai_device_init(&g_dev, CAI_DEVICE_HOST, 0, 1) != CAI_OK) {
        perror("test_hf setup");
        MPI_Finalize();
        return 1;
    }
    cai_log_options lo = {CAI_LOG_ERROR, 0, 0, NULL}; /* expected warnings stay quiet */
    cai_log_configure(&lo);
    Suite *s = suite_create("hf");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, mapping_tables_are_the_hf_module_trees);
    tcase_add_test(tc, round_trip_is_bitwise);
    tcase_add_test(tc, gpt2_directory_is_what_transformers_expects);
    tcase_add_test(tc, llama_directory_is_what_transformers_expects);
    tcase_add_test(tc, sharded_export_reads_back_through_the_index);
    tcase_add_test(tc, bf16_and_f16_exports_round_to_nearest_even);
    tcase_add_test(tc, flat_buffer_export_and_import_match_the_model);
    tcase_add_test(tc, pipeline_stage_imports_its_own_layers);
    tcase_add_test(tc, older_checkpoint_layouts_import);
    tcase_add_test(tc, missing_and_misshapen_tensors_name_file_and_tensor);
    tcase_add_test(tc, bad_config_json_names_the_key);
    tcase_add_test(tc, broken_index_is_named);
    tcase_add_test(tc, model_must_match_config);
    tcase_add_test(tc, tokenizer_files_travel_with_the_model);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cai_device_free(g_dev);
    remove_tree(g_root);
    MPI_Finalize();
    return failed ? 1 : 0;
}
