"""tests/python/test_attention.py: fp8kit.torch's "fp8kit" attention function (transformers'
AttentionInterface) against torch.

- The function alone, on bf16, f16 and f32 inputs with grouped-query heads and transformers' mask
  forms: against torch's scaled_dot_product_attention in float64 on the same values (key/value
  heads repeated as transformers repeats them), rounded to the dtype. Bound: one unit in the last
  place of the dtype (the two round different float results) plus 2^-12 max|v| for fp8kit's
  float32 scores and sums over at most 600 keys of N(0, 1) values (tests/ops/test_attention.cpp
  derives the element-wise bound, decode_bounds: below 2^-13 here). The nearest wrong answers -
  a key/value head read for the wrong query heads, the mask ignored, the output's positions and
  heads in the input's order, the score scale off by 1% - move outputs by far more and are shown
  to fail it.
- Models from transformers configs (a Llama, a Qwen2; grouped-query heads, float32 and bf16)
  decoding greedily with a StaticCache and a DynamicCache: each decode step runs on fp8kit's kernel
  (counted), prefill on torch's; the logits at least as close to the float64 model's as torch's own
  sdpa in the same dtype (the floor: an independent implementation's error, times 2 and plus the
  dtype's rounding of one logit), and ignoring the mask (the StaticCache's unwritten tail then
  attended) fails it.
- Everything it does not take falls back to transformers' sdpa: prefill, float64, a float mask,
  gradients; from_pretrained gives it to classes that run sdpa only.

Skipped only when transformers does not import (scripts/setup.sh installs it).
"""
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup.sh)")

import fp8kit  # noqa: E402
import fp8kit.torch  # noqa: E402
from fp8kit.torch import attention  # noqa: E402

BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}


class _Module(torch.nn.Module):
    """What transformers' attention functions read of their module."""

    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _reference(q, k, v, mask, scale):
    """torch's SDPA in float64 on the same values, [B, S, Hq, D] rounded to q's dtype."""
    g = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(g, dim=1)
    v64 = v.double().repeat_interleave(g, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q.double(), k64, v64, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def _bound(ref, v, dtype):
    """One ulp of the dtype at |ref| (<= 2^-(p-1) |ref|) + 2^-12 max|v|."""
    return ref.abs() * 2.0 ** -(BITS[dtype] - 1) + 2.0 ** -12 * v.double().abs().max()


def _inputs(dtype, b=2, hq=8, hkv=2, s=1, l=300, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g).to(dtype) for shape in ((b, hq, s, d), (b, hkv, l, d), (b, hkv, l, d)))
    mask = torch.ones(b, 1, s, l, dtype=torch.bool)
    mask[..., l - 40:] = False  # a StaticCache's unwritten tail
    mask[1, ..., :7] = False    # batch 1: padding on the left
    return q, k, v, mask


