/* Token sampling over one F32 logits row: Hugging Face's logits processors
 * (repetition penalty, temperature, top-k, top-p, min-p) with OpenAI's
 * frequency and presence penalties in between, and one counter-based draw
 * per token, so that a request's tokens depend only on its own logits,
 * parameters, history and position in the output, never on its batch. */
#include "cai_config.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/infer.h"

/* ------------------------------------------------------------------ parameters */

cai_sampling_params cai_sampling_default(void) {
    cai_sampling_params p;
    memset(&p, 0, sizeof p);
    p.max_new_tokens = 16;
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    p.logprobs = -1;
    return p;
}

cai_status cai_sampling_check(const cai_sampling_params *p) {
    CAI_CHECK_ARG(p, "cai_sampling_check: NULL parameters");
    const cai_status e = CAI_ERR_INVALID_ARG;
    if (p->max_new_tokens < 1) return CAI_ERROR(e, "max_new_tokens=%d: must be >= 1", p->max_new_tokens);
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return CAI_ERROR(e, "temperature=%g: must be a finite number >= 0 (0: greedy)", (double)p->temperature);
    if (p->top_k < 0) return CAI_ERROR(e, "top_k=%d: must be >= 0 (0: off)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return CAI_ERROR(e, "top_p=%g: must be in (0, 1] (1: off)", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return CAI_ERROR(e, "min_p=%g: must be in [0, 1] (0: off)", (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return CAI_ERROR(e, "repetition_penalty=%g: must be a finite number > 0 (1: off)",
                         (double)p->repetition_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return CAI_ERROR(e, "frequency_penalty=%g: must be in [-2, 2] (0: off)", (double)p->frequency_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return CAI_ERROR(e, "presence_penalty=%g: must be in [-2, 2] (0: off)", (double)p->presence_penalty);
    if (p->n_stop < 0 || p->n_stop > CAI_SAMPLE_MAX_STOP)
        return CAI_ERROR(e, "n_stop=%d: must be in [0, %d] (stop strings per request)", p->n_stop, CAI_SAMPLE_MAX_STOP);
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0])
            return CAI_ERROR(e, "stop[%d]: must be a non-empty string (an empty one would match at once)", i);
    if (p->n_stop_ids < 0 || p->n_stop_ids > CAI_SAMPLE_MAX_STOP_IDS)
        return CAI_ERROR(e, "n_stop_ids=%d: must be in [0, %d] (stop token ids per request)", p->n_stop_ids,
                         CAI_SAMPLE_MAX_STOP_IDS);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0) return CAI_ERROR(e, "stop_ids[%d]=%d: must be a token id >= 0", i, p->stop_ids[i]);
    if (p->logprobs < -1 || p->logprobs > CAI_SAMPLE_MAX_LOGPROBS)
        return CAI_ERROR(e, "logprobs=%d: must be in [-1, %d] (-1: none, 0: the chosen token's, n: plus the top n)",
                         p->logprobs, CAI_SAMPLE_MAX_LOGPROBS);
    return CAI_OK;
}

cai_status cai_sampling_copy(cai_sampling_params *dst, const cai_sampling_params *src) {
    CAI_CHECK_ARG(dst && src && dst != src, "cai_sampling_copy: NULL or identical arguments");
    CAI_CHECK_ARG(src->n_stop >= 0 && src->n_stop <= CAI_SAMPLE_MAX_STOP,
                  "cai_sampling_copy: n_stop=%d: must be in [0, %d]", src->n_stop, CAI_SAMPLE_MAX_STOP);
    cai_sampling_params t = *src;
    for (int i = 0; i < CAI_SAMPLE_MAX_STOP; i++) t.stop[i] = NULL;
    for (int i = 0; i < src->n_stop; i++) {
        if (!src->stop[i]) continue;
        t.stop[i] = strdup(src->stop[i]);
        if (!t.stop[i]) {
            cai_sampling_free(&t);
            return CAI_ERROR(CAI_ERR_NOMEM, "cannot copy stop string %d (%zu bytes)", i, strlen(src->stop[i]) + 1);
        }
    }
    *dst = t;
    return CAI_OK;
}

