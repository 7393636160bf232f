#!/usr/bin/env python3
"""tests/nn/torch_adamw_oracle.py: torch.optim.AdamW (CPU, float32) as the outside oracle for
fp8kit::nn::AdamW.

    torch_adamw_oracle.py REQUEST RESPONSE

tests/nn/test_torch_adamw.cpp writes AdamW's options, a learning rate per step, parameters and
each step's gradients to REQUEST; this script runs the steps with torch.optim.AdamW - weight decay
on the parameters of rank >= 2 only (a second param group with weight_decay 0, as nanoGPT) - and
writes the parameters after the last step. For the test to show that its tolerance tells a wrong
optimizer from the right one it also writes two near misses: AdamW decaying every parameter, and
torch.optim.Adam with the same weight_decay (L2 added to the gradient: coupled, not decoupled).
All numbers are little-endian.

REQUEST:  b"FP8KADW1", f32 beta1, beta2, eps, weight_decay, i64 steps S, f32 lr[S], u32 count,
          then per parameter: u32 rank, i64 dims[rank], f32 value (row-major), f32 grad[S][numel]
RESPONSE: b"FP8KADW1", then for each of (AdamW, AdamW decaying all, Adam with L2) every
          parameter's final value (f32, the request's order)

Exit status 77 (skipped) only when numpy or torch is not installed (tests/oracle_skip.py).
"""
import math
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from oracle_skip import require  # noqa: E402  (tests/oracle_skip.py: skip only when not installed)

MAGIC = b"FP8KADW1"


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: torch_adamw_oracle.py REQUEST RESPONSE", file=sys.stderr)
        return 2
    np, torch = require("numpy", "torch")
    torch.set_num_threads(1)
    data = open(sys.argv[1], "rb").read()
    if data[:8] != MAGIC:
        print("bad request magic", file=sys.stderr)
        return 1
    off = 8
    beta1, beta2, eps, wd = struct.unpack_from("<4f", data, off)
    off += 16
    (steps,) = struct.unpack_from("<q", data, off)
    off += 8
    lrs = struct.unpack_from(f"<{steps}f", data, off)
    off += 4 * steps
    (count,) = struct.unpack_from("<I", data, off)
    off += 4
    values, grads = [], []
    for _ in range(count):
        (rank,) = struct.unpack_from("<I", data, off)
        off += 4
        dims = struct.unpack_from(f"<{rank}q", data, off)
        off += 8 * rank
        n = math.prod(dims)
        values.append(np.frombuffer(data, np.float32, n, off).reshape(dims).copy())
        off += 4 * n
        grads.append(np.frombuffer(data, np.float32, steps * n, off).reshape((steps, *dims)).copy())
        off += 4 * steps * n

    def run(make, decay_all):
        params = [torch.from_numpy(v.copy()).requires_grad_(True) for v in values]
        decay = [p for p in params if decay_all or p.dim() >= 2]
        rest = [p for p in params if not (decay_all or p.dim() >= 2)]
        groups = [{"params": decay, "weight_decay": wd}] + ([{"params": rest, "weight_decay": 0.0}] if rest else [])
        opt = make(groups, lr=lrs[0], betas=(beta1, beta2), eps=eps)
        for s in range(steps):
            for g in opt.param_groups:
                g["lr"] = lrs[s]
            for p, g in zip(params, grads):
                p.grad = torch.from_numpy(g[s].copy())
            opt.step()
        return params

    with open(sys.argv[2], "wb") as out:
        out.write(MAGIC)
        for make, decay_all in ((torch.optim.AdamW, False), (torch.optim.AdamW, True), (torch.optim.Adam, False)):
            for p in run(make, decay_all):
                out.write(p.detach().numpy().astype("<f4").tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
