/* ZeRO layout: gradient buckets of whole units over the registry's flat
 * local layout, each padded so every dp rank owns one chunk, the pieces of
 * this rank's shard, and the window block cache. Everything here derives
 * from cai_registry_local_layout and cai_registry_shard; nothing computes
 * another rank's offsets by hand. Pure bookkeeping, no MPI. */
#include "cai_config.h"

#include <stdint.h>
#include <string.h>

#include "zero_internal.h"

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

size_t zl_fp8_chunk(const zl_layout *L, int k) {
    const zl_bucket *b = &L->b[k];
    if (L->stage >= 1) return b->chunk;
    return round_up((b->hi - b->lo + (size_t)b->ngroup - 1) / (size_t)b->ngroup, 16);
}

int zl_fp8_rows(const zl_layout *L, int k) { return L->stage >= 1 ? L->b[k].nshard : L->b[k].ngroup; }

size_t zl_fp8_piece(const zl_layout *L, int k, int d) {
    if (L->stage >= 1) return L->b[k].chunk;
    const size_t n = L->b[k].hi - L->b[k].lo, c = zl_fp8_chunk(L, k), at = (size_t)d * c;
    return at >= n ? 0 : (n - at < c ? n - at : c);
}

size_t zl_fp8_block_bytes(const zl_layout *L, int k) {
    const size_t rows = (size_t)zl_fp8_rows(L, k), c = zl_fp8_chunk(L, k);
    const size_t metas = rows * ZL_FP8_STRIDE * sizeof(float);
    size_t n = 2 * rows * c + 2 * metas;
    if (L->stage == 0) n += rows * c + metas + c * sizeof(float);
    return n;
}

size_t zl_fp8_fixed_offset(const zl_layout *L, int k) {
    size_t n = 0;
    for (int j = 0; j < k; j++) n += round_up(zl_fp8_block_bytes(L, j), 256);
    return n;
}

size_t zl_fp8_fixed_bytes(const zl_layout *L) { return L->stage < 2 ? zl_fp8_fixed_offset(L, L->nb) : 0; }

void zl_units_free(int n_units, int **units, int *np) {
    if (units)
        for (int u = 0; u < n_units; u++) cai_free(units[u]);
    cai_free(units);
    cai_free(np);
}

/* The index of parameter `i` as the model binds it: a tie copy whose
 * primary is held on this rank reads the primary (cai_model_unit_params). */
static int as_read(const cai_registry_t *reg, const size_t *offsets, int i) {
    const cai_param_info *info = cai_registry_param(reg, i);
    if (info->tie_primary != i && offsets[info->tie_primary] != SIZE_MAX) return info->tie_primary;
    return i;
}

