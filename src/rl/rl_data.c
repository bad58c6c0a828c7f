/* Preference pairs and prompts for alignment, and the embedded examples of
 * both. Lines are read with the chat layer's conventions (roles, error
 * messages naming file, line and field), but a context here ends with the
 * user's turn where a fine-tuning conversation ends with the assistant's,
 * so the message arrays are checked here. Tokens come from the chat layer:
 * cai_sft_encode for pairs (masks on the responses), and for prompts the
 * rendering and encoding colossal-infer applies to a chat request, so a
 * rollout starts from the prompt a served model would see. */
#include "cai_config.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/rl.h"

typedef struct {
    const char *file;
    int64_t line;
} lctx;

#define BAD(c, ...) cai_error_line((c)->file, (c)->line, __FILE__, __LINE__, __func__, __VA_ARGS__)

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }

static void free_messages(cai_chat_message *m, int n) {
    for (int i = 0; i < n; i++) {
        free(m[i].role);
        free(m[i].content);
    }
    free(m);
}

/* A list of messages being read, with each one's field name for errors. */
typedef struct {
    cai_chat_message *m;
    int n;
    char (*field)[96];
} msg_list;

static void list_free(msg_list *l) {
    free_messages(l->m, l->n);
    free(l->field);
    memset(l, 0, sizeof *l);
}

static cai_status list_push(const lctx *c, msg_list *l, const char *role, const char *text, size_t len,
                            const char *field) {
    cai_chat_message *m = realloc(l->m, (size_t)(l->n + 1) * sizeof *m);
    if (m) l->m = m;
    char(*f)[96] = realloc(l->field, (size_t)(l->n + 1) * sizeof *f);
    if (f) l->field = f;
    char *r = strdup(role), *s = malloc(len + 1);
    if (!m || !f || !r || !s) {
        free(r);
        free(s);
        return cai_error_set(CAI_ERR_NOMEM, __FILE__, __LINE__, __func__, "%s:%lld: %zu bytes of a message", c->file,
                             (long long)c->line, len);
    }
    memcpy(s, text, len);
    s[len] = '\0';
    l->m[l->n] = (cai_chat_message){r, s};
    snprintf(l->field[l->n++], sizeof *f, "%s", field);
    return CAI_OK;
}

static cai_status content_ok(const lctx *c, const json_t *v, const char *field) {
    if (!v) return BAD(c, "field '%s': missing", field);
    if (!json_is_string(v)) return BAD(c, "field '%s': must be a string, not %s", field, cai_json_kind(v));
    const char *s = json_string_value(v);
    const size_t n = json_string_length(v);
    if (n == 0) return BAD(c, "field '%s': must not be empty", field);
    if (strlen(s) != n) return BAD(c, "field '%s': must not contain NUL", field);
    size_t k = 0;
    while (k < n && is_space(s[k])) k++;
    if (k == n) return BAD(c, "field '%s': is only whitespace", field);
    return CAI_OK;
}

