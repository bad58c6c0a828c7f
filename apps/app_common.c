/* Shared start-up and failure handling for the colossal executables. */
#include "cai_config.h"

#include "app_common.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "colossal/ckpt.h"

/* Same order as cai_log_level so the enum index is the level. */
const char *const cai_app_log_level_choices[] = {"error", "warn", "info", "debug", "trace", NULL};

/* The parsed config, so every exit path releases its strings (LeakSanitizer
 * runs at exit under --enable-sanitizers). */
static const cai_config_schema *g_schema;
static void *g_cfg;

static void finalize_and_exit(int code) {
    if (g_schema) cai_config_free(g_schema, g_cfg);
    fflush(stdout);
    fflush(stderr);
    MPI_Finalize();
    exit(code);
}

void cai_app_check(cai_status st) {
    if (st == CAI_OK) return;
    fflush(stdout);
    if (st == CAI_ERR_IO) {
        cai_error_print(stderr);
        MPI_Abort(MPI_COMM_WORLD, CAI_APP_EXIT_IO);
    }
    cai_abort(st); /* prints this rank's trace, then MPI_Abort */
}

void cai_app_check_all(cai_status st, int exit_code) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int mine = st == CAI_OK ? size : rank, first = size;
    /* If the reduction itself fails, MPI's default handler aborts the job. */
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == size) return;
    if (rank == first) {
        fflush(stdout);
        cai_error_print(stderr);
    }
    /* A file-system failure has its own status, whatever the caller chose. */
    int code = (int)st;
    MPI_Bcast(&code, 1, MPI_INT, first, MPI_COMM_WORLD);
    finalize_and_exit(code == CAI_ERR_IO ? CAI_APP_EXIT_IO : exit_code);
}

static void count_nodes(cai_app *app) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, app->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &app->local_rank);
    MPI_Comm_size(node, &app->local_size);
    MPI_Comm_free(&node);
    int leader = app->local_rank == 0;
    MPI_Allreduce(&leader, &app->n_nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
}

/* srun with an MPI plugin this MPI does not speak starts every task as a
 * world of its own: N copies of the job, each training alone on the same
 * files. Slurm says how many tasks the step has (SLURM_NTASKS, the same in
 * every task); a world smaller than that means the tasks did not find each
 * other. A larger world is legitimate: mpirun inside an allocation starts
 * its daemons with one srun task per node, and the ranks inherit that
 * step's SLURM_NTASKS (the node count). Every task decides alike, so no
 * collective is needed; of N one-rank worlds only Slurm's task 0 prints. */
static void check_slurm_size(const cai_app *app, const char *program) {
    const char *nt = getenv("SLURM_NTASKS");
    if (!nt || !*nt) return;
    char *end = NULL;
    long n = strtol(nt, &end, 10);
    if (*end || n <= 0 || n <= app->size) return;
    const char *procid = getenv("SLURM_PROCID");
    if (app->rank == 0 && (app->size > 1 || !procid || strcmp(procid, "0") == 0)) {
        (void)CAI_ERROR(CAI_ERR_CONFIG,
                        "%s: SLURM_NTASKS=%ld but MPI started %d rank%s in this world: the tasks did "
                        "not find each other (srun needs the MPI plugin this MPI was built with, e.g. srun "
                        "--mpi=pmix; another plugin starts every task alone). Inside an allocation mpirun -np "
                        "$SLURM_NTASKS works too; unset SLURM_NTASKS to run another rank count on purpose",
                        program, n, app->size, app->size == 1 ? "" : "s");
        cai_error_print(stderr);
    }
    finalize_and_exit(2);
}

/* The 1-based number and the text of the first line where a and b differ. */
static int first_difference(const char *a, const char *b, char *la, char *lb, size_t cap) {
    int line = 1;
    const char *sa = a, *sb = b;
    while (*a && *a == *b) {
        if (*a == '\n') {
            line++;
            sa = a + 1;
            sb = b + 1;
        }
        a++;
        b++;
    }
    snprintf(la, cap, "%.*s", (int)strcspn(sa, "\n"), sa);
    snprintf(lb, cap, "%.*s", (int)strcspn(sb, "\n"), sb);
    return line;
}

/* Ranks started with different arguments or files would pair different
 * collectives later and fail far away (MPI_ERR_TRUNCATE, a hang): every
 * rank's effective config is compared with rank 0's first. Collective over
 * MPI_COMM_WORLD. */
static void check_same_config(const cai_app *app, const cai_config_schema *schema, const void *cfg) {
    if (app->size == 1) return;
    char *text = NULL;
    cai_app_check_all(cai_config_write_string(schema, cfg, &text), 2);
    int len = (int)strlen(text);
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    char *ref = app->rank == 0 ? text : malloc((size_t)len + 1);
    if (!ref) cai_app_check(CAI_ERROR(CAI_ERR_NOMEM, "rank 0's config text (%d bytes)", len));
    MPI_Bcast(ref, len, MPI_CHAR, 0, MPI_COMM_WORLD);
    ref[len] = '\0';
    cai_status st = CAI_OK;
    if (strcmp(ref, text) != 0) {
        char mine[160], theirs[160];
        int line = first_difference(text, ref, mine, theirs, sizeof mine);
        st = CAI_ERROR(CAI_ERR_CONFIG,
                       "%s: rank %d's effective config differs from rank 0's (every rank must be "
                       "started with the same arguments and files): line %d is \"%s\" here and \"%s\" on rank 0",
                       schema->program, app->rank, line, mine, theirs);
    }
    if (ref != text) free(ref);
    free(text);
    cai_app_check_all(st, 2);
}

