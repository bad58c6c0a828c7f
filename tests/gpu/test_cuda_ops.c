/* GPU parity tests: every op of the CUDA table against the CPU backend on
 * random inputs of odd sizes, with poisoned (NaN) outputs, strided views
 * (fused QKV, narrowed columns), GQA, causal offsets and windows, vocab
 * shards and padding, in f32 (1e-5 relative, TF32 off) and bf16 (1e-2 for
 * bf16 outputs: one rounding of a value is up to 2^-9). Also determinism
 * (bitwise repeatability) and the device-side argument errors.
 *
 * Exits 77 (skipped) when no GPU is visible, so CPU-only CI passes. Run on
 * the GPU machine: tests/gpu/test_cuda_ops [-v]. */
#include "cai_config.h"

#include "gpu_test_util.h"
#include "cuda_backend.h" /* cai_cuda_attn_force */

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>

/* ------------------------------------------------------------------ helpers */

static void run_both_ok(const char *what, cai_status sh, cai_status sg) {
    if (sh != CAI_OK || sg != CAI_OK) {
        printf("  %s: host %s, gpu %s: %s\n", what, cai_status_str(sh), cai_status_str(sg), cai_error_message());
        cai_error_clear();
        g_fail++;
    }
}

/* Call an op on both backends: OP(dev, X) where X(t) picks t.h or t.g. */
#define BOTH(what, call_h, call_g) run_both_ok(what, (call_h), (call_g))

static const char *dtn(cai_dtype dt) { return cai_dtype_name(dt); }

static char g_name[128];
static const char *nm(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *nm(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_name, sizeof g_name, fmt, ap);
    va_end(ap);
    return g_name;
}

/* ------------------------------------------------------------------ fill, copy, conversions */

static void t_fill_copy(void) {
    gt_t a = O2(CAI_DTYPE_BF16, 7, 33), b = O2(CAI_DTYPE_F32, 7, 33);
    BOTH("fill", H->ops->fill(H, &a.h, 1.375f), G->ops->fill(G, &a.g, 1.375f));
    gt_check("fill bf16", a, 0.0);
    gt_t bn = gt_narrow(b, 1, 5, 20);
    BOTH("fill", H->ops->fill(H, &bn.h, -3.25f), G->ops->fill(G, &bn.g, -3.25f));
    BOTH("fill", H->ops->fill(H, &b.h, 0.0f), G->ops->fill(G, &b.g, 0.0f));
    gt_check("fill f32 (zero)", b, 0.0);
    int32_t iv[12] = {0};
    gt_t ti = gt_ints(1, SHP(12), iv);
    BOTH("fill", H->ops->fill(H, &ti.h, 7.0f), G->ops->fill(G, &ti.g, 7.0f));
    float *got = gt_download(ti.b);
    int ok = 1;
    for (int i = 0; i < 12; i++) ok &= ((int32_t *)got)[i] == 7;
    free(got);
    gt_expect("fill i32", ok, NULL);

    /* copies between every dtype pair; values spanning bf16/f16 ranges */
    const cai_dtype dts[3] = {CAI_DTYPE_F32, CAI_DTYPE_BF16, CAI_DTYPE_F16};
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++) {
            gt_t src = R2(dts[s], 9, 70, 3.0), dst = O2(dts[d], 9, 70);
            BOTH("copy", H->ops->copy(H, &dst.h, &src.h), G->ops->copy(G, &dst.g, &src.g));
            /* the host reference of a low-precision destination is the RNE of its f32 value */
            gt_round_host(&dst);
            gt_check(nm("copy %s -> %s", dtn(dts[s]), dtn(dts[d])), dst, 0.0);
        }
    /* strided: transpose into a narrowed destination (general strided kernel) */
    gt_t src = R3(CAI_DTYPE_F32, 4, 6, 10, 1.0), big = O3(CAI_DTYPE_BF16, 4, 10, 9);
    gt_t dst = gt_narrow(big, 2, 2, 6), st = gt_transpose(src, 1, 2);
    BOTH("copy", H->ops->copy(H, &dst.h, &st.h), G->ops->copy(G, &dst.g, &st.g));
    gt_round_host(&big);
    gt_check("copy transposed f32 -> bf16 view", dst, 0.0);
}

static void t_copy_sr(void) {
    const cai_dtype dts[2] = {CAI_DTYPE_BF16, CAI_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        gt_t src = R2(CAI_DTYPE_F32, 11, 57, 2.0), big = O2(dts[k], 11, 64);
        gt_t dst = gt_narrow(big, 1, 3, 57);
        GT_OK(G->ops->copy_sr(G, &dst.g, &src.g, 77, 5, 1000));
        /* reference: the host converter, row by row with the global index */
        uint16_t *want = malloc(11 * 57 * 2);
        GT_OK(cai_convert_host_sr(want, dts[k], src.b->hbuf, 11 * 57, 77, 5, 1000));
        for (int64_t r = 0; r < 11; r++)
            for (int64_t c = 0; c < 57; c++) {
                uint16_t w = want[r * 57 + c];
                big.b->hbuf[r * 64 + 3 + c] = dts[k] == CAI_DTYPE_BF16 ? cai_bf16_to_f32(w) : cai_f16_to_f32(w);
            }
        free(want);
        gt_check(nm("copy_sr f32 -> %s (strided rows)", dtn(dts[k])), dst, 0.0);
        /* the general strided path must give the same bits (index = row-major element index) */
        gt_t big2 = O3(dts[k], 57, 11, 1);
        gt_t d2 = gt_transpose(gt_narrow(big2, 2, 0, 1), 0, 1); /* [11,57,1] with strides */
        gt_t s3 = gt_unflatten(src, 1, 1);                      /* [11,57,1] */
        GT_OK(G->ops->copy_sr(G, &d2.g, &s3.g, 77, 5, 1000));
        for (int64_t r = 0; r < 11; r++)
            for (int64_t c = 0; c < 57; c++) big2.b->hbuf[c * 11 + r] = big.b->hbuf[r * 64 + 3 + c];
        gt_check(nm("copy_sr f32 -> %s (transposed)", dtn(dts[k])), d2, 0.0);
    }
}

/* ------------------------------------------------------------------ elementwise, reductions */

static void t_blas1(cai_dtype dt) {
    gt_t xb = R2(dt, 13, 80, 1.0), yb = R2(dt, 13, 90, 1.0);
    gt_t x = gt_narrow(xb, 1, 5, 70), y = gt_narrow(yb, 1, 11, 70);
    BOTH("scale", H->ops->scale(H, &x.h, -0.75f), G->ops->scale(G, &x.g, -0.75f));
    gt_check("scale (strided rows)", x, gt_tol(dt));
    BOTH("axpy", H->ops->axpy(H, &y.h, 0.3f, &x.h), G->ops->axpy(G, &y.g, 0.3f, &x.g));
    gt_check("axpy (strided rows)", y, gt_tol(dt));
    gt_t o = O2(dt, 13, 70);
    BOTH("add", H->ops->add(H, &o.h, &x.h, &y.h), G->ops->add(G, &o.g, &x.g, &y.g));
    gt_check("add", o, gt_tol(dt));
    BOTH("add", H->ops->add(H, &y.h, &y.h, &x.h), G->ops->add(G, &y.g, &y.g, &x.g));
    gt_check("add (out aliases a)", y, gt_tol(dt));
    gt_t bias = R1(CAI_DTYPE_F32, 70, 1.0);
    BOTH("bias_add", H->ops->bias_add(H, &x.h, &bias.h), G->ops->bias_add(G, &x.g, &bias.g));
    gt_check("bias_add", x, gt_tol(dt));
}

static void t_reduce(cai_dtype dt) {
    gt_t xb = R2(dt, 301, 260, 1.0);
    gt_t x = gt_narrow(xb, 1, 3, 257);
    for (int sq = 0; sq < 2; sq++) {
        gt_t o = R1(CAI_DTYPE_F32, 1, 1.0);
        if (sq) BOTH("sumsq", H->ops->sumsq(H, &o.h, &x.h), G->ops->sumsq(G, &o.g, &x.g));
        else BOTH("sum", H->ops->sum(H, &o.h, &x.h), G->ops->sum(G, &o.g, &x.g));
        gt_check(nm("%s strided rows -> f32 (+=)", sq ? "sumsq" : "sum"), o, 1e-6);
    }
    /* flat (one long row), F64 output */
    gt_t v = R1(dt, 100003, 1.0);
    double hv = 0.25, gv = 0.25;
    cai_tensor ho = cai_tensor_1d(NULL, &hv, CAI_DTYPE_F64, 1);
    void *gp = NULL;
    GT_OK(cai_device_alloc(G, 8, "f64 scalar", &gp));
    GT_OK(cai_device_copy(G, gp, &gv, 8, CAI_COPY_H2D));
    cai_tensor go = cai_tensor_1d(G, gp, CAI_DTYPE_F64, 1);
    BOTH("sumsq", H->ops->sumsq(H, &ho, &v.h), G->ops->sumsq(G, &go, &v.g));
    GT_OK(cai_device_copy(G, &gv, gp, 8, CAI_COPY_D2H));
    double e = fabs(gv - hv) / fabs(hv);
    gt_report("sumsq flat -> f64 (+=)", dtn(dt), e, 1e-12, e <= 1e-12, NULL);
    double g2 = 0.25;
    GT_OK(cai_device_copy(G, gp, &g2, 8, CAI_COPY_H2D));
    GT_OK(G->ops->sumsq(G, &go, &v.g));
    GT_OK(cai_device_copy(G, &g2, gp, 8, CAI_COPY_D2H));
    gt_expect("sumsq bitwise repeatable", memcmp(&g2, &gv, 8) == 0, NULL);
    cai_device_dealloc(G, gp);
}

/* ------------------------------------------------------------------ matmul family */

static void t_matmul(cai_dtype dt, cai_dtype cdt) {
    const int64_t M = 37, N = 29, K = 53;
    double tol = gt_tol(cdt);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gt_t a = ta ? R2(dt, K, M, 1.0) : R2(dt, M, K, 1.0);
            gt_t b = tb ? R2(dt, N, K, 1.0) : R2(dt, K, N, 1.0);
            gt_t c = R2(cdt, M, N, 1.0);
            BOTH("matmul", H->ops->matmul(H, &c.h, &a.h, ta, &b.h, tb, 0.7f, 0.5f),
                 G->ops->matmul(G, &c.g, &a.g, ta, &b.g, tb, 0.7f, 0.5f));
            gt_check(nm("matmul ta=%d tb=%d alpha/beta (%s in)", ta, tb, dtn(dt)), c, tol);
        }
    gt_t a = R2(dt, M, K, 1.0), b = R2(dt, K, N, 1.0), c = O2(cdt, M, N);
    BOTH("matmul", H->ops->matmul(H, &c.h, &a.h, 0, &b.h, 0, 1.0f, 0.0f),
         G->ops->matmul(G, &c.g, &a.g, 0, &b.g, 0, 1.0f, 0.0f));
    gt_check(nm("matmul beta=0 over NaN (%s in)", dtn(dt)), c, tol);
    /* batched: shared b folded into M; both batched with transposes; shared a */
    gt_t a3 = R3(dt, 3, M, K, 1.0), c3 = O3(cdt, 3, M, N);
    BOTH("matmul", H->ops->matmul(H, &c3.h, &a3.h, 0, &b.h, 0, 1.0f, 0.0f),
         G->ops->matmul(G, &c3.g, &a3.g, 0, &b.g, 0, 1.0f, 0.0f));
    gt_check(nm("matmul batch x shared b (%s in)", dtn(dt)), c3, tol);
    gt_t at = R3(dt, 3, K, M, 1.0), bt = R3(dt, 3, N, K, 1.0), c4 = O3(cdt, 3, M, N);
    BOTH("matmul", H->ops->matmul(H, &c4.h, &at.h, 1, &bt.h, 1, 1.0f, 0.0f),
         G->ops->matmul(G, &c4.g, &at.g, 1, &bt.g, 1, 1.0f, 0.0f));
    gt_check(nm("matmul batched ta=1 tb=1 (%s in)", dtn(dt)), c4, tol);
    gt_t b3 = R3(dt, 3, K, N, 1.0), c5 = O3(cdt, 3, M, N);
    BOTH("matmul", H->ops->matmul(H, &c5.h, &a.h, 0, &b3.h, 0, 1.0f, 0.0f),
         G->ops->matmul(G, &c5.g, &a.g, 0, &b3.g, 0, 1.0f, 0.0f));
    gt_check(nm("matmul shared a x batch (%s in)", dtn(dt)), c5, tol);
    /* strided rows on every operand */
    gt_t ab = R2(dt, M, K + 7, 1.0), bb = R2(dt, K, N + 3, 1.0), cb = R2(cdt, M, N + 5, 1.0);
    gt_t av = gt_narrow(ab, 1, 3, K), bv = gt_narrow(bb, 1, 1, N), cv = gt_narrow(cb, 1, 4, N);
    BOTH("matmul", H->ops->matmul(H, &cv.h, &av.h, 0, &bv.h, 0, 1.0f, 1.0f),
         G->ops->matmul(G, &cv.g, &av.g, 0, &bv.g, 0, 1.0f, 1.0f));
    gt_check(nm("matmul strided rows, beta=1 (%s in)", dtn(dt)), cb, tol);
    /* K = 0: c = beta c */
    gt_t a0 = R2(dt, M, 0, 1.0), b0 = R2(dt, 0, N, 1.0), c0 = R2(cdt, M, N, 1.0);
    BOTH("matmul", H->ops->matmul(H, &c0.h, &a0.h, 0, &b0.h, 0, 1.0f, 0.5f),
         G->ops->matmul(G, &c0.g, &a0.g, 0, &b0.g, 0, 1.0f, 0.5f));
    gt_check(nm("matmul K=0 (%s in)", dtn(dt)), c0, tol);
}

static void t_matmul_large(void) {
    /* K large enough that a TF32 product would miss 1e-5 by far */
    gt_t a = R2(CAI_DTYPE_F32, 256, 1536, 1.0), b = R2(CAI_DTYPE_F32, 384, 1536, 1.0), c = O2(CAI_DTYPE_F32, 256, 384);
    BOTH("matmul", H->ops->matmul(H, &c.h, &a.h, 0, &b.h, 1, 1.0f, 0.0f),
         G->ops->matmul(G, &c.g, &a.g, 0, &b.g, 1, 1.0f, 0.0f));
    gt_check("matmul 256x384x1536 (exact f32, no TF32)", c, 1e-5);
}

static void t_linear(cai_dtype dt, cai_dtype bdt) {
    const int64_t B = 3, T = 11, IC = 40, OC = 24;
    double tol = gt_tol(dt);
    gt_t x = R3(dt, B, T, IC, 1.0), w = R2(dt, OC, IC, 0.5), bias = R1(bdt, OC, 1.0);
    gt_t y = O3(dt, B, T, OC), y2 = O3(dt, B, T, OC);
    BOTH("linear_fwd", H->ops->linear_fwd(H, &y.h, &x.h, &w.h, &bias.h),
         G->ops->linear_fwd(G, &y.g, &x.g, &w.g, &bias.g));
    gt_check(nm("linear_fwd + bias (%s bias)", dtn(bdt)), y, tol);
    BOTH("linear_fwd", H->ops->linear_fwd(H, &y2.h, &x.h, &w.h, NULL), G->ops->linear_fwd(G, &y2.g, &x.g, &w.g, NULL));
    gt_check("linear_fwd no bias", y2, tol);
    gt_t dy = R3(dt, B, T, OC, 1.0), dx = O3(dt, B, T, IC), dxa = R3(dt, B, T, IC, 1.0);
    gt_t dw = R2(CAI_DTYPE_F32, OC, IC, 1.0), db = R1(CAI_DTYPE_F32, OC, 1.0);
    BOTH("linear_bwd", H->ops->linear_bwd(H, &dx.h, &dw.h, &db.h, &dy.h, &x.h, &w.h, 0),
         G->ops->linear_bwd(G, &dx.g, &dw.g, &db.g, &dy.g, &x.g, &w.g, 0));
    gt_check("linear_bwd dinp (=)", dx, tol);
    gt_check("linear_bwd dweight (+=, f32)", dw, 1e-5);
    gt_check("linear_bwd dbias (+=, f32)", db, 1e-5);
    BOTH("linear_bwd", H->ops->linear_bwd(H, &dxa.h, NULL, NULL, &dy.h, &x.h, &w.h, 1),
         G->ops->linear_bwd(G, &dxa.g, NULL, NULL, &dy.g, &x.g, &w.g, 1));
    gt_check("linear_bwd dinp (+=)", dxa, tol);
    gt_t dbb = R1(CAI_DTYPE_F32, OC, 1.0);
    BOTH("bias_grad", H->ops->bias_grad(H, &dbb.h, &dy.h), G->ops->bias_grad(G, &dbb.g, &dy.g));
    gt_check("bias_grad (+=)", dbb, 1e-5);
}

/* linear_gelu_fwd / linear_bwd_dgelu against the CPU composition (linear
 * then GELU). bf16 at aligned shapes runs the cuBLASLt GELU epilogues; f32,
 * the strided views (row stride OC + 4, not a multiple of 8, pre 8 bytes off
 * alignment) and anything cuBLASLt refuses run the unfused fallback. The
 * backward gets fresh act/pre inputs so both backends see identical values. */
static void t_linear_gelu_case(cai_dtype dt, cai_dtype bdt, int64_t N, int64_t IC, int64_t OC, int strided) {
    double tol = gt_tol(dt);
    const char *how = strided ? " strided" : "";
    const int64_t pad = strided ? 4 : 0;
    gt_t x = R2(dt, N, IC, 1.0), w = R2(dt, OC, IC, 1.5 / sqrt((double)IC)), bias = R1(bdt, OC, 0.5);
    gt_t actb = O2(dt, N, OC + pad), preb = O2(dt, N, OC + pad);
    gt_t act = gt_narrow(actb, 1, 0, OC), pre = gt_narrow(preb, 1, pad, OC);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        GT_OK(G->ops->fill(G, &act.g, NAN));
        GT_OK(G->ops->fill(G, &pre.g, NAN));
        BOTH("linear_gelu_fwd", H->ops->linear_gelu_fwd(H, &act.h, &pre.h, &x.h, &w.h, with_bias ? &bias.h : NULL),
             G->ops->linear_gelu_fwd(G, &act.g, &pre.g, &x.g, &w.g, with_bias ? &bias.g : NULL));
        const char *bn = with_bias ? (bdt == CAI_DTYPE_F32 ? " +f32 bias" : " +bias") : "";
        gt_check(nm("linear_gelu_fwd pre %" PRId64 "x%" PRId64 "->%" PRId64 "%s%s", N, IC, OC, bn, how), pre, tol);
        gt_check(nm("linear_gelu_fwd act %" PRId64 "x%" PRId64 "->%" PRId64 "%s%s", N, IC, OC, bn, how), act, tol);
    }
    /* the layer after the GELU (mlp_proj): weight [IC, OC] maps act [N,OC] to [N,IC] */
    gt_t a2 = R2(dt, N, OC, 1.0), p2b = R2(dt, N, OC + pad, 2.0), w2 = R2(dt, IC, OC, 1.5 / sqrt((double)OC));
    gt_t p2 = gt_narrow(p2b, 1, pad, OC), dout = R2(dt, N, IC, 1.0);
    gt_t dpreb = O2(dt, N, OC + pad), dw = R2(CAI_DTYPE_F32, IC, OC, 1.0), db = R1(CAI_DTYPE_F32, IC, 1.0);
    gt_t dpre = gt_narrow(dpreb, 1, 0, OC);
    BOTH("linear_bwd_dgelu", H->ops->linear_bwd_dgelu(H, &dpre.h, &dw.h, &db.h, &dout.h, &a2.h, &w2.h, &p2.h),
         G->ops->linear_bwd_dgelu(G, &dpre.g, &dw.g, &db.g, &dout.g, &a2.g, &w2.g, &p2.g));
    gt_check(nm("linear_bwd_dgelu dpre %" PRId64 "x%" PRId64 "<-%" PRId64 "%s", N, OC, IC, how), dpre, tol);
    gt_check(nm("linear_bwd_dgelu dweight (+=, f32)%s", how), dw, 1e-5);
    gt_check(nm("linear_bwd_dgelu dbias (+=, f32)%s", how), db, 1e-5);
    GT_OK(G->ops->fill(G, &dpre.g, NAN));
    BOTH("linear_bwd_dgelu", H->ops->linear_bwd_dgelu(H, &dpre.h, NULL, NULL, &dout.h, &a2.h, &w2.h, &p2.h),
         G->ops->linear_bwd_dgelu(G, &dpre.g, NULL, NULL, &dout.g, &a2.g, &w2.g, &p2.g));
    gt_check(nm("linear_bwd_dgelu dpre only%s", how), dpre, tol);
    gt_check("linear_bwd_dgelu dweight untouched", dw, 1e-5);
}