static const char *normal_role(const char *s) {
    static const char *const map[][2] = {
        {"system", "system"}, {"user", "user"}, {"human", "user"}, {"assistant", "assistant"}, {"gpt", "assistant"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(s, map[i][0]) == 0) return map[i][1];
    return NULL;
}

/* v: a string (one turn of `string_role`) or an array of messages. */
static cai_status read_messages(const lctx *c, const json_t *v, const char *name, const char *string_role,
                                msg_list *out) {
    if (!v) return BAD(c, "field '%s': missing", name);
    if (json_is_string(v)) {
        CAI_CALL(content_ok(c, v, name));
        return list_push(c, out, string_role, json_string_value(v), json_string_length(v), name);
    }
    if (!json_is_array(v))
        return BAD(c, "field '%s': must be a string or an array of {\"role\", \"content\"} objects, not %s", name,
                   cai_json_kind(v));
    const size_t n = json_array_size(v);
    if (n == 0) return BAD(c, "field '%s': must not be empty", name);
    if (n > INT_MAX / 4) return BAD(c, "field '%s': %zu messages are too many", name, n);
    for (size_t i = 0; i < n; i++) {
        char f[96], g[112];
        snprintf(f, sizeof f, "%s[%zu]", name, i);
        const json_t *msg = json_array_get(v, i);
        if (!json_is_object(msg))
            return BAD(c, "field '%s': must be an object {\"role\", \"content\"}, not %s", f, cai_json_kind(msg));
        json_t *role = json_object_get(msg, "role"), *from = json_object_get(msg, "from");
        json_t *content = json_object_get(msg, "content"), *value = json_object_get(msg, "value");
        if (role && from) return BAD(c, "field '%s': has both 'role' and 'from'; give one", f);
        if (content && value) return BAD(c, "field '%s': has both 'content' and 'value'; give one", f);
        const char *allowed = from ? "system|human|assistant|gpt" : "system|user|assistant";
        json_t *rv = from ? from : role;
        snprintf(g, sizeof g, "%s.%s", f, from ? "from" : "role");
        if (!rv) return BAD(c, "field '%s': missing (one of %s)", g, allowed);
        if (!json_is_string(rv))
            return BAD(c, "field '%s': must be a string (%s), not %s", g, allowed, cai_json_kind(rv));
        const char *r = normal_role(json_string_value(rv));
        if (!r) return BAD(c, "field '%s': '%.64s' is not one of %s", g, json_string_value(rv), allowed);
        snprintf(g, sizeof g, "%s.%s", f, value ? "value" : "content");
        json_t *cv = value ? value : content;
        CAI_CALL(content_ok(c, cv, g));
        CAI_CALL(list_push(c, out, r, json_string_value(cv), json_string_length(cv), f));
    }
    return CAI_OK;
}

/* What a prompt must be: an optional system turn, then user and assistant
 * alternating from the user's turn to a last user turn. */
static cai_status check_context(const lctx *c, const msg_list *l, const char *name) {
    int users = 0;
    for (int i = 0; i < l->n; i++) users += strcmp(l->m[i].role, "user") == 0;
    if (users == 0) return BAD(c, "field '%s': no user turn, so nothing to answer", name);
    const char *prev = NULL;
    for (int i = 0; i < l->n; i++) {
        const char *r = l->m[i].role;
        if (strcmp(r, "system") == 0) {
            if (i > 0) return BAD(c, "field '%s': a system turn may only come first", l->field[i]);
            continue;
        }
        if (!prev && strcmp(r, "user") != 0)
            return BAD(c,
                       "field '%s': starts with the assistant; the first turn (after an optional system turn) "
                       "must be the user's",
                       l->field[i]);
        if (prev && strcmp(prev, r) == 0)
            return BAD(c, "field '%s': two %s turns in a row; user and assistant turns must alternate", l->field[i], r);
        prev = r;
    }
    if (strcmp(prev, "user") != 0)
        return BAD(c,
                   "field '%s': ends with an assistant turn; the last turn must be the user's (the responses "
                   "answer it)",
                   l->field[l->n - 1]);
    return CAI_OK;
}

static cai_status check_responses(const lctx *c, const msg_list *l) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->m[i].role, "assistant") != 0)
            return BAD(c, "field '%s': a response holds assistant turns only, not a %s turn", l->field[i],
                       l->m[i].role);
    return CAI_OK;
}

static cai_status load_line(const lctx *c, const char *text, size_t len, json_t **root) {
    json_error_t jerr;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!*root) return BAD(c, "not valid JSON: %s (column %d)", jerr.text, jerr.column);
    if (!json_is_object(*root)) {
        const char *kind = cai_json_kind(*root);
        json_decref(*root);
        *root = NULL;
        return BAD(c, "a line must be a JSON object, not %s", kind);
    }
    return CAI_OK;
}

