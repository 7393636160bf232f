#!/usr/bin/env python3
"""bench/bench_torch.py: fp8kit's FP8 Linear from PyTorch beside PyTorch's own, in one process, on
the same weights and inputs, at the same threads.

    .venv/bin/python3 bench/bench_torch.py [--quick] [--json] [--threads 2] [--flush team|one-thread]
                                           [--shapes MxNxK,...]

Rows, per Linear shape y[M, N] = x[M, K] W[N, K]^T + b (x float32):
  torch.f32           nn.Linear in float32
  torch.bf16          nn.Linear in bfloat16 (x and W bfloat16, as a bf16 model runs)
  torch.scaled_mm     torch._scaled_mm on e4m3 tensorwise codes: x's amax, scale and cast every
                      call (dynamic scaling, as torchao's float8 inference does), W quantized once
  torchao.f8wo       torchao quantize_(Float8WeightOnlyConfig()) (the seed projects, where installed:
  quanto.qfloat8      optimum-quanto quantize(weights=qfloat8) + freeze   tests/requirements-peers.txt)
  diffusers.lwc       Diffusers' apply_layerwise_casting (e4m3 storage, bfloat16 compute, x bfloat16)
  fp8kit.<recipe>     fp8kit.torch.quantize_ (rowwise, tensorwise, block): W quantized and packed
                      once, x cast inside the GEMM; weight_only: x not quantized (two bf16 terms),
                      W e4m3 rowwise - torchao.f8wo's and quanto's recipe
  fp8kit.lwc          fp8kit.torch.enable_layerwise_casting (e4m3 storage, the Linear on FP8 directly,
                      x bfloat16 not quantized)
Columns: gflops = 2 M N K / seconds (the best call, the implementations taking turns in five
rounds of a second each; for M <= 16 each call after reading 256 MiB or more -
on torch's OpenMP threads, which a model's other ops keep awake; --flush one-thread: numpy's -
on the next of `copies` copies of the layer, 8x the last-level cache at one byte a weight (at most
512 MiB), so the weights come from memory, and after one call of the same implementation on a
16-output copy of the layer with the same x, so that its code and x are in cache as a model's
previous layer leaves them: after the flush alone, a 16 x 16 Linear's call took 200-500 us here,
nn.Linear's and fp8kit's alike, against 5 warm); vs_f32 = gflops / torch.f32's; sqnr_db = 10 log10
(sum y64^2 / sum (y - y64)^2) against the float64 product of the float32 x and W (every row checks
its result: a wrong kernel shows as a low SQNR). Plus call_overhead_us: the best time of one
call on a 16 x 16 layer at M = 1, where the arithmetic is negligible: what a call costs from
Python, fp8kit's Float8InferenceLinear beside nn.Linear.

Shapes: M in {1, 16, 128, 2048} x (N, K) in {(4096, 4096), (11008, 4096), (4096, 11008)};
--quick: M in {1, 16, 128} x (4096, 4096); --shapes: those given (e.g. bench_gemm's squares,
512x512x512,1024x1024x1024,2048x2048x2048, against torch's bf16 - its own oneDNN build, the
stronger bf16 peer where bench_gemm links an older system oneDNN).

--section train: one training step (forward, backward, AdamW) of x -> Linear(d, d) -> GELU ->
Linear(d, d) -> MSE on 512 tokens, d in {1024, 2048, 4096} (--quick: 1024): torch float32, torch's
bfloat16 autocast (vs_bf16: its step time over each row's), torchao convert_to_float8_training on the CPU, fp8kit.torch.convert_to_float8_training, per
recipe (tensorwise, rowwise, rowwise_with_gw_hp, block, mxfp8), their steps in turn round after round (the fastest of each); tokens/s, and sqnr_db of the
first step's weight gradient against torch float32's.
--section model: transformers' LlamaForCausalLM from a config (551M parameters: hidden 1536,
16 layers, random weights, nothing downloaded): prefill of 128 tokens (the faster of two) and decode tokens/s
(the median step of 16; 4 for the peers at ~0.5 tokens/s), every model taking its turn in each
of 4 rounds, with each of transformers' KV caches (DynamicCache, the default, and StaticCache),
vs_f32 / vs_bf16 = its decode tokens/s over torch float32's / bfloat16's with the same cache, and
sqnr_db of the prefill's last logits against the float32 model's (about 3 minutes on 2 Sapphire Rapids
cores, 2026-11-26); fp8kit.rowwise+norms is fp8kit.rowwise with fuse_norms, +attention with
fp8kit's attention function too, and torch.bf16+fp8kit.attention the bf16 model with it.
--section checkpoint: an FP8 checkpoint as users download it (below, at CKPT_LLAMA;
--checkpoint-model 697m for a larger one); a decode step's time split into the Linear layers',
lm_head's and the rest's.
--section attention: one layer's decode-step attention over a KV cache, transformers' sdpa and
fp8kit's attention function (below, at run_attention).
--section diffusion: Diffusers' Flux and SD3 transformers from configs at 256, 1024 and 4096 image
tokens (--quick: 256, 1024): plain bf16, Diffusers' layerwise casting and fp8kit's, and the model as a
ComfyUI scaled fp8 file run by load_fp8_checkpoint, each in a fresh process, in two rounds (below,
at DIFFUSION_MODELS).
Default: every section. Results: docs/PERF.md.
Not run by the tests (speed is never asserted in tests).

Memory: fp8kit puts blocks of 2 MiB and more (its packed weights) on huge pages where the OS
grants them; torch does so only with THP_MEM_ALLOC_ENABLE=1, which this script sets before torch
is imported, so that torch's weights stream from the same kind of pages (a decode step streams
each weight once; from 4 KiB pages 5-15% slower here).
"""
import argparse
import contextlib
import copy
import importlib
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch allocates anything

import numpy as np
import torch

import fp8kit
import fp8kit.torch as f8
from compare_builds import cpu_model  # beside this file

E4M3_MAX = 448.0


