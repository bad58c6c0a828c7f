/* Equivalence of a Mixtral-style model (Llama blocks whose MLPs are MoE
 * sublayers, f32, CPU, dropless) under ep x dp x tp against one rank: 8
 * AdamW steps with clipping through cai_train_step, the expert-parallel
 * driver (cai_moe_driver_create) on the mesh and the single-process driver
 * on one rank, whose global batch is cut into one microbatch per dp rank
 * (the aux and z losses are per microbatch, as they are per rank). Every
 * step's loss, gradient norm and aux / z loss (summed over layers, averaged
 * over dp) within 1e-5 relative, the per-expert loads summed over dp equal,
 * and every held parameter after the 8 steps within 1e-4 (relative to its
 * tensor's largest element; AdamW divides by tiny second moments) of the reference's
 * slice. Rows by world size (4 or 8 ranks); MOE_EQUIV_FULL=1 runs every
 * (ep, tp) that fits the world. A layout refused before allocation: experts
 * not divisible by ep, ep > 1 without experts, ep without its exchange.
 * Rows with zero > 0 run the ZeRO engine's driver instead: dense optimizer
 * state sharded over dp (= edp x ep), experts' over edp; each rank's
 * AdamW moments hold (dense / dp + experts / edp) elements up to the
 * buckets' alignment padding. */
#include "cai_config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/moe.h"
#include "colossal/optim.h"
#include "colossal/parallel.h"
#include "test_mesh_util.h"

enum { STEPS = 8, B = 2, T = 8, VOCAB = 61, MAXL = 4 };

typedef struct {
    double loss[STEPS], norm[STEPS], aux[STEPS], z[STEPS];
    int64_t load[STEPS][MAXL * 8];
} run_log;

static cai_model_config model_cfg(int shared) {
    cai_model_config c = cai_model_config_default(CAI_MODEL_LLAMA);
    c.vocab_size = VOCAB;
    c.vocab_multiple = 16;
    c.n_layers = 2;
    c.d_model = 32;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_hidden = 48;
    c.max_seq_len = T;
    c.seed = 77;
    c.moe = cai_moe_config_default();
    c.moe.n_experts = 4;
    c.moe.top_k = 2;
    c.moe.ffn = 16;
    c.moe.n_shared = shared;
    c.moe.aux_coef = 0.05f;
    c.moe.z_coef = 0.01f;
    return c;
}

static cai_adamw_config optim_cfg(void) {
    cai_adamw_config o = cai_adamw_config_default();
    o.schedule.kind = CAI_LR_CONSTANT;
    o.schedule.lr = 1e-3f;
    o.schedule.warmup_steps = 0;
    o.grad_clip = 0.5f; /* the norm clips: the norm's expert part must be right */
    return o;
}

/* Global batch of step s: dp * B sequences; rank r's microbatch is the r-th B. */
static void batch(int step, int dp, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < dp * B * T; i++) {
        uint32_t h = (uint32_t)(step * 7919 + i * 2654435761u);
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        tok[i] = (int32_t)(h % VOCAB);
        tgt[i] = (int32_t)((h >> 8) % VOCAB);
    }
}

static void log_stats(cai_model_t *m, cai_mesh_t *mesh, run_log *lg, int step) {
    cai_moe_stats local[MAXL], st[MAXL];
    int64_t loads[MAXL * 8];
    int n = 0;
    CK_CAI(cai_model_moe_stats_take(m, local, loads, MAXL, &n));
    ck_assert_int_eq(n, 2);
    if (mesh) CK_CAI(cai_moe_stats_reduce(mesh, CAI_AXIS_DP, local, loads, n, st));
    else memcpy(st, local, sizeof st);
    lg->aux[step] = lg->z[step] = 0;
    for (int l = 0; l < n; l++) {
        lg->aux[step] += st[l].aux_loss;
        lg->z[step] += st[l].z_loss;
    }
    /* loads over dp: the reduce summarised them; recover the sum per expert */
    if (mesh) MPI_Allreduce(MPI_IN_PLACE, loads, n * 4, MPI_INT64_T, MPI_SUM, cai_mesh_comm(mesh, CAI_AXIS_DP));
    memcpy(lg->load[step], loads, (size_t)n * 4 * sizeof *loads);
}

/* The model and its AdamW. */
static void create(cai_device_t *dev, const cai_model_config *c, const cai_model_options *o, cai_model_t **m,
                   cai_optim_t **opt) {
    cai_adamw_config oc = optim_cfg();
    CK_CAI(cai_model_create(m, dev, c, o));
    CK_CAI(cai_optim_create_for_model(opt, *m, &oc));
}

