/* CPU training-step throughput of a small GPT-2 with colossal: the C side of
 * bench/cpu_train.sh, which runs bench/torch_cpu_train.py on the same model,
 * batch and thread count and prints the ratio (see bench/RESULTS.md).
 *
 * Each step is a full cai_train_step (zero grads, forward, backward, global
 * grad norm, clip, AdamW), F32 throughout, on a fixed random batch. Warm-up
 * steps are run first and not timed. Prints one summary line
 *
 *   colossal tokens/s=... step_ms=... cpu_ms_per_step=... peak_rss_mb=... loss0=... loss=...
 *
 * that the driver script parses. Single process, not collective. */
#include "cai_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "colossal/base.h"
#include "colossal/model.h"
#include "colossal/ops.h"
#include "colossal/optim.h"
#include "colossal/tensor.h"

typedef struct {
    int layers, d_model, heads, seq, batch, vocab, threads, steps, warmup, phases;
    uint64_t seed;
} bench_opts;

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--layers 6] [--d-model 384] [--heads 6] [--seq 256] [--batch 8] [--vocab 50257]\n"
            "          [--threads N (0: OMP_NUM_THREADS)] [--steps 5] [--warmup 1] [--seed 1] [--phases 0]\n"
            "The vocabulary is padded to a multiple of 128 (50257 -> 50304). --phases N runs N more steps\n"
            "through the public pieces of cai_train_step and prints where the time goes.\n",
            argv0);
}

static int parse(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){6, 384, 6, 256, 8, 50257, 0, 5, 1, 0, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) return -1;
        long v = strtol(argv[++i], NULL, 10);
        if (strcmp(a, "--layers") == 0) o->layers = (int)v;
        else if (strcmp(a, "--d-model") == 0) o->d_model = (int)v;
        else if (strcmp(a, "--heads") == 0) o->heads = (int)v;
        else if (strcmp(a, "--seq") == 0) o->seq = (int)v;
        else if (strcmp(a, "--batch") == 0) o->batch = (int)v;
        else if (strcmp(a, "--vocab") == 0) o->vocab = (int)v;
        else if (strcmp(a, "--threads") == 0) o->threads = (int)v;
        else if (strcmp(a, "--steps") == 0) o->steps = (int)v;
        else if (strcmp(a, "--warmup") == 0) o->warmup = (int)v;
        else if (strcmp(a, "--seed") == 0) o->seed = (uint64_t)v;
        else if (strcmp(a, "--phases") == 0) o->phases = (int)v;
        else return -1;
    }
    return o->steps >= 1 && o->warmup >= 0 && o->phases >= 0 ? 0 : -1;
}

/* cai_train_step's sequence (optim/train.c) timed piece by piece: the split
 * tells the ops owner which side of the step to look at. */
static cai_status time_phases(cai_model_t *m, cai_optim_t *o, const int32_t *tokens, const int32_t *targets, int steps,
                              size_t n_tokens) {
    double t[5] = {0};
    const char *names[5] = {"zero_grad", "forward", "backward", "grad_norm", "adamw+refresh"};
    for (int s = 0; s < steps; s++) {
        double t0 = cai_time_now();
        CAI_CALL(cai_model_zero_grad(m));
        double t1 = cai_time_now();
        float loss = 0;
        CAI_CALL(cai_model_forward(m, tokens, targets, &loss));
        double t2 = cai_time_now();
        CAI_CALL(cai_model_backward(m, 1.0f));
        double t3 = cai_time_now();
        cai_tensor params, grads, lowp;
        cai_model_flat(m, &params, &grads, &lowp);
        double sumsq = 0;
        CAI_CALL(cai_optim_grad_sumsq(o, &grads, &sumsq));
        double t4 = cai_time_now();
        float coef = cai_clip_coef(sqrt(sumsq), (double)cai_optim_config(o)->grad_clip);
        CAI_CALL(cai_optim_step(o, &params, &grads, &lowp, coef, NULL));
        CAI_CALL(cai_model_params_updated(m));
        double t5 = cai_time_now();
        t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2, t[3] += t4 - t3, t[4] += t5 - t4;
    }
    double total = t[0] + t[1] + t[2] + t[3] + t[4];
    printf("colossal phases over %d steps (%.1f tokens/s):", steps, (double)n_tokens * steps / total);
    for (int i = 0; i < 5; i++) printf(" %s %.0f ms (%.1f%%)", names[i], 1e3 * t[i] / steps, 100.0 * t[i] / total);
    printf("\n");
    return CAI_OK;
}

/* User + system seconds of the whole process (all threads): less sensitive
 * than wall time to other load on the machine. */
