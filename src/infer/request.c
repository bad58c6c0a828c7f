/* Batch-job request lines (colossal's own and the OpenAI Batch API's) and
 * multiple-choice items; chat templates are in src/data/chat.c. A job file
 * may hold a million lines, so every refusal names the file, the line and
 * the field, and says what would fit: the user fixes that one line and
 * reruns. */
#include "cai_config.h"
#include "colossal/infer.h"

#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const cai_job_format_names[] = {"auto", "native", "openai", NULL};

/* ------------------------------------------------------------ errors */

typedef struct {
    const char *file;
    int64_t line;
    const char *prefix; /* how field names are spelled in messages: "" or "body." */
} pctx;

#define BAD(c, ...) cai_error_line((c)->file, (c)->line, __FILE__, __LINE__, __func__, __VA_ARGS__)

/* OpenAI clients send null for a parameter they leave unset: null means absent. */
static json_t *field(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int in_list(const char *key, const char *const *list) {
    for (; *list; list++)
        if (strcmp(key, *list) == 0) return 1;
    return 0;
}

static cai_status check_keys(const pctx *c, const json_t *o, const char *const *known, const char *what) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        /* null is "not given" (see field()), whatever the key */
        if (json_is_null(v) || in_list(key, known)) continue;
        char list[1024];
        size_t used = 0;
        list[0] = '\0';
        for (const char *const *k = known; *k && used < sizeof list; k++) {
            int w = snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", *k);
            if (w < 0) break;
            used += (size_t)w;
        }
        return BAD(c, "unknown key '%s%s' in %s (known: %s)", c->prefix, key, what, list);
    }
    return CAI_OK;
}

static cai_status dup_str(const pctx *c, const char *s, size_t n, char **out) {
    char *p = malloc(n + 1);
    if (!p)
        return cai_error_set(CAI_ERR_NOMEM, __FILE__, __LINE__, __func__, "%s:%lld: %zu bytes for a string", c->file,
                             (long long)c->line, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    *out = p;
    return CAI_OK;
}

/* ------------------------------------------------------------ typed fields */

/* A string or an integer id as text; a real is refused because its spelling
 * would not survive the round trip through a result line and a rerun. */
static cai_status id_text(const pctx *c, const json_t *v, const char *key, int allow_int, char **out) {
    if (json_is_string(v) && json_string_length(v) > 0)
        return dup_str(c, json_string_value(v), json_string_length(v), out);
    if (allow_int && json_is_integer(v)) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return dup_str(c, buf, (size_t)n, out);
    }
    if (json_is_string(v)) return BAD(c, "field '%s': must not be empty", key);
    return BAD(c, "field '%s': must be a non-empty string%s, not %s", key, allow_int ? " or an integer" : "",
               cai_json_kind(v));
}

/* An integer field in [min, max]; *given is 0 (and *out untouched) when absent. */
static cai_status get_int(const pctx *c, const json_t *o, const char *key, long long min, long long max, long long *out,
                          int *given) {
    json_t *v = field(o, key);
    *given = v != NULL;
    if (!v) return CAI_OK;
    if (!json_is_integer(v))
        return BAD(c, "field '%s%s': must be an integer, not %s", c->prefix, key, cai_json_kind(v));
    long long x = (long long)json_integer_value(v);
    if (x < min || x > max)
        return BAD(c, "field '%s%s': %lld is out of range [%lld, %lld]", c->prefix, key, x, min, max);
    *out = x;
    return CAI_OK;
}

static cai_status get_float(const pctx *c, const json_t *o, const char *key, float *out) {
    json_t *v = field(o, key);
    if (!v) return CAI_OK;
    if (!json_is_number(v)) return BAD(c, "field '%s%s': must be a number, not %s", c->prefix, key, cai_json_kind(v));
    double x = json_number_value(v);
    if (!(fabs(x) <= FLT_MAX)) return BAD(c, "field '%s%s': %g is out of a float's range", c->prefix, key, x);
    *out = (float)x;
    return CAI_OK;
}

