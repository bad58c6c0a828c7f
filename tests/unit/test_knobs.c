/* The knob table (src/base/knobs.c): defaults, parsing from the
 * environment, bad values as errors naming the knob and what would fit,
 * cai_knob_set overrides. Each test uses knobs the others leave alone,
 * since a knob's environment value is read once per process. */
#include "cai_config.h"
#include "colossal/base.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static const cai_knob_info *knob(const char *name) {
    for (size_t i = 0; i < cai_knob_count(); i++)
        if (strcmp(cai_knob_at(i)->name, name) == 0) return cai_knob_at(i);
    return NULL;
}

START_TEST(table_is_complete_and_unique) {
    ck_assert_uint_ge(cai_knob_count(), 8);
    ck_assert_ptr_null(cai_knob_at(cai_knob_count()));
    for (size_t i = 0; i < cai_knob_count(); i++) {
        const cai_knob_info *k = cai_knob_at(i);
        ck_assert_msg(strncmp(k->name, "CAI_", 4) == 0, "%s: knobs are CAI_ variables", k->name);
        ck_assert_msg(k->meaning && strlen(k->meaning) > 20, "%s: a meaning is required", k->name);
        ck_assert_msg(k->dflt != NULL, "%s: a default is required", k->name);
        ck_assert_msg((k->type == CAI_KNOB_ENUM) == (k->choices != NULL), "%s: choices exactly for enums", k->name);
        for (size_t j = 0; j < i; j++) ck_assert_str_ne(cai_knob_at(j)->name, k->name);
    }
    /* the comparison switches are gone */
    ck_assert_ptr_null(knob("CAI_CUDA_BGRAD"));
    ck_assert_ptr_null(knob("CAI_CUDA_XENT_FUSED"));
    ck_assert_ptr_null(knob("CAI_CUDA_FLASH_KVQC"));
    ck_assert_ptr_null(knob("CAI_CUDA_FLASH_OCC"));
    ck_assert_ptr_null(knob("CAI_NCCL_STREAM_PRIORITY"));
    ck_assert_int_eq(knob("CAI_CKPT_TEST_STALL") != NULL, cai_test_hooks_built());
}
END_TEST

START_TEST(defaults_when_unset) {
    unsetenv("CAI_CUDA_SCRATCH_MB");
    unsetenv("CAI_CKPT_MPIIO");
    long long v = -1;
    ck_assert_int_eq(cai_knob_int("CAI_CUDA_SCRATCH_MB", &v), CAI_OK);
    ck_assert_int_eq(v, 64);
    const char *s = NULL;
    ck_assert_int_eq(cai_knob_str("CAI_CKPT_MPIIO", &s), CAI_OK);
    ck_assert_str_eq(s, "independent");
    cai_knob_source src = CAI_KNOB_FROM_ENV;
    ck_assert_int_eq(cai_knob_value("CAI_CUDA_SCRATCH_MB", &s, &src), CAI_OK);
    ck_assert_str_eq(s, "64");
    ck_assert_int_eq(src, CAI_KNOB_FROM_DEFAULT);
}
END_TEST

START_TEST(environment_parsed_once) {
    setenv("CAI_CUBLASLT_AUTOTUNE", "4", 1);
    setenv("CAI_CUDA_ATTN", "flash", 1);
    long long v = -1;
    ck_assert_int_eq(cai_knob_int("CAI_CUBLASLT_AUTOTUNE", &v), CAI_OK);
    ck_assert_int_eq(v, 4);
    const char *s = NULL;
    cai_knob_source src = CAI_KNOB_FROM_DEFAULT;
    ck_assert_int_eq(cai_knob_value("CAI_CUDA_ATTN", &s, &src), CAI_OK);
    ck_assert_str_eq(s, "flash");
    ck_assert_int_eq(src, CAI_KNOB_FROM_ENV);
    /* read once: a later change of the environment is not seen */
    setenv("CAI_CUBLASLT_AUTOTUNE", "2", 1);
    ck_assert_int_eq(cai_knob_int("CAI_CUBLASLT_AUTOTUNE", &v), CAI_OK);
    ck_assert_int_eq(v, 4);
    unsetenv("CAI_CUBLASLT_AUTOTUNE");
    unsetenv("CAI_CUDA_ATTN");
}
END_TEST

