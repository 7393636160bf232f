"""fp8kit.torch.training: convert_to_float8_training - torchao's API and recipe names - and
Float8Linear, the FP8 training Linear it puts in place of nn.Linear (as fp8kit::nn::Float8Linear
and torchao's Float8Linear): the same Parameters, the three GEMMs of forward and backward (y, dX,
dW) in FP8 through fp8kit under autograd.

Checked by tests/python/test_training.py (each GEMM against float64, against torchao's float8
training on the CPU, under DDP, under torch.compile) and test_fsdp.py (under FSDP2).
"""
import dataclasses
import logging

import torch
from torch import nn
from torch.autograd.function import once_differentiable

import fp8kit
from fp8kit import _quoted

from .fsdp import FP8_ALL_GATHER_RECIPES, Float8GatheredWeight, shard_weight
from .ops import (autocast_input, cast, check_input, check_layer_weights, check_model_args, has_weights, mm, places,
                  qtensor_tensors, warn_transposed_linears)

_log = logging.getLogger(__name__)

# torchao's recipe names, plus block, mxfp8 (the MX spec's shared exponent), mxfp8_rceil (its
# exponent rounded up where a block's largest value would saturate: torchao's RCEIL,
# TransformerEngine's rule) and delayed: the library's recipe (fp8kit::Recipe: formats and
# scalings per operand) and whether grad_weight runs in FP8 (rowwise_with_gw_hp keeps
# dW = dY^T x in the input's precision: torchao's choice for the GEMM with the largest K).
TRAINING_RECIPES = {"tensorwise": ("tensorwise", True), "rowwise": ("rowwise", True),
                    "rowwise_with_gw_hp": ("rowwise", False), "block": ("block", True), "mxfp8": ("mxfp8", True),
                    "mxfp8_rceil": ("mxfp8_rceil", True), "delayed": ("delayed", True)}


class _Casts:
    """How one Float8Linear quantizes its operands (input, weight, grad_output): as its recipe
    says (ops.cast: the operator torch.ops.fp8kit.recipe_quantize), or for delayed with one DelayedScaling
    per operand whose history rolls at each use - the scale of a cast comes from the amaxes of the
    casts before it (TransformerEngine's delayed scaling, one step per forward and backward).
    A cast is [codes, scale_inv] (+ [codes_t, scale_inv_t], the cast of t^T) as torch tensors;
    scaling[role] is its scaling."""

    ROLES = ("input", "weight", "grad_output")

    def __init__(self, recipe):
        self.recipe = recipe
        self.scaling = {role: fp8kit._fp8kit.recipe_scaling(recipe, role) for role in self.ROLES}
        self.delayed = {role: fp8kit._fp8kit.DelayedScaling(role) for role in self.ROLES} if recipe == "delayed" else None

    def state(self):
        """The delayed states as tensors (copies): {role: {amax_history, scale, fresh}}."""
        return {role: {"amax_history": torch.from_numpy(d.amax_history.copy()),
                       "scale": torch.from_numpy(d.scale.copy()), "fresh": d.fresh} for role, d in self.delayed.items()}

    def restore(self, state, where="_extra_state"):
        """The delayed states of state() back, each role checked - a dict of the three roles, each
        {amax_history: float tensor of the history's length, amaxes >= 0 (NaN: one recorded from a
        NaN input, kept as a run keeps it), scale: one finite positive value, fresh: a bool} - before
        any is taken: a refused state leaves every role as it was, the error naming the entry
        (`where`, the state_dict key)."""
        if not isinstance(state, dict) or set(state) != set(self.ROLES):
            got = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise fp8kit.Error(f"fp8kit.torch.Float8Linear: {where} holds {_quoted(got)}, expected a dict of the roles "
                               f"{list(self.ROLES)} (the delayed recipe's state)")
        restored = {}
        for role in self.ROLES:
            s, entry = state[role], f"{where}[{role!r}]"
            if not isinstance(s, dict) or not all(isinstance(s.get(k), torch.Tensor) for k in ("amax_history", "scale")) \
                    or not isinstance(s.get("fresh"), bool):
                got = sorted(map(str, s)) if isinstance(s, dict) else type(s).__name__
                raise fp8kit.Error(f"fp8kit.torch.Float8Linear: {entry} holds {_quoted(got)}, expected amax_history and "
                                   "scale tensors and fresh a bool")
            history, scale = s["amax_history"], s["scale"]
            if not history.dtype.is_floating_point or not scale.dtype.is_floating_point or scale.numel() != 1:
                raise fp8kit.Error(f"fp8kit.torch.Float8Linear: {entry} has amax_history {history.dtype} "
                                   f"{list(history.shape)} and scale {scale.dtype} {list(scale.shape)}, expected float "
                                   "tensors, the scale one value")
            d = restored[role] = fp8kit._fp8kit.DelayedScaling(role)
            try:
                d.restore(fp8kit._to_extension(history.detach().cpu().float().contiguous()),
                          fp8kit._to_extension(scale.detach().cpu().float().reshape(1)), s["fresh"])
            except fp8kit.Error as e:
                raise fp8kit.Error(f"fp8kit.torch.Float8Linear: {entry}: {e}") from None
        self.delayed = restored

    # copy.deepcopy and pickle (torch.save of a module): the extension's DelayedScaling objects as
    # their state.
    def __getstate__(self):
        return {"recipe": self.recipe, "delayed": self.state() if self.delayed is not None else None}

    def __setstate__(self, state):
        self.__init__(state["recipe"])
        if state["delayed"] is not None:
            self.restore(state["delayed"])

    def __call__(self, t, role, transpose):
        if self.delayed is None:
            return cast(t, self.recipe, role, transpose)
        if t.is_cuda:
            raise fp8kit.Error("fp8kit.torch: the delayed recipe keeps its amax history on the host; on a CUDA "
                               "device use tensorwise, rowwise or block")
        d = self.delayed[role]
        if d.fresh:
            # A fresh state has scale 1: gradients of ~1e-5 would flush to zero in e5m2. As torchao
            # and fp8kit::nn::Float8Linear do, the first use records this tensor's amax first.
            d.quantize(fp8kit._to_extension(t))
        d.step()
        return qtensor_tensors(d.quantize(fp8kit._to_extension(t), transpose), transpose)


