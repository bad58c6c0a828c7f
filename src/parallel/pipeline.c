/* The pipeline executor: runs one rank's action list of a schedule
 * (colossal/schedule.h) on its model chunks, with non-blocking
 * point-to-point on the pp axis for activations and their gradients.
 *
 * Each forward of a (microbatch, chunk) keeps its activations in one of the
 * model's activation slots until its backward (a split one's weight pass:
 * zb-h1; that slot is never given up in between). With as many slots as the
 * schedule's peak in-flight forwards on this rank nothing is recomputed;
 * with fewer, a forward takes the slot of the pair whose backward comes
 * last, and that pair's backward recomputes its forward from the saved
 * chunk input first (the numbers are the same: the forward is
 * deterministic). A rank keeps, per (microbatch, chunk) in flight, the chunk
 * input and the tensors it sends until they are delivered.
 *
 * Gradients accumulate over the microbatches in the order the list runs
 * backwards (microbatch order for every schedule here), as the
 * single-process loop accumulates them. Tied embeddings held on the first
 * and the last stage exchange their gradient contributions once per step
 * and both add them in the same order, so the copies stay bit-identical. */
#include "cai_config.h"

#include <mpi.h>
#include "colossal/cluster.h"
#include "colossal/parallel.h"
#include "colossal/schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *in;   /* chunk input (not the first stage) */
    char *out;  /* chunk output being sent (not the last stage) */
    char *dout; /* gradient of the output received (not the last stage) */
    char *din;  /* gradient of the input being sent (not the first stage) */
} mb_bufs;

typedef struct {
    int first, last; /* the chunk runs the first / last stage */
    int stage;       /* its global stage */
    /* this rank's chunk holding the next / previous stage (the bottom of
     * zb-v's V), whose input / output gradient is handed over in memory; -1 */
    int local_next, local_prev;
} chunk_info;

struct cai_pipeline {
    cai_mesh_t *mesh;
    cai_model_t *model;
    cai_device_t *dev;
    cai_pp_spec spec;
    int rank, first, last;
    int n_chunks;
    chunk_info chunk[CAI_PP_MAX_CHUNKS];
    size_t act_bytes, act_count;
    /* tp > 1 without sequence parallelism: every tp rank holds the same
     * boundary tensor, so each sends only its 1/tp piece (wire_count
     * elements at wire_off) and the receivers all-gather them over tp */
    size_t wire_count, wire_off;
    int split_tp;
    cai_dtype act_dtype;
    cai_pp_schedule *sched; /* for spec.microbatches */
    mb_bufs *mb;            /* per (microbatch, chunk): mb * n_chunks + chunk */
    int mb_cap;
    /* activation slots: owner pair of each (-1 free), the slot of each pair
     * (-1: not resident), and when each pair's backward runs in the list */
    int *slot_owner, *slot_of, *bwd_at, *pinned; /* pinned: input pass done, weight pass to come */
    int n_slots, n_recompute;
    cai_request_t **sends; /* in flight; completed ones are NULL until the step ends */
    int n_sends, sends_cap;
    /* Host: every RECV of the step is posted at its start (recv[i] for
     * action i, NULL once complete), so data lands while this rank computes;
     * a model hook tests the messages in flight between units, because MPI
     * moves a large message only while a rank is inside it. */
    cai_request_t **recv;
    cai_status *recv_st;
    int n_recv_cap, prepost;
    /* Host, every pp rank on this node (CAI_PP_HOST_TRANSPORT=shm): each
     * pair's in and dout live in a node-shared window; a sender copies the
     * tensor straight into its peer's and sends a one-word note (eager: it
     * needs no progress from the sender) that the RECV waits for. */
    int shm;
    cai_shared_mem_t *window; /* the pairs' receive buffers, every pp rank's mapped here */
    size_t win_stride;        /* one buffer, 64-byte aligned */
    int32_t note_out, *note_in;
    /* the last step's compute actions (cai_pipeline_trace), times from the step's start */
    int tracing;
    double t0;
    double *ev; /* [op, mb, chunk, start, end] per event */
    int n_ev, cap_ev;
    double *steps; /* every traced step: [first start, last end, busy] of this rank */
    int n_steps, cap_steps;
    cai_zero_t *zero; /* NULL: the model's own gradients, averaged over dp here */
    /* tie groups split across stages: [parameter, peer stage] */
    int n_ties;
    struct {
        int index;
        int peer;
        float *tmp, *own; /* the peer's contribution, this rank's (host; kept: no page faults a step) */
    } tie[4];
};

static cai_status progress_hook(void *ctx, cai_model_t *m, cai_model_event ev, int unit);

/* The receive buffers of n pairs in node-shared memory: pair k's in at 2k
 * strides, its dout at 2k + 1, on every rank alike. Collective over pp. */
static cai_status alloc_window(cai_pipeline_t *p, int n) {
    cai_shared_mem_free(p->window);
    p->window = NULL;
    p->win_stride = (p->act_bytes + 63) / 64 * 64;
    return cai_shared_mem_create(p->mesh, CAI_AXIS_PP, 2 * (size_t)n * p->win_stride, &p->window);
}

static cai_status free_bufs(cai_pipeline_t *p) {
    for (int i = 0; i < p->mb_cap; i++) {
        if (!p->shm) {
            cai_device_dealloc(p->dev, p->mb[i].in);
            cai_device_dealloc(p->dev, p->mb[i].dout);
        }
        cai_device_dealloc(p->dev, p->mb[i].out);
        cai_device_dealloc(p->dev, p->mb[i].din);
    }
    cai_shared_mem_free(p->window);
    p->window = NULL;
    cai_free(p->mb);
    p->mb = NULL;
    p->mb_cap = 0;
    cai_free(p->slot_of);
    cai_free(p->bwd_at);
    cai_free(p->pinned);
    p->slot_of = p->bwd_at = p->pinned = NULL;
    return CAI_OK;
}

