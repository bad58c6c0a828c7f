/* The SFT data layer: chat templates (builtins and files), special tokens,
 * chat JSONL conversations and their errors, loss masks exactly on the
 * assistant's tokens for each template, the overflow policy, preprocessing
 * read back equal to direct tokenization, packed rows (positions, document
 * ids, targets, first-fit) and the epoch loader's determinism and resume. */
#include "cai_config.h"
#include "colossal/data.h"
#include "colossal/model.h"

#include "test_indexed_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ helpers */

static cai_bpe_t *tiny_tokenizer(void) {
    static const char *const texts[] = {
        "The answer is 42. What is 2 + 2? Continue this story: Once upon a time there was a girl named Mia.",
        "system user assistant: Be brief. You are a helpful assistant. Tom has 5 apples and gets 3 more.",
        "How many apples does Tom have now? The answer is 8. Lily went to the park with her friend Ben.",
    };
    const char *specials[] = {"<|endoftext|>"};
    cai_bpe_train_opts o = {400, specials, 1, 1};
    cai_bpe_t *tok = NULL;
    CK_CAI(cai_bpe_train(texts, NULL, 3, &o, &tok));
    return tok;
}

static cai_chat_template_t *open_tpl(const char *name) {
    cai_chat_template_t *t = NULL;
    CK_CAI(cai_chat_template_open(name, &t));
    return t;
}

static void write_text(const char *name, const char *text, char *path, size_t cap) {
    path_in(path, cap, name);
    spit(path, text, strlen(text));
}

/* Decode the tokens and spread each token's mask over its bytes. */
static void decode_masked(const cai_bpe_t *tok, const cai_sft_tokens *t, cai_byte_buf *text, char **bytes_mask) {
    text->len = 0;
    char *m = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < t->len; i++) {
        const size_t before = text->len;
        if (tok) CK_CAI(cai_bpe_decode(tok, &t->ids[i], 1, text));
        else CK_CAI(cai_byte_detokenize(&t->ids[i], 1, text));
        if (text->len > cap) {
            cap = text->len * 2;
            m = realloc(m, cap);
        }
        memset(m + before, t->mask[i] ? '1' : '0', text->len - before);
    }
    m = realloc(m, text->len + 1);
    m[text->len] = 0;
    *bytes_mask = m;
}

/* The expected text and per-byte mask from (text, mask) segments. */
static void expect_segments(const char *const *seg, const int *mask, int n, const cai_byte_buf *text,
                            const char *bytes_mask) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const size_t len = strlen(seg[i]);
        ck_assert_msg(at + len <= text->len && memcmp(text->data + at, seg[i], len) == 0,
                      "segment %d \"%s\" not at byte %zu of \"%.*s\"", i, seg[i], at, (int)text->len, text->data);
        for (size_t k = 0; k < len; k++)
            ck_assert_msg(bytes_mask[at + k] == (mask[i] ? '1' : '0'), "segment %d \"%s\" byte %zu: mask %c", i, seg[i],
                          k, bytes_mask[at + k]);
        at += len;
    }
    ck_assert_uint_eq(at, text->len);
}

static const cai_chat_message k_conv[] = {{"system", "Be brief."},
                                          {"user", "What is 2 + 2?"},
                                          {"assistant", "The answer is 4."},
                                          {"user", "And 3 + 5?"},
                                          {"assistant", " The answer is 8. "}};

/* ------------------------------------------------------------------ templates */

START_TEST(builtin_templates_render_as_infer_did) {
    /* test_job holds the exact strings of cai_chat_render; a template opened
     * by name renders the same, with and without the generation prompt */
    for (int i = 0; i < CAI_CHAT_COUNT; i++) {
        cai_byte_buf a = {0}, b = {0};
        CK_CAI(cai_chat_render((cai_chat_template)i, k_conv, 4, &a));
        cai_chat_template_t *t = open_tpl(cai_chat_template_names[i]);
        ck_assert_str_eq(cai_chat_template_name(t), cai_chat_template_names[i]);
        CK_CAI(cai_chat_template_render(t, k_conv, 4, 1, &b));
        ck_assert_str_eq(b.data, a.data);
        b.len = 0;
        CK_CAI(cai_chat_template_render(t, k_conv, 4, 0, &b));
        ck_assert_uint_lt(b.len, a.len);
        ck_assert_int_eq(memcmp(a.data, b.data, b.len), 0);
        cai_chat_template_free(t);
        cai_byte_buf_free(&a);
        cai_byte_buf_free(&b);
    }
    /* any role renders (colossal-infer passes them through) */
    cai_chat_message tool[1] = {{"tool", "42"}};
    cai_byte_buf b = {0};
    CK_CAI(cai_chat_render(CAI_CHAT_CHATML, tool, 1, &b));
    ck_assert_str_eq(b.data, "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n");
    cai_byte_buf_free(&b);
    ck_assert_int_eq(cai_chat_template_open("nonsense", &(cai_chat_template_t *){NULL}), CAI_ERR_CONFIG);
    cai_error_clear();
}
END_TEST

