/* Parameter registry: shard hyperslabs for every split kind, pipeline and
 * expert ownership, the flat local layout, and layout-invariant init (every
 * shard under tp=2/4, pp=2, ep=2 reassembles the single-rank tensor bitwise). */
#include "cai_config.h"
#include "colossal/model.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static cai_rank_view view_of(int tp, int tp_rank, int pp, int pp_rank, int ep, int ep_rank) {
    cai_rank_view v = cai_rank_view_single();
    v.tp_size = tp;
    v.tp_rank = tp_rank;
    v.pp_size = pp;
    v.pp_rank = pp_rank;
    v.ep_size = ep;
    v.ep_rank = ep_rank;
    return v;
}

static cai_registry_t *new_registry(int n_layers) {
    cai_registry_t *reg = NULL;
    cai_registry_options opt = {.n_layers = n_layers};
    ck_assert_int_eq(cai_registry_init(&reg, &opt), CAI_OK);
    return reg;
}

static int add2(cai_registry_t *reg, const char *name, uint64_t d0, uint64_t d1, const cai_param_spec *s) {
    uint64_t shape[2] = {d0, d1};
    int idx = -1;
    cai_status st = cai_registry_add(reg, name, 2, shape, CAI_DTYPE_F32, s, &idx);
    ck_assert_msg(st == CAI_OK, "add %s: %s", name, cai_error_message());
    return idx;
}

static int add1(cai_registry_t *reg, const char *name, uint64_t d0, const cai_param_spec *s) {
    int idx = -1;
    cai_status st = cai_registry_add(reg, name, 1, &d0, CAI_DTYPE_F32, s, &idx);
    ck_assert_msg(st == CAI_OK, "add %s: %s", name, cai_error_message());
    return idx;
}

static cai_param_shard shard(const cai_registry_t *reg, int idx, cai_rank_view v) {
    cai_param_shard sh;
    cai_status st = cai_registry_shard(reg, idx, &v, &sh);
    ck_assert_msg(st == CAI_OK, "shard %d: %s", idx, cai_error_message());
    return sh;
}

/* Embedding / LM head: rows are the vocabulary, split over TP. */
static cai_param_spec vocab_spec(cai_pp_place place) {
    cai_param_spec s = cai_param_spec_default();
    s.pp_place = place;
    s.tp_split_dim = 0;
    s.vocab_parallel = 1;
    return s;
}

/* ------------------------------------------------------------ hyperslabs */

START_TEST(column_row_and_replicated_splits) {
    cai_registry_t *reg = new_registry(1);
    cai_param_spec col = cai_param_spec_default(), row = col, rep = col;
    col.layer = row.layer = rep.layer = 0;
    col.tp_split_dim = 0;
    row.tp_split_dim = 1;
    int c = add2(reg, "h.0.mlp.fc.weight", 8, 6, &col);
    int r = add2(reg, "h.0.mlp.proj.weight", 6, 8, &row);
    int n = add1(reg, "h.0.ln_1.weight", 6, &rep);
    int tps[3] = {1, 2, 4};
    for (int t = 0; t < 3; t++) {
        int tp = tps[t];
        for (int rank = 0; rank < tp; rank++) {
            cai_rank_view v = view_of(tp, rank, 1, 0, 1, 0);
            cai_param_shard a = shard(reg, c, v), b = shard(reg, r, v), z = shard(reg, n, v);
            ck_assert(a.held && b.held && z.held);
            ck_assert_int_eq(a.n_slabs, 1);
            ck_assert_uint_eq(a.slab[0].offset[0], (uint64_t)(8 / tp * rank));
            ck_assert_uint_eq(a.slab[0].count[0], (uint64_t)(8 / tp));
            ck_assert_uint_eq(a.slab[0].offset[1], 0);
            ck_assert_uint_eq(a.slab[0].count[1], 6);
            ck_assert_uint_eq(a.local_shape[0], (uint64_t)(8 / tp));
            ck_assert_uint_eq(a.local_numel, (uint64_t)(48 / tp));
            ck_assert_int_eq(a.slab[0].replicas, 1);
            ck_assert_uint_eq(b.slab[0].offset[0], 0);
            ck_assert_uint_eq(b.slab[0].count[0], 6);
            ck_assert_uint_eq(b.slab[0].offset[1], (uint64_t)(8 / tp * rank));
            ck_assert_uint_eq(b.slab[0].count[1], (uint64_t)(8 / tp));
            ck_assert_uint_eq(b.local_shape[1], (uint64_t)(8 / tp));
            ck_assert_uint_eq(z.slab[0].count[0], 6);
            ck_assert_int_eq(z.slab[0].replicas, tp);
            ck_assert_int_eq(z.slab[0].replica_rank, rank);
            ck_assert_uint_eq(z.local_numel, 6);
        }
    }
    /* 6 columns do not split over 4 ranks: the message says which tp would. */
    cai_rank_view v4 = view_of(4, 0, 1, 0, 1, 0);
    cai_param_shard sh;
    ck_assert_int_eq(cai_registry_shard(reg, r, &v4, &sh), CAI_OK);
    ck_assert_int_eq(cai_registry_check_view(reg, &v4), CAI_OK);
    cai_param_spec bad = row;
    add2(reg, "h.0.attn.proj.weight", 8, 6, &bad);
    ck_assert_int_eq(cai_registry_check_view(reg, &v4), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(),
                                 "'h.0.attn.proj.weight': dim 1 of size 6 does not split "
                                 "over tp=4 (tp that fit: 1 2 3 6)"));
    cai_error_clear();
    cai_registry_free(reg);
}
END_TEST

