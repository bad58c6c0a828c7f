/* libFuzzer target: the GPT-2 tokenizer files (cai_bpe_load,
 * src/data/bpe_io.c): vocab.json, the separator "\n%%\n", then merges.txt.
 * A tokenizer that loads encodes a fixed text (special token included) and
 * decodes the ids back. */
#include "fuzz_bpe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t vocab_len, merges_len;
    const uint8_t *merges;
    fuzz_split(data, size, &vocab_len, &merges, &merges_len);
    const char *vp = fuzz_file(0, "vocab.json", data, vocab_len);
    const char *mp = fuzz_file(1, "merges.txt", merges, merges_len);
    cai_bpe_t *tok = NULL;
    if (cai_bpe_load(vp, mp, &tok) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    exercise(tok);
    cai_bpe_free(tok);
    return 0;
}
