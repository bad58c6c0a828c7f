/* GPT-2 and Llama: configuration, parameter registration, and the model
 * object that owns the flat parameter/gradient buffers and the activation
 * arena and runs forward/backward over a pipeline stage's layer range. */
#include "cai_config.h"
#include "model_internal.h"
#include "colossal/lora.h"
#include "colossal/moe.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ config */

static const char *const k_family_names[CAI_MODEL_FAMILY_COUNT] = {
    [CAI_MODEL_GPT2] = "gpt2",
    [CAI_MODEL_LLAMA] = "llama",
};

const char *cai_model_family_name(cai_model_family f) {
    if ((int)f < 0 || f >= CAI_MODEL_FAMILY_COUNT) return "?";
    return k_family_names[f];
}

cai_block_kinds cai_model_family_kinds(cai_model_family f) {
    static const cai_block_kinds k[CAI_MODEL_FAMILY_COUNT] = {
        [CAI_MODEL_GPT2] = {CAI_NORM_LAYERNORM, CAI_MLP_GELU, CAI_POS_LEARNED},
        [CAI_MODEL_LLAMA] = {CAI_NORM_RMSNORM, CAI_MLP_SWIGLU, CAI_POS_ROPE},
    };
    return k[(int)f >= 0 && f < CAI_MODEL_FAMILY_COUNT ? f : CAI_MODEL_GPT2];
}

cai_status cai_model_family_parse(const char *name, cai_model_family *out) {
    CAI_CHECK_ARG(name && out, "cai_model_family_parse: NULL argument");
    for (int f = 0; f < CAI_MODEL_FAMILY_COUNT; f++)
        if (strcmp(name, k_family_names[f]) == 0) {
            *out = (cai_model_family)f;
            return CAI_OK;
        }
    return CAI_ERROR(CAI_ERR_CONFIG, "unknown model family '%s' (known: gpt2, llama)", name);
}

cai_model_config cai_model_config_default(cai_model_family family) {
    cai_model_config c;
    memset(&c, 0, sizeof c);
    c.family = family;
    c.vocab_multiple = 128;
    c.n_layers = 12;
    c.d_model = 768;
    c.n_heads = 12;
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    c.init_std = 0.02f;
    c.seed = 1234;
    c.param_dtype = CAI_DTYPE_F32;
    c.act_dtype = CAI_DTYPE_F32;
    if (family == CAI_MODEL_LLAMA) {
        c.vocab_size = 32000;
        c.n_kv_heads = 4;
        c.ffn_hidden = 2048;
        c.max_seq_len = 2048;
        c.tie_embeddings = 0;
    } else {
        c.vocab_size = 50257;
        c.n_kv_heads = 12;
        c.ffn_hidden = 3072;
        c.max_seq_len = 1024;
        c.tie_embeddings = 1;
    }
    return c;
}

static int is_float_dtype(cai_dtype dt) { return dt == CAI_DTYPE_F32 || dt == CAI_DTYPE_BF16 || dt == CAI_DTYPE_F16; }

cai_status cai_model_config_resolve(const cai_model_config *in, cai_model_config *out) {
    CAI_CHECK_ARG(in && out, "cai_model_config_resolve: NULL argument");
    cai_model_config c = *in;
    if ((int)c.family < 0 || c.family >= CAI_MODEL_FAMILY_COUNT)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.family=%d is not a model family (gpt2, llama)", (int)c.family);
    if (c.vocab_multiple == 0) c.vocab_multiple = 128;
    if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
    if (c.rope_theta == 0) c.rope_theta = 10000.0f;
    if (c.norm_eps == 0) c.norm_eps = 1e-5f;
    if (c.init_std == 0) c.init_std = 0.02f;
    if (c.ffn_hidden == 0 && c.d_model > 0) {
        if (c.family == CAI_MODEL_GPT2) {
            c.ffn_hidden = 4 * c.d_model;
        } else {
            long h = 8L * c.d_model / 3;
            c.ffn_hidden = (int)((h + 255) / 256 * 256);
        }
    }
    if (c.vocab_size < 1) return CAI_ERROR(CAI_ERR_CONFIG, "model.vocab_size=%d must be >= 1", c.vocab_size);
    if (c.vocab_multiple < 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.vocab_multiple=%d must be >= 1 (0 means 128)", c.vocab_multiple);
    if (c.n_layers < 1) return CAI_ERROR(CAI_ERR_CONFIG, "model.n_layers=%d must be >= 1", c.n_layers);
    if (c.d_model < 1 || c.n_heads < 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.d_model=%d and model.n_heads=%d must be >= 1", c.d_model, c.n_heads);
    if (c.d_model % c.n_heads != 0)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "model.d_model=%d is not a multiple of model.n_heads=%d (head_dim would not "
                         "be whole; e.g. n_heads=%d fits)",
                         c.d_model, c.n_heads, c.d_model % 64 == 0 ? c.d_model / 64 : 1);
    if (c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads != 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.n_kv_heads=%d must divide model.n_heads=%d", c.n_kv_heads, c.n_heads);
    if (c.family == CAI_MODEL_GPT2 && c.n_kv_heads != c.n_heads)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.n_kv_heads=%d: GPT-2 has no grouped-query attention (use %d or 0)",
                         c.n_kv_heads, c.n_heads);
    if (c.family == CAI_MODEL_LLAMA && (c.d_model / c.n_heads) % 2 != 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "model: RoPE needs an even head_dim, d_model/n_heads = %d/%d = %d", c.d_model,
                         c.n_heads, c.d_model / c.n_heads);
    if (c.ffn_hidden < 1) return CAI_ERROR(CAI_ERR_CONFIG, "model.ffn_hidden=%d must be >= 1", c.ffn_hidden);
    if (c.max_seq_len < 1) return CAI_ERROR(CAI_ERR_CONFIG, "model.max_seq_len=%d must be >= 1", c.max_seq_len);
    if (!(c.rope_theta > 0) || !isfinite(c.rope_theta))
        return CAI_ERROR(CAI_ERR_CONFIG, "model.rope_theta=%g must be finite and > 0", (double)c.rope_theta);
    if (!(c.norm_eps > 0) || !isfinite(c.norm_eps))
        return CAI_ERROR(CAI_ERR_CONFIG, "model.norm_eps=%g must be finite and > 0", (double)c.norm_eps);
    if (!(c.init_std > 0) || !isfinite(c.init_std))
        return CAI_ERROR(CAI_ERR_CONFIG, "model.init_std=%g must be finite and > 0", (double)c.init_std);
    if (c.tie_embeddings != 0 && c.tie_embeddings != 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.tie_embeddings=%d must be 0 or 1", c.tie_embeddings);
    if (c.activation_checkpointing != 0 && c.activation_checkpointing != 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.activation_checkpointing=%d must be 0 or 1",
                         c.activation_checkpointing);
    if (!is_float_dtype(c.param_dtype))
        return CAI_ERROR(CAI_ERR_CONFIG, "model.param_dtype=%s: working weights are f32, bf16 or f16",
                         cai_dtype_name(c.param_dtype));
    if (!is_float_dtype(c.act_dtype))
        return CAI_ERROR(CAI_ERR_CONFIG, "model.act_dtype=%s: activations are f32, bf16 or f16",
                         cai_dtype_name(c.act_dtype));
    if (c.moe.n_experts > 0) {
        if (c.moe_every == 0) c.moe_every = 1;
        if (c.moe.ffn == 0) c.moe.ffn = c.ffn_hidden;
        if (c.moe_every < 1 || c.moe_every > c.n_layers)
            return CAI_ERROR(CAI_ERR_CONFIG, "moe.every=%d must be between 1 and model.n_layers=%d", c.moe_every,
                             c.n_layers);
        if (c.family != CAI_MODEL_LLAMA)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "moe.n_experts=%d: MoE blocks have SwiGLU experts without biases (model.family=llama), "
                             "not %s",
                             c.moe.n_experts, cai_model_family_name(c.family));
        CAI_CALL(cai_moe_config_check(&c.moe, c.d_model, 1));
    }
    *out = c;
    return CAI_OK;
}

int64_t cai_model_config_padded_vocab(const cai_model_config *cfg) {
    int64_t m = cfg->vocab_multiple > 0 ? cfg->vocab_multiple : 128;
    return ((int64_t)cfg->vocab_size + m - 1) / m * m;
}

/* ------------------------------------------------------------ registration */

typedef struct {
    cai_registry_t *reg;
    const cai_model_config *cfg;
} reg_ctx;

static cai_status add_param(reg_ctx *r, const char *name, int ndim, uint64_t d0, uint64_t d1, const cai_param_spec *s) {
    uint64_t shape[2] = {d0, d1};
    CAI_CALL(cai_registry_add(r->reg, name, ndim, shape, CAI_DTYPE_F32, s, NULL));
    return CAI_OK;
}

static cai_param_spec spec_at(cai_pp_place place, int layer, cai_init_kind init, float std, int split) {
    cai_param_spec s = cai_param_spec_default();
    s.pp_place = place;
    s.layer = layer;
    s.init.kind = init;
    s.init.std = (init == CAI_INIT_NORMAL || init == CAI_INIT_NORMAL_RESIDUAL) ? std : 0.0f;
    s.tp_split_dim = split;
    return s;
}

/* A norm: weight ones; GPT-2 also a zero bias. */
static cai_status add_norm(reg_ctx *r, const char *prefix, cai_pp_place place, int layer) {
    char name[CAI_PARAM_NAME_MAX];
    uint64_t C = (uint64_t)r->cfg->d_model;
    cai_param_spec s = spec_at(place, layer, CAI_INIT_ONES, 0, -1);
    s.seq_grad = 1;
    snprintf(name, sizeof name, "%s.weight", prefix);
    CAI_CALL(add_param(r, name, 1, C, 1, &s));
    if (r->cfg->family == CAI_MODEL_GPT2) {
        s.init.kind = CAI_INIT_ZEROS;
        snprintf(name, sizeof name, "%s.bias", prefix);
        CAI_CALL(add_param(r, name, 1, C, 1, &s));
    }
    return CAI_OK;
}

/* A linear [out, in] split along `split` (0 column-parallel, 1 row-parallel);
 * GPT-2 biases split like the output (column) or replicated (row). */
static cai_status add_linear(reg_ctx *r, const char *prefix, int layer, uint64_t out, uint64_t in, int split,
                             cai_init_kind init, const cai_qkv_groups *qkv) {
    char name[CAI_PARAM_NAME_MAX];
    cai_param_spec s = spec_at(CAI_PP_LAYER, layer, init, r->cfg->init_std, split);
    if (qkv) s.qkv = *qkv;
    snprintf(name, sizeof name, "%s.weight", prefix);
    CAI_CALL(add_param(r, name, 2, out, in, &s));
    if (r->cfg->family == CAI_MODEL_GPT2) {
        cai_param_spec b = spec_at(CAI_PP_LAYER, layer, CAI_INIT_ZEROS, 0, split == 0 ? 0 : -1);
        if (qkv) b.qkv = *qkv;
        snprintf(name, sizeof name, "%s.bias", prefix);
        CAI_CALL(add_param(r, name, 1, out, 1, &b));
    }
    return CAI_OK;
}

cai_status cai_model_register_params(cai_registry_t *reg, const cai_model_config *cfg_in) {
    CAI_CHECK_ARG(reg && cfg_in, "cai_model_register_params: NULL argument");
    cai_model_config cfg;
    CAI_CALL(cai_model_config_resolve(cfg_in, &cfg));
    if (cai_registry_n_layers(reg) != cfg.n_layers)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "model registration: the registry was created for %d layers but the "
                         "model has n_layers=%d",
                         cai_registry_n_layers(reg), cfg.n_layers);
    reg_ctx r = {reg, &cfg};
    const uint64_t V = (uint64_t)cai_model_config_padded_vocab(&cfg), C = (uint64_t)cfg.d_model;
    const uint64_t D = C / (uint64_t)cfg.n_heads, F = (uint64_t)cfg.ffn_hidden;
    const int gpt2 = cfg.family == CAI_MODEL_GPT2;

    cai_param_spec emb = spec_at(CAI_PP_FIRST, -1, CAI_INIT_NORMAL, cfg.init_std, 0);
    emb.vocab_parallel = 1;
    emb.tie_group = cfg.tie_embeddings ? 1 : 0;
    CAI_CALL(add_param(&r, "wte.weight", 2, V, C, &emb));
    if (gpt2) {
        cai_param_spec pos = spec_at(CAI_PP_FIRST, -1, CAI_INIT_NORMAL, cfg.init_std, -1);
        CAI_CALL(add_param(&r, "wpe.weight", 2, (uint64_t)cfg.max_seq_len, C, &pos));
    }
    cai_qkv_groups qkv = {cfg.n_heads, cfg.n_kv_heads, (int)D};
    const uint64_t W = (uint64_t)(cfg.n_heads + 2 * cfg.n_kv_heads) * D;
    char p[CAI_PARAM_NAME_MAX];
    for (int l = 0; l < cfg.n_layers; l++) {
        snprintf(p, sizeof p, "h.%d.ln_1", l);
        CAI_CALL(add_norm(&r, p, CAI_PP_LAYER, l));
        snprintf(p, sizeof p, "h.%d.attn.qkv", l);
        CAI_CALL(add_linear(&r, p, l, W, C, 0, CAI_INIT_NORMAL, &qkv));
        snprintf(p, sizeof p, "h.%d.attn.proj", l);
        CAI_CALL(add_linear(&r, p, l, C, (uint64_t)cfg.n_heads * D, 1, CAI_INIT_NORMAL_RESIDUAL, NULL));
        snprintf(p, sizeof p, "h.%d.ln_2", l);
        CAI_CALL(add_norm(&r, p, CAI_PP_LAYER, l));
        if (cai_model_moe_layer(&cfg, l)) {
            CAI_CALL(cai_moe_register_params(reg, l, &cfg.moe, cfg.d_model, cfg.init_std));
            continue;
        }
        /* GPT-2's fc is Llama's gate (docs/registry.md): one name, one role in the layer. */
        snprintf(p, sizeof p, "h.%d.mlp.fc", l);
        CAI_CALL(add_linear(&r, p, l, F, C, 0, CAI_INIT_NORMAL, NULL));
        if (!gpt2) {
            snprintf(p, sizeof p, "h.%d.mlp.up", l);
            CAI_CALL(add_linear(&r, p, l, F, C, 0, CAI_INIT_NORMAL, NULL));
        }
        snprintf(p, sizeof p, "h.%d.mlp.proj", l);
        CAI_CALL(add_linear(&r, p, l, C, F, 1, CAI_INIT_NORMAL_RESIDUAL, NULL));
    }
    CAI_CALL(add_norm(&r, "ln_f", CAI_PP_LAST, -1));
    cai_param_spec head = emb;
    head.pp_place = CAI_PP_LAST;
    CAI_CALL(add_param(&r, "lm_head.weight", 2, V, C, &head));
    return CAI_OK;
}

