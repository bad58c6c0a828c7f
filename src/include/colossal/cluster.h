/* The cluster layer: a Cartesian mesh over the parallel axes, collectives that
 * name an axis, and a watchdog that turns a stalled collective into an error
 * naming the stuck rank instead of a silent hang.
 *
 * Grid dimensions, outermost first by default: pp, dp, ep, sp, tp. Expert
 * parallelism factors data parallelism, so the grid's "dp" dimension has size
 * dp/ep (the expert-data-parallel factor, edp) and the DP axis group spans the
 * edp and ep dimensions together. TP is innermost so TP peers are neighbouring
 * ranks (same node, NVLink). world = pp * dp * sp * tp. */
#ifndef COLOSSAL_CLUSTER_H
#define COLOSSAL_CLUSTER_H

#include <mpi.h>
#include <stddef.h>
#include <stdio.h>

#include "colossal/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CAI_AXIS_PP = 0,
    CAI_AXIS_DP, /* edp x ep: all data-parallel replicas of dense weights */
    CAI_AXIS_EP,
    CAI_AXIS_SP,
    CAI_AXIS_TP,
    CAI_AXIS_EDP,   /* replicas of one expert shard: dp / ep */
    CAI_AXIS_DP_SP, /* dp x sp: ZeRO shards over this when sequence parallel is on */
    CAI_AXIS_WORLD,
    CAI_AXIS_COUNT
} cai_axis;

/* "pp", "dp", "ep", "sp", "tp", "edp", "dp_sp", "world" and back. Not collective. */
const char *cai_axis_name(cai_axis axis);
cai_status cai_axis_parse(const char *name, cai_axis *out);

#define CAI_MESH_GRID_DIMS 5 /* pp, edp, ep, sp, tp */

/* A proposed layout. Pure data: validating it and computing any rank's
 * coordinates or groups needs no MPI, which is what colossal-check --layout
 * uses to print a mesh for a world it is not running in. */
typedef struct {
    int pp, dp, ep, sp, tp;
    /* Outermost-first order of the five grid dimensions as names, e.g.
     * "pp,dp,ep,sp,tp" (the default when NULL or ""). Here "dp" means the edp factor. */
    const char *order;
} cai_layout;

/* Model-shape facts the layout must respect; zero fields are not checked. */
typedef struct {
    int n_heads, n_kv_heads, n_layers, n_experts, vocab_size;
    int pp_chunks; /* virtual stages per pipeline rank (interleaved schedules); 0 = 1 */
} cai_layout_model;

/* Checks world == pp*dp*sp*tp, ep | dp, every size >= 1, the order string, and
 * (if model != NULL) heads % tp, kv-heads vs tp, layers vs pp*chunks,
 * experts % ep. On failure the error message names the disagreeing numbers and
 * lists layouts that would fit `world_size`. */
cai_status cai_layout_validate(int world_size, const cai_layout *layout, const cai_layout_model *model);
/* Up to `max` valid (pp, dp, sp, tp) factorizations of world_size that keep
 * the given model constraints, best first (tp a small power of two near the
 * hint's, sp and pp as hinted, dp absorbing the rest; the hint's ep where it
 * divides dp); the hinted layout itself is left out. Returns the count
 * written; out may be NULL to count. hint may be NULL. Not collective. */
int cai_layout_suggest(int world_size, const cai_layout *hint, const cai_layout_model *model, cai_layout *out, int max);
/* Coordinates of world rank r along each axis (index in its axis group). */
cai_status cai_layout_coords(const cai_layout *layout, int world_rank, int coords[CAI_AXIS_COUNT]);
int cai_layout_axis_size(const cai_layout *layout, cai_axis axis);
/* World ranks of the `axis` group containing world_rank, ordered by axis rank. */
cai_status cai_layout_group(const cai_layout *layout, cai_axis axis, int world_rank, int *ranks_out);
/* Print the grid and each axis' groups ("tp groups: [0 1] [2 3] ..."). */
void cai_layout_print(const cai_layout *layout, FILE *out);
/* "tp=2 pp=1 dp=3" (+ " sp=S", " ep=E" when not 1) into buf; returns the
 * length it wanted, like snprintf. */
size_t cai_layout_str(const cai_layout *layout, char *buf, size_t cap);

