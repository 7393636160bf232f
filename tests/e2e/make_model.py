# tests/e2e/make_model.py OUT [--shards N]: a small transformer-shaped checkpoint with N(0,1)
# weights, written by the safetensors Python package (numpy), independent of fp8kit: 2-D linear
# weights (f32 and f16, shapes not multiples of 128 or 32 among them), an embedding, norms, a
# bias, an lm_head, an int64 buffer. With --shards N > 1, OUT is a directory of shards with
# model.safetensors.index.json and a config.json. Used by tests/e2e/test_checkpoint.sh.
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file


def tensors():
    rng = np.random.default_rng(1234)
    t = {"model.embed_tokens.weight": rng.standard_normal((64, 96)).astype(np.float32)}
    for i in range(2):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(96, np.float32)
        t[p + "self_attn.q_proj.weight"] = rng.standard_normal((96, 96)).astype(np.float32)
        t[p + "self_attn.o_proj.weight"] = rng.standard_normal((96, 96)).astype(np.float16)
        t[p + "mlp.up_proj.weight"] = rng.standard_normal((200, 96)).astype(np.float32)
        t[p + "mlp.up_proj.bias"] = rng.standard_normal(200).astype(np.float32)
        t[p + "mlp.down_proj.weight"] = rng.standard_normal((96, 200)).astype(np.float32)
    t["model.norm.weight"] = np.ones(96, np.float32)
    t["lm_head.weight"] = rng.standard_normal((64, 96)).astype(np.float32)
    t["model.position_ids"] = np.arange(16, dtype=np.int64).reshape(1, 16)
    return t


def main():
    out = sys.argv[1]
    shards = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--shards" else 1
    t = tensors()
    if shards == 1:
        save_file(t, out, metadata={"format": "pt"})
        return
    os.makedirs(out)
    names = list(t)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: t[n] for n in part}, os.path.join(out, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    size = sum(a.nbytes for a in t.values())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": weight_map}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "hidden_size": 96}, f)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        f.write('{"tokens": []}\n')


main()
