/* Whole models: configuration and registration, gradients against finite
 * differences (tiny GPT-2 and tiny Llama with GQA, vocabularies that are not
 * multiples of 128), activation checkpointing (bitwise), pipeline stage
 * ranges chained by hand against the single-stage model, overfitting a tiny
 * batch, and bf16/f16 mixed precision tracking the f32 run. */
#include "cai_config.h"
#include "colossal/model.h"
#include "colossal/moe.h"
#include "colossal/ops.h"
#include "colossal/optim.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cai_device_t *dev;

/* cai_train_step over the single-process driver. */
static cai_status local_step(cai_model_t *m, cai_optim_t *o, const int32_t *tok, const int32_t *tgt, int n_micro,
                             cai_step_stats *st) {
    cai_step_driver d;
    CAI_CALL(cai_local_driver(m, o, &d));
    return cai_train_step(&d, NULL, NULL, tok, tgt, n_micro, st);
}

#define OK(expr)                                                                   \
    do {                                                                           \
        cai_status st_ = (expr);                                                   \
        ck_assert_msg(st_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

static cai_model_config tiny_gpt2(void) {
    cai_model_config c = cai_model_config_default(CAI_MODEL_GPT2);
    c.vocab_size = 50;
    c.n_layers = 2;
    c.d_model = 12;
    c.n_heads = 3;
    c.n_kv_heads = 0;
    c.ffn_hidden = 0;
    c.max_seq_len = 9;
    c.seed = 7;
    return c;
}

static cai_model_config tiny_llama(void) {
    cai_model_config c = cai_model_config_default(CAI_MODEL_LLAMA);
    c.vocab_size = 37;
    c.n_layers = 2;
    c.d_model = 16;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_hidden = 24;
    c.max_seq_len = 8;
    c.rope_theta = 500.0f;
    c.seed = 11;
    return c;
}

static cai_model_t *make_model(const cai_model_config *c, int B, int T) {
    cai_model_options o = cai_model_options_default(c);
    o.batch = B;
    o.seq_len = T;
    cai_model_t *m = NULL;
    OK(cai_model_create(&m, dev, c, &o));
    return m;
}

/* Deterministic tokens in [0, V) and next-token targets with a few ignored. */
static void make_batch(int B, int T, int V, uint64_t seed, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(cai_rng_uniform(seed, 1, (uint64_t)i) * (float)V) % V;
        tgt[i] = (int32_t)(cai_rng_uniform(seed, 2, (uint64_t)i) * (float)V) % V;
    }
    tgt[1] = CAI_IGNORE_INDEX;
    if (B * T > 5) tgt[B * T - 2] = CAI_IGNORE_INDEX;
    tgt[B * T - 1] = V - 1; /* the last real id, next to the padding */
}

/* ------------------------------------------------------------ config + registry */

START_TEST(config_defaults_and_errors) {
    cai_model_config c = tiny_llama(), r;
    c.ffn_hidden = 0;
    c.norm_eps = 0;
    c.vocab_multiple = 0;
    OK(cai_model_config_resolve(&c, &r));
    ck_assert_int_eq(r.ffn_hidden, 256); /* 8*16/3 = 42 rounded up to 256 */
    ck_assert_float_eq(r.norm_eps, 1e-5f);
    ck_assert_int_eq(cai_model_config_padded_vocab(&r), 128);
    cai_model_config g = tiny_gpt2();
    OK(cai_model_config_resolve(&g, &r));
    ck_assert_int_eq(r.ffn_hidden, 48);
    ck_assert_int_eq(r.n_kv_heads, 3);
    ck_assert_int_eq(r.tie_embeddings, 1);
    g.vocab_size = 300;
    g.vocab_multiple = 64;
    OK(cai_model_config_resolve(&g, &r));
    ck_assert_int_eq(cai_model_config_padded_vocab(&r), 320);

    c = tiny_llama();
    c.n_kv_heads = 3;
    ck_assert_int_eq(cai_model_config_resolve(&c, &r), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "n_kv_heads=3 must divide model.n_heads=4"));
    c = tiny_llama();
    c.d_model = 12; /* head_dim 3: RoPE needs pairs */
    ck_assert_int_eq(cai_model_config_resolve(&c, &r), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "even head_dim"));
    c = tiny_gpt2();
    c.d_model = 13;
    ck_assert_int_eq(cai_model_config_resolve(&c, &r), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "not a multiple of model.n_heads=3"));
    c = tiny_gpt2();
    c.param_dtype = CAI_DTYPE_I32;
    ck_assert_int_eq(cai_model_config_resolve(&c, &r), CAI_ERR_CONFIG);
    c = tiny_gpt2();
    cai_model_options o = cai_model_options_default(&c);
    o.seq_len = 10;
    cai_model_t *m = NULL;
    ck_assert_int_eq(cai_model_create(&m, dev, &c, &o), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "max_seq_len=9"));
    o = cai_model_options_default(&c);
    o.view.tp_size = 2; /* without the mesh whose tp axis the layers would use */
    ck_assert_int_eq(cai_model_create(&m, dev, &c, &o), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "tp=2 needs the mesh"));
    ck_assert_ptr_null(m);
    o = cai_model_options_default(&c);
    o.view.ep_size = 2; /* experts to split, but a dense model */
    ck_assert_int_eq(cai_model_create(&m, dev, &c, &o), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "mesh.ep=2 splits experts, but the model has none"));
    ck_assert_ptr_null(m);
    cai_model_family f;
    OK(cai_model_family_parse("llama", &f));
    ck_assert_int_eq(f, CAI_MODEL_LLAMA);
    ck_assert_int_eq(cai_model_family_parse("bert", &f), CAI_ERR_CONFIG);
    cai_error_clear();
}
END_TEST

/* The expected parameter set, written out independently of the registration code. */
static int expected_names(const cai_model_config *c, char names[][CAI_PARAM_NAME_MAX], uint64_t *numel) {
    int n = 0, gpt2 = c->family == CAI_MODEL_GPT2;
    uint64_t C = (uint64_t)c->d_model, V = (uint64_t)((c->vocab_size + 127) / 128 * 128);
    uint64_t D = C / (uint64_t)c->n_heads, kv = (uint64_t)(c->n_kv_heads ? c->n_kv_heads : c->n_heads);
    uint64_t W = ((uint64_t)c->n_heads + 2 * kv) * D, F = (uint64_t)c->ffn_hidden;
    uint64_t total = V * C * 2 + (gpt2 ? (uint64_t)c->max_seq_len * C : 0);
    snprintf(names[n++], CAI_PARAM_NAME_MAX, "wte.weight");
    if (gpt2) snprintf(names[n++], CAI_PARAM_NAME_MAX, "wpe.weight");
    for (int l = 0; l < c->n_layers; l++) {
        const char *g[] = {"ln_1.weight",      "ln_1.bias",      "attn.qkv.weight", "attn.qkv.bias",
                           "attn.proj.weight", "attn.proj.bias", "ln_2.weight",     "ln_2.bias",
                           "mlp.fc.weight",    "mlp.fc.bias",    "mlp.proj.weight", "mlp.proj.bias"};
        const char *ll[] = {"ln_1.weight",   "attn.qkv.weight", "attn.proj.weight", "ln_2.weight",
                            "mlp.fc.weight", "mlp.up.weight",   "mlp.proj.weight"};
        int k = gpt2 ? 12 : 7;
        for (int i = 0; i < k; i++) snprintf(names[n++], CAI_PARAM_NAME_MAX, "h.%d.%s", l, gpt2 ? g[i] : ll[i]);
        total += W * C + C * (uint64_t)c->n_heads * D + (gpt2 ? 2 : 3) * F * C + 2 * C;
        if (gpt2) total += W + C + F + C + 2 * C;
    }
    snprintf(names[n++], CAI_PARAM_NAME_MAX, "ln_f.weight");
    total += C;
    if (gpt2) {
        snprintf(names[n++], CAI_PARAM_NAME_MAX, "ln_f.bias");
        total += C;
    }
    snprintf(names[n++], CAI_PARAM_NAME_MAX, "lm_head.weight");
    *numel = total;
    return n;
}

