/* The ZeRO / data-parallel engine: shard storage, the model hook that
 * reduces gradient buckets during backward and (stage 3) gathers each
 * unit's weights around its forward and backward, the sharded AdamW step
 * (on the device, or on the host with offload) and the refresh of the
 * working weights. See docs/parallel.md and colossal/parallel.h. */
#include "cai_config.h"

#include <math.h>
#include <string.h>

#include "zero_internal.h"

enum { PW_NONE = 0, PW_FLIGHT, PW_READY };

typedef struct {
    int pwin;       /* stage 3: pool block holding the gathered weights, -1 none */
    int pstate;     /* PW_* */
    int pref;       /* units holding the weights */
    int prefetched; /* gathered for a unit that has not taken it yet: keep */
    zc_req preq;
    int gwin;       /* stage 2/3: pool block of this microbatch's gradients, -1 none */
    int bwin;       /* stage 2/3, reduce_dtype bf16: pool block of their bf16 copy (reduce_fp8: the codes
                     * and metas sent and received), -1 none */
    int accumulate; /* stage 2/3, bf16: add the reduced chunk to the shard (not the first microbatch) */
    int reducing;
    zc_req greq;
    zc_req sreq; /* reduce_fp8: the chunks' metas, beside the codes in greq */
} zbucket_rt;

struct cai_zero {
    cai_zero_config cfg;
    int dry; /* the planner's replay: bookkeeping only */
    cai_mesh_t *mesh;
    cai_model_t *model;
    cai_device_t *dev;  /* the model's */
    cai_device_t *hdev; /* offload: where the step runs */
    int own_hdev;
    zc_ctx comm;  /* dp (dp x sp): the dense buckets' group */
    zc_ctx ecomm; /* edp at ep > 1: the expert buckets' group (ZL_GRP_EDP) */
    zl_layout L;
    cai_dtype act, pdt;
    size_t act_size;

    void *W;            /* working weights, act dtype: stage 1/2 [n_pad], stage 3 [shard] */
    float *G;           /* stage 1: full gradients [n_pad]; each bucket's reduced chunk lands at its start */
    float *GS;          /* stage 2/3: reduced gradient shard [shard]; stage 0: the model's gradients */
    float *M, *Mm, *Mv; /* masters and moments [shard] (stage 0 without offload: M is the model's master) */
    int alias;          /* f32 weights without offload: the masters are the working weights' own chunks
                         * (stage 1/2: inside W, M unused; stage 3: M == W) */
    float *GSh;         /* offload: host copy of GS */
    void *Wh;           /* offload, stage >= 1: host staging of the refreshed working shard (act dtype) */
    void *LP;           /* working-dtype rounding scratch [shard] when it is neither F32 nor act */
    double *acc;        /* device sumsq accumulator */
    uint16_t *RB;       /* zero.reduce_dtype bf16: the bf16 copy reductions move, engine layout [n_pad] */
    uint8_t *FB;        /* reduce_fp8, stages 0/1: every bucket's exchange block, at fboff[k] */
    size_t *fboff;
    float *AX;          /* the axis buckets' packing buffer [axis_max] */
    cai_arena_t harena; /* offload: M, Mm, Mv, GSh, Wh, LP in one staging (pinned on a GPU) block */
    size_t mem_params, mem_grads, mem_master, mem_optim, mem_staging, mem_host, mem_rb;

    zpool pool;
    zbucket_rt *rt;
    int *fifo; /* stage 2/3 buckets with reductions in flight, oldest first */
    int fifo_head, fifo_n;

    int in_step, micro, n_micro, in_bwd, bwd_last_started;
    int64_t step;
    cai_zero_piece *pieces;
    cai_tensor *hook_grads;
    int *hook_idx;
    cai_adamw_span *spans; /* the step's, one per shard segment */
    int hooked;            /* the engine's hook is on the model */
    cai_zero_grad_hook ghook;
    void *ghook_ctx;
    cai_zero_stats stats;
};

/* ------------------------------------------------------------ config */

void cai_zero_config_init(cai_zero_config *c) {
    memset(c, 0, sizeof *c);
    c->bucket_bytes = (size_t)25 << 20;
    c->overlap = 1;
    c->prefetch = 1;
    c->timeout_s = 300.0;
}

cai_status cai_zero_config_check(const cai_zero_config *c) {
    CAI_CHECK_ARG(c, "cai_zero_config_check: NULL config");
    if (c->stage < 0 || c->stage > 3)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "zero.stage=%d: stages are 0 (plain data parallel), 1 (optimizer state "
                         "sharded), 2 (+ gradients), 3 (+ parameters)",
                         c->stage);
    if (c->offload != 0 && c->offload != 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "zero.offload=%d must be 0 or 1", c->offload);
    if (!(c->timeout_s > 0)) return CAI_ERROR(CAI_ERR_CONFIG, "zero.timeout=%g s must be > 0", c->timeout_s);
    if (c->reduce_dtype != CAI_DTYPE_F32 && c->reduce_dtype != CAI_DTYPE_BF16)
        return CAI_ERROR(CAI_ERR_CONFIG, "zero.reduce_dtype=%s: gradients reduce in f32 or bf16",
                         cai_dtype_name(c->reduce_dtype));
    if (c->reduce_fp8 && c->reduce_dtype != CAI_DTYPE_F32)
        return CAI_ERROR(CAI_ERR_CONFIG, "zero.reduce_dtype: fp8 and %s at once; choose one",
                         cai_dtype_name(c->reduce_dtype));
    if (c->reduce_only && (c->stage != 0 || c->offload))
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "a reduce-only engine (the caller's optimizer steps the model's buffers) "
                         "is stage 0 without offload, not zero.stage=%d%s",
                         c->stage, c->offload ? " + offload" : "");
    return CAI_OK;
}

void cai_zero_model_options(const cai_zero_config *c, cai_model_options *mo) { mo->external_params = c->stage >= 1; }

const cai_zero_config *cai_zero_get_config(const cai_zero_t *z) { return &z->cfg; }
cai_model_t *cai_zero_model(const cai_zero_t *z) { return z->model; }

cai_status cai_zero_working_weights(cai_zero_t *z, cai_weights_t **out) {
    CAI_CHECK_ARG(z && out, "cai_zero_working_weights: NULL argument");
    *out = NULL;
    if (z->L.stage == 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "cai_zero_working_weights: at zero.stage=0 the working weights are the model's own "
                         "(cai_model_weights)");
    if (z->L.stage == 3)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "cai_zero_working_weights: zero.stage=3 keeps a shard of the working weights on each rank, "
                         "not the whole; use zero.stage <= 2");
    const cai_weights_t *mw = cai_model_weights(z->model);
    cai_weights_t *w = NULL;
    CAI_CALL(
        cai_weights_create(&w, z->dev, cai_weights_config(mw), cai_weights_view(mw), cai_weights_align_elems(mw), 0));
    cai_status st = cai_weights_bind_compute(w, z->W, z->L.eoff);
    if (st != CAI_OK) {
        cai_weights_free(w);
        return st;
    }
    *out = w;
    return CAI_OK;
}
int64_t cai_zero_step_count(const cai_zero_t *z) { return z->step; }
void cai_zero_set_step_count(cai_zero_t *z, int64_t step) { z->step = step < 0 ? 0 : step; }

void cai_zero_set_grad_hook(cai_zero_t *z, cai_zero_grad_hook fn, void *ctx) {
    z->ghook = fn;
    z->ghook_ctx = fn ? ctx : NULL;
}

void cai_zero_get_stats(const cai_zero_t *z, cai_zero_stats *out) {
    *out = z->stats;
    out->n_buckets = z->L.nb;
    out->n_units = z->L.n_units;
    out->comm_bytes = z->comm.bytes + z->ecomm.bytes;
}

void cai_zero_reset_stats(cai_zero_t *z) {
    memset(&z->stats, 0, sizeof z->stats);
    z->comm.bytes = 0;
    z->ecomm.bytes = 0;
}

const cai_zero_piece *cai_zero_pieces(const cai_zero_t *z, int *count) {
    *count = z->L.nseg;
    return z->pieces;
}

/* ------------------------------------------------------------ helpers */

static cai_copy_kind kind_of(const cai_device_t *dst, const cai_device_t *src) {
    int dh = dst->kind == CAI_DEVICE_HOST, sh = src->kind == CAI_DEVICE_HOST;
    return dh && sh ? CAI_COPY_H2H : dh ? CAI_COPY_D2H : sh ? CAI_COPY_H2D : CAI_COPY_D2D;
}

/* Where the optimizer state lives. */
static cai_device_t *sdev(const cai_zero_t *z) { return z->cfg.offload ? z->hdev : z->dev; }

static cai_tensor vec(cai_device_t *dev, void *base, cai_dtype dt, size_t off, size_t n) {
    return cai_tensor_1d(dev, (char *)base + off * cai_dtype_size(dt), dt, (int64_t)n);
}

static void *at(void *base, size_t off, size_t es) { return (char *)base + off * es; }

static cai_status dev_alloc(cai_zero_t *z, size_t bytes, const char *what, size_t *account, void **out) {
    *out = NULL;
    if (!bytes) return CAI_OK;
    CAI_CALL(cai_device_alloc(z->dev, bytes, what, out));
    *account += bytes;
    return CAI_OK;
}

/* State buffers: device memory, or the offload arena. */
static cai_status state_alloc(cai_zero_t *z, size_t bytes, const char *what, size_t *account, void **out) {
    if (!z->cfg.offload) return dev_alloc(z, bytes, what, account, out);
    *out = NULL;
    if (!bytes) return CAI_OK;
    CAI_CALL(cai_arena_alloc(&z->harena, bytes, 64, out));
    *account += bytes;
    (void)what;
    return CAI_OK;
}

static cai_status fill0(cai_device_t *dev, void *p, cai_dtype dt, size_t n) {
    if (!n) return CAI_OK;
    cai_tensor t = vec(dev, p, dt, 0, n);
    CAI_CALL(dev->ops->fill(dev, &t, 0.0f));
    return CAI_OK;
}

