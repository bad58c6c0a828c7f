/* Device-buffer collectives through NCCL, plus the CUDA helpers the staging
 * path and the benchmark need. One NCCL communicator per mesh axis, created
 * on first use from an ncclUniqueId broadcast over the axis' MPI communicator.
 * Operations run on one non-blocking stream per mesh that first waits for the
 * caller's stream; the host polls an event (and NCCL's async error) under the
 * watchdog and aborts the communicator when it fires. Non-blocking operations
 * take their completion event from a pool the NCCL state owns, so a training
 * step issues no cudaEventCreate/Destroy. Compiled always; the body needs
 * CAI_HAVE_CUDA. */
#include "cai_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_internal.h"

void cai_mesh_set_cuda_stream(cai_mesh_t *mesh, void *stream) {
    if (mesh) mesh->cuda_stream = stream;
}

void cai_mesh_overlap_compute(cai_mesh_t *mesh, int on) {
    if (mesh) mesh->overlapping = on != 0;
}

#if CAI_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

/* Events the pool starts with: more than the engine usually keeps in flight
 * (a few buckets); it doubles when a caller keeps more. */
#define EVENT_POOL_INIT 16
#define TRACE_SLOTS 64

struct cai_nccl_state {
    ncclComm_t comm[CAI_AXIS_COUNT];
    /* Split from comm[] with at most cai_mesh_config.nccl_overlap_ctas CTAs,
     * for collectives that run beside compute; made on first such use. */
    ncclComm_t overlap_comm[CAI_AXIS_COUNT];
    int failed[CAI_AXIS_COUNT]; /* aborted after an error or timeout: the mesh must be rebuilt */
    cudaStream_t stream;
    cudaEvent_t ready, done; /* done: reused by blocking calls */
    /* Completion events of non-blocking operations: a ring searched from
     * `next` for a free slot. Slots are lent, never destroyed before the
     * state, so steady-state steps create no events. */
    cudaEvent_t *ev;
    unsigned char *ev_busy;
    int nev, next, in_use;
    /* CAI_NCCL_TRACE=1: timing events of the non-blocking operations in the
     * first TRACE_SLOTS pool slots, printed to stderr as each completes. */
    int trace;
    cudaEvent_t tr_t0, tr_ready[TRACE_SLOTS], tr_start[TRACE_SLOTS], tr_end[TRACE_SLOTS];
    size_t tr_bytes[TRACE_SLOTS];
    int tr_kind[TRACE_SLOTS], tr_on[TRACE_SLOTS];
};

#define CUDA_OK(expr)                                                                                \
    do {                                                                                             \
        cudaError_t cai_cu_ = (expr);                                                                \
        if (cai_cu_ != cudaSuccess)                                                                  \
            return CAI_ERROR(CAI_ERR_CUDA, "%s failed: %s (%s)", #expr, cudaGetErrorString(cai_cu_), \
                             cudaGetErrorName(cai_cu_));                                             \
    } while (0)

typedef struct {
    ncclComm_t comm;
    cai_axis axis;
} comm_ctx;

static int poll_comm(void *v) {
    comm_ctx *w = v;
    ncclResult_t state = ncclInProgress, r = ncclCommGetAsyncError(w->comm, &state);
    if (r == ncclSuccess && state == ncclInProgress) return 0;
    if (r == ncclSuccess && state == ncclSuccess) return 1;
    CAI_ERROR(CAI_ERR_NCCL, "NCCL communicator of axis %s failed: %s", cai_axis_name(w->axis),
              ncclGetErrorString(r != ncclSuccess ? r : state));
    return -1;
}

/* Communicators are non-blocking, so that creating them and setting up
 * peer connections can be watched too: a call may answer ncclInProgress, and
 * then we wait for the communicator to settle under the watchdog. */
static cai_status settle(cai_mesh_t *m, const cai_coll *c, uint64_t seq, ncclComm_t comm, ncclResult_t r,
                         const char *call) {
    if (r == ncclSuccess) return CAI_OK;
    if (r != ncclInProgress)
        return CAI_ERROR(CAI_ERR_NCCL, "%s on axis %s: %s failed: %s", cai_op_kind_name(c->kind),
                         cai_axis_name(c->axis), call, ncclGetErrorString(r));
    comm_ctx w = {comm, c->axis};
    CAI_CALL(cai_wd_wait(m, c, seq, poll_comm, &w));
    return CAI_OK;
}

