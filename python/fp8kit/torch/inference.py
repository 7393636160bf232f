"""fp8kit.torch.inference: quantize_ - torchao's API - and Float8InferenceLinear, the FP8 Linear it
puts in place of nn.Linear: the weight quantized and packed once - on the host the packing its
only copy - the activation cast to FP8 inside fp8kit's GEMM (ops.py), float32 sums; torchao's
float8 config objects read as recipes.

Checked by tests/python/test_torch.py (against float64, against torchao's Float8WeightOnlyConfig,
torchao's configs, state_dict, the codes read back wherever torch walks the buffers, layouts of x,
bad use) and test_fp8_checkpoints.py (RSS of fresh processes: each weight held once).
"""
import json
import re

import numpy as np
import torch
from torch import nn

import fp8kit

from . import memory, ops
from .ops import (_at, _fused, _linear, _plain_eager, autocast_input, check_finite, check_layer_weights,
                  check_model_args, has_weights, warn_transposed_linears)
from .siblings import _Siblings

# The recipes of quantize_: stateless ones (delayed scaling keeps an amax history per layer, not
# kept here). Their scalings - of the activation, cast in the GEMM, and of the weight - are the
# library's (fp8kit::Recipe): block is DeepSeek-V3's 1x128 activations, 128x128 weights; mxfp8 is
# OCP MX's 1x32 blocks with e8m0 scales (held as torch.float8_e8m0fnu).
RECIPES = ("rowwise", "tensorwise", "block", "mxfp8", "weight_only")


# The recipes whose input is not quantized ("none": fp8kit's weight-only GEMM), by their
# weight's scaling: weight_only (quantize_'s; torchao's Float8WeightOnlyConfig and optimum-quanto's
# qfloat8 weights: per output row) and layerwise (enable_layerwise_casting's native Linear: one
# scale, or none as Diffusers stores weights; the input stays in compute_dtype as Diffusers computes).
_WEIGHT_ONLY = {"weight_only": "row", "layerwise": "tensor"}


def _recipe_scalings(recipe):
    """(input scaling, weight scaling) of a Float8InferenceLinear's recipe."""
    if recipe in _WEIGHT_ONLY:
        return "none", _WEIGHT_ONLY[recipe]
    return tuple(fp8kit._fp8kit.recipe_scalings(recipe))


def _fp8_weight(w, storage_dtype, scaling, scaled=True):
    """A weight stored in FP8 as the torch.nn modules here hold it: (codes as storage_dtype,
    scale_inv). scaled: quantized with `scaling` (fp8kit.quantize: scale = fp8_max / amax per
    group) from w as it is (float32 / bfloat16 / float16: no widened copy), straight into the
    tensors the module keeps; else cast as it is with scale 1, as Diffusers stores weights."""
    w = w.detach()
    if not scaled:
        return w.to(storage_dtype), torch.ones(1, 1)
    fmt = str(storage_dtype).removeprefix("torch.float8_")
    outs = fp8kit._quantize_into(w, scaling, False, lambda x, o: fp8kit._fp8kit.quantize(x, fmt, scaling, outs=o))[1]
    return outs[0].view(storage_dtype), _scale_tensor(outs[1], scaling)


def _scale_tensor(scale_inv, scaling):
    """scale_inv as a Float8InferenceLinear holds it: float32, or for mx32 torch.float8_e8m0fnu -
    from its e8m0 codes (uint8, what quantize returns) or from float32 values (powers of two)."""
    if scaling != "mx32":
        return scale_inv
    if scale_inv.dtype == torch.uint8:
        return scale_inv.view(torch.float8_e8m0fnu)
    return scale_inv.to(torch.float8_e8m0fnu)


