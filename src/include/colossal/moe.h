/* Mixture of experts: the MoE sublayer (src/model/moe.c, model layer) and
 * its expert parallelism over the ep axis (src/parallel/moe_dispatch.c,
 * parallel layer). See docs/moe.md.
 *
 * The sublayer maps the norm output x [N, C] (N = B*T local tokens) to
 * y [N, C]: a router (linear [E, C], then softmax / top-k-then-softmax /
 * sigmoid, top-k), SwiGLU experts (Mixtral's w1 gate, w3 up, w2 down, the
 * registry's fc, up, proj), optional always-on shared experts (DeepSeek),
 * the load-balancing auxiliary loss (Switch / Mixtral form) and the router
 * z-loss. Routing is dropless by default; capacity-factor routing drops the
 * assignments past an expert's capacity in token order. Tokens are grouped
 * by expert so each expert runs one GEMM over its tokens.
 *
 * Expert parallelism: expert e of E lives on ep rank e*ep/E (the
 * registry's rule); the layer sends each expert's tokens to its owner and
 * back through a cai_moe_exchange (counts first, then rows, both
 * all-to-all over ep), which the parallel layer provides. The model layer
 * calls only the function pointers, so it never calls upward. */
#ifndef COLOSSAL_MOE_H
#define COLOSSAL_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/cluster.h"
#include "colossal/model.h"
#include "colossal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * The MoE sublayer (src/model/moe.c). Nothing here is collective unless
 * it is given an exchange with ep_size > 1 (then fwd and bwd are
 * collective over the ep axis: every ep rank calls them in the same order).
 * ====================================================================== */

/* cai_moe_router, cai_moe_routing and cai_moe_config are in colossal/model.h
 * (the model configuration holds one). */

/* 8 experts, top-2, softmax with renormalisation (Mixtral), ffn 0 (must be
 * set), no shared experts, dropless, aux 0.01, z 0.001 (ST-MoE). */
cai_moe_config cai_moe_config_default(void);
const char *cai_moe_router_name(cai_moe_router r); /* "softmax", "topk_softmax", "sigmoid" */
cai_status cai_moe_router_parse(const char *name, cai_moe_router *out);
const char *cai_moe_routing_name(cai_moe_routing r); /* "dropless", "capacity" */
cai_status cai_moe_routing_parse(const char *name, cai_moe_routing *out);
/* Every field against d_model and the ep size: experts not divisible by
 * ep, top_k out of [1, E], ffn <= 0, capacity factor <= 0 with capacity
 * routing, negative coefficients, unknown kinds. The error names the field
 * (moe.<field>) and what would fit. Pure. */
cai_status cai_moe_config_check(const cai_moe_config *cfg, int64_t d_model, int ep_size);

/* Moves rows between the ep ranks (the parallel layer's
 * cai_moe_ep_exchange_init fills one; NULL or ep_size 1 means one rank).
 * counts: all-to-all of `per_rank` int64 values (send: per_rank values for
 * each ep rank in rank order; recv the same from each). rows: all-to-all-v
 * of rows of the tensors' last dimension: send_rows[r] consecutive rows go
 * to rank r, recv_rows[s] arrive from rank s, in rank order (send and recv
 * contiguous, at least that many rows). Both collective over ep. */
typedef struct cai_moe_exchange {
    void *ctx;
    int ep_size, ep_rank;
    cai_status (*counts)(void *ctx, const int64_t *send, int64_t *recv, int64_t per_rank);
    cai_status (*rows)(void *ctx, const cai_tensor *send, const int64_t *send_rows, cai_tensor *recv,
                       const int64_t *recv_rows);
} cai_moe_exchange;

/* Where one MoE sublayer runs and on what: validated once by
 * cai_moe_ctx_init (before anything is allocated). N tokens per ep rank,
 * the same on every ep rank. */
typedef struct {
    cai_device_t *dev;
    cai_moe_config cfg;
    int64_t N, C;
    int ep_size, ep_rank;
    int n_local;                /* experts held here: E / ep */
    int expert_begin;           /* global index of local expert 0 */
    int64_t capacity;           /* per expert (CAI_MOE_CAPACITY), else N * top_k */
    int64_t send_max;           /* rows this rank sends at most: N * top_k */
    int64_t recv_max;           /* rows this rank's experts receive at most */
    const cai_moe_exchange *ex; /* NULL at ep = 1 */
    cai_dtype dtype;            /* activations (F32, BF16, F16) */
} cai_moe_ctx;

/* dev: any backend. The routing runs on the device (ops moe_route,
 * moe_assign, moe_router_sums, moe_router_bwd); each forward copies the
 * experts' counts and the losses' sums to the host (the grouped products
 * take their row counts there), the backward copies nothing. The rows move
 * and combine on the device (ops moe_permute, moe_combine_*). Activations
 * in act_dtype; the weights' dtype is the
 * model's. ex NULL means ep = 1; ep > 1 runs on the host in f32 (its
 * exchange moves host rows), other placements are refused with
 * CAI_ERR_UNSUPPORTED. */