START_TEST(template_file_renders_and_its_errors_name_the_field) {
    char path[300];
    write_text("zephyr.json",
               "{\"prefix\": \"<|{role}|>\\n\", \"end\": \"</s>\", \"suffix\": \"\\n\", \"bos\": \"<s>\",\n"
               " \"roles\": {\"system\": {\"end\": \"\"}}, \"special_tokens\": [\"<s>\", \"</s>\"]}",
               path, sizeof path);
    cai_chat_template_t *t = open_tpl(path);
    ck_assert_int_eq(cai_chat_template_n_special(t), 2);
    ck_assert_str_eq(cai_chat_template_special(t, 1), "</s>");
    cai_byte_buf b = {0};
    CK_CAI(cai_chat_template_render(t, k_conv, 3, 1, &b));
    ck_assert_str_eq(b.data,
                     "<s><|system|>\nBe brief.\n<|user|>\nWhat is 2 + 2?</s>\n<|assistant|>\nThe answer is 4."
                     "</s>\n<|assistant|>\n");
    cai_byte_buf_free(&b);
    cai_chat_template_free(t);
    static const char *const bad[][2] = {
        {"{\"prefix\": 3}", "field 'prefix': must be a string, not an integer"},
        {"{\"prefix\": \"x\", \"color\": 1}", "unknown key 'color'"},
        {"{\"roles\": {\"bot\": {}}}", "field 'roles.bot': 'bot' is not one of system|user|assistant"},
        {"{\"roles\": {\"user\": {\"prefx\": \"\"}}}", "unknown key 'roles.user.prefx'"},
        {"{\"roles\": {\"user\": {\"end\": false}}}", "field 'roles.user.end': must be a string, not a boolean"},
        {"{\"prefix\": \"{role}: \", \"generation_prompt\": \"bot:\"}",
         "field 'generation_prompt': \"bot:\" is not where the assistant's prefix \"assistant: \" starts"},
        {"{\"trim\": \"yes\"}", "field 'trim': must be true or false"},
        {"{\"special_tokens\": [\"\"]}", "field 'special_tokens[0]'"},
        {"{\"special_tokens\": [\"<s>\", \">\"]}", "field 'special_tokens[1]': \">\" is one byte"},
        {"[1]", "must be a JSON object, not an array"},
        {"{\"prefix\": \"x\",", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text("bad.json", bad[i][0], path, sizeof path);
        cai_chat_template_t *x = NULL;
        ck_assert_int_eq(cai_chat_template_open(path, &x), CAI_ERR_FORMAT);
        ck_assert_ptr_null(x);
        ck_assert_msg(strstr(cai_error_message(), bad[i][1]) && strstr(cai_error_message(), "bad.json"),
                      "%s: got \"%s\", want \"%s\"", bad[i][0], cai_error_message(), bad[i][1]);
        cai_error_clear();
    }
    path_in(path, sizeof path, "absent.json");
    ck_assert_int_eq(cai_chat_template_open(path, &t), CAI_ERR_IO);
    cai_error_clear();
}
END_TEST

START_TEST(missing_special_tokens_are_reported_and_added) {
    cai_bpe_t *tok = tiny_tokenizer();
    cai_chat_template_t *t = open_tpl("chatml");
    const char *missing[4];
    int n = -1, added = -1;
    cai_chat_template_missing_tokens(t, tok, missing, 4, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(missing[0], "<|im_start|>");
    ck_assert_str_eq(missing[1], "<|im_end|>");
    const int32_t before = cai_bpe_vocab_size(tok);
    CK_CAI(cai_chat_template_add_tokens(t, tok, &added));
    ck_assert_int_eq(added, 2);
    ck_assert_int_eq(cai_bpe_vocab_size(tok), before + 2);
    cai_chat_template_missing_tokens(t, tok, missing, 4, &n);
    ck_assert_int_eq(n, 0);
    CK_CAI(cai_chat_template_add_tokens(t, tok, &added));
    ck_assert_int_eq(added, 0);
    cai_token_buf ids = {0};
    CK_CAI(cai_bpe_encode(tok, "<|im_start|>", 12, &ids));
    ck_assert_uint_eq(ids.len, 1);
    ck_assert_int_eq(ids.ids[0], before);
    cai_token_buf_free(&ids);
    /* plain needs none */
    cai_chat_template_t *p = open_tpl("plain");
    cai_chat_template_missing_tokens(p, tok, missing, 4, &n);
    ck_assert_int_eq(n, 0);
    cai_chat_template_free(p);
    cai_chat_template_free(t);
    cai_bpe_free(tok);
}
END_TEST

/* ------------------------------------------------------------------ loss masks */

static void check_masks(cai_bpe_t *tok, const char *tpl, const char *const *seg, const int *mask, int nseg) {
    cai_chat_template_t *t = open_tpl(tpl);
    if (tok) CK_CAI(cai_chat_template_add_tokens(t, tok, NULL));
    cai_sft_tokens s = {0};
    CK_CAI(cai_sft_encode(t, tok, k_conv, 5, &s));
    cai_byte_buf text = {0}, rendered = {0};
    char *bm = NULL;
    decode_masked(tok, &s, &text, &bm);
    /* the tokens spell the rendered conversation */
    CK_CAI(cai_chat_template_render(t, k_conv, 5, 0, &rendered));
    ck_assert_uint_eq(text.len, rendered.len);
    ck_assert_int_eq(memcmp(text.data, rendered.data, text.len), 0);
    expect_segments(seg, mask, nseg, &text, bm);
    if (tok && cai_chat_template_n_special(t) > 0) {
        /* a special token is one token: the masked end is exactly one id */
        int32_t end_id = -1;
        CK_CAI(cai_bpe_token_id(tok, cai_chat_template_special(t, cai_chat_template_n_special(t) - 1), &end_id));
        int ends = 0;
        for (size_t i = 0; i < s.len; i++) ends += s.ids[i] == end_id && s.mask[i];
        ck_assert_int_eq(ends, 2);
    }
    if (tok) {
        /* up to the first learned token: the tokens of the prompt inference would build */
        cai_byte_buf prompt = {0};
        cai_token_buf want = {0};
        CK_CAI(cai_chat_template_render(t, k_conv, 2, 1, &prompt));
        CK_CAI(cai_bpe_encode(tok, prompt.data, prompt.len, &want));
        size_t first = 0;
        while (!s.mask[first]) first++;
        ck_assert_uint_eq(first, want.len);
        ck_assert_int_eq(memcmp(s.ids, want.ids, first * sizeof *s.ids), 0);
        cai_byte_buf_free(&prompt);
        cai_token_buf_free(&want);
    }
    free(bm);
    cai_byte_buf_free(&text);
    cai_byte_buf_free(&rendered);
    cai_sft_tokens_free(&s);
    cai_chat_template_free(t);
}

START_TEST(masks_are_exactly_the_assistant_tokens) {
    static const char *const chatml[] = {
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + "
        "2?<|im_end|>\n<|im_start|>assistant\n",
        "The answer is 4.<|im_end|>", "\n<|im_start|>user\nAnd 3 + 5?<|im_end|>\n<|im_start|>assistant\n",
        " The answer is 8. <|im_end|>", "\n"};
    static const char *const llama3[] = {
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|"
        "end_header_id|>\n\nWhat is 2 + 2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "The answer is 4.<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\nAnd 3 + 5?<|eot_id|><|start_header_id|>assistant<|end_header_"
        "id|>\n\n",
        "The answer is 8.<|eot_id|>"};
    static const char *const plain[] = {"system: Be brief.\nuser: What is 2 + 2?\nassistant:", " The answer is 4.\n",
                                        "user: And 3 + 5?\nassistant:", "  The answer is 8. \n"};
    static const int m5[] = {0, 1, 0, 1, 0}, m4[] = {0, 1, 0, 1};
    for (int bytes = 0; bytes < 2; bytes++) {
        cai_bpe_t *tok = bytes ? NULL : tiny_tokenizer();
        check_masks(tok, "chatml", chatml, m5, 5);
        check_masks(tok, "llama3", llama3, m4, 4);
        check_masks(tok, "plain", plain, m4, 4);
        cai_bpe_free(tok);
    }
    /* a template file: the same rules */
    char path[300];
    write_text("t.json",
               "{\"prefix\": \"[{role}]\", \"end\": \"[/]\", \"suffix\": \"|\", \"generation_prompt\": \"[assistant]\","
               " \"roles\": {\"assistant\": {\"prefix\": \"[assistant]>\"}}, \"special_tokens\": [\"[/]\"]}",
               path, sizeof path);
    static const char *const file[] = {"[system]Be brief.[/]|[user]What is 2 + 2?[/]|[assistant]",
                                       ">The answer is 4.[/]", "|[user]And 3 + 5?[/]|[assistant]",
                                       "> The answer is 8. [/]", "|"};
    cai_bpe_t *tok = tiny_tokenizer();
    check_masks(tok, path, file, m5, 5);
    cai_bpe_free(tok);
}
END_TEST

START_TEST(overflow_truncates_or_drops) {
    cai_sft_tokens t = {0};
    int32_t ids[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    uint8_t mask[10] = {0, 0, 0, 0, 0, 1, 1, 1, 0, 0};
    t.ids = ids;
    t.mask = mask;
    t.len = 10;
    ck_assert_int_eq(cai_sft_fit(&t, 9, CAI_SFT_TRUNCATE), CAI_SFT_KEPT);
    ck_assert_int_eq(cai_sft_fit(&t, 0, CAI_SFT_DROP), CAI_SFT_KEPT);
    ck_assert_int_eq(cai_sft_fit(&t, 8, CAI_SFT_DROP), CAI_SFT_DROPPED);
    ck_assert_uint_eq(t.len, 10);
    ck_assert_int_eq(cai_sft_fit(&t, 6, CAI_SFT_TRUNCATE), CAI_SFT_TRUNCATED);
    ck_assert_uint_eq(t.len, 7); /* seq_len + 1 tokens */
    t.len = 10;
    /* the head keeps no trained target: dropped */
    ck_assert_int_eq(cai_sft_fit(&t, 4, CAI_SFT_TRUNCATE), CAI_SFT_DROPPED);
    /* nothing trained after token 0: dropped at any length */
    t.len = 10;
    memset(mask, 0, sizeof mask);
    mask[0] = 1;
    ck_assert_int_eq(cai_sft_fit(&t, 0, CAI_SFT_TRUNCATE), CAI_SFT_DROPPED);
}
END_TEST

/* ------------------------------------------------------------------ conversations */

static void parse_ok(const char *line, int strict, int n, const char *const *roles, const char *last) {
    cai_chat_conversation c;
    cai_status st = cai_chat_parse_line("t.jsonl", 1, line, strlen(line), strict, &c);
    ck_assert_msg(st == CAI_OK, "%s: %s", line, cai_error_message());
    ck_assert_int_eq(c.n_messages, n);
    for (int i = 0; i < n; i++) ck_assert_str_eq(c.messages[i].role, roles[i]);
    ck_assert_str_eq(c.messages[n - 1].content, last);
    cai_chat_conversation_free(&c);
    cai_chat_conversation_free(&c); /* zeroed: safe twice */
}

START_TEST(conversation_spellings_parse) {
    static const char *const ua[] = {"user", "assistant"}, *const sua[] = {"system", "user", "assistant"},
                             *const uaua[] = {"user", "assistant", "user", "assistant"};
    parse_ok("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]}", 1,
             2, ua, "yo");
    parse_ok(
        "{\"messages\":[{\"from\":\"system\",\"content\":\"s\"},{\"from\":\"human\",\"content\":\"hi\"},"
        "{\"from\":\"assistant\",\"content\":\"yo\"}]}",
        1, 3, sua, "yo");
    parse_ok(
        "{\"id\": 7, \"conversations\":[{\"from\":\"human\",\"value\":\"hi\"},{\"from\":\"gpt\",\"value\":\"yo\"}]}", 0,
        2, ua, "yo");
    parse_ok("{\"prompt\":\"2+2?\",\"completion\":\" 4\"}", 1, 2, ua, " 4");
    parse_ok(
        "{\"prompt\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
        "{\"role\":\"user\",\"content\":\"c\"}],\"completion\":[{\"role\":\"assistant\",\"content\":\"d\"}]}",
        1, 4, uaua, "d");
    /* lenient by default: extra keys of Hugging Face datasets */
    parse_ok(
        "{\"source\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"name\":\"a\"},"
        "{\"role\":\"assistant\",\"content\":\"yo\",\"weight\":1}]}",
        0, 2, ua, "yo");
}
END_TEST

START_TEST(malformed_lines_name_line_and_field) {
#define U "{\"role\":\"user\",\"content\":\"q\"}"
#define A "{\"role\":\"assistant\",\"content\":\"a\"}"
#define S "{\"role\":\"system\",\"content\":\"s\"}"
    static const char *const cases[][3] = {
        {"{\"messages\": [" U ",", "0", "train.jsonl:17: not valid JSON"},
        {"", "0", "train.jsonl:17: empty line"},
        {"[1,2]", "0", "must be a JSON object"},
        {"{\"text\": \"hello\"}", "0", "no \"messages\""},
        {"{\"messages\": []}", "0", "field 'messages': must not be empty"},
        {"{\"messages\": {}}", "0", "field 'messages': must be an array"},
        {"{\"messages\": [" U "," A ",{\"role\":\"bot\",\"content\":\"x\"}]}", "0",
         "train.jsonl:17: field 'messages[2].role': 'bot' is not one of system|user|assistant"},
        {"{\"messages\": [{\"from\":\"robot\",\"content\":\"x\"}," A "]}", "0",
         "field 'messages[0].from': 'robot' is not one of system|human|assistant|gpt"},
        {"{\"messages\": [{\"content\":\"x\"}," A "]}", "0", "field 'messages[0].role': absent"},
        {"{\"messages\": [{\"role\":\"user\",\"from\":\"human\",\"content\":\"x\"}," A "]}", "0",
         "has both 'role' and 'from'"},
        {"{\"messages\": [" U "]}", "0", "field 'messages': no assistant turn"},
        {"{\"messages\": [" U "," U "," A "]}", "0",
         "field 'messages[1].role': two user turns in a row (after messages[0])"},
        {"{\"messages\": [" U "," A "," A "]}", "0", "field 'messages[2].role': two assistant turns in a row"},
        {"{\"messages\": [" A "," U "," A "]}", "0",
         "field 'messages[0].role': the conversation starts with the assistant"},
        {"{\"messages\": [" S "," A "]}", "0", "field 'messages[1].role': the conversation starts with the assistant"},
        {"{\"messages\": [" U "," S "," A "]}", "0", "field 'messages[1].role': a system turn may only come first"},
        {"{\"messages\": [" U "," A "," U "]}", "0", "field 'messages[2]': the conversation ends with a user turn"},
        {"{\"messages\": [{\"role\":\"user\",\"content\":\"\"}," A "]}", "0",
         "field 'messages[0].content': must not be empty"},
        {"{\"messages\": [" U ",{\"role\":\"assistant\",\"content\":\" \\n\"}]}", "0",
         "field 'messages[1].content': is only whitespace"},
        {"{\"messages\": [" U ",{\"role\":\"assistant\",\"content\":[1]}]}", "0",
         "field 'messages[1].content': must be a string, not an array"},
        {"{\"messages\": [" U ",{\"role\":\"assistant\"}]}", "0", "field 'messages[1].content': absent"},
        {"{\"messages\": [" U ",7]}", "0", "field 'messages[1]': must be an object"},
        {"{\"messages\": [" U "," A "], \"id\": 3}", "1", "unknown key 'id'"},
        {"{\"messages\": [" U ",{\"role\":\"assistant\",\"content\":\"a\",\"name\":\"x\"}]}", "1",
         "unknown key 'messages[1].name'"},
        {"{\"messages\": [" U "," A "], \"conversations\": []}", "0", "give one of them"},
        {"{\"messages\": [" U "," A "], \"prompt\": \"x\"}", "0", "give either the messages or the prompt"},
        {"{\"prompt\": \"x\"}", "0", "field 'completion': absent"},
        {"{\"completion\": \"x\"}", "0", "field 'prompt': absent"},
        {"{\"prompt\": \"\", \"completion\": \"x\"}", "0", "field 'prompt': must not be empty"},
        {"{\"prompt\": 3, \"completion\": \"x\"}", "0", "field 'prompt': must be a string or an array"},
        {"{\"prompt\": \"q\", \"completion\": [" U "]}", "0",
         "field 'completion[0].role': a completion holds assistant turns only"},
        {"{\"messages\": [" U "," A "], \"messages\": []}", "0", "not valid JSON: duplicate"},
    };
#undef U
#undef A
#undef S
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cai_chat_conversation c;
        const cai_status st =
            cai_chat_parse_line("train.jsonl", 17, cases[i][0], strlen(cases[i][0]), cases[i][1][0] == '1', &c);
        ck_assert_msg(st == CAI_ERR_FORMAT, "case %zu (%s): status %d", i, cases[i][0], (int)st);
        ck_assert_msg(strstr(cai_error_message(), cases[i][2]) && strstr(cai_error_message(), "train.jsonl:17: "),
                      "case %zu (%s): got \"%s\", want \"%s\"", i, cases[i][0], cai_error_message(), cases[i][2]);
        ck_assert_ptr_null(c.messages);
        cai_error_clear();
    }
}
END_TEST

/* ------------------------------------------------------------------ preprocess and rows */

static cai_bpe_t *g_tok;
static cai_chat_template_t *g_tpl;

static void example_file(const char *name, int64_t n, char *path, size_t cap) {
    path_in(path, cap, name);
    const cai_sft_example_config ec = {n, 5, 0};
    CK_CAI(cai_sft_example_write(&ec, path, NULL, NULL, NULL, NULL));
}

static void preprocess(const char *input, const char *prefix, int64_t seq_len, cai_sft_overflow ov,
                       cai_sft_preprocess_stats *st) {
    const char *inputs[1] = {input};
    const cai_sft_preprocess_config cfg = {inputs, 1, prefix, g_tpl, g_tok, seq_len, ov, 0, 0};
    CK_CAI(cai_sft_preprocess(&cfg, MPI_COMM_WORLD, st));
}

/* n example conversations written as NAME.jsonl and preprocessed to NAME. */
static void prepared(const char *name, int64_t n, int64_t seq_len, cai_sft_overflow ov, char *prefix, size_t cap) {
    char in[300], file[64];
    snprintf(file, sizeof file, "%s.jsonl", name);
    example_file(file, n, in, sizeof in);
    path_in(prefix, cap, name);
    preprocess(in, prefix, seq_len, ov, NULL);
}

static void setup_tok(void) {
    g_tok = tiny_tokenizer();
    g_tpl = open_tpl("chatml");
    CK_CAI(cai_chat_template_add_tokens(g_tpl, g_tok, NULL));
}

static void teardown_tok(void) {
    cai_chat_template_free(g_tpl);
    cai_bpe_free(g_tok);
}

/* Read every line and tokenize directly: the reference for preprocessing. */
typedef struct {
    cai_sft_tokens *docs;
    int64_t n, truncated, dropped;
} direct;

static void direct_encode(const char *path, int64_t seq_len, cai_sft_overflow ov, direct *d) {
    size_t len;
    char *all = (char *)slurp(path, &len);
    memset(d, 0, sizeof *d);
    d->docs = calloc(100000, sizeof *d->docs);
    int64_t line = 0;
    for (char *p = all; p < all + len;) {
        char *nl = memchr(p, '\n', (size_t)(all + len - p));
        const size_t n = nl ? (size_t)(nl - p) : (size_t)(all + len - p);
        line++;
        cai_chat_conversation c;
        CK_CAI(cai_chat_parse_line(path, line, p, n, 0, &c));
        cai_sft_tokens *t = &d->docs[d->n];
        CK_CAI(cai_sft_encode(g_tpl, g_tok, c.messages, c.n_messages, t));
        cai_chat_conversation_free(&c);
        const cai_sft_fit_result r = cai_sft_fit(t, seq_len, ov);
        d->truncated += r == CAI_SFT_TRUNCATED;
        d->dropped += r == CAI_SFT_DROPPED;
        if (r != CAI_SFT_DROPPED) d->n++;
        else cai_sft_tokens_free(t);
        p += n + 1;
    }
    free(all);
}

static void direct_free(direct *d) {
    for (int64_t i = 0; i < d->n; i++) cai_sft_tokens_free(&d->docs[i]);
    free(d->docs);
}

START_TEST(preprocess_reads_back_as_direct_tokenization) {
    char in[300], prefix[300], mprefix[320];
    example_file("ex.jsonl", 300, in, sizeof in);
    path_in(prefix, sizeof prefix, "ex");
    const struct {
        int64_t seq_len;
        cai_sft_overflow ov;
    } runs[] = {{0, CAI_SFT_TRUNCATE}, {48, CAI_SFT_TRUNCATE}, {48, CAI_SFT_DROP}};
    for (size_t r = 0; r < 3; r++) {
        cai_sft_preprocess_stats st;
        preprocess(in, prefix, runs[r].seq_len, runs[r].ov, &st);
        direct d;
        direct_encode(in, runs[r].seq_len, runs[r].ov, &d);
        ck_assert_int_eq(st.conversations, 300);
        ck_assert_int_eq(st.written, d.n);
        ck_assert_int_eq(st.truncated, d.truncated);
        ck_assert_int_eq(st.dropped, d.dropped);
        if (runs[r].seq_len) ck_assert_int_gt(st.truncated + st.dropped, 0);
        ck_assert_int_eq(runs[r].ov == CAI_SFT_DROP ? st.truncated : 0, 0);
        cai_indexed_dataset_t *tok, *mask;
        CK_CAI(cai_indexed_open(&tok, prefix, cai_bpe_vocab_size(g_tok)));
        CK_CAI(cai_sft_mask_prefix(prefix, mprefix, sizeof mprefix));
        CK_CAI(cai_indexed_open(&mask, mprefix, 2));
        ck_assert_int_eq(cai_indexed_num_documents(tok), d.n);
        ck_assert_int_eq(cai_indexed_num_documents(mask), d.n);
        int64_t tokens = 0, trained = 0;
        for (int64_t i = 0; i < d.n; i++) {
            const int64_t n = cai_indexed_sequence_length(tok, i);
            ck_assert_int_eq(n, (int64_t)d.docs[i].len);
            int32_t *a = malloc((size_t)n * sizeof *a), *m = malloc((size_t)n * sizeof *m);
            CK_CAI(cai_indexed_read(tok, i, 0, n, a));
            CK_CAI(cai_indexed_read(mask, i, 0, n, m));
            for (int64_t k = 0; k < n; k++) {
                ck_assert_int_eq(a[k], d.docs[i].ids[k]);
                ck_assert_int_eq(m[k], d.docs[i].mask[k]);
                trained += m[k];
            }
            tokens += n;
            free(a);
            free(m);
        }
        ck_assert_int_eq(st.tokens, tokens);
        ck_assert_int_eq(st.trained_tokens, trained);
        cai_indexed_free(tok);
        cai_indexed_free(mask);
        direct_free(&d);
    }
}
END_TEST

START_TEST(preprocess_error_names_line_and_leaves_nothing) {
    char in[300], prefix[300], p[340];
    write_text("bad.jsonl",
               "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\"}]}\n\n"
               "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"user\",\"content\":\"a\"},"
               "{\"role\":\"assistant\",\"content\":\"a\"}]}\n",
               in, sizeof in);
    path_in(prefix, sizeof prefix, "bad");
    const char *inputs[1] = {in};
    const cai_sft_preprocess_config cfg = {inputs, 1, prefix, g_tpl, g_tok, 0, CAI_SFT_TRUNCATE, 0, 0};
    ck_assert_int_eq(cai_sft_preprocess(&cfg, MPI_COMM_WORLD, NULL), CAI_ERR_FORMAT);
    ck_assert_msg(strstr(cai_error_message(), "bad.jsonl:3: field 'messages[1].role': two user turns"), "%s",
                  cai_error_message());
    cai_error_clear();
    const char *ext[] = {".bin", ".idx", "_loss_mask.bin", "_loss_mask.idx"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s%s", prefix, ext[i]);
        ck_assert_msg(access(p, F_OK) != 0, "%s left behind", p);
    }
}
END_TEST

static cai_sft_dataset_t *open_rows(const char *prefix, int64_t seq_len, int packed, uint64_t seed) {
    const cai_sft_data_config c = {prefix, seq_len, packed, CAI_SFT_TRUNCATE, seed, 0, cai_bpe_vocab_size(g_tok)};
    cai_sft_dataset_t *ds = NULL;
    CK_CAI(cai_sft_dataset_init(&ds, &c));
    return ds;
}

START_TEST(packed_rows_restart_positions_and_number_documents) {
    char in[300], prefix[300];
    example_file("rows.jsonl", 200, in, sizeof in);
    path_in(prefix, sizeof prefix, "rows");
    preprocess(in, prefix, 0, CAI_SFT_TRUNCATE, NULL);
    direct d;
    direct_encode(in, 0, CAI_SFT_TRUNCATE, &d);
    const int64_t S = 96;
    for (int packed = 0; packed < 2; packed++) {
        cai_sft_dataset_t *ds = open_rows(prefix, S, packed, 3);
        cai_sft_data_stats st;
        cai_sft_dataset_stats(ds, &st);
        const int64_t rows = cai_sft_dataset_size(ds);
        ck_assert_int_eq(st.documents, d.n);
        ck_assert_int_eq(st.rows, rows);
        int32_t *tok = malloc((size_t)(rows * S) * sizeof *tok), *tgt = malloc((size_t)(rows * S) * sizeof *tgt),
                *pos = malloc((size_t)(rows * S) * sizeof *pos), *seg = malloc((size_t)(rows * S) * sizeof *seg);
        int64_t *all = malloc((size_t)rows * sizeof *all);
        for (int64_t r = 0; r < rows; r++) all[r] = r;
        CK_CAI(cai_sft_dataset_batch(ds, all, rows, tok, tgt, pos, seg));
        /* what the read-time policy keeps of each document */
        int64_t *use = calloc((size_t)d.n, sizeof *use), truncated = 0, dropped = 0;
        for (int64_t i = 0; i < d.n; i++) {
            const int64_t n = (int64_t)d.docs[i].len > S + 1 ? S + 1 : (int64_t)d.docs[i].len;
            int64_t trained = 0;
            for (int64_t k = 1; k < n; k++) trained += d.docs[i].mask[k];
            use[i] = trained ? n : 0;
            truncated += trained && n < (int64_t)d.docs[i].len;
            dropped += !trained;
        }
        ck_assert_int_gt(truncated, 0);
        ck_assert_int_eq(st.truncated, truncated);
        ck_assert_int_eq(st.dropped, dropped);
        int *seen = calloc((size_t)d.n, sizeof *seen);
        int64_t positions = 0, padding = 0, trained = 0, kept = 0;
        for (int64_t r = 0; r < rows; r++) {
            int64_t nd;
            const int64_t *docs = cai_sft_dataset_row_documents(ds, r, &nd);
            if (!packed) ck_assert_int_eq(nd, 1);
            int64_t at = r * S;
            for (int64_t k = 0; k < nd; k++) {
                const cai_sft_tokens *t = &d.docs[docs[k]];
                seen[docs[k]]++;
                kept++;
                for (int64_t i = 0; i + 1 < use[docs[k]]; i++, at++) {
                    ck_assert_int_eq(tok[at], t->ids[i]);
                    ck_assert_int_eq(pos[at], (int32_t)i);
                    ck_assert_int_eq(seg[at], (int32_t)k);
                    ck_assert_int_eq(tgt[at], t->mask[i + 1] ? t->ids[i + 1] : CAI_IGNORE_INDEX);
                    trained += t->mask[i + 1];
                    positions++;
                }
                ck_assert_int_le(at, (r + 1) * S);
            }
            for (; at < (r + 1) * S; at++, padding++) {
                ck_assert_int_eq(seg[at], -1);
                ck_assert_int_eq(tgt[at], CAI_IGNORE_INDEX);
                ck_assert_int_eq(tok[at], 0);
            }
        }
        /* every conversation the policy keeps, exactly once */
        for (int64_t i = 0; i < d.n; i++) ck_assert_int_eq(seen[i], use[i] > 0);
        ck_assert_int_eq(kept + dropped, d.n);
        ck_assert_int_eq(st.padding, padding);
        ck_assert_int_eq(st.tokens, positions);
        ck_assert_int_eq(st.trained_tokens, trained);
        if (packed) ck_assert_int_lt(rows, kept * 3 / 4); /* short conversations share rows */
        else ck_assert_int_eq(rows, kept);
        free(use);
        free(seen);
        free(all);
        free(tok);
        free(tgt);
        free(pos);
        free(seg);
        cai_sft_dataset_free(ds);
    }
    direct_free(&d);
}
END_TEST

START_TEST(packing_is_deterministic_and_first_fit) {
    char prefix[300];
    prepared("ff", 120, 64, CAI_SFT_DROP, prefix, sizeof prefix);
    cai_sft_dataset_t *a = open_rows(prefix, 64, 1, 9), *b = open_rows(prefix, 64, 1, 9),
                      *c = open_rows(prefix, 64, 1, 10);
    ck_assert_int_eq(cai_sft_dataset_size(a), cai_sft_dataset_size(b));
    int differs = cai_sft_dataset_size(a) != cai_sft_dataset_size(c);
    /* replay first-fit over the rows' documents in placement order: each
     * document must go to the first row with room at that time */
    const int64_t rows = cai_sft_dataset_size(a);
    int64_t *free_space = malloc((size_t)rows * sizeof *free_space), *next = calloc((size_t)rows, sizeof *next);
    for (int64_t r = 0; r < rows; r++) free_space[r] = 64;
    int64_t total = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t n, m;
        const int64_t *x = cai_sft_dataset_row_documents(a, r, &n), *y = cai_sft_dataset_row_documents(b, r, &m);
        ck_assert_int_eq(n, m);
        ck_assert_int_eq(memcmp(x, y, (size_t)n * sizeof *x), 0);
        const int64_t *z = cai_sft_dataset_row_documents(c, r, &m);
        if (!z || m != n || memcmp(x, z, (size_t)n * sizeof *x) != 0) differs = 1;
        total += n;
    }
    ck_assert_msg(differs, "another seed packs the same rows");
    /* placement order: the seed's shuffle of the kept documents; rebuild it */
    cai_indexed_dataset_t *ds;
    CK_CAI(cai_indexed_open(&ds, prefix, 0));
    int64_t *order = malloc((size_t)total * sizeof *order);
    for (int64_t i = 0; i < total; i++) order[i] = i; /* DROP at preprocess: every stored document is kept */
    ck_assert_int_eq(cai_indexed_num_documents(ds), total);
    cai_data_shuffle(order, total, 9, 0x5346545041434bull);
    for (int64_t k = 0; k < total; k++) {
        const int64_t need = cai_indexed_sequence_length(ds, order[k]) - 1;
        int64_t r = 0;
        while (free_space[r] < need) r++;
        int64_t n;
        const int64_t *x = cai_sft_dataset_row_documents(a, r, &n);
        ck_assert_msg(next[r] < n && x[next[r]] == order[k], "document %lld is not in row %lld, the first with room",
                      (long long)order[k], (long long)r);
        next[r]++;
        free_space[r] -= need;
    }
    free(order);
    free(free_space);
    free(next);
    cai_indexed_free(ds);
    cai_sft_dataset_free(a);
    cai_sft_dataset_free(b);
    cai_sft_dataset_free(c);
}
END_TEST

START_TEST(loader_is_deterministic_resumable_and_split_over_dp) {
    char prefix[300];
    prepared("ld", 150, 64, CAI_SFT_TRUNCATE, prefix, sizeof prefix);
    cai_sft_dataset_t *ds = open_rows(prefix, 64, 1, 1);
    const int64_t S = 64, G = 4, steps = 3 * cai_sft_dataset_size(ds) / G + 2; /* over three epochs */
    int32_t *ref = malloc((size_t)(steps * G * S) * sizeof *ref), *buf = malloc((size_t)(G * S) * sizeof *buf);
    cai_sft_loader_t *l;
    CK_CAI(cai_sft_loader_init(&l, ds, G, 1, 0, 77, 0));
    for (int64_t s = 0; s < steps; s++) CK_CAI(cai_sft_loader_next(l, ref + s * G * S, NULL, NULL, NULL));
    ck_assert_int_eq(cai_sft_loader_consumed(l), steps * G);
    cai_sft_loader_free(l);
    /* the same seed again, resumed half-way, and split over two dp ranks */
    for (int64_t from = 0; from < steps; from += steps / 2) {
        for (int dp = 0; dp < 2; dp++) {
            CK_CAI(cai_sft_loader_init(&l, ds, G, 2, dp, 77, from * G));
            ck_assert_int_eq(cai_sft_loader_local_batch(l), G / 2);
            for (int64_t s = from; s < steps; s++) {
                CK_CAI(cai_sft_loader_next(l, buf, NULL, NULL, NULL));
                ck_assert_int_eq(memcmp(buf, ref + (s * G + dp * G / 2) * S, (size_t)(G / 2 * S) * sizeof *buf), 0);
            }
            cai_sft_loader_free(l);
        }
    }
    /* another seed: another order */
    CK_CAI(cai_sft_loader_init(&l, ds, G, 1, 0, 78, 0));
    int same = 1;
    for (int64_t s = 0; s < 4; s++) {
        CK_CAI(cai_sft_loader_next(l, buf, NULL, NULL, NULL));
        same &= memcmp(buf, ref + s * G * S, (size_t)(G * S) * sizeof *buf) == 0;
    }
    ck_assert_msg(!same, "seeds 77 and 78 give the same batches");
    cai_sft_loader_free(l);
    free(ref);
    free(buf);
    cai_sft_dataset_free(ds);
}
END_TEST

START_TEST(mismatched_mask_dataset_is_refused) {
    char prefix[300], other[300], mp[340], op[340], a[400], b[400];
    prepared("m1", 20, 0, CAI_SFT_TRUNCATE, prefix, sizeof prefix);
    prepared("m2", 30, 0, CAI_SFT_TRUNCATE, other, sizeof other);
    /* m1's tokens beside m2's masks */
    CK_CAI(cai_sft_mask_prefix(prefix, mp, sizeof mp));
    CK_CAI(cai_sft_mask_prefix(other, op, sizeof op));
    for (int k = 0; k < 2; k++) {
        snprintf(a, sizeof a, "%s.%s", op, k ? "bin" : "idx");
        snprintf(b, sizeof b, "%s.%s", mp, k ? "bin" : "idx");
        size_t n;
        unsigned char *x = slurp(a, &n);
        spit(b, x, n);
        free(x);
    }
    const cai_sft_data_config c = {prefix, 64, 1, CAI_SFT_TRUNCATE, 1, 0, 0};
    cai_sft_dataset_t *ds = NULL;
    ck_assert_int_eq(cai_sft_dataset_init(&ds, &c), CAI_ERR_FORMAT);
    ck_assert_msg(strstr(cai_error_message(), "preprocess them together"), "%s", cai_error_message());
    cai_error_clear();
    ck_assert_ptr_null(ds);
}
END_TEST

/* ------------------------------------------------------------------ instruction set */

static int asks_one_of(const cai_chat_conversation *c, char **questions, int64_t n) {
    for (int k = 0; k < c->n_messages; k++)
        for (int64_t j = 0; j < n; j++)
            if (!strcmp(c->messages[k].role, "user") && !strcmp(c->messages[k].content, questions[j])) return 1;
    return 0;
}

START_TEST(instruction_set_is_deterministic_and_split) {
    const cai_sft_example_config ec = {400, 3, 20};
    int held = 0, arithmetic = 0, stories = 0;
    for (int64_t i = 0; i < ec.n; i++) {
        cai_chat_conversation a, b;
        int ha, hb;
        CK_CAI(cai_sft_example_conversation(&ec, i, &a, &ha));
        CK_CAI(cai_sft_example_conversation(&ec, i, &b, &hb));
        ck_assert_int_eq(ha, hb);
        ck_assert_int_eq(a.n_messages, b.n_messages);
        for (int k = 0; k < a.n_messages; k++) ck_assert_str_eq(a.messages[k].content, b.messages[k].content);
        held += ha;
        const char *ans = a.messages[a.n_messages - 1].content;
        if (strncmp(ans, "The answer is ", 14) == 0) {
            arithmetic++;
            const char *q = a.messages[a.n_messages - 2].content;
            int x, y;
            if (sscanf(q, "What is %d + %d?", &x, &y) == 2) ck_assert_int_eq(atoi(ans + 14), x + y);
        } else {
            stories++;
            ck_assert_msg(strncmp(a.messages[a.n_messages - 2].content, "Continue this story: ", 21) == 0, "%s",
                          a.messages[a.n_messages - 2].content);
        }
        cai_chat_conversation_free(&a);
        cai_chat_conversation_free(&b);
    }
    ck_assert_int_gt(held, 40);
    ck_assert_int_lt(held, 120);
    ck_assert_int_gt(arithmetic, 150);
    ck_assert_int_gt(stories, 50);
    /* the files hold the two splits, and every line parses */
    char train[300], test[300];
    path_in(train, sizeof train, "train.jsonl");
    path_in(test, sizeof test, "held.jsonl");
    int64_t nt, nh, left;
    CK_CAI(cai_sft_example_write(&ec, train, test, &nt, &nh, &left));
    ck_assert_int_eq(nh, held);
    ck_assert_int_eq(nt + nh + left, ec.n);
    /* The held-out file read back: every held-out conversation, in order;
     * its arithmetic questions (the user turn before "The answer is N.")
     * kept to check the training file against. */
    const char *paths[2] = {train, test};
    char **held_q = calloc((size_t)ec.n, sizeof *held_q);
    int64_t n_held_q = 0, asked = 0, i = 0;
    for (int f = 1; f >= 0; f--) {
        i = 0;
        size_t len;
        char *all = (char *)slurp(paths[f], &len);
        int64_t lines = 0;
        for (char *p = all; p < all + len; lines++) {
            char *nl = memchr(p, '\n', (size_t)(all + len - p));
            cai_chat_conversation c, want;
            int h = 0;
            CK_CAI(cai_chat_parse_line(paths[f], lines + 1, p, (size_t)(nl - p), 1, &c));
            /* the next conversation of this split that the file keeps */
            for (;; i++) {
                ck_assert_int_lt(i, ec.n);
                CK_CAI(cai_sft_example_conversation(&ec, i, &want, &h));
                if (h != f) {
                    cai_chat_conversation_free(&want);
                    continue;
                }
                if (f == 1 || !asks_one_of(&want, held_q, n_held_q)) break;
                asked++;
                cai_chat_conversation_free(&want);
            }
            i++;
            ck_assert_int_eq(c.n_messages, want.n_messages);
            for (int k = 0; k < c.n_messages; k++) {
                ck_assert_str_eq(c.messages[k].role, want.messages[k].role);
                ck_assert_str_eq(c.messages[k].content, want.messages[k].content);
                if (f == 1 && k > 0 && !strcmp(c.messages[k - 1].role, "user") &&
                    !strncmp(c.messages[k].content, "The answer is ", 14))
                    held_q[n_held_q++] = strdup(c.messages[k - 1].content);
            }
            /* no training conversation asks a held-out question in any user turn */
            ck_assert(f == 1 || !asks_one_of(&c, held_q, n_held_q));
            cai_chat_conversation_free(&want);
            cai_chat_conversation_free(&c);
            p = nl + 1;
        }
        ck_assert_int_eq(lines, f ? nh : nt);
        free(all);
    }
    /* the conversations past the last training line that were left out */
    for (; i < ec.n; i++) {
        cai_chat_conversation c;
        int h = 0;
        CK_CAI(cai_sft_example_conversation(&ec, i, &c, &h));
        asked += !h && asks_one_of(&c, held_q, n_held_q);
        cai_chat_conversation_free(&c);
    }
    ck_assert_int_eq(asked, left);
    ck_assert_int_gt(left, 0); /* a split by conversation alone would have trained on these */
    ck_assert_int_gt(n_held_q, 20);
    /* the data layer's set is these questions, deduplicated and sorted */
    cai_sft_question_set hq;
    CK_CAI(cai_sft_example_held_questions(&ec, &hq));
    ck_assert_int_gt(hq.n, 0);
    ck_assert_int_le(hq.n, n_held_q);
    for (int64_t j = 0; j < n_held_q; j++) ck_assert(cai_sft_question_set_has(&hq, held_q[j]));
    for (int64_t j = 1; j < hq.n; j++) ck_assert_int_lt(strcmp(hq.q[j - 1], hq.q[j]), 0);
    ck_assert(!cai_sft_question_set_has(&hq, "What is 1000 + 1000?"));
    cai_sft_question_set_free(&hq);
    for (int64_t j = 0; j < n_held_q; j++) free(held_q[j]);
    free(held_q);
}
END_TEST

static Suite *make(void) {
    Suite *s = suite_create("sft");
    TCase *tc = tcase_create("templates");
    tcase_add_test(tc, builtin_templates_render_as_infer_did);
    tcase_add_test(tc, template_file_renders_and_its_errors_name_the_field);
    tcase_add_test(tc, missing_special_tokens_are_reported_and_added);
    tcase_add_test(tc, masks_are_exactly_the_assistant_tokens);
    tcase_add_test(tc, overflow_truncates_or_drops);
    suite_add_tcase(s, tc);
    tc = tcase_create("conversations");
    tcase_add_test(tc, conversation_spellings_parse);
    tcase_add_test(tc, malformed_lines_name_line_and_field);
    tcase_add_test(tc, instruction_set_is_deterministic_and_split);
    suite_add_tcase(s, tc);
    tc = tcase_create("datasets");
    tcase_add_unchecked_fixture(tc, setup_tok, teardown_tok);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, preprocess_reads_back_as_direct_tokenization);
    tcase_add_test(tc, preprocess_error_names_line_and_leaves_nothing);
    tcase_add_test(tc, packed_rows_restart_positions_and_number_documents);
    tcase_add_test(tc, packing_is_deterministic_and_first_fit);
    tcase_add_test(tc, loader_is_deterministic_resumable_and_split_over_dp);
    tcase_add_test(tc, mismatched_mask_dataset_is_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) { return run_suite(&argc, &argv, make); }
