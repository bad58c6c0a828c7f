/* PyTorch parity driver for LoRA (colossal/lora.h): a tiny GPT-2 and a tiny
 * Llama, frozen, with adapters on every adaptable linear (B non-zero), one
 * masked forward and backward. Writes into one safetensors file, per family
 * f (gpt2, llama):
 *
 *   f.<name>              every base parameter by canonical registry name
 *   f.A.<module>, f.B.<module>            the adapters (HF module names)
 *   f.tokens, f.targets   I32 [B,T]
 *   f.logits              F32 [B,T,Vp]; f.loss F32 [1]
 *   f.gA.<module>, f.gB.<module>          the adapters' gradients
 *
 * and the configuration as __metadata__ (f.vocab_size, ..., f.rank,
 * f.alpha, f.modules). It also checks that the frozen base has no gradient
 * buffer. tests/parity/lora_reference.py recomputes it all in PyTorch.
 * Usage: lora_parity OUT.safetensors. Single process. */
#include "cai_config.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/lora.h"

enum { B = 2, T = 8, MAX_T = 256, MAX_META = 32 };

typedef struct {
    cai_st_tensor t[MAX_T];
    char names[MAX_T][CAI_PARAM_NAME_MAX + 16];
    int n;
    cai_st_meta meta[MAX_META];
    char kv[MAX_META][2][512];
    int n_meta;
    void *keep[MAX_T]; /* host copies written at the end */
    int n_keep;
} out_file;

static void put(out_file *o, const char *fam, const char *name, cai_dtype dt, int ndim, const int64_t *shape,
                const void *data) {
    snprintf(o->names[o->n], sizeof o->names[o->n], "%s.%s", fam, name);
    cai_st_tensor *t = &o->t[o->n++];
    memset(t, 0, sizeof *t);
    t->name = o->names[o->n - 1];
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = (uint64_t)shape[d];
    t->data = data;
}

static void *copy(out_file *o, const void *src, size_t bytes) {
    void *p = malloc(bytes);
    memcpy(p, src, bytes);
    o->keep[o->n_keep++] = p;
    return p;
}

static void meta(out_file *o, const char *fam, const char *key, const char *fmt, ...) {
    snprintf(o->kv[o->n_meta][0], sizeof o->kv[0][0], "%s.%s", fam, key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->kv[o->n_meta][1], sizeof o->kv[0][1], fmt, ap);
    va_end(ap);
    o->meta[o->n_meta] = (cai_st_meta){o->kv[o->n_meta][0], o->kv[o->n_meta][1]};
    o->n_meta++;
}

