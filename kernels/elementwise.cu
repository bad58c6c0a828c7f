/* Elementwise kernels, conversions, reductions, activations, RoPE and AdamW.
 * All are memory-bound: one pass over their tensors, f32 arithmetic, any
 * float storage dtype per argument (see cuda_common.cuh). Row views put
 * rows on grid.y and columns on grid.x, so strided rows cost no division. */
#include "cuda_common.cuh"

#include <initializer_list>
#include <string.h>

#define NT 256

static cudaError_t launched(void) { return cudaGetLastError(); }

/* Launch a row-view kernel over m's rows and columns (nothing for an empty view). */
#define LAUNCH_ROWS(kern, m, ...)                                               \
    do {                                                                        \
        if ((m).rows <= 0 || (m).cols <= 0) return cudaSuccess;                 \
        kern<<<cuk_rows_grid((m).rows, (m).cols, NT), NT, 0, s>>>(__VA_ARGS__); \
        return launched();                                                      \
    } while (0)

/* The elementwise ops as functors over (row, column): load() reads an
 * element's NIN inputs, store() computes and writes its outputs. k_map gives
 * every thread UNR elements per step and loads all of them before the first
 * store, so UNR independent loads are in flight (2-byte elements need that
 * to approach the memory bandwidth), and an element's own store always
 * follows its loads (in-place ops stay correct). */
#define UNR 4

template <class F> __global__ void __launch_bounds__(NT) k_map(F f, int64_t rows, int64_t cols) {
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols; c += UNR * st) {
            float v[UNR][F::NIN];
#pragma unroll
            for (int u = 0; u < UNR; u++)
                if (c + u * st < cols) f.load(r, c + u * st, v[u]);
#pragma unroll
            for (int u = 0; u < UNR; u++)
                if (c + u * st < cols) f.store(r, c + u * st, v[u]);
        }
}

/* About 2048 blocks of NT threads (several waves on any GPU); rows beyond
 * the grid are walked by the blocks. */
static dim3 map_grid(int64_t rows, int64_t cols) {
    int64_t gx = cuk_cdiv(cols, NT * UNR), gy;
    if (gx > 2048) gx = 2048;
    gy = 2048 / gx;
    if (gy < 1) gy = 1;
    if (gy > rows) gy = rows;
    if (gy > 65535) gy = 65535;
    return dim3((unsigned)gx, (unsigned)gy, 1);
}

#define LAUNCH_MAP(m, ...)                                                                  \
    do {                                                                                    \
        if ((m).rows <= 0 || (m).cols <= 0) return cudaSuccess;                             \
        k_map<<<map_grid((m).rows, (m).cols), NT, 0, s>>>(__VA_ARGS__, (m).rows, (m).cols); \
        return launched();                                                                  \
    } while (0)

#define AT(m, r, c) ((r) * (m).ld + (c))

/* ---------------------------------------------------------------- 16-byte fast path */

/* The fast path of the functor ops when every tensor has the same float
 * dtype and every row starts 16-byte aligned (cuk_vec_ok): the dtype is a
 * template parameter and each thread moves 8-element chunks with 16-byte
 * accesses, VU chunks loaded before any is stored (the same in-place rule
 * as k_map). Inputs with ld 0 are broadcast rows (bias_add's bias). The
 * (row, chunk) pairs are flattened; a row's last chunk may be partial.
 * Rows that are all contiguous are collapsed into one long row first, so
 * any width vectorises then. Arithmetic is the same f32 expression per
 * element as the functor path, so results are bitwise equal to it. */
#define VU 2

/* Row and first column of flattened chunk i (cpr chunks a row); its element count, 0 past the end. */
CUK_INLINE int chunk_at(int64_t i, int64_t total, int64_t cpr, int64_t cols, int64_t *r, int64_t *c) {
    *r = i / cpr;
    *c = (i - *r * cpr) * 8;
    return i < total ? (int)(cols - *c < 8 ? cols - *c : 8) : 0;
}

template <int NIN, int NOUT> struct vargs {
    cuk_mat in[NIN > 0 ? NIN : 1];
    cuk_mat out[NOUT];
};

/* ONE_ROW (a single, usually collapsed, row): the chunk's column is 8 i,
 * no 64-bit division per chunk. */
template <int DT, bool ONE_ROW, int NIN, int NOUT, class Op>
__global__ void __launch_bounds__(NT) k_vec(Op op, vargs<NIN, NOUT> a, int64_t rows, int64_t cols) {
    const int64_t cpr = (cols + 7) >> 3, total = rows * cpr, st = (int64_t)gridDim.x * NT;
    for (int64_t i0 = blockIdx.x * (int64_t)NT + threadIdx.x; i0 < total; i0 += VU * st) {
        float v[VU][NIN > 0 ? NIN : 1][8];
        int64_t r[VU], c[VU];
        int n[VU];
#pragma unroll
        for (int u = 0; u < VU; u++) {
            if (ONE_ROW) {
                const int64_t i = i0 + u * st;
                r[u] = 0;
                c[u] = i * 8;
                n[u] = i < total ? (int)(cols - c[u] < 8 ? cols - c[u] : 8) : 0;
            } else {
                n[u] = chunk_at(i0 + u * st, total, cpr, cols, &r[u], &c[u]);
            }
            if (n[u] > 0)
#pragma unroll
                for (int k = 0; k < NIN; k++) cuk_ld8_tail<DT>(a.in[k].p, r[u] * a.in[k].ld + c[u], n[u], v[u][k]);
        }
#pragma unroll
        for (int u = 0; u < VU; u++) {
            if (n[u] <= 0) continue;
            float o[NOUT][8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                float in[NIN > 0 ? NIN : 1], out[NOUT];
#pragma unroll
                for (int k = 0; k < NIN; k++) in[k] = v[u][k][e];
                op(in, out);
#pragma unroll
                for (int k = 0; k < NOUT; k++) o[k][e] = out[k];
            }
#pragma unroll
            for (int k = 0; k < NOUT; k++)
                if (a.out[k].p) cuk_st8_tail<DT>(a.out[k].p, r[u] * a.out[k].ld + c[u], n[u], o[k]);
        }
    }
}

