/* Reading a checkpoint without a model: list the datasets and attributes,
 * read whole global tensors, recompute checksums. For tools (inspect,
 * verify, export); every call is collective over the communicator the file
 * was opened with, since several ranks open it through MPI-IO with
 * collective metadata (one rank alone reads through the POSIX driver). */
#include "cai_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_internal.h"

#if CAI_HAVE_HDF5

/* Where a tensor's elements are: its storage dataset and offset there. */
typedef struct {
    char storage[CAI_CKPT_NAME_MAX];
    uint64_t offset;
} entry_place;

struct cai_ckpt_file {
    ck_h5 h;
    cai_ckpt_meta meta;
    cai_ckpt_entry *entries;
    entry_place *places; /* parallel to entries */
    int n, cap;
    char **keys, **values;
    int n_attr, attr_cap;
    int *by_name; /* entry indices sorted by name, for cai_ckpt_find */
};

typedef struct {
    char **names;
    int n, cap;
    int failed;
} name_list;

static int push_name(name_list *l, const char *name) {
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 64;
        char **g = realloc(l->names, (size_t)nc * sizeof *g);
        if (!g) return -1;
        l->names = g;
        l->cap = nc;
    }
    if (!(l->names[l->n] = strdup(name))) return -1;
    l->n++;
    return 0;
}

static void free_names(name_list *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

static herr_t link_cb(hid_t g, const char *name, const H5L_info_t *info, void *data) {
    (void)g;
    name_list *l = data;
    if (info->type != H5L_TYPE_HARD) return 0;
    if (push_name(l, name) != 0) {
        l->failed = 1;
        return -1;
    }
    return 0;
}

static herr_t attr_cb(hid_t obj, const char *name, const H5A_info_t *info, void *data) {
    (void)obj;
    (void)info;
    name_list *l = data;
    if (push_name(l, name) != 0) {
        l->failed = 1;
        return -1;
    }
    return 0;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const cai_ckpt_entry *)a)->name, ((const cai_ckpt_entry *)b)->name);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every tensor (the datasets outside storage/, except the config text), with
 * its shape, type, stored checksum and place in the storage. */
static cai_status list_datasets(cai_ckpt_file_t *f) {
    name_list l;
    memset(&l, 0, sizeof l);
    cai_status st = CAI_OK;
    if (H5Lvisit(f->h.file, H5_INDEX_NAME, H5_ITER_INC, link_cb, &l) < 0)
        st = l.failed ? CAI_ERROR(CAI_ERR_NOMEM, "checkpoint '%s': listing its objects", f->h.path)
                      : CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot list its objects", f->h.path);
    for (int i = 0; st == CAI_OK && i < l.n; i++) {
        if (strcmp(l.names[i], CK_CONFIG_DATASET) == 0 || strcmp(l.names[i], CK_FP8_DATASET) == 0 ||
            strcmp(l.names[i], CK_APP_DATASET) == 0 || strncmp(l.names[i], "storage/", 8) == 0)
            continue;
        hid_t o = H5Oopen(f->h.file, l.names[i], H5P_DEFAULT);
        if (o < 0) {
            st = CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot open %s", f->h.path, l.names[i]);
            break;
        }
        if (H5Iget_type(o) != H5I_DATASET) {
            H5Oclose(o);
            continue;
        }
        if (f->n == f->cap) {
            int nc = f->cap ? 2 * f->cap : 64;
            cai_ckpt_entry *g = realloc(f->entries, (size_t)nc * sizeof *g);
            if (g) f->entries = g;
            entry_place *pl = g ? realloc(f->places, (size_t)nc * sizeof *pl) : NULL;
            if (pl) f->places = pl;
            if (!g || !pl) {
                H5Oclose(o);
                st = CAI_ERROR(CAI_ERR_NOMEM, "checkpoint '%s': dataset list", f->h.path);
                break;
            }
            f->cap = nc;
        }
        cai_ckpt_entry *e = &f->entries[f->n];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", l.names[i]);
        st = ck_h5_dataset_info(&f->h, o, e->name, &e->ndim, e->shape, &e->dtype, e->dtype_desc, sizeof e->dtype_desc);
        if (st == CAI_OK && !ck_file_dtype_ok(e->dtype)) e->dtype = CAI_DTYPE_COUNT;
        e->numel = 1;
        for (int d = 0; d < e->ndim; d++) e->numel *= e->shape[d];
        if (st == CAI_OK) st = ck_h5_get_u64(&f->h, o, "xsum64", &e->checksum, &e->has_checksum);
        entry_place *pl = &f->places[f->n];
        int has_place = 0;
        if (st == CAI_OK) st = ck_h5_get_str(&f->h, o, "storage", pl->storage, sizeof pl->storage, &has_place);
        if (st == CAI_OK && has_place) st = ck_h5_get_u64(&f->h, o, "storage_offset", &pl->offset, &has_place);
        if (st == CAI_OK && !has_place)
            st = CAI_ERROR(CAI_ERR_FORMAT,
                           "checkpoint '%s': tensor %s has no storage/storage_offset attributes (not "
                           "written by colossal?)",
                           f->h.path, e->name);
        H5Oclose(o);
        if (st == CAI_OK) f->n++;
    }
    free_names(&l);
    /* H5Lvisit already walks names in increasing order (H5_INDEX_NAME,
     * H5_ITER_INC), which is the order promised. */
    (void)cmp_entry;
    return st;
}

