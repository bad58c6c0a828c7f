/* Hugging Face Mixtral interchange (docs/moe.md "Hugging Face Mixtral"): a
 * Llama with MoE blocks exports as MixtralForCausalLM and imports back with
 * bitwise equal weights, logits and loss; the directory's tensor names and
 * shapes are read from the safetensors header itself (not through colossal's
 * reader) and its config.json keys checked; MoE settings Mixtral cannot
 * express and malformed directories are refused naming the field, file and
 * tensor. */
#include "cai_config.h"
#include "colossal/ckpt.h"

#include <check.h>
#include <jansson.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "colossal/model.h"
#include "colossal/moe.h"
#include "colossal/tensor.h"
#include "test_hf_util.h"

static char g_root[256];
static cai_device_t *g_dev;

enum { B = 2, T = 8, V = 37, C = 32, E = 4, F = 24, L = 2 };

/* 2 layers, GQA, E = 4 experts of F = 24 (the dense ffn_hidden 48 differs:
 * Mixtral's intermediate_size is the expert's). */
static cai_model_config tiny_mixtral(void) {
    cai_model_config c = cai_model_config_default(CAI_MODEL_LLAMA);
    c.vocab_size = V;
    c.vocab_multiple = 0;
    c.n_layers = L;
    c.d_model = C;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_hidden = 48;
    c.max_seq_len = 16;
    c.rope_theta = 1e6f;
    c.norm_eps = 1e-5f;
    c.tie_embeddings = 0;
    c.seed = 21;
    c.moe = cai_moe_config_default();
    c.moe.n_experts = E;
    c.moe.top_k = 2;
    c.moe.ffn = F;
    c.moe_every = 1;
    return c;
}

static cai_model_t *make_model(const cai_model_config *cfg) {
    cai_model_options o = cai_model_options_default(cfg);
    o.batch = B;
    o.seq_len = T;
    cai_model_t *m = NULL;
    OK(cai_model_create(&m, g_dev, cfg, &o));
    return m;
}

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
            buf[k] = p->ndim == 1 ? 1.0f + 0.2f * z : 0.1f * z;
        }
        OK(cai_device_copy(g_dev, t.data, buf, (size_t)p->numel * sizeof *buf, CAI_COPY_H2D));
        free(buf);
    }
    OK(cai_model_params_updated(m));
}

static void tokens_of(int32_t *tok, int32_t *tgt, uint64_t seed) {
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(cai_philox4x32(seed, 1, (uint64_t)i).v[0] % V);
        tgt[i] = (int32_t)(cai_philox4x32(seed, 2, (uint64_t)i).v[0] % V);
    }
}

/* Loss and the real-vocabulary logits [B*T, V] of one forward. */
static float forward(cai_model_t *m, const int32_t *tok, const int32_t *tgt, float *logits) {
    float loss = 0;
    OK(cai_model_forward(m, tok, tgt, &loss));
    cai_tensor lt;
    OK(cai_model_logits(m, &lt));
    const int64_t Vp = cai_model_padded_vocab(m);
    float *all = malloc((size_t)(B * T * Vp) * sizeof *all);
    OK(cai_device_copy(g_dev, all, lt.data, (size_t)(B * T * Vp) * sizeof *all, CAI_COPY_D2H));
    for (int i = 0; i < B * T; i++) memcpy(logits + (size_t)i * V, all + (size_t)i * Vp, V * sizeof *logits);
    free(all);
    return loss;
}

static void export_to(cai_model_t *m, const char *dir) {
    cai_hf_export_options o = cai_hf_export_options_default();
    cai_hf_export_stats s;
    OK(cai_hf_export_model(dir, m, &o, &s));
}

static void dir_in(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_root, name);
    mkdir(buf, 0755);
}

/* ------------------------------------------------------------ round trip */