START_TEST(registration_names_every_parameter_once) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++) {
        cai_model_t *m = make_model(&cfgs[k], 1, 4);
        const cai_registry_t *reg = cai_model_registry(m);
        char names[64][CAI_PARAM_NAME_MAX];
        uint64_t numel = 0;
        int n = expected_names(cai_model_config_of(m), names, &numel);
        ck_assert_int_eq(cai_registry_count(reg), n);
        for (int i = 0; i < n; i++) {
            const cai_param_info *p = cai_registry_param(reg, i);
            ck_assert_str_eq(p->name, names[i]);
            int is_vec = p->ndim == 1;
            ck_assert_int_eq(p->spec.weight_decay, !is_vec); /* no decay on norms and biases */
            if (strstr(p->name, "attn.qkv")) ck_assert_int_eq(p->spec.qkv.n_kv_heads, k ? 2 : 3);
            if (strstr(p->name, "proj.weight")) {
                ck_assert_int_eq(p->spec.tp_split_dim, 1);                                  /* row parallel */
                ck_assert_float_eq_tol(cai_registry_init_std(reg, i), 0.02f / 2.0f, 1e-7f); /* 1/sqrt(2*2) */
            }
            if (strstr(p->name, "qkv.weight") || strstr(p->name, "fc.weight") || strstr(p->name, "up.weight"))
                ck_assert_int_eq(p->spec.tp_split_dim, 0); /* column parallel */
            if (strstr(p->name, "qkv.weight")) ck_assert_float_eq_tol(cai_registry_init_std(reg, i), 0.02f, 1e-7f);
        }
        ck_assert_uint_eq(cai_registry_global_numel(reg), numel);
        const cai_param_info *wte = cai_registry_param(reg, cai_registry_find(reg, "wte.weight"));
        const cai_param_info *head = cai_registry_param(reg, cai_registry_find(reg, "lm_head.weight"));
        ck_assert_int_eq(wte->spec.vocab_parallel, 1);
        ck_assert_int_eq(wte->shape[0], 128);
        ck_assert_int_eq(head->tie_primary == wte->index, k == 0); /* GPT-2 tied, Llama not */
        /* Tied: the lm_head copy starts equal to wte. */
        cai_tensor a, b;
        OK(cai_model_param(m, "wte.weight", &a, NULL));
        OK(cai_model_param(m, "lm_head.weight", &b, NULL));
        ck_assert_int_eq(memcmp(a.data, b.data, cai_tensor_nbytes(&a)) == 0, k == 0);
        cai_model_free(m);
    }
}
END_TEST

/* ------------------------------------------------------------ gradients */

typedef struct {
    cai_model_t *m;
    const int32_t *tok, *tgt;
} loss_ctx;

static double model_loss(loss_ctx *c) {
    float l = 0;
    OK(cai_model_params_updated(c->m));
    OK(cai_model_forward(c->m, c->tok, c->tgt, &l));
    return l;
}

/* Mean cross-entropy recomputed in double from the model's padded logits. */
static double loss_from_logits(cai_model_t *m, const int32_t *tgt, int n, int V) {
    cai_tensor lg;
    OK(cai_model_logits(m, &lg));
    int64_t Vp = lg.shape[2];
    ck_assert_int_eq(Vp, cai_model_padded_vocab(m));
    const float *x = lg.data;
    double sum = 0;
    int valid = 0;
    for (int i = 0; i < n; i++) {
        if (tgt[i] == CAI_IGNORE_INDEX) continue;
        const float *row = x + (int64_t)i * Vp;
        double mx = -1e300, se = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, row[v]);
        for (int v = 0; v < V; v++) se += exp(row[v] - mx);
        sum += mx + log(se) - row[tgt[i]];
        valid++;
    }
    return sum / valid;
}

static void check_model_fd(cai_model_config cfg, int B, int T) {
    cfg.init_std = 0.3f; /* gradients well above the f32 noise of the loss */
    cai_model_t *m = make_model(&cfg, B, T);
    int32_t tok[64], tgt[64];
    make_batch(B, T, cfg.vocab_size, 3, tok, tgt);
    float loss = 0;
    OK(cai_model_zero_grad(m));
    OK(cai_model_forward(m, tok, tgt, &loss));
    ck_assert_double_eq_tol(loss, loss_from_logits(m, tgt, B * T, cfg.vocab_size), 1e-5);
    OK(cai_model_backward(m, 1.0f));
    loss_ctx ctx = {m, tok, tgt};
    const cai_registry_t *reg = cai_model_registry(m);
    int64_t Vp = cai_model_padded_vocab(m);
    int checked = 0;
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        cai_tensor w, g;
        OK(cai_model_param(m, p->name, &w, &g));
        float *wp = w.data;
        const float *gp = g.data;
        int64_t n = cai_tensor_numel(&w);
        int tied_copy = p->tie_primary != i;
        if (strcmp(p->name, "wte.weight") == 0 || strcmp(p->name, "lm_head.weight") == 0) {
            /* Padding rows: no token reaches them and their logits are masked. */
            for (int64_t k = (int64_t)cfg.vocab_size * cfg.d_model; k < Vp * cfg.d_model; k++)
                ck_assert_msg(gp[k] == 0.0f, "%s padding grad [%lld] = %g", p->name, (long long)k, gp[k]);
        }
        if (tied_copy) {
            for (int64_t k = 0; k < n; k++) ck_assert(gp[k] == 0.0f); /* accumulated into wte */
            continue;
        }
        /* Six samples per parameter; for the embeddings pick rows of tokens in the batch. */
        for (int s = 0; s < 6; s++) {
            int64_t k = (int64_t)(cai_rng_uniform(5, (uint64_t)i, (uint64_t)s) * (float)n) % n;
            if (strcmp(p->name, "wte.weight") == 0) k = (int64_t)tok[(s * 5) % (B * T)] * cfg.d_model + s % cfg.d_model;
            float save = wp[k];
            const float eps = 1e-2f;
            wp[k] = save + eps;
            double lp = model_loss(&ctx);
            wp[k] = save - eps;
            double lm = model_loss(&ctx);
            wp[k] = save;
            double fd = (lp - lm) / (2.0 * eps);
            double tol = 3e-4 + 2e-2 * fabs(fd);
            ck_assert_msg(fabs(fd - gp[k]) <= tol, "%s %s[%lld]: analytic %.7g vs finite difference %.7g",
                          cai_model_family_name(cfg.family), p->name, (long long)k, (double)gp[k], fd);
            checked++;
        }
    }
    ck_assert_int_gt(checked, 60);
    OK(cai_model_params_updated(m));
    cai_model_free(m);
}

START_TEST(gpt2_gradients_match_finite_differences) { check_model_fd(tiny_gpt2(), 2, 7); }
END_TEST

START_TEST(llama_gqa_gradients_match_finite_differences) { check_model_fd(tiny_llama(), 2, 5); }
END_TEST

