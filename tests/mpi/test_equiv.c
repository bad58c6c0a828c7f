/* The equivalence matrix (4 ranks, one launch): tiny GPT-2 (tied
 * embeddings) and Llama (GQA, untied) trained 4 steps in f32 on one rank
 * with the plain step, then under dp in {2, 4} x ZeRO stage {0, 1, 2, 3} x
 * offload {off, on} x gradient accumulation {1, 4}, plus stage 0 reduce-only
 * under the model's own optimizer: every step's loss and
 * gradient norm (clipping is active) within 1e-5 relative, every parameter
 * after 4 steps within 1e-4. dp=2 rows run on both halves of the world at
 * once. Failures are gathered and reported after the whole matrix so that
 * no rank leaves a collective early. */
#include "cai_config.h"

#include "test_mesh_util.h"
#include "test_equiv_harness.h"

enum { STEPS = 4, GLOBAL_BATCH = 16, SEQ = 8 };

static eq_row make_row(cai_model_family fam, int dp, int stage, int offload, int accum) {
    eq_row r;
    memset(&r, 0, sizeof r);
    r.family = fam;
    r.steps = STEPS;
    r.global_batch = GLOBAL_BATCH;
    r.T = SEQ;
    r.dp = dp;
    r.stage = stage;
    r.offload = offload;
    r.grad_accum = accum;
    /* GPT-2: two buckets of two units each (the tied head's gradient goes
     * to the embedding's bucket); Llama: a bucket per unit. */
    r.bucket_bytes = fam == CAI_MODEL_GPT2 ? 64 * 1024 : 16 * 1024;
    r.param_dtype = CAI_DTYPE_F32;
    return r;
}

START_TEST(matrix_matches_single_rank) {
    ck_assert_int_eq(g_world_size, 4);
    const cai_model_family fams[2] = {CAI_MODEL_GPT2, CAI_MODEL_LLAMA};
    eq_result ref[2];
    for (int f = 0; f < 2; f++) {
        eq_row r = make_row(fams[f], 1, 0, 0, 1);
        CK_CAI(eq_run_reference(&r, &ref[f]));
    }
    /* Halves of the world for the dp=2 rows. */
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, g_world_rank / 2, g_world_rank, &half);
    eq_tally tally = {0};
    double t_all = MPI_Wtime();
    for (int dp = 2; dp <= 4; dp += 2) {
        int idx = 0;
        for (int f = 0; f < 2; f++)
            /* variants 0-7: stage v/2, offload v%2; 8: stage 0 reduce-only
             * with the model's own cai_optim_t (the checkpointable path). */
            for (int v = 0; v <= 8; v++)
                for (int accum = 1; accum <= 4; accum += 3, idx++) {
                    /* dp=2: row idx runs on half idx % 2. */
                    if (dp == 2 && idx % 2 != g_world_rank / 2) continue;
                    eq_row r = make_row(fams[f], dp, v < 8 ? v / 2 : 0, v < 8 ? v % 2 : 0, accum);
                    r.reduce_only = v == 8;
                    eq_result got;
                    double t0 = MPI_Wtime();
                    cai_status st = eq_run_layout(dp == 4 ? MPI_COMM_WORLD : half, &r, NULL, NULL, &got);
                    eq_tally_row(&tally, &r, &ref[f], st, &got, t0, g_world_rank == 0 || (dp == 2 && g_world_rank == 2),
                                 g_world_rank);
                }
    }
    MPI_Comm_free(&half);
    for (int f = 0; f < 2; f++) eq_result_free(&ref[f]);
    int any = 0;
    MPI_Allreduce(&tally.n_bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_world_rank == 0)
        fprintf(stderr,
                "equivalence matrix: %d rows on rank 0's groups, %.2f s; worst loss/norm rel %.3g, param %.3g\n",
                tally.n_rows, MPI_Wtime() - t_all, tally.worst_loss, tally.worst_param);
    ck_assert_msg(any == 0, "%d row failure(s) over all ranks; this rank's:%s", any, tally.failures);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {matrix_matches_single_rank};
    return test_mpi_main(argc, argv, "equiv", tests, TEST_COUNT(tests));
}