FLUSH = None  # read before each memory-bound call (M <= 16): larger than the last-level cache
FLUSH_BY = "team"  # --flush: "team" (torch's OpenMP threads) or "one-thread" (numpy)


def best_seconds(calls, budget, flush=False, rounds=5, warm=None):
    """name -> the fastest of its repeated calls (after one warm-up each), the implementations in
    turn for `rounds` rounds of budget / rounds seconds each (at least one call a round): on a
    shared machine interference only adds time, and this VM's memory bandwidth moves by 1.5x
    between minutes, so each implementation takes its calls in every phase of a run rather than
    in a window of its own (taken in turn, a bf16 call of a burst once made a 1.8x ratio 1.3x).
    flush: read 256 MiB (twice a larger last-level cache, up to 1 GiB) before each call, so the
    weights come from memory, as in a model larger than the caches; then warm[name]() (untimed),
    where given."""
    global FLUSH
    if flush and FLUSH is None:
        # "team": read by torch on its OpenMP team (the one libgomp of the process, fp8kit's
        # too), as a model's other ops run between its Linear layers. "one-thread": numpy reads
        # longer than libgomp's workers spin, and on a VM a worker asleep for 10 ms or more can
        # take 30-130 us to wake (docs/PERF.md): a delay added to every implementation's call
        # alike, which a model's decode, layer after layer, never pays.
        # 256 MiB, or twice a larger last-level cache up to 1 GiB.
        floats = min(max(64 << 20, last_level_cache_bytes() // 2), 256 << 20)
        FLUSH = torch.ones(floats) if FLUSH_BY == "team" else np.ones(floats, np.float32)
    for call in calls.values():
        call()
    best = dict.fromkeys(calls, math.inf)
    for _ in range(rounds):
        for name, call in calls.items():
            calls_made, start = 0, time.perf_counter()
            while calls_made < 1 or time.perf_counter() - start < budget / rounds:
                if flush:
                    FLUSH.sum()
                if warm:
                    warm[name]()
                t0 = time.perf_counter()
                call()
                best[name] = min(best[name], time.perf_counter() - t0)
                calls_made += 1
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


@contextlib.contextmanager
def _stdout_to_stderr():
    """This process's stdout (file descriptor 1) sent to stderr meanwhile: llm-compressor's logger
    writes to the stdout it was given, which --json keeps for JSON lines."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def peer(name):
    """A seed project's module, or None (said once) where it is not installed; what its import
    prints goes to stderr (llm-compressor logs as it is imported)."""
    try:
        with _stdout_to_stderr():
            return importlib.import_module(name)
    except ImportError:
        if name not in MISSING:
            MISSING.add(name)
            print(f"bench_torch: {name} is not installed: its rows are left out (tests/requirements-peers.txt)",
                  file=sys.stderr)
        return None


MISSING = set()

# A peer's measurement that would take longer than this is left out, with the time it would have
# taken said in its row: torch 2.15's CPU _scaled_mm runs at 0.1 GFLOP/s at every M on a Sapphire
# Rapids Xeon (at M = 2048 x 4096 x 4096, 11 minutes a call), and torchao's float8 training on it.
MAX_MEASURE_S = 60.0
RATES = {}  # impl -> the flop/s it ran at in this section's last shape that measured it


def too_slow(name, flops, calls):
    """The reason to leave `name` out where `calls` calls of `flops` each, at the rate it ran at
    before, would take more than MAX_MEASURE_S; else None. Rates grow with M, so a rate from a
    smaller M errs towards measuring."""
    rate = RATES.get(name)
    if rate is None or calls * flops / rate <= MAX_MEASURE_S:
        return None
    return f"not measured: ~{flops / rate:.0f} s a call at the {rate * 1e-9:.2f} GFLOP/s it ran at before"


def converted(model, how):
    """A copy of model (float32) as each project makes it FP8, and the dtype its input takes; None
    where the project is not installed."""
    model = copy.deepcopy(model)
    if how == "torch.bf16":
        return model.to(torch.bfloat16), torch.bfloat16
    if how.startswith("fp8kit.") and how != "fp8kit.lwc":
        f8.quantize_(model, how.removeprefix("fp8kit."))
        return model, torch.float32
    if how == "fp8kit.lwc":
        f8.enable_layerwise_casting(model.to(torch.bfloat16), skip_modules_pattern=None)
        return model, torch.bfloat16
    if how == "torchao.f8wo":
        ao = peer("torchao.quantization")
        return (ao.quantize_(model, ao.Float8WeightOnlyConfig()) or model, torch.float32) if ao else None
    if how == "quanto.qfloat8":
        quanto = peer("optimum.quanto")
        if quanto is None:
            return None
        quanto.quantize(model, weights=quanto.qfloat8)
        quanto.freeze(model)
        return model, torch.float32
    if how == "diffusers.lwc":
        hooks = peer("diffusers.hooks")
        if hooks is None:
            return None
        hooks.apply_layerwise_casting(model.to(torch.bfloat16), torch.float8_e4m3fn, torch.bfloat16,
                                      skip_modules_pattern=None)
        return model, torch.bfloat16
    raise ValueError(how)


LINEAR_IMPLS = ("torch.bf16", "torchao.f8wo", "quanto.qfloat8", "diffusers.lwc", "fp8kit.rowwise",
                "fp8kit.tensorwise", "fp8kit.block", "fp8kit.weight_only", "fp8kit.lwc")


def last_level_cache_bytes():
    """The L3 a core allocates into (Linux sysfs, as bench/common.cpp reads it), else 32 MiB."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            size = f.read().strip()
        return int(size[:-1]) << {"K": 10, "M": 20}[size[-1]] if size[-1] in "KM" else int(size)
    except (OSError, ValueError):
        return 32 << 20


def run_shape(m, n, k, budget, rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(k, n)
    x = torch.randn(m, k)
    ref = x.double() @ linear.weight.detach().double().T + linear.bias.detach().double()
    # Memory-bound shapes (M <= 16) out of cache by one rule for every implementation: copies of
    # the layer that hold, at one byte a weight, 8x the last-level cache, called in turn, with the
    # flush before each call (the flush alone left re-read weights in a Zen 5's L3: bench_gemm.cpp).
    # At most 512 MiB of FP8 codes a side (a Xeon's 480 MiB L3, a whole socket's, asked 3.8 GB of
    # codes, and float32's copies four times that): with the flush before each call, a copy is read
    # again only after gigabytes.
    copies = 1 if m > 16 else math.ceil(min(8 * last_level_cache_bytes(), 512 << 20) / (n * k))
    linears = [linear] + [copy.deepcopy(linear) for _ in range(copies - 1)]
    flops = 2 * m * n * k
    # Each copy's first call, then at least one call in each of best_seconds' rounds and the check.
    skipped = {how: too_slow(how, flops, copies + 6) for how in ("torch.scaled_mm",) + LINEAR_IMPLS}
    for how, why in skipped.items():
        if why:
            rows.append({"bench": "torch", "impl": how, "m": m, "n": n, "k": k, "threads": torch.get_num_threads(),
                         "note": why})
    # Memory-bound: after the flush, one call of each implementation on its copy of a small layer
    # (the first 16 outputs), untimed: its code and x back in cache, as a model's previous layer
    # leaves them. Each implementation's list ends with it until it is taken out below.
    if m <= 16:
        small = torch.nn.Linear(k, 16)
        small.load_state_dict({"weight": linear.weight[:16], "bias": linear.bias[:16]})
        linears = linears + [small]
    impls = {"torch.f32": linears}
    if not skipped["torch.scaled_mm"]:
        impls["torch.scaled_mm"] = [scaled_mm_linear(lin) for lin in linears]
    for how in LINEAR_IMPLS:
        if skipped[how]:
            continue
        made = [converted(torch.nn.Sequential(lin), how) for lin in linears]
        if made[0] is not None:
            impls[how] = [lambda _x, model=model, xin=x.to(dtype): model(xin) for model, dtype in made]
    warm = {name: (lambda f=fs.pop(): f(x)) for name, fs in impls.items()} if m <= 16 else None
    with torch.no_grad():
        for fs in impls.values():
            for f in fs:  # every copy's first call (fp8kit packs its weight there) before the timing
                f(x)
        turns = {name: itertools.cycle(fs) for name, fs in impls.items()}
        best = best_seconds({name: lambda t=turn: next(t)(x) for name, turn in turns.items()}, budget, flush=m <= 16,
                            warm=warm)
        base = flops / best["torch.f32"] * 1e-9
        for name, s in best.items():
            RATES[name] = flops / s
            gflops = flops / s * 1e-9
            rows.append({"bench": "torch", "impl": name, "m": m, "n": n, "k": k, "threads": torch.get_num_threads(),
                         "copies": copies, "seconds": s, "gflops": round(gflops, 3), "vs_f32": round(gflops / base, 3),
                         "sqnr_db": round(sqnr_db(impls[name][0](x), ref), 2)})


def call_overhead(budget, rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 16)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    model.load_state_dict({"0.weight": linear.weight, "0.bias": linear.bias})
    f8.quantize_(model)
    x = torch.randn(1, 16)
    fp8_linear = model[0]  # each module called itself: through the Sequential ~1 us more, indexing it 0.5
    with torch.no_grad():
        best = best_seconds({"torch.f32": lambda: linear(x), "fp8kit.rowwise": lambda: fp8_linear(x)}, budget)
    for name, s in best.items():
        rows.append({"bench": "torch", "impl": name, "m": 1, "n": 16, "k": 16, "threads": torch.get_num_threads(),
                     "call_overhead_us": round(s * 1e6, 2)})


TRAIN_TOKENS = 512


class Bf16Autocast(torch.nn.Sequential):
    """The float32 model run under torch.autocast("cpu", bfloat16): a PyTorch user's bf16 training
    step (the Linear GEMMs in bfloat16 on oneDNN, float32 master weights and AdamW)."""

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return super().forward(x).float()


def train_step_impls(d):
    """name -> a fresh model (same initial weights) for each training implementation."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d))
    impls = {"torch.f32": lambda: copy.deepcopy(base), "torch.bf16_autocast": lambda: Bf16Autocast(*copy.deepcopy(base))}
    ao = peer("torchao.float8")
    for recipe in ("tensorwise", "rowwise"):
        if ao is not None:
            impls["torchao." + recipe] = lambda r=recipe: ao.convert_to_float8_training(
                copy.deepcopy(base), config=ao.Float8LinearConfig.from_recipe_name(r))
    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp", "block", "mxfp8"):
        impls["fp8kit." + recipe] = lambda r=recipe: f8.convert_to_float8_training(copy.deepcopy(base), config=r)
    return impls


def run_train(d, budget, rows):
    """Every implementation's step in turn, in best_seconds' rounds (`budget` seconds each in
    all), each keeping its fastest; one whose first step took more than MAX_MEASURE_S / 6 is
    timed by that step alone, and left out at a larger d where its steps would take too long."""
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(TRAIN_TOKENS, d, generator=g), torch.randn(TRAIN_TOKENS, d, generator=g)
    flops = 6 * 2 * TRAIN_TOKENS * d * d  # three GEMMs in each of two Linear layers
    steps, grads, once = {}, {}, {}
    for name, make in train_step_impls(d).items():
        why = None if name.startswith("torch.") else too_slow("train:" + name, flops, 1)  # torch's: the baselines
        if why:
            rows.append({"bench": "torch_train", "impl": name, "m": TRAIN_TOKENS, "n": d, "k": d,
                         "threads": torch.get_num_threads(), "note": why.replace("a call", "a step")})
            continue
        model = make()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, opt=opt):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), target).backward()
            opt.step()
        t0 = time.perf_counter()
        step()  # the first step's gradient, from the shared initial weights, is the check
        first = time.perf_counter() - t0
        grads[name] = model[0].weight.grad.double()
        if first > MAX_MEASURE_S / 6 and not name.startswith("torch."):
            once[name] = first  # a first step: an upper bound of a step's time
        else:
            steps[name] = step
    best = {**best_seconds(steps, budget), **once}
    base, ref_grad = best["torch.f32"], grads["torch.f32"]
    bf16 = best.get("torch.bf16_autocast")
    for name, s in best.items():
        RATES["train:" + name] = flops / s
        rows.append({"bench": "torch_train", "impl": name, "m": TRAIN_TOKENS, "n": d, "k": d,
                     "threads": torch.get_num_threads(), "seconds": s,
                     "tokens_per_s": round(TRAIN_TOKENS / s, 1), "vs_f32": round(base / s, 3),
                     "vs_bf16": round(bf16 / s, 3) if bf16 else "",
                     "sqnr_db": round(sqnr_db(grads[name], ref_grad), 2),
                     **({"note": "one step (the first)"} if name in once else {})})


LLAMA = dict(vocab_size=32000, hidden_size=1536, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=12,
             num_key_value_heads=12, max_position_embeddings=512)
PROMPT, DECODE, ROUNDS = 128, 16, 4
CACHES = ("dynamic", "static")
SLOW_PEERS = ("torchao.f8wo", "quanto.qfloat8", "diffusers.lwc")  # a decode step at ~0.4 GFLOP/s (1.1 GFLOP a token)


def run_model(rows):
    transformers = peer("transformers")
    if transformers is None:
        return
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    ids = torch.randint(0, LLAMA["vocab_size"], (1, PROMPT), generator=torch.Generator().manual_seed(2))
    models = {"torch.f32": base}
    for how in LINEAR_IMPLS:
        made = converted(base, how)
        if made is not None:
            models[how] = made[0]
    # fp8kit rowwise with transformers' RMSNorm layers on fp8kit's kernel too (fuse_norms: the
    # float32 norms a decode step runs, one call each instead of eight torch operators).
    models["fp8kit.rowwise+norms"] = copy.deepcopy(models["fp8kit.rowwise"])
    f8.fuse_norms(models["fp8kit.rowwise+norms"])
    # And its attention on fp8kit's decode kernel (what from_pretrained gives), with bf16 beside it
    # on the same kernel: what the attention alone is worth, apart from FP8.
    attention = f8.register_attention()
    models["fp8kit.rowwise+norms+attention"] = copy.deepcopy(models["fp8kit.rowwise+norms"])
    models["torch.bf16+fp8kit.attention"] = copy.deepcopy(models["torch.bf16"])
    for how in ("fp8kit.rowwise+norms+attention", "torch.bf16+fp8kit.attention"):
        models[how].set_attn_implementation(attention)
    # Two KV caches, every model decoding with each: transformers' default DynamicCache, which
    # concatenates each layer's keys and values into new tensors at every token (a decode step at
    # PROMPT tokens copies ~25 MB of float32 cache, ~8 ms of this model's step here, and more as
    # the sequence grows), and its StaticCache, allocated once for the whole sequence and written
    # in place - what transformers documents for fast generation, and what every serving engine
    # does. The cache is the model's own code: the same for every implementation.
    def new_cache(kind):
        return transformers.StaticCache(config=base.config, max_cache_len=PROMPT + DECODE) if kind == "static" else None
    # Every model takes its turn in every round, prefill and decode alike: this VM's memory
    # bandwidth moves by 1.5x between minutes, and a model timed in a window of its own once read
    # 1.26x bfloat16 where its twin of the same speed read 1.55x. Prefill: the fastest of two
    # (noise only adds time; the slow peers take ~4-9 s each). Decode: the median step of DECODE
    # (ROUNDS steps of the slow peers), each model continuing its own sequence round after round.
    runs = [(how, kind) for how in models for kind in CACHES]
    prefill, logits, state, times = {}, {}, {}, {run: [] for run in runs}
    with torch.no_grad():
        for how, model in models.items():
            model(ids[:, :8])  # warm-up
        for _ in range(2):
            for how, kind in runs:
                cache = new_cache(kind)
                t0 = time.perf_counter()
                out = models[how](ids, past_key_values=cache, use_cache=True)
                prefill[how, kind] = min(prefill.get((how, kind), math.inf), time.perf_counter() - t0)
                logits[how, kind] = out.logits[0, -1].double()
                state[how, kind] = (out.past_key_values, out.logits[:, -1:].argmax(-1))
        for _ in range(ROUNDS):
            for how, kind in runs:
                for _ in range(1 if how in SLOW_PEERS else DECODE // ROUNDS):
                    past, tok = state[how, kind]
                    t0 = time.perf_counter()
                    out = models[how](tok, past_key_values=past, use_cache=True)
                    state[how, kind] = (out.past_key_values, out.logits[:, -1:].argmax(-1))
                    times[how, kind].append(time.perf_counter() - t0)
    rate = {run: 1 / statistics.median(times[run]) for run in runs}
    for how, kind in runs:
        rows.append({"bench": "torch_model", "impl": how, "cache": kind,
                     "params_m": round(sum(p.numel() for p in base.parameters()) / 1e6),
                     "threads": torch.get_num_threads(), "prefill_s": round(prefill[how, kind], 3),
                     "decode_tokens_per_s": round(rate[how, kind], 2),
                     "vs_f32": round(rate[how, kind] / rate["torch.f32", kind], 2),
                     "vs_bf16": round(rate[how, kind] / rate["torch.bf16", kind], 2) if ("torch.bf16", kind) in rate else "",
                     "sqnr_db": round(sqnr_db(logits[how, kind], logits["torch.f32", kind]), 2)})


# --section checkpoint: an FP8 checkpoint as users download it, each way of running it in a fresh
# process, the five ways in turn over CHECKPOINT_ROUNDS rounds. The model: a Llama from a config
# (hidden 1024, 8 layers, intermediate 2816, vocab 32000: 169M parameters, lm_head and embeddings
# kept in bf16), bf16, quantized by llm-compressor's oneshot
# FP8_DYNAMIC (channel weights, per-token activations); both written once under CKPT_DIR. Beside
# them the bf16 checkpoint loaded by transformers and quantize_d (rowwise, lm_head kept in bf16;
# transformers' sdpa attention, as quantize_ leaves it), and the bf16 checkpoint with fp8kit's
# attention alone (what from_pretrained's default attention gives without FP8 weights).
CKPT_LLAMA = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=1024,
                  tie_word_embeddings=False)
# --checkpoint-model 697m: a Llama whose Linear weights dominate a decode step (hidden 2048, 12
# layers, intermediate 5632: 566M parameters in Linear layers, 697M in all), where the bytes a
# token reads bound the step; its bf16 prefill of 512 tokens takes ~30 s here (AVX2), so a round of
# the five ways takes ~8 minutes.
CKPT_MODELS = {"169m": CKPT_LLAMA,
               "697m": dict(CKPT_LLAMA, hidden_size=2048, intermediate_size=5632, num_hidden_layers=12)}
CHECKPOINT_ROUNDS = 3
CKPT_DIR = os.environ.get("FP8KIT_BENCH_CKPT", os.path.join(os.path.expanduser("~"), ".cache", "fp8kit-bench-ckpt"))


def _rss():
    """This process's resident memory (MB) from /proc/self/status: total, anonymous, file-backed, peak."""
    f = {}
    with open("/proc/self/status") as s:
        for line in s:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                f[k] = int(v.split()[0]) / 1024
    return f


def checkpoint_child(kind, path, prompt, decode):
    """One way of running a checkpoint, in this (fresh) process: load, prefill `prompt` tokens, then
    generate `decode` tokens greedily with a StaticCache; prints one JSON object."""
    import transformers
    base_rss = _rss()
    t0 = time.perf_counter()
    if kind == "fp8kit":
        model = fp8kit.torch.from_pretrained(path)
    elif kind == "attention":  # the bf16 checkpoint with fp8kit's attention only: what the attention alone gives
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                                  attn_implementation=fp8kit.torch.register_attention())
    else:  # transformers' own path: bf16, or for the FP8 checkpoint its CPU decompression to bf16
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
        if kind == "quantize_":  # the bf16 checkpoint quantized in memory, lm_head kept as the FP8 one keeps it
            fp8kit.torch.quantize_(model, filter_fn=lambda m, fqn: fqn != "lm_head")
    model.eval()
    load_s = time.perf_counter() - t0
    loaded = _rss()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prompt), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        # Warm-up at the prompt's shape: torch's first calls at a shape build oneDNN's primitives and
        # fault the weights in (a 169M bf16 Llama's first 128-token prefills took 1.2-2.3 s, then
        # 0.2 s here), so a prefill is the fastest of three after two.
        pre = math.inf
        for i in range(5):
            t0 = time.perf_counter()
            model(ids)
            if i >= 2:
                pre = min(pre, time.perf_counter() - t0)
        # decode: the median step of `decode` greedy steps after the prompt, with a StaticCache;
        # beside it the time a step spends in the Linear layers' forwards (each one's call timed;
        # lm_head apart) - the part whose weight bytes FP8 halves - and in the rest (attention,
        # norms, the model's own Python), which FP8 leaves as it is.
        cache = transformers.StaticCache(config=model.config, max_cache_len=prompt + decode + 1)
        out = model(ids, past_key_values=cache, use_cache=True)
        tok, steps = out.logits[:, -1:].argmax(-1), []
        inside = {"linear": 0.0, "lm_head": 0.0}
        for fqn, m in model.named_modules():
            if isinstance(m, (torch.nn.Linear, f8.Float8InferenceLinear)):
                m.forward = _timed(m.forward, inside, "lm_head" if fqn == "lm_head" else "linear")
        for _ in range(decode):
            t0 = time.perf_counter()
            out = model(tok, past_key_values=out.past_key_values, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            steps.append(time.perf_counter() - t0)
        for m in model.modules():
            m.__dict__.pop("forward", None)  # the class's forward again
        del cache, out
        model.generate(ids[:, :16], max_new_tokens=8, do_sample=False, pad_token_id=0)  # the RSS "after generate"
    after = _rss()
    files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors")]
    print(json.dumps({"kind": kind, "load_s": round(load_s, 2), "ckpt_mb": round(sum(map(os.path.getsize, files)) / 2**20, 1),
                      "rss_base_mb": round(base_rss["VmRSS"]), "rss_loaded_mb": round(loaded["VmRSS"] - base_rss["VmRSS"]),
                      "rss_after_generate_mb": round(after["VmRSS"] - base_rss["VmRSS"]),
                      "anon_mb": round(after["RssAnon"] - base_rss["RssAnon"]), "file_mb": round(after["RssFile"] - base_rss["RssFile"]),
                      "peak_mb": round(after["VmHWM"] - base_rss["VmRSS"]),
                      "prefill_tokens_per_s": round(prompt / pre, 1), "decode_tokens_per_s": round(1 / statistics.median(steps), 2),
                      "decode_linear_ms": round(inside["linear"] / decode * 1e3, 2),
                      "decode_lm_head_ms": round(inside["lm_head"] / decode * 1e3, 2),
                      "decode_rest_ms": round((sum(steps) - inside["linear"] - inside["lm_head"]) / decode * 1e3, 2)}))


def _timed(forward, into, key):
    """forward, adding the seconds of each call to into[key]."""
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        y = forward(*args, **kwargs)
        into[key] += time.perf_counter() - t0
        return y
    return timed


def _make_checkpoints(model):
    import transformers
    prefix = "" if model == "169m" else model + "-"  # the 169M model's directories keep their first names
    bf16, fp8 = os.path.join(CKPT_DIR, prefix + "llama-bf16"), os.path.join(CKPT_DIR, prefix + "llama-fp8-dynamic")
    if not os.path.exists(os.path.join(bf16, "config.json")):
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**CKPT_MODELS[model])).to(torch.bfloat16).save_pretrained(bf16)
    if not os.path.exists(os.path.join(fp8, "config.json")):
        from llmcompressor import oneshot
        from llmcompressor.modifiers.quantization import QuantizationModifier
        model = transformers.AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.bfloat16)
        with _stdout_to_stderr():
            oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"]))
            model.save_pretrained(fp8, save_compressed=True)
    return bf16, fp8


