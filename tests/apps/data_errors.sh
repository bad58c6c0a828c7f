#!/bin/sh
# colossal-data failures: unknown subcommands and keys, bad JSONL (every
# rank stops; the message names file and line), and hand-corrupted datasets
# (each with its own message and exit 1, never a crash).
. "$top_srcdir/tests/apps/data_lib.sh"

# Under the sanitizers (make check-sanitize: CAI_SANITIZE=1) the refusals
# that do not depend on the rank count run on 1 rank (a 2-rank ASan launch
# costs half again as much, and mpiexec waits 2 s after it: Makefile.am,
# odls_base_sigkill_timeout); the plain suite runs them on 2 ranks, and the
# bad JSON line (3 ranks) and the missing key (2 ranks) keep a refusal on
# several ranks under the sanitizers.
NR=2
[ "${CAI_SANITIZE:-0}" != 1 ] || NR=1

run_np "$NR" nonsense
[ "$RC" -eq 2 ] || fail "unknown subcommand: exit $RC, expected 2"
expect_grep err 'unknown subcommand "nonsense"'
expect_grep err "preprocess"
run_np 1
[ "$RC" -eq 2 ] || fail "no subcommand: exit $RC, expected 2"
run_np 1 --help
expect_ok
expect_grep out "train-tokenizer"
run_np 2 preprocess --help
expect_ok
for key in input output_prefix format json_key tokenizer eod progress; do
    expect_grep out "$key" "preprocess --help does not list $key"
done
[ "$(grep -c 'json_key' "$TMP/out")" -eq 1 ] || fail "--help printed by more than one rank"
run_np 1 preprocess --input x --output-prefix y --no-such-key 1
[ "$RC" -eq 2 ] || fail "unknown key: exit $RC, expected 2"
expect_grep err "no-such-key"
run_np "$NR" preprocess --output-prefix "$TMP/x"
expect_fail
expect_grep err "input"

# a malformed line in the last rank's slice
run_np 1 corpus --out "$TMP/c.jsonl" --docs 200 --seed 1
expect_ok
sed '190s/.*/{"text": "broken/' "$TMP/c.jsonl" >"$TMP/bad.jsonl"
run_np 3 preprocess --input "$TMP/bad.jsonl" --output-prefix "$TMP/bad"
[ "$RC" -eq 1 ] || fail "bad JSON: exit $RC, expected 1"
expect_grep err "bad.jsonl:190: not valid JSON"
[ ! -e "$TMP/bad.bin" ] && [ ! -e "$TMP/bad.idx" ] || fail "a failed run left output behind"
ls "$TMP" | grep -q 'part-' && fail "partial files left behind"
run_np 2 preprocess --input "$TMP/c.jsonl" --json-key body --output-prefix "$TMP/bad"
expect_fail
expect_grep err 'c.jsonl:1: no "body" key'

# corrupted datasets
run_np 1 preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/good"
expect_ok
corrupt() { # NAME OFFSET BYTES(printf escapes) [FILE-EXT]
    cp "$TMP/good.idx" "$TMP/$1.idx"
    cp "$TMP/good.bin" "$TMP/$1.bin"
    printf "$3" | dd of="$TMP/$1.${4:-idx}" bs=1 seek="$2" conv=notrunc 2>/dev/null
}
corrupt magic 0 'X'
corrupt version 9 '\003'
corrupt dtype 17 '\011'
corrupt docidx 34 '\377' # first length byte: lengths no longer match pointers
cp "$TMP/good.idx" "$TMP/cut.idx"
head -c 100 "$TMP/good.bin" >"$TMP/cut.bin"
for case in "magic:bad magic" "version:version is 3" "dtype:dtype code 9 is unknown" \
    "docidx:inconsistent|runs past" "cut:runs past the end"; do
    name=${case%%:*}
    want=${case#*:}
    run_np 1 info --data "$TMP/$name"
    [ "$RC" -eq 1 ] || fail "$name: exit $RC, expected 1"
    expect_grep err "$want" "$name: the error does not say /$want/"
    expect_grep err "$name\.(idx|bin)" "$name: the error does not name the file"
done
run_np 1 info --data "$TMP/good" --vocab-size 100
[ "$RC" -eq 1 ] || fail "vocabulary: exit $RC, expected 1"
expect_grep err "outside the vocabulary \[0, 100\)"
run_np 1 info --data "$TMP/missing"
expect_fail
expect_grep err "missing.idx: cannot open"
echo ok
