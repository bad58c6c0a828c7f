/* Parameter registry: the table of parameters, their ownership under a rank
 * view, and the hyperslabs of each rank's shard. Everything that needs to know
 * where a parameter's elements live asks here, so the rules (whole heads per
 * QKV section, balanced vocab ranges, interleaved pipeline chunks, expert
 * placement) exist exactly once. */
#include "cai_config.h"
#include "colossal/model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cai_registry {
    cai_param_info *params;
    char **names;
    int count, capacity;
    int *table; /* open addressing over name hashes: parameter index or -1 */
    int table_cap;
    int n_layers;
    uint64_t global_numel;
};

static const char *const k_init_names[CAI_INIT_COUNT] = {
    [CAI_INIT_ZEROS] = "zeros",
    [CAI_INIT_ONES] = "ones",
    [CAI_INIT_NORMAL] = "normal",
    [CAI_INIT_NORMAL_RESIDUAL] = "normal_residual",
};

const char *cai_init_kind_name(cai_init_kind kind) {
    if ((int)kind < 0 || kind >= CAI_INIT_COUNT) return "?";
    return k_init_names[kind];
}

cai_param_spec cai_param_spec_default(void) {
    cai_param_spec s;
    memset(&s, 0, sizeof s);
    s.tp_split_dim = -1;
    s.pp_place = CAI_PP_LAYER;
    s.layer = -1;
    s.expert = -1;
    s.n_experts = 0;
    s.weight_decay = -1;
    s.init.kind = CAI_INIT_ZEROS;
    return s;
}

cai_rank_view cai_rank_view_single(void) {
    cai_rank_view v;
    memset(&v, 0, sizeof v);
    v.tp_size = v.pp_size = v.ep_size = 1;
    v.pp_chunks = 1;
    return v;
}

/* ------------------------------------------------------------ table */

cai_status cai_registry_init(cai_registry_t **out, const cai_registry_options *opt) {
    CAI_CHECK_ARG(out != NULL, "cai_registry_init: out is NULL");
    *out = NULL;
    int n_layers = opt ? opt->n_layers : 0;
    CAI_CHECK_ARG(n_layers >= 0, "registry: n_layers must be >= 0, got %d", n_layers);
    cai_registry_t *reg = NULL;
    CAI_CALL(cai_calloc((void **)&reg, 1, sizeof *reg, "parameter registry"));
    reg->n_layers = n_layers;
    *out = reg;
    return CAI_OK;
}

void cai_registry_free(cai_registry_t *reg) {
    if (!reg) return;
    for (int i = 0; i < reg->count; i++) cai_free(reg->names[i]);
    cai_free(reg->names);
    cai_free(reg->params);
    cai_free(reg->table);
    cai_free(reg);
}

int cai_registry_count(const cai_registry_t *reg) { return reg ? reg->count : 0; }
int cai_registry_n_layers(const cai_registry_t *reg) { return reg ? reg->n_layers : 0; }
uint64_t cai_registry_global_numel(const cai_registry_t *reg) { return reg ? reg->global_numel : 0; }

const cai_param_info *cai_registry_param(const cai_registry_t *reg, int index) {
    if (!reg || index < 0 || index >= reg->count) return NULL;
    return &reg->params[index];
}

static size_t slot_of(const cai_registry_t *reg, const char *name) {
    size_t mask = (size_t)reg->table_cap - 1;
    size_t h = (size_t)cai_hash64(name) & mask;
    while (reg->table[h] >= 0 && strcmp(reg->names[reg->table[h]], name) != 0) h = (h + 1) & mask;
    return h;
}

int cai_registry_find(const cai_registry_t *reg, const char *name) {
    if (!reg || !name || reg->table_cap == 0) return -1;
    return reg->table[slot_of(reg, name)];
}

cai_status cai_registry_lookup(const cai_registry_t *reg, const char *name, int *index_out) {
    CAI_CHECK_ARG(reg && name && index_out, "cai_registry_lookup: NULL argument");
    int idx = cai_registry_find(reg, name);
    if (idx < 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "no parameter named '%s' in the registry (%d registered)", name,
                         reg->count);
    *index_out = idx;
    return CAI_OK;
}

int cai_registry_tie_members(const cai_registry_t *reg, int tie_group, int *indices, int max) {
    int n = 0;
    if (!reg || tie_group <= 0) return 0;
    for (int i = 0; i < reg->count; i++) {
        if (reg->params[i].spec.tie_group != tie_group) continue;
        if (indices && n < max) indices[n] = i;
        n++;
    }
    return n;
}