def run_checkpoint(rows, threads, quick, model):
    if peer("transformers") is None or peer("llmcompressor") is None:
        return
    bf16, fp8 = _make_checkpoints(model)
    prompt, decode = (128, 8) if quick else (512, 32)
    # The four ways take turns, CHECKPOINT_ROUNDS times (once with --quick), each in a fresh
    # process: on a shared VM one pass put the same build's decode ratio anywhere from 1.25x to
    # 1.55x bf16, as the neighbours' load moved between the processes. Each way's row is its
    # median-RSS run, with the best prefill and decode of its runs (and their range in the note).
    ways = (("transformers.bf16", bf16), ("transformers.fp8ckpt", fp8), ("fp8kit.fp8ckpt", fp8), ("quantize_.bf16ckpt", bf16),
            ("attention.bf16ckpt", bf16))
    runs = {kind: [] for kind, _ in ways}
    failed = {}
    for _ in range(1 if quick else CHECKPOINT_ROUNDS):
        for kind, path in ways:
            if kind in failed:
                continue
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--checkpoint-child", kind.split(".")[0], path,
                                str(prompt), str(decode), "--threads", str(threads)],
                               capture_output=True, text=True, env=env)
            if r.returncode != 0:
                failed[kind] = r.stderr.strip().splitlines()[-1][:120]
                continue
            runs[kind].append(json.loads(r.stdout.strip().splitlines()[-1]))
    for kind, _ in ways:
        if kind in failed:
            rows.append({"bench": "torch_checkpoint", "impl": kind, "note": failed[kind]})
            continue
        done = sorted(runs[kind], key=lambda x: x["rss_after_generate_mb"])
        row = dict(done[len(done) // 2])
        for key in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            row[key] = max(x[key] for x in done)
        decodes = [x["decode_tokens_per_s"] for x in done]
        row.update({"bench": "torch_checkpoint", "impl": kind, "model": model, "prompt": prompt, "threads": threads, "runs": len(done),
                    "note": f"decode {min(decodes)}-{max(decodes)} over {len(done)} runs" if len(done) > 1 else ""})
        row["rss_per_ckpt_byte"] = round(row["rss_after_generate_mb"] / row["ckpt_mb"], 2)
        rows.append(row)
    by = {r["impl"]: r for r in rows if r.get("bench") == "torch_checkpoint" and "decode_tokens_per_s" in r}
    for r in by.values():
        if "transformers.bf16" in by:
            b = by["transformers.bf16"]
            r["decode_vs_bf16"] = round(r["decode_tokens_per_s"] / b["decode_tokens_per_s"], 2)
            r["prefill_vs_bf16"] = round(r["prefill_tokens_per_s"] / b["prefill_tokens_per_s"], 2)
            r["rss_per_byte_vs_bf16"] = round(r["rss_per_ckpt_byte"] / b["rss_per_ckpt_byte"], 2)
            r["rss_vs_bf16"] = round(r["rss_after_generate_mb"] / b["rss_after_generate_mb"], 2)


# --section diffusion: Diffusers' transformers from configs (random weights; 36M-parameter Flux,
# 2 double- and 4 single-stream blocks; a 4-block SD3), bf16, one forward at each image-token
# count, each way in a fresh process a round (DIFFUSION_ROUNDS): plain bf16, Diffusers' own
# layerwise casting (e4m3 storage, upcast per forward), fp8kit.torch.enable_layerwise_casting (the
# Linear layers computing on the FP8 weight, the activation as Diffusers computes it; fused_gelu:
# how many compute the GELU after them in their GEMM), both with their default skip patterns; and
# fp8file: the model as a ComfyUI scaled fp8 single file (the blocks' Linear weights e4m3 with a
# per-tensor scale_weight, written here by torch) run as stored by load_fp8_checkpoint into the
# model built on the meta device (weight-only, as ComfyUI computes it; no bf16 weight is made).
DIFFUSION_MODELS = {
    "flux": ("FluxTransformer2DModel", dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=4,
                                            attention_head_dim=64, num_attention_heads=8, joint_attention_dim=512,
                                            pooled_projection_dim=256, guidance_embeds=False, axes_dims_rope=(8, 28, 28))),
    "sd3": ("SD3Transformer2DModel", dict(sample_size=64, patch_size=2, in_channels=16, num_layers=4,
                                          attention_head_dim=64, num_attention_heads=8, joint_attention_dim=512,
                                          caption_projection_dim=512, pooled_projection_dim=256, out_channels=16)),
}


def diffusion_file(name, path):
    """The model `name` (seed 0, bf16) as a ComfyUI scaled fp8 file at path: each Linear weight of its
    blocks e4m3 with scale amax / 448 (`scale_weight`), the `scaled_fp8` marker; the rest bf16."""
    import diffusers
    from safetensors.torch import save_file
    cls, cfg = DIFFUSION_MODELS[name]
    torch.manual_seed(0)
    tensors = {}
    for k, v in getattr(diffusers, cls)(**cfg).to(torch.bfloat16).state_dict().items():
        if v.dim() == 2 and k.endswith(".weight") and "blocks." in k:
            scale = v.float().abs().amax() / 448
            tensors[k] = (v.float() / scale).to(torch.float8_e4m3fn)
            tensors[k.removesuffix(".weight") + ".scale_weight"] = scale.reshape(())
        else:
            tensors[k] = v
    tensors["scaled_fp8"] = torch.zeros(2, dtype=torch.float8_e4m3fn)
    save_file(tensors, path)


def diffusion_child(kind, name, tokens, path=None):
    """One way of running a Diffusers transformer at `tokens` image tokens, in this (fresh) process:
    the fastest of 5 forwards after one; RSS above the imports' (after gc and malloc_trim); the
    output's norm (each row checks that it computed: FP8 storage moves it by about 1e-3). path: the
    fp8file kind's file."""
    import gc
    import diffusers
    from fp8kit.torch import memory

    def rss():
        gc.collect()
        memory.trim_heap()
        return _rss()["VmRSS"]
    base = rss()
    cls, cfg = DIFFUSION_MODELS[name]
    torch.manual_seed(0)
    if kind == "fp8file":
        with torch.device("meta"):
            model = getattr(diffusers, cls)(**cfg).eval()
    else:
        model = getattr(diffusers, cls)(**cfg).to(torch.bfloat16).eval()
    params = sum(p.numel() for p in model.parameters())  # before FP8 storage makes weights buffers
    native = fused_gelu = None
    if kind == "fp8file":
        f8.load_fp8_checkpoint(model, path, torch_dtype=torch.bfloat16)
        native = sum(isinstance(m, f8.Float8InferenceLinear) for m in model.modules())
        fused_gelu = sum(isinstance(m, f8.Float8InferenceLinear) and m.activation == "gelu" for m in model.modules())
    elif kind == "fp8kit":
        report = f8.enable_layerwise_casting(model, torch.float8_e4m3fn, torch.bfloat16)
        native, fused_gelu = len(report.native), len(report.fused_gelu)
        del report  # the originals it holds for remove() go
    elif kind == "diffusers":
        model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    g, txt = torch.Generator().manual_seed(1), 64
    if name == "flux":
        inp = dict(hidden_states=torch.randn(1, tokens, 64, generator=g), img_ids=torch.zeros(tokens, 3),
                   txt_ids=torch.zeros(txt, 3))
    else:  # SD3: a latent of side 2 sqrt(tokens) (2x2 patches)
        side = 2 * int(math.isqrt(tokens))
        inp = dict(hidden_states=torch.randn(1, 16, side, side, generator=g))
    inp = {k: v.to(torch.bfloat16) if k == "hidden_states" else v for k, v in inp.items()}
    inp.update(encoder_hidden_states=torch.randn(1, txt, 512, generator=g).to(torch.bfloat16),
               pooled_projections=torch.randn(1, 256, generator=g).to(torch.bfloat16), timestep=torch.tensor([0.5]),
               return_dict=False)
    with torch.no_grad():
        out = model(**inp)[0]
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            model(**inp)
            best = min(best, time.perf_counter() - t0)
    print(json.dumps({"kind": kind, "model": name, "tokens": tokens, "native_linears": native, "fused_gelu": fused_gelu,
                      "params_m": round(params / 1e6, 1),
                      "rss_mb": round(rss() - base), "forward_s": round(best, 4), "out_norm": round(float(out.float().norm()), 3)}))


def run_diffusion(rows, threads, quick):
    if peer("diffusers") is None:
        return
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for name in DIFFUSION_MODELS:
            path = os.path.join(tmp, f"{name}-fp8-scaled.safetensors")
            diffusion_file(name, path)
            for tokens in (256, 1024) if quick else (256, 1024, 4096):
                run_diffusion_tokens(rows, threads, name, tokens, path)


# Rounds of the diffusion ways: each way runs once a round in a fresh process, the order reversed
# every other round, and keeps its fastest round; one process after another, a shared VM's pace
# moved between them by more than the difference measured (Flux at 1024 tokens: fp8kit 0.87x bf16
# by one process each, 1.06x alternating in one process).
DIFFUSION_ROUNDS = 2


def run_diffusion_tokens(rows, threads, name, tokens, path):
    """The diffusion section's ways (diffusion_child) at one token count, each in a fresh process a
    round (DIFFUSION_ROUNDS), the fastest round of each kept."""
    kinds = ("bf16", "diffusers", "fp8kit", "fp8file")
    got, failed = {}, {}
    for round_ in range(DIFFUSION_ROUNDS):
        for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
            if kind in failed:
                continue
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--diffusion-child", kind, name, str(tokens),
                                str(threads), path], capture_output=True, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
            if r.returncode != 0:
                failed[kind] = r.stderr.strip().splitlines()[-1][:120]
                continue
            one = json.loads(r.stdout.strip().splitlines()[-1])
            if kind not in got or one["forward_s"] < got[kind]["forward_s"]:
                got[kind] = one
    for kind in kinds:
        impl = f"{kind}.{name}"
        if kind in failed:
            rows.append({"bench": "torch_diffusion", "impl": impl, "tokens": tokens, "note": failed[kind]})
            continue
        row = dict(got[kind], bench="torch_diffusion", impl=impl, threads=threads, rounds=DIFFUSION_ROUNDS)
        if "bf16" in got:
            row["vs_bf16"] = round(got["bf16"]["forward_s"] / row["forward_s"], 2)
            row["rss_vs_bf16"] = round(row["rss_mb"] / got["bf16"]["rss_mb"], 2)
        rows.append(row)


