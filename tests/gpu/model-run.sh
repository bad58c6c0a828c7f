#!/bin/bash
# Whole-model GPU tests of issue #8 (docs/cuda.md "Whole-model tests"), for a
# machine with 4 GPUs (works with fewer: parts needing more GPUs are skipped):
#
#   tests/gpu/model-run.sh OUTDIR        (from the repository root)
#
#   build   configure against the libraries unpacked in .device/root (as
#           tests/gpu/device-run.sh) into build-gpu/, make the driver, the
#           test and colossal-pretrain
#   a       whole-model parity against PyTorch on the GPU: parity_driver on
#           cuda + tests/gpu/model_parity.py, GPT-2 and Llama (GQA), fp32 (tiny
#           and larger) and bf16 (larger: head_dim 64, T 128)
#   b       tests/gpu/test_gpu_train on 1 and 2 GPUs: ZeRO stages 0-3, offload,
#           bf16; no device allocation after step 1, loss falls
#   c       data parallel on GPUs: colossal-pretrain on 1 GPU vs 2 and 4 GPUs
#           with the same global batch, zero.stage 0/1/2/3/3+offload, f32 and
#           bf16: per-step losses compared
#   d       GPT-2 124M, bf16, one GPU, the embedded corpus, 200 steps: loss
#           at start and end, tokens/s
#
# Parts run in the order a, b, d, c, each under timeout, going on when one fails; the
# whole run is held under BUDGET seconds (default 450) by shortening or
# skipping what is left. Logs in OUTDIR (build.log, parity.log, train.log,
# dp.log, gpt2.log, summary.txt); the summary is printed at the end.
# Exit status: 0 when every part that ran passed.
#
# Environment: PARTS (default "a b c d": which parts run), BUILD (build
# directory, default build-gpu), SKIP_BUILD=1 (use BUILD as it is), BUDGET,
# NGPU (override the GPU count), RUN_DEVICE (part c's run.device, default
# cuda; "cpu" checks the script's own logic on a machine without GPUs).
set -u
out=${1:?usage: tests/gpu/model-run.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
top=$PWD
[ -f "$top/tests/gpu/model-run.sh" ] || { echo "run from the repository root"; exit 2; }
t_start=$(date +%s)
BUDGET=${BUDGET:-450}
tmp=$(mktemp -d /tmp/colossal-model-run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - t_start)); }
# left CAP: seconds this part may take (CAP, or what is left of the budget).
left() {
    l=$((BUDGET - $(elapsed)))
    [ "$l" -gt "$1" ] && l=$1
    echo "$l"
}

dlib=$top/.device/root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$dlib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
unset CAI_CUDA_TF32
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
PY=${PYTHON:-python3}
ngpu=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
PARTS=${PARTS:-a b c d}
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"
echo "GPUs: $ngpu; budget ${BUDGET} s" | tee -a "$out/gpu.txt"

