"""fp8kit.torch.training: convert_to_float8_training - torchao's API and recipe names - and
Float8Linear, the FP8 training Linear it puts in place of nn.Linear (as fp8kit::nn::Float8Linear
and torchao's Float8Linear): the same Parameters, the three GEMMs of forward and backward (y, dX,
dW) in FP8 through fp8kit under autograd.

Checked by tests/python/test_training.py (each GEMM against float64, against torchao's float8
training on the CPU, under DDP).
"""
import torch
from torch import nn

import fp8kit

from .ops import _OUT_DTYPES, check_input

# torchao's recipe names, plus block, mxfp8 and delayed: the library's recipe (fp8kit::Recipe:
# formats and scalings per operand) and whether grad_weight runs in FP8 (rowwise_with_gw_hp keeps
# dW = dY^T x in the input's precision: torchao's choice for the GEMM with the largest K).
TRAINING_RECIPES = {"tensorwise": ("tensorwise", True), "rowwise": ("rowwise", True),
                    "rowwise_with_gw_hp": ("rowwise", False), "block": ("block", True), "mxfp8": ("mxfp8", True),
                    "delayed": ("delayed", True)}


class _Casts:
    """How one Float8Linear quantizes its operands (input, weight, grad_output): as its
    recipe says, or for delayed with one DelayedScaling per operand whose history rolls at each
    use - the scale of a cast comes from the amaxes of the casts before it (TransformerEngine's
    delayed scaling, one step per forward and backward)."""

    def __init__(self, recipe):
        self.recipe = recipe
        self.delayed = ({role: fp8kit._fp8kit.DelayedScaling(role) for role in ("input", "weight", "grad_output")}
                        if recipe == "delayed" else None)

    def __call__(self, t, role, transpose):
        if self.delayed is None:
            return fp8kit._recipe_quantize(t, self.recipe, role, transpose)
        if t.is_cuda:
            raise fp8kit.Error("fp8kit.torch: the delayed recipe keeps its amax history on the host; on a CUDA "
                               "device use tensorwise, rowwise or block")
        d = self.delayed[role]
        if d.fresh:
            # A fresh state has scale 1: gradients of ~1e-5 would flush to zero in e5m2. As torchao
            # and fp8kit::nn::Float8Linear do, the first use records this tensor's amax first.
            d.quantize(fp8kit._to_extension(t))
        d.step()
        return d.quantize(fp8kit._to_extension(t), transpose)


def _gemm(a, b, out_dtype, bias=None):
    """D = deq(a) . deq(b)^T (+ bias) of two QTensors, as a torch tensor of out_dtype."""
    name = _OUT_DTYPES[out_dtype][0]
    bias = None if bias is None else fp8kit._to_extension(bias)
    call = lambda out: fp8kit._fp8kit.gemm(a, b, name, 1.0, 0.0, None, bias, "none", out)  # noqa: E731
    if a.device == "cuda":  # D from torch's allocator, on its current stream
        return fp8kit._device_gemm(call, a.shape[0], b.shape[0], name, None)
    return fp8kit._out(call(None), name, True)


