/* The colossal <-> Hugging Face name and layout table. It is written once,
 * here, and both directions walk it: export reads each entry's rows of a
 * colossal tensor into the HF layout, import puts them back. Keeping a single
 * table is what makes the round trip exact by construction. */
#include "cai_config.h"
#include "colossal/ckpt.h"
#include "colossal/moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_internal.h"

struct cai_hf_map {
    cai_model_config cfg;
    cai_registry_t *reg;
    cai_hf_entry *e;
    int n, cap;
    char *names; /* both names of every entry, packed */
    size_t names_used, names_cap;
    /* open-addressing indexes (capacity a power of two, -1 empty): the first
     * entry of each colossal name, and each HF name's entry */
    int *by_colossal, *by_hf;
    size_t slots;
};

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The slot of `name` in `table`: where it is, or the empty slot it would take. */
static size_t slot_of(const cai_hf_map_t *m, const int *table, const char *name, int hf) {
    size_t i = (size_t)hash_name(name) & (m->slots - 1);
    while (table[i] >= 0 && strcmp(hf ? m->e[table[i]].hf : m->e[table[i]].colossal, name) != 0)
        i = (i + 1) & (m->slots - 1);
    return i;
}

static cai_status build_index(cai_hf_map_t *m) {
    m->slots = 16;
    while (m->slots < 2 * (size_t)m->n) m->slots *= 2;
    m->by_colossal = malloc(m->slots * sizeof *m->by_colossal);
    m->by_hf = malloc(m->slots * sizeof *m->by_hf);
    if (!m->by_colossal || !m->by_hf) return CAI_ERROR(CAI_ERR_NOMEM, "HF mapping: index of %d names", m->n);
    for (size_t i = 0; i < m->slots; i++) m->by_colossal[i] = m->by_hf[i] = -1;
    for (int i = 0; i < m->n; i++) {
        size_t c = slot_of(m, m->by_colossal, m->e[i].colossal, 0);
        if (m->by_colossal[c] < 0) m->by_colossal[c] = i;
        else if (m->by_colossal[c] + 1 != i && strcmp(m->e[i - 1].colossal, m->e[i].colossal) != 0)
            return CAI_ERROR(CAI_ERR_INTERNAL, "HF mapping: the entries of '%s' are not consecutive", m->e[i].colossal);
        size_t h = slot_of(m, m->by_hf, m->e[i].hf, 1);
        if (m->by_hf[h] >= 0) return CAI_ERROR(CAI_ERR_INTERNAL, "HF mapping: '%s' is mapped twice", m->e[i].hf);
        m->by_hf[h] = i;
    }
    return CAI_OK;
}

const char *cai_hf_transform_name(cai_hf_transform t) {
    switch (t) {
    case CAI_HF_COPY: return "copy";
    case CAI_HF_TRANSPOSE: return "transpose";
    case CAI_HF_QKV_SLICE: return "qkv rows";
    case CAI_HF_VOCAB_ROWS: return "vocab rows";
    default: return "?";
    }
}

static int is_mixtral(const cai_model_config *c) { return c->family == CAI_MODEL_LLAMA && c->moe.n_experts > 0; }

const char *cai_hf_architecture(const cai_model_config *c) {
    if (!c) return NULL;
    if (is_mixtral(c)) return "MixtralForCausalLM";
    return c->family == CAI_MODEL_GPT2 ? "GPT2LMHeadModel" : c->family == CAI_MODEL_LLAMA ? "LlamaForCausalLM" : NULL;
}

const char *cai_hf_model_type(const cai_model_config *c) {
    if (!c) return NULL;
    if (is_mixtral(c)) return "mixtral";
    return c->family == CAI_MODEL_GPT2 ? "gpt2" : c->family == CAI_MODEL_LLAMA ? "llama" : NULL;
}

/* transformers' MixtralSparseMoeBlock: softmax over all experts, top-k,
 * weights divided by their sum, every layer, no shared expert. Capacity
 * routing is a training-time choice and passes: inference there is
 * dropless. */
