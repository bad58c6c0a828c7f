# The launch every app test library shares (sourced, not run; `fail` and
# $TMP come from the library that sources it).

# cai_launch N BIN ARGS...: BIN on N ranks; stdout in $TMP/out, stderr in
# $TMP/err, exit status in $RC.
cai_launch() {
    cai_n=$1
    cai_bin=$2
    shift 2
    echo "+ $MPIEXEC -n $cai_n ${cai_bin##*/} $*"
    RC=0
    # One rank: none is left for mpiexec to signal when it exits non-zero, so it
    # need not wait odls_base_sigkill_timeout (Makefile.am) twice.
    cai_kill_wait=${OMPI_MCA_odls_base_sigkill_timeout:-1}
    [ "$cai_n" != 1 ] || cai_kill_wait=0
    OMPI_MCA_odls_base_sigkill_timeout=$cai_kill_wait \
        $MPIEXEC -n "$cai_n" --oversubscribe "$cai_bin" "$@" >"$TMP/out" 2>"$TMP/err" || RC=$?
    # Under --enable-sanitizers an expected failure must still be a clean one.
    ! grep -Eq 'Sanitizer|runtime error:' "$TMP/err" || fail "sanitizer report from: ${cai_bin##*/} $*"
}
