/* The job every app runs: mesh and device, memory plan, effective config,
 * resume, the step loop with its agreed stop and checkpoint cadence, and
 * the closing records. */
#include "cai_config.h"

#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run_internal.h"

const char *const cai_run_device_choices[] = {"auto", "cpu", "cuda", NULL};

cai_status cai_run_open_device(cai_run_device_kind kind, int local_rank, int threads, cai_device_t **dev) {
    CAI_CHECK_ARG(dev, "cai_run_open_device: NULL output");
    if (kind != CAI_RUN_DEVICE_CPU) {
        cai_status st = cai_device_init(dev, CAI_DEVICE_CUDA, local_rank, threads);
        if (st == CAI_OK || kind == CAI_RUN_DEVICE_CUDA) return st;
        CAI_DEBUG("run.device=auto: no GPU (%s); using the host", cai_error_message());
        cai_error_clear();
    }
    return cai_device_init(dev, CAI_DEVICE_HOST, 0, threads);
}

size_t cai_run_mem_limit(int64_t configured, const cai_device_t *dev, int ranks_on_node) {
    if (configured >= 0) return (size_t)configured;
    if (configured != CAI_CFG_BYTES_AUTO || !dev || dev->kind != CAI_DEVICE_HOST) return 0;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 0;
    return (size_t)pages * (size_t)page / (size_t)(ranks_on_node > 0 ? ranks_on_node : 1);
}

/* ---------------------------------------------------------------- the job */

cai_status cai_run_check(const cai_run_config *cfg) {
    CAI_CHECK_ARG(cfg && cfg->opt && cfg->program && cfg->schema && cfg->app_cfg,
                  "cai_run_check: NULL config, options, program or schema");
    const cai_run_options *o = cfg->opt;
    if ((o->ckpt_every > 0 || *o->resume) && !cai_ckpt_available())
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "checkpoint.every=%lld / checkpoint.resume='%s': this build has no parallel HDF5, so no "
                         "checkpoints (install libhdf5-openmpi-dev and re-run configure)",
                         (long long)o->ckpt_every, o->resume);
    CAI_CHECK_ARG(cfg->steps >= 1, "%s: train.steps=%lld must be at least 1", cfg->program, (long long)cfg->steps);
    return CAI_OK;
}

cai_status cai_run_init(cai_run_t **out, const cai_run_config *cfg, MPI_Comm world) {
    CAI_CHECK_ARG(out, "cai_run_init: NULL output");
    *out = NULL;
    CAI_CALL(cai_run_check(cfg));
    cai_run_t *r = NULL;
    CAI_CALL(cai_calloc((void **)&r, 1, sizeof *r, "run"));
    r->cfg = *cfg;
    r->world = world;
    r->first_step = 1;
    r->adapters = -1;
    cai_status st = CAI_OK;
    /* Rank, size and the node-local rank never fail on a valid communicator. */
    MPI_Comm_rank(world, &r->rank);
    MPI_Comm_size(world, &r->size);
    MPI_Comm node;
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &r->local_rank);
    MPI_Comm_size(node, &r->local_size);
    MPI_Comm_free(&node);
    CAI_CALL_GOTO(cai_mesh_init(&r->mesh, world, &cfg->mesh), st, fail);
    const cai_run_options *o = cfg->opt;
    CAI_CALL_GOTO(cai_run_open_device((cai_run_device_kind)o->device, r->local_rank, o->threads, &r->dev), st, fail);
    snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s%s", *o->ckpt_dir ? o->ckpt_dir : o->dir,
             *o->ckpt_dir ? "" : "/checkpoints");
    /* Agreed: the failure path frees the mesh, which is collective (a full
     * run dir must not leave rank 0 there and the others in the caller). */
    st = r->rank == 0 ? cai_config_write_file(cfg->schema, cfg->app_cfg, o->dir) : CAI_OK;
    int ok = st == CAI_OK;
    if (MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world) != MPI_SUCCESS && st == CAI_OK)
        st = CAI_ERROR(CAI_ERR_MPI, "agreeing on the write of %s/config.yaml failed", o->dir);
    if (!ok && st == CAI_OK) st = CAI_ERROR(CAI_ERR_IO, "rank 0 could not write %s/config.yaml", o->dir);
    if (st != CAI_OK) goto fail;
    /* The run directory exists now; shared across nodes, it carries the
     * guard's heartbeats from node to node. */
    CAI_CALL_GOTO(cai_mesh_guard_dir(r->mesh, o->dir), st, fail);
    *out = r;
    return CAI_OK;