void cai_sampling_free(cai_sampling_params *p) {
    if (!p) return;
    const int n = p->n_stop < 0 ? 0 : p->n_stop > CAI_SAMPLE_MAX_STOP ? CAI_SAMPLE_MAX_STOP : p->n_stop;
    for (int i = 0; i < n; i++) {
        free(p->stop[i]);
        p->stop[i] = NULL;
    }
    p->n_stop = 0;
}

/* ------------------------------------------------------------------ workspace */

/* Candidates are bucketed by their temperature-scaled distance
 * d = (z_max - z) / T below the most likely token, EXP_RES buckets per nat
 * over [0, D_MAX). The cuts and the draw add whole buckets' weights and
 * gather and sort only the buckets where they fall. The same grid
 * tabulates exp(-d). */
#define EXP_RES 64
#define D_MAX 64
#define N_BUCKETS (EXP_RES * D_MAX)
/* A top_k up to this keeps a heap of the k largest logits and works on
 * the sorted candidates; a larger one cuts inside a bucket. */
#define K_HEAP 1024
/* Logits are checked and reduced in blocks: a branch-free pass for the
 * block's maximum (LANES independent chains), then the rare work where it
 * matters; later passes skip blocks whose maximum rules them out. */
#define BLOCK 1024
#define LANES 8
/* The top-p cut gathers every bucket up to its own when they hold at most
 * this many tokens, so that the draw finds its bucket gathered. */
#define GATHER_AHEAD 8192

typedef struct {
    double d;
    int32_t id;
} cand;

struct cai_sample_ws {
    int64_t vocab;
    int32_t *slot;     /* per id: 1 + its index among the distinct history tokens; all 0 between calls */
    int32_t *seen_id;  /* the distinct history tokens, in order of first appearance */
    int64_t *seen_out; /* how often each occurs in the output */
    float *seen_raw;   /* its logit as passed in */
    float *bmax;       /* per block of the logits last scanned: its maximum */
    cand *list;        /* [vocab]: the candidates of a small top-k, or the buckets gathered */
    cand top[K_HEAP];
    float heap[K_HEAP];
    double etab[N_BUCKETS]; /* exp(-j / EXP_RES) */
    int64_t count[N_BUCKETS], start[N_BUCKETS + 1], at[N_BUCKETS], pos[N_BUCKETS];
    double mass[N_BUCKETS];
    unsigned char sorted[N_BUCKETS];
};

cai_status cai_sample_ws_create(cai_sample_ws_t **out, int64_t vocab) {
    CAI_CHECK_ARG(out, "cai_sample_ws_create: NULL output");
    *out = NULL;
    CAI_CHECK_ARG(vocab >= 1 && vocab <= INT32_MAX, "cai_sample_ws_create: vocab=%lld must be in [1, %d]",
                  (long long)vocab, INT32_MAX);
    cai_sample_ws_t *ws = NULL;
    cai_status st = CAI_OK;
    const size_t n = (size_t)vocab, nblocks = (n + BLOCK - 1) / BLOCK;
    CAI_CALL(cai_calloc((void **)&ws, 1, sizeof *ws, "sampling workspace"));
    ws->vocab = vocab;
    for (int j = 0; j < N_BUCKETS; j++) ws->etab[j] = exp(-(double)j / EXP_RES);
    CAI_CALL_GOTO(cai_calloc((void **)&ws->slot, n, sizeof *ws->slot, "sampling history slots"), st, fail);
    CAI_CALL_GOTO(cai_malloc((void **)&ws->seen_id, n * sizeof *ws->seen_id, "sampling history ids"), st, fail);
    CAI_CALL_GOTO(cai_malloc((void **)&ws->seen_out, n * sizeof *ws->seen_out, "sampling output counts"), st, fail);
    CAI_CALL_GOTO(cai_malloc((void **)&ws->seen_raw, n * sizeof *ws->seen_raw, "sampling raw logits"), st, fail);
    CAI_CALL_GOTO(cai_malloc((void **)&ws->bmax, nblocks * sizeof *ws->bmax, "sampling block maxima"), st, fail);
    CAI_CALL_GOTO(cai_malloc((void **)&ws->list, n * sizeof *ws->list, "sampling candidates"), st, fail);
    *out = ws;
    return CAI_OK;
fail:
    cai_sample_ws_free(ws);
    return st;
}

