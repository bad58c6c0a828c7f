/* CUDA backend: device graphs. Recording is stream capture of the device's
 * stream (thread-local mode: other threads' CUDA calls are unaffected);
 * a graph is instantiated once and launched on the same stream. The ops
 * recorded must not synchronise or allocate (cuBLASLt's heuristic and
 * autotuning answers are cached per shape: a caller runs a shape once
 * before recording it). */
#include "cai_config.h"
#include "cuda_internal.h"

static cai_status graph_error(cudaError_t e, const char *what) {
    return CAI_ERROR(CAI_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

CUDA_OP(graph_begin)(cai_device_t *dev) {
    CAI_CALL(cai_cuda_enter(dev, "graph_begin"));
    cudaError_t e = cudaStreamBeginCapture(cai_cuda_of(dev)->stream, cudaStreamCaptureModeThreadLocal);
    return e == cudaSuccess ? CAI_OK : graph_error(e, "graph_begin: cudaStreamBeginCapture");
}

CUDA_OP(graph_end)(cai_device_t *dev, void **graph) {
    CAI_CALL(cai_cuda_enter(dev, "graph_end"));
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cai_cuda_of(dev)->stream, &g);
    if (e != cudaSuccess || !graph) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError(); /* an invalidated capture leaves its error behind */
        return e == cudaSuccess ? CAI_OK : graph_error(e, "graph_end: cudaStreamEndCapture");
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return graph_error(e, "graph_end: cudaGraphInstantiate");
    *graph = x;
    return CAI_OK;
}

CUDA_OP(graph_launch)(cai_device_t *dev, void *graph) {
    CAI_CALL(cai_cuda_enter(dev, "graph_launch"));
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph, cai_cuda_of(dev)->stream);
    return e == cudaSuccess ? CAI_OK : graph_error(e, "graph_launch: cudaGraphLaunch");
}

void cai_cuda_graph_free(cai_device_t *dev, void *graph) {
    (void)dev;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}