/* Canonical names: dot-separated segments of [a-z0-9_]; see docs/registry.md. */
static cai_status check_name(const char *name) {
    CAI_CHECK_ARG(name != NULL, "parameter name is NULL");
    size_t len = strlen(name);
    if (len == 0 || len >= CAI_PARAM_NAME_MAX)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter name '%s' has length %zu (must be 1..%d)", name, len,
                         CAI_PARAM_NAME_MAX - 1);
    int seg_len = 0;
    for (size_t i = 0; i <= len; i++) {
        char c = name[i];
        if (c == '.' || c == '\0') {
            if (seg_len == 0)
                return CAI_ERROR(CAI_ERR_INVALID_ARG,
                                 "parameter name '%s' has an empty segment at byte %zu "
                                 "(canonical names are dot-separated [a-z0-9_] segments)",
                                 name, i);
            seg_len = 0;
        } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') {
            seg_len++;
        } else {
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "parameter name '%s' has character '%c' at byte %zu "
                             "(canonical names are dot-separated [a-z0-9_] segments)",
                             name, c, i);
        }
    }
    return CAI_OK;
}

static cai_status grow(cai_registry_t *reg) {
    if (reg->count < reg->capacity && 2 * (reg->count + 1) <= reg->table_cap) return CAI_OK;
    if (reg->count >= reg->capacity) {
        int cap = reg->capacity ? 2 * reg->capacity : 64;
        cai_param_info *p = realloc(reg->params, (size_t)cap * sizeof *p);
        if (!p) return CAI_ERROR(CAI_ERR_NOMEM, "registry: cannot grow to %d parameters", cap);
        reg->params = p;
        char **n = realloc(reg->names, (size_t)cap * sizeof *n);
        if (!n) return CAI_ERROR(CAI_ERR_NOMEM, "registry: cannot grow to %d parameters", cap);
        reg->names = n;
        reg->capacity = cap;
    }
    if (2 * (reg->count + 1) > reg->table_cap) {
        int cap = reg->table_cap ? 2 * reg->table_cap : 128;
        int *t = malloc((size_t)cap * sizeof *t);
        if (!t) return CAI_ERROR(CAI_ERR_NOMEM, "registry: cannot grow the name table to %d slots", cap);
        for (int i = 0; i < cap; i++) t[i] = -1;
        cai_free(reg->table);
        reg->table = t;
        reg->table_cap = cap;
        for (int i = 0; i < reg->count; i++) reg->table[slot_of(reg, reg->names[i])] = i;
    }
    return CAI_OK;
}

static cai_status check_qkv(const char *name, int ndim, const uint64_t *shape, const cai_param_spec *s) {
    const cai_qkv_groups *q = &s->qkv;
    if (q->n_q_heads == 0 && q->n_kv_heads == 0 && q->head_dim == 0) return CAI_OK;
    if (q->n_q_heads <= 0 || q->n_kv_heads <= 0 || q->head_dim <= 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s': qkv grouping needs n_q_heads, n_kv_heads, head_dim > 0 "
                         "(got %d, %d, %d)",
                         name, q->n_q_heads, q->n_kv_heads, q->head_dim);
    if (s->tp_split_dim < 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': a fused QKV parameter needs tp_split_dim >= 0", name);
    if (s->vocab_parallel)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': a fused QKV parameter cannot be vocab_parallel", name);
    if (q->n_q_heads % q->n_kv_heads != 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': n_q_heads=%d is not a multiple of n_kv_heads=%d", name,
                         q->n_q_heads, q->n_kv_heads);
    uint64_t want = (uint64_t)(q->n_q_heads + 2 * q->n_kv_heads) * (uint64_t)q->head_dim;
    if (s->tp_split_dim < ndim && shape[s->tp_split_dim] != want)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s': dim %d has size %llu but fused QKV with %d q heads, %d kv heads of "
                         "size %d needs (%d + 2*%d)*%d = %llu",
                         name, s->tp_split_dim, (unsigned long long)shape[s->tp_split_dim], q->n_q_heads, q->n_kv_heads,
                         q->head_dim, q->n_q_heads, q->n_kv_heads, q->head_dim, (unsigned long long)want);
    return CAI_OK;
}