/* Buffers of n (microbatch, chunk) pairs. */
static cai_status ensure_bufs(cai_pipeline_t *p, int n) {
    if (n <= p->mb_cap) return CAI_OK;
    cai_free(p->slot_of);
    cai_free(p->bwd_at);
    cai_free(p->pinned);
    p->slot_of = p->bwd_at = p->pinned = NULL;
    CAI_CALL(cai_calloc((void **)&p->slot_of, (size_t)n, sizeof *p->slot_of, "pipeline slot table"));
    CAI_CALL(cai_calloc((void **)&p->pinned, (size_t)n, sizeof *p->pinned, "pipeline pinned slots"));
    CAI_CALL(cai_calloc((void **)&p->bwd_at, (size_t)n, sizeof *p->bwd_at, "pipeline backward order"));
    mb_bufs *nb = NULL;
    CAI_CALL(cai_calloc((void **)&nb, (size_t)n, sizeof *nb, "pipeline microbatch buffers"));
    if (p->mb) memcpy(nb, p->mb, (size_t)p->mb_cap * sizeof *nb);
    cai_free(p->mb);
    p->mb = nb;
    if (p->shm) CAI_CALL(alloc_window(p, n));
    for (int i = 0; i < n; i++) {
        mb_bufs *b = &p->mb[i];
        const chunk_info *c = &p->chunk[i % p->n_chunks];
        if (p->shm) {
            char *mine = cai_shared_mem_ptr(p->window, p->rank);
            b->in = c->first ? NULL : mine + 2 * (size_t)i * p->win_stride;
            b->dout = c->last ? NULL : mine + (2 * (size_t)i + 1) * p->win_stride;
        }
        if (i < p->mb_cap) continue;
        p->mb_cap = i + 1;
        if (!c->first) {
            if (!p->shm) CAI_CALL(cai_device_alloc(p->dev, p->act_bytes, "pipeline stage input", (void **)&b->in));
            CAI_CALL(cai_device_alloc(p->dev, p->act_bytes, "pipeline input gradient", (void **)&b->din));
        }
        if (!c->last) {
            CAI_CALL(cai_device_alloc(p->dev, p->act_bytes, "pipeline stage output", (void **)&b->out));
            if (!p->shm)
                CAI_CALL(cai_device_alloc(p->dev, p->act_bytes, "pipeline output gradient", (void **)&b->dout));
        }
    }
    return CAI_OK;
}

/* Host pipelines use node-shared boundaries when the knob asks for them
 * and every pp rank shares one node (agreed by a probe allocation).
 * Collective over the pp axis. */
static cai_status setup_shm(cai_pipeline_t *p) {
    const char *mode = NULL;
    CAI_CALL(cai_knob_str("CAI_PP_HOST_TRANSPORT", &mode));
    /* the knob is the same on every rank; the device kind is too */
    if (!p->prepost || strcmp(mode, "shm") != 0) return CAI_OK;
    cai_shared_mem_t *probe = NULL;
    cai_status st = cai_shared_mem_create(p->mesh, CAI_AXIS_PP, 64, &probe);
    if (st == CAI_ERR_UNSUPPORTED) {
        cai_error_clear();
        return CAI_OK;
    }
    CAI_CALL(st);
    cai_shared_mem_free(probe);
    p->shm = 1;
    return CAI_OK;
}

/* The tie groups whose members live on this and another stage. */
static cai_status find_ties(cai_pipeline_t *p) {
    const cai_registry_t *reg = cai_model_registry(p->model);
    const cai_rank_view *v = cai_model_view(p->model);
    const int n = cai_registry_count(reg);
    for (int i = 0; i < n; i++) {
        const cai_param_info *a = cai_registry_param(reg, i);
        if (a->spec.tie_group <= 0) continue;
        cai_param_shard sa;
        CAI_CALL(cai_registry_shard(reg, i, v, &sa));
        if (!sa.held) continue;
        for (int j = 0; j < n; j++) {
            const cai_param_info *b = cai_registry_param(reg, j);
            if (j == i || b->spec.tie_group != a->spec.tie_group) continue;
            cai_param_shard sb;
            CAI_CALL(cai_registry_shard(reg, j, v, &sb));
            if (sb.pp_stage == sa.pp_stage) continue;
            if (p->n_ties == (int)(sizeof p->tie / sizeof p->tie[0]))
                return CAI_ERROR(CAI_ERR_UNSUPPORTED, "pipeline: more than %d tied tensors split across stages",
                                 p->n_ties);
            const int t = p->n_ties++; /* counted first: cai_pipeline_free releases what was allocated */
            p->tie[t].index = i;
            p->tie[t].peer = sb.pp_stage;
            CAI_CALL(cai_malloc((void **)&p->tie[t].own, (size_t)sa.local_numel * sizeof(float),
                                "pipeline tied gradient (own)"));
            CAI_CALL(
                cai_malloc((void **)&p->tie[t].tmp, (size_t)sa.local_numel * sizeof(float), "pipeline tied gradient"));
        }
    }
    return CAI_OK;
}

