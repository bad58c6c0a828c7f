/* The HDF5 calls of the checkpoints: files through the MPI-IO driver with
 * collective metadata (a tool reading alone: the POSIX driver), the bf16
 * and f16 float types, attributes, and collective transfers of hyperslab
 * unions that record the I/O mode HDF5 actually used.
 *
 * Two rules from docs/checkpoint.md keep every transfer collective: the
 * memory type always equals the file type (a conversion inside HDF5 makes
 * it fall back to independent I/O silently), and every rank calls every
 * create/open/attribute/transfer with the same arguments in the same
 * order, a rank with nothing to move passing an empty selection. */
#include "cai_config.h"

#if CAI_HAVE_HDF5

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "checkpoint_internal.h"

/* Large datasets start on 1 MiB boundaries (a Lustre stripe; a page
 * multiple everywhere) so ranks' pieces do not share file-system blocks. */
#define ALIGN_THRESHOLD ((hsize_t)1 << 20)
#define ALIGNMENT ((hsize_t)1 << 20)
/* Metadata (object headers of the tensor views, attributes, group indexes)
 * is allocated from blocks this large, so it sits together in the file and
 * a cold open reads it in a few large reads instead of hundreds of small
 * scattered ones. */
#define META_BLOCK ((hsize_t)4 << 20)

void ck_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

typedef struct {
    char msg[2][256]; /* the two innermost descriptions */
    int n;
} walk_ctx;

/* What HDF5 said about the last failure, saved before cleanup calls (every
 * HDF5 API call starts by clearing the error stack). */
static _Thread_local walk_ctx g_saved;

static herr_t walk_cb(unsigned n, const H5E_error2_t *err, void *data) {
    (void)n;
    walk_ctx *w = data;
    /* Walking downward: later entries are deeper, so keep the last two. */
    if (w->n == 2) memcpy(w->msg[0], w->msg[1], sizeof w->msg[1]);
    int slot = w->n < 2 ? w->n++ : 1;
    snprintf(w->msg[slot], sizeof w->msg[slot], "%s", err->desc ? err->desc : "?");
    return 0;
}

void ck_h5_capture(void) {
    memset(&g_saved, 0, sizeof g_saved);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &g_saved);
}

cai_status ck_h5_error(cai_status st, const char *file, int line, const char *func, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    walk_ctx w;
    memset(&w, 0, sizeof w);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &w);
    H5Eclear2(H5E_DEFAULT);
    if (w.n == 0) w = g_saved;
    memset(&g_saved, 0, sizeof g_saved);
    if (w.n == 2) return cai_error_set(st, file, line, func, "%s (HDF5: %s; %s)", what, w.msg[0], w.msg[1]);
    if (w.n == 1) return cai_error_set(st, file, line, func, "%s (HDF5: %s)", what, w.msg[0]);
    return cai_error_set(st, file, line, func, "%s", what);
}

/* ------------------------------------------------------------ types */

/* bf16: the top half of an IEEE binary32. HDF5 describes it as a float
 * with sign bit 15, an 8-bit exponent at bit 7 with bias 127 and a 7-bit
 * mantissa at bit 0, so h5dump and h5py (astype('f4')) convert it exactly.
 * f16: IEEE binary16, which HDF5 1.10 has no predefined type for. */
static hid_t make_float16(int bf16) {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0) return t;
    herr_t rc = bf16 ? H5Tset_fields(t, 15, 7, 8, 0, 7) : H5Tset_fields(t, 15, 10, 5, 0, 10);
    if (rc < 0 || H5Tset_precision(t, 16) < 0 || H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, bf16 ? 127 : 15) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

static hid_t g_f16 = -1; /* transient, made once */

hid_t ck_h5_type(const ck_h5 *h, cai_dtype dt) {
    switch (dt) {
    case CAI_DTYPE_F32: return H5T_IEEE_F32LE;
    case CAI_DTYPE_BF16: return h->bf16;
    case CAI_DTYPE_F16:
        if (g_f16 < 0) g_f16 = make_float16(0);
        return g_f16;
    case CAI_DTYPE_F64: return H5T_IEEE_F64LE;
    case CAI_DTYPE_I32: return H5T_STD_I32LE;
    case CAI_DTYPE_I64: return H5T_STD_I64LE;
    case CAI_DTYPE_U8: return H5T_STD_U8LE;
    case CAI_DTYPE_U16: return H5T_STD_U16LE;
    default: return -1;
    }
}

