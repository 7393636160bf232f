"""fp8kit: exact FP8 formats, scaling and quantization, from numpy arrays and torch tensors.

The C++ library through its extension (fp8kit._fp8kit), with the dtypes users hold: numpy arrays
in, numpy arrays out; torch tensors in, torch tensors out - FP8 codes as torch.float8_* tensors,
which DLPack cannot carry, so they cross as uint8 views (no copy either way). Bit for bit what
ml_dtypes and torch's casts give (tests/python/test_package.py); the GEMM within the float32 sum
bound of float64 and beside torch._scaled_mm (tests/python/test_gemm.py).

CUDA tensors (a package built with the cuda backend - `pip install .` builds it when nvcc is
found - on a machine with a GPU: cuda_available()): quantize, dequantize, qtensor, PackedWeight,
gemm and scaled_mm run on the tensor's device, enqueued on torch's current stream, never waiting
for the GPU; their outputs (codes, scales, D) are allocated by torch's caching allocator. encode /
decode and the weight-only GEMM are host-only. Checked on a GPU by tests/python/test_cuda.py.

    import fp8kit, torch
    codes = fp8kit.encode(torch.randn(4, 8), "e4m3fn")        # torch.float8_e4m3fn
    q = fp8kit.quantize(x, scaling="row")                       # QTensor: data, scale_inv, amax
    y = fp8kit.dequantize(q)
    w = fp8kit.PackedWeight(fp8kit.quantize(weight, scaling="row"))  # [out, in], packed once
    d = fp8kit.gemm(x, w, scaling="row")                        # x cast to FP8 inside the GEMM
    d = fp8kit.scaled_mm(a8, b8, scale_a, scale_b, out_dtype=torch.bfloat16)  # torch._scaled_mm's call

Errors are fp8kit.Error, a ValueError carrying the library's message.
"""
import contextlib
import json
import math
import os
import sys

import numpy as np

from . import _fp8kit
from ._fp8kit import (Error, PackedWeight, QTensor, cuda_available, format_max, formats, num_threads,
                      set_num_threads)

__version__ = _fp8kit.__version__
Error.__module__ = QTensor.__module__ = PackedWeight.__module__ = "fp8kit"  # as users name them


def _printable_message(error):
    """An fp8kit.Error's text with its control characters (C0 but tab and newline, DEL, C1) as
    \\xNN: a tensor or module name, a config string or a path from a file, put in a message by
    the Python side, never reaches a terminal raw (the C++ side's messages quote them already)."""
    return "".join(c if c in "\t\n" or not (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f) else f"\\x{ord(c):02x}"
                   for c in ValueError.__str__(error))


Error.__str__ = _printable_message


