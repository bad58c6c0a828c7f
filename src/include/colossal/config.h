/* Typed, table-driven configuration: one struct per app plus one table of
 * fields describing it. The same table parses YAML files, parses CLI
 * overrides (--train.lr=3e-4), prints --help and dumps the effective config,
 * so documentation and parsing can never disagree. Nothing here is
 * collective: every rank parses the same argv and file and reaches the same
 * result, and errors are decided identically everywhere. See docs/config.md. */
#ifndef COLOSSAL_CONFIG_H
#define COLOSSAL_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "colossal/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CAI_CFG_BOOL,   /* int field, 0/1; true/false yes/no on/off 1/0; CLI --key alone means true,
                       --no-key false */
    CAI_CFG_INT,    /* int, decimal only: "1.5", "1e3", "12abc" and overflow are errors */
    CAI_CFG_INT64,  /* int64_t, same rules */
    CAI_CFG_DOUBLE, /* double, finite */
    CAI_CFG_STRING, /* char * owned by the struct, never NULL after cai_config_defaults
                       (empty string for a NULL default); cai_config_free releases it */
    CAI_CFG_ENUM,   /* int index into `choices`; matched case-insensitively */
    CAI_CFG_BYTES   /* int64_t byte count: "123", "1.5GB", "800M", "3GiB" (cai_config_parse_bytes); the
                       words in `choices`, if any, are accepted too and stored as CAI_CFG_BYTES_WORD(i)
                       (e.g. {"auto", NULL}: "auto" -> CAI_CFG_BYTES_WORD(0) == -1); min/max bound the bytes */
} cai_config_type;

/* The value a CAI_CFG_BYTES field holds for its i-th word (negative, so never a size). */
#define CAI_CFG_BYTES_WORD(i) (-1 - (int64_t)(i))
/* The usual single word of a CAI_CFG_BYTES field: {"auto", NULL}. */
#define CAI_CFG_BYTES_AUTO CAI_CFG_BYTES_WORD(0)
extern const char *const cai_config_bytes_auto[];

typedef struct {
    const char *key; /* dotted path, e.g. "train.lr" <-> YAML train: {lr: ...}; parts are
                        [A-Za-z0-9_-]+, '-' and '_' are interchangeable when matching */
    cai_config_type type;
    size_t offset;              /* offsetof(app struct, field) */
    const char *default_value;  /* text, parsed by the same code as user input; NULL = empty string / 0 */
    const char *doc;            /* one line for --help (required, no newlines) */
    double min, max;            /* inclusive range for INT/INT64/DOUBLE; checked only when min < max,
                                   so a zero-initialised pair or CAI_CFG_NO_RANGE means no range */
    const char *const *choices; /* NULL-terminated list for CAI_CFG_ENUM */
    const char *alias;          /* optional short CLI name, e.g. "tp" for "mesh.tp" */
} cai_config_field;

typedef struct {
    const char *program; /* "colossal-pretrain" */
    const char *summary; /* one line for --help */
    const cai_config_field *fields;
    size_t nfields;
} cai_config_schema;

#define CAI_CFG_NO_RANGE 1.0, 0.0
/* Number of entries of a field array, for cai_config_schema.nfields. */
#define CAI_CFG_NFIELDS(fields) (sizeof(fields) / sizeof((fields)[0]))

/* Validate the table (keys well formed and unique, no key both a leaf and a
 * section, aliases unique, reserved names "config"/"help"/"h" unused, docs
 * present, enum choices present) and set every field to its default. `cfg`
 * is treated as uninitialised; strings are allocated, so call
 * cai_config_free afterwards even when this fails. A bad table is
 * CAI_ERR_INVALID_ARG (a bug in the app), a default that does not parse or
 * is out of range CAI_ERR_CONFIG. */
cai_status cai_config_defaults(const cai_config_schema *schema, void *cfg);
/* Apply a YAML file: a mapping whose nested mappings spell the dotted path
 * (`train: {lr: 3e-4}` and `train.lr: 3e-4` both set train.lr). Errors name
 * the file, line and key: unknown key (with the closest known key), wrong
 * type, out of range, bad enum value (with the choices), duplicate key,
 * malformed YAML. All or nothing: on error `cfg` is unchanged. An empty file
 * changes nothing. */
