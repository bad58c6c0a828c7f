/* The watchdog: every communication call is polled until it completes or the
 * timeout passes. To name the rank that holds everybody up, each rank counts
 * the collectives it has entered per axis and publishes the counters (and what
 * it is blocked in right now) in a small RMA window; on timeout a rank reads
 * its group's counters with MPI_Rget and lists the peers that are behind.
 * Reading needs no help from the stuck peer where the window lives in shared
 * memory or RDMA; a peer that does not answer in a short while counts as stuck. */
#include "cai_config.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster_internal.h"

static const char *const k_kind_names[CAI_OP_KIND_COUNT] = {
    [CAI_OP_ALLREDUCE] = "allreduce",
    [CAI_OP_REDUCE_SCATTER] = "reduce_scatter",
    [CAI_OP_ALLGATHER] = "all_gather",
    [CAI_OP_ALLTOALL] = "all_to_all",
    [CAI_OP_ALLTOALLV] = "all_to_allv",
    [CAI_OP_BCAST] = "broadcast",
    [CAI_OP_BARRIER] = "barrier",
    [CAI_OP_IALLREDUCE] = "iallreduce",
    [CAI_OP_SEND] = "send",
    [CAI_OP_RECV] = "recv",
    [CAI_OP_NCCL_INIT] = "nccl-init",
    [CAI_OP_IREDUCE_SCATTER] = "ireduce_scatter",
    [CAI_OP_IALLGATHER] = "iall_gather",
    [CAI_OP_IALLTOALL] = "iall_to_all",
};

const char *cai_op_kind_name(cai_op_kind kind) {
    if ((int)kind < 0 || kind >= CAI_OP_KIND_COUNT) return "?";
    return k_kind_names[kind];
}

cai_status cai_wd_init(cai_mesh_t *m) {
    m->win_ok = 0;
    if (m->timeout_s <= 0) return CAI_OK;
    cai_guard_init(m);
    int rc = MPI_Win_allocate((MPI_Aint)(CAI_WD_WORDS * sizeof(uint64_t)), (int)sizeof(uint64_t), MPI_INFO_NULL,
                              m->cart, &m->win_mem, &m->win);
    if (rc != MPI_SUCCESS) {
        /* The watchdog still times out; it just cannot say who is behind. */
        cai_log_rank(CAI_LOG_WARN,
                     "watchdog: MPI_Win_allocate failed (MPI error %d): timeouts will not name the stuck ranks", rc);
        m->win = MPI_WIN_NULL;
        m->win_mem = NULL;
        return CAI_OK;
    }
    memset(m->win_mem, 0, CAI_WD_WORDS * sizeof(uint64_t));
    MPI_Win_set_errhandler(m->win, MPI_ERRORS_RETURN);
    /* One passive-target epoch for the mesh's lifetime: reads on timeout
     * then need no synchronisation with the (possibly stuck) target. */
    CAI_CALL_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, m->win));
    m->win_ok = 1;
    return CAI_OK;
}

void cai_wd_free(cai_mesh_t *m) {
    cai_guard_free(m);
    if (m->win == MPI_WIN_NULL) return;
    MPI_Win_unlock_all(m->win);
    MPI_Win_free(&m->win);
    m->win_mem = NULL;
}

static void publish(cai_mesh_t *m, int word, uint64_t value) {
    if (!m->win_mem) return;
    __atomic_store_n(&m->win_mem[word], value, __ATOMIC_RELEASE);
    /* Makes the store visible to RMA readers in either memory model. */
    MPI_Win_sync(m->win);
}

static void beat(cai_mesh_t *m) {
    if (m->win_mem) __atomic_add_fetch(&m->win_mem[CAI_WD_BEAT], 1, __ATOMIC_RELEASE);
}

uint64_t cai_wd_enter(cai_mesh_t *m, cai_axis axis) {
    uint64_t seq = ++m->seq[axis];
    beat(m);
    publish(m, (int)axis, seq);
    return seq;
}

/* Activity word: what a rank is blocked in. 0 = not in a communication call. */
static uint64_t activity_word(const cai_coll *c, uint64_t seq) {
    return (seq << 16) | ((uint64_t)c->kind << 8) | (uint64_t)(c->axis + 1);
}

static void describe_activity(uint64_t w, char *buf, size_t cap) {
    if (w == 0) {
        snprintf(buf, cap, "not in a communication call");
        return;
    }
    int axis = (int)(w & 0xff) - 1;
    int kind = (int)((w >> 8) & 0xff);
    unsigned long long seq = (unsigned long long)(w >> 16);
    if (kind == CAI_OP_SEND || kind == CAI_OP_RECV)
        snprintf(buf, cap, "blocked in %s on axis %s", cai_op_kind_name((cai_op_kind)kind),
                 cai_axis_name((cai_axis)axis));
    else
        snprintf(buf, cap, "blocked in %s #%llu on axis %s", cai_op_kind_name((cai_op_kind)kind), seq,
                 cai_axis_name((cai_axis)axis));
}

