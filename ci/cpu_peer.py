"""The PyTorch CPU peer of `flux-lite bench kernels` on a software adapter
(lavapipe): the bench's linear and attention rows timed again with PyTorch
on the same CPU, in f32 (the tier lavapipe runs), with as many threads as
the machine has cores, and set beside the bench's own figures.

    python3 ci/cpu_peer.py --bench BENCH_OUTPUT [--repeats 3]

BENCH_OUTPUT holds what `flux-lite bench kernels` printed (`-` reads it
from standard input). Each linear row (`M×K · K×N`) is timed as
`F.linear(x [M, K], W [N, K])`, the attention row (`T tokens, H×D`) as
`scaled_dot_product_attention` over H heads of D on T tokens; each is the
median of the repeats after a warm-up, on the wall clock. Per row it prints
our time and GFLOP/s (as the bench printed them), PyTorch's, and our rate as
a share of PyTorch's, then the ceilings the bench measured in its run.

Rates count the bench's FLOPs: 2·M·K·N for a linear, 4·T²·H·D for attention
(its two products). The bench's weights are bf16 expanded to f32 in the
shader; PyTorch's are f32 tensors.

Prints one `skipped:` line and exits 0 where PyTorch is not installed.
"""

import argparse
import os
import re
import statistics
import sys
import time
import warnings

ROW = re.compile(r"^\|\s*(?P<what>[^|]+?)\s*\|\s*(?P<shape>[^|]+?)\s*\|\s*(?P<time>[^|]+?)\s*\|\s*(?P<gflops>[^|]+?)\s*\|\s*(?P<gbs>[^|]+?)\s*\|\s*(?P<bound>[^|]+?)\s*\|\s*(?P<share>[^|]+?)\s*\|\s*$")
LINEAR = re.compile(r"^(\d+)×(\d+) · (\d+)×(\d+)$")
ATTENTION = re.compile(r"^(\d+) tokens, (\d+)×(\d+)$")
UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}


def seconds(text):
    """`777.85 ms`, `4.64 s`, `12.3 µs` to seconds, or None."""
    m = re.fullmatch(r"([0-9.]+)\s*(s|ms|µs|us|ns)", text.strip())
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def parse_bench(text):
    """The bench's linear and attention rows and its header lines."""
    rows, header = [], {}
    for line in text.splitlines():
        for key in ("adapter", "precision", "times", "ceilings measured in this run"):
            if line.startswith(key + ": "):
                header[key] = line[len(key) + 2 :].strip()
        m = ROW.match(line)
        if not m or m["what"] == "what" or m["what"].startswith("---"):
            continue
        shape = m["shape"]
        row = {"what": m["what"], "shape": shape, "time": m["time"], "seconds": seconds(m["time"]), "gflops": m["gflops"], "bound": m["bound"], "share": m["share"]}
        if lm := LINEAR.match(shape):
            mm, k, k2, n = map(int, lm.groups())
            if k != k2:
                continue
            row.update(kind="linear", dims=(mm, k, n), flop=2 * mm * k * n)
        elif am := ATTENTION.match(shape):
            t, h, d = map(int, am.groups())
            row.update(kind="attention", dims=(t, h, d), flop=4 * t * t * h * d)
        else:
            continue
        rows.append(row)
    return rows, header


def measure(fn, repeats):
    """Median wall-clock seconds of `fn()` over `repeats` runs after a warm-up."""
    fn()
    times = []
    for _ in range(max(repeats, 1)):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def time_row(torch, row, repeats):
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(0)
    if row["kind"] == "linear":
        m, k, n = row["dims"]
        x = torch.randn(m, k, generator=gen)
        w = torch.randn(n, k, generator=gen) / k**0.5
        return measure(lambda: F.linear(x, w), repeats)
    t, h, d = row["dims"]
    q, k, v = (torch.randn(1, h, t, d, generator=gen) for _ in range(3))
    return measure(lambda: F.scaled_dot_product_attention(q, k, v), repeats)


def table(rows, header):
    def cell(x):
        return f"{x:.1f}" if x is not None else "–"

    def duration(s):
        return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"

    peak = None
    if m := re.search(r"FMA peak ([0-9.]+) GFLOP/s", header.get("ceilings measured in this run", "")):
        peak = float(m.group(1))
    lines = [
        "| what | shape | ours | ours GFLOP/s | ours % of bound | PyTorch | PyTorch GFLOP/s | PyTorch % of the bench's FMA peak | ours/PyTorch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        theirs = r["flop"] / r["peer"] / 1e9
        ratio = f"{r['peer'] / r['seconds'] * 100:.1f}%" if r["seconds"] else "–"
        of_peak = f"{theirs / peak * 100:.0f}%" if peak else "–"
        lines.append(f"| {r['what']} | {r['shape']} | {r['time']} | {r['gflops']} | {r['share']} ({r['bound']}) | {duration(r['peer'])} | {cell(theirs)} | {of_peak} | {ratio} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True, help="a file holding `flux-lite bench kernels` output, or - for standard input")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per row after a warm-up; the median is reported (default 3)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="PyTorch's threads (default: the machine's cores)")
    args = p.parse_args()
    text = sys.stdin.read() if args.bench == "-" else open(args.bench, encoding="utf-8").read()
    # torch warns on import where numpy is absent; nothing here uses numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch
    except ImportError:
        print("skipped: PyTorch is not installed here (pip install torch; test_vectors/requirements.txt pins the version)")
        return 0
    rows, header = parse_bench(text)
    if not rows:
        print(f"error: no linear or attention rows in {args.bench} (the output of flux-lite bench kernels --only linear,attention)", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    with torch.inference_mode():
        for r in rows:
            r["peer"] = time_row(torch, r, args.repeats)
    print(f"ours: {header.get('adapter', '?')}; {header.get('precision', '?')}; {header.get('times', '?')}")
    print(f"PyTorch: torch {torch.__version__} on the CPU, f32, {torch.get_num_threads()} threads of {os.cpu_count()} cores; F.linear and scaled_dot_product_attention; medians of {args.repeats} after a warm-up, wall clock")
    print(f"ceilings the bench measured: {header.get('ceilings measured in this run', 'none printed')}")
    print("ours/PyTorch: our rate as a share of PyTorch's (PyTorch's time over ours)")
    print()
    print(table(rows, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
