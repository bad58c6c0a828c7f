/* Internals of the parallel HDF5 checkpoints, shared by src/ckpt/h5io.c and
 * src/ckpt/checkpoint*.c. Three layers:
 *   plan  (checkpoint_plan.c): which elements of a parameter a rank moves,
 *         as global boxes and runs (global index <-> local index). Pure
 *         arithmetic.
 *   h5io  (h5io.c): the HDF5 calls: files with the MPI-IO driver, the bf16
 *         type, attributes, virtual datasets, collective transfers of
 *         segment lists with the actual I/O mode.
 *   checkpoint*.c: segments of flat storage <-> buffers, the public API.
 *
 * File layout (docs/checkpoint.md): each group's tensors are concatenated
 * in registration order in one 1-D dataset "storage/<group>"; each tensor
 * is a virtual dataset "<group>/<name>" of its global shape over its range
 * of the storage. Ranks move segments of the storage, so a save or load is
 * one collective transfer per group (per GiB) however many tensors. */
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
cai_status ck_box_runs(const cai_param_shard *sh, const ck_box *boxes, int nbox, ck_run **runs, size_t *cap, size_t *n);
/* The part [*a, *b) of the local elements [0, local_numel) ∩ [lo, hi)
 * (local linear indices) that rank q of a group of r replicas writes:
 * contiguous, balanced chunks. r = 1: the whole intersection. */
void ck_replica_chunk(uint64_t lo, uint64_t hi, int q, int r, uint64_t *a, uint64_t *b);
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

/* A run of n elements at index s of a group's storage and index m of a
 * buffer, belonging to tensor p (the primary parameter whose dataset it is:
 * s minus p's storage offset is the element's global index in the tensor).
 * hash: this rank adds these elements to p's checksum. */
typedef struct {
    uint64_t s, m, n;
    int p;
    int hash;
} ck_seg;

typedef struct {
    ck_seg *v;
    size_t n, cap;
} ck_segs;

/* Append, extending the last segment when this one continues it. */
cai_status ck_segs_push(ck_segs *l, ck_seg g);
void ck_segs_free(ck_segs *l);
/* Sort by storage index. *m_in_order: the memory indices then increase
 * too, so HDF5 can read or write the buffer in place. */
void ck_segs_sort(ck_segs *l, int *m_in_order);
/* Cut the list into pieces of at most `cap` elements (splitting segments):
 * piece k is segments [starts[k], starts[k+1]). *starts is malloc'd;
 * returns the number of pieces. */
cai_status ck_segs_pieces(ck_segs *l, uint64_t cap, size_t **starts, size_t *n_pieces);

/* A buffer: element m at base + m * size(dtype), `len` elements, host
 * memory or on dev. */
typedef struct {
    char *base;
    uint64_t len;
    cai_dtype dtype;
    cai_device_t *dev; /* NULL or a host device: host memory */
} ck_mem;

/* fsync a directory, so a rename in it survives a crash (checkpoint_dir.c). */
cai_status ck_sync_dir(const char *dir);

/* Every rank learns whether any rank failed (MPI_Allreduce); the ranks that
 * did not fail return the lowest failing rank's message. Collective. */
cai_status ck_agree(MPI_Comm comm, cai_status st);

/* The layout of a model's own flat buffers (checkpoint.c). */
cai_ckpt_layout ck_model_layout(cai_model_t *model);

/* The file's model config (meta) is `want`'s architecture; the error names
 * the first key that differs (checkpoint.c). */
cai_status ck_check_model(const char *path, const cai_ckpt_meta *m, const cai_model_config *want);

/* cai_ckpt_load_pieces that first checks the file holds `expect`'s
 * architecture (NULL: no check) and says "holds weights only" when an
 * optimizer group is missing (checkpoint.c; CAI_ERR_UNSUPPORTED without
 * HDF5). */
