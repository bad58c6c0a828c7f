/* GPU tests of the FP8 path (docs/fp8.md): the CUDA casts give the CPU
 * backend's codes and scales bit for bit (f32 and bf16 inputs, specials),
 * cuBLASLt's FP8 products equal the CPU emulation (products of the decoded
 * codes) up to f32 accumulation order, in every format pair, F32 and BF16
 * outputs, beta 0 and 1; sizes cuBLASLt refuses fail cleanly; an FP8
 * linear layer (colossal/fp8.h) on bf16 activations matches the CPU's; and
 * FP8 against bf16 matrix-product throughput at a large shape (printed).
 *
 * Exits 77 (skipped) when no GPU is visible. Run on the GPU machine:
 * tests/gpu/test_cuda_fp8 (exit 0: all passed). */
#include "cai_config.h"
#include "colossal/fp8.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static cai_device_t *G, *H;
static int n_pass, n_fail;

#define OK(expr)                                                                                      \
    do {                                                                                              \
        cai_status st_ = (expr);                                                                      \
        if (st_ != CAI_OK) {                                                                          \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cai_error_message()); \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

static void expect(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void expect(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  %s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    ok ? n_pass++ : n_fail++;
}

static void *up(const void *host, size_t bytes) {
    void *d = NULL;
    OK(cai_device_alloc(G, bytes ? bytes : 1, "test", &d));
    if (bytes && host) OK(cai_device_copy(G, d, host, bytes, CAI_COPY_H2D));
    return d;
}
static void down(void *host, const void *dev, size_t bytes) { OK(cai_device_copy(G, host, dev, bytes, CAI_COPY_D2H)); }

static float *randn(int64_t n, uint64_t stream, float scale) {
    float *p = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) p[i] = scale * (float)cai_rng_normal(4242, stream, (uint64_t)i);
    return p;
}

/* x in dtype dt on the GPU; *hx receives the f32 values the GPU holds */
static void *upload_as(const float *x, int64_t n, cai_dtype dt, float *hx) {
    size_t es = cai_dtype_size(dt);
    void *tmp = malloc((size_t)n * es);
    OK(cai_convert_host(tmp, dt, x, CAI_DTYPE_F32, (size_t)n));
    OK(cai_convert_host(hx, CAI_DTYPE_F32, tmp, dt, (size_t)n));
    void *d = up(tmp, (size_t)n * es);
    free(tmp);
    return d;
}

static void cast_case(int64_t R, int64_t C) {
    const int64_t n = R * C;
    const cai_dtype dts[2] = {CAI_DTYPE_F32, CAI_DTYPE_BF16};
    for (int di = 0; di < 2; di++)
        for (int fmt = 0; fmt < 2; fmt++)
            for (int mode = 0; mode < 3; mode++) { /* current, first delayed (scale 0), delayed with a scale */
                float *x = randn(n, 11 + (uint64_t)fmt, 3.0f), *hx = malloc((size_t)n * 4);
                if (mode == 2) { /* specials: saturation, infinities, NaN of both signs, tiny values */
                    const float sp[] = {1e30f, -1e30f, INFINITY, -INFINITY, NAN, -NAN, 1e-30f, -3e-7f, 0.0f, -0.0f};
                    for (int i = 0; i < 10; i++) x[i * 37] = sp[i];
                }
                void *dx = upload_as(x, n, dts[di], hx);
                float meta_init[3] = {mode == 2 ? 1 / 7.5f : 0.0f, mode == 2 ? 7.5f : 0.0f, 0.5f};
                float hmeta[3], gmeta[3];
                memcpy(hmeta, meta_init, sizeof hmeta);
                uint8_t *hq = malloc((size_t)n), *hqt = malloc((size_t)n), *gq = malloc((size_t)n),
                        *gqt = malloc((size_t)n);
                void *dq = up(NULL, (size_t)n), *dqt = up(NULL, (size_t)n), *dm = up(meta_init, sizeof meta_init);
                cai_tensor X = cai_tensor_2d(G, dx, dts[di], R, C), Q = cai_tensor_2d(G, dq, CAI_DTYPE_U8, R, C),
                           QT = cai_tensor_2d(G, dqt, CAI_DTYPE_U8, C, R), M = cai_tensor_1d(G, dm, CAI_DTYPE_F32, 3);
                cai_tensor hX = cai_tensor_2d(H, hx, CAI_DTYPE_F32, R, C),
                           hQ = cai_tensor_2d(H, hq, CAI_DTYPE_U8, R, C),
                           hQT = cai_tensor_2d(H, hqt, CAI_DTYPE_U8, C, R),
                           hM = cai_tensor_1d(H, hmeta, CAI_DTYPE_F32, 3);
                OK(G->ops->fp8_cast(G, &Q, &QT, &X, &M, (cai_fp8_format)fmt, mode == 0, 1));
                OK(H->ops->fp8_cast(H, &hQ, &hQT, &hX, &hM, (cai_fp8_format)fmt, mode == 0, 1));
                down(gq, dq, (size_t)n);
                down(gqt, dqt, (size_t)n);
                down(gmeta, dm, sizeof gmeta);
                int64_t bad = 0, first = -1;
                /* a NaN's sign is not part of the contract: both codes NaN agree */
                const cai_fp8_format ff = (cai_fp8_format)fmt;
#define SAME_CODE(x, y) ((x) == (y) || (isnan(cai_fp8_to_f32((x), ff)) && isnan(cai_fp8_to_f32((y), ff))))
                for (int64_t i = 0; i < n; i++)
                    if (!SAME_CODE(gq[i], hq[i]) || !SAME_CODE(gqt[i], hqt[i])) {
                        bad++;
                        if (first < 0) first = i;
                    }
#undef SAME_CODE
                int meta_same = memcmp(gmeta, hmeta, sizeof gmeta) == 0 ||
                                (isnan(gmeta[2]) && isnan(hmeta[2]) && gmeta[0] == hmeta[0]);
                expect(
                    bad == 0 && meta_same,
                    "cast [%lld,%lld] %s -> %s (%s): %lld codes differ (first at %lld: gpu 0x%02x cpu 0x%02x), meta gpu "
                    "{%g, %g, %g} cpu {%g, %g, %g}",
                    (long long)R, (long long)C, cai_dtype_name(dts[di]), cai_fp8_format_name((cai_fp8_format)fmt),
                    mode == 0   ? "current"
                    : mode == 1 ? "delayed, first cast"
                                : "delayed, specials",
                    (long long)bad, (long long)first, first >= 0 ? gq[first] : 0, first >= 0 ? hq[first] : 0,
                    (double)gmeta[0], (double)gmeta[1], (double)gmeta[2], (double)hmeta[0], (double)hmeta[1],
                    (double)hmeta[2]);
                cai_device_dealloc(G, dx), cai_device_dealloc(G, dq), cai_device_dealloc(G, dqt);
                cai_device_dealloc(G, dm);
                free(x), free(hx), free(hq), free(hqt), free(gq), free(gqt);
            }
}

/* Shapes: tiles cut at both edges; rows not a multiple of 8 (qt stored a
 * code at a time); columns not a multiple of 8 (the one-element kernel);
 * more tiles than one pass of the grid covers. */
static void t_cast(void) {
    const int64_t shapes[][2] = {{96, 80}, {99, 80}, {96, 77}, {4100, 768}};
    for (int si = 0; si < 4; si++) cast_case(shapes[si][0], shapes[si][1]);
}

static double rel_max(const float *got, const float *ref, int64_t n) {
    double num = 0, den = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (e > num || e != e) num = e != e ? INFINITY : e;
        den = fmax(den, fabs((double)ref[i]));
    }
    return num / den;
}

