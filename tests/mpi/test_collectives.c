/* Every collective on every axis of a few layouts (with the watchdog's
 * non-blocking path and without it), every dtype and reduce op, in place and
 * out of place, against references each rank computes locally: inputs are
 * deterministic functions of (world rank, index), so every rank knows what
 * each peer sent. */
#include "cai_config.h"

#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "../../src/cluster/cluster_internal.h"
#include "test_collectives_ref.h"
#include "test_mesh_util.h"

static void expect_reduced(const ax_t *x, cai_dtype d, cai_reduce_op op, double got, double want, const char *what,
                           size_t i) {
    double tol = reduce_tolerance(d, op, want);
    ck_assert_msg(fabs(got - want) <= tol, "%s axis %s (%d of %d) %s op %d [%zu]: got %g want %g", what,
                  cai_axis_name(x->a), x->k, x->n, cai_dtype_name(d), (int)op, i, got, want);
}

/* ------------------------------------------------------------ per-axis checks */

static void check_allreduce(const ax_t *x) {
    const size_t count = 13;
    int salt = 1;
    for (int t = 0; t < NDT; t++) {
        cai_dtype d = k_all_dtypes[t];
        for (int op = CAI_RED_SUM; op <= CAI_RED_MIN; op++) {
            for (int in_place = 0; in_place < 2; in_place++, salt++) {
                void *s = alloc(count, d), *r = alloc(count, d);
                for (size_t i = 0; i < count; i++) put(d, s, i, val(x->me, i, salt, d));
                if (in_place) memcpy(r, s, count * cai_dtype_size(d));
                CK_CAI(cai_allreduce(x->m, x->a, in_place ? r : s, r, count, d, (cai_reduce_op)op));
                for (size_t i = 0; i < count; i++)
                    expect_reduced(x, d, (cai_reduce_op)op, get(d, r, i), reduce_ref(x, i, salt, d, (cai_reduce_op)op),
                                   in_place ? "allreduce in place" : "allreduce", i);
                free(s);
                free(r);
            }
        }
    }
    /* Zero elements, no buffers. */
    CK_CAI(cai_allreduce(x->m, x->a, NULL, NULL, 0, CAI_DTYPE_F32, CAI_RED_SUM));
}

/* Inexact bf16/f16 inputs: pairwise fp32 combining stays within one
 * rounding per step of the exact sum. */
static void check_half_accuracy(const ax_t *x) {
    const size_t count = 257;
    const cai_dtype ds[2] = {CAI_DTYPE_BF16, CAI_DTYPE_F16};
    for (int t = 0; t < 2; t++) {
        cai_dtype d = ds[t];
        uint16_t *b = alloc(count, d);
        for (size_t i = 0; i < count; i++) put(d, b, i, 2 * cai_rng_uniform(5, (uint64_t)x->me, i) - 1);
        CK_CAI(cai_allreduce(x->m, x->a, b, b, count, d, CAI_RED_SUM));
        for (size_t i = 0; i < count; i++) {
            double exact = 0, mag = 0;
            for (int g = 0; g < x->n; g++) {
                /* What peer g sent, after its own rounding to the dtype. */
                double one; /* room for any dtype */
                put(d, &one, 0, 2 * cai_rng_uniform(5, (uint64_t)x->grp[g], i) - 1);
                exact += get(d, &one, 0);
                mag += fabs(get(d, &one, 0));
            }
            double tol = x->n * rounding(d) * mag;
            ck_assert_msg(fabs(get(d, b, i) - exact) <= tol, "%s sum [%zu] axis %s: got %g want %g (tol %g)",
                          cai_dtype_name(d), i, cai_axis_name(x->a), get(d, b, i), exact, tol);
        }
        free(b);
    }
}

static void check_reduce_scatter(const ax_t *x) {
    const size_t c = 5;
    int salt = 40;
    for (int t = 0; t < NDT; t++) {
        cai_dtype d = k_all_dtypes[t];
        const cai_reduce_op ops[] = {CAI_RED_SUM, CAI_RED_AVG, CAI_RED_MAX};
        for (int o = 0; o < 3; o++) {
            for (int in_place = 0; in_place < 2; in_place++, salt++) {
                size_t total = c * (size_t)x->n;
                void *s = alloc(total, d), *r = in_place ? s : alloc(c, d);
                for (size_t i = 0; i < total; i++) put(d, s, i, val(x->me, i, salt, d));
                CK_CAI(cai_reduce_scatter(x->m, x->a, s, r, c, d, ops[o]));
                for (size_t j = 0; j < c; j++)
                    expect_reduced(x, d, ops[o], get(d, r, j), reduce_ref(x, (size_t)x->k * c + j, salt, d, ops[o]),
                                   in_place ? "reduce_scatter in place" : "reduce_scatter", j);
                free(s);
                if (!in_place) free(r);
            }
        }
    }
}

