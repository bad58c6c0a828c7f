/* Token/position embeddings and the fused softmax + cross-entropy, both
 * vocab-shard aware like the CPU backend.
 *
 * embedding_bwd is deterministic without atomics: the (local id, token
 * index) pairs are radix-sorted (stable, so a token's occurrences stay in
 * sequence order), then fixed-size tiles of sorted positions are summed in
 * a fixed order (see k_embed_tiles): bitwise repeatable, and bitwise equal
 * to the CPU backend for every id whose occurrences fall in one tile.
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
__global__ void __launch_bounds__(NT)
    k_embedding_fwd_vec(cuk_mat out, const int32_t *tok, int64_t T, cuk_mat wte, cuk_mat wpe, int64_t voff,
                        int64_t vtotal, int64_t pos_offset, cuk_errrec *err) {
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
            k_embedding_fwd_vec<CUK_F32>
                <<<g, NT, 0, s>>>(out, tok, T, wte, wpe, vocab_offset, vocab_total, pos_offset, err);
        else if (out.dt == CUK_BF16)
            k_embedding_fwd_vec<CUK_BF16>
                <<<g, NT, 0, s>>>(out, tok, T, wte, wpe, vocab_offset, vocab_total, pos_offset, err);
        else
            k_embedding_fwd_vec<CUK_F16>
                <<<g, NT, 0, s>>>(out, tok, T, wte, wpe, vocab_offset, vocab_total, pos_offset, err);
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

/* The general path (other dtypes, unaligned rows): one block per sorted
 * position; only the first position of each id works, adding its rows in order. */
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

CUK_EMU_BEGIN(embed_dwte);
/* ---- dwte fast path: tiles of sorted positions.
 *
 * The sorted positions are cut into tiles of S (a multiple of EMB_CHUNK)
 * consecutive positions, so every block sums the same number of dout rows
 * however the tokens are distributed. A tile holds pieces: the parts of
 * the runs of equal ids that fall inside it. A piece that is a whole run
 * is added straight into dwte (dwte + r0 + r1 + ..., the CPU's order, so
 * short runs stay bitwise equal to the CPU backend). A run that crosses
 * tile boundaries leaves one partial sum per tile it touches (0 + rows in
 * sorted order) in scratch: the tile where it starts writes the tail slot,
 * each later tile its head slot; k_embed_finish then adds, per such run,
 * dwte + tail + head + head ... in tile order. All orders follow from the
 * sorted positions and S alone (S from n, the row width and the scratch
 * size), never from scheduling: the result is bitwise repeatable and the
 * same on any GPU. Out-of-shard tokens carry the key v and sort last;
 * blocks stop at the first of them. */

#define EMB_CHUNK 64 /* positions staged in shared memory at a time; S is a multiple */
#define EMB_U 8      /* dout rows (finisher: partials) in flight per thread */
#define EMB_NT 128   /* threads of a block at most (a thread per 8 columns) */

struct emb_tiles {
    int64_t n, S, ntiles, ldp; /* ldp: row stride of the partial slots (cols rounded up to 8) */
    float *part;               /* slot 2t: head piece of tile t, slot 2t + 1: its tail piece */
};

/* 8 columns of a dout row as loaded: full chunks keep the raw 16-byte words
 * (one uint4 of bf16/f16, two of f32) and convert when added, so a batch of
 * rows costs half the registers in 16-bit dtypes; a row's partial last
 * chunk (cnt < 8) is loaded element-wise as floats. */
template <int DT, bool FULL> struct emb_row { uint4 q[DT == CUK_F32 ? 2 : 1]; };
template <int DT> struct emb_row<DT, false> { float f[8]; };

template <int DT, bool FULL>
CUK_INLINE void emb_ld(emb_row<DT, FULL> &r, const cuk_mat &m, int64_t row, int64_t c, int cnt) {
    if constexpr (FULL) {
        const uint4 *q = (const uint4 *)((const char *)m.p + (row * m.ld + c) * (DT == CUK_F32 ? 4 : 2));
        r.q[0] = q[0];
        if constexpr (DT == CUK_F32) r.q[1] = q[1];
    } else {
        cuk_ld8_tail<DT>(m.p, row * m.ld + c, cnt, r.f);
    }
}

/* acc[e] += element e of r (the conversions of cuk_ld8: the same f32 values). */
template <int DT, bool FULL> CUK_INLINE void emb_add(float *acc, const emb_row<DT, FULL> &r) {
    if constexpr (!FULL) {
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] += r.f[e];
    } else if constexpr (DT == CUK_F32) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            acc[4 * k] += __uint_as_float(r.q[k].x);
            acc[4 * k + 1] += __uint_as_float(r.q[k].y);
            acc[4 * k + 2] += __uint_as_float(r.q[k].z);
            acc[4 * k + 3] += __uint_as_float(r.q[k].w);
        }
    } else {
        const uint32_t w[4] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint16_t lo = (uint16_t)(w[k] & 0xffffu), hi = (uint16_t)(w[k] >> 16);
            acc[2 * k] += DT == CUK_BF16 ? cuk_bf16_to_f32(lo) : cuk_f16_to_f32(lo);
            acc[2 * k + 1] += DT == CUK_BF16 ? cuk_bf16_to_f32(hi) : cuk_f16_to_f32(hi);
        }
    }
}

