dnl cai_check_check.m4 -- the Check unit-test framework (optional).
dnl
dnl CAI_CHECK_CHECK
dnl   PKG_CHECK_MODULES on check (not the deprecated AM_PATH_CHECK): substs
dnl   CHECK_CFLAGS and CHECK_LIBS; AM_CONDITIONAL HAVE_CHECK; sets cai_check
dnl   ("yes (VERSION)" or "no") for the summary. Not found is a warning:
dnl   'make check' then builds no unit tests. No --with option.

AC_DEFUN([CAI_CHECK_CHECK], [
cai_check=no
PKG_CHECK_MODULES([CHECK], [check], [cai_check="yes (`$PKG_CONFIG --modversion check`)"],
  [AC_MSG_WARN([Check not found: 'make check' will build no unit tests (apt-get install check)])])
AM_CONDITIONAL([HAVE_CHECK], [test "x$cai_check" != xno])
])
