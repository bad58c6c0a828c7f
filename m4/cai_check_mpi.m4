dnl cai_check_mpi.m4 -- MPI: the compiler wrapper, the launcher, the library
dnl version and whether MPI was built CUDA-aware.
dnl
dnl CAI_PROG_MPICC
dnl   Call before AC_PROG_CC. Finds the MPI C compiler wrapper (mpicc,
dnl   mpicc.openmpi) into the precious variable MPICC and makes it CC unless
dnl   the user set CC. No MPI wrapper is an error.
dnl
dnl CAI_CHECK_MPI
dnl   Call after AC_PROG_CC. Checks that $CC links MPI programs (error if
dnl   not), finds the launcher into the precious variable MPIEXEC (mpiexec,
dnl   mpirun, mpiexec.openmpi; "none" if missing), and records
dnl     cai_mpi_version     MPI_Get_library_version()'s first line, up to the
dnl                         first comma ("unknown" if the test program fails)
dnl     cai_mpi_cuda_aware  yes/no: mpi-ext.h defines MPIX_CUDA_AWARE_SUPPORT
dnl                         (a compile-time hint; the library decides again
dnl                         at run time)
dnl   Defines HAVE_MPI_EXT_H (AC_CHECK_HEADERS) and CAI_MPI_VERSION_BUILD (the
dnl   version string). No --with option: the compiler is the MPI wrapper.

AC_DEFUN([CAI_PROG_MPICC], [
AC_BEFORE([$0], [AC_PROG_CC])
dnl The whole suite is MPI-native: the C compiler is the MPI wrapper.
AC_ARG_VAR([MPICC], [MPI C compiler wrapper])
AC_CHECK_PROGS([MPICC], [mpicc mpicc.openmpi], [none])
AS_IF([test "x$MPICC" = xnone],
      [AC_MSG_ERROR([no MPI C compiler (mpicc) found: install an MPI such as OpenMPI (Debian: apt-get install libopenmpi-dev openmpi-bin) or set MPICC])])
AS_IF([test -z "$CC"], [CC="$MPICC"])
])

AC_DEFUN([CAI_CHECK_MPI], [
AC_REQUIRE([AC_PROG_CC])
AC_MSG_CHECKING([that $CC compiles and links MPI programs])
AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]], [[MPI_Init(0, 0); MPI_Finalize();]])],
  [AC_MSG_RESULT([yes])],
  [AC_MSG_RESULT([no]); AC_MSG_ERROR([$CC cannot build MPI programs; use CC=mpicc])])

AC_ARG_VAR([MPIEXEC], [MPI launcher used by the tests])
AC_CHECK_PROGS([MPIEXEC], [mpiexec mpirun mpiexec.openmpi], [none])

dnl MPI version string (what the library reports about itself)
AC_MSG_CHECKING([MPI library version])
AC_RUN_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>
#include <stdio.h>
#include <string.h>]], [[char v[MPI_MAX_LIBRARY_VERSION_STRING]; int n = 0;
  MPI_Get_library_version(v, &n); char *nl = strchr(v, '\n'); if (nl) *nl = 0;
  char *c = strchr(v, ','); if (c) *c = 0;
  FILE *f = fopen("conftest.mpiver", "w"); if (!f) return 1; fputs(v, f); fclose(f); return 0;]])],
  [cai_mpi_version=`cat conftest.mpiver`], [cai_mpi_version=unknown], [cai_mpi_version="cross-compiling"])
rm -f conftest.mpiver
AC_MSG_RESULT([$cai_mpi_version])
AC_DEFINE_UNQUOTED([CAI_MPI_VERSION_BUILD], ["$cai_mpi_version"], [MPI library seen at configure time])

dnl CUDA-aware MPI: compile-time hint only; the library re-checks at run time.
cai_mpi_cuda_aware=no
AC_CHECK_HEADERS([mpi-ext.h], [], [], [[#include <mpi.h>]])
AC_MSG_CHECKING([whether MPI was built CUDA-aware])
AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>
#if HAVE_MPI_EXT_H
#include <mpi-ext.h>
#endif]], [[#if !defined(MPIX_CUDA_AWARE_SUPPORT) || !MPIX_CUDA_AWARE_SUPPORT
#error not cuda aware
#endif]])], [cai_mpi_cuda_aware=yes])
AC_MSG_RESULT([$cai_mpi_cuda_aware (decided again at run time)])
])