/* One thread's 8 columns of tile t: pieces in sorted order, a batch of rows in
 * flight, and with them the dwte chunks of the batch's pieces that go
 * straight into dwte (typical text has a new id every few positions: a
 * dwte load waited for at each piece start made tiles latency-bound). */
template <int DT, bool FULL>
CUK_INLINE void emb_tile_cols(const cuk_mat &dwte, const cuk_mat &dout, const emb_tiles &tl, int64_t t, int64_t c,
                              int cnt, const uint32_t *sk, const int32_t *sv, int64_t b0, int cn, int64_t t0,
                              uint32_t kbefore, uint32_t kafter, uint32_t &cur, float *&dst, float *acc) {
    /* f32 rows: half the batch (twice the registers a row); a row's partial chunk: 2 (its registers
     * count for the whole kernel) */
    constexpr int U = FULL ? (DT == CUK_F32 ? EMB_U / 2 : EMB_U) : 2;
    const uint32_t v = (uint32_t)dwte.rows;
    for (int i0 = 0; i0 < cn; i0 += U) {
        emb_row<DT, FULL> d[U];
        float w[U][8];
        bool direct[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + u, ok = i < cn && sk[i] < v;
            const uint32_t K = ok ? sk[i] : v, prev = u == 0 ? cur : sk[i - 1];
            /* a piece starts here and is a whole run: not the tile's first position continuing an
             * earlier tile's run, not running on past the tile */
            direct[u] = ok && K != prev && !(b0 + i == t0 && kbefore == K) && kafter != K;
            emb_ld<DT, FULL>(d[u], dout, sv[ok ? i : i0], c, cnt);
            if (direct[u]) cuk_ld8_tail<CUK_F32>(dwte.p, (int64_t)K * dwte.ld + c, cnt, w[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + u;
            if (i >= cn || sk[i] >= v) return; /* the chunk's end, or the out-of-shard keys (sorted last) */
            const uint32_t K = sk[i];
            if (K != cur) {
                if (dst) cuk_st8_tail<CUK_F32>(dst, c, cnt, acc);
                cur = K;
                if (direct[u]) dst = (float *)dwte.p + (int64_t)K * dwte.ld;
                else if (b0 + i == t0 && kbefore == K) dst = tl.part + 2 * t * tl.ldp; /* run began earlier */
                else dst = tl.part + (2 * t + 1) * tl.ldp;                             /* run goes on past */
#pragma unroll
                for (int e = 0; e < 8; e++) acc[e] = direct[u] ? w[u][e] : 0.0f;
            }
            emb_add<DT, FULL>(acc, d[u]);
        }
    }
}

/* Grid: (tiles, column slices of blockDim.x <= EMB_NT chunks of 8). At most
 * 168 registers (no spills): 4 blocks of 96 threads (d_model 768) per SM,
 * so GPT-2's 512 tiles of 32768 tokens are one wave on 132 SMs. */
template <int DT>
__global__ void __launch_bounds__(EMB_NT, 3)
    k_embed_tiles(cuk_mat dwte, cuk_mat dout, const uint32_t *keys, const int32_t *vals, emb_tiles tl) {
    __shared__ uint32_t sk[EMB_CHUNK];
    __shared__ int32_t sv[EMB_CHUNK];
    const uint32_t v = (uint32_t)dwte.rows;
    const int64_t j = blockIdx.y * (int64_t)blockDim.x + threadIdx.x, c = 8 * j;
    const int cnt = (int)(dwte.cols - c < 8 ? dwte.cols - c : 8); /* <= 0: a thread without columns */
    for (int64_t t = blockIdx.x; t < tl.ntiles; t += gridDim.x) {
        const int64_t t0 = t * tl.S, t1 = t0 + tl.S < tl.n ? t0 + tl.S : tl.n;
        if (keys[t0] >= v) break; /* out-of-shard from here on (ascending tiles) */
        const uint32_t kbefore = t0 > 0 ? keys[t0 - 1] : UINT32_MAX, kafter = t1 < tl.n ? keys[t1] : UINT32_MAX;
        uint32_t cur = UINT32_MAX;
        float *dst = NULL, acc[8];
        for (int64_t b0 = t0; b0 < t1; b0 += EMB_CHUNK) {
            const int cn = (int)(t1 - b0 < EMB_CHUNK ? t1 - b0 : EMB_CHUNK);
            __syncthreads(); /* the previous chunk is read */
            for (int i = threadIdx.x; i < cn; i += blockDim.x) {
                sk[i] = keys[b0 + i];
                sv[i] = vals[b0 + i];
            }
            __syncthreads();
            if (cnt == 8)
                emb_tile_cols<DT, true>(dwte, dout, tl, t, c, cnt, sk, sv, b0, cn, t0, kbefore, kafter, cur, dst, acc);
            else if (cnt > 0)
                emb_tile_cols<DT, false>(dwte, dout, tl, t, c, cnt, sk, sv, b0, cn, t0, kbefore, kafter, cur, dst, acc);
        }
        if (dst && cnt > 0) cuk_st8_tail<CUK_F32>(dst, c, cnt, acc);
    }
}

/* Per run that starts in tile t and goes on past it: dwte += tail(t),
 * head(t + 1), ... in order, EMB_U partials in flight (slots past the
 * run's end are loaded, from valid tiles, and not added). */
__global__ void __launch_bounds__(EMB_NT) k_embed_finish(cuk_mat dwte, const uint32_t *keys, emb_tiles tl) {
    const uint32_t v = (uint32_t)dwte.rows;
    const int64_t j = blockIdx.y * (int64_t)blockDim.x + threadIdx.x, c = 8 * j;
    const int cnt = (int)(dwte.cols - c < 8 ? dwte.cols - c : 8);
    if (cnt <= 0) return;
    for (int64_t t = blockIdx.x; t < tl.ntiles; t += gridDim.x) {
        const int64_t t0 = t * tl.S, t1 = t0 + tl.S;
        if (t1 >= tl.n) break;
        const uint32_t K = keys[t1 - 1];
        if (K >= v) break;
        if (keys[t1] != K || (t0 > 0 && keys[t0 - 1] == K)) continue; /* no run starts here and goes on */
        float *row = (float *)dwte.p + (int64_t)K * dwte.ld, acc[8], p[8];
        cuk_ld8_tail<CUK_F32>(row, c, cnt, acc);
        cuk_ld8_tail<CUK_F32>(tl.part + (2 * t + 1) * tl.ldp, c, cnt, p);
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] += p[e];
        for (int64_t u0 = t + 1;; u0 += EMB_U) {
            float h[EMB_U][8];
            bool more[EMB_U];
#pragma unroll
            for (int u = 0; u < EMB_U; u++) {
                const int64_t tt = u0 + u < tl.ntiles ? u0 + u : tl.ntiles - 1, e1 = (tt + 1) * tl.S;
                cuk_ld8_tail<CUK_F32>(tl.part + 2 * tt * tl.ldp, c, cnt, h[u]);
                more[u] = e1 < tl.n && keys[e1] == K;
            }
            bool done = false;
#pragma unroll
            for (int u = 0; u < EMB_U && !done; u++) {
#pragma unroll
                for (int e = 0; e < 8; e++) acc[e] += h[u][e];
                done = !more[u];
            }
            if (done) break;
        }
        cuk_st8_tail<CUK_F32>(row, c, cnt, acc);
    }
}

CUK_EMU_END(embed_dwte);

/* dwpe's fast path (dout 16-byte aligned rows of a float dtype, dwpe rows
 * 16-byte aligned): 8 columns per thread, the same additions in the same
 * order per element (bitwise equal to the general kernel). */
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

CUK_EMU_BEGIN(embed_tile_len);
static int64_t emb_ldp(int64_t cols) { return (cols + 7) & ~(int64_t)7; }

/* Bytes of the partial slots with tiles of S positions. */
static size_t emb_part_bytes(int64_t n, int64_t S, int64_t cols) {
    return align256((size_t)(2 * cuk_cdiv(n, S) * emb_ldp(cols)) * sizeof(float));
}

/* The tile: the smallest EMB_CHUNK * 2^k whose partial slots fit in avail
 * bytes (EMB_CHUNK with the default scratch at GPT-2 sizes); one tile of
 * all n positions at worst (no partials used, two slots reserved). */
static int64_t emb_tile_len(int64_t n, int64_t cols, size_t avail) {
    int64_t S = EMB_CHUNK;
    while (S < n && emb_part_bytes(n, S, cols) > avail) S *= 2;
    return S;
}

CUK_EMU_END(embed_tile_len);

/* The minimum: sort buffers plus the partial slots of a single tile; the
 * launcher takes shorter tiles when more scratch is given. */
extern "C" size_t cuk_embedding_bwd_scratch(int64_t n, int64_t v, int64_t cols) {
    if (n <= 0 || v <= 0) return 0;
    return 4 * align256((size_t)n * sizeof(int32_t)) + align256(sort_temp_bytes(n, v)) +
           emb_part_bytes(1, 1, cols < 1 ? 1 : cols);
}

template <int DT>
static void emb_launch(cudaStream_t s, cuk_mat dwte, cuk_mat dout, const uint32_t *keys, const int32_t *vals,
                       emb_tiles tl, dim3 g, unsigned nt) {
    k_embed_tiles<DT><<<g, nt, 0, s>>>(dwte, dout, keys, vals, tl);
    if (tl.ntiles > 1) k_embed_finish<<<g, nt, 0, s>>>(dwte, keys, tl);
}

extern "C" cudaError_t cuk_embedding_bwd(cudaStream_t s, cuk_mat dwte, cuk_mat dwpe, cuk_mat dout, const int32_t *tok,
                                         int64_t T, int64_t vocab_offset, int64_t pos_offset, void *scratch,
                                         size_t scratch_bytes) {
    const int64_t n = dout.rows;
    if (n <= 0 || dout.cols <= 0) return cudaSuccess;
    if (dwte.p && dwte.rows > 0) {
        size_t ib = align256((size_t)n * sizeof(int32_t)), tb = sort_temp_bytes(n, dwte.rows);
        const size_t used = 4 * ib + align256(tb);
        if (scratch_bytes < used + emb_part_bytes(1, 1, dwte.cols)) return cudaErrorMemoryAllocation;
        char *sp = (char *)scratch;
        uint32_t *kin = (uint32_t *)sp, *kout = (uint32_t *)(sp + 2 * ib);
        int32_t *vin = (int32_t *)(sp + ib), *vout = (int32_t *)(sp + 3 * ib);
        void *temp = sp + 4 * ib;
        int64_t nb = cuk_cdiv(n, NT);
        k_embed_keys<<<(unsigned)(nb > 65536 ? 65536 : nb), NT, 0, s>>>(tok, n, vocab_offset, dwte.rows, kin, vin);
        cudaError_t e =
            cub::DeviceRadixSort::SortPairs(temp, tb, kin, kout, vin, vout, (int)n, 0, bits_for(dwte.rows), s);
        if (e != cudaSuccess) return e;
        if (embed_vec_ok(dout, dwte)) {
            emb_tiles tl;
            tl.n = n;
            tl.S = emb_tile_len(n, dwte.cols, scratch_bytes - used);
            tl.ntiles = cuk_cdiv(n, tl.S);
            tl.ldp = emb_ldp(dwte.cols);
            tl.part = (float *)(sp + used);
            /* one thread per 8 columns: blocks of 32 * ceil(chunks / 32) threads, at most EMB_NT, y over the rest */
            const int64_t nch = (dwte.cols + 7) >> 3, bt = 32 * cuk_cdiv(nch, 32);
            const unsigned nt = (unsigned)(bt > EMB_NT ? EMB_NT : bt);
            const dim3 g((unsigned)(tl.ntiles > (1 << 20) ? (1 << 20) : tl.ntiles), (unsigned)cuk_cdiv(nch, nt));
            if (dout.dt == CUK_F32) emb_launch<CUK_F32>(s, dwte, dout, kout, vout, tl, g, nt);
            else if (dout.dt == CUK_BF16) emb_launch<CUK_BF16>(s, dwte, dout, kout, vout, tl, g, nt);
            else emb_launch<CUK_F16>(s, dwte, dout, kout, vout, tl, g, nt);
        } else {
            k_embed_scatter<<<(unsigned)(n > 65536 ? 65536 : n), NT, 0, s>>>(dwte, dout, kout, vout, n);
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

/* ---------------------------------------------------------------- argmax */

/* (v, j) beats (bv, bj): a NaN first, then the larger value, then the
 * lower column; j < 0 is "none yet". A total order, so any reduction tree
 * gives the CPU's answer. */
CUK_INLINE bool am_better(float v, int64_t j, float bv, int64_t bj) {
    if (j < 0) return false;
    if (bj < 0) return true;
    const bool n = isnan(v), bn = isnan(bv);
    if (n != bn) return n;
    if (!n && v != bv) return v > bv;
    return j < bj;
}

#define AM_NT 512

/* The warp's best (value, column), on lane 0. */
CUK_INLINE void am_warp(float &bv, int64_t &bj) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, bv, o);
        const int64_t oj = __shfl_down_sync(0xffffffffu, bj, o);
        if (am_better(ov, oj, bv, bj)) {
            bv = ov;
            bj = oj;
        }
    }
}

/* The block's best of its threads' (bv, bj), on thread 0. */
CUK_INLINE void am_finish(float bv, int64_t bj, float *bv_out, int64_t *bj_out) {
    __shared__ float shv[AM_NT / 32];
    __shared__ int64_t shj[AM_NT / 32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    am_warp(bv, bj);
    if (lane == 0) {
        shv[w] = bv;
        shj[w] = bj;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < AM_NT / 32; k++)
            if (am_better(shv[k], shj[k], bv, bj)) {
                bv = shv[k];
                bj = shj[k];
            }
        *bv_out = bv;
        *bj_out = bj;
    }
    __syncthreads();
}

/* The block's best (value, column) of columns [lo, hi) of row xo, on thread 0. */
CUK_INLINE void am_block(const cuk_mat &x, int64_t xo, int64_t lo, int64_t hi, float *bv_out, int64_t *bj_out) {
    float bv = -INFINITY;
    int64_t bj = -1;
    for (int64_t j = lo + threadIdx.x; j < hi; j += AM_NT) {
        const float v = ldf(x.p, x.dt, xo + j);
        if (am_better(v, j, bv, bj)) {
            bv = v;
            bj = j;
        }
    }
    am_finish(bv, bj, bv_out, bj_out);
}

/* am_block's scan over a row whose 8-column chunks start 16-byte aligned
 * (lo a multiple of 8): a thread's chunks are a 16-byte load each (two for
 * f32), AM_U of them issued before any is compared; one 2-byte load at a
 * time made a Llama 1B decode step at batch 256 (64 MB of logits) 2%
 * slower on an H100 (bench/RESULTS.md). am_better is a total order, so the
 * result is the scalar scan's. */
#define AM_U 4
template <int DT>
CUK_INLINE void am_block8(const cuk_mat &x, int64_t xo, int64_t lo, int64_t hi, float *bv_out, int64_t *bj_out) {
    float bv = -INFINITY;
    int64_t bj = -1;
    for (int64_t c = lo + 8 * (int64_t)threadIdx.x; c < hi; c += AM_U * 8 * AM_NT) {
        float v[AM_U][8];
        int n[AM_U];
#pragma unroll
        for (int u = 0; u < AM_U; u++) {
            const int64_t cu = c + (int64_t)u * 8 * AM_NT, left = hi - cu;
            n[u] = left <= 0 ? 0 : left < 8 ? (int)left : 8;
            if (n[u] > 0) cuk_ld8_tail<DT>(x.p, xo + cu, n[u], v[u]);
        }
#pragma unroll
        for (int u = 0; u < AM_U; u++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int64_t j = c + (int64_t)u * 8 * AM_NT + e;
                if (e < n[u] && am_better(v[u][e], j, bv, bj)) {
                    bv = v[u][e];
                    bj = j;
                }
            }
    }
    am_finish(bv, bj, bv_out, bj_out);
}

/* Block (s, n) reduces slice s of row n (span columns, a multiple of 8 on
 * the vector path, DT >= 0): to the row's result when the row has one
 * slice, else to its partial in pv/pj [rows, S]. */
template <int DT>
__global__ void __launch_bounds__(AM_NT) k_argmax_rows(int32_t *idx, float *maxv, cuk_mat x, int64_t off, int64_t ncols,
                                                       int64_t span, int S, float *pv, int64_t *pj) {
    const int64_t lo = blockIdx.x * span, hi = lo + span < ncols ? lo + span : ncols;
    for (int64_t n = blockIdx.y; n < x.rows; n += gridDim.y) {
        float bv;
        int64_t bj;
        if constexpr (DT < 0) am_block(x, n * x.ld, lo, hi, &bv, &bj);
        else am_block8<DT>(x, n * x.ld, lo, hi, &bv, &bj);
        if (threadIdx.x != 0) continue;
        if (S == 1) {
            idx[n] = bj < 0 ? -1 : (int32_t)(off + bj);
            maxv[n] = bv;
        } else {
            pv[n * S + blockIdx.x] = bv;
            pj[n * S + blockIdx.x] = bj;
        }
    }
}

/* A warp per row (one thread scanning a batch-1 row's 264 slices took 11 us
 * on an H200): lane l takes slices l, l + 32, ..., then the lanes combine
 * by shuffles. am_better is a total order, so the winner is a serial scan's. */
__global__ void k_argmax_merge(int32_t *idx, float *maxv, int64_t rows, int64_t off, int S, const float *pv,
                               const int64_t *pj) {
    const int64_t n = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (n >= rows) return;
    float bv = -INFINITY;
    int64_t bj = -1;
    for (int s = lane; s < S; s += 32)
        if (am_better(pv[n * S + s], pj[n * S + s], bv, bj)) {
            bv = pv[n * S + s];
            bj = pj[n * S + s];
        }
    am_warp(bv, bj);
    if (lane != 0) return;
    idx[n] = bj < 0 ? -1 : (int32_t)(off + bj);
    maxv[n] = bv;
}

size_t cuk_argmax_ws_bytes(int64_t rows, int64_t ncols) {
    (void)ncols;
    return (size_t)(rows > 0 ? rows : 0) * CUK_ARGMAX_MAX_SLICES * (sizeof(float) + sizeof(int64_t)) + 16;
}

/* A decode step has few rows and a wide vocabulary: rows are cut into
 * slices (blocks of their own) until the grid covers the GPU twice, each
 * slice at least AM_NT * 8 columns (a chunk a thread); one row per block
 * from 2 x SMs rows on. */
cudaError_t cuk_argmax_rows(cudaStream_t s, int32_t *idx, float *maxv, cuk_mat x, int64_t off, int64_t ncols, void *ws,
                            size_t ws_bytes) {
    if (x.rows <= 0) return cudaSuccess;
    const int64_t sms = (int64_t)cuk_sm_count();
    int64_t S = (2 * sms + x.rows - 1) / x.rows, by_cols = (ncols + 8 * AM_NT - 1) / (8 * AM_NT);
    if (S > by_cols) S = by_cols;
    if (S > CUK_ARGMAX_MAX_SLICES) S = CUK_ARGMAX_MAX_SLICES;
    if (S < 1 || !ws || ws_bytes < cuk_argmax_ws_bytes(x.rows, ncols)) S = 1;
    const int64_t span = ((ncols + S - 1) / S + 7) / 8 * 8;
    const unsigned gy = (unsigned)(x.rows < 65535 ? x.rows : 65535);
    int64_t *pj = (int64_t *)(((uintptr_t)ws + 7) & ~(uintptr_t)7);
    float *pv = (float *)(pj + x.rows * S);
    const dim3 grid((unsigned)S, gy);
    if (!cuk_vec_ok(x)) k_argmax_rows<-1><<<grid, AM_NT, 0, s>>>(idx, maxv, x, off, ncols, span, (int)S, pv, pj);
    else if (x.dt == CUK_F32)
        k_argmax_rows<CUK_F32><<<grid, AM_NT, 0, s>>>(idx, maxv, x, off, ncols, span, (int)S, pv, pj);
    else if (x.dt == CUK_BF16)
        k_argmax_rows<CUK_BF16><<<grid, AM_NT, 0, s>>>(idx, maxv, x, off, ncols, span, (int)S, pv, pj);
    else k_argmax_rows<CUK_F16><<<grid, AM_NT, 0, s>>>(idx, maxv, x, off, ncols, span, (int)S, pv, pj);
    if (S > 1) k_argmax_merge<<<(unsigned)((x.rows + 3) / 4), 128, 0, s>>>(idx, maxv, x.rows, off, (int)S, pv, pj);
    return cudaGetLastError();
}

CUK_EMU_BEGIN(xent_fast);
/* ---- fast paths: 16-byte aligned rows, dtype a template parameter.
 *
 * A thread takes chunks j = tid, tid + XNT, ... of 8 logits. The chunks that
 * lie wholly inside the valid columns go in batches of XU(DT) (128 bytes a
 * thread): the batch's 16-byte loads are issued into raw registers, with
 * out-of-range slots reading a valid chunk instead of branching, before
 * any is converted, so all of them are in flight at once (a conversion
 * right after each guarded load would make every load wait for the
 * previous one). The row's partial chunk and padding chunks are handled one
 * by one after the batches. Exponentials are ex2.approx of (x - max) *
 * log2(e) (two instructions instead of expf's ~8: with expf the loop is
 * instruction-bound at HBM3 bandwidth; relative error ~2^-22, within the
 * f32 tolerance of the CPU's expf). Column indices within a row are 32-bit. */

#define XNT 512
#define XU(DT) ((DT) == CUK_F32 ? 4 : 8)
#define XLOG2E 1.4426950408889634f

CUK_INLINE float xex2(float t) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));
    return r;
}

