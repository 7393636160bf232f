"""fp8kit.torch.ops: the FP8 Linear forward as a torch operator, torch.ops.fp8kit.linear
(torch.library custom op, with a fake implementation for torch.compile and torch.export), and what
it calls: the extension's FusedLinear, packed once per weight and cached on it, called on the
addresses of x and y.

Checked by tests/python/test_torch.py (the operator traced by torch.export and torch.compile, the
address entry's own checks, the cache against stale weights).
"""
import math
from typing import Optional

import torch

import fp8kit


def _dropped():
    """What a copied or unpickled _Cached becomes: nothing (made again on first use)."""
    return None


class _Cached(tuple):
    """What fp8kit.torch caches on a tensor (the extension's FusedLinear and its key): dropped by
    deepcopy and pickle - an extension object does not copy, and a copy's tensors are others - so
    a copied model makes its own on first use."""

    def __reduce__(self):
        return (_dropped, ())


def _fused_linear(q, input_scaling, bias, parts=()):
    """The extension's FusedLinear over the QTensor q: its PackedWeight, the input's e4m3fn
    saturating cast with input_scaling ("none": no cast, weight-only), the bias (or None) and the
    widths of the outputs its call_into_parts writes (siblings)."""
    return fp8kit._fp8kit.FusedLinear(fp8kit.PackedWeight(q), "e4m3fn", input_scaling, "saturate",
                                      None if bias is None else fp8kit._to_extension(bias), list(parts))


def _fused(weight, weight_scale_inv, weight_scaling, bias, input_scaling):
    """The FusedLinear of a Float8InferenceLinear, made on first use and again only after a buffer
    or the bias is written (load_state_dict, copy_) or replaced: kept on the weight tensor, keyed by
    the version counters, and holding the scale and bias it read - a tensor assigned in their place
    has a counter of its own, so they are compared by identity. Returns (the FusedLinear,
    out_features)."""
    key = (weight._version, weight_scale_inv._version, weight_scaling, input_scaling,
           None if bias is None else bias._version)
    cached = getattr(weight, "_fp8kit_fused", None)
    if cached is None or cached[0] != key or cached[2] is not bias or cached[3] is not weight_scale_inv:
        fused = _fused_linear(fp8kit.qtensor(weight, weight_scale_inv, weight_scaling), input_scaling, bias)
        cached = _Cached((key, (fused, weight.shape[0]), bias, weight_scale_inv))
        weight._fp8kit_fused = cached
    return cached[1]


# torch dtype -> (name, FusedLinear's index for it)
_OUT_DTYPES = {getattr(torch, name): (name, i) for i, name in enumerate(fp8kit._fp8kit.FusedLinear.out_dtypes)}


def _call_into(fused, n, x, shape, dtype_index):
    """y[..., n] = fused's GEMM of x [..., K] (shape: x.shape, read once by the caller; CPU, C-contiguous,
    out_dtypes[dtype_index]), y new in x's dtype: the addresses of x, as [M, K] rows, and of y to the
    extension (FusedLinear.call_into)
    - about 1.5 us where numpy views and a reshape each way took 4.5 (a DLPack capsule, for
    bfloat16, 2 more), at a decode step's small layers as much as the GEMM. Contiguity is what the
    extension cannot see; it checks K against the weight. (new_empty with positional sizes: 0.2 us
    less than torch.empty with a dtype, which parses more overloads.)"""
    if len(shape) == 2:
        m, k = shape
        y = x.new_empty(m, n)
    else:
        m, k = math.prod(shape[:-1]), shape[-1]
        y = x.new_empty(*shape[:-1], n)
    fused.call_into(x.data_ptr(), m, k, dtype_index, y.data_ptr())
    return y


def _linear(x, weight, weight_scale_inv, bias, input_scaling, weight_scaling):
    """y[..., N] = deq(fp8(x))[..., K] . deq(weight)[N, K]^T (+ bias[N]), x float32 / bfloat16 / float16
    with any leading dimensions (the operator passes [M, K]), y in x's dtype: x quantized with
    input_scaling (e4m3fn, saturating) inside the GEMM - or with "none" not quantized (weight-only) -
    float32 sums. The extension is called directly, with the bias's view cached beside the packed
    weight: fp8kit.gemm's argument handling costs more than the GEMM of a decode step's small layer."""
    out = _OUT_DTYPES.get(x.dtype)
    if out is None:
        raise fp8kit.Error(f"fp8kit.torch: the input is {x.dtype}; Float8InferenceLinear takes float32, bfloat16 "
                           "or float16")
    fused, n = _fused(weight, weight_scale_inv, weight_scaling, bias, input_scaling)
    if x.is_cpu and x.is_contiguous():
        return _call_into(fused, n, x, x.shape, out[1])
    # Strided x, or a tensor on another device: _to_extension copies what a stride forces, or
    # names the device it cannot read.
    shape = x.shape
    rows = x.reshape(-1, shape[-1]) if len(shape) != 2 else x
    y = fp8kit._out(fused(fp8kit._to_extension(rows), out[1]), out[0], True)
    return y if len(shape) == 2 else y.reshape(*shape[:-1], y.shape[-1])


@torch.library.custom_op("fp8kit::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: Optional[torch.Tensor],
           input_scaling: str, weight_scaling: str) -> torch.Tensor:
    """_linear as a torch operator: what torch.compile and torch.export see."""
    return _linear(x, weight, weight_scale_inv, bias, input_scaling, weight_scaling)


# _plain_eager's tests, looked up once (each module attribute on the way costs a call ~0.03 us):
# whether torch.compile or torch.export traces, whether autograd records, how many dispatch modes
# are on (torch.utils._python_dispatch._get_current_dispatch_mode is None exactly when none is).
_is_compiling, _grad_enabled, _dispatch_modes = (torch.compiler.is_compiling, torch.is_grad_enabled,
                                                 torch._C._len_torch_dispatch_stack)


def _plain_eager(x):
    """Whether nothing traces or transforms this call (no torch.compile, no export, no dispatch
    mode, no autograd through x): the operator's dispatch, 60-90 us a call from Python, can be
    skipped then - the same function runs either way. Under torch.compile _is_compiling() is
    True and ends the test before the dispatch stack's count, on which Dynamo breaks the graph."""
    return (type(x) is torch.Tensor and not (x.requires_grad and _grad_enabled()) and not _is_compiling()
            and not _dispatch_modes())


@linear.register_fake
def _(x, weight, weight_scale_inv, bias, input_scaling, weight_scaling):
    return x.new_empty((x.shape[0], weight.shape[0]))
