/* The plain-C interface between the CUDA backend's host code (kernels/cuda_*.c,
 * compiled by the C compiler with -Werror) and its kernels (the .cu files,
 * compiled by nvcc). Only POD views cross it: the C side validates every
 * argument with the shared op checks first, so the launchers trust their
 * inputs. Each launcher enqueues on `s` and returns cudaGetLastError(). */
#ifndef CAI_CUDA_KERNELS_H
#define CAI_CUDA_KERNELS_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dtype codes are cai_dtype's (colossal/base.h): f32 0, bf16 1, f16 2, i32 4. */
enum { CUK_F32 = 0, CUK_BF16 = 1, CUK_F16 = 2, CUK_F64 = 3, CUK_I32 = 4 };

/* `rows` rows of `cols` contiguous elements, row r at element r * ld. */
typedef struct {
    void *p;
    int64_t rows, cols, ld;
    int dt;
} cuk_mat;

/* [B,T,H,D] with element strides on B, T, H and contiguous D. */
typedef struct {
    void *p;
    int64_t B, T, H, D, sb, st, sh;
    int dt;
} cuk_bthd;

/* Any same-shape pair of strided tensors (copy of views that do not collapse into rows). */
typedef struct {
    int ndim;
    int64_t shape[6], dstride[6], sstride[6];
} cuk_strided;

/* Data-dependent argument errors found on the device (a token id outside
 * the vocabulary, ...). The first offending thread claims `code` with an
 * atomic compare-and-swap and fills the rest; the host reads it at the next
 * synchronisation. Lives in mapped pinned memory. */
typedef struct {
    int code;
    int pad_;
    int64_t a, b, c, d;
} cuk_errrec;

enum {
    CUK_ERR_NONE = 0,
    CUK_ERR_TOKEN = 1,
    CUK_ERR_TARGET = 2,
    CUK_ERR_POSITION = 3,
    CUK_ERR_SLOT = 4,  /* kv_cache_write: a = token, b = slot, c = the cache's slots */
    CUK_ERR_BLOCK = 5, /* paged_attention: a = sequence, b = block-table column, c = block id, d = n_blocks */
    CUK_ERR_SEQ = 6, /* paged_attention: a = sequence, b = its queries, c = ctx_len, d = the longest ctx_len allowed */
    CUK_ERR_MOE_POS = 7,   /* moe_*: a = assignment, b = pos[a], c = the grouped rows S */
    CUK_ERR_MOE_LOGIT = 8, /* moe_route: a = token, b = expert, c = experts (a non-finite logit) */
    CUK_ERR_MOE_SEL = 9    /* moe_assign: a = choice, b = sel[a], c = experts */
};

typedef struct {
    float scale;
    int causal;
    int64_t off, window;
    int tc;            /* allow the tensor-core kernels (bf16 inputs); 0 forces the f32 CUDA-core ones */
    int deterministic; /* cuDNN's backward: its bitwise repeatable algorithm (CAI_CUDNN_DETERMINISTIC) */
} cuk_attn;

/* ---------------------------------------------------------------- elementwise.cu */
cudaError_t cuk_fill(cudaStream_t s, cuk_mat x, float value);
cudaError_t cuk_copy_rows(cudaStream_t s, cuk_mat dst, cuk_mat src);
cudaError_t cuk_copy_strided(cudaStream_t s, void *dst, int ddt, const void *src, int sdt, cuk_strided g, int64_t n);
cudaError_t cuk_copy_sr_rows(cudaStream_t s, cuk_mat dst, cuk_mat src, uint64_t seed, uint64_t stream,
                             uint64_t index_offset);
cudaError_t cuk_copy_sr_strided(cudaStream_t s, void *dst, int ddt, const float *src, cuk_strided g, int64_t n,
                                uint64_t seed, uint64_t stream, uint64_t index_offset);
cudaError_t cuk_scale(cudaStream_t s, cuk_mat x, float alpha);
cudaError_t cuk_axpy(cudaStream_t s, cuk_mat y, float alpha, cuk_mat x);
cudaError_t cuk_add(cudaStream_t s, cuk_mat out, cuk_mat a, cuk_mat b);
/* out[0] += sum(x) (or sum(x^2)) in double; out F32 or F64. `partials` holds
 * at least CUK_REDUCE_MAX_BLOCKS doubles. Deterministic. */
