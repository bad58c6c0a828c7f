/* libFuzzer target: the HDF5 checkpoint metadata reader (cai_ckpt_open,
 * src/ckpt/checkpoint_file.c, h5io.c) on an arbitrary file, opened over
 * MPI_COMM_SELF: format attribute, metadata attributes, dataset list, root
 * attributes. An opened checkpoint has its entries and attributes walked
 * and its small tensors read. A crash inside libhdf5 itself (not in our
 * frames) is HDF5's bug, recorded separately in tests/fuzz/README.md. */
#include <mpi.h>

#include "colossal/ckpt.h"
#include "fuzz_util.h"

static void finalize(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    MPI_Init(NULL, NULL);
    atexit(finalize);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, "ckpt.h5", data, size);
    cai_ckpt_file_t *f = NULL;
    if (cai_ckpt_open(&f, MPI_COMM_SELF, path) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    for (int i = 0; i < cai_ckpt_attr_count(f); i++) {
        const char *k, *v;
        cai_ckpt_attr_at(f, i, &k, &v);
        if (!k || !v) abort();
    }
    for (int i = 0; i < cai_ckpt_count(f); i++) {
        const cai_ckpt_entry *e = cai_ckpt_entry_at(f, i);
        if (!e || cai_ckpt_find(f, e->name) != e) abort();
        if (e->dtype == CAI_DTYPE_COUNT || e->numel > 4096) continue;
        float *dst = malloc((e->numel + 1) * sizeof *dst);
        if (!dst) abort();
        if (cai_ckpt_read(f, e->name, CAI_DTYPE_F32, dst) != CAI_OK) cai_error_clear();
        free(dst);
    }
    cai_ckpt_close(f);
    return 0;
}
