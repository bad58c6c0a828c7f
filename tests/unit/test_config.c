/* Config module: YAML + CLI -> typed struct, errors that name key and line,
 * --help from the table, write -> load round trip. */
#include "cai_config.h"
#include "colossal/config.h"

#include <check.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef CAI_CONFIG_TEST_DATA
#define CAI_CONFIG_TEST_DATA "tests/data/config"
#endif

typedef struct {
    struct {
        double lr;
        int steps;
        int64_t tokens;
        int fused;
        int dtype;
        char *name;
    } train;
    struct {
        int tp, pp, schedule;
    } mesh;
    struct {
        struct {
            double eps;
        } norm;
    } model;
    char *out_dir;
    int64_t seed;
} tcfg;

static const char *const dtypes[] = {"f32", "bf16", "f16", NULL};
static const char *const schedules[] = {"1f1b", "interleaved", "zb-v", NULL};
enum { DT_F32, DT_BF16, DT_F16 };
enum { SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZBV };

static const cai_config_field fields[] = {
    {"train.lr", CAI_CFG_DOUBLE, offsetof(tcfg, train.lr), "3e-4", "peak learning rate", 0.0, 1.0, NULL, NULL},
    {"train.steps", CAI_CFG_INT, offsetof(tcfg, train.steps), "100", "optimizer steps", 1, 1000000, NULL, NULL},
    {"train.tokens", CAI_CFG_INT64, offsetof(tcfg, train.tokens), "1000000000000", "token budget", CAI_CFG_NO_RANGE,
     NULL, NULL},
    {"train.fused", CAI_CFG_BOOL, offsetof(tcfg, train.fused), "true", "use fused kernels", CAI_CFG_NO_RANGE, NULL,
     NULL},
    {"train.dtype", CAI_CFG_ENUM, offsetof(tcfg, train.dtype), "bf16", "compute dtype", CAI_CFG_NO_RANGE, dtypes, NULL},
    {"train.name", CAI_CFG_STRING, offsetof(tcfg, train.name), "run", "run name", CAI_CFG_NO_RANGE, NULL, NULL},
    {"mesh.tp", CAI_CFG_INT, offsetof(tcfg, mesh.tp), "1", "tensor-parallel size", 1, 64, NULL, "tp"},
    {"mesh.pp", CAI_CFG_INT, offsetof(tcfg, mesh.pp), "1", "pipeline stages", 1, 64, NULL, "pp"},
    {"mesh.schedule", CAI_CFG_ENUM, offsetof(tcfg, mesh.schedule), NULL, "pipeline schedule", CAI_CFG_NO_RANGE,
     schedules, NULL},
    {"model.norm.eps", CAI_CFG_DOUBLE, offsetof(tcfg, model.norm.eps), "1e-5", "norm epsilon", 0, 1, NULL, NULL},
    {"out_dir", CAI_CFG_STRING, offsetof(tcfg, out_dir), NULL, "run directory", CAI_CFG_NO_RANGE, NULL, NULL},
    {"seed", CAI_CFG_INT64, offsetof(tcfg, seed), "1234", "random seed", CAI_CFG_NO_RANGE, NULL, NULL},
};
static const cai_config_schema schema = {"colossal-test", "config module test program", fields,
                                         CAI_CFG_NFIELDS(fields)};

/* What --help must show for each field, worked out by hand from the table
 * (same order as `fields`). */
static const struct {
    const char *type, *def;
} help_expect[] = {
    {"double", "0.0003"},
    {"int", "100"},
    {"int64", "1000000000000"},
    {"[=bool]", "true"},
    {"{f32|bf16|f16}", "bf16"},
    {"string", "\"run\""},
    {"int", "1"},
    {"int", "1"},
    {"{1f1b|interleaved|zb-v}", "1f1b"},
    {"double", "1.0e-05"},
    {"string", "\"\""},
    {"int64", "1234"},
};

static char data_path[PATH_MAX];

static const char *data_file(const char *name) {
    const char *top = getenv("top_srcdir");
    if (top && *top) snprintf(data_path, sizeof data_path, "%s/tests/data/config/%s", top, name);
    else snprintf(data_path, sizeof data_path, "%s/%s", CAI_CONFIG_TEST_DATA, name);
    return data_path;
}

/* 1-based number of the first line of `path` containing `needle`: the
 * reference for the line an error must cite. */
static int line_containing(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char line[1024];
    int n = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        if (strstr(line, needle)) {
            found = n;
            break;
        }
    }
    fclose(f);
    ck_assert_msg(found, "%s has no line with '%s'", path, needle);
    return found;
}

#define ASSERT_MSG_HAS(text)                                                                                         \
    ck_assert_msg(strstr(cai_error_message(), (text)) != NULL, "error message '%s' lacks '%s'", cai_error_message(), \
                  (text))

/* Load a data file expecting CAI_ERR_CONFIG; check it cites file:line of
 * the line holding `marker` and mentions each of `needles`. */
