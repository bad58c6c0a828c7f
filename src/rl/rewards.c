/* Verifiable rewards: a process-wide registry of named reward functions
 * (two builtins that check the embedded instruction set's arithmetic),
 * and weighted sums of them parsed from "name[:weight],..." specs. The
 * answer extraction follows the GSM8K-style graders: the number after the
 * last "The answer is", else the last number in the text. */
#include "cai_config.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "colossal/rl.h"

/* ------------------------------------------------------------ text helpers */

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* s[0..*n) without surrounding whitespace. */
static const char *trim(const char *s, size_t *n) {
    size_t len = strlen(s);
    while (len > 0 && is_space(*s)) s++, len--;
    while (len > 0 && is_space(s[len - 1])) len--;
    *n = len;
    return s;
}

/* The number starting at s (a '-' right before a digit, digits, commas
 * between digits, a fraction), or 0 when none starts there. */
static size_t number_at(const char *s) {
    size_t k = 0;
    if (s[k] == '-' && is_digit(s[k + 1])) k++;
    if (!is_digit(s[k])) return 0;
    while (is_digit(s[k]) || (s[k] == ',' && is_digit(s[k + 1]))) k++;
    if (s[k] == '.' && is_digit(s[k + 1])) {
        k++;
        while (is_digit(s[k])) k++;
    }
    return k;
}

/* The last number in s[0..n): its start and length (0 when none). A '-'
 * after a letter or digit is an operator, not a sign. */
static size_t last_number(const char *s, size_t n, const char **at) {
    size_t found = 0;
    for (size_t i = 0; i < n;) {
        const int sign_ok = s[i] != '-' || i == 0 || !isalnum((unsigned char)s[i - 1]);
        const int starts = (i == 0 || !is_digit(s[i - 1])) && sign_ok;
        const size_t k = starts ? number_at(s + i) : 0;
        if (k > 0 && i + k <= n) {
            *at = s + i;
            found = k;
            i += k;
        } else {
            i++;
        }
    }
    return found;
}

static const char *last_phrase(const char *s, const char *phrase) {
    const size_t pn = strlen(phrase);
    const char *last = NULL;
    for (const char *p = s; *p; p++)
        if (strncasecmp(p, phrase, pn) == 0) last = p;
    return last;
}

static void copy_out(const char *s, size_t n, char *buf, size_t cap) {
    if (cap == 0) return;
    if (n >= cap) n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
}

void cai_rl_extract_answer(const char *response, char *buf, size_t cap) {
    if (!buf || cap == 0) return;
    buf[0] = '\0';
    if (!response) return;
    static const char phrase[] = "The answer is";
    const char *p = last_phrase(response, phrase);
    if (p) {
        const char *s = p + sizeof phrase - 1;
        while (is_space(*s) || *s == ':' || *s == '$' || *s == '*') s++;
        const size_t k = number_at(s);
        if (k > 0) return copy_out(s, k, buf, cap);
        /* a non-numeric answer: up to the end of its sentence or line */
        size_t n = 0;
        while (s[n] && s[n] != '\n' && !(s[n] == '.' && (s[n + 1] == '\0' || is_space(s[n + 1])))) n++;
        while (n > 0 && (is_space(s[n - 1]) || s[n - 1] == '*')) n--;
        return copy_out(s, n, buf, cap);
    }
    size_t n;
    const char *t = trim(response, &n), *at = NULL;
    const size_t k = last_number(t, n, &at);
    if (k > 0) return copy_out(at, k, buf, cap);
    if (n > 0 && t[n - 1] == '.') n--;
    copy_out(t, n, buf, cap);
}

/* s as a number after trimming, dropping commas and a trailing '.'; 0 when
 * it is not one. */
static int as_number(const char *s, double *v) {
    size_t n;
    s = trim(s, &n);
    if (n > 0 && s[n - 1] == '.') n--;
    char buf[128];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ',') continue;
        if (k + 1 >= sizeof buf) return 0;
        buf[k++] = s[i];
    }
    buf[k] = '\0';
    if (k == 0 || !(is_digit(buf[0]) || ((buf[0] == '-' || buf[0] == '+') && is_digit(buf[1])))) return 0;
    char *end;
    *v = strtod(buf, &end);
    return *end == '\0' && isfinite(*v);
}

/* ------------------------------------------------------------ builtins */

