#!/usr/bin/env python3
"""Hugging Face side of the tokenizer benchmark (bench/RESULTS.md).

    tokenizer_hf_compare.py OUT_DIR GPT2_VOCAB_DIR

OUT_DIR is what `tokenizer_bench --out OUT_DIR` wrote. Encodes the same
documents with Hugging Face `tokenizers` (Rust) built from GPT-2's
encoder.json + vocab.bpe, one document at a time on one thread, and reports
its MB/s and whether its ids equal colossal's; then checks that colossal's
saved tokenizer (tokenizer.json, and vocab.json + merges.txt through
transformers' GPT2TokenizerFast and GPT2Tokenizer) encodes like colossal
does. Uses tiktoken too when it is installed. Needs no network.
"""
import json
import os
import struct
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")


def records(path, item):
    out = []
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i < len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        i += 8
        if item == "bytes":
            out.append(data[i:i + n])
            i += n
        else:
            out.append(list(struct.unpack_from("<%di" % n, data, i)))
            i += 4 * n
    return out


def compare(name, docs, ours, encode):
    same = differ = 0
    first = None
    for k, (text, want) in enumerate(zip(docs, ours)):
        got = encode(text)
        if got == want:
            same += 1
        else:
            differ += 1
            if first is None:
                j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                first = "doc %d, token %d: %s vs colossal %s" % (k, j, got[j:j + 5], want[j:j + 5])
    print("%s: %d documents identical, %d differ%s" % (name, same, differ, " (first: %s)" % first if first else ""))
    return differ


def main():
    out_dir, vocab_dir = sys.argv[1], sys.argv[2]
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    corpus = records(os.path.join(out_dir, "corpus.bin"), "bytes")
    ours = records(os.path.join(out_dir, "gpt2_ids.bin"), "ids")
    docs, want = [], []
    for raw, ids in zip(corpus, ours):
        try:
            docs.append(raw.decode("utf-8"))  # HF takes str: invalid UTF-8 documents are left out
            want.append(ids)
        except UnicodeDecodeError:
            pass
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    print("tokenizers %s; %d of %d documents are valid UTF-8 (%.1f MB)" % (tokenizers.__version__, len(docs),
                                                                           len(corpus), nbytes / 1e6))

    hf = Tokenizer(models.BPE.from_file(os.path.join(vocab_dir, "encoder.json"),
                                        os.path.join(vocab_dir, "vocab.bpe")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<|endoftext|>"])
    hf.encode("warm up")
    t0 = time.perf_counter()
    hf_ids = [hf.encode(d).ids for d in docs]
    secs = time.perf_counter() - t0
    print("HF tokenizers GPT-2, one thread: %.1f MB/s" % (nbytes / 1e6 / secs))
    bad = compare("HF tokenizers vs colossal (GPT-2)", docs, want, lambda d, it=iter(hf_ids): next(it))

    try:
        import tiktoken
        byte_map = {}
        keep = list(range(33, 127)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        extra = 0
        for b in range(256):
            if b in keep:
                byte_map[chr(b)] = b
            else:
                byte_map[chr(256 + extra)] = b
                extra += 1
        enc = json.load(open(os.path.join(vocab_dir, "encoder.json"), encoding="utf-8"))
        ranks = {bytes(byte_map[c] for c in t): i for t, i in enc.items() if t != "<|endoftext|>"}
        tk = tiktoken.Encoding("gpt2-local", pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                               mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
        t0 = time.perf_counter()
        tk_ids = [tk.encode(d, allowed_special="all") for d in docs]
        secs = time.perf_counter() - t0
        print("tiktoken %s GPT-2, one thread: %.1f MB/s" % (tiktoken.__version__, nbytes / 1e6 / secs))
        bad += compare("tiktoken vs colossal (GPT-2)", docs, want, lambda d, it=iter(tk_ids): next(it))
    except ImportError:
        print("tiktoken: not installed")

    trained_dir = os.path.join(out_dir, "trained")
    tr_ids = records(os.path.join(out_dir, "trained_ids.bin"), "ids")
    tdocs, twant = [], []
    for raw, ids in zip(corpus, tr_ids):
        try:
            tdocs.append(raw.decode("utf-8"))
            twant.append(ids)
        except UnicodeDecodeError:
            pass
    t = Tokenizer.from_file(os.path.join(trained_dir, "tokenizer.json"))
    bad += compare("HF tokenizers from colossal's tokenizer.json (trained, vocab %d)" % t.get_vocab_size(), tdocs,
                   twant, lambda d: t.encode(d).ids)
    try:
        import shutil
        import tempfile

        import transformers
        from transformers import GPT2Tokenizer, GPT2TokenizerFast
        # Only vocab.json + merges.txt, so that transformers builds the tokenizer from them.
        files_only = tempfile.mkdtemp()
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(os.path.join(trained_dir, name), files_only)
        for cls, ndocs in ((GPT2TokenizerFast, len(tdocs)), (GPT2Tokenizer, 40)):
            try:
                tk = cls.from_pretrained(files_only)
            except Exception as e:  # a transformers version without this class or path
                print("transformers %s %s: cannot load (%s)" % (transformers.__version__, cls.__name__, e))
                continue
            bad += compare("transformers %s %s (%s) from colossal's vocab.json + merges.txt"
                           % (transformers.__version__, cls.__name__, type(tk).__name__), tdocs[:ndocs],
                           twant[:ndocs], lambda d: tk(d)["input_ids"])
        shutil.rmtree(files_only)
    except ImportError:
        print("transformers: not installed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