/* ------------------------------------------------------------ model */

/* What one forward leaves for its backward: a pipeline keeps one slot per
 * (microbatch, chunk) in flight instead of recomputing. */
typedef struct {
    cai_tensor *resid;          /* chunk_max + 1: resid[i] is the chunk's layer i's input */
    cai_block_acts *acts;       /* n_acts */
    cai_block_wgrad *wg;        /* split backward: n_acts, what the input pass keeps for the weight pass */
    cai_head_acts head;         /* the rank holding the head */
    cai_tensor tokens, targets; /* I32 [B,T] on the device */
    int64_t n_valid;            /* non-ignored targets of the slot's forward */
    int pending_backward;       /* a forward with targets ran and its backward has not */
    int pending_weight;         /* split: the input pass ran and the weight pass has not */
    int chunk;                  /* the chunk whose activations the slot holds */
    float train_scale;          /* cai_model_forward_train's grad_scale (the loss gradient made with it) */
    int objective;              /* the forward ran the objective: backward starts from its gradient */
} act_slot;

struct cai_model {
    cai_model_config cfg;
    cai_device_t *dev;
    cai_weights_t *w; /* registry and parameter storage: owned, or shared (cai_model_options.weights) */
    int own_weights;
    int offloaded;       /* cai_model_offload: the weights wait in host memory, every view unbound */
    cai_registry_t *reg; /* w's */
    cai_rank_view view;
    size_t align;
    int B, T;
    int64_t Vp;
    int layer_begin, layer_end, first, last; /* first chunk's begin, last chunk's end; embedding, head held */
    int n_local;                             /* layers held, all chunks */
    int *local_layer;                        /* global index of each held layer, ascending */
    /* Model chunks (interleaved pipelines): the maximal runs of held
     * layers, in local indices; chunk c is virtual stage c * pp + pp_rank. */
    int n_chunks, chunk_max;
    struct chunk {
        int begin, end, first, last;
    } * chunk;

    /* Flat buffers in the registry's local layout: w's storage (the
     * pointers are w's, copied for the hot paths) and the gradients. */
    int n_params;
    const size_t *offsets; /* per registry index; SIZE_MAX when not held */
    const cai_param_shard *shards;
    size_t n_flat;
    float *master, *grads; /* F32 */
    void *lowp;
    void *work;
    void *compute;

    cai_layer_dims dims;
    cai_layer_ctx cx;          /* what the layers run on: the device and the tp group */
    cai_block_params *wp, *gp; /* per local layer: compute-weight and gradient views */
    cai_tensor wte, wpe, lnf_w, lnf_b, head_w;
    cai_tensor g_wte, g_wpe, g_lnf_w, g_lnf_b, g_head_w;

    cai_arena_t arena;
    cai_tensor d_stream;
    cai_block_scratch scratch;
    int n_acts; /* layer sets per slot: chunk_max, or 1 with activation checkpointing */
    int split;  /* cai_model_options.split_backward */
    act_slot *slots;
    int n_slots;
    int cur_chunk; /* selected by cai_model_select, with s */
    act_slot *s;
    size_t act_bytes;

    /* Every weight/gradient view, with the parameter and unit it belongs
     * to: what cai_model_bind_param rebinds and unit queries read. */
    struct view_ref {
        int index, unit;
        cai_tensor *w, *g;
    } * refs;
    int n_refs;
    int external; /* the caller owns parameter storage */
    int frozen;   /* no gradients for the parameters (cai_model_options.frozen) */
    /* cai_model_set_packing: [B,T] positions then doc ids, on the device;
     * m->cx points at them while packing is on. */
    int32_t *packing;
    cai_tensor pack_pos, pack_doc;
    /* cai_model_set_objective: host [B*T] token losses, their gradient and
     * its scaled copy, then [B*T*C] hidden states and their gradient; on
     * the device the scaled token-loss gradient (F32 [B*T]), the hidden
     * states' F32 staging and the act-dtype gradient ([B*T*C] each). */
    cai_model_objective obj;
    int obj_on;
    float *obj_host;
    void *obj_dev;
    cai_tensor obj_dlosses, obj_stage, obj_dhidden;
    cai_fp8_t *fp8; /* cai_model_set_fp8, or NULL */
    struct {
        cai_model_hook_fn fn;
        void *ctx;
    } hooks[CAI_MODEL_MAX_HOOKS];
    int n_hooks;
    cai_model_moe *moe; /* the MoE blocks' state, NULL for a dense model */
};

cai_model_moe *cai_model_moe_of(const cai_model_t *m) { return m->moe; }

const cai_model_config *cai_model_config_of(const cai_model_t *m) { return &m->cfg; }
const cai_registry_t *cai_model_registry(const cai_model_t *m) { return m->reg; }
const cai_rank_view *cai_model_view(const cai_model_t *m) { return &m->view; }
cai_device_t *cai_model_device(const cai_model_t *m) { return m->dev; }
int64_t cai_model_padded_vocab(const cai_model_t *m) { return m->Vp; }

void cai_model_vocab_shard(const cai_model_t *m, int64_t *offset, int64_t *count) {
    if (offset) *offset = m->dims.vocab_offset;
    if (count) *count = m->dims.vocab_local;
}
size_t cai_model_align_elems(const cai_model_t *m) { return m->align; }

void cai_model_shape(const cai_model_t *m, int *batch, int *seq_len) {
    if (batch) *batch = m->B;
    if (seq_len) *seq_len = m->T;
}

void cai_model_stage(const cai_model_t *m, int *layer_begin, int *layer_end, int *is_first, int *is_last) {
    if (layer_begin) *layer_begin = m->layer_begin;
    if (layer_end) *layer_end = m->layer_end;
    if (is_first) *is_first = m->first;
    if (is_last) *is_last = m->last;
}

void cai_model_memory(const cai_model_t *m, size_t *param_bytes, size_t *act_bytes) {
    /* the storage (0 while offloaded) and the gradients */
    if (param_bytes)
        *param_bytes = m->external ? 0 : cai_weights_device_bytes(m->w) + (m->frozen ? 0 : m->n_flat * sizeof(float));
    if (act_bytes) *act_bytes = m->offloaded ? 0 : m->act_bytes;
}

cai_model_options cai_model_options_default(const cai_model_config *cfg) {
    cai_model_options o;
    memset(&o, 0, sizeof o);
    o.batch = 1;
    o.seq_len = cfg ? cfg->max_seq_len : 1;
    o.view = cai_rank_view_single();
    o.align_elems = 16;
    return o;
}

static cai_tensor flat_view(cai_device_t *dev, void *base, cai_dtype dt, size_t offset, size_t n) {
    return cai_tensor_1d(dev, (char *)base + offset * cai_dtype_size(dt), dt, (int64_t)n);
}

/* View of parameter `index`'s local shard inside a flat buffer of dtype dt. */
static cai_status param_view(const cai_model_t *m, int index, void *base, cai_dtype dt, cai_tensor *out) {
    const cai_param_shard *sh = &m->shards[index];
    int64_t shape[CAI_PARAM_MAX_DIMS];
    for (int d = 0; d < sh->ndim; d++) shape[d] = (int64_t)sh->local_shape[d];
    /* External storage: shaped but unbound until cai_model_bind_param. */
    void *data = base ? (char *)base + m->offsets[index] * cai_dtype_size(dt) : NULL;
    CAI_CALL(cai_tensor_init(out, m->dev, data, dt, sh->ndim, shape));
    return CAI_OK;
}

/* Compute-weight and gradient views of a parameter held here; both stay
 * zeroed (data NULL: "absent") when the family has no such parameter. */
