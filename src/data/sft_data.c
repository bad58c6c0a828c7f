/* Packed SFT rows from a preprocessed token dataset and its loss-mask
 * twin. The rows are a pure function of (dataset, seq_len, packed, seed),
 * so every rank builds the same ones without talking, and an epoch is one
 * cai_sampler permutation of them, so a run resumes from one number. */
#include "cai_config.h"

#include <stdlib.h>
#include <string.h>

#include "colossal/data.h"
#include "colossal/model.h" /* CAI_IGNORE_INDEX: the loss's convention for "no target" */

struct cai_sft_dataset {
    cai_sft_data_config cfg;
    char prefix[4200];
    cai_indexed_dataset_t *tok, *mask;
    int64_t *len;       /* tokens used of each document (after truncation); 0: dropped */
    int64_t *row_start; /* rows + 1 */
    int64_t *row_docs;
    int64_t rows;
    cai_sft_data_stats stats;
};

/* Documents must be one sequence each and the two datasets must agree. */
static cai_status check_pair(const cai_sft_dataset_t *ds, const char *mask_prefix) {
    const cai_indexed_dataset_t *a = ds->tok, *b = ds->mask;
    const int64_t nd = cai_indexed_num_documents(a);
    if (cai_indexed_num_sequences(a) != nd)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: %lld sequences in %lld documents; an SFT dataset has one per document",
                         ds->prefix, (long long)cai_indexed_num_sequences(a), (long long)nd);
    if (cai_indexed_num_documents(b) != nd || cai_indexed_num_sequences(b) != nd)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: %lld documents, but %s has %lld (preprocess them together)", ds->prefix,
                         (long long)nd, mask_prefix, (long long)cai_indexed_num_documents(b));
    if (cai_indexed_get_dtype(b) != CAI_INDEXED_U8)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: dtype %s, a loss mask is uint8", mask_prefix,
                         cai_indexed_dtype_name(cai_indexed_get_dtype(b)));
    for (int64_t d = 0; d < nd; d++) {
        if (cai_indexed_document_start(a, d) != d || cai_indexed_document_start(b, d) != d)
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: document %lld does not start at sequence %lld", ds->prefix,
                             (long long)d, (long long)d);
        if (cai_indexed_sequence_length(a, d) != cai_indexed_sequence_length(b, d))
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: document %lld has %d tokens but %s has %d mask values", ds->prefix,
                             (long long)d, cai_indexed_sequence_length(a, d), mask_prefix,
                             cai_indexed_sequence_length(b, d));
    }
    return CAI_OK;
}

/* The overflow policy on stored lengths; masks are read once here. */
static cai_status fit_documents(cai_sft_dataset_t *ds, const char *mask_prefix) {
    const int64_t nd = cai_indexed_num_documents(ds->tok), cap = ds->cfg.seq_len + 1;
    int32_t *m = NULL;
    size_t mcap = 0;
    cai_status st = CAI_OK;
    for (int64_t d = 0; d < nd && st == CAI_OK; d++) {
        const int64_t n = cai_indexed_sequence_length(ds->tok, d);
        if ((size_t)n > mcap) {
            int32_t *p = realloc(m, (size_t)n * sizeof *p);
            if (!p) {
                st = CAI_ERROR(CAI_ERR_NOMEM, "sft dataset: %lld mask values", (long long)n);
                break;
            }
            m = p;
            mcap = (size_t)n;
        }
        CAI_CALL_GOTO(cai_indexed_read(ds->mask, d, 0, n, m), st, done);
        int64_t use = n, trained = 0;
        int truncated = 0;
        if (n > cap) {
            use = ds->cfg.overflow == CAI_SFT_DROP ? 0 : cap;
            truncated = use > 0;
        }
        for (int64_t i = 0; i < n; i++) {
            if (m[i] != 0 && m[i] != 1) {
                st = CAI_ERROR(CAI_ERR_FORMAT, "%s: document %lld, token %lld: mask value %d (0 or 1)", mask_prefix,
                               (long long)d, (long long)i, m[i]);
                goto done;
            }
            if (i >= 1 && i < use) trained += m[i];
        }
        if (trained == 0) use = 0; /* nothing to learn: dropped */
        ds->len[d] = use;
        ds->stats.truncated += truncated && use > 0;
        ds->stats.dropped += use == 0;
        ds->stats.trained_tokens += trained;
        ds->stats.tokens += use > 0 ? use - 1 : 0;
    }
done:
    free(m);
    return st;
}