cai_dtype ck_h5_dtype_of(hid_t type, char *desc, size_t cap) {
    H5T_class_t cls = H5Tget_class(type);
    size_t size = H5Tget_size(type);
    cai_dtype dt = CAI_DTYPE_COUNT;
    if (cls == H5T_FLOAT) {
        size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
        H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
        size_t ebias = H5Tget_ebias(type);
        H5T_order_t order = H5Tget_order(type);
        int le = order == H5T_ORDER_LE;
        if (le && size == 4 && esize == 8 && msize == 23 && ebias == 127) dt = CAI_DTYPE_F32;
        else if (le && size == 2 && esize == 8 && msize == 7 && ebias == 127) dt = CAI_DTYPE_BF16;
        else if (le && size == 2 && esize == 5 && msize == 10 && ebias == 15) dt = CAI_DTYPE_F16;
        else if (le && size == 8 && esize == 11 && msize == 52 && ebias == 1023) dt = CAI_DTYPE_F64;
        if (desc) {
            if (dt != CAI_DTYPE_COUNT) snprintf(desc, cap, "%s", cai_dtype_name(dt));
            else
                snprintf(desc, cap, "float(size %zu, exponent %zu bits bias %zu, mantissa %zu bits%s)", size, esize,
                         ebias, msize, le ? "" : ", big-endian");
        }
    } else if (desc) {
        const char *c = cls == H5T_INTEGER    ? "int"
                        : cls == H5T_STRING   ? "string"
                        : cls == H5T_COMPOUND ? "compound"
                                              : "other";
        snprintf(desc, cap, "%s(size %zu)", c, size);
    }
    return dt;
}

/* ------------------------------------------------------------ files */

/* Collective metadata reads (rank 0 reads, then broadcasts) keep thousands
 * of ranks from reading the same object headers at once; with few ranks
 * each broadcast only adds a synchronisation per attribute or dataset
 * open, which a load of a few hundred tensors feels on a busy node. */
#define COLL_METADATA_MIN_RANKS 64

static hid_t make_fapl(MPI_Comm comm) {
    int size = 1;
    MPI_Comm_size(comm, &size);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return fapl;
    if (H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) < 0 ||
        H5Pset_all_coll_metadata_ops(fapl, size >= COLL_METADATA_MIN_RANKS) < 0 ||
        H5Pset_coll_metadata_write(fapl, 1) < 0 || H5Pset_alignment(fapl, ALIGN_THRESHOLD, ALIGNMENT) < 0 ||
        H5Pset_meta_block_size(fapl, META_BLOCK) < 0) {
        H5Pclose(fapl);
        return -1;
    }
    return fapl;
}

/* The knob CAI_CKPT_MPIIO=two-phase hands every transfer to MPI-IO's
 * collective buffering (aggregators gather the ranks' pieces and write
 * large blocks: the choice for many ranks on a parallel file system); the
 * default, "independent", keeps the HDF5 calls collective but lets each
 * rank write its own contiguous pieces itself, which avoids copying every
 * byte through the aggregators when pieces are already large and disjoint
 * (the data-parallel case: each rank writes a contiguous slice of every
 * tensor). Every rank must see the same value: it changes which MPI calls
 * HDF5 makes. */
static cai_status set_comm(ck_h5 *h, MPI_Comm comm, const char *path) {
    memset(h, 0, sizeof *h);
    h->file = h->bf16 = -1;
    const char *mode = NULL;
    CAI_CALL(cai_knob_str("CAI_CKPT_MPIIO", &mode));
    h->independent_mpiio = strcmp(mode, "two-phase") != 0;
    h->comm = comm;
    MPI_Comm_rank(comm, &h->rank);
    MPI_Comm_size(comm, &h->size);
    snprintf(h->path, sizeof h->path, "%s", path);
    return CAI_OK;
}

cai_status ck_h5_create(ck_h5 *h, MPI_Comm comm, const char *path) {
    ck_h5_quiet();
    CAI_CALL(set_comm(h, comm, path));
    hid_t fapl = make_fapl(comm);
    /* No data sieve buffer: every element is written inside its H5Dwrite,
     * whose failure (a full disk) stays local and is agreed on afterwards,
     * never later inside H5Fclose, where one rank's failed write makes HDF5
     * skip collectives the others wait in. */
    if (fapl >= 0 && H5Pset_sieve_buf_size(fapl, 0) < 0) {
        H5Pclose(fapl);
        fapl = -1;
    }
    if (fapl < 0) return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': cannot set up the MPI-IO file access", path);
    h->file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (h->file < 0) ck_h5_capture();
    H5Pclose(fapl);
    if (h->file < 0) return CK_H5ERR(CAI_ERR_IO, "cannot create checkpoint file '%s'", path);
    /* A committed type: h5dump shows its name and every dataset shares it. */
    h->bf16 = make_float16(1);
    if (h->bf16 < 0 || H5Tcommit2(h->file, "bfloat16", h->bf16, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) < 0)
        return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': cannot create the bfloat16 type", path);
    return CAI_OK;
}