static cai_status bind(cai_model_t *m, int unit, const char *name, cai_tensor *w, cai_tensor *g) {
    memset(w, 0, sizeof *w);
    memset(g, 0, sizeof *g);
    int idx = cai_registry_find(m->reg, name);
    if (idx < 0) return CAI_OK;
    if (m->offsets[idx] == SIZE_MAX)
        return CAI_ERROR(CAI_ERR_INTERNAL, "parameter '%s' is needed by pipeline rank %d but not held there", name,
                         m->view.pp_rank);
    CAI_CALL(param_view(m, idx, m->compute, m->cfg.act_dtype, w));
    CAI_CALL(param_view(m, idx, m->grads, CAI_DTYPE_F32, g));
    m->refs[m->n_refs++] = (struct view_ref){idx, unit, w, g};
    return CAI_OK;
}

/* Units in forward order: embedding (first stage), blocks, head (last
 * stage); i is the layer's local index. */
static int block_unit(const cai_model_t *m, int i) { return (m->first ? 1 : 0) + i; }
int cai_model_unit_count(const cai_model_t *m) { return (m->first ? 1 : 0) + m->n_local + (m->last ? 1 : 0); }

const cai_block_field cai_block_fields[] = {
    {"ln_1.weight", offsetof(cai_block_params, ln1_w)},
    {"ln_1.bias", offsetof(cai_block_params, ln1_b)},
    {"attn.qkv.weight", offsetof(cai_block_params, qkv_w)},
    {"attn.qkv.bias", offsetof(cai_block_params, qkv_b)},
    {"attn.proj.weight", offsetof(cai_block_params, proj_w)},
    {"attn.proj.bias", offsetof(cai_block_params, proj_b)},
    {"ln_2.weight", offsetof(cai_block_params, ln2_w)},
    {"ln_2.bias", offsetof(cai_block_params, ln2_b)},
    {"mlp.fc.weight", offsetof(cai_block_params, fc_w)},
    {"mlp.fc.bias", offsetof(cai_block_params, fc_b)},
    {"mlp.up.weight", offsetof(cai_block_params, up_w)},
    {"mlp.proj.weight", offsetof(cai_block_params, mlp_proj_w)},
    {"mlp.proj.bias", offsetof(cai_block_params, mlp_proj_b)},
};
const int cai_block_field_count = (int)(sizeof cai_block_fields / sizeof cai_block_fields[0]);

typedef struct {
    cai_model_t *m;
    int unit;
} moe_bind_ctx;

static cai_status moe_bind(void *ctx, const char *name, cai_tensor *w, cai_tensor *g) {
    moe_bind_ctx *b = ctx;
    return bind(b->m, b->unit, name, w, g);
}

static cai_status bind_layer(cai_model_t *m, int li, cai_block_params *w, cai_block_params *g) {
    const int l = m->local_layer[li];
    char name[CAI_PARAM_NAME_MAX];
    for (int i = 0; i < cai_block_field_count; i++) {
        snprintf(name, sizeof name, "h.%d.%s", l, cai_block_fields[i].suffix);
        if (cai_registry_find(m->reg, name) < 0) continue; /* other family's name */
        CAI_CALL(bind(m, block_unit(m, li), name, (cai_tensor *)((char *)w + cai_block_fields[i].off),
                      (cai_tensor *)((char *)g + cai_block_fields[i].off)));
    }
    moe_bind_ctx b = {m, block_unit(m, li)};
    if (cai_model_moe_is_layer(m->moe, li)) CAI_CALL(cai_model_moe_bind(m->moe, li, l, moe_bind, &b));
    return CAI_OK;
}

static int local_tie_primary(const cai_model_t *m, int index) { return cai_weights_local_tie_primary(m->w, index); }

/* The layers this rank holds, cut into chunks: its virtual stages (the
 * registry's, placed round the ranks or in a V), in layer order. Every rank
 * must hold view.pp_chunks of them. */
static cai_status resolve_stage(cai_model_t *m) {
    const int L = m->cfg.n_layers, pp = m->view.pp_size;
    const int chunks = m->view.pp_chunks > 0 ? m->view.pp_chunks : 1;
    CAI_CALL(
        cai_calloc((void **)&m->local_layer, (size_t)(L > 0 ? L : 1), sizeof *m->local_layer, "model layer table"));
    CAI_CALL(cai_calloc((void **)&m->chunk, (size_t)chunks, sizeof *m->chunk, "model chunks"));
    int runs = 0, prev = -1;
    for (int l = 0; l < L; l++) {
        int vs = 0;
        CAI_CALL(cai_registry_layer_vstage(m->reg, &m->view, l, &vs));
        const int stage = cai_rank_view_vstage_rank(&m->view, vs);
        if (l == 0 || vs != prev) {
            runs++;
            if (stage == m->view.pp_rank) {
                if (m->n_chunks == chunks)
                    return CAI_ERROR(CAI_ERR_LAYOUT,
                                     "pipeline layout: rank %d holds more than pp_chunks=%d runs of layers (layer %d "
                                     "starts another)",
                                     m->view.pp_rank, chunks, l);
                m->chunk[m->n_chunks++].begin = m->n_local;
            }
        }
        prev = vs;
        if (stage != m->view.pp_rank) continue;
        m->local_layer[m->n_local++] = l;
        m->chunk[m->n_chunks - 1].end = m->n_local;
    }
    if (m->n_local == 0 || m->n_chunks != chunks || runs != pp * chunks)
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "pipeline layout: rank %d of %d holds %d run(s) of layers (%d layers) and the %d layers "
                         "form %d virtual stage(s); pp=%d x pp_chunks=%d needs %d, %d per rank",
                         m->view.pp_rank, pp, m->n_chunks, m->n_local, L, runs, pp, chunks, pp * chunks, chunks);
    for (int c = 0; c < m->n_chunks; c++) {
        struct chunk *k = &m->chunk[c];
        k->first = m->local_layer[k->begin] == 0;
        k->last = m->local_layer[k->end - 1] == L - 1;
        if (k->end - k->begin > m->chunk_max) m->chunk_max = k->end - k->begin;
    }
    m->layer_begin = m->local_layer[0];
    m->layer_end = m->local_layer[m->n_local - 1] + 1;
    m->first = m->chunk[0].first;
    m->last = m->chunk[m->n_chunks - 1].last;
    return CAI_OK;
}

/* The weights (shared, or created here: with storage unless external) and
 * the gradients. */
static cai_status alloc_params(cai_model_t *m, const cai_model_options *opt) {
    cai_device_t *dev = m->dev;
    if (!m->w) {
        CAI_CALL(cai_weights_create(&m->w, dev, &m->cfg, &m->view, m->align, !m->external));
        m->own_weights = 1;
    }
    (void)opt;
    const cai_weights_t *w = m->w;
    m->reg = w->reg;
    m->n_params = w->n_params;
    m->offsets = w->offsets;
    m->shards = w->shards;
    m->n_flat = w->n_flat;
    m->master = w->master;
    m->lowp = w->lowp;
    m->work = w->work;
    m->compute = w->compute;
    if (m->external || m->frozen) return CAI_OK; /* the caller allocates, initialises and binds; or no gradients */
    CAI_CALL(cai_device_alloc(dev, m->n_flat * sizeof(float), "model gradients", (void **)&m->grads));
    CAI_CALL(cai_model_zero_grad(m));
    return CAI_OK;
}

static cai_status bind_params(cai_model_t *m) {
    CAI_CALL(cai_calloc((void **)&m->wp, (size_t)m->n_local, sizeof *m->wp, "model layer weights"));
    CAI_CALL(cai_calloc((void **)&m->gp, (size_t)m->n_local, sizeof *m->gp, "model layer grads"));
    /* At most one view per parameter, plus the head's second view of a tied embedding. */
    CAI_CALL(cai_calloc((void **)&m->refs, (size_t)m->n_params + 2, sizeof *m->refs, "model view table"));
    for (int i = 0; i < m->n_local; i++) CAI_CALL(bind_layer(m, i, &m->wp[i], &m->gp[i]));
    if (m->first) {
        CAI_CALL(bind(m, 0, "wte.weight", &m->wte, &m->g_wte));
        CAI_CALL(bind(m, 0, "wpe.weight", &m->wpe, &m->g_wpe));
    }
    if (m->last) {
        int unit = cai_model_unit_count(m) - 1;
        CAI_CALL(bind(m, unit, "ln_f.weight", &m->lnf_w, &m->g_lnf_w));
        CAI_CALL(bind(m, unit, "ln_f.bias", &m->lnf_b, &m->g_lnf_b));
        int head = cai_registry_find(m->reg, "lm_head.weight");
        /* Tied and the embedding is here too: the head reads and accumulates
         * into wte itself, so gradient accumulation needs no extra pass and
         * the lm_head copy is only kept equal for checkpoints and export. */
        CAI_CALL(
            bind(m, unit, local_tie_primary(m, head) >= 0 ? "wte.weight" : "lm_head.weight", &m->head_w, &m->g_head_w));
    }
    return CAI_OK;
}

/* The layers' dims of a (B, T) microbatch under a view; the vocabulary
 * shard (vocab_local, vocab_offset) is the caller's. */
static void layer_dims_of(const cai_model_config *c, const cai_rank_view *v, int B, int T, int seq_parallel,
                          cai_layer_dims *d) {
    memset(d, 0, sizeof *d);
    d->kinds = cai_model_family_kinds(c->family);
    d->B = B;
    d->T = T;
    d->C = c->d_model;
    d->n_heads = c->n_heads / v->tp_size;
    d->n_kv_heads = c->n_kv_heads / v->tp_size;
    d->head_dim = c->d_model / c->n_heads;
    d->ffn = c->ffn_hidden / v->tp_size;
    d->vocab_valid = c->vocab_size;
    d->norm_eps = c->norm_eps;
    d->act_dtype = c->act_dtype;
    d->tp = v->tp_size;
    d->sp = seq_parallel && v->tp_size > 1;
}

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

/* One stage's activation arena: d_stream and the shared scratch, then per
 * slot the residual stream (a chunk's layers' inputs and its output: B*T/tp
 * tokens each under sequence parallelism), n_acts layers' saved
 * activations, the head's and the token / target uploads. What carve_all
 * carves, in the same order. */
static size_t arena_bytes(const cai_device_t *dev, const cai_layer_dims *d, int64_t max_pos, int chunk_layers,
                          int n_acts, int split, int last, int slots) {
    const size_t stream = (size_t)(d->sp ? d->B * d->T / d->tp : d->B * d->T);
    const size_t one = round64(stream * (size_t)d->C * cai_dtype_size(d->act_dtype));
    size_t slot = (size_t)(chunk_layers + 1) * one + (size_t)n_acts * cai_block_acts_bytes(dev, d);
    if (split) slot += (size_t)n_acts * cai_block_wgrad_bytes(dev, d);
    if (last) slot += cai_head_acts_bytes(dev, d);
    slot += 2 * round64((size_t)d->B * (size_t)d->T * sizeof(int32_t));
    return one + cai_block_scratch_bytes(dev, d, max_pos) + (size_t)slots * slot + 64;
}

