/* CPU backend: the AdamW update, elementwise over any contiguous shard. */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct {
    float b1, b2, eps, gs, decay, step_size, bc2_sqrt;
} adamw_k;

/* The update of n contiguous elements. GCC does not vectorise the plain
 * loop: sqrtf may set errno, so every call keeps a branch to the library
 * (only -fno-math-errno for the whole file would lift it). With SSE2 (every
 * x86-64) the body runs four lanes at a time in intrinsics that round
 * exactly as the scalar statements (IEEE mul, add, div, sqrt; no
 * contraction), so results stay bit-identical with the tail and with other
 * builds. */
static void adamw_block(const adamw_k *k, float *restrict w, const float *restrict g, float *restrict mm,
                        float *restrict vv, cai_bf16 *restrict bf, int64_t n) {
    const float b1 = k->b1, b2 = k->b2, eps = k->eps, gs = k->gs, decay = k->decay, step_size = k->step_size,
                bc2_sqrt = k->bc2_sqrt;
    int64_t i = 0;
#if defined(__SSE2__)
    const __m128 vb1 = _mm_set1_ps(b1), vc1 = _mm_set1_ps(1.0f - b1), vb2 = _mm_set1_ps(b2),
                 vc2 = _mm_set1_ps(1.0f - b2), veps = _mm_set1_ps(eps), vgs = _mm_set1_ps(gs),
                 vdec = _mm_set1_ps(decay), vss = _mm_set1_ps(step_size), vbc = _mm_set1_ps(bc2_sqrt);
    for (; i + 4 <= n; i += 4) {
        __m128 gi = _mm_mul_ps(_mm_loadu_ps(g + i), vgs);
        __m128 mi = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(mm + i)), _mm_mul_ps(vc1, gi));
        __m128 vi = _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(vv + i)), _mm_mul_ps(_mm_mul_ps(vc2, gi), gi));
        _mm_storeu_ps(mm + i, mi);
        _mm_storeu_ps(vv + i, vi);
        __m128 den = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), vbc), veps);
        __m128 wi = _mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(w + i), vdec), _mm_div_ps(_mm_mul_ps(vss, mi), den));
        _mm_storeu_ps(w + i, wi);
        if (bf) { /* cai_f32_to_bf16: RNE by carry, NaN quietened, then 32 -> 16 bits through a signed pack */
            const __m128i x = _mm_castps_si128(wi), half = _mm_set1_epi32(0x7fff), one = _mm_set1_epi32(1);
            __m128i lsb = _mm_and_si128(_mm_srli_epi32(x, 16), one);
            __m128i r = _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(x, half), lsb), 16);
            __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(x, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
            __m128i q = _mm_or_si128(_mm_srli_epi32(x, 16), _mm_set1_epi32(0x0040));
            r = _mm_or_si128(_mm_and_si128(nan, q), _mm_andnot_si128(nan, r));
            r = _mm_sub_epi32(r, _mm_set1_epi32(0x8000));
            r = _mm_packs_epi32(r, r);
            r = _mm_xor_si128(r, _mm_set1_epi32(0x80008000));
            _mm_storel_epi64((__m128i *)(void *)(bf + i), r);
        }
    }
#endif
    for (; i < n; i++) {
        float gi = g[i] * gs;
        float mi = b1 * mm[i] + (1.0f - b1) * gi;
        float vi = b2 * vv[i] + (1.0f - b2) * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        w[i] = w[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        if (bf) bf[i] = cai_f32_to_bf16(w[i]);
    }
}

cai_status cai_cpu_adamw(cai_device_t *dev, cai_tensor *param, const cai_tensor *grad, cai_tensor *m, cai_tensor *v,
                         cai_tensor *param_lowp, const cai_adamw_params *p, int apply_decay) {
    static const char *op = "adamw";
    char *pp, *pg, *pm, *pv, *pl = NULL;
    CAI_CHECK_ARG(p, "%s: NULL hyper-parameters", op);
    CAI_CHECK_ARG(p->step >= 1, "%s: step %" PRId64 " must start at 1 (bias correction divides by 1 - beta^step)", op,
                  p->step);
    CAI_CHECK_ARG(p->beta1 >= 0 && p->beta1 < 1 && p->beta2 >= 0 && p->beta2 < 1,
                  "%s: betas (%g, %g) must lie in [0, 1)", op, p->beta1, p->beta2);
    CAI_CALL(cai_ops_vec(op, "param", param, CAI_HOST, CAI_F32, -1, &pp));
    int64_t n = cai_tensor_numel(param);
    CAI_CALL(cai_ops_vec(op, "grad", grad, CAI_HOST, CAI_F32, n, &pg));
    CAI_CALL(cai_ops_vec(op, "m", m, CAI_HOST, CAI_F32, n, &pm));
    CAI_CALL(cai_ops_vec(op, "v", v, CAI_HOST, CAI_F32, n, &pv));
    cai_dtype ldt = CAI_DTYPE_F32;
    if (param_lowp) {
        CAI_CALL(cai_ops_vec(op, "param_lowp", param_lowp, CAI_HOST, CAI_ANYF, n, &pl));
        ldt = param_lowp->dtype;
    }
    float *w = (float *)pp, *mm = (float *)pm, *vv = (float *)pv;
    const float *g = (const float *)pg;
    /* Bias corrections in double: beta^step underflows gracefully, and the
     * same numbers come out on every rank and shard. */
    const double bc1 = 1.0 - pow((double)p->beta1, (double)p->step);
    const double bc2 = 1.0 - pow((double)p->beta2, (double)p->step);
    const float step_size = (float)(p->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float decay = apply_decay ? 1.0f - p->lr * p->weight_decay : 1.0f;
    const adamw_k k = {p->beta1, p->beta2, p->eps, p->grad_scale, decay, step_size, bc2_sqrt};
    /* Blocks of the flat shard, split statically over the threads: each
     * block is updated (four lanes at a time, see adamw_block) and,
     * while it is still in cache, rounded to the working copy. One pass over
     * memory at the bandwidth of all threads; a separate single-threaded
     * conversion afterwards would cost more than the update (ZeRO offload
     * rounds the whole shard every step; bench/offload_bench). */
    const int64_t blk = 16384, nblk = (n + blk - 1) / blk;
    const size_t les = pl ? cai_dtype_size(ldt) : 0;
    int bad = 0;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, nblk)) schedule(static) reduction(| : bad)
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t lo = b * blk, hi = lo + blk < n ? lo + blk : n;
        cai_bf16 *bf = ldt == CAI_DTYPE_BF16 ? (cai_bf16 *)(void *)pl + lo : NULL; /* rounded in the same loop */
        adamw_block(&k, w + lo, g + lo, mm + lo, vv + lo, bf, hi - lo);
        if (pl && !bf && cai_convert_host(pl + (size_t)lo * les, ldt, w + lo, CAI_DTYPE_F32, (size_t)(hi - lo)))
            bad = 1;
    }
    if (bad) return cai_error_status();
    return CAI_OK;
}
