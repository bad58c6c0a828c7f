#!/bin/sh
# Pipeline parallelism in colossal-pretrain reproduces the single-rank run:
# the same global batch of 8 sequences as 4 microbatches of 2 on 1 rank and
# through pp=2 (1f1b, gpipe, interleaved with 2 chunks per rank, zb-h1, zb-v, an uneven
# pp.layers split, one activation slot so backwards recompute), pp=4
# (1f1b), pp=2 x dp=2 (ZeRO 0 and 1) and pp=2 x tp=2 gives the same train
# and validation loss and gradient norm at every step within 1e-5 relative.
# A checkpoint written at pp=4 resumes bitwise at pp=4 and within 1e-5 at
# pp=1 and at pp=2 x tp=2; one written at pp=1 resumes at pp=2, one of
# pp=2 x dp=2 ZeRO-1 at pp=1, one of zb-v at pp=2 1f1b; the pp=4 checkpoint exports to Hugging Face.
# What the executor does not run is refused before anything starts.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

PP="--model.n_layers 4 --train.micro_batch 2 --train.grad_accum 4 --checkpoint.every 6 --eval.batches 2
  --mesh.watchdog_timeout 60"
STEPS="--train.steps 12 --eval.interval 6 --log.interval 6"
# check_trace FILE KINDS CHUNKS: a 2-stage trace of 4 microbatches holds one
# event of each compute kind (F, B, W) per microbatch, chunk and stage
check_trace() {
    python3 - "$1" "$2" "$3" <<'PY' || fail "$1 is not 12 steps' compute actions ($2 x 4 microbatches x $3 chunks x 2 stages) with the statistics"
import json, sys
trace = json.load(open(sys.argv[1]))
ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
kinds, chunks = sys.argv[2], int(sys.argv[3])
names = sorted((e["tid"], e["name"]) for e in ev)
want = sorted((r, f"{k}{m}" + (f".{c}" if chunks > 1 else "")) for r in range(2) for k in kinds for m in range(4)
              for c in range(chunks) for step in range(12))
assert names == want, names
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in ev)
# the steps follow one another on each rank
for r in range(2):
    mine = sorted((e for e in ev if e["tid"] == r), key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(mine, mine[1:]))
