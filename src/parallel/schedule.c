/* Pipeline schedules as data: generators, the simulating checker, the text
 * timeline and the Chrome-trace writer (colossal/schedule.h, docs/pipeline.md).
 * Nothing here knows about models, devices or MPI. */
#include "cai_config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "colossal/schedule.h"

/* Beyond this many (stage, microbatch) pairs the lists stop being a plan a
 * person reads or a simulation that takes milliseconds (2^20 pairs are about
 * 100 MiB of actions). */
#define MAX_PAIRS (1 << 20)

struct cai_pp_schedule {
    cai_pp_spec spec;
    int *len;             /* per rank */
    cai_pp_action **list; /* per rank, into block */
    cai_pp_action *block;
};

/* ------------------------------------------------------------------ names */

static const char *const k_style_names[CAI_PP_STYLE_COUNT] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};
static const char *const k_op_names[CAI_PP_OP_COUNT] = {"forward",  "backward", "backward_input", "backward_weight",
                                                        "send_act", "recv_act", "send_grad",      "recv_grad"};

const char *cai_pp_style_name(cai_pp_style style) {
    return (unsigned)style < CAI_PP_STYLE_COUNT ? k_style_names[style] : "?";
}

const char *cai_pp_op_name(cai_pp_op op) { return (unsigned)op < CAI_PP_OP_COUNT ? k_op_names[op] : "?"; }

cai_status cai_pp_style_parse(const char *name, cai_pp_style *out) {
    CAI_CHECK_ARG(out, "cai_pp_style_parse: NULL out");
    if (name) {
        for (int i = 0; i < CAI_PP_STYLE_COUNT; i++)
            if (!strcasecmp(name, k_style_names[i])) {
                *out = (cai_pp_style)i;
                return CAI_OK;
            }
        if (!strcasecmp(name, "zbh1")) {
            *out = CAI_PP_ZB_H1;
            return CAI_OK;
        }
        if (!strcasecmp(name, "zbv")) {
            *out = CAI_PP_ZB_V;
            return CAI_OK;
        }
    }
    return CAI_ERROR(CAI_ERR_CONFIG,
                     "unknown pipeline schedule '%s' (known: gpipe, 1f1b, interleaved, zb-h1 or zbh1, zb-v or zbv)",
                     name ? name : "(null)");
}

int cai_pp_style_default_virtual(cai_pp_style style) {
    return style == CAI_PP_INTERLEAVED || style == CAI_PP_ZB_V ? 2 : 1;
}

static int is_split(cai_pp_style style) { return style == CAI_PP_ZB_H1 || style == CAI_PP_ZB_V; }
static int is_compute(cai_pp_op op) { return op <= CAI_PP_BACKWARD_WEIGHT; }

/* ------------------------------------------------------------------ spec */

cai_status cai_pp_spec_validate(const cai_pp_spec *spec) {
    CAI_CHECK_ARG(spec, "cai_pp_spec_validate: NULL spec");
    const int p = spec->pp, v = spec->virtual_stages, m = spec->microbatches;
    if ((unsigned)spec->style >= CAI_PP_STYLE_COUNT)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "pipeline schedule style %d is not one of gpipe, 1f1b, interleaved, zb-h1, zb-v",
                         (int)spec->style);
    const char *name = k_style_names[spec->style];
    if (p < 1) return CAI_ERROR(CAI_ERR_CONFIG, "pipeline schedule %s: pp must be at least 1 (got %d)", name, p);
    if (m < 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "pipeline schedule %s: microbatches must be at least 1 (got %d)", name, m);
    switch (spec->style) {
    case CAI_PP_INTERLEAVED:
        if (v < 2)
            return CAI_ERROR(
                CAI_ERR_CONFIG,
                "interleaved needs virtual stages >= 2 per rank (got %d); with one chunk per rank use 1f1b", v);
        if (p < 2)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "interleaved needs pp >= 2 (got pp=1): its chunks go round the pipeline ranks; on one "
                             "rank use 1f1b or gpipe");
        if (m % p != 0) {
            const int lo = m < p ? p : m / p * p; /* the nearest multiples, at least pp */
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "interleaved needs microbatches to be a multiple of pp=%d (got %d); %d or %d would fit", p,
                             m, lo, lo + p);
        }
        break;
    case CAI_PP_ZB_V:
        if (v != 2)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "zb-v has exactly 2 chunks per rank (its V): virtual stages must be 2 (got %d)", v);
        break;
    default:
        if (v != 1)
            return CAI_ERROR(CAI_ERR_CONFIG,
                             "%s has one chunk per rank: virtual stages must be 1 (got %d); interleaved takes 2 or "
                             "more, zb-v exactly 2",
                             name, v);
        break;
    }
    const double pairs = (double)p * v * m; /* three ints can overflow a long long */
    if (pairs > MAX_PAIRS)
        return CAI_ERROR(CAI_ERR_CONFIG,
                         "pipeline schedule %s: pp=%d x virtual=%d x microbatches=%d = %.0f (stage, microbatch) pairs; "
                         "at most %d are generated",
                         name, p, v, m, pairs, MAX_PAIRS);
    return CAI_OK;
}

int cai_pp_stage_of(const cai_pp_spec *spec, int rank, int chunk) {
    if (!spec || rank < 0 || rank >= spec->pp || chunk < 0 || chunk >= spec->virtual_stages) return -1;
    if (spec->style == CAI_PP_ZB_V) return chunk == 0 ? rank : 2 * spec->pp - 1 - rank;
    return chunk * spec->pp + rank;
}

void cai_pp_stage_owner(const cai_pp_spec *spec, int stage, int *rank, int *chunk) {
    int r = -1, c = -1;
    if (spec && spec->pp > 0 && stage >= 0 && stage < spec->pp * spec->virtual_stages) {
        if (spec->style == CAI_PP_ZB_V) {
            c = stage < spec->pp ? 0 : 1;
            r = c == 0 ? stage : 2 * spec->pp - 1 - stage;
        } else {
            c = stage / spec->pp;
            r = stage % spec->pp;
        }
    }
    if (rank) *rank = r;
    if (chunk) *chunk = c;
}

static int owner_rank(const cai_pp_spec *spec, int stage) {
    int r;
    cai_pp_stage_owner(spec, stage, &r, NULL);
    return r;
}

/* The stage a message lands on: a SEND goes one stage on (activations) or
 * back (gradients) from the chunk that made it; a RECV lands on its chunk. */
static int receiving_stage(const cai_pp_spec *spec, int rank, const cai_pp_action *a) {
    const int s = cai_pp_stage_of(spec, rank, a->chunk);
    if (s < 0) return -1;
    switch (a->op) {
    case CAI_PP_SEND_ACT: return s + 1;
    case CAI_PP_SEND_GRAD: return s - 1;
    case CAI_PP_RECV_ACT:
    case CAI_PP_RECV_GRAD: return s;
    default: return -1;
    }
}