cai_status ck_load_checked(cai_mesh_t *mesh, const char *path, const cai_ckpt_layout *layout,
                           const cai_ckpt_buffer *bufs, const cai_ckpt_piece *const *pieces, const int *n_pieces,
                           int n_bufs, const cai_model_config *expect, cai_ckpt_meta *meta, cai_ckpt_stats *stats);

#if CAI_HAVE_HDF5
#include <hdf5.h>

/* ------------------------------------------------------------------ h5io */

/* A file opened or created collectively over `comm`. */
typedef struct {
    hid_t file;
    hid_t bf16;            /* the file's bf16 type (a transient copy when opened read-only) */
    int independent_mpiio; /* collective H5Dwrite/H5Dread, independent MPI-IO underneath (CAI_CKPT_MPIIO) */
    int serial;            /* opened alone through the POSIX driver: plain, independent transfers */
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

/* Collective over comm. Create `path` (truncating) / open it read-only.
 * With serial_alone, a comm of one rank opens through HDF5's POSIX driver
 * instead of MPI-IO (the tools' reader); the loader keeps MPI-IO at every
 * size so that its transfers stay collective. */
cai_status ck_h5_create(ck_h5 *h, MPI_Comm comm, const char *path);
cai_status ck_h5_open(ck_h5 *h, MPI_Comm comm, const char *path, int serial_alone);
/* One process: open a file's bytes held in memory (HDF5's core driver,
 * without a copy: `image` must outlive the file; `name` only names it in
 * messages). */
cai_status ck_h5_open_image(ck_h5 *h, const char *name, const void *image, size_t size);
/* Flush to stable storage (H5Fflush: MPI_File_sync). Collective. */
cai_status ck_h5_flush(ck_h5 *h);
/* Collective; safe on a zeroed struct. Returns the first failure. */
cai_status ck_h5_close(ck_h5 *h);

/* A full disk must fail where every rank sees it. A write that fails
 * inside HDF5 (a transfer, H5Fflush, H5Fclose) fails on the rank that made
 * it only, and HDF5 then skips collectives the other ranks wait in (a hang;
 * a failed H5Fclose also leaves a freed file behind that MPI_Finalize
 * touches: the SIGSEGV). So a save first checks the free space
 * (ck_space_check), reserves the metadata's part of the file right after
 * creating it and the storage datasets' extents once they are placed
 * (ck_h5_reserve, posix_fallocate), all on rank 0 and agreed: no HDF5 write
 * can then run out of space, and a reservation that fails leaves only
 * metadata to flush, into space already held. Not collective. */
uint64_t ck_h5_meta_estimate(size_t n_objects);
cai_status ck_space_check(const char *path, uint64_t bytes);
cai_status ck_h5_reserve(ck_h5 *h, uint64_t offset, uint64_t bytes, const char *what);
cai_status ck_h5_reserve_dataset(ck_h5 *h, hid_t dset, uint64_t bytes, const char *name);

/* The HDF5 type of a file element type (the bf16 custom float for BF16). */
hid_t ck_h5_type(const ck_h5 *h, cai_dtype dt);
/* The colossal dtype of an HDF5 float type (CAI_DTYPE_COUNT when none) and
 * a short description of it ("bf16", "f32", "int32", "float(size 3)"). */
cai_dtype ck_h5_dtype_of(hid_t type, char *desc, size_t cap);

/* Create intermediate groups of `path` ("optim/exp_avg"). Collective. */
cai_status ck_h5_group(ck_h5 *h, const char *path);
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
/* A 1-D F32 dataset outside the tensor groups (the FP8 scaling state):
 * rank 0 writes; read gives a malloc'd copy (*out NULL, *n 0: absent). */
cai_status ck_h5_f32_write(ck_h5 *h, const char *name, const float *v, size_t n);
cai_status ck_h5_f32_read(ck_h5 *h, const char *name, float **out, size_t *n);

/* Transfer counters and time, accumulated by ck_h5_transfer. */
typedef struct {
    int n_transfers, n_collective;
    double io_seconds;
    uint64_t bytes; /* bytes this rank moved */
} ck_io_counts;

/* One collective H5Dwrite (write = 1) or H5Dread on the 1-D dataset
 * `dset`: the file selection is the union of the segments' storage ranges;
 * with `mem` the memory selection is the union of their memory ranges in a
 * buffer of mem->len elements at buf, else buf holds the selected elements
 * packed in storage order (nsel of them). n == 0: empty selections, still
 * collective. Memory type == file type. Records the actual I/O mode.
 * `what` names the tensors in errors. */
cai_status ck_h5_transfer(ck_h5 *h, hid_t dset, cai_dtype dt, const ck_seg *segs, size_t n, uint64_t nsel,
                          const ck_mem *mem, void *buf, int write, const char *what, ck_io_counts *io);

/* A contiguous 1-D dataset of `len` elements (early allocation, never
 * filled: every element is written). Collective. */
cai_status ck_h5_storage_create(ck_h5 *h, const char *name, cai_dtype dt, uint64_t len, hid_t *out);
/* A virtual dataset `name` of a global shape whose elements, in row-major
 * order, are elements [offset, offset + numel) of the 1-D dataset
 * `storage` (same file, same type) of `storage_len` elements. Collective. */
cai_status ck_h5_virtual_create(ck_h5 *h, const char *name, cai_dtype dt, int ndim, const uint64_t *shape,
                                const char *storage, uint64_t offset, uint64_t storage_len, hid_t *out);

/* The global shape and element type of a dataset. */
cai_status ck_h5_dataset_info(ck_h5 *h, hid_t dset, const char *name, int *ndim, uint64_t *shape, cai_dtype *dt,
                              char *dtype_desc, size_t desc_cap);

/* Reusable state of a sequence of transfers on one file. */
typedef struct {
    ck_h5 *h;
    uint64_t piece; /* elements per transfer at most */
    void *stage;    /* piece elements of up to 4 bytes, in the file type (lazy) */
    void *host;     /* piece elements of up to 4 bytes: device data staged on the host (lazy) */
    cai_device_t *host_dev;
    ck_io_counts io;
} ck_xfer;

/* 1 GiB per call: well under MPI-IO's 2^31-byte count per process. */
#define CK_PIECE_BYTES ((uint64_t)1 << 30)

void ck_xfer_init(ck_xfer *x, ck_h5 *h, uint64_t piece_elems);
void ck_xfer_free(ck_xfer *x);
/* One collective transfer of segments [0, n) (at most x->piece elements)
 * between `mem` and the 1-D dataset `storage` of file type fdt; n == 0 (or
 * mem NULL when writing) takes part with an empty selection. Memory type ==
 * file type always: element types are converted here, and device data is
 * staged on the host; a host buffer already in the file type whose segments
 * are in order goes to HDF5 as it is. Segments with `hash` add the
 * checksum of their elements (file bits, global index s - tensor_off[p]) to
 * xsum[p]. Reading with mem NULL computes checksums only. */
cai_status ck_xfer_segs(ck_xfer *x, hid_t storage, cai_dtype fdt, const ck_seg *segs, size_t n, int write,
                        const ck_mem *mem, int m_in_order, const uint64_t *tensor_off, uint64_t *xsum,
                        const char *what);

/* The root attributes of an open checkpoint, checked for the format name
 * and version (checkpoint.c). Collective. */
cai_status ck_read_meta(ck_h5 *h, cai_ckpt_meta *m);
#define CK_CONFIG_DATASET "config.yaml"
#define CK_FP8_DATASET "fp8_state"
#define CK_APP_DATASET "app_state"

/* cai_ckpt_open of a file's bytes held in memory, for one process: every
 * check and the whole metadata walk of cai_ckpt_open, without a file on
 * disk (the checkpoint fuzz target feeds it inputs this way;
 * checkpoint_file.c). `image` must outlive the handle; `name` names it in
 * messages. */
cai_status ck_file_open_image(cai_ckpt_file_t **out, const char *name, const void *image, size_t size);

#endif /* CAI_HAVE_HDF5 */

#endif