cai_status cai_model_activation_bytes(const cai_device_t *dev, const cai_model_config *cfg, const cai_rank_view *view,
                                      int batch, int seq_len, int seq_parallel, int n_local, int last, int slots,
                                      size_t *full, size_t *recompute) {
    CAI_CHECK_ARG(dev && cfg && view && full && recompute, "cai_model_activation_bytes: NULL argument");
    cai_model_config c;
    CAI_CALL(cai_model_config_resolve(cfg, &c));
    cai_layer_dims d;
    layer_dims_of(&c, view, batch, seq_len, seq_parallel, &d);
    /* The registry splits the vocabulary in balanced shards: the largest is the ceiling. */
    d.vocab_local = (cai_model_config_padded_vocab(&c) + view->tp_size - 1) / view->tp_size;
    const int k = slots > 0 ? slots : 1;
    *full = arena_bytes(dev, &d, c.max_seq_len, n_local, n_local, 0, last, k);
    *recompute = arena_bytes(dev, &d, c.max_seq_len, n_local, n_local > 0 ? 1 : 0, 0, last, k);
    return CAI_OK;
}

cai_status cai_model_split_backward_bytes(const cai_device_t *dev, const cai_model_config *cfg,
                                          const cai_rank_view *view, int batch, int seq_len, int seq_parallel,
                                          int n_local, int slots, size_t *bytes) {
    CAI_CHECK_ARG(dev && cfg && view && bytes, "cai_model_split_backward_bytes: NULL argument");
    cai_model_config c;
    CAI_CALL(cai_model_config_resolve(cfg, &c));
    cai_layer_dims d;
    layer_dims_of(&c, view, batch, seq_len, seq_parallel, &d);
    *bytes = (size_t)(slots > 0 ? slots : 1) * (size_t)n_local * cai_block_wgrad_bytes(dev, &d);
    return CAI_OK;
}

static cai_status carve_all(cai_model_t *m, cai_arena_t *arena, size_t *bytes_out) {
    cai_device_t *dev = m->dev;
    const cai_layer_dims *d = &m->dims;
    if (!arena) {
        *bytes_out = arena_bytes(dev, d, m->cfg.max_seq_len, m->chunk_max, m->n_acts, m->split, m->last, m->n_slots);
        return CAI_OK;
    }
    /* The residual stream: [B,T,C], or this rank's [1, B*T/tp, C] tokens. */
    const int64_t sb = d->sp ? 1 : m->B, st = d->sp ? (int64_t)m->B * m->T / d->tp : m->T;
    CAI_CALL(cai_tensor_arena(&m->d_stream, arena, dev, d->act_dtype, 3, (int64_t[]){sb, st, d->C}));
    CAI_CALL(cai_block_scratch_carve(dev, arena, d, m->cfg.max_seq_len, (double)m->cfg.rope_theta, &m->scratch));
    for (int k = 0; k < m->n_slots; k++) {
        act_slot *s = &m->slots[k];
        for (int i = 0; i <= m->chunk_max; i++)
            CAI_CALL(cai_tensor_arena(&s->resid[i], arena, dev, d->act_dtype, 3, (int64_t[]){sb, st, d->C}));
        for (int i = 0; i < m->n_acts; i++) CAI_CALL(cai_block_acts_carve(dev, arena, d, &s->acts[i]));
        for (int i = 0; m->split && i < m->n_acts; i++) CAI_CALL(cai_block_wgrad_carve(dev, arena, d, &s->wg[i]));
        if (m->last) CAI_CALL(cai_head_acts_carve(dev, arena, d, &s->head));
        CAI_CALL(cai_tensor_arena(&s->tokens, arena, dev, CAI_DTYPE_I32, 2, (int64_t[]){m->B, m->T}));
        CAI_CALL(cai_tensor_arena(&s->targets, arena, dev, CAI_DTYPE_I32, 2, (int64_t[]){m->B, m->T}));
    }
    return CAI_OK;
}

static cai_status alloc_acts(cai_model_t *m, int slots) {
    m->n_acts = m->cfg.activation_checkpointing ? 1 : m->chunk_max;
    const int n = slots > 0 ? slots : 1;
    CAI_CALL(cai_calloc((void **)&m->slots, (size_t)n, sizeof *m->slots, "model activation slots"));
    m->n_slots = n;
    for (int k = 0; k < m->n_slots; k++) {
        act_slot *s = &m->slots[k];
        CAI_CALL(cai_calloc((void **)&s->resid, (size_t)m->chunk_max + 1, sizeof *s->resid, "model residual views"));
        CAI_CALL(cai_calloc((void **)&s->acts, (size_t)m->n_acts, sizeof *s->acts, "model activation views"));
        if (m->split)
            CAI_CALL(cai_calloc((void **)&s->wg, (size_t)m->n_acts, sizeof *s->wg, "model weight-pass views"));
    }
    m->s = &m->slots[0];
    m->cur_chunk = 0;
    size_t bytes = 0;
    CAI_CALL(carve_all(m, NULL, &bytes));
    CAI_CALL(cai_device_arena_init(m->dev, &m->arena, bytes, "model activations"));
    CAI_CALL(carve_all(m, &m->arena, NULL));
    m->act_bytes = bytes;
    return CAI_OK;
}

/* Tensor parallelism needs the tp group the view names, and whole heads:
 * key/value heads split over tp like the query heads (a kv head replicated
 * over several tp ranks would need its gradient summed over them). The
 * registry checks the rest of the divisibility. */
static cai_status check_tp(const cai_model_config *c, const cai_model_options *o) {
    const int tp = o->view.tp_size;
    if (tp <= 1) return CAI_OK;
    if (!o->mesh) return CAI_ERROR(CAI_ERR_INVALID_ARG, "model: tp=%d needs the mesh whose tp axis the layers use", tp);
    if (cai_mesh_size(o->mesh, CAI_AXIS_TP) != tp || cai_mesh_rank(o->mesh, CAI_AXIS_TP) != o->view.tp_rank)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "model: the view says tp rank %d of %d but the mesh's tp axis is rank %d of %d",
                         o->view.tp_rank, tp, cai_mesh_rank(o->mesh, CAI_AXIS_TP), cai_mesh_size(o->mesh, CAI_AXIS_TP));
    if (c->n_heads % tp != 0 || c->n_kv_heads % tp != 0) {
        int fit = 1;
        for (int t = 1; t <= c->n_kv_heads; t++)
            if (c->n_kv_heads % t == 0 && c->n_heads % t == 0) fit = t;
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "mesh.tp=%d does not divide model.n_heads=%d and model.n_kv_heads=%d (tensor parallelism "
                         "splits whole query and key/value heads; tp=%d fits)",
                         tp, c->n_heads, c->n_kv_heads, fit);
    }
    if (c->ffn_hidden % tp != 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "mesh.tp=%d does not divide model.ffn_hidden=%d", tp, c->ffn_hidden);
    return CAI_OK;
}

/* The vocabulary rows this rank holds, from the registry's shard of the
 * embedding (first stage) or the LM head. */
static cai_status vocab_shard(cai_model_t *m) {
    int idx = cai_registry_find(m->reg, m->first ? "wte.weight" : "lm_head.weight");
    cai_layer_dims *d = &m->dims;
    d->vocab_local = m->Vp;
    d->vocab_offset = 0;
    if (idx < 0 || m->offsets[idx] == SIZE_MAX) return CAI_OK; /* a middle pipeline stage */
    const cai_param_shard *sh = &m->shards[idx];
    d->vocab_local = (int64_t)sh->local_shape[0];
    d->vocab_offset = (int64_t)sh->slab[0].offset[0];
    return CAI_OK;
}

/* A shared weights object must be what this model would have made: the same
 * architecture and dtypes, view and alignment, with storage. */
static cai_status check_shared_weights(const cai_model_t *m, const cai_weights_t *w) {
    const cai_model_config *a = &m->cfg, *b = &w->cfg;
    if (m->external)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "model: shared weights and external parameter storage exclude each other");
    CAI_CALL(cai_weights_check_writable(w, "model: the shared weights"));
    if (a->family != b->family || a->vocab_size != b->vocab_size || a->vocab_multiple != b->vocab_multiple ||
        a->n_layers != b->n_layers || a->d_model != b->d_model || a->n_heads != b->n_heads ||
        a->n_kv_heads != b->n_kv_heads || a->ffn_hidden != b->ffn_hidden || a->max_seq_len != b->max_seq_len ||
        a->tie_embeddings != b->tie_embeddings || a->param_dtype != b->param_dtype || a->act_dtype != b->act_dtype ||
        memcmp(&a->moe, &b->moe, sizeof a->moe) != 0 || a->moe_every != b->moe_every)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "model: the shared weights were made for another configuration (%s %d layers d_model %d, "
                         "%s/%s) than this model's (%s %d layers d_model %d, %s/%s)",
                         cai_model_family_name(b->family), b->n_layers, b->d_model, cai_dtype_name(b->param_dtype),
                         cai_dtype_name(b->act_dtype), cai_model_family_name(a->family), a->n_layers, a->d_model,
                         cai_dtype_name(a->param_dtype), cai_dtype_name(a->act_dtype));
    if (memcmp(&w->view, &m->view, offsetof(cai_rank_view, layer_vstage)) != 0 ||
        w->view.layer_vstage != m->view.layer_vstage || w->align != m->align)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "model: the shared weights hold tp rank %d of %d, pp rank %d of %d (alignment %zu); this "
                         "model is tp rank %d of %d, pp rank %d of %d (alignment %zu)",
                         w->view.tp_rank, w->view.tp_size, w->view.pp_rank, w->view.pp_size, w->align, m->view.tp_rank,
                         m->view.tp_size, m->view.pp_rank, m->view.pp_size, m->align);
    return CAI_OK;
}

