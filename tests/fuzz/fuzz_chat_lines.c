/* libFuzzer target: chat JSONL lines and chat template files (src/data/
 * chat.c, sft.c). The first byte picks what the rest is: below 128 a
 * conversation line (bit 0: strict keys; the byte mod 3 picks the builtin
 * template), at 128 or above a template file rendered and encoded with a
 * fixed conversation. A conversation that parses must encode with the
 * trained tokenizer and with bytes, decode to exactly its rendering, and
 * hold at least one trained token after token 0, because a parsed
 * conversation ends with a non-empty assistant turn. */
#include "colossal/data.h"
#include "fuzz_util.h"

static cai_bpe_t *tok;
static cai_chat_template_t *builtins[CAI_CHAT_COUNT];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    static const char *const texts[] = {
        "The answer is 42. What is 2 + 2? Continue this story: Once upon a time there was a girl named Mia.",
        "system user assistant human gpt: Be brief. You are a helpful assistant.",
    };
    static const char *const special[] = {"<|endoftext|>"};
    cai_bpe_train_opts opts = {.vocab_size = 400, .special_tokens = special, .n_special = 1, .min_frequency = 1};
    if (cai_bpe_train(texts, NULL, 2, &opts, &tok) != CAI_OK) abort();
    for (int i = 0; i < CAI_CHAT_COUNT; i++)
        if (cai_chat_template_open(cai_chat_template_names[i], &builtins[i]) != CAI_OK ||
            cai_chat_template_add_tokens(builtins[i], tok, NULL) != CAI_OK)
            abort();
    return 0;
}

/* Encode with tok (NULL: bytes); the tokens must spell the rendering. */
static void check(const cai_chat_template_t *t, cai_bpe_t *bpe, const cai_chat_message *m, int n, int must_train) {
    cai_sft_tokens s = {0};
    cai_byte_buf text = {0}, want = {0};
    if (cai_sft_encode(t, bpe, m, n, &s) != CAI_OK || cai_chat_template_render(t, m, n, 0, &want) != CAI_OK) {
        fprintf(stderr, "fuzz: a parsed conversation does not encode: %s\n", cai_error_message());
        abort();
    }
    cai_status st = bpe ? cai_bpe_decode(bpe, s.ids, s.len, &text) : cai_byte_detokenize(s.ids, s.len, &text);
    if (st != CAI_OK || text.len != want.len || (text.len && memcmp(text.data, want.data, text.len) != 0)) {
        fprintf(stderr, "fuzz: the tokens do not spell the rendered conversation\n");
        abort();
    }
    if (must_train && cai_sft_fit(&s, 0, CAI_SFT_TRUNCATE) == CAI_SFT_DROPPED) {
        fprintf(stderr, "fuzz: a parsed conversation has nothing to train\n");
        abort();
    }
    for (int64_t seq = 1; seq < 8; seq *= 2) cai_sft_fit(&s, seq, CAI_SFT_TRUNCATE);
    cai_sft_tokens_free(&s);
    cai_byte_buf_free(&text);
    cai_byte_buf_free(&want);
}

static void conversation(const char *text, size_t len, int mode) {
    cai_chat_conversation c;
    if (cai_chat_parse_line("fuzz.jsonl", 1, text, len, mode & 1, &c) != CAI_OK) {
        cai_error_clear();
        cai_chat_conversation_free(&c);
        return;
    }
    const cai_chat_template_t *t = builtins[mode % CAI_CHAT_COUNT];
    /* a NUL in content (\u0000) would end the C string the templates see */
    int nul = 0;
    for (int i = 0; i < c.n_messages; i++) nul |= c.messages[i].content[0] == '\0';
    check(t, tok, c.messages, c.n_messages, !nul);
    check(t, NULL, c.messages, c.n_messages, 0);
    cai_chat_conversation_free(&c);
}

static void template_file(const uint8_t *data, size_t size) {
    cai_chat_template_t *t = NULL;
    if (cai_chat_template_open(fuzz_file(0, "template.json", data, size), &t) != CAI_OK) {
        cai_error_clear();
        return;
    }
    static const cai_chat_message m[] = {{"system", "s"}, {"user", "q"}, {"assistant", "a"}, {"tool", "t"}};
    cai_bpe_t *own = NULL;
    if (cai_bpe_clone(tok, &own) != CAI_OK || cai_chat_template_add_tokens(t, own, NULL) != CAI_OK) abort();
    check(t, own, m, 4, 0);
    check(t, NULL, m, 4, 0);
    cai_bpe_free(own);
    cai_chat_template_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 1 && data[0] < 128) conversation((const char *)data + 1, size - 1, data[0]);
    else if (size >= 1) template_file(data + 1, size - 1);
    return 0;
}