static cai_status get_bool(const pctx *c, const json_t *o, const char *key, int *out, int *given) {
    json_t *v = field(o, key);
    if (given) *given = v != NULL;
    if (!v) return CAI_OK;
    if (!json_is_boolean(v))
        return BAD(c, "field '%s%s': must be true or false, not %s", c->prefix, key, cai_json_kind(v));
    *out = json_is_true(v);
    return CAI_OK;
}

/* Token ids: a non-empty array of integers in [0, 2^31). */
static cai_status get_ids(const pctx *c, const json_t *arr, const char *name, size_t max, int32_t *fixed, int32_t **out,
                          int64_t *n) {
    if (!json_is_array(arr))
        return BAD(c, "field '%s%s': must be an array of token ids, not %s", c->prefix, name, cai_json_kind(arr));
    size_t len = json_array_size(arr);
    if (len == 0 && !fixed) return BAD(c, "field '%s%s': must not be empty", c->prefix, name);
    if (len > max) return BAD(c, "field '%s%s': %zu ids, at most %zu are allowed", c->prefix, name, len, max);
    int32_t *ids = fixed;
    if (!ids) {
        ids = malloc(len * sizeof *ids);
        if (!ids)
            return cai_error_set(CAI_ERR_NOMEM, __FILE__, __LINE__, __func__, "%s:%lld: %zu token ids", c->file,
                                 (long long)c->line, len);
    }
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            if (ids != fixed) free(ids);
            if (!json_is_integer(v))
                return BAD(c, "field '%s%s[%zu]': must be a token id (an integer >= 0), not %s", c->prefix, name, i,
                           cai_json_kind(v));
            return BAD(c, "field '%s%s[%zu]': %" JSON_INTEGER_FORMAT " is not a token id (0 to %ld)", c->prefix, name,
                       i, json_integer_value(v), (long)INT32_MAX);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    if (out) *out = ids;
    *n = (int64_t)len;
    return CAI_OK;
}

/* ------------------------------------------------------------ messages and prompts */

static void free_messages(cai_chat_message *m, int n) {
    for (int i = 0; i < n; i++) {
        free(m[i].role);
        free(m[i].content);
    }
    free(m);
}

/* Content as a string, or as OpenAI's list of parts of which only text parts
 * can be served; the parts are joined with "\n" as vLLM joins them. */
