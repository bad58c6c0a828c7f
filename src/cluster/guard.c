/* The guard: the watchdog for stretches of blocking calls it cannot poll
 * (MPI-IO inside HDF5's collective writes). Each rank's helper thread bumps
 * a heartbeat word in a node-local shared-memory window every 100 ms; a
 * process that is stopped or dead stops beating. While the main thread is
 * inside a guarded stretch, the helper watches the heartbeats of the ranks
 * on its node, and one that stands still past mesh.watchdog_timeout aborts
 * the job naming it. A rank that is only slow (a large write, a loaded
 * disk) keeps beating, so a long save is never cut short. Reading the words
 * is plain loads from shared memory: the helper makes no MPI call, so it is
 * safe under MPI_THREAD_FUNNELED. */
#include "cai_config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster_internal.h"

/* One cache line a rank, so beats do not false-share. */
#define GUARD_STRIDE 8

struct cai_guard {
    int keyval; /* MPI_COMM_SELF attribute whose deletion stops the thread */
    MPI_Comm node;
    MPI_Win win;
    uint64_t **beat; /* [node rank] -> its heartbeat word */
    int *world_of;   /* [node rank] -> world rank */
    int n, me, world_rank;
    double timeout_s;
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, depth;
    double since; /* start of the outermost guarded stretch */
    char what[160];
};

static void report_and_exit(struct cai_guard *g, const int *frozen, int n_frozen, double waited) {
    char ranks[512];
    size_t o = 0;
    ranks[0] = 0;
    for (int i = 0; i < n_frozen && o + 16 < sizeof ranks; i++)
        o += (size_t)snprintf(ranks + o, sizeof ranks - o, "%s%d", i ? ", " : "", g->world_of[frozen[i]]);
    fprintf(stderr,
            "[rank %d] error: collective timed out: watchdog: %s did not complete within %.1f s on rank %d; ranks not "
            "progressing: %s (stopped or dead: no heartbeat for over %.1f s); aborting the job\n",
            g->world_rank, g->what, waited, g->world_rank, ranks, g->timeout_s);
    fflush(stderr);
    fflush(stdout);
    /* No MPI call from this thread: the launcher ends the job when a rank
     * exits without finalising. */
    _exit(1);
}

static void *guard_main(void *arg) {
    struct cai_guard *g = arg;
    uint64_t *last = calloc((size_t)g->n, sizeof *last);
    double *changed = calloc((size_t)g->n, sizeof *changed);
    int *frozen = calloc((size_t)g->n, sizeof *frozen);
    if (!last || !changed || !frozen) goto out;
    uint64_t beat = 0;
    double t0 = cai_time_now();
    for (int k = 0; k < g->n; k++) changed[k] = t0;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        __atomic_store_n(g->beat[g->me], ++beat, __ATOMIC_RELEASE);
        double now = cai_time_now();
        int n_frozen = 0;
        for (int k = 0; k < g->n; k++) {
            uint64_t v = __atomic_load_n(g->beat[k], __ATOMIC_ACQUIRE);
            if (v != last[k]) {
                last[k] = v;
                changed[k] = now;
            }
            double quiet = now - (changed[k] > g->since ? changed[k] : g->since);
            if (g->depth > 0 && k != g->me && quiet > g->timeout_s) frozen[n_frozen++] = k;
        }
        if (n_frozen) report_and_exit(g, frozen, n_frozen, now - g->since);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
out:
    free(last);
    free(changed);
    free(frozen);
    return NULL;
}

static void stop_thread(struct cai_guard *g) {
    if (!g->running) return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    g->running = 0;
}

/* MPI_Finalize deletes MPI_COMM_SELF's attributes first: an app that exits
 * without freeing its mesh still stops the thread before the shared window
 * it reads goes away. */
static int stop_at_finalize(MPI_Comm comm, int keyval, void *attr, void *extra) {
    (void)comm;
    (void)keyval;
    (void)extra;
    stop_thread(attr);
    return MPI_SUCCESS;
}

