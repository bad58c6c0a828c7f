#!/usr/bin/env python3
"""Result collection and tables for bench/gpu_train.sh and bench/gpu_scaling.sh.

  gpu_report.py colossal --run-dir D --log L --smi F [fields...]   one JSON result line from a colossal-pretrain run
  gpu_report.py torch --log L --smi F [fields...]                  one JSON result line from torch_gpu_train.py
  gpu_report.py train RESULTS.jsonl                                 issue #10's table
  gpu_report.py scaling RESULTS.jsonl                               issue #9's table
  gpu_report.py nccl COLOSSAL_CHECK.log TORCH_NCCL.log              busbw side by side
  gpu_report.py skip [fields...]                                    a run the time budget left out

colossal-pretrain's own numbers: metrics.jsonl's "start" record (flops_per_token
= 6 N + 12 L T d, matmul_params N, peak_flops, tokens_per_step) and one "train"
record per step (step_s: wall time of the step including its data). tokens/s =
tokens_per_step / median step_s over the steps after --skip warm-up steps, the
same statistic torch_gpu_train.py reports. Peak device memory is not in
colossal's output (its "mem" is host RSS), so every run -- colossal and torch
alike -- is sampled with nvidia-smi (memory.used per GPU, CUDA context
included); colossal's planned device bytes come from its "memory plan" total.
Only the standard library is used.
"""
import json
import math
import re
import statistics
import sys


def kv_args(argv):
    """--key value pairs; --field k=v adds string/number fields."""
    out, extra = {}, {}
    i = 0
    while i < len(argv):
        k = argv[i]
        if not k.startswith("--") or i + 1 >= len(argv):
            sys.exit("gpu_report.py: expected --key value, got %r" % k)
        v = argv[i + 1]
        if k == "--field":
            name, _, val = v.partition("=")
            try:
                extra[name] = int(val)
            except ValueError:
                try:
                    extra[name] = float(val)
                except ValueError:
                    extra[name] = val
        else:
            out[k[2:].replace("-", "_")] = v
        i += 2
    return out, extra


def smi_peak(path, gpus):
    """Largest memory.used (MiB) over the run on each of the first `gpus`
    GPUs, from `nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms N`."""
    peak = {}
    try:
        with open(path) as f:
            for line in f:
                parts = [p.strip() for p in line.split(",")]
                if len(parts) < 2:
                    continue
                try:
                    idx, used = int(parts[0]), float(parts[1])
                except ValueError:
                    continue
                if idx < gpus:
                    peak[idx] = max(peak.get(idx, 0.0), used)
    except OSError:
        return None
    return [peak[k] for k in sorted(peak)] or None


def tail(path, n=6):
    try:
        with open(path, errors="replace") as f:
            lines = [l.rstrip() for l in f if l.strip()]
    except OSError:
        return ""
    # The first error line is the useful one; then the last lines.
    err = [l for l in lines if "error" in l.lower()][:2]
    return " | ".join(err + lines[-n:])[-600:]


def median_after(xs, skip):
    xs = xs[skip:] if len(xs) > skip else xs[-1:]
    return statistics.median(xs) if xs else float("nan"), len(xs)