/* 8 logits as stored: one uint4 of bf16/f16, two of f32. */
template <int DT> struct xraw { uint4 q[DT == CUK_F32 ? 2 : 1]; };

/* Full chunk j of the row at p (16-byte aligned). */
template <int DT> CUK_INLINE void xraw_ld(xraw<DT> &r, const void *p, int j) {
    const uint4 *s = (const uint4 *)p + (DT == CUK_F32 ? 2 : 1) * (int64_t)j;
    r.q[0] = s[0];
    if constexpr (DT == CUK_F32) r.q[1] = s[1];
}

/* A thread's batch of full chunks j0 + u XNT (u < U) of a row of nfull full
 * chunks: slots past the end load chunk j0 instead (unused), so the loads
 * need no branch. */
template <int DT, int U> CUK_INLINE void xraw_batch(xraw<DT> *r, const void *row, int j0, int nfull) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j = j0 + u * XNT;
        xraw_ld<DT>(r[u], row, j < nfull ? j : j0);
    }
}

/* The conversions of cuk_ld8 (the same f32 values). */
template <int DT> CUK_INLINE void xraw_cvt(const xraw<DT> &r, float *v) {
    const uint32_t w[4] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w};
    if constexpr (DT == CUK_F32) {
        const uint32_t w2[4] = {r.q[1].x, r.q[1].y, r.q[1].z, r.q[1].w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = __uint_as_float(w[k]);
            v[4 + k] = __uint_as_float(w2[k]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint16_t lo = (uint16_t)(w[k] & 0xffffu), hi = (uint16_t)(w[k] >> 16);
            v[2 * k] = DT == CUK_BF16 ? cuk_bf16_to_f32(lo) : cuk_f16_to_f32(lo);
            v[2 * k + 1] = DT == CUK_BF16 ? cuk_bf16_to_f32(hi) : cuk_f16_to_f32(hi);
        }
    }
}

