/* CUDA devices: creation (stream, cuBLASLt, workspaces), memory, copies,
 * synchronisation and the reporting of errors the kernels found. Compiled in
 * every build; without CUDA only the failing entry points remain. */
#include "cai_config.h"
#include "cuda_backend.h"

#if !CAI_HAVE_CUDA

cai_status cai_cuda_device_init(cai_device_t **out, int ordinal) {
    if (out) *out = NULL;
    return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                     "CUDA device %d requested, but this build has no CUDA backend "
                     "(configure --with-cuda on a machine with the CUDA toolkit)",
                     ordinal);
}

void cai_cuda_device_free(cai_device_t *dev) { (void)dev; }

const cai_ops *cai_ops_cuda(void) { return NULL; }

cai_status cai_cuda_mem_info(cai_device_t *dev, size_t *free_bytes, size_t *total_bytes);
cai_status cai_cuda_mem_info(cai_device_t *dev, size_t *free_bytes, size_t *total_bytes) {
    (void)dev;
    *free_bytes = *total_bytes = 0;
    return CAI_ERROR(CAI_ERR_UNSUPPORTED, "cai_device_mem_info: this build has no CUDA backend");
}

#else

#include "cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU(what, expr)                                                                                         \
    do {                                                                                                       \
        cudaError_t cu_e_ = (expr);                                                                            \
        if (cu_e_ != cudaSuccess)                                                                              \
            return CAI_ERROR(CAI_ERR_CUDA, "%s: %s failed: %s (%s)", (what), #expr, cudaGetErrorString(cu_e_), \
                             cudaGetErrorName(cu_e_));                                                         \
    } while (0)

/* Every cudaMalloc / cudaHostAlloc of the backend is counted in the
 * device's allocation counter (cai_device_alloc_count): the test that
 * training steps allocate nothing reads it. */
static void count_alloc(cai_device_t *dev, size_t bytes) {
    __atomic_add_fetch(&dev->n_allocs, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&dev->alloc_bytes, (uint64_t)bytes, __ATOMIC_RELAXED);
}

/* An integer knob (src/base/knobs.c) as a size_t; the table keeps it >= 0. */
static cai_status knob_size(const char *name, size_t *out) {
    long long v = 0;
    CAI_CALL(cai_knob_int(name, &v));
    *out = (size_t)v;
    return CAI_OK;
}

cai_status cai_cuda_enter(cai_device_t *dev, const char *op) {
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur != dev->ordinal) e = cudaSetDevice(dev->ordinal);
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "%s: making cuda:%d current failed: %s", op, dev->ordinal,
                         cudaGetErrorString(e));
    return CAI_OK;
}

cai_status cai_cuda_launch_status(cudaError_t e, const char *op, const char *what, const char *file, int line) {
    if (e == cudaErrorMemoryAllocation)
        return cai_error_set(CAI_ERR_NOMEM, file, line, op,
                             "%s: %s: the device scratch (CAI_CUDA_SCRATCH_MB) is too "
                             "small for this size, or device memory ran out (%s)",
                             op, what, cudaGetErrorString(e));
    return cai_error_set(CAI_ERR_CUDA, file, line, op, "%s: %s failed: %s (%s)", op, what, cudaGetErrorString(e),
                         cudaGetErrorName(e));
}

