/* Shared scaffolding of the cluster MPI tests: run a Check suite on every
 * rank (CK_FORK=no: MPI cannot communicate from a fork child) and make the
 * exit status agree across ranks. */
#ifndef TEST_MESH_UTIL_H
#define TEST_MESH_UTIL_H

#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "colossal/cluster.h"

static int g_world_rank, g_world_size;

/* Fails the test with the error trace when a colossal call does not succeed. */
#define CK_CAI(expr)                                                                          \
    do {                                                                                      \
        cai_status ck_st_ = (expr);                                                           \
        if (ck_st_ != CAI_OK) {                                                               \
            cai_error_print(stderr);                                                          \
            ck_abort_msg("%s -> %s: %s", #expr, cai_status_str(ck_st_), cai_error_message()); \
        }                                                                                     \
    } while (0)

/* A mesh config for tests: a watchdog that aborts instead of letting a
 * broken test hang the suite. */
static inline cai_mesh_config test_mesh_config(int pp, int dp, int ep, int sp, int tp, const char *order) {
    cai_mesh_config cfg;
    cai_mesh_config_init(&cfg);
    cfg.layout = (cai_layout){pp, dp, ep, sp, tp, order};
    cfg.watchdog_timeout_s = 20.0;
    cfg.watchdog_abort = 1;
    return cfg;
}

/* The end of a test on every rank: a barrier that gives up after 60 s and
 * aborts the job. A rank whose check failed leaves its test early (Check
 * runs without fork); without this its next collectives on MPI_COMM_WORLD
 * (communicator creation included) would match its peers' earlier ones,
 * which shows up as an MPI error far from the failed check. */
static inline void test_all_ranks_done(void) {
    MPI_Request r;
    int done = 0;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    double t0 = MPI_Wtime();
    while (!done) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done && MPI_Wtime() - t0 > 60.0) {
            fprintf(stderr, "rank %d: the other ranks did not finish the test within 60 s; aborting\n", g_world_rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (!done) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Whether CAI_TEST_SKIP (comma-separated case names) names `name`: make
 * check-sanitize leaves out there the cases whose matrix the plain suite runs
 * in full and whose code other instrumented cases already reach. Read the
 * same on every rank (the environment mpiexec forwards). */
static inline int test_case_skipped(const char *name) {
    const char *list = getenv("CAI_TEST_SKIP");
    size_t len = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, n) == 0) return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

/* MPI_Init, one suite of `n` tests, failures agreed over all ranks, MPI_Finalize.
 * `teardown` runs after every test on every rank, also after a failed check
 * (Check without fork jumps out of the test, then tears down): the place to
 * bring the ranks back in step. NULL: test_all_ranks_done. */
static inline int test_mpi_main_fixture(int argc, char **argv, const char *name, const TTest *const *tests, int n,
                                        SFun setup, SFun teardown) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world_size);
    cai_log_set_rank(g_world_rank, g_world_size);
    Suite *s = suite_create(name);
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, setup, teardown ? teardown : test_all_ranks_done);
    for (int i = 0; i < n; i++) {
        if (test_case_skipped(tests[i]->name)) {
            if (g_world_rank == 0) fprintf(stderr, "  %s: left out (CAI_TEST_SKIP)\n", tests[i]->name);
            continue;
        }
        tcase_add_test(tc, tests[i]);
    }
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    double t0 = MPI_Wtime();
    srunner_run_all(sr, g_world_rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr), any = 0;
    if (failed && g_world_rank != 0) {
        /* Rank 0 prints its own results; other ranks report only failures. */
        TestResult **tr = srunner_failures(sr);
        for (int i = 0; i < failed; i++)
            fprintf(stderr, "[rank %d] %s:%d: %s: %s\n", g_world_rank, tr_lfile(tr[i]), tr_lno(tr[i]), tr_tcname(tr[i]),
                    tr_msg(tr[i]));
        free(tr);
    }
    srunner_free(sr);
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_world_rank == 0) fprintf(stderr, "%s on %d ranks: %.2f s\n", name, g_world_size, MPI_Wtime() - t0);
    MPI_Finalize();
    return any ? 1 : 0;
}

static inline int test_mpi_main(int argc, char **argv, const char *name, const TTest *const *tests, int n) {
    return test_mpi_main_fixture(argc, argv, name, tests, n, NULL, NULL);
}

#define TEST_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
