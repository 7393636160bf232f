"""fp8kit.torch: FP8 Linear layers for PyTorch models - inference, training, layerwise casting - on fp8kit's kernels.

torchao's `quantize_(model, Float8DynamicActivationFloat8WeightConfig())` and optimum-quanto's
`qfloat8`, but running FP8 on a CPU: every chosen nn.Linear becomes a Float8Linear whose weight
is quantized once (e4m3, per recipe) and packed once, and whose forward casts the activation to
FP8 inside fp8kit's GEMM (dynamic scaling, never written out) and sums in float32. Layers that
the model calls in a row on one input (q, k, v; gate, up) then run as one GEMM at decode's few
rows (_Siblings), each output bit for bit its own.

    import fp8kit.torch
    fp8kit.torch.quantize_(model)                  # rowwise e4m3, every nn.Linear
    fp8kit.torch.quantize_(model, "tensorwise", filter_fn=lambda m, fqn: "lm_head" not in fqn)
    fp8kit.torch.quantize_(model, "weight_only")   # torchao's Float8WeightOnlyConfig: x not quantized
    fp8kit.torch.quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))  # torchao's
    y = model(x)                                   # float32 / bfloat16 / float16 x, same dtype out

Training: convert_to_float8_training(model, module_filter_fn=None, config="tensorwise") with
torchao's signature and recipe names (tensorwise, rowwise, rowwise_with_gw_hp, plus block, mxfp8,
delayed) makes nn.Linear layers Float8TrainingLinear: the same Parameters, with the three GEMMs
of forward and backward (y, dX, dW) in FP8 through fp8kit under autograd (and DDP).

Layerwise casting: enable_layerwise_casting(model, storage_dtype, compute_dtype, ...) with Diffusers'
signature and default skip patterns stores weights in FP8; Linear layers then compute on the FP8
weight directly (no upcast copy) and embeddings decode only the rows they read; convolutions are
upcast per forward as Diffusers does.

advise(model, example_inputs, path): per Linear, FP8 or not and which recipe, from paired timings
on this machine and SQNR; writes the policy file the C++ side reads.

The inference forward is a registered torch custom op, torch.ops.fp8kit.linear, with a fake (meta)
implementation, so torch.compile and torch.export trace through it. state_dict holds the FP8
weight (torch.float8_e4m3fn) and its scale_inv; loading one repacks on the next call.
Checked by tests/python/test_torch.py, test_training.py, test_layerwise.py and test_advise.py.
"""
import copy
import math
import re
import statistics
import time
import weakref
from typing import Optional

import torch
from torch import nn

import fp8kit

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
    """(input scaling, weight scaling) of a Float8Linear's recipe."""
    if recipe in _WEIGHT_ONLY:
        return "none", _WEIGHT_ONLY[recipe]
    return tuple(fp8kit._fp8kit.recipe_scalings(recipe))


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
    """The FusedLinear of a Float8Linear, made on first use and again only after a buffer or the
    bias is written (load_state_dict, copy_) or replaced: kept on the weight tensor, keyed by the
    version counters, and holding the scale and bias it read - a tensor assigned in their place has
    a counter of its own, so they are compared by identity. Returns (the FusedLinear, out_features)."""
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
        raise fp8kit.Error(f"fp8kit.torch: the input is {x.dtype}; Float8Linear takes float32, bfloat16 or float16")
    fused, n = _fused(weight, weight_scale_inv, weight_scaling, bias, input_scaling)
    if x.is_cpu and x.is_contiguous():
        return _call_into(fused, n, x, x.shape, out[1])
    # Strided x, or a tensor on another device: _to_extension copies what a stride forces, or
    # names the device it cannot read.
    shape = x.shape
    rows = x.reshape(-1, shape[-1]) if len(shape) != 2 else x
    y = fp8kit._out(fused(fp8kit._to_extension(rows), out[1]), out[0], True)
    return y if len(shape) == 2 else y.reshape(*shape[:-1], y.shape[-1])


# ---- siblings: the Linear layers a model calls one after another on the same input ----

