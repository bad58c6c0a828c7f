/* Pipeline schedules without a model: every generated list passes the
 * simulating check for pp <= 16 and microbatches <= 64, computes each
 * (microbatch, chunk) once, holds no more activations than its style
 * promises, and its simulated bubble equals the textbook formula; lists
 * broken on purpose are refused with a message naming what is wrong; bad
 * specs are refused naming what would fit; the timeline and the Chrome trace
 * say what the simulation found. */
#include "cai_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>

#include "colossal/schedule.h"

#define OK(expr)                                                                   \
    do {                                                                           \
        cai_status st_ = (expr);                                                   \
        ck_assert_msg(st_ == CAI_OK, "%s failed: %s", #expr, cai_error_message()); \
    } while (0)

/* expr must fail with `want` and a message containing each of the
 * NULL-terminated fragments. */
static void refused(cai_status got, cai_status want, const char *expr, const char *const *frags) {
    ck_assert_msg(got == want, "%s: status %s, expected %s (%s)", expr, cai_status_str(got), cai_status_str(want),
                  cai_error_message());
    for (int i = 0; frags[i]; i++)
        ck_assert_msg(strstr(cai_error_message(), frags[i]), "%s: message '%s' lacks '%s'", expr, cai_error_message(),
                      frags[i]);
    cai_error_clear();
}

/* Check records every passing ck_assert (a write per call), so the sweeps
 * test with plain conditions and only call into Check to fail. */
#define REQUIRE(cond, ...)                      \
    do {                                        \
        if (!(cond)) ck_abort_msg(__VA_ARGS__); \
    } while (0)
#define REQUIRE_EQ(a, b) \
    REQUIRE((a) == (b), "%s:%d: %s == %d, expected %s == %d", __FILE__, __LINE__, #a, (int)(a), #b, (int)(b))

#define REFUSED(expr, want, ...) refused((expr), (want), #expr, (const char *const[]){__VA_ARGS__, NULL})

static cai_pp_spec spec_of(cai_pp_style style, int pp, int v, int m) {
    cai_pp_spec s = {pp, v, m, style};
    return s;
}

/* ------------------------------------------------------------------ names and specs */

START_TEST(names_round_trip) {
    cai_pp_style s;
    for (int i = 0; i < CAI_PP_STYLE_COUNT; i++) {
        OK(cai_pp_style_parse(cai_pp_style_name((cai_pp_style)i), &s));
        ck_assert_int_eq(s, i);
    }
    OK(cai_pp_style_parse("ZBH1", &s));
    ck_assert_int_eq(s, CAI_PP_ZB_H1);
    OK(cai_pp_style_parse("zbv", &s));
    ck_assert_int_eq(s, CAI_PP_ZB_V);
    OK(cai_pp_style_parse("Interleaved", &s));
    ck_assert_int_eq(s, CAI_PP_INTERLEAVED);
    REFUSED(cai_pp_style_parse("pipedream", &s), CAI_ERR_CONFIG, "'pipedream'", "gpipe", "1f1b", "interleaved", "zb-h1",
            "zbh1", "zb-v", "zbv");
    ck_assert_int_eq(cai_pp_style_default_virtual(CAI_PP_INTERLEAVED), 2);
    ck_assert_int_eq(cai_pp_style_default_virtual(CAI_PP_ZB_V), 2);
    ck_assert_int_eq(cai_pp_style_default_virtual(CAI_PP_1F1B), 1);
    ck_assert_str_eq(cai_pp_op_name(CAI_PP_BACKWARD_WEIGHT), "backward_weight");
}
END_TEST

START_TEST(bad_specs_name_what_fits) {
    cai_pp_schedule *s = (cai_pp_schedule *)&s; /* must come back NULL */
    cai_pp_spec sp = spec_of(CAI_PP_1F1B, 0, 1, 8);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "pp must be at least 1", "got 0");
    ck_assert_ptr_null(s);
    sp = spec_of(CAI_PP_GPIPE, 4, 1, 0);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "microbatches must be at least 1");
    sp = spec_of(CAI_PP_1F1B, 4, 2, 8);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "1f1b has one chunk per rank", "got 2", "interleaved");
    sp = spec_of(CAI_PP_ZB_H1, 4, 2, 8);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "zb-h1 has one chunk per rank");
    sp = spec_of(CAI_PP_ZB_V, 4, 3, 8);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "zb-v has exactly 2 chunks", "got 3");
    sp = spec_of(CAI_PP_INTERLEAVED, 4, 1, 8);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "interleaved needs virtual stages >= 2", "use 1f1b");
    sp = spec_of(CAI_PP_INTERLEAVED, 1, 2, 8);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "interleaved needs pp >= 2");
    sp = spec_of(CAI_PP_INTERLEAVED, 4, 2, 10);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "multiple of pp=4", "got 10", "8 or 12 would fit");
    sp = spec_of(CAI_PP_INTERLEAVED, 4, 2, 3);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "multiple of pp=4", "got 3", "4 or 8 would fit");
    sp = spec_of(CAI_PP_1F1B, 1024, 1, 4096);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "4194304", "at most 1048576");
    sp = spec_of((cai_pp_style)17, 4, 1, 8);
    REFUSED(cai_pp_schedule_build(&sp, &s), CAI_ERR_CONFIG, "style 17");
    ck_assert_ptr_null(s);
    /* Every style but interleaved takes fewer microbatches than stages. */
    for (int st = 0; st < CAI_PP_STYLE_COUNT; st++) {
        if (st == CAI_PP_INTERLEAVED) continue;
        sp = spec_of((cai_pp_style)st, 8, cai_pp_style_default_virtual((cai_pp_style)st), 3);
        OK(cai_pp_spec_validate(&sp));
    }
}
END_TEST

