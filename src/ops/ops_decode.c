/* decode_stack_fwd as the ops it is defined by: the CPU backend's
 * implementation, and every backend's path for what its fused form does not
 * take (colossal/ops.h). */
#include "ops_internal.h"

cai_status cai_ops_decode_stack_composed(cai_device_t *dev, const cai_decode_stack *st) {
    const cai_ops *ops = dev->ops;
    if (!st || (st->n_layers > 0 && !st->layers))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "decode_stack_fwd: %s", st ? "layers is NULL" : "no stack");
    for (int64_t l = 0; l < st->n_layers; l++) {
        const cai_decode_layer *y = &st->layers[l];
        CAI_CALL(ops->rmsnorm_fwd(dev, st->ln, st->rstd, st->x, y->ln1_w, st->eps));
        CAI_CALL(ops->linear_fwd(dev, st->qkv, st->ln, y->qkv_w, NULL));
        CAI_CALL(ops->rope_kv_cache_write(dev, st->qk, y->k_cache, y->v_cache, st->v, st->slots, st->cos, st->sin,
                                          st->positions));
        CAI_CALL(ops->paged_attention(dev, st->att_heads, st->q, y->k_cache, y->v_cache, st->block_tables, st->q_start,
                                      st->ctx_len, st->max_ctx, 0.0f, st->workspace, st->workspace_bytes));
        CAI_CALL(ops->linear_residual_fwd(dev, st->x, st->att, y->proj_w, NULL, st->x));
        CAI_CALL(ops->rmsnorm_fwd(dev, st->ln, st->rstd, st->x, y->ln2_w, st->eps));
        CAI_CALL(ops->linear_swiglu_fwd(dev, st->act, st->gate, st->up, st->ln, y->gate_w, y->up_w));
        CAI_CALL(ops->linear_residual_fwd(dev, st->x, st->act, y->down_w, NULL, st->x));
    }
    return CAI_OK;
}
