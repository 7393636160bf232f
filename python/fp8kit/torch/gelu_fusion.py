"""fp8kit.torch.gelu_fusion: a GELU in the tanh form that only reads an FP8 inference Linear's
output, computed in that Linear's GEMM epilogue (Float8InferenceLinear.activation = "gelu"): on
the float32 sums, rounded once to the output dtype - one pass over the output where torch's GELU
would read it back, and no rounding to the compute dtype in between. Where: Diffusers' GELU
module (FeedForward's "gelu-approximate": Flux, SD3) and an nn.GELU(approximate="tanh") that the
parent's forward calls on the Linear's output alone (Flux's single blocks).

Checked by tests/python/test_layerwise.py (the fused layer against float64, the GELUs that must
stay, Diffusers' FeedForward, the restore).
"""
import functools
import inspect
import re

from torch import nn

from .inference import Float8InferenceLinear


class Float8GELUProjection(nn.Module):
    """Diffusers' GELU module (diffusers.models.activations.GELU: its Linear `proj`, then GELU) in
    its tanh form, with proj a Float8InferenceLinear whose GEMM applies the GELU: forward is
    proj(x). Its child keeps the name proj, so the module's state_dict keys are the original's."""

    def __init__(self, proj):
        super().__init__()
        self.proj = proj

    def forward(self, x):  # x [..., in] -> gelu(x W^T + b) [..., out]
        return self.proj(x)


def _hooked(module):
    """Whether module has forward hooks of its own (a fused layer would skip what they see)."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _fusable(linear):
    """Whether linear is an FP8 inference Linear with no activation yet and no hooks."""
    return type(linear) is Float8InferenceLinear and linear.activation == "none" and not _hooked(linear)


def _diffusers_gelu(module):
    """Whether module is Diffusers' GELU module (its own class, not a subclass) in the tanh form,
    over an FP8 inference Linear, without hooks: its forward is proj, then F.gelu(approximate="tanh")."""
    cls = type(module)
    return (cls.__name__ == "GELU" and cls.__module__ == "diffusers.models.activations"
            and getattr(module, "approximate", None) == "tanh" and _fusable(module._modules.get("proj"))
            and not _hooked(module))


@functools.cache
def _forward_source(cls):
    """The source of cls.forward, or "" where Python has none (a compiled or generated class)."""
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return ""


def _gelu_after_linear(module):
    """[(Linear child's name, GELU child's name)] for each FP8 inference Linear child of module
    whose output only an nn.GELU(approximate="tanh") child reads: the forward of module's class
    calls self.<gelu>(self.<linear>(...)) and names neither child anywhere else (Diffusers' Flux
    single blocks: self.act_mlp(self.proj_mlp(norm_hidden_states))). Neither child may have hooks."""
    source = _forward_source(type(module))
    pairs = []
    # Overlapping matches (a lookahead): in self.fc2(self.act(self.fc1(x))) the pair (act, fc1)
    # starts inside (fc2, act).
    for act, lin in re.findall(r"(?=self\.(\w+)\(self\.(\w+)\()", source):
        gelu = module._modules.get(act)
        if (type(gelu) is nn.GELU and gelu.approximate == "tanh" and not _hooked(gelu)
                and _fusable(module._modules.get(lin))
                and len(re.findall(rf"self\.{act}\b", source)) == 1 and len(re.findall(rf"self\.{lin}\b", source)) == 1):
            pairs.append((lin, act))
    return pairs


def fuse_gelu(model):
    """Puts each GELU (tanh form) below model that only reads an FP8 inference Linear's output into
    that Linear's GEMM: Diffusers' GELU module becomes a Float8GELUProjection over its proj, an
    nn.GELU after a Linear (_gelu_after_linear) an nn.Identity. Returns the fused Linear layers'
    qualified names and what undoes it (one callable a change, in the order they were made)."""
    names, undo = [], []

    def fuse(linear, name):
        linear.activation = "gelu"  # the same packed weight, another epilogue (ops._fused)
        undo.append(functools.partial(setattr, linear, "activation", "none"))
        names.append(name)

    def put(parent, child, new):
        undo.append(functools.partial(setattr, parent, child, parent._modules[child]))
        setattr(parent, child, new)

    for prefix, module in list(model.named_modules()):
        path = f"{prefix}." if prefix else ""
        for child, sub in list(module.named_children()):
            if _diffusers_gelu(sub):
                fuse(sub.proj, f"{path}{child}.proj")
                put(module, child, Float8GELUProjection(sub.proj))
        for lin, act in _gelu_after_linear(module):
            fuse(module._modules[lin], f"{path}{lin}")
            put(module, act, nn.Identity())
    return names, undo
