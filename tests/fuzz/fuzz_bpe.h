/* What the tokenizer-file targets do with a tokenizer that loaded: add a
 * special token, encode a fixed text and decode it, look at the tokens. */
#ifndef CAI_FUZZ_BPE_H
#define CAI_FUZZ_BPE_H

#include "colossal/data.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    return 0;
}

__attribute__((unused)) static void exercise(cai_bpe_t *tok) {
    static const char text[] = "Hello world<|endoftext|> it's 2024!\n\n  caf\xc3\xa9 \xff\xfe end";
    cai_token_buf ids = {0};
    cai_byte_buf bytes = {0};
    int32_t id;
    if (cai_bpe_add_special(tok, "<|endoftext|>", &id) != CAI_OK) cai_error_clear();
    if (cai_bpe_encode(tok, text, sizeof text - 1, &ids) == CAI_OK) {
        if (cai_bpe_decode(tok, ids.ids, ids.len, &bytes) != CAI_OK) cai_error_clear();
    } else {
        cai_error_clear();
    }
    int32_t n = cai_bpe_vocab_size(tok);
    for (int32_t i = 0; i < n && i < 4096; i++) {
        const char *b;
        size_t len;
        if (cai_bpe_token_bytes(tok, i, &b, &len) != CAI_OK) cai_error_clear();
    }
    cai_token_buf_free(&ids);
    cai_byte_buf_free(&bytes);
}

#endif
