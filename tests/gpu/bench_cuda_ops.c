/* Op timings of the CUDA backend at GPT-2 124M training shapes (B*T = 8192
 * tokens, C = 768, 12 heads of 64, vocabulary 50304), each against a roofline
 * measured in the same invocation: device-to-device copy bandwidth for
 * memory-bound ops, the best bf16 cuBLASLt product for matrix-bound ones.
 * Not a test (no pass/fail); exits 77 without a GPU.
 *   tests/gpu/bench_cuda_ops [reps] */
#include "cai_config.h"

#include "colossal/base.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"
#include "cuda_backend.h" /* cai_cuda_attn_force */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cai_device_t *G;
static int g_reps = 20;
static double g_bw = 0, g_mm = 0; /* measured ceilings: bytes/s, flop/s */

#define OK(expr)                                                            \
    do {                                                                    \
        if ((expr) != CAI_OK) {                                             \
            fprintf(stderr, "FATAL: %s: %s\n", #expr, cai_error_message()); \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

#define NDEV 256
static void *g_dev[NDEV];
static int g_ndev;

/* Device tensor filled with a repeating block of random normals (never zeros:
 * zeros run faster than real data). */
static cai_tensor dev_tensor(cai_dtype dt, int ndim, const int64_t *shape, float scale) {
    cai_tensor t;
    OK(cai_tensor_init(&t, G, NULL, dt, ndim, shape));
    size_t n = (size_t)cai_tensor_numel(&t), es = cai_dtype_size(dt);
    OK(cai_device_alloc(G, n * es, "bench", &t.data));
    g_dev[g_ndev++] = t.data;
    enum { BLK = 1 << 20 };
    static float *fb;
    static void *cb;
    if (!fb) {
        fb = malloc(BLK * sizeof(float));
        cb = malloc(BLK * 4);
        if (!fb || !cb) exit(1);
    }
    for (int i = 0; i < BLK; i++) fb[i] = scale * cai_rng_normal(7, (uint64_t)g_ndev, (uint64_t)i);
    if (dt == CAI_DTYPE_I32) {
        for (int i = 0; i < BLK; i++) ((int32_t *)cb)[i] = (int32_t)((uint32_t)(fb[i] * 1e6f) % 50257u);
    } else {
        OK(cai_convert_host(cb, dt, fb, CAI_DTYPE_F32, BLK));
    }
    for (size_t off = 0; off < n; off += BLK) {
        size_t m = n - off < BLK ? n - off : BLK;
        OK(cai_device_copy(G, (char *)t.data + off * es, cb, m * es, CAI_COPY_H2D));
        OK(cai_device_sync(G));
    }
    return t;
}

static void free_all(void) {
    OK(cai_device_sync(G));
    for (int i = 0; i < g_ndev; i++) cai_device_dealloc(G, g_dev[i]);
    g_ndev = 0;
}

#define SHP(...) ((const int64_t[]){__VA_ARGS__})

typedef void (*bench_fn)(void *ctx);

/* Mean seconds per call over g_reps calls after 3 warm-ups; device-synchronised. */
static double time_it(bench_fn fn, void *ctx) {
    for (int i = 0; i < 3; i++) fn(ctx);
    OK(cai_device_sync(G));
    double t0 = cai_time_now();
    for (int i = 0; i < g_reps; i++) fn(ctx);
    OK(cai_device_sync(G));
    return (cai_time_now() - t0) / g_reps;
}

static void report(const char *name, double sec, double bytes, double flops) {
    double tb = bytes / sec / 1e12, tf = flops / sec / 1e12;
    /* roofline time: the larger of bytes / bandwidth and flops / matmul rate */
    double floor_s = fmax(bytes / g_bw, flops / g_mm);
    printf("%-44s %9.3f ms  %7.2f TB/s  %7.1f TFLOP/s  roofline %7.3f ms  %5.1f%%\n", name, sec * 1e3, tb, tf,
           floor_s * 1e3, 100.0 * floor_s / sec);
}

/* ------------------------------------------------------------------ cases */

typedef struct {
    cai_tensor a, b, c, d, e, f, g, h;
    cai_attn_params p;
    void *ws;
    size_t wsb;
    cai_adamw_params hp;
} ctx_t;

static void f_copy(void *x) {
    ctx_t *c = x;
    OK(G->ops->copy(G, &c->b, &c->a));
}
static void f_matmul(void *x) {
    ctx_t *c = x;
    OK(G->ops->matmul(G, &c->c, &c->a, 0, &c->b, 1, 1.0f, 0.0f));
}
static void f_linear(void *x) {
    ctx_t *c = x;
    OK(G->ops->linear_fwd(G, &c->c, &c->a, &c->b, c->d.data ? &c->d : NULL));
}
static void f_linear_bwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->linear_bwd(G, &c->e, &c->f, &c->g, &c->c, &c->a, &c->b, 0));
}
static void f_ln_fwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->layernorm_fwd(G, &c->b, &c->e, &c->f, &c->a, &c->c, &c->d, 1e-5f));
}
static void f_ln_bwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->layernorm_bwd(G, &c->g, &c->h, NULL, &c->b, &c->a, &c->c, &c->e, &c->f, 1));
}
static void f_gelu(void *x) {
    ctx_t *c = x;
    OK(G->ops->gelu_fwd(G, &c->b, &c->a));
}
static void f_gelu_bwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->gelu_bwd(G, &c->c, &c->a, &c->b));
}
/* fused linear + GELU: a inp, b fc weight, c pre, d fc bias, e act; f mlp_proj
 * weight, g its dout, h dpre; g_dw2/g_db2 mlp_proj's f32 gradients */
