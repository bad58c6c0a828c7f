/* Layout arithmetic without MPI communication: validation messages and
 * suggestions, coordinates and groups against an independent brute force,
 * model-shape rules, and the half-float conversions the reductions use. */
#include "cai_config.h"
#include "colossal/cluster.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cluster/cluster_internal.h"

static cai_layout L(int pp, int dp, int ep, int sp, int tp, const char *order) {
    cai_layout l = {pp, dp, ep, sp, tp, order};
    return l;
}

/* ------------------------------------------------------------ validation */

START_TEST(world6_tp4_explains_and_proposes) {
    cai_layout bad = L(1, 1, 1, 1, 4, NULL);
    cai_error_clear();
    ck_assert_int_eq(cai_layout_validate(6, &bad, NULL), CAI_ERR_LAYOUT);
    const char *msg = cai_error_message();
    ck_assert_ptr_nonnull(strstr(msg, "pp*dp*sp*tp = 1*1*1*4 = 4 but the world has 6 ranks"));
    ck_assert_ptr_nonnull(strstr(msg, "pp*sp*tp = 4 does not divide 6"));
    ck_assert_ptr_nonnull(strstr(msg, "layouts that fit 6 ranks:"));
    ck_assert_ptr_nonnull(strstr(msg, "\"tp=2 pp=1 dp=3\""));
    ck_assert_ptr_nonnull(strstr(msg, "\"tp=2 pp=3 dp=1\""));
    /* Every layout the message proposes is one cai_layout_suggest returns and
     * really fits; the closest keeps tp a power of two near the request. */
    cai_layout sug[8];
    int n = cai_layout_suggest(6, &bad, NULL, sug, 8);
    ck_assert_int_ge(n, 4);
    ck_assert_int_eq(sug[0].tp, 2);
    for (int i = 0; i < n; i++) {
        char s[96];
        cai_layout_str(&sug[i], s, sizeof s);
        ck_assert_msg(strstr(msg, s) != NULL, "suggestion %s missing from: %s", s, msg);
        ck_assert_int_eq(cai_layout_validate(6, &sug[i], NULL), CAI_OK);
    }
    /* The fix is named when only dp is off. */
    cai_layout dp_off = L(1, 2, 1, 1, 2, NULL);
    ck_assert_int_eq(cai_layout_validate(6, &dp_off, NULL), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "dp=3 would fit"));
    cai_error_clear();
}
END_TEST

START_TEST(structural_errors_name_the_numbers) {
    cai_layout l = L(1, 2, 1, 1, 0, NULL);
    ck_assert_int_eq(cai_layout_validate(2, &l, NULL), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "tp=0: every axis size must be >= 1"));
    l = L(1, 6, 4, 1, 1, NULL);
    ck_assert_int_eq(cai_layout_validate(6, &l, NULL), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "ep=4 does not divide dp=6"));
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "layouts that fit 6 ranks"));

    const char *orders[] = {"pp,dp,tp", "pp,dp,dp,sp,tp", "pp,dp,ep,sp,xp"};
    const char *expect[] = {"missing: ep, sp", "names 'dp' twice", "unknown dimension 'xp'"};
    for (int i = 0; i < 3; i++) {
        l = L(1, 1, 1, 1, 1, orders[i]);
        ck_assert_int_eq(cai_layout_validate(1, &l, NULL), CAI_ERR_LAYOUT);
        ck_assert_msg(strstr(cai_error_message(), expect[i]) != NULL, "order %s: %s", orders[i], cai_error_message());
    }
    l = L(2, 4, 2, 1, 2, " tp, sp ,edp,ep,pp");
    ck_assert_int_eq(cai_layout_validate(16, &l, NULL), CAI_OK);
    l = L(1, 4, 1, 1, 1, NULL);
    ck_assert_int_eq(cai_layout_validate(4, &l, NULL), CAI_OK);
    cai_error_clear();
}
END_TEST

