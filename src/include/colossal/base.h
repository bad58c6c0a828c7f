/* colossal base layer: status codes with an error trace, rank-aware logging,
 * arenas, timers and a counter-based RNG. Everything else in the library
 * builds on these; nothing here depends on any other colossal module. */
#ifndef COLOSSAL_BASE_H
#define COLOSSAL_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ status */

typedef enum {
    CAI_OK = 0,
    CAI_ERR_INVALID_ARG, /* a caller passed something impossible */
    CAI_ERR_CONFIG,      /* a configuration key, type or value is wrong */
    CAI_ERR_LAYOUT,      /* parallel layout does not fit world size or model */
    CAI_ERR_IO,          /* file system */
    CAI_ERR_FORMAT,      /* a file exists but its contents are malformed */
    CAI_ERR_NOMEM,       /* allocation failed or an arena is exhausted */
    CAI_ERR_MPI,
    CAI_ERR_CUDA,
    CAI_ERR_NCCL,
    CAI_ERR_HDF5,
    CAI_ERR_TIMEOUT,     /* the watchdog gave up on a collective */
    CAI_ERR_UNSUPPORTED, /* valid request this build or backend cannot serve */
    CAI_ERR_INTERNAL,    /* an invariant broke: a bug in colossal */
    CAI_STATUS_COUNT
} cai_status;

const char *cai_status_str(cai_status st);

/* Errors are reported where they happen with a formatted message (what failed,
 * which file/field/rank, what would fit) and then unwound by CAI_CALL, which
 * appends a frame per level, like PETSc's traceback. The trace is per thread. */
