#!/bin/bash
# colossal-infer --infer.score: perplexity of held-out text (plain lines
# and JSONL give the same numbers, a Megatron dataset of the same documents
# scores their end-of-document tokens too; dp = 2 gives the same
# numbers; a rerun skips what is done and reports the same summary), and
# multiple-choice accuracy by log-likelihood, where the trained model must
# prefer the corpus' own kind of text to noise.
set -e
. "$top_srcdir/tests/apps/infer_lib.sh"
pretrain_tiny
DATA_BIN="$top_builddir/apps/colossal-data"

# Held-out text: the embedded corpus under another seed.
$MPIEXEC -n 1 "$DATA_BIN" corpus --out "$TMP/held.jsonl" --docs 40 --seed 99 >/dev/null 2>&1 || fail "colossal-data corpus"
python3 - "$TMP/held.jsonl" "$TMP/held.txt" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for l in open(sys.argv[1]):
        f.write(json.loads(l)["text"].replace("\n", " ") + "\n")
PY

ppl() { sed -n 's/^perplexity: \([0-9.]*\) over \([0-9]*\) tokens of \([0-9]*\) documents.*/\1 \2 \3/p' "$TMP/out"; }
run_infer 1 --infer.score perplexity --infer.input "$TMP/held.txt" --infer.output "$TMP/ppl1.jsonl"
expect_ok
P1=$(ppl)
echo "text: $P1"
set -- $P1
python3 -c "import sys; p=float(sys.argv[1]); assert 1 < p < 300, p" "$1" || fail "perplexity $1 out of range"
[ "$3" = 40 ] || fail "expected 40 documents, got $3"

run_infer 2 --infer.score perplexity --infer.input "$TMP/held.txt" --infer.output "$TMP/ppl2.jsonl"
expect_ok
[ "$(ppl)" = "$P1" ] || fail "dp=2 perplexity '$(ppl)' differs from '$P1'"

run_infer 1 --infer.score perplexity --infer.input "$TMP/held.txt" --infer.output "$TMP/ppl1.jsonl"
expect_ok
[ "$(ppl)" = "$P1" ] || fail "a rerun's summary '$(ppl)' differs from '$P1'"
[ "$(wc -l <"$TMP/ppl1.jsonl")" = 40 ] || fail "a rerun added lines"

# JSONL "text" lines: the same documents, the same numbers.
python3 - "$TMP/held.txt" "$TMP/held2.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for i, l in enumerate(open(sys.argv[1])):
        f.write(json.dumps({"id": "doc-%d" % i, "text": l.rstrip("\n")}) + "\n")
PY
run_infer 1 --infer.score perplexity --infer.input "$TMP/held2.jsonl" --infer.output "$TMP/ppl3.jsonl"
expect_ok
[ "$(ppl)" = "$P1" ] || fail "JSONL input's perplexity '$(ppl)' differs from '$P1'"

# A Megatron dataset of the same documents (each with its end-of-document
# token, so one more token a document is scored).
$MPIEXEC -n 1 "$DATA_BIN" preprocess --input "$TMP/held2.jsonl" --output "$TMP/held" --tokenizer "$TMP/run/tokenizer" \
    --progress 0 >/dev/null 2>&1 || fail "colossal-data preprocess"
run_infer 1 --infer.score perplexity --infer.input "$TMP/held.bin" --infer.output "$TMP/ppl4.jsonl"
expect_ok
set -- $(ppl)
echo "megatron: $*"
[ "$3" = 40 ] && [ "$2" = $(($(echo "$P1" | cut -d' ' -f2) + 40)) ] || fail "Megatron dataset: '$*' (expected 40 more tokens than '$P1')"

# Multiple choice: corpus-like continuations against noise.
python3 - "$TMP/mc.jsonl" <<'PY'
import json, sys
ctx = ["Once upon a time, there was a", "Q: What is 3 + 4? A:", "One sunny morning, Tom went to",
       "The little cat was", "Mia had 5 apples. She"]
good = [" little girl named Mia.", " 7", " the park with his friend.", " very happy.", " gave 2 to Tom."]
noise = [" qzx vvk jjw pfft.", " xq", " zzk wvq ppf jjx mmq.", " kqz vvx.", " jjq zzv kkx."]
with open(sys.argv[1], "w") as f:
    for i, (c, g, n) in enumerate(zip(ctx, good, noise)):
        ch = [g, n] if i % 2 == 0 else [n, g]
        f.write(json.dumps({"id": "mc%d" % i, "context": c, "choices": ch, "answer": 0 if i % 2 == 0 else 1}) + "\n")
    f.write(json.dumps({"id": "noanswer", "context": "The dog", "choices": [" ran.", " xq."]}) + "\n")
PY
run_infer 1 --infer.score choice --infer.input "$TMP/mc.jsonl" --infer.output "$TMP/mc-out.jsonl"
expect_ok
expect_grep out "choice: accuracy 1.0000, length-normalised 1.0000 over 5 items with an answer \(6 items\)"
python3 - "$TMP/mc-out.jsonl" <<'PY' || fail "choice lines"
import json, sys
rows = {json.loads(l)["id"]: json.loads(l) for l in open(sys.argv[1])}
assert len(rows) == 6
for k, o in rows.items():
    assert len(o["loglikelihoods"]) == 2 and all(v < 0 for v in o["loglikelihoods"]), o
    assert ("answer" in o) == (k != "noanswer")
PY
printf '{"id": "bad", "context": "x", "choices": ["only one"]}\n' >"$TMP/mc-bad.jsonl"
run_infer 1 --infer.score choice --infer.input "$TMP/mc-bad.jsonl" --infer.output "$TMP/mc-bad-out.jsonl"
expect_fail
expect_grep err "mc-bad.jsonl:1"
echo "PASS"
