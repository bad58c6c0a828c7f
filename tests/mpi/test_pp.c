/* The pipeline equivalence matrix (4 ranks, one launch): tiny GPT-2 (tied
 * embeddings, so the head's and the embedding's copies live on the last and
 * the first stage) and Llama (GQA), 4 layers, trained 8 steps in f32 on one
 * rank with the plain step over the global batch cut into 4 microbatches,
 * then under pp in {2, 4} x {gpipe, 1f1b} with the same microbatches:
 * every step's loss and gradient norm (clipping active) within 1e-5
 * relative, every parameter each stage holds after 8 steps within 1e-4
 * (absolute, as tests/mpi/test_equiv_harness.h compares them), and
 * the tied copies bit-identical. pp = 2 rows run on both halves of the
 * world at once. The schedules the executor does not run (interleaved,
 * zb-h1, zb-v) and tp > 1 are refused by name. Failures are gathered and
 * reported after the matrix so that no rank leaves a collective early. */
#include "cai_config.h"

#include "test_mesh_util.h"
#include "test_equiv_harness.h"

enum { STEPS = 8, GLOBAL_BATCH = 8, SEQ = 8, MICRO = 4, LAYERS = 4 };

static eq_row make_row(cai_model_family fam) {
    eq_row r;
    memset(&r, 0, sizeof r);
    r.family = fam;
    r.steps = STEPS;
    r.global_batch = GLOBAL_BATCH;
    r.T = SEQ;
    r.layers = LAYERS;
    r.param_dtype = CAI_DTYPE_F32;
    r.ref_micro = MICRO; /* the reference runs the same microbatches */
    return r;
}

typedef struct {
    eq_result res;
    int tie_equal; /* tied copies bit-identical after training (1 when not split) */
    double param_err;
} pp_out;

/* Offset of parameter `index` in eq_result.params (registration order). */
static size_t param_offset(const cai_registry_t *reg, int index) {
    size_t off = 0;
    for (int i = 0; i < index; i++) off += cai_registry_param(reg, i)->numel;
    return off;
}

/* The row under pp = size of comm with `style`. Collective over comm. */
static cai_status run_pp(MPI_Comm comm, const eq_row *row, cai_pp_style style, const eq_result *ref, pp_out *out) {
    memset(out, 0, sizeof *out);
    out->tie_equal = 1;
    int pp = 0;
    MPI_Comm_size(comm, &pp);
    const int G = row->global_batch, T = row->T, B = G / MICRO;
    cai_device_t *dev = NULL;
    cai_mesh_t *mesh = NULL;
    cai_model_t *m = NULL;
    cai_optim_t *o = NULL;
    cai_pipeline_t *pipe = NULL;
    cai_status st = CAI_OK;
    int32_t *tok = malloc((size_t)G * T * sizeof *tok), *tgt = malloc((size_t)G * T * sizeof *tgt);
    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout = (cai_layout){pp, 1, 1, 1, 1, NULL};
    mc.watchdog_timeout_s = 60;
    cai_model_config c = eq_model_config(row);
    cai_model_options mo = cai_model_options_default(&c);
    mo.batch = B;
    mo.seq_len = T;
    cai_adamw_config oc = eq_adamw();
    CAI_CALL_GOTO(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1), st, done);
    CAI_CALL_GOTO(cai_mesh_init(&mesh, comm, &mc), st, done);
    mo.view.pp_size = pp;
    mo.view.pp_rank = cai_mesh_rank(mesh, CAI_AXIS_PP);
    CAI_CALL_GOTO(cai_model_create(&m, dev, &c, &mo), st, done);
    CAI_CALL_GOTO(cai_optim_create_for_model(&o, m, &oc), st, done);
    CAI_CALL_GOTO(cai_pipeline_create(&pipe, mesh, m, style), st, done);
    cai_step_driver drv;
    CAI_CALL_GOTO(cai_pipeline_driver(pipe, o, &drv), st, done);
    for (int step = 0; step < row->steps; step++) {
        for (int s = 0; s < G; s++) eq_sequence(row, step, s, tok + (size_t)s * T, tgt + (size_t)s * T);
        cai_step_stats ss;
        CAI_CALL_GOTO(cai_train_step(&drv, NULL, NULL, tok, tgt, MICRO, &ss), st, done);
        out->res.loss[step] = ss.loss;
        out->res.norm[step] = ss.grad_norm;
    }
    /* the parameters this stage holds against the reference's */
    const cai_registry_t *reg = cai_model_registry(m);
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *pi = cai_registry_param(reg, i);
        cai_param_shard sh;
        CAI_CALL_GOTO(cai_registry_shard(reg, i, cai_model_view(m), &sh), st, done);
        if (!sh.held) continue;
        cai_tensor w;
        CAI_CALL_GOTO(cai_model_param(m, pi->name, &w, NULL), st, done);
        const float *want = ref->params + param_offset(reg, pi->tie_primary);
        for (uint64_t k = 0; k < pi->numel; k++) {
            const double a = ((const float *)w.data)[k], b = want[k];
            out->param_err = fmax(out->param_err, fabs(a - b));
        }
    }
    /* tied copies on two stages: the first stage sends its copy to the last */
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *pi = cai_registry_param(reg, i);
        if (pi->spec.tie_group <= 0 || pi->tie_primary == i || pp == 1) continue;
        cai_tensor w, w0;
        cai_param_shard sh, sh0;
        CAI_CALL_GOTO(cai_registry_shard(reg, i, cai_model_view(m), &sh), st, done);
        CAI_CALL_GOTO(cai_registry_shard(reg, pi->tie_primary, cai_model_view(m), &sh0), st, done);
        const int me = cai_mesh_rank(mesh, CAI_AXIS_PP);
        if (sh.pp_stage == sh0.pp_stage) continue;
        if (sh0.held) {
            CAI_CALL_GOTO(cai_model_param(m, cai_registry_param(reg, pi->tie_primary)->name, &w0, NULL), st, done);
            MPI_Send(w0.data, (int)pi->numel, MPI_FLOAT, sh.pp_stage, 77, comm);
        } else if (sh.held) {
            CAI_CALL_GOTO(cai_model_param(m, pi->name, &w, NULL), st, done);
            float *other = malloc(pi->numel * sizeof *other);
            MPI_Recv(other, (int)pi->numel, MPI_FLOAT, sh0.pp_stage, 77, comm, MPI_STATUS_IGNORE);
            out->tie_equal = memcmp(other, w.data, pi->numel * sizeof *other) == 0;
            free(other);
        }
        (void)me;
    }