static void expect_file_error(const char *file, const char *marker, const char *const *needles) {
    tcfg c;
    ck_assert_int_eq(cai_config_defaults(&schema, &c), CAI_OK);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", data_file(file));
    cai_error_clear();
    ck_assert_int_eq(cai_config_load_yaml(&schema, &c, path), CAI_ERR_CONFIG);
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%d", path, line_containing(path, marker));
    ASSERT_MSG_HAS(where);
    for (int i = 0; needles[i]; i++) ASSERT_MSG_HAS(needles[i]);
    cai_config_free(&schema, &c);
}

static cai_status parse(tcfg *c, int argc, const char *const *argv, int *help) {
    return cai_config_parse_args(&schema, c, argc, (char **)argv, help);
}

START_TEST(defaults_land_in_struct) {
    tcfg c;
    memset(&c, 0xab, sizeof c);
    ck_assert_int_eq(cai_config_defaults(&schema, &c), CAI_OK);
    ck_assert(c.train.lr == 3e-4);
    ck_assert_int_eq(c.train.steps, 100);
    ck_assert(c.train.tokens == INT64_C(1000000000000));
    ck_assert_int_eq(c.train.fused, 1);
    ck_assert_int_eq(c.train.dtype, DT_BF16);
    ck_assert_str_eq(c.train.name, "run");
    ck_assert_int_eq(c.mesh.tp, 1);
    ck_assert_int_eq(c.mesh.schedule, SCHED_1F1B); /* NULL default: first choice */
    ck_assert(c.model.norm.eps == 1e-5);
    ck_assert_ptr_nonnull(c.out_dir);
    ck_assert_str_eq(c.out_dir, "");
    ck_assert(c.seed == 1234);
    cai_config_free(&schema, &c);
    ck_assert_ptr_null(c.train.name);
    cai_config_free(&schema, &c); /* idempotent */
}
END_TEST

START_TEST(good_file_values_land) {
    tcfg c;
    ck_assert_int_eq(cai_config_defaults(&schema, &c), CAI_OK);
    ck_assert_int_eq(cai_config_load_yaml(&schema, &c, data_file("good.yaml")), CAI_OK);
    ck_assert(c.train.lr == 1.5e-3);
    ck_assert_int_eq(c.train.steps, 2000);
    ck_assert(c.train.tokens == INT64_C(5000000000));
    ck_assert_int_eq(c.train.fused, 0);
    ck_assert_int_eq(c.train.dtype, DT_F16);
    ck_assert_str_eq(c.train.name, "gpt2 small: #1");
    ck_assert_int_eq(c.mesh.tp, 2);
    ck_assert_int_eq(c.mesh.pp, 1); /* not in the file: default kept */
    ck_assert_int_eq(c.mesh.schedule, SCHED_ZBV);
    ck_assert(c.model.norm.eps == 1e-6);
    ck_assert_str_eq(c.out_dir, "runs/a");
    ck_assert(c.seed == -7);
    cai_config_free(&schema, &c);
}
END_TEST

START_TEST(cli_overrides_beat_yaml_in_argv_order) {
    tcfg c;
    char cfgarg[PATH_MAX + 16];
    snprintf(cfgarg, sizeof cfgarg, "--config=%s", data_file("good.yaml"));
    /* The lr override stands before --config and still wins. */
    const char *argv[] = {"prog", "--train.lr=0.5", cfgarg, "--tp",   "4",  "--mesh.tp=8",   "--train.steps",
                          "7",    "--out-dir",      "x/y",  "--seed", "-3", "--train.name=", "--train.fused"};
    int help = -1;
    ck_assert_int_eq(parse(&c, 14, argv, &help), CAI_OK);
    ck_assert_int_eq(help, 0);
    ck_assert(c.train.lr == 0.5);
    ck_assert_int_eq(c.mesh.tp, 8); /* alias then key: the later one wins */
    ck_assert_int_eq(c.train.steps, 7);
    ck_assert(c.train.tokens == INT64_C(5000000000)); /* from YAML */
    ck_assert_int_eq(c.train.dtype, DT_F16);          /* from YAML */
    ck_assert_int_eq(c.train.fused, 1);               /* YAML false, CLI bare flag */
    ck_assert_str_eq(c.out_dir, "x/y");               /* '-' matches '_' */
    ck_assert_str_eq(c.train.name, "");
    ck_assert(c.seed == -3); /* a negative number is a value, not an option */
    cai_config_free(&schema, &c);
}
END_TEST