START_TEST(vocab_split_is_balanced_and_uneven) {
    cai_registry_t *reg = new_registry(0);
    cai_param_spec s = vocab_spec(CAI_PP_FIRST);
    int w = add2(reg, "wte.weight", 10, 3, &s);
    const uint64_t lo[4] = {0, 2, 5, 7}, cnt[4] = {2, 3, 2, 3}; /* floor(r*10/4) */
    for (int rank = 0; rank < 4; rank++) {
        cai_param_shard sh = shard(reg, w, view_of(4, rank, 1, 0, 1, 0));
        ck_assert_uint_eq(sh.slab[0].offset[0], lo[rank]);
        ck_assert_uint_eq(sh.slab[0].count[0], cnt[rank]);
        ck_assert_uint_eq(sh.local_numel, cnt[rank] * 3);
    }
    /* Without the vocab flag the same split is refused. */
    s.vocab_parallel = 0;
    add2(reg, "lm_head.weight", 10, 3, &s);
    cai_rank_view v = view_of(4, 1, 1, 0, 1, 0);
    ck_assert_int_eq(cai_registry_check_view(reg, &v), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "tp that fit: 1 2 5 10"));
    /* More ranks than vocabulary rows cannot work at all. */
    cai_registry_t *tiny = new_registry(0);
    s.vocab_parallel = 1;
    add2(tiny, "wte.weight", 3, 2, &s);
    cai_rank_view v4 = view_of(4, 0, 1, 0, 1, 0);
    ck_assert_int_eq(cai_registry_check_view(tiny, &v4), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "'wte.weight': vocabulary dim 0 of size 3"));
    cai_error_clear();
    cai_registry_free(tiny);
    cai_registry_free(reg);
}
END_TEST

/* Checks a fused QKV shard from what attention needs: a rank's query heads
 * are a contiguous 1/tp of all heads, and its K and V rows are exactly the kv
 * heads those query heads read (q head h reads kv head h / (nq/nkv)). Each
 * global row is tagged with its index and read back through the shard. */
static void check_qkv_semantics(int nq, int nkv, int hd, int tp, int cols) {
    cai_registry_t *reg = new_registry(1);
    cai_param_spec s = cai_param_spec_default();
    s.layer = 0;
    s.tp_split_dim = 0;
    s.qkv = (cai_qkv_groups){nq, nkv, hd};
    int rows = (nq + 2 * nkv) * hd;
    int w = add2(reg, "h.0.attn.qkv.weight", (uint64_t)rows, (uint64_t)cols, &s);
    int *global = malloc(sizeof(int) * (size_t)(rows * cols));
    for (int i = 0; i < rows * cols; i++) global[i] = i / cols; /* row id */
    int group = nq / nkv;
    int *holders = calloc((size_t)nkv, sizeof(int));
    for (int r = 0; r < tp; r++) {
        cai_param_shard sh = shard(reg, w, view_of(tp, r, 1, 0, 1, 0));
        ck_assert_int_eq(sh.n_slabs, 3);
        int q_per = nq / tp;
        int kv_lo = (r * q_per) / group, kv_hi = ((r + 1) * q_per - 1) / group; /* inclusive */
        int n_kv = kv_hi - kv_lo + 1;
        ck_assert_uint_eq(sh.local_shape[0], (uint64_t)((q_per + 2 * n_kv) * hd));
        ck_assert_uint_eq(sh.local_shape[1], (uint64_t)cols);
        int *local = malloc(sizeof(int) * sh.local_numel);
        cai_shard_extract(&sh, sizeof(int), global, local);
        int lr = 0;
        for (int h = r * q_per; h < (r + 1) * q_per; h++)
            for (int e = 0; e < hd; e++, lr++) ck_assert_int_eq(local[lr * cols], h * hd + e);
        for (int sec = 0; sec < 2; sec++)
            for (int h = kv_lo; h <= kv_hi; h++)
                for (int e = 0; e < hd; e++, lr++)
                    ck_assert_int_eq(local[lr * cols + cols - 1], (nq + sec * nkv + h) * hd + e);
        ck_assert_int_eq(lr, (int)sh.local_shape[0]);
        for (int h = kv_lo; h <= kv_hi; h++) holders[h]++;
        /* Replicated kv slabs: replicas counts the ranks holding them, replica 0 among them writes. */
        int expect_rep = nkv < tp ? tp / nkv : 1;
        ck_assert_int_eq(sh.slab[1].replicas, expect_rep);
        ck_assert_int_eq(sh.slab[2].replica_rank, sh.slab[1].replica_rank);
        ck_assert_int_lt(sh.slab[1].replica_rank, expect_rep);
        ck_assert_int_eq(sh.slab[0].replicas, 1);
        free(local);
    }
    for (int h = 0; h < nkv; h++) ck_assert_int_eq(holders[h], nkv < tp ? tp / nkv : 1);
    free(holders);
    free(global);
    cai_registry_free(reg);
}