cai_status cai_config_load_yaml(const cai_config_schema *schema, void *cfg, const char *path);
/* Same, from a string; `name` stands in for the file name in errors. */
cai_status cai_config_load_yaml_string(const cai_config_schema *schema, void *cfg, const char *text, const char *name);
/* Set one key (or alias) from text; `source` ("command line", "file.yaml:12")
 * leads every error message. On error the field is unchanged. */
cai_status cai_config_set(const cai_config_schema *schema, void *cfg, const char *key, const char *value,
                          const char *source);

/* Parse argv: defaults, then every --config FILE (YAML, in argv order), then
 * every --key=value / --key value / --bool-key / --no-bool-key override in
 * argv order, wherever --config stands (defaults < YAML < command line).
 * argv[0] is the program and is skipped. `--help` or `-h` anywhere sets
 * *help_requested, leaves `cfg` at its defaults and returns CAI_OK without
 * looking at the other arguments (with help_requested NULL it is an unknown
 * option). Positional arguments are errors. `cfg` is treated as
 * uninitialised; call cai_config_free afterwards whatever this returns. */
cai_status cai_config_parse_args(const cai_config_schema *schema, void *cfg, int argc, char **argv,
                                 int *help_requested);

/* --help text: usage, then each key (grouped by its first dotted part) with
 * alias, type, default, range or choices, and doc. */
void cai_config_print_help(const cai_config_schema *schema, FILE *out);
/* Effective config as YAML that cai_config_load_yaml accepts back: nested by
 * the dotted prefixes in table order, strings double-quoted, each key
 * followed by its doc as a comment. CAI_ERR_IO when writing fails,
 * CAI_ERR_CONFIG for a string that is not valid UTF-8 (YAML cannot hold it). */
cai_status cai_config_write(const cai_config_schema *schema, const void *cfg, FILE *out);
/* The same text in a malloc'd string (*out, free() it), e.g. to store the
 * config inside a checkpoint. */
cai_status cai_config_write_string(const cai_config_schema *schema, const void *cfg, char **out);
/* Write `dir`/config.yaml, creating `dir` and its parents if needed (mkdir -p).
 * The file is written under a temporary name and renamed, so a reader never
 * sees half of it. Not collective: call it from one rank. */
cai_status cai_config_write_file(const cai_config_schema *schema, const void *cfg, const char *dir);

/* A byte size: a non-negative decimal number (fractions allowed, rounded to
 * the nearest byte) and an optional unit, case-insensitive: none or B bytes;
 * K, M, G, T and KiB, MiB, GiB, TiB powers of 1024; KB, MB, GB, TB powers of
 * 1000 (Hugging Face's max_shard_size spelling: 5GB = 5e9). CAI_ERR_CONFIG
 * for anything else or a size above INT64_MAX; `what` ("train.mem_limit")
 * leads the message. */
cai_status cai_config_parse_bytes(const char *what, const char *text, int64_t *out);
/* `bytes` as the shortest text cai_config_parse_bytes reads back exactly:
 * "3GiB", "5GB", "1536KiB", "123". Returns `buf`. */
const char *cai_config_format_bytes(int64_t bytes, char *buf, size_t cap);

/* The field for a key or an alias ('-' and '_' interchangeable), or NULL. */
const cai_config_field *cai_config_find(const cai_config_schema *schema, const char *key);
/* One field's value as text, as written into YAML but unquoted (strings
 * raw, enums by name, doubles shortest round-trip), truncated to `cap`.
 * Returns `buf`. */
const char *cai_config_format(const cai_config_field *field, const void *cfg, char *buf, size_t cap);
/* The first field (in table order) whose value differs between `a` and `b`,
 * or NULL when they are equal; e.g. to tell a resumed run what changed. */
const cai_config_field *cai_config_compare(const cai_config_schema *schema, const void *a, const void *b);
/* Free the strings and set them to NULL; safe to call twice. */
void cai_config_free(const cai_config_schema *schema, void *cfg);

#ifdef __cplusplus
}
#endif
#endif
