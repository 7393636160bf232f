"""tests/python/test_checkpoint_ecosystem.py FP8KIT: fp8kit's checkpoint commands against the FP8
checkpoint ecosystem itself, on the CPU, nothing downloaded (HF_HUB_OFFLINE=1):

Reading what real producers write. llm-compressor (oneshot) quantizes two models built from a
config with random weights - a transformers Llama and a Qwen2-MoE (experts, shared expert, router)
- with FP8_DYNAMIC (channel scales, dynamic activations), FP8_BLOCK (128x128 blocks), FP8
(tensor scales with a static input_scale, calibrated on a few random samples) and, on the Llama,
MXFP8 (mxfp8-quantized: e8m0 scales per 1 x 32 stored as uint8 codes). For each:
  - `fp8kit inspect --json` names the scheme and the producer;
  - `fp8kit verify BASE OUT --min-sqnr 25` passes (25 dB: docs/NUMERICS.md's floor for e4m3 weights);
  - `fp8kit dequantize OUT --dtype bf16` equals, bit for bit, compressed-tensors' own
    decompression (transformers from_pretrained with run_compressed=False), for every weight.
A 3-D MoE expert tensor [experts, out, in] with [experts, out, 1] scales, stacked from
llm-compressor's per-expert output, dequantizes to the stack of the per-expert results.

Writing what loaders read. `fp8kit quantize` of the random Llama with --scheme channel and tensor
(compressed-tensors layout), block128 (hf-fp8: transformers FineGrainedFP8 / DeepSeek-V3),
block128 --layout compressed-tensors and mx32 (compressed-tensors' MXFP8); for each:
  - compressed-tensors parses the quantization_config (its models forbid extra keys);
  - transformers from_pretrained loads it on the CPU (decompressing / dequantizing), and its logits
    (activation quantization off: the dequantized model has none) equal, exactly, those of the
    bf16 model fp8kit dequantize writes from the same output;
  - vLLM's config parsers accept it when vllm imports (not installed by setup.sh: it needs CUDA).

Exit 77 (skipped) only when an import fails with ImportError; any failure: exit 1, listing each.
Run by ctest as checkpoint_ecosystem (labels e2e, slow).
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM
    import compressed_tensors
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.config import CompressionFormat  # noqa: F401  (the format names)
    import llmcompressor
    from llmcompressor import oneshot  # noqa: F401  (llm_compressor_producer's)
    from llmcompressor.modifiers.quantization import QuantizationModifier  # noqa: F401  (llm_compressor_producer's)
    from datasets import Dataset  # noqa: F401  (llm_compressor_producer's)
except ImportError as e:
    print(f"skipped: {e} (scripts/setup.sh installs tests/requirements-checkpoints.txt)")
    sys.exit(77)

from llm_compressor_producer import produce  # noqa: E402  (beside this file)

FP8KIT = sys.argv[1]
errors = []


def fail(msg):
    print("FAIL: " + msg)
    errors.append(msg)


def ok(msg):
    print("ok: " + msg)


def fp8kit(*args, expect=0):
    r = subprocess.run([FP8KIT, *args], capture_output=True, text=True)
    if r.returncode != expect:
        fail(f"fp8kit {' '.join(args)}: exit {r.returncode} (expected {expect}): {r.stderr.strip()}")
    return r


def tensors(path):
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), "pt") as s:
                out.update({k: s.get_tensor(k) for k in s.keys()})
    return out


def llama(path):
    torch.manual_seed(0)
    # Dims in whole 128x128 blocks (FP8_BLOCK and the hf-fp8 layout need them); k/v_proj 128 x 256.
    cfg = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


def qwen2_moe(path):
    torch.manual_seed(1)
    cfg = Qwen2MoeConfig(vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                         shared_expert_intermediate_size=256, num_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    Qwen2MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)




def ct_decompressed(path, stored):
    """compressed-tensors' own decompression of a checkpoint: through transformers (on the CPU) for
    every weight its model keeps under the checkpoint's name, else (transformers 5 fuses MoE
    experts into 3-D parameters) compressed-tensors' float-quantized compressor per module."""
    from transformers import CompressedTensorsConfig
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                             quantization_config=CompressedTensorsConfig(run_compressed=False))
    out = dict(m.state_dict())
    group = next(iter(json.load(open(os.path.join(path, "config.json")))["quantization_config"]["config_groups"].values()))
    scheme = QuantizationScheme.model_validate(group)
    for k, v in stored.items():
        if v.dtype == torch.float8_e4m3fn and k not in out:
            out[k] = FloatQuantizationCompressor.decompress({"weight": v, "weight_scale": stored[k + "_scale"]}, scheme)["weight"]
    return out


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def check_read(tmp, name, base, scheme, want):
    out = os.path.join(tmp, f"{name}_{scheme}")
    produce(base, out, scheme)
    label = f"{name} {scheme}"
    r = fp8kit("inspect", out, "--json")
    if r.returncode == 0:
        j = json.loads(r.stdout)
        if j["detected"] != [want] or not j["producer"].startswith("compressed-tensors"):
            fail(f"{label}: inspect detected {j['detected']} by {j['producer']}, expected {want} by compressed-tensors")
        else:
            ok(f"{label}: inspect names {want}, compressed-tensors")
        if scheme == "FP8":
            q = [t for t in j["tensors"] if isinstance(t["quantization"], dict)]
            if not q or not all(t["quantization"]["input_scale"] for t in q):
                fail(f"{label}: inspect does not show the static input_scale of every FP8 weight")
    r = fp8kit("verify", base, out, "--min-sqnr", "25", "--json")
    if r.returncode == 0:
        v = json.loads(r.stdout)
        lowest = min(t["sqnr_db"] for t in v["tensors"] if t["sqnr_db"] is not None)
        ok(f"{label}: verify >= 25 dB (lowest {lowest:.1f} dB)")
    deq = os.path.join(tmp, f"{name}_{scheme}_deq")
    fp8kit("dequantize", out, deq, "--dtype", "bf16")
    if os.path.isdir(deq):
        stored = tensors(out)
        mine, theirs = tensors(deq), ct_decompressed(out, stored)
        bad = [k for k, v in stored.items() if v.dtype == torch.float8_e4m3fn and not same_bits(mine[k], theirs[k])]
        n = sum(1 for v in stored.values() if v.dtype == torch.float8_e4m3fn)
        extra = [k for k in mine if k.endswith(("_scale", "input_scale"))]
        if bad or extra or n == 0:
            fail(f"{label}: dequantize differs from compressed-tensors for {bad[:3]} ({len(bad)} of {n}); scales left: {extra[:3]}")
        else:
            ok(f"{label}: dequantize equals compressed-tensors' decompression bit for bit ({n} FP8 weights)")
    return out