def _state(m):
    """What a Float8Linear's packed weight is made of - its weight, weight_scale_inv and bias - and
    their version counters (an in-place write, load_state_dict, bumps one), as one flat tuple."""
    bias = m._parameters["bias"]
    buffers = m._buffers
    w, s = buffers["weight"], buffers["weight_scale_inv"]
    return w, s, bias, w._version, s._version, None if bias is None else bias._version


def _same_state(a, b):
    """Whether two _state tuples hold the same tensors (by identity: == on tensors is elementwise)
    at the same versions. Spelled out: 0.10 us a call where a generator over the pairs took 0.39
    (a decode step of the bench's Llama checks ~130 states)."""
    return a[0] is b[0] and a[1] is b[1] and a[2] is b[2] and a[3] == b[3] and a[4] == b[4] and a[5] == b[5]


class _Siblings:
    """Float8Linear children of one module with the same in_features, recipe, weight dtype and bias
    or none (quantize_ and enable_layerwise_casting group them), run as the model runs them: the
    layers it calls in a row on one tensor - attention's q, k and v projections, an MLP's gate and
    up - are seen doing so (a "run": the same tensor object at the same version counter), and from
    then on, where a call is memory-bound (at most MAX_ROWS rows), the run's first layer computes
    all of their outputs in one GEMM over the run's weights stacked [sum of N, K], and each later
    layer of the run, called on that tensor, gets its part. What a decode step gains: each weight is
    still read once, but in one stream per run instead of one per layer, and one call's fixed costs
    instead of three - which on a small CPU are large: the weight stream evicts the interpreter's
    and torch's code and data from L2, and a call's Python path then takes 30-50 us, not 5 (the
    bench's Llama, rowwise, 2 Sapphire Rapids cores: 65 Linear calls a decode step instead of 113,
    0-11% a step in bursts of 4, -1 to +4% one step at a time; docs/PERF.md).

    Every output is the one the layer computes alone, bit for bit: an output column's sum reads only
    x and that column's weight row, in K order, whichever GEMM it is part of; the stacked weight keeps
    each layer's row, block (when the layers' N are whole 128-row blocks) or e8m0 scales, and a
    per-tensor scale becomes that layer's rows' scale (the GEMM scales each column by its own).
    A part is served only to the layer it was computed for, for the same tensor at the same version,
    and only while that layer's weight, scales and bias are the tensors, at the versions, the GEMM
    read; anything else - another input, an x written in place, a reloaded weight, an inference
    tensor (which has no version counter) - and the layer computes alone, as do calls of more rows
    (compute-bound: one GEMM gains nothing there, and its parts would need copying out)."""

    MAX_ROWS = 16

    def __init__(self, members):
        self.members = members  # the Float8Linear layers, in their parent's order
        self.plan = {}          # first member's index -> the run's indices, as last seen
        self._reset()

    def _reset(self):
        self.run = None    # (weakref of x, x's version, [indices]): the members called on x so far
        self.stash = None  # (that run, {index: (its part, the member's state)}): parts not yet served
        self.fused = {}    # run's indices -> (the members' states, FusedLinear, their out_features)

    def __getstate__(self):  # deepcopy and pickle: the members and the plan; not the GEMM nor outputs
        return {"members": self.members, "plan": self.plan}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    def _learn(self, run):
        """A run seen: its first member leads it from the next call on (a run of one: no plan), if
        the run's weights stack with their scales unchanged."""
        seen = tuple(run)
        if self.plan.get(run[0]) == seen:
            return
        block = re.fullmatch(r"block\((\d+)x\d+\)", self.members[run[0]].weight_scaling)
        if len(run) > 1 and (block is None or all(self.members[i].out_features % int(block[1]) == 0 for i in run[:-1])):
            self.plan[run[0]] = seen
        else:
            self.plan.pop(run[0], None)
        runs = set(self.plan.values())  # the stacked weights of runs no longer planned: freed
        self.fused = {r: f for r, f in self.fused.items() if r in runs}

    def _gemm(self, run):
        """The run's stacked weight as a FusedLinear, made again when a member's state changed."""
        states = [_state(self.members[i]) for i in run]
        cached = self.fused.get(run)
        if cached is None or not all(map(_same_state, cached[0], states)):
            mods = [self.members[i] for i in run]
            m0 = mods[0]
            codes = torch.cat([m.weight for m in mods])
            scaling = m0.weight_scaling
            if scaling == "tensor":  # one scale a layer: each of its rows takes it
                scales = torch.cat([m.weight_scale_inv.float().expand(m.out_features, 1) for m in mods])
                scaling = "row"
            else:
                scales = torch.cat([m.weight_scale_inv for m in mods])
            bias = None if m0.bias is None else torch.cat([m.bias.detach() for m in mods])
            sizes = [m.out_features for m in mods]
            gemm = _fused_linear(fp8kit.qtensor(codes, scales, scaling), m0.input_scaling, bias, sizes)
            cached = self.fused[run] = (states, gemm, sizes)
        return cached

    def __call__(self, i, x, dtype_index):
        """Member i's output for x (CPU, C-contiguous, of FusedLinear.out_dtypes[dtype_index]): its
        part of its run's GEMM; or None, and the member computes alone."""
        if x.is_inference():
            return None
        version = x._version
        run = self.run
        if run is not None and run[0]() is x and run[1] == version and i not in run[2]:
            run[2].append(i)  # a later member of the run: its part, if the first one computed it
            stash = self.stash  # read once: another thread may replace it (each GEMM releases the GIL)
            if stash is not None and stash[0] is run:
                got = stash[1].pop(i, None)
                if got is not None and _same_state(got[1], _state(self.members[i])):
                    return got[0]
            return None
        if run is not None:
            self._learn(run[2])
        run = self.run = (weakref.ref(x), version, [i])
        plan = self.plan.get(i)
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        if plan is None or not 0 < rows <= self.MAX_ROWS:
            return None
        states, gemm, sizes = self._gemm(plan)
        lead = x.shape[:-1]
        first = x.new_empty(*lead, sizes[0])  # each part C-contiguous, written by the extension
        addresses, served = [first.data_ptr()], {}
        for p in range(1, len(plan)):  # one loop, not three comprehensions
            part = x.new_empty(*lead, sizes[p])
            addresses.append(part.data_ptr())
            served[plan[p]] = (part, states[p])
        gemm.call_into_parts(x.data_ptr(), rows, k, dtype_index, addresses)
        self.stash = (run, served)
        return first


