/* Node-shared memory over one axis group (MPI-3 shared windows): each rank
 * of the group maps every member's buffer, so a producer can write straight
 * into a consumer's. What keeps the data moving without MPI progress from
 * the writer (a pipeline stage that is computing): the writer copies, then
 * a small eager message tells the reader. */
#include "cai_config.h"

#include <mpi.h>
#include <stdlib.h>

#include "colossal/cluster.h"

struct cai_shared_mem {
    MPI_Comm node; /* the axis group, ranks as on the axis */
    MPI_Win win;   /* in a lock_all epoch for its life, so cai_shared_mem_sync is valid */
    char **base;   /* per axis rank: its buffer, mapped here */
};

cai_status cai_shared_mem_create(cai_mesh_t *mesh, cai_axis axis, size_t bytes, cai_shared_mem_t **out) {
    CAI_CHECK_ARG(mesh && out, "cai_shared_mem_create: NULL argument");
    *out = NULL;
    MPI_Comm comm = cai_mesh_comm(mesh, axis);
    const int size = cai_mesh_size(mesh, axis), rank = cai_mesh_rank(mesh, axis);
    cai_shared_mem_t *s = NULL;
    cai_status st = cai_calloc((void **)&s, 1, sizeof *s, "shared memory");
    if (st == CAI_OK) st = cai_calloc((void **)&s->base, (size_t)size, sizeof *s->base, "shared memory map");
    MPI_Comm node = MPI_COMM_NULL;
    int local = 0;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        int n = 0;
        MPI_Comm_size(node, &n);
        local = n == size;
    }
    /* every rank goes on to the window, or none does */
    int all = local && st == CAI_OK;
    cai_status agreed = cai_allreduce(mesh, axis, &all, &all, 1, CAI_DTYPE_I32, CAI_RED_MIN);
    if (agreed != CAI_OK || !all) {
        if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
        if (s) cai_free(s->base);
        cai_free(s);
        if (st != CAI_OK) return st;
        if (agreed != CAI_OK) return agreed;
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "shared memory over the %s axis: its %d ranks are not all on one node (or one could not "
                         "allocate its map)",
                         cai_axis_name(axis), size);
    }
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    char *mine = NULL;
    const int rc = MPI_Win_allocate_shared((MPI_Aint)bytes, 1, info, node, &mine, &s->win);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&node);
        cai_free(s->base);
        cai_free(s);
        return CAI_ERROR(CAI_ERR_MPI, "shared memory over the %s axis: MPI_Win_allocate_shared of %zu bytes failed",
                         cai_axis_name(axis), bytes);
    }
    s->node = node;
    for (int r = 0; r < size; r++) {
        MPI_Aint got = 0;
        int disp = 0;
        MPI_Win_shared_query(s->win, r, &got, &disp, &s->base[r]);
    }
    MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win);
    *out = s;
    return CAI_OK;
}

char *cai_shared_mem_ptr(const cai_shared_mem_t *s, int axis_rank) { return s ? s->base[axis_rank] : NULL; }

void cai_shared_mem_sync(cai_shared_mem_t *s) {
    if (s) MPI_Win_sync(s->win);
}

void cai_shared_mem_free(cai_shared_mem_t *s) {
    if (!s) return;
    MPI_Win_unlock_all(s->win);
    MPI_Win_free(&s->win);
    MPI_Comm_free(&s->node);
    cai_free(s->base);
    cai_free(s);
}
