/* The watchdog in return mode on 4 ranks: a rank that arrives after the
 * timeout makes its peers fail with CAI_ERR_TIMEOUT and a message naming it,
 * the axis and the operation; once it arrives, cai_mesh_drain completes the
 * abandoned operation and its buffer holds the right result.
 *
 * Nothing here depends on how fast the machine is: the late rank is held back
 * by a plain MPI receive (outside the mesh, so the watchdog sees it "not in a
 * communication call") until every punctual rank has timed out, and before a
 * punctual rank starts the operation that is to time out it waits until the
 * late rank's watchdog words (read from the mesh's RMA window, as the report
 * reads them) show the state the report is to describe. The timeout is
 * generous for the operations that must succeed. Each test ends in
 * a checked teardown that also runs after a failed check, so the ranks stay in
 * step: a rank that left a test early once made its peers' next collectives
 * on MPI_COMM_WORLD match the wrong messages (MPI_ERR_TRUNCATE in CI). */
#include "cai_config.h"

#include "test_mesh_util.h"
#include "test_wd_util.h"

#define TIMEOUT 2.0
#define RELEASE_TAG 4242

/* The mesh of the running test, and the buffers of operations a timed-out
 * rank abandons: they live outside the test's frame because the teardown
 * drains them even when a failed check has left that frame. */
static cai_mesh_t *g_mesh;
static double g_x, g_sum;
static float g_xf, g_sumf;
static int g_v, g_one, g_isum;

/* The late rank waits here, outside the mesh, until each of `n` punctual
 * ranks has timed out. */