typedef struct cai_mesh cai_mesh_t;

/* How collectives on CUDA device buffers travel. AUTO: NCCL when built
 * with it, else CUDA-aware MPI when the library says so at run time, else
 * staged through host memory. The others force one path (benchmarks, tests). */
typedef enum {
    CAI_DEVICE_COMM_AUTO = 0,
    CAI_DEVICE_COMM_NCCL,
    CAI_DEVICE_COMM_MPI,
    CAI_DEVICE_COMM_STAGE
} cai_device_comm;

typedef struct {
    cai_layout layout;
    double watchdog_timeout_s; /* 0 disables the watchdog */
    int watchdog_abort;        /* 1: abort all ranks on timeout (default); 0: return CAI_ERR_TIMEOUT */
    cai_device_comm device_comm;
    /* Thread blocks (CTAs) NCCL may use for device collectives started while
     * cai_mesh_overlap_compute is on: they then run on a second communicator
     * per axis with this limit, so that reductions overlapping the backward
     * take fewer SMs from it. 0 (default): no second communicator. */
    int nccl_overlap_ctas;
} cai_mesh_config;

/* Defaults: every axis 1, default order, watchdog 300 s in abort mode, AUTO
 * device path. Not collective. */
void cai_mesh_config_init(cai_mesh_config *cfg);

/* Collective over `world`: validates, then MPI_Cart_create + one MPI_Cart_sub
 * per axis (and NCCL communicators lazily on first CUDA use). A layout that
 * does not fit fails on every rank alike, before anything is allocated.
 * "World rank" everywhere below means the rank in `world`. */
cai_status cai_mesh_init(cai_mesh_t **out, MPI_Comm world, const cai_mesh_config *cfg);
/* Collective over the mesh (frees its RMA window and communicators). */
void cai_mesh_free(cai_mesh_t *mesh);
/* After CAI_ERR_TIMEOUT in return mode the timed-out operations stay in
 * flight (MPI cannot cancel a collective) and may still write their receive
 * buffers once the late ranks arrive. This waits up to timeout_s for them;
 * CAI_OK means all completed and their buffers hold the results. Not
 * collective, but completion needs the late peers to reach the operation. */
cai_status cai_mesh_drain(cai_mesh_t *mesh, double timeout_s);
/* The CUDA stream (cudaStream_t) whose work device-buffer collectives must
 * follow; NULL (default) is the legacy default stream. Not collective. */
void cai_mesh_set_cuda_stream(cai_mesh_t *mesh, void *stream);
/* Marks the device collectives started from now on as running beside
 * compute (on: 1) or alone (0, the default): with nccl_overlap_ctas set, the
 * former go through the axis' CTA-limited communicator. Not collective, but
 * every rank of a group must mark the same operations alike (each NCCL
 * communicator orders its own collectives). No effect on host buffers. */
void cai_mesh_overlap_compute(cai_mesh_t *mesh, int on);
/* Accessors: local, not collective. The mesh is not thread-safe: one thread
 * at a time issues its communication. */
const cai_layout *cai_mesh_layout(const cai_mesh_t *mesh);
int cai_mesh_size(const cai_mesh_t *mesh, cai_axis axis);
int cai_mesh_rank(const cai_mesh_t *mesh, cai_axis axis);
MPI_Comm cai_mesh_comm(const cai_mesh_t *mesh, cai_axis axis);
/* World ranks of this rank's group along `axis`, length cai_mesh_size(axis). */
const int *cai_mesh_group(const cai_mesh_t *mesh, cai_axis axis);

/* Whether the MPI library can take CUDA device pointers (decided at run time). Not collective. */
int cai_mpi_cuda_aware(void);

typedef enum { CAI_RED_SUM = 0, CAI_RED_AVG, CAI_RED_MAX, CAI_RED_MIN } cai_reduce_op;

/* Collectives over the group of `axis`. Buffers may be host memory or CUDA
 * device memory (detected per call; send and receive must agree): host
 * buffers go through MPI; device buffers through NCCL, or CUDA-aware MPI, or
 * staged through host memory. All are collective over the axis group, return
 * only when the local buffers are complete, and honour the watchdog.
 * bf16/f16 reductions combine pairs in fp32 and round to nearest even; AVG is
 * the sum divided by the group size (truncating for integer types).
 * sendbuf == recvbuf means in place. Counts above INT_MAX elements are split
 * (allreduce, broadcast, send, recv) or rejected (the others, on MPI). */