cai_status cai_moe_ctx_init(cai_moe_ctx *cx, cai_device_t *dev, const cai_moe_config *cfg, int64_t n_tokens,
                            int64_t d_model, cai_dtype act_dtype, const cai_moe_exchange *ex);

/* SwiGLU MLP weights, [out, in]: w1 gate [F, C], w3 up [F, C], w2 down [C, F]. */
typedef struct {
    cai_tensor w1, w3, w2;
} cai_moe_mlp;

/* The sublayer's weights (gradients use the same struct). experts points
 * to n_local entries, local expert i being global expert expert_begin + i;
 * shared has data NULL when n_shared = 0. */
typedef struct {
    cai_tensor router; /* [E, C] */
    cai_moe_mlp shared;
    cai_moe_mlp *experts;
} cai_moe_params;

/* What the forward keeps for the backward, plus the backward's scratch.
 * Everything lives on the device except the counts (load .. ecnt, the
 * host copies counts_h and sums_h) and wlist. With f32 activations the
 * router's product is its logits (router_out and logits one buffer, d_router
 * and dlogits too); on the host device counts and counts_h are one buffer,
 * sums and sums_h too. */
typedef struct {
    cai_tensor router_out, d_router; /* [N,E] the router's product and its gradient (activation dtype) */
    cai_arena_t host;                /* the counts' memory off the host device */
    cai_tensor *wlist;               /* host: 6 n_local weight views, the grouped products' lists */
    cai_tensor logits, probs, lse;   /* [N,E] F32 router logits, softmax (sigmoid router: sigmoid); [N] */
    cai_tensor sel, wts, pos;        /* [N,k] I32 expert, F32 weight, I32 row in the send buffer (-1 dropped) */
    cai_tensor counts, sums;         /* [2E] I64 moe_assign's load then kept; [E+1] F64 moe_router_sums' */
    cai_tensor load_d, kept_d;       /* [E] I64 views of counts */
    cai_tensor counts_h, sums_h;     /* their host copies */
    cai_tensor load, send_cnt; /* host [E] I64 (views of counts_h): assignments per expert before / after dropping */
    cai_tensor recv_cnt;       /* [ep * n_local] I64: rows from source s for local expert e at s*n_local+e */
    cai_tensor rank_send, rank_recv; /* [ep] I64: rows to / from each ep rank */
    cai_tensor ecnt;                 /* [n_local] I64: rows of each local expert */
    cai_tensor send_x, send_y;       /* [send_max, C]: inputs grouped by expert; outputs back in that order */
    cai_tensor recv_x, recv_y;       /* [recv_max, C] ep > 1: rows grouped by local expert (else unused) */
    cai_tensor src;                  /* [recv_max, C] ep > 1: rows grouped by source rank (exchange side) */
    cai_tensor gate, up, act;        /* [recv_max or send_max, F]: expert hidden activations */
    cai_tensor sgate, sup, sact;     /* [N, n_shared * F] shared experts */
    /* backward scratch */
    cai_tensor d_send, d_recv;      /* [send_max, C], [recv_max, C] */
    cai_tensor dact, dgate, dup;    /* expert hidden gradients */
    cai_tensor sdact, sdgate, sdup; /* shared */
    cai_tensor dlogits, dw;         /* [N,E], [N,k] */
    int64_t dropped;                /* assignments dropped by the last forward */
    double aux_raw, z_raw;          /* E sum_e (c_e/N) P_e and mean_t lse_t^2 of the last forward */
} cai_moe_acts;

/* Device bytes of one set (on the host device: all of it). The carve takes
 * the device part from arena and allocates the routing state in host
 * memory when the device is not the host; cai_moe_acts_free releases that. */
size_t cai_moe_acts_bytes(const cai_moe_ctx *cx);
cai_status cai_moe_acts_carve(const cai_moe_ctx *cx, cai_arena_t *arena, cai_moe_acts *a);
void cai_moe_acts_free(cai_moe_acts *a);

/* y [N, C] = moe(x) (overwritten; no norm, no residual: the model's
 * sublayer adds those). Collective over ep when ep > 1. */
cai_status cai_moe_fwd(const cai_moe_ctx *cx, const cai_moe_params *p, cai_moe_acts *a, const cai_tensor *x,
                       cai_tensor *y);
/* Backward of <dy, y> + loss_scale * (aux_coef * aux + z_coef * z): dx
 * [N,C] overwritten, parameter gradients in g accumulated (+=). Reads what
 * the last forward kept in a. Collective over ep when ep > 1. */
cai_status cai_moe_bwd(const cai_moe_ctx *cx, const cai_moe_params *p, cai_moe_params *g, cai_moe_acts *a,
                       const cai_tensor *x, const cai_tensor *dy, cai_tensor *dx, float loss_scale);
/* What the forward adds to the objective: aux_coef * aux + z_coef * z. */
double cai_moe_loss(const cai_moe_ctx *cx, const cai_moe_acts *a);

/* Router statistics of one forward (or summed over layers / ranks): the
 * assignments per expert before dropping, the dropped ones and the
 * losses. */