cai_status cai_hf_mixtral_check(const cai_model_config *c) {
    CAI_CHECK_ARG(c, "cai_hf_mixtral_check: NULL argument");
    if (!is_mixtral(c)) return CAI_OK;
    const cai_moe_config *m = &c->moe;
    if (m->n_shared != 0)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "HF Mixtral: moe.n_shared=%d; MixtralForCausalLM has no shared experts (0 is expressible)",
                         m->n_shared);
    if (c->moe_every > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "HF Mixtral: moe.every=%d; MixtralForCausalLM has an MoE block in every layer (moe.every=1)",
                         c->moe_every);
    if (m->router != CAI_MOE_ROUTER_SOFTMAX || !m->norm_topk)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "HF Mixtral: moe.router=%s with moe.norm_topk=%d; MixtralForCausalLM routes by softmax over "
                         "all experts, top-k, weights renormalised (moe.router=softmax, moe.norm_topk=1)",
                         cai_moe_router_name(m->router), m->norm_topk);
    return CAI_OK;
}

/* Entry names live in one growing buffer and are fixed up to pointers once
 * the table is complete (a realloc would move them). Until then `colossal`
 * and `hf` hold offsets cast to pointers. */
static cai_status intern(cai_hf_map_t *m, const char *s, size_t *off) {
    size_t len = strlen(s) + 1;
    if (m->names_used + len > m->names_cap) {
        size_t cap = m->names_cap ? 2 * m->names_cap : 4096;
        while (cap < m->names_used + len) cap *= 2;
        char *p = realloc(m->names, cap);
        if (!p) return CAI_ERROR(CAI_ERR_NOMEM, "HF mapping: %zu bytes of names", cap);
        m->names = p;
        m->names_cap = cap;
    }
    memcpy(m->names + m->names_used, s, len);
    *off = m->names_used;
    m->names_used += len;
    return CAI_OK;
}

static cai_status add(cai_hf_map_t *m, const char *colossal, const char *hf, cai_hf_transform t, uint64_t row_begin,
                      uint64_t rows) {
    int idx = cai_registry_find(m->reg, colossal);
    if (idx < 0) return CAI_ERROR(CAI_ERR_INTERNAL, "HF mapping: '%s' is not registered for this config", colossal);
    const cai_param_info *p = cai_registry_param(m->reg, idx);
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 64;
        cai_hf_entry *e = realloc(m->e, (size_t)cap * sizeof *e);
        if (!e) return CAI_ERROR(CAI_ERR_NOMEM, "HF mapping: %d entries", cap);
        m->e = e;
        m->cap = cap;
    }
    size_t co, ho;
    CAI_CALL(intern(m, colossal, &co));
    CAI_CALL(intern(m, hf, &ho));
    cai_hf_entry *e = &m->e[m->n++];
    memset(e, 0, sizeof *e);
    e->colossal = (const char *)(uintptr_t)co;
    e->hf = (const char *)(uintptr_t)ho;
    e->transform = t;
    e->row_begin = row_begin;
    e->rows = t == CAI_HF_COPY || t == CAI_HF_TRANSPOSE ? p->shape[0] : rows;
    e->ndim = p->ndim;
    if (p->ndim == 1) {
        e->hf_shape[0] = e->rows;
    } else if (t == CAI_HF_TRANSPOSE) {
        e->hf_shape[0] = p->shape[1];
        e->hf_shape[1] = e->rows;
    } else {
        e->hf_shape[0] = e->rows;
        e->hf_shape[1] = p->shape[1];
    }
    if (p->ndim > 2 || e->row_begin + e->rows > p->shape[0])
        return CAI_ERROR(CAI_ERR_INTERNAL, "HF mapping: '%s' -> '%s' rows [%llu, +%llu) of shape [%llu, ...]", colossal,
                         hf, (unsigned long long)e->row_begin, (unsigned long long)e->rows,
                         (unsigned long long)p->shape[0]);
    return CAI_OK;
}