static void check_all_gather(const ax_t *x) {
    const size_t c = 7;
    int salt = 80;
    for (int t = 0; t < NMDT; t++) {
        cai_dtype d = k_move_dtypes[t];
        size_t es = cai_dtype_size(d);
        for (int mode = 0; mode < 3; mode++, salt++) { /* out of place, in place (own block), in place (same ptr) */
            size_t total = c * (size_t)x->n;
            void *r = alloc(total, d), *s = alloc(c, d);
            fill(d, r, total, SENTINEL);
            for (size_t j = 0; j < c; j++) put(d, s, j, val(x->me, j, salt, d));
            const void *send = s;
            if (mode > 0) {
                memcpy((char *)r + (size_t)x->k * c * es, s, c * es);
                send = mode == 1 ? (char *)r + (size_t)x->k * c * es : r;
            }
            CK_CAI(cai_all_gather(x->m, x->a, send, r, c, d));
            for (int b = 0; b < x->n; b++)
                for (size_t j = 0; j < c; j++)
                    ck_assert_msg(get(d, r, (size_t)b * c + j) == val(x->grp[b], j, salt, d),
                                  "all_gather mode %d axis %s %s block %d [%zu]", mode, cai_axis_name(x->a),
                                  cai_dtype_name(d), b, j);
            free(r);
            free(s);
        }
    }
}

static void check_all_to_all(const ax_t *x) {
    const size_t c = 3;
    int salt = 120;
    for (int t = 0; t < NMDT; t++) {
        cai_dtype d = k_move_dtypes[t];
        for (int in_place = 0; in_place < 2; in_place++, salt++) {
            size_t total = c * (size_t)x->n;
            void *s = alloc(total, d), *r = in_place ? s : alloc(total, d);
            for (size_t i = 0; i < total; i++) put(d, s, i, val(x->me, i, salt, d));
            CK_CAI(cai_all_to_all(x->m, x->a, s, r, c, d));
            for (int b = 0; b < x->n; b++)
                for (size_t j = 0; j < c; j++)
                    ck_assert_msg(get(d, r, (size_t)b * c + j) == val(x->grp[b], (size_t)x->k * c + j, salt, d),
                                  "all_to_all%s axis %s %s from %d [%zu]", in_place ? " in place" : "",
                                  cai_axis_name(x->a), cai_dtype_name(d), b, j);
            free(s);
            if (!in_place) free(r);
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
        void *s = alloc(stot, d), *r = alloc(rtot, d);
        fill(d, s, stot, SENTINEL);
        fill(d, r, rtot, SENTINEL);
        for (int y = 0; y < n; y++)
            for (size_t j = 0; j < sc[y]; j++) put(d, s, sd[y] + j, val(x->me, (size_t)y * 100 + j, salt, d));
        CK_CAI(cai_all_to_allv(x->m, x->a, s, sc, sd, r, rc, rd, d));
        for (int b = 0; b < n; b++) {
            for (size_t j = 0; j < rc[b]; j++)
                ck_assert_msg(get(d, r, rd[b] + j) == val(x->grp[b], (size_t)x->k * 100 + j, salt, d),
                              "all_to_allv axis %s %s from %d [%zu]", cai_axis_name(x->a), cai_dtype_name(d), b, j);
            ck_assert(get(d, r, rd[b] + rc[b]) == SENTINEL && get(d, r, rd[b] + rc[b] + 1) == SENTINEL);
        }
        free(s);
        free(r);
    }
    cai_error_clear();
    ck_assert_int_eq(cai_all_to_allv(x->m, x->a, sd, sc, sd, sd, rc, rd, CAI_DTYPE_U8), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "in place is not supported"));
    cai_error_clear();
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

static void check_broadcast(const ax_t *x) {
    const size_t c = 6;
    for (int t = 0; t < NMDT; t++) {
        cai_dtype d = k_move_dtypes[t];
        for (int root = 0; root < x->n; root++) {
            int salt = 200 + root;
            void *b = alloc(c, d);
            for (size_t j = 0; j < c; j++) put(d, b, j, x->k == root ? val(x->me, j, salt, d) : SENTINEL);
            CK_CAI(cai_broadcast(x->m, x->a, b, c, d, root));
            for (size_t j = 0; j < c; j++)
                ck_assert_msg(get(d, b, j) == val(x->grp[root], j, salt, d), "broadcast axis %s root %d %s [%zu]",
                              cai_axis_name(x->a), root, cai_dtype_name(d), j);
            free(b);
        }
    }
    char one;
    cai_error_clear();
    ck_assert_int_eq(cai_broadcast(x->m, x->a, &one, 1, CAI_DTYPE_U8, x->n), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "is not an axis rank"));
    cai_error_clear();
}

