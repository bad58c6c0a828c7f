/* The tensor-parallel equivalence matrix (4 ranks, one launch; tp8.np8 runs
 * the tp=4 x dp=2 rows on 8): tiny GPT-2
 * (tied embeddings, vocabulary 61 padded to 64) and Llama (GQA: 8 query and
 * 4 key/value heads) trained 4 steps in f32 on one rank with the plain
 * step, then under tp in {2, 4} x dp in {1, 2} (tp x dp <= 4) x ZeRO stage
 * {0, 1, 2, 3} x sequence parallelism {off, split-gather}, and stage 1 with
 * activation recompute with and without it: every step's loss and gradient
 * norm (clipping active) within 1e-5 relative, every parameter after 4
 * steps, assembled from the tp shards through the registry, within 1e-4,
 * and the memory planner's per-rank bytes within 5% of what the engine and
 * model hold. Stage 2 rows accumulate two microbatches (the norms' gradients
 * summed over tp per microbatch under sequence parallelism). tp=2 dp=1 rows
 * run on both halves of the world at once. Failures are gathered and
 * reported after the whole matrix so that no rank leaves a collective
 * early. */
#include "cai_config.h"

#include "test_mesh_util.h"
#include "test_equiv_harness.h"

enum { STEPS = 4, GLOBAL_BATCH = 8, SEQ = 8 };

static eq_row make_row(cai_model_family fam, int tp, int dp, int stage) {
    eq_row r;
    memset(&r, 0, sizeof r);
    r.family = fam;
    r.steps = STEPS;
    r.global_batch = GLOBAL_BATCH;
    r.T = SEQ;
    r.tp = tp;
    r.dp = dp;
    r.stage = stage;
    r.grad_accum = stage == 2 ? 2 : 1; /* stage 2's per-microbatch windows */
    r.heads_x2 = 1;
    r.bucket_bytes = 16 * 1024;
    r.param_dtype = CAI_DTYPE_F32;
    return r;
}

/* The planner's per-rank bytes for the row's layout against what the
 * engine and the model hold (checked before the first step, when every
 * buffer and window block exists). */
typedef struct {
    const eq_row *row;
    int B;
    double worst;
    int bad;
} plan_check;

static cai_status check_plan(void *ctx, cai_zero_t *z) {
    plan_check *pc = ctx;
    cai_model_t *m = cai_zero_model(z);
    cai_mem_plan_request q = {.model = eq_model_config(pc->row),
                              .batch = pc->B,
                              .seq_len = pc->row->T,
                              .view = *cai_model_view(m),
                              .seq_parallel = pc->row->seq_parallel,
                              .dp = pc->row->dp,
                              .dev = cai_model_device(m)};
    q.zero = *cai_zero_get_config(z);
    cai_mem_plan plan, used;
    CAI_CALL(cai_mem_plan_compute(&q, &plan));
    cai_zero_memory(z, &used);
    const double p = (double)(plan.device + plan.host), u = (double)(used.device + used.host);
    const double rel = fabs(p - u) / u;
    pc->worst = fmax(pc->worst, rel);
    if (!(rel <= 0.05)) {
        pc->bad = 1;
        return CAI_ERROR(CAI_ERR_INTERNAL, "memory plan %.0f bytes per rank vs %.0f held (rel %.3g)", p, u, rel);
    }
    return CAI_OK;
}