START_TEST(model_rules) {
    cai_layout_model m = {0};
    cai_layout l = L(1, 1, 1, 1, 8, NULL);
    m.n_heads = 12;
    ck_assert_int_eq(cai_layout_validate(8, &l, &m), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "n_heads=12 is not divisible by tp=8"));
    cai_layout sug[64];
    int n = cai_layout_suggest(8, &l, &m, sug, 64);
    ck_assert_int_gt(n, 0);
    for (int i = 0; i < n; i++) ck_assert_int_eq(12 % sug[i].tp, 0);

    m = (cai_layout_model){.n_heads = 16, .n_kv_heads = 4};
    ck_assert_int_eq(cai_layout_validate(8, &l, &m), CAI_OK); /* KV heads replicated */
    m = (cai_layout_model){.n_heads = 6, .n_kv_heads = 3};
    l = L(1, 1, 1, 1, 2, NULL);
    ck_assert_int_eq(cai_layout_validate(2, &l, &m), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "n_kv_heads=3 and tp=2"));

    m = (cai_layout_model){.n_layers = 12};
    l = L(5, 1, 1, 1, 1, NULL);
    ck_assert_int_eq(cai_layout_validate(5, &l, &m), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "n_layers=12 is not divisible by pp*chunks=5*1=5"));
    m.pp_chunks = 3;
    l = L(2, 1, 1, 1, 1, NULL);
    ck_assert_int_eq(cai_layout_validate(2, &l, &m), CAI_OK);
    m.pp_chunks = 4;
    ck_assert_int_eq(cai_layout_validate(2, &l, &m), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "pp*chunks=2*4=8"));

    m = (cai_layout_model){.n_experts = 8};
    l = L(1, 3, 3, 1, 1, NULL);
    ck_assert_int_eq(cai_layout_validate(3, &l, &m), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "n_experts=8 is not divisible by ep=3"));
    m.n_experts = 6;
    ck_assert_int_eq(cai_layout_validate(3, &l, &m), CAI_OK);

    /* Several broken rules are all reported. */
    m = (cai_layout_model){.n_heads = 12, .n_layers = 10};
    l = L(4, 1, 1, 1, 8, NULL);
    ck_assert_int_eq(cai_layout_validate(32, &l, &m), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "n_heads=12"));
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "n_layers=10"));
    cai_error_clear();
}
END_TEST

/* Independent count of ordered factorizations world = pp*dp*sp*tp. */
static int count_factorizations(int w) {
    int c = 0;
    for (int a = 1; a <= w; a++)
        for (int b = 1; b <= w; b++)
            for (int d = 1; d <= w; d++)
                if ((long)a * b * d <= w && w % (a * b * d) == 0) c++;
    return c;
}

START_TEST(suggest_enumerates_all_layouts) {
    const int worlds[] = {1, 6, 12, 16};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        cai_layout out[256];
        int n = cai_layout_suggest(worlds[w], NULL, NULL, out, 256);
        ck_assert_int_eq(n, count_factorizations(worlds[w]));
        for (int i = 0; i < n; i++) {
            ck_assert_int_eq(cai_layout_validate(worlds[w], &out[i], NULL), CAI_OK);
            for (int j = 0; j < i; j++)
                ck_assert(!(out[i].pp == out[j].pp && out[i].dp == out[j].dp && out[i].sp == out[j].sp &&
                            out[i].tp == out[j].tp));
        }
        ck_assert_int_eq(cai_layout_suggest(worlds[w], NULL, NULL, out, 2), worlds[w] == 1 ? 1 : 2);
    }
    /* Expert parallelism is kept where it fits dp. */
    cai_layout hint = L(1, 4, 2, 1, 2, NULL), out[64];
    cai_layout_model m = {.n_experts = 4};
    int n = cai_layout_suggest(8, &hint, &m, out, 64);
    ck_assert_int_gt(n, 0);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(cai_layout_validate(8, &out[i], &m), CAI_OK);
        if (out[i].dp % 2 == 0) ck_assert_int_eq(out[i].ep, 2);
    }
}
END_TEST

/* ------------------------------------------------------------ coordinates */

/* Brute force from first principles: decode each rank row-major over the
 * grid, and a group is every rank that agrees on the dimensions the axis does
 * not span, listed in increasing rank. */
typedef struct {
    int dims[5];
    int id[5]; /* 0 pp 1 edp 2 ep 3 sp 4 tp at each position */
} bf_grid;

static bf_grid bf_make(const cai_layout *l, const char *const names[5]) {
    bf_grid g;
    for (int i = 0; i < 5; i++) {
        const char *nm = names[i];
        int id = !strcmp(nm, "pp") ? 0 : !strcmp(nm, "dp") ? 1 : !strcmp(nm, "ep") ? 2 : !strcmp(nm, "sp") ? 3 : 4;
        int size[5] = {l->pp, l->dp / l->ep, l->ep, l->sp, l->tp};
        g.id[i] = id;
        g.dims[i] = size[id];
    }
    return g;
}

static void bf_coords(const bf_grid *g, int r, int c[5]) {
    int stride = 1;
    for (int i = 0; i < 5; i++) stride *= g->dims[i];
    for (int i = 0; i < 5; i++) {
        stride /= g->dims[i];
        c[i] = r / stride;
        r %= stride;
    }
}