static cai_tensor g_dw2, g_db2;
static void f_lin_then_gelu(void *x) {
    ctx_t *c = x;
    OK(G->ops->linear_fwd(G, &c->c, &c->a, &c->b, &c->d));
    OK(G->ops->gelu_fwd(G, &c->e, &c->c));
}
static void f_lin_gelu(void *x) {
    ctx_t *c = x;
    OK(G->ops->linear_gelu_fwd(G, &c->e, &c->c, &c->a, &c->b, &c->d));
}
/* fused linear + residual: a inp, b weight, c tmp, d bias, e residual, f out */
static void f_lin_then_add(void *x) {
    ctx_t *c = x; /* the unfused path: linear_fwd, then add */
    OK(G->ops->linear_fwd(G, &c->c, &c->a, &c->b, &c->d));
    OK(G->ops->add(G, &c->f, &c->e, &c->c));
}
static void f_lin_resid(void *x) {
    ctx_t *c = x;
    OK(G->ops->linear_residual_fwd(G, &c->f, &c->a, &c->b, &c->d, &c->e));
}
static void f_lin_bwd_then_gelu_bwd(void *x) {
    ctx_t *c = x; /* the unfused path: linear_bwd, then gelu_bwd in place on dact */
    OK(G->ops->linear_bwd(G, &c->h, &g_dw2, &g_db2, &c->g, &c->e, &c->f, 0));
    OK(G->ops->gelu_bwd(G, &c->h, &c->c, &c->h));
}
static void f_lin_bwd_dgelu(void *x) {
    ctx_t *c = x;
    OK(G->ops->linear_bwd_dgelu(G, &c->h, &g_dw2, &g_db2, &c->g, &c->e, &c->f, &c->c));
}
static cai_tensor g_dbias; /* layernorm's dbias (F32 [C]) */
static void f_ln_bwd_full(void *x) {
    ctx_t *c = x;
    OK(G->ops->layernorm_bwd(G, &c->g, &c->h, &g_dbias, &c->b, &c->a, &c->c, &c->e, &c->f, 1));
}
static void f_rms_fwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->rmsnorm_fwd(G, &c->b, &c->f, &c->a, &c->c, 1e-6f));
}
static void f_rms_bwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->rmsnorm_bwd(G, &c->g, &c->h, &c->b, &c->a, &c->c, &c->f, 0));
}
static void f_add(void *x) {
    ctx_t *c = x;
    OK(G->ops->add(G, &c->g, &c->a, &c->b));
}
static void f_xent_fwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->xent_fwd(G, &c->c, &c->d, &c->a, &c->b, 0, 50257, -100));
}
static void f_xent_bwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->xent_bwd(G, &c->a, &c->a, &c->d, &c->b, NULL, 1.0f / 8192, 0, 50257, -100));
}
static void f_attn_fwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->attention_fwd(G, &c->d, &c->e, &c->a, &c->b, &c->c, &c->p, c->ws, c->wsb));
}
static void f_attn_bwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->attention_bwd(G, &c->g, &c->h, &c->f, &c->d, &c->a, &c->b, &c->c, &c->d, &c->e, &c->p, c->ws, c->wsb));
}
/* Forward and backward of the attention in c on the kernels named by mode
 * (flash, tc, simt: cai_cuda_attn_force; NULL: the default, cuDNN where
 * built, else flash); tensor_bytes is one [B,T,Hq*D] tensor's bytes. */
