"""tests/python/test_training.py: fp8kit.torch.convert_to_float8_training - the three GEMMs of a
Float8Linear under autograd, against float64, against torchao's own float8 training on the
CPU, under DDP and under torch.compile (FSDP2: test_fsdp.py).

Oracles:
- float64: each GEMM's output is the float64 product of its two operands quantized as the recipe
  says - the recipe's formats and scalings stated here, from docs/NUMERICS.md "Recipes" (not read
  from the library), applied by fp8kit.quantize to x, W, dY and to the transposed copies x^T, W^T,
  dY^T made by numpy (quantize is checked against numpy in test_package.py) - within the float32
  sum bound of test_gemm.py. The nearest wrong answers fail the same bound: the product without
  the cast, dW with dY's scales along the wrong axis, dY cast to e4m3 where the recipe says e5m2.
- torchao's convert_to_float8_training on the CPU, same weights and data: each result within the
  sum of both sides' float32 bounds (same codes, different summation order).
- DDP (gloo, 2 ranks on 127.0.0.1, started here): the losses of 2 ranks on halves of a batch follow
  1 rank on the whole batch step for step (rowwise_with_gw_hp: every FP8 scale is per token row, so
  the split changes only float32 summation order); without the gradient all-reduce they do not.
- torch.compile(fullgraph=True), in a child interpreter: y and the weights' gradients the eager
  run's bits (same operands into the same GEMM operators), loss and bias gradients within float32
  sum bounds; nothing printed at exit (no exception, no nanobind leak); delayed refused.

Run by scripts/test.sh (pytest, on the package scripts/setup.sh installed into .venv).
"""

import dataclasses
import os

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # fp8kit.torch is for torch users: without torch there is nothing to test
import fp8kit  # noqa: E402
import fp8kit.torch as f8  # noqa: E402
from test_gemm import U, bound, gamma  # noqa: E402  (the float32 sum bound)

# docs/NUMERICS.md "Recipes": per recipe, the (format, scaling) of input x, weight W, grad dY.
SPEC = {
    "tensorwise": {"input": ("e4m3fn", "tensor"), "weight": ("e4m3fn", "tensor"), "grad_output": ("e5m2", "tensor")},
    "rowwise": {"input": ("e4m3fn", "row"), "weight": ("e4m3fn", "row"), "grad_output": ("e4m3fn", "row")},
    "block": {"input": ("e4m3fn", "block(1x128)"), "weight": ("e4m3fn", "block(128x128)"),
              "grad_output": ("e4m3fn", "block(1x128)")},
    "mxfp8": {"input": ("e4m3fn", "mx32"), "weight": ("e4m3fn", "mx32"), "grad_output": ("e4m3fn", "mx32")},
}
SPEC["rowwise_with_gw_hp"] = SPEC["rowwise"]
SPEC["mxfp8_rceil"] = SPEC["mxfp8"]  # the shared exponent rounded up where the spec's would saturate
POWER_OF_TWO = {"rowwise", "rowwise_with_gw_hp"}  # rowwise scales are powers of two (torchao's rowwise)


def values64(q):
    """float64 values of a QTensor: decode(code) * scale_inv of its group (exact in float64)."""
    codes = q.data.view(getattr(ml_dtypes, "float8_" + q.format)).astype(np.float64)
    rows, cols = codes.shape
    if q.scaling == "mx32":
        s, gr, gc = np.exp2(q.scale_inv.astype(np.float64) - 127), 1, 32  # e8m0 codes
    else:
        s = q.scale_inv.astype(np.float64)
        gr, gc = {"tensor": (rows, cols), "row": (1, cols)}.get(q.scaling) or \
            map(int, q.scaling.removeprefix("block(").removesuffix(")").split("x"))
    return codes * np.repeat(np.repeat(s, gr, 0), gc, 1)[:rows, :cols]


def cast64(t, recipe, role, fmt=None):
    """float64 values of t [rows, cols] cast as the recipe casts this role (fmt overrides the format)."""
    spec_fmt, scaling = SPEC[recipe][role]
    return values64(fp8kit.quantize(np.ascontiguousarray(t, np.float32), fmt or spec_fmt, scaling,
                                    power_of_two=recipe in POWER_OF_TWO,
                                    mx_rounding="up" if recipe == "mxfp8_rceil" else "floor"))


def within(got, a64, b64):
    """got (torch) is float64 a64 . b64^T within the float32 sum bound: (pass, want, tol)."""
    want = a64 @ b64.T
    tol = bound(a64, b64, want)
    return bool(np.all(np.abs(got.double().numpy() - want) <= tol)), want, tol


