"""fp8kit.torch.ops: the custom ops (torch.library) and the one route by which an FP8 inference
Linear reaches its GEMM.

torch.ops.fp8kit.linear is the inference layer's forward as a torch operator, with a fake
implementation, so torch.compile and torch.export trace it. The layer's forward runs one function,
_linear: through the operator when something traces the call, else directly, without the
operator's dispatch (_plain_eager). _linear checks the input (check_input: the one check of an FP8
layer's input, the training layer's too), then serves the layer's part of its siblings' GEMM
(siblings.py) or calls the extension's FusedLinear - packed once per weight and cached on it - on
the addresses of x and y.

The training layer's (training.py) casts and GEMMs are operators too, torch.ops.fp8kit.recipe_quantize
and torch.ops.fp8kit.gemm, with fake implementations: only torch tensors cross them (FP8 codes
and their scale_inv; on the host views of the extension's arrays, on CUDA torch's memory), so
torch.compile traces a Float8Linear's forward and backward into its graphs, which hold no
extension object (none is left to the interpreter's exit). The layer calls them as the inference
layer calls linear: through the operators when something traces the call, else their functions
directly (_direct).

Checked by tests/python/test_torch.py (the operator traced by torch.export and torch.compile and
equal to the eager path, every layout of x, the address entry's own checks, the cache against
stale weights, the packed weight as the codes' only copy, bad input) and test_training.py (the
training layer's bad input; the training operators under torch.compile, fullgraph, against eager).
"""
import functools
import math
import warnings
import weakref
from typing import List, Optional

import numpy as np

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

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


def _from_bytes(data, dtype):
    return data.view(getattr(torch, dtype))


class _Pickled:
    """An FP8 tensor as pickle keeps it: its bytes (uint8) and its dtype's name, made back into
    the FP8 tensor when loaded (deepcopy too, from a copy of the bytes). torch 2.15 pickles FP8
    tensors but cannot load them (plain pickle; torch.save is not affected)."""

    def __init__(self, t):
        self.t = t

    def __reduce__(self):
        return (_from_bytes, (self.t.view(torch.uint8), str(self.t.dtype).removeprefix("torch.")))


def picklable(buffers):
    """A module's buffers as __getstate__ gives them to pickle: FP8 ones as _Pickled."""
    return {k: _Pickled(v) if v is not None and v.dtype.itemsize == 1 and v.dtype.is_floating_point else v
            for k, v in buffers.items()}


def _fused_linear(packed, input_scaling, bias, input_scale=None, activation="none"):
    """The extension's FusedLinear over the PackedWeight packed (_packed): the input's e4m3fn
    saturating cast with input_scaling ("none": no cast, weight-only), the bias (or None) and the
    activation of its epilogue ("none" or "gelu", the tanh form). With a static input_scale (tensor
    scaling; compressed-tensors' dequantization multiplier, one value) x is cast as
    encode(float32(x * s)), s = 1 / input_scale computed in float64 and rounded once to float32: the
    multiplier as the stored scale's reciprocal, not the stored value rounded twice."""
    static = None
    if input_scale is not None:
        static = fp8kit._to_extension((1.0 / input_scale.detach().to(torch.float64)).to(torch.float32).reshape(1))
    return fp8kit._fp8kit.FusedLinear(packed, "e4m3fn", input_scaling, "saturate",
                                      None if bias is None else fp8kit._to_extension(bias), static, activation)


def _packed(q, input_scaling):
    """The PackedWeight of the QTensor q for a FusedLinear casting x with input_scaling: packed for
    x's K groups where x is cast (an activation group narrower than the weight's), so that the GEMM
    reads the packing as it is, also once its codes are released."""
    return fp8kit.PackedWeight(q) if input_scaling == "none" else fp8kit.PackedWeight(q, input_scaling)


def _stamp(t):
    """What tells a tensor's contents changed: its version counter (an in-place write, copy_,
    load_state_dict) and its data pointer (new data given through `t.data = ...`, which leaves the
    counter as it was). An in-place write through `t.data` bumps neither - as autograd, fp8kit does
    not see it (docs/API.md)."""
    return None if t is None else (t._version, t.data_ptr())