/* The ranks bucket k is reduced and sharded over. */
static zc_ctx *ctx_of(cai_zero_t *z, int k) { return z->L.b[k].grp == ZL_GRP_EDP ? &z->ecomm : &z->comm; }

/* Bucket k's working weights as the model reads them (stage 1/2 full
 * buffer, stage 3 gathered window). */
static void *weights_of(cai_zero_t *z, int k) {
    const zl_bucket *b = &z->L.b[k];
    if (z->L.stage == 3) return zp_ptr(&z->pool, z->rt[k].pwin);
    return at(z->W, b->elo, z->act_size);
}

static float *grads_of(cai_zero_t *z, int k) {
    const zl_bucket *b = &z->L.b[k];
    if (z->L.stage >= 2) return zp_ptr(&z->pool, z->rt[k].gwin);
    if (z->L.stage == 1) return z->G + b->elo;
    return z->GS + b->lo; /* stage 0: the model's gradients, engine layout == model layout */
}

/* This rank's F32 masters of bucket k (its chunk), where the step runs. */
static float *master_of(cai_zero_t *z, int k) {
    const zl_bucket *b = &z->L.b[k];
    if (z->L.stage == 0) return z->M + b->lo; /* one shard: soff == lo */
    if (z->alias && z->L.stage < 3) return (float *)z->W + b->elo + (size_t)b->srank * b->chunk;
    return z->M + b->soff;
}

/* This rank's reduced gradients of bucket k (device memory). */
static float *reduced_of(cai_zero_t *z, int k) {
    const zl_bucket *b = &z->L.b[k];
    if (z->L.stage == 0) return z->GS + b->lo;
    if (z->L.stage == 1) return z->G + b->elo; /* reduce-scattered in place */
    return z->GS + b->soff;
}

/* Bind unit u's parameters: weights (with_w) and gradients (with_g); a
 * flag of 0 unbinds. Stage >= 1 only. */
static cai_status bind_unit(cai_zero_t *z, int u, int with_w, int with_g) {
    if (z->dry) return CAI_OK;
    for (int k = 0; k < z->L.unit_np[u]; k++) {
        int i = z->L.unit_params[u][k], bk = z->L.bucket_of[i];
        size_t rel = z->L.eoff[i] - z->L.b[bk].elo;
        void *w = with_w ? at(weights_of(z, bk), rel, z->act_size) : NULL;
        float *g = with_g ? grads_of(z, bk) + rel : NULL;
        CAI_CALL(cai_model_bind_param(z->model, i, w, g));
    }
    return CAI_OK;
}

static void progress(cai_zero_t *z) {
    if (z->dry || !z->comm.host) return;
    for (int k = 0; k < z->L.nb; k++) {
        zc_progress(ctx_of(z, k), &z->rt[k].greq, 1);
        zc_progress(ctx_of(z, k), &z->rt[k].sreq, 1);
        zc_progress(ctx_of(z, k), &z->rt[k].preq, 1);
    }
}

/* ------------------------------------------------------------ stage 3 weight windows */

static cai_status start_gather(cai_zero_t *z, int k) {
    zbucket_rt *r = &z->rt[k];
    const zl_bucket *b = &z->L.b[k];
    CAI_CALL(zp_get(&z->pool, b->len * z->act_size, &r->pwin));
    z->stats.gathers++;
    r->pstate = PW_READY;
    if (z->dry) return CAI_OK;
    void *win = zp_ptr(&z->pool, r->pwin);
    CAI_CALL(cai_device_copy(z->dev, at(win, (size_t)b->srank * b->chunk, z->act_size), at(z->W, b->soff, z->act_size),
                             b->chunk * z->act_size, kind_of(z->dev, z->dev)));
    /* No synchronisation: the mesh's collectives wait for the device's
     * stream (cai_mesh_set_cuda_stream in cai_zero_create). */
    CAI_CALL(zc_all_gather(ctx_of(z, k), win, b->chunk, z->act, k, &r->preq));
    if (r->preq.kind != ZC_NONE) r->pstate = PW_FLIGHT;
    return CAI_OK;
}

static cai_status acquire_weights(cai_zero_t *z, int u) {
    for (int j = 0; j < z->L.unit_nb[u]; j++) {
        int k = z->L.unit_buckets[u][j];
        zbucket_rt *r = &z->rt[k];
        if (r->prefetched) z->stats.prefetch_hits++;
        if (r->pstate == PW_NONE) CAI_CALL(start_gather(z, k));
        if (r->pstate == PW_FLIGHT) {
            CAI_CALL(zc_wait(ctx_of(z, k), &r->preq));
            r->pstate = PW_READY;
        }
        r->prefetched = 0;
        r->pref++;
    }
    return CAI_OK;
}

static cai_status prefetch_weights(cai_zero_t *z, int u) {
    if (!z->cfg.prefetch || u < 0 || u >= z->L.n_units) return CAI_OK;
    for (int j = 0; j < z->L.unit_nb[u]; j++) {
        int k = z->L.unit_buckets[u][j];
        if (z->rt[k].pstate == PW_NONE) CAI_CALL(start_gather(z, k));
        z->rt[k].prefetched = 1;
    }
    return CAI_OK;
}

static cai_status release_weights(cai_zero_t *z, int u) {
    for (int j = 0; j < z->L.unit_nb[u]; j++) {
        int k = z->L.unit_buckets[u][j];
        zbucket_rt *r = &z->rt[k];
        if (--r->pref > 0 || r->prefetched) continue;
        if (r->pstate == PW_FLIGHT) CAI_CALL(zc_wait(ctx_of(z, k), &r->preq));
        zp_put(&z->pool, r->pwin);
        r->pwin = -1;
        r->pstate = PW_NONE;
    }
    return CAI_OK;
}

/* ------------------------------------------------------------ gradient reductions */

/* zero.reduce_dtype bf16: where bucket k's bf16 copy starts in RB, and its
 * *n elements (stage 0: the bucket's model range; stage 1: its padded
 * engine range, reduce-scattered in place). */
static size_t bf16_copy_span(const cai_zero_t *z, int k, size_t *n) {
    const zl_bucket *b = &z->L.b[k];
    *n = z->L.stage == 0 ? b->hi - b->lo : b->len;
    return z->L.stage == 0 ? b->lo : b->elo;
}

/* reduce_fp8: bucket k's exchange block (zl_fp8_block_bytes): codes sent
 * and received, metas sent and received, and at stage 0 the all-gather's
 * codes and metas and this rank's f32 sum. */
static uint8_t *fp8_block(cai_zero_t *z, int k) {
    return z->L.stage >= 2 ? (uint8_t *)zp_ptr(&z->pool, z->rt[k].bwin) : z->FB + z->fboff[k];
}
static uint8_t *fp8_codes(cai_zero_t *z, int k, int part) { /* 0 sent, 1 received, 2 gathered */
    const size_t rc = (size_t)zl_fp8_rows(&z->L, k) * zl_fp8_chunk(&z->L, k);
    const size_t metas = (size_t)zl_fp8_rows(&z->L, k) * ZL_FP8_STRIDE * sizeof(float);
    return fp8_block(z, k) + (part == 2 ? 2 * rc + 2 * metas : (size_t)part * rc);
}
static float *fp8_metas(cai_zero_t *z, int k, int part) {
    const size_t rows = (size_t)zl_fp8_rows(&z->L, k), rc = rows * zl_fp8_chunk(&z->L, k);
    if (part == 2) return (float *)(fp8_codes(z, k, 2) + rc);
    return (float *)(fp8_block(z, k) + 2 * rc) + (part ? rows * ZL_FP8_STRIDE : 0);
}
static float *fp8_sum(cai_zero_t *z, int k) {
    return fp8_metas(z, k, 2) + (size_t)zl_fp8_rows(&z->L, k) * ZL_FP8_STRIDE;
}

/* E5M2 codes of n f32 gradients at src, scaled from their own amax into
 * meta, which the caller zeroed (an empty piece's then decodes to zeros). */
static cai_status fp8_encode(cai_zero_t *z, uint8_t *dst, float *meta, const float *src, size_t n) {
    if (!n) return CAI_OK;
    cai_tensor m = vec(z->dev, meta, CAI_DTYPE_F32, 0, ZL_FP8_STRIDE);
    cai_tensor x = cai_tensor_2d(z->dev, (void *)src, CAI_DTYPE_F32, 1, (int64_t)n);
    cai_tensor q = cai_tensor_2d(z->dev, dst, CAI_DTYPE_U8, 1, (int64_t)n);
    CAI_CALL(z->dev->ops->fp8_cast(z->dev, &q, NULL, &x, &m, CAI_FP8_E5M2, 1, 0));
    return CAI_OK;
}

/* dst[c] = beta dst + the sum over rows of the decoded codes [rows, c], in
 * row order. */
static cai_status fp8_decode(cai_zero_t *z, float *dst, const uint8_t *codes, const float *metas, int rows, size_t c,
                             float beta) {
    if (!c) return CAI_OK;
    cai_tensor q = cai_tensor_2d(z->dev, (void *)codes, CAI_DTYPE_U8, rows, (int64_t)c);
    cai_tensor m = vec(z->dev, (void *)metas, CAI_DTYPE_F32, 0, (size_t)rows * ZL_FP8_STRIDE);
    cai_tensor y = vec(z->dev, dst, CAI_DTYPE_F32, 0, c);
    CAI_CALL(z->dev->ops->fp8_dequant_sum(z->dev, &y, &q, &m, ZL_FP8_STRIDE, CAI_FP8_E5M2, beta));
    return CAI_OK;
}

/* Stage 0's second half of an FP8 all-reduce: this rank's summed piece
 * encoded again and all-gathered, and every piece decoded into the
 * gradients, this rank's own included, so every replica holds the same
 * bits. */