START_TEST(forward_rejects_bad_input) {
    cai_model_config c = tiny_gpt2();
    cai_model_t *m = make_model(&c, 1, 4);
    int32_t tok[4] = {1, 2, 50, 3}, tgt[4] = {1, 2, 3, 4};
    ck_assert_int_eq(cai_model_forward(m, tok, tgt, NULL), CAI_ERR_INVALID_ARG);
    tok[2] = 2;
    tgt[3] = 50; /* a padding id is not a valid target */
    ck_assert_int_ne(cai_model_forward(m, tok, tgt, NULL), CAI_OK);
    ck_assert_int_eq(cai_model_backward(m, 1.0f), CAI_ERR_INVALID_ARG);
    tgt[3] = CAI_IGNORE_INDEX;
    float loss = -1;
    OK(cai_model_forward(m, tok, tgt, &loss));
    OK(cai_model_backward(m, 1.0f));
    ck_assert_int_eq(cai_model_backward(m, 1.0f), CAI_ERR_INVALID_ARG); /* once per forward */
    for (int i = 0; i < 4; i++) tgt[i] = CAI_IGNORE_INDEX;
    OK(cai_model_forward(m, tok, tgt, &loss));
    ck_assert_float_eq(loss, 0.0f); /* nothing to average: zero loss and zero gradient */
    cai_error_clear();
    cai_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ checkpointing */

/* fused: cai_model_forward_train (the loss gradient made with the loss). */
static void grads_of_scaled(cai_model_config c, int ckpt, int fused, float scale, const int32_t *tok,
                            const int32_t *tgt, float *loss, float **g, size_t *n) {
    c.activation_checkpointing = ckpt;
    cai_model_t *m = make_model(&c, 2, 6);
    OK(cai_model_zero_grad(m));
    if (fused) OK(cai_model_forward_train(m, tok, tgt, scale, loss));
    else OK(cai_model_forward(m, tok, tgt, loss));
    OK(cai_model_backward(m, scale));
    cai_tensor grads;
    cai_model_flat(m, NULL, &grads, NULL);
    *n = (size_t)cai_tensor_numel(&grads);
    *g = malloc(*n * sizeof(float));
    memcpy(*g, grads.data, *n * sizeof(float));
    cai_model_free(m);
}

static void grads_of(cai_model_config c, int ckpt, const int32_t *tok, const int32_t *tgt, float *loss, float **g,
                     size_t *n) {
    grads_of_scaled(c, ckpt, 0, 1.0f, tok, tgt, loss, g, n);
}

/* cai_model_forward_train computes the loss gradient with the loss (one
 * pass over the logits): the same loss and gradients, bit for bit, as
 * forward + backward; the logits are gone afterwards, and a backward with
 * another scale is refused. */
/* Hooks: every event of every unit reaches each hook, in the order they
 * were added; an error from one stops the pass; removal and the limits. */
typedef struct {
    int id, *log, *n, fail_at;
} hook_rec;

static cai_status record_hook(void *ctx, cai_model_t *m, cai_model_event ev, int unit) {
    (void)m;
    hook_rec *r = ctx;
    const int k = (*r->n)++;
    if (k < 256) r->log[k] = r->id * 1000 + unit * 10 + (int)ev;
    if (r->fail_at >= 0 && unit == r->fail_at && ev == CAI_MODEL_PRE_BACKWARD)
        return CAI_ERROR(CAI_ERR_INTERNAL, "hook %d stops unit %d", r->id, unit);
    return CAI_OK;
}

START_TEST(hooks_run_in_order_and_stop_the_pass) {
    cai_model_config c = tiny_gpt2();
    cai_model_t *m = make_model(&c, 2, 6);
    int log[256], n = 0;
    hook_rec a = {1, log, &n, -1}, b = {2, log, &n, -1};
    OK(cai_model_add_hook(m, record_hook, &a));
    OK(cai_model_add_hook(m, record_hook, &b));
    ck_assert_int_eq(cai_model_add_hook(m, record_hook, &a), CAI_ERR_INVALID_ARG);
    int32_t tok[12], tgt[12];
    make_batch(2, 6, c.vocab_size, 13, tok, tgt);
    OK(cai_model_forward(m, tok, tgt, NULL));
    OK(cai_model_backward(m, 1.0f));
    const int units = cai_model_unit_count(m);
    ck_assert_int_eq(n, 2 * 4 * units); /* two hooks, four events per unit */
    for (int k = 0; k < n; k += 2) {
        ck_assert_int_eq(log[k] / 1000, 1); /* a first, then b, for each event */
        ck_assert_int_eq(log[k + 1] - 1000, log[k]);
    }
    /* unit 0 (the embedding) opens the forward and closes the backward */
    ck_assert_int_eq(log[0] % 1000, 0 * 10 + CAI_MODEL_PRE_FORWARD);
    ck_assert_int_eq(log[n - 1] % 1000, 0 * 10 + CAI_MODEL_POST_BACKWARD);
    /* an error stops the backward at that unit */
    b.fail_at = 1;
    n = 0;
    OK(cai_model_forward(m, tok, tgt, NULL));
    ck_assert_int_eq(cai_model_backward(m, 1.0f), CAI_ERR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "hook 2 stops unit 1"));
    cai_error_clear();
    OK(cai_model_remove_hook(m, record_hook, &b));
    ck_assert_int_eq(cai_model_remove_hook(m, record_hook, &b), CAI_ERR_INVALID_ARG);
    n = 0;
    OK(cai_model_forward(m, tok, tgt, NULL));
    ck_assert_int_eq(n, 2 * units);
    OK(cai_model_remove_hook(m, record_hook, &a));
    hook_rec many[CAI_MODEL_MAX_HOOKS + 1];
    for (int i = 0; i <= CAI_MODEL_MAX_HOOKS; i++) {
        many[i] = (hook_rec){10 + i, log, &n, -1};
        ck_assert_int_eq(cai_model_add_hook(m, record_hook, &many[i]),
                         i < CAI_MODEL_MAX_HOOKS ? CAI_OK : CAI_ERR_INVALID_ARG);
    }
    cai_error_clear();
    cai_model_free(m);
}
END_TEST

START_TEST(forward_train_gives_identical_gradients) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++) {
        int32_t tok[12], tgt[12];
        make_batch(2, 6, cfgs[k].vocab_size, 11, tok, tgt);
        tgt[4] = CAI_IGNORE_INDEX;
        float l0, l1, *g0, *g1;
        size_t n0, n1;
        grads_of_scaled(cfgs[k], 0, 0, 0.375f, tok, tgt, &l0, &g0, &n0);
        grads_of_scaled(cfgs[k], 0, 1, 0.375f, tok, tgt, &l1, &g1, &n1);
        ck_assert_uint_eq(n0, n1);
        ck_assert(l0 == l1);
        ck_assert_msg(memcmp(g0, g1, n0 * sizeof(float)) == 0, "%s: forward_train gradients differ",
                      cai_model_family_name(cfgs[k].family));
        free(g0);
        free(g1);
    }
    cai_model_config c = tiny_gpt2();
    cai_model_t *m = make_model(&c, 2, 6);
    int32_t tok[12], tgt[12];
    make_batch(2, 6, c.vocab_size, 12, tok, tgt);
    OK(cai_model_forward_train(m, tok, tgt, 0.5f, NULL));
    cai_tensor logits;
    ck_assert_int_eq(cai_model_logits(m, &logits), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "replaced the logits by their gradient"));
    ck_assert_int_eq(cai_model_backward(m, 1.0f), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "grad_scale 1 differs from the 0.5"));
    cai_error_clear();
    OK(cai_model_backward(m, 0.5f));
    ck_assert_int_eq(cai_model_forward_train(m, tok, NULL, 0.5f, NULL), CAI_ERR_INVALID_ARG);
    cai_error_clear();
    /* a plain forward afterwards has its logits again */
    OK(cai_model_forward(m, tok, tgt, NULL));
    OK(cai_model_logits(m, &logits));
    cai_model_free(m);
}
END_TEST

START_TEST(activation_checkpointing_gives_identical_gradients) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++) {
        cfgs[k].n_layers = 3;
        int32_t tok[12], tgt[12];
        make_batch(2, 6, cfgs[k].vocab_size, 9, tok, tgt);
        float l0, l1;
        float *g0, *g1;
        size_t n0, n1;
        grads_of(cfgs[k], 0, tok, tgt, &l0, &g0, &n0);
        grads_of(cfgs[k], 1, tok, tgt, &l1, &g1, &n1);
        ck_assert_uint_eq(n0, n1);
        ck_assert(l0 == l1);
        ck_assert_msg(memcmp(g0, g1, n0 * sizeof(float)) == 0, "%s: checkpointed gradients differ",
                      cai_model_family_name(cfgs[k].family));
        double norm = 0;
        for (size_t i = 0; i < n0; i++) norm += (double)g0[i] * g0[i];
        ck_assert(norm > 0);
        free(g0);
        free(g1);
        /* ... and it saves memory: one activation set instead of three. */
        cai_model_config a = cfgs[k], b = cfgs[k];
        b.activation_checkpointing = 1;
        cai_model_t *ma = make_model(&a, 2, 6), *mb = make_model(&b, 2, 6);
        size_t act_a, act_b;
        cai_model_memory(ma, NULL, &act_a);
        cai_model_memory(mb, NULL, &act_b);
        ck_assert_uint_lt(act_b, act_a);
        cai_model_free(ma);
        cai_model_free(mb);
    }
}
END_TEST