/* fp8_gemm's epilogues: none; a bias and a separate C (a residual, beta 1);
 * GELU with a bias, its input kept in aux; GELU's gradient from aux. */
enum { EP_NONE, EP_BIAS_CIN, EP_GELU, EP_DGELU };
static const char *const ep_names[] = {"", ", bias + c_in", ", gelu + bias", ", dgelu"};

static void gemm_case_ep(int64_t M, int64_t N, int64_t K, cai_fp8_format fa, cai_fp8_format fb, cai_dtype cdt,
                         float beta, int epi) {
    float *a = randn(M * K, 21, 1.5f), *b = randn(N * K, 22, 0.02f), *c0 = randn(M * N, 23, 1.0f);
    float *bias = randn(N, 24, 0.5f), *hbias = malloc((size_t)N * 4), *hx = malloc((size_t)(M * N) * 4),
          *hx_out = calloc((size_t)(M * N), 4);
    void *dbias = upload_as(bias, N, cdt, hbias), *dx = upload_as(c0, M * N, cdt, hx);
    const int64_t es = (int64_t)cai_dtype_size(cdt);
    float ma[3] = {0}, mb[3] = {0};
    uint8_t *qa = malloc((size_t)(M * K)), *qb = malloc((size_t)(N * K));
    cai_tensor A = cai_tensor_2d(H, a, CAI_DTYPE_F32, M, K), B = cai_tensor_2d(H, b, CAI_DTYPE_F32, N, K),
               QA = cai_tensor_2d(H, qa, CAI_DTYPE_U8, M, K), QB = cai_tensor_2d(H, qb, CAI_DTYPE_U8, N, K),
               MA = cai_tensor_1d(H, ma, CAI_DTYPE_F32, 3), MB = cai_tensor_1d(H, mb, CAI_DTYPE_F32, 3);
    OK(H->ops->fp8_cast(H, &QA, NULL, &A, &MA, fa, 1, 0));
    OK(H->ops->fp8_cast(H, &QB, NULL, &B, &MB, fb, 1, 0));
    /* the reference: the CPU emulation, with C rounded to cdt first */
    float *hc = malloc((size_t)(M * N) * 4), *gc = malloc((size_t)(M * N) * 4);
    void *dc = upload_as(c0, M * N, cdt, hc);
    size_t wsb = H->ops->fp8_gemm_workspace_bytes(H, M, N, K);
    void *ws = malloc(wsb);
    cai_tensor hC = cai_tensor_2d(H, hc, CAI_DTYPE_F32, M, N), hB = cai_tensor_1d(H, hbias, CAI_DTYPE_F32, N),
               hX = cai_tensor_2d(H, epi == EP_GELU ? hx_out : hx, CAI_DTYPE_F32, M, N);
    cai_tensor gX = cai_tensor_2d(G, dx, cdt, M, N), gBias = cai_tensor_1d(G, dbias, cdt, N);
    cai_fp8_epilogue hep = {0}, gep = {0};
    if (epi == EP_BIAS_CIN) { /* c_in is hx / dx; c starts as garbage */
        hep = (cai_fp8_epilogue){.c_in = &hX, .bias = &hB};
        gep = (cai_fp8_epilogue){.c_in = &gX, .bias = &gBias};
    } else if (epi == EP_GELU) { /* aux receives the pre-activation */
        hep = (cai_fp8_epilogue){.bias = &hB, .act = CAI_FP8_ACT_GELU, .aux = &hX};
        gep = (cai_fp8_epilogue){.bias = &gBias, .act = CAI_FP8_ACT_GELU, .aux = &gX};
    } else if (epi == EP_DGELU) { /* aux holds the pre-activation */
        hep = (cai_fp8_epilogue){.act = CAI_FP8_ACT_DGELU, .aux = &hX};
        gep = (cai_fp8_epilogue){.act = CAI_FP8_ACT_DGELU, .aux = &gX};
    }
    OK(H->ops->fp8_gemm(H, &hC, &QA, fa, &MA, &QB, fb, &MB, beta, epi ? &hep : NULL, ws, wsb));
    void *dqa = up(qa, (size_t)(M * K)), *dqb = up(qb, (size_t)(N * K)), *dma = up(ma, 12), *dmb = up(mb, 12);
    cai_tensor gA = cai_tensor_2d(G, dqa, CAI_DTYPE_U8, M, K), gB = cai_tensor_2d(G, dqb, CAI_DTYPE_U8, N, K),
               gMA = cai_tensor_1d(G, dma, CAI_DTYPE_F32, 3), gMB = cai_tensor_1d(G, dmb, CAI_DTYPE_F32, 3),
               gC = cai_tensor_2d(G, dc, cdt, M, N);
    cai_status st = G->ops->fp8_gemm(G, &gC, &gA, fa, &gMA, &gB, fb, &gMB, beta, epi ? &gep : NULL, NULL, 0);
    double e = INFINITY;
    if (st == CAI_OK) {
        void *tmp = malloc((size_t)(M * N) * (size_t)es);
        down(tmp, dc, (size_t)(M * N * es));
        OK(cai_convert_host(gc, CAI_DTYPE_F32, tmp, cdt, (size_t)(M * N)));
        e = rel_max(gc, hc, M * N);
        if (epi == EP_GELU) { /* and the kept pre-activation */
            down(tmp, dx, (size_t)(M * N * es));
            OK(cai_convert_host(gc, CAI_DTYPE_F32, tmp, cdt, (size_t)(M * N)));
            e = fmax(e, rel_max(gc, hx_out, M * N));
        }
        free(tmp);
    } else {
        printf("  fp8_gemm: %s\n", cai_error_message());
        cai_error_clear();
    }
    /* Hopper's FP8 tensor cores accumulate in fewer bits than f32 (measured
     * on an H200: up to 1.2e-4 of max |ref| at K = 2048); the CPU reference
     * accumulates in f32 */
    double tol = cdt == CAI_DTYPE_F32 ? 3e-4 : 8e-3;
    expect(e <= tol, "gemm [%lld,%lld,%lld] %s x %s -> %s, beta %g%s: max error %.3g of max |ref| (tol %.0e)",
           (long long)M, (long long)N, (long long)K, cai_fp8_format_name(fa), cai_fp8_format_name(fb),
           cai_dtype_name(cdt), (double)beta, ep_names[epi], e, tol);
    cai_device_dealloc(G, dc), cai_device_dealloc(G, dqa), cai_device_dealloc(G, dqb);
    cai_device_dealloc(G, dbias), cai_device_dealloc(G, dx);
    free(bias), free(hbias), free(hx), free(hx_out);
    cai_device_dealloc(G, dma), cai_device_dealloc(G, dmb);
    free(a), free(b), free(c0), free(qa), free(qb), free(hc), free(gc), free(ws);
}

