/* ZeRO internals shared by the engine (zero.c), its collectives
 * (zero_comm.c), the layout (zero_layout.c) and the memory planner
 * (planner.c), which replays the engine's window schedule without memory. */
#ifndef COLOSSAL_ZERO_INTERNAL_H
#define COLOSSAL_ZERO_INTERNAL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "colossal/parallel.h"

/* buckets one unit reads: its own (at ep > 1 up to three, dense, experts,
 * shared experts), plus a tied embedding's */
#define ZL_MAX_UNIT_BUCKETS 6
#define ZERO_MAX_INFLIGHT 1 /* stage 2/3 gradient reductions left in flight while the next unit runs */

/* Shard groups: the ranks a bucket is reduced and sharded over. Dense
 * parameters are replicated on every dp rank; at ep > 1 an expert is
 * replicated only on its edp group (the dp ranks with the same ep rank), so
 * experts form buckets of their own, sharded over edp. */
enum { ZL_GRP_DP = 0, ZL_GRP_EDP = 1, ZL_NGRP = 2 };

/* A bucket: whole units' parameters (at ep > 1 the dense or the expert
 * parameters of a run of units), a contiguous range of the model's flat
 * layout, padded so every rank of its group owns one chunk of it. */
typedef struct {
    size_t lo, hi;        /* model flat range [lo, hi) */
    size_t elo;           /* start in the engine's padded layout */
    size_t len;           /* padded length, a multiple of nshard * align */
    size_t chunk;         /* len / nshard */
    size_t soff;          /* this rank's chunk in the shard buffers */
    int unit_lo, unit_hi; /* home units it holds: gradients final after unit_lo's backward */
    int grp;              /* ZL_GRP_*: the ranks it is reduced and sharded over */
    int nshard, srank;    /* its group's size and this rank's place in it (1 and 0 at stage 0) */
    int ngroup;           /* its group's size at every stage (stage 0 reduces over it without sharding) */
} zl_bucket;

/* A run of one parameter inside this rank's shard, with what the optimizer
 * needs to know about it. */
typedef struct {
    int index;
    int bucket;
    size_t poff; /* offset inside the parameter's local elements */
    size_t soff; /* offset in the shard buffers */
    size_t eoff; /* offset in the engine layout */
    size_t n;
    int decay;     /* registry weight-decay flag */
    int update;    /* 0: a tie copy whose primary is held here (it is never read) */
    int norm;      /* counts toward the global gradient norm */
    unsigned axes; /* axes besides dp its gradient is summed over (cai_registry_grad_axes) */
} zl_seg;

typedef struct {
    int n_params;
    size_t *offsets; /* model flat layout, SIZE_MAX when not held */
    size_t *numel;   /* local elements, 0 when not held */
    size_t *eoff;    /* engine layout, SIZE_MAX when not held */
    int *home;       /* unit whose backward finishes the gradient, -1 when not held */
    int *bucket_of;  /* -1 when not held */
    int n_units;
    int *unit_np; /* parameters each unit reads */
    int **unit_params;
    int *unit_nb; /* buckets each unit reads */
    int (*unit_buckets)[ZL_MAX_UNIT_BUCKETS];
    zl_bucket *b;
    int nb;
    zl_seg *seg;
    int nseg;
    size_t n_flat; /* model flat elements */
    size_t n_pad;  /* engine layout elements (sum of bucket lengths) */
    size_t shard;  /* this rank's shard elements (sum of chunks) */
    size_t align;
    int nshard, srank, stage; /* the dense group's (ZL_GRP_DP) */
    int gshard[ZL_NGRP], grank[ZL_NGRP];
    int gsize[ZL_NGRP]; /* the groups' sizes, also at stage 0 */
    int grouped;        /* experts in buckets of their own (ZL_GRP_EDP) */
    size_t max_param_numel;
    size_t axis_n[CAI_AXIS_COUNT]; /* shard elements whose gradients each axis sums (the axis buckets) */
    size_t axis_max;               /* the largest of them: the engine's packing buffer */
} zl_layout;

/* units[u] lists the registry indices unit u reads (registration order);
 * seq_parallel: the model's (it decides which gradients tp sums). edp >= 1
 * groups the experts apart: edp is the expert-data-parallel group's size
 * and edp_rank this rank's place in it, and stages >= 1 shard expert
 * buckets over it; edp 0 keeps one group. */
cai_status zl_build(zl_layout *L, const cai_registry_t *reg, const cai_rank_view *view, size_t align, int n_units,
                    int *const *units, const int *unit_np, int stage, int dp, int dp_rank, int edp, int edp_rank,
                    size_t bucket_bytes, int seq_parallel);
void zl_free(zl_layout *L);

/* zero.reduce_dtype=fp8: bucket k crosses as zl_fp8_rows pieces of
 * zl_fp8_chunk codes, one piece per rank of its group, each with a scaling
 * meta of ZL_FP8_STRIDE floats. Stages >= 1 send the shard chunks; stage 0
 * (nothing sharded) cuts the bucket's model range into ngroup pieces of a
 * multiple of 16 codes, the last ones short or empty (zl_fp8_piece). The
 * exchange block holds the codes sent and received, then the metas sent
 * and received; stage 0 adds the all-gather of the summed pieces (codes,
 * metas) and the f32 sum of this rank's piece. Stages 0/1 keep one block a
 * bucket for the job (zl_fp8_fixed_bytes), stages 2/3 take them from the
 * window pool. */
