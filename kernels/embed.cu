/* Token/position embeddings and the fused softmax + cross-entropy, both
 * vocab-shard aware like the CPU backend.
 *
 * embedding_bwd is deterministic without atomics: the (local id, token
 * index) pairs are radix-sorted (stable, so a token's occurrences stay in
 * sequence order), then one block per distinct id adds that id's dout rows
 * in order into dwte, exactly the additions the CPU backend makes, so the
 * result is bitwise equal to it.
 *
 * Cross-entropy keeps no probabilities: the forward is one pass over a row
 * with a running max and a sum of exponentials rescaled when the max grows
 * (online softmax), combined across the block in a fixed order; the
 * backward recomputes softmax from lse while writing dlogits, in place if
 * asked. Rows that are 16-byte aligned take 16-byte vector paths with the
 * dtype a template parameter; others the general element-wise kernels. */
#include "cuda_common.cuh"

#include <cub/cub.cuh>

#define NT 256

/* ---------------------------------------------------------------- embeddings */

__global__ void k_embedding_fwd(cuk_mat out, const int32_t *tok, int64_t T, cuk_mat wte, cuk_mat wpe, int64_t voff,
                                int64_t vtotal, int64_t pos_offset, cuk_errrec *err) {
    for (int64_t n = blockIdx.y; n < out.rows; n += gridDim.y) {
        const int64_t t = tok[n];
        const int bad = t < 0 || (vtotal > 0 && t >= vtotal);
        if (bad && blockIdx.x == 0 && threadIdx.x == 0) cuk_report(err, CUK_ERR_TOKEN, n / T, n % T, t, vtotal);
        const int64_t id = t - voff;
        const int have = !bad && id >= 0 && id < wte.rows;
        for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < out.cols;
             c += (int64_t)gridDim.x * blockDim.x) {
            float v = have ? ldf(wte.p, wte.dt, id * wte.ld + c) : 0.0f;
            if (wpe.p) v += ldf(wpe.p, wpe.dt, (pos_offset + n % T) * wpe.ld + c);
            stf(out.p, out.dt, n * out.ld + c, v);
        }
    }
}

/* Fast path: out, wte (and wpe) of one dtype with 16-byte aligned rows;
 * (token, 8-column chunk) pairs flattened over the grid. */
template <int DT>
__global__ void __launch_bounds__(NT) k_embedding_fwd_vec(cuk_mat out, const int32_t *tok, int64_t T, cuk_mat wte,
                                                          cuk_mat wpe, int64_t voff, int64_t vtotal,
                                                          int64_t pos_offset, cuk_errrec *err) {
    const int64_t cpr = (out.cols + 7) >> 3, total = out.rows * cpr;
    for (int64_t i = blockIdx.x * (int64_t)NT + threadIdx.x; i < total; i += (int64_t)gridDim.x * NT) {
        const int64_t n = i / cpr, c = (i - n * cpr) * 8;
        const int cnt = (int)(out.cols - c < 8 ? out.cols - c : 8);
        const int64_t t = tok[n];
        const int bad = t < 0 || (vtotal > 0 && t >= vtotal);
        if (bad && c == 0) cuk_report(err, CUK_ERR_TOKEN, n / T, n % T, t, vtotal);
        const int64_t id = t - voff;
        float v[8], p[8];
        if (!bad && id >= 0 && id < wte.rows) cuk_ld8_tail<DT>(wte.p, id * wte.ld + c, cnt, v);
        else
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = 0.0f;
        if (wpe.p) {
            cuk_ld8_tail<DT>(wpe.p, (pos_offset + n % T) * wpe.ld + c, cnt, p);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] += p[e];
        }
        cuk_st8_tail<DT>(out.p, n * out.ld + c, cnt, v);
    }
}