cai_status cai_pipeline_create(cai_pipeline_t **out, cai_mesh_t *mesh, cai_model_t *m, cai_pp_style style) {
    CAI_CHECK_ARG(out && mesh && m, "cai_pipeline_create: NULL argument");
    *out = NULL;
    const cai_rank_view *v = cai_model_view(m);
    const int pp = cai_mesh_size(mesh, CAI_AXIS_PP), rank = cai_mesh_rank(mesh, CAI_AXIS_PP);
    if (v->pp_size != pp || v->pp_rank != rank)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "pipeline: the model is stage %d of %d but this rank is %d of %d on the mesh's pp axis",
                         v->pp_rank, v->pp_size, rank, pp);
    if ((style == CAI_PP_ZB_H1 || style == CAI_PP_ZB_V) && !cai_model_split_backward(m))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "pipeline: %s runs each backward as an input pass and a later weight pass; create the "
                         "model with split_backward = 1",
                         cai_pp_style_name(style));
    if ((style == CAI_PP_ZB_V) != (v->pp_vshape != 0))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "pipeline: %s %s, but the model's view has pp_vshape=%d",
                         cai_pp_style_name(style),
                         style == CAI_PP_ZB_V ? "places a rank's two chunks in a V (view.pp_vshape = 1)"
                                              : "places virtual stage k on rank k % pp",
                         v->pp_vshape);
    const int chunks = cai_model_chunk_count(m);
    const int want = style == CAI_PP_INTERLEAVED ? (chunks >= 2 ? chunks : 2) : style == CAI_PP_ZB_V ? 2 : 1;
    if (chunks != want || chunks > CAI_PP_MAX_CHUNKS)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "pipeline: %s runs %s model chunk%s per rank but the model holds %d (its view's "
                         "pp_chunks; at most %d)",
                         cai_pp_style_name(style),
                         style == CAI_PP_INTERLEAVED ? ">= 2"
                         : style == CAI_PP_ZB_V      ? "2"
                                                     : "1",
                         style == CAI_PP_INTERLEAVED || style == CAI_PP_ZB_V ? "s" : "", chunks, CAI_PP_MAX_CHUNKS);
    if (v->tp_size > 1 &&
        (cai_mesh_size(mesh, CAI_AXIS_TP) != v->tp_size || cai_mesh_rank(mesh, CAI_AXIS_TP) != v->tp_rank))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "pipeline: the model is tp shard %d of %d but the mesh's tp axis says %d of %d", v->tp_rank,
                         v->tp_size, cai_mesh_rank(mesh, CAI_AXIS_TP), cai_mesh_size(mesh, CAI_AXIS_TP));
    cai_pipeline_t *p = NULL;
    CAI_CALL(cai_calloc((void **)&p, 1, sizeof *p, "pipeline"));
    p->mesh = mesh;
    p->model = m;
    p->dev = cai_model_device(m);
    p->rank = rank;
    p->spec = (cai_pp_spec){.pp = pp, .virtual_stages = chunks, .microbatches = 0, .style = style};
    cai_model_stage(m, NULL, NULL, &p->first, &p->last);
    p->n_chunks = chunks;
    cai_status st;
    for (int c = 0; c < chunks; c++) {
        chunk_info *ci = &p->chunk[c];
        CAI_CALL_GOTO(cai_model_chunk(m, c, NULL, NULL, &ci->first, &ci->last), st, fail);
        ci->stage = cai_pp_stage_of(&p->spec, rank, c);
        int r = -1, k = -1;
        ci->local_next = ci->local_prev = -1;
        cai_pp_stage_owner(&p->spec, ci->stage + 1, &r, &k);
        if (r == rank) ci->local_next = k;
        cai_pp_stage_owner(&p->spec, ci->stage - 1, &r, &k);
        if (r == rank) ci->local_prev = k;
    }
    p->n_slots = cai_model_slot_count(m);
    CAI_CALL_GOTO(cai_calloc((void **)&p->slot_owner, (size_t)p->n_slots, sizeof *p->slot_owner, "pipeline slots"), st,
                  fail);
    cai_tensor io;
    CAI_CALL_GOTO(cai_model_stage_io(m, &io, NULL, NULL), st, fail);
    p->act_dtype = io.dtype;
    p->act_count = (size_t)cai_tensor_numel(&io);
    p->act_bytes = p->act_count * cai_dtype_size(io.dtype);
    const int tp = cai_mesh_size(mesh, CAI_AXIS_TP);
    p->split_tp = tp > 1 && !cai_model_seq_parallel(m) && p->act_count % (size_t)tp == 0;
    p->wire_count = p->split_tp ? p->act_count / (size_t)tp : p->act_count;
    p->wire_off = p->split_tp ? p->wire_count * (size_t)cai_mesh_rank(mesh, CAI_AXIS_TP) * cai_dtype_size(io.dtype) : 0;
    CAI_CALL_GOTO(find_ties(p), st, fail);
    /* NCCL runs point-to-point in issue order on one stream: posting every
     * receive first would block the sends behind them, so only MPI's
     * host messages are preposted and progressed from the hook */
    p->prepost = p->dev->kind == CAI_DEVICE_HOST;
    CAI_CALL_GOTO(setup_shm(p), st, fail);
    CAI_CALL_GOTO(cai_model_add_hook(m, progress_hook, p), st, fail);
    *out = p;
    return CAI_OK;
fail:
    cai_pipeline_free(p);
    return st;
}

void cai_pipeline_free(cai_pipeline_t *p) {
    if (!p) return;
    for (int i = 0; i < p->n_sends; i++)
        if (p->sends[i]) (void)cai_wait(p->sends[i]);
    cai_free(p->sends);
    /* a receive still posted belongs to a failed step whose peer may never
     * send: waiting here could hang, so its request is left to MPI_Finalize */
    cai_free(p->recv);
    cai_free(p->recv_st);
    if (p->model) (void)cai_model_remove_hook(p->model, progress_hook, p);
    free_bufs(p);
    cai_free(p->note_in);
    cai_free(p->slot_owner);
    for (int i = 0; i < p->n_ties; i++) {
        cai_free(p->tie[i].tmp);
        cai_free(p->tie[i].own);
    }
    cai_free(p->ev);
    free(p->steps);
    cai_pp_schedule_free(p->sched);
    cai_free(p);
}

static cai_status add_send(cai_pipeline_t *p, cai_request_t *r) {
    if (p->n_sends == p->sends_cap) {
        int cap = p->sends_cap ? 2 * p->sends_cap : 16;
        cai_request_t **a = realloc(p->sends, (size_t)cap * sizeof *a);
        if (!a) {
            (void)cai_wait(r);
            return CAI_ERROR(CAI_ERR_NOMEM, "pipeline: %d pending sends", cap);
        }
        p->sends = a;
        p->sends_cap = cap;
    }
    p->sends[p->n_sends++] = r;
    return CAI_OK;
}

static cai_status finish_sends(cai_pipeline_t *p) {
    cai_status st = CAI_OK;
    for (int i = 0; i < p->n_sends; i++) {
        if (!p->sends[i]) continue;
        cai_status one = cai_wait(p->sends[i]);
        if (st == CAI_OK) st = one;
    }
    p->n_sends = 0;
    return st;
}

/* One test of every message in flight: completes what has arrived and lets
 * MPI move the rest along. Errors surface where the message is waited for. */
static cai_status progress(cai_pipeline_t *p) {
    int done = 0;
    for (int i = 0; i < p->n_sends; i++)
        if (p->sends[i]) {
            cai_status st = cai_test(p->sends[i], &done);
            if (done) p->sends[i] = NULL;
            CAI_CALL(st);
        }
    for (int i = 0; i < p->n_recv_cap; i++)
        if (p->recv[i]) {
            cai_status st = cai_test(p->recv[i], &done);
            if (done) {
                p->recv[i] = NULL;
                p->recv_st[i] = st;
            }
        }
    return CAI_OK;
}

