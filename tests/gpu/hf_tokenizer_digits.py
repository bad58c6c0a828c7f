"""Hugging Face transformers against colossal on a digit-splitting tokenizer.

A tokenizer directory written by colossal (cai_bpe_save: tokenizer.json with
pre_tokenizer Sequence[Digits(individual_digits=true), ByteLevel]) is loaded
with transformers, each string of colossal's encoding dump is encoded, and
the ids must equal colossal's; every token that holds a digit must be that
digit alone, and decode(encode(s)) must give s back. Exit status 1 on any
mismatch.

    # the strings (once; any JSONL of strings will do)
    python3 tests/gpu/hf_tokenizer_digits.py --write-strings strings.jsonl
    # colossal's ids, e.g. of the tiny example's tokenizer
    colossal-pretrain ... --data.corpus_vocab 1000 --data.corpus_split_digits true --run.dir RUN
    colossal-data encode --tokenizer RUN/tokenizer --input strings.jsonl --output ids.jsonl
    # the comparison (needs transformers)
    python3 tests/gpu/hf_tokenizer_digits.py RUN/tokenizer ids.jsonl
"""

import json
import os
import sys

# Digits in every position Digits + ByteLevel treat differently from GPT-2's
# pattern: after a space, inside words, runs of spaces before a digit,
# contractions after a digit, non-ASCII numerals (\p{N}: superscripts,
# fractions, Arabic-Indic and fullwidth digits), and the end-of-text token.
STRINGS = [
    "What is 127 plus 45?",
    "The answer is 172.",
    "Q: What is 7 times 8? A: 56",
    " 42 apples",
    "a  1",
    "x2y 3.14159 -17 +0",
    "1000000 2024-12-04 12:30:59",
    "it's 3's 10's",
    "x\u00b2 \u00bd \u0663\u0664 \uff11\uff12",
    "   9\n\n 8\t7  ",
    "Once upon a time, 3 cats ate 12 fish.<|endoftext|>5 more",
    "",
    "no digits at all",
    "\u00e9t\u00e9 9\u00e9 \u4e2d\u65873",
]


def write_strings(path):
    with open(path, "w", encoding="utf-8") as f:
        for s in STRINGS:
            if s:
                f.write(json.dumps(s) + "\n")


def load(tok_dir):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        tok = AutoTokenizer.from_pretrained(tok_dir)
    except (OSError, ValueError, KeyError):
        tok = None
    if tok is None or not getattr(tok, "is_fast", False):
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tok_dir, "tokenizer.json"))
    return tok


def main(argv):
    if len(argv) == 3 and argv[1] == "--write-strings":
        write_strings(argv[2])
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    tok_dir, ids_path = argv[1], argv[2]
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        pre = json.load(f)["pre_tokenizer"]
    if pre.get("type") != "Sequence" or [p.get("type") for p in pre.get("pretokenizers", [])] != ["Digits", "ByteLevel"]:
        print("%s/tokenizer.json: pre_tokenizer is %s, not Sequence[Digits, ByteLevel]" % (tok_dir, json.dumps(pre)))
        return 1
    tok = load(tok_dir)
    fails = checked = 0
    with open(ids_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for row in rows:
        text, want = row["text"], row["ids"]
        got = tok.encode(text, add_special_tokens=False)
        checked += 1
        if got != want:
            fails += 1
            print("MISMATCH %r\n  colossal     %s\n  transformers %s\n  pieces %s" % (
                text, want, got, tok.convert_ids_to_tokens(got)))
            continue
        for i in got:
            t = tok.convert_ids_to_tokens(i)
            if any(c in "0123456789" for c in t) and len(t) > 1:
                fails += 1
                print("token %d %r joins a digit to other characters (in %r)" % (i, t, text))
        back = tok.decode(got, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back != text:
            fails += 1
            print("decode(encode(%r)) = %r" % (text, back))
    if not checked:
        print("%s holds no strings" % ids_path)
        return 1
    print("%d strings: %s" % (checked, "all equal" if not fails else "%d failures" % fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