def check_3d_experts(tmp, moe_out):
    """Per-expert FP8 weights and channel scales stacked into [E, out, in] / [E, out, 1]."""
    t = tensors(moe_out)
    experts = sorted({int(k.split(".experts.")[1].split(".")[0]) for k in t if ".experts." in k})
    fused = {k: v for k, v in t.items() if ".experts." not in k}
    for p in ("gate_proj", "up_proj", "down_proj"):
        w = [t[f"model.layers.0.mlp.experts.{e}.{p}.weight"] for e in experts]
        s = [t[f"model.layers.0.mlp.experts.{e}.{p}.weight_scale"] for e in experts]
        fused[f"model.layers.0.mlp.experts.{p}.weight"] = torch.stack(w)
        fused[f"model.layers.0.mlp.experts.{p}.weight_scale"] = torch.stack(s)
    path = os.path.join(tmp, "experts3d.safetensors")
    save_file(fused, path)
    r = fp8kit("inspect", path, "--json")
    deq = os.path.join(tmp, "experts3d_deq.safetensors")
    fp8kit("dequantize", path, deq, "--dtype", "bf16")
    per_expert = os.path.join(tmp, "moe_deq")  # written by check_read for FP8_DYNAMIC
    if r.returncode != 0 or not os.path.exists(deq):
        return
    # The FP8 file read through its 3-D scales against its bf16 dequantization: they differ only by
    # bf16 rounding (relative error <= 2^-9: >= 54 dB); a scale applied along the wrong axis would
    # be near 0 dB.
    fp8kit("verify", deq, path, "--min-sqnr", "50")
    d3, d2 = tensors_file(deq), tensors(per_expert)
    bad = []
    for p in ("gate_proj", "up_proj", "down_proj"):
        want = torch.stack([d2[f"model.layers.0.mlp.experts.{e}.{p}.weight"] for e in experts])
        if not same_bits(d3[f"model.layers.0.mlp.experts.{p}.weight"], want):
            bad.append(p)
    q = {t["name"]: t["quantization"] for t in json.loads(r.stdout)["tensors"]}
    if bad or q["model.layers.0.mlp.experts.up_proj.weight"]["scheme"] != "channel":
        fail(f"3-D experts: {bad} differ from the per-expert dequantization, or not read as channel: {q['model.layers.0.mlp.experts.up_proj.weight']}")
    else:
        ok("3-D expert tensors [E, out, in] with [E, out, 1] scales: read, and dequantized as each expert")