# --section attention: one layer's decode-step attention over a KV cache, as a transformers Llama
# calls it (the checkpoint section's heads: 16 query heads sharing 8 key/value heads of 64; a
# StaticCache of L positions whose last 33 are unwritten, masked): transformers' sdpa (each
# key/value head copied for its query heads, then torch's SDPA) and fp8kit's attention function
# (fp8kit::attention_decode), bf16 and float32 caches. GB/s: the attended keys' and values' bytes
# over the time. Each result is checked against torch's SDPA in float64 on the same values.
def run_attention(budget, rows):
    if peer("transformers") is None:
        return
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from fp8kit.torch import attention

    class Layer(torch.nn.Module):  # what transformers' attention functions read of the module
        num_key_value_groups, is_causal = 2, True

    layer = Layer()
    for dtype in (torch.bfloat16, torch.float32):
        for length in (545, 4096):
            g = torch.Generator().manual_seed(length)
            q = torch.randn(1, 16, 1, 64, generator=g).to(dtype)
            k, v = (torch.randn(1, 8, length, 64, generator=g).to(dtype) for _ in range(2))
            mask = torch.ones(1, 1, 1, length, dtype=torch.bool)
            mask[..., length - 33:] = False
            calls = {"transformers.sdpa": lambda: sdpa_attention_forward(layer, q, k, v, mask)[0],
                     "fp8kit.attention": lambda: attention.attention_forward(layer, q, k, v, mask)[0]}
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1), attn_mask=mask).transpose(1, 2)
            bound = (ref.abs() * 2.0 ** -(8 if dtype == torch.bfloat16 else 23) + 2.0 ** -12 * v.double().abs().max())
            best = best_seconds(calls, budget)
            read = 2 * 8 * (length - 33) * 64 * k.element_size()
            for name, call in calls.items():
                err = (call().double() - ref).abs()
                if not (err <= bound).all():
                    raise SystemExit(f"bench attention: {name} {dtype} L={length} is {err.max().item():.3g} from float64")
                rows.append({"bench": "torch_attention", "impl": name, "dtype": str(dtype).removeprefix("torch."),
                             "l": length, "threads": torch.get_num_threads(), "us": round(best[name] * 1e6, 1),
                             "gb_per_s": round(read / best[name] / 1e9, 2),
                             "vs_sdpa": round(best["transformers.sdpa"] / best[name], 2),
                             "max_err_vs_f64": float(f"{err.max().item():.3g}")})