cai_status cai_error_set(cai_status st, const char *file, int line, const char *func, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void cai_error_push(const char *file, int line, const char *func, const char *expr);
cai_status cai_error_mpi(int mpi_err, const char *file, int line, const char *func, const char *expr);
/* The first message of the current trace ("" when none). */
const char *cai_error_message(void);
cai_status cai_error_status(void);
/* Message plus the call frames, one per line, prefixed with the rank. */
void cai_error_print(FILE *out);
void cai_error_clear(void);

#define CAI_ERROR(st, ...) cai_error_set((st), __FILE__, __LINE__, __func__, __VA_ARGS__)

#define CAI_CALL(expr)                                           \
    do {                                                         \
        cai_status cai_call_st_ = (expr);                        \
        if (cai_call_st_ != CAI_OK) {                            \
            cai_error_push(__FILE__, __LINE__, __func__, #expr); \
            return cai_call_st_;                                 \
        }                                                        \
    } while (0)

/* Propagate but run cleanup first: CAI_CALL_GOTO(x, st, fail). */
#define CAI_CALL_GOTO(expr, st_var, label)                       \
    do {                                                         \
        (st_var) = (expr);                                       \
        if ((st_var) != CAI_OK) {                                \
            cai_error_push(__FILE__, __LINE__, __func__, #expr); \
            goto label;                                          \
        }                                                        \
    } while (0)

#define CAI_CALL_MPI(expr)                                                          \
    do {                                                                            \
        int cai_mpi_rc_ = (expr);                                                   \
        if (cai_mpi_rc_ != 0 /* MPI_SUCCESS */)                                     \
            return cai_error_mpi(cai_mpi_rc_, __FILE__, __LINE__, __func__, #expr); \
    } while (0)

#define CAI_CHECK_ARG(cond, ...)                                         \
    do {                                                                 \
        if (!(cond)) return CAI_ERROR(CAI_ERR_INVALID_ARG, __VA_ARGS__); \
    } while (0)

/* Print the current error trace from this rank and abort every rank.
 * Used by apps (and by invariant checks) instead of exit() or assert(). */
void cai_abort(cai_status st) __attribute__((noreturn));
/* Abort with a message when an invariant does not hold (never compiled out). */
#define CAI_INVARIANT(cond, ...)                                                        \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            cai_error_set(CAI_ERR_INTERNAL, __FILE__, __LINE__, __func__, __VA_ARGS__); \
            cai_abort(CAI_ERR_INTERNAL);                                                \
        }                                                                               \
    } while (0)

/* ------------------------------------------------------------------ logging */

typedef enum {
    CAI_LOG_ERROR = 0,
    CAI_LOG_WARN = 1,
    CAI_LOG_INFO = 2,
    CAI_LOG_DEBUG = 3,
    CAI_LOG_TRACE = 4
} cai_log_level;

/* Which ranks print: messages logged with cai_log() appear on `rank_filter`
 * only (CAI_LOG_ALL_RANKS: every rank); cai_log_rank() always prints. */
#define CAI_LOG_ALL_RANKS (-1)

typedef struct {
    cai_log_level level;
    int rank_filter; /* default 0: log once per job */
    int timestamps;  /* ISO-8601 wall clock with milliseconds */
    FILE *out;       /* default stderr */
} cai_log_options;

void cai_log_configure(const cai_log_options *opt);
cai_status cai_log_level_parse(const char *name, cai_log_level *out);
const char *cai_log_level_name(cai_log_level level);
cai_log_level cai_log_get_level(void);
/* Rank and world size used in prefixes; read from MPI once it is initialised. */
void cai_log_set_rank(int rank, int size);

void cai_log(cai_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cai_log_rank(cai_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cai_vlog(cai_log_level level, int every_rank, const char *fmt, va_list ap);

#define CAI_INFO(...) cai_log(CAI_LOG_INFO, __VA_ARGS__)
#define CAI_WARN(...) cai_log(CAI_LOG_WARN, __VA_ARGS__)
#define CAI_DEBUG(...) cai_log(CAI_LOG_DEBUG, __VA_ARGS__)

/* ------------------------------------------------------------------ memory */

/* Aligned allocation that reports what it wanted on failure. */
cai_status cai_malloc(void **out, size_t bytes, const char *what);
cai_status cai_calloc(void **out, size_t count, size_t size, const char *what);
void cai_free(void *ptr);

/* Bump arena: one allocation up front, carved into aligned pieces, reset as a
 * whole. Hot paths take scratch from an arena instead of malloc. */
typedef struct cai_arena {
    unsigned char *base;
    size_t capacity;
    size_t used;
    size_t high_water;
    const char *name;
} cai_arena_t;

cai_status cai_arena_init(cai_arena_t *arena, size_t capacity, const char *name);
cai_status cai_arena_alloc(cai_arena_t *arena, size_t bytes, size_t align, void **out);
size_t cai_arena_mark(const cai_arena_t *arena);
void cai_arena_reset_to(cai_arena_t *arena, size_t mark);
void cai_arena_free(cai_arena_t *arena);

/* ------------------------------------------------------------------ timers */

/* Named begin/end regions accumulated per rank; cai_timer_report prints a
 * -log_view style table (count, total, mean, max over ranks) collectively. */
double cai_time_now(void); /* seconds, monotonic */
void cai_timer_begin(const char *name);
void cai_timer_end(const char *name);
void cai_timer_reset(void);
/* Collective over MPI_COMM_WORLD when MPI is initialised. */
void cai_timer_report(FILE *out);

/* ------------------------------------------------------------------ RNG */

/* Counter-based Philox-4x32-10: the value at (key, counter) never depends on
 * which rank or in what order it is computed, which is what makes parameter
 * initialisation identical under every parallel layout. */
typedef struct {
    uint32_t v[4];
} cai_philox_block;

cai_philox_block cai_philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);
/* Uniform in [0,1) and standard normal (Box-Muller) for element `index` of
 * stream (seed, stream_id). Pure functions. */
float cai_rng_uniform(uint64_t seed, uint64_t stream_id, uint64_t index);
float cai_rng_normal(uint64_t seed, uint64_t stream_id, uint64_t index);
/* Stable 64-bit hash of a string (FNV-1a), e.g. to key a stream by parameter name. */
uint64_t cai_hash64(const char *s);

/* ------------------------------------------------------------------ dtypes */

/* Element types shared by collectives (cluster), tensors and files. Lives in
 * base because the cluster layer sits below tensor. */
typedef enum {
    CAI_DTYPE_F32 = 0,
    CAI_DTYPE_BF16,
    CAI_DTYPE_F16,
    CAI_DTYPE_F64,
    CAI_DTYPE_I32,
    CAI_DTYPE_I64,
    CAI_DTYPE_U8,
    CAI_DTYPE_U16,
    CAI_DTYPE_COUNT
} cai_dtype;

size_t cai_dtype_size(cai_dtype dt);
const char *cai_dtype_name(cai_dtype dt);
cai_status cai_dtype_parse(const char *name, cai_dtype *out);

/* ------------------------------------------------------------------ knobs */

/* Run-time knobs: the environment variables that tune the library, declared
 * once in one table (src/base/knobs.c) with type, default and meaning, the
 * way NCCL declares its parameters; `colossal-check --info` prints them.
 * A knob's environment value is read and validated on its first use, then
 * kept for the life of the process; a value that does not parse is an error
 * naming the knob and what would fit, never a silent default. Every rank
 * must see the same value where a knob's meaning says so. Not collective. */
typedef enum {
    CAI_KNOB_INT,  /* a decimal integer in [min, max] */
    CAI_KNOB_ENUM, /* one of the '|'-separated choices */
    CAI_KNOB_STR   /* free text, parsed by the code that reads it */
} cai_knob_type;

typedef struct {
    const char *name; /* the environment variable */
    cai_knob_type type;
    const char *dflt;    /* the default, as text */
    const char *choices; /* ENUM: "a|b|c"; otherwise NULL */
    long long min, max;  /* INT: the valid range */
    const char *meaning;
} cai_knob_info;

typedef enum {
    CAI_KNOB_FROM_DEFAULT,
    CAI_KNOB_FROM_ENV,
    CAI_KNOB_FROM_PROGRAM /* cai_knob_set */
} cai_knob_source;

/* The table: cai_knob_at(i) for i < cai_knob_count(), NULL beyond. */
size_t cai_knob_count(void);
const cai_knob_info *cai_knob_at(size_t i);
/* An INT knob's value. */
cai_status cai_knob_int(const char *name, long long *out);
/* An ENUM knob's value (the choice as spelled in the table) or a STR
 * knob's text ("" when unset and without default); valid for the life of
 * the process or until cai_knob_set of the same knob. */
cai_status cai_knob_str(const char *name, const char **out);
/* A knob's current value as text and where it came from (for reports). */
cai_status cai_knob_value(const char *name, const char **text, cai_knob_source *source);
/* Overrides a knob for this process, validated like the environment
 * (value NULL: back to the environment or the default). Code that read the
 * knob before keeps what it read: set knobs before the work they tune. */
cai_status cai_knob_set(const char *name, const char *value);
/* Whether this build has its test-only hooks compiled in (configure
 * --enable-test-hooks): fault injection for the test suite. */
int cai_test_hooks_built(void);

/* ------------------------------------------------------------------ misc */

const char *cai_version_string(void);

#ifdef __cplusplus
}
#endif
#endif
