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
    echo "+ $MPIEXEC -n $n colossal-ckpt $*"
    RC=0
    # One rank: none is left for mpiexec to signal when it exits non-zero, so it
    # need not wait odls_base_sigkill_timeout (Makefile.am) twice.
    cai_kill_wait=${OMPI_MCA_odls_base_sigkill_timeout:-1}
    [ "$n" != 1 ] || cai_kill_wait=0
    OMPI_MCA_odls_base_sigkill_timeout=$cai_kill_wait \
        $MPIEXEC -n "$n" --oversubscribe "$CKPT_BIN" "$@" >"$TMP/out" 2>"$TMP/err" || RC=$?
}

# The PyTorch checks skip (exit 77) without a python3 that has torch.
need_torch() {
    if [ -z "$PYTHON_TORCH" ] || [ "$PYTHON_TORCH" = none ]; then
        echo "SKIP: no python3 with torch (configure PYTHON_TORCH=none)"
        exit 77
    fi
}