START_TEST(fused_qkv_takes_whole_heads) {
    /* Hand-worked MHA case: 4 heads of 2, tp=2 -> rank 1 has q rows 4..7, k 12..15, v 20..23. */
    cai_registry_t *reg = new_registry(1);
    cai_param_spec s = cai_param_spec_default();
    s.layer = 0;
    s.tp_split_dim = 0;
    s.qkv = (cai_qkv_groups){4, 4, 2};
    int w = add2(reg, "h.0.attn.qkv.weight", 24, 8, &s);
    cai_param_shard sh = shard(reg, w, view_of(2, 1, 1, 0, 1, 0));
    const uint64_t off[3] = {4, 12, 20};
    for (int i = 0; i < 3; i++) {
        ck_assert_uint_eq(sh.slab[i].offset[0], off[i]);
        ck_assert_uint_eq(sh.slab[i].count[0], 4);
        ck_assert_uint_eq(sh.slab[i].count[1], 8);
    }
    ck_assert_uint_eq(sh.local_numel, 12 * 8);
    /* A 1-D fused bias shards the same way. */
    uint64_t blen = 24;
    int b = -1;
    ck_assert_int_eq(cai_registry_add(reg, "h.0.attn.qkv.bias", 1, &blen, CAI_DTYPE_F32, &s, &b), CAI_OK);
    cai_param_shard bs = shard(reg, b, view_of(2, 0, 1, 0, 1, 0));
    ck_assert_uint_eq(bs.slab[1].offset[0], 8);
    ck_assert_uint_eq(bs.local_shape[0], 12);
    /* Shape must agree with the grouping. */
    int bad_idx;
    ck_assert_int_eq(cai_registry_add(reg, "h.0.attn.qkv2.weight", 1, &blen, CAI_DTYPE_F32,
                                      &(cai_param_spec){.tp_split_dim = 0, .layer = 0, .expert = -1, .qkv = {4, 2, 2}},
                                      &bad_idx),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "needs (4 + 2*2)*2 = 16"));
    cai_registry_free(reg);

    check_qkv_semantics(4, 4, 2, 1, 3);
    check_qkv_semantics(4, 4, 2, 2, 3);
    check_qkv_semantics(4, 4, 2, 4, 3);
    check_qkv_semantics(8, 2, 2, 2, 3); /* GQA, kv heads split */
    check_qkv_semantics(8, 2, 2, 4, 3); /* kv heads replicated over 2 ranks each */
    check_qkv_semantics(8, 1, 3, 8, 2); /* MQA: one kv head on all 8 ranks */

    /* 6 q / 3 kv heads over tp=2: kv neither splits nor replicates evenly. */
    reg = new_registry(1);
    s.qkv = (cai_qkv_groups){6, 3, 2};
    add2(reg, "h.0.attn.qkv.weight", 24, 4, &s);
    cai_rank_view v2 = view_of(2, 0, 1, 0, 1, 0), v4 = view_of(4, 0, 1, 0, 1, 0);
    ck_assert_int_eq(cai_registry_check_view(reg, &v2), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "3 kv heads neither split over tp=2"));
    ck_assert_int_eq(cai_registry_check_view(reg, &v4), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "6 query heads do not split over tp=4 (tp that fit: 1 2 3 6)"));
    cai_error_clear();
    cai_registry_free(reg);
}
END_TEST

/* ------------------------------------------------------------ ownership */

/* The stage every pipeline rank names as owner; checks that exactly that rank holds it. */
static int stage_of(const cai_registry_t *reg, cai_rank_view v, int idx) {
    v.pp_rank = 0;
    int owner = shard(reg, idx, v).pp_stage;
    for (int r = 0; r < v.pp_size; r++) {
        v.pp_rank = r;
        cai_param_shard sh = shard(reg, idx, v);
        ck_assert_int_eq(sh.pp_stage, owner);
        ck_assert_int_eq(sh.held, r == owner);
        if (sh.held) {
            ck_assert_uint_gt(sh.local_numel, 0);
        } else {
            ck_assert_uint_eq(sh.local_numel, 0);
            ck_assert_int_eq(sh.n_slabs, 0);
        }
    }
    return owner;
}

