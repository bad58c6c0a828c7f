/* The alignment data and rewards: preference lines in each spelling and
 * every refusal naming file, line and field; pair tokens whose masks are
 * exactly the responses over one shared context (the prompt colossal-infer
 * builds); the overflow policy's counts; prompt sets tokenized as
 * colossal-infer does; the verifiable rewards on edge strings and their
 * specs; the embedded examples' determinism, split and answers. */
#include "cai_config.h"
#include "colossal/rl.h"

#include "test_indexed_util.h"
#include <math.h>
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
    if (tok) CK_CAI(cai_chat_template_add_tokens(t, tok, NULL));
    return t;
}

static void write_text(const char *name, const char *text, char *path, size_t cap) {
    path_in(path, cap, name);
    spit(path, text, strlen(text));
}

static void decode(const cai_bpe_t *tok, const int32_t *ids, size_t n, cai_byte_buf *out) {
    if (tok) CK_CAI(cai_bpe_decode(tok, ids, n, out));
    else CK_CAI(cai_byte_detokenize(ids, n, out));
}

/* The text of the masked tokens and of the unmasked ones, in order. */
static void split_by_mask(const cai_bpe_t *tok, const cai_sft_tokens *t, cai_byte_buf *on, cai_byte_buf *off) {
    on->len = off->len = 0;
    for (size_t i = 0; i < t->len; i++) decode(tok, &t->ids[i], 1, t->mask[i] ? on : off);
    if (on->data) on->data[on->len] = 0;
    if (off->data) off->data[off->len] = 0;
}

static size_t first_masked(const cai_sft_tokens *t) {
    size_t i = 0;
    while (i < t->len && !t->mask[i]) i++;
    return i;
}

/* ------------------------------------------------------------------ preference lines */

#define U "{\"role\":\"user\",\"content\":\"What is 2 + 2?\"}"
#define A "{\"role\":\"assistant\",\"content\":\"The answer is 4.\"}"
#define S "{\"role\":\"system\",\"content\":\"Be brief.\"}"

