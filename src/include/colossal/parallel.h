/* Parallelism over the mesh axes, on top of the model's flat buffers.
 *
 * Data parallelism (src/parallel/dp.c): every dp rank holds a full replica
 * of its (pp, tp) shard of the parameters, runs its own slice of the global
 * batch and averages the gradients over the dp axis before the optimizer
 * step, so every replica takes the same update and stays bitwise equal to
 * the others. This is the plain form (one all-reduce of the whole flat
 * gradient buffer after the last microbatch); bucketing that overlaps the
 * backward and ZeRO sharding build on the same flat layout. */
#ifndef COLOSSAL_PARALLEL_H
#define COLOSSAL_PARALLEL_H

#include "colossal/base.h"
#include "colossal/cluster.h"
#include "colossal/model.h"
#include "colossal/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Replace every local gradient of `m` by its mean over the dp axis (in
 * place, the whole flat F32 buffer in one all-reduce; host or device
 * memory). Call it once per step, after the last microbatch's backward:
 * with microbatch gradients already weighted 1/n_micro the result is the
 * gradient of the global-batch mean loss when every rank's microbatches hold
 * the same number of target tokens. dp = 1 returns at once. Collective over
 * CAI_AXIS_DP. */
cai_status cai_dp_allreduce_grads(cai_mesh_t *mesh, cai_model_t *m);

/* Check that every dp replica holds bitwise the same F32 master weights:
 * a 64-bit hash per held parameter, compared by MIN/MAX all-reduces. On a
 * difference every rank returns CAI_ERR_INTERNAL naming the first parameter
 * that differs (in registration order) and how many parameters differ.
 * Cost: one pass over the parameters plus two all-reduces of one integer per
 * parameter. Collective over CAI_AXIS_DP. */
cai_status cai_dp_check_replicas(cai_mesh_t *mesh, cai_model_t *m);

/* ======================================================================
 * ZeRO / buckets / loss scaling / planner
 * (src/parallel/zero*.c, src/parallel/planner.c; docs/parallel.md)
 *
 * One engine runs data parallelism at every ZeRO stage over the flat local
 * layout the registry defines (cai_registry_local_layout): the parameters
 * are grouped, in registration order, into gradient buckets of whole model
 * units (embedding, blocks, head); each bucket is padded to a multiple of
 * dp so rank r owns the r-th chunk of every bucket, and a rank's shard is
 * the concatenation of its chunks. Backward runs units in reverse, so
 * buckets fill from the end; a model hook (cai_model_add_hook) starts each
 * bucket's non-blocking reduction as soon as the last unit touching it has
 * finished its backward.
 *
 *   stage 0  replicated weights, F32 masters and AdamW moments; buckets
 *            all-reduced (summed; the 1/dp is folded into the loss weight)
 *            during the last microbatch's backward only.
 *   stage 1  masters and moments sharded; full gradients accumulate
 *            locally and are reduce-scattered during the last microbatch;
 *            each rank steps its shard; the working weights are
 *            all-gathered after the step.
 *   stage 2  as 1, but only the shard of the reduced gradients is kept:
 *            each bucket's gradients live in a window from its first
 *            backward touch to its reduce-scatter, every microbatch
 *            (holding unreduced gradients across microbatches is what
 *            stage 2 exists to avoid).
 *   stage 3  as 2, and the working weights are sharded too: each unit's
 *            buckets are all-gathered into windows before its forward and
 *            again before its backward (the next unit's prefetched), and
 *            released after; buckets are single units.
 *   axis buckets  gradients partial over another axis as well (norm
 *            weights under sequence parallelism: tp, cai_registry_grad_axes)
 *            are packed and summed over it once per step, after the dp
 *            reductions, on the shard each rank holds.
 *   offload  masters, moments and the AdamW step live on the host (a host
 *            arena and the host backend's vectorised OpenMP AdamW); only
 *            reduced gradient shards go down and updated weights come up.
 *   experts  at ep > 1 (the model's view) the dp ranks hold different
 *            experts: expert parameters (spec.n_experts > 0) form buckets
 *            of their own, reduced and sharded over edp (CAI_AXIS_EDP, the
 *            dp ranks holding the same experts), the dense ones over dp.
 *            Their gradients take the same 1/dp weight, so the edp sum is
 *            the dp mean (an expert's owner already saw every ep rank's
 *            tokens). Stages 1-3, with or without offload; stage 0 at
 *            ep > 1 is reduce-only (cai_moe_driver_create steps); sp = 1.
 *
 * Stages >= 1 need the model created with external parameter storage
 * (cai_zero_model_options): the engine owns working weights and gradients
 * and binds them to the model. Losses and parameters match the single-rank
 * run up to summation order (tests/mpi/test_equiv.c).
 * ====================================================================== */