static void bench_attn(ctx_t *c, const char *what, const char *mode, double tensor_bytes, double fwd_flops) {
    char name[96];
    if (mode)
        cai_cuda_attn_force(strcmp(mode, "simt") == 0 ? CAI_CUDA_ATTN_SIMT
                            : strcmp(mode, "tc") == 0 ? CAI_CUDA_ATTN_TC
                                                      : CAI_CUDA_ATTN_FLASH);
    snprintf(name, sizeof name, "attention_fwd %s%s%s", what, mode ? ", " : "", mode ? mode : "");
    report(name, time_it(f_attn_fwd, c), 5 * tensor_bytes, fwd_flops);
    snprintf(name, sizeof name, "attention_bwd %s%s%s", what, mode ? ", " : "", mode ? mode : "");
    report(name, time_it(f_attn_bwd, c), 8 * tensor_bytes, 2.5 * fwd_flops);
    if (mode) cai_cuda_attn_force(CAI_CUDA_ATTN_AUTO);
}
static void f_xent(void *x) {
    ctx_t *c = x;
    OK(G->ops->xent_fwd(G, &c->c, &c->d, &c->a, &c->b, 0, 50257, -100));
    OK(G->ops->xent_bwd(G, &c->a, &c->a, &c->d, &c->b, NULL, 1.0f / 8192, 0, 50257, -100));
}
static void f_xent_fused(void *x) {
    ctx_t *c = x;
    OK(G->ops->xent_fwd_bwd(G, &c->c, &c->d, &c->a, &c->a, &c->b, 1.0f / 8192, 0, 50257, -100));
}
static void f_emb_fwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->embedding_fwd(G, &c->d, &c->a, &c->b, &c->c, 0, 50304, 0));
}
static void f_emb_bwd(void *x) {
    ctx_t *c = x;
    OK(G->ops->embedding_bwd(G, &c->e, &c->f, &c->h, &c->g, 0, 0));
}
static void f_adamw(void *x) {
    ctx_t *c = x;
    OK(G->ops->adamw(G, &c->a, &c->b, &c->c, &c->d, &c->e, &c->hp, 1));
}
static void f_sumsq(void *x) {
    ctx_t *c = x;
    OK(G->ops->sumsq(G, &c->b, &c->a));
}

/* The experts' products of a Mixtral-shaped layer (bench/configs/mixtral-0.6b.yaml: 8192 tokens,
 * top-2 of 8 experts, d 1024, ffn 2048) as grouped products over uneven blocks (routing's
 * counts, 1536..2560 rows) against one linear of the same rows and FLOPs: what grouping costs. */
typedef struct {
    cai_tensor x, h, y, dh, dx, w, dw;
    cai_tensor *ws, *dws;
    const int64_t *rows;
    int n;
} moe_ctx;

static void f_dense_fwd(void *x) {
    moe_ctx *c = x;
    OK(G->ops->linear_fwd(G, &c->h, &c->x, &c->w, NULL));
}
static void f_grouped_fwd(void *x) {
    moe_ctx *c = x;
    OK(G->ops->grouped_linear_fwd(G, &c->h, &c->x, c->ws, c->rows, c->n));
}
static void f_dense_bwd(void *x) {
    moe_ctx *c = x;
    OK(G->ops->linear_bwd(G, &c->dx, &c->dw, NULL, &c->dh, &c->x, &c->w, 0));
}
static void f_grouped_bwd(void *x) {
    moe_ctx *c = x;
    OK(G->ops->grouped_linear_bwd(G, &c->dx, c->dws, &c->dh, &c->x, c->ws, c->rows, c->n, 0));
}

/* block b's rows of t */
static cai_tensor moe_block(const cai_tensor *t, const int64_t *rows, int b) {
    int64_t off = 0;
    for (int i = 0; i < b; i++) off += rows[i];
    cai_tensor r;
    OK(cai_tensor_slice0(t, off, rows[b], &r));
    return r;
}
static void f_loop_fwd(void *x) {
    moe_ctx *c = x;
    for (int b = 0; b < c->n; b++) {
        cai_tensor h = moe_block(&c->h, c->rows, b), xi = moe_block(&c->x, c->rows, b);
        OK(G->ops->linear_fwd(G, &h, &xi, &c->ws[b], NULL));
    }
}
static void f_loop_bwd(void *x) {
    moe_ctx *c = x;
    for (int b = 0; b < c->n; b++) {
        cai_tensor dx = moe_block(&c->dx, c->rows, b), dh = moe_block(&c->dh, c->rows, b),
                   xi = moe_block(&c->x, c->rows, b);
        OK(G->ops->linear_bwd(G, &dx, &c->dws[b], NULL, &dh, &xi, &c->ws[b], 0));
    }
}

