#!/usr/bin/env python3
"""Loss curve of a colossal-pretrain run: metrics.jsonl -> PNG.

    scripts/plot_metrics.py RUN_DIR/metrics.jsonl [-o loss.png] [--smooth N]

Plots the training loss per step (raw and a moving average) and the
validation loss. Uses matplotlib when it is installed; otherwise draws the
same chart with a small built-in PNG writer (standard library only), so it
works on a bare cluster login node. Several metrics files may be given to
compare runs (one colour each).
"""
import argparse
import json
import math
import os
import struct
import sys
import zlib


class MetricsError(Exception):
    """A metrics file that cannot be read, with its file (and line)."""


def _number(path, n, rec, key):
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MetricsError(f"{path}:{n}: '{key}' is {json.dumps(v)[:40]}, not a number")
    if not math.isfinite(v):
        raise MetricsError(f"{path}:{n}: '{key}' is {v}, not a finite number")
    return v


def read_metrics(path):
    train, evals = [], []
    try:
        f = open(path, "rb")
    except OSError as e:
        raise MetricsError(f"{path}: cannot read it: {e.strerror}") from None
    with f:
        lines = f.read().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, raw in enumerate(lines):
        n = i + 1
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            if i == last:
                # The run may still be writing its last line.
                print(f"{path}:{n}: skipping the last line, which is not complete JSON", file=sys.stderr)
                continue
            raise MetricsError(f"{path}:{n}: not a JSON record ({e})") from None
        if not isinstance(rec, dict):
            raise MetricsError(f"{path}:{n}: a JSON {type(rec).__name__}, not a record object")
        if rec.get("kind") == "train":
            train.append((_number(path, n, rec, "step"), _number(path, n, rec, "loss")))
        elif rec.get("kind") == "eval":
            evals.append((_number(path, n, rec, "step"), _number(path, n, rec, "val_loss")))
    return train, evals


def moving_average(points, n):
    out, acc = [], []
    for step, v in points:
        acc.append(v)
        if len(acc) > n:
            acc.pop(0)
        out.append((step, sum(acc) / len(acc)))
    return out


COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14)]


def plot_matplotlib(runs, out, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for i, (label, train, smooth, evals) in enumerate(runs):
        c = tuple(x / 255 for x in COLOURS[i % len(COLOURS)])
        if train:
            ax.plot(*zip(*train), color=c, alpha=0.25, linewidth=0.8)
            ax.plot(*zip(*smooth), color=c, linewidth=1.6, label=f"{label} train")
        if evals:
            ax.plot(*zip(*evals), "o--", color=c, markersize=4, label=f"{label} val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)


# ------------------------------------------------------------------ fallback
# A 5x7 bitmap font for the characters the chart needs (rows top to bottom,
# 5 bits each, most significant bit leftmost).
FONT = {
    "0": [14, 17, 19, 21, 25, 17, 14], "1": [4, 12, 4, 4, 4, 4, 14], "2": [14, 17, 1, 2, 4, 8, 31],
    "3": [30, 1, 1, 14, 1, 1, 30], "4": [2, 6, 10, 18, 31, 2, 2], "5": [31, 16, 30, 1, 1, 17, 14],
    "6": [6, 8, 16, 30, 17, 17, 14], "7": [31, 1, 2, 4, 8, 8, 8], "8": [14, 17, 17, 14, 17, 17, 14],
    "9": [14, 17, 17, 15, 1, 2, 12], ".": [0, 0, 0, 0, 0, 12, 12], "-": [0, 0, 0, 14, 0, 0, 0],
    "+": [0, 4, 4, 31, 4, 4, 0], " ": [0] * 7, "e": [0, 0, 14, 17, 31, 16, 14], "k": [16, 16, 18, 20, 24, 20, 18],
    "s": [0, 0, 15, 16, 14, 1, 30], "t": [8, 8, 28, 8, 8, 9, 6], "p": [0, 0, 30, 17, 30, 16, 16],
    "l": [12, 4, 4, 4, 4, 4, 14], "o": [0, 0, 14, 17, 17, 17, 14], "r": [0, 0, 22, 25, 16, 16, 16],
    "a": [0, 0, 14, 1, 15, 17, 15], "i": [4, 0, 12, 4, 4, 4, 14], "n": [0, 0, 22, 25, 17, 17, 17],
    "v": [0, 0, 17, 17, 17, 10, 4], "(": [2, 4, 8, 8, 8, 4, 2], ")": [8, 4, 2, 2, 2, 4, 8],
    "/": [1, 1, 2, 4, 8, 16, 16], "_": [0, 0, 0, 0, 0, 0, 31], ":": [0, 12, 12, 0, 12, 12, 0],
}


class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray([255]) * (w * h * 3)

    def set(self, x, y, c, alpha=1.0):
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            for k in range(3):
                self.px[i + k] = int(self.px[i + k] * (1 - alpha) + c[k] * alpha)

    def line(self, x0, y0, x1, y1, c, alpha=1.0, width=1):
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            for o in range(width):
                self.set(x0, y0 + o, c, alpha)
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, c=(0, 0, 0), scale=1):
        for ch in s:
            rows = FONT.get(ch, FONT[" "])
            for r, bits in enumerate(rows):
                for col in range(5):
                    if bits & (1 << (4 - col)):
                        for a in range(scale):
                            for b in range(scale):
                                self.set(x + col * scale + a, y + r * scale + b, c)
            x += 6 * scale

    def png(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(tag, data):
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n")
            f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)))
            f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
            f.write(chunk(b"IEND", b""))


