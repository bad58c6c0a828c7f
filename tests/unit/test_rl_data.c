/* The rl data layer: preference pairs in both spellings and their errors
 * (file, line, field), encoding with masks on the responses over a shared
 * context, the overflow policy over a file, prompt sets tokenized as
 * colossal-infer tokenizes a chat request, the verifiable rewards on edge
 * strings and their specs, and the embedded prompts and pairs (determinism,
 * the SFT split, correct answers). */
#include "cai_config.h"
#include "colossal/rl.h"

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

static cai_chat_template_t *open_tpl(const char *name, cai_bpe_t *tok) {
    cai_chat_template_t *t = NULL;
    CK_CAI(cai_chat_template_open(name, &t));
    int n_new = 0;
    if (tok) CK_CAI(cai_chat_template_add_tokens(t, tok, &n_new));
    return t;
}

static void write_text(const char *name, const char *text, char *path, size_t cap) {
    path_in(path, cap, name);
    spit(path, text, strlen(text));
}

static void decode(cai_bpe_t *tok, const int32_t *ids, size_t n, cai_byte_buf *out) {
    if (tok) CK_CAI(cai_bpe_decode(tok, ids, n, out));
    else CK_CAI(cai_byte_detokenize(ids, n, out));
}

/* The masked tokens decoded, in order, as one string (caller frees). */
static char *masked_text(cai_bpe_t *tok, const cai_sft_tokens *t) {
    cai_byte_buf b = {0};
    for (size_t i = 0; i < t->len; i++)
        if (t->mask[i]) decode(tok, &t->ids[i], 1, &b);
    char *s = strndup(b.data ? b.data : "", b.len);
    cai_byte_buf_free(&b);
    return s;
}

static size_t first_masked(const cai_sft_tokens *t) {
    size_t i = 0;
    while (i < t->len && !t->mask[i]) i++;
    return i;
}

