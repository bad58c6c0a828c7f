#!/bin/sh
# A colossal-infer job killed with SIGKILL in the middle and rerun answers
# every id exactly once, with the results of an uninterrupted run; a line
# cut off by the kill is removed and redone. Job-array shards split the
# file and their outputs together are the whole job.
set -e
. "$top_srcdir/tests/apps/infer_lib.sh"
pretrain_tiny

python3 - "$TMP/req.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(240):
        f.write(json.dumps({"id": "r%03d" % i, "prompt": "Story %d: once" % i, "max_tokens": 24,
                            "temperature": 0.8, "seed": i, "ignore_eos": True}) + "\n")
PY

run_infer 2 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/full.jsonl" --infer.max_batch 4
expect_ok
[ "$(wc -l <"$TMP/full.jsonl")" -eq 240 ] || fail "uninterrupted run: expected 240 lines"

# The same job, killed once some lines are out (a state, not a time).
echo "+ colossal-infer (2 ranks), killed with SIGKILL after >= 20 results"
$MPIEXEC -n 2 --oversubscribe "$INFER_BIN" --model.path "$TMP/run/checkpoints" --infer.input "$TMP/req.jsonl" \
    --infer.output "$TMP/part.jsonl" --infer.max_batch 4 --run.dir "$TMP/infer-run" --infer.progress 0 \
    --log.timestamps false >"$TMP/out" 2>"$TMP/err" &
JOB=$!
while kill -0 "$JOB" 2>/dev/null && [ "$(cat "$TMP/part.jsonl" 2>/dev/null | wc -l)" -lt 20 ]; do sleep 0.05; done
pkill -KILL -f "colossal-infer.*part.jsonl" || true
kill -KILL "$JOB" 2>/dev/null || true
wait "$JOB" 2>/dev/null || true
DONE=$(wc -l <"$TMP/part.jsonl")
echo "killed with $DONE complete lines"
[ "$DONE" -lt 240 ] || fail "the job finished before the kill; make it longer"
# What a writer killed mid-line leaves: half a line.
printf '{"id":"r000","text":"half a li' >>"$TMP/part.jsonl"

run_infer 2 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/part.jsonl" --infer.max_batch 4
expect_ok
expect_grep out "a cut-off last line was removed"
python3 - "$TMP/part.jsonl" <<'PY' || fail "ids not answered exactly once"
import collections, json, sys
ids = [json.loads(l)["id"] for l in open(sys.argv[1])]
c = collections.Counter(ids)
assert len(ids) == 240 and len(c) == 240, (len(ids), [k for k, v in c.items() if v > 1][:5])
PY
same_results "$TMP/full.jsonl" "$TMP/part.jsonl" >&2 || fail "the resumed job's results differ from the uninterrupted run's"

# A finished job reruns as a no-op.
run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/part.jsonl"
expect_ok
expect_grep out "0/0 requests"
[ "$(wc -l <"$TMP/part.jsonl")" -eq 240 ] || fail "a rerun of a finished job added lines"

# Job-array shards (SLURM_ARRAY_TASK_ID as sbatch --array sets it, and infer.shard).
for i in 0 1 2; do
    SLURM_ARRAY_TASK_ID=$i SLURM_ARRAY_TASK_COUNT=3 SLURM_ARRAY_TASK_MIN=0 \
        run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/shard-{shard}.jsonl" --infer.max_batch 8
    expect_ok
    [ -s "$TMP/shard-$i-of-3.jsonl" ] || fail "task $i wrote no shard-$i-of-3.jsonl"
done
cat "$TMP"/shard-*-of-3.jsonl >"$TMP/shards.jsonl"
same_results "$TMP/full.jsonl" "$TMP/shards.jsonl" >&2 || fail "the shards together differ from the whole job"
run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/x.jsonl" --infer.shard 3/3
expect_fail
expect_grep err "infer.shard='3/3'"
echo "PASS"
