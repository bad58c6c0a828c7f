/* CPU backend: GELU (tanh), SwiGLU and rotary position embeddings. */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

cai_status cai_cpu_gelu_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp) {
    static const char *op = "gelu_fwd";
    cai_rows x, y;
    CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_HOST, CAI_F32, -1, &x));
    CAI_CALL(cai_ops_rows(op, "out", out, CAI_HOST, CAI_F32, -1, &y));
    CAI_CALL(cai_ops_same_rows(op, "out", &y, "inp", &x));
#pragma omp parallel for num_threads(cai_cpu_threads(dev, x.rows)) schedule(static)
    for (int64_t i = 0; i < x.rows; i++) cai_k_gelu_fwd(cai_row_f32(&y, i), cai_row_f32(&x, i), x.cols);
    return CAI_OK;
}

cai_status cai_cpu_gelu_bwd(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *inp, const cai_tensor *dout) {
    static const char *op = "gelu_bwd";
    cai_rows x, dy, dx;
    CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_HOST, CAI_F32, -1, &x));
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_HOST, CAI_F32, -1, &dy));
    CAI_CALL(cai_ops_rows(op, "dinp", dinp, CAI_HOST, CAI_F32, -1, &dx));
    CAI_CALL(cai_ops_same_rows(op, "dout", &dy, "inp", &x));
    CAI_CALL(cai_ops_same_rows(op, "dinp", &dx, "inp", &x));
#pragma omp parallel for num_threads(cai_cpu_threads(dev, x.rows)) schedule(static)
    for (int64_t i = 0; i < x.rows; i++)
        cai_k_gelu_bwd(cai_row_f32(&dx, i), cai_row_f32(&x, i), cai_row_f32(&dy, i), x.cols);
    return CAI_OK;
}

cai_status cai_cpu_swiglu_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *gate, const cai_tensor *up) {
    static const char *op = "swiglu_fwd";
    cai_rows g, u, y;
    CAI_CALL(cai_ops_rows(op, "gate", gate, CAI_HOST, CAI_F32, -1, &g));
    CAI_CALL(cai_ops_rows(op, "up", up, CAI_HOST, CAI_F32, -1, &u));
    CAI_CALL(cai_ops_rows(op, "out", out, CAI_HOST, CAI_F32, -1, &y));
    CAI_CALL(cai_ops_same_rows(op, "up", &u, "gate", &g));
    CAI_CALL(cai_ops_same_rows(op, "out", &y, "gate", &g));
#pragma omp parallel for num_threads(cai_cpu_threads(dev, g.rows)) schedule(static)
    for (int64_t i = 0; i < g.rows; i++)
        cai_k_swiglu_fwd(cai_row_f32(&y, i), cai_row_f32(&g, i), cai_row_f32(&u, i), g.cols);
    return CAI_OK;
}

cai_status cai_cpu_swiglu_bwd(cai_device_t *dev, cai_tensor *dgate, cai_tensor *dup, const cai_tensor *dout,
                              const cai_tensor *gate, const cai_tensor *up) {
    static const char *op = "swiglu_bwd";
    cai_rows g, u, dy, dg, du;
    CAI_CALL(cai_ops_rows(op, "gate", gate, CAI_HOST, CAI_F32, -1, &g));
    CAI_CALL(cai_ops_rows(op, "up", up, CAI_HOST, CAI_F32, -1, &u));
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_HOST, CAI_F32, -1, &dy));
    CAI_CALL(cai_ops_same_rows(op, "up", &u, "gate", &g));
    CAI_CALL(cai_ops_same_rows(op, "dout", &dy, "gate", &g));
    /* The kernel writes both gradients; both are required (a frozen half of
     * a fused projection still needs its gradient to reach the input). */
    CAI_CALL(cai_ops_rows(op, "dgate", dgate, CAI_HOST, CAI_F32, -1, &dg));
    CAI_CALL(cai_ops_same_rows(op, "dgate", &dg, "gate", &g));
    CAI_CALL(cai_ops_rows(op, "dup", dup, CAI_HOST, CAI_F32, -1, &du));
    CAI_CALL(cai_ops_same_rows(op, "dup", &du, "gate", &g));
#pragma omp parallel for num_threads(cai_cpu_threads(dev, g.rows)) schedule(static)
    for (int64_t i = 0; i < g.rows; i++)
        cai_k_swiglu_bwd(cai_row_f32(&dg, i), cai_row_f32(&du, i), cai_row_f32(&g, i), cai_row_f32(&u, i),
                         cai_row_f32(&dy, i), g.cols);
    return CAI_OK;
}

cai_status cai_cpu_rope_tables(cai_device_t *dev, cai_tensor *cos_t, cai_tensor *sin_t, double theta) {
    static const char *op = "rope_tables";
    cai_rows c, s;
    CAI_CALL(cai_ops_rows(op, "cos", cos_t, CAI_HOST, CAI_F32, -1, &c));
    CAI_CALL(cai_ops_rows(op, "sin", sin_t, CAI_HOST, CAI_F32, -1, &s));
    CAI_CALL(cai_ops_same_rows(op, "sin", &s, "cos", &c));
    CAI_CHECK_ARG(theta > 0, "%s: theta %g must be positive", op, theta);
    const int64_t half = c.cols, R = 2 * half;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, c.rows)) schedule(static)
    for (int64_t p = 0; p < c.rows; p++) {
        float *pc = cai_row_f32(&c, p), *ps = cai_row_f32(&s, p);
        for (int64_t i = 0; i < half; i++) {
            double ang = (double)p * pow(theta, -(double)(2 * i) / (double)R);
            pc[i] = (float)cos(ang);
            ps[i] = (float)sin(ang);
        }
    }
    return CAI_OK;
}

