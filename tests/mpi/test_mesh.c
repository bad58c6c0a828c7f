/* The mesh under mpiexec: for every layout of this world size and several
 * axis orders, sizes, ranks and groups agree three ways — the mesh (what
 * MPI_Cart_sub built), the pure layout functions, and a brute force over
 * MPI_Cart_coords — and each axis communicator really contains its group. */
#include "cai_config.h"

#include <stdlib.h>

#include "test_mesh_util.h"

static const char *const k_orders[] = {"pp,dp,ep,sp,tp", "tp,sp,ep,dp,pp", "dp,tp,pp,sp,ep"};

/* Which grid positions (in `order`) an axis spans, from the names alone. */
static void spanned_positions(const char *order, cai_axis axis, int span[5]) {
    static const char *const spans[CAI_AXIS_COUNT] = {
        [CAI_AXIS_PP] = "pp",          [CAI_AXIS_DP] = "dp ep",
        [CAI_AXIS_EP] = "ep",          [CAI_AXIS_SP] = "sp",
        [CAI_AXIS_TP] = "tp",          [CAI_AXIS_EDP] = "dp",
        [CAI_AXIS_DP_SP] = "dp ep sp", [CAI_AXIS_WORLD] = "pp dp ep sp tp",
    };
    char buf[64];
    snprintf(buf, sizeof buf, "%s", order);
    int i = 0;
    for (char *tok = strtok(buf, ","); tok && i < 5; tok = strtok(NULL, ","), i++)
        span[i] = strstr(spans[axis], tok) != NULL;
}

static void check_mesh(cai_mesh_t *m, const cai_layout *l, MPI_Comm world) {
    int me, n;
    MPI_Comm_rank(world, &me);
    MPI_Comm_size(world, &n);
    int coords[CAI_AXIS_COUNT];
    CK_CAI(cai_layout_coords(l, me, coords));
    MPI_Comm cart = cai_mesh_comm(m, CAI_AXIS_WORLD);
    int topo;
    MPI_Topo_test(cart, &topo);
    ck_assert_int_eq(topo, MPI_CART);
    int *want = malloc((size_t)n * sizeof *want), *pure = malloc((size_t)n * sizeof *pure);
    for (int a = 0; a < CAI_AXIS_COUNT; a++) {
        int size = cai_mesh_size(m, (cai_axis)a);
        ck_assert_int_eq(size, cai_layout_axis_size(l, (cai_axis)a));
        ck_assert_int_eq(cai_mesh_rank(m, (cai_axis)a), coords[a]);
        /* Brute force: ranks whose Cartesian coordinates agree with ours on
         * every dimension the axis does not span, in rank order. */
        int span[5], cr[5], cs[5], k = 0;
        spanned_positions(l->order, (cai_axis)a, span);
        MPI_Cart_coords(cart, me, 5, cr);
        for (int s = 0; s < n; s++) {
            MPI_Cart_coords(cart, s, 5, cs);
            int same = 1;
            for (int i = 0; i < 5; i++)
                if (!span[i] && cs[i] != cr[i]) same = 0;
            if (same) want[k++] = s;
        }
        ck_assert_int_eq(k, size);
        CK_CAI(cai_layout_group(l, (cai_axis)a, me, pure));
        const int *got = cai_mesh_group(m, (cai_axis)a);
        for (int i = 0; i < size; i++) {
            ck_assert_msg(got[i] == want[i] && pure[i] == want[i],
                          "order %s axis %s rank %d member %d: mesh %d, layout %d, brute force %d", l->order,
                          cai_axis_name((cai_axis)a), me, i, got[i], pure[i], want[i]);
        }
        ck_assert_int_eq(want[coords[a]], me);
        /* The communicator holds exactly these ranks. */
        MPI_Comm c = cai_mesh_comm(m, (cai_axis)a);
        long sum = 0, expect = 0;
        long mine = me;
        MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, c);
        for (int i = 0; i < size; i++) expect += want[i];
        ck_assert_int_eq(sum, expect);
    }
    free(want);
    free(pure);
}