cai_status cai_model_create(cai_model_t **out, cai_device_t *dev, const cai_model_config *cfg,
                            const cai_model_options *opt_in) {
    CAI_CHECK_ARG(out && dev && cfg, "cai_model_create: NULL argument");
    *out = NULL;
    cai_model_options opt = opt_in ? *opt_in : cai_model_options_default(cfg);
    cai_model_t *m = NULL;
    CAI_CALL(cai_calloc((void **)&m, 1, sizeof *m, "model"));
    cai_status st = CAI_OK;
    m->dev = dev;
    CAI_CALL_GOTO(cai_model_config_resolve(cfg, &m->cfg), st, fail);
    if (opt.batch < 1 || opt.seq_len < 1 || opt.seq_len > m->cfg.max_seq_len) {
        st = CAI_ERROR(CAI_ERR_INVALID_ARG,
                       "model: batch=%d seq_len=%d (need batch >= 1 and 1 <= seq_len <= "
                       "max_seq_len=%d)",
                       opt.batch, opt.seq_len, m->cfg.max_seq_len);
        goto fail;
    }
    CAI_CALL_GOTO(cai_model_moe_check(&m->cfg, &opt.view, opt.seq_parallel, opt.split_backward, opt.moe_exchange), st,
                  fail);
    CAI_CALL_GOTO(check_tp(&m->cfg, &opt), st, fail);
    m->view = opt.view;
    const int sp = opt.seq_parallel && opt.view.tp_size > 1;
    if (sp && ((int64_t)opt.batch * opt.seq_len) % opt.view.tp_size != 0) {
        st = CAI_ERROR(CAI_ERR_CONFIG,
                       "model: sequence parallelism splits the %d x %d = %lld tokens of a microbatch over tp=%d "
                       "ranks, which does not divide them (choose a batch or seq_len with batch*seq_len a multiple "
                       "of %d)",
                       opt.batch, opt.seq_len, (long long)opt.batch * opt.seq_len, opt.view.tp_size, opt.view.tp_size);
        goto fail;
    }
    m->cx = (cai_layer_ctx){dev, opt.mesh, opt.view.tp_size, opt.view.tp_rank, sp, NULL, NULL, NULL};
    m->external = opt.external_params != 0;
    m->split = opt.split_backward != 0;
    m->frozen = opt.frozen != 0;
    if (m->frozen && m->external) {
        st = CAI_ERROR(CAI_ERR_INVALID_ARG, "model: frozen parameters take no external (ZeRO) storage");
        goto fail;
    }
    if (m->split && m->cfg.activation_checkpointing) {
        st = CAI_ERROR(CAI_ERR_UNSUPPORTED,
                       "model: split_backward keeps every layer's activations from the input pass to the weight "
                       "pass; activation checkpointing keeps one layer's (turn one of them off)");
        goto fail;
    }
    m->align = opt.align_elems ? opt.align_elems : 16;
    m->B = opt.batch;
    m->T = opt.seq_len;
    m->Vp = cai_model_config_padded_vocab(&m->cfg);
    if (opt.weights) {
        CAI_CALL_GOTO(check_shared_weights(m, opt.weights), st, fail);
        m->w = opt.weights;
    }
    CAI_CALL_GOTO(alloc_params(m, &opt), st, fail);
    CAI_CALL_GOTO(resolve_stage(m), st, fail);

    layer_dims_of(&m->cfg, &m->view, m->B, m->T, sp, &m->dims);

    CAI_CALL_GOTO(vocab_shard(m), st, fail);
    {
        const int sets = (opt.act_slots > 0 ? opt.act_slots : 1) * (m->cfg.activation_checkpointing ? 1 : m->chunk_max);
        CAI_CALL_GOTO(cai_model_moe_create(&m->moe, dev, &m->cfg, &m->view, opt.moe_exchange, (int64_t)m->B * m->T,
                                           m->n_local, m->local_layer, sets),
                      st, fail);
    }
    CAI_CALL_GOTO(bind_params(m), st, fail);
    CAI_CALL_GOTO(alloc_acts(m, opt.act_slots), st, fail);
    CAI_CALL_GOTO(cai_model_params_updated(m), st, fail);
    *out = m;
    return CAI_OK;
fail:
    cai_model_free(m);
    return st;
}

void cai_model_free(cai_model_t *m) {
    if (!m) return;
    for (int k = 0; k < m->n_slots; k++) {
        cai_head_acts_release(&m->slots[k].head);
        cai_free(m->slots[k].resid);
        cai_free(m->slots[k].acts);
        cai_free(m->slots[k].wg);
    }
    cai_free(m->slots);
    if (m->arena.base) cai_device_arena_free(m->dev, &m->arena);
    cai_device_dealloc(m->dev, m->grads);
    cai_device_dealloc(m->dev, m->packing);
    cai_device_dealloc(m->dev, m->obj_dev);
    cai_free(m->obj_host);
    cai_fp8_free(m->fp8);
    if (m->own_weights) cai_weights_free(m->w);
    cai_free(m->wp);
    cai_free(m->gp);
    cai_free(m->local_layer);
    cai_free(m->chunk);
    cai_free(m->refs);
    cai_model_moe_free(m->moe);
    cai_free(m);
}

void cai_model_flat(cai_model_t *m, cai_tensor *params, cai_tensor *grads, cai_tensor *params_lowp) {
    if (m->external) {
        const cai_tensor empty = cai_tensor_1d(m->dev, NULL, CAI_DTYPE_F32, 0);
        if (params) *params = empty;
        if (grads) *grads = empty;
        if (params_lowp) memset(params_lowp, 0, sizeof *params_lowp);
        return;
    }
    if (params) *params = flat_view(m->dev, m->master, CAI_DTYPE_F32, 0, m->master ? m->n_flat : 0);
    if (grads) *grads = flat_view(m->dev, m->grads, CAI_DTYPE_F32, 0, m->grads ? m->n_flat : 0);
    if (params_lowp) {
        if (m->lowp) *params_lowp = flat_view(m->dev, m->lowp, m->cfg.param_dtype, 0, m->n_flat);
        else memset(params_lowp, 0, sizeof *params_lowp);
    }
}

cai_status cai_model_param(cai_model_t *m, const char *name, cai_tensor *master, cai_tensor *grad) {
    CAI_CHECK_ARG(m && name, "cai_model_param: NULL argument");
    int idx = 0;
    CAI_CALL(cai_registry_lookup(m->reg, name, &idx));
    if (m->offloaded)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s': the model's weights wait in host memory "
                         "(cai_model_onload first)",
                         name);
    if (m->external)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "parameter '%s': this model's parameters live in external storage "
                         "(ZeRO); ask the owner of that storage",
                         name);
    if (m->offsets[idx] == SIZE_MAX)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s' is not held by this rank (pipeline rank %d of %d)", name,
                         m->view.pp_rank, m->view.pp_size);
    if (master && cai_weights_compute_only(m->w))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s': this frozen model keeps only the copy its layers read "
                         "(cai_model_keep_compute); its F32 master is gone",
                         name);
    if (master) CAI_CALL(param_view(m, idx, m->master, CAI_DTYPE_F32, master));
    if (grad) CAI_CALL(param_view(m, idx, m->grads, CAI_DTYPE_F32, grad));
    return CAI_OK;
}

cai_status cai_model_params_updated(cai_model_t *m) {
    CAI_CHECK_ARG(m, "cai_model_params_updated: NULL model");
    if (m->offloaded)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "cai_model_params_updated: the model's weights wait in host memory (cai_model_onload first)");
    cai_fp8_weights_changed(m->fp8);
    if (m->external) return CAI_OK;
    return cai_weights_updated(m->w);
}

cai_weights_t *cai_model_weights(const cai_model_t *m) { return m->w; }

cai_status cai_model_zero_grad(cai_model_t *m) {
    CAI_CHECK_ARG(m, "cai_model_zero_grad: NULL model");
    if (m->external || m->frozen) return CAI_OK;
    cai_tensor g = flat_view(m->dev, m->grads, CAI_DTYPE_F32, 0, m->n_flat);
    CAI_CALL(m->dev->ops->fill(m->dev, &g, 0.0f));
    return CAI_OK;
}

cai_status cai_model_stage_io(cai_model_t *m, cai_tensor *input, cai_tensor *output, cai_tensor *d_stream) {
    CAI_CHECK_ARG(m, "cai_model_stage_io: NULL model");
    const struct chunk *c = &m->chunk[m->cur_chunk];
    if (input) *input = m->s->resid[0];
    if (output) *output = m->s->resid[c->end - c->begin];
    if (d_stream) *d_stream = m->d_stream;
    return CAI_OK;
}

int cai_model_chunk_count(const cai_model_t *m) { return m->n_chunks; }
int cai_model_slot_count(const cai_model_t *m) { return m->n_slots; }

cai_status cai_model_chunk(const cai_model_t *m, int chunk, int *layer_begin, int *layer_end, int *is_first,
                           int *is_last) {
    CAI_CHECK_ARG(m, "cai_model_chunk: NULL model");
    CAI_CHECK_ARG(chunk >= 0 && chunk < m->n_chunks, "cai_model_chunk: chunk %d of %d", chunk, m->n_chunks);
    const struct chunk *c = &m->chunk[chunk];
    if (layer_begin) *layer_begin = m->local_layer[c->begin];
    if (layer_end) *layer_end = m->local_layer[c->end - 1] + 1;
    if (is_first) *is_first = c->first;
    if (is_last) *is_last = c->last;
    return CAI_OK;
}

cai_status cai_model_select(cai_model_t *m, int chunk, int slot) {
    CAI_CHECK_ARG(m, "cai_model_select: NULL model");
    CAI_CHECK_ARG(chunk >= 0 && chunk < m->n_chunks, "cai_model_select: chunk %d, but this rank holds %d", chunk,
                  m->n_chunks);
    CAI_CHECK_ARG(slot >= 0 && slot < m->n_slots,
                  "cai_model_select: activation slot %d, but the model was created with act_slots=%d", slot,
                  m->n_slots);
    m->cur_chunk = chunk;
    m->s = &m->slots[slot];
    return CAI_OK;
}

static int find_hook(const cai_model_t *m, cai_model_hook_fn fn, const void *ctx) {
    for (int i = 0; i < m->n_hooks; i++)
        if (m->hooks[i].fn == fn && m->hooks[i].ctx == ctx) return i;
    return -1;
}

cai_status cai_model_add_hook(cai_model_t *m, cai_model_hook_fn fn, void *ctx) {
    CAI_CHECK_ARG(m && fn, "cai_model_add_hook: NULL argument");
    CAI_CHECK_ARG(find_hook(m, fn, ctx) < 0, "cai_model_add_hook: this hook is already added");
    CAI_CHECK_ARG(m->n_hooks < CAI_MODEL_MAX_HOOKS, "cai_model_add_hook: the model has its %d hooks already",
                  CAI_MODEL_MAX_HOOKS);
    m->hooks[m->n_hooks].fn = fn;
    m->hooks[m->n_hooks].ctx = ctx;
    m->n_hooks++;
    return CAI_OK;
}

cai_status cai_model_remove_hook(cai_model_t *m, cai_model_hook_fn fn, void *ctx) {
    CAI_CHECK_ARG(m && fn, "cai_model_remove_hook: NULL argument");
    const int i = find_hook(m, fn, ctx);
    CAI_CHECK_ARG(i >= 0, "cai_model_remove_hook: no such hook");
    for (int k = i; k + 1 < m->n_hooks; k++) m->hooks[k] = m->hooks[k + 1];
    m->n_hooks--;
    return CAI_OK;
}

int cai_model_external_params(const cai_model_t *m) { return m->external; }
int cai_model_seq_parallel(const cai_model_t *m) { return m->cx.seq_parallel && m->view.tp_size > 1; }

int cai_model_unit_params(const cai_model_t *m, int unit, int *indices, int max) {
    int n = 0;
    for (int i = 0; i < m->n_refs; i++) {
        if (m->refs[i].unit != unit) continue;
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= m->refs[j].unit == unit && m->refs[j].index == m->refs[i].index;
        if (dup) continue;
        if (n < max) indices[n] = m->refs[i].index;
        n++;
    }
    /* Registration order: insertion sort of the few (<= 16) entries written. */
    int w = n < max ? n : max;
    for (int i = 1; i < w; i++)
        for (int j = i; j > 0 && indices[j - 1] > indices[j]; j--) {
            int t = indices[j];
            indices[j] = indices[j - 1];
            indices[j - 1] = t;
        }
    return n;
}

cai_status cai_model_bind_param(cai_model_t *m, int index, void *compute, float *grad) {
    CAI_CHECK_ARG(m, "cai_model_bind_param: NULL model");
    CAI_CHECK_ARG(m->external,
                  "cai_model_bind_param: the model owns its parameters (create it with "
                  "external_params = 1 to bind storage)");
    CAI_CHECK_ARG(index >= 0 && index < m->n_params && m->offsets[index] != SIZE_MAX,
                  "cai_model_bind_param: parameter %d is not held by this rank", index);
    for (int i = 0; i < m->n_refs; i++)
        if (m->refs[i].index == index) {
            m->refs[i].w->data = compute;
            m->refs[i].g->data = grad;
        }
    return CAI_OK;
}