#define NCCL_Q(expr) CAI_CALL(settle(m, c, seq, comm, (expr), #expr))

int cai_cl_cuda_usable(void) {
    static int usable = -1;
    if (usable < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) cudaGetLastError(); /* no driver or no device: host only */
        usable = e == cudaSuccess && n > 0;
    }
    return usable;
}

int cai_cl_is_device_ptr(const void *p) {
    if (!p || !cai_cl_cuda_usable()) return 0;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

cai_status cai_cl_copy_to_host(void *dst, const void *src, size_t bytes) {
    CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return CAI_OK;
}

cai_status cai_cl_copy_to_device(void *dst, const void *src, size_t bytes) {
    CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    /* From pageable memory cudaMemcpy may return before the DMA lands, and
     * the caller's next kernel may run on a stream that does not wait for
     * the legacy default stream. */
    CUDA_OK(cudaStreamSynchronize(0));
    return CAI_OK;
}

cai_status cai_cl_stream_sync(void *stream) {
    CUDA_OK(cudaStreamSynchronize((cudaStream_t)stream));
    return CAI_OK;
}

cai_status cai_cl_device_alloc(void **out, size_t bytes) {
    *out = NULL;
    CUDA_OK(cudaMalloc(out, bytes ? bytes : 1));
    return CAI_OK;
}

void cai_cl_device_free(void *p) {
    if (p) cudaFree(p);
}

cai_status cai_cl_device_fill(void *dst, const void *host_src, size_t bytes) {
    return cai_cl_copy_to_device(dst, host_src, bytes);
}

/* Grows the event pool to `want` slots (events created here and only here). */
static cai_status pool_grow(struct cai_nccl_state *s, int want) {
    cudaEvent_t *ev = NULL;
    unsigned char *busy = NULL;
    CAI_CALL(cai_calloc((void **)&ev, (size_t)want, sizeof *ev, "NCCL event pool"));
    cai_status st = cai_calloc((void **)&busy, (size_t)want, 1, "NCCL event pool flags");
    if (st != CAI_OK) {
        cai_free(ev);
        CAI_CALL(st);
    }
    if (s->nev) {
        memcpy(ev, s->ev, (size_t)s->nev * sizeof *ev);
        memcpy(busy, s->ev_busy, (size_t)s->nev);
    }
    int made = s->nev;
    cudaError_t e = cudaSuccess;
    while (made < want && (e = cudaEventCreateWithFlags(&ev[made], cudaEventDisableTiming)) == cudaSuccess) made++;
    cai_free(s->ev);
    cai_free(s->ev_busy);
    s->ev = ev;
    s->ev_busy = busy;
    s->nev = made; /* keep what was made: the pool stays consistent on failure */
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "creating collective completion events (%d of %d) failed: %s", made, want,
                         cudaGetErrorString(e));
    return CAI_OK;
}

static cai_status pool_take(struct cai_nccl_state *s, int *slot) {
    if (s->in_use == s->nev) CAI_CALL(pool_grow(s, s->nev ? 2 * s->nev : EVENT_POOL_INIT));
    for (int k = 0; k < s->nev; k++) {
        int i = (s->next + k) % s->nev;
        if (s->ev_busy[i]) continue;
        s->ev_busy[i] = 1;
        s->in_use++;
        s->next = (i + 1) % s->nev;
        *slot = i;
        return CAI_OK;
    }
    return CAI_ERROR(CAI_ERR_INTERNAL, "NCCL event pool: %d of %d in use but no free slot", s->in_use, s->nev);
}

static void pool_give(struct cai_nccl_state *s, int slot) {
    if (slot < 0 || slot >= s->nev || !s->ev_busy[slot]) return;
    s->ev_busy[slot] = 0;
    s->in_use--;
}

/* Whether the operation in pool slot `slot` (-1: a blocking one) is traced. */
static int traced(const struct cai_nccl_state *s, int slot) { return s->trace && slot >= 0 && slot < TRACE_SLOTS; }

static cai_status trace_init(struct cai_nccl_state *s) {
    cudaError_t e = cudaEventCreate(&s->tr_t0);
    for (int i = 0; i < TRACE_SLOTS && e == cudaSuccess; i++) {
        e = cudaEventCreate(&s->tr_ready[i]);
        if (e == cudaSuccess) e = cudaEventCreate(&s->tr_start[i]);
        if (e == cudaSuccess) e = cudaEventCreate(&s->tr_end[i]);
    }
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "CAI_NCCL_TRACE: creating timing events failed: %s", cudaGetErrorString(e));
    s->trace = 1;
    return CAI_OK;
}