extern "C" cudaError_t cuk_embedding_fwd(cudaStream_t s, cuk_mat out, const int32_t *tok, int64_t T, cuk_mat wte,
                                         cuk_mat wpe, int64_t vocab_offset, int64_t vocab_total, int64_t pos_offset,
                                         cuk_errrec *err) {
    if (out.rows <= 0 || out.cols <= 0) return cudaSuccess;
    if (wte.dt == out.dt && cuk_vec_ok(out) && cuk_vec_ok(wte) && (!wpe.p || (wpe.dt == out.dt && cuk_vec_ok(wpe))) &&
        (out.dt == CUK_F32 || out.dt == CUK_BF16 || out.dt == CUK_F16)) {
        int64_t nb = cuk_cdiv(out.rows * ((out.cols + 7) >> 3), NT), cap = 8 * (int64_t)cuk_sm_count();
        const unsigned g = (unsigned)(nb > cap ? cap : nb < 1 ? 1 : nb);
        if (out.dt == CUK_F32)
            k_embedding_fwd_vec<CUK_F32><<<g, NT, 0, s>>>(out, tok, T, wte, wpe, vocab_offset, vocab_total, pos_offset, err);
        else if (out.dt == CUK_BF16)
            k_embedding_fwd_vec<CUK_BF16><<<g, NT, 0, s>>>(out, tok, T, wte, wpe, vocab_offset, vocab_total, pos_offset, err);
        else
            k_embedding_fwd_vec<CUK_F16><<<g, NT, 0, s>>>(out, tok, T, wte, wpe, vocab_offset, vocab_total, pos_offset, err);
        return cudaGetLastError();
    }
    k_embedding_fwd<<<cuk_rows_grid(out.rows, out.cols, NT), NT, 0, s>>>(out, tok, T, wte, wpe, vocab_offset,
                                                                          vocab_total, pos_offset, err);
    return cudaGetLastError();
}

/* Local id of each token (v for tokens outside the shard, sorted last). */
__global__ void k_embed_keys(const int32_t *tok, int64_t n, int64_t voff, int64_t v, uint32_t *keys, int32_t *vals) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t id = (int64_t)tok[i] - voff;
        keys[i] = (uint32_t)(id >= 0 && id < v ? id : v);
        vals[i] = (int32_t)i;
    }
}

/* The dwte row of sorted position i when i starts its id's run (NULL
 * otherwise, or for tokens outside the shard); *end is one past the run. */
CUK_INLINE float *id_run(const cuk_mat &dwte, const uint32_t *keys, int64_t i, int64_t n, int64_t *end) {
    const uint32_t id = keys[i];
    if ((int64_t)id >= dwte.rows || (i > 0 && keys[i - 1] == id)) return NULL;
    int64_t e = i + 1;
    while (e < n && keys[e] == id) e++;
    *end = e;
    return (float *)dwte.p + (int64_t)id * dwte.ld;
}

/* One block per sorted position; only the first position of each id works. */
__global__ void k_embed_scatter(cuk_mat dwte, cuk_mat dout, const uint32_t *keys, const int32_t *vals, int64_t n) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        int64_t end;
        float *row = id_run(dwte, keys, i, n, &end);
        if (!row) continue;
        for (int64_t c = threadIdx.x; c < dwte.cols; c += blockDim.x) {
            float acc = row[c];
            for (int64_t k = i; k < end; k++) acc += ldf(dout.p, dout.dt, (int64_t)vals[k] * dout.ld + c);
            row[c] = acc;
        }
    }
}

/* dwpe[pos_offset + t] += sum over the batch, b in order. */
__global__ void k_embed_dwpe(cuk_mat dwpe, cuk_mat dout, int64_t T, int64_t pos_offset) {
    const int64_t B = dout.rows / T;
    CUK_FOR_RC(T, dwpe.cols) {
        float *p = (float *)dwpe.p + (pos_offset + r) * dwpe.ld + c;
        float acc = *p;
        for (int64_t b = 0; b < B; b++) acc += ldf(dout.p, dout.dt, (b * T + r) * dout.ld + c);
        *p = acc;
    }
}

/* Fast paths of the two sums (dout 16-byte aligned rows of a float dtype,
 * dwte/dwpe rows 16-byte aligned): 8 columns per thread, the same additions
 * in the same order per element (bitwise equal to the general kernels). */
