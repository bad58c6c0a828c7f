/* Data parallelism: the gradient all-reduce and the replica check. */
#include "cai_config.h"

#include <stdint.h>
#include <string.h>

#include "colossal/parallel.h"
#include "colossal/tensor.h"

cai_status cai_dp_allreduce_grads(cai_mesh_t *mesh, cai_model_t *m) {
    CAI_CHECK_ARG(mesh && m, "cai_dp_allreduce_grads: NULL argument");
    CAI_CHECK_ARG(!cai_model_external_params(m),
                  "cai_dp_allreduce_grads: the model's gradients live in a ZeRO "
                  "engine, which reduces them itself");
    if (cai_mesh_size(mesh, CAI_AXIS_DP) == 1) return CAI_OK;
    cai_tensor params, grads, lowp;
    cai_model_flat(m, &params, &grads, &lowp);
    size_t n = (size_t)cai_tensor_numel(&grads);
    if (n == 0) return CAI_OK; /* still collective: every dp peer holds the same stage, so also 0 */
    /* The device must have finished the backward before the reduction reads
     * the buffer (the collective follows the mesh's stream on CUDA, which
     * need not be the device's). */
    CAI_CALL(cai_device_sync(cai_model_device(m)));
    CAI_CALL(cai_allreduce(mesh, CAI_AXIS_DP, grads.data, grads.data, n, CAI_DTYPE_F32, CAI_RED_AVG));
    return CAI_OK;
}

/* 64-bit multiply-xorshift over 8-byte words: not cryptographic, only has to
 * make two different float buffers collide with negligible probability. */
static uint64_t hash_words(uint64_t h, const unsigned char *p, size_t bytes) {
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h ^= w;
        h *= 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    for (; i < bytes; i++) {
        h ^= p[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

/* Hash of `bytes` bytes at `src` on `dev`, read through `stage`. */
static cai_status hash_params(cai_device_t *dev, const void *src, size_t bytes, void *stage, size_t stage_bytes,
                              uint64_t *out) {
    uint64_t h = 0xCBF29CE484222325ull ^ (uint64_t)bytes;
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < stage_bytes ? bytes - done : stage_bytes;
        const unsigned char *host = (const unsigned char *)src + done;
        if (dev->kind != CAI_DEVICE_HOST) {
            CAI_CALL(cai_device_copy(dev, stage, host, n, CAI_COPY_D2H));
            CAI_CALL(cai_device_sync(dev));
            host = stage;
        }
        h = hash_words(h, host, n);
        done += n;
    }
    *out = h;
    return CAI_OK;
}

cai_status cai_dp_check_replicas(cai_mesh_t *mesh, cai_model_t *m) {
    CAI_CHECK_ARG(mesh && m, "cai_dp_check_replicas: NULL argument");
    CAI_CHECK_ARG(!cai_model_external_params(m),
                  "cai_dp_check_replicas: the model's weights live in a ZeRO engine "
                  "(sharded from stage 1 on), not in replicas");
    if (cai_mesh_size(mesh, CAI_AXIS_DP) == 1) return CAI_OK;
    const cai_registry_t *reg = cai_model_registry(m);
    cai_device_t *dev = cai_model_device(m);
    int np = cai_registry_count(reg);
    size_t *offsets = NULL, total = 0;
    int64_t *lo = NULL, *hi = NULL;
    void *stage = NULL;
    const size_t stage_bytes = (size_t)4 << 20;
    cai_status st = CAI_OK;
    CAI_CALL_GOTO(cai_calloc((void **)&offsets, (size_t)np + 1, sizeof *offsets, "replica check offsets"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&lo, (size_t)np + 1, sizeof *lo, "replica check hashes"), st, done);
    CAI_CALL_GOTO(cai_calloc((void **)&hi, (size_t)np + 1, sizeof *hi, "replica check hashes"), st, done);
    CAI_CALL_GOTO(cai_registry_local_layout(reg, cai_model_view(m), cai_model_align_elems(m), offsets, &total), st,
                  done);
    if (dev->kind != CAI_DEVICE_HOST)
        CAI_CALL_GOTO(cai_device_alloc_staging(dev, stage_bytes, "replica check staging", (void **)&stage), st, done);
    CAI_CALL_GOTO(cai_device_sync(dev), st, done);
    /* the F32 masters, or what a frozen model kept (cai_model_keep_compute) */
    const cai_weights_t *w = cai_model_weights(m);
    const int compute = cai_weights_compute_only(w);
    for (int i = 0; i < np; i++) {
        if (offsets[i] == SIZE_MAX) continue; /* not on this stage: 0 on every replica of it */
        cai_tensor t;
        CAI_CALL_GOTO(cai_weights_param_view(w, i, compute, &t), st, done);
        uint64_t h = 0;
        CAI_CALL_GOTO(hash_params(dev, t.data, cai_tensor_nbytes(&t), stage, stage_bytes, &h), st, done);
        memcpy(&lo[i], &h, sizeof h);
        hi[i] = lo[i];
    }
    CAI_CALL_GOTO(cai_allreduce(mesh, CAI_AXIS_DP, lo, lo, (size_t)np, CAI_DTYPE_I64, CAI_RED_MIN), st, done);
    CAI_CALL_GOTO(cai_allreduce(mesh, CAI_AXIS_DP, hi, hi, (size_t)np, CAI_DTYPE_I64, CAI_RED_MAX), st, done);
    int first = -1, differ = 0;
    for (int i = 0; i < np; i++)
        if (lo[i] != hi[i]) {
            if (first < 0) first = i;
            differ++;
        }
    if (first >= 0)
        st = CAI_ERROR(CAI_ERR_INTERNAL,
                       "data-parallel replicas diverged: parameter %s (and %d more of %d) differs between the %d dp "
                       "ranks; every replica must apply the same averaged gradient",
                       cai_registry_param(reg, first)->name, differ - 1, np, cai_mesh_size(mesh, CAI_AXIS_DP));
done:
    if (stage) cai_device_dealloc_staging(dev, stage);
    cai_free(offsets);
    cai_free(lo);
    cai_free(hi);
    return st;
}
