"""fp8kit.torch.fsdp: FP8 all-gather under FSDP2 (torch.distributed.fsdp.fully_shard) for the
training layer, Float8Linear, through FSDP2's own extension of a parameter: fsdp_pre_all_gather /
fsdp_post_all_gather on the weight's shard (the protocol torchao's float8 training uses).

convert_to_float8_training(..., enable_fsdp_float8_all_gather=True) (or torchao's
Float8LinearConfig(enable_fsdp_float8_all_gather=True)) makes each Float8Linear's weight a
Float8WeightShard: the high-precision weight as before for everything else (optimizer, state_dict,
which gives the tensor it wraps, a run without FSDP), but each rank casts its shard to FP8 before FSDP2 all-gathers it, and the
forward GEMM takes the gathered codes and scales as they are (Float8GatheredWeight): one byte per
element crosses instead of two (bfloat16) or four (float32).

Numerics: the gathered weight is bit for bit the cast of the whole weight, so FSDP2 with FP8
all-gather trains as the same model without FSDP2:
- tensorwise: one scale for the whole weight, fp8_max / amax, so every rank casts its shard with
  the amax all-reduced (max) over the ranks - or the one precompute_float8_dynamic_scale_for_fsdp
  computed for every layer in one all-reduce after the optimizer step;
- block (128x128): a block's scale is its own amax's, so a shard casts alone when it holds whole
  blocks - FSDP2 splits dim 0 into equal parts, so out_features / ranks must be a multiple of 128
  (else fp8kit.Error naming the layer).
Both scalings are the same on W and W^T (one scale; 128x128 blocks transposed), so the backward's
W^T cast is the gathered codes transposed: one byte per element is gathered.
- rowwise, rowwise_with_gw_hp: W's row scales are each row's own (a rank casts its rows alone),
  but W^T's rows are W's columns, which span every rank: their amaxes are all-reduced (max, one
  vector) and each rank casts its rows with them too.
- mxfp8 (and mxfp8_rceil): W's 1x32 blocks run along its rows (a rank's own), W^T's along W's columns, 32 rows of W
  each: where every rank's share of rows is a multiple of 32 (FSDP2's ceil(out / ranks)) each block
  lies in one shard, so each rank casts both for its rows alone. Any other split is refused,
  naming the layer, on every rank.
For these two, W and W^T are two casts, each crossing once: FSDP2's forward all-gather carries W's
codes, its re-gather for the backward (reshard_after_forward) W^T's (as W's rows), one byte per
element each time, with the whole weight's bits; the scales go beside FSDP2's all-gather
(all_gather_into_tensor: FSDP2 takes only inputs of the shard's shape when the split is uneven).
Until a layer has seen that re-gather (its first step; reshard_after_forward=False, which has
none) and in a compiled layer (whose backward reads only what its forward kept: compile the
model before its first step), the forward gathers W^T's cast too, beside FSDP2's. A forward
recomputed under activation checkpointing, after the re-gather brought W^T's, gathers W's again.
Uneven splits (out_features not a multiple of the ranks): FSDP2 gives each rank ceil(out / ranks)
rows, the last ranks fewer or none, and pads them; the codes go padded with zero rows, and the
gathered weight is the first out_features rows of what arrives.

Checked by tests/python/test_fsdp.py (2, 3 and 4 ranks on gloo against one process with its
gradients all-reduced by hand; the gathered codes against the whole weight's cast, 3 ranks
splitting unevenly; activation checkpointing; bytes all-gathered).
"""
import torch
import torch.utils._pytree as pytree

import fp8kit

from .ops import cast, check_model_args

aten = torch.ops.aten

# The library recipes whose weight cast all-gathers in FP8 (the module's docstring says how).
FP8_ALL_GATHER_RECIPES = ("tensorwise", "block", "rowwise", "mxfp8", "mxfp8_rceil")
# The recipes whose W^T has a cast of its own (its groups run along W's columns), gathered apart.
_SEPARATE_T = ("rowwise", "mxfp8", "mxfp8_rceil")

# What FSDP2 does to a weight to shard, pad and copy it: the result stays a Float8WeightShard.
_PRESERVED = {aten.empty_like.default, aten.new_zeros.default, aten.slice.Tensor, aten.copy_.default,
              aten.view.default, aten.as_strided.default, aten._to_copy.default, aten._pin_memory.default,
              aten.split.Tensor, aten.clone.default, aten.detach.default, aten.alias.default}


