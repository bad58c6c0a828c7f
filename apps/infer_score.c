/* colossal-infer --infer.score: log-likelihood evaluation over the engine's
 * scored prompts (the log-probability of every prompt token given the ones
 * before it).
 *
 * perplexity: documents of a text file (a line each), a JSONL with "text"
 * (and optionally "id"), or a Megatron dataset (PREFIX.bin/.idx), read in
 * windows of the model's context; a line per document with its token count
 * and negative log-likelihood, and the perplexity over all of them.
 *
 * choice: {"id", "context", "choices", "answer"} items (HellaSwag-style); a
 * line per item with every choice's log-likelihood, the prediction, and the
 * prediction normalised by the choice's length in bytes (lm-eval-harness'
 * acc_norm); the accuracy of both over all items.
 *
 * Both go through the same output as generation: rank 0 writes whole lines,
 * a rerun skips the ids already written, and the summary is computed from
 * the output file, so a resumed job reports every item once. */
#include "cai_config.h"

#include <jansson.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "infer.h"

/* A scored prompt: tokens [0, n) whose log-probabilities over [from, to)
 * (positions of the predicted tokens) add up into item `item`'s part `part`. */
typedef struct {
    int64_t item;
    int part;
    int64_t from, to;
} sub_req;

typedef struct {
    char *id;
    int n_parts, parts_done;
    double *ll;     /* per part: sum of log-probabilities */
    int64_t *count; /* per part: tokens scored */
    int64_t *bytes; /* choice: the choice's length in bytes */
    int answer;
} item_t;

typedef struct {
    ij_job *j;
    item_t *items;
    int64_t n_items, cap_items;
    sub_req *subs;
    int64_t n_subs, cap_subs, next_sub;
    cai_byte_buf line;
    cai_token_buf ids;
} score_state;

static cai_status push_item(score_state *s, const char *id, int n_parts, int answer, item_t **out) {
    if (s->n_items == s->cap_items) {
        int64_t cap = s->cap_items ? 2 * s->cap_items : 64;
        item_t *a = realloc(s->items, (size_t)cap * sizeof *a);
        if (!a) return CAI_ERROR(CAI_ERR_NOMEM, "infer score items");
        s->items = a;
        s->cap_items = cap;
    }
    item_t *it = &s->items[s->n_items];
    memset(it, 0, sizeof *it);
    it->id = strdup(id);
    it->n_parts = n_parts;
    it->answer = answer;
    it->ll = calloc((size_t)n_parts, sizeof *it->ll);
    it->count = calloc((size_t)n_parts, sizeof *it->count);
    it->bytes = calloc((size_t)n_parts, sizeof *it->bytes);
    if (!it->id || !it->ll || !it->count || !it->bytes) return CAI_ERROR(CAI_ERR_NOMEM, "infer score item");
    s->n_items++;
    *out = it;
    return CAI_OK;
}

static void items_free(score_state *s) {
    for (int64_t i = 0; i < s->n_items; i++) {
        free(s->items[i].id);
        free(s->items[i].ll);
        free(s->items[i].count);
        free(s->items[i].bytes);
    }
    free(s->items);
    free(s->subs);
}

/* The prompt tokens of each sub-request are kept by the engine; the state
 * keeps only where the scored span is. */
static cai_status add_sub(score_state *s, int64_t item, int part, const int32_t *ids, int64_t n, int64_t from,
                          int64_t to) {
    if (s->n_subs == s->cap_subs) {
        int64_t cap = s->cap_subs ? 2 * s->cap_subs : 256;
        sub_req *a = realloc(s->subs, (size_t)cap * sizeof *a);
        if (!a) return CAI_ERROR(CAI_ERR_NOMEM, "infer score requests");
        s->subs = a;
        s->cap_subs = cap;
    }
    s->subs[s->n_subs] = (sub_req){item, part, from, to};
    cai_sampling_params sp = cai_sampling_default();
    sp.max_new_tokens = 1;
    CAI_CALL(cai_engine_add(s->j->engine, s->n_subs, ids, n, &sp, 1));
    s->n_subs++;
    return CAI_OK;
}

