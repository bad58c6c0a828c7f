/* CUDA backend: attention (validation, workspace and the choice of kernels
 * here; kernels in attention_cudnn.cu, attention_flash.cu, attention_tc.cu,
 * attention.cu). q, k, v, out and the gradients may be F32, BF16 or F16
 * views with any strides on B, T and heads (e.g. into a fused QKV buffer);
 * lse is F32 [B,Hq,Tq]. The backward's only scratch is D_i = rowsum(dO * O),
 * one f32 per query row, in the caller's workspace.
 *
 * attn_route() alone decides which kernels run a call, from the CAI_CUDA_ATTN
 * knob (src/base/knobs.c), read once per process: "auto" (default) uses
 * cuDNN's fused attention where the build has it and it takes the case,
 * else the project's kernels; "cudnn" cuDNN only; "flash" the project's
 * kernels only. The project's kernels are the mma.sync flash kernels where
 * they apply (bf16 or f16 inputs, head_dim 64 or 128, 16-byte aligned rows),
 * else the WMMA kernels (bf16) or the f32 CUDA-core kernels. */
#include "cai_config.h"
#include "cuda_internal.h"

#include <math.h>
#include <string.h>

size_t cai_cuda_attention_workspace_bytes(const cai_device_t *dev, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                                          int64_t Hkv, int64_t D) {
    (void)dev;
    (void)Tk;
    (void)Hkv;
    (void)D;
    return (size_t)(B > 0 ? B : 0) * (size_t)(Hq > 0 ? Hq : 0) * (size_t)(Tq > 0 ? Tq : 0) * sizeof(float) + 256;
}

/* The settings, read from the knobs once: the path (a CAI_CUDA_ATTN
 * choice or a test-only path of cai_cuda_attn_force) and whether cuDNN's
 * backward is deterministic (CAI_CUDNN_DETERMINISTIC); -1 until read. */
static int g_attn_mode = -1, g_attn_det = -1;

void cai_cuda_attn_force(cai_cuda_attn_path path) { __atomic_store_n(&g_attn_mode, (int)path, __ATOMIC_RELAXED); }

static cai_status attn_settings(int *mode, int *det) {
    int d = __atomic_load_n(&g_attn_det, __ATOMIC_RELAXED);
    if (d < 0) {
        long long v = 1;
        CAI_CALL(cai_knob_int("CAI_CUDNN_DETERMINISTIC", &v));
        d = v != 0;
        __atomic_store_n(&g_attn_det, d, __ATOMIC_RELAXED);
    }
    *det = d;
    int m = __atomic_load_n(&g_attn_mode, __ATOMIC_RELAXED);
    if (m < 0) {
        const char *v = NULL;
        CAI_CALL(cai_knob_str("CAI_CUDA_ATTN", &v));
        m = strcmp(v, "cudnn") == 0   ? CAI_CUDA_ATTN_CUDNN
            : strcmp(v, "flash") == 0 ? CAI_CUDA_ATTN_FLASH
                                      : CAI_CUDA_ATTN_AUTO;
        int unset = -1; /* a forced path set meanwhile wins */
        if (!__atomic_compare_exchange_n(&g_attn_mode, &unset, m, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) m = unset;
    }
    *mode = m;
    return CAI_OK;
}

typedef struct {
    cai_bthd q, k, v, o;
    float *lse;
    cuk_attn p;
    int mode; /* cai_cuda_attn_path */
} attn_args;

typedef enum { ROUTE_CUDNN, ROUTE_FLASH, ROUTE_OTHER } attn_route_t;

/* The kernels for this call: cuDNN when the setting allows it, the build
 * has it, cuDNN has not declined the case at run time (cudnn_declined) and
 * the case is one it takes; then the flash kernels where the setting allows
 * them and they apply; else attention.cu, which runs the WMMA kernels for
 * bf16 when p.tc and the CUDA-core ones otherwise. The gradients (g, dq,
 * dk, dv) are NULL for a forward. */
static attn_route_t attn_route(const attn_args *a, const cuk_bthd *q, const cuk_bthd *k, const cuk_bthd *v,
                               const cuk_bthd *o, const cuk_bthd *g, const cuk_bthd *dq, const cuk_bthd *dk,
                               const cuk_bthd *dv, int cudnn_declined) {
    const int m = a->mode;
    if ((m == CAI_CUDA_ATTN_AUTO || m == CAI_CUDA_ATTN_CUDNN) && !cudnn_declined && cuk_attn_cudnn_built() &&
        (!g || (dq->p && dk->p && dv->p)) && cuk_attn_cudnn_ok(q, k, v, o, g, dq, dk, dv, &a->p))
        return ROUTE_CUDNN;
    if ((m == CAI_CUDA_ATTN_AUTO || m == CAI_CUDA_ATTN_CUDNN || m == CAI_CUDA_ATTN_FLASH) &&
        cuk_attn_flash_ok(q, k, v, g))
        return ROUTE_FLASH;
    return ROUTE_OTHER;
}

static cai_status attn_check(const char *op, attn_args *a, const cai_tensor *out, const cai_tensor *lse,
                             const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
                             const cai_attn_params *params) {
    memset(a, 0, sizeof *a);
    CAI_CALL(cai_ops_bthd(op, "q", q, CAI_CUDA, CAI_ANYF, &a->q));
    CAI_CALL(cai_ops_bthd(op, "k", k, CAI_CUDA, CAI_ANYF, &a->k));
    CAI_CALL(cai_ops_bthd(op, "v", v, CAI_CUDA, CAI_ANYF, &a->v));
    CAI_CALL(cai_ops_bthd(op, "out", out, CAI_CUDA, CAI_ANYF, &a->o));
    CAI_CHECK_ARG(params, "%s: NULL params", op);
    if (!cai_tensor_same_shape(k, v))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: k is %s but v is %s; they must match", op, CAI_OPS_DESCRIBE(k),
                         CAI_OPS_DESCRIBE(v));
    if (!cai_tensor_same_shape(q, out))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: out is %s but q is %s; they must match", op, CAI_OPS_DESCRIBE(out),
                         CAI_OPS_DESCRIBE(q));
    if (a->k.B != a->q.B || a->k.D != a->q.D)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: q is %s and k %s: batch and head_dim must match", op,
                         CAI_OPS_DESCRIBE(q), CAI_OPS_DESCRIBE(k));
    if (a->k.H <= 0 || a->q.H % a->k.H != 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: %" PRId64 " query heads do not divide into groups over %" PRId64 " kv heads", op, a->q.H,
                         a->k.H);
    if (a->q.D > CUK_ATTN_MAX_D)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: head_dim %" PRId64 " exceeds the CUDA kernels' maximum of %d", op,
                         a->q.D, CUK_ATTN_MAX_D);
    if (lse) {
        char *p;
        CAI_CALL(cai_ops_vec(op, "lse", lse, CAI_CUDA, CAI_F32, a->q.B * a->q.H * a->q.T, &p));
        a->lse = (float *)p;
    }
    CAI_CHECK_ARG(params->window >= 0, "%s: window %" PRId64 " must be >= 0", op, params->window);
    if (params->doc_ids)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: document masking (doc_ids, packed sequences) is not implemented in the CUDA kernels; "
                         "run packed batches on the CPU backend or unpacked (padded) on CUDA",
                         op);
    a->p.scale = params->scale != 0.0f ? params->scale : 1.0f / sqrtf((float)(a->q.D > 0 ? a->q.D : 1));
    a->p.causal = params->causal;
    a->p.off = params->causal_offset;
    a->p.window = params->window;
    CAI_CALL(attn_settings(&a->mode, &a->p.deterministic));
    a->p.tc = a->mode != CAI_CUDA_ATTN_SIMT;
    return CAI_OK;
}