static cai_status fp8_gather(cai_zero_t *z, int k) {
    zc_ctx *c = ctx_of(z, k);
    const size_t ch = zl_fp8_chunk(&z->L, k);
    const int rows = zl_fp8_rows(&z->L, k);
    uint8_t *codes = fp8_codes(z, k, 2);
    float *metas = fp8_metas(z, k, 2);
    CAI_CALL(fill0(z->dev, metas + (size_t)c->rank * ZL_FP8_STRIDE, CAI_DTYPE_F32, ZL_FP8_STRIDE));
    CAI_CALL(fp8_encode(z, codes + (size_t)c->rank * ch, metas + (size_t)c->rank * ZL_FP8_STRIDE, fp8_sum(z, k),
                        zl_fp8_piece(&z->L, k, c->rank)));
    zc_req a, b;
    CAI_CALL(zc_all_gather(c, codes, ch, CAI_DTYPE_U8, k, &a));
    cai_status st = zc_all_gather(c, metas, ZL_FP8_STRIDE, CAI_DTYPE_F32, k, &b);
    cai_status wa = zc_wait(c, &a);
    CAI_CALL(st);
    CAI_CALL(wa);
    CAI_CALL(zc_wait(c, &b));
    for (int d = 0; d < rows; d++)
        CAI_CALL(fp8_decode(z, grads_of(z, k) + (size_t)d * ch, codes + (size_t)d * ch,
                            metas + (size_t)d * ZL_FP8_STRIDE, 1, zl_fp8_piece(&z->L, k, d), 0.0f));
    return CAI_OK;
}

static cai_status wait_reduction(cai_zero_t *z, int k) {
    zbucket_rt *r = &z->rt[k];
    if (!r->reducing) return CAI_OK;
    r->reducing = 0;
    if (!z->dry) CAI_CALL(zc_wait(ctx_of(z, k), &r->greq));
    if (!z->dry && z->cfg.reduce_fp8) {
        /* the pieces every rank sent this one, decoded and summed in rank
         * order: into the shard (added to it after the first microbatch),
         * at stage 0 into the sum that is gathered back */
        CAI_CALL(zc_wait(ctx_of(z, k), &r->sreq));
        float *dst = z->L.stage == 0 ? fp8_sum(z, k) : reduced_of(z, k);
        CAI_CALL(fp8_decode(z, dst, fp8_codes(z, k, 1), fp8_metas(z, k, 1), zl_fp8_rows(&z->L, k),
                            zl_fp8_chunk(&z->L, k), r->accumulate ? 1.0f : 0.0f));
        if (z->L.stage == 0) CAI_CALL(fp8_gather(z, k));
    } else if (!z->dry && z->RB) {
        /* stage 0: the whole bucket; stage 1: this rank's chunk, which the
         * in-place reduce-scatter left at the copy's start */
        size_t n = 0;
        const size_t off = bf16_copy_span(z, k, &n);
        if (z->L.stage == 1) n = z->L.b[k].chunk;
        cai_tensor narrow = vec(z->dev, z->RB, CAI_DTYPE_BF16, off, n);
        cai_tensor wide = vec(z->dev, reduced_of(z, k), CAI_DTYPE_F32, 0, n);
        CAI_CALL(z->dev->ops->copy(z->dev, &wide, &narrow));
    }
    if (!z->dry && r->bwin >= 0 && !z->cfg.reduce_fp8) {
        /* stage 2/3 in bf16: this rank's chunk, at the copy's start, widened
         * into the shard; from the second microbatch on through the f32
         * window (free now) and added, so the sum over microbatches stays f32 */
        const size_t chunk = z->L.b[k].chunk;
        cai_tensor narrow = vec(z->dev, zp_ptr(&z->pool, r->bwin), CAI_DTYPE_BF16, 0, chunk);
        cai_tensor acc = vec(z->dev, reduced_of(z, k), CAI_DTYPE_F32, 0, chunk);
        if (r->accumulate) {
            cai_tensor wide = vec(z->dev, grads_of(z, k), CAI_DTYPE_F32, 0, chunk);
            CAI_CALL(z->dev->ops->copy(z->dev, &wide, &narrow));
            CAI_CALL(z->dev->ops->axpy(z->dev, &acc, 1.0f, &wide));
        } else {
            CAI_CALL(z->dev->ops->copy(z->dev, &acc, &narrow));
        }
    }
    if (r->bwin >= 0) {
        zp_put(&z->pool, r->bwin);
        r->bwin = -1;
    }
    if (z->L.stage >= 2) {
        zp_put(&z->pool, r->gwin);
        r->gwin = -1;
    }
    return CAI_OK;
}

static cai_status wait_oldest(cai_zero_t *z) {
    int k = z->fifo[z->fifo_head];
    z->fifo_head = (z->fifo_head + 1) % (z->L.nb + 1);
    z->fifo_n--;
    CAI_CALL(wait_reduction(z, k));
    return CAI_OK;
}

static cai_status start_reduction(cai_zero_t *z, int k) {
    zbucket_rt *r = &z->rt[k];
    const zl_bucket *b = &z->L.b[k];
    z->stats.reductions++;
    if (z->in_bwd) z->stats.reductions_in_bwd++;
    if (z->in_bwd && !z->bwd_last_started) z->stats.reductions_early++;
    r->reducing = 1;
    if (z->L.stage >= 2) {
        z->fifo[(z->fifo_head + z->fifo_n) % (z->L.nb + 1)] = k;
        z->fifo_n++;
    }
    if (z->cfg.reduce_fp8) {
        /* each destination piece cast to E5M2 with a scale from its own
         * amax, codes and metas exchanged all-to-all (stages 2/3 from the
         * pool, so the planner's replay counts the block); wait_reduction
         * decodes and sums what arrived */
        if (z->L.stage >= 2) CAI_CALL(zp_get(&z->pool, zl_fp8_block_bytes(&z->L, k), &r->bwin));
        r->accumulate = z->L.stage >= 2 && z->micro > 0;
        if (!z->dry) {
            const size_t ch = zl_fp8_chunk(&z->L, k);
            float *sm = fp8_metas(z, k, 0);
            CAI_CALL(fill0(z->dev, sm, CAI_DTYPE_F32, (size_t)zl_fp8_rows(&z->L, k) * ZL_FP8_STRIDE));
            for (int d = 0; d < zl_fp8_rows(&z->L, k); d++)
                CAI_CALL(fp8_encode(z, fp8_codes(z, k, 0) + (size_t)d * ch, sm + (size_t)d * ZL_FP8_STRIDE,
                                    grads_of(z, k) + (size_t)d * ch, zl_fp8_piece(&z->L, k, d)));
            CAI_CALL(
                zc_all_to_all(ctx_of(z, k), fp8_codes(z, k, 0), fp8_codes(z, k, 1), CAI_DTYPE_U8, ch, k, &r->greq));
            CAI_CALL(zc_all_to_all(ctx_of(z, k), sm, fp8_metas(z, k, 1), CAI_DTYPE_F32, ZL_FP8_STRIDE, k, &r->sreq));
        }
    } else if (z->L.stage >= 2 && z->cfg.reduce_dtype == CAI_DTYPE_BF16) {
        /* the window rounded into a bf16 window of its own (from the pool, so
         * the planner's replay counts it), reduce-scattered in place;
         * wait_reduction widens this rank's chunk into the shard */
        CAI_CALL(zp_get(&z->pool, b->len * sizeof(uint16_t), &r->bwin));
        r->accumulate = z->micro > 0;
        if (!z->dry) {
            cai_tensor wide = vec(z->dev, grads_of(z, k), CAI_DTYPE_F32, 0, b->len);
            cai_tensor narrow = vec(z->dev, zp_ptr(&z->pool, r->bwin), CAI_DTYPE_BF16, 0, b->len);
            CAI_CALL(z->dev->ops->copy(z->dev, &narrow, &wide));
            CAI_CALL(
                zc_reduce_scatter_sum(ctx_of(z, k), narrow.data, narrow.data, CAI_DTYPE_BF16, b->chunk, k, &r->greq));
        }
    } else if (!z->dry) {
        /* The backward's kernels that write the bucket are ordered before the
         * collective by the mesh's stream (set in cai_zero_create): no
         * device synchronisation, so compute keeps the GPU busy meanwhile. */
        if (z->RB) {
            /* round the bucket into its bf16 copy (stream-ordered after the
             * backward's writes), reduce that; wait_reduction widens back */
            size_t n = 0;
            const size_t off = bf16_copy_span(z, k, &n);
            cai_tensor wide = vec(z->dev, grads_of(z, k), CAI_DTYPE_F32, 0, n);
            cai_tensor narrow = vec(z->dev, z->RB, CAI_DTYPE_BF16, off, n);
            CAI_CALL(z->dev->ops->copy(z->dev, &narrow, &wide));
            if (z->L.stage == 0) CAI_CALL(zc_allreduce_sum(ctx_of(z, k), narrow.data, CAI_DTYPE_BF16, n, k, &r->greq));
            else
                CAI_CALL(zc_reduce_scatter_sum(ctx_of(z, k), narrow.data, narrow.data, CAI_DTYPE_BF16, b->chunk, k,
                                               &r->greq));
        } else if (z->L.stage == 0) {
            CAI_CALL(zc_allreduce_sum(ctx_of(z, k), z->GS + b->lo, CAI_DTYPE_F32, b->hi - b->lo, k, &r->greq));
        } else {
            float *src = grads_of(z, k), *dst = reduced_of(z, k);
            if (z->L.stage >= 2 && z->micro > 0) {
                /* Accumulate over microbatches through the reduction itself:
                 * only the owner adds its running shard into its own chunk. */
                cai_tensor own = vec(z->dev, src, CAI_DTYPE_F32, (size_t)b->srank * b->chunk, b->chunk);
                cai_tensor acc = vec(z->dev, dst, CAI_DTYPE_F32, 0, b->chunk);
                CAI_CALL(z->dev->ops->axpy(z->dev, &own, 1.0f, &acc));
            }
            CAI_CALL(zc_reduce_scatter_sum(ctx_of(z, k), src, dst, CAI_DTYPE_F32, b->chunk, k, &r->greq));
        }
    }
    /* Bounded gradient windows: the planner's peak assumes this cap. */
    while (z->L.stage >= 2 && z->fifo_n > ZERO_MAX_INFLIGHT) CAI_CALL(wait_oldest(z));
    return CAI_OK;
}

/* Whether this microbatch's backward reduces (stage 0/1 accumulate locally
 * until the last microbatch). */
static int reduces_now(const cai_zero_t *z) { return z->L.stage >= 2 || z->micro == z->n_micro - 1; }