/* Whether the file holds HDF5's signature where the format puts it (byte 0,
 * or 512, 1024, 2048, ... after a user block); if not, why in words. */
static int h5_signature(FILE *fp, char *why, size_t cap) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char b[8];
    if (fseek(fp, 0, SEEK_END) != 0) return 1;
    const long size = ftell(fp);
    for (long at = 0; size >= 8 && at <= size - 8; at = at ? 2 * at : 512)
        if (fseek(fp, at, SEEK_SET) == 0 && fread(b, 1, 8, fp) == 8 && memcmp(b, sig, 8) == 0) return 1;
    if (size <= 0) {
        snprintf(why, cap, "the file is empty (0 bytes)");
        return 0;
    }
    unsigned char head[4096];
    size_t n = fseek(fp, 0, SEEK_SET) == 0 ? fread(head, 1, sizeof head, fp) : 0, z = 0;
    while (z < n && head[z] == 0) z++;
    if (n && z == n) snprintf(why, cap, "no HDF5 signature (its first %zu bytes are all zero)", n);
    else snprintf(why, cap, "no HDF5 signature at byte 0 (nor after a user block) in its %ld bytes", size);
    return 0;
}

/* One process reading alone needs none of MPI-IO: the POSIX driver reads
 * the same bytes without an MPI file handle, and without the communicator
 * HDF5 duplicates from an MPI-IO file's access list at every virtual
 * dataset open (one per tensor). No file lock: MPI-IO takes none either,
 * and some parallel file systems refuse flock. */
static hid_t make_serial_fapl(void) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return fapl;
    if (H5Pset_fapl_sec2(fapl) < 0 || H5Pset_file_locking(fapl, 0, 1) < 0) {
        H5Pclose(fapl);
        return -1;
    }
    return fapl;
}

/* H5Fopen of h->path through `fapl` (closed here). On failure, why in
 * words, from its bytes: those of `image` when given, else the file's. */
static cai_status open_read(ck_h5 *h, hid_t fapl, const void *image, size_t size) {
    if (fapl < 0) return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': cannot set up the file access", h->path);
    h->file = H5Fopen(h->path, H5F_ACC_RDONLY, fapl);
    if (h->file < 0) ck_h5_capture();
    H5Pclose(fapl);
    if (h->file >= 0) {
        h->bf16 = make_float16(1);
        if (h->bf16 < 0) return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': cannot create the bfloat16 type", h->path);
        return CAI_OK;
    }
    FILE *fp = image ? fmemopen((void *)image, size, "rb") : fopen(h->path, "rb");
    if (!fp) return CK_H5ERR(CAI_ERR_IO, "cannot open checkpoint '%s'", h->path);
    char why[160];
    const int has_signature = h5_signature(fp, why, sizeof why);
    fclose(fp);
    if (!has_signature) return CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s' is not an HDF5 file: %s", h->path, why);
    return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s' is not a readable HDF5 file (truncated or corrupt?)", h->path);
}

cai_status ck_h5_open(ck_h5 *h, MPI_Comm comm, const char *path, int serial_alone) {
    ck_h5_quiet();
    CAI_CALL(set_comm(h, comm, path));
    h->serial = serial_alone && h->size == 1;
    return open_read(h, h->serial ? make_serial_fapl() : make_fapl(comm), NULL, 0);
}

/* File image callbacks that hand HDF5 the caller's bytes instead of the two
 * copies it makes by default (into the access list, then into the core
 * driver): every "allocation" is the image itself, copies onto it are
 * no-ops, nothing is freed. Read-only, so HDF5 never resizes it. */
static void *image_get(size_t size, H5FD_file_image_op_t op, void *udata) {
    (void)size;
    (void)op;
    return udata;
}
static void *image_copy(void *dest, const void *src, size_t size, H5FD_file_image_op_t op, void *udata) {
    (void)op;
    (void)udata;
    return dest == src ? dest : memcpy(dest, src, size);
}
static void *image_resize(void *ptr, size_t size, H5FD_file_image_op_t op, void *udata) {
    (void)ptr;
    (void)size;
    (void)op;
    (void)udata;
    return NULL;
}
static herr_t image_keep(void *ptr, H5FD_file_image_op_t op, void *udata) {
    (void)ptr;
    (void)op;
    (void)udata;
    return 0;
}
static void *image_udata_copy(void *udata) { return udata; }
static herr_t image_udata_free(void *udata) {
    (void)udata;
    return 0;
}