static cai_status message_content(const pctx *c, const json_t *v, size_t idx, char **out) {
    if (json_is_string(v)) return dup_str(c, json_string_value(v), json_string_length(v), out);
    if (!json_is_array(v))
        return BAD(c, "field '%smessages[%zu].content': must be a string or an array of text parts, not %s", c->prefix,
                   idx, v ? cai_json_kind(v) : "absent");
    size_t total = 0, n = json_array_size(v);
    for (size_t p = 0; p < n; p++) {
        json_t *part = json_array_get(v, p), *type = json_object_get(part, "type"),
               *text = json_object_get(part, "text");
        if (!json_is_object(part))
            return BAD(c, "field '%smessages[%zu].content[%zu]': must be an object {\"type\": \"text\", \"text\": ...}",
                       c->prefix, idx, p);
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
            return BAD(c, "field '%smessages[%zu].content[%zu].type': only \"text\" parts can be served (got %s%s%s)",
                       c->prefix, idx, p, json_is_string(type) ? "\"" : "",
                       json_is_string(type) ? json_string_value(type) : (type ? cai_json_kind(type) : "none"),
                       json_is_string(type) ? "\"" : "");
        if (!json_is_string(text))
            return BAD(c, "field '%smessages[%zu].content[%zu].text': must be a string, not %s", c->prefix, idx, p,
                       text ? cai_json_kind(text) : "absent");
        total += json_string_length(text) + (p > 0);
    }
    char *s = malloc(total + 1);
    if (!s)
        return cai_error_set(CAI_ERR_NOMEM, __FILE__, __LINE__, __func__, "%s:%lld: %zu bytes of message content",
                             c->file, (long long)c->line, total + 1);
    size_t at = 0;
    for (size_t p = 0; p < n; p++) {
        json_t *text = json_object_get(json_array_get(v, p), "text");
        if (p > 0) s[at++] = '\n';
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    s[at] = '\0';
    *out = s;
    return CAI_OK;
}

static cai_status get_messages(const pctx *c, const json_t *arr, int strict, cai_job_request *r) {
    static const char *const known[] = {"role", "content", "name", NULL};
    if (!json_is_array(arr))
        return BAD(c, "field '%smessages': must be an array of {\"role\", \"content\"} objects, not %s", c->prefix,
                   cai_json_kind(arr));
    size_t n = json_array_size(arr);
    if (n == 0) return BAD(c, "field '%smessages': must not be empty", c->prefix);
    if (n > INT_MAX) return BAD(c, "field '%smessages': %zu messages are too many", c->prefix, n);
    cai_chat_message *m = calloc(n, sizeof *m);
    if (!m)
        return cai_error_set(CAI_ERR_NOMEM, __FILE__, __LINE__, __func__, "%s:%lld: %zu messages", c->file,
                             (long long)c->line, n);
    cai_status st = CAI_OK;
    for (size_t i = 0; i < n && st == CAI_OK; i++) {
        json_t *msg = json_array_get(arr, i), *role = json_object_get(msg, "role");
        if (!json_is_object(msg)) {
            st = BAD(c, "field '%smessages[%zu]': must be an object {\"role\", \"content\"}, not %s", c->prefix, i,
                     cai_json_kind(msg));
            break;
        }
        if (strict) {
            char what[64];
            snprintf(what, sizeof what, "%smessages[%zu]", c->prefix, i);
            pctx in_msg = *c;
            in_msg.prefix = "";
            st = check_keys(&in_msg, msg, known, what);
            if (st != CAI_OK) break;
        }
        if (!json_is_string(role) || json_string_length(role) == 0) {
            st = BAD(
                c,
                "field '%smessages[%zu].role': must be a non-empty string (\"system\", \"user\", \"assistant\"), not %s",
                c->prefix, i,
                !role                  ? "absent"
                : json_is_string(role) ? "empty"
                                       : cai_json_kind(role));
            break;
        }
        st = dup_str(c, json_string_value(role), json_string_length(role), &m[i].role);
        if (st == CAI_OK) st = message_content(c, json_object_get(msg, "content"), i, &m[i].content);
    }
    if (st != CAI_OK) {
        free_messages(m, (int)n);
        return st;
    }
    r->messages = m;
    r->n_messages = (int)n;
    r->chat = 1;
    return CAI_OK;
}

/* OpenAI's completions prompt: a string, an array of token ids, or a batch of
 * one of either (a batch of several would need several result lines). */
static cai_status get_openai_prompt(const pctx *c, const json_t *v, cai_job_request *r) {
    if (json_is_array(v) && json_array_size(v) >= 1) {
        json_t *first = json_array_get(v, 0);
        if (json_is_string(first) || json_is_array(first)) {
            if (json_array_size(v) > 1)
                return BAD(c,
                           "field '%sprompt': a batch of %zu prompts; one prompt per line (write one line per prompt, "
                           "each with its own custom_id)",
                           c->prefix, json_array_size(v));
            v = first;
        }
    }
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return BAD(c, "field '%sprompt': must not be empty", c->prefix);
        return dup_str(c, json_string_value(v), json_string_length(v), &r->prompt);
    }
    if (json_is_array(v)) return get_ids(c, v, "prompt", SIZE_MAX, NULL, &r->prompt_ids, &r->n_prompt_ids);
    return BAD(c, "field '%sprompt': must be a string or an array of token ids, not %s", c->prefix, cai_json_kind(v));
}

/* ------------------------------------------------------------ sampling fields */

typedef enum { KIND_NATIVE, KIND_CHAT, KIND_COMPLETION } req_kind;