static cai_status ensure_grad_windows(cai_zero_t *z, int u) {
    for (int j = 0; j < z->L.unit_nb[u]; j++) {
        int k = z->L.unit_buckets[u][j];
        zbucket_rt *r = &z->rt[k];
        if (r->gwin >= 0) continue;
        CAI_CALL(zp_get(&z->pool, z->L.b[k].len * sizeof(float), &r->gwin));
        if (!z->dry) CAI_CALL(fill0(z->dev, zp_ptr(&z->pool, r->gwin), CAI_DTYPE_F32, z->L.b[k].len));
    }
    return CAI_OK;
}

static cai_status call_grad_hook(cai_zero_t *z, int u) {
    int n = z->L.unit_np[u];
    for (int k = 0; k < n; k++) {
        int i = z->L.unit_params[u][k], bk = z->L.bucket_of[i];
        z->hook_idx[k] = i;
        z->hook_grads[k] = vec(z->dev, grads_of(z, bk), CAI_DTYPE_F32, z->L.eoff[i] - z->L.b[bk].elo, z->L.numel[i]);
    }
    CAI_CALL(z->ghook(z->ghook_ctx, z, u, z->hook_idx, z->hook_grads, n));
    return CAI_OK;
}

/* ------------------------------------------------------------ the hook */

static cai_status on_event(cai_zero_t *z, cai_model_event ev, int u) {
    const int s3 = z->L.stage == 3;
    switch (ev) {
    case CAI_MODEL_PRE_FORWARD:
        if (s3) {
            CAI_CALL(acquire_weights(z, u));
            CAI_CALL(bind_unit(z, u, 1, 0));
            CAI_CALL(prefetch_weights(z, u + 1));
        }
        break;
    case CAI_MODEL_POST_FORWARD:
        if (s3) {
            CAI_CALL(bind_unit(z, u, 0, 0));
            CAI_CALL(release_weights(z, u));
        }
        break;
    case CAI_MODEL_PRE_BACKWARD:
        if (!z->in_step && z->L.stage >= 2)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "ZeRO stage %d: a backward outside cai_zero_forward_backward has "
                             "nowhere to put its gradients",
                             z->L.stage);
        if (u == 0) z->bwd_last_started = 1;
        if (s3) {
            CAI_CALL(acquire_weights(z, u));
            CAI_CALL(prefetch_weights(z, u - 1));
        }
        if (z->L.stage >= 2) {
            CAI_CALL(ensure_grad_windows(z, u));
            CAI_CALL(bind_unit(z, u, 1, 1));
        }
        break;
    case CAI_MODEL_POST_BACKWARD:
        if (z->ghook && !z->dry) CAI_CALL(call_grad_hook(z, u));
        if (z->L.stage >= 2) CAI_CALL(bind_unit(z, u, !s3, 0));
        if (s3) CAI_CALL(release_weights(z, u));
        if (z->in_step && z->cfg.overlap && reduces_now(z))
            for (int k = 0; k < z->L.nb; k++) {
                if (z->L.b[k].unit_lo != u) continue;
                /* Only the buckets of the backward's last unit (0) have the
                 * GPU to themselves; the others share it with the backward
                 * (the mesh may give those fewer SMs: nccl_overlap_ctas). */
                cai_mesh_overlap_compute(z->mesh, u != 0);
                cai_status st = start_reduction(z, k);
                cai_mesh_overlap_compute(z->mesh, 0);
                CAI_CALL(st);
            }
        break;
    default: break;
    }
    progress(z);
    return CAI_OK;
}

static cai_status hook(void *ctx, cai_model_t *m, cai_model_event ev, int unit) {
    (void)m;
    return on_event((cai_zero_t *)ctx, ev, unit);
}

/* After a microbatch's backward: the reductions not started yet (no
 * overlap), then all of them finished. */
static cai_status end_backward(cai_zero_t *z) {
    z->in_bwd = 0;
    if (!reduces_now(z)) return CAI_OK;
    if (!z->cfg.overlap)
        for (int k = z->L.nb - 1; k >= 0; k--) CAI_CALL(start_reduction(z, k));
    while (z->fifo_n) CAI_CALL(wait_oldest(z));
    for (int k = z->L.nb - 1; k >= 0; k--) CAI_CALL(wait_reduction(z, k));
    return CAI_OK;
}

/* ------------------------------------------------------------ axis buckets */

/* Axes a bucket of the engine's reduces over besides dp, in the order they
 * are reduced (the sums commute; this is the order of the mesh's axes). */
static const int sync_axes[] = {CAI_AXIS_TP};

/* Every rank of an axis group must pack the same elements in the same order:
 * its members hold equal local layouts (tp shards are even), so equal counts
 * are checked once here rather than trusted every step. */
static cai_status check_axis_buckets(cai_zero_t *z) {
    for (size_t a = 0; a < sizeof sync_axes / sizeof sync_axes[0]; a++) {
        const int x = sync_axes[a];
        if (cai_mesh_size(z->mesh, x) <= 1) continue;
        double n[2] = {(double)z->L.axis_n[x], -(double)z->L.axis_n[x]};
        CAI_CALL(cai_allreduce(z->mesh, x, n, n, 2, CAI_DTYPE_F64, CAI_RED_MIN));
        if (n[0] != -n[1])
            return CAI_ERROR(CAI_ERR_INTERNAL,
                             "ZeRO: the %s axis bucket holds %zu elements on this rank but between %.0f and %.0f "
                             "on the others of its group (the ranks' sequence-parallel settings or layouts differ)",
                             cai_axis_name(x), z->L.axis_n[x], n[0], -n[1]);
    }
    return CAI_OK;
}

/* The axis buckets: once per step, after the dp reductions have finished,
 * every shard segment whose gradient is also partial over an axis (norm
 * weights under sequence parallelism: tp) is packed into one buffer, summed
 * over that axis in one all-reduce and unpacked. The dp and tp sums commute,
 * so this equals reducing each microbatch's partial over tp first, with one
 * collective a step instead of one per norm per microbatch. */
static cai_status reduce_axis_buckets(cai_zero_t *z) {
    const zl_layout *L = &z->L;
    cai_device_t *dev = z->dev;
    for (size_t a = 0; a < sizeof sync_axes / sizeof sync_axes[0]; a++) {
        const int x = sync_axes[a];
        if (!L->axis_n[x] || cai_mesh_size(z->mesh, x) <= 1) continue;
        for (int pass = 0; pass < 2; pass++) {
            size_t at = 0;
            for (int s = 0; s < L->nseg; s++) {
                const zl_seg *g = &L->seg[s];
                if (!(g->axes & (1u << x))) continue;
                cai_tensor grad =
                    vec(dev, reduced_of(z, g->bucket), CAI_DTYPE_F32, g->soff - L->b[g->bucket].soff, g->n);
                cai_tensor packed = vec(dev, z->AX, CAI_DTYPE_F32, at, g->n);
                CAI_CALL(pass == 0 ? dev->ops->copy(dev, &packed, &grad) : dev->ops->copy(dev, &grad, &packed));
                at += g->n;
            }
            if (pass == 0) CAI_CALL(cai_allreduce(z->mesh, x, z->AX, z->AX, L->axis_n[x], CAI_DTYPE_F32, CAI_RED_SUM));
        }
    }
    return CAI_OK;
}

/* ------------------------------------------------------------ planner replay */

static cai_status rt_alloc(cai_zero_t *z) {
    CAI_CALL(cai_calloc((void **)&z->rt, (size_t)z->L.nb + 1, sizeof *z->rt, "ZeRO bucket state"));
    CAI_CALL(cai_calloc((void **)&z->fifo, (size_t)z->L.nb + 1, sizeof *z->fifo, "ZeRO reduction queue"));
    for (int k = 0; k < z->L.nb; k++) z->rt[k].pwin = z->rt[k].gwin = z->rt[k].bwin = -1;
    return CAI_OK;
}

cai_status zero_window_peak(const zl_layout *L, size_t act_size, const cai_zero_config *cfg, size_t *peak) {
    *peak = 0;
    if (L->stage < 2) return CAI_OK;
    cai_zero_t z;
    memset(&z, 0, sizeof z);
    z.dry = 1;
    z.L = *L; /* borrowed: never freed here */
    z.act_size = act_size;
    z.cfg = *cfg;
    z.in_step = 1;
    z.n_micro = 1;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(rt_alloc(&z), st, done);
    /* The event order of cai_model_forward / cai_model_backward. */
    for (int u = 0; u < L->n_units; u++) {
        CAI_CALL_GOTO(on_event(&z, CAI_MODEL_PRE_FORWARD, u), st, done);
        CAI_CALL_GOTO(on_event(&z, CAI_MODEL_POST_FORWARD, u), st, done);
    }
    z.in_bwd = 1;
    for (int u = L->n_units - 1; u >= 0; u--) {
        CAI_CALL_GOTO(on_event(&z, CAI_MODEL_PRE_BACKWARD, u), st, done);
        CAI_CALL_GOTO(on_event(&z, CAI_MODEL_POST_BACKWARD, u), st, done);
    }
    CAI_CALL_GOTO(end_backward(&z), st, done);
    *peak = z.pool.total;
done:
    zp_free(&z.pool);
    cai_free(z.rt);
    cai_free(z.fifo);
    return st;
}

/* Every window block the step will use, allocated now: the replay of one
 * microbatch's schedule above, on the engine itself with bookkeeping only,
 * leaves the pool holding its high-water set of blocks (the same sizes the
 * real step asks for, since it runs the same schedule), so training steps
 * make no device allocation. */