template <int DT>
__global__ void k_embed_scatter_vec(cuk_mat dwte, cuk_mat dout, const uint32_t *keys, const int32_t *vals, int64_t n) {
    const int64_t nch = (dwte.cols + 7) >> 3;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        int64_t end;
        float *row = id_run(dwte, keys, i, n, &end);
        if (!row) continue;
        for (int64_t j = threadIdx.x; j < nch; j += blockDim.x) {
            const int64_t c = 8 * j;
            const int cnt = (int)(dwte.cols - c < 8 ? dwte.cols - c : 8);
            float acc[8], d[8];
            cuk_ld8_tail<CUK_F32>(row, c, cnt, acc);
            for (int64_t k = i; k < end; k++) {
                cuk_ld8_tail<DT>(dout.p, (int64_t)vals[k] * dout.ld + c, cnt, d);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[e] += d[e];
            }
            cuk_st8_tail<CUK_F32>(row, c, cnt, acc);
        }
    }
}

template <int DT> __global__ void k_embed_dwpe_vec(cuk_mat dwpe, cuk_mat dout, int64_t T, int64_t pos_offset) {
    const int64_t B = dout.rows / T, cpr = (dwpe.cols + 7) >> 3, total = T * cpr;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / cpr, c = (i - t * cpr) * 8;
        const int cnt = (int)(dwpe.cols - c < 8 ? dwpe.cols - c : 8);
        float *p = (float *)dwpe.p + (pos_offset + t) * dwpe.ld;
        float acc[8], d[8];
        cuk_ld8_tail<CUK_F32>(p, c, cnt, acc);
        for (int64_t b = 0; b < B; b++) {
            cuk_ld8_tail<DT>(dout.p, (b * T + t) * dout.ld + c, cnt, d);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[e] += d[e];
        }
        cuk_st8_tail<CUK_F32>(p, c, cnt, acc);
    }
}

static bool embed_vec_ok(cuk_mat dout, cuk_mat acc) {
    return (dout.dt == CUK_F32 || dout.dt == CUK_BF16 || dout.dt == CUK_F16) && cuk_vec_ok(dout) && cuk_vec_ok(acc);
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Key bits needed for local ids 0..v (v is the out-of-shard sentinel). */
static int bits_for(int64_t v) {
    int b = 1;
    while (b < 32 && ((int64_t)1 << b) <= v) b++;
    return b;
}

static size_t sort_temp_bytes(int64_t n, int64_t v) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs((void *)NULL, bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0, bits_for(v));
    return bytes;
}

extern "C" size_t cuk_embedding_bwd_scratch(int64_t n, int64_t v) {
    if (n <= 0 || v <= 0) return 0;
    return 4 * align256((size_t)n * sizeof(int32_t)) + align256(sort_temp_bytes(n, v));
}

