/* Collectives on CUDA device buffers: the checks of test_collectives over
 * NCCL and over host staging (and CUDA-aware MPI where the library has it),
 * the non-blocking forms against the blocking ones (many in flight, the
 * NCCL event pool's steady state, ordering after the caller's stream),
 * the watchdog on a stalled NCCL collective, and the bandwidth bench side by
 * side with raw NCCL calls. Plain C (no Check) so it also builds on GPU
 * machines without it; exits 77 (skipped) where no CUDA device is usable.
 * One GPU per rank, chosen from the node-local rank. */
#include "cai_config.h"

#include <stdio.h>
#include <time.h>

#include "test_collectives_ref.h"

#if CAI_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

static int g_rank, g_size, g_fails;

#define EXPECT(cond, ...)                                                              \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            if (g_fails++ < 30) {                                                      \
                fprintf(stderr, "[rank %d] FAIL %s:%d: ", g_rank, __FILE__, __LINE__); \
                fprintf(stderr, __VA_ARGS__);                                          \
                fputc('\n', stderr);                                                   \
            }                                                                          \
        }                                                                              \
    } while (0)

#define CALL(expr)                    \
    do {                              \
        cai_status call_st_ = (expr); \
        if (call_st_ != CAI_OK) {     \
            g_fails++;                \
            cai_error_print(stderr);  \
        }                             \
    } while (0)

#if CAI_HAVE_CUDA

static void *dev_copy(const void *host, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) {
        fprintf(stderr, "[rank %d] cudaMalloc(%zu) failed\n", g_rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (bytes) cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    return d;
}

static void to_host(void *host, const void *d, size_t bytes) {
    if (bytes) cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost);
}

static const char *g_mode = "";

static void expect_reduced(const ax_t *x, cai_dtype d, cai_reduce_op op, double got, double want, const char *what,
                           size_t i) {
    EXPECT(fabs(got - want) <= reduce_tolerance(d, op, want), "%s %s axis %s (%d of %d) %s op %d [%zu]: got %g want %g",
           g_mode, what, cai_axis_name(x->a), x->k, x->n, cai_dtype_name(d), (int)op, i, got, want);
}

static void check_allreduce(const ax_t *x) {
    const size_t count = 13;
    int salt = 1;
    for (int t = 0; t < NDT; t++) {
        cai_dtype d = k_all_dtypes[t];
        size_t bytes = count * cai_dtype_size(d);
        for (int op = CAI_RED_SUM; op <= CAI_RED_MIN; op++) {
            for (int in_place = 0; in_place < 2; in_place++, salt++) {
                void *h = alloc(count, d);
                for (size_t i = 0; i < count; i++) put(d, h, i, val(x->me, i, salt, d));
                void *s = dev_copy(h, bytes), *r = in_place ? s : dev_copy(h, bytes);
                CALL(cai_allreduce(x->m, x->a, s, r, count, d, (cai_reduce_op)op));
                to_host(h, r, bytes);
                for (size_t i = 0; i < count; i++)
                    expect_reduced(x, d, (cai_reduce_op)op, get(d, h, i), reduce_ref(x, i, salt, d, (cai_reduce_op)op),
                                   in_place ? "allreduce in place" : "allreduce", i);
                cudaFree(s);
                if (!in_place) cudaFree(r);
                free(h);
            }
        }
    }
}

static void check_reduce_scatter(const ax_t *x) {
    const size_t c = 5;
    const cai_dtype ds[] = {CAI_DTYPE_F32, CAI_DTYPE_BF16, CAI_DTYPE_I32, CAI_DTYPE_U16};
    const cai_reduce_op ops[] = {CAI_RED_SUM, CAI_RED_AVG};
    int salt = 40;
    for (int t = 0; t < 4; t++)
        for (int o = 0; o < 2; o++)
            for (int in_place = 0; in_place < 2; in_place++, salt++) {
                cai_dtype d = ds[t];
                size_t total = c * (size_t)x->n, es = cai_dtype_size(d);
                void *h = alloc(total, d);
                for (size_t i = 0; i < total; i++) put(d, h, i, val(x->me, i, salt, d));
                void *s = dev_copy(h, total * es), *r = in_place ? s : dev_copy(h, c * es);
                CALL(cai_reduce_scatter(x->m, x->a, s, r, c, d, ops[o]));
                to_host(h, r, c * es);
                for (size_t j = 0; j < c; j++)
                    expect_reduced(x, d, ops[o], get(d, h, j), reduce_ref(x, (size_t)x->k * c + j, salt, d, ops[o]),
                                   in_place ? "reduce_scatter in place" : "reduce_scatter", j);
                cudaFree(s);
                if (!in_place) cudaFree(r);
                free(h);
            }
}

