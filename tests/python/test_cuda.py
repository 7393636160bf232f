"""tests/python/test_cuda.py: the package on CUDA tensors (a build with the cuda backend, on a GPU;
skipped, saying which is missing, elsewhere): quantize on the device against the host backend bit
for bit (NUMERICS.md: every backend gives the same codes and scales); the GEMM and scaled_mm
(beside torch._scaled_mm), fp8kit.torch's inference layer and the training layer's three GEMMs
against the float64 products of the same FP8 operands, within the bound of tests/python/test_gemm.py
plus the tensor cores' narrower sums (derived in cublaslt_bound), each with a nearest wrong answer
that fails it; and the contract with torch:
outputs from torch's caching allocator (torch.cuda.memory_allocated sees them), work ordered on
torch's current stream (a side stream whose input is written after a long kernel), no host
synchronisation inside a call or a training layer's forward and backward (they return while that
kernel still runs).

Run by scripts/cuda_device_check.sh on a GPU machine, and by scripts/test.sh everywhere (skipped).
"""
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
import fp8kit  # noqa: E402
import fp8kit.torch as fp8_torch  # noqa: E402

if not fp8kit._fp8kit.cuda_built:
    pytest.skip("this fp8kit package was built without the cuda backend (no nvcc at build time)",
                allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here (torch.cuda.is_available() is False)", allow_module_level=True)

U = 2.0 ** -24
SCALINGS = ["tensor", "row", "block(1x128)", "block(128x128)", "mx32"]


def gamma(n):
    return n * U / (1 - n * U)


def randn(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 6, (shape[0], 1), generator=g).float())
    return x.to(dtype)


@pytest.mark.parametrize("shape", [(257, 384), (1, 4096), (1, 256), (2, 8192), (16, 64)])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_quantize_on_the_device_is_the_host_quantize_bit_for_bit(scaling, transpose, shape):
    # 257 rows: not a multiple of any tile or block; a decode step's rows (one of at most 256
    # columns: once cast with scale 1), and a small tensor: one group (or a row's) cast by one
    # block of threads
    x = randn(*shape, seed=1)
    host = fp8kit.quantize(x, scaling=scaling, transpose=transpose)
    dev = fp8kit.quantize(x.cuda(), scaling=scaling, transpose=transpose)
    assert dev.device == "cuda" and dev.data.is_cuda
    fields = ["data", "scale_inv", "amax"] + (["data_t", "scale_inv_t"] if transpose else [])
    for f in fields:
        want = torch.from_numpy(np.ascontiguousarray(getattr(host, f)))
        got = getattr(dev, f).cpu()
        assert got.shape == want.shape, f
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f
    # and back: dequantize on the device equals the host's
    assert torch.equal(fp8kit.dequantize(dev).cpu(), torch.from_numpy(fp8kit.dequantize(host)))


def test_quantize_outputs_come_from_torchs_allocator():
    x = randn(4096, 4096, seed=2).cuda()  # 16 MiB of codes
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    q = fp8kit.quantize(x, scaling="row")
    held = torch.cuda.memory_allocated() - before
    assert held >= x.numel(), f"torch sees {held} bytes for {x.numel()} codes"
    del q
    assert torch.cuda.memory_allocated() - before < x.numel()  # freed back to torch's cache


def test_work_runs_on_torchs_current_stream_without_a_host_sync():
    src = randn(2048, 2048, seed=3).cuda()
    x = torch.zeros_like(src)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(400_000_000)  # ~0.2 s of one SM's cycles queued on the side stream
        x.copy_(src)  # written only after it: a call on another stream would read zeros
        start = time.perf_counter()
        q = fp8kit.quantize(x, scaling="row")
        returned_after = time.perf_counter() - start
        still_running = not side.query()
    side.synchronize()
    # A synchronising call waits for the sleep; a call on another stream reads zeros.
    assert still_running and returned_after < 0.1, f"the call took {returned_after:.3f} s"
    want = fp8kit.quantize(src.cpu(), scaling="row")
    assert torch.equal(q.data.cpu(), torch.from_numpy(np.ascontiguousarray(want.data)))


