#!/bin/sh
# Bad input fails before training with a message naming what is wrong:
# unknown keys (command line and YAML, with file:line), impossible model
# shapes, layouts this app cannot run, missing data, a world size other
# than Slurm's task count. --help lists the keys.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

# Under the sanitizers (make check-sanitize: CAI_SANITIZE=1) the refusals
# that do not depend on the rank count run on 1 rank (a 2-rank ASan launch
# costs half again as much, and mpiexec waits 2 s after it: Makefile.am,
# odls_base_sigkill_timeout); the plain suite runs them on 2 ranks, and the
# layout refusals (pp 2, tp 3, a world size other than Slurm's) keep a refusal
# on several ranks under the sanitizers.
NR=2
[ "${CAI_SANITIZE:-0}" != 1 ] || NR=1

run_np "$NR" --model.n_layer 2 --run.dir "$TMP/x"
expect_rc 2
expect_grep err 'model\.n_layer' "the unknown key is not named"
expect_grep err 'model\.n_layers' "no suggestion of the known key"
expect_no_grep out '^step'

printf 'model:\n  n_layers: 2\noptim:\n  lrr: 1e-3\n' >"$TMP/bad.yaml"
run_np 1 --config "$TMP/bad.yaml" --run.dir "$TMP/x"
expect_rc 2
expect_grep err 'bad\.yaml:4' "the YAML error does not give file:line"
expect_grep err 'optim\.lrr'

run_np 1 --model.n_heads 3 --model.d_model 64 --run.dir "$TMP/x" --data.corpus_docs 200
expect_rc 2
expect_grep err 'n_heads=3'

run_np 2 --mesh.pp 2 --pp.schedule zb-v --pp.act_slots 2 --run.dir "$TMP/x"
expect_rc 2
expect_grep err 'pp\.act_slots=2: zb-v keeps every forward.s activations until its weight pass'

run_np 3 --mesh.tp 3 --model.n_heads 4 --model.d_model 64 --run.dir "$TMP/x"
expect_rc 2
expect_grep err 'tp'
expect_no_grep out '^step '

run_np 1 --mesh.dp 3 --run.dir "$TMP/x"
expect_rc 2
expect_grep err 'world|dp=3'

# Found by the optimizer's own check, but before any data or allocation.
run_np "$NR" --optim.decay_steps 8 --optim.warmup_steps 20 --run.dir "$TMP/opt"
expect_rc 2
expect_grep err 'optim\.decay_steps=8 must be >= optim\.warmup_steps=20'
expect_no_grep out 'memory plan|^data:'
[ ! -e "$TMP/opt/data" ] || fail "the optimizer's config error came after the data preparation"

run_np 1 --data.path "$TMP/nothing/here" --run.dir "$TMP/x"
expect_rc 4 # a file-system error (docs/run.md)
expect_grep err "$TMP/nothing/here"

# Ranks started with different arguments: refused before any collective
# could pair up wrongly, naming the rank and the first differing key.
echo "+ $MPIEXEC -n 1 colossal-pretrain --optim.lr 1e-3 : -n 1 colossal-pretrain --optim.lr 2e-3"
RC=0
$MPIEXEC -n 1 "$PRETRAIN_BIN" --optim.lr 1e-3 --run.dir "$TMP/mixed" : \
    -n 1 "$PRETRAIN_BIN" --optim.lr 2e-3 --run.dir "$TMP/mixed" >"$TMP/out" 2>"$TMP/err" || RC=$?
expect_rc 2
expect_grep err "rank 1's effective config differs from rank 0's .*lr: 0.002.* here and .*lr: 0.001"
expect_no_grep out '^step'

# Under Slurm the world must have SLURM_NTASKS ranks (srun with the wrong
# --mpi plugin starts every task as a world of its own).
export SLURM_NTASKS=3
run_np 2 --run.dir "$TMP/slurm"
unset SLURM_NTASKS
expect_rc 2
expect_grep err 'SLURM_NTASKS=3 but MPI started 2 ranks.*--mpi=pmix'
expect_no_grep out '^step'
[ ! -e "$TMP/slurm/config.yaml" ] || fail "the Slurm size check came after the run directory was written"

run_np 1 --help
expect_ok
expect_grep out 'data\.corpus_docs'
expect_grep out 'optim\.schedule'
echo "PASS"
