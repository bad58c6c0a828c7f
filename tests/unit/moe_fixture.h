/* One MoE sublayer set up the way the model will: its parameters
 * registered (layer 0 of a one-layer registry), a flat parameter buffer
 * initialised by the registry's layout-invariant init and a gradient
 * buffer of the same layout, views of this rank's shards, the context,
 * the activations carved from an arena, and [N, C] input / output /
 * gradient tensors. Shared by the unit test, the PyTorch parity driver
 * and the MPI test (tests/unit/test_moe.c, tests/parity/moe_driver.c,
 * tests/mpi/test_moe.c). */
#ifndef MOE_FIXTURE_H
#define MOE_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "colossal/moe.h"

typedef struct {
    cai_registry_t *reg;
    cai_rank_view view;
    size_t n_flat;
    float *params, *grads; /* flat local buffers (registry layout, 16-element alignment) */
    cai_moe_mlp *pe, *ge;  /* n_local experts' views */
    cai_moe_params p, g;
    cai_moe_ctx cx;
    cai_arena_t arena;
    cai_moe_acts acts;
    float *buf; /* x, y, dy, dx: N * C each */
    cai_tensor x, y, dy, dx;
} moe_fix;

#define MOE_FIX_ALIGN 16

static inline void moe_fix_free(moe_fix *f) {
    cai_moe_acts_free(&f->acts);
    if (f->arena.base) cai_device_arena_free(f->cx.dev, &f->arena);
    cai_registry_free(f->reg);
    free(f->params);
    free(f->grads);
    free(f->pe);
    free(f->ge);
    free(f->buf);
    memset(f, 0, sizeof *f);
}

/* Weights: the registry init with `seed` and std `std` (the router's rows
 * then spread its logits), x normal from (seed, stream) */
static inline cai_status moe_fix_init(moe_fix *f, cai_device_t *dev, const cai_moe_config *cfg, int64_t N, int64_t C,
                                      const cai_moe_exchange *ex, uint64_t seed, float std, uint64_t x_stream) {
    memset(f, 0, sizeof *f);
    cai_registry_options ro = {1};
    CAI_CALL(cai_registry_init(&f->reg, &ro));
    CAI_CALL(cai_moe_register_params(f->reg, 0, cfg, C, std));
    f->view = cai_rank_view_single();
    if (ex) {
        f->view.ep_size = ex->ep_size;
        f->view.ep_rank = ex->ep_rank;
    }
    CAI_CALL(cai_moe_ctx_init(&f->cx, dev, cfg, N, C, CAI_DTYPE_F32, ex));
    CAI_CALL(cai_registry_local_layout(f->reg, &f->view, MOE_FIX_ALIGN, NULL, &f->n_flat));
    f->params = calloc(f->n_flat + 1, sizeof(float));
    f->grads = calloc(f->n_flat + 1, sizeof(float));
    f->pe = calloc((size_t)f->cx.n_local, sizeof *f->pe);
    f->ge = calloc((size_t)f->cx.n_local, sizeof *f->ge);
    f->buf = calloc((size_t)(4 * N * C), sizeof(float));
    if (!f->params || !f->grads || !f->pe || !f->ge || !f->buf)
        return CAI_ERROR(CAI_ERR_NOMEM, "moe fixture: out of memory");
    CAI_CALL(cai_registry_init_flat(f->reg, &f->view, seed, MOE_FIX_ALIGN, f->params, f->n_flat));
    CAI_CALL(cai_moe_params_view(f->reg, &f->view, MOE_FIX_ALIGN, 0, cfg, dev, f->params, &f->p, f->pe));
    CAI_CALL(cai_moe_params_view(f->reg, &f->view, MOE_FIX_ALIGN, 0, cfg, dev, f->grads, &f->g, f->ge));
    CAI_CALL(cai_device_arena_init(dev, &f->arena, cai_moe_acts_bytes(&f->cx) + 4096, "moe acts"));
    CAI_CALL(cai_moe_acts_carve(&f->cx, &f->arena, &f->acts));
    f->x = cai_tensor_2d(dev, f->buf, CAI_DTYPE_F32, N, C);
    f->y = cai_tensor_2d(dev, f->buf + N * C, CAI_DTYPE_F32, N, C);
    f->dy = cai_tensor_2d(dev, f->buf + 2 * N * C, CAI_DTYPE_F32, N, C);
    f->dx = cai_tensor_2d(dev, f->buf + 3 * N * C, CAI_DTYPE_F32, N, C);
    float *x = f->x.data;
    for (int64_t i = 0; i < N * C; i++) x[i] = cai_rng_normal(seed, x_stream, (uint64_t)i);
    return CAI_OK;
}

/* dy = normal from (seed, stream). */
static inline void moe_fix_cotangent(moe_fix *f, uint64_t seed, uint64_t stream) {
    float *d = f->dy.data;
    for (int64_t i = 0; i < cai_tensor_numel(&f->dy); i++) d[i] = cai_rng_normal(seed, stream, (uint64_t)i);
}

/* Forward, then the objective <y, dy> + aux + z in double. */
static inline cai_status moe_fix_objective(moe_fix *f, double *obj) {
    CAI_CALL(cai_moe_fwd(&f->cx, &f->p, &f->acts, &f->x, &f->y));
    const float *y = f->y.data, *d = f->dy.data;
    double s = 0.0;
    for (int64_t i = 0; i < cai_tensor_numel(&f->y); i++) s += (double)y[i] * d[i];
    *obj = s + cai_moe_loss(&f->cx, &f->acts);
    return CAI_OK;
}

/* Gradients of the objective: zeroed, then forward and backward. */
static inline cai_status moe_fix_grads(moe_fix *f, double *obj) {
    memset(f->grads, 0, f->n_flat * sizeof(float));
    CAI_CALL(moe_fix_objective(f, obj));
    return cai_moe_bwd(&f->cx, &f->p, &f->g, &f->acts, &f->x, &f->dy, &f->dx, 1.0f);
}

#endif
