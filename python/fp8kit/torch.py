"""fp8kit.torch: FP8 inference Linear layers for PyTorch models, on fp8kit's kernels.

torchao's `quantize_(model, Float8DynamicActivationFloat8WeightConfig())` and optimum-quanto's
`qfloat8`, but running FP8 on a CPU: every chosen nn.Linear becomes a Float8Linear whose weight
is quantized once (e4m3, per recipe) and packed once, and whose forward casts the activation to
FP8 inside fp8kit's GEMM (dynamic scaling, never written out) and sums in float32.

    import fp8kit.torch
    fp8kit.torch.quantize_(model)                  # rowwise e4m3, every nn.Linear
    fp8kit.torch.quantize_(model, "tensorwise", filter_fn=lambda m, fqn: "lm_head" not in fqn)
    y = model(x)                                   # float32 / bfloat16 / float16 x, same dtype out

The forward is a registered torch custom op, torch.ops.fp8kit.linear, with a fake (meta)
implementation, so torch.compile and torch.export trace through it. state_dict holds the FP8
weight (torch.float8_e4m3fn) and its scale_inv; loading one repacks on the next call.
Checked by tests/python/test_torch.py.
"""
from typing import Optional

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

import fp8kit

# The recipes of quantize_: stateless ones (delayed scaling keeps an amax history per layer, not
# kept here). Their scalings - of the activation, cast in the GEMM, and of the weight - are the
# library's (fp8kit::Recipe): block is DeepSeek-V3's 1x128 activations, 128x128 weights.
RECIPES = ("rowwise", "tensorwise", "block")


def _packed(weight, weight_scale_inv, weight_scaling):
    """The PackedWeight of a Float8Linear's buffers, packed on first use and again only after
    either buffer is written (load_state_dict, copy_): kept on the weight tensor, keyed by the
    buffers' version counters."""
    key = (weight._version, weight_scale_inv._version, weight_scaling)
    cached = getattr(weight, "_fp8kit_packed", None)
    if cached is None or cached[0] != key:
        q = fp8kit.qtensor(weight, weight_scale_inv, weight_scaling)
        cached = (key, fp8kit.PackedWeight(q))
        weight._fp8kit_packed = cached
    return cached[1]


def _linear(x, weight, weight_scale_inv, bias, input_scaling, weight_scaling):
    """y[M, N] = deq(fp8(x))[M, K] . deq(weight)[N, K]^T (+ bias[N]), x float32 / bfloat16 / float16,
    y in x's dtype: x quantized with input_scaling inside the GEMM, float32 sums."""
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise fp8kit.Error(f"fp8kit.torch: the input is {x.dtype}; Float8Linear takes float32, bfloat16 or float16")
    return fp8kit.gemm(x, _packed(weight, weight_scale_inv, weight_scaling), scaling=input_scaling,
                       out_dtype=str(x.dtype).removeprefix("torch."), bias=bias)


@torch.library.custom_op("fp8kit::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: Optional[torch.Tensor],
           input_scaling: str, weight_scaling: str) -> torch.Tensor:
    """_linear as a torch operator: what torch.compile and torch.export see."""
    return _linear(x, weight, weight_scale_inv, bias, input_scaling, weight_scaling)


def _plain_eager(x):
    """Whether nothing traces or transforms this call (no torch.compile, no export, no dispatch
    mode, no autograd through x): the operator's dispatch, 60-90 us a call from Python, can be
    skipped then - the same function runs either way."""
    return (type(x) is torch.Tensor and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None
            and not (x.requires_grad and torch.is_grad_enabled()))


@linear.register_fake
def _(x, weight, weight_scale_inv, bias, input_scaling, weight_scaling):
    return x.new_empty((x.shape[0], weight.shape[0]))


class Float8Linear(nn.Module):
    """An nn.Linear for inference with an FP8 weight [out, in] (buffer `weight`, torch.float8_*)
    and its scale_inv (buffer `weight_scale_inv`): y = x W^T + b with x cast to FP8 in the GEMM."""

    def __init__(self, in_features, out_features, bias=True, recipe="rowwise", format="e4m3fn"):
        super().__init__()
        if recipe not in RECIPES:
            raise fp8kit.Error(f"fp8kit.torch: recipe '{recipe}', expected one of {', '.join(RECIPES)}")
        self.in_features, self.out_features, self.recipe = in_features, out_features, recipe
        self.input_scaling, self.weight_scaling = fp8kit._fp8kit.recipe_scalings(recipe)
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=getattr(torch, "float8_" + format)))
        self.register_buffer("weight_scale_inv", torch.ones(fp8kit._fp8kit.scale_shape(self.weight_scaling, out_features, in_features)))
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, linear_module, recipe="rowwise", format="e4m3fn"):
        """The FP8 twin of an nn.Linear: its weight quantized with the recipe's weight scaling."""
        m = cls(linear_module.in_features, linear_module.out_features, linear_module.bias is not None, recipe, format)
        q = fp8kit.quantize(linear_module.weight.detach().float(), format, m.weight_scaling)
        m.weight = torch.from_numpy(q.data.copy()).view(getattr(torch, "float8_" + format))
        m.weight_scale_inv = torch.from_numpy(q.scale_inv.copy())
        if linear_module.bias is not None:
            m.bias = nn.Parameter(linear_module.bias.detach().clone(), requires_grad=False)  # inference only
        return m

    def forward(self, x):
        # x [..., in] -> y [..., out]: the GEMM sees [M, in] rows.
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise fp8kit.Error(f"fp8kit.torch.Float8Linear: the input has shape {list(x.shape)}, but in_features "
                               f"{self.in_features}")
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        op = _linear if _plain_eager(rows) else torch.ops.fp8kit.linear
        y = op(rows, self.weight, self.weight_scale_inv, self.bias, self.input_scaling, self.weight_scaling)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.recipe}, format={str(self.weight.dtype).removeprefix('torch.float8_')}")


def quantize_(model, config=None, filter_fn=None):
    """Replaces, in place, every nn.Linear of model that filter_fn(module, fqn) accepts (all when
    None) by a Float8Linear. config: a recipe name - "rowwise" (the default), "tensorwise",
    "block" - as torchao's quantize_(model, config, filter_fn)."""
    recipe = config or "rowwise"
    if recipe not in RECIPES:
        raise fp8kit.Error(f"fp8kit.torch.quantize_: config '{recipe}', expected one of {', '.join(RECIPES)}")
    chosen = [(fqn, m) for fqn, m in model.named_modules()
              if type(m) is nn.Linear and (filter_fn is None or filter_fn(m, fqn))]
    for fqn, m in chosen:
        if not fqn:
            raise fp8kit.Error("fp8kit.torch.quantize_: the model is itself an nn.Linear; quantize_ replaces the "
                               "Linear layers inside a model (wrap it: nn.Sequential(linear))")
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Float8Linear.from_linear(m, recipe))