#define CUK_REDUCE_MAX_BLOCKS 1024
cudaError_t cuk_reduce(cudaStream_t s, cuk_mat x, int squares, void *out, int out_dt, double *partials);
cudaError_t cuk_bias_add(cudaStream_t s, cuk_mat x, const void *bias, int bias_dt);
/* Column sums for bias and norm-parameter gradients, deterministic (fixed
 * row chunks, partials summed in chunk order in double):
 *   db[c] += sum_r dy[r,c]; dw[c] += sum_r dy[r,c] * xhat[r,c] with
 *   xhat = (x - mean[r]) * rstd[r] (mean NULL: x * rstd). dw/db may be NULL;
 *   x.p may be NULL when dw is. `scratch` holds scratch_floats floats. */
cudaError_t cuk_colsums(cudaStream_t s, float *dw, float *db, cuk_mat dy, cuk_mat x, const float *mean,
                        const float *rstd, float *scratch, size_t scratch_floats);
/* dw[c] += sum_k pw[k * cols + c], db likewise, k over nchunk chunk partials
 * in a fixed order in double (the second step of cuk_colsums, also used by
 * the fused norm backward). pw/pb unused where dw/db is NULL. */
cudaError_t cuk_colsum_final(cudaStream_t s, const float *pw, const float *pb, int64_t nchunk, int64_t cols, float *dw,
                             float *db);
cudaError_t cuk_gelu_fwd(cudaStream_t s, cuk_mat y, cuk_mat x);
cudaError_t cuk_gelu_bwd(cudaStream_t s, cuk_mat dx, cuk_mat x, cuk_mat dy);
cudaError_t cuk_swiglu_fwd(cudaStream_t s, cuk_mat y, cuk_mat g, cuk_mat u);
/* dg.p or du.p may be NULL */
cudaError_t cuk_swiglu_bwd(cudaStream_t s, cuk_mat dg, cuk_mat du, cuk_mat dy, cuk_mat g, cuk_mat u);
cudaError_t cuk_rope_tables(cudaStream_t s, cuk_mat cos, cuk_mat sin, double theta);
/* sign +1 forward, -1 backward; pos NULL: pos_offset + t. */
cudaError_t cuk_rope(cudaStream_t s, cuk_bthd y, cuk_bthd x, cuk_mat cos, cuk_mat sin, const int32_t *pos,
                     int pos_per_batch, int64_t pos_offset, float sign, cuk_errrec *err);
cudaError_t cuk_adamw(cudaStream_t s, float *p, const void *g, int gdt, float *m, float *v, void *lowp, int ldt,
                      int64_t n, float b1, float b2, float eps, float step_size, float bc2_sqrt, float decay,
                      float grad_scale);

/* ---------------------------------------------------------------- norm.cu */
/* LayerNorm (rms = 0) or RMSNorm (rms = 1, mean/bias unused). mean, rstd, b may be NULL. */
cudaError_t cuk_norm_fwd(cudaStream_t s, cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w, int wdt,
                         const void *b, int bdt, float eps, int rms);
/* The register-resident fast paths (16-byte aligned rows, x/y/dy/dx of one
 * dtype, up to 2048 columns forward and 1024 backward); *done = 0 when they
 * do not apply and nothing was launched. The backward computes dinp (dx.p
 * may be NULL) and adds the parameter gradients (dw/db may be NULL) in one
 * pass over the rows, deterministic; `scratch` holds the block partials. */
cudaError_t cuk_norm_fwd_fast(cudaStream_t s, cuk_mat y, float *mean, float *rstd, cuk_mat x, const void *w, int wdt,
                              const void *b, int bdt, float eps, int rms, int *done);
cudaError_t cuk_norm_bwd_fast(cudaStream_t s, cuk_mat dx, float *dw, float *db, cuk_mat dy, cuk_mat x, const void *w,
                              int wdt, const float *mean, const float *rstd, int accum, float *scratch,
                              size_t scratch_floats, int *done);
/* dx (= or +=) rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w; mean NULL: RMSNorm. */
cudaError_t cuk_norm_bwd_dinp(cudaStream_t s, cuk_mat dx, cuk_mat dy, cuk_mat x, const void *w, int wdt,
                              const float *mean, const float *rstd, int accum);

/* ---------------------------------------------------------------- attention.cu */
#define CUK_ATTN_MAX_D 256
/* Raise the kernels' dynamic shared-memory limit on the current device (once per device). */
cudaError_t cuk_attn_setup(void);
cudaError_t cuk_attn_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a);
/* dq.p / dk.p / dv.p may be NULL; dvec is a [B,Hq,Tq] f32 workspace. */
cudaError_t cuk_attn_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd dout, cuk_bthd q, cuk_bthd k,
                         cuk_bthd v, cuk_bthd o, const float *lse, float *dvec, cuk_attn a);
