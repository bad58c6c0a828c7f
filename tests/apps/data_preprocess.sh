#!/bin/sh
# colossal-data corpus -> preprocess on 1, 2 and 3 ranks (byte-identical
# output, text and JSONL alike) -> info reads it back.
. "$top_srcdir/tests/apps/data_lib.sh"

run_np 1 corpus --out "$TMP/c.jsonl" --docs 600 --seed 3
expect_ok
expect_grep out "600 documents"
[ "$(wc -l <"$TMP/c.jsonl")" -eq 600 ] || fail "corpus.jsonl does not have 600 lines"
run_np 2 corpus --out "$TMP/c.txt" --docs 600 --seed 3
expect_ok
[ "$(grep -c '^$' "$TMP/c.txt")" -eq 599 ] || fail "text corpus: expected 599 blank separator lines"

for n in 1 2 3; do
    run_np $n preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/j$n" --log.level warn
    expect_ok
    expect_grep out "^preprocess: 600 documents, [0-9]+ tokens \(uint16, vocabulary 257\).* MB/s on $n rank"
done
same_dataset "$TMP/j1" "$TMP/j2"
same_dataset "$TMP/j1" "$TMP/j3"

run_np 3 preprocess --input "$TMP/c.txt" --output "$TMP/t3" --format text
expect_ok
same_dataset "$TMP/j1" "$TMP/t3"
ls "$TMP" | grep -q 'part-' && fail "partial files left behind"

# A progress line appears when asked for often enough.
run_np 2 preprocess --input "$TMP/c.jsonl,$TMP/c.jsonl" --output "$TMP/twice" --progress 1e-9
expect_ok
expect_grep err "preprocess: rank 0 at .*% of its .* MB/s" "no progress line"
expect_grep out "1200 documents"

run_np 1 info --data "$TMP/j3" --vocab-size 257 --seq-len 64
expect_ok
expect_grep out "documents +600$"
expect_grep out "dtype +uint16 \(code 8\)"
expect_grep out "samples +[0-9]+ of 64 \+ 1 tokens"
# 64-token samples: (tokens - 1) / 64 of them
tokens=$(sed -n 's/^ *tokens *\([0-9]*\).*/\1/p' "$TMP/out")
samples=$(sed -n 's/^ *samples *\([0-9]*\).*/\1/p' "$TMP/out")
[ "$samples" -eq $(( (tokens - 1) / 64 )) ] || fail "samples $samples, expected ($tokens - 1) / 64"
# token count: every byte of every document plus one end-of-document each
bytes=$(python3 -c 'import json,sys; print(sum(len(json.loads(l)["text"].encode()) for l in open(sys.argv[1])))' "$TMP/c.jsonl" 2>/dev/null || echo "")
[ -z "$bytes" ] || [ "$tokens" -eq $((bytes + 600)) ] || fail "tokens $tokens, expected $bytes bytes + 600 eod"
echo ok