int cai_pp_action_tag(const cai_pp_spec *spec, int rank, const cai_pp_action *a) {
    if (!spec || !a || is_compute(a->op) || (unsigned)a->op >= CAI_PP_OP_COUNT) return -1;
    if (a->mb < 0 || a->mb >= spec->microbatches) return -1;
    const int S = spec->pp * spec->virtual_stages, t = receiving_stage(spec, rank, a);
    if (t < 0 || t >= S) return -1;
    const int grad = a->op == CAI_PP_SEND_GRAD || a->op == CAI_PP_RECV_GRAD;
    return (a->mb * S + t) * 2 + grad;
}

const char *cai_pp_action_label(const cai_pp_action *a, int virtual_stages, char *buf, size_t cap) {
    if (!buf || cap == 0) return buf;
    if (!a || (unsigned)a->op >= CAI_PP_OP_COUNT) {
        snprintf(buf, cap, "?");
        return buf;
    }
    static const char *const head[CAI_PP_OP_COUNT] = {"F", "B", "B", "W", "sA", "rA", "sG", "rG"};
    static const char *const dir[CAI_PP_OP_COUNT] = {"", "", "", "", ">", "<", ">", "<"};
    char chunk[16] = "", peer[16] = "";
    if (virtual_stages > 1) snprintf(chunk, sizeof chunk, ".%d", a->chunk);
    if (!is_compute(a->op)) snprintf(peer, sizeof peer, "%s%d", dir[a->op], a->peer);
    snprintf(buf, cap, "%s%d%s%s", head[a->op], a->mb, chunk, peer);
    return buf;
}

/* ------------------------------------------------------------------ the object */

static cai_status schedule_alloc(const cai_pp_spec *spec, size_t capacity, cai_pp_schedule **out) {
    cai_pp_schedule *s = NULL;
    cai_status st;
    CAI_CALL(cai_calloc((void **)&s, 1, sizeof *s, "pipeline schedule"));
    s->spec = *spec;
    CAI_CALL_GOTO(cai_calloc((void **)&s->len, (size_t)spec->pp, sizeof(int), "pipeline schedule lengths"), st, fail);
    CAI_CALL_GOTO(cai_calloc((void **)&s->list, (size_t)spec->pp, sizeof(cai_pp_action *), "pipeline schedule lists"),
                  st, fail);
    CAI_CALL_GOTO(cai_malloc((void **)&s->block, (capacity ? capacity : 1) * sizeof(cai_pp_action),
                             "pipeline schedule actions"),
                  st, fail);
    *out = s;
    return CAI_OK;
fail:
    cai_pp_schedule_free(s);
    return st;
}

void cai_pp_schedule_free(cai_pp_schedule *s) {
    if (!s) return;
    cai_free(s->len);
    cai_free(s->list);
    cai_free(s->block);
    cai_free(s);
}

cai_status cai_pp_schedule_from_lists(const cai_pp_spec *spec, const cai_pp_action *const *lists, const int *lens,
                                      cai_pp_schedule **out) {
    CAI_CHECK_ARG(spec && lists && lens && out, "cai_pp_schedule_from_lists: NULL spec, lists, lens or out");
    *out = NULL;
    CAI_CALL(cai_pp_spec_validate(spec));
    size_t total = 0;
    for (int r = 0; r < spec->pp; r++) {
        CAI_CHECK_ARG(lens[r] >= 0 && (lens[r] == 0 || lists[r]),
                      "cai_pp_schedule_from_lists: rank %d has length %d and list %p", r, lens[r], (void *)lists[r]);
        total += (size_t)lens[r];
    }
    cai_pp_schedule *s = NULL;
    CAI_CALL(schedule_alloc(spec, total, &s));
    size_t at = 0;
    for (int r = 0; r < spec->pp; r++) {
        s->list[r] = s->block + at;
        s->len[r] = lens[r];
        if (lens[r]) memcpy(s->list[r], lists[r], (size_t)lens[r] * sizeof(cai_pp_action));
        at += (size_t)lens[r];
    }
    *out = s;
    return CAI_OK;
}

const cai_pp_spec *cai_pp_schedule_spec(const cai_pp_schedule *s) { return s ? &s->spec : NULL; }

int cai_pp_schedule_len(const cai_pp_schedule *s, int rank) {
    return s && rank >= 0 && rank < s->spec.pp ? s->len[rank] : 0;
}

const cai_pp_action *cai_pp_schedule_actions(const cai_pp_schedule *s, int rank) {
    return s && rank >= 0 && rank < s->spec.pp ? s->list[rank] : NULL;
}

int cai_pp_schedule_peak_inflight(const cai_pp_schedule *s, int rank) {
    int held = 0, peak = 0;
    const int n = cai_pp_schedule_len(s, rank);
    const cai_pp_action *a = cai_pp_schedule_actions(s, rank);
    for (int i = 0; i < n; i++) {
        if (a[i].op == CAI_PP_FORWARD && ++held > peak) peak = held;
        if (a[i].op == CAI_PP_BACKWARD || a[i].op == CAI_PP_BACKWARD_WEIGHT) held--;
    }
    return peak;
}

/* ------------------------------------------------------------------ generators
 * Each generator writes one rank's compute order; add_messages then puts a
 * RECV right before every compute whose input lives on another rank and a
 * SEND right after every compute whose output does. */

typedef struct {
    cai_pp_action *a;
    int n;
} op_list;

static void put(op_list *l, cai_pp_op op, int mb, int chunk) {
    l->a[l->n].op = op;
    l->a[l->n].mb = mb;
    l->a[l->n].chunk = chunk;
    l->a[l->n].peer = -1;
    l->n++;
}

static void gen_gpipe(const cai_pp_spec *sp, op_list *l) {
    for (int mb = 0; mb < sp->microbatches; mb++) put(l, CAI_PP_FORWARD, mb, 0);
    for (int mb = 0; mb < sp->microbatches; mb++) put(l, CAI_PP_BACKWARD, mb, 0);
}

/* Megatron's order of a rank's k-th forward and backward over its chunks:
 * groups of pp microbatches go through chunk 0, then chunk 1, ...; the
 * backwards take the chunks in reverse. With one chunk it is plain 1F1B. */
static void virtual_step(const cai_pp_spec *sp, int k, int backward, int *mb, int *chunk) {
    const int p = sp->pp, v = sp->virtual_stages;
    const int c = (k / p) % v;
    *chunk = backward ? v - 1 - c : c;
    *mb = v == 1 ? k : (k / (p * v)) * p + k % p;
}

/* 1F1B and interleaved 1F1B: warm-up forwards, then one forward and one
 * backward in turn, then the remaining backwards. The warm-up is what it
 * takes for the first backward to come back: pp-rank-1 forwards with one
 * chunk; with v chunks Megatron's 2*(pp-rank-1) + (v-1)*pp. */