START_TEST(stages_and_owners) {
    for (int p = 1; p <= 6; p++)
        for (int st = 0; st < CAI_PP_STYLE_COUNT; st++) {
            const int v = st == CAI_PP_INTERLEAVED ? 3 : cai_pp_style_default_virtual((cai_pp_style)st);
            cai_pp_spec sp = spec_of((cai_pp_style)st, p, v, p);
            int seen[64] = {0};
            for (int r = 0; r < p; r++)
                for (int c = 0; c < v; c++) {
                    const int s = cai_pp_stage_of(&sp, r, c);
                    ck_assert_int_ge(s, 0);
                    ck_assert_int_lt(s, p * v);
                    seen[s]++;
                    if (st == CAI_PP_INTERLEAVED) ck_assert_int_eq(s, c * p + r);
                    if (st == CAI_PP_ZB_V) ck_assert_int_eq(s, c == 0 ? r : 2 * p - 1 - r);
                    int rr, cc;
                    cai_pp_stage_owner(&sp, s, &rr, &cc);
                    ck_assert_int_eq(rr, r);
                    ck_assert_int_eq(cc, c);
                }
            for (int s = 0; s < p * v; s++) ck_assert_int_eq(seen[s], 1);
            int rr, cc;
            cai_pp_stage_owner(&sp, p * v, &rr, &cc);
            ck_assert_int_eq(rr, -1);
            ck_assert_int_eq(cc, -1);
            ck_assert_int_eq(cai_pp_stage_of(&sp, p, 0), -1);
            ck_assert_int_eq(cai_pp_stage_of(&sp, 0, v), -1);
        }
}
END_TEST

/* ------------------------------------------------------------------ properties of generated lists */

/* What the lists themselves say, counted here without the library's check:
 * each (mb, chunk) forwarded once and backwarded once (fused, or input and
 * weight passes once each, the style's way), messages where the stage
 * boundary crosses ranks and nowhere else, each RECV right before the compute
 * that reads it and each SEND right after the one that makes it, and a tag
 * shared by exactly one SEND and one RECV. */
static void lists_are_well_formed(const cai_pp_schedule *s) {
    const cai_pp_spec *sp = cai_pp_schedule_spec(s);
    const int p = sp->pp, v = sp->virtual_stages, m = sp->microbatches, S = p * v;
    const int split = sp->style == CAI_PP_ZB_H1 || sp->style == CAI_PP_ZB_V;
    int *count = calloc((size_t)m * S * CAI_PP_OP_COUNT, sizeof(int));
    int *tags = calloc((size_t)2 * m * S, sizeof(int));
    REQUIRE(count && tags, "out of memory");
    int sends = 0, recvs = 0, crossings = 0;
    for (int r = 0; r < p; r++) {
        const int n = cai_pp_schedule_len(s, r);
        const cai_pp_action *a = cai_pp_schedule_actions(s, r);
        for (int i = 0; i < n; i++) {
            const int stage = cai_pp_stage_of(sp, r, a[i].chunk);
            REQUIRE(stage >= 0, "rank %d action %d: chunk %d", r, i, a[i].chunk);
            count[(a[i].mb * S + stage) * CAI_PP_OP_COUNT + a[i].op]++;
            if (a[i].op >= CAI_PP_SEND_ACT) {
                const int tag = cai_pp_action_tag(sp, r, &a[i]);
                REQUIRE(tag >= 0 && tag < 2 * m * S, "rank %d action %d: tag %d", r, i, tag);
                const int is_send = a[i].op == CAI_PP_SEND_ACT || a[i].op == CAI_PP_SEND_GRAD;
                tags[tag] += is_send ? 1 : 16;
                sends += is_send;
                recvs += !is_send;
                /* RECV before its consumer, SEND after its producer. */
                const cai_pp_action *next = is_send ? &a[i - 1] : &a[i + 1];
                REQUIRE((is_send ? i - 1 : n - 2 - i) >= 0, "rank %d action %d: a message at the list's end", r, i);
                REQUIRE_EQ(next->mb, a[i].mb);
                REQUIRE_EQ(next->chunk, a[i].chunk);
                const int act = a[i].op == CAI_PP_SEND_ACT || a[i].op == CAI_PP_RECV_ACT;
                if (act) REQUIRE_EQ(next->op, CAI_PP_FORWARD);
                else REQUIRE_EQ(next->op, split ? CAI_PP_BACKWARD_INPUT : CAI_PP_BACKWARD);
            } else {
                REQUIRE_EQ(a[i].peer, -1);
            }
        }
    }
    for (int mb = 0; mb < m; mb++)
        for (int st = 0; st < S; st++) {
            const int *c = count + (mb * S + st) * CAI_PP_OP_COUNT;
            REQUIRE_EQ(c[CAI_PP_FORWARD], 1);
            REQUIRE_EQ(c[CAI_PP_BACKWARD], !split);
            REQUIRE_EQ(c[CAI_PP_BACKWARD_INPUT], split);
            REQUIRE_EQ(c[CAI_PP_BACKWARD_WEIGHT], split);
            if (st + 1 < S) {
                int r0, r1;
                cai_pp_stage_owner(sp, st, &r0, NULL);
                cai_pp_stage_owner(sp, st + 1, &r1, NULL);
                crossings += r0 != r1;
            }
        }
    /* One activation and one gradient message per crossing and microbatch. */
    REQUIRE_EQ(sends, 2 * crossings);
    REQUIRE_EQ(recvs, 2 * crossings);
    for (int t = 0; t < 2 * m * S; t++) REQUIRE(tags[t] == 0 || tags[t] == 17, "tag %d used %d", t, tags[t]);
    free(count);
    free(tags);
}

