#!/bin/sh
# Pipeline parallelism in colossal-pretrain reproduces the single-rank run:
# the same global batch of 8 sequences as 4 microbatches of 2 on 1 rank and
# through pp=2 (1f1b and gpipe), pp=4 (1f1b), pp=2 x dp=2 and pp=2 x tp=2
# gives the same train and
# validation loss and gradient norm at every step within 1e-5 relative. A
# checkpoint written at pp=2 resumes at pp=1 and one written at pp=1 at
# pp=2 within 1e-5 of the uninterrupted runs; at pp=2 on pp=2, bitwise.
# What the executor does not run is refused before anything starts.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

PP="--model.n_layers 4 --train.micro_batch 2 --train.grad_accum 4 --checkpoint.every 6 --eval.batches 2"
STEPS="--train.steps 12 --eval.interval 6 --log.interval 6"
# shellcheck disable=SC2086
run_np 1 $TINY $PP $STEPS --run.dir "$TMP/a"
expect_ok
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --run.dir "$TMP/b"
expect_ok
expect_grep out "^pipeline: 1f1b over pp 2, 4 microbatches a step \(train.grad_accum\), bubble 20.0% by the schedule; stage 0 holds layers \[0, 2\)"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule gpipe --run.dir "$TMP/c" --pp.trace "$TMP/c.json"
expect_ok
expect_grep out "^pipeline trace: $TMP/c.json \(the last step\): bubble [0-9.]+% measured, 20.0% by the schedule"
# the measured timeline: one forward and one backward per microbatch and stage, in Chrome's format
python3 - "$TMP/c.json" <<'PY' || fail "the pipeline trace is not the last step's 16 compute actions"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
names = sorted((e["tid"], e["name"]) for e in ev)
want = sorted((r, f"{k}{m}") for r in range(2) for k in "FB" for m in range(4))
assert names == want, names
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in ev)
PY
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 4 --run.dir "$TMP/d"
expect_ok
# 3D on 4 ranks: pp=2 x dp=2 (each replica 2 microbatches of 2) and pp=2 x tp=2
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 2 --train.grad_accum 2 --run.dir "$TMP/f"
expect_ok
expect_grep out "tp=1 pp=2 dp=2"
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 2 --mesh.tp 2 --run.dir "$TMP/g"
expect_ok
expect_grep out "tp=2 pp=2 dp=1"
for run in b c d f g; do
    compare train loss $run 12
    compare train grad_norm $run 12
    compare eval val_loss $run 2
done
field train loss "$TMP/a/metrics.jsonl" | awk 'NR==1{f=$2} END{exit !($2 < 0.9*f)}' || fail "the loss did not fall"

# Resume across layouts: step 6's checkpoint of the pp=1 run continued at
# pp=2, and the pp=2 run's at pp=1 (global tensors: any stage split reads
# them), each within 1e-5 of the uninterrupted run of that layout; on the
# layout that wrote it, bitwise.
cp "$TMP/a/checkpoints/step-00000006.h5" "$TMP/a6.h5"
cp "$TMP/b/checkpoints/step-00000006.h5" "$TMP/b6.h5"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --run.dir "$TMP/a-x" --resume "$TMP/a6.h5"
expect_ok
close_losses "$TMP/b/metrics.jsonl" "$TMP/a-x/metrics.jsonl" 6 1e-5 "pp=1's checkpoint resumed at pp=2"
# shellcheck disable=SC2086
run_np 1 $TINY $PP $STEPS --run.dir "$TMP/b-x" --resume "$TMP/b6.h5"
expect_ok
close_losses "$TMP/a/metrics.jsonl" "$TMP/b-x/metrics.jsonl" 6 1e-5 "pp=2's checkpoint resumed at pp=1"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --run.dir "$TMP/b-y" --resume "$TMP/b6.h5"
expect_ok
close_losses "$TMP/b/metrics.jsonl" "$TMP/b-y/metrics.jsonl" 6 0 "pp=2's checkpoint resumed at pp=2"

# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule interleaved --run.dir "$TMP/e"
expect_rc 2
expect_grep err "pp.schedule=interleaved: the pipeline executor runs gpipe and 1f1b"
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 2 --zero.stage 1 --run.dir "$TMP/e"
expect_rc 2
expect_grep err "mesh.pp=2 composes with dp and tp at ZeRO stage 0 for now: zero.stage=1"
echo "PASS"
