/* GPT-style samples over indexed datasets, following Megatron-LM's
 * GPTDataset (document index, sample index, shuffle index) and
 * BlendedDataset, plus the --data-path/--split plumbing apps need. */
#include "cai_config.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/data.h"

/* Philox stream ids; the key is the seed. */
enum { STREAM_DOCS = 1, STREAM_DOCS_LAST = 2, STREAM_SAMPLES = 3, STREAM_SAMPLES_LAST = 4 };

struct cai_gpt_dataset {
    int64_t seq_len;
    int64_t size;
    int64_t epochs;
    /* single */
    const cai_indexed_dataset_t *ds;
    int64_t *doc_index, n_doc_index; /* sequence ids */
    int64_t *sample_index;           /* (position in doc_index, token offset) x (size + 1) */
    int64_t *shuffle;                /* size */
    /* blend */
    int n_parts;
    cai_gpt_dataset_t **parts;
    int16_t *part_of;
    int64_t *part_sample;
};

void cai_gpt_dataset_free(cai_gpt_dataset_t *g) {
    if (!g) return;
    free(g->doc_index);
    free(g->sample_index);
    free(g->shuffle);
    for (int i = 0; i < g->n_parts; i++) cai_gpt_dataset_free(g->parts[i]);
    free(g->parts);
    free(g->part_of);
    free(g->part_sample);
    free(g);
}

static cai_status alloc_i64(int64_t **p, int64_t n, const char *what) {
    *p = NULL;
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(int64_t))
        return CAI_ERROR(CAI_ERR_NOMEM, "%s: %lld entries", what, (long long)n);
    *p = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!*p) return CAI_ERROR(CAI_ERR_NOMEM, "%s: %lld entries (%.1f MB)", what, (long long)n, (double)n * 8 / 1e6);
    return CAI_OK;
}

/* Megatron's build_sample_idx (helpers.cpp) with drop_last_partial_sequence
 * and add_extra_token_to_sequence: the flattened document stream is cut
 * every seq_len tokens and each sample takes one token more. Entry k is
 * where sample k starts (and sample k - 1 ends, inclusive). */
static cai_status build_sample_index(cai_gpt_dataset_t *g) {
    const int64_t T = g->seq_len;
    for (int64_t k = 1, di = 0, off = 0; k <= g->size; k++) {
        int64_t remaining = T + 1;
        while (remaining != 0) {
            const int64_t len = cai_indexed_sequence_length(g->ds, g->doc_index[di]) - off;
            remaining -= len;
            if (remaining <= 0) {
                off += remaining + len - 1;
                remaining = 0;
            } else {
                if (di == g->n_doc_index - 1)
                    return CAI_ERROR(CAI_ERR_INTERNAL,
                                     "sample index ran out of documents at sample %lld of %lld (a token count is off)",
                                     (long long)k, (long long)g->size);
                di++;
                off = 0;
            }
        }
        g->sample_index[2 * k] = di;
        g->sample_index[2 * k + 1] = off;
    }
    g->sample_index[0] = g->sample_index[1] = 0;
    return CAI_OK;
}