static void wait_until_released(int n) {
    for (int i = 0; i < n; i++) {
        int go = 0;
        MPI_Recv(&go, 1, MPI_INT, MPI_ANY_SOURCE, RELEASE_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
}

/* A punctual rank that has timed out lets the late rank go; before its checks,
 * so that a failed one cannot leave the late rank waiting. */
static void release(int late_rank) {
    int go = 1;
    MPI_Send(&go, 1, MPI_INT, late_rank, RELEASE_TAG, MPI_COMM_WORLD);
}

/* See test_wd_util.h: the report made after this describes that state. */
static void wait_for_peer_state(cai_mesh_t *m, int peer, cai_axis axis, uint64_t seq, int blocked_in) {
    char why[256];
    ck_assert_msg(test_wd_wait_peer(m, peer, axis, seq, blocked_in, 60.0, why, sizeof why), "rank %d: %s", g_world_rank,
                  why);
}

static void teardown(void) {
    if (g_mesh) {
        cai_status st = cai_mesh_drain(g_mesh, 30.0);
        if (st != CAI_OK) fprintf(stderr, "rank %d: teardown: %s\n", g_world_rank, cai_error_message());
    }
    cai_error_clear();
    /* Ranks not involved in a test would otherwise time out waiting for the late one. */
    test_all_ranks_done();
    cai_mesh_free(g_mesh);
    g_mesh = NULL;
}

static cai_mesh_t *mesh_return_mode(int dp, int tp, double timeout) {
    cai_mesh_config cfg = test_mesh_config(1, dp, 1, 1, tp, NULL);
    cfg.watchdog_timeout_s = timeout;
    cfg.watchdog_abort = 0;
    CK_CAI(cai_mesh_init(&g_mesh, MPI_COMM_WORLD, &cfg));
    return g_mesh;
}

static void expect_in_message(const char *needle) {
    ck_assert_msg(strstr(cai_error_message(), needle) != NULL, "rank %d: '%s' not in: %s", g_world_rank, needle,
                  cai_error_message());
}

START_TEST(late_rank_in_a_tp_group) {
    ck_assert_int_eq(g_world_size, 4);
    cai_mesh_t *m = mesh_return_mode(2, 2, TIMEOUT); /* tp groups {0,1} {2,3} */
    g_x = g_world_rank + 1;
    g_sum = 0;
    CK_CAI(cai_allreduce(m, CAI_AXIS_TP, &g_x, &g_sum, 1, CAI_DTYPE_F64, CAI_RED_SUM)); /* #1 everywhere */
    if (g_world_rank == 3) wait_until_released(1);
    if (g_world_rank == 2) wait_for_peer_state(m, 3, CAI_AXIS_TP, 1, -1);
    cai_error_clear();
    double t0 = MPI_Wtime();
    cai_status st = cai_allreduce(m, CAI_AXIS_TP, &g_x, &g_sum, 1, CAI_DTYPE_F64, CAI_RED_SUM); /* #2 */
    double took = MPI_Wtime() - t0;
    if (g_world_rank == 2) {
        release(3);
        ck_assert_int_eq(st, CAI_ERR_TIMEOUT);
        ck_assert_msg(took >= TIMEOUT, "returned after %.2f s, before the %.1f s timeout", took, TIMEOUT);
        expect_in_message("watchdog: allreduce #2 on axis tp (group of 2) did not complete within 2.0 s on rank 2");
        expect_in_message("ranks behind: 3 (at #1, not in a communication call)");
        /* The late rank arrives; the abandoned allreduce then completes. */
        CK_CAI(cai_mesh_drain(m, 30.0));
        ck_assert(g_sum == 3 + 4);
    } else {
        CK_CAI(st);
        ck_assert(g_sum == (g_world_rank < 2 ? 1 + 2 : 3 + 4));
    }
}
END_TEST

START_TEST(late_rank_on_the_world_axis) {
    cai_mesh_t *m = mesh_return_mode(4, 1, TIMEOUT);
    CK_CAI(cai_barrier(m, CAI_AXIS_WORLD));
    CK_CAI(cai_barrier(m, CAI_AXIS_WORLD));
    if (g_world_rank == 1) wait_until_released(3);
    else wait_for_peer_state(m, 1, CAI_AXIS_WORLD, 2, -1);
    cai_error_clear();
    cai_status st = cai_barrier(m, CAI_AXIS_WORLD); /* #3 */
    if (g_world_rank != 1) {
        release(1);
        ck_assert_int_eq(st, CAI_ERR_TIMEOUT);
        expect_in_message("watchdog: barrier #3 on axis world (group of 4)");
        /* Only the late rank is named: the list ends after it. */
        const char *want = "ranks behind: 1 (at #2, not in a communication call)";
        expect_in_message(want);
        char after = strstr(cai_error_message(), want)[strlen(want)];
        ck_assert(after == '\0' || after == ';');
        CK_CAI(cai_mesh_drain(m, 30.0));
    } else {
        CK_CAI(st);
    }
}
END_TEST

START_TEST(late_sender_is_named) {
    cai_mesh_t *m = mesh_return_mode(4, 1, TIMEOUT);
    g_v = -1;
    if (g_world_rank == 0) {
        wait_for_peer_state(m, 1, CAI_AXIS_DP, 0, -1);
        cai_error_clear();
        cai_status st = cai_recv(m, CAI_AXIS_DP, &g_v, 1, CAI_DTYPE_I32, 1, 5);
        release(1);
        ck_assert_int_eq(st, CAI_ERR_TIMEOUT);
        expect_in_message("watchdog: recv from rank 1 (axis dp rank 1, tag 5) did not complete within 2.0 s on rank 0");
        expect_in_message("rank 1 is not in a communication call");
        CK_CAI(cai_mesh_drain(m, 30.0));
        ck_assert_int_eq(g_v, 42);
    } else if (g_world_rank == 1) {
        wait_until_released(1);
        g_v = 42;
        CK_CAI(cai_send(m, CAI_AXIS_DP, &g_v, 1, CAI_DTYPE_I32, 0, 5));
    }
}
END_TEST

START_TEST(rank_blocked_elsewhere_is_described) {
    /* Rank 3 waits (with a longer timeout of its own) for a message rank 2
     * sends only once ranks 0, 1 and 2 have all timed out in the world
     * allreduce (rank 3 leaving its recv earlier would change what a slower
     * rank's report sees); they see rank 3 blocked in its recv. */
    cai_mesh_t *m = mesh_return_mode(4, 1, g_world_rank == 3 ? 60.0 : TIMEOUT);
    g_v = 0;
    g_isum = 0;
    g_one = 1;
    if (g_world_rank == 3) {
        CK_CAI(cai_recv(m, CAI_AXIS_WORLD, &g_v, 1, CAI_DTYPE_I32, 2, 9));
        ck_assert_int_eq(g_v, 7);
        CK_CAI(cai_allreduce(m, CAI_AXIS_WORLD, &g_one, &g_isum, 1, CAI_DTYPE_I32, CAI_RED_SUM));
    } else {
        wait_for_peer_state(m, 3, CAI_AXIS_WORLD, 0, CAI_OP_RECV);
        cai_error_clear();
        cai_status st = cai_allreduce(m, CAI_AXIS_WORLD, &g_one, &g_isum, 1, CAI_DTYPE_I32, CAI_RED_SUM);
        if (g_world_rank == 2) {
            wait_until_released(2);
            static int seven = 7;
            CK_CAI(cai_send(m, CAI_AXIS_WORLD, &seven, 1, CAI_DTYPE_I32, 3, 9));
        } else {
            release(2);
        }
        ck_assert_int_eq(st, CAI_ERR_TIMEOUT);
        expect_in_message("watchdog: allreduce #1 on axis world (group of 4)");
        expect_in_message("ranks behind: 3 (at #0, blocked in recv on axis world)");
        CK_CAI(cai_mesh_drain(m, 30.0));
    }
    ck_assert_int_eq(g_isum, 4);
}
END_TEST

START_TEST(late_iallreduce_wait) {
    cai_mesh_t *m = mesh_return_mode(4, 1, TIMEOUT);
    g_xf = 1.0f;
    g_sumf = 0;
    if (g_world_rank == 2) wait_until_released(3);
    else wait_for_peer_state(m, 2, CAI_AXIS_DP, 0, -1);
    cai_request_t *req = NULL;
    CK_CAI(cai_iallreduce(m, CAI_AXIS_DP, &g_xf, &g_sumf, 1, CAI_DTYPE_F32, CAI_RED_SUM, &req));
    cai_error_clear();
    cai_status st = cai_wait(req);
    if (g_world_rank != 2) {
        release(2);
        ck_assert_int_eq(st, CAI_ERR_TIMEOUT);
        expect_in_message("watchdog: iallreduce #1 on axis dp (group of 4)");
        expect_in_message("ranks behind: 2 (at #0");
        CK_CAI(cai_mesh_drain(m, 30.0));
    } else {
        CK_CAI(st);
    }
    ck_assert(g_sumf == 4.0f);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {late_rank_in_a_tp_group, late_rank_on_the_world_axis, late_sender_is_named,
                            rank_blocked_elsewhere_is_described, late_iallreduce_wait};
    return test_mpi_main_fixture(argc, argv, "watchdog", tests, TEST_COUNT(tests), NULL, teardown);
}
