/* Config values: schema validation, defaults, text -> typed field with type
 * and range checks, formatting, lookup with "did you mean" suggestions. */
#include "cai_config.h"

#include "config_internal.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const k_reserved[] = {"config", "help", "h", NULL};

typedef union {
    int i;
    int64_t l;
    double d;
    char *s;
} cfg_value;

const char *cai_cfg_type_name(cai_config_type type) {
    switch (type) {
    case CAI_CFG_BOOL: return "bool";
    case CAI_CFG_INT: return "int";
    case CAI_CFG_INT64: return "int64";
    case CAI_CFG_DOUBLE: return "double";
    case CAI_CFG_STRING: return "string";
    case CAI_CFG_ENUM: return "enum";
    case CAI_CFG_BYTES: return "bytes";
    }
    return "?";
}

const char *cai_cfg_type_phrase(cai_config_type type) {
    switch (type) {
    case CAI_CFG_BOOL: return "a bool";
    case CAI_CFG_INT: return "an int";
    case CAI_CFG_INT64: return "an int64";
    case CAI_CFG_DOUBLE: return "a double";
    case CAI_CFG_STRING: return "a string";
    case CAI_CFG_ENUM: return "an enum";
    case CAI_CFG_BYTES: return "a size";
    }
    return "a value";
}

static int norm_char(char c) { return c == '-' ? '_' : (unsigned char)c; }

int cai_cfg_key_eq(const char *key, const char *name, size_t len) {
    size_t i = 0;
    for (; i < len; i++)
        if (!key[i] || norm_char(key[i]) != norm_char(name[i])) return 0;
    return key[i] == 0;
}

const cai_config_field *cai_cfg_lookup(const cai_config_schema *schema, const char *name, size_t len) {
    for (size_t i = 0; i < schema->nfields; i++) {
        const cai_config_field *f = &schema->fields[i];
        if (cai_cfg_key_eq(f->key, name, len)) return f;
        if (f->alias && cai_cfg_key_eq(f->alias, name, len)) return f;
    }
    return NULL;
}

const cai_config_field *cai_config_find(const cai_config_schema *schema, const char *key) {
    if (!schema || !key) return NULL;
    return cai_cfg_lookup(schema, key, strlen(key));
}

/* Whether name[0..len) followed by '.' starts `key`. */
static int is_prefix_of(const char *key, const char *name, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (!key[i] || norm_char(key[i]) != norm_char(name[i])) return 0;
    return key[len] == '.';
}

int cai_cfg_is_section(const cai_config_schema *schema, const char *name, size_t len) {
    for (size_t i = 0; i < schema->nfields; i++)
        if (is_prefix_of(schema->fields[i].key, name, len)) return 1;
    return 0;
}

/* ------------------------------------------------------------ suggestions */

/* Optimal-string-alignment distance (Levenshtein plus adjacent swaps),
 * case-insensitive and with '-' == '_': "trian.lr" is one edit from "train.lr". */
static size_t edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 255 || m > 255) return SIZE_MAX;
    size_t rows[3][256];
    size_t *pp = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= m; j++) prev[j] = j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower(norm_char(a[i - 1])), cb = tolower(norm_char(b[j - 1]));
            size_t best = prev[j - 1] + (ca != cb);
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower(norm_char(b[j - 2])) && tolower(norm_char(a[i - 2])) == cb &&
                pp[j - 2] + 1 < best)
                best = pp[j - 2] + 1;
            cur[j] = best;
        }
        size_t *t = pp;
        pp = prev;
        prev = cur;
        cur = t;
    }
    return prev[m];
}

static const char *last_part(const char *key) {
    const char *dot = strrchr(key, '.');
    return dot ? dot + 1 : key;
}

/* The closest key: small edit distance to the key or alias, else a unique
 * key whose last part equals the name's last part (`lr` written at top level
 * instead of under `train:`). */
static const cai_config_field *suggest(const cai_config_schema *schema, const char *name) {
    size_t len = strlen(name);
    size_t limit = len / 4 + 1;
    if (limit > 3) limit = 3;
    const cai_config_field *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < schema->nfields; i++) {
        const cai_config_field *f = &schema->fields[i];
        size_t d = edit_distance(name, f->key);
        if (f->alias) {
            size_t da = edit_distance(name, f->alias);
            if (da < d) d = da;
        }
        if (d < best_d) {
            best_d = d;
            best = f;
        }
    }
    if (best && best_d <= limit) return best;
    const char *tail = last_part(name);
    const cai_config_field *match = NULL;
    for (size_t i = 0; i < schema->nfields; i++) {
        if (cai_cfg_key_eq(last_part(schema->fields[i].key), tail, strlen(tail))) {
            if (match) return NULL; /* ambiguous: better no hint than a wrong one */
            match = &schema->fields[i];
        }
    }
    return match;
}