/* One line per traced operation once it is complete: when its data was
 * ready on the compute stream (ms after the first operation started while
 * none was in flight, i.e. the backward's first bucket), how long it then
 * waited for the collective stream and SMs, and how long it ran. */
static void trace_report(struct cai_nccl_state *s, cai_mesh_t *m, int slot) {
    if (!traced(s, slot) || !s->tr_on[slot]) return;
    s->tr_on[slot] = 0;
    float at = 0, wait = 0, ran = 0;
    cudaEventElapsedTime(&at, s->tr_t0, s->tr_ready[slot]);
    cudaEventElapsedTime(&wait, s->tr_ready[slot], s->tr_start[slot]);
    cudaEventElapsedTime(&ran, s->tr_start[slot], s->tr_end[slot]);
    fprintf(
        stderr,
        "[nccl trace, world rank %d] %s %.2f MB: ready at %.3f ms, started %.3f ms later, ran %.3f ms (%.0f GB/s)\n",
        m->world_rank, cai_op_kind_name((cai_op_kind)s->tr_kind[slot]), (double)s->tr_bytes[slot] / 1e6, (double)at,
        (double)wait, (double)ran, ran > 0 ? (double)s->tr_bytes[slot] / (ran * 1e6) : 0.0);
}

static void state_destroy(struct cai_nccl_state *s) {
    if (s->trace) {
        cudaEventDestroy(s->tr_t0);
        for (int i = 0; i < TRACE_SLOTS; i++) {
            cudaEventDestroy(s->tr_ready[i]);
            cudaEventDestroy(s->tr_start[i]);
            cudaEventDestroy(s->tr_end[i]);
        }
    }
    for (int i = 0; i < s->nev; i++) cudaEventDestroy(s->ev[i]);
    cai_free(s->ev);
    cai_free(s->ev_busy);
    if (s->ready) cudaEventDestroy(s->ready);
    if (s->done) cudaEventDestroy(s->done);
    if (s->stream) cudaStreamDestroy(s->stream);
    cai_free(s);
}

/* The collective stream's priority: the highest. A reduction that waits
 * behind a backward kernel's queued blocks for SMs finishes later and keeps
 * the peer's already-running NCCL blocks spinning; the highest priority
 * lets its blocks start as soon as any SM frees. */
static int collective_priority(void) {
    int least = 0, greatest = 0;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) return 0;
    return greatest;
}

static cai_status state_get(cai_mesh_t *m, struct cai_nccl_state **out) {
    if (!m->nccl) {
        struct cai_nccl_state *s = NULL;
        CAI_CALL(cai_calloc((void **)&s, 1, sizeof *s, "NCCL state"));
        cudaError_t e = cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, collective_priority());
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            state_destroy(s);
            return CAI_ERROR(CAI_ERR_CUDA, "creating the collective stream failed: %s", cudaGetErrorString(e));
        }
        /* The pool is made with the stream, on the first device collective
         * (communicator set-up), not inside a step. */
        long long trace = 0;
        cai_status st = cai_knob_int("CAI_NCCL_TRACE", &trace);
        if (st == CAI_OK) st = pool_grow(s, EVENT_POOL_INIT);
        if (st == CAI_OK && trace) st = trace_init(s);
        if (st != CAI_OK) {
            state_destroy(s);
            CAI_CALL(st);
        }
        m->nccl = s;
    }
    *out = m->nccl;
    return CAI_OK;
}

/* Whether device collectives started now on `axis` take the CTA-limited communicator. */
static int use_overlap_comm(const cai_mesh_t *m) { return m->overlapping && m->overlap_ctas > 0; }

/* The CTA-limited communicator, split from the axis' own when the first
 * collective marked as overlapping compute needs it. The split is
 * collective and blocks, so a watched barrier first makes sure every peer
 * has reached it (the same order holds on every rank: the marking does). */