# ------------------------------------------------------------------ build
B=${BUILD:-$top/build-gpu}
case $B in /*) ;; *) B=$top/$B ;; esac
echo "== build ($(elapsed) s)"
[ "${SKIP_BUILD:-0}" = 1 ] || (
    export PKG_CONFIG_PATH=$dlib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$top/.device/root
    mkdir -p "$B" && cd "$B" || exit 1
    if [ ! -f Makefile ]; then
        timeout 200 "$top/configure" -q --without-hdf5 --with-cuda=/usr/local/cuda --with-nccl=/usr || exit 1
    fi
    timeout 300 make -j16 apps/colossal-pretrain tests/parity/parity_driver tests/gpu/test_gpu_train
) >"$out/build.log" 2>&1
rc=$?
if [ $rc -ne 0 ] || [ ! -x "$B/apps/colossal-pretrain" ]; then
    tail -30 "$out/build.log"
    note "build: FAIL (exit $rc, see build.log; parts whose binary is missing are skipped)"
else
    note "build: ok ($(elapsed) s)"
fi
PRETRAIN=$B/apps/colossal-pretrain
DRIVER=$B/tests/parity/parity_driver
TRAIN=$B/tests/gpu/test_gpu_train

# losses NAME: "step loss" per train record.
losses() {
    grep '"kind":"train"' "$tmp/$1/metrics.jsonl" 2>/dev/null |
        sed -n 's/.*"step":\([0-9]*\).*"loss":\([-+0-9.eE]*\).*/\1 \2/p'
}
# ------------------------------------------------------------------ (a) parity
part_a() {
    echo "== (a) whole-model parity with PyTorch on the GPU ($(elapsed) s)"
    if ! want a; then
        :
    elif [ -x "$DRIVER" ]; then
        # family precision size: spread over the GPUs, run concurrently.
        jobs_list="gpt2:fp32:gpu llama:fp32:gpu gpt2:bf16:gpu llama:bf16:gpu gpt2:fp32:tiny llama:fp32:tiny"
        i=0
        lim=$(left 200)
        for j in $jobs_list; do
            IFS=: read -r fam prec size <<<"$j"
            g=$((i % (ngpu > 0 ? ngpu : 1)))
            (
                f=$tmp/$fam-$prec-$size.safetensors
                echo "--- $fam $prec size $size on cuda:$g"
                timeout "$lim" "$DRIVER" "$fam" "$f" --device "cuda:$g" --precision "$prec" --size "$size" &&
                    timeout "$lim" "$PY" tests/gpu/model_parity.py "$f" --device "cuda:$g"
                echo "exit $?"
            ) >"$tmp/parity-$i.log" 2>&1 &
            i=$((i + 1))
        done
        wait
        : >"$out/parity.log"
        i=0
        for j in $jobs_list; do
            cat "$tmp/parity-$i.log" >>"$out/parity.log"
            rc=$(sed -n 's/^exit \([0-9]*\)$/\1/p' "$tmp/parity-$i.log" | tail -1)
            res=$(grep -E "^(gpt2|llama) (fp32|bf16): (max error|PASS|FAILED)" "$tmp/parity-$i.log" | tr '\n' ' ' | cut -c1-260)
            if [ "${rc:-1}" = 0 ]; then note "parity $j: PASS  $res"; else note "parity $j: FAIL (exit ${rc:-?}) $res"; fi
            i=$((i + 1))
        done
    else
        note "parity: SKIPPED (no driver)"
    fi
}

# ------------------------------------------------------------------ (b) no allocation after step 1
part_b() {
    echo "== (b) test_gpu_train ($(elapsed) s)"
    : >"$out/train.log"
    if ! want b; then
        :
    elif [ -x "$TRAIN" ]; then
        for np in 1 2; do
            [ "$np" -le "$ngpu" ] || continue
            lim=$(left 150)
            [ "$lim" -gt 10 ] || { note "test_gpu_train np $np: SKIPPED (time budget)"; continue; }
            echo "--- $np rank(s)" >>"$out/train.log"
            timeout "$lim" "${MPIRUN[@]}" -np "$np" "$TRAIN" >>"$out/train.log" 2>&1
            rc=$?
            res=$(grep -E "^(ok  |FAIL)" "$out/train.log" | tail -7 | cut -c1-4 | sort | uniq -c | tr -s ' \n' ' ')
            if [ $rc = 0 ]; then note "test_gpu_train np $np: PASS ($res)"; else note "test_gpu_train np $np: FAIL (exit $rc; $res)"; fi
        done
    else
        note "test_gpu_train: SKIPPED (not built)"
    fi
}