def layer_and_data(seed, m=200, k=256, n=160, dtype=torch.float32):
    """A Linear [n, k] with bias, x [m, k] with rows of different magnitude, and an upstream dY."""
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, dtype=dtype)
    x = torch.randn(m, k) * torch.exp2(torch.randint(-4, 4, (m, 1)).float())
    # Gradients of different magnitude per token and per output, so that row scales along one axis
    # differ from row scales along the other.
    dy = torch.randn(m, n) * 1e-3 * torch.exp2(torch.randint(-3, 3, (m, 1)).float() + torch.randint(-3, 3, (1, n)).float())
    return lin, x.to(dtype), dy.to(dtype)


def run(layer, x, dy):
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp", "block", "mxfp8", "mxfp8_rceil"])
def test_three_gemms_match_float64_of_the_recipes_casts(recipe):
    lin, x, dy = layer_and_data(1)
    w = lin.weight.detach().numpy().copy()
    b = lin.bias.detach().numpy().astype(np.float64)
    layer = f8.convert_to_float8_training(lin, config=recipe)
    assert isinstance(layer, f8.Float8Linear) and layer.weight is lin.weight  # Parameters shared
    y, dx, dw, db = run(layer, x, dy)
    xn, dyn = x.numpy(), dy.numpy()

    # output y = q(x) . q(W)^T + b: the bias adds one rounding.
    ok, want, tol = within(y - torch.from_numpy(b).float(), cast64(xn, recipe, "input"), cast64(w, recipe, "weight"))
    assert np.all(np.abs(y.double().numpy() - (want + b)) <= tol + 2 * U * np.abs(want + b))
    if recipe == "mxfp8_rceil":  # Nearest wrong answer: the spec's exponent (mxfp8's), which saturates
        wrong = cast64(xn, "mxfp8", "input") @ cast64(w, "mxfp8", "weight").T
        assert np.any(np.abs(wrong - want) > tol)
    # grad_input dX = q(dY) . q(W^T)^T
    ok, want, tol = within(dx, cast64(dyn, recipe, "grad_output"), cast64(w.T, recipe, "weight"))
    assert ok
    # Nearest wrong answer: the weight not cast (dY . W).
    assert np.any(np.abs(cast64(dyn, recipe, "grad_output") @ w.astype(np.float64) - want) > tol)
    if recipe == "tensorwise":  # dY in e4m3 instead of the hybrid recipe's e5m2
        wrong = cast64(dyn, recipe, "grad_output", fmt="e4m3fn") @ cast64(w.T, recipe, "weight").T
        assert np.any(np.abs(wrong - want) > tol)
    # grad_weight dW = q(dY^T) . q(x^T)^T, or dY^T x in float32 for rowwise_with_gw_hp
    if recipe == "rowwise_with_gw_hp":
        d64, x64 = dyn.T.astype(np.float64), xn.T.astype(np.float64)
        want = d64 @ x64.T
        tol = gamma(xn.shape[0]) * (np.abs(d64) @ np.abs(x64).T) + U * np.abs(want)
        assert np.all(np.abs(dw.double().numpy() - want) <= tol)
        wrong = cast64(dyn.T, "rowwise", "grad_output") @ cast64(xn.T, "rowwise", "input").T  # dW in FP8
        assert np.any(np.abs(wrong - want) > tol)
    else:
        ok, want, tol = within(dw, cast64(dyn.T, recipe, "grad_output"), cast64(xn.T, recipe, "input"))
        assert ok
        if recipe != "tensorwise":  # scales of dY along out (its rows) instead of along the GEMM's K (tokens)
            wrong = cast64(dyn, recipe, "grad_output").T @ cast64(xn.T, recipe, "input").T
            assert np.any(np.abs(wrong - want) > tol)
    # grad of the bias: the float32 column sums of dY
    db64 = dyn.astype(np.float64).sum(0)
    assert np.all(np.abs(db.double().numpy() - db64) <= gamma(dyn.shape[0]) * np.abs(dyn).astype(np.float64).sum(0))


def test_bfloat16_training_and_leading_dims():
    lin, x, dy = layer_and_data(2, dtype=torch.bfloat16)
    layer = f8.convert_to_float8_training(torch.nn.Sequential(lin), config="rowwise")[0]
    x3 = x.reshape(8, 25, 256).clone().requires_grad_()
    y = layer(x3)
    y.backward(dy.reshape(8, 25, 160))
    assert y.dtype == torch.bfloat16 and y.shape == (8, 25, 160)
    assert x3.grad.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.bfloat16
    # dX: float64 of the recipe's casts (of the bfloat16 values), then one rounding to bfloat16.
    w = layer.weight.detach().float().numpy()
    a64, b64 = cast64(dy.float().numpy(), "rowwise", "grad_output"), cast64(w.T, "rowwise", "weight")
    want = a64 @ b64.T
    tol = bound(a64, b64, want) + 2.0 ** -8 * np.abs(want)  # bfloat16's rounding: u = 2^-8
    assert np.all(np.abs(x3.grad.reshape(200, 256).double().numpy() - want) <= tol)