def nice_ticks(lo, hi, n=5):
    span = hi - lo if hi > lo else 1.0
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    first = math.ceil(lo / step) * step
    ticks, t = [], first
    while t <= hi + 1e-9 * span:
        ticks.append(t)
        t += step
    return ticks


def fmt_tick(v):
    if abs(v) >= 10000:
        return f"{v / 1000:g}k"
    return f"{v:.6g}"


def plot_fallback(runs, out):
    W, H, L, R, T, B = 800, 500, 70, 20, 30, 50
    cv = Canvas(W, H)
    pts = [p for _, tr, _, ev in runs for p in tr + ev]
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    pad = (y1 - y0) * 0.05 or 0.5
    y0, y1 = y0 - pad, y1 + pad

    def X(s):
        return L + (s - x0) / (x1 - x0) * (W - L - R)

    def Y(v):
        return H - B - (v - y0) / (y1 - y0) * (H - T - B)

    grey, black = (220, 220, 220), (0, 0, 0)
    for t in nice_ticks(y0, y1):
        cv.line(L, Y(t), W - R, Y(t), grey)
        s = fmt_tick(t)
        cv.text(L - 6 - 6 * len(s), int(Y(t)) - 3, s)
    for t in nice_ticks(x0, x1):
        cv.line(X(t), T, X(t), H - B, grey)
        s = fmt_tick(t)
        cv.text(int(X(t)) - 3 * len(s), H - B + 8, s)
    cv.line(L, T, L, H - B, black)
    cv.line(L, H - B, W - R, H - B, black)
    cv.text(W // 2 - 12, H - 20, "step")
    cv.text(8, T - 20, "loss")
    for i, (label, train, smooth, evals) in enumerate(runs):
        c = COLOURS[i % len(COLOURS)]
        for (a, b) in zip(train, train[1:]):
            cv.line(X(a[0]), Y(a[1]), X(b[0]), Y(b[1]), c, alpha=0.25)
        for (a, b) in zip(smooth, smooth[1:]):
            cv.line(X(a[0]), Y(a[1]), X(b[0]), Y(b[1]), c, width=2)
        for s, v in evals:
            for dx in range(-3, 4):
                for dy in range(-3, 4):
                    if dx * dx + dy * dy <= 9:
                        cv.set(int(X(s)) + dx, int(Y(v)) + dy, c)
        # Legend: the smoothed train line and the val dot, numbered by run
        # when there are several (the font has no capitals).
        ly = T + 6 + 14 * i
        tag = "" if len(runs) == 1 else f"{i + 1} "
        cv.line(W - R - 150, ly + 3, W - R - 130, ly + 3, c, width=2)
        cv.text(W - R - 124, ly, tag + "train")
        for dx in range(-3, 4):
            for dy in range(-3, 4):
                if dx * dx + dy * dy <= 9:
                    cv.set(W - R - 60 + dx, ly + 3 + dy, c)
        cv.text(W - R - 52, ly, "val")
    cv.png(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics", nargs="+", help="metrics.jsonl of one or more runs")
    ap.add_argument("-o", "--output", default=None, help="PNG to write (default: loss.png next to the first file)")
    ap.add_argument("--smooth", type=int, default=0, help="moving-average window (default: steps/50, at least 1)")
    ap.add_argument("--fallback", action="store_true", help="use the built-in PNG writer even if matplotlib exists")
    args = ap.parse_args()

    runs = []
    for path in args.metrics:
        try:
            train, evals = read_metrics(path)
        except MetricsError as e:
            sys.exit(f"plot_metrics.py: {e}")
        if not train and not evals:
            sys.exit(f"{path}: no train or eval records")
        n = args.smooth or max(1, len(train) // 50)
        label = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        runs.append((label, train, moving_average(train, n), evals))
    out = args.output or os.path.join(os.path.dirname(os.path.abspath(args.metrics[0])), "loss.png")

    how = "built-in PNG writer"
    if not args.fallback:
        try:
            plot_matplotlib(runs, out, ", ".join(r[0] for r in runs))
            how = "matplotlib"
        except ImportError:
            plot_fallback(runs, out)
    else:
        plot_fallback(runs, out)
    for label, train, _, evals in runs:
        last = f"final train loss {train[-1][1]:.4f}" if train else "no train records"
        val = f", val loss {evals[-1][1]:.4f}" if evals else ""
        print(f"{label}: {len(train)} steps, {last}{val}")
    print(f"wrote {out} ({how})")


if __name__ == "__main__":
    main()