/* Reads the watchdog words of `n` world ranks; answered[k] says who replied
 * within a short bounded wait. */
static void read_peers(cai_mesh_t *m, const int *ranks, int n, uint64_t *vals, int *answered, double wait_s) {
    MPI_Request *req = calloc((size_t)n, sizeof *req);
    if (!req) return;
    for (int k = 0; k < n; k++) {
        req[k] = MPI_REQUEST_NULL;
        answered[k] = 0;
        if (ranks[k] == m->world_rank) {
            memcpy(&vals[(size_t)k * CAI_WD_WORDS], m->win_mem, CAI_WD_WORDS * sizeof(uint64_t));
            answered[k] = 1;
        } else if (MPI_Rget(&vals[(size_t)k * CAI_WD_WORDS], CAI_WD_WORDS, MPI_UINT64_T, ranks[k], 0, CAI_WD_WORDS,
                            MPI_UINT64_T, m->win, &req[k]) != MPI_SUCCESS) {
            req[k] = MPI_REQUEST_NULL;
        }
    }
    double t0 = cai_time_now();
    for (;;) {
        int pending = 0;
        for (int k = 0; k < n; k++) {
            if (answered[k] || req[k] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            if (MPI_Test(&req[k], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                req[k] = MPI_REQUEST_NULL;
                continue;
            }
            if (flag) answered[k] = 1;
            else pending++;
        }
        if (!pending || cai_time_now() - t0 > wait_s) break;
        sched_yield();
    }
    for (int k = 0; k < n; k++)
        if (!answered[k] && req[k] != MPI_REQUEST_NULL) {
            /* An RMA request cannot be cancelled; the read may still land
             * later, so stop using the window for reports. */
            m->win_ok = 0;
        }
    free(req);
}

#define REPORT_MAX_RANKS 16

/* Builds the timeout report for a collective (who in the group is behind)
 * or a point-to-point call (what the peer is doing). */
static void report(cai_mesh_t *m, const cai_coll *c, uint64_t seq, double waited, char *text, size_t cap) {
    cai_sbuf s = {text, cap, 0};
    const int *group = m->group[c->axis];
    int n = m->size[c->axis];
    int p2p = c->kind == CAI_OP_SEND || c->kind == CAI_OP_RECV;
    if (p2p) {
        int peer = group[c->peer];
        cai_sbuf_add(&s, "watchdog: %s %s rank %d (axis %s rank %d, tag %d) did not complete within %.1f s on rank %d",
                     cai_op_kind_name(c->kind), c->kind == CAI_OP_SEND ? "to" : "from", peer, cai_axis_name(c->axis),
                     c->peer, c->tag, waited, m->world_rank);
        if (!m->win_ok) return;
        uint64_t vals[CAI_WD_WORDS];
        int answered = 0;
        read_peers(m, &peer, 1, vals, &answered, 0.5);
        char what[96];
        if (answered) {
            describe_activity(vals[CAI_WD_ACTIVITY], what, sizeof what);
            cai_sbuf_add(&s, "; rank %d is %s", peer, what);
        } else {
            cai_sbuf_add(&s, "; rank %d does not answer (stuck outside MPI or dead)", peer);
        }
        return;
    }
    cai_sbuf_add(&s, "watchdog: %s #%llu on axis %s (group of %d) did not complete within %.1f s on rank %d",
                 cai_op_kind_name(c->kind), (unsigned long long)seq, cai_axis_name(c->axis), n, waited, m->world_rank);
    if (!m->win_ok) {
        cai_sbuf_add(&s, "; peers' progress unknown (no RMA window)");
        return;
    }
    uint64_t *vals = calloc((size_t)n * CAI_WD_WORDS, sizeof *vals);
    int *answered = calloc((size_t)n, sizeof *answered);
    if (!vals || !answered) {
        free(vals);
        free(answered);
        return;
    }
    read_peers(m, group, n, vals, answered, 0.5);
    int behind = 0, silent = 0;
    for (int k = 0; k < n; k++) {
        uint64_t at = vals[(size_t)k * CAI_WD_WORDS + c->axis];
        if (!answered[k] || at >= seq) continue;
        if (behind == REPORT_MAX_RANKS) {
            cai_sbuf_add(&s, ", ...");
        } else if (behind < REPORT_MAX_RANKS) {
            char what[96];
            describe_activity(vals[(size_t)k * CAI_WD_WORDS + CAI_WD_ACTIVITY], what, sizeof what);
            cai_sbuf_add(&s, "%s%d (at #%llu, %s)", behind ? ", " : "; ranks behind: ", group[k],
                         (unsigned long long)at, what);
        }
        behind++;
    }
    for (int k = 0; k < n; k++) {
        if (answered[k]) continue;
        if (silent < REPORT_MAX_RANKS)
            cai_sbuf_add(&s, "%s%d", silent ? ", " : "; ranks not answering (stuck): ", group[k]);
        silent++;
    }
    if (!behind && !silent) {
        cai_sbuf_add(&s, "; no rank of the group is behind (all reached #%llu)", (unsigned long long)seq);
        /* Everyone entered it, so someone stopped driving it (a non-blocking
         * collective needs every peer to keep calling into MPI): the ranks
         * whose heartbeat stands still over a second. */
        uint64_t *again = calloc((size_t)n * CAI_WD_WORDS, sizeof *again);
        int *answered2 = calloc((size_t)n, sizeof *answered2);
        if (again && answered2 && m->win_ok) {
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
            read_peers(m, group, n, again, answered2, 0.5);
            int still = 0;
            for (int k = 0; k < n; k++) {
                if (group[k] == m->world_rank) continue;
                uint64_t b0 = vals[(size_t)k * CAI_WD_WORDS + CAI_WD_BEAT];
                uint64_t b1 = again[(size_t)k * CAI_WD_WORDS + CAI_WD_BEAT];
                if (answered2[k] && b0 != b1) continue;
                if (still < REPORT_MAX_RANKS) {
                    char what[96];
                    describe_activity(again[(size_t)k * CAI_WD_WORDS + CAI_WD_ACTIVITY], what, sizeof what);
                    cai_sbuf_add(&s, "%s%d (%s)", still ? ", " : "; ranks not progressing: ", group[k],
                                 answered2[k] ? what : "not answering");
                }
                still++;
            }
        }
        free(again);
        free(answered2);
        int listed = 0;
        for (int k = 0; k < n && listed < REPORT_MAX_RANKS; k++) {
            uint64_t act = vals[(size_t)k * CAI_WD_WORDS + CAI_WD_ACTIVITY];
            if (group[k] == m->world_rank || act == activity_word(c, seq)) continue;
            char what[96];
            describe_activity(act, what, sizeof what);
            cai_sbuf_add(&s, "%s%d is %s", listed ? ", " : "; elsewhere: rank ", group[k], what);
            listed++;
        }
    }
    free(vals);
    free(answered);
}

cai_status cai_wd_wait(cai_mesh_t *m, const cai_coll *c, uint64_t seq, cai_wd_poll_fn done, void *ctx) {
    return cai_wd_wait_limit(m, c, seq, done, ctx, 0);
}

cai_status cai_wd_wait_limit(cai_mesh_t *m, const cai_coll *c, uint64_t seq, cai_wd_poll_fn done, void *ctx,
                             double limit_s) {
    return cai_wd_wait_nap(m, c, seq, done, ctx, limit_s, 1000000);
}

cai_status cai_wd_wait_nap(cai_mesh_t *m, const cai_coll *c, uint64_t seq, cai_wd_poll_fn done, void *ctx,
                           double limit_s, long max_nap_ns) {
    publish(m, CAI_WD_ACTIVITY, activity_word(c, seq));
    double t0 = cai_time_now();
    long nap_ns = 20000 < max_nap_ns ? 20000 : max_nap_ns;
    cai_status st = CAI_OK;
    for (;;) {
        int r = done(ctx);
        if (r == 1) break;
        if (r < 0) {
            st = cai_error_status();
            if (st == CAI_OK)
                st = CAI_ERROR(CAI_ERR_INTERNAL, "%s poll failed without a message", cai_op_kind_name(c->kind));
            break;
        }
        double waited = cai_time_now() - t0;
        int watchdog = m->timeout_s > 0 && waited > m->timeout_s;
        if (watchdog || (limit_s > 0 && waited > limit_s)) {
            char text[1900];
            report(m, c, seq, waited, text, sizeof text);
            st = CAI_ERROR(CAI_ERR_TIMEOUT, "%s", text);
            /* The caller's own limit returns: it has a deadline of its own to report. */
            if (watchdog && m->abort_on_timeout) cai_abort(CAI_ERR_TIMEOUT);
            break;
        }
        /* Spin briefly for latency, then yield (ranks may share cores), then
         * nap so a long wait does not burn a core the peer needs. */
        if (waited < 0.0005) continue;
        if (waited < 0.01) {
            sched_yield();
            continue;
        }
        beat(m);
        struct timespec ts = {0, nap_ns};
        nanosleep(&ts, NULL);
        if (nap_ns < max_nap_ns) nap_ns = 2 * nap_ns < max_nap_ns ? 2 * nap_ns : max_nap_ns;
    }
    publish(m, CAI_WD_ACTIVITY, 0);
    return st;
}