cai_status ck_h5_open_image(ck_h5 *h, const char *name, const void *image, size_t size) {
    ck_h5_quiet();
    CAI_CALL(set_comm(h, MPI_COMM_SELF, name));
    h->serial = 1;
    H5FD_file_image_callbacks_t cb = {image_get,        image_copy,       image_resize, image_keep,
                                      image_udata_copy, image_udata_free, (void *)image};
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0 && (H5Pset_fapl_core(fapl, 1 << 16, 0) < 0 || H5Pset_file_image_callbacks(fapl, &cb) < 0 ||
                      H5Pset_file_image(fapl, (void *)image, size) < 0)) {
        H5Pclose(fapl);
        fapl = -1;
    }
    return open_read(h, fapl, image, size);
}

cai_status ck_h5_flush(ck_h5 *h) {
    if (H5Fflush(h->file, H5F_SCOPE_GLOBAL) < 0)
        return CK_H5ERR(CAI_ERR_IO, "checkpoint '%s': flushing to storage failed", h->path);
    return CAI_OK;
}

cai_status ck_h5_close(ck_h5 *h) {
    cai_status st = CAI_OK;
    if (h->bf16 >= 0) H5Tclose(h->bf16);
    h->bf16 = -1;
    if (h->file >= 0 && H5Fclose(h->file) < 0)
        st = CK_H5ERR(CAI_ERR_IO, "checkpoint '%s': closing the file failed", h->path);
    h->file = -1;
    return st;
}

/* ------------------------------------------------------------ space */

uint64_t ck_h5_meta_estimate(size_t n_objects) {
    /* Measured: ~0.55 KiB of object headers, attributes and VDS mappings
     * per dataset; 2 KiB each, the superblock and the root group besides.
     * Metadata lives in the first META_BLOCK of the file. */
    uint64_t b = ((uint64_t)64 << 10) + (uint64_t)n_objects * (2 << 10);
    return b < META_BLOCK ? b : META_BLOCK;
}

cai_status ck_space_check(const char *path, uint64_t bytes) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? (slash == path ? "/" : path) : ".");
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0) return CAI_OK; /* nothing known: the writes will tell */
    uint64_t avail = (uint64_t)sv.f_bavail * (uint64_t)(sv.f_frsize ? sv.f_frsize : sv.f_bsize);
    if (avail >= bytes) return CAI_OK;
    return CAI_ERROR(CAI_ERR_IO,
                     "cannot write checkpoint '%s': %s (%.2f MB free in %s, the checkpoint needs about "
                     "%.2f MB)",
                     path, strerror(ENOSPC), (double)avail / 1e6, dir, (double)bytes / 1e6);
}

cai_status ck_h5_reserve(ck_h5 *h, uint64_t offset, uint64_t bytes, const char *what) {
    if (bytes == 0) return CAI_OK;
    int fd = open(h->path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return CAI_ERROR(CAI_ERR_IO, "cannot open checkpoint '%s' to reserve space: %s", h->path, strerror(errno));
    int rc = posix_fallocate(fd, (off_t)offset, (off_t)bytes);
    close(fd);
    /* A file system without fallocate (EOPNOTSUPP, EINVAL) goes without. */
    if (rc == 0 || rc == EOPNOTSUPP || rc == EINVAL || rc == ENOSYS) return CAI_OK;
    return CAI_ERROR(CAI_ERR_IO, "cannot write checkpoint '%s': reserving %.2f MB for %s: %s", h->path,
                     (double)bytes / 1e6, what, strerror(rc));
}

cai_status ck_h5_reserve_dataset(ck_h5 *h, hid_t dset, uint64_t bytes, const char *name) {
    haddr_t a = H5Dget_offset(dset);
    if (a == HADDR_UNDEF) return CAI_OK; /* not allocated yet: nothing to reserve */
    return ck_h5_reserve(h, (uint64_t)a, bytes, name);
}

/* ------------------------------------------------------------ groups, datasets */

cai_status ck_h5_group(ck_h5 *h, const char *path) {
    char part[CAI_CKPT_NAME_MAX];
    size_t len = strlen(path);
    if (len >= sizeof part) return CAI_ERROR(CAI_ERR_INVALID_ARG, "checkpoint group name '%s' is too long", path);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        memcpy(part, path, i);
        part[i] = '\0';
        htri_t ex = H5Lexists(h->file, part, H5P_DEFAULT);
        if (ex > 0) continue;
        hid_t g = ex < 0 ? -1 : H5Gcreate2(h->file, part, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g < 0) return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': cannot create group '%s'", h->path, part);
        H5Gclose(g);
    }
    return CAI_OK;
}

