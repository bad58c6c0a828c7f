/* The op table: every numeric kernel a transformer needs for training and
 * inference, behind one struct of function pointers per backend (DESIGN
 * decision 4). Model code calls dev->ops->layernorm_fwd(dev, ...) and never
 * knows which backend runs it; the CPU backend (OpenBLAS sgemm + OpenMP) and
 * the later CUDA backend implement the same table. See docs/ops.md.
 *
 * Conventions shared by every op (details in docs/ops.md):
 *  - Activations are row-major [B, T, C] (or [N, C] with N = B*T); any leading
 *    dimensions are flattened into rows. Attention tensors are [B, T, H, D]
 *    (head-major inside a token), so [B, T, H*D] = [B, T, C] needs no permute,
 *    and q/k/v may be strided views into one fused QKV buffer.
 *  - Linear weights are [out, in] (torch.nn.Linear layout): y = x W^T + b.
 *    Every linear forward and backward then maps onto one sgemm, no copies.
 *  - Tensors must have a contiguous last dimension; an op that accepts other
 *    row strides says so ("strided rows"). Outputs must not overlap inputs
 *    unless the op says "may alias".
 *  - Gradients of parameters (dweight, dbias, dwte, ...) are ACCUMULATED (+=),
 *    so microbatches accumulate for free; zero them at the start of a step.
 *    Gradients of activations are OVERWRITTEN, except where an op takes
 *    `accum_dinp` (norms and linear, whose input gradients usually land on the
 *    residual stream). Any gradient output may be NULL to skip it.
 *  - dtypes: the table is dtype-generic (each tensor carries its dtype). The
 *    CPU backend computes in f32 and requires F32 tensors everywhere except
 *    copy/convert (F32/BF16/F16), token ids and targets (I32) and AdamW's
 *    optional low-precision parameter copy. Other dtypes give
 *    CAI_ERR_UNSUPPORTED naming the op and argument.
 *  - No op allocates. Scratch comes from a caller-provided workspace whose
 *    size a *_workspace_bytes query returns (attention is the only user).
 *  - Results are deterministic from run to run. Changing the thread count may
 *    change the last bits of matmul/linear results and of sum/sumsq, never
 *    of the other ops.
 *  - Every op validates shapes and dtypes and fails with CAI_ERR_INVALID_ARG
 *    (op and argument named, what would fit) before touching memory.
 *  - No op is collective: tensor/sequence-parallel callers combine partial
 *    results (vocab-parallel cross-entropy statistics, grad-norm partial sums,
 *    row-parallel matmul outputs) with colossal/cluster.h collectives.
 */
#ifndef COLOSSAL_OPS_H
#define COLOSSAL_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "colossal/base.h"
#include "colossal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Attention masking and scaling. Query row i (0-based in q) may see key row j
 * (0-based in k) iff !causal or j <= i + causal_offset, and, with a window,
 * i + causal_offset - j < window. causal_offset = (position of q row 0) -
 * (position of k row 0): 0 for training self-attention, Tk - Tq for decoding
 * against a KV cache, a multiple of the block length for ring attention. A row
 * that sees no key gets output 0 and lse = -inf. */
typedef struct {
    float scale; /* softmax scale; 0 means 1/sqrt(head_dim) */
    int causal;  /* 1 for decoder self-attention */
    int64_t causal_offset;
    int64_t window; /* sliding window length in keys; 0 = unlimited */
    /* Document masking for packed sequences, or NULL. doc_ids I32 [B,T]
     * (contiguous, on the op's device) for causal self-attention (Tq == Tk,
     * causal_offset 0): query row i of batch b further sees key j only when
     * doc_ids[b,j] == doc_ids[b,i]. Ids must not decrease along a row, so
     * every document is one contiguous run; any value, padding included,
     * is a document of its own. CPU only: the CUDA backend refuses it
     * (CAI_ERR_UNSUPPORTED). */
    const cai_tensor *doc_ids;
} cai_attn_params;

/* AdamW (Loshchilov & Hutter; same arithmetic as torch.optim.AdamW):
 *   g  = grad * grad_scale
 *   p -= lr * weight_decay * p            (only when apply_decay)
 *   m  = beta1 m + (1 - beta1) g
 *   v  = beta2 v + (1 - beta2) g^2
 *   p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int64_t step;     /* 1 for the first update (bias correction) */
    float grad_scale; /* clip coefficient times 1/loss-scale; 1 = none */
} cai_adamw_params;

/* A mixture-of-experts router's scoring function (moe_route and the ops
 * that follow it). Every one ranks experts by the logit. */
