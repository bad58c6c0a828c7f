/* Sequence-parallel attention under mpiexec (2 and 4 ranks): ring attention
 * (zigzag split) and Ulysses give every rank its shard of dense attention
 * over the whole sequence, forward (out, lse) and backward (dq, dk, dv),
 * within 1e-5 (max abs error / max abs reference, f32). Causal and
 * non-causal; q/k/v as separate tensors and as views into a fused QKV
 * buffer; GQA for Ulysses with kv heads split (sp divides them) and
 * replicated (sp a multiple of them); sp over the whole world and, on 4
 * ranks, sp = 2 inside dp = 2. Bad shapes are refused by the validators and
 * by fwd on every rank alike, before any communication or allocation, with
 * messages naming what would fit. */
#include "cai_config.h"

#include <math.h>

#include "colossal/ops.h"
#include "colossal/seq_parallel.h"
#include "test_mesh_util.h"

typedef struct {
    int64_t B, T, Hq, Hkv, D;
    int causal, fused;
} sp_case;

static const sp_case ring_cases[] = {
    {2, 16, 4, 2, 8, 1, 0}, {2, 16, 4, 2, 8, 0, 0}, {1, 32, 4, 4, 4, 1, 1},
    {2, 8, 2, 1, 8, 1, 1},  {1, 24, 2, 2, 4, 0, 1},
};
static const sp_case uly_cases[] = {
    {2, 16, 4, 2, 8, 1, 0}, /* kv heads 2: split at sp 2, replicated at sp 4 */
    {2, 16, 4, 4, 8, 0, 1}, /* kv heads split */
    {1, 12, 4, 1, 4, 1, 1}, /* one kv head replicated on every rank */
    {2, 8, 8, 2, 4, 0, 0},
};

static double max_rel(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0.0 ? d / m : d;
}

/* Deterministic values in [-1, 1), the same on every rank. */
static void fill(float *x, int64_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((s >> 8) / 8388608.0 - 1.0);
    }
}

typedef struct {
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv; /* dense reference over the whole sequence */
} dense;

static void dense_run(cai_device_t *dev, const sp_case *c, dense *r) {
    const int64_t nq = c->B * c->T * c->Hq * c->D, nk = c->B * c->T * c->Hkv * c->D;
    float **bufs[] = {&r->q, &r->dout, &r->out, &r->dq};
    for (int i = 0; i < 4; i++) *bufs[i] = calloc((size_t)nq, sizeof(float));
    r->k = calloc((size_t)nk, 4), r->v = calloc((size_t)nk, 4), r->dk = calloc((size_t)nk, 4);
    r->dv = calloc((size_t)nk, 4), r->lse = calloc((size_t)(c->B * c->Hq * c->T), 4);
    fill(r->q, nq, 1), fill(r->k, nk, 2), fill(r->v, nk, 3), fill(r->dout, nq, 4);
    cai_tensor q = cai_tensor_4d(dev, r->q, CAI_DTYPE_F32, c->B, c->T, c->Hq, c->D),
               k = cai_tensor_4d(dev, r->k, CAI_DTYPE_F32, c->B, c->T, c->Hkv, c->D),
               v = cai_tensor_4d(dev, r->v, CAI_DTYPE_F32, c->B, c->T, c->Hkv, c->D),
               o = cai_tensor_4d(dev, r->out, CAI_DTYPE_F32, c->B, c->T, c->Hq, c->D),
               dout = cai_tensor_4d(dev, r->dout, CAI_DTYPE_F32, c->B, c->T, c->Hq, c->D),
               dq = cai_tensor_4d(dev, r->dq, CAI_DTYPE_F32, c->B, c->T, c->Hq, c->D),
               dk = cai_tensor_4d(dev, r->dk, CAI_DTYPE_F32, c->B, c->T, c->Hkv, c->D),
               dv = cai_tensor_4d(dev, r->dv, CAI_DTYPE_F32, c->B, c->T, c->Hkv, c->D),
               lse = cai_tensor_3d(dev, r->lse, CAI_DTYPE_F32, c->B, c->Hq, c->T);
    size_t wsb = dev->ops->attention_workspace_bytes(dev, c->B, c->T, c->T, c->Hq, c->Hkv, c->D);
    void *ws = malloc(wsb);
    cai_attn_params p = {.causal = c->causal};
    CK_CAI(dev->ops->attention_fwd(dev, &o, &lse, &q, &k, &v, &p, ws, wsb));
    CK_CAI(dev->ops->attention_bwd(dev, &dq, &dk, &dv, &dout, &q, &k, &v, &o, &lse, &p, ws, wsb));
    free(ws);
}