static void gen_1f1b(const cai_pp_spec *sp, int rank, op_list *l) {
    const int p = sp->pp, v = sp->virtual_stages, total = sp->microbatches * v;
    int warm = v == 1 ? p - rank - 1 : 2 * (p - rank - 1) + (v - 1) * p;
    if (warm > total) warm = total;
    int mb, chunk;
    for (int k = 0; k < warm; k++) {
        virtual_step(sp, k, 0, &mb, &chunk);
        put(l, CAI_PP_FORWARD, mb, chunk);
    }
    for (int k = 0; k < total - warm; k++) {
        virtual_step(sp, warm + k, 0, &mb, &chunk);
        put(l, CAI_PP_FORWARD, mb, chunk);
        virtual_step(sp, k, 1, &mb, &chunk);
        put(l, CAI_PP_BACKWARD, mb, chunk);
    }
    for (int k = total - warm; k < total; k++) {
        virtual_step(sp, k, 1, &mb, &chunk);
        put(l, CAI_PP_BACKWARD, mb, chunk);
    }
}

/* The zero-bubble styles are placed by list scheduling on unit times
 * (forward, input-gradient and weight-gradient pass of a chunk: one step
 * each, messages free), the way their paper draws them, under a memory cap
 * of 1f1b's peak, pp microbatches: pp chunk units for zb-h1, 2*pp half-size
 * chunks for zb-v. Weight passes only free memory, so they go where a rank
 * would otherwise wait, or where the cap says memory must be freed first.
 *
 * zb-h1 keeps 1f1b's order of forwards and input passes (pp-rank-1 warm-up
 * forwards, then one forward and one input pass in turn, then the remaining
 * input passes) and places only the weight passes: a rank defers them while
 * forwards still stream in, up to the cap, and its cool-down fills with
 * them. On unit costs and m >= pp the step is 3m + pp - 1 units, the paper's
 * bubble of (pp-1)(F+B-W) per rank, a third of 1f1b's.
 *
 * zb-v is greedy: a free rank takes (1) an input pass whose gradient has
 * arrived (the chain back to stage 0 is the critical path), (2) a forward
 * whose input has arrived, the chunk nearer the loss first, if it fits the
 * cap, (3) the oldest pending weight pass. A chunk-0 forward must also leave
 * one unit free, so that the chunk-1 forward of the oldest microbatch in
 * flight always fits: that microbatch can always reach the loss and free
 * memory, so the placement cannot stall. On unit costs it reaches the bound
 * of the last rank's start (pp-1 forwards) plus its work. */
typedef struct {
    int busy_until;
    int held;
    int next_f[2], next_b[2];
    int pos;            /* zb-h1: next entry of this rank's forward/input-pass order */
    int w_head, w_tail; /* FIFO of done input passes, into wq */
    int done;
} zb_rank;

typedef struct {
    const cai_pp_spec *sp;
    int S, cap;
    const int *f_end, *b_end;
} zb_state;

static int f_ready(const zb_state *z, const zb_rank *k, int r, int c, int t) {
    const int mb = k->next_f[c], s = cai_pp_stage_of(z->sp, r, c);
    const int need = z->sp->virtual_stages == 2 && c == 0 ? 2 : 1;
    return mb < z->sp->microbatches && (s == 0 || z->f_end[mb * z->S + s - 1] <= t) && k->held + need <= z->cap;
}

static int b_ready(const zb_state *z, const zb_rank *k, int r, int c, int t) {
    const int mb = k->next_b[c], s = cai_pp_stage_of(z->sp, r, c);
    return mb < z->sp->microbatches && z->f_end[mb * z->S + s] <= t &&
           (s == z->S - 1 || z->b_end[mb * z->S + s + 1] <= t);
}

/* zb-h1's order: entry i is a forward (1) or an input pass (0). */
static int h1_is_forward(int p, int m, int rank, int i) {
    int warm = p - rank - 1;
    if (warm > m) warm = m;
    if (i < warm) return 1;
    const int j = i - warm; /* then forward warm + j/2, input pass j/2, ... */
    return j % 2 == 0 && warm + j / 2 < m;
}

/* The op rank r starts at step t (CAI_PP_OP_COUNT: none) and its chunk. */
static cai_pp_op zb_pick(const zb_state *z, zb_rank *k, int r, int t, const cai_pp_action *wr, int *chunk) {
    const int v = z->sp->virtual_stages;
    if (v == 1) {
        const int fwd = h1_is_forward(z->sp->pp, z->sp->microbatches, r, k->pos);
        *chunk = 0;
        if (fwd ? f_ready(z, k, r, 0, t) : b_ready(z, k, r, 0, t)) {
            k->pos++;
            return fwd ? CAI_PP_FORWARD : CAI_PP_BACKWARD_INPUT;
        }
    } else {
        int pick = -1;
        for (int c = 0; c < v; c++) /* oldest microbatch, then the deeper stage */
            if (b_ready(z, k, r, c, t) &&
                (pick < 0 || k->next_b[c] < k->next_b[pick] ||
                 (k->next_b[c] == k->next_b[pick] && cai_pp_stage_of(z->sp, r, c) > cai_pp_stage_of(z->sp, r, pick))))
                pick = c;
        if (pick >= 0) {
            *chunk = pick;
            return CAI_PP_BACKWARD_INPUT;
        }
        for (int c = 0; c < v; c++)
            if (f_ready(z, k, r, c, t) && (pick < 0 || cai_pp_stage_of(z->sp, r, c) > cai_pp_stage_of(z->sp, r, pick)))
                pick = c;
        if (pick >= 0) {
            *chunk = pick;
            return CAI_PP_FORWARD;
        }
    }
    if (k->w_head < k->w_tail) { /* every queued input pass ended by t */
        *chunk = wr[k->w_head].chunk;
        return CAI_PP_BACKWARD_WEIGHT;
    }
    return CAI_PP_OP_COUNT;
}

static cai_status gen_zero_bubble(const cai_pp_spec *sp, op_list *lists) {
    const int p = sp->pp, v = sp->virtual_stages, m = sp->microbatches, S = p * v;
    const int per_rank = 3 * m * v;
    int *f_end = NULL, *b_end = NULL;
    zb_rank *rk = NULL;
    cai_pp_action *wq = NULL;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_malloc((void **)&f_end, sizeof(int) * (size_t)m * S, "zero-bubble forward times"), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&b_end, sizeof(int) * (size_t)m * S, "zero-bubble backward times"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&rk, (size_t)p, sizeof *rk, "zero-bubble rank state"), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&wq, sizeof *wq * (size_t)p * m * v, "zero-bubble weight queue"), st, done);
    for (int i = 0; i < m * S; i++) f_end[i] = b_end[i] = INT32_MAX;
    const zb_state z = {sp, S, p * v, f_end, b_end};

    int finished = 0;
    /* Every step some rank starts something unless the placement stalled;
     * the bound only turns a bug into an error instead of a hang. */
    const long long max_t = 4LL * per_rank * p + 16;
    for (int t = 0; finished < p; t++) {
        if (t > max_t) {
            st = CAI_ERROR(CAI_ERR_INTERNAL, "%s placement for pp=%d microbatches=%d stalled at step %d",
                           k_style_names[sp->style], p, m, t);
            goto done;
        }
        for (int r = 0; r < p; r++) {
            zb_rank *k = &rk[r];
            if (k->busy_until > t || k->done == per_rank) continue;
            cai_pp_action *wr = wq + (size_t)r * m * v;
            int c = 0;
            const cai_pp_op op = zb_pick(&z, k, r, t, wr, &c);
            if (op == CAI_PP_OP_COUNT) continue;
            const int s = cai_pp_stage_of(sp, r, c);
            int mb;
            if (op == CAI_PP_FORWARD) {
                mb = k->next_f[c]++;
                f_end[mb * S + s] = t + 1;
                k->held++;
            } else if (op == CAI_PP_BACKWARD_INPUT) {
                mb = k->next_b[c]++;
                b_end[mb * S + s] = t + 1;
                wr[k->w_tail++] = (cai_pp_action){CAI_PP_BACKWARD_WEIGHT, mb, c, -1};
            } else {
                mb = wr[k->w_head++].mb;
                k->held--;
            }
            put(&lists[r], op, mb, c);
            k->busy_until = t + 1;
            if (++k->done == per_rank) finished++;
        }
    }