/* Root attribute `name` as text. */
static cai_status attr_text(cai_ckpt_file_t *f, const char *name, char *out, size_t cap) {
    hid_t a = H5Aopen(f->h.file, name, H5P_DEFAULT);
    hid_t t = a < 0 ? -1 : H5Aget_type(a);
    H5T_class_t cls = t < 0 ? H5T_NO_CLASS : H5Tget_class(t);
    H5T_sign_t sign = cls == H5T_INTEGER ? H5Tget_sign(t) : H5T_SGN_NONE;
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    if (a < 0) return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot open attribute %s", f->h.path, name);
    if (cls == H5T_STRING) return ck_h5_get_str(&f->h, f->h.file, name, out, cap, NULL);
    if (cls == H5T_INTEGER && sign == H5T_SGN_NONE) {
        uint64_t v = 0;
        CAI_CALL(ck_h5_get_u64(&f->h, f->h.file, name, &v, NULL));
        snprintf(out, cap, "%llu", (unsigned long long)v);
    } else if (cls == H5T_INTEGER) {
        int64_t v = 0;
        CAI_CALL(ck_h5_get_i64(&f->h, f->h.file, name, &v, NULL));
        snprintf(out, cap, "%lld", (long long)v);
    } else if (cls == H5T_FLOAT) {
        double v = 0;
        CAI_CALL(ck_h5_get_f64(&f->h, f->h.file, name, &v, NULL));
        snprintf(out, cap, "%.17g", v);
    } else {
        snprintf(out, cap, "(unprintable)");
    }
    return CAI_OK;
}

static cai_status list_attrs(cai_ckpt_file_t *f) {
    name_list l;
    memset(&l, 0, sizeof l);
    hsize_t idx = 0;
    cai_status st = CAI_OK;
    if (H5Aiterate2(f->h.file, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_cb, &l) < 0)
        st = CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': cannot list its attributes", f->h.path);
    if (st == CAI_OK && l.n > 1) qsort(l.names, (size_t)l.n, sizeof *l.names, cmp_str);
    if (st == CAI_OK && l.n) {
        f->keys = calloc((size_t)l.n, sizeof *f->keys);
        f->values = calloc((size_t)l.n, sizeof *f->values);
        if (!f->keys || !f->values) st = CAI_ERROR(CAI_ERR_NOMEM, "checkpoint attribute list");
    }
    for (int i = 0; st == CAI_OK && i < l.n; i++) {
        char v[1024];
        st = attr_text(f, l.names[i], v, sizeof v);
        if (st != CAI_OK) break;
        f->keys[i] = l.names[i];
        l.names[i] = NULL;
        f->values[i] = strdup(v);
        f->n_attr = i + 1;
        if (!f->values[i]) st = CAI_ERROR(CAI_ERR_NOMEM, "checkpoint attribute list");
    }
    free_names(&l);
    return st;
}

static const cai_ckpt_file_t *g_sorting; /* qsort has no context argument */

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(g_sorting->entries[*(const int *)a].name, g_sorting->entries[*(const int *)b].name);
}