#include "colossal/ops.h"

typedef struct {
    int stage;              /* 0..3 (see above) */
    int offload;            /* 1: masters, moments and the step on the host */
    size_t bucket_bytes;    /* F32 gradient bytes per bucket (whole units, at least one); 0: 25 MiB */
    int overlap;            /* 1 (default): reduce each bucket as its backward finishes; 0: after backward */
    int prefetch;           /* stage 3: gather the next unit while this one runs (default 1) */
    double timeout_s;       /* a dp collective of the engine stalled this long fails naming the bucket; default 300 */
    int host_threads;       /* offload on a GPU: threads of the host step; 0: the OpenMP default */
    int reduce_only;        /* stage 0 without offload: buckets only, no optimizer state; the caller steps
                             * the model's own buffers with a cai_optim_t (cai_zero_driver's `o`, colossal/optim.h),
                             * whose state checkpoints read as without the engine */
    cai_dtype reduce_dtype; /* dtype the gradient reductions move and sum in: CAI_DTYPE_F32 (default,
                             * the zero value) or CAI_DTYPE_BF16 (half the bytes; stages 0/1 round each
                             * bucket's accumulated gradient once, stages 2/3 each microbatch's window,
                             * then widen into f32 and, over microbatches, add in f32) */
    int reduce_fp8;         /* 1 (reduce_dtype F32): the gradient reductions cross the wire as E5M2
                             * codes, every destination chunk scaled from its own amax; the owner decodes
                             * the chunks all ranks sent and sums them in f32 in rank order (a quarter of
                             * f32's bytes; an overflow anywhere reaches the sum as NaN). Stage 0 then
                             * encodes each rank's sum again and all-gathers it, every rank decoding
                             * every piece, so replicas stay bitwise equal */
} cai_zero_config;

/* Stage 0, no offload, 25 MiB buckets, overlap and prefetch on. Pure. */
void cai_zero_config_init(cai_zero_config *c);
/* Errors name the field and what would fit. Pure. */
cai_status cai_zero_config_check(const cai_zero_config *c);
/* What the model must be created with for this config: stages >= 1 set
 * external_params (the engine owns parameter storage). Pure. */
void cai_zero_model_options(const cai_zero_config *c, cai_model_options *mo);

typedef struct cai_zero cai_zero_t;

/* "dp" below means the replicas of the parameters: CAI_AXIS_DP, or
 * CAI_AXIS_DP_SP when the mesh has sp > 1 (the ranks sharing a sequence
 * under ring attention or Ulysses hold the same parameters; their
 * gradients, losses and shards go over dp x sp).
 *
 * Collective over CAI_AXIS_DP. Builds buckets and shards from the model's
 * registry layout, allocates the shards (offloaded state in a host arena),
 * initialises the F32 masters to the model's layout-invariant init (the
 * single-rank values), makes the working weights and installs the model
 * hook. The model must outlive the engine; one engine per model. */
cai_status cai_zero_create(cai_zero_t **out, cai_mesh_t *mesh, cai_model_t *m, const cai_zero_config *cfg);
/* Waits for anything in flight and removes the hook. Not collective (but
 * call it on every rank: in-flight collectives need their peers). */
void cai_zero_free(cai_zero_t *z);

const cai_zero_config *cai_zero_get_config(const cai_zero_t *z);
cai_model_t *cai_zero_model(const cai_zero_t *z);
/* Stages 1 and 2 keep every working weight whole on each rank, in the act
 * dtype and the engine's layout: a new weights object that reads them in
 * place (cai_weights_bind_compute; the caller frees it), so an inference
 * engine samples from the model being trained (RL rollouts) and sees each
 * step's refresh without a copy. Stage 0's working weights are the model's
 * own (cai_model_weights); stage 3 keeps only a shard: both refused,
 * naming the alternative. Not collective. */
cai_status cai_zero_working_weights(cai_zero_t *z, cai_weights_t **out);

/* Forward and backward of n_micro microbatches (tokens, targets: host
 * [n_micro, B, T]), each weighted grad_scale / (n_micro * dp) so that the
 * summed reduction is the global-batch mean times grad_scale (the loss
 * scale). Gradients are zeroed first and reduced as buckets complete.
 * *loss (may be NULL): mean of the microbatch losses over every dp rank.
 * Collective over CAI_AXIS_DP. */