/* A few waves of resident blocks (4 per SM), fewer for small tensors. */
static unsigned vec_blocks(int64_t chunks) {
    int64_t b = cuk_cdiv(chunks, (int64_t)NT * VU), cap = 4 * (int64_t)cuk_sm_count();
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* Launch the fast path if it applies; *done says whether it did. */
template <int NIN, int NOUT, class Op>
static cudaError_t try_vec(cudaStream_t s, Op op, vargs<NIN, NOUT> a, int64_t rows, int64_t cols, bool *done) {
    *done = false;
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    const int dt = a.out[0].dt;
    if (dt != CUK_F32 && dt != CUK_BF16 && dt != CUK_F16) return cudaSuccess;
    bool contig = true;
    for (int k = 0; k < NIN; k++) {
        if (a.in[k].dt != dt || !cuk_ptr16(a.in[k].p)) return cudaSuccess;
        contig = contig && (rows == 1 || a.in[k].ld == cols);
    }
    for (int k = 0; k < NOUT; k++) {
        if (!a.out[k].p) continue;
        if (a.out[k].dt != dt || !cuk_ptr16(a.out[k].p)) return cudaSuccess;
        contig = contig && (rows == 1 || a.out[k].ld == cols);
    }
    if (contig) { /* one long row: any width vectorises */
        cols *= rows;
        rows = 1;
    } else {
        for (int k = 0; k < NIN; k++)
            if (a.in[k].ld != 0 && !cuk_vec_ok(a.in[k])) return cudaSuccess;
        for (int k = 0; k < NOUT; k++)
            if (a.out[k].p && !cuk_vec_ok(a.out[k])) return cudaSuccess;
    }
    for (int k = 0; k < NIN; k++) a.in[k].rows = rows;
    for (int k = 0; k < NOUT; k++) a.out[k].rows = rows;
    const int64_t chunks = rows * ((cols + 7) >> 3);
    const unsigned nb = vec_blocks(chunks);
    if (rows == 1) {
        if (dt == CUK_F32) k_vec<CUK_F32, true><<<nb, NT, 0, s>>>(op, a, rows, cols);
        else if (dt == CUK_BF16) k_vec<CUK_BF16, true><<<nb, NT, 0, s>>>(op, a, rows, cols);
        else k_vec<CUK_F16, true><<<nb, NT, 0, s>>>(op, a, rows, cols);
    } else {
        if (dt == CUK_F32) k_vec<CUK_F32, false><<<nb, NT, 0, s>>>(op, a, rows, cols);
        else if (dt == CUK_BF16) k_vec<CUK_BF16, false><<<nb, NT, 0, s>>>(op, a, rows, cols);
        else k_vec<CUK_F16, false><<<nb, NT, 0, s>>>(op, a, rows, cols);
    }
    *done = true;
    return launched();
}

/* Inputs/outputs of a vector op from the op's views. */
template <int NIN, int NOUT>
static vargs<NIN, NOUT> va(std::initializer_list<cuk_mat> in, std::initializer_list<cuk_mat> out) {
    vargs<NIN, NOUT> a;
    memset(&a, 0, sizeof a);
    int k = 0;
    for (const cuk_mat &m : in) a.in[k++] = m;
    k = 0;
    for (const cuk_mat &m : out) a.out[k++] = m;
    return a;
}

#define TRY_VEC(op_, args_, m_)                                                \
    do {                                                                       \
        bool done_;                                                            \
        cudaError_t e_ = try_vec(s, op_, args_, (m_).rows, (m_).cols, &done_); \
        if (done_ || e_ != cudaSuccess) return e_;                             \
    } while (0)

/* ---------------------------------------------------------------- fill, copy */

struct fill_f {
    cuk_mat x;
    float v;
    static constexpr int NIN = 1;
    __device__ void load(int64_t, int64_t, float *) const {}
    __device__ void store(int64_t r, int64_t c, const float *) const {
        if (x.dt == CUK_I32) ((int32_t *)x.p)[AT(x, r, c)] = (int32_t)v;
        else stf(x.p, x.dt, AT(x, r, c), v);
    }
};

struct vfill_op {
    float v;
    __device__ void operator()(const float *, float *o) const { o[0] = v; }
};

extern "C" cudaError_t cuk_fill(cudaStream_t s, cuk_mat x, float value) {
    TRY_VEC(vfill_op{value}, (va<0, 1>({}, {x})), x);
    LAUNCH_MAP(x, fill_f{x, value});
}

/* The general conversion (misaligned rows): one element per thread, a
 * kernel of its own because it is faster than the same conversion through
 * k_map (bench/HISTORY.md, "CUDA kernels"). */
__global__ void k_copy_rows(cuk_mat d, cuk_mat s) {
    CUK_FOR_RC(d.rows, d.cols) stf(d.p, d.dt, r * d.ld + c, ldf(s.p, s.dt, r * s.ld + c));
}

/* The fast path of conversions between 16-byte aligned rows: both dtypes
 * are template parameters, 8-element chunks, VU chunks in flight per thread;
 * the same scalar conversions (same bits). */
template <int SDT, int DDT>
__global__ void __launch_bounds__(NT) k_copy_vec(cuk_mat d, cuk_mat sm, int64_t rows, int64_t cols) {
    const int64_t cpr = (cols + 7) >> 3, total = rows * cpr, st = (int64_t)gridDim.x * NT;
    for (int64_t i0 = blockIdx.x * (int64_t)NT + threadIdx.x; i0 < total; i0 += VU * st) {
        float v[VU][8];
        int64_t r[VU], c[VU];
        int n[VU];
#pragma unroll
        for (int u = 0; u < VU; u++) {
            n[u] = chunk_at(i0 + u * st, total, cpr, cols, &r[u], &c[u]);
            if (n[u] > 0) cuk_ld8_tail<SDT>(sm.p, r[u] * sm.ld + c[u], n[u], v[u]);
        }
#pragma unroll
        for (int u = 0; u < VU; u++)
            if (n[u] > 0) cuk_st8_tail<DDT>(d.p, r[u] * d.ld + c[u], n[u], v[u]);
    }
}

template <int SDT>
static void launch_copy_vec(cudaStream_t s, unsigned nb, cuk_mat d, cuk_mat sm, int64_t rows, int64_t cols) {
    if (d.dt == CUK_F32) k_copy_vec<SDT, CUK_F32><<<nb, NT, 0, s>>>(d, sm, rows, cols);
    else if (d.dt == CUK_BF16) k_copy_vec<SDT, CUK_BF16><<<nb, NT, 0, s>>>(d, sm, rows, cols);
    else k_copy_vec<SDT, CUK_F16><<<nb, NT, 0, s>>>(d, sm, rows, cols);
}

static bool float_dt(int dt) { return dt == CUK_F32 || dt == CUK_BF16 || dt == CUK_F16; }

extern "C" cudaError_t cuk_copy_rows(cudaStream_t s, cuk_mat dst, cuk_mat src) {
    if (dst.rows <= 0 || dst.cols <= 0) return cudaSuccess;
    if (float_dt(dst.dt) && float_dt(src.dt) && cuk_ptr16(dst.p) && cuk_ptr16(src.p)) {
        int64_t rows = dst.rows, cols = dst.cols;
        bool ok = true;
        if (rows == 1 || (dst.ld == cols && src.ld == cols)) { /* contiguous: one long row */
            cols *= rows;
            rows = 1;
        } else {
            ok = cuk_vec_ok(dst) && cuk_vec_ok(src);
        }
        if (ok) {
            const unsigned nb = vec_blocks(rows * ((cols + 7) >> 3));
            if (src.dt == CUK_F32) launch_copy_vec<CUK_F32>(s, nb, dst, src, rows, cols);
            else if (src.dt == CUK_BF16) launch_copy_vec<CUK_BF16>(s, nb, dst, src, rows, cols);
            else launch_copy_vec<CUK_F16>(s, nb, dst, src, rows, cols);
            return launched();
        }
    }
    LAUNCH_ROWS(k_copy_rows, dst, dst, src);
}

/* Element offsets of row-major index i in both tensors. */
__device__ __forceinline__ void strided_offsets(const cuk_strided &g, int64_t i, int64_t *od, int64_t *os) {
    int64_t d = 0, s = 0;
    for (int k = g.ndim - 1; k >= 0; k--) {
        int64_t idx = i % g.shape[k];
        i /= g.shape[k];
        d += idx * g.dstride[k];
        s += idx * g.sstride[k];
    }
    *od = d;
    *os = s;
}

__global__ void k_copy_strided(void *dst, int ddt, const void *src, int sdt, cuk_strided g, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t od, os;
        strided_offsets(g, i, &od, &os);
        stf(dst, ddt, od, ldf(src, sdt, os));
    }
}

