#!/bin/bash
# Ulysses and ring attention on GPUs (docs/sequence-parallel.md), for a
# machine with 2 or more GPUs and a CUDA build of colossal-pretrain:
#
#   tests/gpu/sp-run.sh OUTDIR        (from the repository root)
#
# colossal-pretrain's tiny GPT-2 and a Llama with GQA (8 heads, 2 kv heads),
# f32 and bf16, 10 steps of a global batch of 8 sequences: 1 GPU against
# mesh.sp=2 in both modes on 2 GPUs, and sp=2 x dp=2 ring on 4 GPUs where
# there are 4. The attention blocks run on the CUDA attention kernels with
# attention_merge between them, K/V blocks travel by NCCL point-to-point
# (ring) and the head exchange by NCCL all-to-all (Ulysses). Per-step train
# losses and gradient norms are compared with the 1-GPU run: f32 within
# 1e-5 relative, bf16 within 1e-2. A table goes to OUTDIR/sp.txt and stdout.
#
# Environment: PRETRAIN (default build-gpu/apps/colossal-pretrain), NGPU
# (override the GPU count), RUN_DEVICE (run.device, default cuda; "cpu"
# checks the script's own logic without GPUs).
set -u
out=${1:?usage: tests/gpu/sp-run.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
PRETRAIN=${PRETRAIN:-build-gpu/apps/colossal-pretrain}
[ -x "$PRETRAIN" ] || { echo "no colossal-pretrain at $PRETRAIN (set PRETRAIN)"; exit 2; }
ngpu=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
[ "$ngpu" -ge 2 ] || { echo "SKIP: $ngpu GPU(s); mesh.sp=2 needs 2"; exit 77; }
tmp=$(mktemp -d /tmp/colossal-sp-run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
TINY="--model.n_layers 2 --model.d_model 64 --model.n_heads 8 --train.seq_len 64 --train.micro_batch 4
  --optim.lr 2e-3 --optim.warmup_steps 2 --data.corpus_docs 1500 --data.corpus_vocab 0 --generate.tokens 0
  --run.peak_tflops 1 --log.timestamps false --run.device ${RUN_DEVICE:-cuda} --train.steps 10 --eval.interval 0
  --log.interval 5"

# pt NAME NP ARGS...: one run into $tmp/NAME
pt() {
    name=$1 np=$2
    shift 2
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((np - 1))) timeout 300 "${MPIRUN[@]}" -np "$np" "$PRETRAIN" $TINY \
        --run.dir "$tmp/$name" "$@" >"$tmp/$name.out" 2>&1
    echo $? >"$tmp/$name.rc"
}
field() { # NAME KEY: "step value" per train record
    grep '"kind":"train"' "$tmp/$1/metrics.jsonl" 2>/dev/null |
        sed -n "s/.*\"step\":\([0-9]*\).*\"$2\":\([-+0-9.eE]*\).*/\1 \2/p"
}

printf "%-7s %-5s %-22s %-6s %-12s %-12s %s\n" family prec layout steps loss grad_norm result | tee "$out/sp.txt"
nfail=0
for fam in gpt2 llama; do
    FAM=""
    [ $fam = llama ] && FAM="--model.family llama --model.n_kv_heads 2"
    for prec in f32 bf16; do
        tol=1e-5
        [ $prec = bf16 ] && tol=1e-2
        ref=$fam-$prec-ref
        # shellcheck disable=SC2086
        pt "$ref" 1 $FAM --precision $prec --train.grad_accum 2
        runs="sp2-all_to_all:2:--mesh.sp=2:--mesh.sp_mode=all_to_all:--train.grad_accum=2
              sp2-ring:2:--mesh.sp=2:--mesh.sp_mode=ring:--train.grad_accum=2"
        [ "$ngpu" -ge 4 ] && runs="$runs sp2xdp2-ring:4:--mesh.sp=2:--mesh.sp_mode=ring:--train.grad_accum=1"
        for r in $runs; do
            IFS=: read -r label np a1 a2 a3 <<<"$r"
            name=$fam-$prec-$label
            # shellcheck disable=SC2086
            pt "$name" "$np" $FAM --precision $prec "$a1" "$a2" "$a3"
            res=ok
            worst=""
            for key in loss grad_norm; do
                field "$ref" $key >"$tmp/ref"
                field "$name" $key >"$tmp/got"
                w=$(paste "$tmp/ref" "$tmp/got" | awk '{ d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2)
                    if ($1 != $3) bad = 1; if (r > w) w = r } END { if (bad || NR == 0) print "mismatch"; else printf "%.3e", w }')
                worst="$worst $w"
                [ "$(wc -l <"$tmp/got")" -eq 10 ] && [ "$w" != mismatch ] &&
                    awk -v w="$w" -v t="$tol" 'BEGIN { exit !(w <= t) }' || res="FAIL (tolerance $tol, exit $(cat "$tmp/$name.rc"))"
            done
            [ "$res" = ok ] || nfail=$((nfail + 1))
            # shellcheck disable=SC2086
            printf "%-7s %-5s %-22s %-6s %-12s %-12s %s\n" $fam $prec "$label" "$(wc -l <"$tmp/got")" $worst "$res" |
                tee -a "$out/sp.txt"
            [ "$res" = ok ] || tail -20 "$tmp/$name.out" >>"$out/sp-failures.log"
        done
    done
done
[ "$nfail" = 0 ] && echo "PASS" || { echo "FAIL: $nfail runs (logs in $out/sp-failures.log)"; exit 1; }