/* The running (max, sum) pairs of a warp's lanes combined: the warp's max,
 * then each lane's sum rescaled to it, summed by the butterfly (x + y on
 * both sides of each exchange, so every lane gets the same bits). */
CUK_INLINE void sm_warp(float &m, float &se) {
    const float M = warp_max(m);
    se = warp_sum(m == -INFINITY ? 0.0f : se * expf(m - M));
    m = M;
}

/* Adds n (<= 8) logits v to the running (m, se) of this thread. */
CUK_INLINE void sm_add(float &m, float &se, const float *v, int n) {
    float cm = -INFINITY;
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (e < n) cm = fmaxf(cm, v[e]);
    if (cm > m) {
        se = m == -INFINITY ? 0.0f : se * expf(m - cm);
        m = cm;
    }
    if (m == -INFINITY) return;
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (e < n) se += xex2((v[e] - m) * XLOG2E);
}

/* f(j, v) for each of this thread's full chunks j = tid, tid + XNT, ... of
 * a row of nfull full chunks, v its 8 logits in f32: a batch of XU(DT)
 * chunks is loaded before any is converted. */
template <int DT, class F> CUK_INLINE void xent_full_chunks(const char *row, int nfull, F &&f) {
    constexpr int U = XU(DT);
    for (int j0 = threadIdx.x; j0 < nfull; j0 += U * XNT) {
        xraw<DT> r[U];
        xraw_batch<DT, U>(r, row, j0, nfull);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * XNT;
            if (j >= nfull) break;
            float v[8];
            xraw_cvt<DT>(r[u], v);
            f(j, v);
        }
    }
}