static int max_peak(const cai_pp_schedule *s) {
    int best = 0;
    for (int r = 0; r < cai_pp_schedule_spec(s)->pp; r++) {
        const int k = cai_pp_schedule_peak_inflight(s, r);
        if (k > best) best = k;
    }
    return best;
}

static cai_pp_schedule *built(cai_pp_style style, int p, int v, int m) {
    cai_pp_spec sp = spec_of(style, p, v, m);
    cai_pp_schedule *s = NULL;
    cai_status st = cai_pp_schedule_build(&sp, &s);
    REQUIRE(st == CAI_OK, "%s pp=%d v=%d m=%d: %s", cai_pp_style_name(style), p, v, m, cai_error_message());
    return s;
}

static void passes_check(const cai_pp_schedule *s, cai_pp_stats *stats) {
    const cai_pp_spec *sp = cai_pp_schedule_spec(s);
    cai_status st = cai_pp_schedule_check(s, NULL, stats);
    REQUIRE(st == CAI_OK, "%s pp=%d v=%d m=%d: %s", cai_pp_style_name(sp->style), sp->pp, sp->virtual_stages,
            sp->microbatches, cai_error_message());
}

/* Every style, pp 1..16 (interleaved from 2), microbatches 1..64 (interleaved:
 * the multiples of pp) and 2..4 chunks for interleaved. The full structural
 * walk runs on a subset (it is O(m*S) per schedule); build + check on all. */
START_TEST(every_schedule_passes) {
    int schedules = 0;
    for (int p = 1; p <= 16; p++)
        for (int m = 1; m <= 64; m++) {
            const int walk = p <= 4 || m % 7 == 0 || m == p;
            cai_pp_stats gp, f1, zh, zv;
            cai_pp_schedule *g = built(CAI_PP_GPIPE, p, 1, m), *o = built(CAI_PP_1F1B, p, 1, m);
            cai_pp_schedule *h = built(CAI_PP_ZB_H1, p, 1, m), *z = built(CAI_PP_ZB_V, p, 2, m);
            passes_check(g, &gp);
            passes_check(o, &f1);
            passes_check(h, &zh);
            passes_check(z, &zv);
            if (walk) {
                lists_are_well_formed(g);
                lists_are_well_formed(o);
                lists_are_well_formed(h);
                lists_are_well_formed(z);
            }
            /* GPipe holds every microbatch; 1F1B at most pp - rank on rank r. */
            REQUIRE_EQ(max_peak(g), m);
            for (int r = 0; r < p; r++) {
                REQUIRE_EQ(cai_pp_schedule_peak_inflight(g, r), m);
                const int want = m < p - r ? m : p - r;
                REQUIRE_EQ(cai_pp_schedule_peak_inflight(o, r), want);
                /* ZB-H1's cap: 1F1B's peak, on every rank. */
                REQUIRE(cai_pp_schedule_peak_inflight(h, r) <= f1.peak_inflight, "zb-h1 pp=%d m=%d rank %d: peak %d", p,
                        m, r, cai_pp_schedule_peak_inflight(h, r));
                /* ZB-V: 2*pp half-size chunks, the same memory. */
                REQUIRE(cai_pp_schedule_peak_inflight(z, r) <= 2 * f1.peak_inflight, "zb-v pp=%d m=%d rank %d: peak %d",
                        p, m, r, cai_pp_schedule_peak_inflight(z, r));
            }
            REQUIRE_EQ(zh.peak_inflight, f1.peak_inflight);
            REQUIRE_EQ(gp.peak_inflight, m);
            /* Splitting the backward never makes the unit-cost step longer. */
            REQUIRE(zh.makespan <= f1.makespan + 1e-9, "zb-h1 pp=%d m=%d: makespan %g > 1f1b's %g", p, m, zh.makespan,
                    f1.makespan);
            cai_pp_schedule_free(g);
            cai_pp_schedule_free(o);
            cai_pp_schedule_free(h);
            cai_pp_schedule_free(z);
            schedules += 4;
            if (p < 2 || m % p) continue;
            for (int v = 2; v <= 4; v++) {
                cai_pp_stats iv;
                cai_pp_schedule *i = built(CAI_PP_INTERLEAVED, p, v, m);
                passes_check(i, &iv);
                if (walk) lists_are_well_formed(i);
                cai_pp_schedule_free(i);
                schedules++;
            }
        }
    ck_assert_int_gt(schedules, 4 * 16 * 64);
}
END_TEST

