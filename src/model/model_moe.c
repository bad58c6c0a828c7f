/* The MoE blocks of a model: which layers have one, their parameter views,
 * their activations (one set per activation set of the model), the block's
 * MLP half (norm, MoE sublayer, residual) forward and backward, and the
 * router statistics its training forwards accumulate. model.c calls these;
 * the sublayer itself is moe.c's. docs/moe.md. */
#include "cai_config.h"
#include "model_internal.h"
#include "colossal/moe.h"

#include <stdio.h>
#include <string.h>

struct cai_model_moe {
    cai_device_t *dev;
    cai_moe_ctx cx;
    int n_local;           /* the model's local layers */
    int *is_moe;           /* per local layer */
    int n_moe;             /* local MoE layers */
    int *moe_index;        /* local layer -> index among the local MoE layers, -1 */
    int El;                /* experts held here */
    cai_moe_params *w, *g; /* per local layer (unused entries zero) */
    cai_moe_mlp *we, *ge;  /* [n_local][El] */
    int n_sets;
    cai_moe_acts *acts; /* per activation set */
    cai_arena_t arena;
    /* accumulated by training forwards since the last cai_model_moe_stats_take */
    int64_t *loads; /* [n_moe][E] */
    int64_t *tokens, *dropped;
    double *aux, *z;
    int64_t *forwards;
};

int cai_model_moe_layer(const cai_model_config *cfg, int layer) {
    if (!cfg || cfg->moe.n_experts <= 0 || layer < 0) return 0;
    const int every = cfg->moe_every > 0 ? cfg->moe_every : 1;
    return layer % every == 0;
}

cai_status cai_model_moe_check(const cai_model_config *c, const cai_rank_view *view, int seq_parallel,
                               int split_backward, const cai_moe_exchange *ex) {
    const int ep = view->ep_size > 0 ? view->ep_size : 1;
    if (c->moe.n_experts <= 0) {
        if (ep > 1)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "model: mesh.ep=%d splits experts, but the model has none (set moe.n_experts, or ep=1)",
                             ep);
        return CAI_OK;
    }
    CAI_CALL(cai_moe_config_check(&c->moe, c->d_model, ep));
    if (c->family != CAI_MODEL_LLAMA)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "model: MoE blocks have SwiGLU experts without biases (model.family=llama); family %s has "
                         "none",
                         cai_model_family_name(c->family));
    if (seq_parallel && view->tp_size > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "model: MoE blocks under split-gather sequence parallelism are not supported (sp_mode=off)");
    if (split_backward)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "model: MoE blocks have no split backward (zero-bubble schedules); use gpipe, 1f1b or "
                         "interleaved");
    if (ep > 1 && (!ex || ex->ep_size != ep || ex->ep_rank != view->ep_rank))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "model: ep=%d needs the ep exchange (cai_model_options.moe_exchange, "
                         "cai_moe_ep_exchange_init) of ep rank %d",
                         ep, view->ep_rank);
    return CAI_OK;
}

void cai_model_moe_free(cai_model_moe *mm) {
    if (!mm) return;
    for (int k = 0; mm->acts && k < mm->n_sets; k++) cai_moe_acts_free(&mm->acts[k]);
    if (mm->arena.base) cai_device_arena_free(mm->dev, &mm->arena);
    cai_free(mm->is_moe);
    cai_free(mm->moe_index);
    cai_free(mm->w);
    cai_free(mm->g);
    cai_free(mm->we);
    cai_free(mm->ge);
    cai_free(mm->acts);
    cai_free(mm->loads);
    cai_free(mm->tokens);
    cai_free(mm->dropped);
    cai_free(mm->aux);
    cai_free(mm->z);
    cai_free(mm->forwards);
    cai_free(mm);
}

