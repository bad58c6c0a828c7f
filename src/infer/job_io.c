/* Result lines (colossal's own and the OpenAI Batch API's output), the set
 * of ids a job has already answered, and the scan of an output file that a
 * rerun resumes from. Output is appended whole lines at a time, so a file
 * cut short by a killed writer ends in at most one partial line. */
#include "cai_config.h"
#include "colossal/infer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ UTF-8 */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* s[0..n) with each maximal ill-formed subsequence replaced by U+FFFD, the
 * Unicode Standard's recommended practice (Python's errors="replace"):
 * jansson refuses invalid UTF-8, and a model may well emit half a
 * character when a byte-level token splits one. */
static void utf8_fix(sbuf *b, const char *s, size_t n) {
    static const char fffd[] = "\xEF\xBF\xBD";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run < n && u[run] < 0x80) run++;
        if (run > i) {
            sb_put(b, s + i, run - i);
            i = run;
            continue;
        }
        unsigned char c = u[i], lo = 0x80, hi = 0xBF;
        size_t need;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
        else if (c == 0xED) need = 2, hi = 0x9F; /* no surrogates */
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) need = 3, hi = 0x8F; /* nothing past U+10FFFF */
        else {
            sb_put(b, fffd, 3);
            i++;
            continue;
        }
        size_t k = 1;
        for (; k <= need && i + k < n; k++) {
            unsigned char d = u[i + k];
            if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) break;
        }
        if (k == need + 1) sb_put(b, s + i, k);
        else sb_put(b, fffd, 3);
        i += k;
    }
}

static json_t *jstr(sbuf *b, const char *s, size_t n) {
    b->len = 0;
    sb_put(b, "", 0);
    utf8_fix(b, s ? s : "", s ? n : 0);
    return b->oom ? NULL : json_stringn(b->p, b->len);
}

static json_t *jcstr(sbuf *b, const char *s) { return jstr(b, s, s ? strlen(s) : 0); }

/* The shortest decimal that reads back as the same float, so a logprob
 * prints as -0.25 rather than float-to-double noise. JSON has no infinity:
 * a token with no probability at all is written as vLLM writes it, -9999. */
static json_t *jreal(float f) {
    if (!isfinite(f)) f = -9999.0f;
    char buf[48];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) return json_real(strtod(buf, NULL));
    }
    return json_real((double)f);
}

static int set(json_t *o, const char *key, json_t *v) { return v ? json_object_set_new(o, key, v) : -1; }
static int add(json_t *a, json_t *v) { return v ? json_array_append_new(a, v) : -1; }

/* ------------------------------------------------------------ token spelling */

typedef struct {
    const char *bytes;
    size_t len;
    char idbuf[32];
} spelling;

/* The token's bytes, or vLLM's "token_id:N" where no tokenizer is given. */
static cai_status spell(const cai_bpe_t *tok, int32_t id, spelling *s) {
    if (tok) return cai_bpe_token_bytes(tok, id, &s->bytes, &s->len);
    int n = snprintf(s->idbuf, sizeof s->idbuf, "token_id:%ld", (long)id);
    s->bytes = s->idbuf;
    s->len = (size_t)n;
    return CAI_OK;
}

static json_t *jbytes(const spelling *s) {
    json_t *a = json_array();
    int bad = !a;
    for (size_t i = 0; i < s->len && !bad; i++) bad |= add(a, json_integer((unsigned char)s->bytes[i]));
    if (bad) {
        json_decref(a);
        return NULL;
    }
    return a;
}