static void dense_free(dense *r) {
    free(r->q), free(r->k), free(r->v), free(r->dout), free(r->out), free(r->lse), free(r->dq), free(r->dk);
    free(r->dv);
}

/* This rank's inputs and outputs, [B,Tl,H,D]; with c->fused q/k/v (and
 * dq/dk/dv) are views into one [B,Tl,(Hq+2Hkv)*D] buffer each. */
typedef struct {
    float *qkv, *dqkv, *dout, *out, *lse;
    cai_tensor q, k, v, dq, dk, dv, tdout, tout, tlse;
} local_set;

static void qkv_views(cai_device_t *dev, const sp_case *c, int64_t Tl, float *buf, cai_tensor *q, cai_tensor *k,
                      cai_tensor *v) {
    if (c->fused) {
        const int64_t W = (c->Hq + 2 * c->Hkv) * c->D;
        cai_tensor all = cai_tensor_3d(dev, buf, CAI_DTYPE_F32, c->B, Tl, W), t;
        CK_CAI(cai_tensor_narrow(&all, 2, 0, c->Hq * c->D, &t));
        CK_CAI(cai_tensor_unflatten(&t, 2, c->D, q));
        CK_CAI(cai_tensor_narrow(&all, 2, c->Hq * c->D, c->Hkv * c->D, &t));
        CK_CAI(cai_tensor_unflatten(&t, 2, c->D, k));
        CK_CAI(cai_tensor_narrow(&all, 2, (c->Hq + c->Hkv) * c->D, c->Hkv * c->D, &t));
        CK_CAI(cai_tensor_unflatten(&t, 2, c->D, v));
    } else {
        const int64_t nq = c->B * Tl * c->Hq * c->D, nk = c->B * Tl * c->Hkv * c->D;
        *q = cai_tensor_4d(dev, buf, CAI_DTYPE_F32, c->B, Tl, c->Hq, c->D);
        *k = cai_tensor_4d(dev, buf + nq, CAI_DTYPE_F32, c->B, Tl, c->Hkv, c->D);
        *v = cai_tensor_4d(dev, buf + nq + nk, CAI_DTYPE_F32, c->B, Tl, c->Hkv, c->D);
    }
}

static void local_init(cai_device_t *dev, const sp_case *c, int64_t Tl, int64_t lse_h, int64_t lse_t, local_set *l) {
    const int64_t n = c->B * Tl * (c->Hq + 2 * c->Hkv) * c->D, nq = c->B * Tl * c->Hq * c->D;
    l->qkv = calloc((size_t)n, 4), l->dqkv = calloc((size_t)n, 4);
    l->dout = calloc((size_t)nq, 4), l->out = calloc((size_t)nq, 4);
    l->lse = calloc((size_t)(c->B * lse_h * lse_t), 4);
    qkv_views(dev, c, Tl, l->qkv, &l->q, &l->k, &l->v);
    qkv_views(dev, c, Tl, l->dqkv, &l->dq, &l->dk, &l->dv);
    l->tdout = cai_tensor_4d(dev, l->dout, CAI_DTYPE_F32, c->B, Tl, c->Hq, c->D);
    l->tout = cai_tensor_4d(dev, l->out, CAI_DTYPE_F32, c->B, Tl, c->Hq, c->D);
    l->tlse = cai_tensor_3d(dev, l->lse, CAI_DTYPE_F32, c->B, lse_h, lse_t);
}