/* One row's dlogits = sc * softmax - sc at the target, 0 in padding
 * columns and ignored rows, this thread's chunks of the row. In place
 * allowed (a chunk is loaded before it is stored, by the same thread). */
template <int DT>
CUK_INLINE void xent_grad_row(cuk_mat dx, const char *row, int64_t go, int nc, int jt, int et, int ign, float sc,
                              float L) {
    const int tid = threadIdx.x, nfull = nc >> 3, nch = (int)((dx.cols + 7) >> 3);
    xent_full_chunks<DT>(row, nfull, [&](int j, const float *v) {
        float o[8];
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = ign ? 0.0f : sc * xex2((v[e] - L) * XLOG2E);
        if (j == jt)
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (e == et) o[e] -= sc;
        cuk_st8<DT>(dx.p, go + 8 * (int64_t)j, o);
    });
    /* the partial chunk of the valid columns and the padding chunks */
    for (int j = nfull + tid; j < nch; j += XNT) {
        const int c0 = 8 * j, nv = nc - c0 < 0 ? 0 : nc - c0 < 8 ? nc - c0 : 8;
        const int cnt = dx.cols - c0 < 8 ? (int)(dx.cols - c0) : 8;
        float v[8], o[8];
        if (nv > 0 && !ign) cuk_ld8_tail<DT>(row, c0, nv, v);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float gv = 0.0f;
            if (!ign && e < nv) {
                gv = sc * xex2((v[e] - L) * XLOG2E);
                if (j == jt && e == et) gv -= sc;
            }
            o[e] = gv;
        }
        cuk_st8_tail<DT>(dx.p, go + c0, cnt, o);
    }
}

