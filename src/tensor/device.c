/* Devices: which op table runs, and where memory comes from. */
#include "cai_config.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#include <cblas.h>

/* The CUDA backend (kernels/cuda_device.c) defines these in every build
 * (failing with CAI_ERR_UNSUPPORTED without CUDA). Weak references keep this
 * file linkable whether or not that object is part of the library. */
cai_status cai_cuda_device_init(cai_device_t **out, int ordinal) __attribute__((weak));
void cai_cuda_device_free(cai_device_t *dev) __attribute__((weak));
cai_status cai_cuda_mem_info(cai_device_t *dev, size_t *free_bytes, size_t *total_bytes) __attribute__((weak));

const char *cai_device_kind_name(cai_device_kind kind) {
    switch (kind) {
    case CAI_DEVICE_HOST: return "host";
    case CAI_DEVICE_CUDA: return "cuda";
    }
    return "unknown";
}

cai_status cai_device_init(cai_device_t **out, cai_device_kind kind, int ordinal, int num_threads) {
    CAI_CHECK_ARG(out, "cai_device_init: NULL output");
    *out = NULL;
    if (kind == CAI_DEVICE_CUDA) {
        if (cai_cuda_device_init) {
            CAI_CALL(cai_cuda_device_init(out, ordinal));
            return CAI_OK;
        }
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "CUDA device %d requested, but this build has no CUDA backend "
                         "(configure --with-cuda on a machine with the CUDA toolkit)",
                         ordinal);
    }
    CAI_CHECK_ARG(kind == CAI_DEVICE_HOST, "cai_device_init: unknown device kind %d", (int)kind);
    cai_device_t *dev = NULL;
    CAI_CALL(cai_calloc((void **)&dev, 1, sizeof *dev, "host device"));
    int nt = num_threads;
#ifdef _OPENMP
    if (nt <= 0) nt = omp_get_max_threads();
#endif
    if (nt <= 0) nt = 1;
    dev->kind = kind;
    dev->ordinal = 0;
    dev->num_threads = nt;
    dev->ops = cai_ops_cpu();
#ifdef OPENBLAS_VERSION
    /* The CPU backend threads its sgemm calls itself (OpenMP panels, see
     * cpu_matmul.c), so OpenBLAS's own pool stays at one thread: a second
     * pool of spinning threads would compete with OpenMP's for the cores. */
    openblas_set_num_threads(1);
    snprintf(dev->name, sizeof dev->name, "host (%d thread%s,%s)", nt, nt == 1 ? "" : "s", OPENBLAS_VERSION);
#else
    snprintf(dev->name, sizeof dev->name, "host (%d thread%s)", nt, nt == 1 ? "" : "s");
#endif
    *out = dev;
    return CAI_OK;
}

void cai_device_free(cai_device_t *dev) {
    if (dev && dev->kind == CAI_DEVICE_CUDA && cai_cuda_device_free) cai_cuda_device_free(dev);
    else cai_free(dev);
}

/* The CUDA backend counts its own cudaMalloc / cudaHostAlloc calls (it
 * also allocates at init, outside these entry points); the host backend's
 * allocations are counted here. */
static void count_host_alloc(cai_device_t *dev, size_t bytes, const void *p) {
    if (dev->kind != CAI_DEVICE_HOST || !p || bytes == 0) return;
    __atomic_add_fetch(&dev->n_allocs, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&dev->alloc_bytes, (uint64_t)bytes, __ATOMIC_RELAXED);
}

uint64_t cai_device_alloc_count(const cai_device_t *dev, uint64_t *bytes) {
    if (bytes) *bytes = dev ? __atomic_load_n(&dev->alloc_bytes, __ATOMIC_RELAXED) : 0;
    return dev ? __atomic_load_n(&dev->n_allocs, __ATOMIC_RELAXED) : 0;
}

cai_status cai_device_mem_info(cai_device_t *dev, size_t *free_bytes, size_t *total_bytes) {
    CAI_CHECK_ARG(dev && free_bytes && total_bytes, "cai_device_mem_info: NULL device or output");
    *free_bytes = *total_bytes = 0;
    if (dev->kind == CAI_DEVICE_CUDA) {
        if (!cai_cuda_mem_info)
            return CAI_ERROR(CAI_ERR_UNSUPPORTED, "cai_device_mem_info: this build has no CUDA backend");
        CAI_CALL(cai_cuda_mem_info(dev, free_bytes, total_bytes));
        return CAI_OK;
    }
    long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES), phys = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || avail < 0 || phys <= 0)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "cai_device_mem_info: sysconf gives no physical memory size here");
    *free_bytes = (size_t)avail * (size_t)page;
    *total_bytes = (size_t)phys * (size_t)page;
    return CAI_OK;
}

cai_status cai_device_alloc(cai_device_t *dev, size_t bytes, const char *what, void **out) {
    CAI_CHECK_ARG(dev && out, "cai_device_alloc: NULL device or output (%s)", what ? what : "?");
    CAI_CALL(dev->ops->alloc(dev, bytes, what, out));
    count_host_alloc(dev, bytes, *out);
    return CAI_OK;
}

void cai_device_dealloc(cai_device_t *dev, void *ptr) {
    if (dev && ptr) dev->ops->dealloc(dev, ptr);
}

cai_status cai_device_alloc_staging(cai_device_t *dev, size_t bytes, const char *what, void **out) {
    CAI_CHECK_ARG(dev && out, "cai_device_alloc_staging: NULL device or output (%s)", what ? what : "?");
    CAI_CALL(dev->ops->alloc_staging(dev, bytes, what, out));
    count_host_alloc(dev, bytes, *out);
    return CAI_OK;
}

void cai_device_dealloc_staging(cai_device_t *dev, void *ptr) {
    if (dev && ptr) dev->ops->dealloc_staging(dev, ptr);
}

cai_status cai_device_copy(cai_device_t *dev, void *dst, const void *src, size_t bytes, cai_copy_kind kind) {
    CAI_CHECK_ARG(dev, "cai_device_copy: NULL device");
    if (bytes == 0) return CAI_OK;
    CAI_CHECK_ARG(dst && src, "cai_device_copy: NULL pointer for %zu bytes", bytes);
    CAI_CALL(dev->ops->memcpy(dev, dst, src, bytes, kind));
    return CAI_OK;
}

cai_status cai_device_sync(cai_device_t *dev) {
    CAI_CHECK_ARG(dev, "cai_device_sync: NULL device");
    CAI_CALL(dev->ops->sync(dev));
    return CAI_OK;
}

/* The CUDA backend's state starts with its cudaStream_t (kernels/
 * cuda_internal.h, on purpose: docs/cuda.md), so this needs no CUDA header. */
void *cai_device_stream(const cai_device_t *dev) {
    if (!dev || dev->kind != CAI_DEVICE_CUDA || !dev->impl) return NULL;
    return *(void *const *)dev->impl;
}

cai_status cai_device_arena_init(cai_device_t *dev, cai_arena_t *arena, size_t capacity, const char *name) {
    CAI_CHECK_ARG(dev && arena, "cai_device_arena_init: NULL device or arena");
    memset(arena, 0, sizeof *arena);
    arena->name = name ? name : "device arena";
    void *p = NULL;
    CAI_CALL(cai_device_alloc(dev, capacity, arena->name, &p));
    arena->base = p;
    arena->capacity = capacity;
    return CAI_OK;
}

void cai_device_arena_free(cai_device_t *dev, cai_arena_t *arena) {
    if (!arena) return;
    cai_device_dealloc(dev, arena->base);
    memset(arena, 0, sizeof *arena);
}
