"""bench/bench_torch_cuda.py: fp8kit.torch on a CUDA GPU beside torch's bfloat16, eager (no
torch.compile), the same data, GPU and process:
  - inference: a Linear layer after fp8kit.torch.quantize_ (rowwise, tensorwise, block; bf16 x
    cast to FP8 inside fp8kit's call) against nn.Linear in bfloat16, at prefill (M = 8192) and
    decode (M = 1, 4, 16) sizes, widths 2048 - 8192;
  - training: a stack of 4 Linear layers (width W = 2048 - 16384, 8192 tokens, bf16 parameters) -
    forward, backward and AdamW - after fp8kit.torch.convert_to_float8_training (tensorwise,
    rowwise; tensorwise with auto_filter, which leaves the layers too small to gain in bf16) against
    the same stack in bfloat16, eager; at W >= 8192 also torchao's
    convert_to_float8_training under torch.compile (its recommended use), where torchao imports.
    The loss after 50 steps beside bf16's.
  - decode: the GEMM at a decode step's 1-16 rows (fp8kit.gemm, torch._scaled_mm on the same
    codes, torch's bf16 matmul), GPU time, each D checked against float64;
  - host cost: the host time of one call of each entry point (quantize, with the transposed copy,
    gemm, the inference layer, the training layer's forward, its backward) with the GPU kept busy
    by a queued sleep, so that a call that waits for the GPU shows as the sleep's length.
  - model: a Llama from a transformers config (886M parameters, random weights), as a user runs
    it on a GPU: bf16 from its checkpoint; the FP8 checkpoint `fp8kit quantize` writes of it in
    the layout of DeepSeek's and Qwen's FP8 releases (transformers' FineGrainedFP8: 128x128
    blocks, lm_head kept) loaded by transformers itself (its FP8 layers) and by
    fp8kit.torch.from_pretrained + .cuda(); the bf16 model after fp8kit.torch.quantize_
    (rowwise); and after torchao's quantize_ with Float8DynamicActivationFloat8WeightConfig(PerRow())
    where torchao imports. Each: the GPU
    memory its weights hold, prefill (4 x 1024 tokens) and greedy decode (the median of 32 steps
    after a 128-token prompt, a DynamicCache, after one such pass), and its prefill logits against
    bf16's.
Each time is the median of 5 runs of repeated calls between CUDA events, after a warm-up. Each
result is checked: an inference output within 0.1 relative RMS of the bf16 layer's (FP8 rounding
gives about 0.03), the FP8 losses within 1 % of bf16's after 50 steps, a model's logits within
0.5 relative RMS of bf16's (113 FP8 GEMMs deep: model_section says why); a failed check exits 1.
Usage: python3 bench/bench_torch_cuda.py [--quick] [--json PATH] [--sections host,decode,inference,train,model]
[--fp8kit PATH-TO-THE-fp8kit-COMMAND] (the model section's checkpoint writer; default build/release/fp8kit);
scripts/cuda_device_check.sh runs it on the GPU machine (with the fp8kit package built there or
carried).
"""
import gc
import json
import os
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