static void take(msg_list *l, cai_chat_message **m, int *n) {
    *m = l->m;
    *n = l->n;
    free(l->field);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------ preference pairs */

void cai_rl_pref_free(cai_rl_pref *p) {
    if (!p) return;
    free_messages(p->context, p->n_context);
    free_messages(p->chosen, p->n_chosen);
    free_messages(p->rejected, p->n_rejected);
    memset(p, 0, sizeof *p);
}

static cai_status pref_root(const lctx *c, const json_t *root, msg_list l[3]) {
    json_t *ctx = json_object_get(root, "context"), *prompt = json_object_get(root, "prompt");
    if (ctx && prompt) return BAD(c, "fields 'context' and 'prompt': give one of them");
    if (!ctx && !prompt)
        return BAD(c,
                   "field 'context': missing (a pair needs \"context\" or \"prompt\", \"chosen\" and "
                   "\"rejected\")");
    const char *cname = ctx ? "context" : "prompt";
    CAI_CALL(read_messages(c, ctx ? ctx : prompt, cname, "user", &l[0]));
    CAI_CALL(check_context(c, &l[0], cname));
    static const char *const sides[] = {"chosen", "rejected"};
    for (int s = 0; s < 2; s++) {
        CAI_CALL(read_messages(c, json_object_get(root, sides[s]), sides[s], "assistant", &l[1 + s]));
        CAI_CALL(check_responses(c, &l[1 + s]));
    }
    return CAI_OK;
}

cai_status cai_rl_pref_parse_line(const char *file, int64_t line, const char *text, size_t len, cai_rl_pref *out) {
    CAI_CHECK_ARG(out && (text || len == 0), "cai_rl_pref_parse_line: no line or no output");
    memset(out, 0, sizeof *out);
    const lctx c = {file ? file : "(input)", line};
    json_t *root;
    CAI_CALL(load_line(&c, text, len, &root));
    msg_list l[3] = {{0}};
    cai_status st = pref_root(&c, root, l);
    json_decref(root);
    if (st == CAI_OK) {
        take(&l[0], &out->context, &out->n_context);
        take(&l[1], &out->chosen, &out->n_chosen);
        take(&l[2], &out->rejected, &out->n_rejected);
    }
    for (int k = 0; k < 3; k++) list_free(&l[k]);
    return st;
}

static cai_status encode_side(const cai_chat_template_t *t, cai_bpe_t *tok, const cai_rl_pref *p,
                              const cai_chat_message *side, int n_side, cai_sft_tokens *out) {
    const int n = p->n_context + n_side;
    cai_chat_message *all = malloc((size_t)n * sizeof *all);
    if (!all) return CAI_ERROR(CAI_ERR_NOMEM, "a pair of %d messages", n);
    memcpy(all, p->context, (size_t)p->n_context * sizeof *all);
    memcpy(all + p->n_context, side, (size_t)n_side * sizeof *all);
    cai_status st = cai_sft_encode(t, tok, all, n, out);
    free(all);
    return st;
}

cai_status cai_rl_pref_encode(const cai_chat_template_t *t, cai_bpe_t *tok, const cai_rl_pref *p,
                              cai_sft_tokens *chosen, cai_sft_tokens *rejected) {
    CAI_CHECK_ARG(t && p && chosen && rejected && p->n_context > 0 && p->n_chosen > 0 && p->n_rejected > 0,
                  "cai_rl_pref_encode: no template, pair or output");
    CAI_CALL(encode_side(t, tok, p, p->chosen, p->n_chosen, chosen));
    return encode_side(t, tok, p, p->rejected, p->n_rejected, rejected);
}

cai_sft_fit_result cai_rl_pref_fit(cai_sft_tokens *chosen, cai_sft_tokens *rejected, int64_t seq_len,
                                   cai_sft_overflow policy) {
    /* drop decides on both sides before either is cut */
    if (policy == CAI_SFT_DROP && seq_len > 0 &&
        (chosen->len > (size_t)seq_len + 1 || rejected->len > (size_t)seq_len + 1))
        return CAI_SFT_DROPPED;
    const cai_sft_fit_result a = cai_sft_fit(chosen, seq_len, policy), b = cai_sft_fit(rejected, seq_len, policy);
    if (a == CAI_SFT_DROPPED || b == CAI_SFT_DROPPED) return CAI_SFT_DROPPED;
    return a == CAI_SFT_TRUNCATED || b == CAI_SFT_TRUNCATED ? CAI_SFT_TRUNCATED : CAI_SFT_KEPT;
}

/* ------------------------------------------------------------ reading files */

/* Calls fn on each non-blank line of path with its 1-based number. */
typedef cai_status (*line_fn)(void *ctx, const lctx *c, const char *text, size_t len);

static cai_status each_line(const char *path, line_fn fn, void *ctx) {
    FILE *f = fopen(path, "rb");
    if (!f) return CAI_ERROR(CAI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    cai_status st = CAI_OK;
    lctx c = {path, 0};
    while (st == CAI_OK && (n = getline(&buf, &cap, f)) >= 0) {
        c.line++;
        size_t k = 0;
        while (k < (size_t)n && is_space(buf[k])) k++;
        if (k == (size_t)n) continue;
        st = fn(ctx, &c, buf, (size_t)n);
    }
    if (st == CAI_OK && ferror(f))
        st = CAI_ERROR(CAI_ERR_IO, "%s: read failed after line %lld", path, (long long)c.line);
    free(buf);
    fclose(f);
    return st;
}

/* A failure in the chat layer's encoding, given the line's place. */
static cai_status at_line(cai_status st, const lctx *c) {
    if (st == CAI_OK) return st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cai_error_message());
    return CAI_ERROR(st, "%s:%lld: %s", c->file, (long long)c->line, msg);
}

struct cai_rl_pref_set {
    cai_sft_tokens *chosen, *rejected;
    int64_t n, cap;
    cai_rl_data_stats stats;
};

typedef struct {
    cai_rl_pref_set_t *set;
    const cai_chat_template_t *t;
    cai_bpe_t *tok;
    int64_t seq_len;
    cai_sft_overflow overflow;
} pref_load;

static cai_status pref_line(void *ctx, const lctx *c, const char *text, size_t len) {
    pref_load *p = ctx;
    cai_rl_pref_set_t *s = p->set;
    if (s->n == s->cap) {
        const int64_t cap = s->cap ? 2 * s->cap : 64;
        cai_sft_tokens *a = realloc(s->chosen, (size_t)cap * sizeof *a);
        if (a) s->chosen = a;
        cai_sft_tokens *b = realloc(s->rejected, (size_t)cap * sizeof *b);
        if (b) s->rejected = b;
        if (!a || !b) return CAI_ERROR(CAI_ERR_NOMEM, "%s: %lld pairs", c->file, (long long)cap);
        memset(s->chosen + s->cap, 0, (size_t)(cap - s->cap) * sizeof *a);
        memset(s->rejected + s->cap, 0, (size_t)(cap - s->cap) * sizeof *b);
        s->cap = cap;
    }
    cai_rl_pref pair;
    CAI_CALL(cai_rl_pref_parse_line(c->file, c->line, text, len, &pair));
    s->stats.lines++;
    cai_sft_tokens *ch = &s->chosen[s->n], *rj = &s->rejected[s->n];
    cai_status st = at_line(cai_rl_pref_encode(p->t, p->tok, &pair, ch, rj), c);
    cai_rl_pref_free(&pair);
    CAI_CALL(st);
    const cai_sft_fit_result fit = cai_rl_pref_fit(ch, rj, p->seq_len, p->overflow);
    if (fit == CAI_SFT_DROPPED) {
        s->stats.dropped++;
        return CAI_OK; /* the slot's buffers are reused by the next pair */
    }
    s->stats.truncated += fit == CAI_SFT_TRUNCATED;
    s->stats.kept++;
    s->n++;
    return CAI_OK;
}

cai_status cai_rl_pref_set_load(const char *path, const cai_chat_template_t *t, cai_bpe_t *tok, int64_t seq_len,
                                cai_sft_overflow overflow, cai_rl_pref_set_t **out) {
    CAI_CHECK_ARG(path && t && out, "cai_rl_pref_set_load: no path, template or output");
    CAI_CHECK_ARG(overflow >= 0 && overflow < CAI_SFT_OVERFLOW_COUNT, "cai_rl_pref_set_load: overflow policy %d",
                  (int)overflow);
    *out = NULL;
    cai_rl_pref_set_t *s = calloc(1, sizeof *s);
    if (!s) return CAI_ERROR(CAI_ERR_NOMEM, "preference set");
    pref_load p = {s, t, tok, seq_len, overflow};
    cai_status st = each_line(path, pref_line, &p);
    if (st != CAI_OK) {
        cai_rl_pref_set_free(s);
        return st;
    }
    *out = s;
    return CAI_OK;
}

int64_t cai_rl_pref_set_size(const cai_rl_pref_set_t *s) { return s ? s->n : 0; }

cai_status cai_rl_pref_set_pair(const cai_rl_pref_set_t *s, int64_t i, const cai_sft_tokens **chosen,
                                const cai_sft_tokens **rejected) {
    CAI_CHECK_ARG(s && i >= 0 && i < s->n, "cai_rl_pref_set_pair: pair %lld of %lld", (long long)i,
                  (long long)(s ? s->n : 0));
    if (chosen) *chosen = &s->chosen[i];
    if (rejected) *rejected = &s->rejected[i];
    return CAI_OK;
}

void cai_rl_pref_set_stats(const cai_rl_pref_set_t *s, cai_rl_data_stats *out) {
    if (!out) return;
    if (s) *out = s->stats;
    else memset(out, 0, sizeof *out);
}

void cai_rl_pref_set_free(cai_rl_pref_set_t *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->cap; i++) {
        cai_sft_tokens_free(&s->chosen[i]);
        cai_sft_tokens_free(&s->rejected[i]);
    }
    free(s->chosen);
    free(s->rejected);
    free(s);
}