/* First-fit: each document into the leftmost row with room, found in a
 * segment tree over the rows' free space (rows not yet opened are empty,
 * so the leftmost row with room is an open one or the next new one). */
static cai_status pack(cai_sft_dataset_t *ds, const int64_t *order, int64_t n) {
    const int64_t S = ds->cfg.seq_len;
    int64_t size = 1;
    while (size < (n > 0 ? n : 1)) size *= 2;
    int64_t *tree = malloc((size_t)(2 * size) * sizeof *tree),
            *row_of = malloc((size_t)(n > 0 ? n : 1) * sizeof *row_of);
    int64_t *fill = calloc((size_t)(size + 1), sizeof *fill);
    if (!tree || !row_of || !fill) {
        free(tree);
        free(row_of);
        free(fill);
        return CAI_ERROR(CAI_ERR_NOMEM, "sft packing of %lld documents", (long long)n);
    }
    for (int64_t i = 0; i < 2 * size; i++) tree[i] = S;
    int64_t rows = 0;
    for (int64_t k = 0; k < n; k++) {
        const int64_t need = ds->len[order[k]] - 1;
        int64_t node = 1;
        while (node < size) node = tree[2 * node] >= need ? 2 * node : 2 * node + 1;
        const int64_t r = node - size;
        row_of[k] = r;
        fill[r]++;
        if (r + 1 > rows) rows = r + 1;
        tree[node] -= need;
        for (node /= 2; node >= 1; node /= 2)
            tree[node] = tree[2 * node] > tree[2 * node + 1] ? tree[2 * node] : tree[2 * node + 1];
    }
    free(tree);
    ds->rows = rows;
    ds->row_start = calloc((size_t)rows + 1, sizeof *ds->row_start);
    ds->row_docs = malloc((size_t)(n > 0 ? n : 1) * sizeof *ds->row_docs);
    cai_status st = CAI_OK;
    if (!ds->row_start || !ds->row_docs) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "sft rows: %lld", (long long)rows);
    } else {
        for (int64_t r = 0; r < rows; r++) ds->row_start[r + 1] = ds->row_start[r] + fill[r];
        memset(fill, 0, (size_t)(size + 1) * sizeof *fill);
        for (int64_t k = 0; k < n; k++) {
            const int64_t r = row_of[k];
            ds->row_docs[ds->row_start[r] + fill[r]++] = order[k];
        }
    }
    free(row_of);
    free(fill);
    return st;
}

static cai_status build_rows(cai_sft_dataset_t *ds) {
    const int64_t nd = cai_indexed_num_documents(ds->tok);
    int64_t *order = malloc((size_t)(nd > 0 ? nd : 1) * sizeof *order), n = 0;
    if (!order) return CAI_ERROR(CAI_ERR_NOMEM, "sft dataset: %lld documents", (long long)nd);
    for (int64_t d = 0; d < nd; d++)
        if (ds->len[d] > 0) order[n++] = d;
    cai_status st = CAI_OK;
    if (ds->cfg.packed) {
        /* shuffled so that a row mixes conversations from all over the file */
        cai_data_shuffle(order, n, ds->cfg.seed, 0x5346545041434bull /* "SFTPACK" */);
        st = pack(ds, order, n);
    } else {
        ds->rows = n;
        ds->row_start = malloc((size_t)(n + 1) * sizeof *ds->row_start);
        ds->row_docs = order;
        order = NULL;
        if (!ds->row_start) st = CAI_ERROR(CAI_ERR_NOMEM, "sft rows: %lld", (long long)n);
        for (int64_t r = 0; st == CAI_OK && r <= n; r++) ds->row_start[r] = r;
    }
    free(order);
    ds->stats.rows = ds->rows;
    ds->stats.padding = ds->rows * ds->cfg.seq_len - ds->stats.tokens;
    return st;
}