static unsigned flat_blocks(int64_t n) {
    int64_t b = cuk_cdiv(n, NT);
    if (b > 65536) b = 65536;
    return (unsigned)(b < 1 ? 1 : b);
}

extern "C" cudaError_t cuk_copy_strided(cudaStream_t s, void *dst, int ddt, const void *src, int sdt, cuk_strided g,
                                        int64_t n) {
    if (n <= 0) return cudaSuccess;
    k_copy_strided<<<flat_blocks(n), NT, 0, s>>>(dst, ddt, src, sdt, g, n);
    return launched();
}

CUK_INLINE void store_sr(void *p, int dt, int64_t i, float v, uint32_t rnd) {
    if (dt == CUK_F32) ((float *)p)[i] = v;
    else if (dt == CUK_BF16) ((uint16_t *)p)[i] = cuk_f32_to_bf16_sr(v, rnd);
    else ((uint16_t *)p)[i] = cuk_f32_to_f16_mode(v, 1, rnd);
}

__global__ void k_copy_sr_rows(cuk_mat d, cuk_mat s, uint64_t seed, uint64_t stream, uint64_t off) {
    CUK_FOR_RC(d.rows, d.cols) {
        float v = ((const float *)s.p)[r * s.ld + c];
        uint32_t rnd = d.dt == CUK_F32 ? 0u : cuk_sr_bits(seed, stream, off + (uint64_t)(r * d.cols + c));
        store_sr(d.p, d.dt, r * d.ld + c, v, rnd);
    }
}

extern "C" cudaError_t cuk_copy_sr_rows(cudaStream_t s, cuk_mat dst, cuk_mat src, uint64_t seed, uint64_t stream,
                                        uint64_t index_offset) {
    LAUNCH_ROWS(k_copy_sr_rows, dst, dst, src, seed, stream, index_offset);
}

__global__ void k_copy_sr_strided(void *dst, int ddt, const float *src, cuk_strided g, int64_t n, uint64_t seed,
                                  uint64_t stream, uint64_t off) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t od, os;
        strided_offsets(g, i, &od, &os);
        uint32_t rnd = ddt == CUK_F32 ? 0u : cuk_sr_bits(seed, stream, off + (uint64_t)i);
        store_sr(dst, ddt, od, src[os], rnd);
    }
}

extern "C" cudaError_t cuk_copy_sr_strided(cudaStream_t s, void *dst, int ddt, const float *src, cuk_strided g,
                                           int64_t n, uint64_t seed, uint64_t stream, uint64_t index_offset) {
    if (n <= 0) return cudaSuccess;
    k_copy_sr_strided<<<flat_blocks(n), NT, 0, s>>>(dst, ddt, src, g, n, seed, stream, index_offset);
    return launched();
}

/* ---------------------------------------------------------------- BLAS-1 style */

struct scale_f {
    cuk_mat x;
    float a;
    static constexpr int NIN = 1;
    __device__ void load(int64_t r, int64_t c, float *v) const { v[0] = ldf(x.p, x.dt, AT(x, r, c)); }
    __device__ void store(int64_t r, int64_t c, const float *v) const { stf(x.p, x.dt, AT(x, r, c), v[0] * a); }
};

struct vscale_op {
    float a;
    __device__ void operator()(const float *i, float *o) const { o[0] = i[0] * a; }
};

extern "C" cudaError_t cuk_scale(cudaStream_t s, cuk_mat x, float alpha) {
    TRY_VEC(vscale_op{alpha}, (va<1, 1>({x}, {x})), x);
    LAUNCH_MAP(x, scale_f{x, alpha});
}

struct axpy_f {
    cuk_mat y, x;
    float a;
    static constexpr int NIN = 2;
    __device__ void load(int64_t r, int64_t c, float *v) const {
        v[0] = ldf(y.p, y.dt, AT(y, r, c));
        v[1] = ldf(x.p, x.dt, AT(x, r, c));
    }
    __device__ void store(int64_t r, int64_t c, const float *v) const { stf(y.p, y.dt, AT(y, r, c), v[0] + a * v[1]); }
};

struct vaxpy_op {
    float a;
    __device__ void operator()(const float *i, float *o) const { o[0] = i[0] + a * i[1]; }
};

extern "C" cudaError_t cuk_axpy(cudaStream_t s, cuk_mat y, float alpha, cuk_mat x) {
    TRY_VEC(vaxpy_op{alpha}, (va<2, 1>({y, x}, {y})), y);
    LAUNCH_MAP(y, axpy_f{y, x, alpha});
}

struct add_f {
    cuk_mat o, a, b;
    static constexpr int NIN = 2;
    __device__ void load(int64_t r, int64_t c, float *v) const {
        v[0] = ldf(a.p, a.dt, AT(a, r, c));
        v[1] = ldf(b.p, b.dt, AT(b, r, c));
    }
    __device__ void store(int64_t r, int64_t c, const float *v) const { stf(o.p, o.dt, AT(o, r, c), v[0] + v[1]); }
};

/* also bias_add's, with the bias a broadcast row (ld 0) */
struct vadd_op {
    __device__ void operator()(const float *i, float *o) const { o[0] = i[0] + i[1]; }
};

extern "C" cudaError_t cuk_add(cudaStream_t s, cuk_mat out, cuk_mat a, cuk_mat b) {
    TRY_VEC(vadd_op{}, (va<2, 1>({a, b}, {out})), out);
    LAUNCH_MAP(out, add_f{out, a, b});
}

struct bias_add_f {
    cuk_mat x;
    const void *b;
    int bdt;
    static constexpr int NIN = 2;
    __device__ void load(int64_t r, int64_t c, float *v) const {
        v[0] = ldf(x.p, x.dt, AT(x, r, c));
        v[1] = ldf(b, bdt, c);
    }
    __device__ void store(int64_t r, int64_t c, const float *v) const { stf(x.p, x.dt, AT(x, r, c), v[0] + v[1]); }
};

extern "C" cudaError_t cuk_bias_add(cudaStream_t s, cuk_mat x, const void *bias, int bias_dt) {
    const cuk_mat b = {(void *)bias, x.rows, x.cols, 0, bias_dt};
    TRY_VEC(vadd_op{}, (va<2, 1>({x, b}, {x})), x);
    LAUNCH_MAP(x, bias_add_f{x, bias, bias_dt});
}

/* ---------------------------------------------------------------- sum / sumsq */

/* Each block accumulates a fixed subset (decided by the grid size, which
 * depends only on the shape) in double; one block then adds the partials in
 * block order. */
__global__ void k_reduce_partial(cuk_mat x, int sq, double *partials) {
    __shared__ double sh[32];
    double acc = 0.0;
    if (x.rows == 1 || x.ld == x.cols) {
        int64_t n = x.rows * x.cols;
#pragma unroll 4
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
            double v = ldf(x.p, x.dt, i);
            acc += sq ? v * v : v;
        }
    } else {
        for (int64_t r = blockIdx.x; r < x.rows; r += gridDim.x)
#pragma unroll 4
            for (int64_t c = threadIdx.x; c < x.cols; c += blockDim.x) {
                double v = ldf(x.p, x.dt, r * x.ld + c);
                acc += sq ? v * v : v;
            }
    }
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void k_reduce_final(const double *partials, int n, void *out, int out_dt) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) {
        if (out_dt == CUK_F64) *(double *)out += acc;
        else *(float *)out = (float)((double)*(float *)out + acc);
    }
}

