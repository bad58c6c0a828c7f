/* Helpers for the GPU tests and benchmarks: tensors that exist twice, as a
 * host f32 copy (fed to the CPU backend, the reference) and as a device copy
 * in the dtype under test holding the same values (inputs are rounded to
 * that dtype first, so both backends see identical numbers). Outputs start
 * as NaN on the device, so an element the kernel never writes fails the
 * comparison. Only the public API is used: no CUDA header here. */
#ifndef CAI_GPU_TEST_UTIL_H
#define CAI_GPU_TEST_UTIL_H

#include "colossal/base.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cai_device_t *G; /* the GPU under test */
static cai_device_t *H; /* the host reference */
static int g_fail, g_pass;
static uint64_t g_stream = 1000;

typedef struct {
    cai_dtype dt;
    int64_t n;
    float *hbuf; /* host values as f32 (raw int32 for I32) */
    void *gbuf;  /* device buffer in dtype dt */
} gt_buf;

/* A view pair over one gt_buf: h on the host, g on the device. */
typedef struct {
    gt_buf *b;
    cai_tensor h, g;
} gt_t;

/* every buffer made since the last gt_release_all (the table grows as a group
 * of checks needs) */
static gt_buf **g_live;
static int g_nlive, g_cap;

static void gt_die(const char *what) {
    fprintf(stderr, "FATAL: %s: %s\n", what, cai_error_message());
    cai_error_print(stderr);
    exit(1);
}