def test_leading_dims_give_no_view():
    """y of a 3-d input is a tensor of its own, as nn.Linear's (aten folds the batch dimensions with
    _unsafe_view): a view would make FSDP2 warn of a module returning one, and an in-place op on it
    fail the backward."""
    lin, x, _ = layer_and_data(2)
    layer = f8.convert_to_float8_training(torch.nn.Sequential(lin), config="rowwise")[0]
    y = layer(x.reshape(8, 25, 256))
    assert y.shape == (8, 25, 160) and not y._is_view() and not torch.nn.Linear(256, 160)(x.reshape(8, 25, 256))._is_view()
    y.mul_(2).sum().backward()  # in place on the output, then backward: as nn.Linear allows
    assert layer.weight.grad is not None


@pytest.mark.parametrize("recipe", list(f8.TRAINING_RECIPES))
def test_an_empty_batch_is_an_empty_output_and_zero_gradients(recipe):
    """No rows (a batch of 0, or 0 tokens): y [..., out] empty, dX empty and dW, db zero - what
    nn.Linear gives (before: the cast refused an undefined tensor)."""
    lin, _, _ = layer_and_data(3)
    ref = torch.nn.Linear(256, 160)
    ref.load_state_dict(lin.state_dict())
    layer = f8.convert_to_float8_training(torch.nn.Sequential(lin), config=recipe)[0]
    for shape in ((0, 256), (2, 0, 256)):
        x = torch.randn(shape, requires_grad=True)
        y, want = layer(x), ref(x)
        assert y.shape == want.shape and y.dtype == want.dtype
        y.sum().backward()
        assert x.grad.shape == x.shape
        assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))
        assert torch.equal(layer.bias.grad, torch.zeros_like(layer.bias))
        layer.zero_grad()


def test_autocast_computes_and_returns_in_its_dtype():
    """Under torch.autocast(cpu, bfloat16) both FP8 layers take the input in bfloat16 and return
    bfloat16, as nn.Linear does (torch's autocast does not reach custom operators: before, float32
    out); the result is the layer's on the bfloat16 input, bit for bit, and the gradient reaches
    the float32 input and the float32 weight."""
    lin, x, _ = layer_and_data(4)
    train = f8.convert_to_float8_training(torch.nn.Sequential(lin), config="rowwise")[0]
    infer = torch.nn.Sequential(torch.nn.Linear(256, 160))
    infer[0].load_state_dict(lin.state_dict())
    f8.quantize_(infer)
    for layer in (train, infer[0]):
        xr = x.clone().requires_grad_(layer is train)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(xr)
        assert y.dtype == torch.bfloat16
        assert torch.equal(y, layer(x.to(torch.bfloat16)))
    xr = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        train(xr).float().sum().backward()
    assert xr.grad.dtype == torch.float32 and train.weight.grad.dtype == torch.float32


