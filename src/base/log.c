/* Rank-aware logging: one line per message, prefixed with time, rank/size and
 * level; by default only rank 0 speaks so a 1000-rank job logs once. */
#include "cai_config.h"
#include "colossal/base.h"

#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

static cai_log_options g_opt = {CAI_LOG_INFO, 0, 1, NULL};
static int g_rank = -1, g_size = 1;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const k_level_names[] = {"error", "warn", "info", "debug", "trace"};

void cai_log_configure(const cai_log_options *opt) {
    if (opt) g_opt = *opt;
}

cai_log_level cai_log_get_level(void) { return g_opt.level; }

const char *cai_log_level_name(cai_log_level level) {
    if ((int)level < 0 || level > CAI_LOG_TRACE) return "?";
    return k_level_names[level];
}

cai_status cai_log_level_parse(const char *name, cai_log_level *out) {
    for (int i = 0; i <= CAI_LOG_TRACE; i++) {
        if (name && strcasecmp(name, k_level_names[i]) == 0) {
            *out = (cai_log_level)i;
            return CAI_OK;
        }
    }
    return CAI_ERROR(CAI_ERR_INVALID_ARG, "unknown log level '%s' (expected error, warn, info, debug or trace)",
                     name ? name : "(null)");
}

void cai_log_set_rank(int rank, int size) {
    g_rank = rank;
    g_size = size;
}

static void resolve_rank(void) {
    if (g_rank >= 0) return;
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    }
}

void cai_vlog(cai_log_level level, int every_rank, const char *fmt, va_list ap) {
    if (level > g_opt.level) return;
    resolve_rank();
    int rank = g_rank < 0 ? 0 : g_rank;
    if (!every_rank && g_opt.rank_filter != CAI_LOG_ALL_RANKS && rank != g_opt.rank_filter) return;
    FILE *out = g_opt.out ? g_opt.out : stderr;
    char stamp[40] = "";
    if (g_opt.timestamps) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        struct tm tm;
        gmtime_r(&tv.tv_sec, &tm);
        size_t n = strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(stamp + n, sizeof stamp - n, ".%03dZ ", (int)(tv.tv_usec / 1000));
    }
    char body[4096];
    vsnprintf(body, sizeof body, fmt, ap);
    pthread_mutex_lock(&g_lock);
    fprintf(out, "%s[%d/%d %s] %s\n", stamp, rank, g_size, k_level_names[level], body);
    fflush(out);
    pthread_mutex_unlock(&g_lock);
}

void cai_log(cai_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    /* Errors and warnings concern the rank that has them: never filter those. */
    cai_vlog(level, level <= CAI_LOG_WARN, fmt, ap);
    va_end(ap);
}

void cai_log_rank(cai_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cai_vlog(level, 1, fmt, ap);
    va_end(ap);
}
