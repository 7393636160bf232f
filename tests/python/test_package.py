"""tests/python/test_package.py: the Python package (python/, fp8kit._fp8kit) against independent
implementations - ml_dtypes for every code and rounding, PyTorch's float8 casts, and a float32
numpy implementation of docs/NUMERICS.md's scaling (TransformerEngine's scale = fp8_max / amax,
the OCP MX rule for mx32) - plus what a Python caller meets: read-only and strided arrays, torch
tensors in and out, errors as fp8kit.Error (a ValueError) carrying the library's message.

Run by scripts/test.sh (pytest, on the package scripts/setup.sh installed into .venv).
"""
import ml_dtypes
import numpy as np
import pytest

import fp8kit

FORMATS = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"]
ML = {f: getattr(ml_dtypes, "float8_" + f) for f in FORMATS + ["e8m0fnu"]}


def same_codes(a, b, fmt):
    """Codes equal, or both NaN (formats have several NaN codes; which one is not the contract)."""
    a, b = np.asarray(a, np.uint8), np.asarray(b, np.uint8)
    va, vb = a.view(ML[fmt]).astype(np.float32), b.view(ML[fmt]).astype(np.float32)
    return (a == b) | (np.isnan(va) & np.isnan(vb))


def probe_values(fmt):
    """Every float16 value, random float32 bit patterns (NaN, Inf, subnormals among them), and the
    exact midpoints between neighbouring codes (where round-to-nearest-even decides) and just off them."""
    rng = np.random.default_rng(7)
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    bits = rng.integers(0, 2**32, size=1 << 17, dtype=np.uint64).astype(np.uint32).view(np.float32)
    grid = np.unique(np.arange(256, dtype=np.uint8).view(ML[fmt]).astype(np.float64))
    grid = grid[np.isfinite(grid)]
    mid = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)  # exact: FP8 neighbours differ in 1-4 bits
    near = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 3.4e38], np.float32)
    return np.concatenate([halves, bits, near, -near, specials]).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS + ["e8m0fnu"])
def test_decode_every_code_matches_ml_dtypes(fmt):
    codes = np.arange(256, dtype=np.uint8)
    ours = fp8kit.decode(codes, fmt)
    theirs = codes.view(ML[fmt]).astype(np.float32)
    assert ours.dtype == np.float32 and ours.shape == (256,)
    assert np.all((ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_nonsaturating_matches_ml_dtypes(fmt):
    # ml_dtypes' astype is one round-to-nearest-even from float32, overflowing to Inf / NaN.
    x = probe_values(fmt)
    ours = fp8kit.encode(x, fmt, overflow="nonsaturating")
    with np.errstate(invalid="ignore"):  # numpy warns on the NaN it casts
        theirs = x.astype(ML[fmt]).view(np.uint8)
    bad = ~same_codes(ours, theirs, fmt)
    assert not bad.any(), f"{bad.sum()} of {x.size} differ, first x = {x[bad][:5]}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_saturate_clamps_like_satfinite(fmt):
    x = probe_values(fmt)
    top = np.float32(fp8kit.format_max(fmt))
    assert top == np.float32(ml_dtypes.finfo(ML[fmt]).max)
    ours = fp8kit.encode(x, fmt)  # saturate, the default
    # Clamping first and rounding then is the same as rounding and then saturating (no value
    # inside [-max, max] rounds past max); the scalar cast clamps +-Inf too (CUDA __NV_SATFINITE,
    # the shared contract: docs/NUMERICS.md "Saturating Inf") - quantize never does, see below.
    not_nan = ~np.isnan(x)
    theirs = np.clip(x[not_nan], -top, top).astype(ML[fmt]).view(np.uint8)
    assert same_codes(ours[not_nan], theirs, fmt).all()
    assert np.isnan(fp8kit.decode(ours[~not_nan], fmt)).all()


def test_encode_takes_float16_and_refuses_float64_naming_it():
    x = np.linspace(-500, 500, 1001, dtype=np.float32)
    h = x.astype(np.float16)
    # float16 widens to float32 exactly, so its codes are those of the widened values (all in range).
    assert (fp8kit.encode(h, "e5m2") == h.astype(np.float32).astype(ML["e5m2"]).view(np.uint8)).all()
    with pytest.raises(fp8kit.Error, match="f64") as err:
        fp8kit.encode(x.astype(np.float64))
    assert isinstance(err.value, ValueError)


def test_ml_dtypes_float8_codes_carry_their_format():
    codes = np.arange(256, dtype=np.uint8)
    for fmt in FORMATS:
        typed = codes.view(ML[fmt])
        assert np.array_equal(fp8kit.decode(typed).view(np.uint32), fp8kit.decode(codes, fmt).view(np.uint32))
    with pytest.raises(fp8kit.Error, match="e4m3fn"):  # a format that contradicts the dtype
        fp8kit.decode(codes.view(ML["e5m2"]), "e4m3fn")


def test_read_only_and_strided_arrays_are_read_in_place():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 96)) * 100).astype(np.float32)
    frozen = x.copy()
    frozen.setflags(write=False)
    assert (fp8kit.encode(frozen) == fp8kit.encode(x)).all()
    for view in (x[:, ::3], x.T, x[::2, 5:]):
        assert (fp8kit.encode(view) == fp8kit.encode(np.ascontiguousarray(view))).all()
        q, c = fp8kit.quantize(view, scaling="row"), fp8kit.quantize(np.ascontiguousarray(view), scaling="row")
        assert (q.data == c.data).all() and (q.scale_inv.view(np.uint32) == c.scale_inv.view(np.uint32)).all()
    assert (x == frozen).all()  # inputs are never written
    q = fp8kit.quantize(x)
    with pytest.raises(ValueError, match="read-only"):  # a QTensor's codes cannot drift from its scales
        q.data[0, 0] = 0



