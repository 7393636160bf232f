"""tests/python/test_torch.py: fp8kit.torch - quantize_ and Float8Linear in PyTorch models.

Oracle: the float64 product of the dequantized operands - the activation quantized as the recipe
says (fp8kit.quantize, itself checked against numpy in test_package.py) and the weight's FP8 codes
times its scales - within the float32 sum bound of test_gemm.py (docs/NUMERICS.md). Then what a
PyTorch user relies on: torch.export and torch.compile trace the custom op, state_dict round trips
(and a loaded weight is repacked, not served stale), filters, dtypes and errors.

Run by scripts/test.sh (pytest, on the package scripts/setup.sh installed into .venv).
"""
import io

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
SCALINGS = {"rowwise": ("row", "row"), "tensorwise": ("tensor", "tensor"), "block": ("block(1x128)", "block(128x128)"),
            "mxfp8": ("mx32", "mx32")}
WEIGHT_GROUPS = {"rowwise": (1, None), "tensorwise": (None, None), "block": (128, 128), "mxfp8": (1, 32)}


def weight64(layer):
    """float64 values of a Float8Linear's weight: torch's decode of its codes times the scale_inv of
    each code's group (e8m0 codes e of mxfp8 stand for 2^(e - 127))."""
    n, k = layer.weight.shape
    gr, gc = WEIGHT_GROUPS[layer.recipe]
    scale = layer.weight_scale_inv
    scale = torch.exp2(scale.view(torch.uint8).double() - 127) if scale.dtype == torch.float8_e8m0fnu else scale.double()
    return layer.weight.double().numpy() * np.repeat(np.repeat(scale.numpy(), gr or n, 0), gc or k, 1)[:n, :k]


def expected(layer, x, input_scaling):
    """float64 y = deq(quantize(x)) . deq(W)^T + b of one Float8Linear, with its bound."""
    qx = fp8kit.quantize(x, scaling=input_scaling)
    a64 = fp8kit.dequantize(qx).astype(np.float64)
    b64 = weight64(layer)
    d64 = a64 @ b64.T
    tol = bound(a64, b64, d64)
    if layer.bias is not None:
        d64 = d64 + layer.bias.double().detach().numpy()
        tol = tol + 2 * U * np.abs(d64)
    return d64, tol


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise", "block", "mxfp8"])
def test_quantize_replaces_linears_and_matches_float64(recipe):
    model = mlp(1)
    x = torch.randn(2, 7, 96)  # [batch, tokens, width]: Float8Linear flattens the leading dims
    f8.quantize_(model, recipe)
    first, last = model[0], model[2]
    assert isinstance(first, f8.Float8Linear) and isinstance(last, f8.Float8Linear)
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


def test_bfloat16_in_bfloat16_out_and_the_weight_quantized_once():
    model = mlp(2)
    f8.quantize_(model)
    x = torch.randn(5, 96).to(torch.bfloat16)
    with torch.no_grad():
        y = model(x)
        assert y.dtype == torch.bfloat16
        fused = model[0].weight._fp8kit_fused[1]
        model(x)
    assert model[0].weight._fp8kit_fused[1] is fused  # packed once, reused


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


def test_filter_fn_picks_layers_by_name():
    model = mlp(6)
    f8.quantize_(model, filter_fn=lambda m, fqn: fqn == "2")
    assert type(model[0]) is torch.nn.Linear and isinstance(model[2], f8.Float8Linear)


@pytest.mark.parametrize("call,needle", [
    (lambda m: f8.quantize_(m, "mxfp4"), "mxfp4"),
    (lambda m: f8.quantize_(torch.nn.Linear(4, 4)), "itself an nn.Linear"),
    (lambda m: (f8.quantize_(m), m(torch.randn(2, 96, dtype=torch.float64))), "float64"),
    (lambda m: (f8.quantize_(m), m(torch.randn(2, 95))), r"\[2, 95\].*in_features 96"),
])
def test_bad_use_raises_fp8kit_error_naming_it(call, needle):
    with pytest.raises(fp8kit.Error, match=needle):
        call(mlp(7))
