"""tests/python/test_gemm.py: the scaled GEMM from Python (fp8kit.gemm, PackedWeight, qtensor,
scaled_mm) against float64 sums of the dequantized operands, with the float32 error bound of
docs/NUMERICS.md, and against torch._scaled_mm on the CPU (the call users already make).

Error bound of a float32 sum of K exact products p_k (tensor and row scaling: one K group):
|fl(sum) - sum| <= gamma_K * sum |p_k|, gamma_K = K u / (1 - K u), u = 2^-24; the scales then add
two roundings (sa * sb, and the product), 2 u |D|. With K groups of g (block scaling, G = K / g
groups): each group's sum gamma_g, its scaling 2 u, the float32 sum of the G scaled partials
gamma_G - at most gamma_(g + G + 2) <= gamma_(K + 3) of sum |p_k| in all, the bound used here. Each test also shows that the nearest wrong
answer (D rounded to bfloat16, a scale applied the other way) breaks the bound it asserts.

Run by scripts/test.sh (pytest, on the package scripts/setup.sh installed into .venv).
"""
import math

import ml_dtypes
import numpy as np
import pytest

import fp8kit

U = 2.0 ** -24


def gamma(n):
    return n * U / (1 - n * U)


def dequantized(q, rows_per_scale, cols_per_scale):
    """float64 values of a QTensor: decode(code) * scale_inv of its group (exact in float64)."""
    codes = q.data.view(getattr(ml_dtypes, "float8_" + q.format)).astype(np.float64)
    s = np.repeat(np.repeat(q.scale_inv.astype(np.float64), rows_per_scale, 0), cols_per_scale, 1)
    return codes * s[:codes.shape[0], :codes.shape[1]]


def bound(a64, b64, d64):
    """Per element of D = a64 . b64^T: gamma_(K + 3) sum|a_k b_k| + 2u |D| (+ u |D| for the last rounding)."""
    k = a64.shape[1]
    return gamma(k + 3) * (np.abs(a64) @ np.abs(b64).T) + 3 * U * np.abs(d64)


