/* Typed, table-driven configuration: one struct per app plus one table of
 * fields describing it. The same table parses YAML files, parses CLI
 * overrides (--train.lr=3e-4), prints --help and dumps the effective config,
 * so documentation and parsing can never disagree. Not collective. */
#ifndef COLOSSAL_CONFIG_H
#define COLOSSAL_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "colossal/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CAI_CFG_BOOL,   /* int field, 0/1; YAML true/false, CLI --key alone means true */
    CAI_CFG_INT,    /* int */
    CAI_CFG_INT64,  /* int64_t */
    CAI_CFG_DOUBLE, /* double */
    CAI_CFG_STRING, /* char * owned by the struct (cai_config_free releases it) */
    CAI_CFG_ENUM    /* int index into `choices` */
} cai_config_type;

typedef struct {
    const char *key;           /* dotted path, e.g. "train.lr" <-> YAML train: {lr: ...} */
    cai_config_type type;
    size_t offset;             /* offsetof(app struct, field) */
    const char *default_value; /* text, parsed by the same code as user input; NULL = empty string / 0 */
    const char *doc;           /* one line for --help */
    double min, max;           /* inclusive range for numbers; not checked when min > max */
    const char *const *choices;/* NULL-terminated list for CAI_CFG_ENUM */
    const char *alias;         /* optional short CLI name, e.g. "tp" for "mesh.tp" */
} cai_config_field;

typedef struct {
    const char *program;       /* "colossal-pretrain" */
    const char *summary;       /* one line for --help */
    const cai_config_field *fields;
    size_t nfields;
} cai_config_schema;

#define CAI_CFG_NO_RANGE 1.0, 0.0

/* Set every field to its default. Strings are allocated. */
cai_status cai_config_defaults(const cai_config_schema *schema, void *cfg);
/* Apply a YAML file (nested mappings; keys are the dotted path's parts).
 * Errors name the file, line and key: unknown key, wrong type, out of range. */
cai_status cai_config_load_yaml(const cai_config_schema *schema, void *cfg, const char *path);
/* Same, from a string; `name` stands in for the file name in errors. */
cai_status cai_config_load_yaml_string(const cai_config_schema *schema, void *cfg, const char *text,
                                       const char *name);
/* Set one key from text; `source` ("command line", "file.yaml:12") goes into errors. */
cai_status cai_config_set(const cai_config_schema *schema, void *cfg, const char *key, const char *value,
                          const char *source);

/* Parse argv: defaults, then --config FILE (YAML), then every --key=value /
 * --key value / --bool-key override in order. `--help` sets *help_requested
 * and stops. Positional arguments are errors. */
cai_status cai_config_parse_args(const cai_config_schema *schema, void *cfg, int argc, char **argv,
                                 int *help_requested);

/* --help text: usage, then each key with type, default and doc. */
void cai_config_print_help(const cai_config_schema *schema, FILE *out);
/* Effective config as YAML that cai_config_load_yaml accepts back. */
cai_status cai_config_write(const cai_config_schema *schema, const void *cfg, FILE *out);
/* Write `dir`/config.yaml, creating `dir` if needed. */
cai_status cai_config_write_file(const cai_config_schema *schema, const void *cfg, const char *dir);
const cai_config_field *cai_config_find(const cai_config_schema *schema, const char *key);
void cai_config_free(const cai_config_schema *schema, void *cfg);

#ifdef __cplusplus
}
#endif
#endif
