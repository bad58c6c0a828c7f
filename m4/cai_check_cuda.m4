dnl cai_check_cuda.m4 -- the CUDA backend: CUDA runtime, cuBLAS, cuBLASLt,
dnl NCCL and the GPU architecture (optional).
dnl
dnl CAI_CHECK_CUDA
dnl   --with-cuda[=PATH]   CUDA toolkit (default: auto-detect in /usr/local/cuda;
dnl                        --without-cuda skips it). Needs PATH/bin/nvcc and
dnl                        links cudart, cuBLAS and cuBLASLt from PATH/lib64.
dnl   --with-cuda-arch=SM  architecture for nvcc (default 90, Hopper).
dnl   --with-nccl=PATH     NCCL prefix (default: the CUDA tree, then /usr).
dnl   When anything is missing the backend is off (a warning); with an
dnl   explicit --with-cuda it is an error.
dnl   Substs CUDA_CFLAGS, CUDA_LIBS, NCCL_CFLAGS, NCCL_LIBS (emptied when
dnl   off), NVCCFLAGS and CUDA_ARCH; defines CAI_HAVE_CUDA and CAI_HAVE_NCCL
dnl   to 1 or 0 and CAI_CONFIGURE_SUMMARY_CUDA; AM_CONDITIONAL HAVE_CUDA. Sets
dnl   cuda_home, cai_cuda ("yes (PATH, sm_SM)" or "no") and cai_nccl
dnl   ("yes (PREFIX)" or "no"); CAI_CHECK_CUDNN builds on these.

AC_DEFUN([CAI_CHECK_CUDA], [
AC_ARG_WITH([cuda], [AS_HELP_STRING([--with-cuda@<:@=PATH@:>@],
  [CUDA toolkit with cuBLAS(Lt) and NCCL (default: auto-detect in /usr/local/cuda)])],
  [], [with_cuda=check])
AC_ARG_WITH([cuda-arch], [AS_HELP_STRING([--with-cuda-arch=SM], [GPU architecture to build for (default 90, Hopper)])],
  [], [with_cuda_arch=90])
AC_ARG_WITH([nccl], [AS_HELP_STRING([--with-nccl=PATH], [NCCL prefix (default: the CUDA tree, then the system)])],
  [], [with_nccl=check])
cai_cuda=no
cai_nccl=no
AS_IF([test "x$with_cuda" != xno], [
  AS_CASE([$with_cuda], [check|yes], [cuda_home=/usr/local/cuda], [cuda_home=$with_cuda])
  AC_PATH_PROG([NVCC], [nvcc], [none], [$cuda_home/bin:$PATH])
  AS_IF([test "x$NVCC" != xnone], [
    CUDA_CFLAGS="-I$cuda_home/include"
    CUDA_LIBS="-L$cuda_home/lib64 -Wl,-rpath,$cuda_home/lib64 -lcublasLt -lcublas -lcudart"
    save_CFLAGS=$CFLAGS; save_LIBS=$LIBS
    CFLAGS="$CFLAGS $CUDA_CFLAGS"; LIBS="$CUDA_LIBS $LIBS"
    AC_MSG_CHECKING([for cudart, cuBLAS and cuBLASLt])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime.h>
#include <cublasLt.h>
#include <cublas_v2.h>]], [[int n; cudaGetDeviceCount(&n); cublasLtHandle_t h; cublasLtCreate(&h); cublasHandle_t b; cublasCreate(&b);]])],
      [AC_MSG_RESULT([yes]); cai_cuda="yes ($cuda_home, sm_$with_cuda_arch)"], [AC_MSG_RESULT([no])])
    AS_IF([test "x$cai_cuda" != xno], [
      AS_CASE([$with_nccl], [check|yes], [nccl_dirs="$cuda_home /usr"], [nccl_dirs=$with_nccl])
      for d in $nccl_dirs; do
        AS_IF([test "x$cai_nccl" = xno], [
          NCCL_CFLAGS="-I$d/include"; NCCL_LIBS="-L$d/lib64 -L$d/lib/x86_64-linux-gnu -L$d/lib -Wl,-rpath,$d/lib64 -lnccl"
          CFLAGS="$save_CFLAGS $CUDA_CFLAGS $NCCL_CFLAGS"; LIBS="$NCCL_LIBS $CUDA_LIBS $save_LIBS"
          AC_MSG_CHECKING([for NCCL in $d])
          AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]], [[int v; ncclGetVersion(&v);]])],
            [AC_MSG_RESULT([yes]); cai_nccl="yes ($d)"], [AC_MSG_RESULT([no])])])
      done
      AS_IF([test "x$cai_nccl" = xno], [
        AS_IF([test "x$with_cuda" != xcheck], [AC_MSG_ERROR([CUDA requested but NCCL not found; pass --with-nccl=PATH])])
        AC_MSG_WARN([NCCL not found: CUDA backend disabled]); cai_cuda=no])
    ])
    CFLAGS=$save_CFLAGS; LIBS=$save_LIBS
  ])
  AS_IF([test "x$cai_cuda" = xno && test "x$with_cuda" != xcheck],
    [AC_MSG_ERROR([--with-cuda given but nvcc, cudart, cuBLAS(Lt) or NCCL is missing under $cuda_home])])
])
AS_IF([test "x$cai_cuda" != xno],
  [AC_DEFINE([CAI_HAVE_CUDA], [1], [CUDA backend built])
   AC_DEFINE([CAI_HAVE_NCCL], [1], [NCCL available])],
  [AC_DEFINE([CAI_HAVE_CUDA], [0], [CUDA backend built])
   AC_DEFINE([CAI_HAVE_NCCL], [0], [NCCL available])
   CUDA_CFLAGS=
   CUDA_LIBS=
   NCCL_CFLAGS=
   NCCL_LIBS=])
AM_CONDITIONAL([HAVE_CUDA], [test "x$cai_cuda" != xno])
NVCCFLAGS="-O3 -std=c++17 -arch=sm_$with_cuda_arch -Xcompiler -fPIC"
AC_DEFINE_UNQUOTED([CAI_CONFIGURE_SUMMARY_CUDA], ["$cai_cuda"], [CUDA as found by configure])
AC_SUBST([NVCCFLAGS])
AC_SUBST([CUDA_CFLAGS])
AC_SUBST([CUDA_LIBS])
AC_SUBST([NCCL_CFLAGS])
AC_SUBST([NCCL_LIBS])
AC_SUBST([CUDA_ARCH], [$with_cuda_arch])
])
