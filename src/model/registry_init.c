/* Moving elements between a global tensor and a rank's shard, and the
 * layout-invariant initialisation built on the same walk. Each element's
 * initial value depends only on (seed, parameter, global index), never on the
 * rank or the order of computation, which is what lets a checkpoint-free run
 * under tp=4 start from exactly the weights a single rank would have. */
#include "cai_config.h"
#include "colossal/model.h"

#include <math.h>
#include <string.h>

typedef void (*run_fn)(uint64_t global_start, uint64_t local_start, uint64_t n, void *ctx);

static void row_major_strides(const uint64_t *shape, int ndim, uint64_t *stride) {
    uint64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= shape[d];
    }
}

/* Calls fn once per maximal run of elements contiguous in both the global and
 * the local tensor, slab by slab in local order. */
static void for_each_run(const cai_param_shard *sh, run_fn fn, void *ctx) {
    if (!sh->held) return;
    int nd = sh->ndim;
    uint64_t gstride[CAI_PARAM_MAX_DIMS], lstride[CAI_PARAM_MAX_DIMS];
    row_major_strides(sh->global_shape, nd, gstride);
    row_major_strides(sh->local_shape, nd, lstride);
    uint64_t split_pos = 0; /* where this slab starts locally along split_dim */
    for (int s = 0; s < sh->n_slabs; s++) {
        const cai_hyperslab *sl = &sh->slab[s];
        uint64_t loc_off[CAI_PARAM_MAX_DIMS] = {0};
        if (sh->split_dim >= 0) loc_off[sh->split_dim] = split_pos;
        int empty = 0;
        for (int d = 0; d < nd; d++) empty |= sl->count[d] == 0;
        if (!empty) {
            /* Fold trailing dims the slab covers completely (same extent globally and locally) into one run. */
            int k = nd - 1;
            uint64_t run = sl->count[k];
            while (k > 0 && sl->count[k] == sh->global_shape[k] && sl->count[k] == sh->local_shape[k]) {
                k--;
                run *= sl->count[k];
            }
            uint64_t idx[CAI_PARAM_MAX_DIMS] = {0};
            for (;;) {
                uint64_t g = sl->offset[k] * gstride[k], l = loc_off[k] * lstride[k];
                for (int d = 0; d < k; d++) {
                    g += (sl->offset[d] + idx[d]) * gstride[d];
                    l += (loc_off[d] + idx[d]) * lstride[d];
                }
                fn(g, l, run, ctx);
                int d = k - 1;
                while (d >= 0 && ++idx[d] == sl->count[d]) idx[d--] = 0;
                if (d < 0) break;
            }
        }
        if (sh->split_dim >= 0) split_pos += sl->count[sh->split_dim];
    }
}

typedef struct {
    size_t elem;
    const unsigned char *src;
    unsigned char *dst;
} copy_ctx;

static void run_extract(uint64_t g, uint64_t l, uint64_t n, void *ctx) {
    copy_ctx *c = ctx;
    memcpy(c->dst + l * c->elem, c->src + g * c->elem, n * c->elem);
}

static void run_insert(uint64_t g, uint64_t l, uint64_t n, void *ctx) {
    copy_ctx *c = ctx;
    memcpy(c->dst + g * c->elem, c->src + l * c->elem, n * c->elem);
}

void cai_shard_extract(const cai_param_shard *shard, size_t elem_size, const void *global, void *local) {
    copy_ctx c = {elem_size, global, local};
    for_each_run(shard, run_extract, &c);
}

void cai_shard_insert(const cai_param_shard *shard, size_t elem_size, const void *local, void *global) {
    copy_ctx c = {elem_size, local, global};
    for_each_run(shard, run_insert, &c);
}

uint64_t cai_shard_global_index(const cai_param_shard *sh, uint64_t local_index) {
    int nd = sh->ndim;
    uint64_t lstride[CAI_PARAM_MAX_DIMS], gstride[CAI_PARAM_MAX_DIMS], coord[CAI_PARAM_MAX_DIMS];
    row_major_strides(sh->local_shape, nd, lstride);
    row_major_strides(sh->global_shape, nd, gstride);
    for (int d = 0; d < nd; d++) {
        coord[d] = local_index / lstride[d];
        local_index %= lstride[d];
    }
    int s = 0;
    if (sh->split_dim >= 0) {
        int sd = sh->split_dim;
        while (s + 1 < sh->n_slabs && coord[sd] >= sh->slab[s].count[sd]) coord[sd] -= sh->slab[s++].count[sd];
    }
    uint64_t g = 0;
    for (int d = 0; d < nd; d++) g += (sh->slab[s].offset[d] + coord[d]) * gstride[d];
    return g;
}

/* ------------------------------------------------------------ init */