def operands(m, n, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-6, 6, size=(m, 1)).astype(np.float32)  # rows of different scale
    w = rng.standard_normal((n, k)).astype(np.float32)
    return x, w


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_gemm_is_the_float64_product_within_the_float32_sum_bound(scaling):
    x, w = operands(33, 70, 515, seed=1)  # odd sizes: partial tiles in every direction
    qx, qw = fp8kit.quantize(x, scaling=scaling), fp8kit.quantize(w, scaling=scaling)
    per = (x.shape[0], x.shape[1]) if scaling == "tensor" else (1, x.shape[1])
    a64 = dequantized(qx, *per)
    b64 = dequantized(qw, *((w.shape[0], w.shape[1]) if scaling == "tensor" else (1, w.shape[1])))
    d64 = a64 @ b64.T
    tol = bound(a64, b64, d64)
    d = fp8kit.gemm(qx, fp8kit.PackedWeight(qw))
    assert d.dtype == np.float32 and d.shape == (33, 70)
    assert np.all(np.abs(d - d64) <= tol)
    # The nearest wrong answer - D rounded to bfloat16 - does not pass this bound.
    wrong = d64.astype(ml_dtypes.bfloat16).astype(np.float64)
    assert np.any(np.abs(wrong - d64) > tol)
    # A QTensor as b is packed for the call: the same bytes.
    assert np.array_equal(fp8kit.gemm(qx, qw).view(np.uint32), d.view(np.uint32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_cast_gives_the_codes_quantize_gives(dtype):
    # The cast inside the GEMM is quantize() (tests/python/test_package.py checks quantize against
    # numpy): the GEMM of x equals the GEMM of quantize(x), bit for bit.
    x, w = operands(40, 48, 256, seed=2)
    if dtype == "bfloat16":  # numpy's bfloat16 (ml_dtypes) crosses through torch
        pytest.importorskip("torch")
        x = x.astype(ml_dtypes.bfloat16)
    pw = fp8kit.PackedWeight(fp8kit.quantize(w, scaling="row"))
    fused = fp8kit.gemm(x, pw, scaling="row")
    apart = fp8kit.gemm(fp8kit.quantize(x, scaling="row"), pw)
    assert np.array_equal(fused.view(np.uint32), apart.view(np.uint32))
    assert pw.n == 48 and pw.k == 256 and pw.packed_bytes > 0 and "row" in repr(pw)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_weight_only_takes_x_as_two_bfloat16_terms(dtype):
    # scaling=None: x is not quantized but taken as hi + lo, hi = bf16(x) and lo = bf16(x - hi)
    # (ml_dtypes' rounding, nearest even, is the oracle; no element here is below the 2^-102
    # fp8kit flushes; float16 x is hi + lo exactly) against the FP8 weight: D within the float32
    # sum bound of (hi + lo) . deq(w)^T, and not of x as one bfloat16 (its 2^-9 rounding over
    # K = 256 stands far above the bound) nor of x quantized to e4m3.
    x, w = operands(21, 40, 256, seed=7)
    x = x.astype(dtype)
    qw = fp8kit.quantize(w, scaling="row")
    hi = x.astype(np.float32).astype(ml_dtypes.bfloat16)
    lo = (x.astype(np.float32) - hi.astype(np.float32)).astype(ml_dtypes.bfloat16)
    a64, b64 = hi.astype(np.float64) + lo.astype(np.float64), dequantized(qw, 1, 256)
    if dtype == "float16":
        assert np.array_equal(a64, x.astype(np.float64))
    want = a64 @ b64.T
    d = fp8kit.gemm(x, fp8kit.PackedWeight(qw), scaling=None)
    tol = bound(a64, b64, want)
    assert np.all(np.abs(d - want) <= tol)
    for wrong in (hi.astype(np.float64), dequantized(fp8kit.quantize(x, scaling="row"), 1, 256)):
        assert np.any(np.abs(d - wrong @ b64.T) > tol)


def test_epilogue_alpha_beta_c_bias_and_gelu():
    x, w = operands(16, 24, 128, seed=3)
    rng = np.random.default_rng(4)
    c = rng.standard_normal((16, 24)).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    qx, qw = fp8kit.quantize(x, scaling="row"), fp8kit.quantize(w, scaling="row")
    a64, b64 = dequantized(qx, 1, 128), dequantized(qw, 1, 128)
    ab = a64 @ b64.T
    want = 0.5 * ab + 2.0 * c.astype(np.float64) + bias
    # alpha's product, beta's product and two additions round once each on top of the sum's bound.
    tol = 0.5 * bound(a64, b64, ab) + 4 * U * (np.abs(0.5 * ab) + np.abs(2.0 * c) + np.abs(bias) + np.abs(want))
    d = fp8kit.gemm(qx, qw, alpha=0.5, beta=2.0, c=c, bias=bias)
    assert np.all(np.abs(d - want) <= tol)
    assert np.any(np.abs(d - (0.5 * ab + 2.0 * c + 2 * bias)) > tol)  # bias added twice is caught
    # GELU (tanh form) on the float32 pre-activation, within docs/NUMERICS.md's GELU bound.
    v = d.astype(np.float64)
    g = fp8kit.gemm(qx, qw, alpha=0.5, beta=2.0, c=c, bias=bias, activation="gelu").astype(np.float64)
    s, cc = math.sqrt(2 / math.pi), 0.044715
    t = np.tanh(s * (v + cc * v ** 3))
    g64 = 0.5 * v * (1 + t)
    z = s * (np.abs(v) + cc * np.abs(v) ** 3)
    dt = (1 - t ** 2) * gamma(7) * z + 4 * U * np.abs(t)
    assert np.all(np.abs(g - g64) <= 0.5 * np.abs(v) * (dt + U * (1 + np.abs(t))) + 2 * U * np.abs(g64))
    assert np.any(np.abs(g - v) > 1e-3)  # the activation ran


# ---- torch._scaled_mm, the call users make ----

def fp8_pair(torch, m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 40).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=g) * 40).to(torch.float8_e4m3fn).t()  # [K, N] column-major, as torch asks
    return a, b


