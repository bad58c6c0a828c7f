#!/usr/bin/env python3
"""Independent GPT-2 BPE encoder, the reference for tests/unit/test_bpe_gpt2.c.

    ref_encode.py VOCAB_DIR CASES_FILE

VOCAB_DIR holds GPT-2's encoder.json and vocab.bpe. CASES_FILE has one test
case per line, its bytes in hex. Prints one line per case: the token ids,
space-separated.

Shares no code or algorithm with the C tokenizer:
  - pre-tokenisation is GPT-2's own pattern run by Python's `re`, with \\p{L},
    \\p{N} and \\s spelled out as explicit character classes built from
    unicodedata (`re` has no \\p{..}); where the third-party `regex` module is
    installed, its literal GPT-2 pattern must agree on every case;
  - merging is the loop from GPT-2's encoder.py: find the lowest-ranked
    adjacent pair, merge all its occurrences left to right, repeat;
  - bytes that are not valid UTF-8 go through Python's surrogateescape, so
    each becomes one lone surrogate: neither letter, number nor space.
"""
import json
import os
import re
import sys
import time
import unicodedata


def bytes_to_unicode():
    # GPT-2's table: printable Latin-1 stands for itself, the rest shift to 256+.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def char_class_ranges():
    """Regex class bodies for letters, numbers and White_Space."""
    sets = {"L": [], "N": [], "S": []}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        cat = unicodedata.category(ch)
        if cat in ("Zs", "Zl", "Zp") or cp in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85):
            key = "S"
        elif cat.startswith("L"):
            key = "L"
        elif cat.startswith("N"):
            key = "N"
        else:
            continue
        r = sets[key]
        if r and r[-1][1] == cp - 1:
            r[-1][1] = cp
        else:
            r.append([cp, cp])

    def body(ranges):
        return "".join("\\U%08x-\\U%08x" % (lo, hi) for lo, hi in ranges)

    return body(sets["L"]), body(sets["N"]), body(sets["S"])


def gpt2_pattern():
    L, N, S = char_class_ranges()
    return re.compile(
        "'s|'t|'re|'ve|'m|'ll|'d"
        "| ?[%s]+| ?[%s]+| ?[^%s%s%s]+|[%s]+(?![^%s])|[%s]+" % (L, N, S, L, N, S, S, S))


def load_ranks(vocab_dir):
    with open(os.path.join(vocab_dir, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    with open(os.path.join(vocab_dir, "vocab.bpe"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = [tuple(l.split()) for l in lines[1:] if l]
    return encoder, {m: i for i, m in enumerate(merges)}


def bpe(token, ranks):
    word = tuple(token)
    while len(word) > 1:
        pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        first, second = best
        merged, i = [], 0
        while i < len(word):
            if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                merged.append(first + second)
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = tuple(merged)
    return word


def main():
    vocab_dir, cases = sys.argv[1], sys.argv[2]
    encoder, ranks = load_ranks(vocab_dir)
    byte_map = bytes_to_unicode()
    pat = gpt2_pattern()
    try:
        import regex  # the package GPT-2's encoder.py uses
        literal = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    except ImportError:
        literal = None
    if os.environ.get("CAI_REF_TIMING"):
        literal = None  # time GPT-2's algorithm alone, not the cross-check
    cache = {}
    out = []
    with open(cases) as f:
        lines = f.read().split("\n")
    if lines and not lines[-1]:
        lines.pop()
    started = time.perf_counter()
    for n, line in enumerate(lines, 1):
        text = bytes.fromhex(line.strip()).decode("utf-8", "surrogateescape")
        pieces = pat.findall(text)
        if literal is not None and literal.findall(text) != pieces:
            sys.exit("case %d: explicit classes and the regex module split differently: %r vs %r"
                     % (n, pieces, literal.findall(text)))
        if "".join(pieces) != text:
            sys.exit("case %d: the pattern does not cover the text" % n)
        ids = []
        for p in pieces:
            if p not in cache:
                mapped = "".join(byte_map[b] for b in p.encode("utf-8", "surrogateescape"))
                cache[p] = [encoder[t] for t in bpe(mapped, ranks)]
            ids.extend(cache[p])
        out.append(" ".join(map(str, ids)))
    elapsed = time.perf_counter() - started
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))
    if os.environ.get("CAI_REF_TIMING"):  # for bench/tokenizer_bench.c: encoding time, start-up excluded
        sys.stdout.write("encode_seconds=%.6f\n" % elapsed)


if __name__ == "__main__":
    main()