static cai_status progress_hook(void *ctx, cai_model_t *m, cai_model_event ev, int unit) {
    (void)m;
    (void)unit;
    cai_pipeline_t *p = ctx;
    /* a split input pass fires only PRE_BACKWARD for its blocks */
    if (!p->prepost || ev == CAI_MODEL_PRE_FORWARD) return CAI_OK;
    return progress(p);
}

/* Post the receive of action i of the list (the RECV's buffer, or its
 * note when the peer copies the data itself). */
static cai_status post_recv(cai_pipeline_t *p, const cai_pp_action *a, int i) {
    const int k = a->mb * p->n_chunks + a->chunk;
    const int tag = cai_pp_action_tag(&p->spec, p->rank, a);
    char *buf = a->op == CAI_PP_RECV_ACT ? p->mb[k].in : p->mb[k].dout;
    p->recv_st[i] = CAI_OK;
    if (p->shm) return cai_irecv(p->mesh, CAI_AXIS_PP, &p->note_in[i], 1, CAI_DTYPE_I32, a->peer, tag, &p->recv[i]);
    return cai_irecv(p->mesh, CAI_AXIS_PP, buf + p->wire_off, p->wire_count, p->act_dtype, a->peer, tag, &p->recv[i]);
}

/* SEND action a of this rank's chunk: the tensor (this rank's wire piece)
 * as the message, or copied into the peer's receive buffer and noted. */
static cai_status post_send(cai_pipeline_t *p, const cai_pp_action *a) {
    const int k = a->mb * p->n_chunks + a->chunk, act = a->op == CAI_PP_SEND_ACT;
    const int tag = cai_pp_action_tag(&p->spec, p->rank, a);
    const char *src = act ? p->mb[k].out : p->mb[k].din;
    cai_request_t *req = NULL;
    if (p->shm) {
        int peer = -1, c = -1;
        cai_pp_stage_owner(&p->spec, p->chunk[a->chunk].stage + (act ? 1 : -1), &peer, &c);
        const size_t at = (2 * (size_t)(a->mb * p->n_chunks + c) + (act ? 0 : 1)) * p->win_stride + p->wire_off;
        memcpy(cai_shared_mem_ptr(p->window, peer) + at, src + p->wire_off,
               p->wire_count * cai_dtype_size(p->act_dtype));
        cai_shared_mem_sync(p->window); /* the copy is visible before the note arrives */
        CAI_CALL(cai_isend(p->mesh, CAI_AXIS_PP, &p->note_out, 1, CAI_DTYPE_I32, a->peer, tag, &req));
    } else {
        CAI_CALL(cai_isend(p->mesh, CAI_AXIS_PP, src + p->wire_off, p->wire_count, p->act_dtype, a->peer, tag, &req));
    }
    CAI_CALL(add_send(p, req));
    return p->prepost ? progress(p) : CAI_OK;
}

/* The tp ranks' pieces of a received tensor, whole on every one of them. */
static cai_status join_pieces(cai_pipeline_t *p, const cai_pp_action *a) {
    if (!p->split_tp) return CAI_OK;
    const int k = a->mb * p->n_chunks + a->chunk;
    char *buf = a->op == CAI_PP_RECV_ACT ? p->mb[k].in : p->mb[k].dout;
    return cai_all_gather(p->mesh, CAI_AXIS_TP, buf + p->wire_off, buf, p->wire_count, p->act_dtype);
}

typedef struct {
    const int32_t *tokens, *targets;
    size_t per;
    float w;
    double loss; /* last stage: sum of microbatch losses */
} run_state;

/* A slot for pair k: a free one, else the one whose owner's backward comes
 * last in the list (that owner recomputes its forward later). */
static cai_status take_slot(cai_pipeline_t *p, int k, int *slot) {
    int best = -1;
    for (int s = 0; s < p->n_slots; s++) {
        const int o = p->slot_owner[s];
        if (o < 0) {
            best = s;
            break;
        }
        /* between a split backward's two passes the slot holds what the weight pass reads */
        if (p->pinned[o]) continue;
        if (best < 0 || p->bwd_at[o] > p->bwd_at[p->slot_owner[best]]) best = s;
    }
    if (best < 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "pipeline: all %d activation slots hold input passes waiting for their weight passes; "
                         "%s needs more slots on pp rank %d (cai_pipeline_slots_needed)",
                         p->n_slots, cai_pp_style_name(p->spec.style), p->rank);
    const int o = p->slot_owner[best];
    if (o >= 0) p->slot_of[o] = -1;
    p->slot_owner[best] = k;
    p->slot_of[k] = best;
    *slot = best;
    return CAI_OK;
}

/* Forward of (mb, chunk) into a slot, from its tokens or saved input. */
static cai_status chunk_forward(cai_pipeline_t *p, run_state *r, int mb, int chunk, float *loss) {
    cai_model_t *m = p->model;
    const int k = mb * p->n_chunks + chunk;
    const chunk_info *c = &p->chunk[chunk];
    int slot = 0;
    CAI_CALL(take_slot(p, k, &slot));
    CAI_CALL(cai_model_select(m, chunk, slot));
    const int32_t *tok = r->tokens + (size_t)mb * r->per;
    if (!c->first) {
        cai_tensor in;
        CAI_CALL(cai_model_stage_io(m, &in, NULL, NULL));
        CAI_CALL(cai_device_copy(p->dev, in.data, p->mb[k].in, p->act_bytes, CAI_COPY_D2D));
    }
    if (c->last) CAI_CALL(cai_model_forward_train(m, tok, r->targets + (size_t)mb * r->per, r->w, loss));
    else CAI_CALL(cai_model_forward(m, tok, NULL, NULL));
    return CAI_OK;
}