#define ZL_FP8_STRIDE CAI_FP8_META_STRIDE(1)
size_t zl_fp8_chunk(const zl_layout *L, int k);
int zl_fp8_rows(const zl_layout *L, int k);
size_t zl_fp8_piece(const zl_layout *L, int k, int d); /* elements of piece d */
size_t zl_fp8_block_bytes(const zl_layout *L, int k);
size_t zl_fp8_fixed_bytes(const zl_layout *L);
size_t zl_fp8_fixed_offset(const zl_layout *L, int k); /* bucket k's block in them */
/* The units a model with this view would report (cai_model_unit_params),
 * derived from the registry alone, for planning before a model exists.
 * *units_out / *np_out are allocated (free with zl_units_free). */
cai_status zl_units_from_registry(const cai_registry_t *reg, const cai_rank_view *view, int *n_units, int ***units_out,
                                  int **np_out);
void zl_units_free(int n_units, int **units, int *np);

/* An exact-size block cache for windows: blocks are never returned to the
 * device until the pool is freed, so its total is the window high-water
 * mark, and a dry pool (no memory) reproduces it for the planner. */
typedef struct {
    size_t bytes;
    void *ptr;
    int used;
} zp_block;

typedef struct {
    zp_block *blk;
    int n, cap;
    size_t total;
    cai_device_t *dev; /* NULL: dry */
} zpool;

cai_status zp_get(zpool *p, size_t bytes, int *handle);
void zp_put(zpool *p, int handle);
void *zp_ptr(const zpool *p, int handle);
void zp_free(zpool *p);

/* ---- collectives of the engine (zero_comm.c) */

/* One in-flight engine collective: a cai_request (all-reduce, reduce-scatter
 * or all-gather, host or device buffers), an operation that failed while
 * zc_progress tested it (its error is reported by zc_wait), or nothing. */
typedef struct {
    int kind; /* ZC_NONE, ZC_CAI, ZC_FAILED */
    cai_request_t *creq;
    cai_status err; /* ZC_FAILED: what the test returned */
    char msg[256];  /* ZC_FAILED: its message (the trace is not kept that long) */
    const char *what;
    int bucket;
} zc_req;

enum { ZC_NONE = 0, ZC_CAI, ZC_FAILED };

typedef struct {
    cai_mesh_t *mesh;
    cai_device_t *dev; /* where the buffers live */
    cai_axis axis;     /* dp, or dp x sp when the mesh has sp > 1: the replicas of the parameters */
    MPI_Comm comm;     /* that axis (the collectives go through the mesh) */
    int size, rank;
    int host;         /* buffers are host memory (zc_progress has work to do) */
    double timeout_s; /* each wait's deadline (cai_wait_timeout) */
    double bytes;     /* sent, algorithm bytes */
} zc_ctx;

/* Block i of send (count elements of dt) to rank i, into recv (not in place). */
cai_status zc_all_to_all(zc_ctx *c, const void *send, void *recv, cai_dtype dt, size_t count, int bucket, zc_req *r);
/* Sum `count` elements (F32 or BF16) of buf over dp, in place. */
cai_status zc_allreduce_sum(zc_ctx *c, void *buf, cai_dtype dt, size_t count, int bucket, zc_req *r);
/* send holds size * chunk elements of dt; rank r's reduced block lands in recv (chunk). */
cai_status zc_reduce_scatter_sum(zc_ctx *c, const void *send, void *recv, cai_dtype dt, size_t chunk, int bucket,
                                 zc_req *r);
/* buf holds size * chunk elements of dtype; this rank's block is already in place. */
cai_status zc_all_gather(zc_ctx *c, void *buf, size_t chunk, cai_dtype dtype, int bucket, zc_req *r);
cai_status zc_wait(zc_ctx *c, zc_req *r);
/* Lets MPI move in-flight host operations along (no async progress thread);
 * completes those that are done (cai_test). */
void zc_progress(zc_ctx *c, zc_req *reqs, int n);

/* ---- the offload step on the host (zero.c) */

/* AdamW over this rank's shard on a host device: every segment with
 * `update` set, masters M, gradients G and moments Mm, Mv all indexed by
 * the segment's soff. With lowp, the updated masters rounded to lowp_dtype
 * land in lowp (same indexing) in the same pass. cai_adamw_spans over them,
 * split among the host's threads in one parallel region; spans holds nseg
 * entries (the caller's, so the step allocates nothing). Results are
 * bit-identical to one op call per segment. */
cai_status zero_host_adamw(cai_device_t *hd, const zl_seg *seg, int nseg, float *M, const float *G, float *Mm,
                           float *Mv, void *lowp, cai_dtype lowp_dtype, const cai_adamw_params *p,
                           cai_adamw_span *spans);

/* ---- the planner's replay of the window schedule (zero.c) */

/* Peak bytes the engine's window pool reaches over one microbatch's forward
 * and backward (stage 2: gradient windows; stage 3: weight and gradient
 * windows), for working weights of `act_size` bytes, with the engine's
 * config (prefetch, overlap, the reduction's dtype; without overlap every
 * gradient window lives until the end of backward). */
cai_status zero_window_peak(const zl_layout *L, size_t act_size, const cai_zero_config *cfg, size_t *peak);

#endif