cai_status cai_cfg_unknown_key(const cai_config_schema *schema, const char *source, const char *name,
                               const char *flag) {
    size_t len = strlen(name);
    if (cai_cfg_is_section(schema, name, len)) {
        char keys[1024] = "";
        size_t used = 0, shown = 0, total = 0;
        for (size_t i = 0; i < schema->nfields; i++) {
            if (!is_prefix_of(schema->fields[i].key, name, len)) continue;
            total++;
            if (shown < 8 && used < sizeof keys) {
                int w =
                    snprintf(keys + used, sizeof keys - used, "%s%s%s", shown ? ", " : "", flag, schema->fields[i].key);
                if (w > 0) used += (size_t)w;
                shown++;
            }
        }
        return CAI_ERROR(CAI_ERR_CONFIG, "%s: '%s%s' is a section, not a key; set one of its keys: %s%s", source, flag,
                         name, keys, total > shown ? ", ..." : "");
    }
    const cai_config_field *s = suggest(schema, name);
    if (s)
        return CAI_ERROR(CAI_ERR_CONFIG, "%s: unknown key '%s%s' (did you mean '%s%s'?)", source, flag, name, flag,
                         s->key);
    return CAI_ERROR(CAI_ERR_CONFIG, "%s: unknown key '%s%s' (%s --help lists every key)", source, flag, name,
                     schema->program ? schema->program : "the program's");
}

/* ------------------------------------------------------------ parsing */

int cai_cfg_parse_bool(const char *text, int *out) {
    static const char *const yes[] = {"true", "yes", "on", "1", NULL};
    static const char *const no[] = {"false", "no", "off", "0", NULL};
    for (int i = 0; yes[i]; i++) {
        if (!strcasecmp(text, yes[i])) {
            *out = 1;
            return 1;
        }
        if (!strcasecmp(text, no[i])) {
            *out = 0;
            return 1;
        }
    }
    return 0;
}

static void quote_for_message(const char *text, char *buf, size_t cap) {
    /* Values echo back into one-line errors: cut long ones, show control bytes. */
    size_t o = 0;
    for (size_t i = 0; text[i] && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)text[i];
        if (i >= 60) {
            snprintf(buf + o, cap - o, "...");
            return;
        }
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = 0;
}

/* Decimal integer in [lo, hi]: no leading blanks, no trailing junk, no overflow. */
static int parse_integer(const char *text, long long lo, long long hi, long long *out, const char **why) {
    if (!*text) {
        *why = "empty value";
        return 0;
    }
    if (isspace((unsigned char)text[0])) {
        *why = "leading blank";
        return 0;
    }
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end) {
        char *dend = NULL;
        (void)strtod(text, &dend);
        *why = dend != text && !*dend ? "not a whole number" : "trailing or invalid characters";
        return 0;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        *why = "too large for the field's type";
        return 0;
    }
    *out = v;
    return 1;
}

const char *const cai_config_bytes_auto[] = {"auto", NULL};

static const struct {
    const char *unit;
    double scale;
} k_byte_units[] = {
    /* Largest first: cai_config_format_bytes takes the first that divides. */
    {"TiB", 1099511627776.0},
    {"TB", 1e12},
    {"GiB", 1073741824.0},
    {"GB", 1e9},
    {"MiB", 1048576.0},
    {"MB", 1e6},
    {"KiB", 1024.0},
    {"KB", 1e3},
    {"T", 1099511627776.0},
    {"G", 1073741824.0},
    {"M", 1048576.0},
    {"K", 1024.0},
    {"B", 1},
    {"", 1},
};
#define N_BYTE_UNITS (sizeof k_byte_units / sizeof k_byte_units[0])