cai_status cai_zero_forward_backward(cai_zero_t *z, const int32_t *tokens, const int32_t *targets, int n_micro,
                                     float grad_scale, double *loss);
/* For a driver that runs the model itself (the pipeline executor), stages 0
 * and 1: cai_zero_grads_begin zeroes the gradients and gives the weight
 * (1/dp) the loss gradient takes so the reduced sum is the replicas' mean;
 * after every backward of the step, cai_zero_grads_end reduces them as
 * cai_zero_forward_backward would (all-reduce, or reduce-scatter into the
 * shards, then the tp-partial ones over tp). Collective over CAI_AXIS_DP
 * (and CAI_AXIS_TP). cai_zero_param_grad: parameter `index`'s F32 gradient
 * on this rank, the whole local tensor, before cai_zero_grads_end (for
 * sums between stages, e.g. tied embeddings). */
cai_status cai_zero_grads_begin(cai_zero_t *z, float *weight);
cai_status cai_zero_grads_end(cai_zero_t *z);
cai_status cai_zero_param_grad(cai_zero_t *z, int index, cai_tensor *grad);
/* Sum of squares of the reduced gradients, each parameter element counted
 * once in the job (tie copies at their primary, tp replicas at replica 0):
 * the same value on every dp and tp rank; not finite when any rank's
 * gradients held inf/NaN. Collective over CAI_AXIS_DP and, with tp > 1,
 * CAI_AXIS_TP. */
cai_status cai_zero_grad_sumsq(cai_zero_t *z, double *sumsq);
/* One AdamW update of this rank's shard with `p` (p->step is set from the
 * engine's count + 1; p->grad_scale multiplies the reduced gradients: clip
 * coefficient / loss scale), tie copies held with their primary skipped,
 * then the working weights refreshed (stage 0: the model's copies, 1/2:
 * all-gathered, 3: the shard). Collective over CAI_AXIS_DP. */
cai_status cai_zero_step(cai_zero_t *z, const cai_adamw_params *p);
/* Updates applied so far (checkpoints set it when resuming). Not collective. */
int64_t cai_zero_step_count(const cai_zero_t *z);
void cai_zero_set_step_count(cai_zero_t *z, int64_t step);

/* A contiguous run of one parameter inside this rank's shard: local
 * elements [param_offset, param_offset + count) of parameter `index` (its
 * TP/PP shard in row-major order, as the registry shapes it) sit at
 * [shard_offset, shard_offset + count) of the shard buffers. Derived from
 * the registry layout, never computed by hand. */
typedef struct {
    int index;
    size_t param_offset, shard_offset, count;
    size_t master_offset; /* of its masters in cai_zero_shard_state's `master` (== shard_offset except
                           * for f32 stages 1/2 without offload: see there) */
} cai_zero_piece;
/* The pieces of this rank's shard in shard order (stage 0: every held
 * parameter, whole). Valid for the engine's lifetime. Not collective. */
const cai_zero_piece *cai_zero_pieces(const cai_zero_t *z, int *count);
/* F32 shard buffers (device memory, or host memory with offload): master
 * weights and AdamW moments, pieces at shard_offset (moments) and
 * master_offset (masters). Writable: after writing (loading a checkpoint)
 * call cai_zero_state_loaded. With f32 weights and no offload the masters
 * of stages 1/2 are this rank's chunks of the working weights (no copy):
 * `master` is then the whole working-weight buffer in the engine layout
 * and master_offset points into it. Not collective. */
void cai_zero_shard_state(cai_zero_t *z, cai_tensor *master, cai_tensor *m, cai_tensor *v);
/* Views of piece `piece` (cai_zero_pieces order): its masters and moments
 * (count elements each). Not collective. */
cai_status cai_zero_piece_views(cai_zero_t *z, int piece, cai_tensor *master, cai_tensor *m, cai_tensor *v);
/* Re-derive every working weight from the masters. Collective over DP. */
cai_status cai_zero_state_loaded(cai_zero_t *z);
/* The global value of a parameter (param->numel floats, host memory,
 * row-major in its registered global shape) from weights held elsewhere:
 * an import, a checkpoint. dst NULL: the caller holds none of it and only
 * takes part (a source reading collectively stays in step). */
typedef cai_status (*cai_zero_param_source)(void *ctx, const cai_param_info *param, float *dst);
/* Every master of this rank's shard (stage 0: the model's weights, or
 * their host copy with offload) from `src` instead of the registry's
 * initialisation, then the working weights re-derived as after a
 * checkpoint load; the moments and step count are left as they are. src is
 * called once for every registered parameter, in registry order, on every
 * rank. Collective over CAI_AXIS_DP (and whatever src's reads are). */