/* The split backward (zero-bubble schedules): two microbatches forward
 * into two slots, both input passes, then both weight passes accumulate
 * what the fused backward does, bit for bit (every gradient is added in the
 * same microbatch order); hooks see a block's PRE_BACKWARD in the input
 * pass and its POST_BACKWARD after the weight pass; misuse is refused. */
START_TEST(split_backward_gives_identical_gradients) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++) {
        cfgs[k].n_layers = 3;
        int32_t tok[2][12], tgt[2][12];
        make_batch(2, 6, cfgs[k].vocab_size, 21, tok[0], tgt[0]);
        make_batch(2, 6, cfgs[k].vocab_size, 22, tok[1], tgt[1]);
        cai_model_t *fused = make_model(&cfgs[k], 2, 6);
        OK(cai_model_zero_grad(fused));
        for (int mb = 0; mb < 2; mb++) {
            OK(cai_model_forward_train(fused, tok[mb], tgt[mb], 0.5f, NULL));
            OK(cai_model_backward(fused, 0.5f));
        }
        cai_model_options o = cai_model_options_default(&cfgs[k]);
        o.batch = 2;
        o.seq_len = 6;
        o.act_slots = 2;
        o.split_backward = 1;
        cai_model_t *m = NULL;
        OK(cai_model_create(&m, dev, &cfgs[k], &o));
        ck_assert_int_eq(cai_model_split_backward(m), 1);
        OK(cai_model_zero_grad(m));
        int log[256], n = 0;
        hook_rec h = {1, log, &n, -1};
        OK(cai_model_add_hook(m, record_hook, &h));
        for (int mb = 0; mb < 2; mb++) {
            OK(cai_model_select(m, 0, mb));
            OK(cai_model_forward_train(m, tok[mb], tgt[mb], 0.5f, NULL));
        }
        /* slot 1 cannot run its weight pass before its input pass */
        ck_assert_int_eq(cai_model_backward_weight(m), CAI_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "cai_model_backward_input first"));
        cai_error_clear();
        const int units = cai_model_unit_count(m), blocks = cfgs[k].n_layers;
        for (int mb = 0; mb < 2; mb++) {
            OK(cai_model_select(m, 0, mb));
            n = 0;
            OK(cai_model_backward_input(m, 0.5f));
            ck_assert_int_eq(n, 2 * units - blocks); /* head and embedding whole, blocks PRE only */
            for (int i = 0; i < n; i++)
                ck_assert_msg(log[i] % 10 == CAI_MODEL_PRE_BACKWARD || (log[i] / 10) % 100 == 0 ||
                                  (log[i] / 10) % 100 == units - 1,
                              "event %d in the input pass", log[i]);
        }
        /* a slot waiting for its weight pass takes no forward */
        ck_assert_int_eq(cai_model_forward(m, tok[0], tgt[0], NULL), CAI_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "weight pass"));
        cai_error_clear();
        for (int mb = 0; mb < 2; mb++) {
            OK(cai_model_select(m, 0, mb));
            n = 0;
            OK(cai_model_backward_weight(m));
            ck_assert_int_eq(n, blocks);
            for (int i = 0; i < n; i++) ck_assert_int_eq(log[i] % 10, CAI_MODEL_POST_BACKWARD);
        }
        ck_assert_int_eq(cai_model_backward_weight(m), CAI_ERR_INVALID_ARG);
        cai_error_clear();
        OK(cai_model_remove_hook(m, record_hook, &h));
        cai_tensor ga, gb;
        cai_model_flat(fused, NULL, &ga, NULL);
        cai_model_flat(m, NULL, &gb, NULL);
        ck_assert_int_eq(cai_tensor_numel(&ga), cai_tensor_numel(&gb));
        ck_assert_msg(memcmp(ga.data, gb.data, (size_t)cai_tensor_numel(&ga) * sizeof(float)) == 0,
                      "%s: split backward gradients differ", cai_model_family_name(cfgs[k].family));
        /* ... and the split costs the kept output gradients */
        size_t act_fused, act_split, extra;
        cai_model_memory(fused, NULL, &act_fused);
        cai_model_memory(m, NULL, &act_split);
        cai_rank_view v = o.view;
        OK(cai_model_split_backward_bytes(dev, &cfgs[k], &v, 2, 6, 0, blocks, 2, &extra));
        ck_assert_uint_gt(extra, 0);
        ck_assert_uint_ge(act_split, act_fused + extra);
        cai_model_free(m);
        cai_model_free(fused);
        ck_assert_int_eq(cai_model_backward_input(fused = make_model(&cfgs[k], 2, 6), 1.0f), CAI_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "without split_backward"));
        cai_error_clear();
        cai_model_free(fused);
        cfgs[k].activation_checkpointing = 1;
        ck_assert_int_eq(cai_model_create(&m, dev, &cfgs[k], &o), CAI_ERR_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "activation checkpointing"));
        cai_error_clear();
    }
}
END_TEST

/* ------------------------------------------------------------ packing */

/* Documents of a packed batch: row, first column, length. Two rows of 8:
 * row 0 holds documents of 3 and 5 tokens, row 1 of 4 and 2 then 2 tokens
 * of padding (a document of its own whose targets are ignored). */
static const int pack_docs[4][3] = {{0, 0, 3}, {0, 3, 5}, {1, 0, 4}, {1, 4, 2}};
enum { PACK_B = 2, PACK_T = 8 };

/* Loss and gradients of the four documents, packed (2 rows) or one per
 * padded row (4 rows); mode 0 plain, 1 activation checkpointing, 2 split
 * backward. */
static void packed_grads(cai_model_config c, int packed, int mode, float *loss, float **g, size_t *n) {
    const int B = packed ? PACK_B : 4, T = PACK_T;
    int32_t tok[4 * PACK_T], tgt[4 * PACK_T], pos[4 * PACK_T], doc[4 * PACK_T];
    for (int i = 0; i < B * T; i++) tok[i] = 1, tgt[i] = CAI_IGNORE_INDEX, pos[i] = i % T, doc[i] = 100;
    for (int d = 0; d < 4; d++) {
        int row = packed ? pack_docs[d][0] : d, col0 = packed ? pack_docs[d][1] : 0;
        for (int t = 0; t < pack_docs[d][2]; t++) {
            int i = row * T + col0 + t;
            tok[i] = (int32_t)(cai_rng_uniform(31, (uint64_t)d, (uint64_t)t) * (float)c.vocab_size) % c.vocab_size;
            tgt[i] = t == 1 && d == 1 ? CAI_IGNORE_INDEX
                                      : (int32_t)(cai_rng_uniform(32, (uint64_t)d, (uint64_t)t) * (float)c.vocab_size) %
                                            c.vocab_size;
            pos[i] = t;
            doc[i] = d;
        }
    }
    if (packed) /* the padding restarts its positions */
        for (int t = 6; t < 8; t++) pos[T + t] = t - 6;
    c.activation_checkpointing = mode == 1;
    cai_model_options o = cai_model_options_default(&c);
    o.batch = B;
    o.seq_len = T;
    o.split_backward = mode == 2;
    cai_model_t *m = NULL;
    OK(cai_model_create(&m, dev, &c, &o));
    OK(cai_model_zero_grad(m));
    if (packed) OK(cai_model_set_packing(m, pos, doc));
    OK(cai_model_forward(m, tok, tgt, loss));
    if (mode == 2) {
        OK(cai_model_backward_input(m, 1.0f));
        OK(cai_model_backward_weight(m));
    } else OK(cai_model_backward(m, 1.0f));
    cai_tensor grads;
    cai_model_flat(m, NULL, &grads, NULL);
    *n = (size_t)cai_tensor_numel(&grads);
    *g = malloc(*n * sizeof(float));
    memcpy(*g, grads.data, *n * sizeof(float));
    cai_model_free(m);
}