static void local_free(local_set *l) { free(l->qkv), free(l->dqkv), free(l->dout), free(l->out), free(l->lse); }

/* A contiguous copy of a view, for comparing. */
static float *gather(cai_device_t *dev, const cai_tensor *t) {
    int64_t n = cai_tensor_numel(t);
    float *p = calloc((size_t)n, 4);
    cai_tensor d;
    CK_CAI(cai_tensor_init(&d, dev, p, CAI_DTYPE_F32, t->ndim, t->shape));
    CK_CAI(dev->ops->copy(dev, &d, t));
    return p;
}

static void expect_close(const char *what, float *got, float *want, int64_t n, const char *mode, const sp_case *c,
                         int sp) {
    double e = max_rel(got, want, n);
    if (getenv("SP_TEST_VERBOSE") && g_world_rank == 0)
        fprintf(stderr, "%s sp %d causal %d fused %d Hkv %ld %s: %.3g\n", mode, sp, c->causal, c->fused, (long)c->Hkv,
                what, e);
    ck_assert_msg(e <= 1e-5, "%s sp %d causal %d fused %d Hkv %ld: %s error %.3g", mode, sp, c->causal, c->fused,
                  (long)c->Hkv, what, e);
    free(got), free(want);
}

static cai_mesh_t *sp_mesh(int sp) {
    cai_mesh_config mc = test_mesh_config(1, g_world_size / sp, 1, sp, 1, NULL);
    cai_mesh_t *mesh = NULL;
    CK_CAI(cai_mesh_init(&mesh, MPI_COMM_WORLD, &mc));
    return mesh;
}

static void ring_case(cai_device_t *dev, const sp_case *c, int sp) {
    cai_mesh_t *mesh = sp_mesh(sp);
    const int r = cai_mesh_rank(mesh, CAI_AXIS_SP);
    const int64_t Tl = c->T / sp;
    dense ref;
    dense_run(dev, c, &ref);
    cai_tensor fq = cai_tensor_4d(dev, ref.q, CAI_DTYPE_F32, c->B, c->T, c->Hq, c->D),
               fk = cai_tensor_4d(dev, ref.k, CAI_DTYPE_F32, c->B, c->T, c->Hkv, c->D),
               fv = cai_tensor_4d(dev, ref.v, CAI_DTYPE_F32, c->B, c->T, c->Hkv, c->D),
               fdo = cai_tensor_4d(dev, ref.dout, CAI_DTYPE_F32, c->B, c->T, c->Hq, c->D);
    local_set l;
    local_init(dev, c, Tl, c->Hq, Tl, &l);
    CK_CAI(cai_zigzag_shard(dev, &l.q, &fq, sp, r));
    CK_CAI(cai_zigzag_shard(dev, &l.k, &fk, sp, r));
    CK_CAI(cai_zigzag_shard(dev, &l.v, &fv, sp, r));
    CK_CAI(cai_zigzag_shard(dev, &l.tdout, &fdo, sp, r));
    cai_sp_attn_shape s = {c->B, c->T, c->Hq, c->Hkv, c->D, sp};
    size_t wsb = 0;
    CK_CAI(cai_ring_attn_workspace_bytes(dev, &s, &wsb));
    void *ws = malloc(wsb);
    cai_sp_ctx cx = {mesh, CAI_AXIS_SP, dev, ws, wsb};
    cai_attn_params p = {.causal = c->causal};
    CK_CAI(cai_ring_attn_fwd(&cx, &l.tout, &l.tlse, &l.q, &l.k, &l.v, &p));
    CK_CAI(cai_ring_attn_bwd(&cx, &l.dq, &l.dk, &l.dv, &l.tdout, &l.q, &l.k, &l.v, &l.tout, &l.tlse, &p));
    /* The reference's shards in the same layout. */
    const int64_t nq = c->B * Tl * c->Hq * c->D, nk = c->B * Tl * c->Hkv * c->D;
    float *want[5];
    const float *full[5] = {ref.out, ref.dq, ref.dk, ref.dv};
    for (int i = 0; i < 4; i++) {
        int64_t h = i < 2 ? c->Hq : c->Hkv;
        want[i] = calloc((size_t)(i < 2 ? nq : nk), 4);
        cai_tensor f = cai_tensor_4d(dev, (void *)full[i], CAI_DTYPE_F32, c->B, c->T, h, c->D),
                   w = cai_tensor_4d(dev, want[i], CAI_DTYPE_F32, c->B, Tl, h, c->D);
        CK_CAI(cai_zigzag_shard(dev, &w, &f, sp, r));
    }
    /* lse [B,Hq,T]: the sequence is dimension 2; shard its transpose. */
    want[4] = calloc((size_t)(c->B * c->Hq * Tl), 4);
    cai_tensor lf = cai_tensor_3d(dev, ref.lse, CAI_DTYPE_F32, c->B, c->Hq, c->T), lft;
    cai_tensor lw = cai_tensor_3d(dev, want[4], CAI_DTYPE_F32, c->B, c->Hq, Tl), lwt;
    CK_CAI(cai_tensor_transpose(&lf, 1, 2, &lft));
    CK_CAI(cai_tensor_transpose(&lw, 1, 2, &lwt));
    CK_CAI(cai_zigzag_shard(dev, &lwt, &lft, sp, r));
    expect_close("out", gather(dev, &l.tout), want[0], nq, "ring", c, sp);
    expect_close("dq", gather(dev, &l.dq), want[1], nq, "ring", c, sp);
    expect_close("dk", gather(dev, &l.dk), want[2], nk, "ring", c, sp);
    expect_close("dv", gather(dev, &l.dv), want[3], nk, "ring", c, sp);
    expect_close("lse", gather(dev, &l.tlse), want[4], c->B * c->Hq * Tl, "ring", c, sp);
    local_free(&l);
    dense_free(&ref);
    free(ws);
    cai_mesh_free(mesh);
}