static void check_movement(const ax_t *x) {
    int salt = 80;
    for (int t = 0; t < NMDT; t++) {
        cai_dtype d = k_move_dtypes[t];
        size_t es = cai_dtype_size(d), c = 7, total = c * (size_t)x->n;
        /* all_gather: out of place, in place at the own block, in place at the start. */
        for (int mode = 0; mode < 3; mode++, salt++) {
            void *h = alloc(total, d), *mine = alloc(c, d);
            fill(d, h, total, SENTINEL);
            for (size_t j = 0; j < c; j++) put(d, mine, j, val(x->me, j, salt, d));
            memcpy((char *)h + (size_t)x->k * c * es, mine, c * es);
            void *r = dev_copy(h, total * es), *s = dev_copy(mine, c * es);
            const void *send = mode == 0 ? s : mode == 1 ? (char *)r + (size_t)x->k * c * es : r;
            CALL(cai_all_gather(x->m, x->a, send, r, c, d));
            to_host(h, r, total * es);
            for (int b = 0; b < x->n; b++)
                for (size_t j = 0; j < c; j++)
                    EXPECT(get(d, h, (size_t)b * c + j) == val(x->grp[b], j, salt, d),
                           "%s all_gather mode %d axis %s %s", g_mode, mode, cai_axis_name(x->a), cai_dtype_name(d));
            cudaFree(r);
            cudaFree(s);
            free(h);
            free(mine);
        }
        /* all_to_all, out of place and in place. */
        for (int in_place = 0; in_place < 2; in_place++, salt++) {
            void *h = alloc(total, d);
            for (size_t i = 0; i < total; i++) put(d, h, i, val(x->me, i, salt, d));
            void *s = dev_copy(h, total * es), *r = in_place ? s : dev_copy(h, total * es);
            CALL(cai_all_to_all(x->m, x->a, s, r, c, d));
            to_host(h, r, total * es);
            for (int b = 0; b < x->n; b++)
                for (size_t j = 0; j < c; j++)
                    EXPECT(get(d, h, (size_t)b * c + j) == val(x->grp[b], (size_t)x->k * c + j, salt, d),
                           "%s all_to_all%s axis %s %s", g_mode, in_place ? " in place" : "", cai_axis_name(x->a),
                           cai_dtype_name(d));
            cudaFree(s);
            if (!in_place) cudaFree(r);
            free(h);
        }
        /* broadcast from every root. */
        for (int root = 0; root < x->n; root++, salt++) {
            void *h = alloc(c, d);
            for (size_t j = 0; j < c; j++) put(d, h, j, x->k == root ? val(x->me, j, salt, d) : SENTINEL);
            void *b = dev_copy(h, c * es);
            CALL(cai_broadcast(x->m, x->a, b, c, d, root));
            to_host(h, b, c * es);
            for (size_t j = 0; j < c; j++)
                EXPECT(get(d, h, j) == val(x->grp[root], j, salt, d), "%s broadcast root %d axis %s", g_mode, root,
                       cai_axis_name(x->a));
            cudaFree(b);
            free(h);
        }
        /* A ring of sends and receives. */
        if (x->n > 1) {
            int next = (x->k + 1) % x->n, prev = (x->k + x->n - 1) % x->n;
            void *h = alloc(c, d);
            for (size_t j = 0; j < c; j++) put(d, h, j, val(x->me, j, salt, d));
            void *s = dev_copy(h, c * es), *r = dev_copy(h, c * es);
            if (x->k % 2 == 0) {
                CALL(cai_send(x->m, x->a, s, c, d, next, 3));
                CALL(cai_recv(x->m, x->a, r, c, d, prev, 3));
            } else {
                CALL(cai_recv(x->m, x->a, r, c, d, prev, 3));
                CALL(cai_send(x->m, x->a, s, c, d, next, 3));
            }
            to_host(h, r, c * es);
            for (size_t j = 0; j < c; j++)
                EXPECT(get(d, h, j) == val(x->grp[prev], j, salt, d), "%s recv axis %s", g_mode, cai_axis_name(x->a));
            cudaFree(s);
            cudaFree(r);
            free(h);
        }
    }
}