/* Several documents per row with restarting positions and document-masked
 * attention give the loss and every gradient of the same documents run one
 * per padded row (1e-5 of the largest gradient), for both families and
 * through checkpointing and the split backward. */
START_TEST(packed_rows_match_unpacked_documents) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++)
        for (int mode = 0; mode < 3; mode++) {
            float la, lb, *ga, *gb;
            size_t na, nb;
            packed_grads(cfgs[k], 1, mode, &la, &ga, &na);
            packed_grads(cfgs[k], 0, mode, &lb, &gb, &nb);
            ck_assert_uint_eq(na, nb);
            ck_assert_msg(fabsf(la - lb) <= 1e-5f * fmaxf(1.0f, fabsf(lb)), "%s mode %d: loss %.9g vs %.9g",
                          cai_model_family_name(cfgs[k].family), mode, (double)la, (double)lb);
            float gmax = 0.0f;
            for (size_t i = 0; i < nb; i++) gmax = fmaxf(gmax, fabsf(gb[i]));
            ck_assert(gmax > 0.0f);
            for (size_t i = 0; i < nb; i++)
                ck_assert_msg(fabsf(ga[i] - gb[i]) <= 1e-5f * gmax, "%s mode %d: gradient %zu %.9g vs %.9g",
                              cai_model_family_name(cfgs[k].family), mode, i, (double)ga[i], (double)gb[i]);
            free(ga);
            free(gb);
        }
}
END_TEST

/* Packings that break the accepted form are refused naming the entry;
 * clearing returns to plain rows, bit for bit. */
START_TEST(packing_rejects_malformed_rows) {
    cai_model_config c = tiny_llama();
    cai_model_t *m = make_model(&c, 1, 4);
    int32_t pos_ok[4] = {0, 1, 0, 1}, doc_ok[4] = {0, 0, 1, 1};
    int32_t doc_down[4] = {1, 1, 0, 0}, pos_norestart[4] = {0, 1, 2, 3}, pos_gap[4] = {0, 2, 0, 1};
    ck_assert_int_eq(cai_model_set_packing(m, pos_ok, doc_down), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "doc_ids[0,2] = 0 after 1: ids must not decrease"));
    cai_error_clear();
    ck_assert_int_eq(cai_model_set_packing(m, pos_norestart, doc_ok), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "positions[0,2] = 2, expected 0"));
    cai_error_clear();
    ck_assert_int_eq(cai_model_set_packing(m, pos_gap, doc_ok), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "positions[0,1] = 2, expected 1"));
    cai_error_clear();
    ck_assert_int_eq(cai_model_set_packing(m, pos_ok, NULL), CAI_ERR_INVALID_ARG);
    cai_error_clear();
    int32_t tok[4] = {1, 2, 3, 4}, tgt[4] = {2, 3, 4, 5};
    float plain, packed, cleared;
    OK(cai_model_forward(m, tok, tgt, &plain));
    OK(cai_model_set_packing(m, pos_ok, doc_ok));
    OK(cai_model_forward(m, tok, tgt, &packed));
    ck_assert(packed != plain);
    OK(cai_model_set_packing(m, NULL, NULL));
    OK(cai_model_forward(m, tok, tgt, &cleared));
    ck_assert_mem_eq(&plain, &cleared, sizeof plain);
    cai_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ pipeline stages */

START_TEST(pipeline_stages_chain_to_the_single_model) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++) {
        cai_model_config c = cfgs[k];
        c.n_layers = 3;
        int B = 2, T = 5;
        int32_t tok[10], tgt[10];
        make_batch(B, T, c.vocab_size, 21, tok, tgt);
        cai_model_t *full = make_model(&c, B, T);
        float lf = 0;
        OK(cai_model_forward(full, tok, tgt, &lf));
        OK(cai_model_backward(full, 1.0f));

        int stage_of[3] = {0, 0, 1};
        cai_model_t *st[2];
        for (int r = 0; r < 2; r++) {
            cai_model_options o = cai_model_options_default(&c);
            o.batch = B;
            o.seq_len = T;
            o.view.pp_size = 2;
            o.view.pp_rank = r;
            o.view.layer_vstage = stage_of;
            OK(cai_model_create(&st[r], dev, &c, &o));
        }
        int b0, e0, f0, l0, b1, e1, f1, l1;
        cai_model_stage(st[0], &b0, &e0, &f0, &l0);
        cai_model_stage(st[1], &b1, &e1, &f1, &l1);
        ck_assert(b0 == 0 && e0 == 2 && f0 && !l0 && b1 == 2 && e1 == 3 && !f1 && l1);
        cai_tensor in0, out0, d0, in1, out1, d1;
        OK(cai_model_stage_io(st[0], &in0, &out0, &d0));
        OK(cai_model_stage_io(st[1], &in1, &out1, &d1));
        float ls = 0;
        OK(cai_model_forward(st[0], tok, NULL, NULL));
        memcpy(in1.data, out0.data, cai_tensor_nbytes(&out0)); /* the send/recv */
        OK(cai_model_forward(st[1], NULL, tgt, &ls));
        ck_assert_float_eq(ls, lf);
        OK(cai_model_backward(st[1], 1.0f));
        memcpy(d0.data, d1.data, cai_tensor_nbytes(&d1));
        OK(cai_model_backward(st[0], 1.0f));
        /* Every parameter's gradient equals the full model's, on the stage that holds it. */
        const cai_registry_t *reg = cai_model_registry(full);
        for (int i = 0; i < cai_registry_count(reg); i++) {
            const char *name = cai_registry_param(reg, i)->name;
            cai_tensor gf, gs, gw;
            OK(cai_model_param(full, name, NULL, &gf));
            int on1 = cai_model_param(st[0], name, NULL, &gs) != CAI_OK;
            cai_error_clear();
            if (on1) OK(cai_model_param(st[1], name, NULL, &gs));
            const float *a = gf.data, *b = gs.data;
            int64_t n = cai_tensor_numel(&gf);
            ck_assert_int_eq(n, cai_tensor_numel(&gs));
            int tied_head = c.tie_embeddings && strcmp(name, "lm_head.weight") == 0;
            int tied_wte = c.tie_embeddings && strcmp(name, "wte.weight") == 0;
            /* Tied across stages: each stage has its half; the pipeline all-reduces them. */
            if (tied_wte) OK(cai_model_param(st[1], "lm_head.weight", NULL, &gw));
            for (int64_t j = 0; j < n; j++) {
                if (tied_head) continue; /* the full model accumulates the head into wte */
                double want = a[j], got = b[j] + (tied_wte ? ((const float *)gw.data)[j] : 0.0f);
                ck_assert_msg(fabs(want - got) <= 1e-6 + 1e-5 * fabs(want), "%s %s[%lld]: stage %g vs full %g",
                              cai_model_family_name(c.family), name, (long long)j, got, want);
            }
        }
        cai_model_free(st[0]);
        cai_model_free(st[1]);
        cai_model_free(full);
    }
}
END_TEST

/* ------------------------------------------------------------ training */

static void train(cai_model_config c, int steps, float lr, const int32_t *tok, const int32_t *tgt, int B, int T,
                  float *losses) {
    cai_model_t *m = make_model(&c, B, T);
    cai_adamw_config oc = cai_adamw_config_default();
    oc.schedule.lr = lr;
    oc.weight_decay = 0.0f;
    cai_optim_t *o = NULL;
    OK(cai_optim_create_for_model(&o, m, &oc));
    for (int s = 0; s < steps; s++) {
        cai_step_stats st;
        OK(local_step(m, o, tok, tgt, 1, &st));
        losses[s] = st.loss;
        ck_assert(isfinite(st.grad_norm) && st.grad_norm > 0);
    }
    cai_optim_free(o);
    cai_model_free(m);
}