class Float8InferenceLinear(nn.Module):
    """An nn.Linear for inference with an FP8 weight [out, in] (buffer `weight`, torch.float8_*)
    and its scale_inv (buffer `weight_scale_inv`): y = x W^T + b with x cast to FP8 in the GEMM
    (recipe weight_only: x not quantized).

    On the host, quantize_ leaves the packed weight the GEMM reads as the only copy of the codes
    (release_codes): the buffer is then a stand-in (their shape and dtype over one NaN code, no
    memory) that carries the packed weight into eager and torch.compile'd calls alike, and
    wherever torch needs the codes as a tensor they are read back from the packing, bit for bit -
    named_buffers and state_dict, deepcopy and pickle, .to(), torch.export. Reading
    `layer.weight` takes them back into the buffer (so that what is written into it reaches the
    GEMM), the layer holding both copies from then on, until release_codes(). load_state_dict
    writes them and releases them again."""

    _siblings = None  # (_Siblings, this layer's index there): set by quantize_ / enable_layerwise_casting
    _released = False  # whether the codes are to be held by the packed weight alone (release_codes)
    _stored_as = None  # "compressed-tensors": state_dict names the scale as that layout does (_record_in_config)
    # "gelu": GELU (tanh form) applied in the GEMM's epilogue, to the float32 sums (a Linear fused
    # with the GELU after it: gelu_fusion.py); "none": y as nn.Linear gives it
    activation = "none"

    def __init__(self, in_features, out_features, bias=True, recipe="rowwise", format="e4m3fn"):
        super().__init__()
        if recipe not in RECIPES and recipe not in _WEIGHT_ONLY:
            raise fp8kit.Error(f"fp8kit.torch: recipe {fp8kit._quoted(recipe)}, expected one of {', '.join(RECIPES)}")
        if format not in ("e4m3fn", "e5m2"):  # the FP8 formats the GEMM takes a weight in
            raise fp8kit.Error(f"fp8kit.torch.Float8InferenceLinear: format {fp8kit._quoted(format)}, expected "
                               "'e4m3fn' or 'e5m2'")
        self.in_features, self.out_features, self.recipe = in_features, out_features, recipe
        self.input_scaling, self.weight_scaling = _recipe_scalings(recipe)
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=getattr(torch, "float8_" + format)))
        shape = fp8kit._fp8kit.scale_shape(self.weight_scaling, out_features, in_features)
        self.register_buffer("weight_scale_inv", _scale_tensor(torch.ones(shape), self.weight_scaling))
        self.register_parameter("bias", nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None)
        self._buffers = _Buffers(self._buffers)
        self.register_load_state_dict_pre_hook(_codes_before_load)
        self.register_load_state_dict_post_hook(_release_after_load)
        self._register_state_dict_hook(_stored_names)

    @classmethod
    def from_linear(cls, linear_module, recipe="rowwise", format="e4m3fn"):
        """The FP8 twin of an nn.Linear: its weight quantized with the recipe's weight scaling."""
        m = cls(linear_module.in_features, linear_module.out_features, linear_module.bias is not None, recipe, format)
        m.weight, m.weight_scale_inv = _fp8_weight(linear_module.weight, getattr(torch, "float8_" + format),
                                                   m.weight_scaling)
        if linear_module.bias is not None:
            m.bias = nn.Parameter(linear_module.bias.detach().clone(), requires_grad=False)  # inference only
        return m

    def forward(self, x):
        # x [..., in] -> y [..., out], by one route (ops._linear): called directly when nothing traces
        # the call (no torch.compile, export, dispatch mode or autograd: _plain_eager), as the
        # operator's dispatch from Python costs several times a decode step's small GEMM; else through
        # the operator, which torch.compile and torch.export see. The tensors through the module's
        # dicts: Module.__getattr__ is a Python call a name.
        # input_scale: a checkpoint's static activation scale (Float8StaticInputLinear), else None.
        buffers = self._buffers
        x = autocast_input(x)
        if _plain_eager(x):
            return _linear(x, buffers["weight"], buffers["weight_scale_inv"], self._parameters["bias"],
                           self.input_scaling, self.weight_scaling, buffers.get("input_scale"), self._siblings,
                           self.activation)
        return torch.ops.fp8kit.linear(x, buffers["weight"], buffers["weight_scale_inv"], self._parameters["bias"],
                                       self.input_scaling, self.weight_scaling, buffers.get("input_scale"),
                                       self.activation)

    @property
    def weight(self):
        """The FP8 codes [out, in], the buffer: where the packed weight held them alone, read back
        into it (so that what is written into it reaches the GEMM, as before release_codes); the
        layer holds both copies from then on, until release_codes()."""
        if "weight" not in self._buffers:  # not registered yet: register_buffer asks hasattr
            raise AttributeError("weight")
        self._restore_codes()
        return self._buffers["weight"]

    def release_codes(self):
        """Makes the packed weight (packed now if it was not) the only copy of the codes, on the
        host; elsewhere, or when already released, nothing."""
        w, s, bias = self._buffers["weight"], self._buffers["weight_scale_inv"], self._parameters["bias"]
        static = self._buffers.get("input_scale")
        self._released = True
        if w.is_cpu and not ops.is_stand_in(w):
            self._buffers["weight"] = ops.release_codes(w, s, self.weight_scaling, bias, self.input_scaling, static,
                                                        self.activation)
        elif not w.is_cpu and not w.is_meta:
            # packed now; on a GPU the GEMM reads the codes
            _fused(w, s, self.weight_scaling, bias, self.input_scaling, static, self.activation)

    def _restore_codes(self):
        """The codes back in the buffer, where they were released (the packed weight is kept)."""
        w = self._buffers["weight"]
        if ops.is_stand_in(w):
            self._buffers["weight"] = ops.restore_codes(w)

    def _apply(self, fn, recurse=True):
        # .to(), .cuda(), .half(), .float() ...: the codes and their scales (a static input_scale
        # too) go where fn sends them but keep their dtypes - a module-wide dtype cast would turn
        # codes into values and round the scales - while the bias takes fn whole. Released again
        # where they stay on the host.
        self._restore_codes()
        kept = {name: self._buffers[name] for name in ("weight", "weight_scale_inv", "input_scale")
                if name in self._buffers}
        out = super()._apply(fn, recurse)
        for name, t in kept.items():
            if self._buffers[name].dtype != t.dtype:
                self._buffers[name] = t.to(self._buffers[name].device)
        # A bias given new data in place (param.data = ...) is packed again: its data pointer,
        # part of the packed weight's key (ops._stamp), moved.
        if self._released:
            self.release_codes()
        return out

    def __getstate__(self):
        # deepcopy and pickle: the codes (_Buffers.items), not the stand-in (whose packed weight is
        # dropped), as pickle can load them (ops.picklable); a copy made from them releases them
        # again (__setstate__).
        return dict(self.__dict__, _buffers=ops.picklable(self._buffers))

    def __setstate__(self, state):
        super().__setstate__(state)
        self._buffers = _Buffers(self._buffers)
        if self._released:
            self.release_codes()

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.recipe}, format={str(self._buffers['weight'].dtype).removeprefix('torch.float8_')}"
                + ("" if self.activation == "none" else f", activation={self.activation}"))


