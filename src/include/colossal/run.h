/* The job around an app's loop, the same for every app: the signals that
 * stop it (agreed across ranks, so every rank stops after the same step),
 * the device, the memory plan and its limit, the effective config, the
 * checkpoint cadence and resume, metrics.jsonl with the progress line, and
 * the exit status. An app supplies its keys' struct (CAI_RUN_FIELDS), its
 * step, evaluation and checkpoint contents as hooks, and reads as the flow
 * of its job. See docs/run.md. */
#ifndef COLOSSAL_RUN_H
#define COLOSSAL_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/ckpt.h"
#include "colossal/cluster.h"
#include "colossal/config.h"
#include "colossal/model.h"
#include "colossal/optim.h"
#include "colossal/parallel.h"
#include "colossal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit status of a run that a signal (SIGUSR1, SIGTERM) or train.stop_at
 * stopped after writing a checkpoint: resume it with --resume latest. */
#define CAI_RUN_EXIT_CHECKPOINTED 3
/* The "signal" of a train.stop_at stop. */
#define CAI_RUN_STOP_AT (-1)

/* ---------------------------------------------------------------- signals */

/* SIGINT, SIGTERM and SIGUSR1 only record that they arrived; the loop
 * stops at the next step boundary. A second SIGINT kills at once. Call it
 * first in main: a signal during start-up (data preparation can take
 * minutes) then waits for the first step boundary instead of killing the
 * rank. Not collective; installing twice is harmless. */
void cai_run_signals_install(void);
/* The signal this process received since the last reset (0: none). */
int cai_run_signal_pending(void);
/* Forget a received signal (tests; a job that handled one and goes on). */
void cai_run_signal_reset(void);
/* "SIGINT", "SIGTERM", "SIGUSR1", "train.stop_at", or "a signal". */
const char *cai_run_stop_name(int sig);
/* The signal any rank received (the largest number: SIGTERM over SIGUSR1
 * over SIGINT), the same on every rank. Collective over the mesh's world. */
cai_status cai_run_stop_agree(cai_mesh_t *mesh, int *sig);

/* ---------------------------------------------------------------- device and memory */

typedef enum { CAI_RUN_DEVICE_AUTO, CAI_RUN_DEVICE_CPU, CAI_RUN_DEVICE_CUDA } cai_run_device_kind;
extern const char *const cai_run_device_choices[]; /* "auto", "cpu", "cuda": index == cai_run_device_kind */

/* auto: the GPU of this node-local rank when the build and node have one,
 * else the host; cuda: that GPU or an error. Not collective. */
cai_status cai_run_open_device(cai_run_device_kind kind, int local_rank, int threads, cai_device_t **dev);
/* The per-rank byte limit of a CAI_CFG_BYTES train.mem_limit: auto on a
 * host device is its RAM divided by the ranks sharing the node; auto on a
 * GPU and 0 mean none (0). Pure. */
size_t cai_run_mem_limit(int64_t configured, const cai_device_t *dev, int ranks_on_node);

/* ---------------------------------------------------------------- keys every app shares */

typedef struct {
    char *dir;
    int device, threads;
    double peak_tflops;
    int64_t log_interval, stop_at, mem_limit;
    char *ckpt_dir, *resume;
    int64_t ckpt_every;
    int ckpt_keep;
} cai_run_options;

/* Embed a cai_run_options in the app's config struct and list
 * CAI_RUN_FIELDS(app_struct, member, "runs/app") in its field table. */