@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16"])
def test_scaled_mm_matches_torch_scaled_mm(rowwise, out):
    torch = pytest.importorskip("torch")
    m, n, k = 24, 40, 512
    a, b = fp8_pair(torch, m, n, k, seed=5)
    # Scales that keep |D| (up to ~1e4 here) inside float16's range.
    if rowwise:
        sa = (torch.rand(m, 1, generator=torch.Generator().manual_seed(6)) + 0.5) * 0.05
        sb = (torch.rand(1, n, generator=torch.Generator().manual_seed(7)) + 0.5) * 0.05
    else:
        sa, sb = torch.tensor(0.037), torch.tensor(0.019)
    out_dtype = getattr(torch, out)
    ours = fp8kit.scaled_mm(a, b, sa, sb, out_dtype=out_dtype)
    theirs = torch._scaled_mm(a, b, sa, sb, out_dtype=out_dtype)
    assert isinstance(ours, torch.Tensor) and ours.dtype == out_dtype and ours.shape == (m, n)
    # Both are float32 sums of the same exact products, each within the bound of the float64
    # product, then rounded once to out_dtype: they differ by at most the two bounds plus one unit
    # in the last place of out_dtype.
    a64 = a.double() * sa.double().reshape(-1, 1) if rowwise else a.double() * float(sa)
    b64 = b.t().double() * (sb.double().reshape(-1, 1) if rowwise else float(sb))
    d64 = (a64 @ b64.T).numpy()
    tol = bound(a64.numpy(), b64.numpy(), d64)
    ulp = {"float32": U, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}[out] * np.abs(d64)
    assert np.all(np.abs(ours.double().numpy() - d64) <= tol + ulp)
    assert np.all(np.abs(ours.double().numpy() - theirs.double().numpy()) <= 2 * (tol + ulp))
    # b's scale taken as a quantization scale (multiplying by 1 / scale_b) is caught.
    inverse = b.t().double() / (sb.double().reshape(-1, 1) if rowwise else float(sb))
    assert np.any(np.abs((a64 @ inverse.T).numpy() - d64) > tol + ulp)



@pytest.mark.parametrize("out", [None, "float32", "bfloat16"])
def test_scaled_mm_of_an_empty_operand_is_empty_as_torchs(out):
    # torch._scaled_mm returns an empty D for M = 0 or N = 0; so does fp8kit, in the same dtype.
    torch = pytest.importorskip("torch")
    out_dtype = None if out is None else getattr(torch, out)
    for m, n in ((0, 16), (16, 0)):
        a = torch.zeros(m, 32).to(torch.float8_e4m3fn)
        b = torch.zeros(n, 32).to(torch.float8_e4m3fn).t()
        one = torch.ones(())
        theirs = torch._scaled_mm(a, b, one, one, out_dtype=out_dtype or torch.float8_e4m3fn)
        ours = fp8kit.scaled_mm(a, b, one, one, out_dtype=out_dtype)
        assert ours.shape == theirs.shape == (m, n) and ours.dtype == theirs.dtype

def test_scaled_mm_fp8_output_divides_by_scale_result_and_saturates():
    torch = pytest.importorskip("torch")
    a, b = fp8_pair(torch, 16, 32, 64, seed=8)
    sa, sb = torch.tensor(0.5), torch.tensor(0.25)
    fp8 = torch.float8_e4m3fn
    d64 = (a.double() @ b.double()) * (0.5 * 0.25)  # every product and sum exact in float64
    for scale_result in (None, torch.tensor(4.0), torch.tensor(1e-3)):  # 1e-3: all of D past 448
        # out_dtype None is a's format. (torch 2.15's CPU path then ignores scale_result; with the
        # dtype spelled out it divides, and fp8kit does that either way.)
        ours = fp8kit.scaled_mm(a, b, sa, sb, scale_result=scale_result)
        assert torch.equal(ours.view(torch.uint8),
                           fp8kit.scaled_mm(a, b, sa, sb, scale_result=scale_result, out_dtype=fp8).view(torch.uint8))
        theirs = torch._scaled_mm(a, b, sa, sb, scale_result=scale_result, out_dtype=fp8)
        assert ours.dtype == fp8
        d = d64 / (1.0 if scale_result is None else float(scale_result))
        beyond = d.abs() > 448
        # Past e4m3fn's max fp8kit saturates (docs/NUMERICS.md): +-448 with D's sign, never NaN.
        assert torch.equal(ours.double()[beyond], 448 * d[beyond].sign())
        # torch's CPU path is not the same on every CPU: it saturates on some (AMD Zen 3) and casts
        # without saturating on others (NaN: torch 2.15 on a Sapphire Rapids Xeon). Either, there.
        t = theirs.double()[beyond]
        assert torch.all(t.isnan() | (t == 448 * d[beyond].sign()))
        # Inside the range the float32 D of both may differ in its last bits; once cast to FP8 (3
        # mantissa bits) they are the same code or neighbours.
        diff = (ours.view(torch.uint8).int() - theirs.view(torch.uint8).int())[~beyond]
        if scale_result is None or float(scale_result) > 1:
            assert diff.numel() >= 64 and diff.abs().max() <= 1 and (diff == 0).float().mean() > 0.9
    # scale_result taken as a multiplier instead: another answer.
    times = fp8kit.encode(fp8kit.scaled_mm(a, b, sa, sb, out_dtype=torch.float32) * 4.0)
    divided = fp8kit.scaled_mm(a, b, sa, sb, scale_result=torch.tensor(4.0), out_dtype=fp8)
    assert not torch.equal(times.view(torch.uint8), divided.view(torch.uint8))