START_TEST(round_trip_gives_identical_logits_and_loss) {
    /* capacity routing is a training-time choice and exports (transformers
     * runs dropless); the forward compared here is dropless on both sides */
    for (int capacity = 0; capacity < 2; capacity++) {
        cai_model_config c = tiny_mixtral();
        char dir[512];
        dir_in(dir, sizeof dir, capacity ? "rt_capacity" : "rt");
        cai_model_t *a = make_model(&c);
        perturb(a, 5 + (uint64_t)capacity);
        export_to(a, dir);
        if (capacity) {
            /* the exporting model itself trained with capacity routing */
            c.moe.routing = CAI_MOE_CAPACITY;
            c.moe.capacity_factor = 0.5f;
            cai_model_t *cap = make_model(&c);
            perturb(cap, 6);
            export_to(cap, dir);
            cai_model_free(cap);
        }
        cai_hf_t *h;
        OK(cai_hf_open(&h, dir));
        cai_model_config ic = *cai_hf_config(h);
        ck_assert_int_eq(ic.moe.n_experts, E);
        ck_assert_int_eq(ic.moe.top_k, 2);
        ck_assert_int_eq(ic.moe.ffn, F);
        ck_assert_int_eq(ic.moe.router, CAI_MOE_ROUTER_SOFTMAX);
        ck_assert_int_eq(ic.moe.norm_topk, 1);
        ck_assert_int_eq(ic.moe.routing, CAI_MOE_DROPLESS);
        ck_assert_int_eq(ic.moe.n_shared, 0);
        ck_assert(ic.moe.aux_coef == c.moe.aux_coef);
        ck_assert(ic.norm_eps == c.norm_eps && ic.rope_theta == c.rope_theta);
        ic.seed = 999; /* a different init: the import must overwrite every weight */
        cai_model_t *b = make_model(&ic);
        OK(cai_hf_import_model(h, b));
        cai_hf_close(h);
        /* every parameter bitwise */
        const cai_registry_t *ra = cai_model_registry(a), *rb = cai_model_registry(b);
        ck_assert_int_eq(cai_registry_count(ra), cai_registry_count(rb));
        if (!capacity)
            for (int i = 0; i < cai_registry_count(ra); i++) {
                const cai_param_info *p = cai_registry_param(ra, i);
                cai_tensor x, y;
                OK(cai_model_param(a, p->name, &x, NULL));
                OK(cai_model_param(b, p->name, &y, NULL));
                /* vocabulary tensors: the real rows (padding is not exported) */
                const size_t n = p->spec.vocab_parallel ? (size_t)V * C : (size_t)p->numel;
                ck_assert_msg(memcmp(x.data, y.data, n * sizeof(float)) == 0, "%s differs", p->name);
            }
        if (!capacity) {
            int32_t tok[B * T], tgt[B * T];
            tokens_of(tok, tgt, 3);
            float *la = malloc(B * T * V * sizeof *la), *lb = malloc(B * T * V * sizeof *lb);
            const float loss_a = forward(a, tok, tgt, la), loss_b = forward(b, tok, tgt, lb);
            ck_assert_msg(loss_a == loss_b, "loss %.9g vs %.9g", (double)loss_a, (double)loss_b);
            ck_assert_msg(memcmp(la, lb, B * T * V * sizeof *la) == 0, "logits differ");
            printf("test_hf_mixtral: round trip loss %.7f == %.7f, %d logits bitwise equal\n", (double)loss_a,
                   (double)loss_b, B * T * V);
            free(la);
            free(lb);
        }
        cai_model_free(a);
        cai_model_free(b);
    }
}
END_TEST

/* ------------------------------------------------------------ structure */

/* The safetensors header, parsed here: 8-byte little-endian length + JSON. */
static json_t *st_header(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    unsigned char len8[8];
    ck_assert_int_eq(fread(len8, 1, 8, f), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    char *text = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(text, 1, (size_t)n, f), n);
    text[n] = 0;
    fclose(f);
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    free(text);
    ck_assert_msg(j != NULL, "%s: header is not JSON: %s", path, err.text);
    return j;
}

static void expect_tensor(json_t *hdr, const char *name, int64_t d0, int64_t d1) {
    json_t *e = json_object_get(hdr, name);
    ck_assert_msg(e != NULL, "tensor %s missing", name);
    ck_assert_str_eq(json_string_value(json_object_get(e, "dtype")), "F32");
    json_t *sh = json_object_get(e, "shape");
    ck_assert_int_eq(json_array_size(sh), d1 ? 2 : 1);
    ck_assert_int_eq(json_integer_value(json_array_get(sh, 0)), d0);
    if (d1) ck_assert_int_eq(json_integer_value(json_array_get(sh, 1)), d1);
}