#define CAI_RUN_FIELDS(type, member, default_dir)                                                                         \
    {"run.dir",                                                                                                           \
     CAI_CFG_STRING,                                                                                                      \
     offsetof(type, member.dir),                                                                                          \
     default_dir,                                                                                                         \
     "run directory: config.yaml, metrics.jsonl, data/, tokenizer/",                                                      \
     CAI_CFG_NO_RANGE,                                                                                                    \
     NULL,                                                                                                                \
     NULL},                                                                                                               \
        {"run.device",                                                                                                    \
         CAI_CFG_ENUM,                                                                                                    \
         offsetof(type, member.device),                                                                                   \
         "auto",                                                                                                          \
         "auto (a GPU per rank when the build and node have them), cpu or cuda",                                          \
         CAI_CFG_NO_RANGE,                                                                                                \
         cai_run_device_choices,                                                                                          \
         NULL},                                                                                                           \
        {"run.threads",                                                                                                   \
         CAI_CFG_INT,                                                                                                     \
         offsetof(type, member.threads),                                                                                  \
         "0",                                                                                                             \
         "CPU threads per rank; 0: the OpenMP default",                                                                   \
         0,                                                                                                               \
         4096,                                                                                                            \
         NULL,                                                                                                            \
         NULL},                                                                                                           \
        {"run.peak_tflops",                                                                                               \
         CAI_CFG_DOUBLE,                                                                                                  \
         offsetof(type, member.peak_tflops),                                                                              \
         "0",                                                                                                             \
         "per-rank peak for MFU (e.g. 989 for H100/H200 bf16); 0: measure this device's matmul",                          \
         0,                                                                                                               \
         1e6,                                                                                                             \
         NULL,                                                                                                            \
         NULL},                                                                                                           \
        {"log.interval",                                                                                                  \
         CAI_CFG_INT64,                                                                                                   \
         offsetof(type, member.log_interval),                                                                             \
         "10",                                                                                                            \
         "steps between progress lines",                                                                                  \
         1,                                                                                                               \
         1e15,                                                                                                            \
         NULL,                                                                                                            \
         NULL},                                                                                                           \
        {"train.stop_at",                                                                                                 \
         CAI_CFG_INT64,                                                                                                   \
         offsetof(type, member.stop_at),                                                                                  \
         "0",                                                                                                             \
         "stop after this step as SIGUSR1 would (checkpoint, exit status 3); 0: run to train.steps",                      \
         0,                                                                                                               \
         1e15,                                                                                                            \
         NULL,                                                                                                            \
         NULL},                                                                                                           \
        {"train.mem_limit",                                                                                               \
         CAI_CFG_BYTES,                                                                                                   \
         offsetof(type, member.mem_limit),                                                                                \
         "auto",                                                                                                          \
         "refuse to start when the memory plan exceeds this per rank (e.g. 3GiB, 800M); auto: host RAM / ranks on the "   \
         "node (no limit on a GPU); 0: none",                                                                             \
         CAI_CFG_NO_RANGE,                                                                                                \
         cai_config_bytes_auto,                                                                                           \
         NULL},                                                                                                           \
        {"checkpoint.dir",                                                                                                \
         CAI_CFG_STRING,                                                                                                  \
         offsetof(type, member.ckpt_dir),                                                                                 \
         "",                                                                                                              \
         "checkpoint directory (step-N.h5 files and `latest`); empty: run.dir/checkpoints",                               \
         CAI_CFG_NO_RANGE,                                                                                                \
         NULL,                                                                                                            \
         NULL},                                                                                                           \
        {"checkpoint.every",                                                                                              \
         CAI_CFG_INT64,                                                                                                   \
         offsetof(type, member.ckpt_every),                                                                               \
         "0",                                                                                                             \
         "save every this many steps, at the end, and when SIGUSR1/SIGTERM stops the run; 0: no checkpoints",             \
         0,                                                                                                               \
         1e15,                                                                                                            \
         NULL,                                                                                                            \
         NULL},                                                                                                           \
        {"checkpoint.keep",                                                                                               \
         CAI_CFG_INT,                                                                                                     \
         offsetof(type, member.ckpt_keep),                                                                                \
         "3",                                                                                                             \
         "checkpoints kept in checkpoint.dir (the newest); 0: all",                                                       \
         0,                                                                                                               \
         1 << 20,                                                                                                         \
         NULL,                                                                                                            \
         NULL},                                                                                                           \
    {                                                                                                                     \
        "checkpoint.resume", CAI_CFG_STRING, offsetof(type, member.resume), "",                                           \
            "resume from: latest (checkpoint.dir's), auto (latest if there is one, else start), or a checkpoint file or " \
            "directory; empty: start from step 1",                                                                        \
            CAI_CFG_NO_RANGE, NULL, "resume"                                                                              \
    }

/* ---------------------------------------------------------------- the job */

typedef struct cai_run cai_run_t;

typedef struct {
    const char *program;             /* "colossal-pretrain": messages, checkpoint metadata */
    const cai_config_schema *schema; /* the app's table and struct: config.yaml and the checkpoints' copy */
    const void *app_cfg;
    const cai_run_options *opt; /* inside app_cfg */
    int64_t steps;              /* the job's last step */
    cai_mesh_config mesh;       /* layout and watchdog, validated by the app */
} cai_run_config;

/* What an app's job does, as hooks over its own state `ctx`. */
typedef struct {
    void *ctx;
    /* One optimizer step; `stats` receives its loss, gradient norm and LR.
     * Collective as the app's step is. */
    cai_status (*step)(void *ctx, cai_run_t *run, int64_t step, cai_step_stats *stats);
    /* The validation loss after `step` (*ran = 0 when there is nothing to
     * validate now). May be NULL. Collective. */
    cai_status (*evaluate)(void *ctx, cai_run_t *run, int64_t step, double *loss, int *ran);
    /* Write the checkpoint of the state after meta->step into `dir`
     * (cai_ckpt_save_step*), keeping `keep`: the run filled the step,
     * tokens, app, config text and last loss/LR of `meta`; the app adds its
     * own (optimizer step, data position, seeds, loss scale). Collective. */
    cai_status (*save)(void *ctx, cai_run_t *run, cai_ckpt_meta *meta, const char *dir, int keep, char *path,
                       size_t cap, cai_ckpt_stats *stats);
    /* Load `path` into the app's state and continue its data where the
     * checkpoint was; `meta` receives the stored metadata. Collective. */
    cai_status (*load)(void *ctx, cai_run_t *run, const char *path, cai_ckpt_meta *meta, cai_ckpt_stats *stats);
} cai_run_hooks;

