/* The mixture-of-experts sublayer: router, top-k with renormalisation,
 * capacity, grouping of the tokens by expert, SwiGLU experts (one GEMM per
 * expert over its tokens), optional shared experts, the load-balancing and
 * z losses, and the explicit backward of all of it (docs/moe.md).
 *
 * Everything that touches activations goes through the op table (matmuls,
 * SwiGLU, the permutation into expert order and the weighted combination),
 * so the layer runs on any backend, the routing included (top-k, capacity,
 * the losses' sums and the logits' gradient: ops moe_route ..
 * moe_router_bwd). One copy a forward brings each expert's row count to
 * the host, where the grouped products take their shapes.
 * Expert parallelism enters through a cai_moe_exchange: the layer groups
 * its assignments by global expert, which is also by owning ep rank
 * (experts are contiguous blocks per rank), and the exchange moves the
 * blocks. */
#include "cai_config.h"
#include "colossal/moe.h"
#include "colossal/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const k_router_names[CAI_MOE_ROUTER_COUNT] = {"softmax", "topk_softmax", "sigmoid"};
static const char *const k_routing_names[CAI_MOE_ROUTING_COUNT] = {"dropless", "capacity"};

cai_moe_config cai_moe_config_default(void) {
    cai_moe_config c;
    memset(&c, 0, sizeof c);
    c.n_experts = 8;
    c.top_k = 2;
    c.router = CAI_MOE_ROUTER_SOFTMAX;
    c.norm_topk = 1;
    c.routing = CAI_MOE_DROPLESS;
    c.capacity_factor = 1.0f;
    c.aux_coef = 0.01f;
    c.z_coef = 0.001f;
    return c;
}

const char *cai_moe_router_name(cai_moe_router r) {
    return (int)r >= 0 && r < CAI_MOE_ROUTER_COUNT ? k_router_names[r] : "?";
}

const char *cai_moe_routing_name(cai_moe_routing r) {
    return (int)r >= 0 && r < CAI_MOE_ROUTING_COUNT ? k_routing_names[r] : "?";
}

static cai_status parse_name(const char *name, const char *const *names, int n, const char *field, int *out) {
    CAI_CHECK_ARG(name, "moe: NULL name for %s", field);
    char list[128];
    size_t len = 0;
    list[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(name, names[i])) {
            *out = i;
            return CAI_OK;
        }
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", names[i]);
    }
    return CAI_ERROR(CAI_ERR_CONFIG, "%s='%s' is not one of %s", field, name, list);
}

cai_status cai_moe_router_parse(const char *name, cai_moe_router *out) {
    int v = 0;
    CAI_CHECK_ARG(out, "cai_moe_router_parse: NULL output");
    CAI_CALL(parse_name(name, k_router_names, CAI_MOE_ROUTER_COUNT, "moe.router", &v));
    *out = (cai_moe_router)v;
    return CAI_OK;
}

cai_status cai_moe_routing_parse(const char *name, cai_moe_routing *out) {
    int v = 0;
    CAI_CHECK_ARG(out, "cai_moe_routing_parse: NULL output");
    CAI_CALL(parse_name(name, k_routing_names, CAI_MOE_ROUTING_COUNT, "moe.routing", &v));
    *out = (cai_moe_routing)v;
    return CAI_OK;
}

cai_status cai_moe_config_check(const cai_moe_config *c, int64_t d_model, int ep) {
    CAI_CHECK_ARG(c, "cai_moe_config_check: NULL config");
    CAI_CHECK_ARG(d_model >= 1, "moe: d_model=%lld must be >= 1", (long long)d_model);
    if ((int)c->router < 0 || c->router >= CAI_MOE_ROUTER_COUNT)
        return CAI_ERROR(CAI_ERR_CONFIG, "moe.router=%d is not one of softmax (0), topk_softmax (1), sigmoid (2)",
                         (int)c->router);
    if ((int)c->routing < 0 || c->routing >= CAI_MOE_ROUTING_COUNT)
        return CAI_ERROR(CAI_ERR_CONFIG, "moe.routing=%d is not one of dropless (0), capacity (1)", (int)c->routing);
    if (c->n_experts < 1) return CAI_ERROR(CAI_ERR_CONFIG, "moe.n_experts=%d must be >= 1", c->n_experts);
    if (ep < 1) return CAI_ERROR(CAI_ERR_LAYOUT, "moe: ep=%d must be >= 1", ep);
    if (c->n_experts % ep != 0) {
        char fits[256];
        size_t n = 0;
        fits[0] = 0;
        for (int e = 1; e <= c->n_experts && n + 16 < sizeof fits; e++)
            if (c->n_experts % e == 0) n += (size_t)snprintf(fits + n, sizeof fits - n, "%s%d", n ? ", " : "", e);
        return CAI_ERROR(CAI_ERR_LAYOUT,
                         "moe.n_experts=%d is not divisible by ep=%d (each ep rank owns whole experts); ep values "
                         "that fit: %s",
                         c->n_experts, ep, fits);
    }
    if (c->top_k < 1 || c->top_k > c->n_experts)
        return CAI_ERROR(CAI_ERR_CONFIG, "moe.top_k=%d must be between 1 and moe.n_experts=%d", c->top_k, c->n_experts);
    if (c->ffn < 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "moe.ffn=%d must be >= 1 (the hidden size of each expert)", c->ffn);
    if (c->n_shared < 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "moe.n_shared=%d must be >= 0 (0: no shared experts)", c->n_shared);
    if (c->norm_topk != 0 && c->norm_topk != 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "moe.norm_topk=%d must be 0 or 1", c->norm_topk);
    if (c->routing == CAI_MOE_CAPACITY && !(c->capacity_factor > 0.0f && isfinite(c->capacity_factor)))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "moe.capacity_factor=%g must be > 0 with moe.routing=capacity (1.0 gives each expert its "
                         "even share N*top_k/E of the assignments; moe.routing=dropless drops none)",
                         (double)c->capacity_factor);
    if (!(c->aux_coef >= 0.0f && isfinite(c->aux_coef)))
        return CAI_ERROR(CAI_ERR_CONFIG, "moe.aux_coef=%g must be finite and >= 0 (0: off)", (double)c->aux_coef);
    if (!(c->z_coef >= 0.0f && isfinite(c->z_coef)))
        return CAI_ERROR(CAI_ERR_CONFIG, "moe.z_coef=%g must be finite and >= 0 (0: off)", (double)c->z_coef);
    return CAI_OK;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