done:
    cai_free(f_end);
    cai_free(b_end);
    cai_free(rk);
    cai_free(wq);
    return st;
}

/* Copy a compute order into `out`, adding the messages (see the top of
 * colossal/schedule.h); returns the new length. */
static int add_messages(const cai_pp_spec *sp, int rank, const op_list *comp, cai_pp_action *out) {
    const int S = sp->pp * sp->virtual_stages;
    int n = 0;
    for (int i = 0; i < comp->n; i++) {
        const cai_pp_action a = comp->a[i];
        const int s = cai_pp_stage_of(sp, rank, a.chunk);
        const int fwd = a.op == CAI_PP_FORWARD, bwd = a.op == CAI_PP_BACKWARD || a.op == CAI_PP_BACKWARD_INPUT;
        /* The neighbour this compute reads from and the one it feeds. */
        const int from = fwd   ? (s > 0 ? owner_rank(sp, s - 1) : -1)
                         : bwd ? (s < S - 1 ? owner_rank(sp, s + 1) : -1)
                               : -1;
        const int to = fwd ? (s < S - 1 ? owner_rank(sp, s + 1) : -1) : bwd ? (s > 0 ? owner_rank(sp, s - 1) : -1) : -1;
        if (from >= 0 && from != rank)
            out[n++] = (cai_pp_action){fwd ? CAI_PP_RECV_ACT : CAI_PP_RECV_GRAD, a.mb, a.chunk, from};
        out[n++] = a;
        if (to >= 0 && to != rank)
            out[n++] = (cai_pp_action){fwd ? CAI_PP_SEND_ACT : CAI_PP_SEND_GRAD, a.mb, a.chunk, to};
    }
    return n;
}

cai_status cai_pp_schedule_build(const cai_pp_spec *spec, cai_pp_schedule **out) {
    CAI_CHECK_ARG(spec && out, "cai_pp_schedule_build: NULL spec or out");
    *out = NULL;
    CAI_CALL(cai_pp_spec_validate(spec));
    const int p = spec->pp;
    /* Per rank: m*v forwards and backwards (plus m*v weight passes when
     * split), each with at most one RECV before and one SEND after. */
    const size_t pairs = (size_t)spec->microbatches * (size_t)spec->virtual_stages;
    const size_t comp_per_rank = pairs * (is_split(spec->style) ? 3 : 2), cap_per_rank = pairs * 7;
    cai_pp_schedule *s = NULL;
    cai_pp_action *comp = NULL;
    op_list *lists = NULL;
    cai_status st;
    CAI_CALL(schedule_alloc(spec, cap_per_rank * (size_t)p, &s));
    CAI_CALL_GOTO(cai_malloc((void **)&comp, sizeof *comp * comp_per_rank * (size_t)p, "pipeline compute order"), st,
                  fail);
    CAI_CALL_GOTO(cai_calloc((void **)&lists, (size_t)p, sizeof *lists, "pipeline compute lists"), st, fail);
    for (int r = 0; r < p; r++) lists[r].a = comp + comp_per_rank * (size_t)r;
    switch (spec->style) {
    case CAI_PP_GPIPE:
        for (int r = 0; r < p; r++) gen_gpipe(spec, &lists[r]);
        break;
    case CAI_PP_1F1B:
    case CAI_PP_INTERLEAVED:
        for (int r = 0; r < p; r++) gen_1f1b(spec, r, &lists[r]);
        break;
    default: CAI_CALL_GOTO(gen_zero_bubble(spec, lists), st, fail); break;
    }
    for (int r = 0; r < p; r++) {
        if ((size_t)lists[r].n != comp_per_rank) {
            st = CAI_ERROR(CAI_ERR_INTERNAL, "%s generator gave rank %d %d computes, not %zu",
                           k_style_names[spec->style], r, lists[r].n, comp_per_rank);
            goto fail;
        }
        s->list[r] = s->block + cap_per_rank * (size_t)r;
        s->len[r] = add_messages(spec, r, &lists[r], s->list[r]);
    }
    cai_free(comp);
    cai_free(lists);
    *out = s;
    return CAI_OK;
fail:
    cai_free(comp);
    cai_free(lists);
    cai_pp_schedule_free(s);
    return st;
}

/* ------------------------------------------------------------------ check */

/* Per (microbatch, stage) counts and flags, kept while walking the lists. */
typedef struct {
    unsigned char f, bx, bi, w;         /* forwards, fused backwards, input passes, weight passes seen */
    unsigned char sent_act, recv_act;   /* activations sent to / received by this stage */
    unsigned char sent_grad, recv_grad; /* gradients sent to / received by this stage */
} pair_state;

#define BAD(...) CAI_ERROR(CAI_ERR_INVALID_ARG, __VA_ARGS__)

/* An error about action i of `rank`, led by what the action is. Formatted
 * only on failure: the check walks millions of actions in the tests. */