/* Every view of the compute weights at the storage's current address (NULL
 * while offloaded); a frozen model has no gradients to re-bind. */
static void rebind_compute(cai_model_t *m) {
    const cai_weights_t *w = m->w;
    m->master = w->master;
    m->lowp = w->lowp;
    m->work = w->work;
    m->compute = w->compute;
    const size_t es = cai_dtype_size(m->cfg.act_dtype);
    for (int i = 0; i < m->n_refs; i++)
        m->refs[i].w->data = m->compute ? (char *)m->compute + m->offsets[m->refs[i].index] * es : NULL;
}

/* The activation arena holds nothing between forwards of a frozen model:
 * offloaded, it is given back; onloaded, allocated again and every view
 * carved anew (the RoPE tables recomputed into the scratch). */
static void release_acts(cai_model_t *m) {
    for (int k = 0; k < m->n_slots; k++) cai_head_acts_release(&m->slots[k].head);
    cai_device_arena_free(m->dev, &m->arena);
    cai_model_moe_release_acts(m->moe);
}

static cai_status restore_acts(cai_model_t *m) {
    CAI_CALL(cai_device_arena_init(m->dev, &m->arena, m->act_bytes, "model activations"));
    cai_status st = carve_all(m, &m->arena, NULL);
    if (st == CAI_OK) st = cai_model_moe_restore_acts(m->moe);
    if (st != CAI_OK) release_acts(m);
    return st;
}

/* What only a frozen model with weights of its own may do (`does`). */
static cai_status own_frozen(const cai_model_t *m, const char *what, const char *does) {
    CAI_CHECK_ARG(m, "%s: NULL model", what);
    if (!m->frozen || !m->own_weights || m->external)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: only a frozen model with weights of its own can %s (this one %s)",
                         what, does, !m->frozen ? "is trained" : "shares or binds its weights");
    return CAI_OK;
}

/* Offload (to_host) or onload a frozen model with weights of its own. */
static cai_status move_weights(cai_model_t *m, int to_host, const char *what) {
    CAI_CALL(own_frozen(m, what, "wait in host memory"));
    if (m->offloaded == to_host) return CAI_OK;
    if (to_host) {
        CAI_CALL(cai_weights_offload(m->w)); /* synchronises: no forward still reads the arena */
        release_acts(m);
    } else {
        CAI_CALL(restore_acts(m));
        cai_status st = cai_weights_onload(m->w);
        if (st != CAI_OK) {
            release_acts(m);
            return st;
        }
    }
    m->offloaded = to_host;
    rebind_compute(m);
    return CAI_OK;
}

cai_status cai_model_keep_compute(cai_model_t *m) {
    CAI_CALL(own_frozen(m, "cai_model_keep_compute", "drop its masters"));
    CAI_CALL(cai_weights_keep_compute(m->w));
    rebind_compute(m);
    return CAI_OK;
}

cai_status cai_model_offload(cai_model_t *m) { return move_weights(m, 1, "cai_model_offload"); }
cai_status cai_model_onload(cai_model_t *m) { return move_weights(m, 0, "cai_model_onload"); }

int cai_model_offloaded(const cai_model_t *m) { return m && m->offloaded; }

/* Fire the hook, then (external storage) check the unit can run. */
static cai_status fire(cai_model_t *m, cai_model_event ev, int unit) {
    for (int i = 0; i < m->n_hooks; i++) CAI_CALL(m->hooks[i].fn(m->hooks[i].ctx, m, ev, unit));
    if (!m->external || (ev != CAI_MODEL_PRE_FORWARD && ev != CAI_MODEL_PRE_BACKWARD)) return CAI_OK;
    for (int i = 0; i < m->n_refs; i++) {
        const struct view_ref *r = &m->refs[i];
        if (r->unit == unit && (!r->w->data || (ev == CAI_MODEL_PRE_BACKWARD && !r->g->data)))
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "model unit %d: parameter '%s' has no bound %s before its %s "
                             "(external storage: bind it with cai_model_bind_param, e.g. from the hook)",
                             unit, cai_registry_param(m->reg, r->index)->name, r->w->data ? "gradient" : "weights",
                             ev == CAI_MODEL_PRE_FORWARD ? "forward" : "backward");
    }
    return CAI_OK;
}

static cai_status upload_i32(cai_model_t *m, cai_tensor *dst, const int32_t *src) {
    size_t bytes = (size_t)m->B * m->T * sizeof(int32_t);
    return cai_device_copy(m->dev, dst->data, src, bytes,
                           m->dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D);
}

/* Row b of a packing: every document one contiguous run of ids that do not
 * decrease, its positions 0, 1, 2, ... from its first token. */
static cai_status check_packed_row(const int32_t *pos, const int32_t *doc, int64_t b, int64_t T) {
    static const char *fn = "cai_model_set_packing";
    for (int64_t t = 0; t < T; t++) {
        int starts = t == 0 || doc[t] != doc[t - 1];
        if (t > 0 && doc[t] < doc[t - 1])
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: doc_ids[%" PRId64 ",%" PRId64
                             "] = %d after %d: ids must not decrease along a row "
                             "(each document one contiguous run)",
                             fn, b, t, (int)doc[t], (int)doc[t - 1]);
        int32_t want = starts ? 0 : pos[t - 1] + 1;
        if (pos[t] != want)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: positions[%" PRId64 ",%" PRId64
                             "] = %d, expected %d (positions restart at 0 where a "
                             "document starts and count up by one within it)",
                             fn, b, t, (int)pos[t], (int)want);
    }
    return CAI_OK;
}

cai_status cai_model_set_packing(cai_model_t *m, const int32_t *positions, const int32_t *doc_ids) {
    static const char *fn = "cai_model_set_packing";
    CAI_CHECK_ARG(m, "%s: NULL model", fn);
    if (!positions && !doc_ids) {
        m->cx.positions = m->cx.doc_ids = NULL;
        return CAI_OK;
    }
    CAI_CHECK_ARG(positions && doc_ids, "%s: positions and doc_ids come together (both NULL turns packing off)", fn);
    CAI_CHECK_ARG(!m->cx.attn, "%s: packed rows and a sharded sequence (cai_model_set_seq_attention) do not combine",
                  fn);
    if (cai_model_seq_parallel(m))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: packed rows under sequence parallelism are not supported (each rank holds a block of "
                         "tokens; run packed batches with seq_parallel off)",
                         fn);
    if (m->n_slots > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: the model keeps %d microbatches' activations in flight (pipeline schedule); packing "
                         "holds one batch's positions and document ids, so it needs a single activation slot",
                         fn, m->n_slots);
    const int64_t n = (int64_t)m->B * m->T;
    for (int64_t b = 0; b < m->B; b++) CAI_CALL(check_packed_row(positions + b * m->T, doc_ids + b * m->T, b, m->T));
    if (!m->packing) {
        CAI_CALL(cai_device_alloc(m->dev, 2 * (size_t)n * sizeof(int32_t), "packed positions and document ids",
                                  (void **)&m->packing));
        m->pack_pos = cai_tensor_2d(m->dev, m->packing, CAI_DTYPE_I32, m->B, m->T);
        m->pack_doc = cai_tensor_2d(m->dev, m->packing + n, CAI_DTYPE_I32, m->B, m->T);
    }
    CAI_CALL(upload_i32(m, &m->pack_pos, positions));
    CAI_CALL(upload_i32(m, &m->pack_doc, doc_ids));
    m->cx.positions = &m->pack_pos;
    m->cx.doc_ids = &m->pack_doc;
    return CAI_OK;
}

cai_status cai_model_set_seq_attention(cai_model_t *m, const cai_attn_hook *hook, const int32_t *positions) {
    static const char *fn = "cai_model_set_seq_attention";
    CAI_CHECK_ARG(m, "%s: NULL model", fn);
    if (!hook) {
        m->cx.attn = NULL;
        m->cx.positions = NULL;
        return CAI_OK;
    }
    CAI_CHECK_ARG(hook->fwd && hook->bwd && positions, "%s: the hook's fwd and bwd and the positions are required", fn);
    CAI_CHECK_ARG(!m->cx.doc_ids, "%s: packed rows (cai_model_set_packing) and a sharded sequence do not combine", fn);
    CAI_CHECK_ARG(!m->obj_on, "%s: an objective (cai_model_set_objective) sums over whole rows; unset it first", fn);
    if (cai_model_seq_parallel(m))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: split-gather sequence parallelism already splits the tokens over tp; it does not "
                         "combine with a sequence sharded over the sp axis",
                         fn);
    const int64_t n = (int64_t)m->B * m->T;
    for (int64_t t = 0; t < m->T; t++)
        CAI_CHECK_ARG(positions[t] >= 0 && positions[t] < m->cfg.max_seq_len,
                      "%s: positions[%lld] = %d is outside [0, max_seq_len = %d)", fn, (long long)t, (int)positions[t],
                      m->cfg.max_seq_len);
    if (!m->packing) {
        CAI_CALL(cai_device_alloc(m->dev, 2 * (size_t)n * sizeof(int32_t), "packed positions and document ids",
                                  (void **)&m->packing));
        m->pack_pos = cai_tensor_2d(m->dev, m->packing, CAI_DTYPE_I32, m->B, m->T);
        m->pack_doc = cai_tensor_2d(m->dev, m->packing + n, CAI_DTYPE_I32, m->B, m->T);
    }
    int32_t *rows = NULL;
    CAI_CALL(cai_malloc((void **)&rows, (size_t)n * sizeof(int32_t), "sequence shard positions"));
    for (int64_t b = 0; b < m->B; b++) memcpy(rows + b * m->T, positions, (size_t)m->T * sizeof(int32_t));
    cai_status st = upload_i32(m, &m->pack_pos, rows);
    cai_free(rows);
    CAI_CALL(st);
    m->cx.positions = &m->pack_pos;
    m->cx.attn = hook;
    return CAI_OK;
}

/* i: the layer's index within the selected chunk. */
static cai_block_acts *layer_acts(cai_model_t *m, int i) { return &m->s->acts[m->n_acts == 1 ? 0 : i]; }

/* The MoE activation set of the selected slot's layer i (the sets follow
 * the block activations: n_acts per slot). */
static int moe_set(const cai_model_t *m, int i) {
    return (int)(m->s - m->slots) * m->n_acts + (m->n_acts == 1 ? 0 : i);
}

/* Block li (layer i of the selected chunk), dense or with an MoE MLP;
 * train: a training forward (the router statistics count). */
static cai_status block_fwd(cai_model_t *m, int li, int i, int train) {
    act_slot *s = m->s;
    cai_block_acts *a = layer_acts(m, i);
    if (!cai_model_moe_is_layer(m->moe, li))
        return cai_block_fwd(&m->cx, &m->dims, &m->wp[li], a, &m->scratch, &s->resid[i], &s->resid[i + 1]);
    CAI_CALL(cai_attn_fwd(&m->cx, &m->dims, &m->wp[li], a, &m->scratch, &s->resid[i], &a->res_mid));
    return cai_model_moe_block_fwd(m->moe, &m->cx, &m->dims, li, moe_set(m, i), &m->wp[li], a, &m->scratch, &a->res_mid,
                                   &s->resid[i + 1], train);
}

