dnl cai_check_libm.m4 -- the C math library.
dnl
dnl CAI_CHECK_LIBM
dnl   Adds -lm to LIBS when sqrtf needs it (AC_SEARCH_LIBS). No --with option.

AC_DEFUN([CAI_CHECK_LIBM], [
AC_SEARCH_LIBS([sqrtf], [m])
])