static void gemm_case(int64_t M, int64_t N, int64_t K, cai_fp8_format fa, cai_fp8_format fb, cai_dtype cdt,
                      float beta) {
    gemm_case_ep(M, N, K, fa, fb, cdt, beta, EP_NONE);
}

static void t_gemm(void) {
    const cai_fp8_format E4 = CAI_FP8_E4M3, E5 = CAI_FP8_E5M2;
    gemm_case(16, 16, 16, E4, E4, CAI_DTYPE_F32, 0);
    gemm_case(64, 48, 32, E4, E4, CAI_DTYPE_F32, 0);
    gemm_case(64, 48, 32, E5, E4, CAI_DTYPE_F32, 1);
    gemm_case(256, 128, 768, E4, E5, CAI_DTYPE_F32, 1);
    gemm_case(256, 128, 768, E4, E4, CAI_DTYPE_BF16, 0);
    gemm_case(512, 768, 3072, E5, E4, CAI_DTYPE_BF16, 1);
    /* GPT-2 124M's attention input projection at 2048 rows: forward, input gradient, weight gradient */
    gemm_case(2048, 2304, 768, E4, E4, CAI_DTYPE_BF16, 0);
    gemm_case(2048, 768, 2304, E5, E4, CAI_DTYPE_BF16, 0);
    gemm_case(2304, 768, 2048, E5, E4, CAI_DTYPE_F32, 1);
    /* the epilogues of GPT-2's linears: residual projections, fc + GELU, its backward */
    for (int cd = 0; cd < 2; cd++) {
        const cai_dtype dt = cd ? CAI_DTYPE_BF16 : CAI_DTYPE_F32;
        gemm_case_ep(2048, 768, 768, E4, E4, dt, 1, EP_BIAS_CIN);
        gemm_case_ep(2048, 3072, 768, E4, E4, dt, 0, EP_GELU);
        gemm_case_ep(2048, 3072, 768, E5, E4, dt, 0, EP_DGELU);
        gemm_case_ep(64, 48, 32, E4, E4, dt, 0, EP_GELU);
    }
    /* sizes cuBLASLt's FP8 kernels refuse: a clean error, nothing launched */
    uint8_t *q = up(NULL, 32 * 32);
    float m[3] = {1, 1, 0}, *dm = up(m, 12), *dc = up(NULL, 32 * 32 * 4);
    cai_tensor A = cai_tensor_2d(G, q, CAI_DTYPE_U8, 17, 32), B = cai_tensor_2d(G, q, CAI_DTYPE_U8, 16, 32),
               Mt = cai_tensor_1d(G, dm, CAI_DTYPE_F32, 3), C = cai_tensor_2d(G, dc, CAI_DTYPE_F32, 17, 16);
    cai_status st = G->ops->fp8_gemm(G, &C, &A, E4, &Mt, &B, E4, &Mt, 0, NULL, NULL, 0);
    expect(st == CAI_ERR_UNSUPPORTED && strstr(cai_error_message(), "multiple of 16"), "M = 17 refused: %s",
           cai_error_message());
    cai_error_clear();
    cai_device_dealloc(G, q), cai_device_dealloc(G, dm), cai_device_dealloc(G, dc);
}

