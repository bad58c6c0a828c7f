/* The schema the config fuzz targets parse into: every field type, ranges,
 * enums, byte sizes with a word, aliases, nesting and '-'/'_' keys. */
#ifndef CAI_FUZZ_CONFIG_SCHEMA_H
#define CAI_FUZZ_CONFIG_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/config.h"

typedef struct {
    int flag, n, mode;
    int64_t big, mem;
    double lr, ratio;
    char *name, *path;
} fuzz_cfg;

static const char *const fuzz_modes[] = {"fast", "slow", "auto-tune", NULL};

static const cai_config_field fuzz_fields[] = {
    {"flag", CAI_CFG_BOOL, offsetof(fuzz_cfg, flag), "false", "a switch", CAI_CFG_NO_RANGE, NULL, "f"},
    {"train.steps", CAI_CFG_INT, offsetof(fuzz_cfg, n), "10", "steps", 0, 1000000, NULL, "n"},
    {"train.mode", CAI_CFG_ENUM, offsetof(fuzz_cfg, mode), "fast", "mode", CAI_CFG_NO_RANGE, fuzz_modes, NULL},
    {"train.tokens_total", CAI_CFG_INT64, offsetof(fuzz_cfg, big), "0", "tokens", CAI_CFG_NO_RANGE, NULL, NULL},
    {"train.lr", CAI_CFG_DOUBLE, offsetof(fuzz_cfg, lr), "3e-4", "learning rate", 0, 1, NULL, "lr"},
    {"train.opt.ratio", CAI_CFG_DOUBLE, offsetof(fuzz_cfg, ratio), "0.5", "ratio", CAI_CFG_NO_RANGE, NULL, NULL},
    {"mem.limit", CAI_CFG_BYTES, offsetof(fuzz_cfg, mem), "auto", "memory", 0, 1e15, cai_config_bytes_auto, NULL},
    {"run.name", CAI_CFG_STRING, offsetof(fuzz_cfg, name), "x", "name", CAI_CFG_NO_RANGE, NULL, NULL},
    {"run.out-dir", CAI_CFG_STRING, offsetof(fuzz_cfg, path), NULL, "output", CAI_CFG_NO_RANGE, NULL, "o"},
};

static const cai_config_schema fuzz_schema = {"fuzz", "fuzz schema", fuzz_fields, CAI_CFG_NFIELDS(fuzz_fields)};

#endif