def _group_siblings(model):
    """Gives every group of two or more Float8Linear children of one module, alike in in_features,
    recipe, weight dtype and bias or none, one _Siblings."""
    for parent in model.modules():
        groups = {}
        for child in parent.children():
            if type(child) is Float8Linear:
                key = (child.in_features, child.recipe, child.weight.dtype, child.bias is None)
                groups.setdefault(key, []).append(child)
        for members in groups.values():
            if len(members) > 1:
                siblings = _Siblings(members)
                for i, m in enumerate(members):
                    m._siblings = (siblings, i)


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


def _no_backward(ctx, grad):
    raise fp8kit.Error("fp8kit.torch.Float8Linear is an inference layer (an FP8 weight buffer): it has no backward. "
                       "To train in FP8, convert the high-precision model with "
                       "fp8kit.torch.convert_to_float8_training")


linear.register_autograd(_no_backward)


def _fp8_weight(w, storage_dtype, scaling, scaled=True):
    """A weight stored in FP8 as the torch.nn modules here hold it: (codes as storage_dtype,
    scale_inv). scaled: quantized with `scaling` (fp8kit.quantize: scale = fp8_max / amax per
    group); else cast as it is with scale 1, as Diffusers stores weights."""
    if not scaled:
        return w.detach().to(storage_dtype), torch.ones(1, 1)
    q = fp8kit.quantize(w.detach().float(), str(storage_dtype).removeprefix("torch.float8_"), scaling)
    return (torch.from_numpy(q.data.copy()).view(storage_dtype),
            _scale_tensor(torch.from_numpy(q.scale_inv.copy()), scaling))


