"""fp8kit.torch.advice: advise - per Linear of a model, FP8 or not and which recipe, from paired
timings on this machine and SQNR; writes the policy file the C++ side reads.

Checked by tests/python/test_advise.py (the decision rule, and the policy file read back by the
library's own reader).
"""
import copy
import math
import os
import statistics
import time

import torch
from torch import nn

import fp8kit

from .inference import RECIPES, Float8InferenceLinear
from .ops import check_model_args, has_weights


def _seconds_per_call(call, target=2e-3):
    """One timing sample: enough calls in a row to last about `target` seconds (a small layer's
    call is microseconds: below the clock's and the scheduler's noise), per call."""
    calls, elapsed = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        elapsed = time.perf_counter() - t0
        if elapsed >= target:
            return elapsed / calls
        calls *= 2


def advise(model, example_inputs, path=None, *, recipes=("rowwise", "tensorwise", "block"), rounds=7,
           min_speedup=1.0, sqnr_floor=25.0):
    """Per nn.Linear of model: FP8 or not, and with which recipe, measured on this machine at the
    shapes the model runs. example_inputs (a tuple of model's arguments) runs once to capture each
    Linear's input; then, per layer, `rounds` rounds each time the float32 layer and one
    Float8InferenceLinear per recipe on that input, in turn (so a burst of noise hits both sides of
    a round), and take the median of the per-round speedups; the confidence is how many rounds
    agree with the decision. SQNR: the FP8 output against the float64 product of the same input
    and weight. A layer goes FP8 with the fastest recipe whose median speedup is at least
    min_speedup and whose SQNR is at least sqnr_floor (25 dB: the NUMERICS.md floor of an FP8
    GEMM). recipes: any of RECIPES (weight_only too: an inference recipe, which the library's
    layerwise casting runs with the input unquantized and its training conversions refuse).
    Returns the policy entries (docs/CHECKPOINTS.md); path: also written there as the policy file
    that `fp8kit quantize --policy`, `fp8kit train --policy` and the library read."""
    where = "fp8kit.torch.advise"
    check_model_args(where, model)
    # Every argument checked before the first timing round: a bad one costs no measuring.
    if path is not None:
        path = fp8kit._path(path, f"{where}: path")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise fp8kit.Error(f"{where}: path {fp8kit._quoted(path)}: its folder does not exist")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise fp8kit.Error(f"{where}: rounds is {fp8kit._quoted(rounds)}, expected an int >= 1")
    if isinstance(recipes, str) or not isinstance(recipes, (tuple, list)) or not recipes:
        raise fp8kit.Error(f"{where}: recipes is {fp8kit._quoted(recipes)}, expected a non-empty tuple of "
                           f"some of {', '.join(RECIPES)}")
    for r in recipes:
        if r not in RECIPES:
            raise fp8kit.Error(f"{where}: recipe {fp8kit._quoted(str(r))}, expected some of {', '.join(RECIPES)}")
    recipes = tuple(recipes)
    for name, value in (("min_speedup", min_speedup), ("sqnr_floor", sqnr_floor)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise fp8kit.Error(f"{where}: {name} is {fp8kit._quoted(value)}, expected a finite number")
    linears = [(fqn, m) for fqn, m in model.named_modules() if type(m) is nn.Linear]
    seen = {}  # fqn -> the layer's first input

    def capture(fqn):
        def hook(module, args, out):  # returns None: a forward hook's return value replaces the output
            seen.setdefault(fqn, args[0].detach())
        return hook

    handles = [m.register_forward_hook(capture(fqn)) for fqn, m in linears]
    try:
        with torch.no_grad():
            model(*example_inputs) if isinstance(example_inputs, tuple) else model(example_inputs)
    finally:
        for h in handles:
            h.remove()
    entries = []
    with torch.no_grad():
        for fqn, m in linears:
            if fqn not in seen or not has_weights(m):
                entries.append({"name": fqn + ".weight", "fp8": False, "recipe": None,
                                "reason": "no weights (in or out features 0): nothing to hold in FP8"
                                if fqn in seen else "not run by the example inputs: nothing measured"})
                continue
            x = seen[fqn].float().reshape(-1, m.in_features)
            ref = x.double() @ m.weight.double().T + (0 if m.bias is None else m.bias.double())
            base = m if m.weight.dtype == torch.float32 else copy.deepcopy(m).float()  # (.float() is in place)
            candidates = {r: Float8InferenceLinear.from_linear(base, r) for r in recipes}
            ratios = {r: [] for r in recipes}
            for i in range(rounds):
                order = list(recipes[i % len(recipes):] + recipes[:i % len(recipes)])
                f32 = _seconds_per_call(lambda: base(x))
                for r in order:
                    ratios[r].append(f32 / _seconds_per_call(lambda c=candidates[r]: c(x)))
            rows = []
            for r in recipes:
                y = candidates[r](x).double()
                err = (y - ref).square().sum().item()
                sqnr = math.inf if err == 0 else 10 * math.log10(ref.square().sum().item() / err)
                rows.append((statistics.median(ratios[r]), sqnr, r))
            good = [row for row in rows if row[0] >= min_speedup and row[1] >= sqnr_floor]
            speed, sqnr, recipe = max(good) if good else max(rows)
            agree = sum((s >= min_speedup) == bool(good) for s in ratios[recipe])
            what = ("faster and accurate" if good else
                    "not accurate" if speed >= min_speedup else "not faster")
            entries.append({"name": fqn + ".weight", "fp8": bool(good), "recipe": recipe if good else None,
                            "reason": f"{what}: {recipe} {speed:.2f}x f32 at M={x.shape[0]} (median of {rounds} rounds, "
                                      f"{agree}/{rounds} agree; need {min_speedup:.2f}x), sqnr {sqnr:.1f} dB "
                                      f"(floor {sqnr_floor:g})"})
    if path is not None:
        fp8kit._fp8kit.write_policy(path, [(e["name"], e["fp8"], e["recipe"], e["reason"]) for e in entries])
    return entries
