/* Helpers shared by the Hugging Face export and import (src/ckpt/hf_*.c);
 * not installed. */
#ifndef COLOSSAL_CKPT_HF_INTERNAL_H
#define COLOSSAL_CKPT_HF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"

#define CAI_HF_NAME_MAX 256 /* HF tensor names built here */
#define CAI_HF_PATH_MAX 4096

#define CAI_HF_INDEX_NAME "model.safetensors.index.json"
#define CAI_HF_SINGLE_NAME "model.safetensors"

/* "[a,b]" */
void cai_hf_shape_str(char *buf, size_t cap, int ndim, const uint64_t *shape);
/* dir + "/" + name; CAI_ERR_INVALID_ARG when it does not fit. */
cai_status cai_hf_path(char *buf, size_t cap, const char *dir, const char *name);
/* mkdir -p */
cai_status cai_hf_mkdirs(const char *dir);
/* Write `len` bytes to path through path.tmp.<pid>, fsync, rename. */
cai_status cai_hf_write_file(const char *path, const void *data, size_t len);
/* Whole file into a malloc'd, NUL-terminated buffer. */
cai_status cai_hf_read_file(const char *path, char **out, size_t *len);
int cai_hf_file_exists(const char *path);
/* The shortest decimal that reads back as exactly `f`, as a double: config
 * values stay readable ("1e-05", not "9.99999975e-06") and exact. */
double cai_hf_float_json(float f);

#endif