def groups(scaling, rows, cols):
    """The (rows, cols) of one scale's group for a scaling of a [rows, cols] operand."""
    return {"tensor": (rows, cols), "row": (1, cols), "block(1x128)": (1, 128),
            "block(128x128)": (128, 128)}[scaling]


def deq64(q, scaling):
    """float64 values of a QTensor (host or device): decode(code) * scale_inv of its group."""
    data, scale = q.data, q.scale_inv
    data = data.cpu() if isinstance(data, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(data))
    scale = scale.cpu() if isinstance(scale, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(scale))
    codes = data.view(getattr(torch, "float8_" + q.format)).double()
    gr, gc = groups(scaling, *codes.shape)
    s = scale.double().reshape(-(-codes.shape[0] // gr), -(-codes.shape[1] // gc))
    s = s.repeat_interleave(gr, 0).repeat_interleave(gc, 1)[:codes.shape[0], :codes.shape[1]]
    return codes * s


def cublaslt_bound(a64, b64):
    """The bound of D = a64 . b64^T on cuBLASLt's FP8 path, and D: test_gemm.py's float32 bound,
    gamma_(K+3) sum|a b| + 3u |D|, plus the tensor cores' narrower sums (NUMERICS.md, cuda): each
    k32 step adds 33 terms - the running sum and 32 products - aligned to the largest of them, M,
    keeping 13 bits below M's leading one, so a step is off by less than 33 * 2^-13 * M. cuBLASLt
    does not say how often it promotes its sums to float32, so the running sum is taken over all
    of K (the largest M it can be)."""
    d64 = a64 @ b64.T
    bound = gamma(a64.shape[1] + 3) * (a64.abs() @ b64.abs().T) + 3 * U * d64.abs()
    for k0 in range(0, a64.shape[1], 32):
        p = a64[:, None, k0:k0 + 32] * b64[None, :, k0:k0 + 32]  # [M, N, 32] exact products
        running = a64[:, :k0] @ b64[:, :k0].T  # the sum before this step
        bound += 33 * 2.0 ** -13 * torch.maximum(running.abs(), p.abs().amax(-1))
    return bound, d64


def test_gemms_on_two_streams_at_once_stay_within_the_bound():
    # Two streams' cuBLASLt GEMMs running at once: each takes its own workspace (one for the
    # process, as before 2026-12-04, had two GEMMs write it at once - split-K algorithms keep
    # partial sums there; PyTorch keeps one per stream). A few rows against a long K (split-K's
    # shape); each stream sleeps the same first so that their GEMMs overlap. Every D within the
    # cuBLASLt bound of its float64 product, where a workspace written by the other GEMM gives sums
    # of the wrong operands.
    m, n, k = 64, 256, 2048
    xs = [randn(m, k, seed=20 + i).cuda() for i in range(2)]
    qws = [fp8kit.quantize(randn(n, k, seed=30 + i).cuda(), scaling="row") for i in range(2)]
    pws = [fp8kit.PackedWeight(q) for q in qws]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    outs = [[], []]
    for _ in range(4):  # the streams take turns in enqueueing, so that their GEMMs interleave
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                if not outs[i]:
                    torch.cuda._sleep(50_000_000)
                outs[i] += [fp8kit.gemm(xs[i], pws[i], scaling="row") for _ in range(4)]
    torch.cuda.synchronize()
    for i in range(2):
        tol, d64 = cublaslt_bound(deq64(fp8kit.quantize(xs[i].cpu(), scaling="row"), "row"), deq64(qws[i], "row"))
        for got in outs[i]:
            assert torch.all((got.cpu().double() - d64).abs() <= tol)


def shifted_rows(d64, scale):
    """The nearest wrong D of a per-row scaled GEMM: each row scaled with its neighbour's scale."""
    s = scale.double().cpu().reshape(-1, 1)
    return d64 / s * torch.roll(s, 1, 0)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_gemm_and_scaled_mm_on_the_device_within_the_cublaslt_bound(scaling):
    m, n, k = 256, 384, 1024  # multiples of 16: cuBLASLt's FP8 path
    x, w = randn(m, k, seed=4).cuda(), randn(n, k, seed=5).cuda()
    qx, qw = fp8kit.quantize(x, scaling=scaling), fp8kit.quantize(w, scaling=scaling)
    tol, d64 = cublaslt_bound(deq64(qx, scaling), deq64(qw, scaling))
    d = fp8kit.gemm(qx, fp8kit.PackedWeight(qw))
    assert d.is_cuda and d.dtype == torch.float32 and d.shape == (m, n)
    assert torch.all((d.cpu().double() - d64).abs() <= tol)
    # the nearest wrong answers - A's row scales one row off, a scale applied twice - do not pass
    wrong = shifted_rows(d64, qx.scale_inv) if scaling == "row" else d64 * qx.scale_inv.double().cpu().reshape(())
    assert torch.any((wrong - d64).abs() > tol)
    # the fused cast: bf16 x cast inside the call gives the same D as quantize-then-GEMM
    assert torch.equal(fp8kit.gemm(x, fp8kit.PackedWeight(qw), scaling=scaling), d)
    # torch._scaled_mm's call (b column-major), beside torch's own answer, within the same bound
    # plus the rounding to bfloat16
    if scaling == "tensor":
        sa, sb = qx.scale_inv.reshape(()), qw.scale_inv.reshape(())
    else:
        sa, sb = qx.scale_inv.reshape(m, 1), qw.scale_inv.reshape(1, n)
    a8, b8 = qx.data.view(torch.float8_e4m3fn), qw.data.view(torch.float8_e4m3fn)
    ours = fp8kit.scaled_mm(a8, b8.t(), sa, sb, out_dtype=torch.bfloat16)
    theirs = torch._scaled_mm(a8, b8.t(), sa, sb, out_dtype=torch.bfloat16)
    tol_bf16 = tol + 2.0 ** -8 * d64.abs()
    assert ours.is_cuda and ours.dtype == torch.bfloat16
    assert torch.all((ours.cpu().double() - d64).abs() <= tol_bf16)
    assert torch.all((theirs.cpu().double() - d64).abs() <= tol_bf16)


def test_device_errors_name_the_argument():
    x = randn(16, 32, seed=6)
    qw = fp8kit.quantize(randn(16, 32, seed=7).cuda(), scaling="row")
    with pytest.raises(fp8kit.Error, match="encode"):
        fp8kit.encode(x.cuda())
    with pytest.raises(fp8kit.Error, match="device"):  # a host x against a device weight
        fp8kit.gemm(x, fp8kit.PackedWeight(qw), scaling="row")


@pytest.mark.parametrize("m", [64, 1, 5, 17])
@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise", "block"])
def test_inference_layer_on_the_device_within_the_bound(recipe, m):
    # One layer without bias (cuBLASLt's plain epilogue), the input cast on the device: D within
    # the bound of the float64 product of the FP8 operands - the input's as the host quantize
    # gives them (bit for bit the device's, test above), the weight's as the layer holds them.
    # m = 1 and 5: a decode step's rows (1: the decode rows' kernel, gemm_gemv.cu; 5: cuBLASLt for
    # rowwise and tensorwise, the tensor-core kernel for block - or, with FP8KIT_CUDA_GEMV=mma, the
    # decode rows' mma kernel, which takes m <= 16); m = 17: past both.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 384, bias=False))
    fp8_torch.quantize_(model, recipe)
    layer = model[0]
    x_scaling, w_scaling = fp8kit._fp8kit.recipe_scalings(recipe)
    x = randn(m, 256, dtype=torch.float32, seed=8)
    a64 = deq64(fp8kit.quantize(x, scaling=x_scaling), x_scaling)
    b64 = deq64(fp8kit.qtensor(layer.weight, layer.weight_scale_inv, w_scaling), w_scaling)
    tol, d64 = cublaslt_bound(a64, b64)
    dev = layer.cuda()
    got = dev(x.cuda())
    assert got.is_cuda and got.dtype == torch.float32 and got.shape == (m, 384)
    assert torch.all((got.cpu().double() - d64).abs() <= tol)
    # the nearest wrong answer: the input's scales one row off (its rows differ in magnitude), or
    # its one scale (one row: its first) applied twice
    x_scales = torch.from_numpy(np.ascontiguousarray(fp8kit.quantize(x, scaling=x_scaling).scale_inv))
    wrong = (d64 * x_scales.double().reshape(-1)[0] if x_scaling == "tensor" or m == 1 else
             shifted_rows(d64, x_scales[:, :1]))
    assert torch.any((wrong - d64).abs() > tol)
    # bfloat16 in, bfloat16 out; empty batches give empty results, as nn.Linear
    assert dev(x.cuda().bfloat16()).dtype == torch.bfloat16
    assert dev(torch.empty(0, 256, device="cuda")).shape == (0, 384)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_training_layer_on_the_device_matches_the_float64_gemms(recipe):
    # loss = sum(y * g) with g fixed: dY = g on both devices, so each of the three GEMMs (y, dX,
    # dW) multiplies the same FP8 operands on the GPU as the host recipe's casts give, and lands
    # within the cuBLASLt bound of their float64 product.
    torch.manual_seed(1)
    layer = fp8_torch.convert_to_float8_training(torch.nn.Linear(256, 512, bias=False), config=recipe).cuda()
    x = randn(128, 256, dtype=torch.float32, seed=9).cuda().requires_grad_()
    g = randn(128, 512, dtype=torch.float32, seed=10).cuda()
    y = layer(x)
    (y * g).sum().backward()
    rq = fp8kit._fp8kit.recipe_quantize
    r = fp8_torch.TRAINING_RECIPES[recipe][0]
    host = lambda t, role: rq(fp8kit._to_extension(t.detach().cpu()), r, role, False)  # noqa: E731
    scal = lambda role: fp8kit._fp8kit.recipe_scaling(r, role)  # noqa: E731
    w = layer.weight.detach()
    cases = [(y, host(x, "input"), "input", host(w, "weight"), "weight"),
             (x.grad, host(g, "grad_output"), "grad_output", host(w.t().contiguous(), "weight"), "weight"),
             (layer.weight.grad, host(g.t().contiguous(), "grad_output"), "grad_output",
              host(x.t().contiguous(), "input"), "input")]
    for got, qa, ra, qb, rb in cases:
        a64, b64 = deq64(qa, scal(ra)), deq64(qb, scal(rb))
        tol, d64 = cublaslt_bound(a64, b64)
        assert got.is_cuda
        assert torch.all((got.detach().cpu().double() - d64).abs() <= tol)
        # the nearest wrong answer: a's largest row scaled as its neighbour (rows differ in magnitude)
        row = a64.abs().amax(1).argmax()
        wrong = d64.clone()
        wrong[row] *= 2
        assert torch.any((wrong - d64).abs() > tol)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "block"])