static void t_linear_gelu(cai_dtype dt) {
    /* GPT-2 124M's MLP (C = 768, F = 3072) on 512 tokens; an odd small shape */
    t_linear_gelu_case(dt, dt, 512, 768, 3072, 0);
    if (dt != CAI_DTYPE_F32) t_linear_gelu_case(dt, CAI_DTYPE_F32, 512, 768, 3072, 0);
    t_linear_gelu_case(dt, dt, 37, 24, 40, 0);
    t_linear_gelu_case(dt, dt, 37, 24, 40, 1);
}

/* ------------------------------------------------------------------ linear + residual (issue #10) */

/* linear_residual_fwd against the CPU composition (linear_fwd + add). At
 * aligned shapes cuBLASLt adds the residual as its C input (beta = 1,
 * rounded once); the strided case (row strides OC + 3: 2-byte aligned bf16
 * rows, residual 3 elements off) and a residual of another dtype than out
 * take whatever path cuBLASLt allows, down to the fallback. In place: out is
 * the residual (C = D). */
static void t_linear_residual_case(cai_dtype dt, cai_dtype bdt, int64_t N, int64_t IC, int64_t OC, int strided) {
    double tol = gt_tol(dt);
    const char *how = strided ? " strided" : "";
    const int64_t pad = strided ? 3 : 0;
    gt_t x = R2(dt, N, IC, 1.0), w = R2(dt, OC, IC, 1.5 / sqrt((double)IC)), bias = R1(bdt, OC, 0.5);
    gt_t resb = R2(dt, N, OC + pad, 1.0), outb = O2(dt, N, OC + pad);
    gt_t res = gt_narrow(resb, 1, pad, OC), out = gt_narrow(outb, 1, 0, OC);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const char *bn = with_bias ? (bdt == CAI_DTYPE_F32 ? " +f32 bias" : " +bias") : "";
        GT_OK(G->ops->fill(G, &out.g, NAN));
        BOTH("linear_residual_fwd",
             H->ops->linear_residual_fwd(H, &out.h, &x.h, &w.h, with_bias ? &bias.h : NULL, &res.h),
             G->ops->linear_residual_fwd(G, &out.g, &x.g, &w.g, with_bias ? &bias.g : NULL, &res.g));
        gt_check(nm("linear_residual_fwd %" PRId64 "x%" PRId64 "->%" PRId64 "%s%s", N, IC, OC, bn, how), out, tol);
        gt_t ipb = R2(dt, N, OC + pad, 1.0), ip = gt_narrow(ipb, 1, pad, OC);
        BOTH("linear_residual_fwd in place",
             H->ops->linear_residual_fwd(H, &ip.h, &x.h, &w.h, with_bias ? &bias.h : NULL, &ip.h),
             G->ops->linear_residual_fwd(G, &ip.g, &x.g, &w.g, with_bias ? &bias.g : NULL, &ip.g));
        gt_check(nm("linear_residual_fwd in place %" PRId64 "x%" PRId64 "->%" PRId64 "%s%s", N, IC, OC, bn, how), ip,
                 tol);
    }
    if (dt != CAI_DTYPE_F32) { /* f32 residual into a 16-bit out: the unfused path */
        gt_t rf = R2(CAI_DTYPE_F32, N, OC, 1.0);
        GT_OK(G->ops->fill(G, &out.g, NAN));
        BOTH("linear_residual_fwd", H->ops->linear_residual_fwd(H, &out.h, &x.h, &w.h, &bias.h, &rf.h),
             G->ops->linear_residual_fwd(G, &out.g, &x.g, &w.g, &bias.g, &rf.g));
        gt_check(nm("linear_residual_fwd f32 residual%s", how), out, tol);
    }
}

static void t_linear_residual(cai_dtype dt) {
    /* GPT-2 124M's output projections (C = 768) on 512 tokens; odd small shapes */
    t_linear_residual_case(dt, dt, 512, 768, 768, 0);
    if (dt != CAI_DTYPE_F32) t_linear_residual_case(dt, CAI_DTYPE_F32, 512, 768, 768, 0);
    t_linear_residual_case(dt, dt, 37, 24, 40, 0);
    t_linear_residual_case(dt, dt, 37, 24, 40, 1);
}
/* A decode step's few rows (dgemm.cu from 4 to 8 rows on an sm_90 GPU
 * where the shape fits it, gemv.cu up to 4 rows where dgemm.cu does not;
 * cuBLASLt past that or where K is no multiple of 8), with and without
 * bias and residual, in place. */
static void t_decode_linear(cai_dtype dt) {
    const double tol = gt_tol(dt);
    const int64_t rows[] = {1, 2, 3, 4, 5, 8, 9};
    for (int i = 0; i < (int)(sizeof rows / sizeof rows[0]); i++) {
        const int64_t N = rows[i];
        t_linear_residual_case(dt, dt, N, 2048, 2048, 0);
        t_linear_residual_case(dt, CAI_DTYPE_F32, N, 2048, 2048, 1);
        /* rows of 4096, 8192 and 16384: 2, 4 and 8 warps share one (gemv.cu's
         * KS); dgemm.cu's shapes (K >= 2048, 4M weights): 2056, K past the
         * last 64-deep slice and split over blocks, 2048 by 12000 not split */
        const int64_t ics[] = {4096, 8192, 16384, 2050, 2056, 2048}, ocs[] = {520, 520, 520, 520, 2048, 12000};
        for (int k = 0; k < 6; k++) {
            const int64_t IC = ics[k], OC = ocs[k];
            gt_t x = R2(dt, N, IC, 1.0), w = R2(dt, OC, IC, 1.0 / sqrt((double)IC)), b = R1(CAI_DTYPE_F32, OC, 1.0);
            gt_t y = O2(dt, N, OC);
            BOTH("linear_fwd", H->ops->linear_fwd(H, &y.h, &x.h, &w.h, &b.h),
                 G->ops->linear_fwd(G, &y.g, &x.g, &w.g, &b.g));
            gt_check(nm("linear_fwd %s %" PRId64 "x%" PRId64 "->%" PRId64 " +f32 bias", dtn(dt), N, IC, OC), y, tol);
        }
    }
}
/* A Llama MLP's gate, up and SwiGLU in one op: against the host, and bit
 * for bit against the three ops on this device (one pass over both weights
 * where the rows are few, the three ops past CUK_DGEMM_MAX_N rows or where
 * K is no multiple of 8). dgemm.cu takes 8192 by 1000 (K split over
 * blocks) and 2048 by 12000 (not split). */
static void t_decode_swiglu(cai_dtype dt) {
    const int64_t rows[] = {1, 2, 3, 4, 5, 8, 9}, ics[] = {2048, 8192, 2050, 2048};
    for (int i = 0; i < (int)(sizeof rows / sizeof rows[0]); i++)
        for (int k = 0; k < 4; k++) {
            const int64_t N = rows[i], IC = ics[k], F = k == 3 ? 12000 : 1000;
            gt_t x = R2(dt, N, IC, 1.0), wg = R2(dt, F, IC, 1.0 / sqrt((double)IC)),
                 wu = R2(dt, F, IC, 1.0 / sqrt((double)IC));
            gt_t y = O2(dt, N, F), g = O2(dt, N, F), u = O2(dt, N, F), y3 = O2(dt, N, F);
            BOTH("linear_swiglu_fwd", H->ops->linear_swiglu_fwd(H, &y.h, &g.h, &u.h, &x.h, &wg.h, &wu.h),
                 G->ops->linear_swiglu_fwd(G, &y.g, &g.g, &u.g, &x.g, &wg.g, &wu.g));
            gt_check(nm("linear_swiglu_fwd %s %" PRId64 "x%" PRId64 "->%" PRId64, dtn(dt), N, IC, F), y, gt_tol(dt));
            GT_OK(G->ops->linear_fwd(G, &g.g, &x.g, &wg.g, NULL));
            GT_OK(G->ops->linear_fwd(G, &u.g, &x.g, &wu.g, NULL));
            GT_OK(G->ops->swiglu_fwd(G, &y3.g, &g.g, &u.g));
            float *a = gt_download(y.b), *b = gt_download(y3.b);
            gt_expect(nm("linear_swiglu_fwd %s %" PRId64 "x%" PRId64 " equals linear, linear, swiglu bitwise", dtn(dt),
                         N, IC),
                      memcmp(a, b, (size_t)(N * F) * sizeof(float)) == 0, "");
            free(a);
            free(b);
        }
}
static void decode_linear(void) {
    if (G->kind == CAI_DEVICE_HOST) return; /* 16-bit only: the host backend computes in f32 */
    t_decode_linear(CAI_DTYPE_BF16);
    t_decode_linear(CAI_DTYPE_F16);
    t_decode_swiglu(CAI_DTYPE_BF16);
    t_decode_swiglu(CAI_DTYPE_F16);
}
static void f32_linear_residual(void) { t_linear_residual(CAI_DTYPE_F32); }
static void bf16_linear_residual(void) { t_linear_residual(CAI_DTYPE_BF16); }

/* ------------------------------------------------------------------ norms */

static void t_layernorm(cai_dtype dt, int with_bias) {
    const int64_t N = 67, C = 771;
    double tol = gt_tol(dt);
    gt_t xb = R2(dt, N, C + 20, 2.0), w = R1(dt, C, 1.0), b = R1(dt, C, 1.0);
    for (int64_t i = 0; i < xb.b->n; i++) xb.b->hbuf[i] += 0.5f; /* a mean to remove */
    gt_upload(&xb);
    gt_t x = gt_narrow(xb, 1, 7, C);
    gt_t y = O2(dt, N, C), mean = O1(CAI_DTYPE_F32, N), rstd = O1(CAI_DTYPE_F32, N);
    const cai_tensor *bh = with_bias ? &b.h : NULL, *bg = with_bias ? &b.g : NULL;
    BOTH("layernorm_fwd", H->ops->layernorm_fwd(H, &y.h, &mean.h, &rstd.h, &x.h, &w.h, bh, 1e-5f),
         G->ops->layernorm_fwd(G, &y.g, &mean.g, &rstd.g, &x.g, &w.g, bg, 1e-5f));
    gt_check(nm("layernorm_fwd out%s (strided inp)", with_bias ? "" : " no bias"), y, tol);
    gt_check("layernorm_fwd mean", mean, 1e-5);
    gt_check("layernorm_fwd rstd", rstd, 1e-5);
    gt_t dy = R2(dt, N, C, 1.0), dx = R2(dt, N, C, 1.0);
    gt_t dw = R1(CAI_DTYPE_F32, C, 1.0), db = R1(CAI_DTYPE_F32, C, 1.0);
    cai_tensor *dbh = with_bias ? &db.h : NULL, *dbg = with_bias ? &db.g : NULL;
    BOTH("layernorm_bwd", H->ops->layernorm_bwd(H, &dx.h, &dw.h, dbh, &dy.h, &x.h, &w.h, &mean.h, &rstd.h, 1),
         G->ops->layernorm_bwd(G, &dx.g, &dw.g, dbg, &dy.g, &x.g, &w.g, &mean.g, &rstd.g, 1));
    gt_check("layernorm_bwd dinp (+=)", dx, tol);
    gt_check("layernorm_bwd dweight (+=)", dw, 1e-5);
    if (with_bias) gt_check("layernorm_bwd dbias (+=)", db, 1e-5);
    gt_t dx2 = O2(dt, N, C);
    BOTH("layernorm_bwd", H->ops->layernorm_bwd(H, &dx2.h, NULL, NULL, &dy.h, &x.h, &w.h, &mean.h, &rstd.h, 0),
         G->ops->layernorm_bwd(G, &dx2.g, NULL, NULL, &dy.g, &x.g, &w.g, &mean.g, &rstd.g, 0));
    gt_check("layernorm_bwd dinp (=)", dx2, tol);
}

static void t_rmsnorm(cai_dtype dt) {
    const int64_t N = 45, C = 1000;
    double tol = gt_tol(dt);
    gt_t x = R2(dt, N, C, 1.5), w = R1(dt, C, 1.0);
    gt_t y = O2(dt, N, C), rstd = O1(CAI_DTYPE_F32, N);
    BOTH("rmsnorm_fwd", H->ops->rmsnorm_fwd(H, &y.h, &rstd.h, &x.h, &w.h, 1e-6f),
         G->ops->rmsnorm_fwd(G, &y.g, &rstd.g, &x.g, &w.g, 1e-6f));
    gt_check("rmsnorm_fwd out", y, tol);
    gt_check("rmsnorm_fwd rstd", rstd, 1e-5);
    gt_t dy = R2(dt, N, C, 1.0), dx = O2(dt, N, C), dw = R1(CAI_DTYPE_F32, C, 1.0);
    BOTH("rmsnorm_bwd", H->ops->rmsnorm_bwd(H, &dx.h, &dw.h, &dy.h, &x.h, &w.h, &rstd.h, 0),
         G->ops->rmsnorm_bwd(G, &dx.g, &dw.g, &dy.g, &x.g, &w.g, &rstd.g, 0));
    gt_check("rmsnorm_bwd dinp (=)", dx, tol);
    gt_check("rmsnorm_bwd dweight (+=)", dw, 1e-5);
}

/* ------------------------------------------------------------------ activations, RoPE */

static void t_activations(cai_dtype dt) {
    double tol = gt_tol(dt);
    gt_t xb = R2(dt, 19, 310, 2.0);
    gt_t x = gt_narrow(xb, 1, 10, 300);
    gt_t y = O2(dt, 19, 300), dy = R2(dt, 19, 300, 1.0), dx = O2(dt, 19, 300);
    BOTH("gelu_fwd", H->ops->gelu_fwd(H, &y.h, &x.h), G->ops->gelu_fwd(G, &y.g, &x.g));
    gt_check("gelu_fwd (strided inp)", y, tol);
    BOTH("gelu_bwd", H->ops->gelu_bwd(H, &dx.h, &x.h, &dy.h), G->ops->gelu_bwd(G, &dx.g, &x.g, &dy.g));
    gt_check("gelu_bwd", dx, tol);
    BOTH("gelu_bwd", H->ops->gelu_bwd(H, &dy.h, &x.h, &dy.h), G->ops->gelu_bwd(G, &dy.g, &x.g, &dy.g));
    gt_check("gelu_bwd in place (dinp = dout)", dy, tol);
    /* SwiGLU over the two halves of one fused [N, 2F] buffer */
    const int64_t N = 23, F = 130;
    gt_t fused = R2(dt, N, 2 * F, 2.0);
    gt_t gate = gt_narrow(fused, 1, 0, F), up = gt_narrow(fused, 1, F, F);
    gt_t o = O2(dt, N, F), d = R2(dt, N, F, 1.0), dfused = O2(dt, N, 2 * F);
    gt_t dg = gt_narrow(dfused, 1, 0, F), du = gt_narrow(dfused, 1, F, F);
    BOTH("swiglu_fwd", H->ops->swiglu_fwd(H, &o.h, &gate.h, &up.h), G->ops->swiglu_fwd(G, &o.g, &gate.g, &up.g));
    gt_check("swiglu_fwd (fused halves)", o, tol);
    BOTH("swiglu_bwd", H->ops->swiglu_bwd(H, &dg.h, &du.h, &d.h, &gate.h, &up.h),
         G->ops->swiglu_bwd(G, &dg.g, &du.g, &d.g, &gate.g, &up.g));
    gt_check("swiglu_bwd dgate|dup (fused)", dfused, tol);
}

static void t_rope(cai_dtype dt) {
    double tol = gt_tol(dt);
    const int64_t P = 64, R = 32, B = 2, T = 9, Hq = 4, Hkv = 2, D = 48;
    gt_t cs = O2(CAI_DTYPE_F32, P, R / 2), sn = O2(CAI_DTYPE_F32, P, R / 2);
    BOTH("rope_tables", H->ops->rope_tables(H, &cs.h, &sn.h, 10000.0), G->ops->rope_tables(G, &cs.g, &sn.g, 10000.0));
    gt_check("rope_tables cos", cs, 1e-6);
    gt_check("rope_tables sin", sn, 1e-6);
    /* q and k as views of a fused QKV buffer; partial rotary (R < D) */
    gt_t qkv = R3(dt, B, T, (Hq + 2 * Hkv) * D, 1.0);
    gt_t q = gt_unflatten(gt_narrow(qkv, 2, 0, Hq * D), 2, D);
    gt_t k = gt_unflatten(gt_narrow(qkv, 2, Hq * D, Hkv * D), 2, D);
    gt_t qo = O4(dt, B, T, Hq, D);
    BOTH("rope_fwd", H->ops->rope_fwd(H, &qo.h, &q.h, &cs.h, &sn.h, NULL, 5),
         G->ops->rope_fwd(G, &qo.g, &q.g, &cs.g, &sn.g, NULL, 5));
    gt_check("rope_fwd q view -> out, pos_offset 5", qo, tol);
    int32_t pos[2 * 9];
    for (int i = 0; i < B * T; i++) pos[i] = (int32_t)((i * 37 + 11) % P);
    gt_t tp = gt_ints(2, SHP(B, T), pos), t1 = gt_ints(1, SHP(T), pos);
    BOTH("rope_fwd", H->ops->rope_fwd(H, &k.h, &k.h, &cs.h, &sn.h, &tp.h, 0),
         G->ops->rope_fwd(G, &k.g, &k.g, &cs.g, &sn.g, &tp.g, 0));
    gt_check("rope_fwd in place on k view, positions [B,T]", qkv, tol);
    gt_t dq = R4(dt, B, T, Hq, D, 1.0), dqi = O4(dt, B, T, Hq, D);
    BOTH("rope_bwd", H->ops->rope_bwd(H, &dqi.h, &dq.h, &cs.h, &sn.h, &t1.h, 0),
         G->ops->rope_bwd(G, &dqi.g, &dq.g, &cs.g, &sn.g, &t1.g, 0));
    gt_check("rope_bwd positions [T]", dqi, tol);
    /* the model's case: full rotary (D 64) in place on q and k views of a
     * fused QKV buffer -- the 16-byte path for bf16/f16 */
    const int64_t D2 = 64;
    gt_t cs2 = O2(CAI_DTYPE_F32, P, D2 / 2), sn2 = O2(CAI_DTYPE_F32, P, D2 / 2);
    BOTH("rope_tables", H->ops->rope_tables(H, &cs2.h, &sn2.h, 10000.0),
         G->ops->rope_tables(G, &cs2.g, &sn2.g, 10000.0));
    gt_t qkv2 = R3(dt, B, T, (Hq + 2 * Hkv) * D2, 1.0);
    gt_t q2 = gt_unflatten(gt_narrow(qkv2, 2, 0, Hq * D2), 2, D2);
    gt_t k2 = gt_unflatten(gt_narrow(qkv2, 2, Hq * D2, Hkv * D2), 2, D2);
    BOTH("rope_fwd", H->ops->rope_fwd(H, &q2.h, &q2.h, &cs2.h, &sn2.h, NULL, 3),
         G->ops->rope_fwd(G, &q2.g, &q2.g, &cs2.g, &sn2.g, NULL, 3));
    gt_check("rope_fwd full rotary in place on a q view", qkv2, tol);
    BOTH("rope_bwd", H->ops->rope_bwd(H, &k2.h, &k2.h, &cs2.h, &sn2.h, &tp.h, 0),
         G->ops->rope_bwd(G, &k2.g, &k2.g, &cs2.g, &sn2.g, &tp.g, 0));
    gt_check("rope_bwd full rotary in place on a k view, positions [B,T]", qkv2, tol);
}