fail:
    cai_run_free(r);
    return st;
}

void cai_run_free(cai_run_t *r) {
    if (!r) return;
    cai_run_report_free(&r->report);
    cai_device_free(r->dev);
    cai_mesh_free(r->mesh);
    cai_free(r);
}

cai_mesh_t *cai_run_mesh(const cai_run_t *r) { return r->mesh; }
cai_device_t *cai_run_device(const cai_run_t *r) { return r->dev; }

cai_rank_view cai_run_view(const cai_run_t *r) {
    cai_rank_view v = cai_rank_view_single();
    v.tp_size = cai_mesh_size(r->mesh, CAI_AXIS_TP);
    v.tp_rank = cai_mesh_rank(r->mesh, CAI_AXIS_TP);
    v.pp_size = cai_mesh_size(r->mesh, CAI_AXIS_PP);
    v.pp_rank = cai_mesh_rank(r->mesh, CAI_AXIS_PP);
    return v;
}
int cai_run_rank(const cai_run_t *r) { return r->rank; }
int64_t cai_run_first_step(const cai_run_t *r) { return r->first_step; }
const char *cai_run_ckpt_dir(const cai_run_t *r) { return r->ckpt_dir; }
int cai_run_stopped_by(const cai_run_t *r) { return r->stopped_by; }
int cai_run_exit_code(const cai_run_t *r) { return r->checkpointed ? CAI_RUN_EXIT_CHECKPOINTED : 0; }

cai_status cai_run_plan_memory(cai_run_t *r, const cai_mem_plan_request *req) {
    CAI_CHECK_ARG(r && req, "cai_run_plan_memory: NULL run or request");
    cai_mem_plan p;
    CAI_CALL(cai_mem_plan_compute(req, &p));
    size_t limit = cai_run_mem_limit(r->cfg.opt->mem_limit, r->dev, r->local_size);
    if (r->rank == 0) {
        cai_mem_plan_print(&p, stdout);
        char text[64];
        if (limit)
            printf("  limit                        %10.2f MiB  (train.mem_limit=%s)\n", limit / 1048576.0,
                   r->cfg.opt->mem_limit < 0 ? "auto"
                                             : cai_config_format_bytes(r->cfg.opt->mem_limit, text, sizeof text));
        fflush(stdout);
    }
    CAI_CALL(cai_mem_plan_check(req, &p, limit, 0));
    return CAI_OK;
}

