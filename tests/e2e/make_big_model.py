"""tests/e2e/make_big_model.py OUT SHARDS: a checkpoint directory of SHARDS shards, each with four
N(0,1) float32 weights of 1024 x 1024 (16 MiB a shard), an index and a config.json - big enough
that `fp8kit quantize` is still at work when tests/e2e/test_checkpoint_safety.sh interrupts it.
An OUT ending in .safetensors is one file with all those tensors instead.
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

out, shards = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(7)
if out.endswith(".safetensors"):
    save_file({f"model.layers.{s}.mlp.p{j}.weight": rng.standard_normal((1024, 1024), dtype=np.float32)
               for s in range(shards) for j in range(4)}, out, metadata={"format": "pt"})
    sys.exit(0)
os.makedirs(out)
weight_map = {}
for s in range(shards):
    file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    t = {f"model.layers.{s}.mlp.p{j}.weight": rng.standard_normal((1024, 1024), dtype=np.float32) for j in range(4)}
    save_file(t, os.path.join(out, file), metadata={"format": "pt"})
    weight_map.update({n: file for n in t})
with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": shards * 4 * 1024 * 1024 * 4}, "weight_map": weight_map}, f)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump({"model_type": "llama"}, f)