def _fused(weight, weight_scale_inv, weight_scaling, bias, input_scaling, input_scale=None, activation="none"):
    """The FusedLinear of a Float8InferenceLinear, made on first use and again only after a buffer
    or the bias is written (load_state_dict, copy_) or replaced: kept on the weight tensor, keyed by
    the tensors' stamps, and holding the scales and bias it read - a tensor assigned in their place
    has a counter of its own, so they are compared by identity. Another activation alone (fusion,
    gelu_fusion.py) takes the cached packing as it is. Returns (the FusedLinear, out_features)."""
    # (weight's and the scale's stamps spelled out: a decode step makes a key for every layer)
    key = (weight._version, weight.data_ptr(), weight_scale_inv._version, weight_scale_inv.data_ptr(), weight_scaling,
           input_scaling, _stamp(bias), _stamp(input_scale), activation)
    cached = getattr(weight, "_fp8kit_fused", None)
    same = cached is not None and cached[2] is bias and cached[3] is weight_scale_inv and cached[4] is input_scale
    if not same or cached[0] != key:
        if activation not in ("none", "gelu"):
            raise fp8kit.Error(f"fp8kit.torch.Float8InferenceLinear: activation is {activation!r}, expected 'none' or "
                               "'gelu' (the tanh form)")
        if same and cached[0][:-1] == key[:-1]:
            fused = _fused_linear(cached[1][0].weight, input_scaling, bias, input_scale, activation)
        else:
            codes = codes_of(weight)  # a stand-in's (a scale or bias written since): read back from its packing
            fused = _fused_linear(_packed(fp8kit.qtensor(codes, weight_scale_inv, weight_scaling), input_scaling),
                                  input_scaling, bias, input_scale, activation)
            if codes is not weight:
                fused.weight.release_codes()
        cached = _Cached((key, (fused, weight.shape[0]), bias, weight_scale_inv, input_scale))
        weight._fp8kit_fused = cached
    return cached[1]


# ---- the packed weight as the only copy of an inference layer's codes ----
#
# On the host the GEMM reads the packed layout alone, which holds every code; an inference layer
# that also kept its codes tensor would hold each weight twice. release_codes swaps the codes for
# a stand-in: a host tensor of their shape and dtype over one NaN code (strides 0), which carries
# the packed FusedLinear (codes released) as the codes carried it - to the eager call and to the
# operator's calls in torch.compile's graphs alike. What reads it as codes reads NaN, never a
# plausible weight. codes_of reads the codes back where they are needed as a tensor.

def release_codes(weight, weight_scale_inv, weight_scaling, bias, input_scaling, input_scale=None, activation="none"):
    """The stand-in for a host weight's codes, its FusedLinear made (or the cached one) with the
    codes released; the caller puts it in the weight's place, so the codes go."""
    _fused(weight, weight_scale_inv, weight_scaling, bias, input_scaling, input_scale, activation)
    weight._fp8kit_fused[1][0].weight.release_codes()
    nan = torch.full((1,), float("nan")).to(weight.dtype)  # the format's NaN code
    return _carry(weight, nan.expand(weight.shape))


def _carry(holder, to):
    """Tensor `to`, given holder's cached FusedLinear, keyed by its own stamp."""
    cached = holder._fp8kit_fused
    to._fp8kit_fused = _Cached(((to._version, to.data_ptr()) + cached[0][2:],) + cached[1:])
    return to


def is_stand_in(weight):
    """Whether weight is release_codes' stand-in (strides 0, with a packed weight)."""
    return weight.stride() == (0, 0) and getattr(weight, "_fp8kit_fused", None) is not None


def codes_of(weight):
    """weight's codes as a host tensor: weight itself, or for a stand-in a tensor read back from the
    packed layout - bit for bit the codes it replaced; the same tensor again while anything holds
    it (torch.export walks the buffers several times and matches them by identity)."""
    if not is_stand_in(weight):
        return weight
    held = getattr(weight, "_fp8kit_codes", None)
    codes = held() if held is not None else None
    if codes is None:
        # Real memory even where a trace's fake mode is on (torch.export walks buffers under it).
        with _disable_current_modes():
            codes = torch.empty(weight.shape, dtype=weight.dtype)
            weight._fp8kit_fused[1][0].weight.codes_into(fp8kit._to_extension(codes))
        weight._fp8kit_codes = weakref.ref(codes)
    return codes


