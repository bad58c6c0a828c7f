/* Chat templates and chat JSONL conversations. Templates live here, in the
 * data layer, because training (loss masks) and inference (prompts) must
 * render a conversation identically; colossal-infer calls cai_chat_render.
 * A fine-tuning file may hold millions of lines, so every refusal names the
 * file, the line and the field, as colossal-infer's request lines do. */
#include "cai_config.h"

#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/data.h"

/* ------------------------------------------------------------ errors */

cai_status cai_error_line(const char *file, int64_t line, const char *src_file, int src_line, const char *func,
                          const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cai_error_set(CAI_ERR_FORMAT, src_file, src_line, func, "%s:%lld: %s", file ? file : "(input)",
                         (long long)line, msg);
}

const char *cai_json_kind(const json_t *v) {
    if (!v) return "absent";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown JSON value";
}

/* ------------------------------------------------------------ templates */

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_OTHER, N_ROLES, MAX_SPECIAL = 32 };
static const char *const k_roles[] = {"system", "user", "assistant"};

struct cai_chat_template_s {
    char *name;
    const char *bos, *generation;
    const char *prefix[N_ROLES], *end[N_ROLES], *suffix[N_ROLES];
    int trim;
    const char *special[MAX_SPECIAL];
    int n_special;
    json_t *root; /* a file's strings point into it */
};

typedef struct {
    const char *name, *bos, *prefix, *end, *suffix, *generation;
    int trim;
    const char *special[3];
} builtin;

/* In cai_chat_template order. */
static const builtin k_builtins[CAI_CHAT_COUNT] = {
    {"plain", "", "{role}: ", "\n", "", "assistant:", 0, {NULL}},
    {"chatml", "", "<|im_start|>{role}\n", "<|im_end|>", "\n", NULL, 0, {"<|im_start|>", "<|im_end|>", NULL}},
    {"llama3",
     "<|begin_of_text|>",
     "<|start_header_id|>{role}<|end_header_id|>\n\n",
     "<|eot_id|>",
     "",
     NULL,
     1,
     {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"}},
};
const char *const cai_chat_template_names[] = {"plain", "chatml", "llama3", NULL};

static int role_index(const char *role) {
    for (int r = 0; r < 3; r++)
        if (strcmp(role, k_roles[r]) == 0) return r;
    return ROLE_OTHER;
}

static cai_status buf_put(cai_byte_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) return CAI_ERROR(CAI_ERR_NOMEM, "chat text: %zu bytes", cap);
        b->data = p;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return CAI_OK;
}

/* A template piece with "{role}" replaced by the role. */
static cai_status put_piece(cai_byte_buf *b, const char *piece, const char *role) {
    for (const char *p = piece;;) {
        const char *at = strstr(p, "{role}");
        if (!at) return buf_put(b, p, strlen(p));
        CAI_CALL(buf_put(b, p, (size_t)(at - p)));
        CAI_CALL(buf_put(b, role, strlen(role)));
        p = at + 6;
    }
}

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }

/* The content as the template shows it (trimmed or not). */
static void content_span(const cai_chat_template_t *t, const char *content, const char **s, size_t *n) {
    size_t len = strlen(content);
    if (t->trim) {
        while (len > 0 && is_space(*content)) content++, len--;
        while (len > 0 && is_space(content[len - 1])) len--;
    }
    *s = content;
    *n = len;
}

static cai_status from_builtin(int i, cai_chat_template_t *t) {
    const builtin *b = &k_builtins[i];
    memset(t, 0, sizeof *t);
    t->bos = b->bos;
    for (int r = 0; r < N_ROLES; r++) {
        t->prefix[r] = b->prefix;
        t->end[r] = b->end;
        t->suffix[r] = b->suffix;
    }
    t->generation = b->generation;
    t->trim = b->trim;
    for (int k = 0; k < 3 && b->special[k]; k++) t->special[t->n_special++] = b->special[k];
    /* Llama 3's <|eot_id|> is its end, listed apart to keep the table short */
    if (i == CAI_CHAT_LLAMA3) t->special[t->n_special++] = "<|eot_id|>";
    return CAI_OK;
}