cai_status cai_gpt_dataset_init(cai_gpt_dataset_t **out, const cai_indexed_dataset_t *ds, int64_t doc_begin,
                                int64_t doc_end, const cai_gpt_config *cfg) {
    CAI_CHECK_ARG(out && ds && cfg, "cai_gpt_dataset_init: NULL argument");
    *out = NULL;
    const int64_t nd = cai_indexed_num_documents(ds);
    CAI_CHECK_ARG(doc_begin >= 0 && doc_begin <= doc_end && doc_end <= nd,
                  "%s: document range [%lld, %lld) is outside [0, %lld)", cai_indexed_prefix(ds), (long long)doc_begin,
                  (long long)doc_end, (long long)nd);
    CAI_CHECK_ARG(cfg->seq_len >= 1, "GPT samples: seq_len %lld must be >= 1", (long long)cfg->seq_len);
    CAI_CHECK_ARG(cfg->num_samples >= 0, "GPT samples: num_samples %lld is negative", (long long)cfg->num_samples);
    const int64_t s0 = cai_indexed_document_start(ds, doc_begin), s1 = cai_indexed_document_start(ds, doc_end);
    const int64_t nseq = s1 - s0, T = cfg->seq_len;
    int64_t tpe = 0;
    for (int64_t s = s0; s < s1; s++) tpe += cai_indexed_sequence_length(ds, s);
    if (tpe < 2 || (cfg->num_samples == 0 && (tpe - 1) / T < 1))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: documents [%lld, %lld) hold %lld tokens, too few for one sample of seq_len + 1 = %lld "
                         "(use more documents, a shorter sequence or ask for a sample count)",
                         cai_indexed_prefix(ds), (long long)doc_begin, (long long)doc_end, (long long)tpe,
                         (long long)(T + 1));
    /* Megatron's _get_num_epochs: enough epochs for num_samples * T + 1 tokens. */
    int64_t epochs = 1;
    if (cfg->num_samples > 0) {
        if (cfg->num_samples > (INT64_MAX - 1) / T)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "GPT samples: %lld samples of %lld tokens overflow",
                             (long long)cfg->num_samples, (long long)T);
        const int64_t want = cfg->num_samples * T + 1;
        epochs = (want + tpe - 1) / tpe;
    }
    if (nseq > 0 && epochs > ((int64_t)1 << 40) / nseq)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: %lld samples of %lld tokens need %lld epochs over %lld sequences; too large an index",
                         cai_indexed_prefix(ds), (long long)cfg->num_samples, (long long)T, (long long)epochs,
                         (long long)nseq);
    int separate_last = 0;
    int64_t samples_before_last = 0;
    if (epochs > 1) {
        samples_before_last = ((epochs - 1) * tpe - 1) / T;
        const int64_t from_last = cfg->num_samples - samples_before_last;
        const int64_t per_epoch = (tpe - 1) / T;
        separate_last = from_last < (int64_t)(0.80 * (double)per_epoch);
    }
    cai_gpt_dataset_t *g = calloc(1, sizeof *g);
    if (!g) return CAI_ERROR(CAI_ERR_NOMEM, "GPT dataset");
    cai_status st = CAI_OK;
    g->ds = ds;
    g->seq_len = T;
    g->epochs = epochs;
    g->n_doc_index = epochs * nseq;
    g->size = (epochs * tpe - 1) / T;
    CAI_CALL_GOTO(alloc_i64(&g->doc_index, g->n_doc_index, "document index"), st, fail);
    for (int64_t i = 0; i < g->n_doc_index; i++) g->doc_index[i] = s0 + i % nseq;
    if (!separate_last) {
        cai_data_shuffle(g->doc_index, g->n_doc_index, cfg->seed, STREAM_DOCS);
    } else {
        cai_data_shuffle(g->doc_index, (epochs - 1) * nseq, cfg->seed, STREAM_DOCS);
        cai_data_shuffle(g->doc_index + (epochs - 1) * nseq, nseq, cfg->seed, STREAM_DOCS_LAST);
    }
    CAI_CALL_GOTO(alloc_i64(&g->sample_index, 2 * (g->size + 1), "sample index"), st, fail);
    CAI_CALL_GOTO(build_sample_index(g), st, fail);
    CAI_CALL_GOTO(alloc_i64(&g->shuffle, g->size, "shuffle index"), st, fail);
    for (int64_t i = 0; i < g->size; i++) g->shuffle[i] = i;
    if (!separate_last) {
        cai_data_shuffle(g->shuffle, g->size, cfg->seed, STREAM_SAMPLES);
    } else {
        cai_data_shuffle(g->shuffle, samples_before_last, cfg->seed, STREAM_SAMPLES);
        cai_data_shuffle(g->shuffle + samples_before_last, g->size - samples_before_last, cfg->seed,
                         STREAM_SAMPLES_LAST);
    }
    *out = g;
    return CAI_OK;
fail:
    cai_gpt_dataset_free(g);
    return st;
}