static cai_status write_item(score_state *s, const item_t *it) {
    const ij_config *c = s->j->cfg;
    json_t *o = json_object();
    if (!o) return CAI_ERROR(CAI_ERR_NOMEM, "score line");
    json_object_set_new(o, "id", json_string(it->id));
    if (c->score == IJ_SCORE_PERPLEXITY) {
        double ll = 0;
        int64_t n = 0;
        for (int p = 0; p < it->n_parts; p++) {
            ll += it->ll[p];
            n += it->count[p];
        }
        json_object_set_new(o, "tokens", json_integer(n));
        json_object_set_new(o, "nll", json_real(-ll));
    } else {
        json_t *sc = json_array(), *sn = json_array();
        int pred = 0, pred_norm = 0;
        for (int p = 0; p < it->n_parts; p++) {
            const double norm = it->ll[p] / (double)(it->bytes[p] > 0 ? it->bytes[p] : 1);
            json_array_append_new(sc, json_real(it->ll[p]));
            json_array_append_new(sn, json_real(norm));
            if (it->ll[p] > it->ll[pred]) pred = p;
            if (norm > it->ll[pred_norm] / (double)(it->bytes[pred_norm] > 0 ? it->bytes[pred_norm] : 1)) pred_norm = p;
        }
        json_object_set_new(o, "loglikelihoods", sc);
        json_object_set_new(o, "loglikelihoods_norm", sn);
        json_object_set_new(o, "pred", json_integer(pred));
        json_object_set_new(o, "pred_norm", json_integer(pred_norm));
        if (it->answer >= 0) {
            json_object_set_new(o, "answer", json_integer(it->answer));
            json_object_set_new(o, "correct", json_boolean(pred == it->answer));
            json_object_set_new(o, "correct_norm", json_boolean(pred_norm == it->answer));
        }
    }
    char *txt = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!txt) return CAI_ERROR(CAI_ERR_NOMEM, "score line");
    s->line.len = 0;
    cai_status st = CAI_OK;
    size_t n = strlen(txt);
    char *buf = malloc(n + 2);
    if (!buf) st = CAI_ERROR(CAI_ERR_NOMEM, "score line");
    if (st == CAI_OK) {
        memcpy(buf, txt, n);
        buf[n] = '\n';
        st = ij_output_emit(s->j->out, buf, n + 1, 0);
    }
    free(buf);
    free(txt);
    return st;
}

/* ------------------------------------------------------------ items */

static cai_status encode(score_state *s, const char *text, size_t len, cai_token_buf *out) {
    out->len = 0;
    ij_tokenizer t = *s->j->tok;
    t.bos = -1; /* the first piece of an item carries the bos, once */
    return ij_encode(&t, text, len, out);
}

/* One document: windows of the context length, each scoring its tokens
 * after the first. A document's first token is not predicted. */
static cai_status add_document(score_state *s, const char *id, const int32_t *ids, int64_t n) {
    const int64_t T = s->j->model->max_seq_len;
    const int64_t windows = n < 2 ? 0 : (n - 1 + (T - 1) - 1) / (T - 1);
    item_t *it = NULL;
    CAI_CALL(push_item(s, id, windows > 0 ? (int)windows : 1, -1, &it));
    if (windows == 0) {
        it->parts_done = it->n_parts;
        return CAI_OK;
    }
    /* window w covers tokens [w (T-1), w (T-1) + T): it predicts tokens 1.. of itself */
    for (int64_t w = 0; w < windows; w++) {
        const int64_t a = w * (T - 1), len = n - a < T ? n - a : T;
        CAI_CALL(add_sub(s, s->n_items - 1, (int)w, ids + a, len, 0, len - 1));
    }
    return CAI_OK;
}

static cai_status add_choice_item(score_state *s, const cai_choice_item *ci) {
    cai_token_buf ctx = {0}, ch = {0}, all = {0};
    item_t *it = NULL;
    cai_status st = push_item(s, ci->id, ci->n_choices, ci->answer, &it);
    const int64_t item = s->n_items - 1;
    if (st == CAI_OK) st = encode(s, ci->context, strlen(ci->context), &ctx);
    for (int c = 0; c < ci->n_choices && st == CAI_OK; c++) {
        s->items[item].bytes[c] = (int64_t)strlen(ci->choices[c]);
        st = encode(s, ci->choices[c], strlen(ci->choices[c]), &ch);
        all.len = 0;
        if (st == CAI_OK && s->j->tok->bos >= 0) st = cai_token_buf_append(&all, &s->j->tok->bos, 1);
        if (st == CAI_OK) st = cai_token_buf_append(&all, ctx.ids, ctx.len);
        if (st == CAI_OK) st = cai_token_buf_append(&all, ch.ids, ch.len);
        if (st == CAI_OK && (ch.len == 0 || all.len < 2))
            st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%lld: choice %d of '%s' (or its context) has no tokens",
                           s->j->cfg->input, (long long)ci->line, c, ci->id);
        /* the choice's tokens are predicted from position len(ctx) - 1 on */
        if (st == CAI_OK)
            st = add_sub(s, item, c, all.ids, (int64_t)all.len, (int64_t)(all.len - ch.len) - 1, (int64_t)all.len - 1);
    }
    cai_token_buf_free(&ctx);
    cai_token_buf_free(&ch);
    cai_token_buf_free(&all);
    return st;
}