static cai_status ensure_overlap_comm(cai_mesh_t *m, struct cai_nccl_state *s, cai_axis axis) {
    if (!use_overlap_comm(m) || s->overlap_comm[axis]) return CAI_OK;
    CAI_CALL(cai_host_barrier(m, axis));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.minCTAs = 1;
    config.maxCTAs = m->overlap_ctas;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommSplit(s->comm[axis], 0, m->rank[axis], &comm, &config);
    if (r != ncclSuccess) {
        if (comm) ncclCommAbort(comm);
        s->failed[axis] = 1;
        return CAI_ERROR(CAI_ERR_NCCL,
                         "ncclCommSplit for axis %s with at most %d CTAs (nccl_overlap_ctas) failed "
                         "on rank %d of %d: %s",
                         cai_axis_name(axis), m->overlap_ctas, m->rank[axis], m->size[axis], ncclGetErrorString(r));
    }
    s->overlap_comm[axis] = comm;
    return CAI_OK;
}

cai_status cai_cl_nccl_ensure(cai_mesh_t *m, cai_axis axis) {
    struct cai_nccl_state *s = NULL;
    CAI_CALL(state_get(m, &s));
    if (s->failed[axis])
        return CAI_ERROR(CAI_ERR_NCCL,
                         "the NCCL communicator of axis %s was aborted after a failed or timed-out collective; device "
                         "collectives on this axis need a new mesh (cai_mesh_free, then cai_mesh_init on every rank)",
                         cai_axis_name(axis));
    if (s->comm[axis]) return ensure_overlap_comm(m, s, axis);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (m->rank[axis] == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            return CAI_ERROR(CAI_ERR_NCCL, "ncclGetUniqueId for axis %s failed: %s", cai_axis_name(axis),
                             ncclGetErrorString(r));
    }
    /* Blocking communicators: a non-blocking one costs ~50 us more per call
     * (measured on H200s). Initialisation itself then cannot be polled, so a
     * watched barrier first makes sure every peer has reached it. */
    CAI_CALL(cai_host_bcast_bytes(m, axis, &id, sizeof id, CAI_OP_NCCL_INIT));
    CAI_CALL(cai_host_barrier(m, axis));
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRank(&comm, m->size[axis], id, m->rank[axis]);
    if (r != ncclSuccess) {
        if (comm) ncclCommAbort(comm);
        s->failed[axis] = 1;
        return CAI_ERROR(CAI_ERR_NCCL, "ncclCommInitRank for axis %s (rank %d of %d) failed: %s", cai_axis_name(axis),
                         m->rank[axis], m->size[axis], ncclGetErrorString(r));
    }
    s->comm[axis] = comm;
    return ensure_overlap_comm(m, s, axis);
}

/* After an error or a timeout the communicator's state is unknown (peers may
 * be inside the collective): abort it and refuse the axis from now on. */
static void fail_axis(cai_mesh_t *m, cai_axis axis) {
    struct cai_nccl_state *s = m->nccl;
    if (s->overlap_comm[axis]) ncclCommAbort(s->overlap_comm[axis]);
    if (s->comm[axis]) ncclCommAbort(s->comm[axis]);
    s->comm[axis] = s->overlap_comm[axis] = NULL;
    s->failed[axis] = 1;
}

static int nccl_type(cai_dtype dt, ncclDataType_t *t) {
    switch (dt) {
    case CAI_DTYPE_F32: *t = ncclFloat32; return 1;
    case CAI_DTYPE_BF16: *t = ncclBfloat16; return 1;
    case CAI_DTYPE_F16: *t = ncclFloat16; return 1;
    case CAI_DTYPE_F64: *t = ncclFloat64; return 1;
    case CAI_DTYPE_I32: *t = ncclInt32; return 1;
    case CAI_DTYPE_I64: *t = ncclInt64; return 1;
    case CAI_DTYPE_U8: *t = ncclUint8; return 1;
    default: return 0; /* u16: moved as bytes, never reduced here */
    }
}