void cai_sample_ws_free(cai_sample_ws_t *ws) {
    if (!ws) return;
    cai_free(ws->slot);
    cai_free(ws->seen_id);
    cai_free(ws->seen_out);
    cai_free(ws->seen_raw);
    cai_free(ws->bmax);
    cai_free(ws->list);
    cai_free(ws);
}

/* exp(-d) for 0 <= d < D_MAX: the table at the grid point below times the
 * degree-5 Taylor polynomial of the remainder r < 1/64 (r exact by
 * Sterbenz), evaluated in Estrin's order for a short dependency chain; the
 * first dropped term, r^6 / 6!, is under 2e-14 of the result. libm costs
 * several times more, at one call per token of a 128k vocabulary. */
static inline double exp_neg(const double *tab, double d) {
    const int k = (int)(d * EXP_RES);
    const double r = d - (double)k / EXP_RES, r2 = r * r;
    const double p = (1.0 - r) + r2 * ((1.0 / 2 - r * (1.0 / 6)) + r2 * (1.0 / 24 - r * (1.0 / 120)));
    return tab[k] * p;
}

/* ------------------------------------------------------------------ ordering */

/* The draw order: descending probability (ascending d), lower id first. */
static inline int cand_less(const cand *x, const cand *y) { return x->d < y->d || (x->d == y->d && x->id < y->id); }

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return cand_less(x, y) ? -1 : cand_less(y, x) ? 1 : 0;
}

static inline void cand_swap(cand *a, int64_t i, int64_t j) {
    const cand t = a[i];
    a[i] = a[j];
    a[j] = t;
}

/* Hoare's partition of a[lo, hi] around a median-of-three pivot: on return
 * a[lo, *jo] <= pivot <= a[*io, hi] with *jo < *io. */
static void partition(cand *a, int64_t lo, int64_t hi, int64_t *io, int64_t *jo) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (cand_less(&a[mid], &a[lo])) cand_swap(a, mid, lo);
    if (cand_less(&a[hi], &a[lo])) cand_swap(a, hi, lo);
    if (cand_less(&a[hi], &a[mid])) cand_swap(a, hi, mid);
    const cand pv = a[mid];
    int64_t i = lo, j = hi;
    while (i <= j) {
        while (cand_less(&a[i], &pv)) i++;
        while (cand_less(&pv, &a[j])) j--;
        if (i <= j) cand_swap(a, i++, j--);
    }
    *io = i;
    *jo = j;
}