/* ------------------------------------------------------------ the job */

static int is_megatron(const char *path, char *prefix, size_t cap) {
    size_t n = strlen(path);
    if (n > 4 && (strcmp(path + n - 4, ".bin") == 0 || strcmp(path + n - 4, ".idx") == 0)) n -= 4;
    char idx[4200];
    snprintf(prefix, cap, "%.*s", (int)n, path);
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    return access(idx, R_OK) == 0;
}

/* The item ids of the input, in order: this replica keeps its share of the
 * ones without a result. */
static cai_status load_items(score_state *s, const cai_id_set_t *done) {
    ij_job *j = s->j;
    const ij_config *c = j->cfg;
    char prefix[4096];
    int64_t k = 0;
    if (c->score == IJ_SCORE_PERPLEXITY && is_megatron(c->input, prefix, sizeof prefix)) {
        cai_indexed_dataset_t *ds = NULL;
        CAI_CALL(cai_indexed_open(&ds, prefix, j->model->vocab_size));
        cai_status st = CAI_OK;
        for (int64_t d = 0; d < cai_indexed_num_documents(ds) && st == CAI_OK; d++) {
            char id[64];
            snprintf(id, sizeof id, "doc-%lld", (long long)d);
            if (d % j->n_shards != j->shard || cai_id_set_has(done, id)) continue;
            if (k++ % j->n_replicas != j->replica) continue;
            s->ids.len = 0;
            for (int64_t q = cai_indexed_document_start(ds, d);
                 q < cai_indexed_document_start(ds, d + 1) && st == CAI_OK; q++) {
                const int64_t len = cai_indexed_sequence_length(ds, q);
                const size_t at = s->ids.len;
                for (int64_t z = 0; z < len && st == CAI_OK; z++) st = cai_token_buf_append(&s->ids, (int32_t[]){0}, 1);
                if (st == CAI_OK) st = cai_indexed_read(ds, q, 0, len, s->ids.ids + at);
            }
            if (st == CAI_OK) st = add_document(s, id, s->ids.ids, (int64_t)s->ids.len);
        }
        cai_indexed_free(ds);
        return st;
    }
    ij_lines lines;
    CAI_CALL(ij_lines_read(c->input, &lines));
    cai_status st = CAI_OK;
    for (int64_t i = 0; i < lines.n && st == CAI_OK; i++) {
        const char *text = lines.data + lines.start[i];
        const size_t len = lines.len[i];
        if (len == 0 || i % j->n_shards != j->shard) continue;
        if (c->score == IJ_SCORE_CHOICE) {
            cai_choice_item ci;
            st = cai_choice_item_parse(c->input, i + 1, text, len, &ci);
            if (st == CAI_OK && !cai_id_set_has(done, ci.id) && k++ % j->n_replicas == j->replica)
                st = add_choice_item(s, &ci);
            cai_choice_item_free(&ci);
            continue;
        }
        /* perplexity: a JSONL line with "text", or the line itself */
        char id[64];
        snprintf(id, sizeof id, "doc-%lld", (long long)i);
        json_error_t err;
        json_t *o = text[0] == '{' ? json_loadb(text, len, 0, &err) : NULL;
        const char *body = text;
        size_t blen = len;
        if (o) {
            json_t *t = json_object_get(o, "text"), *jid = json_object_get(o, "id");
            if (!json_is_string(t))
                st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%lld: field 'text': a JSON line needs a string \"text\"", c->input,
                               (long long)(i + 1));
            else {
                body = json_string_value(t);
                blen = json_string_length(t);
            }
            if (json_is_string(jid)) snprintf(id, sizeof id, "%s", json_string_value(jid));
            else if (json_is_integer(jid)) snprintf(id, sizeof id, "%lld", (long long)json_integer_value(jid));
        }
        if (st == CAI_OK && !cai_id_set_has(done, id) && k++ % j->n_replicas == j->replica) {
            st = encode(s, body, blen, &s->ids);
            if (st == CAI_OK && s->j->tok->bos >= 0) {
                st = cai_token_buf_append(&s->ids, &s->j->tok->bos, 1);
                memmove(s->ids.ids + 1, s->ids.ids, (s->ids.len - 1) * sizeof *s->ids.ids);
                s->ids.ids[0] = s->j->tok->bos;
            }
            if (st == CAI_OK) st = add_document(s, id, s->ids.ids, (int64_t)s->ids.len);
        }
        json_decref(o);
    }
    ij_lines_free(&lines);
    return st;
}