cai_status cai_gpt_blend_init(cai_gpt_dataset_t **out, int n, const cai_indexed_dataset_t *const *ds,
                              const int64_t *doc_ranges, const double *weights, const cai_gpt_config *cfg) {
    CAI_CHECK_ARG(out && ds && doc_ranges && weights && cfg && n > 0, "cai_gpt_blend_init: bad arguments");
    *out = NULL;
    CAI_CHECK_ARG(cfg->num_samples > 0, "a blend needs a sample count (num_samples %lld)", (long long)cfg->num_samples);
    cai_gpt_dataset_t *g = calloc(1, sizeof *g);
    if (!g) return CAI_ERROR(CAI_ERR_NOMEM, "blended GPT dataset");
    cai_status st = CAI_OK;
    int64_t *counts = calloc((size_t)n, sizeof *counts);
    g->parts = calloc((size_t)n, sizeof *g->parts);
    g->part_of = malloc((size_t)cfg->num_samples * sizeof *g->part_of);
    if (!counts || !g->parts || !g->part_of) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "blend of %d datasets, %lld samples", n, (long long)cfg->num_samples);
        goto fail;
    }
    g->n_parts = n;
    g->seq_len = cfg->seq_len;
    g->size = cfg->num_samples;
    CAI_CALL_GOTO(alloc_i64(&g->part_sample, g->size, "blend sample index"), st, fail);
    CAI_CALL_GOTO(cai_data_blend_indices(weights, n, g->size, g->part_of, g->part_sample), st, fail);
    for (int64_t i = 0; i < g->size; i++) counts[g->part_of[i]]++;
    for (int i = 0; i < n; i++) {
        if (!counts[i]) continue;
        cai_gpt_config pc = *cfg;
        pc.num_samples = counts[i];
        pc.seed = cfg->seed + (uint64_t)i;
        CAI_CALL_GOTO(cai_gpt_dataset_init(&g->parts[i], ds[i], doc_ranges[2 * i], doc_ranges[2 * i + 1], &pc), st,
                      fail);
        if (g->parts[i]->epochs > g->epochs) g->epochs = g->parts[i]->epochs;
    }
    free(counts);
    *out = g;
    return CAI_OK;
fail:
    free(counts);
    cai_gpt_dataset_free(g);
    return st;
}

int64_t cai_gpt_dataset_size(const cai_gpt_dataset_t *g) { return g->size; }
int64_t cai_gpt_dataset_seq_len(const cai_gpt_dataset_t *g) { return g->seq_len; }
int64_t cai_gpt_dataset_epochs(const cai_gpt_dataset_t *g) { return g->epochs; }

const int64_t *cai_gpt_dataset_document_index(const cai_gpt_dataset_t *g, int64_t *n) {
    if (n) *n = g->parts ? 0 : g->n_doc_index;
    return g->parts ? NULL : g->doc_index;
}

const int64_t *cai_gpt_dataset_shuffle_index(const cai_gpt_dataset_t *g, int64_t *n) {
    if (n) *n = g->parts ? 0 : g->size;
    return g->parts ? NULL : g->shuffle;
}

cai_status cai_gpt_dataset_source(const cai_gpt_dataset_t *g, int64_t i, int *part, int64_t *part_sample) {
    CAI_CHECK_ARG(g && part && part_sample, "cai_gpt_dataset_source: NULL argument");
    CAI_CHECK_ARG(i >= 0 && i < g->size, "GPT sample %lld out of range [0, %lld)", (long long)i, (long long)g->size);
    if (g->parts) {
        *part = g->part_of[i];
        *part_sample = g->part_sample[i];
    } else {
        *part = 0;
        *part_sample = i;
    }
    return CAI_OK;
}