cai_status cai_zero_load_params(cai_zero_t *z, cai_zero_param_source src, void *ctx);
/* The F32 master value of parameter `index`'s whole local tensor (TP/PP
 * shard, row-major) into host memory `out` (local_numel floats), assembled
 * from the dp shards; a tie copy held with its primary reads the primary.
 * Collective over CAI_AXIS_DP. */
cai_status cai_zero_gather_param(cai_zero_t *z, int index, float *out);

/* Hook for tests and diagnostics: called after unit `unit`'s backward, with
 * the F32 gradient views of its parameters (the same views the model
 * accumulated into), before any of them is reduced. Not collective. */
typedef cai_status (*cai_zero_grad_hook)(void *ctx, cai_zero_t *z, int unit, const int *indices, cai_tensor *grads,
                                         int n);
void cai_zero_set_grad_hook(cai_zero_t *z, cai_zero_grad_hook fn, void *ctx);

/* Counters since cai_zero_create (or the last reset). */
typedef struct {
    int n_buckets, n_units;
    int64_t reductions;        /* bucket all-reduces / reduce-scatters started */
    int64_t reductions_in_bwd; /* ... of those, started before the backward returned (overlap) */
    int64_t reductions_early;  /* ... started before the microbatch's last unit began its backward */
    int64_t gathers;           /* stage 3 unit gathers (including prefetches) */
    int64_t prefetch_hits;     /* gathers that were already in flight or done when the unit needed them */
    int64_t steps, skipped;
    double comm_bytes; /* bytes this rank sent into engine collectives (algorithm bytes) */
} cai_zero_stats;
void cai_zero_get_stats(const cai_zero_t *z, cai_zero_stats *out);
void cai_zero_reset_stats(cai_zero_t *z);

/* ---- memory planner (src/parallel/planner.c) */

/* Per-rank bytes of one layout and precision, before anything is
 * allocated. `device` is what lives in device memory, `host` what offload
 * moves to host memory (on a host device both are the same RAM). */
typedef struct {
    size_t params;         /* working weights the layers read (stage 3: shard + gathered windows) */
    size_t grads;          /* gradient buffers (stage 2/3: shard + bucket windows; + the bf16 reduction copy) */
    size_t master;         /* F32 master weights */
    size_t optim;          /* AdamW moments */
    size_t staging;        /* offload: host copies of gradient / weight shards; lowp rounding scratch */
    size_t acts;           /* activations as configured */
    size_t acts_full;      /* activations without recompute */
    size_t acts_recompute; /* activations with recompute */
    size_t windows;        /* of params + grads: peak bytes of stage 2/3 gather / gradient windows */
    size_t pipe;           /* pipeline executor: stage boundary activations and their gradients */
    size_t fp8;            /* FP8 training: cast buffers, weight codes, scaling states (cai_model_fp8_bytes) */
    size_t frozen;         /* frozen models beside the trained one (cai_mem_plan_request.frozen_models) */
    size_t frozen_weights; /* of frozen: their weights (the rest is their activations) */
    size_t rollout;        /* an inference engine's KV pool (cai_mem_plan_request.rollout_bytes) */
    int frozen_on_host;    /* frozen and rollout take turns in device memory; frozen_weights wait in host memory */
    size_t frozen_load;    /* device peak while the frozen models load, before the trained model exists: the
                            * last one's whole storage (F32 masters too) and activations beside the kept
                            * copies of those before it; device is at least this */
    size_t device, host;   /* totals */
    size_t n_flat;         /* local flat elements (padded for sharding) */
    int stage, offload, dp;
} cai_mem_plan;