def gpu_seconds(fn, calls=200):
    """The GPU's seconds a call of fn, the host's calls queued behind a sleep first (so that a
    call's host cost, which exceeds a decode-size GEMM's, is not what the events time)."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(60_000_000)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e-3 / calls


def decode_gemm(results):
    """The GEMM at a decode step's rows (m x 8192 x 8192, e4m3, rowwise and tensorwise): fp8kit.gemm
    on FP8 operands beside torch._scaled_mm on the same codes and scales and torch's bf16 matmul,
    GPU time. Each fp8kit D is checked against the float64 product of the codes: within
    2^-11 sum|a b| (cuBLASLt's allowance in tests/ops/test_gemm.cpp, the looser engine) plus bf16's
    rounding of D, where a row's scale applied to its neighbour is off by far more."""
    def operand(q, scaling):  # the codes as torch's FP8, the scales as a column (row) or a scalar, float64 values
        codes, scales = q.data.view(torch.float8_e4m3fn), q.scale_inv.float()
        scales = scales.reshape(-1, 1) if scaling == "row" else scales.reshape(())
        return codes, scales, codes.double() * scales.double()

    failures = 0
    g = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=g)
    for scaling in ("row", "tensor"):
        qw = fp8kit.quantize(w, scaling=scaling)
        pw = fp8kit.PackedWeight(qw)
        b8, sb, b64 = operand(qw, scaling)
        sb = sb.reshape(1, -1) if scaling == "row" else sb  # torch._scaled_mm takes B's row scales as a row
        for m in (1, 2, 4, 8, 16):
            x = torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16, generator=g) * torch.exp2(
                torch.randint(-4, 4, (m, 1), device="cuda", generator=g).to(torch.bfloat16))
            qx = fp8kit.quantize(x, scaling=scaling)
            a8, sa, a64 = operand(qx, scaling)
            d64, sab = a64 @ b64.T, a64.abs() @ b64.abs().T
            got = fp8kit.gemm(qx, pw, out_dtype="bfloat16").double()
            ok = bool(torch.all((got - d64).abs() <= 2.0 ** -11 * sab + 2.0 ** -8 * d64.abs()))
            failures += not ok
            t = {"fp8kit": gpu_seconds(lambda: fp8kit.gemm(qx, pw, out_dtype="bfloat16")),
                 "torch._scaled_mm": gpu_seconds(lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb,
                                                                           out_dtype=torch.bfloat16)),
                 "torch.bf16": gpu_seconds(lambda: x @ w.t())}
            results.append({"bench": "decode_gemm", "scaling": scaling, "m": m, "n": 8192, "k": 8192,
                            **{f"{k}_s": v for k, v in t.items()}, "ok": ok})
            print(f"decode GEMM {scaling:6s} m={m:2d} 8192^2 (GPU us): fp8kit {t['fp8kit'] * 1e6:6.1f}  torch._scaled_mm "
                  f"{t['torch._scaled_mm'] * 1e6:6.1f}  bf16 {t['torch.bf16'] * 1e6:6.1f}{'' if ok else '  WRONG'}")
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


LLAMA = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
             num_key_value_heads=8, max_position_embeddings=4096)


def _model_way(name, bf16_dir, fp8_dir):
    """The model of one way, on the GPU, in eval mode; None (saying why) where a peer's tool does
    not import or run here."""
    import transformers
    if name == "fp8kit.from_pretrained":
        return fp8_torch.from_pretrained(fp8_dir).cuda()
    if name == "transformers.fp8ckpt":  # transformers' own FineGrainedFP8 layers on the GPU
        try:
            return transformers.AutoModelForCausalLM.from_pretrained(fp8_dir, device_map="cuda").eval()
        except Exception as e:  # a peer that cannot run here is reported, not a failure of fp8kit's
            print(f"transformers' FP8 checkpoint loading: {type(e).__name__}: {str(e)[:200]}; left out")
            return None
    model = transformers.AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.bfloat16).cuda().eval()
    keep_head = lambda m, fqn: isinstance(m, nn.Linear) and fqn != "lm_head"  # noqa: E731 - as the FP8 checkpoint
    if name == "fp8kit.quantize_":
        fp8_torch.quantize_(model, "rowwise", filter_fn=keep_head)
    elif name == "torchao.quantize_":
        try:
            from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
        except ImportError as e:
            print(f"torchao: not importable ({e}); its FP8 inference is left out")
            return None
        quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()), filter_fn=keep_head)
    return model


