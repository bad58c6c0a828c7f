/* LoRA adapters (colossal/lora.h): targets matched as PEFT matches them,
 * a fresh adapter changing nothing, adapter gradients against central
 * differences (GPT-2 and Llama, every target, with and without dropout),
 * activation checkpointing and the split backward bitwise, the merged
 * Hugging Face export giving the adapter model's logits, the memory plan
 * of a LoRA run, and PEFT adapter files both ways with malformed ones
 * refused naming file and field. */
#include "cai_config.h"
#include "colossal/lora.h"
#include "colossal/ops.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static cai_device_t *dev;

#define OK(expr)                                                                   \
    do {                                                                           \
        cai_status st_ = (expr);                                                   \
        ck_assert_msg(st_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

#define FAILS(expr, code, needle)                                                                  \
    do {                                                                                           \
        cai_status st_ = (expr);                                                                   \
        ck_assert_msg(st_ == (code), "%s gave %d, expected %d (%s)", #expr, (int)st_, (int)(code), \
                      cai_error_message());                                                        \
        ck_assert_msg(strstr(cai_error_message(), (needle)) != NULL, "%s: '%s' lacks '%s'", #expr, \
                      cai_error_message(), (needle));                                              \
        cai_error_clear();                                                                         \
    } while (0)

static cai_model_config tiny(cai_model_family f) {
    cai_model_config c = cai_model_config_default(f);
    c.vocab_size = f == CAI_MODEL_GPT2 ? 50 : 37;
    c.n_layers = 2;
    c.d_model = f == CAI_MODEL_GPT2 ? 12 : 16;
    c.n_heads = f == CAI_MODEL_GPT2 ? 3 : 4;
    c.n_kv_heads = f == CAI_MODEL_GPT2 ? 0 : 2;
    c.ffn_hidden = f == CAI_MODEL_GPT2 ? 0 : 24;
    c.max_seq_len = 8;
    c.rope_theta = 500.0f;
    c.seed = 7;
    return c;
}

enum { B = 2, T = 6 };

static cai_model_t *make(const cai_model_config *c, int frozen, int ckpt, int split) {
    cai_model_config cc = *c;
    cc.activation_checkpointing = ckpt;
    cai_model_options o = cai_model_options_default(&cc);
    o.batch = B;
    o.seq_len = T;
    o.frozen = frozen;
    o.split_backward = split;
    cai_model_t *m = NULL;
    OK(cai_model_create(&m, dev, &cc, &o));
    return m;
}

static void batch(const cai_model_config *c, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 7 + 3) % c->vocab_size;
        tgt[i] = i % 5 == 4 ? CAI_IGNORE_INDEX : (i * 5 + 1) % c->vocab_size;
    }
}

static cai_lora_t *make_lora(const cai_model_config *c, const char *targets, float dropout) {
    cai_lora_config lc = cai_lora_config_default();
    lc.rank = 3;
    lc.alpha = 6;
    lc.dropout = dropout;
    lc.targets = targets;
    cai_lora_t *l = NULL;
    OK(cai_lora_create(&l, dev, c, &lc));
    /* B non-zero, so every adapter acts (a fresh B is zero) */
    cai_tensor p;
    cai_lora_flat(l, &p, NULL);
    for (int i = 0; i < cai_lora_count(l); i++) {
        const cai_lora_adapter *a = cai_lora_get(l, i);
        float *b = malloc((size_t)(a->rows * 3) * sizeof *b);
        for (int64_t k = 0; k < a->rows * 3; k++) b[k] = 0.3f * (cai_rng_uniform(99, (uint64_t)i, (uint64_t)k) - 0.5f);
        OK(cai_lora_write(l, i, NULL, b));
        free(b);
    }
    return l;
}