cai_status cai_cuda_take_device_error(cai_device_t *dev) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    /* The stream is idle here: one small read-back per synchronisation. */
    cudaError_t e = cudaMemcpyAsync(c->err_host, c->err, sizeof *c->err, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "cuda:%d: reading the kernels' error record failed: %s", dev->ordinal,
                         cudaGetErrorString(e));
    const cuk_errrec *r = c->err_host;
    int code = r->code;
    if (code == CUK_ERR_NONE) return CAI_OK;
    long long a = (long long)r->a, b = (long long)r->b, cc = (long long)r->c, d = (long long)r->d;
    e = cudaMemsetAsync(c->err, 0, sizeof *c->err, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "cuda:%d: clearing the kernels' error record failed: %s", dev->ordinal,
                         cudaGetErrorString(e));
    switch (code) {
    case CUK_ERR_TOKEN:
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "embedding_fwd on cuda:%d: token id %lld at batch %lld, position %lld "
                         "is outside the vocabulary [0, %lld) (found by the kernel, reported at this synchronisation; "
                         "its row was written as zeros)",
                         dev->ordinal, cc, a, b, d);
    case CUK_ERR_TARGET:
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "xent_fwd on cuda:%d: target %lld of row %lld is outside the valid "
                         "vocabulary [%lld, %lld) of these logits (found by the kernel, reported at this "
                         "synchronisation; its loss was written as 0)",
                         dev->ordinal, b, a, cc, d);
    case CUK_ERR_POSITION:
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "rope on cuda:%d: position %lld of token %lld is outside the tables' "
                         "[0, %lld) (found by the kernel, reported at this synchronisation; its head rows were written "
                         "as zeros)",
                         dev->ordinal, b, a, cc);
    case CUK_ERR_SLOT:
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "kv_cache_write on cuda:%d: slots[%lld] = %lld is past the cache's %lld slots (found by the "
                         "kernel, reported at this synchronisation; its row was not written)",
                         dev->ordinal, a, b, cc);
    case CUK_ERR_BLOCK:
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "paged_attention on cuda:%d: block_tables[%lld, %lld] = %lld is not a block of the %lld "
                         "(found by the kernel, reported at this synchronisation; that block's keys were left out)",
                         dev->ordinal, a, b, cc, d);
    case CUK_ERR_SEQ:
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "paged_attention on cuda:%d: sequence %lld has %lld queries and ctx_len %lld (need q_start "
                         "rising from 0 to N and queries <= ctx_len <= %lld, the smaller of max_ctx and the block "
                         "table's reach; found by the kernel, reported at this synchronisation; its rows were written "
                         "as zeros)",
                         dev->ordinal, a, b, cc, d);
    case CUK_ERR_MOE_POS:
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "moe op on cuda:%d: pos[%lld] = %lld is past the %lld grouped rows (found by the kernel, "
                         "reported at this synchronisation; that row was skipped)",
                         dev->ordinal, a, b, cc);
    case CUK_ERR_MOE_LOGIT:
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "moe_route on cuda:%d: the logit of token %lld for expert %lld (of %lld) is not finite "
                         "(found by the kernel, reported at this synchronisation; the token was routed to experts 0.. "
                         "with weight 0)",
                         dev->ordinal, a, b, cc);
    case CUK_ERR_MOE_SEL:
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "moe_assign on cuda:%d: sel[%lld] = %lld is not one of the %lld experts (found by the kernel, "
                         "reported at this synchronisation; its pos set to -1)",
                         dev->ordinal, a, b, cc);
    }
    return CAI_ERROR(CAI_ERR_INTERNAL, "cuda:%d: unknown device error code %d", dev->ordinal, code);
}

/* ---------------------------------------------------------------- device */

static void release(cai_device_t *dev) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    if (c) {
        cudaSetDevice(c->ordinal);
        if (c->stream) cudaStreamSynchronize(c->stream);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->lt_ws) cudaFree(c->lt_ws);
        if (c->scratch) cudaFree(c->scratch);
        if (c->err) cudaFree(c->err);
        if (c->err_host) cudaFreeHost(c->err_host);
        if (c->paged_cnt) cudaFree(c->paged_cnt);
        if (c->dgemm_ws) cudaFree(c->dgemm_ws);
        if (c->dgemm_cnt) cudaFree(c->dgemm_cnt);
        if (c->blas) cublasDestroy(c->blas);
        if (c->grouped_ptrs) cudaFree(c->grouped_ptrs);
        for (int i = 0; i < CAI_CUDA_SIDE; i++) {
            if (c->side[i]) cudaStreamSynchronize(c->side[i]), cudaStreamDestroy(c->side[i]);
            if (c->side_ws[i]) cudaFree(c->side_ws[i]);
        }
        for (int i = 0; i <= CAI_CUDA_SIDE; i++)
            if (c->side_ev[i]) cudaEventDestroy(c->side_ev[i]);
        if (c->stream) cudaStreamDestroy(c->stream);
        cudaGetLastError();
        cai_free(c);
    }
    cai_free(dev);
}

