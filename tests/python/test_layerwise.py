"""tests/python/test_layerwise.py: fp8kit.torch.enable_layerwise_casting against Diffusers'
apply_layerwise_casting on the same model.

Oracles: Diffusers itself (which layers are stored in FP8 under its default skip patterns; the
upcast layers' outputs, bit for bit), and for the Linear layers that compute on their FP8 weight
directly, the float64 product of the activation as it is (bfloat16, not quantized: Diffusers'
compute_dtype) and the stored weight, within the float32 sum bound of test_gemm.py. The nearest
wrong answer - the activation cast to FP8, as an FP8 GEMM would - fails that bound. A GELU fused
into a Linear's GEMM (gelu_fusion.py): the float64 tanh GELU of that product, which the GELU of
the output rounded to bfloat16 first (Diffusers' two ops) fails. After the report's remove(), the
original model itself: its modules, Parameters and outputs, bit for bit.

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
from test_gemm import U, bound  # noqa: E402


class Block(torch.nn.Module):
    """A diffusion-transformer-like block: names that Diffusers' default patterns skip (norm,
    proj_in, proj_out) beside ones they cast (conv, ff.*)."""

    def __init__(self):
        super().__init__()
        self.proj_in = torch.nn.Linear(32, 64)
        self.conv = torch.nn.Conv1d(64, 64, 3, padding=1)
        self.norm = torch.nn.LayerNorm(64)
        self.ff = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
        self.proj_out = torch.nn.Linear(64, 32)

    def forward(self, x):  # x [B, T, 32]
        h = self.proj_in(x)
        h = h + self.conv(h.transpose(1, 2)).transpose(1, 2)
        return self.proj_out(self.ff(self.norm(h)))


def model_and_input():
    torch.manual_seed(5)
    return Block().to(torch.bfloat16), torch.randn(2, 48, 32).to(torch.bfloat16)


def test_same_layers_as_diffusers_and_conv_bit_for_bit():
    hooks = pytest.importorskip("diffusers.hooks")  # the peer (tests/requirements-peers.txt)
    ours, x = model_and_input()
    theirs = copy.deepcopy(ours)
    hooks.apply_layerwise_casting(theirs, torch.float8_e4m3fn, torch.bfloat16)
    report = f8.enable_layerwise_casting(ours, torch.float8_e4m3fn, torch.bfloat16, scaled=False)
    stored = {name for name, m in theirs.named_modules()
              if any(p.dtype == torch.float8_e4m3fn for p in m.parameters(recurse=False))}
    assert set(report.native) | set(report.cast) == stored == {"conv", "ff.0", "ff.2"}
    assert report.native == ["ff.0", "ff.2"] and report.cast == ["conv"]
    assert {name for name, _ in report.skipped} == {"proj_in", "norm", "proj_out"}
    assert ours.conv.weight.dtype == torch.float8_e4m3fn and ours.ff[0].weight.dtype == torch.float8_e4m3fn
    with torch.no_grad():
        h = theirs.proj_in(x).transpose(1, 2)
        assert torch.equal(ours.conv(h).view(torch.int16), theirs.conv(h).view(torch.int16))
        assert ours.conv.weight.dtype == torch.float8_e4m3fn  # stored again after the forward
        # Unscaled storage holds Diffusers' codes: weight.to(float8), the same bytes.
        assert torch.equal(ours.ff[0].weight.view(torch.uint8), theirs.ff[0].weight.view(torch.uint8))


@pytest.mark.parametrize("scaled", [False, True])
def test_native_linear_is_the_float64_product_of_its_fp8_operands(scaled):
    model, x = model_and_input()
    with torch.no_grad():  # small weights (std 0.002, as deep residual projections): nearly all below
        model.ff[0].weight.normal_(0, 0.002)  # e4m3's smallest normal 2^-6, many below its subnormals
    original = model.ff[0].weight.detach().double().numpy()
    f8.enable_layerwise_casting(model, scaled=scaled)
    layer = model.ff[0]
    h = torch.randn(96, 64).to(torch.bfloat16)
    with torch.no_grad():
        y = layer(h)
    assert y.dtype == torch.bfloat16
    # The FP8 weight is held once: the packed copy the GEMM read (the buffer a stand-in over one
    # byte); read through layer.weight below, the codes come back from it.
    assert layer._buffers["weight"].untyped_storage().nbytes() == 1
    a64 = h.double().numpy()  # the activation as it is (bfloat16): not quantized, as Diffusers computes
    w8 = layer.weight.view(torch.uint8).numpy()
    b64 = fp8kit.decode(w8, "e4m3fn").astype(np.float64) * np.float64(layer.weight_scale_inv.item())
    d64 = a64 @ b64.T + layer.bias.double().numpy()
    # float32 sums and bias, then one rounding to bfloat16 (u = 2^-8).
    tol = bound(a64, b64, d64) + 2 * U * np.abs(d64) + 2.0 ** -8 * np.abs(d64)
    assert np.all(np.abs(y.double().numpy() - d64) <= tol)
    # The nearest wrong answer: the activation quantized (e4m3, one scale) as an FP8 GEMM would.
    wrong = fp8kit.dequantize(fp8kit.quantize(h, scaling="tensor")).astype(np.float64) @ b64.T + layer.bias.double().numpy()
    assert np.any(np.abs(wrong - d64) > tol)
    if scaled:  # a per-tensor scale keeps small weights out of FP8's subnormals: an error some ten times
        # smaller than the unscaled cast's here (3 mantissa bits on every weight, against 0-2 on most)
        unscaled = fp8kit.decode(fp8kit.encode(original.astype(np.float32), "e4m3fn"), "e4m3fn").astype(np.float64)
        assert np.linalg.norm(b64 - original) < 0.25 * np.linalg.norm(unscaled - original)


def test_whole_model_runs_and_bad_storage_dtype_is_refused():
    model, x = model_and_input()
    with torch.no_grad():
        ref = model(x).double()
    report = f8.enable_layerwise_casting(model)
    with torch.no_grad():
        y = model(x).double()
    # SQNR of the FP8 model against its bfloat16 self: e4m3 keeps 3 mantissa bits (about 25-30 dB
    # per cast); two casts per GEMM and three layers stay above 15 dB, a wrong scale or layout far below.
    assert 10 * torch.log10(ref.square().sum() / (y - ref).square().sum()) > 15
    assert "native FP8 (2): ff.0, ff.2" in str(report)
    # Refused before any layer changes: not FP8; e8m0 (a cast drops every sign); fnuz (no FP8
    # layer takes it: an Embedding before the first Linear was already converted).
    for bad in (torch.bfloat16, torch.float8_e8m0fnu, torch.float8_e4m3fnuz):
        block = Block()
        before = [(m, getattr(m, "weight", None)) for m in block.modules()]
        with pytest.raises(fp8kit.Error, match=f"storage_dtype {bad}, expected torch.float8_e4m3fn"):
            f8.enable_layerwise_casting(block, storage_dtype=bad)
        assert [(m, getattr(m, "weight", None)) for m in block.modules()] == before


def test_remove_gives_back_the_original_model_bit_for_bit():
    # Each thing enable_layerwise_casting does to a model - a native Linear and Embedding put in
    # place of the originals, a convolution's weights cast with hooks around its forward - undone
    # by the report's remove(): the same module objects in the same places, the same Parameters in
    # their own dtypes and values, no hooks, and the original outputs bit for bit. In between the
    # model runs in FP8 (its output differs), so a remove() that left any of it would be seen.
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 32), Block()).to(torch.bfloat16)
    ids = torch.randint(0, 100, (2, 48))
    modules = dict(model.named_modules())
    params = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    with torch.no_grad():
        before = model(ids)
    report = f8.enable_layerwise_casting(model, skip_modules_pattern=None)
    assert report.native == ["0", "1.proj_in", "1.ff.0", "1.ff.2", "1.proj_out"] and report.cast == ["1.conv"]
    with torch.no_grad():
        assert not torch.equal(model(ids), before)
    report.remove()
    with torch.no_grad():
        after = model(ids)
    assert torch.equal(after.view(torch.int16), before.view(torch.int16))
    assert dict(model.named_modules()) == modules  # modules compare by identity
    for name, p in model.named_parameters():  # after a forward: no hook is left to store it in FP8 again
        original, value = params.pop(name)
        assert p is original and p.dtype == torch.bfloat16 and torch.equal(p.view(torch.int16), value.view(torch.int16))
    assert not params and not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    report.remove()  # nothing left to undo
    assert dict(model.named_modules()) == modules


def test_a_second_call_is_refused_and_the_first_still_removes():
    # A second call on a converted model would record the FP8 weights of the upcast layers as their
    # originals; removing both reports then left FP8 weights and a forward that fails. Refused
    # before any change, naming a converted layer; the first report still gives the model back.
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 32), Block()).to(torch.bfloat16)
    ids = torch.randint(0, 100, (2, 48))
    with torch.no_grad():
        before = model(ids)
    report = f8.enable_layerwise_casting(model, skip_modules_pattern=None)
    converted = dict(model.named_modules())
    with pytest.raises(fp8kit.Error, match="layer '0' is stored in FP8 by an earlier call already"):
        f8.enable_layerwise_casting(model, skip_modules_pattern=None)
    assert dict(model.named_modules()) == converted
    report.remove()
    with torch.no_grad():
        assert torch.equal(model(ids).view(torch.int16), before.view(torch.int16))
    # Given back, the model converts again; converted, torch.save keeps it whole (the upcast
    # layers' hooks too: before, closures that did not pickle).
    f8.enable_layerwise_casting(model, skip_modules_pattern=None)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    with torch.no_grad():
        assert torch.equal(torch.load(buffer, weights_only=False)(ids).view(torch.int16), model(ids).view(torch.int16))
    # Plain pickle of the native layers (torch 2.15 cannot load a pickled FP8 tensor: the FP8 table
    # and weights go as bytes).
    import pickle
    native = torch.nn.Sequential(torch.nn.Embedding(100, 32), torch.nn.Linear(32, 16)).to(torch.bfloat16)
    f8.enable_layerwise_casting(native, skip_modules_pattern=None)
    with torch.no_grad():
        assert torch.equal(pickle.loads(pickle.dumps(native))(ids).view(torch.int16), native(ids).view(torch.int16))


@pytest.mark.parametrize("scaled", [False, True])
def test_embedding_decodes_only_the_rows_it_reads(scaled):
    torch.manual_seed(6)
    table = torch.nn.Embedding(1000, 64, padding_idx=0)
    ids = torch.tensor([[0, 5, 999], [17, 5, 3]])
    ours = torch.nn.Sequential(copy.deepcopy(table))
    report = f8.enable_layerwise_casting(ours, torch.float8_e4m3fn, torch.bfloat16, skip_modules_pattern=None,
                                         scaled=scaled)
    assert report.native == ["0"] and isinstance(ours[0], f8.Float8Embedding)
    with torch.no_grad():
        got = ours(ids)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 64)
    if not scaled:  # Diffusers' unscaled storage: its upcast table, looked up - the same bits
        hooks = pytest.importorskip("diffusers.hooks")
        theirs = torch.nn.Sequential(copy.deepcopy(table))
        hooks.apply_layerwise_casting(theirs, torch.float8_e4m3fn, torch.bfloat16, skip_modules_pattern=None)
        with torch.no_grad():
            assert torch.equal(got.view(torch.int16), theirs(ids).view(torch.int16))
    else:  # decode(code) * scale_inv in float32 (exact), one rounding to bfloat16: the codes' own values
        q = fp8kit.quantize(table.weight.detach(), "e4m3fn", "tensor")
        rows = fp8kit.decode(q.data, "e4m3fn")[ids.numpy()] * q.scale_inv[0, 0]
        assert torch.equal(got, torch.from_numpy(rows).to(torch.bfloat16))
        assert torch.equal(got[0, 0], torch.zeros(64, dtype=torch.bfloat16))  # the padding row stays zero


class MlpBlock(torch.nn.Module):
    """Flux's single-block MLP as Diffusers writes it - self.act_mlp(self.proj_mlp(x)): the GELU
    (tanh form) reads the Linear's output alone - beside GELUs that must stay modules: one its
    forward also calls on x (act_b), one in the erf form (act_c)."""

    def __init__(self):
        super().__init__()
        self.proj_mlp, self.act_mlp = torch.nn.Linear(64, 128), torch.nn.GELU(approximate="tanh")
        self.proj_b, self.act_b = torch.nn.Linear(64, 128), torch.nn.GELU(approximate="tanh")
        self.proj_c, self.act_c = torch.nn.Linear(64, 128), torch.nn.GELU()

    def forward(self, x):  # x [..., 64] -> [..., 128]
        h = self.act_mlp(self.proj_mlp(x))
        return h + self.act_b(self.proj_b(x)) + self.act_b(torch.cat([x, x], -1)) + self.act_c(self.proj_c(x))


class NestedMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(64, 128), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(128, 64)

    def forward(self, x):  # x [..., 64] -> [..., 64], the three calls in one expression
        return self.fc2(self.act(self.fc1(x)))


class SplitMlp(NestedMlp):
    def forward(self, x):  # the same, fc1 and its GELU on a line of their own
        h = self.act(self.fc1(x))
        return self.fc2(h)


def test_gelu_inside_a_nested_call_is_fused():
    """self.fc2(self.act(self.fc1(x))): the GELU between fc1 and fc2 is found (the pair (act, fc1)
    overlaps (fc2, act) in the source) and fused into fc1, bit for bit as where the forward names it
    on a line of its own."""
    torch.manual_seed(9)
    nested = NestedMlp().to(torch.bfloat16)
    split = SplitMlp().to(torch.bfloat16)
    split.load_state_dict(nested.state_dict())
    x = torch.randn(32, 64).to(torch.bfloat16)
    reports = [f8.enable_layerwise_casting(m, skip_modules_pattern=None) for m in (nested, split)]
    assert [r.fused_gelu for r in reports] == [["fc1"], ["fc1"]]
    assert type(nested.act) is torch.nn.Identity and nested.fc1.activation == "gelu" and nested.fc2.activation == "none"
    assert torch.equal(nested(x), split(x))


class ShiftedMlp(torch.nn.Module):
    """A GELU whose argument holds the Linear's output and more: not the Linear's output alone."""

    def __init__(self):
        super().__init__()
        self.fc, self.act = torch.nn.Linear(64, 64), torch.nn.GELU(approximate="tanh")
        self.shift = torch.nn.Parameter(torch.full((64,), -3.0))

    def forward(self, x):
        return self.act(self.fc(x) + self.shift)


class ReadsTheLinear(torch.nn.Module):
    """A grandparent that calls its block's Linear itself: the Linear's output read outside the block."""

    def __init__(self):
        super().__init__()
        self.block, self.out = SplitMlp(), torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.out(self.block(x)) + self.block.fc2(self.block.act(self.block.fc1(x)))


class SharedLinear(torch.nn.Module):
    """One Linear at two places: a block that fuses it, and a Sequential that calls it alone."""

    def __init__(self):
        super().__init__()
        self.block = SplitMlp()
        self.again = torch.nn.Sequential(self.block.fc1)

    def forward(self, x):
        return self.block(x).sum() + self.again(x)


@pytest.mark.parametrize("make", [ShiftedMlp, ReadsTheLinear, SharedLinear])
def test_a_gelu_that_reads_more_or_a_linear_read_elsewhere_is_not_fused(make):
    # Before (a regex over the parent's forward): self.act(self.fc(x) + shift) computed
    # gelu(fc(x)) + shift (-42 dB), and a Linear called from outside its block gave the caller
    # its GELU'd output. Unfused, the model computes as with fuse_gelu=False, bit for bit.
    torch.manual_seed(11)
    model = make().to(torch.bfloat16)
    plain = copy.deepcopy(model)
    x = torch.randn(8, 64).to(torch.bfloat16)
    assert f8.enable_layerwise_casting(model, skip_modules_pattern=None).fused_gelu == []
    f8.enable_layerwise_casting(plain, skip_modules_pattern=None, fuse_gelu=False)
    with torch.no_grad():
        assert torch.equal(model(x).view(torch.int16), plain(x).view(torch.int16))


def gelu64(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def test_gelu_after_a_linear_runs_in_its_gemm():
    # The fused layer's output is GELU (tanh form) of the float64 product of its operands plus the
    # bias: the float32 sums' bound and the bias add's rounding (2u |pre|) times max |gelu'|
    # (1.13), plus the epilogue's float32 GELU (3u |pre|, src/cpu/gemm_kernels.hpp) and one
    # rounding to bfloat16. The nearest wrong answers fail it:
    # the Linear's output rounded to bfloat16 before GELU (Diffusers' two ops, which fusing
    # removes) and the erf form. The GELUs that read something else or are not the tanh form stay.
    torch.manual_seed(8)
    model = MlpBlock().to(torch.bfloat16)
    x = torch.randn(96, 64).to(torch.bfloat16)
    report = f8.enable_layerwise_casting(model, skip_modules_pattern=None)
    assert report.native == ["proj_mlp", "proj_b", "proj_c"] and report.fused_gelu == ["proj_mlp"]
    assert type(model.act_mlp) is torch.nn.Identity and type(model.act_b) is torch.nn.GELU
    assert model.proj_mlp.activation == "gelu" and model.proj_b.activation == "none"
    assert "GELU in the GEMM (1): proj_mlp" in str(report) and "activation=gelu" in repr(model.proj_mlp)
    layer = model.proj_mlp
    with torch.no_grad():
        y = layer(x).double().numpy()
        unfused = torch.nn.functional.gelu(_unfused(layer, x), approximate="tanh").double().numpy()
    a64 = x.double().numpy()
    b64 = fp8kit.decode(layer.weight.view(torch.uint8).numpy(), "e4m3fn").astype(np.float64) * layer.weight_scale_inv.item()
    pre = a64 @ b64.T + layer.bias.double().numpy()
    want = gelu64(pre)
    tol = 1.13 * (bound(a64, b64, pre) + 2 * U * np.abs(pre)) + 3 * U * np.abs(pre) + 2.0 ** -8 * np.abs(want) + 2.0 ** -133
    assert np.all(np.abs(y - want) <= tol)
    assert np.any(np.abs(unfused - want) > tol)
    erf = 0.5 * pre * (1 + np.vectorize(math.erf)(pre / np.sqrt(2)))
    assert np.any(np.abs(erf - want) > tol)


def _unfused(layer, x):
    """The layer's Linear alone (no GELU): its output in bfloat16, as Diffusers' Linear gives it."""
    plain = f8.Float8InferenceLinear(layer.in_features, layer.out_features, True, "layerwise")
    plain.weight, plain.weight_scale_inv, plain.bias = layer.weight, layer.weight_scale_inv, layer.bias
    return plain(x)


def test_diffusers_feedforward_gelu_and_remove():
    # Diffusers' FeedForward with "gelu-approximate" (Flux's and SD3's): its GELU module (proj, then
    # F.gelu) becomes a Float8GELUProjection whose proj computes both, under the original's
    # state_dict names; the block as a whole stays within the FP8 storage's error of Diffusers' own
    # bfloat16 block and of fp8kit's unfused one (fuse_gelu=False: no rounding to bfloat16 between
    # the Linear and GELU is the only difference, below 1% here). remove() gives back the original
    # modules and outputs bit for bit, the nn.GELU that an nn.Identity replaced included.
    attention = pytest.importorskip("diffusers.models.attention")  # the peer (tests/requirements-peers.txt)
    torch.manual_seed(9)
    model = torch.nn.ModuleDict({"ff": attention.FeedForward(64, activation_fn="gelu-approximate"),
                                 "mlp": MlpBlock()}).to(torch.bfloat16)
    x = torch.randn(2, 40, 64).to(torch.bfloat16)
    run = lambda m: m["ff"](x) + m["mlp"](x).sum(-1, keepdim=True)  # noqa: E731
    modules = dict(model.named_modules())
    with torch.no_grad():
        before = run(model)
    unfused = copy.deepcopy(model)
    f8.enable_layerwise_casting(unfused, skip_modules_pattern=None, fuse_gelu=False)
    keys = set(unfused.state_dict())
    report = f8.enable_layerwise_casting(model, skip_modules_pattern=None)
    assert report.fused_gelu == ["ff.net.0.proj", "mlp.proj_mlp"]
    assert type(model["ff"].net[0]) is f8.Float8GELUProjection and set(model.state_dict()) == keys
    with torch.no_grad():
        fused, plain = run(model).double(), run(unfused).double()
    ref = before.double()
    assert (fused - plain).norm() < 0.01 * plain.norm()
    assert 10 * torch.log10(ref.square().sum() / (fused - ref).square().sum()) > 15
    report.remove()
    with torch.no_grad():
        assert torch.equal(run(model).view(torch.int16), before.view(torch.int16))
    assert dict(model.named_modules()) == modules