static cai_status alloc_windows(cai_zero_t *z) {
    const zl_layout *L = &z->L;
    if (L->stage < 2) return CAI_OK;
    z->dry = 1;
    z->in_step = 1;
    z->n_micro = 1;
    z->micro = 0;
    cai_status st = CAI_OK;
    for (int u = 0; u < L->n_units && st == CAI_OK; u++) {
        st = on_event(z, CAI_MODEL_PRE_FORWARD, u);
        if (st == CAI_OK) st = on_event(z, CAI_MODEL_POST_FORWARD, u);
    }
    z->in_bwd = 1;
    for (int u = L->n_units - 1; u >= 0 && st == CAI_OK; u--) {
        st = on_event(z, CAI_MODEL_PRE_BACKWARD, u);
        if (st == CAI_OK) st = on_event(z, CAI_MODEL_POST_BACKWARD, u);
    }
    if (st == CAI_OK) st = end_backward(z);
    /* Back to the state of an engine that has not stepped. */
    z->dry = z->in_step = z->in_bwd = z->bwd_last_started = 0;
    z->fifo_head = z->fifo_n = 0;
    memset(z->rt, 0, (size_t)L->nb * sizeof *z->rt);
    for (int k = 0; k < L->nb; k++) z->rt[k].pwin = z->rt[k].gwin = z->rt[k].bwin = -1;
    for (int i = 0; i < z->pool.n; i++) z->pool.blk[i].used = 0;
    memset(&z->stats, 0, sizeof z->stats);
    return st;
}

/* ------------------------------------------------------------ working weights */

/* dst (act dtype) = the masters rounded through the working dtype, as the
 * model's own refresh does (F32 -> param dtype RNE -> act dtype). */
static cai_status round_masters(cai_zero_t *z, cai_device_t *dev, void *dst, const float *src, void *lp, size_t n) {
    cai_tensor d = vec(dev, dst, z->act, 0, n), s = vec(dev, (void *)src, CAI_DTYPE_F32, 0, n);
    if (z->pdt == CAI_DTYPE_F32 || z->pdt == z->act) {
        CAI_CALL(dev->ops->copy(dev, &d, &s));
        return CAI_OK;
    }
    cai_tensor l = vec(dev, lp, z->pdt, 0, n);
    CAI_CALL(dev->ops->copy(dev, &l, &s));
    CAI_CALL(dev->ops->copy(dev, &d, &l));
    return CAI_OK;
}

/* Every working weight from the masters: stage 0 through the model; stage
 * >= 1 this rank's chunks, then (1/2) an all-gather of every bucket. */
/* rounded: offload, the step's op already wrote the rounded shard into Wh
 * (segments it does not update keep what the last full rounding wrote). */
static cai_status publish(cai_zero_t *z, int rounded) {
    const zl_layout *L = &z->L;
    if (L->stage == 0) {
        if (z->cfg.offload) {
            cai_tensor mp;
            cai_model_flat(z->model, &mp, NULL, NULL);
            CAI_CALL(cai_device_copy(z->dev, mp.data, z->M, L->n_flat * sizeof(float), kind_of(z->dev, z->hdev)));
        }
        CAI_CALL(cai_model_params_updated(z->model));
        return CAI_OK;
    }
    /* Rounded shard: straight into the stage 3 shard, else into staging;
     * aliased f32 masters already are the working weights. */
    cai_device_t *rd = sdev(z);
    void *shard = z->cfg.offload ? z->Wh : L->stage == 3 ? z->W : NULL;
    if (z->alias) {
        if (L->stage == 3) return CAI_OK;
    } else if (!shard) {
        for (int k = 0; k < L->nb; k++) {
            const zl_bucket *b = &L->b[k];
            void *own = at(z->W, b->elo + (size_t)b->srank * b->chunk, z->act_size);
            void *lp = z->LP ? at(z->LP, b->soff, cai_dtype_size(z->pdt)) : NULL;
            CAI_CALL(round_masters(z, rd, own, z->M + b->soff, lp, b->chunk));
        }
    } else {
        if (!rounded) CAI_CALL(round_masters(z, rd, shard, z->M, z->LP, L->shard));
        if (z->cfg.offload) {
            if (L->stage == 3) {
                CAI_CALL(cai_device_copy(z->dev, z->W, z->Wh, L->shard * z->act_size, kind_of(z->dev, z->hdev)));
            } else {
                for (int k = 0; k < L->nb; k++) {
                    const zl_bucket *b = &L->b[k];
                    CAI_CALL(cai_device_copy(z->dev, at(z->W, b->elo + (size_t)b->srank * b->chunk, z->act_size),
                                             at(z->Wh, b->soff, z->act_size), b->chunk * z->act_size,
                                             kind_of(z->dev, z->hdev)));
                }
            }
        }
    }
    /* Retires the H2D copies out of the pinned staging before the host
     * rewrites it; without offload the all-gathers below are ordered after
     * the rounding by the mesh's stream. */
    if (z->cfg.offload) CAI_CALL(cai_device_sync(z->dev));
    if (L->stage == 3) return CAI_OK;
    for (int k = 0; k < L->nb; k++)
        CAI_CALL(
            zc_all_gather(ctx_of(z, k), at(z->W, L->b[k].elo, z->act_size), L->b[k].chunk, z->act, k, &z->rt[k].preq));
    for (int k = 0; k < L->nb; k++) CAI_CALL(zc_wait(ctx_of(z, k), &z->rt[k].preq));
    return CAI_OK;
}

cai_status cai_zero_state_loaded(cai_zero_t *z) {
    CAI_CHECK_ARG(z, "cai_zero_state_loaded: NULL engine");
    CAI_CALL(publish(z, 0));
    return CAI_OK;
}

/* ------------------------------------------------------------ create / free */

/* The masters of this rank's pieces, parameter by parameter: from `src`
 * (the global tensor, this rank's shard extracted from it), else from the
 * registry's layout-invariant init. src is called for every registered
 * parameter in registry order, with NULL where this rank holds none of it,
 * so a collective source stays in step across ranks. */
static cai_status fill_masters(cai_zero_t *z, cai_zero_param_source src, void *ctx) {
    const zl_layout *L = &z->L;
    cai_device_t *d = sdev(z);
    const cai_registry_t *reg = cai_model_registry(z->model);
    const cai_model_config *mc = cai_model_config_of(z->model);
    const cai_rank_view *view = cai_model_view(z->model);
    uint64_t max_global = 0;
    for (int i = 0; src && i < cai_registry_count(reg); i++)
        if (cai_registry_param(reg, i)->numel > max_global) max_global = cai_registry_param(reg, i)->numel;
    float *tmp = NULL, *global = NULL;
    cai_status st = CAI_OK;
    if (L->max_param_numel)
        CAI_CALL(
            cai_device_alloc_staging(z->dev, L->max_param_numel * sizeof(float), "ZeRO init staging", (void **)&tmp));
    if (max_global)
        CAI_CALL_GOTO(cai_malloc((void **)&global, (size_t)max_global * sizeof *global, "ZeRO source tensor"), st,
                      done);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        int held = 0;
        for (int s = 0; s < L->nseg && !held; s++) held = L->seg[s].index == i;
        if (!held) {
            if (src) CAI_CALL_GOTO(src(ctx, cai_registry_param(reg, i), NULL), st, done);
            continue;
        }
        /* Copies out of the pinned buffer may still be in flight on a GPU. */
        CAI_CALL_GOTO(cai_device_sync(z->dev), st, done);
        if (src) {
            cai_param_shard sh;
            CAI_CALL_GOTO(src(ctx, cai_registry_param(reg, i), global), st, done);
            CAI_CALL_GOTO(cai_registry_shard(reg, i, view, &sh), st, done);
            cai_shard_extract(&sh, sizeof(float), global, tmp);
        } else {
            CAI_CALL_GOTO(cai_registry_init_local(reg, i, view, mc->seed, tmp, L->max_param_numel), st, done);
        }
        for (int s = 0; s < L->nseg; s++) {
            const zl_seg *g = &L->seg[s];
            if (g->index != i) continue;
            float *dst = master_of(z, g->bucket) + (g->soff - L->b[g->bucket].soff);
            CAI_CALL_GOTO(cai_device_copy(d, dst, tmp + g->poff, g->n * sizeof(float),
                                          d->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D),
                          st, done);
        }
    }
done:
    if (cai_device_sync(z->dev) != CAI_OK && st == CAI_OK) st = cai_error_status();
    cai_device_dealloc_staging(z->dev, tmp);
    cai_free(global);
    return st;
}

/* The masters of this rank's pieces from the registry's layout-invariant
 * init (stage 0 copies the model's own init). */
static cai_status init_masters(cai_zero_t *z) {
    const zl_layout *L = &z->L;
    if (L->stage == 0) {
        if (!z->cfg.offload) return CAI_OK;
        cai_tensor mp;
        cai_model_flat(z->model, &mp, NULL, NULL);
        /* Copies between the device and host staging go through the device's own table. */
        CAI_CALL(cai_device_copy(z->dev, z->M, mp.data, L->n_flat * sizeof(float), kind_of(z->hdev, z->dev)));
        return CAI_OK;
    }
    if (!z->alias) CAI_CALL(fill0(sdev(z), z->M, CAI_DTYPE_F32, L->shard)); /* aliased: W starts zeroed */
    return fill_masters(z, NULL, NULL);
}

cai_status cai_zero_load_params(cai_zero_t *z, cai_zero_param_source src, void *ctx) {
    CAI_CHECK_ARG(z && src, "cai_zero_load_params: NULL argument");
    CAI_CALL(fill_masters(z, src, ctx));
    CAI_CALL(publish(z, 0));
    return CAI_OK;
}

