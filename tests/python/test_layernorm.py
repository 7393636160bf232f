"""fp8kit.torch.layernorm (fuse_norms, RMSNorm): transformers' RMSNorm at a decode step's rows on
fp8kit's rmsnorm_forward, checked against the float64 function, transformers' own module (which
classes are taken, the fall-backs that are its forward) and a transformers Llama decoding.
"""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup.sh)")

import fp8kit  # noqa: E402
import fp8kit.torch as f8  # noqa: E402
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm  # noqa: E402

U = 2.0 ** -24  # float32's unit roundoff


def llama_norm(c, eps, seed):
    torch.manual_seed(seed)
    norm = LlamaRMSNorm(c, eps=eps)
    torch.nn.init.normal_(norm.weight)
    return norm


def test_fused_norm_is_the_float64_function_within_two_roundings():
    # y = fl(fl(x * rstd) * w), rstd in float64: |y - r| <= 2u |r| (1 + u) with r the float64
    # function. Rows 1, 3 and 16 (DECODE_ROWS), one of them tiny (mean of squares ~ eps, where an
    # eps outside the square root shows). The nearest wrong answers fail the bound: eps added after
    # the square root, the weight left out, and transformers' own float32 arithmetic on some element.
    c, eps = 1536, 1e-6
    norm = llama_norm(c, eps, 1)
    model = torch.nn.Sequential(copy.deepcopy(norm))
    assert f8.fuse_norms(model) == ["0"] and type(model[0]) is f8.RMSNorm
    w = norm.weight.detach().double().numpy()
    for rows in (1, 3, 16):
        x = torch.randn(rows, c)
        x[0] *= 1e-3
        with torch.no_grad():
            y = model(x).double().numpy()
        x64 = x.double().numpy()
        ms = (x64 ** 2).mean(-1, keepdims=True)
        r = x64 / np.sqrt(ms + eps) * w
        tol = 2 * U * (1 + U) * np.abs(r) + 2.0 ** -149
        assert np.all(np.abs(y - r) <= tol), rows
        for wrong in (x64 / (np.sqrt(ms) + eps) * w, x64 / np.sqrt(ms + eps)):
            assert np.any(np.abs(wrong - r) > tol)


def test_llama_and_its_copies_are_taken_others_are_not():
    # LlamaRMSNorm's forward and Qwen2's (transformers' modular copy) are the same code: taken.
    # Gemma's computes (1 + weight): another function. A norm with a hook keeps it (the new
    # module would drop the hook). The Parameter and the state_dict stay the original's.
    hooked = LlamaRMSNorm(64)
    hooked.register_forward_hook(lambda *_: None)
    model = torch.nn.Sequential(LlamaRMSNorm(64), Qwen2RMSNorm(64), GemmaRMSNorm(64), hooked)
    weights = [m.weight for m in model]
    keys = model.state_dict().keys()
    assert f8.fuse_norms(model) == ["0", "1"]
    assert [type(m) for m in model] == [f8.RMSNorm, f8.RMSNorm, GemmaRMSNorm, LlamaRMSNorm]
    assert all(m.weight is w for m, w in zip(model, weights)) and model.state_dict().keys() == keys
    assert f8.fuse_norms(model) == []  # nothing left to take
    shared = LlamaRMSNorm(64)
    twice = torch.nn.Sequential(shared, torch.nn.Sequential(shared))  # one norm at two places: one RMSNorm at both
    assert f8.fuse_norms(twice) == ["0"] and twice[0] is twice[1][0] and type(twice[0]) is f8.RMSNorm
    with pytest.raises(fp8kit.Error, match="fuse_norms: the model is a str"):
        f8.fuse_norms("model")


def test_what_the_kernel_does_not_take_is_transformers_forward_bit_for_bit():
    # bfloat16, more rows than a decode step's, autograd, torch.compile: transformers' own forward,
    # so the same bits (and gradients) as the original module.
    norm = llama_norm(256, 1e-5, 2)
    fused = torch.nn.Sequential(copy.deepcopy(norm))
    f8.fuse_norms(fused)
    with torch.no_grad():
        for x in (torch.randn(2, 256).bfloat16(), torch.randn(17, 256)):
            ref = norm.to(x.dtype)(x)
            assert torch.equal(fused.to(x.dtype)(x), ref)
    norm.float()
    fused.float()
    x = torch.randn(2, 256, requires_grad=True)
    y_ref, y = norm(x), fused(x)
    assert torch.equal(y, y_ref)
    g_ref = torch.autograd.grad(y_ref.sum(), (x, norm.weight))
    g = torch.autograd.grad(y.sum(), (x, fused[0].weight))
    assert all(torch.equal(a, b) for a, b in zip(g, g_ref))
    with torch.no_grad():
        x = torch.randn(2, 256)
        assert torch.equal(torch.compile(fused, backend="eager")(x), norm(x))


def test_a_llama_decodes_with_its_norms_fused():
    # A float32 transformers Llama, every RMSNorm fused (2 per layer and the final one), decoding
    # with a StaticCache: the logits of every step as the unfused model's to float32's noise (a
    # norm computed wrongly - eps misplaced, a weight lost - drops this below 40 dB).
    torch.manual_seed(3)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    plain = transformers.LlamaForCausalLM(config).eval()
    fused = copy.deepcopy(plain)
    assert len(f8.fuse_norms(fused)) == 2 * 2 + 1
    ids = torch.randint(0, 256, (1, 12))
    out = {}
    with torch.no_grad():
        for name, model in (("plain", plain), ("fused", fused)):
            cache = transformers.StaticCache(config=config, max_cache_len=24)
            gen = model.generate(ids, max_new_tokens=6, do_sample=False, past_key_values=cache, output_logits=True,
                                 return_dict_in_generate=True)
            out[name] = (gen.sequences, torch.stack(gen.logits).double())
    (seq, logits), (seq_f, logits_f) = out["plain"], out["fused"]
    sqnr = 10 * torch.log10(logits.square().sum() / (logits_f - logits).square().sum())
    assert sqnr >= 100 and torch.equal(seq_f, seq)
