/* The MoE sublayer (src/model/moe.c) on one rank: configuration errors,
 * routing by hand-computed numbers (top-k order and ties, Mixtral's
 * renormalisation, top-k-then-softmax, sigmoid), capacity dropping in
 * token order, router statistics, the registered names and ep views, bad
 * inputs, and the backward of the whole layer (router, aux and z losses,
 * experts, shared experts, capacity drops) against central differences of
 * its forward. tests/parity/moe.sh checks the same layer against PyTorch
 * to 1e-5; tests/mpi/test_moe.c checks ep > 1 against ep = 1. */
#include "cai_config.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "colossal/moe.h"
#include "moe_fixture.h"

static cai_device_t *dev;

#define CK_OK(expr)                                                                                    \
    do {                                                                                               \
        cai_status st_ = (expr);                                                                       \
        if (st_ != CAI_OK) cai_error_print(stderr);                                                    \
        ck_assert_msg(st_ == CAI_OK, "%s -> %s: %s", #expr, cai_status_str(st_), cai_error_message()); \
    } while (0)

/* expr fails with `code` and a message containing `text`. */
#define CK_FAILS(expr, code, text)                                                                                   \
    do {                                                                                                             \
        cai_error_clear();                                                                                           \
        cai_status st_ = (expr);                                                                                     \
        ck_assert_msg(st_ == (code), "%s -> %s, expected %s (%s)", #expr, cai_status_str(st_), cai_status_str(code), \
                      cai_error_message());                                                                          \
        ck_assert_msg(strstr(cai_error_message(), (text)) != NULL, "message '%s' lacks '%s'", cai_error_message(),   \
                      (text));                                                                                       \
        cai_error_clear();                                                                                           \
    } while (0)

static cai_moe_config small_cfg(void) {
    cai_moe_config c = cai_moe_config_default();
    c.n_experts = 4;
    c.top_k = 2;
    c.ffn = 6;
    c.aux_coef = 0.3f;
    c.z_coef = 0.05f;
    return c;
}

START_TEST(config_errors_name_the_field) {
    cai_moe_config c = small_cfg();
    CK_OK(cai_moe_config_check(&c, 8, 2));
    c.n_experts = 6;
    CK_FAILS(
        cai_moe_config_check(&c, 8, 4), CAI_ERR_LAYOUT,
        "moe.n_experts=6 is not divisible by ep=4 (each ep rank owns whole experts); ep values that fit: 1, 2, 3, 6");
    c = small_cfg();
    c.top_k = 5;
    CK_FAILS(cai_moe_config_check(&c, 8, 1), CAI_ERR_CONFIG, "moe.top_k=5 must be between 1 and moe.n_experts=4");
    c.top_k = 0;
    CK_FAILS(cai_moe_config_check(&c, 8, 1), CAI_ERR_CONFIG, "moe.top_k=0 must be between 1");
    c = small_cfg();
    c.routing = CAI_MOE_CAPACITY;
    c.capacity_factor = 0.0f;
    CK_FAILS(cai_moe_config_check(&c, 8, 1), CAI_ERR_CONFIG,
             "moe.capacity_factor=0 must be > 0 with moe.routing=capacity");
    c.capacity_factor = -1.0f;
    CK_FAILS(cai_moe_config_check(&c, 8, 1), CAI_ERR_CONFIG, "moe.capacity_factor=-1 must be > 0");
    c = small_cfg();
    c.ffn = 0;
    CK_FAILS(cai_moe_config_check(&c, 8, 1), CAI_ERR_CONFIG, "moe.ffn=0 must be >= 1");
    c = small_cfg();
    c.aux_coef = -0.5f;
    CK_FAILS(cai_moe_config_check(&c, 8, 1), CAI_ERR_CONFIG, "moe.aux_coef=-0.5 must be finite and >= 0");
    c = small_cfg();
    c.z_coef = NAN;
    CK_FAILS(cai_moe_config_check(&c, 8, 1), CAI_ERR_CONFIG, "moe.z_coef=nan");
    c = small_cfg();
    c.n_shared = -1;
    CK_FAILS(cai_moe_config_check(&c, 8, 1), CAI_ERR_CONFIG, "moe.n_shared=-1 must be >= 0");
    cai_moe_router r;
    CK_FAILS(cai_moe_router_parse("softmax2", &r), CAI_ERR_CONFIG,
             "moe.router='softmax2' is not one of softmax, topk_softmax, sigmoid");
    CK_OK(cai_moe_router_parse("sigmoid", &r));
    ck_assert_int_eq(r, CAI_MOE_ROUTER_SIGMOID);
    cai_moe_routing g;
    CK_FAILS(cai_moe_routing_parse("drop", &g), CAI_ERR_CONFIG, "moe.routing='drop' is not one of dropless, capacity");
    CK_OK(cai_moe_routing_parse("capacity", &g));
    ck_assert_int_eq(g, CAI_MOE_CAPACITY);

    /* Refused before anything is registered or allocated. */
    cai_registry_t *reg;
    cai_registry_options ro = {1};
    CK_OK(cai_registry_init(&reg, &ro));
    c = small_cfg();
    c.top_k = 7;
    CK_FAILS(cai_moe_register_params(reg, 0, &c, 8, 0.02f), CAI_ERR_CONFIG, "moe.top_k=7");
    ck_assert_int_eq(cai_registry_count(reg), 0);
    cai_registry_free(reg);
    uint64_t before = cai_device_alloc_count(dev, NULL);
    cai_moe_ctx cx;
    cai_moe_exchange ex = {NULL, 3, 0, NULL, NULL};
    c = small_cfg();
    CK_FAILS(cai_moe_ctx_init(&cx, dev, &c, 16, 8, CAI_DTYPE_F32, &ex), CAI_ERR_INVALID_ARG,
             "needs counts and rows functions");
    CK_FAILS(cai_moe_ctx_init(&cx, dev, &c, 0, 8, CAI_DTYPE_F32, NULL), CAI_ERR_INVALID_ARG, "0 tokens per rank");
    ck_assert_uint_eq(cai_device_alloc_count(dev, NULL), before);
}
END_TEST

/* Three tokens over four experts, top-2. */
static const float k_logits[3 * 4] = {0.1f, 2.0f, -1.0f, 1.0f, 1.0f, 1.0f, 0.0f, 0.0f, -3.0f, 0.5f, 0.4f, 0.6f};
static const int k_sel[3 * 2] = {1, 3, 0, 1, 3, 1};

/* The op table's router (ops.h moe_route) on host arrays of N tokens. */
static cai_status route_op(int64_t N, const float *logits, cai_route_fn fn, int norm, int32_t *sel, float *w, float *p,
                           float *lse) {
    cai_tensor tl = cai_tensor_2d(dev, (void *)logits, CAI_DTYPE_F32, N, 4),
               tp = cai_tensor_2d(dev, p, CAI_DTYPE_F32, N, 4), tz = cai_tensor_1d(dev, lse, CAI_DTYPE_F32, N),
               ts = cai_tensor_1d(dev, sel, CAI_DTYPE_I32, N * 2), tw = cai_tensor_1d(dev, w, CAI_DTYPE_F32, N * 2);
    return dev->ops->moe_route(dev, &ts, &tw, &tp, &tz, &tl, fn, norm);
}

/* ops.h moe_assign on host arrays; *dropped = sum of load - kept. */
static void assign_op(int E, int64_t n, int64_t capacity, const int32_t *sel, int64_t *load, int32_t *pos,
                      int64_t *kept, int64_t *dropped) {
    cai_tensor ts = cai_tensor_1d(dev, (void *)sel, CAI_DTYPE_I32, n), tp = cai_tensor_1d(dev, pos, CAI_DTYPE_I32, n),
               tl = cai_tensor_1d(dev, load, CAI_DTYPE_I64, E), tk = cai_tensor_1d(dev, kept, CAI_DTYPE_I64, E);
    CK_OK(dev->ops->moe_assign(dev, &tp, &tl, &tk, &ts, capacity));
    *dropped = 0;
    for (int e = 0; e < E; e++) *dropped += load[e] - kept[e];
}

static void route(cai_moe_router kind, int norm, int32_t *sel, float *w, float *p, float *lse) {
    CK_OK(route_op(3, k_logits, (cai_route_fn)kind, norm, sel, w, p, lse));
    for (int i = 0; i < 6; i++) ck_assert_int_eq(sel[i], k_sel[i]); /* largest first; a tie goes to the lower expert */
}

START_TEST(routing_topk_and_renormalisation) {
    int32_t sel[6];
    float w[6], p[12], lse[3];
    for (int t = 0; t < 3; t++) {
        double se = 0.0;
        for (int e = 0; e < 4; e++) se += exp((double)k_logits[t * 4 + e]);
        double lz = log(se);
        /* Mixtral: softmax over all experts, the two largest renormalised. */
        route(CAI_MOE_ROUTER_SOFTMAX, 1, sel, w, p, lse);
        ck_assert_double_eq_tol(lse[t], lz, 1e-6);
        for (int e = 0; e < 4; e++) ck_assert_double_eq_tol(p[t * 4 + e], exp(k_logits[t * 4 + e] - lz), 1e-7);
        const double a = exp((double)k_logits[t * 4 + k_sel[2 * t]]),
                     b = exp((double)k_logits[t * 4 + k_sel[2 * t + 1]]);
        ck_assert_double_eq_tol(w[2 * t], a / (a + b), 1e-7);
        ck_assert_double_eq_tol(w[2 * t + 1], b / (a + b), 1e-7);
        /* top-k then softmax: the same numbers (it is the same function) */
        route(CAI_MOE_ROUTER_TOPK_SOFTMAX, 0, sel, w, p, lse);
        ck_assert_double_eq_tol(w[2 * t], a / (a + b), 1e-7);
        ck_assert_double_eq_tol(w[2 * t + 1], b / (a + b), 1e-7);
        /* no renormalisation: the probabilities themselves */
        route(CAI_MOE_ROUTER_SOFTMAX, 0, sel, w, p, lse);
        ck_assert_double_eq_tol(w[2 * t], a / se, 1e-7);
        ck_assert_double_eq_tol(w[2 * t + 1], b / se, 1e-7);
        /* sigmoid scores, with and without renormalisation */
        const double sa = 1.0 / (1.0 + exp(-(double)k_logits[t * 4 + k_sel[2 * t]]));
        const double sb = 1.0 / (1.0 + exp(-(double)k_logits[t * 4 + k_sel[2 * t + 1]]));
        route(CAI_MOE_ROUTER_SIGMOID, 1, sel, w, p, lse);
        ck_assert_double_eq_tol(w[2 * t], sa / (sa + sb), 1e-7);
        ck_assert_double_eq_tol(p[t * 4 + 2], 1.0 / (1.0 + exp(-(double)k_logits[t * 4 + 2])), 1e-7);
        route(CAI_MOE_ROUTER_SIGMOID, 0, sel, w, p, lse);
        ck_assert_double_eq_tol(w[2 * t + 1], sb, 1e-7);
    }
    /* the losses' sums: column sums of the scores, the sum of lse^2 */
    double sums[5];
    route(CAI_MOE_ROUTER_SOFTMAX, 1, sel, w, p, lse);
    cai_tensor tp = cai_tensor_2d(dev, p, CAI_DTYPE_F32, 3, 4), tz = cai_tensor_1d(dev, lse, CAI_DTYPE_F32, 3),
               tsum = cai_tensor_1d(dev, sums, CAI_DTYPE_F64, 5);
    CK_OK(dev->ops->moe_router_sums(dev, &tsum, &tp, &tz, CAI_ROUTE_SOFTMAX));
    for (int e = 0; e < 4; e++) ck_assert_double_eq_tol(sums[e], (double)p[e] + p[4 + e] + p[8 + e], 1e-12);
    ck_assert_double_eq_tol(sums[4], (double)lse[0] * lse[0] + (double)lse[1] * lse[1] + (double)lse[2] * lse[2],
                            1e-12);
    route(CAI_MOE_ROUTER_SIGMOID, 1, sel, w, p, lse);
    CK_OK(dev->ops->moe_router_sums(dev, &tsum, &tp, &tz, CAI_ROUTE_SIGMOID));
    double want0 = 0.0;
    for (int t = 0; t < 3; t++) want0 += p[t * 4] / ((double)p[t * 4] + p[t * 4 + 1] + p[t * 4 + 2] + p[t * 4 + 3]);
    ck_assert_double_eq_tol(sums[0], want0, 1e-12);
    /* a non-finite logit is refused naming the token */
    float bad[8] = {0.0f, 1.0f, 1.0f, 2.0f, 0.0f, NAN, 1.0f, 2.0f};
    CK_FAILS(route_op(2, bad, CAI_ROUTE_SOFTMAX, 1, sel, w, p, lse), CAI_ERR_INVALID_ARG,
             "moe_route: logit of token 1 for expert 1 is nan");
    /* shapes: k outside [1, E], an unknown function */
    cai_tensor tl = cai_tensor_2d(dev, (void *)k_logits, CAI_DTYPE_F32, 3, 4),
               ts = cai_tensor_1d(dev, sel, CAI_DTYPE_I32, 15), tw = cai_tensor_1d(dev, w, CAI_DTYPE_F32, 15);
    CK_FAILS(dev->ops->moe_route(dev, &ts, &tw, &tp, &tz, &tl, CAI_ROUTE_SOFTMAX, 1), CAI_ERR_INVALID_ARG,
             "moe_route: sel is");
    ts = cai_tensor_1d(dev, sel, CAI_DTYPE_I32, 6);
    tw = cai_tensor_1d(dev, w, CAI_DTYPE_F32, 6);
    CK_FAILS(dev->ops->moe_route(dev, &ts, &tw, &tp, &tz, &tl, (cai_route_fn)7, 1), CAI_ERR_INVALID_ARG,
             "router function 7");
}
END_TEST

START_TEST(capacity_drops_later_tokens_first) {
    /* top-1, two experts, five tokens: capacity ceil(1.0 * 5 / 2) = 3 */
    const int32_t sel1[5] = {0, 0, 1, 0, 0};
    int64_t load[3], cnt[3], dropped;
    int32_t pos[8];
    assign_op(2, 5, 3, sel1, load, pos, cnt, &dropped);
    const int32_t want1[5] = {0, 1, 3, 2, -1};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(pos[i], want1[i]);
    ck_assert_int_eq(load[0], 4);
    ck_assert_int_eq(load[1], 1);
    ck_assert_int_eq(cnt[0], 3);
    ck_assert_int_eq(cnt[1], 1);
    ck_assert_int_eq(dropped, 1);
    /* top-2 over three experts, four tokens: capacity ceil(4 * 2 / 3) = 3;
     * token 3's second choice is expert 0's fourth token and is dropped */
    const int32_t sel2[8] = {0, 1, 0, 2, 0, 1, 1, 0};
    assign_op(3, 8, 3, sel2, load, pos, cnt, &dropped);
    const int32_t want2[8] = {0, 3, 1, 6, 2, 4, 5, -1};
    for (int i = 0; i < 8; i++) ck_assert_int_eq(pos[i], want2[i]);
    ck_assert_int_eq(load[0], 4);
    ck_assert_int_eq(load[1], 3);
    ck_assert_int_eq(load[2], 1);
    ck_assert_int_eq(cnt[0], 3);
    ck_assert_int_eq(cnt[1], 3);
    ck_assert_int_eq(cnt[2], 1);
    ck_assert_int_eq(dropped, 1);
    /* dropless: capacity N keeps everything */
    assign_op(3, 8, 4, sel2, load, pos, cnt, &dropped);
    ck_assert_int_eq(dropped, 0);
    ck_assert_int_eq(cnt[0], 4);
    /* a choice outside the experts, a capacity of 0 */
    const int32_t sel3[2] = {0, 3};
    cai_tensor ts = cai_tensor_1d(dev, (void *)sel3, CAI_DTYPE_I32, 2), tp = cai_tensor_1d(dev, pos, CAI_DTYPE_I32, 2),
               tl = cai_tensor_1d(dev, load, CAI_DTYPE_I64, 3), tk = cai_tensor_1d(dev, cnt, CAI_DTYPE_I64, 3);
    CK_FAILS(dev->ops->moe_assign(dev, &tp, &tl, &tk, &ts, 2), CAI_ERR_INVALID_ARG,
             "moe_assign: sel[1] = 3 is not one of the 3 experts");
    CK_FAILS(dev->ops->moe_assign(dev, &tp, &tl, &tk, &ts, 0), CAI_ERR_INVALID_ARG, "capacity 0 per expert");

    /* Through the layer: the context's capacity, the count, and a token
     * whose assignments are all dropped gets no routed output. */
    cai_moe_config c = small_cfg();
    c.routing = CAI_MOE_CAPACITY;
    c.capacity_factor = 0.5f;
    moe_fix f;
    CK_OK(moe_fix_init(&f, dev, &c, 24, 8, NULL, 7, 0.5f, 1));
    ck_assert_int_eq(f.cx.capacity, 6); /* ceil(0.5 * 24 * 2 / 4) */
    CK_OK(cai_moe_fwd(&f.cx, &f.p, &f.acts, &f.x, &f.y));
    const int64_t *ld = f.acts.load.data, *sc = f.acts.send_cnt.data;
    int64_t want_drop = 0, kept = 0;
    for (int e = 0; e < 4; e++) {
        want_drop += ld[e] > 6 ? ld[e] - 6 : 0;
        kept += sc[e];
        ck_assert_int_eq(sc[e], ld[e] < 6 ? ld[e] : 6);
    }
    ck_assert_int_gt(want_drop, 0);
    ck_assert_int_eq(f.acts.dropped, want_drop);
    ck_assert_int_eq(kept + want_drop, 48);
    cai_moe_stats st;
    cai_moe_stats_get(&f.cx, &f.acts, &st);
    ck_assert_int_eq(st.dropped, want_drop);
    ck_assert_int_eq(st.assignments, 48);
    const int32_t *ps = f.acts.pos.data;
    const float *y = f.y.data;
    for (int t = 0; t < 24; t++)
        if (ps[2 * t] < 0 && ps[2 * t + 1] < 0)
            for (int c2 = 0; c2 < 8; c2++) ck_assert_float_eq(y[t * 8 + c2], 0.0f);
    moe_fix_free(&f);
}
END_TEST

START_TEST(statistics_summary) {
    const int64_t load[4] = {4, 1, 3, 0};
    cai_moe_stats st;
    cai_moe_stats_from_load(load, 4, 4, 2, &st);
    ck_assert_int_eq(st.load_min, 0);
    ck_assert_int_eq(st.load_max, 4);
    ck_assert_int_eq(st.assignments, 8);
    ck_assert_int_eq(st.dropped, 2);
    ck_assert_double_eq_tol(st.load_cv, sqrt(2.5) / 2.0, 1e-12);
    const int64_t even[4] = {3, 3, 3, 3};
    cai_moe_stats_from_load(even, 4, 6, 0, &st);
    ck_assert_double_eq(st.load_cv, 0.0);
}
END_TEST

START_TEST(registered_names_and_ep_views) {
    cai_moe_config c = small_cfg();
    c.n_shared = 1;
    cai_registry_t *reg;
    cai_registry_options ro = {2};
    CK_OK(cai_registry_init(&reg, &ro));
    CK_OK(cai_moe_register_params(reg, 1, &c, 8, 0.02f));
    ck_assert_int_eq(cai_registry_count(reg), 1 + 4 * 3 + 3);
    const char *want[] = {"h.1.moe.router.weight", "h.1.moe.experts.0.fc.weight", "h.1.moe.experts.0.up.weight",
                          "h.1.moe.experts.0.proj.weight"};
    for (int i = 0; i < 4; i++) ck_assert_str_eq(cai_registry_param(reg, i)->name, want[i]);
    ck_assert_str_eq(cai_registry_param(reg, 13)->name, "h.1.moe.shared.fc.weight");
    ck_assert_int_eq((int)cai_registry_param(reg, 13)->shape[0], 6);
    ck_assert_int_eq((int)cai_registry_param(reg, 3)->shape[0], 8); /* proj [C, F] */
    ck_assert_int_eq(cai_registry_param(reg, 3)->spec.init.kind, CAI_INIT_NORMAL_RESIDUAL);
    ck_assert_int_eq(cai_registry_param(reg, 10)->spec.expert, 3);
    /* ep = 2, rank 1 holds experts 2 and 3 */
    cai_rank_view v = cai_rank_view_single();
    v.ep_size = 2;
    v.ep_rank = 1;
    size_t total, offsets[16];
    CK_OK(cai_registry_local_layout(reg, &v, 16, offsets, &total));
    ck_assert(offsets[1] == SIZE_MAX && offsets[7] != SIZE_MAX);
    float *flat = calloc(total, sizeof(float));
    cai_moe_params p;
    cai_moe_mlp ex[2];
    CK_OK(cai_moe_params_view(reg, &v, 16, 1, &c, dev, flat, &p, ex));
    int idx;
    CK_OK(cai_registry_lookup(reg, "h.1.moe.experts.2.fc.weight", &idx));
    ck_assert_ptr_eq(ex[0].w1.data, flat + offsets[idx]);
    CK_OK(cai_registry_lookup(reg, "h.1.moe.experts.3.proj.weight", &idx));
    ck_assert_ptr_eq(ex[1].w2.data, flat + offsets[idx]);
    ck_assert_int_eq((int)ex[1].w2.shape[0], 8);
    ck_assert_int_eq((int)ex[1].w2.shape[1], 6);
    cai_rank_view bad = v;
    bad.ep_size = 3;
    CK_FAILS(cai_moe_params_view(reg, &bad, 16, 1, &c, dev, flat, &p, ex), CAI_ERR_LAYOUT,
             "moe.n_experts=4 is not divisible by ep=3");
    free(flat);
    cai_registry_free(reg);
}
END_TEST

START_TEST(bad_inputs_refused) {
    cai_moe_config c = small_cfg();
    moe_fix f;
    CK_OK(moe_fix_init(&f, dev, &c, 12, 8, NULL, 3, 0.3f, 1));
    cai_tensor x5 = cai_tensor_2d(dev, f.x.data, CAI_DTYPE_F32, 5, 8);
    CK_FAILS(cai_moe_fwd(&f.cx, &f.p, &f.acts, &x5, &f.y), CAI_ERR_INVALID_ARG,
             "moe: input is f32[5,8], expected contiguous f32 with 12 rows of 8");
    cai_moe_params q = f.p;
    q.router = cai_tensor_2d(dev, f.params, CAI_DTYPE_F32, 3, 8);
    CK_FAILS(cai_moe_fwd(&f.cx, &q, &f.acts, &f.x, &f.y), CAI_ERR_INVALID_ARG,
             "moe: params router is f32[3,8], expected contiguous f32[4,8]");
    q = f.p;
    q.experts = NULL;
    CK_FAILS(cai_moe_fwd(&f.cx, &q, &f.acts, &f.x, &f.y), CAI_ERR_INVALID_ARG, "params or its experts are NULL");
    CK_OK(cai_moe_fwd(&f.cx, &f.p, &f.acts, &f.x, &f.y));
    CK_FAILS(cai_moe_bwd(&f.cx, &f.p, &f.g, &f.acts, &f.x, &f.dy, &f.dy, 1.0f), CAI_ERR_INVALID_ARG,
             "must not overlap");
    moe_fix_free(&f);
}
END_TEST

/* ---------------------------------------------------------- finite differences */

typedef struct {
    const char *name;
    float *val, *grad;
    int64_t n;
} probe;

/* Central differences of the objective for `samples` elements spread over
 * each tensor; |fd - analytic| <= atol + rtol |analytic|. Returns the
 * largest ratio of the error to its bound. */
static double check_fd(moe_fix *f, const probe *pr, int n_probe, int samples, double eps, double atol, double rtol) {
    double worst = 0.0;
    for (int i = 0; i < n_probe; i++)
        for (int s = 0; s < samples; s++) {
            const int64_t j = (int64_t)((s * 2654435761ull + 17 * (uint64_t)i) % (uint64_t)pr[i].n);
            const float keep = pr[i].val[j];
            double up, down;
            pr[i].val[j] = keep + (float)eps;
            CK_OK(moe_fix_objective(f, &up));
            pr[i].val[j] = keep - (float)eps;
            CK_OK(moe_fix_objective(f, &down));
            pr[i].val[j] = keep;
            const double fd = (up - down) / (2.0 * eps), an = pr[i].grad[j];
            const double r = fabs(fd - an) / (atol + rtol * fabs(an));
            ck_assert_msg(r <= 1.0, "%s[%lld]: finite difference %.7g, backward %.7g", pr[i].name, (long long)j, fd,
                          an);
            if (r > worst) worst = r;
        }
    return worst;
}

static void fd_case(cai_moe_config c, const char *label) {
    moe_fix f;
    const int64_t N = 12, C = 8;
    CK_OK(moe_fix_init(&f, dev, &c, N, C, NULL, 11, 0.4f, 1));
    moe_fix_cotangent(&f, 11, 2);
    double obj;
    CK_OK(moe_fix_grads(&f, &obj));
    /* the forwards below overwrite nothing the probes read but f.dx's neighbours: keep dx */
    float *dx0 = malloc((size_t)(N * C) * sizeof(float));
    memcpy(dx0, f.dx.data, (size_t)(N * C) * sizeof(float));
    probe pr[16];
    int n = 0;
    pr[n++] = (probe){"x", f.x.data, dx0, N * C};
    pr[n++] = (probe){"router", f.p.router.data, f.g.router.data, cai_tensor_numel(&f.p.router)};
    for (int e = 0; e < f.cx.n_local; e++) {
        pr[n++] = (probe){"w1", f.pe[e].w1.data, f.ge[e].w1.data, cai_tensor_numel(&f.pe[e].w1)};
        pr[n++] = (probe){"w2", f.pe[e].w2.data, f.ge[e].w2.data, cai_tensor_numel(&f.pe[e].w2)};
        if (e == 1) pr[n++] = (probe){"w3", f.pe[e].w3.data, f.ge[e].w3.data, cai_tensor_numel(&f.pe[e].w3)};
    }
    if (c.n_shared) {
        pr[n++] = (probe){"shared w1", f.p.shared.w1.data, f.g.shared.w1.data, cai_tensor_numel(&f.p.shared.w1)};
        pr[n++] = (probe){"shared w2", f.p.shared.w2.data, f.g.shared.w2.data, cai_tensor_numel(&f.p.shared.w2)};
    }
    double w = check_fd(&f, pr, n, 6, 1e-3, 5e-4, 5e-3);
    fprintf(stderr, "moe %s: finite differences within %.2f of the bound\n", label, w);
    free(dx0);
    moe_fix_free(&f);
}

/* The backward reads only what the forward kept (a second backward adds
 * the same gradients again), and loss_scale scales the two losses'
 * gradients as their coefficients would. */
START_TEST(backward_repeats_and_scales_the_losses) {
    cai_moe_config c = small_cfg();
    c.n_shared = 1;
    c.routing = CAI_MOE_CAPACITY;
    c.capacity_factor = 0.7f;
    moe_fix f, h;
    CK_OK(moe_fix_init(&f, dev, &c, 16, 8, NULL, 5, 0.4f, 1));
    moe_fix_cotangent(&f, 5, 2);
    double obj;
    CK_OK(moe_fix_grads(&f, &obj));
    float *once = malloc(f.n_flat * sizeof(float));
    memcpy(once, f.grads, f.n_flat * sizeof(float));
    CK_OK(cai_moe_bwd(&f.cx, &f.p, &f.g, &f.acts, &f.x, &f.dy, &f.dx, 1.0f));
    for (size_t i = 0; i < f.n_flat; i++) ck_assert_float_eq(f.grads[i], 2.0f * once[i]);
    /* loss_scale 4 with the coefficients c equals loss_scale 1 with 4c, for
     * the router's gradient when the output gradient is zero */
    memset(f.dy.data, 0, cai_tensor_nbytes(&f.dy));
    memset(f.grads, 0, f.n_flat * sizeof(float));
    CK_OK(cai_moe_fwd(&f.cx, &f.p, &f.acts, &f.x, &f.y));
    CK_OK(cai_moe_bwd(&f.cx, &f.p, &f.g, &f.acts, &f.x, &f.dy, &f.dx, 4.0f));
    c.aux_coef *= 4.0f;
    c.z_coef *= 4.0f;
    CK_OK(moe_fix_init(&h, dev, &c, 16, 8, NULL, 5, 0.4f, 1));
    CK_OK(moe_fix_grads(&h, &obj));
    const float *a = f.g.router.data, *b = h.g.router.data;
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < cai_tensor_numel(&f.g.router); i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    ck_assert_msg(m > 0.0 && d <= 1e-6 * m, "router gradient: loss_scale vs coefficients differ by %g of %g", d, m);
    free(once);
    moe_fix_free(&f);
    moe_fix_free(&h);
}
END_TEST

START_TEST(backward_matches_finite_differences) {
    static const struct {
        const char *label;
        cai_moe_router router;
        int norm, k, shared;
        cai_moe_routing routing;
        float cf;
    } cases[] = {
        {"softmax top-2, shared", CAI_MOE_ROUTER_SOFTMAX, 1, 2, 1, CAI_MOE_DROPLESS, 0.0f},
        {"sigmoid, not renormalised", CAI_MOE_ROUTER_SIGMOID, 0, 2, 0, CAI_MOE_DROPLESS, 0.0f},
        {"sigmoid, renormalised", CAI_MOE_ROUTER_SIGMOID, 1, 2, 0, CAI_MOE_DROPLESS, 0.0f},
        {"top-3 then softmax", CAI_MOE_ROUTER_TOPK_SOFTMAX, 1, 3, 0, CAI_MOE_DROPLESS, 0.0f},
        {"capacity 0.6", CAI_MOE_ROUTER_SOFTMAX, 1, 2, 0, CAI_MOE_CAPACITY, 0.6f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cai_moe_config c = small_cfg();
        c.router = cases[i].router;
        c.norm_topk = cases[i].norm;
        c.top_k = cases[i].k;
        c.n_shared = cases[i].shared;
        c.routing = cases[i].routing;
        c.capacity_factor = cases[i].cf;
        fd_case(c, cases[i].label);
    }
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {config_errors_name_the_field,           routing_topk_and_renormalisation,
                            capacity_drops_later_tokens_first,      statistics_summary,
                            registered_names_and_ep_views,          bad_inputs_refused,
                            backward_repeats_and_scales_the_losses, backward_matches_finite_differences};
    MPI_Init(&argc, &argv);
    cai_status st = cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1);
    int failed = 1;
    if (st == CAI_OK) {
        Suite *s = suite_create("moe");
        TCase *tc = tcase_create("moe");
        tcase_set_timeout(tc, 60);
        for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) tcase_add_test(tc, tests[i]);
        suite_add_tcase(s, tc);
        SRunner *sr = srunner_create(s);
        srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        cai_device_free(dev);
    } else cai_error_print(stderr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
