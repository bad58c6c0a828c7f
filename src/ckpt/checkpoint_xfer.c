/* Segment lists and the collective transfer of one piece of them: pack or
 * unpack (converting element types, staging device memory on the host: HDF5
 * always sees memory type == file type), checksum, and one H5Dwrite /
 * H5Dread of the group's flat storage. A host buffer already in the file's
 * type whose segments are in order is handed to HDF5 as it is, with the
 * memory selection picking the ranges out of it. */
#include "cai_config.h"

#include <stdlib.h>
#include <string.h>

#include "checkpoint_internal.h"
#include "colossal/tensor.h"

static cai_status append(ck_segs *l, ck_seg g);

static int continues(const ck_seg *a, const ck_seg *b) {
    return a->s + a->n == b->s && a->m + a->n == b->m && a->p == b->p && a->hash == b->hash;
}

cai_status ck_segs_push(ck_segs *l, ck_seg g) {
    if (g.n == 0) return CAI_OK;
    if (l->n && continues(&l->v[l->n - 1], &g)) {
        l->v[l->n - 1].n += g.n;
        return CAI_OK;
    }
    return append(l, g);
}

void ck_segs_free(ck_segs *l) {
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int seg_cmp(const void *x, const void *y) {
    const ck_seg *a = x, *b = y;
    return a->s < b->s ? -1 : a->s > b->s;
}

void ck_segs_sort(ck_segs *l, int *m_in_order) {
    int sorted = 1;
    for (size_t i = 1; i < l->n && sorted; i++) sorted = l->v[i - 1].s < l->v[i].s;
    if (!sorted) qsort(l->v, l->n, sizeof *l->v, seg_cmp);
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (k && continues(&l->v[k - 1], &l->v[i])) l->v[k - 1].n += l->v[i].n;
        else l->v[k++] = l->v[i];
    }
    l->n = k;
    *m_in_order = 1;
    for (size_t i = 1; i < l->n && *m_in_order; i++) *m_in_order = l->v[i - 1].m + l->v[i - 1].n <= l->v[i].m;
}

static cai_status append(ck_segs *l, ck_seg g) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 64;
        ck_seg *grown = realloc(l->v, nc * sizeof *grown);
        if (!grown) return CAI_ERROR(CAI_ERR_NOMEM, "checkpoint: cannot grow a segment list to %zu entries", nc);
        l->v = grown;
        l->cap = nc;
    }
    l->v[l->n++] = g;
    return CAI_OK;
}

cai_status ck_segs_pieces(ck_segs *l, uint64_t cap, size_t **starts, size_t *n_pieces) {
    *starts = NULL;
    *n_pieces = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < l->n; i++) total += l->v[i].n;
    if (total == 0) return CAI_OK;
    size_t *st = calloc((size_t)((total + cap - 1) / cap) + 1, sizeof *st);
    if (!st) return CAI_ERROR(CAI_ERR_NOMEM, "checkpoint: piece table");
    ck_segs out = {0};
    size_t np = 0;
    uint64_t room = 0; /* left in the current piece */
    cai_status rc = CAI_OK;
    for (size_t i = 0; i < l->n && rc == CAI_OK; i++) {
        ck_seg g = l->v[i];
        while (g.n && rc == CAI_OK) {
            if (room == 0) {
                st[np++] = out.n;
                room = cap;
            }
            ck_seg part = g;
            part.n = g.n < room ? g.n : room;
            rc = append(&out, part);
            room -= part.n;
            g.s += part.n;
            g.m += part.n;
            g.n -= part.n;
        }
    }
    if (rc != CAI_OK) {
        free(st);
        ck_segs_free(&out);
        return rc;
    }
    st[np] = out.n;
    ck_segs_free(l);
    *l = out;
    *starts = st;
    *n_pieces = np;
    return CAI_OK;
}

#if CAI_HAVE_HDF5

void ck_xfer_init(ck_xfer *x, ck_h5 *h, uint64_t piece_elems) {
    memset(x, 0, sizeof *x);
    x->h = h;
    x->piece = piece_elems ? piece_elems : CK_PIECE_BYTES / 4;
}

void ck_xfer_free(ck_xfer *x) {
    cai_free(x->stage);
    if (x->host) cai_device_dealloc_staging(x->host_dev, x->host);
    memset(x, 0, sizeof *x);
}

