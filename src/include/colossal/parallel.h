/* Parallelism over the mesh axes, on top of the model's flat buffers.
 *
 * Data parallelism (src/parallel/dp.c): every dp rank holds a full replica
 * of its (pp, tp) shard of the parameters, runs its own slice of the global
 * batch and averages the gradients over the dp axis before the optimizer
 * step, so every replica takes the same update and stays bitwise equal to
 * the others. This is the plain form (one all-reduce of the whole flat
 * gradient buffer after the last microbatch); bucketing that overlaps the
 * backward and ZeRO sharding build on the same flat layout. */
#ifndef COLOSSAL_PARALLEL_H
#define COLOSSAL_PARALLEL_H

#include "colossal/base.h"
#include "colossal/cluster.h"
#include "colossal/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Replace every local gradient of `m` by its mean over the dp axis (in
 * place, the whole flat F32 buffer in one all-reduce; host or device
 * memory). Call it once per step, after the last microbatch's backward:
 * with microbatch gradients already weighted 1/n_micro the result is the
 * gradient of the global-batch mean loss when every rank's microbatches hold
 * the same number of target tokens. dp = 1 returns at once. Collective over
 * CAI_AXIS_DP. */
cai_status cai_dp_allreduce_grads(cai_mesh_t *mesh, cai_model_t *m);

/* Check that every dp replica holds bitwise the same F32 master weights:
 * a 64-bit hash per held parameter, compared by MIN/MAX all-reduces. On a
 * difference every rank returns CAI_ERR_INTERNAL naming the first parameter
 * that differs (in registration order) and how many parameters differ.
 * Cost: one pass over the parameters plus two all-reduces of one integer per
 * parameter. Collective over CAI_AXIS_DP. */
cai_status cai_dp_check_replicas(cai_mesh_t *mesh, cai_model_t *m);

#ifdef __cplusplus
}
#endif
#endif
