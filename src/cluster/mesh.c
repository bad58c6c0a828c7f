/* The mesh: one MPI_Cart_create grid over the world and one MPI_Cart_sub
 * communicator per axis, plus the watchdog window and the reduction ops for
 * half-precision types. */
#include "cai_config.h"

#include <limits.h>
#include <mpi.h>
#include <string.h>
#if HAVE_MPI_EXT_H
#include <mpi-ext.h>
#endif

#include "cluster_internal.h"

void cai_mesh_config_init(cai_mesh_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->layout = (cai_layout){1, 1, 1, 1, 1, NULL};
    cfg->watchdog_timeout_s = 300.0;
    cfg->watchdog_abort = 1;
    cfg->device_comm = CAI_DEVICE_COMM_AUTO;
}

int cai_mpi_cuda_aware(void) {
    /* Open MPI's extension header defines the macro (0 or 1) whenever it
     * declares the query; the build-time value can differ from the library
     * loaded at run time, so always ask the library. */
#if defined(MPIX_CUDA_AWARE_SUPPORT)
    return MPIX_Query_cuda_support();
#else
    return 0;
#endif
}

/* User reduction functions for bf16/f16: each pair is combined in fp32 and
 * rounded back to nearest even. */
#define HALF_OP(name, to_f, from_f, combine)                              \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt) { \
        (void)dt;                                                         \
        const uint16_t *a = in;                                           \
        uint16_t *b = inout;                                              \
        for (int i = 0; i < *len; i++) {                                  \
            float x = to_f(a[i]), y = to_f(b[i]);                         \
            b[i] = from_f(combine);                                       \
        }                                                                 \
    }
/* max/min propagate NaN: an overflowed gradient must not vanish in a max. */
#define COMB_SUM (x + y)
#define COMB_MAX ((x != x || y != y) ? x + y : (x > y ? x : y))
#define COMB_MIN ((x != x || y != y) ? x + y : (x < y ? x : y))
HALF_OP(bf16_sum, cai_cl_bf16_to_f32, cai_cl_f32_to_bf16, COMB_SUM)
HALF_OP(bf16_max, cai_cl_bf16_to_f32, cai_cl_f32_to_bf16, COMB_MAX)
HALF_OP(bf16_min, cai_cl_bf16_to_f32, cai_cl_f32_to_bf16, COMB_MIN)
HALF_OP(f16_sum, cai_cl_f16_to_f32, cai_cl_f32_to_f16, COMB_SUM)
HALF_OP(f16_max, cai_cl_f16_to_f32, cai_cl_f32_to_f16, COMB_MAX)
HALF_OP(f16_min, cai_cl_f16_to_f32, cai_cl_f32_to_f16, COMB_MIN)

static cai_status create_half_ops(cai_mesh_t *m) {
    MPI_User_function *fns[2][3] = {{bf16_sum, bf16_max, bf16_min}, {f16_sum, f16_max, f16_min}};
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 3; o++) CAI_CALL_MPI(MPI_Op_create(fns[t][o], 1, &m->half_ops[t][o]));
    return CAI_OK;
}

static cai_status build_axes(cai_mesh_t *m, MPI_Comm world) {
    int periods[CAI_GRID_N] = {0};
    CAI_CALL_MPI(MPI_Cart_create(world, CAI_GRID_N, m->grid_dims, periods, 0, &m->cart));
    /* Report MPI failures on our communicators as status codes with context
     * instead of the default abort; sub-communicators inherit this. */
    CAI_CALL_MPI(MPI_Comm_set_errhandler(m->cart, MPI_ERRORS_RETURN));
    for (int a = 0; a < CAI_AXIS_COUNT; a++) {
        int remain[CAI_GRID_N];
        unsigned mask = cai_axis_grid_mask((cai_axis)a);
        for (int i = 0; i < CAI_GRID_N; i++) remain[i] = (mask >> m->grid_order[i]) & 1u;
        CAI_CALL_MPI(MPI_Cart_sub(m->cart, remain, &m->comm[a]));
        CAI_CALL_MPI(MPI_Comm_size(m->comm[a], &m->size[a]));
        CAI_CALL_MPI(MPI_Comm_rank(m->comm[a], &m->rank[a]));
    }
    return CAI_OK;
}

/* Records who is in each group as MPI built it and checks it against the
 * pure layout arithmetic that colossal-check and offset code rely on. */
static cai_status record_groups(cai_mesh_t *m) {
    int coords[CAI_AXIS_COUNT];
    CAI_CALL(cai_layout_coords(&m->layout, m->world_rank, coords));
    for (int a = 0; a < CAI_AXIS_COUNT; a++) {
        int n = m->size[a];
        int expect_n = cai_layout_axis_size(&m->layout, (cai_axis)a);
        CAI_CALL(cai_malloc((void **)&m->group[a], (size_t)n * sizeof(int), "mesh group"));
        CAI_CALL_MPI(MPI_Allgather(&m->world_rank, 1, MPI_INT, m->group[a], 1, MPI_INT, m->comm[a]));
        int *expect = NULL;
        CAI_CALL(cai_malloc((void **)&expect, (size_t)expect_n * sizeof(int), "layout group"));
        cai_status st = cai_layout_group(&m->layout, (cai_axis)a, m->world_rank, expect);
        int same = st == CAI_OK && n == expect_n && coords[a] == m->rank[a] &&
                   memcmp(expect, m->group[a], (size_t)n * sizeof(int)) == 0;
        cai_free(expect);
        CAI_CALL(st);
        if (!same)
            return CAI_ERROR(CAI_ERR_INTERNAL,
                             "axis %s: MPI_Cart_sub gave rank %d of %d a group that differs from the layout "
                             "arithmetic (axis rank %d, expected %d); this MPI orders Cartesian sub-grids differently",
                             cai_axis_name((cai_axis)a), m->world_rank, n, m->rank[a], coords[a]);
    }
    return CAI_OK;
}

