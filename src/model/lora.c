/* LoRA adapters (colossal/lora.h): targets by Hugging Face module name,
 * their own registry and F32 flat buffers, PEFT's initialisation, and the
 * adapter forward and backward the layers call at each linear. The adapter
 * keeps no activations: the backward recomputes A drop(x) from the linear's
 * input, which the base layer saves anyway, so activation checkpointing and
 * the split backward need nothing of their own. */
#include "cai_config.h"
#include "colossal/lora.h"
#include "colossal/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *module; /* after the layer prefix */
    cai_lora_site site;
    const char *param; /* colossal weight suffix */
} candidate;

/* Row ranges are filled from the config (QKV slices). */
static const candidate k_llama[] = {
    {"self_attn.q_proj", CAI_LORA_SITE_QKV, "attn.qkv.weight"},
    {"self_attn.k_proj", CAI_LORA_SITE_QKV, "attn.qkv.weight"},
    {"self_attn.v_proj", CAI_LORA_SITE_QKV, "attn.qkv.weight"},
    {"self_attn.o_proj", CAI_LORA_SITE_ATTN_PROJ, "attn.proj.weight"},
    {"mlp.gate_proj", CAI_LORA_SITE_FC, "mlp.fc.weight"},
    {"mlp.up_proj", CAI_LORA_SITE_UP, "mlp.up.weight"},
    {"mlp.down_proj", CAI_LORA_SITE_MLP_PROJ, "mlp.proj.weight"},
};
static const candidate k_gpt2[] = {
    {"attn.c_attn", CAI_LORA_SITE_QKV, "attn.qkv.weight"},
    {"attn.c_proj", CAI_LORA_SITE_ATTN_PROJ, "attn.proj.weight"},
    {"mlp.c_fc", CAI_LORA_SITE_FC, "mlp.fc.weight"},
    {"mlp.c_proj", CAI_LORA_SITE_MLP_PROJ, "mlp.proj.weight"},
};

const char *cai_lora_family_modules(cai_model_family f) {
    return f == CAI_MODEL_LLAMA ? "model.layers.{l}.self_attn.{q,k,v,o}_proj, model.layers.{l}.mlp.{gate,up,down}_proj"
                                : "transformer.h.{l}.attn.c_attn, transformer.h.{l}.attn.c_proj, "
                                  "transformer.h.{l}.mlp.c_fc, transformer.h.{l}.mlp.c_proj";
}

typedef struct {
    cai_lora_adapter info;
    char hf[CAI_PARAM_NAME_MAX], param[CAI_PARAM_NAME_MAX];
    cai_tensor A, B, gA, gB; /* views into the flat buffers */
    cai_tensor Ac, Bc;       /* what the matmuls read: A and B, or their copies in the activations' dtype */
    uint64_t stream;         /* dropout stream of this adapter */
} adapter;

struct cai_lora_layer {
    cai_lora_t *l;
    int first, count; /* adapters [first, first + count) */
};

struct cai_lora {
    cai_lora_config cfg;
    char targets[CAI_LORA_MAX_TARGETS * CAI_LORA_TARGET_MAX];
    char target_names[CAI_LORA_MAX_TARGETS][CAI_LORA_TARGET_MAX];
    const char *target_ptrs[CAI_LORA_MAX_TARGETS];
    int n_targets;
    cai_model_config mc;
    cai_device_t *dev;
    float scale;
    cai_registry_t *reg;
    size_t *offsets, n_flat, align;
    float *master, *grads;
    void *compute; /* the adapters in act (when not F32), refreshed by cai_lora_params_updated */
    cai_dtype act;
    adapter *ad;
    int n_ad;
    cai_lora_layer *layers;
    /* scratch for one microbatch: h and dh [N, r], xd and dxd [N, in_max] (dropout only), host staging */
    int64_t N, in_max;
    cai_tensor h, dh, xd, dxd;
    void *scratch;
    float *host;
    int dropout_on;
    uint64_t key;
};

cai_lora_config cai_lora_config_default(void) {
    cai_lora_config c = {8, 16.0f, 0.05f, "q_proj,v_proj", 1234, 0};
    return c;
}

/* PEFT's rule: the module's full name is the target or ends with "." + target. */
static int matches(const char *full, const char *target) {
    if (strcmp(target, "all-linear") == 0) return 1;
    size_t n = strlen(full), t = strlen(target);
    if (t > n) return 0;
    if (strcmp(full + n - t, target) != 0) return 0;
    return t == n || full[n - t - 1] == '.';
}