/* ------------------------------------------------------------------ bubbles */

/* Per-chunk costs for a stage forward F and backward B split over v chunks,
 * the backward into equal input and weight halves. */
static cai_pp_costs chunk_costs(double F, double B, int v) {
    cai_pp_costs c = {F / v, B / (2 * v), B / (2 * v), 0};
    return c;
}

static void bubble_is_textbook(cai_pp_style style, int p, int v, int m, double F, double B) {
    cai_pp_schedule *s = built(style, p, v, m);
    cai_pp_costs c = chunk_costs(F, B, v);
    cai_pp_stats st;
    double want;
    REQUIRE(cai_pp_schedule_check(s, &c, &st) == CAI_OK, "%s", cai_error_message());
    REQUIRE(cai_pp_bubble_formula(cai_pp_schedule_spec(s), &want, NULL), "no formula");
    REQUIRE(fabs(st.bubble - want) <= 1e-12, "%s pp=%d v=%d m=%d F=%g B=%g: bubble %.15g, textbook %.15g",
            cai_pp_style_name(style), p, v, m, F, B, st.bubble, want);
    /* The makespan itself: (m + (p-1)/v) (F + B). */
    const double span = (m + (p - 1.0) / v) * (F + B);
    REQUIRE(fabs(st.makespan - span) <= 1e-9 * span, "%s pp=%d v=%d m=%d: makespan %.15g, expected %.15g",
            cai_pp_style_name(style), p, v, m, st.makespan, span);
    cai_pp_schedule_free(s);
}

START_TEST(bubbles_equal_the_textbook) {
    static const double FB[][2] = {{1, 2}, {1, 1}, {2, 3}, {0.75, 1.5}};
    for (size_t k = 0; k < sizeof FB / sizeof FB[0]; k++)
        for (int p = 1; p <= 16; p++) {
            for (int m = 1; m <= 64; m++) {
                bubble_is_textbook(CAI_PP_GPIPE, p, 1, m, FB[k][0], FB[k][1]);
                bubble_is_textbook(CAI_PP_1F1B, p, 1, m, FB[k][0], FB[k][1]);
            }
            for (int m = p; m <= 64 && p > 1; m += p)
                for (int v = 2; v <= 4; v++) bubble_is_textbook(CAI_PP_INTERLEAVED, p, v, m, FB[k][0], FB[k][1]);
        }
    cai_pp_spec zb = spec_of(CAI_PP_ZB_V, 4, 2, 8);
    ck_assert(!cai_pp_bubble_formula(&zb, NULL, NULL));
}
END_TEST

/* The zero-bubble styles on the costs they are placed for (F = B = W per
 * chunk): ZB-H1's bubble is the paper's (p-1)(F+B-W) per rank, a third of
 * 1F1B's; ZB-V's is smaller still. */
START_TEST(zero_bubble_beats_1f1b) {
    for (int p = 2; p <= 8; p++)
        for (int m = p; m <= 32; m += p) {
            cai_pp_schedule *o = built(CAI_PP_1F1B, p, 1, m), *h = built(CAI_PP_ZB_H1, p, 1, m);
            cai_pp_schedule *z = built(CAI_PP_ZB_V, p, 2, m);
            cai_pp_stats so, sh, sz;
            const cai_pp_costs unit = {1, 1, 1, 0}, half = {0.5, 0.5, 0.5, 0};
            OK(cai_pp_schedule_check(o, &unit, &so));
            OK(cai_pp_schedule_check(h, &unit, &sh));
            OK(cai_pp_schedule_check(z, &half, &sz));
            const double h_span = 3.0 * m + (p - 1);
            ck_assert_msg(fabs(sh.makespan - h_span) < 1e-9, "zb-h1 pp=%d m=%d: makespan %g, paper %g", p, m,
                          sh.makespan, h_span);
            ck_assert_msg(sh.bubble < so.bubble, "zb-h1 pp=%d m=%d: bubble %g not below 1f1b's %g", p, m, sh.bubble,
                          so.bubble);
            ck_assert_msg(sz.bubble <= sh.bubble + 1e-12, "zb-v pp=%d m=%d: bubble %g above zb-h1's %g", p, m,
                          sz.bubble, sh.bubble);
            cai_pp_schedule_free(o);
            cai_pp_schedule_free(h);
            cai_pp_schedule_free(z);
        }
}
END_TEST