static ncclRedOp_t nccl_op(cai_reduce_op op) {
    switch (op) {
    case CAI_RED_AVG: return ncclAvg;
    case CAI_RED_MAX: return ncclMax;
    case CAI_RED_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* Enqueues the operation on the collective stream. */
static cai_status enqueue(cai_mesh_t *m, const cai_coll *c, uint64_t seq, void **scratch, int slot) {
    struct cai_nccl_state *s = m->nccl;
    cai_axis axis = c->axis;
    ncclComm_t comm = use_overlap_comm(m) ? s->overlap_comm[axis] : s->comm[axis];
    cudaStream_t st = s->stream;
    int n = m->size[axis], me = m->rank[axis];
    size_t es = cai_dtype_size(c->dtype);
    ncclDataType_t t;
    size_t unit = 1;
    if (!nccl_type(c->dtype, &t)) {
        t = ncclUint8;
        unit = es;
    }
    if (traced(s, slot)) {
        if (s->in_use == 1) CUDA_OK(cudaEventRecord(s->tr_t0, (cudaStream_t)m->cuda_stream));
        CUDA_OK(cudaEventRecord(s->tr_ready[slot], (cudaStream_t)m->cuda_stream));
        s->tr_bytes[slot] = c->count * es * (cai_op_base(c->kind) == CAI_OP_REDUCE_SCATTER ? (size_t)n : 1);
        s->tr_kind[slot] = (int)c->kind;
        s->tr_on[slot] = 1;
    }
    CUDA_OK(cudaEventRecord(s->ready, (cudaStream_t)m->cuda_stream));
    CUDA_OK(cudaStreamWaitEvent(st, s->ready, 0));
    if (traced(s, slot)) CUDA_OK(cudaEventRecord(s->tr_start[slot], st));
    const char *sb = c->send;
    char *rb = c->recv;
    switch (cai_op_base(c->kind)) {
    case CAI_OP_ALLREDUCE: NCCL_Q(ncclAllReduce(sb, rb, c->count, t, nccl_op(c->op), comm, st)); break;
    case CAI_OP_REDUCE_SCATTER:
        if (sb == rb) {
            /* NCCL's in place writes the rank's own block; the API's lands at the start. */
            char *own = rb + (size_t)me * c->count * es;
            NCCL_Q(ncclReduceScatter(sb, own, c->count, t, nccl_op(c->op), comm, st));
            if (me != 0) CUDA_OK(cudaMemcpyAsync(rb, own, c->count * es, cudaMemcpyDeviceToDevice, st));
        } else {
            NCCL_Q(ncclReduceScatter(sb, rb, c->count, t, nccl_op(c->op), comm, st));
        }
        break;
    case CAI_OP_ALLGATHER:
        if (cai_coll_in_place(c, me, n)) sb = rb + (size_t)me * c->count * es;
        NCCL_Q(ncclAllGather(sb, rb, c->count * unit, t, comm, st));
        break;
    case CAI_OP_ALLTOALL:
        if (sb == rb && c->count) {
            CUDA_OK(cudaMallocAsync(scratch, (size_t)n * c->count * es, st));
            CUDA_OK(cudaMemcpyAsync(*scratch, sb, (size_t)n * c->count * es, cudaMemcpyDeviceToDevice, st));
            sb = *scratch;
        }
        NCCL_Q(ncclGroupStart());
        for (int i = 0; i < n; i++) {
            size_t off = (size_t)i * c->count * es;
            NCCL_Q(ncclSend(sb + off, c->count * unit, t, i, comm, st));
            NCCL_Q(ncclRecv(rb + off, c->count * unit, t, i, comm, st));
        }
        NCCL_Q(ncclGroupEnd());
        break;
    case CAI_OP_ALLTOALLV:
        NCCL_Q(ncclGroupStart());
        for (int i = 0; i < n; i++) {
            if (c->scounts[i]) NCCL_Q(ncclSend(sb + c->sdispls[i] * es, c->scounts[i] * unit, t, i, comm, st));
            if (c->rcounts[i]) NCCL_Q(ncclRecv(rb + c->rdispls[i] * es, c->rcounts[i] * unit, t, i, comm, st));
        }
        NCCL_Q(ncclGroupEnd());
        break;
    case CAI_OP_BCAST: NCCL_Q(ncclBroadcast(rb, rb, c->count * unit, t, c->peer, comm, st)); break;
    case CAI_OP_SEND: NCCL_Q(ncclSend(sb, c->count * unit, t, c->peer, comm, st)); break;
    case CAI_OP_RECV: NCCL_Q(ncclRecv(rb, c->count * unit, t, c->peer, comm, st)); break;
    default: return CAI_ERROR(CAI_ERR_INTERNAL, "%s has no NCCL path", cai_op_kind_name(c->kind));
    }
    if (*scratch) CUDA_OK(cudaFreeAsync(*scratch, st));
    return CAI_OK;
}

typedef struct {
    cai_mesh_t *m;
    cai_axis axis;
    cudaEvent_t done;
    unsigned polls;
} nccl_wait_ctx;

static int poll_event(void *vctx) {
    nccl_wait_ctx *w = vctx;
    cudaError_t e = cudaEventQuery(w->done);
    if (e == cudaSuccess) return 1;
    if (e != cudaErrorNotReady) {
        CAI_ERROR(CAI_ERR_CUDA, "collective on axis %s: %s", cai_axis_name(w->axis), cudaGetErrorString(e));
        return -1;
    }
    /* A failed peer shows up here; checking now and then is enough. */
    if (w->polls++ % 64 != 63) return 0;
    ncclResult_t async = ncclSuccess;
    ncclComm_t overlap = w->m->nccl->overlap_comm[w->axis];
    ncclCommGetAsyncError(w->m->nccl->comm[w->axis], &async);
    if ((async == ncclSuccess || async == ncclInProgress) && overlap) ncclCommGetAsyncError(overlap, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
        CAI_ERROR(CAI_ERR_NCCL, "NCCL communicator of axis %s failed: %s", cai_axis_name(w->axis),
                  ncclGetErrorString(async));
        return -1;
    }
    return 0;
}

/* Waits for `done` under the watchdog; on failure aborts the axis'
 * communicator, which cannot be trusted afterwards (the next device
 * collective on the axis creates a fresh one). */
static cai_status wait_done(cai_mesh_t *m, const cai_coll *c, uint64_t seq, cudaEvent_t done, double limit_s) {
    nccl_wait_ctx w = {m, c->axis, done, 0};
    /* The engine waits here for the gradient reductions while the GPU runs
     * out of queued work: poll at least every 50 us (a 1 ms nap cost up to
     * a millisecond of idle GPU per training step). */
    cai_status st = cai_wd_wait_nap(m, c, seq, poll_event, &w, limit_s, 50000);
    if (st != CAI_OK) fail_axis(m, c->axis);
    return st;
}

static cai_status enqueue_with_event(cai_mesh_t *m, const cai_coll *c, uint64_t seq, cudaEvent_t done, int slot) {
    void *scratch = NULL;
    cai_status st = enqueue(m, c, seq, &scratch, slot);
    if (st == CAI_OK && traced(m->nccl, slot)) {
        cudaError_t e = cudaEventRecord(m->nccl->tr_end[slot], m->nccl->stream);
        if (e != cudaSuccess) st = CAI_ERROR(CAI_ERR_CUDA, "cudaEventRecord failed: %s", cudaGetErrorString(e));
    }
    if (st == CAI_OK) {
        cudaError_t e = cudaEventRecord(done, m->nccl->stream);
        if (e != cudaSuccess) st = CAI_ERROR(CAI_ERR_CUDA, "cudaEventRecord failed: %s", cudaGetErrorString(e));
    }
    if (st != CAI_OK) fail_axis(m, c->axis);
    return st;
}

cai_status cai_cl_nccl_run(cai_mesh_t *m, const cai_coll *c, uint64_t seq) {
    CAI_CALL(enqueue_with_event(m, c, seq, m->nccl->done, -1));
    CAI_CALL(wait_done(m, c, seq, m->nccl->done, 0));
    return CAI_OK;
}

cai_status cai_cl_nccl_start(cai_mesh_t *m, cai_pending *p) {
    struct cai_nccl_state *s = m->nccl;
    int slot = -1;
    CAI_CALL(pool_take(s, &slot));
    cai_status st = enqueue_with_event(m, &p->c, p->seq, s->ev[slot], slot);
    if (st != CAI_OK) {
        pool_give(s, slot);
        CAI_CALL(st);
    }
    p->dev_slot = slot;
    return CAI_OK;
}

/* A slot given back while its operation may still run (after a timeout,
 * the communicator aborted) is safe to lend again: recording an event anew
 * replaces what it tracked. */
cai_status cai_cl_nccl_finish(cai_mesh_t *m, cai_pending *p, double limit_s) {
    struct cai_nccl_state *s = m->nccl;
    cai_status st = wait_done(m, &p->c, p->seq, s->ev[p->dev_slot], limit_s);
    if (st == CAI_OK) trace_report(s, m, p->dev_slot);
    pool_give(s, p->dev_slot);
    p->dev_slot = -1;
    CAI_CALL(st);
    return CAI_OK;
}

cai_status cai_cl_nccl_test(cai_mesh_t *m, cai_pending *p, int *done) {
    struct cai_nccl_state *s = m->nccl;
    /* polls = 63: look at NCCL's asynchronous error on this single poll too. */
    nccl_wait_ctx w = {m, p->c.axis, s->ev[p->dev_slot], 63};
    int r = poll_event(&w);
    *done = r != 0;
    if (r == 0) return CAI_OK;
    if (r > 0) trace_report(s, m, p->dev_slot);
    pool_give(s, p->dev_slot);
    p->dev_slot = -1;
    if (r < 0) {
        fail_axis(m, p->c.axis);
        cai_status st = cai_error_status();
        return st != CAI_OK ? st : CAI_ERROR(CAI_ERR_INTERNAL, "NCCL test failed without a message");
    }
    return CAI_OK;
}

void cai_cl_nccl_event_stats(const cai_mesh_t *m, int *created, int *in_use) {
    *created = m->nccl ? m->nccl->nev : 0;
    *in_use = m->nccl ? m->nccl->in_use : 0;
}

void cai_cl_nccl_free(cai_mesh_t *m) {
    /* Whether any rank aborted an axis' communicator: then every rank aborts
     * its own (destroying would wait for the aborted peer). Every rank takes
     * part, with or without device state. */
    int local[CAI_AXIS_COUNT] = {0}, any[CAI_AXIS_COUNT] = {0};
    struct cai_nccl_state *s = m->nccl;
    for (int a = 0; s && a < CAI_AXIS_COUNT; a++) local[a] = s->failed[a];
    if (!m->ready) return; /* a failed init never created device state */
    if (MPI_Allreduce(local, any, CAI_AXIS_COUNT, MPI_INT, MPI_MAX, m->cart) != MPI_SUCCESS)
        for (int a = 0; a < CAI_AXIS_COUNT; a++) any[a] = 1;
    if (!s) return;
    cudaStreamSynchronize(s->stream);
    for (int a = 0; a < CAI_AXIS_COUNT; a++) {
        /* The split communicator before the one it was split from. */
        ncclComm_t comms[2] = {s->overlap_comm[a], s->comm[a]};
        for (int k = 0; k < 2; k++) {
            if (!comms[k]) continue;
            if (any[a]) ncclCommAbort(comms[k]);
            else ncclCommDestroy(comms[k]);
        }
    }
    state_destroy(s);
    m->nccl = NULL;
}

#else /* !CAI_HAVE_CUDA */

static cai_status no_cuda(const char *what) {
    return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s needs CUDA, and this build has none (configure --with-cuda)", what);
}

int cai_cl_cuda_usable(void) { return 0; }
int cai_cl_is_device_ptr(const void *p) { return 0; }
cai_status cai_cl_copy_to_host(void *dst, const void *src, size_t bytes) { return no_cuda("device staging"); }
cai_status cai_cl_copy_to_device(void *dst, const void *src, size_t bytes) { return no_cuda("device staging"); }
cai_status cai_cl_stream_sync(void *stream) { return no_cuda("device streams"); }
cai_status cai_cl_device_alloc(void **out, size_t bytes) {
    *out = NULL;
    return no_cuda("device buffers");
}
void cai_cl_device_free(void *p) {}
cai_status cai_cl_device_fill(void *dst, const void *host_src, size_t bytes) { return no_cuda("device buffers"); }
cai_status cai_cl_nccl_ensure(cai_mesh_t *m, cai_axis axis) { return no_cuda("NCCL"); }
cai_status cai_cl_nccl_run(cai_mesh_t *m, const cai_coll *c, uint64_t seq) { return no_cuda("NCCL"); }
cai_status cai_cl_nccl_start(cai_mesh_t *m, cai_pending *p) { return no_cuda("NCCL"); }
cai_status cai_cl_nccl_finish(cai_mesh_t *m, cai_pending *p, double limit_s) { return no_cuda("NCCL"); }
cai_status cai_cl_nccl_test(cai_mesh_t *m, cai_pending *p, int *done) {
    *done = 1;
    return no_cuda("NCCL");
}
void cai_cl_nccl_event_stats(const cai_mesh_t *m, int *created, int *in_use) { *created = *in_use = 0; }
void cai_cl_nccl_free(cai_mesh_t *m) {}

#endif