static cai_status index_entries(cai_ckpt_file_t *f) {
    f->by_name = malloc(((size_t)f->n + 1) * sizeof *f->by_name);
    if (!f->by_name) return CAI_ERROR(CAI_ERR_NOMEM, "checkpoint '%s': name index", f->h.path);
    for (int i = 0; i < f->n; i++) f->by_name[i] = i;
    g_sorting = f;
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_by_name);
    g_sorting = NULL;
    /* HDF5 keeps link names unique within a group, so a repeat is a
     * corrupt group; a lookup would silently take one of the two. */
    for (int k = 1; k < f->n; k++) {
        const cai_ckpt_entry *a = &f->entries[f->by_name[k - 1]], *b = &f->entries[f->by_name[k]];
        if (strcmp(a->name, b->name) == 0)
            return CAI_ERROR(CAI_ERR_FORMAT,
                             "checkpoint '%s': tensor %s is listed twice (%llu and %llu elements); the file's "
                             "group is corrupt",
                             f->h.path, a->name, (unsigned long long)a->numel, (unsigned long long)b->numel);
    }
    return CAI_OK;
}

/* The reading of an opened file's metadata, shared by both ways in. */
static cai_status open_file(cai_ckpt_file_t **out, MPI_Comm comm, const char *path, const void *image, size_t size) {
    *out = NULL;
    cai_ckpt_file_t *f = calloc(1, sizeof *f);
    if (!f) return CAI_ERROR(CAI_ERR_NOMEM, "checkpoint handle");
    f->meta = cai_ckpt_meta_init();
    cai_status st = image ? ck_h5_open_image(&f->h, path, image, size) : ck_h5_open(&f->h, comm, path, 1);
    if (st == CAI_OK) st = ck_read_meta(&f->h, &f->meta);
    if (st == CAI_OK) st = list_datasets(f);
    if (st == CAI_OK) st = list_attrs(f);
    if (st == CAI_OK) st = index_entries(f);
    if (st != CAI_OK) {
        cai_ckpt_close(f);
        return st;
    }
    *out = f;
    return CAI_OK;
}

cai_status cai_ckpt_open(cai_ckpt_file_t **out, MPI_Comm comm, const char *path) {
    CAI_CHECK_ARG(out && path && *path, "cai_ckpt_open: NULL argument");
    return open_file(out, comm, path, NULL, 0);
}

cai_status ck_file_open_image(cai_ckpt_file_t **out, const char *name, const void *image, size_t size) {
    CAI_CHECK_ARG(out && name && *name && (image || size == 0), "ck_file_open_image: NULL argument");
    static const char empty[1];
    return open_file(out, MPI_COMM_SELF, name, image ? image : empty, size);
}

void cai_ckpt_close(cai_ckpt_file_t *f) {
    if (!f) return;
    ck_h5_close(&f->h);
    cai_ckpt_meta_free(&f->meta);
    free(f->entries);
    free(f->places);
    free(f->by_name);
    for (int i = 0; i < f->n_attr; i++) {
        free(f->keys[i]);
        free(f->values[i]);
    }
    free(f->keys);
    free(f->values);
    free(f);
}