/* A ring along the axis; even ranks send first so large (rendezvous)
 * messages cannot deadlock. */
static void ring(const ax_t *x, size_t c, cai_dtype d, int salt) {
    if (x->n < 2) return;
    int next = (x->k + 1) % x->n, prev = (x->k + x->n - 1) % x->n;
    void *s = alloc(c, d), *r = alloc(c, d);
    for (size_t j = 0; j < c; j++) put(d, s, j, val(x->me, j, salt, d));
    if (x->k % 2 == 0) {
        CK_CAI(cai_send(x->m, x->a, s, c, d, next, salt));
        CK_CAI(cai_recv(x->m, x->a, r, c, d, prev, salt));
    } else {
        CK_CAI(cai_recv(x->m, x->a, r, c, d, prev, salt));
        CK_CAI(cai_send(x->m, x->a, s, c, d, next, salt));
    }
    for (size_t j = 0; j < c; j++)
        ck_assert_msg(get(d, r, j) == val(x->grp[prev], j, salt, d), "recv axis %s from %d %s [%zu]",
                      cai_axis_name(x->a), prev, cai_dtype_name(d), j);
    free(s);
    free(r);
}

static void check_p2p_and_barrier(const ax_t *x) {
    for (int t = 0; t < NMDT; t++) ring(x, 9, k_move_dtypes[t], 240 + t);
    CK_CAI(cai_barrier(x->m, x->a));
}

static void check_iallreduce(const ax_t *x) {
    /* Three in flight at once, completed out of order. */
    float a[5];
    uint16_t b[9];
    int64_t c[3];
    for (size_t i = 0; i < 5; i++) put(CAI_DTYPE_F32, a, i, val(x->me, i, 300, CAI_DTYPE_F32));
    for (size_t i = 0; i < 9; i++) put(CAI_DTYPE_BF16, b, i, val(x->me, i, 301, CAI_DTYPE_BF16));
    for (size_t i = 0; i < 3; i++) put(CAI_DTYPE_I64, c, i, val(x->me, i, 302, CAI_DTYPE_I64));
    float ar[5];
    int64_t cr[3];
    cai_request_t *r1, *r2, *r3;
    CK_CAI(cai_iallreduce(x->m, x->a, a, ar, 5, CAI_DTYPE_F32, CAI_RED_SUM, &r1));
    CK_CAI(cai_iallreduce(x->m, x->a, b, b, 9, CAI_DTYPE_BF16, CAI_RED_AVG, &r2));
    CK_CAI(cai_iallreduce(x->m, x->a, c, cr, 3, CAI_DTYPE_I64, CAI_RED_MAX, &r3));
    CK_CAI(cai_wait(r3));
    CK_CAI(cai_wait(r1));
    CK_CAI(cai_wait(r2));
    for (size_t i = 0; i < 5; i++)
        expect_reduced(x, CAI_DTYPE_F32, CAI_RED_SUM, ar[i], reduce_ref(x, i, 300, CAI_DTYPE_F32, CAI_RED_SUM),
                       "iallreduce", i);
    for (size_t i = 0; i < 9; i++)
        expect_reduced(x, CAI_DTYPE_BF16, CAI_RED_AVG, get(CAI_DTYPE_BF16, b, i),
                       reduce_ref(x, i, 301, CAI_DTYPE_BF16, CAI_RED_AVG), "iallreduce", i);
    for (size_t i = 0; i < 3; i++)
        expect_reduced(x, CAI_DTYPE_I64, CAI_RED_MAX, (double)cr[i], reduce_ref(x, i, 302, CAI_DTYPE_I64, CAI_RED_MAX),
                       "iallreduce", i);
}

/* ------------------------------------------------------------ non-blocking forms */

/* Completes a request one of three ways, so every check covers all of them. */
static void complete(cai_request_t *req, int how) {
    switch (how % 3) {
    case 0: CK_CAI(cai_wait(req)); break;
    case 1: CK_CAI(cai_wait_timeout(req, 60.0)); break;
    default: {
        int done = 0;
        while (!done) {
            CK_CAI(cai_test(req, &done));
            if (!done) sched_yield();
        }
    }
    }
}