/* Options that cannot work in this build (checkpoints without parallel
 * HDF5) and impossible values. Not collective; decided alike everywhere. */
cai_status cai_run_check(const cai_run_config *cfg);
/* Creates the mesh, opens this rank's device and writes run.dir/config.yaml
 * (rank 0). Checkpoint options in a build without parallel HDF5 are
 * refused (cai_run_check). Collective over `world`: the collective parts
 * (node split, mesh) come first, then only this rank's work (device, file),
 * so a failure never leaves a rank waiting for another here. */
cai_status cai_run_init(cai_run_t **out, const cai_run_config *cfg, MPI_Comm world);
void cai_run_free(cai_run_t *run);

cai_mesh_t *cai_run_mesh(const cai_run_t *run);
/* This rank's place as the parameter registry and the model see it: tp and
 * pp sizes and ranks from the mesh (ep 1). */
cai_rank_view cai_run_view(const cai_run_t *run);
cai_device_t *cai_run_device(const cai_run_t *run);
int cai_run_rank(const cai_run_t *run);
/* The step the loop starts from: 1, or the resumed checkpoint's step + 1. */
int64_t cai_run_first_step(const cai_run_t *run);
/* checkpoint.dir, or run.dir/checkpoints. */
const char *cai_run_ckpt_dir(const cai_run_t *run);

/* Print the memory plan (rank 0) and refuse it, saying what would fit, when
 * it exceeds train.mem_limit. Not collective; decided alike on every rank. */
cai_status cai_run_plan_memory(cai_run_t *run, const cai_mem_plan_request *req);
/* 1 when the plan of `req` fits train.mem_limit (no limit: always), 0 when
 * it does not or cannot be computed; prints nothing, leaves no error. For
 * an app choosing between placements before cai_run_plan_memory. */
int cai_run_plan_fits(cai_run_t *run, const cai_mem_plan_request *req);

/* checkpoint.resume: "" starts at step 1; latest / auto (latest if there
 * is one) / a file or directory go through hooks->load, then the tokens,
 * the last checkpoint's step and the first step continue from it.
 * Collective over the world (every rank reads the same `latest`). */
cai_status cai_run_resume(cai_run_t *run, const cai_run_hooks *hooks);

/* Opens metrics.jsonl (rank 0; appended to by a resumed run), derives the
 * FLOPs per token of `model` (6 N + 12 L T d) and the peak (run.peak_tflops
 * or a measured matmul, summed over ranks), and writes the "start" record.
 * Collective over the world. */
cai_status cai_run_start(cai_run_t *run, cai_model_t *model, int seq_len, int64_t tokens_per_step);
/* A run whose model is frozen and trains `trained` adapter parameters
 * (LoRA): its FLOPs per token count 4 N for the frozen matmuls (forward and
 * input gradients, no weight gradients) and 6 per adapter parameter. Before
 * cai_run_start. */
cai_status cai_run_set_adapters(cai_run_t *run, int64_t trained);
/* FLOPs per token, matmul parameters N (experts' at top_k / n_experts of
 * their size: the active ones), peak FLOP/s of the whole job. */
void cai_run_flops(const cai_run_t *run, double *flops_per_token, int64_t *matmul_params, double *peak_flops);

/* The loop from the first step to the last: each step, its metrics record
 * (and every log.interval steps the progress line), evaluation every
 * `eval_interval` steps and at the end (0: never), the agreed stop, the
 * checkpoint cadence; then a checkpoint of where the run ended (unless
 * SIGINT stopped it or the last step wrote one). Collective. */
cai_status cai_run_train(cai_run_t *run, const cai_run_hooks *hooks, int64_t eval_interval);
/* What stopped the loop early (0: it ran to the end; CAI_RUN_STOP_AT or a
 * signal number). */
int cai_run_stopped_by(const cai_run_t *run);
/* The steady-state summary and the "stopped by" / "done" line with their
 * records. Collective over the world. */
cai_status cai_run_finish(cai_run_t *run);
/* 0, or CAI_RUN_EXIT_CHECKPOINTED for a stop that wrote a checkpoint. */
int cai_run_exit_code(const cai_run_t *run);

/* A record (the JSON members between the braces) as one line of
 * metrics.jsonl, flushed. Rank 0 only; a no-op elsewhere. */
void cai_run_json(cai_run_t *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