cai_status cai_moe_ctx_init(cai_moe_ctx *cx, cai_device_t *dev, const cai_moe_config *cfg, int64_t n_tokens,
                            int64_t d_model, cai_dtype act_dtype, const cai_moe_exchange *ex) {
    CAI_CHECK_ARG(cx && dev && cfg, "cai_moe_ctx_init: NULL argument");
    const int ep = ex ? ex->ep_size : 1, rank = ex ? ex->ep_rank : 0;
    CAI_CHECK_ARG(rank >= 0 && rank < (ep > 0 ? ep : 1), "moe: ep rank %d is outside [0, %d)", rank, ep);
    CAI_CHECK_ARG(ep <= 1 || (ex->counts && ex->rows), "moe: an exchange over ep=%d needs counts and rows functions",
                  ep);
    CAI_CALL(cai_moe_config_check(cfg, d_model, ep));
    CAI_CHECK_ARG(n_tokens >= 1, "moe: %lld tokens per rank; must be >= 1", (long long)n_tokens);
    if (act_dtype != CAI_DTYPE_F32 && act_dtype != CAI_DTYPE_BF16 && act_dtype != CAI_DTYPE_F16)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "moe: activations in %s; the layer computes in f32, bf16 or f16",
                         cai_dtype_name(act_dtype));
    /* the exchange moves f32 host rows (cai_all_to_allv) */
    if (ep > 1 && (dev->kind != CAI_DEVICE_HOST || act_dtype != CAI_DTYPE_F32))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "moe: expert parallelism (ep=%d) runs on the host backend in f32; device is %s, activations "
                         "%s (use ep=1 there)",
                         ep, cai_device_kind_name(dev->kind), cai_dtype_name(act_dtype));
    memset(cx, 0, sizeof *cx);
    cx->dev = dev;
    cx->dtype = act_dtype;
    cx->cfg = *cfg;
    cx->N = n_tokens;
    cx->C = d_model;
    cx->ep_size = ep;
    cx->ep_rank = rank;
    cx->n_local = cfg->n_experts / ep;
    cx->expert_begin = rank * cx->n_local;
    cx->ex = ep > 1 ? ex : NULL;
    /* No expert ever gets more than N assignments (a token picks an expert
     * once), so dropless is capacity N. */
    cx->capacity = n_tokens;
    if (cfg->routing == CAI_MOE_CAPACITY) {
        double cap = ceil((double)cfg->capacity_factor * (double)n_tokens * cfg->top_k / cfg->n_experts);
        cx->capacity = cap < (double)n_tokens ? (int64_t)cap : n_tokens;
    }
    cx->send_max = n_tokens * cfg->top_k;
    /* What one source can send to one rank: each of its tokens reaches at
     * most min(k, n_local) of the rank's experts, and each expert takes at
     * most `capacity`. */
    int64_t per_src = min64(n_tokens * min64(cfg->top_k, cx->n_local), cx->n_local * cx->capacity);
    cx->recv_max = ep > 1 ? ep * per_src : 0;
    return CAI_OK;
}

/* ------------------------------------------------------------ buffers */

/* Carves tensors from an arena, or (arena NULL) only adds up their bytes,
 * so sizing and carving cannot drift apart. */
typedef struct {
    const cai_moe_ctx *cx;
    cai_arena_t *arena;
    size_t bytes;
} moe_carver;

static cai_status take(moe_carver *c, cai_tensor *t, cai_dtype dt, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    CAI_CALL(cai_tensor_init(t, c->cx->dev, NULL, dt, cols ? 2 : 1, shape));
    size_t nb = (cai_tensor_nbytes(t) + 63) / 64 * 64;
    if (!c->arena) c->bytes += nb;
    else if (nb) CAI_CALL(cai_arena_alloc(c->arena, nb, 64, &t->data));
    return CAI_OK;
}

static cai_status take_raw(moe_carver *c, size_t bytes, void **out) {
    const size_t nb = (bytes + 63) / 64 * 64;
    *out = NULL;
    if (!c->arena) c->bytes += nb;
    else if (nb) CAI_CALL(cai_arena_alloc(c->arena, nb, 64, out));
    return CAI_OK;
}

/* Routing state lives on the device (d) but for the counts the host reads
 * (h); on the host device the two are one memory. */