START_TEST(bad_values_are_errors_naming_what_fits) {
    setenv("CAI_CUDA_LT_WORKSPACE_MB", "32MB", 1);
    setenv("CAI_CUDA_TF32", "2", 1);
    setenv("CAI_CKPT_MPIIO", "collective-ish", 1);
    long long v = -1;
    cai_error_clear();
    ck_assert_int_eq(cai_knob_int("CAI_CUDA_LT_WORKSPACE_MB", &v), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "CAI_CUDA_LT_WORKSPACE_MB='32MB'"));
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "an integer in [0, 4096]"));
    cai_error_clear();
    /* still an error on the next use, not a silent default */
    ck_assert_int_eq(cai_knob_int("CAI_CUDA_LT_WORKSPACE_MB", &v), CAI_ERR_CONFIG);
    cai_error_clear();
    ck_assert_int_eq(cai_knob_int("CAI_CUDA_TF32", &v), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "[0, 1]"));
    cai_error_clear();
    const char *s = NULL;
    ck_assert_int_eq(cai_knob_str("CAI_CKPT_MPIIO", &s), CAI_OK);   /* read before, in defaults_when_unset */
    ck_assert_int_eq(cai_knob_set("CAI_CKPT_MPIIO", NULL), CAI_OK); /* back to the environment: now the bad one */
    ck_assert_int_eq(cai_knob_str("CAI_CKPT_MPIIO", &s), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "one of independent|two-phase"));
    cai_error_clear();
    /* knobs that do not exist, or asked for with the wrong type */
    ck_assert_int_eq(cai_knob_int("CAI_NO_SUCH_KNOB", &v), CAI_ERR_INTERNAL);
    cai_error_clear();
    ck_assert_int_eq(cai_knob_str("CAI_CUDA_SCRATCH_MB", &s), CAI_ERR_INTERNAL);
    cai_error_clear();
    unsetenv("CAI_CUDA_LT_WORKSPACE_MB");
    unsetenv("CAI_CUDA_TF32");
    unsetenv("CAI_CKPT_MPIIO");
    ck_assert_int_eq(cai_knob_set("CAI_CKPT_MPIIO", NULL), CAI_OK);
}
END_TEST

START_TEST(program_overrides) {
    long long v = -1;
    ck_assert_int_eq(cai_knob_set("CAI_NCCL_TRACE", "1"), CAI_OK);
    ck_assert_int_eq(cai_knob_int("CAI_NCCL_TRACE", &v), CAI_OK);
    ck_assert_int_eq(v, 1);
    const char *s = NULL;
    cai_knob_source src = CAI_KNOB_FROM_DEFAULT;
    ck_assert_int_eq(cai_knob_value("CAI_NCCL_TRACE", &s, &src), CAI_OK);
    ck_assert_int_eq(src, CAI_KNOB_FROM_PROGRAM);
    cai_error_clear();
    ck_assert_int_eq(cai_knob_set("CAI_NCCL_TRACE", "yes"), CAI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "CAI_NCCL_TRACE='yes'"));
    cai_error_clear();
    ck_assert_int_eq(cai_knob_int("CAI_NCCL_TRACE", &v), CAI_OK); /* the rejected value changed nothing */
    ck_assert_int_eq(v, 1);
    ck_assert_int_eq(cai_knob_set("CAI_CKPT_MPIIO", "two-phase"), CAI_OK);
    ck_assert_int_eq(cai_knob_str("CAI_CKPT_MPIIO", &s), CAI_OK);
    ck_assert_str_eq(s, "two-phase");
    ck_assert_int_eq(cai_knob_set("CAI_NCCL_TRACE", NULL), CAI_OK);
    ck_assert_int_eq(cai_knob_set("CAI_CKPT_MPIIO", NULL), CAI_OK);
    ck_assert_int_eq(cai_knob_int("CAI_NCCL_TRACE", &v), CAI_OK);
    ck_assert_int_eq(v, 0);
    ck_assert_int_eq(cai_knob_set("CAI_NO_SUCH_KNOB", "1"), CAI_ERR_INVALID_ARG);
    cai_error_clear();
}
END_TEST

int main(void) {
    Suite *s = suite_create("knobs");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, table_is_complete_and_unique);
    tcase_add_test(tc, defaults_when_unset);
    tcase_add_test(tc, environment_parsed_once);
    tcase_add_test(tc, bad_values_are_errors_naming_what_fits);
    tcase_add_test(tc, program_overrides);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* the tests share the process's knob state, in this order */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