static void uly_case(cai_device_t *dev, const sp_case *c, int sp) {
    cai_mesh_t *mesh = sp_mesh(sp);
    const int r = cai_mesh_rank(mesh, CAI_AXIS_SP);
    const int64_t Tl = c->T / sp, Hs = c->Hq / sp;
    dense ref;
    dense_run(dev, c, &ref);
    local_set l;
    local_init(dev, c, Tl, Hs, c->T, &l);
    float *fulls[4] = {ref.q, ref.k, ref.v, ref.dout};
    cai_tensor *locs[4] = {&l.q, &l.k, &l.v, &l.tdout};
    for (int i = 0; i < 4; i++) {
        int64_t h = i == 1 || i == 2 ? c->Hkv : c->Hq;
        cai_tensor f = cai_tensor_4d(dev, fulls[i], CAI_DTYPE_F32, c->B, c->T, h, c->D), part;
        CK_CAI(cai_tensor_narrow(&f, 1, r * Tl, Tl, &part));
        CK_CAI(dev->ops->copy(dev, locs[i], &part));
    }
    cai_sp_attn_shape s = {c->B, c->T, c->Hq, c->Hkv, c->D, sp};
    size_t wsb = 0;
    CK_CAI(cai_ulysses_workspace_bytes(dev, &s, &wsb));
    void *ws = malloc(wsb);
    cai_sp_ctx cx = {mesh, CAI_AXIS_SP, dev, ws, wsb};
    cai_attn_params p = {.causal = c->causal};
    CK_CAI(cai_ulysses_attn_fwd(&cx, &l.tout, &l.tlse, &l.q, &l.k, &l.v, &p));
    CK_CAI(cai_ulysses_attn_bwd(&cx, &l.dq, &l.dk, &l.dv, &l.tdout, &l.q, &l.k, &l.v, &l.tout, &l.tlse, &p));
    float *fo[4] = {ref.out, ref.dq, ref.dk, ref.dv};
    cai_tensor *lo[4] = {&l.tout, &l.dq, &l.dk, &l.dv};
    const char *names[4] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        int64_t h = i >= 2 ? c->Hkv : c->Hq;
        cai_tensor f = cai_tensor_4d(dev, fo[i], CAI_DTYPE_F32, c->B, c->T, h, c->D), part;
        CK_CAI(cai_tensor_narrow(&f, 1, r * Tl, Tl, &part));
        expect_close(names[i], gather(dev, lo[i]), gather(dev, &part), cai_tensor_numel(&part), "ulysses", c, sp);
    }
    cai_tensor lf = cai_tensor_3d(dev, ref.lse, CAI_DTYPE_F32, c->B, c->Hq, c->T), lpart;
    CK_CAI(cai_tensor_narrow(&lf, 1, r * Hs, Hs, &lpart));
    expect_close("lse", gather(dev, &l.tlse), gather(dev, &lpart), c->B * Hs * c->T, "ulysses", c, sp);
    local_free(&l);
    dense_free(&ref);
    free(ws);
    cai_mesh_free(mesh);
}