static cai_status check_spec(const cai_registry_t *reg, const char *name, int ndim, const uint64_t *shape,
                             cai_dtype dtype, const cai_param_spec *s) {
    if (ndim < 1 || ndim > CAI_PARAM_MAX_DIMS)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': ndim=%d (must be 1..%d)", name, ndim,
                         CAI_PARAM_MAX_DIMS);
    CAI_CHECK_ARG(shape != NULL, "parameter '%s': shape is NULL", name);
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0) return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': dim %d has size 0", name, d);
    if ((int)dtype < 0 || dtype >= CAI_DTYPE_COUNT)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': unknown dtype %d", name, (int)dtype);
    if (s->tp_split_dim < -1 || s->tp_split_dim >= ndim)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s': tp_split_dim=%d but the parameter has %d dims "
                         "(use -1 for replicated, 0..%d to split)",
                         name, s->tp_split_dim, ndim, ndim - 1);
    if (s->vocab_parallel && s->tp_split_dim < 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': vocab_parallel needs tp_split_dim >= 0", name);
    CAI_CALL(check_qkv(name, ndim, shape, s));
    if ((int)s->pp_place < 0 || s->pp_place >= CAI_PP_COUNT)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': unknown pp_place %d", name, (int)s->pp_place);
    if (s->layer < -1 || s->layer >= reg->n_layers)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s': layer %d out of range (registry has %d layers; -1 "
                         "for none)",
                         name, s->layer, reg->n_layers);
    if (s->pp_place == CAI_PP_LAYER && s->layer < 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s': no pipeline placement (set layer >= 0, or pp_place "
                         "CAI_PP_FIRST / CAI_PP_LAST)",
                         name);
    if (s->expert != -1 || s->n_experts != 0) {
        if (s->n_experts <= 0 || s->expert < 0 || s->expert >= s->n_experts)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "parameter '%s': expert %d of %d is out of range (dense: expert "
                             "-1, n_experts 0)",
                             name, s->expert, s->n_experts);
    }
    if (s->weight_decay < -1 || s->weight_decay > 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': weight_decay=%d (use 1, 0 or -1 for auto)", name,
                         s->weight_decay);
    if ((int)s->init.kind < 0 || s->init.kind >= CAI_INIT_COUNT)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': unknown init kind %d", name, (int)s->init.kind);
    if ((s->init.kind == CAI_INIT_NORMAL || s->init.kind == CAI_INIT_NORMAL_RESIDUAL) &&
        !(s->init.std > 0.0f && isfinite(s->init.std)))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': %s init needs a finite std > 0, got %g", name,
                         cai_init_kind_name(s->init.kind), (double)s->init.std);
    if (s->init.kind == CAI_INIT_NORMAL_RESIDUAL && reg->n_layers < 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s': normal_residual init scales by the layer count, but "
                         "the registry was created with n_layers=0",
                         name);
    if (s->tie_group < 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': tie_group=%d (0 for untied)", name, s->tie_group);
    return CAI_OK;
}

/* Tied copies are kept equal by an all-reduce of their gradients, so their
 * shards must line up element for element and start from the same values. */
static cai_status check_tie(const cai_param_info *p, const cai_param_info *primary) {
    const cai_param_spec *a = &p->spec, *b = &primary->spec;
    int same_shape = p->ndim == primary->ndim && p->dtype == primary->dtype;
    for (int d = 0; same_shape && d < p->ndim; d++) same_shape = p->shape[d] == primary->shape[d];
    if (!same_shape)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s' in tie group %d does not match the shape/dtype of '%s'",
                         p->name, a->tie_group, primary->name);
    if (a->tp_split_dim != b->tp_split_dim || a->vocab_parallel != b->vocab_parallel ||
        a->qkv.n_q_heads != b->qkv.n_q_heads || a->qkv.n_kv_heads != b->qkv.n_kv_heads ||
        a->qkv.head_dim != b->qkv.head_dim)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s' in tie group %d is sharded differently from '%s' "
                         "(tp_split_dim %d vs %d)",
                         p->name, a->tie_group, primary->name, a->tp_split_dim, b->tp_split_dim);
    if (a->init.kind != b->init.kind || a->init.std != b->init.std)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s' in tie group %d has init %s(%g) but '%s' has %s(%g)",
                         p->name, a->tie_group, cai_init_kind_name(a->init.kind), (double)a->init.std, primary->name,
                         cai_init_kind_name(b->init.kind), (double)b->init.std);
    if (a->expert != b->expert || a->n_experts != b->n_experts)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "parameter '%s' in tie group %d has a different expert placement "
                         "from '%s'",
                         p->name, a->tie_group, primary->name);
    return CAI_OK;
}