extern "C" cudaError_t cuk_embedding_bwd(cudaStream_t s, cuk_mat dwte, cuk_mat dwpe, cuk_mat dout, const int32_t *tok,
                                         int64_t T, int64_t vocab_offset, int64_t pos_offset, void *scratch,
                                         size_t scratch_bytes) {
    const int64_t n = dout.rows;
    if (n <= 0 || dout.cols <= 0) return cudaSuccess;
    if (dwte.p && dwte.rows > 0) {
        size_t ib = align256((size_t)n * sizeof(int32_t)), tb = sort_temp_bytes(n, dwte.rows);
        if (scratch_bytes < 4 * ib + tb) return cudaErrorMemoryAllocation;
        char *sp = (char *)scratch;
        uint32_t *kin = (uint32_t *)sp, *kout = (uint32_t *)(sp + 2 * ib);
        int32_t *vin = (int32_t *)(sp + ib), *vout = (int32_t *)(sp + 3 * ib);
        void *temp = sp + 4 * ib;
        int64_t nb = cuk_cdiv(n, NT);
        k_embed_keys<<<(unsigned)(nb > 65536 ? 65536 : nb), NT, 0, s>>>(tok, n, vocab_offset, dwte.rows, kin, vin);
        cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, tb, kin, kout, vin, vout, (int)n, 0,
                                                        bits_for(dwte.rows), s);
        if (e != cudaSuccess) return e;
        const unsigned g = (unsigned)(n > 65536 ? 65536 : n);
        if (embed_vec_ok(dout, dwte)) {
            /* one thread per 8 columns: a block of 32 * ceil(chunks / 32), at most NT */
            int64_t bt = 32 * cuk_cdiv((dwte.cols + 7) >> 3, 32);
            const unsigned nt = (unsigned)(bt > NT ? NT : bt);
            if (dout.dt == CUK_F32) k_embed_scatter_vec<CUK_F32><<<g, nt, 0, s>>>(dwte, dout, kout, vout, n);
            else if (dout.dt == CUK_BF16) k_embed_scatter_vec<CUK_BF16><<<g, nt, 0, s>>>(dwte, dout, kout, vout, n);
            else k_embed_scatter_vec<CUK_F16><<<g, nt, 0, s>>>(dwte, dout, kout, vout, n);
        } else {
            k_embed_scatter<<<g, NT, 0, s>>>(dwte, dout, kout, vout, n);
        }
        e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    if (dwpe.p) {
        if (embed_vec_ok(dout, dwpe)) {
            int64_t nb = cuk_cdiv(T * ((dwpe.cols + 7) >> 3), 128), cap = 8 * (int64_t)cuk_sm_count();
            const unsigned g = (unsigned)(nb > cap ? cap : nb < 1 ? 1 : nb);
            if (dout.dt == CUK_F32) k_embed_dwpe_vec<CUK_F32><<<g, 128, 0, s>>>(dwpe, dout, T, pos_offset);
            else if (dout.dt == CUK_BF16) k_embed_dwpe_vec<CUK_BF16><<<g, 128, 0, s>>>(dwpe, dout, T, pos_offset);
            else k_embed_dwpe_vec<CUK_F16><<<g, 128, 0, s>>>(dwpe, dout, T, pos_offset);
        } else {
            k_embed_dwpe<<<cuk_rows_grid(T, dwpe.cols, NT), NT, 0, s>>>(dwpe, dout, T, pos_offset);
        }
    }
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- cross-entropy */

__global__ void k_xent_fwd(float *losses, float *lse, float *maxv, float *sumexp, float *tlogit, cuk_mat x,
                           const int32_t *tgt, int64_t off, int64_t ncols, int ignore, int strict, cuk_errrec *err) {
    __shared__ float sh[32];
    for (int64_t n = blockIdx.x; n < x.rows; n += gridDim.x) {
        const int64_t xo = n * x.ld;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < ncols; j += blockDim.x) m = fmaxf(m, ldf(x.p, x.dt, xo + j));
        m = block_max(m, sh);
        float se = 0.0f;
        if (ncols > 0)
            for (int64_t j = threadIdx.x; j < ncols; j += blockDim.x) se += expf(ldf(x.p, x.dt, xo + j) - m);
        se = block_sum(se, sh);
        if (threadIdx.x == 0) {
            const int64_t t = tgt[n], tl = t - off;
            const int ign = t == ignore, inside = tl >= 0 && tl < ncols;
            const float l = m + logf(se);
            if (strict && !ign && !inside) cuk_report(err, CUK_ERR_TARGET, n, t, off, off + ncols);
            const float xt = (!ign && inside) ? ldf(x.p, x.dt, xo + tl) : 0.0f;
            if (lse) lse[n] = l;
            if (maxv) maxv[n] = m;
            if (sumexp) sumexp[n] = se;
            if (tlogit) tlogit[n] = xt;
            if (losses) losses[n] = (ign || !inside) ? 0.0f : l - xt;
        }
    }
}

/* ---- fast paths: 16-byte aligned rows, dtype a template parameter */

#define XU 4 /* chunks of 8 loaded per thread before any is used */

/* (m1, s1) + (m2, s2) of the online softmax; symmetric, so every lane of a
 * butterfly gets the same bits. */
CUK_INLINE void sm_combine(float &m, float &s, float m2, float s2) {
    const float M = fmaxf(m, m2);
    const float a = m == -INFINITY ? 0.0f : s * expf(m - M), b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - M);
    m = M;
    s = a + b;
}

/* This thread's XU chunks from chunk j0 of a row `width` wide: element
 * counts in cnt (0 past the end); chunks starting at or past `loadcols` are
 * not read (their values unused). */
template <int DT>
CUK_INLINE void xent_load(const void *p, int64_t xo, int64_t j0, int64_t width, int64_t loadcols, float (*v)[8],
                          int *cnt) {
    const int64_t nch = (width + 7) >> 3;
#pragma unroll
    for (int u = 0; u < XU; u++) {
        const int64_t j = j0 + u * (int64_t)blockDim.x;
        cnt[u] = j < nch ? (int)(width - 8 * j < 8 ? width - 8 * j : 8) : 0;
        if (cnt[u] > 0 && 8 * j < loadcols) cuk_ld8_tail<DT>(p, xo + 8 * j, cnt[u], v[u]);
    }
}