other = trace["otherData"]
assert other["steps"] == 11 and other["transfers"] >= 11, other
assert other["bubble_measured_min"] <= other["bubble_measured"] <= other["bubble_measured_max"], other
assert 0 <= other["bubble_replay"] < 1 and other["forward_s_rank1"] > 0 and other["backward_s_rank0"] > 0, other
assert 0 <= other["waited_cpu"] <= 1 and 0 <= other["bubble_replay_cpu"] < 1, other
PY
}
# shellcheck disable=SC2086
run_np 1 $TINY $PP $STEPS --run.dir "$TMP/a"
expect_ok
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --run.dir "$TMP/b"
expect_ok
expect_grep out "^pipeline: 1f1b over pp 2 x 1 chunk, 4 microbatches a step \(train.grad_accum\), bubble 20.0% by the schedule; rank 0 holds layers \[0, 2\); activation slots 2 of the 2 in flight; boundaries over node-shared memory$"
# the boundaries as MPI messages instead of node-shared memory: the same numbers
export CAI_PP_HOST_TRANSPORT=mpi
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --run.dir "$TMP/m"
unset CAI_PP_HOST_TRANSPORT
expect_ok
expect_grep out "^pipeline: 1f1b .*; boundaries over MPI messages$"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule gpipe --run.dir "$TMP/c" --pp.trace "$TMP/c.json"
expect_ok
expect_grep out "^pipeline trace: $TMP/c.json \(the last 12 steps\): bubble [0-9.]+% measured \(median of 11 steps after the first\), 20.0% by the schedule \([0-9.]+% at the measured compute times, [0-9.]+% with the measured transfers of [0-9]+ us; [0-9.]+% replayed at each action's time\)$"
# the measured timeline: one forward and one backward per microbatch and stage, in Chrome's format
check_trace "$TMP/c.json" FB 1
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule interleaved --run.dir "$TMP/h" --pp.trace "$TMP/h.json"
expect_ok
expect_grep out "^pipeline: interleaved over pp 2 x 2 chunks, .* bubble 11.1% by the schedule; rank 0 holds layers \[0, 1\) \[2, 3\); activation slots 5 of the 5 in flight; boundaries over node-shared memory$"
check_trace "$TMP/h.json" FB 2
# zero bubble: each backward an input pass (B) and a later weight pass (W)
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule zb-h1 --run.dir "$TMP/z" --pp.trace "$TMP/z.json"
expect_ok
expect_grep out "^pipeline: zb-h1 over pp 2 x 1 chunk, 4 microbatches a step \(train.grad_accum\), bubble 7.7% by the schedule; rank 0 holds layers \[0, 2\); activation slots 2 of the 2 in flight; boundaries over node-shared memory$"
check_trace "$TMP/z.json" FBW 1
# zb-v: two chunks per rank in a V (rank 0 holds the first and the last layer)
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule zb-v --run.dir "$TMP/v" --pp.trace "$TMP/v.json"
expect_ok
expect_grep out "^pipeline: zb-v over pp 2 x 2 chunks, .* bubble 4.0% by the schedule; rank 0 holds layers \[0, 1\) \[3, 4\); activation slots [0-9]+ of the [0-9]+ in flight; boundaries over node-shared memory$"
check_trace "$TMP/v.json" FBW 2
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.layers 1,3 --pp.act_slots 1 --run.dir "$TMP/k"
expect_ok
expect_grep out "rank 0 holds layers \[0, 1\); activation slots 1 of the 2 in flight \(the others recompute their forward\); boundaries over node-shared memory$"
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 4 --run.dir "$TMP/d"
expect_ok
# 3D on 4 ranks: pp=2 x dp=2 (each replica 2 microbatches of 2), with ZeRO-1, and pp=2 x tp=2
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 2 --train.grad_accum 2 --run.dir "$TMP/f"
expect_ok
expect_grep out "tp=1 pp=2 dp=2"
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 2 --train.grad_accum 2 --zero.stage 1 --run.dir "$TMP/j"
expect_ok
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 2 --mesh.tp 2 --run.dir "$TMP/g"
expect_ok
expect_grep out "tp=2 pp=2 dp=1"
for run in b m c h z v k d f j g; do
    compare train loss $run 12
    compare train grad_norm $run 12
    compare eval val_loss $run 2
done
field train loss "$TMP/a/metrics.jsonl" | awk 'NR==1{f=$2} END{exit !($2 < 0.9*f)}' || fail "the loss did not fall"

