/* FP8 scaling recipes on the host (colossal/tensor.h): the arithmetic every
 * backend's casts and the model's per-step update share, so a GPU run and
 * its CPU emulation derive the same scales from the same amaxes. */
#include "cai_config.h"
#include "colossal/tensor.h"

#include <math.h>

const char *cai_fp8_format_name(cai_fp8_format f) { return f == CAI_FP8_E5M2 ? "e5m2" : "e4m3"; }

float cai_fp8_scale_from_amax(float amax, cai_fp8_format f, int margin, float prev) {
    if (!(amax > 0.0f) || !isfinite(amax)) return prev;
    float s = cai_fp8_max(f) / amax / ldexpf(1.0f, margin);
    return isfinite(s) && s > 0.0f ? s : prev;
}

void cai_fp8_meta_update(float *meta, int history, cai_fp8_format f, cai_fp8_amax_algo algo, int margin) {
    float *h = meta + CAI_FP8_META_AMAX;
    float amax = h[0];
    if (algo == CAI_FP8_AMAX_MAX)
        for (int i = 1; i < history; i++) amax = h[i] > amax || isnan(h[i]) ? h[i] : amax;
    float s = cai_fp8_scale_from_amax(amax, f, margin, meta[CAI_FP8_META_SCALE]);
    meta[CAI_FP8_META_SCALE] = s;
    meta[CAI_FP8_META_SCALE_INV] = s > 0.0f ? 1.0f / s : 0.0f;
    for (int i = history - 1; i > 0; i--) h[i] = h[i - 1];
    h[0] = 0.0f;
}

float cai_fp8_quantize_host(uint8_t *q, const float *x, size_t n, float scale, cai_fp8_format f) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax || isnan(a) ? a : amax;
        if (q) q[i] = cai_f32_to_fp8(x[i] * scale, f);
    }
    return amax;
}
