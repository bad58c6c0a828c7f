/* The watchdog in return mode on 4 ranks: a rank that sleeps past the 1 s
 * timeout (by 2 s) makes its peers fail with CAI_ERR_TIMEOUT and a message naming
 * it, the axis and the operation; once it arrives, cai_mesh_drain completes
 * the abandoned operation and its buffer holds the right result. */
#include "cai_config.h"

#include <time.h>
#include <unistd.h>

#include "test_mesh_util.h"

#define TIMEOUT 1.0
/* Seconds the late rank sleeps: 2 s past the timeout, so that under load
 * (ASan, tests in parallel on 2 cores) the punctual ranks still time out
 * before it arrives (1.6 s was seen to fail there). */
#define LATE 3.0

static void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The end of a test on every rank. A rank whose check failed leaves the
 * test early (no fork) and its peers would wait here forever: after 60 s
 * the job aborts instead, so the failure is reported, not a hung CI. */
static void all_ranks_done(void) {
    MPI_Request r;
    int done = 0;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    double t0 = MPI_Wtime();
    while (!done) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done && MPI_Wtime() - t0 > 60.0) {
            fprintf(stderr, "rank %d: the other ranks did not finish the test within 60 s (a check failed on one "
                    "of them?); aborting\n", g_world_rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (!done) nap(0.001);
    }
}