static cai_status bad_at(const cai_pp_spec *sp, int rank, int i, const cai_pp_action *a, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static cai_status bad_at(const cai_pp_spec *sp, int rank, int i, const cai_pp_action *a, const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return BAD("rank %d action %d (%s mb %d chunk %d, stage %d): %s", rank, i, cai_pp_op_name(a->op), a->mb, a->chunk,
               cai_pp_stage_of(sp, rank, a->chunk), why);
}

static cai_status check_fields(const cai_pp_spec *sp, int rank, int i, const cai_pp_action *a) {
    if ((unsigned)a->op >= CAI_PP_OP_COUNT) return BAD("rank %d action %d: op %d is not a pipeline op", rank, i, a->op);
    if (a->mb < 0 || a->mb >= sp->microbatches)
        return BAD("rank %d action %d (%s): microbatch %d is outside [0, %d)", rank, i, cai_pp_op_name(a->op), a->mb,
                   sp->microbatches);
    if (a->chunk < 0 || a->chunk >= sp->virtual_stages)
        return BAD("rank %d action %d (%s mb %d): chunk %d is outside [0, %d)", rank, i, cai_pp_op_name(a->op), a->mb,
                   a->chunk, sp->virtual_stages);
    if (is_compute(a->op) && a->peer != -1)
        return BAD("rank %d action %d (%s mb %d chunk %d): a compute has peer -1, not %d", rank, i,
                   cai_pp_op_name(a->op), a->mb, a->chunk, a->peer);
    if (!is_compute(a->op) && (a->peer < 0 || a->peer >= sp->pp || a->peer == rank))
        return BAD("rank %d action %d (%s mb %d chunk %d): peer %d is not another rank in [0, %d)", rank, i,
                   cai_pp_op_name(a->op), a->mb, a->chunk, a->peer, sp->pp);
    return CAI_OK;
}

/* A SEND/RECV: the stage it crosses to must exist, live on another rank,
 * and that rank must be the peer. */
static cai_status check_route(const cai_pp_spec *sp, int rank, int i, const cai_pp_action *a) {
    const int S = sp->pp * sp->virtual_stages, s = cai_pp_stage_of(sp, rank, a->chunk);
    const int act = a->op == CAI_PP_SEND_ACT || a->op == CAI_PP_RECV_ACT;
    const int send = a->op == CAI_PP_SEND_ACT || a->op == CAI_PP_SEND_GRAD;
    /* Activations flow up the stages, gradients down. */
    const int other = act == send ? s + 1 : s - 1;
    if (other < 0 || other >= S)
        return bad_at(sp, rank, i, a, "stage %d is the %s stage, there is no stage %d to %s", s,
                      other < 0 ? "first" : "last", other, send ? "send to" : "receive from");
    const int o = owner_rank(sp, other);
    if (o == rank)
        return bad_at(sp, rank, i, a, "stage %d is on this rank too, so the data stays local and there is no message",
                      other);
    if (o != a->peer) return bad_at(sp, rank, i, a, "stage %d lives on rank %d, not on peer %d", other, o, a->peer);
    return CAI_OK;
}

/* One rank's list in order: everything that one rank alone gets wrong. */
static cai_status check_rank_order(const cai_pp_spec *sp, int rank, const cai_pp_action *list, int n, pair_state *ps) {
    const int S = sp->pp * sp->virtual_stages;
    for (int i = 0; i < n; i++) {
        const cai_pp_action *a = &list[i];
        CAI_CALL(check_fields(sp, rank, i, a));
        const int s = cai_pp_stage_of(sp, rank, a->chunk);
        pair_state *x = &ps[a->mb * S + s];
        if (!is_compute(a->op)) CAI_CALL(check_route(sp, rank, i, a));
        switch (a->op) {
        case CAI_PP_FORWARD:
            if (x->f) return bad_at(sp, rank, i, a, "a second forward of this microbatch and chunk");
            if (s > 0 && owner_rank(sp, s - 1) == rank && !ps[a->mb * S + s - 1].f)
                return bad_at(sp, rank, i, a, "comes before the forward of stage %d on this rank that it reads", s - 1);
            if (s > 0 && owner_rank(sp, s - 1) != rank && !x->recv_act)
                return bad_at(sp, rank, i, a, "no recv_act from rank %d before it", owner_rank(sp, s - 1));
            x->f = 1;
            break;
        case CAI_PP_BACKWARD:
        case CAI_PP_BACKWARD_INPUT:
            if (x->bx || x->bi) return bad_at(sp, rank, i, a, "a second backward of this microbatch and chunk");
            if (!x->f) return bad_at(sp, rank, i, a, "comes before (or without) its forward");
            if (s < S - 1 && owner_rank(sp, s + 1) == rank) {
                const pair_state *y = &ps[a->mb * S + s + 1];
                if (!y->bx && !y->bi)
                    return bad_at(sp, rank, i, a, "comes before the backward of stage %d on this rank that it reads",
                                  s + 1);
            }
            if (s < S - 1 && owner_rank(sp, s + 1) != rank && !x->recv_grad)
                return bad_at(sp, rank, i, a, "no recv_grad from rank %d before it", owner_rank(sp, s + 1));
            if (a->op == CAI_PP_BACKWARD) x->bx = 1;
            else x->bi = 1;
            break;
        case CAI_PP_BACKWARD_WEIGHT:
            if (x->w) return bad_at(sp, rank, i, a, "a second weight pass of this microbatch and chunk");
            if (x->bx) return bad_at(sp, rank, i, a, "this microbatch and chunk already had a fused backward");
            if (!x->bi) return bad_at(sp, rank, i, a, "comes before (or without) its input-gradient pass");
            x->w = 1;
            break;
        case CAI_PP_SEND_ACT:
            if (!x->f) return bad_at(sp, rank, i, a, "comes before the forward that produces it");
            if (ps[a->mb * S + s + 1].sent_act++) return bad_at(sp, rank, i, a, "these activations were sent already");
            break;
        case CAI_PP_SEND_GRAD:
            if (!x->bx && !x->bi) return bad_at(sp, rank, i, a, "comes before the backward that produces it");
            if (ps[a->mb * S + s - 1].sent_grad++) return bad_at(sp, rank, i, a, "this gradient was sent already");
            break;
        case CAI_PP_RECV_ACT:
            if (x->recv_act++) return bad_at(sp, rank, i, a, "these activations were received already");
            break;
        case CAI_PP_RECV_GRAD:
            if (x->recv_grad++) return bad_at(sp, rank, i, a, "this gradient was received already");
            break;
        default: break;
        }
    }
    return CAI_OK;
}

/* After every list: each (mb, stage) computed exactly once, each message
 * sent once and received once. */
static cai_status check_coverage(const cai_pp_spec *sp, const pair_state *ps, int split_hint) {
    const int S = sp->pp * sp->virtual_stages;
    for (int mb = 0; mb < sp->microbatches; mb++)
        for (int s = 0; s < S; s++) {
            const pair_state *x = &ps[mb * S + s];
            int r, c;
            cai_pp_stage_owner(sp, s, &r, &c);
            if (!x->f) return BAD("rank %d has no forward of mb %d chunk %d (stage %d)", r, mb, c, s);
            if (!x->bx && !x->bi)
                return BAD("rank %d has no %s of mb %d chunk %d (stage %d)", r,
                           split_hint ? "backward_input" : "backward", mb, c, s);
            if (x->bi && !x->w) return BAD("rank %d has no backward_weight of mb %d chunk %d (stage %d)", r, mb, c, s);
            if (s + 1 < S) {
                const int o = owner_rank(sp, s + 1);
                const pair_state *y = &ps[mb * S + s + 1];
                if (o != r && y->sent_act != y->recv_act)
                    return BAD("activations of mb %d from stage %d (rank %d) to stage %d (rank %d) are %s", mb, s, r,
                               s + 1, o, y->sent_act ? "sent but never received" : "received but never sent");
            }
            if (s > 0) {
                const int o = owner_rank(sp, s - 1);
                const pair_state *y = &ps[mb * S + s - 1];
                if (o != r && y->sent_grad != y->recv_grad)
                    return BAD("the gradient of mb %d from stage %d (rank %d) to stage %d (rank %d) is %s", mb, s, r,
                               s - 1, o, y->sent_grad ? "sent but never received" : "received but never sent");
            }
        }
    return CAI_OK;
}

static cai_status costs_of(const cai_pp_costs *in, cai_pp_costs *out) {
    static const cai_pp_costs unit = {1, 1, 1, 0};
    *out = in ? *in : unit;
    if (!(isfinite(out->f) && isfinite(out->b) && isfinite(out->w) && isfinite(out->comm) && out->f > 0 && out->b > 0 &&
          out->w >= 0 && out->comm >= 0))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "pipeline costs f=%g b=%g w=%g comm=%g: f and b must be > 0, w and comm >= 0, all finite",
                         out->f, out->b, out->w, out->comm);
    return CAI_OK;
}

