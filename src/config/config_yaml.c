/* YAML side of the config: load a file or string through libyaml's document
 * API (node marks carry the line numbers errors cite) and write the
 * effective config back as nested YAML. */
#include "cai_config.h"

#include "config_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <yaml.h>

#define PATH_CAP 512

typedef struct {
    const cai_config_schema *schema;
    void *cfg;
    const char *name;
    yaml_document_t *doc;
    int dry_run;
    size_t *set_line; /* per field: line where this document set it, 0 = not yet */
} walk_ctx;

static size_t line_of(const yaml_node_t *node) { return node->start_mark.line + 1; }

static const char *node_kind(const yaml_node_t *node) {
    switch (node->type) {
    case YAML_SEQUENCE_NODE: return "a sequence";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "a scalar";
    }
}

/* A plain empty, ~ or null scalar: YAML's null. */
static int is_null_scalar(const yaml_node_t *node) {
    if (node->type != YAML_SCALAR_NODE || node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *v = (const char *)node->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

/* Scalars with an escaped NUL would be cut short by every C string below. */
static int has_nul(const yaml_node_t *node) {
    return strlen((const char *)node->data.scalar.value) != node->data.scalar.length;
}

static cai_status walk_mapping(walk_ctx *c, const yaml_node_t *map, const char *prefix);

static cai_status walk_leaf(walk_ctx *c, const cai_config_field *f, const yaml_node_t *val, const char *src) {
    size_t idx = (size_t)(f - c->schema->fields);
    if (c->set_line[idx])
        return CAI_ERROR(CAI_ERR_CONFIG, "%s: key '%s' is set twice in one file (first at line %zu)", src, f->key,
                         c->set_line[idx]);
    c->set_line[idx] = line_of(val);
    if (val->type != YAML_SCALAR_NODE)
        return CAI_ERROR(CAI_ERR_CONFIG, "%s: key '%s': expected %s, got %s", src, f->key, cai_cfg_type_phrase(f->type),
                         node_kind(val));
    if (has_nul(val)) return CAI_ERROR(CAI_ERR_CONFIG, "%s: key '%s': value contains a NUL character", src, f->key);
    const char *text = (const char *)val->data.scalar.value;
    if (is_null_scalar(val)) {
        if (f->type != CAI_CFG_STRING)
            return CAI_ERROR(CAI_ERR_CONFIG, "%s: key '%s': expected %s, got an empty (null) value", src, f->key,
                             cai_cfg_type_phrase(f->type));
        text = "";
    }
    CAI_CALL(cai_cfg_apply(f, c->cfg, text, src, c->dry_run));
    return CAI_OK;
}

static cai_status walk_pair(walk_ctx *c, const yaml_node_pair_t *pair, const yaml_node_pair_t *first,
                            const char *prefix) {
    const yaml_node_t *key = yaml_document_get_node(c->doc, pair->key);
    const yaml_node_t *val = yaml_document_get_node(c->doc, pair->value);
    char src[PATH_CAP + 32];
    snprintf(src, sizeof src, "%s:%zu", c->name, line_of(key));
    if (key->type != YAML_SCALAR_NODE || has_nul(key))
        return CAI_ERROR(CAI_ERR_CONFIG, "%s: keys must be plain names, got %s", src, node_kind(key));
    const char *name = (const char *)key->data.scalar.value;
    for (const yaml_node_pair_t *p = first; p < pair; p++) {
        const yaml_node_t *other = yaml_document_get_node(c->doc, p->key);
        if (other->type == YAML_SCALAR_NODE &&
            cai_cfg_key_eq((const char *)other->data.scalar.value, name, strlen(name)))
            return CAI_ERROR(CAI_ERR_CONFIG, "%s: duplicate key '%s%s%s' (first at line %zu)", src, prefix,
                             *prefix ? "." : "", name, line_of(other));
    }
    char path[PATH_CAP];
    int w = snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", name);
    if (w < 0 || (size_t)w >= sizeof path)
        return CAI_ERROR(CAI_ERR_CONFIG, "%s: key path longer than %d characters", src, PATH_CAP - 1);
    const cai_config_field *f = cai_cfg_lookup(c->schema, path, strlen(path));
    if (f) {
        snprintf(src, sizeof src, "%s:%zu", c->name, line_of(val));
        CAI_CALL(walk_leaf(c, f, val, src));
        return CAI_OK;
    }
    if (*path && cai_cfg_is_section(c->schema, path, strlen(path))) {
        if (val->type == YAML_MAPPING_NODE) {
            CAI_CALL(walk_mapping(c, val, path));
            return CAI_OK;
        }
        if (is_null_scalar(val)) return CAI_OK; /* "train:" with nothing under it */
        return CAI_ERROR(CAI_ERR_CONFIG, "%s: '%s' is a section: expected a mapping of its keys, got %s", src, path,
                         node_kind(val));
    }
    return cai_cfg_unknown_key(c->schema, src, path, "");
}

static cai_status walk_mapping(walk_ctx *c, const yaml_node_t *map, const char *prefix) {
    const yaml_node_pair_t *first = map->data.mapping.pairs.start;
    for (const yaml_node_pair_t *p = first; p < map->data.mapping.pairs.top; p++)
        CAI_CALL(walk_pair(c, p, first, prefix));
    return CAI_OK;
}

static cai_status parser_error(const yaml_parser_t *p, const char *name) {
    if (p->error == YAML_MEMORY_ERROR) return CAI_ERROR(CAI_ERR_NOMEM, "%s: out of memory while reading YAML", name);
    if (p->error == YAML_READER_ERROR)
        return CAI_ERROR(CAI_ERR_CONFIG, "%s: malformed YAML at byte %zu: %s", name, p->problem_offset,
                         p->problem ? p->problem : "unreadable input");
    char context[160] = "";
    if (p->context) snprintf(context, sizeof context, " (%s at line %zu)", p->context, p->context_mark.line + 1);
    return CAI_ERROR(CAI_ERR_CONFIG, "%s:%zu:%zu: malformed YAML: %s%s", name, p->problem_mark.line + 1,
                     p->problem_mark.column + 1, p->problem ? p->problem : "syntax error", context);
}

static cai_status walk_document(walk_ctx *c) {
    const yaml_node_t *root = yaml_document_get_root_node(c->doc);
    if (!root || is_null_scalar(root)) return CAI_OK;
    if (root->type != YAML_MAPPING_NODE)
        return CAI_ERROR(CAI_ERR_CONFIG, "%s:%zu: the top level must be a mapping of keys, got %s", c->name,
                         line_of(root), node_kind(root));
    memset(c->set_line, 0, c->schema->nfields * sizeof *c->set_line);
    CAI_CALL(walk_mapping(c, root, ""));
    return CAI_OK;
}

/* Load one document, check all of it without touching cfg, then apply it, so
 * a bad file leaves the config as it was. */
static cai_status load_from_parser(const cai_config_schema *schema, void *cfg, yaml_parser_t *parser,
                                   const char *name) {
    yaml_document_t doc, extra;
    if (!yaml_parser_load(parser, &doc)) return parser_error(parser, name);
    cai_status st = CAI_OK;
    size_t *set_line = calloc(schema->nfields ? schema->nfields : 1, sizeof *set_line);
    if (!set_line) {
        yaml_document_delete(&doc);
        return CAI_ERROR(CAI_ERR_NOMEM, "%s: cannot allocate %zu key slots", name, schema->nfields);
    }
    if (yaml_document_get_root_node(&doc)) {
        if (!yaml_parser_load(parser, &extra)) {
            st = parser_error(parser, name);
            goto done;
        }
        const yaml_node_t *second = yaml_document_get_root_node(&extra);
        size_t second_line = second ? line_of(second) : 0;
        yaml_document_delete(&extra);
        if (second) {
            st = CAI_ERROR(CAI_ERR_CONFIG, "%s:%zu: a config file holds one YAML document, found a second", name,
                           second_line);
            goto done;
        }
    }
    walk_ctx c = {schema, cfg, name, &doc, 1, set_line};
    CAI_CALL_GOTO(walk_document(&c), st, done);
    c.dry_run = 0;
    CAI_CALL_GOTO(walk_document(&c), st, done);
done:
    free(set_line);
    yaml_document_delete(&doc);
    return st;
}

cai_status cai_config_load_yaml_string(const cai_config_schema *schema, void *cfg, const char *text, const char *name) {
    CAI_CHECK_ARG(schema && cfg && text, "cai_config_load_yaml_string: NULL schema, cfg or text");
    if (!name) name = "<string>";
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return CAI_ERROR(CAI_ERR_NOMEM, "%s: cannot create a YAML parser", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    cai_status st = load_from_parser(schema, cfg, &parser, name);
    yaml_parser_delete(&parser);
    if (st != CAI_OK) cai_error_push(__FILE__, __LINE__, __func__, "load_from_parser()");
    return st;
}

cai_status cai_config_load_yaml(const cai_config_schema *schema, void *cfg, const char *path) {
    CAI_CHECK_ARG(schema && cfg && path, "cai_config_load_yaml: NULL schema, cfg or path");
    FILE *fp = fopen(path, "rb");
    if (!fp) return CAI_ERROR(CAI_ERR_IO, "cannot open config file '%s': %s", path, strerror(errno));
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        fclose(fp);
        return CAI_ERROR(CAI_ERR_NOMEM, "%s: cannot create a YAML parser", path);
    }
    yaml_parser_set_input_file(&parser, fp);
    cai_status st = load_from_parser(schema, cfg, &parser, path);
    yaml_parser_delete(&parser);
    fclose(fp);
    if (st != CAI_OK) cai_error_push(__FILE__, __LINE__, __func__, "load_from_parser()");
    return st;
}

/* ------------------------------------------------------------ writing */

/* Next code point of valid UTF-8 (no overlongs, surrogates or > U+10FFFF);
 * returns its length in bytes, 0 when invalid. */
static size_t utf8_next(const unsigned char *s, uint32_t *cp) {
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 0;
    if (!n || s[0] > 0xf4) return 0;
    uint32_t v = s[0] & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_cp[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return n;
}

/* Double-quoted YAML scalar. Everything YAML would fold or refuse (control
 * characters, DEL, C1 controls, the Unicode line separators, non-characters)
 * is escaped so the string reads back byte for byte. */
static int write_quoted(FILE *out, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    fputc('"', out);
    while (*s) {
        uint32_t cp;
        size_t n = utf8_next(s, &cp);
        if (!n) return 0;
        if (cp == '"' || cp == '\\') fprintf(out, "\\%c", (char)cp);
        else if (cp == '\n') fputs("\\n", out);
        else if (cp == '\t') fputs("\\t", out);
        else if (cp == '\r') fputs("\\r", out);
        else if (cp == 0x85) fputs("\\N", out);
        else if (cp == 0x2028) fputs("\\L", out);
        else if (cp == 0x2029) fputs("\\P", out);
        else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) fprintf(out, "\\x%02x", (unsigned)cp);
        else if (cp == 0xfffe || cp == 0xffff) fprintf(out, "\\u%04x", (unsigned)cp);
        else fwrite(s, 1, n, out);
        s += n;
    }
    fputc('"', out);
    return 1;
}

static cai_status write_value(FILE *out, const cai_config_field *f, const void *cfg) {
    char buf[64];
    if (f->type == CAI_CFG_STRING) {
        const char *s = *(char *const *)((const char *)cfg + f->offset);
        if (!write_quoted(out, s ? s : ""))
            return CAI_ERROR(CAI_ERR_CONFIG, "key '%s': the string is not valid UTF-8, YAML cannot hold it", f->key);
        return CAI_OK;
    }
    cai_config_format(f, cfg, buf, sizeof buf);
    if (f->type == CAI_CFG_ENUM && !cai_cfg_plain_safe(buf)) {
        if (!write_quoted(out, buf))
            return CAI_ERROR(CAI_ERR_CONFIG, "key '%s': enum choice is not valid UTF-8", f->key);
        return CAI_OK;
    }
    fputs(buf, out);
    return CAI_OK;
}

/* Emit the keys below `prefix` (plen bytes of some key; 0 = top level) in
 * table order, opening each sub-section where its first key appears. */
static cai_status write_level(FILE *out, const cai_config_schema *schema, const void *cfg, const char *prefix,
                              size_t plen, int depth) {
    for (size_t i = 0; i < schema->nfields; i++) {
        const cai_config_field *f = &schema->fields[i];
        if (plen && (strncmp(f->key, prefix, plen) || f->key[plen] != '.')) continue;
        const char *rest = f->key + (plen ? plen + 1 : 0);
        const char *dot = strchr(rest, '.');
        if (!dot) {
            fprintf(out, "%*s%s: ", 2 * depth, "", rest);
            CAI_CALL(write_value(out, f, cfg));
            fprintf(out, "  # %s\n", f->doc);
            continue;
        }
        size_t part = (size_t)(dot - rest);
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) {
            const char *k = schema->fields[j].key;
            seen = (!plen || (!strncmp(k, prefix, plen) && k[plen] == '.')) &&
                   !strncmp(k + (plen ? plen + 1 : 0), rest, part) && k[(plen ? plen + 1 : 0) + part] == '.';
        }
        if (seen) continue;
        fprintf(out, "%*s%.*s:\n", 2 * depth, "", (int)part, rest);
        CAI_CALL(write_level(out, schema, cfg, f->key, (size_t)(dot - f->key), depth + 1));
    }
    return CAI_OK;
}

cai_status cai_config_write(const cai_config_schema *schema, const void *cfg, FILE *out) {
    CAI_CHECK_ARG(schema && cfg && out, "cai_config_write: NULL schema, cfg or stream");
    fprintf(out, "# effective configuration of %s (colossal %s)\n", schema->program ? schema->program : "colossal",
            cai_version_string());
    CAI_CALL(write_level(out, schema, cfg, "", 0, 0));
    if (fflush(out) != 0 || ferror(out))
        return CAI_ERROR(CAI_ERR_IO, "writing the configuration failed: %s", strerror(errno));
    return CAI_OK;
}

cai_status cai_config_write_string(const cai_config_schema *schema, const void *cfg, char **out) {
    CAI_CHECK_ARG(out, "cai_config_write_string: NULL out");
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) return CAI_ERROR(CAI_ERR_NOMEM, "cannot open a memory stream for the configuration");
    cai_status st = cai_config_write(schema, cfg, mem);
    fclose(mem);
    if (st != CAI_OK) {
        free(buf);
        cai_error_push(__FILE__, __LINE__, __func__, "cai_config_write(schema, cfg, mem)");
        return st;
    }
    *out = buf;
    return CAI_OK;
}

