/* Tensor views: shape and stride bookkeeping only, no element access. */
#include "cai_config.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"

#include <inttypes.h>
#include <stdio.h>

static void set_contiguous_strides(cai_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

static cai_status check_shape(int ndim, const int64_t *shape, const char *what) {
    CAI_CHECK_ARG(ndim >= 0 && ndim <= CAI_TENSOR_MAX_DIMS, "%s: %d dimensions (at most %d supported)", what, ndim,
                  CAI_TENSOR_MAX_DIMS);
    CAI_CHECK_ARG(ndim == 0 || shape, "%s: NULL shape for %d dimensions", what, ndim);
    for (int i = 0; i < ndim; i++)
        CAI_CHECK_ARG(shape[i] >= 0, "%s: dimension %d has negative size %" PRId64, what, i, shape[i]);
    return CAI_OK;
}

cai_status cai_tensor_init(cai_tensor *t, cai_device_t *dev, void *data, cai_dtype dtype, int ndim,
                           const int64_t *shape) {
    CAI_CHECK_ARG(t, "cai_tensor_init: NULL tensor");
    memset(t, 0, sizeof *t);
    CAI_CALL(check_shape(ndim, shape, "cai_tensor_init"));
    CAI_CHECK_ARG(dtype >= 0 && dtype < CAI_DTYPE_COUNT, "cai_tensor_init: invalid dtype %d", (int)dtype);
    t->data = data;
    t->device = dev;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    set_contiguous_strides(t);
    return CAI_OK;
}

cai_status cai_tensor_alloc(cai_tensor *t, cai_device_t *dev, cai_dtype dtype, int ndim, const int64_t *shape,
                            const char *what) {
    CAI_CALL(cai_tensor_init(t, dev, NULL, dtype, ndim, shape));
    size_t bytes = cai_tensor_nbytes(t);
    void *p = NULL;
    if (dev) {
        CAI_CALL(cai_device_alloc(dev, bytes, what, &p));
        if (p) {
            cai_tensor z = *t;
            z.data = p;
            cai_status st = dev->ops->fill(dev, &z, 0.0f);
            if (st != CAI_OK) {
                cai_device_dealloc(dev, p);
                CAI_CALL(st);
            }
        }
    } else {
        CAI_CALL(cai_calloc(&p, 1, bytes, what));
    }
    t->data = p;
    t->owns_data = 1;
    return CAI_OK;
}

cai_status cai_tensor_arena(cai_tensor *t, cai_arena_t *arena, cai_device_t *dev, cai_dtype dtype, int ndim,
                            const int64_t *shape) {
    CAI_CALL(cai_tensor_init(t, dev, NULL, dtype, ndim, shape));
    void *p = NULL;
    CAI_CALL(cai_arena_alloc(arena, cai_tensor_nbytes(t), 64, &p));
    t->data = p;
    return CAI_OK;
}

void cai_tensor_free(cai_tensor *t) {
    if (!t) return;
    if (t->owns_data && t->data) {
        if (t->device) cai_device_dealloc(t->device, t->data);
        else cai_free(t->data);
    }
    memset(t, 0, sizeof *t);
}

static cai_tensor make(cai_device_t *dev, void *data, cai_dtype dtype, int ndim, const int64_t *shape) {
    cai_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device = dev;
    t.dtype = dtype;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    set_contiguous_strides(&t);
    return t;
}

cai_tensor cai_tensor_1d(cai_device_t *dev, void *data, cai_dtype dtype, int64_t d0) {
    return make(dev, data, dtype, 1, (int64_t[]){d0});
}
cai_tensor cai_tensor_2d(cai_device_t *dev, void *data, cai_dtype dtype, int64_t d0, int64_t d1) {
    return make(dev, data, dtype, 2, (int64_t[]){d0, d1});
}
cai_tensor cai_tensor_3d(cai_device_t *dev, void *data, cai_dtype dtype, int64_t d0, int64_t d1, int64_t d2) {
    return make(dev, data, dtype, 3, (int64_t[]){d0, d1, d2});
}
cai_tensor cai_tensor_4d(cai_device_t *dev, void *data, cai_dtype dtype, int64_t d0, int64_t d1, int64_t d2,
                         int64_t d3) {
    return make(dev, data, dtype, 4, (int64_t[]){d0, d1, d2, d3});
}

int64_t cai_tensor_numel(const cai_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t cai_tensor_nbytes(const cai_tensor *t) { return (size_t)cai_tensor_numel(t) * cai_dtype_size(t->dtype); }

int cai_tensor_is_contiguous(const cai_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

int cai_tensor_same_shape(const cai_tensor *a, const cai_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

const char *cai_tensor_describe(const cai_tensor *t, char *buf, size_t len) {
    if (!buf || len == 0) return "";
    if (!t) {
        snprintf(buf, len, "(null)");
        return buf;
    }
    size_t o = (size_t)snprintf(buf, len, "%s[", cai_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? "," : "", t->shape[i]);
    if (o < len) o += (size_t)snprintf(buf + o, len - o, "]");
    if (!cai_tensor_is_contiguous(t) && o < len) {
        o += (size_t)snprintf(buf + o, len - o, " strides [");
        for (int i = 0; i < t->ndim && o < len; i++)
            o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? "," : "", t->stride[i]);
        if (o < len) snprintf(buf + o, len - o, "]");
    }
    return buf;
}

static cai_status norm_dim(const cai_tensor *t, int *dim, const char *what) {
    int d = *dim < 0 ? *dim + t->ndim : *dim;
    CAI_CHECK_ARG(d >= 0 && d < t->ndim, "%s: dimension %d out of range for a %d-dimensional tensor", what, *dim,
                  t->ndim);
    *dim = d;
    return CAI_OK;
}

static void *offset_ptr(const cai_tensor *t, int64_t elems) {
    if (!t->data) return NULL;
    return (char *)t->data + elems * (int64_t)cai_dtype_size(t->dtype);
}

cai_status cai_tensor_narrow(const cai_tensor *t, int dim, int64_t start, int64_t len, cai_tensor *out) {
    CAI_CALL(norm_dim(t, &dim, "cai_tensor_narrow"));
    CAI_CHECK_ARG(start >= 0 && len >= 0 && start + len <= t->shape[dim],
                  "cai_tensor_narrow: [%" PRId64 ", %" PRId64 ") is outside dimension %d of size %" PRId64, start,
                  start + len, dim, t->shape[dim]);
    cai_tensor r = *t;
    r.owns_data = 0;
    r.data = offset_ptr(t, start * t->stride[dim]);
    r.shape[dim] = len;
    *out = r;
    return CAI_OK;
}

cai_status cai_tensor_unflatten(const cai_tensor *t, int dim, int64_t inner, cai_tensor *out) {
    CAI_CALL(norm_dim(t, &dim, "cai_tensor_unflatten"));
    CAI_CHECK_ARG(t->ndim < CAI_TENSOR_MAX_DIMS, "cai_tensor_unflatten: already %d dimensions (the maximum)", t->ndim);
    CAI_CHECK_ARG(inner > 0 && t->shape[dim] % inner == 0,
                  "cai_tensor_unflatten: dimension %d of size %" PRId64 " does not split into rows of %" PRId64, dim,
                  t->shape[dim], inner);
    cai_tensor r = *t;
    r.owns_data = 0;
    for (int i = t->ndim; i > dim + 1; i--) {
        r.shape[i] = t->shape[i - 1];
        r.stride[i] = t->stride[i - 1];
    }
    r.shape[dim] = t->shape[dim] / inner;
    r.stride[dim] = t->stride[dim] * inner;
    r.shape[dim + 1] = inner;
    r.stride[dim + 1] = t->stride[dim];
    r.ndim = t->ndim + 1;
    *out = r;
    return CAI_OK;
}

cai_status cai_tensor_reshape(const cai_tensor *t, int ndim, const int64_t *shape, cai_tensor *out) {
    char d[128];
    CAI_CHECK_ARG(cai_tensor_is_contiguous(t), "cai_tensor_reshape: %s is not contiguous (copy it first)",
                  cai_tensor_describe(t, d, sizeof d));
    CAI_CHECK_ARG(ndim >= 0 && ndim <= CAI_TENSOR_MAX_DIMS && (ndim == 0 || shape),
                  "cai_tensor_reshape: %d dimensions (at most %d)", ndim, CAI_TENSOR_MAX_DIMS);
    int64_t known = 1, n = cai_tensor_numel(t);
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            CAI_CHECK_ARG(infer < 0, "cai_tensor_reshape: more than one -1 in the new shape");
            infer = i;
        } else {
            CAI_CHECK_ARG(shape[i] >= 0, "cai_tensor_reshape: negative size %" PRId64, shape[i]);
            known *= shape[i];
        }
    }
    int64_t s[CAI_TENSOR_MAX_DIMS];
    for (int i = 0; i < ndim; i++) s[i] = shape[i];
    if (infer >= 0) {
        CAI_CHECK_ARG(known > 0 && n % known == 0,
                      "cai_tensor_reshape: cannot infer a size: %" PRId64 " elements are not a multiple of %" PRId64, n,
                      known);
        s[infer] = n / known;
        known *= s[infer];
    }
    CAI_CHECK_ARG(known == n, "cai_tensor_reshape: %s has %" PRId64 " elements, the new shape %" PRId64,
                  cai_tensor_describe(t, d, sizeof d), n, known);
    cai_tensor r = make(t->device, t->data, t->dtype, ndim, s);
    *out = r;
    return CAI_OK;
}

cai_status cai_tensor_transpose(const cai_tensor *t, int dim0, int dim1, cai_tensor *out) {
    CAI_CALL(norm_dim(t, &dim0, "cai_tensor_transpose"));
    CAI_CALL(norm_dim(t, &dim1, "cai_tensor_transpose"));
    cai_tensor r = *t;
    r.owns_data = 0;
    r.shape[dim0] = t->shape[dim1];
    r.stride[dim0] = t->stride[dim1];
    r.shape[dim1] = t->shape[dim0];
    r.stride[dim1] = t->stride[dim0];
    *out = r;
    return CAI_OK;
}

cai_status cai_tensor_slice0(const cai_tensor *t, int64_t start, int64_t len, cai_tensor *out) {
    return cai_tensor_narrow(t, 0, start, len, out);
}