/* The statistics of each row (lse, losses, max, sum, target logit). FUSED
 * (xent_fwd_bwd): once warp 0 has the row's lse, every thread writes the
 * gradient of its own chunks (xent_grad_row with scale dscale into dx),
 * reading them again from memory -- the row the block has just read is
 * still in L2 (a row is <= 100 KB; the ~260 rows resident at once fit the
 * 50 MB L2 many times over). A thread reads back only what it loaded
 * itself, so the data needs no barrier; the lse reaches all threads
 * through shl. (Keeping the row in shared memory instead, to read DRAM
 * once, was slower: docs/cuda.md.) */
template <int DT, bool FUSED>
__global__ void __launch_bounds__(XNT, 2)
    k_xent_fwd_vec(float *losses, float *lse, float *maxv, float *sumexp, float *tlogit, cuk_mat x, const int32_t *tgt,
                   int64_t off, int64_t ncols, int ignore, int strict, cuk_errrec *err, cuk_mat dx, float dscale) {
    __shared__ float shm[32], shs[32], shx;
    __shared__ float shl;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = XNT / 32;
    const int nc = (int)ncols, nfull = nc >> 3;
    for (int64_t n = blockIdx.x; n < x.rows; n += gridDim.x) {
        const char *row = (const char *)x.p + n * x.ld * (DT == CUK_F32 ? 4 : 2);
        const int64_t t = tgt[n], tl = t - off;
        const int ign = t == ignore, inside = tl >= 0 && tl < ncols;
        const int jt = !ign && inside ? (int)(tl >> 3) : -1, et = (int)(tl & 7);
        float m = -INFINITY, se = 0.0f, xt = 0.0f;
        xent_full_chunks<DT>(row, nfull, [&](int j, const float *v) {
            sm_add(m, se, v, 8);
            if (j == jt)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (e == et) xt = v[e];
        });
        if ((nc & 7) && tid == nfull % XNT) { /* the partial chunk, by the thread next in line */
            float v[8];
            cuk_ld8_tail<DT>(row, 8 * (int64_t)nfull, nc & 7, v);
            sm_add(m, se, v, nc & 7);
            if (nfull == jt)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (e == et) xt = v[e];
        }
        /* the warp's pairs, then the warps' pairs in warp 0 */
        sm_warp(m, se);
        __syncthreads(); /* the previous row's values are read */
        if (lane == 0) {
            shm[w] = m;
            shs[w] = se;
        }
        if (jt >= 0 && jt % XNT == tid) shx = xt; /* the owner of the target's chunk */
        __syncthreads();
        if (w == 0) {
            m = lane < nw ? shm[lane] : -INFINITY;
            se = lane < nw ? shs[lane] : 0.0f;
            sm_warp(m, se);
            if (lane == 0) {
                const float l = m + logf(se);
                if (strict && !ign && !inside) cuk_report(err, CUK_ERR_TARGET, n, t, off, off + ncols);
                const float xtv = jt >= 0 ? shx : 0.0f;
                if (lse) lse[n] = l;
                if (maxv) maxv[n] = m;
                if (sumexp) sumexp[n] = se;
                if (tlogit) tlogit[n] = xtv;
                if (losses) losses[n] = (ign || !inside) ? 0.0f : l - xtv;
                if constexpr (FUSED) shl = l;
            }
        }
        if constexpr (FUSED) {
            __syncthreads();
            xent_grad_row<DT>(dx, row, n * dx.ld, nc, jt, et, ign, dscale, shl);
        }
    }
}