def _call(q, k, v, mask, scaling=None):
    out, weights = attention.attention_forward(_Module(q.shape[1] // k.shape[1]), q, k, v, mask, scaling=scaling)
    assert weights is None
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("s,hkv,mask_kind", [(1, 2, "bool"), (3, 8, "bool"), (1, 1, "none"), (16, 4, "bool")])
def test_matches_torch_sdpa_in_float64(dtype, s, hkv, mask_kind):
    q, k, v, mask = _inputs(dtype, s=s, hkv=hkv)
    if mask_kind == "none":
        mask = None
    calls = []
    real = fp8kit._fp8kit.attention_decode
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fp8kit._fp8kit, "attention_decode", lambda *a: calls.append(1) or real(*a))
        out = _call(q, k, v, mask)
    assert calls, "fp8kit's kernel did not run"
    assert out.dtype == dtype and out.shape == (q.shape[0], s, q.shape[1], q.shape[3]) and out.is_contiguous()
    ref = _reference(q, k, v, mask, 1 / math.sqrt(q.shape[-1]))
    bound = _bound(ref, v, dtype)
    assert ((out.double() - ref).abs() <= bound).all(), (out.double() - ref).abs().max()
    # A batch-1 mask ([1, 1, S, L], broadcast) and an explicit scale.
    if mask is not None:
        one = mask[:1]
        ref1 = _reference(q, k, v, one, 0.3)
        assert ((_call(q, k, v, one, scaling=0.3).double() - ref1).abs() <= _bound(ref1, v, dtype)).all()
        # A mask that is not contiguous: batch 1's rows broadcast (stride 0), and one cut from a
        # wider mask (a longer cache's columns); the kernel takes a contiguous mask's own bytes.
        for odd in (one.expand(mask.shape), torch.cat([mask, mask[..., :5]], -1)[..., :mask.shape[-1]]):
            assert not odd.is_contiguous()
            ref2 = _reference(q, k, v, odd, None)
            assert ((_call(q, k, v, odd).double() - ref2).abs() <= _bound(ref2, v, dtype)).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_planted_wrong_answers_fail_the_bound(dtype):
    q, k, v, mask = _inputs(dtype, s=2)
    scale = 1 / math.sqrt(q.shape[-1])
    ref = _reference(q, k, v, mask, scale)
    bound = _bound(ref, v, dtype)

    def caught(wrong):
        return bool(((wrong.double() - ref).abs() > bound).any())

    assert not caught(_call(q, k, v, mask))
    assert caught(_call(q, k.flip(1), v.flip(1), mask))                     # kv heads read for the wrong query heads
    assert caught(_call(q, k, v, None))                                     # the mask ignored
    assert caught(_call(q, k, v, mask).transpose(1, 2).reshape(ref.shape))  # [B, Hq, S, D] order kept
    assert caught(_call(q, k, v, mask, scaling=scale * 1.01))               # the scores' scale 1% off


def test_what_it_does_not_take_falls_back_to_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    q, k, v, mask = _inputs(torch.float32)
    m = _Module(4)

    def runs_kernel(*args, **kwargs):
        calls = []
        real = fp8kit._fp8kit.attention_decode
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fp8kit._fp8kit, "attention_decode", lambda *a: calls.append(1) or real(*a))
            out, _ = attention.attention_forward(m, *args, **kwargs)
        expected, _ = sdpa_attention_forward(m, *args, **kwargs)
        if not calls:  # the fall-back is sdpa's own result
            assert torch.equal(out, expected)
        return bool(calls)

    assert runs_kernel(q, k, v, mask)
    p = torch.randn(2, 8, 17, 64)
    assert not runs_kernel(p, k, v, torch.ones(2, 1, 17, 300, dtype=torch.bool))          # 17 rows: a prefill
    assert not runs_kernel(q.double(), k.double(), v.double(), mask)                     # float64
    assert not runs_kernel(q, k, v, torch.zeros(2, 1, 1, 300))                           # a float (additive) mask
    assert not runs_kernel(torch.randn(2, 8, 3, 64), k, v, None)                         # causal without a mask
    assert not runs_kernel(q.clone().requires_grad_(), k, v, mask)                       # a gradient asked for
    with torch.no_grad():
        assert runs_kernel(q.clone().requires_grad_(), k, v, mask)


def test_from_pretrained_takes_it_where_the_class_runs_sdpa():
    from fp8kit.torch.checkpoint import _attention_for
    assert _attention_for(transformers.LlamaForCausalLM, "fp8kit") == "fp8kit"
    assert _attention_for(transformers.BloomForCausalLM, "fp8kit") is None  # no sdpa: the class's own default
    assert _attention_for(None, "fp8kit") is None
    assert _attention_for(transformers.LlamaForCausalLM, "eager") == "eager"


def _models():
    llama = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    qwen = transformers.Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    return {"llama": (transformers.LlamaForCausalLM, llama), "qwen2": (transformers.Qwen2ForCausalLM, qwen)}


