/* The mixture-of-experts router's per-token arithmetic (ops.h moe_route,
 * moe_router_bwd), shared by the CPU backend (cpu_moe_route.c) and the CUDA
 * kernels (kernels/moe_route.cu) so both compute one formula in one order:
 * double throughout, rounded once per stored value. */
#ifndef CAI_MOE_ROUTE_MATH_H
#define CAI_MOE_ROUTE_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CAI_HD __host__ __device__
#else
#define CAI_HD
#endif

/* the scoring functions' numbers (ops.h cai_route_fn) */
#define CAI_MOE_FN_TOPK_SOFTMAX 1
#define CAI_MOE_FN_SIGMOID 2

/* One token: lse, probs, the k largest logits and their weights. Returns
 * the first non-finite logit's expert, or -1. */
CAI_HD static inline int cai_moe_route_token(int fn, int norm_topk, int64_t E, int64_t k, const float *l, int32_t *s,
                                             float *w, float *p, float *lse) {
    double mx = -INFINITY;
    for (int64_t e = 0; e < E; e++) {
        if (!isfinite(l[e])) return (int)e;
        if (l[e] > mx) mx = l[e];
    }
    double se = 0.0;
    for (int64_t e = 0; e < E; e++) se += exp((double)l[e] - mx);
    const double lz = mx + log(se);
    *lse = (float)lz;
    for (int64_t e = 0; e < E; e++)
        p[e] = fn == CAI_MOE_FN_SIGMOID ? (float)(1.0 / (1.0 + exp(-(double)l[e]))) : (float)exp((double)l[e] - lz);
    /* softmax and sigmoid are monotone: rank by the logit */
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j; i++) taken |= s[i] == e;
            if (!taken && (best < 0 || l[e] > l[best])) best = e;
        }
        s[j] = (int32_t)best;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < k; j++) {
        double v = fn == CAI_MOE_FN_TOPK_SOFTMAX ? exp((double)l[s[j]] - (double)l[s[0]]) : (double)p[s[j]];
        w[j] = (float)v;
        sum += v;
    }
    if (fn == CAI_MOE_FN_TOPK_SOFTMAX || norm_topk)
        for (int64_t j = 0; j < k; j++) w[j] = (float)((double)w[j] / sum);
    return -1;
}

/* One token's logit gradient: the combine weights' part (through the
 * renormalisation and the scoring function) and the two losses'. */
CAI_HD static inline void cai_moe_router_bwd_token(int fn, int norm_topk, int64_t N, int64_t E, int64_t k,
                                                   const float *l, const float *p, float lz, const int32_t *s,
                                                   const float *w, const float *dw, const int64_t *load, double ca,
                                                   double zs, float *dl) {
    const double cz = zs * 2.0 * lz / N;
    double dot = 0.0;
    for (int64_t j = 0; j < k; j++) dot += (double)dw[j] * w[j];
    /* the aux loss averages p, or for sigmoid the per-token normalised
     * scores q = s / sum s */
    double psum = 0.0;
    if (fn == CAI_MOE_FN_SIGMOID)
        for (int64_t e = 0; e < E; e++) psum += p[e];
    double aq = 0.0;
    for (int64_t e = 0; e < E; e++) aq += ca * load[e] * p[e];
    if (fn == CAI_MOE_FN_SIGMOID) aq /= psum;
    for (int64_t e = 0; e < E; e++)
        dl[e] = (float)(fn == CAI_MOE_FN_SIGMOID ? (ca * load[e] - aq) / psum : ca * load[e]);
    if (fn != CAI_MOE_FN_TOPK_SOFTMAX) {
        /* combine weights w_j = p_{s_j} (/ sum of the k) */
        double ssum = 0.0;
        for (int64_t j = 0; j < k; j++) ssum += p[s[j]];
        for (int64_t j = 0; j < k; j++) dl[s[j]] += (float)(norm_topk ? (dw[j] - dot) / ssum : dw[j]);
    }
    if (fn == CAI_MOE_FN_SIGMOID) {
        for (int64_t e = 0; e < E; e++) dl[e] = (float)((double)dl[e] * p[e] * (1.0 - p[e]));
    } else {
        double pd = 0.0;
        for (int64_t e = 0; e < E; e++) pd += (double)p[e] * dl[e];
        for (int64_t e = 0; e < E; e++) dl[e] = (float)(p[e] * ((double)dl[e] - pd));
    }
    if (fn == CAI_MOE_FN_TOPK_SOFTMAX)
        for (int64_t j = 0; j < k; j++) dl[s[j]] += (float)(w[j] * ((double)dw[j] - dot));
    for (int64_t e = 0; e < E; e++) {
        const double sm = fn == CAI_MOE_FN_SIGMOID ? exp((double)l[e] - lz) : (double)p[e];
        dl[e] += (float)(cz * sm);
    }
}

#endif
