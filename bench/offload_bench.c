/* The host side of a ZeRO offload step, timed on the CPU: for a flat shard of
 * N parameters (default 100M) it runs, with 1 and 2 (or the listed) threads,
 * the phases cai_zero_step + publish run on the host device with
 * zero.offload=true, and a plain memcpy of the master bytes as the reference
 * in the same invocation, and prints ns per parameter of each:
 *   grads    the gradient shard into the host staging (memmove, as H2H)
 *   adamw    the AdamW op over the shard in GPT-2-sized segments
 *   round    masters -> bf16 working shard through the copy op (a separate
 *            pass, for comparison)
 *   fused    AdamW with the bf16 working copy written in the same pass, one
 *            op call (one parallel region) per segment
 *   engine   what cai_zero_step runs with offload:
 *            zero_host_adamw, the fused pass in one parallel region over the
 *            whole shard (matters when threads >= free cores: every region
 *            waits for its slowest thread)
 * Usage: offload_bench [N [threads...]]  (e.g. offload_bench 100000000 1 2 64)
 * Buffers are touched once before timing: a step touches no fresh memory. */
#include "cai_config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "colossal/ops.h"
#include "colossal/tensor.h"
#include "../src/parallel/zero_internal.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define REPS 3

/* GPT-2 350M's parameter sizes repeat over a 24-layer stack: segments of
 * 1024 (norms, biases), 3M, 1M, 4M, 4M and 3072-element biases. */
static const size_t seg_sizes[] = {1024, 1024, 3145728, 3072, 1048576, 1024, 1024, 1024, 4194304, 4096, 4194304, 1024};

/* AdamW over the flat buffer in GPT-2-sized segments (lp: the bf16 copy
 * written in the same pass, or NULL). */
static cai_status seg_adamw(cai_device_t *d, float *w, float *g, float *m, float *v, void *lp, size_t n,
                            const cai_adamw_params *p) {
    const size_t nseg = sizeof seg_sizes / sizeof *seg_sizes;
    for (size_t off = 0, k = 0; off < n; k++) {
        size_t len = seg_sizes[k % nseg];
        if (len > n - off) len = n - off;
        cai_tensor sw = cai_tensor_1d(d, w + off, CAI_DTYPE_F32, (int64_t)len);
        cai_tensor sg = cai_tensor_1d(d, g + off, CAI_DTYPE_F32, (int64_t)len);
        cai_tensor sm = cai_tensor_1d(d, m + off, CAI_DTYPE_F32, (int64_t)len);
        cai_tensor sv = cai_tensor_1d(d, v + off, CAI_DTYPE_F32, (int64_t)len);
        cai_tensor sl = cai_tensor_1d(d, lp ? (char *)lp + off * 2 : NULL, CAI_DTYPE_BF16, (int64_t)len);
        CAI_CALL(d->ops->adamw(d, &sw, &sg, &sm, &sv, lp ? &sl : NULL, p, len > 4096));
        off += len;
    }
    return CAI_OK;
}