static cai_status setup(cai_device_t *dev, int ordinal) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    const char *w = "cuda device init";
    CU(w, cudaSetDevice(ordinal));
    struct cudaDeviceProp prop;
    CU(w, cudaGetDeviceProperties(&prop, ordinal));
    c->num_sms = prop.multiProcessorCount;
    CU(w, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    cublasStatus_t bs = cublasLtCreate(&c->lt);
    if (bs != CUBLAS_STATUS_SUCCESS)
        return CAI_ERROR(CAI_ERR_CUDA, "cuda:%d: cublasLtCreate failed with status %d", ordinal, (int)bs);
    size_t mb = 0;
    CAI_CALL(knob_size("CAI_CUDA_LT_WORKSPACE_MB", &mb));
    c->lt_ws_bytes = mb << 20;
    if (c->lt_ws_bytes) {
        CU(w, cudaMalloc(&c->lt_ws, c->lt_ws_bytes));
        count_alloc(dev, c->lt_ws_bytes);
    }
    CAI_CALL(knob_size("CAI_CUDA_SCRATCH_MB", &mb));
    c->scratch_bytes = mb << 20;
    CU(w, cudaMalloc(&c->scratch, c->scratch_bytes));
    count_alloc(dev, c->scratch_bytes);
    CU(w, cudaMalloc((void **)&c->err, sizeof *c->err));
    count_alloc(dev, sizeof *c->err);
    CU(w, cudaMemset(c->err, 0, sizeof *c->err));
    CU(w, cudaHostAlloc((void **)&c->err_host, sizeof *c->err_host, cudaHostAllocPortable));
    count_alloc(dev, sizeof *c->err_host);
    CU(w, cudaMalloc((void **)&c->paged_cnt, CAI_CUDA_PAGED_COUNTERS * sizeof *c->paged_cnt));
    count_alloc(dev, CAI_CUDA_PAGED_COUNTERS * sizeof *c->paged_cnt);
    CU(w, cudaMemset(c->paged_cnt, 0, CAI_CUDA_PAGED_COUNTERS * sizeof *c->paged_cnt));
    if (cuk_dgemm_ready()) {
        CU(w, cudaMalloc(&c->dgemm_ws, CAI_CUDA_DGEMM_WS));
        count_alloc(dev, CAI_CUDA_DGEMM_WS);
        CU(w, cudaMalloc((void **)&c->dgemm_cnt, CUK_DGEMM_COUNTERS * sizeof *c->dgemm_cnt));
        count_alloc(dev, CUK_DGEMM_COUNTERS * sizeof *c->dgemm_cnt);
        CU(w, cudaMemset(c->dgemm_cnt, 0, CUK_DGEMM_COUNTERS * sizeof *c->dgemm_cnt));
    }
    CU(w, cuk_attn_setup());
    long long tf32 = 0, tune = 0, pdl = 1;
    CAI_CALL(cai_knob_int("CAI_CUDA_TF32", &tf32));
    c->allow_tf32 = tf32 == 1;
    CAI_CALL(cai_knob_int("CAI_CUBLASLT_AUTOTUNE", &tune));
    c->lt_autotune = tune == 1 ? 8 : (int)tune; /* 1: the heuristic's 8 best */
    CAI_CALL(cai_knob_int("CAI_CUDA_PDL", &pdl));
    c->pdl = pdl == 1 && prop.major >= 9;
    snprintf(dev->name, sizeof dev->name, "cuda:%d (%.24s, sm_%d%d, %d SMs%s)", ordinal, prop.name, prop.major,
             prop.minor, prop.multiProcessorCount, c->allow_tf32 ? ", tf32" : "");
    return CAI_OK;
}

cai_status cai_cuda_device_init(cai_device_t **out, int ordinal) {
    CAI_CHECK_ARG(out, "cai_device_init: NULL output");
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "CUDA device %d requested, but no GPU is visible (%s; "
                         "CUDA_VISIBLE_DEVICES=%s)",
                         ordinal, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices",
                         getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    }
    CAI_CHECK_ARG(ordinal >= 0 && ordinal < n, "CUDA device %d requested, but %d GPU%s visible (ordinals 0..%d)",
                  ordinal, n, n == 1 ? " is" : "s are", n - 1);
    cai_device_t *dev = NULL;
    CAI_CALL(cai_calloc((void **)&dev, 1, sizeof *dev, "cuda device"));
    cai_status st = cai_calloc(&dev->impl, 1, sizeof(cai_cuda_impl), "cuda device state");
    if (st != CAI_OK) {
        cai_free(dev);
        CAI_CALL(st);
    }
    dev->kind = CAI_DEVICE_CUDA;
    dev->ordinal = ordinal;
    dev->num_threads = 1;
    dev->ops = cai_ops_cuda();
    cai_cuda_of(dev)->ordinal = ordinal;
    CAI_CALL_GOTO(setup(dev, ordinal), st, fail);
    *out = dev;
    return CAI_OK;