START_TEST(tp_matrix_matches_single_rank) {
    ck_assert(g_world_size == 4 || g_world_size == 8);
    const cai_model_family fams[2] = {CAI_MODEL_GPT2, CAI_MODEL_LLAMA};
    eq_result ref[2];
    for (int f = 0; f < 2; f++) {
        eq_row r = make_row(fams[f], 1, 1, 0);
        CK_CAI(eq_run_reference(&r, &ref[f]));
    }
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, g_world_rank / 2, g_world_rank, &half);
    eq_tally tally = {0};
    double worst_plan = 0;
    double t_all = MPI_Wtime();
    const int layouts4[3][2] = {{2, 1}, {2, 2}, {4, 1}}, layouts8[1][2] = {{4, 2}}; /* {tp, dp} */
    const int(*layouts)[2] = g_world_size == 8 ? layouts8 : layouts4;
    const int n_layouts = g_world_size == 8 ? 1 : 3;
    for (int l = 0; l < n_layouts; l++) {
        const int tp = layouts[l][0], dp = layouts[l][1], on_half = 2 * tp * dp == g_world_size;
        int idx = 0;
        for (int f = 0; f < 2; f++)
            /* variants 0-3: ZeRO stage v; 4: stage 1 with activation
             * recompute (the checkpointed re-forward's collectives); 5-9 the
             * same with split-gather sequence parallelism. */
            for (int v = 0; v <= 9; v++, idx++) {
                if (on_half && idx % 2 != g_world_rank / 2) continue;
                const int k = v % 5;
                eq_row r = make_row(fams[f], tp, dp, k < 4 ? k : 1);
                r.recompute = k == 4;
                r.seq_parallel = v >= 5;
                eq_result got;
                double t0 = MPI_Wtime();
                plan_check pc = {&r, GLOBAL_BATCH / (dp * r.grad_accum), 0, 0};
                cai_status st = eq_run_layout(on_half ? half : MPI_COMM_WORLD, &r, check_plan, &pc, &got);
                worst_plan = fmax(worst_plan, pc.worst);
                eq_tally_row(&tally, &r, &ref[f], st, &got, t0, g_world_rank == 0 || (on_half && g_world_rank == 2),
                             g_world_rank);
            }
    }
    MPI_Comm_free(&half);
    for (int f = 0; f < 2; f++) eq_result_free(&ref[f]);
    int any = 0;
    MPI_Allreduce(&tally.n_bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_world_rank == 0)
        fprintf(stderr,
                "tp equivalence matrix: %d rows on rank 0's groups, %.2f s; worst loss/norm rel %.3g, param %.3g; "
                "memory plan vs held, worst rel %.3g\n",
                tally.n_rows, MPI_Wtime() - t_all, tally.worst_loss, tally.worst_param, worst_plan);
    ck_assert_msg(any == 0, "%d row failure(s) over all ranks; this rank's:%s", any, tally.failures);
}
END_TEST

/* The whole world as one tp = 4 group, and a one-thread host device. */
static void tp4_world(cai_mesh_t **mesh, cai_device_t **dev) {
    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout = (cai_layout){1, 1, 1, 1, 4, NULL};
    CK_CAI(cai_mesh_init(mesh, MPI_COMM_WORLD, &mc));
    CK_CAI(cai_device_init(dev, CAI_DEVICE_HOST, 0, 1));
}

/* Shapes that do not split over tp are refused before anything is
 * allocated, naming the keys and a tp that fits. */
START_TEST(tp_refuses_what_does_not_split) {
    if (g_world_size != 4) return; /* the tp=4 x dp=2 launch runs the matrix only */
    cai_mesh_t *mesh = NULL;
    cai_device_t *dev = NULL;
    tp4_world(&mesh, &dev);
    eq_row r = make_row(CAI_MODEL_LLAMA, 4, 1, 0);
    r.heads_x2 = 0; /* 4 query heads, 2 key/value heads */
    cai_model_config c = eq_model_config(&r);
    cai_model_options mo = cai_model_options_default(&c);
    mo.view.tp_size = 4;
    mo.view.tp_rank = cai_mesh_rank(mesh, CAI_AXIS_TP);
    mo.mesh = mesh;
    cai_model_t *m = NULL;
    ck_assert_int_eq(cai_model_create(&m, dev, &c, &mo), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "model.n_kv_heads=2"));
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "tp=2 fits"));
    ck_assert_ptr_null(m);
    c.n_kv_heads = 4;
    c.ffn_hidden = 66;
    ck_assert_int_eq(cai_model_create(&m, dev, &c, &mo), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "model.ffn_hidden=66"));
    c.ffn_hidden = 64;
    mo.view.tp_rank = (mo.view.tp_rank + 1) % 4; /* a view that is not this rank's place in the mesh */
    ck_assert_int_eq(cai_model_create(&m, dev, &c, &mo), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "the mesh's tp axis"));
    cai_error_clear();
    cai_device_free(dev);
    cai_mesh_free(mesh);
}
END_TEST

/* Packed rows (cai_model_set_packing) under tp = 4: the loss and every
 * parameter gradient that tp leaves whole on each rank (norms, position
 * embeddings, the row-parallel biases) equal one rank's packed model within
 * 1e-5; sequence parallelism refuses packing. */
