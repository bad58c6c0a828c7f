/* Expert parallelism: the MoE layer's exchange over the ep axis (counts by
 * all-to-all, then rows by all-to-all-v), the gradient synchronisation of
 * a model with experts (dense over dp, experts over edp) and the router
 * statistics summed over an axis. docs/moe.md. */
#include "cai_config.h"

#include <string.h>

#include "colossal/moe.h"
#include "colossal/ops.h"

/* ------------------------------------------------------------ exchange */

typedef struct {
    cai_mesh_t *mesh;
    int ep;
    size_t *v; /* 4 * ep: send counts, send displacements, receive counts, receive displacements */
} ep_ctx;

static cai_status ep_counts(void *ctx, const int64_t *send, int64_t *recv, int64_t per_rank) {
    ep_ctx *c = ctx;
    return cai_all_to_all(c->mesh, CAI_AXIS_EP, send, recv, (size_t)per_rank, CAI_DTYPE_I64);
}

/* Element counts and displacements of `rows` rows of `width` per rank;
 * the total must fit the tensor. */
static cai_status row_plan(const ep_ctx *c, const char *what, const cai_tensor *t, const int64_t *rows, size_t *counts,
                           size_t *displs) {
    const int64_t width = t->shape[t->ndim - 1];
    int64_t total = 0;
    for (int r = 0; r < c->ep; r++) {
        displs[r] = (size_t)(total * width);
        counts[r] = (size_t)(rows[r] * width);
        total += rows[r];
    }
    if (total * width > cai_tensor_numel(t))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "moe exchange on axis ep: %lld %s rows of %lld do not fit a %lld-row buffer", (long long)total,
                         what, (long long)width, (long long)(cai_tensor_numel(t) / width));
    return CAI_OK;
}

static cai_status ep_rows(void *ctx, const cai_tensor *send, const int64_t *send_rows, cai_tensor *recv,
                          const int64_t *recv_rows) {
    ep_ctx *c = ctx;
    CAI_CHECK_ARG(send && recv && send->dtype == recv->dtype && cai_tensor_is_contiguous(send) &&
                      cai_tensor_is_contiguous(recv) && send->shape[send->ndim - 1] == recv->shape[recv->ndim - 1],
                  "moe exchange on axis ep: send and receive buffers must be contiguous with equal rows and dtype");
    size_t *sc = c->v, *sd = c->v + c->ep, *rc = c->v + 2 * c->ep, *rd = c->v + 3 * c->ep;
    CAI_CALL(row_plan(c, "sent", send, send_rows, sc, sd));
    CAI_CALL(row_plan(c, "received", recv, recv_rows, rc, rd));
    return cai_all_to_allv(c->mesh, CAI_AXIS_EP, send->data, sc, sd, recv->data, rc, rd, send->dtype);
}

cai_status cai_moe_ep_exchange_init(cai_moe_exchange *ex, cai_mesh_t *mesh) {
    CAI_CHECK_ARG(ex && mesh, "cai_moe_ep_exchange_init: NULL argument");
    memset(ex, 0, sizeof *ex);
    ep_ctx *c = NULL;
    CAI_CALL(cai_calloc((void **)&c, 1, sizeof *c, "moe exchange"));
    c->mesh = mesh;
    c->ep = cai_mesh_size(mesh, CAI_AXIS_EP);
    cai_status st = cai_calloc((void **)&c->v, 4 * (size_t)c->ep, sizeof *c->v, "moe exchange counts");
    if (st != CAI_OK) {
        cai_free(c);
        return st;
    }
    ex->ctx = c;
    ex->ep_size = c->ep;
    ex->ep_rank = cai_mesh_rank(mesh, CAI_AXIS_EP);
    ex->counts = ep_counts;
    ex->rows = ep_rows;
    return CAI_OK;
}

void cai_moe_ep_exchange_free(cai_moe_exchange *ex) {
    if (!ex || !ex->ctx) return;
    ep_ctx *c = ex->ctx;
    cai_free(c->v);
    cai_free(c);
    memset(ex, 0, sizeof *ex);
}

/* ------------------------------------------------------------ gradients */

typedef struct {
    size_t offset, count;
    int expert;
} grad_run;

struct cai_moe_grad_sync {
    cai_mesh_t *mesh;
    grad_run *runs;
    int n_runs;
    int dp;
};

