/* The MoE sublayer on another device or dtype against the host in f32
 * (docs/moe.md).
 *
 * The same layer (tests/unit/moe_fixture.h: registry-initialised weights,
 * normal inputs and output gradient) runs forward and backward on the host
 * in f32 (the reference) and again with its weights, inputs and buffers on
 * a target: the host in f32 (bitwise the reference, through the test's own
 * weight and buffer copies) and cuda:0 in f32 and bf16 when a GPU is
 * visible (device buffers apart from the routing state, dtype
 * conversions, copies). The output,
 * input gradient, parameter gradients, routing and losses are compared:
 *   - f32 (cuBLAS without TF32): the same routing for every token and
 *     every tensor within 2e-5 relative (largest difference over the
 *     largest magnitude), the losses within 1e-6;
 *   - bf16 weights and activations: the routing of at least 95% of the
 *     tokens equal (a near tie between two experts may flip under bf16
 *     rounding, which moves that token's output, not a bug), and the
 *     tensors within the relative L2 error bf16 rounding leaves (3e-2; 8e-2
 *     for parameter gradients, which sum over every token); with capacity
 *     routing a flip also changes which later tokens are dropped: 90% of
 *     the routing, 1e-1 and 1.5e-1.
 * Cases: dropless top-2 of 8, Mixtral's softmax router; shared experts with
 * capacity routing that drops; top-k-then-softmax with k = 4.
 *
 * Exits 0 when every case holds, 1 otherwise (without a GPU only the host
 * targets run). */
#include "cai_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colossal/base.h"
#include "colossal/moe.h"
#include "colossal/tensor.h"

#define CK_CAI(x)                                                                            \
    do {                                                                                     \
        cai_status st_ = (x);                                                                \
        if (st_ != CAI_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cai_error_message()); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#include "moe_fixture.h"

typedef struct {
    const char *name;
    int E, k, shared;
    cai_moe_router router;
    cai_moe_routing routing;
    int64_t N, C, F;
} moe_case;

static size_t esize(cai_dtype dt) { return dt == CAI_DTYPE_F32 ? 4 : 2; }

/* Host f32 values -> device buffer of dtype dt. */
static void *upload(cai_device_t *dev, const float *h, size_t n, cai_dtype dt) {
    void *d = NULL, *tmp = malloc(n * esize(dt) + 4);
    CK_CAI(cai_device_alloc(dev, n * esize(dt) + 64, "test", &d));
    if (dt == CAI_DTYPE_F32) memcpy(tmp, h, n * 4);
    else
        for (size_t i = 0; i < n; i++) ((cai_bf16 *)tmp)[i] = cai_f32_to_bf16(h[i]);
    CK_CAI(cai_device_copy(dev, d, tmp, n * esize(dt), CAI_COPY_H2D));
    free(tmp);
    return d;
}

static void download(cai_device_t *dev, float *h, const void *d, size_t n, cai_dtype dt) {
    void *tmp = malloc(n * esize(dt) + 4);
    CK_CAI(cai_device_copy(dev, tmp, d, n * esize(dt), CAI_COPY_D2H));
    if (dt == CAI_DTYPE_F32) memcpy(h, tmp, n * 4);
    else
        for (size_t i = 0; i < n; i++) h[i] = cai_bf16_to_f32(((cai_bf16 *)tmp)[i]);
    free(tmp);
}

/* The device tensor at the same flat offset as host view t (of base). */
static cai_tensor twin(cai_device_t *dev, const cai_tensor *t, const float *base, void *dbase, cai_dtype dt) {
    if (!t->data) return *t;
    const size_t off = (size_t)((const float *)t->data - base);
    return cai_tensor_2d(dev, (char *)dbase + off * esize(dt), dt, t->shape[0], t->shape[1]);
}

static void twin_params(cai_device_t *dev, const moe_fix *h, const cai_moe_params *hp, const float *base, void *dbase,
                        cai_dtype dt, cai_moe_params *out, cai_moe_mlp *experts) {
    out->router = twin(dev, &hp->router, base, dbase, dt);
    out->experts = experts;
    for (int i = 0; i < h->cx.n_local; i++) {
        experts[i].w1 = twin(dev, &hp->experts[i].w1, base, dbase, dt);
        experts[i].w3 = twin(dev, &hp->experts[i].w3, base, dbase, dt);
        experts[i].w2 = twin(dev, &hp->experts[i].w2, base, dbase, dt);
    }
    out->shared.w1 = twin(dev, &hp->shared.w1, base, dbase, dt);
    out->shared.w3 = twin(dev, &hp->shared.w3, base, dbase, dt);
    out->shared.w2 = twin(dev, &hp->shared.w2, base, dbase, dt);
}

/* max |a - b| / max |b| and ||a - b|| / ||b||. */
static void errs(const float *a, const float *b, size_t n, double *maxrel, double *l2rel) {
    double md = 0, mb = 0, sd = 0, sb = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        md = fmax(md, fabs(d));
        mb = fmax(mb, fabs((double)b[i]));
        sd += d * d;
        sb += (double)b[i] * b[i];
    }
    *maxrel = mb > 0 ? md / mb : md;
    *l2rel = sb > 0 ? sqrt(sd / sb) : sqrt(sd);
}

