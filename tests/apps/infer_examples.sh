#!/bin/sh
# examples/infer-tiny.sh after a short examples/pretrain-tiny.yaml run:
# generation (native and OpenAI lines), held-out arithmetic as multiple
# choice, and perplexity, on the embedded corpus with nothing downloaded.
set -e
. "$top_srcdir/tests/apps/infer_lib.sh"
cd "$TMP"
echo "+ colossal-pretrain --config examples/pretrain-tiny.yaml (20 steps)"
$MPIEXEC -n 2 --oversubscribe "$PRETRAIN_BIN" --config "$top_srcdir/examples/pretrain-tiny.yaml" --train.steps 20 \
    --optim.warmup_steps 2 --data.corpus_docs 600 --eval.interval 0 --generate.tokens 0 --log.timestamps false \
    --checkpoint.every 20 >"$TMP/out" 2>"$TMP/err" || fail "pretrain-tiny"
echo "+ examples/infer-tiny.sh"
COLOSSAL_BIN="$top_builddir/apps" MPIEXEC="$MPIEXEC --oversubscribe" sh "$top_srcdir/examples/infer-tiny.sh" \
    >"$TMP/out" 2>"$TMP/err" || fail "examples/infer-tiny.sh"
o=runs/pretrain-tiny/infer
[ "$(wc -l <$o/answers.jsonl)" = 4 ] || fail "answers.jsonl: expected 4 lines"
[ "$(wc -l <$o/arithmetic-scores.jsonl)" = 64 ] || fail "arithmetic-scores.jsonl: expected 64 items"
expect_grep out "^choice: accuracy [0-9.]*, length-normalised [0-9.]* over 64 items"
expect_grep out "^perplexity: [0-9.]* over [0-9]* tokens of 200 documents"
echo "PASS"
