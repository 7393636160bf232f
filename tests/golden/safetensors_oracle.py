"""tests/golden/safetensors_oracle.py: the safetensors Python package and PyTorch as the outside
oracle for fp8kit's safetensors reader and writer (driven by tests/golden/test_safetensors_py.cpp).

  safetensors_oracle.py write DIR   torch tensors of every safetensors dtype (random bits) saved by
                                    safetensors.torch.save_file to DIR/torch.safetensors with
                                    metadata; each tensor's bytes (torch's own memory) in
                                    DIR/<i>.bin and DIR/manifest.json [{name, dtype, shape, bin}].
  safetensors_oracle.py check DIR   loads DIR/fp8kit.safetensors (written by fp8kit from DIR's
                                    manifest) with safetensors.torch.load_file and safe_open: every
                                    tensor's torch dtype, shape and bytes, and the metadata, must be
                                    the manifest's.

Exit 77 (skip) only when torch or safetensors is not installed (tests/oracle_skip.py); any mismatch: exit 1 with the reason.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from oracle_skip import require  # noqa: E402  (tests/oracle_skip.py: skip only when not installed)

torch, safetensors, safetensors_torch = require("torch", "safetensors", "safetensors.torch")
safe_open, load_file, save_file = safetensors.safe_open, safetensors_torch.load_file, safetensors_torch.save_file

TORCH = {
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz, "F8_E8M0": torch.float8_e8m0fnu, "BF16": torch.bfloat16,
    "F16": torch.float16, "F32": torch.float32, "F64": torch.float64, "I8": torch.int8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8, "U16": torch.uint16, "U32": torch.uint32,
    "U64": torch.uint64, "BOOL": torch.bool,
}
SHAPES = [[3, 5], [7], [], [2, 0], [2, 3, 4]]
METADATA = {"format": "pt", "quantization_config": '{"quant_method": "fp8"}'}


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write(d):
    g = torch.Generator().manual_seed(5)
    tensors, manifest = {}, []
    for i, (name, dt) in enumerate(TORCH.items()):
        shape = SHAPES[i % len(SHAPES)]
        n = 1
        for s in shape:
            n *= s
        size = torch.empty(0, dtype=dt).element_size()
        if dt == torch.bool:
            t = torch.randint(0, 2, shape, generator=g).to(torch.bool)
        else:
            t = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g).view(dt).reshape(shape)
        key = f"t.{name.lower()}"
        tensors[key] = t
        with open(os.path.join(d, f"{i}.bin"), "wb") as f:
            f.write(raw(t))
        manifest.append({"name": key, "dtype": name, "shape": shape, "bin": f"{i}.bin"})
    save_file(tensors, os.path.join(d, "torch.safetensors"), metadata=METADATA)
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump({"tensors": manifest, "metadata": METADATA}, f)


def check(d):
    with open(os.path.join(d, "manifest.json")) as f:
        m = json.load(f)
    path = os.path.join(d, "fp8kit.safetensors")
    loaded = load_file(path)
    errors = []
    if sorted(loaded) != sorted(e["name"] for e in m["tensors"]):
        errors.append(f"names {sorted(loaded)}")
    for e in m["tensors"]:
        t = loaded.get(e["name"])
        if t is None:
            continue
        if t.dtype != TORCH[e["dtype"]]:
            errors.append(f"{e['name']}: dtype {t.dtype}, expected {TORCH[e['dtype']]}")
        if list(t.shape) != e["shape"]:
            errors.append(f"{e['name']}: shape {list(t.shape)}, expected {e['shape']}")
        with open(os.path.join(d, e["bin"]), "rb") as f:
            if raw(t) != f.read():
                errors.append(f"{e['name']}: bytes differ")
    with safe_open(path, "pt") as f:
        if f.metadata() != m["metadata"]:
            errors.append(f"metadata {f.metadata()}, expected {m['metadata']}")
        if list(f.keys()) != sorted(e["name"] for e in m["tensors"]):
            errors.append(f"keys {list(f.keys())}")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)


{"write": write, "check": check}[sys.argv[1]](sys.argv[2])
