/* Base layer: status trace, arenas, dtypes, RNG determinism. */
#include "cai_config.h"
#include "colossal/base.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <string.h>

static cai_status inner_fails(void) { return CAI_ERROR(CAI_ERR_CONFIG, "key '%s' wrong", "train.lr"); }
static cai_status outer_calls(void) {
    CAI_CALL(inner_fails());
    return CAI_OK;
}

START_TEST(error_trace_records_message_and_frames) {
    cai_error_clear();
    ck_assert_int_eq(outer_calls(), CAI_ERR_CONFIG);
    ck_assert_str_eq(cai_error_message(), "key 'train.lr' wrong");
    ck_assert_int_eq(cai_error_status(), CAI_ERR_CONFIG);
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    cai_error_print(f);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "configuration error: key 'train.lr' wrong"));
    ck_assert_ptr_nonnull(strstr(buf, "in outer_calls() calling inner_fails()"));
    cai_error_clear();
    ck_assert_str_eq(cai_error_message(), "");
}
END_TEST

START_TEST(arena_aligns_and_reports_exhaustion) {
    cai_arena_t a;
    ck_assert_int_eq(cai_arena_init(&a, 1024, "scratch"), CAI_OK);
    void *p = NULL, *q = NULL;
    ck_assert_int_eq(cai_arena_alloc(&a, 10, 64, &p), CAI_OK);
    ck_assert_int_eq(cai_arena_alloc(&a, 10, 256, &q), CAI_OK);
    ck_assert_int_eq((uintptr_t)q % 256, 0);
    size_t mark = cai_arena_mark(&a);
    ck_assert_int_eq(cai_arena_alloc(&a, 4096, 64, &p), CAI_ERR_NOMEM);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "arena 'scratch' exhausted"));
    cai_arena_reset_to(&a, 0);
    ck_assert_uint_eq(cai_arena_mark(&a), 0);
    ck_assert_uint_ge(a.high_water, mark);
    cai_arena_free(&a);
}
END_TEST

START_TEST(dtypes_have_sizes_and_names) {
    cai_dtype dt;
    ck_assert_int_eq(cai_dtype_parse("bf16", &dt), CAI_OK);
    ck_assert_int_eq(dt, CAI_DTYPE_BF16);
    ck_assert_uint_eq(cai_dtype_size(dt), 2);
    ck_assert_int_eq(cai_dtype_parse("f8", &dt), CAI_ERR_INVALID_ARG);
    ck_assert_uint_eq(cai_dtype_size(CAI_DTYPE_F64), 8);
}
END_TEST

START_TEST(philox_matches_reference_vector) {
    /* Known-answer test from the Random123 distribution: philox4x32-10 with
     * counter and key all zero. */
    cai_philox_block b = cai_philox4x32(0, 0, 0);
    ck_assert_uint_eq(b.v[0], 0x6627e8d5u);
    ck_assert_uint_eq(b.v[1], 0xe169c58du);
    ck_assert_uint_eq(b.v[2], 0xbc57ac4cu);
    ck_assert_uint_eq(b.v[3], 0x9b00dbd8u);
}
END_TEST

START_TEST(normal_samples_have_unit_moments) {
    double sum = 0, sq = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = cai_rng_normal(1234, 7, (uint64_t)i);
        sum += x;
        sq += x * x;
    }
    ck_assert_double_le(fabs(sum / n), 0.01);
    ck_assert_double_le(fabs(sq / n - 1.0), 0.02);
    ck_assert_float_eq(cai_rng_normal(1234, 7, 99), cai_rng_normal(1234, 7, 99));
    ck_assert_uint_ne(cai_hash64("wte"), cai_hash64("wpe"));
}
END_TEST

START_TEST(log_levels_parse) {
    cai_log_level l;
    ck_assert_int_eq(cai_log_level_parse("debug", &l), CAI_OK);
    ck_assert_int_eq(l, CAI_LOG_DEBUG);
    ck_assert_int_eq(cai_log_level_parse("loud", &l), CAI_ERR_INVALID_ARG);
}
END_TEST

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("base");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, error_trace_records_message_and_frames);
    tcase_add_test(tc, arena_aligns_and_reports_exhaustion);
    tcase_add_test(tc, dtypes_have_sizes_and_names);
    tcase_add_test(tc, philox_matches_reference_vector);
    tcase_add_test(tc, normal_samples_have_unit_moments);
    tcase_add_test(tc, log_levels_parse);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
