/* Training on a GPU allocates nothing after the first step (issue #8,
 * docs/cuda.md "Whole-model tests").
 *
 * A small GPT-2 on cuda:<local rank>, the ZeRO engine over MPI_COMM_WORLD
 * (stages 0 and 3, with and without offload, f32 and bf16) and
 * cai_train_step over cai_zero_driver -- the calls colossal-pretrain makes -- for STEPS steps
 * of 2 microbatches on one fixed, learnable batch. Checked per
 * configuration, on every rank:
 *   - cai_device_alloc_count (every cudaMalloc / cudaHostAlloc of the
 *     backend) does not change after step 1;
 *   - the GPU's free memory (cudaMemGetInfo, which also sees allocations made
 *     outside colossal: NCCL, cuBLASLt, lazily loaded kernels) does not drop
 *     by more than FREE_SLACK after step 1;
 *   - every loss and gradient norm is finite and the last loss is below
 *     0.9 x the first.
 *
 * Run directly (one rank) or under mpirun with one rank per GPU. Exits 77
 * (automake SKIP) when no GPU is visible, 0 on success, 1 on a failure.
 * `test_gpu_train --host` runs the same on the host device (the free-memory
 * check is left out there: other processes move it), a check of the test
 * itself on a machine without GPUs. */
#include "cai_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "colossal/base.h"
#include "colossal/cluster.h"
#include "colossal/model.h"
#include "colossal/optim.h"
#include "colossal/parallel.h"
#include "colossal/tensor.h"

enum { STEPS = 5, N_MICRO = 2, BATCH = 4, SEQ = 128, VOCAB = 512 };

/* cudaMemGetInfo moves by a few pages for reasons of the driver's own
 * (context bookkeeping); anything the size of a real buffer is far above. */
#define FREE_SLACK ((size_t)4 << 20)

static int g_rank, g_size, g_host;

typedef struct {
    const char *name;
    int stage, offload;
    cai_dtype dtype;
} row;

static const row k_rows[] = {
    {"stage 0 f32", 0, 0, CAI_DTYPE_F32},           {"stage 3 f32", 3, 0, CAI_DTYPE_F32},
    {"stage 0 + offload f32", 0, 1, CAI_DTYPE_F32}, {"stage 3 + offload f32", 3, 1, CAI_DTYPE_F32},
    {"stage 0 bf16", 0, 0, CAI_DTYPE_BF16},         {"stage 1 bf16", 1, 0, CAI_DTYPE_BF16},
    {"stage 3 bf16", 3, 0, CAI_DTYPE_BF16},
};

/* A learnable sequence: each token a fixed function of the one before, the
 * start different per row and rank (so dp ranks see different data). */
static void make_batch(int32_t *tok, int32_t *tgt) {
    for (int m = 0; m < N_MICRO * BATCH; m++) {
        int32_t t = (int32_t)((37 * m + 11 * g_rank + 1) % VOCAB);
        for (int i = 0; i <= SEQ; i++) {
            int32_t next = (int32_t)((t * 7 + 3) % VOCAB);
            if (i < SEQ) tok[m * SEQ + i] = t;
            if (i > 0) tgt[m * SEQ + i - 1] = t;
            t = next;
        }
    }
}

/* One configuration; *ok cleared on a failed check. Errors of the API are
 * returned (and make the test fail). */