static void check_all_to_allv(const ax_t *x) {
    int n = x->n, salt = 160;
    size_t *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
    size_t *rc = calloc((size_t)n, sizeof *rc), *rd = calloc((size_t)n, sizeof *rd);
    size_t stot, rtot;
    vlayout(x, sc, sd, rc, rd, &stot, &rtot);
    for (int t = 0; t < NMDT; t++, salt++) {
        cai_dtype d = k_move_dtypes[t];
        size_t es = cai_dtype_size(d);
        void *hs = alloc(stot, d), *hr = alloc(rtot, d);
        fill(d, hs, stot, SENTINEL);
        fill(d, hr, rtot, SENTINEL);
        for (int y = 0; y < n; y++)
            for (size_t j = 0; j < sc[y]; j++) put(d, hs, sd[y] + j, val(x->me, (size_t)y * 100 + j, salt, d));
        void *s = dev_copy(hs, stot * es), *r = dev_copy(hr, rtot * es);
        CALL(cai_all_to_allv(x->m, x->a, s, sc, sd, r, rc, rd, d));
        to_host(hr, r, rtot * es);
        for (int b = 0; b < n; b++) {
            for (size_t j = 0; j < rc[b]; j++)
                EXPECT(get(d, hr, rd[b] + j) == val(x->grp[b], (size_t)x->k * 100 + j, salt, d),
                       "%s all_to_allv axis %s %s from %d [%zu]", g_mode, cai_axis_name(x->a), cai_dtype_name(d), b, j);
            EXPECT(get(d, hr, rd[b] + rc[b]) == SENTINEL, "%s all_to_allv wrote into a gap", g_mode);
        }
        cudaFree(s);
        cudaFree(r);
        free(hs);
        free(hr);
    }
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

static void check_iallreduce_and_large(const ax_t *x) {
    const size_t big = (size_t)1 << 22; /* 16 MiB of f32 */
    float *h = malloc(big * sizeof *h);
    for (size_t i = 0; i < big; i++) h[i] = (float)val(x->me, i, 500, CAI_DTYPE_F32);
    float *a = dev_copy(h, big * sizeof *h);
    uint16_t hb[9];
    for (size_t i = 0; i < 9; i++) put(CAI_DTYPE_BF16, hb, i, val(x->me, i, 501, CAI_DTYPE_BF16));
    void *b = dev_copy(hb, sizeof hb);
    cai_request_t *r1 = NULL, *r2 = NULL;
    CALL(cai_iallreduce(x->m, x->a, a, a, big, CAI_DTYPE_F32, CAI_RED_SUM, &r1));
    CALL(cai_iallreduce(x->m, x->a, b, b, 9, CAI_DTYPE_BF16, CAI_RED_AVG, &r2));
    if (r2) CALL(cai_wait(r2));
    if (r1) CALL(cai_wait(r1));
    to_host(h, a, big * sizeof *h);
    to_host(hb, b, sizeof hb);
    for (size_t i = 0; i < big; i += 4099)
        expect_reduced(x, CAI_DTYPE_F32, CAI_RED_SUM, h[i], reduce_ref(x, i, 500, CAI_DTYPE_F32, CAI_RED_SUM),
                       "iallreduce 16 MiB", i);
    for (size_t i = 0; i < 9; i++)
        expect_reduced(x, CAI_DTYPE_BF16, CAI_RED_AVG, get(CAI_DTYPE_BF16, hb, i),
                       reduce_ref(x, i, 501, CAI_DTYPE_BF16, CAI_RED_AVG), "iallreduce bf16 avg", i);
    /* Device and host buffers do not mix. */
    cai_error_clear();
    EXPECT(cai_allreduce(x->m, x->a, a, h, 4, CAI_DTYPE_F32, CAI_RED_SUM) == CAI_ERR_INVALID_ARG,
           "mixed device/host buffers accepted");
    cai_error_clear();
    cudaFree(a);
    cudaFree(b);
    free(h);
}

/* Completes a request by cai_wait, cai_wait_timeout or polling cai_test. */
static void complete(cai_request_t *q, int how) {
    if (!q) return;
    if (how % 3 == 0) {
        CALL(cai_wait(q));
    } else if (how % 3 == 1) {
        CALL(cai_wait_timeout(q, 60.0));
    } else {
        int done = 0;
        while (!done) {
            cai_status st = cai_test(q, &done);
            if (st != CAI_OK) {
                g_fails++;
                cai_error_print(stderr);
                break;
            }
        }
    }
}

/* The non-blocking reduce-scatter and all-gather on device buffers against
 * the blocking forms, bit for bit on inexact inputs (the same transport runs
 * the same arithmetic), every dtype, in place and not, zero counts. */
static void check_nonblocking(const ax_t *x) {
    int salt = 600, how = 0;
    const size_t counts[] = {0, 7};
    for (int t = 0; t < NDT; t++) {
        cai_dtype d = k_all_dtypes[t];
        size_t es = cai_dtype_size(d);
        const cai_reduce_op ops[] = {CAI_RED_SUM, CAI_RED_AVG, CAI_RED_MAX};
        for (int ci = 0; ci < 2; ci++) {
            size_t c = counts[ci], total = c * (size_t)x->n;
            for (int o = 0; o < 3; o++)
                for (int in_place = 0; in_place < 2; in_place++, salt++) {
                    void *h = alloc(total, d), *res[2];
                    for (size_t i = 0; i < total; i++) put(d, h, i, val_inexact(x->me, i, salt, d));
                    for (int nb = 0; nb < 2; nb++) {
                        void *s = dev_copy(h, total * es), *r = in_place ? s : dev_copy(h, c * es);
                        void *sp = c ? s : NULL, *rp = c ? r : NULL;
                        if (!nb) {
                            CALL(cai_reduce_scatter(x->m, x->a, sp, rp, c, d, ops[o]));
                        } else {
                            cai_request_t *q = NULL;
                            CALL(cai_ireduce_scatter(x->m, x->a, sp, rp, c, d, ops[o], &q));
                            complete(q, how++);
                        }
                        res[nb] = alloc(c, d);
                        to_host(res[nb], r, c * es);
                        cudaFree(s);
                        if (!in_place) cudaFree(r);
                    }
                    EXPECT(memcmp(res[0], res[1], c * es) == 0,
                           "%s ireduce_scatter%s axis %s %s op %d count %zu differs from the blocking form", g_mode,
                           in_place ? " in place" : "", cai_axis_name(x->a), cai_dtype_name(d), (int)ops[o], c);
                    free(res[0]);
                    free(res[1]);
                    free(h);
                }
            for (int mode = 0; mode < 3; mode++, salt++) {
                void *h = alloc(total, d), *mine = alloc(c, d), *res[2];
                fill(d, h, total, SENTINEL);
                for (size_t j = 0; j < c; j++) put(d, mine, j, val_inexact(x->me, j, salt, d));
                memcpy((char *)h + (size_t)x->k * c * es, mine, c * es);
                for (int nb = 0; nb < 2; nb++) {
                    void *r = dev_copy(h, total * es), *s = dev_copy(mine, c * es);
                    const void *send = mode == 0 ? s : mode == 1 ? (char *)r + (size_t)x->k * c * es : r;
                    if (!c) send = NULL;
                    if (!nb) {
                        CALL(cai_all_gather(x->m, x->a, send, c ? r : NULL, c, d));
                    } else {
                        cai_request_t *q = NULL;
                        CALL(cai_iall_gather(x->m, x->a, send, c ? r : NULL, c, d, &q));
                        complete(q, how++);
                    }
                    res[nb] = alloc(total, d);
                    to_host(res[nb], r, total * es);
                    cudaFree(r);
                    cudaFree(s);
                }
                EXPECT(memcmp(res[0], res[1], total * es) == 0,
                       "%s iall_gather mode %d axis %s %s count %zu differs from the blocking form", g_mode, mode,
                       cai_axis_name(x->a), cai_dtype_name(d), c);
                for (int b = 0; b < x->n; b++)
                    for (size_t j = 0; j < c; j++) {
                        double one; /* what peer b sent, after its rounding to the dtype */
                        put(d, &one, 0, val_inexact(x->grp[b], j, salt, d));
                        EXPECT(get(d, res[1], (size_t)b * c + j) == get(d, &one, 0),
                               "%s iall_gather axis %s %s block %d", g_mode, cai_axis_name(x->a), cai_dtype_name(d), b);
                    }
                free(res[0]);
                free(res[1]);
                free(h);
                free(mine);
            }
        }
    }
}

/* Many requests in flight (more than the NCCL event pool starts with),
 * completed in reverse order; a second round of the same creates no events.
 * Then the ordering after the caller's stream: the input is written by a
 * copy queued behind a long one on that stream, and the reduce-scatter is
 * issued without synchronising. */
static void check_in_flight_and_ordering(const ax_t *x, int nccl) {
    enum { NQ = 40 };
    const size_t c = 5;
    size_t n = (size_t)x->n;
    float *h = malloc(n * c * sizeof *h), *back = malloc(n * c * sizeof *back);
    int created[2] = {0, 0}, in_use = 0;
    for (int round = 0; round < 2; round++) {
        void *bufs[NQ];
        cai_request_t *q[NQ];
        for (int i = 0; i < NQ; i++) {
            for (size_t j = 0; j < n * c; j++) h[j] = (float)val(x->me, j, 700 + i, CAI_DTYPE_F32);
            bufs[i] = dev_copy(h, n * c * sizeof *h);
            q[i] = NULL;
            if (i % 2) CALL(cai_ireduce_scatter(x->m, x->a, bufs[i], bufs[i], c, CAI_DTYPE_F32, CAI_RED_SUM, &q[i]));
            else
                CALL(
                    cai_iall_gather(x->m, x->a, (float *)bufs[i] + (size_t)x->k * c, bufs[i], c, CAI_DTYPE_F32, &q[i]));
        }
        for (int i = NQ - 1; i >= 0; i--) complete(q[i], i);
        for (int i = 0; i < NQ; i++) {
            to_host(back, bufs[i], n * c * sizeof *back);
            for (size_t j = 0; j < c; j++) {
                if (i % 2)
                    EXPECT(back[j] == reduce_ref(x, (size_t)x->k * c + j, 700 + i, CAI_DTYPE_F32, CAI_RED_SUM),
                           "%s in-flight ireduce_scatter #%d axis %s [%zu]", g_mode, i, cai_axis_name(x->a), j);
                else
                    for (size_t b = 0; b < n; b++)
                        EXPECT(back[b * c + j] == val(x->grp[b], b * c + j, 700 + i, CAI_DTYPE_F32),
                               "%s in-flight iall_gather #%d axis %s", g_mode, i, cai_axis_name(x->a));
            }
            cudaFree(bufs[i]);
        }
        cai_cl_nccl_event_stats(x->m, &created[round], &in_use);
        EXPECT(in_use == 0, "%s: %d pool events still lent after every request completed", g_mode, in_use);
    }
    if (nccl && x->n > 1)
        EXPECT(created[0] >= NQ && created[1] == created[0],
               "%s event pool: %d events after the first round of %d requests, %d after the second (want >= %d, "
               "then unchanged)",
               g_mode, created[0], NQ, created[1], NQ);

    cudaStream_t us;
    cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking);
    const size_t big = (size_t)64 << 20;
    void *junk_a = NULL, *junk_b = NULL, *pinned = NULL;
    cudaMalloc(&junk_a, big);
    cudaMalloc(&junk_b, big);
    cudaMallocHost(&pinned, n * c * sizeof(float));
    for (size_t j = 0; j < n * c; j++) ((float *)pinned)[j] = (float)val(x->me, j, 750, CAI_DTYPE_F32);
    float *in = NULL, *out = NULL;
    cudaMalloc((void **)&in, n * c * sizeof(float));
    cudaMalloc((void **)&out, c * sizeof(float));
    cudaMemset(in, 0, n * c * sizeof(float));
    cudaDeviceSynchronize();
    cai_mesh_set_cuda_stream(x->m, us);
    for (int k = 0; k < 4; k++) cudaMemcpyAsync(junk_b, junk_a, big, cudaMemcpyDeviceToDevice, us);
    cudaMemcpyAsync(in, pinned, n * c * sizeof(float), cudaMemcpyHostToDevice, us);
    cai_request_t *q = NULL;
    CALL(cai_ireduce_scatter(x->m, x->a, in, out, c, CAI_DTYPE_F32, CAI_RED_SUM, &q));
    complete(q, 0);
    cai_mesh_set_cuda_stream(x->m, NULL);
    to_host(back, out, c * sizeof(float));
    for (size_t j = 0; j < c; j++)
        EXPECT(back[j] == reduce_ref(x, (size_t)x->k * c + j, 750, CAI_DTYPE_F32, CAI_RED_SUM),
               "%s ireduce_scatter did not wait for the caller's stream: axis %s [%zu] got %g", g_mode,
               cai_axis_name(x->a), j, back[j]);
    cudaStreamSynchronize(us);
    cudaStreamDestroy(us);
    cudaFree(junk_a);
    cudaFree(junk_b);
    cudaFreeHost(pinned);
    cudaFree(in);
    cudaFree(out);
    free(h);
    free(back);
}