#define GT_OK(expr)                          \
    do {                                     \
        if ((expr) != CAI_OK) gt_die(#expr); \
    } while (0)

static size_t gt_es(cai_dtype dt) { return cai_dtype_size(dt); }

static gt_t gt_make(cai_dtype dt, int ndim, const int64_t *shape) {
    gt_buf *b = calloc(1, sizeof *b);
    if (b && g_nlive == g_cap) {
        gt_buf **grown = realloc(g_live, (size_t)(g_cap ? 2 * g_cap : 1024) * sizeof *g_live);
        if (grown) g_live = grown, g_cap = g_cap ? 2 * g_cap : 1024;
    }
    if (!b || g_nlive == g_cap) gt_die("test allocation");
    g_live[g_nlive++] = b;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    b->dt = dt;
    b->n = n;
    b->hbuf = calloc((size_t)(n > 0 ? n : 1), 4);
    if (!b->hbuf) gt_die("host buffer");
    GT_OK(cai_device_alloc(G, (size_t)n * gt_es(dt), "test tensor", &b->gbuf));
    gt_t t = {.b = b};
    GT_OK(cai_tensor_init(&t.h, NULL, b->hbuf, dt == CAI_DTYPE_I32 ? CAI_DTYPE_I32 : CAI_DTYPE_F32, ndim, shape));
    t.h.device = H;
    GT_OK(cai_tensor_init(&t.g, G, b->gbuf, dt, ndim, shape));
    return t;
}

/* Round the host f32 values to the buffer's dtype, in place (RNE, as the
 * CPU backend's conversions). */
static void gt_round_host(gt_t *t) {
    gt_buf *b = t->b;
    if (b->n == 0 || b->dt == CAI_DTYPE_I32 || b->dt == CAI_DTYPE_F32) return;
    void *tmp = malloc((size_t)b->n * gt_es(b->dt));
    if (!tmp) gt_die("rounding buffer");
    GT_OK(cai_convert_host(tmp, b->dt, b->hbuf, CAI_DTYPE_F32, (size_t)b->n));
    GT_OK(cai_convert_host(b->hbuf, CAI_DTYPE_F32, tmp, b->dt, (size_t)b->n));
    free(tmp);
}

/* Round the host values to the device dtype (in place) and upload them. */
static void gt_upload(gt_t *t) {
    gt_buf *b = t->b;
    if (b->n == 0) return;
    size_t bytes = (size_t)b->n * gt_es(b->dt);
    void *tmp = malloc(bytes);
    if (!tmp) gt_die("upload staging");
    if (b->dt == CAI_DTYPE_I32) {
        memcpy(tmp, b->hbuf, bytes);
    } else {
        GT_OK(cai_convert_host(tmp, b->dt, b->hbuf, CAI_DTYPE_F32, (size_t)b->n));
        GT_OK(cai_convert_host(b->hbuf, CAI_DTYPE_F32, tmp, b->dt, (size_t)b->n));
    }
    GT_OK(cai_device_copy(G, b->gbuf, tmp, bytes, CAI_COPY_H2D));
    GT_OK(cai_device_sync(G));
    free(tmp);
}

/* Device contents as f32 (a fresh malloc'd array of b->n values). */
static float *gt_download(const gt_buf *b) {
    float *out = calloc((size_t)(b->n > 0 ? b->n : 1), sizeof(float));
    if (!out) gt_die("download buffer");
    if (b->n == 0) return out;
    size_t bytes = (size_t)b->n * gt_es(b->dt);
    void *tmp = malloc(bytes);
    if (!tmp) gt_die("download staging");
    GT_OK(cai_device_copy(G, tmp, b->gbuf, bytes, CAI_COPY_D2H));
    if (b->dt == CAI_DTYPE_I32) memcpy(out, tmp, bytes);
    else GT_OK(cai_convert_host(out, CAI_DTYPE_F32, tmp, b->dt, (size_t)b->n));
    free(tmp);
    return out;
}

/* Standard normal values times `scale` (fresh stream per tensor). */
static gt_t gt_rand(cai_dtype dt, int ndim, const int64_t *shape, double scale) {
    gt_t t = gt_make(dt, ndim, shape);
    uint64_t s = g_stream++;
    for (int64_t i = 0; i < t.b->n; i++) t.b->hbuf[i] = (float)(scale * cai_rng_normal(4242, s, (uint64_t)i));
    gt_upload(&t);
    return t;
}

/* Output: zeros on the host, NaN on the device. */
static gt_t gt_out(cai_dtype dt, int ndim, const int64_t *shape) {
    gt_t t = gt_make(dt, ndim, shape);
    if (dt != CAI_DTYPE_I32 && t.b->n > 0) GT_OK(G->ops->fill(G, &t.g, NAN));
    return t;
}

/* I32 tensor with the given values on both sides. */
static gt_t gt_ints(int ndim, const int64_t *shape, const int32_t *vals) {
    gt_t t = gt_make(CAI_DTYPE_I32, ndim, shape);
    memcpy(t.b->hbuf, vals, (size_t)t.b->n * 4);
    gt_upload(&t);
    return t;
}

#define SHP(...) ((const int64_t[]){__VA_ARGS__})
#define R1(dt, a, s) gt_rand(dt, 1, SHP(a), s)
#define R2(dt, a, b, s) gt_rand(dt, 2, SHP(a, b), s)
#define R3(dt, a, b, c, s) gt_rand(dt, 3, SHP(a, b, c), s)
#define R4(dt, a, b, c, d, s) gt_rand(dt, 4, SHP(a, b, c, d), s)
#define O1(dt, a) gt_out(dt, 1, SHP(a))
#define O2(dt, a, b) gt_out(dt, 2, SHP(a, b))
#define O3(dt, a, b, c) gt_out(dt, 3, SHP(a, b, c))
#define O4(dt, a, b, c, d) gt_out(dt, 4, SHP(a, b, c, d))

static gt_t gt_narrow(gt_t t, int dim, int64_t start, int64_t len) {
    gt_t r = t;
    GT_OK(cai_tensor_narrow(&t.h, dim, start, len, &r.h));
    GT_OK(cai_tensor_narrow(&t.g, dim, start, len, &r.g));
    return r;
}

static gt_t gt_unflatten(gt_t t, int dim, int64_t inner) {
    gt_t r = t;
    GT_OK(cai_tensor_unflatten(&t.h, dim, inner, &r.h));
    GT_OK(cai_tensor_unflatten(&t.g, dim, inner, &r.g));
    return r;
}

static gt_t gt_transpose(gt_t t, int d0, int d1) {
    gt_t r = t;
    GT_OK(cai_tensor_transpose(&t.h, d0, d1, &r.h));
    GT_OK(cai_tensor_transpose(&t.g, d0, d1, &r.g));
    return r;
}

static void gt_release_all(void) {
    for (int i = 0; i < g_nlive; i++) {
        cai_device_dealloc(G, g_live[i]->gbuf);
        free(g_live[i]->hbuf);
        free(g_live[i]);
    }
    g_nlive = 0;
}

static double gt_tol(cai_dtype dt) { return dt == CAI_DTYPE_BF16 ? 1e-2 : dt == CAI_DTYPE_F16 ? 2e-3 : 1e-5; }

static void gt_report(const char *name, const char *dtn, double err, double tol, int ok, const char *note) {
    printf("  %-46s %-5s err %9.2e  tol %7.1e  %s%s%s\n", name, dtn, err, tol, ok ? "ok" : "FAIL", note ? "  " : "",
           note ? note : "");
    if (ok) g_pass++;
    else g_fail++;
}

/* Compare the device view with the host view element by element:
 * max |got - ref| / max |ref| (finite refs); equal values (infinities
 * included) count as 0, NaN on either side fails. tol 0 demands equality. */
static int gt_check(const char *name, gt_t t, double tol) {
    gt_buf *b = t.b;
    float *got = gt_download(b);
    int64_t n = cai_tensor_numel(&t.h);
    int nd = t.h.ndim;
    int64_t h0 = (const float *)t.h.data - b->hbuf;
    int64_t g0 = (int64_t)(((const char *)t.g.data - (const char *)b->gbuf) / (ptrdiff_t)gt_es(b->dt));
    double num = 0.0, den = 0.0;
    int bad = 0;
    int64_t first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, oh = h0, og = g0;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t idx = rem % t.h.shape[d];
            rem /= t.h.shape[d];
            oh += idx * t.h.stride[d];
            og += idx * t.g.stride[d];
        }
        double r = b->hbuf[oh], g = got[og];
        if (isfinite(r) && fabs(r) > den) den = fabs(r);
        if (r == g) continue;
        double e = fabs(g - r);
        if (isnan(g) || isnan(r) || isinf(r) || isinf(g)) {
            bad = 1;
            if (first_bad < 0) first_bad = i;
            continue;
        }
        if (e > num) num = e;
    }
    double err = bad ? INFINITY : (den > 0 ? num / den : num);
    int ok = !bad && err <= tol;
    char note[96] = {0};
    if (bad) snprintf(note, sizeof note, "(NaN/inf mismatch, first at element %" PRId64 ")", first_bad);
    gt_report(name, cai_dtype_name(b->dt), err, tol, ok, bad ? note : NULL);
    free(got);
    return ok;
}

static void gt_expect(const char *name, int cond, const char *note) {
    gt_report(name, "-", cond ? 0.0 : 1.0, 0.0, cond, note);
}

#endif