cai_status cai_registry_add(cai_registry_t *reg, const char *name, int ndim, const uint64_t *shape, cai_dtype dtype,
                            const cai_param_spec *spec, int *index_out) {
    CAI_CHECK_ARG(reg != NULL && spec != NULL, "cai_registry_add: registry or spec is NULL");
    CAI_CALL(check_name(name));
    if (cai_registry_find(reg, name) >= 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s' is already registered (index %d)", name,
                         cai_registry_find(reg, name));
    CAI_CALL(check_spec(reg, name, ndim, shape, dtype, spec));

    cai_param_info p;
    memset(&p, 0, sizeof p);
    p.ndim = ndim;
    p.numel = 1;
    for (int d = 0; d < CAI_PARAM_MAX_DIMS; d++) {
        p.shape[d] = d < ndim ? shape[d] : 1;
        if (p.numel > UINT64_MAX / p.shape[d])
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "parameter '%s': element count overflows 64 bits", name);
        p.numel *= p.shape[d];
    }
    p.dtype = dtype;
    p.spec = *spec;
    if (p.spec.weight_decay < 0) p.spec.weight_decay = ndim >= 2;
    p.name = name; /* for messages until the copy exists */
    p.tie_primary = reg->count;
    if (spec->tie_group > 0) {
        int members[1];
        if (cai_registry_tie_members(reg, spec->tie_group, members, 1) > 0) {
            CAI_CALL(check_tie(&p, &reg->params[members[0]]));
            p.tie_primary = members[0];
        }
    }

    CAI_CALL(grow(reg));
    size_t len = strlen(name) + 1;
    char *copy = NULL;
    CAI_CALL(cai_malloc((void **)&copy, len, "parameter name"));
    memcpy(copy, name, len);
    int idx = reg->count++;
    reg->names[idx] = copy;
    p.name = copy;
    p.index = idx;
    p.init_stream = cai_hash64(reg->names[p.tie_primary]);
    reg->params[idx] = p;
    reg->table[slot_of(reg, copy)] = idx;
    reg->global_numel += p.numel;
    if (index_out) *index_out = idx;
    return CAI_OK;
}

/* ------------------------------------------------------------ views */

static cai_status check_view_basic(const cai_registry_t *reg, const cai_rank_view *v) {
    CAI_CHECK_ARG(v != NULL, "rank view is NULL");
    const struct {
        const char *axis;
        int size, rank;
    } ax[3] = {{"tp", v->tp_size, v->tp_rank}, {"pp", v->pp_size, v->pp_rank}, {"ep", v->ep_size, v->ep_rank}};
    for (int i = 0; i < 3; i++)
        if (ax[i].size < 1 || ax[i].rank < 0 || ax[i].rank >= ax[i].size)
            return CAI_ERROR(CAI_ERR_LAYOUT,
                             "rank view: %s rank %d of size %d is impossible (need size >= 1 and "
                             "0 <= rank < size)",
                             ax[i].axis, ax[i].rank, ax[i].size);
    if (v->pp_chunks < 0)
        return CAI_ERROR(CAI_ERR_LAYOUT, "rank view: pp_chunks=%d (must be >= 1, or 0 for 1)", v->pp_chunks);
    const int chunks = v->pp_chunks > 0 ? v->pp_chunks : 1, V = v->pp_size * chunks;
    if (v->pp_vshape && chunks != 2)
        return CAI_ERROR(CAI_ERR_LAYOUT, "rank view: a V placement holds 2 chunks per rank, not pp_chunks=%d", chunks);
    if (v->layer_vstage && reg->n_layers > 0) {
        const int *s = v->layer_vstage;
        for (int l = 0; l < reg->n_layers; l++) {
            const int want_lo = l ? s[l - 1] : 0, want_hi = l ? s[l - 1] + 1 : 0;
            if (s[l] < want_lo || s[l] > want_hi || s[l] >= V)
                return CAI_ERROR(CAI_ERR_LAYOUT,
                                 "rank view: layer_vstage[%d]=%d; virtual stages run from 0 to pp x pp_chunks - 1 = "
                                 "%d in layer order, each layer in its predecessor's stage or the next (here %d or "
                                 "%d)",
                                 l, s[l], V - 1, want_lo, want_hi < V ? want_hi : want_lo);
        }
        if (s[reg->n_layers - 1] != V - 1)
            return CAI_ERROR(CAI_ERR_LAYOUT,
                             "rank view: layer_vstage fills virtual stages 0..%d of pp=%d x pp_chunks=%d = %d",
                             s[reg->n_layers - 1], v->pp_size, chunks, V);
    }
    return CAI_OK;
}

