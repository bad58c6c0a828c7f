/* Command line side of the config: argv -> overrides on top of the YAML
 * files, and the --help text generated from the same table. */
#include "cai_config.h"

#include "config_internal.h"

#include <string.h>

#define CLI "command line"

typedef struct {
    const cai_config_field *field; /* NULL for --config */
    const char *value;             /* points into argv or a literal */
} cli_item;

static int is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

static int is_config_flag(const char *name, size_t len) { return len == 6 && !strncmp(name, "config", 6); }

/* Turn argv[i] (and maybe argv[i+1]) into one item; *i advances past what
 * was consumed. Every problem with the shape of the command line is found
 * here, before anything is applied. */
static cai_status next_item(const cai_config_schema *schema, int argc, char **argv, int *i, cli_item *item) {
    const char *arg = argv[*i];
    if (arg[0] != '-' || arg[1] == 0 || (arg[1] != '-' && (arg[1] == '.' || (arg[1] >= '0' && arg[1] <= '9'))))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         CLI
                         ": unexpected positional argument '%s' (settings are --KEY=VALUE; "
                         "see --help)",
                         arg);
    if (arg[1] != '-')
        return CAI_ERROR(CAI_ERR_CONFIG, CLI ": unknown option '%s' (options are --KEY=VALUE; see --help)", arg);
    if (arg[2] == 0) {
        if (*i + 1 < argc)
            return CAI_ERROR(CAI_ERR_CONFIG, CLI ": unexpected positional argument '%s' after '--'", argv[*i + 1]);
        (*i)++;
        item->field = NULL;
        item->value = NULL;
        return CAI_OK;
    }
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const char *attached = eq ? eq + 1 : NULL;
    (*i)++;

    const cai_config_field *f = NULL;
    int negated = 0;
    if (!is_config_flag(name, len)) {
        f = cai_cfg_lookup(schema, name, len);
        if (!f && len > 3 && !strncmp(name, "no-", 3)) {
            f = cai_cfg_lookup(schema, name + 3, len - 3);
            if (f && f->type != CAI_CFG_BOOL)
                return CAI_ERROR(CAI_ERR_CONFIG, CLI ": '--%.*s': only bool keys have a --no- form, '%s' is a %s",
                                 (int)len, name, f->key, cai_cfg_type_name(f->type));
            negated = f != NULL;
        }
        if (!f) {
            char unknown[512];
            snprintf(unknown, sizeof unknown, "%.*s", (int)len, name);
            return cai_cfg_unknown_key(schema, CLI, unknown, "--");
        }
    }
    item->field = f;
    if (f && f->type == CAI_CFG_BOOL) {
        if (negated) {
            if (attached)
                return CAI_ERROR(CAI_ERR_CONFIG, CLI ": '--%.*s' takes no value; use --%s=%s", (int)len, name, f->key,
                                 attached);
            item->value = "false";
            return CAI_OK;
        }
        int dummy;
        if (attached) item->value = attached;
        else if (*i < argc && cai_cfg_parse_bool(argv[*i], &dummy))
            item->value = argv[(*i)++]; /* "--fused false": no positionals exist, so this is unambiguous */
        else item->value = "true";
        return CAI_OK;
    }
    if (attached) {
        item->value = attached;
        return CAI_OK;
    }
    /* Values may start with '-' (negative numbers) but not "--": a missing
     * value followed by the next option is a far likelier mistake. */
    if (*i >= argc || !strncmp(argv[*i], "--", 2))
        return CAI_ERROR(CAI_ERR_CONFIG, CLI ": '--%.*s' needs a value (--%.*s=VALUE or --%.*s VALUE)", (int)len, name,
                         (int)len, name, (int)len, name);
    item->value = argv[(*i)++];
    return CAI_OK;
}