static double duration(const cai_pp_costs *c, cai_pp_op op) {
    switch (op) {
    case CAI_PP_FORWARD: return c->f;
    case CAI_PP_BACKWARD: return c->b + c->w;
    case CAI_PP_BACKWARD_INPUT: return c->b;
    case CAI_PP_BACKWARD_WEIGHT: return c->w;
    default: return 0;
    }
}

/* Run the lists with event times. A message's arrival time is kept per
 * (direction, mb, receiving stage); -1 until it is sent. dur (NULL: by op
 * from c) gives each compute action its own time. start/end (NULL or one
 * entry per action of s->block) receive each action's times. */
static cai_status simulate(const cai_pp_schedule *s, const cai_pp_costs *c, const double *const *dur, double *start,
                           double *end, cai_pp_stats *st) {
    const cai_pp_spec *sp = &s->spec;
    const int p = sp->pp, S = p * sp->virtual_stages, m = sp->microbatches;
    double *arrive = NULL, *clock = NULL, *last = NULL;
    int *pc = NULL;
    cai_status rc = CAI_OK;
    CAI_CALL_GOTO(cai_malloc((void **)&arrive, sizeof(double) * 2 * (size_t)m * S, "message arrival times"), rc, done);
    CAI_CALL_GOTO(cai_calloc((void **)&clock, (size_t)p, sizeof(double), "rank clocks"), rc, done);
    CAI_CALL_GOTO(cai_calloc((void **)&last, (size_t)p, sizeof(double), "rank end times"), rc, done);
    CAI_CALL_GOTO(cai_calloc((void **)&pc, (size_t)p, sizeof(int), "rank positions"), rc, done);
    for (size_t i = 0; i < 2 * (size_t)m * S; i++) arrive[i] = -1;

    double busy = 0;
    int left = p;
    for (int r = 0; r < p; r++)
        if (s->len[r] == 0) left--;
    while (left > 0) {
        int moved = 0;
        for (int r = 0; r < p; r++) {
            while (pc[r] < s->len[r]) {
                const cai_pp_action *a = &s->list[r][pc[r]];
                const size_t at = (size_t)(a - s->block);
                const int tag = cai_pp_action_tag(sp, r, a);
                if (a->op == CAI_PP_RECV_ACT || a->op == CAI_PP_RECV_GRAD) {
                    if (arrive[tag] < 0) break; /* not sent yet */
                    if (arrive[tag] > clock[r]) clock[r] = arrive[tag];
                } else if (!is_compute(a->op)) {
                    arrive[tag] = clock[r] + c->comm;
                }
                if (start) start[at] = clock[r];
                if (is_compute(a->op)) {
                    const double d = dur ? dur[r][pc[r]] : duration(c, a->op);
                    clock[r] += d;
                    busy += d;
                    last[r] = clock[r];
                }
                if (end) end[at] = clock[r];
                moved = 1;
                if (++pc[r] == s->len[r]) left--;
            }
        }
        if (!moved) {
            char msg[1024];
            size_t used = 0;
            int shown = 0;
            for (int r = 0; r < p && used < sizeof msg; r++) {
                if (pc[r] >= s->len[r]) continue;
                if (shown == 8) {
                    snprintf(msg + used, sizeof msg - used, "; ...");
                    break;
                }
                const cai_pp_action *a = &s->list[r][pc[r]];
                int w =
                    snprintf(msg + used, sizeof msg - used, "%srank %d at action %d (%s mb %d chunk %d from rank %d)",
                             shown ? "; " : "", r, pc[r], cai_pp_op_name(a->op), a->mb, a->chunk, a->peer);
                used += w > 0 ? (size_t)w : 0;
                shown++;
            }
            rc =
                BAD("pipeline schedule %s (pp=%d, microbatches=%d) deadlocks: every unfinished rank waits for a "
                    "message that is never sent: %s",
                    k_style_names[sp->style], p, m, msg);
            goto done;
        }
    }
    if (st) {
        memset(st, 0, sizeof *st);
        for (int r = 0; r < p; r++)
            if (last[r] > st->makespan) st->makespan = last[r];
        st->busy = busy;
        st->bubble = st->makespan > 0 ? 1.0 - busy / ((double)p * st->makespan) : 0;
        st->peak_inflight = -1;
        for (int r = 0; r < p; r++) {
            const int k = cai_pp_schedule_peak_inflight(s, r);
            if (k > st->peak_inflight) {
                st->peak_inflight = k;
                st->peak_rank = r;
            }
        }
    }
done:
    cai_free(arrive);
    cai_free(clock);
    cai_free(last);
    cai_free(pc);
    return rc;
}

static cai_status check_lists(const cai_pp_schedule *s) {
    const cai_pp_spec *sp = &s->spec;
    const size_t pairs = (size_t)sp->microbatches * (size_t)sp->pp * (size_t)sp->virtual_stages;
    pair_state *ps = NULL;
    cai_status st;
    CAI_CALL(cai_calloc((void **)&ps, pairs, sizeof *ps, "pipeline check state"));
    for (int r = 0; r < sp->pp; r++) CAI_CALL_GOTO(check_rank_order(sp, r, s->list[r], s->len[r], ps), st, done);
    CAI_CALL_GOTO(check_coverage(sp, ps, is_split(sp->style)), st, done);
done:
    cai_free(ps);
    return st;
}

static cai_status check_and_run(const cai_pp_schedule *s, const cai_pp_costs *costs, cai_pp_costs *c, double *start,
                                double *end, cai_pp_stats *out) {
    CAI_CHECK_ARG(s, "pipeline schedule check: NULL schedule");
    CAI_CALL(cai_pp_spec_validate(&s->spec));
    CAI_CALL(costs_of(costs, c));
    CAI_CALL(check_lists(s));
    CAI_CALL(simulate(s, c, NULL, start, end, out));
    return CAI_OK;
}

cai_status cai_pp_schedule_check(const cai_pp_schedule *s, const cai_pp_costs *costs, cai_pp_stats *out) {
    cai_pp_costs c;
    CAI_CALL(check_and_run(s, costs, &c, NULL, NULL, out));
    return CAI_OK;
}

cai_status cai_pp_schedule_replay(const cai_pp_schedule *s, const double *const *dur, double comm, cai_pp_stats *out) {
    CAI_CHECK_ARG(s && dur, "cai_pp_schedule_replay: NULL argument");
    const cai_pp_costs c = {1, 1, 1, comm};
    cai_pp_costs checked;
    CAI_CALL(cai_pp_spec_validate(&s->spec));
    CAI_CALL(costs_of(&c, &checked));
    for (int r = 0; r < s->spec.pp; r++)
        for (int i = 0; i < s->len[r]; i++)
            if (is_compute(s->list[r][i].op) && !(isfinite(dur[r][i]) && dur[r][i] >= 0))
                return BAD(
                    "pipeline replay: rank %d action %d (%s mb %d chunk %d) lasts %g; durations must be finite "
                    "and >= 0",
                    r, i, cai_pp_op_name(s->list[r][i].op), s->list[r][i].mb, s->list[r][i].chunk, dur[r][i]);
    CAI_CALL(check_lists(s));
    CAI_CALL(simulate(s, &checked, dur, NULL, NULL, out));
    return CAI_OK;
}

