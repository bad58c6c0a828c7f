#!/usr/bin/env python3
"""Interop with the reference safetensors library (Hugging Face, via torch).

  reference.py --write OUT    write the canonical tensors with safetensors.torch
  reference.py --check FILE   load a colossal-written file with the reference
                              reader and compare it to the canonical tensors

torch_written.safetensors next to this script was produced by `--write` with
torch 2.11 / safetensors on the H200 machine; tests/unit/test_safetensors.c
checks it (and runs this script itself where python3 has safetensors+torch).
The canonical values are exactly representable in every dtype used, and the
C test spells out the same values independently.
"""
import argparse
import math
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def canonical():
    return {
        "embed.f32": (torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5) * 0.25,
        "norm.bf16": torch.tensor([1.0, -2.5, 3.140625, 0.0078125, -0.0], dtype=torch.bfloat16),
        "half.f16": torch.tensor([[0.5, -1.0], [65504.0, 2.0**-24]], dtype=torch.float16),
        "double.f64": torch.tensor([math.pi, -1e300], dtype=torch.float64),
        "ids.i64": torch.tensor([-1, 2**40, 7], dtype=torch.int64),
        "pos.i32": torch.tensor([[-7], [2147483647]], dtype=torch.int32),
        "bytes.u8": torch.tensor([0, 1, 254, 255], dtype=torch.uint8),
        "scalar.f32": torch.tensor(42.0, dtype=torch.float32),
        "empty.f32": torch.zeros((0, 3), dtype=torch.float32),
        # Types colossal cannot write but must read:
        "mask.bool": torch.tensor([True, False, True]),
        "q.i8": torch.tensor([-128, 127], dtype=torch.int8),
    }


def same(a, b):
    """Bitwise: -0.0 differs from 0.0."""
    bits = lambda t: t.contiguous().reshape(-1).view(torch.uint8)
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and torch.equal(bits(a), bits(b))


def check(path):
    want = canonical()
    got = load_file(path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    if meta.get("format") != "pt":
        sys.exit(f"{path}: metadata {meta} lacks format=pt")
    if not got:
        sys.exit(f"{path}: no tensors")
    for name, t in got.items():
        if name not in want:
            sys.exit(f"{path}: unexpected tensor {name}")
        if not same(t, want[name]):
            sys.exit(f"{path}: tensor {name} differs: {t} vs {want[name]}")
    print(f"{path}: {len(got)} tensors match, metadata {meta}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write")
    ap.add_argument("--check", action="append", default=[])
    args = ap.parse_args()
    if args.write:
        save_file(canonical(), args.write, metadata={"format": "pt", "producer": "safetensors.torch"})
        check(args.write)
    for path in args.check:
        check(path)


if __name__ == "__main__":
    main()