cai_status cai_model_moe_create(cai_model_moe **out, cai_device_t *dev, const cai_model_config *cfg,
                                const cai_rank_view *view, const cai_moe_exchange *ex, int64_t n_tokens, int n_local,
                                const int *local_layer, int n_sets) {
    *out = NULL;
    if (cfg->moe.n_experts <= 0) return CAI_OK;
    cai_model_moe *mm = NULL;
    cai_status st = CAI_OK;
    CAI_CALL(cai_calloc((void **)&mm, 1, sizeof *mm, "model moe"));
    mm->dev = dev;
    mm->n_local = n_local;
    mm->n_sets = n_sets;
    const int E = cfg->moe.n_experts;
    mm->El = E / (view->ep_size > 0 ? view->ep_size : 1);
    CAI_CALL_GOTO(cai_moe_ctx_init(&mm->cx, dev, &cfg->moe, n_tokens, cfg->d_model, cfg->act_dtype,
                                   view->ep_size > 1 ? ex : NULL),
                  st, fail);
    const size_t nl = (size_t)(n_local > 0 ? n_local : 1);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->is_moe, nl, sizeof *mm->is_moe, "moe layers"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->moe_index, nl, sizeof *mm->moe_index, "moe layers"), st, fail);
    for (int i = 0; i < n_local; i++) {
        mm->is_moe[i] = cai_model_moe_layer(cfg, local_layer[i]);
        mm->moe_index[i] = mm->is_moe[i] ? mm->n_moe++ : -1;
    }
    const size_t nm = (size_t)(mm->n_moe > 0 ? mm->n_moe : 1);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->w, nl, sizeof *mm->w, "moe weights"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->g, nl, sizeof *mm->g, "moe grads"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->we, nl * (size_t)mm->El, sizeof *mm->we, "moe expert weights"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->ge, nl * (size_t)mm->El, sizeof *mm->ge, "moe expert grads"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->loads, nm * (size_t)E, sizeof *mm->loads, "moe loads"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->tokens, nm, sizeof *mm->tokens, "moe stats"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->dropped, nm, sizeof *mm->dropped, "moe stats"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->aux, nm, sizeof *mm->aux, "moe stats"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->z, nm, sizeof *mm->z, "moe stats"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->forwards, nm, sizeof *mm->forwards, "moe stats"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&mm->acts, (size_t)n_sets, sizeof *mm->acts, "moe activations"), st, fail);
    CAI_CALL_GOTO(cai_model_moe_restore_acts(mm), st, fail);
    *out = mm;
    return CAI_OK;
fail:
    cai_model_moe_free(mm);
    return st;
}

void cai_model_moe_release_acts(cai_model_moe *mm) {
    if (!mm || !mm->arena.base) return;
    for (int k = 0; k < mm->n_sets; k++) cai_moe_acts_free(&mm->acts[k]);
    cai_device_arena_free(mm->dev, &mm->arena);
}

cai_status cai_model_moe_restore_acts(cai_model_moe *mm) {
    if (!mm || mm->arena.base) return CAI_OK;
    const size_t per = cai_moe_acts_bytes(&mm->cx);
    CAI_CALL(cai_device_arena_init(mm->dev, &mm->arena, per * (size_t)mm->n_sets + 64, "moe activations"));
    for (int k = 0; k < mm->n_sets; k++) {
        cai_status st = cai_moe_acts_carve(&mm->cx, &mm->arena, &mm->acts[k]);
        if (st != CAI_OK) {
            cai_model_moe_release_acts(mm);
            return st;
        }
    }
    return CAI_OK;
}

int cai_model_moe_is_layer(const cai_model_moe *mm, int li) {
    return mm && li >= 0 && li < mm->n_local && mm->is_moe[li];
}

size_t cai_model_moe_bytes(const cai_model_moe *mm) { return mm ? mm->arena.capacity : 0; }

cai_status cai_model_moe_bind(cai_model_moe *mm, int li, int layer, cai_model_moe_bind_fn bind, void *ctx) {
    static const char *const parts[3] = {"fc", "up", "proj"};
    char name[CAI_PARAM_NAME_MAX];
    cai_moe_params *w = &mm->w[li], *g = &mm->g[li];
    w->experts = mm->we + (size_t)li * mm->El;
    g->experts = mm->ge + (size_t)li * mm->El;
    snprintf(name, sizeof name, "h.%d.moe.router.weight", layer);
    CAI_CALL(bind(ctx, name, &w->router, &g->router));
    for (int i = 0; i <= mm->El; i++) {
        const int shared = i == mm->El;
        if (shared && !mm->cx.cfg.n_shared) break;
        cai_moe_mlp *mw = shared ? &w->shared : &w->experts[i], *mg = shared ? &g->shared : &g->experts[i];
        cai_tensor *tw[3] = {&mw->w1, &mw->w3, &mw->w2}, *tg[3] = {&mg->w1, &mg->w3, &mg->w2};
        for (int p = 0; p < 3; p++) {
            if (shared) snprintf(name, sizeof name, "h.%d.moe.shared.%s.weight", layer, parts[p]);
            else snprintf(name, sizeof name, "h.%d.moe.experts.%d.%s.weight", layer, mm->cx.expert_begin + i, parts[p]);
            CAI_CALL(bind(ctx, name, tw[p], tg[p]));
        }
    }
    return CAI_OK;
}

/* out = inp + moe(rmsnorm(inp)); the norm output and statistics go to a's
 * ln2 buffers, the MoE output through s->dln (free between blocks). */
