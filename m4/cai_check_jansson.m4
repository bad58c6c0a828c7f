dnl cai_check_jansson.m4 -- jansson (safetensors headers and Hugging Face
dnl config.json are JSON); required.
dnl
dnl CAI_CHECK_JANSSON
dnl   PKG_CHECK_MODULES on jansson: substs JANSSON_CFLAGS and JANSSON_LIBS.
dnl   Not found is an error. No --with option (pkg-config's JANSSON_CFLAGS and
dnl   JANSSON_LIBS variables override).

AC_DEFUN([CAI_CHECK_JANSSON], [
PKG_CHECK_MODULES([JANSSON], [jansson], [],
  [AC_MSG_ERROR([jansson not found: install libjansson-dev (safetensors headers and HF config.json are JSON)])])
])
