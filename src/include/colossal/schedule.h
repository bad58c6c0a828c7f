/* Pipeline schedules as data (design decision 5; docs/pipeline.md).
 *
 * A generator turns (pp ranks, chunks per rank, microbatches, style) into one
 * ordered action list per pipeline rank: compute (forward, backward, or the
 * backward split into its input-gradient and weight-gradient passes) and the
 * point-to-point messages between them. One executor runs any list; the
 * checker simulates a list with event times, without a model, and refuses it
 * when it would deadlock, compute a microbatch twice or not at all, break the
 * stage order, or leave a message unmatched. Nothing here is collective, talks
 * to MPI or allocates device memory: every rank can build the same schedule
 * and read its own list.
 *
 * Stages. The model is cut into S = pp * virtual_stages stages; stage 0 holds
 * the embedding, stage S-1 the head and the loss. Rank r holds
 * virtual_stages chunks, each one stage (cai_pp_stage_of):
 *   gpipe, 1f1b, zb-h1   one chunk: stage = rank
 *   interleaved          chunk c on rank r is stage c*pp + r (Megatron's
 *                        virtual pipeline: the stages go round the ranks)
 *   zb-v                 two chunks in a V: chunk 0 is stage r, chunk 1 is
 *                        stage 2*pp-1-r, so rank 0 holds the first and the
 *                        last stage and rank pp-1 the two middle ones
 * A forward of (mb, stage s) needs the forward of (mb, s-1); a backward of
 * (mb, s) needs the forward of (mb, s) on the same rank and, below the last
 * stage, the input gradient of (mb, s+1); a weight-gradient pass needs the
 * input-gradient pass of the same (mb, chunk).
 *
 * Messages. Between stages on different ranks the list holds explicit
 * SEND/RECV actions: a RECV right before the compute that needs it, a SEND
 * right after the compute that produces it. Between two stages on the SAME
 * rank (the bottom of zb-v's V; never in the other styles) there is no
 * message: the data stays in the rank's memory and the consumer reads the
 * producer's output directly. An executor may post a RECV earlier than its
 * place in the list (pre-posting can only make a valid list finish sooner)
 * but must post SENDs no earlier than their place, after the producer.
 * Messages need not match in FIFO order: each SEND has exactly one RECV on
 * its peer with the same cai_pp_action_tag, and vice versa.
 *
 * Activation memory. A rank holds a chunk's activations of a microbatch from
 * its forward until its backward (fused) or its weight-gradient pass (split)
 * is done; cai_pp_schedule_peak_inflight counts the most it ever holds, in
 * chunk units (a zb-v chunk is half a 1f1b stage, an interleaved chunk
 * 1/virtual of one). */
#ifndef COLOSSAL_SCHEDULE_H
#define COLOSSAL_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

#include "colossal/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CAI_PP_GPIPE = 0,   /* all forwards, then all backwards: holds every microbatch */
    CAI_PP_1F1B,        /* warm-up of pp-rank-1 forwards, then one forward one backward, then cool-down */
    CAI_PP_INTERLEAVED, /* Megatron's 1F1B over virtual stages; microbatches a multiple of pp, pp >= 2 */
    CAI_PP_ZB_H1,       /* zero bubble H1: backward split, weight passes fill the bubbles, at most
                           1f1b's peak activations (min(pp, microbatches)) on every rank */
    CAI_PP_ZB_V,        /* zero bubble V: two chunks per rank in a V, backward split, at most 2*pp
                           chunk units (the memory of 1f1b's peak) on every rank */
    CAI_PP_STYLE_COUNT
} cai_pp_style;

typedef enum {
    CAI_PP_FORWARD = 0,
    CAI_PP_BACKWARD,        /* input and weight gradients together (gpipe, 1f1b, interleaved) */
    CAI_PP_BACKWARD_INPUT,  /* input gradient only; sends it on (zb-h1, zb-v) */
    CAI_PP_BACKWARD_WEIGHT, /* weight gradient of a (mb, chunk) whose input gradient is done */
    CAI_PP_SEND_ACT,        /* this rank's chunk output of a forward, to the next stage's rank */
    CAI_PP_RECV_ACT,        /* the previous stage's output, into this rank's chunk */
    CAI_PP_SEND_GRAD,       /* the input gradient of this rank's chunk, to the previous stage's rank */
    CAI_PP_RECV_GRAD,       /* the next stage's input gradient, for this rank's chunk's backward */
    CAI_PP_OP_COUNT
} cai_pp_op;

/* One step of a rank's list. `mb` is the microbatch in [0, microbatches);
 * `chunk` is always THIS rank's chunk in [0, virtual_stages): for a SEND the
 * chunk that produced the data, for a RECV the chunk that will consume it;
 * `peer` is the other pp rank of a SEND/RECV (never this rank) and -1 for
 * compute. */
typedef struct {
    cai_pp_op op;
    int mb;
    int chunk;
    int peer;
} cai_pp_action;