static cai_status carve_acts(moe_carver *d, moe_carver *h, cai_moe_acts *a) {
    const cai_moe_ctx *cx = d->cx;
    const int64_t E = cx->cfg.n_experts, k = cx->cfg.top_k, N = cx->N, C = cx->C, F = cx->cfg.ffn;
    const int64_t Fs = (int64_t)cx->cfg.n_shared * F, S = cx->send_max, R = cx->recv_max;
    const int64_t H = cx->ep_size > 1 ? R : S; /* rows of the expert-grouped buffers */
    const cai_dtype f32 = CAI_DTYPE_F32, i32 = CAI_DTYPE_I32, i64 = CAI_DTYPE_I64, D = cx->dtype;
    const int on_host = cx->dev->kind == CAI_DEVICE_HOST;
    memset(a, 0, sizeof *a);
    CAI_CALL(take(d, &a->router_out, D, N, E));
    CAI_CALL(take(d, &a->d_router, D, N, E));
    if (D == f32) {
        a->logits = a->router_out;
        a->dlogits = a->d_router;
    } else {
        CAI_CALL(take(d, &a->logits, f32, N, E));
        CAI_CALL(take(d, &a->dlogits, f32, N, E));
    }
    CAI_CALL(take(d, &a->probs, f32, N, E));
    CAI_CALL(take(d, &a->lse, f32, N, 0));
    CAI_CALL(take(d, &a->sel, i32, N, k));
    CAI_CALL(take(d, &a->wts, f32, N, k));
    CAI_CALL(take(d, &a->pos, i32, N, k));
    CAI_CALL(take(d, &a->dw, f32, N, k));
    CAI_CALL(take(d, &a->counts, i64, 2 * E, 0));
    CAI_CALL(take(d, &a->sums, CAI_DTYPE_F64, E + 1, 0));
    if (on_host) {
        a->counts_h = a->counts;
        a->sums_h = a->sums;
    } else {
        CAI_CALL(take(h, &a->counts_h, i64, 2 * E, 0));
        CAI_CALL(take(h, &a->sums_h, CAI_DTYPE_F64, E + 1, 0));
    }
    if (a->counts_h.data) { /* not when only sizing */
        CAI_CALL(cai_tensor_slice0(&a->counts, 0, E, &a->load_d));
        CAI_CALL(cai_tensor_slice0(&a->counts, E, E, &a->kept_d));
        CAI_CALL(cai_tensor_slice0(&a->counts_h, 0, E, &a->load));
        CAI_CALL(cai_tensor_slice0(&a->counts_h, E, E, &a->send_cnt));
    }
    CAI_CALL(take(h, &a->recv_cnt, i64, E, 0)); /* ep * n_local = E */
    CAI_CALL(take(h, &a->rank_send, i64, cx->ep_size, 0));
    CAI_CALL(take(h, &a->rank_recv, i64, cx->ep_size, 0));
    CAI_CALL(take(h, &a->ecnt, i64, cx->n_local, 0));
    CAI_CALL(take_raw(h, (size_t)6 * (size_t)cx->n_local * sizeof(cai_tensor), (void **)&a->wlist));
    CAI_CALL(take(d, &a->send_x, D, S, C));
    CAI_CALL(take(d, &a->send_y, D, S, C));
    CAI_CALL(take(d, &a->recv_x, D, R, C));
    CAI_CALL(take(d, &a->recv_y, D, R, C));
    CAI_CALL(take(d, &a->src, D, R, C));
    CAI_CALL(take(d, &a->gate, D, H, F));
    CAI_CALL(take(d, &a->up, D, H, F));
    CAI_CALL(take(d, &a->act, D, H, F));
    if (Fs) {
        CAI_CALL(take(d, &a->sgate, D, N, Fs));
        CAI_CALL(take(d, &a->sup, D, N, Fs));
        CAI_CALL(take(d, &a->sact, D, N, Fs));
        CAI_CALL(take(d, &a->sdact, D, N, Fs));
        CAI_CALL(take(d, &a->sdgate, D, N, Fs));
        CAI_CALL(take(d, &a->sdup, D, N, Fs));
    }
    CAI_CALL(take(d, &a->d_send, D, S, C));
    CAI_CALL(take(d, &a->d_recv, D, R, C));
    CAI_CALL(take(d, &a->dact, D, H, F));
    CAI_CALL(take(d, &a->dgate, D, H, F));
    CAI_CALL(take(d, &a->dup, D, H, F));
    return CAI_OK;
}

size_t cai_moe_acts_bytes(const cai_moe_ctx *cx) {
    moe_carver d = {cx, NULL, 0}, h = {cx, NULL, 0};
    cai_moe_acts a;
    if (!cx || carve_acts(&d, &h, &a) != CAI_OK) return 0;
    return d.bytes + (cx->dev->kind == CAI_DEVICE_HOST ? h.bytes : 0);
}

cai_status cai_moe_acts_carve(const cai_moe_ctx *cx, cai_arena_t *arena, cai_moe_acts *a) {
    CAI_CHECK_ARG(cx && arena && a, "cai_moe_acts_carve: NULL argument");
    moe_carver d = {cx, arena, 0}, h = {cx, arena, 0};
    if (cx->dev->kind == CAI_DEVICE_HOST) return carve_acts(&d, &h, a);
    moe_carver hs = {cx, NULL, 0}, ds = {cx, NULL, 0};
    cai_moe_acts sizing;
    CAI_CALL(carve_acts(&ds, &hs, &sizing));
    cai_arena_t host;
    CAI_CALL(cai_arena_init(&host, hs.bytes + 64, "moe routing state"));
    h.arena = &host;
    cai_status st = carve_acts(&d, &h, a);
    if (st != CAI_OK) {
        cai_arena_free(&host);
        return st;
    }
    a->host = host;
    return CAI_OK;
}

void cai_moe_acts_free(cai_moe_acts *a) {
    if (a && a->host.base) cai_arena_free(&a->host);
}

