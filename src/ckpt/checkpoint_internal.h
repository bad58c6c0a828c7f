/* Internals of the parallel HDF5 checkpoints, shared by src/ckpt/h5io.c and
 * src/ckpt/checkpoint*.c. Three layers:
 *   plan  (checkpoint_plan.c): which elements of a parameter a rank moves,
 *         as global boxes (the HDF5 selection) and runs (how the selection's
 *         row-major order maps onto the local shard). Pure arithmetic.
 *   h5io  (h5io.c): the HDF5 calls: files with the MPI-IO driver, the bf16
 *         type, attributes, collective transfers with the actual I/O mode.
 *   checkpoint*.c: the public API on top. */
#ifndef CAI_CKPT_CHECKPOINT_INTERNAL_H
#define CAI_CKPT_CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "colossal/ckpt.h"
#include "colossal/model.h"

/* ------------------------------------------------------------------ plan */

/* A box of the global tensor, inside one slab of a shard. */
typedef struct {
    uint64_t off[CAI_PARAM_MAX_DIMS];
    uint64_t cnt[CAI_PARAM_MAX_DIMS];
    int slab;
} ck_box;

/* `n` elements that are consecutive both in the global tensor (from global
 * row-major index g) and in the local shard (from local index l). */
typedef struct {
    uint64_t g, l, n;
    int writer; /* the slab's replica_rank is 0: this rank owns these elements for writing */
} ck_run;

/* Boxes of one piece: at most 2*(ndim-1)+1 boxes per range, each cut by up
 * to CAI_SHARD_MAX_SLABS slabs. */
#define CK_MAX_BOXES ((2 * CAI_PARAM_MAX_DIMS - 1) * CAI_SHARD_MAX_SLABS)

/* The local linear range [a, b) of `sh` as global boxes, in local order.
 * writers_only drops boxes of slabs this rank does not write (TP replicas
 * other than 0). Returns the number of boxes (<= CK_MAX_BOXES). */
int ck_range_boxes(const cai_param_shard *sh, uint64_t a, uint64_t b, int writers_only, ck_box *out);
/* The elements of `boxes` as runs sorted by global index (the order an HDF5
 * hyperslab selection is iterated in), merged where contiguous in both.
 * *runs is malloc'd (grown as needed; *cap its capacity); returns the count
 * through *n. */
cai_status ck_box_runs(const cai_param_shard *sh, const ck_box *boxes, int nbox, ck_run **runs, size_t *cap,
                       size_t *n);
/* The part [*a, *b) of the local elements [0, local_numel) ∩ [lo, hi)
 * (local linear indices) that rank q of a group of r replicas writes:
 * contiguous, balanced chunks. r = 1: the whole intersection. */
void ck_replica_chunk(uint64_t lo, uint64_t hi, int q, int r, uint64_t *a, uint64_t *b);
/* A shard describing a whole global tensor held by one rank (readers and
 * verification, which do not follow a registry). */
void ck_global_shard(int ndim, const uint64_t *shape, cai_param_shard *out);

/* Order-independent checksum of a tensor: the sum mod 2^64 over elements
 * of mix64(g * K + bits), g the global row-major index, bits the element's
 * bits as stored in the file (zero-extended). Partial sums from any split of
 * the elements add up to the same value, so each rank hashes what it wrote
 * and an all-reduce gives the tensor's checksum. */
uint64_t ck_xsum(const void *data, size_t elem_size, uint64_t g0, uint64_t n);

/* ------------------------------------------------------------------ misc */

/* "f32", "bf16", "f16" file element types; others are refused. */
int ck_file_dtype_ok(cai_dtype dt);

/* Whether `file_dtype` data may be converted to `mem_dtype` (both in
 * F32/BF16/F16): always; kept as a function so the rule is stated once. */
int ck_dtype_convertible(cai_dtype file_dtype, cai_dtype mem_dtype);

/* fsync a directory, so a rename in it survives a crash (checkpoint_dir.c). */
cai_status ck_sync_dir(const char *dir);

/* Every rank learns whether any rank failed (MPI_Allreduce); the ranks that
 * did not fail return the lowest failing rank's message. Collective. */
cai_status ck_agree(MPI_Comm comm, cai_status st);

#if CAI_HAVE_HDF5
#include <hdf5.h>

/* ------------------------------------------------------------------ h5io */

/* A file opened or created collectively over `comm`. */
typedef struct {
    hid_t file;
    hid_t bf16; /* the file's bf16 type (a transient copy when opened read-only) */
    MPI_Comm comm;
    int rank, size;
    char path[4096];
} ck_h5;

/* HDF5 errors are turned into colossal errors: automatic printing is off
 * while colossal calls HDF5, and the innermost messages of the HDF5 error
 * stack end the colossal error message. */
void ck_h5_quiet(void);
/* CAI_ERR_HDF5 (or `st`) with the formatted context, then ": " and what
 * HDF5 said. */