static cai_status parse_targets(cai_lora_t *l, const char *spec) {
    CAI_CHECK_ARG(spec && *spec, "lora.targets is empty: name the modules to adapt (e.g. q_proj,v_proj)");
    const char *p = spec;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        while (len && (*p == ' ')) p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if (len == 0) return CAI_ERROR(CAI_ERR_CONFIG, "lora.targets='%s': an empty name in the list", spec);
        if (l->n_targets == CAI_LORA_MAX_TARGETS)
            return CAI_ERROR(CAI_ERR_CONFIG, "lora.targets='%s': more than %d names", spec, CAI_LORA_MAX_TARGETS);
        if (len >= CAI_LORA_TARGET_MAX)
            return CAI_ERROR(CAI_ERR_CONFIG, "lora.targets: '%.*s' is longer than %d bytes", (int)len, p,
                             CAI_LORA_TARGET_MAX - 1);
        memcpy(l->target_names[l->n_targets], p, len);
        l->target_names[l->n_targets][len] = '\0';
        l->target_ptrs[l->n_targets] = l->target_names[l->n_targets];
        l->n_targets++;
        if (!e) break;
        p = e + 1;
    }
    size_t at = 0;
    for (int i = 0; i < l->n_targets; i++)
        at += (size_t)snprintf(l->targets + at, sizeof l->targets - at, "%s%s", i ? "," : "", l->target_names[i]);
    l->cfg.targets = l->targets;
    return CAI_OK;
}

/* Row range and input width of a candidate under the config. */
static void geometry(const cai_model_config *c, const candidate *cd, int64_t *off, int64_t *rows, int64_t *in) {
    const int64_t C = c->d_model, D = c->d_model / c->n_heads, Hq = c->n_heads, Hkv = c->n_kv_heads;
    const int64_t F = c->ffn_hidden;
    *off = 0;
    *in = C;
    switch (cd->site) {
    case CAI_LORA_SITE_QKV:
        if (strstr(cd->module, "q_proj")) *rows = Hq * D;
        else if (strstr(cd->module, "k_proj")) *off = Hq * D, *rows = Hkv * D;
        else if (strstr(cd->module, "v_proj")) *off = (Hq + Hkv) * D, *rows = Hkv * D;
        else *rows = (Hq + 2 * Hkv) * D;
        break;
    case CAI_LORA_SITE_ATTN_PROJ: *rows = C, *in = Hq * D; break;
    case CAI_LORA_SITE_FC:
    case CAI_LORA_SITE_UP: *rows = F; break;
    default: *rows = C, *in = F; break;
    }
}

static cai_status add_adapters(cai_lora_t *l, const candidate *cands, int n_cand, const char *prefix) {
    const int L = l->mc.n_layers, r = l->cfg.rank;
    int used[CAI_LORA_MAX_TARGETS] = {0};
    CAI_CALL(cai_calloc((void **)&l->ad, (size_t)L * (size_t)n_cand, sizeof *l->ad, "LoRA adapters"));
    CAI_CALL(cai_calloc((void **)&l->layers, (size_t)L, sizeof *l->layers, "LoRA layers"));
    for (int layer = 0; layer < L; layer++) {
        l->layers[layer] = (cai_lora_layer){l, l->n_ad, 0};
        for (int c = 0; c < n_cand; c++) {
            char full[CAI_PARAM_NAME_MAX];
            snprintf(full, sizeof full, "%s%d.%s", prefix, layer, cands[c].module);
            int hit = 0;
            for (int t = 0; t < l->n_targets; t++)
                if (matches(full, l->target_names[t])) used[t] = hit = 1;
            if (!hit) continue;
            adapter *a = &l->ad[l->n_ad++];
            l->layers[layer].count++;
            snprintf(a->hf, sizeof a->hf, "%s", full);
            snprintf(a->param, sizeof a->param, "h.%d.%s", layer, cands[c].param);
            a->info.layer = layer;
            a->info.site = cands[c].site;
            geometry(&l->mc, &cands[c], &a->info.row_offset, &a->info.rows, &a->info.in);
            a->info.hf_module = a->hf;
            a->info.param = a->param;
            a->stream = cai_hash64(full);
            cai_param_spec s = cai_param_spec_default();
            s.layer = layer;
            char name[CAI_PARAM_NAME_MAX];
            snprintf(name, sizeof name, "h.%d.%s.lora_a.weight", layer, cands[c].module);
            CAI_CALL(cai_registry_add(l->reg, name, 2, (uint64_t[]){(uint64_t)r, (uint64_t)a->info.in}, CAI_DTYPE_F32,
                                      &s, &a->info.a_index));
            snprintf(name, sizeof name, "h.%d.%s.lora_b.weight", layer, cands[c].module);
            CAI_CALL(cai_registry_add(l->reg, name, 2, (uint64_t[]){(uint64_t)a->info.rows, (uint64_t)r}, CAI_DTYPE_F32,
                                      &s, &a->info.b_index));
        }
    }
    for (int t = 0; t < l->n_targets; t++)
        if (!used[t])
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "lora.targets: '%s' matches no module of this %s model (a target is a module name or "
                             "its last components, as PEFT's target_modules; the modules are %s)",
                             l->target_names[t], cai_model_family_name(l->mc.family),
                             cai_lora_family_modules(l->mc.family));
    return CAI_OK;
}