/* The call fails with `code` and its message holds every one of subs. */
#define EXPECT_ERR(call, code, ...)                                                                          \
    do {                                                                                                     \
        const cai_status st_ = (call);                                                                       \
        ck_assert_msg(st_ == (code), "%s -> %s (%s)", #call, cai_status_str(st_), cai_error_message());      \
        const char *subs_[] = {__VA_ARGS__};                                                                 \
        for (size_t k_ = 0; k_ < sizeof subs_ / sizeof subs_[0]; k_++)                                       \
            ck_assert_msg(strstr(cai_error_message(), subs_[k_]) != NULL, "\"%s\" not in \"%s\"", subs_[k_], \
                          cai_error_message());                                                              \
        cai_error_clear();                                                                                   \
    } while (0)

static cai_status parse_pref(const char *line, cai_rl_pref *p) {
    return cai_rl_pref_parse_line("prefs.jsonl", 3, line, strlen(line), p);
}

static cai_status parse_prompt(const char *line, cai_rl_prompt *p) {
    return cai_rl_prompt_parse_line("prompts.jsonl", 7, line, strlen(line), p);
}

/* ------------------------------------------------------------------ preference pairs */

START_TEST(pref_spellings_parse) {
    cai_rl_pref p;
    /* ColossalChat: context with system and a earlier exchange, two chosen turns */
    CK_CAI(
        parse_pref("{\"context\": [{\"from\": \"system\", \"content\": \"Be brief.\"},"
                   " {\"from\": \"human\", \"content\": \"Hi\"}, {\"from\": \"assistant\", \"content\": \"Hello\"},"
                   " {\"from\": \"human\", \"content\": \"What is 2 + 2?\"}],"
                   " \"chosen\": [{\"from\": \"assistant\", \"content\": \"It is\"},"
                   " {\"from\": \"gpt\", \"value\": \"The answer is 4.\"}],"
                   " \"rejected\": [{\"role\": \"assistant\", \"content\": \"The answer is 5.\"}], \"id\": 9}",
                   &p));
    ck_assert_int_eq(p.n_context, 4);
    ck_assert_int_eq(p.n_chosen, 2);
    ck_assert_int_eq(p.n_rejected, 1);
    ck_assert_str_eq(p.context[0].role, "system");
    ck_assert_str_eq(p.context[1].role, "user");
    ck_assert_str_eq(p.context[3].content, "What is 2 + 2?");
    ck_assert_str_eq(p.chosen[1].role, "assistant");
    ck_assert_str_eq(p.chosen[1].content, "The answer is 4.");
    ck_assert_str_eq(p.rejected[0].content, "The answer is 5.");
    cai_rl_pref_free(&p);
    ck_assert_ptr_null(p.context);
    /* TRL, strings */
    CK_CAI(parse_pref("{\"prompt\": \"What is 1 + 1?\", \"chosen\": \"2\", \"rejected\": \"3\"}", &p));
    ck_assert_int_eq(p.n_context, 1);
    ck_assert_str_eq(p.context[0].role, "user");
    ck_assert_str_eq(p.context[0].content, "What is 1 + 1?");
    ck_assert_int_eq(p.n_chosen, 1);
    ck_assert_str_eq(p.chosen[0].role, "assistant");
    ck_assert_str_eq(p.chosen[0].content, "2");
    ck_assert_str_eq(p.rejected[0].role, "assistant");
    ck_assert_str_eq(p.rejected[0].content, "3");
    cai_rl_pref_free(&p);
    /* TRL, conversational */
    CK_CAI(
        parse_pref("{\"prompt\": [{\"role\": \"user\", \"content\": \"Q\"}],"
                   " \"chosen\": [{\"role\": \"assistant\", \"content\": \"A\"}], \"rejected\": \"B\"}",
                   &p));
    ck_assert_int_eq(p.n_context, 1);
    ck_assert_str_eq(p.chosen[0].content, "A");
    ck_assert_str_eq(p.rejected[0].content, "B");
    cai_rl_pref_free(&p);
    cai_rl_pref_free(&p); /* zeroed: ok */
}
END_TEST

START_TEST(pref_malformed_lines_name_line_and_field) {
    static const struct {
        const char *line, *want;
    } cases[] = {
        {"{\"context\": [{\"role\": \"user\", \"content\": \"Q\"}], \"chosen\": \"A\"}", "field 'rejected': missing"},
        {"{\"context\": [{\"role\": \"user\", \"content\": \"Q\"}], \"rejected\": \"A\"}", "field 'chosen': missing"},
        {"{\"chosen\": \"A\", \"rejected\": \"B\"}", "field 'context': missing"},
        {"{\"context\": [{\"role\": \"system\", \"content\": \"S\"}], \"chosen\": \"A\", \"rejected\": \"B\"}",
         "field 'context': no user turn"},
        {"{\"context\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"A\"}],"
         " \"chosen\": \"A\", \"rejected\": \"B\"}",
         "field 'context[1]': ends with an assistant turn"},
        {"{\"context\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"user\", \"content\": \"R\"}],"
         " \"chosen\": \"A\", \"rejected\": \"B\"}",
         "field 'context[1]': two user turns"},
        {"{\"context\": [{\"role\": \"assistant\", \"content\": \"A\"}, {\"role\": \"user\", \"content\": \"Q\"}],"
         " \"chosen\": \"A\", \"rejected\": \"B\"}",
         "field 'context[0]': starts with the assistant"},
        {"{\"context\": [{\"role\": \"bot\", \"content\": \"Q\"}], \"chosen\": \"A\", \"rejected\": \"B\"}",
         "field 'context[0].role': 'bot' is not one of"},
        {"{\"prompt\": \"Q\", \"chosen\": [], \"rejected\": \"B\"}", "field 'chosen': must not be empty"},
        {"{\"prompt\": \"Q\", \"chosen\": \"A\", \"rejected\": \"\"}", "field 'rejected': must not be empty"},
        {"{\"prompt\": \"Q\", \"chosen\": \"A\", \"rejected\": \"  \"}", "field 'rejected': is only whitespace"},
        {"{\"prompt\": \"Q\", \"chosen\": \"A\", \"rejected\": [{\"role\": \"user\", \"content\": \"B\"}]}",
         "field 'rejected[0]': a response holds assistant turns only"},
        {"{\"prompt\": \"Q\", \"chosen\": [{\"role\": \"assistant\"}], \"rejected\": \"B\"}",
         "field 'chosen[0].content': missing"},
        {"{\"prompt\": 5, \"chosen\": \"A\", \"rejected\": \"B\"}", "field 'prompt': must be a string or an array"},
        {"{\"prompt\": \"Q\", \"context\": \"Q\", \"chosen\": \"A\", \"rejected\": \"B\"}",
         "fields 'context' and 'prompt'"},
        {"{\"prompt\": \"Q\", \"chosen\": \"A\", \"rejected\": 7}", "field 'rejected': must be a string or an array"},
        {"[1, 2]", "a line must be a JSON object"},
        {"{\"prompt\": \"Q\",", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cai_rl_pref p;
        const cai_status st = parse_pref(cases[i].line, &p);
        ck_assert_msg(st == CAI_ERR_FORMAT, "case %zu: %s", i, cai_status_str(st));
        ck_assert_msg(strncmp(cai_error_message(), "prefs.jsonl:3: ", 15) == 0, "case %zu: \"%s\"", i,
                      cai_error_message());
        ck_assert_msg(strstr(cai_error_message(), cases[i].want), "case %zu: \"%s\" not in \"%s\"", i, cases[i].want,
                      cai_error_message());
        ck_assert_ptr_null(p.context);
        cai_error_clear();
    }
    /* a file: the first bad line fails the load, named with its number */
    char path[300];
    write_text("bad_prefs.jsonl",
               "{\"prompt\": \"Q\", \"chosen\": \"A\", \"rejected\": \"B\"}\n\n"
               "{\"prompt\": \"Q\", \"chosen\": \"A\"}\n{\"prompt\": 1}\n",
               path, sizeof path);
    cai_chat_template_t *t = open_tpl("plain", NULL);
    cai_rl_pref_set_t *s = (cai_rl_pref_set_t *)1;
    char want[400];
    snprintf(want, sizeof want, "%s:3: field 'rejected': missing", path);
    EXPECT_ERR(cai_rl_pref_set_load(path, t, NULL, 0, CAI_SFT_TRUNCATE, &s), CAI_ERR_FORMAT, want);
    ck_assert_ptr_null(s);
    EXPECT_ERR(cai_rl_pref_set_load("/nonexistent/x.jsonl", t, NULL, 0, CAI_SFT_TRUNCATE, &s), CAI_ERR_IO,
               "/nonexistent/x.jsonl");
    cai_chat_template_free(t);
}
END_TEST

/* Both sides start with the tokens of the prompt colossal-infer builds for
 * the context; the masks mark exactly each response's content and end. */
static void check_pref_encode(cai_bpe_t *tok, const char *tpl, const char *lead, const char *end) {
    cai_chat_template_t *t = open_tpl(tpl, tok);
    cai_rl_pref p;
    CK_CAI(
        parse_pref("{\"context\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                   " {\"role\": \"user\", \"content\": \"What is 2 + 2?\"}],"
                   " \"chosen\": [{\"role\": \"assistant\", \"content\": \"The answer is 4.\"}],"
                   " \"rejected\": [{\"role\": \"assistant\", \"content\": \"Tom has 5 apples.\"},"
                   " {\"role\": \"assistant\", \"content\": \"The answer is 8.\"}]}",
                   &p));
    cai_sft_tokens c = {0}, r = {0};
    CK_CAI(cai_rl_pref_encode(t, tok, &p, &c, &r));
    /* the shared context: the infer prompt, token for token */
    cai_byte_buf text = {0};
    cai_token_buf want = {0};
    CK_CAI(cai_chat_template_render(t, p.context, p.n_context, 1, &text));
    if (tok) CK_CAI(cai_bpe_encode(tok, text.data, text.len, &want));
    else CK_CAI(cai_byte_tokenize(NULL, text.data, text.len, &want));
    const size_t fc = first_masked(&c), fr = first_masked(&r);
    ck_assert_uint_eq(fc, want.len);
    ck_assert_uint_eq(fr, want.len);
    ck_assert_int_eq(memcmp(c.ids, want.ids, want.len * sizeof *want.ids), 0);
    ck_assert_int_eq(memcmp(r.ids, want.ids, want.len * sizeof *want.ids), 0);
    /* the masks: the response contents and their ends, nothing else */
    char exp[256];
    char *mc = masked_text(tok, &c), *mr = masked_text(tok, &r);
    snprintf(exp, sizeof exp, "%sThe answer is 4.%s", lead, end);
    ck_assert_str_eq(mc, exp);
    snprintf(exp, sizeof exp, "%sTom has 5 apples.%s%sThe answer is 8.%s", lead, end, lead, end);
    ck_assert_str_eq(mr, exp);
    /* each side is cai_sft_encode of the whole conversation */
    cai_chat_message all[3] = {p.context[0], p.context[1], p.chosen[0]};
    cai_sft_tokens direct = {0};
    CK_CAI(cai_sft_encode(t, tok, all, 3, &direct));
    ck_assert_uint_eq(direct.len, c.len);
    ck_assert_int_eq(memcmp(direct.ids, c.ids, c.len * sizeof *c.ids), 0);
    ck_assert_int_eq(memcmp(direct.mask, c.mask, c.len), 0);
    free(mc);
    free(mr);
    cai_sft_tokens_free(&direct);
    cai_sft_tokens_free(&c);
    cai_sft_tokens_free(&r);
    cai_byte_buf_free(&text);
    cai_token_buf_free(&want);
    cai_rl_pref_free(&p);
    cai_chat_template_free(t);
}

START_TEST(pref_encode_shares_context_and_masks_responses) {
    cai_bpe_t *tok = tiny_tokenizer();
    check_pref_encode(tok, "chatml", "", "<|im_end|>");
    check_pref_encode(NULL, "chatml", "", "<|im_end|>");
    /* plain's generation prompt is "assistant:", so the space after it is learned */
    check_pref_encode(NULL, "plain", " ", "\n");
    cai_bpe_free(tok);
}
END_TEST

START_TEST(pref_set_counts_truncated_and_dropped) {
    /* bytes and the plain template: lengths are byte counts */
    cai_chat_template_t *t = open_tpl("plain", NULL);
    cai_chat_message q = {"user", "Q?"};
    cai_byte_buf text = {0};
    cai_token_buf ids = {0};
    CK_CAI(cai_rl_prompt_encode(t, NULL, &q, 1, &text, &ids));
    const int64_t P = (int64_t)ids.len; /* "user: Q?\nassistant:" */
    ck_assert_int_eq(P, (int64_t)strlen("user: Q?\nassistant:"));
    const int64_t seq_len = P + 10; /* fits a response of up to 11 - 1 bytes after the prompt */
    char path[300];
    write_text("prefs.jsonl",
               "{\"prompt\": \"Q?\", \"chosen\": \"ok\", \"rejected\": \"no\"}\n"
               "\n"
               "{\"prompt\": \"Q?\", \"chosen\": \"a much longer answer than fits\", \"rejected\": \"no\"}\n"
               "{\"prompt\": \"Q? and a question far longer than the sequence\", \"chosen\": \"a\", \"rejected\": "
               "\"b\"}\n"
               "{\"context\": [{\"role\": \"user\", \"content\": \"Q?\"}], \"chosen\": \"yes\", \"rejected\": "
               "\"nope\"}\n",
               path, sizeof path);
    cai_rl_pref_set_t *s;
    cai_rl_data_stats st;
    /* truncate: the long response is cut, the long context dropped */
    CK_CAI(cai_rl_pref_set_load(path, t, NULL, seq_len, CAI_SFT_TRUNCATE, &s));
    cai_rl_pref_set_stats(s, &st);
    ck_assert_int_eq(st.lines, 4);
    ck_assert_int_eq(st.kept, 3);
    ck_assert_int_eq(st.truncated, 1);
    ck_assert_int_eq(st.dropped, 1);
    ck_assert_int_eq(cai_rl_pref_set_size(s), 3);
    const cai_sft_tokens *c, *r;
    CK_CAI(cai_rl_pref_set_pair(s, 0, &c, &r));
    ck_assert_uint_eq(c->len, (size_t)P + strlen(" ok\n"));
    ck_assert_uint_eq(r->len, (size_t)P + strlen(" no\n"));
    CK_CAI(cai_rl_pref_set_pair(s, 1, &c, &r));
    ck_assert_uint_eq(c->len, (size_t)seq_len + 1);
    ck_assert_uint_eq(first_masked(c), (size_t)P);
    ck_assert_uint_eq(r->len, (size_t)P + strlen(" no\n"));
    CK_CAI(cai_rl_pref_set_pair(s, 2, &c, &r));
    ck_assert_uint_eq(c->len, (size_t)P + strlen(" yes\n"));
    ck_assert_uint_eq(r->len, (size_t)P + strlen(" nope\n"));
    EXPECT_ERR(cai_rl_pref_set_pair(s, 3, &c, &r), CAI_ERR_INVALID_ARG, "3 of 3");
    cai_rl_pref_set_free(s);
    /* drop: both long pairs go */
    CK_CAI(cai_rl_pref_set_load(path, t, NULL, seq_len, CAI_SFT_DROP, &s));
    cai_rl_pref_set_stats(s, &st);
    ck_assert_int_eq(st.lines, 4);
    ck_assert_int_eq(st.kept, 2);
    ck_assert_int_eq(st.truncated, 0);
    ck_assert_int_eq(st.dropped, 2);
    CK_CAI(cai_rl_pref_set_pair(s, 1, &c, &r));
    ck_assert_uint_eq(r->len, (size_t)P + strlen(" nope\n"));
    cai_rl_pref_set_free(s);
    /* no limit: everything kept whole */
    CK_CAI(cai_rl_pref_set_load(path, t, NULL, 0, CAI_SFT_DROP, &s));
    cai_rl_pref_set_stats(s, &st);
    ck_assert_int_eq(st.kept, 4);
    ck_assert_int_eq(st.dropped + st.truncated, 0);
    cai_rl_pref_set_free(s);
    cai_rl_pref_set_free(NULL);
    cai_byte_buf_free(&text);
    cai_token_buf_free(&ids);
    cai_chat_template_free(t);
}
END_TEST

/* ------------------------------------------------------------------ prompts */

START_TEST(prompt_lines_parse_and_errors_name_the_field) {
    cai_rl_prompt p;
    CK_CAI(
        parse_prompt("{\"messages\": [{\"role\": \"system\", \"content\": \"S\"},"
                     " {\"role\": \"user\", \"content\": \"What is 6 times 7?\"}], \"answer\": \"42\"}",
                     &p));
    ck_assert_int_eq(p.n_messages, 2);
    ck_assert_str_eq(p.messages[1].content, "What is 6 times 7?");
    ck_assert_str_eq(p.answer, "42");
    cai_rl_prompt_free(&p);
    CK_CAI(parse_prompt("{\"prompt\": \"Q\", \"answer\": 42}", &p));
    ck_assert_int_eq(p.n_messages, 1);
    ck_assert_str_eq(p.messages[0].role, "user");
    ck_assert_str_eq(p.answer, "42");
    cai_rl_prompt_free(&p);
    CK_CAI(parse_prompt("{\"prompt\": \"Q\", \"answer\": -2.5}", &p));
    ck_assert_str_eq(p.answer, "-2.5");
    cai_rl_prompt_free(&p);
    CK_CAI(parse_prompt("{\"prompt\": \"Q\"}", &p));
    ck_assert_ptr_null(p.answer);
    cai_rl_prompt_free(&p);
    CK_CAI(parse_prompt("{\"prompt\": \"Q\", \"answer\": null}", &p));
    ck_assert_ptr_null(p.answer);
    cai_rl_prompt_free(&p);
    EXPECT_ERR(parse_prompt("{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}]}", &p), CAI_ERR_FORMAT,
               "prompts.jsonl:7: field 'messages': no user turn");
    EXPECT_ERR(parse_prompt("{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"},"
                            " {\"role\": \"assistant\", \"content\": \"A\"}]}",
                            &p),
               CAI_ERR_FORMAT, "prompts.jsonl:7: field 'messages[1]': ends with an assistant turn");
    EXPECT_ERR(parse_prompt("{\"prompt\": \"Q\", \"answer\": [1]}", &p), CAI_ERR_FORMAT,
               "prompts.jsonl:7: field 'answer': must be a string or a number");
    EXPECT_ERR(parse_prompt("{\"answer\": \"1\"}", &p), CAI_ERR_FORMAT, "prompts.jsonl:7: field 'messages': missing");
    EXPECT_ERR(parse_prompt("{\"prompt\": \"\"}", &p), CAI_ERR_FORMAT,
               "prompts.jsonl:7: field 'prompt': must not be empty");
    EXPECT_ERR(parse_prompt("{\"prompt\": \"Q\", \"messages\": []}", &p), CAI_ERR_FORMAT,
               "prompts.jsonl:7: fields 'messages' and 'prompt'");
    ck_assert_ptr_null(p.messages);
    ck_assert_ptr_null(p.answer);
}
END_TEST

START_TEST(prompt_set_tokenizes_as_infer_and_drops_long_prompts) {
    cai_bpe_t *tok = tiny_tokenizer();
    cai_chat_template_t *t = open_tpl("chatml", tok);
    char path[300];
    write_text("prompts.jsonl",
               "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
               " {\"role\": \"user\", \"content\": \"What is 2 + 2?\"}], \"answer\": \"4\"}\n"
               "{\"prompt\": \"Continue this story: Once upon a time there was a girl named Mia. Lily went to the "
               "park with her friend Ben. Tom has 5 apples and gets 3 more.\", \"answer\": 8}\n"
               "   \n"
               "{\"prompt\": \"How many apples does Tom have now?\"}\n",
               path, sizeof path);
    /* the lengths without a limit, then a limit between the short and the long */
    cai_rl_prompt_set_t *s;
    CK_CAI(cai_rl_prompt_set_load(path, t, tok, 0, &s));
    ck_assert_int_eq(cai_rl_prompt_set_size(s), 3);
    int64_t len[3];
    for (int i = 0; i < 3; i++) CK_CAI(cai_rl_prompt_set_get(s, i, NULL, &len[i], NULL, NULL));
    ck_assert_int_gt(len[1], len[0]);
    ck_assert_int_gt(len[1], len[2]);
    const int64_t limit = len[0] > len[2] ? len[0] : len[2];
    cai_rl_prompt_set_free(s);
    CK_CAI(cai_rl_prompt_set_load(path, t, tok, limit, &s));
    cai_rl_data_stats st;
    cai_rl_prompt_set_stats(s, &st);
    ck_assert_int_eq(st.lines, 3);
    ck_assert_int_eq(st.kept, 2);
    ck_assert_int_eq(st.dropped, 1);
    ck_assert_int_eq(st.truncated, 0);
    ck_assert_int_eq(cai_rl_prompt_set_size(s), 2);
    /* colossal-infer's chat request: render with the generation prompt,
     * then encode the whole text with special tokens recognised */
    static const cai_chat_message m0[] = {{"system", "Be brief."}, {"user", "What is 2 + 2?"}};
    static const cai_chat_message m2[] = {{"user", "How many apples does Tom have now?"}};
    const cai_chat_message *msgs[2] = {m0, m2};
    const int nmsg[2] = {2, 1};
    const char *answers[2] = {"4", NULL};
    for (int i = 0; i < 2; i++) {
        cai_byte_buf text = {0};
        cai_token_buf want = {0};
        CK_CAI(cai_chat_template_render(t, msgs[i], nmsg[i], 1, &text));
        CK_CAI(cai_bpe_encode(tok, text.data, text.len, &want));
        const int32_t *ids;
        int64_t n;
        const char *got_text, *ans;
        CK_CAI(cai_rl_prompt_set_get(s, i, &ids, &n, &got_text, &ans));
        ck_assert_str_eq(got_text, text.data);
        ck_assert_int_eq(n, (int64_t)want.len);
        ck_assert_int_eq(memcmp(ids, want.ids, want.len * sizeof *ids), 0);
        if (answers[i]) ck_assert_str_eq(ans, answers[i]);
        else ck_assert_ptr_null(ans);
        /* the chat markers are single special tokens */
        int32_t im_start;
        CK_CAI(cai_bpe_token_id(tok, "<|im_start|>", &im_start));
        ck_assert_int_eq(ids[0], im_start);
        cai_byte_buf_free(&text);
        cai_token_buf_free(&want);
    }
    CK_CAI(cai_rl_prompt_set_get(s, 0, NULL, NULL, NULL, NULL)); /* outputs may be NULL */
    EXPECT_ERR(cai_rl_prompt_set_get(s, 2, NULL, NULL, NULL, NULL), CAI_ERR_INVALID_ARG, "2 of 2");
    cai_rl_prompt_set_free(s);
    /* a bad line fails the load, naming it */
    write_text("bad_prompts.jsonl",
               "{\"prompt\": \"Q\"}\n{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}]}\n", path,
               sizeof path);
    char want[400];
    snprintf(want, sizeof want, "%s:2: field 'messages': no user turn", path);
    s = (cai_rl_prompt_set_t *)1;
    EXPECT_ERR(cai_rl_prompt_set_load(path, t, tok, 0, &s), CAI_ERR_FORMAT, want);
    ck_assert_ptr_null(s);
    cai_chat_template_free(t);
    cai_bpe_free(tok);
}
END_TEST

/* ------------------------------------------------------------------ rewards */

static double em(const char *response, const char *answer) {
    double r = -1;
    CK_CAI(cai_rl_reward_exact_match(NULL, "p", response, answer, &r));
    return r;
}

static double fmt(const char *response) {
    double r = -1;
    CK_CAI(cai_rl_reward_format(NULL, "p", response, NULL, &r));
    return r;
}

static const char *extract(const char *response) {
    static char buf[128];
    cai_rl_extract_answer(response, buf, sizeof buf);
    return buf;
}

START_TEST(exact_match_on_edge_strings) {
    ck_assert_str_eq(extract("The answer is 1,234."), "1,234");
    ck_assert_str_eq(extract("Well... the answer is -7. Or 9"), "-7");
    ck_assert_str_eq(extract("5 - 3 = 2"), "2");
    ck_assert_str_eq(extract("it is 3.5 now"), "3.5");
    ck_assert_str_eq(extract("no number here"), "no number here");
    ck_assert_double_eq(em("The answer is 1,234.", "1234"), 1.0);
    ck_assert_double_eq(em("The answer is 1,234.", "1,234"), 1.0);
    ck_assert_double_eq(em("The answer is 1,234.", "1234."), 1.0);
    ck_assert_double_eq(em("The answer is 1,235.", "1234"), 0.0);
    /* the phrase wins over numbers after it; the last phrase wins */
    ck_assert_double_eq(em("The answer is 12. Tom has 5 apples.", "12"), 1.0);
    ck_assert_double_eq(em("The answer is 12. Tom has 5 apples.", "5"), 0.0);
    ck_assert_double_eq(em("The answer is 3. No wait, the answer is 4.", "4"), 1.0);
    /* without the phrase: the last number */
    ck_assert_double_eq(em("First 3, then 5", "5"), 1.0);
    ck_assert_double_eq(em("First 3, then 5", "3"), 0.0);
    ck_assert_double_eq(em("5 - 3 = 2", "2"), 1.0);
    ck_assert_double_eq(em("5 - 3 = 2", "-3"), 0.0);
    /* negative numbers */
    ck_assert_double_eq(em("The answer is -7.", "-7"), 1.0);
    ck_assert_double_eq(em("The answer is -7.", "7"), 0.0);
    ck_assert_double_eq(em("it fell to -15", "-15"), 1.0);
    /* numeric comparison */
    ck_assert_double_eq(em("The answer is 42", "42.0"), 1.0);
    ck_assert_double_eq(em("The answer is 0.5.", ".5"), 0.0); /* ".5" is not a number here: strings differ */
    /* no number */
    ck_assert_double_eq(em("no number here", "5"), 0.0);
    ck_assert_double_eq(em("", "5"), 0.0);
    ck_assert_double_eq(em(NULL, "5"), 0.0);
    /* non-numeric answers: trimmed strings */
    ck_assert_double_eq(em("The answer is Paris.", "  Paris "), 1.0);
    ck_assert_double_eq(em("The answer is Paris.", "paris"), 0.0);
    /* a missing reference names the prompt */
    double r;
    EXPECT_ERR(cai_rl_reward_exact_match(NULL, "What is 2 + 2?", "4", NULL, &r), CAI_ERR_INVALID_ARG, "What is 2 + 2?",
               "no reference answer");
}
END_TEST

START_TEST(format_reward_on_edge_strings) {
    ck_assert_double_eq(fmt("The answer is 8."), 1.0);
    ck_assert_double_eq(fmt("  The answer is 1234.\n\n"), 1.0);
    ck_assert_double_eq(fmt("The answer is -8."), 1.0);
    ck_assert_double_eq(fmt("The answer is 8. Thanks!"), 0.0);
    ck_assert_double_eq(fmt("The answer is 8"), 0.0);
    ck_assert_double_eq(fmt("The answer is 1,234."), 0.0);
    ck_assert_double_eq(fmt("The answer is 8.5."), 0.0);
    ck_assert_double_eq(fmt("The answer is eight."), 0.0);
    ck_assert_double_eq(fmt("The answer is ."), 0.0);
    ck_assert_double_eq(fmt("the answer is 8."), 0.0);
    ck_assert_double_eq(fmt("So: The answer is 8."), 0.0);
    ck_assert_double_eq(fmt("8"), 0.0);
    ck_assert_double_eq(fmt(""), 0.0);
    ck_assert_double_eq(fmt(NULL), 0.0);
}
END_TEST

/* A registered reward: ctx holds the value it gives. */
static cai_status constant_reward(void *ctx, const char *prompt, const char *response, const char *answer,
                                  double *reward) {
    (void)prompt, (void)response, (void)answer;
    *reward = *(const double *)ctx;
    return CAI_OK;
}

START_TEST(reward_specs_weigh_and_refuse_bad_tokens) {
    cai_rl_reward_spec s;
    CK_CAI(cai_rl_reward_spec_parse("exact_match,format:0.1", &s));
    ck_assert_int_eq(s.n, 2);
    ck_assert_str_eq(s.names[0], "exact_match");
    ck_assert_str_eq(s.names[1], "format");
    ck_assert_double_eq(s.weights[0], 1.0);
    ck_assert_double_eq(s.weights[1], 0.1);
    ck_assert_int_eq(cai_rl_reward_spec_find(&s, "format"), 1);
    ck_assert_int_eq(cai_rl_reward_spec_find(&s, "nope"), -1);
    double total, parts[CAI_RL_MAX_REWARDS];
    CK_CAI(cai_rl_reward_spec_eval(&s, "What is 4 + 4?", "The answer is 8.", "8", &total, parts));
    ck_assert_double_eq_tol(total, 1.1, 1e-12);
    ck_assert_double_eq(parts[0], 1.0);
    ck_assert_double_eq(parts[1], 1.0);
    CK_CAI(cai_rl_reward_spec_eval(&s, "What is 4 + 4?", "8", "8", &total, parts));
    ck_assert_double_eq_tol(total, 1.0, 1e-12);
    ck_assert_double_eq(parts[1], 0.0);
    CK_CAI(cai_rl_reward_spec_eval(&s, "What is 4 + 4?", "The answer is 9.", "8", &total, NULL));
    ck_assert_double_eq_tol(total, 0.1, 1e-12);
    EXPECT_ERR(cai_rl_reward_spec_eval(&s, "What is 4 + 4?", "8", NULL, &total, parts), CAI_ERR_INVALID_ARG,
               "What is 4 + 4?");
    cai_rl_reward_spec_free(&s);
    /* spaces around tokens and a negative weight */
    CK_CAI(cai_rl_reward_spec_parse(" format : -0.5 , exact_match ", &s));
    ck_assert_int_eq(s.n, 2);
    ck_assert_double_eq(s.weights[0], -0.5);
    cai_rl_reward_spec_free(&s);
    /* a registered reward joins the registry and the specs */
    static double seven = 7.0;
    CK_CAI(cai_rl_reward_register("seven", constant_reward, &seven));
    EXPECT_ERR(cai_rl_reward_register("seven", constant_reward, &seven), CAI_ERR_INVALID_ARG, "\"seven\"",
               "registered already");
    EXPECT_ERR(cai_rl_reward_register("bad name", constant_reward, NULL), CAI_ERR_INVALID_ARG, "\"bad name\"");
    char names[256];
    cai_rl_reward_names(names, sizeof names);
    ck_assert_str_eq(names, "exact_match, format, seven");
    CK_CAI(cai_rl_reward_spec_parse("seven:2,format", &s));
    CK_CAI(cai_rl_reward_spec_eval(&s, NULL, "The answer is 3.", NULL, &total, parts));
    ck_assert_double_eq(parts[0], 7.0);
    ck_assert_double_eq(total, 15.0);
    cai_rl_reward_spec_free(&s);
    /* parse errors name the token */
    EXPECT_ERR(cai_rl_reward_spec_parse("exact_match,nosuch:0.5", &s), CAI_ERR_CONFIG, "unknown reward \"nosuch\"",
               "known: exact_match, format, seven");
    ck_assert_int_eq(s.n, 0);
    EXPECT_ERR(cai_rl_reward_spec_parse("exact_match:abc", &s), CAI_ERR_CONFIG, "\"exact_match:abc\"",
               "weight \"abc\" is not a finite number");
    EXPECT_ERR(cai_rl_reward_spec_parse("format:", &s), CAI_ERR_CONFIG, "\"format:\"", "missing");
    EXPECT_ERR(cai_rl_reward_spec_parse("format:inf", &s), CAI_ERR_CONFIG, "\"inf\"");
    EXPECT_ERR(cai_rl_reward_spec_parse("exact_match,,format", &s), CAI_ERR_CONFIG, "empty entry");
    EXPECT_ERR(cai_rl_reward_spec_parse("", &s), CAI_ERR_CONFIG, "empty entry");
    EXPECT_ERR(cai_rl_reward_spec_parse("format,format:2", &s), CAI_ERR_CONFIG, "\"format\" given twice");
    EXPECT_ERR(cai_rl_reward_spec_parse("ex act:1", &s), CAI_ERR_CONFIG, "\"ex act\" is not a reward name");
    ck_assert_int_eq(s.n, 0);
    cai_rl_reward_spec_free(&s);
}
END_TEST

/* ------------------------------------------------------------------ embedded examples */

/* The embedded question's answer, computed from its text (-1: not one). */
static long long solve(const char *q) {
    int a, b;
    char who[32], thing[32];
    if (sscanf(q, "What is %d + %d?", &a, &b) == 2) return a + b;
    if (sscanf(q, "What is %d - %d?", &a, &b) == 2) return a - b;
    if (sscanf(q, "What is %d times %d?", &a, &b) == 2) return (long long)a * b;
    if (sscanf(q, "What is %d divided by %d?", &a, &b) == 2) return b ? a / b : -1;
    if (sscanf(q, "%31s has %d %31s and gets %d more.", who, &a, thing, &b) == 4) return a + b;
    if (sscanf(q, "%31s has %d %31s and gives away %d.", who, &a, thing, &b) == 4) return a - b;
    return -1;
}

/* The lines of a file, each a NUL-terminated string in one buffer. */
static char **read_lines(const char *path, int64_t *n, char **buf) {
    size_t len;
    char *all = (char *)slurp(path, &len);
    char **lines = NULL;
    int64_t k = 0;
    for (char *p = all; p < all + len;) {
        char *nl = memchr(p, '\n', (size_t)(all + len - p));
        ck_assert_ptr_nonnull(nl);
        *nl = 0;
        lines = realloc(lines, (size_t)(k + 1) * sizeof *lines);
        lines[k++] = p;
        p = nl + 1;
    }
    *n = k;
    *buf = all;
    return lines;
}

static int files_equal(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *pa = slurp(a, &na), *pb = slurp(b, &nb);
    const int eq = na == nb && memcmp(pa, pb, na) == 0;
    free(pa);
    free(pb);
    return eq;
}

START_TEST(example_prompts_follow_the_sft_split_with_correct_answers) {
    const cai_sft_example_config ec = {300, 11, 20};
    char tr[300], he[300], tr2[300], he2[300];
    path_in(tr, sizeof tr, "p_train.jsonl");
    path_in(he, sizeof he, "p_held.jsonl");
    path_in(tr2, sizeof tr2, "p_train2.jsonl");
    path_in(he2, sizeof he2, "p_held2.jsonl");
    int64_t nt, nh, nt2, nh2;
    CK_CAI(cai_rl_example_prompts_write(&ec, tr, he, &nt, &nh));
    CK_CAI(cai_rl_example_prompts_write(&ec, tr2, he2, &nt2, &nh2));
    ck_assert_int_eq(nt, nt2);
    ck_assert_int_eq(nh, nh2);
    ck_assert(files_equal(tr, tr2));
    ck_assert(files_equal(he, he2));
    int64_t n[2];
    char *buf[2];
    char **lines[2] = {read_lines(tr, &n[0], &buf[0]), read_lines(he, &n[1], &buf[1])};
    ck_assert_int_eq(n[0], nt);
    ck_assert_int_eq(n[1], nh);
    /* line by line, the arithmetic conversations of each split in order */
    int64_t at[2] = {0, 0}, stories = 0;
    for (int64_t i = 0; i < ec.n; i++) {
        cai_chat_conversation c;
        int held;
        CK_CAI(cai_sft_example_conversation(&ec, i, &c, &held));
        const char *q = c.messages[c.n_messages - 2].content;
        if (strncmp(c.messages[c.n_messages - 1].content, "The answer is ", 14) != 0) {
            stories++;
            cai_chat_conversation_free(&c);
            continue;
        }
        ck_assert_int_lt(at[held], n[held]);
        const char *line = lines[held][at[held]];
        cai_rl_prompt p;
        CK_CAI(cai_rl_prompt_parse_line(held ? he : tr, at[held] + 1, line, strlen(line), &p));
        at[held]++;
        ck_assert_int_eq(p.n_messages, 1);
        ck_assert_str_eq(p.messages[0].role, "user");
        ck_assert_str_eq(p.messages[0].content, q);
        const long long want = solve(q);
        ck_assert_msg(want >= 0, "unknown question \"%s\"", q);
        ck_assert_ptr_nonnull(p.answer);
        char num[32];
        snprintf(num, sizeof num, "%lld", want);
        ck_assert_str_eq(p.answer, num);
        /* the reward of the SFT answer on this prompt is 1 */
        double r;
        CK_CAI(cai_rl_reward_exact_match(NULL, q, c.messages[c.n_messages - 1].content, p.answer, &r));
        ck_assert_double_eq(r, 1.0);
        cai_rl_prompt_free(&p);
        cai_chat_conversation_free(&c);
    }
    ck_assert_int_eq(at[0], n[0]);
    ck_assert_int_eq(at[1], n[1]);
    ck_assert_int_gt(nt, 100);
    ck_assert_int_gt(nh, 10);
    ck_assert_int_gt(stories, 20); /* the story conversations are left out */
    ck_assert_int_eq(nt + nh + stories, ec.n);
    /* both load as prompt sets */
    cai_chat_template_t *t = open_tpl("chatml", NULL);
    cai_rl_prompt_set_t *s;
    CK_CAI(cai_rl_prompt_set_load(he, t, NULL, 0, &s));
    ck_assert_int_eq(cai_rl_prompt_set_size(s), nh);
    cai_rl_prompt_set_free(s);
    cai_chat_template_free(t);
    /* another seed, other prompts */
    const cai_sft_example_config ec2 = {300, 12, 20};
    CK_CAI(cai_rl_example_prompts_write(&ec2, tr2, NULL, &nt2, NULL));
    ck_assert(!files_equal(tr, tr2));
    for (int f = 0; f < 2; f++) {
        free(lines[f]);
        free(buf[f]);
    }
}
END_TEST

START_TEST(example_prefs_prefer_the_right_answer) {
    const cai_sft_example_config ec = {400, 5, 20};
    char tr[300], he[300], tr2[300];
    path_in(tr, sizeof tr, "q_train.jsonl");
    path_in(he, sizeof he, "q_held.jsonl");
    path_in(tr2, sizeof tr2, "q_train2.jsonl");
    int64_t nt, nh, nt2;
    CK_CAI(cai_rl_example_prefs_write(&ec, tr, he, &nt, &nh));
    CK_CAI(cai_rl_example_prefs_write(&ec, tr2, NULL, &nt2, NULL));
    ck_assert_int_eq(nt, nt2);
    ck_assert(files_equal(tr, tr2));
    /* the prompt files split the same way */
    int64_t pt, ph;
    CK_CAI(cai_rl_example_prompts_write(&ec, NULL, NULL, &pt, &ph));
    ck_assert_int_eq(pt, nt);
    ck_assert_int_eq(ph, nh);
    cai_rl_reward_spec spec;
    CK_CAI(cai_rl_reward_spec_parse("exact_match,format", &spec));
    const char *paths[2] = {tr, he};
    int64_t malformed = 0, wrong_number = 0, total = 0;
    for (int f = 0; f < 2; f++) {
        int64_t n;
        char *buf;
        char **lines = read_lines(paths[f], &n, &buf);
        ck_assert_int_eq(n, f ? nh : nt);
        for (int64_t i = 0; i < n; i++) {
            cai_rl_pref p;
            CK_CAI(cai_rl_pref_parse_line(paths[f], i + 1, lines[i], strlen(lines[i]), &p));
            ck_assert_int_eq(p.n_context, 1);
            ck_assert_int_eq(p.n_chosen, 1);
            ck_assert_int_eq(p.n_rejected, 1);
            const long long want = solve(p.context[0].content);
            ck_assert_msg(want >= 0, "unknown question \"%s\"", p.context[0].content);
            char right[64], num[32];
            snprintf(right, sizeof right, "The answer is %lld.", want);
            snprintf(num, sizeof num, "%lld", want);
            ck_assert_str_eq(p.chosen[0].content, right);
            ck_assert_str_ne(p.rejected[0].content, right);
            double tc, trj, parts[2];
            CK_CAI(cai_rl_reward_spec_eval(&spec, p.context[0].content, p.chosen[0].content, num, &tc, NULL));
            CK_CAI(cai_rl_reward_spec_eval(&spec, p.context[0].content, p.rejected[0].content, num, &trj, parts));
            ck_assert_double_eq(tc, 2.0);
            ck_assert_double_eq_tol(trj, 1.0, 1e-12); /* exactly one of value and form is wrong */
            if (parts[1] == 0.0) malformed++;
            else wrong_number++;
            total++;
            cai_rl_pref_free(&p);
        }
        free(lines);
        free(buf);
    }
    cai_rl_reward_spec_free(&spec);
    ck_assert_int_eq(total, nt + nh);
    ck_assert_int_gt(malformed, total / 20);
    ck_assert_int_lt(malformed, total * 2 / 5);
    ck_assert_int_gt(wrong_number, total / 2);
    /* the pairs load as a preference set, whole */
    cai_chat_template_t *t = open_tpl("chatml", NULL);
    cai_rl_pref_set_t *s;
    CK_CAI(cai_rl_pref_set_load(tr, t, NULL, 0, CAI_SFT_DROP, &s));
    cai_rl_data_stats st;
    cai_rl_pref_set_stats(s, &st);
    ck_assert_int_eq(st.lines, nt);
    ck_assert_int_eq(st.kept, nt);
    cai_rl_pref_set_free(s);
    cai_chat_template_free(t);
    /* no temporary files are left behind */
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp", tr);
    ck_assert_int_ne(access(tmp, F_OK), 0);
}
END_TEST

static Suite *make(void) {
    Suite *s = suite_create("rl_data");
    TCase *tc = tcase_create("prefs");
    tcase_add_test(tc, pref_spellings_parse);
    tcase_add_test(tc, pref_malformed_lines_name_line_and_field);
    tcase_add_test(tc, pref_encode_shares_context_and_masks_responses);
    tcase_add_test(tc, pref_set_counts_truncated_and_dropped);
    suite_add_tcase(s, tc);
    tc = tcase_create("prompts");
    tcase_add_test(tc, prompt_lines_parse_and_errors_name_the_field);
    tcase_add_test(tc, prompt_set_tokenizes_as_infer_and_drops_long_prompts);
    suite_add_tcase(s, tc);
    tc = tcase_create("rewards");
    tcase_add_test(tc, exact_match_on_edge_strings);
    tcase_add_test(tc, format_reward_on_edge_strings);
    tcase_add_test(tc, reward_specs_weigh_and_refuse_bad_tokens);
    suite_add_tcase(s, tc);
    tc = tcase_create("examples");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, example_prompts_follow_the_sft_split_with_correct_answers);
    tcase_add_test(tc, example_prefs_prefer_the_right_answer);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) { return run_suite(&argc, &argv, make); }