class _Tied(torch.nn.Module):
    """An embedding, a Linear, and an output head tied to the embedding (a tied lm_head)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.emb, self.fc = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 64, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.relu(self.fc(self.emb(ids))))


def test_a_tied_weight_stays_tied_with_fp8_all_gather(caplog):
    """enable_fsdp_float8_all_gather gives each layer's weight a parameter of its own, which for a
    head tied to the embedding would untie them (two parameters, two AdamW states: another model).
    A tied layer all-gathers in high precision, says why, and stays tied: 4 AdamW steps give the
    losses of the conversion without FP8 all-gather, bit for bit (untied, they part from step 2)."""
    from fp8kit.torch.fsdp import Float8WeightShard
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(6))
    losses = {}
    for gather in (False, True):
        with caplog.at_level("INFO", logger="fp8kit.torch.training"):
            model = f8.convert_to_float8_training(_Tied(), enable_fsdp_float8_all_gather=gather)
        assert model.head.weight is model.emb.weight
        assert isinstance(model.fc.weight, Float8WeightShard) == gather and not isinstance(model.head.weight, Float8WeightShard)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[gather] = []
        for _ in range(4):
            loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 64), ids.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[gather].append(loss.item())
    assert losses[True] == losses[False]
    assert any("layer 'head' all-gathers its weight in high precision: it is tied to emb.weight" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "block", "mxfp8"])
def test_torch_compile_keeps_the_batch_dynamic(recipe):
    """torch.compile(dynamic=True) of a training layer compiles one graph for every row count (the
    casts' fake shapes keep the batch symbolic; before, each new count compiled again, and past
    torch's cache limit a variable-length run went uncompiled), and each count's y is the eager
    layer's, bit for bit. Counts above 128: where a scale grid has one group along the batch
    (M <= 32 for mx32, <= 128 for block) torch compiles a second graph - it specializes a size of 1."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    layer = f8.convert_to_float8_training(torch.nn.Linear(256, 128), config=recipe)
    compiled = torch.compile(layer, backend="aot_eager", dynamic=True)
    for m in (136, 200, 264, 392):
        x = torch.randn(m, 256, requires_grad=True)
        y = compiled(x)
        y.sum().backward()
        assert torch.equal(y, layer(x))
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_a_double_backward_is_refused_not_given_no_graph():
    # A gradient penalty (WGAN-GP, R1) differentiates the input's gradient again. nn.Linear can;
    # the FP8 GEMMs have no derivative graph. Before, the first gradient came back without a graph
    # and the penalty's part of the weights' gradient was dropped (cosine 0.09 to nn.Linear's).
    model = f8.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                                              torch.nn.Linear(64, 16)), config="rowwise")
    x = torch.randn(32, 64, requires_grad=True)
    g, = torch.autograd.grad(model(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked with @once_differentiable"):
        g.norm().backward()


@pytest.mark.parametrize("config,needle", [
    (["rowwise"], r"""training recipe '\["rowwise"\]', expected one of"""),
    ({"recipe": "rowwise"}, "training recipe '.*', expected one of"),
])
def test_float8linear_refuses_a_config_that_is_no_recipe_name(config, needle):
    with pytest.raises(fp8kit.Error, match=needle):  # before: TypeError, unhashable
        f8.Float8Linear(64, 64, config=config)


def test_a_layer_on_meta_called_with_a_host_input_says_so():
    # A model converted on meta (as torchtitan does) and called before it is materialized: the
    # error names the layer's shape and where its weight is (before: only "a tensor on device 'meta'").
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    f8.convert_to_float8_training(model, config="rowwise")
    with pytest.raises(fp8kit.Error, match=r"Float8Linear\(64, 64\): the input is on device 'cpu', the weight on "
                                           r"device 'meta': a model converted on meta is materialized"):
        model(torch.randn(4, 64))


@pytest.mark.parametrize("change,needle", [
    (lambda s: s["grad_output"]["scale"].fill_(float("nan")),
     r"'0._extra_state'\['grad_output'\]: .*scale is not finite and positive"),
    (lambda s: s["weight"]["amax_history"].fill_(-5), r"'0._extra_state'\['weight'\]: .*amax_history\[0\] is negative"),
    (lambda s: s.pop("weight"), r"'0._extra_state' holds .*expected a dict of the roles"),
    (lambda s: s["input"].__setitem__("fresh", "no"), r"'0._extra_state'\['input'\] holds .*fresh a bool"),
    (lambda s: s["input"].__setitem__("scale", torch.ones(2)), r"'0._extra_state'\['input'\] has .*scale one value"),
])
def test_a_refused_delayed_state_leaves_the_layer_as_it_was(change, needle):
    # A checkpoint with other weights, another input history and a bad last entry: refused naming
    # the entry, before anything is taken (before: the weight and the input history were loaded,
    # then the last role refused; a missing role or a string gave a raw KeyError or TypeError).
    import copy
    torch.manual_seed(3)
    m = f8.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 32)), config="delayed")
    m(torch.randn(8, 64))
    weight, state = m[0].weight.detach().clone(), copy.deepcopy(m[0].get_extra_state())
    sd = copy.deepcopy(m.state_dict())
    sd["0.weight"].mul_(3)
    sd["0._extra_state"]["input"]["amax_history"].fill_(7.0)
    change(sd["0._extra_state"])
    with pytest.raises(fp8kit.Error, match=needle):
        m.load_state_dict(sd)
    assert torch.equal(m[0].weight, weight)
    for role, s in m[0].get_extra_state().items():
        assert torch.equal(s["amax_history"], state[role]["amax_history"]) and torch.equal(s["scale"], state[role]["scale"])


