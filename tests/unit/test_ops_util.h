/* Helpers shared by the op tests: random data, double-precision buffers,
 * error measures and central finite differences on a scalar loss. */
#ifndef CAI_TEST_OPS_UTIL_H
#define CAI_TEST_OPS_UTIL_H

#include "colossal/base.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

static inline float *falloc(int64_t n) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Standard normal values, scaled; a different stream per buffer. */
static inline double *drandn(int64_t n, uint64_t stream, double scale) {
    double *p = dalloc(n);
    for (int64_t i = 0; i < n; i++) p[i] = scale * cai_rng_normal(20240601, stream, (uint64_t)i);
    return p;
}

/* f32 copy of a double buffer, and the double values the f32 copy holds
 * (references are computed from exactly the inputs the op saw). */
static inline float *to_f(double *d, int64_t n) {
    float *f = falloc(n);
    for (int64_t i = 0; i < n; i++) {
        f[i] = (float)d[i];
        d[i] = f[i];
    }
    return f;
}

static inline double *to_d(const float *f, int64_t n) {
    double *d = dalloc(n);
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    return d;
}

/* max |got - ref| / max |ref|: an error relative to the data's scale, which
 * stays meaningful where individual reference entries are near zero. */
static inline double rel_err(const float *got, const double *ref, int64_t n) {
    double num = 0.0, den = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (e > num || e != e) num = e != e ? INFINITY : e;
        if (fabs(ref[i]) > den) den = fabs(ref[i]);
    }
    return num / den;
}

#define ASSERT_REL(got, ref, n, tol)                                                                             \
    do {                                                                                                         \
        double e_ = rel_err((got), (ref), (n));                                                                  \
        ck_assert_msg(e_ <= (tol), "%s vs %s: relative error %.3g exceeds %.3g", #got, #ref, e_, (double)(tol)); \
    } while (0)

#define ASSERT_OK(expr)                                                           \
    do {                                                                          \
        cai_status s_ = (expr);                                                   \
        ck_assert_msg(s_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

/* For assertions inside element loops: Check's ck_assert records every
 * passing check (a write per call when not forking), which is slow for
 * millions of elements; this only calls into Check on failure. */
#define EXPECT(cond, ...)                       \
    do {                                        \
        if (!(cond)) ck_abort_msg(__VA_ARGS__); \
    } while (0)

typedef double (*test_loss_fn)(void *ctx);

/* Central differences of loss() with respect to x[0..n), step h. */
static inline void fd_grad(test_loss_fn loss, void *ctx, double *x, int64_t n, double h, double *g) {
    for (int64_t i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + h;
        double lp = loss(ctx);
        x[i] = save - h;
        double lm = loss(ctx);
        x[i] = save;
        g[i] = (lp - lm) / (2.0 * h);
    }
}

static inline double dot_d(const double *a, const double *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Usable outside a test (no ck_ macros, which need a running test). */
static inline cai_device_t *test_device(int threads) {
    cai_device_t *dev = NULL;
    if (cai_device_init(&dev, CAI_DEVICE_HOST, 0, threads) != CAI_OK) {
        cai_error_print(stderr);
        return NULL;
    }
    return dev;
}

#endif
