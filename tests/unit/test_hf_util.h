/* Assertions shared by the Hugging Face tests (test_hf.c, test_hf_mixtral.c). */
#ifndef CAI_TEST_HF_UTIL_H
#define CAI_TEST_HF_UTIL_H

#include <check.h>
#include <string.h>

#include "colossal/base.h"

#define OK(x)                                                                      \
    do {                                                                           \
        cai_status ok_st_ = (x);                                                   \
        ck_assert_msg(ok_st_ == CAI_OK, "%s failed: %s", #x, cai_error_message()); \
    } while (0)

/* The call fails with `code` and its message contains each of the strings. */
#define EXPECT_ERR(x, code, ...)                                                                                \
    do {                                                                                                        \
        cai_error_clear();                                                                                      \
        cai_status e_st_ = (x);                                                                                 \
        ck_assert_msg(e_st_ == (code), "%s returned %s, expected %s (%s)", #x, cai_status_str(e_st_),           \
                      cai_status_str(code), cai_error_message());                                               \
        const char *e_want_[] = {__VA_ARGS__};                                                                  \
        for (size_t e_i_ = 0; e_i_ < sizeof e_want_ / sizeof e_want_[0]; e_i_++)                                \
            ck_assert_msg(strstr(cai_error_message(), e_want_[e_i_]) != NULL, "%s: message lacks '%s': %s", #x, \
                          e_want_[e_i_], cai_error_message());                                                  \
        cai_error_clear();                                                                                      \
    } while (0)

#endif