def test_delayed_state_is_saved_loaded_and_copied():
    """The delayed recipe's amax histories and scales are state: in state_dict (extra state) and in
    copies (deepcopy, torch.save of the module), so a run loaded from a state_dict, or a copy,
    continues with the scales it would have had - its next 3 steps' losses the original's, bit for
    bit (before: lost; the loaded layer started fresh at scale 1, and deepcopy raised). Every
    other recipe's state_dict stays nn.Linear's keys."""
    import copy
    import io

    def model(seed):
        torch.manual_seed(seed)
        return f8.convert_to_float8_training(
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)), config="delayed")

    g = torch.Generator().manual_seed(7)
    data = [(torch.randn(16, 64, generator=g), torch.randn(16, 32, generator=g)) for _ in range(6)]

    def steps(m, opt, batches):
        out = []
        for x, t in batches:
            loss = torch.nn.functional.mse_loss(m(x), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    m = model(1)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    steps(m, opt, data[:3])
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    copied = copy.deepcopy((m, opt))
    pickled = io.BytesIO()
    torch.save((m, opt), pickled)
    continued = steps(m, opt, data[3:])
    buf.seek(0)
    saved = torch.load(buf)
    fresh = model(2)
    fresh.load_state_dict(saved["model"])
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    fresh_opt.load_state_dict(saved["opt"])
    assert steps(fresh, fresh_opt, data[3:]) == continued
    assert steps(*copied, data[3:]) == continued
    pickled.seek(0)
    assert steps(*torch.load(pickled, weights_only=False), data[3:]) == continued
    assert list(f8.convert_to_float8_training(torch.nn.Linear(64, 64), config="rowwise").state_dict()) == ["weight", "bias"]


def test_arguments_of_the_wrong_kind_are_named():
    """A model that is no nn.Module, a module filter that is not a function, or a compute dtype the
    GEMM does not compute in: an fp8kit.Error naming the argument (before: AttributeError, TypeError,
    or the C++ cast's message, which named none)."""
    lin = torch.nn.Sequential(torch.nn.Linear(32, 32))
    for call, message in (
            (lambda: f8.convert_to_float8_training("model"), r"convert_to_float8_training: the model is a str"),
            (lambda: f8.convert_to_float8_training(lin, module_filter_fn="0"), r"module_filter_fn is '0', expected a function"),
            (lambda: f8.quantize_(lin, filter_fn="0"), r"quantize_: filter_fn is '0', expected a function"),
            (lambda: f8.enable_layerwise_casting([lin]), r"enable_layerwise_casting: the model is a list"),
            (lambda: f8.enable_layerwise_casting(lin, compute_dtype=torch.float64), r"compute_dtype torch\.float64, expected")):
        with pytest.raises(fp8kit.Error, match=message):
            call()
    assert type(lin[0]) is torch.nn.Linear  # nothing converted by a refused call


def test_gpt2s_conv1d_layers_are_named_in_a_warning():
    """GPT-2's projections are transformers Conv1D (weight [in, out]), which the conversions leave
    as they are: each conversion says so, naming them (before: silently, only lm_head converted)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup.sh)")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=1, n_head=2)
    for convert in (f8.quantize_, f8.convert_to_float8_training):
        with pytest.warns(UserWarning, match=r"4 transformers Conv1D layer\(s\) \(transformer\.h\.0\.attn\.c_attn, "
                                             r"transformer\.h\.0\.attn\.c_proj, transformer\.h\.0\.mlp\.c_fc, \.\.\.\)"):
            convert(transformers.GPT2LMHeadModel(cfg))


def test_filter_shapes_and_errors():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10),
                                torch.nn.Linear(10, 64))
    f8.convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "0")
    # "0" refused by the filter; "2" and "3" have 10 features: not a multiple of 16, left as they are.
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear", "Linear"]
    model = f8.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 128)), config="delayed")
    assert isinstance(model[0], f8.Float8Linear) and "config=delayed" in repr(model)
    with pytest.raises(fp8kit.Error, match="in_features 64"):
        model(torch.randn(3, 65))
    with pytest.raises(fp8kit.Error, match="torch.float64"):
        model(torch.randn(3, 64, dtype=torch.float64))
    with pytest.raises(fp8kit.Error, match="'fastest'"):
        f8.convert_to_float8_training(model, config="fastest")


def test_auto_filter_leaves_small_layers_in_high_precision_and_says_why(caplog):
    def model():  # on the meta device: only the shapes matter
        with torch.device("meta"):
            return torch.nn.ModuleDict({"big": torch.nn.Linear(4096, 4096), "wide": torch.nn.Linear(2048, 8192),
                                        "odd": torch.nn.Linear(4096, 4108), "lm_head": torch.nn.Linear(4096, 4096),
                                        "small": torch.nn.Linear(1024, 1024)})

    keep = f8.auto_filter(filter_fqns=["lm_head"])
    with caplog.at_level("INFO", logger="fp8kit.torch.training"):
        m = f8.convert_to_float8_training(model(), module_filter_fn=keep)
    fp8 = {name for name, layer in m.items() if isinstance(layer, f8.Float8Linear)}
    # Only "big" has both features >= 4096; "wide" (2048 in) stays although its out_features pass
    # (a threshold on the larger feature would convert it).
    assert fp8 == {"big"}
    assert set(keep.skipped) == {"wide", "odd", "lm_head", "small"}
    assert "in_features 2048" in keep.skipped["wide"] and "min_features 4096" in keep.skipped["wide"]
    assert "4108" in keep.skipped["odd"] and "multiples of 16" in keep.skipped["odd"]
    assert "'lm_head'" in keep.skipped["lm_head"]
    assert sum("small stays in torch.float32" in r.getMessage() for r in caplog.records) == 1
    # A lower threshold converts what it admits.
    m = f8.convert_to_float8_training(model(), module_filter_fn=f8.auto_filter(min_features=1024))
    assert {name for name, layer in m.items() if isinstance(layer, f8.Float8Linear)} == {"big", "wide", "lm_head", "small"}
    for bad, field in ((dict(filter_fqns="lm_head"), "filter_fqns"), (dict(min_features=8), "min_features"),
                       (dict(min_features=4096.0), "min_features"), (dict(filter_fqns=None), "filter_fqns")):
        with pytest.raises(fp8kit.Error, match=field):
            f8.auto_filter(**bad)


def test_the_former_name_of_the_training_layer_is_a_deprecated_alias():
    # Float8TrainingLinear, the training layer's name before it took C++'s and torchao's
    # (Float8Linear), still names that class for one release - not the inference layer, which held
    # the name Float8Linear before - and says so with a DeprecationWarning, however it is reached.
    with pytest.warns(DeprecationWarning, match="Float8InferenceLinear"):
        assert f8.Float8TrainingLinear is f8.Float8Linear
    with pytest.warns(DeprecationWarning):
        from fp8kit.torch import Float8TrainingLinear
    assert Float8TrainingLinear is f8.Float8Linear and "Float8TrainingLinear" not in f8.__all__
    with pytest.raises(AttributeError, match="Float8Linearr"):  # other names stay unknown
        f8.Float8Linearr


def test_delayed_scaling_uses_the_amax_of_earlier_steps():
    # Step 1 scales x by its own amax (the first use records it); step 2 by the larger of both
    # steps' amaxes (history max): x2 = x1 / 4 then comes back as the float64 product of x2 cast
    # with scale fp8_max / amax(x1), not with its own - whose answer fails the bound.
    lin, x, dy = layer_and_data(3)
    w = lin.weight.detach().numpy().copy()
    layer = f8.convert_to_float8_training(lin, config="delayed")
    run(layer, x, dy)
    x2 = x / 4
    y2 = run(layer, x2, dy)[0] - lin.bias.detach()
    top = np.float32(448.0)
    scale = top / np.float32(np.abs(x.numpy()).max())
    codes = np.clip(x2.numpy() * scale, -top, top).astype(ml_dtypes.float8_e4m3fn)
    a64 = codes.astype(np.float64) * np.float64(np.float32(1) / scale)
    b64 = cast64(w, "tensorwise", "weight")
    ok, want, tol = within(y2, a64, b64)
    assert np.all(np.abs(y2.double().numpy() - want) <= tol + 2 * U * np.abs(want) + 2 * U * np.abs(lin.bias.detach().double().numpy()))
    own = cast64(x2.numpy(), "tensorwise", "input") @ b64.T
    assert np.any(np.abs(own - want) > tol)


def test_torchaos_float8_linear_config_objects_name_their_recipe():
    # config may be torchao's Float8LinearConfig as from_recipe_name makes it: the same recipe as its
    # name; a config changed from those (here: power-of-2 scales) is refused, not run as the recipe.
    torchao_float8 = pytest.importorskip("torchao.float8")
    make = torchao_float8.Float8LinearConfig.from_recipe_name
    for name in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        model = f8.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 32)), config=make(name))
        assert model[0].config == name
    rowwise = make("rowwise")
    changed = dataclasses.replace(rowwise, round_scales_to_power_of_2=not rowwise.round_scales_to_power_of_2)
    with pytest.raises(fp8kit.Error, match="Float8LinearConfig"):
        f8.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 32)), config=changed)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_against_torchao_float8_training_on_the_cpu(recipe):
    torchao_float8 = pytest.importorskip("torchao.float8")  # the peer (tests/requirements-peers.txt)
    lin, x, dy = layer_and_data(4)
    peer = torch.nn.Sequential(torch.nn.Linear(256, 160))
    peer[0].load_state_dict(lin.state_dict())
    torchao_float8.convert_to_float8_training(peer, config=torchao_float8.Float8LinearConfig.from_recipe_name(recipe))
    ours = f8.convert_to_float8_training(torch.nn.Sequential(lin), config=recipe)
    theirs = run(peer[0], x, dy)
    mine = run(ours[0], x, dy)
    w, xn, dyn = lin.weight.detach().numpy(), x.numpy(), dy.numpy()
    b = lin.bias.detach().double().numpy()
    # torchao 0.18's rowwise GEMMs on the CPU (torch._scaled_mm with row scales) round D to
    # bfloat16 before the bias (found here: its y is bf16(D) + b to the last bit); fp8kit keeps
    # float32. So rowwise results agree within bfloat16's rounding, tensorwise within float32's.
    u_peer = 2.0 ** -8 if recipe != "tensorwise" else 0.0
    results = [("y", (cast64(xn, recipe, "input"), cast64(w, recipe, "weight")), np.abs(b)),
               ("dX", (cast64(dyn, recipe, "grad_output"), cast64(w.T, recipe, "weight")), 0.0)]
    if recipe != "rowwise_with_gw_hp":
        results.append(("dW", (cast64(dyn.T, recipe, "grad_output"), cast64(xn.T, recipe, "input")), 0.0))
    for (name, (a64, b64), bias_abs), got, peer_got in zip(results, mine, theirs):
        # Both are the float64 product of the same casts within a float32 sum bound (and the bias's
        # rounding on y), the peer's rounded to bfloat16 on top.
        want = a64 @ b64.T
        tol = 2 * bound(a64, b64, want) + 4 * U * (np.abs(want) + bias_abs) + u_peer * np.abs(want)
        diff = np.abs(got.double().numpy() - peer_got.double().numpy())
        assert np.all(diff <= tol), name
        # fp8kit is the closer of the two to that float64 product (its SQNR at least the peer's).
        err = lambda r: np.linalg.norm(r.double().numpy() - want - (b if name == "y" else 0))  # noqa: E731
        assert err(got) <= err(peer_got) * 1.001, name
    if recipe == "rowwise_with_gw_hp":  # dW = dY^T x in float32 on both sides
        d64, x64 = dyn.T.astype(np.float64), xn.T.astype(np.float64)
        tol = 2 * gamma(xn.shape[0]) * (np.abs(d64) @ np.abs(x64).T) + 2 * U * np.abs(d64 @ x64.T)
        assert np.all(np.abs(mine[2].double().numpy() - theirs[2].double().numpy()) <= tol)


# ---- DDP: 2 ranks on halves of the batch follow 1 rank on the whole batch ----

STEPS, BATCH = 4, 64


def ddp_model():
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    return f8.convert_to_float8_training(model, config="rowwise_with_gw_hp")


def ddp_data():
    g = torch.Generator().manual_seed(8)
    return [(torch.randn(BATCH, 64, generator=g), torch.randn(BATCH, 32, generator=g)) for _ in range(STEPS)]


def train(model, batches, allreduce):
    """AdamW steps of the mean squared error; returns the loss of the whole batch at each step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, t in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), t)
        loss.backward()
        if allreduce:  # the batch mean of the two halves' mean losses
            whole = loss.detach().clone()
            torch.distributed.all_reduce(whole)
            losses.append(whole.item() / 2)
        else:
            losses.append(loss.item())
        opt.step()
    return losses