static cai_status bind_views(cai_lora_t *l) {
    for (int i = 0; i < l->n_ad; i++) {
        adapter *a = &l->ad[i];
        const int64_t r = l->cfg.rank, in = a->info.in, rows = a->info.rows;
        const size_t oa = l->offsets[a->info.a_index], ob = l->offsets[a->info.b_index];
        a->A = cai_tensor_2d(l->dev, l->master + oa, CAI_DTYPE_F32, r, in);
        a->B = cai_tensor_2d(l->dev, l->master + ob, CAI_DTYPE_F32, rows, r);
        a->gA = cai_tensor_2d(l->dev, l->grads + oa, CAI_DTYPE_F32, r, in);
        a->gB = cai_tensor_2d(l->dev, l->grads + ob, CAI_DTYPE_F32, rows, r);
        a->Ac = a->A;
        a->Bc = a->B;
        if (l->compute) {
            const size_t es = cai_dtype_size(l->act);
            a->Ac = cai_tensor_2d(l->dev, (char *)l->compute + oa * es, l->act, r, in);
            a->Bc = cai_tensor_2d(l->dev, (char *)l->compute + ob * es, l->act, rows, r);
        }
    }
    return CAI_OK;
}

static cai_copy_kind to_dev(const cai_device_t *d) { return d->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D; }
static cai_copy_kind to_host(const cai_device_t *d) { return d->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H; }

/* kaiming_uniform_(a=sqrt(5)) on [r, in]: gain sqrt(2/(1+5)), bound gain*sqrt(3/in) = 1/sqrt(in). */
static cai_status init_adapters(cai_lora_t *l) {
    float *host = NULL;
    CAI_CALL(cai_calloc((void **)&host, l->n_flat ? l->n_flat : 1, sizeof *host, "LoRA initial values"));
    for (int i = 0; i < l->n_ad; i++) {
        const cai_param_info *p = cai_registry_param(l->reg, l->ad[i].info.a_index);
        const double bound = 1.0 / sqrt((double)l->ad[i].info.in);
        float *a = host + l->offsets[l->ad[i].info.a_index];
        for (uint64_t k = 0; k < p->numel; k++)
            a[k] = (float)((2.0 * (double)cai_rng_uniform(l->cfg.seed, p->init_stream, k) - 1.0) * bound);
    }
    cai_status st = cai_device_copy(l->dev, l->master, host, l->n_flat * sizeof(float), to_dev(l->dev));
    cai_free(host);
    return st;
}