# Resume across layouts: step 6's checkpoint of the pp=4 run continued at
# pp=4 (bitwise), pp=1 and pp=2 x tp=2; the pp=1 run's at pp=2 and the
# ZeRO-1 pp=2 x dp=2 run's at pp=1 (global tensors: any stage split reads
# them), each within 1e-5 of the uninterrupted run of that layout.
cp "$TMP/a/checkpoints/step-00000006.h5" "$TMP/a6.h5"
cp "$TMP/d/checkpoints/step-00000006.h5" "$TMP/d6.h5"
cp "$TMP/j/checkpoints/step-00000006.h5" "$TMP/j6.h5"
cp "$TMP/v/checkpoints/step-00000006.h5" "$TMP/v6.h5"
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 4 --run.dir "$TMP/d-y" --resume "$TMP/d6.h5"
expect_ok
close_losses "$TMP/d/metrics.jsonl" "$TMP/d-y/metrics.jsonl" 6 0 "pp=4's checkpoint resumed at pp=4"
# shellcheck disable=SC2086
run_np 1 $TINY $PP $STEPS --run.dir "$TMP/d-x" --resume "$TMP/d6.h5"
expect_ok
close_losses "$TMP/a/metrics.jsonl" "$TMP/d-x/metrics.jsonl" 6 1e-5 "pp=4's checkpoint resumed at pp=1"
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 2 --mesh.tp 2 --run.dir "$TMP/d-t" --resume "$TMP/d6.h5"
expect_ok
close_losses "$TMP/g/metrics.jsonl" "$TMP/d-t/metrics.jsonl" 6 1e-5 "pp=4's checkpoint resumed at pp=2 x tp=2"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --run.dir "$TMP/a-x" --resume "$TMP/a6.h5"
expect_ok
close_losses "$TMP/b/metrics.jsonl" "$TMP/a-x/metrics.jsonl" 6 1e-5 "pp=1's checkpoint resumed at pp=2"
# shellcheck disable=SC2086
run_np 1 $TINY $PP $STEPS --run.dir "$TMP/j-x" --resume "$TMP/j6.h5"
expect_ok
close_losses "$TMP/a/metrics.jsonl" "$TMP/j-x/metrics.jsonl" 6 1e-5 "pp=2 x dp=2 ZeRO-1's checkpoint resumed at pp=1"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --run.dir "$TMP/v-x" --resume "$TMP/v6.h5"
expect_ok
close_losses "$TMP/b/metrics.jsonl" "$TMP/v-x/metrics.jsonl" 6 1e-5 "zb-v's checkpoint (chunks in a V) resumed at pp=2 1f1b"
echo "+ colossal-ckpt export --input $TMP/d6.h5"
$MPIEXEC -n 1 "$top_builddir/apps/colossal-ckpt" export --input "$TMP/d6.h5" --output "$TMP/hf" >"$TMP/out" 2>"$TMP/err" ||
    fail "exporting the pp=4 checkpoint failed"
expect_grep out "^export: .* GPT2LMHeadModel"
[ -s "$TMP/hf/model.safetensors" ] && [ -s "$TMP/hf/config.json" ] || fail "the export wrote no model"

# Refused before anything starts, naming what would run
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule zb-v --pp.virtual 3 --run.dir "$TMP/e"
expect_rc 2
expect_grep err "pp.virtual=3: pp.schedule=zb-v runs two model chunks per rank, in a V"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule zb-h1 --pp.act_slots 1 --run.dir "$TMP/e"
expect_rc 2
expect_grep err "pp.act_slots=1: zb-h1 keeps every forward's activations until its weight pass"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule zb-h1 --model.activation_checkpointing true --run.dir "$TMP/e"
expect_rc 2
expect_grep err "model.activation_checkpointing=true: zb-h1's weight passes read every layer's saved activations"
# shellcheck disable=SC2086
run_np 4 $TINY $PP $STEPS --mesh.pp 2 --zero.stage 2 --run.dir "$TMP/e"
expect_rc 2
expect_grep err "mesh.pp=2 composes with dp and tp at ZeRO stage 0 or 1 without offload and sp_mode: zero.stage=2"
# shellcheck disable=SC2086
run_np 3 $TINY $PP $STEPS --mesh.pp 3 --run.dir "$TMP/e"
expect_rc 2
expect_grep err "model.n_layers=4 does not divide over mesh.pp=3 x pp.virtual=1 = 3 virtual stages \(3 or 6 layers would"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.layers 1,2 --run.dir "$TMP/e"
expect_rc 2
expect_grep err "pp.layers=\"1,2\" gives 2 virtual stages of 3 layers in all; mesh.pp=2 x pp.virtual=1 needs 2 counts summing to model.n_layers=4"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.schedule interleaved --train.grad_accum 3 --run.dir "$TMP/e"
expect_rc 2
expect_grep err "microbatches"
# shellcheck disable=SC2086
run_np 2 $TINY $PP $STEPS --mesh.pp 2 --pp.virtual 2 --run.dir "$TMP/e"
expect_rc 2
expect_grep err "pp.virtual=2: pp.schedule=1f1b runs one model chunk per rank"
echo "PASS"
