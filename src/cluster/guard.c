/* The guard: the watchdog for stretches of blocking calls it cannot poll
 * (MPI-IO inside HDF5's collective writes). Each rank's helper thread bumps
 * a heartbeat word in a node-local shared-memory window every 100 ms; a
 * process that is stopped or dead stops beating. While the main thread is
 * inside a guarded stretch, the helper watches the heartbeats of the ranks
 * on its node, and one that stands still past mesh.watchdog_timeout aborts
 * the job naming it. A rank that is only slow (a large write, a loaded
 * disk) keeps beating, so a long save is never cut short. Reading the words
 * is plain loads from shared memory: the helper makes no MPI call, so it is
 * safe under MPI_THREAD_FUNNELED.
 *
 * A rank alone on its node has no node-mate to see it stop. With a shared
 * directory (cai_mesh_guard_dir), each node's first rank also writes a
 * heartbeat file there about once a second and, in a guarded stretch,
 * reads the next node's (the nodes form a ring, so each file has one
 * reader): one that stands still past the timeout aborts the job too. */
#include "cai_config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    /* Cross-node heartbeats (node leaders with cai_mesh_guard_dir only). */
    int fd;                /* this node's heartbeat file, -1: none */
    char own_path[4096];   /* its path, removed at the end */
    char watch_path[4096]; /* the next node's, "": none */
    int watch_world;       /* that node's first rank */
    uint64_t watch_last;
    double watch_changed;
    uint64_t token;  /* this job's, in every heartbeat file: another run's file never matches */
    int watch_seen;  /* judged only once it has shown this job's token */
    int files_ready; /* set under mu once the fields above are final */
};

#define GUARD_FILE_PERIOD_S 1.0

static void exit_with_report(struct cai_guard *g, const char *ranks, const char *why, double waited) {
    fprintf(stderr,
            "[rank %d] error: collective timed out: watchdog: %s did not complete within %.1f s on rank %d; ranks not "
            "progressing: %s (%s); aborting the job\n",
            g->world_rank, g->what, waited, g->world_rank, ranks, why);
    fflush(stderr);
    fflush(stdout);
    /* No MPI call from this thread: the launcher ends the job when a rank
     * exits without finalising. */
    _exit(1);
}

static void report_and_exit(struct cai_guard *g, const int *frozen, int n_frozen, double waited) {
    char ranks[512], why[128];
    size_t o = 0;
    ranks[0] = 0;
    for (int i = 0; i < n_frozen && o + 16 < sizeof ranks; i++)
        o += (size_t)snprintf(ranks + o, sizeof ranks - o, "%s%d", i ? ", " : "", g->world_of[frozen[i]]);
    snprintf(why, sizeof why, "stopped or dead: no heartbeat for over %.1f s", g->timeout_s);
    exit_with_report(g, ranks, why, waited);
}

static void write_beat(struct cai_guard *g, uint64_t beat) {
    char buf[48];
    int n = snprintf(buf, sizeof buf, "%016" PRIx64 " %020" PRIu64 "\n", g->token, beat);
    /* Same size at the same offset: no new block, so a full disk does not stop it. */
    if (pwrite(g->fd, buf, (size_t)n, 0) != n) { /* the next round tries again */
    }
}

/* The cross-node part of one round, outside the lock (a slow file system
 * must not hold up cai_mesh_guard_begin): write this node's beat, read the
 * next node's. Returns when the watched file last changed, or -1 while it
 * has not shown this job's token. */
static double file_round(struct cai_guard *g, uint64_t beat, double now) {
    if (g->fd >= 0) write_beat(g, beat);
    if (!g->watch_path[0]) return -1;
    char buf[48];
    int fd = open(g->watch_path, O_RDONLY); /* a fresh open: NFS's close-to-open revalidates */
    ssize_t got = fd >= 0 ? pread(fd, buf, sizeof buf - 1, 0) : -1;
    if (fd >= 0) close(fd);
    uint64_t token = 0, v = 0;
    if (got > 0) {
        buf[got] = 0;
        if (sscanf(buf, "%" SCNx64 " %" SCNu64, &token, &v) != 2) token = 0;
    }
    if (token == g->token && (!g->watch_seen || v != g->watch_last)) {
        g->watch_seen = 1;
        g->watch_last = v;
        g->watch_changed = now;
    }
    return g->watch_seen ? g->watch_changed : -1;
}