cai_status cai_lora_create(cai_lora_t **out, cai_device_t *dev, const cai_model_config *cfg,
                           const cai_lora_config *lc) {
    CAI_CHECK_ARG(out && dev && cfg && lc, "cai_lora_create: NULL argument");
    *out = NULL;
    if (lc->rank < 1) return CAI_ERROR(CAI_ERR_CONFIG, "lora.rank=%d: an adapter needs rank >= 1", lc->rank);
    if (!(lc->dropout >= 0.0f && lc->dropout < 1.0f))
        return CAI_ERROR(CAI_ERR_CONFIG, "lora.dropout=%g must lie in [0, 1)", (double)lc->dropout);
    if (!isfinite(lc->alpha) || lc->alpha < 0.0f)
        return CAI_ERROR(CAI_ERR_CONFIG, "lora.alpha=%g must be finite and >= 0 (0 means the rank)", (double)lc->alpha);
    cai_lora_t *l = NULL;
    CAI_CALL(cai_calloc((void **)&l, 1, sizeof *l, "LoRA"));
    cai_status st = CAI_OK;
    l->cfg = *lc;
    if (l->cfg.alpha == 0.0f) l->cfg.alpha = (float)lc->rank;
    l->scale = l->cfg.alpha / (float)lc->rank;
    l->dev = dev;
    l->align = 16;
    l->act = CAI_DTYPE_F32;
    CAI_CALL_GOTO(cai_model_config_resolve(cfg, &l->mc), st, fail);
    CAI_CALL_GOTO(parse_targets(l, lc->targets), st, fail);
    cai_registry_options ro = {.n_layers = l->mc.n_layers};
    CAI_CALL_GOTO(cai_registry_init(&l->reg, &ro), st, fail);
    if (l->mc.family == CAI_MODEL_LLAMA)
        CAI_CALL_GOTO(add_adapters(l, k_llama, (int)(sizeof k_llama / sizeof *k_llama), "model.layers."), st, fail);
    else CAI_CALL_GOTO(add_adapters(l, k_gpt2, (int)(sizeof k_gpt2 / sizeof *k_gpt2), "transformer.h."), st, fail);
    const int n = cai_registry_count(l->reg);
    CAI_CALL_GOTO(cai_calloc((void **)&l->offsets, (size_t)n + 1, sizeof *l->offsets, "LoRA layout"), st, fail);
    cai_rank_view v = cai_rank_view_single();
    CAI_CALL_GOTO(cai_registry_local_layout(l->reg, &v, l->align, l->offsets, &l->n_flat), st, fail);
    CAI_CALL_GOTO(cai_device_alloc(dev, l->n_flat * sizeof(float), "LoRA adapters", (void **)&l->master), st, fail);
    CAI_CALL_GOTO(cai_device_alloc(dev, l->n_flat * sizeof(float), "LoRA gradients", (void **)&l->grads), st, fail);
    CAI_CALL_GOTO(bind_views(l), st, fail);
    CAI_CALL_GOTO(init_adapters(l), st, fail);
    CAI_CALL_GOTO(cai_lora_zero_grad(l), st, fail);
    *out = l;
    return CAI_OK;
fail:
    cai_lora_free(l);
    return st;
}

void cai_lora_free(cai_lora_t *l) {
    if (!l) return;
    cai_device_dealloc(l->dev, l->master);
    cai_device_dealloc(l->dev, l->grads);
    cai_device_dealloc(l->dev, l->scratch);
    cai_device_dealloc(l->dev, l->compute);
    cai_free(l->host);
    cai_free(l->offsets);
    cai_free(l->ad);
    cai_free(l->layers);
    cai_registry_free(l->reg);
    cai_free(l);
}

const cai_lora_config *cai_lora_config_of(const cai_lora_t *l) { return &l->cfg; }
float cai_lora_scale(const cai_lora_t *l) { return l->scale; }
cai_device_t *cai_lora_device(const cai_lora_t *l) { return l->dev; }
const cai_model_config *cai_lora_model_config(const cai_lora_t *l) { return &l->mc; }
int cai_lora_count(const cai_lora_t *l) { return l ? l->n_ad : 0; }
const cai_lora_adapter *cai_lora_get(const cai_lora_t *l, int i) {
    return l && i >= 0 && i < l->n_ad ? &l->ad[i].info : NULL;
}
int cai_lora_targets(const cai_lora_t *l, const char *const **names) {
    *names = l->target_ptrs;
    return l->n_targets;
}
const cai_registry_t *cai_lora_registry(const cai_lora_t *l) { return l->reg; }
size_t cai_lora_align_elems(const cai_lora_t *l) { return l->align; }
uint64_t cai_lora_numel(const cai_lora_t *l) { return cai_registry_global_numel(l->reg); }

void cai_lora_flat(cai_lora_t *l, cai_tensor *params, cai_tensor *grads) {
    if (params) *params = cai_tensor_1d(l->dev, l->master, CAI_DTYPE_F32, (int64_t)l->n_flat);
    if (grads) *grads = cai_tensor_1d(l->dev, l->grads, CAI_DTYPE_F32, (int64_t)l->n_flat);
}