START_TEST(pipeline_stage_ownership) {
    cai_registry_t *reg = new_registry(4);
    cai_param_spec s = cai_param_spec_default();
    int layer_idx[4];
    char name[64];
    for (int l = 0; l < 4; l++) {
        s.layer = l;
        snprintf(name, sizeof name, "h.%d.ln_1.weight", l);
        layer_idx[l] = add1(reg, name, 4, &s);
    }
    s.layer = -1;
    s.pp_place = CAI_PP_FIRST;
    int first = add1(reg, "wpe.weight", 4, &s);
    s.pp_place = CAI_PP_LAST;
    int last = add1(reg, "ln_f.weight", 4, &s);

    cai_rank_view v = view_of(1, 0, 2, 0, 1, 0);
    const int contiguous[4] = {0, 0, 1, 1};
    for (int l = 0; l < 4; l++) ck_assert_int_eq(stage_of(reg, v, layer_idx[l]), contiguous[l]);
    ck_assert_int_eq(stage_of(reg, v, first), 0);
    ck_assert_int_eq(stage_of(reg, v, last), 1);

    v.pp_chunks = 2; /* interleaved: chunk c of rank r holds layer c*pp + r */
    const int interleaved[4] = {0, 1, 0, 1};
    for (int l = 0; l < 4; l++) {
        ck_assert_int_eq(stage_of(reg, v, layer_idx[l]), interleaved[l]);
        int st = -1;
        ck_assert_int_eq(cai_registry_layer_stage(reg, &v, l, &st), CAI_OK);
        ck_assert_int_eq(st, interleaved[l]);
    }
    ck_assert_int_eq(stage_of(reg, v, last), 1);

    /* The V placement (zb-v: the last layer comes back to rank 0), balanced
     * and from a partition's own virtual stages. */
    const int vshape[4] = {0, 1, 1, 0}, vstages[4] = {0, 1, 2, 3};
    v.pp_chunks = 2;
    v.pp_vshape = 1;
    for (int pass = 0; pass < 2; pass++) {
        v.layer_vstage = pass ? vstages : NULL;
        for (int l = 0; l < 4; l++) {
            ck_assert_int_eq(stage_of(reg, v, layer_idx[l]), vshape[l]);
            int vs = -1;
            ck_assert_int_eq(cai_registry_layer_vstage(reg, &v, l, &vs), CAI_OK);
            ck_assert_int_eq(vs, l);
        }
        ck_assert_int_eq(stage_of(reg, v, first), 0);
        ck_assert_int_eq(stage_of(reg, v, last), 0);
    }
    const int bad_map[4] = {0, 1, 3, 3}, short_map[4] = {0, 1, 1, 2};
    v.layer_vstage = bad_map;
    ck_assert_int_eq(cai_registry_check_view(reg, &v), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "layer_vstage[2]=3"));
    v.layer_vstage = short_map;
    ck_assert_int_eq(cai_registry_check_view(reg, &v), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "fills virtual stages 0..2 of pp=2 x pp_chunks=2 = 4"));
    v.layer_vstage = NULL;
    v.pp_chunks = 3;
    ck_assert_int_eq(cai_registry_check_view(reg, &v), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "a V placement holds 2 chunks per rank"));
    v.pp_vshape = 0;

    /* Too many stages for the layers. */
    cai_rank_view v8 = view_of(1, 0, 4, 0, 1, 0);
    v8.pp_chunks = 2;
    ck_assert_int_eq(cai_registry_check_view(reg, &v8), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "4 layers cannot fill pp=4 x 2 chunk(s) = 8"));
    cai_error_clear();
    cai_registry_free(reg);

    /* Uneven: 5 layers on 2 ranks -> [0,2) and [2,5). */
    reg = new_registry(5);
    s = cai_param_spec_default();
    for (int l = 0; l < 5; l++) {
        s.layer = l;
        snprintf(name, sizeof name, "h.%d.ln_1.weight", l);
        int idx = add1(reg, name, 2, &s);
        ck_assert_int_eq(stage_of(reg, view_of(1, 0, 2, 0, 1, 0), idx), l < 2 ? 0 : 1);
    }
    cai_registry_free(reg);
}
END_TEST

START_TEST(expert_ownership) {
    cai_registry_t *reg = new_registry(1);
    cai_param_spec s = cai_param_spec_default();
    s.layer = 0;
    s.tp_split_dim = 0;
    s.n_experts = 4;
    int ex[4];
    char name[64];
    for (int e = 0; e < 4; e++) {
        s.expert = e;
        snprintf(name, sizeof name, "h.0.moe.experts.%d.fc.weight", e);
        ex[e] = add2(reg, name, 8, 4, &s);
    }
    cai_param_spec d = cai_param_spec_default();
    d.layer = 0;
    int router = add2(reg, "h.0.moe.router.weight", 4, 4, &d);
    const int eps[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        int ep = eps[k];
        for (int e = 0; e < 4; e++) {
            int owner = e / (4 / ep); /* contiguous blocks of E/ep experts */
            for (int r = 0; r < ep; r++) {
                cai_param_shard sh = shard(reg, ex[e], view_of(2, 1, 1, 0, ep, r));
                ck_assert_int_eq(sh.ep_owner, owner);
                ck_assert_int_eq(sh.held, r == owner);
                if (sh.held) ck_assert_uint_eq(sh.slab[0].offset[0], 4); /* still TP-split */
                ck_assert(shard(reg, router, view_of(2, 1, 1, 0, ep, r)).held);
            }
        }
    }
    cai_rank_view v3 = view_of(1, 0, 1, 0, 3, 0);
    ck_assert_int_eq(cai_registry_check_view(reg, &v3), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "4 experts do not split over ep=3"));
    cai_error_clear();
    cai_registry_free(reg);
}
END_TEST

/* ------------------------------------------------------------ table, layout, errors */

