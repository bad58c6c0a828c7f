/* PyTorch parity driver for sequence-parallel attention (src/parallel/
 * ring_attention.c, ulysses.c; docs/sequence-parallel.md). Under mpiexec,
 * every rank of the world's sp axis runs ring attention (zigzag shards) and
 * Ulysses (contiguous shards), causal and not, forward and backward on its
 * shard of one set of inputs; the shards are put back in global order and
 * rank 0 writes, for each case i, into one safetensors file:
 *
 *   c<i>.q, c<i>.dout  F32 [B,T,Hq,D];  c<i>.k, c<i>.v  F32 [B,T,Hkv,D]
 *   c<i>.out, c<i>.dq  F32 [B,T,Hq,D];  c<i>.dk, c<i>.dv  F32 [B,T,Hkv,D]
 *   c<i>.lse           F32 [B,Hq,T]
 *
 * with "c<i>.mode", "c<i>.causal" and "sp" as metadata.
 * tests/parity/sp_reference.py recomputes attention in float64 PyTorch.
 * Usage: mpiexec -n SP sp_driver OUT.safetensors. */
#include "cai_config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/ckpt.h"
#include "colossal/seq_parallel.h"

enum { B = 2, T = 24, HQ = 4, HKV = 2, D = 8, N_CASES = 4, N_T = 9 };

typedef struct {
    float *t[N_T]; /* q k v dout out dq dk dv lse, global */
} case_bufs;

static const char *const k_names[N_T] = {"q", "k", "v", "dout", "out", "dq", "dk", "dv", "lse"};

static int64_t heads_of(int i) { return i == 1 || i == 2 || i == 6 || i == 7 ? HKV : HQ; }

/* Deterministic values in [-1, 1), the same on every rank. */
static void fill(float *x, int64_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((s >> 8) / 8388608.0 - 1.0);
    }
}

static cai_tensor t4(cai_device_t *dev, float *p, int64_t t, int64_t h) {
    return cai_tensor_4d(dev, p, CAI_DTYPE_F32, B, t, h, D);
}

/* This rank's rows [B, Tl] of a global [B, T, ...] tensor (dim 1), either way. */
static cai_status move_rows(cai_device_t *dev, cai_sp_mode mode, int sp, int r, cai_tensor *local, cai_tensor *full,
                            int to_local) {
    if (mode == CAI_SP_RING)
        return to_local ? cai_zigzag_shard(dev, local, full, sp, r) : cai_zigzag_unshard(dev, full, local, sp, r);
    cai_tensor part;
    CAI_CALL(cai_tensor_narrow(full, 1, r * (T / sp), T / sp, &part));
    return to_local ? dev->ops->copy(dev, local, &part) : dev->ops->copy(dev, &part, local);
}

static cai_status run_case(cai_mesh_t *mesh, cai_device_t *dev, cai_sp_mode mode, int causal, case_bufs *g) {
    const int sp = cai_mesh_size(mesh, CAI_AXIS_SP), r = cai_mesh_rank(mesh, CAI_AXIS_SP);
    const int64_t Tl = T / sp, Hs = HQ / sp;
    float *l[N_T];
    cai_tensor lt[N_T], gt[N_T];
    for (int i = 0; i < N_T; i++) {
        const int64_t n = (i == 8 ? (int64_t)B * HQ * T : (int64_t)B * T * heads_of(i) * D);
        g->t[i] = calloc((size_t)n, sizeof(float));
        l[i] = calloc((size_t)(n / sp), sizeof(float));
        if (i < 8) lt[i] = t4(dev, l[i], Tl, heads_of(i)), gt[i] = t4(dev, g->t[i], T, heads_of(i));
        if (i < 4) fill(g->t[i], n, (uint32_t)(i + 1));
    }
    for (int i = 0; i < 4; i++) CAI_CALL(move_rows(dev, mode, sp, r, &lt[i], &gt[i], 1));
    cai_sp_attn_shape s = {B, T, HQ, HKV, D, sp};
    cai_sp_attention att;
    CAI_CALL(cai_sp_attention_init(&att, mesh, CAI_AXIS_SP, dev, mode, &s));
    cai_attn_params p = {.causal = causal};
    /* The hook takes the layer's lse buffer, [B,Hq,T/sp] elements. */
    cai_tensor lse = cai_tensor_3d(dev, l[8], CAI_DTYPE_F32, B, HQ, Tl);
    cai_status st = att.hook.fwd(&att, &lt[4], &lse, &lt[0], &lt[1], &lt[2], &p);
    if (st == CAI_OK) st = att.hook.bwd(&att, &lt[5], &lt[6], &lt[7], &lt[3], &lt[0], &lt[1], &lt[2], &lt[4], &lse, &p);
    cai_sp_attention_free(&att);
    CAI_CALL(st);
    for (int i = 4; i < 8; i++) CAI_CALL(move_rows(dev, mode, sp, r, &lt[i], &gt[i], 0));
    cai_tensor gl = cai_tensor_3d(dev, g->t[8], CAI_DTYPE_F32, B, HQ, T);
    if (mode == CAI_SP_RING) { /* [B,Hq,Tl] in zigzag order: shard the sequence dimension */
        cai_tensor a, b;
        CAI_CALL(cai_tensor_transpose(&lse, 1, 2, &a));
        CAI_CALL(cai_tensor_transpose(&gl, 1, 2, &b));
        CAI_CALL(cai_zigzag_unshard(dev, &b, &a, sp, r));
    } else { /* [B,Hq/sp,T]: the rank's heads */
        cai_tensor mine = cai_tensor_3d(dev, l[8], CAI_DTYPE_F32, B, Hs, T), part;
        CAI_CALL(cai_tensor_narrow(&gl, 1, r * Hs, Hs, &part));
        CAI_CALL(dev->ops->copy(dev, &part, &mine));
    }
    /* Every element was written by exactly one rank. */
    for (int i = 4; i < N_T; i++) {
        const size_t n = i == 8 ? (size_t)B * HQ * T : (size_t)B * T * (size_t)heads_of(i) * D;
        CAI_CALL(cai_allreduce(mesh, CAI_AXIS_SP, g->t[i], g->t[i], n, CAI_DTYPE_F32, CAI_RED_SUM));
    }
    for (int i = 0; i < N_T; i++) free(l[i]);
    return CAI_OK;
}