# ------------------------------------------------------------------ (c) data parallel = 1 GPU
part_c() {
    echo "== (c) data parallel on GPUs vs 1 GPU ($(elapsed) s)"
    # The tiny model of tests/apps/pretrain_lib.sh on the GPU, global batch 16.
    TINY="--model.n_layers 2 --model.d_model 64 --model.n_heads 4 --train.seq_len 64 --train.micro_batch 4
      --optim.lr 2e-3 --optim.warmup_steps 2 --data.corpus_docs 1500 --data.corpus_vocab 0 --generate.tokens 0
      --run.peak_tflops 1 --log.timestamps false --run.device ${RUN_DEVICE:-cuda} --train.steps 10 --eval.interval 0
      --log.interval 5 --zero.bucket_mb 0.05"
    : >"$out/dp.log"
    # pt NAME NP GPUS ARGS...: one colossal-pretrain run into $tmp/NAME (CUDA_VISIBLE_DEVICES=GPUS).
    pt() {
        name=$1 np=$2 gpus=$3
        shift 3
        lim=$(left 90)
        if [ "$lim" -le 10 ]; then echo "skip" >"$tmp/$name.rc"; return; fi
        # shellcheck disable=SC2086
        CUDA_VISIBLE_DEVICES=$gpus timeout "$lim" "${MPIRUN[@]}" -np "$np" "$PRETRAIN" $TINY --run.dir "$tmp/$name" "$@" \
            >"$tmp/$name.out" 2>&1
        echo $? >"$tmp/$name.rc"
}
if ! want c; then
    :
elif [ -x "$PRETRAIN" ]; then
    all=$(seq -s, 0 $((ngpu - 1)))
    # 1-GPU references (grad_accum 4), one per precision, concurrently.
    pt ref-f32 1 0 --precision f32 --train.grad_accum 4 &
    pt ref-bf16 1 "$((ngpu > 1 ? 1 : 0))" --precision bf16 --train.grad_accum 4 &
    wait
    configs="0: 1: 2: 3: 3:offload"
    for prec in f32 bf16; do
        for np in 2 4; do
            [ "$np" -le "$ngpu" ] || continue
            accum=$((4 / np))
            set --
            for c in $configs; do
                st=${c%%:*} off=false
                [ "${c#*:}" = offload ] && off=true
                name=$prec-np$np-s$st-$off
                if [ "$np" = 2 ] && [ "$ngpu" -ge 4 ]; then
                    # two 2-GPU runs at a time on disjoint GPUs
                    if [ $# = 0 ]; then gpus=0,1; set -- x; else gpus=2,3; set --; fi
                    pt "$name" 2 "$gpus" --precision "$prec" --train.grad_accum "$accum" --zero.stage "$st" \
                        --zero.offload "$off" &
                    [ "$gpus" = 2,3 ] && wait
                else
                    pt "$name" "$np" "$all" --precision "$prec" --train.grad_accum "$accum" --zero.stage "$st" \
                        --zero.offload "$off"
                fi
            done
            wait
        done
    done
    {
        printf "%-6s %-4s %-6s %-8s %-6s %-14s %s\n" prec GPUs stage offload steps "max rel diff" result
        for prec in f32 bf16; do
            tol=1e-5
            [ "$prec" = bf16 ] && tol=1e-2
            losses ref-$prec >"$tmp/ref-$prec.loss"
            nref=$(wc -l <"$tmp/ref-$prec.loss")
            if [ "$nref" -lt 10 ] || ! awk 'NR==1{f=$2} END{exit !($2 < 0.9*f)}' "$tmp/ref-$prec.loss"; then
                printf "%-6s %-4s %-6s %-8s %-6s %-14s %s\n" "$prec" 1 0 false "$nref" - \
                    "FAIL: reference run (exit $(cat "$tmp/ref-$prec.rc" 2>/dev/null)) incomplete or loss not falling"
                continue
            fi
            for np in 2 4; do
                for c in $configs; do
                    st=${c%%:*} off=false
                    [ "${c#*:}" = offload ] && off=true
                    name=$prec-np$np-s$st-$off
                    [ -f "$tmp/$name.rc" ] || continue
                    losses "$name" >"$tmp/$name.loss"
                    n=$(wc -l <"$tmp/$name.loss")
                    res=$(paste "$tmp/ref-$prec.loss" "$tmp/$name.loss" | awk -v tol="$tol" -v n="$nref" '
                        { d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2)
                          if ($1 != $3) bad = 1; if (r > w) w = r; k++ }
                        END { ok = !bad && k == n && w <= tol
                              printf "%-14.3e %s", w, ok ? "ok" : "FAIL (tolerance " tol ")" }')
                    rc=$(cat "$tmp/$name.rc")
                    [ "$rc" = 0 ] || res="${res%% *}      FAIL (exit $rc)"
                    [ "$n" -eq 0 ] && res="-              FAIL (exit $rc)"
                    printf "%-6s %-4s %-6s %-8s %-6s %s\n" "$prec" "$np" "$st" "$off" "$n" "$res"
                done
            done
        done
    } >"$tmp/dp-table.txt"
    for f in "$tmp"/*.out; do
        [ -f "$f" ] || continue
        echo "--- $(basename "$f" .out) (exit $(cat "${f%.out}.rc")):"
        grep -Ev '^\s*$' "$f" | tail -12
    done >>"$out/dp.log"
    echo "--- reference losses (f32, bf16):" >>"$out/dp.log"
    paste "$tmp/ref-f32.loss" "$tmp/ref-bf16.loss" >>"$out/dp.log" 2>/dev/null
    tee -a "$out/dp.log" <"$tmp/dp-table.txt"
    nf=$(grep -c FAIL "$tmp/dp-table.txt")
    nk=$(grep -c ' ok$' "$tmp/dp-table.txt")
    if [ "$nf" = 0 ] && [ "$nk" -gt 0 ]; then note "dp equivalence: PASS ($nk configurations)"
    else note "dp equivalence: FAIL ($nf failed, $nk ok; table in dp.log)"; fi
    sed 's/^/  /' "$tmp/dp-table.txt" >>"$summary"
else
    note "dp equivalence: SKIPPED (colossal-pretrain not built)"
fi
}

# ------------------------------------------------------------------ (d) GPT-2 124M
part_d() {
    echo "== (d) GPT-2 124M bf16 on one GPU ($(elapsed) s)"
    if ! want d; then
        :
    elif [ -x "$PRETRAIN" ]; then
        lim=$(left 200)
        if [ "$lim" -gt 30 ]; then
            CUDA_VISIBLE_DEVICES=0 timeout "$lim" "${MPIRUN[@]}" -np 1 "$PRETRAIN" --model.family gpt2 --model.n_layers 12 \
                --model.d_model 768 --model.n_heads 12 --model.vocab_size 50257 --train.seq_len 1024 \
                --train.micro_batch 8 --train.grad_accum 1 --train.steps 200 --precision bf16 --optim.lr 6e-4 \
                --optim.min_lr 6e-5 --optim.warmup_steps 20 --data.corpus_vocab 0 --eval.interval 0 \
                --generate.tokens 0 --log.interval 20 --log.timestamps false --run.peak_tflops 989 --run.device cuda --run.dir "$tmp/gpt2" \
                >"$out/gpt2.log" 2>&1
            rc=$?
            losses gpt2 >"$tmp/gpt2.loss"
            first=$(head -1 "$tmp/gpt2.loss" | cut -d' ' -f2)
            last=$(tail -1 "$tmp/gpt2.loss" | cut -d' ' -f2)
            n=$(wc -l <"$tmp/gpt2.loss")
            done_line=$(grep '^done:' "$out/gpt2.log" | tail -1)
            # tokens/s of the last logged interval (steady state, no start-up)
            tps=$(grep -E '^step +[0-9]+/' "$out/gpt2.log" | tail -1 | sed -n 's/.*| \([0-9.]*[kM]*\) tok\/s | MFU \([0-9.]*%\).*/\1 tok\/s, MFU \2/p')
            if [ $rc = 0 ] && [ "$n" -ge 2 ] && awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < 0.7*a)}'; then
                note "gpt2-124m bf16: PASS loss $first -> $last over $n steps; last interval $tps; $done_line"
            else
                tail -20 "$out/gpt2.log"
                note "gpt2-124m bf16: FAIL (exit $rc) loss ${first:-?} -> ${last:-?} over $n steps; $tps"
            fi
        else
            note "gpt2-124m bf16: SKIPPED (time budget)"
        fi
    else
        note "gpt2-124m: SKIPPED (colossal-pretrain not built)"
    fi
}

# GPT-2 124M before the DP runs: with the time budget short, the many small
# DP launches are what gets shortened.
for p in a b d c; do part_$p; done

echo
echo "================ summary ($(elapsed) s)"
cat "$summary"
echo "total $(elapsed) s" >>"$summary"
! grep -q FAIL "$summary"
