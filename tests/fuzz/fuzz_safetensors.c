/* libFuzzer target: the safetensors reader (src/ckpt/safetensors.c) on an
 * arbitrary file: header length, JSON header, entries, metadata, tiling. An
 * opened file is walked completely and every tensor of a colossal dtype is
 * read back through cai_safetensors_read. */
#include "colossal/ckpt.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, "model.safetensors", data, size);
    cai_safetensors_t *st = NULL;
    if (cai_safetensors_open(&st, path) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    for (int i = 0; i < cai_safetensors_meta_count(st); i++) {
        const char *k, *v;
        cai_safetensors_meta_at(st, i, &k, &v);
        if (!k || !v || cai_safetensors_meta(st, k) == NULL) abort();
    }
    for (int i = 0; i < cai_safetensors_count(st); i++) {
        const cai_st_entry *e = cai_safetensors_entry(st, i);
        if (!e || cai_safetensors_find(st, e->name) == NULL) abort();
        if (e->end < e->begin || e->end - e->begin != e->numel * e->elem_size) abort();
        if (e->dtype == CAI_DTYPE_COUNT || e->end - e->begin > (1u << 20)) continue;
        void *dst = malloc(e->end - e->begin + 1);
        if (!dst) abort();
        if (cai_safetensors_read(st, e->name, e->dtype, e->ndim, e->shape, dst) != CAI_OK) abort();
        free(dst);
    }
    cai_safetensors_close(st);
    return 0;
}
