/* CPU backend: memory, fills, copies with dtype conversion, BLAS-1 style
 * elementwise ops and reductions. */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

cai_status cai_cpu_alloc(cai_device_t *dev, size_t bytes, const char *what, void **out) {
    CAI_CALL(cai_malloc(out, bytes, what));
    return CAI_OK;
}

void cai_cpu_dealloc(cai_device_t *dev, void *ptr) { cai_free(ptr); }

cai_status cai_cpu_memcpy(cai_device_t *dev, void *dst, const void *src, size_t bytes, cai_copy_kind kind) {
    CAI_CHECK_ARG(kind >= CAI_COPY_H2H && kind <= CAI_COPY_D2D, "memcpy: unknown copy kind %d", (int)kind);
    memmove(dst, src, bytes);
    return CAI_OK;
}

cai_status cai_cpu_sync(cai_device_t *dev) { return CAI_OK; }

cai_status cai_cpu_fill(cai_device_t *dev, cai_tensor *x, float value) {
    static const char *op = "fill";
    CAI_CALL(cai_ops_check(op, "x", x, CAI_HOST, x && x->dtype == CAI_DTYPE_I32 ? CAI_I32 : CAI_ANYF));
    cai_rows r;
    CAI_CALL(cai_ops_rows(op, "x", x, CAI_HOST, x->dtype == CAI_DTYPE_I32 ? CAI_I32 : CAI_ANYF, -1, &r));
    size_t es = cai_dtype_size(r.dtype);
    uint32_t pattern = 0;
    if (r.dtype == CAI_DTYPE_F32) pattern = cai_f32_bits(value);
    else if (r.dtype == CAI_DTYPE_BF16) pattern = cai_f32_to_bf16(value);
    else if (r.dtype == CAI_DTYPE_F16) pattern = cai_f32_to_f16(value);
    else pattern = (uint32_t)(int32_t)value;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, r.rows)) schedule(static)
    for (int64_t i = 0; i < r.rows; i++) {
        char *row = r.data + i * r.ld * (int64_t)es;
        if (pattern == 0) {
            memset(row, 0, (size_t)r.cols * es);
        } else if (es == 4) {
            uint32_t *p = (uint32_t *)row;
            for (int64_t j = 0; j < r.cols; j++) p[j] = pattern;
        } else {
            uint16_t *p = (uint16_t *)row;
            for (int64_t j = 0; j < r.cols; j++) p[j] = (uint16_t)pattern;
        }
    }
    return CAI_OK;
}

/* Strided element walk shared by copy and copy_sr: the tensor is split into
 * `outer` runs along its last dimension; run o starts at these offsets. */
static void run_offsets(const cai_tensor *shape_of, const cai_tensor *a, const cai_tensor *b, int64_t o, int64_t *oa,
                        int64_t *ob) {
    int64_t ra = 0, rb = 0;
    for (int d = shape_of->ndim - 2; d >= 0; d--) {
        int64_t idx = o % shape_of->shape[d];
        o /= shape_of->shape[d];
        ra += idx * a->stride[d];
        rb += idx * b->stride[d];
    }
    *oa = ra;
    *ob = rb;
}

static float load_f(const char *base, cai_dtype dt, int64_t i) {
    if (dt == CAI_DTYPE_F32) return ((const float *)base)[i];
    if (dt == CAI_DTYPE_BF16) return cai_bf16_to_f32(((const cai_bf16 *)base)[i]);
    return cai_f16_to_f32(((const cai_f16 *)base)[i]);
}

static void store_f(char *base, cai_dtype dt, int64_t i, float v) {
    if (dt == CAI_DTYPE_F32) ((float *)base)[i] = v;
    else if (dt == CAI_DTYPE_BF16) ((cai_bf16 *)base)[i] = cai_f32_to_bf16(v);
    else ((cai_f16 *)base)[i] = cai_f32_to_f16(v);
}

static cai_status check_copy(const char *op, const cai_tensor *dst, const cai_tensor *src, int src_want) {
    CAI_CALL(cai_ops_check(op, "dst", dst, CAI_HOST, CAI_ANYF));
    CAI_CALL(cai_ops_check(op, "src", src, CAI_HOST, src_want));
    if (!cai_tensor_same_shape(dst, src))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dst is %s but src is %s; shapes must match", op,
                         CAI_OPS_DESCRIBE(dst), CAI_OPS_DESCRIBE(src));
    return CAI_OK;
}

