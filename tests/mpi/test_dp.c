/* Data parallelism under mpiexec (3 ranks): the gradient all-reduce gives
 * the mean of the per-rank gradients, checked against every rank's batch
 * run locally and averaged in double; the replica check passes on equal
 * weights and names the parameter that one rank changed. */
#include "cai_config.h"
#include "colossal/model.h"
#include "colossal/parallel.h"

#include <math.h>

#include "test_mesh_util.h"

enum { B = 2, T = 8, V = 61 };

static cai_model_config tiny_config(void) {
    cai_model_config c = cai_model_config_default(CAI_MODEL_GPT2);
    c.vocab_size = V;
    c.vocab_multiple = 16;
    c.n_layers = 2;
    c.d_model = 32;
    c.n_heads = 4;
    c.n_kv_heads = 4;
    c.max_seq_len = T;
    c.seed = 77;
    return c;
}

static void make_model(cai_device_t *dev, cai_model_t **m) {
    cai_model_config c = tiny_config();
    cai_model_options o = cai_model_options_default(&c);
    o.batch = B;
    o.seq_len = T;
    CK_CAI(cai_model_create(m, dev, &c, &o));
}

/* The batch data-parallel rank r trains on: tokens and next-token targets. */
static void batch_of(int r, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(cai_rng_uniform(5, (uint64_t)r, (uint64_t)i) * V) % V;
        tgt[i] = (int32_t)(cai_rng_uniform(6, (uint64_t)r, (uint64_t)i) * V) % V;
    }
}

static cai_mesh_t *dp_mesh(void) {
    cai_mesh_config mc = test_mesh_config(1, g_world_size, 1, 1, 1, NULL);
    cai_mesh_t *mesh = NULL;
    CK_CAI(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    return mesh;
}

START_TEST(allreduce_gives_the_mean_gradient) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    cai_mesh_t *mesh = dp_mesh();
    cai_model_t *m = NULL;
    make_model(dev, &m);
    int32_t tok[B * T], tgt[B * T];

    /* Reference: every rank's batch on this rank, averaged in double. */
    cai_tensor params, grads, lowp;
    cai_model_flat(m, &params, &grads, &lowp);
    size_t n = (size_t)cai_tensor_numel(&grads);
    double *ref = calloc(n, sizeof *ref);
    ck_assert_ptr_nonnull(ref);
    for (int r = 0; r < g_world_size; r++) {
        batch_of(r, tok, tgt);
        CK_CAI(cai_model_zero_grad(m));
        CK_CAI(cai_model_forward(m, tok, tgt, NULL));
        CK_CAI(cai_model_backward(m, 1.0f));
        const float *g = grads.data;
        for (size_t i = 0; i < n; i++) ref[i] += (double)g[i] / g_world_size;
    }

    batch_of(g_world_rank, tok, tgt);
    CK_CAI(cai_model_zero_grad(m));
    CK_CAI(cai_model_forward(m, tok, tgt, NULL));
    CK_CAI(cai_model_backward(m, 1.0f));
    CK_CAI(cai_dp_allreduce_grads(mesh, m));

    double amax = 0;
    for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs(ref[i]));
    ck_assert(amax > 0);
    const float *g = grads.data;
    size_t bad = 0, worst = 0;
    double worst_err = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)g[i] - ref[i]);
        if (err > 1e-6 * fabs(ref[i]) + 1e-7 * amax) bad++;
        if (err > worst_err) worst_err = err, worst = i;
    }
    ck_assert_msg(bad == 0, "%zu of %zu gradients differ from the mean; worst at %zu: %g vs %g", bad, n, worst,
                  (double)g[worst], ref[worst]);
    free(ref);
    cai_model_free(m);
    cai_mesh_free(mesh);
    cai_device_free(dev);
}
END_TEST

START_TEST(replica_check_names_the_diverged_parameter) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    cai_mesh_t *mesh = dp_mesh();
    cai_model_t *m = NULL;
    make_model(dev, &m); /* same seed everywhere: equal replicas */
    CK_CAI(cai_dp_check_replicas(mesh, m));

    cai_tensor w;
    CK_CAI(cai_model_param(m, "h.1.mlp.fc.bias", &w, NULL));
    float *p = w.data, saved = p[3];
    if (g_world_rank == g_world_size - 1) p[3] += 1e-6f;
    cai_status st = cai_dp_check_replicas(mesh, m);
    ck_assert_int_eq(st, CAI_ERR_INTERNAL);
    ck_assert_msg(strstr(cai_error_message(), "h.1.mlp.fc.bias") != NULL, "message: %s", cai_error_message());
    ck_assert_msg(strstr(cai_error_message(), "and 0 more") != NULL, "message: %s", cai_error_message());
    cai_error_clear();

    p[3] = saved;
    CK_CAI(cai_dp_check_replicas(mesh, m));
    cai_model_free(m);
    cai_mesh_free(mesh);
    cai_device_free(dev);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {allreduce_gives_the_mean_gradient, replica_check_names_the_diverged_parameter};
    return test_mpi_main(argc, argv, "dp", tests, TEST_COUNT(tests));
}