cai_status cai_sft_dataset_init(cai_sft_dataset_t **out, const cai_sft_data_config *cfg) {
    CAI_CHECK_ARG(out && cfg && cfg->prefix && *cfg->prefix, "cai_sft_dataset_init: no dataset prefix");
    CAI_CHECK_ARG(cfg->seq_len >= 1, "sft dataset: seq_len %lld must be >= 1", (long long)cfg->seq_len);
    CAI_CHECK_ARG(cfg->overflow >= 0 && cfg->overflow < CAI_SFT_OVERFLOW_COUNT, "sft dataset: overflow policy %d",
                  (int)cfg->overflow);
    CAI_CHECK_ARG(strlen(cfg->prefix) < 4000, "sft dataset: prefix too long");
    *out = NULL;
    cai_sft_dataset_t *ds = calloc(1, sizeof *ds);
    if (!ds) return CAI_ERROR(CAI_ERR_NOMEM, "sft dataset");
    ds->cfg = *cfg;
    snprintf(ds->prefix, sizeof ds->prefix, "%s", cfg->prefix);
    ds->cfg.prefix = ds->prefix;
    char mask[4200];
    cai_status st = cai_sft_mask_prefix(cfg->prefix, mask, sizeof mask);
    if (st == CAI_OK) st = cai_indexed_open(&ds->tok, cfg->prefix, cfg->vocab_size);
    if (st == CAI_OK) st = cai_indexed_open(&ds->mask, mask, 0);
    if (st == CAI_OK) st = check_pair(ds, mask);
    if (st == CAI_OK) {
        ds->stats.documents = cai_indexed_num_documents(ds->tok);
        ds->len = calloc((size_t)(ds->stats.documents > 0 ? ds->stats.documents : 1), sizeof *ds->len);
        st = ds->len ? fit_documents(ds, mask) : CAI_ERROR(CAI_ERR_NOMEM, "sft dataset lengths");
    }
    if (st == CAI_OK) st = build_rows(ds);
    if (st == CAI_OK && ds->rows == 0)
        st = CAI_ERROR(CAI_ERR_INVALID_ARG,
                       "%s: no conversation left to train on (%lld documents, %lld dropped at seq_len %lld)",
                       cfg->prefix, (long long)ds->stats.documents, (long long)ds->stats.dropped,
                       (long long)cfg->seq_len);
    if (st != CAI_OK) {
        cai_sft_dataset_free(ds);
        return st;
    }
    *out = ds;
    return CAI_OK;
}

void cai_sft_dataset_free(cai_sft_dataset_t *ds) {
    if (!ds) return;
    cai_indexed_free(ds->tok);
    cai_indexed_free(ds->mask);
    free(ds->len);
    free(ds->row_start);
    free(ds->row_docs);
    free(ds);
}

int64_t cai_sft_dataset_size(const cai_sft_dataset_t *ds) { return ds ? ds->rows : 0; }
int64_t cai_sft_dataset_seq_len(const cai_sft_dataset_t *ds) { return ds ? ds->cfg.seq_len : 0; }

void cai_sft_dataset_stats(const cai_sft_dataset_t *ds, cai_sft_data_stats *stats) {
    if (ds && stats) *stats = ds->stats;
}

const int64_t *cai_sft_dataset_row_documents(const cai_sft_dataset_t *ds, int64_t r, int64_t *n) {
    if (!ds || r < 0 || r >= ds->rows) {
        if (n) *n = 0;
        return NULL;
    }
    if (n) *n = ds->row_start[r + 1] - ds->row_start[r];
    return ds->row_docs + ds->row_start[r];
}

static cai_status fill_row(const cai_sft_dataset_t *ds, int64_t r, int32_t *tokens, int32_t *targets,
                           int32_t *positions, int32_t *doc_ids, int32_t *ids, int32_t *mask) {
    const int64_t S = ds->cfg.seq_len;
    int64_t at = 0;
    for (int64_t k = ds->row_start[r]; k < ds->row_start[r + 1]; k++) {
        const int64_t d = ds->row_docs[k], n = ds->len[d];
        CAI_CALL(cai_indexed_read(ds->tok, d, 0, n, ids));
        CAI_CALL(cai_indexed_read(ds->mask, d, 0, n, mask));
        const int32_t seg = (int32_t)(k - ds->row_start[r]);
        for (int64_t i = 0; i + 1 < n; i++, at++) {
            if (tokens) tokens[at] = ids[i];
            if (targets) targets[at] = mask[i + 1] ? ids[i + 1] : CAI_IGNORE_INDEX;
            if (positions) positions[at] = (int32_t)i;
            if (doc_ids) doc_ids[at] = seg;
        }
    }
    for (; at < S; at++) {
        if (tokens) tokens[at] = ds->cfg.pad_id;
        if (targets) targets[at] = CAI_IGNORE_INDEX;
        if (positions) positions[at] = 0;
        if (doc_ids) doc_ids[at] = -1;
    }
    return CAI_OK;
}