/* ------------------------------------------------------------------ attention */

static void attn_case(cai_dtype dt, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D, int causal,
                      int64_t off, int64_t window, int fused) {
    double tol = gt_tol(dt);
    gt_t q, k, v, qkv = {0};
    if (fused) {
        qkv = R3(dt, B, Tq, (Hq + 2 * Hkv) * D, 1.0);
        q = gt_unflatten(gt_narrow(qkv, 2, 0, Hq * D), 2, D);
        k = gt_unflatten(gt_narrow(qkv, 2, Hq * D, Hkv * D), 2, D);
        v = gt_unflatten(gt_narrow(qkv, 2, (Hq + Hkv) * D, Hkv * D), 2, D);
    } else {
        q = R4(dt, B, Tq, Hq, D, 1.0);
        k = R4(dt, B, Tk, Hkv, D, 1.0);
        v = R4(dt, B, Tk, Hkv, D, 1.0);
    }
    cai_attn_params p = {.scale = 0.0f, .causal = causal, .causal_offset = off, .window = window};
    gt_t o = O4(dt, B, Tq, Hq, D), lse = O3(CAI_DTYPE_F32, B, Hq, Tq);
    size_t hws = H->ops->attention_workspace_bytes(H, B, Tq, Tk, Hq, Hkv, D);
    size_t gws = G->ops->attention_workspace_bytes(G, B, Tq, Tk, Hq, Hkv, D);
    void *hw = malloc(hws), *gw = NULL;
    GT_OK(cai_device_alloc(G, gws, "attention workspace", &gw));
    char tag[96];
    snprintf(tag, sizeof tag, "B%" PRId64 " T%" PRId64 "/%" PRId64 " H%" PRId64 "/%" PRId64 " D%" PRId64 "%s%s%s", B,
             Tq, Tk, Hq, Hkv, D, causal ? " causal" : "", window ? " window" : "", fused ? " fusedQKV" : "");
    BOTH("attention_fwd", H->ops->attention_fwd(H, &o.h, &lse.h, &q.h, &k.h, &v.h, &p, hw, hws),
         G->ops->attention_fwd(G, &o.g, &lse.g, &q.g, &k.g, &v.g, &p, gw, gws));
    gt_check(nm("attn fwd out   %s", tag), o, tol);
    gt_check(nm("attn fwd lse   %s", tag), lse, 1e-5);
    gt_t dout = R4(dt, B, Tq, Hq, D, 1.0), dq, dk, dv, dqkv = {0};
    if (fused) {
        dqkv = O3(dt, B, Tq, (Hq + 2 * Hkv) * D);
        dq = gt_unflatten(gt_narrow(dqkv, 2, 0, Hq * D), 2, D);
        dk = gt_unflatten(gt_narrow(dqkv, 2, Hq * D, Hkv * D), 2, D);
        dv = gt_unflatten(gt_narrow(dqkv, 2, (Hq + Hkv) * D, Hkv * D), 2, D);
    } else {
        dq = O4(dt, B, Tq, Hq, D);
        dk = O4(dt, B, Tk, Hkv, D);
        dv = O4(dt, B, Tk, Hkv, D);
    }
    BOTH("attention_bwd",
         H->ops->attention_bwd(H, &dq.h, &dk.h, &dv.h, &dout.h, &q.h, &k.h, &v.h, &o.h, &lse.h, &p, hw, hws),
         G->ops->attention_bwd(G, &dq.g, &dk.g, &dv.g, &dout.g, &q.g, &k.g, &v.g, &o.g, &lse.g, &p, gw, gws));
    double btol = tol;
    if (fused) {
        gt_check(nm("attn bwd dqkv  %s", tag), dqkv, btol);
    } else {
        gt_check(nm("attn bwd dq    %s", tag), dq, btol);
        gt_check(nm("attn bwd dk    %s", tag), dk, btol);
        gt_check(nm("attn bwd dv    %s", tag), dv, btol);
    }
    if (fused) { /* determinism: the same bits again (every path; no atomics) */
        float *first = gt_download(dqkv.b);
        GT_OK(G->ops->fill(G, &dqkv.g, NAN));
        GT_OK(G->ops->attention_bwd(G, &dq.g, &dk.g, &dv.g, &dout.g, &q.g, &k.g, &v.g, &o.g, &lse.g, &p, gw, gws));
        float *second = gt_download(dqkv.b);
        gt_expect(nm("attn bwd bitwise repeatable %s", tag),
                  memcmp(first, second, sizeof(float) * (size_t)dqkv.b->n) == 0, NULL);
        free(first);
        free(second);
    }
    free(hw);
    cai_device_dealloc(G, gw);
}

static void t_attention(cai_dtype dt) {
    attn_case(dt, 2, 77, 77, 6, 2, 64, 1, 0, 0, 1);    /* GPT-style causal, GQA 3:1, fused QKV */
    attn_case(dt, 2, 130, 130, 4, 2, 128, 1, 0, 0, 1); /* Llama-style head_dim 128, several tiles */
    attn_case(dt, 1, 40, 70, 4, 4, 128, 0, 0, 0, 0);   /* full attention, Tq != Tk, D 128 */
    attn_case(dt, 2, 33, 50, 4, 1, 40, 1, 17, 16, 0);  /* decode-style offset, window, MQA, odd D */
    attn_case(dt, 1, 20, 20, 2, 2, 256, 1, -5, 0, 0);  /* first rows see no key: out 0, lse -inf */
    attn_case(dt, 1, 300, 300, 4, 1, 64, 1, 0, 0, 1);  /* many tiles */
    /* shapes for the flash kernels (head_dim 64/128; bf16 and f16 go there
     * by default): offsets and windows not aligned to their 64-row tiles,
     * rows with no key, GQA with fused QKV, Tq != Tk both ways */
    attn_case(dt, 2, 100, 150, 4, 2, 64, 1, 50, 40, 0);  /* decode-style offset + window, GQA */
    attn_case(dt, 1, 70, 70, 2, 2, 128, 1, -5, 0, 0);    /* no-key rows at D 128 */
    attn_case(dt, 2, 200, 200, 4, 4, 128, 1, 0, 70, 1);  /* window over several tiles, fused, D 128 */
    attn_case(dt, 1, 150, 90, 4, 2, 64, 0, 0, 0, 0);     /* full attention, Tq > Tk */
    attn_case(dt, 1, 129, 129, 8, 2, 64, 1, 3, 0, 1);    /* GQA 4:1, positive offset */
    attn_case(dt, 2, 50, 200, 2, 1, 64, 1, 150, 20, 0);  /* key tiles no query sees: dk = dv = 0 */
    attn_case(dt, 1, 100, 100, 2, 2, 128, 1, -70, 0, 0); /* a whole query tile sees no key */
    /* cuDNN's cases besides the ones above: causal aligned bottom-right
     * (offset Tk - Tq, chunked prefill over a cache) with GQA, and Tq = 1 */
    attn_case(dt, 2, 50, 120, 4, 2, 64, 1, 70, 0, 0);
    attn_case(dt, 3, 1, 90, 8, 2, 128, 1, 89, 0, 0);
}

/* attention_merge (ring attention's step): two key blocks' results merged
 * into out and a narrowed view of a wider lse. Causal offset -1: row 0 sees
 * no key (lse -inf on both sides), the early rows only the first block. */
static void t_attn_merge(cai_dtype dt) {
    const int64_t B = 2, Tq = 37, Tk = 50, A = 20, Hq = 4, Hkv = 2, D = 64;
    double tol = gt_tol(dt);
    gt_t q = R4(dt, B, Tq, Hq, D, 1.0), k = R4(dt, B, Tk, Hkv, D, 1.0), v = R4(dt, B, Tk, Hkv, D, 1.0);
    gt_t o = O4(dt, B, Tq, Hq, D), bo = O4(dt, B, Tq, Hq, D);
    gt_t lw = O3(CAI_DTYPE_F32, B, Hq, Tq + 5), bl = O3(CAI_DTYPE_F32, B, Hq, Tq);
    gt_t l = gt_narrow(lw, 2, 3, Tq);
    size_t hws = H->ops->attention_workspace_bytes(H, B, Tq, Tk, Hq, Hkv, D);
    size_t gws = G->ops->attention_workspace_bytes(G, B, Tq, Tk, Hq, Hkv, D);
    void *hw = malloc(hws), *gw = NULL;
    GT_OK(cai_device_alloc(G, gws, "attention workspace", &gw));
    for (int blk = 0; blk < 2; blk++) {
        int64_t k0 = blk ? A : 0, nk = blk ? Tk - A : A;
        gt_t kb = gt_narrow(k, 1, k0, nk), vb = gt_narrow(v, 1, k0, nk);
        cai_attn_params p = {.causal = 1, .causal_offset = -1 - k0};
        gt_t *dst = blk ? &bo : &o;
        BOTH("attention_fwd block", H->ops->attention_fwd(H, &dst->h, &bl.h, &q.h, &kb.h, &vb.h, &p, hw, hws),
             G->ops->attention_fwd(G, &dst->g, &bl.g, &q.g, &kb.g, &vb.g, &p, gw, gws));
        if (!blk) BOTH("copy lse", H->ops->copy(H, &l.h, &bl.h), G->ops->copy(G, &l.g, &bl.g));
    }
    BOTH("attention_merge", H->ops->attention_merge(H, &o.h, &l.h, &bo.h, &bl.h),
         G->ops->attention_merge(G, &o.g, &l.g, &bo.g, &bl.g));
    gt_check("attention_merge out", o, tol);
    gt_check("attention_merge lse (narrowed view)", l, 1e-5);
    free(hw);
    cai_device_dealloc(G, gw);
}

/* ------------------------------------------------------------------ embeddings, cross-entropy */

static void t_embedding(cai_dtype dt) {
    const int64_t B = 3, T = 17, C = 70, Vl = 50, voff = 20, Vt = 100, P = 32;
    int32_t tok[3 * 17];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 7919 + 13) % 97 < 60 ? (i * 31) % 40 + 15 : (i * 13) % Vt);
    tok[5] = tok[6] = tok[40] = 33; /* repeats within the shard */
    gt_t tt = gt_ints(2, SHP(B, T), tok);
    gt_t wte = R2(dt, Vl, C, 1.0), wpe = R2(dt, P, C, 1.0), out = O3(dt, B, T, C), out2 = O3(dt, B, T, C);
    double tol = dt == CAI_DTYPE_F32 ? 0.0 : gt_tol(dt);
    BOTH("embedding_fwd", H->ops->embedding_fwd(H, &out.h, &tt.h, &wte.h, &wpe.h, voff, Vt, 4),
         G->ops->embedding_fwd(G, &out.g, &tt.g, &wte.g, &wpe.g, voff, Vt, 4));
    gt_check("embedding_fwd shard + wpe", out, tol);
    BOTH("embedding_fwd", H->ops->embedding_fwd(H, &out2.h, &tt.h, &wte.h, NULL, voff, Vt, 0),
         G->ops->embedding_fwd(G, &out2.g, &tt.g, &wte.g, NULL, voff, Vt, 0));
    gt_check("embedding_fwd shard, no wpe", out2, tol);
    gt_t dy = R3(dt, B, T, C, 1.0), dwte = R2(CAI_DTYPE_F32, Vl, C, 1.0), dwpe = R2(CAI_DTYPE_F32, P, C, 1.0);
    BOTH("embedding_bwd", H->ops->embedding_bwd(H, &dwte.h, &dwpe.h, &dy.h, &tt.h, voff, 4),
         G->ops->embedding_bwd(G, &dwte.g, &dwpe.g, &dy.g, &tt.g, voff, 4));
    gt_check("embedding_bwd dwte (+=, bitwise)", dwte, 0.0);
    gt_check("embedding_bwd dwpe (+=, bitwise)", dwpe, 0.0);
    if (dt != CAI_DTYPE_F32) return;
    /* a bad token id: the CPU fails at once, the GPU at the next synchronisation */
    tok[29] = 150;
    gt_t bad = gt_ints(2, SHP(B, T), tok);
    cai_status sh = H->ops->embedding_fwd(H, &out.h, &bad.h, &wte.h, &wpe.h, voff, Vt, 4);
    cai_error_clear();
    cai_status sg = G->ops->embedding_fwd(G, &out.g, &bad.g, &wte.g, &wpe.g, voff, Vt, 4);
    cai_status ss = cai_device_sync(G);
    int named = strstr(cai_error_message(), "token id 150 at batch 1, position 12") != NULL;
    gt_expect("embedding_fwd bad token: reported at sync",
              sh == CAI_ERR_INVALID_ARG && sg == CAI_OK && ss == CAI_ERR_INVALID_ARG && named, cai_error_message());
    cai_error_clear();
    gt_expect("device error record cleared after report", cai_device_sync(G) == CAI_OK, NULL);
}

/* I32 results bit for bit. */
static void check_ids(const char *what, gt_t t) {
    float *d = gt_download(t.b);
    int64_t bad = -1;
    for (int64_t i = 0; i < t.b->n && bad < 0; i++)
        if (memcmp(&d[i], &t.b->hbuf[i], sizeof(float)) != 0) bad = i;
    char note[96] = "";
    if (bad >= 0) {
        int32_t a, b;
        memcpy(&a, &d[bad], 4);
        memcpy(&b, &t.b->hbuf[bad], 4);
        snprintf(note, sizeof note, "element %lld: device %d, host %d", (long long)bad, a, b);
    }
    gt_expect(what, bad < 0, bad >= 0 ? note : NULL);
    free(d);
}

/* argmax_rows against the host: a vocabulary shard with padding, ties (bf16
 * and f16 make many: the lower id wins on both), and rows of a real
 * vocabulary's width, more rows than the grid (its row loop); rows of 300
 * take the scalar scan (16-bit rows not 16-byte aligned), the others the
 * 16-byte one, the fourth with slices and a last chunk of 5 columns. */
static void t_argmax(cai_dtype dt) {
    const int64_t cases[][4] = {{37, 300, 100, 390},
                                {5, 128256, 0, 128256},
                                {600, 32000, 0, 31990},
                                {2, 20480, 7, 20484}};
    for (int c = 0; c < 4; c++) {
        const int64_t N = cases[c][0], V = cases[c][1];
        gt_t x = R2(dt, N, V, c == 0 ? 0.05 : 3.0);
        int32_t *zero = calloc((size_t)N, sizeof *zero);
        if (!zero) gt_die("argmax ids");
        gt_t id = gt_ints(1, SHP(N), zero), mv = O1(CAI_DTYPE_F32, N);
        free(zero);
        BOTH("argmax_rows", H->ops->argmax_rows(H, &id.h, &mv.h, &x.h, cases[c][2], cases[c][3]),
             G->ops->argmax_rows(G, &id.g, &mv.g, &x.g, cases[c][2], cases[c][3]));
        gt_check(nm("argmax_rows %s %lldx%lld values", dtn(dt), (long long)N, (long long)V), mv, 0.0);
        check_ids(nm("argmax_rows %s %lldx%lld ids", dtn(dt), (long long)N, (long long)V), id);
    }
}

static void t_xent(cai_dtype dt) {
    const int64_t N = 37, V = 300, Vpad = 310, valid = 290;
    double tol = gt_tol(dt);
    int32_t tgt[37];
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)((i * 101 + 7) % valid);
    tgt[3] = tgt[20] = -100;
    gt_t tt = gt_ints(1, SHP(N), tgt);
    gt_t lb = R2(dt, N, Vpad, 3.0);
    gt_t lg = gt_narrow(lb, 1, 5, V);
    gt_t loss = O1(CAI_DTYPE_F32, N), lse = O1(CAI_DTYPE_F32, N);
    BOTH("xent_fwd", H->ops->xent_fwd(H, &loss.h, &lse.h, &lg.h, &tt.h, 0, valid, -100),
         G->ops->xent_fwd(G, &loss.g, &lse.g, &lg.g, &tt.g, 0, valid, -100));
    gt_check("xent_fwd losses (padding, ignore)", loss, 1e-5);
    gt_check("xent_fwd lse", lse, 1e-5);
    /* xent_fwd_bwd into a separate gradient (the logits stay for the tests below) */
    gt_t loss2 = O1(CAI_DTYPE_F32, N), lse2 = O1(CAI_DTYPE_F32, N), dx2 = O2(dt, N, V);
    BOTH("xent_fwd_bwd", H->ops->xent_fwd_bwd(H, &loss2.h, &lse2.h, &dx2.h, &lg.h, &tt.h, 1.0f / 35, 0, valid, -100),
         G->ops->xent_fwd_bwd(G, &loss2.g, &lse2.g, &dx2.g, &lg.g, &tt.g, 1.0f / 35, 0, valid, -100));
    gt_check("xent_fwd_bwd losses", loss2, 1e-5);
    gt_check("xent_fwd_bwd lse", lse2, 1e-5);
    gt_check("xent_fwd_bwd dlogits (strided logits)", dx2, tol);
    gt_t dl = R1(CAI_DTYPE_F32, N, 1.0), dx = O2(dt, N, V);
    BOTH("xent_bwd", H->ops->xent_bwd(H, &dx.h, &lg.h, &lse.h, &tt.h, &dl.h, 0.0f, 0, valid, -100),
         G->ops->xent_bwd(G, &dx.g, &lg.g, &lse.g, &tt.g, &dl.g, 0.0f, 0, valid, -100));
    gt_check("xent_bwd dlosses vector", dx, tol);
    BOTH("xent_bwd", H->ops->xent_bwd(H, &lg.h, &lg.h, &lse.h, &tt.h, NULL, 1.0f / 35, 0, valid, -100),
         G->ops->xent_bwd(G, &lg.g, &lg.g, &lse.g, &tt.g, NULL, 1.0f / 35, 0, valid, -100));
    gt_check("xent_bwd in place, scalar scale", lg, tol);
    /* vocab-parallel statistics on the shard of global ids [100, 400), valid < 390 */
    int32_t t2[37];
    for (int i = 0; i < N; i++) t2[i] = (int32_t)((i * 53 + 3) % 390);
    t2[7] = -100;
    gt_t tt2 = gt_ints(1, SHP(N), t2);
    gt_t sh = R2(dt, N, V, 3.0);
    gt_t mx = O1(CAI_DTYPE_F32, N), se = O1(CAI_DTYPE_F32, N), tl = O1(CAI_DTYPE_F32, N);
    BOTH("xent_stats", H->ops->xent_stats(H, &mx.h, &se.h, &tl.h, &sh.h, &tt2.h, 100, 390, -100),
         G->ops->xent_stats(G, &mx.g, &se.g, &tl.g, &sh.g, &tt2.g, 100, 390, -100));
    gt_check("xent_stats max (shard)", mx, 1e-6);
    gt_check("xent_stats sumexp", se, 1e-5);
    gt_check("xent_stats target logit", tl, 0.0);
    if (dt != CAI_DTYPE_F32) return;
    tgt[9] = 295; /* a padding column: invalid target */
    gt_t bad = gt_ints(1, SHP(N), tgt);
    gt_t lg2 = R2(dt, N, V, 1.0);
    cai_status sh1 = H->ops->xent_fwd(H, &loss.h, NULL, &lg2.h, &bad.h, 0, valid, -100);
    cai_error_clear();
    cai_status sg = G->ops->xent_fwd(G, &loss.g, NULL, &lg2.g, &bad.g, 0, valid, -100);
    cai_status ss = cai_device_sync(G);
    gt_expect("xent_fwd bad target: reported at sync",
              sh1 == CAI_ERR_INVALID_ARG && sg == CAI_OK && ss == CAI_ERR_INVALID_ARG &&
                  strstr(cai_error_message(), "target 295 of row 9"),
              cai_error_message());
    cai_error_clear();
}