cai_status cai_gpt_dataset_sample(const cai_gpt_dataset_t *g, int64_t i, int32_t *tokens) {
    CAI_CHECK_ARG(g && tokens, "cai_gpt_dataset_sample: NULL argument");
    CAI_CHECK_ARG(i >= 0 && i < g->size, "GPT sample %lld out of range [0, %lld)", (long long)i, (long long)g->size);
    if (g->parts) {
        CAI_CALL(cai_gpt_dataset_sample(g->parts[g->part_of[i]], g->part_sample[i], tokens));
        return CAI_OK;
    }
    const int64_t j = g->shuffle[i];
    const int64_t d0 = g->sample_index[2 * j], o0 = g->sample_index[2 * j + 1];
    const int64_t d1 = g->sample_index[2 * j + 2], o1 = g->sample_index[2 * j + 3];
    int64_t got = 0;
    for (int64_t d = d0; d <= d1; d++) {
        const int64_t seq = g->doc_index[d];
        const int64_t off = d == d0 ? o0 : 0;
        const int64_t end = d < d1 ? cai_indexed_sequence_length(g->ds, seq) : o1 + 1;
        if (got + (end - off) > g->seq_len + 1)
            return CAI_ERROR(CAI_ERR_INTERNAL, "GPT sample %lld would hold more than %lld tokens", (long long)i,
                             (long long)(g->seq_len + 1));
        CAI_CALL(cai_indexed_read(g->ds, seq, off, end - off, tokens + got));
        got += end - off;
    }
    if (got != g->seq_len + 1)
        return CAI_ERROR(CAI_ERR_INTERNAL, "GPT sample %lld holds %lld tokens, not %lld", (long long)i, (long long)got,
                         (long long)(g->seq_len + 1));
    return CAI_OK;
}

cai_status cai_gpt_dataset_batch(const cai_gpt_dataset_t *g, const int64_t *indices, int64_t n, int32_t *inputs,
                                 int32_t *targets) {
    CAI_CHECK_ARG(g && (indices || n == 0) && inputs && targets, "cai_gpt_dataset_batch: NULL argument");
    const int64_t T = g->seq_len;
    int32_t *buf = malloc((size_t)(T + 1) * sizeof *buf);
    if (!buf) return CAI_ERROR(CAI_ERR_NOMEM, "a sample of %lld tokens", (long long)(T + 1));
    cai_status st = CAI_OK;
    for (int64_t b = 0; b < n; b++) {
        CAI_CALL_GOTO(cai_gpt_dataset_sample(g, indices[b], buf), st, done);
        memcpy(inputs + b * T, buf, (size_t)T * sizeof *buf);
        memcpy(targets + b * T, buf + 1, (size_t)T * sizeof *buf);
    }
done:
    free(buf);
    return st;
}

/* ------------------------------------------------------------------ data path + split */

struct cai_gpt_data {
    int n;
    cai_indexed_dataset_t **ds;
    cai_gpt_dataset_t *split[3];
};

void cai_gpt_data_free(cai_gpt_data_t *d) {
    if (!d) return;
    for (int s = 0; s < 3; s++) cai_gpt_dataset_free(d->split[s]);
    for (int i = 0; i < d->n; i++) cai_indexed_free(d->ds[i]);
    free(d->ds);
    free(d);
}

cai_gpt_dataset_t *cai_gpt_data_get(const cai_gpt_data_t *d, cai_split split) {
    return d && split >= CAI_SPLIT_TRAIN && split <= CAI_SPLIT_TEST ? d->split[split] : NULL;
}

/* Split "W1 P1 W2 P2" / "P" into words; returns the count or -1. */
static int split_words(char *s, char **words, int max) {
    int n = 0;
    for (char *p = s; *p;) {
        while (*p && (isspace((unsigned char)*p) || *p == ',')) *p++ = 0;
        if (!*p) break;
        if (n == max) return -1;
        words[n++] = p;
        while (*p && !isspace((unsigned char)*p) && *p != ',') p++;
    }
    return n;
}

static const char *const k_split_names[3] = {"train", "valid", "test"};

