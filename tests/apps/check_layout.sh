#!/bin/sh
# colossal-check --layout on one process draws meshes for worlds it is not
# running in. The groups it prints are compared with groups computed here
# from first principles: a row-major grid over the order string (outermost
# first), each axis group = the ranks that differ only in that axis' grid
# dimensions, DP spanning edp x ep with dp rank = edp * ep + ep index.
. "$top_srcdir/tests/apps/check_lib.sh"

# expected_groups AXIS PP DP EP SP TP ORDER: one group per line, ranks in
# axis-rank order, groups sorted.
expected_groups() {
    awk -v axis="$1" -v pp="$2" -v dp="$3" -v ep="$4" -v sp="$5" -v tp="$6" -v order="$7" 'BEGIN {
        size["pp"] = pp; size["dp"] = dp / ep; size["ep"] = ep; size["sp"] = sp; size["tp"] = tp
        n = split(order, ord, ",")
        world = pp * dp * sp * tp
        stride = 1
        for (i = n; i >= 1; i--) { st[ord[i]] = stride; stride *= size[ord[i]] }
        # grid dimensions the axis spans, outer (slower axis rank) first
        if (axis == "dp") { nd = 2; d[1] = "dp"; d[2] = "ep" } else { nd = 1; d[1] = axis }
        for (r = 0; r < world; r++) {
            key = ""; arank = 0
            for (i = 1; i <= n; i++) {
                c = int(r / st[ord[i]]) % size[ord[i]]
                spanned = 0
                for (k = 1; k <= nd; k++) if (d[k] == ord[i]) spanned = 1
                if (!spanned) key = key "," c
            }
            for (k = 1; k <= nd; k++) arank = arank * size[d[k]] + int(r / st[d[k]]) % size[d[k]]
            member[key, arank] = r; keys[key] = 1
        }
        gsize = 1; for (k = 1; k <= nd; k++) gsize *= size[d[k]]
        for (key in keys) {
            line = ""
            for (a = 0; a < gsize; a++) line = line (a ? " " : "") member[key, a]
            print line
        }
    }' | sort
}

# printed_groups AXIS: the "[a b c]" groups on the line that starts with the
# axis name, one per line, sorted.
printed_groups() {
    awk -v axis="$1" '{
        line = $0; sub(/^[ \t#]*/, "", line)
        if (tolower(substr(line, 1, length(axis) + 1)) != axis " " && tolower(substr(line, 1, length(axis) + 1)) != axis ":") next
        while (match(line, /\[[0-9 ,]+\]/)) {
            g = substr(line, RSTART + 1, RLENGTH - 2); gsub(/,/, " ", g); gsub(/  +/, " ", g)
            sub(/^ /, "", g); sub(/ $/, "", g); print g
            line = substr(line, RSTART + RLENGTH)
        }
    }' "$TMP/out" | sort
}

check_axis() { # AXIS PP DP EP SP TP ORDER
    want=$(expected_groups "$@")
    got=$(printed_groups "$1")
    [ -n "$got" ] || fail "no '$1' groups printed"
    [ "$want" = "$got" ] || fail "$1 groups differ (order $7): expected
$want
got
$got"
}

# The example from the brief, on a single process.
run_np 1 --layout --np 8 --tp 2 --pp 2
expect_ok
expect_grep out '8 ranks.*grid pp=2 x edp=2 x ep=1 x sp=1 x tp=2' "grid line for 8 ranks missing"
for axis in tp dp pp; do check_axis $axis 2 2 1 1 2 pp,dp,ep,sp,tp; done
# Spot checks written out by hand, independent of the awk above.
expect_grep out '\[0 1\]' && expect_grep out '\[2 3\]' && expect_grep out '\[6 7\]'
expect_grep out '\[0 2\]' && expect_grep out '\[5 7\]'
expect_grep out '\[0 4\]' && expect_grep out '\[3 7\]'

# Every axis at once, experts factoring dp: 32 = pp 2 x dp 4 (edp 2 x ep 2) x sp 2 x tp 2.
run_np 1 --layout --np 32 --pp 2 --dp 4 --ep 2 --sp 2 --tp 2
expect_ok
for axis in tp sp ep dp pp; do check_axis $axis 2 4 2 2 2 pp,dp,ep,sp,tp; done

# A different order: tp outermost, pp innermost.
run_np 1 --layout --np 8 --tp 2 --pp 2 --mesh.order tp,sp,ep,dp,pp
expect_ok
for axis in tp dp pp; do check_axis $axis 2 2 1 1 2 tp,sp,ep,dp,pp; done

# dp defaults to the rest of the world; np defaults to the job's size.
run_np 4 --layout --tp 2
expect_ok
expect_grep out '4 ranks.*grid pp=1 x edp=2 x ep=1 x sp=1 x tp=2' "dp was not derived as 4 / tp"
[ "$(count_grep out '^tp groups')" -eq 1 ] || fail "layout printed by more than rank 0"
check_axis tp 1 2 1 1 2 pp,dp,ep,sp,tp

# Model shape that fits: 8 heads, 2 KV heads over tp 2; 4 layers over pp 2.
run_np 1 --layout --np 8 --tp 2 --pp 2 --model.n_heads 8 --model.n_kv_heads 2 --model.n_layers 4
expect_ok
echo "ok"