const char *cai_ckpt_path(const cai_ckpt_file_t *f) { return f->h.path; }
const cai_ckpt_meta *cai_ckpt_file_meta(const cai_ckpt_file_t *f) { return &f->meta; }
int cai_ckpt_count(const cai_ckpt_file_t *f) { return f->n; }
const cai_ckpt_entry *cai_ckpt_entry_at(const cai_ckpt_file_t *f, int i) {
    return i >= 0 && i < f->n ? &f->entries[i] : NULL;
}
const cai_ckpt_entry *cai_ckpt_find(const cai_ckpt_file_t *f, const char *name) {
    if (!f || !name) return NULL;
    if (*name == '/') name++;
    int lo = 0, hi = f->n; /* bisection over the sorted index */
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2, c = strcmp(f->entries[f->by_name[mid]].name, name);
        if (c == 0) return &f->entries[f->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}
int cai_ckpt_attr_count(const cai_ckpt_file_t *f) { return f->n_attr; }
void cai_ckpt_attr_at(const cai_ckpt_file_t *f, int i, const char **key, const char **value) {
    int ok = i >= 0 && i < f->n_attr;
    if (key) *key = ok ? f->keys[i] : NULL;
    if (value) *value = ok ? f->values[i] : NULL;
}

/* Move every element of entry i in pieces: mem NULL hashes this rank's
 * share (a contiguous chunk per rank of the comm) into *xsum; otherwise
 * every rank reads the whole tensor into mem. */
/* The transfer pieces: at most CK_PIECE_BYTES, and no larger than `numel`
 * elements needs, so that a small tensor does not map a 1 GiB staging
 * buffer (once per tensor, that made verify cost the tensor count times a
 * gigabyte's page faults). The same on every rank: numel is. */
static uint64_t piece_for(uint64_t numel) {
    const uint64_t most = CK_PIECE_BYTES / 4;
    return numel == 0 ? 1 : numel < most ? numel : most;
}

static cai_status scan_entry(cai_ckpt_file_t *f, int i, const ck_mem *mem, uint64_t *xsum, ck_xfer *xp) {
    const cai_ckpt_entry *e = &f->entries[i];
    const entry_place *pl = &f->places[i];
    hid_t ds = H5Dopen2(f->h.file, pl->storage, H5P_DEFAULT);
    if (ds < 0)
        return CK_H5ERR(CAI_ERR_FORMAT, "checkpoint '%s': tensor %s: cannot open its storage %s", f->h.path, e->name,
                        pl->storage);
    ck_xfer own;
    ck_xfer *xf = xp;
    if (!xf) {
        ck_xfer_init(&own, &f->h, piece_for(e->numel));
        xf = &own;
    }
    uint64_t a = 0, z = e->numel;
    if (!mem) ck_replica_chunk(0, e->numel, f->h.rank, f->h.size, &a, &z);
    /* The same number of transfers on every rank: the largest chunk's. */
    uint64_t biggest = mem ? e->numel : (e->numel + (uint64_t)f->h.size - 1) / (uint64_t)f->h.size;
    uint64_t rounds = (biggest + xf->piece - 1) / xf->piece;
    uint64_t off = pl->offset;
    cai_status st = CAI_OK;
    for (uint64_t r = 0; r < rounds; r++) {
        uint64_t pa = a + r * xf->piece, pz = pa + xf->piece < z ? pa + xf->piece : z;
        ck_seg g = {off + pa, pa, pz > pa ? pz - pa : 0, 0, !mem};
        int some = st == CAI_OK && pa < z;
        cai_status s =
            ck_xfer_segs(xf, ds, e->dtype, &g, some ? 1 : 0, 0, st == CAI_OK ? mem : NULL, 1, &off, xsum, e->name);
        if (s != CAI_OK && st == CAI_OK) st = s;
    }
    if (!xp) ck_xfer_free(&own);
    H5Dclose(ds);
    return st;
}

cai_status cai_ckpt_read(cai_ckpt_file_t *f, const char *name, cai_dtype dtype, void *dst) {
    CAI_CHECK_ARG(f && name, "cai_ckpt_read: NULL argument");
    const cai_ckpt_entry *e = cai_ckpt_find(f, name);
    if (!e) return CAI_ERROR(CAI_ERR_INVALID_ARG, "checkpoint '%s' has no tensor %s", f->h.path, name);
    if (e->dtype == CAI_DTYPE_COUNT)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "checkpoint '%s': tensor %s has element type %s, not f32/bf16/f16",
                         f->h.path, name, e->dtype_desc);
    CAI_CHECK_ARG(ck_file_dtype_ok(dtype), "cai_ckpt_read: dtype %s: only f32, bf16 and f16", cai_dtype_name(dtype));
    CAI_CHECK_ARG(dst || e->numel == 0, "cai_ckpt_read: NULL destination");
    ck_mem mem = {dst, e->numel, dtype, NULL};
    cai_status st = scan_entry(f, (int)(e - f->entries), &mem, NULL, NULL);
    CAI_CALL(ck_agree(f->h.comm, st));
    return CAI_OK;
}

