/* CPU training-step throughput of a small GPT-2 with colossal: the C side of
 * bench/cpu_train.sh, which runs bench/torch_cpu_train.py on the same model,
 * batch and thread count and prints the ratio (see bench/RESULTS.md).
 *
 * Each step is a full cai_train_step (zero grads, forward, backward, global
 * grad norm, clip, AdamW), F32 throughout, on a fixed random batch. Warm-up
 * steps are run first and not timed. Prints one summary line
 *
 *   colossal tokens/s=... step_ms=... peak_rss_mb=... loss0=... loss=...
 *
 * that the driver script parses. Single process, not collective. */
#include "cai_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "colossal/base.h"
#include "colossal/model.h"
#include "colossal/optim.h"
#include "colossal/tensor.h"

typedef struct {
    int layers, d_model, heads, seq, batch, vocab, threads, steps, warmup;
    uint64_t seed;
} bench_opts;

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--layers 6] [--d-model 384] [--heads 6] [--seq 256] [--batch 8] [--vocab 50257]\n"
            "          [--threads N (0: OMP_NUM_THREADS)] [--steps 5] [--warmup 1] [--seed 1]\n"
            "The vocabulary is padded to a multiple of 128 (50257 -> 50304).\n",
            argv0);
}

static int parse(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){6, 384, 6, 256, 8, 50257, 0, 5, 1, 1};
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
        else return -1;
    }
    return o->steps >= 1 && o->warmup >= 0 ? 0 : -1;
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
    float loss0 = 0;
    for (int s = 0; s < bo->warmup; s++) {
        CAI_CALL_GOTO(cai_train_step(m, o, tokens, targets, 1, &ss), st, done);
        if (s == 0) loss0 = ss.loss;
    }
    double t0 = cai_time_now();
    for (int s = 0; s < bo->steps; s++) {
        CAI_CALL_GOTO(cai_train_step(m, o, tokens, targets, 1, &ss), st, done);
        if (bo->warmup == 0 && s == 0) loss0 = ss.loss;
    }
    double dt = cai_time_now() - t0;

    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    size_t pbytes = 0, abytes = 0;
    cai_model_memory(m, &pbytes, &abytes);
    printf("colossal: %s, GPT-2 L=%d d=%d heads=%d T=%d B=%d vocab %d (padded %lld), %lld params, "
           "params+grads %.1f MB, activations %.1f MB, setup %.2f s\n",
           dev->name, bo->layers, bo->d_model, bo->heads, bo->seq, bo->batch, bo->vocab,
           (long long)cai_model_padded_vocab(m), (long long)cai_registry_global_numel(cai_model_registry(m)),
           (double)pbytes / 1e6, (double)abytes / 1e6, t_setup);
    printf("colossal tokens/s=%.1f step_ms=%.1f peak_rss_mb=%.1f loss0=%.4f loss=%.4f steps=%d warmup=%d\n",
           (double)n * bo->steps / dt, 1e3 * dt / bo->steps, (double)ru.ru_maxrss / 1024.0, (double)loss0,
           (double)ss.loss, bo->steps, bo->warmup);
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