class _Float8LinearFunction(torch.autograd.Function):
    """y[M, N] = x[M, K] W[N, K]^T + b with the GEMMs in FP8, as fp8kit::nn::Float8Linear
    (src/nn/float8_linear.cpp) and torchao's Float8Linear:
        output       y [M, N] = q(x) . q(W)^T
        grad_input   dX[M, K] = q(dY) . q(W^T)^T
        grad_weight  dW[N, K] = q(dY^T) . q(x^T)^T   (or dY^T x in x's precision: fp8_grad_weight False)
    The transposed operands are quantize's transposed copies (exactly quantize(t^T)), so row and
    block scales run along each GEMM's K; forward keeps only them (one byte per element) for
    backward. Casts and GEMMs are the operators of ops.py, on torch tensors only, so torch.compile
    traces forward and backward (AOTAutograd) without a graph break."""

    @staticmethod
    def forward(ctx, x, weight, bias, casts, fp8_grad_weight, grad_enabled):
        ctx.weight_dtype, ctx.has_bias = weight.dtype, bias is not None
        ctx.empty = x.shape[0] == 0
        if ctx.empty:
            # No rows: nothing to cast (a cast has no amax of nothing). y [0, N]; backward gives
            # dX [0, K] and zero dW, db, as nn.Linear's.
            ctx.shapes = (x.shape, weight.shape)
            return x.new_zeros(0, weight.shape[0])
        # What backward will need (nothing under torch.no_grad): the transposed casts it reads.
        need_dx, need_dw = grad_enabled and x.requires_grad, grad_enabled and weight.requires_grad
        keep_x8 = fp8_grad_weight and need_dw
        qx = casts(x, "input", keep_x8)
        # Under FSDP2 with FP8 all-gather the weight arrives cast (fsdp.py): taken as it is. W^T's
        # own cast (rowwise, mxfp8), which FSDP2's re-gather brings for the backward, backward
        # reads there (ctx.gathered: the parameter, which the re-gather refills) - the same choice
        # in a forward recomputed under activation checkpointing, which must save what it saved.
        gathered = type(weight) is Float8GatheredWeight
        ctx.gathered = weight if gathered and need_dx and weight.transposed_in_backward() else None
        need_w_t = need_dx and ctx.gathered is None
        qw = weight.weight_casts(need_w_t) if gathered else casts(weight, "weight", need_dx)
        y = mm(qx[0], qx[1], casts.scaling["input"], qw[0], qw[1], casts.scaling["weight"], bias, x.dtype)
        ctx.casts = casts
        x_t = qx[2:] if keep_x8 else [None, None]
        w_t = qw[2:] if need_w_t else [None, None]
        ctx.save_for_backward(*x_t, *w_t, x if need_dw and not fp8_grad_weight else None)
        return y

    @staticmethod
    @once_differentiable  # FP8 GEMMs have no derivative graph: a double backward is refused, not given none
    def backward(ctx, dy):
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        if ctx.empty:
            x_shape, w_shape = ctx.shapes
            return (dy.new_zeros(x_shape) if need_dx else None,
                    dy.new_zeros(w_shape, dtype=ctx.weight_dtype) if need_dw else None,
                    dy.new_zeros(w_shape[0], dtype=ctx.weight_dtype) if need_db and ctx.has_bias else None,
                    None, None, None)
        dy = dy.contiguous()  # autograd may hand a broadcast (stride 0) gradient
        x_t, x_t_scale_inv, w_t, w_t_scale_inv, x = ctx.saved_tensors
        if ctx.gathered is not None:
            w_t, w_t_scale_inv = ctx.gathered.transposed_cast()
        casts, scaling = ctx.casts, ctx.casts.scaling
        fp8_dw = need_dw and x_t is not None
        qdy = casts(dy, "grad_output", fp8_dw) if need_dx or fp8_dw else None
        dx = mm(qdy[0], qdy[1], scaling["grad_output"], w_t, w_t_scale_inv, scaling["weight"], None,
                dy.dtype) if need_dx else None
        if not need_dw:
            dw = None
        elif fp8_dw:
            dw = mm(qdy[2], qdy[3], scaling["grad_output"], x_t, x_t_scale_inv, scaling["input"], None,
                    ctx.weight_dtype)
        else:  # rowwise_with_gw_hp: dY^T x in the input's precision
            dw = (dy.t() @ x).to(ctx.weight_dtype)
        db = dy.sum(0) if need_db and ctx.has_bias else None
        return dx, dw, db, None, None, None