/* One expert shape: grouped against dense and a loop of linears. */
static void bench_moe_shape(const char *what, const int64_t *rows, int E, int64_t IC, int64_t OC) {
    const cai_dtype BF = CAI_DTYPE_BF16, F32 = CAI_DTYPE_F32;
    int64_t R = 0;
    for (int e = 0; e < E; e++) R += rows[e];
    moe_ctx c = {.rows = rows, .n = E};
    cai_tensor *ws = calloc((size_t)E * 2, sizeof *ws);
    if (!ws) exit(1);
    c.x = dev_tensor(BF, 2, SHP(R, IC), 1.0f);
    c.h = dev_tensor(BF, 2, SHP(R, OC), 1.0f);
    c.dh = dev_tensor(BF, 2, SHP(R, OC), 1.0f);
    c.dx = dev_tensor(BF, 2, SHP(R, IC), 1.0f);
    c.w = dev_tensor(BF, 2, SHP(OC, IC), 0.02f);
    c.dw = dev_tensor(F32, 2, SHP(OC, IC), 0.0f);
    for (int e = 0; e < E; e++) {
        ws[e] = dev_tensor(BF, 2, SHP(OC, IC), 0.02f);
        ws[E + e] = dev_tensor(F32, 2, SHP(OC, IC), 0.0f);
    }
    c.ws = ws;
    c.dws = ws + E;
    const double fl = 2.0 * R * IC * OC, by = 2.0 * R * (IC + OC);
    char name[128];
    snprintf(name, sizeof name, "moe %s dense fwd", what);
    report(name, time_it(f_dense_fwd, &c), by + 2.0 * IC * OC, fl);
    snprintf(name, sizeof name, "moe %s grouped fwd (%d)", what, E);
    report(name, time_it(f_grouped_fwd, &c), by + E * 2.0 * IC * OC, fl);
    snprintf(name, sizeof name, "moe %s loop of %d linear_fwd", what, E);
    report(name, time_it(f_loop_fwd, &c), by + E * 2.0 * IC * OC, fl);
    snprintf(name, sizeof name, "moe %s dense bwd (dx, f32 dW)", what);
    report(name, time_it(f_dense_bwd, &c), 2 * by + 10.0 * IC * OC, 2 * fl);
    snprintf(name, sizeof name, "moe %s grouped bwd (%d)", what, E);
    report(name, time_it(f_grouped_bwd, &c), 2 * by + E * 10.0 * IC * OC, 2 * fl);
    snprintf(name, sizeof name, "moe %s loop of %d linear_bwd", what, E);
    report(name, time_it(f_loop_bwd, &c), 2 * by + E * 10.0 * IC * OC, 2 * fl);
    free_all();
    free(ws);
}