/* 0: *out holds the bytes; 1: no number; 2: *unit is not a unit; 3: too large. */
static int parse_bytes(const char *text, int64_t *out, const char **unit) {
    char *end = NULL;
    double v = 0;
    if (*text == '.' || isdigit((unsigned char)*text)) v = strtod(text, &end);
    if (!end || end == text) return 1;
    while (*end == ' ') end++;
    *unit = end;
    for (size_t i = 0; i < N_BYTE_UNITS; i++) {
        if (strcasecmp(end, k_byte_units[i].unit)) continue;
        double b = nearbyint(v * k_byte_units[i].scale);
        /* 2^63 is the first double above INT64_MAX. */
        if (!isfinite(b) || b >= 9223372036854775808.0) return 3;
        *out = (int64_t)b;
        return 0;
    }
    return 2;
}

/* The error of parse_bytes' `why`; `lead` (the source, or NULL) comes first. */
static cai_status bytes_error(const char *source, const char *key, const char *text, int why, const char *unit) {
    char shown[256], ushown[64], lead[256];
    quote_for_message(text, shown, sizeof shown);
    snprintf(lead, sizeof lead, "%s%s", source ? source : "", source ? ": " : "");
    if (why == 3) return CAI_ERROR(CAI_ERR_CONFIG, "%s%s='%s' is too large (at most 8EiB)", lead, key, shown);
    if (why == 2) {
        quote_for_message(unit, ushown, sizeof ushown);
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "%s%s='%s' is not a size (%s: unknown unit '%s'; K/M/G/T and KiB/MiB/GiB/"
                         "TiB are powers of 1024, KB/MB/GB/TB powers of 1000, B or none bytes)",
                         lead, key, shown, key, ushown);
    }
    return CAI_ERROR(CAI_ERR_CONFIG, "%s%s='%s' is not a size (e.g. 3GiB, 800M, 5GB, 4096)", lead, key, shown);
}

cai_status cai_config_parse_bytes(const char *what, const char *text, int64_t *out) {
    CAI_CHECK_ARG(text && out, "cai_config_parse_bytes: NULL text or output");
    const char *unit = "";
    int64_t v = 0;
    int why = parse_bytes(text, &v, &unit);
    if (why) return bytes_error(NULL, what ? what : "size", text, why, unit);
    *out = v;
    return CAI_OK;
}

const char *cai_config_format_bytes(int64_t bytes, char *buf, size_t cap) {
    if (!cap) return buf;
    if (bytes > 0)
        for (size_t i = 0; i < N_BYTE_UNITS && k_byte_units[i].scale > 1 && strlen(k_byte_units[i].unit) > 1; i++) {
            int64_t scale = (int64_t)k_byte_units[i].scale;
            if (bytes % scale == 0) {
                snprintf(buf, cap, "%" PRId64 "%s", bytes / scale, k_byte_units[i].unit);
                return buf;
            }
        }
    snprintf(buf, cap, "%" PRId64, bytes);
    return buf;
}

static void choices_list(const cai_config_field *f, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; f->choices && f->choices[i] && o < cap; i++) {
        int w = snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", f->choices[i]);
        if (w > 0) o += (size_t)w;
    }
}

static int range_checked(const cai_config_field *f) { return f->min < f->max; }

