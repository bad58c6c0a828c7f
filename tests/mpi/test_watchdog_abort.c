/* Abort mode, driven by watchdog_abort.sh: on 3 ranks, the last rank sleeps
 * far past the 2 s timeout before an allreduce over dp; the others must
 * abort the whole job, naming it. Exits 0 only if the abort never came.
 * 2 s, not less: the first allreduce must succeed, and on a loaded CI
 * machine the ranks may reach it a second apart. */
#include "cai_config.h"
#include "colossal/cluster.h"

#include <mpi.h>
#include <stdio.h>
#include <time.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    cai_mesh_config cfg;
    cai_mesh_config_init(&cfg);
    cfg.layout.dp = size;
    cfg.watchdog_timeout_s = 2.0;
    cfg.watchdog_abort = 1;
    cai_mesh_t *m = NULL;
    if (cai_mesh_init(&m, MPI_COMM_WORLD, &cfg) != CAI_OK) cai_abort(cai_error_status());
    double x = 1, sum = 0;
    if (cai_allreduce(m, CAI_AXIS_DP, &x, &sum, 1, CAI_DTYPE_F64, CAI_RED_SUM) != CAI_OK) cai_abort(cai_error_status());
    if (rank == size - 1) {
        struct timespec ts = {30, 0};
        nanosleep(&ts, NULL);
    }
    cai_status st = cai_allreduce(m, CAI_AXIS_DP, &x, &sum, 1, CAI_DTYPE_F64, CAI_RED_SUM);
    fprintf(stderr, "rank %d: allreduce returned %s instead of aborting\n", rank, cai_status_str(st));
    cai_mesh_free(m);
    MPI_Finalize();
    return 0;
}