typedef struct {
    cai_model_config model; /* resolved inside */
    int batch, seq_len;     /* microbatch shape */
    cai_rank_view view;     /* tp shards the layers; pp picks the stage */
    int seq_parallel;       /* split-gather sequence parallelism over tp (cai_model_options) */
    size_t align_elems;     /* 0: 16, as the model */
    int dp;
    cai_zero_config zero;
    const cai_device_t *dev;   /* the backend decides attention workspace sizes */
    int pp_inflight;           /* activation sets a pipeline rank keeps (its schedule's peak in-flight
                                * chunk forwards, cai_pp_stats / cai_pp_schedule_peak_inflight); 0 means 1 */
    int pp_microbatches;       /* view.pp_size > 1: microbatches a step, for the executor's boundary
                                * buffers (one set per microbatch and chunk); 0: not counted */
    int pp_shared;             /* 1: the executor's boundaries go through node-shared memory
                                * (cai_pipeline_boundaries_shared), which holds only the received
                                * buffers; 0: MPI messages or the device's point-to-point */
    int pp_split;              /* 1: the model keeps a split backward's output gradients in each
                                * activation set (cai_model_options.split_backward; zb-h1) */
    size_t seq_attn_bytes;     /* a sequence sharded over sp: the ring / Ulysses attention workspace
                                * (cai_sp_attention_init; *_workspace_bytes), counted with the
                                * activations; seq_len is then the rank's T/sp; 0: none */
    size_t lora_flat;          /* LoRA (colossal/lora.h): the adapters' flat F32 elements, the only trainable
                                * ones (the base is frozen: no gradients, no optimizer state; stage 0 only);
                                * 0: full training */
    const cai_fp8_config *fp8; /* FP8 linears (colossal/fp8.h); NULL or not enabled: none */
    int frozen_models;         /* frozen models of the same config, shape and view on this rank beside
                                * the trained one (an RL reference, a reward model): each its F32
                                * masters, working copies and activations, as cai_model_memory counts */
    size_t rollout_bytes;      /* an inference engine's KV pool on the same device (RL rollouts) */
    int zero_max_stage;        /* > 0: the highest ZeRO stage the caller runs (colossal-rlhf's rollouts
                                * read whole working weights: 2), so a refusal offers none above it;
                                * 0: every stage */
    int frozen_on_host;        /* 1: the frozen models' weights wait in host memory except while they
                                * score (cai_model_offload) and the KV pool exists only during rollouts
                                * (cai_engine_suspend): device memory holds the larger of the two, not
                                * both, and host memory the weights' copy */
} cai_mem_plan_request;

/* Pure arithmetic over the registry and the layer buffer sizes (allocates
 * only bookkeeping). Not collective. */
cai_status cai_mem_plan_compute(const cai_mem_plan_request *req, cai_mem_plan *out);
/* Rows: what, where, MiB. */
void cai_mem_plan_print(const cai_mem_plan *p, FILE *out);
/* CAI_ERR_NOMEM when the plan exceeds the limits (bytes; 0 = unlimited):
 * on a host device device + host is checked against device_limit; on a GPU
 * each side against its own. The message gives the plan, the limit and the
 * changes that would fit (ZeRO stage, offload, activation recompute, a
 * smaller microbatch), each with its total. Not collective. */
cai_status cai_mem_plan_check(const cai_mem_plan_request *req, const cai_mem_plan *p, size_t device_limit,
                              size_t host_limit);
/* What an engine and its model actually hold, in the plan's terms
 * (windows: the pool's high-water mark). Not collective. */
void cai_zero_memory(const cai_zero_t *z, cai_mem_plan *out);

/* ---- layout planner (src/parallel/layout_plan.c; docs/pipeline.md "Planner")
 *
 * Every (dp, tp, pp, virtual stages, schedule, ZeRO stage, microbatch size
 * and count, activation checkpointing) layout of np ranks for a model and a
 * global batch, with its per-rank bytes (cai_mem_plan_compute on the first
 * and the last pipeline rank, activation sets as the schedule's peak
 * in-flight forwards)
 * and a predicted step time from measured costs: one block's and the
 * head's forward and backward on this device, and the links' bandwidth and
 * latency. The time model (docs/pipeline.md "Planner"): the pipeline's
 * makespan from cai_pp_schedule_check with the heaviest chunk's costs
 * (tp collectives included), at least the node's compute divided over its
 * cores when more ranks share a node than it has cores; plus the dp
 * gradient reduction and ZeRO's extra gathers. */

typedef struct {
    double block_f, block_b; /* seconds: one transformer block's forward / backward at tp = 1 (the mean) */
    double block_w;          /* the part of block_b a split backward's weight pass takes (zb-h1, zb-v) */
    double head_f, head_b;   /* the embedding, the final norm, the LM head and the loss */
    double adamw;            /* seconds per parameter element of an AdamW update */
    double pass_all;         /* seconds per whole pass (forward + backward) with every rank computing */
    double pass_half;        /* ... of the even ranks while the odd ones wait in MPI; 0: not measured */
    int tokens;              /* microbatch tokens (B x T) the times are for; they scale linearly */
    int concurrency;         /* ranks of one node that were computing while these were measured */
    int threads;             /* threads of each of them */
    double bandwidth;        /* bytes/s a rank's link sustains in a collective (bus bandwidth) */
    double latency;          /* seconds per collective call, whatever its size */
} cai_plan_costs;