/* Contiguous, allocated at creation (parallel HDF5 needs it) and never
 * filled: every element is written once. */
static hid_t contiguous_dcpl(void) {
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (dcpl >= 0 && (H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0 || H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) < 0 ||
                      H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0)) {
        H5Pclose(dcpl);
        return -1;
    }
    return dcpl;
}

cai_status ck_h5_storage_create(ck_h5 *h, const char *name, cai_dtype dt, uint64_t len, hid_t *out) {
    hsize_t dim = len ? len : 1;
    hid_t space = H5Screate_simple(1, &dim, NULL), dcpl = contiguous_dcpl(), ds = -1;
    if (space >= 0 && dcpl >= 0)
        ds = H5Dcreate2(h->file, name, ck_h5_type(h, dt), space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (ds < 0) ck_h5_capture();
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    if (ds < 0)
        return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': cannot create %s (%llu elements)", h->path, name,
                        (unsigned long long)len);
    *out = ds;
    return CAI_OK;
}

cai_status ck_h5_virtual_create(ck_h5 *h, const char *name, cai_dtype dt, int ndim, const uint64_t *shape,
                                const char *storage, uint64_t offset, uint64_t storage_len, hid_t *out) {
    hsize_t dims[CAI_CKPT_MAX_DIMS], sdim = storage_len ? storage_len : 1, off = offset, cnt = 1;
    for (int d = 0; d < ndim; d++) {
        dims[d] = shape[d];
        cnt *= shape[d];
    }
    hid_t vspace = H5Screate_simple(ndim, dims, NULL), sspace = H5Screate_simple(1, &sdim, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), ds = -1;
    /* "." is this file: the mapping survives the rename of the temporary. */
    if (vspace >= 0 && sspace >= 0 && dcpl >= 0 &&
        H5Sselect_hyperslab(sspace, H5S_SELECT_SET, &off, NULL, &cnt, NULL) >= 0 &&
        H5Pset_virtual(dcpl, vspace, ".", storage, sspace) >= 0)
        ds = H5Dcreate2(h->file, name, ck_h5_type(h, dt), vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (ds < 0) ck_h5_capture();
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sspace >= 0) H5Sclose(sspace);
    if (vspace >= 0) H5Sclose(vspace);
    if (ds < 0) return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': cannot create tensor %s", h->path, name);
    *out = ds;
    return CAI_OK;
}

cai_status ck_h5_dataset_info(ck_h5 *h, hid_t dset, const char *name, int *ndim, uint64_t *shape, cai_dtype *dt,
                              char *dtype_desc, size_t desc_cap) {
    hid_t space = H5Dget_space(dset), type = H5Dget_type(dset);
    if (space < 0 || type < 0) ck_h5_capture();
    cai_status st = CAI_OK;
    if (space < 0 || type < 0) {
        st = CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': tensor %s: cannot read its shape or type", h->path, name);
    } else {
        int nd = H5Sget_simple_extent_ndims(space);
        if (nd < 0 || nd > CAI_CKPT_MAX_DIMS) {
            st = CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': tensor %s has %d dimensions (at most %d)", h->path, name,
                          nd, CAI_CKPT_MAX_DIMS);
        } else {
            hsize_t dims[CAI_CKPT_MAX_DIMS];
            H5Sget_simple_extent_dims(space, dims, NULL);
            for (int d = 0; d < nd; d++) shape[d] = dims[d];
            *ndim = nd;
            *dt = ck_h5_dtype_of(type, dtype_desc, desc_cap);
        }
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    return st;
}

/* ------------------------------------------------------------ attributes */

static cai_status attr_write(ck_h5 *h, hid_t obj, const char *name, hid_t type, const void *v) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = space < 0 ? -1 : H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = a < 0 ? -1 : H5Awrite(a, type, v);
    if (rc < 0) ck_h5_capture();
    if (a >= 0) H5Aclose(a);
    if (space >= 0) H5Sclose(space);
    if (rc < 0) return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': cannot write attribute %s", h->path, name);
    return CAI_OK;
}