extern "C" cudaError_t cuk_reduce(cudaStream_t s, cuk_mat x, int squares, void *out, int out_dt, double *partials) {
    int64_t n = x.rows * x.cols;
    if (n <= 0) return cudaSuccess;
    int64_t nb = (x.rows == 1 || x.ld == x.cols) ? cuk_cdiv(n, 4 * NT) : x.rows;
    if (nb > CUK_REDUCE_MAX_BLOCKS) nb = CUK_REDUCE_MAX_BLOCKS;
    k_reduce_partial<<<(unsigned)nb, NT, 0, s>>>(x, squares, partials);
    k_reduce_final<<<1, NT, 0, s>>>(partials, (int)nb, out, out_dt);
    return launched();
}

/* ---------------------------------------------------------------- column sums */

#define CS_COLS 32
#define CS_LANES 8

__global__ void k_colsum_partial(cuk_mat dy, cuk_mat x, const float *mean, const float *rstd, int64_t rpc, float *pw,
                                 float *pb) {
    __shared__ float sw[CS_LANES][CS_COLS + 1], sb[CS_LANES][CS_COLS + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t c = blockIdx.x * (int64_t)CS_COLS + tx, chunk = blockIdx.y;
    int64_t r0 = chunk * rpc, r1 = r0 + rpc < dy.rows ? r0 + rpc : dy.rows;
    float aw = 0.0f, ab = 0.0f;
    if (c < dy.cols) {
#pragma unroll 4
        for (int64_t r = r0 + ty; r < r1; r += CS_LANES) {
            float d = ldf(dy.p, dy.dt, r * dy.ld + c);
            ab += d;
            if (pw) {
                float xv = ldf(x.p, x.dt, r * x.ld + c);
                aw += d * ((xv - (mean ? mean[r] : 0.0f)) * rstd[r]);
            }
        }
    }
    sw[ty][tx] = aw;
    sb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && c < dy.cols) {
        float w = 0.0f, b = 0.0f;
        for (int k = 0; k < CS_LANES; k++) {
            w += sw[k][tx];
            b += sb[k][tx];
        }
        if (pw) pw[chunk * dy.cols + c] = w;
        if (pb) pb[chunk * dy.cols + c] = b;
    }
}

/* Chunk partials in order, in double. Column c's chunks are split among
 * the FIN_Y threads of a block column by a fixed stride (thread ty takes
 * chunks ty, ty + FIN_Y, ...), then thread 0 adds the FIN_Y sums in ty order:
 * a fixed order for a given nchunk, and FIN_Y loads in flight per column
 * instead of one long dependent walk. */
#define FIN_X 32
#define FIN_Y 16

