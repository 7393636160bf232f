"""bench/bench_torch_cuda.py: fp8kit.torch on a CUDA GPU beside torch's bfloat16, eager (no
torch.compile), the same data, GPU and process:
  - inference: a Linear layer after fp8kit.torch.quantize_ (rowwise, tensorwise, block; bf16 x
    cast to FP8 inside fp8kit's call) against nn.Linear in bfloat16, at prefill (M = 8192) and
    decode (M = 1, 16) sizes, widths 2048 - 8192;
  - training: a stack of 4 Linear layers (width W = 2048 - 16384, 8192 tokens, bf16 parameters) -
    forward, backward and AdamW - after fp8kit.torch.convert_to_float8_training (tensorwise,
    rowwise; tensorwise with auto_filter, which leaves the layers too small to gain in bf16) against
    the same stack in bfloat16, eager; at W >= 8192 also torchao's
    convert_to_float8_training under torch.compile (its recommended use), where torchao imports.
    The loss after 50 steps beside bf16's.
  - host cost: the host time of one call of each entry point (quantize, with the transposed copy,
    gemm, the inference layer, the training layer's forward, its backward) with the GPU kept busy
    by a queued sleep, so that a call that waits for the GPU shows as the sleep's length.
Each time is the median of 5 runs of repeated calls between CUDA events, after a warm-up. Each
result is checked: an inference output within 0.1 relative RMS of the bf16 layer's (FP8 rounding
gives about 0.03), the FP8 losses within 1 % of bf16's after 50 steps; a failed check exits 1.
Usage: python3 bench/bench_torch_cuda.py [--quick] [--json PATH] [--sections host,inference,train];
scripts/cuda_device_check.sh runs it on the GPU machine (with the fp8kit package built there or
carried).
"""
import json
import sys
import time

import torch
from torch import nn

import fp8kit
import fp8kit.torch as fp8_torch
from bench_gemm_cuda_torch import median_seconds  # beside this file: CUDA events, median of 5


def rel_rms(got, want):
    return ((got.float() - want.float()).square().mean() / want.float().square().mean()).sqrt().item()


def inference(widths, ms, results):
    failures = 0
    for w in widths:
        torch.manual_seed(0)
        base = nn.Linear(w, w, bias=False, device="cuda", dtype=torch.bfloat16)
        for recipe in ("rowwise", "tensorwise", "block"):
            twin = nn.Sequential(nn.Linear(w, w, bias=False, device="cuda", dtype=torch.bfloat16))
            twin[0].weight.data.copy_(base.weight.data)
            fp8_torch.quantize_(twin, recipe)  # quantized on the GPU
            layer = twin[0]
            for m in ms:
                x = torch.randn(m, w, device="cuda", dtype=torch.bfloat16)
                calls = max(1, min(200, int(4e11 / (2 * m * w * w))))
                with torch.no_grad():
                    t_bf16 = median_seconds(lambda: base(x), calls)
                    t_fp8 = median_seconds(lambda: layer(x), calls)
                    err = rel_rms(layer(x), base(x))
                ok = err < 0.1
                failures += not ok
                results.append({"bench": "linear_inference", "recipe": recipe, "m": m, "width": w,
                                "bf16_s": t_bf16, "fp8kit_s": t_fp8, "vs_bf16": t_bf16 / t_fp8, "rel_rms": err,
                                "ok": ok})
                print(f"inference {recipe:10s} M={m:5d} W={w:5d}: bf16 {t_bf16 * 1e6:9.1f} us  fp8kit "
                      f"{t_fp8 * 1e6:9.1f} us  {t_bf16 / t_fp8:5.2f}x  rel_rms {err:.3f}{'' if ok else '  FAILED'}")
    return failures


def host_cost(results):
    """Host seconds per call, 50 calls behind ~0.5 s of queued GPU sleep: a call that synchronises
    with the GPU takes the sleep's length (reported as waits)."""
    w = 4096
    x = torch.randn(4096, w, device="cuda", dtype=torch.bfloat16)
    qx = fp8kit.quantize(x, scaling="row")
    pw = fp8kit.PackedWeight(fp8kit.quantize(torch.randn(w, w, device="cuda", dtype=torch.bfloat16), scaling="row"))
    model = nn.Sequential(nn.Linear(w, w, bias=False, device="cuda", dtype=torch.bfloat16))
    fp8_torch.quantize_(model, "rowwise")
    train = fp8_torch.convert_to_float8_training(nn.Linear(w, w, bias=False, device="cuda", dtype=torch.bfloat16),
                                                 config="rowwise")
    xg = x.detach().requires_grad_()
    dy = torch.randn_like(x)
    graphs = []  # forwards made ahead, whose backwards are timed

    cases = {"quantize row": lambda: fp8kit.quantize(x, scaling="row"),
             "quantize row + transpose": lambda: fp8kit.quantize(x, scaling="row", transpose=True),
             "gemm 4096^3 row": lambda: fp8kit.gemm(qx, pw, out_dtype="bfloat16"),
             "inference layer M=16": lambda: model(x[:16]),
             "training layer forward": lambda: train(xg),
             "training layer backward": lambda: graphs.pop().backward(dy),
             "training layer fwd+bwd": lambda: train(xg).backward(dy)}
    for name, fn in cases.items():
        if name == "training layer backward":
            graphs[:] = [train(xg) for _ in range(51)]
        fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000_000)
        start = time.perf_counter()
        for _ in range(50):
            fn()
        host = (time.perf_counter() - start) / 50
        torch.cuda.synchronize()
        waits = host > 5e-3
        results.append({"bench": "host_cost", "call": name, "host_s": host, "waits": waits})
        print(f"host cost {name:26s}: {host * 1e6:9.1f} us a call{'  (WAITS FOR THE GPU)' if waits else ''}")