static int bf_spans(cai_axis a, int id) {
    switch (a) {
    case CAI_AXIS_PP: return id == 0;
    case CAI_AXIS_DP: return id == 1 || id == 2;
    case CAI_AXIS_EP: return id == 2;
    case CAI_AXIS_SP: return id == 3;
    case CAI_AXIS_TP: return id == 4;
    case CAI_AXIS_EDP: return id == 1;
    case CAI_AXIS_DP_SP: return id == 1 || id == 2 || id == 3;
    default: return 1;
    }
}

static int bf_group(const bf_grid *g, int world, cai_axis a, int r, int *out) {
    int cr[5], cs[5], n = 0;
    bf_coords(g, r, cr);
    for (int s = 0; s < world; s++) {
        bf_coords(g, s, cs);
        int same = 1;
        for (int i = 0; i < 5; i++)
            if (!bf_spans(a, g->id[i]) && cs[i] != cr[i]) same = 0;
        if (same) out[n++] = s;
    }
    return n;
}

START_TEST(coords_and_groups_match_brute_force) {
    const cai_layout layouts[] = {L(2, 4, 2, 1, 2, NULL), L(2, 2, 1, 2, 3, NULL), L(3, 4, 2, 2, 1, NULL),
                                  L(1, 6, 3, 1, 2, NULL), L(1, 1, 1, 1, 1, NULL)};
    const char *const orders[][5] = {{"pp", "dp", "ep", "sp", "tp"},
                                     {"tp", "sp", "ep", "dp", "pp"},
                                     {"dp", "pp", "tp", "ep", "sp"},
                                     {"sp", "tp", "pp", "ep", "dp"},
                                     {"ep", "dp", "sp", "pp", "tp"}};
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
        for (size_t oi = 0; oi < sizeof orders / sizeof orders[0]; oi++) {
            char order[64];
            snprintf(order, sizeof order, "%s,%s,%s,%s,%s", orders[oi][0], orders[oi][1], orders[oi][2], orders[oi][3],
                     orders[oi][4]);
            cai_layout l = layouts[li];
            l.order = order;
            int world = l.pp * l.dp * l.sp * l.tp;
            ck_assert_int_eq(cai_layout_validate(world, &l, NULL), CAI_OK);
            bf_grid g = bf_make(&l, orders[oi]);
            int *want = malloc((size_t)world * sizeof *want), *got = malloc((size_t)world * sizeof *got);
            for (int r = 0; r < world; r++) {
                int coords[CAI_AXIS_COUNT];
                ck_assert_int_eq(cai_layout_coords(&l, r, coords), CAI_OK);
                for (int a = 0; a < CAI_AXIS_COUNT; a++) {
                    int n = bf_group(&g, world, (cai_axis)a, r, want);
                    ck_assert_int_eq(n, cai_layout_axis_size(&l, (cai_axis)a));
                    ck_assert_int_eq(cai_layout_group(&l, (cai_axis)a, r, got), CAI_OK);
                    for (int k = 0; k < n; k++)
                        ck_assert_msg(got[k] == want[k],
                                      "layout %zu order %s axis %s rank %d: member %d is %d, want %d", li, order,
                                      cai_axis_name((cai_axis)a), r, k, got[k], want[k]);
                    int pos = -1;
                    for (int k = 0; k < n; k++)
                        if (want[k] == r) pos = k;
                    ck_assert_int_eq(coords[a], pos);
                }
                ck_assert_int_eq(coords[CAI_AXIS_WORLD], r);
            }
            free(want);
            free(got);
        }
    }
    int c[CAI_AXIS_COUNT];
    cai_layout l = L(1, 2, 1, 1, 2, NULL);
    ck_assert_int_eq(cai_layout_coords(&l, 4, c), CAI_ERR_INVALID_ARG);
    cai_error_clear();
}
END_TEST

START_TEST(default_order_puts_tp_innermost) {
    /* The convention itself (DESIGN decision 1): tp neighbours are adjacent
     * ranks, pp is outermost, ep sits inside edp. */
    cai_layout l = L(2, 2, 1, 1, 2, NULL);
    int g[8];
    ck_assert_int_eq(cai_layout_group(&l, CAI_AXIS_TP, 0, g), CAI_OK);
    ck_assert(g[0] == 0 && g[1] == 1);
    ck_assert_int_eq(cai_layout_group(&l, CAI_AXIS_DP, 0, g), CAI_OK);
    ck_assert(g[0] == 0 && g[1] == 2);
    ck_assert_int_eq(cai_layout_group(&l, CAI_AXIS_PP, 1, g), CAI_OK);
    ck_assert(g[0] == 1 && g[1] == 5);
    l = L(1, 4, 2, 1, 1, NULL);
    ck_assert_int_eq(cai_layout_group(&l, CAI_AXIS_EP, 2, g), CAI_OK);
    ck_assert(g[0] == 2 && g[1] == 3);
    ck_assert_int_eq(cai_layout_group(&l, CAI_AXIS_EDP, 1, g), CAI_OK);
    ck_assert(g[0] == 1 && g[1] == 3);
    ck_assert_int_eq(cai_layout_axis_size(&l, CAI_AXIS_EDP), 2);
    ck_assert_int_eq(cai_layout_axis_size(&l, CAI_AXIS_DP_SP), 4);

    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    l = L(1, 2, 1, 1, 2, NULL);
    cai_layout_print(&l, f);
    fclose(f);
    ck_assert_msg(strstr(buf, "tp groups: [0 1] [2 3]") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "dp groups: [0 2] [1 3]") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "world groups: [0 1 2 3]") != NULL, "%s", buf);
}
END_TEST

