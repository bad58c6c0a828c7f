/* Reproducible shuffles, Megatron's split and blending arithmetic, and the
 * distributed sampler. Nothing here communicates: every rank derives the
 * same answer from the same inputs, which is what makes resumption exact. */
#include "cai_config.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/data.h"

void cai_data_shuffle(int64_t *a, int64_t n, uint64_t seed, uint64_t stream) {
    for (int64_t i = n - 1; i > 0; i--) {
        cai_philox_block b = cai_philox4x32(seed, stream, (uint64_t)i);
        const uint64_t r = ((uint64_t)b.v[0] << 32) | b.v[1];
        /* Lemire's multiply-shift: bias below 2^-24 for any n < 2^40. */
        const int64_t j = (int64_t)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
        const int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ------------------------------------------------------------------ split */

cai_status cai_data_split_ranges(const char *spec, int64_t n, int64_t bounds[4]) {
    CAI_CHECK_ARG(bounds != NULL && n >= 0, "cai_data_split_ranges: bad arguments");
    if (!spec || !*spec) spec = "1";
    double w[3] = {0, 0, 0};
    int k = 0;
    const char *p = spec;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        char *end;
        double v = strtod(p, &end);
        if (end == p || !isfinite(v) || v < 0)
            return CAI_ERROR(
                CAI_ERR_CONFIG,
                "split \"%s\": expected up to 3 non-negative numbers separated by commas (train,valid,test), "
                "e.g. \"98,2,0\"",
                spec);
        if (k == 3) return CAI_ERROR(CAI_ERR_CONFIG, "split \"%s\": more than 3 parts (train,valid,test)", spec);
        w[k++] = v;
        p = end;
        while (isspace((unsigned char)*p)) p++;
        if (!*p) break;
        if (*p != ',')
            return CAI_ERROR(CAI_ERR_CONFIG, "split \"%s\": unexpected '%c'; separate the parts with commas", spec, *p);
        p++;
    }
    const double sum = w[0] + w[1] + w[2];
    if (!(sum > 0)) return CAI_ERROR(CAI_ERR_CONFIG, "split \"%s\": the parts sum to 0", spec);
    /* Megatron's get_split_indices: round each part (half to even, like
     * Python's round), then move every later bound by the excess. */
    bounds[0] = 0;
    for (int i = 0; i < 3; i++) bounds[i + 1] = bounds[i] + (int64_t)nearbyint(w[i] / sum * (double)n);
    const int64_t excess = bounds[3] - n;
    for (int i = 1; i < 4; i++) {
        bounds[i] -= excess;
        /* Megatron can produce a negative bound here (e.g. "0,1,1" of 3);
         * clamping keeps the ranges ordered and inside [0, n]. */
        if (bounds[i] < bounds[i - 1]) bounds[i] = bounds[i - 1];
        if (bounds[i] > n) bounds[i] = n;
    }
    bounds[3] = n;
    return CAI_OK;
}

/* ------------------------------------------------------------------ blending */

cai_status cai_data_blend_indices(const double *weights, int n, int64_t size, int16_t *dataset_index,
                                  int64_t *dataset_sample_index) {
    CAI_CHECK_ARG(weights && n > 0 && n <= INT16_MAX && size >= 0 &&
                      (size == 0 || (dataset_index && dataset_sample_index)),
                  "cai_data_blend_indices: bad arguments (n = %d datasets, size %lld)", n, (long long)size);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!(weights[i] >= 0) || !isfinite(weights[i]))
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "blend weight %d is %g; weights must be finite and >= 0", i,
                             weights[i]);
        sum += weights[i];
    }
    if (!(sum > 0)) return CAI_ERROR(CAI_ERR_INVALID_ARG, "blend weights sum to 0");
    double *w = malloc((size_t)n * sizeof *w);
    int64_t *count = calloc((size_t)n, sizeof *count);
    if (!w || !count) {
        free(w);
        free(count);
        return CAI_ERROR(CAI_ERR_NOMEM, "blend state for %d datasets", n);
    }
    for (int i = 0; i < n; i++) w[i] = weights[i] / sum;
    for (int64_t s = 0; s < size; s++) {
        const double at = s > 1 ? (double)s : 1.0;
        int best = -1;
        double best_err = 0;
        for (int i = 0; i < n; i++) {
            /* Megatron would let a zero weight win a tie at sample 1; a part
             * with nothing to give (an empty split) must never be picked. */
            if (w[i] == 0) continue;
            const double err = w[i] * at - (double)count[i];
            if (best < 0 || err > best_err) {
                best_err = err;
                best = i;
            }
        }
        dataset_index[s] = (int16_t)best;
        dataset_sample_index[s] = count[best]++;
    }
    free(w);
    free(count);
    return CAI_OK;
}

