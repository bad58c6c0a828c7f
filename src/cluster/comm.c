/* Collectives over a mesh axis. Host buffers go through MPI; device buffers
 * through NCCL (nccl.c), CUDA-aware MPI, or host staging. With the watchdog on,
 * each MPI call is issued non-blocking and polled (watchdog.c); with it off,
 * the blocking variant is used because Open MPI's tuned blocking algorithms
 * beat its generic non-blocking schedules. */
#include "cai_config.h"

#include <limits.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "cluster_internal.h"

/* ------------------------------------------------------------ half floats */

uint16_t cai_cl_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float cai_cl_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t cai_cl_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    /* 65520 is half way between the largest half (65504) and 2^16: it and
     * everything above rounds to infinity. */
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a < 0x38800000u) {
        /* Below the smallest normal half: subnormal steps of 2^-24; the
         * scaling is exact, so rintf's round-to-even is the only rounding. */
        float fa;
        memcpy(&fa, &a, 4);
        return sign | (uint16_t)rintf(fa * 0x1p24f);
    }
    uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return sign | (uint16_t)(r >> 13);
}

float cai_cl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        float f = (float)man * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= sign;
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------ descriptors */

MPI_Datatype cai_mpi_dtype(cai_dtype dt) {
    switch (dt) {
    case CAI_DTYPE_F32: return MPI_FLOAT;
    case CAI_DTYPE_F64: return MPI_DOUBLE;
    case CAI_DTYPE_I32: return MPI_INT32_T;
    case CAI_DTYPE_I64: return MPI_INT64_T;
    case CAI_DTYPE_U8: return MPI_UINT8_T;
    /* bf16 and f16 travel as 16-bit words; reductions use the user ops. */
    case CAI_DTYPE_U16:
    case CAI_DTYPE_BF16:
    case CAI_DTYPE_F16: return MPI_UINT16_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static int is_reduction(cai_op_kind k) {
    k = cai_op_base(k);
    return k == CAI_OP_ALLREDUCE || k == CAI_OP_REDUCE_SCATTER;
}

static size_t vmax_extent(const size_t *counts, const size_t *displs, int n) {
    size_t e = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] && displs[i] + counts[i] > e) e = displs[i] + counts[i];
    return e;
}

void cai_coll_extent(const cai_coll *c, int n, size_t *send, size_t *recv) {
    size_t s = 0, r = 0;
    switch (cai_op_base(c->kind)) {
    case CAI_OP_ALLREDUCE:
    case CAI_OP_BCAST: s = r = c->count; break;
    case CAI_OP_REDUCE_SCATTER: s = c->count * (size_t)n, r = c->count; break;
    case CAI_OP_ALLGATHER: s = c->count, r = c->count * (size_t)n; break;
    case CAI_OP_ALLTOALL: s = r = c->count * (size_t)n; break;
    case CAI_OP_ALLTOALLV:
        s = vmax_extent(c->scounts, c->sdispls, n);
        r = vmax_extent(c->rcounts, c->rdispls, n);
        break;
    case CAI_OP_SEND: s = c->count; break;
    case CAI_OP_RECV: r = c->count; break;
    default: break;
    }
    *send = s;
    *recv = r;
}

int cai_coll_in_place(const cai_coll *c, int axis_rank, int n) {
    if (!c->send || !c->recv) return 0;
    if (c->send == c->recv) return 1;
    if (cai_op_base(c->kind) == CAI_OP_ALLGATHER)
        return (const char *)c->send == (const char *)c->recv + (size_t)axis_rank * c->count * cai_dtype_size(c->dtype);
    return 0;
}

/* ------------------------------------------------------------ host helpers */

static void scale_avg(void *buf, size_t count, cai_dtype dt, int n) {
    switch (dt) {
    case CAI_DTYPE_F32: {
        float *p = buf;
        for (size_t i = 0; i < count; i++) p[i] /= (float)n;
        break;
    }
    case CAI_DTYPE_F64: {
        double *p = buf;
        for (size_t i = 0; i < count; i++) p[i] /= n;
        break;
    }
    case CAI_DTYPE_BF16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < count; i++) p[i] = cai_cl_f32_to_bf16(cai_cl_bf16_to_f32(p[i]) / (float)n);
        break;
    }
    case CAI_DTYPE_F16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < count; i++) p[i] = cai_cl_f32_to_f16(cai_cl_f16_to_f32(p[i]) / (float)n);
        break;
    }
    case CAI_DTYPE_I32: {
        int32_t *p = buf;
        for (size_t i = 0; i < count; i++) p[i] /= n;
        break;
    }
    case CAI_DTYPE_I64: {
        int64_t *p = buf;
        for (size_t i = 0; i < count; i++) p[i] /= n;
        break;
    }
    case CAI_DTYPE_U8: {
        uint8_t *p = buf;
        for (size_t i = 0; i < count; i++) p[i] = (uint8_t)(p[i] / n);
        break;
    }
    case CAI_DTYPE_U16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < count; i++) p[i] = (uint16_t)(p[i] / n);
        break;
    }
    default: break;
    }
}