/* The assistant's prefix with its role in place. */
static cai_status assistant_prefix(const cai_chat_template_t *t, cai_byte_buf *b) {
    return put_piece(b, t->prefix[ROLE_ASSISTANT], "assistant");
}

/* Where the generation prompt is unset it is the assistant's prefix; either
 * way it must open that prefix, or training and inference would disagree
 * on where the assistant's turn starts. */
static cai_status check_generation(cai_chat_template_t *t, const char *where) {
    cai_byte_buf b = {0};
    cai_status st = assistant_prefix(t, &b);
    if (st == CAI_OK && t->generation && strncmp(b.data, t->generation, strlen(t->generation)) != 0)
        st = CAI_ERROR(CAI_ERR_FORMAT,
                       "%s: field 'generation_prompt': \"%s\" is not where the assistant's prefix \"%s\" starts "
                       "(the model learns to write what follows the generation prompt)",
                       where, t->generation, b.data);
    cai_byte_buf_free(&b);
    return st;
}

static int in_list(const char *key, const char *const *list) {
    for (; *list; list++)
        if (strcmp(key, *list) == 0) return 1;
    return 0;
}

/* The first key of o not in known, or NULL. */
static const char *unknown_key(const json_t *o, const char *const *known) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        if (!in_list(key, known)) return key;
    }
    return NULL;
}

static cai_status tpl_string(const char *path, const json_t *o, const char *key, const char *field, const char **out) {
    json_t *v = json_object_get(o, key);
    if (!v) return CAI_OK;
    if (!json_is_string(v))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: field '%s': must be a string, not %s", path, field, cai_json_kind(v));
    if (strlen(json_string_value(v)) != json_string_length(v))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: field '%s': must not contain NUL", path, field);
    *out = json_string_value(v);
    return CAI_OK;
}

static cai_status tpl_parse(const char *path, json_t *root, cai_chat_template_t *t) {
    static const char *const known[] = {"bos",  "prefix",         "end",   "suffix", "generation_prompt",
                                        "trim", "special_tokens", "roles", NULL};
    static const char *const role_keys[] = {"prefix", "end", "suffix", NULL};
    if (!json_is_object(root))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: a chat template must be a JSON object, not %s", path,
                         cai_json_kind(root));
    const char *bad = unknown_key(root, known);
    if (bad)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "%s: unknown key '%s' (known: bos, prefix, end, suffix, generation_prompt, trim, "
                         "special_tokens, roles)",
                         path, bad);
    t->bos = "";
    const char *prefix = "", *end = "", *suffix = "";
    CAI_CALL(tpl_string(path, root, "bos", "bos", &t->bos));
    CAI_CALL(tpl_string(path, root, "prefix", "prefix", &prefix));
    CAI_CALL(tpl_string(path, root, "end", "end", &end));
    CAI_CALL(tpl_string(path, root, "suffix", "suffix", &suffix));
    CAI_CALL(tpl_string(path, root, "generation_prompt", "generation_prompt", &t->generation));
    for (int r = 0; r < N_ROLES; r++) {
        t->prefix[r] = prefix;
        t->end[r] = end;
        t->suffix[r] = suffix;
    }
    json_t *trim = json_object_get(root, "trim");
    if (trim && !json_is_boolean(trim))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: field 'trim': must be true or false, not %s", path, cai_json_kind(trim));
    t->trim = trim && json_is_true(trim);
    json_t *roles = json_object_get(root, "roles");
    if (roles && !json_is_object(roles))
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "%s: field 'roles': must be an object keyed by system, user, assistant, not %s", path,
                         cai_json_kind(roles));
    const char *role;
    json_t *rv;
    json_object_foreach(roles, role, rv) {
        const int r = role_index(role);
        if (r == ROLE_OTHER)
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: field 'roles.%s': '%s' is not one of system|user|assistant", path,
                             role, role);
        if (!json_is_object(rv))
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: field 'roles.%s': must be an object {prefix, end, suffix}, not %s",
                             path, role, cai_json_kind(rv));
        bad = unknown_key(rv, role_keys);
        if (bad)
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: unknown key 'roles.%s.%s' (known: prefix, end, suffix)", path, role,
                             bad);
        char field[96];
        snprintf(field, sizeof field, "roles.%s.prefix", role);
        CAI_CALL(tpl_string(path, rv, "prefix", field, &t->prefix[r]));
        snprintf(field, sizeof field, "roles.%s.end", role);
        CAI_CALL(tpl_string(path, rv, "end", field, &t->end[r]));
        snprintf(field, sizeof field, "roles.%s.suffix", role);
        CAI_CALL(tpl_string(path, rv, "suffix", field, &t->suffix[r]));
    }
    json_t *sp = json_object_get(root, "special_tokens");
    if (sp && !json_is_array(sp))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: field 'special_tokens': must be an array of strings, not %s", path,
                         cai_json_kind(sp));
    if (json_array_size(sp) > MAX_SPECIAL)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: field 'special_tokens': %zu tokens, at most %d", path,
                         json_array_size(sp), MAX_SPECIAL);
    for (size_t i = 0; i < json_array_size(sp); i++) {
        json_t *v = json_array_get(sp, i);
        if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v))
            return CAI_ERROR(CAI_ERR_FORMAT, "%s: field 'special_tokens[%zu]': must be a non-empty string, not %s",
                             path, i, json_is_string(v) ? "an empty or NUL-holding string" : cai_json_kind(v));
        /* the tokenizer would give the byte's token to the special token
         * and leave ordinary text with no token for that byte */
        if (json_string_length(v) == 1)
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "%s: field 'special_tokens[%zu]': \"%s\" is one byte; a special token must be longer "
                             "(it would take that byte's token from ordinary text)",
                             path, i, json_string_value(v));
        t->special[t->n_special++] = json_string_value(v);
    }
    return check_generation(t, path);
}

