/* The checkpoint layer: safetensors files (Hugging Face interchange) and,
 * appended by its owner, parallel HDF5 checkpoints.
 *
 * The safetensors section is a strict reader and a writer of the format as
 * the reference implementation produces it; mapping colossal's registry
 * names and layouts to Hugging Face ones is the exporter's job, above this.
 * See docs/safetensors.md. */
#ifndef COLOSSAL_CKPT_H
#define COLOSSAL_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * safetensors (src/ckpt/safetensors.c)
 * None of these calls is collective: every function acts on this rank's
 * file handle only. Several ranks may open (mmap) the same file at once.
 * ====================================================================== */

#define CAI_ST_MAX_DIMS 8
/* The reference implementation refuses larger headers; so do we. */
#define CAI_ST_MAX_HEADER (100u * 1000u * 1000u)

/* One tensor to write. Data is little-endian, row-major, numel * size of
 * dtype bytes; ndim 0 is a scalar (one element). */
typedef struct {
    const char *name;
    cai_dtype dtype;
    int ndim;
    uint64_t shape[CAI_ST_MAX_DIMS];
    const void *data; /* ignored by cai_safetensors_writer_open */
} cai_st_tensor;

/* A `__metadata__` entry (string to string). "format" is always "pt". */
typedef struct {
    const char *key, *value;
} cai_st_meta;

/* Writes the whole file at once: to `path`.tmp.<pid>, fsync, then rename, so
 * a reader never sees a half-written file. Tensors are laid out by element
 * size (largest first), then name, so every tensor starts aligned to its
 * element size, as the reference writer does. */
cai_status cai_safetensors_write(const char *path, const cai_st_tensor *tensors, int n, const cai_st_meta *meta,
                                 int n_meta);

/* Streaming writer for tensors that do not all fit in memory at once (HF
 * export gathers one at a time): the header is fixed from the descriptors,
 * then each tensor's bytes are put, in any order, once each. */
typedef struct cai_st_writer cai_st_writer_t;
cai_status cai_safetensors_writer_open(cai_st_writer_t **out, const char *path, const cai_st_tensor *tensors, int n,
                                       const cai_st_meta *meta, int n_meta);
cai_status cai_safetensors_writer_put(cai_st_writer_t *w, const char *name, const void *data);
/* Fails (and removes the temporary file) if any tensor was never put. */
cai_status cai_safetensors_writer_close(cai_st_writer_t *w);
/* Gives up: removes the temporary file and frees the writer. */
void cai_safetensors_writer_abort(cai_st_writer_t *w);

/* One tensor of an opened file. Pointers stay valid until close. */
typedef struct {
    const char *name;
    const char *dtype_name; /* as spelled in the file: "F32", "BF16", "BOOL", "F8_E4M3", ... */
    cai_dtype dtype;        /* CAI_DTYPE_COUNT when colossal has no such type (BOOL, I8, F8_*, ...) */
    size_t elem_size;
    int ndim;
    uint64_t shape[CAI_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;    /* data_offsets, relative to the start of the data section */
    const void *data;       /* in the read-only mapping; may be unaligned for foreign files */
} cai_st_entry;

typedef struct cai_safetensors cai_safetensors_t;

/* Maps the file read-only and validates it completely before returning:
 * header length against the file size, JSON syntax, every entry's fields and
 * dtype, shape * element size against its byte range, and that the ranges
 * tile the data section exactly (no gap, overlap or trailing bytes). Errors
 * are CAI_ERR_FORMAT (CAI_ERR_IO for the file system) and name the file and
 * the tensor or field at fault. */
cai_status cai_safetensors_open(cai_safetensors_t **out, const char *path);
void cai_safetensors_close(cai_safetensors_t *st);
const char *cai_safetensors_path(const cai_safetensors_t *st);
/* Entries are ordered by their position in the data section. */
int cai_safetensors_count(const cai_safetensors_t *st);
const cai_st_entry *cai_safetensors_entry(const cai_safetensors_t *st, int i);
/* NULL when absent; cai_safetensors_get reports the miss as an error. */
const cai_st_entry *cai_safetensors_find(const cai_safetensors_t *st, const char *name);
cai_status cai_safetensors_get(const cai_safetensors_t *st, const char *name, const cai_st_entry **out);
/* `__metadata__` lookups; NULL when absent. */
const char *cai_safetensors_meta(const cai_safetensors_t *st, const char *key);
int cai_safetensors_meta_count(const cai_safetensors_t *st);
void cai_safetensors_meta_at(const cai_safetensors_t *st, int i, const char **key, const char **value);
/* Copies tensor `name` into dst after checking that it has exactly this
 * dtype and shape; the error names the file, the tensor and both shapes. */
cai_status cai_safetensors_read(const cai_safetensors_t *st, const char *name, cai_dtype dtype, int ndim,
                                const uint64_t *shape, void *dst);

/* "F32", "BF16", ... for a colossal dtype (NULL if none). */
const char *cai_safetensors_dtype_name(cai_dtype dtype);

/* ================================================= end of safetensors */

#ifdef __cplusplus
}
#endif
#endif