def stack(w, layers):
    torch.manual_seed(1)
    return nn.Sequential(*[nn.Linear(w, w, bias=False) for _ in range(layers)]).cuda().to(torch.bfloat16)


def torchao_float8():
    """torchao's convert_to_float8_training and Float8LinearConfig, or None where torchao does not
    import (it is not in the GPU machine's image: carried as a wheel)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        print(f"torchao: not importable ({e}); its compiled float8 training is left out")
        return None
    return convert_to_float8_training, Float8LinearConfig


def train(widths, tokens, steps, results):
    """Each configuration's step time (median of 5 runs of 5 steps) and its loss after `steps`
    steps from the same weights and data; fp8kit's and torchao's against bf16's."""
    failures = 0
    torchao = torchao_float8()
    for w in widths:
        x = torch.randn(tokens, w, device="cuda", dtype=torch.bfloat16)
        target = torch.randn(tokens, w, device="cuda", dtype=torch.bfloat16)
        names = ["bf16", "tensorwise", "rowwise", "tensorwise auto_filter"]
        if torchao is not None and w >= 8192:
            names += ["torchao tensorwise compiled", "torchao rowwise compiled"]
        runs = {}
        for name in names:
            model = stack(w, 4)
            if name.startswith("torchao"):
                convert, config = torchao
                convert(model, config=config.from_recipe_name(name.split()[1]))
                forward = torch.compile(model)
            else:
                if name != "bf16":  # auto_filter: the layers it admits in FP8, the others in bf16
                    fp8_torch.convert_to_float8_training(model, config=name.split()[0], module_filter_fn=(
                        fp8_torch.auto_filter() if name.endswith("auto_filter") else None))
                forward = model
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

            def step():
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(forward(x), target)
                loss.backward()
                opt.step()
                return loss

            losses = [step().item() for _ in range(steps)]  # also the warm-up (and torch.compile's)
            runs[name] = (median_seconds(step, 5), losses[-1])
            del model, opt, forward
            torch.cuda.empty_cache()
        t_bf16, loss_bf16 = runs["bf16"]
        for name in names[1:]:
            t, loss = runs[name]
            ok = abs(loss - loss_bf16) <= 0.01 * abs(loss_bf16)
            failures += not ok
            twin = f"torchao {name.split()[0]} compiled"  # torchao's run of the same recipe
            peer = {"vs_torchao_compiled": runs[twin][0] / t} if twin in runs and twin != name else {}
            results.append({"bench": "linear_train_step", "recipe": name, "tokens": tokens, "width": w, "layers": 4,
                            "steps": steps, "bf16_s": t_bf16, "fp8kit_s": t, "vs_bf16": t_bf16 / t, "loss": loss,
                            "loss_bf16": loss_bf16, "ok": ok, **peer})
            print(f"train step {name:27s} W={w:5d}: bf16 {t_bf16 * 1e3:8.2f} ms  this {t * 1e3:8.2f} ms  "
                  f"{t_bf16 / t:5.2f}x" + (f"  ({peer['vs_torchao_compiled']:4.2f}x torchao compiled)"
                                           if peer else "") +
                  f"  loss {loss:.5f} vs {loss_bf16:.5f}{'' if ok else '  FAILED'}")
    return failures


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    path = args[args.index("--json") + 1] if "--json" in args else None
    sections = args[args.index("--sections") + 1].split(",") if "--sections" in args else ["host", "inference", "train"]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, fp8kit {fp8kit.__version__}")
    results = []
    widths = (2048, 4096) if quick else (2048, 4096, 8192)
    failures = 0
    if "host" in sections:
        host_cost(results)
    if "inference" in sections:
        failures += inference(widths, (1, 16, 8192), results)
    if "train" in sections:
        failures += train(widths if quick else widths + (16384,), 8192, 50, results)
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f,
                      indent=1)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