/* The sp sizes this world runs: the whole world, and 2 inside dp when
 * there are 4 ranks. */
static int sp_sizes(int *out) {
    int n = 0;
    out[n++] = g_world_size;
    if (g_world_size == 4) out[n++] = 2;
    return n;
}

START_TEST(ring_matches_dense) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    int sps[2], n = sp_sizes(sps);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < TEST_COUNT(ring_cases); c++) ring_case(dev, &ring_cases[c], sps[i]);
    cai_device_free(dev);
}
END_TEST

START_TEST(ulysses_matches_dense) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    int sps[2], n = sp_sizes(sps);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < TEST_COUNT(uly_cases); c++) {
            const sp_case *k = &uly_cases[c];
            if (k->Hq % sps[i] || (k->Hkv % sps[i] && sps[i] % k->Hkv)) continue;
            uly_case(dev, k, sps[i]);
        }
    cai_device_free(dev);
}
END_TEST

static void expect_refused(cai_status st, const char *a, const char *b) {
    ck_assert_int_eq(st, CAI_ERR_LAYOUT);
    ck_assert_msg(strstr(cai_error_message(), a) && strstr(cai_error_message(), b), "message: %s", cai_error_message());
    cai_error_clear();
}

START_TEST(bad_shapes_refused) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    size_t bytes = 0;
    cai_sp_attn_shape s = {1, 18, 4, 2, 8, 4};
    expect_refused(cai_ring_attn_workspace_bytes(dev, &s, &bytes), "seq_len 18 is not divisible by 2*sp = 8",
                   "seq_len 16 or 24 at sp 4; sp that fits seq_len: 1, 3, 9");
    s = (cai_sp_attn_shape){1, 18, 4, 2, 8, 4};
    expect_refused(cai_ulysses_validate(&s), "seq_len 18 is not divisible by sp = 4", "16 or 20");
    s = (cai_sp_attn_shape){1, 16, 6, 2, 8, 4};
    expect_refused(cai_ulysses_workspace_bytes(dev, &s, &bytes), "6 heads are not divisible by sp = 4",
                   "sp that fits: 1, 2, 6");
    s = (cai_sp_attn_shape){1, 16, 12, 3, 8, 2};
    expect_refused(cai_ulysses_validate(&s), "3 kv heads neither split over sp = 2", "sp that fits: 1, 3, 6, 12");
    s = (cai_sp_attn_shape){1, 16, 6, 4, 8, 2};
    expect_refused(cai_ring_attn_validate(&s), "6 heads are not a multiple of 4 kv heads", "");
    /* fwd refuses before touching the workspace or the network: every rank
     * returns the same error (a local T of 3 cannot be zigzag-split). */
    cai_mesh_t *mesh = sp_mesh(g_world_size);
    float buf[3 * 2 * 4], lse[2 * 3];
    cai_tensor q = cai_tensor_4d(dev, buf, CAI_DTYPE_F32, 1, 3, 2, 4),
               l = cai_tensor_3d(dev, lse, CAI_DTYPE_F32, 1, 2, 3);
    cai_sp_ctx cx = {mesh, CAI_AXIS_SP, dev, NULL, 0};
    cai_attn_params p = {.causal = 1};
    char want[64];
    snprintf(want, sizeof want, "seq_len %d is not divisible by 2*sp = %d", 3 * g_world_size, 2 * g_world_size);
    expect_refused(cai_ring_attn_fwd(&cx, &q, &l, &q, &q, &q, &p), want, "sp that fits seq_len");
    snprintf(want, sizeof want, "2 heads are not divisible by sp = %d", g_world_size);
    if (g_world_size > 2) expect_refused(cai_ulysses_attn_fwd(&cx, &q, &l, &q, &q, &q, &p), want, "sp that fits");
    /* A workspace that is too small is an argument error naming both sizes. */
    float q8[2 * 2 * 4], l8[2 * 2];
    cai_tensor q2 = cai_tensor_4d(dev, q8, CAI_DTYPE_F32, 1, 2, 2, 4),
               l2 = cai_tensor_3d(dev, l8, CAI_DTYPE_F32, 1, 2, 2);
    char small[64];
    cai_sp_ctx cs = {mesh, CAI_AXIS_SP, dev, small, sizeof small};
    ck_assert_int_eq(cai_ring_attn_fwd(&cs, &q2, &l2, &q2, &q2, &q2, &p), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "workspace of 64 bytes is too small"));
    cai_error_clear();
    cai_mesh_free(mesh);
    cai_device_free(dev);
}
END_TEST