def _replace(model, fqn, module):
    """Puts module where model's submodule fqn ("blocks.0.mlp.fc1") is."""
    parent_name, _, child = fqn.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _scale_tensor(scale_inv, scaling):
    """scale_inv as a Float8Linear holds it: float32, or for mx32 torch.float8_e8m0fnu - from its
    e8m0 codes (uint8, what quantize returns) or from float32 values (powers of two)."""
    if scaling != "mx32":
        return scale_inv
    if scale_inv.dtype == torch.uint8:
        return scale_inv.view(torch.float8_e8m0fnu)
    return scale_inv.to(torch.float8_e8m0fnu)


class Float8Linear(nn.Module):
    """An nn.Linear for inference with an FP8 weight [out, in] (buffer `weight`, torch.float8_*)
    and its scale_inv (buffer `weight_scale_inv`): y = x W^T + b with x cast to FP8 in the GEMM
    (recipe weight_only: x not quantized)."""

    _siblings = None  # (_Siblings, this layer's index there): set by quantize_ / enable_layerwise_casting

    def __init__(self, in_features, out_features, bias=True, recipe="rowwise", format="e4m3fn"):
        super().__init__()
        if recipe not in RECIPES and recipe not in _WEIGHT_ONLY:
            raise fp8kit.Error(f"fp8kit.torch: recipe '{recipe}', expected one of {', '.join(RECIPES)}")
        self.in_features, self.out_features, self.recipe = in_features, out_features, recipe
        self.input_scaling, self.weight_scaling = _recipe_scalings(recipe)
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=getattr(torch, "float8_" + format)))
        shape = fp8kit._fp8kit.scale_shape(self.weight_scaling, out_features, in_features)
        self.register_buffer("weight_scale_inv", _scale_tensor(torch.ones(shape), self.weight_scaling))
        self.register_parameter("bias", nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None)

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
        # x [..., in] -> y [..., out]: the GEMM sees [M, in] rows (M = the leading dimensions' product).
        shape = x.shape
        if not shape or shape[-1] != self.in_features:
            raise fp8kit.Error(f"fp8kit.torch.Float8Linear: the input has shape {list(shape)}, but in_features "
                               f"{self.in_features}")
        # The tensors through the module's dicts: Module.__getattr__ costs about 1 us a name, a
        # tenth of a decode step's small layer.
        buffers = self._buffers
        w, w_scale_inv, bias = buffers["weight"], buffers["weight_scale_inv"], self._parameters["bias"]
        if _plain_eager(x):  # any leading dimensions, without a reshape either way
            out = _OUT_DTYPES.get(x.dtype)
            if out is not None and x.is_cpu and x.is_contiguous():
                siblings = self._siblings
                if siblings is not None:
                    y = siblings[0](siblings[1], x, out[1])
                    if y is not None:
                        return y
                fused, n = _fused(w, w_scale_inv, self.weight_scaling, bias, self.input_scaling)
                return _call_into(fused, n, x, shape, out[1])
            return _linear(x, w, w_scale_inv, bias, self.input_scaling, self.weight_scaling)  # or its error
        y = torch.ops.fp8kit.linear(x if len(shape) == 2 else x.reshape(-1, self.in_features), w, w_scale_inv, bias,
                                    self.input_scaling, self.weight_scaling)
        return y if len(shape) == 2 else y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.recipe}, format={str(self.weight.dtype).removeprefix('torch.float8_')}")


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
    None) by a Float8Linear. config: a recipe name - "rowwise" (the default), "tensorwise",
    "block", "mxfp8", or "weight_only" (e4m3 rowwise weights, activations not quantized: torchao's
    Float8WeightOnlyConfig; a float32 / float16 activation is taken to 16 significant bits, twice
    the products of a bfloat16 one at M >= 16) - or torchao's config object for one of them
    (Float8DynamicActivationFloat8WeightConfig with PerTensor / PerRow / 1x128-128x128 PerBlock
    granularity, Float8WeightOnlyConfig), as torchao's quantize_(model, config, filter_fn).
    fuse_siblings: Float8Linear layers of one module that the model calls in a row on the same
    input (q, k and v; gate and up) run as one GEMM at up to 16 rows, with the same outputs bit for
    bit (_Siblings; it holds one more packed copy of those weights where the model also runs
    them at more rows)."""
    recipe = config or "rowwise"
    if not isinstance(recipe, str):
        recipe = _recipe_of_torchao_config(recipe)
    if recipe not in RECIPES:
        raise fp8kit.Error(f"fp8kit.torch.quantize_: config '{recipe}', expected one of {', '.join(RECIPES)}")
    chosen = [(fqn, m) for fqn, m in model.named_modules()
              if type(m) is nn.Linear and (filter_fn is None or filter_fn(m, fqn))]
    for fqn, m in chosen:
        if not fqn:
            raise fp8kit.Error("fp8kit.torch.quantize_: the model is itself an nn.Linear; quantize_ replaces the "
                               "Linear layers inside a model (wrap it: nn.Sequential(linear))")
        w = m.weight
        if w.dtype.itemsize == 1 and w.dtype.is_floating_point:  # codes, not values: never quantized again
            raise fp8kit.Error(f"fp8kit.torch.quantize_: layer '{fqn}' holds {w.dtype} weights already (an FP8 "
                               "checkpoint loaded as it is stored); load it with fp8kit.torch.from_pretrained(path) "
                               "or load_fp8_checkpoint(model, path), which keep its codes and scales")
        if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise fp8kit.Error(f"fp8kit.torch.quantize_: layer '{fqn}' has {w.dtype} weights; quantize_ takes "
                               "float32, bfloat16 or float16 models (cast it first, e.g. model.float())")
        _replace(model, fqn, Float8Linear.from_linear(m, recipe))
    if fuse_siblings:
        _group_siblings(model)


# ---- training: convert_to_float8_training ----

# torchao's recipe names, plus block, mxfp8 and delayed: the library's recipe (fp8kit::Recipe:
# formats and scalings per operand) and whether grad_weight runs in FP8 (rowwise_with_gw_hp keeps
# dW = dY^T x in the input's precision: torchao's choice for the GEMM with the largest K).
TRAINING_RECIPES = {"tensorwise": ("tensorwise", True), "rowwise": ("rowwise", True),
                    "rowwise_with_gw_hp": ("rowwise", False), "block": ("block", True), "mxfp8": ("mxfp8", True),
                    "delayed": ("delayed", True)}


class _Casts:
    """How one Float8TrainingLinear quantizes its operands (input, weight, grad_output): as its
    recipe says, or for delayed with one DelayedScaling per operand whose history rolls at each
    use - the scale of a cast comes from the amaxes of the casts before it (TransformerEngine's
    delayed scaling, one step per forward and backward)."""

    def __init__(self, recipe):
        self.recipe = recipe
        self.delayed = ({role: fp8kit._fp8kit.DelayedScaling(role) for role in ("input", "weight", "grad_output")}
                        if recipe == "delayed" else None)

    def __call__(self, t, role, transpose):
        t = fp8kit._to_extension(t)
        if self.delayed is None:
            return fp8kit._fp8kit.recipe_quantize(t, self.recipe, role, transpose)
        d = self.delayed[role]
        if d.fresh:
            # A fresh state has scale 1: gradients of ~1e-5 would flush to zero in e5m2. As torchao
            # and fp8kit::nn::Float8Linear do, the first use records this tensor's amax first.
            d.quantize(t)
        d.step()
        return d.quantize(t, transpose)


def _gemm(a, b, out_dtype, bias=None):
    """D = deq(a) . deq(b)^T (+ bias) of two QTensors, as a torch tensor of out_dtype."""
    name = _OUT_DTYPES[out_dtype][0]
    bias = None if bias is None else fp8kit._to_extension(bias)
    return fp8kit._out(fp8kit._fp8kit.gemm(a, b, name, 1.0, 0.0, None, bias, "none"), name, True)


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


class Float8TrainingLinear(nn.Linear):
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
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise fp8kit.Error(f"fp8kit.torch.Float8TrainingLinear: the input has shape {list(x.shape)}, but "
                               f"in_features {self.in_features}")
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise fp8kit.Error(f"fp8kit.torch.Float8TrainingLinear: the input is {x.dtype}; it takes float32, "
                               "bfloat16 or float16")
        rows = x.reshape(-1, self.in_features)
        y = _Float8LinearFunction.apply(rows, self.weight, self.bias, self._casts, self.fp8_grad_weight,
                                        torch.is_grad_enabled())
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self):
        return super().extra_repr() + f", config={self.config}"


def convert_to_float8_training(module, *, module_filter_fn=None, config=None):
    """torchao's convert_to_float8_training on fp8kit's kernels: every nn.Linear of module that
    module_filter_fn(mod, fqn) accepts (all when None) and whose in and out features are multiples
    of 16 (the FP8 GEMM's operand rule, as torchao's) becomes a Float8TrainingLinear sharing its
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
        return Float8TrainingLinear.from_linear(module, config)
    for fqn, m in [(fqn, m) for fqn, m in module.named_modules() if fqn and eligible(m, fqn)]:
        _replace(module, fqn, Float8TrainingLinear.from_linear(m, config))
    return module