/* attention_merge: o, lse (strides lsb, lsh on B and H) merged with x,
 * xlse (xsb, xsh) by their log-sum-exp, as the CPU backend does. */
cudaError_t cuk_attn_merge(cudaStream_t s, cuk_bthd o, float *lse, int64_t lsb, int64_t lsh, cuk_bthd x,
                           const float *xlse, int64_t xsb, int64_t xsh);

/* attention_tc.cu: the bf16 tensor-core variants, called by the launchers above
 * when a.tc is set and q, k, v (and dout) are bf16; dvec is already computed. */
cudaError_t cuk_attn_tc_setup(void);
int cuk_attn_tc_ok(const cuk_bthd *q, const cuk_bthd *k, const cuk_bthd *v, const cuk_bthd *dout, cuk_attn a);
cudaError_t cuk_attn_tc_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a);
cudaError_t cuk_attn_tc_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd dout, cuk_bthd q,
                            cuk_bthd k, cuk_bthd v, const float *lse, const float *dvec, cuk_attn a);

/* attention_flash.cu: flash-attention-2 style kernels (mma.sync, cp.async) for
 * bf16 or f16 q, k, v (and dout) of one dtype, head_dim 64 or 128, 16-byte
 * aligned rows (pointers and the B/T/H strides); outputs any dtype and strides.
 * The host code calls them instead of cuk_attn_fwd/_bwd when cuk_attn_flash_ok
 * (pass dout NULL for the forward) and the CAI_CUDA_ATTN knob allows. The backward
 * computes dvec itself, like cuk_attn_bwd. */
int cuk_attn_flash_ok(const cuk_bthd *q, const cuk_bthd *k, const cuk_bthd *v, const cuk_bthd *dout);
cudaError_t cuk_attn_flash_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a);
cudaError_t cuk_attn_flash_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd dout, cuk_bthd q,
                               cuk_bthd k, cuk_bthd v, cuk_bthd o, const float *lse, float *dvec, cuk_attn a);

/* ---------------------------------------------------------------- attention_cudnn.cu
 * cuDNN's fused attention (cudnn-frontend SDPA graphs) in builds configured
 * with cuDNN (cuk_attn_cudnn_built() == 1). cuk_attn_cudnn_ok: the case is
 * one it takes (for the forward, pass dout, dq, dk, dv NULL; the backward
 * needs all three gradients). The launchers return 0 on success, 2 when
 * cuDNN has no engine for the case (nothing was enqueued; other kernels may
 * run it), 1 on any other failure, with cuDNN's message in err. */
int cuk_attn_cudnn_built(void);
int cuk_attn_cudnn_ok(const cuk_bthd *q, const cuk_bthd *k, const cuk_bthd *v, const cuk_bthd *o, const cuk_bthd *dout,
                      const cuk_bthd *dq, const cuk_bthd *dk, const cuk_bthd *dv, const cuk_attn *a);
int cuk_attn_cudnn_fwd(cudaStream_t s, cuk_bthd o, float *lse, cuk_bthd q, cuk_bthd k, cuk_bthd v, cuk_attn a,
                       char *err, size_t errlen);
int cuk_attn_cudnn_bwd(cudaStream_t s, cuk_bthd dq, cuk_bthd dk, cuk_bthd dv, cuk_bthd dout, cuk_bthd q, cuk_bthd k,
                       cuk_bthd v, cuk_bthd o, const float *lse, cuk_attn a, char *err, size_t errlen);

/* ---------------------------------------------------------------- embed.cu */
cudaError_t cuk_embedding_fwd(cudaStream_t s, cuk_mat out, const int32_t *tok, int64_t T, cuk_mat wte, cuk_mat wpe,
                              int64_t vocab_offset, int64_t vocab_total, int64_t pos_offset, cuk_errrec *err);
/* Minimum scratch bytes embedding_bwd needs for n tokens, a local vocabulary
 * of v rows and rows of cols columns (more scratch: shorter summing tiles). */
size_t cuk_embedding_bwd_scratch(int64_t n, int64_t v, int64_t cols);
/* dwte.p / dwpe.p may be NULL. */
cudaError_t cuk_embedding_bwd(cudaStream_t s, cuk_mat dwte, cuk_mat dwpe, cuk_mat dout, const int32_t *tok, int64_t T,
                              int64_t vocab_offset, int64_t pos_offset, void *scratch, size_t scratch_bytes);