def restore_codes(stand_in):
    """The codes back as a tensor to take a stand-in's place, carrying its packed weight (so that
    nothing is packed again)."""
    return _carry(stand_in, codes_of(stand_in))


# torch dtype -> (name, FusedLinear's index for it): float32, bfloat16, float16
_OUT_DTYPES = {getattr(torch, name): (name, i) for i, name in enumerate(fp8kit._fp8kit.FusedLinear.out_dtypes)}


def check_input(x, in_features, layer):
    """The check of an FP8 Linear layer's input x [..., in_features] (layer: the class's name, for
    the message), for the inference route - eager, in the operator and in its fake - and the
    training layer alike: returns (x's dtype name, FusedLinear's index for it)."""
    shape = x.shape
    if not shape or shape[-1] != in_features:
        raise fp8kit.Error(f"fp8kit.torch.{layer}: the input has shape {list(shape)}, but in_features {in_features}")
    out = _OUT_DTYPES.get(x.dtype)
    if out is None:
        raise fp8kit.Error(f"fp8kit.torch.{layer}: the input is {x.dtype}; it takes float32, bfloat16 or float16")
    return out


def _check_same_device(x, weight):
    if x.device != weight.device:
        raise fp8kit.Error(f"fp8kit.torch.Float8InferenceLinear: the input is on device '{x.device}', the weight on "
                           f"device '{weight.device}' (move the model with .to(device))")


def check_model_args(where, model, filter_fn=None, filter_name="filter_fn"):
    """The model and module filter the conversions take: an fp8kit.Error naming the argument for a
    model that is no nn.Module or a filter that is not callable (not an AttributeError or TypeError
    from deep inside)."""
    if not isinstance(model, torch.nn.Module):
        raise fp8kit.Error(f"{where}: the model is a {type(model).__name__}, expected a torch.nn.Module")
    if filter_fn is not None and not callable(filter_fn):
        raise fp8kit.Error(f"{where}: {filter_name} is {filter_fn!r}, expected a function (module, fqn) -> bool")


def places(model):
    """{id(module): every name model holds it under}: a module reused at two places (one Linear in
    two Sequentials) is converted once and the new module put at each, so that they stay one module
    with one weight."""
    out = {}
    for name, m in model.named_modules(remove_duplicate=False):
        out.setdefault(id(m), []).append(name)
    return out


def has_weights(linear):
    """Whether an nn.Linear has any weight: one with in or out features 0 has nothing to hold in
    FP8, and the conversions leave it as it is (it computes exactly: zeros, or its bias)."""
    return linear.in_features > 0 and linear.out_features > 0


def check_layer_weights(where, layers, on_meta=False):
    """The weights of the layers (fqn, module: nn.Linear, nn.Embedding) a conversion is about to
    replace, checked all before the first is replaced - so that a bad layer leaves the model as it
    was, not half converted: float32, bfloat16 or float16 values (not float64, not an FP8
    checkpoint's codes) on the CPU or a CUDA device - or on meta where on_meta (the training
    conversion, which keeps the Parameters: a model built on meta, converted, then materialized, as
    torchtitan does) - as a Parameter. An fp8kit.Error names the first layer that is not."""
    for fqn, m in layers:
        w, layer = m.weight, f"{where}: layer '{fqn}'"
        if w.dtype.itemsize == 1 and w.dtype.is_floating_point:  # codes, not values: never quantized again
            raise fp8kit.Error(f"{layer} holds {w.dtype} weights already (an FP8 checkpoint loaded as it is stored); "
                               "load it with fp8kit.torch.from_pretrained(path) or load_fp8_checkpoint(model, path), "
                               "which keep its codes and scales")
        if w.dtype not in _OUT_DTYPES:
            raise fp8kit.Error(f"{layer} has {w.dtype} weights; fp8kit takes float32, bfloat16 or float16 models "
                               "(cast it first, e.g. model.float())")
        if w.device.type not in ("cpu", "cuda") and not (on_meta and w.is_meta):
            raise fp8kit.Error(f"{layer} has its weights on device '{w.device}'; fp8kit converts weights on the CPU "
                               "or a CUDA device (load or materialize them first)")
        if not isinstance(w, torch.nn.Parameter):
            raise fp8kit.Error(f"{layer}: its weight is a {type(w).__name__}, not an nn.Parameter")


