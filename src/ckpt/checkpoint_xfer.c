/* One collective transfer of a piece of a shard: plan the selection, pack
 * or unpack it (converting element types and staging device memory on the
 * host: HDF5 always sees memory type == file type), checksum it, and call
 * H5Dwrite / H5Dread. When the piece is one contiguous run already in the
 * file's type in host memory the buffer goes to HDF5 as it is. */
#include "cai_config.h"

#if CAI_HAVE_HDF5

#include <stdlib.h>
#include <string.h>

#include "checkpoint_internal.h"
#include "colossal/tensor.h"

void ck_xfer_init(ck_xfer *x, ck_h5 *h, size_t piece_elems) {
    memset(x, 0, sizeof *x);
    x->h = h;
    x->piece = piece_elems ? piece_elems : CK_PIECE_BYTES / 4;
}

void ck_xfer_free(ck_xfer *x) {
    cai_free(x->stage);
    if (x->host) cai_device_dealloc_staging(x->host_dev, x->host);
    free(x->runs);
    memset(x, 0, sizeof *x);
}

static cai_status need_stage(ck_xfer *x) {
    if (!x->stage) CAI_CALL(cai_malloc(&x->stage, x->piece * 4, "checkpoint staging buffer"));
    return CAI_OK;
}

static cai_status need_host(ck_xfer *x, cai_device_t *dev) {
    if (x->host && x->host_dev != dev) {
        cai_device_dealloc_staging(x->host_dev, x->host);
        x->host = NULL;
    }
    if (!x->host) {
        CAI_CALL(cai_device_alloc_staging(dev, x->piece * 4, "checkpoint device staging", &x->host));
        x->host_dev = dev;
    }
    return CAI_OK;
}

cai_status ck_xfer_piece(ck_xfer *x, hid_t ds, const char *what, const cai_param_shard *sh, uint64_t a, uint64_t b,
                         int write, cai_dtype fdt, const ck_mem *mem, uint64_t wa, uint64_t wa_end, uint64_t *xsum) {
    int nbox = a < b ? ck_range_boxes(sh, a, b, write, x->boxes) : 0;
    CAI_CALL(ck_box_runs(sh, x->boxes, nbox, &x->runs, &x->runs_cap, &x->n_runs));
    uint64_t nsel = 0;
    for (size_t i = 0; i < x->n_runs; i++) nsel += x->runs[i].n;
    if (nsel == 0) nbox = 0;
    if (nsel > x->piece)
        return CAI_ERROR(CAI_ERR_INTERNAL, "checkpoint: tensor %s: piece of %llu elements exceeds the %zu staged",
                         what, (unsigned long long)nsel, x->piece);
    size_t fsz = cai_dtype_size(fdt), msz = mem ? cai_dtype_size(mem->dtype) : 0;
    int on_dev = mem && mem->dev && mem->dev->kind != CAI_DEVICE_HOST;
    int direct = mem && !on_dev && mem->dtype == fdt && x->n_runs == 1;
    char *buf = NULL;
    if (direct) {
        buf = mem->base + x->runs[0].l * msz;
    } else if (nsel) {
        CAI_CALL(need_stage(x));
        buf = x->stage;
    }
    /* Device data is staged as the local range [a, b): element l at host + (l - a). */
    const char *src_base = mem ? mem->base : NULL;
    uint64_t src_first = 0;
    if (on_dev && nsel) {
        CAI_CALL(need_host(x, mem->dev));
        src_base = x->host;
        src_first = a;
    }
    if (write) {
        if (!direct && nsel) {
            if (on_dev) {
                CAI_CALL(cai_device_copy(mem->dev, x->host, mem->base + a * msz, (b - a) * msz, CAI_COPY_D2H));
                CAI_CALL(cai_device_sync(mem->dev));
            }
            uint64_t pos = 0;
            for (size_t i = 0; i < x->n_runs; i++) {
                const ck_run *r = &x->runs[i];
                CAI_CALL(cai_convert_host(buf + pos * fsz, fdt, src_base + (r->l - src_first) * msz, mem->dtype,
                                          (size_t)r->n));
                pos += r->n;
            }
        }
        if (xsum) {
            uint64_t pos = 0;
            for (size_t i = 0; i < x->n_runs; i++) {
                *xsum += ck_xsum(buf + pos * fsz, fsz, x->runs[i].g, x->runs[i].n);
                pos += x->runs[i].n;
            }
        }
        return ck_h5_transfer(x->h, ds, fdt, sh->ndim, x->boxes, nbox, nsel, buf, 1, what, &x->io);
    }
    CAI_CALL(ck_h5_transfer(x->h, ds, fdt, sh->ndim, x->boxes, nbox, nsel, buf, 0, what, &x->io));
    uint64_t pos = 0;
    for (size_t i = 0; i < x->n_runs; i++) {
        const ck_run *r = &x->runs[i];
        if (xsum && r->writer) {
            uint64_t s = r->l > wa ? r->l : wa, e = r->l + r->n < wa_end ? r->l + r->n : wa_end;
            if (s < e) *xsum += ck_xsum(buf + (pos + s - r->l) * fsz, fsz, r->g + (s - r->l), e - s);
        }
        if (mem && !direct)
            CAI_CALL(cai_convert_host((char *)src_base + (r->l - src_first) * msz, mem->dtype, buf + pos * fsz, fdt,
                                      (size_t)r->n));
        pos += r->n;
    }
    if (on_dev && nsel) {
        CAI_CALL(cai_device_copy(mem->dev, mem->base + a * msz, x->host, (b - a) * msz, CAI_COPY_H2D));
        CAI_CALL(cai_device_sync(mem->dev));
    }
    return CAI_OK;
}

#else
typedef int ck_xfer_unused; /* nothing to build without parallel HDF5 */
#endif