cai_status cai_cfg_apply(const cai_config_field *f, void *cfg, const char *text, const char *source, int dry_run) {
    char shown[256];
    quote_for_message(text, shown, sizeof shown);
    const char *tname = cai_cfg_type_phrase(f->type);
    cfg_value v = {0};
    double as_number = 0;
    const char *why = NULL;
    switch (f->type) {
    case CAI_CFG_BOOL:
        if (!cai_cfg_parse_bool(text, &v.i))
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "%s: key '%s': expected a bool (true/false, yes/no, on/off, 1/0), got '%s'", source,
                             f->key, shown);
        break;
    case CAI_CFG_INT:
    case CAI_CFG_INT64: {
        long long lo = f->type == CAI_CFG_INT ? INT_MIN : INT64_MIN;
        long long hi = f->type == CAI_CFG_INT ? INT_MAX : INT64_MAX;
        long long n = 0;
        if (!parse_integer(text, lo, hi, &n, &why))
            return CAI_ERROR(CAI_ERR_CONFIG, "%s: key '%s': expected %s (%s), got '%s'", source, f->key, tname, why,
                             shown);
        if (f->type == CAI_CFG_INT) v.i = (int)n;
        else v.l = (int64_t)n;
        as_number = (double)n;
        break;
    }
    case CAI_CFG_DOUBLE: {
        char *end = NULL;
        errno = 0;
        double d = *text && !isspace((unsigned char)*text) ? strtod(text, &end) : 0;
        if (!end || end == text || *end)
            return CAI_ERROR(CAI_ERR_CONFIG, "%s: key '%s': expected a double, got '%s'", source, f->key, shown);
        if (!isfinite(d))
            return CAI_ERROR(CAI_ERR_CONFIG, "%s: key '%s': expected a finite double, got '%s'", source, f->key, shown);
        v.d = d;
        as_number = d;
        break;
    }
    case CAI_CFG_STRING: break;
    case CAI_CFG_ENUM: {
        int found = -1;
        for (int i = 0; f->choices && f->choices[i]; i++)
            if (!strcasecmp(text, f->choices[i])) found = i;
        if (found < 0) {
            char list[1024];
            choices_list(f, list, sizeof list);
            return CAI_ERROR(CAI_ERR_CONFIG, "%s: key '%s': '%s' is not one of: %s", source, f->key, shown, list);
        }
        v.i = found;
        break;
    }
    case CAI_CFG_BYTES: {
        int word = -1;
        for (int i = 0; f->choices && f->choices[i]; i++)
            if (!strcasecmp(text, f->choices[i])) word = i;
        if (word >= 0) {
            v.l = CAI_CFG_BYTES_WORD(word);
            break;
        }
        const char *unit = "";
        int why = parse_bytes(text, &v.l, &unit);
        if (why) return bytes_error(source, f->key, text, why, unit);
        as_number = (double)v.l;
        break;
    }
    default: return CAI_ERROR(CAI_ERR_INVALID_ARG, "key '%s' has unknown type %d", f->key, (int)f->type);
    }
    int numeric = f->type == CAI_CFG_INT || f->type == CAI_CFG_INT64 || f->type == CAI_CFG_DOUBLE ||
                  (f->type == CAI_CFG_BYTES && v.l >= 0);
    if (numeric && range_checked(f) && (as_number < f->min || as_number > f->max)) {
        char lo[40], hi[40];
        snprintf(lo, sizeof lo, "%.17g", f->min);
        snprintf(hi, sizeof hi, "%.17g", f->max);
        return CAI_ERROR(CAI_ERR_CONFIG, "%s: key '%s': %s is out of range [%s, %s]", source, f->key, shown, lo, hi);
    }
    if (dry_run) return CAI_OK;

    void *slot = (char *)cfg + f->offset;
    switch (f->type) {
    case CAI_CFG_BOOL:
    case CAI_CFG_INT:
    case CAI_CFG_ENUM: *(int *)slot = v.i; break;
    case CAI_CFG_INT64:
    case CAI_CFG_BYTES: *(int64_t *)slot = v.l; break;
    case CAI_CFG_DOUBLE: *(double *)slot = v.d; break;
    case CAI_CFG_STRING: {
        char *copy = strdup(text);
        if (!copy)
            return CAI_ERROR(CAI_ERR_NOMEM, "%s: key '%s': cannot copy a %zu-byte string", source, f->key,
                             strlen(text));
        free(*(char **)slot);
        *(char **)slot = copy;
        break;
    }
    }
    return CAI_OK;
}

cai_status cai_config_set(const cai_config_schema *schema, void *cfg, const char *key, const char *value,
                          const char *source) {
    CAI_CHECK_ARG(schema && cfg && key && value, "cai_config_set: NULL schema, cfg, key or value");
    if (!source) source = "cai_config_set";
    const cai_config_field *f = cai_config_find(schema, key);
    if (!f) return cai_cfg_unknown_key(schema, source, key, "");
    CAI_CALL(cai_cfg_apply(f, cfg, value, source, 0));
    return CAI_OK;
}

/* ------------------------------------------------------------ schema */

static int valid_part_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-'; }

/* Dotted parts of [A-Za-z0-9_-]+, so every key is a plain YAML key and a flag. */
static int valid_key(const char *key, int allow_dots) {
    if (!key || !*key) return 0;
    int part_len = 0;
    for (const char *p = key; *p; p++) {
        if (*p == '.' && allow_dots) {
            if (!part_len) return 0;
            part_len = 0;
        } else if (valid_part_char(*p)) {
            part_len++;
        } else {
            return 0;
        }
    }
    return part_len > 0;
}

static int is_reserved(const char *name) {
    for (int i = 0; k_reserved[i]; i++)
        if (cai_cfg_key_eq(k_reserved[i], name, strlen(name))) return 1;
    return !strncmp(name, "no-", 3) || !strncmp(name, "no_", 3);
}