static int is_path(const char *s) {
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 5 && strcmp(s + n - 5, ".json") == 0);
}

cai_status cai_chat_template_open(const char *name_or_path, cai_chat_template_t **out) {
    CAI_CHECK_ARG(name_or_path && *name_or_path && out, "cai_chat_template_open: no template named");
    *out = NULL;
    cai_chat_template_t *t = calloc(1, sizeof *t);
    if (!t) return CAI_ERROR(CAI_ERR_NOMEM, "chat template");
    t->name = strdup(name_or_path);
    cai_status st = t->name ? CAI_OK : CAI_ERROR(CAI_ERR_NOMEM, "chat template name");
    if (st == CAI_OK && !is_path(name_or_path)) {
        int i = 0;
        while (i < CAI_CHAT_COUNT && strcmp(cai_chat_template_names[i], name_or_path) != 0) i++;
        if (i == CAI_CHAT_COUNT)
            st = CAI_ERROR(CAI_ERR_CONFIG,
                           "chat template \"%s\": not one of plain|chatml|llama3, and not a file (a path has a '/' "
                           "or ends in .json)",
                           name_or_path);
        else {
            char *name = t->name;
            st = from_builtin(i, t); /* clears the struct */
            t->name = name;
        }
    } else if (st == CAI_OK) {
        json_error_t jerr;
        t->root = json_load_file(name_or_path, JSON_REJECT_DUPLICATES, &jerr);
        if (!t->root) {
            FILE *probe = fopen(name_or_path, "rb");
            if (!probe) st = CAI_ERROR(CAI_ERR_IO, "%s: cannot read the chat template", name_or_path);
            else
                st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: not valid JSON: %s (column %d)", name_or_path, jerr.line,
                               jerr.text, jerr.column);
            if (probe) fclose(probe);
        } else {
            st = tpl_parse(name_or_path, t->root, t);
        }
    }
    if (st != CAI_OK) {
        cai_chat_template_free(t);
        return st;
    }
    *out = t;
    return CAI_OK;
}

void cai_chat_template_free(cai_chat_template_t *t) {
    if (!t) return;
    if (t->root) json_decref(t->root);
    free(t->name);
    free(t);
}

