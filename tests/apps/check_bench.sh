#!/bin/sh
# colossal-check --bench on 4 ranks as dp 2 x tp 2: one table per axis of
# size > 1, each with every collective at every size of the sweep. The
# numbers are checked for self-consistency against their definitions:
# algbw = size / time, busbw = algbw x the collective's traffic factor
# (allreduce 2(n-1)/n, the others (n-1)/n), count = elements per call.
. "$top_srcdir/tests/apps/check_lib.sh"

run_np 4 --bench --dp 2 --tp 2 --min_bytes 1K --max_bytes 1M --factor 4 --iters 5 --warmup 1
expect_ok
expect_grep out '^# axis tp: 2 groups of 2 ranks \(rank 0.s group: 0-1\)' "tp table header (group 0-1) missing"
expect_grep out '^# axis dp: 2 groups of 2 ranks \(rank 0.s group: 0,2\)' "dp table header (group 0,2) missing"
expect_grep out '^# axis pp: size 1' "pp (size 1) not reported as skipped"
expect_no_grep err 'error' "errors on stderr"

# Rows: "op size count type time algbw busbw transport...", grouped by the
# preceding "# axis X:" header.
awk '
    /^# axis [a-z_]+: [0-9]+ groups? of/ { axis = $3; sub(/:/, "", axis); n = $7; next }
    /^# axis/ { next }
    /^  [a-z]+ +[0-9]+ / && axis != "" {
        op = $1; size = $2; count = $3; type = $4; t = $5; alg = $6; bus = $7
        rows[axis]++; seen[axis, op, size] = 1
        if (type != "f32") { print "type " type; bad = 1 }
        want_count = op == "allreduce" ? size / 4 : size / 4 / n
        if (count != want_count) { print axis " " op " " size ": count " count " != " want_count; bad = 1 }
        if (t <= 0) { print axis " " op " " size ": time " t; bad = 1 }
        want_alg = size / t / 1e3
        if (alg - want_alg > 0.002 + 0.01 * want_alg || want_alg - alg > 0.002 + 0.01 * want_alg) {
            print axis " " op " " size ": algbw " alg " != size/time " want_alg; bad = 1
        }
        f = op == "allreduce" ? 2 * (n - 1) / n : (n - 1) / n
        if (bus - alg * f > 0.002 + 0.01 * bus || alg * f - bus > 0.002 + 0.01 * bus) {
            print axis " " op " " size ": busbw " bus " != algbw*" f; bad = 1
        }
        if ($0 !~ /MPI \(host\)/) { print "transport missing: " $0; bad = 1 }
    }
    END {
        split("allreduce allgather reducescatter alltoall", ops, " ")
        split("1024 4096 16384 65536 262144 1048576", sizes, " ")
        split("tp dp", axes, " ")
        for (a in axes) for (o in ops) for (s in sizes)
            if (!seen[axes[a], ops[o], sizes[s]]) { print "missing " axes[a] " " ops[o] " " sizes[s]; bad = 1 }
        if (rows["tp"] != 24 || rows["dp"] != 24) { print "rows tp " rows["tp"] " dp " rows["dp"] " (want 24 each)"; bad = 1 }
        exit bad
    }' "$TMP/out" >"$TMP/why" || fail "bench table check: $(cat "$TMP/why")"

# A selection: one axis, one collective, x2 steps; sizes that do not divide
# evenly among the group are rounded down to whole f32 blocks per rank.
run_np 4 --bench --dp 2 --tp 2 --axes tp --ops allreduce,alltoall --min_bytes 1K --max_bytes 8K --iters 3
expect_ok
[ "$(count_grep out '^# axis [a-z]+: [0-9]+ groups? of')" -eq 1 ] || fail "expected only the tp table"
[ "$(count_grep out '^  allreduce ')" -eq 4 ] || fail "expected 4 allreduce rows (1K..8K x2)"
[ "$(count_grep out '^  alltoall ')" -eq 4 ] || fail "expected 4 alltoall rows"
expect_no_grep out '^  (allgather|reducescatter) '

# A group of 3 cannot split 1 KiB into whole f32 blocks per rank: allgather
# sizes round down to multiples of 3 x 4 bytes, allreduce keeps them.
run_np 3 --bench --tp 3 --ops allreduce,allgather --min_bytes 1K --max_bytes 4K --iters 3
expect_ok
for row in 'allreduce +1024 +256 ' 'allreduce +4096 +1024 ' 'allgather +1020 +85 ' 'allgather +2040 +170 ' \
    'allgather +4092 +341 '; do
    expect_grep out "^  $row" "no row /$row/ on a group of 3"
done

# 2 ranks as dp 2: a single group, the whole world.
run_np 2 --bench --axes dp --ops allreduce --max_bytes 2K --iters 2
expect_ok
expect_grep out '^# axis dp: 1 group of 2 ranks \(rank 0.s group: 0-1\)'
[ "$(count_grep out '^  allreduce ')" -eq 2 ] || fail "expected 2 allreduce rows (1K, 2K)"

# One rank: nothing to measure is said, not an error.
run_np 1 --bench --max_bytes 4K
expect_ok
expect_grep out 'no axis of size > 1'
echo "ok"
