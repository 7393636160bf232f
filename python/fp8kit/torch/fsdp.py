"""fp8kit.torch.fsdp: FP8 all-gather under FSDP2 (torch.distributed.fsdp.fully_shard) for the
training layer, Float8Linear, through FSDP2's own extension of a parameter: fsdp_pre_all_gather /
fsdp_post_all_gather on the weight's shard (the protocol torchao's float8 training uses).

convert_to_float8_training(..., enable_fsdp_float8_all_gather=True) (or torchao's
Float8LinearConfig(enable_fsdp_float8_all_gather=True)) makes each Float8Linear's weight a
Float8WeightShard: the high-precision weight as before for everything else (optimizer, state_dict,
a run without FSDP), but each rank casts its shard to FP8 before FSDP2 all-gathers it, and the
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
  vector) and each rank casts its rows with them too. Both casts are gathered - two bytes per
  element, bfloat16's count, half float32's - with the whole weight's bits; W's row scales are
  gathered beside FSDP2's all-gather (all_gather_into_tensor), as FSDP2 takes only inputs of the
  shard's shape when the split is uneven.
- mxfp8: W's 1x32 blocks run along its rows (a rank's own), W^T's along W's columns, 32 rows of W
  each: where every rank's share of rows is a multiple of 32 (FSDP2's ceil(out / ranks)) each block
  lies in one shard, so each rank casts both for its rows alone, and both casts are gathered as
  rowwise's are, the e8m0 scales beside FSDP2's all-gather. Any other split is refused, naming the
  layer, on every rank.
Uneven splits (out_features not a multiple of the ranks): FSDP2 gives each rank ceil(out / ranks)
rows, the last ranks fewer or none, and pads them; the codes go padded with zero rows, and the
gathered weight is the first out_features rows of what arrives.

Checked by tests/python/test_fsdp.py (2, 3 and 4 ranks on gloo against one process with its
gradients all-reduced by hand; the gathered codes against the whole weight's cast, 3 ranks
splitting unevenly; bytes all-gathered).
"""
import torch
import torch.utils._pytree as pytree

import fp8kit

from .ops import cast

aten = torch.ops.aten