/* grad_scale: the MoE losses' gradients are taken with it, as the loss's. */
static cai_status block_bwd(cai_model_t *m, int li, int i, float grad_scale) {
    act_slot *s = m->s;
    cai_block_acts *a = layer_acts(m, i);
    if (!cai_model_moe_is_layer(m->moe, li))
        return cai_block_bwd(&m->cx, &m->dims, &m->wp[li], &m->gp[li], a, &m->scratch, &s->resid[i], &m->d_stream);
    CAI_CALL(cai_model_moe_block_bwd(m->moe, &m->cx, &m->dims, li, moe_set(m, i), &m->wp[li], &m->gp[li], a,
                                     &m->scratch, &a->res_mid, &m->d_stream, grad_scale));
    return cai_attn_bwd(&m->cx, &m->dims, &m->wp[li], &m->gp[li], a, &m->scratch, &s->resid[i], &m->d_stream);
}

/* The loss gradient's scale for the mean over the last forward's valid
 * targets: one formula for cai_model_forward_train and cai_model_backward,
 * whose numbers must agree bit for bit. */
static float dloss_scale(const cai_model_t *m, float grad_scale) {
    return m->s->n_valid > 0 ? grad_scale / (float)m->s->n_valid : 0.0f;
}

/* ---------------------------------------------------------- objectives */

cai_status cai_model_set_objective(cai_model_t *m, const cai_model_objective *obj) {
    static const char *fn = "cai_model_set_objective";
    CAI_CHECK_ARG(m, "%s: NULL model", fn);
    if (!obj) {
        m->obj_on = 0;
        return CAI_OK;
    }
    CAI_CHECK_ARG(obj->fn, "%s: the objective has no function", fn);
    CAI_CHECK_ARG(isfinite(obj->logit_scale) && obj->logit_scale >= 0.0f,
                  "%s: logit_scale=%g must be finite and >= 0 (0: 1)", fn, (double)obj->logit_scale);
    if (m->n_slots > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: the model keeps %d microbatches' activations in flight (pipeline schedule); an "
                         "objective needs one",
                         fn, m->n_slots);
    if (m->cx.attn)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: the sequence is sharded over ranks (ring attention / Ulysses) and the objectives "
                         "sum over whole rows",
                         fn);
    if (obj->want_hidden && m->cx.seq_parallel)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: a hidden-state objective under split-gather sequence parallelism",
                         fn);
    const size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model;
    if (!m->obj_host) {
        CAI_CALL(cai_calloc((void **)&m->obj_host, N * (2 + 2 * C), sizeof(float), "objective buffers"));
        const size_t act = cai_dtype_size(m->cfg.act_dtype);
        const size_t bytes = N * sizeof(float) + N * C * (sizeof(float) + act);
        CAI_CALL(cai_device_alloc(m->dev, bytes, "objective gradients", &m->obj_dev));
        char *p = m->obj_dev;
        m->obj_dlosses = cai_tensor_1d(m->dev, p, CAI_DTYPE_F32, (int64_t)N);
        m->obj_stage = cai_tensor_2d(m->dev, p + N * sizeof(float), CAI_DTYPE_F32, (int64_t)N, (int64_t)C);
        m->obj_dhidden = cai_tensor_2d(m->dev, p + N * sizeof(float) + N * C * sizeof(float), m->cfg.act_dtype,
                                       (int64_t)N, (int64_t)C);
    }
    m->obj = *obj;
    m->obj_on = 1;
    return CAI_OK;
}

/* The last forward's token losses (and hidden states) to the host, then
 * the objective; its gradients stay on the host until backward scales
 * them. */
static cai_status run_objective(cai_model_t *m, const int32_t *targets, double *value) {
    cai_device_t *dev = m->dev;
    act_slot *s = m->s;
    const size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model;
    const int host = dev->kind == CAI_DEVICE_HOST;
    float *loss = m->obj_host, *dloss = loss + N, *hidden = loss + 2 * N, *dhidden = hidden + N * C;
    CAI_CALL(cai_device_copy(dev, loss, s->head.losses.data, N * sizeof(float), host ? CAI_COPY_H2H : CAI_COPY_D2H));
    memset(dloss, 0, N * sizeof(float));
    cai_model_objective_io io = {.batch = m->B,
                                 .seq_len = m->T,
                                 .hidden_size = (int64_t)C,
                                 .targets = targets,
                                 .token_loss = loss,
                                 .dtoken_loss = dloss};
    if (m->obj.want_hidden) {
        cai_tensor lnf = cai_tensor_2d(dev, s->head.lnf.data, s->head.lnf.dtype, (int64_t)N, (int64_t)C);
        CAI_CALL(dev->ops->copy(dev, &m->obj_stage, &lnf));
        CAI_CALL(
            cai_device_copy(dev, hidden, m->obj_stage.data, N * C * sizeof(float), host ? CAI_COPY_H2H : CAI_COPY_D2H));
        memset(dhidden, 0, N * C * sizeof(float));
        io.hidden = hidden;
        io.dhidden = dhidden;
    }
    CAI_CALL(m->obj.fn(m->obj.ctx, &io));
    *value = io.loss;
    return CAI_OK;
}

/* grad_scale times the objective's gradients onto the device. */
static cai_status objective_grads(cai_model_t *m, float grad_scale) {
    cai_device_t *dev = m->dev;
    const size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model;
    const int host = dev->kind == CAI_DEVICE_HOST;
    const float *dloss = m->obj_host + N, *dhidden = m->obj_host + 2 * N + N * C;
    CAI_CALL(cai_device_copy(dev, m->obj_dlosses.data, dloss, N * sizeof(float), host ? CAI_COPY_H2H : CAI_COPY_H2D));
    CAI_CALL(dev->ops->scale(dev, &m->obj_dlosses, grad_scale));
    if (!m->obj.want_hidden) return CAI_OK;
    CAI_CALL(
        cai_device_copy(dev, m->obj_stage.data, dhidden, N * C * sizeof(float), host ? CAI_COPY_H2H : CAI_COPY_H2D));
    CAI_CALL(dev->ops->scale(dev, &m->obj_stage, grad_scale));
    return dev->ops->copy(dev, &m->obj_dhidden, &m->obj_stage);
}

/* grad_scale non-NULL: cai_model_forward_train. Runs the selected chunk
 * into the selected slot. */
static cai_status forward(cai_model_t *m, const int32_t *tokens, const int32_t *targets, const float *grad_scale,
                          float *loss) {
    cai_device_t *dev = m->dev;
    const struct chunk *c = &m->chunk[m->cur_chunk];
    act_slot *s = m->s;
    const int nl = c->end - c->begin;
    if (m->offloaded)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "cai_model_forward: the model's weights wait in host memory (cai_model_onload first)");
    if (s->pending_weight)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "cai_model_forward: activation slot %d still holds chunk %d's activations for its weight "
                         "pass (cai_model_backward_weight), which has not run",
                         (int)(s - m->slots), s->chunk);
    s->pending_backward = 0;
    s->chunk = m->cur_chunk;
    if (c->first) {
        CAI_CHECK_ARG(tokens, "cai_model_forward: the first pipeline stage needs tokens");
        CAI_CALL(upload_i32(m, &s->tokens, tokens));
        CAI_CALL(fire(m, CAI_MODEL_PRE_FORWARD, 0));
        CAI_CALL(cai_embed_fwd(&m->cx, &m->dims, &m->wte, &m->wpe, &m->scratch, &s->tokens, &s->resid[0]));
        CAI_CALL(fire(m, CAI_MODEL_POST_FORWARD, 0));
    }
    for (int i = 0; i < nl; i++) {
        const int unit = block_unit(m, c->begin + i);
        CAI_CALL(fire(m, CAI_MODEL_PRE_FORWARD, unit));
        CAI_CALL(block_fwd(m, c->begin + i, i, grad_scale != NULL));
        CAI_CALL(fire(m, CAI_MODEL_POST_FORWARD, unit));
    }
    if (!c->last) return CAI_OK;
    const int head_unit = cai_model_unit_count(m) - 1;
    if (targets) {
        int64_t n = (int64_t)m->B * m->T, valid = 0;
        for (int64_t i = 0; i < n; i++) valid += targets[i] != CAI_IGNORE_INDEX;
        s->n_valid = valid;
        CAI_CALL(upload_i32(m, &s->targets, targets));
    }
    CAI_CALL(fire(m, CAI_MODEL_PRE_FORWARD, head_unit));
    s->objective = targets && m->obj_on;
    s->head.logit_scale = s->objective ? m->obj.logit_scale : 0.0f;
    if (s->objective) {
        CAI_CALL(cai_head_fwd(&m->cx, &m->dims, &m->lnf_w, &m->lnf_b, &m->head_w, &s->head, &m->scratch, &s->resid[nl],
                              &s->targets));
        CAI_CALL(fire(m, CAI_MODEL_POST_FORWARD, head_unit));
        double value = 0;
        CAI_CALL(run_objective(m, targets, &value));
        if (grad_scale) s->train_scale = *grad_scale;
        s->pending_backward = 1;
        if (loss) *loss = (float)value;
        return CAI_OK;
    }
    if (targets && grad_scale) {
        s->train_scale = *grad_scale;
        CAI_CALL(cai_head_fwd_train(&m->cx, &m->dims, &m->lnf_w, &m->lnf_b, &m->head_w, &s->head, &m->scratch,
                                    &s->resid[nl], &s->targets, dloss_scale(m, *grad_scale)));
    } else {
        CAI_CALL(cai_head_fwd(&m->cx, &m->dims, &m->lnf_w, &m->lnf_b, &m->head_w, &s->head, &m->scratch, &s->resid[nl],
                              targets ? &s->targets : NULL));
    }
    CAI_CALL(fire(m, CAI_MODEL_POST_FORWARD, head_unit));
    if (!targets) return CAI_OK;
    s->pending_backward = 1;
    if (loss) {
        float sum = 0.0f;
        CAI_CALL(cai_device_copy(dev, &sum, s->head.loss_sum.data, sizeof sum,
                                 dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H));
        *loss = s->n_valid > 0 ? sum / (float)s->n_valid : 0.0f;
    }
    return CAI_OK;
}

cai_status cai_model_forward(cai_model_t *m, const int32_t *tokens, const int32_t *targets, float *loss) {
    CAI_CHECK_ARG(m, "cai_model_forward: NULL model");
    return forward(m, tokens, targets, NULL, loss);
}

cai_status cai_model_forward_train(cai_model_t *m, const int32_t *tokens, const int32_t *targets, float grad_scale,
                                   float *loss) {
    CAI_CHECK_ARG(m, "cai_model_forward_train: NULL model");
    CAI_CHECK_ARG(isfinite(grad_scale), "cai_model_forward_train: grad_scale %g is not finite", (double)grad_scale);
    if (m->chunk[m->cur_chunk].last && !targets)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_model_forward_train: the last pipeline stage needs targets");
    return forward(m, tokens, targets, &grad_scale, loss);
}

