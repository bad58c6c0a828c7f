/* Tensor-parallel inference against one rank: every tp group's engine
 * (column/row-parallel layers, vocabulary-parallel head gathered for
 * sampling) continues the same prompts token for token as a tp = 1 engine
 * over the same weights, greedy and seeded, for GPT-2 and Llama with GQA
 * (one kv head per rank at tp = 2), with a vocabulary whose shards are
 * uneven. Run on 4 ranks: tp = 2 x dp = 2, then tp = 4. */
#include "cai_config.h"
#include "colossal/infer.h"
#include "colossal/model.h"

#include <string.h>

#include "test_mesh_util.h"

enum { N_REQ = 6, N_NEW = 10, MAX_PROMPT = 40 };

static cai_model_config model(cai_model_family f, int kv_heads) {
    cai_model_config c = cai_model_config_default(f);
    c.n_layers = 2;
    c.d_model = 32;
    c.n_heads = 4;
    c.n_kv_heads = f == CAI_MODEL_LLAMA ? kv_heads : 0;
    c.ffn_hidden = f == CAI_MODEL_LLAMA ? 48 : 0;
    c.vocab_size = 61;
    c.vocab_multiple = 1; /* 61 rows: shards of 31 and 30 (tp 2), 16/15/15/15 (tp 4) */
    c.max_seq_len = 64;
    c.init_std = 0.3f;
    c.seed = 5;
    return c;
}

static void run(cai_weights_t *w, cai_mesh_t *mesh, const cai_sampling_params *sp, int32_t out[N_REQ][N_NEW]) {
    cai_engine_options o = cai_engine_options_default();
    o.block_size = 8;
    o.max_tokens_per_step = 24; /* chunked prefill */
    cai_engine_t *e = NULL;
    CK_CAI(cai_engine_create(&e, w, mesh, &o));
    for (int i = 0; i < N_REQ; i++) {
        int32_t p[MAX_PROMPT];
        const int n = 3 + 6 * i;
        for (int j = 0; j < n; j++) p[j] = (int32_t)((j * 13 + i * 3 + 2) % 61);
        CK_CAI(cai_engine_add(e, i, p, n, sp, 0));
    }
    memset(out, 0, sizeof(int32_t) * N_REQ * N_NEW);
    while (cai_engine_pending(e) > 0) {
        CK_CAI(cai_engine_step(e));
        cai_engine_output r;
        while (cai_engine_take(e, &r)) {
            ck_assert_int_eq(r.n_tokens, N_NEW);
            memcpy(out[r.tag], r.tokens, sizeof out[0]);
            cai_engine_output_free(&r);
        }
    }
    cai_engine_free(e);
}

static void check_tp(int tp) {
    const int dp = g_world_size / tp;
    cai_mesh_config mc = test_mesh_config(1, dp, 1, 1, tp, NULL);
    cai_mesh_t *mesh = NULL;
    CK_CAI(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    const cai_model_family fams[2] = {CAI_MODEL_GPT2, CAI_MODEL_LLAMA};
    for (int f = 0; f < 2; f++) {
        cai_model_config c = model(fams[f], tp == 4 ? 4 : 2);
        cai_rank_view single = cai_rank_view_single(), view = single;
        view.tp_size = tp;
        view.tp_rank = cai_mesh_rank(mesh, CAI_AXIS_TP);
        cai_weights_t *w1 = NULL, *wt = NULL;
        CK_CAI(cai_weights_create(&w1, dev, &c, &single, 0, 1));
        CK_CAI(cai_weights_create(&wt, dev, &c, &view, 0, 1));
        for (int mode = 0; mode < 2; mode++) {
            cai_sampling_params sp = cai_sampling_default();
            sp.max_new_tokens = N_NEW;
            if (mode) {
                sp.temperature = 1.0f;
                sp.top_p = 0.9f;
                sp.seed = 17;
                sp.has_seed = 1;
            }
            int32_t one[N_REQ][N_NEW], par[N_REQ][N_NEW];
            run(w1, NULL, &sp, one);
            run(wt, mesh, &sp, par);
            for (int i = 0; i < N_REQ; i++)
                for (int j = 0; j < N_NEW; j++)
                    ck_assert_msg(one[i][j] == par[i][j], "%s tp=%d %s: request %d token %d: %d at tp, %d alone",
                                  cai_model_family_name(fams[f]), tp, mode ? "sampled" : "greedy", i, j, par[i][j],
                                  one[i][j]);
            /* the continuations are not all one token: a constant output would pass anything */
            int distinct = 0;
            for (int j = 1; j < N_NEW; j++) distinct += one[0][j] != one[0][0];
            ck_assert_int_gt(distinct, 0);
        }
        cai_weights_free(w1);
        cai_weights_free(wt);
    }
    cai_device_free(dev);
    cai_mesh_free(mesh);
}

START_TEST(tp2_equals_one_rank) { check_tp(2); }
END_TEST

START_TEST(tp4_equals_one_rank) {
    if (g_world_size % 4 == 0) check_tp(4);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {tp2_equals_one_rank, tp4_equals_one_rank};
    return test_mpi_main(argc, argv, "infer", tests, TEST_COUNT(tests));
}
