#!/usr/bin/env python3
"""bench/bench_torch.py: fp8kit's FP8 Linear from PyTorch beside PyTorch's own, in one process, on
the same weights and inputs, at the same threads.

    .venv/bin/python3 bench/bench_torch.py [--quick] [--json] [--threads 2]

Rows, per Linear shape y[M, N] = x[M, K] W[N, K]^T + b (x float32):
  torch.f32           nn.Linear in float32
  torch.bf16          nn.Linear in bfloat16 (x and W bfloat16, as a bf16 model runs)
  torch.scaled_mm     torch._scaled_mm on e4m3 tensorwise codes: x's amax, scale and cast every
                      call (dynamic scaling, as torchao's float8 inference does), W quantized once
  fp8kit.<recipe>     fp8kit.torch.quantize_ (rowwise, tensorwise): W quantized and packed once,
                      x cast inside the GEMM
Columns: gflops = 2 M N K / seconds (the best call; for M <= 16 each call after reading 256 MiB,
so the weights come from memory); vs_f32 = gflops / torch.f32's; sqnr_db = 10 log10
(sum y64^2 / sum (y - y64)^2) against the float64 product of the float32 x and W (every row checks
its result: a wrong kernel shows as a low SQNR). Plus call_overhead_us: the best time of one
call on a 16 x 16 layer at M = 1, where the arithmetic is negligible: what a call costs from
Python, fp8kit's Float8Linear beside nn.Linear.

Shapes: M in {1, 16, 128, 2048} x (N, K) in {(4096, 4096), (11008, 4096), (4096, 11008)};
--quick: M in {1, 16, 128} x (4096, 4096) (~1 minute on 2 cores). Results: docs/PERF.md.
Not run by the tests (speed is never asserted in tests).
"""
import argparse
import copy
import json
import math
import time

import numpy as np
import torch

import fp8kit
import fp8kit.torch as f8
from compare_builds import cpu_model  # beside this file

E4M3_MAX = 448.0


FLUSH = None  # read before each memory-bound call (M <= 16): larger than the last-level cache


def best_seconds(call, budget, flush=False):
    """The fastest of repeated calls (after one warm-up) within `budget` seconds, at least 5: on a
    shared machine interference only adds time. flush: read 256 MiB before each call, so the
    weights come from memory, as in a model larger than the caches."""
    global FLUSH
    if flush and FLUSH is None:
        # numpy reads on one thread: a torch read could leave torch's OpenMP team spinning on
        # both cores when the next, timed call starts another runtime's team (fp8kit's).
        FLUSH = np.ones(64 << 20, np.float32)
    call()
    best, calls = math.inf, 0
    start = time.perf_counter()
    while calls < 5 or time.perf_counter() - start < budget:
        if flush:
            FLUSH.sum()
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
        calls += 1
    return best


def sqnr_db(y, ref):
    err = (y.double() - ref).pow(2).sum().item()
    return math.inf if err == 0 else 10 * math.log10(ref.pow(2).sum().item() / err)


def scaled_mm_linear(linear):
    """y = x W^T + b through torch._scaled_mm: W quantized once (tensorwise e4m3), x every call."""
    w = linear.weight.detach()
    w_scale = E4M3_MAX / w.abs().max()
    w8 = (w * w_scale).to(torch.float8_e4m3fn).t()  # [K, N] column-major, as _scaled_mm wants
    w_scale_inv = (1 / w_scale).float()
    bias = linear.bias.detach().to(torch.bfloat16)

    def forward(x):
        scale = E4M3_MAX / x.abs().max().clamp(min=1e-12)
        x8 = (x * scale).to(torch.float8_e4m3fn)
        return torch._scaled_mm(x8, w8, (1 / scale).float(), w_scale_inv, bias=bias, out_dtype=torch.float32)
    return forward


def run_shape(m, n, k, budget, rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(k, n)
    x = torch.randn(m, k)
    ref = x.double() @ linear.weight.detach().double().T + linear.bias.detach().double()
    impls = {"torch.f32": linear}
    bf16 = copy.deepcopy(linear).to(torch.bfloat16)
    x_bf16 = x.to(torch.bfloat16)
    impls["torch.bf16"] = lambda _x: bf16(x_bf16)
    impls["torch.scaled_mm"] = scaled_mm_linear(linear)
    for recipe in ("rowwise", "tensorwise"):
        model = torch.nn.Sequential(torch.nn.Linear(k, n))
        model.load_state_dict({"0.weight": linear.weight, "0.bias": linear.bias})
        f8.quantize_(model, recipe)
        impls["fp8kit." + recipe] = model
    base = None
    with torch.no_grad():
        for name, f in impls.items():
            s = best_seconds(lambda f=f: f(x), budget, flush=m <= 16)
            gflops = 2 * m * n * k / s * 1e-9
            base = base or gflops
            rows.append({"bench": "torch", "impl": name, "m": m, "n": n, "k": k, "threads": torch.get_num_threads(),
                         "seconds": s, "gflops": round(gflops, 3), "vs_f32": round(gflops / base, 3),
                         "sqnr_db": round(sqnr_db(f(x), ref), 2)})


def call_overhead(budget, rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 16)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    model.load_state_dict({"0.weight": linear.weight, "0.bias": linear.bias})
    f8.quantize_(model)
    x = torch.randn(1, 16)
    with torch.no_grad():
        for name, f in (("torch.f32", linear), ("fp8kit.rowwise", model)):
            s = best_seconds(lambda f=f: f(x), budget)
            rows.append({"bench": "torch", "impl": name, "m": 1, "n": 16, "k": 16, "threads": torch.get_num_threads(),
                         "call_overhead_us": round(s * 1e6, 2)})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    fp8kit.set_num_threads(a.threads)
    if a.quick:
        shapes = [(m, 4096, 4096) for m in (1, 16, 128)]
    else:
        shapes = [(m, n, k) for n, k in ((4096, 4096), (11008, 4096), (4096, 11008)) for m in (1, 16, 128, 2048)]
    budget = 0.3 if a.quick else 1.0
    rows = []
    for m, n, k in shapes:
        run_shape(m, n, k, budget, rows)
    call_overhead(budget, rows)
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"fp8kit bench torch: torch {torch.__version__}, fp8kit {fp8kit.__version__}, {a.threads} threads, "
          f"{cpu_model()}")
    print("| impl | M | N | K | GFLOP/s | vs f32 | SQNR dB | call us |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['impl']} | {r['m']} | {r['n']} | {r['k']} | {r.get('gflops', '')} | {r.get('vs_f32', '')} | "
              f"{r.get('sqnr_db', '')} | {r.get('call_overhead_us', '')} |")


if __name__ == "__main__":
    main()
