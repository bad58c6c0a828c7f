/* Private helpers shared by the config module's files (values, YAML, CLI). */
#ifndef COLOSSAL_CONFIG_INTERNAL_H
#define COLOSSAL_CONFIG_INTERNAL_H

#include <stddef.h>

#include "colossal/config.h"

/* Key comparison where '-' and '_' match each other; `len` bytes of `name`
 * against the whole NUL-terminated `key`. */
int cai_cfg_key_eq(const char *key, const char *name, size_t len);
/* Field whose key or alias matches name[0..len), or NULL. */
const cai_config_field *cai_cfg_lookup(const cai_config_schema *schema, const char *name, size_t len);
/* Whether name[0..len) is a proper dotted prefix of some key ("train" for "train.lr"). */
int cai_cfg_is_section(const cai_config_schema *schema, const char *name, size_t len);
/* CAI_ERR_CONFIG for a name that is no key: says so, suggests the closest key
 * (or, for a section, lists its keys). `flag` is "--" on the command line so
 * suggestions read as options, "" in YAML. */
cai_status cai_cfg_unknown_key(const cai_config_schema *schema, const char *source, const char *name, const char *flag);
/* Parse `text` for `field`, check type and range, then store it unless
 * `dry_run`. Errors start with "<source>: key '<key>': ". */
cai_status cai_cfg_apply(const cai_config_field *field, void *cfg, const char *text, const char *source, int dry_run);
/* 1 and *out set when `text` is a boolean literal, else 0. */
int cai_cfg_parse_bool(const char *text, int *out);
const char *cai_cfg_type_name(cai_config_type type);
/* "an int", "a double": for "expected ..." messages. */
const char *cai_cfg_type_phrase(cai_config_type type);
/* The field's default as cai_config_defaults stores it, formatted like the
 * YAML dump (strings in quotes), for --help. */
void cai_cfg_format_default(const cai_config_field *field, char *buf, size_t cap);
/* Whether `text` can stand unquoted as a YAML plain scalar and read back as
 * the same string (not a bool/null/number look-alike, no special characters). */
int cai_cfg_plain_safe(const char *text);

#endif