/* Row statistics of logits over columns [0, ncols): writes whichever of
 * losses (lse - x[target], 0 for ignored rows), lse, maxv, sumexp, tlogit
 * are non-NULL. strict: a target outside [off, off + ncols) that is not
 * ignore_index is reported through err (xent_fwd); otherwise it gives
 * tlogit 0 (xent_stats). */
cudaError_t cuk_xent_fwd(cudaStream_t s, float *losses, float *lse, float *maxv, float *sumexp, float *tlogit,
                         cuk_mat logits, const int32_t *tgt, int64_t off, int64_t ncols, int ignore_index, int strict,
                         cuk_errrec *err);
cudaError_t cuk_xent_bwd(cudaStream_t s, cuk_mat dlogits, cuk_mat logits, const float *lse, const int32_t *tgt,
                         const float *dlosses, float dloss_scale, int64_t off, int64_t ncols, int ignore_index);
/* cuk_xent_fwd (strict, losses and lse) then cuk_xent_bwd (dloss_scale): in
 * one launch that reads each row twice, the second time from L2, where the
 * 16-byte fast path takes the views, else the two launches. dlogits may
 * alias logits. */
cudaError_t cuk_xent_fwd_bwd(cudaStream_t s, float *losses, float *lse, cuk_mat dlogits, cuk_mat logits,
                             const int32_t *tgt, float dloss_scale, int64_t off, int64_t ncols, int ignore_index,
                             cuk_errrec *err);
/* Per row: the id (off + column) of the largest of columns [0, ncols) and
 * its value, NaN first, the lowest column among equals (argmax_rows). */
#define CUK_ARGMAX_MAX_SLICES 64
/* Scratch that lets long rows be cut into slices (with less, one block per row). */
size_t cuk_argmax_ws_bytes(int64_t rows, int64_t ncols);
cudaError_t cuk_argmax_rows(cudaStream_t s, int32_t *idx, float *maxv, cuk_mat logits, int64_t off, int64_t ncols,
                            void *ws, size_t ws_bytes);

/* ---------------------------------------------------------------- gemv.cu
 * y[n] = W x[n] (+ bias) (+ r[n]) for the few rows of a decode step: x
 * [N, K], W [M, K], y and r [N, M] (r.p NULL: none; r may be y). Taken only
 * where cuk_gemv_fits: 1 <= N <= CUK_GEMV_MAX_N, x, W, y (and r) of one
 * 16-bit dtype, K and the row strides of x and W multiples of 8, x and W
 * 16-byte aligned. */
#define CUK_GEMV_MAX_N 4
int cuk_gemv_fits(cuk_mat y, cuk_mat x, cuk_mat w, cuk_mat r);
cudaError_t cuk_gemv(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r,
                     int pdl);
/* y[n] = swiglu(Wg x[n], Wu x[n]) in one pass over both weights, each
 * product rounded to y's dtype before the SwiGLU (bitwise cuk_gemv twice
 * and cuk_swiglu_fwd). Where cuk_gemv_fits(y, x, wg) and wu is laid out
 * as wg (cuk_gemv_swiglu_fits). */
int cuk_gemv_swiglu_fits(cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu);
cudaError_t cuk_gemv_swiglu(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, int pdl);
/* pdl (both): launched as programmatic dependents of the stream's previous
 * kernel (sm_90+; the caller decides, CAI_CUDA_PDL). */

/* ---------------------------------------------------------------- dgemm.cu
 * cuk_gemv's products and SwiGLU pair for CUK_DGEMM_MIN_N <= N <=
 * CUK_DGEMM_MAX_N rows on Hopper's tensor cores (sm_90a: cuk_dgemm_ready
 * is 0 elsewhere), taken where the fits functions say (cuk_gemv's
 * conditions, the rows, K of at least 2048 and weights of at least 4M
 * elements, the workspace). Where few 128-row tiles split K,
 * the partial sums go through ws (ws_bytes) and the per-tile counters cnt
 * (CUK_DGEMM_COUNTERS of them, zero between calls). The pair's two sums are
 * cuk_dgemm's bit for bit; pdl as cuk_gemv's. */