/* Names per layer: {colossal suffix, HF suffix, transform} (GPT-2 Conv1D
 * weights are transposed, everything else keeps its layout). */
typedef struct {
    const char *colossal, *hf;
    cai_hf_transform t;
} layer_name;

static const layer_name k_gpt2_layer[] = {
    {"ln_1.weight", "ln_1.weight", CAI_HF_COPY},
    {"ln_1.bias", "ln_1.bias", CAI_HF_COPY},
    {"attn.qkv.weight", "attn.c_attn.weight", CAI_HF_TRANSPOSE},
    {"attn.qkv.bias", "attn.c_attn.bias", CAI_HF_COPY},
    {"attn.proj.weight", "attn.c_proj.weight", CAI_HF_TRANSPOSE},
    {"attn.proj.bias", "attn.c_proj.bias", CAI_HF_COPY},
    {"ln_2.weight", "ln_2.weight", CAI_HF_COPY},
    {"ln_2.bias", "ln_2.bias", CAI_HF_COPY},
    {"mlp.fc.weight", "mlp.c_fc.weight", CAI_HF_TRANSPOSE},
    {"mlp.fc.bias", "mlp.c_fc.bias", CAI_HF_COPY},
    {"mlp.proj.weight", "mlp.c_proj.weight", CAI_HF_TRANSPOSE},
    {"mlp.proj.bias", "mlp.c_proj.bias", CAI_HF_COPY},
};

/* Llama's qkv is three entries (q, k, v row blocks), emitted separately. */
static const layer_name k_llama_layer[] = {
    {"attn.proj.weight", "self_attn.o_proj.weight", CAI_HF_COPY},
    {"ln_1.weight", "input_layernorm.weight", CAI_HF_COPY},
    {"ln_2.weight", "post_attention_layernorm.weight", CAI_HF_COPY},
};

/* The MLP of a dense Llama layer, and (with "experts.%d." between the
 * prefixes) of each expert of a Mixtral layer: the same three matrices. */
static const layer_name k_llama_mlp[] = {
    {"fc.weight", "gate_proj.weight", CAI_HF_COPY},
    {"up.weight", "up_proj.weight", CAI_HF_COPY},
    {"proj.weight", "down_proj.weight", CAI_HF_COPY},
};
static const char *const k_mixtral_expert[] = {"w1.weight", "w3.weight", "w2.weight"}; /* gate, up, down */

#define NAME(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

static cai_status build_gpt2(cai_hf_map_t *m) {
    const cai_model_config *c = &m->cfg;
    char a[CAI_PARAM_NAME_MAX], b[CAI_HF_NAME_MAX];
    CAI_CALL(add(m, "wte.weight", "transformer.wte.weight", CAI_HF_VOCAB_ROWS, 0, (uint64_t)c->vocab_size));
    CAI_CALL(add(m, "wpe.weight", "transformer.wpe.weight", CAI_HF_COPY, 0, 0));
    for (int l = 0; l < c->n_layers; l++)
        for (size_t k = 0; k < sizeof k_gpt2_layer / sizeof k_gpt2_layer[0]; k++) {
            NAME(a, "h.%d.%s", l, k_gpt2_layer[k].colossal);
            NAME(b, "transformer.h.%d.%s", l, k_gpt2_layer[k].hf);
            CAI_CALL(add(m, a, b, k_gpt2_layer[k].t, 0, 0));
        }
    CAI_CALL(add(m, "ln_f.weight", "transformer.ln_f.weight", CAI_HF_COPY, 0, 0));
    CAI_CALL(add(m, "ln_f.bias", "transformer.ln_f.bias", CAI_HF_COPY, 0, 0));
    if (!c->tie_embeddings)
        CAI_CALL(add(m, "lm_head.weight", "lm_head.weight", CAI_HF_VOCAB_ROWS, 0, (uint64_t)c->vocab_size));
    return CAI_OK;
}

