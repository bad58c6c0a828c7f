/* The run-time knobs: every environment variable that tunes the library,
 * declared here once (name, type, default, meaning) so that one table is
 * what the code reads and what `colossal-check --info` prints. A switch
 * kept only to compare against a slower path does not belong here: the
 * slower path is deleted instead (bench/HISTORY.md keeps the numbers). */
#include "cai_config.h"
#include "colossal/base.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const cai_knob_info g_knobs[] = {
    {"CAI_CUDA_TF32", CAI_KNOB_INT, "0", NULL, 0, 1,
     "1: f32 matmuls run on tensor cores in TF32 (10-bit mantissa); 0: exact f32 products"},
    {"CAI_CUDA_FP8_FAST_ACCUM", CAI_KNOB_INT, "0", NULL, 0, 1,
     "1: cuBLASLt's FP8 products accumulate without periodic promotion to f32 (faster, less accurate over long "
     "K); 0: f32 accumulation throughout"},
    {"CAI_CUDA_PDL", CAI_KNOB_INT, "1", NULL, 0, 1,
     "1: a decode step's products of few rows start reading their weights before the previous kernel ends "
     "(programmatic dependent launch, sm_90 and later); 0: ordinary launches"},
    {"CAI_CUBLASLT_AUTOTUNE", CAI_KNOB_INT, "0", NULL, 0, 16,
     "cuBLASLt algorithms timed per new matmul shape: 0 the heuristic's first, untimed; 1 its 8 best; "
     "N (2-16) its N best (the timed choice can differ from run to run)"},
    {"CAI_CUDA_LT_WORKSPACE_MB", CAI_KNOB_INT, "32", NULL, 0, 4096,
     "MiB of cuBLASLt workspace per GPU (32 is what cuBLAS recommends on Hopper; 0 restricts the algorithms)"},
    {"CAI_CUDA_SCRATCH_MB", CAI_KNOB_INT, "64", NULL, 1, 1 << 20,
     "MiB of device scratch per GPU for the kernels' temporaries (column sums, sort buffers, reductions)"},
    {"CAI_CUDA_ATTN", CAI_KNOB_ENUM, "auto", "auto|cudnn|flash", 0, 0,
     "attention kernels: auto = cuDNN's fused attention where built and it takes the case, else the project's; "
     "cudnn = cuDNN only (a case it declines is an error); flash = the project's kernels only (flash attention "
     "on tensor cores where it applies, else the WMMA or CUDA-core kernels)"},
    {"CAI_CUDA_GROUPED", CAI_KNOB_ENUM, "auto", "auto|loop|grouped", 0, 0,
     "the experts' grouped products: loop = one cuBLASLt product per expert, every expert planned at the "
     "experts' mean row count; grouped = all experts in one cublasGemmGroupedBatchedEx launch; auto = loop when the "
     "experts average 1024 rows or more"},
    {"CAI_CUDNN_DETERMINISTIC", CAI_KNOB_INT, "1", NULL, 0, 1,
     "1: cuDNN's attention backward is bitwise repeatable; 0: its faster non-deterministic backward (atomics)"},
    {"CAI_NCCL_TRACE", CAI_KNOB_INT, "0", NULL, 0, 1,
     "1: time the non-blocking device collectives with CUDA events and print to stderr, as each completes, when "
     "its data was ready, when it started and how long it ran"},
    {"CAI_PP_HOST_TRANSPORT", CAI_KNOB_ENUM, "shm", "shm|mpi", 0, 0,
     "pipeline stage boundaries on the host when every pipeline rank is on one node: shm = the sender copies the "
     "tensor into the receiver's buffer in node-shared memory and a one-word MPI message says it is there (the "
     "data needs no MPI progress from the sender, which is computing); mpi = the tensor is the MPI message. The "
     "same on every rank"},
    {"CAI_CKPT_MPIIO", CAI_KNOB_ENUM, "independent", "independent|two-phase", 0, 0,
     "MPI-IO under the collective checkpoint calls: independent = each rank writes its own contiguous pieces "
     "(one node, large disjoint pieces); two-phase = MPI-IO's collective buffering through aggregators (many "
     "ranks on a parallel file system). The same on every rank"},