/* ------------------------------------------------------------ prompts */

void cai_rl_prompt_free(cai_rl_prompt *p) {
    if (!p) return;
    free_messages(p->messages, p->n_messages);
    free(p->answer);
    memset(p, 0, sizeof *p);
}

static cai_status answer_text(const lctx *c, const json_t *v, char **out) {
    *out = NULL;
    if (!v || json_is_null(v)) return CAI_OK;
    char num[64];
    const char *s = num;
    size_t n;
    if (json_is_string(v)) {
        s = json_string_value(v);
        n = json_string_length(v);
        if (strlen(s) != n) return BAD(c, "field 'answer': must not contain NUL");
    } else if (json_is_integer(v)) {
        n = (size_t)snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        n = (size_t)snprintf(num, sizeof num, "%.15g", json_real_value(v));
    } else {
        return BAD(c, "field 'answer': must be a string or a number, not %s", cai_json_kind(v));
    }
    *out = strdup(s);
    if (!*out) return CAI_ERROR(CAI_ERR_NOMEM, "%s:%lld: answer of %zu bytes", c->file, (long long)c->line, n);
    return CAI_OK;
}

cai_status cai_rl_prompt_parse_line(const char *file, int64_t line, const char *text, size_t len, cai_rl_prompt *out) {
    CAI_CHECK_ARG(out && (text || len == 0), "cai_rl_prompt_parse_line: no line or no output");
    memset(out, 0, sizeof *out);
    const lctx c = {file ? file : "(input)", line};
    json_t *root;
    CAI_CALL(load_line(&c, text, len, &root));
    msg_list l = {0};
    json_t *m = json_object_get(root, "messages"), *p = json_object_get(root, "prompt");
    cai_status st = CAI_OK;
    if (m && p) st = BAD(&c, "fields 'messages' and 'prompt': give one of them");
    else if (!m && !p) st = BAD(&c, "field 'messages': missing (a prompt line needs \"messages\" or \"prompt\")");
    const char *name = m ? "messages" : "prompt";
    if (st == CAI_OK) st = read_messages(&c, m ? m : p, name, "user", &l);
    if (st == CAI_OK) st = check_context(&c, &l, name);
    if (st == CAI_OK) st = answer_text(&c, json_object_get(root, "answer"), &out->answer);
    json_decref(root);
    if (st == CAI_OK) take(&l, &out->messages, &out->n_messages);
    list_free(&l);
    if (st != CAI_OK) cai_rl_prompt_free(out);
    return st;
}

