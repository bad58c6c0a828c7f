/* Elementwise kernels, conversions, reductions, activations, RoPE and AdamW.
 * All are memory-bound: one pass over their tensors, f32 arithmetic, any
 * float storage dtype per argument (see cuda_common.cuh). Row views put
 * rows on grid.y and columns on grid.x, so strided rows cost no division. */
#include "cuda_common.cuh"

#define NT 256

static cudaError_t launched(void) { return cudaGetLastError(); }

/* ---------------------------------------------------------------- fill, copy */

__global__ void k_fill(cuk_mat x, float v) {
    CUK_FOR_RC(x.rows, x.cols) {
        int64_t i = r * x.ld + c;
        if (x.dt == CUK_I32) ((int32_t *)x.p)[i] = (int32_t)v;
        else stf(x.p, x.dt, i, v);
    }
}

extern "C" cudaError_t cuk_fill(cudaStream_t s, cuk_mat x, float value) {
    if (x.rows <= 0 || x.cols <= 0) return cudaSuccess;
    k_fill<<<cuk_rows_grid(x.rows, x.cols, NT), NT, 0, s>>>(x, value);
    return launched();
}

__global__ void k_copy_rows(cuk_mat d, cuk_mat s) {
    CUK_FOR_RC(d.rows, d.cols) stf(d.p, d.dt, r * d.ld + c, ldf(s.p, s.dt, r * s.ld + c));
}

