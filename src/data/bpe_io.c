/* Tokenizer files: GPT-2 / Hugging Face vocab.json + merges.txt (own parsers,
 * so every error names its line), Hugging Face tokenizer.json (jansson), and
 * the writer for all three. */
#include "cai_config.h"
#include "bpe_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static cai_status read_whole(const char *path, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return CAI_ERROR(CAI_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    cai_byte_buf b = {0};
    cai_status st = CAI_OK;
    char chunk[1 << 16];
    size_t got;
    while (st == CAI_OK && (got = fread(chunk, 1, sizeof chunk, f)) > 0) st = cai_byte_buf_append(&b, chunk, got);
    if (st == CAI_OK && ferror(f)) st = CAI_ERROR(CAI_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    if (st == CAI_OK) st = cai_byte_buf_append(&b, "", 1); /* terminator, not counted */
    fclose(f);
    if (st != CAI_OK) {
        cai_byte_buf_free(&b);
        CAI_CALL(st);
    }
    *data = b.data;
    *len = b.len - 1;
    return CAI_OK;
}

/* ------------------------------------------------------------ vocab.json */

typedef struct {
    const char *path;
    const char *s;
    size_t n, i;
    int line;
} jscan;

static void js_skip(jscan *j) {
    while (j->i < j->n) {
        char c = j->s[j->i];
        if (c == '\n') j->line++;
        else if (c != ' ' && c != '\t' && c != '\r') break;
        j->i++;
    }
}

static cai_status js_fail(const jscan *j, const char *what) {
    if (j->i >= j->n) return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: %s, found the end of the file", j->path, j->line, what);
    return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: %s, found '%c'", j->path, j->line, what, j->s[j->i]);
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return 0;
        *v = *v * 16 + (uint32_t)d;
    }
    return 1;
}

/* A JSON string at j->i (after skipping blanks), unescaped into out. */
static cai_status js_string(jscan *j, cai_byte_buf *out) {
    out->len = 0;
    if (j->i >= j->n || j->s[j->i] != '"') return js_fail(j, "expected a string");
    j->i++;
    for (;;) {
        if (j->i >= j->n) return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: unterminated string", j->path, j->line);
        unsigned char c = (unsigned char)j->s[j->i];
        if (c == '"') {
            j->i++;
            return CAI_OK;
        }
        if (c < 0x20)
            return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: raw control character 0x%02x inside a string", j->path, j->line,
                             c);
        if (c != '\\') {
            size_t k = j->i;
            while (k < j->n && j->s[k] != '"' && j->s[k] != '\\' && (unsigned char)j->s[k] >= 0x20) k++;
            CAI_CALL(cai_byte_buf_append(out, j->s + j->i, k - j->i));
            j->i = k;
            continue;
        }
        if (j->i + 1 >= j->n) return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: unterminated string", j->path, j->line);
        char e = j->s[j->i + 1], ch;
        j->i += 2;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (j->i + 4 > j->n || !hex4(j->s + j->i, &cp))
                return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: \\u needs four hex digits", j->path, j->line);
            j->i += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {
                if (j->i + 6 > j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u' || !hex4(j->s + j->i + 2, &lo) ||
                    lo < 0xDC00 || lo >= 0xE000)
                    return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: \\u%04X is a high surrogate without its low half", j->path,
                                     j->line, (unsigned)cp);
                j->i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: lone low surrogate \\u%04X", j->path, j->line, (unsigned)cp);
            }
            char u[4];
            CAI_CALL(cai_byte_buf_append(out, u, cai_bpe_utf8_encode(cp, u)));
            continue;
        }
        default: return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: unknown escape \\%c", j->path, j->line, e);
        }
        CAI_CALL(cai_byte_buf_append(out, &ch, 1));
    }
}

typedef struct {
    int64_t id;
    size_t off, len; /* spelling in the key pool */
    int line;
} vocab_entry;

typedef struct {
    vocab_entry *v;
    size_t n, cap;
    cai_byte_buf keys;
} vocab_list;

static void vocab_list_free(vocab_list *l) {
    free(l->v);
    cai_byte_buf_free(&l->keys);
    memset(l, 0, sizeof *l);
}