class Float8WeightShard(torch.Tensor):
    """A Float8Linear's high-precision weight (whole, or FSDP2's shard of it) that FSDP2 all-gathers
    in FP8. Every operation runs on the tensor it wraps (_tensor); the ones of _PRESERVED keep the
    wrapper. layer: the layer's name, for errors; amax: a precomputed global amax (tensorwise)."""

    @staticmethod
    def __new__(cls, tensor, recipe, layer, amax=None):
        return torch.Tensor._make_wrapper_subclass(cls, tensor.size(), strides=tensor.stride(),
                                                   storage_offset=tensor.storage_offset(), dtype=tensor.dtype,
                                                   layout=tensor.layout, device=tensor.device,
                                                   requires_grad=tensor.requires_grad)

    def __init__(self, tensor, recipe, layer, amax=None):
        self._tensor, self._recipe, self._layer, self._amax = tensor, recipe, layer, amax

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        shard = next(a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, cls))
        args, kwargs = pytree.tree_map_only(cls, lambda t: t._tensor, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _PRESERVED:
            return out
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, shard._recipe, shard._layer), out)

    def __tensor_flatten__(self):
        return ["_tensor"], (self._recipe, self._layer)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Float8WeightShard(inner["_tensor"], *meta)

    def __repr__(self):
        return f"Float8WeightShard({self._tensor}, recipe={self._recipe}, layer={self._layer})"

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """This rank's shard cast to FP8: (codes, and block's scales) to all-gather, and the
        metadata that every rank has already (the weight's rows; tensorwise's one scale_inv,
        rowwise's and mxfp8's gathered scales). An uneven split (out_features not a multiple of
        the ranks: FSDP2 gives each rank ceil(out / ranks) rows, the last ones fewer or none, and
        pads them) sends codes padded with zero rows to that many, as FSDP2 requires of every
        input then."""
        w, rows, world = self._tensor, outer_size[0], mesh.size()
        padded = -(-rows // world)  # FSDP2's shard rows (torch.chunk's): the gathered codes' first `rows` are W's
        if self._recipe == "tensorwise":
            amax = self._amax
            if amax is None:
                amax = _amax(w)
                torch.distributed.all_reduce(amax, torch.distributed.ReduceOp.MAX, group=mesh.get_group())
            codes, scale_inv = _cast_with_amax(w, amax)
            return (_pad_rows(codes, padded),), (rows, scale_inv)
        if self._recipe in _SEPARATE_T:
            # One cast crosses per all-gather: W's for the forward, W^T's (as W's rows) for the
            # backward's re-gather (reshard_after_forward), each one byte an element. The forward's
            # gathers W^T's too, beside FSDP2's, until the layer has seen a re-gather - and always
            # for a compiled layer, whose backward reads only what its forward kept.
            backward = torch._C._current_graph_task_id() != -1
            if backward:
                module._fp8kit_regathered = True
            part = "t" if backward else "w"
            codes, scale_inv = self._cast(part, mesh, rows)
            other = None
            if not backward and (not getattr(module, "_fp8kit_regathered", False)
                                 or getattr(module, "_fp8kit_compiled", False)):
                other = self._gather("t", mesh, rows)
            return (codes,), (rows, part, scale_inv, other, (self, mesh))
        if rows % (128 * world) != 0:  # every rank's test, so that all of them refuse
            raise fp8kit.Error(f"fp8kit.torch: layer '{self._layer}': FSDP2 splits its weight's {rows} rows over "
                               f"{world} ranks; the block recipe's FP8 all-gather needs whole 128-row blocks per "
                               "rank (out_features a multiple of 128 x ranks), or convert with "
                               "enable_fsdp_float8_all_gather=False")
        codes, scale_inv = cast(w.detach(), "block", "weight", False)
        return (codes, scale_inv), (rows,)

    def _cast(self, part, mesh, rows):
        """rowwise / mxfp8: this rank's rows of W's cast (part "w") or of W^T's (part "t": its codes
        transposed, as W's rows), padded to FSDP2's shard rows, and the whole cast's scale_inv - W's
        row scales or e8m0 blocks gathered from every rank (beside FSDP2's all-gather, which takes
        only inputs of the shard's shape when the split is uneven), or W^T's, which every rank
        computes alike."""
        w, world = self._tensor.detach(), mesh.size()
        padded, mine = -(-rows // world), self._tensor.shape[0]
        if self._recipe == "rowwise":
            if part == "w":
                codes, scale_inv = cast(w, "rowwise", "weight", False) if mine else \
                    (w.new_empty(w.shape, dtype=torch.float8_e4m3fn), w.new_empty((0, 1), dtype=torch.float32))
                return _pad_rows(codes, padded), _gather_rows(scale_inv, padded, 1.0, mesh)[:rows]
            # W^T's row amaxes (W's columns') all-reduced, appended to the shard as one more row:
            # each column's amax then is the whole weight's, and the shard's own rows cast with it.
            cols = w.abs().amax(0).float() if mine else w.new_zeros(w.shape[1], dtype=torch.float32)
            torch.distributed.all_reduce(cols, torch.distributed.ReduceOp.MAX, group=mesh.get_group())
            _, _, codes_t, scale_inv_t = cast(torch.cat([w, cols[None].to(w.dtype)]), "rowwise", "weight", True)
            return _pad_rows(codes_t[:, :mine].t(), padded), scale_inv_t
        if padded % 32 != 0:  # every rank's test, so that all of them refuse
            raise fp8kit.Error(f"fp8kit.torch: layer '{self._layer}': FSDP2 gives each of {world} ranks up to "
                               f"{padded} of its weight's {rows} rows; mxfp8's FP8 all-gather needs whole 32-row "
                               "blocks of W^T per rank (ceil(out_features / ranks) a multiple of 32), or convert "
                               "with enable_fsdp_float8_all_gather=False")
        # W's e8m0 scales [rows, K / 32] and W^T's [K, rows / 32] (its blocks' rows as W's 32-row
        # groups), gathered; 127 is e8m0's 1 (padding only).
        if part == "w":
            codes, scale_inv = cast(w, self._recipe, "weight", False)
            return _pad_rows(codes, padded), _gather_rows(scale_inv, padded, 127, mesh)[:rows]
        _, _, codes_t, scale_inv_t = cast(w, self._recipe, "weight", True)
        scales_t = _gather_rows(scale_inv_t.t(), padded // 32, 127, mesh)[:-(-rows // 32)].t().contiguous()
        return _pad_rows(codes_t.t(), padded), scales_t

    def _gather(self, part, mesh, rows):
        """rowwise / mxfp8: the whole of W's cast or W^T's (_cast), all-gathered beside FSDP2:
        (codes [rows, K] - W^T's as W's rows -, scale_inv)."""
        codes, scale_inv = self._cast(part, mesh, rows)
        # as bytes: gloo all-gathers no float8 dtype
        return _gather_rows(codes.view(torch.uint8), codes.shape[0], 0, mesh)[:rows].view(codes.dtype), scale_inv

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        """The gathered FP8 weight (Float8GatheredWeight), and the tensors FSDP2 frees after use."""
        rows = metadata[0]
        w = w_t = source = None
        if self._recipe == "tensorwise":
            w = outputs[0][:rows], metadata[1]
        elif self._recipe in _SEPARATE_T:
            _, part, scale_inv, other, source = metadata
            if part == "w":
                w, w_t = (outputs[0][:rows], scale_inv), other
            else:  # the backward's re-gather: W^T's cast alone
                w_t = outputs[0][:rows], scale_inv
        else:
            w = outputs[0][:rows], outputs[1]
        # (codes: views of the gathered memory, the padding rows of an uneven split dropped)
        if out is not None:  # FSDP2 refilled the storage it gathers into: out takes the new views and metadata
            out._w, out._w_t, out._source = w, w_t, source
            return None
        separate = self._recipe in _SEPARATE_T
        return Float8GatheredWeight(rows, w, w_t, param_dtype, separate, source), tuple(outputs)


def _gather_rows(t, rows, value, mesh):
    """Every rank's t [r, c] (r <= rows) padded with value to rows rows, all-gathered in rank order:
    [ranks x rows, c]."""
    out = t.new_empty((mesh.size() * rows, t.shape[1]))
    torch.distributed.all_gather_into_tensor(out, _pad_rows(t, rows, value), group=mesh.get_group())
    return out


def _pad_rows(t, rows, value=0):
    """t [r, c] with rows - r more rows of value (zero codes: the value 0), contiguous."""
    if t.shape[0] == rows:
        return t.contiguous()
    out = t.new_full((rows, t.shape[1]), value)
    out[:t.shape[0]] = t
    return out


def _amax(w):
    """max |w| as a float32 scalar tensor; 0 for an empty shard (FSDP2 leaves a rank none when a
    weight has fewer rows than ranks), which the all-reduced max then ignores."""
    return w.detach().abs().amax().float() if w.numel() else torch.zeros((), dtype=torch.float32, device=w.device)


def _cast_with_amax(w, amax):
    """The tensorwise weight cast (e4m3fn, scale fp8_max / amax) of w with the given amax, which
    bounds w's own: as fp8kit.quantize's amax_epsilon (the floor of the amax: docs/NUMERICS.md)
    it becomes the amax, so a shard casts bit for bit as the whole weight whose amax this is. The
    options are the tensorwise recipe's for a weight (test_fsdp.py compares the bits with its cast)."""
    outs = fp8kit._quantize_into(w, "tensor", False, lambda t, o: fp8kit._fp8kit.quantize(
        t, "e4m3fn", "tensor", "saturate", False, float(amax), "floor", "propagate", False, outs=o))[1]
    return outs[0].view(torch.float8_e4m3fn), outs[1]


class Float8GatheredWeight(torch.Tensor):
    """The whole weight [rows, K] as FSDP2's all-gather leaves it: W's cast (_w: FP8 codes and
    scale_inv, as the recipe casts the weight) and, for rowwise and mxfp8, W^T's (_w_t: its codes as
    W's rows, and its scale_inv), either of which may be absent - the forward's gather may bring W's
    alone, the backward's re-gather brings W^T's alone - and is then gathered when read (_source:
    the rank's Float8WeightShard and mesh). separate: W^T has a cast of its own (rowwise, mxfp8),
    not W's transposed. To autograd and FSDP2 a parameter of dtype. The GEMMs read the casts as
    they are (weight_casts, transposed_cast)."""

    @staticmethod
    def __new__(cls, rows, w, w_t, dtype, separate, source=None):
        codes = (w or w_t)[0]
        return torch.Tensor._make_wrapper_subclass(cls, (rows, codes.shape[1]), dtype=dtype, device=codes.device,
                                                   requires_grad=False)

    def __init__(self, rows, w, w_t, dtype, separate, source=None):
        self._w, self._w_t, self._separate, self._source = w, w_t, separate, source

    __torch_function__ = torch._C._disabled_torch_function_impl

    # torch.compile traces through the subclass by its inner tensors (graph inputs, read afresh on
    # every call); without these it took the codes gathered at trace time as constants, and the
    # compiled forward ran on the first step's weights ever after.
    def __tensor_flatten__(self):
        names = (["_codes", "_scale_inv"] if self._w else []) + (["_codes_t", "_scale_inv_t"] if self._w_t else [])
        return names, (self.dtype, self._separate)

    def __getattr__(self, name):  # the inner tensors by the names __tensor_flatten__ gives them
        parts = {"_codes": ("_w", 0), "_scale_inv": ("_w", 1), "_codes_t": ("_w_t", 0), "_scale_inv_t": ("_w_t", 1)}
        if name not in parts:
            raise AttributeError(name)
        field, i = parts[name]
        return self.__dict__[field][i]

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        w = (inner["_codes"], inner["_scale_inv"]) if "_codes" in inner else None
        w_t = (inner["_codes_t"], inner["_scale_inv_t"]) if "_codes_t" in inner else None
        return Float8GatheredWeight(outer_size[0], w, w_t, *meta)

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        # FSDP2 and autograd only alias the parameter (detach; as_strided or view to its own
        # shape); anything else would read codes as values: refused.
        w = args[0]
        if func in (aten.detach.default, aten.alias.default) or (
                func in (aten.as_strided.default, aten.view.default) and list(args[1]) == list(w.shape)):
            return cls(w.shape[0], w._w, w._w_t, w.dtype, w._separate, w._source)
        raise fp8kit.Error(f"fp8kit.torch: {func} on an FP8-gathered Float8Linear weight: only the layer's GEMMs "
                           "read it")

    def __repr__(self):
        return f"Float8GatheredWeight(shape={list(self.shape)}, dtype={self.dtype})"

    def _gathered(self, part):
        """W's cast (part "w") or W^T's ("t") as gathered, or gathered now: FSDP2 brought the other
        (the forward's recomputation under activation checkpointing, after the backward's
        re-gather; a backward with no re-gather before it)."""
        got = self._w if part == "w" else self._w_t
        if got is None:
            if self._source is None or torch.compiler.is_compiling():
                raise fp8kit.Error("fp8kit.torch: a compiled Float8Linear under FSDP2 FP8 all-gather was given "
                                   f"{'W' if part == 'w' else 'W^T'}'s cast by no all-gather; compile the model "
                                   "before its first step")
            shard, mesh = self._source
            got = shard._gather(part, mesh, self.shape[0])
            setattr(self, "_w" if part == "w" else "_w_t", got)
        return got

    def transposed_in_backward(self):
        """Whether the backward reads W^T's cast here (transposed_cast) rather than the forward:
        W^T's own cast (rowwise, mxfp8), which FSDP2's re-gather brings for the backward; not in
        a compiled forward, which traces what it keeps."""
        return self._separate and not torch.compiler.is_compiling()

    def weight_casts(self, transpose):
        """[codes, scale_inv] of W (+ [codes_t, scale_inv_t], transposed_cast(), when transpose)."""
        return list(self._gathered("w")) + (self.transposed_cast() if transpose else [])

    def transposed_cast(self):
        """[codes_t, scale_inv_t]: W^T's cast - its own (rowwise, mxfp8), or W's transposed: one
        scale (tensorwise), or 128x128 blocks whose amax is the same transposed."""
        if not self._separate:
            codes, scale_inv = self._w
            return [codes.t().contiguous(), scale_inv.t().contiguous()]
        codes_t, scale_inv_t = self._gathered("t")
        if not torch.compiler.is_compiling():
            # Read once: the GEMM reads the copy. A cast gathered beside FSDP2 is no memory of
            # FSDP2's to free at reshard; held here it would outlive the step.
            self._w_t = None
        return [codes_t.t().contiguous(), scale_inv_t]


def shard_weight(linear, layer):
    """linear's (a Float8Linear's, of a recipe in FP8_ALL_GATHER_RECIPES: the caller checks) weight
    made a Float8WeightShard."""
    recipe = linear._casts.recipe  # the library's (rowwise_with_gw_hp casts its weight as rowwise)
    w = linear.weight
    linear.weight = torch.nn.Parameter(Float8WeightShard(w.data, recipe, layer), requires_grad=w.requires_grad)
    linear._register_state_dict_hook(_plain_weight)


def _plain_weight(module, state_dict, prefix, local_metadata):
    """state_dict gives a Float8WeightShard weight as the tensor it wraps (the same memory):
    safetensors and save_pretrained read a tensor's storage, which the wrapper has none of. A
    Parameter (state_dict(keep_vars=True)) and FSDP2's DTensor stay as they are."""
    w = state_dict.get(prefix + "weight")
    if type(w) is Float8WeightShard:
        state_dict[prefix + "weight"] = w._tensor


def precompute_float8_dynamic_scale_for_fsdp(module):
    """torchao's precompute_float8_dynamic_scale_for_fsdp: after the optimizer step, the amax of
    every tensorwise FP8-all-gathered Float8Linear weight of module (FSDP2-sharded) in one
    all-reduce (max); the all-gathers cast with it, instead of all-reducing one amax per layer,
    until the next call - so call it after every optimizer step. Same bits either way."""
    check_model_args("fp8kit.torch.precompute_float8_dynamic_scale_for_fsdp", module)
    from torch.distributed.tensor import DTensor
    weights = [getattr(m, "weight", None) for m in module.modules()]
    shards = [w for w in weights if isinstance(w, DTensor) and isinstance(w._local_tensor, Float8WeightShard)
              and w._local_tensor._recipe == "tensorwise"]
    if not shards:
        return
    amaxes = torch.stack([_amax(w._local_tensor._tensor) for w in shards])
    # Over the ranks that hold the weight's shards: a 1-D mesh's group, or HSDP's (2-D: replicate,
    # shard) shard dimension's - its replicas hold the same shards, and reach the same amaxes.
    mesh, placements = shards[0].device_mesh, shards[0].placements
    group = mesh.get_group(next(i for i, p in enumerate(placements) if p.is_shard())) if mesh.ndim > 1 else mesh.get_group()
    torch.distributed.all_reduce(amaxes, torch.distributed.ReduceOp.MAX, group=group)
    for w, amax in zip(shards, amaxes):
        w._local_tensor._amax = amax


# torch.load's weights_only unpickler (torch.distributed.checkpoint loads with it) takes the shard.
torch.serialization.add_safe_globals([Float8WeightShard])