const char *cai_chat_template_name(const cai_chat_template_t *t) { return t ? t->name : NULL; }

static cai_status check_messages(const cai_chat_message *msgs, int n, const char *who) {
    CAI_CHECK_ARG(n >= 0 && (msgs || n == 0), "%s: %d messages at %p", who, n, (const void *)msgs);
    for (int i = 0; i < n; i++)
        CAI_CHECK_ARG(msgs[i].role && msgs[i].content, "%s: message %d has no %s", who, i,
                      msgs[i].role ? "content" : "role");
    return CAI_OK;
}

static const char *generation_prompt(const cai_chat_template_t *t, cai_byte_buf *scratch) {
    if (t->generation) return t->generation;
    scratch->len = 0;
    return assistant_prefix(t, scratch) == CAI_OK ? scratch->data : NULL;
}

cai_status cai_chat_template_render(const cai_chat_template_t *t, const cai_chat_message *msgs, int n,
                                    int add_generation, cai_byte_buf *out) {
    CAI_CHECK_ARG(t && out, "cai_chat_template_render: no template or no output");
    CAI_CALL(check_messages(msgs, n, "cai_chat_template_render"));
    CAI_CALL(buf_put(out, t->bos, strlen(t->bos)));
    for (int i = 0; i < n; i++) {
        const int r = role_index(msgs[i].role);
        const char *s;
        size_t len;
        content_span(t, msgs[i].content, &s, &len);
        CAI_CALL(put_piece(out, t->prefix[r], msgs[i].role));
        CAI_CALL(buf_put(out, s, len));
        CAI_CALL(put_piece(out, t->end[r], msgs[i].role));
        CAI_CALL(put_piece(out, t->suffix[r], msgs[i].role));
    }
    if (add_generation) {
        cai_byte_buf scratch = {0};
        const char *g = generation_prompt(t, &scratch);
        cai_status st = g ? buf_put(out, g, strlen(g)) : CAI_ERROR(CAI_ERR_NOMEM, "generation prompt");
        cai_byte_buf_free(&scratch);
        CAI_CALL(st);
    }
    return CAI_OK;
}

cai_status cai_chat_render(cai_chat_template t, const cai_chat_message *msgs, int n, cai_byte_buf *out) {
    CAI_CHECK_ARG(out, "cai_chat_render: out is NULL");
    CAI_CHECK_ARG(t >= 0 && t < CAI_CHAT_COUNT, "cai_chat_render: template %d (0 to %d)", (int)t, CAI_CHAT_COUNT - 1);
    cai_chat_template_t b;
    CAI_CALL(from_builtin((int)t, &b));
    return cai_chat_template_render(&b, msgs, n, 1, out);
}

int cai_chat_template_n_special(const cai_chat_template_t *t) { return t ? t->n_special : 0; }

const char *cai_chat_template_special(const cai_chat_template_t *t, int i) {
    return t && i >= 0 && i < t->n_special ? t->special[i] : NULL;
}

