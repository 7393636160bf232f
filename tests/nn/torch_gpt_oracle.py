#!/usr/bin/env python3
"""tests/nn/torch_gpt_oracle.py: PyTorch (CPU, float32) as an outside oracle for fp8kit's GPT.

    torch_gpt_oracle.py REQUEST RESPONSE

tests/nn/test_torch_gpt.cpp writes a GPT's configuration, its weights, tokens and targets to
REQUEST; this script builds the same GPT-2 forward pass from torch operations (nn.functional
layer_norm, gelu(approximate="tanh"), causal softmax attention, cross_entropy), runs it and its
backward with autograd, and writes logits, loss and every parameter's gradient to RESPONSE.
All numbers are little-endian.

REQUEST:  b"FP8KGPT1", i64 layers, width, heads, context, vocab, B, T;
          i32 tokens [B, T], i32 targets [B, T]; u32 parameter count, then per parameter:
          u32 name length, name (utf-8), u32 rank, i64 dims[rank], f32 values (row-major)
RESPONSE: b"FP8KGPT1", f32 logits [B, T, vocab], f32 loss, then each parameter's gradient
          (f32, the request's order and shapes)

Exit status 77 (the test reports itself skipped) only when numpy or torch is not installed
(tests/oracle_skip.py); the reason goes to stderr.
"""
import math
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from oracle_skip import require  # noqa: E402  (tests/oracle_skip.py: skip only when not installed)

MAGIC = b"FP8KGPT1"


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: torch_gpt_oracle.py REQUEST RESPONSE", file=sys.stderr)
        return 2
    np, torch, F = require("numpy", "torch", "torch.nn.functional")
    torch.set_num_threads(1)
    data = open(sys.argv[1], "rb").read()
    if data[:8] != MAGIC:
        print("bad request magic", file=sys.stderr)
        return 1
    off = 8
    layers, width, heads, context, vocab, b, t = struct.unpack_from("<7q", data, off)
    off += 56
    tokens = torch.from_numpy(np.frombuffer(data, np.int32, b * t, off).astype(np.int64).reshape(b, t))
    off += 4 * b * t
    targets = torch.from_numpy(np.frombuffer(data, np.int32, b * t, off).astype(np.int64).reshape(b, t))
    off += 4 * b * t
    (count,) = struct.unpack_from("<I", data, off)
    off += 4
    names, p = [], {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + n].decode()
        off += n
        (rank,) = struct.unpack_from("<I", data, off)
        off += 4
        dims = struct.unpack_from(f"<{rank}q", data, off)
        off += 8 * rank
        numel = math.prod(dims)
        value = np.frombuffer(data, np.float32, numel, off).reshape(dims).copy()
        off += 4 * numel
        names.append(name)
        p[name] = torch.from_numpy(value).requires_grad_(True)

    c, nh = width, heads
    hs = c // nh

    def linear(x, name, bias=True):
        return F.linear(x, p[name + ".weight"], p[name + ".bias"] if bias else None)

    def layer_norm(x, name):
        return F.layer_norm(x, (c,), p[name + ".weight"], p[name + ".bias"], eps=1e-5)

    x = p["tok_embed.weight"][tokens] + p["pos_embed.weight"][torch.arange(t)]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(layers):
        pre = f"blocks.{i}."
        qkv = linear(layer_norm(x, pre + "norm1"), pre + "attn.qkv")  # [B, T, 3C]
        q, k, v = (z.view(b, t, nh, hs).transpose(1, 2) for z in qkv.split(c, dim=2))  # [B, NH, T, hs]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + linear(y, pre + "attn.proj")
        h = F.gelu(linear(layer_norm(x, pre + "norm2"), pre + "mlp.fc1"), approximate="tanh")
        x = x + linear(h, pre + "mlp.fc2")
    logits = linear(layer_norm(x, "norm_f"), "lm_head", bias=False)  # [B, T, V]
    loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
    loss.backward()

    with open(sys.argv[2], "wb") as out:
        out.write(MAGIC)
        out.write(logits.detach().numpy().astype("<f4").tobytes())
        out.write(struct.pack("<f", loss.item()))
        for name in names:
            out.write(p[name].grad.numpy().astype("<f4").tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
