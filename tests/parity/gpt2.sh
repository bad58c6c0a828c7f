#!/bin/sh
# suite-lock: shared
# GPT-2 parity with PyTorch (docs/parity.md).
exec "${SHELL:-/bin/sh}" "${top_srcdir:?export top_srcdir and top_builddir (make check does)}/tests/parity/run-parity.sh" gpt2