__global__ void __launch_bounds__(FIN_X *FIN_Y)
    k_colsum_final(const float *pw, const float *pb, int64_t nchunk, int64_t cols, float *dw, float *db) {
    __shared__ double sw[FIN_Y][FIN_X + 1], sb[FIN_Y][FIN_X + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c = blockIdx.x * (int64_t)FIN_X + tx;
    double w = 0.0, b = 0.0;
    if (c < cols)
#pragma unroll 4
        for (int64_t k = ty; k < nchunk; k += FIN_Y) {
            if (pw) w += pw[k * cols + c];
            if (pb) b += pb[k * cols + c];
        }
    sw[ty][tx] = w;
    sb[ty][tx] = b;
    __syncthreads();
    if (ty != 0 || c >= cols) return;
    w = 0.0;
    b = 0.0;
    for (int k = 0; k < FIN_Y; k++) {
        w += sw[k][tx];
        b += sb[k][tx];
    }
    if (dw) dw[c] = (float)((double)dw[c] + w);
    if (db) db[c] = (float)((double)db[c] + b);
}

extern "C" cudaError_t cuk_colsum_final(cudaStream_t s, const float *pw, const float *pb, int64_t nchunk, int64_t cols,
                                        float *dw, float *db) {
    if (cols <= 0 || nchunk <= 0 || (!dw && !db)) return cudaSuccess;
    k_colsum_final<<<(unsigned)cuk_cdiv(cols, FIN_X), dim3(FIN_X, FIN_Y), 0, s>>>(dw ? pw : NULL, db ? pb : NULL,
                                                                                  nchunk, cols, dw, db);
    return launched();
}

/* The 16-byte path of the column sums: a thread owns 8 adjacent columns
 * (one vector load per row), a warp 256 columns of one row, so each row's
 * slice is one 512-byte contiguous read (the scalar kernel above reads 64
 * bytes per warp per row, a small fraction of the memory bandwidth). The
 * CSV_LANES warps of a block take rows
 * lane, lane + CSV_LANES, ... of the block's chunk of CSV_ROWS rows and meet
 * in shared memory in lane order; chunk partials go to cuk_colsum_final.
 * The chunk size is fixed (not derived from the GPU) so the sums are
 * bitwise the same on any device for a given shape. */
#define CSV_LANES 8
#define CSV_ROWS 128

template <int DT, bool W>
__global__ void __launch_bounds__(32 * CSV_LANES)
    k_colsum_vec(cuk_mat dy, cuk_mat x, const float *mean, const float *rstd, int64_t rpc, float *pw, float *pb) {
    __shared__ float sb[CSV_LANES][32 * 8 + 1], sw[W ? CSV_LANES : 1][32 * 8 + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = (blockIdx.x * 32 + tx) * (int64_t)8, chunk = blockIdx.y;
    const int64_t r0 = chunk * rpc, r1 = r0 + rpc < dy.rows ? r0 + rpc : dy.rows;
    float ab[8] = {0, 0, 0, 0, 0, 0, 0, 0}, aw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c0 < dy.cols) {
#pragma unroll 4
        for (int64_t r = r0 + ty; r < r1; r += CSV_LANES) {
            float d[8];
            cuk_ld8<DT>(dy.p, r * dy.ld + c0, d);
#pragma unroll
            for (int e = 0; e < 8; e++) ab[e] += d[e];
            if (W) {
                float xv[8];
                cuk_ld8<DT>(x.p, r * x.ld + c0, xv);
                const float mu = mean ? mean[r] : 0.0f, rs = rstd[r];
#pragma unroll
                for (int e = 0; e < 8; e++) aw[e] += d[e] * ((xv[e] - mu) * rs);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 8; e++) {
        sb[ty][tx * 8 + e] = ab[e];
        if (W) sw[ty][tx * 8 + e] = aw[e];
    }
    __syncthreads();
    /* thread t of the block sums column t of the block's 256 over the lanes, in lane order */
    const int t = ty * 32 + tx;
    const int64_t c = blockIdx.x * (int64_t)256 + t;
    if (c >= dy.cols) return;
    float b = 0.0f, w = 0.0f;
#pragma unroll
    for (int k = 0; k < CSV_LANES; k++) {
        b += sb[k][t];
        if (W) w += sw[k][t];
    }
    if (pb) pb[chunk * dy.cols + c] = b;
    if (W) pw[chunk * dy.cols + c] = w;
}

template <int DT>
static void colsum_vec_launch(cudaStream_t s, dim3 grid, cuk_mat dy, cuk_mat x, const float *mean, const float *rstd,
                              int64_t rpc, float *pw, float *pb) {
    const dim3 block(32, CSV_LANES);
    if (pw) k_colsum_vec<DT, true><<<grid, block, 0, s>>>(dy, x, mean, rstd, rpc, pw, pb);
    else k_colsum_vec<DT, false><<<grid, block, 0, s>>>(dy, x, mean, rstd, rpc, pw, pb);
}

/* The vector path applies: 16-bit or f32 rows whose 8-column chunks are
 * 16-byte aligned, x (when used) the same dtype and alignment. */
static bool colsum_vec_ok(const cuk_mat &dy, const cuk_mat &x, bool with_w) {
    if (dy.dt != CUK_F32 && dy.dt != CUK_BF16 && dy.dt != CUK_F16) return false;
    if (dy.cols % 8 != 0 || !cuk_vec_ok(dy)) return false;
    return !with_w || (x.dt == dy.dt && cuk_vec_ok(x));
}

extern "C" cudaError_t cuk_colsums(cudaStream_t s, float *dw, float *db, cuk_mat dy, cuk_mat x, const float *mean,
                                   const float *rstd, float *scratch, size_t scratch_floats) {
    if (dy.cols <= 0 || (!dw && !db)) return cudaSuccess;
    if (dy.rows <= 0) return cudaSuccess;
    if (colsum_vec_ok(dy, x, dw != NULL)) {
        int64_t per = (dw ? 1 : 0) + (db ? 1 : 0), rpc = CSV_ROWS, nchunk = cuk_cdiv(dy.rows, rpc);
        int64_t maxchunk = (int64_t)(scratch_floats / (size_t)(per * dy.cols));
        if (maxchunk > 65535) maxchunk = 65535;
        if (maxchunk < 1) return cudaErrorMemoryAllocation;
        if (nchunk > maxchunk) {
            rpc = cuk_cdiv(cuk_cdiv(dy.rows, maxchunk), CSV_LANES) * CSV_LANES;
            nchunk = cuk_cdiv(dy.rows, rpc);
        }
        float *pw = dw ? scratch : NULL, *pb = db ? scratch + (dw ? nchunk * dy.cols : 0) : NULL;
        const dim3 grid((unsigned)cuk_cdiv(dy.cols, 256), (unsigned)nchunk);
        if (dy.dt == CUK_F32) colsum_vec_launch<CUK_F32>(s, grid, dy, x, mean, rstd, rpc, pw, pb);
        else if (dy.dt == CUK_BF16) colsum_vec_launch<CUK_BF16>(s, grid, dy, x, mean, rstd, rpc, pw, pb);
        else colsum_vec_launch<CUK_F16>(s, grid, dy, x, mean, rstd, rpc, pw, pb);
        cudaError_t e = launched();
        if (e != cudaSuccess) return e;
        return cuk_colsum_final(s, pw, pb, nchunk, dy.cols, dw, db);
    }
    /* Chunks of 64 rows, fewer (longer) when the partials would not fit the scratch. */
    int64_t per = (dw ? 1 : 0) + (db ? 1 : 0);
    int64_t maxchunk = (int64_t)(scratch_floats / (size_t)(per * dy.cols));
    if (maxchunk > 65535) maxchunk = 65535;
    if (maxchunk < 1) return cudaErrorMemoryAllocation; /* caller checks sizes first */
    int64_t rpc = 64, nchunk = cuk_cdiv(dy.rows, rpc);
    if (nchunk > maxchunk) {
        rpc = cuk_cdiv(dy.rows, maxchunk);
        nchunk = cuk_cdiv(dy.rows, rpc);
    }
    float *pw = dw ? scratch : NULL, *pb = db ? scratch + (dw ? nchunk * dy.cols : 0) : NULL;
    dim3 grid((unsigned)cuk_cdiv(dy.cols, CS_COLS), (unsigned)nchunk);
    k_colsum_partial<<<grid, dim3(CS_COLS, CS_LANES), 0, s>>>(dy, x, mean, rstd, rpc, pw, pb);
    cudaError_t e = launched();
    if (e != cudaSuccess) return e;
    return cuk_colsum_final(s, pw, pb, nchunk, dy.cols, dw, db);
}

/* ---------------------------------------------------------------- activations */

#define GELU_K 0.7978845608028654f
#define GELU_C 0.044715f

struct gelu_f {
    cuk_mat y, x;
    static constexpr int NIN = 1;
    __device__ void load(int64_t r, int64_t c, float *v) const { v[0] = ldf(x.p, x.dt, AT(x, r, c)); }
    __device__ void store(int64_t r, int64_t c, const float *v) const {
        float u = v[0];
        stf(y.p, y.dt, AT(y, r, c), 0.5f * u * (1.0f + tanhf(GELU_K * (u + GELU_C * u * u * u))));
    }
};

struct vgelu_op {
    __device__ void operator()(const float *i, float *o) const {
        float u = i[0];
        o[0] = 0.5f * u * (1.0f + tanhf(GELU_K * (u + GELU_C * u * u * u)));
    }
};

extern "C" cudaError_t cuk_gelu_fwd(cudaStream_t s, cuk_mat y, cuk_mat x) {
    TRY_VEC(vgelu_op{}, (va<1, 1>({x}, {y})), y);
    LAUNCH_MAP(y, gelu_f{y, x});
}

struct gelu_bwd_f {
    cuk_mat dx, x, dy;
    static constexpr int NIN = 2;
    __device__ void load(int64_t r, int64_t c, float *v) const {
        v[0] = ldf(x.p, x.dt, AT(x, r, c));
        v[1] = ldf(dy.p, dy.dt, AT(dy, r, c));
    }
    __device__ void store(int64_t r, int64_t c, const float *v) const {
        float u = v[0], t = tanhf(GELU_K * (u + GELU_C * u * u * u));
        float grad = 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * u * u);
        stf(dx.p, dx.dt, AT(dx, r, c), grad * v[1]);
    }
};

struct vgelu_bwd_op {
    __device__ void operator()(const float *i, float *o) const {
        float u = i[0], t = tanhf(GELU_K * (u + GELU_C * u * u * u));
        float grad = 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * u * u);
        o[0] = grad * i[1];
    }
};

extern "C" cudaError_t cuk_gelu_bwd(cudaStream_t s, cuk_mat dx, cuk_mat x, cuk_mat dy) {
    TRY_VEC(vgelu_bwd_op{}, (va<2, 1>({x, dy}, {dx})), dx);
    LAUNCH_MAP(dx, gelu_bwd_f{dx, x, dy});
}

struct swiglu_f {
    cuk_mat y, g, u;
    static constexpr int NIN = 2;
    __device__ void load(int64_t r, int64_t c, float *v) const {
        v[0] = ldf(g.p, g.dt, AT(g, r, c));
        v[1] = ldf(u.p, u.dt, AT(u, r, c));
    }
    __device__ void store(int64_t r, int64_t c, const float *v) const {
        stf(y.p, y.dt, AT(y, r, c), v[0] / (1.0f + expf(-v[0])) * v[1]);
    }
};

struct vswiglu_op {
    __device__ void operator()(const float *i, float *o) const { o[0] = i[0] / (1.0f + expf(-i[0])) * i[1]; }
};

extern "C" cudaError_t cuk_swiglu_fwd(cudaStream_t s, cuk_mat y, cuk_mat g, cuk_mat u) {
    TRY_VEC(vswiglu_op{}, (va<2, 1>({g, u}, {y})), y);
    LAUNCH_MAP(y, swiglu_f{y, g, u});
}

/* everything is loaded before anything is stored: dgate/dup may overwrite gate/up */
struct swiglu_bwd_f {
    cuk_mat dg, du, dy, g, u;
    static constexpr int NIN = 3;
    __device__ void load(int64_t r, int64_t c, float *v) const {
        v[0] = ldf(g.p, g.dt, AT(g, r, c));
        v[1] = ldf(u.p, u.dt, AT(u, r, c));
        v[2] = ldf(dy.p, dy.dt, AT(dy, r, c));
    }
    __device__ void store(int64_t r, int64_t c, const float *v) const {
        float sig = 1.0f / (1.0f + expf(-v[0]));
        if (dg.p) stf(dg.p, dg.dt, AT(dg, r, c), v[2] * v[1] * sig * (1.0f + v[0] * (1.0f - sig)));
        if (du.p) stf(du.p, du.dt, AT(du, r, c), v[2] * v[0] * sig);
    }
};

struct vswiglu_bwd_op {
    __device__ void operator()(const float *i, float *o) const {
        float sig = 1.0f / (1.0f + expf(-i[0]));
        o[0] = i[2] * i[1] * sig * (1.0f + i[0] * (1.0f - sig));
        o[1] = i[2] * i[0] * sig;
    }
};

extern "C" cudaError_t cuk_swiglu_bwd(cudaStream_t s, cuk_mat dg, cuk_mat du, cuk_mat dy, cuk_mat g, cuk_mat u) {
    if (dg.p || du.p) {
        /* the first output sets the dtype try_vec checks: a NULL one takes the other's */
        vargs<3, 2> a = va<3, 2>({g, u, dy}, {dg.p ? dg : du, du});
        a.out[1] = du;
        if (!dg.p) {
            a.out[0].p = NULL;
            a.out[0].dt = du.dt;
        } else {
            a.out[0] = dg;
        }
        TRY_VEC(vswiglu_bwd_op{}, a, g);
    }
    LAUNCH_MAP(g, swiglu_bwd_f{dg, du, dy, g, u});
}

/* ---------------------------------------------------------------- RoPE */

__global__ void k_rope_tables(cuk_mat cs, cuk_mat sn, double theta) {
    const int64_t half = cs.cols, R = 2 * half;
    CUK_FOR_RC(cs.rows, cs.cols) {
        double ang = (double)r * pow(theta, -(double)(2 * c) / (double)R);
        ((float *)cs.p)[r * cs.ld + c] = (float)cos(ang);
        ((float *)sn.p)[r * sn.ld + c] = (float)sin(ang);
    }
}

extern "C" cudaError_t cuk_rope_tables(cudaStream_t s, cuk_mat cos, cuk_mat sin, double theta) {
    LAUNCH_ROWS(k_rope_tables, cos, cos, sin, theta);
}

/* grid.y walks the B*T tokens; grid.x the (head, pair) and pass-through work of a token. */
__global__ void k_rope(cuk_bthd y, cuk_bthd x, cuk_mat cs, cuk_mat sn, const int32_t *pos, int per_batch,
                       int64_t pos_offset, float sign, cuk_errrec *err) {
    const int64_t half = cs.cols, H = x.H, D = x.D, rest = D - 2 * half;
    const int64_t npair = H * half, work = npair + (y.p != x.p ? H * rest : 0);
    for (int64_t bt = blockIdx.y; bt < x.B * x.T; bt += gridDim.y) {
        int64_t b = bt / x.T, t = bt % x.T;
        int64_t p = pos ? (int64_t)pos[per_batch ? bt : t] : pos_offset + t;
        int bad = p < 0 || p >= cs.rows;
        if (bad && blockIdx.x == 0 && threadIdx.x == 0) cuk_report(err, CUK_ERR_POSITION, bt, p, cs.rows, 0);
        for (int64_t w = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; w < work;
             w += (int64_t)gridDim.x * blockDim.x) {
            int64_t h, i;
            if (w < npair) {
                h = w / half;
                i = w % half;
            } else {
                h = (w - npair) / rest;
                i = 2 * half + (w - npair) % rest;
            }
            int64_t xo = b * x.sb + t * x.st + h * x.sh, yo = b * y.sb + t * y.st + h * y.sh;
            if (w >= npair) {
                stf(y.p, y.dt, yo + i, bad ? 0.0f : ldf(x.p, x.dt, xo + i));
                continue;
            }
            float x1 = ldf(x.p, x.dt, xo + i), x2 = ldf(x.p, x.dt, xo + i + half);
            float y1 = 0.0f, y2 = 0.0f;
            if (!bad) {
                float c = ((const float *)cs.p)[p * cs.ld + i], s = sign * ((const float *)sn.p)[p * sn.ld + i];
                y1 = x1 * c - x2 * s;
                y2 = x2 * c + x1 * s;
            }
            stf(y.p, y.dt, yo + i, y1);
            stf(y.p, y.dt, yo + i + half, y2);
        }
    }
}

CUK_EMU_BEGIN(rope_fast);
/* Pairs (j, j + half) for j = i .. i + 7 of the head row at xo, rotated by
 * position p's angles (zeros where bad) into the row at yo (may be xo). */
template <int DT>
CUK_INLINE void cuk_rope8(const void *x, int64_t xo, void *y, int64_t yo, int64_t half, const cuk_mat &cs,
                          const cuk_mat &sn, int64_t p, int bad, float sign, int64_t i) {
    float x1[8], x2[8], y1[8], y2[8];
    cuk_ld8<DT>(x, xo, x1);
    cuk_ld8<DT>(x, xo + half, x2);
    if (bad) {
#pragma unroll
        for (int e = 0; e < 8; e++) y1[e] = y2[e] = 0.0f;
    } else {
        float cv[8], sv[8];
        cuk_ld8<CUK_F32>(cs.p, p * cs.ld + i, cv);
        cuk_ld8<CUK_F32>(sn.p, p * sn.ld + i, sv);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float s = sign * sv[e];
            y1[e] = x1[e] * cv[e] - x2[e] * s;
            y2[e] = x2[e] * cv[e] + x1[e] * s;
        }
    }
    cuk_st8<DT>(y, yo, y1);
    cuk_st8<DT>(y, yo + half, y2);
}