START_TEST(table_lookup_and_validation) {
    cai_registry_t *reg = new_registry(2);
    cai_param_spec s = cai_param_spec_default();
    s.layer = 0;
    int a = add2(reg, "h.0.attn.proj.weight", 4, 4, &s);
    int b = add1(reg, "h.0.attn.proj.bias", 4, &s);
    ck_assert_int_eq(cai_registry_count(reg), 2);
    ck_assert_int_eq(cai_registry_find(reg, "h.0.attn.proj.bias"), b);
    ck_assert_int_eq(cai_registry_find(reg, "h.0.attn.proj"), -1);
    int idx = -1;
    ck_assert_int_eq(cai_registry_lookup(reg, "h.9.x", &idx), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "no parameter named 'h.9.x'"));
    ck_assert_int_eq(cai_registry_lookup(reg, "h.0.attn.proj.weight", &idx), CAI_OK);
    ck_assert_int_eq(idx, a);
    ck_assert_uint_eq(cai_registry_global_numel(reg), 20);
    ck_assert_int_eq(cai_registry_param(reg, a)->spec.weight_decay, 1); /* auto: matrices decay */
    ck_assert_int_eq(cai_registry_param(reg, b)->spec.weight_decay, 0); /* vectors do not */
    ck_assert_ptr_null(cai_registry_param(reg, 2));

    uint64_t sh4[1] = {4};
    struct {
        const char *name;
        const char *msg;
    } bad_names[] = {{"h..x", "empty segment"}, {"H.0.x", "character 'H'"}, {".x", "empty segment"},
                     {"x.", "empty segment"},   {"", "length 0"},           {"h.0-x", "character '-'"}};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        ck_assert_int_eq(cai_registry_add(reg, bad_names[i].name, 1, sh4, CAI_DTYPE_F32, &s, NULL),
                         CAI_ERR_INVALID_ARG);
        ck_assert_msg(strstr(cai_error_message(), bad_names[i].msg), "%s: %s", bad_names[i].name, cai_error_message());
    }
    ck_assert_int_eq(cai_registry_add(reg, "h.0.attn.proj.bias", 1, sh4, CAI_DTYPE_F32, &s, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "'h.0.attn.proj.bias' is already registered (index 1)"));
    cai_param_spec t = s;
    t.tp_split_dim = 1;
    ck_assert_int_eq(cai_registry_add(reg, "h.0.x", 1, sh4, CAI_DTYPE_F32, &t, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "tp_split_dim=1 but the parameter has 1 dims"));
    t = s;
    t.layer = 2;
    ck_assert_int_eq(cai_registry_add(reg, "h.2.x", 1, sh4, CAI_DTYPE_F32, &t, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "layer 2 out of range (registry has 2 layers"));
    t = cai_param_spec_default();
    ck_assert_int_eq(cai_registry_add(reg, "ln_f.weight", 1, sh4, CAI_DTYPE_F32, &t, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "'ln_f.weight': no pipeline placement"));
    t = s;
    t.init.kind = CAI_INIT_NORMAL;
    ck_assert_int_eq(cai_registry_add(reg, "h.0.y", 1, sh4, CAI_DTYPE_F32, &t, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "normal init needs a finite std > 0"));
    t = s;
    t.expert = 4;
    t.n_experts = 4;
    ck_assert_int_eq(cai_registry_add(reg, "h.0.z", 1, sh4, CAI_DTYPE_F32, &t, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "expert 4 of 4 is out of range"));

    /* Tied copies must match in shape, sharding and init. */
    t = vocab_spec(CAI_PP_FIRST);
    t.tie_group = 1;
    t.init = (cai_init_spec){CAI_INIT_NORMAL, 0.02f};
    int wte = add2(reg, "wte.weight", 10, 4, &t);
    t.pp_place = CAI_PP_LAST;
    uint64_t other[2] = {10, 5};
    ck_assert_int_eq(cai_registry_add(reg, "lm_head.weight", 2, other, CAI_DTYPE_F32, &t, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "'lm_head.weight' in tie group 1 does not match"));
    t.init.std = 0.01f;
    other[1] = 4;
    ck_assert_int_eq(cai_registry_add(reg, "lm_head.weight", 2, other, CAI_DTYPE_F32, &t, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "has init normal(0.01) but 'wte.weight' has normal(0.02)"));
    t.init.std = 0.02f;
    int head = add2(reg, "lm_head.weight", 10, 4, &t);
    int members[4];
    ck_assert_int_eq(cai_registry_tie_members(reg, 1, members, 4), 2);
    ck_assert_int_eq(members[0], wte);
    ck_assert_int_eq(members[1], head);
    ck_assert_int_eq(cai_registry_param(reg, head)->tie_primary, wte);
    ck_assert_uint_eq(cai_registry_param(reg, head)->init_stream, cai_hash64("wte.weight"));
    ck_assert_int_eq(cai_registry_count(reg), 4);

    /* Many parameters: the name table grows and still finds every one. */
    char name[64];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "h.1.extra.p%d", i);
        t = cai_param_spec_default();
        t.layer = 1;
        add1(reg, name, 1, &t);
    }
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "h.1.extra.p%d", i);
        ck_assert_int_eq(cai_registry_find(reg, name), 4 + i);
    }
    cai_error_clear();
    cai_registry_free(reg);
}
END_TEST