def check_finite(where, tensors):
    """The tensors ((name, tensor) pairs) a conversion is about to store in FP8, checked finite all
    before the first is converted: FP8 stores no Inf (e4m3fn has none) - torch's unscaled cast
    (Diffusers' storage) would keep an Inf weight as the format's largest value, a number; a scaled
    one makes its whole row or tensor NaN - so a non-finite weight (a diverged fine-tune, a broken
    file) is an fp8kit.Error naming it and its first such element, and the model is left as it
    was. One pass over each (aminmax: NaN propagates, an Inf is the min or the max), no temporary
    the size of the weight; meta and empty tensors hold nothing to check, FP8 codes and integers
    no Inf."""
    for name, w in tensors:
        w = w.detach()
        if w.numel() == 0 or w.is_meta or w.dtype.itemsize == 1 or not w.dtype.is_floating_point:
            continue
        lo, hi = torch.aminmax(w)
        if bool(torch.isfinite(lo) & torch.isfinite(hi)):
            continue
        flat = w.reshape(-1)
        at = int((~torch.isfinite(flat)).nonzero()[0])
        v = flat[at].item()
        why = ("every output it reaches would be NaN" if math.isnan(v) else
               "an unscaled FP8 cast would store it as the format's largest value, a scaled one make its row NaN")
        raise fp8kit.Error(f"{where}: {name} holds {v} at {_at(at, w.shape)}: {why}; FP8 weights must be finite")


def _at(flat, shape):
    """The index [i, j, ...] of a flat position in shape."""
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.insert(0, i)
    return index


def warn_transposed_linears(where, model):
    """A warning naming the transformers Conv1D layers of model (GPT-2's Linear with its weight
    stored [in, out]), which the conversions leave as they are - they take nn.Linear - so that a
    GPT-2 user learns why almost nothing runs in FP8."""
    conv1d = [fqn for fqn, m in model.named_modules() if type(m).__name__ == "Conv1D" and hasattr(m, "nf")]
    if conv1d:
        warnings.warn(f"{where}: {len(conv1d)} transformers Conv1D layer(s) ({', '.join(conv1d[:3])}"
                      f"{', ...' if len(conv1d) > 3 else ''}) left as they are: fp8kit converts nn.Linear, and Conv1D "
                      "stores its weight transposed", stacklevel=3)


def autocast_input(x):
    """x in torch.autocast's dtype where autocast is on for x's device, else x: the FP8 layers then
    compute and return in it as nn.Linear does under autocast (which does not reach custom
    operators); their weights are cast to FP8 from the dtype they are kept in."""
    # Eager, first the one C call that says whether any autocast is on (a decode step calls each
    # layer once: the query by device costs a few times more); traced, torch's public query alone,
    # which torch.compile folds.
    if not torch.compiler.is_compiling() and not torch._C._is_any_autocast_enabled():
        return x
    device = x.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):  # the devices the layers take
        dtype = torch.get_autocast_dtype(device)
        if x.dtype != dtype:
            return x.to(dtype)
    return x