/* ------------------------------------------------------------ routing */

/* The router's scoring function as the ops name it. */
static cai_route_fn route_fn(const cai_moe_ctx *cx) {
    _Static_assert((int)CAI_MOE_ROUTER_SOFTMAX == (int)CAI_ROUTE_SOFTMAX &&
                       (int)CAI_MOE_ROUTER_TOPK_SOFTMAX == (int)CAI_ROUTE_TOPK_SOFTMAX &&
                       (int)CAI_MOE_ROUTER_SIGMOID == (int)CAI_ROUTE_SIGMOID,
                   "cai_moe_router and cai_route_fn must agree");
    return (cai_route_fn)cx->cfg.router;
}

/* aux_raw = E sum_e (load_e / N) P_e, P_e the mean over tokens of the
 * router probability (sigmoid: the scores normalised per token);
 * z_raw = mean over tokens of lse^2. */
static void router_losses(const cai_moe_ctx *cx, cai_moe_acts *a) {
    const int E = cx->cfg.n_experts;
    const int64_t N = cx->N, *load = a->load.data;
    const double *s = a->sums_h.data;
    double aux = 0.0;
    for (int e = 0; e < E; e++) aux += (double)load[e] * s[e];
    a->aux_raw = aux * E / ((double)N * N);
    a->z_raw = s[E] / N;
}

double cai_moe_loss(const cai_moe_ctx *cx, const cai_moe_acts *a) {
    return cx->cfg.aux_coef * a->aux_raw + cx->cfg.z_coef * a->z_raw;
}

/* ------------------------------------------------------------ exchange */

static cai_status rows_of(const cai_tensor *t, int64_t off, int64_t n, cai_tensor *out) {
    return cai_tensor_slice0(t, off, n, out);
}

/* Counts of the exchange: rows per destination rank and, from every
 * source, rows per local expert (ep = 1: the send counts themselves). */
static cai_status plan_exchange(const cai_moe_ctx *cx, cai_moe_acts *a) {
    const int El = cx->n_local, ep = cx->ep_size;
    const int64_t *sc = a->send_cnt.data;
    int64_t *rc = a->recv_cnt.data, *rs = a->rank_send.data, *rr = a->rank_recv.data, *ec = a->ecnt.data;
    if (ep == 1) {
        memcpy(ec, sc, (size_t)El * sizeof *ec);
        rs[0] = 0;
        for (int e = 0; e < El; e++) rs[0] += sc[e];
        rr[0] = rs[0];
        return CAI_OK;
    }
    for (int r = 0; r < ep; r++) {
        rs[r] = 0;
        for (int e = 0; e < El; e++) rs[r] += sc[r * El + e];
    }
    CAI_CALL(cx->ex->counts(cx->ex->ctx, sc, rc, El));
    int64_t total = 0;
    for (int e = 0; e < El; e++) ec[e] = 0;
    for (int s = 0; s < ep; s++) {
        rr[s] = 0;
        for (int e = 0; e < El; e++) {
            rr[s] += rc[s * El + e];
            ec[e] += rc[s * El + e];
        }
        total += rr[s];
    }
    if (total > cx->recv_max)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "moe: ep rank %d receives %lld rows, more than the %lld its buffers hold for %lld tokens per "
                         "rank: every ep rank must route the same number of tokens",
                         cx->ep_rank, (long long)total, (long long)cx->recv_max, (long long)cx->N);
    return CAI_OK;
}

/* Rows grouped by source rank (then local expert) <-> grouped by local
 * expert (then source rank), so each expert's rows are contiguous. */
static void regroup(const cai_moe_ctx *cx, const cai_moe_acts *a, float *by_src, float *by_expert, int to_expert) {
    const int El = cx->n_local, ep = cx->ep_size;
    const int64_t C = cx->C, *rc = a->recv_cnt.data, *rr = a->rank_recv.data;
    int64_t eoff = 0;
    for (int e = 0; e < El; e++)
        for (int s = 0; s < ep; s++) {
            int64_t soff = 0;
            for (int q = 0; q < s; q++) soff += rr[q];
            for (int q = 0; q < e; q++) soff += rc[s * El + q];
            const int64_t n = rc[s * El + e];
            float *src = by_src + soff * C, *dst = by_expert + eoff * C;
            if (n) {
                if (to_expert) memcpy(dst, src, (size_t)(n * C) * sizeof(float));
                else memcpy(src, dst, (size_t)(n * C) * sizeof(float));
            }
            eoff += n;
        }
}

/* send order (grouped by global expert) -> this rank's experts' rows. */
static cai_status to_experts(const cai_moe_ctx *cx, cai_moe_acts *a, const cai_tensor *send, cai_tensor *by_expert) {
    if (cx->ep_size == 1) return CAI_OK; /* send order is expert order already */
    CAI_CALL(cx->ex->rows(cx->ex->ctx, send, a->rank_send.data, &a->src, a->rank_recv.data));
    regroup(cx, a, a->src.data, by_expert->data, 1);
    return CAI_OK;
}

/* The inverse: this rank's experts' rows -> back to the senders, in send order. */
static cai_status from_experts(const cai_moe_ctx *cx, cai_moe_acts *a, const cai_tensor *by_expert, cai_tensor *send) {
    if (cx->ep_size == 1) return CAI_OK;
    regroup(cx, a, a->src.data, by_expert->data, 0);
    return cx->ex->rows(cx->ex->ctx, &a->src, a->rank_recv.data, send, a->rank_send.data);
}

/* ------------------------------------------------------------ checks */

