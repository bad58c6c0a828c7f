#!/bin/sh
# colossal-infer's bad input: malformed lines, missing fields, unknown keys,
# bad sampling values and prompts longer than the context each get a result
# line with finish_reason "error" naming the line and field, and the other
# requests are answered (infer.on_error=line); infer.on_error=fail stops the
# job with the same message; duplicate ids, an empty file and a missing
# model are refused before anything runs. Nothing is lost: every request
# has a line. A chat template file renders as the builtin it spells.
set -e
. "$top_srcdir/tests/apps/infer_lib.sh"
pretrain_tiny

python3 - "$TMP/req.jsonl" <<'PY'
import json, sys
long = "the cat sat " * 60
lines = [
    json.dumps({"id": "ok1", "prompt": "Once", "max_tokens": 4}),
    '{"id": "broken", "prompt": "x"',                                   # not JSON
    json.dumps({"id": "noprompt", "max_tokens": 3}),                      # neither prompt nor messages
    json.dumps({"id": "unknown", "prompt": "x", "temprature": 0.5}),      # misspelt key
    json.dumps({"id": "badtemp", "prompt": "x", "temperature": -1}),
    json.dumps({"id": "badtopp", "prompt": "x", "top_p": 0}),
    json.dumps({"id": "toolong", "prompt": long}),                        # longer than the 64-token context
    json.dumps({"id": "badmsg", "messages": [{"role": "user"}]}),
    json.dumps({"custom_id": "oa", "method": "POST", "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "hi"}], "n": 2}}),
    json.dumps({"id": "ok2", "prompt": "The", "max_tokens": 4}),
]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY

run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/res.jsonl"
expect_ok
python3 - "$TMP/res.jsonl" <<'PY' || fail "error lines"
import json, sys
res = {}
for l in open(sys.argv[1]):
    o = json.loads(l)
    res[o.get("custom_id", o.get("id"))] = o
assert len(res) == 10, sorted(res)
for k in ("ok1", "ok2"):
    assert res[k]["finish_reason"] in ("length", "stop"), res[k]
want = {"noprompt": ("req.jsonl:3", "prompt"), "unknown": ("req.jsonl:4", "temprature"),
        "badtemp": ("req.jsonl:5", "temperature"), "badtopp": ("req.jsonl:6", "top_p"),
        "toolong": ("req.jsonl:7", "context"), "badmsg": ("req.jsonl:8", "content")}
for k, (line, field) in want.items():
    o = res[k]
    assert o["finish_reason"] == "error", o
    assert line in o["error"] and field in o["error"], (k, o["error"])
broken = [o for k, o in res.items() if "req.jsonl:2" in o.get("error", "")]
assert len(broken) == 1, "the line that is not JSON has no error line"
oa = res["oa"]
assert oa["response"]["status_code"] == 400 and "n" in oa["error"]["message"], oa
PY

# Lenient keys: the misspelt key is ignored.
run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/lenient.jsonl" --infer.strict_keys false
expect_ok
grep -q '"id":"unknown".*"finish_reason":"\(length\|stop\)"' "$TMP/lenient.jsonl" ||
    fail "strict_keys=false still refused the unknown key"

# on_error=fail: the first bad request ends the job naming it.
run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/fail.jsonl" --infer.on_error fail
expect_fail
expect_grep err "req.jsonl:2"

# Chat templates: a template file spelling ChatML gives ChatML's results;
# an unknown name is refused before anything runs.
printf '{"id":"c1","messages":[{"role":"user","content":"What is 3 + 4?"}],"max_tokens":6}\n' >"$TMP/chat.jsonl"
printf '{"prefix":"<|im_start|>{role}\\n","end":"<|im_end|>","suffix":"\\n"}\n' >"$TMP/chatml.json"
run_infer 1 --infer.input "$TMP/chat.jsonl" --infer.output "$TMP/chat-builtin.jsonl"
expect_ok
run_infer 1 --infer.input "$TMP/chat.jsonl" --infer.output "$TMP/chat-file.jsonl" --infer.chat_template "$TMP/chatml.json"
expect_ok
grep -q '"finish_reason":"\(length\|stop\)"' "$TMP/chat-builtin.jsonl" || fail "the chat request was not answered"
cmp -s "$TMP/chat-builtin.jsonl" "$TMP/chat-file.jsonl" || fail "the ChatML template file answers differently"
run_infer 1 --infer.input "$TMP/chat.jsonl" --infer.output "$TMP/x.jsonl" --infer.chat_template vicuna
expect_fail
expect_grep err 'chat template "vicuna": not one of plain\|chatml\|llama3'

# Refused before anything runs.
printf '{"id":"a","prompt":"x"}\n{"id":"a","prompt":"y"}\n' >"$TMP/dup.jsonl"
run_infer 1 --infer.input "$TMP/dup.jsonl" --infer.output "$TMP/dup-out.jsonl"
expect_fail
expect_grep err "dup.jsonl:2: id 'a' is used by an earlier line"
: >"$TMP/empty.jsonl"
run_infer 1 --infer.input "$TMP/empty.jsonl" --infer.output "$TMP/empty-out.jsonl"
expect_fail
expect_grep err "holds no request"
run_infer 1 --model.path "$TMP/nowhere" --infer.input "$TMP/req.jsonl" --infer.output "$TMP/x.jsonl"
expect_fail
expect_grep err "model.path=.*nowhere: no such file"
run_infer 1 --infer.output "$TMP/x.jsonl"
expect_fail
expect_grep err "infer.input is required"
# An output that is not result lines is refused, naming its line, and left as it is.
printf '{"id":"ok1","text":"x"}\nnot json\n' >"$TMP/garbage.jsonl"
run_infer 1 --infer.input "$TMP/req.jsonl" --infer.output "$TMP/garbage.jsonl"
expect_fail
expect_grep err "garbage.jsonl:2"
[ "$(wc -l <"$TMP/garbage.jsonl")" -eq 2 ] || fail "the bad output file was changed"
echo "PASS"