START_TEST(flat_layout_follows_registration_order) {
    cai_registry_t *reg = new_registry(2);
    cai_param_spec s = vocab_spec(CAI_PP_FIRST);
    add2(reg, "wte.weight", 10, 3, &s); /* tp=2: 5x3 = 15 */
    s = cai_param_spec_default();
    s.layer = 0;
    add1(reg, "h.0.ln_1.weight", 7, &s); /* 7, replicated */
    s.layer = 1;
    s.tp_split_dim = 1;
    add2(reg, "h.1.attn.proj.weight", 4, 6, &s); /* 4x3 = 12, stage 1 under pp=2 */
    s = cai_param_spec_default();
    s.pp_place = CAI_PP_LAST;
    add1(reg, "ln_f.weight", 5, &s);

    size_t off[4], total = 0;
    cai_rank_view v = view_of(2, 1, 1, 0, 1, 0);
    ck_assert_int_eq(cai_registry_local_layout(reg, &v, 16, off, &total), CAI_OK);
    ck_assert_uint_eq(off[0], 0);
    ck_assert_uint_eq(off[1], 16);
    ck_assert_uint_eq(off[2], 32);
    ck_assert_uint_eq(off[3], 48);
    ck_assert_uint_eq(total, 64);
    ck_assert_int_eq(cai_registry_local_layout(reg, &v, 0, off, &total), CAI_OK);
    ck_assert_uint_eq(off[3], 15 + 7 + 12);
    ck_assert_uint_eq(total, 15 + 7 + 12 + 5);

    v = view_of(2, 0, 2, 1, 1, 0); /* last stage: only the layer-1 matrix and ln_f */
    ck_assert_int_eq(cai_registry_local_layout(reg, &v, 8, off, &total), CAI_OK);
    ck_assert_uint_eq(off[0], SIZE_MAX);
    ck_assert_uint_eq(off[1], SIZE_MAX);
    ck_assert_uint_eq(off[2], 0);
    ck_assert_uint_eq(off[3], 16);
    ck_assert_uint_eq(total, 24);

    /* init_flat fills exactly those places with what init_local produces. */
    float flat[24], one[16];
    memset(flat, 0xff, sizeof flat);
    ck_assert_int_eq(cai_registry_init_flat(reg, &v, 5, 8, flat, 23), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_registry_init_flat(reg, &v, 5, 8, flat, 24), CAI_OK);
    ck_assert_int_eq(cai_registry_init_local(reg, 2, &v, 5, one, 16), CAI_OK);
    ck_assert_mem_eq(flat, one, 12 * sizeof(float));
    for (int i = 12; i < 16; i++) ck_assert_float_eq(flat[i], 0.0f);
    cai_error_clear();
    cai_registry_free(reg);
}
END_TEST

/* ------------------------------------------------------------ init */

/* A small model touching every spec feature: uneven vocab split, tied head,
 * GQA fused QKV (replicated kv at tp=4), row/column splits, residual init,
 * experts, first/last-stage parameters. */
static cai_registry_t *build_model(void) {
    enum { C = 8, V = 11, L = 4, F = 16, E = 4 };
    cai_registry_t *reg = new_registry(L);
    cai_param_spec s = vocab_spec(CAI_PP_FIRST);
    s.tie_group = 1;
    s.init = (cai_init_spec){CAI_INIT_NORMAL, 0.02f};
    add2(reg, "wte.weight", V, C, &s);
    s = cai_param_spec_default();
    s.pp_place = CAI_PP_FIRST;
    s.init = (cai_init_spec){CAI_INIT_NORMAL, 0.01f};
    add2(reg, "wpe.weight", 16, C, &s);
    char name[64];
    for (int l = 0; l < L; l++) {
        cai_param_spec b = cai_param_spec_default();
        b.layer = l;
        cai_param_spec x = b;
#define NAME(suffix) (snprintf(name, sizeof name, "h.%d." suffix, l), name)
        x.init.kind = CAI_INIT_ONES;
        add1(reg, NAME("ln_1.weight"), C, &x);
        add1(reg, NAME("ln_1.bias"), C, &b);
        x = b;
        x.tp_split_dim = 0;
        x.qkv = (cai_qkv_groups){4, 2, 2};
        x.init = (cai_init_spec){CAI_INIT_NORMAL, 0.02f};
        add2(reg, NAME("attn.qkv.weight"), 16, C, &x);
        add1(reg, NAME("attn.qkv.bias"), 16, &x);
        x = b;
        x.tp_split_dim = 1;
        x.init = (cai_init_spec){CAI_INIT_NORMAL_RESIDUAL, 0.02f};
        add2(reg, NAME("attn.proj.weight"), C, C, &x);
        x = b;
        x.tp_split_dim = 0;
        x.init = (cai_init_spec){CAI_INIT_NORMAL, 0.02f};
        add2(reg, NAME("mlp.fc.weight"), F, C, &x);
        if (l % 2 == 1) {
            cai_param_spec r = b;
            r.init = (cai_init_spec){CAI_INIT_NORMAL, 0.02f};
            add2(reg, NAME("moe.router.weight"), E, C, &r);
            for (int e = 0; e < E; e++) {
                cai_param_spec m = x;
                m.expert = e;
                m.n_experts = E;
                snprintf(name, sizeof name, "h.%d.moe.experts.%d.fc.weight", l, e);
                add2(reg, name, F, C, &m);
            }
        }
        x = b;
        x.tp_split_dim = 1;
        x.init = (cai_init_spec){CAI_INIT_NORMAL_RESIDUAL, 0.02f};
        add2(reg, NAME("mlp.proj.weight"), C, F, &x);
#undef NAME
    }
    s = cai_param_spec_default();
    s.pp_place = CAI_PP_LAST;
    s.init.kind = CAI_INIT_ONES;
    add1(reg, "ln_f.weight", C, &s);
    s = vocab_spec(CAI_PP_LAST);
    s.tie_group = 1;
    s.init = (cai_init_spec){CAI_INIT_NORMAL, 0.02f};
    add2(reg, "lm_head.weight", V, C, &s);
    return reg;
}

