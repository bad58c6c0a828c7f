#!/bin/sh
# Megatron compatibility, both ways, with a reader and a writer written here
# from Megatron-LM's format (megatron/core/datasets/indexed_dataset.py) in
# numpy: the reader reads our files and finds each document's bytes plus the
# end-of-document token; the writer (IndexedDatasetBuilder semantics) writes
# the same tokens and must produce our files byte for byte; colossal-data
# info reads a multi-sequence int32 dataset it wrote. Skipped without numpy.
. "$top_srcdir/tests/apps/data_lib.sh"
find_python
if [ -z "$PY" ]; then
    echo "SKIP: no python3 with numpy (PYTHON_TORCH=$PYTHON_TORCH)"
    exit 77
fi

run_np 1 corpus --out "$TMP/c.jsonl" --docs 300 --seed 9
expect_ok
run_np 3 preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/ours"
expect_ok

cat >"$TMP/megatron_format.py" <<'PYEOF'
import json, struct, sys
import numpy

HEADER = b"MMIDIDX\x00\x00"
DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
          6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}
CODES = {v: k for k, v in DTYPES.items()}

def read(prefix):
    """Megatron's _IndexReader + _MMapBinReader."""
    with open(prefix + ".idx", "rb") as f:
        assert f.read(9) == HEADER, "bad header"
        assert struct.unpack("<Q", f.read(8))[0] == 1, "bad version"
        dtype = DTYPES[struct.unpack("<B", f.read(1))[0]]
        seq_count = struct.unpack("<Q", f.read(8))[0]
        doc_count = struct.unpack("<Q", f.read(8))[0]
        offset = f.tell()
    buf = memoryview(numpy.memmap(prefix + ".idx", mode="r", order="C"))
    lengths = numpy.frombuffer(buf, dtype=numpy.int32, count=seq_count, offset=offset)
    pointers = numpy.frombuffer(buf, dtype=numpy.int64, count=seq_count, offset=offset + lengths.nbytes)
    docs = numpy.frombuffer(buf, dtype=numpy.int64, count=doc_count,
                            offset=offset + lengths.nbytes + pointers.nbytes)
    assert lengths.shape[0] == docs[-1] == seq_count
    bin_buf = memoryview(numpy.memmap(prefix + ".bin", mode="r", order="C"))
    seqs = [numpy.frombuffer(bin_buf, dtype=dtype, count=int(l), offset=int(p)) for l, p in zip(lengths, pointers)]
    return dtype, seqs, docs

def write(prefix, dtype, documents):
    """Megatron's IndexedDatasetBuilder: add_item per sequence, end_document, finalize."""
    lengths, doc_idx = [], [0]
    with open(prefix + ".bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                a = numpy.array(seq, dtype=dtype)
                f.write(a.tobytes(order="C"))
                lengths.append(a.size)
            doc_idx.append(len(lengths))
    itemsize = numpy.dtype(dtype).itemsize
    pointers, p = [], 0
    for l in lengths:
        pointers.append(p)
        p += l * itemsize
    with open(prefix + ".idx", "wb") as f:
        f.write(HEADER)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(numpy.array(lengths, dtype=numpy.int32).tobytes(order="C"))
        f.write(numpy.array(pointers, dtype=numpy.int64).tobytes(order="C"))
        f.write(numpy.array(doc_idx, dtype=numpy.int64).tobytes(order="C"))

jsonl, ours, theirs, multi = sys.argv[1:5]
texts = [json.loads(l)["text"] for l in open(jsonl, encoding="utf-8")]
expected = [list(t.encode("utf-8")) + [256] for t in texts]

dtype, seqs, docs = read(ours)
assert dtype is numpy.uint16, dtype
assert len(docs) == len(texts) + 1 and list(docs) == list(range(len(texts) + 1))
for i, (s, e) in enumerate(zip(seqs, expected)):
    assert s.tolist() == e, "document %d differs" % i
print("reader: %d documents, %d tokens read back exactly" % (len(seqs), sum(len(s) for s in seqs)))

# uint16 is what Megatron's preprocess_data.py picks for a 257-token vocabulary
write(theirs, numpy.uint16, [[e] for e in expected])

# several sequences per document, int32, empty sequences included
rng = numpy.random.RandomState(0)
multi_docs = [[rng.randint(0, 100000, size=rng.randint(0, 20)).tolist() for _ in range(rng.randint(1, 4))]
              for _ in range(50)]
write(multi, numpy.int32, multi_docs)
dtype, seqs, docs = read(multi)
print("multi: %d documents %d sequences %d tokens" % (len(multi_docs), len(seqs), sum(len(s) for s in seqs)))
PYEOF

"$PY" "$TMP/megatron_format.py" "$TMP/c.jsonl" "$TMP/ours" "$TMP/theirs" "$TMP/multi" >"$TMP/out" 2>"$TMP/err" ||
    fail "the Megatron-format reader/writer failed on our files"
cat "$TMP/out"
expect_grep out "reader: 300 documents"
same_dataset "$TMP/ours" "$TMP/theirs"
docs=$(sed -n 's/^multi: \([0-9]*\) documents \([0-9]*\) sequences \([0-9]*\) tokens/\1 \2 \3/p' "$TMP/out")
set -- $docs
run_np 1 info --data "$TMP/multi" --vocab-size 100000
expect_ok
expect_grep out "dtype +int32 \(code 4\)"
expect_grep out "documents +$1$"
expect_grep out "sequences +$2$"
expect_grep out "tokens +$3 "
echo ok