START_TEST(targets_are_matched_as_peft_matches_them) {
    cai_model_config g = tiny(CAI_MODEL_GPT2), q = tiny(CAI_MODEL_LLAMA);
    cai_lora_config lc = cai_lora_config_default();
    cai_lora_t *l = NULL;
    lc.targets = "c_proj";
    OK(cai_lora_create(&l, dev, &g, &lc));
    ck_assert_int_eq(cai_lora_count(l), 4); /* attention and MLP projections of both layers */
    ck_assert_str_eq(cai_lora_get(l, 1)->hf_module, "transformer.h.0.mlp.c_proj");
    cai_lora_free(l);
    lc.targets = "attn.c_proj, c_attn";
    OK(cai_lora_create(&l, dev, &g, &lc));
    ck_assert_int_eq(cai_lora_count(l), 4);
    ck_assert_int_eq(cai_lora_get(l, 0)->rows, 36); /* c_attn: the whole fused q|k|v */
    cai_lora_free(l);
    lc.targets = "q_proj,v_proj";
    OK(cai_lora_create(&l, dev, &q, &lc));
    ck_assert_int_eq(cai_lora_count(l), 4);
    const cai_lora_adapter *v = cai_lora_get(l, 1);
    ck_assert_str_eq(v->hf_module, "model.layers.0.self_attn.v_proj");
    ck_assert_int_eq(v->row_offset, 16 + 8); /* after 4 query heads and 2 key heads of 4 */
    ck_assert_int_eq(v->rows, 8);
    ck_assert_int_eq(cai_lora_get(l, 0)->rows, 16);
    cai_lora_free(l);
    lc.targets = "all-linear";
    OK(cai_lora_create(&l, dev, &q, &lc));
    ck_assert_int_eq(cai_lora_count(l), 14);
    cai_lora_free(l);
    lc.targets = "c_attn,q_proj";
    FAILS(cai_lora_create(&l, dev, &g, &lc), CAI_ERR_CONFIG, "'q_proj' matches no module");
    lc.targets = "c_attn,q_proj";
    FAILS(cai_lora_create(&l, dev, &g, &lc), CAI_ERR_CONFIG, "transformer.h.{l}.mlp.c_fc");
    lc.targets = "proj";
    FAILS(cai_lora_create(&l, dev, &q, &lc), CAI_ERR_CONFIG, "'proj'"); /* whole name components only */
    /* bf16 activations (GPUs): the adapters get a bf16 copy; dropout there is refused */
    cai_model_config qb = q;
    qb.param_dtype = qb.act_dtype = CAI_DTYPE_BF16;
    cai_model_t *mb = make(&qb, 1, 0, 0);
    lc.targets = "q_proj";
    lc.dropout = 0.1f;
    OK(cai_lora_create(&l, dev, &qb, &lc));
    FAILS(cai_model_set_lora(mb, l), CAI_ERR_UNSUPPORTED, "lora.dropout=0.1 with bf16 activations");
    cai_lora_free(l);
    lc.dropout = 0.0f;
    OK(cai_lora_create(&l, dev, &qb, &lc));
    OK(cai_model_set_lora(mb, l));
    OK(cai_lora_params_updated(l));
    cai_lora_free(l);
    cai_model_free(mb);
    lc.rank = 0;
    FAILS(cai_lora_create(&l, dev, &q, &lc), CAI_ERR_CONFIG, "lora.rank=0");
    lc.rank = 4;
    lc.dropout = 1.0f;
    FAILS(cai_lora_create(&l, dev, &q, &lc), CAI_ERR_CONFIG, "lora.dropout");
}
END_TEST

START_TEST(a_fresh_adapter_changes_nothing_and_the_base_has_no_gradients) {
    for (int f = 0; f < 2; f++) {
        cai_model_config c = tiny((cai_model_family)f);
        int32_t tok[B * T], tgt[B * T];
        batch(&c, tok, tgt);
        cai_model_t *plain = make(&c, 0, 0, 0), *m = make(&c, 1, 0, 0);
        cai_lora_config lc = cai_lora_config_default();
        lc.targets = "all-linear";
        cai_lora_t *l = NULL;
        OK(cai_lora_create(&l, dev, &c, &lc));
        OK(cai_model_set_lora(m, l));
        float a = 0, b = 0;
        OK(cai_model_forward(plain, tok, tgt, &a));
        OK(cai_model_forward(m, tok, tgt, &b));
        ck_assert_float_eq(a, b);
        OK(cai_model_backward(m, 1.0f));
        cai_tensor w, g;
        OK(cai_model_param(m, "h.0.attn.qkv.weight", &w, &g));
        ck_assert_ptr_null(g.data);
        size_t pb_plain, pb_frozen, act;
        cai_model_memory(plain, &pb_plain, &act);
        cai_model_memory(m, &pb_frozen, &act);
        ck_assert_uint_lt(pb_frozen, pb_plain);
        /* B = 0: A's gradient is zero, B's is not */
        cai_tensor gr;
        cai_lora_flat(l, NULL, &gr);
        const float *gp = gr.data;
        const size_t *off = NULL;
        (void)off;
        double sa = 0, sb = 0;
        const cai_registry_t *reg = cai_lora_registry(l);
        size_t offs[64], total;
        cai_rank_view v = cai_rank_view_single();
        OK(cai_registry_local_layout(reg, &v, cai_lora_align_elems(l), offs, &total));
        for (int i = 0; i < cai_lora_count(l); i++) {
            const cai_lora_adapter *ad = cai_lora_get(l, i);
            for (uint64_t k = 0; k < cai_registry_param(reg, ad->a_index)->numel; k++)
                sa += fabs(gp[offs[ad->a_index] + k]);
            for (uint64_t k = 0; k < cai_registry_param(reg, ad->b_index)->numel; k++)
                sb += fabs(gp[offs[ad->b_index] + k]);
        }
        ck_assert(sa == 0.0);
        ck_assert(sb > 0.0);
        cai_lora_free(l);
        cai_model_free(m);
        cai_model_free(plain);
    }
}
END_TEST

