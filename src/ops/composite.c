/* Ops that stand for a sequence of others (norm_linear_fwd,
 * norm_swiglu_fwd): that sequence, through the device's own table, for the
 * CPU backend and for a backend's shapes it does not fuse. */
#include "cai_config.h"

#include "colossal/ops.h"

static cai_status norm_fwd(cai_device_t *dev, cai_tensor *ln, const cai_tensor *inp, const cai_norm_args *norm) {
    if (!norm || !norm->weight) return CAI_ERROR(CAI_ERR_INVALID_ARG, "norm_*_fwd: norm and its weight are required");
    if (norm->rms) return dev->ops->rmsnorm_fwd(dev, ln, NULL, inp, norm->weight, norm->eps);
    return dev->ops->layernorm_fwd(dev, ln, NULL, NULL, inp, norm->weight, norm->bias, norm->eps);
}

cai_status cai_ops_norm_linear_unfused(cai_device_t *dev, cai_tensor *out, cai_tensor *ln, const cai_tensor *inp,
                                       const cai_norm_args *norm, const cai_tensor *weight, const cai_tensor *bias) {
    CAI_CALL(norm_fwd(dev, ln, inp, norm));
    return dev->ops->linear_fwd(dev, out, ln, weight, bias);
}

cai_status cai_ops_norm_swiglu_unfused(cai_device_t *dev, cai_tensor *act, cai_tensor *ln, cai_tensor *gate,
                                       cai_tensor *up, const cai_tensor *inp, const cai_norm_args *norm,
                                       const cai_tensor *gate_w, const cai_tensor *up_w) {
    CAI_CALL(norm_fwd(dev, ln, inp, norm));
    CAI_CALL(dev->ops->linear_fwd(dev, gate, ln, gate_w, NULL));
    CAI_CALL(dev->ops->linear_fwd(dev, up, ln, up_w, NULL));
    return dev->ops->swiglu_fwd(dev, act, gate, up);
}