cai_status zl_units_from_registry(const cai_registry_t *reg, const cai_rank_view *view, int *n_units_out,
                                  int ***units_out, int **np_out) {
    int np = cai_registry_count(reg), L = cai_registry_n_layers(reg);
    size_t *offsets = NULL, total = 0;
    int *stage = NULL, **units = NULL, *cnt = NULL, n_units = 0;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_calloc((void **)&offsets, (size_t)np + 1, sizeof *offsets, "planner offsets"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&stage, (size_t)L + 1, sizeof *stage, "planner layer stages"), st, fail);
    CAI_CALL_GOTO(cai_registry_local_layout(reg, view, 1, offsets, &total), st, fail);
    /* stage[l] becomes the layer's local index (-1: another rank's): the
     * model numbers its blocks in layer order over all its chunks */
    int held = 0, first = 0, last = 0;
    for (int l = 0; l < L; l++) {
        int s = 0;
        CAI_CALL_GOTO(cai_registry_layer_stage(reg, view, l, &s), st, fail);
        stage[l] = s == view->pp_rank ? held++ : -1;
    }
    if (held == 0) {
        st = CAI_ERROR(CAI_ERR_LAYOUT, "pipeline rank %d of %d owns no layer of %d", view->pp_rank, view->pp_size, L);
        goto fail;
    }
    first = stage[0] >= 0;
    last = stage[L - 1] >= 0;
    n_units = first + held + last;
    CAI_CALL_GOTO(cai_calloc((void **)&units, (size_t)n_units, sizeof *units, "planner units"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&cnt, (size_t)n_units, sizeof *cnt, "planner unit sizes"), st, fail);
    for (int u = 0; u < n_units; u++)
        CAI_CALL_GOTO(cai_calloc((void **)&units[u], (size_t)np + 1, sizeof **units, "planner unit"), st, fail);
    for (int i = 0; i < np; i++) {
        if (offsets[i] == SIZE_MAX) continue;
        const cai_param_info *info = cai_registry_param(reg, i);
        int u = -1;
        if (info->spec.pp_place == CAI_PP_FIRST) u = 0;
        else if (info->spec.pp_place == CAI_PP_LAST) u = n_units - 1;
        else if (info->spec.layer >= 0 && info->spec.layer < L && stage[info->spec.layer] >= 0)
            u = first + stage[info->spec.layer];
        if (u < 0) continue;
        int r = as_read(reg, offsets, i), dup = 0;
        for (int k = 0; k < cnt[u]; k++) dup |= units[u][k] == r;
        if (!dup) units[u][cnt[u]++] = r;
    }
    for (int u = 0; u < n_units; u++) /* registration order, as the model reports */
        for (int a = 1; a < cnt[u]; a++)
            for (int k = a; k > 0 && units[u][k - 1] > units[u][k]; k--) {
                int t = units[u][k];
                units[u][k] = units[u][k - 1];
                units[u][k - 1] = t;
            }
    cai_free(offsets);
    cai_free(stage);
    *n_units_out = n_units;
    *units_out = units;
    *np_out = cnt;
    return CAI_OK;
fail:
    cai_free(offsets);
    cai_free(stage);
    zl_units_free(n_units, units, cnt);
    return st;
}

void zl_free(zl_layout *L) {
    if (!L) return;
    cai_free(L->offsets);
    cai_free(L->numel);
    cai_free(L->eoff);
    cai_free(L->home);
    cai_free(L->bucket_of);
    if (L->unit_params)
        for (int u = 0; u < L->n_units; u++) cai_free(L->unit_params[u]);
    cai_free(L->unit_params);
    cai_free(L->unit_np);
    cai_free(L->unit_nb);
    cai_free(L->unit_buckets);
    cai_free(L->b);
    cai_free(L->seg);
    memset(L, 0, sizeof *L);
}

/* Param-local element ranges counted in the global norm: TP replica 0 of
 * each slab (a fused QKV's replicated KV heads are per-slab replicas; the
 * slabs of a dim-0 split are consecutive row blocks) and only at a tie
 * primary. Returns how many (<= CAI_SHARD_MAX_SLABS). */
static int norm_ranges(const cai_param_info *info, const cai_param_shard *sh, size_t *off, size_t *n) {
    if (info->tie_primary != info->index) return 0;
    if (sh->n_slabs <= 1 || sh->split_dim != 0) {
        if (sh->n_slabs >= 1 && sh->slab[0].replica_rank != 0) return 0;
        off[0] = 0;
        n[0] = (size_t)sh->local_numel;
        return 1;
    }
    uint64_t row = sh->local_numel / sh->local_shape[0];
    int k = 0;
    size_t pos = 0;
    for (int s = 0; s < sh->n_slabs; s++) {
        size_t len = (size_t)(sh->slab[s].count[0] * row);
        if (sh->slab[s].replica_rank == 0) {
            off[k] = pos;
            n[k++] = len;
        }
        pos += len;
    }
    return k;
}

/* Home unit of every held parameter: the smallest unit reading it (the
 * last to finish its backward); unread ones (a tie copy whose primary is
 * here) go with the parameter before them. */