def cmd_colossal(argv):
    a, extra = kv_args(argv)
    skip = int(a.get("skip", "3"))
    gpus = int(extra.get("gpus", 1))
    res = dict(extra)
    res["impl"] = res.get("impl", "colossal")
    start, steps = None, []
    try:
        with open(a["run_dir"] + "/metrics.jsonl") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("kind") == "start":
                    start = r
                elif r.get("kind") == "train":
                    steps.append(r)
    except OSError:
        pass
    log = ""
    try:
        with open(a["log"], errors="replace") as f:
            log = f.read()
    except OSError:
        pass
    m = re.search(r"^\s*total\s+([\d.]+) MiB\s+device \+ ([\d.]+) MiB host", log, re.M)
    if m:
        res["plan_device_mib"], res["plan_host_mib"] = float(m.group(1)), float(m.group(2))
    rss = [float(x) for x in re.findall(r"\| mem (\d+) MiB \|", log)]
    if rss:
        res["host_rss_mib"] = max(rss)
    peaks = smi_peak(a.get("smi", ""), gpus)
    if peaks:
        res["smi_peak_mib"] = max(peaks)
        res["smi_peak_per_gpu_mib"] = peaks
    rc = int(extra.get("rc", 0))
    if start is None or len(steps) < 2:
        res["status"] = "failed (rc %d): %s" % (rc, tail(a["log"]))
        print(json.dumps(res))
        return
    med, n = median_after([s["step_s"] for s in steps], skip)
    tps = start["tokens_per_step"] / med
    res.update(status="ok" if rc == 0 else "rc %d" % rc, ranks=start["ranks"], dp=start["dp"],
               params=start["params"], matmul_params=start["matmul_params"],
               flops_per_token=start["flops_per_token"], flops_per_token_6n=6.0 * start["matmul_params"],
               peak_flops=start["peak_flops"], tokens_per_step=start["tokens_per_step"], steps=len(steps),
               timed_steps=n, step_s_median=med, tokens_per_s=tps,
               mfu=tps * start["flops_per_token"] / start["peak_flops"],
               mfu_6n=tps * 6.0 * start["matmul_params"] / start["peak_flops"],
               loss_first=steps[0]["loss"], loss_last=steps[-1]["loss"])
    print(json.dumps(res))


def cmd_torch(argv):
    a, extra = kv_args(argv)
    res = None
    try:
        with open(a["log"], errors="replace") as f:
            for line in f:
                if line.startswith("RESULT "):
                    res = json.loads(line[7:])
    except OSError:
        pass
    rc = int(extra.get("rc", 0))
    out = dict(extra)
    if res is None:
        out.setdefault("impl", "torch")
        out["status"] = "failed (rc %d): %s" % (rc, tail(a["log"]))
        print(json.dumps(out))
        return
    res.update(out)
    res["status"] = "ok" if rc == 0 else "rc %d" % rc
    peaks = smi_peak(a.get("smi", ""), int(extra.get("gpus", 1)))
    if peaks:
        res["smi_peak_mib"] = max(peaks)
        res["smi_peak_per_gpu_mib"] = peaks
    print(json.dumps(res))


def cmd_skip(argv):
    _, extra = kv_args(argv)
    extra["status"] = "skipped: time budget"
    print(json.dumps(extra))