START_TEST(export_names_shapes_and_config_are_mixtrals) {
    cai_model_config c = tiny_mixtral();
    char dir[512], path[600];
    dir_in(dir, sizeof dir, "layout");
    cai_model_t *m = make_model(&c);
    perturb(m, 8);
    export_to(m, dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    json_t *hdr = st_header(path);
    int want = 0;
    char n[160];
    expect_tensor(hdr, "model.embed_tokens.weight", V, C), want++;
    expect_tensor(hdr, "lm_head.weight", V, C), want++;
    expect_tensor(hdr, "model.norm.weight", C, 0), want++;
    for (int l = 0; l < L; l++) {
        static const char *const attn[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        const int rows[4] = {C, C / 2, C / 2, C};
        for (int k = 0; k < 4; k++) {
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.weight", l, attn[k]);
            expect_tensor(hdr, n, rows[k], C), want++;
        }
        snprintf(n, sizeof n, "model.layers.%d.input_layernorm.weight", l);
        expect_tensor(hdr, n, C, 0), want++;
        snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm.weight", l);
        expect_tensor(hdr, n, C, 0), want++;
        snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.gate.weight", l);
        expect_tensor(hdr, n, E, C), want++;
        for (int e = 0; e < E; e++) {
            snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
            expect_tensor(hdr, n, F, C), want++;
            snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
            expect_tensor(hdr, n, F, C), want++;
            snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
            expect_tensor(hdr, n, C, F), want++;
        }
    }
    ck_assert_int_eq((int)json_object_size(hdr) - (json_object_get(hdr, "__metadata__") ? 1 : 0), want);
    /* values: expert 3 of layer 1's w2 is colossal's proj weight as is */
    cai_safetensors_t *st;
    OK(cai_safetensors_open(&st, path));
    const cai_st_entry *t;
    OK(cai_safetensors_get(st, "model.layers.1.block_sparse_moe.experts.3.w2.weight", &t));
    cai_tensor w;
    OK(cai_model_param(m, "h.1.moe.experts.3.proj.weight", &w, NULL));
    ck_assert(memcmp(t->data, w.data, (size_t)C * F * sizeof(float)) == 0);
    OK(cai_safetensors_get(st, "model.layers.0.block_sparse_moe.gate.weight", &t));
    OK(cai_model_param(m, "h.0.moe.router.weight", &w, NULL));
    ck_assert(memcmp(t->data, w.data, (size_t)E * C * sizeof(float)) == 0);
    cai_safetensors_close(st);
    json_decref(hdr);

    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t err;
    json_t *cj = json_load_file(path, 0, &err);
    ck_assert(cj != NULL);
    ck_assert_str_eq(json_string_value(json_object_get(cj, "model_type")), "mixtral");
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(cj, "architectures"), 0)), "MixtralForCausalLM");
    ck_assert_int_eq(json_integer_value(json_object_get(cj, "num_local_experts")), E);
    ck_assert_int_eq(json_integer_value(json_object_get(cj, "num_experts_per_tok")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(cj, "intermediate_size")), F);
    ck_assert_int_eq(json_integer_value(json_object_get(cj, "hidden_size")), C);
    ck_assert_int_eq(json_integer_value(json_object_get(cj, "num_key_value_heads")), 2);
    ck_assert(json_real_value(json_object_get(cj, "router_aux_loss_coef")) == (double)0.01f ||
              json_real_value(json_object_get(cj, "router_aux_loss_coef")) == 0.01);
    ck_assert(json_real_value(json_object_get(cj, "rope_theta")) == 1e6);
    ck_assert(json_is_null(json_object_get(cj, "sliding_window")));
    ck_assert(json_is_false(json_object_get(cj, "output_router_logits")));
    json_decref(cj);
    cai_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ refusals */

START_TEST(what_mixtral_cannot_express_is_refused) {
    cai_hf_map_t *map = NULL;
    char *text = NULL;
    cai_model_config c = tiny_mixtral();
    c.moe.n_shared = 1;
    EXPECT_ERR(cai_hf_map_create(&map, &c), CAI_ERR_UNSUPPORTED, "moe.n_shared=1", "shared experts");
    EXPECT_ERR(cai_hf_config_json(&c, CAI_DTYPE_F32, -1, -1, &text), CAI_ERR_UNSUPPORTED, "moe.n_shared");
    c = tiny_mixtral();
    c.moe_every = 2;
    EXPECT_ERR(cai_hf_map_create(&map, &c), CAI_ERR_UNSUPPORTED, "moe.every=2");
    c = tiny_mixtral();
    c.moe.router = CAI_MOE_ROUTER_SIGMOID;
    EXPECT_ERR(cai_hf_map_create(&map, &c), CAI_ERR_UNSUPPORTED, "moe.router=sigmoid", "moe.router=softmax");
    c.moe.router = CAI_MOE_ROUTER_TOPK_SOFTMAX;
    EXPECT_ERR(cai_hf_map_create(&map, &c), CAI_ERR_UNSUPPORTED, "moe.router=topk_softmax");
    c.moe.router = CAI_MOE_ROUTER_SOFTMAX;
    c.moe.norm_topk = 0;
    EXPECT_ERR(cai_hf_map_create(&map, &c), CAI_ERR_UNSUPPORTED, "moe.norm_topk=0");
    ck_assert(map == NULL && text == NULL);
    /* the export of such a model writes nothing */
    c = tiny_mixtral();
    c.moe.n_shared = 1;
    cai_model_t *m = make_model(&c);
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/shared_refused", g_root);
    EXPECT_ERR(cai_hf_export_model(dir, m, NULL, NULL), CAI_ERR_UNSUPPORTED, "moe.n_shared");
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    ck_assert(stat(path, &sb) != 0);
    cai_model_free(m);
}
END_TEST