static cai_status get_stop(const pctx *c, const json_t *v, cai_sampling_params *s) {
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_string(v))
        return BAD(c, "field '%sstop': must be a string or an array of strings, not %s", c->prefix, cai_json_kind(v));
    if (n > CAI_SAMPLE_MAX_STOP)
        return BAD(c, "field '%sstop': %zu stop strings, at most %d are allowed", c->prefix, n, CAI_SAMPLE_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : (json_t *)v;
        if (!json_is_string(e))
            return BAD(c, "field '%sstop[%zu]': must be a string, not %s", c->prefix, i, cai_json_kind(e));
        if (json_string_length(e) == 0)
            return BAD(c, "field '%sstop': an empty stop string would match at once", c->prefix);
    }
    /* the request's stops replace the job's defaults */
    for (int i = 0; i < s->n_stop; i++) {
        free(s->stop[i]);
        s->stop[i] = NULL;
    }
    s->n_stop = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : (json_t *)v;
        CAI_CALL(dup_str(c, json_string_value(e), json_string_length(e), &s->stop[i]));
        s->n_stop = (int)i + 1;
    }
    return CAI_OK;
}

static cai_status get_max_tokens(const pctx *c, const json_t *o, const char *a, const char *b, cai_sampling_params *s) {
    long long x = 0, y = 0;
    int ga = 0, gb = 0;
    CAI_CALL(get_int(c, o, a, INT_MIN, INT_MAX, &x, &ga));
    if (b) CAI_CALL(get_int(c, o, b, INT_MIN, INT_MAX, &y, &gb));
    if (ga && gb && x != y)
        return BAD(c, "fields '%s%s' (%lld) and '%s%s' (%lld) disagree: give one of them", c->prefix, a, x, c->prefix,
                   b, y);
    if (!ga && !gb) return CAI_OK;
    if (!ga) x = y;
    if (x < 1) return BAD(c, "field '%s%s': must be an integer >= 1 (got %lld)", c->prefix, ga ? a : b, x);
    s->max_new_tokens = (int)x;
    return CAI_OK;
}

/* "logprobs": native true (the chosen token's log-probability) or n (plus the
 * top n); OpenAI chat a boolean with "top_logprobs": n beside it, which
 * OpenAI refuses without logprobs true; OpenAI completions an integer n. */
#define STR_(x) #x
#define STR(x) STR_(x)
#define MAX_LP STR(CAI_SAMPLE_MAX_LOGPROBS)

static cai_status get_logprobs(const pctx *c, const json_t *o, req_kind k, cai_sampling_params *s) {
    json_t *lp = field(o, "logprobs"), *tlp = k == KIND_COMPLETION ? NULL : field(o, "top_logprobs");
    int on = -1;         /* -1 absent, 0 off, 1 on */
    long long count = 0; /* alternatives */
    int counted = 0;
    if (lp) {
        if (json_is_boolean(lp) && k != KIND_COMPLETION) {
            on = json_is_true(lp);
        } else if (json_is_integer(lp) && k != KIND_CHAT) {
            count = (long long)json_integer_value(lp);
            if (count < 0 || count > CAI_SAMPLE_MAX_LOGPROBS)
                return BAD(c, "field '%slogprobs': %lld is out of range [0, %d]", c->prefix, count,
                           CAI_SAMPLE_MAX_LOGPROBS);
            on = 1;
            counted = 1;
        } else {
            return BAD(c, "field '%slogprobs': must be %s, not %s", c->prefix,
                       k == KIND_NATIVE ? "true, false or an integer in [0, " MAX_LP "]"
                       : k == KIND_CHAT ? "true or false (the count goes in 'top_logprobs')"
                                        : "an integer in [0, " MAX_LP "]",
                       cai_json_kind(lp));
        }
    }
    if (tlp) {
        if (!json_is_integer(tlp))
            return BAD(c, "field '%stop_logprobs': must be an integer in [0, %d], not %s", c->prefix,
                       CAI_SAMPLE_MAX_LOGPROBS, cai_json_kind(tlp));
        long long t = (long long)json_integer_value(tlp);
        if (t < 0 || t > CAI_SAMPLE_MAX_LOGPROBS)
            return BAD(c, "field '%stop_logprobs': %lld is out of range [0, %d]", c->prefix, t,
                       CAI_SAMPLE_MAX_LOGPROBS);
        if (on == 0 || (on == -1 && k == KIND_CHAT))
            return BAD(c, "field '%stop_logprobs': needs '%slogprobs': true", c->prefix, c->prefix);
        if (counted && t != count)
            return BAD(c, "fields '%slogprobs' (%lld) and '%stop_logprobs' (%lld) disagree: give the count once",
                       c->prefix, count, c->prefix, t);
        on = 1;
        count = t;
    }
    if (on == 0) s->logprobs = -1;
    if (on == 1) s->logprobs = (int)count;
    return CAI_OK;
}