def load(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return rows


def ok(r):
    """A run with numbers: finished, or stopped by its timeout after enough
    steps (status "rc 124": the steps it did are still valid)."""
    return r is not None and bool(r.get("tokens_per_s")) and not str(r.get("status", "")).startswith(("failed",
                                                                                                    "skipped"))


def fmt_mem(r):
    parts = []
    if r.get("smi_peak_mib"):
        parts.append("%.1f" % (r["smi_peak_mib"] / 1024))
    else:
        parts.append("-")
    if r.get("peak_alloc_mib") is not None:
        parts.append("alloc %.1f" % (r["peak_alloc_mib"] / 1024))
    if r.get("plan_device_mib") is not None:
        parts.append("plan %.1f" % (r["plan_device_mib"] / 1024))
    return ", ".join(parts)


def pct(x):
    return "%.1f%%" % (100 * x) if x is not None and not math.isnan(x) else "-"


def cmd_train(argv):
    rows = [r for r in load(argv[0]) if r.get("bench") == "train"]
    models = []
    for r in rows:
        if r.get("model_name") not in models:
            models.append(r.get("model_name"))
    print("\n## One GPU: tokens/s, MFU (peak 989 TFLOP/s; 'MFU' = (6N + 12 L T d) per token, '6N' without the "
          "attention term), peak GPU memory in GiB (nvidia-smi memory.used incl. the CUDA context; torch: also "
          "max_memory_allocated; colossal: also its memory plan)\n")
    print("| model | batch | impl | tokens/s | MFU | MFU 6N | step ms | peak mem GiB | colossal / this | status |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in models:
        one = [r for r in rows if r.get("model_name") == m and r.get("gpus", 1) == 1]
        col = next((r for r in one if r.get("impl") == "colossal"), None)
        for r in one:
            ratio = "-"
            if ok(col) and ok(r) and r is not col:
                ratio = "%.2fx" % (col["tokens_per_s"] / r["tokens_per_s"])
            print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                m, r.get("batch", "-"), r.get("impl"),
                "%.0f" % r["tokens_per_s"] if ok(r) else "-", pct(r.get("mfu")) if ok(r) else "-",
                pct(r.get("mfu_6n")) if ok(r) else "-",
                "%.1f" % (1e3 * r["step_s_median"]) if ok(r) else "-", fmt_mem(r), ratio,
                r.get("status", "?")[:160]))
    # Same model on both sides: the FLOPs per token (from each side's own
    # parameter count) must agree.
    for m in models:
        f = {r.get("impl"): r.get("flops_per_token") for r in rows
             if r.get("model_name") == m and ok(r) and r.get("flops_per_token")}
        if "colossal" in f:
            for impl, v in f.items():
                if abs(v - f["colossal"]) > 1e-3 * f["colossal"]:
                    print("\nWARNING: %s: %s counts %.6g FLOPs per token, colossal %.6g: not the same model"
                          % (m, impl, v, f["colossal"]))
    goals = []
    for m in models:
        one = [r for r in rows if r.get("model_name") == m and r.get("gpus", 1) == 1]
        col = next((r for r in one if r.get("impl") == "colossal"), None)
        comp = next((r for r in one if r.get("impl") == "torch-compile"), None)
        eag = next((r for r in one if r.get("impl") == "torch-eager"), None)
        if ok(col):
            s = "%s: colossal %.0f tokens/s, MFU %s" % (m, col["tokens_per_s"], pct(col["mfu"]))
            if ok(comp):
                s += "; / torch.compile %.2fx (goal >= 1.25x)" % (col["tokens_per_s"] / comp["tokens_per_s"])
            if ok(eag):
                s += "; / eager %.2fx" % (col["tokens_per_s"] / eag["tokens_per_s"])
            goals.append(s)
        # VARIANTS: each against the plain colossal run and torch.compile.
        for v in one:
            if not (ok(v) and ok(col) and v.get("impl", "").startswith("colossal-")):
                continue
            s = "%s: %s %.0f tokens/s = %.3fx colossal" % (m, v["impl"], v["tokens_per_s"],
                                                            v["tokens_per_s"] / col["tokens_per_s"])
            if ok(comp):
                s += ", %.2fx torch.compile" % (v["tokens_per_s"] / comp["tokens_per_s"])
            goals.append(s)
    if goals:
        print()
        for g in goals:
            print("- " + g)
    dp = [r for r in rows if r.get("gpus", 1) > 1]
    if dp:
        print("\n## Data parallel, same per-GPU batch: speedup over one GPU (goal >= 1.95x on 2)\n")
        print("| model | impl | GPUs | ZeRO | tokens/s | per GPU | MFU | peak mem GiB/GPU | speedup vs 1 GPU | status |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in dp:
            base_impl = "colossal" if r.get("impl", "").startswith("colossal") else r.get("base_impl", "torch-eager")
            base = next((b for b in rows if b.get("model_name") == r.get("model_name") and b.get("gpus", 1) == 1
                         and b.get("impl") == base_impl and ok(b)), None)
            sp = "%.2fx (vs %s)" % (r["tokens_per_s"] / base["tokens_per_s"], base_impl) if ok(r) and base else "-"
            print("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
                r.get("model_name"), r.get("impl"), r.get("gpus"), r.get("zero", "-"),
                "%.0f" % r["tokens_per_s"] if ok(r) else "-",
                "%.0f" % (r["tokens_per_s"] / r["gpus"]) if ok(r) else "-", pct(r.get("mfu")) if ok(r) else "-",
                fmt_mem(r), sp, r.get("status", "?")[:160]))