static cai_status check_2d(const char *what, const cai_tensor *t, cai_dtype dt, int64_t rows, int64_t cols) {
    char buf[96];
    if (!t || !t->data || t->dtype != dt || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols ||
        !cai_tensor_is_contiguous(t))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "moe: %s is %s, expected contiguous %s[%lld,%lld]", what,
                         t ? cai_tensor_describe(t, buf, sizeof buf) : "NULL", cai_dtype_name(dt), (long long)rows,
                         (long long)cols);
    return CAI_OK;
}

static cai_status check_params(const cai_moe_ctx *cx, const cai_moe_params *p, const char *what) {
    CAI_CHECK_ARG(p && p->experts, "moe: %s or its experts are NULL", what);
    const int64_t C = cx->C, F = cx->cfg.ffn, Fs = (int64_t)cx->cfg.n_shared * F;
    char name[64];
    /* the router's dtype is the model's parameter dtype; every weight shares it */
    const cai_dtype W = p->router.dtype;
    snprintf(name, sizeof name, "%s router", what);
    CAI_CALL(check_2d(name, &p->router, W, cx->cfg.n_experts, C));
    for (int i = 0; i < cx->n_local; i++) {
        snprintf(name, sizeof name, "%s expert %d w1", what, cx->expert_begin + i);
        CAI_CALL(check_2d(name, &p->experts[i].w1, W, F, C));
        snprintf(name, sizeof name, "%s expert %d w3", what, cx->expert_begin + i);
        CAI_CALL(check_2d(name, &p->experts[i].w3, W, F, C));
        snprintf(name, sizeof name, "%s expert %d w2", what, cx->expert_begin + i);
        CAI_CALL(check_2d(name, &p->experts[i].w2, W, C, F));
    }
    if (Fs) {
        snprintf(name, sizeof name, "%s shared w1", what);
        CAI_CALL(check_2d(name, &p->shared.w1, W, Fs, C));
        snprintf(name, sizeof name, "%s shared w3", what);
        CAI_CALL(check_2d(name, &p->shared.w3, W, Fs, C));
        snprintf(name, sizeof name, "%s shared w2", what);
        CAI_CALL(check_2d(name, &p->shared.w2, W, C, Fs));
    }
    return CAI_OK;
}

/* x as [N, C] (any leading dims flattening to N rows). */
static cai_status as_rows(const cai_moe_ctx *cx, const char *what, const cai_tensor *t, cai_tensor *out) {
    char buf[96];
    if (!t || !t->data || t->dtype != cx->dtype || !cai_tensor_is_contiguous(t) ||
        cai_tensor_numel(t) != cx->N * cx->C || t->shape[t->ndim - 1] != cx->C)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "moe: %s is %s, expected contiguous %s with %lld rows of %lld", what,
                         t ? cai_tensor_describe(t, buf, sizeof buf) : "NULL", cai_dtype_name(cx->dtype),
                         (long long)cx->N, (long long)cx->C);
    *out = cai_tensor_2d(t->device, t->data, cx->dtype, cx->N, cx->C);
    return CAI_OK;
}

/* ------------------------------------------------------------ forward */

/* The expert-grouped buffers: the send buffers at ep = 1, else the receive side. */
static cai_tensor *expert_x(const cai_moe_ctx *cx, cai_moe_acts *a) {
    return cx->ep_size == 1 ? &a->send_x : &a->recv_x;
}
static cai_tensor *expert_y(const cai_moe_ctx *cx, cai_moe_acts *a) {
    return cx->ep_size == 1 ? &a->send_y : &a->recv_y;
}
static cai_tensor *expert_d(const cai_moe_ctx *cx, cai_moe_acts *a) {
    return cx->ep_size == 1 ? &a->d_send : &a->d_recv;
}

/* The first H rows of the expert-grouped buffers: every local expert's
 * rows, expert after expert. */
typedef struct {
    cai_tensor x, y, gate, up, act, d, dact, dgate, dup;
} expert_rows;

static cai_status expert_slice(cai_moe_acts *a, const cai_tensor *xe, const cai_tensor *ye, const cai_tensor *de,
                               int64_t H, expert_rows *r) {
    CAI_CALL(rows_of(xe, 0, H, &r->x));
    CAI_CALL(rows_of(ye, 0, H, &r->y));
    CAI_CALL(rows_of(&a->gate, 0, H, &r->gate));
    CAI_CALL(rows_of(&a->up, 0, H, &r->up));
    CAI_CALL(rows_of(&a->act, 0, H, &r->act));
    if (!de) return CAI_OK;
    CAI_CALL(rows_of(de, 0, H, &r->d));
    CAI_CALL(rows_of(&a->dact, 0, H, &r->dact));
    CAI_CALL(rows_of(&a->dgate, 0, H, &r->dgate));
    return rows_of(&a->dup, 0, H, &r->dup);
}

/* The local experts' w1, w3, w2 (of p) as three arrays of n_local
 * tensors at list, list + n_local, list + 2 n_local: the grouped
 * products' weights. Returns the rows all experts hold together. */
static int64_t expert_lists(const cai_moe_ctx *cx, const cai_moe_acts *a, const cai_moe_params *p, cai_tensor *list) {
    const int El = cx->n_local;
    const int64_t *ec = a->ecnt.data;
    int64_t H = 0;
    for (int i = 0; i < El; i++) {
        list[i] = p->experts[i].w1;
        list[El + i] = p->experts[i].w3;
        list[2 * El + i] = p->experts[i].w2;
        H += ec[i];
    }
    return H;
}