static cai_status vocab_list_add(vocab_list *l, int64_t id, const char *key, size_t len, int line) {
    CAI_CALL(cai_bpe_reserve((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v, "vocabulary entries"));
    l->v[l->n++] = (vocab_entry){id, l->keys.len, len, line};
    CAI_CALL(cai_byte_buf_append(&l->keys, key, len));
    return CAI_OK;
}

static cai_status parse_vocab_json(const char *path, const char *s, size_t n, vocab_list *out) {
    jscan j = {path, s, n, 0, 1};
    cai_byte_buf key = {0};
    cai_status st = CAI_OK;
    js_skip(&j);
    if (j.i >= j.n || s[j.i] != '{') {
        st = js_fail(&j, "expected '{' opening the token -> id object");
        goto done;
    }
    j.i++;
    js_skip(&j);
    if (j.i < j.n && s[j.i] == '}') {
        j.i++;
    } else {
        for (;;) {
            js_skip(&j);
            int line = j.line;
            CAI_CALL_GOTO(js_string(&j, &key), st, done);
            js_skip(&j);
            if (j.i >= j.n || s[j.i] != ':') {
                st = js_fail(&j, "expected ':' after a token");
                goto done;
            }
            j.i++;
            js_skip(&j);
            size_t k = j.i;
            if (k < j.n && s[k] == '-') k++;
            size_t digits = k;
            while (k < j.n && s[k] >= '0' && s[k] <= '9' && k - digits < 12) k++;
            if (k == digits ||
                (k < j.n && (s[k] == '.' || s[k] == 'e' || s[k] == 'E' || (s[k] >= '0' && s[k] <= '9')))) {
                st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: the id of token \"%.*s\" must be an integer below 2^31", path,
                               j.line, (int)key.len, key.data);
                goto done;
            }
            int64_t id = strtoll(s + j.i, NULL, 10);
            if (id < 0 || id >= INT32_MAX) {
                st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: token \"%.*s\" has id %lld, outside 0..%d", path, j.line,
                               (int)key.len, key.data, (long long)id, INT32_MAX - 1);
                goto done;
            }
            if (key.len == 0) {
                st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: empty token (id %lld)", path, j.line, (long long)id);
                goto done;
            }
            j.i = k;
            CAI_CALL_GOTO(vocab_list_add(out, id, key.data, key.len, line), st, done);
            js_skip(&j);
            if (j.i < j.n && s[j.i] == ',') {
                j.i++;
                continue;
            }
            if (j.i < j.n && s[j.i] == '}') {
                j.i++;
                break;
            }
            st = js_fail(&j, "expected ',' or '}' after an id");
            goto done;
        }
    }
    js_skip(&j);
    if (j.i < j.n) st = js_fail(&j, "expected the end of the file after the closing '}'");
    else if (out->n == 0) st = CAI_ERROR(CAI_ERR_FORMAT, "%s: the vocabulary is empty", path);
done:
    cai_byte_buf_free(&key);
    return st;
}

/* Create the token table from (id, spelling) entries, rejecting repeated ids
 * and spellings with both places named. */
static cai_status build_table(const char *path, const vocab_list *l, int32_t min_ids, cai_bpe_t **out) {
    int64_t max_id = min_ids - 1;
    for (size_t k = 0; k < l->n; k++)
        if (l->v[k].id > max_id) max_id = l->v[k].id;
    /* The table is dense in ids: a few entries with a huge id (a 30-byte
     * file naming id 88888159) would cost gigabytes. Real vocabularies use
     * (nearly) every id; allow gaps, not a table mostly empty. */
    const int64_t dense_limit = 4 * (int64_t)l->n + 65536;
    if (max_id >= dense_limit)
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "%s: the largest token id is %lld but there are only %zu tokens: ids must be (nearly) "
                         "contiguous from 0 (at most %lld here)",
                         path, (long long)max_id, l->n, (long long)dense_limit - 1);
    cai_bpe_t *t;
    CAI_CALL(cai_bpe_alloc((int32_t)(max_id + 1), &t));
    cai_status st = CAI_OK;
    int *line_of = calloc((size_t)max_id + 1, sizeof *line_of);
    bpe_strmap seen = {0};
    if (!line_of) st = CAI_ERROR(CAI_ERR_NOMEM, "cannot allocate %lld id slots", (long long)max_id + 1);
    if (st == CAI_OK) st = bpe_strmap_init(&seen, l->n);
    for (size_t k = 0; k < l->n && st == CAI_OK; k++) {
        const vocab_entry *e = &l->v[k];
        const char *key = l->keys.data + e->off;
        int64_t idx;
        int ins;
        st = bpe_strmap_insert(&seen, key, e->len, cai_bpe_hash_bytes(key, e->len), (uint64_t)e->line, &idx, &ins);
        if (st != CAI_OK) break;
        if (!ins) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: token \"%.*s\" appears again (first on line %d)", path, e->line,
                           (int)e->len, key, (int)seen.vals[idx]);
            break;
        }
        if (t->flags[e->id]) {
            size_t ol;
            const char *other = bpe_tok_str(t, (int32_t)e->id, &ol);
            st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: id %lld of token \"%.*s\" is already used by \"%.*s\" (line %d)",
                           path, e->line, (long long)e->id, (int)e->len, key, (int)ol, other, line_of[e->id]);
            break;
        }
        line_of[e->id] = e->line;
        st = cai_bpe_define(t, (int32_t)e->id, key, e->len);
    }
    if (st == CAI_OK) st = cai_bpe_index(t, path);
    bpe_strmap_free(&seen);
    free(line_of);
    if (st != CAI_OK) {
        cai_bpe_free(t);
        CAI_CALL(st);
    }
    *out = t;
    return CAI_OK;
}