cai_status cai_lora_zero_grad(cai_lora_t *l) {
    cai_tensor g = cai_tensor_1d(l->dev, l->grads, CAI_DTYPE_F32, (int64_t)l->n_flat);
    return l->dev->ops->fill(l->dev, &g, 0.0f);
}

const cai_lora_layer *cai_lora_layer_of(const cai_lora_t *l, int layer) {
    return l && layer >= 0 && layer < l->mc.n_layers ? &l->layers[layer] : NULL;
}

cai_status cai_lora_read(const cai_lora_t *l, int i, float *a, float *b) {
    CAI_CHECK_ARG(l && i >= 0 && i < l->n_ad, "cai_lora_read: adapter %d out of range", i);
    const adapter *d = &l->ad[i];
    if (a) CAI_CALL(cai_device_copy(l->dev, a, d->A.data, cai_tensor_nbytes(&d->A), to_host(l->dev)));
    if (b) CAI_CALL(cai_device_copy(l->dev, b, d->B.data, cai_tensor_nbytes(&d->B), to_host(l->dev)));
    return CAI_OK;
}

cai_status cai_lora_write(cai_lora_t *l, int i, const float *a, const float *b) {
    CAI_CHECK_ARG(l && i >= 0 && i < l->n_ad, "cai_lora_write: adapter %d out of range", i);
    adapter *d = &l->ad[i];
    if (a) CAI_CALL(cai_device_copy(l->dev, d->A.data, a, cai_tensor_nbytes(&d->A), to_dev(l->dev)));
    if (b) CAI_CALL(cai_device_copy(l->dev, d->B.data, b, cai_tensor_nbytes(&d->B), to_dev(l->dev)));
    return cai_lora_params_updated(l);
}

cai_status cai_lora_merge(const cai_lora_t *l, const char *name, float *w) {
    CAI_CHECK_ARG(l && name && w, "cai_lora_merge: NULL argument");
    const int64_t r = l->cfg.rank;
    for (int i = 0; i < l->n_ad; i++) {
        const adapter *d = &l->ad[i];
        if (strcmp(d->param, name) != 0) continue;
        const int64_t rows = d->info.rows, in = d->info.in;
        float *a = NULL, *b = NULL;
        CAI_CALL(cai_calloc((void **)&a, (size_t)(r * in), sizeof *a, "LoRA merge"));
        cai_status st = cai_calloc((void **)&b, (size_t)(rows * r), sizeof *b, "LoRA merge");
        if (st == CAI_OK) st = cai_lora_read(l, i, a, b);
        /* in double, then rounded once: PEFT's merge computes B @ A in the adapter dtype */
        for (int64_t o = 0; st == CAI_OK && o < rows; o++) {
            float *row = w + (d->info.row_offset + o) * in;
            for (int64_t j = 0; j < in; j++) {
                double s = 0;
                for (int64_t k = 0; k < r; k++) s += (double)b[o * r + k] * (double)a[k * in + j];
                row[j] += (float)((double)l->scale * s);
            }
        }
        cai_free(a);
        cai_free(b);
        CAI_CALL(st);
    }
    return CAI_OK;
}

cai_status cai_lora_params_updated(cai_lora_t *l) {
    CAI_CHECK_ARG(l, "cai_lora_params_updated: NULL adapters");
    if (!l->compute) return CAI_OK;
    cai_tensor dst = cai_tensor_1d(l->dev, l->compute, l->act, (int64_t)l->n_flat);
    cai_tensor src = cai_tensor_1d(l->dev, l->master, CAI_DTYPE_F32, (int64_t)l->n_flat);
    return l->dev->ops->copy(l->dev, &dst, &src);
}