cai_status cai_rl_prompt_encode(const cai_chat_template_t *t, cai_bpe_t *tok, const cai_chat_message *msgs, int n,
                                cai_byte_buf *text, cai_token_buf *ids) {
    CAI_CHECK_ARG(t && text && ids, "cai_rl_prompt_encode: no template or no output");
    const size_t start = text->len;
    CAI_CALL(cai_chat_template_render(t, msgs, n, 1, text));
    /* colossal-infer: prompts may spell special tokens (templates do) */
    if (tok) return cai_bpe_encode(tok, text->data + start, text->len - start, ids);
    return cai_byte_tokenize(NULL, text->data + start, text->len - start, ids);
}

typedef struct {
    int32_t *ids;
    int64_t n;
    char *text, *answer;
} prompt_item;

struct cai_rl_prompt_set {
    prompt_item *items;
    int64_t n, cap;
    cai_rl_data_stats stats;
};

typedef struct {
    cai_rl_prompt_set_t *set;
    const cai_chat_template_t *t;
    cai_bpe_t *tok;
    int64_t max_len;
    cai_byte_buf text;
    cai_token_buf ids;
} prompt_load;

static cai_status prompt_line(void *ctx, const lctx *c, const char *text, size_t len) {
    prompt_load *p = ctx;
    cai_rl_prompt_set_t *s = p->set;
    cai_rl_prompt pr;
    CAI_CALL(cai_rl_prompt_parse_line(c->file, c->line, text, len, &pr));
    s->stats.lines++;
    p->text.len = 0;
    p->ids.len = 0;
    cai_status st = at_line(cai_rl_prompt_encode(p->t, p->tok, pr.messages, pr.n_messages, &p->text, &p->ids), c);
    if (st != CAI_OK || (p->max_len > 0 && (int64_t)p->ids.len > p->max_len)) {
        s->stats.dropped += st == CAI_OK;
        cai_rl_prompt_free(&pr);
        return st;
    }
    if (s->n == s->cap) {
        const int64_t cap = s->cap ? 2 * s->cap : 64;
        prompt_item *it = realloc(s->items, (size_t)cap * sizeof *it);
        if (!it) {
            cai_rl_prompt_free(&pr);
            return CAI_ERROR(CAI_ERR_NOMEM, "%s: %lld prompts", c->file, (long long)cap);
        }
        s->items = it;
        s->cap = cap;
    }
    prompt_item *it = &s->items[s->n];
    it->n = (int64_t)p->ids.len;
    it->ids = malloc((p->ids.len ? p->ids.len : 1) * sizeof *it->ids);
    it->text = strdup(p->text.data ? p->text.data : "");
    it->answer = pr.answer;
    pr.answer = NULL;
    cai_rl_prompt_free(&pr);
    s->n++; /* freed with the set whatever happens next */
    if (!it->ids || !it->text) return CAI_ERROR(CAI_ERR_NOMEM, "%s:%lld: a prompt", c->file, (long long)c->line);
    memcpy(it->ids, p->ids.ids, p->ids.len * sizeof *it->ids);
    s->stats.kept++;
    return CAI_OK;
}

