/* libFuzzer target: the BPE encoder on arbitrary bytes (cai_bpe_encode and
 * cai_bpe_encode_ordinary, src/data/bpe.c, bpe_unicode.c). The tokenizer is
 * trained once at start-up (all 256 byte tokens, a few hundred merges and
 * "<|endoftext|>"), so decode(encode(x)) == x must hold for every input. */
#include "colossal/data.h"
#include "fuzz_util.h"

static cai_bpe_t *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    static const char *const texts[] = {
        "The quick brown fox jumps over the lazy dog. It's 2024, isn't it? I'll say we've won 1234 times.",
        "  indented\tcode(x) { return x->y[3] + 0x1F; }\n\n\nunicode: caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 "
        "\xf0\x9f\x98\x80 \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82",
        "hello hello hello world world the the the and and of of to to in in is is",
        "<|endoftext|>special tokens are cut out<|endoftext|>",
    };
    static const char *const special[] = {"<|endoftext|>"};
    cai_bpe_train_opts opts = {.vocab_size = 600, .special_tokens = special, .n_special = 1, .min_frequency = 1};
    if (cai_bpe_train(texts, NULL, sizeof texts / sizeof texts[0], &opts, &tok) != CAI_OK) {
        fprintf(stderr, "fuzz: training the tokenizer failed: %s\n", cai_error_message());
        abort();
    }
    return 0;
}

static void roundtrip(const uint8_t *data, size_t size, int ordinary) {
    cai_token_buf ids = {0};
    cai_byte_buf bytes = {0};
    cai_status st = ordinary ? cai_bpe_encode_ordinary(tok, (const char *)data, size, &ids)
                             : cai_bpe_encode(tok, (const char *)data, size, &ids);
    if (st != CAI_OK) {
        fprintf(stderr, "fuzz: encode failed: %s\n", cai_error_message());
        abort();
    }
    int32_t n = cai_bpe_vocab_size(tok);
    for (size_t i = 0; i < ids.len; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= n) abort();
    if (cai_bpe_decode(tok, ids.ids, ids.len, &bytes) != CAI_OK) abort();
    if (bytes.len != size || (size && memcmp(bytes.data, data, size) != 0)) {
        fprintf(stderr, "fuzz: decode(encode(x)) != x (ordinary=%d, %zu bytes in, %zu out)\n", ordinary, size,
                bytes.len);
        abort();
    }
    cai_token_buf_free(&ids);
    cai_byte_buf_free(&bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    roundtrip(data, size, 0);
    roundtrip(data, size, 1);
    return 0;
}