cai_status ck_h5_error(cai_status st, const char *file, int line, const char *func, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define CK_H5ERR(st, ...) ck_h5_error((st), __FILE__, __LINE__, __func__, __VA_ARGS__)
/* Save the HDF5 error stack right after a failed call, before cleanup calls
 * clear it; ck_h5_error uses it when the live stack is empty. */
void ck_h5_capture(void);

/* Collective over comm. Create `path` (truncating) / open it read-only. */
cai_status ck_h5_create(ck_h5 *h, MPI_Comm comm, const char *path);
cai_status ck_h5_open(ck_h5 *h, MPI_Comm comm, const char *path);
/* Flush to stable storage (H5Fflush: MPI_File_sync). Collective. */
cai_status ck_h5_flush(ck_h5 *h);
/* Collective; safe on a zeroed struct. Returns the first failure. */
cai_status ck_h5_close(ck_h5 *h);

/* The HDF5 type of a file element type (the bf16 custom float for BF16). */
hid_t ck_h5_type(const ck_h5 *h, cai_dtype dt);
/* The colossal dtype of an HDF5 float type (CAI_DTYPE_COUNT when none) and
 * a short description of it ("bf16", "f32", "int32", "float(size 3)"). */
cai_dtype ck_h5_dtype_of(hid_t type, char *desc, size_t cap);

/* Create intermediate groups of `path` ("optim/exp_avg"). Collective. */
cai_status ck_h5_group(ck_h5 *h, const char *path);
/* A contiguous dataset of a global shape, allocated early, never filled
 * (every element is written). Collective. Returns the dataset id. */
cai_status ck_h5_dataset_create(ck_h5 *h, const char *name, cai_dtype dt, int ndim, const uint64_t *shape,
                                hid_t *out);

/* Attributes on any object (the root "/" or a dataset). All ranks call the
 * writers with identical values. */
cai_status ck_h5_attr_i64(ck_h5 *h, hid_t obj, const char *name, int64_t v);
cai_status ck_h5_attr_u64(ck_h5 *h, hid_t obj, const char *name, uint64_t v);
cai_status ck_h5_attr_f64(ck_h5 *h, hid_t obj, const char *name, double v);
cai_status ck_h5_attr_str(ck_h5 *h, hid_t obj, const char *name, const char *v);
/* Readers; *found = 0 when absent (found NULL: absence is an error naming
 * the file and attribute). */
cai_status ck_h5_get_i64(ck_h5 *h, hid_t obj, const char *name, int64_t *v, int *found);
cai_status ck_h5_get_u64(ck_h5 *h, hid_t obj, const char *name, uint64_t *v, int *found);
cai_status ck_h5_get_f64(ck_h5 *h, hid_t obj, const char *name, double *v, int *found);
/* A string attribute into buf (truncated to cap). */
cai_status ck_h5_get_str(ck_h5 *h, hid_t obj, const char *name, char *buf, size_t cap, int *found);
/* A string dataset (the config text): write / read (malloc'd). */
cai_status ck_h5_text_write(ck_h5 *h, const char *name, const char *text);
cai_status ck_h5_text_read(ck_h5 *h, const char *name, char **out, int *found);

/* Transfer counters and time, accumulated by ck_h5_transfer. */
typedef struct {
    int n_transfers, n_collective;
    double io_seconds;
    uint64_t bytes; /* bytes this rank moved */
} ck_io_counts;

/* One collective H5Dwrite (write = 1) or H5Dread of the union of `boxes`
 * (0 boxes: an empty selection, still collective), memory type == file type
 * so the transfer stays collective; buf holds the selected elements in
 * row-major order of the dataset, n elements. Records the actual I/O mode.
 * `what` names the tensor in errors. */
cai_status ck_h5_transfer(ck_h5 *h, hid_t dset, cai_dtype dt, int ndim, const ck_box *boxes, int nbox,
                          uint64_t n, void *buf, int write, const char *what, ck_io_counts *io);

/* The global shape and element type of a dataset. */
cai_status ck_h5_dataset_info(ck_h5 *h, hid_t dset, const char *name, int *ndim, uint64_t *shape, cai_dtype *dt,
                              char *dtype_desc, size_t desc_cap);

/* Where a shard's local elements live: element l of the local shard is at
 * base + l * size(dtype), host memory or on dev. */
typedef struct {
    char *base;
    cai_dtype dtype;
    cai_device_t *dev; /* NULL or a host device: host memory */
} ck_mem;

/* Reusable state of a sequence of transfers on one file. */
typedef struct {
    ck_h5 *h;
    size_t piece;      /* elements per transfer at most */
    void *stage;       /* piece elements of up to 4 bytes, in the file type (lazy) */
    void *host;        /* piece elements of up to 4 bytes: device data staged on the host (lazy) */
    cai_device_t *host_dev;
    ck_run *runs;
    size_t runs_cap, n_runs;
    ck_box boxes[CK_MAX_BOXES];
    ck_io_counts io;
} ck_xfer;

#define CK_PIECE_BYTES ((size_t)64 << 20)

void ck_xfer_init(ck_xfer *x, ck_h5 *h, size_t piece_elems);
void ck_xfer_free(ck_xfer *x);
/* One collective transfer of the local elements [a, b) of `sh` (b - a <=
 * piece) between `mem` and dataset `ds` of file type fdt. Writing moves
 * only slabs this rank writes (replica 0) and adds the checksum of what it
 * wrote to *xsum; reading moves every slab and adds the checksum of the
 * elements in [wa, wa_end) of replica-0 slabs (the part this rank would
 * write), so a load checks each element once. mem NULL (read): checksum
 * only. xsum may be NULL. a == b: an empty selection (still collective). */
cai_status ck_xfer_piece(ck_xfer *x, hid_t ds, const char *what, const cai_param_shard *sh, uint64_t a, uint64_t b,
                         int write, cai_dtype fdt, const ck_mem *mem, uint64_t wa, uint64_t wa_end, uint64_t *xsum);

/* The root attributes of an open checkpoint, checked for the format name
 * and version (checkpoint.c). Collective. */
cai_status ck_read_meta(ck_h5 *h, cai_ckpt_meta *m);
#define CK_CONFIG_DATASET "config.yaml"

#endif /* CAI_HAVE_HDF5 */

#endif