static cai_status check_field(const cai_config_schema *schema, size_t idx) {
    const char *prog = schema->program ? schema->program : "config";
    const cai_config_field *f = &schema->fields[idx];
    if (!valid_key(f->key, 1))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: field %zu: key '%s' is not dotted parts of [A-Za-z0-9_-]",
                         prog, idx, f->key ? f->key : "(null)");
    if (is_reserved(f->key))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: key '%s' is reserved (config, help, h, no-*)", prog, f->key);
    if ((int)f->type < CAI_CFG_BOOL || f->type > CAI_CFG_BYTES)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: key '%s' has unknown type %d", prog, f->key, (int)f->type);
    if (!f->doc || !*f->doc || strpbrk(f->doc, "\r\n"))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: key '%s' needs a one-line doc for --help", prog, f->key);
    if (f->type == CAI_CFG_ENUM || (f->type == CAI_CFG_BYTES && f->choices)) {
        if (!f->choices || !f->choices[0])
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: enum key '%s' has no choices", prog, f->key);
        for (int i = 0; f->choices[i]; i++) {
            if (!*f->choices[i] || strpbrk(f->choices[i], "\r\n"))
                return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: enum key '%s' has an empty or multi-line choice",
                                 prog, f->key);
            for (int j = 0; j < i; j++)
                if (!strcasecmp(f->choices[i], f->choices[j]))
                    return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: enum key '%s' lists '%s' twice", prog, f->key,
                                     f->choices[i]);
        }
    }
    if (f->alias) {
        if (!valid_key(f->alias, 0) || is_reserved(f->alias))
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: key '%s' has a bad or reserved alias '%s'", prog, f->key,
                             f->alias);
        if (cai_cfg_is_section(schema, f->alias, strlen(f->alias)))
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: alias '%s' of '%s' is also a section name", prog,
                             f->alias, f->key);
    }
    for (size_t j = 0; j < idx; j++) {
        const cai_config_field *g = &schema->fields[j];
        const char *names_f[2] = {f->key, f->alias}, *names_g[2] = {g->key, g->alias};
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++)
                if (names_f[a] && names_g[b] && cai_cfg_key_eq(names_f[a], names_g[b], strlen(names_g[b])))
                    return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: '%s' names both '%s' and '%s'", prog, names_f[a],
                                     g->key, f->key);
        /* A leaf that is also a section could not be written as YAML. */
        if (is_prefix_of(f->key, g->key, strlen(g->key)) || is_prefix_of(g->key, f->key, strlen(f->key)))
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s schema: '%s' and '%s': a key cannot also be a section", prog,
                             g->key, f->key);
    }
    return CAI_OK;
}

static const char *default_text(const cai_config_field *f) {
    if (f->default_value) return f->default_value;
    return f->type == CAI_CFG_STRING ? "" : f->type == CAI_CFG_ENUM ? f->choices[0] : "0";
}

cai_status cai_config_defaults(const cai_config_schema *schema, void *cfg) {
    CAI_CHECK_ARG(schema && cfg, "cai_config_defaults: NULL schema or cfg");
    CAI_CHECK_ARG(schema->fields || !schema->nfields, "cai_config_defaults: schema has no field table");
    /* NULL every string first so cai_config_free is safe whatever fails below. */
    for (size_t i = 0; i < schema->nfields; i++)
        if (schema->fields[i].type == CAI_CFG_STRING) *(char **)((char *)cfg + schema->fields[i].offset) = NULL;
    for (size_t i = 0; i < schema->nfields; i++) CAI_CALL(check_field(schema, i));
    char source[256];
    for (size_t i = 0; i < schema->nfields; i++) {
        const cai_config_field *f = &schema->fields[i];
        const char *text = default_text(f);
        snprintf(source, sizeof source, "%s schema default", schema->program ? schema->program : "config");
        CAI_CALL(cai_cfg_apply(f, cfg, text, source, 0));
    }
    return CAI_OK;
}

void cai_config_free(const cai_config_schema *schema, void *cfg) {
    if (!schema || !cfg) return;
    for (size_t i = 0; i < schema->nfields; i++) {
        if (schema->fields[i].type != CAI_CFG_STRING) continue;
        char **slot = (char **)((char *)cfg + schema->fields[i].offset);
        free(*slot);
        *slot = NULL;
    }
}

/* ------------------------------------------------------------ formatting */