typedef struct {
    int pp;             /* pipeline ranks, >= 1 */
    int virtual_stages; /* chunks per rank: 1 (gpipe, 1f1b, zb-h1), >= 2 (interleaved), 2 (zb-v) */
    int microbatches;   /* >= 1; interleaved: a multiple of pp */
    cai_pp_style style;
} cai_pp_spec;

/* The style's name ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"), or "?". */
const char *cai_pp_style_name(cai_pp_style style);
/* A style from its name, case-insensitively; "zbh1" and "zbv" are accepted for
 * zb-h1 and zb-v. CAI_ERR_CONFIG naming the known styles otherwise. */
cai_status cai_pp_style_parse(const char *name, cai_pp_style *out);
/* The chunks per rank a style takes when the user names none: 2 for
 * interleaved and zb-v, 1 for the others. */
int cai_pp_style_default_virtual(cai_pp_style style);
/* "forward", "backward", "backward_input", "backward_weight", "send_act",
 * "recv_act", "send_grad", "recv_grad", or "?". */
const char *cai_pp_op_name(cai_pp_op op);

/* Check a spec without building anything. CAI_ERR_CONFIG naming the field,
 * what was given and what would fit: pp or microbatches < 1, virtual_stages
 * other than the style's (1, or 2 for zb-v; >= 2 for interleaved),
 * interleaved with pp = 1 or microbatches not a multiple of pp (the nearest
 * multiples are named), or a schedule of more than 2^20 (stage, microbatch)
 * pairs. Every style but interleaved takes any microbatches >= 1 (fewer than
 * pp only widens the bubble). */
cai_status cai_pp_spec_validate(const cai_pp_spec *spec);

/* Global stage of (rank, chunk) under the spec's style (see the top of this
 * file), or -1 when rank or chunk is out of range. */
int cai_pp_stage_of(const cai_pp_spec *spec, int rank, int chunk);
/* The inverse: the rank and chunk holding `stage` in [0, pp*virtual_stages),
 * or -1 in both when it is out of range. */
void cai_pp_stage_owner(const cai_pp_spec *spec, int stage, int *rank, int *chunk);

/* The message tag of a SEND/RECV action on `rank`: a SEND and its matching
 * RECV on the peer get the same value, different messages different values,
 * all in [0, 2 * microbatches * pp * virtual_stages). It is a function of the
 * direction, the microbatch and the receiving stage, so an executor can post
 * MPI_Irecv/MPI_Isend with it and match out of order (check that the largest
 * value fits MPI_TAG_UB). -1 for a compute action or one out of range. */
int cai_pp_action_tag(const cai_pp_spec *spec, int rank, const cai_pp_action *action);
/* A short label for timelines and traces: "F3" (forward of microbatch 3),
 * "B3" (backward, fused or input gradient), "W3", "sA3>2" / "rA3<1" / "sG3>0" /
 * "rG3<2" (send/receive of activations/gradients to/from a peer); with more
 * than one chunk per rank ".chunk" follows the microbatch: "F3.1". Returns
 * `buf` (always terminated when cap > 0). */
const char *cai_pp_action_label(const cai_pp_action *action, int virtual_stages, char *buf, size_t cap);

typedef struct cai_pp_schedule cai_pp_schedule;

/* Generate the per-rank lists of `spec` (validated first; nothing is
 * allocated for a spec that is refused). *out is freed with
 * cai_pp_schedule_free. The lists are fixed by the spec alone: the zero-bubble
 * styles are placed for equal per-chunk forward, input-gradient and
 * weight-gradient times, and run correctly (if less tightly) for any other. */
cai_status cai_pp_schedule_build(const cai_pp_spec *spec, cai_pp_schedule **out);
/* A schedule from lists made elsewhere (a custom or hand-edited schedule, a
 * test): the spec is validated, the lists are copied as they are and checked
 * only by cai_pp_schedule_check. lists[r] holds lens[r] actions for rank r. */
cai_status cai_pp_schedule_from_lists(const cai_pp_spec *spec, const cai_pp_action *const *lists, const int *lens,
                                      cai_pp_schedule **out);
void cai_pp_schedule_free(cai_pp_schedule *s);

const cai_pp_spec *cai_pp_schedule_spec(const cai_pp_schedule *s);
/* Rank `rank`'s list and its length; NULL / 0 for a rank out of range. The
 * list lives as long as the schedule. */
int cai_pp_schedule_len(const cai_pp_schedule *s, int rank);
const cai_pp_action *cai_pp_schedule_actions(const cai_pp_schedule *s, int rank);
/* Most chunk activations `rank` ever holds, walking its list in order
 * (forward +1; backward, or the weight-gradient pass when split, -1). It does
 * not depend on times. 0 for a rank out of range. */
int cai_pp_schedule_peak_inflight(const cai_pp_schedule *s, int rank);

/* Per-chunk times, in seconds by convention (any unit for a prediction, as
 * long as all four share it): f forward, b input-gradient pass, w
 * weight-gradient pass (a fused BACKWARD takes b + w), comm the time from a
 * SEND to its data being there for the RECV. f and b > 0; w and comm >= 0.
 * NULL wherever costs are taken means f = b = w = 1, comm = 0. */
