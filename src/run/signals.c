/* Signals that stop a job at a step boundary, agreed across ranks. */
#include "cai_config.h"

#include <signal.h>
#include <string.h>

#include "colossal/run.h"

static volatile sig_atomic_t g_signal;

/* The strongest signal seen stays (SIGTERM over SIGUSR1 over SIGINT, as the
 * ranks agree), so a later SIGINT cannot cancel a checkpointing stop. */
static void on_signal(int sig) {
    if (sig > g_signal) g_signal = sig;
}

void cai_run_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    /* SIGTERM and SIGUSR1 may come again before the step ends (a launcher
     * forwarding one per rank, scancel repeating it): they stay recorded. */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    /* A second Ctrl-C kills at once instead of waiting for the step to end. */
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, NULL);
}

int cai_run_signal_pending(void) { return (int)g_signal; }

void cai_run_signal_reset(void) { g_signal = 0; }

const char *cai_run_stop_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case CAI_RUN_STOP_AT: return "train.stop_at";
    default: return "a signal";
    }
}

cai_status cai_run_stop_agree(cai_mesh_t *mesh, int *sig) {
    CAI_CHECK_ARG(mesh && sig, "cai_run_stop_agree: NULL mesh or output");
    int32_t s = g_signal;
    CAI_CALL(cai_allreduce(mesh, CAI_AXIS_WORLD, &s, &s, 1, CAI_DTYPE_I32, CAI_RED_MAX));
    *sig = s;
    return CAI_OK;
}