START_TEST(loss_decreases_when_overfitting_a_tiny_batch) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++) {
        int B = 2, T = 8;
        int32_t tok[16], tgt[16];
        make_batch(B, T, cfgs[k].vocab_size, 33, tok, tgt);
        float losses[30];
        train(cfgs[k], 30, 1e-2f, tok, tgt, B, T, losses);
        /* Starts near log(V) (uniform predictions) and memorises the batch. */
        ck_assert_double_eq_tol(losses[0], log((double)cfgs[k].vocab_size), 0.3);
        ck_assert_msg(losses[29] < 0.25f * losses[0], "%s: loss %g -> %g after 30 steps",
                      cai_model_family_name(cfgs[k].family), losses[0], losses[29]);
        for (int s = 5; s < 30; s += 5) ck_assert_float_lt(losses[s], losses[s - 5]);
    }
}
END_TEST

START_TEST(bf16_mixed_precision_tracks_f32) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++) {
        int B = 2, T = 8, S = 30;
        int32_t tok[16], tgt[16];
        make_batch(B, T, cfgs[k].vocab_size, 44, tok, tgt);
        float l32[30], l16[30], lh[30];
        train(cfgs[k], S, 1e-2f, tok, tgt, B, T, l32);
        cai_model_config b = cfgs[k];
        b.param_dtype = CAI_DTYPE_BF16;
        train(b, S, 1e-2f, tok, tgt, B, T, l16);
        cai_model_config h = cfgs[k];
        h.param_dtype = CAI_DTYPE_F16;
        train(h, S, 1e-2f, tok, tgt, B, T, lh);
        for (int s = 0; s < S; s++) {
            /* Stated tolerances (docs/model.md), at every step: bf16 within
             * 0.02 + 2% of the f32 loss, f16 within 0.005 + 0.5%. */
            double tol = 0.02 + 0.02 * l32[s], tol16 = 0.005 + 0.005 * l32[s];
            ck_assert_msg(fabs(l16[s] - l32[s]) <= tol, "%s step %d: bf16 loss %g vs f32 %g",
                          cai_model_family_name(cfgs[k].family), s, l16[s], l32[s]);
            ck_assert_msg(fabs(lh[s] - l32[s]) <= tol16, "%s step %d: f16 loss %g vs f32 %g",
                          cai_model_family_name(cfgs[k].family), s, lh[s], l32[s]);
        }
        ck_assert(l16[0] != l32[0]); /* bf16 weights really were used */
        ck_assert_float_lt(l16[S - 1], 0.25f * l16[0]);
    }
}
END_TEST

START_TEST(bf16_working_weights_are_rounded_masters) {
    cai_model_config c = tiny_llama();
    c.param_dtype = CAI_DTYPE_BF16;
    cai_model_t *m = make_model(&c, 1, 4);
    cai_tensor p, g, lowp;
    cai_model_flat(m, &p, &g, &lowp);
    ck_assert_int_eq(lowp.dtype, CAI_DTYPE_BF16);
    ck_assert_int_eq(cai_tensor_numel(&lowp), cai_tensor_numel(&p));
    const float *w = p.data;
    const uint16_t *h = lowp.data;
    for (int64_t i = 0; i < cai_tensor_numel(&p); i++) ck_assert_uint_eq(h[i], cai_f32_to_bf16(w[i]));
    /* After an optimizer step too. */
    cai_adamw_config oc = cai_adamw_config_default();
    cai_optim_t *o = NULL;
    OK(cai_optim_create_for_model(&o, m, &oc));
    int32_t tok[4] = {1, 2, 3, 4}, tgt[4] = {2, 3, 4, 5};
    OK(local_step(m, o, tok, tgt, 1, NULL));
    for (int64_t i = 0; i < cai_tensor_numel(&p); i++) ck_assert_uint_eq(h[i], cai_f32_to_bf16(w[i]));
    cai_optim_free(o);
    cai_model_free(m);
}
END_TEST

/* A frozen model at batch 2 and its whole context, with one forward's
 * loss and logits kept to compare later forwards with, bit for bit. */
typedef struct {
    cai_model_t *m;
    int32_t tok[2 * 9], tgt[2 * 9];
    float loss, *logits;
    size_t n_logits;
} frozen_ref;

static void frozen_ref_make(frozen_ref *f, const cai_model_config *c, uint64_t seed) {
    cai_model_options o = cai_model_options_default(c);
    o.batch = 2;
    o.seq_len = c->max_seq_len;
    o.frozen = 1;
    f->m = NULL;
    OK(cai_model_create(&f->m, dev, c, &o));
    make_batch(2, c->max_seq_len, c->vocab_size, seed, f->tok, f->tgt);
    OK(cai_model_forward(f->m, f->tok, f->tgt, &f->loss));
    cai_tensor lg;
    OK(cai_model_logits(f->m, &lg));
    f->n_logits = (size_t)cai_tensor_numel(&lg);
    f->logits = malloc(f->n_logits * sizeof *f->logits);
    memcpy(f->logits, lg.data, f->n_logits * sizeof *f->logits);
}

static void frozen_ref_check(frozen_ref *f, int round) {
    float l = 0;
    OK(cai_model_forward(f->m, f->tok, f->tgt, &l));
    ck_assert_msg(memcmp(&l, &f->loss, sizeof l) == 0, "round %d: loss %.9g, not %.9g", round, (double)l,
                  (double)f->loss);
    cai_tensor lg;
    OK(cai_model_logits(f->m, &lg));
    ck_assert(memcmp(lg.data, f->logits, f->n_logits * sizeof *f->logits) == 0);
}

static void frozen_ref_free(frozen_ref *f) {
    free(f->logits);
    cai_model_free(f->m);
}

/* Onload m: `count` allocations of `bytes` in all, and with MoE blocks
 * one more, their activation sets' arena. */
static void onload_allocates(cai_model_t *m, uint64_t count, size_t bytes, int moe) {
    uint64_t b0 = 0, b1 = 0;
    const uint64_t n0 = cai_device_alloc_count(dev, &b0);
    OK(cai_model_onload(m));
    const uint64_t n1 = cai_device_alloc_count(dev, &b1);
    ck_assert_uint_eq(n1 - n0, count + (moe ? 1 : 0));
    if (moe) ck_assert_uint_gt(b1 - b0, bytes);
    else ck_assert_uint_eq(b1 - b0, bytes);
}

static cai_model_config tiny_moe(void) {
    cai_model_config c = tiny_llama();
    c.moe = cai_moe_config_default();
    c.moe.n_experts = 4;
    c.moe.top_k = 2;
    c.moe.ffn = 8;
    c.moe_every = 1;
    return c;
}

/* A frozen model lends its device memory out: offloaded, its weights and
 * activation arenas (the MoE blocks' too) are gone from the device (the
 * plan's bytes 0, a forward refused); onloaded, they come back at new
 * addresses, every view re-bound or carved anew, and the forward gives the
 * same loss and logits bit for bit. A trained model refuses. */
START_TEST(frozen_model_offload_and_onload_are_bit_exact) {
    for (int fam = 0; fam < 3; fam++) {
        cai_model_config c = fam == 2 ? tiny_moe() : fam ? tiny_llama() : tiny_gpt2();
        c.param_dtype = CAI_DTYPE_BF16; /* masters, working and compute copies: all three move */
        frozen_ref f;
        frozen_ref_make(&f, &c, 5);
        cai_model_t *m = f.m;
        float l1 = 0;
        size_t held = 0, acts = 0, none = 1;
        cai_model_memory(m, &held, &acts);
        ck_assert_uint_gt(held, 0);
        ck_assert_uint_eq(held, cai_weights_device_bytes(cai_model_weights(m)));
        for (int round = 0; round < 2; round++) {
            OK(cai_model_offload(m));
            OK(cai_model_offload(m)); /* already offloaded: nothing to do */
            ck_assert(cai_model_offloaded(m));
            size_t no_acts = 1;
            cai_model_memory(m, &none, &no_acts);
            ck_assert_uint_eq(none, 0);
            ck_assert_uint_eq(no_acts, 0); /* the activation arena went too */
            ck_assert_int_eq(cai_model_forward(m, f.tok, f.tgt, &l1), CAI_ERR_INVALID_ARG);
            ck_assert_ptr_nonnull(strstr(cai_error_message(), "cai_model_onload"));
            cai_error_clear();
            onload_allocates(m, 4, held + acts, fam == 2); /* masters, working and compute copies, the arena */
            frozen_ref_check(&f, round);
        }
        frozen_ref_free(&f);
        /* a trained model's weights belong to its optimizer too */
        cai_model_t *t = make_model(&c, 2, c.max_seq_len);
        ck_assert_int_eq(cai_model_offload(t), CAI_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "frozen"));
        cai_error_clear();
        cai_model_free(t);
    }
}
END_TEST