cai_status cai_moe_grad_sync_create(cai_moe_grad_sync_t **out, cai_mesh_t *mesh, const cai_registry_t *reg,
                                    const cai_rank_view *view, size_t align_elems) {
    CAI_CHECK_ARG(out && mesh && reg && view, "cai_moe_grad_sync_create: NULL argument");
    CAI_CHECK_ARG(view->ep_size == cai_mesh_size(mesh, CAI_AXIS_EP) &&
                      view->ep_rank == cai_mesh_rank(mesh, CAI_AXIS_EP),
                  "moe gradient sync: the view's ep %d/%d is not this rank's place on the mesh (ep rank %d of %d)",
                  view->ep_rank, view->ep_size, cai_mesh_rank(mesh, CAI_AXIS_EP), cai_mesh_size(mesh, CAI_AXIS_EP));
    *out = NULL;
    const int n = cai_registry_count(reg);
    cai_moe_grad_sync_t *gs = NULL;
    size_t *offsets = NULL, total = 0;
    cai_status st;
    CAI_CALL_GOTO(cai_calloc((void **)&gs, 1, sizeof *gs, "moe gradient sync"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&gs->runs, (size_t)(n ? n : 1), sizeof *gs->runs, "moe gradient runs"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&offsets, (size_t)(n ? n : 1), sizeof *offsets, "moe gradient offsets"), st,
                  fail);
    CAI_CALL_GOTO(cai_registry_local_layout(reg, view, align_elems, offsets, &total), st, fail);
    gs->mesh = mesh;
    gs->dp = cai_mesh_size(mesh, CAI_AXIS_DP);
    /* Registration order is the flat order: a run grows over the next held
     * parameter of its kind, alignment gaps (zeros) included. */
    for (int i = 0; i < n; i++) {
        if (offsets[i] == SIZE_MAX) continue;
        cai_param_shard sh;
        CAI_CALL_GOTO(cai_registry_shard(reg, i, view, &sh), st, fail);
        const int expert = cai_registry_param(reg, i)->spec.n_experts > 0;
        grad_run *last = gs->n_runs ? &gs->runs[gs->n_runs - 1] : NULL;
        if (last && last->expert == expert) last->count = offsets[i] + sh.local_numel - last->offset;
        else gs->runs[gs->n_runs++] = (grad_run){offsets[i], (size_t)sh.local_numel, expert};
    }
    cai_free(offsets);
    *out = gs;
    return CAI_OK;
fail:
    cai_free(offsets);
    cai_moe_grad_sync_free(gs);
    return st;
}

cai_status cai_moe_grad_sync_run(cai_moe_grad_sync_t *gs, cai_device_t *dev, float *grads) {
    CAI_CHECK_ARG(gs && dev, "cai_moe_grad_sync_run: NULL argument");
    if (gs->dp == 1 || gs->n_runs == 0) return CAI_OK;
    CAI_CHECK_ARG(grads, "cai_moe_grad_sync_run: NULL gradient buffer");
    CAI_CALL(cai_device_sync(dev)); /* the backward must have written them */
    const int edp = cai_mesh_size(gs->mesh, CAI_AXIS_EDP);
    for (int i = 0; i < gs->n_runs; i++) {
        const grad_run *r = &gs->runs[i];
        float *g = grads + r->offset;
        if (!r->expert) {
            CAI_CALL(cai_allreduce(gs->mesh, CAI_AXIS_DP, g, g, r->count, CAI_DTYPE_F32, CAI_RED_AVG));
            continue;
        }
        /* Every ep rank's tokens are in it already: the other dp ranks with
         * this expert are its edp replicas, and the mean is over all dp. */
        if (edp > 1) CAI_CALL(cai_allreduce(gs->mesh, CAI_AXIS_EDP, g, g, r->count, CAI_DTYPE_F32, CAI_RED_SUM));
        cai_tensor t = cai_tensor_1d(dev, g, CAI_DTYPE_F32, (int64_t)r->count);
        CAI_CALL(dev->ops->scale(dev, &t, 1.0f / (float)gs->dp));
    }
    return CAI_OK;
}

void cai_moe_grad_sync_free(cai_moe_grad_sync_t *gs) {
    if (!gs) return;
    cai_free(gs->runs);
    cai_free(gs);
}

/* ------------------------------------------------------------ statistics */

cai_status cai_moe_stats_reduce(cai_mesh_t *mesh, cai_axis axis, const cai_moe_stats *local, const int64_t *loads,
                                int n_layers, cai_moe_stats *st) {
    CAI_CHECK_ARG(mesh && local && loads && st && n_layers >= 1, "cai_moe_stats_reduce: NULL argument or no layers");
    const int E = local[0].n_experts;
    for (int l = 1; l < n_layers; l++)
        CAI_CHECK_ARG(local[l].n_experts == E, "moe statistics: layer %d has %d experts, layer 0 %d", l,
                      local[l].n_experts, E);
    const size_t ni = (size_t)n_layers * ((size_t)E + 2), nd = (size_t)n_layers * 4;
    int64_t *iv = NULL;
    double *dv = NULL;
    cai_status st_ = cai_malloc((void **)&iv, ni * sizeof *iv, "moe statistics");
    if (st_ == CAI_OK) st_ = cai_malloc((void **)&dv, nd * sizeof *dv, "moe statistics");
    if (st_ != CAI_OK) goto done;
    for (int l = 0; l < n_layers; l++) {
        memcpy(iv + (size_t)l * E, loads + (size_t)l * E, (size_t)E * sizeof *iv);
        iv[(size_t)n_layers * E + 2 * l] = local[l].dropped;
        iv[(size_t)n_layers * E + 2 * l + 1] = local[l].tokens;
        double *d = dv + 4 * l;
        d[0] = local[l].aux_raw;
        d[1] = local[l].z_raw;
        d[2] = local[l].aux_loss;
        d[3] = local[l].z_loss;
    }
    CAI_CALL_GOTO(cai_allreduce(mesh, axis, iv, iv, ni, CAI_DTYPE_I64, CAI_RED_SUM), st_, done);
    CAI_CALL_GOTO(cai_allreduce(mesh, axis, dv, dv, nd, CAI_DTYPE_F64, CAI_RED_AVG), st_, done);
    for (int l = 0; l < n_layers; l++) {
        cai_moe_stats_from_load(iv + (size_t)l * E, E, iv[(size_t)n_layers * E + 2 * l + 1],
                                iv[(size_t)n_layers * E + 2 * l], &st[l]);
        const double *d = dv + 4 * l;
        st[l].aux_raw = d[0];
        st[l].z_raw = d[1];
        st[l].aux_loss = d[2];
        st[l].z_loss = d[3];
    }
done:
    cai_free(iv);
    cai_free(dv);
    return st_;
}
