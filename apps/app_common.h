/* Start-up and failure handling shared by the colossal executables, so every
 * app's main stays a few lines: initialise MPI, parse the config table, set up
 * logging, and turn a failed status into one clear message plus a clean stop
 * of every rank. Apps may exit; the library never does, which is why this
 * lives in apps/ and not in libcolossal-core. */
#ifndef COLOSSAL_APP_COMMON_H
#define COLOSSAL_APP_COMMON_H

#include <stddef.h>

#include "colossal/base.h"
#include "colossal/config.h"
#include "colossal/model.h"

/* Keys every app shares. Embed one in the app's config struct and list
 * CAI_APP_COMMON_FIELDS(app_struct, member) in its field table. */
typedef struct {
    int log_level;     /* CAI_CFG_ENUM over cai_app_log_level_choices == cai_log_level */
    int log_all_ranks; /* every rank logs, not just rank 0 */
    int log_timestamps;
} cai_app_common;

extern const char *const cai_app_log_level_choices[];

#define CAI_APP_COMMON_FIELDS(type, member)                                            \
    {"log.level",                                                                      \
     CAI_CFG_ENUM,                                                                     \
     offsetof(type, member.log_level),                                                 \
     "info",                                                                           \
     "log verbosity: error, warn, info, debug or trace",                               \
     CAI_CFG_NO_RANGE,                                                                 \
     cai_app_log_level_choices,                                                        \
     NULL},                                                                            \
        {"log.all_ranks",                                                              \
         CAI_CFG_BOOL,                                                                 \
         offsetof(type, member.log_all_ranks),                                         \
         "false",                                                                      \
         "log from every rank instead of rank 0 only",                                 \
         CAI_CFG_NO_RANGE,                                                             \
         NULL,                                                                         \
         NULL},                                                                        \
    {                                                                                  \
        "log.timestamps", CAI_CFG_BOOL, offsetof(type, member.log_timestamps), "true", \
            "prefix log lines with the wall-clock time", CAI_CFG_NO_RANGE, NULL, NULL  \
    }

typedef struct {
    int rank, size;             /* in MPI_COMM_WORLD */
    int local_rank, local_size; /* within this node (MPI_COMM_TYPE_SHARED) */
    int n_nodes;
} cai_app;

/* Collective over MPI_COMM_WORLD. MPI_Init_thread(FUNNELED), log rank, then
 * cai_config_parse_args into `cfg` (which embeds a cai_app_common at
 * `common_offset`), then logging from the common keys. --help: rank 0 prints
 * the key table and every rank exits 0. A bad argument: rank 0 prints the
 * error and every rank exits 2 (the parse is deterministic, so all ranks fail
 * the same way; no MPI_Abort banner for a typo). Under Slurm, a world size
 * other than SLURM_NTASKS (srun with the wrong --mpi plugin starts N
 * one-rank worlds) is refused the same way before anything else. */
void cai_app_init(cai_app *app, int *argc, char ***argv, const cai_config_schema *schema, void *cfg,
                  size_t common_offset);

/* Exit status of a job stopped by a file-system error (CAI_ERR_IO: a full
 * disk or an I/O error writing a checkpoint, `latest`, metrics.jsonl,
 * config.yaml, an export; a file that cannot be read). The last complete
 * checkpoint and `latest` are left as they were (docs/run.md). */
#define CAI_APP_EXIT_IO 4

/* Not collective. On failure print this rank's error trace (its first line is
 * the root cause) and abort every rank through MPI_Abort, with status
 * CAI_APP_EXIT_IO for CAI_ERR_IO. For errors that only some ranks may see
 * (I/O, a collective's local failure). */
void cai_app_check(cai_status st);

/* Collective over MPI_COMM_WORLD: every rank must reach it. If any rank
 * failed, the lowest failing rank prints its error trace and every rank
 * finalises MPI and exits with `exit_code` (CAI_APP_EXIT_IO when that rank's
 * error is CAI_ERR_IO) — a clean stop for errors that are decided
 * identically everywhere (config, layout) or agreed on by the callee. */
void cai_app_check_all(cai_status st, int exit_code);

/* Collective over MPI_COMM_WORLD: free the config and finalise MPI. Returns 0
 * for main to return. */
int cai_app_finalize(const cai_config_schema *schema, void *cfg);

/* Programs with subcommands (colossal-ckpt, colossal-data): the index of
 * argv[1] in `table`, `count` entries `stride` bytes apart, each holding its
 * name and one-line summary as `const char *` at the given offsets. When
 * argv[1] names none, MPI is still started so that only rank 0 prints the
 * usage ("usage: PROGRAM SUBCOMMAND USAGE_ARGS" and the table; to stdout for
 * --help/-h), and the process exits: 0 for help, 2 otherwise. */
size_t cai_app_subcommand(int argc, char **argv, const char *program, const char *usage_args, const void *table,
                          size_t count, size_t stride, size_t name_offset, size_t summary_offset);

/* An app's model.path that names a trained model: a Hugging Face directory
 * (it has config.json) or a colossal checkpoint (a file, or a directory
 * whose `latest` names one) resolved to its file, and its model config as
 * config.json or the checkpoint records it. Not collective. */
typedef struct {
    int hf;
    char ckpt[4096];
    cai_model_config config;
} cai_app_model_source;
cai_status cai_app_model_source_open(const char *path, cai_app_model_source *out);
/* The tokenizer directory of a source into out: `given` when not empty, else
 * the Hugging Face directory `path`, else RUN_DIR/tokenizer beside
 * RUN_DIR/checkpoints/step-N.h5 (an error says where it looked). */
cai_status cai_app_model_tokenizer_dir(const cai_app_model_source *s, const char *path, const char *given, char *out,
                                       size_t cap);

#endif