class _Buffers(dict):
    """A Float8InferenceLinear's _buffers. torch walks a module's buffers through items() and
    values() - named_buffers, state_dict, torch.export's lifting - and there a released weight's
    stand-in is given as its codes, read back from the packed weight (ops.codes_of); the layer's
    own lookups (indexing) get the stand-in itself."""

    def items(self):
        return [(k, ops.codes_of(v) if k == "weight" and v is not None else v) for k, v in dict.items(self)]

    def values(self):
        return [v for _, v in self.items()]


# Float8InferenceLinear's hooks: load_state_dict writes into the codes, then releases them again.

def _codes_before_load(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    module._restore_codes()  # load_state_dict copies into the codes tensor (and keeps it where a key is missing)
    scale = state_dict.pop(prefix + "weight_scale", None)  # compressed-tensors' name (_stored_names)
    if scale is not None:
        if module.weight_scaling == "mx32" and scale.dtype == torch.uint8:  # its MXFP8: the e8m0 codes
            scale = scale.view(torch.float8_e8m0fnu)
        state_dict[prefix + "weight_scale_inv"] = scale.reshape(module._buffers["weight_scale_inv"].shape)
    _check_loaded(module, state_dict, prefix)
    if local_metadata.get("assign_to_params_buffers", False):
        _as_held(module, state_dict, prefix)


def _as_held(module, state_dict, prefix):
    """load_state_dict(assign=True) puts the given tensors in the layer's place as they are, where
    a copying load converts them: each converted here to the dtype the layer holds (a bfloat16
    scale to float32, as copy_ would; codes are checked to be in it already), C-contiguous (the
    GEMM reads them so). A meta tensor, which holds no values, is refused."""
    for name in ("weight", "weight_scale_inv", "input_scale", "bias"):
        t = state_dict.get(prefix + name)
        held = module._buffers.get(name) if name in module._buffers else module._parameters.get(name)
        if not isinstance(t, torch.Tensor) or held is None:
            continue
        if t.is_meta and not held.is_meta:
            raise fp8kit.Error(f"fp8kit.torch.Float8InferenceLinear.load_state_dict: '{prefix}{name}' is on the meta "
                               "device, which holds no values: assign=True would leave the layer without them")
        if t.dtype != held.dtype or not t.is_contiguous():
            state_dict[prefix + name] = t.to(held.dtype).contiguous()


def _first_nonfinite(codes):
    """The flat index of the first NaN code (or e5m2 Inf) of FP8 codes, else None: on the host the
    library's scan, on a CUDA device torch's, with no copy to the host (the codes whose exponent
    bits are all ones: e4m3fn's NaN; e5m2's Inf and NaN); None on any other device."""
    if codes.is_cpu:
        return fp8kit._fp8kit.first_nonfinite_code(fp8kit._to_extension(codes),
                                                   str(codes.dtype).removeprefix("torch.float8_"))
    if not codes.is_cuda:
        return None
    top = 0x7F if codes.dtype == torch.float8_e4m3fn else 0x7C
    bad = (codes.view(torch.uint8) & top) == top
    return int(bad.reshape(-1).nonzero()[0]) if bad.any() else None


def _check_loaded(module, state_dict, prefix):
    """What load_state_dict is about to copy into a Float8InferenceLinear, checked before anything is
    copied - torch's copy_ converts by value, so other FP8 codes (e5m2 into e4m3fn: saturated) or
    uint8 codes (taken as numbers) would load as other weights: the codes in the layer's own FP8
    dtype and without NaN (one makes every output it reaches NaN); scales (weight_scale_inv, a
    static input_scale) finite and positive, e8m0 ones not its NaN code, and none whose product with
    the format's largest code overflows float32 - as load_fp8_checkpoint
    checks a file's (docs/CHECKPOINTS.md). An fp8kit.Error naming the key, the layer unchanged."""
    where = "fp8kit.torch.Float8InferenceLinear.load_state_dict"
    codes, held = state_dict.get(prefix + "weight"), module._buffers["weight"].dtype
    if isinstance(codes, torch.Tensor):
        if codes.dtype != held:
            raise fp8kit.Error(f"{where}: '{prefix}weight' is {codes.dtype}, but the layer holds {held} codes; "
                               "FP8 codes load as they are, never converted")
        at = _first_nonfinite(codes)
        if at is not None:
            raise fp8kit.Error(f"{where}: '{prefix}weight' holds a code that is not a number at "
                               f"{_at(at, codes.shape)}: every output it reaches would be NaN")
    # A scale times the codes' largest magnitude must be a float32, as the file loader's
    # checked_scale requires: past it the layer's weights would dequantize to Inf.
    largest = torch.finfo(held).max
    for name in ("weight_scale_inv", "input_scale"):
        scale = state_dict.get(prefix + name)
        if not isinstance(scale, torch.Tensor) or scale.device.type not in ("cpu", "cuda"):
            continue
        if scale.dtype != torch.float8_e8m0fnu and not (scale.dtype.is_floating_point and scale.dtype.itemsize > 1):
            raise fp8kit.Error(f"{where}: '{prefix}{name}' is {scale.dtype}; a scale is float32, bfloat16, "
                               "float16 (or e8m0 for mxfp8)")
        value = scale.float()  # e8m0's NaN code 0xFF: NaN
        bad = ~(torch.isfinite(value) & (value > 0) & (value.double() * largest <= torch.finfo(torch.float32).max))
        if bad.any():
            at = int(bad.reshape(-1).nonzero()[0])
            v = np.float32(value.reshape(-1)[at].item())  # str: float32's shortest digits (1e+36, not 9.99...e+35)
            why = (f"times the codes' largest magnitude ({largest:g}) that is beyond float32, so the weights "
                   "would dequantize to Inf" if np.isfinite(v) and v > 0 else "a scale is finite and positive")
            raise fp8kit.Error(f"{where}: '{prefix}{name}' holds {str(v)} at {_at(at, scale.shape)}: {why}")


def _stored_names(module, state_dict, prefix, local_metadata):
    """state_dict of a layer recorded in compressed-tensors' layout: the scale named as that layout
    names it, weight_scale (a tensor scale as its [1], e8m0 scales as their uint8 codes, as its
    MXFP8 stores them); the same memory."""
    if module._stored_as == "compressed-tensors":
        scale = state_dict.pop(prefix + "weight_scale_inv")
        if module.weight_scaling == "tensor":
            scale = scale.reshape(1)
        elif module.weight_scaling == "mx32":
            scale = scale.view(torch.uint8)
        state_dict[prefix + "weight_scale"] = scale


def _release_after_load(module, incompatible_keys):
    if module._released:
        module.release_codes()


def _granularity_name(g):
    """torchao's granularity object as fp8kit names a scaling: tensor, row, block(RxC); else its repr."""
    name = type(g).__name__
    if name == "PerTensor":
        return "tensor"
    if name == "PerRow" and getattr(g, "dim", -1) in (-1, 1):
        return "row"
    if name == "PerBlock" and len(getattr(g, "block_size", ())) == 2:
        return "block({}x{})".format(*g.block_size)
    return repr(g)


def _recipe_of_torchao_config(config):
    """The recipe of quantize_ that does what a torchao float8 config asks, on fp8kit's kernels:
    Float8DynamicActivationFloat8WeightConfig with e4m3fn operands and PerTensor, PerRow or
    DeepSeek-V3's 1x128 / 128x128 PerBlock granularity -> tensorwise, rowwise, block;
    Float8WeightOnlyConfig with e4m3fn per-row weights -> weight_only. torchao is not imported:
    the config is read by its class name and fields. Anything else: an fp8kit.Error naming it."""
    kind = type(config).__name__
    where = f"fp8kit.torch.quantize_: torchao's {kind}"
    e4m3 = torch.float8_e4m3fn
    if kind == "Float8WeightOnlyConfig":
        g = getattr(config, "granularity", None)
        if config.weight_dtype != e4m3 or (g is not None and _granularity_name(g) != "row"):
            raise fp8kit.Error(f"{where} with weight_dtype {config.weight_dtype} and granularity {g}: fp8kit's "
                               "weight_only recipe is e4m3fn per row")
        return "weight_only"
    if kind == "Float8DynamicActivationFloat8WeightConfig":
        g = config.granularity  # one for both operands, or [activation's, weight's]; None: tensor
        pair = g if isinstance(g, (list, tuple)) else (g, g)
        names = tuple("tensor" if x is None else _granularity_name(x) for x in pair)
        recipe = {("tensor", "tensor"): "tensorwise", ("row", "row"): "rowwise",
                  ("block(1x128)", "block(128x128)"): "block"}.get(names)
        if recipe is None or config.activation_dtype != e4m3 or config.weight_dtype != e4m3:
            raise fp8kit.Error(f"{where} with activation_dtype {config.activation_dtype}, weight_dtype "
                               f"{config.weight_dtype} and granularity {list(names)}: fp8kit runs e4m3fn with "
                               "[tensor, tensor], [row, row] or [block(1x128), block(128x128)]")
        if any(getattr(config, f, None) is not None for f in ("activation_value_lb", "activation_value_ub")):
            raise fp8kit.Error(f"{where} with activation_value_lb / _ub: fp8kit's casts do not clamp the "
                               "activation's amax")
        return recipe
    raise fp8kit.Error(f"fp8kit.torch.quantize_: config of type {kind}, expected a recipe name ({', '.join(RECIPES)}), "
                       "Float8DynamicActivationFloat8WeightConfig or Float8WeightOnlyConfig")


def quantize_(model, config=None, filter_fn=None, *, fuse_siblings=True):
    """Replaces, in place, every nn.Linear of model that filter_fn(module, fqn) accepts (all when
    None) by a Float8InferenceLinear. config: a recipe name - "rowwise" (the default),
    "tensorwise", "block", "mxfp8", or "weight_only" (e4m3 rowwise weights, activations not
    quantized: torchao's Float8WeightOnlyConfig; a float32 / float16 activation is taken to 16
    significant bits, twice the products of a bfloat16 one at M >= 16) - or torchao's config object
    for one of them (Float8DynamicActivationFloat8WeightConfig with PerTensor / PerRow /
    1x128-128x128 PerBlock granularity, Float8WeightOnlyConfig), as torchao's quantize_(model,
    config, filter_fn). fuse_siblings: Float8InferenceLinear layers of one module that the model
    calls in a row on the same input (q, k and v; gate and up) run in one call at up to 16 rows,
    each from its own packed weight, with the same outputs bit for bit (_Siblings: no copy of a
    weight). On a transformers model the quantization is recorded in model.config
    (_record_in_config: compressed-tensors' layout, or for mxfp8 fp8kit's own), so that
    save_pretrained writes a checkpoint from_pretrained runs as stored.
    A Linear with in or out features 0 stays as it is (no weight to hold in FP8). Every chosen
    layer's weight is checked (ops.check_layer_weights, and finite: ops.check_finite): a bad one is
    an fp8kit.Error naming it, and the model is left as it was - checked before the first layer is
    replaced, or for a weight mapped from a file where it is quantized, the layers replaced before
    it then put back."""
    check_model_args("fp8kit.torch.quantize_", model, filter_fn)
    warn_transposed_linears("fp8kit.torch.quantize_", model)
    recipe = "rowwise" if config is None else config  # "", 0 or False are refused, not taken as the default
    if not isinstance(recipe, str):
        recipe = _recipe_of_torchao_config(recipe)
    if recipe not in RECIPES:
        raise fp8kit.Error(f"fp8kit.torch.quantize_: config {fp8kit._quoted(recipe)}, expected one of {', '.join(RECIPES)}")
    chosen = [(fqn, m) for fqn, m in model.named_modules()
              if type(m) is nn.Linear and has_weights(m) and (filter_fn is None or filter_fn(m, fqn))]
    if chosen and not chosen[0][0]:
        raise fp8kit.Error("fp8kit.torch.quantize_: the model is itself an nn.Linear; quantize_ replaces the "
                           "Linear layers inside a model (wrap it: nn.Sequential(linear))")
    where = "fp8kit.torch.quantize_"
    check_layer_weights(where, chosen)
    mapped = memory.file_mappings()
    # Non-finite weights are refused before any layer changes (ops.check_finite). A weight in memory
    # is scanned now; one mapped from a file (from_pretrained's safetensors) where it is quantized,
    # so that its pages are read once and go back after - scanning them all first would page the
    # whole model in. Those layers go first, and a bad one puts back the layers replaced before it:
    # their weights are still the file's pages.
    in_file = {fqn: memory.in_file_mapping(m.weight, mapped) for fqn, m in chosen}
    check_finite(where, [(f"layer '{fqn}' weight", m.weight) for fqn, m in chosen if not in_file[fqn]])
    chosen.reverse()
    chosen.sort(key=lambda c: in_file[c[0]])  # popped from the end: the mapped layers first, each in model order
    names = {}  # a Parameter's names: more than one is a tied weight, which stays in use
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    replaced = []  # the mapped layers replaced so far, (fqn, the Linear), to put back on a bad one
    at = ops.places(model)
    while chosen:  # popped, so that no list keeps a replaced Linear alive until the end
        fqn, m = chosen.pop()
        w = m.weight
        if in_file[fqn]:
            try:
                check_finite(where, [(f"layer '{fqn}' weight", w)])
            except fp8kit.Error:
                for name, linear in reversed(replaced):
                    for place in at[id(linear)]:
                        model.set_submodule(place, linear)
                raise
            replaced.append((fqn, m))
        fp8 = Float8InferenceLinear.from_linear(m, recipe)
        for place in at[id(m)]:  # a Linear held at two places stays one module there
            model.set_submodule(place, fp8)
        fp8.release_codes()  # packed now, and the packed weight is the codes' only copy
        # The high-precision weight, read for the last time: where it is a file's pages (a model
        # loaded from safetensors maps its file) they go back now - they would stay resident as
        # long as any other tensor of that file is mapped - unless another module still uses it.
        if len(names.get(id(w), ())) == 1 and in_file[fqn]:
            memory.release_pages(w)
        del m, w  # the replaced Linear goes now where nothing else holds it
        memory.trim_heap()
    memory.give_back()
    _record_in_config(model)
    if fuse_siblings:
        _group_siblings(model)


def _block_of(scaling):
    """(rows, cols) of a block(RxC) scaling name, else None."""
    m = re.fullmatch(r"block\((\d+)x(\d+)\)", scaling)
    return (int(m[1]), int(m[2])) if m else None


def _scheme_of(weight_scaling):
    """fp8kit's checkpoint layout's scheme for a weight scaling (docs/CHECKPOINTS.md), and the
    config field its size goes to: row -> channel, block(1xG) -> group (group_size G),
    block(RxC) -> block128 (weight_block_size [R, C])."""
    if weight_scaling in ("tensor", "mx32"):
        return weight_scaling, None, None
    if weight_scaling == "row":
        return "channel", None, None
    rows, cols = _block_of(weight_scaling)
    return ("group", "group_size", cols) if rows == 1 else ("block128", "weight_block_size", [rows, cols])


def _compressed_tensors_args(m):
    """(weights, input_activations) of compressed-tensors' config for the FP8 layer m - input None
    where its activation is not quantized - or None where that layout cannot say it (e5m2 codes, an
    mx32 activation over another weight scaling). mx32 is its MXFP8: groups of 32 whose uint8
    scale_dtype makes them e8m0 (should_generate_mx_scales), format mxfp8-quantized."""
    if m._buffers["weight"].dtype != torch.float8_e4m3fn:
        return None
    base = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "block_structure": None}
    if m.weight_scaling == "mx32" and m.input_scaling in ("mx32", "none"):
        mx = dict(base, strategy="group", group_size=32, scale_dtype="torch.uint8")
        return dict(mx, dynamic=False), (None if m.input_scaling == "none" else dict(mx, dynamic=True))
    if "mx32" in (m.weight_scaling, m.input_scaling):
        return None
    scheme, field, size = _scheme_of(m.weight_scaling)
    weights = dict(base, strategy="block" if scheme == "block128" else scheme, dynamic=False)
    if field == "group_size":
        weights["group_size"] = size
    elif field:
        weights["block_structure"] = size
    if m.input_scaling == "none":
        return weights, None
    static = "input_scale" in m._buffers
    if m.input_scaling == "row":
        return weights, dict(base, strategy="token", dynamic=True)
    if m.input_scaling == "tensor":
        return weights, dict(base, strategy="tensor", dynamic=not static)
    return weights, dict(base, strategy="group", group_size=_block_of(m.input_scaling)[1], dynamic=True)