/* Zigzag positions: rank r's tokens are chunks r and 2sp-1-r. */
START_TEST(zigzag_layout) {
    int32_t pos[8];
    CK_CAI(cai_zigzag_positions(16, 4, 1, pos));
    const int32_t want[4] = {2, 3, 12, 13};
    for (int i = 0; i < 4; i++) ck_assert_int_eq(pos[i], want[i]);
    ck_assert_int_eq(cai_zigzag_positions(12, 4, 0, pos), CAI_ERR_LAYOUT);
    cai_error_clear();
}
END_TEST

/* ---- whole models: a tiny GPT-2 (learned positions) and a Llama with GQA
 * (RoPE) run on each rank's T/sp tokens through cai_model_set_seq_attention
 * reproduce the loss and every parameter gradient of the whole sequence on
 * one rank: the mean of the shards' mean losses, and the sum over sp of the
 * shards' gradients divided by sp (what a dp x sp gradient average gives). */
static cai_model_config sp_model_config(int llama) {
    cai_model_config c = cai_model_config_default(llama ? CAI_MODEL_LLAMA : CAI_MODEL_GPT2);
    c.vocab_size = llama ? 37 : 50;
    c.n_layers = 2;
    c.d_model = 16;
    c.n_heads = 4;
    c.n_kv_heads = llama ? 2 : 0;
    c.ffn_hidden = llama ? 24 : 0;
    c.max_seq_len = 16;
    c.seed = llama ? 11 : 7;
    return c;
}

/* Loss and the flat gradients (a copy) of one forward + backward. */
static float *model_grads(cai_model_t *m, const int32_t *tok, const int32_t *tgt, float *loss, int64_t *n) {
    CK_CAI(cai_model_zero_grad(m));
    CK_CAI(cai_model_forward_train(m, tok, tgt, 1.0f, loss));
    CK_CAI(cai_model_backward(m, 1.0f));
    cai_tensor params, grads, lowp;
    cai_model_flat(m, &params, &grads, &lowp);
    *n = cai_tensor_numel(&grads);
    float *g = malloc((size_t)*n * sizeof(float));
    memcpy(g, grads.data, (size_t)*n * sizeof(float));
    return g;
}

