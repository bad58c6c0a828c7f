#!/bin/sh
# Fine-tuning end to end with nothing downloaded: a tiny GPT-2 pretrained on
# the embedded corpus, the embedded instruction set (colossal-data
# sft-example), colossal-sft, the Hugging Face export, and exact-match
# accuracy of greedy answers to held-out arithmetic questions before and
# after fine-tuning (colossal-infer, "The answer is N." compared as text),
# full fine-tuning and LoRA side by side from the same pretrained model.
#
#   sh examples/sft-tiny.sh [DIR] [RANKS]
#
# DIR (default runs/sft-tiny) receives pretrain/, data/, sft/, hf/, sft-lora/
# (with lora/merged, the LoRA model merged, and lora/adapter, its PEFT
# adapter) and the answers; RANKS ranks each (default 2). Programs come from COLOSSAL_BIN
# (default: the PATH), the launcher from MPIEXEC (default mpirun). The sizes
# come from the environment: PRETRAIN_STEPS (600), SFT_EPOCHS (4), DOCS
# (4000 conversations, 10% held out), LORA (1; 0 skips the LoRA run),
# LORA_RANK (16), LORA_LR (5e-3), LORA_TARGETS (c_attn,c_proj,c_fc).
# SPLIT_DIGITS=1 trains the corpus tokenizer with every digit its own token
# (--data.corpus_split_digits). It is off by default: measured worse held
# out (bench/RESULTS.md, "digits as tokens").
set -e
dir=${1:-runs/sft-tiny}
np=${2:-2}
bin=${COLOSSAL_BIN:+$COLOSSAL_BIN/}
launch=${MPIEXEC:-mpirun}
[ "${SPLIT_DIGITS:-0}" = 0 ] && digits= || digits="--data.corpus_split_digits true"
mkdir -p "$dir"

$launch -n "$np" "${bin}colossal-pretrain" --model.n_layers 4 --model.d_model 128 --model.n_heads 4 \
    --train.seq_len 128 --train.micro_batch 8 --train.steps "${PRETRAIN_STEPS:-600}" --data.corpus_vocab 1000 $digits \
    --generate.tokens 0 --eval.interval 0 --checkpoint.every 1000000 --log.timestamps false --run.dir "$dir/pretrain"
"${bin}colossal-data" sft-example --out "$dir/data" --docs "${DOCS:-4000}" --seed 1234 --held-out 10
$launch -n "$np" "${bin}colossal-sft" --model.path "$dir/pretrain/checkpoints" --data.train "$dir/data/train.jsonl" \
    --data.valid "$dir/data/held_out.jsonl" --train.seq_len 128 --train.micro_batch 8 \
    --train.epochs "${SFT_EPOCHS:-4}" --optim.lr 1e-3 --optim.warmup_steps 10 --log.timestamps false \
    --checkpoint.every 1000000 --run.dir "$dir/sft"
"${bin}colossal-ckpt" export --input "$dir/sft/checkpoints" --output "$dir/hf" --tokenizer "$dir/sft/tokenizer"
if [ "${LORA:-1}" != 0 ]; then
    # the same data and schedule through adapters on a frozen base (alpha = 2 rank)
    $launch -n "$np" "${bin}colossal-sft" --model.path "$dir/pretrain/checkpoints" \
        --data.train "$dir/data/train.jsonl" --data.valid "$dir/data/held_out.jsonl" --train.seq_len 128 \
        --train.micro_batch 8 --train.epochs "${SFT_EPOCHS:-4}" --optim.lr "${LORA_LR:-5e-3}" --optim.warmup_steps 10 \
        --lora.rank "${LORA_RANK:-16}" --lora.alpha $((2 * ${LORA_RANK:-16})) \
        --lora.targets "${LORA_TARGETS:-c_attn,c_proj,c_fc}" --log.timestamps false --checkpoint.every 1000000 \
        --run.dir "$dir/sft-lora"
fi

# The held-out arithmetic questions as chat requests (the answer left out,
# greedy, up to the end of the line) and their expected answers.
grep '"content":"The answer is [-0-9]*\."}\]}$' "$dir/data/held_out.jsonl" | awk -v req="$dir/questions.jsonl" \
    -v expf="$dir/expected.tsv" '{
    i = index($0, ",{\"role\":\"assistant\",\"content\":\"")
    a = substr($0, i); sub(/^,\{"role":"assistant","content":"/, "", a); sub(/"\}\]\}$/, "", a)
    q = substr($0, 13, i - 13)
    printf "{\"id\":\"q%d\",\"messages\":%s],\"max_tokens\":16,\"stop\":[\"\\n\"]}\n", NR, q > req
    printf "q%d\t%s\n", NR, a > expf
}'
# exact_match MODEL NAME: "NAME: correct/total" from greedy answers, how many
# have the trained form at all, and how many hold the right number in any
# form (the pretrained model answers the corpus' drills with a bare number).
exact_match() {
    rm -f "$dir/answers-$2.jsonl"
    $launch -n "$np" "${bin}colossal-infer" --model.path "$1" --infer.input "$dir/questions.jsonl" \
        --infer.output "$dir/answers-$2.jsonl" --infer.chat_template plain --run.dir "$dir/infer-$2" >/dev/null
    sed -n 's/^{"id":"\(q[0-9]*\)","text":"\([^"]*\)".*/\1\t\2/p' "$dir/answers-$2.jsonl" |
        awk -F '\t' -v name="$2" 'NR == FNR { want[$1] = $2; v = $2; sub(/^The answer is /, "", v); sub(/\.$/, "", v)
                num[$1] = v; n++; next }
            { t = $2; sub(/^ +/, "", t); sub(/ +$/, "", t); ok += (t == want[$1]); form += (t ~ /^The answer is -?[0-9]+\.$/)
              g = ""; if (match(t, /-?[0-9]+/)) g = substr(t, RSTART, RLENGTH); right += (g == num[$1]) }
            END { printf "%s: exact match %d/%d = %.1f%%, answer in the trained form %d/%d, right number (the first " \
                "integer of the answer) %d/%d\n", name, ok, n, 100 * ok / n, form, n, right, n }' "$dir/expected.tsv" -
}
exact_match "$dir/pretrain/checkpoints" before
exact_match "$dir/hf" after
[ "${LORA:-1}" = 0 ] || exact_match "$dir/sft-lora/lora/merged" after-lora