template <int DT>
__global__ void __launch_bounds__(512, 2) k_xent_fwd_vec(float *losses, float *lse, float *maxv, float *sumexp,
                                                      float *tlogit, cuk_mat x, const int32_t *tgt, int64_t off,
                                                      int64_t ncols, int ignore, int strict, cuk_errrec *err) {
    __shared__ float shm[32], shs[32];
    const int64_t nch = (ncols + 7) >> 3;
    for (int64_t n = blockIdx.x; n < x.rows; n += gridDim.x) {
        const int64_t xo = n * x.ld;
        float m = -INFINITY, se = 0.0f;
        for (int64_t j0 = threadIdx.x; j0 < nch; j0 += XU * (int64_t)blockDim.x) {
            float v[XU][8];
            int cnt[XU];
            xent_load<DT>(x.p, xo, j0, ncols, ncols, v, cnt);
#pragma unroll
            for (int u = 0; u < XU; u++) {
                if (cnt[u] <= 0) continue;
                float cm = -INFINITY;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (e < cnt[u]) cm = fmaxf(cm, v[u][e]);
                if (cm > m) {
                    se = m == -INFINITY ? 0.0f : se * expf(m - cm);
                    m = cm;
                }
                if (m == -INFINITY) continue;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (e < cnt[u]) se += expf(v[u][e] - m);
            }
        }
        /* warp butterfly, then the warps in order by warp 0 */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, se, o);
            sm_combine(m, se, m2, s2);
        }
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
        __syncthreads();
        if (lane == 0) {
            shm[w] = m;
            shs[w] = se;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            m = shm[0];
            se = shs[0];
            for (int k = 1; k < nw; k++) sm_combine(m, se, shm[k], shs[k]);
            const int64_t t = tgt[n], tl = t - off;
            const int ign = t == ignore, inside = tl >= 0 && tl < ncols;
            const float l = m + logf(se);
            if (strict && !ign && !inside) cuk_report(err, CUK_ERR_TARGET, n, t, off, off + ncols);
            const float xt = (!ign && inside) ? cuk_ld1<DT>(x.p, xo + tl) : 0.0f;
            if (lse) lse[n] = l;
            if (maxv) maxv[n] = m;
            if (sumexp) sumexp[n] = se;
            if (tlogit) tlogit[n] = xt;
            if (losses) losses[n] = (ign || !inside) ? 0.0f : l - xt;
        }
    }
}

template <int DT>
__global__ void __launch_bounds__(512, 2) k_xent_bwd_vec(cuk_mat dx, cuk_mat x, const float *lse, const int32_t *tgt,
                                                      const float *dl, float dscale, int64_t off, int64_t ncols,
                                                      int ignore) {
    const int64_t nch = (dx.cols + 7) >> 3;
    for (int64_t n = blockIdx.x; n < x.rows; n += gridDim.x) {
        const int64_t t = tgt[n], tl = t - off, xo = n * x.ld, go = n * dx.ld;
        const int ign = t == ignore;
        const float sc = dl ? dl[n] : dscale, L = lse[n];
        for (int64_t j0 = threadIdx.x; j0 < nch; j0 += XU * (int64_t)blockDim.x) {
            float v[XU][8];
            int cnt[XU];
            xent_load<DT>(x.p, xo, j0, dx.cols, ign ? 0 : ncols, v, cnt);
#pragma unroll
            for (int u = 0; u < XU; u++) {
                if (cnt[u] <= 0) continue;
                const int64_t c0 = 8 * (j0 + u * (int64_t)blockDim.x);
                float o[8];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int64_t j = c0 + e;
                    float gv = 0.0f;
                    if (!ign && j < ncols) {
                        gv = sc * expf(v[u][e] - L);
                        if (j == tl) gv -= sc;
                    }
                    o[e] = gv;
                }
                cuk_st8_tail<DT>(dx.p, go + c0, cnt[u], o);
            }
        }
    }
}