static MPI_Op mpi_op_for(const cai_mesh_t *m, cai_dtype dt, cai_reduce_op op) {
    int k = op == CAI_RED_MAX ? 1 : op == CAI_RED_MIN ? 2 : 0; /* AVG reduces as SUM */
    if (dt == CAI_DTYPE_BF16) return m->half_ops[0][k];
    if (dt == CAI_DTYPE_F16) return m->half_ops[1][k];
    return k == 1 ? MPI_MAX : k == 2 ? MPI_MIN : MPI_SUM;
}

void cai_pending_release(cai_pending *p) {
    cai_free(p->tmp_send);
    cai_free(p->tmp_recv);
    cai_free(p->tmp_ints);
    cai_free(p->reqs);
    p->tmp_send = p->tmp_recv = NULL;
    p->tmp_ints = NULL;
    p->reqs = NULL;
    p->nreq = 0;
}

static cai_status mpi_fail(int rc, const cai_pending *p, const char *call) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return CAI_ERROR(CAI_ERR_MPI, "%s (%s on axis %s, %zu x %s) failed: %s", call, cai_op_kind_name(p->c.kind),
                     cai_axis_name(p->c.axis), p->c.count, cai_dtype_name(p->c.dtype), text);
}

/* Issues piece `k` of the operation: into reqs[k] (non-blocking) or, with
 * req == NULL, as the blocking call. Only allreduce, broadcast and
 * point-to-point are split into pieces. */
static cai_status mpi_issue(cai_mesh_t *m, cai_pending *p, size_t piece, MPI_Request *req) {
    const cai_coll *c = &p->c;
    MPI_Comm comm = m->comm[c->axis];
    MPI_Datatype t = cai_mpi_dtype(c->dtype);
    size_t es = cai_dtype_size(c->dtype);
    int n = m->size[c->axis], me = m->rank[c->axis];
    int in_place = cai_coll_in_place(c, me, n);
    size_t off = piece * m->max_chunk;
    int cnt = (int)(c->count - off < m->max_chunk ? c->count - off : m->max_chunk);
    const char *sb = (const char *)c->send + off * es;
    char *rb = (char *)c->recv + off * es;
    int rc;
    const char *call;
    switch (cai_op_base(c->kind)) {
    case CAI_OP_ALLREDUCE: {
        const void *s = in_place ? MPI_IN_PLACE : sb;
        MPI_Op op = mpi_op_for(m, c->dtype, c->op);
        call = "MPI_Allreduce";
        rc = req ? MPI_Iallreduce(s, rb, cnt, t, op, comm, req) : MPI_Allreduce(s, rb, cnt, t, op, comm);
        break;
    }
    case CAI_OP_REDUCE_SCATTER: {
        const void *s = in_place ? MPI_IN_PLACE : c->send;
        MPI_Op op = mpi_op_for(m, c->dtype, c->op);
        call = "MPI_Reduce_scatter_block";
        rc = req ? MPI_Ireduce_scatter_block(s, c->recv, (int)c->count, t, op, comm, req)
                 : MPI_Reduce_scatter_block(s, c->recv, (int)c->count, t, op, comm);
        break;
    }
    case CAI_OP_ALLGATHER: {
        /* In place either way: the own contribution sits in the own block. */
        const void *s = in_place ? MPI_IN_PLACE : c->send;
        call = "MPI_Allgather";
        rc = req ? MPI_Iallgather(s, (int)c->count, t, c->recv, (int)c->count, t, comm, req)
                 : MPI_Allgather(s, (int)c->count, t, c->recv, (int)c->count, t, comm);
        break;
    }
    case CAI_OP_ALLTOALL: {
        /* prepare() turned in place into a copy. */
        call = "MPI_Alltoall";
        rc = req ? MPI_Ialltoall(c->send, (int)c->count, t, c->recv, (int)c->count, t, comm, req)
                 : MPI_Alltoall(c->send, (int)c->count, t, c->recv, (int)c->count, t, comm);
        break;
    }
    case CAI_OP_ALLTOALLV: {
        int *sc = p->tmp_ints, *sd = sc + n, *rcn = sd + n, *rd = rcn + n;
        call = "MPI_Alltoallv";
        rc = req ? MPI_Ialltoallv(c->send, sc, sd, t, c->recv, rcn, rd, t, comm, req)
                 : MPI_Alltoallv(c->send, sc, sd, t, c->recv, rcn, rd, t, comm);
        break;
    }
    case CAI_OP_BCAST:
    case CAI_OP_NCCL_INIT:
        call = "MPI_Bcast";
        rc = req ? MPI_Ibcast(rb, cnt, t, c->peer, comm, req) : MPI_Bcast(rb, cnt, t, c->peer, comm);
        break;
    case CAI_OP_BARRIER:
        call = "MPI_Barrier";
        rc = req ? MPI_Ibarrier(comm, req) : MPI_Barrier(comm);
        break;
    case CAI_OP_SEND:
        call = "MPI_Send";
        rc = req ? MPI_Isend(sb, cnt, t, c->peer, c->tag, comm, req) : MPI_Send(sb, cnt, t, c->peer, c->tag, comm);
        break;
    case CAI_OP_RECV:
        call = "MPI_Recv";
        rc = req ? MPI_Irecv(rb, cnt, t, c->peer, c->tag, comm, req)
                 : MPI_Recv(rb, cnt, t, c->peer, c->tag, comm, MPI_STATUS_IGNORE);
        break;
    default: return CAI_ERROR(CAI_ERR_INTERNAL, "operation kind %d has no MPI path", (int)c->kind);
    }
    if (rc != MPI_SUCCESS) return mpi_fail(rc, p, call);
    return CAI_OK;
}