static void *guard_main(void *arg) {
    struct cai_guard *g = arg;
    uint64_t *last = calloc((size_t)g->n, sizeof *last);
    double *changed = calloc((size_t)g->n, sizeof *changed);
    int *frozen = calloc((size_t)g->n, sizeof *frozen);
    if (!last || !changed || !frozen) goto out;
    uint64_t beat = 0;
    double t0 = cai_time_now(), next_file = 0;
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
        if (now >= next_file && g->files_ready) {
            next_file = now + GUARD_FILE_PERIOD_S;
            pthread_mutex_unlock(&g->mu);
            const double changed_at = file_round(g, beat, now);
            pthread_mutex_lock(&g->mu);
            if (g->depth > 0 && changed_at >= 0) {
                const double quiet = now - (changed_at > g->since ? changed_at : g->since);
                if (quiet > g->timeout_s) {
                    char ranks[32], why[4200];
                    snprintf(ranks, sizeof ranks, "%d", g->watch_world);
                    snprintf(why, sizeof why,
                             "stopped or dead: the heartbeat file %s of its node has not changed for over %.1f s",
                             g->watch_path, g->timeout_s);
                    exit_with_report(g, ranks, why, now - g->since);
                }
            }
        }
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
    g->fd = -1;
    g->win = MPI_WIN_NULL;
    g->timeout_s = m->timeout_s;
    g->world_rank = m->world_rank;
    const char *why = NULL;
    int split_nodes = 0;
#if CAI_TEST_HOOKS
    /* Every rank its own node: the cross-node heartbeat files tested on one machine. */
    long long v = 0;
    if (cai_knob_int("CAI_GUARD_TEST_NODES", &v) == CAI_OK) split_nodes = v != 0;
    cai_error_clear();
#endif
    if ((split_nodes ? MPI_Comm_split(m->cart, m->world_rank, 0, &g->node)
                     : MPI_Comm_split_type(m->cart, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &g->node)) != MPI_SUCCESS) {
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
    if (g->fd >= 0) {
        close(g->fd);
        unlink(g->own_path);
        char *slash = strrchr(g->own_path, '/');
        if (slash) {
            *slash = 0;
            rmdir(g->own_path); /* the last node's removal empties it; others fail harmlessly */
        }
    }
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

cai_status cai_mesh_guard_dir(cai_mesh_t *m, const char *dir) {
    CAI_CHECK_ARG(m && dir && *dir, "cai_mesh_guard_dir: NULL argument");
    struct cai_guard *g = m->guard;
    int leader = g && g->me == 0;
    /* Every rank takes part: whether the guard is on is the same everywhere
     * (mesh.watchdog_timeout), but a rank whose guard failed to start joins
     * with MPI_UNDEFINED. */
    MPI_Comm leaders = MPI_COMM_NULL;
    CAI_CALL_MPI(MPI_Comm_split(m->cart, leader ? 0 : MPI_UNDEFINED, m->world_rank, &leaders));
    if (leaders == MPI_COMM_NULL) return CAI_OK;
    int n = 0, me = 0;
    MPI_Comm_size(leaders, &n);
    MPI_Comm_rank(leaders, &me);
    /* The job's token: the first leader's clock and pid, the same in every file of this run. */
    uint64_t token = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid() ^ ((uint64_t)m->world_rank << 40);
    MPI_Bcast(&token, 1, MPI_UINT64_T, 0, leaders);
    int *world = calloc((size_t)n, sizeof *world);
    if (!world) {
        MPI_Comm_free(&leaders);
        return CAI_ERROR(CAI_ERR_NOMEM, "watchdog: heartbeat file table");
    }
    int rc = MPI_Allgather(&m->world_rank, 1, MPI_INT, world, 1, MPI_INT, leaders);
    MPI_Comm_free(&leaders);
    if (rc != MPI_SUCCESS || n == 1) { /* one node: its shared memory sees every rank */
        free(world);
        return rc == MPI_SUCCESS ? CAI_OK : CAI_ERROR(CAI_ERR_MPI, "watchdog: exchanging the node leaders failed");
    }
    char sub[3968]; /* leaves room for "/node-R" in the 4096-byte paths */
    if (snprintf(sub, sizeof sub, "%s/.cai-guard", dir) >= (int)sizeof sub) {
        free(world);
        cai_log_rank(CAI_LOG_WARN, "watchdog: the run directory's path is too long for heartbeat files (%zu bytes)",
                     strlen(dir));
        return CAI_OK;
    }
    if (mkdir(sub, 0755) != 0 && errno != EEXIST)
        cai_log_rank(CAI_LOG_WARN, "watchdog: cannot create %s (%s): this node's stop is seen only by its own ranks",
                     sub, strerror(errno));
    char own[4096];
    snprintf(own, sizeof own, "%s/node-%d", sub, m->world_rank);
    const int fd = open(own, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        cai_log_rank(CAI_LOG_WARN, "watchdog: cannot create %s (%s): this node's stop is seen only by its own ranks",
                     own, strerror(errno));
    pthread_mutex_lock(&g->mu);
    g->token = token;
    g->fd = fd;
    if (fd >= 0) write_beat(g, 0); /* the token is there before any stretch begins */
    snprintf(g->own_path, sizeof g->own_path, "%s", own);
    g->watch_world = world[(me + 1) % n];
    snprintf(g->watch_path, sizeof g->watch_path, "%s/node-%d", sub, g->watch_world);
    g->files_ready = 1;
    pthread_mutex_unlock(&g->mu);
    free(world);
    return CAI_OK;
}
