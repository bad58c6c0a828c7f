#!/bin/sh
# train-tokenizer on the embedded corpus, then preprocess with the learned
# BPE on 1 and 3 ranks: identical output, ids inside the vocabulary, the
# end-of-document token is in the vocabulary, and under half the tokens of
# the byte-level fallback.
. "$top_srcdir/tests/apps/data_lib.sh"

run_np 1 corpus --out "$TMP/c.jsonl" --docs 1500 --seed 5
expect_ok
run_np 2 train-tokenizer --vocab-size 512 --input "$TMP/c.jsonl" --output "$TMP/tok"
expect_ok
expect_grep out "^train-tokenizer: 1500 documents"
for f in vocab.json merges.txt tokenizer.json; do
    [ -s "$TMP/tok/$f" ] || fail "train-tokenizer did not write $f"
done
run_np 1 preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/b1" --tokenizer "$TMP/tok"
expect_ok
expect_grep out "vocabulary 512\)"
run_np 3 preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/b3" --tokenizer "$TMP/tok"
expect_ok
same_dataset "$TMP/b1" "$TMP/b3"
run_np 1 info --data "$TMP/b3" --vocab-size 512
expect_ok
tokens=$(sed -n 's/^ *tokens *\([0-9]*\).*/\1/p' "$TMP/out")
# byte-level for comparison: every byte is a token
run_np 1 preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/bytes"
expect_ok
run_np 1 info --data "$TMP/bytes"
expect_ok
byte_tokens=$(sed -n 's/^ *tokens *\([0-9]*\).*/\1/p' "$TMP/out")
echo "BPE (512): $tokens tokens; byte-level: $byte_tokens tokens"
# every document ends with the end-of-document token's id from vocab.json
find_python
if [ -n "$PY" ]; then
    "$PY" - "$TMP/tok/vocab.json" "$TMP/b3" <<'PYEOF' || fail "documents do not end with <|endoftext|>"
import json, struct, sys
import numpy
eod = json.load(open(sys.argv[1], encoding="utf-8"))["<|endoftext|>"]
idx = open(sys.argv[2] + ".idx", "rb").read()
seqs, docs = struct.unpack("<QQ", idx[18:34])
lengths = numpy.frombuffer(idx, numpy.int32, seqs, 34)
tokens = numpy.fromfile(sys.argv[2] + ".bin", numpy.uint16)
ends = numpy.cumsum(lengths) - 1
assert (tokens[ends] == eod).all() and (tokens == eod).sum() == seqs, "eod %d" % eod
print("every document ends with <|endoftext|> = %d" % eod)
PYEOF
fi
[ $((tokens * 2)) -lt "$byte_tokens" ] || fail "BPE does not halve the token count ($tokens vs $byte_tokens)"
echo ok