def tensors_file(path):
    with safe_open(path, "pt") as s:
        return {k: s.get_tensor(k) for k in s.keys()}


def logits(path, **kw):
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kw)
    m.eval()
    # A compressed-tensors model quantizes its activations on the fly (the config's dynamic
    # per-token / per-group input_activations), which the dequantized bf16 model does not: that
    # part is switched off, so what is compared is the weights as loaded, through the whole model.
    from compressed_tensors.quantization.lifecycle.helpers import disable_quantization
    m.apply(disable_quantization)
    ids = torch.arange(0, 48, dtype=torch.long).reshape(2, 24) * 5 % 256
    with torch.no_grad():
        return m(ids).logits


def check_write(tmp, base, scheme, layout, want_method):
    out = os.path.join(tmp, f"w_{scheme}_{layout}")
    fp8kit("quantize", base, out, "--scheme", scheme, "--layout", layout, "--quiet")
    if not os.path.isdir(out):
        return
    label = f"quantize --scheme {scheme} --layout {layout}"
    qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    if qc["quant_method"] != want_method:
        fail(f"{label}: quant_method {qc['quant_method']}, expected {want_method}")
    if want_method == "compressed-tensors":
        try:
            from compressed_tensors.quantization import QuantizationConfig
            QuantizationConfig.model_validate(qc)  # pydantic: unknown or mistyped keys fail
            # As transformers hands it over: its CompressedTensorsConfig parsed from the dict.
            if ModelCompressor.from_compression_config(transformers.CompressedTensorsConfig.from_dict(qc)) is None:
                raise ValueError("ModelCompressor found no compression in it")
            ok(f"{label}: compressed-tensors parses the quantization_config (QuantizationConfig, ModelCompressor)")
        except Exception as e:  # noqa: BLE001 - any rejection is the finding
            fail(f"{label}: compressed-tensors rejects the quantization_config: {e}")
        kw = {"quantization_config": transformers.CompressedTensorsConfig(run_compressed=False)}
    else:
        kw = {}  # the file's own config; without a GPU transformers dequantizes it to bf16
    deq = out + "_deq"
    fp8kit("dequantize", out, deq, "--dtype", "bf16", "--quiet")
    try:
        theirs = logits(out, **kw)
        mine = logits(deq)
        if torch.equal(theirs, mine):
            ok(f"{label}: transformers loads it; logits equal fp8kit's dequantized model's exactly")
        else:
            fail(f"{label}: transformers' logits differ from fp8kit's dequantized model's by up to "
                 f"{(theirs.float() - mine.float()).abs().max().item()}")
    except Exception as e:  # noqa: BLE001
        fail(f"{label}: transformers from_pretrained failed: {type(e).__name__}: {e}")
    try:
        import vllm  # noqa: F401
    except ImportError:
        print(f"note: {label}: vllm does not import here (not installed: it needs CUDA); its config parsers not checked")
        return
    try:
        if want_method == "compressed-tensors":
            from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig as V
        else:
            from vllm.model_executor.layers.quantization.fp8 import Fp8Config as V
        V.from_config(qc)
        ok(f"{label}: vLLM's config parser accepts it")
    except Exception as e:  # noqa: BLE001
        fail(f"{label}: vLLM's config parser rejects it: {e}")


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, compressed-tensors "
          f"{compressed_tensors.__version__}, llm-compressor {llmcompressor.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        base, moe = os.path.join(tmp, "llama"), os.path.join(tmp, "moe")
        llama(base)
        qwen2_moe(moe)
        for scheme, want in (("FP8_DYNAMIC", "channel"), ("FP8_BLOCK", "block128"), ("FP8", "tensor"), ("MXFP8", "mx32")):
            check_read(tmp, "llama", base, scheme, want)
        moe_out = check_read(tmp, "moe", moe, "FP8_DYNAMIC", "channel")
        os.rename(moe_out + "_deq", os.path.join(tmp, "moe_deq")) if os.path.isdir(moe_out + "_deq") else None
        check_3d_experts(tmp, moe_out)
        for scheme, layout, method in (("channel", "compressed-tensors", "compressed-tensors"),
                                       ("tensor", "compressed-tensors", "compressed-tensors"),
                                       ("block128", "compressed-tensors", "compressed-tensors"),
                                       ("mx32", "compressed-tensors", "compressed-tensors"),
                                       ("block128", "hf-fp8", "fp8")):
            check_write(tmp, base, scheme, layout, method)
    if errors:
        print(f"{len(errors)} failed")
        sys.exit(1)
    print("all passed")


main()