static int splittable(cai_op_kind k) {
    k = cai_op_base(k);
    return k == CAI_OP_ALLREDUCE || k == CAI_OP_BCAST || k == CAI_OP_SEND || k == CAI_OP_RECV || k == CAI_OP_NCCL_INIT;
}

static size_t pieces(const cai_mesh_t *m, const cai_coll *c) {
    if (!splittable(c->kind) || c->count == 0) return 1;
    return (c->count + m->max_chunk - 1) / m->max_chunk;
}

static cai_status check_int_counts(const cai_mesh_t *m, cai_pending *p) {
    const cai_coll *c = &p->c;
    int n = m->size[c->axis];
    if (splittable(c->kind)) return CAI_OK;
    if (c->kind == CAI_OP_ALLTOALLV) {
        CAI_CALL(cai_malloc((void **)&p->tmp_ints, 4 * (size_t)n * sizeof(int), "all_to_allv counts"));
        const size_t *src[4] = {c->scounts, c->sdispls, c->rcounts, c->rdispls};
        static const char *const what[4] = {"send count", "send displacement", "receive count", "receive displacement"};
        for (int a = 0; a < 4; a++)
            for (int i = 0; i < n; i++) {
                if (src[a][i] > (size_t)INT_MAX || src[a][i] > m->max_chunk)
                    return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                                     "all_to_allv on axis %s: %s %zu for axis rank %d exceeds %zu elements, the most "
                                     "one MPI call takes; split the exchange",
                                     cai_axis_name(c->axis), what[a], src[a][i], i, m->max_chunk);
                p->tmp_ints[a * n + i] = (int)src[a][i];
            }
        return CAI_OK;
    }
    if (c->count > m->max_chunk)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s on axis %s: %zu elements per rank exceed %zu, the most one MPI call takes; split it",
                         cai_op_kind_name(c->kind), cai_axis_name(c->axis), c->count, m->max_chunk);
    return CAI_OK;
}

static int poll_requests(void *ctx) {
    cai_pending *p = ctx;
    int flag = 0;
    int rc = MPI_Testall(p->nreq, p->reqs, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        mpi_fail(rc, p, "MPI_Testall");
        return -1;
    }
    return flag;
}