static size_t code_points(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* ------------------------------------------------------------ logprobs */

/* [{"token_id", ["token"], "logprob", "top_logprobs": [{"token_id", ["token"], "logprob"}]}] */
static cai_status native_logprobs(const cai_job_result *r, sbuf *sb, json_t **out) {
    json_t *arr = json_array();
    int bad = !arr;
    for (int64_t i = 0; i < r->n_tokens && !bad; i++) {
        const cai_sample_result *lp = &r->logprobs[i];
        json_t *e = json_object(), *top = json_array();
        bad |= add(arr, e);
        bad |= set(e, "token_id", json_integer(lp->token));
        spelling sp;
        if (r->tok) {
            cai_status st = spell(r->tok, lp->token, &sp);
            if (st != CAI_OK) {
                json_decref(arr);
                json_decref(top);
                return st;
            }
            bad |= set(e, "token", jstr(sb, sp.bytes, sp.len));
        }
        bad |= set(e, "logprob", jreal(lp->logprob));
        bad |= set(e, "top_logprobs", top);
        for (int j = 0; j < lp->n_top && !bad; j++) {
            json_t *t = json_object();
            bad |= add(top, t);
            bad |= set(t, "token_id", json_integer(lp->top_ids[j]));
            if (r->tok) {
                cai_status st = spell(r->tok, lp->top_ids[j], &sp);
                if (st != CAI_OK) {
                    json_decref(arr);
                    return st;
                }
                bad |= set(t, "token", jstr(sb, sp.bytes, sp.len));
            }
            bad |= set(t, "logprob", jreal(lp->top_logprobs[j]));
        }
    }
    if (bad) {
        json_decref(arr);
        return CAI_ERROR(CAI_ERR_NOMEM, "result line for '%s': cannot build the logprobs", r->id);
    }
    *out = arr;
    return CAI_OK;
}

/* Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]} */
static cai_status chat_logprobs(const cai_job_result *r, sbuf *sb, json_t **out) {
    json_t *o = json_object(), *content = json_array();
    int bad = !o;
    bad |= set(o, "content", content);
    for (int64_t i = 0; i < r->n_tokens && !bad; i++) {
        const cai_sample_result *lp = &r->logprobs[i];
        json_t *e = json_object(), *top = json_array();
        bad |= add(content, e);
        spelling sp;
        cai_status st = spell(r->tok, lp->token, &sp);
        if (st != CAI_OK) {
            json_decref(o);
            json_decref(top);
            return st;
        }
        bad |= set(e, "token", jstr(sb, sp.bytes, sp.len));
        bad |= set(e, "logprob", jreal(lp->logprob));
        bad |= set(e, "bytes", jbytes(&sp));
        bad |= set(e, "top_logprobs", top);
        for (int j = 0; j < lp->n_top && !bad; j++) {
            json_t *t = json_object();
            bad |= add(top, t);
            if ((st = spell(r->tok, lp->top_ids[j], &sp)) != CAI_OK) {
                json_decref(o);
                return st;
            }
            bad |= set(t, "token", jstr(sb, sp.bytes, sp.len));
            bad |= set(t, "logprob", jreal(lp->top_logprobs[j]));
            bad |= set(t, "bytes", jbytes(&sp));
        }
    }
    if (bad) {
        json_decref(o);
        return CAI_ERROR(CAI_ERR_NOMEM, "result line for '%s': cannot build the logprobs", r->id);
    }
    *out = o;
    return CAI_OK;
}

/* Completions (the legacy shape): {"tokens", "token_logprobs", "top_logprobs":
 * [{token: logprob}], "text_offset"}. As OpenAI documents, each position's
 * top_logprobs also holds the chosen token, so there may be n + 1 entries. */
static cai_status completion_logprobs(const cai_job_result *r, sbuf *sb, json_t **out) {
    json_t *o = json_object(), *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    int bad = !o;
    bad |= set(o, "tokens", tokens);
    bad |= set(o, "token_logprobs", lps);
    bad |= set(o, "top_logprobs", tops);
    bad |= set(o, "text_offset", offs);
    size_t offset = 0;
    for (int64_t i = 0; i < r->n_tokens && !bad; i++) {
        const cai_sample_result *lp = &r->logprobs[i];
        spelling sp;
        cai_status st = spell(r->tok, lp->token, &sp);
        if (st != CAI_OK) {
            json_decref(o);
            return st;
        }
        json_t *chosen = jstr(sb, sp.bytes, sp.len), *top = json_object();
        bad |= add(offs, json_integer((json_int_t)offset));
        offset += code_points(sb->p, sb->len);
        bad |= add(tokens, chosen);
        bad |= add(lps, jreal(lp->logprob));
        bad |= add(tops, top);
        for (int j = 0; j < lp->n_top && !bad; j++) {
            if ((st = spell(r->tok, lp->top_ids[j], &sp)) != CAI_OK) {
                json_decref(o);
                return st;
            }
            json_t *key = jstr(sb, sp.bytes, sp.len);
            bad |= !key;
            /* two tokens may spell the same text once bad UTF-8 is replaced: keep the likelier */
            if (key && !json_object_get(top, json_string_value(key)))
                bad |= set(top, json_string_value(key), jreal(lp->top_logprobs[j]));
            json_decref(key);
        }
        if (!bad && !json_object_get(top, json_string_value(chosen)))
            bad |= set(top, json_string_value(chosen), jreal(lp->logprob));
    }
    if (bad) {
        json_decref(o);
        return CAI_ERROR(CAI_ERR_NOMEM, "result line for '%s': cannot build the logprobs", r->id);
    }
    *out = o;
    return CAI_OK;
}

/* ------------------------------------------------------------ result lines */

static json_t *usage(const cai_job_result *r) {
    json_t *u = json_object();
    int bad = !u;
    bad |= set(u, "prompt_tokens", json_integer(r->prompt_tokens));
    bad |= set(u, "completion_tokens", json_integer(r->n_tokens));
    bad |= set(u, "total_tokens", json_integer(r->prompt_tokens + r->n_tokens));
    if (bad) {
        json_decref(u);
        return NULL;
    }
    return u;
}

static json_t *token_ids(const cai_job_result *r) {
    json_t *a = json_array();
    int bad = !a;
    for (int64_t i = 0; i < r->n_tokens && !bad; i++) bad |= add(a, json_integer(r->token_ids[i]));
    if (bad) {
        json_decref(a);
        return NULL;
    }
    return a;
}

static cai_status native_line(const cai_job_result *r, int failed, sbuf *sb, json_t *o) {
    int bad = 0;
    bad |= set(o, "id", jcstr(sb, r->id));
    bad |= set(o, "text", jstr(sb, r->text, r->text_len));
    bad |= set(o, "token_ids", token_ids(r));
    bad |= set(o, "finish_reason", jcstr(sb, r->finish_reason));
    bad |= set(o, "usage", usage(r));
    if (r->logprobs && !bad) {
        json_t *lp = NULL;
        CAI_CALL(native_logprobs(r, sb, &lp));
        bad |= set(o, "logprobs", lp);
    }
    if (failed) bad |= set(o, "error", jcstr(sb, r->error ? r->error : "unknown error"));
    if (bad) return CAI_ERROR(CAI_ERR_NOMEM, "result line for '%s': cannot build the JSON", r->id);
    return CAI_OK;
}

static json_t *prefixed(sbuf *sb, const char *prefix, const char *id) {
    sbuf tmp = {0};
    sb_put(&tmp, prefix, strlen(prefix));
    sb_put(&tmp, id, strlen(id));
    json_t *v = tmp.oom ? NULL : jstr(sb, tmp.p, tmp.len);
    free(tmp.p);
    return v;
}

static cai_status openai_line(const cai_job_result *r, int failed, sbuf *sb, json_t *o) {
    json_t *resp = json_object(), *body = json_object();
    int bad = !resp || !body;
    bad |= set(o, "id", prefixed(sb, "batch_req_", r->id));
    bad |= set(o, "custom_id", jcstr(sb, r->id));
    bad |= set(o, "response", resp);
    if (bad) {
        json_decref(body);
        return CAI_ERROR(CAI_ERR_NOMEM, "result line for '%s': cannot build the JSON", r->id);
    }
    bad |= set(resp, "status_code", json_integer(failed ? 400 : 200));
    bad |= set(resp, "request_id", jcstr(sb, r->id));
    bad |= set(resp, "body", body);
    if (failed) {
        const char *msg = r->error ? r->error : "unknown error";
        json_t *err = json_object(), *top = json_object();
        bad |= set(body, "error", err);
        if (!bad) {
            bad |= set(err, "message", jcstr(sb, msg));
            bad |= set(err, "type", json_string("invalid_request_error"));
            bad |= set(err, "param", json_null());
            bad |= set(err, "code", json_null());
        }
        bad |= set(o, "error", top);
        if (!bad) {
            bad |= set(top, "code", json_string("invalid_request"));
            bad |= set(top, "message", jcstr(sb, msg));
        }
    } else {
        json_t *choices = json_array(), *choice = json_object();
        bad |= set(body, "id", prefixed(sb, r->chat ? "chatcmpl-" : "cmpl-", r->id));
        bad |= set(body, "object", json_string(r->chat ? "chat.completion" : "text_completion"));
        bad |= set(body, "created", json_integer((json_int_t)time(NULL)));
        bad |= set(body, "model", jcstr(sb, r->model ? r->model : "colossal"));
        bad |= set(body, "choices", choices);
        bad |= add(choices, choice);
        if (!bad) {
            bad |= set(choice, "index", json_integer(0));
            if (r->chat) {
                json_t *msg = json_object();
                bad |= set(choice, "message", msg);
                if (!bad) {
                    bad |= set(msg, "role", json_string("assistant"));
                    bad |= set(msg, "content", jstr(sb, r->text, r->text_len));
                }
            } else {
                bad |= set(choice, "text", jstr(sb, r->text, r->text_len));
            }
            json_t *lp = json_null();
            if (r->logprobs && !bad) {
                cai_status st = r->chat ? chat_logprobs(r, sb, &lp) : completion_logprobs(r, sb, &lp);
                if (st != CAI_OK) {
                    cai_error_push(__FILE__, __LINE__, __func__, "logprobs");
                    return st;
                }
            }
            bad |= set(choice, "logprobs", lp);
            bad |= set(choice, "finish_reason", jcstr(sb, r->finish_reason));
        }
        bad |= set(body, "usage", usage(r));
        bad |= set(o, "error", json_null());
    }
    if (bad) return CAI_ERROR(CAI_ERR_NOMEM, "result line for '%s': cannot build the JSON", r->id);
    return CAI_OK;
}

cai_status cai_job_result_line(const cai_job_result *r, cai_byte_buf *out) {
    CAI_CHECK_ARG(r && out, "cai_job_result_line: NULL argument");
    CAI_CHECK_ARG(r->id, "cai_job_result_line: the result has no id");
    CAI_CHECK_ARG(r->format == CAI_JOB_NATIVE || r->format == CAI_JOB_OPENAI,
                  "cai_job_result_line: result '%s' has format %d (native or openai)", r->id, (int)r->format);
    CAI_CHECK_ARG(r->finish_reason, "cai_job_result_line: result '%s' has no finish_reason", r->id);
    CAI_CHECK_ARG(r->text || r->text_len == 0, "cai_job_result_line: result '%s': text is NULL", r->id);
    CAI_CHECK_ARG(r->n_tokens >= 0 && (r->token_ids || r->n_tokens == 0),
                  "cai_job_result_line: result '%s': %lld tokens at %p", r->id, (long long)r->n_tokens,
                  (const void *)r->token_ids);
    const int failed = strcmp(r->finish_reason, "error") == 0;
    json_t *o = json_object();
    if (!o) return CAI_ERROR(CAI_ERR_NOMEM, "result line for '%s'", r->id);
    sbuf sb = {0};
    cai_status st = r->format == CAI_JOB_NATIVE ? native_line(r, failed, &sb, o) : openai_line(r, failed, &sb, o);
    free(sb.p);
    char *text = st == CAI_OK ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    if (st != CAI_OK) {
        cai_error_push(__FILE__, __LINE__, __func__, "building the result line");
        return st;
    }
    if (!text) return CAI_ERROR(CAI_ERR_NOMEM, "result line for '%s': cannot write the JSON text", r->id);
    size_t n = strlen(text);
    /* jansson escapes control characters; a raw newline would split the line in two */
    CAI_INVARIANT(!memchr(text, '\n', n), "result line for '%s' holds a raw newline", r->id);
    if (out->len + n + 2 > out->cap) {
        size_t cap = out->cap ? out->cap : 256;
        while (cap < out->len + n + 2) cap *= 2;
        char *p = realloc(out->data, cap);
        if (!p) {
            free(text);
            return CAI_ERROR(CAI_ERR_NOMEM, "result line for '%s': %zu bytes", r->id, cap);
        }
        out->data = p;
        out->cap = cap;
    }
    memcpy(out->data + out->len, text, n);
    out->len += n;
    out->data[out->len++] = '\n';
    out->data[out->len] = '\0';
    free(text);
    return CAI_OK;
}

/* ------------------------------------------------------------ id sets */

struct cai_id_set {
    char **slot; /* open addressing, linear probing; NULL: empty */
    size_t cap;  /* a power of two */
    size_t count;
};

cai_status cai_id_set_create(cai_id_set_t **out) {
    CAI_CHECK_ARG(out, "cai_id_set_create: out is NULL");
    *out = NULL;
    cai_id_set_t *s = calloc(1, sizeof *s);
    if (s) s->slot = calloc(64, sizeof *s->slot);
    if (!s || !s->slot) {
        free(s);
        return CAI_ERROR(CAI_ERR_NOMEM, "id set: 64 slots");
    }
    s->cap = 64;
    *out = s;
    return CAI_OK;
}

void cai_id_set_free(cai_id_set_t *s) {
    if (!s) return;
    for (size_t i = 0; i < s->cap; i++) free(s->slot[i]);
    free(s->slot);
    free(s);
}

static size_t find_slot(char *const *slot, size_t cap, const char *id) {
    size_t i = (size_t)cai_hash64(id) & (cap - 1);
    while (slot[i] && strcmp(slot[i], id) != 0) i = (i + 1) & (cap - 1);
    return i;
}

cai_status cai_id_set_add(cai_id_set_t *s, const char *id) {
    CAI_CHECK_ARG(s && id, "cai_id_set_add: NULL argument");
    size_t i = find_slot(s->slot, s->cap, id);
    if (s->slot[i]) return CAI_OK;
    if (2 * (s->count + 1) > s->cap) {
        size_t cap = 2 * s->cap;
        char **slot = calloc(cap, sizeof *slot);
        if (!slot) return CAI_ERROR(CAI_ERR_NOMEM, "id set: %zu slots", cap);
        for (size_t k = 0; k < s->cap; k++)
            if (s->slot[k]) slot[find_slot(slot, cap, s->slot[k])] = s->slot[k];
        free(s->slot);
        s->slot = slot;
        s->cap = cap;
        i = find_slot(s->slot, s->cap, id);
    }
    char *copy = strdup(id);
    if (!copy) return CAI_ERROR(CAI_ERR_NOMEM, "id set: copying id '%s'", id);
    s->slot[i] = copy;
    s->count++;
    return CAI_OK;
}

int cai_id_set_has(const cai_id_set_t *s, const char *id) {
    if (!s || !id) return 0;
    return s->slot[find_slot(s->slot, s->cap, id)] != NULL;
}

size_t cai_id_set_count(const cai_id_set_t *s) { return s ? s->count : 0; }

/* ------------------------------------------------------------ output scan */

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

/* The id a result line answers: "custom_id" (OpenAI), else "id" as text. */
static cai_status result_id(const char *path, int64_t line, const char *text, size_t len, cai_id_set_t *done) {
    json_error_t jerr;
    /* the writer escapes a NUL byte of generated text as \u0000 */
    json_t *root = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (!root)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "%s:%lld: not a result line: not valid JSON: %s (column %d); remove or repair the line, then "
                         "rerun",
                         path, (long long)line, jerr.text, jerr.column);
    json_t *id = json_object_get(root, "custom_id");
    if (!id) id = json_object_get(root, "id");
    char buf[32];
    const char *s = NULL;
    if (json_is_string(id)) {
        s = json_string_value(id);
    } else if (json_is_integer(id)) {
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(id));
        s = buf;
    }
    cai_status st = CAI_OK;
    if (!json_is_object(root))
        st = CAI_ERROR(CAI_ERR_FORMAT,
                       "%s:%lld: not a result line: a JSON object is expected; is this the job's output file?", path,
                       (long long)line);
    else if (!s)
        st = CAI_ERROR(CAI_ERR_FORMAT,
                       "%s:%lld: not a result line: no string 'custom_id' or string or integer 'id'; is this the job's "
                       "output file?",
                       path, (long long)line);
    else st = cai_id_set_add(done, s);
    json_decref(root);
    return st;
}