def _call_into(fused, n, x, dtype_index):
    """y[..., n] = fused's GEMM of x [..., K] (on the weight's device, C-contiguous,
    out_dtypes[dtype_index]), y new in x's dtype - on a CUDA device from torch's allocator, the GEMM
    ordered on torch's current stream: the addresses of x, as [M, K] rows, and of y to the extension
    (FusedLinear.call_into).
    Passing addresses skips the numpy views, DLPack capsules and reshapes a tensor's way into the
    extension would take, which at a decode step's small layers cost as much as the GEMM.
    Contiguity is what the extension cannot see; it checks K against the weight. (new_empty with
    positional sizes: torch.empty with a dtype parses more overloads.)"""
    shape = x.shape
    if len(shape) == 2:
        m, k = shape
        y = x.new_empty(m, n)
    else:
        m, k = math.prod(shape[:-1]), shape[-1]
        y = x.new_empty(*shape[:-1], n)
    if m == 0:  # an empty batch: an empty result, as nn.Linear gives
        return y
    if x.is_cuda:
        with fp8kit._on_device(x.device):
            fused.call_into(x.data_ptr(), m, k, dtype_index, y.data_ptr())
        return y
    fused.call_into(x.data_ptr(), m, k, dtype_index, y.data_ptr())
    return y


def _linear(x, weight, weight_scale_inv, bias, input_scaling, weight_scaling, input_scale=None, siblings=None,
            activation="none"):
    """y[..., N] = act(deq(fp8(x))[..., K] . deq(weight)[N, K]^T (+ bias[N])), x float32 / bfloat16 /
    float16 with any leading dimensions, y in x's dtype: x quantized with input_scaling (e4m3fn,
    saturating) inside the GEMM - with a static input_scale (tensor scaling) by 1 / input_scale,
    else by each call's amax; with "none" not quantized (weight-only) - float32 sums. The
    extension is called directly, with the bias's view cached beside the packed weight:
    fp8kit.gemm's argument handling costs more than the GEMM of a decode step's small layer.
    siblings: the layer's (_Siblings, index), which may serve its output from a GEMM of its run.
    activation: "none", or "gelu" (tanh form) in the GEMM's epilogue, on the float32 sums."""
    index = check_input(x, weight.shape[1], "Float8InferenceLinear")[1]
    # The extension reads x by address: C-contiguous rows where the weight is.
    _check_same_device(x, weight)
    if x.is_cuda and input_scaling == "none":
        raise fp8kit.Error("fp8kit.torch.Float8InferenceLinear: the weight-only GEMM (recipe weight_only, layerwise "
                           "casting) runs on the CPU; on a CUDA device use rowwise, tensorwise or block")
    if not x.is_contiguous():
        x = x.contiguous()  # a new tensor, which no sibling is called on: computed alone
    elif siblings is not None and x.is_cpu:  # siblings write their parts on the host
        y = siblings[0](siblings[1], x, index)
        if y is not None:
            return y
    fused, n = _fused(weight, weight_scale_inv, weight_scaling, bias, input_scaling, input_scale, activation)
    return _call_into(fused, n, x, index)


@torch.library.custom_op("fp8kit::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: Optional[torch.Tensor],
           input_scaling: str, weight_scaling: str, input_scale: Optional[torch.Tensor] = None,
           activation: str = "none") -> torch.Tensor:
    """_linear as a torch operator, x [..., K]: what torch.compile and torch.export see."""
    return _linear(x, weight, weight_scale_inv, bias, input_scaling, weight_scaling, input_scale, activation=activation)


@linear.register_fake
def _(x, weight, weight_scale_inv, bias, input_scaling, weight_scaling, input_scale=None, activation="none"):
    check_input(x, weight.shape[1], "Float8InferenceLinear")  # a bad input fails at trace time, as in eager
    _check_same_device(x, weight)  # (a meta x reaches this function in eager too: it is the meta kernel)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("fp8kit::linear_backward_refused", mutates_args=())
def _backward_refused(grad: torch.Tensor, k: int) -> torch.Tensor:
    """An inference layer's backward: refused when it runs. An operator, not a raise in the autograd
    function, because torch.compile traces the backward of a forward whose input requires grad (a
    model called without no_grad) while compiling the forward, and only running it is wrong."""
    raise fp8kit.Error("fp8kit.torch.Float8InferenceLinear is an inference layer (an FP8 weight buffer): it has no "
                       "backward. To train in FP8, convert the high-precision model with "
                       "fp8kit.torch.convert_to_float8_training")


@_backward_refused.register_fake
def _(grad, k):
    return grad.new_empty((*grad.shape[:-1], k))