/* Staging buffers and in-place copies that must exist before the MPI call. */
static cai_status prepare(cai_mesh_t *m, cai_pending *p) {
    int n = m->size[p->c.axis];
    size_t es = cai_dtype_size(p->c.dtype), se, re;
    cai_coll_extent(&p->user, n, &se, &re);
    if (p->device == CAI_DEV_STAGE) {
        int in_place = cai_coll_in_place(&p->user, m->rank[p->c.axis], n);
        size_t span = re;
        if (in_place) {
            /* The in-place buffer also holds the input (reduce_scatter: all blocks). */
            size_t off = (size_t)((const char *)p->user.send - (const char *)p->user.recv) / es;
            if (off + se > span) span = off + se;
        }
        /* In-place and broadcast operations read the receive buffer, and
         * all_to_allv must keep what lies between its blocks. */
        if (span) CAI_CALL(cai_malloc(&p->tmp_recv, span * es, "host staging (receive)"));
        if (span && (in_place || p->c.kind == CAI_OP_ALLTOALLV))
            CAI_CALL(cai_cl_copy_to_host(p->tmp_recv, p->user.recv, span * es));
        if (in_place) {
            p->c.send = (const char *)p->tmp_recv + ((const char *)p->user.send - (const char *)p->user.recv);
        } else if (se) {
            CAI_CALL(cai_malloc(&p->tmp_send, se * es, "host staging (send)"));
            CAI_CALL(cai_cl_copy_to_host(p->tmp_send, p->user.send, se * es));
            p->c.send = p->tmp_send;
        }
        p->c.recv = p->tmp_recv;
    }
    if (p->c.kind == CAI_OP_ALLTOALL && cai_coll_in_place(&p->c, m->rank[p->c.axis], n) && se) {
        /* Open MPI's non-blocking all-to-all does not take MPI_IN_PLACE. */
        void *copy = NULL;
        CAI_CALL(cai_malloc(&copy, se * es, "in-place all_to_all copy"));
        memcpy(copy, p->c.send, se * es);
        cai_free(p->tmp_send);
        p->tmp_send = copy;
        p->c.send = copy;
    }
    return check_int_counts(m, p);
}

/* After completion: averages, copies back from staging, frees temporaries. */
static cai_status finish(cai_mesh_t *m, cai_pending *p) {
    cai_status st = CAI_OK;
    if (is_reduction(p->c.kind) && p->c.op == CAI_RED_AVG && p->group_size > 1)
        scale_avg(p->c.recv, p->c.count, p->c.dtype, p->group_size);
    if (p->device == CAI_DEV_STAGE && p->tmp_recv) {
        size_t se, re;
        cai_coll_extent(&p->user, p->group_size, &se, &re);
        st = cai_cl_copy_to_device(p->user.recv, p->tmp_recv, re * cai_dtype_size(p->c.dtype));
    }
    cai_pending_release(p);
    (void)m;
    return st;
}

/* ------------------------------------------------------------ orphans */

static cai_status adopt_orphan(cai_mesh_t *m, cai_pending *p) {
    cai_pending *o = NULL;
    cai_status st = cai_malloc((void **)&o, sizeof *o, "timed-out operation");
    if (st != CAI_OK) return st; /* the temporaries leak; the requests stay valid */
    *o = *p;
    o->next = m->orphans;
    m->orphans = o;
    memset(p, 0, sizeof *p);
    return CAI_OK;
}

void cai_orphans_progress(cai_mesh_t *m) {
    cai_pending **link = &m->orphans;
    while (*link) {
        cai_pending *o = *link;
        if (poll_requests(o) == 1) {
            *link = o->next;
            if (finish(m, o) != CAI_OK) cai_error_clear();
            cai_free(o);
        } else {
            link = &o->next;
        }
    }
}