/* A loaded frozen model keeps only the copy its layers read: the same bits
 * out of every forward, before and after an offload round trip, with the
 * masters' and working copy's bytes given back; what would write or read
 * the masters refuses, naming the call. */
START_TEST(frozen_model_keeps_only_its_compute_copy) {
    /* bf16 working weights: the f32 compute copy stays; f32: nothing goes */
    const cai_dtype dts[2][2] = {{CAI_DTYPE_BF16, CAI_DTYPE_F32}, {CAI_DTYPE_F32, CAI_DTYPE_F32}};
    for (int fam = 0; fam < 2; fam++)
        for (int d = 0; d < 2; d++) {
            cai_model_config c = fam ? tiny_llama() : tiny_gpt2();
            c.param_dtype = dts[d][0];
            c.act_dtype = dts[d][1];
            frozen_ref f;
            frozen_ref_make(&f, &c, 7);
            cai_model_t *m = f.m;
            size_t all = 0, kept = 0, acts = 0;
            cai_model_memory(m, &all, &acts);
            cai_tensor flat;
            cai_model_flat(m, &flat, NULL, NULL);
            const size_t n = (size_t)cai_tensor_numel(&flat);
            OK(cai_model_keep_compute(m));
            OK(cai_model_keep_compute(m)); /* twice: the same state */
            cai_model_memory(m, &kept, NULL);
            ck_assert_uint_eq(kept, n * cai_dtype_size(c.act_dtype));
            ck_assert_uint_eq(all, n * (4 + (c.param_dtype != CAI_DTYPE_F32 ? cai_dtype_size(c.param_dtype) : 0) +
                                        (c.act_dtype != c.param_dtype ? cai_dtype_size(c.act_dtype) : 0)));
            for (int round = 0; round < 2; round++) {
                frozen_ref_check(&f, round);
                OK(cai_model_offload(m));
                onload_allocates(m, 2, kept + acts, 0); /* the compute copy, the arena */
            }
            cai_tensor w;
            const int gone = c.param_dtype != CAI_DTYPE_F32 || c.act_dtype != CAI_DTYPE_F32;
            ck_assert_int_eq(cai_weights_compute_only(cai_model_weights(m)), gone);
            if (gone) {
                ck_assert_int_eq(cai_model_param(m, "wte.weight", &w, NULL), CAI_ERR_INVALID_ARG);
                ck_assert_ptr_nonnull(strstr(cai_error_message(), "cai_model_keep_compute"));
                cai_error_clear();
                ck_assert_int_eq(cai_model_params_updated(m), CAI_ERR_INVALID_ARG);
                ck_assert_ptr_nonnull(strstr(cai_error_message(), "cai_weights_keep_compute"));
                cai_error_clear();
                cai_model_flat(m, &flat, NULL, NULL);
                ck_assert_int_eq(cai_tensor_numel(&flat), 0);
            } else {
                OK(cai_model_param(m, "wte.weight", &w, NULL)); /* F32 layers read the masters: kept */
                OK(cai_model_params_updated(m));
            }
            frozen_ref_free(&f);
            cai_model_t *t = make_model(&c, 2, c.max_seq_len);
            ck_assert_int_eq(cai_model_keep_compute(t), CAI_ERR_INVALID_ARG);
            ck_assert_ptr_nonnull(strstr(cai_error_message(), "is trained"));
            cai_error_clear();
            cai_model_free(t);
        }
    /* layers that read the bf16 working copy keep it, bit for bit (this
     * backend computes in f32, so the weights alone) */
    cai_model_config c = tiny_llama();
    c.param_dtype = c.act_dtype = CAI_DTYPE_BF16;
    cai_rank_view v = cai_rank_view_single();
    cai_weights_t *w = NULL;
    OK(cai_weights_create(&w, dev, &c, &v, 0, 1));
    cai_tensor wt;
    OK(cai_weights_find(w, "h.0.attn.qkv.weight", 1, &wt));
    const size_t nb = (size_t)cai_tensor_numel(&wt) * 2, all = cai_weights_device_bytes(w);
    void *before = malloc(nb);
    memcpy(before, wt.data, nb);
    OK(cai_weights_keep_compute(w));
    ck_assert_uint_eq(cai_weights_device_bytes(w) * 3, all); /* 2 of 6 bytes a parameter */
    OK(cai_weights_find(w, "h.0.attn.qkv.weight", 1, &wt));
    ck_assert(memcmp(before, wt.data, nb) == 0);
    ck_assert_int_eq(cai_weights_find(w, "h.0.attn.qkv.weight", 0, &wt), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "cai_weights_keep_compute"));
    cai_error_clear();
    free(before);
    cai_weights_free(w);
}
END_TEST

/* ------------------------------------------------------------ objectives */

/* The mean cross-entropy written as an objective. */
static cai_status mean_ce_objective(void *ctx, cai_model_objective_io *io) {
    (void)ctx;
    const int n = io->batch * io->seq_len;
    int valid = 0;
    for (int i = 0; i < n; i++) valid += io->targets[i] != CAI_IGNORE_INDEX;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (io->targets[i] == CAI_IGNORE_INDEX) continue;
        sum += io->token_loss[i];
        io->dtoken_loss[i] = 1.0f / (float)valid;
    }
    io->loss = sum / valid;
    return CAI_OK;
}

/* Nonlinear in both inputs: per row softplus(sum_t c_t * loss_t) plus
 * 0.1 * sum_n (u . h_n)^2 over the hidden states. */
static cai_status mixed_objective(void *ctx, cai_model_objective_io *io) {
    (void)ctx;
    const int B = io->batch, T = io->seq_len;
    const int64_t C = io->hidden_size;
    double J = 0;
    for (int b = 0; b < B; b++) {
        double z = 0;
        for (int t = 0; t < T; t++) z += (0.3 + 0.1 * ((b + t) % 3)) * io->token_loss[b * T + t];
        J += log1p(exp(z));
        const double sig = 1.0 / (1.0 + exp(-z));
        for (int t = 0; t < T; t++) io->dtoken_loss[b * T + t] = (float)(sig * (0.3 + 0.1 * ((b + t) % 3)));
    }
    for (int n = 0; n < B * T; n++) {
        double p = 0;
        for (int64_t c = 0; c < C; c++) p += (double)io->hidden[n * C + c] * (c % 2 ? 0.5 : -0.25);
        J += 0.1 * p * p;
        for (int64_t c = 0; c < C; c++) io->dhidden[n * C + c] = (float)(0.2 * p * (c % 2 ? 0.5 : -0.25));
    }
    io->loss = J;
    return CAI_OK;
}

START_TEST(objective_as_mean_cross_entropy_gives_the_same_gradients) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++) {
        int32_t tok[12], tgt[12];
        make_batch(2, 6, cfgs[k].vocab_size, 31, tok, tgt);
        tgt[2] = CAI_IGNORE_INDEX;
        float la = 0, lb = 0;
        float *ga = NULL, *gb = NULL;
        size_t n = 0;
        cai_model_t *a = make_model(&cfgs[k], 2, 6), *b = make_model(&cfgs[k], 2, 6);
        const cai_model_objective obj = {mean_ce_objective, NULL, 0, 1.0f};
        OK(cai_model_set_objective(b, &obj));
        OK(cai_model_zero_grad(a));
        OK(cai_model_zero_grad(b));
        OK(cai_model_forward_train(a, tok, tgt, 0.5f, &la));
        OK(cai_model_backward(a, 0.5f));
        OK(cai_model_forward_train(b, tok, tgt, 0.5f, &lb));
        OK(cai_model_backward(b, 0.5f));
        ck_assert_float_eq_tol(la, lb, 1e-6f);
        cai_tensor ta, tb;
        cai_model_flat(a, NULL, &ta, NULL);
        cai_model_flat(b, NULL, &tb, NULL);
        ga = ta.data;
        gb = tb.data;
        n = (size_t)cai_tensor_numel(&ta);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < n; i++) {
            worst = fmax(worst, fabs((double)ga[i] - gb[i]));
            scale = fmax(scale, fabs((double)ga[i]));
        }
        ck_assert_msg(scale > 0 && worst <= 1e-6 * scale, "%s: gradients differ by %g (largest %g)",
                      cai_model_family_name(cfgs[k].family), worst, scale);
        /* Unset: the mean cross-entropy path again. */
        OK(cai_model_set_objective(b, NULL));
        OK(cai_model_forward(b, tok, tgt, &lb));
        ck_assert_float_eq_tol(la, lb, 1e-6f);
        cai_model_free(a);
        cai_model_free(b);
    }
}
END_TEST

