/* Which elements of a parameter a rank moves, and where they sit.
 *
 * Everything starts from a range of LOCAL linear indices of a shard (the
 * rank's slice of the flat buffer for this parameter: all of it when
 * reading, its chunk when replicas share the writing, a ZeRO partition's
 * piece later). A row-major range splits into at most 2*(ndim-1)+1 boxes of
 * the local tensor; each box is cut where the shard's slabs meet along the
 * split dimension and moved into global coordinates. The boxes' union is
 * the HDF5 file selection; the runs say where each element of the
 * selection (iterated in global row-major order, as HDF5 does for
 * hyperslabs) lives in local memory. */
#include "cai_config.h"

#include <stdlib.h>
#include <string.h>

#include "checkpoint_internal.h"

typedef struct {
    const cai_param_shard *sh;
    int ndim;
    uint64_t block[CAI_PARAM_MAX_DIMS + 1]; /* elements in one index of dim d-1: prod(local_shape[d..]) */
    uint64_t prefix[CAI_SHARD_MAX_SLABS];   /* local start of each slab along the split dimension */
    int writers_only;
    ck_box *out;
    int n;
} range_ctx;

/* A box of the local tensor, cut by slabs and placed in the global one. */
static void emit_local(range_ctx *c, const uint64_t *lo, const uint64_t *cnt) {
    const cai_param_shard *sh = c->sh;
    int sd = sh->split_dim;
    for (int k = 0; k < sh->n_slabs; k++) {
        const cai_hyperslab *s = &sh->slab[k];
        if (c->writers_only && s->replica_rank != 0) continue;
        uint64_t b0 = lo[sd >= 0 ? sd : 0], b1 = b0 + cnt[sd >= 0 ? sd : 0];
        uint64_t s0 = sd >= 0 ? c->prefix[k] : 0, s1 = sd >= 0 ? s0 + s->count[sd] : UINT64_MAX;
        uint64_t x0 = b0 > s0 ? b0 : s0, x1 = b1 < s1 ? b1 : s1;
        if (sd >= 0 && x0 >= x1) continue;
        ck_box *b = &c->out[c->n++];
        memset(b, 0, sizeof *b);
        b->slab = k;
        for (int d = 0; d < c->ndim; d++) {
            b->off[d] = s->offset[d] + lo[d];
            b->cnt[d] = cnt[d];
        }
        if (sd >= 0) {
            b->off[sd] = s->offset[sd] + (x0 - s0);
            b->cnt[sd] = x1 - x0;
        }
    }
}

/* [a, b) within one index of dims d-1.., whose leading coordinates lo[0..d) are fixed. */
static void split_range(range_ctx *c, int d, uint64_t *lo, uint64_t a, uint64_t b) {
    if (a >= b) return;
    uint64_t sub = c->block[d + 1];
    uint64_t ia = a / sub, ib = b / sub, ra = a % sub, rb = b % sub;
    if (ia == ib) { /* inside one index of dim d: only possible above the last dimension */
        lo[d] = ia;
        split_range(c, d + 1, lo, ra, rb);
        return;
    }
    if (ra) {
        lo[d] = ia;
        split_range(c, d + 1, lo, ra, sub);
        ia++;
    }
    if (ib > ia) {
        uint64_t blo[CAI_PARAM_MAX_DIMS], bcnt[CAI_PARAM_MAX_DIMS];
        for (int k = 0; k < c->ndim; k++) {
            blo[k] = k < d ? lo[k] : 0;
            bcnt[k] = k < d ? 1 : c->sh->local_shape[k];
        }
        blo[d] = ia;
        bcnt[d] = ib - ia;
        emit_local(c, blo, bcnt);
    }
    if (rb) {
        lo[d] = ib;
        split_range(c, d + 1, lo, 0, rb);
    }
}

int ck_range_boxes(const cai_param_shard *sh, uint64_t a, uint64_t b, int writers_only, ck_box *out) {
    if (!sh->held || sh->n_slabs == 0 || a >= b || sh->ndim < 1) return 0;
    range_ctx c;
    memset(&c, 0, sizeof c);
    c.sh = sh;
    c.ndim = sh->ndim;
    c.writers_only = writers_only;
    c.out = out;
    c.block[c.ndim] = 1;
    for (int d = c.ndim - 1; d >= 0; d--) c.block[d] = c.block[d + 1] * sh->local_shape[d];
    if (sh->split_dim >= 0)
        for (int k = 1; k < sh->n_slabs; k++) c.prefix[k] = c.prefix[k - 1] + sh->slab[k - 1].count[sh->split_dim];
    uint64_t lo[CAI_PARAM_MAX_DIMS] = {0};
    if (b > sh->local_numel) b = sh->local_numel;
    split_range(&c, 0, lo, a, b);
    return c.n;
}

static int run_cmp(const void *x, const void *y) {
    const ck_run *a = x, *b = y;
    return a->g < b->g ? -1 : a->g > b->g;
}

/* Append a run, extending the previous one when it continues it in both tensors. */
static cai_status push_run(ck_run **runs, size_t *cap, size_t *n, ck_run r) {
    if (*n) {
        ck_run *p = &(*runs)[*n - 1];
        if (p->g + p->n == r.g && p->l + p->n == r.l && p->writer == r.writer) {
            p->n += r.n;
            return CAI_OK;
        }
    }
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        ck_run *grown = realloc(*runs, nc * sizeof *grown);
        if (!grown) return CAI_ERROR(CAI_ERR_NOMEM, "checkpoint plan: cannot grow the run list to %zu entries", nc);
        *runs = grown;
        *cap = nc;
    }
    (*runs)[(*n)++] = r;
    return CAI_OK;
}