cai_status cai_mesh_drain(cai_mesh_t *m, double timeout_s) {
    CAI_CHECK_ARG(m, "cai_mesh_drain: mesh is NULL");
    double t0 = cai_time_now();
    for (;;) {
        cai_orphans_progress(m);
        if (!m->orphans) return CAI_OK;
        if (cai_time_now() - t0 > timeout_s) break;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    int n = 0;
    for (cai_pending *o = m->orphans; o; o = o->next) n++;
    return CAI_ERROR(CAI_ERR_TIMEOUT,
                     "%d timed-out operation(s) still pending after %.1f s (first: %s #%llu on axis %s)", n, timeout_s,
                     cai_op_kind_name(m->orphans->c.kind), (unsigned long long)m->orphans->seq,
                     cai_axis_name(m->orphans->c.axis));
}

/* ------------------------------------------------------------ dispatch */

/* The end of an operation on the MPI path, by how waiting for it ended: a
 * timeout leaves it to the mesh, an error waits out the issued pieces
 * (their memory must outlive them), success finishes it. */
static cai_status host_conclude(cai_mesh_t *m, cai_pending *p, cai_status st) {
    if (st == CAI_ERR_TIMEOUT) {
        adopt_orphan(m, p);
        return st;
    }
    if (st == CAI_OK) return finish(m, p);
    if (p->nreq) MPI_Waitall(p->nreq, p->reqs, MPI_STATUSES_IGNORE);
    cai_pending_release(p);
    return st;
}

/* Runs a prepared operation on host memory through MPI. */
static cai_status host_run(cai_mesh_t *m, cai_pending *p) {
    size_t np = pieces(m, &p->c);
    if (m->timeout_s <= 0) {
        cai_status st = CAI_OK;
        for (size_t k = 0; k < np && st == CAI_OK; k++) st = mpi_issue(m, p, k, NULL);
        if (st != CAI_OK) {
            cai_pending_release(p);
            return st;
        }
        return finish(m, p);
    }
    cai_status st = cai_malloc((void **)&p->reqs, np * sizeof(MPI_Request), "MPI requests");
    for (size_t k = 0; k < np && st == CAI_OK; k++) {
        st = mpi_issue(m, p, k, &p->reqs[k]);
        if (st == CAI_OK) p->nreq++;
    }
    if (st == CAI_OK) st = cai_wd_wait(m, &p->c, p->seq, poll_requests, p);
    return host_conclude(m, p, st);
}

static cai_status check_common(cai_mesh_t *m, const cai_coll *c) {
    CAI_CHECK_ARG(m, "%s: mesh is NULL", cai_op_kind_name(c->kind));
    CAI_CHECK_ARG((int)c->axis >= 0 && c->axis < CAI_AXIS_COUNT, "%s: axis %d out of range", cai_op_kind_name(c->kind),
                  (int)c->axis);
    CAI_CHECK_ARG(cai_dtype_size(c->dtype) > 0, "%s on axis %s: invalid dtype %d", cai_op_kind_name(c->kind),
                  cai_axis_name(c->axis), (int)c->dtype);
    CAI_CHECK_ARG(!is_reduction(c->kind) || ((int)c->op >= CAI_RED_SUM && c->op <= CAI_RED_MIN),
                  "%s on axis %s: invalid reduce op %d", cai_op_kind_name(c->kind), cai_axis_name(c->axis), (int)c->op);
    int n = m->size[c->axis];
    if (c->kind == CAI_OP_BCAST || c->kind == CAI_OP_SEND || c->kind == CAI_OP_RECV)
        CAI_CHECK_ARG(c->peer >= 0 && c->peer < n, "%s on axis %s: %s %d is not an axis rank (group of %d)",
                      cai_op_kind_name(c->kind), cai_axis_name(c->axis), c->kind == CAI_OP_BCAST ? "root" : "peer",
                      c->peer, n);
    if (c->kind == CAI_OP_ALLTOALLV) {
        CAI_CHECK_ARG(c->scounts && c->sdispls && c->rcounts && c->rdispls,
                      "all_to_allv on axis %s: counts and displacements are required", cai_axis_name(c->axis));
        CAI_CHECK_ARG(c->send != c->recv || !c->send, "all_to_allv on axis %s: in place is not supported",
                      cai_axis_name(c->axis));
    }
    size_t se, re;
    cai_coll_extent(c, n, &se, &re);
    CAI_CHECK_ARG(!se || c->send, "%s on axis %s: send buffer is NULL for %zu elements", cai_op_kind_name(c->kind),
                  cai_axis_name(c->axis), se);
    CAI_CHECK_ARG(!re || c->recv, "%s on axis %s: receive buffer is NULL for %zu elements", cai_op_kind_name(c->kind),
                  cai_axis_name(c->axis), re);
    return CAI_OK;
}

/* Which path the buffers take. */
static cai_status classify(const cai_mesh_t *m, const cai_coll *c, int *dev) {
    *dev = CAI_DEV_NONE;
    if (c->kind == CAI_OP_BARRIER || c->kind == CAI_OP_NCCL_INIT) return CAI_OK;
    int n = m->size[c->axis];
    size_t se, re;
    cai_coll_extent(c, n, &se, &re);
    int sd = se && cai_cl_is_device_ptr(c->send), rd = re && cai_cl_is_device_ptr(c->recv);
    if (!sd && !rd) return CAI_OK;
    if (se && re && sd != rd)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s on axis %s: send buffer is %s memory but receive buffer is %s memory",
                         cai_op_kind_name(c->kind), cai_axis_name(c->axis), sd ? "device" : "host",
                         rd ? "device" : "host");
    int host_math =
        is_reduction(c->kind) && (c->op == CAI_RED_AVG || c->dtype == CAI_DTYPE_BF16 || c->dtype == CAI_DTYPE_F16);
    switch (m->device_comm) {
    case CAI_DEVICE_COMM_STAGE: *dev = CAI_DEV_STAGE; break;
    case CAI_DEVICE_COMM_MPI:
        if (!cai_mpi_cuda_aware())
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "device_comm=mpi but this MPI is not CUDA-aware (MPIX_Query_cuda_support)");
        *dev = host_math ? CAI_DEV_STAGE : CAI_DEV_MPI;
        break;
    case CAI_DEVICE_COMM_NCCL:
        if (!CAI_HAVE_NCCL) return CAI_ERROR(CAI_ERR_UNSUPPORTED, "device_comm=nccl but this build has no NCCL");
        /* fall through */
    default:
        if (CAI_HAVE_NCCL) /* NCCL has no 16-bit unsigned type to reduce. */
            *dev = is_reduction(c->kind) && c->dtype == CAI_DTYPE_U16 ? CAI_DEV_STAGE : CAI_DEV_NCCL;
        else if (cai_mpi_cuda_aware()) *dev = host_math ? CAI_DEV_STAGE : CAI_DEV_MPI;
        else *dev = CAI_DEV_STAGE;
    }
    return CAI_OK;
}

