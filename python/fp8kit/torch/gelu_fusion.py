"""fp8kit.torch.gelu_fusion: a GELU in the tanh form that only reads an FP8 inference Linear's
output, computed in that Linear's GEMM epilogue (Float8InferenceLinear.activation = "gelu"): on
the float32 sums, rounded once to the output dtype - one pass over the output where torch's GELU
would read it back, and no rounding to the compute dtype in between. Where: Diffusers' GELU
module (FeedForward's "gelu-approximate": Flux, SD3) and an nn.GELU(approximate="tanh") that the
parent's forward calls on the Linear's output alone (Flux's single blocks), read from the forward's
syntax tree; neither held at a second place nor named by other code of the model.

Checked by tests/python/test_layerwise.py (the fused layer against float64, the GELUs that must
stay, Diffusers' FeedForward, the restore).
"""
import ast
import collections
import functools
import inspect
import textwrap

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


def _self_attr(node):
    """name where node is `self.<name>`, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


@functools.cache
def _tree(cls, name=None):
    """The syntax tree of cls's source (of its method `name`), or None where Python has none (a
    compiled or generated class)."""
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, name) if name else cls)))
    except (OSError, TypeError, SyntaxError):
        return None


def _names_read_elsewhere(model):
    """The attribute names that the code of model's module classes (their own and their bases',
    not torch's) reads other than as self.<name> in a forward - a grandparent's
    self.block.fc(x), a helper method's self.fc: a Linear or GELU of such a name may be called from
    there, where a fused one would give the wrong output. None where a class has no source."""
    names = set()
    for cls in {c for m in model.modules() for c in type(m).__mro__}:
        if cls.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        tree = _tree(cls)
        if tree is None:
            return None
        in_forward = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "forward"
                      for n in ast.walk(f)}
        names |= {n.attr for n in ast.walk(tree)  # reads: __init__'s self.fc = ... is none
                  if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
                  and not (id(n) in in_forward and _self_attr(n))}
    return names


def _gelu_after_linear(module, elsewhere):
    """[(Linear child's name, GELU child's name)] for each FP8 inference Linear child of module
    whose output only an nn.GELU(approximate="tanh") child reads: the forward of module's class
    calls self.<gelu>(self.<linear>(...)) - the Linear's call the GELU's one argument - and reads
    neither child anywhere else, and no other code of the model names them (`elsewhere`)
    (Diffusers' Flux single blocks: self.act_mlp(self.proj_mlp(norm_hidden_states))). Neither
    child may have hooks. In the order the forward's source calls them."""
    tree = _tree(type(module), "forward")
    if tree is None or elsewhere is None:
        return []
    uses = collections.Counter(_self_attr(n) for n in ast.walk(tree))
    pairs = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
                and isinstance(node.args[0], ast.Call)):
            continue
        act, lin = _self_attr(node.func), _self_attr(node.args[0].func)
        gelu = module._modules.get(act)
        if (act is not None and lin is not None and type(gelu) is nn.GELU and gelu.approximate == "tanh"
                and not _hooked(gelu) and _fusable(module._modules.get(lin)) and uses[act] == 1 and uses[lin] == 1
                and act not in elsewhere and lin not in elsewhere):
            pairs.append((node.lineno, node.col_offset, lin, act))
    return [(lin, act) for _, _, lin, act in sorted(pairs)]


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

    # A module the model holds at two places may be called from either: never fused.
    places = collections.Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    elsewhere = _names_read_elsewhere(model)
    for prefix, module in list(model.named_modules()):
        path = f"{prefix}." if prefix else ""
        for child, sub in list(module.named_children()):
            if _diffusers_gelu(sub) and places[id(sub)] == places[id(sub.proj)] == 1:
                fuse(sub.proj, f"{path}{child}.proj")
                put(module, child, Float8GELUProjection(sub.proj))
        for lin, act in _gelu_after_linear(module, elsewhere):
            if places[id(module._modules[lin])] == places[id(module._modules[act])] == 1:
                fuse(module._modules[lin], f"{path}{lin}")
                put(module, act, nn.Identity())
    return names, undo