static cai_status drive(const char *path) {
    int world = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    cai_mesh_config mc;
    cai_mesh_config_init(&mc);
    mc.layout = (cai_layout){1, 1, 1, world, 1, NULL};
    mc.watchdog_timeout_s = 60;
    cai_mesh_t *mesh = NULL;
    cai_device_t *dev = NULL;
    CAI_CALL(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    cai_status st = cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1);
    static case_bufs g[N_CASES];
    static cai_st_tensor tens[N_CASES * N_T];
    static char names[N_CASES * N_T][32], mk[2 * N_CASES + 1][2][32];
    cai_st_meta meta[2 * N_CASES + 1];
    int nt = 0, nm = 0;
    for (int c = 0; c < N_CASES && st == CAI_OK; c++) {
        const cai_sp_mode mode = c < 2 ? CAI_SP_RING : CAI_SP_ULYSSES;
        const int causal = c % 2 == 0;
        st = run_case(mesh, dev, mode, causal, &g[c]);
        for (int i = 0; i < N_T && st == CAI_OK; i++) {
            snprintf(names[nt], sizeof names[nt], "c%d.%s", c, k_names[i]);
            cai_st_tensor *t = &tens[nt];
            memset(t, 0, sizeof *t);
            t->name = names[nt];
            t->dtype = CAI_DTYPE_F32;
            t->ndim = i == 8 ? 3 : 4;
            const uint64_t sh[4] = {B, i == 8 ? HQ : T, i == 8 ? T : (uint64_t)heads_of(i), D};
            memcpy(t->shape, sh, sizeof sh);
            t->data = g[c].t[i];
            nt++;
        }
        snprintf(mk[nm][0], 32, "c%d.mode", c);
        snprintf(mk[nm][1], 32, "%s", mode == CAI_SP_RING ? "ring" : "ulysses");
        meta[nm] = (cai_st_meta){mk[nm][0], mk[nm][1]}, nm++;
        snprintf(mk[nm][0], 32, "c%d.causal", c);
        snprintf(mk[nm][1], 32, "%d", causal);
        meta[nm] = (cai_st_meta){mk[nm][0], mk[nm][1]}, nm++;
    }
    snprintf(mk[nm][0], 32, "sp");
    snprintf(mk[nm][1], 32, "%d", world);
    meta[nm] = (cai_st_meta){mk[nm][0], mk[nm][1]}, nm++;
    if (st == CAI_OK && rank == 0) st = cai_safetensors_write(path, tens, nt, meta, nm);
    for (int c = 0; c < N_CASES; c++)
        for (int i = 0; i < N_T; i++) free(g[c].t[i]);
    cai_device_free(dev);
    cai_mesh_free(mesh);
    return st;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (argc != 2) {
        fprintf(stderr, "usage: mpiexec -n SP %s OUT.safetensors\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    cai_status st = drive(argv[1]);
    if (st != CAI_OK) cai_error_print(stderr);
    int bad = st != CAI_OK, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}
