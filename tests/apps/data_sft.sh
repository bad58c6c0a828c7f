#!/bin/sh
# colossal-data sft-example and sft-preprocess end to end: the embedded
# instruction set (no training conversation asks a held-out question),
# preprocessing on 1, 2 and 3 ranks byte-identical (tokens
# and loss masks), special tokens refused or added, chatml and llama3 equal
# to their reference Jinja templates (python3-jinja2), truncate/drop counts,
# and bad input: a malformed line in the last rank's slice names file, line
# and field and leaves no output; a template that does not parse.
. "$top_srcdir/tests/apps/data_lib.sh"

run_np 1 sft-example --out "$TMP/ex" --docs 600 --seed 4 --held-out 10
expect_ok
expect_grep out "^sft-example: 600 conversations .*/train.jsonl \([0-9]+\), .*/held_out.jsonl \([0-9]+\); [0-9]+ training conversations? left out for asking held-out questions$"
[ -s "$TMP/ex/train.jsonl" ] && [ -s "$TMP/ex/held_out.jsonl" ] || fail "sft-example wrote no files"
# every conversation is held out, trained on, or left out for asking a held-out question
nt=$(sed -n 's/.*train.jsonl (\([0-9]*\)), .*/\1/p' "$TMP/out")
nh=$(sed -n 's/.*held_out.jsonl (\([0-9]*\)); .*/\1/p' "$TMP/out")
left=$(sed -n 's/.*; \([0-9]*\) training conversations* left out .*/\1/p' "$TMP/out")
[ "$(wc -l <"$TMP/ex/train.jsonl")" -eq "$nt" ] && [ "$(wc -l <"$TMP/ex/held_out.jsonl")" -eq "$nh" ] ||
    fail "the files do not hold the printed $nt and $nh lines"
[ "$left" -gt 0 ] && [ $((nt + nh + left)) -eq 600 ] || fail "train $nt + held out $nh + left out $left is not 600"
sed -n 's/.*\("role":"user","content":"[^"]*"}\),{"role":"assistant","content":"The answer is [0-9]*\."}.*/\1/p' \
    "$TMP/ex/held_out.jsonl" >"$TMP/held_questions"
[ -s "$TMP/held_questions" ] || fail "no held-out question found"
grep -q -F -f "$TMP/held_questions" "$TMP/ex/train.jsonl" && fail "a training conversation asks a held-out question"
grep -q '"The answer is [0-9]*\."' "$TMP/ex/held_out.jsonl" || fail "no arithmetic answer held out"
grep -q 'Continue this story: ' "$TMP/ex/train.jsonl" || fail "no story request"
run_np 2 sft-example --out "$TMP/ex2" --docs 600 --seed 4 --held-out 10
expect_ok
cmp -s "$TMP/ex/train.jsonl" "$TMP/ex2/train.jsonl" || fail "sft-example is not deterministic"

run_np 2 sft-preprocess --help
expect_ok
for key in input output_prefix tokenizer chat_template seq_len overflow strict_keys add_special_tokens; do
    expect_grep out "$key" "sft-preprocess --help does not list $key"
done

# a tokenizer trained on the corpus lacks ChatML's tokens: refused, then added
run_np 1 corpus --out "$TMP/c.jsonl" --docs 800 --seed 5
expect_ok
run_np 1 train-tokenizer --vocab-size 400 --input "$TMP/c.jsonl" --output "$TMP/tok"
expect_ok
run_np 2 sft-preprocess --input "$TMP/ex/train.jsonl" --output-prefix "$TMP/s" --tokenizer "$TMP/tok"
[ "$RC" -eq 1 ] || fail "missing special tokens: exit $RC, expected 1"
expect_grep err "needs special tokens the tokenizer .* lacks: <\|im_start\|>, <\|im_end\|>"
expect_grep err "add-special-tokens"
run_np 1 sft-preprocess --input "$TMP/ex/train.jsonl" --output-prefix "$TMP/s1" --tokenizer "$TMP/tok" \
    --add-special-tokens --seq-len 64
expect_ok
expect_grep out "added <\|im_start\|>, <\|im_end\|> \(2 new ids: vocabulary 400 -> 402\)"
[ -s "$TMP/s1_tokenizer/vocab.json" ] || fail "the grown tokenizer was not written"
expect_grep out "seq_len 64: [1-9][0-9]* truncated, [0-9]+ dropped \(--overflow truncate\)"
# Under the sanitizers (CAI_SANITIZE=1) the uneven 3-rank split alone: the
# 2-rank split reads the same shard code, which the other 2-rank runs reach.
NPS="2 3"
[ "${CAI_SANITIZE:-0}" != 1 ] || NPS=3
for np in $NPS; do
    run_np $np sft-preprocess --input "$TMP/ex/train.jsonl" --output-prefix "$TMP/s$np" --tokenizer "$TMP/tok" \
        --add-special-tokens --seq-len 64
    expect_ok
    same_dataset "$TMP/s1" "$TMP/s$np"
    same_dataset "$TMP/s1_loss_mask" "$TMP/s${np}_loss_mask"
done
# the grown tokenizer already has them: nothing to add
run_np 1 sft-preprocess --input "$TMP/ex/train.jsonl" --output-prefix "$TMP/g" --tokenizer "$TMP/s1_tokenizer" \
    --seq-len 64