/* ---- rope fast path: 16-bit views rotated over the whole head (D = 2 half,
 * half a multiple of 8) with 16-byte aligned rows and tables. A thread takes
 * 8 pairs of one head of one token, x[i..i+7] with x[i+half..i+half+7], and
 * their angles (two 32-byte table loads): 16-byte accesses only (k_rope
 * moves 2 bytes at a time), and the work index splits with 32-bit
 * divisions (k_rope divides in 64 bits per element). The arithmetic is
 * k_rope's. */
template <int DT>
__global__ void k_rope_vec(cuk_bthd y, cuk_bthd x, cuk_mat cs, cuk_mat sn, const int32_t *pos, int per_batch,
                           int64_t pos_offset, float sign, cuk_errrec *err) {
    const uint32_t nc = (uint32_t)(cs.cols >> 3), per_tok = (uint32_t)x.H * nc, T = (uint32_t)x.T;
    const uint32_t total = (uint32_t)(x.B * x.T) * per_tok;
    const int64_t half = cs.cols;
    for (uint32_t w = blockIdx.x * blockDim.x + threadIdx.x; w < total; w += gridDim.x * blockDim.x) {
        const uint32_t bt = w / per_tok, r = w - bt * per_tok, h = r / nc, c = r - h * nc;
        const uint32_t b = bt / T, t = bt - b * T;
        const int64_t p = pos ? (int64_t)pos[per_batch ? bt : t] : pos_offset + t;
        const int bad = p < 0 || p >= cs.rows;
        if (bad && r == 0) cuk_report(err, CUK_ERR_POSITION, bt, p, cs.rows, 0);
        const int64_t i = 8 * (int64_t)c;
        const int64_t xo = b * x.sb + t * x.st + h * x.sh + i, yo = b * y.sb + t * y.st + h * y.sh + i;
        cuk_rope8<DT>(x.p, xo, y.p, yo, half, cs, sn, p, bad, sign, i);
    }
}