int cai_pp_bubble_formula(const cai_pp_spec *spec, double *out, const char **text) {
    /* Quietly: a caller asking for a formula has no error to report. */
    if (!spec || spec->pp < 1 || spec->microbatches < 1 || spec->virtual_stages < 1) return 0;
    const double p = spec->pp, m = spec->microbatches, v = spec->virtual_stages;
    double b;
    const char *t;
    switch (spec->style) {
    case CAI_PP_GPIPE:
    case CAI_PP_1F1B:
        b = (p - 1) / (m + p - 1);
        t = "(p-1)/(m+p-1)";
        break;
    case CAI_PP_INTERLEAVED:
        b = (p - 1) / (v * m + p - 1);
        t = "(p-1)/(v*m+p-1)";
        break;
    default: return 0;
    }
    if (out) *out = b;
    if (text) *text = t;
    return 1;
}

/* ------------------------------------------------------------------ timeline */

/* One past the last action's offset in s->block: build leaves room between
 * the lists, from_lists packs them, and either way the last list ends last. */
static size_t times_span(const cai_pp_schedule *s) {
    const int last = s->spec.pp - 1;
    return (size_t)(s->list[last] - s->block) + (size_t)s->len[last];
}

/* Check and simulate s into per-action times: *times holds the starts, then
 * (times_span later) the ends, indexed by offset in s->block. */
static cai_status timed(const cai_pp_schedule *s, const cai_pp_costs *costs, cai_pp_costs *c, double **times,
                        cai_pp_stats *st) {
    *times = NULL;
    CAI_CHECK_ARG(s, "pipeline schedule: NULL schedule");
    const size_t n = times_span(s);
    cai_status rc;
    CAI_CALL(cai_malloc((void **)times, sizeof(double) * 2 * (n ? n : 1), "pipeline action times"));
    CAI_CALL_GOTO(check_and_run(s, costs, c, *times, *times + n, st), rc, fail);
    return CAI_OK;
fail:
    cai_free(*times);
    *times = NULL;
    return rc;
}

#define TIMELINE_TEXT_WIDTH 120
#define TIMELINE_MAX_COLUMNS 10000
#define TIMELINE_MAX_BYTES (64.0 * 1024 * 1024)

cai_status cai_pp_schedule_print_timeline(const cai_pp_schedule *s, const cai_pp_costs *costs, FILE *out) {
    CAI_CHECK_ARG(s && out, "cai_pp_schedule_print_timeline: NULL schedule or stream");
    cai_pp_costs c;
    cai_pp_stats st;
    double *times = NULL;
    char *row = NULL;
    cai_status rc = CAI_OK;
    CAI_CALL(timed(s, costs, &c, &times, &st));
    const cai_pp_spec *sp = &s->spec;
    const size_t n_times = times_span(s);
    const double *t0 = times, *t1 = times + n_times;

    /* One cell is the shortest compute that takes time, so each compute
     * covers a whole number of cells when the costs are multiples of it. */
    double unit = 0;
    const cai_pp_op used[3] = {CAI_PP_FORWARD, is_split(sp->style) ? CAI_PP_BACKWARD_INPUT : CAI_PP_BACKWARD,
                               CAI_PP_BACKWARD_WEIGHT};
    for (int i = 0; i < (is_split(sp->style) ? 3 : 2); i++) {
        const double d = duration(&c, used[i]);
        if (d > 0 && (unit == 0 || d < unit)) unit = d;
    }
    int width = 3;
    char label[48];
    for (int r = 0; r < sp->pp; r++)
        for (int i = 0; i < s->len[r]; i++) {
            const int w = (int)strlen(cai_pp_action_label(&s->list[r][i], sp->virtual_stages, label, sizeof label));
            if (is_compute(s->list[r][i].op) && w + 1 > width) width = w + 1;
        }
    /* Costs far apart (or a huge pipeline) would make a picture nobody reads:
     * then columns widen, and computes shorter than one overwrite each other. */
    long cells = (long)ceil(st.makespan / unit - 1e-9);
    const double max_cells = fmin(TIMELINE_MAX_COLUMNS, TIMELINE_MAX_BYTES / ((double)sp->pp * width));
    const int coarse = cells > max_cells;
    if (coarse) {
        cells = max_cells >= 1 ? (long)max_cells : 1;
        unit = st.makespan / (double)cells;
    }
    const size_t row_len = (size_t)cells * (size_t)width;
    CAI_CALL_GOTO(cai_malloc((void **)&row, (size_t)sp->pp * (row_len + 1), "timeline rows"), rc, done);
    for (int r = 0; r < sp->pp; r++) {
        char *line = row + (size_t)r * (row_len + 1);
        for (long k = 0; k < cells; k++) {
            memset(line + k * width, ' ', (size_t)width);
            line[k * width] = '.';
        }
        line[row_len] = 0;
        for (int i = 0; i < s->len[r]; i++) {
            const cai_pp_action *a = &s->list[r][i];
            const size_t at = (size_t)(a - s->block);
            if (!is_compute(a->op) || t1[at] <= t0[at]) continue;
            long k0 = lround(t0[at] / unit), k1 = lround(t1[at] / unit);
            if (k1 <= k0) k1 = k0 + 1;
            if (k1 > cells) k1 = cells;
            if (k0 >= cells) continue;
            char *cell = line + k0 * width;
            memset(cell, '-', (size_t)(k1 - k0) * (size_t)width);
            memset(cell, ' ', (size_t)width);
            for (long k = k0 + 1; k <= k1; k++) line[k * width - 1] = ' ';
            cai_pp_action_label(a, sp->virtual_stages, label, sizeof label);
            memcpy(cell, label, strlen(label));
        }
    }
    fprintf(out, "schedule %s: pp %d, %d chunk%s per rank, %d microbatch%s; per-chunk costs f %g b %g w %g comm %g%s\n",
            cai_pp_style_name(sp->style), sp->pp, sp->virtual_stages, sp->virtual_stages == 1 ? "" : "s",
            sp->microbatches, sp->microbatches == 1 ? "" : "es", c.f, c.b, c.w, c.comm,
            is_split(sp->style) ? "" : " (a backward takes b+w)");
    fprintf(out, "timeline: one column = %g time unit%s%s; F forward, B backward%s, '.' idle\n", unit,
            unit == 1 ? "" : "s", coarse ? " (coarsened: shorter computes are drawn over each other)" : "",
            is_split(sp->style) ? " (input gradient), W weight gradient" : "");
    const long per_block = TIMELINE_TEXT_WIDTH / width > 0 ? TIMELINE_TEXT_WIDTH / width : 1;
    for (long k = 0; k < cells; k += per_block) {
        const long n = cells - k < per_block ? cells - k : per_block;
        fprintf(out, "  t=%g\n", (double)k * unit);
        for (int r = 0; r < sp->pp; r++) {
            const char *line = row + (size_t)r * (row_len + 1) + (size_t)k * width;
            fprintf(out, "  rank %2d |%.*s\n", r, (int)(n * width), line);
        }
    }
    double textbook;
    const char *formula;
    fprintf(out, "makespan: %.12g\n", st.makespan);
    if (cai_pp_bubble_formula(sp, &textbook, &formula))
        fprintf(out, "bubble: %.12g simulated (%.2f%%), %.12g textbook %s\n", st.bubble, 100 * st.bubble, textbook,
                formula);
    else
        fprintf(out, "bubble: %.12g simulated (%.2f%%), no textbook formula for %s\n", st.bubble, 100 * st.bubble,
                cai_pp_style_name(sp->style));
    fprintf(out, "peak in-flight microbatches (chunk activations held) per rank:");
    for (int r = 0; r < sp->pp; r++) fprintf(out, " %d", cai_pp_schedule_peak_inflight(s, r));
    fprintf(out, "; max %d on rank %d\n", st.peak_inflight, st.peak_rank);
    if (ferror(out)) rc = CAI_ERROR(CAI_ERR_IO, "writing the pipeline timeline failed");
done:
    cai_free(times);
    cai_free(row);
    return rc;
}