typedef struct {
    cai_model_config model; /* n_layers, heads, vocabulary... (resolved inside) */
    int np;                 /* ranks to plan for */
    int seq_len;            /* tokens per sequence */
    int global_batch;       /* sequences per optimizer step, over all dp ranks */
    int micro_batch;        /* sequences per microbatch; 0: every power of two that divides */
    size_t mem_limit;       /* bytes per rank (device + host on a host device); 0: none */
    int ranks_per_node;     /* ranks of the planned job that share one node's cores */
    int cores;              /* cores per node */
    int max_virtual;        /* interleaved: chunks per rank tried, 2..max_virtual; 0: 4 */
    unsigned run_styles;    /* bit (1 << style) for every schedule the trainer runs under pp */
    int run_pp_zero;        /* highest ZeRO stage the trainer runs under pp */
    cai_plan_costs costs;
    const cai_device_t *dev;   /* the backend decides attention workspace sizes */
    const cai_fp8_config *fp8; /* FP8 linears: their casts and weight codes count in every layout's bytes
                                * (the costs stay as measured); NULL or not enabled: none */
} cai_plan_request;

typedef enum {
    CAI_PLAN_FITS = 0,    /* fits the limit and the trainer runs it */
    CAI_PLAN_NOT_RUN,     /* fits, but the trainer does not run it yet */
    CAI_PLAN_OVER_MEMORY, /* over the limit */
    CAI_PLAN_INDIVISIBLE, /* the model or the batch does not divide over it */
} cai_plan_verdict;

typedef struct {
    int dp, tp, pp, virtual_stages, zero, micro_batch, microbatches, ckpt;
    cai_pp_style style; /* pp > 1 */
    cai_plan_verdict verdict;
    size_t bytes;      /* the largest pipeline rank's device + host bytes */
    int bytes_rank;    /* that pipeline rank */
    int inflight;      /* its activation sets (the schedule's peak in-flight forwards) */
    double time;       /* predicted seconds per step */
    double t_work;     /* this rank's compute, uncontended (recompute included) */
    double t_pipe;     /* makespan or node share beyond t_work: bubble, other ranks on its cores */
    double t_tp, t_dp; /* tp collectives; dp gradient reduction and ZeRO gathers */
    double t_opt;      /* the AdamW step over the rank's (ZeRO: sharded) parameters */
    char reason[256];
} cai_plan_entry;

/* np 0, seq_len 0 (set them), global batch 0, no limit, one rank per
 * core, max_virtual 4, the trainer's pipelines: gpipe, 1f1b, interleaved,
 * zb-h1 and zb-v at ZeRO stages 0 and 1. Pure. */
void cai_plan_request_init(cai_plan_request *r);
/* Time `iters` forward + backward passes (after one untimed) of a copy of
 * `model` with `layers` layers (a pipeline stage's, say) at (micro_batch,
 * seq_len) on `dev`, unit by unit (model
 * hooks), then `iters` split backwards (input passes, then weight passes)
 * and `iters` AdamW updates of its parameters: fills block_f/b/w, head_f/b,
 * adamw, pass_all and tokens of *out. With a mesh (may be NULL)
 * every rank of it starts each timing together, so ranks of one node share
 * its cores as a job's ranks do, the times are the means over the ranks,
 * and pass_half times the even ranks' passes while the odd ones wait in
 * MPI (what a waiting pipeline rank costs the computing ones): collective
 * over CAI_AXIS_WORLD. */
cai_status cai_plan_measure_compute(cai_device_t *dev, cai_mesh_t *mesh, const cai_model_config *model, int layers,
                                    int micro_batch, int seq_len, int iters, cai_plan_costs *out);
/* Bandwidth and latency of all-reduces over every rank of `mesh` (all of
 * them on CAI_AXIS_DP): latency from 4 KiB, bandwidth the bus bandwidth at
 * 16 MiB (cai_mesh_bench). Collective over the mesh; needs dp >= 2. */
cai_status cai_plan_measure_comm(cai_mesh_t *mesh, cai_plan_costs *out);
/* Every layout (*out, *n; free with cai_free), sorted: those that fit and
 * run by predicted time, then those that fit but do not run, then those
 * over the limit by bytes, then those that do not divide; each with its
 * reason. CAI_ERR_CONFIG for a request that cannot be planned (np < 1, no
 * seq_len or batch, a model config that does not resolve). Not
 * collective. */
