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

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The traced steps the statistics are taken over (the last ones): enough
 * for a median that one disturbed step does not move. */
#define TRACE_KEEP CAI_PP_TRACE_KEEP
/* values a traced compute keeps: op, mb, chunk, start, end, the thread's
 * processor time over it (what it ran; the rest of its span it waited
 * for a processor), 1 if its real compute outlasted the equal-compute
 * target (CAI_PP_EQUAL_COMPUTE_US) */
#define EV 7

typedef struct {
    char *in;   /* chunk input (not the first stage) */
    char *out;  /* chunk output being sent (not the last stage; MPI transport) */
    char *dout; /* gradient of the output received (not the last stage) */
    char *din;  /* gradient of the input being sent (not the first stage; MPI transport) */
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
    /* Host, every rank of the node with processors of its own: a RECV polls
     * before the watchdog's wait, whose naps cost a long wait 0.2-0.3 ms to
     * wake from (docs/pipeline.md, "Measured timelines"). */
    int poll_waits;
    /* Host, every pp rank on this node (CAI_PP_HOST_TRANSPORT=shm): each
     * pair's in and dout live in a node-shared window; a sender copies the
     * tensor straight into its peer's and sends a one-word note (eager: it
     * needs no progress from the sender) that the RECV waits for. */
    int shm;
    cai_shared_mem_t *window; /* the pairs' receive buffers, every pp rank's mapped here */
    size_t win_stride;        /* one buffer, 64-byte aligned */
    int32_t note_out, *note_in;
    /* Tracing (cai_pipeline_trace): the compute actions of the last
     * TRACE_KEEP traced steps, one block a step of ev_per events (EV values
     * each) in list order, times on pp rank 0's clock (this
     * rank's minus clock_off, estimated at each traced step's start). */
    int tracing;
    double clock_off;
    double *ev;
    double *ev_t0; /* per block: the step's start (the barrier's exit) */
    int *ev_n;     /* per block: events recorded */
    int ev_per;    /* this rank's compute actions a step */
    int n_steps;   /* traced steps since tracing was turned on or the schedule changed */
    /* test hook CAI_PP_EQUAL_COMPUTE_US (0: off): each compute action is
     * padded by sleeping to this many microseconds per cost unit, so every
     * stage's actions take the same time (docs/pipeline.md, "Equal compute") */
    long long equal_us;
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
        if (p->mb[i].out) cai_device_dealloc(p->dev, p->mb[i].out);
        if (p->mb[i].din) cai_device_dealloc(p->dev, p->mb[i].din);
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
        /* under shm the peers' copies go straight into the window: no buffers to send from */
        if (!c->first && !p->shm) {
            CAI_CALL(cai_device_alloc(p->dev, p->act_bytes, "pipeline stage input", (void **)&b->in));
            CAI_CALL(cai_device_alloc(p->dev, p->act_bytes, "pipeline input gradient", (void **)&b->din));
        }
        if (!c->last && !p->shm) {
            CAI_CALL(cai_device_alloc(p->dev, p->act_bytes, "pipeline stage output", (void **)&b->out));
            CAI_CALL(cai_device_alloc(p->dev, p->act_bytes, "pipeline output gradient", (void **)&b->dout));
        }
    }
    return CAI_OK;
}

/* Host pipelines use node-shared boundaries when the knob asks for them
 * and every pp rank shares one node (agreed by a probe allocation). */
cai_status cai_pipeline_boundaries_shared(cai_mesh_t *mesh, const cai_device_t *dev, int *shared) {
    CAI_CHECK_ARG(mesh && dev && shared, "cai_pipeline_boundaries_shared: NULL argument");
    *shared = 0;
    const char *mode = NULL;
    CAI_CALL(cai_knob_str("CAI_PP_HOST_TRANSPORT", &mode));
    /* the knob is the same on every rank; the device kind is too */
    if (dev->kind != CAI_DEVICE_HOST || strcmp(mode, "shm") != 0) return CAI_OK;
    cai_shared_mem_t *probe = NULL;
    cai_status st = cai_shared_mem_create(mesh, CAI_AXIS_PP, 64, &probe);
    if (st == CAI_ERR_UNSUPPORTED) {
        cai_error_clear();
        return CAI_OK;
    }
    CAI_CALL(st);
    cai_shared_mem_free(probe);
    *shared = 1;
    return CAI_OK;
}

/* Whether a host RECV polls: when this node's ranks, each with its
 * threads, fit its online processors (a polling rank then takes no
 * processor a computing one needs). The node's ranks: the job's, where the
 * launcher says (Open MPI, MPICH's Hydra; a mesh may be part of the job),
 * and at least the mesh's. Collective over the mesh's ranks. */