/* Action i of this rank's list. */
static cai_status run_action(cai_pipeline_t *p, run_state *r, const cai_pp_action *a, int i) {
    cai_model_t *m = p->model;
    const int mb = a->mb, k = mb * p->n_chunks + a->chunk;
    const chunk_info *c = &p->chunk[a->chunk];
    cai_request_t *req = NULL;
    switch (a->op) {
    case CAI_PP_RECV_ACT:
    case CAI_PP_RECV_GRAD:
        if (!p->prepost) CAI_CALL(post_recv(p, a, i));
        if (p->recv[i]) { /* else completed by a progress test */
            req = p->recv[i];
            p->recv[i] = NULL;
            p->recv_st[i] = cai_wait(req);
        }
        CAI_CALL(p->recv_st[i]);
        if (p->shm) cai_shared_mem_sync(p->window); /* the peer's copy, noted */
        return join_pieces(p, a);
    case CAI_PP_SEND_ACT:
    case CAI_PP_SEND_GRAD: return post_send(p, a);
    case CAI_PP_FORWARD: {
        float l = 0.0f;
        CAI_CALL(chunk_forward(p, r, mb, a->chunk, &l));
        r->loss += l;
        if (!c->last) {
            cai_tensor out;
            CAI_CALL(cai_model_stage_io(m, NULL, &out, NULL));
            /* the next stage on this rank reads it where a RECV would have put it */
            char *to = c->local_next >= 0 ? p->mb[mb * p->n_chunks + c->local_next].in : p->mb[k].out;
            CAI_CALL(cai_device_copy(p->dev, to, out.data, p->act_bytes, CAI_COPY_D2D));
        }
        return CAI_OK;
    }
    case CAI_PP_BACKWARD:
    case CAI_PP_BACKWARD_INPUT: {
        if (p->slot_of[k] < 0) {
            CAI_CALL(chunk_forward(p, r, mb, a->chunk, NULL));
            p->n_recompute++;
        }
        CAI_CALL(cai_model_select(m, a->chunk, p->slot_of[k]));
        cai_tensor ds;
        CAI_CALL(cai_model_stage_io(m, NULL, NULL, &ds));
        if (!c->last) CAI_CALL(cai_device_copy(p->dev, ds.data, p->mb[k].dout, p->act_bytes, CAI_COPY_D2D));
        if (a->op == CAI_PP_BACKWARD) {
            CAI_CALL(cai_model_backward(m, r->w));
            p->slot_owner[p->slot_of[k]] = -1;
            p->slot_of[k] = -1;
        } else {
            CAI_CALL(cai_model_backward_input(m, r->w));
            p->pinned[k] = 1;
        }
        if (!c->first) {
            char *to = c->local_prev >= 0 ? p->mb[mb * p->n_chunks + c->local_prev].dout : p->mb[k].din;
            CAI_CALL(cai_device_copy(p->dev, to, ds.data, p->act_bytes, CAI_COPY_D2D));
        }
        return CAI_OK;
    }
    case CAI_PP_BACKWARD_WEIGHT:
        if (p->slot_of[k] < 0 || !p->pinned[k])
            return CAI_ERROR(CAI_ERR_INTERNAL, "pipeline: the weight pass of microbatch %d chunk %d has no input pass",
                             mb, a->chunk);
        CAI_CALL(cai_model_select(m, a->chunk, p->slot_of[k]));
        CAI_CALL(cai_model_backward_weight(m));
        p->pinned[k] = 0;
        p->slot_owner[p->slot_of[k]] = -1;
        p->slot_of[k] = -1;
        return CAI_OK;
    default:
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "pipeline: action %s is not run by this executor", cai_pp_op_name(a->op));
    }
}

/* Both holders of a tied tensor end with (first stage's + last stage's)
 * contributions, added in that order on both. */
static cai_status reduce_ties(cai_pipeline_t *p) {
    for (int i = 0; i < p->n_ties; i++) {
        cai_tensor grad, *g = &grad;
        if (p->zero) CAI_CALL(cai_zero_param_grad(p->zero, p->tie[i].index, g));
        else
            CAI_CALL(cai_model_param(p->model, cai_registry_param(cai_model_registry(p->model), p->tie[i].index)->name,
                                     NULL, g));
        const size_t n = (size_t)cai_tensor_numel(g);
        float *host = p->tie[i].own;
        cai_status st = cai_device_copy(p->dev, host, g->data, n * sizeof(float), CAI_COPY_D2H);
        cai_request_t *sr = NULL, *rr = NULL;
        /* no action's message is in flight any more: small tags, within any MPI_TAG_UB */
        const int tag = i;
        if (st == CAI_OK) st = cai_device_sync(p->dev);
        if (st == CAI_OK)
            st = cai_irecv(p->mesh, CAI_AXIS_PP, p->tie[i].tmp, n, CAI_DTYPE_F32, p->tie[i].peer, tag, &rr);
        if (st == CAI_OK) st = cai_isend(p->mesh, CAI_AXIS_PP, host, n, CAI_DTYPE_F32, p->tie[i].peer, tag, &sr);
        if (rr) {
            cai_status w = cai_wait(rr);
            st = st == CAI_OK ? w : st;
        }
        if (sr) {
            cai_status w = cai_wait(sr);
            st = st == CAI_OK ? w : st;
        }
        if (st == CAI_OK) {
            const float *a = p->rank < p->tie[i].peer ? host : p->tie[i].tmp;
            const float *b = p->rank < p->tie[i].peer ? p->tie[i].tmp : host;
            for (size_t k = 0; k < n; k++) host[k] = a[k] + b[k];
            st = cai_device_copy(p->dev, g->data, host, n * sizeof(float), CAI_COPY_H2D);
            if (st == CAI_OK) st = cai_device_sync(p->dev);
        }
        CAI_CALL(st);
    }
    return CAI_OK;
}

