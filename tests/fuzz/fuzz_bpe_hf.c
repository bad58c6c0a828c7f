/* libFuzzer target: the Hugging Face tokenizer.json (cai_bpe_load_hf,
 * src/data/bpe_io.c) on an arbitrary file.
 * A tokenizer that loads encodes a fixed text (special token included) and
 * decodes the ids back. */
#include "fuzz_bpe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, "tokenizer.json", data, size);
    cai_bpe_t *tok = NULL;
    if (cai_bpe_load_hf(path, &tok) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    exercise(tok);
    cai_bpe_t *copy = NULL;
    if (cai_bpe_clone(tok, &copy) != CAI_OK) abort();
    cai_bpe_free(tok);
    exercise(copy);
    cai_bpe_free(copy);
    return 0;
}
