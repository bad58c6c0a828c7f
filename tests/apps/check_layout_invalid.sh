#!/bin/sh
# Layouts that cannot work fail with a non-zero exit, a message that names
# the disagreeing numbers, and suggestions that really fit; a bad layout for
# the job's own world fails before any mesh or buffer exists.
. "$top_srcdir/tests/apps/check_lib.sh"

# suggestions_fit WORLD: the error suggests at least one layout, each a
# quoted "tp=a pp=b dp=c [sp=d] [ep=e]", and each multiplies to WORLD (ep
# factors dp, so it is not a factor of the world).
suggestions_fit() {
    n=$(grep -Eo '"([a-z]+=[0-9]+ ?)+"' "$TMP/err" | awk -v world="$1" '
        {
            gsub(/"/, ""); prod = 1; ndim = 0
            for (i = 1; i <= NF; i++) {
                split($i, kv, "=")
                if (kv[1] == "pp" || kv[1] == "dp" || kv[1] == "sp" || kv[1] == "tp") { prod *= kv[2]; ndim++ }
            }
            if (prod != world || ndim < 3) { print "BAD " $0; exit }
            count++
        }
        END { if (count) print count }')
    case "$n" in
    "") fail "no suggested layouts in the error" ;;
    BAD*) fail "suggested layout does not fit world $1: $n" ;;
    esac
    echo "  $n suggestions, all multiply to $1"
}

run_np 1 --layout --np 6 --tp 4
expect_fail
expect_grep err '6' "error does not mention world size 6"
expect_grep err 'tp' "error does not mention tp"
suggestions_fit 6
[ "$(count_grep err 'error')" -ge 1 ] || fail "no error line"

# Heads that tp does not divide.
run_np 1 --layout --np 8 --tp 2 --model.n_heads 3
expect_fail
expect_grep err 'head' "a heads/tp mismatch is not explained"

# Experts that ep does not divide.
run_np 1 --layout --np 8 --dp 8 --ep 4 --model.n_experts 6
expect_fail
expect_grep err 'expert' "an experts/ep mismatch is not explained"

# ep must divide dp.
run_np 1 --layout --np 8 --dp 4 --tp 2 --ep 3
expect_fail

# A bad order string.
run_np 1 --layout --np 8 --tp 2 --mesh.order pp,dp,tp
expect_fail
expect_grep err 'order' "a bad order is not explained"

# The job's own world: 2 ranks cannot hold tp 4; the bench must refuse
# before building the mesh, so no table header appears.
run_np 2 --bench --tp 4 --max_bytes 4K
expect_fail
expect_no_grep out '^# axis' "the bench ran despite an invalid layout"
expect_grep err 'tp'
[ "$(count_grep err '\] error:')" -eq 1 ] || fail "expected the error once (from the first failing rank)"
echo "ok"