/* ------------------------------------------------------------ merges */

static cai_status lookup_spelling(const cai_bpe_t *t, const char *s, size_t n, int32_t *id) {
    int64_t e = bpe_strmap_find(&t->by_str, s, n, cai_bpe_hash_bytes(s, n));
    if (e < 0) return CAI_ERR_FORMAT; /* the caller words the message */
    *id = (int32_t)t->by_str.vals[e];
    return CAI_OK;
}

/* Add merge `left right` (origin names where it came from in messages). */
static cai_status add_merge(cai_bpe_t *t, const char *left, size_t ll, const char *right, size_t rl,
                            const char *vocab_origin, const char *origin, int line_or_index, cai_byte_buf *tmp) {
    int32_t a, b, r;
    const char *sep = line_or_index >= 0 ? ":" : "";
    char where[32] = "";
    if (line_or_index >= 0) snprintf(where, sizeof where, "%d", line_or_index);
    if (lookup_spelling(t, left, ll, &a) != CAI_OK)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s%s%s: token \"%.*s\" of merge \"%.*s %.*s\" is not in %s", origin, sep,
                         where, (int)ll, left, (int)ll, left, (int)rl, right, vocab_origin);
    if (lookup_spelling(t, right, rl, &b) != CAI_OK)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s%s%s: token \"%.*s\" of merge \"%.*s %.*s\" is not in %s", origin, sep,
                         where, (int)rl, right, (int)ll, left, (int)rl, right, vocab_origin);
    tmp->len = 0;
    CAI_CALL(cai_byte_buf_append(tmp, left, ll));
    CAI_CALL(cai_byte_buf_append(tmp, right, rl));
    if (lookup_spelling(t, tmp->data, tmp->len, &r) != CAI_OK)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s%s%s: merge \"%.*s %.*s\" makes \"%.*s\", which is not in %s", origin, sep,
                         where, (int)ll, left, (int)rl, right, (int)tmp->len, tmp->data, vocab_origin);
    if (t->flags[a] & BPE_TOKEN_SPECIAL || t->flags[b] & BPE_TOKEN_SPECIAL)
        return CAI_ERROR(CAI_ERR_FORMAT, "%s%s%s: merge \"%.*s %.*s\" uses a special token", origin, sep, where,
                         (int)ll, left, (int)rl, right);
    CAI_CALL(cai_bpe_push_merge(t, a, b, r));
    return CAI_OK;
}

static cai_status parse_merges(cai_bpe_t *t, const char *path, const char *vocab_path, const char *s, size_t n) {
    cai_byte_buf tmp = {0};
    cai_status st = CAI_OK;
    int line = 0;
    for (size_t i = 0; i < n && st == CAI_OK;) {
        line++;
        const char *ln = s + i;
        const char *nl = memchr(ln, '\n', n - i);
        size_t len = nl ? (size_t)(nl - ln) : n - i;
        i += len + (nl != NULL);
        if (len && ln[len - 1] == '\r') len--;
        if (len == 0 || (len >= 8 && memcmp(ln, "#version", 8) == 0)) continue;
        const char *sp = memchr(ln, ' ', len);
        if (!sp || sp == ln || sp == ln + len - 1 || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - ln))) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "%s:%d: expected two tokens separated by one space, found \"%.*s\"", path,
                           line, (int)(len > 200 ? 200 : len), ln);
            break;
        }
        size_t ll = (size_t)(sp - ln);
        st = add_merge(t, ln, ll, sp + 1, len - ll - 1, vocab_path, path, line, &tmp);
    }
    cai_byte_buf_free(&tmp);
    return st;
}