class _Float8LinearFunction(torch.autograd.Function):
    """y[M, N] = x[M, K] W[N, K]^T + b with the GEMMs in FP8, as fp8kit::nn::Float8Linear
    (src/nn/float8_linear.cpp) and torchao's Float8Linear:
        output       y [M, N] = q(x) . q(W)^T
        grad_input   dX[M, K] = q(dY) . q(W^T)^T
        grad_weight  dW[N, K] = q(dY^T) . q(x^T)^T   (or dY^T x in x's precision: fp8_grad_weight False)
    The transposed operands are quantize's transposed copies (exactly quantize(t^T)), so row and
    block scales run along each GEMM's K; forward keeps only them (one byte per element) for
    backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, casts, fp8_grad_weight, grad_enabled):
        # What backward will need (nothing under torch.no_grad): the transposed casts it reads.
        need_dx, need_dw = grad_enabled and x.requires_grad, grad_enabled and weight.requires_grad
        keep_x8 = fp8_grad_weight and need_dw
        qx = casts(x, "input", keep_x8)
        qw = casts(weight, "weight", need_dx)
        y = _gemm(qx, qw, x.dtype, bias)
        ctx.casts, ctx.weight_dtype, ctx.has_bias = casts, weight.dtype, bias is not None
        ctx.qw_t = qw.transposed() if need_dx else None
        ctx.qx_t = qx.transposed() if keep_x8 else None
        ctx.save_for_backward(x if need_dw and not fp8_grad_weight else None)
        return y

    @staticmethod
    def backward(ctx, dy):
        dy = dy.contiguous()  # autograd may hand a broadcast (stride 0) gradient
        x, = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        fp8_dw = need_dw and ctx.qx_t is not None
        qdy = ctx.casts(dy, "grad_output", fp8_dw) if need_dx or fp8_dw else None
        dx = _gemm(qdy, ctx.qw_t, dy.dtype) if need_dx else None
        if not need_dw:
            dw = None
        elif fp8_dw:
            dw = _gemm(qdy.transposed(), ctx.qx_t, ctx.weight_dtype)
        else:  # rowwise_with_gw_hp: dY^T x in the input's precision
            dw = (dy.t() @ x).to(ctx.weight_dtype)
        db = dy.sum(0) if need_db and ctx.has_bias else None
        ctx.qx_t = ctx.qw_t = None  # the FP8 casts go now, not when the graph does
        return dx, dw, db, None, None, None


class Float8Linear(nn.Linear):
    """An nn.Linear (same weight and bias Parameters, same state_dict) whose forward and backward
    run their GEMMs in FP8 through fp8kit with a training recipe (TRAINING_RECIPES)."""

    def __init__(self, in_features, out_features, bias=True, config="tensorwise", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if config not in TRAINING_RECIPES:
            raise fp8kit.Error(f"fp8kit.torch: training recipe '{config}', expected one of {', '.join(TRAINING_RECIPES)}")
        self.config = config
        recipe, self.fp8_grad_weight = TRAINING_RECIPES[config]
        self._casts = _Casts(recipe)

    @classmethod
    def from_linear(cls, linear_module, config="tensorwise"):
        """The FP8 training twin of an nn.Linear, sharing its Parameters."""
        with torch.device("meta"):
            m = cls(linear_module.in_features, linear_module.out_features, False, config)
        m.weight, m.bias = linear_module.weight, linear_module.bias
        return m

    def forward(self, x):
        # x [..., in] -> y [..., out]: the GEMMs see [M, in] rows.
        check_input(x, self.in_features, "Float8Linear")
        rows = x.reshape(-1, self.in_features)
        y = _Float8LinearFunction.apply(rows, self.weight, self.bias, self._casts, self.fp8_grad_weight,
                                        torch.is_grad_enabled())
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self):
        return super().extra_repr() + f", config={self.config}"


def convert_to_float8_training(module, *, module_filter_fn=None, config=None):
    """torchao's convert_to_float8_training on fp8kit's kernels: every nn.Linear of module that
    module_filter_fn(mod, fqn) accepts (all when None) and whose in and out features are multiples
    of 16 (the FP8 GEMM's operand rule, as torchao's) becomes a Float8Linear sharing its
    Parameters. config: a recipe name of TRAINING_RECIPES (default "tensorwise", as torchao's), or
    torchao's Float8LinearConfig as its from_recipe_name makes it for tensorwise, rowwise or
    rowwise_with_gw_hp (compared field by field with torchao's own; any other config is refused).
    Returns module (converted in place; an nn.Linear itself is returned converted)."""
    config = config or "tensorwise"
    if type(config).__name__ == "Float8LinearConfig":
        named = type(config).from_recipe_name
        config = next((n for n in ("tensorwise", "rowwise", "rowwise_with_gw_hp") if named(n) == config), config)
    if not isinstance(config, str) or config not in TRAINING_RECIPES:
        raise fp8kit.Error(f"fp8kit.torch.convert_to_float8_training: config {config!r}, expected one of "
                           f"{', '.join(TRAINING_RECIPES)}")

    def eligible(m, fqn):
        return (type(m) is nn.Linear and m.in_features % 16 == 0 and m.out_features % 16 == 0
                and (module_filter_fn is None or module_filter_fn(m, fqn)))

    if eligible(module, ""):
        return Float8Linear.from_linear(module, config)
    for fqn, m in [(fqn, m) for fqn, m in module.named_modules() if fqn and eligible(m, fqn)]:
        module.set_submodule(fqn, Float8Linear.from_linear(m, config))
    return module