def _keep_k(ctx, inputs, output):
    ctx.k = inputs[1].shape[1]


def _no_backward(ctx, grad):
    # grad [..., N] -> dX [..., K], refused when run; nothing else of the layer takes a gradient
    return _backward_refused(grad, ctx.k), None, None, None, None, None, None, None


linear.register_autograd(_no_backward, setup_context=_keep_k)


# _plain_eager's tests, looked up once (each module attribute on the way is a lookup per call):
# whether torch.compile or torch.export traces, whether autograd records, how many dispatch modes
# are on (torch.utils._python_dispatch._get_current_dispatch_mode is None exactly when none is).
_is_compiling, _grad_enabled, _dispatch_modes = (torch.compiler.is_compiling, torch.is_grad_enabled,
                                                 torch._C._len_torch_dispatch_stack)


def _direct(x):
    """Whether nothing traces or transforms a call on x (no torch.compile, no export, no dispatch
    mode, no tensor subclass but nn.Parameter): the operator's dispatch from Python, which costs
    several times a decode step's small GEMM, can be skipped then - the same function runs either
    way. Under torch.compile _is_compiling() is True and ends the test before the dispatch stack's
    count, on which Dynamo breaks the graph."""
    return (type(x) is torch.Tensor or type(x) is nn.Parameter) and not _is_compiling() and not _dispatch_modes()


def _plain_eager(x):
    """_direct, and no autograd through x (the inference operator's autograd refuses backward)."""
    return not (x.requires_grad and _grad_enabled()) and _direct(x)


# ---- the training layer's operators: casts and GEMMs on torch tensors ----

@functools.cache
def _recipe_kind(recipe, role):
    """How recipe casts a Linear's operand of role: (scaling, the codes' torch dtype, the scales').
    The format is asked of the library by a 1x1 cast (the library has the recipe's table; the fake
    cast needs it without data); cached: at a small layer these lookups cost as much as the cast."""
    scaling = fp8kit._fp8kit.recipe_scaling(recipe, role)
    fmt = fp8kit._fp8kit.recipe_quantize(np.zeros((1, 1), np.float32), recipe, role).format
    return scaling, fp8kit._torch_fp8_dtype(fmt), torch.uint8 if scaling == "mx32" else torch.float32  # e8m0 as uint8


def _recipe_quantize(t: torch.Tensor, recipe: str, role: str, transpose: bool) -> List[torch.Tensor]:
    """t [rows, cols] cast as recipe casts a Linear's operand of role (fp8kit._recipe_quantize):
    [codes, scale_inv], and with transpose also [codes_t, scale_inv_t], exactly the cast of t^T -
    codes as torch.float8_* tensors."""
    if t.is_cuda:  # the outputs from torch's caching allocator, written on its current stream
        scaling, dtype, _ = _recipe_kind(recipe, role)
        outs = fp8kit._quantize_into(t, scaling, transpose, lambda x, o: fp8kit._fp8kit.recipe_quantize(
            x, recipe, role, transpose, outs=o))[1]
        return [outs[0].view(dtype), outs[1]] + ([outs[3].view(dtype), outs[4]] if transpose else [])
    # On the host the extension's own arrays, viewed by torch: the outputs torch allocates for it
    # (fresh pages a call) made the casts of a 1024 x 1024 training step 7-15% slower here.
    return qtensor_tensors(fp8kit._fp8kit.recipe_quantize(fp8kit._to_extension(t), recipe, role, transpose),
                           transpose)


def qtensor_tensors(q, transpose):
    """A host QTensor's codes and scale_inv (+ its transposed copy's) as torch tensors that view
    its arrays (no copy; they keep it alive), codes as torch.float8_* tensors."""
    arrays = (q.data, q.scale_inv) + ((q.data_t, q.scale_inv_t) if transpose else ())
    with warnings.catch_warnings():  # numpy marks a QTensor's arrays read-only; nothing writes them
        warnings.simplefilter("ignore", UserWarning)
        out = [torch.from_numpy(a) for a in arrays]
    dtype = fp8kit._torch_fp8_dtype(q.format)
    return [out[0].view(dtype), out[1]] + ([out[2].view(dtype), out[3]] if transpose else [])