cai_status cai_allreduce(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t count,
                         cai_dtype dtype, cai_reduce_op op);
/* sendbuf holds size*recv_count elements; rank i receives block i reduced.
 * In place (sendbuf == recvbuf): the buffer holds all blocks and the result
 * lands at its start, as MPI_IN_PLACE does. */
cai_status cai_reduce_scatter(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t recv_count,
                              cai_dtype dtype, cai_reduce_op op);
/* recvbuf holds size*send_count elements, block i from axis rank i.
 * In place: sendbuf == recvbuf, or sendbuf == the rank's own block of recvbuf;
 * either way the contribution is read from that own block. */
cai_status cai_all_gather(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t send_count,
                          cai_dtype dtype);
/* Block i of sendbuf (count elements) goes to axis rank i; in place allowed. */
cai_status cai_all_to_all(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t count,
                          cai_dtype dtype);
/* Counts and displacements in elements, one per axis rank. Not in place. */
cai_status cai_all_to_allv(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, const size_t *send_counts,
                           const size_t *send_displs, void *recvbuf, const size_t *recv_counts,
                           const size_t *recv_displs, cai_dtype dtype);
cai_status cai_broadcast(cai_mesh_t *mesh, cai_axis axis, void *buf, size_t count, cai_dtype dtype, int root);
/* Point to point along an axis; `peer` is an axis rank. Not collective. */
cai_status cai_send(cai_mesh_t *mesh, cai_axis axis, const void *buf, size_t count, cai_dtype dtype, int peer, int tag);
cai_status cai_recv(cai_mesh_t *mesh, cai_axis axis, void *buf, size_t count, cai_dtype dtype, int peer, int tag);
cai_status cai_barrier(cai_mesh_t *mesh, cai_axis axis);

/* A stretch of blocking calls the watchdog cannot poll (collective MPI-IO
 * inside HDF5): while it lasts, a rank on this node whose process stops
 * beating (stopped, dead) for mesh.watchdog_timeout aborts the job with a
 * report naming it and `what`; a rank that is only slow keeps beating.
 * Not collective; stretches nest (the outermost counts). A no-op when the
 * watchdog is off. */
void cai_mesh_guard_begin(cai_mesh_t *mesh, const char *what);
void cai_mesh_guard_end(cai_mesh_t *mesh);
/* Heartbeats across nodes for the guard: `dir` is a directory every node
 * reaches (the run directory on the shared file system). The first rank of
 * each node writes DIR/.cai-guard/node-R about once a second and, during a
 * guarded stretch, reads the next node's file (the nodes form a ring): a
 * rank alone on its node that stops inside MPI-IO is then seen from another
 * node and the job aborts naming it. A file that has never shown this
 * job's token (another run's, or a directory that is not shared) is never
 * judged. One node, or the watchdog off: nothing is written. A file that
 * cannot be created is a warning (that node's stop is seen by its own ranks
 * only). Collective over the mesh. */
cai_status cai_mesh_guard_dir(cai_mesh_t *mesh, const char *dir);

/* Node-shared memory over an axis group whose ranks all share one node
 * (src/cluster/shared_mem.c): every rank of the group allocates `bytes` and
 * maps every member's, so a producer writes straight into a consumer's
 * buffer. The writer calls cai_shared_mem_sync after writing and then tells
 * the reader with a message; the reader calls it after that message, before
 * reading. create: collective over the axis, CAI_ERR_UNSUPPORTED on every
 * rank when the group spans nodes; free: collective over the axis. */
typedef struct cai_shared_mem cai_shared_mem_t;
cai_status cai_shared_mem_create(cai_mesh_t *mesh, cai_axis axis, size_t bytes, cai_shared_mem_t **out);
char *cai_shared_mem_ptr(const cai_shared_mem_t *s, int axis_rank);
void cai_shared_mem_sync(cai_shared_mem_t *s);
void cai_shared_mem_free(cai_shared_mem_t *s);