/* The summary over every line of the output (this run's and earlier runs'). */
static cai_status summarize(score_state *s) {
    const ij_config *c = s->j->cfg;
    ij_lines lines;
    CAI_CALL(ij_lines_read(s->j->out_path, &lines));
    double nll = 0;
    int64_t tokens = 0, items = 0, correct = 0, correct_norm = 0, answered = 0;
    for (int64_t i = 0; i < lines.n; i++) {
        json_error_t err;
        json_t *o = json_loadb(lines.data + lines.start[i], lines.len[i], 0, &err);
        if (!o) continue;
        items++;
        tokens += json_integer_value(json_object_get(o, "tokens"));
        nll += json_number_value(json_object_get(o, "nll"));
        if (json_object_get(o, "correct")) {
            answered++;
            correct += json_is_true(json_object_get(o, "correct"));
            correct_norm += json_is_true(json_object_get(o, "correct_norm"));
        }
        json_decref(o);
    }
    ij_lines_free(&lines);
    if (c->score == IJ_SCORE_PERPLEXITY)
        printf("perplexity: %.4f over %lld tokens of %lld documents (mean nll %.4f)\n",
               tokens ? exp(nll / (double)tokens) : NAN, (long long)tokens, (long long)items,
               tokens ? nll / (double)tokens : NAN);
    else
        printf("choice: accuracy %.4f, length-normalised %.4f over %lld items with an answer (%lld items)\n",
               answered ? (double)correct / (double)answered : NAN,
               answered ? (double)correct_norm / (double)answered : NAN, (long long)answered, (long long)items);
    fflush(stdout);
    return CAI_OK;
}

cai_status ij_score(ij_job *j) {
    score_state s = {.j = j};
    cai_id_set_t *done = NULL;
    cai_status st = cai_id_set_create(&done);
    /* Rank 0 cuts a partial last line before anyone reads the file. */
    if (st == CAI_OK && j->out->rank == 0) st = cai_job_output_scan(j->out_path, done, NULL, NULL);
    int ok = st == CAI_OK;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, j->out->world);
    if (st == CAI_OK && !ok) st = CAI_ERROR(CAI_ERR_IO, "infer: rank 0 could not read %s", j->out_path);
    if (st == CAI_OK && j->out->rank != 0) st = cai_job_output_scan(j->out_path, done, NULL, NULL);
    if (st == CAI_OK) st = load_items(&s, done);
    while (st == CAI_OK && cai_engine_pending(j->engine) > 0) {
        st = cai_engine_step(j->engine);
        cai_engine_output o;
        while (st == CAI_OK && cai_engine_take(j->engine, &o)) {
            const sub_req *r = &s.subs[o.tag];
            item_t *it = &s.items[r->item];
            double ll = 0;
            for (int64_t p = r->from; p < r->to; p++) ll += o.prompt_logprobs[p];
            it->ll[r->part] = ll;
            it->count[r->part] = r->to - r->from;
            if (++it->parts_done == it->n_parts) st = write_item(&s, it);
            cai_engine_output_free(&o);
        }
        if (st == CAI_OK) st = ij_output_poll(j->out);
    }
    /* documents too short to score are written too */
    for (int64_t i = 0; i < s.n_items && st == CAI_OK; i++)
        if (s.items[i].n_parts == 1 && s.items[i].count[0] == 0 && s.items[i].parts_done == 1)
            st = write_item(&s, &s.items[i]);
    if (st == CAI_OK) st = ij_output_close(j->out);
    if (st == CAI_OK && j->out->rank == 0) st = summarize(&s);
    items_free(&s);
    cai_id_set_free(done);
    cai_byte_buf_free(&s.line);
    cai_token_buf_free(&s.ids);
    return st;
}
