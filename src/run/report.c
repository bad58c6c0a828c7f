/* metrics.jsonl, the progress line, model FLOPs and MFU, memory. */
#include "cai_config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "run_internal.h"

/* N of the 6·N rule: every parameter that takes part in a token's
 * matmuls. The token and position tables are lookups, not matmuls; the LM
 * head is one (V_padded x d) even when tied to the token table; an expert's
 * weights count top_k / n_experts of their size, as each token passes
 * through top_k of the experts (the active parameters). */
static int64_t matmul_params(const cai_registry_t *reg, int top_k) {
    int64_t n = 0;
    int np = cai_registry_count(reg), head = 0;
    for (int i = 0; i < np; i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        if (!strcmp(p->name, "lm_head.weight")) head = 1;
        if (!strcmp(p->name, "wte.weight") || !strcmp(p->name, "wpe.weight")) continue;
        if (p->spec.expert >= 0 && p->spec.n_experts > 0)
            n += (int64_t)((double)p->numel * top_k / p->spec.n_experts);
        else n += (int64_t)p->numel;
    }
    if (!head) { /* a family without a registered head: it reads the token table */
        int w = cai_registry_find(reg, "wte.weight");
        if (w >= 0) n += (int64_t)cai_registry_param(reg, w)->numel;
    }
    return n;
}

/* Achieved dense matmul rate of this rank's device (FLOP/s): the ceiling
 * MFU is measured against when no datasheet peak is configured. */
static cai_status measure_peak(cai_device_t *dev, cai_dtype dt, double *flops) {
    int64_t n = dev->kind == CAI_DEVICE_HOST ? 1024 : 8192;
    if (dev->kind == CAI_DEVICE_HOST) dt = CAI_DTYPE_F32; /* the CPU backend computes in F32 */
    int64_t shape[2] = {n, n};
    cai_tensor a, b, c;
    memset(&a, 0, sizeof a);
    b = c = a;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_tensor_alloc(&a, dev, dt, 2, shape, "peak matmul A"), st, done);
    CAI_CALL_GOTO(cai_tensor_alloc(&b, dev, dt, 2, shape, "peak matmul B"), st, done);
    CAI_CALL_GOTO(cai_tensor_alloc(&c, dev, dt, 2, shape, "peak matmul C"), st, done);
    CAI_CALL_GOTO(dev->ops->matmul(dev, &c, &a, 0, &b, 0, 1.0f, 0.0f), st, done); /* warm-up */
    CAI_CALL_GOTO(cai_device_sync(dev), st, done);
    /* Best of several short trials: a busy node slows some of them, and
     * the fastest is the closest to what the device can do. */
    double best = 0, t_end = cai_time_now() + 0.3;
    for (int trial = 0; trial < 20 && (trial < 3 || cai_time_now() < t_end); trial++) {
        double t0 = cai_time_now();
        CAI_CALL_GOTO(dev->ops->matmul(dev, &c, &a, 0, &b, 0, 1.0f, 0.0f), st, done);
        CAI_CALL_GOTO(cai_device_sync(dev), st, done);
        double t = cai_time_now() - t0, rate = t > 0 ? 2.0 * (double)n * (double)n * (double)n / t : 0;
        if (rate > best) best = rate;
    }
    *flops = best;
done:
    cai_tensor_free(&a);
    cai_tensor_free(&b);
    cai_tensor_free(&c);
    return st;
}