static cai_status start(cai_mesh_t *m, const cai_coll *c, cai_pending *p) {
    CAI_CALL(check_common(m, c));
    cai_orphans_progress(m);
    int dev;
    CAI_CALL(classify(m, c, &dev));
    if (dev == CAI_DEV_NCCL) CAI_CALL(cai_cl_nccl_ensure(m, c->axis));
    memset(p, 0, sizeof *p);
    p->c = p->user = *c;
    p->device = dev;
    p->group_size = m->size[c->axis];
    if (c->kind == CAI_OP_SEND || c->kind == CAI_OP_RECV) p->seq = ++m->p2p_seq[c->axis];
    else p->seq = cai_wd_enter(m, c->axis);
    if (dev == CAI_DEV_NCCL) return CAI_OK;
    /* MPI and the staging copies read device memory outside the caller's
     * stream order (the NCCL path orders its stream after it instead). */
    cai_status st = dev != CAI_DEV_NONE ? cai_cl_stream_sync(m->cuda_stream) : CAI_OK;
    if (st == CAI_OK) st = prepare(m, p);
    if (st != CAI_OK) cai_pending_release(p);
    return st;
}

static cai_status run(cai_mesh_t *m, const cai_coll *c) {
    cai_pending p;
    CAI_CALL(start(m, c, &p));
    if (p.device == CAI_DEV_NCCL) {
        CAI_CALL(cai_cl_nccl_run(m, &p.c, p.seq));
        return CAI_OK;
    }
    CAI_CALL(host_run(m, &p));
    return CAI_OK;
}

/* Host MPI operations the device layer needs for itself (creating NCCL
 * communicators): counted and watched like any collective. */
static cai_status host_internal(cai_mesh_t *m, const cai_coll *c) {
    cai_pending p;
    memset(&p, 0, sizeof p);
    p.c = p.user = *c;
    p.group_size = m->size[c->axis];
    p.seq = cai_wd_enter(m, c->axis);
    CAI_CALL(check_int_counts(m, &p));
    CAI_CALL(host_run(m, &p));
    return CAI_OK;
}

cai_status cai_host_barrier(cai_mesh_t *m, cai_axis axis) {
    cai_coll c = {.kind = CAI_OP_BARRIER, .axis = axis};
    CAI_CALL(host_internal(m, &c));
    return CAI_OK;
}

cai_status cai_host_bcast_bytes(cai_mesh_t *m, cai_axis axis, void *buf, size_t bytes, cai_op_kind kind) {
    cai_coll c = {.kind = kind, .axis = axis, .send = buf, .recv = buf, .count = bytes, .dtype = CAI_DTYPE_U8};
    CAI_CALL(host_internal(m, &c));
    return CAI_OK;
}

/* ------------------------------------------------------------ public calls */

cai_status cai_allreduce(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t count,
                         cai_dtype dtype, cai_reduce_op op) {
    cai_coll c = {.kind = CAI_OP_ALLREDUCE,
                  .axis = axis,
                  .send = sendbuf,
                  .recv = recvbuf,
                  .count = count,
                  .dtype = dtype,
                  .op = op};
    CAI_CALL(run(mesh, &c));
    return CAI_OK;
}

cai_status cai_reduce_scatter(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t recv_count,
                              cai_dtype dtype, cai_reduce_op op) {
    cai_coll c = {.kind = CAI_OP_REDUCE_SCATTER,
                  .axis = axis,
                  .send = sendbuf,
                  .recv = recvbuf,
                  .count = recv_count,
                  .dtype = dtype,
                  .op = op};
    CAI_CALL(run(mesh, &c));
    return CAI_OK;
}

cai_status cai_all_gather(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t send_count,
                          cai_dtype dtype) {
    cai_coll c = {
        .kind = CAI_OP_ALLGATHER, .axis = axis, .send = sendbuf, .recv = recvbuf, .count = send_count, .dtype = dtype};
    CAI_CALL(run(mesh, &c));
    return CAI_OK;
}