/* ------------------------------------------------------------------ optimizer */

/* Random parameters and moments (v non-negative) of n elements. */
static void adamw_state(int64_t n, gt_t *p, gt_t *m, gt_t *v) {
    *p = R1(CAI_DTYPE_F32, n, 1.0);
    *m = R1(CAI_DTYPE_F32, n, 0.1);
    *v = R1(CAI_DTYPE_F32, n, 0.1);
    for (int64_t i = 0; i < n; i++) v->b->hbuf[i] = fabsf(v->b->hbuf[i]);
    gt_upload(v);
}

static void t_adamw(void) {
    const int64_t n = 10007;
    gt_t p, m, v;
    adamw_state(n, &p, &m, &v);
    gt_t lowp = O1(CAI_DTYPE_BF16, n);
    for (int step = 1; step <= 3; step++) {
        gt_t g = R1(CAI_DTYPE_F32, n, 1.0);
        cai_adamw_params hp = {.lr = 1e-3f,
                               .beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .eps = 1e-8f,
                               .weight_decay = 0.1f,
                               .step = step,
                               .grad_scale = 0.5f};
        BOTH("adamw", H->ops->adamw(H, &p.h, &g.h, &m.h, &v.h, &lowp.h, &hp, 1),
             G->ops->adamw(G, &p.g, &g.g, &m.g, &v.g, &lowp.g, &hp, 1));
    }
    gt_check("adamw param after 3 steps", p, 1e-6);
    gt_check("adamw m", m, 1e-6);
    gt_check("adamw v", v, 1e-6);
    /* the bf16 copy is RNE of the f32 parameter: equal bits unless the f32 values differ by an ulp */
    gt_check("adamw bf16 param copy", lowp, 4e-3);
    /* a run that starts 3 elements past a 16-byte boundary and ends inside a
     * quad (the vector kernel's head and tail), f16 copy, no decay */
    gt_t p2, m2, v2;
    adamw_state(n, &p2, &m2, &v2);
    gt_t g2 = R1(CAI_DTYPE_F32, n, 1.0), l2 = R1(CAI_DTYPE_F16, n, 1.0);
    const int64_t off = 3, len = n - 9;
    gt_t pv = gt_narrow(p2, 0, off, len), mv = gt_narrow(m2, 0, off, len), vv = gt_narrow(v2, 0, off, len);
    gt_t gv = gt_narrow(g2, 0, off, len), lv = gt_narrow(l2, 0, off, len);
    cai_adamw_params hp2 = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 2, .grad_scale = 1.0f};
    BOTH("adamw", H->ops->adamw(H, &pv.h, &gv.h, &mv.h, &vv.h, &lv.h, &hp2, 0),
         G->ops->adamw(G, &pv.g, &gv.g, &mv.g, &vv.g, &lv.g, &hp2, 0));
    gt_check("adamw offset run: param (outside untouched)", p2, 1e-6);
    gt_check("adamw offset run: m", m2, 1e-6);
    gt_check("adamw offset run: v", v2, 1e-6);
    gt_check("adamw offset run: f16 copy", l2, 1e-3);
}

/* ------------------------------------------------------------------ argument errors */

static void t_errors(void) {
    gt_t a = R2(CAI_DTYPE_F32, 4, 5, 1.0), b = R2(CAI_DTYPE_F32, 6, 7, 1.0), c = O2(CAI_DTYPE_F32, 4, 7);
    cai_status s = G->ops->matmul(G, &c.g, &a.g, 0, &b.g, 0, 1.0f, 0.0f);
    gt_expect("matmul shape mismatch -> INVALID_ARG", s == CAI_ERR_INVALID_ARG, cai_error_message());
    cai_error_clear();
    s = G->ops->gelu_fwd(G, &c.g, &c.h);
    gt_expect("host tensor given to a GPU op -> INVALID_ARG", s == CAI_ERR_INVALID_ARG, cai_error_message());
    cai_error_clear();
    gt_t ab = R2(CAI_DTYPE_BF16, 4, 5, 1.0), bf = R2(CAI_DTYPE_F32, 5, 7, 1.0);
    s = G->ops->matmul(G, &c.g, &ab.g, 0, &bf.g, 0, 1.0f, 0.0f);
    gt_expect("matmul bf16 x f32 -> UNSUPPORTED", s == CAI_ERR_UNSUPPORTED, cai_error_message());
    cai_error_clear();
}

/* ------------------------------------------------------------------ 16-byte fast paths */

/* The memory-bound kernels take 16-byte vector paths when every row starts
 * 16-byte aligned (and, for most, the tensors share one dtype); the cases
 * above mostly use misaligned views (the general kernels). These use views
 * whose rows are aligned but whose width is not a multiple of 8 (a partial
 * last chunk), contiguous tensors of odd size (collapsed into one row), and
 * check that the padding columns of a narrowed output stay untouched. */

/* Columns [cols, ld) of a [rows, ld] output buffer still hold the NaN poison. */
static void fp_untouched(const char *name, gt_t full, int64_t rows, int64_t ld, int64_t cols) {
    float *got = gt_download(full.b);
    int ok = 1;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = cols; c < ld; c++) ok &= isnan(got[r * ld + c]);
    free(got);
    gt_expect(nm("%s: padding columns untouched", name), ok, NULL);
}

/* An aligned view [rows, cols] of a fresh [rows, ld] buffer (random or NaN). */
static gt_t fp_view(cai_dtype dt, int64_t rows, int64_t cols, int64_t ld, int random, gt_t *full) {
    *full = random ? R2(dt, rows, ld, 1.0) : O2(dt, rows, ld);
    return gt_narrow(*full, 1, 0, cols);
}

static void fp_norms(cai_dtype dt) {
    double tol = gt_tol(dt);
    /* widths: partial last chunk (771 in rows of 776), exact 768, 1024 (4 chunks a lane), 1600 (forward
     * only in registers; the backward takes the general kernels) */
    const int64_t widths[4][2] = {{771, 776}, {768, 768}, {1024, 1024}, {1600, 1600}};
    for (int k = 0; k < 4; k++) {
        const int64_t N = 70, C = widths[k][0], ld = widths[k][1];
        gt_t xf, yf, dyf, dxf;
        gt_t x = fp_view(dt, N, C, ld, 1, &xf);
        for (int64_t i = 0; i < xf.b->n; i++) xf.b->hbuf[i] = 2.0f * xf.b->hbuf[i] + 0.5f;
        gt_upload(&xf);
        gt_t y = fp_view(dt, N, C, ld, 0, &yf), w = R1(dt, C, 1.0), b = R1(dt, C, 1.0);
        gt_t mean = O1(CAI_DTYPE_F32, N), rstd = O1(CAI_DTYPE_F32, N);
        BOTH("layernorm_fwd", H->ops->layernorm_fwd(H, &y.h, &mean.h, &rstd.h, &x.h, &w.h, &b.h, 1e-5f),
             G->ops->layernorm_fwd(G, &y.g, &mean.g, &rstd.g, &x.g, &w.g, &b.g, 1e-5f));
        gt_check(nm("layernorm_fwd aligned C=%" PRId64 " ld=%" PRId64, C, ld), y, tol);
        gt_check(nm("layernorm_fwd aligned C=%" PRId64 " mean", C), mean, 1e-5);
        gt_check(nm("layernorm_fwd aligned C=%" PRId64 " rstd", C), rstd, 1e-5);
        if (ld > C) fp_untouched("layernorm_fwd", yf, N, ld, C);
        gt_t dy = fp_view(dt, N, C, ld, 1, &dyf), dx = fp_view(dt, N, C, ld, 1, &dxf);
        gt_t dw = R1(CAI_DTYPE_F32, C, 1.0), db = R1(CAI_DTYPE_F32, C, 1.0);
        BOTH("layernorm_bwd", H->ops->layernorm_bwd(H, &dx.h, &dw.h, &db.h, &dy.h, &x.h, &w.h, &mean.h, &rstd.h, 1),
             G->ops->layernorm_bwd(G, &dx.g, &dw.g, &db.g, &dy.g, &x.g, &w.g, &mean.g, &rstd.g, 1));
        gt_check(nm("layernorm_bwd aligned C=%" PRId64 " dinp (+=)", C), dx, tol);
        gt_check(nm("layernorm_bwd aligned C=%" PRId64 " dweight (+=)", C), dw, 1e-5);
        gt_check(nm("layernorm_bwd aligned C=%" PRId64 " dbias (+=)", C), db, 1e-5);
        /* parameter gradients only; then dinp only, in place over dout */
        gt_t dw2 = R1(CAI_DTYPE_F32, C, 1.0);
        BOTH("layernorm_bwd", H->ops->layernorm_bwd(H, NULL, &dw2.h, NULL, &dy.h, &x.h, &w.h, &mean.h, &rstd.h, 0),
             G->ops->layernorm_bwd(G, NULL, &dw2.g, NULL, &dy.g, &x.g, &w.g, &mean.g, &rstd.g, 0));
        gt_check(nm("layernorm_bwd aligned C=%" PRId64 " dweight only", C), dw2, 1e-5);
        BOTH("layernorm_bwd", H->ops->layernorm_bwd(H, &dy.h, NULL, NULL, &dy.h, &x.h, &w.h, &mean.h, &rstd.h, 0),
             G->ops->layernorm_bwd(G, &dy.g, NULL, NULL, &dy.g, &x.g, &w.g, &mean.g, &rstd.g, 0));
        gt_check(nm("layernorm_bwd aligned C=%" PRId64 " dinp in place (=)", C), dy, tol);
        /* RMSNorm on the same rows, f32 weight (a dtype of its own) */
        gt_t wf = R1(CAI_DTYPE_F32, C, 1.0), y2f, dx2f;
        gt_t y2 = fp_view(dt, N, C, ld, 0, &y2f), rs2 = O1(CAI_DTYPE_F32, N);
        BOTH("rmsnorm_fwd", H->ops->rmsnorm_fwd(H, &y2.h, &rs2.h, &x.h, &wf.h, 1e-6f),
             G->ops->rmsnorm_fwd(G, &y2.g, &rs2.g, &x.g, &wf.g, 1e-6f));
        gt_check(nm("rmsnorm_fwd aligned C=%" PRId64 " (f32 weight)", C), y2, tol);
        gt_check(nm("rmsnorm_fwd aligned C=%" PRId64 " rstd", C), rs2, 1e-5);
        gt_t dy2 = R2(dt, N, ld, 1.0), dx2 = fp_view(dt, N, C, ld, 0, &dx2f), dw3 = R1(CAI_DTYPE_F32, C, 1.0);
        gt_t dy2v = gt_narrow(dy2, 1, 0, C);
        BOTH("rmsnorm_bwd", H->ops->rmsnorm_bwd(H, &dx2.h, &dw3.h, &dy2v.h, &x.h, &wf.h, &rs2.h, 0),
             G->ops->rmsnorm_bwd(G, &dx2.g, &dw3.g, &dy2v.g, &x.g, &wf.g, &rs2.g, 0));
        gt_check(nm("rmsnorm_bwd aligned C=%" PRId64 " dinp (=)", C), dx2, tol);
        gt_check(nm("rmsnorm_bwd aligned C=%" PRId64 " dweight (+=)", C), dw3, 1e-5);
        if (ld > C) fp_untouched("rmsnorm_bwd", dx2f, N, ld, C);
    }
    /* bitwise repeatability of the one-pass backward's parameter gradients (many row blocks) */
    const int64_t N = 1000, C = 768;
    gt_t x = R2(dt, N, C, 1.0), dy = R2(dt, N, C, 1.0), w = R1(dt, C, 1.0), y = O2(dt, N, C);
    gt_t mean = O1(CAI_DTYPE_F32, N), rstd = O1(CAI_DTYPE_F32, N), dx = O2(dt, N, C);
    GT_OK(G->ops->layernorm_fwd(G, &y.g, &mean.g, &rstd.g, &x.g, &w.g, NULL, 1e-5f));
    float *bits[2];
    for (int rep = 0; rep < 2; rep++) {
        gt_t dw = O1(CAI_DTYPE_F32, C);
        GT_OK(G->ops->fill(G, &dw.g, 0.0f));
        GT_OK(G->ops->layernorm_bwd(G, &dx.g, &dw.g, NULL, &dy.g, &x.g, &w.g, &mean.g, &rstd.g, 0));
        bits[rep] = gt_download(dw.b);
    }
    gt_expect("layernorm_bwd dweight bitwise repeatable", memcmp(bits[0], bits[1], (size_t)C * 4) == 0, NULL);
    free(bits[0]);
    free(bits[1]);
}

static void fp_elementwise(cai_dtype dt) {
    double tol = gt_tol(dt);
    const int64_t N = 19, C = 300, ld = 312;
    gt_t xf, yf, dxf;
    gt_t x = fp_view(dt, N, C, ld, 1, &xf), y = fp_view(dt, N, C, ld, 0, &yf);
    BOTH("gelu_fwd", H->ops->gelu_fwd(H, &y.h, &x.h), G->ops->gelu_fwd(G, &y.g, &x.g));
    gt_check("gelu_fwd aligned rows, C=300", y, tol);
    fp_untouched("gelu_fwd", yf, N, ld, C);
    gt_t dyf2, dx = fp_view(dt, N, C, ld, 0, &dxf), dy2 = fp_view(dt, N, C, ld, 1, &dyf2);
    BOTH("gelu_bwd", H->ops->gelu_bwd(H, &dx.h, &x.h, &dy2.h), G->ops->gelu_bwd(G, &dx.g, &x.g, &dy2.g));
    gt_check("gelu_bwd aligned rows", dx, tol);
    BOTH("gelu_bwd", H->ops->gelu_bwd(H, &dy2.h, &x.h, &dy2.h), G->ops->gelu_bwd(G, &dy2.g, &x.g, &dy2.g));
    gt_check("gelu_bwd aligned in place", dy2, tol);
    /* contiguous, odd element count: one long row */
    gt_t cx = R2(dt, 7, 301, 2.0), cy = O2(dt, 7, 301);
    BOTH("gelu_fwd", H->ops->gelu_fwd(H, &cy.h, &cx.h), G->ops->gelu_fwd(G, &cy.g, &cx.g));
    gt_check("gelu_fwd contiguous 7x301", cy, tol);
    BOTH("scale", H->ops->scale(H, &cx.h, 1.5f), G->ops->scale(G, &cx.g, 1.5f));
    gt_check("scale contiguous 7x301", cx, tol);
    BOTH("axpy", H->ops->axpy(H, &cy.h, -0.5f, &cx.h), G->ops->axpy(G, &cy.g, -0.5f, &cx.g));
    gt_check("axpy contiguous 7x301", cy, tol);
    gt_t co = O2(dt, 7, 301);
    BOTH("add", H->ops->add(H, &co.h, &cx.h, &cy.h), G->ops->add(G, &co.g, &cx.g, &cy.g));
    gt_check("add contiguous 7x301", co, tol);
    /* bias of the activation dtype: broadcast row on the fast path */
    gt_t bias = R1(dt, C, 1.0);
    BOTH("bias_add", H->ops->bias_add(H, &x.h, &bias.h), G->ops->bias_add(G, &x.g, &bias.g));
    gt_check("bias_add aligned rows, same-dtype bias", x, tol);
    fp_untouched("bias_add", yf, N, ld, C);
    /* SwiGLU: halves of a fused [N, 2F] buffer, F a multiple of 8 so both halves are aligned */
    const int64_t F = 136;
    gt_t fused = R2(dt, N, 2 * F, 2.0), o = O2(dt, N, F), d = R2(dt, N, F, 1.0), dfused = O2(dt, N, 2 * F);
    gt_t gate = gt_narrow(fused, 1, 0, F), up = gt_narrow(fused, 1, F, F);
    gt_t dg = gt_narrow(dfused, 1, 0, F), du = gt_narrow(dfused, 1, F, F);
    BOTH("swiglu_fwd", H->ops->swiglu_fwd(H, &o.h, &gate.h, &up.h), G->ops->swiglu_fwd(G, &o.g, &gate.g, &up.g));
    gt_check("swiglu_fwd aligned halves", o, tol);
    BOTH("swiglu_bwd", H->ops->swiglu_bwd(H, &dg.h, &du.h, &d.h, &gate.h, &up.h),
         G->ops->swiglu_bwd(G, &dg.g, &du.g, &d.g, &gate.g, &up.g));
    gt_check("swiglu_bwd aligned dgate|dup", dfused, tol);
    /* conversions into and out of this dtype on aligned rows and contiguous odd sizes: bitwise */
    const cai_dtype dts[3] = {CAI_DTYPE_F32, CAI_DTYPE_BF16, CAI_DTYPE_F16};
    for (int k = 0; k < 3; k++) {
        gt_t sf, df;
        gt_t src = fp_view(dt, 9, 70, 72, 1, &sf), dst = fp_view(dts[k], 9, 70, 72, 0, &df);
        for (int64_t i = 0; i < sf.b->n; i++) sf.b->hbuf[i] *= 3.0f;
        gt_upload(&sf);
        BOTH("copy", H->ops->copy(H, &dst.h, &src.h), G->ops->copy(G, &dst.g, &src.g));
        gt_round_host(&df);
        gt_check(nm("copy aligned rows %s -> %s", dtn(dt), dtn(dts[k])), dst, 0.0);
        fp_untouched("copy aligned rows", df, 9, 72, 70);
        gt_t s2 = R2(dt, 5, 203, 3.0), d2 = O2(dts[k], 5, 203);
        BOTH("copy", H->ops->copy(H, &d2.h, &s2.h), G->ops->copy(G, &d2.g, &s2.g));
        gt_round_host(&d2);
        gt_check(nm("copy contiguous 5x203 %s -> %s", dtn(dt), dtn(dts[k])), d2, 0.0);
    }
}