done:
    free(tok);
    free(tgt);
    cai_pipeline_free(pipe);
    cai_optim_free(o);
    cai_model_free(m);
    cai_mesh_free(mesh);
    cai_device_free(dev);
    return st;
}

START_TEST(pp_matrix_matches_single_rank) {
    ck_assert(g_world_size == 4);
    const cai_model_family fams[2] = {CAI_MODEL_GPT2, CAI_MODEL_LLAMA};
    const cai_pp_style styles[2] = {CAI_PP_GPIPE, CAI_PP_1F1B};
    eq_result ref[2];
    for (int f = 0; f < 2; f++) {
        eq_row r = make_row(fams[f]);
        CK_CAI(eq_run_reference(&r, &ref[f]));
    }
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, g_world_rank / 2, g_world_rank, &half);
    int bad = 0, rows = 0;
    for (int pp = 2; pp <= 4; pp += 2)
        for (int f = 0; f < 2; f++)
            for (int s = 0; s < 2; s++) {
                const int idx = f * 2 + s;
                if (pp == 2 && idx % 2 != g_world_rank / 2) continue;
                eq_row r = make_row(fams[f]);
                pp_out got;
                cai_status st = run_pp(pp == 2 ? half : MPI_COMM_WORLD, &r, styles[s], &ref[f], &got);
                double worst = 0;
                for (int k = 0; k < STEPS && st == CAI_OK; k++) {
                    worst = fmax(worst, fabs(got.res.loss[k] - ref[f].loss[k]) / fabs(ref[f].loss[k]));
                    worst = fmax(worst, fabs(got.res.norm[k] - ref[f].norm[k]) / fabs(ref[f].norm[k]));
                }
                const int ok = st == CAI_OK && worst <= 1e-5 && got.param_err <= 1e-4 && got.tie_equal;
                if (!ok || g_world_rank == 0)
                    printf("[rank %d] pp=%d %s %s: %s loss/norm rel %.2e, params |diff| %.2e, ties %s%s%s\n", g_world_rank,
                           pp, cai_model_family_name(fams[f]), cai_pp_style_name(styles[s]), ok ? "ok" : "FAIL", worst,
                           got.param_err, got.tie_equal ? "equal" : "DIFFER", st == CAI_OK ? "" : ": ",
                           st == CAI_OK ? "" : cai_error_message());
                if (st != CAI_OK) cai_error_clear();
                bad += !ok;
                rows++;
            }
    int all_bad = 0;
    MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm_free(&half);
    for (int f = 0; f < 2; f++) eq_result_free(&ref[f]);
    ck_assert_msg(all_bad == 0, "%d pipeline rows differ from one rank", all_bad);
}
END_TEST

/* What the executor does not run is refused before any step, by name. */
START_TEST(unsupported_layouts_are_refused) {
    eq_row r = make_row(CAI_MODEL_LLAMA);
    cai_device_t *dev = NULL;
    cai_mesh_t *mesh = NULL;
    cai_model_t *m = NULL;
    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout = (cai_layout){g_world_size, 1, 1, 1, 1, NULL};
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    CK_CAI(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    cai_model_config c = eq_model_config(&r);
    cai_model_options mo = cai_model_options_default(&c);
    mo.batch = 2;
    mo.seq_len = SEQ;
    mo.view.pp_size = g_world_size;
    mo.view.pp_rank = cai_mesh_rank(mesh, CAI_AXIS_PP);
    CK_CAI(cai_model_create(&m, dev, &c, &mo));
    const cai_pp_style no[3] = {CAI_PP_INTERLEAVED, CAI_PP_ZB_H1, CAI_PP_ZB_V};
    for (int k = 0; k < 3; k++) {
        cai_pipeline_t *p = NULL;
        ck_assert_int_eq(cai_pipeline_create(&p, mesh, m, no[k]), CAI_ERR_UNSUPPORTED);
        ck_assert_ptr_null(p);
        ck_assert_ptr_nonnull(strstr(cai_error_message(), cai_pp_style_name(no[k])));
        cai_error_clear();
    }
    cai_model_free(m);
    cai_mesh_free(mesh);
    cai_device_free(dev);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {pp_matrix_matches_single_rank, unsupported_layouts_are_refused};
    return test_mpi_main(argc, argv, "pp", tests, TEST_COUNT(tests));
}