cai_status ck_h5_attr_i64(ck_h5 *h, hid_t obj, const char *name, int64_t v) {
    return attr_write(h, obj, name, H5T_STD_I64LE, &v);
}
cai_status ck_h5_attr_u64(ck_h5 *h, hid_t obj, const char *name, uint64_t v) {
    return attr_write(h, obj, name, H5T_STD_U64LE, &v);
}
cai_status ck_h5_attr_f64(ck_h5 *h, hid_t obj, const char *name, double v) {
    return attr_write(h, obj, name, H5T_IEEE_F64LE, &v);
}

/* A fixed-length, NUL-terminated ASCII/UTF-8 string type of `len` characters. */
static hid_t str_type(size_t len) {
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return t;
    if (H5Tset_size(t, len ? len : 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLTERM) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

cai_status ck_h5_attr_str(ck_h5 *h, hid_t obj, const char *name, const char *v) {
    size_t len = strlen(v) + 1;
    hid_t t = str_type(len);
    if (t < 0) return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': attribute %s: string type", h->path, name);
    cai_status st = attr_write(h, obj, name, t, v);
    H5Tclose(t);
    return st;
}

/* Open attribute `name`: -1 with *found = 0 when absent, an error when
 * found is NULL. */
static cai_status attr_open(ck_h5 *h, hid_t obj, const char *name, hid_t *a, int *found) {
    *a = -1;
    htri_t ex = H5Aexists(obj, name);
    if (ex < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot look up attribute %s", h->path, name);
    if (found) *found = ex > 0;
    if (ex == 0) {
        if (found) return CAI_OK;
        return CAI_ERROR(CAI_ERR_FORMAT,
                         "checkpoint '%s' lacks the attribute %s (not written by colossal, or "
                         "damaged)",
                         h->path, name);
    }
    *a = H5Aopen(obj, name, H5P_DEFAULT);
    if (*a < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot open attribute %s", h->path, name);
    return CAI_OK;
}

/* Numeric attributes are converted by HDF5 to the requested type; a string
 * where a number belongs is a format error. */
static cai_status attr_read_num(ck_h5 *h, hid_t obj, const char *name, hid_t mem, void *v, int *found) {
    hid_t a;
    CAI_CALL(attr_open(h, obj, name, &a, found));
    if (a < 0) return CAI_OK;
    hid_t t = H5Aget_type(a);
    H5T_class_t cls = t < 0 ? H5T_NO_CLASS : H5Tget_class(t);
    hid_t sp = H5Aget_space(a);
    hssize_t npts = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
    herr_t rc = (cls == H5T_INTEGER || cls == H5T_FLOAT) && npts == 1 ? H5Aread(a, mem, v) : -1;
    if (rc < 0) ck_h5_capture();
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    if (rc < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': attribute %s is not a number", h->path, name);
    return CAI_OK;
}

cai_status ck_h5_get_i64(ck_h5 *h, hid_t obj, const char *name, int64_t *v, int *found) {
    return attr_read_num(h, obj, name, H5T_NATIVE_INT64, v, found);
}
cai_status ck_h5_get_u64(ck_h5 *h, hid_t obj, const char *name, uint64_t *v, int *found) {
    return attr_read_num(h, obj, name, H5T_NATIVE_UINT64, v, found);
}
cai_status ck_h5_get_f64(ck_h5 *h, hid_t obj, const char *name, double *v, int *found) {
    return attr_read_num(h, obj, name, H5T_NATIVE_DOUBLE, v, found);
}

cai_status ck_h5_get_str(ck_h5 *h, hid_t obj, const char *name, char *buf, size_t cap, int *found) {
    hid_t a;
    buf[0] = '\0';
    CAI_CALL(attr_open(h, obj, name, &a, found));
    if (a < 0) return CAI_OK;
    hid_t t = H5Aget_type(a);
    cai_status st = CAI_OK;
    if (t < 0 || H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) > 0) {
        st = CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': attribute %s is not a fixed-length string", h->path, name);
    } else {
        size_t len = H5Tget_size(t);
        char *tmp = NULL;
        st = cai_malloc((void **)&tmp, len + 1, "checkpoint attribute");
        if (st == CAI_OK) {
            if (H5Aread(a, t, tmp) < 0) {
                st = CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot read attribute %s", h->path, name);
            } else {
                tmp[len] = '\0';
                snprintf(buf, cap, "%s", tmp);
            }
            cai_free(tmp);
        }
    }
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    return st;
}

/* ------------------------------------------------------------ text datasets */

/* A dataset `name` of file type ft over `space` written from buf (memory
 * type mt) by rank 0; the others take part with empty selections. Takes
 * ownership of space (closed here). */
static cai_status write_rank0(ck_h5 *h, const char *name, hid_t ft, hid_t mt, hid_t space, const void *buf) {
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    hid_t ds = -1, fsel = -1, msel = -1;
    herr_t rc = -1;
    if (ft >= 0 && space >= 0 && dxpl >= 0 && H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) >= 0)
        ds = H5Dcreate2(h->file, name, ft, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (ds >= 0) {
        fsel = H5Scopy(space);
        msel = H5Scopy(space);
        if (fsel >= 0 && msel >= 0 && (h->rank == 0 || (H5Sselect_none(fsel) >= 0 && H5Sselect_none(msel) >= 0)))
            rc = H5Dwrite(ds, mt, msel, fsel, dxpl, buf);
    }
    if (rc < 0) ck_h5_capture();
    if (msel >= 0) H5Sclose(msel);
    if (fsel >= 0) H5Sclose(fsel);
    if (ds >= 0) H5Dclose(ds);
    if (dxpl >= 0) H5Pclose(dxpl);
    if (space >= 0) H5Sclose(space);
    if (rc < 0) return CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': cannot write %s", h->path, name);
    return CAI_OK;
}

cai_status ck_h5_text_write(ck_h5 *h, const char *name, const char *text) {
    hid_t t = str_type(strlen(text) + 1);
    cai_status st = write_rank0(h, name, t, t, H5Screate(H5S_SCALAR), text);
    if (t >= 0) H5Tclose(t);
    return st;
}

cai_status ck_h5_text_read(ck_h5 *h, const char *name, char **out, int *found) {
    *out = NULL;
    *found = 0;
    htri_t ex = H5Lexists(h->file, name, H5P_DEFAULT);
    if (ex < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot look up %s", h->path, name);
    if (ex == 0) return CAI_OK;
    hid_t ds = H5Dopen2(h->file, name, H5P_DEFAULT);
    hid_t t = ds < 0 ? -1 : H5Dget_type(ds);
    if (t < 0) ck_h5_capture();
    cai_status st = CAI_OK;
    if (t < 0 || H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) > 0) {
        st = CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': %s is not a fixed-length string", h->path, name);
    } else {
        size_t len = H5Tget_size(t);
        char *buf = NULL;
        st = cai_malloc((void **)&buf, len + 1, "checkpoint config text");
        if (st == CAI_OK) {
            if (H5Dread(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
                cai_free(buf);
                st = CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot read %s", h->path, name);
            } else {
                buf[len] = '\0';
                /* cai_malloc memory is released with cai_free; hand out a
                 * plain malloc copy so callers free() it. */
                *out = strdup(buf);
                cai_free(buf);
                if (!*out) st = CAI_ERROR(CAI_ERR_NOMEM, "checkpoint '%s': %s: %zu bytes", h->path, name, len);
                else *found = 1;
            }
        }
    }
    if (t >= 0) H5Tclose(t);
    if (ds >= 0) H5Dclose(ds);
    return st;
}

/* ------------------------------------------------------------ small f32 arrays */

cai_status ck_h5_f32_write(ck_h5 *h, const char *name, const float *v, size_t n) {
    hsize_t dims[1] = {(hsize_t)n};
    return write_rank0(h, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, H5Screate_simple(1, dims, NULL), v);
}

cai_status ck_h5_f32_read(ck_h5 *h, const char *name, float **out, size_t *n) {
    *out = NULL;
    *n = 0;
    htri_t ex = H5Lexists(h->file, name, H5P_DEFAULT);
    if (ex < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot look up %s", h->path, name);
    if (ex == 0) return CAI_OK;
    hid_t ds = H5Dopen2(h->file, name, H5P_DEFAULT), space = ds < 0 ? -1 : H5Dget_space(ds);
    cai_status st = CAI_OK;
    hsize_t dims[1] = {0};
    if (space < 0 || H5Sget_simple_extent_ndims(space) != 1 || H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
        ck_h5_capture();
        st = CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': %s is not a 1-D array", h->path, name);
    } else {
        float *buf = malloc(dims[0] ? (size_t)dims[0] * sizeof(float) : 1);
        if (!buf)
            st = CAI_ERROR(CAI_ERR_NOMEM, "checkpoint '%s': %s: %llu values", h->path, name,
                           (unsigned long long)dims[0]);
        else if (dims[0] && H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
            free(buf);
            st = CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot read %s", h->path, name);
        } else {
            *out = buf;
            *n = (size_t)dims[0];
        }
    }
    if (space >= 0) H5Sclose(space);
    if (ds >= 0) H5Dclose(ds);
    return st;
}

/* ------------------------------------------------------------ transfers */

/* Select the union of 1-D ranges (segments' storage ranges, or memory
 * ranges with use_m). Runs of equally long, equally spaced ranges become
 * one strided hyperslab, so a tensor-parallel row split is one call per
 * tensor, not one per row. */
static herr_t select_ranges(hid_t space, const ck_seg *segs, size_t n, int use_m) {
    herr_t rc = 0;
    for (size_t i = 0; i < n && rc >= 0;) {
        uint64_t start = use_m ? segs[i].m : segs[i].s, block = segs[i].n, stride = 0;
        size_t k = 1;
        if (i + 1 < n && segs[i + 1].n == block) {
            stride = (use_m ? segs[i + 1].m : segs[i + 1].s) - start;
            while (i + k < n && segs[i + k].n == block && (use_m ? segs[i + k].m : segs[i + k].s) == start + k * stride)
                k++;
        }
        hsize_t st = start, sd = k > 1 ? stride : 1, ct = k, bl = block;
        rc = H5Sselect_hyperslab(space, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, &st, &sd, &ct, &bl);
        i += k;
    }
    return rc;
}

cai_status ck_h5_transfer(ck_h5 *h, hid_t dset, cai_dtype dt, const ck_seg *segs, size_t n, uint64_t nsel,
                          const ck_mem *mem, void *buf, int write, const char *what, ck_io_counts *io) {
    /* One block of memory: hand HDF5 its address and a plain contiguous
     * space. A selection inside a larger space becomes a derived MPI
     * datatype, which MPI-IO implementations copy through a bounce buffer. */
    if (mem && n) {
        int one = 1;
        for (size_t i = 1; i < n && one; i++) one = segs[i].m == segs[i - 1].m + segs[i - 1].n;
        if (one) {
            buf = (char *)buf + segs[0].m * cai_dtype_size(dt);
            mem = NULL;
        }
    }
    hid_t fspace = H5Dget_space(dset);
    hsize_t mdim = mem ? (mem->len ? mem->len : 1) : (nsel ? nsel : 1);
    hid_t mspace = H5Screate_simple(1, &mdim, NULL);
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    cai_status st = CAI_OK;
    herr_t rc = fspace < 0 || mspace < 0 || dxpl < 0 ? -1
                : h->serial                          ? 0
                                                     : H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
    if (rc >= 0 && !h->serial && h->independent_mpiio)
        rc = H5Pset_dxpl_mpio_collective_opt(dxpl, H5FD_MPIO_INDIVIDUAL_IO);
    if (rc >= 0 && (n == 0 || nsel == 0)) rc = H5Sselect_none(fspace) < 0 || H5Sselect_none(mspace) < 0 ? -1 : 0;
    else if (rc >= 0)
        rc = select_ranges(fspace, segs, n, 0) < 0 || (mem && select_ranges(mspace, segs, n, 1) < 0) ? -1 : 0;
    if (rc < 0) {
        st = CK_H5ERR(CAI_ERR_HDF5, "checkpoint '%s': %s: cannot select the ranges", h->path, what);
        goto done;
    }
    static char dummy[8];
    void *p = buf && n && nsel ? buf : dummy;
    double t0 = cai_time_now();
    errno = 0;
    rc = write ? H5Dwrite(dset, ck_h5_type(h, dt), mspace, fspace, dxpl, p)
               : H5Dread(dset, ck_h5_type(h, dt), mspace, fspace, dxpl, p);
    io->io_seconds += cai_time_now() - t0;
    if (rc < 0) {
        /* The file system's reason, where the MPI-IO layer left it. */
        int err = errno;
        const char *why = err == ENOSPC || err == EDQUOT || err == EFBIG || err == EIO ? strerror(err) : NULL;
        st = CK_H5ERR(write ? CAI_ERR_IO : CAI_ERR_FORMAT, "checkpoint '%s': %s: %s failed%s%s", h->path, what,
                      write ? "writing" : "reading", why ? ": " : "", why ? why : "");
        goto done;
    }
    H5D_mpio_actual_io_mode_t mode = H5D_MPIO_NO_COLLECTIVE;
    if (!h->serial) H5Pget_mpio_actual_io_mode(dxpl, &mode);
    io->n_transfers++;
    if (mode == H5D_MPIO_CONTIGUOUS_COLLECTIVE || mode == H5D_MPIO_CHUNK_COLLECTIVE) io->n_collective++;
    io->bytes += nsel * cai_dtype_size(dt);
done:
    if (dxpl >= 0) H5Pclose(dxpl);
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    return st;
}

#else
typedef int ck_h5io_unused; /* nothing to build without parallel HDF5 */
#endif /* CAI_HAVE_HDF5 */