CUK_EMU_END(rope_fast);

static bool rope_view_ok(const cuk_bthd &v) {
    return (v.dt == CUK_BF16 || v.dt == CUK_F16) && ((uintptr_t)v.p & 15) == 0 && v.sb % 8 == 0 && v.st % 8 == 0 &&
           v.sh % 8 == 0;
}

static bool rope_table_ok(const cuk_mat &m) { return m.dt == CUK_F32 && ((uintptr_t)m.p & 15) == 0 && m.ld % 4 == 0; }

extern "C" cudaError_t cuk_rope(cudaStream_t s, cuk_bthd y, cuk_bthd x, cuk_mat cos, cuk_mat sin, const int32_t *pos,
                                int pos_per_batch, int64_t pos_offset, float sign, cuk_errrec *err) {
    int64_t half = cos.cols, work = x.H * half + (y.p != x.p ? x.H * (x.D - 2 * half) : 0);
    if (x.B * x.T <= 0 || work <= 0) return cudaSuccess;
    const int64_t chunks = x.B * x.T * x.H * (half / 8);
    if (x.D == 2 * half && half % 8 == 0 && y.dt == x.dt && rope_view_ok(x) && rope_view_ok(y) && rope_table_ok(cos) &&
        rope_table_ok(sin) && chunks < ((int64_t)1 << 31)) {
        const unsigned grid = (unsigned)((chunks + 255) / 256 < 65536 * 8 ? (chunks + 255) / 256 : 65536 * 8);
        if (x.dt == CUK_BF16)
            k_rope_vec<CUK_BF16><<<grid, 256, 0, s>>>(y, x, cos, sin, pos, pos_per_batch, pos_offset, sign, err);
        else k_rope_vec<CUK_F16><<<grid, 256, 0, s>>>(y, x, cos, sin, pos, pos_per_batch, pos_offset, sign, err);
        return launched();
    }
    k_rope<<<cuk_rows_grid(x.B * x.T, work, 128), 128, 0, s>>>(y, x, cos, sin, pos, pos_per_batch, pos_offset, sign,
                                                               err);
    return launched();
}

/* ---------------------------------------------------------------- rotation and cache write */

/* A decode step's RoPE and cache write in one launch: a thread rotates 8
 * pairs of one head of one token (k_rope_vec's arithmetic), and where the
 * head is a key, copies the rotated values as stored (read back, so the
 * cache holds what kv_cache_write would read) into the token's slot; the
 * threads past the rotations copy the values' chunks. */
template <int DT>
__global__ void k_rope_kv_write(cuk_bthd qk, cuk_bthd v, cuk_mat cs, cuk_mat sn, const int32_t *pos, float sign,
                                void *kc, void *vc, int cdt, int64_t n_slots, const int32_t *slots, cuk_errrec *err) {
    cuk_pdl_trigger(); /* a small step's paged attention starts now: block tables first, then it waits for q and the
                          caches */
    const uint32_t half = (uint32_t)cs.cols, nc = half >> 3, D = (uint32_t)qk.D, dc = D >> 3;
    const uint32_t H = (uint32_t)qk.H, Hkv = (uint32_t)v.H, Hq = H - Hkv, nrope = H * nc, per_tok = nrope + Hkv * dc;
    const uint32_t total = (uint32_t)qk.T * per_tok;
    for (uint32_t w = blockIdx.x * blockDim.x + threadIdx.x; w < total; w += gridDim.x * blockDim.x) {
        const uint32_t t = w / per_tok, r = w - t * per_tok;
        const int64_t slot = slots[t];
        if (r == 0 && slot >= n_slots) cuk_report(err, CUK_ERR_SLOT, t, slot, n_slots, 0);
        const bool write = slot >= 0 && slot < n_slots;
        if (r >= nrope) {
            if (!write) continue;
            const uint32_t q = r - nrope, h = q / dc, i = 8 * (q - h * dc);
            float x[8];
            cuk_ld8<DT>(v.p, t * v.st + h * v.sh + i, x);
            const int64_t dst = (slot * Hkv + h) * D + i;
#pragma unroll
            for (int e = 0; e < 8; e++) stf(vc, cdt, dst + e, x[e]);
            continue;
        }
        const uint32_t h = r / nc, i = 8 * (r - h * nc);
        const int64_t p = pos[t];
        const int bad = p < 0 || p >= cs.rows;
        if (bad && r == 0) cuk_report(err, CUK_ERR_POSITION, t, p, cs.rows, 0);
        const int64_t o = t * qk.st + h * qk.sh + i;
        cuk_rope8<DT>(qk.p, o, qk.p, o, half, cs, sn, p, bad, sign, i);
        if (h < Hq || !write) continue;
        float y1[8], y2[8];
        cuk_ld8<DT>(qk.p, o, y1);
        cuk_ld8<DT>(qk.p, o + half, y2);
        const int64_t dst = (slot * Hkv + (h - Hq)) * D + i;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            stf(kc, cdt, dst + e, y1[e]);
            stf(kc, cdt, dst + half + e, y2[e]);
        }
    }
}

extern "C" int cuk_rope_kv_write_fits(cuk_bthd qk, cuk_bthd v, cuk_mat cos, cuk_mat sin, int per_batch) {
    const auto a16 = [](const void *p) { return ((uintptr_t)p & 15) == 0; };
    const auto view_ok = [&](const cuk_bthd &x) {
        return (x.dt == CUK_BF16 || x.dt == CUK_F16) && a16(x.p) && x.B == 1 && x.st % 8 == 0 && x.sh % 8 == 0;
    };
    const auto table_ok = [&](const cuk_mat &m) { return m.dt == CUK_F32 && a16(m.p) && m.ld % 4 == 0; };
    return per_batch && view_ok(qk) && view_ok(v) && v.dt == qk.dt && qk.D == 2 * cos.cols && cos.cols % 8 == 0 &&
           v.D == qk.D && v.H < qk.H && v.T == qk.T && table_ok(cos) && table_ok(sin) &&
           qk.T * (qk.H * (cos.cols / 8) + v.H * (qk.D / 8)) < ((int64_t)1 << 31);
}