def model_section(fp8kit_cmd, results):
    """Each way's weight memory, prefill and decode speed, and logits against bf16's (see the
    module's docstring), in this process one after another."""
    import subprocess
    import tempfile
    import transformers
    failures = 0
    tmp = tempfile.mkdtemp(prefix="fp8kit-bench-model-")
    bf16_dir, fp8_dir = f"{tmp}/llama-bf16", f"{tmp}/llama-fp8"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).to(torch.bfloat16).save_pretrained(bf16_dir)
    subprocess.run([fp8kit_cmd, "quantize", bf16_dir, fp8_dir, "--scheme", "block128", "--layout", "hf-fp8", "--quiet"],
                   check=True, stdout=subprocess.DEVNULL)
    g = torch.Generator().manual_seed(3)
    prefill_ids = torch.randint(0, LLAMA["vocab_size"], (4, 1024), generator=g).cuda()
    prompt = prefill_ids[:1, :128]
    want = None
    for name in ("bf16", "transformers.fp8ckpt", "fp8kit.from_pretrained", "fp8kit.quantize_", "torchao.quantize_"):
        gc.collect()  # the last way's model gone before the baseline (its cycles too)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        model = _model_way(name, bf16_dir, fp8_dir)
        if model is None:
            continue
        torch.cuda.synchronize()
        load_s, weights = time.perf_counter() - t0, torch.cuda.memory_allocated() - before
        with torch.no_grad():
            try:
                logits = model(prefill_ids).logits[:, -64:].float()  # also the warm-up
            except Exception as e:
                if name.startswith("fp8kit") or name == "bf16":
                    raise
                print(f"{name}: {type(e).__name__}: {str(e)[:200]}; left out")  # a peer that cannot run here
                del model
                continue
            prefill_s = median_seconds(lambda: model(prefill_ids), 1)
            for _ in range(2):  # the first pass a warm-up: each cache length's kernels met once
                out = model(prompt, use_cache=True)
                tok, steps = out.logits[:, -1:].argmax(-1), []
                for _ in range(32):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = model(tok, past_key_values=out.past_key_values, use_cache=True)
                    tok = out.logits[:, -1:].argmax(-1)
                    torch.cuda.synchronize()
                    steps.append(time.perf_counter() - t0)
        decode_s = sorted(steps)[16]
        if want is None:
            want, base = logits, {"prefill_s": prefill_s, "decode_s": decode_s, "weights": weights}
        err = rel_rms(logits, want)
        top1 = (logits.argmax(-1) == want.argmax(-1)).float().mean().item()
        # Each FP8 GEMM's output is off bf16's by 0.037 relative RMS (the inference section); the
        # logits pass 16 layers' 7 GEMMs (and lm_head): independent errors add to about
        # 0.037 * sqrt(113) = 0.39. A wrong scale, layout or layer gives 1 or more.
        ok = err < 0.5
        failures += not ok
        results.append({"bench": "model", "way": name, "params": sum(p.numel() for p in model.parameters()),
                        "gpu_weight_bytes": weights, "load_s": load_s, "prefill_tokens": prefill_ids.numel(),
                        "prefill_s": prefill_s, "decode_step_s": decode_s,
                        "prefill_vs_bf16": base["prefill_s"] / prefill_s, "decode_vs_bf16": base["decode_s"] / decode_s,
                        "logits_rel_rms_vs_bf16": err, "top1_agreement_vs_bf16": top1, "ok": ok})
        print(f"model {name:24s}: weights {weights / 2**20:7.0f} MiB ({weights / base['weights']:.2f}x)  load "
              f"{load_s:5.1f} s  prefill {prefill_s * 1e3:7.2f} ms ({base['prefill_s'] / prefill_s:4.2f}x)  decode "
              f"{decode_s * 1e3:6.2f} ms/token ({base['decode_s'] / decode_s:4.2f}x)  logits rel_rms {err:.3f} "
              f"top-1 {top1:.2f}{'' if ok else '  FAILED'}")
        del model, out
    return failures


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    path = args[args.index("--json") + 1] if "--json" in args else None
    sections = args[args.index("--sections") + 1].split(",") if "--sections" in args else ["host", "decode", "inference", "train", "model"]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, fp8kit {fp8kit.__version__}")
    results = []
    widths = (2048, 4096) if quick else (2048, 4096, 8192)
    failures = 0
    if "host" in sections:
        host_cost(results)
    if "decode" in sections:
        failures += decode_gemm(results)
    if "inference" in sections:
        failures += inference(widths, (1, 4, 16, 8192), results)
    if "train" in sections:
        failures += train(widths if quick else widths + (16384,), 8192, 50, results)
    if "model" in sections:
        failures += model_section(args[args.index("--fp8kit") + 1] if "--fp8kit" in args else "build/release/fp8kit",
                                  results)
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "FP8KIT_CUDA_GEMV": os.environ.get("FP8KIT_CUDA_GEMV", "cuda_cores"), "results": results}, f, indent=1)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