START_TEST(alias_and_bool_forms) {
    tcfg c;
    const char *a1[] = {"prog", "--pp", "3", "--tp=2", "--no-train.fused"};
    ck_assert_int_eq(parse(&c, 5, a1, NULL), CAI_OK);
    ck_assert_int_eq(c.mesh.pp, 3);
    ck_assert_int_eq(c.mesh.tp, 2);
    ck_assert_int_eq(c.train.fused, 0);
    cai_config_free(&schema, &c);

    const char *a2[] = {"prog", "--train.fused", "off", "--mesh.schedule", "Interleaved"};
    ck_assert_int_eq(parse(&c, 5, a2, NULL), CAI_OK);
    ck_assert_int_eq(c.train.fused, 0);
    ck_assert_int_eq(c.mesh.schedule, SCHED_INTERLEAVED);
    cai_config_free(&schema, &c);

    const char *a3[] = {"prog", "--train.fused=no", "--train.fused=YES"};
    ck_assert_int_eq(parse(&c, 3, a3, NULL), CAI_OK);
    ck_assert_int_eq(c.train.fused, 1);
    cai_config_free(&schema, &c);

    const cai_config_field *f = cai_config_find(&schema, "tp");
    ck_assert_ptr_eq(f, &fields[6]);
    ck_assert_ptr_eq(cai_config_find(&schema, "out-dir"), &fields[10]);
    ck_assert_ptr_null(cai_config_find(&schema, "mesh"));
}
END_TEST

START_TEST(unknown_key_names_key_line_and_suggestion) {
    const char *const yaml_needles[] = {"unknown key 'train.lrr'", "did you mean 'train.lr'", NULL};
    expect_file_error("unknown_key.yaml", "lrr:", yaml_needles);

    tcfg c;
    const char *argv[] = {"prog", "--train.lrr=1"};
    ck_assert_int_eq(parse(&c, 2, argv, NULL), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("command line");
    ASSERT_MSG_HAS("'--train.lrr'");
    ASSERT_MSG_HAS("did you mean '--train.lr'");
    cai_config_free(&schema, &c);

    /* A key written at the wrong level is found by its last part. */
    ck_assert_int_eq(cai_config_defaults(&schema, &c), CAI_OK);
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "seed: 1\nlr: 0.1\n", "mem.yaml"), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("mem.yaml:2");
    ASSERT_MSG_HAS("did you mean 'train.lr'");
    /* A section used as a key lists its keys. */
    ck_assert_int_eq(cai_config_set(&schema, &c, "mesh", "2", "command line"), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("'mesh' is a section");
    ASSERT_MSG_HAS("mesh.tp");
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "train: 5\n", "mem.yaml"), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("mem.yaml:1");
    ASSERT_MSG_HAS("'train' is a section");
    cai_config_free(&schema, &c);
}
END_TEST

START_TEST(wrong_types_are_errors) {
    const char *const needles[] = {"key 'train.steps'", "'1.5'", "int", NULL};
    expect_file_error("bad_type.yaml", "1.5", needles);
    const char *const seq[] = {"key 'mesh.tp'", "got a sequence", NULL};
    expect_file_error("sequence.yaml", "[2, 4]", seq);

    static const struct {
        const char *key, *value;
    } bad[] = {
        {"train.lr", "abc"},
        {"train.lr", "1.0x"},
        {"train.lr", ""},
        {"train.lr", "nan"},
        {"train.lr", "1e999"},
        {"train.steps", "1.5"},
        {"train.steps", "1e3"},
        {"train.steps", "12abc"},
        {"train.steps", " 12"},
        {"train.steps", ""},
        {"train.steps", "99999999999"},
        {"train.steps", "2147483648"},
        {"train.tokens", "9223372036854775808"},
        {"train.tokens", "-9223372036854775809"},
        {"train.fused", "maybe"},
        {"train.fused", "2"},
        {"train.dtype", "fp8"},
    };
    tcfg c;
    ck_assert_int_eq(cai_config_defaults(&schema, &c), CAI_OK);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cai_error_clear();
        ck_assert_msg(cai_config_set(&schema, &c, bad[i].key, bad[i].value, "command line") == CAI_ERR_CONFIG,
                      "%s=%s accepted", bad[i].key, bad[i].value);
        ASSERT_MSG_HAS("command line");
        ASSERT_MSG_HAS(bad[i].key);
    }
    /* Nothing above changed the struct. */
    ck_assert(c.train.lr == 3e-4);
    ck_assert_int_eq(c.train.steps, 100);
    ck_assert(c.train.tokens == INT64_C(1000000000000));
    /* The edges of each integer type are accepted. */
    ck_assert_int_eq(cai_config_set(&schema, &c, "train.tokens", "9223372036854775807", "t"), CAI_OK);
    ck_assert(c.train.tokens == INT64_MAX);
    ck_assert_int_eq(cai_config_set(&schema, &c, "seed", "-9223372036854775808", "t"), CAI_OK);
    ck_assert(c.seed == INT64_MIN);
    ck_assert_int_eq(cai_config_set(&schema, &c, "train.steps", "+1000000", "t"), CAI_OK);
    ck_assert_int_eq(c.train.steps, 1000000);
    cai_config_free(&schema, &c);

    const char *argv[] = {"prog", "--train.lr=abc"};
    ck_assert_int_eq(parse(&c, 2, argv, NULL), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("command line: key 'train.lr': expected a double, got 'abc'");
    cai_config_free(&schema, &c);

    /* YAML nulls are empty strings for string keys and errors elsewhere. */
    ck_assert_int_eq(cai_config_defaults(&schema, &c), CAI_OK);
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "train:\n  name: ~\n", "n.yaml"), CAI_OK);
    ck_assert_str_eq(c.train.name, "");
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "train:\n  steps:\n", "n.yaml"), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("n.yaml:2");
    ASSERT_MSG_HAS("null");
    /* Quoted numbers are still numbers; quoted "null" is a string. */
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "train: {steps: '42', name: 'null'}\n", "q"), CAI_OK);
    ck_assert_int_eq(c.train.steps, 42);
    ck_assert_str_eq(c.train.name, "null");
    cai_config_free(&schema, &c);
}
END_TEST