int cai_run_plan_fits(cai_run_t *r, const cai_mem_plan_request *req) {
    cai_mem_plan p;
    if (!r || !req || cai_mem_plan_compute(req, &p) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    const size_t limit = cai_run_mem_limit(r->cfg.opt->mem_limit, r->dev, r->local_size);
    if (cai_mem_plan_check(req, &p, limit, 0) == CAI_OK) return 1;
    cai_error_clear();
    return 0;
}

/* ---------------------------------------------------------------- checkpoints */

/* The state after `step`: the run's part of the metadata, the app's hook
 * for the rest and the writing. Collective over the world. */
static cai_status save_checkpoint(cai_run_t *r, const cai_run_hooks *h, int64_t step) {
    CAI_CHECK_ARG(h->save, "%s: checkpoint.every=%lld but the app has no checkpoint hook", r->cfg.program,
                  (long long)r->cfg.opt->ckpt_every);
    cai_ckpt_meta m = cai_ckpt_meta_init();
    m.step = step;
    m.tokens = r->tokens;
    m.rng_offset = (uint64_t)step;
    m.last_lr = r->last.lr;
    m.last_loss = r->last.loss;
    snprintf(m.app, sizeof m.app, "%s", r->cfg.program);
    char *text = NULL;
    CAI_CALL(cai_config_write_string(r->cfg.schema, r->cfg.app_cfg, &text));
    m.config_text = text;
    char path[4096] = "";
    cai_ckpt_stats st;
    memset(&st, 0, sizeof st);
    char what[96];
    snprintf(what, sizeof what, "the checkpoint write of step %lld", (long long)step);
    cai_timer_begin("run: checkpoint");
    cai_mesh_guard_begin(r->mesh, what);
    cai_status s = h->save(h->ctx, r, &m, r->ckpt_dir, r->cfg.opt->ckpt_keep, path, sizeof path, &st);
    cai_mesh_guard_end(r->mesh);
    cai_timer_end("run: checkpoint");
    free(text);
    CAI_CALL(s);
    r->last_saved = step;
    /* The save is not training time: keep it out of the next tokens/s. */
    r->report.t_last += st.seconds;
    if (r->rank == 0) {
        printf("checkpoint at step %lld: %s (%.1f MB in %.2f s, %.2f GB/s)\n", (long long)step, path,
               (double)st.bytes / 1e6, st.seconds, st.seconds > 0 ? (double)st.bytes / st.seconds / 1e9 : 0.0);
        fflush(stdout);
        cai_run_report_json(&r->report,
                            "\"kind\":\"checkpoint\",\"step\":%lld,\"path\":\"%s\",\"bytes\":%llu,\"seconds\":%.3f",
                            (long long)step, path, (unsigned long long)st.bytes, st.seconds);
    }
    return CAI_OK;
}

/* hooks->load, its outcome agreed over the world: a file one rank cannot
 * read is unreadable for the job. Collective over the world. */
static cai_status load_agreed(cai_run_t *r, const cai_run_hooks *h, const char *path, cai_ckpt_meta *m,
                              cai_ckpt_stats *st) {
    cai_ckpt_meta_free(m);
    *m = cai_ckpt_meta_init();
    memset(st, 0, sizeof *st);
    cai_mesh_guard_begin(r->mesh, "the checkpoint read");
    cai_status s = h->load(h->ctx, r, path, m, st);
    cai_mesh_guard_end(r->mesh);
    int32_t bad = s != CAI_OK;
    CAI_CALL(cai_allreduce(r->mesh, CAI_AXIS_WORLD, &bad, &bad, 1, CAI_DTYPE_I32, CAI_RED_MAX));
    if (bad && s == CAI_OK) s = CAI_ERROR(CAI_ERR_IO, "%s: another rank could not load this checkpoint", path);
    return s;
}

/* latest / auto: the file `latest` names. Step files without a `latest` are
 * refused: starting from step 1 would overwrite them. */
static cai_status find_latest(cai_run_t *r, const char *resume, char *path, size_t cap, int *found) {
    CAI_CALL(cai_ckpt_latest(r->ckpt_dir, path, cap, found));
    if (*found) return CAI_OK;
    int64_t *steps = NULL;
    size_t n = 0;
    CAI_CALL(cai_ckpt_list_steps(r->ckpt_dir, &steps, &n));
    int64_t newest = n ? steps[0] : -1;
    free(steps);
    if (n) {
        char p[4096];
        CAI_CALL(cai_ckpt_step_path(r->ckpt_dir, newest, p, sizeof p));
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "checkpoint.resume=%s: %s holds %zu step file%s (the newest %s) but no "
                         "'latest'; starting from step 1 would overwrite them: resume one with "
                         "checkpoint.resume=FILE, or move them away",
                         resume, r->ckpt_dir, n, n == 1 ? "" : "s", p);
    }
    return CAI_OK;
}

