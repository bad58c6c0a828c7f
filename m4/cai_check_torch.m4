dnl cai_check_torch.m4 -- a Python interpreter with PyTorch for the parity
dnl tests (optional).
dnl
dnl CAI_CHECK_TORCH
dnl   The precious variable PYTHON_TORCH names the interpreter; when unset,
dnl   Debian's python3-torch lives in the system interpreter, which a pyenv
dnl   or venv python3 on PATH may hide: /usr/bin/python3 is tried first, then
dnl   python3, and the first that imports torch and numpy is taken. None is a
dnl   warning (the parity tests are skipped) and PYTHON_TORCH=none. Sets
dnl   cai_torch ("yes (PYTHON, torch VERSION)" or "no") for the summary. No
dnl   --with option.

AC_DEFUN([CAI_CHECK_TORCH], [
AC_ARG_VAR([PYTHON_TORCH], [Python interpreter with torch for the parity tests])
cai_torch=no
AS_IF([test -z "$PYTHON_TORCH"], [
  for py in /usr/bin/python3 python3; do
    AS_IF([test -z "$PYTHON_TORCH" && $py -c 'import torch, numpy' >/dev/null 2>&1], [PYTHON_TORCH=$py])
  done])
AS_IF([test -n "$PYTHON_TORCH"],
  [cai_torch="yes ($PYTHON_TORCH, torch `$PYTHON_TORCH -c 'import torch; print(torch.__version__)' 2>/dev/null`)"],
  [PYTHON_TORCH=none
   AC_MSG_WARN([no python3 with torch: PyTorch parity tests will be skipped (apt-get install python3-torch)])])
])