int cai_rank_view_vstage_rank(const cai_rank_view *view, int k) {
    const int pp = view->pp_size > 0 ? view->pp_size : 1;
    return view->pp_vshape && k >= pp ? 2 * pp - 1 - k : k % pp;
}

/* The view is already validated. */
static cai_status layer_vstage_of(const cai_registry_t *reg, const cai_rank_view *view, int layer, int *stage) {
    if (view->layer_vstage) {
        *stage = view->layer_vstage[layer];
        return CAI_OK;
    }
    int chunks = view->pp_chunks > 0 ? view->pp_chunks : 1;
    if (view->pp_size * chunks == 1) {
        *stage = 0;
        return CAI_OK;
    }
    int64_t n_virtual = (int64_t)view->pp_size * chunks, L = reg->n_layers;
    if (L < n_virtual)
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "%d layers cannot fill pp=%d x %d chunk(s) = %lld pipeline stages; use pp "
                         "* chunks <= %d",
                         reg->n_layers, view->pp_size, chunks, (long long)n_virtual, reg->n_layers);
    /* Virtual stage v holds layers [v*L/V, (v+1)*L/V): balanced, contiguous. */
    int64_t v = 0;
    while ((v + 1) * L / n_virtual <= layer) v++;
    *stage = (int)v;
    return CAI_OK;
}

static cai_status layer_stage_of(const cai_registry_t *reg, const cai_rank_view *view, int layer, int *stage) {
    int vs = 0;
    CAI_CALL(layer_vstage_of(reg, view, layer, &vs));
    *stage = cai_rank_view_vstage_rank(view, vs);
    return CAI_OK;
}

unsigned cai_registry_grad_axes(const cai_registry_t *reg, int index, const cai_rank_view *view, int seq_parallel) {
    const cai_param_info *info = cai_registry_param(reg, index);
    if (!info || !view || !seq_parallel || view->tp_size <= 1) return 0;
    return info->spec.seq_grad && info->spec.tp_split_dim < 0 ? 1u << CAI_AXIS_TP : 0;
}

cai_status cai_registry_layer_vstage(const cai_registry_t *reg, const cai_rank_view *view, int layer, int *vstage) {
    CAI_CHECK_ARG(reg && view && vstage, "cai_registry_layer_vstage: NULL argument");
    CAI_CHECK_ARG(layer >= 0 && layer < reg->n_layers, "layer %d out of range (model has %d layers)", layer,
                  reg->n_layers);
    CAI_CALL(check_view_basic(reg, view));
    CAI_CALL(layer_vstage_of(reg, view, layer, vstage));
    return CAI_OK;
}

cai_status cai_registry_layer_stage(const cai_registry_t *reg, const cai_rank_view *view, int layer, int *stage) {
    CAI_CHECK_ARG(stage, "cai_registry_layer_stage: NULL argument");
    int vs = 0;
    CAI_CALL(cai_registry_layer_vstage(reg, view, layer, &vs));
    *stage = cai_rank_view_vstage_rank(view, vs);
    return CAI_OK;
}

static cai_status param_stage(const cai_registry_t *reg, const cai_param_info *p, const cai_rank_view *v, int *stage) {
    if (v->pp_size == 1 && !v->layer_vstage) {
        *stage = 0;
        return CAI_OK;
    }
    int layer = p->spec.layer;
    if (p->spec.pp_place == CAI_PP_FIRST) layer = 0;
    if (p->spec.pp_place == CAI_PP_LAST) layer = reg->n_layers - 1;
    if (reg->n_layers == 0) { /* no blocks at all: embeddings first, head last */
        *stage = p->spec.pp_place == CAI_PP_LAST ? v->pp_size - 1 : 0;
        return CAI_OK;
    }
    cai_status st = layer_stage_of(reg, v, layer, stage);
    if (st != CAI_OK) {
        cai_error_push(__FILE__, __LINE__, __func__, p->name);
        return st;
    }
    return CAI_OK;
}