def _quoted(value):
    """A value from a file or a caller (a tensor or module name, a config field; a JSON value as
    JSON) as the library's messages show it (fp8kit/files.hpp's quote_printable): quoted, control
    characters escaped, cut after 200 bytes plus its length, so that a megabyte-long name never
    becomes a megabyte-long message. A lone surrogate (a JSON string may hold one) shows as its bytes."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return _fp8kit.quote_printable(text.encode("utf-8", "surrogatepass"))


def _path(path, argument):
    """A path argument (str, bytes or os.PathLike) as the library's C++ side takes it: a str
    (os.fsdecode), refused with open()'s ValueError where it holds a null byte - C++ would cut the
    string there and use another file - and with an Error where it is not UTF-8 (the C++ side's
    paths are)."""
    path = os.fsdecode(os.fspath(path))
    if "\0" in path:
        raise ValueError(f"{argument}: embedded null byte")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise Error(f"{argument}: {_fp8kit.quote_printable(os.fsencode(path))} is not UTF-8; fp8kit takes UTF-8 "
                    "paths") from None
    return path

__all__ = ["Error", "PackedWeight", "QTensor", "cuda_available", "decode", "dequantize", "encode", "format_max",
           "formats", "gemm", "num_threads", "qtensor", "quantize", "scaled_mm", "set_num_threads"]


def _torch():
    return sys.modules.get("torch")  # torch is optional: only a caller holding tensors has it loaded


def _name(kind):
    """A format or dtype given as a name ("e4m3fn", "float8_e4m3fn", "bfloat16") or as a torch,
    numpy or ml_dtypes dtype: its name. Anything else - a number, None, a name holding a null
    character (C++ would read the name up to it) - an Error showing it."""
    if isinstance(kind, str):
        if "\0" in kind:
            raise Error(f"fp8kit: the name {_quoted(kind)} holds a null character")
        return kind
    if kind is None or isinstance(kind, (bool, int, float, complex, bytes)):
        raise Error(f"fp8kit: {kind!r} ({type(kind).__name__}) where a format or dtype is asked: give its name "
                    "(\"e4m3fn\", \"bfloat16\") or a torch / numpy dtype")
    return getattr(kind, "__name__", None) or str(kind).rsplit(".", 1)[-1]


def _is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _format_name(format):
    """A format given as a name ("e4m3fn", "float8_e4m3fn", the short "e4m3") or a float8 dtype:
    its full name ("e4m3fn")."""
    name = _name(format).removeprefix("float8_")
    return {"e4m3": "e4m3fn", "e8m0": "e8m0fnu"}.get(name, name)  # the short names parse_format takes


def _torch_fp8_dtype(format):
    torch = _torch()
    name = "float8_" + _format_name(format)
    dtype = getattr(torch, name, None)
    if dtype is None:
        raise Error(f"fp8kit: torch {torch.__version__} has no dtype for format {format!r}")
    return dtype


class _DLPack:
    """A torch tensor as the extension takes it: a fresh DLPack capsule of its memory each time one
    is asked for (torch.utils.dlpack.to_dlpack) - not a numpy view, which makes the storage
    non-resizable under the caller (FSDP2 resizes its parameters' storage), not the tensor's own
    __dlpack__, which makes torch's default stream wait for the current one, and not one capsule,
    which an argument conversion that nanobind retries would find already used."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, **kwargs):
        return _torch().utils.dlpack.to_dlpack(self.tensor)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


def _check_device(x):
    """x (a torch tensor) is on a device fp8kit computes on, or an Error naming its device (nanobind
    would answer with a TypeError listing signatures; torch's operators would run their fakes on
    the meta device)."""
    if x.device.type not in ("cpu", "cuda"):
        raise Error(f"fp8kit: a tensor on device '{x.device}': fp8kit computes on the CPU and on CUDA devices")


def _to_extension(x):
    """What the extension reads, never a copy: numpy arrays as they are; torch tensors (CPU or
    CUDA) through _DLPack. FP8 crosses as its codes (uint8): DLPack readers differ on float8. A
    tensor on any other device is an Error naming it."""
    if _is_torch(x):
        torch = _torch()
        _check_device(x)
        x = x.detach()
        if x.dtype.itemsize == 1 and x.dtype.is_floating_point:
            x = x.view(torch.uint8)
        return _DLPack(x)
    if isinstance(x, np.ndarray):
        name = x.dtype.name
        if name.startswith("float8_"):  # ml_dtypes' FP8: the codes (the format travels beside them)
            return x.view(np.uint8)
        if name == "bfloat16":  # ml_dtypes' bfloat16: numpy cannot export it, torch can (no copy)
            torch = _torch()
            if torch is None:
                raise Error("fp8kit: a numpy bfloat16 (ml_dtypes) array crosses as a torch tensor: import torch, "
                            "or pass float32")
            return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
        if x.dtype.kind == "V":
            raise Error(f"fp8kit: numpy dtype {name} is not one fp8kit takes")
        return x
    if hasattr(x, "__dlpack__"):
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


def _cuda(x):
    """Whether x is a torch tensor on a CUDA device."""
    return _is_torch(x) and x.is_cuda


_SAME_DEVICE = contextlib.nullcontext()


def _on_device(device):
    """The scope of a call that runs on a CUDA device (a torch.device, or an index): the extension
    enqueues this thread's work on torch's current stream there (set_stream), as a torch op would,
    and torch's current device is that device (fp8kit's CUDA runtime follows it) - switched for the
    call only when it is not already."""
    torch = _torch()
    index = device if isinstance(device, int) else device.index
    current = torch.cuda.current_device()
    if index is None or index == current:
        _fp8kit.set_stream(torch._C._cuda_getCurrentRawStream(current))
        return _SAME_DEVICE
    return _switched_to(index)


@contextlib.contextmanager
def _switched_to(index):
    torch = _torch()
    with torch.cuda.device(index):
        _fp8kit.set_stream(torch._C._cuda_getCurrentRawStream(index))
        yield


def _quantize_outputs(x, scaling, transpose):
    """What quantize writes for the torch tensor x - codes, scale_inv, amax and with transpose
    their transposed twins - as torch tensors on x's device (from torch's allocator: its memory
    stats count them, and they are the tensors a caller keeps, not copies), in quantize's shapes."""
    torch = _torch()
    cols, rows = (x.shape[-1] if x.dim() else 1), math.prod(x.shape[:-1])  # quantize's [rows, cols] view
    scale_dtype = torch.uint8 if scaling == "mx32" else torch.float32  # e8m0 codes travel as uint8
    outs = [torch.empty(x.shape, dtype=torch.uint8, device=x.device),
            torch.empty(_fp8kit.scale_shape(scaling, rows, cols), dtype=scale_dtype, device=x.device),
            torch.empty(1, dtype=torch.float32, device=x.device)]
    if transpose:
        outs += [torch.empty(cols, rows, dtype=torch.uint8, device=x.device),
                 torch.empty(_fp8kit.scale_shape(scaling, cols, rows), dtype=scale_dtype, device=x.device)]
    return outs


def _quantize_into(x, scaling, transpose, quantize_call):
    """quantize_call(x, outs) for the torch tensor x, into _quantize_outputs (on a CUDA device on
    torch's current stream): (what the call returned, the outputs)."""
    outs = _quantize_outputs(x, scaling, transpose)
    with _on_device(x.device) if x.is_cuda else _SAME_DEVICE:
        got = quantize_call(_to_extension(x), [_DLPack(o) for o in outs])  # new tensors: nothing to check
    return got, outs


def encode(x, format="e4m3fn", overflow="saturate"):
    """FP8 codes of float32 / bfloat16 / float16 x (round to nearest even, one rounding).

    overflow: "saturate" (the default; docs/NUMERICS.md, as TransformerEngine and CUDA's
    __NV_SATFINITE): magnitudes above the format's max and +-Inf clamp to +-max (e8m0: +Inf to
    2^127); or "nonsaturating": they become Inf (e5m2) or NaN (what ml_dtypes' astype and torch's
    .to(float8) give), so an Inf stays visible. A NaN gives NaN in both modes. Empty input gives
    empty codes. Arrays with negative strides are refused (fp8kit.Error: copy them first); other
    strided arrays are read in place.
    Returns uint8 codes for numpy input, a torch.float8_* tensor for torch input.
    """
    if _name(getattr(x, "dtype", "")).startswith("float8_"):
        raise Error(f"fp8kit.encode: x is {_name(x.dtype)} already (FP8 codes); encode takes float32, bfloat16 or "
                    "float16 values (decode gives them)")
    codes = _fp8kit.encode(_to_extension(x), _name(format), overflow)
    if _is_torch(x):
        return _torch().from_numpy(codes).view(_torch_fp8_dtype(format))
    return codes


def decode(codes, format=None, dtype="float32"):
    """The values of FP8 codes (uint8 with a format, or torch / ml_dtypes float8 codes, which carry
    theirs): float32 exact, or rounded once to bfloat16 / float16."""
    dtype_name = _name(dtype)
    values = _fp8kit.decode(_to_extension(codes), _format_of(codes, format), dtype_name)
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
    args = (_name(format), scaling, overflow, power_of_two, amax_epsilon, mx_rounding, non_finite, transpose)
    if _cuda(x):
        return _quantize_into(x, scaling, transpose, lambda t, outs: _fp8kit.quantize(t, *args, outs=outs))[0]
    return _fp8kit.quantize(_to_extension(x), *args)


def _recipe_quantize(x, recipe, role, transpose):
    """x quantized as `recipe` quantizes a Linear's operand of `role` (fp8kit.torch's training
    layer), on x's device."""
    if _cuda(x):
        return _quantize_into(x, _fp8kit.recipe_scaling(recipe, role), transpose,
                              lambda t, outs: _fp8kit.recipe_quantize(t, recipe, role, transpose, outs=outs))[0]
    return _fp8kit.recipe_quantize(_to_extension(x), recipe, role, transpose)


def dequantize(q, dtype="float32"):
    """decode(code) * scale_inv of its group: float32, or rounded once to bfloat16 / float16."""
    if not isinstance(q, QTensor):
        raise Error(f"fp8kit.dequantize: q is a {type(q).__name__}, expected a QTensor (fp8kit.quantize's or "
                    "fp8kit.qtensor's)")
    dtype_name = _name(dtype)
    if q.device == "cuda":
        with _on_device(_torch().cuda.current_device()):  # a QTensor's tensors carry no device index
            values = _fp8kit.dequantize(q, dtype_name)  # a torch CUDA tensor (bfloat16 as its bits)
        return values.view(_torch().bfloat16) if dtype_name == "bfloat16" else values
    values = _fp8kit.dequantize(q, dtype_name)
    return _bf16_out(values, False) if dtype_name == "bfloat16" else values


def _format_of(codes, format):
    """The FP8 format of codes: their torch / ml_dtypes float8 dtype's, or the one given (which
    must agree with such a dtype)."""
    dtype = getattr(codes, "dtype", None)
    carried = _format_name(dtype) if dtype is not None and _name(dtype).startswith("float8_") else None
    given = None if format is None else _format_name(format)
    if carried is not None and given is not None and carried != given:
        raise Error(f"fp8kit: the codes are float8_{carried} but format is {given}")
    if carried is None and given is None:
        raise Error(f"fp8kit: codes of dtype {_name(dtype) if dtype is not None else type(codes).__name__} "
                    "need a format (e4m3fn, e5m2, ...)")
    return given or carried


def qtensor(data, scale_inv, scaling="tensor", format=None):
    """A QTensor over existing FP8 codes [rows, cols] (a torch.float8_* tensor, an ml_dtypes float8
    array, or uint8 with a format) and their scale_inv: dequantized = decode(code) * scale_inv[group].
    Viewed, not copied; the QTensor keeps them alive."""
    fmt = _format_of(data, format)
    return _fp8kit.qtensor(_to_extension(data), _to_extension(scale_inv), scaling, fmt)


def _out(values, out_dtype, like_torch):
    """The GEMM's output array (float32, float16, or bfloat16 bits) as the caller's kind of array."""
    if _name(out_dtype) == "bfloat16":
        return _bf16_out(values, like_torch)
    return _torch().from_numpy(values) if like_torch else values


def gemm(a, b, *, out_dtype="float32", alpha=1.0, beta=0.0, c=None, bias=None, activation="none",
         format="e4m3fn", scaling="tensor", overflow="saturate", power_of_two=False, amax_epsilon=0.0,
         mx_rounding="floor", non_finite="propagate"):
    """D[M, N] = act(alpha * deq(a)[M, K] . deq(b)[N, K]^T (+ beta * c) (+ bias)), float32 sums.

    a: a QTensor, or float32 / bfloat16 / float16 [M, K] cast to FP8 inside the GEMM with the
    quantize options given here (format, scaling, ...: as fp8kit.quantize), never written out;
    with scaling=None not quantized at all (weight-only FP8, torchao's Float8WeightOnlyConfig: only
    b is FP8) but taken as two bfloat16 terms, hi = bf16(a) and lo = bf16(a - hi): 16 significant
    bits, an f16 a exactly, a bfloat16 a as it is (docs/NUMERICS.md).
    b: a PackedWeight, or a QTensor [N, K] (packed for this call). out_dtype: float32, bfloat16 or
    float16. Returns numpy, or torch when a is a torch tensor.
    """
    if not isinstance(b, (PackedWeight, QTensor)):
        raise Error(f"fp8kit.gemm: b must be a PackedWeight or a QTensor, got {type(b).__name__} "
                    "(quantize the weight first: fp8kit.PackedWeight(fp8kit.quantize(w, scaling=...)))")
    ext = lambda t: None if t is None else _to_extension(t)  # noqa: E731
    out_name = _name(out_dtype)
    if isinstance(b, QTensor):  # packed here: a B that is no GEMM operand is then fp8kit.Error, not a TypeError
        b = PackedWeight(b)
    if isinstance(a, QTensor):
        call = lambda out: _fp8kit.gemm(a, b, out_name, alpha, beta, ext(c), ext(bias), activation, out)  # noqa: E731
    elif scaling is None:
        call = lambda out: _fp8kit.gemm_weight_only(_to_extension(a), b, out_name, alpha, beta, ext(c),  # noqa: E731
                                                    ext(bias), activation, out)
    else:
        call = lambda out: _fp8kit.gemm_fused(_to_extension(a), b, _name(format), scaling, overflow,  # noqa: E731
                                              power_of_two, amax_epsilon, mx_rounding, non_finite, out_name, alpha,
                                              beta, ext(c), ext(bias), activation, out)
    if (a.device == "cuda") if isinstance(a, QTensor) else _cuda(a):
        n = b.n if isinstance(b, PackedWeight) else b.shape[0]
        return _device_gemm(call, a.shape[0], n, out_name, a.device if _is_torch(a) else None)
    return _out(call(None), out_name, _is_torch(a))


def _device_gemm(call, m, n, out_name, device):
    """D [m, n] of a GEMM on a CUDA device: allocated by torch there (its caching allocator) and
    written by call(out) on torch's current stream. device: None for the current device (a
    QTensor's tensors carry no device index)."""
    torch = _torch()
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    out = torch.empty(m, n, dtype=getattr(torch, out_name), device=device)
    with _on_device(device):
        call(_to_extension(out))
    return out


def _operand_scaling(scale, name, rows, k):
    """The scaling of one scaled_mm operand (a [M, K]; b^T [N, K], whose scale torch gives in b's
    [K, N] orientation), from its scale's shape - torch._scaled_mm's rules - and the scale laid
    out for fp8kit's [rows, K] operand:
      one element                                  tensor
      a: [M, 1]        b: [1, N]                   row (torch's rowwise)
      a: [M, K/128]    b: [K/128, N]               block(1x128)    (DeepSeek-V3 activations)
      a: [M/128, K/128] b: [K/128, N/128]          block(128x128)  (DeepSeek-V3 weights)
    (/ rounds up). Else an error naming the argument and the shapes it could have."""
    kb, rb = -(-k // 128), -(-rows // 128)
    if not hasattr(scale, "shape") or not hasattr(scale, "reshape"):
        raise Error(f"fp8kit.scaled_mm: {name} is a {type(scale).__name__}; expected a float32 tensor or array of "
                    "dequantization scales")
    if _name(getattr(scale, "dtype", "")) != "float32":  # as torch._scaled_mm: fp8kit's scale_inv is float32
        raise Error(f"fp8kit.scaled_mm: {name} is {_name(scale.dtype)}; expected float32 dequantization scales")
    shape = tuple(scale.shape)
    if len(shape) <= 2 and all(d == 1 for d in shape):
        return "tensor", scale.reshape(1, 1)
    oriented = shape if name == "scale_a" else shape[::-1]  # b's scale as [N, ...]
    t = scale if name == "scale_a" else scale.T
    if len(shape) == 2 and oriented == (rows, 1):
        return "row", _contiguous(t.reshape(rows, 1))  # (a broadcast scale, stride 0, copied: M floats)
    if len(shape) == 2 and oriented == (rows, kb):
        return "block(1x128)", _contiguous(t)
    if len(shape) == 2 and oriented == (rb, kb):
        return "block(128x128)", _contiguous(t)
    want = ([rows, 1], [rows, kb], [rb, kb]) if name == "scale_a" else ([1, rows], [kb, rows], [kb, rb])
    raise Error(f"fp8kit.scaled_mm: {name} has shape {list(shape)}; expected one element (tensorwise), "
                f"{want[0]} (rowwise), {want[1]} (1x128 blocks) or {want[2]} (128x128 blocks)")


def _contiguous(t):
    return t.contiguous() if _is_torch(t) else np.ascontiguousarray(t)


def scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    """torch._scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum) on
    fp8kit's GEMM: D = (a * scale_a) @ (b * scale_b) (+ bias), float32 sums, one rounding to out_dtype.

    a [M, K] and b [K, N] FP8 (torch.float8_* tensors or ml_dtypes float8 arrays; b in any layout -
    torch asks for column-major, fp8kit reads b.T as its [N, K] weight without a copy then).
    scale_a / scale_b: float32 dequantization scales, one element (tensorwise), [M, 1] / [1, N]
    (rowwise), or torch's block shapes: [M, K/128] / [K/128, N] (1x128 blocks) and [M/128, K/128] /
    [K/128, N/128] (128x128 blocks), sums scaled per 128-wide K group. out_dtype: float32, bfloat16
    or float16; None or a float8 dtype: FP8 output (None: a's format), float32(D / scale_result)
    cast saturating (docs/NUMERICS.md: past the format's max, +-max) - torch's CPU _scaled_mm
    divides by scale_result too (oneDNN's destination scale) but gives NaN past the max, and
    ignores scale_result when out_dtype is None, fp8kit does not. scale_result: one finite,
    positive element. use_fast_accum is accepted and changes nothing: fp8kit always sums in
    float32 (what use_fast_accum=False asks of cuBLASLt).
    """
    del use_fast_accum
    if len(getattr(a, "shape", ())) != 2 or len(getattr(b, "shape", ())) != 2:
        raise Error("fp8kit.scaled_mm: a and b must be 2-d (a [M, K], b [K, N])")
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    if a.shape[1] != b.shape[0]:
        raise Error(f"fp8kit.scaled_mm: a is {list(a.shape)} and b is {list(b.shape)}: a's K (columns) must equal "
                    "b's K (rows)")
    ga, sa = _operand_scaling(scale_a, "scale_a", m, k)
    gb, sb = _operand_scaling(scale_b, "scale_b", n, k)
    fp8_out = out_dtype is None or _name(out_dtype).startswith("float8_")
    if not fp8_out and _name(out_dtype) not in ("float32", "bfloat16", "float16"):
        raise Error(f"fp8kit.scaled_mm: out_dtype {_quoted(_name(out_dtype))}, expected float32, bfloat16, float16 "
                    "or a float8 dtype")
    fmt = _format_of(a, None) if out_dtype is None else _format_name(out_dtype) if fp8_out else None
    if fp8_out:  # an unknown format (or one torch has no dtype for): an Error naming it, before any work
        format_max(fmt)
        if _is_torch(a):
            _torch_fp8_dtype(fmt)
    if scale_result is not None and not _cuda(scale_result):  # (on a device: not read, which would wait for it)
        value = np.asarray(scale_result.cpu() if _is_torch(scale_result) else scale_result, np.float64).reshape(-1)
        if value.size != 1 or not (np.isfinite(value[0]) and value[0] > 0):
            raise Error(f"fp8kit.scaled_mm: scale_result is {value.tolist()[:4]}; expected one finite, positive "
                        "element (D is divided by it)")
    if m == 0 or n == 0:  # an empty D, as torch._scaled_mm gives: no operand to quantize, no GEMM
        if _is_torch(a):
            torch = _torch()
            return torch.empty(m, n, dtype=_torch_fp8_dtype(fmt) if fp8_out else getattr(torch, _name(out_dtype)),
                               device=a.device)
        if fp8_out:
            return np.zeros((m, n), np.uint8)
        return _out(np.zeros((m, n), {"bfloat16": np.uint16, "float16": np.float16}.get(_name(out_dtype), np.float32)),
                    _name(out_dtype), False)
    qa = qtensor(a, sa, ga)
    bt = b.T
    if bt.stride(-1) != 1 if _is_torch(bt) else bt.strides[-1] != bt.itemsize:
        bt = _contiguous(bt)  # a row-major b: its [N, K] rows copied once (column-major b is read in place)
    qb = qtensor(bt, sb, gb)
    out_name = "float32" if fp8_out else _name(out_dtype)
    qb = PackedWeight(qb)  # an Error naming what is wrong with b (nanobind would raise a TypeError)
    bias = None if bias is None else _to_extension(bias)
    call = lambda out: _fp8kit.gemm(qa, qb, out_name, 1.0, 0.0, None, bias, "none", out)  # noqa: E731
    d = _device_gemm(call, m, n, out_name, a.device) if _cuda(a) else _out(call(None), out_name, _is_torch(a))
    if not fp8_out:
        return d
    if scale_result is not None:
        d = d / (scale_result if _cuda(d) else scale_result.item() if hasattr(scale_result, "item") else float(scale_result))
    if _cuda(d):  # on the device (encode is the host's) encode's "saturate": magnitudes above the
        # format's max, +-Inf included, clamp to +-max; NaN stays NaN (torch's clamp keeps it)
        big = format_max(fmt)
        return d.clamp(-big, big).to(_torch_fp8_dtype(fmt))
    return encode(d, fmt, "saturate")