static cai_status setup_polling(cai_pipeline_t *p) {
    if (!p->prepost) return CAI_OK;
    MPI_Comm node = MPI_COMM_NULL;
    if (MPI_Comm_split_type(cai_mesh_comm(p->mesh, CAI_AXIS_WORLD), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return CAI_ERROR(CAI_ERR_MPI, "pipeline: MPI_Comm_split_type (this node's ranks) failed");
    int ranks = 0;
    MPI_Comm_size(node, &ranks);
    MPI_Comm_free(&node);
    static const char *const launcher[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof launcher / sizeof launcher[0]; i++) {
        const char *v = getenv(launcher[i]);
        const long n = v ? strtol(v, NULL, 10) : 0;
        if (n > ranks && n < 1 << 20) ranks = (int)n;
    }
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const int threads = p->dev->num_threads > 0 ? p->dev->num_threads : 1;
    p->poll_waits = cpus > 0 && (long)ranks * threads <= cpus;
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
    CAI_CALL_GOTO(cai_pipeline_boundaries_shared(mesh, p->dev, &p->shm), st, fail);
    CAI_CALL_GOTO(setup_polling(p), st, fail);
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
    cai_free(p->ev_t0);
    cai_free(p->ev_n);
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

/* The wait of receive i. Polling (the processor yielded to whatever else
 * is runnable on it) notices the data within microseconds; after a second
 * the watchdog's wait takes over, which reports a peer that never sends. */
static cai_status wait_recv(cai_pipeline_t *p, int i) {
    cai_request_t *req = p->recv[i];
    p->recv[i] = NULL;
    if (p->poll_waits) {
        const double t0 = cai_time_now();
        do {
            int done = 0;
            cai_status st = cai_test(req, &done);
            if (done) return st; /* the request is freed */
            CAI_CALL(st);
            sched_yield();
        } while (cai_time_now() - t0 < 1.0);
    }
    return cai_wait(req);
}

/* Where chunk `chunk`'s output (act) or input gradient (!act) of
 * microbatch mb goes: the next (previous) chunk's buffer on this rank at the
 * bottom of zb-v's V, the consumer's receive buffer in the node-shared
 * window (this rank's wire piece only; the SEND then just notes it), or the
 * buffer the SEND sends from. One copy whichever it is. */
static cai_status hand_over(cai_pipeline_t *p, int chunk, int mb, int act, const char *src) {
    const chunk_info *c = &p->chunk[chunk];
    const int local = act ? c->local_next : c->local_prev;
    if (local >= 0) {
        mb_bufs *b = &p->mb[mb * p->n_chunks + local];
        return cai_device_copy(p->dev, act ? b->in : b->dout, src, p->act_bytes, CAI_COPY_D2D);
    }
    if (p->shm) {
        int peer = -1, pc = -1;
        cai_pp_stage_owner(&p->spec, c->stage + (act ? 1 : -1), &peer, &pc);
        const size_t at = (2 * (size_t)(mb * p->n_chunks + pc) + (act ? 0 : 1)) * p->win_stride + p->wire_off;
        memcpy(cai_shared_mem_ptr(p->window, peer) + at, src + p->wire_off,
               p->wire_count * cai_dtype_size(p->act_dtype));
        return CAI_OK;
    }
    mb_bufs *b = &p->mb[mb * p->n_chunks + chunk];
    return cai_device_copy(p->dev, act ? b->out : b->din, src, p->act_bytes, CAI_COPY_D2D);
}

/* SEND action a of this rank's chunk: the tensor (this rank's wire piece)
 * as the message, or a note that hand_over put it in the peer's receive
 * buffer. */
static cai_status post_send(cai_pipeline_t *p, const cai_pp_action *a) {
    const int k = a->mb * p->n_chunks + a->chunk, act = a->op == CAI_PP_SEND_ACT;
    const int tag = cai_pp_action_tag(&p->spec, p->rank, a);
    cai_request_t *req = NULL;
    if (p->shm) {
        cai_shared_mem_sync(p->window); /* the copy is visible before the note arrives */
        CAI_CALL(cai_isend(p->mesh, CAI_AXIS_PP, &p->note_out, 1, CAI_DTYPE_I32, a->peer, tag, &req));
    } else {
        const char *src = act ? p->mb[k].out : p->mb[k].din;
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
    switch (a->op) {
    case CAI_PP_RECV_ACT:
    case CAI_PP_RECV_GRAD:
        if (!p->prepost) CAI_CALL(post_recv(p, a, i));
        if (p->recv[i]) p->recv_st[i] = wait_recv(p, i); /* else completed by a progress test */
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
            CAI_CALL(hand_over(p, a->chunk, mb, 1, out.data));
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
        if (!c->first) CAI_CALL(hand_over(p, a->chunk, mb, 0, ds.data));
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

/* Seconds this thread has run on a processor. */
static double thread_time(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int is_compute(cai_pp_op op) {
    return op == CAI_PP_FORWARD || op == CAI_PP_BACKWARD || op == CAI_PP_BACKWARD_INPUT || op == CAI_PP_BACKWARD_WEIGHT;
}

/* An action's cost in the schedule's unit costs (f = b = w = 1, a fused
 * backward b + w: schedule.c's duration), the units CAI_PP_EQUAL_COMPUTE_US
 * scales, so the padded run is the schedule's textbook case. */
static double compute_units(cai_pp_op op) { return op == CAI_PP_BACKWARD ? 2.0 : 1.0; }

/* Sleep until `deadline` (cai_time_now's clock, CLOCK_MONOTONIC): a rank
 * that waits gives the processors to the others. 1 if the deadline had
 * already passed (the real compute took longer than the target). */
static int pad_until(double deadline) {
    if (cai_time_now() >= deadline) return 1;
    struct timespec ts;
    ts.tv_sec = (time_t)floor(deadline);
    ts.tv_nsec = (long)((deadline - floor(deadline)) * 1e9);
    if (ts.tv_nsec > 999999999L) ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    return 0;
}

/* 0 forward, 1 fused backward or input pass, 2 weight pass */
static int compute_kind(cai_pp_op op) { return op == CAI_PP_FORWARD ? 0 : op == CAI_PP_BACKWARD_WEIGHT ? 2 : 1; }

/* This rank's clock minus pp rank 0's, from round trips with rank 0: of a
 * few, the shortest brackets rank 0's reading most tightly, and the offset is
 * the reading against the trip's midpoint (within half the trip, a few
 * microseconds on one node, where both read the same clock). Collective over
 * pp; no receive of the step may be posted yet (tag 0). */
static cai_status clock_offset(cai_pipeline_t *p, double *off) {
    enum { ROUNDS = 8 };
    *off = 0;
    for (int r = 1; r < p->spec.pp; r++) {
        if (p->rank == 0) {
            double best = INFINITY, o = 0;
            for (int k = 0; k < ROUNDS; k++) {
                double t = cai_time_now(), theirs = 0;
                CAI_CALL(cai_send(p->mesh, CAI_AXIS_PP, &t, 1, CAI_DTYPE_F64, r, 0));
                CAI_CALL(cai_recv(p->mesh, CAI_AXIS_PP, &theirs, 1, CAI_DTYPE_F64, r, 0));
                const double back = cai_time_now();
                if (back - t < best) {
                    best = back - t;
                    o = theirs - 0.5 * (t + back);
                }
            }
            CAI_CALL(cai_send(p->mesh, CAI_AXIS_PP, &o, 1, CAI_DTYPE_F64, r, 0));
        } else if (p->rank == r) {
            for (int k = 0; k < ROUNDS; k++) {
                double t = 0;
                CAI_CALL(cai_recv(p->mesh, CAI_AXIS_PP, &t, 1, CAI_DTYPE_F64, 0, 0));
                t = cai_time_now();
                CAI_CALL(cai_send(p->mesh, CAI_AXIS_PP, &t, 1, CAI_DTYPE_F64, 0, 0));
            }
            CAI_CALL(cai_recv(p->mesh, CAI_AXIS_PP, off, 1, CAI_DTYPE_F64, 0, 0));
        }
    }
    return CAI_OK;
}

/* A traced step's start: its block of the trace, the clocks compared and a
 * common start (the barrier). Collective over pp, before any receive of the
 * step is posted. */
static cai_status trace_begin(cai_pipeline_t *p, const cai_pp_action *acts, int n, double **block) {
    int per = 0;
    for (int i = 0; i < n; i++) per += is_compute(acts[i].op);
    if (per != p->ev_per || !p->ev) {
        cai_free(p->ev);
        p->ev = NULL;
        p->ev_per = 0;
        CAI_CALL(cai_malloc((void **)&p->ev, (size_t)TRACE_KEEP * (size_t)(per ? per : 1) * EV * sizeof(double),
                            "pipeline trace"));
        p->ev_per = per;
        p->n_steps = 0;
    }
    if (!p->ev_t0) CAI_CALL(cai_calloc((void **)&p->ev_t0, TRACE_KEEP, sizeof *p->ev_t0, "pipeline trace starts"));
    if (!p->ev_n) CAI_CALL(cai_calloc((void **)&p->ev_n, TRACE_KEEP, sizeof *p->ev_n, "pipeline trace counts"));
    CAI_CALL(clock_offset(p, &p->clock_off));
    CAI_CALL(cai_barrier(p->mesh, CAI_AXIS_PP));
    const int b = p->n_steps % TRACE_KEEP;
    p->ev_t0[b] = cai_time_now() - p->clock_off;
    p->ev_n[b] = 0;
    *block = p->ev + (size_t)b * (size_t)p->ev_per * EV;
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
        p->n_steps = 0; /* steps of another schedule are not compared */
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
#if CAI_TEST_HOOKS
    CAI_CALL(cai_knob_int("CAI_PP_EQUAL_COMPUTE_US", &p->equal_us));
#endif
    double *trace = NULL; /* this step's events; NULL when not tracing */
    if (p->tracing) CAI_CALL(trace_begin(p, acts, n, &trace));
    if (p->prepost)
        for (int i = 0; i < n; i++)
            if (acts[i].op == CAI_PP_RECV_ACT || acts[i].op == CAI_PP_RECV_GRAD) CAI_CALL(post_recv(p, &acts[i], i));
    cai_status st = CAI_OK;
    int traced = 0;
    for (int i = 0; i < n && st == CAI_OK; i++) {
        const int compute = is_compute(acts[i].op), timed = compute && (trace || p->equal_us > 0);
        const double a = timed ? cai_time_now() : 0, cpu = trace && compute ? thread_time() : 0;
        st = run_action(p, &r, &acts[i], i);
        /* the device's work counts where it ends: wait for it */
        if (timed && st == CAI_OK) st = cai_device_sync(p->dev);
        const int over = timed && st == CAI_OK && p->equal_us > 0 &&
                         pad_until(a + 1e-6 * (double)p->equal_us * compute_units(acts[i].op));
        if (trace && compute && st == CAI_OK) {
            double *e = trace + EV * traced++;
            e[0] = acts[i].op;
            e[1] = acts[i].mb;
            e[2] = acts[i].chunk;
            e[3] = a - p->clock_off;
            e[4] = cai_time_now() - p->clock_off;
            e[5] = thread_time() - cpu;
            e[6] = over;
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
    if (trace) p->ev_n[p->n_steps++ % TRACE_KEEP] = traced;
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

int cai_pipeline_traced_steps(const cai_pipeline_t *p) { return p ? p->n_steps : 0; }

const char *cai_pipeline_transport(const cai_pipeline_t *p) {
    if (!p) return "?";
    if (p->shm) return "node-shared memory";
    return p->dev->kind == CAI_DEVICE_HOST ? "MPI messages" : "device point-to-point";
}

size_t cai_pipeline_boundary_bytes(const cai_pipeline_t *p) {
    if (!p) return 0;
    size_t bytes = p->shm ? 2 * (size_t)p->mb_cap * p->win_stride : 0;
    for (int i = 0; i < p->mb_cap; i++)
        if (!p->shm)
            bytes += p->act_bytes * (size_t)(!!p->mb[i].in + !!p->mb[i].out + !!p->mb[i].dout + !!p->mb[i].din);
    for (int t = 0; t < p->n_ties; t++) {
        cai_param_shard sa;
        if (cai_registry_shard(cai_model_registry(p->model), p->tie[t].index, cai_model_view(p->model), &sa) ==
            CAI_OK)
            bytes += 2 * (size_t)sa.local_numel * sizeof(float);
    }
    return bytes;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorted in place); 0 for none. */
static double median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Every rank's kept steps: per rank, per kept step in the order they ran,
 * [start, events, most x EV event values]. */
typedef struct {
    int kept, most, first_steady;
    size_t vals; /* values a step */
    double *all;
} trace_set;

static const double *trace_step(const trace_set *t, int rank, int j) {
    return t->all + ((size_t)rank * (size_t)t->kept + (size_t)j) * t->vals;
}

/* Collective over pp. The first traced step pays the page faults of buffers
 * touched for the first time: it is left out of the statistics while kept
 * (unless it is the only one). */
static cai_status trace_gather(cai_pipeline_t *p, trace_set *t) {
    const int n = p->n_steps;
    int lo = n, hi = n, most = p->ev_per;
    CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_PP, &lo, &lo, 1, CAI_DTYPE_I32, CAI_RED_MIN));
    CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_PP, &hi, &hi, 1, CAI_DTYPE_I32, CAI_RED_MAX));
    CAI_CALL(cai_allreduce(p->mesh, CAI_AXIS_PP, &most, &most, 1, CAI_DTYPE_I32, CAI_RED_MAX));
    if (lo != hi || n == 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "pipeline trace: the pp ranks traced %d to %d steps", lo, hi);
    t->kept = n < TRACE_KEEP ? n : TRACE_KEEP;
    t->most = most;
    t->first_steady = n == t->kept && t->kept > 1;
    t->vals = 2 + EV * (size_t)most;
    const size_t mine = (size_t)t->kept * t->vals;
    CAI_CALL(cai_calloc((void **)&t->all, mine * (size_t)p->spec.pp, sizeof *t->all, "pipeline step trace"));
    double *own = t->all + (size_t)p->rank * mine;
    for (int j = 0; j < t->kept; j++) {
        const int b = (n - t->kept + j) % TRACE_KEEP;
        double *d = own + (size_t)j * t->vals;
        d[0] = p->ev_t0[b];
        d[1] = p->ev_n[b];
        memcpy(d + 2, p->ev + (size_t)b * (size_t)p->ev_per * EV, (size_t)p->ev_n[b] * EV * sizeof(double));
    }
    return cai_all_gather(p->mesh, CAI_AXIS_PP, own, t->all, mine, CAI_DTYPE_F64);
}

/* Scratch for one step's analysis: each rank's action times in list order
 * (for the replay) and where each (kind, mb, chunk) compute sits in its
 * events (kind 0 forward, 1 fused backward or input pass). */
typedef struct {
    double **dur, **cpu;
    double *dur_block, *cpu_block, *tmp;
    int *at;
    double *lat; /* waited-for transfers, every step's */
    int n_lat, cap_lat;
} step_scratch;

/* Step j: out[0] its bubble (1 - busy / (pp x span), span from the first
 * compute's start to the last one's end over the ranks), [1] the schedule
 * replayed at its action times, [2] the spread of the ranks' starts, [3] the
 * largest coefficient of variation of one kind of compute over its
 * actions, [4] the replay at the actions' processor times, [5] the share of
 * the compute's span its rank waited for a processor, [6] the replay with
 * each stage's actions of a kind at their median; the latencies of the
 * transfers a consumer waited for (its previous action ended before the
 * producer did: the consumer's start minus the producer's end) go to lat. */
/* Each compute of rank r's list takes the median time of its stage's
 * (chunk's) actions of its kind in the step: the step's stages, each even. */
static void stage_medians(const cai_pipeline_t *p, int r, step_scratch *w) {
    const cai_pp_action *acts = cai_pp_schedule_actions(p->sched, r);
    const int len = cai_pp_schedule_len(p->sched, r);
    for (int c = 0; c < p->n_chunks; c++)
        for (int kind = 0; kind < 3; kind++) {
            int n = 0;
            for (int i = 0; i < len; i++)
                if (is_compute(acts[i].op) && acts[i].chunk == c && compute_kind(acts[i].op) == kind)
                    w->tmp[n++] = w->dur[r][i];
            const double med = median(w->tmp, n);
            for (int i = 0; i < len; i++)
                if (is_compute(acts[i].op) && acts[i].chunk == c && compute_kind(acts[i].op) == kind)
                    w->cpu[r][i] = med;
        }
}

static cai_status trace_step_stats(cai_pipeline_t *p, const trace_set *t, int j, step_scratch *w, double out[7]) {
    const int pp = p->spec.pp, v = p->n_chunks, pairs = p->spec.microbatches * v;
    const int S = pp * p->spec.virtual_stages;
    double first = INFINITY, last = -INFINITY, busy = 0, ran = 0, t0lo = INFINITY, t0hi = -INFINITY;
    double mom[3][3] = {{0}}; /* per kind (forward, backward or input pass, weight pass): n, sum, sum of squares */
    for (int r = 0; r < pp; r++) {
        const double *d = trace_step(t, r, j);
        const int ne = (int)d[1];
        const cai_pp_action *acts = cai_pp_schedule_actions(p->sched, r);
        const int len = cai_pp_schedule_len(p->sched, r);
        t0lo = fmin(t0lo, d[0]);
        t0hi = fmax(t0hi, d[0]);
        for (int i = 0; i < 2 * pairs; i++) w->at[r * 2 * pairs + i] = -1;
        int k = 0, follows = 1;
        for (int i = 0; i < len && follows; i++) {
            w->dur[r][i] = w->cpu[r][i] = 0;
            if (!is_compute(acts[i].op)) continue;
            const double *e = d + 2 + EV * k;
            follows = k < ne && (int)e[0] == (int)acts[i].op && (int)e[1] == acts[i].mb && (int)e[2] == acts[i].chunk;
            if (!follows) break;
            const double dt = e[4] - e[3];
            const int kind = compute_kind(acts[i].op);
            mom[kind][0] += 1;
            mom[kind][1] += dt;
            mom[kind][2] += dt * dt;
            w->dur[r][i] = dt;
            w->cpu[r][i] = fmin(fmax(e[5], 0), dt);
            busy += dt;
            ran += w->cpu[r][i];
            first = fmin(first, e[3]);
            last = fmax(last, e[4]);
            if (acts[i].op != CAI_PP_BACKWARD_WEIGHT)
                w->at[r * 2 * pairs + (acts[i].op != CAI_PP_FORWARD) * pairs + acts[i].mb * v + acts[i].chunk] = k;
            k++;
        }
        if (!follows || k != ne)
            return CAI_ERROR(CAI_ERR_INTERNAL,
                             "pipeline trace: rank %d's step recorded %d compute actions that do not follow its list",
                             r, ne);
    }
    out[0] = last > first ? 1.0 - busy / ((double)pp * (last - first)) : 0;
    cai_pp_stats ps;
    CAI_CALL(cai_pp_schedule_replay(p->sched, (const double *const *)w->dur, 0, &ps));
    out[1] = ps.bubble;
    CAI_CALL(cai_pp_schedule_replay(p->sched, (const double *const *)w->cpu, 0, &ps));
    out[4] = ps.bubble;
    for (int r = 0; r < pp; r++) stage_medians(p, r, w); /* into cpu: the processor times are done */
    CAI_CALL(cai_pp_schedule_replay(p->sched, (const double *const *)w->cpu, 0, &ps));
    out[6] = ps.bubble;
    out[5] = busy > 0 ? 1.0 - ran / busy : 0;
    out[2] = t0hi - t0lo;
    out[3] = 0;
    for (int kind = 0; kind < 3; kind++)
        if (mom[kind][0] > 1 && mom[kind][1] > 0) {
            const double mean = mom[kind][1] / mom[kind][0];
            const double var = fmax(0, mom[kind][2] / mom[kind][0] - mean * mean);
            out[3] = fmax(out[3], sqrt(var) / mean);
        }
    for (int r = 0; r < pp; r++) {
        const double *d = trace_step(t, r, j);
        for (int k = 0; k < (int)d[1]; k++) {
            const double *e = d + 2 + EV * k;
            const int op = (int)e[0], mb = (int)e[1], chunk = (int)e[2];
            if (op == CAI_PP_BACKWARD_WEIGHT) continue;
            const int fwd = op == CAI_PP_FORWARD, stage = cai_pp_stage_of(&p->spec, r, chunk);
            if (fwd ? stage == 0 : stage == S - 1) continue;
            int pr = -1, pc = -1;
            cai_pp_stage_owner(&p->spec, stage + (fwd ? -1 : 1), &pr, &pc);
            if (pr == r || pr < 0) continue; /* handed over in memory */
            const int pk = w->at[pr * 2 * pairs + !fwd * pairs + mb * v + pc];
            if (pk < 0) continue;
            const double made = trace_step(t, pr, j)[2 + EV * pk + 4];
            const double ready = k ? d[2 + EV * (k - 1) + 4] : d[0];
            if (made < ready) continue; /* it was there before the consumer could use it */
            if (w->n_lat == w->cap_lat) {
                const int cap = w->cap_lat ? 2 * w->cap_lat : 256;
                double *grown = realloc(w->lat, (size_t)cap * sizeof *grown);
                if (!grown) return CAI_ERROR(CAI_ERR_NOMEM, "pipeline trace: %d transfer latencies", cap);
                w->lat = grown;
                w->cap_lat = cap;
            }
            w->lat[w->n_lat++] = e[3] - made;
        }
    }
    return CAI_OK;
}

/* Pp rank 0 writes the kept steps' compute actions (times from the first
 * one's start) and the statistics as the trace's otherData. */
static cai_status trace_write(cai_pipeline_t *p, const trace_set *t, const char *path, const cai_pp_trace_stats *s,
                              const double *rank_fb) {
    const int pp = p->spec.pp;
    size_t total = 0;
    double t0 = INFINITY;
    for (int r = 0; r < pp; r++)
        for (int j = 0; j < t->kept; j++) {
            const double *d = trace_step(t, r, j);
            total += (size_t)d[1];
            if (j == 0 && d[1] > 0) t0 = fmin(t0, d[2 + 3]);
        }
    cai_pp_trace_event *evs = NULL;
    char(*names)[32] = NULL;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_calloc((void **)&evs, total + 1, sizeof *evs, "pipeline trace events"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&names, total + 1, sizeof *names, "pipeline trace names"), st, done);
    size_t k = 0;
    for (int r = 0; r < pp; r++)
        for (int j = 0; j < t->kept; j++) {
            const double *d = trace_step(t, r, j);
            for (int i = 0; i < (int)d[1]; i++, k++) {
                const double *e = d + 2 + EV * i;
                const cai_pp_action a = {.op = (cai_pp_op)e[0], .mb = (int)e[1], .chunk = (int)e[2], .peer = -1};
                cai_pp_action_label(&a, p->n_chunks, names[k], sizeof names[k]);
                evs[k] = (cai_pp_trace_event){.rank = r,
                                              .name = names[k],
                                              .cat = "compute",
                                              .start = e[3] - t0,
                                              .end = e[4] - t0,
                                              .mb = a.mb,
                                              .chunk = p->n_chunks > 1 ? a.chunk : -1};
            }
        }
    enum { PER_RANK = 16, COMMON = 21 };
    char keys[2 * PER_RANK][24];
    cai_pp_trace_meta meta[COMMON + 2 * PER_RANK] = {
        {"steps", s->steps},
        {"equal_compute_us", (double)s->equal_us},
        {"equal_overruns", s->equal_overruns},
        {"equal_actions", s->equal_actions},
        {"bubble_measured", s->measured},
        {"bubble_measured_min", s->measured_min},
        {"bubble_measured_max", s->measured_max},
        {"bubble_textbook", s->textbook},
        {"bubble_at_costs", s->at_costs},
        {"bubble_with_transfers", s->with_transfers},
        {"bubble_replay", s->replay},
        {"transfer_s", s->transfer},
        {"transfers", s->transfers},
        {"start_spread_s", s->start_spread},
        {"compute_cv", s->compute_cv},
        {"bubble_replay_cpu", s->replay_cpu},
        {"waited_cpu", s->waited_cpu},
        {"bubble_at_stage_times", s->at_stage_times},
        {"forward_s", s->f},
        {"backward_s", s->b},
        {"weight_s", s->w},
    };
    size_t nm = COMMON;
    for (int r = 0; r < pp && r < PER_RANK; r++) {
        snprintf(keys[2 * r], sizeof keys[0], "forward_s_rank%d", r);
        snprintf(keys[2 * r + 1], sizeof keys[0], "backward_s_rank%d", r);
        meta[nm++] = (cai_pp_trace_meta){keys[2 * r], rank_fb[2 * r]};
        meta[nm++] = (cai_pp_trace_meta){keys[2 * r + 1], rank_fb[2 * r + 1]};
    }
    st = cai_pp_write_chrome_trace_meta(path, evs, total, meta, nm);
done:
    cai_free(evs);
    cai_free(names);
    return st;
}

cai_status cai_pipeline_trace_stats(cai_pipeline_t *p, const char *path, cai_pp_trace_stats *out) {
    CAI_CHECK_ARG(p && out, "cai_pipeline_trace_stats: NULL argument");
    CAI_CHECK_ARG(p->tracing && p->sched,
                  "cai_pipeline_trace_stats: no traced step (cai_pipeline_set_trace, then a step)");
    memset(out, 0, sizeof *out);
    const int pp = p->spec.pp, pairs = p->spec.microbatches * p->n_chunks;
    trace_set t = {0};
    step_scratch w = {0};
    double *per_step = NULL, *rank_fb = NULL;
    size_t lens = 0;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(trace_gather(p, &t), st, done);
    for (int r = 0; r < pp; r++) lens += (size_t)cai_pp_schedule_len(p->sched, r);
    CAI_CALL_GOTO(cai_calloc((void **)&w.dur, (size_t)pp, sizeof *w.dur, "trace replay"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&w.dur_block, lens + 1, sizeof *w.dur_block, "trace replay"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&w.cpu, (size_t)pp, sizeof *w.cpu, "trace replay"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&w.cpu_block, lens + 1, sizeof *w.cpu_block, "trace replay"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&w.tmp, lens + 1, sizeof *w.tmp, "trace replay"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&w.at, (size_t)pp * 2 * (size_t)pairs + 1, sizeof *w.at, "trace index"), st,
                  done);
    for (int r = 0, at = 0; r < pp; at += cai_pp_schedule_len(p->sched, r), r++) {
        w.dur[r] = w.dur_block + at;
        w.cpu[r] = w.cpu_block + at;
    }
    const int steady = t.kept - t.first_steady;
    CAI_CALL_GOTO(cai_calloc((void **)&per_step, 7 * (size_t)steady + 7, sizeof *per_step, "trace steps"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&rank_fb, 4 * (size_t)pp, sizeof *rank_fb, "trace per rank"), st, done);
    double sum[CAI_PP_OP_COUNT] = {0}, n_op[CAI_PP_OP_COUNT] = {0};
    for (int j = t.first_steady; j < t.kept; j++) {
        double one[7] = {0, 0, 0, 0, 0, 0, 0};
        CAI_CALL_GOTO(trace_step_stats(p, &t, j, &w, one), st, done);
        const int i = j - t.first_steady;
        per_step[i] = one[0];
        per_step[steady + i] = one[1];
        per_step[2 * steady + i] = one[2];
        per_step[3 * steady + i] = one[3];
        per_step[4 * steady + i] = one[4];
        per_step[5 * steady + i] = one[5];
        per_step[6 * steady + i] = one[6];
        for (int r = 0; r < pp; r++) {
            const double *d = trace_step(&t, r, j);
            for (int k = 0; k < (int)d[1]; k++) {
                const double *e = d + 2 + EV * k, dt = e[4] - e[3];
                const int op = (int)e[0];
                sum[op] += dt;
                n_op[op] += 1;
                out->equal_overruns += e[6] != 0;
                if (op == CAI_PP_BACKWARD_WEIGHT) continue;
                const int bwd = op != CAI_PP_FORWARD;
                rank_fb[2 * r + bwd] += dt;
                rank_fb[2 * pp + 2 * r + bwd] += 1;
            }
        }
    }
    for (int i = 0; i < 2 * pp; i++) rank_fb[i] = rank_fb[2 * pp + i] > 0 ? rank_fb[i] / rank_fb[2 * pp + i] : 0;
    out->steps = steady;
    out->equal_us = p->equal_us;
    for (int k = 0; k < CAI_PP_OP_COUNT; k++) out->equal_actions += (int)n_op[k];
    out->measured = median(per_step, steady); /* sorts: min and max are the ends */
    out->measured_min = per_step[0];
    out->measured_max = per_step[steady > 0 ? steady - 1 : 0];
    out->replay = median(per_step + steady, steady);
    out->start_spread = median(per_step + 2 * steady, steady);
    out->compute_cv = median(per_step + 3 * steady, steady);
    out->replay_cpu = median(per_step + 4 * steady, steady);
    out->waited_cpu = median(per_step + 5 * steady, steady);
    out->at_stage_times = median(per_step + 6 * steady, steady);
    out->transfers = w.n_lat;
    out->transfer = median(w.lat, w.n_lat);
#define MEAN(op) (n_op[op] > 0 ? sum[op] / n_op[op] : 0.0)
    out->f = MEAN(CAI_PP_FORWARD);
    out->b = n_op[CAI_PP_BACKWARD] > 0 ? MEAN(CAI_PP_BACKWARD) : MEAN(CAI_PP_BACKWARD_INPUT);
    out->w = MEAN(CAI_PP_BACKWARD_WEIGHT);
#undef MEAN
    cai_pp_stats ps;
    CAI_CALL_GOTO(cai_pp_schedule_check(p->sched, NULL, &ps), st, done);
    out->textbook = ps.bubble;
    out->at_costs = out->with_transfers = ps.bubble;
    if (out->f > 0 && out->b > 0) {
        /* the schedule at the mean compute times of equal stages, without and
         * with the measured transfer time (a fused backward costs b + w) */
        cai_pp_costs c = {.f = out->f, .b = out->b, .w = out->w, .comm = 0};
        CAI_CALL_GOTO(cai_pp_schedule_check(p->sched, &c, &ps), st, done);
        out->at_costs = ps.bubble;
        c.comm = out->transfer > 0 ? out->transfer : 0;
        CAI_CALL_GOTO(cai_pp_schedule_check(p->sched, &c, &ps), st, done);
        out->with_transfers = ps.bubble;
    }
    if (path && p->rank == 0) CAI_CALL_GOTO(trace_write(p, &t, path, out, rank_fb), st, done);
done:
    cai_free(t.all);
    cai_free(w.dur);
    cai_free(w.dur_block);
    cai_free(w.cpu);
    cai_free(w.cpu_block);
    cai_free(w.tmp);
    cai_free(w.at);
    free(w.lat);
    cai_free(per_step);
    cai_free(rank_fb);
    return st;
}

cai_status cai_pipeline_trace(cai_pipeline_t *p, const char *path, double *measured, double *predicted,
                              double *predicted_measured) {
    cai_pp_trace_stats s;
    CAI_CALL(cai_pipeline_trace_stats(p, path, &s));
    if (measured) *measured = s.measured;
    if (predicted) *predicted = s.textbook;
    if (predicted_measured) *predicted_measured = s.at_costs;
    return CAI_OK;
}

cai_mesh_t *cai_pipeline_mesh(const cai_pipeline_t *p) { return p->mesh; }
cai_model_t *cai_pipeline_model(const cai_pipeline_t *p) { return p->model; }