/* One FP8 linear (forward and backward) on bf16 activations: the GPU's
 * against the CPU's on the same (bf16-valued) inputs. */
static void t_linear(void) {
    const int64_t N = 128, IC = 64, OC = 96;
    cai_fp8_config cfg = cai_fp8_config_default();
    cfg.enabled = 1;
    snprintf(cfg.layers, sizeof cfg.layers, "all");
    int64_t widths[CAI_FP8_SITE_COUNT][2] = {{IC, OC}, {0, 0}, {0, 0}, {0, 0}, {0, 0}};
    cai_fp8_t *fg = NULL, *fh = NULL;
    OK(cai_fp8_create(&fg, G, &cfg, 1, N, widths, NULL));
    OK(cai_fp8_create(&fh, H, &cfg, 1, N, widths, NULL));
    float *x = randn(N * IC, 31, 2.0f), *w = randn(OC * IC, 32, 0.05f), *dy = randn(N * OC, 33, 1e-3f);
    float *hx = malloc((size_t)(N * IC) * 4), *hw = malloc((size_t)(OC * IC) * 4), *hdy = malloc((size_t)(N * OC) * 4);
    void *gx = upload_as(x, N * IC, CAI_DTYPE_BF16, hx), *gw = upload_as(w, OC * IC, CAI_DTYPE_BF16, hw),
         *gdy = upload_as(dy, N * OC, CAI_DTYPE_BF16, hdy);
    float *hy = calloc((size_t)(N * OC), 4), *hdx = calloc((size_t)(N * IC), 4), *hdw = calloc((size_t)(OC * IC), 4);
    void *gy = up(NULL, (size_t)(N * OC) * 2), *gdx = up(NULL, (size_t)(N * IC) * 2),
         *gdw = up(hdw, (size_t)(OC * IC) * 4);
    cai_tensor X = cai_tensor_2d(G, gx, CAI_DTYPE_BF16, N, IC), W = cai_tensor_2d(G, gw, CAI_DTYPE_BF16, OC, IC),
               DY = cai_tensor_2d(G, gdy, CAI_DTYPE_BF16, N, OC), Y = cai_tensor_2d(G, gy, CAI_DTYPE_BF16, N, OC),
               DX = cai_tensor_2d(G, gdx, CAI_DTYPE_BF16, N, IC), DW = cai_tensor_2d(G, gdw, CAI_DTYPE_F32, OC, IC);
    cai_tensor hX = cai_tensor_2d(H, hx, CAI_DTYPE_F32, N, IC), hW = cai_tensor_2d(H, hw, CAI_DTYPE_F32, OC, IC),
               hDY = cai_tensor_2d(H, hdy, CAI_DTYPE_F32, N, OC), hY = cai_tensor_2d(H, hy, CAI_DTYPE_F32, N, OC),
               hDX = cai_tensor_2d(H, hdx, CAI_DTYPE_F32, N, IC), hDW = cai_tensor_2d(H, hdw, CAI_DTYPE_F32, OC, IC);
    const cai_fp8_layer *lg = cai_fp8_layer_of(fg, 0), *lh = cai_fp8_layer_of(fh, 0);
    OK(cai_fp8_linear_fwd(lg, CAI_FP8_SITE_QKV, &Y, &X, &W, NULL, NULL));
    OK(cai_fp8_linear_fwd(lh, CAI_FP8_SITE_QKV, &hY, &hX, &hW, NULL, NULL));
    OK(cai_fp8_linear_bwd(lg, CAI_FP8_SITE_QKV, &DX, &DW, NULL, &DY, &X, &W, 0));
    OK(cai_fp8_linear_bwd(lh, CAI_FP8_SITE_QKV, &hDX, &hDW, NULL, &hDY, &hX, &hW, 0));
    float *y = malloc((size_t)(N * OC) * 4), *dxo = malloc((size_t)(N * IC) * 4), *dwo = malloc((size_t)(OC * IC) * 4);
    uint16_t *tmp = malloc((size_t)(N * (OC > IC ? OC : IC)) * 2);
    down(tmp, gy, (size_t)(N * OC) * 2);
    OK(cai_convert_host(y, CAI_DTYPE_F32, tmp, CAI_DTYPE_BF16, (size_t)(N * OC)));
    down(tmp, gdx, (size_t)(N * IC) * 2);
    OK(cai_convert_host(dxo, CAI_DTYPE_F32, tmp, CAI_DTYPE_BF16, (size_t)(N * IC)));
    down(dwo, gdw, (size_t)(OC * IC) * 4);
    double ey = rel_max(y, hy, N * OC), ex = rel_max(dxo, hdx, N * IC), ew = rel_max(dwo, hdw, OC * IC);
    expect(ey < 8e-3 && ex < 8e-3 && ew < 3e-4,
           "fp8 linear bf16: y %.2g, dx %.2g, dw %.2g of the CPU's (tol 8e-3, 8e-3, 3e-4)", ey, ex, ew);
    OK(cai_fp8_step(fg));
    OK(cai_fp8_step(fh));
    size_t n1, n2;
    const float *s1 = cai_fp8_state(fg, &n1), *s2 = cai_fp8_state(fh, &n2);
    expect(n1 == n2 && memcmp(s1, s2, n1 * 4) == 0, "fp8 state after a step: GPU and CPU bitwise equal");
    cai_fp8_free(fg);
    cai_fp8_free(fh);
    cai_device_dealloc(G, gx), cai_device_dealloc(G, gw), cai_device_dealloc(G, gdy), cai_device_dealloc(G, gy);
    cai_device_dealloc(G, gdx), cai_device_dealloc(G, gdw);
    free(x), free(w), free(dy), free(hx), free(hw), free(hdy), free(hy), free(hdx), free(hdw), free(y), free(dxo);
    free(dwo), free(tmp);
}