def test_negative_strides_are_refused_naming_the_argument():
    # The rule of encode's docstring: negative strides are refused (copy first), never read wrong.
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    for call, name in ((lambda v: fp8kit.encode(v), "'x'"), (lambda v: fp8kit.quantize(v), "'x'")):
        with pytest.raises(fp8kit.Error, match=f"{name}.*negative"):
            call(x[::-1])


def test_empty_inputs_give_empty_results():
    x = np.zeros((0, 8), np.float32)
    assert fp8kit.encode(x).shape == (0, 8)
    assert fp8kit.decode(np.zeros((0, 8), np.uint8), "e4m3fn").shape == (0, 8)
    q = fp8kit.quantize(x, scaling="row")
    assert q.data.shape == (0, 8) and q.scale_inv.shape == (0, 1)
    assert fp8kit.dequantize(q).shape == (0, 8)


def test_empty_torch_tensors_give_empty_results():
    # torch's empty tensors cross DLPack with a null data pointer: still empty operands, not
    # "undefined" ones. The GEMM of an M = 0 activation is an empty D; of a K = 0 one (every sum
    # empty), D = bias.
    torch = pytest.importorskip("torch")
    for shape in ((0, 16), (16, 0), (0, 0)):
        x = torch.zeros(shape)
        assert fp8kit.encode(x).shape == shape
        assert fp8kit.quantize(x, scaling="row").data.shape == shape
    w = fp8kit.PackedWeight(fp8kit.quantize(torch.randn(32, 16), scaling="row"))
    assert fp8kit.gemm(torch.zeros(0, 16), w, scaling="row").shape == (0, 32)
    bias = torch.randn(32)
    d = fp8kit.gemm(torch.zeros(3, 0), fp8kit.quantize(torch.zeros(32, 0), scaling="row"), scaling="row", bias=bias)
    assert torch.equal(d, bias.expand(3, 32))

# ---- quantize against a float32 numpy implementation of docs/NUMERICS.md ----

