dnl cai_check_hdf5.m4 -- parallel HDF5 for checkpoints (optional; serial
dnl HDF5 is refused).
dnl
dnl CAI_CHECK_HDF5
dnl   --with-hdf5[=PKG|DIR]: a pkg-config name (default: hdf5-openmpi, then
dnl   hdf5) or an install prefix (DIR/include, DIR/lib, -lhdf5);
dnl   --without-hdf5 builds without checkpoints. The HDF5 found must define
dnl   H5_HAVE_PARALLEL in hdf5.h and link H5Pset_fapl_mpio (a compile test, not
dnl   the wrapper's name); a serial HDF5 is an error with a message saying how
dnl   to fix it. Not found is an error when --with-hdf5 was given, a warning
dnl   otherwise.
dnl   Substs HDF5_CFLAGS and HDF5_LIBS (emptied when disabled); defines
dnl   CAI_HAVE_HDF5 to 1 or 0; AM_CONDITIONAL HAVE_HDF5; sets cai_hdf5
dnl   ("yes (parallel)" or "no") for the summary.

AC_DEFUN([CAI_CHECK_HDF5], [
AC_ARG_WITH([hdf5], [AS_HELP_STRING([--with-hdf5@<:@=PKG|DIR@:>@],
  [parallel HDF5 for checkpoints: a pkg-config name (default hdf5-openmpi) or an install prefix; --without-hdf5 disables checkpoints])],
  [], [with_hdf5=check])
cai_hdf5=no
AS_IF([test "x$with_hdf5" != xno], [
  AS_CASE([$with_hdf5],
    [check|yes], [PKG_CHECK_MODULES([HDF5], [hdf5-openmpi], [cai_hdf5=found],
                    [PKG_CHECK_MODULES([HDF5], [hdf5], [cai_hdf5=found], [cai_hdf5=no])])],
    [/*], [HDF5_CFLAGS="-I$with_hdf5/include"; HDF5_LIBS="-L$with_hdf5/lib -lhdf5"; cai_hdf5=found],
    [PKG_CHECK_MODULES([HDF5], [$with_hdf5], [cai_hdf5=found], [cai_hdf5=no])])
  AS_IF([test "x$cai_hdf5" = xfound], [
    save_CFLAGS=$CFLAGS; save_LIBS=$LIBS
    CFLAGS="$CFLAGS $HDF5_CFLAGS"; LIBS="$HDF5_LIBS $LIBS"
    AC_MSG_CHECKING([that HDF5 is built for parallel I/O (H5_HAVE_PARALLEL)])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <hdf5.h>]], [[#ifndef H5_HAVE_PARALLEL
#error serial HDF5
#endif
      hid_t p = H5Pcreate(H5P_FILE_ACCESS); H5Pset_fapl_mpio(p, MPI_COMM_WORLD, MPI_INFO_NULL);]])],
      [AC_MSG_RESULT([yes]); cai_hdf5="yes (parallel)"],
      [AC_MSG_RESULT([no])
       AC_MSG_ERROR([the HDF5 found ($HDF5_CFLAGS) is serial. colossal writes checkpoints collectively through MPI-IO and needs parallel HDF5: install libhdf5-openmpi-dev (Debian) or pass --with-hdf5=PREFIX of a parallel build; --without-hdf5 builds without checkpoints])])
    CFLAGS=$save_CFLAGS; LIBS=$save_LIBS
  ], [
    AS_IF([test "x$with_hdf5" != xcheck],
      [AC_MSG_ERROR([parallel HDF5 requested but not found])])
    AC_MSG_WARN([parallel HDF5 not found: checkpoints are disabled (install libhdf5-openmpi-dev)])
  ])
])
AS_IF([test "x$cai_hdf5" = "xyes (parallel)"],
  [AC_DEFINE([CAI_HAVE_HDF5], [1], [parallel HDF5 available])],
  [AC_DEFINE([CAI_HAVE_HDF5], [0], [parallel HDF5 available])
   HDF5_CFLAGS=
   HDF5_LIBS=])
AM_CONDITIONAL([HAVE_HDF5], [test "x$cai_hdf5" = "xyes (parallel)"])
])