static cai_status swiglu_mlp_fwd(cai_device_t *dev, const cai_moe_mlp *w, const cai_tensor *x, cai_tensor *gate,
                                 cai_tensor *up, cai_tensor *act, cai_tensor *y) {
    const cai_ops *ops = dev->ops;
    CAI_CALL(ops->linear_fwd(dev, gate, x, &w->w1, NULL));
    CAI_CALL(ops->linear_fwd(dev, up, x, &w->w3, NULL));
    CAI_CALL(ops->swiglu_fwd(dev, act, gate, up));
    return ops->linear_fwd(dev, y, act, &w->w2, NULL);
}

/* dy -> dx (= or += with accum), weight gradients +=; dy is read before
 * dx is written, so dx may be dy itself. */
static cai_status swiglu_mlp_bwd(cai_device_t *dev, const cai_moe_mlp *w, cai_moe_mlp *g, const cai_tensor *x,
                                 const cai_tensor *gate, const cai_tensor *up, const cai_tensor *act,
                                 const cai_tensor *dy, cai_tensor *dact, cai_tensor *dgate, cai_tensor *dup,
                                 cai_tensor *dx, int accum) {
    const cai_ops *ops = dev->ops;
    CAI_CALL(ops->linear_bwd(dev, dact, &g->w2, NULL, dy, act, &w->w2, 0));
    CAI_CALL(ops->swiglu_bwd(dev, dgate, dup, dact, gate, up));
    CAI_CALL(ops->linear_bwd(dev, dx, &g->w1, NULL, dgate, x, &w->w1, accum));
    return ops->linear_bwd(dev, dx, &g->w3, NULL, dup, x, &w->w3, 1);
}

/* Device to host (nothing when they are one buffer). */
static cai_status to_host(const cai_moe_ctx *cx, cai_tensor *dst, const cai_tensor *src) {
    if (dst->data == src->data) return CAI_OK;
    return cai_device_copy(cx->dev, dst->data, src->data, cai_tensor_nbytes(src), CAI_COPY_D2H);
}

cai_status cai_moe_fwd(const cai_moe_ctx *cx, const cai_moe_params *p, cai_moe_acts *a, const cai_tensor *x,
                       cai_tensor *y) {
    CAI_CHECK_ARG(cx && a, "cai_moe_fwd: NULL argument");
    CAI_CALL(check_params(cx, p, "params"));
    cai_tensor x2, y2;
    CAI_CALL(as_rows(cx, "input", x, &x2));
    CAI_CALL(as_rows(cx, "output", y, &y2));
    cai_device_t *dev = cx->dev;
    const cai_ops *ops = dev->ops;
    const int E = cx->cfg.n_experts;
    CAI_CALL(ops->linear_fwd(dev, &a->router_out, &x2, &p->router, NULL));
    if (a->logits.data != a->router_out.data) CAI_CALL(ops->copy(dev, &a->logits, &a->router_out));
    CAI_CALL(ops->moe_route(dev, &a->sel, &a->wts, &a->probs, &a->lse, &a->logits, route_fn(cx), cx->cfg.norm_topk));
    CAI_CALL(ops->moe_assign(dev, &a->pos, &a->load_d, &a->kept_d, &a->sel, cx->capacity));
    CAI_CALL(ops->moe_router_sums(dev, &a->sums, &a->probs, &a->lse, route_fn(cx)));
    /* the grouped products take their row counts on the host */
    CAI_CALL(to_host(cx, &a->counts_h, &a->counts));
    CAI_CALL(to_host(cx, &a->sums_h, &a->sums));
    const int64_t *load = a->load.data, *kept = a->send_cnt.data;
    a->dropped = 0;
    for (int e = 0; e < E; e++) a->dropped += load[e] - kept[e];
    router_losses(cx, a);
    CAI_CALL(ops->moe_permute(dev, &a->send_x, &x2, &a->pos));
    CAI_CALL(plan_exchange(cx, a));
    cai_tensor *xe = expert_x(cx, a), *ye = expert_y(cx, a);
    CAI_CALL(to_experts(cx, a, &a->send_x, xe));
    /* every local expert's SwiGLU MLP over its rows: three grouped products */
    const int El = cx->n_local;
    const int64_t *ec = a->ecnt.data;
    cai_tensor *wl = a->wlist;
    const int64_t H = expert_lists(cx, a, p, wl);
    if (H) {
        expert_rows r;
        CAI_CALL(expert_slice(a, xe, ye, NULL, H, &r));
        CAI_CALL(ops->grouped_linear_fwd(dev, &r.gate, &r.x, wl, ec, El));
        CAI_CALL(ops->grouped_linear_fwd(dev, &r.up, &r.x, wl + El, ec, El));
        CAI_CALL(ops->swiglu_fwd(dev, &r.act, &r.gate, &r.up));
        CAI_CALL(ops->grouped_linear_fwd(dev, &r.y, &r.act, wl + 2 * El, ec, El));
    }
    CAI_CALL(from_experts(cx, a, ye, &a->send_y));
    if (cx->cfg.n_shared) CAI_CALL(swiglu_mlp_fwd(dev, &p->shared, &x2, &a->sgate, &a->sup, &a->sact, &y2));
    /* y_t (+)= sum_j w_tj e_j(x_t), onto the shared experts' output when there are some */
    return ops->moe_combine_fwd(dev, &y2, &a->send_y, &a->pos, &a->wts, cx->cfg.n_shared != 0);
}

/* ------------------------------------------------------------ backward */