/* No block-wide step: warps run ahead freely. */
template <int DT>
__global__ void __launch_bounds__(XNT, 2)
    k_xent_bwd_vec(cuk_mat dx, cuk_mat x, const float *lse, const int32_t *tgt, const float *dl, float dscale,
                   int64_t off, int64_t ncols, int ignore) {
    for (int64_t n = blockIdx.x; n < x.rows; n += gridDim.x) {
        const char *row = (const char *)x.p + n * x.ld * (DT == CUK_F32 ? 4 : 2);
        const int64_t t = tgt[n], tl = t - off;
        const int ign = t == ignore;
        const int jt = !ign && tl >= 0 && tl < ncols ? (int)(tl >> 3) : -1, et = (int)(tl & 7);
        xent_grad_row<DT>(dx, row, n * dx.ld, (int)ncols, jt, et, ign, dl ? dl[n] : dscale, lse[n]);
    }
}

CUK_EMU_END(xent_fast);

static bool xent_vec_dt(int dt) { return dt == CUK_F32 || dt == CUK_BF16 || dt == CUK_F16; }

/* The fast paths index columns in 32 bits. */
static bool xent_vec_ok(cuk_mat m) { return xent_vec_dt(m.dt) && cuk_vec_ok(m) && m.cols < ((int64_t)1 << 30); }