static cai_status mkdir_p(const char *dir) {
    size_t n = strlen(dir);
    char *path = malloc(n + 1);
    if (!path) return CAI_ERROR(CAI_ERR_NOMEM, "cannot copy directory name '%s'", dir);
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != 0) continue;
        char saved = path[i];
        path[i] = 0;
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            cai_status st = CAI_ERROR(CAI_ERR_IO, "cannot create directory '%s': %s", path, strerror(errno));
            free(path);
            return st;
        }
        path[i] = saved;
    }
    free(path);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return CAI_ERROR(CAI_ERR_IO, "'%s' exists and is not a directory", dir);
    return CAI_OK;
}

cai_status cai_config_write_file(const cai_config_schema *schema, const void *cfg, const char *dir) {
    CAI_CHECK_ARG(schema && cfg && dir && *dir, "cai_config_write_file: NULL schema or cfg, or empty directory");
    CAI_CALL(mkdir_p(dir));
    size_t n = strlen(dir) + 32;
    char *final = malloc(n), *tmp = malloc(n);
    cai_status st = CAI_OK;
    FILE *fp = NULL;
    if (!final || !tmp) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "cannot build file names under '%s'", dir);
        goto done;
    }
    snprintf(final, n, "%s/config.yaml", dir);
    snprintf(tmp, n, "%s/config.yaml.tmp", dir);
    fp = fopen(tmp, "w");
    if (!fp) {
        st = CAI_ERROR(CAI_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
        goto done;
    }
    st = cai_config_write(schema, cfg, fp);
    if (st != CAI_OK) { /* name the file (a full disk) */
        char why[512];
        snprintf(why, sizeof why, "%s", cai_error_message());
        st = CAI_ERROR(st, "cannot write '%s': %s", tmp, why);
        goto done;
    }
    if (fsync(fileno(fp)) != 0) {
        st = CAI_ERROR(CAI_ERR_IO, "cannot sync '%s': %s", tmp, strerror(errno));
        goto done;
    }
    int rc = fclose(fp);
    fp = NULL;
    if (rc != 0) {
        st = CAI_ERROR(CAI_ERR_IO, "cannot close '%s': %s", tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, final) != 0)
        st = CAI_ERROR(CAI_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
done:
    if (fp) fclose(fp);
    if (st != CAI_OK && tmp) remove(tmp);
    free(final);
    free(tmp);
    return st;
}
