"""fp8kit.torch.layerwise_casting: enable_layerwise_casting - Diffusers' API and default skip
patterns: weights stored in FP8; Linear layers compute on the FP8 weight directly (a GELU that
only reads one's output in its GEMM: gelu_fusion.py), embeddings decode only the rows they read,
convolutions are upcast per forward as Diffusers does. The report it returns restores the model
(remove()).

Checked by tests/python/test_layerwise.py (against Diffusers' apply_layerwise_casting on the same
model, the native Linear against float64, the restore against the original model) and
test_torch.py (its siblings).
"""
import functools
import re

import torch
from torch import nn

import fp8kit
from fp8kit import _quoted

from . import memory
from .gelu_fusion import fuse_gelu as _fuse_gelu
from .inference import Float8InferenceLinear, _fp8_weight, _group_siblings
from .ops import check_finite, check_layer_weights, check_model_args, has_weights, picklable

# Diffusers' defaults (diffusers.hooks.layerwise_casting): the modules whose names match one of
# these are left alone, and only these layer kinds have their weights stored in FP8.
DEFAULT_SKIP_MODULES_PATTERN = ("pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$")
CASTABLE_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
                   nn.Linear, nn.Embedding)


class LayerwiseCastingReport:
    """What enable_layerwise_casting did: `native` Linear layers compute on their FP8 weight
    (fp8kit's GEMM), those of them in `fused_gelu` with the GELU after them in the GEMM's epilogue,
    `cast` layers are upcast to compute_dtype at each forward (Diffusers' hook), `skipped` (name,
    why) stay as they were - and how to undo it: remove().

    The report holds the original weights until remove() (FP8 storage cannot be cast back without
    loss, which is why Diffusers' hook refuses to be removed): keep it only while the model may be
    restored; the memory FP8 storage saves is freed once it is dropped. (A native Linear holds its
    FP8 weight once, as the packed weight its GEMM reads: Float8InferenceLinear.release_codes.)"""

    def __init__(self):
        self.native, self.fused_gelu, self.cast, self.skipped = [], [], [], []
        self._undo = []  # one callable per module changed, in the order they were changed

    def remove(self):
        """Gives the model back what enable_layerwise_casting changed, as it was: the original
        modules in place of the native ones, the cast layers' weights in their own dtypes and
        values, their hooks taken off. Outputs are then the original model's, bit for bit; a
        second call does nothing."""
        while self._undo:
            self._undo.pop()()

    def __str__(self):
        lines = [f"native FP8 ({len(self.native)}): {', '.join(self.native) or '-'}",
                 f"GELU in the GEMM ({len(self.fused_gelu)}): {', '.join(self.fused_gelu) or '-'}",
                 f"upcast per forward ({len(self.cast)}): {', '.join(self.cast) or '-'}"]
        lines += [f"skipped {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def _to(dtype, non_blocking, module, *args):
    """A forward hook (pre: upcast; post: store): module's parameters cast to dtype."""
    module.to(dtype=dtype, non_blocking=non_blocking)


def _cast_hooks(module, storage_dtype, compute_dtype, non_blocking):
    """Diffusers' LayerwiseCastingHook: stored in storage_dtype, compute_dtype for each forward.
    Returns what undoes it: the hooks removed, each parameter given back its original tensor."""
    # By owner and name: .to() gives a parameter new data (or, by torch's __future__ flags, puts a
    # new Parameter in its place); the detached tensors keep the original data. CASTABLE_LAYERS
    # hold no buffers.
    originals = [(m, name, p.detach()) for m in module.modules() for name, p in m._parameters.items()
                 if p is not None]
    module.to(dtype=storage_dtype, non_blocking=non_blocking)
    # Module-level functions, not closures: torch.save of a model with the hooks works.
    hooks = (module.register_forward_pre_hook(functools.partial(_to, compute_dtype, non_blocking)),
             module.register_forward_hook(functools.partial(_to, storage_dtype, non_blocking)))
    module._fp8kit_layerwise = True  # _cast_before: a second call would take the FP8 weights as originals

    def undo():
        for hook in hooks:
            hook.remove()
        for m, name, data in originals:
            m._parameters[name].data = data
        del module._fp8kit_layerwise
    return undo


def _cast_before(model):
    """The name of a layer below model that enable_layerwise_casting changed already, else None. A
    second call is refused: its report would record the FP8 weights as the originals, and the
    reports' remove() could not give the model back."""
    for name, m in model.named_modules():
        if (getattr(m, "_fp8kit_layerwise", False) or isinstance(m, Float8Embedding)
                or (isinstance(m, Float8InferenceLinear) and m.recipe == "layerwise")):
            return name or "(model)"
    return None


def _native_linear(linear_module, storage_dtype, compute_dtype, scaled):
    """A Float8InferenceLinear (recipe layerwise: the input not quantized) holding the Linear's
    weight in storage_dtype: with a per-tensor scale (scaled), or cast as it is, scale 1 (Diffusers'
    storage). The bias stays in compute_dtype (N values; Diffusers rounds it to FP8 too)."""
    m = Float8InferenceLinear(linear_module.in_features, linear_module.out_features, linear_module.bias is not None,
                              "layerwise", str(storage_dtype).removeprefix("torch.float8_"))
    m.weight, m.weight_scale_inv = _fp8_weight(linear_module.weight, storage_dtype, "tensor", scaled)
    if linear_module.bias is not None:
        m.bias = nn.Parameter(linear_module.bias.detach().to(compute_dtype), requires_grad=False)
    m.release_codes()  # packed now, the packed weight the codes' only copy (on the host)
    return m


class Float8Embedding(nn.Module):
    """An nn.Embedding whose table [num, dim] is stored in FP8 (buffer `weight`) with a per-tensor
    `weight_scale_inv`: a lookup decodes only the rows it reads, to compute_dtype - where Diffusers'
    hook upcasts the whole table and casts it back at every forward, a pass over a vocabulary's
    table to read a few rows."""

    def __init__(self, weight, weight_scale_inv, compute_dtype, padding_idx=None):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale_inv", weight_scale_inv)
        self.compute_dtype, self.padding_idx = compute_dtype, padding_idx

    @classmethod
    def from_embedding(cls, embedding, storage_dtype, compute_dtype, scaled):
        codes, scale_inv = _fp8_weight(embedding.weight, storage_dtype, "tensor", scaled)
        return cls(codes, scale_inv, compute_dtype, embedding.padding_idx)

    def forward(self, ids):
        # ids [...] -> [..., dim]: decode(code) * scale_inv in float32 (exact for scale 1), then compute_dtype.
        rows = nn.functional.embedding(ids, self.weight, self.padding_idx)
        return (rows.float() * self.weight_scale_inv[0, 0]).to(self.compute_dtype)

    def __getstate__(self):  # deepcopy and pickle: the FP8 table as pickle can load it
        return dict(self.__dict__, _buffers=picklable(self._buffers))

    def extra_repr(self):
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}, weight={self.weight.dtype}, compute={self.compute_dtype}"