typedef struct {
    double f, b, w, comm;
} cai_pp_costs;

typedef struct {
    double makespan;   /* from 0 to the end of the last compute */
    double busy;       /* compute time summed over all ranks */
    double bubble;     /* idle fraction over all ranks: 1 - busy / (pp * makespan) */
    int peak_inflight; /* most chunk activations any rank holds (cai_pp_schedule_peak_inflight) */
    int peak_rank;     /* the lowest rank that holds that many */
} cai_pp_stats;

/* Check `s` and simulate it under `costs` (NULL: unit costs). A rank runs its
 * list in order; a compute takes its cost; a SEND costs the sender nothing
 * (buffered) and its data arrives comm later; a RECV waits until its data
 * has arrived. Refused, with CAI_ERR_INVALID_ARG naming the rank, action
 * index, microbatch and chunk: a field out of range; a (mb, chunk) whose
 * forward is missing or repeated, whose backward is missing or repeated, or
 * that mixes the fused and the split backward; a backward before its
 * forward, a weight pass before its input-gradient pass, a SEND before the
 * compute that produces it, a compute whose remote input has no RECV before
 * it (or whose local input is computed after it); a SEND or RECV to the wrong
 * rank, or between stages on the same rank, or without exactly one match on
 * the peer; and a deadlock (no rank can go on), listing where each waiting
 * rank waits. On success fills *out (when not NULL). */
cai_status cai_pp_schedule_check(const cai_pp_schedule *s, const cai_pp_costs *costs, cai_pp_stats *out);

/* Simulate `s` (checked as cai_pp_schedule_check) with every compute action
 * taking its own time: dur[r][i] for action i of rank r's list (the entries
 * of messages are not read), each message arriving comm after its SEND. A
 * measured run replayed on its own action times: what the schedule makes of
 * that run's compute alone, without the executor's transfers and waits. */
cai_status cai_pp_schedule_replay(const cai_pp_schedule *s, const double *const *dur, double comm, cai_pp_stats *out);

/* The textbook bubble fraction of the spec when one exists — gpipe and 1f1b
 * (p-1)/(m+p-1), interleaved (p-1)/(v*m+p-1) — for equal stages, per-chunk
 * costs f = F/v and b + w = B/v and no communication time; returns 1 and
 * sets *out (when not NULL) and *text (when not NULL, e.g. "(p-1)/(m+p-1)"),
 * else returns 0. */
int cai_pp_bubble_formula(const cai_pp_spec *spec, double *out, const char **text);

/* Check and simulate `s` (as cai_pp_schedule_check, whose errors it returns),
 * then draw its timeline to `out`: one row per rank, time in columns, each
 * compute labelled as cai_pp_action_label where it starts and continued with
 * '-', idle time '.', wrapped in blocks; then the makespan, the simulated
 * bubble fraction beside the textbook one where one exists, and the peak
 * in-flight chunk activations of each rank. */
cai_status cai_pp_schedule_print_timeline(const cai_pp_schedule *s, const cai_pp_costs *costs, FILE *out);

/* A Chrome-trace event ("X" complete event, ts/dur in microseconds): the
 * simulated schedule and the executor's measured run are written the same
 * way, so the two load side by side in chrome://tracing or Perfetto. */
typedef struct {
    int rank;         /* the trace's tid (pid is 0) */
    const char *name; /* UTF-8, e.g. cai_pp_action_label's "F3.1" */
    const char *cat;  /* category (cai_pp_op_name), or NULL for none */
    double start;     /* seconds */
    double end;       /* seconds, >= start */
    int mb, chunk;    /* written as args; -1 leaves each out */
} cai_pp_trace_event;

/* Write `n` events as {"traceEvents": [...]} to `path`, with a thread name
 * "pp rank R" for every rank that has an event. The file is written under a
 * temporary name and renamed, so a reader never sees half of it.
 * CAI_ERR_INVALID_ARG for a negative rank, a NULL name, or times that are
 * not finite or end before they start; CAI_ERR_IO when writing fails. */
cai_status cai_pp_write_chrome_trace(const char *path, const cai_pp_trace_event *events, size_t n);
/* A named number for a trace's "otherData" object (what a reader of the
 * file needs besides the events, e.g. the bubble it was measured at). */
typedef struct {
    const char *key;
    double value; /* finite */
} cai_pp_trace_meta;
/* cai_pp_write_chrome_trace with an "otherData" object of n_meta numbers
 * after the events (none when n_meta is 0). */
cai_status cai_pp_write_chrome_trace_meta(const char *path, const cai_pp_trace_event *events, size_t n,
                                          const cai_pp_trace_meta *meta, size_t n_meta);
/* The simulated run of `s` under `costs` (as cai_pp_schedule_check) as a
 * Chrome trace of its compute actions, cost units taken as seconds. */
cai_status cai_pp_schedule_write_chrome_trace(const cai_pp_schedule *s, const cai_pp_costs *costs, const char *path);

#ifdef __cplusplus
}
#endif
#endif