static cai_status alloc_storage(cai_zero_t *z) {
    const zl_layout *L = &z->L;
    int offload = z->cfg.offload;
    size_t S = L->shard, es = z->act_size;
    CAI_CALL(cai_device_alloc(z->dev, sizeof(double), "ZeRO norm accumulator", (void **)&z->acc));
    if (L->axis_max)
        CAI_CALL(dev_alloc(z, L->axis_max * sizeof(float), "ZeRO axis bucket", &z->mem_grads, (void **)&z->AX));
    /* stages 2/3 round each window into a bf16 window instead (the pool) */
    if (z->cfg.reduce_dtype == CAI_DTYPE_BF16 && L->stage < 2)
        CAI_CALL(dev_alloc(z, L->n_pad * sizeof(uint16_t), "ZeRO bf16 reduction copy", &z->mem_rb, (void **)&z->RB));
    if (z->cfg.reduce_fp8 && L->stage < 2) {
        /* zeroed once: the padding codes of short pieces are never written */
        const size_t n = zl_fp8_fixed_bytes(L);
        CAI_CALL(cai_calloc((void **)&z->fboff, (size_t)L->nb + 1, sizeof *z->fboff, "ZeRO fp8 exchange offsets"));
        CAI_CALL(dev_alloc(z, n, "ZeRO fp8 exchange blocks", &z->mem_rb, (void **)&z->FB));
        CAI_CALL(fill0(z->dev, z->FB, CAI_DTYPE_F32, n / sizeof(float)));
        for (int k = 0; k < L->nb; k++) z->fboff[k] = zl_fp8_fixed_offset(L, k);
    }
    if (offload) {
        size_t need = 3 * S * sizeof(float) + S * sizeof(float) + 64 * 8;
        if (L->stage >= 1) need += S * es;
        if (z->pdt != CAI_DTYPE_F32 && z->pdt != z->act) need += S * cai_dtype_size(z->pdt);
        /* Pinned on a GPU, so the shard copies run at full speed. */
        z->harena.name = "ZeRO offload arena";
        CAI_CALL(cai_device_alloc_staging(z->dev, need, z->harena.name, (void **)&z->harena.base));
        z->harena.capacity = need;
        z->mem_host = need;
    }
    if (L->stage == 0) {
        cai_tensor mp, mg;
        cai_model_flat(z->model, &mp, &mg, NULL);
        z->GS = mg.data;
        if (!offload) z->M = mp.data;
    } else {
        CAI_CALL(dev_alloc(z, (L->stage == 3 ? S : L->n_pad) * es, "ZeRO working weights", &z->mem_params, &z->W));
        CAI_CALL(fill0(z->dev, z->W, z->act, L->stage == 3 ? S : L->n_pad));
        if (L->stage == 1) {
            CAI_CALL(dev_alloc(z, L->n_pad * sizeof(float), "ZeRO gradients", &z->mem_grads, (void **)&z->G));
            CAI_CALL(fill0(z->dev, z->G, CAI_DTYPE_F32, L->n_pad));
        } else {
            CAI_CALL(dev_alloc(z, S * sizeof(float), "ZeRO gradient shard", &z->mem_grads, (void **)&z->GS));
            CAI_CALL(fill0(z->dev, z->GS, CAI_DTYPE_F32, S));
        }
    }
    if (z->alias && L->stage == 3) z->M = z->W;
    else if (offload || (L->stage >= 1 && !z->alias))
        CAI_CALL(state_alloc(z, S * sizeof(float), "ZeRO master weights", &z->mem_master, (void **)&z->M));
    if (z->cfg.reduce_only) return CAI_OK; /* the caller's optimizer holds the moments */
    CAI_CALL(state_alloc(z, S * sizeof(float), "AdamW first moment", &z->mem_optim, (void **)&z->Mm));
    CAI_CALL(state_alloc(z, S * sizeof(float), "AdamW second moment", &z->mem_optim, (void **)&z->Mv));
    CAI_CALL(fill0(sdev(z), z->Mm, CAI_DTYPE_F32, S));
    CAI_CALL(fill0(sdev(z), z->Mv, CAI_DTYPE_F32, S));
    if (offload) {
        CAI_CALL(state_alloc(z, S * sizeof(float), "ZeRO host gradient shard", &z->mem_staging, (void **)&z->GSh));
        if (L->stage >= 1) CAI_CALL(state_alloc(z, S * es, "ZeRO host weight shard", &z->mem_staging, &z->Wh));
    }
    if (L->stage >= 1 && z->pdt != CAI_DTYPE_F32 && z->pdt != z->act)
        CAI_CALL(state_alloc(z, S * cai_dtype_size(z->pdt), "ZeRO rounding scratch", &z->mem_staging, &z->LP));
    return CAI_OK;
}

static cai_status make_pieces(cai_zero_t *z) {
    CAI_CALL(cai_calloc((void **)&z->pieces, (size_t)z->L.nseg + 1, sizeof *z->pieces, "ZeRO pieces"));
    for (int s = 0; s < z->L.nseg; s++) {
        const zl_seg *g = &z->L.seg[s];
        z->pieces[s] = (cai_zero_piece){g->index, g->poff, g->soff, g->n, g->soff};
        if (z->alias && z->L.stage >= 1 && z->L.stage < 3) /* masters inside the working weights */
            z->pieces[s].master_offset = g->eoff;
    }
    int maxnp = 1;
    for (int u = 0; u < z->L.n_units; u++)
        if (z->L.unit_np[u] > maxnp) maxnp = z->L.unit_np[u];
    CAI_CALL(cai_calloc((void **)&z->hook_idx, (size_t)maxnp, sizeof *z->hook_idx, "ZeRO hook indices"));
    CAI_CALL(cai_calloc((void **)&z->spans, (size_t)z->L.nseg + 1, sizeof *z->spans, "ZeRO AdamW spans"));
    CAI_CALL(cai_calloc((void **)&z->hook_grads, (size_t)maxnp, sizeof *z->hook_grads, "ZeRO hook views"));
    return CAI_OK;
}

static cai_status build_layout(cai_zero_t *z) {
    cai_model_t *m = z->model;
    int nu = cai_model_unit_count(m), np = cai_registry_count(cai_model_registry(m));
    int **units = NULL, *cnt = NULL;
    cai_status st = CAI_OK;
    CAI_CALL(cai_calloc((void **)&units, (size_t)nu + 1, sizeof *units, "ZeRO units"));
    CAI_CALL_GOTO(cai_calloc((void **)&cnt, (size_t)nu + 1, sizeof *cnt, "ZeRO units"), st, done);
    for (int u = 0; u < nu; u++) {
        CAI_CALL_GOTO(cai_calloc((void **)&units[u], (size_t)np + 1, sizeof **units, "ZeRO unit"), st, done);
        cnt[u] = cai_model_unit_params(m, u, units[u], np);
    }
    int dp = z->comm.size, r = z->comm.rank;
    /* ep > 1: experts in buckets of their own over edp (ecomm); ep = 1 keeps one group */
    const int edp = cai_model_view(m)->ep_size > 1 ? z->ecomm.size : 0;
    CAI_CALL_GOTO(zl_build(&z->L, cai_model_registry(m), cai_model_view(m), cai_model_align_elems(m), nu, units, cnt,
                           z->cfg.stage, dp, r, edp, z->ecomm.rank,
                           z->cfg.bucket_bytes ? z->cfg.bucket_bytes : (size_t)25 << 20, cai_model_seq_parallel(m)),
                  st, done);
    if (z->L.stage == 0 && z->L.n_pad != z->L.n_flat)
        st = CAI_ERROR(CAI_ERR_INTERNAL, "ZeRO stage 0: engine layout (%zu) differs from the model's (%zu)", z->L.n_pad,
                       z->L.n_flat);
done:
    zl_units_free(nu, units, cnt);
    return st;
}

/* At ep > 1 the dp ranks hold different experts: expert buckets reduce and
 * shard over edp, which holds the replicas only when sp = 1. Stage 0 with
 * the engine's own optimizer would count each rank's experts in the norm as
 * if they were everyone's; the expert-parallel driver runs it instead.
 * Checked before anything is allocated. */
static cai_status check_experts(cai_mesh_t *mesh, cai_model_t *m, const cai_zero_config *cfg) {
    const cai_rank_view *v = cai_model_view(m);
    if (v->ep_size <= 1) return CAI_OK;
    if (v->ep_size != cai_mesh_size(mesh, CAI_AXIS_EP) || v->ep_rank != cai_mesh_rank(mesh, CAI_AXIS_EP))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "ZeRO: the model's ep %d/%d is not this rank's place on the mesh (ep rank %d of %d)",
                         v->ep_rank, v->ep_size, cai_mesh_rank(mesh, CAI_AXIS_EP), cai_mesh_size(mesh, CAI_AXIS_EP));
    if (cai_mesh_size(mesh, CAI_AXIS_SP) > 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "ZeRO at ep=%d shards experts over edp, which holds their replicas at sp=1 only; sp=%d",
                         v->ep_size, cai_mesh_size(mesh, CAI_AXIS_SP));
    if (cfg->stage == 0 && !cfg->reduce_only)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "ZeRO stage 0 at ep=%d runs reduce-only under the expert-parallel driver "
                         "(cai_moe_driver_create)%s; the engine steps experts at zero.stage=1, 2 or 3",
                         v->ep_size, cfg->offload ? ", without offload" : "");
    return CAI_OK;
}