# The library recipes whose weight cast all-gathers in FP8 (the module's docstring says how).
FP8_ALL_GATHER_RECIPES = ("tensorwise", "block", "rowwise", "mxfp8")

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
        mine = w.shape[0]
        if self._recipe == "rowwise":
            # W^T's row amaxes (W's columns') all-reduced, appended to the shard as one more row:
            # each column's amax then is the whole weight's, and the shard's own rows cast as before.
            cols = w.detach().abs().amax(0).float() if mine else w.new_zeros(w.shape[1], dtype=torch.float32)
            torch.distributed.all_reduce(cols, torch.distributed.ReduceOp.MAX, group=mesh.get_group())
            codes, scale_inv, codes_t, scale_inv_t = cast(torch.cat([w.detach(), cols[None].to(w.dtype)]), "rowwise",
                                                          "weight", True)
            # W's row scales, 4 bytes a row, gathered beside FSDP2's all-gather: FSDP2 takes only
            # inputs of the shard's shape when the split is uneven.
            scales = _gather_rows(scale_inv[:mine], padded, 1.0, mesh)[:rows]
            return ((_pad_rows(codes[:mine], padded), _pad_rows(codes_t[:, :mine].t(), padded)),
                    (rows, scales, scale_inv_t))
        if self._recipe == "mxfp8":
            if padded % 32 != 0:  # every rank's test, so that all of them refuse
                raise fp8kit.Error(f"fp8kit.torch: layer '{self._layer}': FSDP2 gives each of {world} ranks up to "
                                   f"{padded} of its weight's {rows} rows; mxfp8's FP8 all-gather needs whole 32-row "
                                   "blocks of W^T per rank (ceil(out_features / ranks) a multiple of 32), or convert "
                                   "with enable_fsdp_float8_all_gather=False")
            codes, scale_inv, codes_t, scale_inv_t = cast(w.detach(), "mxfp8", "weight", True)
            # W's e8m0 scales [rows, K / 32] and W^T's [K, rows / 32] (its blocks' rows as W's
            # 32-row groups), gathered beside FSDP2's all-gather; 127 is e8m0's 1 (padding only).
            scales = _gather_rows(scale_inv, padded, 127, mesh)[:rows]
            scales_t = _gather_rows(scale_inv_t.t(), padded // 32, 127, mesh)[:-(-rows // 32)].t().contiguous()
            return (_pad_rows(codes, padded), _pad_rows(codes_t.t(), padded)), (rows, scales, scales_t)
        if rows % (128 * world) != 0:  # every rank's test, so that all of them refuse
            raise fp8kit.Error(f"fp8kit.torch: layer '{self._layer}': FSDP2 splits its weight's {rows} rows over "
                               f"{world} ranks; the block recipe's FP8 all-gather needs whole 128-row blocks per "
                               "rank (out_features a multiple of 128 x ranks), or convert with "
                               "enable_fsdp_float8_all_gather=False")
        codes, scale_inv = cast(w.detach(), "block", "weight", False)
        return (codes, scale_inv), (rows,)

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        """The gathered FP8 weight (Float8GatheredWeight), and the tensors FSDP2 frees after use."""
        transposed = None
        rows = metadata[0]
        if self._recipe == "tensorwise":
            (codes,), (_, scale_inv) = outputs, metadata
        elif self._recipe in ("rowwise", "mxfp8"):
            (codes, codes_t_rows), (_, scale_inv, scale_inv_t) = outputs, metadata
            transposed = (codes_t_rows[:rows], scale_inv_t)
        else:
            codes, scale_inv = outputs
        codes = codes[:rows]  # the padding rows of an uneven split dropped: a view, the gathered memory
        if out is not None:  # FSDP2 refilled the storage it gathers into: out takes the new views and metadata
            out._codes, out._scale_inv, out._transposed = codes, scale_inv, transposed
            return None
        return Float8GatheredWeight(codes, scale_inv, transposed, param_dtype), tuple(outputs)


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
    """The whole weight as FSDP2's all-gather leaves it: FP8 codes [out, in] and their scale_inv,
    as the recipe casts the weight, and W^T's cast where it is not theirs transposed (transposed:
    W^T's codes as W's rows [out, in], and W^T's scale_inv); to autograd and FSDP2 a parameter of
    dtype. The forward GEMM reads them as they are; weight_casts gives them to the layer."""

    @staticmethod
    def __new__(cls, codes, scale_inv, transposed, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, codes.size(), dtype=dtype, device=codes.device,
                                                   requires_grad=False)

    def __init__(self, codes, scale_inv, transposed, dtype):
        self._codes, self._scale_inv, self._transposed = codes, scale_inv, transposed

    __torch_function__ = torch._C._disabled_torch_function_impl

    # torch.compile traces through the subclass by its inner tensors (graph inputs, read afresh on
    # every call); without these it took the codes gathered at trace time as constants, and the
    # compiled forward ran on the first step's weights ever after.
    def __tensor_flatten__(self):
        return ["_codes", "_scale_inv"] + (["_codes_t", "_scale_inv_t"] if self._transposed else []), self.dtype

    @staticmethod
    def __tensor_unflatten__(inner, dtype, outer_size, outer_stride):
        transposed = (inner["_codes_t"], inner["_scale_inv_t"]) if "_codes_t" in inner else None
        return Float8GatheredWeight(inner["_codes"], inner["_scale_inv"], transposed, dtype)

    @property
    def _codes_t(self):
        return self._transposed[0]

    @property
    def _scale_inv_t(self):
        return self._transposed[1]

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        # FSDP2 and autograd only alias the parameter (detach; as_strided or view to its own
        # shape); anything else would read codes as values: refused.
        w = args[0]
        if func in (aten.detach.default, aten.alias.default) or (
                func in (aten.as_strided.default, aten.view.default) and list(args[1]) == list(w.shape)):
            return cls(w._codes, w._scale_inv, w._transposed, w.dtype)
        raise fp8kit.Error(f"fp8kit.torch: {func} on an FP8-gathered Float8Linear weight: only the layer's GEMMs "
                           "read it")

    def __repr__(self):
        return f"Float8GatheredWeight(shape={list(self.shape)}, dtype={self.dtype})"

    def weight_casts(self, transpose):
        """[codes, scale_inv] (+ [codes_t, scale_inv_t]): what the recipe's weight cast gives.
        Without a gathered W^T cast, W^T's is W's transposed: one scale (tensorwise), or 128x128
        blocks whose amax is the same transposed."""
        out = [self._codes, self._scale_inv]
        if transpose and self._transposed is None:
            out += [self._codes.t().contiguous(), self._scale_inv.t().contiguous()]
        elif transpose:
            out += [self._transposed[0].t().contiguous(), self._transposed[1]]
        return out


def shard_weight(linear, layer):
    """linear's (a Float8Linear's) weight made a Float8WeightShard, or fp8kit.Error naming the
    layer when its recipe's FP8 all-gather is not the whole weight's cast."""
    recipe = linear._casts.recipe  # the library's (rowwise_with_gw_hp casts its weight as rowwise)
    if recipe not in FP8_ALL_GATHER_RECIPES:
        raise fp8kit.Error(f"fp8kit.torch: layer '{layer}': enable_fsdp_float8_all_gather with recipe "
                           f"'{linear.config}': its amax history is each rank's own; FP8 all-gather takes "
                           f"tensorwise, rowwise, rowwise_with_gw_hp, block and mxfp8")
    w = linear.weight
    linear.weight = torch.nn.Parameter(Float8WeightShard(w.data, recipe, layer), requires_grad=w.requires_grad)


def precompute_float8_dynamic_scale_for_fsdp(module):
    """torchao's precompute_float8_dynamic_scale_for_fsdp: after the optimizer step, the amax of
    every tensorwise FP8-all-gathered Float8Linear weight of module (FSDP2-sharded) in one
    all-reduce (max); the all-gathers cast with it, instead of all-reducing one amax per layer,
    until the next call - so call it after every optimizer step. Same bits either way."""
    from torch.distributed.tensor import DTensor
    weights = [getattr(m, "weight", None) for m in module.modules()]
    shards = [w for w in weights if isinstance(w, DTensor) and isinstance(w._local_tensor, Float8WeightShard)
              and w._local_tensor._recipe == "tensorwise"]
    if not shards:
        return
    amaxes = torch.stack([_amax(w._local_tensor._tensor) for w in shards])
    torch.distributed.all_reduce(amaxes, torch.distributed.ReduceOp.MAX, group=shards[0].device_mesh.get_group())
    for w, amax in zip(shards, amaxes):
        w._local_tensor._amax = amax


# torch.load's weights_only unpickler (torch.distributed.checkpoint loads with it) takes the shard.
torch.serialization.add_safe_globals([Float8WeightShard])
