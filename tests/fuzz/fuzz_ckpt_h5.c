/* libFuzzer target: the HDF5 checkpoint metadata reader (cai_ckpt_open's
 * walk, src/ckpt/checkpoint_file.c, checkpoint.c, h5io.c) on an arbitrary
 * file: format attribute, metadata attributes, dataset list, root
 * attributes. An opened checkpoint has its entries and attributes walked
 * and its small tensors read. The input reaches HDF5 as a file image
 * (ck_file_open_image: the same checks, no file written and read back per
 * input). A crash inside libhdf5 itself is HDF5's bug: tests/fuzz/triage.sh
 * tells those apart, and the fuzzing goes on past them (lane.sh). */
#include "cai_config.h"

#include <hdf5.h>
#include <mpi.h>
#include <sanitizer/lsan_interface.h>

#include "ckpt/checkpoint_internal.h"
#include "colossal/ckpt.h"
#include "fuzz_util.h"

/* A leak report names the allocator and its direct caller only: slow
 * (DWARF) unwinding of every malloc's full stack was most of the time per
 * input, and with two frames the suppression below matches exactly the
 * memory libhdf5 allocated itself. HDF5 1.10 leaks object headers, virtual
 * dataset layouts and dataspaces when it meets corrupt metadata (found by
 * this target); colossal never owns memory libhdf5 allocates (it reads
 * attributes into its own buffers), and an hid_t it forgot to close stays
 * reachable from HDF5's ID tables, so no colossal leak hides behind it.
 * ASAN_OPTIONS in the environment override these (run.sh and campaign.sh
 * set neither key; a deeper malloc_context_size would widen the
 * suppression to colossal's allocations made inside HDF5 callbacks). */
const char *__asan_default_options(void) { return "fast_unwind_on_malloc=1:malloc_context_size=2"; }
const char *__lsan_default_suppressions(void) { return "leak:libhdf5\n"; }

/* What MPI allocates while it starts and stops is its own business. */
static void finalize(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    __lsan_disable();
    MPI_Finalize();
    __lsan_enable();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    /* Open MPI's handlers of SIGSEGV, SIGBUS, SIGFPE and SIGABRT would
     * replace ASan's and keep libFuzzer from installing its own (no crash
     * input saved, no report to triage). */
    setenv("OMPI_MCA_opal_signal", "", 0);
    __lsan_disable();
    MPI_Init(NULL, NULL);
    __lsan_enable();
    /* Every file open allocates a metadata cache of over 512 KiB, above
     * ASan's largest size class: mapped, faulted in and unmapped (a TLB
     * shootdown across MPI's threads) per input, unless HDF5's free list of
     * regular objects may keep it. */
    H5set_free_list_limits(16 << 20, 4 << 20, -1, -1, -1, -1);
    atexit(finalize);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cai_ckpt_file_t *f = NULL;
    if (ck_file_open_image(&f, "fuzz.h5", data, size) != CAI_OK) {
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