static bool xent_vec_dt(int dt) { return dt == CUK_F32 || dt == CUK_BF16 || dt == CUK_F16; }

static unsigned row_blocks(int64_t rows) { return (unsigned)(rows > 65536 * 16 ? 65536 * 16 : rows); }

extern "C" cudaError_t cuk_xent_fwd(cudaStream_t s, float *losses, float *lse, float *maxv, float *sumexp,
                                    float *tlogit, cuk_mat logits, const int32_t *tgt, int64_t off, int64_t ncols,
                                    int ignore_index, int strict, cuk_errrec *err) {
    if (logits.rows <= 0) return cudaSuccess;
    if (xent_vec_dt(logits.dt) && cuk_vec_ok(logits)) {
        const unsigned g = row_blocks(logits.rows);
        if (logits.dt == CUK_F32)
            k_xent_fwd_vec<CUK_F32><<<g, 512, 0, s>>>(losses, lse, maxv, sumexp, tlogit, logits, tgt, off, ncols,
                                                      ignore_index, strict, err);
        else if (logits.dt == CUK_BF16)
            k_xent_fwd_vec<CUK_BF16><<<g, 512, 0, s>>>(losses, lse, maxv, sumexp, tlogit, logits, tgt, off, ncols,
                                                       ignore_index, strict, err);
        else
            k_xent_fwd_vec<CUK_F16><<<g, 512, 0, s>>>(losses, lse, maxv, sumexp, tlogit, logits, tgt, off, ncols,
                                                      ignore_index, strict, err);
        return cudaGetLastError();
    }
    k_xent_fwd<<<row_blocks(logits.rows), 512, 0, s>>>(losses, lse, maxv, sumexp, tlogit, logits, tgt, off, ncols,
                                                       ignore_index, strict, err);
    return cudaGetLastError();
}

__global__ void k_xent_bwd(cuk_mat dx, cuk_mat x, const float *lse, const int32_t *tgt, const float *dl, float dscale,
                           int64_t off, int64_t ncols, int ignore) {
    for (int64_t n = blockIdx.x; n < x.rows; n += gridDim.x) {
        const int64_t t = tgt[n], tl = t - off, xo = n * x.ld, go = n * dx.ld;
        const int ign = t == ignore;
        const float sc = dl ? dl[n] : dscale, L = lse[n];
        for (int64_t j = threadIdx.x; j < dx.cols; j += blockDim.x) {
            float gv = 0.0f;
            if (!ign && j < ncols) {
                gv = sc * expf(ldf(x.p, x.dt, xo + j) - L);
                if (j == tl) gv -= sc;
            }
            stf(dx.p, dx.dt, go + j, gv);
        }
    }
}

extern "C" cudaError_t cuk_xent_bwd(cudaStream_t s, cuk_mat dlogits, cuk_mat logits, const float *lse,
                                    const int32_t *tgt, const float *dlosses, float dloss_scale, int64_t off,
                                    int64_t ncols, int ignore_index) {
    if (logits.rows <= 0) return cudaSuccess;
    if (xent_vec_dt(logits.dt) && logits.dt == dlogits.dt && cuk_vec_ok(logits) && cuk_vec_ok(dlogits)) {
        const unsigned g = row_blocks(logits.rows);
        if (logits.dt == CUK_F32)
            k_xent_bwd_vec<CUK_F32><<<g, 512, 0, s>>>(dlogits, logits, lse, tgt, dlosses, dloss_scale, off, ncols,
                                                      ignore_index);
        else if (logits.dt == CUK_BF16)
            k_xent_bwd_vec<CUK_BF16><<<g, 512, 0, s>>>(dlogits, logits, lse, tgt, dlosses, dloss_scale, off, ncols,
                                                       ignore_index);
        else
            k_xent_bwd_vec<CUK_F16><<<g, 512, 0, s>>>(dlogits, logits, lse, tgt, dlosses, dloss_scale, off, ncols,
                                                      ignore_index);
        return cudaGetLastError();
    }
    k_xent_bwd<<<row_blocks(logits.rows), 512, 0, s>>>(dlogits, logits, lse, tgt, dlosses, dloss_scale, off, ncols,
                                                       ignore_index);
    return cudaGetLastError();
}