cai_status cai_gpt_data_init(cai_gpt_data_t **out, const cai_gpt_data_config *cfg) {
    CAI_CHECK_ARG(out && cfg && cfg->paths, "cai_gpt_data_init: NULL argument");
    *out = NULL;
    enum { MAXW = 2 * 1024 };
    char *copy = strdup(cfg->paths);
    char **words = malloc(MAXW * sizeof *words);
    double *weights = NULL;
    int64_t *ranges = NULL;
    double *w_split = NULL;
    const char **prefixes = NULL;
    cai_gpt_data_t *d = calloc(1, sizeof *d);
    cai_status st = CAI_OK;
    if (!copy || !words || !d) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "data path parsing");
        goto fail;
    }
    int nw = split_words(copy, words, MAXW), n;
    if (nw <= 0) {
        st = CAI_ERROR(CAI_ERR_CONFIG, "data path \"%s\": %s", cfg->paths,
                       nw == 0 ? "empty; give PREFIX or W1 PREFIX1 W2 PREFIX2 ..." : "too many entries");
        goto fail;
    }
    n = nw == 1 ? 1 : nw / 2;
    weights = malloc((size_t)n * sizeof *weights);
    prefixes = malloc((size_t)n * sizeof *prefixes);
    ranges = malloc((size_t)n * 2 * sizeof *ranges);
    w_split = malloc((size_t)n * sizeof *w_split);
    d->ds = calloc((size_t)n, sizeof *d->ds);
    if (!weights || !prefixes || !ranges || !w_split || !d->ds) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "data path of %d datasets", n);
        goto fail;
    }
    if (nw == 1) {
        weights[0] = 1;
        prefixes[0] = words[0];
    } else {
        if (nw % 2) {
            st =
                CAI_ERROR(CAI_ERR_CONFIG,
                          "data path \"%s\": %d entries; a blend is pairs of weight and prefix (W1 PREFIX1 W2 PREFIX2)",
                          cfg->paths, nw);
            goto fail;
        }
        for (int i = 0; i < n; i++) {
            char *end;
            weights[i] = strtod(words[2 * i], &end);
            if (end == words[2 * i] || *end || !isfinite(weights[i]) || weights[i] < 0) {
                st = CAI_ERROR(CAI_ERR_CONFIG,
                               "data path \"%s\": \"%s\" is not a weight (a blend is W1 PREFIX1 W2 PREFIX2)",
                               cfg->paths, words[2 * i]);
                goto fail;
            }
            prefixes[i] = words[2 * i + 1];
        }
    }
    for (int i = 0; i < n; i++) {
        CAI_CALL_GOTO(cai_indexed_open(&d->ds[i], prefixes[i], cfg->vocab_size), st, fail);
        d->n = i + 1;
    }
    int64_t(*bounds)[4] = malloc((size_t)n * sizeof *bounds);
    if (!bounds) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "split bounds");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        st = cai_data_split_ranges(cfg->split, cai_indexed_num_documents(d->ds[i]), bounds[i]);
        if (st != CAI_OK) {
            free(bounds);
            cai_error_push(__FILE__, __LINE__, __func__, "cai_data_split_ranges");
            goto fail;
        }
    }
    for (int s = 0; s < 3 && st == CAI_OK; s++) {
        cai_gpt_config gc = {cfg->seq_len, cfg->num_samples[s], cfg->seed + 1000003ull * (uint64_t)s};
        double wsum = 0;
        for (int i = 0; i < n; i++) {
            ranges[2 * i] = bounds[i][s];
            ranges[2 * i + 1] = bounds[i][s + 1];
            w_split[i] = ranges[2 * i + 1] > ranges[2 * i] ? weights[i] : 0;
            wsum += w_split[i];
        }
        if (!(wsum > 0)) continue; /* this split is empty: absent */
        if (n == 1) {
            st = cai_gpt_dataset_init(&d->split[s], d->ds[0], ranges[0], ranges[1], &gc);
        } else if (gc.num_samples <= 0) {
            st = CAI_ERROR(CAI_ERR_CONFIG, "a blend of %d datasets needs a sample count for the %s split", n,
                           k_split_names[s]);
        } else {
            st = cai_gpt_blend_init(&d->split[s], n, (const cai_indexed_dataset_t *const *)d->ds, ranges, w_split, &gc);
        }
        if (st != CAI_OK) {
            char what[96];
            snprintf(what, sizeof what, "building the %s split (split \"%s\")", k_split_names[s],
                     cfg->split ? cfg->split : "");
            cai_error_push(__FILE__, __LINE__, __func__, what);
        }
    }
    free(bounds);
fail:
    free(copy);
    free(words);
    free(weights);
    free(prefixes);
    free(ranges);
    free(w_split);
    if (st == CAI_OK) *out = d;
    else cai_gpt_data_free(d);
    return st;
}
