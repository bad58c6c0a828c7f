/* Private to src/cluster (and its tests): the mesh structure, the collective
 * descriptor shared by the MPI and NCCL paths, the watchdog and the half-float
 * helpers. Not installed. */
#ifndef CAI_CLUSTER_INTERNAL_H
#define CAI_CLUSTER_INTERNAL_H

#include <stdint.h>

#include "colossal/cluster.h"

/* Grid dimensions of the Cartesian communicator, by identity (their position
 * in the grid is given by the layout's order string). */
enum { CAI_GRID_PP = 0, CAI_GRID_EDP, CAI_GRID_EP, CAI_GRID_SP, CAI_GRID_TP, CAI_GRID_N };

/* order[i]: grid dimension at position i, outermost first; dims[i]: its size. */
cai_status cai_layout_grid(const cai_layout *layout, int order[CAI_GRID_N], int dims[CAI_GRID_N]);
/* Bit mask (1 << CAI_GRID_*) of the grid dimensions an axis group spans. */
unsigned cai_axis_grid_mask(cai_axis axis);

/* Bounded text buffer for error messages: appends until full, then truncates. */
typedef struct {
    char *buf;
    size_t cap, len;
} cai_sbuf;
void cai_sbuf_add(cai_sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cai_sbuf_vadd(cai_sbuf *s, const char *fmt, va_list ap);

/* ------------------------------------------------------------ collectives */

typedef enum {
    CAI_OP_ALLREDUCE = 0,
    CAI_OP_REDUCE_SCATTER,
    CAI_OP_ALLGATHER,
    CAI_OP_ALLTOALL,
    CAI_OP_ALLTOALLV,
    CAI_OP_BCAST,
    CAI_OP_BARRIER,
    CAI_OP_IALLREDUCE,
    CAI_OP_SEND,
    CAI_OP_RECV,
    CAI_OP_NCCL_INIT, /* the ncclUniqueId broadcast that creates an axis' NCCL communicator */
    CAI_OP_IREDUCE_SCATTER,
    CAI_OP_IALLGATHER,
    CAI_OP_IALLTOALL,
    CAI_OP_KIND_COUNT
} cai_op_kind;

const char *cai_op_kind_name(cai_op_kind kind);

/* The blocking kind a non-blocking one moves data like: the transports
 * switch on this; the watchdog reports the kind itself. */
static inline cai_op_kind cai_op_base(cai_op_kind k) {
    switch (k) {
    case CAI_OP_IALLREDUCE: return CAI_OP_ALLREDUCE;
    case CAI_OP_IREDUCE_SCATTER: return CAI_OP_REDUCE_SCATTER;
    case CAI_OP_IALLGATHER: return CAI_OP_ALLGATHER;
    case CAI_OP_IALLTOALL: return CAI_OP_ALLTOALL;
    default: return k;
    }
}

/* One operation as the caller asked for it; both transports read this. */
typedef struct {
    cai_op_kind kind;
    cai_axis axis;
    const void *send;
    void *recv;
    size_t count; /* allreduce/bcast/p2p: elements; reduce_scatter: recv count; allgather: send count;
                     alltoall: elements per peer */
    cai_dtype dtype;
    cai_reduce_op op;
    int peer; /* bcast root or p2p peer (axis rank) */
    int tag;
    const size_t *scounts, *sdispls, *rcounts, *rdispls; /* alltoallv */
} cai_coll;

/* Elements of send and receive buffer the operation touches, for staging. */
void cai_coll_extent(const cai_coll *c, int group_size, size_t *send_elems, size_t *recv_elems);
int cai_coll_in_place(const cai_coll *c, int axis_rank, int group_size);

/* Device transports. */
enum { CAI_DEV_NONE = 0, CAI_DEV_NCCL, CAI_DEV_MPI, CAI_DEV_STAGE };

/* An operation in flight: MPI requests or a CUDA event, plus temporaries that
 * must outlive it. Operations the watchdog gave up on in return mode move to
 * the mesh's orphan list, because MPI cannot cancel a collective: their
 * temporaries are released only when the late peers finally let them finish. */
typedef struct cai_pending {
    cai_coll c;    /* as issued (host pointers when staged) */
    cai_coll user; /* as the caller gave it */
    uint64_t seq;
    int device; /* CAI_DEV_* */
    int nreq;
    MPI_Request *reqs;
    void *tmp_send, *tmp_recv; /* host staging / in-place copies (cai_malloc) */
    int *tmp_ints;             /* alltoallv int counts, alive until completion */
    int dev_slot;              /* the NCCL path's completion event: a slot of the mesh's event pool */
    int group_size;
    struct cai_pending *next;
} cai_pending;

struct cai_request {
    cai_mesh_t *mesh;
    cai_pending op;
};

struct cai_nccl_state; /* nccl.c */

struct cai_mesh {
    cai_layout layout;
    char order[64];
    int grid_order[CAI_GRID_N];
    int grid_dims[CAI_GRID_N];
    MPI_Comm cart;
    MPI_Comm comm[CAI_AXIS_COUNT];
    int size[CAI_AXIS_COUNT];
    int rank[CAI_AXIS_COUNT];
    int *group[CAI_AXIS_COUNT];
    int world_rank, world_size;

    double timeout_s;
    int abort_on_timeout;
    int device_comm; /* cai_device_comm requested */

    MPI_Op half_ops[2][3]; /* [bf16, f16][sum, max, min] */

    /* Watchdog state: seq[a] counts collectives entered on axis a; the RMA
     * window publishes them (plus what this rank is blocked in) to peers. */
    uint64_t seq[CAI_AXIS_COUNT];
    uint64_t p2p_seq[CAI_AXIS_COUNT];
    MPI_Win win;
    uint64_t *win_mem;
    int win_ok;              /* window exists and every read so far completed */
    struct cai_guard *guard; /* heartbeats for the stretches MPI-IO owns (guard.c); NULL: off */
    cai_pending *orphans;

    size_t max_chunk; /* elements per MPI call (<= INT_MAX); tests lower it */

    struct cai_nccl_state *nccl;
    void *cuda_stream; /* work that device collectives must follow (NULL: legacy default stream) */
    int overlap_ctas;  /* cai_mesh_config.nccl_overlap_ctas */
    int overlapping;   /* cai_mesh_overlap_compute: device collectives started now run beside compute */
    int ready;         /* init completed on this rank (so on all: freeing may communicate) */
};

/* Words in each rank's watchdog window: one sequence counter per axis, the
 * activity word (what the rank is blocked in right now, 0 when it is not
 * inside a colossal communication call), and the heartbeat (bumped while the
 * rank enters or waits in a communication call: a stopped, hung or dead rank's
 * heartbeat stands still). */
#define CAI_WD_WORDS (CAI_AXIS_COUNT + 2)
#define CAI_WD_ACTIVITY CAI_AXIS_COUNT
#define CAI_WD_BEAT (CAI_AXIS_COUNT + 1)

cai_status cai_wd_init(cai_mesh_t *m);
void cai_wd_free(cai_mesh_t *m);
/* Collective over the mesh's node (guard.c); failures only turn the guard
 * off, with a warning. */
void cai_guard_init(cai_mesh_t *m);
void cai_guard_free(cai_mesh_t *m);
/* Called when this rank enters a collective on `axis`: returns its number. */
uint64_t cai_wd_enter(cai_mesh_t *m, cai_axis axis);
/* Poll until done(ctx) says 1 or the watchdog fires. done() returns 1 when
 * complete, 0 while pending, -1 on a transport error (it sets the trace).
 * On timeout: abort mode aborts every rank; return mode returns
 * CAI_ERR_TIMEOUT with the report in the error trace. */
typedef int (*cai_wd_poll_fn)(void *ctx);
cai_status cai_wd_wait(cai_mesh_t *m, const cai_coll *c, uint64_t seq, cai_wd_poll_fn done, void *ctx);
/* As cai_wd_wait, and also gives up after limit_s (> 0) whatever the mesh's
 * watchdog says: then it returns CAI_ERR_TIMEOUT with the same report and
 * never aborts (cai_wait_timeout; the mesh's own watchdog still fires first
 * when it is shorter, in its own mode). limit_s <= 0: no limit of its own. */
cai_status cai_wd_wait_limit(cai_mesh_t *m, const cai_coll *c, uint64_t seq, cai_wd_poll_fn done, void *ctx,
                             double limit_s);
/* As cai_wd_wait_limit with the longest pause between polls of a long wait
 * given (cai_wd_wait_limit: 1 ms). A device collective's waiter is the
 * host thread that feeds the GPU: every microsecond it sleeps past the
 * completion is a microsecond the GPU idles. */
cai_status cai_wd_wait_nap(cai_mesh_t *m, const cai_coll *c, uint64_t seq, cai_wd_poll_fn done, void *ctx,
                           double limit_s, long max_nap_ns);

/* MPI path (comm.c). */
MPI_Datatype cai_mpi_dtype(cai_dtype dt);
/* Completes what it can of the timed-out operations (non-blocking). */
void cai_orphans_progress(cai_mesh_t *m);
/* Watched MPI barrier over an axis (host path), counted as a collective. */
cai_status cai_host_barrier(cai_mesh_t *m, cai_axis axis);
/* Broadcast of raw bytes from axis rank 0 over MPI, counted as `kind`. */
cai_status cai_host_bcast_bytes(cai_mesh_t *m, cai_axis axis, void *buf, size_t bytes, cai_op_kind kind);

/* ------------------------------------------------------------ device (nccl.c) */

/* Whether p is CUDA device (or managed) memory; 0 in builds without CUDA. */
int cai_cl_is_device_ptr(const void *p);
int cai_cl_cuda_usable(void);
/* Creates the axis' NCCL communicator on first use (collective over the axis). */
cai_status cai_cl_nccl_ensure(cai_mesh_t *m, cai_axis axis);
/* Runs a whole operation on device buffers through NCCL, under the watchdog. */
cai_status cai_cl_nccl_run(cai_mesh_t *m, const cai_coll *c, uint64_t seq);
/* Starts a non-blocking operation on device buffers (its completion event
 * comes from the mesh's pool); cai_cl_nccl_finish waits for it under the
 * watchdog (and limit_s, see cai_wd_wait_limit), cai_cl_nccl_test checks it
 * once. Both give the event back once the operation is over (*done = 1;
 * also on an error). */
cai_status cai_cl_nccl_start(cai_mesh_t *m, cai_pending *p);
cai_status cai_cl_nccl_finish(cai_mesh_t *m, cai_pending *p, double limit_s);
cai_status cai_cl_nccl_test(cai_mesh_t *m, cai_pending *p, int *done);
/* Events the mesh's pool holds (created so far) and lends out now; tests
 * check that a steady state creates none. 0 without NCCL state. */
void cai_cl_nccl_event_stats(const cai_mesh_t *m, int *created, int *in_use);
void cai_cl_nccl_free(cai_mesh_t *m);
cai_status cai_cl_copy_to_host(void *dst, const void *src, size_t bytes);
cai_status cai_cl_copy_to_device(void *dst, const void *src, size_t bytes);
/* Waits for a CUDA stream (NULL: the legacy default stream). */
cai_status cai_cl_stream_sync(void *stream);
cai_status cai_cl_device_alloc(void **out, size_t bytes);
void cai_cl_device_free(void *p);
cai_status cai_cl_device_fill(void *dst, const void *host_src, size_t bytes);

/* ------------------------------------------------------------ half floats */

/* Round to nearest even; NaN stays NaN, overflow goes to infinity. */
uint16_t cai_cl_f32_to_bf16(float f);
float cai_cl_bf16_to_f32(uint16_t h);
uint16_t cai_cl_f32_to_f16(float f);
float cai_cl_f16_to_f32(uint16_t h);

/* Tests shrink this to exercise the chunked path of large host operations. */
void cai_mesh_set_max_chunk(cai_mesh_t *m, size_t elements);

#endif