typedef struct {
    cai_bthd x, y;
    cai_rows c, s;
    const int32_t *pos;
    int pos_per_batch; /* positions is [B,T] (else [T]) */
} rope_args;

static cai_status rope_check(const char *op, rope_args *a, const cai_tensor *out, const char *out_name,
                             const cai_tensor *inp, const char *inp_name, const cai_tensor *cos, const cai_tensor *sin,
                             const cai_tensor *positions, int64_t pos_offset) {
    memset(a, 0, sizeof *a);
    CAI_CALL(cai_ops_bthd(op, inp_name, inp, CAI_HOST, CAI_F32, &a->x));
    CAI_CALL(cai_ops_bthd(op, out_name, out, CAI_HOST, CAI_F32, &a->y));
    if (!cai_tensor_same_shape(inp, out))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s but %s is %s", op, out_name, CAI_OPS_DESCRIBE(out),
                         inp_name, CAI_OPS_DESCRIBE(inp));
    CAI_CALL(cai_ops_rows(op, "cos", cos, CAI_HOST, CAI_F32, -1, &a->c));
    CAI_CALL(cai_ops_rows(op, "sin", sin, CAI_HOST, CAI_F32, a->c.cols, &a->s));
    CAI_CALL(cai_ops_same_rows(op, "sin", &a->s, "cos", &a->c));
    if (2 * a->c.cols > a->x.D || a->c.cols == 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: tables of %" PRId64 " frequencies rotate %" PRId64 " dims but head_dim is %" PRId64, op,
                         a->c.cols, 2 * a->c.cols, a->x.D);
    const int64_t P = a->c.rows;
    if (positions) {
        char *pp;
        CAI_CALL(cai_ops_vec(op, "positions", positions, CAI_HOST, CAI_I32, -1, &pp));
        int64_t n = cai_tensor_numel(positions);
        if (n != a->x.T && n != a->x.B * a->x.T)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: positions is %s, expected [B,T] = [%" PRId64 ",%" PRId64 "] or [T]", op,
                             CAI_OPS_DESCRIBE(positions), a->x.B, a->x.T);
        a->pos = (const int32_t *)pp;
        a->pos_per_batch = n != a->x.T || a->x.B == 1;
        for (int64_t i = 0; i < n; i++)
            if (a->pos[i] < 0 || a->pos[i] >= P)
                return CAI_ERROR(CAI_ERR_INVALID_ARG,
                                 "%s: positions[%" PRId64
                                 "] = %d is outside the tables' "
                                 "[0, %" PRId64 ")",
                                 op, i, (int)a->pos[i], P);
    } else if (pos_offset < 0 || pos_offset + a->x.T > P) {
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: positions [%" PRId64 ", %" PRId64 ") exceed the tables' %" PRId64
                         " rows (build them for a longer max_pos)",
                         op, pos_offset, pos_offset + a->x.T, P);
    }
    return CAI_OK;
}

/* sign = +1 rotates forward, -1 applies the transpose (backward). */
static void rope_apply(const cai_device_t *dev, const rope_args *a, int64_t pos_offset, float sign) {
    const int64_t B = a->x.B, T = a->x.T, H = a->x.H, D = a->x.D, half = a->c.cols;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, B *T)) schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, t = bt % T;
        int64_t p = a->pos ? a->pos[a->pos_per_batch ? bt : t] : pos_offset + t;
        const float *pc = cai_row_f32(&a->c, p), *ps = cai_row_f32(&a->s, p);
        for (int64_t h = 0; h < H; h++) {
            const float *x = (const float *)a->x.data + b * a->x.sb + t * a->x.st + h * a->x.sh;
            float *y = (float *)a->y.data + b * a->y.sb + t * a->y.st + h * a->y.sh;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half], c = pc[i], s = sign * ps[i];
                y[i] = x1 * c - x2 * s;
                y[i + half] = x2 * c + x1 * s;
            }
            if (y != x)
                for (int64_t i = 2 * half; i < D; i++) y[i] = x[i];
        }
    }
}

cai_status cai_cpu_rope_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *cos,
                            const cai_tensor *sin, const cai_tensor *positions, int64_t pos_offset) {
    rope_args a;
    CAI_CALL(rope_check("rope_fwd", &a, out, "out", inp, "inp", cos, sin, positions, pos_offset));
    rope_apply(dev, &a, pos_offset, 1.0f);
    return CAI_OK;
}

cai_status cai_cpu_rope_bwd(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *dout, const cai_tensor *cos,
                            const cai_tensor *sin, const cai_tensor *positions, int64_t pos_offset) {
    rope_args a;
    CAI_CALL(rope_check("rope_bwd", &a, dinp, "dinp", dout, "dout", cos, sin, positions, pos_offset));
    rope_apply(dev, &a, pos_offset, -1.0f);
    return CAI_OK;
}