cai_status cai_plan_layouts(const cai_plan_request *req, cai_plan_entry **out, int *n);
/* The winner's index: the first entry that fits and runs.
 * CAI_ERR_NOMEM when layouts divide but none fits (naming the smallest and
 * its bytes), CAI_ERR_LAYOUT when none divides (naming why). */
cai_status cai_plan_pick(const cai_plan_request *req, const cai_plan_entry *e, int n, int *winner);
/* The request, the costs, then up to `top` rows (0: all) and every row
 * that does not divide only once per reason. */
void cai_plan_print(const cai_plan_request *req, const cai_plan_entry *e, int n, int top, FILE *out);

/* ====================================================== end of ZeRO section */

/* ======================================================================
 * The pipeline executor (src/parallel/pipeline.c, docs/pipeline.md): one
 * rank's action list of a schedule (colossal/schedule.h) run on its model
 * chunks, activations and their gradients sent non-blocking along
 * CAI_AXIS_PP; tp shards each stage, the dp replicas of a stage average
 * their gradients (the model's own: ZeRO stage 0).
 * ====================================================================== */

typedef struct cai_pipeline cai_pipeline_t;

#define CAI_PP_MAX_CHUNKS 16

/* m is this rank's stage (view pp_size/pp_rank those of the mesh's pp
 * axis): one chunk for gpipe, 1f1b and zb-h1, the view's pp_chunks >= 2 for
 * interleaved, 2 in a V (view.pp_vshape) for zb-v. zb-h1 and zb-v need a
 * model created with split_backward (its backward runs as an input pass and
 * a later weight pass). Refuses, naming what would run, a chunk count or
 * placement the style does not run. The model's activation slots
 * (cai_model_options.act_slots) decide what is recomputed: with
 * cai_pipeline_slots_needed of them, nothing; a slot between a split
 * backward's two passes is never given up, so zb-h1 with too few fails
 * naming the rank. On the host, collective over CAI_AXIS_PP (it agrees on
 * node-shared boundaries, CAI_PP_HOST_TRANSPORT), and so is cai_pipeline_free. */
cai_status cai_pipeline_create(cai_pipeline_t **out, cai_mesh_t *mesh, cai_model_t *m, cai_pp_style style);
void cai_pipeline_free(cai_pipeline_t *p);
/* Zero the gradients, run n_micro microbatches (tokens, targets: host
 * [n_micro, B, T], the same on every pp rank: the first stage reads the
 * tokens, the last the targets) through the schedule with the loss
 * gradient weighted grad_scale / n_micro, then add up tied-embedding
 * gradients between the stages holding them. *loss (may be NULL): the mean
 * microbatch loss, on every rank. Collective over CAI_AXIS_PP. */
cai_status cai_pipeline_forward_backward(cai_pipeline_t *p, const int32_t *tokens, const int32_t *targets, int n_micro,
                                         float grad_scale, double *loss);
/* Forward only (evaluation): n_micro microbatches down the chain, *loss
 * the mean of their losses on every rank. Collective over CAI_AXIS_PP. */
cai_status cai_pipeline_eval(cai_pipeline_t *p, const int32_t *tokens, const int32_t *targets, int n_micro,
                             double *loss);
/* Record the compute actions (forward, backward or its two passes) of every following step
 * with their start and end (the device synchronised after each, which
 * costs the overlap it would have had). Not collective. */
void cai_pipeline_set_trace(cai_pipeline_t *p, int on);
/* cai_pipeline_trace_stats' measured, textbook and at_costs (any output
 * may be NULL), and its trace file. Collective over CAI_AXIS_PP. */
cai_status cai_pipeline_trace(cai_pipeline_t *p, const char *path, double *measured, double *predicted,
                              double *predicted_measured);
/* Traced steps kept for the statistics and the trace file (the last ones). */
#define CAI_PP_TRACE_KEEP 32
/* What the traced steps measured (cai_pipeline_trace_stats; seconds and
 * fractions). The statistics are over the last CAI_PP_TRACE_KEEP traced steps,
 * the first traced step left out while kept (it pays first-touch page
 * faults) unless it is the only one; times on pp rank 0's clock (each
 * rank's offset estimated by round trips at every traced step's start). */