cai_status cai_zero_create(cai_zero_t **out, cai_mesh_t *mesh, cai_model_t *m, const cai_zero_config *cfg) {
    CAI_CHECK_ARG(out && mesh && m && cfg, "cai_zero_create: NULL argument");
    *out = NULL;
    CAI_CALL(cai_zero_config_check(cfg));
    if ((cfg->stage >= 1) != (cai_model_external_params(m) != 0))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "ZeRO stage %d needs a model created with external_params=%d (it was "
                         "created with %d): set the model options with cai_zero_model_options",
                         cfg->stage, cfg->stage >= 1, cai_model_external_params(m));
    CAI_CALL(check_experts(mesh, m, cfg));
    cai_zero_t *z = NULL;
    CAI_CALL(cai_calloc((void **)&z, 1, sizeof *z, "ZeRO engine"));
    cai_status st = CAI_OK;
    z->cfg = *cfg;
    z->mesh = mesh;
    z->model = m;
    z->dev = cai_model_device(m);
    const cai_model_config *mc = cai_model_config_of(m);
    z->act = mc->act_dtype;
    z->pdt = mc->param_dtype;
    z->act_size = cai_dtype_size(z->act);
    z->alias = cfg->stage >= 1 && !cfg->offload && z->pdt == CAI_DTYPE_F32 && z->act == CAI_DTYPE_F32;
    /* Ranks sharing a sequence (ring attention, Ulysses) hold the same
     * parameters as dp replicas do: their gradients average over dp x sp. */
    const cai_axis ax = cai_mesh_size(mesh, CAI_AXIS_SP) > 1 ? CAI_AXIS_DP_SP : CAI_AXIS_DP;
    z->comm = (zc_ctx){.mesh = mesh,
                       .dev = z->dev,
                       .axis = ax,
                       .comm = cai_mesh_comm(mesh, ax),
                       .size = cai_mesh_size(mesh, ax),
                       .rank = cai_mesh_rank(mesh, ax),
                       .host = z->dev->kind == CAI_DEVICE_HOST,
                       .timeout_s = cfg->timeout_s};
    z->ecomm = z->comm;
    if (cai_model_view(m)->ep_size > 1) {
        z->ecomm.axis = CAI_AXIS_EDP;
        z->ecomm.comm = cai_mesh_comm(mesh, CAI_AXIS_EDP);
        z->ecomm.size = cai_mesh_size(mesh, CAI_AXIS_EDP);
        z->ecomm.rank = cai_mesh_rank(mesh, CAI_AXIS_EDP);
    }
    z->pool.dev = z->dev;
    /* Device collectives follow the compute stream through an event (see
     * cai_iallreduce): the engine issues them right after the kernels that
     * write their buffers, without synchronising the device. */
    if (z->dev->kind == CAI_DEVICE_CUDA) cai_mesh_set_cuda_stream(mesh, cai_device_stream(z->dev));
    if (cfg->offload) {
        if (z->dev->kind == CAI_DEVICE_HOST) {
            z->hdev = z->dev;
        } else {
            CAI_CALL_GOTO(cai_device_init(&z->hdev, CAI_DEVICE_HOST, 0, cfg->host_threads), st, fail);
            z->own_hdev = 1;
        }
    }
    CAI_CALL_GOTO(build_layout(z), st, fail);
    CAI_CALL_GOTO(check_axis_buckets(z), st, fail);
    CAI_CALL_GOTO(rt_alloc(z), st, fail);
    CAI_CALL_GOTO(make_pieces(z), st, fail);
    CAI_CALL_GOTO(alloc_storage(z), st, fail);
    CAI_CALL_GOTO(init_masters(z), st, fail);
    CAI_CALL_GOTO(alloc_windows(z), st, fail);
    if (z->L.stage == 1 || z->L.stage == 2)
        for (int i = 0; i < z->L.n_params; i++) {
            if (z->L.offsets[i] == SIZE_MAX) continue;
            CAI_CALL_GOTO(cai_model_bind_param(m, i, at(z->W, z->L.eoff[i], z->act_size),
                                               z->L.stage == 1 ? z->G + z->L.eoff[i] : NULL),
                          st, fail);
        }
    CAI_CALL_GOTO(publish(z, 0), st, fail);
    CAI_CALL_GOTO(cai_model_add_hook(m, hook, z), st, fail);
    z->hooked = 1;
    *out = z;
    return CAI_OK;
fail:
    cai_zero_free(z);
    return st;
}

void cai_zero_free(cai_zero_t *z) {
    if (!z) return;
    /* Only after a failed step is anything in flight; its buffers must
     * outlive it. (A failure here adds to the trace the caller reports.) */
    if (z->rt)
        for (int k = 0; k < z->L.nb; k++) {
            if (z->rt[k].greq.kind != ZC_NONE) (void)zc_wait(ctx_of(z, k), &z->rt[k].greq);
            if (z->rt[k].sreq.kind != ZC_NONE) (void)zc_wait(ctx_of(z, k), &z->rt[k].sreq);
            if (z->rt[k].preq.kind != ZC_NONE) (void)zc_wait(ctx_of(z, k), &z->rt[k].preq);
        }
    if (z->model) {
        if (z->hooked) (void)cai_model_remove_hook(z->model, hook, z);
        if (cai_model_external_params(z->model))
            for (int i = 0; i < z->L.n_params; i++)
                if (z->L.offsets && z->L.offsets[i] != SIZE_MAX) cai_model_bind_param(z->model, i, NULL, NULL);
    }
    zp_free(&z->pool);
    if (z->dev) {
        cai_device_dealloc(z->dev, z->W);
        cai_device_dealloc(z->dev, z->G);
        if (z->L.stage >= 2) cai_device_dealloc(z->dev, z->GS);
        if (!z->cfg.offload) {
            if (z->mem_master) cai_device_dealloc(z->dev, z->M); /* else the model's or W itself */
            cai_device_dealloc(z->dev, z->Mm);
            cai_device_dealloc(z->dev, z->Mv);
            cai_device_dealloc(z->dev, z->LP);
        }
        cai_device_dealloc(z->dev, z->acc);
        cai_device_dealloc(z->dev, z->RB);
        cai_device_dealloc(z->dev, z->FB);
        cai_device_dealloc(z->dev, z->AX);
    }
    cai_free(z->fboff);
    if (z->harena.base) cai_device_dealloc_staging(z->dev, z->harena.base);
    if (z->own_hdev) cai_device_free(z->hdev);
    zl_free(&z->L);
    cai_free(z->rt);
    cai_free(z->fifo);
    cai_free(z->pieces);
    cai_free(z->hook_idx);
    cai_free(z->spans);
    cai_free(z->hook_grads);
    cai_free(z);
}

/* ------------------------------------------------------------ the step */

cai_status cai_zero_forward_backward(cai_zero_t *z, const int32_t *tokens, const int32_t *targets, int n_micro,
                                     float grad_scale, double *loss) {
    CAI_CHECK_ARG(z && tokens && targets, "cai_zero_forward_backward: NULL argument");
    CAI_CHECK_ARG(n_micro >= 1, "cai_zero_forward_backward: n_micro=%d must be >= 1", n_micro);
    CAI_CHECK_ARG(isfinite(grad_scale) && grad_scale > 0, "cai_zero_forward_backward: grad_scale %g must be > 0",
                  (double)grad_scale);
    cai_model_t *m = z->model;
    int first = 0, last = 0, B = 0, T = 0;
    cai_model_stage(m, NULL, NULL, &first, &last);
    if (!first || !last)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "cai_zero_forward_backward runs whole models; this model is one "
                         "pipeline stage (the pipeline executor drives ZeRO per stage)");
    cai_model_shape(m, &B, &T);
    size_t per = (size_t)B * (size_t)T;
    const zl_layout *L = &z->L;
    if (L->stage == 0) CAI_CALL(cai_model_zero_grad(m));
    if (L->stage == 1) CAI_CALL(fill0(z->dev, z->G, CAI_DTYPE_F32, L->n_pad));
    const float w = grad_scale / ((float)n_micro * (float)z->comm.size);
    double sum = 0;
    z->in_step = 1;
    z->n_micro = n_micro;
    cai_status st = CAI_OK;
    for (int k = 0; k < n_micro; k++) {
        z->micro = k;
        float l = 0;
        CAI_CALL_GOTO(cai_model_forward_train(m, tokens + (size_t)k * per, targets + (size_t)k * per, w, &l), st, done);
        z->in_bwd = 1;
        z->bwd_last_started = 0;
        CAI_CALL_GOTO(cai_model_backward(m, w), st, done);
        CAI_CALL_GOTO(end_backward(z), st, done);
        sum += (double)l;
    }
    CAI_CALL_GOTO(reduce_axis_buckets(z), st, done);
    sum /= n_micro;
    if (z->comm.size > 1)
        CAI_CALL_GOTO(cai_allreduce(z->mesh, z->comm.axis, &sum, &sum, 1, CAI_DTYPE_F64, CAI_RED_AVG), st, done);
    if (loss) *loss = sum;
done:
    z->in_step = 0;
    z->in_bwd = 0;
    return st;
}

/* ------------------------------------------------------------ a driver of its own */

cai_status cai_zero_grads_begin(cai_zero_t *z, float *weight) {
    CAI_CHECK_ARG(z && weight, "cai_zero_grads_begin: NULL argument");
    if (z->L.stage >= 2)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "ZeRO stage %d reduces each microbatch's gradients as its backward ends, inside "
                         "cai_zero_forward_backward; a driver running the model itself composes with stages 0 and 1",
                         z->L.stage);
    if (z->L.stage == 0) CAI_CALL(cai_model_zero_grad(z->model));
    else CAI_CALL(fill0(z->dev, z->G, CAI_DTYPE_F32, z->L.n_pad));
    *weight = 1.0f / (float)z->comm.size;
    return CAI_OK;
}

cai_status cai_zero_grads_end(cai_zero_t *z) {
    CAI_CHECK_ARG(z, "cai_zero_grads_end: NULL engine");
    CAI_CHECK_ARG(z->L.stage <= 1 && !z->in_step, "cai_zero_grads_end: needs cai_zero_grads_begin (stage 0 or 1)");
    z->in_bwd = 0;
    z->micro = 0;
    z->n_micro = 1;
    for (int k = z->L.nb - 1; k >= 0; k--) CAI_CALL(start_reduction(z, k));
    for (int k = z->L.nb - 1; k >= 0; k--) CAI_CALL(wait_reduction(z, k));
    return reduce_axis_buckets(z);
}

cai_status cai_zero_param_grad(cai_zero_t *z, int index, cai_tensor *grad) {
    CAI_CHECK_ARG(z && grad, "cai_zero_param_grad: NULL argument");
    CAI_CHECK_ARG(z->L.stage <= 1, "cai_zero_param_grad: stage %d holds only a shard of the gradients", z->L.stage);
    CAI_CHECK_ARG(index >= 0 && index < cai_registry_count(cai_model_registry(z->model)) &&
                      z->L.offsets[index] != SIZE_MAX,
                  "cai_zero_param_grad: parameter %d is not held by this rank", index);
    const int bk = z->L.bucket_of[index];
    *grad = vec(z->dev, grads_of(z, bk), CAI_DTYPE_F32, z->L.eoff[index] - z->L.b[bk].elo, z->L.numel[index]);
    return CAI_OK;
}