static void fp_xent_embed(cai_dtype dt) {
    double tol = gt_tol(dt);
    /* cross-entropy on aligned rows (300 columns in rows of 312), padding and ignored rows */
    const int64_t N = 37, V = 300, ld = 312, valid = 290;
    int32_t tgt[37];
    for (int i = 0; i < N; i++) tgt[i] = (int32_t)((i * 101 + 7) % valid);
    tgt[3] = tgt[20] = -100;
    tgt[11] = 289; /* the last valid column, inside the partial chunk */
    gt_t tt = gt_ints(1, SHP(N), tgt);
    gt_t lf;
    gt_t lg = fp_view(dt, N, V, ld, 1, &lf);
    for (int64_t i = 0; i < lf.b->n; i++) lf.b->hbuf[i] *= 3.0f;
    lf.b->hbuf[5 * ld + 17] = 40.0f; /* a late large maximum: the running sum must rescale */
    gt_upload(&lf);
    gt_t loss = O1(CAI_DTYPE_F32, N), lse = O1(CAI_DTYPE_F32, N);
    BOTH("xent_fwd", H->ops->xent_fwd(H, &loss.h, &lse.h, &lg.h, &tt.h, 0, valid, -100),
         G->ops->xent_fwd(G, &loss.g, &lse.g, &lg.g, &tt.g, 0, valid, -100));
    gt_check("xent_fwd aligned rows losses", loss, 1e-5);
    gt_check("xent_fwd aligned rows lse", lse, 1e-5);
    gt_t mx = O1(CAI_DTYPE_F32, N), se = O1(CAI_DTYPE_F32, N), tl = O1(CAI_DTYPE_F32, N);
    BOTH("xent_stats", H->ops->xent_stats(H, &mx.h, &se.h, &tl.h, &lg.h, &tt.h, 0, valid, -100),
         G->ops->xent_stats(G, &mx.g, &se.g, &tl.g, &lg.g, &tt.g, 0, valid, -100));
    gt_check("xent_stats aligned max", mx, 1e-6);
    gt_check("xent_stats aligned sumexp", se, 1e-5);
    gt_check("xent_stats aligned target logit", tl, 0.0);
    float *b1 = gt_download(lse.b);
    GT_OK(G->ops->xent_fwd(G, &loss.g, &lse.g, &lg.g, &tt.g, 0, valid, -100));
    float *b2 = gt_download(lse.b);
    gt_expect("xent_fwd lse bitwise repeatable", memcmp(b1, b2, (size_t)N * 4) == 0, NULL);
    free(b1);
    free(b2);
    gt_t dl = R1(CAI_DTYPE_F32, N, 1.0), dxf;
    gt_t dx = fp_view(dt, N, V, ld, 0, &dxf);
    BOTH("xent_bwd", H->ops->xent_bwd(H, &dx.h, &lg.h, &lse.h, &tt.h, &dl.h, 0.0f, 0, valid, -100),
         G->ops->xent_bwd(G, &dx.g, &lg.g, &lse.g, &tt.g, &dl.g, 0.0f, 0, valid, -100));
    gt_check("xent_bwd aligned rows", dx, tol);
    fp_untouched("xent_bwd", dxf, N, ld, V);
    BOTH("xent_bwd", H->ops->xent_bwd(H, &lg.h, &lg.h, &lse.h, &tt.h, NULL, 1.0f / 35, 0, valid, -100),
         G->ops->xent_bwd(G, &lg.g, &lg.g, &lse.g, &tt.g, NULL, 1.0f / 35, 0, valid, -100));
    gt_check("xent_bwd aligned in place", lg, tol);
    /* embeddings with 8-aligned rows (C = 72) and a partial last chunk (75 of 80) */
    const int64_t B = 3, T = 17, Vl = 50, voff = 20, Vt = 100, P = 32;
    int32_t tok[3 * 17];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 7919 + 13) % 97 < 60 ? (i * 31) % 40 + 15 : (i * 13) % Vt);
    gt_t tt2 = gt_ints(2, SHP(B, T), tok);
    const int64_t Cs[2][2] = {{72, 72}, {75, 80}};
    for (int k = 0; k < 2; k++) {
        const int64_t C = Cs[k][0], L = Cs[k][1];
        gt_t wtef, wpef, outf;
        gt_t wte = fp_view(dt, Vl, C, L, 1, &wtef), wpe = fp_view(dt, P, C, L, 1, &wpef);
        gt_t o2 = fp_view(dt, B * T, C, L, 0, &outf);
        gt_t out = gt_unflatten(o2, 0, T);
        BOTH("embedding_fwd", H->ops->embedding_fwd(H, &out.h, &tt2.h, &wte.h, &wpe.h, voff, Vt, 4),
             G->ops->embedding_fwd(G, &out.g, &tt2.g, &wte.g, &wpe.g, voff, Vt, 4));
        gt_check(nm("embedding_fwd aligned C=%" PRId64, C), out, dt == CAI_DTYPE_F32 ? 0.0 : tol);
        if (L > C) fp_untouched("embedding_fwd", outf, B * T, L, C);
        /* backward on aligned rows: the same additions in the same order as the CPU, bitwise */
        gt_t dyf, dtef, dpef;
        gt_t dy2 = fp_view(dt, B * T, C, L, 1, &dyf);
        gt_t dy = gt_unflatten(dy2, 0, T);
        gt_t dwte = fp_view(CAI_DTYPE_F32, Vl, C, L, 1, &dtef), dwpe = fp_view(CAI_DTYPE_F32, P, C, L, 1, &dpef);
        BOTH("embedding_bwd", H->ops->embedding_bwd(H, &dwte.h, &dwpe.h, &dy.h, &tt2.h, voff, 4),
             G->ops->embedding_bwd(G, &dwte.g, &dwpe.g, &dy.g, &tt2.g, voff, 4));
        gt_check(nm("embedding_bwd aligned C=%" PRId64 " dwte (+=, bitwise)", C), dwte, 0.0);
        gt_check(nm("embedding_bwd aligned C=%" PRId64 " dwpe (+=, bitwise)", C), dwpe, 0.0);
    }
}

static void f32_fast(void) {
    fp_norms(CAI_DTYPE_F32);
    fp_elementwise(CAI_DTYPE_F32);
    fp_xent_embed(CAI_DTYPE_F32);
}
static void bf16_fast(void) {
    fp_norms(CAI_DTYPE_BF16);
    fp_elementwise(CAI_DTYPE_BF16);
    fp_xent_embed(CAI_DTYPE_BF16);
}
static void f16_fast(void) {
    fp_norms(CAI_DTYPE_F16);
    fp_elementwise(CAI_DTYPE_F16);
    fp_xent_embed(CAI_DTYPE_F16);
}

/* ------------------------------------------------------------------ norm / xent fast paths (issue #10) */

/* LayerNorm and RMSNorm at training shapes: many rows per warp in the
 * forward's grid-stride loop and more than 32 rows per backward block
 * (d_model 768: fast paths), 2048 (forward fast, backward general), 4096
 * (general kernels), odd widths with a partial last chunk, accumulate on
 * and off, f32 bias with 16-bit activations, RMSNorm backward in place. */
static void i10_norm_case(cai_dtype dt, int64_t N, int64_t C, int64_t ld, int accum) {
    double tol = gt_tol(dt);
    gt_t xf, yf, dyf, dxf;
    gt_t x = fp_view(dt, N, C, ld, 1, &xf), y = fp_view(dt, N, C, ld, 0, &yf);
    gt_t w = R1(dt, C, 1.0), b = R1(CAI_DTYPE_F32, C, 1.0);
    gt_t mean = O1(CAI_DTYPE_F32, N), rstd = O1(CAI_DTYPE_F32, N);
    BOTH("layernorm_fwd", H->ops->layernorm_fwd(H, &y.h, &mean.h, &rstd.h, &x.h, &w.h, &b.h, 1e-5f),
         G->ops->layernorm_fwd(G, &y.g, &mean.g, &rstd.g, &x.g, &w.g, &b.g, 1e-5f));
    gt_check(nm("layernorm_fwd %s %" PRId64 "x%" PRId64 " ld %" PRId64, dtn(dt), N, C, ld), y, tol);
    gt_check(nm("layernorm_fwd %s %" PRId64 "x%" PRId64 " mean", dtn(dt), N, C), mean, 1e-5);
    gt_check(nm("layernorm_fwd %s %" PRId64 "x%" PRId64 " rstd", dtn(dt), N, C), rstd, 1e-5);
    if (ld > C) fp_untouched("layernorm_fwd", yf, N, ld, C);
    gt_t dy = fp_view(dt, N, C, ld, 1, &dyf), dx = fp_view(dt, N, C, ld, accum, &dxf);
    gt_t dw = R1(CAI_DTYPE_F32, C, 1.0), db = R1(CAI_DTYPE_F32, C, 1.0);
    BOTH("layernorm_bwd", H->ops->layernorm_bwd(H, &dx.h, &dw.h, &db.h, &dy.h, &x.h, &w.h, &mean.h, &rstd.h, accum),
         G->ops->layernorm_bwd(G, &dx.g, &dw.g, &db.g, &dy.g, &x.g, &w.g, &mean.g, &rstd.g, accum));
    const char *how = accum ? "+=" : "=";
    gt_check(nm("layernorm_bwd %s %" PRId64 "x%" PRId64 " dinp (%s)", dtn(dt), N, C, how), dx, tol);
    gt_check(nm("layernorm_bwd %s %" PRId64 "x%" PRId64 " dweight", dtn(dt), N, C), dw, 1e-5);
    gt_check(nm("layernorm_bwd %s %" PRId64 "x%" PRId64 " dbias", dtn(dt), N, C), db, 1e-5);
    if (ld > C && !accum) fp_untouched("layernorm_bwd", dxf, N, ld, C);
    gt_t y2f, y2 = fp_view(dt, N, C, ld, 0, &y2f), rs2 = O1(CAI_DTYPE_F32, N), dw2 = R1(CAI_DTYPE_F32, C, 1.0);
    BOTH("rmsnorm_fwd", H->ops->rmsnorm_fwd(H, &y2.h, &rs2.h, &x.h, &w.h, 1e-6f),
         G->ops->rmsnorm_fwd(G, &y2.g, &rs2.g, &x.g, &w.g, 1e-6f));
    gt_check(nm("rmsnorm_fwd %s %" PRId64 "x%" PRId64, dtn(dt), N, C), y2, tol);
    gt_check(nm("rmsnorm_fwd %s %" PRId64 "x%" PRId64 " rstd", dtn(dt), N, C), rs2, 1e-5);
    BOTH("rmsnorm_bwd", H->ops->rmsnorm_bwd(H, &dy.h, &dw2.h, &dy.h, &x.h, &w.h, &rs2.h, 0),
         G->ops->rmsnorm_bwd(G, &dy.g, &dw2.g, &dy.g, &x.g, &w.g, &rs2.g, 0));
    gt_check(nm("rmsnorm_bwd %s %" PRId64 "x%" PRId64 " dinp in place", dtn(dt), N, C), dy, tol);
    gt_check(nm("rmsnorm_bwd %s %" PRId64 "x%" PRId64 " dweight", dtn(dt), N, C), dw2, 1e-5);
}

/* Cross-entropy on full GPT-2 vocabulary rows (50257 valid of 50304) and odd widths. */
static void i10_xent_case(cai_dtype dt, int64_t N, int64_t V, int64_t ld, int64_t valid) {
    double tol = gt_tol(dt);
    int32_t *tgt = malloc((size_t)N * sizeof *tgt);
    for (int64_t i = 0; i < N; i++) tgt[i] = (int32_t)((i * 7919 + 13) % valid);
    tgt[1 % N] = -100;
    tgt[2 % N] = (int32_t)(valid - 1); /* inside the partial chunk when valid is not a multiple of 8 */
    gt_t tt = gt_ints(1, SHP(N), tgt);
    free(tgt);
    gt_t lf, lg = fp_view(dt, N, V, ld, 1, &lf);
    for (int64_t i = 0; i < lf.b->n; i++) lf.b->hbuf[i] *= 3.0f;
    gt_upload(&lf);
    gt_t loss = O1(CAI_DTYPE_F32, N), lse = O1(CAI_DTYPE_F32, N);
    BOTH("xent_fwd", H->ops->xent_fwd(H, &loss.h, &lse.h, &lg.h, &tt.h, 0, valid, -100),
         G->ops->xent_fwd(G, &loss.g, &lse.g, &lg.g, &tt.g, 0, valid, -100));
    gt_check(nm("xent_fwd %s %" PRId64 "x%" PRId64 " losses", dtn(dt), N, V), loss, 1e-5);
    gt_check(nm("xent_fwd %s %" PRId64 "x%" PRId64 " lse", dtn(dt), N, V), lse, 1e-5);
    gt_t mx = O1(CAI_DTYPE_F32, N), se = O1(CAI_DTYPE_F32, N), tl = O1(CAI_DTYPE_F32, N);
    BOTH("xent_stats", H->ops->xent_stats(H, &mx.h, &se.h, &tl.h, &lg.h, &tt.h, 0, valid, -100),
         G->ops->xent_stats(G, &mx.g, &se.g, &tl.g, &lg.g, &tt.g, 0, valid, -100));
    gt_check(nm("xent_stats %s %" PRId64 "x%" PRId64 " max", dtn(dt), N, V), mx, 1e-6);
    gt_check(nm("xent_stats %s %" PRId64 "x%" PRId64 " sumexp", dtn(dt), N, V), se, 1e-5);
    gt_check(nm("xent_stats %s %" PRId64 "x%" PRId64 " target logit", dtn(dt), N, V), tl, 0.0);
    gt_t dl = R1(CAI_DTYPE_F32, N, 1.0), dxf, dx = fp_view(dt, N, V, ld, 0, &dxf);
    BOTH("xent_bwd", H->ops->xent_bwd(H, &dx.h, &lg.h, &lse.h, &tt.h, &dl.h, 0.0f, 0, valid, -100),
         G->ops->xent_bwd(G, &dx.g, &lg.g, &lse.g, &tt.g, &dl.g, 0.0f, 0, valid, -100));
    gt_check(nm("xent_bwd %s %" PRId64 "x%" PRId64, dtn(dt), N, V), dx, tol);
    if (ld > V) fp_untouched("xent_bwd", dxf, N, ld, V);
    /* xent_fwd_bwd in place on a copy of the logits (the one-kernel path:
     * 16-byte aligned rows) */
    gt_t cf, cp = fp_view(dt, N, V, ld, 0, &cf); /* padding keeps O2's NaN poison */
    BOTH("copy", H->ops->copy(H, &cp.h, &lg.h), G->ops->copy(G, &cp.g, &lg.g));
    gt_t loss2 = O1(CAI_DTYPE_F32, N), lse2 = O1(CAI_DTYPE_F32, N);
    BOTH("xent_fwd_bwd", H->ops->xent_fwd_bwd(H, &loss2.h, &lse2.h, &cp.h, &cp.h, &tt.h, 1.0f / 4096, 0, valid, -100),
         G->ops->xent_fwd_bwd(G, &loss2.g, &lse2.g, &cp.g, &cp.g, &tt.g, 1.0f / 4096, 0, valid, -100));
    gt_check(nm("xent_fwd_bwd %s %" PRId64 "x%" PRId64 " losses", dtn(dt), N, V), loss2, 1e-5);
    gt_check(nm("xent_fwd_bwd %s %" PRId64 "x%" PRId64 " in place", dtn(dt), N, V), cp, tol);
    if (ld > V) fp_untouched("xent_fwd_bwd", cf, N, ld, V);
    BOTH("xent_bwd", H->ops->xent_bwd(H, &lg.h, &lg.h, &lse.h, &tt.h, NULL, 1.0f / 4096, 0, valid, -100),
         G->ops->xent_bwd(G, &lg.g, &lg.g, &lse.g, &tt.g, NULL, 1.0f / 4096, 0, valid, -100));
    gt_check(nm("xent_bwd %s %" PRId64 "x%" PRId64 " in place", dtn(dt), N, V), lg, tol);
}

static void i10_norms(void) {
    i10_norm_case(CAI_DTYPE_BF16, 20000, 768, 768, 1); /* GPT-2 124M width, 40 rows per backward block */
    i10_norm_case(CAI_DTYPE_BF16, 3000, 768, 768, 0);
    i10_norm_case(CAI_DTYPE_F16, 3000, 768, 776, 1);
    i10_norm_case(CAI_DTYPE_F32, 2000, 768, 768, 1);
    i10_norm_case(CAI_DTYPE_F32, 129, 1023, 1028, 1); /* 4 chunks a lane, the last partial */
    i10_norm_case(CAI_DTYPE_BF16, 300, 2048, 2048, 1);
    i10_norm_case(CAI_DTYPE_F16, 100, 1032, 1032, 0);
    i10_norm_case(CAI_DTYPE_BF16, 64, 4096, 4096, 1); /* Llama widths: general kernels */
    i10_norm_case(CAI_DTYPE_F32, 64, 4096, 4096, 0);
    i10_norm_case(CAI_DTYPE_BF16, 257, 5, 8, 1); /* a single partial chunk */
    /* bitwise repeatability of the parameter gradients with 40-row blocks */
    const int64_t N = 20000, C = 768;
    gt_t x = R2(CAI_DTYPE_BF16, N, C, 1.0), dy = R2(CAI_DTYPE_BF16, N, C, 1.0), w = R1(CAI_DTYPE_BF16, C, 1.0);
    gt_t y = O2(CAI_DTYPE_BF16, N, C), dx = O2(CAI_DTYPE_BF16, N, C);
    gt_t mean = O1(CAI_DTYPE_F32, N), rstd = O1(CAI_DTYPE_F32, N);
    GT_OK(G->ops->layernorm_fwd(G, &y.g, &mean.g, &rstd.g, &x.g, &w.g, NULL, 1e-5f));
    float *bits[2];
    for (int rep = 0; rep < 2; rep++) {
        gt_t dw = O1(CAI_DTYPE_F32, C), db = O1(CAI_DTYPE_F32, C);
        GT_OK(G->ops->fill(G, &dw.g, 0.0f));
        GT_OK(G->ops->fill(G, &db.g, 0.0f));
        GT_OK(G->ops->layernorm_bwd(G, &dx.g, &dw.g, &db.g, &dy.g, &x.g, &w.g, &mean.g, &rstd.g, 0));
        bits[rep] = gt_download(dw.b);
    }
    gt_expect("layernorm_bwd 20000x768 dweight bitwise repeatable", memcmp(bits[0], bits[1], (size_t)C * 4) == 0, NULL);
    free(bits[0]);
    free(bits[1]);
}

static void i10_xent(void) {
    i10_xent_case(CAI_DTYPE_BF16, 48, 50304, 50304, 50257);
    i10_xent_case(CAI_DTYPE_F32, 16, 50304, 50304, 50257);
    i10_xent_case(CAI_DTYPE_F16, 16, 4100, 4104, 4099);
    i10_xent_case(CAI_DTYPE_BF16, 33, 77, 80, 77);
    i10_xent_case(CAI_DTYPE_F32, 9, 4096, 4096, 4096); /* no partial chunk */
}

/* ------------------------------------------------------------------ embedding_bwd long runs (issue #10) */

/* 4096 tokens drawn from 5 in-shard ids (one of them 60% of all) and one
 * id outside the shard [20, 70): runs of thousands of rows, cut into tiles
 * whose partial sums are added in tile order, so dwte matches the CPU
 * within f32 rounding instead of bitwise; repeatable bitwise. C = 768 takes
 * the tiled fast path, C = 70 (bf16 rows not 16-byte aligned) the general one. */
static void emb_long_case(cai_dtype dt, int64_t C) {
    const int64_t B = 4, T = 1024, Vl = 50, voff = 20, P = 1024;
    static const int32_t ids[6] = {33, 21, 69, 40, 20, 5};
    static const int cum[6] = {60, 80, 90, 95, 98, 100}; /* percent */
    int32_t *tok = malloc((size_t)(B * T) * sizeof(int32_t));
    if (!tok) gt_die("malloc");
    uint32_t st = 12345u;
    for (int64_t i = 0; i < B * T; i++) {
        st = st * 1664525u + 1013904223u;
        int r = (int)((st >> 8) % 100u), k = 0;
        while (r >= cum[k]) k++;
        tok[i] = ids[k];
    }
    gt_t tt = gt_ints(2, SHP(B, T), tok);
    free(tok);
    gt_t dy = R3(dt, B, T, C, 1.0), dwte = R2(CAI_DTYPE_F32, Vl, C, 1.0), dwpe = R2(CAI_DTYPE_F32, P, C, 1.0);
    BOTH("embedding_bwd", H->ops->embedding_bwd(H, &dwte.h, &dwpe.h, &dy.h, &tt.h, voff, 0),
         G->ops->embedding_bwd(G, &dwte.g, &dwpe.g, &dy.g, &tt.g, voff, 0));
    gt_check(nm("embedding_bwd 4096 tokens of 5 ids C=%" PRId64 " dwte", C), dwte, gt_tol(CAI_DTYPE_F32));
    gt_check(nm("embedding_bwd 4096 tokens of 5 ids C=%" PRId64 " dwpe", C), dwpe, 0.0);
    float *bits[2];
    for (int rep = 0; rep < 2; rep++) {
        gt_t d = O2(CAI_DTYPE_F32, Vl, C);
        GT_OK(G->ops->fill(G, &d.g, 0.0f));
        GT_OK(G->ops->embedding_bwd(G, &d.g, NULL, &dy.g, &tt.g, voff, 0));
        bits[rep] = gt_download(d.b);
    }
    gt_expect(nm("embedding_bwd long runs C=%" PRId64 " bitwise repeatable", C),
              memcmp(bits[0], bits[1], (size_t)(Vl * C) * 4) == 0, NULL);
    free(bits[0]);
    free(bits[1]);
}

static void f32_emb_long(void) {
    emb_long_case(CAI_DTYPE_F32, 768);
    emb_long_case(CAI_DTYPE_F32, 70);
}
static void bf16_emb_long(void) {
    emb_long_case(CAI_DTYPE_BF16, 768);
    emb_long_case(CAI_DTYPE_BF16, 70);
}