static cai_mesh_t *mesh_return_mode(int dp, int tp, double timeout) {
    cai_mesh_config cfg = test_mesh_config(1, dp, 1, 1, tp, NULL);
    cfg.watchdog_timeout_s = timeout;
    cfg.watchdog_abort = 0;
    cai_mesh_t *m = NULL;
    CK_CAI(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
    return m;
}

static void expect_in_message(const char *needle) {
    ck_assert_msg(strstr(cai_error_message(), needle) != NULL, "rank %d: '%s' not in: %s", g_world_rank, needle,
                  cai_error_message());
}

START_TEST(late_rank_in_a_tp_group) {
    ck_assert_int_eq(g_world_size, 4);
    cai_mesh_t *m = mesh_return_mode(2, 2, TIMEOUT); /* tp groups {0,1} {2,3} */
    double x = g_world_rank + 1, sum = 0;
    CK_CAI(cai_allreduce(m, CAI_AXIS_TP, &x, &sum, 1, CAI_DTYPE_F64, CAI_RED_SUM)); /* #1 everywhere */
    if (g_world_rank == 3) nap(LATE);
    cai_error_clear();
    double t0 = MPI_Wtime();
    cai_status st = cai_allreduce(m, CAI_AXIS_TP, &x, &sum, 1, CAI_DTYPE_F64, CAI_RED_SUM); /* #2 */
    double took = MPI_Wtime() - t0;
    if (g_world_rank == 2) {
        ck_assert_int_eq(st, CAI_ERR_TIMEOUT);
        ck_assert(took >= TIMEOUT && took < LATE);
        expect_in_message("watchdog: allreduce #2 on axis tp (group of 2) did not complete within 1.0 s on rank 2");
        expect_in_message("ranks behind: 3 (at #1, not in a communication call)");
        /* The late rank arrives; the abandoned allreduce then completes. */
        CK_CAI(cai_mesh_drain(m, 10.0));
        ck_assert(sum == 3 + 4);
    } else {
        CK_CAI(st);
        ck_assert(sum == (g_world_rank < 2 ? 1 + 2 : 3 + 4));
    }
    cai_error_clear();
    /* Ranks not involved would otherwise time out waiting for the late one. */
    all_ranks_done();
    cai_mesh_free(m);
}
END_TEST

START_TEST(late_rank_on_the_world_axis) {
    cai_mesh_t *m = mesh_return_mode(4, 1, TIMEOUT);
    CK_CAI(cai_barrier(m, CAI_AXIS_WORLD));
    CK_CAI(cai_barrier(m, CAI_AXIS_WORLD));
    if (g_world_rank == 1) nap(LATE);
    cai_error_clear();
    cai_status st = cai_barrier(m, CAI_AXIS_WORLD); /* #3 */
    if (g_world_rank != 1) {
        ck_assert_int_eq(st, CAI_ERR_TIMEOUT);
        expect_in_message("watchdog: barrier #3 on axis world (group of 4)");
        /* Only the late rank is named: the list ends after it. */
        const char *want = "ranks behind: 1 (at #2, not in a communication call)";
        expect_in_message(want);
        char after = strstr(cai_error_message(), want)[strlen(want)];
        ck_assert(after == '\0' || after == ';');
        CK_CAI(cai_mesh_drain(m, 10.0));
    } else {
        CK_CAI(st);
    }
    cai_error_clear();
    /* Ranks not involved would otherwise time out waiting for the late one. */
    all_ranks_done();
    cai_mesh_free(m);
}
END_TEST

START_TEST(late_sender_is_named) {
    cai_mesh_t *m = mesh_return_mode(4, 1, TIMEOUT);
    int v = -1;
    if (g_world_rank == 0) {
        cai_error_clear();
        ck_assert_int_eq(cai_recv(m, CAI_AXIS_DP, &v, 1, CAI_DTYPE_I32, 1, 5), CAI_ERR_TIMEOUT);
        expect_in_message("watchdog: recv from rank 1 (axis dp rank 1, tag 5) did not complete within 1.0 s on rank 0");
        expect_in_message("rank 1 is not in a communication call");
        CK_CAI(cai_mesh_drain(m, 10.0));
        ck_assert_int_eq(v, 42);
    } else if (g_world_rank == 1) {
        nap(LATE);
        v = 42;
        CK_CAI(cai_send(m, CAI_AXIS_DP, &v, 1, CAI_DTYPE_I32, 0, 5));
    }
    cai_error_clear();
    /* Ranks not involved would otherwise time out waiting for the late one. */
    all_ranks_done();
    cai_mesh_free(m);
}
END_TEST

START_TEST(rank_blocked_elsewhere_is_described) {
    /* Rank 3 waits (with a longer timeout of its own) for a message rank 2
     * sends only after the world allreduce; the others time out in that
     * allreduce and see rank 3 blocked in its recv. */
    cai_mesh_t *m = mesh_return_mode(4, 1, g_world_rank == 3 ? 20.0 : TIMEOUT);
    int v = 0, sum = 0, one = 1;
    if (g_world_rank == 3) {
        CK_CAI(cai_recv(m, CAI_AXIS_WORLD, &v, 1, CAI_DTYPE_I32, 2, 9));
        ck_assert_int_eq(v, 7);
        CK_CAI(cai_allreduce(m, CAI_AXIS_WORLD, &one, &sum, 1, CAI_DTYPE_I32, CAI_RED_SUM));
    } else {
        cai_error_clear();
        ck_assert_int_eq(cai_allreduce(m, CAI_AXIS_WORLD, &one, &sum, 1, CAI_DTYPE_I32, CAI_RED_SUM), CAI_ERR_TIMEOUT);
        expect_in_message("watchdog: allreduce #1 on axis world (group of 4)");
        expect_in_message("ranks behind: 3 (at #0, blocked in recv on axis world)");
        if (g_world_rank == 2) {
            v = 7;
            CK_CAI(cai_send(m, CAI_AXIS_WORLD, &v, 1, CAI_DTYPE_I32, 3, 9));
        }
        CK_CAI(cai_mesh_drain(m, 10.0));
    }
    ck_assert_int_eq(sum, 4);
    cai_error_clear();
    /* Ranks not involved would otherwise time out waiting for the late one. */
    all_ranks_done();
    cai_mesh_free(m);
}
END_TEST

START_TEST(late_iallreduce_wait) {
    cai_mesh_t *m = mesh_return_mode(4, 1, TIMEOUT);
    float x = 1.0f, sum = 0;
    if (g_world_rank == 2) nap(LATE);
    cai_request_t *req = NULL;
    CK_CAI(cai_iallreduce(m, CAI_AXIS_DP, &x, &sum, 1, CAI_DTYPE_F32, CAI_RED_SUM, &req));
    cai_error_clear();
    cai_status st = cai_wait(req);
    if (g_world_rank != 2) {
        ck_assert_int_eq(st, CAI_ERR_TIMEOUT);
        expect_in_message("watchdog: iallreduce #1 on axis dp (group of 4)");
        expect_in_message("ranks behind: 2 (at #0");
        CK_CAI(cai_mesh_drain(m, 10.0));
    } else {
        CK_CAI(st);
    }
    ck_assert(sum == 4.0f);
    cai_error_clear();
    /* Ranks not involved would otherwise time out waiting for the late one. */
    all_ranks_done();
    cai_mesh_free(m);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {late_rank_in_a_tp_group, late_rank_on_the_world_axis, late_sender_is_named,
                            rank_blocked_elsewhere_is_described, late_iallreduce_wait};
    return test_mpi_main(argc, argv, "watchdog", tests, TEST_COUNT(tests));
}
