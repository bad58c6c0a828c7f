/* Scaffolding shared by the dataset tests (unit and MPI): a scratch
 * directory, whole-file read/write, and a Check runner that works under
 * mpiexec (CK_NOFORK: MPI cannot communicate from a fork child). */
#ifndef TEST_INDEXED_UTIL_H
#define TEST_INDEXED_UTIL_H

#include <check.h>
#include <dirent.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colossal/base.h"

static char g_dir[256];
static int g_rank, g_size = 1;

/* Fails the test with the error trace when a colossal call does not succeed. */
#define CK_CAI(expr)                                                                          \
    do {                                                                                      \
        cai_status ck_st_ = (expr);                                                           \
        if (ck_st_ != CAI_OK) {                                                               \
            cai_error_print(stderr);                                                          \
            ck_abort_msg("%s -> %s: %s", #expr, cai_status_str(ck_st_), cai_error_message()); \
        }                                                                                     \
    } while (0)

static inline void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

static inline unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)sz + 1);
    ck_assert_int_eq(fread(p, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return p;
}

static inline void spit(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    ck_assert_int_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static inline void remove_dir(void) {
    DIR *d = opendir(g_dir);
    struct dirent *e;
    char path[600];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(g_dir);
}

/* MPI_Init, a scratch directory made by rank 0 and shared, the suite run on
 * every rank (rank 0 reports), the directory removed; returns main's code. */
static inline int run_suite(int *argc, char ***argv, Suite *(*make)(void)) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    cai_log_set_rank(g_rank, g_size);
    if (g_rank == 0) {
        snprintf(g_dir, sizeof g_dir, "%s/cai_data_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(g_dir)) {
            perror("mkdtemp");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Bcast(g_dir, sizeof g_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    SRunner *sr = srunner_create(make());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, g_rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr), any = 0;
    srunner_free(sr);
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0) remove_dir();
    MPI_Finalize();
    return any ? 1 : 0;
}

#endif
