/* Named timing regions with a collective summary table. */
#include "cai_config.h"
#include "colossal/base.h"

#include <mpi.h>
#include <string.h>
#include <time.h>

#define CAI_MAX_TIMERS 128

typedef struct {
    char name[48];
    double started;
    double total;
    long count;
    int open;
} cai_timer_slot;

static cai_timer_slot g_timers[CAI_MAX_TIMERS];
static int g_ntimers;

double cai_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cai_timer_slot *find_slot(const char *name, int create) {
    for (int i = 0; i < g_ntimers; i++)
        if (strcmp(g_timers[i].name, name) == 0) return &g_timers[i];
    if (!create || g_ntimers == CAI_MAX_TIMERS) return NULL;
    cai_timer_slot *s = &g_timers[g_ntimers++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    return s;
}

void cai_timer_begin(const char *name) {
    cai_timer_slot *s = find_slot(name, 1);
    if (!s) return;
    s->started = cai_time_now();
    s->open = 1;
}

void cai_timer_end(const char *name) {
    cai_timer_slot *s = find_slot(name, 0);
    if (!s || !s->open) return;
    s->total += cai_time_now() - s->started;
    s->count++;
    s->open = 0;
}

void cai_timer_reset(void) { g_ntimers = 0; }

void cai_timer_report(FILE *out) {
    int initialized = 0, finalized = 0, rank = 0, size = 1;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    int use_mpi = initialized && !finalized;
    if (use_mpi) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    /* Regions are matched by rank 0's list, which every rank is expected to share. */
    int n = g_ntimers;
    if (use_mpi) MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0) fprintf(out, "%-40s %8s %12s %12s %12s\n", "region", "count", "total s", "mean ms", "max s");
    for (int i = 0; i < n; i++) {
        char name[48] = "";
        if (rank == 0 && i < g_ntimers) memcpy(name, g_timers[i].name, sizeof name);
        if (use_mpi) MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
        cai_timer_slot *s = find_slot(name, 0);
        double mine = s ? s->total : 0.0, sum = mine, max = mine;
        long count = s ? s->count : 0;
        if (use_mpi) {
            MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
            MPI_Reduce(&mine, &max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        }
        if (rank == 0) {
            double avg = sum / size;
            fprintf(out, "%-40s %8ld %12.4f %12.4f %12.4f\n", name, count, avg, count ? 1e3 * avg / (double)count : 0.0,
                    max);
        }
    }
    if (rank == 0) fflush(out);
}