cai_status cai_rl_reward_exact_match(void *ctx, const char *prompt, const char *response, const char *answer,
                                     double *reward) {
    (void)ctx;
    CAI_CHECK_ARG(reward, "exact_match: no output");
    CAI_CHECK_ARG(answer, "exact_match: the prompt \"%.80s%s\" has no reference answer (give \"answer\" in its line)",
                  prompt ? prompt : "", prompt && strlen(prompt) > 80 ? "..." : "");
    char got[256];
    cai_rl_extract_answer(response ? response : "", got, sizeof got);
    double a, b;
    if (as_number(got, &a) && as_number(answer, &b)) {
        *reward = a == b ? 1.0 : 0.0;
        return CAI_OK;
    }
    size_t n1, n2;
    const char *s1 = trim(got, &n1), *s2 = trim(answer, &n2);
    *reward = n1 == n2 && memcmp(s1, s2, n1) == 0 ? 1.0 : 0.0;
    return CAI_OK;
}

cai_status cai_rl_reward_format(void *ctx, const char *prompt, const char *response, const char *answer,
                                double *reward) {
    (void)ctx, (void)prompt, (void)answer;
    CAI_CHECK_ARG(reward, "format: no output");
    *reward = 0;
    if (!response) return CAI_OK;
    size_t n;
    const char *s = trim(response, &n);
    static const char head[] = "The answer is ";
    const size_t h = sizeof head - 1;
    if (n < h + 2 || memcmp(s, head, h) != 0 || s[n - 1] != '.') return CAI_OK;
    size_t k = h;
    if (s[k] == '-') k++;
    const size_t digits = k;
    while (k < n - 1 && is_digit(s[k])) k++;
    *reward = k == n - 1 && k > digits ? 1.0 : 0.0;
    return CAI_OK;
}

/* ------------------------------------------------------------ registry */

enum { MAX_REGISTERED = 64, MAX_NAME = 64 };
typedef struct {
    char name[MAX_NAME];
    cai_rl_reward_fn fn;
    void *ctx;
} entry;

static entry g_reg[MAX_REGISTERED] = {
    {"exact_match", cai_rl_reward_exact_match, NULL},
    {"format", cai_rl_reward_format, NULL},
};
static int g_n = 2;

static const entry *lookup(const char *name, size_t len) {
    for (int i = 0; i < g_n; i++)
        if (strlen(g_reg[i].name) == len && memcmp(g_reg[i].name, name, len) == 0) return &g_reg[i];
    return NULL;
}

void cai_rl_reward_names(char *buf, size_t cap) {
    if (!buf || cap == 0) return;
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < g_n && at < cap; i++) {
        const int w = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", g_reg[i].name);
        if (w < 0) break;
        at += (size_t)w;
    }
}

static int valid_name(const char *s, size_t n) {
    if (n == 0 || n >= MAX_NAME) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-' || s[i] == '.')) return 0;
    return 1;
}

cai_status cai_rl_reward_register(const char *name, cai_rl_reward_fn fn, void *ctx) {
    CAI_CHECK_ARG(name && fn, "cai_rl_reward_register: no name or no function");
    CAI_CHECK_ARG(valid_name(name, strlen(name)),
                  "cai_rl_reward_register: \"%.80s\" is not a reward name (letters, digits, '_', '-', '.'; at most "
                  "%d bytes)",
                  name, MAX_NAME - 1);
    if (lookup(name, strlen(name)))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_rl_reward_register: a reward named \"%s\" is registered already",
                         name);
    if (g_n == MAX_REGISTERED)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "cai_rl_reward_register: %d rewards registered, the most there can be",
                         MAX_REGISTERED);
    snprintf(g_reg[g_n].name, MAX_NAME, "%s", name);
    g_reg[g_n].fn = fn;
    g_reg[g_n].ctx = ctx;
    g_n++;
    return CAI_OK;
}

/* ------------------------------------------------------------ specs */

void cai_rl_reward_spec_free(cai_rl_reward_spec *s) {
    if (!s) return;
    for (int i = 0; i < s->n && i < CAI_RL_MAX_REWARDS; i++) free(s->names[i]);
    memset(s, 0, sizeof *s);
}