/* ------------------------------------------------------------------ the check refuses broken lists */

typedef struct {
    cai_pp_spec spec;
    cai_pp_action a[8][256];
    int n[8];
} editable;

static void copy_out(const cai_pp_schedule *s, editable *e) {
    e->spec = *cai_pp_schedule_spec(s);
    ck_assert_int_le(e->spec.pp, 8);
    for (int r = 0; r < e->spec.pp; r++) {
        e->n[r] = cai_pp_schedule_len(s, r);
        ck_assert_int_le(e->n[r], 255);
        memcpy(e->a[r], cai_pp_schedule_actions(s, r), sizeof(cai_pp_action) * (size_t)e->n[r]);
    }
}

static void load(const cai_pp_style style, int p, int v, int m, editable *e) {
    cai_pp_schedule *s = built(style, p, v, m);
    copy_out(s, e);
    cai_pp_schedule_free(s);
}

static cai_status check_edited(const editable *e) {
    const cai_pp_action *lists[8];
    for (int r = 0; r < e->spec.pp; r++) lists[r] = e->a[r];
    cai_pp_schedule *s = NULL;
    OK(cai_pp_schedule_from_lists(&e->spec, lists, e->n, &s));
    cai_status st = cai_pp_schedule_check(s, NULL, NULL);
    cai_pp_schedule_free(s);
    return st;
}

static int find(const editable *e, int r, cai_pp_op op, int mb, int chunk) {
    for (int i = 0; i < e->n[r]; i++)
        if (e->a[r][i].op == op && e->a[r][i].mb == mb && e->a[r][i].chunk == chunk) return i;
    ck_abort_msg("rank %d has no %s mb %d chunk %d", r, cai_pp_op_name(op), mb, chunk);
    return -1;
}

static void drop(editable *e, int r, int i) {
    memmove(&e->a[r][i], &e->a[r][i + 1], sizeof(cai_pp_action) * (size_t)(e->n[r] - i - 1));
    e->n[r]--;
}

static void insert(editable *e, int r, int i, cai_pp_action a) {
    memmove(&e->a[r][i + 1], &e->a[r][i], sizeof(cai_pp_action) * (size_t)(e->n[r] - i));
    e->a[r][i] = a;
    e->n[r]++;
}

static void move_to(editable *e, int r, int from, int to) {
    cai_pp_action a = e->a[r][from];
    drop(e, r, from);
    insert(e, r, to, a);
}