def _has_native(module):
    """Whether a layer computes on its weight stored in FP8 directly: an nn.Linear with weights
    (a Float8InferenceLinear takes its place), an nn.Embedding not sparse, without max_norm (a
    Float8Embedding)."""
    if type(module) is nn.Linear:
        return has_weights(module)
    return type(module) is nn.Embedding and module.max_norm is None and not module.sparse


def _native(module, storage_dtype, compute_dtype, scaled):
    """The layer of _has_native(module) that takes module's place."""
    if type(module) is nn.Linear:
        return _native_linear(module, storage_dtype, compute_dtype, scaled)
    return Float8Embedding.from_embedding(module, storage_dtype, compute_dtype, scaled)


def _skips(skip_modules_pattern, skip_modules_classes):
    """The skip arguments as Diffusers takes them - patterns: "auto" (DEFAULT_SKIP_MODULES_PATTERN),
    None, a regular expression or a tuple or list of them; classes: None or a tuple or list of
    module classes - as (compiled patterns, classes); anything else an fp8kit.Error naming the
    argument, before any layer changes."""
    where = "fp8kit.torch.enable_layerwise_casting"
    given = DEFAULT_SKIP_MODULES_PATTERN if skip_modules_pattern == "auto" else (
        () if skip_modules_pattern is None else
        (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else skip_modules_pattern)
    if not isinstance(given, (tuple, list)) or not all(isinstance(p, str) for p in given):
        raise fp8kit.Error(f"{where}: skip_modules_pattern is {_quoted(repr(skip_modules_pattern))}, expected a regular "
                           "expression, a tuple of them, None or 'auto'")
    patterns = []
    for p in given:
        try:
            patterns.append(re.compile(p))
        except re.error as e:
            raise fp8kit.Error(f"{where}: skip_modules_pattern {_quoted(p)} is not a regular expression ({e})") from None
    classes = () if skip_modules_classes is None else skip_modules_classes
    if not isinstance(classes, (tuple, list)) or not all(isinstance(c, type) for c in classes):
        raise fp8kit.Error(f"{where}: skip_modules_classes is {_quoted(repr(skip_modules_classes))}, expected a tuple "
                           "of module classes or None")
    return patterns, tuple(classes)


def enable_layerwise_casting(model, storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16,
                             skip_modules_pattern="auto", skip_modules_classes=None, non_blocking=False, *,
                             native_fp8=True, scaled=True, fuse_siblings=True, fuse_gelu=True):
    """Diffusers' layerwise casting (ModelMixin.enable_layerwise_casting, apply_layerwise_casting):
    the weights of the layers below model that no pattern (re.search on the qualified name;
    "auto": DEFAULT_SKIP_MODULES_PATTERN) or class skips are stored in storage_dtype. Convolutions
    are upcast to compute_dtype around each forward, as Diffusers does; with native_fp8, nn.Linear
    layers instead compute on the FP8 weight directly - the activation as Diffusers computes it,
    not quantized (fp8kit's weight-only GEMM), float32 sums, output in the input's dtype - and keep
    no upcast copy, and nn.Embedding layers become Float8Embedding, whose lookup decodes only the
    rows it reads.
    scaled: weights stored with a per-tensor scale (fp8_max / amax), or False as Diffusers stores
    them (cast as they are: small weights lose bits in FP8's subnormals). fuse_siblings: as
    quantize_'s, for the native Linear layers. fuse_gelu: a GELU in the tanh form that only reads a
    native Linear's output - Diffusers' GELU module (FeedForward's "gelu-approximate"), or an
    nn.GELU(approximate="tanh") the parent's forward calls on it alone (Flux's single blocks:
    self.act_mlp(self.proj_mlp(x))) - runs in that Linear's GEMM epilogue, on the float32 sums,
    rounded once to compute_dtype (Diffusers rounds the Linear's output to compute_dtype first);
    the GELU module becomes a Float8GELUProjection, the nn.GELU an nn.Identity.
    Returns a LayerwiseCastingReport saying which layer went which way, whose remove() restores
    the model."""
    check_model_args("fp8kit.torch.enable_layerwise_casting", model)
    # The two FP8 formats that hold weights (Diffusers' too): e8m0 holds scales - a cast to it drops
    # every sign - and the fnuz formats no FP8 layer here takes (refused before any layer changes).
    if storage_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise fp8kit.Error(f"fp8kit.torch.enable_layerwise_casting: storage_dtype {storage_dtype}, expected "
                           "torch.float8_e4m3fn or torch.float8_e5m2")
    if compute_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise fp8kit.Error(f"fp8kit.torch.enable_layerwise_casting: compute_dtype {compute_dtype}, expected "
                           "torch.float32, torch.bfloat16 or torch.float16 (the dtypes fp8kit's GEMM computes in)")
    done = _cast_before(model)
    if done is not None:
        raise fp8kit.Error(f"fp8kit.torch.enable_layerwise_casting: layer {_quoted(done)} is stored in FP8 "
                           "by an earlier call already; call remove() on that call's report first")
    patterns, classes = _skips(skip_modules_pattern, skip_modules_classes)
    report = LayerwiseCastingReport()
    native, cast = [], []  # (name, module, parent, its name there); cast: (name, module)

    def visit(module, prefix, parent, child):
        if classes and isinstance(module, classes):
            report.skipped.append((prefix, f"class {type(module).__name__}"))
            return
        hit = next((p for p in patterns if p.search(prefix)), None)
        if hit is not None:
            report.skipped.append((prefix, f"pattern {hit.pattern!r}"))
            return
        if native_fp8 and parent is not None and _has_native(module):
            native.append((prefix, module, parent, child))
        elif isinstance(module, CASTABLE_LAYERS):
            cast.append((prefix or "(model)", module))
        else:
            for name, sub in list(module.named_children()):
                visit(sub, f"{prefix}.{name}" if prefix else name, module, name)

    # The plan first, then the weights the native layers quantize checked, all before any layer
    # changes: a bad one leaves the model as it was.
    visit(model, "", None, None)
    check_layer_weights("fp8kit.torch.enable_layerwise_casting", [(name, m) for name, m, _, _ in native])
    check_finite("fp8kit.torch.enable_layerwise_casting",
                 [(f"layer '{name}' weight", m.weight) for name, m, _, _ in native] +
                 [(f"'{p}'" if name == "(model)" else f"'{name}.{p}'", t)
                  for name, m in cast for p, t in m.named_parameters()])
    made = {}  # id(a layer) -> what took its place: a layer held at two places is converted once
    for name, module, parent, child in native:
        if id(module) not in made:
            made[id(module)] = _native(module, storage_dtype, compute_dtype, scaled)
        setattr(parent, child, made[id(module)])
        report._undo.append(functools.partial(setattr, parent, child, module))  # the original, untouched
        report.native.append(name)
    for name, module in cast:
        if id(module) not in made:
            made[id(module)] = module
            report._undo.append(_cast_hooks(module, storage_dtype, compute_dtype, non_blocking))
        report.cast.append(name)
    if fuse_gelu and native_fp8:
        report.fused_gelu, undo = _fuse_gelu(model)
        report._undo += undo
    memory.give_back()
    if fuse_siblings:
        _group_siblings(model)
    return report