/* Divisors of n up to 1024, for "what would fit" messages. */
static void fitting_sizes(uint64_t n, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (uint64_t t = 1; t <= n && t <= 1024 && used + 8 < cap; t++)
        if (n % t == 0)
            used += (size_t)snprintf(buf + used, cap - used, "%s%llu", used ? " " : "", (unsigned long long)t);
}

static void set_full(cai_hyperslab *s, const cai_param_info *p) {
    memset(s, 0, sizeof *s);
    for (int d = 0; d < CAI_PARAM_MAX_DIMS; d++) s->count[d] = p->shape[d];
    s->replicas = 1;
}

/* TP slabs of one parameter; whole heads per fused QKV section. */
static cai_status tp_slabs(const cai_param_info *p, const cai_rank_view *v, cai_param_shard *out) {
    const cai_param_spec *s = &p->spec;
    int tp = v->tp_size, r = v->tp_rank, d = s->tp_split_dim;
    char fit[256];
    out->split_dim = d;
    out->n_slabs = 1;
    set_full(&out->slab[0], p);
    if (d < 0) {
        out->slab[0].replicas = tp;
        out->slab[0].replica_rank = r;
        return CAI_OK;
    }
    uint64_t n = p->shape[d];
    if (s->qkv.head_dim > 0) {
        const cai_qkv_groups *q = &s->qkv;
        if (q->n_q_heads % tp != 0) {
            fitting_sizes((uint64_t)q->n_q_heads, fit, sizeof fit);
            return CAI_ERROR(CAI_ERR_LAYOUT,
                             "parameter '%s': %d query heads do not split over tp=%d (tp that fit: "
                             "%s)",
                             p->name, q->n_q_heads, tp, fit);
        }
        if (q->n_kv_heads % tp != 0 && tp % q->n_kv_heads != 0)
            return CAI_ERROR(CAI_ERR_LAYOUT,
                             "parameter '%s': %d kv heads neither split over tp=%d nor replicate "
                             "evenly (tp must divide or be a multiple of %d)",
                             p->name, q->n_kv_heads, tp, q->n_kv_heads);
        uint64_t hd = (uint64_t)q->head_dim, nq = (uint64_t)q->n_q_heads, nkv = (uint64_t)q->n_kv_heads;
        uint64_t q_local = nq / (uint64_t)tp;
        uint64_t kv_local, kv_first;
        int kv_replicas = 1, kv_replica_rank = 0;
        if (q->n_kv_heads >= tp) {
            kv_local = nkv / (uint64_t)tp;
            kv_first = (uint64_t)r * kv_local;
        } else { /* tp > kv heads: each kv head serves tp/nkv ranks, the ones holding its query group */
            kv_replicas = tp / q->n_kv_heads;
            kv_local = 1;
            kv_first = (uint64_t)(r / kv_replicas);
            kv_replica_rank = r % kv_replicas;
        }
        uint64_t starts[3] = {(uint64_t)r * q_local * hd, (nq + kv_first) * hd, (nq + nkv + kv_first) * hd};
        uint64_t counts[3] = {q_local * hd, kv_local * hd, kv_local * hd};
        out->n_slabs = 3;
        for (int i = 0; i < 3; i++) {
            set_full(&out->slab[i], p);
            out->slab[i].offset[d] = starts[i];
            out->slab[i].count[d] = counts[i];
            out->slab[i].replicas = i == 0 ? 1 : kv_replicas;
            out->slab[i].replica_rank = i == 0 ? 0 : kv_replica_rank;
        }
        return CAI_OK;
    }
    if (s->vocab_parallel) {
        /* Balanced ranges: sizes differ by at most one, none empty. */
        if (n < (uint64_t)tp)
            return CAI_ERROR(CAI_ERR_LAYOUT, "parameter '%s': vocabulary dim %d of size %llu cannot split over tp=%d",
                             p->name, d, (unsigned long long)n, tp);
        uint64_t lo = n * (uint64_t)r / (uint64_t)tp, hi = n * (uint64_t)(r + 1) / (uint64_t)tp;
        out->slab[0].offset[d] = lo;
        out->slab[0].count[d] = hi - lo;
        return CAI_OK;
    }
    if (n % (uint64_t)tp != 0) {
        fitting_sizes(n, fit, sizeof fit);
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "parameter '%s': dim %d of size %llu does not split over tp=%d (tp that "
                         "fit: %s)",
                         p->name, d, (unsigned long long)n, tp, fit);
    }
    out->slab[0].offset[d] = n / (uint64_t)tp * (uint64_t)r;
    out->slab[0].count[d] = n / (uint64_t)tp;
    return CAI_OK;
}

