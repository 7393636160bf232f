"""tests/python/test_torch.py: fp8kit.torch - quantize_ and Float8InferenceLinear in PyTorch models.

Oracle: the float64 product of the dequantized operands - the activation quantized as the recipe
says (fp8kit.quantize, itself checked against numpy in test_package.py) and the weight's FP8 codes
times its scales - within the float32 sum bound of test_gemm.py (docs/NUMERICS.md). Then what a
PyTorch user relies on: torch.export and torch.compile trace the custom op, state_dict round trips
(and a loaded weight is repacked, not served stale), filters, dtypes and errors, and outputs that
torch.set_flush_denormal does not change.

Run by scripts/test.sh (pytest, on the package scripts/setup.sh installed into .venv).
"""
import copy
import io
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # fp8kit.torch is for torch users: without torch there is nothing to test
import fp8kit  # noqa: E402
import fp8kit.torch as f8  # noqa: E402
from test_gemm import U, bound  # noqa: E402  (the float32 sum bound)


def mlp(seed, width=96, hidden=160):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, width))


# Per recipe: the activation's and the weight's scaling (torchao's and DeepSeek-V3's meanings),
# and the weight's scale groups (rows, cols; None: the whole dimension).
# weight_only: the activation not quantized ("none": taken as two bfloat16 terms).
SCALINGS = {"rowwise": ("row", "row"), "tensorwise": ("tensor", "tensor"), "block": ("block(1x128)", "block(128x128)"),
            "mxfp8": ("mx32", "mx32"), "weight_only": ("none", "row")}
WEIGHT_GROUPS = {"rowwise": (1, None), "tensorwise": (None, None), "block": (128, 128), "mxfp8": (1, 32),
                 "weight_only": (1, None)}


def weight64(layer):
    """float64 values of a Float8InferenceLinear's weight: torch's decode of its codes times the scale_inv of
    each code's group (e8m0 codes e of mxfp8 stand for 2^(e - 127))."""
    n, k = layer.weight.shape
    gr, gc = WEIGHT_GROUPS[layer.recipe]
    scale = layer.weight_scale_inv
    scale = torch.exp2(scale.view(torch.uint8).double() - 127) if scale.dtype == torch.float8_e8m0fnu else scale.double()
    return layer.weight.double().numpy() * np.repeat(np.repeat(scale.numpy(), gr or n, 0), gc or k, 1)[:n, :k]


def bf16_terms(x):
    """float64 hi + lo of a float32 tensor: hi = bf16(x), lo = bf16(x - hi) (torch's roundings)."""
    hi = x.to(torch.bfloat16)
    return hi.double() + (x - hi.float()).to(torch.bfloat16).double()


def expected(layer, x, input_scaling):
    """float64 y = deq(quantize(x)) . deq(W)^T + b of one Float8InferenceLinear, with its bound; input
    scaling "none" (weight-only): x as hi + lo, its two bfloat16 terms rounded by torch (no element
    here is below the 2^-102 that fp8kit flushes)."""
    if input_scaling == "none":
        a64 = bf16_terms(torch.from_numpy(x)).numpy()
    else:
        a64 = fp8kit.dequantize(fp8kit.quantize(x, scaling=input_scaling)).astype(np.float64)
    b64 = weight64(layer)
    d64 = a64 @ b64.T
    tol = bound(a64, b64, d64)
    if layer.bias is not None:
        d64 = d64 + layer.bias.double().detach().numpy()
        tol = tol + 2 * U * np.abs(d64)
    return d64, tol


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise", "block", "mxfp8", "weight_only"])
def test_quantize_replaces_linears_and_matches_float64(recipe):
    model = mlp(1)
    x = torch.randn(2, 7, 96)  # [batch, tokens, width]: Float8InferenceLinear flattens the leading dims
    f8.quantize_(model, recipe)
    first, last = model[0], model[2]
    assert isinstance(first, f8.Float8InferenceLinear) and isinstance(last, f8.Float8InferenceLinear)
    scale_dtype = torch.float8_e8m0fnu if recipe == "mxfp8" else torch.float32  # mx: e8m0 codes, as OCP MX
    assert first.weight.dtype == torch.float8_e4m3fn and first.weight_scale_inv.dtype == scale_dtype
    assert (first.input_scaling, first.weight_scaling) == SCALINGS[recipe]
    with torch.no_grad():
        y = model(x)
        h = torch.nn.functional.gelu(first(x))
    assert y.shape == (2, 7, 96) and y.dtype == torch.float32
    want, tol = expected(last, h.reshape(-1, 160).numpy(), SCALINGS[recipe][0])
    got = y.reshape(-1, 96).double().numpy()
    assert np.all(np.abs(got - want) <= tol)
    # The nearest wrong answer: the same layer without its bias breaks the bound.
    assert np.any(np.abs(got - (want - last.bias.double().detach().numpy())) > tol)


def test_weight_only_takes_x_as_two_bfloat16_terms_and_quantizes_nothing_else():
    # weight_only's y within the bound of (hi + lo) . deq(W)^T, and not of x as one bfloat16, nor
    # of x quantized to e4m3 rowwise: K = 96 sums of one bfloat16's rounding (2^-9 relative) stand
    # ~17x above the float32 bound, and e4m3's far more.
    model = mlp(11)
    f8.quantize_(model, "weight_only")
    x = torch.randn(9, 96)
    with torch.no_grad():
        got = model[0](x).double().numpy()
    want, tol = expected(model[0], x.numpy(), "none")
    assert np.all(np.abs(got - want) <= tol)
    for wrong in ("bfloat16", "row"):
        a64 = (x.to(torch.bfloat16).double().numpy() if wrong == "bfloat16"
               else fp8kit.dequantize(fp8kit.quantize(x.numpy(), scaling="row")))
        w = a64 @ weight64(model[0]).T + model[0].bias.double().detach().numpy()
        assert np.any(np.abs(got - w) > tol), wrong
    # bfloat16 x is taken as it is (its lo is zero): the same float32 sums as for the float32 x
    # of equal values, rounded once to y's bfloat16 (torch's rounding of the float32 y, nearest even).
    xb = x.to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(model[0](xb), model[0](xb.float()).to(torch.bfloat16))