extern "C" cudaError_t cuk_copy_rows(cudaStream_t s, cuk_mat dst, cuk_mat src) {
    if (dst.rows <= 0 || dst.cols <= 0) return cudaSuccess;
    k_copy_rows<<<cuk_rows_grid(dst.rows, dst.cols, NT), NT, 0, s>>>(dst, src);
    return launched();
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
    if (dst.rows <= 0 || dst.cols <= 0) return cudaSuccess;
    k_copy_sr_rows<<<cuk_rows_grid(dst.rows, dst.cols, NT), NT, 0, s>>>(dst, src, seed, stream, index_offset);
    return launched();
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

__global__ void k_scale(cuk_mat x, float a) {
    CUK_FOR_RC(x.rows, x.cols) {
        int64_t i = r * x.ld + c;
        stf(x.p, x.dt, i, ldf(x.p, x.dt, i) * a);
    }
}

extern "C" cudaError_t cuk_scale(cudaStream_t s, cuk_mat x, float alpha) {
    if (x.rows <= 0 || x.cols <= 0) return cudaSuccess;
    k_scale<<<cuk_rows_grid(x.rows, x.cols, NT), NT, 0, s>>>(x, alpha);
    return launched();
}

__global__ void k_axpy(cuk_mat y, float a, cuk_mat x) {
    CUK_FOR_RC(y.rows, y.cols) {
        int64_t iy = r * y.ld + c;
        stf(y.p, y.dt, iy, ldf(y.p, y.dt, iy) + a * ldf(x.p, x.dt, r * x.ld + c));
    }
}

extern "C" cudaError_t cuk_axpy(cudaStream_t s, cuk_mat y, float alpha, cuk_mat x) {
    if (y.rows <= 0 || y.cols <= 0) return cudaSuccess;
    k_axpy<<<cuk_rows_grid(y.rows, y.cols, NT), NT, 0, s>>>(y, alpha, x);
    return launched();
}

__global__ void k_add(cuk_mat o, cuk_mat a, cuk_mat b) {
    CUK_FOR_RC(o.rows, o.cols) {
        float v = ldf(a.p, a.dt, r * a.ld + c) + ldf(b.p, b.dt, r * b.ld + c);
        stf(o.p, o.dt, r * o.ld + c, v);
    }
}

extern "C" cudaError_t cuk_add(cudaStream_t s, cuk_mat out, cuk_mat a, cuk_mat b) {
    if (out.rows <= 0 || out.cols <= 0) return cudaSuccess;
    k_add<<<cuk_rows_grid(out.rows, out.cols, NT), NT, 0, s>>>(out, a, b);
    return launched();
}

__global__ void k_bias_add(cuk_mat x, const void *bias, int bdt) {
    CUK_FOR_RC(x.rows, x.cols) {
        int64_t i = r * x.ld + c;
        stf(x.p, x.dt, i, ldf(x.p, x.dt, i) + ldf(bias, bdt, c));
    }
}

extern "C" cudaError_t cuk_bias_add(cudaStream_t s, cuk_mat x, const void *bias, int bias_dt) {
    if (x.rows <= 0 || x.cols <= 0) return cudaSuccess;
    k_bias_add<<<cuk_rows_grid(x.rows, x.cols, NT), NT, 0, s>>>(x, bias, bias_dt);
    return launched();
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
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
            double v = ldf(x.p, x.dt, i);
            acc += sq ? v * v : v;
        }
    } else {
        for (int64_t r = blockIdx.x; r < x.rows; r += gridDim.x)
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

__global__ void k_colsum_partial(cuk_mat dy, cuk_mat x, const float *mean, const float *rstd, int64_t rpc,
                                 float *pw, float *pb) {
    __shared__ float sw[CS_LANES][CS_COLS + 1], sb[CS_LANES][CS_COLS + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t c = blockIdx.x * (int64_t)CS_COLS + tx, chunk = blockIdx.y;
    int64_t r0 = chunk * rpc, r1 = r0 + rpc < dy.rows ? r0 + rpc : dy.rows;
    float aw = 0.0f, ab = 0.0f;
    if (c < dy.cols) {
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

__global__ void k_colsum_final(const float *pw, const float *pb, int64_t nchunk, int64_t cols, float *dw, float *db) {
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= cols) return;
    double w = 0.0, b = 0.0;
    for (int64_t k = 0; k < nchunk; k++) {
        if (pw) w += pw[k * cols + c];
        if (pb) b += pb[k * cols + c];
    }
    if (dw) dw[c] = (float)((double)dw[c] + w);
    if (db) db[c] = (float)((double)db[c] + b);
}

extern "C" cudaError_t cuk_colsums(cudaStream_t s, float *dw, float *db, cuk_mat dy, cuk_mat x, const float *mean,
                                   const float *rstd, float *scratch, size_t scratch_floats) {
    if (dy.cols <= 0 || (!dw && !db)) return cudaSuccess;
    if (dy.rows <= 0) return cudaSuccess;
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
    k_colsum_final<<<(unsigned)cuk_cdiv(dy.cols, NT), NT, 0, s>>>(pw, pb, nchunk, dy.cols, dw, db);
    return launched();
}

/* ---------------------------------------------------------------- activations */

#define GELU_K 0.7978845608028654f
#define GELU_C 0.044715f

__global__ void k_gelu_fwd(cuk_mat y, cuk_mat x) {
    CUK_FOR_RC(y.rows, y.cols) {
        float v = ldf(x.p, x.dt, r * x.ld + c);
        stf(y.p, y.dt, r * y.ld + c, 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_C * v * v * v))));
    }
}

extern "C" cudaError_t cuk_gelu_fwd(cudaStream_t s, cuk_mat y, cuk_mat x) {
    if (y.rows <= 0 || y.cols <= 0) return cudaSuccess;
    k_gelu_fwd<<<cuk_rows_grid(y.rows, y.cols, NT), NT, 0, s>>>(y, x);
    return launched();
}

__global__ void k_gelu_bwd(cuk_mat dx, cuk_mat x, cuk_mat dy) {
    CUK_FOR_RC(dx.rows, dx.cols) {
        float v = ldf(x.p, x.dt, r * x.ld + c), d = ldf(dy.p, dy.dt, r * dy.ld + c);
        float t = tanhf(GELU_K * (v + GELU_C * v * v * v));
        float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * v * v);
        stf(dx.p, dx.dt, r * dx.ld + c, grad * d);
    }
}

extern "C" cudaError_t cuk_gelu_bwd(cudaStream_t s, cuk_mat dx, cuk_mat x, cuk_mat dy) {
    if (dx.rows <= 0 || dx.cols <= 0) return cudaSuccess;
    k_gelu_bwd<<<cuk_rows_grid(dx.rows, dx.cols, NT), NT, 0, s>>>(dx, x, dy);
    return launched();
}