cai_status cai_bpe_load(const char *vocab_path, const char *merges_path, cai_bpe_t **out) {
    CAI_CHECK_ARG(vocab_path && merges_path && out, "cai_bpe_load: NULL argument");
    *out = NULL;
    char *vs = NULL, *ms = NULL;
    size_t vn, mn;
    vocab_list l = {0};
    cai_bpe_t *t = NULL;
    cai_status st;
    CAI_CALL_GOTO(read_whole(vocab_path, &vs, &vn), st, fail);
    CAI_CALL_GOTO(read_whole(merges_path, &ms, &mn), st, fail);
    CAI_CALL_GOTO(parse_vocab_json(vocab_path, vs, vn, &l), st, fail);
    CAI_CALL_GOTO(build_table(vocab_path, &l, 0, &t), st, fail);
    CAI_CALL_GOTO(parse_merges(t, merges_path, vocab_path, ms, mn), st, fail);
    free(vs);
    free(ms);
    vocab_list_free(&l);
    *out = t;
    return CAI_OK;
fail:
    free(vs);
    free(ms);
    vocab_list_free(&l);
    cai_bpe_free(t);
    return st;
}

/* ------------------------------------------------------------ tokenizer.json */

static int json_is_absent(const json_t *v) { return !v || json_is_null(v); }

/* `field` must be absent, null, false, 0 or "" (an option colossal does not implement). */
static cai_status require_off(const char *path, const json_t *obj, const char *name, const char *field) {
    const json_t *v = json_object_get(obj, field);
    if (json_is_absent(v) || json_is_false(v) || (json_is_string(v) && json_string_length(v) == 0) ||
        (json_is_number(v) && json_number_value(v) == 0))
        return CAI_OK;
    return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: %s.%s is set; colossal's byte-level BPE does not implement it", path,
                     name, field);
}

/* A ByteLevel object `v` at `field` (a path such as "pre_tokenizer" or
 * "pre_tokenizer.pretokenizers[1]"). */
static cai_status check_byte_level_obj(const char *path, const json_t *v, const char *field, int *add_prefix_space) {
    if (!json_is_object(v)) return CAI_ERROR(CAI_ERR_FORMAT, "%s: %s is not an object", path, field);
    const char *type = json_string_value(json_object_get(v, "type"));
    if (!type || strcmp(type, "ByteLevel") != 0)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: %s.type is \"%s\"; only \"ByteLevel\" (GPT-2's scheme) is supported",
                         path, field, type ? type : "(none)");
    const json_t *re = json_object_get(v, "use_regex");
    if (re && json_is_false(re))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: %s.use_regex is false; only GPT-2's pre-tokenisation pattern is "
                         "supported",
                         path, field);
    if (add_prefix_space) *add_prefix_space = json_is_true(json_object_get(v, "add_prefix_space"));
    return CAI_OK;
}

static cai_status check_byte_level(const char *path, const json_t *root, const char *field, int required,
                                   int *add_prefix_space) {
    const json_t *v = json_object_get(root, field);
    if (json_is_absent(v)) {
        if (required)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "%s: %s is missing; only GPT-2's ByteLevel pre-tokenizer is supported", path, field);
        return CAI_OK;
    }
    return check_byte_level_obj(path, v, field, add_prefix_space);
}

/* root.pre_tokenizer: ByteLevel, or Sequence[Digits(individual_digits=true),
 * ByteLevel] (the digit-splitting form of Llama 3 / DeepSeek / Qwen). */
static cai_status check_pre_tokenizer(const char *path, const json_t *root, int *add_prefix_space, int *split_digits) {
    const json_t *v = json_object_get(root, "pre_tokenizer");
    *split_digits = 0;
    if (json_is_absent(v) || !json_is_object(v) || !json_is_string(json_object_get(v, "type")) ||
        strcmp(json_string_value(json_object_get(v, "type")), "Sequence") != 0)
        return check_byte_level(path, root, "pre_tokenizer", 1, add_prefix_space);
    const json_t *seq = json_object_get(v, "pretokenizers");
    if (!json_is_array(seq))
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "%s: pre_tokenizer.pretokenizers is not an array (pre_tokenizer is a Sequence)", path);
    size_t n = json_array_size(seq);
    if (n != 2)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer.pretokenizers has %zu entries; only [Digits(individual_digits=true), "
                         "ByteLevel] is supported",
                         path, n);
    const json_t *d = json_array_get(seq, 0);
    const char *dtype = json_is_object(d) ? json_string_value(json_object_get(d, "type")) : NULL;
    if (!json_is_object(d))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: pre_tokenizer.pretokenizers[0] is not an object", path);
    if (!dtype || strcmp(dtype, "Digits") != 0)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer.pretokenizers[0].type is \"%s\"; only \"Digits\" is supported before "
                         "ByteLevel",
                         path, dtype ? dtype : "(none)");
    const json_t *ind = json_object_get(d, "individual_digits");
    if (!json_is_boolean(ind))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: pre_tokenizer.pretokenizers[0].individual_digits must be true or false",
                         path);
    if (!json_is_true(ind))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer.pretokenizers[0].individual_digits is false (digit runs kept whole); "
                         "only true is supported",
                         path);
    int aps = 0;
    CAI_CALL(check_byte_level_obj(path, json_array_get(seq, 1), "pre_tokenizer.pretokenizers[1]", &aps));
    /* HF prepends the space to every piece Digits made, not once per text. */
    if (aps)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer.pretokenizers[1].add_prefix_space is true after Digits; not supported",
                         path);
    if (add_prefix_space) *add_prefix_space = 0;
    *split_digits = 1;
    return CAI_OK;
}

