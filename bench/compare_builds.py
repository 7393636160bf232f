#!/usr/bin/env python3
"""bench/compare_builds.py: two builds of the `fp8kit` command, side by side in one run.

Runs `fp8kit bench gemm --quick --json`, `fp8kit bench quantize --quick --json` and `fp8kit train`
(tokens/s per recipe) of a base build and a new build, interleaved (A B, then B A, ...) so that
drift of the machine falls on both alike, and prints per row the best (fastest) of the rounds -
on a shared machine interference only adds time, so the minimum is the estimate least moved by
it - and new/base as a speed ratio (> 1: the new build is faster). The peers inside the benchmarks
(OpenBLAS, oneDNN, memcpy, the read stream) are the same code in both builds: their ratios show
the run's noise, the floor under which a difference means nothing. Each benchmark checks its own
results (rel_err, verify); a failing run stops the comparison.

    python3 bench/compare_builds.py BASE/fp8kit NEW/fp8kit [--rounds 5] [--train-steps 40]

Used for docs/PERF.md ("Comparing two builds"); not run by ctest (speed is never asserted in tests).
"""
import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile

# The fields that name a row of `fp8kit bench ... --json` (the rest are measurements).
KEY_FIELDS = ("bench", "impl", "op", "dtype", "scaling", "cache", "shape", "m", "n", "k")
PEERS = ("openblas", "onednn", "memcpy", "read_bw", "impl=read ", "fma_peak", "dot_bf16_peak")
# fp8kit train's table: recipe, final loss, gap to f32, then (builds with --seeds) its +- and the
# per-seed gaps, "-" with one seed, then tokens/s.
TRAIN_ROW = re.compile(r"^(\w+)\s+[\d.]+\s+[+-][\d.]+%\s+(?:\S+\s+\S+\s+)?(\d+)\s")


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"compare_builds: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def bench_rows(fp8kit, name):
    """{row name: (seconds or 1/gflops-like cost, higher-is-better flag)} of one bench run."""
    rows = {}
    for line in run([fp8kit, "bench", name, "--quick", "--json"]).splitlines():
        r = json.loads(line)
        key = " ".join(f"{f}={r[f]}" for f in KEY_FIELDS if f in r and f != "bench")
        if "seconds" in r:
            rows[f"{name}: {key}"] = r["seconds"]        # cost: lower is better
        elif "gflops" in r:
            rows[f"{name}: {key}"] = 1.0 / r["gflops"]   # the FMA peak: a cost per flop
        if "memcpy_gbps" in r:                            # the quantize rows' own memcpy peer
            rows[f"{name}: memcpy beside {key}"] = r["bytes"] / (r["memcpy_gbps"] * 1e9)
    return rows


def train_rows(fp8kit, steps):
    with tempfile.TemporaryDirectory() as out:
        # One seed, one run at a time: the rows time a recipe alone, not runs sharing the cores.
        # A build from before --seeds ran just that by default and refuses the flags (exit 2).
        cmd = [fp8kit, "train", "--steps", str(steps), "--out", out]
        done = subprocess.run(cmd[:2] + ["--seeds", "1", "--jobs", "1"] + cmd[2:], capture_output=True, text=True,
                              check=False)
        text = done.stdout if done.returncode == 0 else run(cmd)
    rows = {}
    for line in text.splitlines():
        m = TRAIN_ROW.match(line)
        if m:
            rows[f"train: {m.group(1)} (1/tokens per s)"] = 1.0 / int(m.group(2))
    if not rows:
        sys.exit("compare_builds: no tokens/s table in the output of fp8kit train")
    return rows


def measure(fp8kit, steps):
    rows = bench_rows(fp8kit, "gemm")
    rows.update(bench_rows(fp8kit, "quantize"))
    rows.update(train_rows(fp8kit, steps))
    return rows


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
    except OSError:
        return platform.processor() or "unknown"
    name = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", info, re.M)
    isa = [f for f in (flags.group(1).split() if flags else [])
           if f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16")]
    return f"{name.group(1) if name else 'unknown'} ({' '.join(isa)})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--train-steps", type=int, default=40)
    a = ap.parse_args()
    if a.rounds < 1 or a.train_steps < 5:
        sys.exit("compare_builds: --rounds must be >= 1 and --train-steps >= 5 (tokens/s excludes warm-up steps)")
    results = {a.base: [], a.new: []}
    for r in range(a.rounds):
        order = (a.base, a.new) if r % 2 == 0 else (a.new, a.base)
        for exe in order:
            results[exe].append(measure(exe, a.train_steps))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    best = {exe: {} for exe in results}
    for exe, runs in results.items():
        for key in runs[0]:
            best[exe][key] = min(run_[key] for run_ in runs if key in run_)
    print(f"CPU: {cpu_model()}; {a.rounds} rounds, interleaved; best of the rounds; "
          "new/base = base cost / new cost")
    print(f"base: {a.base}\nnew:  {a.new}\n")
    print("| row | base | new | new/base |\n|---|---|---|---|")
    ours, peers = [], []
    for key, base_cost in best[a.base].items():
        if key not in best[a.new]:
            print(f"| {key} | {base_cost:.4g} | (absent) | |")
            continue
        ratio = base_cost / best[a.new][key]
        (peers if any(p in key for p in PEERS) else ours).append(ratio)
        print(f"| {key} | {base_cost:.4g} | {best[a.new][key]:.4g} | {ratio:.3f} |")
    for key in best[a.new]:
        if key not in best[a.base]:
            print(f"| {key} | (absent) | {best[a.new][key]:.4g} | |")
    print(f"\nfp8kit rows: new/base from {min(ours):.3f} to {max(ours):.3f}, geometric mean "
          f"{statistics.geometric_mean(ours):.3f}")
    if peers:
        print(f"peer rows (same code in both builds: the noise): {min(peers):.3f} to {max(peers):.3f}")


if __name__ == "__main__":
    main()