START_TEST(check_refuses_broken_lists) {
    editable e;
    /* The unedited copy passes: the edits below are what breaks it. */
    load(CAI_PP_1F1B, 2, 1, 2, &e);
    OK(check_edited(&e));

    /* Rank 0 waits for mb 0's gradient before it sends mb 0's activations. */
    load(CAI_PP_1F1B, 2, 1, 2, &e);
    move_to(&e, 0, find(&e, 0, CAI_PP_SEND_ACT, 0, 0), find(&e, 0, CAI_PP_BACKWARD, 0, 0));
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "deadlocks",
            "rank 0 at action 3 (recv_grad mb 0 chunk 0 from rank 1)",
            "rank 1 at action 0 (recv_act mb 0 chunk 0 from rank 0)");

    /* A forward dropped (with its messages). */
    load(CAI_PP_GPIPE, 2, 1, 3, &e);
    drop(&e, 1, find(&e, 1, CAI_PP_FORWARD, 2, 0));
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "rank 1", "backward mb 2 chunk 0",
            "before (or without) its forward");
    load(CAI_PP_GPIPE, 2, 1, 3, &e);
    drop(&e, 1, find(&e, 1, CAI_PP_BACKWARD, 2, 0));
    drop(&e, 1, find(&e, 1, CAI_PP_SEND_GRAD, 2, 0));
    drop(&e, 0, find(&e, 0, CAI_PP_RECV_GRAD, 2, 0));
    drop(&e, 0, find(&e, 0, CAI_PP_BACKWARD, 2, 0));
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "rank 0 has no backward of mb 2 chunk 0");

    /* A backward run twice. */
    load(CAI_PP_1F1B, 2, 1, 2, &e);
    insert(&e, 1, e.n[1], e.a[1][find(&e, 1, CAI_PP_BACKWARD, 1, 0)]);
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "rank 1", "a second backward");

    /* A backward before its forward on one rank. */
    load(CAI_PP_1F1B, 1, 1, 2, &e);
    move_to(&e, 0, find(&e, 0, CAI_PP_BACKWARD, 1, 0), 0);
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "rank 0 action 0", "backward mb 1",
            "before (or without) its forward");

    /* A weight pass before its input-gradient pass. */
    load(CAI_PP_ZB_H1, 2, 1, 2, &e);
    move_to(&e, 0, find(&e, 0, CAI_PP_BACKWARD_WEIGHT, 1, 0), find(&e, 0, CAI_PP_BACKWARD_INPUT, 1, 0));
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "backward_weight mb 1", "before (or without) its input-gradient");

    /* Fused and split backward mixed on one (mb, chunk). */
    load(CAI_PP_1F1B, 1, 1, 1, &e);
    insert(&e, 0, e.n[0], (cai_pp_action){CAI_PP_BACKWARD_WEIGHT, 0, 0, -1});
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "already had a fused backward");

    /* The V's turn: chunk 1 on the last rank forwarded before chunk 0. */
    load(CAI_PP_ZB_V, 2, 2, 2, &e);
    move_to(&e, 1, find(&e, 1, CAI_PP_FORWARD, 0, 1), find(&e, 1, CAI_PP_FORWARD, 0, 0));
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "rank 1", "forward mb 0 chunk 1, stage 2",
            "before the forward of stage 1 on this rank");
    /* ... and a message between two stages of one rank. */
    load(CAI_PP_ZB_V, 2, 2, 2, &e);
    insert(&e, 1, find(&e, 1, CAI_PP_FORWARD, 0, 0) + 1, (cai_pp_action){CAI_PP_SEND_ACT, 0, 0, 0});
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "stage 2 is on this rank too", "stays local");

    /* A receive whose activations are never sent. */
    load(CAI_PP_GPIPE, 3, 1, 2, &e);
    drop(&e, 0, find(&e, 0, CAI_PP_SEND_ACT, 1, 0));
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "activations of mb 1 from stage 0 (rank 0) to stage 1 (rank 1)",
            "received but never sent");
    /* A list cut short: the gradient sent to it is never received, but the
     * missing backward is what is named. */
    load(CAI_PP_GPIPE, 2, 1, 1, &e);
    e.n[0] = find(&e, 0, CAI_PP_RECV_GRAD, 0, 0);
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "rank 0 has no backward of mb 0 chunk 0");
    /* A compute with no receive before it. */
    load(CAI_PP_GPIPE, 2, 1, 2, &e);
    drop(&e, 1, find(&e, 1, CAI_PP_RECV_ACT, 1, 0));
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "forward mb 1 chunk 0", "no recv_act from rank 0 before it");
    /* A send before its producer, a send to the wrong rank, one sent twice. */
    load(CAI_PP_GPIPE, 3, 1, 2, &e);
    move_to(&e, 0, find(&e, 0, CAI_PP_SEND_ACT, 1, 0), 0);
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "rank 0 action 0", "before the forward that produces it");
    load(CAI_PP_GPIPE, 3, 1, 2, &e);
    e.a[0][find(&e, 0, CAI_PP_SEND_ACT, 1, 0)].peer = 2;
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "stage 1 lives on rank 1, not on peer 2");
    load(CAI_PP_GPIPE, 3, 1, 2, &e);
    insert(&e, 0, e.n[0], e.a[0][find(&e, 0, CAI_PP_SEND_ACT, 1, 0)]);
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "sent already");
    /* Fields out of range. */
    load(CAI_PP_GPIPE, 2, 1, 2, &e);
    e.a[1][0].mb = 5;
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "microbatch 5 is outside [0, 2)");
    load(CAI_PP_GPIPE, 2, 1, 2, &e);
    e.a[0][0].peer = 1;
    REFUSED(check_edited(&e), CAI_ERR_INVALID_ARG, "a compute has peer -1");
    /* Costs the simulation cannot use. */
    cai_pp_schedule *s = built(CAI_PP_GPIPE, 2, 1, 2);
    const cai_pp_costs bad = {0, 1, 1, 0};
    REFUSED(cai_pp_schedule_check(s, &bad, NULL), CAI_ERR_INVALID_ARG, "f and b must be > 0");
    cai_pp_schedule_free(s);
}
END_TEST

/* With communication time the simulation waits for messages: 1F1B's step
 * grows by the hops the first forward and last backward make. */
START_TEST(communication_time_counts) {
    cai_pp_schedule *s = built(CAI_PP_GPIPE, 4, 1, 8);
    const cai_pp_costs c0 = {1, 1, 0, 0}, c1 = {1, 1, 0, 0.25};
    cai_pp_stats a, b;
    OK(cai_pp_schedule_check(s, &c0, &a));
    OK(cai_pp_schedule_check(s, &c1, &b));
    ck_assert_double_eq_tol(b.makespan - a.makespan, 2 * 3 * 0.25, 1e-12);
    ck_assert_double_eq_tol(a.busy, b.busy, 1e-12);
    cai_pp_schedule_free(s);
}
END_TEST

/* Each action's own time: on equal times the replay is the check's
 * simulation; on a hand-timed 1f1b of one microbatch the makespan is the
 * chain F(rank 0) F B (rank 1) B(rank 0) plus its two messages. */