cai_status cai_run_report_init(cai_run_report *r, const char *dir, double peak_tflops, int64_t first_step,
                               cai_model_t *m, int64_t adapters, cai_device_t *dev, int seq_len, int rank,
                               cai_mesh_t *mesh) {
    memset(r, 0, sizeof *r);
    r->rank = rank;
    r->dev = dev;
    const cai_model_config *mc = cai_model_config_of(m);
    r->matmul_params = matmul_params(cai_model_registry(m), mc->moe.n_experts > 0 ? mc->moe.top_k : 0);
    const double attn = 12.0 * mc->n_layers * (double)seq_len * mc->d_model;
    r->flops_per_token = adapters < 0 ? 6.0 * (double)r->matmul_params + attn
                                      : 4.0 * (double)r->matmul_params + 6.0 * (double)adapters + attn;
    double peak = peak_tflops * 1e12;
    if (!(peak > 0)) CAI_CALL(measure_peak(dev, mc->act_dtype, &peak));
    /* Collective on every rank alike (the branch above is per rank only in
     * its duration). Every reduction of the report goes through the mesh, so
     * the watchdog names a rank that stalls the job here too. */
    CAI_CALL(cai_allreduce(mesh, CAI_AXIS_WORLD, &peak, &peak, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    r->mesh = mesh;
    r->peak_flops = peak;
    if (rank == 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
        /* A resumed run continues the record of the run it resumes. */
        r->metrics = fopen(path, first_step > 1 ? "a" : "w");
        if (!r->metrics) return CAI_ERROR(CAI_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        snprintf(r->metrics_path, sizeof r->metrics_path, "%s", path);
    }
    r->t_start = r->t_last = cai_time_now();
    r->step_last = first_step > 1 ? first_step - 1 : 0;
    return CAI_OK;
}

void cai_run_report_free(cai_run_report *r) {
    if (r->metrics && fclose(r->metrics) != 0 && !r->metrics_errno)
        CAI_WARN("closing %s failed: %s (its last records may be lost)", r->metrics_path, strerror(errno));
    r->metrics = NULL;
    free(r->step_s);
    r->step_s = NULL;
}

void cai_run_report_vjson(cai_run_report *r, const char *fmt, va_list ap) {
    if (!r->metrics || r->metrics_errno) return;
    errno = 0;
    int bad = fputc('{', r->metrics) == EOF;
    bad |= vfprintf(r->metrics, fmt, ap) < 0;
    bad |= fputs("}\n", r->metrics) == EOF;
    /* Readable while the run goes on, and complete up to the last step if
     * the job is killed. */
    bad |= fflush(r->metrics) != 0 || ferror(r->metrics);
    /* A full disk: remembered (the first error only) and reported by the
     * next cai_run_report_step or cai_run_report_summary; no more records. */
    if (bad) r->metrics_errno = errno ? errno : EIO;
}

cai_status cai_run_report_status(const cai_run_report *r) {
    if (!r->metrics_errno) return CAI_OK;
    return CAI_ERROR(CAI_ERR_IO, "cannot write %s: %s", r->metrics_path, strerror(r->metrics_errno));
}

void cai_run_report_json(cai_run_report *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cai_run_report_vjson(r, fmt, ap);
    va_end(ap);
}

/* Device memory in use now (GPUs: the whole device as the driver counts it,
 * context included, as nvidia-smi shows it; the CPU backend: none, its
 * memory is the process's RSS). Every step: the arena is allocated before
 * step 1 and nothing after, so a sample per step sees the peak. */
static void sample_device_memory(cai_run_report *r) {
    if (!r->dev || r->dev->kind == CAI_DEVICE_HOST) return;
    size_t free_b = 0, total_b = 0;
    if (cai_device_mem_info(r->dev, &free_b, &total_b) != CAI_OK || total_b == 0) return;
    double used = (double)(total_b - free_b);
    if (used > r->dev_used_max) r->dev_used_max = used;
    r->dev_total = (double)total_b;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

cai_status cai_run_report_summary(cai_run_report *r) {
    double mem[2] = {r->dev_used_max, r->dev_total};
    CAI_CALL(cai_allreduce(r->mesh, CAI_AXIS_WORLD, mem, mem, 2, CAI_DTYPE_F64, CAI_RED_MAX));
    if (r->rank != 0) return CAI_OK;
    CAI_CALL(cai_run_report_status(r));
    if (r->n_steps == 0) return CAI_OK;
    /* The first steps pay for plan caches, autotuning and page faults: leave
     * out 5, or a quarter of a short run. */
    int64_t warm = r->n_steps / 4 < 5 ? r->n_steps / 4 : 5, n = r->n_steps - warm;
    qsort(r->step_s + warm, (size_t)n, sizeof *r->step_s, cmp_double);
    double med = n % 2 ? r->step_s[warm + n / 2] : 0.5 * (r->step_s[warm + n / 2 - 1] + r->step_s[warm + n / 2]);
    double tps = med > 0 ? (double)r->tokens_per_step / med : 0, mfu = tps * r->flops_per_token / r->peak_flops;
    printf("steady state: median step %.1f ms over %lld steps after %lld warm-up | %.0f tokens/s | MFU %.1f%%",
           1e3 * med, (long long)n, (long long)warm, tps, 100.0 * mfu);
    if (mem[1] > 0)
        printf(" | device memory %.1f of %.1f GiB (most on a rank)", mem[0] / 1073741824.0, mem[1] / 1073741824.0);
    printf("\n");
    cai_run_report_json(r,
                        "\"kind\":\"summary\",\"warmup_steps\":%lld,\"steps\":%lld,\"median_step_s\":%.6f,"
                        "\"tokens_per_s\":%.1f,\"mfu\":%.6f,\"device_mem_used_bytes\":%.0f,"
                        "\"device_mem_total_bytes\":%.0f",
                        (long long)warm, (long long)n, med, tps, mfu, mem[0], mem[1]);
    fflush(stdout);
    return CAI_OK;
}

static double rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    if (resident > 0) return (double)resident * (double)sysconf(_SC_PAGESIZE);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0; /* peak, where /proc is missing */
}

void cai_run_format_duration(double s, char *buf, size_t cap) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, cap, "%lds", t);
}

cai_status cai_run_report_step(cai_run_report *r, int64_t step, int64_t last_step, int64_t log_interval,
                               const cai_step_stats *st, double step_seconds) {
    if (r->n_steps == r->cap_steps) {
        int64_t cap = r->cap_steps ? 2 * r->cap_steps : 1024;
        double *p = realloc(r->step_s, (size_t)cap * sizeof *p);
        if (p) { /* without memory the summary covers the steps recorded so far */
            r->step_s = p;
            r->cap_steps = cap;
        }
    }
    if (r->n_steps < r->cap_steps) r->step_s[r->n_steps++] = step_seconds;
    sample_device_memory(r);
    double tps = step_seconds > 0 ? (double)r->tokens_per_step / step_seconds : 0;
    double mfu = tps * r->flops_per_token / r->peak_flops;
    cai_run_report_json(r,
                        "\"kind\":\"train\",\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,"
                        "\"tokens\":%lld,\"step_s\":%.6f,\"tokens_per_s\":%.1f,\"mfu\":%.6f",
                        (long long)step, (double)st->loss, (double)st->lr, (double)st->grad_norm,
                        (long long)(step * r->tokens_per_step), step_seconds, tps, mfu);
    CAI_CALL(cai_run_report_status(r)); /* rank 0: the caller aborts the job (cai_app_check) */
    if (step % log_interval != 0 && step != last_step) return CAI_OK;

    double rss = rss_bytes();
    CAI_CALL(cai_allreduce(r->mesh, CAI_AXIS_WORLD, &rss, &rss, 1, CAI_DTYPE_F64, CAI_RED_MAX));
    double now = cai_time_now(), dt = now - r->t_last;
    int64_t steps = step - r->step_last;
    tps = dt > 0 ? (double)(steps * r->tokens_per_step) / dt : 0;
    mfu = tps * r->flops_per_token / r->peak_flops;
    double eta = steps > 0 ? dt / (double)steps * (double)(last_step - step) : 0;
    r->t_last = now;
    r->step_last = step;
    if (r->rank != 0) return CAI_OK;
    char eta_s[32], tps_s[32];
    cai_run_format_duration(eta, eta_s, sizeof eta_s);
    if (tps >= 1e6) snprintf(tps_s, sizeof tps_s, "%.2fM", tps / 1e6);
    else if (tps >= 1e3) snprintf(tps_s, sizeof tps_s, "%.1fk", tps / 1e3);
    else snprintf(tps_s, sizeof tps_s, "%.0f", tps);
    int w = snprintf(NULL, 0, "%lld", (long long)last_step);
    printf("step %*lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | MFU %.1f%% | mem %.0f MiB | ETA %s\n",
           w, (long long)step, (long long)last_step, (double)st->loss, (double)st->lr, (double)st->grad_norm, tps_s,
           100.0 * mfu, rss / 1048576.0, eta_s);
    cai_run_report_json(r,
                        "\"kind\":\"progress\",\"step\":%lld,\"tokens_per_s\":%.1f,\"mfu\":%.6f,\"rss_mib\":%.1f,"
                        "\"elapsed_s\":%.3f",
                        (long long)step, tps, mfu, rss / 1048576.0, now - r->t_start);
    fflush(stdout);
    return CAI_OK;
}

void cai_run_report_eval(cai_run_report *r, int64_t step, double loss) {
    if (r->rank != 0) return;
    printf("eval at step %lld | val loss %.4f | val ppl %.3f\n", (long long)step, loss, exp(loss));
    fflush(stdout);
    cai_run_report_json(r, "\"kind\":\"eval\",\"step\":%lld,\"val_loss\":%.9g,\"val_ppl\":%.9g", (long long)step, loss,
                        exp(loss));
}