/* The case on target `gpu` (any device) in dtype dt against the host in f32. */
static int run_case(cai_device_t *host, cai_device_t *gpu, const moe_case *mc, cai_dtype dt) {
    cai_moe_config cfg = cai_moe_config_default();
    cfg.n_experts = mc->E;
    cfg.top_k = mc->k;
    cfg.ffn = mc->F;
    cfg.n_shared = mc->shared;
    cfg.router = mc->router;
    cfg.routing = mc->routing;
    cfg.capacity_factor = 1.0f;
    const int64_t N = mc->N, C = mc->C;
    moe_fix h;
    double obj = 0;
    CK_CAI(moe_fix_init(&h, host, &cfg, N, C, NULL, 11, 0.3f, 5));
    moe_fix_cotangent(&h, 11, 6);
    CK_CAI(moe_fix_grads(&h, &obj));

    cai_moe_ctx cx;
    CK_CAI(cai_moe_ctx_init(&cx, gpu, &cfg, N, C, dt, NULL));
    void *dparams = upload(gpu, h.params, h.n_flat, dt);
    float *zeros = calloc(h.n_flat + 1, sizeof(float));
    void *dgrads = upload(gpu, zeros, h.n_flat, CAI_DTYPE_F32);
    cai_moe_mlp *pe = calloc((size_t)h.cx.n_local, sizeof *pe), *ge = calloc((size_t)h.cx.n_local, sizeof *ge);
    cai_moe_params p, g;
    twin_params(gpu, &h, &h.p, h.params, dparams, dt, &p, pe);
    twin_params(gpu, &h, &h.g, h.grads, dgrads, CAI_DTYPE_F32, &g, ge);
    cai_arena_t arena;
    cai_moe_acts a;
    CK_CAI(cai_device_arena_init(gpu, &arena, cai_moe_acts_bytes(&cx) + 4096, "moe acts"));
    CK_CAI(cai_moe_acts_carve(&cx, &arena, &a));
    const size_t nc = (size_t)(N * C);
    void *dx_in = upload(gpu, h.x.data, nc, dt), *ddy = upload(gpu, h.dy.data, nc, dt);
    void *dy_out = upload(gpu, h.y.data, nc, dt), *ddx = upload(gpu, h.y.data, nc, dt); /* overwritten */
    cai_tensor x = cai_tensor_2d(gpu, dx_in, dt, N, C), y = cai_tensor_2d(gpu, dy_out, dt, N, C);
    cai_tensor dyt = cai_tensor_2d(gpu, ddy, dt, N, C), dxt = cai_tensor_2d(gpu, ddx, dt, N, C);
    CK_CAI(cai_moe_fwd(&cx, &p, &a, &x, &y));
    CK_CAI(cai_moe_bwd(&cx, &p, &g, &a, &x, &dyt, &dxt, 1.0f));

    float *gy = malloc(nc * sizeof(float)), *gdx = malloc(nc * sizeof(float));
    float *gg = malloc(h.n_flat * sizeof(float));
    download(gpu, gy, dy_out, nc, dt);
    download(gpu, gdx, ddx, nc, dt);
    download(gpu, gg, dgrads, h.n_flat, CAI_DTYPE_F32);
    int64_t same = 0;
    const int32_t *hs = h.acts.sel.data;
    int32_t *gs = malloc((size_t)(N * mc->k) * sizeof *gs);
    CK_CAI(cai_device_copy(gpu, gs, a.sel.data, (size_t)(N * mc->k) * sizeof *gs, CAI_COPY_D2H));
    for (int64_t t = 0; t < N; t++) same += !memcmp(hs + t * mc->k, gs + t * mc->k, (size_t)mc->k * sizeof *hs);
    free(gs);
    double ym, yl, xm, xl, gm, gl;
    errs(gy, h.y.data, nc, &ym, &yl);
    errs(gdx, h.dx.data, nc, &xm, &xl);
    errs(gg, h.grads, h.n_flat, &gm, &gl);
    const double aux_d = fabs(a.aux_raw - h.acts.aux_raw),
                 z_d = fabs(a.z_raw - h.acts.z_raw) / fmax(1e-12, h.acts.z_raw);
    int ok;
    if (dt == CAI_DTYPE_F32)
        ok = same == N && a.dropped == h.acts.dropped && ym <= 2e-5 && xm <= 2e-5 && gm <= 2e-5 && aux_d <= 1e-6 &&
             z_d <= 1e-6;
    else if (mc->routing == CAI_MOE_DROPLESS)
        ok = same >= (int64_t)(0.95 * N) && yl <= 3e-2 && xl <= 3e-2 && gl <= 8e-2 && aux_d <= 5e-2 && z_d <= 2e-2;
    else /* a flipped choice also moves which later tokens an expert's capacity drops */
        ok = same >= (int64_t)(0.9 * N) && yl <= 1e-1 && xl <= 1e-1 && gl <= 1.5e-1 && aux_d <= 5e-2 && z_d <= 2e-2;
    printf(
        "%-4s %-30s %s: routing %lld/%lld equal, dropped %lld/%lld, y max %.2e l2 %.2e, dx max %.2e l2 %.2e, grads max "
        "%.2e l2 %.2e, aux |d| %.1e, z rel %.1e: %s\n",
        gpu->kind == CAI_DEVICE_HOST ? "host" : "cuda", mc->name, cai_dtype_name(dt), (long long)same, (long long)N,
        (long long)a.dropped, (long long)h.acts.dropped, ym, yl, xm, xl, gm, gl, aux_d, z_d, ok ? "ok" : "FAIL");
    free(gy);
    free(gdx);
    free(gg);
    free(zeros);
    free(pe);
    free(ge);
    cai_moe_acts_free(&a);
    cai_device_arena_free(gpu, &arena);
    cai_device_dealloc(gpu, dparams);
    cai_device_dealloc(gpu, dgrads);
    cai_device_dealloc(gpu, dx_in);
    cai_device_dealloc(gpu, ddy);
    cai_device_dealloc(gpu, dy_out);
    cai_device_dealloc(gpu, ddx);
    moe_fix_free(&h);
    return ok;
}