cai_status cai_job_output_scan(const char *path, cai_id_set_t *done, int64_t *lines_kept, int64_t *bytes_cut) {
    CAI_CHECK_ARG(path && done, "cai_job_output_scan: NULL argument");
    if (lines_kept) *lines_kept = 0;
    if (bytes_cut) *bytes_cut = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return CAI_OK;
        return CAI_ERROR(CAI_ERR_IO, "cannot open the output file '%s': %s", path, strerror(errno));
    }
    char *buf = NULL;
    size_t cap = 0;
    off_t whole = 0; /* bytes in complete lines */
    int64_t line = 0, kept = 0;
    ssize_t got;
    cai_status st = CAI_OK;
    size_t tail = 0;
    errno = 0;
    while ((got = getline(&buf, &cap, f)) > 0) {
        line++;
        if (buf[got - 1] != '\n') {
            tail = (size_t)got;
            break;
        }
        whole += got;
        if (blank(buf, (size_t)got)) continue;
        st = result_id(path, line, buf, (size_t)got - 1, done);
        if (st != CAI_OK) break;
        kept++;
    }
    if (st == CAI_OK && ferror(f)) st = CAI_ERROR(CAI_ERR_IO, "reading '%s' failed: %s", path, strerror(errno));
    free(buf);
    fclose(f);
    if (st != CAI_OK) return st;
    if (tail > 0) {
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            return CAI_ERROR(CAI_ERR_IO,
                             "'%s' ends in a partial line of %zu bytes, and opening it to cut that off failed: %s",
                             path, tail, strerror(errno));
        if (ftruncate(fd, whole) != 0 || fsync(fd) != 0) {
            int e = errno;
            close(fd);
            return CAI_ERROR(CAI_ERR_IO, "'%s': cutting its partial last line (%zu bytes at byte %lld) failed: %s",
                             path, tail, (long long)whole, strerror(e));
        }
        if (close(fd) != 0)
            return CAI_ERROR(CAI_ERR_IO, "'%s': closing after cutting its partial last line failed: %s", path,
                             strerror(errno));
    }
    if (lines_kept) *lines_kept = kept;
    if (bytes_cut) *bytes_cut = (int64_t)tail;
    return CAI_OK;
}