static cai_status run_row(cai_device_t *dev, const row *r, int *ok) {
    cai_status st = CAI_OK;
    cai_mesh_t *mesh = NULL;
    cai_model_t *m = NULL;
    cai_zero_t *z = NULL;
    cai_optim_t *o = NULL;
    int32_t *tok = NULL, *tgt = NULL;

    cai_model_config cfg = cai_model_config_default(CAI_MODEL_GPT2);
    cfg.vocab_size = VOCAB;
    cfg.n_layers = 4;
    cfg.d_model = 256;
    cfg.n_heads = 4;
    cfg.n_kv_heads = 4;
    cfg.max_seq_len = SEQ;
    cfg.seed = 7;
    cfg.param_dtype = r->dtype;
    cfg.act_dtype = g_host ? CAI_DTYPE_F32 : r->dtype; /* as colossal-pretrain: the host computes in f32 */
    cai_model_config res;
    CAI_CALL(cai_model_config_resolve(&cfg, &res));

    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout = (cai_layout){1, g_size, 1, 1, 1, NULL};
    mc.watchdog_timeout_s = 120;
    cai_zero_config zc;
    cai_zero_config_init(&zc);
    zc.stage = r->stage;
    zc.offload = r->offload;
    zc.bucket_bytes = (size_t)1 << 20; /* several buckets per step */
    zc.reduce_only = r->stage == 0 && !r->offload;
    cai_model_options mo = cai_model_options_default(&res);
    mo.batch = BATCH;
    mo.seq_len = SEQ;
    cai_zero_model_options(&zc, &mo);
    cai_adamw_config oc = cai_adamw_config_default();
    oc.schedule.lr = 3e-3f;
    oc.schedule.warmup_steps = 0;

    const size_t n = (size_t)N_MICRO * BATCH * SEQ;
    tok = malloc(n * sizeof *tok);
    tgt = malloc(n * sizeof *tgt);
    if (!tok || !tgt) {
        st = CAI_ERROR(CAI_ERR_NOMEM, "test_gpu_train: batch buffers");
        goto done;
    }
    make_batch(tok, tgt);

    uint64_t bs = 0, ns = cai_device_alloc_count(dev, &bs);
    CAI_CALL_GOTO(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc), st, done);
    CAI_CALL_GOTO(cai_model_create(&m, dev, &res, &mo), st, done);
    if (zc.reduce_only) CAI_CALL_GOTO(cai_optim_create_for_model(&o, m, &oc), st, done);
    CAI_CALL_GOTO(cai_zero_create(&z, mesh, m, &zc), st, done);
    cai_step_driver drv;
    CAI_CALL_GOTO(cai_zero_driver(z, o, &drv), st, done);

    uint64_t n0 = 0, b0 = 0, ni = 0, bi = 0;
    size_t free0 = 0, total = 0, free_min = (size_t)-1;
    ni = cai_device_alloc_count(dev, &bi);
    float first = 0, last = 0;
    for (int s = 1; s <= STEPS; s++) {
        cai_step_stats ss;
        CAI_CALL_GOTO(cai_train_step(&drv, &oc, NULL, tok, tgt, N_MICRO, &ss), st, done);
        CAI_CALL_GOTO(cai_device_sync(dev), st, done);
        size_t fr = 0;
        CAI_CALL_GOTO(cai_device_mem_info(dev, &fr, &total), st, done);
        uint64_t nb = 0, nc = cai_device_alloc_count(dev, &nb);
        if (s == 1) {
            n0 = nc;
            b0 = nb;
            free0 = fr;
        } else if (nc != n0) {
            fprintf(stderr, "[rank %d] FAIL %s: step %d made %llu device allocation(s) (%llu bytes) after step 1\n",
                    g_rank, r->name, s, (unsigned long long)(nc - n0), (unsigned long long)(nb - b0));
            *ok = 0;
        }
        if (s > 1 && fr < free_min) free_min = fr;
        if (!isfinite(ss.loss) || !isfinite(ss.grad_norm) || ss.skipped) {
            fprintf(stderr, "[rank %d] FAIL %s: step %d loss %g grad norm %g%s\n", g_rank, r->name, s, (double)ss.loss,
                    (double)ss.grad_norm, ss.skipped ? " (skipped)" : "");
            *ok = 0;
        }
        if (s == 1) first = ss.loss;
        last = ss.loss;
        if (g_rank == 0)
            printf("  %-24s step %d  loss %.5f  grad norm %.4f  device allocations %llu (%.1f MiB)  free %.1f MiB\n",
                   r->name, s, (double)ss.loss, (double)ss.grad_norm, (unsigned long long)nc, nb / 1048576.0,
                   fr / 1048576.0);
    }
    if (!g_host && free_min != (size_t)-1 && free_min + FREE_SLACK < free0) {
        fprintf(stderr,
                "[rank %d] FAIL %s: free GPU memory fell by %.1f MiB after step 1 (allocations outside the "
                "device API?)\n",
                g_rank, r->name, (free0 - free_min) / 1048576.0);
        *ok = 0;
    }
    if (!(last < 0.9f * first)) {
        fprintf(stderr, "[rank %d] FAIL %s: the loss did not fall (%g -> %g)\n", g_rank, r->name, (double)first,
                (double)last);
        *ok = 0;
    }
    if (g_rank == 0)
        printf(
            "%s %s: loss %.4f -> %.4f; device allocations: %llu at create (%.1f MiB), %llu in step 1 (%.1f MiB), "
            "%s after; dp %d\n",
            *ok ? "ok  " : "FAIL", r->name, (double)first, (double)last, (unsigned long long)(ni - ns),
            (bi - bs) / 1048576.0, (unsigned long long)(n0 - ni), (b0 - bi) / 1048576.0, *ok ? "none" : "see above",
            g_size);
done:
    cai_zero_free(z);
    cai_optim_free(o);
    cai_model_free(m);
    cai_mesh_free(mesh);
    free(tok);
    free(tgt);
    return st;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    cai_log_set_rank(g_rank, g_size);

    /* One GPU per rank, by node-local rank (as colossal-pretrain). */
    MPI_Comm node;
    int local = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    g_host = argc > 1 && strcmp(argv[1], "--host") == 0;
    cai_device_t *dev = NULL;
    cai_status st = cai_device_init(&dev, g_host ? CAI_DEVICE_HOST : CAI_DEVICE_CUDA, g_host ? 0 : local, 1);
    int have = st == CAI_OK, all = 0;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (g_rank == 0) printf("SKIP: %s\n", st != CAI_OK ? cai_error_message() : "a rank has no GPU");
        cai_device_free(dev);
        MPI_Finalize();
        return 77;
    }
    if (g_rank == 0) printf("test_gpu_train: %d rank(s), rank 0 on %s\n", g_size, dev->name);

    int ok = 1;
    for (size_t i = 0; i < sizeof k_rows / sizeof k_rows[0]; i++) {
        int row_ok = 1;
        st = run_row(dev, &k_rows[i], &row_ok);
        if (st != CAI_OK) {
            fprintf(stderr, "[rank %d] FAIL %s: ", g_rank, k_rows[i].name);
            cai_error_print(stderr);
            cai_error_clear();
            row_ok = 0;
        }
        int all_ok = 0;
        MPI_Allreduce(&row_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        ok &= all_ok;
    }
    cai_device_free(dev);
    if (g_rank == 0) printf("test_gpu_train: %s\n", ok ? "PASS" : "FAILED");
    MPI_Finalize();
    return ok ? 0 : 1;
}