START_TEST(init_values_follow_the_formula) {
    cai_registry_t *reg = build_model();
    const uint64_t seed = 1234;
    cai_rank_view one = cai_rank_view_single();
    int head = cai_registry_find(reg, "lm_head.weight"), wte = cai_registry_find(reg, "wte.weight");
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *p = cai_registry_param(reg, i);
        float *buf = malloc(sizeof(float) * p->numel);
        ck_assert_int_eq(cai_registry_init_local(reg, i, &one, seed, buf, p->numel), CAI_OK);
        const char *stream_name = i == head ? "wte.weight" : p->name;
        double std = 0;
        if (p->spec.init.kind == CAI_INIT_NORMAL) std = p->spec.init.std;
        if (p->spec.init.kind == CAI_INIT_NORMAL_RESIDUAL) std = p->spec.init.std / sqrt(2.0 * 4);
        ck_assert_float_eq(cai_registry_init_std(reg, i), (float)std);
        for (uint64_t g = 0; g < p->numel; g++) {
            float want;
            switch (p->spec.init.kind) {
            case CAI_INIT_ZEROS: want = 0.0f; break;
            case CAI_INIT_ONES: want = 1.0f; break;
            default: want = (float)std * cai_rng_normal(seed, cai_hash64(stream_name), g); break;
            }
            ck_assert_msg(memcmp(&buf[g], &want, sizeof want) == 0, "%s[%llu]: %g != %g", p->name,
                          (unsigned long long)g, (double)buf[g], (double)want);
        }
        free(buf);
    }
    /* Different seeds and different parameters give different streams. */
    float a[128], b[128], c[128];
    int qkv0 = cai_registry_find(reg, "h.0.attn.qkv.weight"), qkv1 = cai_registry_find(reg, "h.1.attn.qkv.weight");
    cai_registry_init_local(reg, qkv0, &one, 1, a, 128);
    cai_registry_init_local(reg, qkv0, &one, 2, b, 128);
    cai_registry_init_local(reg, qkv1, &one, 1, c, 128);
    ck_assert(memcmp(a, b, sizeof a) != 0);
    ck_assert(memcmp(a, c, sizeof a) != 0);
    ck_assert_int_eq(cai_registry_init_local(reg, wte, &one, 1, a, 4), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "local shard has 88 elements but the buffer holds 4"));
    cai_error_clear();
    cai_registry_free(reg);
}
END_TEST

/* Independent placement: visits every element of every slab with its own
 * index arithmetic, so it does not share the library's run walker. */
static void naive_place(const cai_param_shard *sh, const float *local, float *global, unsigned char *hits) {
    uint64_t gs[4], c[4], o[4], ls[4];
    for (int d = 0; d < 4; d++) {
        gs[d] = d < sh->ndim ? sh->global_shape[d] : 1;
        ls[d] = d < sh->ndim ? sh->local_shape[d] : 1;
    }
    uint64_t split_pos = 0;
    for (int s = 0; s < sh->n_slabs; s++) {
        for (int d = 0; d < 4; d++) {
            c[d] = d < sh->ndim ? sh->slab[s].count[d] : 1;
            o[d] = d < sh->ndim ? sh->slab[s].offset[d] : 0;
        }
        for (uint64_t i0 = 0; i0 < c[0]; i0++)
            for (uint64_t i1 = 0; i1 < c[1]; i1++)
                for (uint64_t i2 = 0; i2 < c[2]; i2++)
                    for (uint64_t i3 = 0; i3 < c[3]; i3++) {
                        uint64_t l[4] = {i0, i1, i2, i3};
                        if (sh->split_dim >= 0) l[sh->split_dim] += split_pos;
                        uint64_t li = ((l[0] * ls[1] + l[1]) * ls[2] + l[2]) * ls[3] + l[3];
                        uint64_t gi = (((o[0] + i0) * gs[1] + o[1] + i1) * gs[2] + o[2] + i2) * gs[3] + o[3] + i3;
                        if (hits[gi]) /* replicas must agree bit for bit */
                            ck_assert_msg(memcmp(&global[gi], &local[li], sizeof(float)) == 0, "replica mismatch");
                        global[gi] = local[li];
                        hits[gi] = 1;
                        ck_assert_uint_eq(cai_shard_global_index(sh, li), gi);
                    }
        if (sh->split_dim >= 0) split_pos += sh->slab[s].count[sh->split_dim];
    }
}