/* All layouts (pp, edp, ep, sp, tp) of w ranks. */
static int all_layouts(int w, cai_layout *out, int max) {
    int n = 0;
    for (int pp = 1; pp <= w; pp++)
        for (int edp = 1; edp <= w; edp++)
            for (int ep = 1; ep <= w; ep++)
                for (int sp = 1; sp <= w; sp++) {
                    long p = (long)pp * edp * ep * sp;
                    if (p > w || w % p || n >= max) continue;
                    out[n++] = (cai_layout){pp, edp * ep, ep, sp, (int)(w / p), NULL};
                }
    return n;
}

START_TEST(every_layout_and_order) {
    cai_layout ls[64];
    int n = all_layouts(g_world_size, ls, 64);
    ck_assert_int_gt(n, 0);
    for (int i = 0; i < n; i++) {
        for (int o = 0; o < 3; o++) {
            cai_layout l = ls[i];
            l.order = k_orders[(i + o) % 3];
            cai_mesh_config cfg = test_mesh_config(l.pp, l.dp, l.ep, l.sp, l.tp, l.order);
            cai_mesh_t *m = NULL;
            CK_CAI(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
            ck_assert_str_eq(cai_mesh_layout(m)->order, l.order);
            check_mesh(m, &l, MPI_COMM_WORLD);
            cai_mesh_free(m);
        }
    }
}
END_TEST

START_TEST(mesh_over_a_sub_communicator) {
    /* "World" is whatever communicator the mesh is built over. */
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, g_world_rank % 2, g_world_rank, &half);
    int hn;
    MPI_Comm_size(half, &hn);
    cai_mesh_config cfg = test_mesh_config(1, hn, 1, 1, 1, "tp,sp,pp,ep,dp");
    if (hn % 2 == 0) cfg.layout = (cai_layout){1, hn / 2, 1, 1, 2, NULL};
    cai_mesh_t *m = NULL;
    CK_CAI(cai_mesh_init(&m, half, &cfg));
    check_mesh(m, cai_mesh_layout(m), half);
    cai_mesh_free(m);
    MPI_Comm_free(&half);
}
END_TEST

START_TEST(bad_layout_fails_everywhere_before_allocating) {
    cai_mesh_config cfg = test_mesh_config(1, 1, 1, 1, g_world_size + 1, NULL);
    cai_mesh_t *m = (cai_mesh_t *)&cfg; /* must be reset to NULL */
    cai_error_clear();
    ck_assert_int_eq(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg), CAI_ERR_LAYOUT);
    ck_assert_ptr_null(m);
    char want[96];
    snprintf(want, sizeof want, "world of %d ranks", g_world_size);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), want));
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "layouts that fit"));
    cfg = test_mesh_config(1, g_world_size, 1, 1, 1, "pp,dp,sp,tp");
    ck_assert_int_eq(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg), CAI_ERR_LAYOUT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "missing: ep"));
    cfg = test_mesh_config(1, g_world_size, 1, 1, 1, NULL);
    cfg.nccl_overlap_ctas = -1;
    ck_assert_int_eq(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "nccl_overlap_ctas is -1"));
    cai_error_clear();
    /* Nothing is left half-built: the next mesh works, and marking host
     * collectives as overlapping compute changes nothing for them. */
    cfg.nccl_overlap_ctas = 4;
    CK_CAI(cai_mesh_init(&m, MPI_COMM_WORLD, &cfg));
    ck_assert_int_eq(cai_mesh_size(m, CAI_AXIS_DP), g_world_size);
    int one = 1, sum = 0;
    cai_mesh_overlap_compute(m, 1);
    CK_CAI(cai_allreduce(m, CAI_AXIS_DP, &one, &sum, 1, CAI_DTYPE_I32, CAI_RED_SUM));
    cai_mesh_overlap_compute(m, 0);
    ck_assert_int_eq(sum, g_world_size);
    cai_mesh_free(m);
}
END_TEST

int main(int argc, char **argv) {
    const TTest *tests[] = {every_layout_and_order, mesh_over_a_sub_communicator,
                            bad_layout_fails_everywhere_before_allocating};
    return test_mpi_main(argc, argv, "mesh", tests, TEST_COUNT(tests));
}