cai_status cai_rl_prompt_set_load(const char *path, const cai_chat_template_t *t, cai_bpe_t *tok,
                                  int64_t max_prompt_len, cai_rl_prompt_set_t **out) {
    CAI_CHECK_ARG(path && t && out, "cai_rl_prompt_set_load: no path, template or output");
    *out = NULL;
    cai_rl_prompt_set_t *s = calloc(1, sizeof *s);
    if (!s) return CAI_ERROR(CAI_ERR_NOMEM, "prompt set");
    prompt_load p = {s, t, tok, max_prompt_len, {0}, {0}};
    cai_status st = each_line(path, prompt_line, &p);
    cai_byte_buf_free(&p.text);
    cai_token_buf_free(&p.ids);
    if (st != CAI_OK) {
        cai_rl_prompt_set_free(s);
        return st;
    }
    *out = s;
    return CAI_OK;
}

int64_t cai_rl_prompt_set_size(const cai_rl_prompt_set_t *s) { return s ? s->n : 0; }

cai_status cai_rl_prompt_set_get(const cai_rl_prompt_set_t *s, int64_t i, const int32_t **ids, int64_t *n,
                                 const char **text, const char **answer) {
    CAI_CHECK_ARG(s && i >= 0 && i < s->n, "cai_rl_prompt_set_get: prompt %lld of %lld", (long long)i,
                  (long long)(s ? s->n : 0));
    const prompt_item *it = &s->items[i];
    if (ids) *ids = it->ids;
    if (n) *n = it->n;
    if (text) *text = it->text;
    if (answer) *answer = it->answer;
    return CAI_OK;
}

void cai_rl_prompt_set_stats(const cai_rl_prompt_set_t *s, cai_rl_data_stats *out) {
    if (!out) return;
    if (s) *out = s->stats;
    else memset(out, 0, sizeof *out);
}

void cai_rl_prompt_set_free(cai_rl_prompt_set_t *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->n; i++) {
        free(s->items[i].ids);
        free(s->items[i].text);
        free(s->items[i].answer);
    }
    free(s->items);
    free(s);
}