#if CAI_TEST_HOOKS
    {"CAI_CKPT_TEST_STALL", CAI_KNOB_STR, "", NULL, 0, 0,
     "test hook, N[:R]: rank R (default the last) stalls for 10 minutes after its N-th write transfer of every "
     "checkpoint save, so a test can kill it mid-write"},
    {"CAI_PP_EQUAL_COMPUTE_US", CAI_KNOB_INT, "0", NULL, 0, 10000000,
     "test hook, N > 0: each pipeline compute action (forward, backward input or weight pass; a fused backward "
     "counts 2) sleeps after its real compute until N microseconds per unit have passed since it began, so every "
     "stage takes the same time and the measured bubble can be set against the schedule's; 0: off"},
    {"CAI_GUARD_TEST_NODES", CAI_KNOB_INT, "0", NULL, 0, 1,
     "test hook, 1: the watchdog's guard takes every rank for a node of its own, so its cross-node heartbeat "
     "files (cai_mesh_guard_dir) are tested on one machine"},
#endif
};

enum { N_KNOBS = sizeof g_knobs / sizeof g_knobs[0], TEXT_MAX = 256 };

typedef struct {
    int loaded;
    cai_knob_source source;
    long long ival;
    char text[TEXT_MAX]; /* the effective value; for ENUM the choice as the table spells it */
    char bad[TEXT_MAX];  /* a value that did not parse (bad_set: it stays an error) */
    int bad_set;
} knob_state;

static knob_state g_state[N_KNOBS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

size_t cai_knob_count(void) { return N_KNOBS; }

const cai_knob_info *cai_knob_at(size_t i) { return i < N_KNOBS ? &g_knobs[i] : NULL; }

int cai_test_hooks_built(void) { return CAI_TEST_HOOKS; }

static int find(const char *name) {
    for (int i = 0; name && i < N_KNOBS; i++)
        if (strcmp(g_knobs[i].name, name) == 0) return i;
    return -1;
}

/* The index of `v` among the '|'-separated choices, -1 if absent; the
 * canonical spelling goes to out. */
static int enum_index(const char *choices, const char *v, char *out, size_t cap) {
    int idx = 0;
    for (const char *c = choices; *c; idx++) {
        const char *bar = strchr(c, '|');
        size_t n = bar ? (size_t)(bar - c) : strlen(c);
        if (strlen(v) == n && strncmp(c, v, n) == 0) {
            snprintf(out, cap, "%.*s", (int)n, c);
            return idx;
        }
        if (!bar) break;
        c = bar + 1;
    }
    return -1;
}

/* Parses v for knob k into st (1) or leaves st untouched (0). */
static int parse(const cai_knob_info *k, const char *v, knob_state *st) {
    if (strlen(v) >= TEXT_MAX) return 0;
    switch (k->type) {
    case CAI_KNOB_INT: {
        char *end = NULL;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || errno || !end || *end || x < k->min || x > k->max) return 0;
        st->ival = x;
        snprintf(st->text, TEXT_MAX, "%lld", x);
        return 1;
    }
    case CAI_KNOB_ENUM: {
        int idx = enum_index(k->choices, v, st->text, TEXT_MAX);
        if (idx < 0) return 0;
        st->ival = idx;
        return 1;
    }
    case CAI_KNOB_STR:
        snprintf(st->text, TEXT_MAX, "%s", v);
        st->ival = 0;
        return 1;
    }
    return 0;
}