START_TEST(replay_takes_each_action_time) {
    cai_pp_schedule *s = built(CAI_PP_INTERLEAVED, 4, 2, 8);
    double *block = NULL, *dur[4];
    size_t total = 0;
    for (int r = 0; r < 4; r++) total += (size_t)cai_pp_schedule_len(s, r);
    block = calloc(total, sizeof *block);
    ck_assert_ptr_nonnull(block);
    for (int r = 0, at = 0; r < 4; at += cai_pp_schedule_len(s, r), r++) {
        dur[r] = block + at;
        const cai_pp_action *a = cai_pp_schedule_actions(s, r);
        for (int i = 0; i < cai_pp_schedule_len(s, r); i++)
            dur[r][i] = a[i].op == CAI_PP_FORWARD ? 0.5 : a[i].op == CAI_PP_BACKWARD ? 1.0 : -7; /* messages: unread */
    }
    const cai_pp_costs c = {0.5, 1.0, 0, 0.125};
    cai_pp_stats want, got;
    OK(cai_pp_schedule_check(s, &c, &want));
    OK(cai_pp_schedule_replay(s, (const double *const *)dur, 0.125, &got));
    ck_assert_double_eq_tol(got.makespan, want.makespan, 1e-12);
    ck_assert_double_eq_tol(got.bubble, want.bubble, 1e-12);
    int k = 0; /* rank 2's first forward (a receive comes first) */
    while (cai_pp_schedule_actions(s, 2)[k].op != CAI_PP_FORWARD) k++;
    dur[2][k] = -1;
    char where[32];
    snprintf(where, sizeof where, "rank 2 action %d", k);
    REFUSED(cai_pp_schedule_replay(s, (const double *const *)dur, 0, &got), CAI_ERR_INVALID_ARG, where, "lasts -1");
    dur[2][k] = 0.5;
    REFUSED(cai_pp_schedule_replay(s, (const double *const *)dur, -1, &got), CAI_ERR_INVALID_ARG, "comm=-1");
    free(block);
    cai_pp_schedule_free(s);

    s = built(CAI_PP_1F1B, 2, 1, 1);
    double d0[8] = {0}, d1[8] = {0};
    const double *d[2] = {d0, d1};
    for (int r = 0; r < 2; r++) {
        const cai_pp_action *a = cai_pp_schedule_actions(s, r);
        for (int i = 0; i < cai_pp_schedule_len(s, r); i++) {
            double *x = r ? d1 : d0;
            if (a[i].op == CAI_PP_FORWARD) x[i] = r ? 1.5 : 1;
            if (a[i].op == CAI_PP_BACKWARD) x[i] = r ? 3 : 2;
        }
    }
    OK(cai_pp_schedule_replay(s, d, 0.25, &got));
    ck_assert_double_eq_tol(got.makespan, 1 + 1.5 + 3 + 2 + 2 * 0.25, 1e-12);
    ck_assert_double_eq_tol(got.bubble, 1 - 7.5 / (2 * 8.0), 1e-12);
    cai_pp_schedule_free(s);
}
END_TEST

/* ------------------------------------------------------------------ output */

START_TEST(timeline_states_the_numbers) {
    cai_pp_schedule *s = built(CAI_PP_INTERLEAVED, 4, 2, 8);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    OK(cai_pp_schedule_print_timeline(s, NULL, f));
    fclose(f);
    ck_assert_msg(strstr(text, "bubble: 0.15789473684"), "%s", text); /* 3/19 */
    ck_assert_msg(strstr(text, "textbook (p-1)/(v*m+p-1)"), "%s", text);
    ck_assert_msg(strstr(text, "rank  3 |"), "%s", text);
    ck_assert_msg(strstr(text, "F7.1"), "%s", text);
    ck_assert_msg(strstr(text, "peak in-flight"), "%s", text);
    free(text);
    cai_pp_schedule_free(s);

    s = built(CAI_PP_ZB_V, 2, 2, 4);
    f = open_memstream(&text, &len);
    OK(cai_pp_schedule_print_timeline(s, NULL, f));
    fclose(f);
    ck_assert_msg(strstr(text, "no textbook formula for zb-v"), "%s", text);
    ck_assert_msg(strstr(text, "W3.1"), "%s", text);
    free(text);
    cai_pp_schedule_free(s);
}
END_TEST

