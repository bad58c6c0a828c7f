/* Entry points of the CUDA backend that src/tensor/device.c calls. They
 * exist in every build (kernels/cuda_device.c): without CUDA they fail with
 * CAI_ERR_UNSUPPORTED, so device.c needs no #if. No CUDA types here. */
#ifndef CAI_CUDA_BACKEND_H
#define CAI_CUDA_BACKEND_H

#include "colossal/ops.h"
#include "colossal/tensor.h"

/* Create the device for GPU `ordinal`: its stream, cuBLASLt handle and
 * workspaces (the only device allocations the backend makes itself). Fails
 * with CAI_ERR_UNSUPPORTED when the build has no CUDA or no GPU is visible,
 * CAI_ERR_INVALID_ARG for an ordinal out of range. Not collective. */
cai_status cai_cuda_device_init(cai_device_t **out, int ordinal);
/* Waits for the device's work, then releases what init made. */
void cai_cuda_device_free(cai_device_t *dev);
/* The CUDA op table; NULL in builds without CUDA. */
const cai_ops *cai_ops_cuda(void);

/* The attention kernels a process uses (kernels/cuda_attention.c; CUDA
 * builds only): AUTO, CUDNN and FLASH are the choices of the CAI_CUDA_ATTN
 * knob, in the knob's order; TC (the WMMA kernels where flash would apply)
 * and SIMT (the f32 CUDA-core kernels for every dtype) exist for the GPU
 * tests, which reach every kernel in one process through
 * cai_cuda_attn_force. Not thread-safe against running attention calls. */
typedef enum {
    CAI_CUDA_ATTN_AUTO,
    CAI_CUDA_ATTN_CUDNN,
    CAI_CUDA_ATTN_FLASH,
    CAI_CUDA_ATTN_TC,
    CAI_CUDA_ATTN_SIMT
} cai_cuda_attn_path;
void cai_cuda_attn_force(cai_cuda_attn_path path);

#endif