def _decode_logits(model, ids, steps, cache_kind, feed=None):
    """The logits of each greedy decode step after the prompt, and the tokens fed: the model's own
    picks, or `feed`'s (teacher forcing, so that two models' steps compare one for one)."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=ids.shape[1] + steps + 8) if cache_kind == "static" \
        else transformers.DynamicCache(config=model.config)
    out = model(ids, past_key_values=cache, use_cache=True)
    tok, logits, fed = out.logits[:, -1:].argmax(-1), [], []
    for i in range(steps):
        tok = feed[i] if feed is not None else tok
        fed.append(tok)
        out = model(tok, past_key_values=out.past_key_values, use_cache=True)
        logits.append(out.logits[:, -1].double())
        tok = out.logits[:, -1:].argmax(-1)
    return torch.stack(logits), fed


def _copy(cls, config, base, dtype, impl):
    model = cls(config).eval()
    model.load_state_dict(base.state_dict())
    model = model.to(dtype)
    model.set_attn_implementation(impl)
    return model


@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache_kind", ["static", "dynamic"])
def test_models_decode_on_the_kernel_as_close_as_sdpa(name, dtype, cache_kind):
    cls, config = _models()[name]
    torch.manual_seed(0)
    base = cls(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    steps = 6
    fp8kit.torch.register_attention()
    with torch.no_grad():
        ref, fed = _decode_logits(_copy(cls, config, base, torch.float64, "sdpa"), ids, steps, cache_kind)
        errors = {}
        for impl in ("sdpa", "fp8kit"):
            calls = []
            real = fp8kit._fp8kit.attention_decode
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(fp8kit._fp8kit, "attention_decode", lambda *a: calls.append(1) or real(*a))
                got, _ = _decode_logits(_copy(cls, config, base, dtype, impl), ids, steps, cache_kind, feed=fed)
            errors[impl] = (got - ref).abs().max().item()
            if impl == "fp8kit":
                assert len(calls) == steps * config.num_hidden_layers, "each decode step's attention on the kernel, prefill not"
        # The floor: twice torch's own error in this dtype plus one rounding of the largest logit.
        floor = 2 * errors["sdpa"] + ref.abs().max().item() * 2.0 ** -(BITS[dtype] - 1)
        assert errors["fp8kit"] <= floor, errors
        if cache_kind == "static":  # the mask ignored: the StaticCache's unwritten tail attended
            def unmasked(module, q, k, v, mask, **kw):
                return attention.attention_forward(module, q, k, v, None if q.shape[2] == 1 else mask, **kw)
            transformers.AttentionInterface.register("fp8kit-unmasked", unmasked)
            transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS.register("fp8kit-unmasked", transformers.masking_utils.sdpa_mask)
            wrong, _ = _decode_logits(_copy(cls, config, base, dtype, "fp8kit-unmasked"), ids, steps, cache_kind, feed=fed)
            assert (wrong - ref).abs().max().item() > floor


@pytest.mark.parametrize("family", ["gpt_oss", "gemma2"])
def test_sinks_and_soft_capping_run_the_models_own_eager_attention(family):
    # GPT-OSS's attention sinks (s_aux) and Gemma 2's logit soft-capping are part of the softmax,
    # which neither the kernel nor sdpa computes: before, both were left out silently (GPT-OSS's
    # logits 0.33 off at a scale of 0.53). Given one, the model's own eager attention runs - the
    # same code as attn_implementation="eager", so the same logits bit for bit, at prefill (the
    # causal mask sdpa leaves to is_causal made for it) and at each decode step.
    torch.manual_seed(31)
    if family == "gpt_oss":
        config = transformers.GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                           num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                                           max_position_embeddings=64,
                                           layer_types=["sliding_attention", "full_attention"])
        model = transformers.GptOssForCausalLM(config).eval()
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.sinks, std=3.0)  # trained sinks are not zero
    else:
        config = transformers.Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                           attn_logit_softcapping=0.05, max_position_embeddings=64)
        model = transformers.Gemma2ForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 10))
    runs = {}
    with torch.no_grad():
        for name in ("eager", fp8kit.torch.register_attention()):
            model.set_attn_implementation(name)
            out = model.generate(ids, max_new_tokens=4, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
            runs[name] = (model(ids).logits, torch.stack(out.logits))
    (prefill, steps), (prefill_8, steps_8) = runs.values()
    assert torch.equal(prefill_8, prefill) and torch.equal(steps_8, steps)
    # the nearest wrong answer, sdpa's (no capping; GPT-OSS's class refuses sdpa), is not it
    if family == "gemma2":
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            assert not torch.equal(model(ids).logits, prefill)