def numpy_quantize(x, fmt, group_rows, group_cols):
    """Per group: amax; scale = float32(fp8_max / amax) (1 when amax is 0); codes = encode(float32(x *
    scale)) saturating; scale_inv = float32(1 / scale)."""
    top = np.float32(ml_dtypes.finfo(ML[fmt]).max)
    rows, cols = x.shape
    codes = np.empty(x.shape, np.uint8)
    scale_inv = np.empty((-(-rows // group_rows), -(-cols // group_cols)), np.float32)
    for gi in range(scale_inv.shape[0]):
        for gj in range(scale_inv.shape[1]):
            sl = (slice(gi * group_rows, (gi + 1) * group_rows), slice(gj * group_cols, (gj + 1) * group_cols))
            amax = np.max(np.abs(x[sl]))
            scale = np.float32(top / amax) if amax > 0 else np.float32(1)
            codes[sl] = np.clip(x[sl] * scale, -top, top).astype(ML[fmt]).view(np.uint8)
            scale_inv[gi, gj] = np.float32(1) / scale
    return codes, scale_inv


def sample_matrix(rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-20, 20, size=(rows, 1)).astype(np.float32)  # rows far apart
    x[3] = 0  # a zero row: amax 0 gives scale 1
    return x


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("scaling,group", [("tensor", None), ("row", (1, None)), ("column", (None, 1)),
                                           ("block(1x128)", (1, 128)), ("block(128x128)", (128, 128))])
def test_quantize_matches_numpy_implementation(fmt, scaling, group):
    x = sample_matrix(200, 300, seed=len(scaling))
    rows, cols = x.shape
    gr, gc = (rows, cols) if group is None else (group[0] or rows, group[1] or cols)
    want_codes, want_scale_inv = numpy_quantize(x, fmt, gr, gc)
    q = fp8kit.quantize(x, fmt, scaling)
    assert q.format == fmt and q.data.shape == x.shape and q.scale_inv.shape == want_scale_inv.shape
    assert same_codes(q.data, want_codes, fmt).all()
    assert (q.scale_inv.view(np.uint32) == want_scale_inv.view(np.uint32)).all()
    assert q.amax[0] == np.max(np.abs(x))
    # dequantize: decode(code) * scale_inv of its group, in float32.
    expanded = np.repeat(np.repeat(want_scale_inv, gr, 0)[:rows], gc, 1)[:, :cols]
    want = want_codes.view(ML[fmt]).astype(np.float32) * expanded
    assert (fp8kit.dequantize(q).view(np.uint32) == want.view(np.uint32)).all()


def test_cast_transpose_is_the_quantized_transpose():
    x = sample_matrix(130, 260, seed=5)
    q = fp8kit.quantize(x, scaling="block(1x128)", transpose=True)
    t = fp8kit.quantize(np.ascontiguousarray(x.T), scaling="block(1x128)")
    assert (q.data_t == t.data).all() and (q.scale_inv_t.view(np.uint32) == t.scale_inv.view(np.uint32)).all()
    assert fp8kit.quantize(x).data_t is None


def test_mx32_follows_the_ocp_mx_rule():
    # OCP MX v1.0: per 32 values along a row, X = 2^(floor(log2(amax)) - emax_elem) with emax_elem
    # = 8 for e4m3; codes = saturating encode of x / X; the scale is X's e8m0 code (exponent + 127).
    x = sample_matrix(8, 96, seed=9)
    x[3] = np.linspace(-1, 1, 96, dtype=np.float32)  # no zero block here: log2(0) has no exponent
    q = fp8kit.quantize(x, "e4m3fn", "mx32")
    blocks = x.reshape(8, 3, 32)
    exponent = np.floor(np.log2(np.max(np.abs(blocks), axis=2))).astype(np.int32) - 8
    assert (q.scale_inv == (exponent + 127).astype(np.uint8)).all()
    scaled = blocks * np.ldexp(np.float32(1), -exponent)[:, :, None]
    want = np.clip(scaled, -448, 448).astype(ML["e4m3fn"]).view(np.uint8).reshape(8, 96)
    assert same_codes(q.data, want, "e4m3fn").all()


def test_non_finite_inputs_propagate_or_raise_naming_the_index():
    x = np.ones((4, 8), np.float32)
    x[2, 5] = np.nan
    q = fp8kit.quantize(x, scaling="row")
    assert np.isnan(fp8kit.dequantize(q)[2, 5]) and np.isnan(q.amax[0])
    with pytest.raises(fp8kit.Error, match=r"'x' holds NaN at index \[2, 5\]"):
        fp8kit.quantize(x, scaling="row", non_finite="error")


@pytest.mark.parametrize("call,needle", [
    (lambda: fp8kit.encode(np.zeros(4, np.float32), "e9m9"), "e9m9"),
    (lambda: fp8kit.quantize(np.zeros((2, 2), np.float32), scaling="blocks"), "blocks"),
    # a block near int64's largest value overflowed the group count: a crash, or empty scales and
    # garbage codes, before the library refused it
    (lambda: fp8kit.quantize(np.ones((4, 64), np.float32), scaling="block(9223372036854775807x1)"),
     r"block 9223372036854775807x1 has a dimension above 2\^31"),
    (lambda: fp8kit.quantize(np.ones((4, 64), np.float32), scaling="block(1x9223372036854775807)"),
     r"block 1x9223372036854775807 has a dimension above 2\^31"),
    (lambda: fp8kit.quantize(np.zeros((2, 2), np.float32), mx_rounding="down"), "mx_rounding"),
    (lambda: fp8kit.decode(np.zeros(4, np.float32), "e4m3fn"), "codes"),
    (lambda: fp8kit.encode(np.zeros(4, np.int8)), "x"),
    (lambda: fp8kit.encode([1.0, 2.0]), "list"),
    (lambda: fp8kit.decode(np.zeros(4, np.uint8)), "need a format"),
    # a number is no format (its str's last dot-part, '5', was taken as the name)
    (lambda: fp8kit.encode(np.zeros(4, np.float32), 3.5), r"3.5 \(float\) where a format or dtype is asked"),
    (lambda: fp8kit.decode(np.zeros(4, np.uint8), "e4m3fn", None), r"None \(NoneType\)"),
    # C++ reads a name up to its NUL: the message would end there
    (lambda: fp8kit.encode(np.zeros(4, np.float32), "e4m3fn\0<rest>"), r"'e4m3fn\\x00<rest>' holds a null"),
])
def test_bad_input_raises_fp8kit_error_naming_it(call, needle):
    with pytest.raises(fp8kit.Error, match=needle):
        call()


# ---- torch tensors in and out ----

TORCH_FORMATS = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e4m3fnuz": "float8_e4m3fnuz",
                 "e5m2fnuz": "float8_e5m2fnuz"}


# What torch's .to(float8) does past the range (2.15, CPU): e4m3fn saturates, +-Inf included;
# the others overflow to Inf (e5m2) or NaN (fnuz). Any other mode differs on those inputs (checked).
TORCH_OVERFLOW = {"e4m3fn": "saturate", "e5m2": "nonsaturating", "e4m3fnuz": "nonsaturating",
                  "e5m2fnuz": "nonsaturating"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_casts_are_matched_bit_for_bit(fmt):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, TORCH_FORMATS[fmt])
    x = torch.from_numpy(probe_values(fmt))
    other = "nonsaturating" if TORCH_OVERFLOW[fmt] == "saturate" else "saturate"
    assert not same_codes(fp8kit.encode(x, fmt, overflow=other).view(torch.uint8).numpy(),
                          x.to(dtype).view(torch.uint8).numpy(), fmt).all()
    for src in (x, x.to(torch.bfloat16)):
        ours = fp8kit.encode(src, fmt, overflow=TORCH_OVERFLOW[fmt])
        assert ours.dtype == dtype and ours.shape == src.shape
        theirs = src.to(dtype)
        assert same_codes(ours.view(torch.uint8).numpy(), theirs.view(torch.uint8).numpy(), fmt).all()
        back = fp8kit.decode(theirs)  # a torch float8 tensor carries its format
        assert isinstance(back, torch.Tensor) and back.dtype == torch.float32
        assert torch.equal(back.nan_to_num(7.0), theirs.float().nan_to_num(7.0))


def test_torch_bfloat16_out_and_strided_torch_in():
    torch = pytest.importorskip("torch")
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    b = fp8kit.decode(codes, dtype="bfloat16")
    assert b.dtype == torch.bfloat16
    assert torch.equal(b.nan_to_num(7.0), codes.to(torch.bfloat16).nan_to_num(7.0))
    x = torch.randn(32, 48)
    assert torch.equal(fp8kit.encode(x.t()).view(torch.uint8), fp8kit.encode(x.t().contiguous()).view(torch.uint8))