/* Copies the token losses it is handed. */
static cai_status copy_losses_objective(void *ctx, cai_model_objective_io *io) {
    memcpy(ctx, io->token_loss, (size_t)io->batch * io->seq_len * sizeof(float));
    io->loss = 0;
    return CAI_OK;
}

START_TEST(objective_logit_scale_scores_the_scaled_logits) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    for (int k = 0; k < 2; k++) {
        cai_model_config cfg = cfgs[k];
        cfg.init_std = 0.3f;
        const int B = 2, T = 5, V = cfg.vocab_size, N = B * T;
        cai_model_t *m = make_model(&cfg, B, T);
        int32_t tok[10], tgt[10];
        make_batch(B, T, V, 11, tok, tgt);
        OK(cai_model_forward(m, tok, NULL, NULL));
        cai_tensor lt;
        OK(cai_model_logits(m, &lt));
        ck_assert_int_eq(lt.dtype, CAI_DTYPE_F32);
        const int64_t W = lt.shape[2]; /* the padded vocabulary's row */
        ck_assert_int_ge(W, V);
        float *logits = malloc((size_t)(N * W) * sizeof *logits);
        ck_assert_ptr_nonnull(logits);
        memcpy(logits, lt.data, (size_t)(N * W) * sizeof *logits);
        double want[10];
        const double scale = 1.0 / 0.7;
        for (int n = 0; n < N; n++) {
            double mx = -INFINITY, z = 0;
            for (int v = 0; v < V; v++) mx = fmax(mx, scale * logits[n * W + v]);
            for (int v = 0; v < V; v++) z += exp(scale * logits[n * W + v] - mx);
            want[n] = tgt[n] == CAI_IGNORE_INDEX ? 0.0 : mx + log(z) - scale * logits[n * W + tgt[n]];
        }
        float got[10];
        const cai_model_objective obj = {copy_losses_objective, got, 0, (float)scale};
        OK(cai_model_set_objective(m, &obj));
        OK(cai_model_forward(m, tok, tgt, NULL));
        for (int n = 0; n < N; n++)
            ck_assert_msg(fabs(got[n] - want[n]) <= 1e-5 * fmax(1.0, fabs(want[n])),
                          "%s token %d: loss %.7g, -log softmax(logits / 0.7) %.7g", cai_model_family_name(cfg.family),
                          n, (double)got[n], want[n]);
        /* A forward without targets still gives the raw logits. */
        OK(cai_model_forward(m, tok, NULL, NULL));
        OK(cai_model_logits(m, &lt));
        for (int64_t i = 0; i < N * W; i++) ck_assert_float_eq(((const float *)lt.data)[i], logits[i]);
        const cai_model_objective bad = {copy_losses_objective, got, 0, -1.0f};
        ck_assert_int_eq(cai_model_set_objective(m, &bad), CAI_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "logit_scale=-1"));
        cai_error_clear();
        free(logits);
        cai_model_free(m);
    }
}
END_TEST

START_TEST(objective_gradients_match_finite_differences) {
    cai_model_config cfgs[2] = {tiny_gpt2(), tiny_llama()};
    /* Twice each: raw logits, and logits at temperature 0.7 (an RL policy's). */
    for (int k = 0; k < 4; k++) {
        cai_model_config cfg = cfgs[k % 2];
        cfg.init_std = 0.3f;
        cai_model_t *m = make_model(&cfg, 2, 5);
        int32_t tok[10], tgt[10];
        make_batch(2, 5, cfg.vocab_size, 7, tok, tgt);
        tgt[7] = CAI_IGNORE_INDEX;
        const cai_model_objective obj = {mixed_objective, NULL, 1, k < 2 ? 0.0f : (float)(1.0 / 0.7)};
        OK(cai_model_set_objective(m, &obj));
        float J = 0;
        OK(cai_model_zero_grad(m));
        OK(cai_model_forward(m, tok, tgt, &J));
        OK(cai_model_backward(m, 1.0f));
        loss_ctx ctx = {m, tok, tgt};
        const char *names[] = {"ln_f.weight", "h.1.attn.qkv.weight", "h.0.mlp.proj.weight", "lm_head.weight"};
        int checked = 0;
        for (int p = 0; p < 4; p++) {
            cai_tensor w, g;
            if (cai_model_param(m, names[p], &w, &g) != CAI_OK) {
                cai_error_clear();
                continue;
            }
            float *wp = w.data;
            const float *gp = g.data;
            const int64_t n = cai_tensor_numel(&w);
            for (int s = 0; s < 5; s++) {
                int64_t i = (int64_t)(cai_rng_uniform(9, (uint64_t)p, (uint64_t)s) * (float)n) % n;
                if (strcmp(names[p], "lm_head.weight") == 0) i = (int64_t)tgt[s] * cfg.d_model + s;
                const float save = wp[i], eps = 1e-2f;
                wp[i] = save + eps;
                const double jp = model_loss(&ctx);
                wp[i] = save - eps;
                const double jm = model_loss(&ctx);
                wp[i] = save;
                const double fd = (jp - jm) / (2.0 * eps);
                ck_assert_msg(fabs(fd - gp[i]) <= 5e-4 + 2e-2 * fabs(fd), "%s %s[%lld]: analytic %.7g vs fd %.7g",
                              cai_model_family_name(cfg.family), names[p], (long long)i, (double)gp[i], fd);
                checked++;
            }
        }
        ck_assert_int_ge(checked, 10);
        OK(cai_model_params_updated(m));
        cai_model_free(m);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, config_defaults_and_errors);
    tcase_add_test(tc, registration_names_every_parameter_once);
    tcase_add_test(tc, forward_train_gives_identical_gradients);
    tcase_add_test(tc, hooks_run_in_order_and_stop_the_pass);
    tcase_add_test(tc, gpt2_gradients_match_finite_differences);
    tcase_add_test(tc, llama_gqa_gradients_match_finite_differences);
    tcase_add_test(tc, forward_rejects_bad_input);
    tcase_add_test(tc, activation_checkpointing_gives_identical_gradients);
    tcase_add_test(tc, split_backward_gives_identical_gradients);
    tcase_add_test(tc, packed_rows_match_unpacked_documents);
    tcase_add_test(tc, objective_as_mean_cross_entropy_gives_the_same_gradients);
    tcase_add_test(tc, objective_gradients_match_finite_differences);
    tcase_add_test(tc, objective_logit_scale_scores_the_scaled_logits);
    tcase_add_test(tc, packing_rejects_malformed_rows);
    tcase_add_test(tc, pipeline_stages_chain_to_the_single_model);
    tcase_add_test(tc, loss_decreases_when_overfitting_a_tiny_batch);
    tcase_add_test(tc, bf16_mixed_precision_tracks_f32);
    tcase_add_test(tc, bf16_working_weights_are_rounded_masters);
    tcase_add_test(tc, frozen_model_offload_and_onload_are_bit_exact);
    tcase_add_test(tc, frozen_model_keeps_only_its_compute_copy);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1) != CAI_OK) {
        cai_error_print(stderr);
        MPI_Finalize();
        return 1;
    }
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cai_device_free(dev);
    MPI_Finalize();
    return failed ? 1 : 0;
}