START_TEST(out_of_range_and_bad_enum) {
    const char *const range[] = {"key 'mesh.tp'", "128 is out of range [1, 64]", NULL};
    expect_file_error("out_of_range.yaml", "128", range);
    const char *const choices[] = {"key 'train.dtype'", "'fp8' is not one of: f32, bf16, f16", NULL};
    expect_file_error("bad_enum.yaml", "fp8", choices);

    tcfg c;
    const char *argv[] = {"prog", "--tp", "0"};
    ck_assert_int_eq(parse(&c, 3, argv, NULL), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("command line: key 'mesh.tp': 0 is out of range [1, 64]");
    cai_config_free(&schema, &c);
    ck_assert_int_eq(cai_config_defaults(&schema, &c), CAI_OK);
    ck_assert_int_eq(cai_config_set(&schema, &c, "train.lr", "1.0000001", "x"), CAI_ERR_CONFIG);
    ck_assert_int_eq(cai_config_set(&schema, &c, "train.lr", "1", "x"), CAI_OK); /* inclusive */
    ck_assert_int_eq(cai_config_set(&schema, &c, "train.lr", "-0.0", "x"), CAI_OK);
    ck_assert_int_eq(cai_config_set(&schema, &c, "train.lr", "-1e-300", "x"), CAI_ERR_CONFIG);
    cai_config_free(&schema, &c);
}
END_TEST

START_TEST(malformed_yaml_and_duplicates) {
    const char *const syntax[] = {"malformed YAML", NULL};
    expect_file_error("bad_syntax.yaml", "5: 6", syntax);
    const char *const dup[] = {"duplicate key 'train.lr'", NULL};
    expect_file_error("duplicate_key.yaml", "0.2", dup);
    char first[32];
    snprintf(first, sizeof first, "first at line %d", line_containing(data_file("duplicate_key.yaml"), "0.1"));
    ASSERT_MSG_HAS(first);

    tcfg c;
    ck_assert_int_eq(cai_config_defaults(&schema, &c), CAI_OK);
    /* The same key through nesting and a dotted key. */
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "train: {lr: 0.1}\ntrain.lr: 0.2\n", "d.yaml"),
                     CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("d.yaml:2");
    ASSERT_MSG_HAS("set twice");
    /* A section repeated in one mapping, even with different keys under it. */
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "train:\n  lr: 0.1\ntrain:\n  steps: 3\n", "d.yaml"),
                     CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("d.yaml:3: duplicate key 'train'");
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "train: {steps: 3}\n---\nseed: 2\n", "m.yaml"),
                     CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("m.yaml:3");
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "- 1\n- 2\n", "s.yaml"), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("top level must be a mapping");
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "train: {lr: 0.1\n", "u.yaml"), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("u.yaml:");
    ASSERT_MSG_HAS("malformed YAML");
    /* All or nothing: the valid first key of a failing file is not applied. */
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "train: {steps: 5}\nmesh: {tp: 999}\n", "a.yaml"),
                     CAI_ERR_CONFIG);
    ck_assert_int_eq(c.train.steps, 100);
    /* Empty input and a missing file. */
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "", "e.yaml"), CAI_OK);
    ck_assert_int_eq(cai_config_load_yaml_string(&schema, &c, "# only a comment\n", "e.yaml"), CAI_OK);
    ck_assert_int_eq(cai_config_load_yaml(&schema, &c, "/nonexistent/x.yaml"), CAI_ERR_IO);
    ASSERT_MSG_HAS("/nonexistent/x.yaml");
    cai_config_free(&schema, &c);
}
END_TEST