# ---- layerwise casting (Diffusers' enable_layerwise_casting) ----

# Diffusers' defaults (diffusers.hooks.layerwise_casting): the modules whose names match one of
# these are left alone, and only these layer kinds have their weights stored in FP8.
DEFAULT_SKIP_MODULES_PATTERN = ("pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$")
CASTABLE_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
                   nn.Linear, nn.Embedding)


class LayerwiseCastingReport:
    """What enable_layerwise_casting did: `native` Linear layers compute on their FP8 weight
    (fp8kit's GEMM), `cast` layers are upcast to compute_dtype at each forward (Diffusers' hook),
    `skipped` (name, why) stay as they were."""

    def __init__(self):
        self.native, self.cast, self.skipped = [], [], []

    def __str__(self):
        lines = [f"native FP8 ({len(self.native)}): {', '.join(self.native) or '-'}",
                 f"upcast per forward ({len(self.cast)}): {', '.join(self.cast) or '-'}"]
        lines += [f"skipped {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def _cast_hooks(module, storage_dtype, compute_dtype, non_blocking):
    """Diffusers' LayerwiseCastingHook: stored in storage_dtype, compute_dtype for each forward."""
    def upcast(m, args):
        m.to(dtype=compute_dtype, non_blocking=non_blocking)

    def store(m, args, out):
        m.to(dtype=storage_dtype, non_blocking=non_blocking)

    module.to(dtype=storage_dtype, non_blocking=non_blocking)
    module.register_forward_pre_hook(upcast)
    module.register_forward_hook(store)


def _native_linear(linear_module, storage_dtype, compute_dtype, scaled):
    """A Float8Linear (recipe layerwise: the input not quantized) holding the Linear's weight in
    storage_dtype: with a per-tensor scale (scaled), or cast as it is, scale 1 (Diffusers' storage).
    The bias stays in compute_dtype (N values; Diffusers rounds it to FP8 too)."""
    m = Float8Linear(linear_module.in_features, linear_module.out_features, linear_module.bias is not None,
                     "layerwise", str(storage_dtype).removeprefix("torch.float8_"))
    m.weight, m.weight_scale_inv = _fp8_weight(linear_module.weight, storage_dtype, "tensor", scaled)
    if linear_module.bias is not None:
        m.bias = nn.Parameter(linear_module.bias.detach().to(compute_dtype), requires_grad=False)
    return m


class Float8Embedding(nn.Module):
    """An nn.Embedding whose table [num, dim] is stored in FP8 (buffer `weight`) with a per-tensor
    `weight_scale_inv`: a lookup decodes only the rows it reads, to compute_dtype - where Diffusers'
    hook upcasts the whole table and casts it back at every forward (for a 32000 x 1536 table,
    0.2 s a call on 2 cores)."""

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


def enable_layerwise_casting(model, storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16,
                             skip_modules_pattern="auto", skip_modules_classes=None, non_blocking=False, *,
                             native_fp8=True, scaled=True, fuse_siblings=True):
    """Diffusers' layerwise casting (ModelMixin.enable_layerwise_casting, apply_layerwise_casting):
    the weights of the layers below model that no pattern (re.search on the qualified name;
    "auto": DEFAULT_SKIP_MODULES_PATTERN) or class skips are stored in storage_dtype. Convolutions
    are upcast to compute_dtype around each forward, as Diffusers does; with native_fp8, nn.Linear
    layers instead compute on the FP8 weight directly - the activation as Diffusers computes it,
    not quantized (fp8kit's weight-only GEMM), float32 sums, output in the
    input's dtype - and keep no upcast copy, and
    nn.Embedding layers become Float8Embedding, whose lookup decodes only the rows it reads.
    scaled: weights stored with a per-tensor scale (fp8_max / amax), or False as Diffusers stores
    them (cast as they are: small weights lose bits in FP8's subnormals). fuse_siblings: as
    quantize_'s, for the native Linear layers.
    Returns a LayerwiseCastingReport saying which layer went which way."""
    if not (storage_dtype.is_floating_point and storage_dtype.itemsize == 1):
        raise fp8kit.Error(f"fp8kit.torch.enable_layerwise_casting: storage_dtype {storage_dtype} is not an FP8 dtype")
    patterns = DEFAULT_SKIP_MODULES_PATTERN if skip_modules_pattern == "auto" else (
        (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else tuple(skip_modules_pattern or ()))
    classes = tuple(skip_modules_classes or ())
    report = LayerwiseCastingReport()

    def visit(module, prefix, parent, child):
        if classes and isinstance(module, classes):
            report.skipped.append((prefix, f"class {type(module).__name__}"))
            return
        hit = next((p for p in patterns if re.search(p, prefix)), None)
        if hit is not None:
            report.skipped.append((prefix, f"pattern {hit!r}"))
            return
        if type(module) is nn.Linear and native_fp8 and parent is not None:
            setattr(parent, child, _native_linear(module, storage_dtype, compute_dtype, scaled))
            report.native.append(prefix)
        elif (type(module) is nn.Embedding and native_fp8 and parent is not None and module.max_norm is None
              and not module.sparse):
            setattr(parent, child, Float8Embedding.from_embedding(module, storage_dtype, compute_dtype, scaled))
            report.native.append(prefix)
        elif isinstance(module, CASTABLE_LAYERS):
            _cast_hooks(module, storage_dtype, compute_dtype, non_blocking)
            report.cast.append(prefix or "(model)")
        else:
            for name, sub in list(module.named_children()):
                visit(sub, f"{prefix}.{name}" if prefix else name, module, name)

    visit(model, "", None, None)
    if fuse_siblings:
        _group_siblings(model)
    return report


# ---- advise: which Linear layers pay in FP8 on this machine ----

def _seconds_per_call(call, target=2e-3):
    """One timing sample: enough calls in a row to last about `target` seconds (a small layer's
    call is microseconds: below the clock's and the scheduler's noise), per call."""
    calls, elapsed = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        elapsed = time.perf_counter() - t0
        if elapsed >= target:
            return elapsed / calls
        calls *= 2


def advise(model, example_inputs, path=None, *, recipes=("rowwise", "tensorwise", "block"), rounds=7,
           min_speedup=1.0, sqnr_floor=25.0):
    """Per nn.Linear of model: FP8 or not, and with which recipe, measured on this machine at the
    shapes the model runs. example_inputs (a tuple of model's arguments) runs once to capture each
    Linear's input; then, per layer, `rounds` rounds each time the float32 layer and one
    Float8Linear per recipe on that input, in turn (so a burst of noise hits both sides of a
    round), and take the median of the per-round speedups; the confidence is how many rounds
    agree with the decision. SQNR: the FP8 output against the float64 product of the same input
    and weight. A layer goes FP8 with the fastest recipe whose median speedup is at least
    min_speedup and whose SQNR is at least sqnr_floor (25 dB: the NUMERICS.md floor of an FP8
    GEMM). recipes: any of RECIPES (weight_only too: an inference recipe, which the library's
    layerwise casting runs with the input unquantized and its training conversions refuse).
    Returns the policy entries (docs/CHECKPOINTS.md); path: also written there as the policy file
    that `fp8kit quantize --policy`, `fp8kit train --policy` and the library read."""
    if rounds < 1:
        raise fp8kit.Error(f"fp8kit.torch.advise: rounds is {rounds}, expected >= 1")
    for r in recipes:
        if r not in RECIPES:
            raise fp8kit.Error(f"fp8kit.torch.advise: recipe '{r}', expected some of {', '.join(RECIPES)}")
    linears = [(fqn, m) for fqn, m in model.named_modules() if type(m) is nn.Linear]
    seen = {}  # fqn -> the layer's first input

    def capture(fqn):
        def hook(module, args, out):  # returns None: a forward hook's return value replaces the output
            seen.setdefault(fqn, args[0].detach())
        return hook

    handles = [m.register_forward_hook(capture(fqn)) for fqn, m in linears]
    try:
        with torch.no_grad():
            model(*example_inputs) if isinstance(example_inputs, tuple) else model(example_inputs)
    finally:
        for h in handles:
            h.remove()
    entries = []
    with torch.no_grad():
        for fqn, m in linears:
            if fqn not in seen:
                entries.append({"name": fqn + ".weight", "fp8": False, "recipe": None,
                                "reason": "not run by the example inputs: nothing measured"})
                continue
            x = seen[fqn].float().reshape(-1, m.in_features)
            ref = x.double() @ m.weight.double().T + (0 if m.bias is None else m.bias.double())
            base = m if m.weight.dtype == torch.float32 else copy.deepcopy(m).float()  # (.float() is in place)
            candidates = {r: Float8Linear.from_linear(base, r) for r in recipes}
            ratios = {r: [] for r in recipes}
            for i in range(rounds):
                order = list(recipes[i % len(recipes):] + recipes[:i % len(recipes)])
                f32 = _seconds_per_call(lambda: base(x))
                for r in order:
                    ratios[r].append(f32 / _seconds_per_call(lambda c=candidates[r]: c(x)))
            rows = []
            for r in recipes:
                y = candidates[r](x).double()
                err = (y - ref).square().sum().item()
                sqnr = math.inf if err == 0 else 10 * math.log10(ref.square().sum().item() / err)
                rows.append((statistics.median(ratios[r]), sqnr, r))
            good = [row for row in rows if row[0] >= min_speedup and row[1] >= sqnr_floor]
            speed, sqnr, recipe = max(good) if good else max(rows)
            agree = sum((s >= min_speedup) == bool(good) for s in ratios[recipe])
            what = ("faster and accurate" if good else
                    "not accurate" if speed >= min_speedup else "not faster")
            entries.append({"name": fqn + ".weight", "fp8": bool(good), "recipe": recipe if good else None,
                            "reason": f"{what}: {recipe} {speed:.2f}x f32 at M={x.shape[0]} (median of {rounds} rounds, "
                                      f"{agree}/{rounds} agree; need {min_speedup:.2f}x), sqnr {sqnr:.1f} dB "
                                      f"(floor {sqnr_floor:g})"})
    if path is not None:
        fp8kit._fp8kit.write_policy(str(path), [(e["name"], e["fp8"], e["recipe"], e["reason"]) for e in entries])
    return entries


# FP8 checkpoints (fp8kit/torch_checkpoint.py): from_pretrained, load_fp8_checkpoint.
from fp8kit.torch_checkpoint import (Float8Experts, Float8StaticInputLinear, from_pretrained,  # noqa: E402
                                     load_fp8_checkpoint)