cai_status ck_box_runs(const cai_param_shard *sh, const ck_box *boxes, int nbox, ck_run **runs, size_t *cap,
                       size_t *n) {
    *n = 0;
    int nd = sh->ndim, sd = sh->split_dim;
    uint64_t gstride[CAI_PARAM_MAX_DIMS], lstride[CAI_PARAM_MAX_DIMS], prefix[CAI_SHARD_MAX_SLABS] = {0};
    gstride[nd - 1] = lstride[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--) {
        gstride[d] = gstride[d + 1] * sh->global_shape[d + 1];
        lstride[d] = lstride[d + 1] * sh->local_shape[d + 1];
    }
    if (sd >= 0)
        for (int k = 1; k < sh->n_slabs; k++) prefix[k] = prefix[k - 1] + sh->slab[k - 1].count[sd];
    int sorted = 1;
    uint64_t last_end = 0;
    for (int bi = 0; bi < nbox; bi++) {
        const ck_box *b = &boxes[bi];
        const cai_hyperslab *s = &sh->slab[b->slab];
        uint64_t lo[CAI_PARAM_MAX_DIMS]; /* the box's first element in local coordinates */
        for (int d = 0; d < nd; d++) lo[d] = b->off[d] - s->offset[d] + (d == sd ? prefix[b->slab] : 0);
        uint64_t idx[CAI_PARAM_MAX_DIMS] = {0};
        uint64_t rows = 1;
        for (int d = 0; d < nd - 1; d++) rows *= b->cnt[d];
        if (b->cnt[nd - 1] == 0) rows = 0;
        for (uint64_t r = 0; r < rows; r++) {
            uint64_t g = 0, l = 0;
            for (int d = 0; d < nd; d++) {
                g += (b->off[d] + idx[d]) * gstride[d];
                l += (lo[d] + idx[d]) * lstride[d];
            }
            if (g < last_end) sorted = 0;
            last_end = g + b->cnt[nd - 1];
            CAI_CALL(push_run(runs, cap, n, (ck_run){g, l, b->cnt[nd - 1], s->replica_rank == 0}));
            for (int d = nd - 2; d >= 0; d--) { /* odometer over the leading dimensions */
                if (++idx[d] < b->cnt[d]) break;
                idx[d] = 0;
            }
        }
    }
    if (!sorted) {
        /* Slabs cut along a non-leading dimension interleave in global
         * order: HDF5 walks the union row-major, so must the buffer. */
        qsort(*runs, *n, sizeof **runs, run_cmp);
        size_t m = 0;
        for (size_t i = 0; i < *n; i++) {
            ck_run r = (*runs)[i];
            if (m && (*runs)[m - 1].g + (*runs)[m - 1].n == r.g && (*runs)[m - 1].l + (*runs)[m - 1].n == r.l &&
                (*runs)[m - 1].writer == r.writer)
                (*runs)[m - 1].n += r.n;
            else (*runs)[m++] = r;
        }
        *n = m;
    }
    return CAI_OK;
}

void ck_replica_chunk(uint64_t lo, uint64_t hi, int q, int r, uint64_t *a, uint64_t *b) {
    if (hi <= lo || r < 1) {
        *a = *b = lo;
        return;
    }
    unsigned __int128 n = hi - lo;
    *a = lo + (uint64_t)(n * (unsigned)q / (unsigned)r);
    *b = lo + (uint64_t)(n * (unsigned)(q + 1) / (unsigned)r);
}

/* ------------------------------------------------------------ checksum */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#define XSUM_K 0x9E3779B97F4A7C15ull

/* One loop per element size so each vectorises (64-bit lanes; AVX-512 has
 * the 64-bit multiply). */
#define XSUM_LOOP(T)                                                           \
    do {                                                                       \
        const T *p = data;                                                     \
        for (uint64_t i = 0; i < n; i++) s += mix64((g0 + i) * XSUM_K + p[i]); \
    } while (0)

/* GCC's -O2 cost model does not vectorise this loop; asking for it more
 * than doubles the speed (5.6 GB/s on one core of the development machine,
 * 2.3 without). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("tree-vectorize", "vect-cost-model=dynamic")))
#endif
uint64_t
ck_xsum(const void *data, size_t elem_size, uint64_t g0, uint64_t n) {
    uint64_t s = 0;
    switch (elem_size) {
    case 1: XSUM_LOOP(uint8_t); break;
    case 2: XSUM_LOOP(uint16_t); break;
    case 4: XSUM_LOOP(uint32_t); break;
    default: XSUM_LOOP(uint64_t); break;
    }
    return s;
}

/* ------------------------------------------------------------ dtypes */

int ck_file_dtype_ok(cai_dtype dt) { return dt == CAI_DTYPE_F32 || dt == CAI_DTYPE_BF16 || dt == CAI_DTYPE_F16; }

int ck_dtype_convertible(cai_dtype file_dtype, cai_dtype mem_dtype) {
    return ck_file_dtype_ok(file_dtype) && ck_file_dtype_ok(mem_dtype);
}
