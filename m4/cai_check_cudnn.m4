dnl cai_check_cudnn.m4 -- cuDNN 9 fused attention through cudnn-frontend
dnl (optional; needs the CUDA backend).
dnl
dnl cudnn-frontend is a header-only C++ library (NVIDIA/cudnn-frontend on
dnl GitHub, not packaged by Debian): both it and cuDNN are needed; without
dnl them the CUDA backend uses its own attention kernels only.
dnl
dnl CAI_CHECK_CUDNN
dnl   Call after CAI_CHECK_CUDA (it reads cai_cuda and cuda_home).
dnl   --with-cudnn[=PATH]          cuDNN 9 prefix (default: auto-detect in the
dnl                                CUDA tree, then /usr; --without-cudnn skips)
dnl   --with-cudnn-frontend=DIR    directory holding cudnn_frontend.h; never
dnl                                searched for or downloaded
dnl   With cuDNN and the frontend: appends -DCAI_HAVE_CUDNN=1, the cuDNN
dnl   include flags and -isystem DIR to NVCCFLAGS and the cuDNN and NVRTC
dnl   libraries to CUDA_LIBS (both substed by CAI_CHECK_CUDA). cuDNN without
dnl   the frontend is a notice, or an error with an explicit --with-cudnn; an
dnl   explicit --with-cudnn without cuDNN 9 is an error. Sets cai_cudnn
dnl   ("yes (PREFIX), frontend DIR" or "no") for the summary.

AC_DEFUN([CAI_CHECK_CUDNN], [
AC_REQUIRE([CAI_CHECK_CUDA])
AC_ARG_WITH([cudnn], [AS_HELP_STRING([--with-cudnn@<:@=PATH@:>@],
  [cuDNN 9 prefix for fused attention (default: auto-detect in the CUDA tree and the system)])],
  [], [with_cudnn=check])
AC_ARG_WITH([cudnn-frontend], [AS_HELP_STRING([--with-cudnn-frontend=DIR],
  [directory holding cudnn_frontend.h (cudnn-frontend's include/)])],
  [], [with_cudnn_frontend=no])
cai_cudnn=no
AS_IF([test "x$cai_cuda" != xno && test "x$with_cudnn" != xno], [
  AS_CASE([$with_cudnn], [check|yes], [cudnn_dirs="$cuda_home /usr"], [cudnn_dirs=$with_cudnn])
  save_CFLAGS=$CFLAGS; save_LIBS=$LIBS
  for d in $cudnn_dirs; do
    AS_IF([test "x$cai_cudnn" = xno], [
      dnl the compilers search /usr/include (and its multiarch directory) themselves;
      dnl naming it with -I would reorder the system headers for nvcc
      AS_IF([test "x$d" = x/usr], [CUDNN_CFLAGS=], [CUDNN_CFLAGS="-I$d/include"])
      CUDNN_LIBS="-L$d/lib64 -L$d/lib/x86_64-linux-gnu -L$d/lib -Wl,-rpath,$d/lib64 -lcudnn"
      CFLAGS="$save_CFLAGS $CUDA_CFLAGS $CUDNN_CFLAGS"; LIBS="$CUDNN_LIBS $CUDA_LIBS $save_LIBS"
      AC_MSG_CHECKING([for cuDNN 9 in $d])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cudnn.h>
#if CUDNN_MAJOR < 9
#error cuDNN 9 or later needed
#endif]], [[return (int)cudnnGetVersion();]])],
        [AC_MSG_RESULT([yes]); cai_cudnn="yes ($d)"], [AC_MSG_RESULT([no])])])
  done
  CFLAGS=$save_CFLAGS; LIBS=$save_LIBS
  AS_IF([test "x$cai_cudnn" != xno], [
    AS_IF([test "x$with_cudnn_frontend" = xno || test ! -f "$with_cudnn_frontend/cudnn_frontend.h"], [
      AS_IF([test "x$with_cudnn" != xcheck],
        [AC_MSG_ERROR([--with-cudnn needs --with-cudnn-frontend=DIR (the directory holding cudnn_frontend.h)])])
      AC_MSG_NOTICE([cuDNN found but no cudnn-frontend (--with-cudnn-frontend=DIR): cuDNN attention not built])
      cai_cudnn=no],
     dnl the frontend's experimental engines compile kernels with NVRTC; its
     dnl JSON serialisation (graph printing) is not needed
     [NVCCFLAGS="$NVCCFLAGS -DCAI_HAVE_CUDNN=1 -DCUDNN_FRONTEND_SKIP_JSON_LIB $CUDNN_CFLAGS -isystem $with_cudnn_frontend"
      CUDA_LIBS="$CUDNN_LIBS -lnvrtc $CUDA_LIBS"
      cai_cudnn="$cai_cudnn, frontend $with_cudnn_frontend"])],
   [AS_IF([test "x$with_cudnn" != xcheck], [AC_MSG_ERROR([--with-cudnn given but cuDNN 9 was not found])])])
])
])