static void *dup_buf(const void *src, size_t count, cai_dtype d) {
    void *b = alloc(count, d);
    memcpy(b, src, count * cai_dtype_size(d));
    return b;
}

/* With the watchdog on, both forms issue the same MPI non-blocking call, so
 * even inexact float inputs must reduce to the same bits; without it the
 * blocking form uses MPI's blocking algorithm, whose order may differ, and
 * only exact inputs are compared bit for bit. */
static int same_transport(const ax_t *x) { return x->m->timeout_s > 0; }

static void check_ireduce_scatter(const ax_t *x) {
    const size_t counts[] = {1, 7};
    int salt = 500, how = 0;
    for (int t = 0; t < NDT; t++) {
        cai_dtype d = k_all_dtypes[t];
        size_t es = cai_dtype_size(d);
        cai_request_t *q = NULL;
        CK_CAI(cai_ireduce_scatter(x->m, x->a, NULL, NULL, 0, d, CAI_RED_SUM, &q));
        complete(q, how++);
        for (int op = CAI_RED_SUM; op <= CAI_RED_MIN; op++)
            for (int ci = 0; ci < 2; ci++)
                for (int in_place = 0; in_place < 2; in_place++)
                    for (int exact = 1; exact >= (same_transport(x) && !is_int(d) ? 0 : 1); exact--, salt++) {
                        size_t c = counts[ci], total = c * (size_t)x->n;
                        void *in = alloc(total, d);
                        for (size_t i = 0; i < total; i++)
                            put(d, in, i, exact ? val(x->me, i, salt, d) : val_inexact(x->me, i, salt, d));
                        void *bs = dup_buf(in, total, d), *br = in_place ? bs : alloc(c, d);
                        CK_CAI(cai_reduce_scatter(x->m, x->a, bs, br, c, d, (cai_reduce_op)op));
                        void *ns = dup_buf(in, total, d), *nr = in_place ? ns : alloc(c, d);
                        if (!in_place) fill(d, nr, c, SENTINEL);
                        CK_CAI(cai_ireduce_scatter(x->m, x->a, ns, nr, c, d, (cai_reduce_op)op, &q));
                        complete(q, how++);
                        ck_assert_msg(memcmp(br, nr, c * es) == 0,
                                      "ireduce_scatter%s axis %s %s op %d count %zu (%s inputs) differs from the "
                                      "blocking form",
                                      in_place ? " in place" : "", cai_axis_name(x->a), cai_dtype_name(d), op, c,
                                      exact ? "exact" : "inexact");
                        for (size_t j = 0; exact && j < c; j++)
                            expect_reduced(x, d, (cai_reduce_op)op, get(d, nr, j),
                                           reduce_ref(x, (size_t)x->k * c + j, salt, d, (cai_reduce_op)op),
                                           in_place ? "ireduce_scatter in place" : "ireduce_scatter", j);
                        free(in);
                        free(bs);
                        free(ns);
                        if (!in_place) {
                            free(br);
                            free(nr);
                        }
                    }
    }
}

static void check_iall_gather(const ax_t *x) {
    const size_t counts[] = {0, 1, 7};
    int salt = 700, how = 0;
    for (int t = 0; t < NDT; t++) {
        cai_dtype d = k_all_dtypes[t];
        size_t es = cai_dtype_size(d);
        for (int ci = 0; ci < 3; ci++) /* out of place, in place (own block), in place (same pointer) */
            for (int mode = 0; mode < 3; mode++, salt++) {
                size_t c = counts[ci], total = c * (size_t)x->n;
                void *mine = alloc(c, d), *r[2];
                for (size_t j = 0; j < c; j++) put(d, mine, j, val(x->me, j, salt, d));
                for (int nb = 0; nb < 2; nb++) {
                    r[nb] = alloc(total, d);
                    fill(d, r[nb], total, SENTINEL);
                    const void *send = mine;
                    if (mode > 0) {
                        memcpy((char *)r[nb] + (size_t)x->k * c * es, mine, c * es);
                        send = mode == 1 ? (char *)r[nb] + (size_t)x->k * c * es : r[nb];
                    }
                    if (c == 0) send = NULL; /* nothing to read or write: no buffers needed */
                    void *recv = c ? r[nb] : NULL;
                    if (!nb) {
                        CK_CAI(cai_all_gather(x->m, x->a, send, recv, c, d));
                    } else {
                        cai_request_t *q = NULL;
                        CK_CAI(cai_iall_gather(x->m, x->a, send, recv, c, d, &q));
                        complete(q, how++);
                    }
                }
                ck_assert_msg(memcmp(r[0], r[1], total * es) == 0,
                              "iall_gather mode %d axis %s %s count %zu differs from the blocking form", mode,
                              cai_axis_name(x->a), cai_dtype_name(d), c);
                for (int b = 0; b < x->n; b++)
                    for (size_t j = 0; j < c; j++)
                        ck_assert_msg(get(d, r[1], (size_t)b * c + j) == val(x->grp[b], j, salt, d),
                                      "iall_gather mode %d axis %s %s block %d [%zu]", mode, cai_axis_name(x->a),
                                      cai_dtype_name(d), b, j);
                free(mine);
                free(r[0]);
                free(r[1]);
            }
    }
}