START_TEST(help_lists_every_key) {
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    cai_config_print_help(&schema, out);
    fclose(out);
    ck_assert_ptr_nonnull(strstr(buf, "colossal-test"));
    ck_assert_ptr_nonnull(strstr(buf, "--config"));
    for (size_t i = 0; i < schema.nfields; i++) {
        const cai_config_field *f = &fields[i];
        char flag[128], def[128];
        snprintf(flag, sizeof flag, "--%s", f->key);
        snprintf(def, sizeof def, "(default: %s", help_expect[i].def);
        /* The key's own line holds flag, type, doc and default. */
        const char *line = strstr(buf, flag);
        ck_assert_msg(line != NULL, "help lacks %s", flag);
        ck_assert_msg(strstr(line + 1, flag) == NULL, "help lists %s twice", flag);
        const char *eol = strchr(line, '\n');
        ck_assert_ptr_nonnull(eol);
        /* A long flag puts its doc on the next line. */
        if (!memmem(line, (size_t)(eol - line), "(default:", 9) && strchr(eol + 1, '\n')) eol = strchr(eol + 1, '\n');
        size_t n = (size_t)(eol - line);
        char entry[512];
        snprintf(entry, sizeof entry, "%.*s", (int)n, line);
        ck_assert_msg(strstr(entry, help_expect[i].type), "%s: no type %s in '%s'", f->key, help_expect[i].type, entry);
        ck_assert_msg(strstr(entry, f->doc), "%s: no doc in '%s'", f->key, entry);
        ck_assert_msg(strstr(entry, def), "%s: no '%s' in '%s'", f->key, def, entry);
        if (f->alias) {
            char alias[64];
            snprintf(alias, sizeof alias, "--%s", f->alias);
            ck_assert_msg(strstr(entry, alias), "%s: no alias in '%s'", f->key, entry);
        }
    }
    ck_assert_ptr_nonnull(strstr(buf, "range [1, 64]"));
    const char *group = strstr(buf, "\nsettings:\n"); /* top-level keys form one group */
    ck_assert_ptr_nonnull(group);
    ck_assert_ptr_null(strstr(group + 1, "\nsettings:\n"));
    free(buf);

    /* --help anywhere wins over every other argument, even bad ones. */
    tcfg c;
    int help = 0;
    const char *argv[] = {"prog", "--train.lr=abc", "stray", "--help"};
    ck_assert_int_eq(parse(&c, 4, argv, &help), CAI_OK);
    ck_assert_int_eq(help, 1);
    ck_assert(c.train.lr == 3e-4);
    cai_config_free(&schema, &c);
    const char *argv2[] = {"prog", "-h"};
    ck_assert_int_eq(parse(&c, 2, argv2, &help), CAI_OK);
    ck_assert_int_eq(help, 1);
    cai_config_free(&schema, &c);
}
END_TEST

/* Every field set to something awkward, with the values kept here to compare against. */
static const char *const tricky_name =
    " lead \"quoted\" back\\slash\nnew line\ttab: #hash 'single' \xc3\xa9 \xe4\xb8\xad \x01 \x7f"
    " nel\xc2\x85 ls\xe2\x80\xa8 c1\xc2\x90 trail ";