cai_status cai_pipeline_forward_backward(cai_pipeline_t *p, const int32_t *tokens, const int32_t *targets, int n_micro,
                                         float grad_scale, double *loss) {
    CAI_CHECK_ARG(p && tokens && targets, "cai_pipeline_forward_backward: NULL argument");
    CAI_CHECK_ARG(n_micro >= 1, "cai_pipeline_forward_backward: n_micro=%d must be >= 1", n_micro);
    if (!p->sched || p->spec.microbatches != n_micro) {
        cai_pp_schedule_free(p->sched);
        p->sched = NULL;
        p->spec.microbatches = n_micro;
        int *ub = NULL, flag = 0;
        MPI_Comm_get_attr(cai_mesh_comm(p->mesh, CAI_AXIS_PP), MPI_TAG_UB, &ub, &flag);
        const long long need = 2ll * n_micro * p->spec.pp * p->spec.virtual_stages;
        if (flag && ub && need > *ub)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "pipeline: %d microbatches over %d stages need message tags up to %lld; this MPI allows "
                             "%d (fewer microbatches a step would fit)",
                             n_micro, p->spec.pp * p->spec.virtual_stages, need, *ub);
        CAI_CALL(cai_pp_schedule_build(&p->spec, &p->sched));
        CAI_CALL(cai_pp_schedule_check(p->sched, NULL, NULL));
        /* A slot between a split backward's passes cannot be given up for a
         * recompute: a rank short of slots would stop mid-step with its
         * peers waiting on it, so every rank learns it here. */
        if (p->spec.style == CAI_PP_ZB_H1) {
            const int need = cai_pp_schedule_peak_inflight(p->sched, p->rank);
            int worst[1] = {need > p->n_slots ? p->rank : p->spec.pp}; /* the first rank short of slots */
            CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_PP, worst, worst, 1, CAI_DTYPE_I32, CAI_RED_MIN));
            if (worst[0] < p->spec.pp) {
                cai_pp_schedule_free(p->sched);
                p->sched = NULL;
                return CAI_ERROR(CAI_ERR_INVALID_ARG,
                                 "pipeline: zb-h1 keeps each forward's activations until its weight pass, never "
                                 "recomputed, and pp rank %d has fewer activation slots than its forwards in flight "
                                 "(this rank: %d slots for %d with %d microbatches); size act_slots by "
                                 "cai_pipeline_slots_needed",
                                 worst[0], p->n_slots, need, n_micro);
            }
        }
    }
    const int pairs = n_micro * p->n_chunks;
    CAI_CALL(ensure_bufs(p, pairs));
    cai_model_t *m = p->model;
    int B = 0, T = 0;
    cai_model_shape(m, &B, &T);
    float wdp = 1.0f; /* with an engine the loss gradient carries 1/dp and the reduction sums */
    if (p->zero) CAI_CALL(cai_zero_grads_begin(p->zero, &wdp));
    else if (cai_model_external_params(m))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "pipeline: the model's parameters are held by a ZeRO engine; attach it with "
                         "cai_pipeline_set_zero");
    else CAI_CALL(cai_model_zero_grad(m));
    run_state r = {.tokens = tokens,
                   .targets = targets,
                   .per = (size_t)B * (size_t)T,
                   .w = grad_scale * wdp / (float)n_micro};
    const cai_pp_action *acts = cai_pp_schedule_actions(p->sched, p->rank);
    const int n = cai_pp_schedule_len(p->sched, p->rank);
    for (int s = 0; s < p->n_slots; s++) p->slot_owner[s] = -1;
    for (int k = 0; k < pairs; k++) {
        p->slot_of[k] = -1;
        p->pinned[k] = 0;
    }
    /* a slot is free again after the backward, or a split one's weight pass */
    for (int i = 0; i < n; i++)
        if (acts[i].op == CAI_PP_BACKWARD || acts[i].op == CAI_PP_BACKWARD_WEIGHT)
            p->bwd_at[acts[i].mb * p->n_chunks + acts[i].chunk] = i;
    p->n_recompute = 0;
    if (p->n_recv_cap < n) {
        cai_free(p->recv);
        cai_free(p->recv_st);
        p->recv = NULL;
        p->recv_st = NULL;
        p->n_recv_cap = 0;
        CAI_CALL(cai_calloc((void **)&p->recv, (size_t)n, sizeof *p->recv, "pipeline receives"));
        CAI_CALL(cai_calloc((void **)&p->recv_st, (size_t)n, sizeof *p->recv_st, "pipeline receive states"));
        cai_free(p->note_in);
        p->note_in = NULL;
        CAI_CALL(cai_calloc((void **)&p->note_in, (size_t)n, sizeof *p->note_in, "pipeline receive notes"));
        p->n_recv_cap = n;
    }
    for (int i = 0; i < p->n_recv_cap; i++) p->recv[i] = NULL;
    if (p->prepost)
        for (int i = 0; i < n; i++)
            if (acts[i].op == CAI_PP_RECV_ACT || acts[i].op == CAI_PP_RECV_GRAD) CAI_CALL(post_recv(p, &acts[i], i));
    cai_status st = CAI_OK;
    if (p->tracing) {
        /* a common start: the stages' clocks are compared after this barrier */
        CAI_CALL(cai_barrier(p->mesh, CAI_AXIS_PP));
        p->t0 = cai_time_now();
        p->n_ev = 0;
        if (p->cap_ev < n) {
            cai_free(p->ev);
            p->ev = NULL;
            p->cap_ev = 0;
            CAI_CALL(cai_malloc((void **)&p->ev, (size_t)n * 5 * sizeof(double), "pipeline trace"));
            p->cap_ev = n;
        }
    }
    for (int i = 0; i < n && st == CAI_OK; i++) {
        const int compute = acts[i].op == CAI_PP_FORWARD || acts[i].op == CAI_PP_BACKWARD ||
                            acts[i].op == CAI_PP_BACKWARD_INPUT || acts[i].op == CAI_PP_BACKWARD_WEIGHT;
        const double a = p->tracing && compute ? cai_time_now() : 0;
        st = run_action(p, &r, &acts[i], i);
        if (p->tracing && compute && st == CAI_OK) {
            /* the device's work counts where it ends: wait for it */
            st = cai_device_sync(p->dev);
            double *e = p->ev + 5 * p->n_ev++;
            e[0] = acts[i].op;
            e[1] = acts[i].mb;
            e[2] = acts[i].chunk;
            e[3] = a - p->t0;
            e[4] = cai_time_now() - p->t0;
        }
        if (st != CAI_OK) {
            char lb[48];
            cai_error_push(__FILE__, __LINE__, __func__,
                           cai_pp_action_label(&acts[i], p->spec.virtual_stages, lb, sizeof lb));
        }
    }
    cai_status fs = finish_sends(p);
    CAI_CALL(st);
    CAI_CALL(fs);
    if (p->tracing) {
        if (p->n_steps == p->cap_steps) {
            const int cap = p->cap_steps ? 2 * p->cap_steps : 16;
            double *grown = realloc(p->steps, (size_t)cap * 3 * sizeof *grown);
            if (!grown) return CAI_ERROR(CAI_ERR_NOMEM, "pipeline trace: %d steps", cap);
            p->steps = grown;
            p->cap_steps = cap;
        }
        double *s = p->steps + 3 * p->n_steps++;
        s[0] = p->n_ev ? p->ev[3] : 0;
        s[1] = s[2] = 0;
        for (int e = 0; e < p->n_ev; e++) {
            s[1] = fmax(s[1], p->ev[5 * e + 4]);
            s[2] += p->ev[5 * e + 4] - p->ev[5 * e + 3];
        }
    }
    CAI_CALL(reduce_ties(p));
    /* the data-parallel replicas of this stage average their gradients */
    if (p->zero) {
        CAI_CALL(cai_zero_grads_end(p->zero));
    } else if (cai_mesh_size(p->mesh, CAI_AXIS_DP) > 1) {
        cai_tensor g;
        cai_model_flat(m, NULL, &g, NULL);
        CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_DP, g.data, g.data, (size_t)cai_tensor_numel(&g), CAI_DTYPE_F32,
                               CAI_RED_AVG));
    }
    /* the loss lives on the last stage; every rank reports the replicas' mean */
    double sum = p->last ? r.loss / n_micro : 0.0;
    CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_PP, &sum, &sum, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    if (cai_mesh_size(p->mesh, CAI_AXIS_DP) > 1)
        CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_DP, &sum, &sum, 1, CAI_DTYPE_F64, CAI_RED_AVG));
    if (loss) *loss = sum;
    return CAI_OK;
}