static cai_status add_llama_mlp(cai_hf_map_t *m, int l) {
    const cai_model_config *c = &m->cfg;
    char a[CAI_PARAM_NAME_MAX], b[CAI_HF_NAME_MAX];
    if (!cai_model_moe_layer(c, l)) {
        for (int k = 0; k < 3; k++) {
            NAME(a, "h.%d.mlp.%s", l, k_llama_mlp[k].colossal);
            NAME(b, "model.layers.%d.mlp.%s", l, k_llama_mlp[k].hf);
            CAI_CALL(add(m, a, b, CAI_HF_COPY, 0, 0));
        }
        return CAI_OK;
    }
    NAME(a, "h.%d.moe.router.weight", l);
    NAME(b, "model.layers.%d.block_sparse_moe.gate.weight", l);
    CAI_CALL(add(m, a, b, CAI_HF_COPY, 0, 0));
    for (int e = 0; e < c->moe.n_experts; e++)
        for (int k = 0; k < 3; k++) {
            NAME(a, "h.%d.moe.experts.%d.%s", l, e, k_llama_mlp[k].colossal);
            NAME(b, "model.layers.%d.block_sparse_moe.experts.%d.%s", l, e, k_mixtral_expert[k]);
            CAI_CALL(add(m, a, b, CAI_HF_COPY, 0, 0));
        }
    return CAI_OK;
}

static cai_status build_llama(cai_hf_map_t *m) {
    const cai_model_config *c = &m->cfg;
    const uint64_t D = (uint64_t)(c->d_model / c->n_heads);
    const uint64_t q = (uint64_t)c->n_heads * D, kv = (uint64_t)c->n_kv_heads * D;
    char a[CAI_PARAM_NAME_MAX], b[CAI_HF_NAME_MAX];
    CAI_CALL(add(m, "wte.weight", "model.embed_tokens.weight", CAI_HF_VOCAB_ROWS, 0, (uint64_t)c->vocab_size));
    for (int l = 0; l < c->n_layers; l++) {
        NAME(a, "h.%d.attn.qkv.weight", l);
        static const char *const proj[3] = {"q_proj", "k_proj", "v_proj"};
        const uint64_t begin[3] = {0, q, q + kv}, rows[3] = {q, kv, kv};
        for (int s = 0; s < 3; s++) {
            NAME(b, "model.layers.%d.self_attn.%s.weight", l, proj[s]);
            CAI_CALL(add(m, a, b, CAI_HF_QKV_SLICE, begin[s], rows[s]));
        }
        /* o_proj, the MLP (or MoE block), then the two norms: the order of
         * the entries is the order of the shards */
        for (size_t k = 0; k < sizeof k_llama_layer / sizeof k_llama_layer[0]; k++) {
            NAME(a, "h.%d.%s", l, k_llama_layer[k].colossal);
            NAME(b, "model.layers.%d.%s", l, k_llama_layer[k].hf);
            CAI_CALL(add(m, a, b, k_llama_layer[k].t, 0, 0));
            if (k == 0) CAI_CALL(add_llama_mlp(m, l));
        }
    }
    CAI_CALL(add(m, "ln_f.weight", "model.norm.weight", CAI_HF_COPY, 0, 0));
    if (!c->tie_embeddings)
        CAI_CALL(add(m, "lm_head.weight", "lm_head.weight", CAI_HF_VOCAB_ROWS, 0, (uint64_t)c->vocab_size));
    return CAI_OK;
}