static void set_tricky(tcfg *c) {
    ck_assert_int_eq(cai_config_defaults(&schema, c), CAI_OK);
    static const char *const kv[][2] = {
        {"train.lr", "0.30000000000000004"},
        {"train.steps", "999999"},
        {"train.tokens", "-9223372036854775808"},
        {"train.fused", "false"},
        {"train.dtype", "f32"},
        {"mesh.tp", "64"},
        {"pp", "3"},
        {"mesh.schedule", "1f1b"},
        {"model.norm.eps", "4.9406564584124654e-324"},
        {"out_dir", "null"},
        {"seed", "123"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        ck_assert_int_eq(cai_config_set(&schema, c, kv[i][0], kv[i][1], "test"), CAI_OK);
    ck_assert_int_eq(cai_config_set(&schema, c, "train.name", tricky_name, "test"), CAI_OK);
}

static void check_tricky(const tcfg *c) {
    ck_assert(c->train.lr == 0.1 + 0.2);
    ck_assert_int_eq(c->train.steps, 999999);
    ck_assert(c->train.tokens == INT64_MIN);
    ck_assert_int_eq(c->train.fused, 0);
    ck_assert_int_eq(c->train.dtype, DT_F32);
    ck_assert_int_eq(c->mesh.tp, 64);
    ck_assert_int_eq(c->mesh.pp, 3);
    ck_assert_int_eq(c->mesh.schedule, SCHED_1F1B);
    ck_assert(c->model.norm.eps == 4.9406564584124654e-324);
    ck_assert_str_eq(c->out_dir, "null");
    ck_assert(c->seed == 123);
    ck_assert_str_eq(c->train.name, tricky_name);
}

START_TEST(write_then_load_round_trips) {
    tcfg a, b;
    set_tricky(&a);
    check_tricky(&a);
    char *text = NULL;
    ck_assert_int_eq(cai_config_write_string(&schema, &a, &text), CAI_OK);
    /* Nested by prefix, strings quoted, docs as comments. */
    ck_assert_ptr_nonnull(strstr(text, "train:\n  lr: 0.30000000000000004  # peak learning rate\n"));
    ck_assert_ptr_nonnull(strstr(text, "model:\n  norm:\n    eps: "));
    ck_assert_ptr_nonnull(strstr(text, "out_dir: \"null\""));
    ck_assert_ptr_nonnull(strstr(text, "schedule: \"1f1b\""));
    ck_assert_ptr_nonnull(strstr(text, "\nmesh:\n"));
    const char *train = strstr(text, "\ntrain:");
    ck_assert_ptr_nonnull(train);
    ck_assert_ptr_null(strstr(train + 1, "\ntrain:")); /* one train section */

    ck_assert_int_eq(cai_config_defaults(&schema, &b), CAI_OK);
    ck_assert_msg(cai_config_load_yaml_string(&schema, &b, text, "dump") == CAI_OK, "%s\n%s", cai_error_message(),
                  text);
    check_tricky(&b);
    ck_assert_ptr_null(cai_config_compare(&schema, &a, &b));
    ck_assert_int_eq(cai_config_set(&schema, &b, "mesh.schedule", "zb-v", "t"), CAI_OK);
    ck_assert_ptr_eq(cai_config_compare(&schema, &a, &b), &fields[8]);
    free(text);
    cai_config_free(&schema, &b);

    /* write_file: mkdir -p, then the file loads back. */
    char base[] = "/tmp/cai_config_test_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(base));
    char dir[PATH_MAX], file[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/run/a/b", base);
    ck_assert_int_eq(cai_config_write_file(&schema, &a, dir), CAI_OK);
    snprintf(file, sizeof file, "%s/config.yaml", dir);
    ck_assert_int_eq(cai_config_defaults(&schema, &b), CAI_OK);
    ck_assert_int_eq(cai_config_load_yaml(&schema, &b, file), CAI_OK);
    check_tricky(&b);
    cai_config_free(&schema, &b);
    /* Writing again over an existing directory works. */
    ck_assert_int_eq(cai_config_write_file(&schema, &a, dir), CAI_OK);
    /* A file where the directory should be is an I/O error. */
    ck_assert_int_eq(cai_config_write_file(&schema, &a, file), CAI_ERR_IO);
    ck_assert_int_eq(unlink(file), 0);
    for (int up = 0; up < 3; up++) {
        ck_assert_int_eq(rmdir(dir), 0);
        *strrchr(dir, '/') = 0;
    }
    ck_assert_int_eq(rmdir(base), 0);

    /* Invalid UTF-8 cannot be written as YAML. */
    ck_assert_int_eq(cai_config_set(&schema, &a, "out_dir", "bad\xff", "t"), CAI_OK);
    FILE *null_out = fopen("/dev/null", "w");
    ck_assert_int_eq(cai_config_write(&schema, &a, null_out), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("out_dir");
    fclose(null_out);
    cai_config_free(&schema, &a);
}
END_TEST

START_TEST(command_line_shape_errors) {
    tcfg c;
    const struct {
        int argc;
        const char *argv[4];
        const char *needle;
    } cases[] = {
        {2, {"prog", "train.lr=3"}, "positional argument 'train.lr=3'"},
        {3, {"prog", "--", "x"}, "positional argument 'x'"},
        {2, {"prog", "-x"}, "unknown option '-x'"},
        {2, {"prog", "--mesh.tp"}, "'--mesh.tp' needs a value"},
        {3, {"prog", "--train.lr", "--train.steps=3"}, "'--train.lr' needs a value"},
        {2, {"prog", "--no-mesh.tp"}, "only bool keys"},
        {2, {"prog", "--no-train.fused=1"}, "takes no value"},
        {2, {"prog", "--config"}, "'--config' needs a value"},
        {2, {"prog", "--help"}, "unknown key '--help'"}, /* help_requested NULL */
        {3, {"prog", "--train.fused", "maybe"}, "positional argument 'maybe'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cai_error_clear();
        ck_assert_msg(parse(&c, cases[i].argc, cases[i].argv, NULL) == CAI_ERR_CONFIG, "case %zu accepted", i);
        ASSERT_MSG_HAS("command line");
        ASSERT_MSG_HAS(cases[i].needle);
        cai_config_free(&schema, &c);
    }
    /* A trailing "--" is harmless; a missing --config file is an I/O error. */
    const char *ok[] = {"prog", "--seed=5", "--"};
    ck_assert_int_eq(parse(&c, 3, ok, NULL), CAI_OK);
    ck_assert(c.seed == 5);
    cai_config_free(&schema, &c);
    const char *missing[] = {"prog", "--config", "/nonexistent.yaml"};
    ck_assert_int_eq(parse(&c, 3, missing, NULL), CAI_ERR_IO);
    cai_config_free(&schema, &c);
    /* YAML errors reached through --config keep file:line. */
    char cfgarg[PATH_MAX];
    snprintf(cfgarg, sizeof cfgarg, "%s", data_file("bad_enum.yaml"));
    const char *bad[] = {"prog", "--config", cfgarg};
    ck_assert_int_eq(parse(&c, 3, bad, NULL), CAI_ERR_CONFIG);
    char where[PATH_MAX + 16];
    snprintf(where, sizeof where, "%s:%d", cfgarg, line_containing(cfgarg, "fp8"));
    ASSERT_MSG_HAS(where);
    cai_config_free(&schema, &c);
}
END_TEST

START_TEST(bad_tables_are_rejected) {
    typedef struct {
        int a, b;
        char *s;
    } small;
    static const char *const none[] = {NULL};
    const struct {
        cai_config_field f[2];
        cai_status st;
        const char *needle;
    } cases[] = {
        {{{"x.a", CAI_CFG_INT, offsetof(small, a), "1", "a", CAI_CFG_NO_RANGE, NULL, NULL},
          {"x.a", CAI_CFG_INT, offsetof(small, b), "1", "b", CAI_CFG_NO_RANGE, NULL, NULL}},
         CAI_ERR_INVALID_ARG,
         "names both"},
        {{{"x", CAI_CFG_INT, offsetof(small, a), "1", "a", CAI_CFG_NO_RANGE, NULL, NULL},
          {"x.b", CAI_CFG_INT, offsetof(small, b), "1", "b", CAI_CFG_NO_RANGE, NULL, NULL}},
         CAI_ERR_INVALID_ARG,
         "cannot also be a section"},
        {{{"x.a", CAI_CFG_INT, offsetof(small, a), "1", NULL, CAI_CFG_NO_RANGE, NULL, NULL},
          {"x.b", CAI_CFG_INT, offsetof(small, b), "1", "b", CAI_CFG_NO_RANGE, NULL, NULL}},
         CAI_ERR_INVALID_ARG,
         "doc"},
        {{{"x.a", CAI_CFG_INT, offsetof(small, a), "0", "a", 1, 8, NULL, NULL},
          {"x.b", CAI_CFG_INT, offsetof(small, b), "1", "b", CAI_CFG_NO_RANGE, NULL, NULL}},
         CAI_ERR_CONFIG,
         "out of range"},
        {{{"x.a", CAI_CFG_ENUM, offsetof(small, a), NULL, "a", CAI_CFG_NO_RANGE, none, NULL},
          {"x.b", CAI_CFG_INT, offsetof(small, b), "1", "b", CAI_CFG_NO_RANGE, NULL, NULL}},
         CAI_ERR_INVALID_ARG,
         "no choices"},
        {{{"x.a", CAI_CFG_INT, offsetof(small, a), "1", "a", CAI_CFG_NO_RANGE, NULL, "b"},
          {"b", CAI_CFG_INT, offsetof(small, b), "1", "b", CAI_CFG_NO_RANGE, NULL, NULL}},
         CAI_ERR_INVALID_ARG,
         "names both"},
        {{{"x.a", CAI_CFG_INT, offsetof(small, a), "1", "a", CAI_CFG_NO_RANGE, NULL, NULL},
          {"config", CAI_CFG_STRING, offsetof(small, s), NULL, "b", CAI_CFG_NO_RANGE, NULL, NULL}},
         CAI_ERR_INVALID_ARG,
         "reserved"},
        {{{"x..a", CAI_CFG_INT, offsetof(small, a), "1", "a", CAI_CFG_NO_RANGE, NULL, NULL},
          {"x.b", CAI_CFG_INT, offsetof(small, b), "1", "b", CAI_CFG_NO_RANGE, NULL, NULL}},
         CAI_ERR_INVALID_ARG,
         "x..a"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cai_config_schema s = {"bad", NULL, cases[i].f, 2};
        small v;
        cai_error_clear();
        ck_assert_msg(cai_config_defaults(&s, &v) == cases[i].st, "case %zu: %s", i, cai_error_message());
        ASSERT_MSG_HAS(cases[i].needle);
        cai_config_free(&s, &v);
    }
    /* Zero min and max (designated initialisers leaving them out) mean no range. */
    const cai_config_field f[] = {
        {.key = "n", .type = CAI_CFG_INT, .offset = offsetof(small, a), .default_value = "-5", .doc = "a number"}};
    cai_config_schema s = {"ok", NULL, f, 1};
    small v;
    ck_assert_int_eq(cai_config_defaults(&s, &v), CAI_OK);
    ck_assert_int_eq(v.a, -5);
}
END_TEST

/* CAI_CFG_BYTES: one spelling of sizes for every app (binary single letters
 * and *iB, decimal *B), its words, its range, and text that reads back. */
START_TEST(byte_sizes) {
    static const struct {
        const char *text;
        int64_t bytes;
    } good[] = {{"0", 0},
                {"4096", 4096},
                {"1K", 1024},
                {"800M", 800LL << 20},
                {"3GiB", 3LL << 30},
                {"3gib", 3LL << 30},
                {"5GB", 5000000000LL},
                {"500MB", 500000000LL},
                {"64KiB", 65536},
                {"1.5GB", 1500000000LL},
                {"2T", 2LL << 40},
                {"123B", 123},
                {"1.5K", 1536},
                {"0.6", 1},
                {"7 MiB", 7LL << 20}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t v = -7;
        ck_assert_msg(cai_config_parse_bytes("x", good[i].text, &v) == CAI_OK, "%s: %s", good[i].text,
                      cai_error_message());
        ck_assert_msg(v == good[i].bytes, "%s -> %lld, expected %lld", good[i].text, (long long)v,
                      (long long)good[i].bytes);
        char buf[64];
        int64_t back = -7;
        cai_config_format_bytes(v, buf, sizeof buf);
        ck_assert_int_eq(cai_config_parse_bytes("x", buf, &back), CAI_OK);
        ck_assert_msg(back == v, "%lld -> '%s' -> %lld", (long long)v, buf, (long long)back);
    }
    char buf[64];
    ck_assert_str_eq(cai_config_format_bytes(3LL << 30, buf, sizeof buf), "3GiB");
    ck_assert_str_eq(cai_config_format_bytes(5000000000LL, buf, sizeof buf), "5GB");
    ck_assert_str_eq(cai_config_format_bytes(1536, buf, sizeof buf), "1536");
    static const char *const bad[] = {"", "-1", "12parsecs", "auto", "GB", "1e", "3 GiBs", "nan", "inf", "1e30"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = 42;
        cai_error_clear();
        ck_assert_msg(cai_config_parse_bytes("train.mem_limit", bad[i], &v) == CAI_ERR_CONFIG, "'%s' accepted", bad[i]);
        ck_assert_int_eq(v, 42);
        ASSERT_MSG_HAS("train.mem_limit=");
    }
    /* As a field: the words of `choices`, the range on bytes, the dump. */
    typedef struct {
        int64_t limit, shard;
    } sizes;
    const cai_config_field f[] = {
        {"train.mem_limit", CAI_CFG_BYTES, offsetof(sizes, limit), "auto", "limit", CAI_CFG_NO_RANGE,
         cai_config_bytes_auto, NULL},
        {"max_shard", CAI_CFG_BYTES, offsetof(sizes, shard), "5GB", "shard size", 1, 1e15, NULL, NULL},
    };
    cai_config_schema s = {"bytes", NULL, f, 2};
    sizes v;
    ck_assert_int_eq(cai_config_defaults(&s, &v), CAI_OK);
    ck_assert_int_eq(v.limit, CAI_CFG_BYTES_AUTO);
    ck_assert_int_eq(v.shard, 5000000000LL);
    ck_assert_int_eq(cai_config_set(&s, &v, "train.mem_limit", "800M", "cli"), CAI_OK);
    ck_assert_int_eq(v.limit, 800LL << 20);
    ck_assert_str_eq(cai_config_format(&f[0], &v, buf, sizeof buf), "800MiB");
    ck_assert_int_eq(cai_config_set(&s, &v, "train.mem_limit", "AUTO", "cli"), CAI_OK);
    ck_assert_str_eq(cai_config_format(&f[0], &v, buf, sizeof buf), "auto");
    cai_error_clear();
    ck_assert_int_eq(cai_config_set(&s, &v, "max_shard", "auto", "cli"), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("max_shard='auto' is not a size");
    cai_error_clear();
    ck_assert_int_eq(cai_config_set(&s, &v, "max_shard", "0", "cli"), CAI_ERR_CONFIG);
    ASSERT_MSG_HAS("out of range");
    ck_assert_int_eq(v.shard, 5000000000LL);
    char *text = NULL;
    ck_assert_int_eq(cai_config_set(&s, &v, "max_shard", "2GiB", "cli"), CAI_OK);
    ck_assert_int_eq(cai_config_write_string(&s, &v, &text), CAI_OK);
    sizes w;
    ck_assert_int_eq(cai_config_defaults(&s, &w), CAI_OK);
    ck_assert_int_eq(cai_config_load_yaml_string(&s, &w, text, "dump"), CAI_OK);
    ck_assert_ptr_null(cai_config_compare(&s, &v, &w));
    free(text);
    cai_config_free(&s, &v);
    cai_config_free(&s, &w);
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, defaults_land_in_struct);
    tcase_add_test(tc, good_file_values_land);
    tcase_add_test(tc, cli_overrides_beat_yaml_in_argv_order);
    tcase_add_test(tc, alias_and_bool_forms);
    tcase_add_test(tc, unknown_key_names_key_line_and_suggestion);
    tcase_add_test(tc, wrong_types_are_errors);
    tcase_add_test(tc, out_of_range_and_bad_enum);
    tcase_add_test(tc, malformed_yaml_and_duplicates);
    tcase_add_test(tc, help_lists_every_key);
    tcase_add_test(tc, write_then_load_round_trips);
    tcase_add_test(tc, command_line_shape_errors);
    tcase_add_test(tc, bad_tables_are_rejected);
    tcase_add_test(tc, byte_sizes);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