expect_ok
same_dataset "$TMP/s1" "$TMP/g"
run_np 1 info --data "$TMP/s1" --vocab-size 402
expect_ok
run_np 1 info --data "$TMP/s1_loss_mask" --vocab-size 2
expect_ok
expect_grep out "uint8"

# Parity of the builtins with the reference Jinja templates (ChatML as Hugging Face documents it,
# Meta's Llama 3 template): with byte tokens the token dataset is the rendered text itself.
if python3 -c 'import jinja2' 2>/dev/null; then
    for tpl in chatml llama3; do
        run_np 2 sft-preprocess --input "$TMP/ex/held_out.jsonl" --output-prefix "$TMP/j_$tpl" --chat-template $tpl
        expect_ok
        python3 - "$TMP/ex/held_out.jsonl" "$TMP/j_$tpl" $tpl <<'PYEOF' || fail "$tpl differs from its Jinja template"
import json, struct, sys
import jinja2
src, prefix, name = sys.argv[1:4]
tpl = {
    "chatml": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
              "'<|im_end|>' + '\n'}}{% endfor %}",
    "llama3": "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
              "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
              "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}",
}[name]
t = jinja2.Environment().from_string(tpl)
idx = open(prefix + ".idx", "rb").read()
binf = open(prefix + ".bin", "rb").read()
assert idx[17] == 8, "dtype %d" % idx[17]
seqs = struct.unpack("<Q", idx[18:26])[0]
lens = struct.unpack("<%di" % seqs, idx[34:34 + 4 * seqs])
ptrs = struct.unpack("<%dq" % seqs, idx[34 + 4 * seqs:34 + 12 * seqs])
lines = [json.loads(l) for l in open(src, encoding="utf-8")]
assert len(lines) == seqs, (len(lines), seqs)
for i, line in enumerate(lines):
    ids = struct.unpack("<%dH" % lens[i], binf[ptrs[i]:ptrs[i] + 2 * lens[i]])
    got = bytes(ids).decode("utf-8")
    want = t.render(messages=line["messages"], bos_token="<|begin_of_text|>")
    assert got == want, (i, got, want)
print(name, seqs, "conversations equal to the Jinja rendering")
PYEOF
    done
fi

# drop instead of truncate; bytes and the plain template
run_np 2 sft-preprocess --input "$TMP/ex/train.jsonl" --output-prefix "$TMP/d" --tokenizer "$TMP/tok" \
    --add-special-tokens --seq-len 64 --overflow drop
expect_ok
expect_grep out "seq_len 64: 0 truncated, [1-9][0-9]* dropped \(--overflow drop\)"
run_np 2 sft-preprocess --input "$TMP/ex/train.jsonl" --output-prefix "$TMP/b" --chat-template plain
expect_ok
expect_grep out "template plain"
expect_grep out "no length limit"

# a malformed line in the last rank's slice
sed '530s/"role":"user"/"role":"bot"/' "$TMP/ex/train.jsonl" >"$TMP/bad.jsonl"
cmp -s "$TMP/bad.jsonl" "$TMP/ex/train.jsonl" && fail "the test did not break line 530"
run_np 3 sft-preprocess --input "$TMP/bad.jsonl" --output-prefix "$TMP/bad"
[ "$RC" -eq 1 ] || fail "bad line: exit $RC, expected 1"
expect_grep err "bad.jsonl:530: field 'messages\[[01]\].role': 'bot' is not one of system\|user\|assistant"
for f in bad.bin bad.idx bad_loss_mask.bin bad_loss_mask.idx; do
    [ ! -e "$TMP/$f" ] || fail "a failed run left $f behind"
done
ls "$TMP" | grep -q 'part-' && fail "partial files left behind"
printf '{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}\n{"prompt":"q"}\n' \
    >"$TMP/pc.jsonl"
run_np 2 sft-preprocess --input "$TMP/pc.jsonl" --output-prefix "$TMP/pc"
expect_fail
expect_grep err "pc.jsonl:2: field 'completion': absent"
printf '{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}],"id":1}\n' >"$TMP/id.jsonl"
run_np 1 sft-preprocess --input "$TMP/id.jsonl" --output-prefix "$TMP/id"
expect_ok
run_np 1 sft-preprocess --input "$TMP/id.jsonl" --output-prefix "$TMP/id" --strict-keys
expect_fail
expect_grep err "id.jsonl:1: unknown key 'id'"

# templates that do not parse
printf '{"prefix": "<{role}>", "suffix": 3}\n' >"$TMP/t.json"
run_np 2 sft-preprocess --input "$TMP/id.jsonl" --output-prefix "$TMP/t" --chat-template "$TMP/t.json"
expect_fail
expect_grep err "t.json: field 'suffix': must be a string, not an integer"
run_np 1 sft-preprocess --input "$TMP/id.jsonl" --output-prefix "$TMP/t" --chat-template vicuna
expect_fail
expect_grep err 'chat template "vicuna": not one of plain\|chatml\|llama3'
printf '{"prefix": "<{role}>", "end": "</>", "special_tokens": ["</>"]}\n' >"$TMP/ok.json"
run_np 2 sft-preprocess --input "$TMP/id.jsonl" --output-prefix "$TMP/t" --chat-template "$TMP/ok.json"
expect_ok
echo ok
