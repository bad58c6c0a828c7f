/* The engine's dp collectives. All-reduces use the cluster layer's
 * non-blocking cai_iallreduce (watchdog, NCCL). The cluster layer has no
 * non-blocking reduce-scatter or all-gather yet, so for host buffers these
 * go to MPI_Ireduce_scatter_block / MPI_Iallgather on the dp axis'
 * communicator (cai_mesh_comm) with the engine's own deadline; device
 * buffers use the blocking cai_reduce_scatter / cai_all_gather (NCCL),
 * which trades overlap for correctness until the non-blocking forms exist. */
#include "cai_config.h"

#include <limits.h>
#include <sched.h>
#include <string.h>

#include "zero_internal.h"

static cai_status check_count(const zc_ctx *c, size_t n, const char *what, int bucket) {
    if (n > (size_t)INT_MAX)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "ZeRO %s of bucket %d: %zu elements per rank exceed MPI's int count; "
                         "use a smaller zero.bucket_mb", what, bucket, n);
    (void)c;
    return CAI_OK;
}

cai_status zc_allreduce_sum(zc_ctx *c, float *buf, size_t count, int bucket, zc_req *r) {
    memset(r, 0, sizeof *r);
    r->what = "all-reduce";
    r->bucket = bucket;
    if (c->size == 1 || count == 0) return CAI_OK;
    c->bytes += (double)count * sizeof(float);
    CAI_CALL(cai_iallreduce(c->mesh, CAI_AXIS_DP, buf, buf, count, CAI_DTYPE_F32, CAI_RED_SUM, &r->creq));
    r->kind = ZC_CAI;
    return CAI_OK;
}

cai_status zc_reduce_scatter_sum(zc_ctx *c, const float *send, float *recv, size_t chunk, int bucket, zc_req *r) {
    memset(r, 0, sizeof *r);
    r->what = "reduce-scatter";
    r->bucket = bucket;
    if (chunk == 0) return CAI_OK;
    if (c->size == 1) {
        if (send != recv)
            CAI_CALL(cai_device_copy(c->dev, recv, send, chunk * sizeof(float),
                                     c->host ? CAI_COPY_H2H : CAI_COPY_D2D));
        return CAI_OK;
    }
    c->bytes += (double)chunk * (size_t)c->size * sizeof(float);
    if (!c->host) {
        CAI_CALL(cai_reduce_scatter(c->mesh, CAI_AXIS_DP, send, recv, chunk, CAI_DTYPE_F32, CAI_RED_SUM));
        return CAI_OK;
    }
    CAI_CALL(check_count(c, chunk, r->what, bucket));
    CAI_CALL_MPI(MPI_Ireduce_scatter_block(send, recv, (int)chunk, MPI_FLOAT, MPI_SUM, c->comm, &r->mreq));
    r->kind = ZC_MPI;
    return CAI_OK;
}

cai_status zc_all_gather(zc_ctx *c, void *buf, size_t chunk, cai_dtype dtype, int bucket, zc_req *r) {
    memset(r, 0, sizeof *r);
    r->what = "all-gather";
    r->bucket = bucket;
    if (c->size == 1 || chunk == 0) return CAI_OK;
    size_t es = cai_dtype_size(dtype);
    c->bytes += (double)chunk * es;
    if (!c->host) {
        void *own = (char *)buf + (size_t)c->rank * chunk * es;
        CAI_CALL(cai_all_gather(c->mesh, CAI_AXIS_DP, own, buf, chunk, dtype));
        return CAI_OK;
    }
    CAI_CALL(check_count(c, chunk, r->what, bucket));
    /* A bit copy: 16-bit types travel as unsigned shorts. */
    MPI_Datatype t = es == 4 ? MPI_FLOAT : es == 2 ? MPI_UINT16_T : MPI_BYTE;
    int n = (int)(es == 4 || es == 2 ? chunk : chunk * es);
    CAI_CALL_MPI(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, n, t, c->comm, &r->mreq));
    r->kind = ZC_MPI;
    return CAI_OK;
}

cai_status zc_wait(zc_ctx *c, zc_req *r) {
    int kind = r->kind;
    r->kind = ZC_NONE;
    if (kind == ZC_NONE) return CAI_OK;
    if (kind == ZC_CAI) {
        CAI_CALL(cai_wait(r->creq));
        r->creq = NULL;
        return CAI_OK;
    }
    /* Poll with a deadline (MPI_Wait would hang forever on a dead peer);
     * yielding lets oversubscribed ranks on the same core make progress. */
    double t0 = MPI_Wtime();
    for (long spins = 0;; spins++) {
        int done = 0;
        CAI_CALL_MPI(MPI_Test(&r->mreq, &done, MPI_STATUS_IGNORE));
        if (done) return CAI_OK;
        if ((spins & 63) == 63 && MPI_Wtime() - t0 > c->timeout_s)
            return CAI_ERROR(CAI_ERR_TIMEOUT, "ZeRO %s of bucket %d over the dp axis (%d ranks) did not complete in "
                             "%g s: a dp rank is late, stuck or dead (raise zero.timeout if it is only slow)",
                             r->what, r->bucket, c->size, c->timeout_s);
        sched_yield();
    }
}

void zc_progress(zc_ctx *c, zc_req *reqs, int n) {
    if (!c->host) return;
    int any_cai = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i].kind == ZC_MPI) {
            int done = 0;
            MPI_Test(&reqs[i].mreq, &done, MPI_STATUS_IGNORE);
            if (done) reqs[i].kind = ZC_NONE;
        }
        any_cai |= reqs[i].kind == ZC_CAI;
    }
    /* cai_request is opaque; any MPI call drives the progress engine. */
    if (any_cai) {
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c->comm, &flag, MPI_STATUS_IGNORE);
    }
}
