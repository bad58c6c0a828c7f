/* Reference data for the collective tests (host and device): inputs are
 * deterministic functions of (world rank, index), so every rank can compute
 * what each peer sent and what the collective must produce. No Check here:
 * the GPU test builds without it. */
#ifndef TEST_COLLECTIVES_REF_H
#define TEST_COLLECTIVES_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cluster/cluster_internal.h"

typedef struct {
    cai_mesh_t *m;
    cai_axis a;
    int n, k; /* group size, own axis rank */
    const int *grp;
    int me;
} ax_t;

static const cai_dtype k_all_dtypes[] = {CAI_DTYPE_F32, CAI_DTYPE_BF16, CAI_DTYPE_F16, CAI_DTYPE_F64,
                                         CAI_DTYPE_I32, CAI_DTYPE_I64,  CAI_DTYPE_U8,  CAI_DTYPE_U16};
#define NDT (int)(sizeof k_all_dtypes / sizeof k_all_dtypes[0])
/* One of each element size for data-movement operations. */
static const cai_dtype k_move_dtypes[] = {CAI_DTYPE_U8, CAI_DTYPE_BF16, CAI_DTYPE_F32, CAI_DTYPE_I64};
#define NMDT (int)(sizeof k_move_dtypes / sizeof k_move_dtypes[0])

#define SENTINEL 99.0

static inline int is_unsigned(cai_dtype d) { return d == CAI_DTYPE_U8 || d == CAI_DTYPE_U16; }
static inline int is_int(cai_dtype d) { return d == CAI_DTYPE_I32 || d == CAI_DTYPE_I64 || is_unsigned(d); }

/* Small integers: exact in every dtype, and so are sums of up to 8 of them,
 * whatever order the reduction takes. */
static inline double val(int wr, size_t i, int salt, cai_dtype d) {
    int v = (int)(((unsigned)wr * 37u + (unsigned)i * 11u + (unsigned)salt * 5u) % 17u);
    return is_unsigned(d) ? v : v - 8;
}

/* Inexact inputs for the float dtypes (uniform in [-1, 1), rounded to the
 * dtype by put), the small integers otherwise: sums of these depend on the
 * order the reduction takes, so equal results mean equal arithmetic. */
static inline double val_inexact(int wr, size_t i, int salt, cai_dtype d) {
    if (d == CAI_DTYPE_I32 || d == CAI_DTYPE_I64 || d == CAI_DTYPE_U8 || d == CAI_DTYPE_U16) return val(wr, i, salt, d);
    return 2.0 * cai_rng_uniform((uint64_t)salt, (uint64_t)wr, i) - 1.0;
}

static inline void put(cai_dtype d, void *b, size_t i, double v) {
    switch (d) {
    case CAI_DTYPE_F32: ((float *)b)[i] = (float)v; break;
    case CAI_DTYPE_F64: ((double *)b)[i] = v; break;
    case CAI_DTYPE_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    case CAI_DTYPE_I64: ((int64_t *)b)[i] = (int64_t)v; break;
    case CAI_DTYPE_U8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    case CAI_DTYPE_U16: ((uint16_t *)b)[i] = (uint16_t)v; break;
    case CAI_DTYPE_BF16: ((uint16_t *)b)[i] = cai_cl_f32_to_bf16((float)v); break;
    case CAI_DTYPE_F16: ((uint16_t *)b)[i] = cai_cl_f32_to_f16((float)v); break;
    default: break;
    }
}

static inline double get(cai_dtype d, const void *b, size_t i) {
    switch (d) {
    case CAI_DTYPE_F32: return ((const float *)b)[i];
    case CAI_DTYPE_F64: return ((const double *)b)[i];
    case CAI_DTYPE_I32: return ((const int32_t *)b)[i];
    case CAI_DTYPE_I64: return (double)((const int64_t *)b)[i];
    case CAI_DTYPE_U8: return ((const uint8_t *)b)[i];
    case CAI_DTYPE_U16: return ((const uint16_t *)b)[i];
    case CAI_DTYPE_BF16: return cai_cl_bf16_to_f32(((const uint16_t *)b)[i]);
    case CAI_DTYPE_F16: return cai_cl_f16_to_f32(((const uint16_t *)b)[i]);
    default: return NAN;
    }
}

/* Relative error of one rounding to the dtype. */
static inline double rounding(cai_dtype d) {
    switch (d) {
    case CAI_DTYPE_BF16: return 0x1p-8;
    case CAI_DTYPE_F16: return 0x1p-11;
    case CAI_DTYPE_F32: return 0x1p-23;
    default: return 0x1p-51;
    }
}

static inline void *alloc(size_t count, cai_dtype d) { return calloc(count ? count : 1, cai_dtype_size(d)); }

static inline void fill(cai_dtype d, void *b, size_t count, double v) {
    for (size_t i = 0; i < count; i++) put(d, b, i, v);
}

static inline double reduce_ref(const ax_t *x, size_t idx, int salt, cai_dtype d, cai_reduce_op op) {
    double acc = val(x->grp[0], idx, salt, d);
    for (int g = 1; g < x->n; g++) {
        double v = val(x->grp[g], idx, salt, d);
        acc = op == CAI_RED_MAX ? fmax(acc, v) : op == CAI_RED_MIN ? fmin(acc, v) : acc + v;
    }
    if (op == CAI_RED_AVG) acc = is_int(d) ? (double)((long long)acc / x->n) : acc / x->n;
    return acc;
}

/* Uneven counts (including zero) from axis rank `from` to axis rank `to`. */
static inline size_t vcount(int from, int to) { return (size_t)((3 * from + 2 * to + 1) % 4); }

/* all_to_allv layout of axis rank k: uneven counts, and displacements with
 * gaps (1 element after each send block, 2 after each receive block) so
 * that displacements are honoured rather than assumed packed. Arrays of n. */
static inline void vlayout(const ax_t *x, size_t *sc, size_t *sd, size_t *rc, size_t *rd, size_t *stot, size_t *rtot) {
    *stot = *rtot = 0;
    for (int y = 0; y < x->n; y++) {
        sc[y] = vcount(x->k, y);
        sd[y] = *stot;
        *stot += sc[y] + 1;
        rc[y] = vcount(y, x->k);
        rd[y] = *rtot;
        *rtot += rc[y] + 2;
    }
}

/* What a reduction result may differ by: AVG of floats rounds once. */
static inline double reduce_tolerance(cai_dtype d, cai_reduce_op op, double want) {
    return op == CAI_RED_AVG && !is_int(d) ? rounding(d) * fmax(1.0, fabs(want)) : 0.0;
}

#endif