static void model_case(cai_device_t *dev, int llama, cai_sp_mode mode, int sp) {
    enum { B = 2, T = 16 };
    const cai_model_config cfg = sp_model_config(llama);
    int32_t tok[B * T], tgt[B * T], ltok[B * T], ltgt[B * T], pos[T];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 7 + 3) % cfg.vocab_size, tgt[i] = (i * 5 + 1) % cfg.vocab_size;
    cai_model_options o = cai_model_options_default(&cfg);
    o.batch = B;
    o.seq_len = T;
    cai_model_t *ref = NULL, *m = NULL;
    CK_CAI(cai_model_create(&ref, dev, &cfg, &o));
    float lref = 0, lsp = 0;
    int64_t n = 0, n2 = 0;
    float *gref = model_grads(ref, tok, tgt, &lref, &n);

    cai_mesh_t *mesh = sp_mesh(sp);
    const int r = cai_mesh_rank(mesh, CAI_AXIS_SP), Tl = T / sp;
    o.seq_len = Tl;
    CK_CAI(cai_model_create(&m, dev, &cfg, &o));
    const cai_model_config *rc = cai_model_config_of(m);
    cai_sp_attn_shape s = {B, T, rc->n_heads, rc->n_kv_heads, rc->d_model / rc->n_heads, sp};
    cai_sp_attention att;
    CK_CAI(cai_sp_attention_init(&att, mesh, CAI_AXIS_SP, dev, mode, &s));
    CK_CAI(cai_sp_positions(mode, T, sp, r, pos));
    CK_CAI(cai_model_set_seq_attention(m, &att.hook, pos));
    CK_CAI(cai_sp_shard_rows(mode, tok, B, T, sp, r, ltok));
    CK_CAI(cai_sp_shard_rows(mode, tgt, B, T, sp, r, ltgt));
    float *g = model_grads(m, ltok, ltgt, &lsp, &n2);
    ck_assert_int_eq(n, n2);
    double l = lsp;
    CK_CAI(cai_allreduce(mesh, CAI_AXIS_SP, &l, &l, 1, CAI_DTYPE_F64, CAI_RED_AVG));
    CK_CAI(cai_allreduce(mesh, CAI_AXIS_SP, g, g, (size_t)n, CAI_DTYPE_F32, CAI_RED_AVG));
    double el = fabs(l - lref) / fabs(lref), eg = max_rel(g, gref, n);
    if (getenv("SP_TEST_VERBOSE") && g_world_rank == 0)
        fprintf(stderr, "model %s %s sp %d: loss %.6f vs %.6f (rel %.3g), grads rel %.3g\n", llama ? "llama" : "gpt2",
                mode == CAI_SP_RING ? "ring" : "ulysses", sp, l, (double)lref, el, eg);
    ck_assert_msg(el <= 1e-5 && eg <= 1e-5, "%s %s sp %d: loss error %.3g, gradient error %.3g",
                  llama ? "llama" : "gpt2", mode == CAI_SP_RING ? "ring" : "ulysses", sp, el, eg);
    free(g), free(gref);
    cai_model_free(m);
    cai_model_free(ref);
    cai_sp_attention_free(&att);
    cai_mesh_free(mesh);
}

START_TEST(model_matches_one_rank) {
    cai_device_t *dev = NULL;
    CK_CAI(cai_device_init(&dev, CAI_DEVICE_HOST, 0, 1));
    int sps[2], n = sp_sizes(sps);
    for (int i = 0; i < n; i++)
        for (int llama = 0; llama < 2; llama++) {
            model_case(dev, llama, CAI_SP_RING, sps[i]);
            model_case(dev, llama, CAI_SP_ULYSSES, sps[i]);
        }
    cai_device_free(dev);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {ring_matches_dense, ulysses_matches_dense, bad_shapes_refused, zigzag_layout,
                            model_matches_one_rank};
    return test_mpi_main(argc, argv, "seq_parallel", tests, TEST_COUNT(tests));
}