static cai_status invalid(const cai_knob_info *k, const char *where, const char *v) {
    if (k->type == CAI_KNOB_INT)
        return CAI_ERROR(CAI_ERR_CONFIG, "%s %s='%s': expected an integer in [%lld, %lld] (default %s: %s)", where,
                         k->name, v, k->min, k->max, k->dflt, k->meaning);
    return CAI_ERROR(CAI_ERR_CONFIG, "%s %s='%s': expected one of %s (default %s: %s)", where, k->name, v, k->choices,
                     k->dflt, k->meaning);
}

/* With g_lock held: knob i read from the environment once. */
static void load(int i) {
    knob_state *st = &g_state[i];
    if (st->loaded) return;
    st->loaded = 1;
    const char *v = getenv(g_knobs[i].name);
    if (v && *v) {
        if (parse(&g_knobs[i], v, st)) {
            st->source = CAI_KNOB_FROM_ENV;
            return;
        }
        snprintf(st->bad, TEXT_MAX, "%s", v);
        st->bad_set = 1;
    }
    parse(&g_knobs[i], g_knobs[i].dflt, st);
    st->source = CAI_KNOB_FROM_DEFAULT;
}

/* Knob `name` loaded and valid, or the error that says why not. */
static cai_status get(const char *name, cai_knob_type want, knob_state **out) {
    int i = find(name);
    if (i < 0) return CAI_ERROR(CAI_ERR_INTERNAL, "knob '%s' is not declared in src/base/knobs.c", name ? name : "");
    const cai_knob_info *k = &g_knobs[i];
    if (want == CAI_KNOB_INT && k->type != CAI_KNOB_INT)
        return CAI_ERROR(CAI_ERR_INTERNAL, "knob %s is not an integer knob", name);
    if (want != CAI_KNOB_INT && k->type == CAI_KNOB_INT)
        return CAI_ERROR(CAI_ERR_INTERNAL, "knob %s is an integer knob (cai_knob_int)", name);
    pthread_mutex_lock(&g_lock);
    load(i);
    pthread_mutex_unlock(&g_lock);
    if (g_state[i].bad_set) return invalid(k, "environment variable", g_state[i].bad);
    *out = &g_state[i];
    return CAI_OK;
}

cai_status cai_knob_int(const char *name, long long *out) {
    CAI_CHECK_ARG(out, "cai_knob_int: NULL output");
    knob_state *st = NULL;
    CAI_CALL(get(name, CAI_KNOB_INT, &st));
    *out = st->ival;
    return CAI_OK;
}

cai_status cai_knob_str(const char *name, const char **out) {
    CAI_CHECK_ARG(out, "cai_knob_str: NULL output");
    knob_state *st = NULL;
    CAI_CALL(get(name, CAI_KNOB_ENUM, &st));
    *out = st->text;
    return CAI_OK;
}

cai_status cai_knob_value(const char *name, const char **text, cai_knob_source *source) {
    CAI_CHECK_ARG(text && source, "cai_knob_value: NULL output");
    int i = find(name);
    CAI_CHECK_ARG(i >= 0, "cai_knob_value: no knob named '%s'", name ? name : "");
    knob_state *st = NULL;
    CAI_CALL(get(name, g_knobs[i].type, &st));
    *text = st->text;
    *source = st->source;
    return CAI_OK;
}

cai_status cai_knob_set(const char *name, const char *value) {
    int i = find(name);
    CAI_CHECK_ARG(i >= 0, "cai_knob_set: no knob named '%s'", name ? name : "");
    knob_state next = {0};
    if (value && !parse(&g_knobs[i], value, &next)) return invalid(&g_knobs[i], "cai_knob_set", value);
    pthread_mutex_lock(&g_lock);
    if (value) {
        next.loaded = 1;
        next.source = CAI_KNOB_FROM_PROGRAM;
        g_state[i] = next;
    } else {
        memset(&g_state[i], 0, sizeof g_state[i]);
        load(i);
    }
    pthread_mutex_unlock(&g_lock);
    return CAI_OK;
}