void cai_app_init(cai_app *app, int *argc, char ***argv, const cai_config_schema *schema, void *cfg,
                  size_t common_offset) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "%s: MPI_Init_thread failed\n", schema->program);
        exit(1);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &app->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &app->size);
    cai_log_set_rank(app->rank, app->size);
    count_nodes(app);
    check_slurm_size(app, schema->program);

    g_schema = schema;
    g_cfg = cfg;
    int help = 0;
    cai_status st = cai_config_parse_args(schema, cfg, *argc, *argv, &help);
    cai_app_check_all(st, 2);
    if (help) {
        if (app->rank == 0) cai_config_print_help(schema, stdout);
        finalize_and_exit(0);
    }
    check_same_config(app, schema, cfg);

    const cai_app_common *common = (const cai_app_common *)((const char *)cfg + common_offset);
    cai_log_options opt = {
        .level = (cai_log_level)common->log_level,
        .rank_filter = common->log_all_ranks ? CAI_LOG_ALL_RANKS : 0,
        .timestamps = common->log_timestamps,
        .out = stderr,
    };
    cai_log_configure(&opt);
    /* A FUNNELED request that came back weaker only matters to apps that
     * start threads; say so once instead of failing. */
    if (provided < MPI_THREAD_FUNNELED)
        CAI_WARN("MPI provides thread level %d, below MPI_THREAD_FUNNELED; OpenMP regions must not call MPI", provided);
}

int cai_app_finalize(const cai_config_schema *schema, void *cfg) {
    cai_config_free(schema, cfg);
    g_schema = NULL;
    fflush(stdout);
    MPI_Finalize();
    return 0;
}

static const char *table_string(const void *table, size_t i, size_t stride, size_t offset) {
    const char *p;
    memcpy(&p, (const char *)table + i * stride + offset, sizeof p);
    return p;
}

size_t cai_app_subcommand(int argc, char **argv, const char *program, const char *usage_args, const void *table,
                          size_t count, size_t stride, size_t name_offset, size_t summary_offset) {
    for (size_t i = 0; argc > 1 && i < count; i++)
        if (!strcmp(argv[1], table_string(table, i, stride, name_offset))) return i;
    /* Still an MPI program: under mpiexec only rank 0 should talk. */
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const int help = argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    if (rank == 0) {
        FILE *out = help ? stdout : stderr;
        if (argc > 1 && !help) fprintf(stderr, "%s: unknown subcommand \"%s\"\n", program, argv[1]);
        int width = 0;
        for (size_t i = 0; i < count; i++) {
            int len = (int)strlen(table_string(table, i, stride, name_offset));
            if (len > width) width = len;
        }
        fprintf(out, "usage: %s SUBCOMMAND %s   (%s SUBCOMMAND --help)\n", program, usage_args, program);
        for (size_t i = 0; i < count; i++)
            fprintf(out, "  %-*s  %s\n", width, table_string(table, i, stride, name_offset),
                    table_string(table, i, stride, summary_offset));
    }
    finalize_and_exit(help ? 0 : 2);
    return count; /* not reached */
}

/* ------------------------------------------------------------------ a trained model's source */

static int is_dir(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

static int has_file(const char *dir, const char *name) {
    char p[4096];
    return snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p && access(p, R_OK) == 0;
}

cai_status cai_app_model_source_open(const char *path, cai_app_model_source *out) {
    memset(out, 0, sizeof *out);
    if (!*path) return CAI_ERROR(CAI_ERR_CONFIG, "model.path is required (a Hugging Face directory or a checkpoint)");
    out->hf = is_dir(path) && has_file(path, "config.json");
    if (out->hf) {
        char p[4096];
        if (snprintf(p, sizeof p, "%s/config.json", path) >= (int)sizeof p)
            return CAI_ERROR(CAI_ERR_CONFIG, "model.path=%s is too long", path);
        return cai_hf_config_load(p, &out->config);
    }
    if (access(path, R_OK) != 0) return CAI_ERROR(CAI_ERR_CONFIG, "model.path=%s: no such file or directory", path);
    CAI_CALL(cai_ckpt_resolve(path, out->ckpt, sizeof out->ckpt));
    cai_ckpt_file_t *f = NULL;
    CAI_CALL(cai_ckpt_open(&f, MPI_COMM_SELF, out->ckpt));
    const cai_ckpt_meta *m = cai_ckpt_file_meta(f);
    cai_status st =
        m->has_model ? CAI_OK : CAI_ERROR(CAI_ERR_FORMAT, "%s: the checkpoint records no model config", out->ckpt);
    if (st == CAI_OK) out->config = m->model;
    cai_ckpt_close(f);
    return st;
}

cai_status cai_app_model_tokenizer_dir(const cai_app_model_source *s, const char *path, const char *given, char *out,
                                       size_t cap) {
    if (*given) {
        snprintf(out, cap, "%s", given);
        return CAI_OK;
    }
    if (s->hf) {
        snprintf(out, cap, "%s", path);
        return CAI_OK;
    }
    /* RUN_DIR/checkpoints/step-N.h5 -> RUN_DIR/tokenizer */
    char tmp[2048];
    if (snprintf(tmp, sizeof tmp, "%s", s->ckpt) >= (int)sizeof tmp)
        return CAI_ERROR(CAI_ERR_CONFIG, "model.path: %s is too long", s->ckpt);
    char *slash = strrchr(tmp, '/');
    if (slash) *slash = 0;
    else snprintf(tmp, sizeof tmp, ".");
    snprintf(out, cap, "%s/../tokenizer", tmp);
    if (!is_dir(out))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "model.tokenizer: %s has no tokenizer beside it (looked for %s); set model.tokenizer to "
                         "a tokenizer directory, or to `bytes` for a byte-level model",
                         s->ckpt, out);
    return CAI_OK;
}