int main(void) {
    cai_device_t *host = NULL, *gpu = NULL;
    CK_CAI(cai_device_init(&host, CAI_DEVICE_HOST, 0, 1));
    if (cai_device_init(&gpu, CAI_DEVICE_CUDA, 0, 1) != CAI_OK) {
        printf("no GPU (%s): the host targets only\n", cai_error_message());
        cai_error_clear();
        gpu = NULL;
    }
    const moe_case cases[] = {
        {"dropless top-2 of 8, softmax", 8, 2, 0, CAI_MOE_ROUTER_SOFTMAX, CAI_MOE_DROPLESS, 200, 64, 96},
        {"shared, capacity 1.0, softmax", 8, 2, 1, CAI_MOE_ROUTER_SOFTMAX, CAI_MOE_CAPACITY, 160, 96, 64},
        {"top-4 of 8, topk_softmax", 8, 4, 0, CAI_MOE_ROUTER_TOPK_SOFTMAX, CAI_MOE_DROPLESS, 96, 128, 32},
    };
    int bad = 0;
    cai_device_t *targets[2] = {host, gpu};
    for (int t = 0; t < 2 && targets[t]; t++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            bad += !run_case(host, targets[t], &cases[i], CAI_DTYPE_F32);
            /* the CPU backend's products compute in f32 */
            if (targets[t] != host) bad += !run_case(host, targets[t], &cases[i], CAI_DTYPE_BF16);
        }
    if (gpu) cai_device_free(gpu);
    cai_device_free(host);
    printf("%s\n", bad ? "FAIL" : "all cases ok");
    return bad ? 1 : 0;
}