/* ------------------------------------------------------------------ paged KV cache */

/* a[0..n) = a shuffled 0..n-1 (Fisher-Yates on a 64-bit LCG seeded with
 * rng); returns the generator's state for further draws. */
static uint64_t shuffled_ids(int32_t *a, int64_t n, uint64_t rng) {
    for (int64_t i = 0; i < n; i++) a[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t j = (int64_t)((rng >> 33) % (uint64_t)(i + 1));
        const int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
    return rng;
}

/* One sequence of a paged batch: ql queries, the last of ctx cached tokens;
 * `stale`: its slots are -1, so kv_cache_write leaves its rows alone and
 * attention reads what the cache already held there. */
typedef struct {
    int64_t ql, ctx;
    int stale;
} pg_seq;

/* A ragged batch through kv_cache_write then paged_attention on both
 * backends: q, k, v are views into one fused QKV buffer, out a view with
 * padding columns, caches start random (the history) with blocks handed out
 * in a shuffled order and spare blocks never referenced. The caches must
 * match bit for bit (both round to nearest even); out within tolerance,
 * checked per sequence so every context length gets its own line. */
static void paged_case(const char *what, cai_dtype act, cai_dtype cdt, int64_t Hq, int64_t Hkv, int64_t D, int64_t bs,
                       int64_t max_ctx, const pg_seq *seq, int S) {
    int64_t N = 0, used = 0, max_blocks = 1;
    for (int s = 0; s < S; s++) {
        const int64_t nb = (seq[s].ctx + bs - 1) / bs;
        N += seq[s].ql;
        used += nb;
        if (nb + 1 > max_blocks) max_blocks = nb + 1; /* a spare column of -1 the kernels must not follow */
    }
    const int64_t n_blocks = used + 3;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks),
            *bt = malloc(sizeof(int32_t) * (size_t)(S * max_blocks));
    int32_t *qs = malloc(sizeof(int32_t) * (size_t)(S + 1)), *cl = malloc(sizeof(int32_t) * (size_t)S);
    int32_t *sl = malloc(sizeof(int32_t) * (size_t)(N > 0 ? N : 1));
    if (!perm || !bt || !qs || !cl || !sl) gt_die("paged test tables");
    shuffled_ids(perm, n_blocks, 0x9e3779b97f4a7c15ull ^ (uint64_t)(n_blocks * 131 + D));
    int64_t next = 0, row = 0;
    qs[0] = 0;
    for (int s = 0; s < S; s++) {
        const int64_t nb = (seq[s].ctx + bs - 1) / bs;
        for (int64_t b = 0; b < max_blocks; b++) bt[s * max_blocks + b] = b < nb ? perm[next++] : -1;
        for (int64_t j = 0; j < seq[s].ql; j++, row++) {
            const int64_t pos = seq[s].ctx - seq[s].ql + j;
            sl[row] = seq[s].stale ? -1 : (int32_t)(bt[s * max_blocks + pos / bs] * bs + pos % bs);
        }
        qs[s + 1] = (int32_t)row;
        cl[s] = (int32_t)seq[s].ctx;
    }
    gt_t tbt = gt_ints(2, SHP(S, max_blocks), bt), tqs = gt_ints(1, SHP(S + 1), qs), tcl = gt_ints(1, SHP(S), cl);
    gt_t tsl = gt_ints(1, SHP(N), sl);
    gt_t qkv = R3(act, 1, N, (Hq + 2 * Hkv) * D, 1.0);
    gt_t q = gt_unflatten(gt_narrow(qkv, 2, 0, Hq * D), 2, D);
    gt_t k = gt_unflatten(gt_narrow(qkv, 2, Hq * D, Hkv * D), 2, D);
    gt_t v = gt_unflatten(gt_narrow(qkv, 2, (Hq + Hkv) * D, Hkv * D), 2, D);
    gt_t kc = R4(cdt, n_blocks, bs, Hkv, D, 1.0), vc = R4(cdt, n_blocks, bs, Hkv, D, 1.0);
    const int64_t ld = Hq * D + 8;
    gt_t ofull = O3(act, 1, N, ld);
    gt_t o = gt_unflatten(gt_narrow(ofull, 2, 0, Hq * D), 2, D);
    char tag[112], pad[128];
    snprintf(tag, sizeof tag, "%s H%" PRId64 "/%" PRId64 " D%" PRId64 " bs%" PRId64 " %s act %s cache", what, Hq, Hkv,
             D, bs, dtn(act), dtn(cdt));

    BOTH("kv_cache_write", H->ops->kv_cache_write(H, &kc.h, &vc.h, &k.h, &v.h, &tsl.h),
         G->ops->kv_cache_write(G, &kc.g, &vc.g, &k.g, &v.g, &tsl.g));
    gt_round_host(&kc); /* the CPU stored f32 in the host copy: the same rounding the cache dtype applies */
    gt_round_host(&vc);
    gt_check(nm("kv_cache_write k_cache %s", tag), kc, 0.0);
    gt_check(nm("kv_cache_write v_cache %s", tag), vc, 0.0);

    const size_t hws = H->ops->paged_attention_workspace_bytes(H, N, S, Hq, D, max_ctx);
    const size_t gws = G->ops->paged_attention_workspace_bytes(G, N, S, Hq, D, max_ctx);
    void *hw = malloc(hws), *gw = NULL;
    if (!hw) gt_die("paged host workspace");
    GT_OK(cai_device_alloc(G, gws, "paged attention workspace", &gw));
    BOTH("paged_attention",
         H->ops->paged_attention(H, &o.h, &q.h, &kc.h, &vc.h, &tbt.h, &tqs.h, &tcl.h, max_ctx, 0.0f, hw, hws),
         G->ops->paged_attention(G, &o.g, &q.g, &kc.g, &vc.g, &tbt.g, &tqs.g, &tcl.g, max_ctx, 0.0f, gw, gws));
    /* f32 outputs: the CPU's sequential f32 sums over thousands of keys are themselves off by ~1e-6 */
    const double tol = act == CAI_DTYPE_F32 ? 2e-5 : gt_tol(act);
    for (int s = 0; s < S; s++) {
        if (seq[s].ql == 0) continue;
        gt_check(nm("paged_attention q%" PRId64 " ctx%" PRId64 "%s %s", seq[s].ql, seq[s].ctx,
                    seq[s].stale ? " stale" : "", tag),
                 gt_narrow(o, 1, qs[s], seq[s].ql), tol);
    }
    snprintf(pad, sizeof pad, "paged_attention %s", tag); /* fp_untouched formats its name with nm() */
    fp_untouched(pad, ofull, N, ld, Hq * D);
    printf("  (N %" PRId64 ", max_ctx %" PRId64 ", gpu workspace %zu bytes)\n", N, max_ctx, gws);
    free(hw);
    cai_device_dealloc(G, gw);
    free(perm);
    free(bt);
    free(qs);
    free(cl);
    free(sl);
}

/* decode steps: one query over 1, 17, 600 and 5000 cached tokens */
static const pg_seq pg_decode[] = {{1, 1, 0}, {1, 17, 0}, {1, 600, 0}, {1, 5000, 0}};
/* a step of a serving engine: fresh prompts, a prefill chunk over a cached
 * prefix, decodes, a sequence with no queries this step and one whose keys
 * were written earlier (stale); few tokens, so split-KV runs it */
static const pg_seq pg_mixed[] = {{1, 1, 0},    {37, 37, 0}, {0, 20, 0}, {64, 600, 0},
                                  {1, 5000, 0}, {2, 9, 1},   {1, 17, 0}, {150, 150, 0}};
/* a long prefill chunk among decodes: enough tokens for the one-pass kernel */
static const pg_seq pg_large[] = {{1100, 1300, 0}, {1, 17, 0}, {1, 600, 0}, {200, 200, 0}, {1, 5000, 0}};
#define PG_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void f32_paged(void) {
    const cai_dtype F = CAI_DTYPE_F32, B = CAI_DTYPE_BF16, F16 = CAI_DTYPE_F16;
    paged_case("decode", F, F, 8, 2, 128, 16, 8192, pg_decode, PG_N(pg_decode));
    paged_case("decode", F, B, 4, 4, 64, 256, 5000, pg_decode, PG_N(pg_decode));
    paged_case("decode", F, F16, 8, 2, 64, 256, 6000, pg_decode, PG_N(pg_decode));
    paged_case("decode", F, B, 8, 2, 256, 16, 5000, pg_decode, PG_N(pg_decode));
    paged_case("mixed", F, B, 8, 2, 128, 16, 5000, pg_mixed, PG_N(pg_mixed));
    paged_case("mixed", F, F16, 4, 4, 64, 256, 5000, pg_mixed, PG_N(pg_mixed));
    paged_case("large", F, F, 4, 4, 64, 256, 5000, pg_large, PG_N(pg_large));
    paged_case("large", F, B, 8, 2, 128, 16, 5000, pg_large, PG_N(pg_large));
    /* shapes off the beaten path: head_dim 80 and 36 (a partial 8-chunk),
     * groups of 3 and of 16 (two head chunks), a block size that is no
     * power of two */
    paged_case("mixed", F, B, 12, 4, 80, 24, 5000, pg_mixed, PG_N(pg_mixed));
    paged_case("decode", F, F16, 16, 1, 36, 16, 5000, pg_decode, PG_N(pg_decode));
    paged_case("mixed", F, F, 6, 2, 96, 16, 5000, pg_mixed, PG_N(pg_mixed));
}

static void bf16_paged(void) {
    const cai_dtype F = CAI_DTYPE_F32, B = CAI_DTYPE_BF16, F16 = CAI_DTYPE_F16;
    paged_case("decode", B, B, 8, 2, 128, 16, 8192, pg_decode, PG_N(pg_decode));
    paged_case("decode", B, F16, 8, 8, 64, 256, 5000, pg_decode, PG_N(pg_decode));
    paged_case("decode", B, F, 8, 2, 64, 16, 5000, pg_decode, PG_N(pg_decode));
    paged_case("mixed", B, B, 8, 2, 128, 256, 5000, pg_mixed, PG_N(pg_mixed));
    paged_case("mixed", B, F, 4, 4, 64, 16, 5000, pg_mixed, PG_N(pg_mixed));
    paged_case("large", B, B, 8, 2, 128, 16, 5000, pg_large, PG_N(pg_large));
    paged_case("large", B, F16, 4, 4, 64, 256, 5000, pg_large, PG_N(pg_large));
    paged_case("mixed", F16, B, 8, 2, 96, 16, 5000, pg_mixed, PG_N(pg_mixed)); /* f16 activations */
    /* the tensor-core kernel (16-bit q and cache of one type, head_dim 64 or 128): Llama 1B's heads, a group of
     * 32 (two blocks of 16 heads) with a block size that is no power of two, f16 with a group of 16 */
    paged_case("decode", B, B, 32, 8, 64, 16, 8192, pg_decode, PG_N(pg_decode));
    paged_case("mixed", B, B, 32, 1, 64, 24, 5000, pg_mixed, PG_N(pg_mixed));
    paged_case("large", F16, F16, 16, 1, 128, 16, 5000, pg_large, PG_N(pg_large));
}

/* `call` fails with status `want` and an error message naming `op`. */
#define OP_ERR(label, op, call, want)                                                                    \
    do {                                                                                                 \
        cai_status st_ = (call);                                                                         \
        gt_expect(label, st_ == (want) && strstr(cai_error_message(), op) != NULL, cai_error_message()); \
        cai_error_clear();                                                                               \
    } while (0)

/* Shapes are refused before anything runs, naming the op; index values are
 * the device's: out of range they are reported at the next synchronisation. */
static void t_paged_errors(void) {
    const cai_dtype F = CAI_DTYPE_F32;
    const int64_t bs = 16, D = 64, n_blocks = 4;
    const int32_t bt[] = {2, 0}, qs[] = {0, 1}, cl[] = {20}, sl[] = {5};
    gt_t tbt = gt_ints(2, SHP(1, 2), bt), tqs = gt_ints(1, SHP(2), qs), tcl = gt_ints(1, SHP(1), cl);
    gt_t tsl = gt_ints(1, SHP(1), sl);
    gt_t q = R4(F, 1, 1, 4, D, 1.0), o = O4(F, 1, 1, 4, D), k = R4(F, 1, 1, 2, D, 1.0), v = R4(F, 1, 1, 2, D, 1.0);
    gt_t kc = R4(F, n_blocks, bs, 2, D, 1.0), vc = R4(F, n_blocks, bs, 2, D, 1.0);
    gt_t kc3 = R4(F, n_blocks, bs, 3, D, 1.0), vc3 = R4(F, n_blocks, bs, 3, D, 1.0);
    const size_t ws = G->ops->paged_attention_workspace_bytes(G, 1, 1, 4, D, 64);
    void *gw = NULL;
    GT_OK(cai_device_alloc(G, ws, "paged attention workspace", &gw));
    OP_ERR("paged_attention 3 kv heads for 4 query heads -> INVALID_ARG", "paged_attention",
           G->ops->paged_attention(G, &o.g, &q.g, &kc3.g, &vc3.g, &tbt.g, &tqs.g, &tcl.g, 64, 0.0f, gw, ws),
           CAI_ERR_INVALID_ARG);
    OP_ERR("paged_attention workspace too small -> INVALID_ARG", "paged_attention",
           G->ops->paged_attention(G, &o.g, &q.g, &kc.g, &vc.g, &tbt.g, &tqs.g, &tcl.g, 64, 0.0f, gw, 16),
           CAI_ERR_INVALID_ARG);
    OP_ERR("paged_attention block table on the host -> INVALID_ARG", "paged_attention",
           G->ops->paged_attention(G, &o.g, &q.g, &kc.g, &vc.g, &tbt.h, &tqs.g, &tcl.g, 64, 0.0f, gw, ws),
           CAI_ERR_INVALID_ARG);
    OP_ERR("paged_attention q_start of S entries -> INVALID_ARG", "paged_attention",
           G->ops->paged_attention(G, &o.g, &q.g, &kc.g, &vc.g, &tbt.g, &tcl.g, &tcl.g, 64, 0.0f, gw, ws),
           CAI_ERR_INVALID_ARG);
    gt_t kcn = gt_narrow(kc, 3, 0, D / 2), vcn = gt_narrow(vc, 3, 0, D / 2);
    OP_ERR("kv_cache_write cache not contiguous -> INVALID_ARG", "kv_cache_write",
           G->ops->kv_cache_write(G, &kcn.g, &vcn.g, &k.g, &v.g, &tsl.g), CAI_ERR_INVALID_ARG);
    gt_t q320 = R4(F, 1, 1, 1, 320, 1.0), o320 = O4(F, 1, 1, 1, 320), kc320 = R4(F, 2, bs, 1, 320, 1.0);
    OP_ERR("paged_attention head_dim 320 -> UNSUPPORTED", "paged_attention",
           G->ops->paged_attention(G, &o320.g, &q320.g, &kc320.g, &kc320.g, &tbt.g, &tqs.g, &tcl.g, 64, 0.0f, gw, ws),
           CAI_ERR_UNSUPPORTED);

    /* a slot past the cache: nothing written for it, reported at the sync */
    const int32_t bad_sl[] = {(int32_t)(n_blocks * bs + 3)};
    gt_t tbad = gt_ints(1, SHP(1), bad_sl);
    cai_status sg = G->ops->kv_cache_write(G, &kc.g, &vc.g, &k.g, &v.g, &tbad.g);
    cai_status ss = cai_device_sync(G);
    gt_expect("kv_cache_write slot past the cache: reported at sync",
              sg == CAI_OK && ss == CAI_ERR_INVALID_ARG && strstr(cai_error_message(), "slots[0] = 67") != NULL,
              cai_error_message());
    cai_error_clear();
    gt_check("kv_cache_write bad slot: cache untouched", kc, 0.0);
    /* a block id past the pool */
    const int32_t bad_bt[] = {2, 9};
    gt_t tbb = gt_ints(2, SHP(1, 2), bad_bt);
    sg = G->ops->paged_attention(G, &o.g, &q.g, &kc.g, &vc.g, &tbb.g, &tqs.g, &tcl.g, 64, 0.0f, gw, ws);
    ss = cai_device_sync(G);
    gt_expect("paged_attention block id past the pool: reported at sync",
              sg == CAI_OK && ss == CAI_ERR_INVALID_ARG &&
                  strstr(cai_error_message(), "block_tables[0, 1] = 9 is not a block of the 4") != NULL,
              cai_error_message());
    cai_error_clear();
    /* ctx_len beyond max_ctx: zero rows */
    const int32_t long_cl[] = {30};
    gt_t tlc = gt_ints(1, SHP(1), long_cl);
    sg = G->ops->paged_attention(G, &o.g, &q.g, &kc.g, &vc.g, &tbt.g, &tqs.g, &tlc.g, 24, 0.0f, gw, ws);
    ss = cai_device_sync(G);
    gt_expect("paged_attention ctx_len past max_ctx: reported at sync",
              sg == CAI_OK && ss == CAI_ERR_INVALID_ARG &&
                  strstr(cai_error_message(), "sequence 0 has 1 queries and ctx_len 30") != NULL,
              cai_error_message());
    cai_error_clear();
    float *got = gt_download(o.b);
    int zeros = 1;
    for (int64_t e = 0; e < o.b->n; e++) zeros &= got[e] == 0.0f;
    free(got);
    gt_expect("paged_attention bad sequence: its rows are zeros", zeros, NULL);
    /* the same in a prefill of three rows on the tensor cores (bf16, query tiles) */
    const cai_dtype B = CAI_DTYPE_BF16;
    const int32_t qs3[] = {0, 3};
    gt_t tq3 = gt_ints(1, SHP(2), qs3);
    gt_t q3 = R4(B, 1, 3, 4, D, 1.0), o3 = R4(B, 1, 3, 4, D, 1.0);
    gt_t kcb = R4(B, n_blocks, bs, 2, D, 1.0), vcb = R4(B, n_blocks, bs, 2, D, 1.0);
    sg = G->ops->paged_attention(G, &o3.g, &q3.g, &kcb.g, &vcb.g, &tbt.g, &tq3.g, &tlc.g, 24, 0.0f, gw, ws);
    ss = cai_device_sync(G);
    gt_expect("paged_attention prefill, ctx_len past max_ctx: reported at sync",
              sg == CAI_OK && ss == CAI_ERR_INVALID_ARG &&
                  strstr(cai_error_message(), "sequence 0 has 3 queries and ctx_len 30") != NULL,
              cai_error_message());
    cai_error_clear();
    got = gt_download(o3.b);
    zeros = 1;
    for (int64_t e = 0; e < o3.b->n; e++) zeros &= got[e] == 0.0f;
    free(got);
    gt_expect("paged_attention prefill bad sequence: its rows are zeros", zeros, NULL);
    gt_expect("device error record cleared after the reports", cai_device_sync(G) == CAI_OK, NULL);
    cai_device_dealloc(G, gw);
}

/* rope_kv_cache_write: against the host (rotation, then the cache write),
 * and bit for bit against rope_fwd then kv_cache_write on this device (one
 * kernel where it fits: 16-bit activations, D = 2 * half with half % 8 ==
 * 0; the two ops otherwise). A slot of -1 writes nothing. */