#define CUK_DGEMM_MIN_N 4
#define CUK_DGEMM_MAX_N 8
#define CUK_DGEMM_COUNTERS 1024
int cuk_dgemm_ready(void);
int cuk_dgemm_fits(cuk_mat y, cuk_mat x, cuk_mat w, cuk_mat r, size_t ws_bytes);
cudaError_t cuk_dgemm(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat w, const void *bias, int bias_dt, cuk_mat r,
                      void *ws, unsigned *cnt, int pdl);
int cuk_dgemm_swiglu_fits(cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, size_t ws_bytes);
cudaError_t cuk_dgemm_swiglu(cudaStream_t s, cuk_mat y, cuk_mat x, cuk_mat wg, cuk_mat wu, void *ws, unsigned *cnt,
                             int pdl);

/* ---------------------------------------------------------------- paged.cu
 * The paged KV cache (colossal/ops.h). Index tensors are trusted: the host
 * checks their shapes only (reading their values would synchronise), and
 * the kernels read them on the device; a slot, block id or sequence the
 * kernels find out of range is skipped (a slot), masked (a block) or gives
 * zero output rows (a sequence) and is reported through err. */
typedef struct {
    cuk_bthd q, o;       /* [1,N,Hq,D], any float dtypes */
    const void *kc, *vc; /* [n_blocks, bs, Hkv, D], contiguous, dtype cdt */
    int cdt;
    int64_t n_blocks, bs, Hkv;
    const int32_t *bt, *qs, *cl;  /* block_tables [S, max_blocks], q_start [S+1], ctx_len [S] */
    int64_t S, max_blocks, limit; /* limit = min(max_ctx, max_blocks * bs): the longest valid ctx_len */
    float scale;                  /* never 0 here: the host resolves the default */
    int tc;                       /* the tensor-core kernel takes the call (the host sets it where cuk_paged_tc_ok) */
    int prefill; /* with tc and G <= CUK_PAGED_PREFILL_ROWS: query tiles of a sequence's tokens, no splits */
} cuk_paged;

/* Whether the tensor-core kernel can run this call: q and the caches both
 * bf16 or both f16, D 64 or 128, 16-byte aligned caches, q's rows at even
 * element offsets of a 4-byte aligned base. Its block covers up to
 * CUK_PAGED_TC_HEADS query heads of a kv head, the CUDA-core kernels' up
 * to CUK_PAGED_HEADS: a grid split has N * Hkv * ceil(G / that) blocks. */
#define CUK_PAGED_HEADS 4
#define CUK_PAGED_TC_HEADS 16
/* Rows of a prefill block: PREFILL_ROWS / G (rounded down) query tokens of one sequence, each with its G heads. */
#define CUK_PAGED_PREFILL_ROWS 64
int cuk_paged_tc_ok(const cuk_paged *p);

/* kc/vc[slots[i]] = k/v[i] (kc, vc contiguous [n_slots, H, D] in dtype cdt). */
cudaError_t cuk_kv_cache_write(cudaStream_t s, void *kc, void *vc, int cdt, int64_t n_slots, cuk_bthd k, cuk_bthd v,
                               const int32_t *slots, cuk_errrec *err);
/* cuk_rope (sign 1, a position per token) of qk in place, then
 * cuk_kv_cache_write of its last Hkv heads and v, in one kernel
 * (elementwise.cu, beside the RoPE it shares its arithmetic with), with the
 * same results; false (nothing launched) where the shapes or alignments
 * leave the vector path (16-bit qk and v, D = 2 * half, half % 8 == 0,
 * 16-byte rows and tables): the caller runs the two. */
int cuk_rope_kv_write_fits(cuk_bthd qk, cuk_bthd v, cuk_mat cos, cuk_mat sin, int per_batch);
cudaError_t cuk_rope_kv_write(cudaStream_t s, cuk_bthd qk, cuk_bthd v, cuk_mat cos, cuk_mat sin, const int32_t *pos,
                              void *kc, void *vc, int cdt, int64_t n_slots, const int32_t *slots, cuk_errrec *err);
/* D <= CUK_ATTN_MAX_D. splits == 1: one pass per (token, kv head) writes o.
 * splits > 1 (at most CUK_PAGED_MAX_SPLITS): split p takes key positions
 * [p * chunk, (p + 1) * chunk) and leaves its unnormalised partial in ws
 * (N * Hq * splits * (D + 2) floats), which the token's last split to
 * finish combines into o where splits <= CUK_PAGED_FUSE_SPLITS and cnt
 * holds a counter per block of a split (n_cnt of them, zero before the
 * call and zero after it), else a second kernel.
 * pdl: launched as a programmatic dependent of the kernel before it (the
 * cache write), which it waits for before reading q or the caches. */