/* ------------------------------------------------------------------ Chrome trace */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

cai_status cai_pp_write_chrome_trace(const char *path, const cai_pp_trace_event *ev, size_t n) {
    return cai_pp_write_chrome_trace_meta(path, ev, n, NULL, 0);
}

cai_status cai_pp_write_chrome_trace_meta(const char *path, const cai_pp_trace_event *ev, size_t n,
                                          const cai_pp_trace_meta *meta, size_t n_meta) {
    CAI_CHECK_ARG(path && (ev || n == 0) && (meta || n_meta == 0), "cai_pp_write_chrome_trace: NULL path or events");
    for (size_t i = 0; i < n_meta; i++)
        CAI_CHECK_ARG(meta[i].key && isfinite(meta[i].value),
                      "trace metadata %zu (%s): needs a key and a finite value (got %g)", i,
                      meta[i].key ? meta[i].key : "NULL", meta[i].value);
    int ranks = 0;
    for (size_t i = 0; i < n; i++) {
        const cai_pp_trace_event *e = &ev[i];
        CAI_CHECK_ARG(e->rank >= 0 && e->name, "trace event %zu: rank %d, name %s: needs a rank >= 0 and a name", i,
                      e->rank, e->name ? e->name : "NULL");
        CAI_CHECK_ARG(isfinite(e->start) && isfinite(e->end) && e->end >= e->start,
                      "trace event %zu (%s): start %g and end %g must be finite, end >= start", i, e->name, e->start,
                      e->end);
        if (e->rank + 1 > ranks) ranks = e->rank + 1;
    }
    /* Ranks without events get no thread name: a viewer shows no row for them. */
    unsigned char *seen = NULL;
    char *tmp = NULL;
    cai_status st = CAI_OK;
    const size_t tlen = strlen(path) + 8;
    CAI_CALL_GOTO(cai_calloc((void **)&seen, (size_t)ranks + 1, 1, "trace ranks"), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&tmp, tlen, "trace file name"), st, done);
    for (size_t i = 0; i < n; i++) seen[ev[i].rank] = 1;
    snprintf(tmp, tlen, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        st = CAI_ERROR(CAI_ERR_IO, "cannot write the trace %s: %s", tmp, strerror(errno));
        goto done;
    }
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": \"pipeline\"}}");
    for (int r = 0; r < ranks; r++)
        if (seen[r])
            fprintf(f,
                    ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": \"pp "
                    "rank %d\"}}",
                    r, r);
    for (size_t i = 0; i < n; i++) {
        const cai_pp_trace_event *e = &ev[i];
        fprintf(f, ",\n{\"name\": ");
        json_string(f, e->name);
        if (e->cat) {
            fprintf(f, ", \"cat\": ");
            json_string(f, e->cat);
        }
        fprintf(f, ", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {", e->rank,
                e->start * 1e6, (e->end - e->start) * 1e6);
        if (e->mb >= 0) fprintf(f, "\"mb\": %d", e->mb);
        if (e->chunk >= 0) fprintf(f, "%s\"chunk\": %d", e->mb >= 0 ? ", " : "", e->chunk);
        fprintf(f, "}}");
    }
    fprintf(f, "\n]");
    if (n_meta) {
        fprintf(f, ",\n\"otherData\": {");
        for (size_t i = 0; i < n_meta; i++) {
            fprintf(f, "%s", i ? ", " : "");
            json_string(f, meta[i].key);
            fprintf(f, ": %.9g", meta[i].value);
        }
        fprintf(f, "}");
    }
    fprintf(f, "}\n");
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad) st = CAI_ERROR(CAI_ERR_IO, "writing the trace %s failed: %s", tmp, strerror(errno));
    else if (rename(tmp, path) != 0)
        st = CAI_ERROR(CAI_ERR_IO, "rename %s -> %s failed: %s", tmp, path, strerror(errno));
    if (st != CAI_OK) remove(tmp);
done:
    cai_free(seen);
    cai_free(tmp);
    return st;
}

cai_status cai_pp_schedule_write_chrome_trace(const cai_pp_schedule *s, const cai_pp_costs *costs, const char *path) {
    CAI_CHECK_ARG(s && path, "cai_pp_schedule_write_chrome_trace: NULL schedule or path");
    cai_pp_costs c;
    double *times = NULL;
    cai_pp_trace_event *ev = NULL;
    char *names = NULL;
    cai_status st = CAI_OK;
    CAI_CALL(timed(s, costs, &c, &times, NULL));
    const size_t n_times = times_span(s);
    size_t n = 0;
    for (int r = 0; r < s->spec.pp; r++)
        for (int i = 0; i < s->len[r]; i++) n += is_compute(s->list[r][i].op);
    enum { NAME_CAP = 24 };
    CAI_CALL_GOTO(cai_malloc((void **)&ev, sizeof *ev * (n ? n : 1), "trace events"), st, done);
    CAI_CALL_GOTO(cai_malloc((void **)&names, (size_t)NAME_CAP * (n ? n : 1), "trace event names"), st, done);
    size_t k = 0;
    for (int r = 0; r < s->spec.pp; r++)
        for (int i = 0; i < s->len[r]; i++) {
            const cai_pp_action *a = &s->list[r][i];
            if (!is_compute(a->op)) continue;
            const size_t at = (size_t)(a - s->block);
            char *name = names + k * NAME_CAP;
            cai_pp_action_label(a, s->spec.virtual_stages, name, NAME_CAP);
            ev[k] =
                (cai_pp_trace_event){r, name, cai_pp_op_name(a->op), times[at], times[n_times + at], a->mb, a->chunk};
            k++;
        }
    CAI_CALL_GOTO(cai_pp_write_chrome_trace(path, ev, n), st, done);
done:
    cai_free(times);
    cai_free(ev);
    cai_free(names);
    return st;
}