cai_status cai_run_resume(cai_run_t *r, const cai_run_hooks *h) {
    CAI_CHECK_ARG(r && h, "cai_run_resume: NULL run or hooks");
    const char *resume = r->cfg.opt->resume;
    r->first_step = 1;
    if (!*resume) return CAI_OK;
    CAI_CHECK_ARG(h->load, "%s: checkpoint.resume='%s' but the app has no checkpoint hook", r->cfg.program, resume);
    char path[4096];
    const int is_auto = strcmp(resume, "auto") == 0, newest = is_auto || strcmp(resume, "latest") == 0;
    if (newest) {
        int found = 0;
        CAI_CALL(find_latest(r, resume, path, sizeof path, &found));
        if (!found && is_auto) {
            CAI_INFO("checkpoint.resume=auto: no checkpoint in %s yet; starting from step 1", r->ckpt_dir);
            return CAI_OK;
        }
        if (!found)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "checkpoint.resume=latest: %s holds no checkpoint (no 'latest' file); "
                             "resume=auto starts from step 1 when there is none",
                             r->ckpt_dir);
    } else {
        CAI_CALL(cai_ckpt_resolve(resume, path, sizeof path));
    }
    cai_ckpt_meta m = cai_ckpt_meta_init();
    cai_ckpt_stats st;
    cai_status s = load_agreed(r, h, path, &m, &st);
    if (s != CAI_OK && newest && (s == CAI_ERR_FORMAT || s == CAI_ERR_IO)) {
        /* A damaged newest file (a save cut short by a full disk or a
         * crash of the storage): the newest older one that loads. */
        int64_t *steps = NULL;
        size_t n = 0, i = 0;
        char older[4096] = "";
        if (cai_ckpt_list_steps(r->ckpt_dir, &steps, &n) == CAI_OK)
            while (i < n && (cai_ckpt_step_path(r->ckpt_dir, steps[i], older, sizeof older) != CAI_OK ||
                             strcmp(older, path) != 0))
                i++;
        for (i++; s != CAI_OK && i < n; i++) {
            if (cai_ckpt_step_path(r->ckpt_dir, steps[i], older, sizeof older) != CAI_OK) break;
            CAI_WARN("checkpoint.resume=%s: %s does not load (%s); trying the older %s", resume, path,
                     cai_error_message(), older);
            cai_error_clear();
            s = load_agreed(r, h, older, &m, &st);
            snprintf(path, sizeof path, "%s", older);
        }
        free(steps);
    }
    if (s == CAI_OK) {
        r->tokens = m.tokens;
        /* A state resumed from elsewhere (another run, another layout) is
         * not in this run's checkpoint directory until the run saves it: at
         * its end at the latest, even with no step left to take (resuming
         * is how a checkpoint moves to another layout). Rank 0 looks; every
         * rank takes its answer, as the save is collective. */
        char own[4096];
        int here = cai_ckpt_step_path(r->ckpt_dir, m.step, own, sizeof own) == CAI_OK && access(own, F_OK) == 0;
        CAI_CALL(cai_broadcast(r->mesh, CAI_AXIS_WORLD, &here, 1, CAI_DTYPE_I32, 0));
        r->last_saved = here ? m.step : m.step - 1;
        r->first_step = m.step + 1;
        char was[128];
        cai_layout_str(&m.layout, was, sizeof was);
        CAI_INFO(
            "resumed from %s: step %lld, %.2fM tokens, %lld samples consumed; saved on %d rank%s (%s) (%.1f MB "
            "in %.2f s)",
            path, (long long)m.step, (double)m.tokens / 1e6, (long long)m.consumed_samples, m.world_size,
            m.world_size == 1 ? "" : "s", was, (double)st.bytes / 1e6, st.seconds);
    }
    cai_ckpt_meta_free(&m);
    return s;
}

/* ---------------------------------------------------------------- the loop */

cai_status cai_run_start(cai_run_t *r, cai_model_t *model, int seq_len, int64_t tokens_per_step) {
    CAI_CHECK_ARG(r && model && seq_len > 0 && tokens_per_step > 0, "cai_run_start: NULL run or model, or no tokens");
    const cai_run_options *o = r->cfg.opt;
    CAI_CALL(cai_run_report_init(&r->report, o->dir, o->peak_tflops, r->first_step, model, r->adapters, r->dev, seq_len,
                                 r->rank, r->mesh));
    r->report.tokens_per_step = tokens_per_step;
    r->started = 1;
    cai_run_json(r,
                 "\"kind\":\"start\",\"ranks\":%d,\"dp\":%d,\"params\":%llu,\"matmul_params\":%lld,"
                 "\"flops_per_token\":%.6g,\"peak_flops\":%.6g,\"tokens_per_step\":%lld,\"steps\":%lld",
                 r->size, cai_mesh_size(r->mesh, CAI_AXIS_DP),
                 (unsigned long long)cai_registry_global_numel(cai_model_registry(model)),
                 (long long)r->report.matmul_params, r->report.flops_per_token, r->report.peak_flops,
                 (long long)tokens_per_step, (long long)r->cfg.steps);
    return CAI_OK;
}

cai_status cai_run_set_adapters(cai_run_t *r, int64_t trained) {
    CAI_CHECK_ARG(r && trained >= 0 && !r->started,
                  "cai_run_set_adapters: NULL run, negative count, or the run has started");
    r->adapters = trained;
    return CAI_OK;
}