def test_weight_only_is_torchaos_float8_weight_only():
    # The same weights as torchao's quantize_(Float8WeightOnlyConfig()): e4m3 codes bit for bit,
    # scales within one float32 rounding (torchao divides amax by 448, fp8kit inverts 448 / amax),
    # and the output's SQNR against float64 at or above torchao's (float32 x and matmul): x's
    # hi + lo leaves at most 2^-17 of each element (-110 dB) and a scale's rounding 2^-24, which
    # move an SQNR of 32 dB (e4m3's noise) by < 1e-6 dB; 1e-4 allowed for the float32 sums'
    # order. The nearest wrong answers fall below: x as one bfloat16 (-59 dB of noise: 0.01-0.03
    # dB), the rowwise recipe's dynamic e4m3 activations (3 dB).
    ao = pytest.importorskip("torchao.quantization")
    torch.manual_seed(12)
    linear = torch.nn.Linear(512, 160)
    ours, theirs = torch.nn.Sequential(copy.deepcopy(linear)), torch.nn.Sequential(copy.deepcopy(linear))
    f8.quantize_(ours, "weight_only")
    ao.quantize_(theirs, ao.Float8WeightOnlyConfig())
    tw = theirs[0].weight
    assert torch.equal(ours[0].weight.view(torch.uint8), tw.qdata.view(torch.uint8))
    assert torch.allclose(ours[0].weight_scale_inv, tw.scale.reshape(-1, 1), rtol=2 ** -23, atol=0)
    x = torch.randn(32, 512)
    ref = x.double() @ linear.weight.double().T + linear.bias.double()

    def sqnr(y):
        return 10 * np.log10(ref.pow(2).sum().item() / (y.double() - ref).pow(2).sum().item())
    with torch.no_grad():
        s_ours, s_theirs = sqnr(ours(x)), sqnr(theirs(x))
        f8.quantize_(rowwise := torch.nn.Sequential(copy.deepcopy(linear)), "rowwise")
        s_rowwise = sqnr(rowwise(x))
        s_one_term = sqnr(ours(x.to(torch.bfloat16).float()))
    assert s_ours >= s_theirs - 1e-4, (s_ours, s_theirs)
    assert s_one_term < s_theirs - 1e-3, (s_one_term, s_theirs)
    assert s_rowwise < s_theirs - 1.0


def test_torchaos_config_objects_pick_the_same_recipe():
    # quantize_ takes torchao's own config objects, as torchao's quantize_ does: each gives the
    # recipe of the same name's layers (same buffers, same output bit for bit); what fp8kit cannot
    # run as asked is refused, naming it, rather than run as something else.
    ao = pytest.importorskip("torchao.quantization")
    cases = [(ao.Float8DynamicActivationFloat8WeightConfig(), "tensorwise"),
             (ao.Float8DynamicActivationFloat8WeightConfig(granularity=ao.PerRow()), "rowwise"),
             (ao.Float8DynamicActivationFloat8WeightConfig(
                 granularity=[ao.PerBlock([1, 128]), ao.PerBlock([128, 128])]), "block"),
             (ao.Float8WeightOnlyConfig(), "weight_only")]
    x = torch.randn(5, 96)
    for config, recipe in cases:
        ours, named = mlp(13), mlp(13)
        f8.quantize_(ours, config)
        f8.quantize_(named, recipe)
        assert ours[0].recipe == recipe and ours[2].recipe == recipe
        with torch.no_grad():
            assert torch.equal(ours(x), named(x))
    for bad, needle in [(ao.Float8DynamicActivationFloat8WeightConfig(weight_dtype=torch.float8_e5m2), "e5m2"),
                        (ao.Float8WeightOnlyConfig(weight_dtype=torch.float8_e5m2), "e5m2"),
                        (ao.Float8DynamicActivationFloat8WeightConfig(activation_value_ub=100.0), "activation_value"),
                        (ao.Int8WeightOnlyConfig(), "Int8WeightOnlyConfig")]:
        with pytest.raises(fp8kit.Error, match=needle):
            f8.quantize_(mlp(14), bad)


def test_bfloat16_in_bfloat16_out_and_the_weight_quantized_once():
    model = mlp(2)
    f8.quantize_(model)
    x = torch.randn(5, 96).to(torch.bfloat16)
    with torch.no_grad():
        y = model(x)
        assert y.dtype == torch.bfloat16
        fused = model[0].weight._fp8kit_fused[1][0]
        model(x)
    assert model[0].weight._fp8kit_fused[1][0] is fused  # packed once, reused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_layout_of_x_gives_the_rows_result(dtype):
    # Contiguous x of any rank goes to the extension by address ([M, K] rows, M the leading
    # dimensions' product; test_quantize_replaces_linears_and_matches_float64 holds those rows to
    # float64); strided x through an array view. Each layout must give the same rows bit for bit:
    # a wrong M, a reshape in the wrong order or a strided x read as if contiguous would not.
    model = mlp(11)
    f8.quantize_(model)
    layer = model[0]
    x = torch.randn(6, 96).to(dtype)
    with torch.no_grad():
        rows = layer(x)
        assert rows.shape == (6, 160) and rows.dtype == dtype
        assert torch.equal(layer(x.reshape(2, 3, 96)), rows.reshape(2, 3, 160))
        assert torch.equal(layer(x[4]), rows[4])  # one vector: [96] -> [160]
        strided = x.t().contiguous().t()  # the same values, column-major
        assert not strided.is_contiguous() and torch.equal(layer(strided), rows)
        swapped = x.reshape(2, 3, 96).transpose(0, 1)  # [3, 2, 96], rows out of memory order
        assert torch.equal(layer(swapped), rows.reshape(2, 3, 160).transpose(0, 1))
        assert not torch.equal(layer(x.flip(0)), rows)  # the test tells rows apart