cai_status cai_moe_bwd(const cai_moe_ctx *cx, const cai_moe_params *p, cai_moe_params *g, cai_moe_acts *a,
                       const cai_tensor *x, const cai_tensor *dy, cai_tensor *dx, float loss_scale) {
    CAI_CHECK_ARG(cx && a, "cai_moe_bwd: NULL argument");
    CAI_CALL(check_params(cx, p, "params"));
    CAI_CALL(check_params(cx, g, "grads"));
    cai_tensor x2, dy2, dx2;
    CAI_CALL(as_rows(cx, "input", x, &x2));
    CAI_CALL(as_rows(cx, "output gradient", dy, &dy2));
    CAI_CALL(as_rows(cx, "input gradient", dx, &dx2));
    CAI_CHECK_ARG(dx2.data != dy2.data && dx2.data != x2.data, "moe: the input gradient must not overlap dy or x");
    cai_device_t *dev = cx->dev;
    const cai_ops *ops = dev->ops;
    /* y_t = sum_j w_tj e_j(x_t): d e_j = w_tj dy_t, d w_tj = <dy_t, e_j>. */
    CAI_CALL(ops->moe_combine_bwd(dev, &a->d_send, &a->dw, &dy2, &a->send_y, &a->pos, &a->wts));
    cai_tensor *xe = expert_x(cx, a), *ye = expert_y(cx, a), *de = expert_d(cx, a);
    CAI_CALL(to_experts(cx, a, &a->d_send, de));
    const int El = cx->n_local;
    const int64_t *ec = a->ecnt.data;
    cai_tensor *wl = a->wlist, *gl = a->wlist + 3 * El;
    const int64_t H = expert_lists(cx, a, p, wl);
    expert_lists(cx, a, g, gl);
    if (H) {
        expert_rows r;
        CAI_CALL(expert_slice(a, xe, ye, de, H, &r));
        /* the experts' input gradients replace their output gradients in place */
        CAI_CALL(ops->grouped_linear_bwd(dev, &r.dact, gl + 2 * El, &r.d, &r.act, wl + 2 * El, ec, El, 0));
        CAI_CALL(ops->swiglu_bwd(dev, &r.dgate, &r.dup, &r.dact, &r.gate, &r.up));
        CAI_CALL(ops->grouped_linear_bwd(dev, &r.d, gl, &r.dgate, &r.x, wl, ec, El, 0));
        CAI_CALL(ops->grouped_linear_bwd(dev, &r.d, gl + El, &r.dup, &r.x, wl + El, ec, El, 1));
    }
    CAI_CALL(from_experts(cx, a, de, &a->d_send));
    /* dx_t = sum_j (d e_j's input gradient), the permutation's backward */
    CAI_CALL(ops->moe_combine_fwd(dev, &dx2, &a->d_send, &a->pos, NULL, 0));
    const int64_t N = cx->N, E = cx->cfg.n_experts;
    const double aux_scale = (double)loss_scale * cx->cfg.aux_coef * E / ((double)N * N);
    CAI_CALL(ops->moe_router_bwd(dev, &a->dlogits, &a->logits, &a->probs, &a->lse, &a->sel, &a->wts, &a->dw, &a->load_d,
                                 route_fn(cx), cx->cfg.norm_topk, aux_scale, (double)loss_scale * cx->cfg.z_coef));
    if (a->d_router.data != a->dlogits.data) CAI_CALL(ops->copy(dev, &a->d_router, &a->dlogits));
    CAI_CALL(ops->linear_bwd(dev, &dx2, &g->router, NULL, &a->d_router, &x2, &p->router, 1));
    if (cx->cfg.n_shared)
        CAI_CALL(swiglu_mlp_bwd(dev, &p->shared, &g->shared, &x2, &a->sgate, &a->sup, &a->sact, &dy2, &a->sdact,
                                &a->sdgate, &a->sdup, &dx2, 1));
    return CAI_OK;
}

/* ------------------------------------------------------------ statistics */

void cai_moe_stats_from_load(const int64_t *load, int E, int64_t tokens, int64_t dropped, cai_moe_stats *st) {
    memset(st, 0, sizeof *st);
    st->n_experts = E;
    st->tokens = tokens;
    st->dropped = dropped;
    if (E < 1) return;
    int64_t sum = 0, mn = load[0], mx = load[0];
    for (int e = 0; e < E; e++) {
        sum += load[e];
        if (load[e] < mn) mn = load[e];
        if (load[e] > mx) mx = load[e];
    }
    const double mean = (double)sum / E;
    double var = 0.0;
    for (int e = 0; e < E; e++) var += ((double)load[e] - mean) * ((double)load[e] - mean);
    st->assignments = sum;
    st->load_min = mn;
    st->load_max = mx;
    st->load_cv = mean > 0.0 ? sqrt(var / E) / mean : 0.0;
}

void cai_moe_stats_get(const cai_moe_ctx *cx, const cai_moe_acts *a, cai_moe_stats *st) {
    cai_moe_stats_from_load(a->load.data, cx->cfg.n_experts, cx->N, a->dropped, st);
    st->aux_raw = a->aux_raw;
    st->z_raw = a->z_raw;
    st->aux_loss = cx->cfg.aux_coef * a->aux_raw;
    st->z_loss = cx->cfg.z_coef * a->z_raw;
}

/* ------------------------------------------------------------ registry */

static const char *const k_mlp_parts[3] = {"fc", "up", "proj"};