/* Shortest %.Ng that reads back to the same double, always with a '.' in the
 * mantissa ("1.0", "1.0e-06"): YAML 1.1 readers such as PyYAML take "1" for
 * an int and "1e-06" for a string. */
static void format_double(double v, char *buf, size_t cap) {
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    char *e = strchr(tmp, 'e');
    if (strchr(tmp, '.')) snprintf(buf, cap, "%s", tmp);
    else if (e) snprintf(buf, cap, "%.*s.0%s", (int)(e - tmp), tmp, e);
    else snprintf(buf, cap, "%s.0", tmp);
}

const char *cai_config_format(const cai_config_field *f, const void *cfg, char *buf, size_t cap) {
    if (!cap) return buf;
    buf[0] = 0;
    const void *slot = (const char *)cfg + f->offset;
    switch (f->type) {
    case CAI_CFG_BOOL: snprintf(buf, cap, "%s", *(const int *)slot ? "true" : "false"); break;
    case CAI_CFG_INT: snprintf(buf, cap, "%d", *(const int *)slot); break;
    case CAI_CFG_INT64: snprintf(buf, cap, "%" PRId64, *(const int64_t *)slot); break;
    case CAI_CFG_BYTES: {
        int64_t b = *(const int64_t *)slot;
        int n = 0;
        while (f->choices && f->choices[n]) n++;
        if (b >= 0) cai_config_format_bytes(b, buf, cap);
        else if (-1 - b < n) snprintf(buf, cap, "%s", f->choices[-1 - b]);
        else snprintf(buf, cap, "<invalid %" PRId64 ">", b);
        break;
    }
    case CAI_CFG_DOUBLE: format_double(*(const double *)slot, buf, cap); break;
    case CAI_CFG_STRING: {
        const char *s = *(char *const *)slot;
        snprintf(buf, cap, "%s", s ? s : "");
        break;
    }
    case CAI_CFG_ENUM: {
        int i = *(const int *)slot, n = 0;
        while (f->choices && f->choices[n]) n++;
        if (i >= 0 && i < n) snprintf(buf, cap, "%s", f->choices[i]);
        else snprintf(buf, cap, "<invalid %d>", i);
        break;
    }
    }
    return buf;
}

const cai_config_field *cai_config_compare(const cai_config_schema *schema, const void *a, const void *b) {
    for (size_t i = 0; i < schema->nfields; i++) {
        const cai_config_field *f = &schema->fields[i];
        const void *pa = (const char *)a + f->offset, *pb = (const char *)b + f->offset;
        int same = 1;
        switch (f->type) {
        case CAI_CFG_BOOL: same = !*(const int *)pa == !*(const int *)pb; break;
        case CAI_CFG_INT:
        case CAI_CFG_ENUM: same = *(const int *)pa == *(const int *)pb; break;
        case CAI_CFG_INT64:
        case CAI_CFG_BYTES: same = *(const int64_t *)pa == *(const int64_t *)pb; break;
        case CAI_CFG_DOUBLE: same = *(const double *)pa == *(const double *)pb; break;
        case CAI_CFG_STRING: {
            const char *sa = *(char *const *)pa, *sb = *(char *const *)pb;
            same = !strcmp(sa ? sa : "", sb ? sb : "");
            break;
        }
        }
        if (!same) return f;
    }
    return NULL;
}

int cai_cfg_plain_safe(const char *text) {
    static const char *const special[] = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~", NULL};
    if (!*text || !(isalpha((unsigned char)text[0]) || text[0] == '_')) return 0;
    for (const char *p = text; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.')) return 0;
    for (int i = 0; special[i]; i++)
        if (!strcasecmp(text, special[i])) return 0;
    return 1;
}

void cai_cfg_format_default(const cai_config_field *f, char *buf, size_t cap) {
    const char *text = default_text(f);
    if (f->type == CAI_CFG_STRING) {
        snprintf(buf, cap, "\"%s\"", text);
        return;
    }
    /* Parse into a scratch value through the real parser so --help shows
     * exactly what the struct will hold ("3e-4" -> 0.0003). */
    cfg_value tmp = {0};
    cai_config_field one = *f;
    one.offset = 0;
    if (cai_cfg_apply(&one, &tmp, text, "default", 0) == CAI_OK) cai_config_format(&one, &tmp, buf, cap);
    else snprintf(buf, cap, "%s (invalid: %s)", text, cai_error_message());
}