typedef enum {
    CAI_ROUTE_SOFTMAX = 0,  /* probs = softmax over the experts; weights = the chosen probs */
    CAI_ROUTE_TOPK_SOFTMAX, /* probs = softmax; weights = softmax over the k chosen logits */
    CAI_ROUTE_SIGMOID       /* probs = sigmoid per expert; weights = the chosen probs */
} cai_route_fn;

/* What fp8_gemm does with the product p before it lands in c (a backend
 * fuses it into the product where it can, e.g. cuBLASLt's epilogues):
 *   t = p + beta * (c_in ? c_in : c) + bias
 *   CAI_FP8_ACT_NONE:  c = t
 *   CAI_FP8_ACT_GELU:  aux = t, c = gelu(t)   (gelu_fwd's tanh form; aux is the
 *                      pre-activation that gelu_bwd needs)
 *   CAI_FP8_ACT_DGELU: c = gelu'(aux) * t      (gelu_bwd; no bias)
 * (GELU and DGELU: beta 0 and no c_in)
 * c_in [M,N] and aux [M,N] in c's dtype, bias [N] in c's dtype; none may
 * overlap c except c_in == c. Same as the product, copy, bias_add and
 * gelu_fwd / gelu_bwd in turn, up to rounding (a fused bf16 c is rounded
 * once). */
typedef enum { CAI_FP8_ACT_NONE = 0, CAI_FP8_ACT_GELU, CAI_FP8_ACT_DGELU } cai_fp8_act;
typedef struct {
    const cai_tensor *c_in, *bias; /* NULL: none */
    cai_fp8_act act;
    cai_tensor *aux; /* GELU: written; DGELU: read */
} cai_fp8_epilogue;