cai_status cai_lora_prepare(cai_lora_t *l, int batch, int seq_len, cai_dtype act_dtype) {
    CAI_CHECK_ARG(l && batch >= 1 && seq_len >= 1, "cai_lora_prepare: bad argument");
    if (act_dtype != CAI_DTYPE_F32 && act_dtype != CAI_DTYPE_BF16 && act_dtype != CAI_DTYPE_F16)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "LoRA adapters: activations in %s (f32, bf16 or f16 only)",
                         cai_dtype_name(act_dtype));
    const int drop = l->cfg.dropout > 0.0f;
    if (drop && act_dtype != CAI_DTYPE_F32)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "lora.dropout=%g with %s activations: the dropout masks are applied in f32 (run with "
                         "lora.dropout=0, or f32 activations)",
                         (double)l->cfg.dropout, cai_dtype_name(act_dtype));
    const int64_t N = (int64_t)batch * seq_len, r = l->cfg.rank;
    int64_t in_max = 1;
    for (int i = 0; i < l->n_ad; i++)
        if (l->ad[i].info.in > in_max) in_max = l->ad[i].info.in;
    if (N == l->N && in_max == l->in_max && act_dtype == l->act && l->scratch) return CAI_OK;
    cai_device_dealloc(l->dev, l->scratch);
    cai_device_dealloc(l->dev, l->compute);
    cai_free(l->host);
    l->scratch = l->compute = NULL;
    l->host = NULL;
    l->act = act_dtype;
    const size_t es = cai_dtype_size(act_dtype);
    const size_t small = (size_t)(N * r) * es, big = drop ? (size_t)(N * in_max) * sizeof(float) : 0;
    CAI_CALL(cai_device_alloc(l->dev, 2 * small + 2 * big, "LoRA scratch", &l->scratch));
    char *s = l->scratch;
    l->h = cai_tensor_2d(l->dev, s, act_dtype, N, r);
    l->dh = cai_tensor_2d(l->dev, s + small, act_dtype, N, r);
    if (drop) {
        l->xd = cai_tensor_2d(l->dev, s + 2 * small, CAI_DTYPE_F32, N, in_max);
        l->dxd = cai_tensor_2d(l->dev, s + 2 * small + big, CAI_DTYPE_F32, N, in_max);
        CAI_CALL(cai_calloc((void **)&l->host, (size_t)(N * in_max), sizeof(float), "LoRA dropout staging"));
    }
    if (act_dtype != CAI_DTYPE_F32)
        CAI_CALL(cai_device_alloc(l->dev, l->n_flat * es, "LoRA adapters in the activations' dtype", &l->compute));
    CAI_CALL(bind_views(l));
    l->N = N;
    l->in_max = in_max;
    return cai_lora_params_updated(l);
}

void cai_lora_set_dropout_key(cai_lora_t *l, uint64_t key) {
    l->key = key;
    l->dropout_on = l->cfg.dropout > 0.0f;
}

void cai_lora_set_eval(cai_lora_t *l) { l->dropout_on = 0; }

int cai_lora_at(const cai_lora_layer *ll, cai_lora_site site) {
    if (!ll) return 0;
    for (int i = 0; i < ll->count; i++)
        if (ll->l->ad[ll->first + i].info.site == site) return 1;
    return 0;
}

/* dst [N, in] = src * mask / (1 - p), the mask of (seed, key, adapter, dp rank); through host memory (the op
 * table has no elementwise product, and the masks are drawn on the host). */
static cai_status apply_dropout(cai_lora_t *l, const adapter *a, const cai_tensor *src, cai_tensor *dst) {
    const size_t n = (size_t)cai_tensor_numel(src);
    CAI_CALL(cai_device_copy(l->dev, l->host, src->data, n * sizeof(float), to_host(l->dev)));
    const uint64_t stream = a->stream ^ (l->key * 0x9E3779B97F4A7C15ull) ^ (l->cfg.dropout_rank << 48);
    const float p = l->cfg.dropout, keep = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) l->host[i] = cai_rng_uniform(l->cfg.seed, stream, i) < p ? 0.0f : l->host[i] * keep;
    return cai_device_copy(l->dev, dst->data, l->host, n * sizeof(float), to_dev(l->dev));
}

/* The adapter's input as [N, in]: x itself, or its dropped-out copy. */
static cai_status adapter_input(cai_lora_t *l, const adapter *a, const cai_tensor *x2, cai_tensor *xin) {
    *xin = *x2;
    if (!l->dropout_on) return CAI_OK;
    cai_tensor t;
    CAI_CALL(cai_tensor_init(&t, l->dev, l->xd.data, CAI_DTYPE_F32, 2, (int64_t[]){x2->shape[0], a->info.in}));
    CAI_CALL(apply_dropout(l, a, x2, &t));
    *xin = t;
    return CAI_OK;
}

static cai_status as_rows(const cai_tensor *t, cai_tensor *out) {
    const int64_t X = t->shape[t->ndim - 1];
    return cai_tensor_reshape(t, 2, (int64_t[]){cai_tensor_numel(t) / X, X}, out);
}