static void insertion_sort(cand *a, int64_t n) {
    for (int64_t i = 1; i < n; i++) {
        const cand x = a[i];
        int64_t j = i;
        for (; j > 0 && cand_less(&x, &a[j - 1]); j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

/* Quicksort with the comparison inlined (qsort's indirect call costs more
 * than the compare); keys are unique since ids are. */
static void sort_cands(cand *a, int64_t n) {
    int budget = 64; /* partitions before an adversarial order gets qsort's bound */
    while (n > 24) {
        if (budget-- == 0) {
            qsort(a, (size_t)n, sizeof *a, cand_cmp);
            return;
        }
        int64_t i, j;
        partition(a, 0, n - 1, &i, &j);
        if (j + 1 < n - i) { /* recurse into the smaller side */
            sort_cands(a, j + 1);
            a += i;
            n -= i;
        } else {
            sort_cands(a + i, n - i);
            n = j + 1;
        }
    }
    insertion_sort(a, n);
}

/* Reorders a[0, n) so that a[k] holds what sorting would put there, with
 * nothing after it in the draw order before it and the converse. */
static void select_nth(cand *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    for (int rounds = 0; lo < hi; rounds++) {
        if (rounds == 64) {
            sort_cands(a + lo, hi - lo + 1);
            return;
        }
        int64_t i, j;
        partition(a, lo, hi, &i, &j);
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return;
    }
}

/* ------------------------------------------------------------------ the bucketed distribution */

/* The candidates in draw order, bucket by bucket: bucket b holds positions
 * [start[b], start[b] + count[b]) with weight mass[b]; once gathered from
 * the logits its tokens are list[at[b], ...), sorted once needed. */
typedef struct {
    cai_sample_ws_t *ws;
    const float *z;
    int64_t vocab, used; /* list entries taken by gathered buckets */
    double zm, inv_t, dcut;
    int nb; /* buckets in use */
} bucketed;

static inline double dist(const bucketed *s, float z) { return (s->zm - (double)z) * s->inv_t; }

/* The bucket of a distance, N_BUCKETS past the cut. */
static inline int bucket_of(const bucketed *s, double d) { return d < s->dcut ? (int)(d * EXP_RES) : N_BUCKETS; }

/* Gathers buckets [lo, hi], none of them gathered yet, at their offsets in
 * draw order (unsorted). */
static void gather(bucketed *s, int lo, int hi) {
    cai_sample_ws_t *ws = s->ws;
    const int64_t base = s->used - ws->start[lo];
    for (int b = lo; b <= hi; b++) {
        ws->at[b] = ws->pos[b] = base + ws->start[b];
        ws->sorted[b] = 0;
    }
    s->used += ws->start[hi + 1] - ws->start[lo];
    for (int64_t b0 = 0; b0 < s->vocab; b0 += BLOCK) {
        if (bucket_of(s, dist(s, ws->bmax[b0 / BLOCK])) > hi) continue;
        const int64_t b1 = b0 + BLOCK < s->vocab ? b0 + BLOCK : s->vocab;
        for (int64_t i = b0; i < b1; i++) {
            const double d = dist(s, s->z[i]);
            const int b = bucket_of(s, d);
            /* one comparison, mostly false: two would each go either way */
            if ((unsigned)(b - lo) <= (unsigned)(hi - lo)) ws->list[ws->pos[b]++] = (cand){d, (int32_t)i};
        }
    }
    for (int b = lo; b <= hi; b++)
        CAI_INVARIANT(ws->pos[b] == ws->at[b] + ws->count[b],
                      "cai_sample: bucket %d gathered %lld tokens, counted %lld", b,
                      (long long)(ws->pos[b] - ws->at[b]), (long long)ws->count[b]);
}

/* Bucket b's tokens in draw order; with ahead, gathering it takes the
 * buckets before it along when they are few. */
static const cand *gathered(bucketed *s, int b, int ahead) {
    cai_sample_ws_t *ws = s->ws;
    if (ws->at[b] < 0) {
        int lo = b;
        if (ahead && ws->start[b + 1] <= GATHER_AHEAD)
            while (lo > 0 && ws->at[lo - 1] < 0) lo--;
        gather(s, lo, b);
    }
    cand *g = ws->list + ws->at[b];
    if (!ws->sorted[b]) {
        sort_cands(g, ws->count[b]);
        ws->sorted[b] = 1;
    }
    return g;
}

/* The first position m in [1, limit] at which the weight of the first m
 * tokens in draw order exceeds (strict) or reaches target, or limit when
 * none does; *sum: that weight, *id (when given): the m-th token. */
static int64_t first_reaching(bucketed *s, double target, int strict, int64_t limit, double *sum, int32_t *id) {
    cai_sample_ws_t *ws = s->ws;
    double cum = 0.0;
    for (int b = 0; b < s->nb && ws->start[b] < limit; b++) {
        const int64_t st = ws->start[b], be = st + ws->count[b], e = be < limit ? be : limit;
        if (e <= st) continue;
        if (e == be) {
            const double c = cum + ws->mass[b];
            if (!(strict ? c > target : c >= target)) {
                cum = c;
                continue;
            }
        }
        const cand *g = gathered(s, b, !id);
        for (int64_t j = 0; j < e - st; j++) {
            cum += exp_neg(ws->etab, g[j].d);
            if (strict ? cum > target : cum >= target) {
                *sum = cum;
                if (id) *id = g[j].id;
                return st + j + 1;
            }
        }
    }
    *sum = cum;
    if (id) { /* not reached (rounding): the last token */
        int b = s->nb - 1;
        while (ws->start[b] >= limit || ws->count[b] == 0) b--;
        *id = gathered(s, b, 0)[limit - 1 - ws->start[b]].id;
    }
    return limit;
}

/* ------------------------------------------------------------------ sampling */

/* The Philox stream of every draw: cai_rng_uniform(seed, this, step). */
static uint64_t sample_stream(void) { return cai_hash64("cai.sample"); }

static cai_status logit_error(int64_t i, float x) {
    return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_sample: logits[%lld] is %s: a logit must be finite or -inf (masked)",
                     (long long)i, isnan(x) ? "NaN" : "+inf");
}

/* HF's RepetitionPenaltyLogitsProcessor over the whole history (each
 * distinct token once, as its gather/scatter does), then OpenAI's
 * frequency and presence penalties over the output part. Records the raw
 * logits it overwrites; *n_seen counts the slots marked, even on error. */
static cai_status apply_penalties(cai_sample_ws_t *ws, const cai_sampling_params *p, float *logits, int64_t vocab,
                                  const int32_t *history, int64_t n_prompt, int64_t n_history, int64_t *n_seen) {
    for (int64_t i = 0; i < n_history; i++) {
        const int32_t t = history[i];
        if (t < 0 || t >= vocab)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_sample: history[%lld]=%d is not a token id in [0, %lld)",
                             (long long)i, (int)t, (long long)vocab);
        int32_t s = ws->slot[t];
        if (!s) {
            const float raw = logits[t];
            if (!(raw <= FLT_MAX) && raw != -INFINITY) return logit_error(t, raw);
            s = (int32_t)(++*n_seen);
            ws->slot[t] = s;
            ws->seen_id[s - 1] = t;
            ws->seen_raw[s - 1] = raw;
            ws->seen_out[s - 1] = 0;
        }
        if (i >= n_prompt) ws->seen_out[s - 1]++;
    }
    const double rep = p->repetition_penalty, freq = p->frequency_penalty, pres = p->presence_penalty;
    for (int64_t j = 0; j < *n_seen; j++) {
        const float raw = ws->seen_raw[j];
        if (raw == -INFINITY) continue; /* a masked token stays masked */
        double v = raw;
        if (rep != 1.0) v = v < 0 ? v * rep : v / rep;
        const int64_t c = ws->seen_out[j];
        if (c > 0) v -= freq * (double)c + pres;
        /* A finite logit stays finite, so that only masking removes a token. */
        logits[ws->seen_id[j]] = (float)fmin(fmax(v, -FLT_MAX), FLT_MAX);
    }
    return CAI_OK;
}

/* The raw logits' statistics for log-probabilities. */
typedef struct {
    double max, sum; /* log-sum-exp = max + log(sum) */
    int n_top;
    float top[CAI_SAMPLE_MAX_LOGPROBS];
    int32_t top_id[CAI_SAMPLE_MAX_LOGPROBS];
} raw_stats;

static void heap_push(float *h, int *n, int cap, float x) {
    int i;
    if (*n < cap) {
        for (i = (*n)++; i > 0 && h[(i - 1) / 2] > x; i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
    } else {
        for (i = 0;;) {
            int c = 2 * i + 1;
            if (c >= cap) break;
            if (c + 1 < cap && h[c + 1] < h[c]) c++;
            if (!(h[c] < x)) break;
            h[i] = h[c];
            i = c;
        }
    }
    h[i] = x;
}

/* One pass over z: refuses NaN and +inf; the maximum, the first index
 * holding it (-1 when every logit is -inf) and each block's maximum; with
 * st, the log-sum-exp (online, block by block) and the n_alt largest
 * (lower id first); with heap_k, a min-heap of the heap_k largest in
 * ws->heap (of every finite one when fewer). */
static cai_status scan(cai_sample_ws_t *ws, const float *z, int64_t n, float *zmax, int64_t *arg, raw_stats *st,
                       int n_alt, int heap_k) {
    float m = -INFINITY, thr = -INFINITY;
    int64_t a = -1;
    int nh = 0;
    double sum = 0.0;
    for (int64_t b0 = 0; b0 < n; b0 += BLOCK) {
        const int64_t b1 = b0 + BLOCK < n ? b0 + BLOCK : n;
        float lm[LANES];
        int lbad[LANES];
        for (int k = 0; k < LANES; k++) {
            lm[k] = -INFINITY;
            lbad[k] = 0;
        }
        int64_t i = b0;
        for (; i + LANES <= b1; i += LANES)
            for (int k = 0; k < LANES; k++) {
                const float x = z[i + k];
                lm[k] = x > lm[k] ? x : lm[k];
                lbad[k] |= (x != x) | (x > FLT_MAX);
            }
        for (int k = 0; i < b1; i++, k++) {
            const float x = z[i];
            lm[k] = x > lm[k] ? x : lm[k];
            lbad[k] |= (x != x) | (x > FLT_MAX);
        }
        float bm = lm[0];
        int bad = lbad[0];
        for (int k = 1; k < LANES; k++) {
            bm = lm[k] > bm ? lm[k] : bm;
            bad |= lbad[k];
        }
        if (bad)
            for (i = b0; i < b1; i++)
                if (!(z[i] <= FLT_MAX) && z[i] != -INFINITY) return logit_error(i, z[i]);
        ws->bmax[b0 / BLOCK] = bm;
        if (bm == -INFINITY) continue;
        if (bm > m) {
            /* Terms below e^-64 of the new maximum are under the sum's rounding. */
            if (st) sum = (double)bm - m < D_MAX ? sum * exp_neg(ws->etab, (double)bm - m) : 0.0;
            m = bm;
            a = b0;
            while (z[a] != bm) a++;
        }
        if (heap_k && bm > thr)
            for (i = b0; i < b1; i++)
                if (z[i] > thr) {
                    heap_push(ws->heap, &nh, heap_k, z[i]);
                    if (nh == heap_k) thr = ws->heap[0];
                }
        if (!st) continue;
        double s4[4] = {0.0, 0.0, 0.0, 0.0}; /* independent sums, for the same reason as the lanes */
        for (i = b0; i < b1; i++) {
            const double d = (double)m - z[i];
            if (d < D_MAX) s4[i & 3] += exp_neg(ws->etab, d);
        }
        sum += (s4[0] + s4[1]) + (s4[2] + s4[3]);
        for (i = b0; i < b1 && n_alt; i++) {
            const float x = z[i];
            if (x == -INFINITY || (st->n_top == n_alt && !(x > st->top[n_alt - 1]))) continue;
            int j = st->n_top < n_alt ? st->n_top++ : n_alt - 1;
            for (; j > 0 && st->top[j - 1] < x; j--) {
                st->top[j] = st->top[j - 1];
                st->top_id[j] = st->top_id[j - 1];
            }
            st->top[j] = x;
            st->top_id[j] = (int32_t)i;
        }
    }
    *zmax = m;
    *arg = a;
    if (st) {
        st->max = m;
        st->sum = sum;
    }
    return CAI_OK;
}

/* top-p, min-p and the draw over candidates c[0, n) in draw order. */
static int32_t draw_sorted(const cai_sample_ws_t *ws, const cai_sampling_params *p, const cand *c, int64_t n,
                           double u) {
    double Z = 0.0;
    for (int64_t j = 0; j < n; j++) Z += exp_neg(ws->etab, c[j].d);
    int64_t L = n;
    double total = Z;
    if (p->top_p < 1.0f) {
        const double target = (double)p->top_p * Z;
        double cum = 0.0;
        int64_t j = 0;
        while (j < n && cum < target) cum += exp_neg(ws->etab, c[j++].d);
        L = j;
        total = cum;
    }
    if (p->min_p > 0.0f) {
        const double dmin = -log((double)p->min_p);
        int64_t j = 1;
        while (j < L && c[j].d <= dmin) j++;
        if (j < L) {
            L = j;
            total = 0.0;
            for (j = 0; j < L; j++) total += exp_neg(ws->etab, c[j].d);
        }
    }
    const double target = u * total;
    double cum = 0.0;
    int64_t j = 0;
    for (; j < L - 1; j++) {
        cum += exp_neg(ws->etab, c[j].d);
        if (cum > target) break;
    }
    return c[j].id;
}

/* Temperature, top-k, top-p and min-p over the penalised logits z, then
 * the draw; with heap, scan left the top_k largest logits in ws->heap. */
static int32_t draw(cai_sample_ws_t *ws, const cai_sampling_params *p, const float *z, int64_t vocab, float zmax,
                    int heap, int64_t step) {
    const double u = cai_rng_uniform(p->seed, sample_stream(), (uint64_t)step);
    /* A token more than dcut below the most likely one weighs under
     * e^-36 / vocab of it, all of them together under the rounding of the
     * normaliser (>= 1): they count as probability 0, which no float
     * uniform could tell apart anyway. */
    bucketed s = {.ws = ws,
                  .z = z,
                  .vocab = vocab,
                  .used = 0,
                  .zm = zmax,
                  .inv_t = 1.0 / (double)p->temperature,
                  .dcut = fmin(log((double)vocab) + 36.0, (double)D_MAX)};
    s.nb = (int)ceil(s.dcut * EXP_RES);

    if (heap) {
        /* HF's TopKLogitsWarper keeps every token tied with the k-th
         * largest: those above it are sorted, the tied ones follow in id
         * order. */
        const float vk = ws->heap[0];
        int64_t na = 0, nt = 0;
        for (int64_t b0 = 0; b0 < vocab; b0 += BLOCK) {
            if (ws->bmax[b0 / BLOCK] < vk) continue;
            const int64_t b1 = b0 + BLOCK < vocab ? b0 + BLOCK : vocab;
            for (int64_t i = b0; i < b1; i++) {
                const float x = z[i];
                if (x < vk) continue;
                const cand e = {dist(&s, x), (int32_t)i};
                if (x > vk) ws->top[na++] = e;
                else ws->list[nt++] = e;
            }
        }
        sort_cands(ws->top, na);
        memmove(ws->list + na, ws->list, (size_t)nt * sizeof *ws->list);
        memcpy(ws->list, ws->top, (size_t)na * sizeof *ws->list);
        int64_t n = na + nt;
        while (ws->list[n - 1].d >= s.dcut) n--;
        return draw_sorted(ws, p, ws->list, n, u);
    }

    memset(ws->count, 0, (size_t)s.nb * sizeof *ws->count);
    memset(ws->mass, 0, (size_t)s.nb * sizeof *ws->mass);
    memset(ws->at, 0xff, (size_t)s.nb * sizeof *ws->at);
    /* min-p keeps d <= dmin: bucket bm's part below dmin is counted on the
     * way. Without top-p nothing past dmin is weighed: the normaliser is
     * that of the kept tokens. */
    const double dmin = p->min_p > 0.0f ? -log((double)p->min_p) : INFINITY;
    const int bm = dmin < s.dcut ? (int)(dmin * EXP_RES) : -1;
    const double dlim = p->top_p < 1.0f ? INFINITY : dmin;
    int64_t cnt_m = 0;
    double mass_m = 0.0;
    for (int64_t b0 = 0; b0 < vocab; b0 += BLOCK) {
        if (!(dist(&s, ws->bmax[b0 / BLOCK]) < s.dcut)) continue;
        const int64_t b1 = b0 + BLOCK < vocab ? b0 + BLOCK : vocab;
        for (int64_t i = b0; i < b1; i++) {
            const double d = dist(&s, z[i]);
            if (!(d < s.dcut)) continue;
            const int b = (int)(d * EXP_RES);
            ws->count[b]++;
            if (!(d <= dlim)) continue;
            const double w = exp_neg(ws->etab, d);
            ws->mass[b] += w;
            if (b == bm && d <= dmin) {
                cnt_m++;
                mass_m += w;
            }
        }
    }
    ws->start[0] = 0;
    for (int b = 0; b < s.nb; b++) ws->start[b + 1] = ws->start[b] + ws->count[b];
    int64_t n_s = ws->start[s.nb];

    if (p->top_k > 0 && p->top_k < n_s) {
        /* The k-th largest and its ties share a bucket: select in it. */
        const int64_t k = p->top_k;
        int b = 0;
        while (ws->start[b + 1] < k) b++;
        gather(&s, b, b);
        cand *g = ws->list + ws->at[b];
        const int64_t size = ws->count[b], m = k - ws->start[b];
        select_nth(g, size, m - 1);
        sort_cands(g, m);
        int64_t e = m;
        for (int64_t j = m; j < size; j++)
            if (g[j].d == g[m - 1].d) cand_swap(g, e++, j);
        sort_cands(g + m, e - m);
        ws->sorted[b] = 1;
        ws->count[b] = e;
        ws->mass[b] = 0.0;
        for (int64_t j = 0; j < e; j++) ws->mass[b] += exp_neg(ws->etab, g[j].d);
        s.nb = b + 1;
        n_s = ws->start[b] + e;
    }

    double Z = 0.0;
    for (int b = 0; b < s.nb; b++) Z += ws->mass[b];
    /* Kept: the first L tokens of the draw order, weighing `total`. */
    int64_t L = n_s;
    double total = Z;
    if (p->top_p < 1.0f)
        /* HF's TopPLogitsWarper drops a token when the probability of the
         * ones after it, itself included, is <= 1 - top_p: it keeps a token
         * while the ones before it hold less than top_p. */
        L = first_reaching(&s, (double)p->top_p * Z, 0, n_s, &total, NULL);
    if (bm >= 0 && bm < s.nb && ws->start[bm] + cnt_m < L) {
        /* MinPLogitsWarper: p >= min_p * p_max, i.e. d <= -log(min_p), a
         * prefix of the draw order holding the most likely token. */
        L = ws->start[bm] + cnt_m;
        total = mass_m;
        for (int b = 0; b < bm; b++) total += ws->mass[b];
    }
    double cum;
    int32_t tok;
    first_reaching(&s, u * total, 1, L, &cum, &tok);
    return tok;
}

static float as_logprob(double x) { return (float)fmin(fmax(x, -FLT_MAX), 0.0); }

cai_status cai_sample(cai_sample_ws_t *ws, const cai_sampling_params *p, float *logits, int64_t vocab,
                      const int32_t *history, int64_t n_prompt, int64_t n_history, int64_t step,
                      cai_sample_result *out) {
    CAI_CHECK_ARG(ws && p && logits && out, "cai_sample: NULL argument");
    CAI_CHECK_ARG(vocab >= 1 && vocab <= ws->vocab, "cai_sample: vocab=%lld must be in [1, %lld] (the workspace's)",
                  (long long)vocab, (long long)ws->vocab);
    CAI_CHECK_ARG(n_prompt >= 0 && n_prompt <= n_history && (history || n_history == 0),
                  "cai_sample: n_prompt=%lld, n_history=%lld: need 0 <= n_prompt <= n_history and a history "
                  "when n_history > 0",
                  (long long)n_prompt, (long long)n_history);
    CAI_CHECK_ARG(step >= 0, "cai_sample: step=%lld must be >= 0", (long long)step);
    CAI_CALL(cai_sampling_check(p));
    memset(out, 0, sizeof *out);

    cai_status st = CAI_OK;
    int64_t n_seen = 0, arg = -1;
    float zmax = -INFINITY;
    const int penalise = p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    const int heap_k = p->temperature != 0.0f && p->top_k > 0 && p->top_k <= K_HEAP ? p->top_k : 0;
    raw_stats rs = {.n_top = 0};
    /* Log-probabilities read the logits before the penalties touch them;
     * the last scan sees what the draw reads. */
    if (p->logprobs >= 0)
        CAI_CALL_GOTO(scan(ws, logits, vocab, &zmax, &arg, &rs, p->logprobs < vocab ? p->logprobs : (int)vocab,
                           penalise ? 0 : heap_k),
                      st, done);
    if (penalise) {
        CAI_CALL_GOTO(apply_penalties(ws, p, logits, vocab, history, n_prompt, n_history, &n_seen), st, done);
        CAI_CALL_GOTO(scan(ws, logits, vocab, &zmax, &arg, NULL, 0, heap_k), st, done);
    } else if (p->logprobs < 0) {
        CAI_CALL_GOTO(scan(ws, logits, vocab, &zmax, &arg, NULL, 0, heap_k), st, done);
    }
    if (arg < 0) {
        st = CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_sample: all %lld logits are -inf: no token can be drawn",
                       (long long)vocab);
        goto done;
    }

    out->token = p->temperature == 0.0f ? (int32_t)arg : draw(ws, p, logits, vocab, zmax, heap_k > 0, step);

    if (p->logprobs >= 0) {
        const double lse = rs.max + log(rs.sum);
        const int32_t t = out->token;
        const float r = penalise && ws->slot[t] ? ws->seen_raw[ws->slot[t] - 1] : logits[t];
        out->logprob = as_logprob((double)r - lse);
        out->n_top = rs.n_top;
        for (int j = 0; j < rs.n_top; j++) {
            out->top_ids[j] = rs.top_id[j];
            out->top_logprobs[j] = as_logprob((double)rs.top[j] - lse);
        }
    }
done:
    for (int64_t j = 0; j < n_seen; j++) ws->slot[ws->seen_id[j]] = 0;
    return st;
}