cai_status cai_ckpt_verify(cai_ckpt_file_t *f, uint64_t *computed, int *n_bad) {
    CAI_CHECK_ARG(f, "cai_ckpt_verify: NULL file");
    uint64_t *xs = calloc((size_t)f->n + 1, sizeof *xs);
    if (!xs) return CAI_ERROR(CAI_ERR_NOMEM, "checkpoint verification sums");
    cai_status st = CAI_OK;
    /* One staging buffer for every tensor: the largest share a rank hashes. */
    uint64_t most = 0;
    for (int i = 0; i < f->n; i++) {
        const uint64_t share = (f->entries[i].numel + (uint64_t)f->h.size - 1) / (uint64_t)f->h.size;
        if (share > most) most = share;
    }
    ck_xfer x;
    ck_xfer_init(&x, &f->h, piece_for(most));
    for (int i = 0; i < f->n; i++) {
        if (f->entries[i].dtype == CAI_DTYPE_COUNT) continue; /* counted bad below */
        cai_status s = scan_entry(f, i, NULL, &xs[i], &x);
        if (s != CAI_OK && st == CAI_OK) st = s;
    }
    ck_xfer_free(&x);
    st = ck_agree(f->h.comm, st);
    if (st == CAI_OK && MPI_Allreduce(MPI_IN_PLACE, xs, f->n, MPI_UINT64_T, MPI_SUM, f->h.comm) != MPI_SUCCESS)
        st = CAI_ERROR(CAI_ERR_MPI, "checkpoint verification: summing the checksums failed");
    int bad = 0, first = -1;
    for (int i = 0; st == CAI_OK && i < f->n; i++) {
        const cai_ckpt_entry *e = &f->entries[i];
        if (computed) computed[i] = xs[i];
        if (e->dtype == CAI_DTYPE_COUNT || !e->has_checksum || e->checksum != xs[i]) {
            if (first < 0) first = i;
            bad++;
        }
    }
    if (n_bad) *n_bad = bad;
    if (st == CAI_OK && bad) {
        const cai_ckpt_entry *e = &f->entries[first];
        char why[160];
        if (e->dtype == CAI_DTYPE_COUNT) snprintf(why, sizeof why, "has element type %s", e->dtype_desc);
        else if (!e->has_checksum) snprintf(why, sizeof why, "has no stored checksum (xsum64 attribute)");
        else
            snprintf(why, sizeof why, "hashes to %016llx but %016llx was stored", (unsigned long long)xs[first],
                     (unsigned long long)e->checksum);
        st = CAI_ERROR(CAI_ERR_FORMAT, "checkpoint '%s': tensor %s %s (%d of %d tensors fail verification)", f->h.path,
                       e->name, why, bad, f->n);
    }
    free(xs);
    return st;
}

#else /* !CAI_HAVE_HDF5 */

struct cai_ckpt_file {
    int unused;
};

cai_status cai_ckpt_open(cai_ckpt_file_t **out, MPI_Comm comm, const char *path) {
    if (out) *out = NULL;
    return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                     "cannot open checkpoint '%s': this build has no parallel HDF5 (install "
                     "libhdf5-openmpi-dev and re-run configure)",
                     path ? path : "(null)");
}
void cai_ckpt_close(cai_ckpt_file_t *f) { (void)f; }
const char *cai_ckpt_path(const cai_ckpt_file_t *f) { return ""; }
const cai_ckpt_meta *cai_ckpt_file_meta(const cai_ckpt_file_t *f) { return NULL; }
int cai_ckpt_count(const cai_ckpt_file_t *f) { return 0; }
const cai_ckpt_entry *cai_ckpt_entry_at(const cai_ckpt_file_t *f, int i) { return NULL; }
const cai_ckpt_entry *cai_ckpt_find(const cai_ckpt_file_t *f, const char *name) { return NULL; }
int cai_ckpt_attr_count(const cai_ckpt_file_t *f) { return 0; }
void cai_ckpt_attr_at(const cai_ckpt_file_t *f, int i, const char **key, const char **value) {
    if (key) *key = NULL;
    if (value) *value = NULL;
}
cai_status cai_ckpt_read(cai_ckpt_file_t *f, const char *name, cai_dtype dtype, void *dst) {
    return CAI_ERROR(CAI_ERR_UNSUPPORTED, "cai_ckpt_read: this build has no parallel HDF5");
}
cai_status cai_ckpt_verify(cai_ckpt_file_t *f, uint64_t *computed, int *n_bad) {
    return CAI_ERROR(CAI_ERR_UNSUPPORTED, "cai_ckpt_verify: this build has no parallel HDF5");
}

#endif