void cai_run_flops(const cai_run_t *r, double *flops_per_token, int64_t *matmul_params, double *peak_flops) {
    if (flops_per_token) *flops_per_token = r->report.flops_per_token;
    if (matmul_params) *matmul_params = r->report.matmul_params;
    if (peak_flops) *peak_flops = r->report.peak_flops;
}

cai_status cai_run_train(cai_run_t *r, const cai_run_hooks *h, int64_t eval_interval) {
    CAI_CHECK_ARG(r && h && h->step, "cai_run_train: NULL run, hooks or step hook");
    CAI_CHECK_ARG(r->started, "cai_run_train: cai_run_start has not run");
    const cai_run_options *o = r->cfg.opt;
    const int64_t steps = r->cfg.steps;
    double t0 = cai_time_now();
    int sig = 0;
    r->last_step = r->first_step - 1;
    for (int64_t step = r->first_step; step <= steps; step++) {
        double ts = cai_time_now();
        cai_step_stats st;
        memset(&st, 0, sizeof st);
        CAI_CALL(h->step(h->ctx, r, step, &st));
        CAI_CALL(cai_run_report_step(&r->report, step, steps, o->log_interval, &st, cai_time_now() - ts));
        r->last_step = step;
        r->tokens += r->report.tokens_per_step;
        r->last = st;
        if (h->evaluate && eval_interval > 0 && (step % eval_interval == 0 || step == steps)) {
            double loss = 0;
            int ran = 0;
            CAI_CALL(h->evaluate(h->ctx, r, step, &loss, &ran));
            if (ran) cai_run_report_eval(&r->report, step, loss);
            /* An eval record that could not be written stops the job before
             * this step's checkpoint: a resume continues after the saved
             * step, so the record would be missing for good. Rank 0: the
             * caller aborts the job (cai_app_check). */
            CAI_CALL(cai_run_report_status(&r->report));
        }
        CAI_CALL(cai_run_stop_agree(r->mesh, &sig));
        if (!sig && o->stop_at > 0 && step >= o->stop_at && step < steps) sig = CAI_RUN_STOP_AT;
        if (o->ckpt_every > 0 && step % o->ckpt_every == 0) CAI_CALL(save_checkpoint(r, h, step));
        if (sig) break;
    }
    /* A checkpoint of where the run ended, unless the last step wrote one.
     * SIGINT is an interactive stop: no checkpoint. */
    const int ckpt_stop = sig == SIGUSR1 || sig == SIGTERM || sig == CAI_RUN_STOP_AT;
    if (o->ckpt_every > 0 && (ckpt_stop || !sig) && r->last_step > r->last_saved)
        CAI_CALL(save_checkpoint(r, h, r->last_step));
    r->stopped_by = sig;
    r->checkpointed = o->ckpt_every > 0 && ckpt_stop;
    r->seconds = cai_time_now() - t0;
    return CAI_OK;
}

cai_status cai_run_finish(cai_run_t *r) {
    CAI_CHECK_ARG(r && r->started, "cai_run_finish: the run has not started");
    CAI_CALL(cai_run_report_summary(&r->report));
    if (r->rank != 0) return CAI_OK;
    const int64_t done = r->last_step - r->first_step + 1;
    const double tokens = (double)done * (double)r->report.tokens_per_step, s = r->seconds;
    if (r->stopped_by)
        printf(
            "stopped by %s after step %lld of %lld (all ranks at the same step boundary); %.2fM tokens in %.1f "
            "s%s\n",
            cai_run_stop_name(r->stopped_by), (long long)r->last_step, (long long)r->cfg.steps, tokens / 1e6, s,
            r->checkpointed ? "; checkpoint written, continue with --resume latest" : "");
    else
        printf("done: %lld steps, %.2fM tokens in %.1f s (%.0f tokens/s)\n", (long long)done, tokens / 1e6, s,
               s > 0 ? tokens / s : 0.0);
    cai_run_json(r, "\"kind\":\"end\",\"status\":\"%s\",\"signal\":%d,\"step\":%lld,\"seconds\":%.3f",
                 r->stopped_by ? "stopped" : "done", r->stopped_by, (long long)r->last_step, s);
    fflush(stdout);
    return CAI_OK;
}

void cai_run_json(cai_run_t *r, const char *fmt, ...) {
    if (!r) return;
    va_list ap;
    va_start(ap, fmt);
    cai_run_report_vjson(&r->report, fmt, ap);
    va_end(ap);
}