static cai_status load_hf_json(const char *path, json_t *root, cai_bpe_t **out) {
    if (!json_is_object(root)) return CAI_ERROR(CAI_ERR_FORMAT, "%s: the top level is not an object", path);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return CAI_ERROR(CAI_ERR_FORMAT, "%s: no \"model\" object", path);
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE") != 0)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: model.type is \"%s\"; only \"BPE\" is supported", path, type);
    if (!json_is_absent(json_object_get(root, "normalizer")))
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: normalizer is set; byte-level BPE here takes text unnormalised",
                         path);
    int add_prefix_space = 0, split_digits = 0;
    CAI_CALL(check_pre_tokenizer(path, root, &add_prefix_space, &split_digits));
    CAI_CALL(check_byte_level(path, root, "decoder", 0, NULL));
    CAI_CALL(require_off(path, model, "model", "dropout"));
    CAI_CALL(require_off(path, model, "model", "byte_fallback"));
    CAI_CALL(require_off(path, model, "model", "continuing_subword_prefix"));
    CAI_CALL(require_off(path, model, "model", "end_of_word_suffix"));

    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return CAI_ERROR(CAI_ERR_FORMAT, "%s: model.vocab is not an object", path);
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_absent(added) && !json_is_array(added))
        return CAI_ERROR(CAI_ERR_FORMAT, "%s: added_tokens is not an array", path);

    vocab_list l = {0};
    cai_status st = CAI_OK;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= INT32_MAX) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "%s: model.vocab[\"%s\"] must be an integer id in 0..%d", path, key,
                           INT32_MAX - 1);
            break;
        }
        st = vocab_list_add(&l, (int64_t)id, key, strlen(key), 0);
        if (st != CAI_OK) break;
    }
    /* Added tokens may carry ids past the model's vocabulary. */
    int64_t max_added = -1;
    size_t ai;
    json_t *at;
    json_array_foreach(added, ai, at) {
        json_t *jid = json_object_get(at, "id");
        const char *content = json_string_value(json_object_get(at, "content"));
        if (st != CAI_OK) break;
        if (!json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= INT32_MAX || !content ||
            !content[0]) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "%s: added_tokens[%zu] needs an integer \"id\" and a non-empty \"content\"",
                           path, ai);
            break;
        }
        static const char *const opts[] = {"lstrip", "rstrip", "single_word"};
        for (size_t k = 0; k < 3 && st == CAI_OK; k++)
            if (json_is_true(json_object_get(at, opts[k])))
                st = CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: added_tokens[%zu] (\"%s\") sets %s, which is not implemented",
                               path, ai, content, opts[k]);
        if (json_integer_value(jid) > max_added) max_added = json_integer_value(jid);
    }
    cai_bpe_t *t = NULL;
    cai_byte_buf tmp = {0};
    if (st == CAI_OK) st = build_table(path, &l, (int32_t)(max_added + 1), &t);
    if (st != CAI_OK) goto done;
    t->add_prefix_space = add_prefix_space;
    t->split_digits = split_digits;
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    json_array_foreach(added, ai, at) {
        int32_t id = (int32_t)json_integer_value(json_object_get(at, "id"));
        const char *content = json_string_value(json_object_get(at, "content"));
        int32_t have;
        if (!t->flags[id]) {
            CAI_CALL_GOTO(cai_bpe_define(t, id, content, strlen(content)), st, done);
        } else {
            size_t len;
            const char *s = bpe_tok_str(t, id, &len);
            if (len != strlen(content) || memcmp(s, content, len) != 0) {
                st = CAI_ERROR(CAI_ERR_FORMAT,
                               "%s: added_tokens[%zu] gives id %d to \"%s\", but model.vocab gives "
                               "it to \"%.*s\"",
                               path, ai, (int)id, content, (int)len, s);
                goto done;
            }
        }
        if (lookup_spelling(t, content, strlen(content), &have) == CAI_OK && have != id) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "%s: added_tokens[%zu] gives \"%s\" id %d, but model.vocab has it as %d",
                           path, ai, content, (int)id, (int)have);
            goto done;
        }
    }
    CAI_CALL_GOTO(cai_bpe_index(t, path), st, done);

    json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) {
        st = CAI_ERROR(CAI_ERR_FORMAT, "%s: model.merges is not an array", path);
        goto done;
    }
    json_array_foreach(merges, ai, at) {
        /* Older files write "left right", newer ones ["left", "right"]. */
        const char *left = NULL, *right = NULL;
        size_t ll = 0, rl = 0;
        if (json_is_string(at)) {
            const char *s = json_string_value(at);
            const char *sp = strchr(s, ' ');
            if (sp && sp != s && sp[1] && !strchr(sp + 1, ' ')) {
                left = s, ll = (size_t)(sp - s);
                right = sp + 1, rl = strlen(right);
            }
        } else if (json_is_array(at) && json_array_size(at) == 2 && json_is_string(json_array_get(at, 0)) &&
                   json_is_string(json_array_get(at, 1))) {
            left = json_string_value(json_array_get(at, 0)), ll = strlen(left);
            right = json_string_value(json_array_get(at, 1)), rl = strlen(right);
        }
        if (!left || !ll || !rl) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "%s: model.merges[%zu]: expected \"left right\" or [\"left\", \"right\"]",
                           path, ai);
            goto done;
        }
        char idx[4200];
        snprintf(idx, sizeof idx, "%s: model.merges[%zu]", path, ai);
        CAI_CALL_GOTO(add_merge(t, left, ll, right, rl, "model.vocab", idx, -1, &tmp), st, done);
    }
    json_array_foreach(added, ai, at) {
        CAI_CALL_GOTO(cai_bpe_mark_special(t, (int32_t)json_integer_value(json_object_get(at, "id"))), st, done);
    }
