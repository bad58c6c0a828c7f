#!/usr/bin/env python3
"""PyTorch/NCCL collective bandwidth, for comparison with
`colossal-check --bench --device cuda` (bench/gpu_scaling.sh, issue #9).

    python3 -m torch.distributed.run --nproc_per_node 4 bench/torch_nccl_bench.py [--max-bytes 256M --factor 4]

The same measurement as colossal-check's (src/cluster/bench.c) and
nccl-tests': f32 buffers; for each collective and total message size S
(nccl-tests' S: the all-reduce buffer, the all-gather's gathered output, the
reduce-scatter's input), `warmup` untimed calls, a barrier, `iters` timed
calls, mean time per call, the slowest rank's. The iteration counts scale
down above 16 MiB exactly as colossal-check's do (iters x 16 MiB / S, at
least 2 timed and 1 warm-up). busbw = algbw x 2(n-1)/n for all-reduce,
x (n-1)/n for all-gather and reduce-scatter (nccl-tests' definition).

Two timings per row: `time(us)` lets the calls queue on the stream and
synchronises once at the end (what nccl-tests reports); `sync(us)` waits for
each call before issuing the next, which is what a caller of a blocking
collective -- colossal-check's cai_allreduce etc. -- sees. The table has
colossal-check's columns, so bench/gpu_report.py can pair the rows.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

FULL_ITERS_BYTES = 16 << 20


def parse_size(s):
    s = s.strip().upper().replace("IB", "").replace("B", "")
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mul)


def scaled(n, nbytes, floor_n):
    if nbytes <= FULL_ITERS_BYTES or n <= floor_n:
        return n
    return max(floor_n, int(n * FULL_ITERS_BYTES / nbytes))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-bytes", default="1K")
    ap.add_argument("--max-bytes", default="256M")
    ap.add_argument("--factor", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ops", default="allreduce,allgather,reducescatter")
    ap.add_argument("--device", default="cuda", help="cuda (NCCL) or cpu (gloo, for checking the script)")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if world < 2:
        sys.exit("torch_nccl_bench.py: launch with python3 -m torch.distributed.run --nproc_per_node N (N >= 2)")
    if cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    n = world
    ops = [o.strip().replace("_", "") for o in a.ops.split(",") if o.strip()]
    sizes, s = [], parse_size(a.min_bytes)
    while s <= parse_size(a.max_bytes):
        sizes.append(s)
        s *= a.factor

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def bench(op, nbytes):
        elems = nbytes // 4
        per = 1 if op == "allreduce" else n
        count = max(1, elems // per)
        total = count * per
        send = torch.arange(total if op != "allgather" else count, dtype=torch.float32, device=dev) % 7 + rank
        recv = torch.empty(count if op == "reducescatter" else total, dtype=torch.float32, device=dev)
        if op == "allreduce":
            call = lambda: dist.all_reduce(send)  # noqa: E731
        elif op == "allgather":
            call = lambda: dist.all_gather_into_tensor(recv, send)  # noqa: E731
        elif op == "reducescatter":
            call = lambda: dist.reduce_scatter_tensor(recv, send)  # noqa: E731
        else:
            raise SystemExit("unknown collective %s (allreduce, allgather, reducescatter)" % op)
        warm, iters = scaled(a.warmup, total * 4, 1), scaled(a.iters, total * 4, 2)
        res = []
        for each in (False, True):
            for _ in range(warm):
                call()
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
                if each:
                    sync()
            sync()
            t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64,
                             device=dev if cuda else "cpu")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            res.append(t.item())
        factor = 2.0 * (n - 1) / n if op == "allreduce" else (n - 1) / n
        return total * 4, count, res[0], res[1], factor

    if rank == 0:
        print("torch NCCL bench: %d ranks, torch %s, nccl %s, dtype f32, warmup %d, iters %d (fewer above 16 MiB), "
              "sizes %d..%d B x%d" % (n, torch.__version__,
                                      ".".join(map(str, torch.cuda.nccl.version())) if cuda else "(gloo)",
                                      a.warmup, a.iters, sizes[0], sizes[-1], a.factor))
        print("# op                 size(B)        count  type    time(us)  algbw(GB/s)  busbw(GB/s)  transport"
              "       sync(us)  sync busbw")
    for op in ops:
        for s in sizes:
            nbytes, count, t, ts, factor = bench(op, s)
            if rank == 0:
                alg = nbytes / t / 1e9
                print("  %-13s %12d %12d   f32  %10.2f  %11.3f  %11.3f  torch %-6s  %10.2f  %10.3f"
                      % (op, nbytes, count, t * 1e6, alg, alg * factor, "NCCL" if cuda else "gloo", ts * 1e6,
                         nbytes / ts / 1e9 * factor), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