START_TEST(axis_names_round_trip) {
    for (int a = 0; a < CAI_AXIS_COUNT; a++) {
        cai_axis back;
        ck_assert_int_eq(cai_axis_parse(cai_axis_name((cai_axis)a), &back), CAI_OK);
        ck_assert_int_eq(back, a);
    }
    cai_axis x;
    ck_assert_int_eq(cai_axis_parse("xp", &x), CAI_ERR_INVALID_ARG);
    cai_error_clear();
}
END_TEST

/* ------------------------------------------------------------ half floats */

/* Nearest representable value with ties to even, by comparing the two
 * candidates around x in double precision. */
static uint16_t ref_bf16(float x) {
    if (isnan(x)) return 0x7fc0;
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if ((u & 0xffff) == 0) return lo;
    /* Rounding treats infinity as the next step, 2^128. */
    double vh = (hi & 0x7fff) == 0x7f80 ? copysign(ldexp(1.0, 128), x) : (double)cai_cl_bf16_to_f32(hi);
    double dl = fabs((double)cai_cl_bf16_to_f32(lo) - x), dh = fabs(vh - x);
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo & 1) ? hi : lo;
}

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

START_TEST(half_conversions_round_to_nearest_even) {
    for (uint32_t i = 0; i < 400000; i++) {
        cai_philox_block b = cai_philox4x32(77, 0, i);
        float x = bits_to_float(b.v[0]);
        if (isinf(x)) continue;
        uint16_t got = cai_cl_f32_to_bf16(x);
        if (isnan(x)) ck_assert(isnan(cai_cl_bf16_to_f32(got)));
        else ck_assert_msg(got == ref_bf16(x), "bf16(%a): got %04x want %04x", x, got, ref_bf16(x));
#ifdef __FLT16_MANT_DIG__
        /* A value in the half range, with every low bit pattern exercised. */
        float y = bits_to_float((b.v[1] & 0x807fffffu) | ((100u + b.v[2] % 45u) << 23));
        _Float16 h = (_Float16)y;
        uint16_t want;
        memcpy(&want, &h, 2);
        ck_assert_msg(cai_cl_f32_to_f16(y) == want, "f16(%a): got %04x want %04x", y, cai_cl_f32_to_f16(y), want);
        float back = (float)h;
        ck_assert(cai_cl_f16_to_f32(want) == back);
#endif
    }
    /* Every half converts to float and back unchanged. */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = cai_cl_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        ck_assert_uint_eq(cai_cl_f32_to_f16(f), h);
        ck_assert_uint_eq(cai_cl_f32_to_bf16(cai_cl_bf16_to_f32((uint16_t)h)), h);
    }
    ck_assert_uint_eq(cai_cl_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(cai_cl_f32_to_f16(65519.99f), 0x7bff);
    ck_assert_uint_eq(cai_cl_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(cai_cl_f32_to_f16(0x1p-25f), 0x0000);        /* half of the smallest subnormal: to even */
    ck_assert_uint_eq(cai_cl_f32_to_f16(0x1.8p-24f), 0x0002);      /* 1.5 steps: to even (2) */
    ck_assert_uint_eq(cai_cl_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie: stays even */
    ck_assert_uint_eq(cai_cl_f32_to_bf16(1.0f + 0x1.8p-8f), 0x3f81);
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("layout");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, world6_tp4_explains_and_proposes);
    tcase_add_test(tc, structural_errors_name_the_numbers);
    tcase_add_test(tc, model_rules);
    tcase_add_test(tc, suggest_enumerates_all_layouts);
    tcase_add_test(tc, coords_and_groups_match_brute_force);
    tcase_add_test(tc, default_order_puts_tp_innermost);
    tcase_add_test(tc, axis_names_round_trip);
    tcase_add_test(tc, half_conversions_round_to_nearest_even);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
