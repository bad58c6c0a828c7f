/* Batch-job lines: native and OpenAI Batch requests with their sampling
 * overrides, every malformed form (each refusal names file:line and the
 * field, and keeps the id), chat templates' exact text, result lines read
 * back through jansson in both formats, the id set and the output scan a
 * rerun resumes from, and multiple-choice items. */
#include "cai_config.h"
#include "colossal/infer.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_CAI(expr)                                                                          \
    do {                                                                                      \
        cai_status ck_st_ = (expr);                                                           \
        if (ck_st_ != CAI_OK) {                                                               \
            cai_error_print(stderr);                                                          \
            ck_abort_msg("%s -> %s: %s", #expr, cai_status_str(ck_st_), cai_error_message()); \
        }                                                                                     \
    } while (0)

static char g_dir[256];

static cai_status parse_fmt(const char *line, cai_job_format fmt, const cai_sampling_params *def, int strict,
                            cai_job_request *r) {
    return cai_job_request_parse("req.jsonl", 7, line, strlen(line), fmt, def, strict, r);
}

static void parse_ok(const char *line, int strict, cai_job_request *r) {
    cai_status st = parse_fmt(line, CAI_JOB_AUTO, NULL, strict, r);
    ck_assert_msg(st == CAI_OK, "%s -> %s", line, cai_error_message());
}

static int near(float a, float b) { return fabsf(a - b) <= 1e-6f * (1 + fabsf(b)); }

/* ------------------------------------------------------------------ native requests */

START_TEST(native_prompt_with_every_sampling_override) {
    cai_sampling_params def = cai_sampling_default();
    def.max_new_tokens = 32;
    def.stop[0] = strdup("JOBSTOP");
    def.n_stop = 1;
    const char *line =
        "{\"id\": \"a1\", \"prompt\": \"Hello\", \"max_tokens\": 5, \"temperature\": 0.7, \"top_k\": 40, "
        "\"top_p\": 0.9, \"min_p\": 0.05, \"repetition_penalty\": 1.1, \"frequency_penalty\": 0.5, "
        "\"presence_penalty\": -0.5, \"seed\": 42, \"stop\": [\"\\n\\n\", \"END\"], \"stop_token_ids\": [50256, 7], "
        "\"ignore_eos\": true, \"logprobs\": 3}";
    cai_job_request r;
    CK_CAI(parse_fmt(line, CAI_JOB_AUTO, &def, 1, &r));
    ck_assert_str_eq(r.id, "a1");
    ck_assert_int_eq(r.format, CAI_JOB_NATIVE);
    ck_assert_int_eq(r.chat, 0);
    ck_assert_str_eq(r.prompt, "Hello");
    ck_assert_ptr_null(r.prompt_ids);
    ck_assert_ptr_null(r.messages);
    ck_assert_ptr_null(r.model);
    ck_assert_ptr_null(r.url);
    ck_assert_int_eq(r.line, 7);
    const cai_sampling_params *s = &r.sampling;
    ck_assert_int_eq(s->max_new_tokens, 5);
    ck_assert(near(s->temperature, 0.7f));
    ck_assert_int_eq(s->top_k, 40);
    ck_assert(near(s->top_p, 0.9f));
    ck_assert(near(s->min_p, 0.05f));
    ck_assert(near(s->repetition_penalty, 1.1f));
    ck_assert(near(s->frequency_penalty, 0.5f));
    ck_assert(near(s->presence_penalty, -0.5f));
    ck_assert_int_eq(s->has_seed, 1);
    ck_assert_uint_eq(s->seed, 42);
    ck_assert_int_eq(s->n_stop, 2); /* the request's stops replace the job's */
    ck_assert_str_eq(s->stop[0], "\n\n");
    ck_assert_str_eq(s->stop[1], "END");
    ck_assert_int_eq(s->n_stop_ids, 2);
    ck_assert_int_eq(s->stop_ids[0], 50256);
    ck_assert_int_eq(s->stop_ids[1], 7);
    ck_assert_int_eq(s->ignore_eos, 1);
    ck_assert_int_eq(s->logprobs, 3);
    cai_job_request_free(&r);
    ck_assert_ptr_null(r.id);

    /* untouched fields keep the job's defaults; the defaults are not consumed */
    CK_CAI(parse_fmt("{\"id\": 17, \"prompt\": \"x\", \"stop\": \"END\"}", CAI_JOB_NATIVE, &def, 1, &r));
    ck_assert_str_eq(r.id, "17");
    ck_assert_int_eq(r.sampling.max_new_tokens, 32);
    ck_assert_int_eq(r.sampling.has_seed, 0);
    ck_assert_int_eq(r.sampling.n_stop, 1);
    ck_assert_str_eq(r.sampling.stop[0], "END");
    ck_assert_int_eq(r.sampling.logprobs, -1);
    cai_job_request_free(&r);
    CK_CAI(parse_fmt("{\"id\": -3, \"prompt\": \"x\"}", CAI_JOB_AUTO, &def, 1, &r));
    ck_assert_str_eq(r.id, "-3");
    ck_assert_int_eq(r.sampling.n_stop, 1);
    ck_assert_str_eq(r.sampling.stop[0], "JOBSTOP");
    cai_job_request_free(&r);
    ck_assert_str_eq(def.stop[0], "JOBSTOP");
    cai_sampling_free(&def);

    /* no defaults: cai_sampling_default() */
    parse_ok("{\"id\": \"d\", \"prompt\": \"x\"}", 1, &r);
    cai_sampling_params d = cai_sampling_default();
    ck_assert_int_eq(r.sampling.max_new_tokens, d.max_new_tokens);
    ck_assert(r.sampling.temperature == d.temperature);
    ck_assert_int_eq(r.sampling.logprobs, d.logprobs);
    cai_job_request_free(&r);
}
END_TEST

START_TEST(native_messages_token_ids_and_logprob_forms) {
    cai_job_request r;
    parse_ok(
        "{\"id\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
        "\"content\": [{\"type\": \"text\", \"text\": \"one\"}, {\"type\": \"text\", \"text\": \"two\"}], \"name\": "
        "\"ann\"}], \"max_new_tokens\": 9, \"logprobs\": true, \"top_k\": -1}",
        1, &r);
    ck_assert_int_eq(r.chat, 1);
    ck_assert_ptr_null(r.prompt);
    ck_assert_int_eq(r.n_messages, 2);
    ck_assert_str_eq(r.messages[0].role, "system");
    ck_assert_str_eq(r.messages[0].content, "Be brief.");
    ck_assert_str_eq(r.messages[1].role, "user");
    ck_assert_str_eq(r.messages[1].content, "one\ntwo");
    ck_assert_int_eq(r.sampling.max_new_tokens, 9);
    ck_assert_int_eq(r.sampling.logprobs, 0);
    ck_assert_int_eq(r.sampling.top_k, 0); /* vLLM's -1: off */
    cai_job_request_free(&r);

    parse_ok("{\"id\": \"t\", \"prompt_token_ids\": [5, 0, 2147483647], \"top_logprobs\": 4}", 1, &r);
    ck_assert_int_eq(r.chat, 0);
    ck_assert_ptr_null(r.prompt);
    ck_assert_int_eq(r.n_prompt_ids, 3);
    ck_assert_int_eq(r.prompt_ids[0], 5);
    ck_assert_int_eq(r.prompt_ids[1], 0);
    ck_assert_int_eq(r.prompt_ids[2], 2147483647);
    ck_assert_int_eq(r.sampling.logprobs, 4);
    cai_job_request_free(&r);

    parse_ok("{\"id\": \"l\", \"prompt\": \"x\", \"logprobs\": true, \"top_logprobs\": 20}", 1, &r);
    ck_assert_int_eq(r.sampling.logprobs, 20);
    cai_job_request_free(&r);
    parse_ok("{\"id\": \"l\", \"prompt\": \"x\", \"logprobs\": 2, \"top_logprobs\": 2}", 1, &r);
    ck_assert_int_eq(r.sampling.logprobs, 2);
    cai_job_request_free(&r);
    parse_ok("{\"id\": \"l\", \"prompt\": \"x\", \"logprobs\": 0}", 1, &r);
    ck_assert_int_eq(r.sampling.logprobs, 0);
    cai_job_request_free(&r);

    cai_sampling_params def = cai_sampling_default();
    def.logprobs = 5;
    CK_CAI(parse_fmt("{\"id\": \"l\", \"prompt\": \"x\", \"logprobs\": false}", CAI_JOB_AUTO, &def, 1, &r));
    ck_assert_int_eq(r.sampling.logprobs, -1);
    cai_job_request_free(&r);

    /* null is "not given", as OpenAI clients write unset parameters */
    parse_ok(
        "{\"id\": \"n\", \"prompt\": \"x\", \"messages\": null, \"temperature\": null, \"stop\": null, \"seed\": null}",
        1, &r);
    ck_assert_str_eq(r.prompt, "x");
    ck_assert_int_eq(r.sampling.has_seed, 0);
    cai_job_request_free(&r);

    /* CRLF files: the '\r' is JSON whitespace */
    parse_ok("{\"id\": \"cr\", \"prompt\": \"x\"}\r", 1, &r);
    ck_assert_str_eq(r.id, "cr");
    cai_job_request_free(&r);
}
END_TEST

/* ------------------------------------------------------------------ OpenAI requests */

START_TEST(openai_chat_line) {
    const char *line =
        "{\"custom_id\": \"request-1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": "
        "{\"model\": \"gpt-x\", \"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"}, {\"role\": "
        "\"user\", \"content\": \"Hi\"}], \"max_completion_tokens\": 12, \"temperature\": 0.2, \"top_p\": 0.5, "
        "\"seed\": 7, \"stop\": \"###\", \"frequency_penalty\": 1, \"presence_penalty\": 0.25, \"logprobs\": true, "
        "\"top_logprobs\": 2, \"n\": 1, \"stream\": false, \"user\": \"u-1\", \"top_k\": 3, \"min_p\": 0.1, "
        "\"repetition_penalty\": 1.2, \"stop_token_ids\": [2], \"ignore_eos\": false}}";
    cai_job_request r;
    parse_ok(line, 1, &r);
    ck_assert_str_eq(r.id, "request-1");
    ck_assert_int_eq(r.format, CAI_JOB_OPENAI);
    ck_assert_int_eq(r.chat, 1);
    ck_assert_str_eq(r.url, "/v1/chat/completions");
    ck_assert_str_eq(r.model, "gpt-x");
    ck_assert_int_eq(r.n_messages, 2);
    ck_assert_str_eq(r.messages[1].role, "user");
    ck_assert_str_eq(r.messages[1].content, "Hi");
    const cai_sampling_params *s = &r.sampling;
    ck_assert_int_eq(s->max_new_tokens, 12);
    ck_assert(near(s->temperature, 0.2f));
    ck_assert(near(s->top_p, 0.5f));
    ck_assert_int_eq(s->has_seed, 1);
    ck_assert_uint_eq(s->seed, 7);
    ck_assert_int_eq(s->n_stop, 1);
    ck_assert_str_eq(s->stop[0], "###");
    ck_assert(near(s->frequency_penalty, 1.0f));
    ck_assert(near(s->presence_penalty, 0.25f));
    ck_assert_int_eq(s->logprobs, 2);
    ck_assert_int_eq(s->top_k, 3);
    ck_assert(near(s->min_p, 0.1f));
    ck_assert(near(s->repetition_penalty, 1.2f));
    ck_assert_int_eq(s->n_stop_ids, 1);
    ck_assert_int_eq(s->ignore_eos, 0);
    cai_job_request_free(&r);

    /* "max_tokens" (OpenAI's older spelling); method may be left out */
    parse_ok(
        "{\"custom_id\": \"r2\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"user\", "
        "\"content\": \"Hi\"}], \"max_tokens\": 3, \"logprobs\": false}}",
        1, &r);
    ck_assert_ptr_null(r.model);
    ck_assert_int_eq(r.sampling.max_new_tokens, 3);
    ck_assert_int_eq(r.sampling.logprobs, -1);
    cai_job_request_free(&r);
}
END_TEST

START_TEST(openai_completion_lines) {
    cai_job_request r;
    parse_ok(
        "{\"custom_id\": \"c1\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"model\": \"m\", "
        "\"prompt\": \"Once upon\", \"max_tokens\": 8, \"logprobs\": 2, \"echo\": null}}",
        1, &r);
    ck_assert_int_eq(r.format, CAI_JOB_OPENAI);
    ck_assert_int_eq(r.chat, 0);
    ck_assert_str_eq(r.url, "/v1/completions");
    ck_assert_str_eq(r.prompt, "Once upon");
    ck_assert_int_eq(r.sampling.max_new_tokens, 8);
    ck_assert_int_eq(r.sampling.logprobs, 2);
    cai_job_request_free(&r);

    parse_ok("{\"custom_id\": \"c2\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [1, 2, 3]}}", 1, &r);
    ck_assert_ptr_null(r.prompt);
    ck_assert_int_eq(r.n_prompt_ids, 3);
    ck_assert_int_eq(r.prompt_ids[2], 3);
    cai_job_request_free(&r);

    parse_ok("{\"custom_id\": \"c3\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [\"only one\"]}}", 1, &r);
    ck_assert_str_eq(r.prompt, "only one");
    cai_job_request_free(&r);

    parse_ok("{\"custom_id\": \"c4\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [[4, 5]]}}", 1, &r);
    ck_assert_int_eq(r.n_prompt_ids, 2);
    ck_assert_int_eq(r.prompt_ids[0], 4);
    cai_job_request_free(&r);

    /* the format may be forced */
    CK_CAI(parse_fmt("{\"custom_id\": \"c5\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"p\"}}",
                     CAI_JOB_OPENAI, NULL, 1, &r));
    ck_assert_str_eq(r.id, "c5");
    cai_job_request_free(&r);
}
END_TEST

/* ------------------------------------------------------------------ malformed lines */

typedef struct {
    const char *line;
    const char *id;      /* kept id, NULL when none was readable */
    const char *need[2]; /* substrings the message must hold */
    int strict;
} bad_case;

static const bad_case k_bad[] = {
    {"", NULL, {"empty line", NULL}, 1},
    {"   \t", NULL, {"empty line", NULL}, 1},
    {"{\"id\": \"a\", ", NULL, {"not valid JSON", "column"}, 1},
    {"{\"id\": \"a\", \"id\": \"b\", \"prompt\": \"x\"}", NULL, {"not valid JSON", "duplicate"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"\xC3\"}", NULL, {"not valid JSON", NULL}, 1},
    {"[1, 2]", NULL, {"must be a JSON object", "an array"}, 1},
    {"\"text\"", NULL, {"must be a JSON object", "a string"}, 1},
    {"{\"prompt\": \"x\"}", NULL, {"field 'id' is missing", NULL}, 1},
    {"{\"id\": 1.5, \"prompt\": \"x\"}", NULL, {"field 'id'", "a real number"}, 1},
    {"{\"id\": \"\", \"prompt\": \"x\"}", NULL, {"field 'id'", "empty"}, 1},
    {"{\"id\": [\"a\"], \"prompt\": \"x\"}", NULL, {"field 'id'", "an array"}, 1},
    {"{\"id\": \"a\"}", "a", {"exactly one of 'prompt'", "none"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"messages\": [{\"role\": \"user\", \"content\": \"y\"}]}",
     "a",
     {"exactly one of", "'prompt' and 'messages'"},
     1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"prompt_token_ids\": [1]}",
     "a",
     {"'prompt' and 'prompt_token_ids'", NULL},
     1},
    {"{\"id\": \"a\", \"prompt\": 5}", "a", {"field 'prompt'", "an integer"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"\"}", "a", {"field 'prompt'", "empty"}, 1},
    {"{\"id\": \"a\", \"messages\": []}", "a", {"field 'messages'", "empty"}, 1},
    {"{\"id\": \"a\", \"messages\": {\"role\": \"user\"}}", "a", {"field 'messages'", "an object"}, 1},
    {"{\"id\": \"a\", \"messages\": [\"hi\"]}", "a", {"field 'messages[0]'", "a string"}, 1},
    {"{\"id\": \"a\", \"messages\": [{\"content\": \"hi\"}]}", "a", {"field 'messages[0].role'", "absent"}, 1},
    {"{\"id\": \"a\", \"messages\": [{\"role\": \"\", \"content\": \"hi\"}]}", "a", {"messages[0].role", "empty"}, 1},
    {"{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"user\"}]}",
     "a",
     {"field 'messages[1].content'", "absent"},
     1},
    {"{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": null}]}",
     "a",
     {"messages[0].content", "null"},
     1},
    {"{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
     "a",
     {"messages[0].content[0].type", "\"image_url\""},
     1},
    {"{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"x\", \"weight\": 1}]}",
     "a",
     {"unknown key 'weight' in messages[0]", "known: role, content, name"},
     1},
    {"{\"id\": \"a\", \"prompt_token_ids\": [1, -2]}", "a", {"field 'prompt_token_ids[1]'", "-2"}, 1},
    {"{\"id\": \"a\", \"prompt_token_ids\": [1, \"x\"]}", "a", {"field 'prompt_token_ids[1]'", "a string"}, 1},
    {"{\"id\": \"a\", \"prompt_token_ids\": []}", "a", {"field 'prompt_token_ids'", "empty"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"temperature\": \"hot\"}",
     "a",
     {"field 'temperature'", "must be a number"},
     1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"temperature\": -1}", "a", {"temperature", NULL}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"top_p\": 0}", "a", {"top_p", NULL}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"min_p\": 1e300}", "a", {"field 'min_p'", "range"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"max_tokens\": 0}", "a", {"field 'max_tokens'", ">= 1"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"max_tokens\": 2.5}", "a", {"field 'max_tokens'", "an integer"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"max_tokens\": 99999999999}", "a", {"field 'max_tokens'", "out of range"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"max_tokens\": 5, \"max_new_tokens\": 6}",
     "a",
     {"disagree", "max_tokens"},
     1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"top_k\": \"3\"}", "a", {"field 'top_k'", "a string"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"seed\": \"1\"}", "a", {"field 'seed'", "an integer"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"stop\": [1]}", "a", {"field 'stop[0]'", "a string"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"stop\": \"\"}", "a", {"field 'stop'", "empty"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"stop\": {}}", "a", {"field 'stop'", "an object"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}",
     "a",
     {"field 'stop'", "at most 8"},
     1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"stop_token_ids\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}",
     "a",
     {"field 'stop_token_ids'", "at most 16"},
     1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"ignore_eos\": 1}", "a", {"field 'ignore_eos'", "true or false"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"logprobs\": 21}", "a", {"field 'logprobs'", "out of range"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"logprobs\": -1}", "a", {"field 'logprobs'", "out of range"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"logprobs\": \"yes\"}",
     "a",
     {"field 'logprobs'", "true, false or an integer"},
     1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"logprobs\": false, \"top_logprobs\": 2}",
     "a",
     {"field 'top_logprobs'", "needs 'logprobs': true"},
     1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"logprobs\": 3, \"top_logprobs\": 2}", "a", {"disagree", "top_logprobs"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"top_logprobs\": 21}", "a", {"field 'top_logprobs'", "out of range"}, 1},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"temprature\": 0}",
     "a",
     {"unknown key 'temprature'", "known: id, prompt, messages, prompt_token_ids, max_new_tokens"},
     1},
    /* OpenAI */
    {"{\"custom_id\": 5, \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\"}}",
     NULL,
     {"field 'custom_id'", "non-empty string, not an integer"},
     1},
    {"{\"custom_id\": null, \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\"}}",
     NULL,
     {"field 'custom_id' is missing", NULL},
     1},
    {"{\"custom_id\": \"c\", \"method\": \"GET\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\"}}",
     "c",
     {"field 'method'", "\"POST\" (got \"GET\")"},
     1},
    {"{\"custom_id\": \"c\", \"body\": {\"prompt\": \"x\"}}", "c", {"field 'url' is missing", NULL}, 1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/embeddings\", \"body\": {\"input\": \"x\"}}",
     "c",
     {"field 'url'", "\"/v1/embeddings\" is not served"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\"}", "c", {"field 'body' is missing", NULL}, 1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": \"x\"}", "c", {"field 'body'", "a string"}, 1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"prompt\": \"x\"}}",
     "c",
     {"field 'body.prompt'", "takes 'messages'"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"model\": \"m\"}}",
     "c",
     {"field 'body.messages' is missing", NULL},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"messages\": []}}",
     "c",
     {"field 'body.messages'", "takes 'prompt'"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {}}",
     "c",
     {"field 'body.prompt' is missing", NULL},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"n\": 2}}",
     "c",
     {"field 'body.n'", "must be 1 (got 2)"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"stream\": true}}",
     "c",
     {"field 'body.stream'", "does not stream"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [\"a\", \"b\"]}}",
     "c",
     {"field 'body.prompt'", "a batch of 2 prompts"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": []}}",
     "c",
     {"field 'body.prompt'", "empty"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [1, 2.5]}}",
     "c",
     {"field 'body.prompt[1]'", "a real number"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"logprobs\": true}}",
     "c",
     {"field 'body.logprobs'", "an integer"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"top_logprobs\": 1}}",
     "c",
     {"unknown key 'body.top_logprobs'", "a /v1/completions body"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"user\", "
     "\"content\": \"x\"}], \"logprobs\": 3}}",
     "c",
     {"field 'body.logprobs'", "true or false"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"user\", "
     "\"content\": \"x\"}], \"top_logprobs\": 3}}",
     "c",
     {"field 'body.top_logprobs'", "needs 'body.logprobs': true"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"user\"}]}}",
     "c",
     {"field 'body.messages[0].content'", NULL},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"model\": 5}}",
     "c",
     {"field 'body.model'", "an integer"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"temperature\": -2}}",
     "c",
     {"temperature", NULL},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"user\", "
     "\"content\": \"x\"}], \"tools\": []}}",
     "c",
     {"unknown key 'body.tools' in a /v1/chat/completions body", "known: model, messages"},
     1},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\"}, \"extra\": 1}",
     "c",
     {"unknown key 'extra' in an OpenAI batch line", "known: custom_id, method, url, body"},
     1},
    /* lenient mode still refuses what it cannot serve */
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"n\": 3, \"tools\": []}}",
     "c",
     {"field 'body.n'", NULL},
     0},
    {"{\"id\": \"a\", \"prompt\": \"x\", \"temprature\": 0, \"top_p\": \"1\"}", "a", {"field 'top_p'", NULL}, 0},
};

START_TEST(malformed_lines_name_file_line_and_field) {
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        const bad_case *b = &k_bad[i];
        cai_job_request r;
        memset(&r, 0x5a, sizeof r);
        cai_status st = parse_fmt(b->line, CAI_JOB_AUTO, NULL, b->strict, &r);
        const char *msg = cai_error_message();
        ck_assert_msg(st == CAI_ERR_FORMAT, "case %zu %s: status %s (%s)", i, b->line, cai_status_str(st), msg);
        ck_assert_msg(strncmp(msg, "req.jsonl:7: ", 13) == 0, "case %zu: message '%s' lacks req.jsonl:7:", i, msg);
        for (int k = 0; k < 2; k++)
            ck_assert_msg(!b->need[k] || strstr(msg, b->need[k]), "case %zu %s: message '%s' lacks \"%s\"", i, b->line,
                          msg, b->need[k]);
        if (b->id) {
            ck_assert_msg(r.id && strcmp(r.id, b->id) == 0, "case %zu: id kept as '%s', want '%s'", i,
                          r.id ? r.id : "(null)", b->id);
        } else {
            ck_assert_msg(r.id == NULL, "case %zu: id '%s', want none", i, r.id);
        }
        /* the rest is zeroed, so a caller may free it or write an error result from it */
        ck_assert_ptr_null(r.prompt);
        ck_assert_ptr_null(r.prompt_ids);
        ck_assert_ptr_null(r.messages);
        ck_assert_ptr_null(r.model);
        ck_assert_ptr_null(r.url);
        ck_assert_int_eq(r.sampling.n_stop, 0);
        if (r.id) ck_assert_int_eq(r.format, b->line[2] == 'c' ? CAI_JOB_OPENAI : CAI_JOB_NATIVE);
        cai_job_request_free(&r);
        cai_error_clear();
    }
    /* a forced format reads its own id key */
    cai_job_request r;
    ck_assert_int_eq(parse_fmt("{\"id\": \"a\", \"prompt\": \"x\"}", CAI_JOB_OPENAI, NULL, 0, &r), CAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "field 'custom_id' is missing"));
    cai_job_request_free(&r);
    ck_assert_int_eq(parse_fmt("{\"id\": \"a\", \"custom_id\": \"b\", \"prompt\": \"x\"}", CAI_JOB_NATIVE, NULL, 1, &r),
                     CAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "unknown key 'custom_id'"));
    ck_assert_str_eq(r.id, "a");
    cai_job_request_free(&r);
    /* no file name: still a location */
    ck_assert_int_eq(cai_job_request_parse(NULL, 2, "{}", 2, CAI_JOB_AUTO, NULL, 1, &r), CAI_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), ":2: field 'id' is missing"));
    cai_job_request_free(&r);
    /* a length, not a terminator, bounds the line */
    const char *two = "{\"id\": \"a\", \"prompt\": \"x\"}{\"id\": \"b\"}";
    ck_assert_int_eq(cai_job_request_parse("f", 1, two, strlen(two), CAI_JOB_AUTO, NULL, 1, &r), CAI_ERR_FORMAT);
    cai_job_request_free(&r);
    CK_CAI(cai_job_request_parse("f", 1, two, 26, CAI_JOB_AUTO, NULL, 1, &r));
    ck_assert_str_eq(r.id, "a");
    cai_job_request_free(&r);
    ck_assert_int_eq(cai_job_request_parse("f", 1, NULL, 3, CAI_JOB_AUTO, NULL, 1, &r), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_job_request_parse("f", 1, "{}", 2, CAI_JOB_FORMAT_COUNT, NULL, 1, &r), CAI_ERR_INVALID_ARG);
}
END_TEST

START_TEST(unknown_keys_refused_when_strict_ignored_when_lenient) {
    const char *lines[] = {
        "{\"id\": \"a\", \"prompt\": \"x\", \"extra\": {\"k\": 1}, \"max_tokens\": 4}",
        "{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_call_id\": \"t\"}], "
        "\"max_tokens\": 4}",
        "{\"custom_id\": \"a\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": \"user\", "
        "\"content\": \"x\"}], \"response_format\": {\"type\": \"text\"}, \"max_tokens\": 4}}",
        "{\"custom_id\": \"a\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"max_tokens\": 4}, "
        "\"note\": \"n\"}",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        cai_job_request r;
        ck_assert_int_eq(parse_fmt(lines[i], CAI_JOB_AUTO, NULL, 1, &r), CAI_ERR_FORMAT);
        ck_assert_msg(strstr(cai_error_message(), "unknown key") && strstr(cai_error_message(), "known: "), "%s",
                      cai_error_message());
        ck_assert_str_eq(r.id, "a");
        cai_job_request_free(&r);
        CK_CAI(parse_fmt(lines[i], CAI_JOB_AUTO, NULL, 0, &r));
        ck_assert_str_eq(r.id, "a");
        ck_assert_int_eq(r.sampling.max_new_tokens, 4);
        cai_job_request_free(&r);
    }
}
END_TEST

/* ------------------------------------------------------------------ chat templates */

START_TEST(chat_templates_render_exactly) {
    ck_assert_str_eq(cai_job_format_names[CAI_JOB_OPENAI], "openai");
    ck_assert_str_eq(cai_chat_template_names[CAI_CHAT_LLAMA3], "llama3");
    cai_chat_message m[2] = {{"system", "Be brief."}, {"user", " What is 2+2?\n"}};
    const char *want[CAI_CHAT_COUNT] = {
        "system: Be brief.\nuser:  What is 2+2?\n\nassistant:",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n What is 2+2?\n<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    };
    for (int t = 0; t < CAI_CHAT_COUNT; t++) {
        cai_byte_buf b = {0};
        CK_CAI(cai_chat_render((cai_chat_template)t, m, 2, &b));
        ck_assert_uint_eq(b.len, strlen(want[t]));
        ck_assert_str_eq(b.data, want[t]);
        cai_byte_buf_free(&b);
    }
    /* appends; no messages: the assistant's opening alone */
    cai_byte_buf b = {0};
    CK_CAI(cai_chat_render(CAI_CHAT_PLAIN, m, 1, &b));
    CK_CAI(cai_chat_render(CAI_CHAT_CHATML, NULL, 0, &b));
    ck_assert_str_eq(b.data, "system: Be brief.\nassistant:<|im_start|>assistant\n");
    cai_byte_buf_free(&b);
    cai_chat_message nul[1] = {{"user", NULL}};
    ck_assert_int_eq(cai_chat_render(CAI_CHAT_PLAIN, nul, 1, &b), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_chat_render(CAI_CHAT_COUNT, m, 1, &b), CAI_ERR_INVALID_ARG);
    cai_byte_buf_free(&b);
}
END_TEST

/* ------------------------------------------------------------------ result lines */

/* The line parsed back: exactly one '\n', at the end. */
static json_t *read_line(const cai_byte_buf *b) {
    ck_assert_uint_gt(b->len, 1);
    ck_assert_int_eq(b->data[b->len - 1], '\n');
    ck_assert_ptr_null(memchr(b->data, '\n', b->len - 1));
    json_error_t e;
    json_t *o = json_loadb(b->data, b->len - 1, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
    ck_assert_msg(o != NULL, "%s: %.*s", e.text, (int)b->len, b->data);
    return o;
}

static const char *jget_str(json_t *o, const char *path) {
    json_t *v = o;
    char key[64];
    while (*path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        memcpy(key, path, n);
        key[n] = '\0';
        if (json_is_array(v)) v = json_array_get(v, (size_t)atoi(key));
        else v = json_object_get(v, key);
        path += n + (dot != NULL);
    }
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static json_t *jget(json_t *o, const char *path) {
    json_t *v = o;
    char key[64];
    while (*path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        memcpy(key, path, n);
        key[n] = '\0';
        if (json_is_array(v)) v = json_array_get(v, (size_t)atoi(key));
        else v = json_object_get(v, key);
        path += n + (dot != NULL);
    }
    return v;
}

static long long jint(json_t *o, const char *path) {
    json_t *v = jget(o, path);
    ck_assert_msg(json_is_integer(v), "%s is not an integer", path);
    return (long long)json_integer_value(v);
}

static double jnum(json_t *o, const char *path) {
    json_t *v = jget(o, path);
    ck_assert_msg(json_is_number(v), "%s is not a number", path);
    return json_number_value(v);
}

/* A tiny trained tokenizer and the ids of 'h' and of the lone byte 0xC3. */
static cai_bpe_t *tiny_tok(int32_t *id_h, int32_t *id_c3) {
    const char *corpus[] = {"h\xC3\xA9llo h\xC3\xA9llo world world"};
    cai_bpe_train_opts o = {256 + 4, NULL, 0, 0};
    cai_bpe_t *t = NULL;
    CK_CAI(cai_bpe_train(corpus, NULL, 1, &o, &t));
    *id_h = *id_c3 = -1;
    for (int32_t i = 0; i < cai_bpe_vocab_size(t); i++) {
        const char *b;
        size_t n;
        if (cai_bpe_token_bytes(t, i, &b, &n) != CAI_OK || n != 1) continue;
        if (b[0] == 'h') *id_h = i;
        if ((unsigned char)b[0] == 0xC3) *id_c3 = i;
    }
    ck_assert_int_ge(*id_h, 0);
    ck_assert_int_ge(*id_c3, 0);
    return t;
}

START_TEST(native_result_lines_read_back) {
    int32_t ids[3] = {11, 22, 33};
    cai_job_result r = {0};
    r.id = "a1";
    r.format = CAI_JOB_NATIVE;
    r.text = "Hi \"there\"\nok";
    r.text_len = strlen(r.text);
    r.token_ids = ids;
    r.n_tokens = 3;
    r.finish_reason = "length";
    r.prompt_tokens = 5;
    cai_byte_buf b = {0};
    CK_CAI(cai_job_result_line(&r, &b));
    json_t *o = read_line(&b);
    ck_assert_str_eq(jget_str(o, "id"), "a1");
    ck_assert_str_eq(jget_str(o, "text"), "Hi \"there\"\nok");
    ck_assert_uint_eq(json_array_size(jget(o, "token_ids")), 3);
    ck_assert_int_eq(jint(o, "token_ids.2"), 33);
    ck_assert_str_eq(jget_str(o, "finish_reason"), "length");
    ck_assert_int_eq(jint(o, "usage.prompt_tokens"), 5);
    ck_assert_int_eq(jint(o, "usage.completion_tokens"), 3);
    ck_assert_int_eq(jint(o, "usage.total_tokens"), 8);
    ck_assert_ptr_null(jget(o, "logprobs"));
    ck_assert_ptr_null(jget(o, "error"));
    json_decref(o);

    /* appended: a second line after the first */
    size_t first = b.len;
    cai_sample_result lp[3] = {{0}};
    for (int i = 0; i < 3; i++) {
        lp[i].token = ids[i];
        lp[i].logprob = -0.25f * (float)(i + 1);
        lp[i].n_top = 2;
        lp[i].top_ids[0] = ids[i];
        lp[i].top_logprobs[0] = lp[i].logprob;
        lp[i].top_ids[1] = 99;
        lp[i].top_logprobs[1] = -INFINITY;
    }
    r.logprobs = lp;
    r.finish_reason = "stop";
    CK_CAI(cai_job_result_line(&r, &b));
    cai_byte_buf second = {b.data + first, b.len - first, 0};
    o = read_line(&second);
    ck_assert_uint_eq(json_array_size(jget(o, "logprobs")), 3);
    ck_assert_int_eq(jint(o, "logprobs.1.token_id"), 22);
    ck_assert_ptr_null(jget(o, "logprobs.1.token")); /* no tokenizer: ids only */
    ck_assert_double_eq(jnum(o, "logprobs.1.logprob"), -0.5);
    ck_assert_int_eq(jint(o, "logprobs.2.top_logprobs.1.token_id"), 99);
    ck_assert_double_eq(jnum(o, "logprobs.2.top_logprobs.1.logprob"), -9999.0);
    ck_assert_ptr_nonnull(strstr(second.data, "\"logprob\":-0.75"));
    json_decref(o);
    cai_byte_buf_free(&b);

    /* with a tokenizer: tokens spelled, a lone byte of a character replaced */
    int32_t h, c3;
    cai_bpe_t *tok = tiny_tok(&h, &c3);
    int32_t tids[2] = {h, c3};
    cai_sample_result tlp[2] = {{0}};
    tlp[0].token = h;
    tlp[0].n_top = 1;
    tlp[0].top_ids[0] = c3;
    tlp[1].token = c3;
    r.token_ids = tids;
    r.n_tokens = 2;
    r.logprobs = tlp;
    r.tok = tok;
    r.text = "h\xC3";
    r.text_len = 2;
    CK_CAI(cai_job_result_line(&r, &b));
    o = read_line(&b);
    ck_assert_str_eq(jget_str(o, "text"), "h\xEF\xBF\xBD");
    ck_assert_str_eq(jget_str(o, "logprobs.0.token"), "h");
    ck_assert_str_eq(jget_str(o, "logprobs.0.top_logprobs.0.token"), "\xEF\xBF\xBD");
    ck_assert_int_eq(jint(o, "logprobs.0.top_logprobs.0.token_id"), c3);
    ck_assert_str_eq(jget_str(o, "logprobs.1.token"), "\xEF\xBF\xBD");
    ck_assert_uint_eq(json_array_size(jget(o, "logprobs.1.top_logprobs")), 0);
    json_decref(o);
    cai_byte_buf_free(&b);

    /* an out-of-vocabulary id in the logprobs is the caller's bug, reported */
    tlp[1].token = 1 << 30;
    ck_assert_int_ne(cai_job_result_line(&r, &b), CAI_OK);
    cai_error_clear();
    cai_byte_buf_free(&b);
    cai_bpe_free(tok);

    /* a failed request */
    cai_job_result e = {0};
    e.id = "bad-7";
    e.format = CAI_JOB_NATIVE;
    e.finish_reason = "error";
    e.error = "req.jsonl:7: field 'temperature': must be a number";
    CK_CAI(cai_job_result_line(&e, &b));
    o = read_line(&b);
    ck_assert_str_eq(jget_str(o, "id"), "bad-7");
    ck_assert_str_eq(jget_str(o, "text"), "");
    ck_assert_uint_eq(json_array_size(jget(o, "token_ids")), 0);
    ck_assert_str_eq(jget_str(o, "finish_reason"), "error");
    ck_assert_str_eq(jget_str(o, "error"), e.error);
    ck_assert_int_eq(jint(o, "usage.total_tokens"), 0);
    json_decref(o);
    cai_byte_buf_free(&b);

    cai_job_result z = {0};
    z.id = "z";
    z.finish_reason = "stop";
    ck_assert_int_eq(cai_job_result_line(&z, &b), CAI_ERR_INVALID_ARG); /* format AUTO */
    z.format = CAI_JOB_NATIVE;
    z.finish_reason = NULL;
    ck_assert_int_eq(cai_job_result_line(&z, &b), CAI_ERR_INVALID_ARG);
    cai_byte_buf_free(&b);
}
END_TEST

START_TEST(openai_result_lines_read_back) {
    int32_t h, c3;
    cai_bpe_t *tok = tiny_tok(&h, &c3);
    int32_t ids[2] = {h, c3};
    cai_sample_result lp[2] = {{0}};
    lp[0].token = h;
    lp[0].logprob = -0.5f;
    lp[0].n_top = 2;
    lp[0].top_ids[0] = h;
    lp[0].top_logprobs[0] = -0.5f;
    lp[0].top_ids[1] = c3;
    lp[0].top_logprobs[1] = -1.5f;
    lp[1].token = c3;
    lp[1].logprob = -2.0f;
    cai_job_result r = {0};
    r.id = "request-1";
    r.format = CAI_JOB_OPENAI;
    r.chat = 1;
    r.model = "tiny";
    r.text = "h\xC3";
    r.text_len = 2;
    r.token_ids = ids;
    r.n_tokens = 2;
    r.finish_reason = "stop";
    r.prompt_tokens = 4;
    r.tok = tok;
    cai_byte_buf b = {0};
    CK_CAI(cai_job_result_line(&r, &b));
    json_t *o = read_line(&b);
    ck_assert_str_eq(jget_str(o, "id"), "batch_req_request-1");
    ck_assert_str_eq(jget_str(o, "custom_id"), "request-1");
    ck_assert(json_is_null(jget(o, "error")));
    ck_assert_int_eq(jint(o, "response.status_code"), 200);
    ck_assert_str_eq(jget_str(o, "response.request_id"), "request-1");
    ck_assert_str_eq(jget_str(o, "response.body.id"), "chatcmpl-request-1");
    ck_assert_str_eq(jget_str(o, "response.body.object"), "chat.completion");
    ck_assert_int_gt(jint(o, "response.body.created"), 1600000000);
    ck_assert_str_eq(jget_str(o, "response.body.model"), "tiny");
    ck_assert_uint_eq(json_array_size(jget(o, "response.body.choices")), 1);
    ck_assert_int_eq(jint(o, "response.body.choices.0.index"), 0);
    ck_assert_str_eq(jget_str(o, "response.body.choices.0.message.role"), "assistant");
    ck_assert_str_eq(jget_str(o, "response.body.choices.0.message.content"), "h\xEF\xBF\xBD");
    ck_assert_str_eq(jget_str(o, "response.body.choices.0.finish_reason"), "stop");
    ck_assert(json_is_null(jget(o, "response.body.choices.0.logprobs")));
    ck_assert_int_eq(jint(o, "response.body.usage.prompt_tokens"), 4);
    ck_assert_int_eq(jint(o, "response.body.usage.completion_tokens"), 2);
    ck_assert_int_eq(jint(o, "response.body.usage.total_tokens"), 6);
    json_decref(o);
    cai_byte_buf_free(&b);

    /* chat logprobs: OpenAI's content list, with each token's raw bytes */
    r.logprobs = lp;
    r.model = NULL;
    CK_CAI(cai_job_result_line(&r, &b));
    o = read_line(&b);
    ck_assert_str_eq(jget_str(o, "response.body.model"), "colossal");
    const char *base = "response.body.choices.0.logprobs.content";
    char p[128];
    ck_assert_uint_eq(json_array_size(jget(o, base)), 2);
    snprintf(p, sizeof p, "%s.0.token", base);
    ck_assert_str_eq(jget_str(o, p), "h");
    snprintf(p, sizeof p, "%s.0.logprob", base);
    ck_assert_double_eq(jnum(o, p), -0.5);
    snprintf(p, sizeof p, "%s.0.bytes.0", base);
    ck_assert_int_eq(jint(o, p), 'h');
    snprintf(p, sizeof p, "%s.0.top_logprobs.1.token", base);
    ck_assert_str_eq(jget_str(o, p), "\xEF\xBF\xBD");
    snprintf(p, sizeof p, "%s.0.top_logprobs.1.bytes.0", base);
    ck_assert_int_eq(jint(o, p), 0xC3);
    snprintf(p, sizeof p, "%s.1.bytes", base);
    ck_assert_uint_eq(json_array_size(jget(o, p)), 1);
    snprintf(p, sizeof p, "%s.1.top_logprobs", base);
    ck_assert_uint_eq(json_array_size(jget(o, p)), 0);
    json_decref(o);
    cai_byte_buf_free(&b);

    /* completions: text, and the legacy logprobs shape */
    r.chat = 0;
    CK_CAI(cai_job_result_line(&r, &b));
    o = read_line(&b);
    ck_assert_str_eq(jget_str(o, "response.body.id"), "cmpl-request-1");
    ck_assert_str_eq(jget_str(o, "response.body.object"), "text_completion");
    ck_assert_str_eq(jget_str(o, "response.body.choices.0.text"), "h\xEF\xBF\xBD");
    ck_assert_ptr_null(jget(o, "response.body.choices.0.message"));
    json_t *l = jget(o, "response.body.choices.0.logprobs");
    ck_assert_str_eq(jget_str(l, "tokens.0"), "h");
    ck_assert_str_eq(jget_str(l, "tokens.1"), "\xEF\xBF\xBD");
    ck_assert_double_eq(jnum(l, "token_logprobs.1"), -2.0);
    ck_assert_int_eq(jint(l, "text_offset.0"), 0);
    ck_assert_int_eq(jint(l, "text_offset.1"), 1);
    ck_assert_uint_eq(json_object_size(jget(l, "top_logprobs.0")), 2);
    ck_assert_double_eq(jnum(l, "top_logprobs.0.h"), -0.5);
    ck_assert_double_eq(json_number_value(json_object_get(jget(l, "top_logprobs.0"), "\xEF\xBF\xBD")), -1.5);
    /* the chosen token is always listed, as OpenAI documents */
    ck_assert_uint_eq(json_object_size(jget(l, "top_logprobs.1")), 1);
    json_decref(o);
    cai_byte_buf_free(&b);

    /* no tokenizer: vLLM's "token_id:N" spelling */
    r.tok = NULL;
    CK_CAI(cai_job_result_line(&r, &b));
    o = read_line(&b);
    char want[32];
    snprintf(want, sizeof want, "token_id:%d", (int)h);
    ck_assert_str_eq(jget_str(o, "response.body.choices.0.logprobs.tokens.0"), want);
    json_decref(o);
    cai_byte_buf_free(&b);
    r.tok = tok;

    /* a failed request: status 400 with OpenAI's error body */
    cai_job_result e = {0};
    e.id = "c9";
    e.format = CAI_JOB_OPENAI;
    e.chat = 1;
    e.finish_reason = "error";
    e.error = "req.jsonl:9: field 'body.n': must be 1";
    CK_CAI(cai_job_result_line(&e, &b));
    o = read_line(&b);
    ck_assert_str_eq(jget_str(o, "id"), "batch_req_c9");
    ck_assert_str_eq(jget_str(o, "custom_id"), "c9");
    ck_assert_int_eq(jint(o, "response.status_code"), 400);
    ck_assert_str_eq(jget_str(o, "response.request_id"), "c9");
    ck_assert_str_eq(jget_str(o, "response.body.error.message"), e.error);
    ck_assert_str_eq(jget_str(o, "response.body.error.type"), "invalid_request_error");
    ck_assert_ptr_null(jget(o, "response.body.choices"));
    ck_assert_str_eq(jget_str(o, "error.code"), "invalid_request");
    ck_assert_str_eq(jget_str(o, "error.message"), e.error);
    json_decref(o);
    cai_byte_buf_free(&b);
    cai_bpe_free(tok);
}
END_TEST

START_TEST(invalid_utf8_becomes_replacement_characters) {
    static const struct {
        const char *in, *out;
    } k[] = {
        {"plain ascii", "plain ascii"},
        {"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"}, /* é € 😀 */
        {"a\xC3(b", "a\xEF\xBF\xBD(b"},
        {"end\xF0\x9F\x98", "end\xEF\xBF\xBD"},                                   /* cut 4-byte character: one */
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},                 /* a surrogate: three */
        {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},                                 /* overlong */
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* past U+10FFFF */
        {"\xE2\x82x", "\xEF\xBF\xBDx"},
        {"\xFF\xFE", "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\x80", "\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        cai_job_result r = {0};
        r.id = "u";
        r.format = CAI_JOB_NATIVE;
        r.text = k[i].in;
        r.text_len = strlen(k[i].in);
        r.finish_reason = "stop";
        cai_byte_buf b = {0};
        CK_CAI(cai_job_result_line(&r, &b));
        json_t *o = read_line(&b);
        ck_assert_msg(strcmp(jget_str(o, "text"), k[i].out) == 0, "case %zu", i);
        json_decref(o);
        cai_byte_buf_free(&b);
    }
    /* a NUL byte and control characters survive, escaped, on one line */
    cai_job_result r = {0};
    r.id = "bad\xFF id";
    r.format = CAI_JOB_OPENAI;
    r.text = "a\0b\r\n\x01";
    r.text_len = 6;
    r.finish_reason = "length";
    cai_byte_buf b = {0};
    CK_CAI(cai_job_result_line(&r, &b));
    json_t *o = read_line(&b);
    ck_assert_str_eq(jget_str(o, "custom_id"), "bad\xEF\xBF\xBD id");
    json_t *c = jget(o, "response.body.choices.0.text");
    ck_assert_uint_eq(json_string_length(c), 6);
    ck_assert_int_eq(memcmp(json_string_value(c), "a\0b\r\n\x01", 6), 0);
    json_decref(o);
    cai_byte_buf_free(&b);
}
END_TEST

/* ------------------------------------------------------------------ id sets and output scans */

START_TEST(id_set_adds_finds_and_grows) {
    cai_id_set_t *s;
    CK_CAI(cai_id_set_create(&s));
    ck_assert_uint_eq(cai_id_set_count(s), 0);
    ck_assert(!cai_id_set_has(s, "a"));
    CK_CAI(cai_id_set_add(s, "a"));
    CK_CAI(cai_id_set_add(s, "a"));
    ck_assert_uint_eq(cai_id_set_count(s), 1);
    ck_assert(cai_id_set_has(s, "a"));
    ck_assert(!cai_id_set_has(s, "A"));
    CK_CAI(cai_id_set_add(s, ""));
    ck_assert(cai_id_set_has(s, ""));
    char id[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "req-%d", i);
        CK_CAI(cai_id_set_add(s, id));
        if (i % 2 == 0) CK_CAI(cai_id_set_add(s, id));
    }
    ck_assert_uint_eq(cai_id_set_count(s), 5002);
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "req-%d", i);
        ck_assert_msg(cai_id_set_has(s, id), "%s lost", id);
        snprintf(id, sizeof id, "req-%d", i + 5000);
        ck_assert_msg(!cai_id_set_has(s, id), "%s found", id);
    }
    /* the set owns copies */
    snprintf(id, sizeof id, "temp");
    CK_CAI(cai_id_set_add(s, id));
    id[0] = 'T';
    ck_assert(cai_id_set_has(s, "temp"));
    cai_id_set_free(s);
    cai_id_set_free(NULL);
}
END_TEST

static void write_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

static long long file_size(const char *path) {
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    return (long long)sb.st_size;
}

START_TEST(output_scan_collects_ids_and_cuts_a_partial_line) {
    char path[512];
    snprintf(path, sizeof path, "%s/out.jsonl", g_dir);
    unlink(path);
    cai_id_set_t *s;
    CK_CAI(cai_id_set_create(&s));
    int64_t kept = -1, cut = -1;
    /* missing file: nothing done yet */
    CK_CAI(cai_job_output_scan(path, s, &kept, &cut));
    ck_assert_int_eq(kept, 0);
    ck_assert_int_eq(cut, 0);
    ck_assert_uint_eq(cai_id_set_count(s), 0);

    /* lines as the writer writes them, then half a line */
    cai_byte_buf b = {0};
    cai_job_result r = {0};
    r.finish_reason = "stop";
    r.text = "x\0y"; /* written as \u0000, read back */
    r.text_len = 3;
    r.id = "n1";
    r.format = CAI_JOB_NATIVE;
    CK_CAI(cai_job_result_line(&r, &b));
    r.id = "o1";
    r.format = CAI_JOB_OPENAI;
    r.chat = 1;
    CK_CAI(cai_job_result_line(&r, &b));
    r.id = "o2";
    r.finish_reason = "error";
    r.error = "bad line";
    CK_CAI(cai_job_result_line(&r, &b));
    const char *extra = "{\"id\": 42, \"text\": \"\"}\n\n"; /* a blank line is skipped */
    const char *partial = "{\"id\": \"n9\", \"te";
    size_t whole = b.len + strlen(extra);
    char *all = malloc(whole + strlen(partial));
    ck_assert_ptr_nonnull(all);
    memcpy(all, b.data, b.len);
    memcpy(all + b.len, extra, strlen(extra));
    memcpy(all + whole, partial, strlen(partial));
    write_file(path, all, whole + strlen(partial));
    CK_CAI(cai_job_output_scan(path, s, &kept, &cut));
    ck_assert_int_eq(kept, 4);
    ck_assert_int_eq(cut, (int64_t)strlen(partial));
    ck_assert_int_eq(file_size(path), (long long)whole);
    ck_assert_uint_eq(cai_id_set_count(s), 4);
    ck_assert(cai_id_set_has(s, "n1"));
    ck_assert(cai_id_set_has(s, "o1")); /* custom_id, not "batch_req_o1" */
    ck_assert(!cai_id_set_has(s, "batch_req_o1"));
    ck_assert(cai_id_set_has(s, "o2"));
    ck_assert(cai_id_set_has(s, "42"));
    ck_assert(!cai_id_set_has(s, "n9"));
    /* again: nothing more to cut, the same ids */
    CK_CAI(cai_job_output_scan(path, s, &kept, &cut));
    ck_assert_int_eq(kept, 4);
    ck_assert_int_eq(cut, 0);
    ck_assert_int_eq(file_size(path), (long long)whole);
    ck_assert_uint_eq(cai_id_set_count(s), 4);
    cai_id_set_free(s);

    /* a whole line that is not a result is never dropped */
    const char *garbage[] = {
        "{\"id\": \"a\"}\nnot json at all\n{\"id\": \"b\"}\n",
        "{\"id\": \"a\"}\n[1, 2]\n",
        "{\"id\": \"a\"}\n{\"text\": \"no id\"}\n",
        "{\"id\": \"a\"}\n{\"id\": 1.5}\n",
    };
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        write_file(path, garbage[i], strlen(garbage[i]));
        CK_CAI(cai_id_set_create(&s));
        ck_assert_int_eq(cai_job_output_scan(path, s, &kept, &cut), CAI_ERR_FORMAT);
        char want[600];
        snprintf(want, sizeof want, "%s:2: not a result line", path);
        ck_assert_msg(strstr(cai_error_message(), want), "case %zu: %s", i, cai_error_message());
        ck_assert_int_eq(file_size(path), (long long)strlen(garbage[i]));
        cai_id_set_free(s);
        cai_error_clear();
    }
    /* a partial last line that is garbage is cut, not refused */
    write_file(path, "{\"id\": \"a\"}\n\x01garbage", 20);
    CK_CAI(cai_id_set_create(&s));
    CK_CAI(cai_job_output_scan(path, s, NULL, NULL));
    ck_assert_int_eq(file_size(path), 12);
    ck_assert(cai_id_set_has(s, "a"));
    cai_id_set_free(s);
    /* a file of only a partial line becomes empty */
    write_file(path, "{\"id\"", 5);
    CK_CAI(cai_id_set_create(&s));
    CK_CAI(cai_job_output_scan(path, s, &kept, &cut));
    ck_assert_int_eq(kept, 0);
    ck_assert_int_eq(cut, 5);
    ck_assert_int_eq(file_size(path), 0);
    cai_id_set_free(s);
    unlink(path);
    free(all);
    cai_byte_buf_free(&b);
}
END_TEST

/* ------------------------------------------------------------------ multiple-choice items */

START_TEST(choice_items_good_and_bad) {
    cai_choice_item c;
    const char *good =
        "{\"id\": \"q1\", \"context\": \"The sky is\", \"choices\": [\" blue\", \" green\", \" loud\"], "
        "\"answer\": 0, \"source\": \"x\"}";
    CK_CAI(cai_choice_item_parse("mc.jsonl", 3, good, strlen(good), &c));
    ck_assert_str_eq(c.id, "q1");
    ck_assert_str_eq(c.context, "The sky is");
    ck_assert_int_eq(c.n_choices, 3);
    ck_assert_str_eq(c.choices[2], " loud");
    ck_assert_int_eq(c.answer, 0);
    ck_assert_int_eq(c.line, 3);
    cai_choice_item_free(&c);
    ck_assert_ptr_null(c.id);
    const char *noans = "{\"id\": 8, \"context\": \"\", \"choices\": [\"a\", \"b\"]}";
    CK_CAI(cai_choice_item_parse("mc.jsonl", 4, noans, strlen(noans), &c));
    ck_assert_str_eq(c.id, "8");
    ck_assert_str_eq(c.context, "");
    ck_assert_int_eq(c.answer, -1);
    cai_choice_item_free(&c);

    static const struct {
        const char *line, *id, *need;
    } bad[] = {
        {"", NULL, "empty line"},
        {"{\"id\": \"q\",", NULL, "not valid JSON"},
        {"[]", NULL, "must be a JSON object"},
        {"{\"context\": \"c\", \"choices\": [\"a\", \"b\"]}", NULL, "field 'id' is missing"},
        {"{\"id\": \"q\", \"choices\": [\"a\", \"b\"]}", "q", "field 'context'"},
        {"{\"id\": \"q\", \"context\": 1, \"choices\": [\"a\", \"b\"]}", "q", "field 'context'"},
        {"{\"id\": \"q\", \"context\": \"c\"}", "q", "field 'choices'"},
        {"{\"id\": \"q\", \"context\": \"c\", \"choices\": [\"a\"]}", "q", "at least 2"},
        {"{\"id\": \"q\", \"context\": \"c\", \"choices\": \"ab\"}", "q", "field 'choices'"},
        {"{\"id\": \"q\", \"context\": \"c\", \"choices\": [\"a\", 2]}", "q", "field 'choices[1]'"},
        {"{\"id\": \"q\", \"context\": \"c\", \"choices\": [\"a\", \"\"]}", "q", "field 'choices[1]'"},
        {"{\"id\": \"q\", \"context\": \"c\", \"choices\": [\"a\", \"b\"], \"answer\": 2}", "q", "field 'answer'"},
        {"{\"id\": \"q\", \"context\": \"c\", \"choices\": [\"a\", \"b\"], \"answer\": -1}", "q",
         "out of range [0, 1]"},
        {"{\"id\": \"q\", \"context\": \"c\", \"choices\": [\"a\", \"b\"], \"answer\": \"a\"}", "q", "an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cai_status st = cai_choice_item_parse("mc.jsonl", 5, bad[i].line, strlen(bad[i].line), &c);
        const char *msg = cai_error_message();
        ck_assert_msg(st == CAI_ERR_FORMAT, "case %zu: %s", i, msg);
        ck_assert_msg(strncmp(msg, "mc.jsonl:5: ", 12) == 0 && strstr(msg, bad[i].need), "case %zu: %s", i, msg);
        if (bad[i].id) ck_assert_str_eq(c.id, bad[i].id);
        else ck_assert_ptr_null(c.id);
        ck_assert_ptr_null(c.context);
        ck_assert_ptr_null(c.choices);
        ck_assert_int_eq(c.n_choices, 0);
        cai_choice_item_free(&c);
        cai_error_clear();
    }
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    snprintf(g_dir, sizeof g_dir, "/tmp/cai_test_job_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        MPI_Finalize();
        return 1;
    }
    Suite *s = suite_create("job");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, native_prompt_with_every_sampling_override);
    tcase_add_test(tc, native_messages_token_ids_and_logprob_forms);
    tcase_add_test(tc, openai_chat_line);
    tcase_add_test(tc, openai_completion_lines);
    tcase_add_test(tc, malformed_lines_name_file_line_and_field);
    tcase_add_test(tc, unknown_keys_refused_when_strict_ignored_when_lenient);
    tcase_add_test(tc, chat_templates_render_exactly);
    tcase_add_test(tc, native_result_lines_read_back);
    tcase_add_test(tc, openai_result_lines_read_back);
    tcase_add_test(tc, invalid_utf8_becomes_replacement_characters);
    tcase_add_test(tc, id_set_adds_finds_and_grows);
    tcase_add_test(tc, output_scan_collects_ids_and_cuts_a_partial_line);
    tcase_add_test(tc, choice_items_good_and_bad);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    rmdir(g_dir);
    MPI_Finalize();
    return failed ? 1 : 0;
}