static cai_status shard_of(const cai_registry_t *reg, const cai_param_info *p, const cai_rank_view *v,
                           cai_param_shard *out) {
    memset(out, 0, sizeof *out);
    out->ndim = p->ndim;
    for (int d = 0; d < CAI_PARAM_MAX_DIMS; d++) out->global_shape[d] = p->shape[d];
    out->split_dim = -1;
    out->ep_owner = -1;
    CAI_CALL(param_stage(reg, p, v, &out->pp_stage));
    if (p->spec.n_experts > 0) {
        if (p->spec.n_experts % v->ep_size != 0)
            return CAI_ERROR(CAI_ERR_LAYOUT, "parameter '%s': %d experts do not split over ep=%d (ep must divide %d)",
                             p->name, p->spec.n_experts, v->ep_size, p->spec.n_experts);
        out->ep_owner = (int)((int64_t)p->spec.expert * v->ep_size / p->spec.n_experts);
    }
    cai_param_shard tp_part;
    memset(&tp_part, 0, sizeof tp_part);
    /* Computed even when not held so layout errors surface on every rank alike. */
    CAI_CALL(tp_slabs(p, v, &tp_part));
    out->held = out->pp_stage == v->pp_rank && (out->ep_owner < 0 || out->ep_owner == v->ep_rank);
    if (!out->held) return CAI_OK;
    out->split_dim = tp_part.split_dim;
    out->n_slabs = tp_part.n_slabs;
    memcpy(out->slab, tp_part.slab, sizeof out->slab);
    for (int d = 0; d < CAI_PARAM_MAX_DIMS; d++) out->local_shape[d] = out->slab[0].count[d];
    if (out->split_dim >= 0)
        for (int i = 1; i < out->n_slabs; i++) out->local_shape[out->split_dim] += out->slab[i].count[out->split_dim];
    out->local_numel = 1;
    for (int d = 0; d < CAI_PARAM_MAX_DIMS; d++) out->local_numel *= out->local_shape[d];
    return CAI_OK;
}

cai_status cai_registry_shard(const cai_registry_t *reg, int index, const cai_rank_view *view, cai_param_shard *out) {
    CAI_CHECK_ARG(reg && out, "cai_registry_shard: NULL argument");
    CAI_CHECK_ARG(index >= 0 && index < reg->count, "parameter index %d out of range (registry has %d)", index,
                  reg->count);
    CAI_CALL(check_view_basic(reg, view));
    CAI_CALL(shard_of(reg, &reg->params[index], view, out));
    return CAI_OK;
}

cai_status cai_registry_check_view(const cai_registry_t *reg, const cai_rank_view *view) {
    CAI_CHECK_ARG(reg != NULL, "cai_registry_check_view: registry is NULL");
    CAI_CALL(check_view_basic(reg, view));
    if (view->pp_size > 1 && !view->layer_vstage && reg->n_layers > 0) {
        int stage;
        CAI_CALL(layer_stage_of(reg, view, 0, &stage));
    }
    cai_param_shard sh;
    for (int i = 0; i < reg->count; i++) CAI_CALL(shard_of(reg, &reg->params[i], view, &sh));
    return CAI_OK;
}

cai_status cai_registry_local_layout(const cai_registry_t *reg, const cai_rank_view *view, size_t align_elems,
                                     size_t *offsets, size_t *total_elems) {
    CAI_CHECK_ARG(reg && total_elems, "cai_registry_local_layout: NULL argument");
    CAI_CALL(check_view_basic(reg, view));
    size_t align = align_elems ? align_elems : 1, pos = 0;
    for (int i = 0; i < reg->count; i++) {
        cai_param_shard sh;
        CAI_CALL(shard_of(reg, &reg->params[i], view, &sh));
        if (!sh.held) {
            if (offsets) offsets[i] = SIZE_MAX;
            continue;
        }
        pos = (pos + align - 1) / align * align;
        if (offsets) offsets[i] = pos;
        pos += (size_t)sh.local_numel;
    }
    *total_elems = (pos + align - 1) / align * align;
    return CAI_OK;
}
