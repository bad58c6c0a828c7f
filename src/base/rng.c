/* Philox-4x32-10 (Salmon et al., SC'11): a keyed bijection on 128-bit
 * counters, so element i of any stream is computable in isolation. */
#include "cai_config.h"
#include "colossal/base.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

cai_philox_block cai_philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
    uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
    uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    cai_philox_block b = {{c0, c1, c2, c3}};
    return b;
}

static inline float u32_to_unit(uint32_t x) {
    /* 24 random bits -> [0,1) exactly representable in float */
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

float cai_rng_uniform(uint64_t seed, uint64_t stream_id, uint64_t index) {
    cai_philox_block b = cai_philox4x32(seed, stream_id, index);
    return u32_to_unit(b.v[0]);
}

float cai_rng_normal(uint64_t seed, uint64_t stream_id, uint64_t index) {
    cai_philox_block b = cai_philox4x32(seed, stream_id, index);
    /* (0,1] for the log so it never sees zero */
    double u1 = ((double)(b.v[0] >> 8) + 1.0) / 16777216.0;
    double u2 = (double)(b.v[1] >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t cai_hash64(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; s && *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}