static int has_special(const cai_bpe_t *tok, const char *text) {
    int32_t id;
    if (cai_bpe_token_id(tok, text, &id) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    return cai_bpe_is_special(tok, id);
}

void cai_chat_template_missing_tokens(const cai_chat_template_t *t, const cai_bpe_t *tok, const char **missing, int cap,
                                      int *n_missing) {
    int n = 0;
    for (int i = 0; t && tok && i < t->n_special; i++)
        if (!has_special(tok, t->special[i])) {
            if (missing && n < cap) missing[n] = t->special[i];
            n++;
        }
    if (n_missing) *n_missing = n;
}

cai_status cai_chat_template_add_tokens(const cai_chat_template_t *t, cai_bpe_t *tok, int *n_new) {
    CAI_CHECK_ARG(t && tok, "cai_chat_template_add_tokens: no template or no tokenizer");
    int added = 0;
    for (int i = 0; i < t->n_special; i++) {
        if (has_special(tok, t->special[i])) continue;
        const int32_t before = cai_bpe_vocab_size(tok);
        int32_t id;
        CAI_CALL(cai_bpe_add_special(tok, t->special[i], &id));
        added += cai_bpe_vocab_size(tok) > before;
    }
    if (n_new) *n_new = added;
    return CAI_OK;
}

/* ------------------------------------------------------------ conversations */

typedef struct {
    const char *file;
    int64_t line;
} pctx;

#define BAD(c, ...) cai_error_line((c)->file, (c)->line, __FILE__, __LINE__, __func__, __VA_ARGS__)

void cai_chat_conversation_free(cai_chat_conversation *c) {
    if (!c) return;
    for (int i = 0; i < c->n_messages; i++) {
        free(c->messages[i].role);
        free(c->messages[i].content);
    }
    free(c->messages);
    memset(c, 0, sizeof *c);
}

/* Where each message came from, for messages about order. */
typedef struct {
    const char *array; /* "messages", "prompt", ... */
    size_t index;      /* SIZE_MAX: a plain string field */
} origin;

static void field_name(const origin *o, const char *leaf, char *buf, size_t cap) {
    if (o->index == SIZE_MAX) snprintf(buf, cap, "%s", o->array);
    else snprintf(buf, cap, "%s[%zu]%s%s", o->array, o->index, leaf ? "." : "", leaf ? leaf : "");
}

static cai_status push(const pctx *c, cai_chat_conversation *conv, origin **orig, const char *role, const char *text,
                       size_t len, origin where) {
    cai_chat_message *m = realloc(conv->messages, (size_t)(conv->n_messages + 1) * sizeof *m);
    if (m) conv->messages = m;
    origin *o = realloc(*orig, (size_t)(conv->n_messages + 1) * sizeof *o);
    if (o) *orig = o;
    char *r = strdup(role), *s = malloc(len + 1);
    if (!m || !o || !r || !s) {
        free(r);
        free(s);
        return cai_error_set(CAI_ERR_NOMEM, __FILE__, __LINE__, __func__, "%s:%lld: %zu bytes of a message", c->file,
                             (long long)c->line, len);
    }
    memcpy(s, text, len);
    s[len] = '\0';
    conv->messages[conv->n_messages] = (cai_chat_message){r, s};
    (*orig)[conv->n_messages++] = where;
    return CAI_OK;
}

static cai_status content_text(const pctx *c, const json_t *v, const char *field) {
    if (!v) return BAD(c, "field '%s': absent", field);
    if (!json_is_string(v)) return BAD(c, "field '%s': must be a string, not %s", field, cai_json_kind(v));
    const char *s = json_string_value(v);
    size_t n = json_string_length(v), k = 0;
    if (n == 0) return BAD(c, "field '%s': must not be empty", field);
    while (k < n && is_space(s[k])) k++;
    if (k == n) return BAD(c, "field '%s': is only whitespace", field);
    return CAI_OK;
}

/* The role a spelling stands for, or NULL. */
static const char *normal_role(const char *s) {
    static const char *const map[][2] = {
        {"system", "system"}, {"user", "user"}, {"human", "user"}, {"assistant", "assistant"}, {"gpt", "assistant"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(s, map[i][0]) == 0) return map[i][1];
    return NULL;
}

static cai_status parse_messages(const pctx *c, const json_t *arr, const char *name, int strict,
                                 cai_chat_conversation *conv, origin **orig) {
    static const char *const known[] = {"role", "from", "content", "value", NULL};
    if (!json_is_array(arr))
        return BAD(c, "field '%s': must be an array of {\"role\", \"content\"} objects, not %s", name,
                   cai_json_kind(arr));
    const size_t n = json_array_size(arr);
    if (n == 0) return BAD(c, "field '%s': must not be empty", name);
    if (n > INT_MAX / 2) return BAD(c, "field '%s': %zu messages are too many", name, n);
    for (size_t i = 0; i < n; i++) {
        const origin where = {name, i};
        char f[160];
        json_t *msg = json_array_get(arr, i);
        if (!json_is_object(msg)) {
            field_name(&where, NULL, f, sizeof f);
            return BAD(c, "field '%s': must be an object {\"role\", \"content\"}, not %s", f, cai_json_kind(msg));
        }
        const char *bad = strict ? unknown_key(msg, known) : NULL;
        if (bad) {
            field_name(&where, bad, f, sizeof f);
            return BAD(c, "unknown key '%s' (known: role or from, content or value)", f);
        }
        json_t *role = json_object_get(msg, "role"), *from = json_object_get(msg, "from");
        json_t *content = json_object_get(msg, "content"), *value = json_object_get(msg, "value");
        if (role && from) {
            field_name(&where, NULL, f, sizeof f);
            return BAD(c, "field '%s': has both 'role' and 'from'; give one", f);
        }
        if (content && value) {
            field_name(&where, NULL, f, sizeof f);
            return BAD(c, "field '%s': has both 'content' and 'value'; give one", f);
        }
        const char *rkey = from ? "from" : "role";
        const char *allowed = from ? "system|human|assistant|gpt" : "system|user|assistant";
        json_t *rv = from ? from : role;
        field_name(&where, rkey, f, sizeof f);
        if (!rv) return BAD(c, "field '%s': absent (one of %s)", f, allowed);
        if (!json_is_string(rv))
            return BAD(c, "field '%s': must be a string (%s), not %s", f, allowed, cai_json_kind(rv));
        const char *r = normal_role(json_string_value(rv));
        if (!r) return BAD(c, "field '%s': '%.64s' is not one of %s", f, json_string_value(rv), allowed);
        field_name(&where, value ? "value" : "content", f, sizeof f);
        json_t *cv = value ? value : content;
        CAI_CALL(content_text(c, cv, f));
        CAI_CALL(push(c, conv, orig, r, json_string_value(cv), json_string_length(cv), where));
    }
    return CAI_OK;
}

/* An optional system turn first, then user and assistant alternating, from
 * the user to the assistant: what every chat template and trainer assumes. */
static cai_status check_order(const pctx *c, const cai_chat_conversation *conv, const origin *orig, const char *whole) {
    char f[160], g[160];
    int assistants = 0;
    for (int i = 0; i < conv->n_messages; i++) assistants += strcmp(conv->messages[i].role, "assistant") == 0;
    if (assistants == 0) return BAD(c, "field '%s': no assistant turn, so nothing to learn from", whole);
    const char *prev = NULL;
    for (int i = 0; i < conv->n_messages; i++) {
        const char *r = conv->messages[i].role;
        field_name(&orig[i], orig[i].index == SIZE_MAX ? NULL : "role", f, sizeof f);
        if (strcmp(r, "system") == 0) {
            if (i > 0) return BAD(c, "field '%s': a system turn may only come first", f);
            continue;
        }
        if (!prev && strcmp(r, "user") != 0)
            return BAD(c,
                       "field '%s': the conversation starts with the assistant; the first turn (after an optional "
                       "system turn) must be the user's",
                       f);
        if (prev && strcmp(prev, r) == 0) {
            field_name(&orig[i - 1], NULL, g, sizeof g);
            return BAD(c, "field '%s': two %s turns in a row (after %s); user and assistant turns must alternate", f, r,
                       g);
        }
        prev = r;
    }
    if (strcmp(prev, "assistant") != 0) {
        field_name(&orig[conv->n_messages - 1], NULL, f, sizeof f);
        return BAD(c, "field '%s': the conversation ends with a user turn; the last turn must be the assistant's", f);
    }
    return CAI_OK;
}

static cai_status prompt_completion(const pctx *c, const json_t *root, int strict, cai_chat_conversation *conv,
                                    origin **orig) {
    json_t *p = json_object_get(root, "prompt"), *q = json_object_get(root, "completion");
    if (!p) return BAD(c, "field 'prompt': absent (a 'completion' needs its 'prompt')");
    if (!q) return BAD(c, "field 'completion': absent (a 'prompt' needs its 'completion')");
    if (json_is_string(p)) {
        CAI_CALL(content_text(c, p, "prompt"));
        CAI_CALL(
            push(c, conv, orig, "user", json_string_value(p), json_string_length(p), (origin){"prompt", SIZE_MAX}));
    } else if (json_is_array(p)) {
        CAI_CALL(parse_messages(c, p, "prompt", strict, conv, orig));
    } else {
        return BAD(c, "field 'prompt': must be a string or an array of messages, not %s", cai_json_kind(p));
    }
    const int before = conv->n_messages;
    if (json_is_string(q)) {
        CAI_CALL(content_text(c, q, "completion"));
        CAI_CALL(push(c, conv, orig, "assistant", json_string_value(q), json_string_length(q),
                      (origin){"completion", SIZE_MAX}));
    } else if (json_is_array(q)) {
        CAI_CALL(parse_messages(c, q, "completion", strict, conv, orig));
    } else {
        return BAD(c, "field 'completion': must be a string or an array of messages, not %s", cai_json_kind(q));
    }
    for (int i = before; i < conv->n_messages; i++)
        if (strcmp(conv->messages[i].role, "assistant") != 0) {
            char f[160];
            field_name(&(*orig)[i], "role", f, sizeof f);
            return BAD(c, "field '%s': a completion holds assistant turns only, not %s", f, conv->messages[i].role);
        }
    return CAI_OK;
}

static cai_status parse_root(const pctx *c, const json_t *root, int strict, cai_chat_conversation *conv,
                             origin **orig) {
    static const char *const known[] = {"messages", "conversations", "prompt", "completion", NULL};
    if (!json_is_object(root))
        return BAD(c, "a line must be a JSON object with \"messages\" (or \"prompt\" and \"completion\"), not %s",
                   cai_json_kind(root));
    const char *bad = strict ? unknown_key(root, known) : NULL;
    if (bad) return BAD(c, "unknown key '%s' (known: messages, conversations, prompt, completion)", bad);
    json_t *m = json_object_get(root, "messages"), *s = json_object_get(root, "conversations");
    const int pc = json_object_get(root, "prompt") || json_object_get(root, "completion");
    if (m && s) return BAD(c, "fields 'messages' and 'conversations': give one of them");
    if ((m || s) && pc)
        return BAD(c, "field '%s' beside 'prompt'/'completion': give either the messages or the prompt and completion",
                   m ? "messages" : "conversations");
    if (pc) {
        CAI_CALL(prompt_completion(c, root, strict, conv, orig));
        return check_order(c, conv, *orig, "prompt");
    }
    if (!m && !s)
        return BAD(c, "no \"messages\" (or \"conversations\", or \"prompt\" and \"completion\") in this line");
    const char *name = m ? "messages" : "conversations";
    CAI_CALL(parse_messages(c, m ? m : s, name, strict, conv, orig));
    return check_order(c, conv, *orig, name);
}

cai_status cai_chat_parse_line(const char *file, int64_t line, const char *text, size_t len, int strict_keys,
                               cai_chat_conversation *out) {
    CAI_CHECK_ARG(out && (text || len == 0), "cai_chat_parse_line: no line or no output");
    memset(out, 0, sizeof *out);
    const pctx c = {file ? file : "(input)", line};
    size_t k = 0;
    while (k < len && is_space(text[k])) k++;
    if (k == len) return BAD(&c, "empty line (one JSON object per line is expected)");
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) return BAD(&c, "not valid JSON: %s (column %d)", jerr.text, jerr.column);
    origin *orig = NULL;
    cai_status st = parse_root(&c, root, strict_keys, out, &orig);
    free(orig);
    json_decref(root);
    if (st != CAI_OK) cai_chat_conversation_free(out);
    return st;
}

/* ------------------------------------------------------------ tokens and loss masks */

void cai_sft_tokens_free(cai_sft_tokens *t) {
    if (!t) return;
    free(t->ids);
    free(t->mask);
    memset(t, 0, sizeof *t);
}

static cai_status tokens_append(cai_sft_tokens *t, const int32_t *ids, size_t n, uint8_t mask) {
    if (t->len + n > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n) cap *= 2;
        int32_t *i = realloc(t->ids, cap * sizeof *i);
        if (i) t->ids = i;
        uint8_t *m = realloc(t->mask, cap);
        if (m) t->mask = m;
        if (!i || !m) return CAI_ERROR(CAI_ERR_NOMEM, "sft tokens: %zu", cap);
        t->cap = cap;
    }
    memcpy(t->ids + t->len, ids, n * sizeof *ids);
    memset(t->mask + t->len, mask, n);
    t->len += n;
    return CAI_OK;
}