/* ------------------------------------------------------------------ distributed sampler */

struct cai_sampler {
    cai_sampler_config cfg;
    int64_t consumed, local;
    int64_t *perm;      /* permutation of the cached epoch (shuffle only) */
    int64_t perm_epoch; /* -1: none cached */
};

/* Stream tag for the per-epoch permutations ("SAMP"). */
#define SAMPLER_STREAM (0x53414d50ull << 32)

cai_status cai_sampler_init(cai_sampler_t **out, const cai_sampler_config *cfg, int64_t consumed_samples) {
    CAI_CHECK_ARG(out && cfg, "cai_sampler_init: NULL argument");
    *out = NULL;
    CAI_CHECK_ARG(cfg->dataset_size > 0, "sampler: the dataset is empty (size %lld)", (long long)cfg->dataset_size);
    CAI_CHECK_ARG(cfg->dp_size > 0 && cfg->dp_rank >= 0 && cfg->dp_rank < cfg->dp_size,
                  "sampler: data-parallel rank %d of %d", cfg->dp_rank, cfg->dp_size);
    CAI_CHECK_ARG(cfg->global_batch > 0 && cfg->global_batch % cfg->dp_size == 0,
                  "sampler: global batch %lld is not a positive multiple of the data-parallel size %d (try %lld)",
                  (long long)cfg->global_batch, cfg->dp_size,
                  (long long)((cfg->global_batch / cfg->dp_size + 1) * cfg->dp_size));
    CAI_CHECK_ARG(consumed_samples >= 0, "sampler: consumed samples %lld is negative", (long long)consumed_samples);
    /* The position to resume at (a checkpoint's consumed_samples): epochs
     * past the dataset repeat it, but the epoch number tags the shuffle's
     * random stream in 32 bits, and no run makes 2^32 passes. */
    const int64_t epochs = consumed_samples / cfg->dataset_size;
    if (epochs >= ((int64_t)1 << 32) || consumed_samples > INT64_MAX / 2 - cfg->global_batch)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "sampler: consumed samples %lld (the resume position) is %lld passes over "
                         "this %lld-sample dataset, past anything a run reaches: a checkpoint of another dataset, or "
                         "a damaged one",
                         (long long)consumed_samples, (long long)epochs, (long long)cfg->dataset_size);
    if (epochs > 0)
        CAI_WARN(
            "sampler: resuming at consumed sample %lld of a %lld-sample dataset: pass %lld over the data (the "
            "dataset repeats; a checkpoint of a larger dataset?)",
            (long long)consumed_samples, (long long)cfg->dataset_size, (long long)epochs + 1);
    cai_sampler_t *s = calloc(1, sizeof *s);
    if (!s) return CAI_ERROR(CAI_ERR_NOMEM, "sampler");
    s->cfg = *cfg;
    s->consumed = consumed_samples;
    s->local = cfg->global_batch / cfg->dp_size;
    s->perm_epoch = -1;
    if (cfg->shuffle) {
        cai_status st =
            cai_malloc((void **)&s->perm, (size_t)cfg->dataset_size * sizeof *s->perm, "sampler permutation");
        if (st != CAI_OK) {
            free(s);
            CAI_CALL(st);
        }
    }
    *out = s;
    return CAI_OK;
}

cai_status cai_sampler_next(cai_sampler_t *s, int64_t *indices) {
    CAI_CHECK_ARG(s && indices, "cai_sampler_next: NULL argument");
    const int64_t N = s->cfg.dataset_size;
    const int64_t first = s->consumed + (int64_t)s->cfg.dp_rank * s->local;
    for (int64_t k = 0; k < s->local; k++) {
        const int64_t p = first + k, epoch = p / N, at = p % N;
        if (!s->cfg.shuffle) {
            indices[k] = at;
            continue;
        }
        if (epoch != s->perm_epoch) {
            for (int64_t i = 0; i < N; i++) s->perm[i] = i;
            cai_data_shuffle(s->perm, N, s->cfg.seed, SAMPLER_STREAM | (uint64_t)epoch);
            s->perm_epoch = epoch;
        }
        indices[k] = s->perm[at];
    }
    s->consumed += s->cfg.global_batch;
    return CAI_OK;
}

int64_t cai_sampler_consumed(const cai_sampler_t *s) { return s->consumed; }
int64_t cai_sampler_local_batch(const cai_sampler_t *s) { return s->local; }

void cai_sampler_free(cai_sampler_t *s) {
    if (!s) return;
    cai_free(s->perm);
    free(s);
}