static cai_status run(size_t n, int threads, double ref_ns) {
    cai_device_t *d = NULL;
    CAI_CALL(cai_device_init(&d, CAI_DEVICE_HOST, 0, threads));
    float *w = NULL, *g = NULL, *gd = NULL, *m = NULL, *v = NULL;
    void *lp = NULL;
    zl_seg *seg = NULL;
    cai_adamw_span *spans = NULL;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_device_alloc_staging(d, n * 4, "masters", (void **)&w), st, done);
    CAI_CALL_GOTO(cai_device_alloc_staging(d, n * 4, "grads (staging)", (void **)&g), st, done);
    CAI_CALL_GOTO(cai_device_alloc_staging(d, n * 4, "grads (device)", (void **)&gd), st, done);
    CAI_CALL_GOTO(cai_device_alloc_staging(d, n * 4, "m", (void **)&m), st, done);
    CAI_CALL_GOTO(cai_device_alloc_staging(d, n * 4, "v", (void **)&v), st, done);
    CAI_CALL_GOTO(cai_device_alloc_staging(d, n * 2, "working bf16", &lp), st, done);
    for (size_t i = 0; i < n; i++) {
        w[i] = 0.02f * (float)((i * 2654435761u) % 1000) / 1000.0f;
        gd[i] = 1e-3f * (float)((i * 40503u) % 997) / 997.0f - 5e-4f;
        m[i] = v[i] = 0.0f;
    }
    memset(g, 0, n * 4);
    memset(lp, 0, n * 2);
    cai_adamw_params p = {
        .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 1, .grad_scale = 1.0f};
    double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
    /* The engine's segments: the same GPT-2 pattern, decay on the large ones. */
    const size_t nsz = sizeof seg_sizes / sizeof *seg_sizes;
    int nseg = 0;
    for (size_t off = 0; off < n; nseg++) off += seg_sizes[(size_t)nseg % nsz];
    seg = calloc((size_t)nseg, sizeof *seg);
    spans = calloc((size_t)nseg, sizeof *spans);
    if (!seg || !spans) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "offload_bench: %d segments", nseg);
        goto done;
    }
    for (size_t off = 0, k = 0; off < n; k++) {
        size_t len = seg_sizes[k % nsz];
        if (len > n - off) len = n - off;
        seg[k] = (zl_seg){.index = (int)k, .soff = off, .n = len, .decay = len > 4096, .update = 1, .norm = 1};
        off += len;
    }
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        CAI_CALL_GOTO(cai_device_copy(d, g, gd, n * 4, CAI_COPY_H2H), st, done);
        double t1 = now();
        CAI_CALL_GOTO(seg_adamw(d, w, g, m, v, NULL, n, &p), st, done);
        p.step++;
        double t2 = now();
        cai_tensor tl = cai_tensor_1d(d, lp, CAI_DTYPE_BF16, (int64_t)n),
                   tw = cai_tensor_1d(d, w, CAI_DTYPE_F32, (int64_t)n);
        CAI_CALL_GOTO(d->ops->copy(d, &tl, &tw), st, done);
        double t3 = now();
        CAI_CALL_GOTO(seg_adamw(d, w, g, m, v, lp, n, &p), st, done);
        p.step++;
        double t4 = now();
        CAI_CALL_GOTO(zero_host_adamw(d, seg, nseg, w, g, m, v, lp, CAI_DTYPE_BF16, &p, spans), st, done);
        p.step++;
        double t5 = now(), dt[5] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4};
        for (int k = 0; k < 5; k++)
            if (dt[k] < best[k]) best[k] = dt[k];
    }
    double ns = 1e9 / (double)n;
    printf(
        "threads %3d  memcpy %.3f  grads %.3f  adamw %.3f  round %.3f  adamw+round %.3f  fused %.3f  engine %.3f "
        "ns/param  (grads + engine: %.2f x memcpy; grads + adamw + separate round: %.2f x)\n",
        threads, ref_ns, best[0] * ns, best[1] * ns, best[2] * ns, (best[1] + best[2]) * ns, best[3] * ns, best[4] * ns,
        (best[0] + best[4]) * ns / ref_ns, (best[0] + best[1] + best[2]) * ns / ref_ns);
done:
    free(seg);
    free(spans);
    cai_device_dealloc_staging(d, w);
    cai_device_dealloc_staging(d, g);
    cai_device_dealloc_staging(d, gd);
    cai_device_dealloc_staging(d, m);
    cai_device_dealloc_staging(d, v);
    cai_device_dealloc_staging(d, lp);
    cai_device_free(d);
    return st;
}

/* The fused rounding (AdamW writing the bf16 copy in its loop) must equal
 * the copy op's rounding of the updated masters bit for bit, NaN, Inf,
 * ties and overflow included. Returns the number of mismatches. */