static unsigned row_blocks(int64_t rows) { return (unsigned)(rows > 65536 * 16 ? 65536 * 16 : rows); }

extern "C" cudaError_t cuk_xent_fwd(cudaStream_t s, float *losses, float *lse, float *maxv, float *sumexp,
                                    float *tlogit, cuk_mat logits, const int32_t *tgt, int64_t off, int64_t ncols,
                                    int ignore_index, int strict, cuk_errrec *err) {
    if (logits.rows <= 0) return cudaSuccess;
    if (xent_vec_ok(logits)) {
        const unsigned g = row_blocks(logits.rows);
        const cuk_mat none = {nullptr, 0, 0, 0, logits.dt};
        if (logits.dt == CUK_F32)
            k_xent_fwd_vec<CUK_F32, false><<<g, XNT, 0, s>>>(losses, lse, maxv, sumexp, tlogit, logits, tgt, off, ncols,
                                                             ignore_index, strict, err, none, 0.0f);
        else if (logits.dt == CUK_BF16)
            k_xent_fwd_vec<CUK_BF16, false><<<g, XNT, 0, s>>>(losses, lse, maxv, sumexp, tlogit, logits, tgt, off,
                                                              ncols, ignore_index, strict, err, none, 0.0f);
        else
            k_xent_fwd_vec<CUK_F16, false><<<g, XNT, 0, s>>>(losses, lse, maxv, sumexp, tlogit, logits, tgt, off, ncols,
                                                             ignore_index, strict, err, none, 0.0f);
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
    if (logits.dt == dlogits.dt && xent_vec_ok(logits) && xent_vec_ok(dlogits)) {
        const unsigned g = row_blocks(logits.rows);
        if (logits.dt == CUK_F32)
            k_xent_bwd_vec<CUK_F32>
                <<<g, XNT, 0, s>>>(dlogits, logits, lse, tgt, dlosses, dloss_scale, off, ncols, ignore_index);
        else if (logits.dt == CUK_BF16)
            k_xent_bwd_vec<CUK_BF16>
                <<<g, XNT, 0, s>>>(dlogits, logits, lse, tgt, dlosses, dloss_scale, off, ncols, ignore_index);
        else
            k_xent_bwd_vec<CUK_F16>
                <<<g, XNT, 0, s>>>(dlogits, logits, lse, tgt, dlosses, dloss_scale, off, ncols, ignore_index);
        return cudaGetLastError();
    }
    k_xent_bwd<<<row_blocks(logits.rows), 512, 0, s>>>(dlogits, logits, lse, tgt, dlosses, dloss_scale, off, ncols,
                                                       ignore_index);
    return cudaGetLastError();
}

template <int DT>
static cudaError_t launch_fused(cudaStream_t s, float *losses, float *lse, cuk_mat dlogits, cuk_mat logits,
                                const int32_t *tgt, float dscale, int64_t off, int64_t ncols, int ignore,
                                cuk_errrec *err) {
    k_xent_fwd_vec<DT, true><<<row_blocks(logits.rows), XNT, 0, s>>>(losses, lse, nullptr, nullptr, nullptr, logits,
                                                                     tgt, off, ncols, ignore, 1, err, dlogits, dscale);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_xent_fwd_bwd(cudaStream_t s, float *losses, float *lse, cuk_mat dlogits, cuk_mat logits,
                                        const int32_t *tgt, float dloss_scale, int64_t off, int64_t ncols,
                                        int ignore_index, cuk_errrec *err) {
    if (logits.rows <= 0) return cudaSuccess;
    if (logits.dt == dlogits.dt && xent_vec_ok(logits) && xent_vec_ok(dlogits) && ncols >= 8) {
        if (logits.dt == CUK_F32)
            return launch_fused<CUK_F32>(s, losses, lse, dlogits, logits, tgt, dloss_scale, off, ncols, ignore_index,
                                         err);
        if (logits.dt == CUK_BF16)
            return launch_fused<CUK_BF16>(s, losses, lse, dlogits, logits, tgt, dloss_scale, off, ncols, ignore_index,
                                          err);
        return launch_fused<CUK_F16>(s, losses, lse, dlogits, logits, tgt, dloss_scale, off, ncols, ignore_index, err);
    }
    /* views the fast paths do not take: the two kernels */
    cudaError_t e =
        cuk_xent_fwd(s, losses, lse, nullptr, nullptr, nullptr, logits, tgt, off, ncols, ignore_index, 1, err);
    if (e != cudaSuccess) return e;
    return cuk_xent_bwd(s, dlogits, logits, lse, tgt, nullptr, dloss_scale, off, ncols, ignore_index);
}