cai_status cai_zero_grad_sumsq(cai_zero_t *z, double *sumsq) {
    CAI_CHECK_ARG(z && sumsq, "cai_zero_grad_sumsq: NULL argument");
    cai_device_t *dev = z->dev;
    cai_tensor acc = cai_tensor_1d(dev, z->acc, CAI_DTYPE_F64, 1);
    const double zero = 0.0;
    CAI_CALL(
        cai_device_copy(dev, z->acc, &zero, sizeof zero, dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_H2D));
    /* One reduction per run of adjacent counted segments of a bucket, not
     * one per parameter: GPT-2 124M has 148 parameters, and the launches,
     * not the bytes, are the cost on a GPU (~1 ms a step). */
    for (int s = 0; s < z->L.nseg;) {
        const zl_seg *g = &z->L.seg[s];
        if (!g->norm) {
            s++;
            continue;
        }
        size_t n = g->n;
        int e = s + 1;
        for (; e < z->L.nseg; e++) {
            const zl_seg *h = &z->L.seg[e];
            if (!h->norm || h->bucket != g->bucket || h->soff != g->soff + n) break;
            n += h->n;
        }
        cai_tensor t = vec(dev, reduced_of(z, g->bucket), CAI_DTYPE_F32, g->soff - z->L.b[g->bucket].soff, n);
        CAI_CALL(dev->ops->sumsq(dev, &acc, &t));
        s = e;
    }
    double v = 0;
    CAI_CALL(cai_device_copy(dev, &v, z->acc, sizeof v, dev->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H));
    /* Each element lives in one shard: the dp sum is the job's (stage 0
     * holds identical full gradients everywhere, so its local sum is). At
     * ep > 1 an expert's shards partition it over edp and the ep ranks hold
     * different experts, so the sum over dp = edp x ep counts it once too. */
    if (z->L.stage >= 1 && z->comm.size > 1)
        CAI_CALL(cai_allreduce(z->mesh, z->comm.axis, &v, &v, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    /* tp ranks hold disjoint shards (replicated parameters are counted on
     * their replica 0 only): the job's sum adds them up. */
    if (cai_model_view(z->model)->tp_size > 1)
        CAI_CALL(cai_allreduce(z->mesh, CAI_AXIS_TP, &v, &v, 1, CAI_DTYPE_F64, CAI_RED_SUM));
    *sumsq = v;
    return CAI_OK;
}

cai_status cai_zero_step(cai_zero_t *z, const cai_adamw_params *p_in) {
    CAI_CHECK_ARG(z && p_in, "cai_zero_step: NULL argument");
    CAI_CHECK_ARG(!z->cfg.reduce_only, "cai_zero_step: this engine is reduce-only; the caller's optimizer steps");
    CAI_CHECK_ARG(isfinite(p_in->grad_scale), "cai_zero_step: grad_scale %g is not finite", (double)p_in->grad_scale);
    cai_adamw_params p = *p_in;
    p.step = z->step + 1;
    const zl_layout *L = &z->L;
    cai_device_t *d = sdev(z);
    const int off = z->cfg.offload;
    if (off) {
        /* Pinned staging; one copy where the reduced shard is contiguous
         * (stage 0, 2, 3), a copy per bucket chunk for stage 1's. The D2H
         * copy waits for the kernels before it. */
        if (L->stage != 1)
            CAI_CALL(cai_device_copy(z->dev, z->GSh, reduced_of(z, 0) - L->b[0].soff, L->shard * sizeof(float),
                                     kind_of(z->hdev, z->dev)));
        else
            for (int k = 0; k < L->nb; k++)
                CAI_CALL(cai_device_copy(z->dev, z->GSh + L->b[k].soff, reduced_of(z, k), L->b[k].chunk * sizeof(float),
                                         kind_of(z->hdev, z->dev)));
    }
    /* Offload, stage >= 1: the host op writes the rounded working shard in
     * the same pass over memory (publish then only copies it up), when the
     * rounding is a single one (F32 -> act). */
    const int fused = off && L->stage >= 1 && !z->LP;
    if (off) {
        CAI_CALL(zero_host_adamw(d, L->seg, L->nseg, z->M, z->GSh, z->Mm, z->Mv, fused ? z->Wh : NULL, z->act, &p,
                                 z->spans));
    } else {
        int n = 0;
        for (int s = 0; s < L->nseg; s++) {
            const zl_seg *sg = &L->seg[s];
            if (!sg->update) continue;
            const size_t rel = sg->soff - L->b[sg->bucket].soff;
            z->spans[n++] = (cai_adamw_span){master_of(z, sg->bucket) + rel,
                                             reduced_of(z, sg->bucket) + rel,
                                             z->Mm + sg->soff,
                                             z->Mv + sg->soff,
                                             NULL,
                                             sg->n,
                                             sg->decay};
        }
        CAI_CALL(cai_adamw_spans(d, z->spans, n, CAI_DTYPE_F32, &p, 0));
    }
    z->step++;
    z->stats.steps++;
    CAI_CALL(publish(z, fused));
    return CAI_OK;
}

cai_status zero_host_adamw(cai_device_t *hd, const zl_seg *seg, int nseg, float *M, const float *G, float *Mm,
                           float *Mv, void *lowp, cai_dtype lowp_dtype, const cai_adamw_params *p,
                           cai_adamw_span *spans) {
    CAI_CHECK_ARG(hd && hd->kind == CAI_DEVICE_HOST, "ZeRO offload step: needs a host device");
    const size_t les = cai_dtype_size(lowp_dtype);
    int n = 0;
    for (int s = 0; s < nseg; s++) {
        if (!seg[s].update) continue;
        const size_t o = seg[s].soff;
        spans[n++] = (cai_adamw_span){M + o,    G + o,       Mm + o, Mv + o, lowp ? (char *)lowp + o * les : NULL,
                                      seg[s].n, seg[s].decay};
    }
    return cai_adamw_spans(hd, spans, n, lowp_dtype, p, 1);
}

void cai_zero_shard_state(cai_zero_t *z, cai_tensor *master, cai_tensor *m, cai_tensor *v) {
    cai_device_t *d = sdev(z);
    size_t nm = z->cfg.reduce_only ? 0 : z->L.shard; /* reduce-only: the moments are the caller's */
    /* Stage 1/2 f32 masters are this rank's chunks of the working weights. */
    const int inside = z->alias && z->L.stage >= 1 && z->L.stage < 3;
    if (master)
        *master = inside ? vec(d, z->W, CAI_DTYPE_F32, 0, z->L.n_pad) : vec(d, z->M, CAI_DTYPE_F32, 0, z->L.shard);
    if (m) *m = vec(d, z->Mm, CAI_DTYPE_F32, 0, nm);
    if (v) *v = vec(d, z->Mv, CAI_DTYPE_F32, 0, nm);
}

cai_status cai_zero_piece_views(cai_zero_t *z, int piece, cai_tensor *master, cai_tensor *m, cai_tensor *v) {
    CAI_CHECK_ARG(z && piece >= 0 && piece < z->L.nseg, "cai_zero_piece_views: piece %d of %d", piece,
                  z ? z->L.nseg : 0);
    const zl_seg *g = &z->L.seg[piece];
    cai_device_t *d = sdev(z);
    size_t rel = g->soff - z->L.b[g->bucket].soff, nm = z->cfg.reduce_only ? 0 : g->n;
    if (master) *master = vec(d, master_of(z, g->bucket) + rel, CAI_DTYPE_F32, 0, g->n);
    if (m) *m = vec(d, nm ? z->Mm + g->soff : NULL, CAI_DTYPE_F32, 0, nm);
    if (v) *v = vec(d, nm ? z->Mv + g->soff : NULL, CAI_DTYPE_F32, 0, nm);
    return CAI_OK;
}

cai_status cai_zero_gather_param(cai_zero_t *z, int index, float *out) {
    CAI_CHECK_ARG(z && out, "cai_zero_gather_param: NULL argument");
    const zl_layout *L = &z->L;
    CAI_CHECK_ARG(index >= 0 && index < L->n_params && L->offsets[index] != SIZE_MAX,
                  "cai_zero_gather_param: parameter %d is not held by this rank", index);
    const cai_param_info *info = cai_registry_param(cai_model_registry(z->model), index);
    if (info->tie_primary != index && L->offsets[info->tie_primary] != SIZE_MAX) index = info->tie_primary;
    size_t n = L->numel[index];
    cai_device_t *d = sdev(z);
    cai_copy_kind k = d->kind == CAI_DEVICE_HOST ? CAI_COPY_H2H : CAI_COPY_D2H;
    if (L->stage == 0) {
        CAI_CALL(cai_device_copy(d, out, z->M + L->offsets[index], n * sizeof(float), k));
        return CAI_OK;
    }
    memset(out, 0, n * sizeof(float));
    for (int s = 0; s < L->nseg; s++) {
        const zl_seg *g = &L->seg[s];
        if (g->index == index)
            CAI_CALL(cai_device_copy(d, out + g->poff, master_of(z, g->bucket) + (g->soff - L->b[g->bucket].soff),
                                     g->n * sizeof(float), k));
    }
    /* Exactly one rank of the parameter's group contributes each element
     * (the others add zeros). */
    const zc_ctx *c = ctx_of(z, L->bucket_of[index]);
    if (c->size > 1) CAI_CALL(cai_allreduce(z->mesh, c->axis, out, out, n, CAI_DTYPE_F32, CAI_RED_SUM));
    return CAI_OK;
}

void cai_zero_memory(const cai_zero_t *z, cai_mem_plan *out) {
    memset(out, 0, sizeof *out);
    size_t mp = 0, ma = 0;
    cai_model_memory(z->model, &mp, &ma);
    out->stage = z->L.stage;
    out->offload = z->cfg.offload;
    out->dp = z->comm.size;
    out->n_flat = z->L.n_pad;
    out->acts = ma;
    if (z->L.stage == 0) {
        /* The model's buffers: F32 masters and gradients plus working
         * copies; with offload the device masters are only a working copy. */
        size_t n4 = z->L.n_flat * sizeof(float);
        out->grads = n4 + z->mem_rb + z->mem_grads; /* the engine's own: the axis bucket */
        out->params = mp - 2 * n4 + (z->cfg.offload ? n4 : 0);
        out->master = z->cfg.offload ? 0 : n4;
    } else {
        out->params = z->mem_params;
        out->grads = z->mem_grads + z->mem_rb;
    }
    out->master += z->mem_master;
    out->optim = z->mem_optim;
    out->staging = z->mem_staging;
    out->windows = z->pool.total;
    out->host = z->cfg.offload ? z->mem_master + z->mem_optim + z->mem_staging : 0;
    out->device =
        out->params + out->grads + out->master + out->optim + out->staging + out->windows + out->acts - out->host;
}