START_TEST(shards_reassemble_the_single_rank_init) {
    cai_registry_t *reg = build_model();
    const uint64_t seed = 99;
    int n = cai_registry_count(reg);
    cai_rank_view single = cai_rank_view_single();
    float **ref = calloc((size_t)n, sizeof *ref);
    for (int i = 0; i < n; i++) {
        uint64_t numel = cai_registry_param(reg, i)->numel;
        ref[i] = malloc(sizeof(float) * numel);
        ck_assert_int_eq(cai_registry_init_local(reg, i, &single, seed, ref[i], numel), CAI_OK);
    }
    struct {
        int tp, pp, ep, chunks;
    } layouts[] = {{2, 1, 1, 1}, {1, 2, 1, 1}, {2, 2, 1, 1}, {4, 1, 1, 1}, {4, 2, 2, 2}, {1, 1, 4, 1}, {2, 2, 2, 1}};
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        for (int i = 0; i < n; i++) {
            const cai_param_info *p = cai_registry_param(reg, i);
            float *global = malloc(sizeof(float) * p->numel);
            unsigned char *hits = calloc(p->numel, 1);
            int holders = 0;
            for (int pr = 0; pr < layouts[k].pp; pr++)
                for (int er = 0; er < layouts[k].ep; er++)
                    for (int tr = 0; tr < layouts[k].tp; tr++) {
                        cai_rank_view v = view_of(layouts[k].tp, tr, layouts[k].pp, pr, layouts[k].ep, er);
                        v.pp_chunks = layouts[k].chunks;
                        cai_param_shard sh = shard(reg, i, v);
                        if (!sh.held) continue;
                        holders++;
                        float *local = malloc(sizeof(float) * (sh.local_numel + 1));
                        ck_assert_int_eq(cai_registry_init_local(reg, i, &v, seed, local, sh.local_numel), CAI_OK);
                        naive_place(&sh, local, global, hits);
                        /* The library's own extract yields the same shard from the reference. */
                        float *again = malloc(sizeof(float) * (sh.local_numel + 1));
                        cai_shard_extract(&sh, sizeof(float), ref[i], again);
                        ck_assert_mem_eq(again, local, sh.local_numel * sizeof(float));
                        free(again);
                        free(local);
                    }
            /* one pipeline stage; every ep rank for dense parameters, one for an expert */
            ck_assert_int_eq(holders, layouts[k].tp * (p->spec.n_experts ? 1 : layouts[k].ep));
            for (uint64_t g = 0; g < p->numel; g++)
                ck_assert_msg(hits[g], "%s element %llu missing under tp=%d pp=%d ep=%d", p->name,
                              (unsigned long long)g, layouts[k].tp, layouts[k].pp, layouts[k].ep);
            ck_assert_msg(memcmp(global, ref[i], sizeof(float) * p->numel) == 0,
                          "%s differs from the single-rank init under tp=%d pp=%d ep=%d", p->name, layouts[k].tp,
                          layouts[k].pp, layouts[k].ep);
            free(hits);
            free(global);
        }
    }
    /* Tied copies start equal. */
    int wte = cai_registry_find(reg, "wte.weight"), head = cai_registry_find(reg, "lm_head.weight");
    ck_assert_mem_eq(ref[wte], ref[head], sizeof(float) * cai_registry_param(reg, wte)->numel);
    for (int i = 0; i < n; i++) free(ref[i]);
    free(ref);
    cai_registry_free(reg);
}
END_TEST

/* Large shards are initialised by several OpenMP threads; the values must
 * still be exactly the formula's (a column slab: many short runs). */
START_TEST(threaded_init_matches_the_formula) {
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    cai_registry_t *reg = new_registry(1);
    cai_param_spec s = cai_param_spec_default();
    s.layer = 0;
    s.tp_split_dim = 1;
    s.init = (cai_init_spec){CAI_INIT_NORMAL, 0.5f};
    int w = add2(reg, "h.0.mlp.proj.weight", 256, 520, &s);
    cai_rank_view v = view_of(2, 1, 1, 0, 1, 0);
    cai_param_shard sh = shard(reg, w, v);
    float *local = malloc(sizeof(float) * sh.local_numel);
    ck_assert_int_eq(cai_registry_init_local(reg, w, &v, 77, local, sh.local_numel), CAI_OK);
    uint64_t stream = cai_hash64("h.0.mlp.proj.weight");
    for (uint64_t r = 0; r < 256; r++)
        for (uint64_t c = 0; c < 260; c++) {
            float want = 0.5f * cai_rng_normal(77, stream, r * 520 + 260 + c);
            ck_assert_msg(memcmp(&local[r * 260 + c], &want, sizeof want) == 0, "element (%llu,%llu)",
                          (unsigned long long)r, (unsigned long long)c);
        }
    free(local);
    cai_registry_free(reg);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
}
END_TEST

START_TEST(insert_is_the_inverse_of_extract) {
    cai_registry_t *reg = build_model();
    int qkv = cai_registry_find(reg, "h.2.attn.qkv.weight");
    const cai_param_info *p = cai_registry_param(reg, qkv);
    double *src = malloc(sizeof(double) * p->numel), *dst = calloc(p->numel, sizeof(double));
    for (uint64_t g = 0; g < p->numel; g++) src[g] = (double)g + 0.5;
    for (int r = 0; r < 2; r++) {
        cai_param_shard sh = shard(reg, qkv, view_of(2, r, 1, 0, 1, 0));
        double *local = malloc(sizeof(double) * sh.local_numel);
        cai_shard_extract(&sh, sizeof(double), src, local);
        for (uint64_t l = 0; l < sh.local_numel; l++)
            ck_assert_double_eq(local[l], (double)cai_shard_global_index(&sh, l) + 0.5);
        cai_shard_insert(&sh, sizeof(double), local, dst);
        free(local);
    }
    ck_assert_mem_eq(src, dst, sizeof(double) * p->numel);
    free(src);
    free(dst);
    cai_registry_free(reg);
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("registry");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, column_row_and_replicated_splits);
    tcase_add_test(tc, vocab_split_is_balanced_and_uneven);
    tcase_add_test(tc, fused_qkv_takes_whole_heads);
    tcase_add_test(tc, pipeline_stage_ownership);
    tcase_add_test(tc, expert_ownership);
    tcase_add_test(tc, table_lookup_and_validation);
    tcase_add_test(tc, flat_layout_follows_registration_order);
    tcase_add_test(tc, init_values_follow_the_formula);
    tcase_add_test(tc, shards_reassemble_the_single_rank_init);
    tcase_add_test(tc, threaded_init_matches_the_formula);
    tcase_add_test(tc, insert_is_the_inverse_of_extract);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
