"""fp8kit.torch.layerwise_casting: enable_layerwise_casting - Diffusers' API and default skip
patterns: weights stored in FP8; Linear layers compute on the FP8 weight directly (a GELU after
one in its GEMM's epilogue), embeddings decode only the rows they read, convolutions are upcast
per forward as Diffusers does. The report it returns restores the model (remove()).

Checked by tests/python/test_layerwise.py (against Diffusers' apply_layerwise_casting on the same
model, the native Linear against float64, the restore against the original model) and
test_torch.py (its siblings).
"""
import functools
import inspect
import re

import torch
from torch import nn

import fp8kit

from . import memory
from .inference import Float8InferenceLinear, _fp8_weight, _group_siblings
from .ops import check_model_args

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


def _cast_hooks(module, storage_dtype, compute_dtype, non_blocking):
    """Diffusers' LayerwiseCastingHook: stored in storage_dtype, compute_dtype for each forward.
    Returns what undoes it: the hooks removed, each parameter given back its original tensor."""
    def upcast(m, args):
        m.to(dtype=compute_dtype, non_blocking=non_blocking)

    def store(m, args, out):
        m.to(dtype=storage_dtype, non_blocking=non_blocking)

    # By owner and name: .to() gives a parameter new data (or, by torch's __future__ flags, puts a
    # new Parameter in its place); the detached tensors keep the original data. CASTABLE_LAYERS
    # hold no buffers.
    originals = [(m, name, p.detach()) for m in module.modules() for name, p in m._parameters.items()
                 if p is not None]
    module.to(dtype=storage_dtype, non_blocking=non_blocking)
    hooks = (module.register_forward_pre_hook(upcast), module.register_forward_hook(store))

    def undo():
        for hook in hooks:
            hook.remove()
        for m, name, data in originals:
            m._parameters[name].data = data
    return undo


def _native_linear(linear_module, storage_dtype, compute_dtype, scaled, activation="none"):
    """A Float8InferenceLinear (recipe layerwise: the input not quantized) holding the Linear's
    weight in storage_dtype: with a per-tensor scale (scaled), or cast as it is, scale 1 (Diffusers'
    storage). The bias stays in compute_dtype (N values; Diffusers rounds it to FP8 too).
    activation "gelu": the GELU after the Linear, in its GEMM's epilogue."""
    m = Float8InferenceLinear(linear_module.in_features, linear_module.out_features, linear_module.bias is not None,
                              "layerwise", str(storage_dtype).removeprefix("torch.float8_"))
    m.activation = activation
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

    def extra_repr(self):
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}, weight={self.weight.dtype}, compute={self.compute_dtype}"


class Float8GELUProjection(nn.Module):
    """Diffusers' GELU module (diffusers.models.activations.GELU: its Linear `proj`, then GELU) in
    its tanh form, with proj a Float8InferenceLinear whose GEMM applies the GELU: forward is
    proj(x). Its child keeps the name proj, so the module's state_dict keys are the original's."""

    def __init__(self, proj):
        super().__init__()
        self.proj = proj

    def forward(self, x):  # x [..., in] -> gelu(x W^T + b) [..., out]
        return self.proj(x)


def _diffusers_gelu(module):
    """Whether module is Diffusers' GELU module (its own class, not a subclass) in the tanh form
    over an nn.Linear, without hooks: its forward is proj, then F.gelu(approximate="tanh")."""
    cls = type(module)
    return (cls.__name__ == "GELU" and cls.__module__ == "diffusers.models.activations"
            and getattr(module, "approximate", None) == "tanh" and type(module._modules.get("proj")) is nn.Linear
            and not _hooked(module) and not _hooked(module.proj))