static void run_checks(cai_device_comm mode, const char *name) {
    g_mode = name;
    const cai_layout layouts[2] = {{1, g_size, 1, 1, 1, NULL}, {1, g_size / 2, 1, 1, 2, "tp,sp,ep,dp,pp"}};
    int nl = g_size % 2 == 0 ? 2 : 1;
    for (int l = 0; l < nl; l++) {
        cai_mesh_config cfg;
        cai_mesh_config_init(&cfg);
        cfg.layout = layouts[l];
        cfg.watchdog_timeout_s = 60;
        cfg.device_comm = mode;
        cai_mesh_t *m = NULL;
        CALL(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
        if (!m) return;
        for (int a = 0; a < CAI_AXIS_COUNT; a++) {
            ax_t x = {m,
                      (cai_axis)a,
                      cai_mesh_size(m, (cai_axis)a),
                      cai_mesh_rank(m, (cai_axis)a),
                      cai_mesh_group(m, (cai_axis)a),
                      g_rank};
            check_allreduce(&x);
            check_reduce_scatter(&x);
            check_movement(&x);
            check_all_to_allv(&x);
            check_iallreduce_and_large(&x);
            /* The groups of one rank are all alike: one of them is enough here. */
            if (x.n > 1 || a == CAI_AXIS_PP) {
                check_nonblocking(&x);
                check_in_flight_and_ordering(&x, mode == CAI_DEVICE_COMM_NCCL);
            }
        }
        cai_mesh_free(m);
    }
    if (g_rank == 0) fprintf(stderr, "checks over %s done\n", name);
}

/* The last rank sleeps past the timeout before a device allreduce: the others
 * time out naming it and abort their NCCL communicator, after which device
 * collectives on that axis are refused until the mesh is rebuilt; host
 * collectives on the same mesh still work, and so does a new mesh. */
static void check_nccl_watchdog(void) {
    cai_mesh_config cfg;
    cai_mesh_config_init(&cfg);
    cfg.layout.dp = g_size;
    cfg.watchdog_timeout_s = 1.0;
    cfg.watchdog_abort = 0;
    cai_mesh_t *m = NULL;
    CALL(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
    if (!m) return;
    float one = 1, *d = dev_copy(&one, sizeof one);
    CALL(cai_allreduce(m, CAI_AXIS_DP, d, d, 1, CAI_DTYPE_F32, CAI_RED_SUM)); /* #1-#2 nccl-init, #3 */
    int late = g_size - 1;
    if (g_rank == late) {
        struct timespec ts = {2, 500000000};
        nanosleep(&ts, NULL);
    }
    cai_error_clear();
    cai_status st = cai_allreduce(m, CAI_AXIS_DP, d, d, 1, CAI_DTYPE_F32, CAI_RED_SUM); /* #4 */
    if (g_rank != late) {
        /* Creating the communicator took two collectives (id broadcast and
         * barrier) before the first allreduce. */
        char want[64];
        snprintf(want, sizeof want, "allreduce #4 on axis dp (group of %d)", g_size);
        EXPECT(strstr(cai_error_message(), want) != NULL, "report lacks '%s': %s", want, cai_error_message());
        snprintf(want, sizeof want, "ranks behind: %d (at #3, not in a communication call)", late);
        EXPECT(st == CAI_ERR_TIMEOUT, "stalled NCCL allreduce returned %s", cai_status_str(st));
        EXPECT(strstr(cai_error_message(), want) != NULL, "report lacks '%s': %s", want, cai_error_message());
        if (g_rank == 0) fprintf(stderr, "NCCL watchdog report: %s\n", cai_error_message());
        cai_error_clear();
        EXPECT(cai_allreduce(m, CAI_AXIS_DP, d, d, 1, CAI_DTYPE_F32, CAI_RED_SUM) == CAI_ERR_NCCL,
               "device collective on an aborted axis was not refused");
        EXPECT(strstr(cai_error_message(), "need a new mesh") != NULL, "refusal says: %s", cai_error_message());
    } else if (st != CAI_OK) {
        /* The late rank may find its peers gone, or NCCL may complete its
         * side from data the others already pushed. */
        if (g_rank == 0 || g_size == 2) fprintf(stderr, "late rank: %s\n", cai_error_message());
    }
    cai_error_clear();
    MPI_Barrier(MPI_COMM_WORLD);
    float h = 2, hs = 0;
    CALL(cai_allreduce(m, CAI_AXIS_DP, &h, &hs, 1, CAI_DTYPE_F32, CAI_RED_SUM));
    EXPECT(hs == 2.0f * g_size, "host allreduce after the NCCL abort: %g", hs);
    double t0 = MPI_Wtime();
    cai_mesh_free(m);
    if (g_rank == 0) fprintf(stderr, "mesh free after NCCL abort: %.2f s\n", MPI_Wtime() - t0);
    m = NULL;
    CALL(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
    if (!m) return;
    float v = 1;
    cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice);
    CALL(cai_allreduce(m, CAI_AXIS_DP, d, d, 1, CAI_DTYPE_F32, CAI_RED_SUM));
    to_host(&v, d, sizeof v);
    EXPECT(v == (float)g_size, "device allreduce on a new mesh: %g", v);
    cudaFree(d);
    cai_mesh_free(m);
}

/* Collectives marked as overlapping compute go through the CTA-limited
 * communicator (nccl_overlap_ctas): results are those of the plain one, also
 * with operations on both communicators in flight at once; and how much
 * slower a large reduction runs on 2 CTAs (printed, not checked). */
static double timed_allreduce_us(cai_mesh_t *m, float *d, size_t n, int overlapping) {
    cai_mesh_overlap_compute(m, overlapping);
    CALL(cai_allreduce(m, CAI_AXIS_DP, d, d, n, CAI_DTYPE_F32, CAI_RED_SUM)); /* warm-up, communicator set-up */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < 10; i++) CALL(cai_allreduce(m, CAI_AXIS_DP, d, d, n, CAI_DTYPE_F32, CAI_RED_SUM));
    double t = (MPI_Wtime() - t0) / 10 * 1e6;
    cai_mesh_overlap_compute(m, 0);
    return t;
}

static void check_overlap_comm(void) {
    cai_mesh_config cfg;
    cai_mesh_config_init(&cfg);
    cfg.layout.dp = g_size;
    cfg.watchdog_timeout_s = 60;
    cfg.nccl_overlap_ctas = 2;
    cai_mesh_t *m = NULL;
    CALL(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
    if (!m) return;
    const size_t n = (size_t)1 << 20;
    float *h = malloc(n * sizeof *h), *back = malloc(n * sizeof *back);
    for (size_t i = 0; i < n; i++) h[i] = (float)(g_rank + 1 + (int)(i % 7));
    float *da = dev_copy(h, n * sizeof *h), *db = dev_copy(h, n * sizeof *h), *dc = dev_copy(h, n * sizeof *h);
    cai_request_t *ra = NULL, *rb = NULL;
    cai_mesh_overlap_compute(m, 1);
    CALL(cai_iallreduce(m, CAI_AXIS_DP, da, da, n, CAI_DTYPE_F32, CAI_RED_SUM, &ra));
    cai_mesh_overlap_compute(m, 0);
    CALL(cai_iallreduce(m, CAI_AXIS_DP, db, db, n, CAI_DTYPE_F32, CAI_RED_SUM, &rb));
    cai_mesh_overlap_compute(m, 1);
    CALL(cai_allreduce(m, CAI_AXIS_DP, dc, dc, n, CAI_DTYPE_F32, CAI_RED_SUM));
    cai_mesh_overlap_compute(m, 0);
    if (ra) CALL(cai_wait(ra));
    if (rb) CALL(cai_wait(rb));
    float *bufs[3] = {da, db, dc};
    const char *names[3] = {"overlapping iallreduce", "plain iallreduce in flight beside it", "overlapping allreduce"};
    for (int k = 0; k < 3; k++) {
        to_host(back, bufs[k], n * sizeof *back);
        int bad = 0;
        for (size_t i = 0; i < n && !bad; i++) {
            float want = (float)(g_size * (g_size + 1) / 2 + g_size * (int)(i % 7));
            if (back[i] != want) {
                EXPECT(0, "%s (nccl_overlap_ctas 2): [%zu] = %g, want %g", names[k], i, back[i], want);
                bad = 1;
            }
        }
    }
    const size_t big = (size_t)64 << 20; /* 256 MiB of f32 */
    float *dbig = NULL;
    if (cudaMalloc((void **)&dbig, big * sizeof *dbig) == cudaSuccess) {
        cudaMemset(dbig, 0, big * sizeof *dbig);
        double full = timed_allreduce_us(m, dbig, big, 0), few = timed_allreduce_us(m, dbig, big, 1);
        if (g_rank == 0)
            fprintf(stderr, "allreduce 256 MiB: %.0f us with NCCL's own CTA count, %.0f us on 2 CTAs (%.2fx)\n", full,
                    few, few / full);
        cudaFree(dbig);
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    free(h);
    free(back);
    cai_mesh_free(m);
}

/* Raw NCCL all-reduce timing. pipelined: enqueue every call, then sync once
 * (nccl-tests); otherwise sync after each call, as a host-blocking API must. */
static double raw_nccl_allreduce_us(size_t bytes, int iters, int nonblocking, int pipelined) {
    ncclUniqueId id;
    if (g_rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = !nonblocking;
    ncclResult_t r = ncclCommInitRankConfig(&comm, g_size, id, g_rank, &config), state = r;
    while (state == ncclInProgress) ncclCommGetAsyncError(comm, &state);
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    void *buf;
    cudaMalloc(&buf, bytes);
    cudaMemset(buf, 0, bytes);
    double t0 = 0;
    for (int i = -5; i < iters; i++) {
        if (i == 0) {
            cudaStreamSynchronize(st);
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        r = ncclAllReduce(buf, buf, bytes / 4, ncclFloat32, ncclSum, comm, st);
        for (state = r; state == ncclInProgress;) ncclCommGetAsyncError(comm, &state);
        if (!pipelined) cudaStreamSynchronize(st);
    }
    cudaStreamSynchronize(st);
    double t = (MPI_Wtime() - t0) / iters, worst;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    cudaFree(buf);
    cudaStreamDestroy(st);
    ncclCommDestroy(comm);
    return worst * 1e6;
}

static void bench(void) {
    cai_mesh_config cfg;
    cai_mesh_config_init(&cfg);
    cfg.layout.dp = g_size;
    cai_mesh_t *m = NULL, *quiet = NULL;
    CALL(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
    cfg.watchdog_timeout_s = 0;
    CALL(cai_mesh_init(&quiet, MPI_COMM_WORLD, &cfg));
    if (!m || !quiet) return;
    const size_t sizes[] = {(size_t)8 << 10, (size_t)1 << 20, (size_t)64 << 20, (size_t)512 << 20};
    for (int s = 0; s < 4; s++) {
        int iters = sizes[s] >= ((size_t)64 << 20) ? 20 : 100;
        cai_bench_result dev, nowd;
        CALL(cai_mesh_bench(m, CAI_AXIS_DP, CAI_BENCH_ALLREDUCE, sizes[s], 5, iters, 1, &dev));
        CALL(cai_mesh_bench(quiet, CAI_AXIS_DP, CAI_BENCH_ALLREDUCE, sizes[s], 5, iters, 1, &nowd));
        double pipe = raw_nccl_allreduce_us(dev.bytes, iters, 0, 1),
               sync_b = raw_nccl_allreduce_us(dev.bytes, iters, 0, 0),
               sync_nb = raw_nccl_allreduce_us(dev.bytes, iters, 1, 0);
        if (g_rank == 0)
            fprintf(stderr,
                    "allreduce %10zu B: ours %8.1f us (no watchdog %8.1f) | raw NCCL pipelined %8.1f, sync each %8.1f, "
                    "non-blocking comm sync each %8.1f | busbw ours %.1f GB/s, raw pipelined %.1f GB/s\n",
                    dev.bytes, dev.time_us, nowd.time_us, pipe, sync_b, sync_nb, dev.busbw_gbs,
                    dev.busbw_gbs * dev.time_us / pipe);
    }
    for (int op = 1; op < CAI_BENCH_COUNT; op++) {
        cai_bench_result dev;
        CALL(cai_mesh_bench(m, CAI_AXIS_DP, (cai_bench_op)op, (size_t)512 << 20, 5, 20, 1, &dev));
        if (g_rank == 0)
            fprintf(stderr, "%-13s %10zu B: ours %8.1f us busbw %.1f GB/s\n", cai_bench_op_name(dev.op), dev.bytes,
                    dev.time_us, dev.busbw_gbs);
    }
    cai_mesh_free(quiet);
    cai_mesh_free(m);
}

#endif /* CAI_HAVE_CUDA */

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    int usable = 0;
#if CAI_HAVE_CUDA
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
    int local = 0, ndev = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) cudaSetDevice(local % ndev);
    usable = cai_cl_cuda_usable();
#endif
    int all = 0;
    MPI_Allreduce(&usable, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (g_rank == 0) fprintf(stderr, "no usable CUDA device on every rank: skipped\n");
        MPI_Finalize();
        return 77;
    }
#if CAI_HAVE_CUDA
    double t0 = MPI_Wtime();
    run_checks(CAI_DEVICE_COMM_NCCL, "nccl");
    if (g_rank == 0) fprintf(stderr, "  %.1f s\n", MPI_Wtime() - t0);
    run_checks(CAI_DEVICE_COMM_STAGE, "stage");
    if (g_rank == 0) fprintf(stderr, "  %.1f s\n", MPI_Wtime() - t0);
    if (cai_mpi_cuda_aware()) run_checks(CAI_DEVICE_COMM_MPI, "cuda-aware mpi");
    check_overlap_comm();
    check_nccl_watchdog();
    if (g_rank == 0) fprintf(stderr, "device checks: %.1f s\n", MPI_Wtime() - t0);
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) bench();
#endif
    int fails = 0;
    MPI_Allreduce(&g_fails, &fails, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0) fprintf(stderr, "%s\n", fails ? "FAILED" : "all device checks passed");
    MPI_Finalize();
    return fails ? 1 : 0;
}