/* grouped_linear_* as CAI_CUDA_GROUPED chooses (run the bench under each value to compare) */
static void bench_moe(void) {
    static const int64_t rows8[8] = {1536, 2560, 1792, 2304, 2048, 2048, 1600, 2496}; /* 16384 */
    bench_moe_shape("8x2048 [.,1024]->2048", rows8, 8, 1024, 2048);
    bench_moe_shape("8x2048 [.,2048]->1024", rows8, 8, 2048, 1024);
    /* fine-grained experts (DeepSeek-style): 64 of about 256 rows, hidden 512 */
    int64_t rows64[64];
    for (int e = 0; e < 64; e++) rows64[e] = 192 + (e * 37) % 129; /* 192..320 */
    bench_moe_shape("64x256 [.,1024]->512", rows64, 64, 1024, 512);
    bench_moe_shape("64x256 [.,512]->1024", rows64, 64, 512, 1024);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1) g_reps = atoi(argv[1]) > 0 ? atoi(argv[1]) : g_reps;
    /* a second argument names one section: moe */
    const char *only = argc > 2 ? argv[2] : NULL;
    cai_status st = cai_device_init(&G, CAI_DEVICE_CUDA, 0, 0);
    if (st == CAI_ERR_UNSUPPORTED) {
        printf("SKIP: %s\n", cai_error_message());
        return 77;
    }
    OK(st);
    printf("CUDA op timings on %s, %d reps after 3 warm-ups (mean)\n", G->name, g_reps);
    const cai_dtype BF = CAI_DTYPE_BF16, F32 = CAI_DTYPE_F32;
    const int64_t N = 8192, C = 768, H = 12, D = 64, V = 50304, B = 8, T = 1024;
    ctx_t c;

    /* ceilings */
    memset(&c, 0, sizeof c);
    c.a = dev_tensor(F32, 1, SHP((int64_t)1 << 28), 1.0f);
    c.b = dev_tensor(F32, 1, SHP((int64_t)1 << 28), 1.0f);
    double s = time_it(f_copy, &c);
    g_bw = 2.0 * 4 * (double)(1 << 28) / s;
    free_all();
    memset(&c, 0, sizeof c);
    c.a = dev_tensor(BF, 2, SHP(8192, 8192), 1.0f);
    c.b = dev_tensor(BF, 2, SHP(8192, 8192), 1.0f);
    c.c = dev_tensor(BF, 2, SHP(8192, 8192), 1.0f);
    s = time_it(f_matmul, &c);
    g_mm = 2.0 * 8192.0 * 8192.0 * 8192.0 / s;
    free_all();
    printf("ceilings: copy %.2f TB/s (read + write), bf16 matmul 8192^3 %.0f TFLOP/s\n\n", g_bw / 1e12, g_mm / 1e12);
    printf("%-44s %12s  %12s  %15s  %16s  %s\n", "op", "time", "bandwidth", "compute", "", "of roofline");
    if (!only || !strcmp(only, "moe")) bench_moe();
    if (only) {
        cai_device_free(G);
        return 0;
    }

    /* linear layers */
    struct {
        const char *name;
        int64_t out;
        cai_dtype dt;
        int bias;
    } lin[] = {{"linear_fwd qkv bf16 +bias [8192,768]->2304", 3 * C, BF, 1},
               {"linear_fwd fc bf16 +bias [8192,768]->3072", 4 * C, BF, 1},
               {"linear_fwd fc f32 (exact) [8192,768]->3072", 4 * C, F32, 1},
               {"linear_fwd lm_head bf16 [8192,768]->50304", V, BF, 0}};
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
        memset(&c, 0, sizeof c);
        c.a = dev_tensor(lin[i].dt, 2, SHP(N, C), 1.0f);
        c.b = dev_tensor(lin[i].dt, 2, SHP(lin[i].out, C), 0.05f);
        c.c = dev_tensor(lin[i].dt, 2, SHP(N, lin[i].out), 1.0f);
        if (lin[i].bias) c.d = dev_tensor(lin[i].dt, 1, SHP(lin[i].out), 1.0f);
        double es = (double)cai_dtype_size(lin[i].dt);
        double bytes = es * (double)(N * C + lin[i].out * C + N * lin[i].out);
        report(lin[i].name, time_it(f_linear, &c), bytes, 2.0 * N * C * lin[i].out);
        if (i == 1) {
            c.e = dev_tensor(BF, 2, SHP(N, C), 1.0f);
            c.f = dev_tensor(F32, 2, SHP(4 * C, C), 1.0f);
            c.g = dev_tensor(F32, 1, SHP(4 * C), 1.0f);
            report("linear_bwd fc bf16 (dinp, dW f32, db)", time_it(f_linear_bwd, &c),
                   2.0 * (2 * N * 4 * C + N * C + 4 * C * C) + 4.0 * 2 * 4 * C * C, 4.0 * N * C * 4 * C);
        }
        free_all();
    }

    /* layernorm, gelu */
    memset(&c, 0, sizeof c);
    c.a = dev_tensor(BF, 2, SHP(N, C), 1.0f);
    c.b = dev_tensor(BF, 2, SHP(N, C), 1.0f);
    c.c = dev_tensor(BF, 1, SHP(C), 1.0f);
    c.d = dev_tensor(BF, 1, SHP(C), 1.0f);
    c.e = dev_tensor(F32, 1, SHP(N), 1.0f);
    c.f = dev_tensor(F32, 1, SHP(N), 1.0f);
    c.g = dev_tensor(BF, 2, SHP(N, C), 1.0f);
    c.h = dev_tensor(F32, 1, SHP(C), 1.0f);
    report("layernorm_fwd bf16 [8192,768]", time_it(f_ln_fwd, &c), 2.0 * 2 * N * C + 8.0 * N, 0);
    OK(G->ops->layernorm_fwd(G, &c.b, &c.e, &c.f, &c.a, &c.c, &c.d, 1e-5f));
    report("layernorm_bwd bf16 (dinp +=, dweight)", time_it(f_ln_bwd, &c), 2.0 * 4 * N * C + 8.0 * N, 0);
    g_dbias = dev_tensor(F32, 1, SHP(C), 1.0f);
    report("layernorm_bwd bf16 (dinp +=, dweight, dbias)", time_it(f_ln_bwd_full, &c), 2.0 * 4 * N * C + 8.0 * N, 0);
    report("rmsnorm_fwd bf16 [8192,768]", time_it(f_rms_fwd, &c), 2.0 * 2 * N * C + 4.0 * N, 0);
    report("rmsnorm_bwd bf16 (dinp =, dweight)", time_it(f_rms_bwd, &c), 2.0 * 3 * N * C + 4.0 * N, 0);
    report("add bf16 [8192,768]", time_it(f_add, &c), 2.0 * 3 * N * C, 0);
    free_all();
    memset(&c, 0, sizeof c);
    c.a = dev_tensor(BF, 2, SHP(N, 4 * C), 1.0f);
    c.b = dev_tensor(BF, 2, SHP(N, 4 * C), 1.0f);
    report("gelu_fwd bf16 [8192,3072]", time_it(f_gelu, &c), 2.0 * 2 * N * 4 * C, 0);
    c.c = dev_tensor(BF, 2, SHP(N, 4 * C), 1.0f);
    report("gelu_bwd bf16 [8192,3072]", time_it(f_gelu_bwd, &c), 2.0 * 3 * N * 4 * C, 0);
    free_all();

    /* GPT-2's MLP GELU fused into the matmuls (cuBLASLt GELU_AUX_BIAS / DGELU
     * epilogues) against linear + separate GELU kernels, at 32 x 1024 tokens.
     * Both lines of a pair use the fused op's minimal traffic, so their
     * roofline percentages compare directly. */
    {
        const int64_t NF = 32768, F = 4 * C;
        memset(&c, 0, sizeof c);
        c.a = dev_tensor(BF, 2, SHP(NF, C), 1.0f);
        c.b = dev_tensor(BF, 2, SHP(F, C), 0.05f);
        c.c = dev_tensor(BF, 2, SHP(NF, F), 1.0f);
        c.d = dev_tensor(BF, 1, SHP(F), 1.0f);
        c.e = dev_tensor(BF, 2, SHP(NF, F), 1.0f);
        double fb = 2.0 * (double)(NF * C + F * C + 2 * NF * F), ff = 2.0 * NF * C * F;
        report("linear_fwd+gelu_fwd bf16 [32768,768]->3072", time_it(f_lin_then_gelu, &c), fb, ff);
        report("linear_gelu_fwd bf16 (fused)", time_it(f_lin_gelu, &c), fb, ff);
        c.f = dev_tensor(BF, 2, SHP(C, F), 0.05f);
        c.g = dev_tensor(BF, 2, SHP(NF, C), 1.0f);
        c.h = dev_tensor(BF, 2, SHP(NF, F), 1.0f);
        g_dw2 = dev_tensor(F32, 2, SHP(C, F), 1.0f);
        g_db2 = dev_tensor(F32, 1, SHP(C), 1.0f);
        double bb = 2.0 * (double)(NF * C + C * F + 3 * NF * F) + 8.0 * C * F, bf = 4.0 * NF * C * F;
        report("linear_bwd+gelu_bwd bf16 [32768,3072]->768", time_it(f_lin_bwd_then_gelu_bwd, &c), bb, bf);
        report("linear_bwd_dgelu bf16 (fused)", time_it(f_lin_bwd_dgelu, &c), bb, bf);
        free_all();
    }

    /* The block's output projections with the residual add fused (cuBLASLt
     * C input, beta = 1) against linear_fwd + add, at 32 x 1024 tokens. Both
     * lines use the fused op's minimal traffic (inp, weight, residual, out). */
    {
        const int64_t NR = 32768;
        memset(&c, 0, sizeof c);
        c.a = dev_tensor(BF, 2, SHP(NR, C), 1.0f);
        c.b = dev_tensor(BF, 2, SHP(C, C), 0.05f);
        c.c = dev_tensor(BF, 2, SHP(NR, C), 1.0f);
        c.d = dev_tensor(BF, 1, SHP(C), 1.0f);
        c.e = dev_tensor(BF, 2, SHP(NR, C), 1.0f);
        c.f = dev_tensor(BF, 2, SHP(NR, C), 1.0f);
        double rb = 2.0 * (double)(3 * NR * C + C * C), rf = 2.0 * NR * C * C;
        report("linear_fwd+add bf16 [32768,768]->768", time_it(f_lin_then_add, &c), rb, rf);
        report("linear_residual_fwd bf16 (fused)", time_it(f_lin_resid, &c), rb, rf);
        free_all();
    }

    /* attention on views of a fused QKV buffer */
    memset(&c, 0, sizeof c);
    cai_tensor qkv = dev_tensor(BF, 3, SHP(B, T, 3 * C), 1.0f), dqkv = dev_tensor(BF, 3, SHP(B, T, 3 * C), 1.0f);
    cai_tensor t3;
    OK(cai_tensor_narrow(&qkv, 2, 0, C, &t3));
    OK(cai_tensor_unflatten(&t3, 2, D, &c.a));
    OK(cai_tensor_narrow(&qkv, 2, C, C, &t3));
    OK(cai_tensor_unflatten(&t3, 2, D, &c.b));
    OK(cai_tensor_narrow(&qkv, 2, 2 * C, C, &t3));
    OK(cai_tensor_unflatten(&t3, 2, D, &c.c));
    OK(cai_tensor_narrow(&dqkv, 2, 0, C, &t3));
    OK(cai_tensor_unflatten(&t3, 2, D, &c.g));
    OK(cai_tensor_narrow(&dqkv, 2, C, C, &t3));
    OK(cai_tensor_unflatten(&t3, 2, D, &c.h));
    OK(cai_tensor_narrow(&dqkv, 2, 2 * C, C, &t3));
    OK(cai_tensor_unflatten(&t3, 2, D, &c.f));
    c.d = dev_tensor(BF, 4, SHP(B, T, H, D), 1.0f);
    c.e = dev_tensor(F32, 3, SHP(B, H, T), 1.0f);
    c.p = (cai_attn_params){.causal = 1};
    c.wsb = G->ops->attention_workspace_bytes(G, B, T, T, H, H, D);
    OK(cai_device_alloc(G, c.wsb, "ws", &c.ws));
    g_dev[g_ndev++] = c.ws;
    double af = 4.0 * B * H * (double)T * T * D / 2; /* causal: half the score matrix */
    /* default: the flash kernels (attention_flash.cu); then the WMMA and CUDA-core ones */
    bench_attn(&c, "bf16 causal B8 T1024 H12 D64", NULL, 2.0 * B * T * C, af);
    bench_attn(&c, "same", "flash", 2.0 * B * T * C, af);
    bench_attn(&c, "same", "tc", 2.0 * B * T * C, af);
    bench_attn(&c, "same", "simt", 2.0 * B * T * C, af);
    free_all();

    /* flash attention at head_dim 128 (Llama-style), contiguous q/k/v, same tokens and width */
    {
        const int64_t H2 = 6, D2 = 128;
        memset(&c, 0, sizeof c);
        c.a = dev_tensor(BF, 4, SHP(B, T, H2, D2), 1.0f);
        c.b = dev_tensor(BF, 4, SHP(B, T, H2, D2), 1.0f);
        c.c = dev_tensor(BF, 4, SHP(B, T, H2, D2), 1.0f);
        c.d = dev_tensor(BF, 4, SHP(B, T, H2, D2), 1.0f);
        c.e = dev_tensor(F32, 3, SHP(B, H2, T), 1.0f);
        c.f = dev_tensor(BF, 4, SHP(B, T, H2, D2), 1.0f);
        c.g = dev_tensor(BF, 4, SHP(B, T, H2, D2), 1.0f);
        c.h = dev_tensor(BF, 4, SHP(B, T, H2, D2), 1.0f);
        c.p = (cai_attn_params){.causal = 1};
        c.wsb = G->ops->attention_workspace_bytes(G, B, T, T, H2, H2, D2);
        OK(cai_device_alloc(G, c.wsb, "ws", &c.ws));
        g_dev[g_ndev++] = c.ws;
        double af2 = 4.0 * B * H2 * (double)T * T * D2 / 2;
        bench_attn(&c, "bf16 causal B8 T1024 H6 D128", NULL, 2.0 * B * T * C, af2);
        bench_attn(&c, "same D128", "flash", 2.0 * B * T * C, af2);
        bench_attn(&c, "same D128", "tc", 2.0 * B * T * C, af2);
        free_all();
    }

    /* fused softmax + cross-entropy, forward and in-place backward */
    memset(&c, 0, sizeof c);
    c.a = dev_tensor(BF, 2, SHP(N, V), 2.0f);
    int32_t *tg = malloc(N * 4);
    for (int64_t i = 0; i < N; i++) tg[i] = (int32_t)((i * 7919) % 50257);
    c.b = dev_tensor(CAI_DTYPE_I32, 1, SHP(N), 1.0f);
    OK(cai_device_copy(G, c.b.data, tg, N * 4, CAI_COPY_H2D));
    free(tg);
    c.c = dev_tensor(F32, 1, SHP(N), 1.0f);
    c.d = dev_tensor(F32, 1, SHP(N), 1.0f);
    report("xent_fwd then xent_bwd in place bf16 [8192,50304]", time_it(f_xent, &c), 2.0 * 3 * N * V, 0);
    report("xent_fwd_bwd fused in place bf16", time_it(f_xent_fused, &c), 2.0 * 2 * N * V, 0);
    report("xent_fwd bf16 [8192,50304]", time_it(f_xent_fwd, &c), 2.0 * N * V, 0);
    report("xent_bwd in place bf16 [8192,50304]", time_it(f_xent_bwd, &c), 2.0 * 2 * N * V, 0);
    free_all();

    /* embeddings */
    memset(&c, 0, sizeof c);
    c.a = dev_tensor(CAI_DTYPE_I32, 2, SHP(B, T), 1.0f);
    c.b = dev_tensor(BF, 2, SHP(V, C), 1.0f);
    c.c = dev_tensor(BF, 2, SHP(1024, C), 1.0f);
    c.d = dev_tensor(BF, 3, SHP(B, T, C), 1.0f);
    c.e = dev_tensor(F32, 2, SHP(V, C), 1.0f);
    c.f = dev_tensor(F32, 2, SHP(1024, C), 1.0f);
    report("embedding_fwd bf16 (wte + wpe)", time_it(f_emb_fwd, &c), 2.0 * 3 * N * C, 0);
    {
        /* The backward at a GPT-2 124M step's 32 x 1024 tokens, Zipf-distributed
         * like text (rank r has weight 1/r: the top id is ~9% of the tokens,
         * runs of thousands of rows), frequent ids spread over the vocabulary.
         * Bytes: dout read for dwte and for dwpe, dwpe and the touched dwte rows
         * read and written in f32. */
        const int64_t BE = 32, NE = BE * T, VZ = 50257;
        double *cdf = malloc((size_t)VZ * sizeof(double));
        int32_t *tz = malloc((size_t)NE * sizeof(int32_t));
        char *hit = calloc((size_t)VZ, 1);
        if (!cdf || !tz || !hit) exit(1);
        double acc = 0.0;
        for (int64_t r = 0; r < VZ; r++) cdf[r] = acc += 1.0 / (double)(r + 1);
        uint64_t st = 88172645463325252ull;
        int64_t distinct = 0;
        for (int64_t i = 0; i < NE; i++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            const double u = (double)(st >> 11) * 0x1.0p-53 * acc;
            int64_t lo = 0, hi = VZ - 1;
            while (lo < hi) { /* the first rank whose cdf exceeds u */
                const int64_t mid = (lo + hi) / 2;
                if (cdf[mid] > u) hi = mid;
                else lo = mid + 1;
            }
            tz[i] = (int32_t)((lo * 7919 + 13) % VZ); /* a bijection: 7919 is prime to 50257 = 29 * 1733 */
            if (!hit[tz[i]]) hit[tz[i]] = 1, distinct++;
        }
        c.g = dev_tensor(CAI_DTYPE_I32, 2, SHP(BE, T), 1.0f);
        OK(cai_device_copy(G, c.g.data, tz, (size_t)NE * 4, CAI_COPY_H2D));
        OK(cai_device_sync(G));
        c.h = dev_tensor(BF, 3, SHP(BE, T, C), 1.0f);
        free(cdf);
        free(tz);
        free(hit);
        report("embedding_bwd (sort + ordered sums)", time_it(f_emb_bwd, &c),
               2.0 * 2 * NE * C + 8.0 * (T + distinct) * C, 0);
    }
    free_all();

    /* optimizer and grad norm over 124M parameters */
    memset(&c, 0, sizeof c);
    const int64_t P = 124439808;
    c.a = dev_tensor(F32, 1, SHP(P), 0.02f);
    c.b = dev_tensor(F32, 1, SHP(P), 1e-3f);
    c.c = dev_tensor(F32, 1, SHP(P), 1e-3f);
    c.d = dev_tensor(F32, 1, SHP(P), 1e-3f);
    OK(G->ops->fill(G, &c.d, 1e-6f));
    c.e = dev_tensor(BF, 1, SHP(P), 1.0f);
    c.f = dev_tensor(F32, 1, SHP(1), 0.0f);
    c.hp = (cai_adamw_params){
        .lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 10, .grad_scale = 1.0f};
    report("adamw 124M f32 + bf16 copy", time_it(f_adamw, &c), 30.0 * P, 0);
    c.b = c.f;
    report("sumsq 124M f32 (grad norm)", time_it(f_sumsq, &c), 4.0 * P, 0);
    c.b = dev_tensor(BF, 1, SHP(P), 1.0f);
    report("copy 124M f32 -> bf16", time_it(f_copy, &c), 6.0 * P, 0);
    cai_tensor t32 = c.a;
    c.a = c.b;
    c.b = t32;
    report("copy 124M bf16 -> f32", time_it(f_copy, &c), 6.0 * P, 0);
    free_all();

    cai_device_free(G);
    return 0;
}