fail:
    release(dev);
    return st;
}

void cai_cuda_device_free(cai_device_t *dev) {
    if (dev) release(dev);
}

/* ---------------------------------------------------------------- memory */

cai_status cai_cuda_alloc(cai_device_t *dev, size_t bytes, const char *what, void **out) {
    *out = NULL;
    if (bytes == 0) return CAI_OK;
    CAI_CALL(cai_cuda_enter(dev, "alloc"));
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        *out = NULL;
        return CAI_ERROR(CAI_ERR_NOMEM, "cudaMalloc of %zu MiB for %s on cuda:%d failed: %s (%zu of %zu MiB free)",
                         bytes >> 20, what ? what : "?", dev->ordinal, cudaGetErrorString(e), fr >> 20, tot >> 20);
    }
    count_alloc(dev, bytes);
    return CAI_OK;
}

cai_status cai_cuda_mem_info(cai_device_t *dev, size_t *free_bytes, size_t *total_bytes);
cai_status cai_cuda_mem_info(cai_device_t *dev, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    CAI_CALL(cai_cuda_enter(dev, "mem_info"));
    CU("cai_device_mem_info", cudaMemGetInfo(free_bytes, total_bytes));
    return CAI_OK;
}

void cai_cuda_dealloc(cai_device_t *dev, void *ptr) {
    if (!ptr) return;
    if (cai_cuda_enter(dev, "dealloc") != CAI_OK) return;
    cudaFree(ptr);
}

cai_status cai_cuda_alloc_staging(cai_device_t *dev, size_t bytes, const char *what, void **out) {
    *out = NULL;
    if (bytes == 0) return CAI_OK;
    CAI_CALL(cai_cuda_enter(dev, "alloc_staging"));
    cudaError_t e = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return CAI_ERROR(CAI_ERR_NOMEM, "pinned host allocation of %zu MiB for %s failed: %s", bytes >> 20,
                         what ? what : "?", cudaGetErrorString(e));
    }
    count_alloc(dev, bytes);
    return CAI_OK;
}

void cai_cuda_dealloc_staging(cai_device_t *dev, void *ptr) {
    if (ptr) cudaFreeHost(ptr);
}

cai_status cai_cuda_memcpy(cai_device_t *dev, void *dst, const void *src, size_t bytes, cai_copy_kind kind) {
    static const char *op = "memcpy";
    cudaStream_t s = cai_cuda_of(dev)->stream;
    CAI_CALL(cai_cuda_enter(dev, op));
    switch (kind) {
    case CAI_COPY_H2H: memmove(dst, src, bytes); return CAI_OK;
    case CAI_COPY_H2D: CU(op, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s)); return CAI_OK;
    case CAI_COPY_D2D: CU(op, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); return CAI_OK;
    case CAI_COPY_D2H:
        /* The caller reads the host buffer next: finish the copy (and
         * everything before it) and surface any error the kernels found. */
        CU(op, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
        CAI_CALL(cai_cuda_sync(dev));
        return CAI_OK;
    }
    return CAI_ERROR(CAI_ERR_INVALID_ARG, "memcpy: unknown copy kind %d", (int)kind);
}

cai_status cai_cuda_sync(cai_device_t *dev) {
    CAI_CALL(cai_cuda_enter(dev, "sync"));
    cudaError_t e = cudaStreamSynchronize(cai_cuda_of(dev)->stream);
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA,
                         "cuda:%d: a kernel of an earlier op failed: %s (%s); run with "
                         "CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer to find which",
                         dev->ordinal, cudaGetErrorString(e), cudaGetErrorName(e));
    CAI_CALL(cai_cuda_take_device_error(dev));
    return CAI_OK;
}

#endif
