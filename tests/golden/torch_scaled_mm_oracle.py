#!/usr/bin/env python3
"""tests/golden/torch_scaled_mm_oracle.py: PyTorch's torch._scaled_mm (on the CPU) as an outside
oracle for fp8kit::gemm.

    torch_scaled_mm_oracle.py REQUEST RESPONSE

tests/golden/test_torch_gemm.cpp quantizes its inputs with fp8kit and writes the FP8 codes and
the scales (fp8kit's scale_inv, which is what torch._scaled_mm calls scale_a / scale_b: the
dequantization factors) to REQUEST; this script multiplies them with torch._scaled_mm and writes
the products to RESPONSE. All numbers are little-endian.

REQUEST:  b"FP8KTMM1", u32 case count, then per case:
            i64 M, N, K; u8 format of A, u8 format of B (0 e4m3fn, 1 e5m2); u8 rowwise; u8 0;
            A codes [M, K] and B codes [N, K] (u8, row-major; B is [out, in] like a Linear weight);
            A scales (f32; M of them if rowwise, else 1), B scales (f32; N if rowwise, else 1)
RESPONSE: b"FP8KTMM1", then per case four f32 [M, N] row-major matrices:
            out_dtype float32 with torch's own CPU dispatch, float32 with oneDNN turned off,
            bfloat16 (widened to f32, exactly) with torch's dispatch, bfloat16 with oneDNN off.

Two torch implementations: on a CPU with AMX (int8 for equal formats, fp16 for mixed ones)
torch hands _scaled_mm to oneDNN; otherwise, and always with oneDNN turned off, it dequantizes
to float32 (code * scale) and runs a float32 GEMM. Both are what the C++ test checks against.

Exit status 77 (the test reports itself skipped) only when numpy or torch is not installed
(tests/oracle_skip.py); 1 on a malformed request, or a torch without _scaled_mm (not the pinned
version of tests/requirements-torch.txt); the reason goes to stderr.
"""
import os
import struct
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from oracle_skip import require  # noqa: E402  (tests/oracle_skip.py: skip only when not installed)

MAGIC = b"FP8KTMM1"


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: torch_scaled_mm_oracle.py REQUEST RESPONSE", file=sys.stderr)
        return 2
    np, torch = require("numpy", "torch")
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        print(f"torch {torch.__version__} has no _scaled_mm / float8 dtypes: not the version "
              "tests/requirements-torch.txt pins", file=sys.stderr)
        return 1
    formats = (torch.float8_e4m3fn, torch.float8_e5m2)
    # Turning oneDNN off and on warns that its TF32 mode is for Intel GPUs: noise in the test log.
    warnings.filterwarnings("ignore", message="TF32 acceleration")

    with open(sys.argv[1], "rb") as f:
        req = f.read()
    if req[:8] != MAGIC:
        print("request: bad magic", file=sys.stderr)
        return 1
    (count,) = struct.unpack_from("<I", req, 8)
    pos = 12

    def take(n: int, dtype) -> "np.ndarray":
        nonlocal pos
        size = n * np.dtype(dtype).itemsize
        if pos + size > len(req):
            raise ValueError("request ends early")
        a = np.frombuffer(req, dtype=dtype, count=n, offset=pos)
        pos += size
        return a

    out = [MAGIC]
    for case in range(count):
        m, n, k, fa, fb, rowwise, _ = struct.unpack_from("<qqqBBBB", req, pos)
        pos += 28
        if fa > 1 or fb > 1 or min(m, n, k) < 1:
            print(f"case {case}: bad header M={m} N={n} K={k} formats {fa} {fb}", file=sys.stderr)
            return 1
        a = torch.from_numpy(take(m * k, "<u1").copy().reshape(m, k)).view(formats[fa])
        b = torch.from_numpy(take(n * k, "<u1").copy().reshape(n, k)).view(formats[fb])
        sa = torch.from_numpy(take(m if rowwise else 1, "<f4").copy())
        sb = torch.from_numpy(take(n if rowwise else 1, "<f4").copy())
        # torch's layouts: tensorwise scales are 0-d float32 tensors; rowwise ones are [M, 1] for
        # A and [1, N] for B. B goes in as [K, N] column-major: the transposed view of [N, K].
        sa = sa.reshape(m, 1) if rowwise else sa.reshape(())
        sb = sb.reshape(1, n) if rowwise else sb.reshape(())
        for dtype in (torch.float32, torch.bfloat16):
            for onednn in (True, False):
                with torch.backends.mkldnn.flags(enabled=onednn):
                    d = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=dtype)
                if d.shape != (m, n) or d.dtype != dtype:
                    print(f"case {case}: torch returned {d.dtype} {tuple(d.shape)}", file=sys.stderr)
                    return 1
                out.append(d.float().contiguous().numpy().astype("<f4").tobytes())
    if pos != len(req):
        print(f"request: {len(req) - pos} bytes left over", file=sys.stderr)
        return 1
    with open(sys.argv[2], "wb") as f:
        f.write(b"".join(out))
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"oneDNN {'available' if torch.backends.mkldnn.is_available() else 'absent'}: {count} cases",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
