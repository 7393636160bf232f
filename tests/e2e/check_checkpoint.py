"""tests/e2e/check_checkpoint.py ORIG QUANT SCHEME: PyTorch as the outside oracle for a checkpoint
`fp8kit quantize --scheme SCHEME` wrote. Loads both (a file, or every *.safetensors of a
directory) with safetensors.torch and checks, for every 2-D floating weight of ORIG:
  - embeddings, norms and lm_head are unchanged (bit for bit);
  - the others are float8_e4m3fn with the scale tensor of the community layout:
      tensor   W_scale     [1]        in W's dtype (compressed-tensors)
      channel  W_scale     [out, 1]   in W's dtype (compressed-tensors)
      block128 W_scale_inv float32 [ceil(out/128), ceil(in/128)]   (DeepSeek-V3)
      mx32     W_scale     float8_e8m0fnu [out, ceil(in/32)]
  - dequantized here in float64 (W * scale broadcast over its group), the SQNR against ORIG is at
    least 25 dB (docs/NUMERICS.md's floor for N(0,1) weights) and below 60 dB (it was quantized);
  - quantization_config in the metadata names the layout: compressed-tensors with the scheme as
    its weights' strategy for tensor / channel (fp8kit quantize's default layout for them),
    fp8kit for block128 and mx32 (written with --layout fp8kit: these weights are not whole
    128x128 blocks), with weight_block_size [128, 128] for block128 only; lm_head listed by its
    module name.
Exit 77 (skip) only when torch or safetensors is not installed (tests/oracle_skip.py); a failure:
exit 1 with the reasons.
"""
import glob
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from oracle_skip import require  # noqa: E402  (exit 77 only when a module is not installed)

torch = require("torch")
require("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402


def files(path):
    return sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]


def load(path):
    out = {}
    for f in files(path):
        out.update(load_file(f))
    return out


def main():
    orig_path, quant_path, scheme = sys.argv[1:4]
    orig, quant = load(orig_path), load(quant_path)
    errors = []
    floats = (torch.float32, torch.float16, torch.bfloat16)
    for name, w in orig.items():
        if w.dim() != 2 or w.dtype not in floats:
            if not torch.equal(quant[name], w):
                errors.append(f"{name}: changed")
            continue
        q = quant[name]
        if re.search("embed|norm|lm_head", name):
            if q.dtype != w.dtype or not torch.equal(q, w):
                errors.append(f"{name}: should have been kept as it was")
            continue
        out, inp = w.shape
        if q.dtype != torch.float8_e4m3fn or q.shape != w.shape:
            errors.append(f"{name}: {q.dtype} {list(q.shape)}, expected float8_e4m3fn {list(w.shape)}")
            continue
        sname = name + ("_scale_inv" if scheme == "block128" else "_scale")
        s = quant.get(sname)
        # compressed-tensors (tensor, channel here) keeps scales in the weight's dtype.
        want = {"tensor": (w.dtype, [1]), "channel": (w.dtype, [out, 1]),
                "block128": (torch.float32, [math.ceil(out / 128), math.ceil(inp / 128)]),
                "mx32": (torch.float8_e8m0fnu, [out, math.ceil(inp / 32)])}[scheme]
        if s is None or s.dtype != want[0] or list(s.shape) != want[1]:
            got = "missing" if s is None else f"{s.dtype} {list(s.shape)}"
            errors.append(f"{sname}: {got}, expected {want[0]} {want[1]}")
            continue
        sd = s.to(torch.float32).double()
        if scheme == "block128":
            sd = sd.repeat_interleave(128, 0)[:out].repeat_interleave(128, 1)[:, :inp]
        elif scheme == "mx32":
            sd = sd.repeat_interleave(32, 1)[:, :inp]
        deq = q.to(torch.float32).double() * sd
        ref = w.double()
        sqnr = 20 * math.log10(ref.norm().item() / (ref - deq).norm().item())
        if not 25 <= sqnr < 60:
            errors.append(f"{name}: SQNR {sqnr:.2f} dB, expected in [25, 60)")
    with safe_open(files(quant_path)[0], "pt") as f:
        qc = json.loads(f.metadata().get("quantization_config", "{}"))
    if scheme in ("tensor", "channel"):
        groups = list(qc.get("config_groups", {}).values())
        if qc.get("quant_method") != "compressed-tensors" or len(groups) != 1 or groups[0]["weights"]["strategy"] != scheme \
                or "lm_head" not in qc.get("ignore", []):
            errors.append(f"quantization_config {qc}")
    elif qc.get("quant_method") != "fp8kit" or qc.get("weight_block_size") != ([128, 128] if scheme == "block128" else None) \
            or "lm_head" not in qc.get("modules_to_not_convert", []):
        errors.append(f"quantization_config {qc}")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)


main()