def test_scaled_mm_takes_a_broadcast_rowwise_scale():
    # A scale expanded from one value (stride 0, as t.ones(1).expand(M, 1) gives) is the same scales
    # as its contiguous copy: the same D bit for bit (its rows were refused as "not contiguous").
    torch = pytest.importorskip("torch")
    a, b = fp8_pair(torch, 4, 8, 32, 2)
    sa, sb = torch.full((1, 1), 0.5).expand(4, 1), torch.full((1, 1), 0.25).expand(1, 8)
    want = fp8kit.scaled_mm(a, b, sa.contiguous(), sb.contiguous(), out_dtype=torch.float32)
    assert torch.equal(fp8kit.scaled_mm(a, b, sa, sb, out_dtype=torch.float32), want)


def test_scaled_mm_bias_and_numpy_operands():
    torch = pytest.importorskip("torch")
    # Integers of magnitude <= 16 (exact in e4m3): every product and every partial sum of K = 64 of
    # them is an integer below 2^24, exact in float32 in any order, and the scales are powers of
    # two - so D is the same bits whatever order each side sums in (randn * 40 operands, with
    # products from 2^-18 to 2^17, were not: the two sides then differ in the last bits).
    g = torch.Generator().manual_seed(9)
    a = torch.randint(-16, 17, (8, 64), generator=g).float().to(torch.float8_e4m3fn)
    b = torch.randint(-16, 17, (16, 64), generator=g).float().to(torch.float8_e4m3fn).t()
    sa, sb = torch.tensor(0.5), torch.tensor(0.25)
    bias = torch.randn(16, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    ours = fp8kit.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    theirs = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, fp8kit.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16))  # the bias counts
    # ml_dtypes float8 arrays carry their format; numpy in, numpy out.
    an = a.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    bn = b.t().contiguous().view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).T
    d = fp8kit.scaled_mm(an, bn, np.float32(0.5).reshape(1), np.float32(0.25).reshape(1), out_dtype="float32")
    assert isinstance(d, np.ndarray)
    assert np.array_equal(d, torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32).numpy())


def test_qtensor_over_caller_memory_outlives_the_caller_reference():
    codes = np.arange(64, dtype=np.uint8).reshape(4, 16)
    q = fp8kit.qtensor(codes, np.full((4, 1), 2.0, np.float32), scaling="row", format="e4m3fn")
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * 2
    del codes  # the QTensor holds the array
    assert np.array_equal(fp8kit.dequantize(q), want)


