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
expect_grep err "no HDF5 signature at byte 0, and as safetensors: .*c.jsonl"

# malformed files: each names the file and the check that failed, whether
# the name or the content says what the file was meant to be
st_raw() { # st_raw PATH HEADER: an 8-byte little-endian length (< 256), then HEADER
    len=$(printf %s "$2" | wc -c)
    printf "$(printf '\\%03o' "$len")\000\000\000\000\000\000\000" >"$1"
    printf %s "$2" >>"$1"
}
refused() { # refused PATH PATTERN: verify fails, naming the file and the check
    ckpt 1 verify "$1"
    expect_fail
    expect_grep err "$(basename "$1")"
    expect_grep err "$2"
}
: >"$TMP/empty.safetensors"
refused "$TMP/empty.safetensors" "file is empty \(0 bytes\)"
: >"$TMP/empty.bin"
refused "$TMP/empty.bin" "neither safetensors.*: the file is empty \(0 bytes\)"
printf 'abcde' >"$TMP/five.safetensors"
refused "$TMP/five.safetensors" "file is 5 bytes, shorter than the 8-byte header length"
printf 'abcde' >"$TMP/five"
refused "$TMP/five" "neither safetensors.*file is 5 bytes, shorter than the 8-byte header length"
st_raw "$TMP/past.safetensors" '{}'
printf '\350\003' | dd of="$TMP/past.safetensors" conv=notrunc 2>/dev/null # length 1000
refused "$TMP/past.safetensors" "header length 1000 exceeds .*header length past the end of the file"
st_raw "$TMP/notjson" '{"a": nope}'
refused "$TMP/notjson" "header is not valid JSON"
st_raw "$TMP/words" 'hello'
refused "$TMP/words" "header is not a JSON object: it starts with something that is not JSON"
st_raw "$TMP/array" '[1, 2]'
refused "$TMP/array" "neither safetensors.*header is not a JSON object: it starts with a JSON array"
st_raw "$TMP/number.safetensors" '42'
refused "$TMP/number.safetensors" "header is not a JSON object: it starts with a JSON number"
st_raw "$TMP/bom.safetensors" "$(printf '\357\273\277'){}"
refused "$TMP/bom.safetensors" "header is not a JSON object: it starts with a UTF-8 byte-order mark"
st_raw "$TMP/huge.safetensors" '{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}}'
refused "$TMP/huge.safetensors" "an integer in 'shape' near byte [0-9]+ of the header is out of range"
st_raw "$TMP/range.safetensors" '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
refused "$TMP/range.safetensors" "tensor 'a': data_offsets \[0, 4\) out of range: the file holds 0 data bytes"
st_raw "$TMP/dtype.safetensors" '{"a":{"dtype":"F33","shape":[0],"data_offsets":[0,0]}}'
refused "$TMP/dtype.safetensors" "tensor 'a': unknown dtype 'F33'"
st_raw "$TMP/noname.safetensors" '{"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
refused "$TMP/noname.safetensors" "a tensor has an empty name"
st_raw "$TMP/tf.safetensors" '{"__metadata__":{"format":"tf"}}'
refused "$TMP/tf.safetensors" "'__metadata__.format' is \"tf\"; only \"pt\" is accepted"
head -c 4096 /dev/zero >"$TMP/zeros.h5"
refused "$TMP/zeros.h5" "is not an HDF5 file: no HDF5 signature \(its first 4096 bytes are all zero\)"
head -c 4096 /dev/zero >"$TMP/zeros"
refused "$TMP/zeros" "neither safetensors.*its first 4096 bytes are all zero"
# a NaN in the last weight of the file: verify and import name the tensor
cp -r "$TMP/llama" "$TMP/nan"
size=$(wc -c <"$TMP/nan/model.safetensors")
printf '\000\000\300\177' | dd of="$TMP/nan/model.safetensors" bs=1 seek=$((size - 4)) conv=notrunc 2>/dev/null
refused "$TMP/nan" "tensor '[a-z_.0-9]+' in '.*nan/model.safetensors' holds 1 values that are not finite"
ckpt 1 import --input "$TMP/nan" --output "$TMP/nan.h5"
expect_fail
expect_grep err "holds 1 values that are not finite .*refusing to import it"
[ ! -e "$TMP/nan.h5" ] || fail "a refused import wrote the checkpoint"
mkdir -p "$TMP/twolines"
printf 'step-00000002.h5\nstep-00000001.h5\n' >"$TMP/twolines/latest"
refused "$TMP/twolines" "twolines/latest' should hold one line .* holds more than one"
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