def test_training_step_returns_while_the_gpu_still_works(recipe, accumulate):
    # A Float8Linear's forward and backward only enqueue their casts and GEMMs on torch's current
    # stream: with ~0.2 s of work queued ahead of them, they return before it ends. A step that
    # synchronises anywhere (a scale read back, a host copy, a synchronising free) waits for it -
    # and on a GPU, whose steps take milliseconds, would run host and device one after the other.
    # Both ways a training loop meets the gradients: set to None (zero_grad's default), or
    # accumulated into (gradient accumulation over micro-batches). The timed step follows one of
    # its own kind: the first step of a kind in a process may wait once - seen on an H200 for
    # torch's own bf16 nn.Linear at its first gradient accumulation (0.2 s, the queued sleep) and
    # never after; CUDA loads kernels lazily by default (CUDA_MODULE_LOADING=LAZY).
    torch.manual_seed(2)
    layer = fp8_torch.convert_to_float8_training(torch.nn.Linear(1024, 1024), config=recipe).cuda().bfloat16()
    x = randn(512, 1024, seed=11).cuda().requires_grad_()

    def step():
        if not accumulate:
            x.grad = layer.weight.grad = layer.bias.grad = None
        layer(x).sum().backward()

    step()  # sets up cuBLASLt, autograd's device thread and the gradients
    step()  # the same kind of step as the timed one: every kernel it launches is loaded
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)
    start = time.perf_counter()
    step()
    took = time.perf_counter() - start
    still_running = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_running and took < 0.1, f"forward + backward took {took:.3f} s"