cai_status cai_model_moe_block_fwd(cai_model_moe *mm, const cai_layer_ctx *lcx, const cai_layer_dims *d, int li,
                                   int set, const cai_block_params *p, cai_block_acts *a, cai_block_scratch *s,
                                   const cai_tensor *inp, cai_tensor *out, int train) {
    cai_device_t *dev = lcx->dev;
    cai_moe_acts *ma = &mm->acts[set];
    CAI_CALL(dev->ops->rmsnorm_fwd(dev, &a->ln2, &a->ln2_rstd, inp, &p->ln2_w, d->norm_eps));
    CAI_CALL(cai_moe_fwd(&mm->cx, &mm->w[li], ma, &a->ln2, &s->dln));
    CAI_CALL(dev->ops->add(dev, out, &s->dln, inp));
    if (!train) return CAI_OK;
    const int k = mm->moe_index[li], E = mm->cx.cfg.n_experts;
    const int64_t *load = ma->load.data;
    for (int e = 0; e < E; e++) mm->loads[(size_t)k * E + e] += load[e];
    mm->tokens[k] += mm->cx.N;
    mm->dropped[k] += ma->dropped;
    mm->aux[k] += ma->aux_raw;
    mm->z[k] += ma->z_raw;
    mm->forwards[k]++;
    return CAI_OK;
}

/* d_stream holds d(out) on entry (= d(moe output)) and d(inp) on exit. */
cai_status cai_model_moe_block_bwd(cai_model_moe *mm, const cai_layer_ctx *lcx, const cai_layer_dims *d, int li,
                                   int set, const cai_block_params *p, cai_block_params *g, const cai_block_acts *a,
                                   cai_block_scratch *s, const cai_tensor *inp, cai_tensor *d_stream,
                                   float loss_scale) {
    cai_device_t *dev = lcx->dev;
    cai_moe_acts *ma = &mm->acts[set];
    CAI_CALL(cai_moe_bwd(&mm->cx, &mm->w[li], &mm->g[li], ma, &a->ln2, d_stream, &s->dln, loss_scale));
    return dev->ops->rmsnorm_bwd(dev, d_stream, g->ln2_w.data ? &g->ln2_w : NULL, &s->dln, inp, &p->ln2_w, &a->ln2_rstd,
                                 1);
}

double cai_model_moe_loss(const cai_model_moe *mm, int first_set, int n_sets) {
    double sum = 0.0;
    for (int k = first_set; mm && k < first_set + n_sets && k < mm->n_sets; k++)
        sum += cai_moe_loss(&mm->cx, &mm->acts[k]);
    return sum;
}

int cai_model_moe_local_layers(const cai_model_moe *mm) { return mm ? mm->n_moe : 0; }

int cai_model_moe_layers(const cai_model_t *m) { return m ? cai_model_moe_local_layers(cai_model_moe_of(m)) : 0; }

cai_status cai_model_moe_stats_take(cai_model_t *m, cai_moe_stats *local, int64_t *loads, int max_layers,
                                    int *n_layers) {
    CAI_CHECK_ARG(m && local && loads && n_layers, "cai_model_moe_stats_take: NULL argument");
    cai_model_moe *mm = cai_model_moe_of(m);
    *n_layers = mm ? mm->n_moe : 0;
    if (!mm) return CAI_OK;
    CAI_CHECK_ARG(max_layers >= mm->n_moe, "cai_model_moe_stats: %d MoE layers here, room for %d", mm->n_moe,
                  max_layers);
    const int E = mm->cx.cfg.n_experts;
    for (int k = 0; k < mm->n_moe; k++) {
        const int64_t f = mm->forwards[k] > 0 ? mm->forwards[k] : 1;
        memcpy(loads + (size_t)k * E, mm->loads + (size_t)k * E, (size_t)E * sizeof *loads);
        cai_moe_stats_from_load(loads + (size_t)k * E, E, mm->tokens[k], mm->dropped[k], &local[k]);
        local[k].aux_raw = mm->aux[k] / (double)f;
        local[k].z_raw = mm->z[k] / (double)f;
        local[k].aux_loss = mm->cx.cfg.aux_coef * local[k].aux_raw;
        local[k].z_loss = mm->cx.cfg.z_coef * local[k].z_raw;
        memset(mm->loads + (size_t)k * E, 0, (size_t)E * sizeof *loads);
        mm->tokens[k] = mm->dropped[k] = mm->forwards[k] = 0;
        mm->aux[k] = mm->z[k] = 0.0;
    }
    return CAI_OK;
}
