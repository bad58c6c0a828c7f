/* libFuzzer target: colossal-infer's batch-job lines (src/infer/request.c,
 * src/infer/job_io.c). The first byte picks what the rest is: a request line
 * (native, OpenAI or auto; strict or lenient keys), a multiple-choice item,
 * or an output file to scan for the ids it answers. A request that parses
 * is answered with a result line, which must be one line of JSON whose id
 * the output scan finds again. */
#include "colossal/infer.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    return 0;
}

static void request(const char *text, size_t len, int mode) {
    const cai_sampling_params d = cai_sampling_default();
    cai_job_request r;
    if (cai_job_request_parse("fuzz.jsonl", 1, text, len, (cai_job_format)(mode % CAI_JOB_FORMAT_COUNT), &d,
                              (mode / CAI_JOB_FORMAT_COUNT) & 1, &r) != CAI_OK) {
        cai_error_clear();
        cai_job_request_free(&r);
        return;
    }
    cai_byte_buf prompt = {0};
    if (r.chat &&
        cai_chat_render((cai_chat_template)(mode % CAI_CHAT_COUNT), r.messages, r.n_messages, &prompt) != CAI_OK) {
        fprintf(stderr, "fuzz: a parsed chat request does not render: %s\n", cai_error_message());
        abort();
    }
    const int32_t ids[2] = {1, 2};
    cai_job_result res = {.id = r.id,
                          .format = r.format,
                          .chat = r.chat,
                          .model = r.model,
                          .text = prompt.data,
                          .text_len = prompt.len,
                          .token_ids = ids,
                          .n_tokens = 2,
                          .finish_reason = "length",
                          .prompt_tokens = 3};
    cai_byte_buf line = {0};
    if (cai_job_result_line(&res, &line) != CAI_OK) {
        fprintf(stderr, "fuzz: no result line for a parsed request: %s\n", cai_error_message());
        abort();
    }
    if (line.len == 0 || line.data[line.len - 1] != '\n' || memchr(line.data, '\n', line.len - 1)) {
        fprintf(stderr, "fuzz: the result line is not one line\n");
        abort();
    }
    const char *path = fuzz_file(1, "out.jsonl", line.data, line.len);
    cai_id_set_t *done = NULL;
    if (cai_id_set_create(&done) != CAI_OK || cai_job_output_scan(path, done, NULL, NULL) != CAI_OK ||
        !cai_id_set_has(done, r.id)) {
        fprintf(stderr, "fuzz: the output scan does not find id '%s' in its own result line: %s\n", r.id,
                cai_error_message());
        abort();
    }
    cai_id_set_free(done);
    cai_byte_buf_free(&line);
    cai_byte_buf_free(&prompt);
    cai_job_request_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int mode = data[0];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    if (mode < 128) {
        request(text, len, mode);
    } else if (mode < 192) {
        cai_choice_item c;
        if (cai_choice_item_parse("fuzz.jsonl", 1, text, len, &c) != CAI_OK) cai_error_clear();
        cai_choice_item_free(&c);
    } else {
        const char *path = fuzz_file(0, "output.jsonl", text, len);
        cai_id_set_t *done = NULL;
        if (cai_id_set_create(&done) == CAI_OK && cai_job_output_scan(path, done, NULL, NULL) != CAI_OK)
            cai_error_clear();
        cai_id_set_free(done);
    }
    return 0;
}
