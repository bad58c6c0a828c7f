/* Inside the run module: the report state and the job object. */
#ifndef CAI_RUN_INTERNAL_H
#define CAI_RUN_INTERNAL_H

#include <stdarg.h>
#include <stdio.h>

#include "colossal/run.h"

typedef struct {
    FILE *metrics; /* rank 0: run.dir/metrics.jsonl */
    char metrics_path[4200];
    int metrics_errno;      /* the first failed write of a record (0: none) */
    double flops_per_token; /* 6 N + 12 L T d; a frozen model: 4 N + 6 N_adapters + 12 L T d */
    double peak_flops;      /* whole job, FLOP/s */
    int64_t matmul_params;  /* N */
    double t_start, t_last; /* wall clock of the report's start and of the last progress line */
    int64_t step_last;
    int64_t tokens_per_step;
    int rank;
    cai_mesh_t *mesh;  /* reductions over the world, watched by its watchdog */
    cai_device_t *dev; /* for the device-memory samples */
    double *step_s;    /* this run's step times, for the steady-state summary */
    int64_t n_steps, cap_steps;
    double dev_used_max; /* largest device memory in use seen (bytes; GPUs: whole device) */
    double dev_total;
} cai_run_report;

/* Collective over the mesh's world (the peak is summed over ranks). */
/* adapters < 0: the model trains; else it is frozen and that many adapter
 * parameters train. */
cai_status cai_run_report_init(cai_run_report *r, const char *dir, double peak_tflops, int64_t first_step,
                               cai_model_t *m, int64_t adapters, cai_device_t *dev, int seq_len, int rank,
                               cai_mesh_t *mesh);
void cai_run_report_free(cai_run_report *r);
void cai_run_report_json(cai_run_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cai_run_report_vjson(cai_run_report *r, const char *fmt, va_list ap);
/* CAI_ERR_IO naming metrics.jsonl once a record could not be written (a
 * full disk), else CAI_OK. Rank 0's alone: not collective. */
cai_status cai_run_report_status(const cai_run_report *r);
/* The step's record; every log_interval steps and at last_step the progress
 * line (collective over the world then: the peak RSS). */
cai_status cai_run_report_step(cai_run_report *r, int64_t step, int64_t last_step, int64_t log_interval,
                               const cai_step_stats *st, double step_seconds);
void cai_run_report_eval(cai_run_report *r, int64_t step, double loss);
/* Collective over the world (largest device memory). */
cai_status cai_run_report_summary(cai_run_report *r);
void cai_run_format_duration(double seconds, char *buf, size_t cap);

struct cai_run {
    cai_run_config cfg;
    MPI_Comm world;
    int rank, size, local_rank, local_size;
    cai_mesh_t *mesh;
    cai_device_t *dev;
    char ckpt_dir[4096];
    int64_t first_step;
    int64_t last_step;  /* the last step the loop finished */
    int64_t last_saved; /* step of the newest checkpoint (0: none) */
    int64_t tokens;     /* trained on so far, across resumes */
    cai_step_stats last;
    int stopped_by;   /* 0, a signal, CAI_RUN_STOP_AT */
    int checkpointed; /* the stop wrote a checkpoint */
    double t_train, seconds;
    int started;
    int64_t adapters; /* cai_run_set_adapters; -1: the model trains */
    cai_run_report report;
};

#endif