static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static cai_status run(const bench_opts *bo) {
    cai_model_config cfg = cai_model_config_default(CAI_MODEL_GPT2);
    cfg.vocab_size = bo->vocab;
    cfg.vocab_multiple = 128;
    cfg.n_layers = bo->layers;
    cfg.d_model = bo->d_model;
    cfg.n_heads = bo->heads;
    cfg.n_kv_heads = bo->heads;
    cfg.ffn_hidden = 4 * bo->d_model;
    cfg.max_seq_len = bo->seq;
    cfg.seed = bo->seed;
    cai_adamw_config oc = cai_adamw_config_default(); /* lr 3e-4, wd 0.1, clip 1.0: as the torch side */

    cai_status st = CAI_OK;
    cai_device_t *dev = NULL;
    cai_model_t *m = NULL;
    cai_optim_t *o = NULL;
    int32_t *tokens = NULL, *targets = NULL;
    CAI_CALL(cai_device_init(&dev, CAI_DEVICE_HOST, 0, bo->threads));
    cai_model_options mo = cai_model_options_default(&cfg);
    mo.batch = bo->batch;
    mo.seq_len = bo->seq;
    double t_setup = cai_time_now();
    CAI_CALL_GOTO(cai_model_create(&m, dev, &cfg, &mo), st, done);
    CAI_CALL_GOTO(cai_optim_create_for_model(&o, m, &oc), st, done);
    t_setup = cai_time_now() - t_setup;

    const size_t n = (size_t)bo->batch * (size_t)bo->seq;
    tokens = malloc(n * sizeof *tokens);
    targets = malloc(n * sizeof *targets);
    if (!tokens || !targets) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "bench: token buffers (%zu tokens)", n);
        goto done;
    }
    /* One fixed random batch, next-token targets: the throughput does not
     * depend on the data, and the loss must fall (a sanity check). */
    for (size_t i = 0; i < n + 1; i++) {
        int32_t t = (int32_t)(cai_philox4x32(bo->seed, 99, i).v[0] % (uint32_t)bo->vocab);
        if (i < n) tokens[i] = t;
        if (i > 0) targets[i - 1] = t;
    }

    cai_step_stats ss = {0};
    cai_step_driver drv;
    CAI_CALL_GOTO(cai_local_driver(m, o, &drv), st, done);
    float loss0 = 0;
    for (int s = 0; s < bo->warmup; s++) {
        CAI_CALL_GOTO(cai_train_step(&drv, NULL, NULL, tokens, targets, 1, &ss), st, done);
        if (s == 0) loss0 = ss.loss;
    }
    double c0 = cpu_seconds(), t0 = cai_time_now();
    for (int s = 0; s < bo->steps; s++) {
        CAI_CALL_GOTO(cai_train_step(&drv, NULL, NULL, tokens, targets, 1, &ss), st, done);
        if (bo->warmup == 0 && s == 0) loss0 = ss.loss;
    }
    double dt = cai_time_now() - t0, dc = cpu_seconds() - c0;
    if (bo->phases > 0) CAI_CALL_GOTO(time_phases(m, o, tokens, targets, bo->phases, n), st, done);

    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    size_t pbytes = 0, abytes = 0;
    cai_model_memory(m, &pbytes, &abytes);
    printf(
        "colossal: %s, GPT-2 L=%d d=%d heads=%d T=%d B=%d vocab %d (padded %lld), %lld params, "
        "params+grads %.1f MB, activations %.1f MB, setup %.2f s\n",
        dev->name, bo->layers, bo->d_model, bo->heads, bo->seq, bo->batch, bo->vocab,
        (long long)cai_model_padded_vocab(m), (long long)cai_registry_global_numel(cai_model_registry(m)),
        (double)pbytes / 1e6, (double)abytes / 1e6, t_setup);
    printf(
        "colossal tokens/s=%.1f step_ms=%.1f cpu_ms_per_step=%.1f peak_rss_mb=%.1f loss0=%.4f loss=%.4f steps=%d "
        "warmup=%d\n",
        (double)n * bo->steps / dt, 1e3 * dt / bo->steps, 1e3 * dc / bo->steps, (double)ru.ru_maxrss / 1024.0,
        (double)loss0, (double)ss.loss, bo->steps, bo->warmup);
done:
    free(tokens);
    free(targets);
    cai_optim_free(o);
    cai_model_free(m);
    cai_device_free(dev);
    return st;
}

int main(int argc, char **argv) {
    bench_opts bo;
    if (parse(argc, argv, &bo) != 0) {
        usage(argv[0]);
        return 2;
    }
    cai_status st = run(&bo);
    if (st != CAI_OK) {
        cai_error_print(stderr);
        return 1;
    }
    return 0;
}