cai_status cai_all_to_all(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t count,
                          cai_dtype dtype) {
    cai_coll c = {
        .kind = CAI_OP_ALLTOALL, .axis = axis, .send = sendbuf, .recv = recvbuf, .count = count, .dtype = dtype};
    CAI_CALL(run(mesh, &c));
    return CAI_OK;
}

cai_status cai_all_to_allv(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, const size_t *send_counts,
                           const size_t *send_displs, void *recvbuf, const size_t *recv_counts,
                           const size_t *recv_displs, cai_dtype dtype) {
    cai_coll c = {.kind = CAI_OP_ALLTOALLV,
                  .axis = axis,
                  .send = sendbuf,
                  .recv = recvbuf,
                  .dtype = dtype,
                  .scounts = send_counts,
                  .sdispls = send_displs,
                  .rcounts = recv_counts,
                  .rdispls = recv_displs};
    CAI_CALL(run(mesh, &c));
    return CAI_OK;
}

cai_status cai_broadcast(cai_mesh_t *mesh, cai_axis axis, void *buf, size_t count, cai_dtype dtype, int root) {
    cai_coll c = {
        .kind = CAI_OP_BCAST, .axis = axis, .send = buf, .recv = buf, .count = count, .dtype = dtype, .peer = root};
    CAI_CALL(run(mesh, &c));
    return CAI_OK;
}

cai_status cai_send(cai_mesh_t *mesh, cai_axis axis, const void *buf, size_t count, cai_dtype dtype, int peer,
                    int tag) {
    cai_coll c = {
        .kind = CAI_OP_SEND, .axis = axis, .send = buf, .count = count, .dtype = dtype, .peer = peer, .tag = tag};
    CAI_CALL(run(mesh, &c));
    return CAI_OK;
}

cai_status cai_recv(cai_mesh_t *mesh, cai_axis axis, void *buf, size_t count, cai_dtype dtype, int peer, int tag) {
    cai_coll c = {
        .kind = CAI_OP_RECV, .axis = axis, .recv = buf, .count = count, .dtype = dtype, .peer = peer, .tag = tag};
    CAI_CALL(run(mesh, &c));
    return CAI_OK;
}

cai_status cai_barrier(cai_mesh_t *mesh, cai_axis axis) {
    cai_coll c = {.kind = CAI_OP_BARRIER, .axis = axis};
    CAI_CALL(run(mesh, &c));
    return CAI_OK;
}

/* The non-blocking forms: issued like the blocking ones (same checks, same
 * watchdog numbering, same paths), completed by cai_wait / cai_test. */
static cai_status istart(cai_mesh_t *mesh, const cai_coll *c, cai_request_t **req) {
    CAI_CHECK_ARG(req, "%s: req is NULL", cai_op_kind_name(c->kind));
    *req = NULL;
    cai_request_t *r = NULL;
    CAI_CALL(cai_calloc((void **)&r, 1, sizeof *r, "request"));
    r->mesh = mesh;
    cai_status st;
    CAI_CALL_GOTO(start(mesh, c, &r->op), st, fail);
    if (r->op.device == CAI_DEV_NCCL) {
        CAI_CALL_GOTO(cai_cl_nccl_start(mesh, &r->op), st, fail);
    } else {
        size_t np = pieces(mesh, &r->op.c);
        CAI_CALL_GOTO(cai_malloc((void **)&r->op.reqs, np * sizeof(MPI_Request), "MPI requests"), st, fail_op);
        for (size_t k = 0; k < np; k++) {
            st = mpi_issue(mesh, &r->op, k, &r->op.reqs[k]);
            if (st != CAI_OK) {
                cai_error_push(__FILE__, __LINE__, __func__, "mpi_issue");
                if (r->op.nreq) MPI_Waitall(r->op.nreq, r->op.reqs, MPI_STATUSES_IGNORE);
                goto fail_op;
            }
            r->op.nreq++;
        }
    }
    *req = r;
    return CAI_OK;
fail_op:
    cai_pending_release(&r->op);
fail:
    cai_free(r);
    return st;
}

cai_status cai_iallreduce(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t count,
                          cai_dtype dtype, cai_reduce_op op, cai_request_t **req) {
    cai_coll c = {.kind = CAI_OP_IALLREDUCE,
                  .axis = axis,
                  .send = sendbuf,
                  .recv = recvbuf,
                  .count = count,
                  .dtype = dtype,
                  .op = op};
    CAI_CALL(istart(mesh, &c, req));
    return CAI_OK;
}

cai_status cai_ireduce_scatter(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t recv_count,
                               cai_dtype dtype, cai_reduce_op op, cai_request_t **req) {
    cai_coll c = {.kind = CAI_OP_IREDUCE_SCATTER,
                  .axis = axis,
                  .send = sendbuf,
                  .recv = recvbuf,
                  .count = recv_count,
                  .dtype = dtype,
                  .op = op};
    CAI_CALL(istart(mesh, &c, req));
    return CAI_OK;
}