/* Every adapter element's gradient against central differences of the loss. */
static void check_fd(cai_model_family f, float dropout) {
    cai_model_config c = tiny(f);
    int32_t tok[B * T], tgt[B * T];
    batch(&c, tok, tgt);
    cai_model_t *m = make(&c, 1, 0, 0);
    cai_lora_t *l = make_lora(&c, "all-linear", dropout);
    OK(cai_model_set_lora(m, l));
    cai_lora_set_dropout_key(l, 5); /* a fixed mask: the loss is a smooth function of the adapters */
    cai_tensor p, g;
    cai_lora_flat(l, &p, &g);
    float *pp = p.data, *gp = g.data;
    float loss;
    OK(cai_lora_zero_grad(l));
    OK(cai_model_forward(m, tok, tgt, &loss));
    OK(cai_model_backward(m, 1.0f));
    const int64_t n = cai_tensor_numel(&p);
    double worst = 0;
    int checked = 0;
    for (int64_t i = 0; i < n; i += 7) {
        const float keep = pp[i];
        const float eps = 1e-2f;
        float lp, lm;
        pp[i] = keep + eps;
        OK(cai_model_forward(m, tok, tgt, &lp));
        pp[i] = keep - eps;
        OK(cai_model_forward(m, tok, tgt, &lm));
        pp[i] = keep;
        const double fd = ((double)lp - (double)lm) / (2.0 * eps), err = fabs(fd - gp[i]);
        const double tol = 3e-4 + 0.02 * fabs(fd);
        ck_assert_msg(err <= tol, "%s dropout %g element %lld: analytic %g, central difference %g",
                      cai_model_family_name(f), (double)dropout, (long long)i, (double)gp[i], fd);
        if (err > worst) worst = err;
        checked++;
    }
    ck_assert_int_gt(checked, 50);
    cai_lora_set_eval(l);
    float eval;
    OK(cai_model_forward(m, tok, tgt, &eval));
    if (dropout > 0) ck_assert_float_ne(eval, loss);
    cai_lora_free(l);
    cai_model_free(m);
}

START_TEST(gpt2_adapter_gradients_match_finite_differences) {
    check_fd(CAI_MODEL_GPT2, 0.0f);
    check_fd(CAI_MODEL_GPT2, 0.3f);
}
END_TEST

START_TEST(llama_adapter_gradients_match_finite_differences) {
    check_fd(CAI_MODEL_LLAMA, 0.0f);
    check_fd(CAI_MODEL_LLAMA, 0.3f);
}
END_TEST

/* mode 0 plain, 1 activation checkpointing, 2 split backward */
static float *adapter_grads(const cai_model_config *c, int mode, const int32_t *tok, const int32_t *tgt, size_t *n) {
    cai_model_t *m = make(c, 1, mode == 1, mode == 2);
    cai_lora_t *l = make_lora(c, "all-linear", 0.2f);
    OK(cai_model_set_lora(m, l));
    cai_lora_set_dropout_key(l, 9);
    float loss;
    OK(cai_model_forward_train(m, tok, tgt, 0.5f, &loss));
    if (mode == 2) {
        OK(cai_model_backward_input(m, 0.5f));
        OK(cai_model_backward_weight(m));
    } else {
        OK(cai_model_backward(m, 0.5f));
    }
    cai_tensor g;
    cai_lora_flat(l, NULL, &g);
    *n = (size_t)cai_tensor_numel(&g);
    float *out = malloc(*n * sizeof *out);
    memcpy(out, g.data, *n * sizeof *out);
    cai_lora_free(l);
    cai_model_free(m);
    return out;
}