static cai_status add_mlp(cai_registry_t *reg, const char *prefix, int64_t F, int64_t C, cai_param_spec spec,
                          float std) {
    char name[CAI_PARAM_NAME_MAX];
    for (int i = 0; i < 3; i++) {
        const int proj = i == 2;
        uint64_t shape[2] = {(uint64_t)(proj ? C : F), (uint64_t)(proj ? F : C)};
        /* Replicated over tp: the layer runs whole on every tp rank (tensor
         * parallelism splits the attention half of an MoE block). */
        spec.tp_split_dim = -1;
        spec.init.kind = proj ? CAI_INIT_NORMAL_RESIDUAL : CAI_INIT_NORMAL;
        spec.init.std = std;
        snprintf(name, sizeof name, "%s.%s.weight", prefix, k_mlp_parts[i]);
        CAI_CALL(cai_registry_add(reg, name, 2, shape, CAI_DTYPE_F32, &spec, NULL));
    }
    return CAI_OK;
}

cai_status cai_moe_register_params(cai_registry_t *reg, int layer, const cai_moe_config *cfg, int64_t d_model,
                                   float init_std) {
    CAI_CHECK_ARG(reg && cfg, "cai_moe_register_params: NULL argument");
    CAI_CALL(cai_moe_config_check(cfg, d_model, 1));
    char name[CAI_PARAM_NAME_MAX];
    cai_param_spec spec = cai_param_spec_default();
    spec.pp_place = CAI_PP_LAYER;
    spec.layer = layer;
    spec.init.kind = CAI_INIT_NORMAL;
    spec.init.std = init_std;
    snprintf(name, sizeof name, "h.%d.moe.router.weight", layer);
    CAI_CALL(cai_registry_add(reg, name, 2, (uint64_t[]){(uint64_t)cfg->n_experts, (uint64_t)d_model}, CAI_DTYPE_F32,
                              &spec, NULL));
    for (int e = 0; e < cfg->n_experts; e++) {
        cai_param_spec es = spec;
        es.expert = e;
        es.n_experts = cfg->n_experts;
        snprintf(name, sizeof name, "h.%d.moe.experts.%d", layer, e);
        CAI_CALL(add_mlp(reg, name, cfg->ffn, d_model, es, init_std));
    }
    if (cfg->n_shared) {
        snprintf(name, sizeof name, "h.%d.moe.shared", layer);
        CAI_CALL(add_mlp(reg, name, (int64_t)cfg->n_shared * cfg->ffn, d_model, spec, init_std));
    }
    return CAI_OK;
}

static cai_status view_param(const cai_registry_t *reg, const cai_rank_view *view, const size_t *offsets,
                             cai_device_t *dev, float *flat, const char *name, cai_tensor *out) {
    int idx;
    CAI_CALL(cai_registry_lookup(reg, name, &idx));
    cai_param_shard sh;
    CAI_CALL(cai_registry_shard(reg, idx, view, &sh));
    if (!sh.held)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "moe: parameter '%s' is not held by ep rank %d (its owner is %d)", name,
                         view->ep_rank, sh.ep_owner);
    *out =
        cai_tensor_2d(dev, flat + offsets[idx], CAI_DTYPE_F32, (int64_t)sh.local_shape[0], (int64_t)sh.local_shape[1]);
    return CAI_OK;
}

static cai_status view_mlp(const cai_registry_t *reg, const cai_rank_view *view, const size_t *offsets,
                           cai_device_t *dev, float *flat, const char *prefix, cai_moe_mlp *m) {
    char name[CAI_PARAM_NAME_MAX];
    cai_tensor *dst[3] = {&m->w1, &m->w3, &m->w2};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.%s.weight", prefix, k_mlp_parts[i]);
        CAI_CALL(view_param(reg, view, offsets, dev, flat, name, dst[i]));
    }
    return CAI_OK;
}

static cai_status params_view(const cai_registry_t *reg, const cai_rank_view *view, const size_t *offsets, int layer,
                              const cai_moe_config *cfg, cai_device_t *dev, float *flat, cai_moe_params *p,
                              cai_moe_mlp *experts) {
    char name[CAI_PARAM_NAME_MAX];
    memset(p, 0, sizeof *p);
    p->experts = experts;
    snprintf(name, sizeof name, "h.%d.moe.router.weight", layer);
    CAI_CALL(view_param(reg, view, offsets, dev, flat, name, &p->router));
    const int El = cfg->n_experts / view->ep_size;
    for (int i = 0; i < El; i++) {
        snprintf(name, sizeof name, "h.%d.moe.experts.%d", layer, view->ep_rank * El + i);
        CAI_CALL(view_mlp(reg, view, offsets, dev, flat, name, &experts[i]));
    }
    if (cfg->n_shared) {
        snprintf(name, sizeof name, "h.%d.moe.shared", layer);
        CAI_CALL(view_mlp(reg, view, offsets, dev, flat, name, &p->shared));
    }
    return CAI_OK;
}

cai_status cai_moe_params_view(const cai_registry_t *reg, const cai_rank_view *view, size_t align_elems, int layer,
                               const cai_moe_config *cfg, cai_device_t *dev, float *flat, cai_moe_params *p,
                               cai_moe_mlp *experts) {
    CAI_CHECK_ARG(reg && view && cfg && flat && p && experts, "cai_moe_params_view: NULL argument");
    CAI_CALL(cai_moe_config_check(cfg, 1, view->ep_size));
    size_t *offsets = NULL, total = 0;
    CAI_CALL(cai_malloc((void **)&offsets, (size_t)cai_registry_count(reg) * sizeof *offsets, "moe param offsets"));
    cai_status st = cai_registry_local_layout(reg, view, align_elems, offsets, &total);
    if (st == CAI_OK) st = params_view(reg, view, offsets, layer, cfg, dev, flat, p, experts);
    cai_free(offsets);
    return st;
}
