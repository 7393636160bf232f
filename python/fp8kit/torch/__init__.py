"""fp8kit.torch: FP8 Linear layers for PyTorch models - inference, training, layerwise casting - on
fp8kit's kernels, with the APIs of torchao and Diffusers.

Inference: torchao's `quantize_(model, Float8DynamicActivationFloat8WeightConfig())` and
optimum-quanto's `qfloat8`, but running FP8 on a CPU: every chosen nn.Linear becomes a
Float8InferenceLinear whose weight is quantized once (e4m3, per recipe) and packed once, and whose
forward casts the activation to FP8 inside fp8kit's GEMM (dynamic scaling, never written out) and
sums in float32. Layers that the model calls in a row on one input (q, k, v; gate, up) then run in
one call at decode's few rows, each from its own packed weight.

    import fp8kit.torch
    fp8kit.torch.quantize_(model)                  # rowwise e4m3, every nn.Linear
    fp8kit.torch.quantize_(model, "tensorwise", filter_fn=lambda m, fqn: "lm_head" not in fqn)
    fp8kit.torch.quantize_(model, "weight_only")   # torchao's Float8WeightOnlyConfig: x not quantized
    fp8kit.torch.quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))  # torchao's
    y = model(x)                                   # float32 / bfloat16 / float16 x, same dtype out

Training: convert_to_float8_training(model, module_filter_fn=None, config="tensorwise") with
torchao's signature and recipe names (tensorwise, rowwise, rowwise_with_gw_hp, plus block, mxfp8,
delayed) makes nn.Linear layers Float8Linear - the training layer, as fp8kit::nn::Float8Linear in
C++ and torchao's Float8Linear: the same Parameters, with the three GEMMs of forward and backward
(y, dX, dW) in FP8 through fp8kit under autograd (and DDP, FSDP2, torch.compile with fullgraph).
With enable_fsdp_float8_all_gather=True (or torchao's Float8LinearConfig field) FSDP2 all-gathers
the weights in FP8, cast by each rank from its shard bit for bit as the whole weight casts
(tensorwise, rowwise, block, mxfp8; compiled or not); precompute_float8_dynamic_scale_for_fsdp(model)
after the optimizer step finds every layer's tensorwise amax in one all-reduce, as torchao's.
module_filter_fn=auto_filter() leaves the layers too small for FP8 to pay in high precision and
says why (torchao's _auto_filter_for_recipe, on fp8kit's measurements).

Layerwise casting: enable_layerwise_casting(model, storage_dtype, compute_dtype, ...) with Diffusers'
signature and default skip patterns stores weights in FP8; Linear layers then compute on the FP8
weight directly (no upcast copy), a GELU (tanh form) that only reads a Linear's output in that
Linear's GEMM, and embeddings decode only the rows they read; convolutions are upcast per forward
as Diffusers does.

Decoding: fuse_norms(model) runs transformers' float32 RMSNorm layers (LlamaRMSNorm's function) at a
decode step's few rows in one call of fp8kit's kernel; register_attention() gives transformers the
"fp8kit" attention, a decode step's attention over the KV cache on fp8kit's kernel (from_pretrained's
default).

advise(model, example_inputs, path): per Linear, FP8 or not and which recipe, from paired timings
on this machine and SQNR; writes the policy file the C++ side reads.

The inference forward is a registered torch custom op, torch.ops.fp8kit.linear, with a fake (meta)
implementation, so torch.compile and torch.export trace through it; the training layer's casts
and GEMMs are torch.ops.fp8kit.recipe_quantize and torch.ops.fp8kit.gemm. state_dict holds the FP8
weight (torch.float8_e4m3fn) and its scale_inv; loading one repacks on the next call. On the host
an inference layer holds its weight once: the packed copy its GEMM reads, from which state_dict
(and every other walk over the buffers) reads the codes back.

The modules, one feature each (the names above are the API; the modules' other names are not):
    ops.py                the custom ops (torch.library) and the one forward route they share
    siblings.py           Linear layers called in a row on one input, run in one call
    inference.py          quantize_, Float8InferenceLinear, torchao's inference configs
    training.py           convert_to_float8_training, Float8Linear and its autograd Function
    layerwise_casting.py  enable_layerwise_casting, Float8Embedding
    gelu_fusion.py        a GELU after an FP8 Linear in its GEMM (Float8GELUProjection)
    advice.py             advise
    checkpoint.py         from_pretrained, load_fp8_checkpoint: FP8 checkpoints run as stored
    attention.py          register_attention: transformers' "fp8kit" attention (decode over the KV cache)
    layernorm.py          fuse_norms, RMSNorm: transformers' RMSNorm at decode's rows on fp8kit's kernel
    fsdp.py               FSDP2's FP8 all-gather of the training layers' weights, precompute_float8_...
Checked by tests/python/test_torch.py, test_training.py, test_fsdp.py, test_layerwise.py,
test_advise.py, test_fp8_checkpoints.py, test_attention.py, test_layernorm.py and, on a GPU, test_cuda.py.
"""
import warnings

from .advice import advise
from .attention import register_attention
from .checkpoint import Float8Experts, Float8StaticInputLinear, from_pretrained, load_fp8_checkpoint
from .fsdp import precompute_float8_dynamic_scale_for_fsdp
from .inference import RECIPES, Float8InferenceLinear, quantize_
from .gelu_fusion import Float8GELUProjection
from .layernorm import RMSNorm, fuse_norms
from .layerwise_casting import (CASTABLE_LAYERS, DEFAULT_SKIP_MODULES_PATTERN, Float8Embedding,
                                LayerwiseCastingReport, enable_layerwise_casting)
from .ops import linear
from .training import TRAINING_RECIPES, Float8Linear, auto_filter, convert_to_float8_training

__all__ = ["CASTABLE_LAYERS", "DEFAULT_SKIP_MODULES_PATTERN", "RECIPES", "TRAINING_RECIPES", "Float8Embedding",
           "Float8Experts", "Float8GELUProjection", "Float8InferenceLinear", "Float8Linear", "Float8StaticInputLinear", "LayerwiseCastingReport",
           "RMSNorm", "advise", "auto_filter", "convert_to_float8_training", "enable_layerwise_casting", "from_pretrained", "fuse_norms", "linear",
           "load_fp8_checkpoint", "precompute_float8_dynamic_scale_for_fsdp", "quantize_", "register_attention"]


def __getattr__(name):
    # The training layer's former name, a deprecated alias for one release (PEP 562: called only
    # for a name the module does not have).
    if name == "Float8TrainingLinear":
        warnings.warn("fp8kit.torch.Float8TrainingLinear is deprecated: it is fp8kit.torch.Float8Linear (the "
                      "training layer, as in C++ and torchao); the inference layer is Float8InferenceLinear",
                      DeprecationWarning, stacklevel=2)
        return Float8Linear
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