static cai_status check_shapes(const cai_lora_t *l, const adapter *a, const cai_tensor *x2, const cai_tensor *y2) {
    if (x2->shape[0] != l->N || x2->shape[1] != a->info.in || y2->shape[0] != l->N ||
        y2->shape[1] < a->info.row_offset + a->info.rows)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "LoRA %s: input [%lld, %lld] / output [%lld, %lld] do not fit the adapter (in %lld, rows "
                         "%lld at %lld) at the prepared %lld tokens",
                         a->hf, (long long)x2->shape[0], (long long)x2->shape[1], (long long)y2->shape[0],
                         (long long)y2->shape[1], (long long)a->info.in, (long long)a->info.rows,
                         (long long)a->info.row_offset, (long long)l->N);
    return CAI_OK;
}

cai_status cai_lora_fwd(const cai_lora_layer *ll, cai_lora_site site, const cai_tensor *x, cai_tensor *y) {
    if (!cai_lora_at(ll, site)) return CAI_OK;
    cai_lora_t *l = ll->l;
    cai_device_t *dev = l->dev;
    cai_tensor x2, y2, ys, xin;
    CAI_CALL(as_rows(x, &x2));
    CAI_CALL(as_rows(y, &y2));
    for (int i = 0; i < ll->count; i++) {
        const adapter *a = &l->ad[ll->first + i];
        if (a->info.site != site) continue;
        CAI_CALL(check_shapes(l, a, &x2, &y2));
        CAI_CALL(adapter_input(l, a, &x2, &xin));
        CAI_CALL(cai_tensor_narrow(&y2, 1, a->info.row_offset, a->info.rows, &ys));
        CAI_CALL(dev->ops->matmul(dev, &l->h, &xin, 0, &a->Ac, 1, 1.0f, 0.0f));
        CAI_CALL(dev->ops->matmul(dev, &ys, &l->h, 0, &a->Bc, 1, l->scale, 1.0f));
    }
    return CAI_OK;
}

cai_status cai_lora_bwd(const cai_lora_layer *ll, cai_lora_site site, const cai_tensor *x, const cai_tensor *dy,
                        cai_tensor *dx) {
    if (!cai_lora_at(ll, site)) return CAI_OK;
    cai_lora_t *l = ll->l;
    cai_device_t *dev = l->dev;
    const cai_ops *ops = dev->ops;
    cai_tensor x2, dy2, dx2, dys, xin;
    CAI_CALL(as_rows(x, &x2));
    CAI_CALL(as_rows(dy, &dy2));
    CAI_CALL(as_rows(dx, &dx2));
    for (int i = 0; i < ll->count; i++) {
        adapter *a = &l->ad[ll->first + i];
        if (a->info.site != site) continue;
        CAI_CALL(check_shapes(l, a, &x2, &dy2));
        CAI_CALL(adapter_input(l, a, &x2, &xin));
        CAI_CALL(cai_tensor_narrow(&dy2, 1, a->info.row_offset, a->info.rows, &dys));
        /* h = A xin; dB += s dy^T h; dh = s dy B; dA += dh^T xin; dx += dh A (through the mask) */
        CAI_CALL(ops->matmul(dev, &l->h, &xin, 0, &a->Ac, 1, 1.0f, 0.0f));
        CAI_CALL(ops->matmul(dev, &a->gB, &dys, 1, &l->h, 0, l->scale, 1.0f));
        CAI_CALL(ops->matmul(dev, &l->dh, &dys, 0, &a->Bc, 0, l->scale, 0.0f));
        CAI_CALL(ops->matmul(dev, &a->gA, &l->dh, 1, &xin, 0, 1.0f, 1.0f));
        if (!l->dropout_on) {
            CAI_CALL(ops->matmul(dev, &dx2, &l->dh, 0, &a->Ac, 0, 1.0f, 1.0f));
            continue;
        }
        cai_tensor t;
        CAI_CALL(cai_tensor_init(&t, dev, l->dxd.data, CAI_DTYPE_F32, 2, (int64_t[]){l->N, a->info.in}));
        CAI_CALL(ops->matmul(dev, &t, &l->dh, 0, &a->A, 0, 1.0f, 0.0f));
        CAI_CALL(apply_dropout(l, a, &t, &t));
        CAI_CALL(ops->axpy(dev, &dx2, 1.0f, &t));
    }
    return CAI_OK;
}
