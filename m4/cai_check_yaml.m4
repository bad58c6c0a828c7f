dnl cai_check_yaml.m4 -- libyaml (configuration files are YAML); required.
dnl
dnl CAI_CHECK_YAML
dnl   PKG_CHECK_MODULES on yaml-0.1: substs YAML_CFLAGS and YAML_LIBS.
dnl   Not found is an error. No --with option (pkg-config's YAML_CFLAGS and
dnl   YAML_LIBS variables override).

AC_DEFUN([CAI_CHECK_YAML], [
PKG_CHECK_MODULES([YAML], [yaml-0.1], [],
  [AC_MSG_ERROR([libyaml not found: install libyaml-dev (config files are YAML)])])
])