@pytest.mark.parametrize("call,needle", [
    (lambda t: fp8kit.scaled_mm(*fp8_pair(t, 4, 8, 32, 1), t.ones(3), t.tensor(1.0)), r"scale_a has shape \[3\]"),
    (lambda t: fp8kit.scaled_mm(*fp8_pair(t, 4, 8, 32, 1), t.tensor(1.0), t.ones(8, 1)), r"scale_b has shape \[8, 1\]"),
    (lambda t: fp8kit.scaled_mm(*fp8_pair(t, 4, 8, 32, 1), 2.0, t.tensor(1.0)), "scale_a is a float"),
    (lambda t: fp8kit.scaled_mm(*fp8_pair(t, 4, 8, 32, 1), t.tensor(1.0), t.ones(1, 8, dtype=t.float64)),
     "scale_b is float64; expected float32"),
    (lambda t: fp8kit.dequantize(None), "q is a NoneType, expected a QTensor"),
    (lambda t: fp8kit.encode(t.zeros(4, dtype=t.float8_e4m3fn)), "x is float8_e4m3fn already"),
    (lambda t: fp8kit.qtensor(fp8_pair(t, 4, 8, 32, 1)[0], t.ones(2, 2)), r"scale_inv has shape \[2, 2\]"),
    (lambda t: fp8kit.qtensor(t.zeros(4, 4, dtype=t.uint8), t.ones(1, 1)), "need a format"),
    (lambda t: fp8kit.gemm(t.randn(4, 32), t.randn(8, 32)), "b must be a PackedWeight or a QTensor"),
    (lambda t: fp8kit.gemm(t.randn(4, 32), fp8kit.quantize(t.randn(8, 16))), "K mismatch"),
    (lambda t: fp8kit.gemm(t.randn(4, 32), fp8kit.quantize(t.randn(8, 32)), bias=t.randn(7)), r"bias has shape \[7\]"),
    (lambda t: fp8kit.gemm(t.randn(4, 32), fp8kit.quantize(t.randn(8, 32)), activation="relu"), "activation"),
    (lambda t: fp8kit.gemm(t.randn(4, 32), fp8kit.quantize(t.randn(8, 32)), out_dtype="int8"), "out_dtype"),
    # out_dtype checked before work, an empty D too (it was torch's AttributeError, or float64 D)
    (lambda t: fp8kit.scaled_mm(*fp8_pair(t, 0, 8, 32, 1), t.tensor(1.0), t.tensor(1.0), out_dtype="float64"),
     "out_dtype 'float64', expected float32, bfloat16, float16 or a float8 dtype"),
    (lambda t: fp8kit.scaled_mm(*fp8_pair(t, 0, 8, 32, 1), t.tensor(1.0), t.tensor(1.0), out_dtype="\x1b[2J"),
     r"out_dtype '\\x1b\[2J'"),
    # D is divided by scale_result: 0, a negative, Inf or NaN would give Inf, flipped or NaN codes
    *[(lambda t, v=v: fp8kit.scaled_mm(*fp8_pair(t, 4, 8, 32, 1), t.tensor(1.0), t.tensor(1.0),
                                      scale_result=t.tensor(v), out_dtype=t.float8_e4m3fn),
       rf"scale_result is \[{v}\]; expected one finite, positive element") for v in (0.0, -1.0, float("inf"), float("nan"))],
])
def test_bad_gemm_input_raises_fp8kit_error_naming_it(call, needle):
    torch = pytest.importorskip("torch")
    with pytest.raises(fp8kit.Error, match=needle):
        call(torch)


@pytest.mark.parametrize("a_block,b_block", [("1x128", "128x128"), ("1x128", "1x128"), ("128x128", "1x128")])
def test_scaled_mm_block_scales_in_torchs_shapes(a_block, b_block):
    # Block scales as torch._scaled_mm takes them (its shape rules: torch checks our shapes on the
    # meta device, where every torch build has the check), against float64 within the bound of
    # K groups; the nearest wrong answer - b's block scales read transposed - fails it.
    torch = pytest.importorskip("torch")
    m, n, k = 136, 208, 384  # partial blocks along M and N (torch wants N a multiple of 16)
    x, w = operands(m, n, k, seed=9)
    qa = fp8kit.quantize(x, scaling=f"block({a_block})")
    qb = fp8kit.quantize(w, scaling=f"block({b_block})")  # w: b^T [N, K]
    a = torch.from_numpy(qa.data.copy()).view(torch.float8_e4m3fn)
    b = torch.from_numpy(qb.data.copy()).view(torch.float8_e4m3fn).t()  # [K, N] column-major
    sa, sb = torch.from_numpy(qa.scale_inv.copy()), torch.from_numpy(qb.scale_inv.copy()).t()  # b's: [K/128, ...]
    meta = torch._scaled_mm(a.to("meta"), b.to("meta"), sa.to("meta"), sb.to("meta"), out_dtype=torch.float32)
    assert meta.shape == (m, n)  # torch accepts these shapes for this block pair
    d = fp8kit.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    rows = lambda blk: int(blk.split("x")[0])  # noqa: E731
    a64, b64 = dequantized(qa, rows(a_block), 128), dequantized(qb, rows(b_block), 128)
    d64 = a64 @ b64.T
    tol = bound(a64, b64, d64)
    assert np.all(np.abs(d.double().numpy() - d64) <= tol)
    swapped = np.repeat(np.repeat(qb.scale_inv.astype(np.float64), rows(b_block), 0), 128, 1)[:n, :k]
    codes = qb.data.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    wrong = a64 @ (codes * swapped[::-1]).T  # scales of the wrong blocks
    assert np.any(np.abs(wrong - d64) > tol)
    with pytest.raises(fp8kit.Error, match=r"scale_b has shape \[2, 3\]; .* \[3, 208\] \(1x128 blocks\)"):
        fp8kit.scaled_mm(a, b, sa, torch.ones(2, 3))
