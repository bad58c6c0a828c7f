# Shared helpers for the colossal-ckpt end-to-end tests (sourced, not run).
# data_lib.sh gives the scratch directory $TMP, fail/expect_* and run_np
# (colossal-data); ckpt N ARGS... runs colossal-ckpt the same way.
. "$top_srcdir/tests/apps/data_lib.sh"
CKPT_BIN="$top_builddir/apps/colossal-ckpt"
LOGITS_BIN="$top_builddir/tests/unit/test_hf_logits"
HF_REF="$top_srcdir/tests/parity/hf_reference.py"

# ckpt N ARGS...: colossal-ckpt on N ranks; stdout in $TMP/out, stderr in
# $TMP/err, exit status in $RC.
ckpt() {
    n=$1
    shift
    cai_launch "$n" "$CKPT_BIN" "$@"
}

# The PyTorch checks skip (exit 77) without a python3 that has torch.
need_torch() {
    if [ -z "$PYTHON_TORCH" ] || [ "$PYTHON_TORCH" = none ]; then
        echo "SKIP: no python3 with torch (configure PYTHON_TORCH=none)"
        exit 77
    fi
}
