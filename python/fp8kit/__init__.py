"""fp8kit: exact FP8 formats, scaling and quantization, from numpy arrays and torch tensors.

The C++ library through its extension (fp8kit._fp8kit), with the dtypes users hold: numpy arrays
in, numpy arrays out; torch tensors in, torch tensors out - FP8 codes as torch.float8_* tensors,
which DLPack cannot carry, so they cross as uint8 views (no copy either way). Bit for bit what
ml_dtypes and torch's casts give (tests/python/test_package.py).

    import fp8kit, torch
    codes = fp8kit.encode(torch.randn(4, 8), "e4m3fn")        # torch.float8_e4m3fn
    q = fp8kit.quantize(x, scaling="row")                       # QTensor: data, scale_inv, amax
    y = fp8kit.dequantize(q)

Errors are fp8kit.Error, a ValueError carrying the library's message.
"""
import sys

import numpy as np

from . import _fp8kit
from ._fp8kit import Error, QTensor, format_max, formats, num_threads, set_num_threads

__version__ = _fp8kit.__version__
Error.__module__ = QTensor.__module__ = "fp8kit"  # as users name them
__all__ = ["Error", "QTensor", "decode", "dequantize", "encode", "format_max", "formats", "num_threads",
           "quantize", "set_num_threads"]


def _torch():
    return sys.modules.get("torch")  # torch is optional: only a caller holding tensors has it loaded


def _name(kind):
    """A format or dtype given as a name ("e4m3fn", "float8_e4m3fn", "bfloat16") or as a torch,
    numpy or ml_dtypes dtype: its name."""
    if isinstance(kind, str):
        return kind
    return getattr(kind, "__name__", None) or str(kind).rsplit(".", 1)[-1]


def _is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_fp8_dtype(format):
    torch = _torch()
    name = "float8_" + _name(format).removeprefix("float8_")
    name = {"float8_e4m3": "float8_e4m3fn", "float8_e8m0": "float8_e8m0fnu"}.get(name, name)
    dtype = getattr(torch, name, None)
    if dtype is None:
        raise Error(f"fp8kit: torch {torch.__version__} has no dtype for format {format!r}")
    return dtype


def _to_extension(x):
    """What the extension reads: numpy arrays as they are; torch tensors through DLPack (FP8 and
    bfloat16 as their bits: DLPack readers differ on those)."""
    if _is_torch(x):
        torch = _torch()
        x = x.detach()
        if x.dtype.itemsize == 1 and x.dtype.is_floating_point:
            return x.view(torch.uint8)
        return x
    if isinstance(x, np.ndarray) or hasattr(x, "__dlpack__"):
        return x
    raise Error(f"fp8kit: expected a numpy array or a torch tensor, got {type(x).__name__}")


def _bf16_out(bits, like_torch):
    """bfloat16 bits (uint16) as torch.bfloat16, or as ml_dtypes.bfloat16 when ml_dtypes is there."""
    if like_torch:
        torch = _torch()
        return torch.from_numpy(bits).view(torch.bfloat16)
    try:
        import ml_dtypes
    except ImportError:
        return bits  # the bits, as uint16: numpy has no bfloat16 of its own
    return bits.view(ml_dtypes.bfloat16)


def encode(x, format="e4m3fn", overflow="saturate"):
    """FP8 codes of float32 / bfloat16 / float16 x (round to nearest even, one rounding).

    overflow: "saturate" (+-max, TransformerEngine) or "nonsaturating" (Inf or NaN: what
    ml_dtypes' astype and torch's .to(float8) give). A NaN or Inf input is never made finite.
    Returns uint8 codes for numpy input, a torch.float8_* tensor for torch input.
    """
    codes = _fp8kit.encode(_to_extension(x), _name(format), overflow)
    if _is_torch(x):
        return _torch().from_numpy(codes).view(_torch_fp8_dtype(format))
    return codes


def decode(codes, format=None, dtype="float32"):
    """The values of FP8 codes (uint8 with a format, or a torch.float8_* tensor): float32 exact,
    or rounded once to bfloat16 / float16."""
    if format is None:
        if not _is_torch(codes) or codes.dtype.itemsize != 1 or not codes.dtype.is_floating_point:
            raise Error("fp8kit.decode: format is required unless codes is a torch.float8_* tensor")
        format = codes.dtype
    dtype_name = _name(dtype)
    values = _fp8kit.decode(_to_extension(codes), _name(format), dtype_name)
    if dtype_name == "bfloat16":
        return _bf16_out(values, _is_torch(codes))
    return _torch().from_numpy(values) if _is_torch(codes) else values


def quantize(x, format="e4m3fn", scaling="tensor", *, overflow="saturate", power_of_two=False, amax_epsilon=0.0,
             mx_rounding="floor", non_finite="propagate", transpose=False):
    """Scale per group and cast to FP8 (docs/NUMERICS.md): a QTensor with .data (codes),
    .scale_inv (dequantized = decode(code) * scale_inv[group]) and .amax, as numpy arrays.

    scaling: "tensor", "row", "column", "block(1x128)", "block(128x128)" (any "block(RxC)") or
    "mx32". transpose=True also keeps quantize(x.T) in .data_t / .scale_inv_t (cast_transpose).
    non_finite="error" raises naming the first NaN / Inf instead of propagating it.
    """
    return _fp8kit.quantize(_to_extension(x), _name(format), scaling, overflow, power_of_two, amax_epsilon,
                            mx_rounding, non_finite, transpose)


def dequantize(q, dtype="float32"):
    """decode(code) * scale_inv of its group: float32, or rounded once to bfloat16 / float16."""
    dtype_name = _name(dtype)
    values = _fp8kit.dequantize(q, dtype_name)
    return _bf16_out(values, False) if dtype_name == "bfloat16" else values