cai_status cai_hf_map_create(cai_hf_map_t **out, const cai_model_config *cfg) {
    CAI_CHECK_ARG(out && cfg, "cai_hf_map_create: NULL argument");
    *out = NULL;
    cai_hf_map_t *m = NULL;
    CAI_CALL(cai_calloc((void **)&m, 1, sizeof *m, "HF mapping"));
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_model_config_resolve(cfg, &m->cfg), st, fail);
    CAI_CALL_GOTO(cai_hf_mixtral_check(&m->cfg), st, fail);
    if (!cai_hf_architecture(&m->cfg)) {
        st = CAI_ERROR(CAI_ERR_UNSUPPORTED, "HF mapping: model family %s has no Hugging Face architecture",
                       cai_model_family_name(m->cfg.family));
        goto fail;
    }
    cai_registry_options ro = {m->cfg.n_layers};
    CAI_CALL_GOTO(cai_registry_init(&m->reg, &ro), st, fail);
    CAI_CALL_GOTO(cai_model_register_params(m->reg, &m->cfg), st, fail);
    CAI_CALL_GOTO(m->cfg.family == CAI_MODEL_GPT2 ? build_gpt2(m) : build_llama(m), st, fail);
    for (int i = 0; i < m->n; i++) {
        m->e[i].colossal = m->names + (uintptr_t)m->e[i].colossal;
        m->e[i].hf = m->names + (uintptr_t)m->e[i].hf;
    }
    CAI_CALL_GOTO(build_index(m), st, fail);
    /* Every registered parameter must be reachable: directly, or through its
     * tie primary. A future layer (experts) without a table row fails here
     * instead of silently missing from the export. */
    for (int i = 0; i < cai_registry_count(m->reg); i++) {
        const cai_param_info *p = cai_registry_param(m->reg, i);
        const cai_hf_entry *first;
        int n = cai_hf_map_find(m, p->tie_primary != i ? cai_registry_param(m->reg, p->tie_primary)->name : p->name,
                                &first);
        uint64_t covered = 0;
        for (int k = 0; k < n; k++) covered += first[k].rows;
        const uint64_t need = strcmp(p->name, "wte.weight") == 0 || strcmp(p->name, "lm_head.weight") == 0
                                  ? (uint64_t)m->cfg.vocab_size
                                  : p->shape[0];
        if (n == 0 || covered != need) {
            st = CAI_ERROR(CAI_ERR_UNSUPPORTED,
                           "HF mapping: parameter '%s' of this %s config has no Hugging Face "
                           "counterpart in %s",
                           p->name, cai_model_family_name(m->cfg.family), cai_hf_architecture(&m->cfg));
            goto fail;
        }
    }
    *out = m;
    return CAI_OK;
fail:
    cai_hf_map_free(m);
    return st;
}

void cai_hf_map_free(cai_hf_map_t *m) {
    if (!m) return;
    cai_registry_free(m->reg);
    free(m->e);
    free(m->names);
    free(m->by_colossal);
    free(m->by_hf);
    cai_free(m);
}

const cai_model_config *cai_hf_map_config(const cai_hf_map_t *m) { return m ? &m->cfg : NULL; }
const cai_registry_t *cai_hf_map_registry(const cai_hf_map_t *m) { return m ? m->reg : NULL; }
int cai_hf_map_count(const cai_hf_map_t *m) { return m ? m->n : 0; }

const cai_hf_entry *cai_hf_map_entry(const cai_hf_map_t *m, int i) { return m && i >= 0 && i < m->n ? &m->e[i] : NULL; }

/* Hashed: `colossal-ckpt init` of 65536 layers looks up every parameter. */
const cai_hf_entry *cai_hf_map_find_hf(const cai_hf_map_t *m, const char *hf_name) {
    if (!m || !hf_name || !m->slots) return NULL;
    const int i = m->by_hf[slot_of(m, m->by_hf, hf_name, 1)];
    return i >= 0 ? &m->e[i] : NULL;
}

int cai_hf_map_find(const cai_hf_map_t *m, const char *name, const cai_hf_entry **first) {
    *first = NULL;
    if (!m || !name || !m->slots) return 0;
    const int i = m->by_colossal[slot_of(m, m->by_colossal, name, 0)];
    if (i < 0) return 0;
    int n = 1;
    while (i + n < m->n && strcmp(m->e[i + n].colossal, name) == 0) n++;
    *first = &m->e[i];
    return n;
}

void cai_hf_shape_str(char *buf, size_t cap, int ndim, const uint64_t *shape) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%llu", d ? "," : "", (unsigned long long)shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}
