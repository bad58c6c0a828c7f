dnl cai_check_blas.m4 -- CBLAS (OpenBLAS by default); required.
dnl
dnl CAI_CHECK_BLAS
dnl   --with-blas=LIB names the library providing cblas_sgemm (default
dnl   openblas). pkg-config "openblas" is tried first; otherwise -lLIB must
dnl   provide cblas_sgemm. cblas.h must be found with BLAS_CFLAGS.
dnl   Substs BLAS_CFLAGS and BLAS_LIBS; defines HAVE_CBLAS_H; sets cai_blas
dnl   ("openblas (pkg-config)" or LIB) for the summary. Missing CBLAS or
dnl   cblas.h is an error.

AC_DEFUN([CAI_CHECK_BLAS], [
AC_ARG_WITH([blas], [AS_HELP_STRING([--with-blas=LIB], [CBLAS library to link (default: openblas)])],
  [], [with_blas=openblas])
PKG_PROG_PKG_CONFIG
cai_blas=no
PKG_CHECK_MODULES([BLAS], [openblas], [cai_blas="openblas (pkg-config)"], [
  AC_CHECK_LIB([$with_blas], [cblas_sgemm], [BLAS_LIBS="-l$with_blas"; cai_blas="$with_blas"],
    [AC_MSG_ERROR([no CBLAS found (cblas_sgemm): install OpenBLAS (Debian: apt-get install libopenblas-dev) or pass --with-blas=LIB])])])
save_CFLAGS=$CFLAGS; CFLAGS="$CFLAGS $BLAS_CFLAGS"
AC_CHECK_HEADERS([cblas.h], [], [AC_MSG_ERROR([cblas.h not found: install libopenblas-dev])])
CFLAGS=$save_CFLAGS
AC_SUBST([BLAS_CFLAGS])
AC_SUBST([BLAS_LIBS])
])
