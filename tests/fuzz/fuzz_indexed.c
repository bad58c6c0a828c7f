/* libFuzzer target: the Megatron indexed dataset reader (cai_indexed_open,
 * src/data/indexed.c). Input: one byte choosing vocab_size, then the .idx
 * bytes, the separator "\n%%\n", then the .bin bytes. An opened dataset is
 * walked: every sequence read whole, every document start checked. */
#include "colossal/data.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const int64_t vocabs[8] = {0, 1, 2, 256, 50257, 65536, 65537, INT64_C(1) << 40};
    if (size < 1) return 0;
    int64_t vocab = vocabs[data[0] & 7];
    size_t idx_len, bin_len;
    const uint8_t *bin;
    fuzz_split(data + 1, size - 1, &idx_len, &bin, &bin_len);
    fuzz_file(0, "ds.idx", data + 1, idx_len);
    fuzz_file(1, "ds.bin", bin, bin_len);
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s/ds", fuzz_dir);
    cai_indexed_dataset_t *ds = NULL;
    if (cai_indexed_open(&ds, prefix, vocab) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    int64_t n_seq = cai_indexed_num_sequences(ds), n_doc = cai_indexed_num_documents(ds);
    if (n_seq < 0 || n_doc < 0) abort();
    int64_t total = 0;
    for (int64_t i = 0; i < n_seq; i++) {
        int32_t len = cai_indexed_sequence_length(ds, i);
        if (len < 0) abort();
        total += len;
        if (len > (1 << 16)) continue;
        int32_t *buf = malloc(((size_t)len + 1) * sizeof *buf);
        if (!buf) abort();
        if (cai_indexed_read(ds, i, 0, len, buf) == CAI_OK) {
            for (int32_t k = 0; vocab > 0 && k < len; k++)
                if (buf[k] < 0 || buf[k] >= vocab) abort();
        } else {
            cai_error_clear(); /* an int64 token beyond int32 */
        }
        /* out of range requests are errors, never reads */
        if (cai_indexed_read(ds, i, 0, (int64_t)len + 1, buf) == CAI_OK) abort();
        cai_error_clear();
        free(buf);
    }
    if (total != cai_indexed_num_tokens(ds)) abort();
    int64_t prev = 0;
    for (int64_t d = 0; d <= n_doc; d++) {
        int64_t s = cai_indexed_document_start(ds, d);
        if (s < prev || s > n_seq) abort();
        prev = s;
    }
    cai_indexed_free(ds);
    return 0;
}