@torch.compiler.disable
def _delayed_runs_eagerly_only(compiling):
    """Refuses torch.compile of the delayed recipe: its amax histories are host objects (the
    extension's DelayedScaling) that each cast changes. Dynamo does not trace this function but
    calls it as it is, with is_compiling() as it saw it (True) - a raise in traced code would only
    send the frame back to eager - and fullgraph=True refuses the call by this function's name."""
    if compiling:
        raise fp8kit.Error("fp8kit.torch.Float8Linear: the delayed recipe keeps its amax history in host objects "
                           "that each cast changes, which torch.compile does not trace: compile tensorwise, "
                           "rowwise or block, or run delayed without torch.compile")


class Float8Linear(nn.Linear):
    """An nn.Linear (same weight and bias Parameters, same state_dict) whose forward and backward
    run their GEMMs in FP8 through fp8kit with a training recipe (TRAINING_RECIPES)."""

    def __init__(self, in_features, out_features, bias=True, config="tensorwise", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if not isinstance(config, str) or config not in TRAINING_RECIPES:
            raise fp8kit.Error(f"fp8kit.torch: training recipe {_quoted(config)}, expected one of "
                               f"{', '.join(TRAINING_RECIPES)}")
        self.config = config
        recipe, self.fp8_grad_weight = TRAINING_RECIPES[config]
        self._casts = _Casts(recipe)
        if config == "delayed":
            # Its amax histories are state to save and load with the weights (extra state): the
            # subclass that has it, so that every other recipe's state_dict stays nn.Linear's.
            self.__class__ = _DelayedFloat8Linear

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
        if x.device != self.weight.device:
            raise fp8kit.Error(f"fp8kit.torch.Float8Linear({self.in_features}, {self.out_features}): the input is on "
                               f"device '{x.device}', the weight on device '{self.weight.device}'"
                               + (": a model converted on meta is materialized (to_empty, then its initialization) "
                                  "before it runs" if self.weight.is_meta else ""))
        fp8kit._check_device(x)
        x = autocast_input(x)
        if self._casts.delayed is not None:
            _delayed_runs_eagerly_only(torch.compiler.is_compiling())
        if torch.compiler.is_compiling() and type(self.weight) is Float8GatheredWeight:
            # Its backward reads only what the compiled forward kept: FSDP2's forward gathers bring
            # W^T's cast too from now on (fsdp.py).
            self._fp8kit_compiled = True
        rows = x.reshape(-1, self.in_features)
        y = _Float8LinearFunction.apply(rows, self.weight, self.bias, self._casts, self.fp8_grad_weight,
                                        torch.is_grad_enabled())
        # y in x's shape, not a view of y (FSDP2 warns of a module that returns a view): y is this
        # call's own tensor, which nothing else sees, as aten's linear folds its batch dimensions.
        return y if x.dim() == 2 else torch.ops.aten._unsafe_view(y, (*x.shape[:-1], self.out_features))

    def extra_repr(self):
        return super().extra_repr() + f", config={self.config}"


class _DelayedFloat8Linear(Float8Linear):
    """Float8Linear with the delayed recipe: its state_dict holds, beside weight and bias, the
    amax history and scale of each operand's delayed scaling (`_extra_state`), so a run saved and
    loaded again continues with the scales it would have had."""

    def get_extra_state(self):
        return self._casts.state()

    def _get_name(self):  # printed as the layer it is
        return "Float8Linear"

    def set_extra_state(self, state):
        self._casts.restore(state)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # The delayed state checked before torch copies the weight and bias: a refused one leaves
        # the layer as it was.
        key = prefix + "_extra_state"
        if key in state_dict:
            _Casts(self._casts.recipe).restore(state_dict[key], repr(key))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def _fp8_operands(linear):
    """Whether a Linear's in and out features are multiples of 16, the FP8 GEMM's operand rule (as
    torchao's), and not 0 (no weight to cast)."""
    return has_weights(linear) and linear.in_features % 16 == 0 and linear.out_features % 16 == 0


def convert_to_float8_training(module, *, module_filter_fn=None, config=None, enable_fsdp_float8_all_gather=False):
    """torchao's convert_to_float8_training on fp8kit's kernels: every nn.Linear of module that
    module_filter_fn(mod, fqn) accepts (all when None) and whose in and out features are multiples
    of 16 and not 0 (the FP8 GEMM's operand rule, as torchao's) becomes a Float8Linear sharing its
    Parameters. config: a recipe name of TRAINING_RECIPES (default "tensorwise", as torchao's), or
    torchao's Float8LinearConfig as its from_recipe_name makes it for tensorwise, rowwise or
    rowwise_with_gw_hp (compared field by field with torchao's own; any other config is refused),
    with or without its enable_fsdp_float8_all_gather.
    enable_fsdp_float8_all_gather (or that field of the config): under FSDP2 each layer's weight
    is cast to FP8 before it is all-gathered (fsdp.py: tensorwise, rowwise, rowwise_with_gw_hp,
    block) - but for a weight tied to another module (an lm_head tied to the embedding), which
    all-gathers in high precision and stays the one parameter (logged at INFO).
    Every chosen layer's weight is checked before the first is converted (ops.check_layer_weights:
    float32 / bfloat16 / float16 Parameters on the CPU, a CUDA device or meta): a bad one is an
    fp8kit.Error naming it, and the module is left as it was.
    Returns module (converted in place; an nn.Linear itself is returned converted)."""
    check_model_args("fp8kit.torch.convert_to_float8_training", module, module_filter_fn, "module_filter_fn")
    warn_transposed_linears("fp8kit.torch.convert_to_float8_training", module)
    config = "tensorwise" if config is None else config  # "", 0 or False are refused, not taken as the default
    if type(config).__name__ == "Float8LinearConfig":
        enable_fsdp_float8_all_gather = enable_fsdp_float8_all_gather or config.enable_fsdp_float8_all_gather
        plain = dataclasses.replace(config, enable_fsdp_float8_all_gather=False)
        named = type(config).from_recipe_name
        config = next((n for n in ("tensorwise", "rowwise", "rowwise_with_gw_hp") if named(n) == plain), config)
    if not isinstance(config, str) or config not in TRAINING_RECIPES:
        raise fp8kit.Error(f"fp8kit.torch.convert_to_float8_training: config {config!r}, expected one of "
                           f"{', '.join(TRAINING_RECIPES)}")

    def eligible(m, fqn):  # the filter sees every nn.Linear (auto_filter reports each one it refuses)
        return (type(m) is nn.Linear and (module_filter_fn is None or module_filter_fn(m, fqn))
                and _fp8_operands(m))

    # Parameters more than one module holds (an lm_head tied to the embedding): FP8 all-gather
    # gives a layer's weight a parameter of its own, which would untie them.
    holders = {}
    for owner, sub in module.named_modules(remove_duplicate=False):
        for name, p in sub.named_parameters(recurse=False, remove_duplicate=False):
            holders.setdefault(id(p), []).append(f"{owner}.{name}" if owner else name)

    def convert(m, fqn):
        layer = Float8Linear.from_linear(m, config)
        tied = [n for n in holders.get(id(m.weight), []) if n != (f"{fqn}.weight" if fqn else "weight")]
        if enable_fsdp_float8_all_gather and tied:
            _log.info("fp8kit.torch: layer '%s' all-gathers its weight in high precision: it is tied to %s, which "
                      "an FP8 all-gather would untie", fqn, ", ".join(tied))
        elif enable_fsdp_float8_all_gather:
            shard_weight(layer, fqn)
        return layer

    chosen = [(fqn, m) for fqn, m in module.named_modules() if eligible(m, fqn)]
    check_layer_weights("fp8kit.torch.convert_to_float8_training", chosen, on_meta=True)
    # Before any layer is replaced (a tied first layer never reaches shard_weight).
    if enable_fsdp_float8_all_gather and chosen and TRAINING_RECIPES[config][0] not in FP8_ALL_GATHER_RECIPES:
        raise fp8kit.Error(f"fp8kit.torch.convert_to_float8_training: layer '{chosen[0][0]}': "
                           f"enable_fsdp_float8_all_gather with recipe '{config}': its amax history is each rank's own; "
                           f"FP8 all-gather takes tensorwise, rowwise, rowwise_with_gw_hp, block, mxfp8 and mxfp8_rceil")
    if chosen and not chosen[0][0]:  # module is itself the Linear
        return convert(module, "")
    at = places(module)
    for fqn, m in chosen:
        layer = convert(m, fqn)
        for place in at[id(m)]:  # a Linear held at two places stays one module there
            module.set_submodule(place, layer)
    return module


def auto_filter(filter_fqns=(), min_features=4096):
    """A module_filter_fn for convert_to_float8_training (torchao's _auto_filter_for_recipe, on
    fp8kit's own measurements) that leaves in high precision the nn.Linear layers an FP8 training
    step does not speed up, and says why: a layer whose fully qualified name contains an entry of
    filter_fqns (an output head, say), whose in or out features are not multiples of 16 (the FP8
    GEMM's operand rule), or whose in or out features are below min_features. The default 4096
    comes from the eager training step of 4 Linear layers over 8192 tokens on an H200
    (docs/PERF.md): 0.31-0.48x torch's bf16 step at width 2048, where fp8kit's host work per layer
    (casts, GEMM calls, autograd) outlasts the GPU's, 1.09-1.23x at 4096, 1.33-1.53x at 8192-16384.
    The filter's `skipped` maps each refused layer's name to the reason, also logged at INFO."""
    if (isinstance(filter_fqns, str) or not isinstance(filter_fqns, (list, tuple, set, frozenset))
            or not all(isinstance(f, str) for f in filter_fqns)):
        raise fp8kit.Error(f"fp8kit.torch.auto_filter: filter_fqns is {filter_fqns!r}, expected a list of names")
    if isinstance(min_features, bool) or not isinstance(min_features, int) or min_features < 16:
        raise fp8kit.Error(f"fp8kit.torch.auto_filter: min_features is {min_features!r}, expected an integer >= 16")
    fqns = list(filter_fqns)

    def keep_fp8(mod, fqn):
        if not isinstance(mod, nn.Linear):
            return False
        n, k = mod.out_features, mod.in_features
        match = next((f for f in fqns if f in fqn), None)
        if match is not None:
            why = f"its name contains '{match}' (filter_fqns)"
        elif not has_weights(mod):
            why = f"in_features {k} / out_features {n}: no weight to cast"
        elif not _fp8_operands(mod):
            why = f"in_features {k} / out_features {n} are not multiples of 16 (the FP8 GEMM's operand rule)"
        elif min(n, k) < min_features:
            why = (f"in_features {k} / out_features {n}: below min_features {min_features}, where an eager FP8 "
                   "training step measured slower than bf16 (docs/PERF.md)")
        else:
            return True
        keep_fp8.skipped[fqn] = why
        _log.info("fp8kit.torch.auto_filter: %s stays in %s: %s", fqn, mod.weight.dtype, why)
        return False

    keep_fp8.skipped = {}
    return keep_fp8