static cai_status assign_homes(zl_layout *L, const cai_registry_t *reg) {
    for (int i = 0; i < L->n_params; i++) L->home[i] = -1;
    for (int u = L->n_units - 1; u >= 0; u--)
        for (int k = 0; k < L->unit_np[u]; k++) {
            int i = L->unit_params[u][k];
            if (i < 0 || i >= L->n_params || L->offsets[i] == SIZE_MAX)
                return CAI_ERROR(CAI_ERR_INTERNAL,
                                 "ZeRO layout: unit %d reads parameter %d, which this rank does not "
                                 "hold",
                                 u, i);
            L->home[i] = u;
        }
    int prev = 0, prev_index = -1;
    for (int i = 0; i < L->n_params; i++) {
        if (L->offsets[i] == SIZE_MAX) continue;
        if (L->home[i] < 0) L->home[i] = prev;
        if (L->home[i] < prev)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "ZeRO layout: parameter %s (first read by unit %d) is registered after "
                             "%s (unit %d); buckets need units' parameters in registration order",
                             cai_registry_param(reg, i)->name, L->home[i], cai_registry_param(reg, prev_index)->name,
                             prev);
        prev = L->home[i];
        prev_index = i;
    }
    return CAI_OK;
}

/* Cut every bucket where the parameters change group (dense and expert
 * runs of a block), so each bucket is reduced and sharded over one group;
 * a piece's units are the homes of the parameters it holds. */
static cai_status split_groups(zl_layout *L, const unsigned char *grp_of) {
    zl_bucket *nbk = NULL;
    CAI_CALL(cai_calloc((void **)&nbk, (size_t)(L->nb + L->n_params) + 1, sizeof *nbk, "ZeRO buckets"));
    int n = 0;
    for (int k = 0; k < L->nb; k++) {
        const zl_bucket *b = &L->b[k];
        zl_bucket *cur = NULL;
        for (int i = 0; i < L->n_params; i++) {
            if (L->offsets[i] == SIZE_MAX || L->offsets[i] < b->lo || L->offsets[i] >= b->hi) continue;
            if (!cur || cur->grp != grp_of[i]) {
                /* the first piece keeps the bucket's start, a later one starts at its first parameter */
                const size_t lo = cur ? L->offsets[i] : b->lo;
                if (cur) cur->hi = lo;
                cur = &nbk[n++];
                *cur = (zl_bucket){.lo = lo, .unit_lo = L->home[i], .unit_hi = L->home[i], .grp = grp_of[i]};
            }
            if (L->home[i] < cur->unit_lo) cur->unit_lo = L->home[i];
            if (L->home[i] > cur->unit_hi) cur->unit_hi = L->home[i];
        }
        if (cur) cur->hi = b->hi;
    }
    cai_free(L->b);
    L->b = nbk;
    L->nb = n;
    return CAI_OK;
}

/* Group units, last first (backward order), into buckets of at most
 * bucket_bytes of F32 gradients (a unit larger than that is a bucket of its
 * own; stage 3 buckets are single units), then lay them out in flat order
 * (grouped: cut into one group's runs). */
