/* Expert parallelism under mpiexec (4 ranks, dp = 4): the MoE sublayer
 * with its experts sharded over ep = 2 (edp = 2) and ep = 4 (edp = 1),
 * tokens dispatched and combined by all-to-all-v, gives every rank the
 * output, input gradient, routing, losses and drops of the same layer run
 * with every expert on the rank (ep = 1), within 1e-5; after the gradient
 * sync (dense parameters averaged over dp, experts summed over edp and
 * divided by dp) every held gradient equals the ep = 1 gradients averaged
 * over dp, within 1e-5. For dropless softmax top-2 with a shared expert,
 * capacity routing that drops, and a sigmoid router. The router
 * statistics summed over dp agree; an expert count that ep does not divide
 * is refused on every rank. */
#include "cai_config.h"

#include <math.h>

#include "../unit/moe_fixture.h"
#include "colossal/moe.h"
#include "test_mesh_util.h"

enum { N_TOK = 20, D_MODEL = 12 };

static cai_moe_config case_config(int c) {
    cai_moe_config m = cai_moe_config_default();
    m.n_experts = 4;
    m.top_k = 2;
    m.ffn = 10;
    m.aux_coef = 0.2f;
    m.z_coef = 0.05f;
    if (c == 0) m.n_shared = 1;
    if (c == 1) {
        m.routing = CAI_MOE_CAPACITY;
        m.capacity_factor = 0.75f;
    }
    if (c == 2) m.router = CAI_MOE_ROUTER_SIGMOID;
    return m;
}

/* max |a - b| / max |b| over n floats. */
static double rel_err(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0.0 ? d / m : d;
}

/* This rank's layer: its own tokens (by dp rank), the experts `ex` gives it. */
static void run_layer(moe_fix *f, cai_device_t *dev, const cai_moe_config *cfg, const cai_moe_exchange *ex,
                      int dp_rank) {
    CK_CAI(moe_fix_init(f, dev, cfg, N_TOK, D_MODEL, ex, 4242, 0.4f, 100 + (uint64_t)dp_rank));
    moe_fix_cotangent(f, 4242, 200 + (uint64_t)dp_rank);
    double obj;
    CK_CAI(moe_fix_grads(f, &obj));
}

