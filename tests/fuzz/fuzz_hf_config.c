/* libFuzzer target: the Hugging Face config.json reader
 * (cai_hf_config_load, src/ckpt/hf_config.c) on an arbitrary file. A config
 * it accepts is written back (cai_hf_config_json) and must load again. */
#include "colossal/ckpt.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, "config.json", data, size);
    cai_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (cai_hf_config_load(path, &cfg) != CAI_OK) {
        cai_error_clear();
        return 0;
    }
    char *text = NULL;
    if (cai_hf_config_json(&cfg, CAI_DTYPE_F32, 0, 0, &text) != CAI_OK) {
        /* a loaded config that cannot be written is not a crash, but note it */
        cai_error_clear();
        return 0;
    }
    path = fuzz_file(1, "config2.json", text, strlen(text));
    cai_model_config again;
    memset(&again, 0, sizeof again);
    if (cai_hf_config_load(path, &again) != CAI_OK) {
        fprintf(stderr, "fuzz: config.json written from a loaded config does not load again:\n%s\n%s\n", text,
                cai_error_message());
        abort();
    }
    free(text);
    return 0;
}