def test_the_address_entry_checks_what_it_can():
    # FusedLinear.call_into trusts fp8kit.torch for contiguity, but not for K, the dtype index or
    # a null address: each is an fp8kit.Error naming it, and y is left as it was.
    model = mlp(12)
    f8.quantize_(model)
    x, y = torch.randn(1, 96), torch.zeros(1, 160)
    with torch.no_grad():
        model[0](x)
    fused = model[0].weight._fp8kit_fused[1][0]
    with pytest.raises(fp8kit.Error, match=r"\[1, 95\].*\[M, 96\]"):
        fused.call_into(x.data_ptr(), 1, 95, 0, y.data_ptr())
    with pytest.raises(fp8kit.Error, match="dtype is 3.*0, 1 or 2"):
        fused.call_into(x.data_ptr(), 1, 96, 3, y.data_ptr())
    with pytest.raises(fp8kit.Error, match="null"):
        fused.call_into(0, 1, 96, 0, y.data_ptr())
    assert torch.count_nonzero(y) == 0
    fused.call_into(x.data_ptr(), 1, 96, 0, y.data_ptr())
    assert torch.equal(y, model[0](x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_call_each_writes_each_layers_output_to_its_own_tensor(dtype):
    # What siblings call: the GEMMs of several layers on one x, layer i's D at outs[i]. Three rows
    # and unequal widths (k's and v's alike in shape): an output written with another layer's
    # width, or from another layer, differs from that layer's call_into (the oracle, itself held
    # to float64 above). Every layer is checked before the first GEMM: a bad one writes nothing.
    torch.manual_seed(5)
    layers = [f8.ops._fused_linear(fp8kit.quantize(torch.randn(n, 96), "e4m3fn", "row"), "row", None)
              for n in (40, 8, 8)]
    x = torch.randn(3, 96, dtype=dtype)
    index = f8.ops._OUT_DTYPES[dtype][1]
    want = [torch.empty(3, n, dtype=dtype) for n in (40, 8, 8)]
    for f, d in zip(layers, want):
        f.call_into(x.data_ptr(), 3, 96, index, d.data_ptr())
    outs = [torch.zeros(3, n, dtype=dtype) for n in (40, 8, 8)]
    addresses = [p.data_ptr() for p in outs]
    with pytest.raises(fp8kit.Error, match="2 outputs for 3 layers"):
        fp8kit._fp8kit.call_each(layers, x.data_ptr(), 3, 96, index, addresses[:2])
    with pytest.raises(fp8kit.Error, match=r"\[3, 95\].*\[M, 96\]"):
        fp8kit._fp8kit.call_each(layers, x.data_ptr(), 3, 95, index, addresses)
    with pytest.raises(fp8kit.Error, match="dtype is 3"):
        fp8kit._fp8kit.call_each(layers, x.data_ptr(), 3, 96, 3, addresses)
    wide = f8.ops._fused_linear(fp8kit.quantize(torch.randn(8, 64), "e4m3fn", "row"), "row", None)
    with pytest.raises(fp8kit.Error, match=r"\[3, 96\].*\[M, 64\]"):
        fp8kit._fp8kit.call_each(layers + [wide], x.data_ptr(), 3, 96, index, addresses + [addresses[0]])
    assert all(torch.count_nonzero(p) == 0 for p in outs)
    fp8kit._fp8kit.call_each(layers, x.data_ptr(), 3, 96, index, addresses)
    assert all(torch.equal(o, w) for o, w in zip(outs, want))
    assert not torch.equal(want[1], want[2])  # the test tells the two 8-wide layers apart


def test_export_and_compile_trace_the_custom_op():
    model = mlp(3)
    f8.quantize_(model)
    x = torch.randn(4, 96)
    with torch.no_grad():
        eager = model(x)  # plain eager calls skip the operator's dispatch: the same bytes through it
        first = model[0]
        through_op = torch.ops.fp8kit.linear(x, first.weight, first.weight_scale_inv, first.bias, "row", "row")
        assert torch.equal(first(x), through_op)
        exported = torch.export.export(model, (x,))
        assert "fp8kit.linear" in str(exported.graph)
        assert torch.equal(exported.module()(x), eager)
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        assert torch.equal(compiled(x), eager)


def test_compile_with_an_input_that_requires_grad_refuses_only_the_backward():
    """A model called without no_grad (a norm's weight requires grad, so the Linear's input does):
    torch.compile traces the backward with the forward, which must compile and give eager's output;
    the backward is refused when it runs, eager and compiled alike, as an fp8kit.Error."""
    model = torch.nn.Sequential(torch.nn.LayerNorm(96), *mlp(6))
    f8.quantize_(model)
    x = torch.randn(4, 96)
    eager = model(x)
    assert eager.requires_grad
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    y = compiled(x)
    assert torch.equal(y, eager)
    for out in (eager, y):
        with pytest.raises(fp8kit.Error, match="is an inference layer .* it has no backward"):
            out.sum().backward()


@pytest.mark.parametrize("recipe,scale_shape,scale_dtype", [("rowwise", (160, 1), torch.float32),
                                                            ("mxfp8", (160, 3), torch.float8_e8m0fnu)])
def test_state_dict_round_trip_repacks_the_loaded_weight(recipe, scale_shape, scale_dtype):
    source, target = mlp(4), mlp(5)
    f8.quantize_(source, recipe)
    f8.quantize_(target, recipe)
    x = torch.randn(3, 96)
    with torch.no_grad():
        stale = target(x)  # packs target's own weights
        buffer = io.BytesIO()
        torch.save(source.state_dict(), buffer)
        buffer.seek(0)
        state = torch.load(buffer)
        assert state["0.weight"].dtype == torch.float8_e4m3fn
        assert state["0.weight_scale_inv"].shape == scale_shape and state["0.weight_scale_inv"].dtype == scale_dtype
        target.load_state_dict(state)
        assert torch.equal(target(x), source(x))  # the loaded weight, not the packed stale one
        assert not torch.equal(stale, source(x))


def _nan_at(codes, flat):
    bits = codes.view(torch.uint8).clone()
    bits.view(-1)[flat] = 0x7F  # e4m3fn's NaN
    return bits.view(codes.dtype)


@pytest.mark.parametrize("recipe,key,change,needle", [
    ("rowwise", "weight", lambda t: t.view(torch.uint8), r"'0.weight' is torch.uint8, but the layer holds "
     r"torch.float8_e4m3fn codes"),
    ("rowwise", "weight", lambda t: t.float().to(torch.float8_e5m2), "'0.weight' is torch.float8_e5m2"),
    ("rowwise", "weight", lambda t: _nan_at(t, 96 + 5), r"'0.weight' holds a code that is not a number at \[1, 5\]"),
    ("rowwise", "weight_scale_inv", lambda t: t.index_fill(0, torch.tensor([3]), 0.0),
     r"'0.weight_scale_inv' holds 0.0 at \[3, 0\]: a scale is finite and positive"),
    ("rowwise", "weight_scale_inv", lambda t: -t, r"'0.weight_scale_inv' holds -.* at \[0, 0\]"),
    ("tensorwise", "weight_scale_inv", lambda t: t * float("nan"), r"'0.weight_scale_inv' holds nan at \[0, 0\]"),
    ("rowwise", "weight_scale_inv", lambda t: t.int(), "'0.weight_scale_inv' is torch.int32"),
    ("mxfp8", "weight_scale_inv", lambda t: t.view(torch.uint8).clone().fill_(0xFF).view(torch.float8_e8m0fnu),
     r"'0.weight_scale_inv' holds nan"),
    # Finite, but times 448 past float32's 3.4e38: the weights would dequantize to Inf.
    ("rowwise", "weight_scale_inv", lambda t: t.index_fill(0, torch.tensor([2]), 1e36),
     r"'0.weight_scale_inv' holds 1e\+36 at \[2, 0\]: times the codes' largest magnitude \(448\) that is beyond float32"),
    ("mxfp8", "weight_scale_inv", lambda t: t.view(torch.uint8).clone().fill_(254).view(torch.float8_e8m0fnu),
     r"'0.weight_scale_inv' holds 1.70141\d*e\+38 at \[0, 0\]: times the codes' largest magnitude \(448\)"),
])
def test_load_state_dict_refuses_codes_and_scales_it_would_change(recipe, key, change, needle):
    # torch's load_state_dict copies by value: uint8 codes would load as numbers, e5m2 codes
    # saturated into e4m3fn; a zero, negative, NaN or overflowing scale (or a NaN code) would make
    # other weights.
    # Each is refused naming the key, and the layer computes as before (the nearest wrong answer, a
    # silent load, changes its output or raises nothing).
    source, target = mlp(33), mlp(34)
    f8.quantize_(source, recipe)
    f8.quantize_(target, recipe)
    state = source.state_dict()
    state["0." + key] = change(state["0." + key])
    x = torch.randn(2, 96)
    with torch.no_grad():
        before = target(x)
        with pytest.raises(fp8kit.Error, match="Float8InferenceLinear.load_state_dict: " + needle):
            target.load_state_dict(state)
        assert torch.equal(target(x), before)


def test_a_scale_or_bias_assigned_anew_is_not_served_stale():
    # The packed weight is cached on the weight tensor and keyed by version counters; a scale or a
    # bias replaced by another tensor (not written in place) must be repacked all the same. Oracle:
    # a copy of the layer, which packs afresh.
    model = mlp(13)
    f8.quantize_(model)
    layer = model[0]
    x = torch.randn(2, 96)
    with torch.no_grad():
        before = layer(x)
        layer.weight_scale_inv = layer.weight_scale_inv * 2
        assert torch.equal(layer(x), copy.deepcopy(layer)(x)) and not torch.equal(layer(x), before)
        before = layer(x)
        layer.bias = torch.nn.Parameter(layer.bias + 1, requires_grad=False)
        assert torch.equal(layer(x), copy.deepcopy(layer)(x)) and not torch.equal(layer(x), before)
        # New data given through .data (Hugging Face's init code writes so): the tensor and its
        # version counter stay, its data pointer moves.
        for tensor in (layer.weight_scale_inv, layer.bias):
            before = layer(x)
            tensor.data = tensor * 3
            assert torch.equal(layer(x), copy.deepcopy(layer)(x)) and not torch.equal(layer(x), before)


def test_load_state_dict_with_assign_takes_what_a_copying_load_takes():
    # assign=True puts the given tensors in the layer's place as they are: a bfloat16 scale, a
    # float64 bias or non-contiguous codes would leave a layer every forward refuses (before: each
    # forward raised, and so did a later copying load). Oracle: the same state loaded by copying
    # into a second layer, whose copy_ converts them.
    source, assigned, copied = mlp(35), mlp(36), mlp(37)
    for m in (source, assigned, copied):
        f8.quantize_(m)
    state = source.state_dict()
    state["0.weight_scale_inv"] = state["0.weight_scale_inv"].bfloat16().float().bfloat16()
    state["0.bias"] = state["0.bias"].double()
    state["0.weight"] = state["0.weight"].t().contiguous().t()  # the same codes, column-major
    assert not state["0.weight"].is_contiguous()
    x = torch.randn(2, 96)
    with torch.no_grad():
        assigned.load_state_dict(state, assign=True)
        copied.load_state_dict(state)
        assert assigned[0].weight_scale_inv.dtype == torch.float32 and assigned[0].bias.dtype == torch.float32
        assert torch.equal(assigned(x), copied(x)) and not torch.equal(assigned(x), mlp(36)(x))
        before = assigned(x)
        meta = dict(state, **{"0.weight_scale_inv": state["0.weight_scale_inv"].to("meta")})
        with pytest.raises(fp8kit.Error, match="'0.weight_scale_inv' is on the meta device"):
            assigned.load_state_dict(meta, assign=True)
        assert torch.equal(assigned(x), before)


def test_filter_fn_picks_layers_by_name():
    model = mlp(6)
    f8.quantize_(model, filter_fn=lambda m, fqn: fqn == "2")
    assert type(model[0]) is torch.nn.Linear and isinstance(model[2], f8.Float8InferenceLinear)


@pytest.mark.parametrize("call,needle", [
    (lambda m: f8.quantize_(m, "mxfp4"), "mxfp4"),
    (lambda m: f8.quantize_(torch.nn.Linear(4, 4)), "itself an nn.Linear"),
    (lambda m: (f8.quantize_(m), m(torch.randn(2, 96, dtype=torch.float64))), "float64"),
    (lambda m: (f8.quantize_(m), m(torch.randn(2, 95))), r"\[2, 95\].*in_features 96"),
    (lambda m: (f8.quantize_(m), setattr(m[0], "activation", "relu"), m(torch.randn(2, 96))),
     "Float8InferenceLinear: activation is 'relu'"),
    # a meta input runs the operator's meta kernel (its fake): refused there, not given a meta y
    (lambda m: (f8.quantize_(m), m(torch.randn(2, 96, device="meta"))),
     "the input is on device 'meta', the weight on device 'cpu'"),
    # (an input that requires grad: the call goes through the operator, whose meta kernel is its fake)
    (lambda m: (f8.quantize_(m), m(torch.randn(2, 96, device="meta", requires_grad=True))),
     "the input is on device 'meta', the weight on device 'cpu'"),
    # formats the GEMM takes no weight in: refused at construction, the name shown escaped
    (lambda m: f8.Float8InferenceLinear(4, 4, format="e8m0fnu"), "format 'e8m0fnu', expected 'e4m3fn' or 'e5m2'"),
    (lambda m: f8.Float8InferenceLinear(4, 4, format="\x1b[31m"), r"format '\\x1b\[31m'"),
    # a config that is falsy but not None is refused, not taken as the default (before: rowwise)
    (lambda m: f8.quantize_(m, ""), "quantize_: config '', expected one of"),
    (lambda m: f8.quantize_(m, False), "quantize_: config of type bool"),
    (lambda m: f8.convert_to_float8_training(m, config=0), "convert_to_float8_training: config 0, expected one of"),
    # Diffusers' skip arguments: a pattern that is no regular expression, classes not a tuple
    (lambda m: f8.enable_layerwise_casting(m, skip_modules_pattern="(["),
     r"skip_modules_pattern '\(\[' is not a regular expression"),
    (lambda m: f8.enable_layerwise_casting(m, skip_modules_pattern=5), "skip_modules_pattern is '5', expected"),
    (lambda m: f8.enable_layerwise_casting(m, skip_modules_classes=torch.nn.Linear),
     "skip_modules_classes is .*, expected a tuple of module classes"),
    (lambda m: f8.enable_layerwise_casting(m, skip_modules_classes=("Linear",)),
     "skip_modules_classes is .*, expected a tuple of module classes"),
])
def test_bad_use_raises_fp8kit_error_naming_it(call, needle):
    with pytest.raises(fp8kit.Error, match=needle):
        call(mlp(7))


CONVERSIONS = {"quantize_": f8.quantize_, "convert_to_float8_training": f8.convert_to_float8_training,
               "enable_layerwise_casting": f8.enable_layerwise_casting}


@pytest.mark.parametrize("conversion", list(CONVERSIONS))
def test_a_linear_held_at_two_places_is_converted_once(conversion):
    # One nn.Linear reused (at a and in b): before, quantize_ and convert_to_float8_training
    # converted only the first name (b.0 kept computing in high precision) and layerwise casting
    # made two FP8 layers, each packing the weight. Now one new module at both places, called as
    # the model calls it: the outputs those of a model converted without the reuse.
    class Reuse(torch.nn.Module):
        def __init__(self, shared):
            super().__init__()
            self.a = torch.nn.Linear(96, 96)
            self.b = torch.nn.Sequential(self.a if shared else copy.deepcopy(self.a))

        def forward(self, x):
            return self.b(self.a(x))

    torch.manual_seed(41)
    model = Reuse(True)
    twin = Reuse(False)
    twin.a.load_state_dict(model.a.state_dict())
    twin.b[0].load_state_dict(model.a.state_dict())
    for m in (model, twin):
        CONVERSIONS[conversion](m)
    assert model.a is model.b[0] and type(model.a) is type(twin.a) is not torch.nn.Linear
    x = torch.randn(4, 96)
    with torch.no_grad():
        assert torch.equal(model(x), twin(x))


@pytest.mark.parametrize("conversion", list(CONVERSIONS))
@pytest.mark.parametrize("bad,needle", [
    (lambda: torch.nn.Linear(96, 96).double(), "has torch.float64 weights"),
    (lambda: torch.nn.Linear(96, 96, device="meta"), "has its weights on device 'meta'"),
    (lambda: torch.nn.Linear(96, 96).to(torch.float8_e4m3fn), "holds torch.float8_e4m3fn weights already"),
])
def test_a_bad_layer_is_refused_before_any_layer_is_converted(conversion, bad, needle):
    # Every chosen layer is checked before the first is replaced: the last layer is bad, and the
    # error names it while the layers before it are still the model's own - the same modules holding
    # the same Parameters (a check inside the replacement loop would have converted layer 0 first).
    # (The training conversion takes a model on meta: test_training.py.)
    if conversion == "convert_to_float8_training" and "meta" in needle:
        model = torch.nn.Sequential(*mlp(31), bad())
        CONVERSIONS[conversion](model)
        assert all(type(model[i]) is f8.Float8Linear for i in (0, 2, 3)) and model[3].weight.is_meta
        return
    model = torch.nn.Sequential(*mlp(31), bad())
    before = [(m, m.weight if hasattr(m, "weight") else None) for m in model]
    with pytest.raises(fp8kit.Error, match=f"fp8kit.torch.{conversion}: layer '3' " + needle):
        CONVERSIONS[conversion](model)
    assert [(m, getattr(m, "weight", None)) for m in model] == before


@pytest.mark.parametrize("conversion,kwargs", [("quantize_", {}), ("enable_layerwise_casting", {}),
                                               ("enable_layerwise_casting", {"scaled": False})])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_non_finite_weight_is_refused_before_any_layer_is_converted(conversion, kwargs, value):
    # FP8 stores no Inf: torch's unscaled cast (Diffusers' storage, scaled=False) would keep an Inf
    # weight as +-448, a number where the bf16 model computes Inf, and a scaled cast makes the row
    # NaN. A non-finite weight - and a NaN - is refused, naming the layer and the element, while the
    # layers before it are still the model's own (the nearest wrong answer, converting, raises
    # nothing; a check inside the replacement loop would have replaced layer 0 first).
    model = torch.nn.Sequential(*mlp(31), torch.nn.Linear(96, 96)).to(torch.bfloat16)
    with torch.no_grad():
        model[3].weight[5, 7] = value
    before = [(m, m.weight if hasattr(m, "weight") else None) for m in model]
    with pytest.raises(fp8kit.Error, match=rf"fp8kit.torch.{conversion}: layer '3' weight holds {value} at \[5, 7\]"):
        CONVERSIONS[conversion](model, **kwargs)
    assert [(m, getattr(m, "weight", None)) for m in model] == before


def test_a_non_finite_parameter_of_a_layer_cast_as_diffusers_casts_is_refused():
    # enable_layerwise_casting stores a convolution as Diffusers does, its parameters cast to FP8
    # as they are (an Inf bias would become 448): refused too, by name, the weights as they were.
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Conv1d(4, 4, 3)).to(torch.bfloat16)
    with torch.no_grad():
        model[1].bias[2] = math.inf
    with pytest.raises(fp8kit.Error, match=r"enable_layerwise_casting: '1.bias' holds inf at \[2\]"):
        f8.enable_layerwise_casting(model)
    assert type(model[0]) is torch.nn.Linear and model[1].weight.dtype == torch.bfloat16


@pytest.mark.parametrize("conversion", list(CONVERSIONS))
def test_a_linear_without_weights_is_left_as_it_is(conversion):
    # nn.Linear(96, 0) and (0, 96) hold nothing to compute in FP8: they stay nn.Linear - their
    # outputs torch's, an empty y and the bias; enable_layerwise_casting upcasts them per forward as
    # Diffusers does (its report's `cast`) - and the layer with weights beside them is converted.
    torch.manual_seed(32)
    model = torch.nn.Sequential(torch.nn.Linear(96, 0), torch.nn.Linear(0, 96), torch.nn.Linear(96, 96))
    bias = model[1].bias.detach().clone()
    report = CONVERSIONS[conversion](model)
    assert type(model[0]) is torch.nn.Linear and type(model[1]) is torch.nn.Linear
    assert type(model[2]) is not torch.nn.Linear
    if conversion == "enable_layerwise_casting":
        assert report.cast == ["0", "1"] and report.native == ["2"]
        return
    x = torch.randn(2, 96)
    assert model[0](x).shape == (2, 0)
    assert torch.equal(model[1](x[:, :0]), bias.expand(2, 96))


# ---- the packed weight as the codes' only copy (Float8InferenceLinear.release_codes) ----

@pytest.mark.parametrize("recipe", list(SCALINGS))
def test_quantize_holds_each_weight_once_and_reads_its_codes_back(recipe, tmp_path):
    # After quantize_ the buffer `weight` is a stand-in over one byte: the packed weight holds the
    # codes alone. Oracle: the layers from_linear makes of the same Linears, which keep their codes.
    # Whatever needs the codes as a tensor gets them bit for bit; the nearest wrong answers - codes
    # kept beside the packing, codes read back in another order, a stand-in served to a consumer
    # (its codes all NaN) - fail the storage checks, the byte comparisons, or the outputs.
    safetensors = pytest.importorskip("safetensors.torch")
    model = mlp(21)
    kept = torch.nn.Sequential(*(f8.Float8InferenceLinear.from_linear(m, recipe) if i != 1 else m
                                 for i, m in enumerate(model)))
    f8.quantize_(model, recipe)
    x = torch.randn(3, 96)
    released = lambda m: all(m[i]._buffers["weight"].untyped_storage().nbytes() == 1 for i in (0, 2))  # noqa: E731
    assert released(model)
    with torch.no_grad():
        want = kept(x)
        assert torch.equal(model(x), want)
        state = model.state_dict()
        for i in (0, 2):
            assert state[f"{i}.weight"].device.type == "cpu"
            assert torch.equal(state[f"{i}.weight"].view(torch.uint8), kept[i]._buffers["weight"].view(torch.uint8))
        safetensors.save_file(state, tmp_path / "m.safetensors")  # real memory, as transformers saves it
        assert torch.equal(safetensors.load_file(tmp_path / "m.safetensors")["2.weight"].view(torch.uint8),
                           kept[2]._buffers["weight"].view(torch.uint8))
        for made in (copy.deepcopy(model), torch.load(io.BytesIO(_saved(model)), weights_only=False)):
            assert released(made) and torch.equal(made(x), want)  # released again, from the codes copied
        other = mlp(22)
        f8.quantize_(other, recipe)
        other.load_state_dict(state)
        assert released(other) and torch.equal(other(x), want)  # the loaded codes, packed and released
        model.to("cpu")
        assert released(model) and torch.equal(model(x), want)
        exported = torch.export.export(model, (x,))
        assert torch.equal(exported.module()(x), want)
        assert torch.equal(torch.compile(model, backend="aot_eager", fullgraph=True)(x), want)
        assert released(model)  # compiled calls take the packed weight from the stand-in
        assert torch.equal(model[0].weight.view(torch.uint8), kept[0]._buffers["weight"].view(torch.uint8))
        assert not released(model)  # read through .weight: the buffer holds them again
        assert torch.equal(model(x), want)


def test_a_dtype_cast_of_the_model_keeps_the_fp8_weights():
    # model.to(torch.bfloat16) after quantize_ (a float32 model run on bfloat16 activations): torch
    # casts every floating buffer, and FP8 codes are floating - cast, they would be read as values
    # (the layer failed at its next call). The codes and their float32 scales keep their dtypes and
    # bits; the bias takes the cast. Oracle: the from_linear layer with its bias cast by hand.
    model = mlp(23)
    kept = f8.Float8InferenceLinear.from_linear(model[0])
    kept.bias = torch.nn.Parameter(kept.bias.detach().to(torch.bfloat16), requires_grad=False)
    f8.quantize_(model)
    model.to(torch.bfloat16)
    layer = model[0]
    assert layer.weight_scale_inv.dtype == torch.float32 and layer.bias.dtype == torch.bfloat16
    assert torch.equal(layer.weight_scale_inv, kept.weight_scale_inv)
    assert layer._buffers["weight"].untyped_storage().nbytes() == 1  # released again, on the host
    x = torch.randn(5, 96).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(x), kept(x))
    assert torch.equal(layer.weight.view(torch.uint8), kept.weight.view(torch.uint8))