cai_status cai_pipeline_eval(cai_pipeline_t *p, const int32_t *tokens, const int32_t *targets, int n_micro,
                             double *loss) {
    CAI_CHECK_ARG(p && tokens && targets && loss, "cai_pipeline_eval: NULL argument");
    CAI_CHECK_ARG(n_micro >= 1, "cai_pipeline_eval: n_micro=%d must be >= 1", n_micro);
    cai_model_t *m = p->model;
    int B = 0, T = 0;
    cai_model_shape(m, &B, &T);
    const size_t per = (size_t)B * (size_t)T;
    const int S = p->spec.pp * p->n_chunks;
    double sum = 0;
    /* Microbatch k's activations travel down the stages in order (round the
     * ranks, or down and up zb-v's V) while the next one starts on the
     * first stage; a rank's chunks are in stage order. Tags name the
     * receiving stage; between one pair of ranks MPI does not overtake. */
    for (int k = 0; k < n_micro; k++)
        for (int c = 0; c < p->n_chunks; c++) {
            const chunk_info *ci = &p->chunk[c];
            int prev = -1, next = -1;
            cai_pp_stage_owner(&p->spec, ci->stage - 1, &prev, NULL);
            cai_pp_stage_owner(&p->spec, ci->stage + 1, &next, NULL);
            cai_tensor in, out;
            CAI_CALL(cai_model_select(m, c, 0));
            CAI_CALL(cai_model_stage_io(m, &in, &out, NULL));
            if (!ci->first && ci->local_prev < 0)
                CAI_CALL(cai_recv(p->mesh, CAI_AXIS_PP, in.data, p->act_count, p->act_dtype, prev,
                                  (k * S + ci->stage) % 4096));
            float l = 0;
            CAI_CALL(cai_model_forward(m, tokens + (size_t)k * per, ci->last ? targets + (size_t)k * per : NULL,
                                       ci->last ? &l : NULL));
            sum += l;
            if (ci->last) continue;
            if (ci->local_next >= 0) { /* the bottom of the V: the next stage's input is here */
                cai_tensor next_in;
                CAI_CALL(cai_model_select(m, ci->local_next, 0));
                CAI_CALL(cai_model_stage_io(m, &next_in, NULL, NULL));
                CAI_CALL(cai_device_copy(p->dev, next_in.data, out.data, p->act_bytes, CAI_COPY_D2D));
                continue;
            }
            CAI_CALL(cai_device_sync(p->dev));
            CAI_CALL(cai_send(p->mesh, CAI_AXIS_PP, out.data, p->act_count, p->act_dtype, next,
                              (k * S + ci->stage + 1) % 4096));
        }
    double mean = p->last ? sum / n_micro : 0.0;
    CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_PP, &mean, &mean, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    *loss = mean; /* this replica's: the caller averages over dp as for any evaluation */
    return CAI_OK;
}

cai_status cai_pipeline_slots_needed(const cai_pp_spec *spec, int rank, int *slots) {
    CAI_CHECK_ARG(spec && slots, "cai_pipeline_slots_needed: NULL argument");
    CAI_CHECK_ARG(rank >= 0 && rank < spec->pp, "cai_pipeline_slots_needed: rank %d of pp=%d", rank, spec->pp);
    cai_pp_schedule *s = NULL;
    CAI_CALL(cai_pp_schedule_build(spec, &s));
    *slots = cai_pp_schedule_peak_inflight(s, rank);
    cai_pp_schedule_free(s);
    return CAI_OK;
}

int cai_pipeline_recomputes(const cai_pipeline_t *p) { return p ? p->n_recompute : 0; }

cai_status cai_pipeline_set_zero(cai_pipeline_t *p, cai_zero_t *z) {
    CAI_CHECK_ARG(p, "cai_pipeline_set_zero: NULL pipeline");
    if (z) {
        const cai_zero_config *c = cai_zero_get_config(z);
        if (cai_zero_model(z) != p->model)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_pipeline_set_zero: the engine holds another model");
        if (c->stage >= 2 || c->offload)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "pipeline: ZeRO stage %d%s under pipeline parallelism: the executor composes with stages "
                             "0 and 1 without offload (stage 2/3 reduce and gather per microbatch inside the "
                             "engine's own loop)",
                             c->stage, c->offload ? " with offload" : "");
    }
    p->zero = z;
    return CAI_OK;
}
cai_zero_t *cai_pipeline_zero(const cai_pipeline_t *p) { return p ? p->zero : NULL; }

void cai_pipeline_set_trace(cai_pipeline_t *p, int on) {
    if (!p) return;
    if (on && !p->tracing) p->n_steps = 0;
    p->tracing = on != 0;
}

/* 1 - busy / (pp x span) summed over the traced steps after the first (the
 * first alone when it is the only one): the first step pays the page
 * faults of buffers touched for the first time. Collective over pp. */
