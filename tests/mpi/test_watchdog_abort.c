/* Abort mode, driven by watchdog_abort.sh: on 3 ranks, the last rank stays
 * away (outside the mesh) from an allreduce over dp; the others must abort
 * the whole job, naming it. Exits 0 only if the abort never came.
 *
 * No step depends on how fast the machine is: the ranks meet in a plain MPI
 * barrier right before the first allreduce (which must succeed within the
 * 2 s timeout), and the punctual ranks start the second one only once the
 * late rank's watchdog words say it finished the first and is not in a
 * communication call, which is what the abort message must say. The late
 * rank then waits, up to an upper bound for a hang (120 s), to be killed by
 * the abort; if it ever wakes up, it says so and the script fails. */
#include "cai_config.h"
#include "colossal/cluster.h"

#include <mpi.h>
#include <stdio.h>
#include <time.h>

#include "test_wd_util.h"

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
    MPI_Barrier(MPI_COMM_WORLD);
    if (cai_allreduce(m, CAI_AXIS_DP, &x, &sum, 1, CAI_DTYPE_F64, CAI_RED_SUM) != CAI_OK) cai_abort(cai_error_status());
    const int late = size - 1;
    if (rank == late) {
        for (int i = 0; i < 1200; i++) {
            struct timespec ts = {0, 100000000};
            nanosleep(&ts, NULL);
        }
        fprintf(stderr, "rank %d: woke up after 120 s: the abort did not stop it\n", rank);
    } else {
        char why[256];
        if (!test_wd_wait_peer(m, late, CAI_AXIS_DP, 1, -1, 60.0, why, sizeof why)) {
            fprintf(stderr, "rank %d: %s\n", rank, why);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
    cai_status st = cai_allreduce(m, CAI_AXIS_DP, &x, &sum, 1, CAI_DTYPE_F64, CAI_RED_SUM);
    fprintf(stderr, "rank %d: allreduce returned %s instead of aborting\n", rank, cai_status_str(st));
    cai_mesh_free(m);
    MPI_Finalize();
    return 0;
}
