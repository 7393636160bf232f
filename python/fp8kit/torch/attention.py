"""fp8kit.torch.attention: transformers' attention function "fp8kit" - a decode step's attention
over the KV cache on fp8kit's kernel (fp8kit::attention_decode), everything else as "sdpa".

A decode step reads the whole KV cache for one new token; on a CPU without bfloat16 arithmetic
(AVX2) torch's scaled_dot_product_attention reads a bfloat16 cache at a tenth of the speed it
reads a float32 one, and with a mask (a StaticCache's) transformers first copies each key/value
head for every query head that shares it (grouped-query attention). fp8kit's kernel reads each
key/value row once for all the query heads that share it, widening bfloat16 / float16 to float32
as it reads, with the softmax in float32 as torch's. The function takes transformers' attention
interface (AttentionInterface) and runs fp8kit's kernel where it applies - host tensors, up to
decode_rows new positions, a boolean mask or none, no dropout, no gradient, not under tracing -
and transformers' own sdpa_attention_forward for everything else (prefill, GPUs, training); a model
whose attention asks for sinks or soft-capping (_EAGER_ONLY) runs its own eager attention.

    model = fp8kit.torch.from_pretrained(path)                   # "fp8kit" attention by default
    model.set_attn_implementation(fp8kit.torch.register_attention())  # any transformers model

Checked by tests/python/test_attention.py (against torch's scaled_dot_product_attention in
float64 on the same inputs, a Llama and a Qwen2 from configs decoding with each cache, the
fall-backs); the kernel by tests/ops/test_attention.cpp.
"""
import functools
import math
import sys

import torch

import fp8kit

NAME = "fp8kit"
# Up to this many new positions (a decode step, speculative decoding's few) run on fp8kit's kernel;
# a longer prompt is a prefill, a GEMM's work, which torch's flash kernel does as one.
DECODE_ROWS = 16
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# What a model's attention may ask for that neither the kernel nor sdpa computes - attention sinks
# (GPT-OSS's s_aux), logit soft-capping (Gemma 2's softcap): given one, the model's own eager
# attention runs (sdpa would leave it out, silently).
_EAGER_ONLY = ("s_aux", "softcap")


def register_attention():
    """Registers the "fp8kit" attention function with transformers (once) and returns its name, for
    from_pretrained(..., attn_implementation=) or model.set_attn_implementation()."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register(NAME, attention_forward)
    # sdpa's masks (boolean, or None where every key is attended): transformers gives an attention
    # function it has no mask function for no mask at all - a StaticCache's unwritten tail would be
    # attended.
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


@functools.cache
def _sdpa_attention_forward():
    """transformers' sdpa_attention_forward, imported once: an import statement through
    transformers' lazy modules takes ~70 us a call, as long as a decode step's attention itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward


def _mask_rows(mask, b, s, l):
    """transformers' boolean mask [B or 1, 1, S, L] as [B or 1, S, L] rows, contiguous (a contiguous
    mask as it is: the same bytes); None where it has another form (the caller then uses sdpa)."""
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[0] not in (1, b) \
            or mask.shape[2] != s or mask.shape[3] != l:
        return None
    return mask if mask.is_contiguous() else mask[:, 0].contiguous()


def _model_eager(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """The model's own eager attention (its modeling file's eager_attention_forward), given the
    boolean mask as eager takes it: additive, 0 where attended, the dtype's lowest elsewhere (as
    transformers' eager_mask); an fp8kit.Error where the model's file has none."""
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        asked = ", ".join(k for k in _EAGER_ONLY if kwargs.get(k) is not None)
        raise fp8kit.Error(f"fp8kit.torch's attention: {type(module).__name__} asks for {asked}, which neither fp8kit's "
                           "kernel nor sdpa computes; run the model with attn_implementation='eager'")
    s, l = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is None and s > 1 and causal:  # sdpa's mask function leaves it to is_causal: eager has none
        attention_mask = torch.ones(s, l, dtype=torch.bool, device=query.device).tril(l - s)[None, None]
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention function: query [B, Hq, S, D], key and value [B, Hkv, L, D] ->
    (out [B, S, Hq, D], None), as sdpa_attention_forward returns it."""
    if any(kwargs.get(k) is not None for k in _EAGER_ONLY):
        return _model_eager(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
    b, hq, s, d = query.shape
    hkv, l = key.shape[1], key.shape[2]
    mask = None
    usable = (query.device.type == "cpu" and query.dtype in _DTYPES and key.dtype == query.dtype
              and value.dtype == query.dtype and value.shape == key.shape and key.shape[0] == b and key.shape[3] == d
              and 0 < s <= DECODE_ROWS and l > 0 and d <= 512 and hq % hkv == 0 and kwargs.get("position_bias") is None
              and not (dropout and module.training) and kwargs.get("output_attentions") is not True
              and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad))
              and not torch.compiler.is_compiling())
    if usable and attention_mask is not None:
        mask = _mask_rows(attention_mask, b, s, l)
        usable = mask is not None
    elif usable and s > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        usable = False  # causal without a mask: sdpa's top-left alignment, sdpa's to apply
    if not usable:
        return _sdpa_attention_forward()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    q = query.contiguous()
    k = key.contiguous()
    v = value.contiguous()
    out = torch.empty((b, s, hq, d), dtype=query.dtype)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    fp8kit._fp8kit.attention_decode(out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                    0 if mask is None else mask.data_ptr(), _DTYPES[query.dtype], (b, hq, s, d), hkv, l,
                                    0 if mask is None else mask.shape[0], float(scale))
    return out, None
