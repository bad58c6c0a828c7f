/* Collective bandwidth the way nccl-tests reports it: "size" is the bytes of
 * the full buffer, algbw = size / time, busbw = algbw x the fraction of the
 * data each link carries (2(n-1)/n for all-reduce, (n-1)/n for all-gather,
 * reduce-scatter and all-to-all), so busbw compares directly with link speed. */
#include "cai_config.h"

#include <string.h>

#include "cluster_internal.h"

static const char *const k_bench_names[CAI_BENCH_COUNT] = {
    [CAI_BENCH_ALLREDUCE] = "allreduce",
    [CAI_BENCH_ALLGATHER] = "allgather",
    [CAI_BENCH_REDUCE_SCATTER] = "reducescatter",
    [CAI_BENCH_ALLTOALL] = "alltoall",
};

const char *cai_bench_op_name(cai_bench_op op) {
    if ((int)op < 0 || op >= CAI_BENCH_COUNT) return "?";
    return k_bench_names[op];
}

static double bus_factor(cai_bench_op op, int n) {
    if (op == CAI_BENCH_ALLREDUCE) return 2.0 * (n - 1) / n;
    return (double)(n - 1) / n;
}

static cai_status bench_once(cai_mesh_t *m, cai_axis axis, cai_bench_op op, const void *s, void *r, size_t count) {
    switch (op) {
    case CAI_BENCH_ALLREDUCE: CAI_CALL(cai_allreduce(m, axis, s, r, count, CAI_DTYPE_F32, CAI_RED_SUM)); break;
    case CAI_BENCH_ALLGATHER: CAI_CALL(cai_all_gather(m, axis, s, r, count, CAI_DTYPE_F32)); break;
    case CAI_BENCH_REDUCE_SCATTER:
        CAI_CALL(cai_reduce_scatter(m, axis, s, r, count, CAI_DTYPE_F32, CAI_RED_SUM));
        break;
    default: CAI_CALL(cai_all_to_all(m, axis, s, r, count, CAI_DTYPE_F32)); break;
    }
    return CAI_OK;
}

cai_status cai_mesh_bench(cai_mesh_t *m, cai_axis axis, cai_bench_op op, size_t bytes, int warmup, int iters,
                          int on_device, cai_bench_result *out) {
    CAI_CHECK_ARG(m && out, "cai_mesh_bench: NULL argument");
    CAI_CHECK_ARG((int)axis >= 0 && axis < CAI_AXIS_COUNT, "cai_mesh_bench: axis %d out of range", (int)axis);
    CAI_CHECK_ARG((int)op >= 0 && op < CAI_BENCH_COUNT, "cai_mesh_bench: operation %d out of range", (int)op);
    CAI_CHECK_ARG(iters >= 1 && warmup >= 0, "cai_mesh_bench: iters=%d must be >= 1 and warmup=%d >= 0", iters, warmup);
    if (on_device && !cai_cl_cuda_usable())
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "cai_mesh_bench: device buffers asked for, but %s",
                         CAI_HAVE_CUDA ? "no CUDA device is usable" : "this build has no CUDA");
    int n = m->size[axis];
    /* count: elements per call argument; send/recv: buffer elements. */
    size_t elems = bytes / sizeof(float), per = op == CAI_BENCH_ALLREDUCE ? 1 : (size_t)n;
    size_t count = elems / per;
    if (count == 0) count = 1;
    size_t total = count * per;
    size_t send_elems = op == CAI_BENCH_ALLGATHER ? count : total;
    size_t recv_elems = op == CAI_BENCH_REDUCE_SCATTER ? count : total;

    float *host = NULL;
    void *s = NULL, *r = NULL;
    cai_status st;
    CAI_CALL_GOTO(cai_malloc((void **)&host, total * sizeof(float), "bench input"), st, done);
    for (size_t i = 0; i < total; i++) host[i] = (float)((m->world_rank + i) % 7);
    if (on_device) {
        CAI_CALL_GOTO(cai_cl_device_alloc(&s, send_elems * sizeof(float)), st, done);
        CAI_CALL_GOTO(cai_cl_device_alloc(&r, recv_elems * sizeof(float)), st, done);
        CAI_CALL_GOTO(cai_cl_device_fill(s, host, send_elems * sizeof(float)), st, done);
    } else {
        CAI_CALL_GOTO(cai_malloc(&s, send_elems * sizeof(float), "bench send"), st, done);
        CAI_CALL_GOTO(cai_malloc(&r, recv_elems * sizeof(float), "bench recv"), st, done);
        memcpy(s, host, send_elems * sizeof(float));
    }
    for (int i = 0; i < warmup; i++) CAI_CALL_GOTO(bench_once(m, axis, op, s, r, count), st, done);
    CAI_CALL_GOTO(cai_barrier(m, axis), st, done);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) CAI_CALL_GOTO(bench_once(m, axis, op, s, r, count), st, done);
    double local = (MPI_Wtime() - t0) / iters, worst = local;
    CAI_CALL_GOTO(cai_allreduce(m, axis, &local, &worst, 1, CAI_DTYPE_F64, CAI_RED_MAX), st, done);
    memset(out, 0, sizeof *out);
    out->op = op;
    out->axis = axis;
    out->bytes = total * sizeof(float);
    out->time_us = worst * 1e6;
    out->algbw_gbs = worst > 0 ? (double)out->bytes / worst / 1e9 : 0;
    out->busbw_gbs = out->algbw_gbs * bus_factor(op, n);
    st = CAI_OK;
done:
    cai_free(host);
    if (on_device) {
        cai_cl_device_free(s);
        cai_cl_device_free(r);
    } else {
        cai_free(s);
        cai_free(r);
    }
    return st;
}
