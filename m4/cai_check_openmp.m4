dnl cai_check_openmp.m4 -- OpenMP for the CPU kernels (optional).
dnl
dnl CAI_CHECK_OPENMP
dnl   Runs AC_OPENMP (substs OPENMP_CFLAGS; --disable-openmp turns it off) and
dnl   appends OPENMP_CFLAGS to CFLAGS, so every later check and every object
dnl   is built with it. Sets cai_openmp to "yes (FLAGS)" or "no" for the
dnl   summary.

AC_DEFUN([CAI_CHECK_OPENMP], [
AC_OPENMP
CFLAGS="$CFLAGS $OPENMP_CFLAGS"
cai_openmp=no
AS_IF([test -n "$OPENMP_CFLAGS"], [cai_openmp="yes ($OPENMP_CFLAGS)"])
])