done:
    vocab_list_free(&l);
    cai_byte_buf_free(&tmp);
    if (st != CAI_OK) {
        cai_bpe_free(t);
        return st;
    }
    *out = t;
    return CAI_OK;
}

cai_status cai_bpe_load_hf(const char *path, cai_bpe_t **out) {
    CAI_CHECK_ARG(path && out, "cai_bpe_load_hf: NULL argument");
    *out = NULL;
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        FILE *f = fopen(path, "rb");
        if (!f) return CAI_ERROR(CAI_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        fclose(f);
        return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d:%d: %s", path, err.line, err.column, err.text);
    }
    cai_status st = load_hf_json(path, root, out);
    json_decref(root);
    CAI_CALL(st);
    return CAI_OK;
}

/* Whether tokenizer.json at `path` splits digits. Only a pre_tokenizer that
 * is a Sequence holding Digits is examined: directories that hold vocab.json
 * and merges.txt have always been read from those, whatever else their
 * tokenizer.json says (e.g. Qwen2's Sequence[Split, ByteLevel]). */
static cai_status hf_split_digits(const char *path, int *split_digits) {
    *split_digits = 0;
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) return CAI_ERROR(CAI_ERR_FORMAT, "%s:%d:%d: %s", path, err.line, err.column, err.text);
    cai_status st = CAI_OK;
    const json_t *v = json_is_object(root) ? json_object_get(root, "pre_tokenizer") : NULL;
    const char *type = json_is_object(v) ? json_string_value(json_object_get(v, "type")) : NULL;
    int digits = 0;
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        const json_t *p;
        json_array_foreach(json_object_get(v, "pretokenizers"), i, p) {
            const char *pt = json_is_object(p) ? json_string_value(json_object_get(p, "type")) : NULL;
            digits |= pt && strcmp(pt, "Digits") == 0;
        }
    }
    if (digits) st = check_pre_tokenizer(path, root, NULL, split_digits);
    json_decref(root);
    CAI_CALL(st);
    return CAI_OK;
}

/* ------------------------------------------------------------ saving */

static cai_status json_escape(cai_byte_buf *b, const char *s, size_t n) {
    CAI_CALL(cai_byte_buf_append(b, "\"", 1));
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            CAI_CALL(cai_byte_buf_append(b, e, 2));
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            CAI_CALL(cai_byte_buf_append(b, e, 6));
        } else {
            CAI_CALL(cai_byte_buf_append(b, s + i, 1));
        }
    }
    CAI_CALL(cai_byte_buf_append(b, "\"", 1));
    return CAI_OK;
}