static cai_status get_sampling(const pctx *c, const json_t *o, req_kind k, cai_sampling_params *s) {
    long long x = 0;
    int given = 0;
    if (k == KIND_NATIVE) CAI_CALL(get_max_tokens(c, o, "max_new_tokens", "max_tokens", s));
    else if (k == KIND_CHAT) CAI_CALL(get_max_tokens(c, o, "max_completion_tokens", "max_tokens", s));
    else CAI_CALL(get_max_tokens(c, o, "max_tokens", NULL, s));
    CAI_CALL(get_float(c, o, "temperature", &s->temperature));
    CAI_CALL(get_float(c, o, "top_p", &s->top_p));
    CAI_CALL(get_float(c, o, "min_p", &s->min_p));
    CAI_CALL(get_float(c, o, "repetition_penalty", &s->repetition_penalty));
    CAI_CALL(get_float(c, o, "frequency_penalty", &s->frequency_penalty));
    CAI_CALL(get_float(c, o, "presence_penalty", &s->presence_penalty));
    CAI_CALL(get_int(c, o, "top_k", INT_MIN, INT_MAX, &x, &given));
    /* vLLM spells "off" -1 */
    if (given) s->top_k = x == -1 ? 0 : (int)x;
    json_t *v = field(o, "seed");
    if (v) {
        if (!json_is_integer(v))
            return BAD(c, "field '%sseed': must be an integer, not %s", c->prefix, cai_json_kind(v));
        s->seed = (uint64_t)json_integer_value(v);
        s->has_seed = 1;
    }
    if ((v = field(o, "stop"))) CAI_CALL(get_stop(c, v, s));
    if ((v = field(o, "stop_token_ids"))) {
        int64_t n = 0;
        CAI_CALL(get_ids(c, v, "stop_token_ids", CAI_SAMPLE_MAX_STOP_IDS, s->stop_ids, NULL, &n));
        s->n_stop_ids = (int)n;
    }
    CAI_CALL(get_bool(c, o, "ignore_eos", &s->ignore_eos, NULL));
    CAI_CALL(get_logprobs(c, o, k, s));
    return CAI_OK;
}

/* Re-raise cai_sampling_check's message (which names the field) against the line. */
static cai_status check_sampling(const pctx *c, const cai_sampling_params *s) {
    cai_status st = cai_sampling_check(s);
    if (st == CAI_OK) return CAI_OK;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cai_error_message());
    cai_error_clear();
    return BAD(c, "%s", msg);
}

/* ------------------------------------------------------------ request lines */

static const char *const k_native_keys[] = {"id",
                                            "prompt",
                                            "messages",
                                            "prompt_token_ids",
                                            "max_new_tokens",
                                            "max_tokens",
                                            "temperature",
                                            "top_k",
                                            "top_p",
                                            "min_p",
                                            "repetition_penalty",
                                            "frequency_penalty",
                                            "presence_penalty",
                                            "seed",
                                            "stop",
                                            "stop_token_ids",
                                            "ignore_eos",
                                            "logprobs",
                                            "top_logprobs",
                                            NULL};
static const char *const k_openai_keys[] = {"custom_id", "method", "url", "body", NULL};
static const char *const k_chat_keys[] = {"model",
                                          "messages",
                                          "max_tokens",
                                          "max_completion_tokens",
                                          "temperature",
                                          "top_p",
                                          "seed",
                                          "stop",
                                          "frequency_penalty",
                                          "presence_penalty",
                                          "logprobs",
                                          "top_logprobs",
                                          "n",
                                          "stream",
                                          "user",
                                          "top_k",
                                          "min_p",
                                          "repetition_penalty",
                                          "stop_token_ids",
                                          "ignore_eos",
                                          NULL};