static cai_status make_buckets(zl_layout *L, size_t bucket_bytes, const unsigned char *grp_of) {
    /* Flat range of each unit's home parameters: from its first parameter's
     * offset to the next held parameter's (or the end). */
    size_t *ulo = NULL, *uhi = NULL;
    cai_status st = CAI_OK;
    CAI_CALL(cai_calloc((void **)&ulo, (size_t)L->n_units + 1, sizeof *ulo, "ZeRO unit ranges"));
    CAI_CALL_GOTO(cai_calloc((void **)&uhi, (size_t)L->n_units + 1, sizeof *uhi, "ZeRO unit ranges"), st, done);
    for (int u = 0; u < L->n_units; u++) ulo[u] = uhi[u] = SIZE_MAX;
    int last_held = -1;
    for (int i = 0; i < L->n_params; i++) {
        if (L->offsets[i] == SIZE_MAX) continue;
        int u = L->home[i];
        if (ulo[u] == SIZE_MAX) ulo[u] = L->offsets[i];
        if (last_held >= 0) uhi[L->home[last_held]] = L->offsets[i];
        last_held = i;
    }
    if (last_held >= 0) uhi[L->home[last_held]] = L->n_flat;
    CAI_CALL_GOTO(cai_calloc((void **)&L->b, (size_t)L->n_units + 1, sizeof *L->b, "ZeRO buckets"), st, done);
    int nb = 0;
    zl_bucket cur = {0};
    int open = 0;
    for (int u = L->n_units - 1; u >= 0; u--) {
        if (ulo[u] == SIZE_MAX) continue; /* reads only parameters homed earlier */
        size_t bytes = (uhi[u] - ulo[u]) * sizeof(float);
        if (open && (L->stage == 3 || (cur.hi - cur.lo) * sizeof(float) + bytes > bucket_bytes)) {
            L->b[nb++] = cur;
            open = 0;
        }
        if (!open) {
            cur = (zl_bucket){.lo = ulo[u], .hi = uhi[u], .unit_lo = u, .unit_hi = u};
            open = 1;
        } else {
            if (uhi[u] != cur.lo) {
                st = CAI_ERROR(CAI_ERR_INTERNAL,
                               "ZeRO layout: unit %d's parameters [%zu, %zu) are not adjacent to "
                               "unit %d's [%zu, ...)",
                               u, ulo[u], uhi[u], cur.unit_lo, cur.lo);
                goto done;
            }
            cur.lo = ulo[u];
            cur.unit_lo = u;
        }
    }
    if (open) L->b[nb++] = cur;
    /* Flat order (they were made last first). */
    for (int a = 0, z = nb - 1; a < z; a++, z--) {
        zl_bucket t = L->b[a];
        L->b[a] = L->b[z];
        L->b[z] = t;
    }
    L->nb = nb;
    if (L->grouped) CAI_CALL_GOTO(split_groups(L, grp_of), st, done);
    size_t elo = 0, soff = 0;
    for (int k = 0; k < L->nb; k++) {
        zl_bucket *b = &L->b[k];
        b->nshard = L->gshard[b->grp];
        b->srank = L->grank[b->grp];
        b->ngroup = L->gsize[b->grp];
        b->elo = elo;
        b->len = round_up(b->hi - b->lo, (size_t)b->nshard * L->align);
        b->chunk = b->len / (size_t)b->nshard;
        b->soff = soff;
        elo += b->len;
        soff += b->chunk;
    }
    L->n_pad = elo;
    L->shard = soff;
done:
    cai_free(ulo);
    cai_free(uhi);
    return st;
}

/* This rank's chunk of bucket k, cut at parameter and norm-range
 * boundaries into optimizer segments. */
static cai_status add_segments(zl_layout *L, const cai_registry_t *reg, const cai_rank_view *view, int seq_parallel,
                               int k, int *cap) {
    const zl_bucket *b = &L->b[k];
    size_t clo = b->lo + (size_t)b->srank * b->chunk, chi = clo + b->chunk; /* flat coordinates */
    for (int i = 0; i < L->n_params; i++) {
        if (L->bucket_of[i] != k) continue;
        size_t plo = L->offsets[i], phi = plo + L->numel[i];
        size_t lo = plo > clo ? plo : clo, hi = phi < chi ? phi : chi;
        if (lo >= hi) continue;
        const cai_param_info *info = cai_registry_param(reg, i);
        cai_param_shard sh;
        CAI_CALL(cai_registry_shard(reg, i, view, &sh));
        const unsigned axes = cai_registry_grad_axes(reg, i, view, seq_parallel);
        size_t noff[CAI_SHARD_MAX_SLABS], nlen[CAI_SHARD_MAX_SLABS];
        int nn = norm_ranges(info, &sh, noff, nlen);
        /* Cut [lo, hi) (param-local [lo - plo, hi - plo)) at norm-range edges. */
        size_t a = lo - plo, e = hi - plo;
        while (a < e) {
            size_t stop = e;
            int in = 0;
            for (int r = 0; r < nn; r++) {
                if (a >= noff[r] && a < noff[r] + nlen[r]) {
                    in = 1;
                    if (noff[r] + nlen[r] < stop) stop = noff[r] + nlen[r];
                } else if (noff[r] > a && noff[r] < stop) {
                    stop = noff[r];
                }
            }
            if (L->nseg == *cap) {
                int ncap = *cap * 2 + 16;
                zl_seg *ns = NULL;
                CAI_CALL(cai_calloc((void **)&ns, (size_t)ncap, sizeof *ns, "ZeRO segments"));
                if (L->nseg) memcpy(ns, L->seg, (size_t)L->nseg * sizeof *ns);
                cai_free(L->seg);
                L->seg = ns;
                *cap = ncap;
            }
            zl_seg *s = &L->seg[L->nseg++];
            s->index = i;
            s->bucket = k;
            s->poff = a;
            s->n = stop - a;
            s->eoff = L->eoff[i] + a;
            s->soff = b->soff + (plo + a - clo);
            s->decay = info->spec.weight_decay;
            s->update = !(info->tie_primary != i && L->offsets[info->tie_primary] != SIZE_MAX);
            s->norm = in;
            s->axes = axes;
            for (int x = 0; x < CAI_AXIS_COUNT; x++)
                if (axes & (1u << x)) L->axis_n[x] += s->n;
            a = stop;
        }
    }
    return CAI_OK;
}