def ddp_rank(rank, store, sync, out):
    fp8kit.set_num_threads(1)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model = ddp_model()
        if sync:
            model = torch.nn.parallel.DistributedDataParallel(model)
        half = [(x[rank * BATCH // 2:(rank + 1) * BATCH // 2], t[rank * BATCH // 2:(rank + 1) * BATCH // 2])
                for x, t in ddp_data()]
        losses = train(model, half, allreduce=True)
        if rank == 0:
            torch.save(losses, out)
        torch.distributed.barrier()
    except BaseException:
        torch.distributed.destroy_process_group()
        raise
    # Done: leave without tearing gloo down. Its teardown aborted a rank now and then ("terminate
    # called without an active exception", SIGABRT: 2 runs in 16 on a Zen 5 machine, with a TCP
    # store and with a file store alike) after every result was written.
    os._exit(0)


def two_ranks(sync, tmp_path):
    store = str(tmp_path / f"store-{sync}")  # a new file per process group (a store file is used once)
    out = str(tmp_path / f"losses-{sync}.pt")
    torch.multiprocessing.spawn(ddp_rank, args=(store, sync, out), nprocs=2, join=True)
    return torch.load(out)


def test_ddp_two_ranks_follow_one_rank_step_for_step(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch has no gloo backend for torch.distributed")
    one = train(ddp_model(), ddp_data(), allreduce=False)
    two = two_ranks(True, tmp_path)
    # Same codes (every scale is per token row; dW in float32), float32 sums in another order:
    # relative differences of a few u per step, 1e-5 after four AdamW steps leaves room for that
    # and for a rare FP8 rounding of a weight flipping by it.
    assert len(two) == STEPS and one[0] > one[-1]
    assert np.allclose(two, one, rtol=1e-5, atol=0)
    # The nearest wrong answer: the same ranks without DDP's gradient all-reduce.
    apart = two_ranks(False, tmp_path)
    assert not np.allclose(apart[1:], one[1:], rtol=1e-3, atol=0)


def test_no_grad_forward_is_the_training_forward():
    # Under torch.no_grad nothing is kept for backward (no transposed casts); y is the same bytes.
    lin, x, _ = layer_and_data(5)
    layer = f8.convert_to_float8_training(lin, config="rowwise")
    with torch.no_grad():
        y0 = layer(x)
    y1 = layer(x.clone().requires_grad_())
    assert y1.requires_grad and torch.equal(y0.view(torch.int32), y1.detach().view(torch.int32))


def test_a_tensor_on_another_device_is_an_error_naming_it():
    # fp8kit's package computes on the CPU: a tensor elsewhere (here torch's meta device, present in
    # every torch build) is refused by name, in every entry point, before any work.
    x = torch.empty(4, 64, device="meta")
    layer = f8.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(64, 32)))
    inference = torch.nn.Sequential(torch.nn.Linear(64, 32))
    f8.quantize_(inference)
    for call in (lambda: fp8kit.quantize(x), lambda: layer(x), lambda: inference(x)):
        with pytest.raises(fp8kit.Error, match="device 'meta'"):
            call()


# ---- torch.compile: the casts and GEMMs are operators, forward and backward in one graph ----

# Run in a child interpreter (the test reads what it prints at exit). Per recipe: the eager and the
# compiled (fullgraph=True: a graph break is an error) runs of the same model on the same x, with
# loss = sum(y * g), whose gradient dY = g is exact in both, and ReLU between the layers, exact in
# both: every GEMM then sees the same operands, so y and the weights' gradients (GEMM outputs) must
# be the same bits. The loss and the biases' gradients are float32 sums (over y * g, over dY's
# rows) whose order the compiler may change: each within both sides' gamma(n) sum|terms|.
COMPILE_CHILD = r"""
import sys, torch, fp8kit, fp8kit.torch as f8
gamma = lambda n: n * 2.0 ** -24 / (1 - n * 2.0 ** -24)
for recipe in sys.argv[1:]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
    f8.convert_to_float8_training(model, config=recipe)
    x, g = torch.randn(32, 128), torch.randn(32, 128)
    dy_abs = {}  # per layer, sum over rows of |dY| (eager run): the bias gradients' bound
    hooks = [model[i].register_full_backward_hook(lambda m, gi, go, i=i: dy_abs.update({i: go[0].abs().sum(0)}))
             for i in (0, 2)]
    runs = []
    for run in (model, torch.compile(model, fullgraph=True)):
        model.zero_grad()
        y = run(x)
        loss = (y * g).sum()
        loss.backward()
        runs.append((loss.detach(), y.detach(), model[0].weight.grad.clone(), model[2].weight.grad.clone(),
                     model[0].bias.grad.clone(), model[2].bias.grad.clone()))
        [h.remove() for h in hooks]
    (le, *eager), (lc, *compiled) = runs
    same = all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(eager[:3], compiled[:3]))
    sums = [(le - lc).abs() <= 2 * gamma(32 * 128) * (eager[0] * g).abs().sum()]
    sums += [bool(((a - b).abs() <= 2 * gamma(32) * dy_abs[i]).all())
             for a, b, i in zip(eager[3:], compiled[3:], (0, 2))]
    print(recipe, same, all(sums), bool(eager[0].abs().sum() > 0))
model = f8.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(128, 64)), config="delayed")
try:
    torch.compile(model)(torch.randn(4, 128))
except fp8kit.Error as e:
    print("delayed refused:", "torch.compile" in str(e))
model(torch.randn(4, 128)).sum().backward()  # eagerly it trains
"""


def test_torch_compile_fullgraph_forward_and_backward_equal_eager_and_exit_clean():
    import subprocess
    import sys
    recipes = ["tensorwise", "rowwise", "rowwise_with_gw_hp", "block", "mxfp8"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", COMPILE_CHILD, *recipes], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:len(recipes) + 1] == [f"{r} True True True" for r in recipes] + \
        ["delayed refused: True"], done.stdout + done.stderr[-3000:]
    # The interpreter's exit: no exception printed (as "Exception ignored in ..."), no extension
    # object alive when nanobind checks for leaks - a compiled graph holds only torch tensors.
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]
    assert "nanobind: leaked" not in done.stderr, done.stderr[-3000:]