typedef struct {
    int n_experts;
    int64_t tokens, assignments, dropped;
    int64_t load_min, load_max; /* assignments per expert */
    double load_cv;             /* population std / mean of the assignments per expert */
    double aux_raw, z_raw;      /* as cai_moe_acts; aux_loss = aux_coef * aux_raw, z_loss likewise */
    double aux_loss, z_loss;
} cai_moe_stats;

/* Summary from per-expert loads (what cai_moe_stats_reduce sums). */
void cai_moe_stats_from_load(const int64_t *load, int E, int64_t tokens, int64_t dropped, cai_moe_stats *st);
/* The last forward's statistics on this rank. */
void cai_moe_stats_get(const cai_moe_ctx *cx, const cai_moe_acts *a, cai_moe_stats *st);

/* ---- in a model (src/model/model_moe.c): cai_model_config.moe and
 * moe_every choose the blocks whose MLP is this sublayer. */

/* Whether global layer `layer` of the (resolved) config has an MoE MLP. */
int cai_model_moe_layer(const cai_model_config *cfg, int layer);
/* MoE layers this rank runs (its pipeline stage's). */
int cai_model_moe_layers(const cai_model_t *m);
/* The router statistics the model's training forwards (cai_model_forward_train)
 * accumulated since the last call, one entry per local MoE layer in layer
 * order: loads [n][E] (assignments per expert summed over the forwards),
 * local[i] their summary with tokens and drops summed and the raw losses
 * averaged over the forwards; then they restart from zero. Give the result
 * to cai_moe_stats_reduce over dp for the global batch. Not collective. */
cai_status cai_model_moe_stats_take(cai_model_t *m, cai_moe_stats *local, int64_t *loads, int max_layers,
                                    int *n_layers);

/* Parameters of MoE layer `layer` in the registry, in this order:
 * h.L.moe.router.weight [E, C] (replicated), for e < E
 * h.L.moe.experts.e.{fc,up,proj}.weight ([F,C] column-, [F,C] column-,
 * [C,F] row-parallel; expert e of E), then, with shared experts,
 * h.L.moe.shared.{fc,up,proj}.weight with hidden n_shared * F. fc is
 * Mixtral's w1 (gate), up w3, proj w2. Init N(0, std), proj scaled by
 * 1/sqrt(2 n_layers) as the dense MLP's. */
cai_status cai_moe_register_params(cai_registry_t *reg, int layer, const cai_moe_config *cfg, int64_t d_model,
                                   float init_std);
/* Views of layer `layer`'s local MoE parameters in a flat buffer laid out
 * by cai_registry_local_layout(reg, view, align_elems): experts must have
 * room for E / view->ep_size entries. */
cai_status cai_moe_params_view(const cai_registry_t *reg, const cai_rank_view *view, size_t align_elems, int layer,
                               const cai_moe_config *cfg, cai_device_t *dev, float *flat, cai_moe_params *p,
                               cai_moe_mlp *experts);

/* ======================================================================
 * Expert parallelism (src/parallel/moe_dispatch.c)
 * ====================================================================== */

/* An exchange over the ep axis of `mesh` (counts through cai_all_to_all,
 * rows through cai_all_to_allv, F32 rows); ex->ctx is owned by it.
 * Not collective. */
cai_status cai_moe_ep_exchange_init(cai_moe_exchange *ex, cai_mesh_t *mesh);
void cai_moe_ep_exchange_free(cai_moe_exchange *ex);

/* Gradient synchronisation of a model with experts, over the flat local
 * gradient buffer (cai_registry_local_layout(reg, view, align_elems)):
 * dense parameters are averaged over dp (as cai_dp_allreduce_grads), an
 * expert's gradient, which already holds every ep rank's tokens, is summed
 * over edp (its replicas) and divided by dp. Planned once (runs of
 * contiguous parameters of one kind), run every step. */
typedef struct cai_moe_grad_sync cai_moe_grad_sync_t;
cai_status cai_moe_grad_sync_create(cai_moe_grad_sync_t **out, cai_mesh_t *mesh, const cai_registry_t *reg,
                                    const cai_rank_view *view, size_t align_elems);
/* Collective over dp (dense runs) and edp (expert runs), in registration
 * order on every rank. grads: the flat F32 buffer on dev. */
cai_status cai_moe_grad_sync_run(cai_moe_grad_sync_t *gs, cai_device_t *dev, float *grads);
void cai_moe_grad_sync_free(cai_moe_grad_sync_t *gs);

/* Sums n_layers layers' loads ([n_layers][E]), dropped counts, tokens and
 * raw losses over `axis` (dp: the whole batch) and summarises each layer
 * into st[n_layers] (losses averaged over the axis). Collective over axis. */
cai_status cai_moe_stats_reduce(cai_mesh_t *mesh, cai_axis axis, const cai_moe_stats *local, const int64_t *loads,
                                int n_layers, cai_moe_stats *st);

#ifdef __cplusplus
}
#endif
#endif