/* ------------------------------------------------------------ embedded examples */

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static cai_status put_json(FILE *f, const char *path, json_t *o) {
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    cai_status st = CAI_OK;
    if (!line) st = CAI_ERROR(CAI_ERR_NOMEM, "%s: a line as JSON", path);
    else if (fprintf(f, "%s\n", line) < 0) st = CAI_ERROR(CAI_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    free(line);
    json_decref(o);
    return st;
}

static json_t *turn(const char *role, const char *content) {
    return json_pack("[{s:s,s:s}]", "role", role, "content", content);
}

/* The rejected answer of pair i: a wrong number in the right form, or
 * (one in five) the right number in a wrong form, so a preference teaches
 * both the value and the format. */
static void rejected_answer(uint64_t seed, int64_t i, long long n, char *buf, size_t cap) {
    const uint64_t h = mix64(mix64(seed ^ 0x524c2d5052454653ull /* "RL-PREFS" */) ^ (uint64_t)i);
    if (h % 5 == 0) {
        static const char *const forms[] = {"%lld", "%lld.", "The answer is %lld", "the answer is %lld."};
        snprintf(buf, cap, forms[(h >> 8) % 4], n);
        return;
    }
    long long d = 1 + (long long)((h >> 16) % 10);
    if ((h >> 32) & 1) d = -d;
    if (n + d < 0) d = -d; /* the questions' answers are never negative */
    snprintf(buf, cap, "The answer is %lld.", n + d);
}

typedef enum { EX_PROMPTS, EX_PREFS } ex_kind;

/* Held-out lines are those of the held-out conversations, as the SFT split
 * makes them; training lines are the other conversations' less any whose
 * question is a held-out one, as cai_sft_example_write leaves them out, so
 * a held-out score is on unseen questions. */
static cai_status example_write(ex_kind kind, const cai_sft_example_config *cfg, const char *train_path,
                                const char *held_path, int64_t *n_train, int64_t *n_held) {
    CAI_CHECK_ARG(cfg && cfg->n >= 0, "rl example: bad arguments");
    cai_sft_question_set hq;
    CAI_CALL(cai_sft_example_held_questions(cfg, &hq));
    cai_out_file files[2] = {{0}};
    int64_t counts[2] = {0, 0};
    cai_status st = cai_out_file_open(&files[0], train_path);
    if (st == CAI_OK) st = cai_out_file_open(&files[1], held_path);
    for (int64_t i = 0; i < cfg->n && st == CAI_OK; i++) {
        cai_chat_conversation c;
        int held = 0;
        st = cai_sft_example_conversation(cfg, i, &c, &held);
        if (st != CAI_OK) break;
        const char *q;
        long long n;
        if (cai_sft_example_arithmetic(&c, &q, &n) && (held || !cai_sft_question_set_has(&hq, q))) {
            counts[held]++;
            char num[32], right[64], wrong[64];
            snprintf(num, sizeof num, "%lld", n);
            snprintf(right, sizeof right, "The answer is %lld.", n);
            json_t *o;
            if (kind == EX_PROMPTS) {
                o = json_pack("{s:o,s:s}", "messages", turn("user", q), "answer", num);
            } else {
                rejected_answer(cfg->seed, i, n, wrong, sizeof wrong);
                o = json_pack("{s:o,s:o,s:o}", "context", turn("user", q), "chosen", turn("assistant", right),
                              "rejected", turn("assistant", wrong));
            }
            if (files[held].f) st = put_json(files[held].f, files[held].tmp, o);
            else json_decref(o);
        }
        cai_chat_conversation_free(&c);
    }
    st = cai_out_file_close(&files[0], st);
    st = cai_out_file_close(&files[1], st);
    cai_sft_question_set_free(&hq);
    if (n_train) *n_train = counts[0];
    if (n_held) *n_held = counts[1];
    return st;
}

cai_status cai_rl_example_prompts_write(const cai_sft_example_config *cfg, const char *train_path,
                                        const char *held_path, int64_t *n_train, int64_t *n_held) {
    return example_write(EX_PROMPTS, cfg, train_path, held_path, n_train, n_held);
}

cai_status cai_rl_example_prefs_write(const cai_sft_example_config *cfg, const char *train_path, const char *held_path,
                                      int64_t *n_train, int64_t *n_held) {
    return example_write(EX_PREFS, cfg, train_path, held_path, n_train, n_held);
}