__global__ void k_swiglu_fwd(cuk_mat y, cuk_mat g, cuk_mat u) {
    CUK_FOR_RC(y.rows, y.cols) {
        float v = ldf(g.p, g.dt, r * g.ld + c), w = ldf(u.p, u.dt, r * u.ld + c);
        stf(y.p, y.dt, r * y.ld + c, v / (1.0f + expf(-v)) * w);
    }
}

extern "C" cudaError_t cuk_swiglu_fwd(cudaStream_t s, cuk_mat y, cuk_mat g, cuk_mat u) {
    if (y.rows <= 0 || y.cols <= 0) return cudaSuccess;
    k_swiglu_fwd<<<cuk_rows_grid(y.rows, y.cols, NT), NT, 0, s>>>(y, g, u);
    return launched();
}

__global__ void k_swiglu_bwd(cuk_mat dg, cuk_mat du, cuk_mat dy, cuk_mat g, cuk_mat u) {
    CUK_FOR_RC(g.rows, g.cols) {
        /* read everything first: dgate/dup may overwrite gate/up */
        float v = ldf(g.p, g.dt, r * g.ld + c), w = ldf(u.p, u.dt, r * u.ld + c);
        float d = ldf(dy.p, dy.dt, r * dy.ld + c);
        float sig = 1.0f / (1.0f + expf(-v));
        if (dg.p) stf(dg.p, dg.dt, r * dg.ld + c, d * w * sig * (1.0f + v * (1.0f - sig)));
        if (du.p) stf(du.p, du.dt, r * du.ld + c, d * v * sig);
    }
}

extern "C" cudaError_t cuk_swiglu_bwd(cudaStream_t s, cuk_mat dg, cuk_mat du, cuk_mat dy, cuk_mat g, cuk_mat u) {
    if (g.rows <= 0 || g.cols <= 0) return cudaSuccess;
    k_swiglu_bwd<<<cuk_rows_grid(g.rows, g.cols, NT), NT, 0, s>>>(dg, du, dy, g, u);
    return launched();
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
    if (cos.rows <= 0 || cos.cols <= 0) return cudaSuccess;
    k_rope_tables<<<cuk_rows_grid(cos.rows, cos.cols, NT), NT, 0, s>>>(cos, sin, theta);
    return launched();
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
        for (int64_t w = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; w < work; w += (int64_t)gridDim.x * blockDim.x) {
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

extern "C" cudaError_t cuk_rope(cudaStream_t s, cuk_bthd y, cuk_bthd x, cuk_mat cos, cuk_mat sin, const int32_t *pos,
                                int pos_per_batch, int64_t pos_offset, float sign, cuk_errrec *err) {
    int64_t half = cos.cols, work = x.H * half + (y.p != x.p ? x.H * (x.D - 2 * half) : 0);
    if (x.B * x.T <= 0 || work <= 0) return cudaSuccess;
    k_rope<<<cuk_rows_grid(x.B * x.T, work, 128), 128, 0, s>>>(y, x, cos, sin, pos, pos_per_batch, pos_offset, sign,
                                                                err);
    return launched();
}

/* ---------------------------------------------------------------- AdamW */

__global__ void k_adamw(float *w, const void *g, int gdt, float *mm, float *vv, void *lowp, int ldt, int64_t n,
                        float b1, float b2, float eps, float step_size, float bc2_sqrt, float decay, float gs) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float gi = ldf(g, gdt, i) * gs;
        float mi = b1 * mm[i] + (1.0f - b1) * gi;
        float vi = b2 * vv[i] + (1.0f - b2) * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        float wi = w[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        w[i] = wi;
        if (lowp) stf(lowp, ldt, i, wi);
    }
}

extern "C" cudaError_t cuk_adamw(cudaStream_t s, float *p, const void *g, int gdt, float *m, float *v, void *lowp,
                                 int ldt, int64_t n, float b1, float b2, float eps, float step_size, float bc2_sqrt,
                                 float decay, float grad_scale) {
    if (n <= 0) return cudaSuccess;
    k_adamw<<<flat_blocks(n), NT, 0, s>>>(p, g, gdt, m, v, lowp, ldt, n, b1, b2, eps, step_size, bc2_sqrt, decay,
                                          grad_scale);
    return launched();
}