#define CUK_PAGED_MAX_SPLITS 1024
#define CUK_PAGED_FUSE_SPLITS 64
cudaError_t cuk_paged_attention(cudaStream_t s, cuk_paged p, int64_t splits, int64_t chunk, float *ws, unsigned *cnt,
                                int64_t n_cnt, int pdl, cuk_errrec *err);

/* fp8_cast (fp8.cu): x (F32/BF16/F16 rows) * meta[1] (the scale) cast to
 * FP8 codes (E5M2 when e5m2, else E4M3) into q [rows, cols] and/or qt
 * [cols, rows] (either may be NULL), meta[2] = max(meta[2], amax(x)), and
 * meta[0..1] (1/scale, scale) set from amax(x) first when `current` or
 * meta[1] is 0. amax_scratch: 8 bytes of device memory. */
cudaError_t cuk_fp8_cast(cuk_mat x, float *meta, void *amax_scratch, int e5m2, int current, int margin, uint8_t *q,
                         uint8_t *qt, cudaStream_t s);
/* fp8_dequant_sum (fp8.cu): y [n] = (accumulate ? y : 0) + the sum over s in
 * order of decode(q [s, n]) * metas[s * stride] (NaN where metas[s * stride
 * + 2] is not finite), each product and sum rounded apart. */
cudaError_t cuk_fp8_dequant_sum(float *y, const uint8_t *q, const float *metas, int64_t S, int64_t n, int64_t stride,
                                int e5m2, int accumulate, cudaStream_t s);

/* ---------------------------------------------------------------- moe.cu
 * Token rows [N, C] <-> expert-grouped rows [S, C] through pos (I32 [N * k],
 * -1 for a dropped choice; a pos >= S is reported in err and skipped). The
 * grouped rows named by pos must be distinct (no two choices write one row).
 * w, dw: F32 [N * k]. Every kernel is deterministic: each output element is
 * computed by one thread in a fixed order, dw by a fixed block reduction. */

/* xe[pos[i]] = x[i / k] (bitwise copy) for every kept i. */
cudaError_t cuk_moe_permute(cudaStream_t s, cuk_mat xe, cuk_mat x, const int32_t *pos, int64_t k, cuk_errrec *err);
/* y[t] = (accum ? y[t] : 0) + sum over kept j, in order, of w[tk + j] ye[pos[tk + j]] (w NULL: 1), in f32,
 * rounded once. */
cudaError_t cuk_moe_combine_fwd(cudaStream_t s, cuk_mat y, cuk_mat ye, const int32_t *pos, int64_t k, const float *w,
                                int accum, cuk_errrec *err);
/* dye[pos[i]] = w[i] dy[i / k] and dw[i] = <dy[i / k], ye[pos[i]]> in f32 (0 when dropped). */
cudaError_t cuk_moe_combine_bwd(cudaStream_t s, cuk_mat dye, float *dw, cuk_mat dy, cuk_mat ye, const int32_t *pos,
                                int64_t k, const float *w, cuk_errrec *err);

/* ---------------------------------------------------------------- moe_route.cu
 * The router (ops.h moe_route, moe_assign, moe_router_sums, moe_router_bwd
 * give the semantics): logits, probs [N, E], lse [N], sel, wts, dw [N * k],
 * all F32 but sel (I32); load and kept I64 [E]; sums F64 [E + 1]. fn is a
 * cai_route_fn. */
cudaError_t cuk_moe_route(cudaStream_t s, const float *logits, float *probs, float *lse, int32_t *sel, float *wts,
                          int64_t N, int64_t E, int64_t k, int fn, int norm_topk, cuk_errrec *err);
cudaError_t cuk_moe_assign(cudaStream_t s, const int32_t *sel, int32_t *pos, int64_t *load, int64_t *kept, int64_t n,
                           int64_t E, int64_t capacity, cuk_errrec *err);
cudaError_t cuk_moe_router_sums(cudaStream_t s, double *sums, const float *probs, const float *lse, int64_t N,
                                int64_t E, int fn);
cudaError_t cuk_moe_router_bwd(cudaStream_t s, float *dlogits, const float *logits, const float *probs,
                               const float *lse, const int32_t *sel, const float *wts, const float *dw,
                               const int64_t *load, int64_t N, int64_t E, int64_t k, int fn, int norm_topk,
                               double aux_scale, double z_scale);

#ifdef __cplusplus
}
#endif
#endif
