#!/bin/sh
# colossal-ckpt on Hugging Face directories: init (with a trained tokenizer),
# inspect, verify, HF -> HF convert (bf16 sharded; f32 sharded and back is
# byte-identical), output once under several ranks, and the errors users
# hit: missing paths, corrupt shards, foreign files, bad sizes and configs.
. "$top_srcdir/tests/apps/ckpt_hf_lib.sh"
# a tokenizer of 300 ids, and a Llama (GQA) of that vocabulary shipping it
run_np 1 corpus --out "$TMP/c.jsonl" --docs 300 --seed 3
expect_ok
run_np 1 train-tokenizer --vocab-size 300 --input "$TMP/c.jsonl" --output "$TMP/tok"
expect_ok
ckpt 1 init --output "$TMP/llama" --model.family llama --model.vocab-size 300 --model.n-layers 2 \
    --model.d-model 64 --model.n-heads 4 --model.n-kv-heads 2 --model.max-seq-len 32 --tokenizer "$TMP/tok"
expect_ok
expect_grep out "^init: LlamaForCausalLM .* 21 tensors"
for f in config.json model.safetensors vocab.json merges.txt tokenizer.json tokenizer_config.json; do
    [ -s "$TMP/llama/$f" ] || fail "init did not write $f"
done
grep -q '"num_key_value_heads": 2' "$TMP/llama/config.json" || fail "config.json lacks num_key_value_heads"
grep -q '"eos_token_id": 0' "$TMP/llama/config.json" || fail "config.json lacks the tokenizer's eos id"

# inspect: positional path, mapping shown, printed once on 2 ranks
ckpt 2 inspect "$TMP/llama"
expect_ok
expect_grep out "Hugging Face LlamaForCausalLM"
expect_grep out "model.layers.1.self_attn.k_proj.weight +F32 +\[32,64\] .* h.1.attn.qkv.weight \(qkv rows 64..96\)"
expect_grep out "model.embed_tokens.weight .* wte.weight \(vocab rows 0..300\)"
[ "$(grep -c 'Hugging Face LlamaForCausalLM' "$TMP/out")" -eq 1 ] || fail "inspect printed more than once"
ckpt 1 verify --path "$TMP/llama"
expect_ok
expect_grep out "ok: LlamaForCausalLM with every tensor config.json needs \(21 in 1 file\)"

# HF -> HF: bf16 in shards of 32 KB
ckpt 1 convert --input "$TMP/llama" --output "$TMP/l16" --to hf --dtype bf16 --max-shard-size 32KB
expect_ok
[ -s "$TMP/l16/model.safetensors.index.json" ] || fail "no index"
[ ! -e "$TMP/l16/model.safetensors" ] || fail "a sharded export left model.safetensors"
grep -q '"torch_dtype": "bfloat16"' "$TMP/l16/config.json" || fail "torch_dtype is not bfloat16"
ckpt 1 inspect "$TMP/l16" --no-tensors
expect_grep out "weights in [0-9]+ files \(model.safetensors.index.json, total_size [0-9]+ bytes\)"
shard=$(ls "$TMP/l16" | grep -E '^model-00001-of-[0-9]{5}\.safetensors$') || fail "no first shard"
ckpt 1 inspect "$TMP/l16/$shard"
expect_ok
expect_grep out "metadata format = pt"
expect_grep out " BF16 "
ckpt 1 verify "$TMP/l16"
expect_ok
# f32 through shards and back: the same bytes
ckpt 1 convert --input "$TMP/llama" --output "$TMP/l32s" --to hf --max-shard-size 20000
expect_ok
ckpt 1 convert --input "$TMP/l32s" --output "$TMP/l32" --to hf
expect_ok
cmp -s "$TMP/llama/model.safetensors" "$TMP/l32/model.safetensors" || fail "f32 -> shards -> f32 changed the weights"
cmp -s "$TMP/llama/config.json" "$TMP/l32/config.json" || fail "f32 -> shards -> f32 changed config.json"

# errors
ckpt 1 inspect "$TMP/nothing"
expect_fail
expect_grep err "no such file or directory"
ckpt 1 verify "$TMP/c.jsonl"
expect_fail
expect_grep err "neither safetensors"
cp -r "$TMP/l16" "$TMP/broken"
truncate -s 100 "$TMP/broken/$shard"
ckpt 1 verify "$TMP/broken"
expect_fail
expect_grep err "$shard"
ckpt 1 convert --input "$TMP/llama" --output "$TMP/x" --to hf --max-shard-size 5XB
expect_fail
expect_grep err "max_shard_size: unknown unit"
ckpt 1 init --output "$TMP/bad" --model.d-model 30 --model.n-heads 4
expect_fail
expect_grep err "d_model=30"
ckpt 1 init --output "$TMP/bad" --model.vocab-size 100 --tokenizer "$TMP/tok"
expect_fail
expect_grep err "vocab_size is 100"
[ ! -e "$TMP/bad/config.json" ] || fail "a refused export wrote config.json"
ckpt 1 frobnicate
[ "$RC" -eq 2 ] || fail "unknown subcommand: exit $RC, expected 2"
expect_grep err "unknown subcommand"
echo ok