typedef struct {
    int steps;           /* steps the statistics are over */
    double measured;     /* median over the steps of 1 - busy / (pp x span), span from the
                            first compute's start to the last one's end on any rank */
    double measured_min; /* the least and the most of them */
    double measured_max;
    double textbook;       /* the schedule simulated at unit costs: (p-1)/(m+p-1) for 1f1b */
    double at_costs;       /* the schedule at the mean forward, backward (input pass) and
                              weight pass times on every stage, free transfers */
    double with_transfers; /* the same with every boundary transfer taking `transfer` */
    double transfer;       /* median time from a producer's end to its consumer's start, over
                              the transfers the consumer was waiting for */
    int transfers;         /* how many of those */
    double replay;         /* median over the steps of the schedule replayed at each action's
                              own measured time, free transfers: the compute's share of the
                              bubble; measured - replay is what transfers and waits add */
    double start_spread;   /* median spread of the ranks' step starts (the barrier's exits) */
    double compute_cv;     /* median over the steps of the coefficient of variation (standard
                              deviation / mean) of the forwards', backwards' or weight passes'
                              times, the largest: how far the run was from equal compute */
    double waited_cpu;     /* median over the steps of the share of the compute's time its
                              thread was not running (1 - processor time / span): time other
                              processes took from the ranks */
    double replay_cpu;     /* the replay at each action's processor time instead of its span:
                              the run's compute as if nothing had taken its processor */
    double at_stage_times; /* median over the steps of the replay with every action at its
                              stage's median for its kind in that step: what unequal stages
                              alone make of the schedule (replay - this: the variation
                              from action to action) */
    double f, b, w;        /* mean forward, backward (input pass), weight pass times */
    long long equal_us;    /* CAI_PP_EQUAL_COMPUTE_US (test hook; 0: off): each compute padded to
                              this many microseconds per cost unit (a fused backward: 2) */
    int equal_overruns;    /* of the computes the statistics are over (every rank's), those whose
                              real compute outlasted that target (not padded: the run was not equal) */
    int equal_actions;     /* the computes the statistics are over, every rank's */
} cai_pp_trace_stats;
/* The statistics above, collective over CAI_AXIS_PP; path (may be NULL): pp
 * rank 0 writes the kept steps' compute actions as a Chrome trace (one row
 * per stage, times from the first kept step's start) with the statistics,
 * and each rank's mean forward and backward, in its otherData. */
cai_status cai_pipeline_trace_stats(cai_pipeline_t *p, const char *path, cai_pp_trace_stats *out);
/* Steps traced since cai_pipeline_set_trace turned tracing on. */
int cai_pipeline_traced_steps(const cai_pipeline_t *p);
/* How stage boundaries travel: "node-shared memory" (host, every pp rank on
 * this node, CAI_PP_HOST_TRANSPORT=shm), "MPI messages" or "device
 * point-to-point". */
const char *cai_pipeline_transport(const cai_pipeline_t *p);
/* 1 in *shared where a pipeline over this mesh's pp axis takes its boundaries
 * through node-shared memory (host device, CAI_PP_HOST_TRANSPORT=shm, every
 * pp rank on one node): what cai_pipeline_create decides, asked before it
 * (the memory plan's pp_shared). Collective over CAI_AXIS_PP. */
cai_status cai_pipeline_boundaries_shared(cai_mesh_t *mesh, const cai_device_t *dev, int *shared);
/* Bytes this rank's executor holds for stage boundaries (after a step of
 * the most microbatches) and for the tied gradients' exchange: what the
 * memory plan's pipe counts (cai_mem_plan_request.pp_microbatches). */
size_t cai_pipeline_boundary_bytes(const cai_pipeline_t *p);
/* The most (microbatch, chunk) forwards whose backward (split: weight pass) is still to run on
 * pipeline rank `rank` under `spec`: the activation slots that spare it any
 * recompute. Not collective. */
cai_status cai_pipeline_slots_needed(const cai_pp_spec *spec, int rank, int *slots);
/* Hand the stage's gradients to a ZeRO engine over the same model (stage 0
 * or 1, no offload; NULL detaches): the step zeroes, weights and reduces
 * them through it (cai_zero_grads_begin/end) instead of averaging the
 * model's own over dp, and the driver steps the engine's shards. Not
 * collective. */
cai_status cai_pipeline_set_zero(cai_pipeline_t *p, cai_zero_t *z);
cai_zero_t *cai_pipeline_zero(const cai_pipeline_t *p);
/* Forwards the last step recomputed for want of activation slots. */
int cai_pipeline_recomputes(const cai_pipeline_t *p);
cai_mesh_t *cai_pipeline_mesh(const cai_pipeline_t *p);
cai_model_t *cai_pipeline_model(const cai_pipeline_t *p);

#ifdef __cplusplus
}
#endif
#endif