static cai_status need_stage(ck_xfer *x) {
    if (!x->stage) CAI_CALL(cai_malloc(&x->stage, (size_t)x->piece * 4, "checkpoint staging buffer"));
    return CAI_OK;
}

static cai_status need_host(ck_xfer *x, cai_device_t *dev) {
    if (x->host && x->host_dev != dev) {
        cai_device_dealloc_staging(x->host_dev, x->host);
        x->host = NULL;
    }
    if (!x->host) {
        CAI_CALL(cai_device_alloc_staging(dev, (size_t)x->piece * 4, "checkpoint device staging", &x->host));
        x->host_dev = dev;
    }
    return CAI_OK;
}

/* Checksums of the hashed segments, whose elements sit at data (file type):
 * packed in segment order, or in place at their memory index. */
static void hash_segs(const ck_seg *segs, size_t n, const char *data, int packed, size_t fsz,
                      const uint64_t *tensor_off, uint64_t *xsum) {
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const ck_seg *g = &segs[i];
        if (g->hash) {
            const char *at = data + (packed ? pos : g->m) * fsz;
            xsum[g->p] += ck_xsum(at, fsz, g->s - tensor_off[g->p], g->n);
        }
        pos += g->n;
    }
}

cai_status ck_xfer_segs(ck_xfer *x, hid_t storage, cai_dtype fdt, const ck_seg *segs, size_t n, int write,
                        const ck_mem *mem, int m_in_order, const uint64_t *tensor_off, uint64_t *xsum,
                        const char *what) {
    uint64_t nsel = 0;
    for (size_t i = 0; i < n; i++) nsel += segs[i].n;
    if (write && !mem) n = nsel = 0; /* a failed rank still takes part */
    if (nsel > x->piece)
        return CAI_ERROR(CAI_ERR_INTERNAL, "checkpoint: %s: piece of %llu elements exceeds the %llu staged", what,
                         (unsigned long long)nsel, (unsigned long long)x->piece);
    size_t fsz = cai_dtype_size(fdt), msz = mem ? cai_dtype_size(mem->dtype) : 0;
    int on_dev = mem && mem->dev && mem->dev->kind != CAI_DEVICE_HOST;
    int direct = nsel && mem && !on_dev && mem->dtype == fdt && m_in_order;
    if (nsel && !direct) CAI_CALL(need_stage(x));
    if (nsel && on_dev) CAI_CALL(need_host(x, mem->dev));
    char *stage = x->stage;
    if (write) {
        if (nsel && !direct) {
            uint64_t pos = 0;
            for (size_t i = 0; i < n; i++) {
                const ck_seg *g = &segs[i];
                const char *src = mem->base + g->m * msz;
                if (on_dev) {
                    CAI_CALL(cai_device_copy(mem->dev, x->host, src, g->n * msz, CAI_COPY_D2H));
                    CAI_CALL(cai_device_sync(mem->dev));
                    src = x->host;
                }
                CAI_CALL(cai_convert_host(stage + pos * fsz, fdt, src, mem->dtype, (size_t)g->n));
                pos += g->n;
            }
        }
        if (nsel && xsum) hash_segs(segs, n, direct ? mem->base : stage, !direct, fsz, tensor_off, xsum);
        return ck_h5_transfer(x->h, storage, fdt, segs, n, nsel, direct ? mem : NULL, direct ? mem->base : stage, 1,
                              what, &x->io);
    }
    CAI_CALL(ck_h5_transfer(x->h, storage, fdt, segs, n, nsel, direct ? mem : NULL, direct ? mem->base : stage, 0, what,
                            &x->io));
    if (!nsel) return CAI_OK;
    if (xsum) hash_segs(segs, n, direct ? mem->base : stage, !direct, fsz, tensor_off, xsum);
    if (mem && !direct) {
        uint64_t pos = 0;
        for (size_t i = 0; i < n; i++) {
            const ck_seg *g = &segs[i];
            char *dst = on_dev ? x->host : mem->base + g->m * msz;
            CAI_CALL(cai_convert_host(dst, mem->dtype, stage + pos * fsz, fdt, (size_t)g->n));
            if (on_dev) {
                CAI_CALL(cai_device_copy(mem->dev, mem->base + g->m * msz, x->host, g->n * msz, CAI_COPY_H2D));
                CAI_CALL(cai_device_sync(mem->dev));
            }
            pos += g->n;
        }
    }
    return CAI_OK;
}

#endif /* CAI_HAVE_HDF5 */