static void t_rope_kv(cai_dtype act, cai_dtype cdt, int64_t Hq, int64_t Hkv, int64_t D) {
    const int64_t P = 64, N = 5, nb = 6, bs = 8, W = (Hq + 2 * Hkv) * D;
    char tag[96];
    snprintf(tag, sizeof tag, "H%" PRId64 "/%" PRId64 " D%" PRId64 " %s act %s cache", Hq, Hkv, D, dtn(act), dtn(cdt));
    gt_t cs = O2(CAI_DTYPE_F32, P, D / 2), sn = O2(CAI_DTYPE_F32, P, D / 2);
    BOTH("rope_tables", H->ops->rope_tables(H, &cs.h, &sn.h, 10000.0), G->ops->rope_tables(G, &cs.g, &sn.g, 10000.0));
    const int32_t sl[5] = {3, -1, 17, 47, 0}, ps[5] = {0, 7, 63, 12, 31};
    gt_t tsl = gt_ints(1, SHP(N), sl), tps = gt_ints(1, SHP(N), ps);
    gt_t qkv = R3(act, 1, N, W, 1.0), kc = R4(cdt, nb, bs, Hkv, D, 1.0), vc = R4(cdt, nb, bs, Hkv, D, 1.0);
    gt_t qkv2 = O3(act, 1, N, W), kc2 = O4(cdt, nb, bs, Hkv, D), vc2 = O4(cdt, nb, bs, Hkv, D);
    GT_OK(G->ops->copy(G, &qkv2.g, &qkv.g));
    GT_OK(G->ops->copy(G, &kc2.g, &kc.g));
    GT_OK(G->ops->copy(G, &vc2.g, &vc.g));
    gt_t qk = gt_unflatten(gt_narrow(qkv, 2, 0, (Hq + Hkv) * D), 2, D);
    gt_t v = gt_unflatten(gt_narrow(qkv, 2, (Hq + Hkv) * D, Hkv * D), 2, D);
    BOTH("rope_kv_cache_write", H->ops->rope_kv_cache_write(H, &qk.h, &kc.h, &vc.h, &v.h, &tsl.h, &cs.h, &sn.h, &tps.h),
         G->ops->rope_kv_cache_write(G, &qk.g, &kc.g, &vc.g, &v.g, &tsl.g, &cs.g, &sn.g, &tps.g));
    gt_round_host(&kc);
    gt_round_host(&vc);
    gt_check(nm("rope_kv_cache_write qkv %s", tag), qkv, gt_tol(act));
    gt_check(nm("rope_kv_cache_write k_cache %s", tag), kc, gt_tol(act));
    gt_check(nm("rope_kv_cache_write v_cache %s", tag), vc, 0.0);
    gt_t qk2 = gt_unflatten(gt_narrow(qkv2, 2, 0, (Hq + Hkv) * D), 2, D);
    gt_t k2 = gt_unflatten(gt_narrow(qkv2, 2, Hq * D, Hkv * D), 2, D);
    gt_t v2 = gt_unflatten(gt_narrow(qkv2, 2, (Hq + Hkv) * D, Hkv * D), 2, D);
    GT_OK(G->ops->rope_fwd(G, &qk2.g, &qk2.g, &cs.g, &sn.g, &tps.g, 0));
    GT_OK(G->ops->kv_cache_write(G, &kc2.g, &vc2.g, &k2.g, &v2.g, &tsl.g));
    const gt_t *one[3] = {&qkv, &kc, &vc}, *two[3] = {&qkv2, &kc2, &vc2};
    const char *what[3] = {"qkv", "k_cache", "v_cache"};
    for (int i = 0; i < 3; i++) {
        float *a = gt_download(one[i]->b), *b = gt_download(two[i]->b);
        gt_expect(nm("rope_kv_cache_write %s %s equals rope_fwd, kv_cache_write bitwise", what[i], tag),
                  memcmp(a, b, (size_t)one[i]->b->n * sizeof(float)) == 0, "");
        free(a);
        free(b);
    }
    gt_t bad = gt_unflatten(gt_narrow(qkv, 2, 0, Hkv * D), 2, D); /* no query heads */
    OP_ERR("rope_kv_cache_write qk without query heads -> INVALID_ARG", "rope_kv_cache_write",
           G->ops->rope_kv_cache_write(G, &bad.g, &kc.g, &vc.g, &v.g, &tsl.g, &cs.g, &sn.g, &tps.g),
           CAI_ERR_INVALID_ARG);
}
static void rope_kv(void) {
    const cai_dtype F = CAI_DTYPE_F32, B = CAI_DTYPE_BF16, F16 = CAI_DTYPE_F16;
    t_rope_kv(B, B, 32, 8, 64);   /* the Llama 1B shape's heads: one kernel */
    t_rope_kv(F16, F, 4, 4, 128); /* f16, an f32 cache: one kernel */
    t_rope_kv(B, F16, 6, 2, 48);  /* half 24: one kernel */
    t_rope_kv(B, B, 4, 2, 40);    /* half 20: the two ops */
    t_rope_kv(F, B, 8, 2, 64);    /* f32 activations: the two ops */
}

/* ------------------------------------------------------------------ grouped products */

/* grouped_linear_fwd and grouped_linear_bwd (dinp = and +=, f32 dweight
 * accumulated onto random values) against the CPU table: blocks of at
 * least 1024 rows on average take one cuBLASLt product each, smaller ones
 * cuBLAS's grouped launch (CAI_CUDA_GROUPED=auto), so both ways run. */
static void grouped_case(cai_dtype dt, const int64_t *rows, int n, int64_t IC, int64_t OC) {
    int64_t R = 0;
    for (int b = 0; b < n; b++) R += rows[b];
    char tag[96];
    snprintf(tag, sizeof tag, "%s %d blocks of %lld rows %lld->%lld", cai_dtype_name(dt), n, (long long)(R / n),
             (long long)IC, (long long)OC);
    const double tol = dt == CAI_DTYPE_F32 ? 1e-5 : 2e-2;
    gt_t x = R2(dt, R + 3, IC, 1.0), y = O2(dt, R + 3, OC), dy = R2(dt, R + 3, OC, 1.0), dx = R2(dt, R + 3, IC, 1.0);
    cai_tensor wh[16], wg[16], gh[16], gg[16];
    gt_t w[16], g[16];
    for (int b = 0; b < n; b++) {
        w[b] = R2(dt, OC, IC, 0.05);
        g[b] = R2(CAI_DTYPE_F32, OC, IC, 1.0);
        wh[b] = w[b].h, wg[b] = w[b].g, gh[b] = g[b].h, gg[b] = g[b].g;
    }
    BOTH("grouped_linear_fwd", H->ops->grouped_linear_fwd(H, &y.h, &x.h, wh, rows, n),
         G->ops->grouped_linear_fwd(G, &y.g, &x.g, wg, rows, n));
    gt_round_host(&y);
    gt_check(nm("grouped_linear_fwd %s", tag), gt_narrow(y, 0, 0, R), tol);
    for (int acc = 0; acc < 2; acc++) {
        BOTH("grouped_linear_bwd", H->ops->grouped_linear_bwd(H, &dx.h, gh, &dy.h, &x.h, wh, rows, n, acc),
             G->ops->grouped_linear_bwd(G, &dx.g, gg, &dy.g, &x.g, wg, rows, n, acc));
        gt_round_host(&dx);
        gt_check(nm("grouped_linear_bwd %s dinp accum %d", tag, acc), dx, tol);
        for (int b = 0; b < n; b++) gt_check(nm("grouped_linear_bwd %s dweight[%d] accum %d", tag, b, acc), g[b], tol);
    }
    gt_release_all();
}

static void t_grouped(cai_dtype dt) {
    static const int64_t big[4] = {1100, 0, 1517, 1560}, small[5] = {5, 40, 0, 77, 1};
    grouped_case(dt, big, 4, 256, 384);
    grouped_case(dt, small, 5, 256, 384);
    grouped_case(dt, big, 4, 72, 40);
}
static void f32_grouped(void) { t_grouped(CAI_DTYPE_F32); }
static void bf16_grouped(void) { t_grouped(CAI_DTYPE_BF16); }

/* ------------------------------------------------------------------ the router */

/* n bytes of device memory holding a copy of h (NULL: left as allocated). */
static void *rt_dev(size_t bytes, const void *h) {
    void *d;
    GT_OK(cai_device_alloc(G, bytes, "router test", &d));
    if (h) GT_OK(cai_device_copy(G, d, h, bytes, CAI_COPY_H2D));
    return d;
}

static void rt_get(void *h, const void *d, size_t bytes) { GT_OK(cai_device_copy(G, h, d, bytes, CAI_COPY_D2H)); }

/* An I32 tensor's device values equal its host values (-1 included, which
 * gt_check would read as a NaN pattern). */
static void rt_same_ints(const char *name, gt_t t) {
    const size_t bytes = (size_t)t.b->n * sizeof(int32_t);
    int32_t *got = malloc(bytes > 0 ? bytes : 1);
    if (!got) gt_die("int download");
    rt_get(got, t.b->gbuf, bytes);
    int64_t first = -1;
    for (int64_t i = 0; i < t.b->n && first < 0; i++)
        if (got[i] != ((const int32_t *)t.b->hbuf)[i]) first = i;
    char note[64];
    snprintf(note, sizeof note, "first difference at %lld", (long long)first);
    gt_expect(name, first < 0, first < 0 ? NULL : note);
    free(got);
}

/* moe_route, moe_assign, moe_router_sums and moe_router_bwd against the
 * CPU table on the same logits (every third token's logits tied in pairs,
 * so the tie rule counts): the choices and pos equal, the counts equal,
 * the floats within the last bits of exp and the device's contractions
 * (1e-6 of the largest; the sums 1e-12), repeat runs bitwise. */
static void router_case(int64_t N, int64_t E, int k, cai_route_fn fn, int norm, int64_t capacity) {
    const cai_dtype F = CAI_DTYPE_F32;
    char tag[96];
    snprintf(tag, sizeof tag, "N %lld E %lld k %d fn %d norm %d cap %lld", (long long)N, (long long)E, k, (int)fn, norm,
             (long long)capacity);
    gt_t logits = R2(F, N, E, 2.0);
    for (int64_t t = 0; t < N; t += 3)
        for (int64_t e = 1; e < E; e += 2) logits.b->hbuf[t * E + e] = logits.b->hbuf[t * E + e - 1];
    gt_upload(&logits);
    gt_t probs = O2(F, N, E), lse = O1(F, N), sel = gt_out(CAI_DTYPE_I32, 1, SHP(N * k)), wts = O1(F, N * k);
    BOTH("moe_route", H->ops->moe_route(H, &sel.h, &wts.h, &probs.h, &lse.h, &logits.h, fn, norm),
         G->ops->moe_route(G, &sel.g, &wts.g, &probs.g, &lse.g, &logits.g, fn, norm));
    rt_same_ints(nm("moe_route %s sel", tag), sel);
    gt_check(nm("moe_route %s wts", tag), wts, 1e-6);
    gt_check(nm("moe_route %s probs", tag), probs, 1e-6);
    gt_check(nm("moe_route %s lse", tag), lse, 1e-6);

    const size_t eb = (size_t)E * sizeof(int64_t);
    int64_t *hl = calloc((size_t)E, sizeof *hl), *hk = calloc((size_t)E, sizeof *hk), *gl = malloc(eb),
            *gk = malloc(eb);
    void *dl = rt_dev(eb, NULL), *dk = rt_dev(eb, NULL);
    cai_tensor thl = cai_tensor_1d(H, hl, CAI_DTYPE_I64, E), thk = cai_tensor_1d(H, hk, CAI_DTYPE_I64, E);
    cai_tensor tgl = cai_tensor_1d(G, dl, CAI_DTYPE_I64, E), tgk = cai_tensor_1d(G, dk, CAI_DTYPE_I64, E);
    gt_t pos = gt_out(CAI_DTYPE_I32, 1, SHP(N * k));
    BOTH("moe_assign", H->ops->moe_assign(H, &pos.h, &thl, &thk, &sel.h, capacity),
         G->ops->moe_assign(G, &pos.g, &tgl, &tgk, &sel.g, capacity));
    rt_same_ints(nm("moe_assign %s pos", tag), pos);
    rt_get(gl, dl, eb);
    rt_get(gk, dk, eb);
    gt_expect(nm("moe_assign %s load and kept", tag), !memcmp(gl, hl, eb) && !memcmp(gk, hk, eb), NULL);

    const size_t sb = (size_t)(E + 1) * sizeof(double);
    double *hs = malloc(sb), *gs = malloc(sb), *gs2 = malloc(sb);
    void *ds = rt_dev(sb, NULL);
    cai_tensor ths = cai_tensor_1d(H, hs, CAI_DTYPE_F64, E + 1), tgs = cai_tensor_1d(G, ds, CAI_DTYPE_F64, E + 1);
    BOTH("moe_router_sums", H->ops->moe_router_sums(H, &ths, &probs.h, &lse.h, fn),
         G->ops->moe_router_sums(G, &tgs, &probs.g, &lse.g, fn));
    rt_get(gs, ds, sb);
    double big = 0.0, err = 0.0;
    for (int64_t e = 0; e <= E; e++) {
        big = fmax(big, fabs(hs[e]));
        err = fmax(err, fabs(gs[e] - hs[e]));
    }
    /* the device's probs differ from the host's in the last bits (checked above) */
    gt_expect(nm("moe_router_sums %s within 1e-6 of the largest", tag), err <= 1e-6 * fmax(big, 1e-30), NULL);
    GT_OK(G->ops->moe_router_sums(G, &tgs, &probs.g, &lse.g, fn));
    rt_get(gs2, ds, sb);
    gt_expect(nm("moe_router_sums %s repeat bitwise", tag), !memcmp(gs, gs2, sb), NULL);

    /* the backward on the host's own forward state, uploaded, so only the op differs */
    gt_t dw = R1(F, N * k, 1.0), dlog = O2(F, N, E);
    GT_OK(cai_device_copy(G, probs.b->gbuf, probs.b->hbuf, (size_t)(N * E) * 4, CAI_COPY_H2D));
    GT_OK(cai_device_copy(G, lse.b->gbuf, lse.b->hbuf, (size_t)N * 4, CAI_COPY_H2D));
    GT_OK(cai_device_copy(G, wts.b->gbuf, wts.b->hbuf, (size_t)(N * k) * 4, CAI_COPY_H2D));
    GT_OK(cai_device_copy(G, dl, hl, eb, CAI_COPY_H2D));
    const double as = 0.01 * (double)E / ((double)N * N), zs = 1e-3;
    BOTH("moe_router_bwd",
         H->ops->moe_router_bwd(H, &dlog.h, &logits.h, &probs.h, &lse.h, &sel.h, &wts.h, &dw.h, &thl, fn, norm, as, zs),
         G->ops->moe_router_bwd(G, &dlog.g, &logits.g, &probs.g, &lse.g, &sel.g, &wts.g, &dw.g, &tgl, fn, norm, as,
                                zs));
    gt_check(nm("moe_router_bwd %s dlogits", tag), dlog, 1e-6);
    gt_expect(nm("router %s: no device error", tag), cai_device_sync(G) == CAI_OK, cai_error_message());
    cai_error_clear();
    cai_device_dealloc(G, dl);
    cai_device_dealloc(G, dk);
    cai_device_dealloc(G, ds);
    free(hl), free(hk), free(gl), free(gk), free(hs), free(gs), free(gs2);
    gt_release_all();
}

static void t_router(void) {
    static const cai_route_fn fns[] = {CAI_ROUTE_SOFTMAX, CAI_ROUTE_TOPK_SOFTMAX, CAI_ROUTE_SIGMOID};
    for (int f = 0; f < 3; f++)
        for (int norm = 0; norm < 2; norm++) {
            router_case(37, 8, 2, fns[f], norm, 37);
            router_case(1000, 8, 2, fns[f], norm, 250); /* capacity 1.0: some dropped */
        }
    router_case(1, 8, 1, CAI_ROUTE_SOFTMAX, 1, 1);
    router_case(8192, 8, 2, CAI_ROUTE_SOFTMAX, 1, 8192); /* the benchmark's shape */
    router_case(3000, 64, 8, CAI_ROUTE_SOFTMAX, 1, 3000);
    router_case(3000, 64, 6, CAI_ROUTE_SIGMOID, 1, 200);
    router_case(5000, 16, 16, CAI_ROUTE_TOPK_SOFTMAX, 0, 5000); /* k = E */

    /* data errors are the device's: reported at the next synchronisation */
    const cai_dtype F = CAI_DTYPE_F32;
    gt_t logits = R2(F, 4, 8, 1.0), probs = O2(F, 4, 8), lse = O1(F, 4), sel = gt_out(CAI_DTYPE_I32, 1, SHP(8)),
         wts = O1(F, 8), pos = gt_out(CAI_DTYPE_I32, 1, SHP(8));
    logits.b->hbuf[2 * 8 + 5] = NAN;
    gt_upload(&logits);
    cai_status sg = G->ops->moe_route(G, &sel.g, &wts.g, &probs.g, &lse.g, &logits.g, CAI_ROUTE_SOFTMAX, 1);
    cai_status ss = cai_device_sync(G);
    gt_expect("moe_route non-finite logit: reported at sync",
              sg == CAI_OK && ss == CAI_ERR_INVALID_ARG &&
                  strstr(cai_error_message(), "logit of token 2 for expert 5 (of 8) is not finite") != NULL,
              cai_error_message());
    cai_error_clear();
    const int32_t bad[8] = {0, 1, 2, 9, 4, 5, 6, 7};
    gt_t tbad = gt_ints(1, SHP(8), bad);
    int64_t *z = NULL;
    void *dl = rt_dev(16 * sizeof *z, NULL);
    cai_tensor tl = cai_tensor_1d(G, dl, CAI_DTYPE_I64, 8), tk = cai_tensor_1d(G, (int64_t *)dl + 8, CAI_DTYPE_I64, 8);
    sg = G->ops->moe_assign(G, &pos.g, &tl, &tk, &tbad.g, 8);
    ss = cai_device_sync(G);
    gt_expect("moe_assign sel outside the experts: reported at sync",
              sg == CAI_OK && ss == CAI_ERR_INVALID_ARG &&
                  strstr(cai_error_message(), "sel[3] = 9 is not one of the 8 experts") != NULL,
              cai_error_message());
    cai_error_clear();
    OP_ERR("moe_assign capacity 0 -> INVALID_ARG", "moe_assign", G->ops->moe_assign(G, &pos.g, &tl, &tk, &tbad.g, 0),
           CAI_ERR_INVALID_ARG);
    gt_t sel9 = gt_out(CAI_DTYPE_I32, 1, SHP(9));
    OP_ERR("moe_route sel of 9 for 4 tokens -> INVALID_ARG", "moe_route",
           G->ops->moe_route(G, &sel9.g, &wts.g, &probs.g, &lse.g, &logits.g, CAI_ROUTE_SOFTMAX, 1),
           CAI_ERR_INVALID_ARG);
    OP_ERR("moe_route logits on the host -> INVALID_ARG", "moe_route",
           G->ops->moe_route(G, &sel.g, &wts.g, &probs.g, &lse.g, &logits.h, CAI_ROUTE_SOFTMAX, 1),
           CAI_ERR_INVALID_ARG);
    gt_expect("device error record cleared after the reports", cai_device_sync(G) == CAI_OK, NULL);
    cai_device_dealloc(G, dl);
    gt_release_all();
}

/* ------------------------------------------------------------------ mixture of experts */

/* pos for N tokens of k choices into S = N k + 5 grouped rows: a shuffled
 * permutation (no row named twice; the 5 spare rows and the rows of dropped
 * choices are never named, so they must keep their sentinel values), with
 * about one choice in five dropped (-1) when `drop`. */
static gt_t moe_pos(int64_t N, int k, int64_t S, int drop, int32_t *out) {
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)S);
    if (!perm) gt_die("moe test permutation");
    uint64_t rng = shuffled_ids(perm, S, 0x2545f4914f6cdd1dull ^ (uint64_t)(N * 977 + k * 31 + drop));
    for (int64_t i = 0; i < N * k; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = drop && (rng >> 33) % 5 == 0 ? -1 : perm[i];
    }
    free(perm);
    return gt_ints(1, SHP(N * k), out);
}

/* Rows [n, C] as a view of a [n, C + pad] buffer *full (pad 0: contiguous), random or NaN. */
static gt_t moe_rows(cai_dtype dt, int64_t n, int64_t C, int64_t pad, int random, gt_t *full) {
    *full = random ? R2(dt, n, C + pad, 1.0) : O2(dt, n, C + pad);
    return pad ? gt_narrow(*full, 1, 0, C) : *full;
}