cai_status cai_cpu_copy(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src) {
    CAI_CALL(check_copy("copy", dst, src, CAI_ANYF));
    int64_t n = cai_tensor_numel(src);
    if (n == 0) return CAI_OK;
    int64_t cols = src->ndim ? src->shape[src->ndim - 1] : 1;
    int64_t outer = n / cols;
    int64_t ss = src->ndim ? src->stride[src->ndim - 1] : 1, ds = dst->ndim ? dst->stride[dst->ndim - 1] : 1;
    size_t ses = cai_dtype_size(src->dtype), des = cai_dtype_size(dst->dtype);
#pragma omp parallel for num_threads(cai_cpu_threads(dev, outer)) schedule(static)
    for (int64_t o = 0; o < outer; o++) {
        int64_t so, dofs;
        run_offsets(src, src, dst, o, &so, &dofs);
        const char *s = (const char *)src->data + so * (int64_t)ses;
        char *d = (char *)dst->data + dofs * (int64_t)des;
        if (ss == 1 && ds == 1) {
            cai_convert_host(d, dst->dtype, s, src->dtype, (size_t)cols); /* dtypes checked above */
        } else {
            for (int64_t j = 0; j < cols; j++) store_f(d, dst->dtype, j * ds, load_f(s, src->dtype, j * ss));
        }
    }
    return CAI_OK;
}

cai_status cai_cpu_copy_sr(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src, uint64_t seed, uint64_t stream,
                           uint64_t index_offset) {
    CAI_CALL(check_copy("copy_sr", dst, src, CAI_F32));
    int64_t n = cai_tensor_numel(src);
    if (n == 0) return CAI_OK;
    int64_t cols = src->ndim ? src->shape[src->ndim - 1] : 1;
    int64_t outer = n / cols;
    int64_t ss = src->ndim ? src->stride[src->ndim - 1] : 1, ds = dst->ndim ? dst->stride[dst->ndim - 1] : 1;
    size_t des = cai_dtype_size(dst->dtype);
#pragma omp parallel for num_threads(cai_cpu_threads(dev, outer)) schedule(static)
    for (int64_t o = 0; o < outer; o++) {
        int64_t so, dofs;
        run_offsets(src, src, dst, o, &so, &dofs);
        const float *s = (const float *)src->data + so;
        char *d = (char *)dst->data + dofs * (int64_t)des;
        uint64_t g0 = index_offset + (uint64_t)(o * cols);
        if (ss == 1 && ds == 1) {
            cai_convert_host_sr(d, dst->dtype, s, (size_t)cols, seed, stream, g0);
        } else {
            for (int64_t j = 0; j < cols; j++) {
                float v = s[j * ss];
                uint32_t rnd = cai_sr_bits(seed, stream, g0 + (uint64_t)j);
                if (dst->dtype == CAI_DTYPE_F32) ((float *)d)[j * ds] = v;
                else if (dst->dtype == CAI_DTYPE_BF16) ((cai_bf16 *)d)[j * ds] = cai_f32_to_bf16_sr(v, rnd);
                else ((cai_f16 *)d)[j * ds] = cai_f32_to_f16_sr(v, rnd);
            }
        }
    }
    return CAI_OK;
}

cai_status cai_cpu_scale(cai_device_t *dev, cai_tensor *x, float alpha) {
    cai_rows r;
    CAI_CALL(cai_ops_rows("scale", "x", x, CAI_HOST, CAI_F32, -1, &r));
#pragma omp parallel for num_threads(cai_cpu_threads(dev, r.rows)) schedule(static)
    for (int64_t i = 0; i < r.rows; i++) {
        float *p = cai_row_f32(&r, i);
#pragma omp simd
        for (int64_t j = 0; j < r.cols; j++) p[j] *= alpha;
    }
    return CAI_OK;
}