START_TEST(pref_spellings_parse) {
    static const struct {
        const char *line;
        int n_context, n_chosen;
        const char *last_context_role, *chosen0;
    } cases[] = {
        {"{\"context\": [{\"from\":\"human\",\"content\":\"What is 2 + 2?\"}], \"chosen\": "
         "[{\"from\":\"assistant\",\"content\":\"The answer is 4.\"}], \"rejected\": "
         "[{\"from\":\"assistant\",\"content\":\"5\"}]}",
         1, 1, "user", "The answer is 4."},
        {"{\"context\": [" S "," U "," A "," U "], \"chosen\": [" A "], \"rejected\": [" A "], \"id\": 9}", 4, 1,
         "user", "The answer is 4."},
        {"{\"prompt\": \"What is 2 + 2?\", \"chosen\": \"The answer is 4.\", \"rejected\": \"four\"}", 1, 1, "user",
         "The answer is 4."},
        {"{\"prompt\": [" S "," U "], \"chosen\": [" A "," A "], \"rejected\": [{\"from\":\"gpt\",\"value\":\"x\"}]}",
         2, 2, "user", "The answer is 4."},
        {"{\"prompt\": [{\"from\":\"human\",\"value\":\"hi\"}], \"chosen\": \"a\", \"rejected\": [" A "]}", 1, 1,
         "user", "a"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cai_rl_pref p;
        CK_CAI(cai_rl_pref_parse_line("prefs.jsonl", 1, cases[k].line, strlen(cases[k].line), &p));
        ck_assert_int_eq(p.n_context, cases[k].n_context);
        ck_assert_int_eq(p.n_chosen, cases[k].n_chosen);
        ck_assert_int_eq(p.n_rejected, 1);
        ck_assert_str_eq(p.context[p.n_context - 1].role, cases[k].last_context_role);
        ck_assert_str_eq(p.chosen[0].role, "assistant");
        ck_assert_str_eq(p.rejected[0].role, "assistant");
        ck_assert_str_eq(p.chosen[0].content, cases[k].chosen0);
        cai_rl_pref_free(&p);
        ck_assert_ptr_null(p.context);
    }
}
END_TEST

START_TEST(pref_malformed_lines_name_line_and_field) {
    static const char *const cases[][2] = {
        {"{\"context\": [" U "], \"chosen\": [" A "]}", "prefs.jsonl:3: field 'rejected': missing"},
        {"{\"context\": [" U "], \"rejected\": [" A "]}", "prefs.jsonl:3: field 'chosen': missing"},
        {"{\"chosen\": [" A "], \"rejected\": [" A "]}", "prefs.jsonl:3: field 'context': missing"},
        {"{\"context\": [" S "], \"chosen\": [" A "], \"rejected\": [" A "]}",
         "prefs.jsonl:3: field 'context': no user turn"},
        {"{\"context\": [" U "," A "], \"chosen\": [" A "], \"rejected\": [" A "]}",
         "prefs.jsonl:3: field 'context[1]': ends with an assistant turn"},
        {"{\"context\": [" U "," U "], \"chosen\": [" A "], \"rejected\": [" A "]}",
         "field 'context[1]': two user turns in a row"},
        {"{\"context\": [" A "," U "], \"chosen\": [" A "], \"rejected\": [" A "]}",
         "field 'context[0]': starts with the assistant"},
        {"{\"context\": [" U "," S "," A "," U "], \"chosen\": [" A "], \"rejected\": [" A "]}",
         "field 'context[1]': a system turn may only come first"},
        {"{\"context\": [" U "], \"chosen\": [], \"rejected\": [" A "]}",
         "prefs.jsonl:3: field 'chosen': must not be empty"},
        {"{\"context\": [" U "], \"chosen\": [" A "], \"rejected\": \"\"}",
         "prefs.jsonl:3: field 'rejected': must not be empty"},
        {"{\"context\": [" U "], \"chosen\": [" A "], \"rejected\": [" U "]}",
         "prefs.jsonl:3: field 'rejected[0]': a response holds assistant turns only, not a user turn"},
        {"{\"context\": [" U "], \"chosen\": [" A "," U "], \"rejected\": [" A "]}",
         "field 'chosen[1]': a response holds assistant turns only"},
        {"{\"context\": [" U "], \"chosen\": 7, \"rejected\": [" A "]}",
         "field 'chosen': must be a string or an array"},
        {"{\"context\": [" U "], \"chosen\": [" A "], \"rejected\": [{\"role\":\"bot\",\"content\":\"x\"}]}",
         "field 'rejected[0].role': 'bot' is not one of system|user|assistant"},
        {"{\"context\": [{\"from\":\"robot\",\"content\":\"x\"}], \"chosen\": [" A "], \"rejected\": [" A "]}",
         "field 'context[0].from': 'robot' is not one of system|human|assistant|gpt"},
        {"{\"context\": [{\"role\":\"user\"}], \"chosen\": [" A "], \"rejected\": [" A "]}",
         "field 'context[0].content': missing"},
        {"{\"context\": [" U "], \"chosen\": [{\"role\":\"assistant\",\"content\":\" \\n\"}], \"rejected\": [" A "]}",
         "field 'chosen[0].content': is only whitespace"},
        {"{\"context\": [" U "], \"chosen\": [" A "], \"rejected\": [7]}", "field 'rejected[0]': must be an object"},
        {"{\"context\": [" U "], \"prompt\": \"q\", \"chosen\": [" A "], \"rejected\": [" A "]}",
         "fields 'context' and 'prompt': give one"},
        {"{\"prompt\": 3, \"chosen\": \"a\", \"rejected\": \"b\"}", "field 'prompt': must be a string or an array"},
        {"{\"context\": [" U "], \"chosen\": [" A "], \"rejected\": [" A "]", "prefs.jsonl:3: not valid JSON"},
        {"[1, 2]", "prefs.jsonl:3: a line must be a JSON object, not an array"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cai_rl_pref p;
        cai_status st = cai_rl_pref_parse_line("prefs.jsonl", 3, cases[k][0], strlen(cases[k][0]), &p);
        ck_assert_msg(st == CAI_ERR_FORMAT, "case %zu: %s -> %s", k, cases[k][0], cai_status_str(st));
        ck_assert_msg(strstr(cai_error_message(), cases[k][1]) != NULL, "case %zu: \"%s\" lacks \"%s\"", k,
                      cai_error_message(), cases[k][1]);
        ck_assert_ptr_null(p.context);
        cai_error_clear();
    }
    /* through a file: the first bad line (blank lines counted) is named */
    char path[300];
    write_text("prefs.jsonl",
               "{\"prompt\": \"q\", \"chosen\": \"a\", \"rejected\": \"b\"}\n\n"
               "{\"prompt\": \"q\", \"chosen\": \"a\"}\n{\"prompt\": 1}\n",
               path, sizeof path);
    cai_chat_template_t *t = open_tpl("plain", NULL);
    cai_rl_pref_set_t *set = (cai_rl_pref_set_t *)1;
    ck_assert_int_eq(cai_rl_pref_set_load(path, t, NULL, 0, CAI_SFT_TRUNCATE, &set), CAI_ERR_FORMAT);
    ck_assert_ptr_null(set);
    ck_assert_msg(strstr(cai_error_message(), "prefs.jsonl:3: field 'rejected': missing"), "%s", cai_error_message());
    cai_error_clear();
    ck_assert_int_eq(cai_rl_pref_set_load("/nonexistent/p.jsonl", t, NULL, 0, CAI_SFT_TRUNCATE, &set), CAI_ERR_IO);
    cai_error_clear();
    cai_chat_template_free(t);
}
END_TEST

/* The context's tokens are the infer path's prompt, and the masks mark
 * exactly each response (content and end). */
START_TEST(pair_masks_are_the_responses_over_one_context) {
    static const char line[] = "{\"context\": [" S "," U "], \"chosen\": [" A
                               "], \"rejected\": "
                               "[{\"role\":\"assistant\",\"content\":\"Once upon a time there was 5.\"}]}";
    static const struct {
        const char *tpl, *chosen, *rejected, *tail; /* learned text, then the unlearned tail */
    } cases[] = {
        {"chatml", "The answer is 4.<|im_end|>", "Once upon a time there was 5.<|im_end|>", "\n"},
        {"llama3", "The answer is 4.<|eot_id|>", "Once upon a time there was 5.<|eot_id|>", ""},
        {"plain", " The answer is 4.\n", " Once upon a time there was 5.\n", ""},
    };
    cai_rl_pref p;
    CK_CAI(cai_rl_pref_parse_line("p.jsonl", 1, line, strlen(line), &p));
    for (int bytes = 0; bytes < 2; bytes++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            cai_bpe_t *tok = bytes ? NULL : tiny_tokenizer();
            cai_chat_template_t *t = open_tpl(cases[k].tpl, tok);
            cai_sft_tokens ch = {0}, rj = {0};
            CK_CAI(cai_rl_pref_encode(t, tok, &p, &ch, &rj));
            /* the prompt colossal-infer builds for the context */
            cai_byte_buf text = {0}, on = {0}, off = {0};
            cai_token_buf prompt = {0};
            CK_CAI(cai_rl_prompt_encode(t, tok, p.context, p.n_context, &text, &prompt));
            const size_t c0 = first_masked(&ch), c1 = first_masked(&rj);
            ck_assert_uint_eq(c0, prompt.len);
            ck_assert_uint_eq(c1, prompt.len);
            ck_assert_int_eq(memcmp(ch.ids, prompt.ids, prompt.len * sizeof *ch.ids), 0);
            ck_assert_int_eq(memcmp(rj.ids, prompt.ids, prompt.len * sizeof *rj.ids), 0);
            const struct {
                const cai_sft_tokens *t;
                const char *learned;
            } sides[] = {{&ch, cases[k].chosen}, {&rj, cases[k].rejected}};
            for (int s = 0; s < 2; s++) {
                split_by_mask(tok, sides[s].t, &on, &off);
                ck_assert_str_eq(on.data, sides[s].learned);
                /* unmasked: the rendered prompt, then the template's tail */
                ck_assert_uint_eq(off.len, text.len + strlen(cases[k].tail));
                ck_assert_int_eq(memcmp(off.data, text.data, text.len), 0);
                ck_assert_str_eq(off.data + text.len, cases[k].tail);
                /* the masked tokens are one run */
                size_t i = first_masked(sides[s].t);
                while (i < sides[s].t->len && sides[s].t->mask[i]) i++;
                while (i < sides[s].t->len) ck_assert_int_eq(sides[s].t->mask[i++], 0);
            }
            cai_sft_tokens_free(&ch);
            cai_sft_tokens_free(&rj);
            cai_byte_buf_free(&text);
            cai_byte_buf_free(&on);
            cai_byte_buf_free(&off);
            cai_token_buf_free(&prompt);
            cai_chat_template_free(t);
            cai_bpe_free(tok);
        }
    cai_rl_pref_free(&p);
}
END_TEST

/* Bytes and the plain template: "user: Q\nassistant:" + " R\n", so every
 * length is known. */
START_TEST(pref_set_counts_truncated_and_dropped) {
    char path[300];
    write_text("fit.jsonl",
               "{\"prompt\": \"q\", \"chosen\": \"aa\", \"rejected\": \"b\"}\n"
               "{\"prompt\": \"q\", \"chosen\": \"aaaaaaaaaaaaaaaaaaaa\", \"rejected\": \"b\"}\n"
               "{\"prompt\": \"qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq\", \"chosen\": \"a\", "
               "\"rejected\": \"b\"}\n"
               "\n",
               path, sizeof path);
    const int64_t ctx = (int64_t)strlen("user: q\nassistant:");
    /* pair 1: sides of ctx + 4 (" aa\n") and ctx + 3 bytes; pair 2: ctx + 23; pair 3 > 60 */
    const int64_t seq_len = ctx + 10;
    cai_chat_template_t *t = open_tpl("plain", NULL);
    cai_rl_pref_set_t *s = NULL;
    cai_rl_data_stats st;
    CK_CAI(cai_rl_pref_set_load(path, t, NULL, seq_len, CAI_SFT_TRUNCATE, &s));
    cai_rl_pref_set_stats(s, &st);
    ck_assert_int_eq(st.lines, 3);
    ck_assert_int_eq(st.kept, 2);
    ck_assert_int_eq(st.truncated, 1);
    ck_assert_int_eq(st.dropped, 1);
    ck_assert_int_eq(cai_rl_pref_set_size(s), 2);
    const cai_sft_tokens *ch, *rj;
    CK_CAI(cai_rl_pref_set_pair(s, 0, &ch, &rj));
    ck_assert_uint_eq(ch->len, (size_t)ctx + 4);
    ck_assert_uint_eq(rj->len, (size_t)ctx + 3);
    ck_assert_uint_eq(first_masked(ch), (size_t)ctx);
    CK_CAI(cai_rl_pref_set_pair(s, 1, &ch, &rj));
    ck_assert_uint_eq(ch->len, (size_t)seq_len + 1); /* cut at the response's end */
    ck_assert_uint_eq(rj->len, (size_t)ctx + 3);
    ck_assert_int_eq(ch->mask[ch->len - 1], 1);
    ck_assert_int_eq(memcmp(ch->ids, rj->ids, (size_t)ctx * sizeof *ch->ids), 0);
    ck_assert_int_eq(cai_rl_pref_set_pair(s, 2, &ch, &rj), CAI_ERR_INVALID_ARG);
    cai_error_clear();
    cai_rl_pref_set_free(s);

    CK_CAI(cai_rl_pref_set_load(path, t, NULL, seq_len, CAI_SFT_DROP, &s));
    cai_rl_pref_set_stats(s, &st);
    ck_assert_int_eq(st.lines, 3);
    ck_assert_int_eq(st.kept, 1);
    ck_assert_int_eq(st.truncated, 0);
    ck_assert_int_eq(st.dropped, 2);
    cai_rl_pref_set_free(s);

    /* exactly at the limit: n - 1 == seq_len fits; one more is cut */
    CK_CAI(cai_rl_pref_set_load(path, t, NULL, ctx + 3, CAI_SFT_DROP, &s));
    cai_rl_pref_set_stats(s, &st);
    ck_assert_int_eq(st.kept, 1);
    cai_rl_pref_set_free(s);
    CK_CAI(cai_rl_pref_set_load(path, t, NULL, ctx + 2, CAI_SFT_DROP, &s));
    cai_rl_pref_set_stats(s, &st);
    ck_assert_int_eq(st.kept, 0);
    ck_assert_int_eq(st.dropped, 3);
    cai_rl_pref_set_free(s);
    /* truncating into the context leaves a side no response token: dropped */
    CK_CAI(cai_rl_pref_set_load(path, t, NULL, ctx - 1, CAI_SFT_TRUNCATE, &s));
    cai_rl_pref_set_stats(s, &st);
    ck_assert_int_eq(st.kept, 0);
    ck_assert_int_eq(st.dropped, 3);
    cai_rl_pref_set_free(s);
    /* no limit */
    CK_CAI(cai_rl_pref_set_load(path, t, NULL, 0, CAI_SFT_DROP, &s));
    ck_assert_int_eq(cai_rl_pref_set_size(s), 3);
    cai_rl_pref_set_free(s);
    cai_rl_pref_set_free(NULL);
    cai_chat_template_free(t);
}
END_TEST

/* ------------------------------------------------------------------ prompts */

START_TEST(prompt_lines_parse_and_refuse) {
    static const struct {
        const char *line;
        int n;
        const char *answer;
    } ok[] = {
        {"{\"messages\": [" S "," U "], \"answer\": \"42\"}", 2, "42"},
        {"{\"prompt\": \"What is 2 + 2?\", \"answer\": 4}", 1, "4"},
        {"{\"prompt\": \"x\", \"answer\": -2.5}", 1, "-2.5"},
        {"{\"prompt\": \"x\", \"answer\": null}", 1, NULL},
        {"{\"messages\": [" U "," A "," U "]}", 3, NULL},
    };
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
        cai_rl_prompt p;
        CK_CAI(cai_rl_prompt_parse_line("prompts.jsonl", 1, ok[k].line, strlen(ok[k].line), &p));
        ck_assert_int_eq(p.n_messages, ok[k].n);
        ck_assert_str_eq(p.messages[p.n_messages - 1].role, "user");
        if (ok[k].answer) ck_assert_str_eq(p.answer, ok[k].answer);
        else ck_assert_ptr_null(p.answer);
        cai_rl_prompt_free(&p);
    }
    static const char *const bad[][2] = {
        {"{\"messages\": [" S "], \"answer\": \"1\"}", "prompts.jsonl:5: field 'messages': no user turn"},
        {"{\"messages\": [" U "," A "]}", "prompts.jsonl:5: field 'messages[1]': ends with an assistant turn"},
        {"{\"prompt\": \"\"}", "prompts.jsonl:5: field 'prompt': must not be empty"},
        {"{\"answer\": \"1\"}", "prompts.jsonl:5: field 'messages': missing"},
        {"{\"prompt\": \"q\", \"answer\": [1]}", "prompts.jsonl:5: field 'answer': must be a string or a number"},
        {"{\"prompt\": \"q\", \"messages\": [" U "]}", "fields 'messages' and 'prompt'"},
        {"{\"messages\": [{\"role\":\"user\",\"content\":3}]}",
         "prompts.jsonl:5: field 'messages[0].content': must be a string"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cai_rl_prompt p;
        ck_assert_int_eq(cai_rl_prompt_parse_line("prompts.jsonl", 5, bad[k][0], strlen(bad[k][0]), &p),
                         CAI_ERR_FORMAT);
        ck_assert_msg(strstr(cai_error_message(), bad[k][1]) != NULL, "case %zu: \"%s\" lacks \"%s\"", k,
                      cai_error_message(), bad[k][1]);
        ck_assert_ptr_null(p.messages);
        cai_error_clear();
    }
}
END_TEST

START_TEST(prompt_set_tokens_are_the_infer_path) {
    char path[300];
    write_text("prompts.jsonl",
               "{\"messages\": [" S "," U
               "], \"answer\": \"4\"}\n"
               "{\"prompt\": \"Tom has 5 apples and gets 3 more. How many apples does Tom have now?\", \"answer\": 8}\n"
               "\n"
               "{\"prompt\": \"<|im_end|> is text here\"}\n",
               path, sizeof path);
    cai_bpe_t *tok = tiny_tokenizer();
    cai_chat_template_t *t = open_tpl("chatml", tok);
    cai_rl_prompt_set_t *s = NULL;
    CK_CAI(cai_rl_prompt_set_load(path, t, tok, 0, &s));
    ck_assert_int_eq(cai_rl_prompt_set_size(s), 3);
    static const char *const answers[] = {"4", "8", NULL};
    static const cai_chat_message m0[] = {{"system", "Be brief."}, {"user", "What is 2 + 2?"}};
    static const cai_chat_message m1[] = {
        {"user", "Tom has 5 apples and gets 3 more. How many apples does Tom have now?"}};
    static const cai_chat_message m2[] = {{"user", "<|im_end|> is text here"}};
    const cai_chat_message *msgs[] = {m0, m1, m2};
    const int nm[] = {2, 1, 1};
    int64_t lens[3];
    for (int i = 0; i < 3; i++) {
        /* colossal-infer: render with the generation prompt, encode with special tokens */
        cai_byte_buf text = {0};
        cai_token_buf ids = {0};
        CK_CAI(cai_chat_template_render(t, msgs[i], nm[i], 1, &text));
        CK_CAI(cai_bpe_encode(tok, text.data, text.len, &ids));
        const int32_t *got;
        int64_t n;
        const char *gtext, *ans;
        CK_CAI(cai_rl_prompt_set_get(s, i, &got, &n, &gtext, &ans));
        ck_assert_int_eq(n, (int64_t)ids.len);
        ck_assert_int_eq(memcmp(got, ids.ids, ids.len * sizeof *got), 0);
        ck_assert_str_eq(gtext, text.data);
        if (answers[i]) ck_assert_str_eq(ans, answers[i]);
        else ck_assert_ptr_null(ans);
        lens[i] = n;
        cai_byte_buf_free(&text);
        cai_token_buf_free(&ids);
    }
    ck_assert_int_eq(cai_rl_prompt_set_get(s, 3, NULL, NULL, NULL, NULL), CAI_ERR_INVALID_ARG);
    cai_error_clear();
    cai_rl_prompt_set_free(s);
    /* a limit between the lengths drops the longer prompts, counted */
    int64_t lo = lens[0], hi = lens[0];
    for (int i = 1; i < 3; i++) lo = lens[i] < lo ? lens[i] : lo, hi = lens[i] > hi ? lens[i] : hi;
    ck_assert_int_lt(lo, hi);
    CK_CAI(cai_rl_prompt_set_load(path, t, tok, lo, &s));
    cai_rl_data_stats st;
    cai_rl_prompt_set_stats(s, &st);
    int fit = 0;
    for (int i = 0; i < 3; i++) fit += lens[i] <= lo;
    ck_assert_int_eq(st.lines, 3);
    ck_assert_int_eq(st.kept, fit);
    ck_assert_int_eq(st.dropped, 3 - fit);
    ck_assert_int_eq(cai_rl_prompt_set_size(s), fit);
    for (int64_t i = 0; i < fit; i++) {
        int64_t n;
        CK_CAI(cai_rl_prompt_set_get(s, i, NULL, &n, NULL, NULL));
        ck_assert_int_le(n, lo);
    }
    cai_rl_prompt_set_free(s);
    cai_rl_prompt_set_free(NULL);
    /* the first bad line is named */
    write_text("bad_prompts.jsonl", "{\"prompt\": \"q\"}\n{\"messages\": [" S "]}\n", path, sizeof path);
    ck_assert_int_eq(cai_rl_prompt_set_load(path, t, tok, 0, &s), CAI_ERR_FORMAT);
    ck_assert_msg(strstr(cai_error_message(), "bad_prompts.jsonl:2: field 'messages': no user turn"), "%s",
                  cai_error_message());
    cai_error_clear();
    cai_chat_template_free(t);
    cai_bpe_free(tok);
}
END_TEST

/* ------------------------------------------------------------------ rewards */

static double exact(const char *response, const char *answer) {
    double r = -1;
    CK_CAI(cai_rl_reward_exact_match(NULL, "p", response, answer, &r));
    return r;
}

static double fmt(const char *response) {
    double r = -1;
    CK_CAI(cai_rl_reward_format(NULL, "p", response, NULL, &r));
    return r;
}

START_TEST(rewards_on_edge_strings) {
    static const struct {
        const char *response, *answer;
        double want;
    } cases[] = {
        {"The answer is 1,234.", "1234", 1},
        {"The answer is 1,234.", "1,234", 1},
        {"The answer is 1234.", "1234.0", 1},
        {"The answer is 12.", "1234", 0},
        {"The answer is 7. I hope this helps! 3 more questions?", "7", 1},
        {"I think 3, no wait. The answer is 5. Or 6.", "5", 1},
        {"The answer is 5. Actually, the answer is 6.", "6", 1},
        {"The answer is -3.", "-3", 1},
        {"The answer is -3.", "3", 0},
        {"10 - 3 = 7", "7", 1},
        {"5-3", "3", 1},
        {"It is 2.5 apples", "2.5", 1},
        {"no number here", "4", 0},
        {"", "4", 0},
        {"The answer is Paris.", "Paris", 1},
        {"The answer is Paris.", " Paris ", 1},
        {"The answer is Rome.", "Paris", 0},
        {"  Paris. ", "Paris", 1},
        {"The answer is 4", "4", 1},
        {"the answer is 4.", "4", 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        ck_assert_msg(exact(cases[k].response, cases[k].answer) == cases[k].want, "exact(\"%s\", \"%s\") != %g",
                      cases[k].response, cases[k].answer, cases[k].want);
    char buf[64];
    cai_rl_extract_answer("The answer is 1,234.", buf, sizeof buf);
    ck_assert_str_eq(buf, "1,234");
    cai_rl_extract_answer("x -12 y 3,5", buf, sizeof buf);
    ck_assert_str_eq(buf, "3,5");
    cai_rl_extract_answer("nothing", buf, sizeof buf);
    ck_assert_str_eq(buf, "nothing");
    /* no reference: an argument error naming the prompt */
    double r;
    ck_assert_int_eq(cai_rl_reward_exact_match(NULL, "What is 2 + 2?", "The answer is 4.", NULL, &r),
                     CAI_ERR_INVALID_ARG);
    ck_assert_msg(strstr(cai_error_message(), "What is 2 + 2?"), "%s", cai_error_message());
    cai_error_clear();

    ck_assert(fmt("The answer is 4.") == 1);
    ck_assert(fmt("  The answer is -17.\n") == 1);
    ck_assert(fmt("The answer is 1,234.") == 0);
    ck_assert(fmt("The answer is 4") == 0);
    ck_assert(fmt("The answer is 4.5.") == 0);
    ck_assert(fmt("The answer is .") == 0);
    ck_assert(fmt("The answer is -.") == 0);
    ck_assert(fmt("the answer is 4.") == 0);
    ck_assert(fmt("The answer is 4. Done.") == 0);
    ck_assert(fmt("4") == 0);
    ck_assert(fmt("") == 0);
}
END_TEST

static cai_status length_reward(void *ctx, const char *prompt, const char *response, const char *answer,
                                double *reward) {
    (void)prompt, (void)answer;
    *reward = (double)strlen(response) * *(const double *)ctx;
    return CAI_OK;
}

START_TEST(reward_specs_parse_weigh_and_refuse) {
    cai_rl_reward_spec s;
    CK_CAI(cai_rl_reward_spec_parse("exact_match,format:0.1", &s));
    ck_assert_int_eq(s.n, 2);
    ck_assert_str_eq(s.names[0], "exact_match");
    ck_assert_str_eq(s.names[1], "format");
    ck_assert(s.weights[0] == 1.0 && s.weights[1] == 0.1);
    ck_assert_int_eq(cai_rl_reward_spec_find(&s, "format"), 1);
    ck_assert_int_eq(cai_rl_reward_spec_find(&s, "exact_match"), 0);
    ck_assert_int_eq(cai_rl_reward_spec_find(&s, "length"), -1);
    double total, parts[CAI_RL_MAX_REWARDS];
    CK_CAI(cai_rl_reward_spec_eval(&s, "p", "The answer is 4.", "4", &total, parts));
    ck_assert(parts[0] == 1 && parts[1] == 1 && fabs(total - 1.1) < 1e-12);
    CK_CAI(cai_rl_reward_spec_eval(&s, "p", "4", "4", &total, parts));
    ck_assert(parts[0] == 1 && parts[1] == 0 && total == 1.0);
    CK_CAI(cai_rl_reward_spec_eval(&s, "p", "The answer is 5.", "4", &total, NULL));
    ck_assert(fabs(total - 0.1) < 1e-12);
    ck_assert_int_eq(cai_rl_reward_spec_eval(&s, "What is 1 + 1?", "2", NULL, &total, parts), CAI_ERR_INVALID_ARG);
    ck_assert_msg(strstr(cai_error_message(), "What is 1 + 1?"), "%s", cai_error_message());
    cai_error_clear();
    cai_rl_reward_spec_free(&s);
    ck_assert_int_eq(s.n, 0);
    cai_rl_reward_spec_free(&s); /* zeroed: fine */

    /* a registered reward joins the known names; a name taken is refused */
    static const double scale = 0.5;
    CK_CAI(cai_rl_reward_register("length", length_reward, (void *)&scale));
    ck_assert_int_eq(cai_rl_reward_register("length", length_reward, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_rl_reward_register("format", length_reward, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_rl_reward_register("bad name", length_reward, NULL), CAI_ERR_INVALID_ARG);
    cai_error_clear();
    CK_CAI(cai_rl_reward_spec_parse(" format : -2 , length:1e-1", &s));
    ck_assert_int_eq(s.n, 2);
    ck_assert(s.weights[0] == -2.0);
    CK_CAI(cai_rl_reward_spec_eval(&s, "p", "abcd", NULL, &total, parts));
    ck_assert(parts[0] == 0 && parts[1] == 2.0 && fabs(total - 0.2) < 1e-12);
    cai_rl_reward_spec_free(&s);

    static const char *const bad[][2] = {
        {"", "an empty entry"},
        {"exact_match,", "an empty entry"},
        {"exact_match,,format", "an empty entry"},
        {"exact_mach", "unknown reward \"exact_mach\" (known: exact_match, format, length)"},
        {"format:", "the weight after ':' is missing"},
        {"format:abc", "weight \"abc\" is not a finite number"},
        {"format:1.5x", "weight \"1.5x\" is not a finite number"},
        {"format:inf", "weight \"inf\" is not a finite number"},
        {"format:nan", "weight \"nan\" is not a finite number"},
        {":1", "entry \":1\""},
        {"format:1:2", "is not a finite number"},
        {"format,format", "reward \"format\" given twice"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        memset(&s, 0xff, sizeof s);
        ck_assert_int_eq(cai_rl_reward_spec_parse(bad[k][0], &s), CAI_ERR_CONFIG);
        ck_assert_msg(strstr(cai_error_message(), bad[k][1]) != NULL, "case %zu \"%s\": \"%s\" lacks \"%s\"", k,
                      bad[k][0], cai_error_message(), bad[k][1]);
        ck_assert_int_eq(s.n, 0);
        cai_error_clear();
    }
}
END_TEST

/* ------------------------------------------------------------------ embedded examples */

/* The answer of an embedded arithmetic question, from its text. */
static long long solve(const char *q) {
    int a, b;
    char w1[64], w2[64];
    if (sscanf(q, "What is %d + %d?", &a, &b) == 2) return a + b;
    if (sscanf(q, "What is %d - %d?", &a, &b) == 2) return a - b;
    if (sscanf(q, "What is %d times %d?", &a, &b) == 2) return a * b;
    if (sscanf(q, "What is %d divided by %d?", &a, &b) == 2) return a / b;
    if (strstr(q, "more. How many") && sscanf(q, "%63s has %d %63s and gets %d more.", w1, &a, w2, &b) == 4)
        return a + b;
    if (strstr(q, "gives away") && sscanf(q, "%63s has %d %63s and gives away %d.", w1, &a, w2, &b) == 4) return a - b;
    ck_abort_msg("not an arithmetic question: %s", q);
    return 0;
}

static char **read_lines(const char *path, int *n) {
    size_t len;
    char *text = (char *)slurp(path, &len);
    text[len] = 0;
    char **lines = NULL;
    *n = 0;
    for (char *p = text, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        ck_assert_ptr_nonnull(nl);
        *nl = 0;
        lines = realloc(lines, (size_t)(*n + 1) * sizeof *lines);
        lines[(*n)++] = strdup(p);
    }
    free(text);
    return lines;
}

static void free_lines(char **l, int n) {
    for (int i = 0; i < n; i++) free(l[i]);
    free(l);
}

START_TEST(examples_are_deterministic_split_and_correct) {
    const cai_sft_example_config cfg = {400, 77, 20};
    char pt[300], ph[300], qt[300], qh[300], pt2[300], qt2[300];
    path_in(pt, sizeof pt, "prompts_train.jsonl");
    path_in(ph, sizeof ph, "prompts_held_out.jsonl");
    path_in(qt, sizeof qt, "prefs_train.jsonl");
    path_in(qh, sizeof qh, "prefs_held_out.jsonl");
    path_in(pt2, sizeof pt2, "prompts_train2.jsonl");
    path_in(qt2, sizeof qt2, "prefs_train2.jsonl");
    int64_t nt, nh, mt, mh, nt2, mt2;
    CK_CAI(cai_rl_example_prompts_write(&cfg, pt, ph, &nt, &nh));
    CK_CAI(cai_rl_example_prefs_write(&cfg, qt, qh, &mt, &mh));
    CK_CAI(cai_rl_example_prompts_write(&cfg, pt2, NULL, &nt2, NULL));
    CK_CAI(cai_rl_example_prefs_write(&cfg, qt2, NULL, &mt2, NULL));
    ck_assert_int_eq(nt, nt2);
    ck_assert_int_eq(mt, mt2);
    ck_assert_int_eq(nt, mt);
    ck_assert_int_eq(nh, mh);
    size_t a, b;
    unsigned char *x = slurp(pt, &a), *y = slurp(pt2, &b);
    ck_assert(a == b && memcmp(x, y, a) == 0);
    free(x), free(y);
    x = slurp(qt, &a), y = slurp(qt2, &b);
    ck_assert(a == b && memcmp(x, y, a) == 0);
    free(x), free(y);

    /* the lines are the arithmetic conversations of each split, in order,
     * less the training ones that ask a held-out question */
    int64_t expect[2] = {0, 0}, arith = 0, repeats = 0;
    const char **questions[2] = {calloc((size_t)cfg.n, sizeof(char *)), calloc((size_t)cfg.n, sizeof(char *))};
    int is_held[400];
    cai_chat_conversation convs[400];
    for (int64_t i = 0; i < cfg.n; i++) {
        CK_CAI(cai_sft_example_conversation(&cfg, i, &convs[i], &is_held[i]));
        const cai_chat_message *last = &convs[i].messages[convs[i].n_messages - 1];
        if (strncmp(last->content, "The answer is ", 14) != 0) continue;
        if (is_held[i]) questions[1][expect[1]++] = convs[i].messages[convs[i].n_messages - 2].content;
        arith++;
    }
    for (int64_t i = 0; i < cfg.n; i++) {
        const cai_chat_message *last = &convs[i].messages[convs[i].n_messages - 1];
        if (is_held[i] || strncmp(last->content, "The answer is ", 14) != 0) continue;
        const char *q = convs[i].messages[convs[i].n_messages - 2].content;
        int asked = 0;
        for (int64_t k = 0; k < expect[1] && !asked; k++) asked = strcmp(q, questions[1][k]) == 0;
        if (asked) repeats++;
        else questions[0][expect[0]++] = q;
    }
    ck_assert_int_eq(nt, expect[0]);
    ck_assert_int_eq(nh, expect[1]);
    ck_assert_int_gt(repeats, 0);       /* the split by conversation alone would have trained on these */
    ck_assert_int_gt(nh, 30);           /* about 20% of about 2/3 of 400 */
    ck_assert_int_gt(arith, cfg.n / 2); /* two in three are arithmetic */

    cai_chat_template_t *t = open_tpl("plain", NULL);
    const char *ppaths[2] = {pt, ph}, *qpaths[2] = {qt, qh};
    int malformed = 0, wrong = 0;
    for (int h = 0; h < 2; h++) {
        cai_rl_prompt_set_t *ps;
        cai_rl_pref_set_t *qs;
        CK_CAI(cai_rl_prompt_set_load(ppaths[h], t, NULL, 0, &ps));
        CK_CAI(cai_rl_pref_set_load(qpaths[h], t, NULL, 0, CAI_SFT_TRUNCATE, &qs));
        ck_assert_int_eq(cai_rl_prompt_set_size(ps), expect[h]);
        ck_assert_int_eq(cai_rl_pref_set_size(qs), expect[h]);
        int nl;
        char **lines = read_lines(qpaths[h], &nl);
        ck_assert_int_eq(nl, expect[h]);
        for (int64_t i = 0; i < expect[h]; i++) {
            const char *text, *ans;
            CK_CAI(cai_rl_prompt_set_get(ps, i, NULL, NULL, &text, &ans));
            char want[32];
            snprintf(want, sizeof want, "%lld", solve(questions[h][i]));
            ck_assert_str_eq(ans, want);
            ck_assert_ptr_nonnull(strstr(text, questions[h][i]));
            cai_rl_pref p;
            CK_CAI(cai_rl_pref_parse_line(qpaths[h], i + 1, lines[i], strlen(lines[i]), &p));
            ck_assert_str_eq(p.context[0].content, questions[h][i]);
            /* no training line, prompt or pair, asks a held-out question */
            for (int64_t k = 0; h == 0 && k < expect[1]; k++) {
                ck_assert_str_ne(p.context[0].content, questions[1][k]);
                ck_assert_ptr_null(strstr(text, questions[1][k]));
            }
            /* chosen: right in value and form; rejected: wrong in one of them */
            ck_assert(exact(p.chosen[0].content, ans) == 1 && fmt(p.chosen[0].content) == 1);
            const double e = exact(p.rejected[0].content, ans), f = fmt(p.rejected[0].content);
            ck_assert_msg(e + f < 2, "rejected \"%s\" is right", p.rejected[0].content);
            ck_assert_msg((e == 1 && f == 0) || (e == 0 && f == 1), "rejected \"%s\": one fault",
                          p.rejected[0].content);
            malformed += f == 0;
            wrong += e == 0;
            long long m;
            if (sscanf(p.rejected[0].content, "The answer is %lld.", &m) == 1 && f == 1) ck_assert(m >= 0);
            cai_rl_pref_free(&p);
        }
        free_lines(lines, nl);
        cai_rl_prompt_set_free(ps);
        cai_rl_pref_set_free(qs);
    }
    /* about one in five malformed */
    const double frac = (double)malformed / (double)(nt + nh);
    ck_assert_msg(frac > 0.1 && frac < 0.3, "%d of %lld malformed", malformed, (long long)(nt + nh));
    ck_assert_int_eq(malformed + wrong, nt + nh);
    /* another seed gives other pairs */
    const cai_sft_example_config other = {400, 78, 20};
    CK_CAI(cai_rl_example_prefs_write(&other, qt2, NULL, &mt2, NULL));
    x = slurp(qt, &a), y = slurp(qt2, &b);
    ck_assert(a != b || memcmp(x, y, a) != 0);
    free(x), free(y);
    for (int64_t i = 0; i < cfg.n; i++) cai_chat_conversation_free(&convs[i]);
    free(questions[0]);
    free(questions[1]);
    cai_chat_template_free(t);
}
END_TEST

static Suite *make(void) {
    Suite *s = suite_create("rl_data");
    TCase *tc = tcase_create("pairs");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, pref_spellings_parse);
    tcase_add_test(tc, pref_malformed_lines_name_line_and_field);
    tcase_add_test(tc, pair_masks_are_the_responses_over_one_context);
    tcase_add_test(tc, pref_set_counts_truncated_and_dropped);
    suite_add_tcase(s, tc);
    tc = tcase_create("prompts");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, prompt_lines_parse_and_refuse);
    tcase_add_test(tc, prompt_set_tokens_are_the_infer_path);
    suite_add_tcase(s, tc);
    tc = tcase_create("rewards");
    tcase_add_test(tc, rewards_on_edge_strings);
    tcase_add_test(tc, reward_specs_parse_weigh_and_refuse);
    suite_add_tcase(s, tc);
    tc = tcase_create("examples");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, examples_are_deterministic_split_and_correct);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) { return run_suite(&argc, &argv, make); }