void cai_guard_init(cai_mesh_t *m) {
    m->guard = NULL;
    if (m->timeout_s <= 0) return;
    struct cai_guard *g = calloc(1, sizeof *g);
    if (!g) return;
    g->keyval = MPI_KEYVAL_INVALID;
    g->node = MPI_COMM_NULL;
    g->win = MPI_WIN_NULL;
    g->timeout_s = m->timeout_s;
    g->world_rank = m->world_rank;
    const char *why = NULL;
    if (MPI_Comm_split_type(m->cart, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &g->node) != MPI_SUCCESS) {
        why = "MPI_Comm_split_type";
        g->node = MPI_COMM_NULL;
        goto fail;
    }
    MPI_Comm_rank(g->node, &g->me);
    MPI_Comm_size(g->node, &g->n);
    uint64_t *mine = NULL;
    if (MPI_Win_allocate_shared((MPI_Aint)(GUARD_STRIDE * sizeof(uint64_t)), (int)sizeof(uint64_t), MPI_INFO_NULL,
                                g->node, &mine, &g->win) != MPI_SUCCESS) {
        why = "MPI_Win_allocate_shared";
        g->win = MPI_WIN_NULL;
        goto fail;
    }
    memset(mine, 0, GUARD_STRIDE * sizeof(uint64_t));
    g->beat = calloc((size_t)g->n, sizeof *g->beat);
    g->world_of = calloc((size_t)g->n, sizeof *g->world_of);
    if (!g->beat || !g->world_of) {
        why = "memory";
        goto fail;
    }
    for (int k = 0; k < g->n; k++) {
        MPI_Aint size = 0;
        int disp = 0;
        void *base = NULL;
        if (MPI_Win_shared_query(g->win, k, &size, &disp, &base) != MPI_SUCCESS || !base) {
            why = "MPI_Win_shared_query";
            goto fail;
        }
        g->beat[k] = base;
    }
    MPI_Allgather(&g->world_rank, 1, MPI_INT, g->world_of, 1, MPI_INT, g->node);
    MPI_Barrier(g->node); /* every word zeroed before anyone reads it */
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, stop_at_finalize, &g->keyval, NULL) != MPI_SUCCESS) {
        why = "MPI_Comm_create_keyval";
        g->keyval = MPI_KEYVAL_INVALID;
        goto fail;
    }
    if (pthread_create(&g->thread, NULL, guard_main, g) != 0) {
        why = "pthread_create";
        goto fail;
    }
    g->running = 1;
    MPI_Comm_set_attr(MPI_COMM_SELF, g->keyval, g);
    m->guard = g;
    return;
fail:
    /* The polled watchdog still works; only stretches MPI-IO owns go unwatched. */
    cai_log_rank(CAI_LOG_WARN, "watchdog: the guard for checkpoint I/O is off (%s failed)", why);
    m->guard = g;
    cai_guard_free(m);
}

void cai_guard_free(cai_mesh_t *m) {
    struct cai_guard *g = m->guard;
    if (!g) return;
    if (g->keyval != MPI_KEYVAL_INVALID) {
        if (g->running) MPI_Comm_delete_attr(MPI_COMM_SELF, g->keyval); /* stops the thread */
        MPI_Comm_free_keyval(&g->keyval);
    }
    stop_thread(g);
    if (g->win != MPI_WIN_NULL) MPI_Win_free(&g->win);
    if (g->node != MPI_COMM_NULL) MPI_Comm_free(&g->node);
    free(g->beat);
    free(g->world_of);
    free(g);
    m->guard = NULL;
}

void cai_mesh_guard_begin(cai_mesh_t *m, const char *what) {
    struct cai_guard *g = m ? m->guard : NULL;
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    if (g->depth++ == 0) {
        g->since = cai_time_now();
        snprintf(g->what, sizeof g->what, "%s", what ? what : "a guarded call");
    }
    pthread_mutex_unlock(&g->mu);
}

void cai_mesh_guard_end(cai_mesh_t *m) {
    struct cai_guard *g = m ? m->guard : NULL;
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    if (g->depth > 0) g->depth--;
    pthread_mutex_unlock(&g->mu);
}