static cai_status write_atomic(const char *path, const char *data, size_t len) {
    char tmp[4096];
    int w = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CAI_CHECK_ARG(w > 0 && (size_t)w < sizeof tmp, "path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return CAI_ERROR(CAI_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    int ok = fwrite(data, 1, len, f) == len;
    ok = (fflush(f) == 0) && ok;
    ok = (fsync(fileno(f)) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        int e = errno;
        remove(tmp);
        return CAI_ERROR(CAI_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return CAI_ERROR(CAI_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    return CAI_OK;
}

static cai_status render_vocab(const cai_bpe_t *t, cai_byte_buf *b) {
    CAI_CALL(cai_byte_buf_append(b, "{", 1));
    int first = 1;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!(t->flags[id] & BPE_TOKEN_PRESENT)) continue;
        size_t len;
        const char *s = bpe_tok_str(t, id, &len);
        CAI_CALL(cai_byte_buf_append(b, first ? "\n" : ",\n", first ? 1 : 2));
        first = 0;
        CAI_CALL(json_escape(b, s, len));
        char num[24];
        int k = snprintf(num, sizeof num, ": %d", (int)id);
        CAI_CALL(cai_byte_buf_append(b, num, (size_t)k));
    }
    CAI_CALL(cai_byte_buf_append(b, "\n}\n", 3));
    return CAI_OK;
}

static cai_status render_merges(const cai_bpe_t *t, cai_byte_buf *b) {
    CAI_CALL(cai_byte_buf_append(b, "#version: 0.2\n", 14));
    for (size_t i = 0; i < t->n_merges; i++) {
        size_t la, lb;
        const char *a = bpe_tok_str(t, t->merges[i].a, &la), *c = bpe_tok_str(t, t->merges[i].b, &lb);
        CAI_CALL(cai_byte_buf_append(b, a, la));
        CAI_CALL(cai_byte_buf_append(b, " ", 1));
        CAI_CALL(cai_byte_buf_append(b, c, lb));
        CAI_CALL(cai_byte_buf_append(b, "\n", 1));
    }
    return CAI_OK;
}

static cai_status set_new(json_t *obj, const char *key, json_t *v) {
    if (!v || json_object_set_new(obj, key, v) != 0)
        return CAI_ERROR(CAI_ERR_NOMEM, "cannot build tokenizer.json field \"%s\"", key);
    return CAI_OK;
}

static json_t *byte_level(int add_prefix_space, int trim_offsets) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", add_prefix_space, "trim_offsets",
                     trim_offsets, "use_regex", 1);
}

static json_t *pre_tokenizer(const cai_bpe_t *t) {
    if (!t->split_digits) return byte_level(t->add_prefix_space, 1);
    return json_pack("{s:s, s:[{s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Digits",
                     "individual_digits", 1, byte_level(0, 1));
}

static cai_status render_hf(const cai_bpe_t *t, char **text) {
    json_t *root = json_object(), *added = json_array(), *vocab = json_object(), *merges = json_array();
    json_t *model = json_object();
    cai_status st = CAI_OK;
    cai_byte_buf pair = {0};
    if (!root || !added || !vocab || !merges || !model) {
        json_decref(added), json_decref(vocab), json_decref(merges), json_decref(model);
        st = CAI_ERROR(CAI_ERR_NOMEM, "cannot build tokenizer.json");
        goto done;
    }
    CAI_CALL_GOTO(set_new(root, "version", json_string("1.0")), st, done);
    CAI_CALL_GOTO(set_new(root, "truncation", json_null()), st, done);
    CAI_CALL_GOTO(set_new(root, "padding", json_null()), st, done);
    CAI_CALL_GOTO(set_new(root, "added_tokens", added), st, done);
    CAI_CALL_GOTO(set_new(root, "normalizer", json_null()), st, done);
    CAI_CALL_GOTO(set_new(root, "pre_tokenizer", pre_tokenizer(t)), st, done);
    CAI_CALL_GOTO(set_new(root, "post_processor", byte_level(1, 0)), st, done);
    CAI_CALL_GOTO(set_new(root, "decoder", byte_level(1, 1)), st, done);
    CAI_CALL_GOTO(set_new(root, "model", model), st, done);
    for (size_t k = 0; k < t->n_special; k++) {
        size_t len;
        int32_t id = t->special_ids[k];
        const char *s = bpe_tok_str(t, id, &len);
        json_t *e = json_pack("{s:i, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", (int)id, "content", s, len, "single_word",
                              0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
        if (!e || json_array_append_new(added, e) != 0) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "special token %d is not valid UTF-8; tokenizer.json cannot hold it",
                           (int)id);
            goto done;
        }
    }
    CAI_CALL_GOTO(set_new(model, "type", json_string("BPE")), st, done);
    CAI_CALL_GOTO(set_new(model, "dropout", json_null()), st, done);
    CAI_CALL_GOTO(set_new(model, "unk_token", json_null()), st, done);
    CAI_CALL_GOTO(set_new(model, "continuing_subword_prefix", json_string("")), st, done);
    CAI_CALL_GOTO(set_new(model, "end_of_word_suffix", json_string("")), st, done);
    CAI_CALL_GOTO(set_new(model, "fuse_unk", json_false()), st, done);
    CAI_CALL_GOTO(set_new(model, "byte_fallback", json_false()), st, done);
    CAI_CALL_GOTO(set_new(model, "ignore_merges", json_boolean(t->ignore_merges)), st, done);
    CAI_CALL_GOTO(set_new(model, "vocab", vocab), st, done);
    CAI_CALL_GOTO(set_new(model, "merges", merges), st, done);
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!(t->flags[id] & BPE_TOKEN_PRESENT)) continue;
        size_t len;
        const char *s = bpe_tok_str(t, id, &len);
        pair.len = 0;
        CAI_CALL_GOTO(cai_byte_buf_append(&pair, s, len), st, done);
        CAI_CALL_GOTO(cai_byte_buf_append(&pair, "", 1), st, done);
        if (json_object_set_new(vocab, pair.data, json_integer(id)) != 0) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "token %d is not valid UTF-8; tokenizer.json cannot hold it", (int)id);
            goto done;
        }
    }
    for (size_t i = 0; i < t->n_merges; i++) {
        size_t la, lb;
        const char *a = bpe_tok_str(t, t->merges[i].a, &la), *b = bpe_tok_str(t, t->merges[i].b, &lb);
        pair.len = 0;
        CAI_CALL_GOTO(cai_byte_buf_append(&pair, a, la), st, done);
        CAI_CALL_GOTO(cai_byte_buf_append(&pair, " ", 1), st, done);
        CAI_CALL_GOTO(cai_byte_buf_append(&pair, b, lb), st, done);
        json_t *m = json_stringn(pair.data, pair.len);
        if (!m || json_array_append_new(merges, m) != 0) {
            st = CAI_ERROR(CAI_ERR_FORMAT, "merge %zu is not valid UTF-8; tokenizer.json cannot hold it", i);
            goto done;
        }
    }
    *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    if (!*text) st = CAI_ERROR(CAI_ERR_NOMEM, "cannot render tokenizer.json");
