/* Waiting for a peer's watchdog state (tests/mpi/test_watchdog.c,
 * test_watchdog_abort.c): a test that asserts what a watchdog report says
 * about a late rank first waits until that rank's watchdog words, read from
 * the mesh's RMA window as the report reads them, show that state; on a
 * loaded machine the late rank may otherwise not be there yet. */
#ifndef CAI_TESTS_MPI_TEST_WD_UTIL_H
#define CAI_TESTS_MPI_TEST_WD_UTIL_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "../../src/cluster/cluster_internal.h"

/* Waits until world rank `peer` has entered `seq` collectives on `axis` and
 * is blocked in an operation of kind `blocked_in` (CAI_OP_RECV, ...), or,
 * with blocked_in -1, is not in a communication call. Returns 1 once it is;
 * 0 (with the peer's last words in `why`) when the mesh has no watchdog
 * window, an RMA read fails, or the peer is not there after `limit_s` (an
 * upper bound for a hang, not a timing assumption). */
static inline int test_wd_wait_peer(cai_mesh_t *m, int peer, cai_axis axis, uint64_t seq, int blocked_in,
                                    double limit_s, char *why, size_t cap) {
    if (!m->win_ok) {
        snprintf(why, cap, "the mesh has no watchdog window");
        return 0;
    }
    double t0 = MPI_Wtime();
    for (;;) {
        uint64_t w[CAI_WD_WORDS];
        MPI_Request r;
        if (MPI_Rget(w, CAI_WD_WORDS, MPI_UINT64_T, peer, 0, CAI_WD_WORDS, MPI_UINT64_T, m->win, &r) != MPI_SUCCESS ||
            MPI_Wait(&r, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            snprintf(why, cap, "reading rank %d's watchdog window failed", peer);
            return 0;
        }
        uint64_t act = w[CAI_WD_ACTIVITY];
        int kind = act ? (int)((act >> 8) & 0xff) : -1;
        if (w[axis] == seq && kind == blocked_in) return 1;
        if (MPI_Wtime() - t0 > limit_s) {
            snprintf(why, cap, "rank %d did not reach #%llu on axis %s %s %s within %.0f s (at #%llu, activity %#llx)",
                     peer, (unsigned long long)seq, cai_axis_name(axis), blocked_in < 0 ? "outside" : "blocked in",
                     blocked_in < 0 ? "communication" : cai_op_kind_name((cai_op_kind)blocked_in), limit_s,
                     (unsigned long long)w[axis], (unsigned long long)act);
            return 0;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

#endif