float cai_registry_init_std(const cai_registry_t *reg, int index) {
    const cai_param_info *p = cai_registry_param(reg, index);
    if (!p) return 0.0f;
    switch (p->spec.init.kind) {
    case CAI_INIT_NORMAL: return p->spec.init.std;
    case CAI_INIT_NORMAL_RESIDUAL: return (float)((double)p->spec.init.std / sqrt(2.0 * cai_registry_n_layers(reg)));
    default: return 0.0f;
    }
}

typedef struct {
    uint64_t g, l, n;
} init_piece;

typedef struct {
    init_piece *pieces;
    size_t count;
} piece_list;

/* Runs cut into pieces small enough to balance across threads. */
#define INIT_PIECE 16384

static void run_count(uint64_t g, uint64_t l, uint64_t n, void *ctx) {
    (void)g, (void)l;
    ((piece_list *)ctx)->count += (size_t)((n + INIT_PIECE - 1) / INIT_PIECE);
}

static void run_collect(uint64_t g, uint64_t l, uint64_t n, void *ctx) {
    piece_list *pl = ctx;
    for (uint64_t s = 0; s < n; s += INIT_PIECE)
        pl->pieces[pl->count++] = (init_piece){g + s, l + s, n - s < INIT_PIECE ? n - s : INIT_PIECE};
}

static cai_status init_shard(const cai_registry_t *reg, int index, const cai_param_shard *sh, uint64_t seed,
                             float *out) {
    const cai_param_info *p = cai_registry_param(reg, index);
    cai_init_kind kind = p->spec.init.kind;
    if (kind == CAI_INIT_ZEROS || kind == CAI_INIT_ONES) {
        float v = kind == CAI_INIT_ONES ? 1.0f : 0.0f;
        for (uint64_t i = 0; i < sh->local_numel; i++) out[i] = v;
        return CAI_OK;
    }
    /* Normal draws cost ~40 ns each; spread the pieces over OpenMP threads.
     * Each value depends only on its global index, so threading cannot
     * change a single bit. */
    piece_list pl = {NULL, 0};
    for_each_run(sh, run_count, &pl);
    if (pl.count == 0) return CAI_OK;
    CAI_CALL(cai_malloc((void **)&pl.pieces, pl.count * sizeof *pl.pieces, "init pieces"));
    pl.count = 0;
    for_each_run(sh, run_collect, &pl);
    const float std = cai_registry_init_std(reg, index);
    const uint64_t stream = p->init_stream;
    const long n_pieces = (long)pl.count;
    const init_piece *pieces = pl.pieces;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 4) if (sh->local_numel >= 4 * INIT_PIECE)
#endif
    for (long k = 0; k < n_pieces; k++) {
        const init_piece *pc = &pieces[k];
        float *o = out + pc->l;
        for (uint64_t t = 0; t < pc->n; t++) o[t] = std * cai_rng_normal(seed, stream, pc->g + t);
    }
    cai_free(pl.pieces);
    return CAI_OK;
}

cai_status cai_registry_init_local(const cai_registry_t *reg, int index, const cai_rank_view *view, uint64_t seed,
                                   float *out, size_t out_count) {
    cai_param_shard sh;
    CAI_CALL(cai_registry_shard(reg, index, view, &sh));
    if (sh.local_numel > out_count)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "init of '%s': local shard has %llu elements but the buffer holds %zu",
                         cai_registry_param(reg, index)->name, (unsigned long long)sh.local_numel, out_count);
    CAI_CHECK_ARG(out != NULL || sh.local_numel == 0, "init of '%s': output buffer is NULL",
                  cai_registry_param(reg, index)->name);
    CAI_CALL(init_shard(reg, index, &sh, seed, out));
    return CAI_OK;
}

cai_status cai_registry_init_flat(const cai_registry_t *reg, const cai_rank_view *view, uint64_t seed,
                                  size_t align_elems, float *flat, size_t flat_count) {
    CAI_CHECK_ARG(reg != NULL, "cai_registry_init_flat: registry is NULL");
    size_t total = 0, *offsets = NULL;
    cai_status st = CAI_OK;
    CAI_CALL(cai_calloc((void **)&offsets, (size_t)cai_registry_count(reg) + 1, sizeof *offsets, "init offsets"));
    CAI_CALL_GOTO(cai_registry_local_layout(reg, view, align_elems, offsets, &total), st, done);
    if (total > flat_count) {
        st = CAI_ERROR(CAI_ERR_INVALID_ARG,
                       "flat init: the local parameters need %zu elements but the buffer holds %zu", total, flat_count);
        goto done;
    }
    if (total) memset(flat, 0, total * sizeof *flat);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        if (offsets[i] == SIZE_MAX) continue;
        cai_param_shard sh;
        CAI_CALL_GOTO(cai_registry_shard(reg, i, view, &sh), st, done);
        CAI_CALL_GOTO(init_shard(reg, i, &sh, seed, flat + offsets[i]), st, done);
    }
done:
    cai_free(offsets);
    return st;
}