cai_status cai_config_parse_args(const cai_config_schema *schema, void *cfg, int argc, char **argv,
                                 int *help_requested) {
    CAI_CHECK_ARG(schema && cfg && (argc <= 0 || argv), "cai_config_parse_args: NULL schema, cfg or argv");
    if (help_requested) *help_requested = 0;
    CAI_CALL(cai_config_defaults(schema, cfg));
    if (help_requested)
        for (int i = 1; i < argc; i++)
            if (is_help(argv[i])) {
                *help_requested = 1;
                return CAI_OK;
            }
    /* Pass 1: check the whole command line's shape, then apply the files;
     * pass 2: the overrides, so CLI beats YAML wherever --config stands. */
    cli_item item;
    for (int i = 1; i < argc;) {
        CAI_CALL(next_item(schema, argc, argv, &i, &item));
        if (item.field) CAI_CALL(cai_cfg_apply(item.field, cfg, item.value, CLI, 1));
    }
    for (int i = 1; i < argc;) {
        CAI_CALL(next_item(schema, argc, argv, &i, &item));
        if (!item.field && item.value) CAI_CALL(cai_config_load_yaml(schema, cfg, item.value));
    }
    for (int i = 1; i < argc;) {
        CAI_CALL(next_item(schema, argc, argv, &i, &item));
        if (item.field) CAI_CALL(cai_cfg_apply(item.field, cfg, item.value, CLI, 0));
    }
    return CAI_OK;
}

/* ------------------------------------------------------------ --help */

static void flag_text(const cai_config_field *f, char *buf, size_t cap) {
    char type[256];
    if (f->type == CAI_CFG_ENUM) {
        size_t o = 0;
        for (int i = 0; f->choices[i] && o < sizeof type; i++) {
            int w = snprintf(type + o, sizeof type - o, "%s%s", i ? "|" : "{", f->choices[i]);
            if (w > 0) o += (size_t)w;
        }
        if (o < sizeof type - 1) snprintf(type + o, sizeof type - o, "}");
    } else if (f->type == CAI_CFG_BOOL) {
        snprintf(type, sizeof type, "[=bool]");
    } else {
        snprintf(type, sizeof type, "%s", cai_cfg_type_name(f->type));
    }
    const char *sep = f->type == CAI_CFG_BOOL ? "" : " ";
    if (f->alias) snprintf(buf, cap, "--%s, --%s%s%s", f->key, f->alias, sep, type);
    else snprintf(buf, cap, "--%s%s%s", f->key, sep, type);
}

static size_t section_len(const char *key) {
    const char *dot = strchr(key, '.');
    return dot ? (size_t)(dot - key) : 0;
}

void cai_config_print_help(const cai_config_schema *schema, FILE *out) {
    if (!schema || !out) return;
    const char *prog = schema->program ? schema->program : "program";
    fprintf(out, "Usage: %s [--config FILE.yaml] [--KEY=VALUE | --KEY VALUE | --BOOL-KEY | --no-BOOL-KEY]...\n", prog);
    if (schema->summary) fprintf(out, "%s\n", schema->summary);
    fprintf(out,
            "\nPrecedence: defaults < --config files (in order) < command-line settings (in order).\n"
            "In YAML, nested mappings spell the dotted key: train: {lr: 3e-4} sets train.lr.\n\n"
            "  --config FILE       YAML file of settings (may repeat)\n"
            "  --help, -h          print this help and exit\n");
    /* Group by first dotted part in order of first appearance; the
     * top-level keys (no dot) come first. */
    int width = 20;
    char flag[512];
    for (size_t i = 0; i < schema->nfields; i++) {
        flag_text(&schema->fields[i], flag, sizeof flag);
        int w = (int)strlen(flag);
        if (w > width && w <= 44) width = w;
    }
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < schema->nfields; i++) {
            const cai_config_field *f = &schema->fields[i];
            size_t sec = section_len(f->key);
            if ((pass == 0) != (sec == 0)) continue;
            int seen = 0;
            for (size_t j = 0; j < i && !seen; j++)
                seen = section_len(schema->fields[j].key) == sec && !strncmp(schema->fields[j].key, f->key, sec);
            if (seen) continue;
            fprintf(out, "\n%.*s%s\n", (int)sec, f->key, sec ? ":" : "settings:");
            for (size_t k = i; k < schema->nfields; k++) {
                const cai_config_field *g = &schema->fields[k];
                if (section_len(g->key) != sec || strncmp(g->key, f->key, sec)) continue;
                char def[128], range[96] = "";
                cai_cfg_format_default(g, def, sizeof def);
                if ((g->type == CAI_CFG_INT || g->type == CAI_CFG_INT64 || g->type == CAI_CFG_DOUBLE) &&
                    g->min < g->max)
                    snprintf(range, sizeof range, ", range [%.17g, %.17g]", g->min, g->max);
                flag_text(g, flag, sizeof flag);
                if ((int)strlen(flag) > width)
                    fprintf(out, "  %s\n  %*s  %s (default: %s%s)\n", flag, width, "", g->doc, def, range);
                else fprintf(out, "  %-*s  %s (default: %s%s)\n", width, flag, g->doc, def, range);
            }
        }
    }
}