typedef struct {
    cai_bpe_t *tok;
    cai_token_buf ids;
    cai_byte_buf context; /* rendered text waiting to be encoded as one piece */
    cai_sft_tokens *out;
} encoder;

/* Encode text as one piece: special tokens recognised (template pieces and
 * context, as colossal-infer encodes a prompt) or not (learned content). */
static cai_status piece(encoder *e, const char *text, size_t len, int special, uint8_t mask) {
    if (len == 0) return CAI_OK;
    e->ids.len = 0;
    if (!e->tok) CAI_CALL(cai_byte_tokenize(NULL, text, len, &e->ids));
    else if (special) CAI_CALL(cai_bpe_encode(e->tok, text, len, &e->ids));
    else CAI_CALL(cai_bpe_encode_ordinary(e->tok, text, len, &e->ids));
    return tokens_append(e->out, e->ids.ids, e->ids.len, mask);
}

static cai_status flush_context(encoder *e) {
    cai_status st = piece(e, e->context.data, e->context.len, 1, 0);
    e->context.len = 0;
    return st;
}

static cai_status encode_assistant(encoder *e, const cai_chat_template_t *t, const char *gen, const char *content,
                                   size_t len, cai_byte_buf *scratch) {
    const int r = ROLE_ASSISTANT;
    scratch->len = 0;
    CAI_CALL(put_piece(scratch, t->prefix[r], "assistant"));
    const size_t g = strlen(gen); /* check_generation: the prefix starts with it */
    CAI_CALL(buf_put(&e->context, gen, g));
    CAI_CALL(flush_context(e));
    /* the rest of the prefix and the content are what the model writes */
    CAI_CALL(buf_put(scratch, content, len));
    CAI_CALL(piece(e, scratch->data + g, scratch->len - g, 0, 1));
    scratch->len = 0;
    CAI_CALL(put_piece(scratch, t->end[r], "assistant"));
    CAI_CALL(piece(e, scratch->data, scratch->len, 1, 1));
    return put_piece(&e->context, t->suffix[r], "assistant");
}

