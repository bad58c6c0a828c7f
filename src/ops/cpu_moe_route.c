/* CPU backend: the mixture-of-experts router (ops.h moe_route, moe_assign,
 * moe_router_sums, moe_router_bwd). Tokens are independent in the route and
 * its backward, so the token loops split across threads without changing a
 * bit; the assignment and the sums run in one fixed order. */
#include "cai_config.h"
#include "cpu_internal.h"
#include "moe_route_math.h"

_Static_assert(CAI_MOE_FN_TOPK_SOFTMAX == (int)CAI_ROUTE_TOPK_SOFTMAX && CAI_MOE_FN_SIGMOID == (int)CAI_ROUTE_SIGMOID,
               "moe_route_math.h numbers the router functions as ops.h does");

#include <math.h>
#include <string.h>

CPU_OP(moe_route)(cai_device_t *dev, cai_tensor *sel, cai_tensor *wts, cai_tensor *probs, cai_tensor *lse,
                  const cai_tensor *logits, cai_route_fn fn, int norm_topk) {
    static const char op[] = "moe_route";
    cai_route_args r;
    CAI_CALL(cai_ops_moe_route_args(op, CAI_DEVICE_HOST, (int)fn, sel, wts, probs, lse, logits, &r));
    const int64_t N = r.N, E = r.E, k = r.k;
    const int nt = cai_cpu_threads(dev, N / 256);
    int bad = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(max : bad)
    for (int64_t t = 0; t < N; t++)
        if (cai_moe_route_token((int)fn, norm_topk, E, k, r.logits + t * E, r.sel + t * k, r.wts + t * k,
                                r.probs + t * E, r.lse + t) >= 0)
            bad = 1;
    if (!bad) return CAI_OK;
    for (int64_t t = 0; t < N; t++)
        for (int64_t e = 0; e < E; e++)
            if (!isfinite(r.logits[t * E + e]))
                return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: logit of token %" PRId64 " for expert %" PRId64 " is %g", op,
                                 t, e, (double)r.logits[t * E + e]);
    return CAI_OK;
}

CPU_OP(moe_assign)(cai_device_t *dev, cai_tensor *pos, cai_tensor *load, cai_tensor *kept, const cai_tensor *sel,
                   int64_t capacity) {
    static const char op[] = "moe_assign";
    (void)dev;
    int64_t n, E, *ld, *kp;
    int32_t *p;
    const int32_t *s;
    CAI_CALL(cai_ops_assign_args(op, CAI_DEVICE_HOST, pos, load, kept, sel, capacity, &n, &E, &p, &ld, &kp, &s));
    for (int64_t i = 0; i < n; i++)
        if (s[i] < 0 || s[i] >= E)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: sel[%" PRId64 "] = %d is not one of the %" PRId64 " experts", op,
                             i, s[i], E);
    memset(ld, 0, (size_t)E * sizeof *ld);
    for (int64_t i = 0; i < n; i++) ld[s[i]]++;
    /* kp holds each expert's first row while ld counts again, so each
     * choice learns its rank among the expert's earlier ones */
    int64_t start = 0;
    for (int64_t e = 0; e < E; e++) {
        kp[e] = start;
        start += ld[e] < capacity ? ld[e] : capacity;
    }
    memset(ld, 0, (size_t)E * sizeof *ld);
    for (int64_t i = 0; i < n; i++) {
        const int64_t rank = ld[s[i]]++;
        p[i] = rank < capacity ? (int32_t)(kp[s[i]] + rank) : -1;
    }
    for (int64_t e = 0; e < E; e++) kp[e] = ld[e] < capacity ? ld[e] : capacity;
    return CAI_OK;
}

CPU_OP(moe_router_sums)(cai_device_t *dev, cai_tensor *sums, const cai_tensor *probs, const cai_tensor *lse,
                        cai_route_fn fn) {
    static const char op[] = "moe_router_sums";
    (void)dev;
    cai_route_args r;
    double *o;
    CAI_CALL(cai_ops_moe_sums_args(op, CAI_DEVICE_HOST, (int)fn, sums, probs, lse, &r, &o));
    const int64_t N = r.N, E = r.E;
    for (int64_t e = 0; e <= E; e++) o[e] = 0.0;
    for (int64_t t = 0; t < N; t++) {
        const float *p = r.probs + t * E;
        double norm = 1.0;
        if (fn == CAI_ROUTE_SIGMOID) {
            norm = 0.0;
            for (int64_t e = 0; e < E; e++) norm += p[e];
        }
        for (int64_t e = 0; e < E; e++) o[e] += p[e] / norm;
        o[E] += (double)r.lse[t] * r.lse[t];
    }
    return CAI_OK;
}

CPU_OP(moe_router_bwd)(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits, const cai_tensor *probs,
                       const cai_tensor *lse, const cai_tensor *sel, const cai_tensor *wts, const cai_tensor *dw,
                       const cai_tensor *load, cai_route_fn fn, int norm_topk, double aux_scale, double z_scale) {
    static const char op[] = "moe_router_bwd";
    cai_route_args r;
    CAI_CALL(
        cai_ops_moe_router_bwd_args(op, CAI_DEVICE_HOST, (int)fn, dlogits, logits, probs, lse, sel, wts, dw, load, &r));
    const int64_t N = r.N, E = r.E, k = r.k;
    const int nt = cai_cpu_threads(dev, N / 256);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t t = 0; t < N; t++)
        cai_moe_router_bwd_token((int)fn, norm_topk, N, E, k, r.logits + t * E, r.probs + t * E, r.lse[t],
                                 r.sel + t * k, r.wts + t * k, r.dw + t * k, r.load, aux_scale, z_scale,
                                 r.dlogits + t * E);
    return CAI_OK;
}