static cai_status run_family(out_file *o, cai_device_t *dev, cai_model_family f) {
    const char *fam = cai_model_family_name(f);
    cai_model_config c = cai_model_config_default(f);
    c.vocab_size = f == CAI_MODEL_GPT2 ? 50 : 37;
    c.n_layers = 2;
    c.d_model = 16;
    c.n_heads = 4;
    c.n_kv_heads = f == CAI_MODEL_GPT2 ? 0 : 2;
    c.ffn_hidden = f == CAI_MODEL_GPT2 ? 0 : 24;
    c.max_seq_len = T;
    c.rope_theta = 500.0f;
    c.seed = 5;
    cai_model_options mo = cai_model_options_default(&c);
    mo.batch = B;
    mo.seq_len = T;
    mo.frozen = 1;
    cai_model_t *m = NULL;
    CAI_CALL(cai_model_create(&m, dev, &c, &mo));
    cai_lora_config lc = cai_lora_config_default();
    lc.rank = 4;
    lc.alpha = 6;
    lc.dropout = 0;
    lc.targets = "all-linear";
    cai_lora_t *l = NULL;
    CAI_CALL(cai_lora_create(&l, dev, &c, &lc));
    char modules[400] = "";
    for (int i = 0; i < cai_lora_count(l); i++) {
        const cai_lora_adapter *a = cai_lora_get(l, i);
        float *bm = malloc((size_t)(a->rows * lc.rank) * sizeof *bm);
        for (int64_t k = 0; k < a->rows * lc.rank; k++) bm[k] = 0.2f * (cai_rng_normal(3, (uint64_t)i, (uint64_t)k));
        CAI_CALL(cai_lora_write(l, i, NULL, bm));
        free(bm);
        const char *short_name = strchr(strchr(strchr(a->hf_module, '.') + 1, '.') + 1, '.') + 1;
        if (a->layer == 0)
            snprintf(modules + strlen(modules), sizeof modules - strlen(modules), "%s%s", *modules ? "," : "",
                     short_name);
    }
    CAI_CALL(cai_model_set_lora(m, l));

    const cai_registry_t *reg = cai_model_registry(m);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        cai_tensor w, g;
        CAI_CALL(cai_model_param(m, p->name, &w, &g));
        if (g.data)
            return CAI_ERROR(CAI_ERR_INTERNAL, "%s: the frozen base parameter '%s' has a gradient buffer", fam,
                             p->name);
        put(o, fam, p->name, CAI_DTYPE_F32, w.ndim, w.shape, copy(o, w.data, cai_tensor_nbytes(&w)));
    }
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 11 + 3) % c.vocab_size;
        tgt[i] = i % 4 == 1 ? CAI_IGNORE_INDEX : (i * 7 + 2) % c.vocab_size;
    }
    put(o, fam, "tokens", CAI_DTYPE_I32, 2, (int64_t[]){B, T}, copy(o, tok, sizeof tok));
    put(o, fam, "targets", CAI_DTYPE_I32, 2, (int64_t[]){B, T}, copy(o, tgt, sizeof tgt));
    float loss = 0;
    CAI_CALL(cai_model_forward(m, tok, tgt, &loss));
    cai_tensor logits;
    CAI_CALL(cai_model_logits(m, &logits));
    put(o, fam, "logits", CAI_DTYPE_F32, 3, logits.shape, copy(o, logits.data, cai_tensor_nbytes(&logits)));
    put(o, fam, "loss", CAI_DTYPE_F32, 1, (int64_t[]){1}, copy(o, &loss, sizeof loss));
    CAI_CALL(cai_lora_zero_grad(l));
    CAI_CALL(cai_model_backward(m, 1.0f));

    size_t offs[128], total;
    cai_rank_view v = cai_rank_view_single();
    CAI_CALL(cai_registry_local_layout(cai_lora_registry(l), &v, cai_lora_align_elems(l), offs, &total));
    cai_tensor pp, gg;
    cai_lora_flat(l, &pp, &gg);
    for (int i = 0; i < cai_lora_count(l); i++) {
        const cai_lora_adapter *a = cai_lora_get(l, i);
        char n[CAI_PARAM_NAME_MAX];
        const int64_t sa[2] = {lc.rank, a->in}, sb[2] = {a->rows, lc.rank};
        const size_t na = (size_t)(lc.rank * a->in) * 4, nb = (size_t)(a->rows * lc.rank) * 4;
        snprintf(n, sizeof n, "A.%s", a->hf_module);
        put(o, fam, n, CAI_DTYPE_F32, 2, sa, copy(o, (float *)pp.data + offs[a->a_index], na));
        snprintf(n, sizeof n, "B.%s", a->hf_module);
        put(o, fam, n, CAI_DTYPE_F32, 2, sb, copy(o, (float *)pp.data + offs[a->b_index], nb));
        snprintf(n, sizeof n, "gA.%s", a->hf_module);
        put(o, fam, n, CAI_DTYPE_F32, 2, sa, copy(o, (float *)gg.data + offs[a->a_index], na));
        snprintf(n, sizeof n, "gB.%s", a->hf_module);
        put(o, fam, n, CAI_DTYPE_F32, 2, sb, copy(o, (float *)gg.data + offs[a->b_index], nb));
    }
    const cai_model_config *r = cai_model_config_of(m);
    meta(o, fam, "vocab_size", "%d", r->vocab_size);
    meta(o, fam, "n_layers", "%d", r->n_layers);
    meta(o, fam, "d_model", "%d", r->d_model);
    meta(o, fam, "n_heads", "%d", r->n_heads);
    meta(o, fam, "n_kv_heads", "%d", r->n_kv_heads);
    meta(o, fam, "ffn_hidden", "%d", r->ffn_hidden);
    meta(o, fam, "norm_eps", "%.9g", (double)r->norm_eps);
    meta(o, fam, "rope_theta", "%.9g", (double)r->rope_theta);
    meta(o, fam, "tie_embeddings", "%d", r->tie_embeddings);
    meta(o, fam, "rank", "%d", lc.rank);
    meta(o, fam, "alpha", "%.9g", (double)lc.alpha);
    meta(o, fam, "modules", "%s", modules);
    printf("lora parity driver: %s, %d adapters (%s), loss %.6f, no gradient buffer for the %d base parameters\n", fam,
           cai_lora_count(l), modules, (double)loss, cai_registry_count(reg));
    cai_lora_free(l);
    cai_model_free(m);
    return CAI_OK;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (argc != 2) {
        fprintf(stderr, "usage: lora_parity OUT.safetensors\n");
        MPI_Finalize();
        return 2;
    }
    cai_device_t *dev = NULL;
    static out_file o;
    cai_status st = cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1);
    if (st == CAI_OK) st = run_family(&o, dev, CAI_MODEL_GPT2);
    if (st == CAI_OK) st = run_family(&o, dev, CAI_MODEL_LLAMA);
    if (st == CAI_OK) st = cai_safetensors_write(argv[1], o.t, o.n, o.meta, o.n_meta);
    if (st != CAI_OK) cai_error_print(stderr);
    for (int i = 0; i < o.n_keep; i++) free(o.keep[i]);
    cai_device_free(dev);
    MPI_Finalize();
    return st == CAI_OK ? 0 : 1;
}