done:
    cai_byte_buf_free(&pair);
    json_decref(root);
    return st;
}

cai_status cai_bpe_save(const cai_bpe_t *t, const char *dir) {
    CAI_CHECK_ARG(t && dir, "cai_bpe_save: NULL argument");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return CAI_ERROR(CAI_ERR_IO, "cannot create directory %s: %s", dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return CAI_ERROR(CAI_ERR_IO, "%s exists and is not a directory", dir);
    char path[4096];
    cai_byte_buf b = {0};
    char *hf = NULL;
    cai_status st;
    CAI_CALL_GOTO(render_vocab(t, &b), st, done);
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    CAI_CALL_GOTO(write_atomic(path, b.data, b.len), st, done);
    b.len = 0;
    CAI_CALL_GOTO(render_merges(t, &b), st, done);
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    CAI_CALL_GOTO(write_atomic(path, b.data, b.len), st, done);
    CAI_CALL_GOTO(render_hf(t, &hf), st, done);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CAI_CALL_GOTO(write_atomic(path, hf, strlen(hf)), st, done);
done:
    cai_byte_buf_free(&b);
    free(hf);
    return st;
}

cai_status cai_bpe_load_dir(const char *dir, cai_bpe_t **out) {
    CAI_CHECK_ARG(dir && out, "cai_bpe_load_dir: NULL argument");
    char vocab[4096], merges[4096], hf[4096];
    if (snprintf(vocab, sizeof vocab, "%s/vocab.json", dir) >= (int)sizeof vocab ||
        snprintf(merges, sizeof merges, "%s/merges.txt", dir) >= (int)sizeof merges ||
        snprintf(hf, sizeof hf, "%s/tokenizer.json", dir) >= (int)sizeof hf)
        return CAI_ERROR(CAI_ERR_CONFIG, "tokenizer directory: path too long (%zu bytes)", strlen(dir));
    if (access(vocab, R_OK) != 0 && access(hf, R_OK) == 0) return cai_bpe_load_hf(hf, out);
    CAI_CALL(cai_bpe_load(vocab, merges, out));
    if (access(hf, R_OK) != 0) return CAI_OK;
    /* vocab.json + merges.txt cannot record digit splitting; the
     * tokenizer.json written beside them does. */
    int split_digits = 0;
    cai_status st = hf_split_digits(hf, &split_digits);
    if (st != CAI_OK) {
        cai_bpe_free(*out);
        *out = NULL;
        CAI_CALL(st);
    }
    (*out)->split_digits = split_digits;
    return CAI_OK;
}