def _saved(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return buffer.getvalue()


# ---- siblings: Linear layers called in a row on one input run in one call (fp8kit.torch.siblings) ----

class Attention(torch.nn.Module):
    """q, k and v on one input, o on another - as transformers' attention calls its projections."""

    def __init__(self, d=256, kv=128):
        super().__init__()
        self.q, self.k, self.v = torch.nn.Linear(d, d), torch.nn.Linear(d, kv), torch.nn.Linear(d, kv)
        self.o = torch.nn.Linear(d, d)

    def forward(self, x):
        return self.o(self.q(x) + torch.cat([self.k(x), self.v(x)], -1))


def fused_and_alone(recipe, seed):
    """The same Attention quantized with and without fuse_siblings."""
    torch.manual_seed(seed)
    fused = Attention()
    alone = copy.deepcopy(fused)
    f8.quantize_(fused, recipe)
    f8.quantize_(alone, recipe, fuse_siblings=False)
    return fused, alone


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise", "block", "mxfp8", "weight_only"])
def test_siblings_on_one_input_run_in_one_call_with_each_layers_own_output(recipe):
    # The oracle: each layer computing alone (itself held to float64 above). Each output is its
    # layer's own GEMM, so it must be equal bit for bit; an output served to the wrong layer (k's and
    # v's have one shape) or computed with another layer's weight or scale would not be.
    fused, alone = fused_and_alone(recipe, 20)
    group = fused.q._siblings[0]
    assert fused.o._siblings[0] is group and alone.q._siblings is None
    with torch.no_grad():
        fused(torch.randn(1, 256))  # the first pass sees the run (q, k, v on one x)
        assert group.plan == {0: (0, 1, 2)}
        for rows in (1, 5, 16, 17, 2):
            x = torch.randn(rows, 256)
            got = [fused.q(x), fused.k(x), fused.v(x)]
            ran_as_one = group.stash is not None and group.stash[0][0]() is x
            assert ran_as_one == (rows <= 16)  # more rows: compute-bound, each layer alone
            if ran_as_one:
                assert group.stash[1] == {}  # k and v were served their parts
            for y, want in zip(got, (alone.q(x), alone.k(x), alone.v(x))):
                assert y.is_contiguous() and torch.equal(y, want)
            assert torch.equal(fused.o(got[0]), alone.o(got[0]))
        assert not torch.equal(alone.k(x), alone.v(x))  # the test tells k's part from v's


def test_a_sibling_never_gets_a_stale_part():
    fused, alone = fused_and_alone("rowwise", 21)
    group = fused.q._siblings[0]

    def q_runs_the_gemm(x):
        fused(torch.randn(1, 256))  # a plain pass: the run (q, k, v) is planned again
        assert group.plan[0] == (0, 1, 2)
        fused.q(x)
        assert group.stash[0][0]() is x and set(group.stash[1]) == {1, 2}

    with torch.no_grad():
        # x written in place after q's GEMM: k and v compute alone, on the new x.
        x = torch.randn(1, 256)
        q_runs_the_gemm(x)
        x.mul_(2)
        assert torch.equal(fused.k(x), alone.k(x)) and torch.equal(fused.v(x), alone.v(x))
        # k's weight reloaded after q's GEMM: k computes with the weight it has now.
        x = torch.randn(1, 256)
        q_runs_the_gemm(x)
        fused.k.load_state_dict(alone.v.state_dict())
        assert torch.equal(fused.k(x), alone.v(x)) and not torch.equal(alone.k(x), alone.v(x))
        assert torch.equal(fused.v(x), alone.v(x))
        # and the next call runs the reloaded weight: the output it computed for k is right
        x = torch.randn(1, 256)
        q_runs_the_gemm(x)
        assert torch.equal(group.stash[1][1][0], alone.v(x))
        assert torch.equal(fused.k(x), alone.v(x)) and group.stash[1].keys() == {2}
        # k's scale given new data through .data after q's GEMM (no version counter moves): k
        # computes with the scale it has now.
        x = torch.randn(1, 256)
        q_runs_the_gemm(x)
        fused.k.weight_scale_inv.data = fused.k.weight_scale_inv * 2
        y = fused.k(x)
        assert torch.equal(y, copy.deepcopy(fused.k)(x)) and not torch.equal(y, alone.v(x))
        assert torch.equal(fused.v(x), alone.v(x))
        fused.k.load_state_dict(alone.v.state_dict())
        # k called on another tensor: not served q's GEMM's part for x
        x, other = torch.randn(1, 256), torch.randn(1, 256)
        q_runs_the_gemm(x)
        assert torch.equal(fused.k(other), alone.v(other))
        # and q was seen alone on x: its run is planned no more
        assert 0 not in group.plan and group.plan[1] == (1, 2)
        # an inference tensor has no version counter: every layer alone
        with torch.inference_mode():
            x = torch.randn(1, 256)
            assert torch.equal(fused(x), alone.o(alone.q(x) + torch.cat([alone.v(x), alone.v(x)], -1)))


def test_a_sibling_is_served_its_part_until_its_codes_change():
    # Served: the very tensor q's GEMM wrote (a part recomputed alone would be equal too, and slower;
    # a state compared against the wrong member's would do that). Then only k's codes written in
    # place - its scale, and so every other version counter, unchanged: k must see its new codes.
    fused, alone = fused_and_alone("rowwise", 22)
    group = fused.q._siblings[0]
    with torch.no_grad():
        fused(torch.randn(1, 256))  # the first pass plans the run (q, k, v)
        x = torch.randn(1, 256)
        fused.q(x)
        part_k, part_v = group.stash[1][1][0], group.stash[1][2][0]
        assert fused.k(x) is part_k and fused.v(x) is part_v
        x = torch.randn(1, 256)
        fused.q(x)
        part_k = group.stash[1][1][0]
        written = copy.deepcopy(alone.k)
        for m in (fused.k, written):
            m.weight.copy_(alone.v.weight)
        y = fused.k(x)
        assert y is not part_k and torch.equal(y, written(x)) and not torch.equal(y, alone.k(x))
        # q's next call runs k's new codes (the run is now q, k: v was not called on that x)
        x = torch.randn(1, 256)
        fused.q(x)
        part_k = group.stash[1][1][0]
        assert fused.k(x) is part_k and torch.equal(part_k, written(x))


def test_siblings_survive_deepcopy_and_keep_the_state_dict():
    fused, alone = fused_and_alone("tensorwise", 22)
    x = torch.randn(1, 256)
    with torch.no_grad():
        fused(x)
        fused(x)
        twin = copy.deepcopy(fused)
        assert twin.q._siblings[0] is not fused.q._siblings[0] and twin.q._siblings[0].members[1] is twin.k
        assert torch.equal(twin(x), alone(x)) and torch.equal(fused(x), alone(x))
        buffer = io.BytesIO()
        torch.save(fused, buffer)  # the whole module: its packed weights are made again, not pickled
        buffer.seek(0)
        assert torch.equal(torch.load(buffer, weights_only=False)(x), alone(x))
    assert fused.state_dict().keys() == alone.state_dict().keys()


@pytest.mark.parametrize("recipe", ["rowwise", "mxfp8"])
def test_a_quantized_model_survives_plain_pickle(recipe):
    # torch 2.15 pickles an FP8 tensor but cannot load it (UntypedStorage has no dtype): before, a
    # pickled model failed to load. The codes and e8m0 scales go as bytes; the copy computes as the
    # original, bit for bit, and holds its buffers in their FP8 dtypes.
    import pickle
    model = mlp(40)
    f8.quantize_(model, recipe)
    x = torch.randn(3, 96)
    with torch.no_grad():
        twin = pickle.loads(pickle.dumps(model))
        assert torch.equal(twin(x), model(x))
    assert {k: v.dtype for k, v in twin.state_dict().items()} == {k: v.dtype for k, v in model.state_dict().items()}
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in
               zip(twin.state_dict().values(), model.state_dict().values()) if a.dtype.itemsize == 1)


