/* CUDA backend: attention (validation, workspace and the choice of kernels
 * here; kernels in attention_flash.cu, attention_tc.cu, attention.cu). q, k,
 * v, out and the gradients may be F32, BF16 or F16 views with any strides on
 * B, T and heads (e.g. into a fused QKV buffer); lse is F32 [B,Hq,Tq]. The
 * backward's only scratch is D_i = rowsum(dO * O), one f32 per query row, in
 * the caller's workspace.
 *
 * CAI_CUDA_ATTN (read per call, so one process can compare the paths):
 * "auto" (default) uses cuDNN's fused attention (attention_cudnn.cu) where
 * the build has it and it takes the case, else as "flash"; "cudnn" the
 * same; "flash" the mma.sync kernels where they apply (bf16 or f16 inputs,
 * head_dim 64 or 128, 16-byte aligned rows) and the WMMA ones otherwise;
 * "tc" the WMMA kernels for bf16 inputs; "simt" the f32 CUDA-core kernels
 * for everything. */
#include "cai_config.h"
#include "cuda_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t cai_cuda_attention_workspace_bytes(const cai_device_t *dev, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                                          int64_t Hkv, int64_t D) {
    (void)dev;
    (void)Tk;
    (void)Hkv;
    (void)D;
    return (size_t)(B > 0 ? B : 0) * (size_t)(Hq > 0 ? Hq : 0) * (size_t)(Tq > 0 ? Tq : 0) * sizeof(float) + 256;
}

typedef struct {
    cai_bthd q, k, v, o;
    float *lse;
    cuk_attn p;
    int flash; /* CAI_CUDA_ATTN allows attention_flash.cu */
    int cudnn; /* ... and attention_cudnn.cu */
    int cudnn_forced; /* CAI_CUDA_ATTN=cudnn: a case cuDNN declines is an error */
} attn_args;

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
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %" PRId64 " query heads do not divide into groups over %" PRId64
                         " kv heads", op, a->q.H, a->k.H);
    if (a->q.D > CUK_ATTN_MAX_D)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: head_dim %" PRId64 " exceeds the CUDA kernels' maximum of %d", op,
                         a->q.D, CUK_ATTN_MAX_D);
    if (lse) {
        char *p;
        CAI_CALL(cai_ops_vec(op, "lse", lse, CAI_CUDA, CAI_F32, a->q.B * a->q.H * a->q.T, &p));
        a->lse = (float *)p;
    }
    CAI_CHECK_ARG(params->window >= 0, "%s: window %" PRId64 " must be >= 0", op, params->window);
    a->p.scale = params->scale != 0.0f ? params->scale : 1.0f / sqrtf((float)(a->q.D > 0 ? a->q.D : 1));
    a->p.causal = params->causal;
    a->p.off = params->causal_offset;
    a->p.window = params->window;
    /* read per call so a process can compare both paths (tests, benchmarks) */
    const char *mode = getenv("CAI_CUDA_ATTN");
    a->p.tc = !(mode && strcmp(mode, "simt") == 0);
    const int automatic = !mode || !mode[0] || strcmp(mode, "auto") == 0;
    a->cudnn_forced = !automatic && strcmp(mode, "cudnn") == 0;
    a->cudnn = (automatic || a->cudnn_forced) && cuk_attn_cudnn_built();
    a->flash = automatic || a->cudnn_forced || strcmp(mode, "flash") == 0;
    return CAI_OK;
}

/* What a cuDNN launch's return code means for the caller: 0 done, 2 cuDNN
 * declined the case — our kernels run it, said once per process, unless
 * CAI_CUDA_ATTN=cudnn asked for cuDNN only — anything else an error. */
static cai_status cudnn_outcome(const char *op, const attn_args *a, int rc, const char *err) {
    static int said;
    if (rc == 0) return CAI_OK;
    if (rc == 2 && !a->cudnn_forced) {
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
    int rc = 2;
    if (a.cudnn && cuk_attn_cudnn_ok(&kq, &kk, &kv, &ko, NULL, NULL, NULL, NULL, &a.p)) {
        char err[512];
        rc = cuk_attn_cudnn_fwd(cai_cuda_of(dev)->stream, ko, a.lse, kq, kk, kv, a.p, err, sizeof err);
        CAI_CALL(cudnn_outcome(op, &a, rc, err));
    }
    if (rc == 0) return CAI_OK;
    if (a.flash && cuk_attn_flash_ok(&kq, &kk, &kv, NULL))
        CUK_LAUNCH(op, cuk_attn_flash_fwd(cai_cuda_of(dev)->stream, ko, a.lse, kq, kk, kv, a.p));
    else
        CUK_LAUNCH(op, cuk_attn_fwd(cai_cuda_of(dev)->stream, ko, a.lse, kq, kk, kv, a.p));
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
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: workspace of %zu bytes is too small, %zu needed (ask "
                         "attention_workspace_bytes for these sizes and this device)", op, workspace_bytes, need);
    float *dvec = (float *)(((uintptr_t)workspace + 255) & ~(uintptr_t)255);
    CAI_CALL(cai_cuda_enter(dev, op));
    cuk_bthd kq = cai_cuda_bthd(&a.q), kk = cai_cuda_bthd(&a.k), kv = cai_cuda_bthd(&a.v), kg = cai_cuda_bthd(&gdo);
    cuk_bthd ko = cai_cuda_bthd(&a.o), kdq = cai_cuda_bthd(&gdq), kdk = cai_cuda_bthd(&gdk), kdv = cai_cuda_bthd(&gdv);
    int rc = 2;
    if (a.cudnn && dq && dk && dv && cuk_attn_cudnn_ok(&kq, &kk, &kv, &ko, &kg, &kdq, &kdk, &kdv, &a.p)) {
        char err[512];
        rc = cuk_attn_cudnn_bwd(cai_cuda_of(dev)->stream, kdq, kdk, kdv, kg, kq, kk, kv, ko, a.lse, a.p, err,
                                sizeof err);
        CAI_CALL(cudnn_outcome(op, &a, rc, err));
    }
    if (rc == 0) return CAI_OK;
    if (a.flash && cuk_attn_flash_ok(&kq, &kk, &kv, &kg))
        CUK_LAUNCH(op, cuk_attn_flash_bwd(cai_cuda_of(dev)->stream, cai_cuda_bthd(&gdq), cai_cuda_bthd(&gdk),
                                          cai_cuda_bthd(&gdv), kg, kq, kk, kv, cai_cuda_bthd(&a.o), a.lse, dvec, a.p));
    else
        CUK_LAUNCH(op, cuk_attn_bwd(cai_cuda_of(dev)->stream, cai_cuda_bthd(&gdq), cai_cuda_bthd(&gdk),
                                    cai_cuda_bthd(&gdv), kg, kq, kk, kv, cai_cuda_bthd(&a.o), a.lse, dvec, a.p));
    return CAI_OK;
}