START_TEST(chrome_trace_is_json) {
    char path[] = "/tmp/test_schedule_trace_XXXXXX";
    const int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    cai_pp_schedule *s = built(CAI_PP_1F1B, 3, 1, 4);
    const cai_pp_costs c = {0.001, 0.002, 0, 0};
    OK(cai_pp_schedule_write_chrome_trace(s, &c, path));
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    ck_assert_msg(root, "trace is not JSON: %s line %d", err.text, err.line);
    json_t *ev = json_object_get(root, "traceEvents");
    ck_assert(json_is_array(ev));
    int complete = 0, named = 0;
    double end = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *e = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        ck_assert_ptr_nonnull(ph);
        if (!strcmp(ph, "M")) {
            named++;
            continue;
        }
        ck_assert_str_eq(ph, "X");
        complete++;
        ck_assert_int_eq(json_integer_value(json_object_get(e, "pid")), 0);
        const int tid = (int)json_integer_value(json_object_get(e, "tid"));
        ck_assert(tid >= 0 && tid < 3);
        json_t *args = json_object_get(e, "args");
        ck_assert(json_is_integer(json_object_get(args, "mb")));
        ck_assert(json_is_integer(json_object_get(args, "chunk")));
        const double t = json_number_value(json_object_get(e, "ts")) + json_number_value(json_object_get(e, "dur"));
        if (t > end) end = t;
    }
    ck_assert_int_eq(complete, 3 * 4 * 2);
    ck_assert_int_eq(named, 1 + 3);
    ck_assert_double_eq_tol(end, (4 + 2) * 3000.0, 1e-6); /* microseconds */
    json_decref(root);
    cai_pp_schedule_free(s);

    /* Names are escaped; bad events are refused before the file is touched. */
    cai_pp_trace_event e[2] = {{0, "a \"quoted\"\\name\n", NULL, 0, 1e-6, -1, -1}, {1, "x", "c", 1e-6, 2e-6, 1, 0}};
    OK(cai_pp_write_chrome_trace(path, e, 2));
    root = json_load_file(path, 0, &err);
    ck_assert_msg(root, "trace is not JSON: %s", err.text);
    json_t *first = json_array_get(json_object_get(root, "traceEvents"), 3);
    ck_assert_str_eq(json_string_value(json_object_get(first, "name")), "a \"quoted\"\\name\n");
    json_decref(root);
    e[1].end = 0;
    REFUSED(cai_pp_write_chrome_trace(path, e, 2), CAI_ERR_INVALID_ARG, "end >= start");
    e[1].end = 2e-6;
    REFUSED(cai_pp_write_chrome_trace("/nonexistent-dir/trace.json", e, 2), CAI_ERR_IO, "/nonexistent-dir/trace.json");

    /* Numbers about the run go to otherData; a value that is not finite is refused. */
    cai_pp_trace_meta meta[2] = {{"bubble_measured", 0.125}, {"steps", 7}};
    OK(cai_pp_write_chrome_trace_meta(path, e, 2, meta, 2));
    root = json_load_file(path, 0, &err);
    ck_assert_msg(root, "trace is not JSON: %s", err.text);
    json_t *other = json_object_get(root, "otherData");
    ck_assert_double_eq(json_number_value(json_object_get(other, "bubble_measured")), 0.125);
    ck_assert_double_eq(json_number_value(json_object_get(other, "steps")), 7);
    ck_assert_int_eq((int)json_array_size(json_object_get(root, "traceEvents")), 2 + 1 + 2);
    json_decref(root);
    meta[1].value = NAN;
    REFUSED(cai_pp_write_chrome_trace_meta(path, e, 2, meta, 2), CAI_ERR_INVALID_ARG, "metadata 1 (steps)");
    unlink(path);
}
END_TEST

START_TEST(labels_and_tags) {
    char buf[32];
    cai_pp_action a = {CAI_PP_FORWARD, 3, 1, -1};
    ck_assert_str_eq(cai_pp_action_label(&a, 2, buf, sizeof buf), "F3.1");
    ck_assert_str_eq(cai_pp_action_label(&a, 1, buf, sizeof buf), "F3");
    a = (cai_pp_action){CAI_PP_RECV_GRAD, 12, 0, 2};
    ck_assert_str_eq(cai_pp_action_label(&a, 1, buf, sizeof buf), "rG12<2");
    /* A send and its receive share a tag. */
    cai_pp_spec sp = spec_of(CAI_PP_INTERLEAVED, 4, 2, 8);
    const cai_pp_action send = {CAI_PP_SEND_ACT, 5, 0, 0}, recv = {CAI_PP_RECV_ACT, 5, 1, 3};
    ck_assert_int_eq(cai_pp_action_tag(&sp, 3, &send), cai_pp_action_tag(&sp, 0, &recv));
    const cai_pp_action fwd = {CAI_PP_FORWARD, 5, 0, -1};
    ck_assert_int_eq(cai_pp_action_tag(&sp, 3, &fwd), -1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("schedule");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, names_round_trip);
    tcase_add_test(tc, bad_specs_name_what_fits);
    tcase_add_test(tc, stages_and_owners);
    tcase_add_test(tc, every_schedule_passes);
    tcase_add_test(tc, bubbles_equal_the_textbook);
    tcase_add_test(tc, zero_bubble_beats_1f1b);
    tcase_add_test(tc, check_refuses_broken_lists);
    tcase_add_test(tc, communication_time_counts);
    tcase_add_test(tc, replay_takes_each_action_time);
    tcase_add_test(tc, timeline_states_the_numbers);
    tcase_add_test(tc, chrome_trace_is_json);
    tcase_add_test(tc, labels_and_tags);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