def cmd_scaling(argv):
    rows = [r for r in load(argv[0]) if r.get("bench") == "scaling"]
    print("\n## Scaling at fixed per-GPU batch: tokens/s (all GPUs), MFU, peak memory per GPU (GiB, nvidia-smi; "
          "plan = colossal's memory plan), efficiency = tokens/s / (GPUs x the 1-GPU tokens/s) against the same "
          "ZeRO stage on 1 GPU and against stage 0 on 1 GPU\n")
    print("| model | ZeRO | GPUs | tokens/s | per GPU | MFU | MFU 6N | step ms | peak mem GiB/GPU | eff. (same stage) "
          "| eff. (vs stage 0) | status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def base(stage):
            return next((b for b in rows if b.get("model_name") == r.get("model_name") and b.get("gpus") == 1
                         and str(b.get("zero")) == stage and ok(b)), None)
        b_same, b0 = base(str(r.get("zero"))), base("0")

        def eff(b):
            if not (ok(r) and b):
                return "-"
            return "%.1f%%" % (100 * r["tokens_per_s"] / (r["gpus"] * b["tokens_per_s"]))
        print("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r.get("model_name"), r.get("zero"), r.get("gpus"),
            "%.0f" % r["tokens_per_s"] if ok(r) else "-",
            "%.0f" % (r["tokens_per_s"] / r["gpus"]) if ok(r) else "-",
            pct(r.get("mfu")) if ok(r) else "-", pct(r.get("mfu_6n")) if ok(r) else "-",
            "%.0f" % (1e3 * r["step_s_median"]) if ok(r) else "-", fmt_mem(r), eff(b_same), eff(b0),
            r.get("status", "?")[:160]))


ROW = re.compile(r"^\s+(allreduce|allgather|reducescatter|alltoall)\s+(\d+)\s+(\d+)\s+f32\s+([\d.]+)\s+([\d.]+)"
                 r"\s+([\d.]+)\s+(.*)$")


def parse_table(path):
    rows, axis = {}, None
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = re.match(r"# axis (\w+):", line)
                if m:
                    axis = m.group(1)
                m = ROW.match(line)
                if m and (axis in (None, "dp", "world")):
                    rest = m.group(7).split()
                    sync_bus = float(rest[-1]) if len(rest) >= 4 else None
                    rows.setdefault((m.group(1), int(m.group(2))),
                                    (float(m.group(4)), float(m.group(6)), sync_bus))
    except OSError:
        pass
    return rows


def cmd_nccl(argv):
    col, tor = parse_table(argv[0]), parse_table(argv[1])
    if not col and not tor:
        print("(no collective tables found)")
        return
    print("\n## Collective bus bandwidth (GB/s, f32, nccl-tests' busbw): colossal-check --bench (dp axis) vs "
          "PyTorch NCCL; torch 'queued' = calls queued, one sync (nccl-tests), 'per-call sync' = wait for each "
          "call (what a blocking collective costs)\n")
    print("| op | size | colossal us | colossal busbw | torch queued busbw | torch per-call sync busbw | "
          "colossal / torch queued | colossal / torch sync |")
    print("|---|---|---|---|---|---|---|---|")
    big = {}
    for key in sorted(set(col) | set(tor), key=lambda k: (k[0], k[1])):
        c, t = col.get(key), tor.get(key)
        r1 = c[1] / t[1] if c and t and t[1] > 0 else None
        r2 = c[1] / t[2] if c and t and t[2] else None
        if key[1] >= 64 << 20 and r1:
            big.setdefault(key[0], []).append(r1)
        size = "%d KiB" % (key[1] >> 10) if key[1] < 1 << 20 else "%d MiB" % (key[1] >> 20)
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            key[0], size, "%.1f" % c[0] if c else "-", "%.3g" % c[1] if c else "-", "%.3g" % t[1] if t else "-",
            "%.3g" % t[2] if t and t[2] else "-", "%.2f" % r1 if r1 else "-", "%.2f" % r2 if r2 else "-"))
    for op, rs in big.items():
        print("- %s at >= 64 MiB: colossal / torch busbw %.2f (goal >= 0.95)" % (op, statistics.mean(rs)))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd, argv = sys.argv[1], sys.argv[2:]
    {"colossal": cmd_colossal, "torch": cmd_torch, "train": cmd_train, "scaling": cmd_scaling,
     "nccl": cmd_nccl, "skip": cmd_skip}.get(cmd, lambda _: sys.exit(__doc__))(argv)


if __name__ == "__main__":
    main()
