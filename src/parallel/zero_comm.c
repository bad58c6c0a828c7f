/* The engine's dp collectives, all through the cluster layer's non-blocking
 * forms (cai_iallreduce, cai_ireduce_scatter, cai_iall_gather): host buffers
 * over MPI, device buffers over NCCL, so every stage overlaps its reductions
 * and gathers with compute on either. Each wait has the engine's own deadline
 * (cai_zero_config.timeout_s, through cai_wait_timeout) on top of the mesh's
 * watchdog, whose report names the ranks behind. */
#include "cai_config.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "zero_internal.h"

/* The MPI path takes int counts; the cluster layer refuses more too, but
 * this names the setting that fixes it. NCCL takes any count. */
static cai_status check_count(const zc_ctx *c, size_t n, const char *what, int bucket) {
    if (c->host && n > (size_t)INT_MAX)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "ZeRO %s of bucket %d: %zu elements per rank exceed MPI's int count; "
                         "use a smaller zero.bucket_mb",
                         what, bucket, n);
    return CAI_OK;
}

static void req_init(zc_req *r, const char *what, int bucket) {
    r->kind = ZC_NONE;
    r->creq = NULL;
    r->err = CAI_OK;
    r->msg[0] = 0;
    r->what = what;
    r->bucket = bucket;
}

cai_status zc_allreduce_sum(zc_ctx *c, void *buf, cai_dtype dt, size_t count, int bucket, zc_req *r) {
    req_init(r, "all-reduce", bucket);
    if (c->size == 1 || count == 0) return CAI_OK;
    c->bytes += (double)count * cai_dtype_size(dt);
    CAI_CALL(cai_iallreduce(c->mesh, c->axis, buf, buf, count, dt, CAI_RED_SUM, &r->creq));
    r->kind = ZC_CAI;
    return CAI_OK;
}

cai_status zc_reduce_scatter_sum(zc_ctx *c, const void *send, void *recv, cai_dtype dt, size_t chunk, int bucket,
                                 zc_req *r) {
    req_init(r, "reduce-scatter", bucket);
    if (chunk == 0) return CAI_OK;
    const size_t es = cai_dtype_size(dt);
    if (c->size == 1) {
        if (send != recv)
            CAI_CALL(cai_device_copy(c->dev, recv, send, chunk * es, c->host ? CAI_COPY_H2H : CAI_COPY_D2D));
        return CAI_OK;
    }
    c->bytes += (double)chunk * (size_t)c->size * es;
    CAI_CALL(check_count(c, chunk, r->what, bucket));
    CAI_CALL(cai_ireduce_scatter(c->mesh, c->axis, send, recv, chunk, dt, CAI_RED_SUM, &r->creq));
    r->kind = ZC_CAI;
    return CAI_OK;
}

cai_status zc_all_to_all(zc_ctx *c, const void *send, void *recv, cai_dtype dt, size_t count, int bucket, zc_req *r) {
    req_init(r, "all-to-all", bucket);
    if (count == 0) return CAI_OK;
    const size_t es = cai_dtype_size(dt);
    if (c->size == 1) return cai_device_copy(c->dev, recv, send, count * es, c->host ? CAI_COPY_H2H : CAI_COPY_D2D);
    c->bytes += (double)count * (size_t)c->size * es;
    CAI_CALL(check_count(c, count, r->what, bucket));
    CAI_CALL(cai_iall_to_all(c->mesh, c->axis, send, recv, count, dt, &r->creq));
    r->kind = ZC_CAI;
    return CAI_OK;
}

cai_status zc_all_gather(zc_ctx *c, void *buf, size_t chunk, cai_dtype dtype, int bucket, zc_req *r) {
    req_init(r, "all-gather", bucket);
    if (c->size == 1 || chunk == 0) return CAI_OK;
    size_t es = cai_dtype_size(dtype);
    c->bytes += (double)chunk * es;
    CAI_CALL(check_count(c, chunk, r->what, bucket));
    /* In place: the own chunk already sits in its block. */
    void *own = (char *)buf + (size_t)c->rank * chunk * es;
    CAI_CALL(cai_iall_gather(c->mesh, c->axis, own, buf, chunk, dtype, &r->creq));
    r->kind = ZC_CAI;
    return CAI_OK;
}

cai_status zc_wait(zc_ctx *c, zc_req *r) {
    int kind = r->kind;
    cai_request_t *q = r->creq;
    r->kind = ZC_NONE;
    r->creq = NULL;
    if (kind == ZC_NONE) return CAI_OK;
    if (kind == ZC_FAILED)
        return CAI_ERROR(r->err, "ZeRO %s of bucket %d over the dp axis failed while in flight: %s", r->what, r->bucket,
                         r->msg);
    /* The request is freed whatever the wait returns; after a timeout the
     * mesh keeps the operation (MPI cannot cancel a collective). */
    cai_status st = cai_wait_timeout(q, c->timeout_s);
    if (st == CAI_ERR_TIMEOUT) {
        char why[1024];
        snprintf(why, sizeof why, "%s", cai_error_message());
        return CAI_ERROR(CAI_ERR_TIMEOUT,
                         "ZeRO %s of bucket %d over the dp axis (%d ranks) timed out (zero.timeout "
                         "%g s; raise it if a rank is only slow): %s",
                         r->what, r->bucket, c->size, c->timeout_s, why);
    }
    CAI_CALL(st);
    return CAI_OK;
}

void zc_progress(zc_ctx *c, zc_req *reqs, int n) {
    if (!c->host) return;
    for (int i = 0; i < n; i++) {
        zc_req *r = &reqs[i];
        if (r->kind != ZC_CAI) continue;
        int done = 0;
        cai_status st = cai_test(r->creq, &done);
        if (!done) continue;
        r->creq = NULL;
        r->kind = ZC_NONE;
        if (st != CAI_OK) {
            /* Reported by the zc_wait that would have completed it. */
            r->kind = ZC_FAILED;
            r->err = st;
            snprintf(r->msg, sizeof r->msg, "%s", cai_error_message());
            cai_error_clear();
        }
    }
}