def _record_in_config(model, extra=()):
    """On a transformers model (its `config`), every FP8 layer it holds as a checkpoint layout
    says it, so that save_pretrained writes a checkpoint from_pretrained runs as the model runs
    now: compressed-tensors' layout (float-quantized; mxfp8-quantized for mx32) where it can say every layer (as
    llm-compressor writes it - transformers runs it too - with the layers' state_dict
    naming each scale weight_scale), else fp8kit's own (quant_method fp8kit: each layer's weight
    scheme and the scaling its activation is cast with, "none": not quantized). A static
    input_scale goes with its weight; the Linear layers left are kept (ignore /
    modules_to_not_convert). extra: (name, layer) for FP8 layers that are not modules of model
    (3-D experts: named as their tensors are saved). Nothing when the model holds no FP8 layer."""
    config = getattr(model, "config", None)
    if not callable(getattr(config, "to_dict", None)):
        return
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, Float8InferenceLinear)] + list(extra)
    if not layers:
        return
    kept = [fqn for fqn, m in model.named_modules() if type(m) is nn.Linear]
    args = [_compressed_tensors_args(m) for _, m in layers]
    compressed = None not in args
    for _, m in layers:
        m._stored_as = "compressed-tensors" if compressed else None
    if compressed:
        groups = {}
        for (name, _), a in zip(layers, args):
            groups.setdefault(json.dumps(a, sort_keys=True), (a, []))[1].append(name)
        formats = ["mxfp8-quantized" if "scale_dtype" in a[0] else "float-quantized" for a, _ in groups.values()]
        config.quantization_config = {
            "quant_method": "compressed-tensors", "quantization_status": "compressed",
            "format": formats[0] if len(set(formats)) == 1 else "mixed-precision",
            "config_groups": {f"group_{i}": {"targets": names, "weights": a[0], "input_activations": a[1],
                                             "output_activations": None, "format": f}
                              for i, ((a, names), f) in enumerate(zip(groups.values(), formats))},
            "ignore": kept, "kv_cache_scheme": None, "sparsity_config": {}}
        return
    qc = {"quant_method": "fp8kit", "schemes": {}, "activations": {}}
    formats = set()
    for name, m in layers:
        scheme, field, size = _scheme_of(m.weight_scaling)
        if field and qc.setdefault(field, size) != size:
            raise fp8kit.Error(f"fp8kit.torch: layer '{name}' has {field} {size}, another {qc[field]}; fp8kit's "
                               f"checkpoint layout records one {field} for a model")
        formats.add(str(m._buffers["weight"].dtype).removeprefix("torch.float8_").removesuffix("fn"))
        qc["schemes"][name] = scheme
        qc["activations"][name] = m.input_scaling
    if len(formats) == 1:  # the codes' dtype is what the readers go by; fmt says it for people
        qc["fmt"] = formats.pop()
    qc["modules_to_not_convert"] = kept
    config.quantization_config = qc


def _group_siblings(model):
    """Gives every group of two or more Float8InferenceLinear children of one module, alike in
    in_features, recipe, weight dtype and bias or none, one _Siblings."""
    for parent in model.modules():
        groups = {}
        for child in parent.children():
            if type(child) is Float8InferenceLinear:
                key = (child.in_features, child.recipe, child._buffers["weight"].dtype, child.bias is None)
                groups.setdefault(key, []).append(child)
        for members in groups.values():
            if len(members) > 1:
                siblings = _Siblings(members)
                for i, m in enumerate(members):
                    m._siblings = (siblings, i)
