dnl cai_check_fuzz.m4 -- clang with libFuzzer for the fuzz targets (optional).
dnl
dnl CAI_CHECK_FUZZ
dnl   The precious variable FUZZ_CC names the compiler (default clang; set
dnl   FUZZ_CC=no to leave fuzzing out). It is taken when a program built with
dnl   -fsanitize=fuzzer,address,undefined links. Substs FUZZ_CC;
dnl   AM_CONDITIONAL HAVE_FUZZ; sets cai_fuzz ("yes (FUZZ_CC)" or "no") for
dnl   the summary. Not found is a notice: 'make check' then skips the
dnl   tests/fuzz targets (exit 77). No --with option.

AC_DEFUN([CAI_CHECK_FUZZ], [
AC_ARG_VAR([FUZZ_CC], [clang with libFuzzer for tests/fuzz (no: skip the fuzz targets)])
AS_IF([test -z "$FUZZ_CC"], [FUZZ_CC=clang])
cai_fuzz=no
AS_IF([test "x$FUZZ_CC" != xno], [
  AC_MSG_CHECKING([whether $FUZZ_CC links libFuzzer targets with ASan and UBSan])
  cat >conftest_fuzz.c <<_CAI_EOF
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return size && data[[0]] == 1; }
_CAI_EOF
  AS_IF([$FUZZ_CC -fsanitize=fuzzer,address,undefined conftest_fuzz.c -o conftest_fuzz$EXEEXT >&AS_MESSAGE_LOG_FD 2>&1],
    [cai_fuzz="yes ($FUZZ_CC)"; AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_NOTICE([no clang with libFuzzer: 'make check' skips tests/fuzz (apt-get install clang)])])
  rm -f conftest_fuzz.c conftest_fuzz$EXEEXT])
AM_CONDITIONAL([HAVE_FUZZ], [test "x$cai_fuzz" != xno])
])