/* All three non-blocking forms in flight at once, with blocking collectives
 * issued between them, completed out of order and in every way. */
static void check_nonblocking_mixed(const ax_t *x) {
    const size_t c = 6;
    size_t n = (size_t)x->n;
    float *rs_in = alloc(n * c, CAI_DTYPE_F32), rs_out[6];
    uint16_t *ag = alloc(n * c, CAI_DTYPE_BF16), *h = alloc(n * c, CAI_DTYPE_F16);
    int64_t ar[6];
    uint8_t *ag8 = alloc(n * c, CAI_DTYPE_U8);
    for (size_t i = 0; i < n * c; i++) {
        put(CAI_DTYPE_F32, rs_in, i, val(x->me, i, 800, CAI_DTYPE_F32));
        put(CAI_DTYPE_F16, h, i, val(x->me, i, 803, CAI_DTYPE_F16));
    }
    for (size_t j = 0; j < c; j++) {
        put(CAI_DTYPE_BF16, ag, (size_t)x->k * c + j, val(x->me, j, 801, CAI_DTYPE_BF16));
        put(CAI_DTYPE_I64, ar, j, val(x->me, j, 802, CAI_DTYPE_I64));
        put(CAI_DTYPE_U8, ag8, (size_t)x->k * c + j, val(x->me, j, 804, CAI_DTYPE_U8));
    }
    cai_request_t *q[5];
    CK_CAI(cai_ireduce_scatter(x->m, x->a, rs_in, rs_out, c, CAI_DTYPE_F32, CAI_RED_SUM, &q[0]));
    CK_CAI(cai_iall_gather(x->m, x->a, ag + (size_t)x->k * c, ag, c, CAI_DTYPE_BF16, &q[1]));
    double one = 1, total = 0;
    CK_CAI(cai_allreduce(x->m, x->a, &one, &total, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    CK_CAI(cai_iallreduce(x->m, x->a, ar, ar, c, CAI_DTYPE_I64, CAI_RED_MAX, &q[2]));
    CK_CAI(cai_ireduce_scatter(x->m, x->a, h, h, c, CAI_DTYPE_F16, CAI_RED_AVG, &q[3]));
    CK_CAI(cai_iall_gather(x->m, x->a, ag8, ag8, c, CAI_DTYPE_U8, &q[4]));
    CK_CAI(cai_barrier(x->m, x->a));
    complete(q[4], 2);
    complete(q[0], 0);
    complete(q[2], 1);
    complete(q[1], 2);
    complete(q[3], 0);
    ck_assert(total == x->n);
    for (size_t j = 0; j < c; j++) {
        expect_reduced(x, CAI_DTYPE_F32, CAI_RED_SUM, rs_out[j],
                       reduce_ref(x, (size_t)x->k * c + j, 800, CAI_DTYPE_F32, CAI_RED_SUM), "mixed ireduce_scatter",
                       j);
        expect_reduced(x, CAI_DTYPE_I64, CAI_RED_MAX, (double)ar[j], reduce_ref(x, j, 802, CAI_DTYPE_I64, CAI_RED_MAX),
                       "mixed iallreduce", j);
        expect_reduced(x, CAI_DTYPE_F16, CAI_RED_AVG, get(CAI_DTYPE_F16, h, j),
                       reduce_ref(x, (size_t)x->k * c + j, 803, CAI_DTYPE_F16, CAI_RED_AVG),
                       "mixed ireduce_scatter f16", j);
        for (int b = 0; b < x->n; b++) {
            ck_assert(get(CAI_DTYPE_BF16, ag, (size_t)b * c + j) == val(x->grp[b], j, 801, CAI_DTYPE_BF16));
            ck_assert(get(CAI_DTYPE_U8, ag8, (size_t)b * c + j) == val(x->grp[b], j, 804, CAI_DTYPE_U8));
        }
    }
    /* Argument errors leave no request behind and issue nothing. */
    cai_error_clear();
    ck_assert_int_eq(cai_ireduce_scatter(x->m, x->a, rs_in, rs_out, c, CAI_DTYPE_F32, CAI_RED_SUM, NULL),
                     CAI_ERR_INVALID_ARG);
    q[0] = (cai_request_t *)&one;
    ck_assert_int_eq(cai_iall_gather(x->m, x->a, NULL, ag, c, CAI_DTYPE_BF16, &q[0]), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(q[0]);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "iall_gather on axis"));
    ck_assert_int_eq(cai_test(NULL, NULL), CAI_ERR_INVALID_ARG);
    cai_error_clear();
    free(rs_in);
    free(ag);
    free(h);
    free(ag8);
}

/* Operations larger than one MPI call (here shrunk to 64 elements) are split
 * where the layout allows it and refused clearly where it does not. */
static void check_split_operations(const ax_t *x) {
    cai_mesh_set_max_chunk(x->m, 64);
    const size_t big = 1000;
    float *s = alloc(big, CAI_DTYPE_F32), *r = alloc(big, CAI_DTYPE_F32);
    for (size_t i = 0; i < big; i++) s[i] = (float)val(x->me, i, 400, CAI_DTYPE_F32);
    CK_CAI(cai_allreduce(x->m, x->a, s, r, big, CAI_DTYPE_F32, CAI_RED_AVG));
    for (size_t i = 0; i < big; i++)
        expect_reduced(x, CAI_DTYPE_F32, CAI_RED_AVG, r[i], reduce_ref(x, i, 400, CAI_DTYPE_F32, CAI_RED_AVG),
                       "split allreduce", i);
    int root = x->n - 1;
    for (size_t i = 0; i < big; i++) r[i] = x->k == root ? s[i] : -1.0f;
    CK_CAI(cai_broadcast(x->m, x->a, r, big, CAI_DTYPE_F32, root));
    for (size_t i = 0; i < big; i++) ck_assert(r[i] == (float)val(x->grp[root], i, 400, CAI_DTYPE_F32));
    cai_request_t *req;
    CK_CAI(cai_iallreduce(x->m, x->a, s, r, 300, CAI_DTYPE_F32, CAI_RED_SUM, &req));
    CK_CAI(cai_wait(req));
    for (size_t i = 0; i < 300; i++)
        expect_reduced(x, CAI_DTYPE_F32, CAI_RED_SUM, r[i], reduce_ref(x, i, 400, CAI_DTYPE_F32, CAI_RED_SUM),
                       "split iallreduce", i);
    ring(x, 500, CAI_DTYPE_U16, 401);
    cai_error_clear();
    ck_assert_int_eq(cai_all_gather(x->m, x->a, s, r, 100, CAI_DTYPE_F32), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "100 elements per rank exceed 64"));
    cai_error_clear();
    /* The non-blocking forms refuse alike, and leave no request. */
    req = (cai_request_t *)s;
    ck_assert_int_eq(cai_iall_gather(x->m, x->a, s, r, 100, CAI_DTYPE_F32, &req), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_null(req);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "iall_gather on axis"));
    cai_error_clear();
    ck_assert_int_eq(cai_ireduce_scatter(x->m, x->a, s, r, 65, CAI_DTYPE_F32, CAI_RED_SUM, &req), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "65 elements per rank exceed 64"));
    cai_error_clear();
    if ((size_t)x->n * 65 <= big) {
        /* Within the limit they still work after a refusal. */
        CK_CAI(cai_ireduce_scatter(x->m, x->a, s, r, 64, CAI_DTYPE_F32, CAI_RED_SUM, &req));
        CK_CAI(cai_wait(req));
        for (size_t j = 0; j < 64; j++)
            expect_reduced(x, CAI_DTYPE_F32, CAI_RED_SUM, r[j],
                           reduce_ref(x, (size_t)x->k * 64 + j, 400, CAI_DTYPE_F32, CAI_RED_SUM), "ireduce_scatter", j);
    }
    cai_mesh_set_max_chunk(x->m, 0);
    free(s);
    free(r);
}