static const char *const k_completion_keys[] = {"model",
                                                "prompt",
                                                "max_tokens",
                                                "temperature",
                                                "top_p",
                                                "seed",
                                                "stop",
                                                "frequency_penalty",
                                                "presence_penalty",
                                                "logprobs",
                                                "n",
                                                "stream",
                                                "user",
                                                "top_k",
                                                "min_p",
                                                "repetition_penalty",
                                                "stop_token_ids",
                                                "ignore_eos",
                                                NULL};

static cai_status parse_native(const pctx *c, const json_t *o, int strict, cai_job_request *r) {
    if (strict) CAI_CALL(check_keys(c, o, k_native_keys, "a native request"));
    json_t *prompt = field(o, "prompt"), *msgs = field(o, "messages"), *ids = field(o, "prompt_token_ids");
    int given = (prompt != NULL) + (msgs != NULL) + (ids != NULL);
    if (given != 1)
        return BAD(c, "exactly one of 'prompt' (a string), 'messages' (a chat) and 'prompt_token_ids' is needed; %s",
                   given == 0 ? "the line has none"
                   : !prompt  ? "the line has 'messages' and 'prompt_token_ids'"
                   : msgs     ? (ids ? "the line has all three" : "the line has 'prompt' and 'messages'")
                              : "the line has 'prompt' and 'prompt_token_ids'");
    if (prompt) {
        if (!json_is_string(prompt)) return BAD(c, "field 'prompt': must be a string, not %s", cai_json_kind(prompt));
        if (json_string_length(prompt) == 0) return BAD(c, "field 'prompt': must not be empty");
        CAI_CALL(dup_str(c, json_string_value(prompt), json_string_length(prompt), &r->prompt));
    } else if (msgs) {
        CAI_CALL(get_messages(c, msgs, strict, r));
    } else {
        CAI_CALL(get_ids(c, ids, "prompt_token_ids", SIZE_MAX, NULL, &r->prompt_ids, &r->n_prompt_ids));
    }
    CAI_CALL(get_sampling(c, o, KIND_NATIVE, &r->sampling));
    return CAI_OK;
}