cai_status zl_build(zl_layout *L, const cai_registry_t *reg, const cai_rank_view *view, size_t align, int n_units,
                    int *const *units, const int *unit_np, int stage, int dp, int dp_rank, int edp, int edp_rank,
                    size_t bucket_bytes, int seq_parallel) {
    memset(L, 0, sizeof *L);
    cai_status st = CAI_OK;
    int np = cai_registry_count(reg);
    unsigned char *grp_of = NULL;
    L->n_params = np;
    L->n_units = n_units;
    L->align = align ? align : 1;
    L->stage = stage;
    L->nshard = stage >= 1 ? dp : 1;
    L->srank = stage >= 1 ? dp_rank : 0;
    L->grouped = edp >= 1;
    L->gshard[ZL_GRP_DP] = L->nshard;
    L->grank[ZL_GRP_DP] = L->srank;
    L->gshard[ZL_GRP_EDP] = stage >= 1 && edp >= 1 ? edp : 1;
    L->grank[ZL_GRP_EDP] = stage >= 1 && edp >= 1 ? edp_rank : 0;
    L->gsize[ZL_GRP_DP] = dp;
    L->gsize[ZL_GRP_EDP] = edp >= 1 ? edp : 1;
    CAI_CALL_GOTO(cai_calloc((void **)&grp_of, (size_t)np + 1, sizeof *grp_of, "ZeRO groups"), st, fail);
    for (int i = 0; i < np; i++)
        grp_of[i] = L->grouped && cai_registry_param(reg, i)->spec.n_experts > 0 ? ZL_GRP_EDP : ZL_GRP_DP;
    CAI_CALL_GOTO(cai_calloc((void **)&L->offsets, (size_t)np + 1, sizeof *L->offsets, "ZeRO offsets"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&L->numel, (size_t)np + 1, sizeof *L->numel, "ZeRO sizes"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&L->eoff, (size_t)np + 1, sizeof *L->eoff, "ZeRO offsets"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&L->home, (size_t)np + 1, sizeof *L->home, "ZeRO homes"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&L->bucket_of, (size_t)np + 1, sizeof *L->bucket_of, "ZeRO buckets"), st, fail);
    CAI_CALL_GOTO(cai_registry_local_layout(reg, view, L->align, L->offsets, &L->n_flat), st, fail);
    for (int i = 0; i < np; i++) {
        L->eoff[i] = SIZE_MAX;
        L->bucket_of[i] = -1;
        if (L->offsets[i] == SIZE_MAX) continue;
        cai_param_shard sh;
        CAI_CALL_GOTO(cai_registry_shard(reg, i, view, &sh), st, fail);
        L->numel[i] = (size_t)sh.local_numel;
        if (L->numel[i] > L->max_param_numel) L->max_param_numel = L->numel[i];
    }
    CAI_CALL_GOTO(cai_calloc((void **)&L->unit_params, (size_t)n_units + 1, sizeof *L->unit_params, "ZeRO units"), st,
                  fail);
    CAI_CALL_GOTO(cai_calloc((void **)&L->unit_np, (size_t)n_units + 1, sizeof *L->unit_np, "ZeRO units"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&L->unit_nb, (size_t)n_units + 1, sizeof *L->unit_nb, "ZeRO units"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&L->unit_buckets, (size_t)n_units + 1, sizeof *L->unit_buckets, "ZeRO units"), st,
                  fail);
    for (int u = 0; u < n_units; u++) {
        L->unit_np[u] = unit_np[u];
        CAI_CALL_GOTO(cai_calloc((void **)&L->unit_params[u], (size_t)unit_np[u] + 1, sizeof **L->unit_params,
                                 "ZeRO unit"),
                      st, fail);
        if (unit_np[u]) memcpy(L->unit_params[u], units[u], (size_t)unit_np[u] * sizeof **units);
    }
    CAI_CALL_GOTO(assign_homes(L, reg), st, fail);
    CAI_CALL_GOTO(make_buckets(L, bucket_bytes, grp_of), st, fail);
    for (int k = 0; k < L->nb; k++)
        for (int i = 0; i < np; i++)
            if (L->offsets[i] != SIZE_MAX && L->offsets[i] >= L->b[k].lo && L->offsets[i] < L->b[k].hi) {
                L->bucket_of[i] = k;
                L->eoff[i] = L->b[k].elo + (L->offsets[i] - L->b[k].lo);
            }
    for (int u = 0; u < n_units; u++)
        for (int k = 0; k < L->unit_np[u]; k++) {
            int b = L->bucket_of[L->unit_params[u][k]], dup = 0;
            for (int j = 0; j < L->unit_nb[u]; j++) dup |= L->unit_buckets[u][j] == b;
            if (dup) continue;
            if (L->unit_nb[u] == ZL_MAX_UNIT_BUCKETS) {
                st = CAI_ERROR(CAI_ERR_INTERNAL, "ZeRO layout: unit %d reads parameters of more than %d buckets", u,
                               ZL_MAX_UNIT_BUCKETS);
                goto fail;
            }
            L->unit_buckets[u][L->unit_nb[u]++] = b;
        }
    int cap = 0;
    for (int k = 0; k < L->nb; k++) CAI_CALL_GOTO(add_segments(L, reg, view, seq_parallel, k, &cap), st, fail);
    for (int x = 0; x < CAI_AXIS_COUNT; x++)
        if (L->axis_n[x] > L->axis_max) L->axis_max = L->axis_n[x];
    cai_free(grp_of);
    return CAI_OK;
fail:
    cai_free(grp_of);
    zl_free(L);
    return st;
}