/* ------------------------------------------------------------ driver */

typedef struct {
    int pp, dp, ep, sp, tp;
    const char *order;
    int watchdog;
} layout_case;

static const layout_case *cases_for(int w, int *n) {
    static const layout_case c1[] = {{1, 1, 1, 1, 1, NULL, 1}, {1, 1, 1, 1, 1, "tp,sp,ep,dp,pp", 0}};
    static const layout_case c3[] = {{1, 3, 1, 1, 1, NULL, 1}, {1, 1, 1, 1, 3, "tp,sp,ep,dp,pp", 0}};
    static const layout_case c4[] = {{1, 4, 2, 1, 1, NULL, 1}, {2, 1, 1, 2, 1, "sp,tp,pp,ep,dp", 0}};
    static const layout_case c8[] = {{2, 2, 2, 1, 2, NULL, 1}, {1, 4, 2, 2, 1, "sp,tp,pp,ep,dp", 0}};
    *n = 2;
    switch (w) {
    case 1: return c1;
    case 3: return c3;
    case 4: return c4;
    case 8: return c8;
    default: *n = 0; return NULL;
    }
}

static void for_each_axis(void (*fn)(const ax_t *)) {
    int nc;
    const layout_case *cs = cases_for(g_world_size, &nc);
    ck_assert_msg(nc > 0, "no layouts listed for %d ranks", g_world_size);
    for (int i = 0; i < nc; i++) {
        cai_mesh_config cfg = test_mesh_config(cs[i].pp, cs[i].dp, cs[i].ep, cs[i].sp, cs[i].tp, cs[i].order);
        if (!cs[i].watchdog) cfg.watchdog_timeout_s = 0; /* blocking MPI calls */
        cai_mesh_t *m = NULL;
        CK_CAI(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
        for (int a = 0; a < CAI_AXIS_COUNT; a++) {
            ax_t x = {m,
                      (cai_axis)a,
                      cai_mesh_size(m, (cai_axis)a),
                      cai_mesh_rank(m, (cai_axis)a),
                      cai_mesh_group(m, (cai_axis)a),
                      g_world_rank};
            fn(&x);
        }
        cai_mesh_free(m);
    }
}

START_TEST(allreduce_all_dtypes_and_ops) { for_each_axis(check_allreduce); }
END_TEST
START_TEST(half_precision_accuracy) { for_each_axis(check_half_accuracy); }
END_TEST
START_TEST(reduce_scatter) { for_each_axis(check_reduce_scatter); }
END_TEST
START_TEST(all_gather) { for_each_axis(check_all_gather); }
END_TEST
START_TEST(all_to_all) { for_each_axis(check_all_to_all); }
END_TEST
START_TEST(all_to_allv_uneven) { for_each_axis(check_all_to_allv); }
END_TEST
START_TEST(broadcast_every_root) { for_each_axis(check_broadcast); }
END_TEST
START_TEST(send_recv_barrier) { for_each_axis(check_p2p_and_barrier); }
END_TEST
START_TEST(iallreduce_out_of_order) { for_each_axis(check_iallreduce); }
END_TEST
START_TEST(split_large_operations) { for_each_axis(check_split_operations); }
END_TEST
START_TEST(ireduce_scatter_matches_blocking) { for_each_axis(check_ireduce_scatter); }
END_TEST
START_TEST(iall_gather_matches_blocking) { for_each_axis(check_iall_gather); }
END_TEST
START_TEST(nonblocking_mixed_in_flight) { for_each_axis(check_nonblocking_mixed); }
END_TEST

/* cai_wait_timeout: the last rank issues late; the others give up at their
 * own deadline with the watchdog's report (never aborting, although the mesh
 * is in abort mode), and cai_mesh_drain then completes the operation. With
 * the mesh's watchdog off the deadline holds all the same. The late rank
 * waits, outside the mesh, for every other rank to have given up: however
 * loaded the machine, it cannot arrive before their reports are made. */
START_TEST(wait_timeout_own_deadline) {
    int n = g_world_size, late = n - 1;
    for (int wd = 1; wd >= 0; wd--) {
        cai_mesh_config cfg = test_mesh_config(1, n, 1, 1, 1, NULL);
        if (!wd) cfg.watchdog_timeout_s = 0;
        cai_mesh_t *m = NULL;
        CK_CAI(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
        ax_t x = {m, CAI_AXIS_WORLD, n, g_world_rank, cai_mesh_group(m, CAI_AXIS_WORLD), g_world_rank};
        float *s = alloc(3 * (size_t)n, CAI_DTYPE_F32), r[3] = {0, 0, 0};
        for (size_t i = 0; i < 3 * (size_t)n; i++) s[i] = (float)val(g_world_rank, i, 900, CAI_DTYPE_F32);
        cai_request_t *q = NULL;
        const int release_tag = 4243;
        if (n > 1 && g_world_rank == late)
            for (int i = 0; i < n - 1; i++) {
                int go = 0;
                MPI_Recv(&go, 1, MPI_INT, MPI_ANY_SOURCE, release_tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            }
        CK_CAI(cai_ireduce_scatter(m, CAI_AXIS_WORLD, s, r, 3, CAI_DTYPE_F32, CAI_RED_SUM, &q));
        if (n > 1 && g_world_rank != late) {
            cai_error_clear();
            cai_status st = cai_wait_timeout(q, 0.2);
            int go = 1;
            MPI_Send(&go, 1, MPI_INT, late, release_tag, MPI_COMM_WORLD);
            ck_assert_int_eq(st, CAI_ERR_TIMEOUT);
            char want[96];
            snprintf(want, sizeof want, "watchdog: ireduce_scatter #1 on axis world (group of %d) did not complete", n);
            ck_assert_msg(strstr(cai_error_message(), want), "report lacks '%s': %s", want, cai_error_message());
            if (wd) snprintf(want, sizeof want, "ranks behind: %d (at #0, not in a communication call)", late);
            else snprintf(want, sizeof want, "peers' progress unknown");
            ck_assert_msg(strstr(cai_error_message(), want), "report lacks '%s': %s", want, cai_error_message());
            cai_error_clear();
            CK_CAI(cai_mesh_drain(m, 30));
        } else {
            CK_CAI(cai_wait(q));
        }
        for (size_t j = 0; j < 3; j++)
            expect_reduced(&x, CAI_DTYPE_F32, CAI_RED_SUM, r[j],
                           reduce_ref(&x, (size_t)g_world_rank * 3 + j, 900, CAI_DTYPE_F32, CAI_RED_SUM),
                           "ireduce_scatter after drain", j);
        /* A limit that is not positive is refused, but the request is still
         * completed and freed (as every wait does). */
        CK_CAI(cai_iall_gather(m, CAI_AXIS_WORLD, s + (size_t)g_world_rank * 3, s, 3, CAI_DTYPE_F32, &q));
        ck_assert_int_eq(cai_wait_timeout(q, 0), CAI_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "must be > 0"));
        cai_error_clear();
        for (int b = 0; b < n; b++) ck_assert(s[(size_t)b * 3] == (float)val(b, (size_t)b * 3, 900, CAI_DTYPE_F32));
        free(s);
        cai_mesh_free(m);
    }
}
END_TEST

START_TEST(bench_reports_bandwidth) {
    cai_mesh_config cfg = test_mesh_config(1, g_world_size, 1, 1, 1, NULL);
    cai_mesh_t *m = NULL;
    CK_CAI(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
    int n = g_world_size;
    for (int op = 0; op < CAI_BENCH_COUNT; op++) {
        cai_bench_result r;
        CK_CAI(cai_mesh_bench(m, CAI_AXIS_DP, (cai_bench_op)op, 1 << 16, 1, 3, 0, &r));
        size_t per = op == CAI_BENCH_ALLREDUCE ? 4 : 4 * (size_t)n;
        ck_assert_uint_eq(r.bytes, (size_t)(1 << 16) / per * per);
        ck_assert(r.time_us > 0);
        ck_assert(fabs(r.algbw_gbs - r.bytes / (r.time_us * 1e-6) / 1e9) <= 1e-9 * r.algbw_gbs);
        double factor = op == CAI_BENCH_ALLREDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
        ck_assert(fabs(r.busbw_gbs - r.algbw_gbs * factor) <= 1e-9 * r.algbw_gbs);
        /* Every rank of the group reports the same (slowest) time. */
        double t = r.time_us, tmax = 0;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        ck_assert(t == tmax);
        if (g_world_rank == 0)
            fprintf(stderr, "bench %s: %zu B %.1f us algbw %.3f GB/s busbw %.3f GB/s\n", cai_bench_op_name(r.op),
                    r.bytes, r.time_us, r.algbw_gbs, r.busbw_gbs);
    }
    if (!cai_cl_cuda_usable()) {
        cai_bench_result r;
        ck_assert_int_eq(cai_mesh_bench(m, CAI_AXIS_DP, CAI_BENCH_ALLREDUCE, 1024, 0, 1, 1, &r), CAI_ERR_UNSUPPORTED);
        cai_error_clear();
    }
    cai_mesh_free(m);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {allreduce_all_dtypes_and_ops,
                            half_precision_accuracy,
                            reduce_scatter,
                            all_gather,
                            all_to_all,
                            all_to_allv_uneven,
                            broadcast_every_root,
                            send_recv_barrier,
                            iallreduce_out_of_order,
                            split_large_operations,
                            ireduce_scatter_matches_blocking,
                            iall_gather_matches_blocking,
                            nonblocking_mixed_in_flight,
                            wait_timeout_own_deadline,
                            bench_reports_bandwidth};
    return test_mpi_main(argc, argv, "collectives", tests, TEST_COUNT(tests));
}