/* fp8_dequant_sum: the GPU's sums bitwise the host's, NaN where a sender
 * overflowed */
static void dequant_case(int64_t S, int64_t n);
static void t_dequant(void) {
    dequant_case(4, 100003);
    dequant_case(1100, 3001); /* more senders than a block's shared factors hold at once */
}
static void dequant_case(int64_t S, int64_t n) {
    const int64_t stride = 4;
    uint8_t *q = malloc((size_t)(S * n));
    float *metas = calloc((size_t)(S * stride), sizeof(float)), *y = malloc((size_t)n * 4), *yg = malloc((size_t)n * 4);
    for (int64_t i = 0; i < S * n; i++) {
        q[i] = (uint8_t)(cai_rng_uniform(77, 1, (uint64_t)i) * 256.0f);
        /* past a few senders a random NaN or infinity would be in every sum: finite codes only (in both formats) */
        if (S > 8 && (q[i] & 0x7cu) == 0x7cu) q[i] &= 0xfbu;
    }
    for (int64_t s = 0; s < S; s++) {
        metas[s * stride] = 1.0f / (3.0f + (float)(s % 7));
        metas[s * stride + 2] = 1.0f;
    }
    float *y0 = randn(n, 9, 1.0f);
    for (int f = 0; f < 2; f++)
        for (int beta = 0; beta <= 1; beta++)
            for (int bad = 0; bad <= 1; bad++) {
                const cai_fp8_format fmt = f ? CAI_FP8_E5M2 : CAI_FP8_E4M3;
                metas[2 * stride + 2] = bad ? INFINITY : 1.0f;
                memcpy(y, y0, (size_t)n * 4);
                cai_tensor Y = cai_tensor_1d(H, y, CAI_DTYPE_F32, n), Q = cai_tensor_2d(H, q, CAI_DTYPE_U8, S, n),
                           M = cai_tensor_1d(H, metas, CAI_DTYPE_F32, S * stride);
                OK(H->ops->fp8_dequant_sum(H, &Y, &Q, &M, stride, fmt, (float)beta));
                void *dy = up(y0, (size_t)n * 4), *dq = up(q, (size_t)(S * n)),
                     *dm = up(metas, (size_t)(S * stride) * 4);
                cai_tensor YG = cai_tensor_1d(G, dy, CAI_DTYPE_F32, n), QG = cai_tensor_2d(G, dq, CAI_DTYPE_U8, S, n),
                           MG = cai_tensor_1d(G, dm, CAI_DTYPE_F32, S * stride);
                OK(G->ops->fp8_dequant_sum(G, &YG, &QG, &MG, stride, fmt, (float)beta));
                down(yg, dy, (size_t)n * 4);
                int64_t diff = 0;
                for (int64_t i = 0; i < n; i++) {
                    const int d = memcmp(&y[i], &yg[i], 4) != 0 && !(isnan(y[i]) && isnan(yg[i]));
                    if (d && diff < 3) { /* what a mismatch is made of: its codes and both sums' bits */
                        uint32_t hb, gb;
                        memcpy(&hb, &y[i], 4), memcpy(&gb, &yg[i], 4);
                        printf("  element %lld: codes %02x %02x %02x %02x, y0 %a: host %a (%08x), GPU %a (%08x)\n",
                               (long long)i, q[i], q[n + i], q[2 * n + i], q[3 * n + i], (double)y0[i], (double)y[i],
                               hb, (double)yg[i], gb);
                    }
                    diff += d;
                }
                expect(diff == 0,
                       "dequant_sum %lld senders, %s beta %d%s: %lld of %lld elements differ from the host's",
                       (long long)S, cai_fp8_format_name(fmt), beta, bad ? " (a sender overflowed)" : "",
                       (long long)diff, (long long)n);
                cai_device_dealloc(G, dy), cai_device_dealloc(G, dq), cai_device_dealloc(G, dm);
            }
    free(q), free(metas), free(y), free(yg), free(y0);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Throughput at an LLM-sized shape: FP8 (E4M3 x E4M3 -> bf16), with and
 * without CAI_CUDA_FP8_FAST_ACCUM, against the bf16 matmul op, same M, N,
 * K. Printed; only "FP8 is faster than bf16" is asserted. */
static void t_speed(void) {
    const int64_t M = 8192, N = 8192, K = 8192, iters = 20;
    void *a8 = up(NULL, (size_t)(M * K)), *b8 = up(NULL, (size_t)(N * K)), *c = up(NULL, (size_t)(M * N) * 2);
    void *a16 = up(NULL, (size_t)(M * K) * 2), *b16 = up(NULL, (size_t)(N * K) * 2);
    OK(cai_device_sync(G));
    float m[3] = {1, 1, 0};
    void *dm = up(m, 12);
    cai_tensor A8 = cai_tensor_2d(G, a8, CAI_DTYPE_U8, M, K), B8 = cai_tensor_2d(G, b8, CAI_DTYPE_U8, N, K),
               C = cai_tensor_2d(G, c, CAI_DTYPE_BF16, M, N), Mt = cai_tensor_1d(G, dm, CAI_DTYPE_F32, 3),
               A16 = cai_tensor_2d(G, a16, CAI_DTYPE_BF16, M, K), B16 = cai_tensor_2d(G, b16, CAI_DTYPE_BF16, N, K);
    OK(G->ops->fill(G, &A16, 0.01f));
    OK(G->ops->fill(G, &B16, 0.01f));
    double t[3];
    for (int v = 0; v < 3; v++) {
        OK(cai_knob_set("CAI_CUDA_FP8_FAST_ACCUM", v == 1 ? "1" : "0"));
        for (int i = 0; i < iters + 3; i++) {
            if (i == 3) {
                OK(cai_device_sync(G));
                t[v] = now();
            }
            if (v < 2) OK(G->ops->fp8_gemm(G, &C, &A8, CAI_FP8_E4M3, &Mt, &B8, CAI_FP8_E4M3, &Mt, 0, NULL, NULL, 0));
            else OK(G->ops->matmul(G, &C, &A16, 0, &B16, 1, 1.0f, 0.0f));
        }
        OK(cai_device_sync(G));
        t[v] = (now() - t[v]) / iters;
    }
    OK(cai_knob_set("CAI_CUDA_FP8_FAST_ACCUM", "0"));
    double fl = 2.0 * M * N * K;
    printf("  speed [%lld^3]: fp8 %.0f TFLOP/s (fast accumulation %.0f), bf16 %.0f TFLOP/s, fp8 / bf16 %.2fx\n",
           (long long)M, fl / t[0] / 1e12, fl / t[1] / 1e12, fl / t[2] / 1e12, t[2] / t[0]);
    expect(t[0] < t[2], "fp8 product faster than bf16 at %lld^3", (long long)M);
    cai_device_dealloc(G, a8), cai_device_dealloc(G, b8), cai_device_dealloc(G, c), cai_device_dealloc(G, a16);
    cai_device_dealloc(G, b16), cai_device_dealloc(G, dm);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *only = argc > 1 ? argv[1] : NULL;
    cai_status st = cai_device_init(&G, CAI_DEVICE_CUDA, 0, 0);
    if (st == CAI_ERR_UNSUPPORTED) {
        printf("SKIP: %s\n", cai_error_message());
        return 77;
    }
    OK(st);
    OK(cai_device_init(&H, CAI_DEVICE_HOST, 0, 0));
    printf("FP8 tests on %s against %s\n", G->name, H->name);
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {{"cast", t_cast}, {"gemm", t_gemm}, {"linear", t_linear}, {"dequant", t_dequant}, {"speed", t_speed}};
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (only && !strstr(tests[i].name, only)) continue;
        printf("[fp8 %s]\n", tests[i].name);
        tests[i].fn();
        if (cai_device_sync(G) != CAI_OK) {
            printf("  device error after %s: %s\n", tests[i].name, cai_error_message());
            n_fail++;
        }
    }
    printf("%d checks passed, %d failed\n", n_pass, n_fail);
    cai_device_free(G);
    cai_device_free(H);
    return n_fail ? 1 : 0;
}
