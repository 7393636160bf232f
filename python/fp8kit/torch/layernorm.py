"""fp8kit.torch.layernorm: fuse_norms - transformers' RMSNorm layers (LlamaRMSNorm, and every class
that runs its forward: Mistral's, Qwen2's, Qwen3's ... copy it) computed at a decode step's few rows
of float32 by one call of fp8kit's rmsnorm_forward, where transformers' forward runs eight torch
operators; in bfloat16 and float16 (the library's norms compute in float32 and float64), at more
rows, with autograd, on a GPU and under torch.compile, transformers' own forward.

A decode step's norm normalizes one row: its cost is the operators' fixed costs, and on a small
CPU each runs cold after a weight stream has evicted torch's code and data from the caches. A
step of the bench's Llama calls 33 of them (docs/PERF.md: 3-6 ms of a 70 ms step).

Checked by tests/python/test_layernorm.py (against float64, transformers' LlamaRMSNorm on the same
input, which classes are taken, the fall-backs, a transformers Llama decoding).
"""
import functools
import sys

import torch
from torch import nn

import fp8kit

from .attention import DECODE_ROWS
from .ops import check_model_args, places

# Up to DECODE_ROWS rows (a decode step's, as for the attention function) run on fp8kit's kernel;
# a prefill's rows are torch's vectorized operators' to normalize.
_DTYPES = {torch.float32: "float32"}  # what rmsnorm_forward computes in (and float64)


@functools.cache
def _llama_forward():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    return LlamaRMSNorm.forward


def _runs_llama_forward(module):
    """Whether module computes LlamaRMSNorm's function: its class's forward is the same code
    (bytecode, constants, names; transformers' modular files copy it into other models' classes)
    reading a 1-D Parameter `weight` and a float `variance_epsilon`, and no hook sits on it (the
    new module would drop it). Gemma's (1 + weight) and any other variant run other code."""
    code = getattr(getattr(type(module), "forward", None), "__code__", None)
    want = _llama_forward().__code__
    return (code is not None and (code.co_code, code.co_consts, code.co_names) == (want.co_code, want.co_consts, want.co_names)
            and isinstance(getattr(module, "weight", None), nn.Parameter) and module.weight.dim() == 1
            and type(getattr(module, "variance_epsilon", None)) is float
            and not (module._forward_hooks or module._forward_pre_hooks))


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm function, y = weight * round(x * rstd), rstd = 1 / sqrt(mean(x^2)
    + variance_epsilon), with the same Parameter `weight` (its state_dict is the original's). At up
    to DECODE_ROWS rows of a float32 host tensor with a float32 weight, no autograd and no tracing:
    fp8kit's rmsnorm_forward, whose mean of squares and rstd are float64 where transformers' are
    float32 (so the two differ in the last bits of float32). Otherwise LlamaRMSNorm's forward
    itself."""

    def __init__(self, weight, variance_epsilon):
        super().__init__()
        self.weight = weight
        self.variance_epsilon = variance_epsilon
        self._reference = _llama_forward()  # the function it computes, and its fall-back

    def forward(self, x):
        # x [..., c] -> [..., c]
        w = self.weight
        c = w.shape[0]
        rows = x.numel() // c if c else 0
        if (x.dtype is w.dtype and x.dtype in _DTYPES and x.is_cpu and w.is_cpu and x.dim() >= 1 and x.shape[-1] == c
                and 0 < rows <= DECODE_ROWS and w.is_contiguous()
                and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
                and not torch.compiler.is_compiling()):
            x = x.contiguous()
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
            fp8kit._fp8kit.rms_norm(out.data_ptr(), x.data_ptr(), w.data_ptr(), _DTYPES[x.dtype], rows, c,
                                    self.variance_epsilon)
            return out
        return self._reference(self, x)

    def extra_repr(self):
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, fp8kit at <= {DECODE_ROWS} rows"


def fuse_norms(model):
    """Puts an RMSNorm in place of every module below model that computes transformers'
    LlamaRMSNorm function (_runs_llama_forward), keeping its Parameter; returns their names. A
    model without transformers' classes (transformers not imported) is left as it is."""
    check_model_args("fp8kit.torch.fuse_norms", model)
    if "transformers" not in sys.modules:
        return []
    chosen = [(name, m) for name, m in model.named_modules() if name and _runs_llama_forward(m)]
    at = places(model)
    for name, m in chosen:
        norm = RMSNorm(m.weight, m.variance_epsilon)
        for place in at[id(m)]:  # a norm held at two places stays one module there
            model.set_submodule(place, norm)
    return [name for name, _ in chosen]