/* What a cuDNN launch's return code means for the caller: 0 done, 2 cuDNN
 * declined the case — the project's kernels run it, said once per process,
 * unless CAI_CUDA_ATTN=cudnn asked for cuDNN only — anything else an error. */
static cai_status cudnn_outcome(const char *op, const attn_args *a, int rc, const char *err) {
    static int said;
    if (rc == 0) return CAI_OK;
    if (rc == 2 && a->mode != CAI_CUDA_ATTN_CUDNN) {
        if (!said) {
            said = 1;
            CAI_WARN("%s: %s; the project's attention kernels run the cases cuDNN declines", op, err);
        }
        return CAI_OK;
    }
    return CAI_ERROR(CAI_ERR_CUDA, "%s: %s (CAI_CUDA_ATTN=flash uses the project's kernels)", op, err);
}

cai_status cai_cuda_attention_fwd(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *q,
                                  const cai_tensor *k, const cai_tensor *v, const cai_attn_params *params,
                                  void *workspace, size_t workspace_bytes) {
    static const char *op = "attention_fwd";
    (void)workspace;
    (void)workspace_bytes; /* the forward needs none */
    attn_args a;
    CAI_CALL(attn_check(op, &a, out, lse, q, k, v, params));
    CAI_CALL(cai_cuda_enter(dev, op));
    cuk_bthd kq = cai_cuda_bthd(&a.q), kk = cai_cuda_bthd(&a.k), kv = cai_cuda_bthd(&a.v), ko = cai_cuda_bthd(&a.o);
    attn_route_t r = attn_route(&a, &kq, &kk, &kv, &ko, NULL, NULL, NULL, NULL, 0);
    if (r == ROUTE_CUDNN) {
        char err[512];
        int rc = cuk_attn_cudnn_fwd(cai_cuda_of(dev)->stream, ko, a.lse, kq, kk, kv, a.p, err, sizeof err);
        CAI_CALL(cudnn_outcome(op, &a, rc, err));
        if (rc == 0) return CAI_OK;
        r = attn_route(&a, &kq, &kk, &kv, &ko, NULL, NULL, NULL, NULL, 1);
    }
    if (r == ROUTE_FLASH) CUK_LAUNCH(op, cuk_attn_flash_fwd(cai_cuda_of(dev)->stream, ko, a.lse, kq, kk, kv, a.p));
    else CUK_LAUNCH(op, cuk_attn_fwd(cai_cuda_of(dev)->stream, ko, a.lse, kq, kk, kv, a.p));
    return CAI_OK;
}

