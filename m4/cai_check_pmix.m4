dnl cai_check_pmix.m4 -- PMIx headers (optional).
dnl
dnl CAI_CHECK_PMIX
dnl   pkg-config "pmix" first (substs PMIX_CFLAGS and PMIX_LIBS), else a
dnl   plain pmix.h header check. Defines CAI_HAVE_PMIX to 1 or 0 and
dnl   CAI_PMIX_DESC (the string below); sets cai_pmix ("yes (VERSION)",
dnl   "yes (headers)" or "no") for the summary. No --with option.

AC_DEFUN([CAI_CHECK_PMIX], [
cai_pmix=no
PKG_CHECK_MODULES([PMIX], [pmix], [cai_pmix="yes (`$PKG_CONFIG --modversion pmix`)"], [
  AC_CHECK_HEADER([pmix.h], [cai_pmix="yes (headers)"], [cai_pmix=no])])
AS_IF([test "x$cai_pmix" != xno],
  [AC_DEFINE([CAI_HAVE_PMIX], [1], [PMIx headers available])
  ],
  [AC_DEFINE([CAI_HAVE_PMIX], [0], [PMIx headers available])])
AC_DEFINE_UNQUOTED([CAI_PMIX_DESC], ["$cai_pmix"], [PMIx as found by configure])
])