def test_a_transformers_llama_decodes_the_same_tokens_with_its_projections_fused():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(23)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    fused = transformers.LlamaForCausalLM(config).eval()
    alone = copy.deepcopy(fused)
    f8.quantize_(fused)
    f8.quantize_(alone, fuse_siblings=False)
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        outs = [m(ids, use_cache=True) for m in (fused, alone)]
        for _ in range(3):
            assert torch.equal(outs[0].logits, outs[1].logits)
            tok = outs[1].logits[:, -1:].argmax(-1)
            outs = [m(tok, past_key_values=o.past_key_values, use_cache=True) for m, o in zip((fused, alone), outs)]
        assert torch.equal(outs[0].logits, outs[1].logits)
    layer = fused.model.layers[1]
    attn, mlp_ = layer.self_attn, layer.mlp
    assert attn.q_proj._siblings[0].plan == {0: (0, 1, 2)}  # q, k, v (o_proj: its own input)
    assert [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj] == attn.q_proj._siblings[0].members
    assert mlp_.gate_proj._siblings[0].plan == {0: (0, 1)} and mlp_.down_proj._siblings is None


def test_layerwise_casting_fuses_its_native_linears_too():
    torch.manual_seed(24)
    fused = Attention().to(torch.bfloat16)
    alone = copy.deepcopy(fused)
    f8.enable_layerwise_casting(fused, skip_modules_pattern=None)
    f8.enable_layerwise_casting(alone, skip_modules_pattern=None, fuse_siblings=False)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 256).to(torch.bfloat16)
            assert torch.equal(fused(x), alone(x))
    assert fused.q._siblings[0].plan == {0: (0, 1, 2)}