static cai_status grad_view(const char *op, const char *arg, const cai_tensor *g, const char *ref_arg,
                            const cai_tensor *ref, cai_bthd *out) {
    memset(out, 0, sizeof *out);
    if (!g) return CAI_OK;
    CAI_CALL(cai_ops_bthd(op, arg, g, CAI_CUDA, CAI_ANYF, out));
    if (!cai_tensor_same_shape(g, ref))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s but %s is %s", op, arg, CAI_OPS_DESCRIBE(g), ref_arg,
                         CAI_OPS_DESCRIBE(ref));
    return CAI_OK;
}

cai_status cai_cuda_attention_bwd(cai_device_t *dev, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv,
                                  const cai_tensor *dout, const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
                                  const cai_tensor *out, const cai_tensor *lse, const cai_attn_params *params,
                                  void *workspace, size_t workspace_bytes) {
    static const char *op = "attention_bwd";
    attn_args a;
    CAI_CALL(attn_check(op, &a, out, lse, q, k, v, params));
    CAI_CHECK_ARG(a.lse, "%s: lse from the forward pass is required", op);
    cai_bthd gdo, gdq, gdk, gdv;
    CAI_CALL(cai_ops_bthd(op, "dout", dout, CAI_CUDA, CAI_ANYF, &gdo));
    if (!cai_tensor_same_shape(dout, q))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dout is %s but q is %s", op, CAI_OPS_DESCRIBE(dout),
                         CAI_OPS_DESCRIBE(q));
    CAI_CALL(grad_view(op, "dq", dq, "q", q, &gdq));
    CAI_CALL(grad_view(op, "dk", dk, "k", k, &gdk));
    CAI_CALL(grad_view(op, "dv", dv, "v", v, &gdv));
    size_t need = cai_cuda_attention_workspace_bytes(dev, a.q.B, a.q.T, a.k.T, a.q.H, a.k.H, a.q.D);
    if (workspace_bytes < need || !workspace)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: workspace of %zu bytes is too small, %zu needed (ask "
                         "attention_workspace_bytes for these sizes and this device)",
                         op, workspace_bytes, need);
    float *dvec = (float *)(((uintptr_t)workspace + 255) & ~(uintptr_t)255);
    CAI_CALL(cai_cuda_enter(dev, op));
    cuk_bthd kq = cai_cuda_bthd(&a.q), kk = cai_cuda_bthd(&a.k), kv = cai_cuda_bthd(&a.v), kg = cai_cuda_bthd(&gdo);
    cuk_bthd ko = cai_cuda_bthd(&a.o), kdq = cai_cuda_bthd(&gdq), kdk = cai_cuda_bthd(&gdk), kdv = cai_cuda_bthd(&gdv);
    attn_route_t r = attn_route(&a, &kq, &kk, &kv, &ko, &kg, &kdq, &kdk, &kdv, 0);
    if (r == ROUTE_CUDNN) {
        char err[512];
        int rc = cuk_attn_cudnn_bwd(cai_cuda_of(dev)->stream, kdq, kdk, kdv, kg, kq, kk, kv, ko, a.lse, a.p, err,
                                    sizeof err);
        CAI_CALL(cudnn_outcome(op, &a, rc, err));
        if (rc == 0) return CAI_OK;
        r = attn_route(&a, &kq, &kk, &kv, &ko, &kg, &kdq, &kdk, &kdv, 1);
    }
    if (r == ROUTE_FLASH)
        CUK_LAUNCH(op,
                   cuk_attn_flash_bwd(cai_cuda_of(dev)->stream, kdq, kdk, kdv, kg, kq, kk, kv, ko, a.lse, dvec, a.p));
    else CUK_LAUNCH(op, cuk_attn_bwd(cai_cuda_of(dev)->stream, kdq, kdk, kdv, kg, kq, kk, kv, ko, a.lse, dvec, a.p));
    return CAI_OK;
}

cai_status cai_cuda_attention_merge(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *blk_out,
                                    const cai_tensor *blk_lse) {
    static const char *op = "attention_merge";
    cai_bthd o, bo;
    int64_t ls[2], bs[2];
    CAI_CALL(cai_ops_merge_args(op, out, lse, blk_out, blk_lse, CAI_CUDA, CAI_ANYF, &o, &bo, ls, bs));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_attn_merge(cai_cuda_of(dev)->stream, cai_cuda_bthd(&o), lse->data, ls[0], ls[1],
                                  cai_cuda_bthd(&bo), blk_lse->data, bs[0], bs[1]));
    return CAI_OK;
}