def parse_shapes(text):
    """--shapes: MxNxK[,MxNxK...], each a positive integer."""
    shapes = []
    for item in text.split(","):
        dims = item.split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"{item!r} is not MxNxK with three positive integers")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--diffusion-child":  # kind name tokens threads path
        threads = int(sys.argv[5])
        torch.set_num_threads(threads)
        fp8kit.set_num_threads(threads)
        return diffusion_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[6])
    if len(sys.argv) > 1 and sys.argv[1] == "--checkpoint-child":
        kind, path, prompt, decode = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        threads = int(sys.argv[7]) if len(sys.argv) > 7 else 2
        torch.set_num_threads(threads)
        fp8kit.set_num_threads(threads)
        return checkpoint_child(kind, path, prompt, decode)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--checkpoint-model", choices=tuple(CKPT_MODELS), default="169m",
                    help="the checkpoint section's Llama (default 169m; 697m: Linear weights dominate a decode step)")
    ap.add_argument("--flush", choices=("team", "one-thread"), default="team",
                    help="who reads the 256 MiB before a memory-bound call (default: torch's threads)")
    ap.add_argument("--shapes", type=parse_shapes,
                    help="the linear section's shapes, MxNxK comma-separated (default: its grid)")
    ap.add_argument("--section", choices=("linear", "train", "model", "checkpoint", "diffusion", "attention"), action="append",
                    help="linear, train, model, checkpoint, diffusion or attention (repeatable; default: all six)")
    a = ap.parse_args()
    sections = a.section or ["linear", "train", "model", "checkpoint", "diffusion", "attention"]
    global FLUSH_BY
    FLUSH_BY = a.flush
    torch.set_num_threads(a.threads)
    fp8kit.set_num_threads(a.threads)
    budget = 0.3 if a.quick else 1.0
    rows = []
    if "linear" in sections:
        if a.shapes:
            shapes = a.shapes
        elif a.quick:
            shapes = [(m, 4096, 4096) for m in (1, 16, 128)]
        else:
            shapes = [(m, n, k) for n, k in ((4096, 4096), (11008, 4096), (4096, 11008)) for m in (1, 16, 128, 2048)]
        for m, n, k in shapes:
            run_shape(m, n, k, budget, rows)
        call_overhead(budget, rows)
    if "train" in sections:
        for d in (1024,) if a.quick else (1024, 2048, 4096):
            run_train(d, 2 * budget, rows)
    if "model" in sections:
        run_model(rows)
    if "checkpoint" in sections:
        run_checkpoint(rows, a.threads, a.quick, a.checkpoint_model)
    if "diffusion" in sections:
        run_diffusion(rows, a.threads, a.quick)
    if "attention" in sections:
        run_attention(budget, rows)
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"fp8kit bench torch: torch {torch.__version__}, fp8kit {fp8kit.__version__}, {a.threads} threads, "
          f"{cpu_model()}")
    tables = {"torch": ("impl m n k gflops vs_f32 sqnr_db call_overhead_us note", "GFLOP/s of y = x W^T + b"),
              "torch_train": ("impl m n k tokens_per_s vs_f32 vs_bf16 sqnr_db note", "training step, m tokens, width n"),
              "torch_model": ("impl cache params_m prefill_s decode_tokens_per_s vs_f32 vs_bf16 sqnr_db",
                              "LlamaForCausalLM, decode tokens/s with each KV cache"),
              "torch_checkpoint": ("impl load_s ckpt_mb rss_loaded_mb rss_after_generate_mb anon_mb file_mb peak_mb "
                                   "rss_per_ckpt_byte rss_per_byte_vs_bf16 rss_vs_bf16 prefill_tokens_per_s prefill_vs_bf16 "
                                   "decode_tokens_per_s decode_vs_bf16 decode_linear_ms decode_lm_head_ms decode_rest_ms note",
                                   "an FP8 checkpoint (llm-compressor FP8_DYNAMIC of a 169M Llama) and the bf16 one "
                                   "quantize_d, each in a fresh process: RSS above the imports' (MB), tokens/s with a "
                                   "StaticCache"),
              "torch_diffusion": ("impl tokens params_m native_linears fused_gelu rss_mb rss_vs_bf16 forward_s vs_bf16 out_norm note",
                                  "Diffusers transformers from configs, bf16 / Diffusers' layerwise casting / fp8kit's, "
                                  "each in a fresh process: one forward (s), RSS above the imports' (MB)"),
              "torch_attention": ("impl dtype l us gb_per_s vs_sdpa max_err_vs_f64",
                                  "a decode step's attention of one layer (16 / 8 heads of 64) over l cached positions")}
    for bench, (cols, title) in tables.items():
        table = [r for r in rows if r["bench"] == bench]
        if table:
            cols = cols.split()
            print(f"\n{title}\n| {' | '.join(cols)} |\n|{'---|' * len(cols)}")
            for r in table:
                print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")


if __name__ == "__main__":
    main()