cai_status cai_sft_dataset_batch(const cai_sft_dataset_t *ds, const int64_t *rows, int64_t n, int32_t *tokens,
                                 int32_t *targets, int32_t *positions, int32_t *doc_ids) {
    CAI_CHECK_ARG(ds && (rows || n == 0) && n >= 0, "cai_sft_dataset_batch: bad arguments");
    const int64_t S = ds->cfg.seq_len;
    int32_t *ids = malloc((size_t)(S + 1) * sizeof *ids), *mask = malloc((size_t)(S + 1) * sizeof *mask);
    cai_status st = ids && mask ? CAI_OK : CAI_ERROR(CAI_ERR_NOMEM, "sft batch row buffers");
    for (int64_t b = 0; b < n && st == CAI_OK; b++) {
        if (rows[b] < 0 || rows[b] >= ds->rows) {
            st = CAI_ERROR(CAI_ERR_INVALID_ARG, "sft batch: row %lld of %lld (entry %lld)", (long long)rows[b],
                           (long long)ds->rows, (long long)b);
            break;
        }
        st = fill_row(ds, rows[b], tokens ? tokens + b * S : NULL, targets ? targets + b * S : NULL,
                      positions ? positions + b * S : NULL, doc_ids ? doc_ids + b * S : NULL, ids, mask);
    }
    free(ids);
    free(mask);
    return st;
}

/* ------------------------------------------------------------------ loader */

struct cai_sft_loader {
    const cai_sft_dataset_t *ds;
    cai_sampler_t *sampler;
    int64_t *idx;
};

cai_status cai_sft_loader_init(cai_sft_loader_t **out, const cai_sft_dataset_t *ds, int64_t global_batch, int dp_size,
                               int dp_rank, uint64_t seed, int64_t consumed) {
    CAI_CHECK_ARG(out && ds, "cai_sft_loader_init: no dataset");
    *out = NULL;
    cai_sft_loader_t *l = calloc(1, sizeof *l);
    if (!l) return CAI_ERROR(CAI_ERR_NOMEM, "sft loader");
    l->ds = ds;
    const cai_sampler_config sc = {ds->rows, global_batch, dp_size, dp_rank, 1, seed};
    cai_status st = cai_sampler_init(&l->sampler, &sc, consumed);
    if (st == CAI_OK) {
        l->idx = malloc((size_t)cai_sampler_local_batch(l->sampler) * sizeof *l->idx);
        if (!l->idx) st = CAI_ERROR(CAI_ERR_NOMEM, "sft loader indices");
    }
    if (st != CAI_OK) {
        cai_sft_loader_free(l);
        return st;
    }
    *out = l;
    return CAI_OK;
}

cai_status cai_sft_loader_next(cai_sft_loader_t *l, int32_t *tokens, int32_t *targets, int32_t *positions,
                               int32_t *doc_ids) {
    CAI_CHECK_ARG(l, "cai_sft_loader_next: no loader");
    CAI_CALL(cai_sampler_next(l->sampler, l->idx));
    return cai_sft_dataset_batch(l->ds, l->idx, cai_sampler_local_batch(l->sampler), tokens, targets, positions,
                                 doc_ids);
}

int64_t cai_sft_loader_consumed(const cai_sft_loader_t *l) { return l ? cai_sampler_consumed(l->sampler) : 0; }
int64_t cai_sft_loader_local_batch(const cai_sft_loader_t *l) { return l ? cai_sampler_local_batch(l->sampler) : 0; }

void cai_sft_loader_free(cai_sft_loader_t *l) {
    if (!l) return;
    cai_sampler_free(l->sampler);
    free(l->idx);
    free(l);
}
