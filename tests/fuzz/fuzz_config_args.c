/* libFuzzer target: the command-line parser (cai_config_parse_args,
 * src/config/config_args.c). The input is split at '\0' and '\n' into argv
 * (argv[0] is "fuzz"); a --config value is replaced by a small YAML file in
 * the scratch directory so the fuzzer never opens arbitrary paths. */
#include "fuzz_config_schema.h"
#include "fuzz_util.h"

static const char *yaml_path;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fuzz_setup();
    static const char yaml[] = "train:\n  steps: 5\n  mode: slow\nrun.name: \"from file\"\nmem: {limit: 2GiB}\n";
    yaml_path = fuzz_file(3, "args.yaml", yaml, sizeof yaml - 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *buf = malloc(size + 1);
    char **argv = malloc((size + 3) * sizeof *argv);
    char *cfgarg = malloc(strlen(yaml_path) + 16);
    if (!buf || !argv || !cfgarg) abort();
    memcpy(buf, data, size);
    buf[size] = '\0';
    int argc = 0;
    argv[argc++] = "fuzz";
    char *p = buf;
    for (size_t i = 0; i <= size; i++)
        if (buf[i] == '\0' || buf[i] == '\n') {
            buf[i] = '\0';
            argv[argc++] = p;
            p = buf + i + 1;
        }
    sprintf(cfgarg, "--config=%s", yaml_path);
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--config=", 9) == 0) {
            argv[i] = cfgarg;
        } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            argv[++i] = (char *)yaml_path;
        }
    }
    argv[argc] = NULL;
    fuzz_cfg cfg;
    int help = 0;
    if (cai_config_parse_args(&fuzz_schema, &cfg, argc, argv, &help) != CAI_OK) cai_error_clear();
    cai_config_free(&fuzz_schema, &cfg);
    free(cfgarg);
    free(argv);
    free(buf);
    return 0;
}