/* One "name[:weight]" token s[0..n), already trimmed. */
static cai_status spec_token(const char *spec, const char *s, size_t n, cai_rl_reward_spec *out) {
    if (n == 0) return CAI_ERROR(CAI_ERR_CONFIG, "reward spec \"%s\": an empty entry (give name[:weight],...)", spec);
    const char *colon = memchr(s, ':', n);
    size_t nn = colon ? (size_t)(colon - s) : n;
    while (nn > 0 && is_space(s[nn - 1])) nn--;
    double w = 1.0;
    if (colon) {
        char buf[64];
        const char *ws = colon + 1;
        size_t wn = n - (size_t)(ws - s);
        while (wn > 0 && is_space(*ws)) ws++, wn--;
        if (wn == 0 || wn >= sizeof buf)
            return CAI_ERROR(CAI_ERR_CONFIG, "reward spec \"%s\": entry \"%.*s\": the weight after ':' is %s", spec,
                             (int)n, s, wn ? "too long" : "missing");
        memcpy(buf, ws, wn);
        buf[wn] = '\0';
        char *end;
        w = strtod(buf, &end);
        if (*end != '\0' || !isfinite(w))
            return CAI_ERROR(CAI_ERR_CONFIG, "reward spec \"%s\": entry \"%.*s\": weight \"%s\" is not a finite number",
                             spec, (int)n, s, buf);
    }
    if (!valid_name(s, nn))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "reward spec \"%s\": entry \"%.*s\": \"%.*s\" is not a reward name (give name[:weight])", spec,
                         (int)n, s, (int)nn, s);
    const entry *e = lookup(s, nn);
    if (!e) {
        char known[1024];
        cai_rl_reward_names(known, sizeof known);
        return CAI_ERROR(CAI_ERR_CONFIG, "reward spec \"%s\": unknown reward \"%.*s\" (known: %s)", spec, (int)nn, s,
                         known);
    }
    if (cai_rl_reward_spec_find(out, e->name) >= 0)
        return CAI_ERROR(CAI_ERR_CONFIG, "reward spec \"%s\": reward \"%s\" given twice", spec, e->name);
    if (out->n == CAI_RL_MAX_REWARDS)
        return CAI_ERROR(CAI_ERR_CONFIG, "reward spec \"%s\": more than %d rewards", spec, CAI_RL_MAX_REWARDS);
    char *name = strdup(e->name);
    if (!name) return CAI_ERROR(CAI_ERR_NOMEM, "reward name");
    out->names[out->n] = name;
    out->weights[out->n] = w;
    out->fns[out->n] = e->fn;
    out->ctxs[out->n] = e->ctx;
    out->n++;
    return CAI_OK;
}

cai_status cai_rl_reward_spec_parse(const char *spec, cai_rl_reward_spec *out) {
    CAI_CHECK_ARG(spec && out, "cai_rl_reward_spec_parse: no spec or no output");
    memset(out, 0, sizeof *out);
    cai_status st = CAI_OK;
    for (const char *p = spec; st == CAI_OK;) {
        const size_t len = strcspn(p, ",");
        size_t n;
        char tok[256];
        copy_out(p, len, tok, sizeof tok);
        const char *t = trim(tok, &n);
        st = spec_token(spec, t, n, out);
        if (p[len] == '\0') break;
        p += len + 1;
    }
    if (st != CAI_OK) cai_rl_reward_spec_free(out);
    return st;
}

int cai_rl_reward_spec_find(const cai_rl_reward_spec *s, const char *name) {
    if (!s || !name) return -1;
    for (int i = 0; i < s->n; i++)
        if (s->names[i] && strcmp(s->names[i], name) == 0) return i;
    return -1;
}

cai_status cai_rl_reward_spec_eval(const cai_rl_reward_spec *s, const char *prompt, const char *response,
                                   const char *answer, double *total, double *parts) {
    CAI_CHECK_ARG(s && s->n > 0 && total, "cai_rl_reward_spec_eval: no spec or no output");
    double sum = 0;
    for (int i = 0; i < s->n; i++) {
        double r = 0;
        CAI_CALL(s->fns[i](s->ctxs[i], prompt, response, answer, &r));
        if (!isfinite(r))
            return CAI_ERROR(CAI_ERR_INTERNAL, "reward \"%s\" gave %g for the prompt \"%.80s\"", s->names[i], r,
                             prompt ? prompt : "");
        if (parts) parts[i] = r;
        sum += s->weights[i] * r;
    }
    *total = sum;
    return CAI_OK;
}