static size_t check_fused(void) {
    enum { N = 1 << 16 };
    static float w0[N], w1[N], wr[N], g[N], m0[N], v0[N], m1[N], v1[N];
    static cai_bf16 a[N], b[N];
    cai_device_t *d = NULL;
    if (cai_device_init(&d, CAI_DEVICE_HOST, 0, 2) != CAI_OK) return N;
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t bits = (uint32_t)x, gb = (uint32_t)(x >> 32);
        if (i % 7 == 0) bits = (bits & 0xffff0000u) | 0x8000u; /* a tie after the update's tiny change */
        memcpy(&w0[i], &bits, 4);
        g[i] = (float)(int32_t)gb * 1e-9f;
        if (i % 101 == 0) g[i] = NAN;
        if (i % 103 == 0) g[i] = INFINITY;
        m0[i] = m1[i] = 0.01f * (float)(i % 13);
        v0[i] = v1[i] = 1e-6f * (float)(i % 17);
        w1[i] = wr[i] = w0[i];
    }
    cai_adamw_params p = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3, .grad_scale = 1.0f};
    cai_tensor tw0 = cai_tensor_1d(d, w0, CAI_DTYPE_F32, N), tw1 = cai_tensor_1d(d, w1, CAI_DTYPE_F32, N);
    cai_tensor tg = cai_tensor_1d(d, g, CAI_DTYPE_F32, N), tl = cai_tensor_1d(d, a, CAI_DTYPE_BF16, N);
    cai_tensor tm0 = cai_tensor_1d(d, m0, CAI_DTYPE_F32, N), tv0 = cai_tensor_1d(d, v0, CAI_DTYPE_F32, N);
    cai_tensor tm1 = cai_tensor_1d(d, m1, CAI_DTYPE_F32, N), tv1 = cai_tensor_1d(d, v1, CAI_DTYPE_F32, N);
    size_t bad = 0;
    if (d->ops->adamw(d, &tw0, &tg, &tm0, &tv0, &tl, &p, 1) != CAI_OK ||
        d->ops->adamw(d, &tw1, &tg, &tm1, &tv1, NULL, &p, 1) != CAI_OK ||
        cai_convert_host(b, CAI_DTYPE_BF16, w1, CAI_DTYPE_F32, N) != CAI_OK)
        bad = N;
    /* And the op's arithmetic is the scalar statement's (ops.h), bit for bit. */
    const float bc1 = (float)(p.lr / (1.0 - pow((double)p.beta1, 3.0)));
    const float bc2 = (float)sqrt(1.0 - pow((double)p.beta2, 3.0));
    const float dec = 1.0f - p.lr * p.weight_decay;
    for (int i = 0; i < N && !bad; i++) {
        float gi = g[i], mi = 0.9f * (0.01f * (float)(i % 13)) + (1.0f - 0.9f) * gi;
        float vi = 0.95f * (1e-6f * (float)(i % 17)) + (1.0f - 0.95f) * gi * gi;
        wr[i] = wr[i] * dec - bc1 * mi / (sqrtf(vi) / bc2 + p.eps);
        bad += memcmp(&w0[i], &w1[i], 4) != 0 || a[i] != b[i] || memcmp(&m0[i], &m1[i], 4) != 0 ||
               (memcmp(&wr[i], &w1[i], 4) != 0 && !(isnan(wr[i]) && isnan(w1[i])));
    }
    cai_device_free(d);
    return bad;
}

int main(int argc, char **argv) {
    size_t bad = check_fused();
    printf("fused AdamW + bf16 rounding vs AdamW then the copy op, and vs the scalar formula: %s (%zu mismatches)\n",
           bad ? "MISMATCH" : "identical", bad);
    if (bad) return 1;
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000000u;
    if (n == 0) n = 100000000u;
    /* The reference: one plain memcpy of the masters' bytes. */
    char *a = malloc(n * 4), *b = malloc(n * 4);
    if (!a || !b) {
        fprintf(stderr, "offload_bench: cannot allocate 2 x %zu MiB\n", (n * 4) >> 20);
        return 1;
    }
    memset(a, 1, n * 4);
    memset(b, 2, n * 4);
    double ref = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        memcpy(b, a, n * 4);
        double t = now() - t0;
        if (t < ref) ref = t;
    }
    free(a);
    free(b);
    ref *= 1e9 / (double)n;
    printf("offload host step, %zu parameters (%zu MiB f32 each of masters, grads, m, v)\n", n, (n * 4) >> 20);
    int nt_default[] = {1, 2};
    int nthr = argc > 2 ? argc - 2 : 2;
    for (int k = 0; k < nthr; k++) {
        int t = argc > 2 ? atoi(argv[2 + k]) : nt_default[k];
        if (run(n, t, ref) != CAI_OK) {
            fprintf(stderr, "offload_bench: %s\n", cai_error_message());
            return 1;
        }
    }
    return 0;
}