static cai_status steady_bubble(cai_pipeline_t *p, double *bubble) {
    const int pp = p->spec.pp, n = p->n_steps;
    int lo = n, hi = n;
    CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_PP, &lo, &lo, 1, CAI_DTYPE_I32, CAI_RED_MIN));
    CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_PP, &hi, &hi, 1, CAI_DTYPE_I32, CAI_RED_MAX));
    if (lo != hi || n == 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "pipeline trace: the pp ranks traced %d to %d steps", lo, hi);
    double *all = NULL;
    CAI_CALL(cai_calloc((void **)&all, (size_t)pp * (size_t)n * 3, sizeof *all, "pipeline step trace"));
    cai_status st = cai_all_gather(p->mesh, CAI_AXIS_PP, p->steps, all, (size_t)n * 3, CAI_DTYPE_F64);
    double busy = 0, span = 0;
    for (int s = n > 1 ? 1 : 0; st == CAI_OK && s < n; s++) {
        double first = 0, last = 0;
        for (int r = 0; r < pp; r++) {
            const double *e = all + ((size_t)r * n + s) * 3;
            first = r == 0 || e[0] < first ? e[0] : first;
            last = fmax(last, e[1]);
            busy += e[2];
        }
        span += (double)pp * (last - first);
    }
    cai_free(all);
    CAI_CALL(st);
    *bubble = span > 0 ? 1.0 - busy / span : 0.0;
    return CAI_OK;
}

int cai_pipeline_traced_steps(const cai_pipeline_t *p) { return p ? p->n_steps : 0; }

const char *cai_pipeline_transport(const cai_pipeline_t *p) {
    if (!p) return "?";
    if (p->shm) return "node-shared memory";
    return p->dev->kind == CAI_DEVICE_HOST ? "MPI messages" : "device point-to-point";
}

cai_status cai_pipeline_trace(cai_pipeline_t *p, const char *path, double *measured, double *predicted,
                              double *predicted_measured) {
    CAI_CHECK_ARG(p, "cai_pipeline_trace: NULL pipeline");
    CAI_CHECK_ARG(p->tracing && p->sched, "cai_pipeline_trace: no traced step (cai_pipeline_set_trace, then a step)");
    const int pp = p->spec.pp;
    int *counts = NULL;
    double *all = NULL;
    cai_pp_trace_event *evs = NULL;
    char(*names)[32] = NULL;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_calloc((void **)&counts, (size_t)pp, sizeof *counts, "pipeline trace counts"), st, done);
    int mine = p->n_ev;
    CAI_CALL_GOTO(cai_all_gather(p->mesh, CAI_AXIS_PP, &mine, counts, 1, CAI_DTYPE_I32), st, done);
    int most = 0, total = 0;
    for (int r = 0; r < pp; r++) {
        most = counts[r] > most ? counts[r] : most;
        total += counts[r];
    }
    /* equal blocks of the longest list; the padding is never read */
    CAI_CALL_GOTO(cai_calloc((void **)&all, (size_t)pp * (size_t)most * 5 + 5, sizeof *all, "pipeline trace"), st,
                  done);
    memcpy(all + (size_t)p->rank * most * 5, p->ev, (size_t)p->n_ev * 5 * sizeof(double));
    CAI_CALL_GOTO(cai_all_gather(p->mesh, CAI_AXIS_PP, all + (size_t)p->rank * most * 5, all, (size_t)most * 5,
                                 CAI_DTYPE_F64),
                  st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&evs, (size_t)total + 1, sizeof *evs, "pipeline trace events"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&names, (size_t)total + 1, sizeof *names, "pipeline trace names"), st, done);
    int k = 0;
    double sum[CAI_PP_OP_COUNT] = {0}, n_op[CAI_PP_OP_COUNT] = {0};
    for (int r = 0; r < pp; r++)
        for (int i = 0; i < counts[r]; i++, k++) {
            const double *e = all + ((size_t)r * most + i) * 5;
            const int op = (int)e[0];
            if (op >= 0 && op < CAI_PP_OP_COUNT) {
                sum[op] += e[4] - e[3];
                n_op[op] += 1;
            }
            const cai_pp_action a = {.op = (cai_pp_op)e[0], .mb = (int)e[1], .chunk = (int)e[2], .peer = -1};
            cai_pp_action_label(&a, p->n_chunks, names[k], sizeof names[k]);
            evs[k] = (cai_pp_trace_event){.rank = r,
                                          .name = names[k],
                                          .cat = "compute",
                                          .start = e[3],
                                          .end = e[4],
                                          .mb = a.mb,
                                          .chunk = p->n_chunks > 1 ? a.chunk : -1};
        }
    double bubble = 0;
    CAI_CALL_GOTO(steady_bubble(p, &bubble), st, done);
    if (measured) *measured = bubble;
    if (predicted) {
        cai_pp_stats ps;
        CAI_CALL_GOTO(cai_pp_schedule_check(p->sched, NULL, &ps), st, done);
        *predicted = ps.bubble;
    }
    if (predicted_measured) {
        /* the schedule at the step's mean compute times (a fused backward
         * costs b + w), no transfer time: what the executor adds is the gap */
#define MEAN(op) (n_op[op] > 0 ? sum[op] / n_op[op] : 0.0)
        cai_pp_costs c = {.f = MEAN(CAI_PP_FORWARD),
                          .b = n_op[CAI_PP_BACKWARD] > 0 ? MEAN(CAI_PP_BACKWARD) : MEAN(CAI_PP_BACKWARD_INPUT),
                          .w = MEAN(CAI_PP_BACKWARD_WEIGHT),
                          .comm = 0};
#undef MEAN
        cai_pp_stats ps;
        CAI_CALL_GOTO(cai_pp_schedule_check(p->sched, c.f > 0 ? &c : NULL, &ps), st, done);
        *predicted_measured = ps.bubble;
    }
    if (path && p->rank == 0) CAI_CALL_GOTO(cai_pp_write_chrome_trace(path, evs, (size_t)total), st, done);
done:
    cai_free(counts);
    cai_free(all);
    cai_free(evs);
    cai_free(names);
    return st;
}

cai_mesh_t *cai_pipeline_mesh(const cai_pipeline_t *p) { return p->mesh; }
cai_model_t *cai_pipeline_model(const cai_pipeline_t *p) { return p->model; }