extern "C" cudaError_t cuk_rope_kv_write(cudaStream_t s, cuk_bthd qk, cuk_bthd v, cuk_mat cos, cuk_mat sin,
                                         const int32_t *pos, void *kc, void *vc, int cdt, int64_t n_slots,
                                         const int32_t *slots, cuk_errrec *err) {
    const int64_t work = qk.T * (qk.H * (cos.cols / 8) + v.H * (qk.D / 8));
    if (work <= 0) return cudaSuccess;
    const unsigned grid = (unsigned)((work + 127) / 128);
    if (qk.dt == CUK_BF16)
        k_rope_kv_write<CUK_BF16><<<grid, 128, 0, s>>>(qk, v, cos, sin, pos, 1.0f, kc, vc, cdt, n_slots, slots, err);
    else k_rope_kv_write<CUK_F16><<<grid, 128, 0, s>>>(qk, v, cos, sin, pos, 1.0f, kc, vc, cdt, n_slots, slots, err);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- AdamW */
CUK_EMU_BEGIN(adamw);

/* One element's update: the moments in place, the new weight returned. */
CUK_INLINE float adamw_one(float w, float g, float &m, float &v, float b1, float b2, float eps, float step_size,
                           float bc2_sqrt, float decay) {
    m = b1 * m + (1.0f - b1) * g;
    v = b2 * v + (1.0f - b2) * g * g;
    return w * decay - step_size * m / (sqrtf(v) / bc2_sqrt + eps);
}

__global__ void k_adamw(float *w, const void *g, int gdt, float *mm, float *vv, void *lowp, int ldt, int64_t n,
                        float b1, float b2, float eps, float step_size, float bc2_sqrt, float decay, float gs) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float mi = mm[i], vi = vv[i];
        const float wi = adamw_one(w[i], ldf(g, gdt, i) * gs, mi, vi, b1, b2, eps, step_size, bc2_sqrt, decay);
        mm[i] = mi;
        vv[i] = vi;
        w[i] = wi;
        if (lowp) stf(lowp, ldt, i, wi);
    }
}

/* f32 gradients, 16-bit or no rounded copy: 4 elements a thread with
 * 16-byte loads and stores of w, g, m, v (8 bytes of the copy), 32-bit
 * indices; the `head` elements before the first 16-byte boundary and the
 * tail after the last whole quad go one per thread of the first ones. */
template <int LDT>
__global__ void k_adamw_vec(float *w, const float *g, float *mm, float *vv, uint16_t *lowp, uint32_t n, uint32_t head,
                            float b1, float b2, float eps, float step_size, float bc2_sqrt, float decay, float gs) {
    const uint32_t nq = (n - head) / 4, tail0 = head + 4 * nq, stride = gridDim.x * blockDim.x;
    const uint32_t id = blockIdx.x * blockDim.x + threadIdx.x;
    if (id < head || (id >= head && id - head < n - tail0)) {
        const uint32_t i = id < head ? id : tail0 + (id - head);
        float mi = mm[i], vi = vv[i];
        const float wi = adamw_one(w[i], g[i] * gs, mi, vi, b1, b2, eps, step_size, bc2_sqrt, decay);
        mm[i] = mi;
        vv[i] = vi;
        w[i] = wi;
        if (LDT != CUK_F32) lowp[i] = LDT == CUK_BF16 ? cuk_f32_to_bf16(wi) : cuk_f32_to_f16_mode(wi, 0, 0);
    }
    for (uint32_t q = id; q < nq; q += stride) {
        const uint32_t i = head + 4 * q;
        const float4 w4 = *(const float4 *)(w + i), g4 = *(const float4 *)(g + i);
        float4 m4 = *(const float4 *)(mm + i), v4 = *(const float4 *)(vv + i), o;
        o.x = adamw_one(w4.x, g4.x * gs, m4.x, v4.x, b1, b2, eps, step_size, bc2_sqrt, decay);
        o.y = adamw_one(w4.y, g4.y * gs, m4.y, v4.y, b1, b2, eps, step_size, bc2_sqrt, decay);
        o.z = adamw_one(w4.z, g4.z * gs, m4.z, v4.z, b1, b2, eps, step_size, bc2_sqrt, decay);
        o.w = adamw_one(w4.w, g4.w * gs, m4.w, v4.w, b1, b2, eps, step_size, bc2_sqrt, decay);
        *(float4 *)(mm + i) = m4;
        *(float4 *)(vv + i) = v4;
        *(float4 *)(w + i) = o;
        if (LDT != CUK_F32) {
            const float ov[4] = {o.x, o.y, o.z, o.w};
            uint16_t h[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                h[k] = LDT == CUK_BF16 ? cuk_f32_to_bf16(ov[k]) : cuk_f32_to_f16_mode(ov[k], 0, 0);
            *(uint2 *)(lowp + i) =
                make_uint2((uint32_t)h[0] | (uint32_t)h[1] << 16, (uint32_t)h[2] | (uint32_t)h[3] << 16);
        }
    }
}

CUK_EMU_END(adamw);

extern "C" cudaError_t cuk_adamw(cudaStream_t s, float *p, const void *g, int gdt, float *m, float *v, void *lowp,
                                 int ldt, int64_t n, float b1, float b2, float eps, float step_size, float bc2_sqrt,
                                 float decay, float grad_scale) {
    if (n <= 0) return cudaSuccess;
    /* the vector path: f32 gradients, the four f32 arrays equally placed
     * against 16-byte boundaries (one flat layout) and the 16-bit copy
     * against 8-byte ones, 32-bit indices */
    const uintptr_t mis = (uintptr_t)p & 15;
    const bool low16 = lowp && (ldt == CUK_BF16 || ldt == CUK_F16);
    if (gdt == CUK_F32 && mis % 4 == 0 && ((uintptr_t)g & 15) == mis && ((uintptr_t)m & 15) == mis &&
        ((uintptr_t)v & 15) == mis && (!lowp || (low16 && ((uintptr_t)lowp & 7) == mis / 2)) &&
        n < ((int64_t)1 << 31)) {
        const uint32_t to_boundary = (uint32_t)(mis ? (16 - mis) / 4 : 0);
        const uint32_t head = to_boundary < (uint32_t)n ? to_boundary : (uint32_t)n;
        const int64_t quads = (n - head) / 4, threads = quads > 8 ? quads : 8;
        const unsigned grid = (unsigned)(cuk_cdiv(threads, NT) < 65536 ? cuk_cdiv(threads, NT) : 65536);
        if (!lowp)
            k_adamw_vec<CUK_F32><<<grid, NT, 0, s>>>(p, (const float *)g, m, v, nullptr, (uint32_t)n, head, b1, b2, eps,
                                                     step_size, bc2_sqrt, decay, grad_scale);
        else if (ldt == CUK_BF16)
            k_adamw_vec<CUK_BF16><<<grid, NT, 0, s>>>(p, (const float *)g, m, v, (uint16_t *)lowp, (uint32_t)n, head,
                                                      b1, b2, eps, step_size, bc2_sqrt, decay, grad_scale);
        else
            k_adamw_vec<CUK_F16><<<grid, NT, 0, s>>>(p, (const float *)g, m, v, (uint16_t *)lowp, (uint32_t)n, head, b1,
                                                     b2, eps, step_size, bc2_sqrt, decay, grad_scale);
        return launched();
    }
    k_adamw<<<flat_blocks(n), NT, 0, s>>>(p, g, gdt, m, v, lowp, ldt, n, b1, b2, eps, step_size, bc2_sqrt, decay,
                                          grad_scale);
    return launched();
}