static cai_status parse_openai(const pctx *c0, const json_t *o, int strict, cai_job_request *r) {
    if (strict) CAI_CALL(check_keys(c0, o, k_openai_keys, "an OpenAI batch line"));
    json_t *method = json_object_get(o, "method"), *url = field(o, "url"), *body = field(o, "body");
    if (method && !(json_is_string(method) && strcmp(json_string_value(method), "POST") == 0))
        return BAD(c0, "field 'method': must be \"POST\"%s%s%s", json_is_string(method) ? " (got \"" : "",
                   json_is_string(method) ? json_string_value(method) : "", json_is_string(method) ? "\")" : "");
    if (!url) return BAD(c0, "field 'url' is missing (\"/v1/chat/completions\" or \"/v1/completions\")");
    if (!json_is_string(url)) return BAD(c0, "field 'url': must be a string, not %s", cai_json_kind(url));
    const char *u = json_string_value(url);
    req_kind k;
    if (strcmp(u, "/v1/chat/completions") == 0) k = KIND_CHAT;
    else if (strcmp(u, "/v1/completions") == 0) k = KIND_COMPLETION;
    else return BAD(c0, "field 'url': \"%s\" is not served (\"/v1/chat/completions\" or \"/v1/completions\")", u);
    CAI_CALL(dup_str(c0, u, json_string_length(url), &r->url));
    if (!body) return BAD(c0, "field 'body' is missing (the request's parameters, an object)");
    if (!json_is_object(body)) return BAD(c0, "field 'body': must be an object, not %s", cai_json_kind(body));

    pctx c = *c0;
    c.prefix = "body.";
    json_t *prompt = field(body, "prompt"), *msgs = field(body, "messages");
    if (k == KIND_CHAT && prompt)
        return BAD(&c, "field 'body.prompt': /v1/chat/completions takes 'messages', not 'prompt'");
    if (k == KIND_COMPLETION && msgs)
        return BAD(&c, "field 'body.messages': /v1/completions takes 'prompt', not 'messages'");
    if (strict)
        CAI_CALL(check_keys(&c, body, k == KIND_CHAT ? k_chat_keys : k_completion_keys,
                            k == KIND_CHAT ? "a /v1/chat/completions body" : "a /v1/completions body"));
    json_t *v = field(body, "model");
    if (v) {
        if (!json_is_string(v)) return BAD(&c, "field 'body.model': must be a string, not %s", cai_json_kind(v));
        CAI_CALL(dup_str(&c, json_string_value(v), json_string_length(v), &r->model));
    }
    long long n = 1;
    int given = 0;
    CAI_CALL(get_int(&c, body, "n", LLONG_MIN, LLONG_MAX, &n, &given));
    if (n != 1)
        return BAD(&c,
                   "field 'body.n': must be 1 (got %lld): one completion per request is served; write one line per "
                   "completion, each with its own custom_id",
                   n);
    int stream = 0;
    CAI_CALL(get_bool(&c, body, "stream", &stream, NULL));
    if (stream) return BAD(&c, "field 'body.stream': a batch job does not stream; remove it or set it to false");

    if (k == KIND_CHAT) {
        if (!msgs) return BAD(&c, "field 'body.messages' is missing (an array of {\"role\", \"content\"} objects)");
        CAI_CALL(get_messages(&c, msgs, strict, r));
    } else {
        if (!prompt) return BAD(&c, "field 'body.prompt' is missing (a string or an array of token ids)");
        CAI_CALL(get_openai_prompt(&c, prompt, r));
    }
    CAI_CALL(get_sampling(&c, body, k, &r->sampling));
    return CAI_OK;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

static cai_status parse_line(const pctx *c, const char *text, size_t len, cai_job_format format,
                             const cai_sampling_params *defaults, int strict, cai_job_request *r) {
    if (blank(text, len)) return BAD(c, "empty line (one JSON object per line is expected)");
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) return BAD(c, "not valid JSON: %s (column %d)", jerr.text, jerr.column);
    cai_status st = CAI_OK;
    if (!json_is_object(root)) {
        st = BAD(c, "a request must be a JSON object {...}, not %s", cai_json_kind(root));
        goto done;
    }
    if (format == CAI_JOB_AUTO) format = json_object_get(root, "custom_id") ? CAI_JOB_OPENAI : CAI_JOB_NATIVE;
    r->format = format;
    const char *idkey = format == CAI_JOB_OPENAI ? "custom_id" : "id";
    json_t *id = field(root, idkey);
    if (!id) {
        st = BAD(c, "field '%s' is missing (%s naming the request in its result line)", idkey,
                 format == CAI_JOB_OPENAI ? "a string" : "a string or an integer");
        goto done;
    }
    CAI_CALL_GOTO(id_text(c, id, idkey, format != CAI_JOB_OPENAI, &r->id), st, done);
    if (defaults) {
        CAI_CALL_GOTO(cai_sampling_copy(&r->sampling, defaults), st, done);
    } else {
        r->sampling = cai_sampling_default();
    }
    if (format == CAI_JOB_OPENAI) CAI_CALL_GOTO(parse_openai(c, root, strict, r), st, done);
    else CAI_CALL_GOTO(parse_native(c, root, strict, r), st, done);
    CAI_CALL_GOTO(check_sampling(c, &r->sampling), st, done);
done:
    json_decref(root);
    return st;
}

cai_status cai_job_request_parse(const char *file, int64_t line, const char *text, size_t len, cai_job_format format,
                                 const cai_sampling_params *defaults, int strict_keys, cai_job_request *out) {
    CAI_CHECK_ARG(out, "cai_job_request_parse: out is NULL");
    memset(out, 0, sizeof *out);
    out->line = line;
    CAI_CHECK_ARG(text || len == 0, "cai_job_request_parse: text is NULL");
    CAI_CHECK_ARG(format >= CAI_JOB_AUTO && format < CAI_JOB_FORMAT_COUNT, "cai_job_request_parse: format %d",
                  (int)format);
    pctx c = {file ? file : "(input)", line, ""};
    cai_status st = parse_line(&c, text ? text : "", len, format, defaults, strict_keys, out);
    if (st == CAI_OK) return CAI_OK;
    char *id = out->id;
    cai_job_format f = out->format;
    out->id = NULL;
    cai_job_request_free(out);
    out->id = id;
    out->format = f;
    out->line = line;
    return st;
}