/* A copy of directory `from` named `name` whose config.json has `key` set
 * to the JSON `value` (NULL: removed). */
static void edited(const char *from, const char *name, const char *key, const char *value, char *dir, size_t cap) {
    dir_in(dir, cap, name);
    char cmd[1400], path[600];
    snprintf(cmd, sizeof cmd, "cp '%s'/* '%s'/", from, dir);
    ck_assert(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    ck_assert(j != NULL);
    if (value) ck_assert(json_object_set_new(j, key, json_loads(value, JSON_DECODE_ANY, &err)) == 0);
    else json_object_del(j, key);
    ck_assert(json_dump_file(j, path, JSON_INDENT(2)) == 0);
    json_decref(j);
}

START_TEST(malformed_directories_are_refused) {
    cai_model_config c = tiny_mixtral();
    char base[512], dir[512];
    dir_in(base, sizeof base, "good");
    cai_model_t *m = make_model(&c);
    export_to(m, base);
    cai_hf_t *h = NULL;
    edited(base, "no_experts", "num_local_experts", NULL, dir, sizeof dir);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "no_experts/config.json", "\"num_local_experts\" is missing");
    edited(base, "topk_big", "num_experts_per_tok", "5", dir, sizeof dir);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "topk_big/config.json", "\"num_experts_per_tok\": 5", "[1, 4]");
    edited(base, "ffn_wrong", "intermediate_size", "20", dir, sizeof dir);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "ffn_wrong/model.safetensors",
               "'model.layers.0.block_sparse_moe.experts.0.w1.weight' has shape [24,32]", "implies [20,32]",
               "num_local_experts=4");
    edited(base, "more_experts", "num_local_experts", "5", dir, sizeof dir);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "'model.layers.0.block_sparse_moe.gate.weight' has shape [4,32]",
               "implies [5,32]");
    edited(base, "fewer_experts", "num_local_experts", "3", dir, sizeof dir);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "'model.layers.0.block_sparse_moe.gate.weight' has shape [4,32]",
               "implies [3,32]");
    edited(base, "window", "sliding_window", "4", dir, sizeof dir);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_UNSUPPORTED, "window/config.json", "\"sliding_window\": 4");
    edited(base, "contradiction", "model_type", "\"llama\"", dir, sizeof dir);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "model_type \"llama\" contradicts architectures (mixtral)");
    edited(base, "aux_bad", "router_aux_loss_coef", "-1", dir, sizeof dir);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "\"router_aux_loss_coef\"");
    ck_assert(h == NULL);
    /* a dense Llama config over Mixtral weights: the experts are unexpected */
    edited(base, "as_llama", "model_type", "\"llama\"", dir, sizeof dir);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    json_object_set_new(j, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
    EXPECT_ERR(cai_hf_open(&h, dir), CAI_ERR_FORMAT, "model.layers.0.mlp.gate_proj.weight", "is missing");
    /* importing into a model with other experts names the field */
    OK(cai_hf_open(&h, base));
    cai_model_config other = tiny_mixtral();
    other.moe.n_experts = 2;
    other.moe.top_k = 1;
    cai_model_t *o = make_model(&other);
    EXPECT_ERR(cai_hf_import_model(h, o), CAI_ERR_CONFIG, "model.moe.n_experts=2", "num_local_experts=4");
    cai_model_free(o);
    cai_hf_close(h);
    cai_model_free(m);
}
END_TEST

static void remove_tree(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "test_hf_mixtral: could not remove %s\n", path);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    snprintf(g_root, sizeof g_root, "%s/cai_hfmx_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_root) || cai_device_init(&g_dev, CAI_DEVICE_HOST, 0, 1) != CAI_OK) {
        perror("test_hf_mixtral setup");
        MPI_Finalize();
        return 1;
    }
    cai_log_options lo = {CAI_LOG_ERROR, 0, 0, NULL};
    cai_log_configure(&lo);
    Suite *s = suite_create("hf_mixtral");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, round_trip_gives_identical_logits_and_loss);
    tcase_add_test(tc, export_names_shapes_and_config_are_mixtrals);
    tcase_add_test(tc, what_mixtral_cannot_express_is_refused);
    tcase_add_test(tc, malformed_directories_are_refused);
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