recipe_quantize = torch.library.custom_op("fp8kit::recipe_quantize", _recipe_quantize, mutates_args=())


@functools.cache
def _scale_groups(scaling):
    """(group rows, group cols) of a scaling, None for a group as long as its dimension: the
    library's scale_shape asked once of a 2^20 x 2^20 tensor."""
    whole = 1 << 20
    r, c = fp8kit._fp8kit.scale_shape(scaling, whole, whole)
    return (None if r == 1 else whole // r), (None if c == 1 else whole // c)


def _scale_shape(scaling, rows, cols):
    """scale_shape for sizes torch.compile may keep symbolic (the batch): ceil-divided by the
    groups here, where the library's function would take - and so fix - a number."""
    gr, gc = _scale_groups(scaling)
    return (1 if gr is None else -(-rows // gr)), (1 if gc is None else -(-cols // gc))


@recipe_quantize.register_fake
def _(t, recipe, role, transpose):
    scaling, dtype, scale_dtype = _recipe_kind(recipe, role)
    rows, cols = t.shape
    outs = [t.new_empty((rows, cols), dtype=dtype), t.new_empty(_scale_shape(scaling, rows, cols), dtype=scale_dtype)]
    if transpose:
        outs += [t.new_empty((cols, rows), dtype=dtype), t.new_empty(_scale_shape(scaling, cols, rows), dtype=scale_dtype)]
    return outs


def _qtensor(codes, scale_inv, scaling):
    """fp8kit.qtensor of a cast's codes (a torch.float8_* tensor) and scale_inv, without its
    checks of arbitrary arrays: at a small layer they cost as much as the GEMM."""
    return fp8kit._fp8kit.qtensor(fp8kit._DLPack(codes.view(torch.uint8)), fp8kit._DLPack(scale_inv), scaling,
                                  str(codes.dtype).removeprefix("torch.float8_"))


def _gemm(a: torch.Tensor, a_scale_inv: torch.Tensor, a_scaling: str, b: torch.Tensor, b_scale_inv: torch.Tensor,
          b_scaling: str, bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    """D[M, N] = deq(a)[M, K] . deq(b)[N, K]^T (+ bias[N]) in out_dtype (float32 sums, one
    rounding): a and b FP8 codes with their scale_inv and scaling (fp8kit.qtensor's)."""
    qa = _qtensor(a, a_scale_inv, a_scaling)
    qb = _qtensor(b, b_scale_inv, b_scaling)
    name = _OUT_DTYPES[out_dtype][0]
    bias = None if bias is None else fp8kit._to_extension(bias)
    if a.is_cuda:  # D from torch's caching allocator, written on its current stream
        d = a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)
        with fp8kit._on_device(a.device):
            fp8kit._fp8kit.gemm(qa, qb, name, 1.0, 0.0, None, bias, "none", fp8kit._DLPack(d))
        return d
    # On the host D is the extension's own array, viewed by torch (it owns no extension object):
    # written into an out= array it took 10-15% longer at 1024 x 1024 x 1024 here.
    return fp8kit._out(fp8kit._fp8kit.gemm(qa, qb, name, 1.0, 0.0, None, bias, "none", None), name, True)


gemm = torch.library.custom_op("fp8kit::gemm", _gemm, mutates_args=())


@gemm.register_fake
def _(a, a_scale_inv, a_scaling, b, b_scale_inv, b_scaling, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def cast(t, recipe, role, transpose):
    """The training layer's route to recipe_quantize: the operator when something traces the call,
    else its function directly (_direct), the same function either way."""
    return (_recipe_quantize if _direct(t) else recipe_quantize)(t, recipe, role, transpose)


def mm(a, a_scale_inv, a_scaling, b, b_scale_inv, b_scaling, bias, out_dtype):
    """The training layer's route to gemm, as cast's to recipe_quantize."""
    return (_gemm if _direct(a) else gemm)(a, a_scale_inv, a_scaling, b, b_scale_inv, b_scaling, bias, out_dtype)