/* ------------------------------------------------------------ window pool */

cai_status zp_get(zpool *p, size_t bytes, int *handle) {
    for (int i = 0; i < p->n; i++)
        if (!p->blk[i].used && p->blk[i].bytes == bytes) {
            p->blk[i].used = 1;
            *handle = i;
            return CAI_OK;
        }
    if (p->n == p->cap) {
        int ncap = p->cap * 2 + 8;
        zp_block *nb = NULL;
        CAI_CALL(cai_calloc((void **)&nb, (size_t)ncap, sizeof *nb, "ZeRO window pool"));
        if (p->n) memcpy(nb, p->blk, (size_t)p->n * sizeof *nb);
        cai_free(p->blk);
        p->blk = nb;
        p->cap = ncap;
    }
    zp_block *b = &p->blk[p->n];
    b->bytes = bytes;
    b->ptr = NULL;
    if (p->dev && bytes) CAI_CALL(cai_device_alloc(p->dev, bytes, "ZeRO window", &b->ptr));
    b->used = 1;
    p->total += bytes;
    *handle = p->n++;
    return CAI_OK;
}

void zp_put(zpool *p, int handle) {
    if (handle >= 0 && handle < p->n) p->blk[handle].used = 0;
}

void *zp_ptr(const zpool *p, int handle) { return handle >= 0 && handle < p->n ? p->blk[handle].ptr : NULL; }

void zp_free(zpool *p) {
    for (int i = 0; i < p->n; i++)
        if (p->dev) cai_device_dealloc(p->dev, p->blk[i].ptr);
    cai_free(p->blk);
    memset(p, 0, sizeof *p);
}