typedef struct cai_ops {
    const char *backend; /* "cpu", "cuda" */

    /* ---- device memory (used by cai_device_alloc & co., rarely called directly) */
    cai_status (*alloc)(cai_device_t *dev, size_t bytes, const char *what, void **out);
    void (*dealloc)(cai_device_t *dev, void *ptr);
    cai_status (*alloc_staging)(cai_device_t *dev, size_t bytes, const char *what, void **out);
    void (*dealloc_staging)(cai_device_t *dev, void *ptr);
    cai_status (*memcpy)(cai_device_t *dev, void *dst, const void *src, size_t bytes, cai_copy_kind kind);
    cai_status (*sync)(cai_device_t *dev);

    /* ---- device graphs (NULL where the backend has none: the host). Between
     * graph_begin and graph_end the ops issued on the device are recorded
     * instead of run; graph_launch runs them again with the same arguments
     * (pointers and sizes; the buffers' contents may have changed). An op
     * that would have to wait for the device (a host read of device memory)
     * must not be issued while recording. graph_end with graph NULL discards
     * the recording (after a failed op). */
    cai_status (*graph_begin)(cai_device_t *dev);
    cai_status (*graph_end)(cai_device_t *dev, void **graph);
    cai_status (*graph_launch)(cai_device_t *dev, void *graph);
    void (*graph_free)(cai_device_t *dev, void *graph);

    /* ---- elementwise and data movement. All take any shape; strided rows ok. */

    /* x[:] = value (any float dtype; I32 gets (int32_t)value). */
    cai_status (*fill)(cai_device_t *dev, cai_tensor *x, float value);
    /* dst = src elementwise for equal shapes, any strides, converting between
     * F32/BF16/F16 with round-to-nearest-even. */
    cai_status (*copy)(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src);
    /* dst = round_stochastic(src): src F32, dst BF16/F16 (F32: plain copy).
     * Element i (row-major index) uses cai_sr_bits(seed, stream, index_offset + i). */
    cai_status (*copy_sr)(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src, uint64_t seed, uint64_t stream,
                          uint64_t index_offset);
    /* x *= alpha. */
    cai_status (*scale)(cai_device_t *dev, cai_tensor *x, float alpha);
    /* y += alpha * x. */
    cai_status (*axpy)(cai_device_t *dev, cai_tensor *y, float alpha, const cai_tensor *x);
    /* out = a + b (residual add). out may alias a or b. */
    cai_status (*add)(cai_device_t *dev, cai_tensor *out, const cai_tensor *a, const cai_tensor *b);
    /* out[0] += sum(x) and out[0] += sum(x^2); out is a 1-element F32 or F64
     * tensor on the device. sumsq is the global-norm building block: each
     * rank accumulates its shards, the caller all-reduces, then takes sqrt.
     * A non-finite result flags overflow (loss scaling). */
    cai_status (*sum)(cai_device_t *dev, cai_tensor *out, const cai_tensor *x);
    cai_status (*sumsq)(cai_device_t *dev, cai_tensor *out, const cai_tensor *x);

    /* ---- matrix multiply */

    /* c = alpha * op(a) @ op(b) + beta * c, op(x) = x or x^T (last two dims).
     * 2-D: a [M,K] (or [K,M] with trans_a), b [K,N] (or [N,K]), c [M,N].
     * Batched: leading dims of a, b, c are a batch; b (or a) with no batch
     * dims is shared by every batch entry; with b 2-D and !trans_a the batch
     * is folded into M (one gemm). Strided rows ok; beta = 0 ignores c's
     * old contents (NaN-safe). */
    cai_status (*matmul)(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, int trans_a, const cai_tensor *b,
                         int trans_b, float alpha, float beta);
    /* out [N,OC] = inp [N,IC] @ weight[OC,IC]^T + bias[OC] (bias may be NULL).
     * N is all leading dims of inp/out (e.g. [B,T,C]). */
    cai_status (*linear_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight,
                             const cai_tensor *bias);
    /* dinp [N,IC] (=, or += with accum_dinp) dout @ weight;
     * dweight [OC,IC] += dout^T @ inp; dbias [OC] += sum over rows of dout.
     * Any of dinp, dweight, dbias may be NULL. */
    cai_status (*linear_bwd)(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias,
                             const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight, int accum_dinp);
    /* Linear layer followed by GELU (GPT-2's MLP up projection), one op so a
     * backend can fuse the GELU into the matmul's epilogue:
     * pre [N,OC] = inp [N,IC] @ weight[OC,IC]^T + bias[OC] (bias may be
     * NULL), act [N,OC] = gelu(pre) (tanh approximation, as gelu_fwd). pre
     * is kept for linear_bwd_dgelu. Same as linear_fwd then gelu_fwd, up to
     * rounding (a fused bf16 act is rounded once, from the f32 pre). act and
     * pre must not overlap each other or the inputs. */
    cai_status (*linear_gelu_fwd)(cai_device_t *dev, cai_tensor *act, cai_tensor *pre, const cai_tensor *inp,
                                  const cai_tensor *weight, const cai_tensor *bias);
    /* A Llama MLP's gate and up projections with their SwiGLU (inference),
     * one op so a backend can read both weights in one pass where the rows
     * are few: act [N,F] = swiglu(inp @ w_gate^T, inp @ w_up^T), the two
     * products rounded to act's dtype first, so act equals linear_fwd,
     * linear_fwd, swiglu_fwd bit for bit. gate and up [N,F] are scratch
     * for the unfused path; their contents afterwards are unspecified. No
     * bias; nothing overlaps. */
    cai_status (*linear_swiglu_fwd)(cai_device_t *dev, cai_tensor *act, cai_tensor *gate, cai_tensor *up,
                                    const cai_tensor *inp, const cai_tensor *w_gate, const cai_tensor *w_up);
    /* Backward of a linear layer whose input was act = gelu(pre), through the
     * GELU: dpre [N,IC] = gelu'(pre) * (dout @ weight) (overwritten);
     * dweight [OC,IC] += dout^T @ inp (inp = act); dbias [OC] += sum over rows
     * of dout. dweight, dbias may be NULL; dpre is required and must not
     * overlap pre, dout or inp. Same as linear_bwd (accum_dinp = 0) then
     * gelu_bwd in place, up to rounding. */
    cai_status (*linear_bwd_dgelu)(cai_device_t *dev, cai_tensor *dpre, cai_tensor *dweight, cai_tensor *dbias,
                                   const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                                   const cai_tensor *pre);
    /* Linear layer plus a residual (the transformer block's output
     * projections), one op so a backend can add the residual inside the
     * matmul (cuBLASLt's beta * C): out [N,OC] = inp [N,IC] @
     * weight[OC,IC]^T + bias[OC] + residual [N,OC]; bias may be NULL. out
     * may be residual itself (in place) but must not overlap inp. Same as
     * linear_fwd into a temporary then add(out, residual, tmp), up to
     * rounding (a fused bf16 out is rounded once, from the f32 sum of
     * product, bias and residual, instead of twice). */
    cai_status (*linear_residual_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp,
                                      const cai_tensor *weight, const cai_tensor *bias, const cai_tensor *residual);
    /* x [N,C] += bias [C] (in place). */
    cai_status (*bias_add)(cai_device_t *dev, cai_tensor *x, const cai_tensor *bias);
    /* dbias [C] += sum over rows of dout [N,C]. */
    cai_status (*bias_grad)(cai_device_t *dev, cai_tensor *dbias, const cai_tensor *dout);

    /* ---- FP8 (docs/fp8.md; the formats and the meta layout in colossal/tensor.h)
     * A tensor x is cast to FP8 codes q = fp8(x * scale) (U8 tensors) with
     * the per-tensor scaling state `meta` (F32 [CAI_FP8_META_LEN(H)], on the
     * device); products of codes are dequantised by both operands'
     * 1/scale, read from their metas on the device (no host round trip). */

    /* q [R,C] and/or qt [C,R] (its transpose) = fp8(x [R,C] * scale), x
     * F32 (BF16/F16 too on CUDA) with contiguous rows, q and qt U8
     * contiguous, either may be NULL (then only the amax is recorded).
     * scale is meta[1], except with `current` or a meta[1] of 0: then
     * scale = cai_fp8_scale_from_amax(amax(x), fmt, margin, 0), written to
     * meta[1] with 1/scale in meta[0] (an all-zero x leaves them 0 and
     * casts with scale 1). Always meta[2] = max(meta[2], amax(x)). */
    cai_status (*fp8_cast)(cai_device_t *dev, cai_tensor *q, cai_tensor *qt, const cai_tensor *x, cai_tensor *meta,
                           cai_fp8_format fmt, int current, int margin);
    /* Scratch bytes fp8_gemm needs for these sizes. */
    size_t (*fp8_gemm_workspace_bytes)(const cai_device_t *dev, int64_t M, int64_t N, int64_t K);
    /* c [M,N] = (a [M,K] b [N,K]^T) * a_meta[1] * b_meta[1] + beta * c,
     * then the epilogue ep (NULL: none; cai_fp8_epilogue):
     * a and b FP8 codes (U8, contiguous, K-major: the layout Hopper's FP8
     * tensor cores take) in a_fmt and b_fmt, not both E5M2; the product
     * accumulates in f32; beta 0 (c's old contents ignored) or 1. c F32
     * (BF16 too on CUDA), contiguous rows. CUDA: M, N and K multiples of
     * 16 (CAI_ERR_UNSUPPORTED otherwise). */
    cai_status (*fp8_gemm)(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, cai_fp8_format a_fmt,
                           const cai_tensor *a_meta, const cai_tensor *b, cai_fp8_format b_fmt,
                           const cai_tensor *b_meta, float beta, const cai_fp8_epilogue *ep, void *workspace,
                           size_t workspace_bytes);
    /* The receiving side of a reduction that crossed the wire as FP8
     * (zero.reduce_dtype=fp8): y [n] F32 = beta * y + the sum over s = 0,
     * 1, ..., S-1, in that order, of decode(q[s]) * 1/scale_s, q [S,n] U8
     * codes in fmt (contiguous), metas [S * stride] F32 the senders' metas
     * (stride a multiple of 4, >= CAI_FP8_META_LEN(1)): 1/scale_s is
     * metas[s * stride], or NaN when the amax the sender's cast saw
     * (metas[s * stride + 2]) was not finite, so an overflow survives the
     * exchange. beta 0 or 1. */
    cai_status (*fp8_dequant_sum)(cai_device_t *dev, cai_tensor *y, const cai_tensor *q, const cai_tensor *metas,
                                  int64_t stride, cai_fp8_format fmt, float beta);

    /* ---- normalisation (statistics in f32, saved for backward) */

    /* out = (inp - mean) * rstd * weight + bias over the last dim C;
     * mean, rstd [N] (may be NULL for inference); bias may be NULL. */
    cai_status (*layernorm_fwd)(cai_device_t *dev, cai_tensor *out, cai_tensor *mean, cai_tensor *rstd,
                                const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias, float eps);
    /* dinp (= or +=), dweight +=, dbias += (dbias may be NULL when there is no bias). */
    cai_status (*layernorm_bwd)(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias,
                                const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                                const cai_tensor *mean, const cai_tensor *rstd, int accum_dinp);
    /* RMSNorm (Llama): out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps). */
    cai_status (*rmsnorm_fwd)(cai_device_t *dev, cai_tensor *out, cai_tensor *rstd, const cai_tensor *inp,
                              const cai_tensor *weight, float eps);
    cai_status (*rmsnorm_bwd)(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout,
                              const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *rstd, int accum_dinp);

    /* ---- activations (any shape; strided rows ok) */

    /* GELU, tanh approximation (GPT-2 "gelu_new"). out may alias inp (then
     * backward cannot run). */
    cai_status (*gelu_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp);
    /* dinp = gelu'(inp) * dout; dinp may alias dout. */
    cai_status (*gelu_bwd)(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *inp, const cai_tensor *dout);
    /* SwiGLU (Llama MLP): out = silu(gate) * up, silu(x) = x / (1 + e^-x).
     * gate and up may be two halves of one fused [N, 2F] buffer (narrowed views). */
    cai_status (*swiglu_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *gate, const cai_tensor *up);
    /* dgate = dout * up * silu'(gate), dup = dout * silu(gate); both required
     * (they may be the two halves of one fused gradient buffer). */
    cai_status (*swiglu_bwd)(cai_device_t *dev, cai_tensor *dgate, cai_tensor *dup, const cai_tensor *dout,
                             const cai_tensor *gate, const cai_tensor *up);

    /* ---- mixture of experts: token rows <-> rows grouped by expert */

    /* pos (I32 [N * k]) names, for token t's j-th choice (i = t k + j), its
     * row in the expert-grouped buffer, or -1 when it was dropped. Token
     * rows x, y, dy are [N, C]; grouped rows xe, ye, dye are [S, C] with
     * S >= every pos + 1; all of one dtype (F32, BF16 or F16). w and dw are
     * F32 [N * k]. Sums run over j in order, in f32 from the destination's
     * value (accum) or 0, rounded once. */

    /* xe[pos[i]] = x[i / k] for every pos[i] >= 0; other rows untouched. */
    cai_status (*moe_permute)(cai_device_t *dev, cai_tensor *xe, const cai_tensor *x, const cai_tensor *pos);
    /* y[t] = (accum ? y[t] : 0) + sum_j w[tk + j] ye[pos[tk + j]] over the
     * kept choices; w NULL weighs every choice 1 (the permutation's
     * backward). */
    cai_status (*moe_combine_fwd)(cai_device_t *dev, cai_tensor *y, const cai_tensor *ye, const cai_tensor *pos,
                                  const cai_tensor *w, int accum);
    /* dye[pos[i]] = w[i] dy[i / k] and dw[i] = <dy[i / k], ye[pos[i]]> (0
     * when pos[i] < 0; the dot accumulated in at least f32). */
    cai_status (*moe_combine_bwd)(cai_device_t *dev, cai_tensor *dye, cai_tensor *dw, const cai_tensor *dy,
                                  const cai_tensor *ye, const cai_tensor *pos, const cai_tensor *w);

    /* The router, per token on F32 data in double arithmetic, rounded once
     * per stored value (every backend the same formulas, so they agree but
     * for the last bits of exp and contractions): logits [N, E] -> lse [N] (log-sum-exp), probs
     * [N, E] (fn's scores), sel (I32 [N * k]: the k largest logits, largest
     * first, equal logits to the lower expert) and wts (F32 [N * k]: the
     * chosen probs, divided by their sum when norm_topk; TOPK_SOFTMAX: a
     * softmax over the k chosen logits). A non-finite logit is an error
     * naming token and expert (a device backend reports it at the next
     * synchronisation). */
    cai_status (*moe_route)(cai_device_t *dev, cai_tensor *sel, cai_tensor *wts, cai_tensor *probs, cai_tensor *lse,
                            const cai_tensor *logits, cai_route_fn fn, int norm_topk);
    /* Capacity and grouping of sel (I32 [n]) over E experts: load (I64 [E])
     * the choices of each expert, kept (I64 [E]) min(load, capacity), pos
     * (I32 [n]) the row of choice i in the expert-grouped buffer (experts
     * in order, choices in index order inside one) or -1 when its expert
     * already has `capacity` earlier choices. */
    cai_status (*moe_assign)(cai_device_t *dev, cai_tensor *pos, cai_tensor *load, cai_tensor *kept,
                             const cai_tensor *sel, int64_t capacity);
    /* sums (F64 [E + 1]): sums[e] = sum over tokens of probs[t, e] (SIGMOID:
     * divided by the token's sum of probs), sums[E] = sum of lse^2; the
     * load-balancing and z losses are E / N^2 sum_e load_e sums[e] and
     * sums[E] / N. Fixed summation order: the same bits every run. */
    cai_status (*moe_router_sums)(cai_device_t *dev, cai_tensor *sums, const cai_tensor *probs, const cai_tensor *lse,
                                  cai_route_fn fn);
    /* dlogits [N, E] (overwritten) = the gradient over the logits of
     * sum_i dw_i wts_i + aux_scale sum_e load_e sum_t q_te (q as in
     * moe_router_sums) + (z_scale / N) sum_t lse_t^2, with dw (F32 [N * k])
     * the combine weights' gradient (0 for dropped choices, whose weights
     * still entered the renormalisation) and load (I64 [E]) moe_assign's. */
    cai_status (*moe_router_bwd)(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits,
                                 const cai_tensor *probs, const cai_tensor *lse, const cai_tensor *sel,
                                 const cai_tensor *wts, const cai_tensor *dw, const cai_tensor *load, cai_route_fn fn,
                                 int norm_topk, double aux_scale, double z_scale);
    /* Grouped products (a rank's experts in one call): block g of n is
     * rows[g] consecutive rows of inp and out (blocks in order from row 0),
     * with its own weight[g] [OC, IC] (all of one shape and dtype). out =
     * inp weight[g]^T per block; rows past the last block are untouched.
     * Every block's result equals linear_fwd's on that block. */
    cai_status (*grouped_linear_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp,
                                     const cai_tensor *weight, const int64_t *rows, int n);
    /* Per block: dinp (= or += with accum) = dout weight[g] (dinp NULL:
     * skipped) and dweight[g] += dout^T inp, as linear_bwd on the block;
     * dinp must not overlap dout or inp. dweight may differ in dtype from
     * weight (F32 gradients of BF16 weights). */
    cai_status (*grouped_linear_bwd)(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout,
                                     const cai_tensor *inp, const cai_tensor *weight, const int64_t *rows, int n,
                                     int accum);

    /* ---- rotary position embedding (Hugging Face "rotate_half" pairing) */

    /* cos, sin [max_pos, R/2] for rotary dim R: angle(p, i) = p * theta^(-2i/R),
     * computed in double then rounded. Call once at model build. */
    cai_status (*rope_tables)(cai_device_t *dev, cai_tensor *cos, cai_tensor *sin, double theta);
    /* x [B,T,H,D] (strided rows ok, e.g. a view into fused QKV): for each
     * head, dims (i, i + R/2), i < R/2, rotate by angle(pos, i); dims >= R
     * pass through. pos = positions[b,t] (I32 [B,T] or [T]) when positions is
     * non-NULL, else pos_offset + t. out may alias inp (in place). */
    cai_status (*rope_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *cos,
                           const cai_tensor *sin, const cai_tensor *positions, int64_t pos_offset);
    /* Inverse rotation of the gradient; dinp may alias dout. */
    cai_status (*rope_bwd)(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *dout, const cai_tensor *cos,
                           const cai_tensor *sin, const cai_tensor *positions, int64_t pos_offset);

    /* ---- causal self-attention, multi-head and grouped-query */

    /* Scratch bytes attention_fwd/bwd need for these sizes (the max of both),
     * for this device's thread count. */
    size_t (*attention_workspace_bytes)(const cai_device_t *dev, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                                        int64_t Hkv, int64_t D);
    /* q [B,Tq,Hq,D], k and v [B,Tk,Hkv,D] (strided rows ok: views into fused
     * QKV), Hkv divides Hq, query head h uses kv head h / (Hq/Hkv).
     * out [B,Tq,Hq,D] = softmax(scale q k^T + mask) v; lse [B,Hq,Tq] F32 is
     * the log-sum-exp of each score row, saved for backward (NULL when
     * inference only). */
    cai_status (*attention_fwd)(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *q,
                                const cai_tensor *k, const cai_tensor *v, const cai_attn_params *params,
                                void *workspace, size_t workspace_bytes);
    /* Recomputes the probabilities from q, k and lse (nothing T x T is kept
     * between fwd and bwd). dq, dk, dv are overwritten (strided rows ok). */
    cai_status (*attention_bwd)(cai_device_t *dev, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv,
                                const cai_tensor *dout, const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
                                const cai_tensor *out, const cai_tensor *lse, const cai_attn_params *params,
                                void *workspace, size_t workspace_bytes);
    /* Online-softmax merge of two attention results over disjoint key sets
     * (ring attention's blocks), per query row: l = log(e^lse + e^blk_lse),
     * out = out e^(lse - l) + blk_out e^(blk_lse - l), lse = l. out, blk_out
     * [B,T,H,D] (strided rows as attention's); lse, blk_lse [B,H,T] F32 with
     * a contiguous last dimension and any strides on B and H (views of a
     * wider lse). A row whose lse is -inf takes blk's values; a blk_lse of
     * -inf leaves the row unchanged. NULL where a backend lacks it. */
    cai_status (*attention_merge)(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *blk_out,
                                  const cai_tensor *blk_lse);

    /* ---- paged KV cache (inference; docs/infer.md)
     * A layer's cache is two tensors [n_blocks, block_size, Hkv, D]
     * (contiguous; F32, BF16 or F16 whatever the activations' dtype): token
     * slot s is row s % block_size of block s / block_size. Queries, keys
     * and values are [1, N, H, D] (strided rows: views into fused QKV) for
     * the N tokens of a ragged batch. Index tensors are I32, contiguous, on
     * the device. */

    /* k_cache[slots[i]] = k[i], v_cache[slots[i]] = v[i], converted to the
     * cache's dtype with round-to-nearest-even; slots [N], a negative slot
     * skips its row. */
    cai_status (*kv_cache_write)(cai_device_t *dev, cai_tensor *k_cache, cai_tensor *v_cache, const cai_tensor *k,
                                 const cai_tensor *v, const cai_tensor *slots);
    /* A decode step's rotation and cache write in one pass: rope_fwd(qk,
     * qk, cos, sin, positions, 0), then kv_cache_write(k_cache, v_cache, k,
     * v, slots) where k is the last Hkv heads of qk (qk [1,N,Hq+Hkv,D], the
     * queries' heads then the keys', rotated in place; Hkv is the
     * caches'). Results are those of the two ops. */
    cai_status (*rope_kv_cache_write)(cai_device_t *dev, cai_tensor *qk, cai_tensor *k_cache, cai_tensor *v_cache,
                                      const cai_tensor *v, const cai_tensor *slots, const cai_tensor *cos,
                                      const cai_tensor *sin, const cai_tensor *positions);
    /* Scratch bytes paged_attention needs for these sizes. */
    size_t (*paged_attention_workspace_bytes)(const cai_device_t *dev, int64_t n_tokens, int64_t n_seqs, int64_t Hq,
                                              int64_t D, int64_t max_ctx);
    /* Causal attention of S sequences against their cached keys and values,
     * for prefill chunks and decode steps alike: sequence s owns query rows
     * [q_start[s], q_start[s+1]) of q (q_start [S+1], q_start[0] = 0,
     * q_start[S] = N), its cache holds ctx_len[s] tokens (ctx_len [S]) of
     * which the last q_len are these queries' own, already written; query
     * j of s sits at position ctx_len[s] - q_len + j and sees the keys at
     * positions up to its own. Key position p of s lives in block
     * block_tables[s, p / block_size] (block_tables [S, max_blocks]). Query
     * head h reads kv head h / (Hq / Hkv). out [1,N,Hq,D] =
     * softmax(scale q k^T) v, scale 0 meaning 1/sqrt(D); max_ctx bounds
     * every ctx_len (it sizes the workspace). */
    cai_status (*paged_attention)(cai_device_t *dev, cai_tensor *out, const cai_tensor *q, const cai_tensor *k_cache,
                                  const cai_tensor *v_cache, const cai_tensor *block_tables, const cai_tensor *q_start,
                                  const cai_tensor *ctx_len, int64_t max_ctx, float scale, void *workspace,
                                  size_t workspace_bytes);

    /* ---- embeddings (vocab-parallel ready) */

    /* out [B,T,C] = wte[tokens[b,t] - vocab_offset] (+ wpe[pos_offset + t]).
     * tokens I32 [B,T]; wte [V_local,C] holds global ids [vocab_offset,
     * vocab_offset + V_local): tokens outside it give zero rows (a TP caller
     * all-reduces). wpe [max_pos,C] may be NULL (Llama); under TP pass it on
     * one rank only. Tokens < 0 or >= vocab_total (when vocab_total > 0) are
     * an error naming the position. */
    cai_status (*embedding_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *tokens, const cai_tensor *wte,
                                const cai_tensor *wpe, int64_t vocab_offset, int64_t vocab_total, int64_t pos_offset);
    /* dwte += scatter of dout rows by token (own shard only); dwpe += dout
     * summed over the batch. Deterministic (no atomics). */
    cai_status (*embedding_bwd)(cai_device_t *dev, cai_tensor *dwte, cai_tensor *dwpe, const cai_tensor *dout,
                                const cai_tensor *tokens, int64_t vocab_offset, int64_t pos_offset);

    /* ---- fused softmax + cross-entropy (vocab-parallel ready)
     * logits [N,Vl] (strided rows ok) hold global vocab ids [vocab_offset,
     * vocab_offset + Vl); columns with id >= valid_vocab are padding and are
     * excluded from the softmax. targets I32 [N]; rows whose target equals
     * ignore_index get loss 0 and zero gradient. */

    /* losses [N] = lse - logit[target]; lse [N] saved for backward (may be NULL). */
    cai_status (*xent_fwd)(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, const cai_tensor *logits,
                           const cai_tensor *targets, int64_t vocab_offset, int64_t valid_vocab, int ignore_index);
    /* Vocab-parallel first half: per row the local max, sum(exp(logit - max))
     * and the target logit (0 when the target is not in this shard). The
     * caller all-reduces max, rescales sumexp, all-reduces sums; then
     * lse = max + log(sumexp) and loss = lse - target_logit. */
    cai_status (*xent_stats)(cai_device_t *dev, cai_tensor *maxv, cai_tensor *sumexp, cai_tensor *target_logit,
                             const cai_tensor *logits, const cai_tensor *targets, int64_t vocab_offset,
                             int64_t valid_vocab, int ignore_index);
    /* dlogits = dloss_n * (softmax(logits) - onehot(target)), padding columns
     * 0, ignored rows 0; dloss_n = dlosses[n] when dlosses [N] is non-NULL,
     * else dloss_scale (e.g. 1 / number of valid tokens). dlogits may alias
     * logits (in place). */
    cai_status (*xent_bwd)(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits, const cai_tensor *lse,
                           const cai_tensor *targets, const cai_tensor *dlosses, float dloss_scale,
                           int64_t vocab_offset, int64_t valid_vocab, int ignore_index);
    /* xent_fwd then xent_bwd (with dloss_scale, no dlosses) as one op, for
     * a training step whose backward scale is known at the loss (llm.c's
     * fused classifier): a backend that can keep a row on chip reads the
     * logits once instead of twice. losses [N] (may be NULL), lse [N]
     * (written), dlogits as xent_bwd's (may alias logits: the logits are
     * then gone). Results are those of the two ops. */
    cai_status (*xent_fwd_bwd)(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, cai_tensor *dlogits,
                               const cai_tensor *logits, const cai_tensor *targets, float dloss_scale,
                               int64_t vocab_offset, int64_t valid_vocab, int ignore_index);

    /* ---- greedy decoding
     * Per row n of logits [N,Vl] (strided rows ok) over the columns with id
     * < valid_vocab (ids as in xent): idx[n] = the id of the row's largest
     * logit, the lowest id among equals, and maxv[n] = that logit; a NaN
     * counts as larger than any number (the caller refuses it). A row
     * without valid columns gets idx -1 and maxv -inf. idx I32 [N], maxv
     * F32 [N]. A decode step then copies N ids instead of N x Vl logits to
     * the host; under tp the shards' (maxv, idx) pairs combine by the same
     * rule. */
    cai_status (*argmax_rows)(cai_device_t *dev, cai_tensor *idx, cai_tensor *maxv, const cai_tensor *logits,
                              int64_t vocab_offset, int64_t valid_vocab);

    /* ---- optimizer */

    /* One AdamW update of param (F32 master weights) from grad, with moments
     * m, v (F32, same shape). param_lowp (BF16/F16, may be NULL) receives the
     * updated parameters rounded to nearest even, for mixed precision.
     * apply_decay = 0 for norms, biases and (usually) embeddings. Works on any
     * contiguous shard, e.g. a ZeRO partition. */
    cai_status (*adamw)(cai_device_t *dev, cai_tensor *param, const cai_tensor *grad, cai_tensor *m, cai_tensor *v,
                        cai_tensor *param_lowp, const cai_adamw_params *p, int apply_decay);
} cai_ops;

/* One AdamW update over pieces of flat buffers (a model's parameters, a ZeRO
 * shard): span i is n elements at w, g, m, v and, when lowp is not NULL,
 * the working copy in lowp_dtype (written in the same pass). Adjacent
 * spans that continue each other in every buffer with the same decay flag
 * go to ops->adamw as one call (elementwise: the same bits as a call per
 * span). split (host device only): one OpenMP region over all of it, every
 * run divided among dev->num_threads threads. */
typedef struct {
    float *w;
    const float *g;
    float *m, *v;
    void *lowp;
    size_t n;
    int decay;
} cai_adamw_span;
cai_status cai_adamw_spans(cai_device_t *dev, const cai_adamw_span *spans, int n_spans, cai_dtype lowp_dtype,
                           const cai_adamw_params *p, int split);

/* The CPU backend's table (always built). */
const cai_ops *cai_ops_cpu(void);

/* Clip coefficient for a global gradient norm: min(1, max_norm / (norm + 1e-6)),
 * 1 when max_norm <= 0 (clipping off). Pass it as adamw's grad_scale or to
 * ops->scale. Pure. */
float cai_clip_coef(double grad_norm, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
