/* AdamW over many pieces of flat buffers: the one loop that the optimizer
 * over a model's own buffers (src/optim/adamw.c) and the ZeRO engine's
 * sharded step, on the device or offloaded to the host
 * (src/parallel/zero.c), run. */
#include "cai_config.h"
#include "colossal/ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Whether span b continues span a in every buffer, with the same decay. */
static int continues(const cai_adamw_span *a, const cai_adamw_span *b, size_t les) {
    return b->decay == a->decay && b->w == a->w + a->n && b->g == a->g + a->n && b->m == a->m + a->n &&
           b->v == a->v + a->n && (a->lowp == NULL) == (b->lowp == NULL) &&
           (!a->lowp || (const char *)b->lowp == (const char *)a->lowp + a->n * les);
}

/* The run starting at span s: its end (one past its last span) and length. */
static int run_end(const cai_adamw_span *sp, int n_spans, int s, size_t les, size_t *len) {
    *len = sp[s].n;
    int e = s + 1;
    for (; e < n_spans && continues(&sp[e - 1], &sp[e], les); e++) *len += sp[e].n;
    return e;
}

static cai_status one_call(cai_device_t *dev, const cai_adamw_span *s, size_t off, size_t n, cai_dtype lowp_dtype,
                           const cai_adamw_params *p) {
    const size_t les = cai_dtype_size(lowp_dtype);
    cai_tensor w = cai_tensor_1d(dev, s->w + off, CAI_DTYPE_F32, (int64_t)n);
    cai_tensor g = cai_tensor_1d(dev, (void *)(s->g + off), CAI_DTYPE_F32, (int64_t)n);
    cai_tensor m = cai_tensor_1d(dev, s->m + off, CAI_DTYPE_F32, (int64_t)n);
    cai_tensor v = cai_tensor_1d(dev, s->v + off, CAI_DTYPE_F32, (int64_t)n);
    cai_tensor l = cai_tensor_1d(dev, s->lowp ? (char *)s->lowp + off * les : NULL, lowp_dtype, (int64_t)n);
    return dev->ops->adamw(dev, &w, &g, &m, &v, s->lowp ? &l : NULL, p, s->decay);
}

cai_status cai_adamw_spans(cai_device_t *dev, const cai_adamw_span *spans, int n_spans, cai_dtype lowp_dtype,
                           const cai_adamw_params *p, int split) {
    CAI_CHECK_ARG(dev && (spans || n_spans == 0) && p, "cai_adamw_spans: NULL argument");
    CAI_CHECK_ARG(!split || dev->kind == CAI_DEVICE_HOST, "cai_adamw_spans: split runs need a host device");
    const size_t les = cai_dtype_size(lowp_dtype);
    if (!split || dev->num_threads <= 1) {
        /* One op call per run: the update is elementwise, so the bits equal
         * one call per span; on a GPU the launches, not the bytes, cost. */
        for (int s = 0; s < n_spans;) {
            size_t len;
            const int e = run_end(spans, n_spans, s, les, &len);
            CAI_CALL(one_call(dev, &spans[s], 0, len, lowp_dtype, p));
            s = e;
        }
        return CAI_OK;
    }
    /* One parallel region over all runs, each thread taking its share of
     * every run and calling the op on a one-thread view of the device (no
     * team inside the team): a step has hundreds of runs, and with as many
     * threads as cores a region per run would wait for its slowest thread
     * hundreds of times. */
    cai_device_t one = *dev;
    one.num_threads = 1;
    int failed = -1;
#pragma omp parallel num_threads(dev->num_threads)
    {
#ifdef _OPENMP
        const size_t t = (size_t)omp_get_thread_num(), T = (size_t)omp_get_num_threads();
#else
        const size_t t = 0, T = 1;
#endif
        for (int s = 0; s < n_spans;) {
            size_t len;
            const int e = run_end(spans, n_spans, s, les, &len);
            const size_t a = len * t / T, b = len * (t + 1) / T;
            if (b > a && one_call(&one, &spans[s], a, b - a, lowp_dtype, p) != CAI_OK) {
#pragma omp atomic write
                failed = s;
            }
            s = e;
        }
    }
    if (failed >= 0)
        return CAI_ERROR(CAI_ERR_INTERNAL, "AdamW failed on the run starting at span %d (%zu elements)", failed,
                         spans[failed].n);
    return CAI_OK;
}