/* One rank, the whole model, dp microbatches a step. */
static cai_model_t *reference(cai_device_t *dev, int shared, int dp, run_log *lg) {
    cai_model_config c = model_cfg(shared);
    cai_model_options o = cai_model_options_default(&c);
    o.batch = B;
    o.seq_len = T;
    cai_model_t *m = NULL;
    cai_optim_t *opt = NULL;
    create(dev, &c, &o, &m, &opt);
    cai_step_driver d;
    CK_CAI(cai_local_driver(m, opt, &d));
    int32_t tok[8 * B * T], tgt[8 * B * T];
    for (int s = 0; s < STEPS; s++) {
        batch(s, dp, tok, tgt);
        cai_step_stats st;
        CK_CAI(cai_train_step(&d, NULL, NULL, tok, tgt, dp, &st));
        lg->loss[s] = st.loss;
        lg->norm[s] = st.grad_norm;
        log_stats(m, NULL, lg, s);
    }
    cai_optim_free(opt);
    return m;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* The moments this rank holds: the dense parameters' share of dp and the
 * experts' of edp, each bucket padded to a multiple of its group's size
 * times the alignment (less than one alignment unit per rank and bucket),
 * with the flat layout's gaps between parameters. */
static void check_shard(cai_zero_t *z, cai_mesh_t *mesh) {
    const int stage = cai_zero_get_config(z)->stage;
    cai_model_t *m = cai_zero_model(z);
    const cai_registry_t *reg = cai_model_registry(m);
    const int dp = cai_mesh_size(mesh, CAI_AXIS_DP), edp = cai_mesh_size(mesh, CAI_AXIS_EDP);
    double dense = 0, expert = 0;
    int held = 0;
    for (int i = 0; i < cai_registry_count(reg); i++) {
        cai_param_shard sh;
        CK_CAI(cai_registry_shard(reg, i, cai_model_view(m), &sh));
        if (!sh.held) continue;
        held++;
        if (cai_registry_param(reg, i)->spec.n_experts > 0) expert += (double)sh.local_numel;
        else dense += (double)sh.local_numel;
    }
    cai_tensor mm, vv;
    cai_zero_shard_state(z, NULL, &mm, &vv);
    cai_zero_stats zs;
    cai_zero_get_stats(z, &zs);
    const double want = dense / dp + expert / edp, got = (double)cai_tensor_numel(&mm);
    const double pad = (double)((zs.n_buckets + held) * cai_model_align_elems(m));
    ck_assert_int_eq(cai_tensor_numel(&vv), cai_tensor_numel(&mm));
    ck_assert_msg(expert > 0 && got >= want && got < want + pad,
                  "zero %d rank %d: %.0f moment elements; dense %.0f / dp %d + experts %.0f / edp %d = %.1f (padding < "
                  "%.0f)",
                  stage, g_world_rank, got, dense, dp, expert, edp, want, pad);
    if (g_world_rank == 0)
        fprintf(stderr,
                "  zero %d: %.0f moment elements per rank = %.0f / %d + %.0f / %d + %.0f padding (%d buckets)\n", stage,
                got, dense, dp, expert, edp, got - want, zs.n_buckets);
}

static void check_row(int ep, int tp, int shared, int zero, int offload) {
    const int dp = g_world_size / tp;
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    run_log ref, got;
    memset(&ref, 0, sizeof ref);
    memset(&got, 0, sizeof got);
    cai_model_t *rm = reference(dev, shared, dp, &ref);

    cai_mesh_config mc = test_mesh_config(1, dp, ep, 1, tp, NULL);
    cai_mesh_t *mesh = NULL;
    CK_CAI(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    cai_moe_exchange ex;
    CK_CAI(cai_moe_ep_exchange_init(&ex, mesh));
    cai_model_config c = model_cfg(shared);
    cai_model_options o = cai_model_options_default(&c);
    o.batch = B;
    o.seq_len = T;
    o.mesh = mesh;
    o.view.tp_size = tp;
    o.view.tp_rank = cai_mesh_rank(mesh, CAI_AXIS_TP);
    o.view.ep_size = ep;
    o.view.ep_rank = cai_mesh_rank(mesh, CAI_AXIS_EP);
    o.moe_exchange = &ex;
    cai_model_t *m = NULL;
    cai_optim_t *opt = NULL;
    cai_zero_t *z = NULL;
    cai_step_driver d;
    if (zero) {
        cai_zero_config zc;
        cai_zero_config_init(&zc);
        zc.stage = zero;
        zc.offload = offload;
        zc.bucket_bytes = 24 << 10; /* several buckets, each of dense or expert parameters */
        cai_zero_model_options(&zc, &o);
        CK_CAI(cai_model_create(&m, dev, &c, &o));
        CK_CAI(cai_zero_create(&z, mesh, m, &zc));
        CK_CAI(cai_zero_driver(z, NULL, &d));
        check_shard(z, mesh);
    } else {
        create(dev, &c, &o, &m, &opt);
        CK_CAI(cai_moe_driver_create(m, opt, mesh, &d));
    }
    cai_adamw_config oc = optim_cfg();
    const int r = cai_mesh_rank(mesh, CAI_AXIS_DP);
    int32_t tok[8 * B * T], tgt[8 * B * T];
    double worst[4] = {0};
    for (int s = 0; s < STEPS; s++) {
        batch(s, dp, tok, tgt);
        cai_step_stats st;
        CK_CAI(cai_train_step(&d, &oc, NULL, tok + r * B * T, tgt + r * B * T, 1, &st));
        got.loss[s] = st.loss;
        got.norm[s] = st.grad_norm;
        log_stats(m, mesh, &got, s);
        const double e[4] = {rel(got.loss[s], ref.loss[s]), rel(got.norm[s], ref.norm[s]), rel(got.aux[s], ref.aux[s]),
                             rel(got.z[s], ref.z[s])};
        for (int k = 0; k < 4; k++) worst[k] = fmax(worst[k], e[k]);
        ck_assert_msg(e[0] <= 1e-5 && e[1] <= 1e-5 && e[2] <= 1e-5 && e[3] <= 1e-5,
                      "ep=%d tp=%d dp=%d zero %d step %d rank %d: loss %.8g vs %.8g, norm %.8g vs %.8g, aux %.8g vs "
                      "%.8g, z %.8g vs %.8g",
                      ep, tp, dp, zero, s, g_world_rank, got.loss[s], ref.loss[s], got.norm[s], ref.norm[s], got.aux[s],
                      ref.aux[s], got.z[s], ref.z[s]);
        ck_assert_msg(memcmp(got.load[s], ref.load[s], 8 * sizeof(int64_t)) == 0,
                      "ep=%d tp=%d step %d: expert loads differ from one rank's", ep, tp, s);
    }
    /* parameters: each held shard against the reference's slice */
    const cai_registry_t *reg = cai_model_registry(m);
    double wp = 0;
    for (int i = 0; i < cai_registry_count(reg); i++) {
        const cai_param_info *pi = cai_registry_param(reg, i);
        cai_param_shard sh;
        CK_CAI(cai_registry_shard(reg, i, cai_model_view(m), &sh));
        if (!sh.held) continue;
        cai_tensor a, b;
        float *held = malloc(sh.local_numel * sizeof(float));
        if (z) { /* the masters, assembled from the shards of the parameter's group */
            CK_CAI(cai_zero_gather_param(z, i, held));
        } else {
            CK_CAI(cai_model_param(m, pi->name, &a, NULL));
            memcpy(held, a.data, sh.local_numel * sizeof(float));
        }
        CK_CAI(cai_model_param(rm, pi->name, &b, NULL));
        float *slice = malloc(sh.local_numel * sizeof(float));
        cai_shard_extract(&sh, sizeof(float), b.data, slice);
        double dmax = 0, bmax = 0;
        for (uint64_t k = 0; k < sh.local_numel; k++) {
            dmax = fmax(dmax, fabs((double)held[k] - slice[k]));
            bmax = fmax(bmax, fabs((double)slice[k]));
        }
        free(slice);
        free(held);
        wp = fmax(wp, dmax / fmax(bmax, 1e-30));
        ck_assert_msg(dmax <= 1e-4 * fmax(bmax, 1e-30), "ep=%d tp=%d rank %d: %s differs by %.3g (max %.3g)", ep, tp,
                      g_world_rank, pi->name, dmax, bmax);
    }
    if (z) { /* the memory planner's bytes are the engine's, experts sharded over edp */
        cai_mem_plan_request q = {.model = c, .batch = B, .seq_len = T, .view = o.view, .dp = dp, .dev = dev};
        q.zero = *cai_zero_get_config(z);
        cai_mem_plan plan, used;
        CK_CAI(cai_mem_plan_compute(&q, &plan));
        cai_zero_memory(z, &used);
        ck_assert_msg(plan.device + plan.host == used.device + used.host && plan.optim == used.optim,
                      "ep=%d tp=%d zero %d rank %d: planned %zu + %zu bytes (moments %zu), the engine holds %zu + %zu "
                      "(moments %zu)",
                      ep, tp, zero, g_world_rank, plan.device, plan.host, plan.optim, used.device, used.host,
                      used.optim);
    }
    double all[5] = {worst[0], worst[1], worst[2], worst[3], wp};
    MPI_Allreduce(MPI_IN_PLACE, all, 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (g_world_rank == 0)
        fprintf(stderr,
                "moe equivalence ep=%d dp=%d tp=%d zero %d%s%s: worst relative loss %.2e, grad norm %.2e, aux %.2e, "
                "z %.2e, parameters %.2e over %d steps\n",
                ep, dp, tp, zero, offload ? " offload" : "", shared ? " shared expert" : "", all[0], all[1], all[2],
                all[3], all[4], STEPS);
    if (!zero) cai_moe_driver_free(&d);
    cai_zero_free(z);
    cai_optim_free(opt);
    cai_model_free(m);
    cai_model_free(rm);
    cai_moe_ep_exchange_free(&ex);
    cai_mesh_free(mesh);
    cai_device_free(dev);
}

static int full(void) {
    const char *e = getenv("MOE_EQUIV_FULL");
    return e && e[0] == '1';
}

START_TEST(equivalence) {
    if (full()) {
        for (int tp = 1; tp <= 2; tp++)
            for (int ep = 1; ep <= 4; ep *= 2)
                for (int zero = 0; zero <= 2; zero++)
                    if (g_world_size % tp == 0 && (g_world_size / tp) % ep == 0 && (ep > 1 || zero == 0))
                        check_row(ep, tp, 0, zero, 0);
        return;
    }
    const char *only = getenv("MOE_EQUIV_ROW"); /* one row only: "ep,tp,shared,zero,offload" */
    int row[5] = {0};
    if (only && sscanf(only, "%d,%d,%d,%d,%d", &row[0], &row[1], &row[2], &row[3], &row[4]) >= 4) {
        check_row(row[0], row[1], row[2], row[3], row[4]);
        return;
    }
    /* the subset `make check` runs on 4 ranks */
    check_row(4, 1, 0, 0, 0);
    check_row(2, 2, 1, 0, 0);
    check_row(2, 1, 0, 1, 0); /* edp = 2 */
    check_row(2, 2, 1, 1, 0); /* edp = 1, tp = 2, a shared expert */
    check_row(2, 1, 1, 2, 0);
    check_row(2, 2, 0, 3, 1);
}
END_TEST

START_TEST(bad_layouts) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    cai_model_config c = model_cfg(0);
    c.moe.n_experts = 6;
    cai_model_options o = cai_model_options_default(&c);
    o.view.ep_size = 4;
    o.view.ep_rank = 0;
    cai_model_t *m = NULL;
    cai_status st = cai_model_create(&m, dev, &c, &o);
    ck_assert_int_eq(st, CAI_ERR_LAYOUT);
    ck_assert_msg(strstr(cai_error_message(), "moe.n_experts=6 is not divisible by ep=4") &&
                      strstr(cai_error_message(), "ep values that fit: 1, 2, 3, 6"),
                  "%s", cai_error_message());
    c.moe.n_experts = 4;
    st = cai_model_create(&m, dev, &c, &o);
    ck_assert_int_eq(st, CAI_ERR_INVALID_ARG);
    ck_assert_msg(strstr(cai_error_message(), "ep=4 needs the ep exchange"), "%s", cai_error_message());
    c.moe.n_experts = 0;
    st = cai_model_create(&m, dev, &c, &o);
    ck_assert_int_eq(st, CAI_ERR_CONFIG);
    ck_assert_msg(strstr(cai_error_message(), "mesh.ep=4 splits experts, but the model has none"), "%s",
                  cai_error_message());
    c = model_cfg(0);
    c.moe.top_k = 5;
    st = cai_model_create(&m, dev, &c, NULL);
    ck_assert_int_eq(st, CAI_ERR_CONFIG);
    ck_assert_msg(strstr(cai_error_message(), "moe.top_k=5 must be between 1 and moe.n_experts=4"), "%s",
                  cai_error_message());
    c = model_cfg(0);
    c.family = CAI_MODEL_GPT2;
    c.n_kv_heads = 0;
    st = cai_model_create(&m, dev, &c, NULL);
    ck_assert_int_eq(st, CAI_ERR_CONFIG);
    ck_assert_msg(strstr(cai_error_message(), "(model.family=llama), not gpt2"), "%s", cai_error_message());
    ck_assert_ptr_null(m);
    cai_device_free(dev);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {bad_layouts, equivalence};
    return test_mpi_main(argc, argv, "test_moe_model", tests, TEST_COUNT(tests));
}