START_TEST(checkpointing_and_split_backward_give_identical_adapter_gradients) {
    for (int f = 0; f < 2; f++) {
        cai_model_config c = tiny((cai_model_family)f);
        int32_t tok[B * T], tgt[B * T];
        batch(&c, tok, tgt);
        size_t n0, n1, n2;
        float *g0 = adapter_grads(&c, 0, tok, tgt, &n0), *g1 = adapter_grads(&c, 1, tok, tgt, &n1),
              *g2 = adapter_grads(&c, 2, tok, tgt, &n2);
        ck_assert_uint_eq(n0, n1);
        ck_assert_uint_eq(n0, n2);
        ck_assert_msg(memcmp(g0, g1, n0 * sizeof *g0) == 0, "checkpointed gradients differ");
        ck_assert_msg(memcmp(g0, g2, n0 * sizeof *g0) == 0, "split backward gradients differ");
        free(g0);
        free(g1);
        free(g2);
    }
}
END_TEST

static double max_abs(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

/* Also over a bf16 base that keeps only its compute copy (what a LoRA run
 * holds): the export merges the weights the layers read. */
START_TEST(the_merged_export_gives_the_adapter_models_logits) {
    for (int v = 3; v >= 0; v--) {
        const int f = v % 2;
        cai_model_config c = tiny((cai_model_family)f), c32 = c;
        if (v >= 2) c.param_dtype = CAI_DTYPE_BF16;
        int32_t tok[B * T], tgt[B * T];
        batch(&c, tok, tgt);
        cai_model_t *m = make(&c, 1, 0, 0);
        OK(cai_model_keep_compute(m));
        cai_lora_t *l = make_lora(&c, f == CAI_MODEL_GPT2 ? "c_attn,c_proj,c_fc" : "all-linear", 0.1f);
        OK(cai_model_set_lora(m, l));
        char dir[] = "/tmp/test_lora_mergedXXXXXX";
        ck_assert_ptr_nonnull(mkdtemp(dir));
        cai_hf_export_options eo = cai_hf_export_options_default();
        OK(cai_lora_export_merged(dir, m, l, &eo, NULL));
        cai_hf_t *h = NULL;
        OK(cai_hf_open(&h, dir));
        cai_model_t *merged = make(&c32, 0, 0, 0);
        OK(cai_hf_import_model(h, merged));
        cai_hf_close(h);
        cai_tensor la, lb;
        OK(cai_model_forward(m, tok, NULL, NULL));
        OK(cai_model_logits(m, &la));
        OK(cai_model_forward(merged, tok, NULL, NULL));
        OK(cai_model_logits(merged, &lb));
        /* the real vocabulary's columns (the padding rows are not exported) */
        const int64_t n = cai_tensor_numel(&la), Vp = la.shape[2];
        const float *a = la.data, *b = lb.data;
        double d = 0;
        for (int64_t i = 0; i < n; i++)
            if (i % Vp < c.vocab_size) d = fmax(d, fabs((double)a[i] - b[i]));
        const double scale = max_abs(a, n);
        ck_assert_msg(d <= 1e-5 * scale, "%s: merged logits differ by %g (scale %g)",
                      cai_model_family_name((cai_model_family)f), d, scale);
        /* and the adapters did change the logits */
        cai_model_t *base = make(&c, 0, 0, 0);
        OK(cai_model_forward(base, tok, NULL, NULL));
        OK(cai_model_logits(base, &lb));
        double moved = 0;
        for (int64_t i = 0; i < n; i++)
            if (i % Vp < c.vocab_size) moved = fmax(moved, fabs((double)a[i] - ((const float *)lb.data)[i]));
        ck_assert(moved > 1e-3 * scale);
        cai_model_free(base);
        cai_model_free(merged);
        cai_model_free(m);
        cai_lora_free(l);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
    /* a base whose layers read bf16 (widened from its compute copy on
     * export) merges to the same bytes as one whose layers read the same
     * values in f32 (this backend runs neither forward in bf16) */
    char d16[] = "/tmp/test_lora_m16XXXXXX", d32[] = "/tmp/test_lora_m32XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(d16));
    ck_assert_ptr_nonnull(mkdtemp(d32));
    char *bytes[2];
    size_t len[2];
    for (int k = 0; k < 2; k++) {
        cai_model_config c = tiny(CAI_MODEL_LLAMA);
        c.param_dtype = CAI_DTYPE_BF16;
        c.act_dtype = k ? CAI_DTYPE_F32 : CAI_DTYPE_BF16;
        cai_model_t *m = make(&c, 1, 0, 0);
        OK(cai_model_keep_compute(m));
        cai_lora_t *l = make_lora(&c, "all-linear", 0.0f);
        OK(cai_model_set_lora(m, l));
        cai_hf_export_options eo = cai_hf_export_options_default();
        OK(cai_lora_export_merged(k ? d32 : d16, m, l, &eo, NULL));
        char path[512];
        snprintf(path, sizeof path, "%s/model.safetensors", k ? d32 : d16);
        FILE *fp = fopen(path, "rb");
        ck_assert_ptr_nonnull(fp);
        fseek(fp, 0, SEEK_END);
        len[k] = (size_t)ftell(fp);
        rewind(fp);
        bytes[k] = malloc(len[k]);
        ck_assert_uint_eq(fread(bytes[k], 1, len[k], fp), len[k]);
        fclose(fp);
        cai_model_free(m);
        cai_lora_free(l);
    }
    ck_assert(len[0] == len[1] && memcmp(bytes[0], bytes[1], len[0]) == 0);
    free(bytes[0]);
    free(bytes[1]);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", d16, d32);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(the_memory_plan_counts_adapters_only_as_trainable) {
    for (int f = 0; f < 4; f++) {
        cai_model_config c = tiny((cai_model_family)(f % 2));
        if (f >= 2) c.param_dtype = CAI_DTYPE_BF16; /* masters and the bf16 copy go; the f32 compute copy stays */
        cai_lora_t *l = make_lora(&c, "all-linear", 0.0f);
        cai_adamw_config ac = cai_adamw_config_default();
        cai_optim_t *o = NULL;
        OK(cai_lora_optim_create(&o, l, dev, &ac));
        cai_tensor mo, vo, g;
        cai_optim_state(o, &mo, &vo);
        cai_lora_flat(l, NULL, &g);
        cai_mem_plan_request q = {.model = c,
                                  .batch = B,
                                  .seq_len = T,
                                  .view = cai_rank_view_single(),
                                  .dp = 1,
                                  .dev = dev,
                                  .lora_flat = (size_t)cai_tensor_numel(&g)};
        cai_zero_config_init(&q.zero);
        q.zero.reduce_only = 1;
        cai_mem_plan p, full;
        OK(cai_mem_plan_compute(&q, &p));
        ck_assert_uint_eq(p.optim, cai_tensor_nbytes(&mo) + cai_tensor_nbytes(&vo));
        /* gradients: the adapters' buffer only (plus the plan's bucket packing, zero at dp 1) */
        /* the base as a LoRA run holds it: only the copy its layers read */
        cai_model_t *m = make(&c, 1, 0, 0);
        OK(cai_model_keep_compute(m));
        size_t pbytes, act;
        cai_model_memory(m, &pbytes, &act);
        ck_assert_uint_eq(p.grads, cai_tensor_nbytes(&g));
        ck_assert_uint_eq(p.master, cai_tensor_nbytes(&g));
        ck_assert_uint_eq(p.params, pbytes);
        q.lora_flat = 0;
        OK(cai_mem_plan_compute(&q, &full));
        ck_assert_uint_lt(p.optim, full.optim);
        cai_model_free(m);
        cai_optim_free(o);
        cai_lora_free(l);
    }
}
END_TEST

static void write_text(const char *dir, const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

START_TEST(peft_adapters_round_trip_and_malformed_ones_are_refused) {
    cai_model_config c = tiny(CAI_MODEL_GPT2);
    cai_lora_t *l = make_lora(&c, "c_attn,attn.c_proj", 0.1f);
    char dir[] = "/tmp/test_lora_peftXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    OK(cai_lora_export_peft(dir, l, "gpt2-base"));
    const char *cfg = read_text(dir, "adapter_config.json");
    ck_assert_ptr_nonnull(strstr(cfg, "\"peft_type\": \"LORA\""));
    ck_assert_ptr_nonnull(strstr(cfg, "\"fan_in_fan_out\": true"));
    ck_assert_ptr_nonnull(strstr(cfg, "\"attn.c_proj\""));
    ck_assert_ptr_nonnull(strstr(cfg, "\"base_model_name_or_path\": \"gpt2-base\""));
    cai_safetensors_t *sf = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    OK(cai_safetensors_open(&sf, path));
    const cai_st_entry *e = cai_safetensors_find(sf, "base_model.model.transformer.h.1.attn.c_attn.lora_A.weight");
    ck_assert_ptr_nonnull(e);
    ck_assert_uint_eq(e->shape[0], 3);
    ck_assert_uint_eq(e->shape[1], 12);
    ck_assert_int_eq(cai_safetensors_count(sf), 8);
    cai_safetensors_close(sf);

    cai_lora_config pc;
    char targets[256];
    OK(cai_lora_peft_config(dir, &pc, targets, sizeof targets));
    ck_assert_int_eq(pc.rank, 3);
    ck_assert_float_eq(pc.alpha, 6.0f);
    ck_assert_str_eq(targets, "c_attn,attn.c_proj");
    cai_lora_t *back = NULL;
    OK(cai_lora_create(&back, dev, &c, &pc));
    OK(cai_lora_import_peft(dir, back));
    cai_tensor pa, pb;
    cai_lora_flat(l, &pa, NULL);
    cai_lora_flat(back, &pb, NULL);
    ck_assert_int_eq(memcmp(pa.data, pb.data, cai_tensor_nbytes(&pa)), 0);

    /* a run with more targets than the file holds: the missing tensor is named */
    cai_lora_t *more = make_lora(&c, "c_attn,c_proj", 0.0f);
    FAILS(cai_lora_import_peft(dir, more), CAI_ERR_FORMAT, "mlp.c_proj.lora_A.weight");
    /* fewer: the left-over tensor is named */
    cai_lora_t *fewer = make_lora(&c, "c_attn", 0.0f);
    FAILS(cai_lora_import_peft(dir, fewer), CAI_ERR_FORMAT, "attn.c_proj.lora_");
    cai_lora_free(more);
    cai_lora_free(fewer);
    /* another rank: shapes named */
    cai_lora_config r2 = pc;
    r2.rank = 2;
    cai_lora_t *other = NULL;
    OK(cai_lora_create(&other, dev, &c, &r2));
    FAILS(cai_lora_import_peft(dir, other), CAI_ERR_FORMAT, "the adapter needs [2, 12]");
    cai_lora_free(other);

    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"peft_type\": \"PREFIX_TUNING\", \"r\": 4}", "field 'peft_type'"},
        {"{\"peft_type\": \"LORA\", \"r\": 0, \"lora_alpha\": 8}", "field 'r'"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": \"big\"}", "field 'lora_alpha'"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": \".*attn\"}",
         "field 'target_modules': a string is a regular expression"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"c_attn\", 3]}",
         "field 'target_modules[1]'"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"bias\": \"all\", \"target_modules\": [\"c_attn\"]}",
         "field 'bias'"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"use_dora\": true, \"target_modules\": [\"a\"]}",
         "field 'use_dora'"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"lora_dropout\": 1.5, \"target_modules\": [\"a\"]}",
         "field 'lora_dropout'"},
        {"{\"peft_type\": \"LORA\", \"r\": 4,", "not valid JSON"},
        {"[1, 2]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(dir, "adapter_config.json", bad[i].json);
        FAILS(cai_lora_peft_config(dir, &pc, targets, sizeof targets), CAI_ERR_FORMAT, bad[i].needle);
        write_text(dir, "adapter_config.json", bad[i].json);
        cai_lora_peft_config(dir, &pc, targets, sizeof targets);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "adapter_config.json"));
        cai_error_clear();
    }
    write_text(dir, "adapter_model.safetensors", "garbage");
    FAILS(cai_lora_import_peft(dir, back), CAI_ERR_FORMAT, "adapter_model.safetensors");
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    FAILS(cai_lora_peft_config(dir, &pc, targets, sizeof targets), CAI_ERR_IO, "adapter_config.json");
    cai_lora_free(back);
    cai_lora_free(l);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("lora");
    TCase *tc = tcase_create("lora");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, targets_are_matched_as_peft_matches_them);
    tcase_add_test(tc, a_fresh_adapter_changes_nothing_and_the_base_has_no_gradients);
    tcase_add_test(tc, gpt2_adapter_gradients_match_finite_differences);
    tcase_add_test(tc, llama_adapter_gradients_match_finite_differences);
    tcase_add_test(tc, checkpointing_and_split_backward_give_identical_adapter_gradients);
    tcase_add_test(tc, the_merged_export_gives_the_adapter_models_logits);
    tcase_add_test(tc, the_memory_plan_counts_adapters_only_as_trainable);
    tcase_add_test(tc, peft_adapters_round_trip_and_malformed_ones_are_refused);
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