cai_status cai_cpu_axpy(cai_device_t *dev, cai_tensor *y, float alpha, const cai_tensor *x) {
    static const char *op = "axpy";
    cai_rows ry, rx;
    CAI_CALL(cai_ops_rows(op, "y", y, CAI_HOST, CAI_F32, -1, &ry));
    CAI_CALL(cai_ops_rows(op, "x", x, CAI_HOST, CAI_F32, -1, &rx));
    CAI_CALL(cai_ops_same_rows(op, "x", &rx, "y", &ry));
#pragma omp parallel for num_threads(cai_cpu_threads(dev, ry.rows)) schedule(static)
    for (int64_t i = 0; i < ry.rows; i++) {
        float *py = cai_row_f32(&ry, i);
        const float *px = cai_row_f32(&rx, i);
#pragma omp simd
        for (int64_t j = 0; j < ry.cols; j++) py[j] += alpha * px[j];
    }
    return CAI_OK;
}

cai_status cai_cpu_add(cai_device_t *dev, cai_tensor *out, const cai_tensor *a, const cai_tensor *b) {
    static const char *op = "add";
    cai_rows ro, ra, rb;
    CAI_CALL(cai_ops_rows(op, "out", out, CAI_HOST, CAI_F32, -1, &ro));
    CAI_CALL(cai_ops_rows(op, "a", a, CAI_HOST, CAI_F32, -1, &ra));
    CAI_CALL(cai_ops_rows(op, "b", b, CAI_HOST, CAI_F32, -1, &rb));
    CAI_CALL(cai_ops_same_rows(op, "a", &ra, "out", &ro));
    CAI_CALL(cai_ops_same_rows(op, "b", &rb, "out", &ro));
#pragma omp parallel for num_threads(cai_cpu_threads(dev, ro.rows)) schedule(static)
    for (int64_t i = 0; i < ro.rows; i++) {
        float *po = cai_row_f32(&ro, i);
        const float *pa = cai_row_f32(&ra, i), *pb = cai_row_f32(&rb, i);
#pragma omp simd
        for (int64_t j = 0; j < ro.cols; j++) po[j] = pa[j] + pb[j];
    }
    return CAI_OK;
}

static cai_status reduce(const char *op, cai_device_t *dev, cai_tensor *out, const cai_tensor *x, int squares) {
    cai_rows r;
    CAI_CALL(cai_ops_rows(op, "x", x, CAI_HOST, CAI_F32, -1, &r));
    CAI_CALL(cai_ops_check(op, "out", out, CAI_HOST, out && out->dtype == CAI_DTYPE_F64 ? CAI_DTYPE_F64 : CAI_F32));
    if (cai_tensor_numel(out) != 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: out is %s, expected a single element", op, CAI_OPS_DESCRIBE(out));
    double total = 0.0;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, r.rows)) schedule(static) reduction(+ : total)
    for (int64_t i = 0; i < r.rows; i++) {
        const float *p = cai_row_f32(&r, i);
        double s = 0.0;
        if (squares) {
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j < r.cols; j++) s += (double)p[j] * (double)p[j];
        } else {
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j < r.cols; j++) s += (double)p[j];
        }
        total += s;
    }
    if (out->dtype == CAI_DTYPE_F64) *(double *)out->data += total;
    else *(float *)out->data = (float)((double)*(float *)out->data + total);
    return CAI_OK;
}

cai_status cai_cpu_sum(cai_device_t *dev, cai_tensor *out, const cai_tensor *x) {
    CAI_CALL(reduce("sum", dev, out, x, 0));
    return CAI_OK;
}

cai_status cai_cpu_sumsq(cai_device_t *dev, cai_tensor *out, const cai_tensor *x) {
    CAI_CALL(reduce("sumsq", dev, out, x, 1));
    return CAI_OK;
}

void cai_cpu_colsum(const cai_device_t *dev, float *acc, const cai_rows *src) {
    const int64_t BLK = cai_cpu_colblk(dev, src->cols), nblk = (src->cols + BLK - 1) / BLK;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, nblk)) schedule(static)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t c0 = b * BLK, w = src->cols - c0 < BLK ? src->cols - c0 : BLK;
        double s[CAI_COLBLK_MAX] = {0};
        for (int64_t i = 0; i < src->rows; i++) {
            const float *p = cai_row_f32(src, i) + c0;
#pragma omp simd
            for (int64_t j = 0; j < w; j++) s[j] += p[j];
        }
        for (int64_t j = 0; j < w; j++) acc[c0 + j] = (float)((double)acc[c0 + j] + s[j]);
    }
}