@pytest.mark.parametrize("recipe", ["rowwise", "weight_only"])
def test_torch_set_flush_denormal_changes_no_output(recipe):
    """torch.set_flush_denormal(True) (MXCSR's denormals-are-zero and flush-to-zero on this thread)
    must not change what a quantized Linear computes: the weight's subnormal FP8 codes still count.
    Each row of the weight holds one value at e4m3's largest (448: row scale 1) and the rest below
    its normals (multiples of 2^-9 up to 7 x 2^-9: subnormal codes); fp8kit on one thread, so that
    all the work runs on the thread with the flags. Outputs at M = 1, 3 (the small-M kernels) and
    40 (tiles) equal the unflagged ones bit for bit and the float64 product within its bound,
    which the weight with its subnormals read as zero (the nearest wrong answer) breaks."""
    torch.manual_seed(41)
    layer = torch.nn.Linear(64, 32, bias=False)
    with torch.no_grad():
        small = torch.randint(-7, 8, (32, 64)).float() * 2.0**-9
        small[:, 0] = 448.0
        layer.weight.copy_(small)
    model = torch.nn.Sequential(layer)
    f8.quantize_(model, recipe)
    codes = model[0].weight.view(torch.uint8) & 0x7F
    assert ((codes > 0) & (codes < 8)).float().mean() > 0.5, "the weight's codes are not mostly subnormal"
    threads = fp8kit.num_threads()
    fp8kit.set_num_threads(1)
    try:
        for m in (1, 3, 40):
            x = torch.randn(m, 64)
            with torch.no_grad():
                plain = model(x)
                if not torch.set_flush_denormal(True):
                    pytest.skip("torch.set_flush_denormal is not supported on this CPU")
                try:
                    flagged = model(x)
                finally:
                    torch.set_flush_denormal(False)
            assert torch.equal(plain, flagged), f"M = {m}: outputs changed under torch.set_flush_denormal(True)"
            want, tol = expected(model[0], x.numpy(), SCALINGS[recipe][0])
            assert np.all(np.abs(flagged.double().numpy() - want) <= tol), f"M = {m}"
            a64 = (bf16_terms(x).numpy() if recipe == "weight_only" else
                   fp8kit.dequantize(fp8kit.quantize(x.numpy(), scaling="row")).astype(np.float64))
            w64 = weight64(model[0])
            assert np.any(np.abs(a64 @ np.where(np.abs(w64) < 2.0**-6, 0.0, w64).T - want) > tol)
    finally:
        fp8kit.set_num_threads(threads)