cai_status cai_iall_gather(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t send_count,
                           cai_dtype dtype, cai_request_t **req) {
    cai_coll c = {
        .kind = CAI_OP_IALLGATHER, .axis = axis, .send = sendbuf, .recv = recvbuf, .count = send_count, .dtype = dtype};
    CAI_CALL(istart(mesh, &c, req));
    return CAI_OK;
}

cai_status cai_iall_to_all(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t count,
                           cai_dtype dtype, cai_request_t **req) {
    cai_coll c = {
        .kind = CAI_OP_IALLTOALL, .axis = axis, .send = sendbuf, .recv = recvbuf, .count = count, .dtype = dtype};
    CAI_CALL(istart(mesh, &c, req));
    return CAI_OK;
}

cai_status cai_isend(cai_mesh_t *mesh, cai_axis axis, const void *buf, size_t count, cai_dtype dtype, int peer, int tag,
                     cai_request_t **req) {
    cai_coll c = {
        .kind = CAI_OP_SEND, .axis = axis, .send = buf, .count = count, .dtype = dtype, .peer = peer, .tag = tag};
    CAI_CALL(istart(mesh, &c, req));
    return CAI_OK;
}

cai_status cai_irecv(cai_mesh_t *mesh, cai_axis axis, void *buf, size_t count, cai_dtype dtype, int peer, int tag,
                     cai_request_t **req) {
    cai_coll c = {
        .kind = CAI_OP_RECV, .axis = axis, .recv = buf, .count = count, .dtype = dtype, .peer = peer, .tag = tag};
    CAI_CALL(istart(mesh, &c, req));
    return CAI_OK;
}

/* Frees a request whose operation is over (or left to the mesh). */
static cai_status request_free(cai_request_t *req, cai_status st) {
    cai_op_kind kind = req->op.c.kind;
    cai_free(req);
    if (st != CAI_OK) cai_error_push(__FILE__, __LINE__, __func__, cai_op_kind_name(kind));
    return st;
}

/* Waits for a request under the watchdog (and limit_s when > 0) and frees it. */
static cai_status wait_request(cai_request_t *req, double limit_s) {
    cai_mesh_t *m = req->mesh;
    cai_pending *p = &req->op;
    cai_status st;
    /* A point-to-point wait is a pipeline stage waiting for its input, on
     * the critical path: the collectives' naps of up to 1 ms added about a
     * millisecond to every long wait there (a 2-stage 1f1b step 1.2% longer
     * than its schedule); 50 us keeps a waiting rank off a shared core as
     * well. */
    const long nap_ns = p->c.kind == CAI_OP_SEND || p->c.kind == CAI_OP_RECV ? 50000 : 1000000;
    if (p->device == CAI_DEV_NCCL) st = cai_cl_nccl_finish(m, p, limit_s);
    else st = host_conclude(m, p, cai_wd_wait_nap(m, &p->c, p->seq, poll_requests, p, limit_s, nap_ns));
    return request_free(req, st);
}

cai_status cai_wait(cai_request_t *req) {
    CAI_CHECK_ARG(req, "cai_wait: request is NULL");
    CAI_CALL(wait_request(req, 0));
    return CAI_OK;
}

cai_status cai_wait_timeout(cai_request_t *req, double timeout_s) {
    CAI_CHECK_ARG(req, "cai_wait_timeout: request is NULL");
    /* A bad limit must not leak the request: it is waited for without one. */
    if (!(timeout_s > 0)) {
        cai_status st = wait_request(req, 0);
        if (st != CAI_OK) return st;
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "cai_wait_timeout: timeout %g s must be > 0 (the request was waited "
                         "for under the mesh's watchdog alone)",
                         timeout_s);
    }
    CAI_CALL(wait_request(req, timeout_s));
    return CAI_OK;
}

cai_status cai_test(cai_request_t *req, int *done) {
    CAI_CHECK_ARG(req && done, "cai_test: NULL argument");
    *done = 0;
    cai_mesh_t *m = req->mesh;
    cai_pending *p = &req->op;
    cai_status st;
    if (p->device == CAI_DEV_NCCL) {
        st = cai_cl_nccl_test(m, p, done);
        if (!*done) return st;
    } else {
        int r = poll_requests(p);
        if (r == 0) return CAI_OK;
        *done = 1;
        /* poll_requests set the trace when it failed. */
        st = host_conclude(m, p, r == 1 ? CAI_OK : cai_error_status());
    }
    return request_free(req, st);
}