cai_status cai_model_logits(cai_model_t *m, cai_tensor *logits) {
    CAI_CHECK_ARG(m && logits, "cai_model_logits: NULL argument");
    if (!m->last)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "logits live on the last pipeline stage; this is rank %d of %d",
                         m->view.pp_rank, m->view.pp_size);
    if (m->s->head.logits_hold_grad)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "cai_model_logits: cai_model_forward_train replaced the logits by their "
                         "gradient; use cai_model_forward to read logits");
    *logits = m->s->head.logits;
    return CAI_OK;
}

/* split: the input pass of a split backward (blocks keep their matmuls'
 * output gradients; the head and the embedding run whole). */
static cai_status backward(cai_model_t *m, float grad_scale, int split, const char *fn) {
    const struct chunk *c = &m->chunk[m->cur_chunk];
    act_slot *s = m->s;
    const int nl = c->end - c->begin;
    if (s->pending_weight || s->chunk != m->cur_chunk)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: activation slot %d holds chunk %d's activations%s but chunk %d is selected", fn,
                         (int)(s - m->slots), s->chunk, s->pending_weight ? ", waiting for their weight pass," : "",
                         m->cur_chunk);
    if (c->last) {
        if (!s->pending_backward)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "cai_model_backward: needs a forward with targets first (and runs "
                             "once per forward: it overwrites the logits with their gradient)");
        if (s->head.logits_hold_grad && grad_scale != s->train_scale)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "cai_model_backward: grad_scale %g differs from the %g that "
                             "cai_model_forward_train made the loss gradient with",
                             (double)grad_scale, (double)s->train_scale);
        const float scale = dloss_scale(m, grad_scale);
        const int head_unit = cai_model_unit_count(m) - 1;
        const cai_tensor *dlosses = NULL, *dhidden = NULL;
        if (s->objective) {
            CAI_CALL(objective_grads(m, grad_scale));
            dlosses = &m->obj_dlosses;
            if (m->obj.want_hidden) dhidden = &m->obj_dhidden;
        }
        CAI_CALL(fire(m, CAI_MODEL_PRE_BACKWARD, head_unit));
        CAI_CALL(cai_head_bwd(&m->cx, &m->dims, &m->lnf_w, &m->head_w, &m->g_lnf_w, &m->g_lnf_b, &m->g_head_w, &s->head,
                              &m->scratch, &s->resid[nl], &s->targets, scale, dlosses, dhidden, &m->d_stream));
        s->pending_backward = 0;
        CAI_CALL(fire(m, CAI_MODEL_POST_BACKWARD, head_unit));
    }
    for (int i = nl - 1; i >= 0; i--) {
        cai_block_acts *a = layer_acts(m, i);
        const int li = c->begin + i, unit = block_unit(m, li);
        CAI_CALL(fire(m, CAI_MODEL_PRE_BACKWARD, unit));
        /* Checkpointed: the layer's input survived, everything else is
         * re-derived by the same deterministic forward (so the gradients are
         * bitwise those of the uncheckpointed run). The chunk's last layer's
         * activations are still in the slot's set from the forward. */
        if (m->cfg.activation_checkpointing && i != nl - 1) CAI_CALL(block_fwd(m, li, i, 0));
        if (split) {
            CAI_CALL(cai_block_bwd_input(&m->cx, &m->dims, &m->wp[li], &m->gp[li], a, &m->scratch, &s->wg[i],
                                         &s->resid[i], &m->d_stream));
            continue; /* the unit's gradients are complete after its weight pass */
        }
        CAI_CALL(block_bwd(m, li, i, grad_scale));
        CAI_CALL(fire(m, CAI_MODEL_POST_BACKWARD, unit));
    }
    if (c->first) {
        CAI_CALL(fire(m, CAI_MODEL_PRE_BACKWARD, 0));
        if (!m->frozen)
            CAI_CALL(cai_embed_bwd(&m->cx, &m->dims, &m->g_wte, &m->g_wpe, &m->scratch, &s->tokens, &m->d_stream));
        CAI_CALL(fire(m, CAI_MODEL_POST_BACKWARD, 0));
    }
    s->pending_weight = split && nl > 0;
    return CAI_OK;
}

cai_status cai_model_backward(cai_model_t *m, float grad_scale) {
    CAI_CHECK_ARG(m, "cai_model_backward: NULL model");
    return backward(m, grad_scale, 0, "cai_model_backward");
}

cai_status cai_model_backward_input(cai_model_t *m, float grad_scale) {
    CAI_CHECK_ARG(m, "cai_model_backward_input: NULL model");
    if (!m->split)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "cai_model_backward_input: the model was created without split_backward (nowhere to keep "
                         "the weight pass's gradients)");
    return backward(m, grad_scale, 1, "cai_model_backward_input");
}

cai_status cai_model_backward_weight(cai_model_t *m) {
    CAI_CHECK_ARG(m, "cai_model_backward_weight: NULL model");
    act_slot *s = m->s;
    if (!s->pending_weight || s->chunk != m->cur_chunk)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "cai_model_backward_weight: activation slot %d has no input pass of chunk %d waiting for "
                         "its weight pass (cai_model_backward_input first)",
                         (int)(s - m->slots), m->cur_chunk);
    const struct chunk *c = &m->chunk[m->cur_chunk];
    for (int i = c->end - c->begin - 1; i >= 0; i--) {
        const int li = c->begin + i;
        CAI_CALL(
            cai_block_bwd_weight(&m->cx, &m->dims, &m->wp[li], &m->gp[li], layer_acts(m, i), &m->scratch, &s->wg[i]));
        CAI_CALL(fire(m, CAI_MODEL_POST_BACKWARD, block_unit(m, li)));
    }
    s->pending_weight = 0;
    return CAI_OK;
}

int cai_model_split_backward(const cai_model_t *m) { return m ? m->split : 0; }

cai_status cai_model_set_lora(cai_model_t *m, struct cai_lora *lora) {
    CAI_CHECK_ARG(m, "cai_model_set_lora: NULL model");
    if (lora) {
        if (m->view.tp_size > 1)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "LoRA on a tensor-parallel model (tp=%d) is not supported: the adapters act on whole "
                             "linears; run LoRA with tp=1",
                             m->view.tp_size);
        const cai_lora_adapter *a = cai_lora_get(lora, 0);
        const cai_registry_t *lr = cai_lora_registry(lora);
        if (cai_registry_n_layers(lr) != m->cfg.n_layers || (a && cai_registry_find(m->reg, a->param) < 0))
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "cai_model_set_lora: the adapters were made for %d layers of another architecture "
                             "than this %s model of %d layers",
                             cai_registry_n_layers(lr), cai_model_family_name(m->cfg.family), m->cfg.n_layers);
        CAI_CALL(cai_lora_prepare(lora, m->B, m->T, m->cfg.act_dtype));
    }
    for (int i = 0; i < m->n_local; i++) m->wp[i].lora = lora ? cai_lora_layer_of(lora, m->local_layer[i]) : NULL;
    return CAI_OK;
}

/* The FP8 linears' [in, out] widths in a block of these (local) dims; 0 for a site the block lacks. */
static void fp8_widths(const cai_layer_dims *d, int64_t w[CAI_FP8_SITE_COUNT][2]) {
    const int64_t attn = d->n_heads * d->head_dim, qkv = (d->n_heads + 2 * d->n_kv_heads) * d->head_dim;
    const int swiglu = d->kinds.mlp == CAI_MLP_SWIGLU;
    memset(w, 0, sizeof(int64_t) * 2 * CAI_FP8_SITE_COUNT);
    w[CAI_FP8_SITE_QKV][0] = d->C, w[CAI_FP8_SITE_QKV][1] = qkv;
    w[CAI_FP8_SITE_ATTN_PROJ][0] = attn, w[CAI_FP8_SITE_ATTN_PROJ][1] = d->C;
    w[CAI_FP8_SITE_FC][0] = d->C, w[CAI_FP8_SITE_FC][1] = d->ffn;
    if (swiglu) w[CAI_FP8_SITE_UP][0] = d->C, w[CAI_FP8_SITE_UP][1] = d->ffn;
    w[CAI_FP8_SITE_MLP_PROJ][0] = d->ffn, w[CAI_FP8_SITE_MLP_PROJ][1] = d->C;
}

cai_status cai_model_fp8_bytes(const cai_device_t *dev, const cai_registry_t *reg, const cai_model_config *cfg,
                               const cai_rank_view *view, int batch, int seq_len, int seq_parallel,
                               const cai_fp8_config *f8, size_t *bytes) {
    CAI_CHECK_ARG(dev && reg && cfg && view && bytes, "cai_model_fp8_bytes: NULL argument");
    *bytes = 0;
    if (!f8 || !f8->enabled) return CAI_OK;
    cai_model_config c;
    CAI_CALL(cai_model_config_resolve(cfg, &c));
    cai_layer_dims d;
    layer_dims_of(&c, view, batch, seq_len, seq_parallel, &d);
    int64_t widths[CAI_FP8_SITE_COUNT][2];
    fp8_widths(&d, widths);
    /* the linears this rank runs: its pipeline stage's layers, an MoE
     * block's attention only (its experts stay in bf16) */
    unsigned char *runs = calloc((size_t)c.n_layers * CAI_FP8_SITE_COUNT, 1);
    if (!runs) return CAI_ERROR(CAI_ERR_NOMEM, "cai_model_fp8_bytes: %d layers", c.n_layers);
    cai_status st = CAI_OK;
    for (int l = 0; l < c.n_layers && st == CAI_OK; l++) {
        int vs = 0;
        st = cai_registry_layer_vstage(reg, view, l, &vs);
        if (st != CAI_OK || cai_rank_view_vstage_rank(view, vs) != view->pp_rank) continue;
        const int moe = cai_model_moe_layer(&c, l);
        for (int s = 0; s < CAI_FP8_SITE_COUNT; s++)
            runs[l * CAI_FP8_SITE_COUNT + s] =
                widths[s][0] > 0 && !(moe && s != CAI_FP8_SITE_QKV && s != CAI_FP8_SITE_ATTN_PROJ);
    }
    if (st == CAI_OK) st = cai_fp8_plan_bytes(dev, f8, c.n_layers, d.B * d.T, widths, runs, bytes);
    free(runs);
    return st;
}

cai_status cai_model_set_fp8(cai_model_t *m, const cai_fp8_config *cfg, cai_mesh_t *mesh) {
    CAI_CHECK_ARG(m, "cai_model_set_fp8: NULL model");
    for (int i = 0; i < m->n_local; i++) m->wp[i].fp8 = NULL;
    cai_fp8_free(m->fp8);
    m->fp8 = NULL;
    if (!cfg || !cfg->enabled) return CAI_OK;
    const cai_layer_dims *d = &m->dims;
    int64_t widths[CAI_FP8_SITE_COUNT][2];
    fp8_widths(d, widths);
    CAI_CALL(cai_fp8_create(&m->fp8, m->dev, cfg, m->cfg.n_layers, d->B * d->T, widths, mesh));
    for (int i = 0; i < m->n_local; i++) m->wp[i].fp8 = cai_fp8_layer_of(m->fp8, m->local_layer[i]);
    return CAI_OK;
}

cai_fp8_t *cai_model_fp8(const cai_model_t *m) { return m ? m->fp8 : NULL; }