cai_status cai_sft_encode(const cai_chat_template_t *t, cai_bpe_t *tok, const cai_chat_message *msgs, int n,
                          cai_sft_tokens *out) {
    CAI_CHECK_ARG(t && out, "cai_sft_encode: no template or no output");
    CAI_CALL(check_messages(msgs, n, "cai_sft_encode"));
    out->len = 0;
    encoder e = {tok, {0}, {0}, out};
    cai_byte_buf gen_buf = {0}, scratch = {0};
    const char *gen = generation_prompt(t, &gen_buf);
    cai_status st = gen ? buf_put(&e.context, t->bos, strlen(t->bos)) : CAI_ERROR(CAI_ERR_NOMEM, "generation prompt");
    for (int i = 0; i < n && st == CAI_OK; i++) {
        const int r = role_index(msgs[i].role);
        const char *s;
        size_t len;
        content_span(t, msgs[i].content, &s, &len);
        if (r == ROLE_ASSISTANT) {
            st = encode_assistant(&e, t, gen, s, len, &scratch);
            continue;
        }
        st = put_piece(&e.context, t->prefix[r], msgs[i].role);
        if (st == CAI_OK) st = buf_put(&e.context, s, len);
        if (st == CAI_OK) st = put_piece(&e.context, t->end[r], msgs[i].role);
        if (st == CAI_OK) st = put_piece(&e.context, t->suffix[r], msgs[i].role);
    }
    if (st == CAI_OK) st = flush_context(&e);
    cai_token_buf_free(&e.ids);
    cai_byte_buf_free(&e.context);
    cai_byte_buf_free(&gen_buf);
    cai_byte_buf_free(&scratch);
    return st;
}
