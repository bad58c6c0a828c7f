/* Buffer conversions between f32, bf16 and f16 on host memory. The scalar
 * rounding rules live in tensor.h (inline) so every backend's host code and
 * the tests share one definition. */
#include "cai_config.h"
#include "colossal/tensor.h"

static int is_float16ish(cai_dtype dt) { return dt == CAI_DTYPE_BF16 || dt == CAI_DTYPE_F16; }

static cai_status check_float_dtype(cai_dtype dt, const char *which) {
    if (dt == CAI_DTYPE_F32 || is_float16ish(dt)) return CAI_OK;
    return CAI_ERROR(CAI_ERR_UNSUPPORTED, "conversion %s dtype %s is not one of f32, bf16, f16", which,
                     cai_dtype_name(dt));
}

static void to_f32(float *dst, const void *src, cai_dtype dt, size_t n) {
    if (dt == CAI_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == CAI_DTYPE_BF16) {
        const cai_bf16 *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = cai_bf16_to_f32(s[i]);
    } else {
        const cai_f16 *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = cai_f16_to_f32(s[i]);
    }
}

static void from_f32(void *dst, cai_dtype dt, const float *src, size_t n) {
    if (dt == CAI_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == CAI_DTYPE_BF16) {
        cai_bf16 *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = cai_f32_to_bf16(src[i]);
    } else {
        cai_f16 *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = cai_f32_to_f16(src[i]);
    }
}

cai_status cai_convert_host(void *dst, cai_dtype dst_dtype, const void *src, cai_dtype src_dtype, size_t n) {
    CAI_CALL(check_float_dtype(dst_dtype, "destination"));
    CAI_CALL(check_float_dtype(src_dtype, "source"));
    if (n == 0) return CAI_OK;
    CAI_CHECK_ARG(dst && src, "cai_convert_host: NULL buffer for %zu elements", n);
    if (dst_dtype == src_dtype) {
        memcpy(dst, src, n * cai_dtype_size(dst_dtype));
    } else if (src_dtype == CAI_DTYPE_F32) {
        from_f32(dst, dst_dtype, src, n);
    } else if (dst_dtype == CAI_DTYPE_F32) {
        to_f32(dst, src, src_dtype, n);
    } else {
        /* bf16 <-> f16: widen to f32 (exact) in blocks, then round once. */
        float tmp[256];
        const unsigned char *s = src;
        unsigned char *d = dst;
        for (size_t i = 0; i < n; i += 256) {
            size_t m = n - i < 256 ? n - i : 256;
            to_f32(tmp, s + i * 2, src_dtype, m);
            from_f32(d + i * 2, dst_dtype, tmp, m);
        }
    }
    return CAI_OK;
}

uint32_t cai_sr_bits(uint64_t seed, uint64_t stream, uint64_t g) {
    cai_philox_block b = cai_philox4x32(seed, stream, g >> 2);
    return b.v[g & 3];
}

cai_status cai_convert_host_sr(void *dst, cai_dtype dst_dtype, const float *src, size_t n, uint64_t seed,
                               uint64_t stream, uint64_t index_offset) {
    CAI_CALL(check_float_dtype(dst_dtype, "destination"));
    if (n == 0) return CAI_OK;
    CAI_CHECK_ARG(dst && src, "cai_convert_host_sr: NULL buffer for %zu elements", n);
    if (dst_dtype == CAI_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return CAI_OK;
    }
    /* One Philox block serves four consecutive global indices. */
    size_t i = 0;
    while (i < n) {
        uint64_t g = index_offset + i;
        cai_philox_block b = cai_philox4x32(seed, stream, g >> 2);
        for (unsigned lane = (unsigned)(g & 3); lane < 4 && i < n; lane++, i++) {
            if (dst_dtype == CAI_DTYPE_BF16) ((cai_bf16 *)dst)[i] = cai_f32_to_bf16_sr(src[i], b.v[lane]);
            else ((cai_f16 *)dst)[i] = cai_f32_to_f16_sr(src[i], b.v[lane]);
        }
    }
    return CAI_OK;
}