/* The device copy of t equals its earlier download `prev` bit for bit (repeat runs). */
static void moe_same(const char *name, gt_t t, const float *prev) {
    float *got = gt_download(t.b);
    gt_expect(name, memcmp(got, prev, sizeof(float) * (size_t)t.b->n) == 0, NULL);
    free(got);
}

/* moe_permute, moe_combine_fwd (w and w NULL, accum 0 and 1) and
 * moe_combine_bwd against the CPU table. Grouped buffers start random
 * (sentinels) so that the rows pos does not name, and padding columns, are
 * checked untouched. The CPU's f32 results are rounded to the dtype before
 * comparing: permute and dye must match bitwise, y within the FMA
 * contraction of its sums, dw (a dot of C products, f32 on the GPU) within
 * 1e-4 of the largest. Repeat runs must give the same bits. */
static void moe_case(cai_dtype dt, int64_t N, int k, int64_t C, int drop, int64_t pad) {
    const int64_t S = N * k + 5;
    int32_t *pv = malloc(sizeof(int32_t) * (size_t)(N * k));
    if (!pv) gt_die("moe test pos");
    gt_t pos = moe_pos(N, k, S, drop, pv);
    char tag[96];
    snprintf(tag, sizeof tag, "N%" PRId64 " k%d C%" PRId64 "%s ld%" PRId64, N, k, C, drop ? " drops" : "", C + pad);
    const double tol = dt == CAI_DTYPE_F32 ? 1e-5 : gt_tol(dt);

    gt_t full, xe_full, dye_full;
    gt_t x = moe_rows(dt, N, C, pad, 1, &full), xe = moe_rows(dt, S, C, pad, 1, &xe_full);
    BOTH("moe_permute", H->ops->moe_permute(H, &xe.h, &x.h, &pos.h), G->ops->moe_permute(G, &xe.g, &x.g, &pos.g));
    gt_check(nm("moe_permute %s (xe, spare rows kept)", tag), xe_full, 0.0);

    gt_t ye = moe_rows(dt, S, C, pad, 1, &full), w = R1(CAI_DTYPE_F32, N * k, 1.0);
    for (int acc = 0; acc <= 1; acc++)
        for (int wn = 0; wn <= 1; wn++) {
            gt_t y = moe_rows(dt, N, C, pad, acc, &full);
            const cai_tensor *wh = wn ? NULL : &w.h, *wg = wn ? NULL : &w.g;
            BOTH("moe_combine_fwd", H->ops->moe_combine_fwd(H, &y.h, &ye.h, &pos.h, wh, acc),
                 G->ops->moe_combine_fwd(G, &y.g, &ye.g, &pos.g, wg, acc));
            gt_round_host(&y);
            gt_check(nm("moe_combine_fwd %s accum %d%s", tag, acc, wn ? " w NULL" : ""), y, tol);
            if (acc || wn) continue;
            float *first = gt_download(y.b);
            GT_OK(G->ops->moe_combine_fwd(G, &y.g, &ye.g, &pos.g, &w.g, 0));
            moe_same(nm("moe_combine_fwd %s repeat bitwise", tag), y, first);
            free(first);
        }

    gt_t dy = moe_rows(dt, N, C, pad, 1, &full), dye = moe_rows(dt, S, C, pad, 1, &dye_full);
    gt_t dw = O1(CAI_DTYPE_F32, N * k);
    BOTH("moe_combine_bwd", H->ops->moe_combine_bwd(H, &dye.h, &dw.h, &dy.h, &ye.h, &pos.h, &w.h),
         G->ops->moe_combine_bwd(G, &dye.g, &dw.g, &dy.g, &ye.g, &pos.g, &w.g));
    gt_round_host(&dye_full);
    gt_check(nm("moe_combine_bwd %s dye (spare rows kept)", tag), dye_full, 0.0);
    gt_check(nm("moe_combine_bwd %s dw", tag), dw, 1e-4);
    float *got = gt_download(dw.b);
    int zero = 1;
    for (int64_t i = 0; i < N * k; i++)
        if (pv[i] < 0) zero &= got[i] == 0.0f;
    gt_expect(nm("moe_combine_bwd %s dw of dropped choices is 0", tag), zero, NULL);
    GT_OK(G->ops->moe_combine_bwd(G, &dye.g, &dw.g, &dy.g, &ye.g, &pos.g, &w.g));
    moe_same(nm("moe_combine_bwd %s dw repeat bitwise", tag), dw, got);
    free(got);
    free(pv);
    gt_expect(nm("moe %s: no device error", tag), cai_device_sync(G) == CAI_OK, cai_error_message());
    cai_error_clear();
    gt_release_all(); /* the large cases would otherwise pile up */
}

static void t_moe(cai_dtype dt) {
    if (!H->ops->moe_permute || !H->ops->moe_combine_fwd || !H->ops->moe_combine_bwd) {
        gt_expect("the CPU table has moe_permute/combine (the reference)", 0, NULL);
        return;
    }
    static const int64_t Ns[] = {1, 37, 1000};
    static const int ks[] = {1, 2, 8};
    /* narrow rows: 64 (16-byte vector paths) and 73 (rows not 16-byte aligned: element-wise paths) */
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            moe_case(dt, Ns[a], ks[b], 64, 1, 0);
            moe_case(dt, Ns[a], ks[b], 73, 1, 0);
        }
    moe_case(dt, 37, 2, 64, 0, 0); /* nothing dropped */
    moe_case(dt, 37, 8, 768, 1, 0);
    moe_case(dt, 1000, 2, 768, 1, 0);
    moe_case(dt, 1, 8, 4096, 1, 0);
    moe_case(dt, 37, 2, 4096, 0, 0);
    moe_case(dt, 1000, 8, 4096, 1, 0);
    /* every row set as a view of a wider buffer (its padding columns checked untouched): aligned
     * row starts (ld 776; ld 80 with a partial last 8-chunk on the vector paths) and misaligned
     * ones (ld 76) */
    moe_case(dt, 37, 2, 768, 1, 8);
    moe_case(dt, 37, 2, 73, 1, 7);
    moe_case(dt, 37, 2, 73, 1, 3);
}

static void f32_moe(void) { t_moe(CAI_DTYPE_F32); }
static void bf16_moe(void) { t_moe(CAI_DTYPE_BF16); }

/* Shapes and dtypes are refused before anything runs, naming the op; a pos
 * past the grouped rows is the device's to find: skipped and reported at
 * the next synchronisation. */
static void t_moe_errors(void) {
    const cai_dtype F = CAI_DTYPE_F32;
    const int32_t pv[] = {0, 3, -1, 1, 2, 4};
    gt_t pos = gt_ints(1, SHP(6), pv);
    gt_t x = R2(F, 3, 16, 1.0), xe = R2(F, 6, 16, 1.0), xe_b = R2(CAI_DTYPE_BF16, 6, 16, 1.0);
    gt_t xe_w = R2(F, 6, 17, 1.0), w = R1(F, 6, 1.0), w5 = R1(F, 5, 1.0), dw = O1(F, 6);
    const int32_t p5v[] = {0, 1, 2, 3, 4};
    gt_t pos5 = gt_ints(1, SHP(5), p5v);
    OP_ERR("moe_permute xe of another dtype -> INVALID_ARG", "moe_permute",
           G->ops->moe_permute(G, &xe_b.g, &x.g, &pos.g), CAI_ERR_INVALID_ARG);
    OP_ERR("moe_permute xe of another width -> INVALID_ARG", "moe_permute",
           G->ops->moe_permute(G, &xe_w.g, &x.g, &pos.g), CAI_ERR_INVALID_ARG);
    OP_ERR("moe_permute pos of 5 for 3 rows -> INVALID_ARG", "moe_permute",
           G->ops->moe_permute(G, &xe.g, &x.g, &pos5.g), CAI_ERR_INVALID_ARG);
    OP_ERR("moe_permute pos of f32 -> INVALID_ARG", "moe_permute", G->ops->moe_permute(G, &xe.g, &x.g, &w.g),
           CAI_ERR_INVALID_ARG);
    OP_ERR("moe_permute pos on the host -> INVALID_ARG", "moe_permute", G->ops->moe_permute(G, &xe.g, &x.g, &pos.h),
           CAI_ERR_INVALID_ARG);
    OP_ERR("moe_combine_fwd w of 5 for 6 choices -> INVALID_ARG", "moe_combine_fwd",
           G->ops->moe_combine_fwd(G, &x.g, &xe.g, &pos.g, &w5.g, 0), CAI_ERR_INVALID_ARG);
    OP_ERR("moe_combine_bwd w NULL -> INVALID_ARG", "moe_combine_bwd",
           G->ops->moe_combine_bwd(G, &xe.g, &dw.g, &x.g, &xe.g, &pos.g, NULL), CAI_ERR_INVALID_ARG);
    OP_ERR("moe_combine_bwd dye of another width -> INVALID_ARG", "moe_combine_bwd",
           G->ops->moe_combine_bwd(G, &xe_w.g, &dw.g, &x.g, &xe.g, &pos.g, &w.g), CAI_ERR_INVALID_ARG);
    const int32_t bad[] = {0, 3, -1, 1, 9, 4};
    gt_t tbad = gt_ints(1, SHP(6), bad);
    cai_status sg = G->ops->moe_permute(G, &xe.g, &x.g, &tbad.g);
    cai_status ss = cai_device_sync(G);
    gt_expect("moe_permute pos past the grouped rows: reported at sync", sg == CAI_OK && ss != CAI_OK,
              cai_error_message());
    cai_error_clear();
    /* the kept rows were copied, the bad one skipped: the host does the same by hand */
    for (int64_t i = 0; i < 6; i++)
        if (bad[i] >= 0 && bad[i] < 6) memcpy(xe.b->hbuf + bad[i] * 16, x.b->hbuf + (i / 2) * 16, 16 * sizeof(float));
    gt_check("moe_permute bad pos: other rows copied, nothing else written", xe, 0.0);
    gt_expect("moe device error record cleared after the report", cai_device_sync(G) == CAI_OK, NULL);
}

/* ------------------------------------------------------------------ main */

typedef struct {
    const char *name;
    void (*fn)(void);
} test_entry;

static void f32_blas1(void) { t_blas1(CAI_DTYPE_F32); }
static void bf16_blas1(void) { t_blas1(CAI_DTYPE_BF16); }
static void f32_reduce(void) { t_reduce(CAI_DTYPE_F32); }
static void bf16_reduce(void) { t_reduce(CAI_DTYPE_BF16); }
static void f32_matmul(void) { t_matmul(CAI_DTYPE_F32, CAI_DTYPE_F32); }
static void bf16_matmul(void) {
    t_matmul(CAI_DTYPE_BF16, CAI_DTYPE_BF16);
    t_matmul(CAI_DTYPE_BF16, CAI_DTYPE_F32);
}
static void f16_matmul(void) { t_matmul(CAI_DTYPE_F16, CAI_DTYPE_F16); }
static void f32_linear(void) { t_linear(CAI_DTYPE_F32, CAI_DTYPE_F32); }
static void bf16_linear(void) {
    t_linear(CAI_DTYPE_BF16, CAI_DTYPE_BF16);
    t_linear(CAI_DTYPE_BF16, CAI_DTYPE_F32);
}
static void f32_linear_gelu(void) { t_linear_gelu(CAI_DTYPE_F32); }
static void bf16_linear_gelu(void) { t_linear_gelu(CAI_DTYPE_BF16); }
static void f32_norms(void) {
    t_layernorm(CAI_DTYPE_F32, 1);
    t_layernorm(CAI_DTYPE_F32, 0);
    t_rmsnorm(CAI_DTYPE_F32);
}
static void bf16_norms(void) {
    t_layernorm(CAI_DTYPE_BF16, 1);
    t_rmsnorm(CAI_DTYPE_BF16);
}
static void f32_act(void) {
    t_activations(CAI_DTYPE_F32);
    t_rope(CAI_DTYPE_F32);
}
static void bf16_act(void) {
    t_activations(CAI_DTYPE_BF16);
    t_rope(CAI_DTYPE_BF16);
}
static void f32_attn(void) {
    t_attention(CAI_DTYPE_F32);
    t_attn_merge(CAI_DTYPE_F32);
}
/* default: cuDNN's fused attention where the build has it and it takes the
 * case, else flash at D 64/128, WMMA otherwise */
static void bf16_attn(void) {
    t_attention(CAI_DTYPE_BF16);
    t_attn_merge(CAI_DTYPE_BF16);
}
static void bf16_attn_flash(void) {
    cai_cuda_attn_force(CAI_CUDA_ATTN_FLASH); /* the project's own kernels even where cuDNN is built */
    t_attention(CAI_DTYPE_BF16);
    t_attention(CAI_DTYPE_F16);
    cai_cuda_attn_force(CAI_CUDA_ATTN_AUTO);
}
static void bf16_attn_tc(void) {
    cai_cuda_attn_force(CAI_CUDA_ATTN_TC); /* the WMMA kernels */
    t_attention(CAI_DTYPE_BF16);
    cai_cuda_attn_force(CAI_CUDA_ATTN_AUTO);
}
static void f16_attn(void) { t_attention(CAI_DTYPE_F16); } /* flash at D 64/128, CUDA cores otherwise */
static void bf16_attn_simt(void) {
    cai_cuda_attn_force(CAI_CUDA_ATTN_SIMT); /* the f32 CUDA-core kernels on bf16 storage */
    t_attention(CAI_DTYPE_BF16);
    cai_cuda_attn_force(CAI_CUDA_ATTN_AUTO);
}
/* the host backend (self-check) has f32 only */
static void argmax_all(void) {
    t_argmax(CAI_DTYPE_F32);
    if (G->kind == CAI_DEVICE_HOST) return;
    t_argmax(CAI_DTYPE_BF16);
    t_argmax(CAI_DTYPE_F16);
}
static void f32_embed(void) {
    t_embedding(CAI_DTYPE_F32);
    t_xent(CAI_DTYPE_F32);
}
static void bf16_embed(void) {
    t_embedding(CAI_DTYPE_BF16);
    t_xent(CAI_DTYPE_BF16);
}

/* issue #10: the matmul family again on a second device made with the
 * knob set to value (the backend reads its knobs at device creation). */
static void matmuls_on_a_device_with(const char *env, const char *value) {
    cai_device_t *plain = G;
    cai_status st = cai_knob_set(env, value);
    if (st == CAI_OK) st = cai_device_init(&G, CAI_DEVICE_CUDA, 0, 0);
    cai_knob_set(env, NULL);
    gt_expect(nm("second device with %s=%s", env, value), st == CAI_OK, st == CAI_OK ? NULL : cai_error_message());
    if (st != CAI_OK) {
        cai_error_clear();
        G = plain;
        return;
    }
    t_matmul(CAI_DTYPE_F32, CAI_DTYPE_F32);
    t_matmul_large();
    t_matmul(CAI_DTYPE_BF16, CAI_DTYPE_F32);
    t_linear(CAI_DTYPE_BF16, CAI_DTYPE_BF16);
    t_linear_gelu(CAI_DTYPE_BF16);
    t_linear_residual(CAI_DTYPE_BF16);
    if (cai_device_sync(G) != CAI_OK) {
        printf("  device error on the device with %s=%s: %s\n", env, value, cai_error_message());
        cai_error_clear();
        g_fail++;
    }
    gt_release_all(); /* its buffers live on that device */
    cai_device_free(G);
    G = plain;
}

/* CAI_CUBLASLT_AUTOTUNE: the heuristic's 8 best algorithms timed for every
 * new shape; results must still be the CPU's, and the in-place accumulating
 * cases (beta != 0 on c; dweight +=) show that the timed trial runs never
 * add into the real output. */
static void tuned_matmuls(void) { matmuls_on_a_device_with("CAI_CUBLASLT_AUTOTUNE", "8"); }

static const test_entry tests[] = {
    {"fill/copy", t_fill_copy},
    {"copy_sr", t_copy_sr},
    {"blas1 f32", f32_blas1},
    {"blas1 bf16", bf16_blas1},
    {"reduce f32", f32_reduce},
    {"reduce bf16", bf16_reduce},
    {"matmul f32", f32_matmul},
    {"matmul large", t_matmul_large},
    {"matmul bf16", bf16_matmul},
    {"matmul f16", f16_matmul},
    {"linear f32", f32_linear},
    {"linear bf16", bf16_linear},
    {"linear+gelu f32", f32_linear_gelu},
    {"linear+gelu bf16", bf16_linear_gelu},
    {"norms f32", f32_norms},
    {"norms bf16", bf16_norms},
    {"act/rope f32", f32_act},
    {"act/rope bf16", bf16_act},
    {"attention f32", f32_attn},
    {"attention bf16", bf16_attn},
    {"attention flash bf16/f16", bf16_attn_flash},
    {"attention tc bf16", bf16_attn_tc},
    {"attention f16", f16_attn},
    {"attention simt bf16", bf16_attn_simt},
    {"embed/xent f32", f32_embed},
    {"embed/xent bf16", bf16_embed},
    {"adamw", t_adamw},
    {"fast f32", f32_fast},
    {"fast bf16", bf16_fast},
    {"fast f16", f16_fast},
    {"errors", t_errors},
    /* issue #10: norm and cross-entropy fast paths at training shapes */
    {"norms large f32/bf16/f16", i10_norms},
    {"xent large f32/bf16/f16", i10_xent},
    /* issue #10: residual add fused into the output projections */
    {"linear+residual f32", f32_linear_residual},
    {"linear+residual bf16", bf16_linear_residual},
    /* issue #10: embedding_bwd with runs of thousands of rows (tiled dwte sums) */
    {"embedding long runs f32", f32_emb_long},
    {"embedding long runs bf16", bf16_emb_long},
    /* issue #10: cuBLASLt algorithms chosen by timing */
    {"matmuls autotuned bf16/f32", tuned_matmuls},
    /* the paged KV cache of inference */
    {"paged kv f32 act", f32_paged},
    {"paged kv bf16 act", bf16_paged},
    {"paged kv errors", t_paged_errors},
    {"paged kv rope + cache write", rope_kv},
    {"paged kv argmax", argmax_all},
    {"paged kv decode linear (few rows)", decode_linear},
    /* mixture of experts: token rows <-> rows grouped by expert */
    {"moe f32", f32_moe},
    {"moe bf16", bf16_moe},
    {"moe errors", t_moe_errors},
    {"moe router", t_router},
    {"moe grouped products f32", f32_grouped},
    {"moe grouped products bf16", bf16_grouped},
};

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* keep every line if a kernel brings the process down */
    const char *only = argc > 1 ? argv[1] : NULL;
    /* CAI_GPU_TEST_SELFCHECK=1 runs the harness host-against-host (no GPU
     * needed): every parity check must then report 0, which validates the
     * harness itself; the GPU-only expectations are expected to fail. */
    const char *self = getenv("CAI_GPU_TEST_SELFCHECK");
    int selfcheck = self && self[0] == '1';
    cai_status st = cai_device_init(&G, selfcheck ? CAI_DEVICE_HOST : CAI_DEVICE_CUDA, 0, selfcheck ? 1 : 0);
    if (st == CAI_ERR_UNSUPPORTED) {
        printf("SKIP: %s\n", cai_error_message());
        return 77;
    }
    if (st != CAI_OK) gt_die("cai_device_init(CUDA)");
    GT_OK(cai_device_init(&H, CAI_DEVICE_HOST, 0, 0));
    printf("GPU parity tests on %s against %s\n", G->name, H->name);
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (only && !strstr(tests[i].name, only)) continue;
        if (selfcheck && strstr(tests[i].name, "16")) continue; /* the CPU backend computes in f32 only */
        printf("[%s]\n", tests[i].name);
        tests[i].fn();
        cai_status s = cai_device_sync(G);
        if (s != CAI_OK) {
            printf("  device error after %s: %s\n", tests[i].name, cai_error_message());
            cai_error_clear();
            g_fail++;
        }
        gt_release_all();
        fflush(stdout);
    }
    printf("%d checks passed, %d failed\n", g_pass, g_fail);
    cai_device_free(G);
    cai_device_free(H);
    return g_fail ? 1 : 0;
}