cai_status cai_mesh_init(cai_mesh_t **out, MPI_Comm world, const cai_mesh_config *cfg) {
    CAI_CHECK_ARG(out && cfg, "cai_mesh_init: NULL argument");
    *out = NULL;
    int world_size, world_rank;
    CAI_CALL_MPI(MPI_Comm_size(world, &world_size));
    CAI_CALL_MPI(MPI_Comm_rank(world, &world_rank));
    CAI_CALL(cai_layout_validate(world_size, &cfg->layout, NULL));
    CAI_CHECK_ARG(cfg->watchdog_timeout_s >= 0, "watchdog timeout %g s must be >= 0 (0 disables it)",
                  cfg->watchdog_timeout_s);
    CAI_CHECK_ARG(cfg->device_comm >= CAI_DEVICE_COMM_AUTO && cfg->device_comm <= CAI_DEVICE_COMM_STAGE,
                  "device_comm %d is not a cai_device_comm", (int)cfg->device_comm);
    CAI_CHECK_ARG(cfg->nccl_overlap_ctas >= 0, "nccl_overlap_ctas is %d; expected 0 (off) or a number of CTAs",
                  cfg->nccl_overlap_ctas);
    const char *order = cfg->layout.order && *cfg->layout.order ? cfg->layout.order : "pp,dp,ep,sp,tp";
    CAI_CHECK_ARG(strlen(order) < sizeof((cai_mesh_t *)0)->order, "mesh order '%s' is too long", order);

    cai_mesh_t *m = NULL;
    CAI_CALL(cai_calloc((void **)&m, 1, sizeof *m, "mesh"));
    m->cart = MPI_COMM_NULL;
    for (int a = 0; a < CAI_AXIS_COUNT; a++) m->comm[a] = MPI_COMM_NULL;
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 3; o++) m->half_ops[t][o] = MPI_OP_NULL;
    m->win = MPI_WIN_NULL;
    m->layout = cfg->layout;
    snprintf(m->order, sizeof m->order, "%s", order);
    m->layout.order = m->order;
    m->world_rank = world_rank;
    m->world_size = world_size;
    m->timeout_s = cfg->watchdog_timeout_s;
    m->abort_on_timeout = cfg->watchdog_abort;
    m->device_comm = cfg->device_comm;
    m->overlap_ctas = cfg->nccl_overlap_ctas;
    m->max_chunk = INT_MAX;

    cai_status st;
    CAI_CALL_GOTO(cai_layout_grid(&m->layout, m->grid_order, m->grid_dims), st, fail);
    CAI_CALL_GOTO(build_axes(m, world), st, fail);
    CAI_CALL_GOTO(record_groups(m), st, fail);
    CAI_CALL_GOTO(create_half_ops(m), st, fail);
    CAI_CALL_GOTO(cai_wd_init(m), st, fail);
    m->ready = 1;
    *out = m;
    return CAI_OK;
fail:
    cai_mesh_free(m);
    return st;
}

void cai_mesh_free(cai_mesh_t *m) {
    if (!m) return;
    cai_cl_nccl_free(m);
    cai_wd_free(m);
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 3; o++)
            if (m->half_ops[t][o] != MPI_OP_NULL) MPI_Op_free(&m->half_ops[t][o]);
    for (int a = 0; a < CAI_AXIS_COUNT; a++) {
        if (m->comm[a] != MPI_COMM_NULL) MPI_Comm_free(&m->comm[a]);
        cai_free(m->group[a]);
    }
    if (m->cart != MPI_COMM_NULL) MPI_Comm_free(&m->cart);
    cai_free(m);
}

const cai_layout *cai_mesh_layout(const cai_mesh_t *m) { return &m->layout; }

static int axis_ok(cai_axis a) { return (int)a >= 0 && a < CAI_AXIS_COUNT; }

int cai_mesh_size(const cai_mesh_t *m, cai_axis axis) { return axis_ok(axis) ? m->size[axis] : 0; }
int cai_mesh_rank(const cai_mesh_t *m, cai_axis axis) { return axis_ok(axis) ? m->rank[axis] : -1; }
MPI_Comm cai_mesh_comm(const cai_mesh_t *m, cai_axis axis) { return axis_ok(axis) ? m->comm[axis] : MPI_COMM_NULL; }
const int *cai_mesh_group(const cai_mesh_t *m, cai_axis axis) { return axis_ok(axis) ? m->group[axis] : NULL; }

void cai_mesh_set_max_chunk(cai_mesh_t *m, size_t elements) {
    m->max_chunk = elements == 0 || elements > INT_MAX ? INT_MAX : elements;
}
