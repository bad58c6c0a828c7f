/* Shared helpers of the libFuzzer targets (tests/fuzz/README.md). Parsers
 * that only read files get the input through a file in a per-process
 * scratch directory (under $TMPDIR, /dev/shm when it exists), rewritten on
 * every run; the directory is removed at exit. */
#ifndef CAI_FUZZ_UTIL_H
#define CAI_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colossal/base.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir[256];

static void fuzz_cleanup(void) {
    if (!fuzz_dir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_dir);
}

/* Quiet logging (parsers warn on odd input) and the scratch directory. */
static void fuzz_setup(void) {
    cai_log_options lo = {.level = CAI_LOG_ERROR, .rank_filter = CAI_LOG_ALL_RANKS, .out = NULL};
    FILE *null = fopen("/dev/null", "w");
    lo.out = null ? null : stderr;
    cai_log_configure(&lo);
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/cai-fuzz-XXXXXX", tmp);
    if (!mkdtemp(fuzz_dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fuzz_cleanup);
}

/* fuzz_dir/name, rewritten with data[0..size). Returns the path (static per name slot). */
__attribute__((unused)) static const char *fuzz_file(int slot, const char *name, const void *data, size_t size) {
    static char paths[4][300];
    char *path = paths[slot & 3];
    snprintf(path, sizeof paths[0], "%s/%s", fuzz_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror("fuzz: writing the input file");
        abort();
    }
    return path;
}

/* Split data at the first occurrence of the 4-byte separator "\n%%\n":
 * part a before it, part b after it (b empty when absent). */
__attribute__((unused)) static void fuzz_split(const uint8_t *data, size_t size, size_t *a_len, const uint8_t **b,
                                               size_t *b_len) {
    static const char sep[] = "\n%%\n";
    for (size_t i = 0; i + 4 <= size; i++)
        if (memcmp(data + i, sep, 4) == 0) {
            *a_len = i;
            *b = data + i + 4;
            *b_len = size - i - 4;
            return;
        }
    *a_len = size;
    *b = data + size;
    *b_len = 0;
}

#endif