def _hooked(module):
    """Whether module has forward hooks of its own (a fused layer would skip what they see)."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


@functools.cache
def _forward_source(cls):
    """The source of cls.forward, or "" where Python has none (a compiled or generated class)."""
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return ""


def _gelu_after_linear(module):
    """{Linear child's name: GELU child's name} for each nn.Linear child of module whose output
    only an nn.GELU(approximate="tanh") child reads: the forward of module's class calls
    self.<gelu>(self.<linear>(...)) and names neither child anywhere else (Diffusers' Flux single
    blocks: self.act_mlp(self.proj_mlp(norm_hidden_states))). Neither child may have hooks."""
    source = _forward_source(type(module))
    pairs = {}
    for act, lin in re.findall(r"self\.(\w+)\(self\.(\w+)\(", source):
        a, linear = module._modules.get(act), module._modules.get(lin)
        if (type(a) is nn.GELU and a.approximate == "tanh" and type(linear) is nn.Linear
                and not _hooked(a) and not _hooked(linear)
                and len(re.findall(rf"self\.{act}\b", source)) == 1 and len(re.findall(rf"self\.{lin}\b", source)) == 1):
            pairs[lin] = act
    return pairs


def _native(module, storage_dtype, compute_dtype, scaled, activation="none"):
    """The layer that computes on module's weight stored in FP8 directly, to take its place: for an
    nn.Linear a Float8InferenceLinear (activation: as _native_linear's), for an nn.Embedding (not
    sparse, no max_norm) a Float8Embedding; None for any other module."""
    if type(module) is nn.Linear:
        return _native_linear(module, storage_dtype, compute_dtype, scaled, activation)
    if type(module) is nn.Embedding and module.max_norm is None and not module.sparse:
        return Float8Embedding.from_embedding(module, storage_dtype, compute_dtype, scaled)
    return None


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
    quantize_'s, for the native Linear layers. fuse_gelu: a native Linear whose output only a GELU
    in its tanh form reads - Diffusers' GELU module (FeedForward's "gelu-approximate"), or an
    nn.GELU(approximate="tanh") that the parent's forward calls on it alone (Flux's single blocks:
    self.act_mlp(self.proj_mlp(x))) - computes the GELU in its GEMM's epilogue, on the float32
    sums, rounded once to compute_dtype (Diffusers rounds the Linear's output to compute_dtype
    first); the GELU module becomes a Float8GELUProjection, the nn.GELU an nn.Identity.
    Returns a LayerwiseCastingReport saying which layer went which way, whose remove() restores
    the model."""
    check_model_args("fp8kit.torch.enable_layerwise_casting", model)
    if not (isinstance(storage_dtype, torch.dtype) and storage_dtype.is_floating_point and storage_dtype.itemsize == 1):
        raise fp8kit.Error(f"fp8kit.torch.enable_layerwise_casting: storage_dtype {storage_dtype} is not an FP8 dtype")
    if compute_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise fp8kit.Error(f"fp8kit.torch.enable_layerwise_casting: compute_dtype {compute_dtype}, expected "
                           "torch.float32, torch.bfloat16 or torch.float16 (the dtypes fp8kit's GEMM computes in)")
    patterns = DEFAULT_SKIP_MODULES_PATTERN if skip_modules_pattern == "auto" else (
        (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else tuple(skip_modules_pattern or ()))
    classes = tuple(skip_modules_classes or ())
    report = LayerwiseCastingReport()

    def skip(module, prefix):
        """Why module (at prefix) stays as it is, or None."""
        if classes and isinstance(module, classes):
            return f"class {type(module).__name__}"
        hit = next((p for p in patterns if re.search(p, prefix)), None)
        return None if hit is None else f"pattern {hit!r}"

    def put(parent, child, new, old):
        setattr(parent, child, new)
        report._undo.append(functools.partial(setattr, parent, child, old))  # the original, untouched

    def visit(module, prefix, parent, child, activation="none"):
        """Stores module (at prefix, parent's child) in FP8 as the arguments say; returns whether
        it became a native Linear."""
        why = skip(module, prefix)
        if why is not None:
            report.skipped.append((prefix, why))
            return False
        fuse = fuse_gelu and native_fp8
        if fuse and parent is not None and _diffusers_gelu(module) and skip(module.proj, f"{prefix}.proj") is None:
            put(parent, child, Float8GELUProjection(_native_linear(module.proj, storage_dtype, compute_dtype, scaled,
                                                                   "gelu")), module)
            report.native.append(f"{prefix}.proj")
            report.fused_gelu.append(f"{prefix}.proj")
            return False
        native = _native(module, storage_dtype, compute_dtype, scaled, activation) if native_fp8 and parent is not None else None
        if native is not None:
            put(parent, child, native, module)
            report.native.append(prefix)
            return isinstance(native, Float8InferenceLinear)
        if isinstance(module, CASTABLE_LAYERS):
            report._undo.append(_cast_hooks(module, storage_dtype, compute_dtype, non_blocking))
            report.cast.append(prefix or "(model)")
            return False
        gelu_of = _gelu_after_linear(module) if fuse else {}
        for name, sub in list(module.named_children()):
            path = f"{prefix}.{name}" if prefix else name
            act = gelu_of.get(name)
            if visit(sub, path, module, name, "gelu" if act else "none") and act:
                put(module, act, nn.Identity(), module._modules[act])
                report.fused_gelu.append(path)
        return False

    visit(model, "", None, None)
    memory.give_back()
    if fuse_siblings:
        _group_siblings(model)
    return report
