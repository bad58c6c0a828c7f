/* Status codes and the per-thread error trace. */
#include "cai_config.h"
#include "colossal/base.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAI_TRACE_DEPTH 32
#define CAI_MSG_LEN 2048

typedef struct {
    char file[96];
    int line;
    char func[64];
    char expr[96];
} cai_frame;

typedef struct {
    cai_status status;
    char message[CAI_MSG_LEN];
    cai_frame frames[CAI_TRACE_DEPTH];
    int depth;
} cai_trace;

static _Thread_local cai_trace g_trace;

static const char *const k_status_names[CAI_STATUS_COUNT] = {
    [CAI_OK] = "ok",
    [CAI_ERR_INVALID_ARG] = "invalid argument",
    [CAI_ERR_CONFIG] = "configuration error",
    [CAI_ERR_LAYOUT] = "invalid parallel layout",
    [CAI_ERR_IO] = "I/O error",
    [CAI_ERR_FORMAT] = "malformed file",
    [CAI_ERR_NOMEM] = "out of memory",
    [CAI_ERR_MPI] = "MPI error",
    [CAI_ERR_CUDA] = "CUDA error",
    [CAI_ERR_NCCL] = "NCCL error",
    [CAI_ERR_HDF5] = "HDF5 error",
    [CAI_ERR_TIMEOUT] = "collective timed out",
    [CAI_ERR_UNSUPPORTED] = "unsupported",
    [CAI_ERR_INTERNAL] = "internal error",
};

const char *cai_status_str(cai_status st) {
    if ((int)st < 0 || st >= CAI_STATUS_COUNT) return "unknown status";
    return k_status_names[st];
}

static void copy_trunc(char *dst, size_t cap, const char *src) {
    if (!src) src = "";
    size_t n = strlen(src);
    /* Keep the tail of long paths: the file name matters more than the root. */
    if (n >= cap) src += n - (cap - 1);
    snprintf(dst, cap, "%s", src);
}

static void push_frame(const char *file, int line, const char *func, const char *expr) {
    if (g_trace.depth >= CAI_TRACE_DEPTH) return;
    cai_frame *f = &g_trace.frames[g_trace.depth++];
    copy_trunc(f->file, sizeof f->file, file);
    f->line = line;
    copy_trunc(f->func, sizeof f->func, func);
    copy_trunc(f->expr, sizeof f->expr, expr);
}

cai_status cai_error_set(cai_status st, const char *file, int line, const char *func, const char *fmt, ...) {
    g_trace.status = st;
    g_trace.depth = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_trace.message, sizeof g_trace.message, fmt, ap);
    va_end(ap);
    push_frame(file, line, func, NULL);
    return st;
}

void cai_error_push(const char *file, int line, const char *func, const char *expr) {
    push_frame(file, line, func, expr);
}

cai_status cai_error_mpi(int mpi_err, const char *file, int line, const char *func, const char *expr) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Error_string(mpi_err, text, &len);
    return cai_error_set(CAI_ERR_MPI, file, line, func, "%s failed: %s (MPI error %d)", expr, len ? text : "unknown",
                         mpi_err);
}

const char *cai_error_message(void) { return g_trace.message; }
cai_status cai_error_status(void) { return g_trace.status; }

void cai_error_clear(void) {
    g_trace.status = CAI_OK;
    g_trace.message[0] = 0;
    g_trace.depth = 0;
}

static int world_rank(void) {
    int initialized = 0, finalized = 0, rank = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

void cai_error_print(FILE *out) {
    int rank = world_rank();
    if (g_trace.status == CAI_OK && g_trace.depth == 0) {
        fprintf(out, "[rank %d] error: (no error recorded)\n", rank);
        return;
    }
    fprintf(out, "[rank %d] error: %s: %s\n", rank, cai_status_str(g_trace.status), g_trace.message);
    for (int i = 0; i < g_trace.depth; i++) {
        const cai_frame *f = &g_trace.frames[i];
        if (f->expr[0])
            fprintf(out, "[rank %d]   at %s:%d in %s() calling %s\n", rank, f->file, f->line, f->func, f->expr);
        else fprintf(out, "[rank %d]   at %s:%d in %s()\n", rank, f->file, f->line, f->func);
    }
    fflush(out);
}

void cai_abort(cai_status st) {
    cai_error_print(stderr);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    int code = st == CAI_OK ? 1 : (int)st;
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
    /* Without MPI there is nobody else to stop: a plain process abort. */
    abort();
}

const char *cai_version_string(void) { return PACKAGE_VERSION; }

static const struct {
    const char *name;
    size_t size;
} k_dtypes[CAI_DTYPE_COUNT] = {
    [CAI_DTYPE_F32] = {"f32", 4}, [CAI_DTYPE_BF16] = {"bf16", 2}, [CAI_DTYPE_F16] = {"f16", 2},
    [CAI_DTYPE_F64] = {"f64", 8}, [CAI_DTYPE_I32] = {"i32", 4},   [CAI_DTYPE_I64] = {"i64", 8},
    [CAI_DTYPE_U8] = {"u8", 1},   [CAI_DTYPE_U16] = {"u16", 2},
};

size_t cai_dtype_size(cai_dtype dt) {
    if ((int)dt < 0 || dt >= CAI_DTYPE_COUNT) return 0;
    return k_dtypes[dt].size;
}

const char *cai_dtype_name(cai_dtype dt) {
    if ((int)dt < 0 || dt >= CAI_DTYPE_COUNT) return "?";
    return k_dtypes[dt].name;
}

cai_status cai_dtype_parse(const char *name, cai_dtype *out) {
    for (int i = 0; i < CAI_DTYPE_COUNT; i++) {
        if (name && strcmp(name, k_dtypes[i].name) == 0) {
            *out = (cai_dtype)i;
            return CAI_OK;
        }
    }
    return CAI_ERROR(CAI_ERR_INVALID_ARG, "unknown dtype '%s' (expected f32, bf16, f16, f64, i32, i64, u8 or u16)",
                     name ? name : "(null)");
}