/* Non-blocking all-reduce, reduce-scatter, all-gather and all-to-all, for gradient
 * buckets and weight gathers that overlap compute. Arguments, dtypes, ops,
 * in-place conventions, count limits and results are those of the blocking
 * forms (bit for bit: the same transport does the same arithmetic). Collective
 * over the axis group: every rank issues them in the same order, mixed with
 * the blocking ones; several may be in flight and be completed in any order.
 * Buffers must stay untouched until completion. Host buffers go through MPI's
 * non-blocking collectives (whether or not the watchdog is on); device buffers
 * through NCCL on the mesh's communication stream, which first waits for the
 * stream set by cai_mesh_set_cuda_stream, so the call may be issued right
 * after the kernels that produce the input. Device results are complete
 * when cai_wait returns or cai_test says done. */
typedef struct cai_request cai_request_t;
cai_status cai_iallreduce(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t count,
                          cai_dtype dtype, cai_reduce_op op, cai_request_t **req);
cai_status cai_ireduce_scatter(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t recv_count,
                               cai_dtype dtype, cai_reduce_op op, cai_request_t **req);
cai_status cai_iall_gather(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t send_count,
                           cai_dtype dtype, cai_request_t **req);
cai_status cai_iall_to_all(cai_mesh_t *mesh, cai_axis axis, const void *sendbuf, void *recvbuf, size_t count,
                           cai_dtype dtype, cai_request_t **req);
/* Non-blocking point to point along an axis (`peer` an axis rank), for a
 * pipeline's activations and gradients: matched by (peer, tag) as MPI
 * matches them, so several may be in flight in any order. Not collective. */
cai_status cai_isend(cai_mesh_t *mesh, cai_axis axis, const void *buf, size_t count, cai_dtype dtype, int peer, int tag,
                     cai_request_t **req);
cai_status cai_irecv(cai_mesh_t *mesh, cai_axis axis, void *buf, size_t count, cai_dtype dtype, int peer, int tag,
                     cai_request_t **req);
/* Completes a request and frees it whatever it returns. The watchdog applies
 * from the moment it starts waiting (after a timeout in return mode the mesh
 * keeps the operation, see cai_mesh_drain). */
cai_status cai_wait(cai_request_t *req);
/* As cai_wait, with a deadline of the caller's own: after timeout_s (> 0)
 * it returns CAI_ERR_TIMEOUT with the watchdog's report (the ranks behind,
 * when the mesh's watchdog is on and so keeps the counters), never aborting,
 * and the mesh keeps the operation as in return mode. The mesh's watchdog
 * still fires first, in its own mode, when it is shorter. */
cai_status cai_wait_timeout(cai_request_t *req, double timeout_s);
/* Checks once, without waiting (and so without the watchdog): *done = 0
 * leaves the request pending; *done = 1 means it is over and freed, and the
 * return value is what cai_wait would have returned. Also moves host
 * operations along (MPI has no progress thread here). */
cai_status cai_test(cai_request_t *req, int *done);

/* Bandwidth measurement as nccl-tests does it: algorithm bandwidth
 * bytes/time and bus bandwidth scaled by the collective's traffic factor. */
typedef enum {
    CAI_BENCH_ALLREDUCE = 0,
    CAI_BENCH_ALLGATHER,
    CAI_BENCH_REDUCE_SCATTER,
    CAI_BENCH_ALLTOALL,
    CAI_BENCH_COUNT
} cai_bench_op;
typedef struct {
    cai_bench_op op;
    cai_axis axis;
    size_t bytes;   /* total message size in bytes (nccl-tests' "size") */
    double time_us; /* mean over iterations, max over the axis group */
    double algbw_gbs;
    double busbw_gbs;
} cai_bench_result;
const char *cai_bench_op_name(cai_bench_op op);
/* Collective over the whole mesh (every rank takes part in each axis' run):
 * f32 buffers, `warmup` untimed then `iters` timed calls of the public
 * collective. bytes is rounded down to what the operation can split evenly
 * (out->bytes says what was used). on_device needs a CUDA build and device. */
cai_status cai_mesh_bench(cai_mesh_t *mesh, cai_axis axis, cai_bench_op op, size_t bytes, int warmup, int iters,
                          int on_device, cai_bench_result *out);

#ifdef __cplusplus
}
#endif
#endif