static void packed_batch(int vocab, int32_t *tok, int32_t *tgt, int32_t *pos, int32_t *doc) {
    static const int lens[2][3] = {{3, 5, 0}, {4, 2, 2}}; /* row 1 ends in 2 tokens of padding */
    for (int b = 0, i = 0; b < 2; b++)
        for (int d = 0; d < 3; d++)
            for (int t = 0; t < lens[b][d]; t++, i++) {
                tok[i] = (int32_t)((7 * i + 3) % vocab);
                pos[i] = t;
                doc[i] = b * 3 + d;
                tgt[i] = (b == 1 && d == 2) || t + 1 == lens[b][d] ? CAI_IGNORE_INDEX : (int32_t)((5 * i + 1) % vocab);
            }
}

static cai_status packed_pass(cai_model_t *m, const int32_t *tok, const int32_t *tgt, const int32_t *pos,
                              const int32_t *doc, float *loss) {
    CAI_CALL(cai_model_zero_grad(m));
    CAI_CALL(cai_model_set_packing(m, pos, doc));
    CAI_CALL(cai_model_forward(m, tok, tgt, loss));
    return cai_model_backward(m, 1.0f);
}

START_TEST(tp_packed_rows_match_single_rank) {
    if (g_world_size != 4) return;
    cai_mesh_t *mesh = NULL;
    cai_device_t *dev = NULL;
    tp4_world(&mesh, &dev);
    const cai_model_family fams[2] = {CAI_MODEL_GPT2, CAI_MODEL_LLAMA};
    for (int f = 0; f < 2; f++) {
        eq_row r = make_row(fams[f], 4, 1, 0);
        cai_model_config c = eq_model_config(&r);
        int32_t tok[2 * SEQ], tgt[2 * SEQ], pos[2 * SEQ], doc[2 * SEQ];
        packed_batch(c.vocab_size, tok, tgt, pos, doc);
        cai_model_options so = cai_model_options_default(&c);
        so.batch = 2;
        so.seq_len = SEQ;
        cai_model_options mo = so;
        mo.view.tp_size = 4;
        mo.view.tp_rank = cai_mesh_rank(mesh, CAI_AXIS_TP);
        mo.mesh = mesh;
        cai_model_t *one = NULL, *m = NULL;
        float l1, l4;
        CK_CAI(cai_model_create(&one, dev, &c, &so));
        CK_CAI(cai_model_create(&m, dev, &c, &mo));
        CK_CAI(packed_pass(one, tok, tgt, pos, doc, &l1));
        CK_CAI(packed_pass(m, tok, tgt, pos, doc, &l4));
        ck_assert_msg(fabsf(l1 - l4) <= 1e-5f * fabsf(l1), "%s: loss %.9g under tp=4, %.9g on one rank",
                      cai_model_family_name(c.family), (double)l4, (double)l1);
        const cai_registry_t *reg = cai_model_registry(m);
        int whole = 0;
        for (int i = 0; i < cai_registry_count(reg); i++) {
            const cai_param_info *pi = cai_registry_param(reg, i);
            cai_tensor g1, g4;
            if (cai_model_param(m, pi->name, NULL, &g4) != CAI_OK) {
                cai_error_clear();
                continue;
            }
            CK_CAI(cai_model_param(one, pi->name, NULL, &g1));
            if (cai_tensor_numel(&g4) != cai_tensor_numel(&g1)) continue; /* a tp shard */
            whole++;
            const float *a = g1.data, *b = g4.data;
            float gmax = 0.0f;
            for (int64_t k = 0; k < cai_tensor_numel(&g1); k++) gmax = fmaxf(gmax, fabsf(a[k]));
            for (int64_t k = 0; k < cai_tensor_numel(&g1); k++)
                ck_assert_msg(fabsf(a[k] - b[k]) <= 1e-5f * fmaxf(gmax, 1e-6f), "%s: %s[%ld] %.9g under tp=4, %.9g",
                              cai_model_family_name(c.family), pi->name, (long)k, (double)b[k], (double)a[k]);
        }
        ck_assert_int_gt(whole, 4);
        cai_model_free(m);
        cai_model_free(one);
        mo.seq_parallel = 1;
        CK_CAI(cai_model_create(&m, dev, &c, &mo));
        ck_assert_int_eq(cai_model_set_packing(m, pos, doc), CAI_ERR_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), "sequence parallelism"));
        cai_error_clear();
        cai_model_free(m);
    }
    cai_device_free(dev);
    cai_mesh_free(mesh);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {tp_matrix_matches_single_rank, tp_refuses_what_does_not_split,
                            tp_packed_rows_match_single_rank};
    return test_mpi_main(argc, argv, "tp", tests, TEST_COUNT(tests));
}