void cai_job_request_free(cai_job_request *r) {
    if (!r) return;
    free(r->id);
    free(r->prompt);
    free(r->prompt_ids);
    free_messages(r->messages, r->n_messages);
    free(r->model);
    free(r->url);
    cai_sampling_free(&r->sampling);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ multiple-choice items */

static cai_status parse_choice(const pctx *c, const char *text, size_t len, cai_choice_item *out) {
    if (blank(text, len)) return BAD(c, "empty line (one JSON object per line is expected)");
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) return BAD(c, "not valid JSON: %s (column %d)", jerr.text, jerr.column);
    cai_status st = CAI_OK;
    json_t *id = field(root, "id"), *ctx = field(root, "context"), *ch = field(root, "choices");
    if (!json_is_object(root)) {
        st = BAD(c, "an item must be a JSON object {\"id\", \"context\", \"choices\", \"answer\"}, not %s",
                 cai_json_kind(root));
        goto done;
    }
    if (!id) {
        st = BAD(c, "field 'id' is missing (a string or an integer naming the item)");
        goto done;
    }
    CAI_CALL_GOTO(id_text(c, id, "id", 1, &out->id), st, done);
    if (!json_is_string(ctx)) {
        st = BAD(c, "field 'context': must be a string, not %s", ctx ? cai_json_kind(ctx) : "absent");
        goto done;
    }
    if (!json_is_array(ch) || json_array_size(ch) < 2) {
        st = json_is_array(ch) ? BAD(c, "field 'choices': %zu choices, at least 2 are needed", json_array_size(ch))
                               : BAD(c, "field 'choices': must be an array of at least 2 strings, not %s",
                                     ch ? cai_json_kind(ch) : "absent");
        goto done;
    }
    size_t n = json_array_size(ch);
    if (n > INT_MAX) {
        st = BAD(c, "field 'choices': %zu choices are too many", n);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(ch, i);
        if (!json_is_string(e) || json_string_length(e) == 0) {
            st = BAD(c, "field 'choices[%zu]': must be a non-empty string, not %s", i,
                     json_is_string(e) ? "empty" : cai_json_kind(e));
            goto done;
        }
    }
    long long answer = -1;
    int given = 0;
    CAI_CALL_GOTO(get_int(c, root, "answer", 0, (long long)n - 1, &answer, &given), st, done);
    CAI_CALL_GOTO(dup_str(c, json_string_value(ctx), json_string_length(ctx), &out->context), st, done);
    out->choices = calloc(n, sizeof *out->choices);
    if (!out->choices) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "%s:%lld: %zu choices", c->file, (long long)c->line, n);
        goto done;
    }
    out->n_choices = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(ch, i);
        CAI_CALL_GOTO(dup_str(c, json_string_value(e), json_string_length(e), &out->choices[i]), st, done);
    }
    out->answer = (int)answer;
done:
    json_decref(root);
    return st;
}

cai_status cai_choice_item_parse(const char *file, int64_t line, const char *text, size_t len, cai_choice_item *out) {
    CAI_CHECK_ARG(out, "cai_choice_item_parse: out is NULL");
    memset(out, 0, sizeof *out);
    out->answer = -1;
    out->line = line;
    CAI_CHECK_ARG(text || len == 0, "cai_choice_item_parse: text is NULL");
    pctx c = {file ? file : "(input)", line, ""};
    cai_status st = parse_choice(&c, text ? text : "", len, out);
    if (st == CAI_OK) return CAI_OK;
    char *id = out->id;
    out->id = NULL;
    cai_choice_item_free(out);
    out->id = id;
    out->line = line;
    return st;
}

void cai_choice_item_free(cai_choice_item *c) {
    if (!c) return;
    free(c->id);
    free(c->context);
    for (int i = 0; i < c->n_choices; i++) free(c->choices[i]);
    free(c->choices);
    memset(c, 0, sizeof *c);
    c->answer = -1;
}