static void check_case(cai_device_t *dev, int c, int ep) {
    const cai_moe_config cfg = case_config(c);
    cai_mesh_config mc = test_mesh_config(1, g_world_size, ep, 1, 1, NULL);
    cai_mesh_t *mesh = NULL;
    CK_CAI(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    const int dp_rank = cai_mesh_rank(mesh, CAI_AXIS_DP), dp = cai_mesh_size(mesh, CAI_AXIS_DP);

    /* ep = 1 on this rank's tokens; its gradients averaged over dp */
    moe_fix ref, f;
    run_layer(&ref, dev, &cfg, NULL, dp_rank);
    MPI_Allreduce(MPI_IN_PLACE, ref.grads, (int)ref.n_flat, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < ref.n_flat; i++) ref.grads[i] /= (float)dp;

    cai_moe_exchange ex;
    CK_CAI(cai_moe_ep_exchange_init(&ex, mesh));
    ck_assert_int_eq(ex.ep_size, ep);
    run_layer(&f, dev, &cfg, &ex, dp_rank);
    ck_assert_int_eq(f.cx.n_local, cfg.n_experts / ep);

    const int64_t n = N_TOK * D_MODEL;
    const double ey = rel_err(f.y.data, ref.y.data, n), edx = rel_err(f.dx.data, ref.dx.data, n);
    ck_assert_msg(ey <= 1e-5 && edx <= 1e-5, "case %d ep=%d rank %d: output %.2e, input gradient %.2e", c, ep,
                  g_world_rank, ey, edx);
    /* routing is local: the same decisions, losses and drops bit for bit */
    ck_assert(f.acts.aux_raw == ref.acts.aux_raw && f.acts.z_raw == ref.acts.z_raw);
    ck_assert_int_eq(f.acts.dropped, ref.acts.dropped);
    ck_assert_mem_eq(f.acts.load.data, ref.acts.load.data, (size_t)cfg.n_experts * sizeof(int64_t));
    if (c == 1) ck_assert_int_gt(f.acts.dropped, 0);

    cai_moe_grad_sync_t *gs = NULL;
    CK_CAI(cai_moe_grad_sync_create(&gs, mesh, f.reg, &f.view, MOE_FIX_ALIGN));
    CK_CAI(cai_moe_grad_sync_run(gs, dev, f.grads));
    cai_moe_grad_sync_free(gs);
    size_t *off = calloc((size_t)cai_registry_count(f.reg), sizeof *off);
    size_t *roff = calloc((size_t)cai_registry_count(f.reg), sizeof *roff);
    size_t total;
    CK_CAI(cai_registry_local_layout(f.reg, &f.view, MOE_FIX_ALIGN, off, &total));
    CK_CAI(cai_registry_local_layout(ref.reg, &ref.view, MOE_FIX_ALIGN, roff, &total));
    double worst = 0.0;
    int held = 0;
    for (int i = 0; i < cai_registry_count(f.reg); i++) {
        if (off[i] == SIZE_MAX) continue;
        const cai_param_info *pi = cai_registry_param(f.reg, i);
        /* the parameters themselves are the same slice of the global init */
        ck_assert_mem_eq(f.params + off[i], ref.params + roff[i], pi->numel * sizeof(float));
        const double e = rel_err(f.grads + off[i], ref.grads + roff[i], (int64_t)pi->numel);
        ck_assert_msg(e <= 1e-5, "case %d ep=%d rank %d: gradient of %s off by %.2e", c, ep, g_world_rank, pi->name, e);
        worst = fmax(worst, e);
        held++;
    }
    ck_assert_int_eq(held, 1 + 3 * cfg.n_experts / ep + 3 * (cfg.n_shared ? 1 : 0));

    /* statistics over dp: the same sums from either run */
    cai_moe_stats st_ep, st_ref, sum_ep, sum_ref;
    cai_moe_stats_get(&f.cx, &f.acts, &st_ep);
    cai_moe_stats_get(&ref.cx, &ref.acts, &st_ref);
    CK_CAI(cai_moe_stats_reduce(mesh, CAI_AXIS_DP, &st_ep, f.acts.load.data, 1, &sum_ep));
    CK_CAI(cai_moe_stats_reduce(mesh, CAI_AXIS_DP, &st_ref, ref.acts.load.data, 1, &sum_ref));
    ck_assert_int_eq(sum_ep.assignments, (int64_t)dp * N_TOK * cfg.top_k);
    ck_assert_int_eq(sum_ep.tokens, (int64_t)dp * N_TOK);
    ck_assert_int_eq(sum_ep.load_max, sum_ref.load_max);
    ck_assert_int_eq(sum_ep.dropped, sum_ref.dropped);
    ck_assert(sum_ep.load_cv == sum_ref.load_cv);
    ck_assert_double_eq_tol(sum_ep.aux_loss, sum_ref.aux_loss, 1e-12);
    if (g_world_rank == 0)
        fprintf(stderr,
                "moe case %d ep=%d edp=%d: output %.2e, input gradient %.2e, gradients %.2e; dp load %lld..%lld "
                "cv %.3f dropped %lld\n",
                c, ep, cai_mesh_size(mesh, CAI_AXIS_EDP), ey, edx, worst, (long long)sum_ep.load_min,
                (long long)sum_ep.load_max, sum_ep.load_cv, (long long)sum_ep.dropped);
    free(off);
    free(roff);
    moe_fix_free(&f);
    moe_fix_free(&ref);
    cai_moe_ep_exchange_free(&ex);
    cai_mesh_free(mesh);
}

START_TEST(expert_parallel_equals_one_rank) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    for (int c = 0; c < 3; c++)
        for (int ep = 2; ep <= g_world_size; ep *= 2) check_case(dev, c, ep);
    cai_device_free(dev);
}
END_TEST

START_TEST(experts_not_divisible_by_ep_refused) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    cai_mesh_config mc = test_mesh_config(1, g_world_size, g_world_size, 1, 1, NULL);
    cai_mesh_t *mesh = NULL;
    CK_CAI(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    cai_moe_exchange ex;
    CK_CAI(cai_moe_ep_exchange_init(&ex, mesh));
    cai_moe_config cfg = case_config(0);
    cfg.n_experts = 6;
    cai_moe_ctx cx;
    cai_error_clear();
    ck_assert_int_eq(cai_moe_ctx_init(&cx, dev, &cfg, N_TOK, D_MODEL, CAI_DTYPE_F32, &ex), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "moe.n_experts=6 is not divisible by ep=4"));
    cai_error_clear();
    cai_moe_ep_exchange_free(&ex);
    cai_mesh_free(mesh);
    cai_device_free(dev);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {expert_parallel_equals_one_rank, experts_not_divisible_by_ep_refused};
    return test_mpi_main(argc, argv, "moe", tests, TEST_COUNT(tests));
}
