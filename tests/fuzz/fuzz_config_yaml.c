/* libFuzzer target: the YAML config loader (cai_config_load_yaml_string,
 * src/config/config_yaml.c) over a schema of every field type. An accepted
 * config is written out (cai_config_write_string) and must load back to the
 * same values. */
#include "fuzz_config_schema.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = '\0';
    fuzz_cfg cfg, back;
    if (cai_config_defaults(&fuzz_schema, &cfg) != CAI_OK) abort();
    if (cai_config_load_yaml_string(&fuzz_schema, &cfg, text, "fuzz.yaml") != CAI_OK) {
        cai_error_clear();
        /* all or nothing: a failed load leaves the defaults */
        if (cai_config_defaults(&fuzz_schema, &back) != CAI_OK) abort();
        if (cai_config_compare(&fuzz_schema, &cfg, &back) != NULL) abort();
        cai_config_free(&fuzz_schema, &back);
    } else {
        char *out = NULL;
        if (cai_config_write_string(&fuzz_schema, &cfg, &out) == CAI_OK) {
            if (cai_config_defaults(&fuzz_schema, &back) != CAI_OK) abort();
            if (cai_config_load_yaml_string(&fuzz_schema, &back, out, "written.yaml") != CAI_OK) {
                fprintf(stderr, "fuzz: the written config does not load back: %s\n%s\n", cai_error_message(), out);
                abort();
            }
            const cai_config_field *diff = cai_config_compare(&fuzz_schema, &cfg, &back);
            if (diff) {
                fprintf(stderr, "fuzz: %s differs after a write/load round trip:\n%s\n", diff->key, out);
                abort();
            }
            cai_config_free(&fuzz_schema, &back);
            free(out);
        } else {
            cai_error_clear(); /* a string that is not UTF-8 cannot be written */
        }
    }
    cai_config_free(&fuzz_schema, &cfg);
    free(text);
    return 0;
}
