"""fp8kit.torch.checkpoint (fp8kit.torch.from_pretrained, load_fp8_checkpoint): run the FP8 checkpoints
users download - llm-compressor / compressed-tensors float-quantized and MXFP8, transformers'
fine-grained FP8 (DeepSeek-V3 `weight_scale_inv`), FBGEMM FP8, fp8kit's own, diffusion models' plain
and ComfyUI scaled fp8 single files - from PyTorch, on fp8kit's FP8 GEMM,
with the stored FP8 codes and scales as the layers' weights: never dequantized, never re-quantized.

    import fp8kit.torch
    model = fp8kit.torch.from_pretrained("path/to/fp8-checkpoint")   # a transformers model
    out = model.generate(ids, max_new_tokens=32)
    fp8kit.torch.load_fp8_checkpoint(my_module, "path/to/dir")     # any nn.Module whose names match

What it does:
- Which tensors are FP8 weights, and with which scale layout, is what fp8kit's commands read:
  the library's own rules (fp8kit::stored_weight through the extension's checkpoint_weights, the
  rules of docs/CHECKPOINTS.md), not a copy of them: a scale no layout explains, or one that
  contradicts the config's strategy or block size, is an fp8kit.Error naming the file and tensor.
- from_pretrained builds the model as transformers does (AutoConfig; the class AutoModelForCausalLM
  picks for the config, or model_class=) with its parameters on the meta device (accelerate's
  init_empty_weights: no high-precision weight is ever made), then loads the checkpoint.
- Every tensor is read through safetensors' safe_open, which maps the file: an FP8 weight's codes
  are the file's bytes (the layer's `weight` buffer views them); the scale is the stored one, as
  float32 (bf16 / f16 scales convert exactly), in the layer's [rows, groups] shape. Other tensors
  keep the checkpoint's dtype (or torch_dtype=).
- An nn.Linear stored in FP8 becomes fp8kit.torch's inference layer; its activation is cast to FP8
  inside the GEMM as the checkpoint's config says: dynamic per token (compressed-tensors `token`,
  FBGEMM), per tensor, per 1 x group (compressed-tensors `group`, fine-grained FP8's 1 x 128), or
  with the stored static `input_scale` (Float8StaticInputLinear), in MX groups of 32 (MXFP8);
  weight-only when the config quantizes no activation, and for a file without a config whose
  weights are plain FP8 (no scale: the codes are the values) or ComfyUI's scaled fp8
  (`scale_weight`), as Diffusers and ComfyUI compute those. A Diffusers model's single file under
  the original names is converted by Diffusers' own from_single_file conversion, on the codes, the
  scales carried along (_Converted).
- MoE experts: per-expert nn.Linear modules load as above; a model whose experts are one module of
  3-D parameters [experts, out, in] (transformers 5's fused experts) gets a Float8Experts module,
  from per-expert FP8 tensors (the names transformers' own conversion mapping gives for the model
  type) or from 3-D FP8 tensors with per-expert scales; each expert computes in FP8.
- Modules the config keeps in high precision (compressed-tensors `ignore`, `modules_to_not_convert`)
  stay as they are stored; one stored in FP8 nonetheless is an error naming file and tensor.
- On a transformers model the loaded FP8 layers are recorded in model.config
  (inference._record_in_config: compressed-tensors' layout where it can say them, which
  transformers reads too, else fp8kit's own), so save_pretrained writes what
  from_pretrained runs as the model ran.

Checked by tests/python/test_fp8_checkpoints.py (llm-compressor's FP8_DYNAMIC, FP8_BLOCK, static FP8
and MXFP8 on a Llama and a Qwen2-MoE; files `fp8kit quantize` writes; Flux and SD3 single files,
plain and ComfyUI scaled, in Diffusers' and Stability's names; weights bit for bit against the
files, outputs against a float64 emulation of the same scheme, planted wrong answers).
"""
import json
import math
import os
import re
import stat
import warnings

try:
    from re import _parser as _re_parser  # the parser re itself uses (Python 3.11 on)
except ImportError:  # before Python 3.11
    import sre_parse as _re_parser

import torch
from torch import nn

import fp8kit
from fp8kit import _quoted

from . import attention
from .gelu_fusion import fuse_gelu as _fuse_gelu
from .inference import (Float8InferenceLinear as _InferenceLinear, _at, _block_of, _first_nonfinite, _group_siblings,
                        _record_in_config)
from .memory import release_pages

_E8M0 = getattr(torch, "float8_e8m0fnu", None)


def _json(read, where):
    """read() (a json.load / json.loads of a file's text), its failures an fp8kit.Error naming
    where: malformed, or nested deeper than Python's parser goes (RecursionError)."""
    try:
        return read()
    except RecursionError:
        raise fp8kit.Error(f"{where}: nested too deep to read") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError: positions, not the file's text
        raise fp8kit.Error(f"{where}: not valid JSON ({e})") from None


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _dtype(value, where):
    """A torch_dtype as both loaders take it: float32, bfloat16 or float16, a torch.dtype or its
    name (transformers' config.json spelling); else an fp8kit.Error naming where."""
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if not any(dtype is d for d in _DTYPES):
        raise fp8kit.Error(f"{where} {_quoted(str(value).removeprefix('torch.'))}, expected float32, bfloat16 or "
                           "float16 (the dtype of the tensors the checkpoint keeps in high precision)")
    return dtype


class _Checkpoint:
    """A checkpoint (a .safetensors file or a directory of shards) as tensors by name: every tensor
    read with safetensors' safe_open (memory-mapped), plus the FP8 weights the library recognises
    (fp8kit._fp8kit.checkpoint_weights) and the quantization_config."""

    def __init__(self, path):
        from safetensors import safe_open
        self.path = os.fspath(path)
        qc, entries, layout = fp8kit._fp8kit.checkpoint_weights(self.path)
        # The library checks the config's form where the files store FP8 weights; without one it
        # hands the text on as it is.
        self.qconfig = _json(lambda: json.loads(qc), f"{self.path}: quantization_config") if qc else None
        if self.qconfig is not None and not isinstance(self.qconfig, dict):
            raise fp8kit.Error(f"{self.path}: quantization_config is not a JSON object")
        self.layout = set(layout)  # scales, ComfyUI's scale_input and scaled_fp8 marker: no model tensor
        self.directory = os.path.isdir(self.path)
        self.fp8 = {}  # weight name -> (shape, scheme, scale name, scaling, input_scale name or None, file)
        for name, shape, scheme, scale, scaling, input_scale, file in entries:
            file = os.path.join(self.path, file) if self.directory else self.path
            self.fp8[name] = (tuple(shape), scheme, scale, scaling, input_scale or None, file)
        if self.directory:
            index = os.path.join(self.path, "model.safetensors.index.json")
            if os.path.exists(index):
                with open(index) as f:  # its form checked by the library (checkpoint_weights)
                    files = sorted(set(_json(lambda: json.load(f), index)["weight_map"].values()))
            else:
                # The library's list (its shards, checked as regular files): names with the extension,
                # so not a dotfile named ".safetensors" (which, a FIFO, would block the open forever).
                files = sorted(f for f in os.listdir(self.path) if os.path.splitext(f)[1] == ".safetensors")
            files = [os.path.join(self.path, f) for f in files]
        else:
            files = [self.path]
        self._open = {f: safe_open(f, framework="pt") for f in files}
        self.file_of = {}
        for f, handle in self._open.items():
            for k in handle.keys():
                self.file_of[k] = f
        self.model_names = {k: k for k in self.file_of}  # the model's name -> the stored one (_load renames)

    def tensor(self, name):
        return self._open[self.file_of[name]].get_tensor(name)

    def dtype(self, name):
        """The stored dtype of a tensor, as safetensors names it (e.g. BF16), without reading it."""
        return self._open[self.file_of[name]].get_slice(name).get_dtype()

    def shape(self, name):
        return tuple(self._open[self.file_of[name]].get_slice(name).get_shape())

    def weight_only(self, name):
        """Whether the FP8 weight runs weight-only as its file's producer computes it: ComfyUI's
        scaled fp8 (scale_weight; Diffusers and ComfyUI upcast the weight)."""
        return self.qconfig is None and self.fp8[name][2].endswith(".scale_weight")

    def unscaled_fp8(self, name):
        """Whether a tensor is FP8 codes that no scale goes with (not a weight the library reads with
        its scale, nor part of one's layout): their values are the weights', as Diffusers and
        ComfyUI read a plain float8_e4m3fn file."""
        return self.dtype(name) in ("F8_E4M3", "F8_E5M2") and name not in self.fp8 and name not in self.layout

    def check_no_scale_beside(self, name):
        """An unscaled FP8 tensor whose module stores a tensor named like a scale that fp8kit does
        not read: refused, for the codes would run as values where that scale says they are not."""
        module, _, leaf = name.rpartition(".")
        if not hasattr(self, "_leaves"):  # module -> its tensors' leaf names, once a checkpoint
            self._leaves = {}
            for n in self.file_of:
                m, _, lf = n.rpartition(".")
                self._leaves.setdefault(m, []).append(lf)
        for o_leaf in self._leaves.get(module, ()):
            other = f"{module}.{o_leaf}" if module else o_leaf
            if o_leaf != leaf and "scale" in o_leaf and other not in self.layout:
                raise fp8kit.Error(f"{self.where(name)} is FP8 without a scale fp8kit reads, and its module stores "
                                   f"{_quoted(other)}, a scale in no layout fp8kit knows (docs/CHECKPOINTS.md): the codes "
                                   "would run as values")

    def where(self, name):
        return f"{self.file_of.get(name, self.path)}: tensor {_quoted(name)}"

    def scale_names(self):
        """The scales and static input scales that belong to FP8 weights."""
        out = set()
        for _, _, scale, _, input_scale, _ in self.fp8.values():
            out.add(scale)
            if input_scale:
                out.add(input_scale)
        return out


# ---- what the config says about activations and kept modules ----

def _activation_of_args(args, weight_scaling, where):
    """compressed-tensors' input_activations (a dict, or None: weight-only) as fp8kit's input scaling
    - "row" (strategy token), "tensor", "block(1xG)" (group) - and whether it is static."""
    if not args:
        return "none", False
    if args.get("type", "float") != "float" or args.get("num_bits", 8) != 8:
        raise fp8kit.Error(f"{where}: input_activations {_quoted(args)} are not FP8; fp8kit runs FP8 activations or none")
    strategy = args.get("strategy", "tensor")
    dynamic = args.get("dynamic", True)
    if not isinstance(dynamic, bool):  # a string "false" is truthy: it would read as dynamic
        raise fp8kit.Error(f"{where}: input_activations dynamic {_quoted(dynamic)} ({_quoted(args)}): expected true or "
                           "false")
    static = not dynamic
    if strategy == "token":
        scaling = "row"
    elif strategy == "tensor":
        scaling = "tensor"
    elif strategy == "group" and args.get("group_size") == 32 and args.get("scale_dtype") == "torch.uint8":
        scaling = "mx32"  # MXFP8 (compressed-tensors' should_generate_mx_scales): e8m0 scales per 32
    elif strategy == "group" and type(args.get("group_size")) is int and args["group_size"] > 0:
        scaling = f"block(1x{args['group_size']})"
    else:
        raise fp8kit.Error(f"{where}: input_activations strategy {_quoted(strategy)} ({_quoted(args)}): fp8kit casts activations "
                           "per token, per tensor or per 1 x group (a positive integer group_size)")
    if static and scaling != "tensor":
        raise fp8kit.Error(f"{where}: static input_activations with strategy {_quoted(strategy)}: fp8kit takes a static "
                           "activation scale per tensor only")
    return scaling, static


def _check_pattern(pattern, where):
    """A regular expression of a config (module names to keep, compressed-tensors' targets), checked
    before any name is matched: one that compiles, and that repeats no part which can itself match
    in more than one way - a repeat or an alternation inside a repeat, as in (a+)+, (.*)*x or
    (a|ab)* - on which Python's backtracking matcher takes time exponential in the name's length (a
    40-character name ran past a minute). No real config needs one: its patterns name modules,
    like re:.*mlp.gate$ or model.layers.0.mlp."""
    try:
        parsed = re.compile(pattern) and _re_parser.parse(pattern)
    except re.error as e:
        raise fp8kit.Error(f"{where} is not a regular expression ({e})") from None

    def ambiguous(items, repeated):
        for op, av in items:
            name = str(op)
            if name.endswith("REPEAT"):  # MAX_, MIN_, POSSESSIVE_REPEAT: (min, max, body)
                if av[1] > 1 and (repeated or ambiguous(av[2], True)):
                    return True
                if av[1] <= 1 and ambiguous(av[2], repeated):
                    return True
            elif name == "BRANCH":
                if repeated or any(ambiguous(alt, repeated) for alt in av[1]):
                    return True
            elif name in ("SUBPATTERN", "ATOMIC_GROUP", "ASSERT", "ASSERT_NOT"):
                if ambiguous(av[-1], repeated):
                    return True
            elif name == "GROUPREF_EXISTS" and any(ambiguous(b, repeated) for b in av[1:] if b is not None):
                return True
        return False
    if ambiguous(parsed, False):
        raise fp8kit.Error(f"{where} repeats a part that can match in more than one way (a repeat or alternation "
                           "inside a repeat), which Python's regular expressions match in time exponential in the "
                           "name's length: write it without the nested repeat")


class _Config:
    """The parts of a checkpoint's quantization_config the loader needs: each FP8 module's
    activation scaling (and whether static), and the modules kept in high precision."""

    def __init__(self, qc, ckpt):
        self.qc = qc or {}
        self.ckpt = ckpt

        def check(ok, field, what):
            """The library checks the config's form only where the files store FP8 weights; what
            this class reads is checked here, for every file."""
            if not ok:
                raise fp8kit.Error(f"{ckpt.path}: quantization_config {field} is not {what}")

        def names(value):
            return isinstance(value, list) and all(isinstance(n, str) for n in value)

        self.method = self.qc.get("quant_method")
        if self.method not in (None, "compressed-tensors", "fp8", "fbgemm_fp8", "fp8kit"):
            raise fp8kit.Error(f"{ckpt.path}: quantization_config quant_method {_quoted(self.method)} is not an FP8 "
                               "layout fp8kit reads (compressed-tensors, fp8, fbgemm_fp8, fp8kit)")
        self.groups = []
        if self.method == "compressed-tensors":
            # Its targets and ignore list match modules as compressed-tensors matches them (names,
            # regexes, classes): its own matcher, asked for before any weight is read.
            try:
                from compressed_tensors.utils.match import is_match
            except ImportError as e:
                raise fp8kit.Error(f"{ckpt.path}: a compressed-tensors checkpoint: its config's targets and ignore list "
                                   "are matched by compressed-tensors' own rules, and compressed-tensors does not "
                                   f"import ({e}): pip install compressed-tensors") from None
            self.is_match = is_match
            groups = self.qc.get("config_groups") or {}
            check(isinstance(groups, dict), "config_groups", "an object of groups")
            for gname, g in groups.items():
                field = f"config_groups[{_quoted(gname)}]"
                check(isinstance(g, dict), field, "an object")
                targets, acts = g.get("targets", []), g.get("input_activations")
                check(names(targets), field + ".targets", "a list of module names")
                check(acts is None or isinstance(acts, dict), field + ".input_activations", "an object")
                self.groups.append((targets, acts))
        field = "ignore" if self.method == "compressed-tensors" else "modules_to_not_convert"
        self.ignore = self.qc.get(field) or []
        check(names(self.ignore), field, "a list of module names")
        # What kept() and compressed-tensors' targets match as regular expressions ("re:..." there).
        patterns = [(field, n) for n in self.ignore] + [("config_groups targets", t)
                                                        for targets, _ in self.groups for t in targets]
        for where, name in patterns:
            if self.method != "compressed-tensors" or name.startswith("re:"):
                _check_pattern(name[3:] if self.method == "compressed-tensors" else name,
                               f"{ckpt.path}: quantization_config {where} entry {_quoted(name)}")
        self.activations = {}  # fp8kit's layout: module -> the scaling its activation is cast with
        if self.method == "fp8kit":
            acts = self.qc.get("activations", {})
            check(isinstance(acts, dict), "activations", "an object of module: scaling")
            check(isinstance(self.qc.get("schemes") or {}, dict), "schemes", "an object of module: scheme")
            for name, scaling in acts.items():
                if not isinstance(scaling, str) or not re.fullmatch(r"row|tensor|mx32|none|block\(1x[1-9]\d*\)", scaling):
                    raise fp8kit.Error(f"{ckpt.path}: quantization_config activations[{_quoted(name)}] is "
                                       f"{_quoted(scaling)}, expected row, tensor, block(1xG), mx32 or none")
            self.activations = acts
            # What the layout says of modules holds for the FP8 weights the files store: a module
            # it names that stores none (missing, or kept in high precision) is a contradiction,
            # and so is a format the codes are not in.
            stored = {n.removesuffix(".weight") for n in ckpt.fp8}
            for field in ("schemes", "activations"):
                unknown = sorted(set(self.qc.get(field) or {}) - stored)
                if unknown:
                    raise fp8kit.Error(f"{ckpt.path}: quantization_config {field} names {_quoted(unknown[0])}"
                                       + (f" and {len(unknown) - 1} more" if len(unknown) > 1 else "")
                                       + ", for which the checkpoint stores no FP8 weight")
        if self.method in ("fp8kit", "fp8"):  # fmt: fp8kit's layout and transformers' FineGrainedFP8Config
            fmt = self.qc.get("fmt")
            want = {"e4m3": "F8_E4M3", "e4m3fn": "F8_E4M3", "e5m2": "F8_E5M2"}.get(fmt) if isinstance(fmt, str) else None
            if fmt is not None and want is None:
                raise fp8kit.Error(f"{ckpt.path}: quantization_config fmt {_quoted(fmt)}, expected e4m3 or e5m2")
            for name in ckpt.fp8 if fmt is not None else ():
                if ckpt.dtype(name) != want:
                    raise fp8kit.Error(f"{ckpt.where(name)} is {ckpt.dtype(name)}, but quantization_config fmt says "
                                       f"{_quoted(fmt)}")

    def kept(self, module_name, module):
        """Whether the config keeps module in high precision."""
        if not self.ignore:
            return False
        if self.method == "fp8kit":  # the layout's own list: module names as they are
            return module_name in self.ignore
        if self.method == "compressed-tensors":
            return self.is_match(module_name, module, self.ignore) if module is not None else any(
                t == module_name or (t.startswith("re:") and re.match(t[3:], module_name)) for t in self.ignore)
        from transformers.quantizers.quantizers_utils import should_convert_module
        return not should_convert_module(module_name, self.ignore)

    def activation(self, module_name, module, scheme, weight_scaling, where):
        """(input scaling, static) for the FP8 weight of module_name; static None: as the file says
        (a stored input_scale beside the weight makes it static)."""
        if self.method == "compressed-tensors":
            # An nn.Linear's group is the one whose targets match it (compressed-tensors' own
            # matcher, by name or class): one that none targets would not be quantized by
            # compressed-tensors, so its FP8 weight contradicts the config. A fused experts
            # module's projections (no nn.Linear of their own) by name, or the groups' one
            # activation scheme.
            linear = isinstance(module, nn.Linear)
            hits = [a for targets, a in self.groups if self.is_match(module_name, module if linear else None, targets)]
            if not hits and not linear and len({json.dumps(a, sort_keys=True) for _, a in self.groups}) == 1:
                hits = [self.groups[0][1]]
            if not hits:
                raise fp8kit.Error(f"{where}: stored in FP8, but no config group of quantization_config targets "
                                   f"module {_quoted(module_name)}")
            return _activation_of_args(hits[0], weight_scaling, where)
        if self.method == "fp8":  # transformers FineGrainedFP8 / DeepSeek-V3
            if self.qc.get("activation_scheme", "dynamic") != "dynamic":
                raise fp8kit.Error(f"{where}: activation_scheme {_quoted(self.qc.get('activation_scheme'))}; fp8kit runs "
                                   "the fine-grained FP8 layout with dynamic activations")
            block = _block_of(weight_scaling)
            return (f"block(1x{block[1]})" if block else "row"), False
        if self.method == "fbgemm_fp8":  # per-token dynamic activations (fbgemm's quantize_fp8_per_row)
            return "row", False
        # fp8kit's own layout: the module's recorded activation scaling (static when per tensor and
        # an input_scale is stored); where it records none, or without a config, the activation of
        # the weight scheme's recipe (tensor: tensorwise, channel / group: rowwise, block:
        # DeepSeek-V3's 1 x block cols, mx32).
        recorded = self.activations.get(module_name)
        if recorded is not None:
            return recorded, (None if recorded == "tensor" else False)
        if scheme in ("tensor", "mx32"):
            return scheme, None
        block = _block_of(weight_scaling)
        return (f"block(1x{block[1]})" if scheme == "block128" else "row"), None


# ---- the layers ----

def _fp8_scale(scale, scheme, rows, cols, scaling):
    """The stored scale as the inference layer holds it: float32 [scale rows, scale cols] (exact:
    bf16 / f16 widen), or the e8m0 codes for mx32."""
    shape = fp8kit._fp8kit.scale_shape(scaling, rows, cols)
    if scheme == "mx32":
        s = scale if scale.dtype == _E8M0 else scale.view(torch.uint8).view(_E8M0)
        return s.reshape(shape)
    return scale.to(torch.float32).reshape(shape)


def _recipe_name(input_scaling):
    """The inference layer's recipe label for an input scaling (what its siblings group by)."""
    return {"row": "rowwise", "tensor": "tensorwise", "mx32": "mxfp8", "none": "weight_only"}.get(
        input_scaling, "block")


def _inference_linear(codes, scale_inv, weight_scaling, input_scaling, bias):
    """fp8kit.torch's inference layer over the stored codes and scale: made on the meta device (no
    buffer allocated), then given the checkpoint's tensors."""
    out_features, in_features = codes.shape
    with torch.device("meta"):
        m = _InferenceLinear(in_features, out_features, bias is not None, _recipe_name(input_scaling),
                             str(codes.dtype).removeprefix("torch.float8_"))
    m.input_scaling, m.weight_scaling = input_scaling, weight_scaling
    m.weight, m.weight_scale_inv = codes, scale_inv
    if bias is not None:
        m.bias = nn.Parameter(bias, requires_grad=False)
    return m


class Float8StaticInputLinear(_InferenceLinear):
    """The inference layer with a static activation scale, as compressed-tensors' static FP8 schemes
    store it (`input_scale`, the dequantization multiplier of the activation): x is cast to FP8 as
    encode(float32(x * (1 / input_scale))), saturating, inside the GEMM; the scale is the stored one
    (buffer `input_scale`, in its stored dtype), which the layer's one route (ops._linear) reads."""

    @classmethod
    def from_stored(cls, codes, scale_inv, weight_scaling, input_scale, bias):
        out_features, in_features = codes.shape
        with torch.device("meta"):
            m = cls(in_features, out_features, bias is not None, "tensorwise",
                    str(codes.dtype).removeprefix("torch.float8_"))
        m.input_scaling, m.weight_scaling = "tensor", weight_scaling
        m.weight, m.weight_scale_inv = codes, scale_inv
        m.register_buffer("input_scale", input_scale)
        if bias is not None:
            m.bias = nn.Parameter(bias, requires_grad=False)
        return m

    def extra_repr(self):
        return super().extra_repr() + ", static input_scale"


class Float8Experts(nn.Module):
    """A mixture of experts whose projections are FP8 (fp8kit.torch's inference layer per expert
    and projection), in place of a transformers experts module of 3-D parameters (gate_up_proj
    [experts, 2 * inter, hidden] and down_proj [experts, hidden, inter]: transformers 5's fused
    experts), with that module's forward signature: (hidden_states [tokens, hidden], top_k_index
    and top_k_weights [tokens, k]) -> [tokens, hidden], each token the sum over its k experts of
    weight * down(gate(gate_up(x))), summed in float32. The gating is the replaced module's own
    (_apply_gate / act_fn).

    Two storage forms, each as the checkpoint names it (state_dict gives the stored tensors):
    - per expert ("per_expert"): children "0", "1", ... each with its projections (gate_proj,
      up_proj, down_proj, or the names of the checkpoint) as inference layers;
    - 3-D ("fused"): buffers gate_up_proj / down_proj (codes [experts, out, in]) and their scales,
      each expert's layer a view of its slice."""

    def __init__(self, original, num_experts, has_gate):
        super().__init__()
        self.num_experts, self.has_gate = num_experts, has_gate
        self._original = [original]  # its gating (bound methods, act_fn); a list: not a child module
        self.gate_up = [None] * num_experts  # per expert: the layers whose outputs, concatenated, are gate_up
        self.down = [None] * num_experts

    def _gate(self, gate_up):
        original = self._original[0]
        if self.has_gate:
            return original._apply_gate(gate_up)
        return original.act_fn(gate_up)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
        for e in torch.unique(top_k_index).tolist():
            if not 0 <= e < self.num_experts:
                continue
            token, pos = torch.where(top_k_index == e)
            x = hidden_states[token]
            parts = [layer(x) for layer in self.gate_up[e]]
            h = self._gate(parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1))
            y = self.down[e](h)
            out.index_add_(0, token, y.float() * top_k_weights[token, pos, None].float())
        return out.to(hidden_states.dtype)

    def extra_repr(self):
        return f"num_experts={self.num_experts}, has_gate={self.has_gate}"


# ---- memory: the packed weight as the one resident copy ----

def _pack(layers):
    """Packs each FP8 layer's weight for the GEMM now (what its first call would do) as the codes'
    only copy (release_codes: state_dict reads them back from it), and lets the pages the packing
    read go back to the file, which other tensors of it keep mapped: one byte a weight plus its
    scales stays in memory."""
    for m in layers:
        codes = m.weight
        m.release_codes()
        release_pages(codes)


def _fused_expert_layers(model):
    """(name, layer) for the FP8 layers of model's Float8Experts that hold 3-D tensors (not
    modules), named as save_pretrained writes them: per expert and projection where transformers'
    conversion mapping for the model type splits them so ("experts.3.gate_proj"), else by the 3-D
    parameter ("experts.down_proj", its experts alike)."""
    out = []
    for name, m in model.named_modules():
        if not (isinstance(m, Float8Experts) and "down_proj" in m._buffers):
            continue
        first = "gate_up_proj" if m.has_gate else "up_proj"
        sources = _expert_sources(model, name) or {}
        for proj, layers in ((first, [g[0] for g in m.gate_up]), ("down_proj", m.down)):
            if proj in sources:
                out += [(f"{name}.{e}.{p}", layer) for e, layer in enumerate(layers) for p in sources[proj]]
            else:
                out.append((f"{name}.{proj}", layers[0]))
    return out


def _fp8_layers(model):
    out = [m for m in model.modules() if isinstance(m, _InferenceLinear)]
    for m in model.modules():
        if isinstance(m, Float8Experts):
            for layers in m.gate_up:
                out += [x for x in layers if x not in out]
            out += [x for x in m.down if x not in out]
    return out


# ---- loading ----

def _expert_sources(model, experts_name):
    """For a fused experts module (3-D gate_up_proj / up_proj and down_proj parameters): the
    per-expert checkpoint names its parameters come from, by transformers' own conversion mapping
    for the model type - {"gate_up_proj": ["gate_proj", "up_proj"], "down_proj": ["down_proj"]}
    for Qwen2-MoE - or None when the mapping names none."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        return None
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        mapping = get_checkpoint_conversion_mapping(model_type) or []
    except Exception:  # noqa: BLE001 - an older transformers: no mapping
        return None
    out = {}
    for conv in mapping:
        targets = getattr(conv, "target_patterns", None)
        sources = getattr(conv, "source_patterns", None)
        if not targets or not sources:
            continue
        targets = [targets] if isinstance(targets, str) else list(targets)
        sources = [sources] if isinstance(sources, str) else list(sources)
        for t in targets:
            m = re.search(r"experts\.(\w+)$", t)
            if not m:
                continue
            names = []
            for s in sources:
                sm = re.search(r"experts\.\*\.(\w+)\.weight$", s)
                if sm:
                    names.append(sm[1])
            if names and len(names) == len(sources):
                out[m[1]] = names
    return out or None


def _renamer(model):
    """Checkpoint name -> the model's, by transformers' own rules for loading the model: the
    renamings of its conversion mapping (get_model_conversion_mapping: Mixtral's
    '.block_sparse_moe.' -> '.mlp.', the legacy LayerNorm gamma / beta) and the base model's prefix
    added or dropped (rename_source_key); per-expert tensors keep their expert and projection (the
    experts' converters are Float8Experts', _expert_sources). The identity for a model that is not
    a transformers model."""
    from transformers import PreTrainedModel
    if not isinstance(model, PreTrainedModel):
        return lambda name: name
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key
    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    # The model's names, as rename_source_key asks them (.get(name) is not None).
    names = {n: True for n, _ in list(model.named_parameters(remove_duplicate=False))
             + list(model.named_buffers(remove_duplicate=False))}
    prefix = getattr(model, "base_model_prefix", None) or None
    return lambda name: rename_source_key(name, renamings, [], prefix, names)[0]


def _parent(model, name):
    parent_name, _, child = name.rpartition(".")
    try:
        return (model.get_submodule(parent_name) if parent_name else model), child
    except AttributeError:
        return None, child


def _module(model, name):
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _is_fused_experts(m):
    return (m is not None and not isinstance(m, nn.ModuleList)
            and isinstance(getattr(m, "down_proj", None), torch.Tensor)
            and getattr(m, "down_proj").dim() == 3)


def _static(static, input_scale, input_scaling, ckpt, wname):
    """Whether the FP8 weight wname runs with a static activation scale: what the config says
    (static: True / False; None: as the file says) checked against the input_scale stored for it
    (its name, or None)."""
    if static is None:
        static = input_scale is not None
    if static and input_scale is None:
        raise fp8kit.Error(f"{ckpt.where(wname)}: the config says static activations, the checkpoint has no "
                           "input_scale for it")
    if input_scale is not None and not (static and input_scaling == "tensor"):
        raise fp8kit.Error(f"{ckpt.where(input_scale)}: a static input scale beside a weight whose config says "
                           f"dynamic activations ({input_scaling})")
    return static


def _check_k_groups(input_scaling, weight_scaling, cols, where):
    """The activation's scale groups along K nest with the weight's (the GEMM's rule,
    fp8kit::gemm_k_group), checked at load: else an fp8kit.Error naming the file and tensor, not
    the GEMM's at the first call."""
    if input_scaling != "none":
        try:
            fp8kit._fp8kit.gemm_k_group(input_scaling, weight_scaling, cols)
        except fp8kit.Error as e:
            raise fp8kit.Error(f"{where}: the config casts its activation as {input_scaling}, which the weight's "
                               f"scale groups cannot take ({e})") from None


def _check_codes(codes, where):
    """An FP8 weight's codes hold no NaN (nor e5m2's Inf): one would make every output it reaches
    NaN, so a damaged file is an fp8kit.Error naming the tensor and the place, before any work."""
    at = _first_nonfinite(codes)
    if at is not None:
        code = int(codes.reshape(-1)[at].view(torch.uint8))
        raise fp8kit.Error(f"{where} holds the code 0x{code:02x} (not a number) at {_at(at, codes.shape)}: every "
                           "output it reaches would be NaN (a damaged file?)")


def _check_finite(t, where, what, chunk=1 << 20):
    """A stored float tensor holds no NaN or Inf: one makes every output it reaches NaN or Inf (a
    damaged file), and a cast into torch_dtype may overflow to one (float16's largest is 65504). An
    fp8kit.Error naming the tensor and the first place, before the model changes; read in chunks of
    2^20 elements, so that the check holds no second copy of a large tensor (chunks of 2^24 left
    their 16 MiB temporaries in the heap: +40 MB RSS after loading a 380 MB model)."""
    flat = t.reshape(-1)
    for start in range(0, flat.numel(), chunk):
        bad = ~torch.isfinite(flat[start:start + chunk])
        if bad.any():
            at = start + int(bad.nonzero()[0])
            raise fp8kit.Error(f"{where} {what} {float(flat[at])} at {_at(at, t.shape)}: every output it reaches would "
                               "be NaN or Inf")


_WIDE = ("F32", "BF16", "F16")  # the stored dtypes of values the layers compute in, as safetensors names them


def _input_scale(ckpt, name, stored):
    """A static input_scale, checked before it is read: one float element (a per-tensor scale; the
    GEMM takes it as [1])."""
    kind, shape = ckpt.dtype(name), ckpt.shape(name)
    if kind not in _WIDE or math.prod(shape) != 1:
        raise fp8kit.Error(f"{ckpt.where(name)} is {kind} {list(shape)}; a static input scale is one float32, "
                           "bfloat16 or float16 element")
    return stored(name, cast=False)


def _load(model, ckpt, dtype=None, strict=True, ignore=()):
    """Loads the checkpoint (a _Checkpoint) into model (see load_fp8_checkpoint); dtype: checked by
    _dtype; ignore: regular expressions of tensor names a strict load may leave unused
    (transformers' own list for a model class, _keys_to_ignore_on_load_unexpected)."""
    cfg = _Config(ckpt.qconfig, ckpt)
    scale_names = ckpt.scale_names()
    used = set()
    staged = []  # (parent module, name, new module / Parameter / buffer), put in place once all is checked

    def check_fits(name, current, as_named):
        """A stored tensor for the model's parameter or buffer current (as_named), checked before
        it is read: its shape, and for a floating one a dtype its layers compute in - unscaled
        FP8 codes are their values; integers, or other FP8 kinds, would fail only at the forward."""
        kind, shape = ckpt.dtype(name), ckpt.shape(name)
        if current.dtype.is_floating_point and kind not in _WIDE and not ckpt.unscaled_fp8(name):
            raise fp8kit.Error(f"{ckpt.where(name)} is stored as {kind}, but the model's {_quoted(as_named)} is "
                               f"{str(current.dtype).removeprefix('torch.')}: fp8kit loads float32, bfloat16, "
                               "float16 or unscaled float8_e4m3fn / float8_e5m2 values into it")
        if tuple(current.shape) != shape:
            raise fp8kit.Error(f"{ckpt.where(name)} has shape {list(shape)}, but the model's {_quoted(as_named)} is "
                               f"{list(current.shape)}")

    def stored(name, cast=True, wide=torch.float32):
        """A stored tensor, in torch_dtype where cast; FP8 codes checked. Unscaled FP8 (its codes the
        values, ckpt.unscaled_fp8) cast is its values, exactly (every FP8 value is a bf16, f16 and
        f32), in torch_dtype, else `wide`."""
        t = ckpt.tensor(name)
        used.add(name)
        mapped = t.data_ptr() % t.element_size() == 0
        if not mapped:
            # safetensors places a tensor where the one before it ends: after an odd-sized one, a
            # float32's memory map is not 4-byte aligned, which the kernels refuse (after the model
            # would have changed); a copy is.
            t = t.clone()
        unscaled = ckpt.unscaled_fp8(name)
        if name in ckpt.fp8 or unscaled:
            _check_codes(t, ckpt.where(name))
        elif t.dtype in _DTYPES:  # (scales, e8m0 ones included, the library has checked)
            _check_finite(t, ckpt.where(name), "holds")
            if mapped:  # the check read every page of the file's mapping: back to the file (an
                release_pages(t)  # embedding's rows are read as used; resident, +98 MB at 32000 x 1536)
        if cast and unscaled:
            return t.to(dtype or wide)
        if cast and dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
            _check_finite(t, ckpt.where(name), f"in {str(dtype).removeprefix('torch.')} (torch_dtype) overflows to")
        return t

    def scale_of(wname, codes, scheme, scale, scaling):
        if scale is None:  # unscaled: the codes are the values
            return torch.ones(1, 1)
        rows, cols = codes.shape
        return _fp8_scale(stored(scale, cast=False), scheme, rows, cols, scaling)

    # The model's name of each stored tensor (the checkpoint's, where transformers renames none);
    # the config's module names are the checkpoint's.
    rename = _renamer(model)
    ckpt.model_names = {rename(name): name for name in ckpt.file_of}
    # The FP8 weights: those the library reads with their scales, and an nn.Linear's weight stored
    # in FP8 without one (a plain float8_e4m3fn file; the library refuses those under a
    # quantization_config), which runs weight-only from its codes with scale 1.
    weights = dict(ckpt.fp8)
    for name in ckpt.file_of:
        if name.endswith(".weight") and ckpt.unscaled_fp8(name) and len(ckpt.shape(name)) == 2 and \
                isinstance(_module(model, rename(name).removesuffix(".weight")), nn.Linear):
            ckpt.check_no_scale_beside(name)
            weights[name] = (ckpt.shape(name), "tensor", None, "tensor", None, ckpt.file_of[name])
    experts = {}  # fused experts module name -> {proj or (expert, proj): weight name}
    for wname, (shape, scheme, scale, scaling, input_scale, file) in weights.items():
        where = ckpt.where(wname)
        if ckpt.dtype(wname) not in ("F8_E4M3", "F8_E5M2"):  # the library reads the fnuz formats too
            raise fp8kit.Error(f"{where} is {ckpt.dtype(wname)}: fp8kit.torch's layers compute with float8_e4m3fn and "
                               "float8_e5m2 weights (fp8kit dequantize turns other formats back into bf16)")
        stored_mname = wname.removesuffix(".weight")
        as_named = rename(wname)
        mname = as_named.removesuffix(".weight")
        module = _module(model, mname)
        if cfg.kept(stored_mname, module):
            raise fp8kit.Error(f"{where} is stored in FP8, but the checkpoint's quantization_config keeps module "
                               f"{_quoted(stored_mname)} in high precision (ignore / modules_to_not_convert)")
        if len(shape) == 3 or module is None or not isinstance(module, nn.Linear):
            # 3-D experts [E, out, in], or a per-expert Linear of a fused experts module.
            m3 = re.fullmatch(r"(.*\.experts)\.(\w+)", as_named) if len(shape) == 3 else \
                re.fullmatch(r"(.*\.experts)\.(\d+)\.(\w+)\.weight", as_named)
            holder = _module(model, m3[1]) if m3 else None
            if not _is_fused_experts(holder):
                raise fp8kit.Error(f"{where} {list(shape)} is stored in FP8, but the model has no nn.Linear "
                                   f"{_quoted(mname)} (nor a fused experts module holding it) to run it")
            key = m3[2] if len(shape) == 3 else (int(m3[2]), m3[3])
            experts.setdefault(m3[1], {})[key] = wname
            continue
        if tuple(module.weight.shape) != shape:
            raise fp8kit.Error(f"{where} has shape {list(shape)}, but the model's {_quoted(mname + '.weight')} is "
                               f"{list(module.weight.shape)}")
        codes = stored(wname, cast=False)
        scale_inv = scale_of(wname, codes, scheme, scale, scaling)
        if scale is None or ckpt.weight_only(wname):
            # Unscaled, or ComfyUI's scaled fp8: weight-only, as ComfyUI and Diffusers compute these
            # files (the weight upcast; ComfyUI's FP8 matmuls with scale_input are a GPU option).
            input_scaling, static = "none", False
            used.add(stored_mname + ".scale_input")
        else:
            input_scaling, static = cfg.activation(stored_mname, module, scheme, scaling, where)
        _check_k_groups(input_scaling, scaling, shape[1], where)
        bias_name = stored_mname + ".bias"
        if module.bias is not None and bias_name not in ckpt.file_of:
            raise fp8kit.Error(f"{where}: the model's {_quoted(mname)} has a bias, the checkpoint has no "
                               f"{_quoted(bias_name)}")
        if module.bias is not None:
            check_fits(bias_name, module.bias, mname + ".bias")
        bias = stored(bias_name) if module.bias is not None else None
        if _static(static, input_scale, input_scaling, ckpt, wname):
            new = Float8StaticInputLinear.from_stored(codes, scale_inv, scaling, _input_scale(ckpt, input_scale, stored),
                                                      bias)
        else:
            new = _inference_linear(codes, scale_inv, scaling, input_scaling, bias)
        staged.append((*_parent(model, mname), new))

    for ename, parts in experts.items():
        staged.append(_load_experts(model, ename, parts, ckpt, cfg, stored, scale_of))

    # Every other tensor: into the parameter or buffer of its name.
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    for name in ckpt.file_of:
        if name in used or (name in ckpt.layout and name not in scale_names):  # a marker, an unused scale_input
            continue
        if name in scale_names:
            raise fp8kit.Error(f"{ckpt.where(name)}: a scale of an FP8 weight the model does not load")
        scaled = name.removesuffix("_scale_inv") if name.endswith("_scale_inv") else name.removesuffix("_scale")
        if scaled != name and scaled in ckpt.file_of:  # a weight's scale, the weight not FP8: codes as values?
            raise fp8kit.Error(f"{ckpt.where(name)}: a scale beside {_quoted(scaled)}, which is stored as "
                               f"{ckpt.dtype(scaled)}, not FP8 (codes stored in a wider dtype would be taken as "
                               "values)")
        as_named = rename(name)
        target = params.get(as_named)
        is_buffer = target is None and as_named in buffers
        if target is None and not is_buffer:
            if strict and not any(re.search(p, as_named) for p in ignore):
                raise fp8kit.Error(f"{ckpt.where(name)}: the model has no parameter or buffer of this name"
                                   + (f" ({_quoted(as_named)}, as transformers renames it)" if as_named != name else ""))
            continue
        current = target if target is not None else buffers[as_named]
        if ckpt.unscaled_fp8(name):  # FP8 without a scale outside an nn.Linear: its values, in the model's dtype
            ckpt.check_no_scale_beside(name)
        check_fits(name, current, as_named)
        t = stored(name, wide=current.dtype if current.dtype.is_floating_point and current.dtype.itemsize > 1
                   else torch.float32)
        staged.append((*_parent(model, as_named), t if is_buffer else nn.Parameter(t, requires_grad=False)))

    # Applied only now, every tensor checked: a checkpoint refused part way leaves the model as it was.
    for parent, child, value in staged:
        if isinstance(value, nn.Module):
            setattr(parent, child, value)
        elif isinstance(value, nn.Parameter):
            parent._parameters[child] = value
        else:
            parent._buffers[child] = value


def _load_experts(model, ename, parts, ckpt, cfg, stored, scale_of):
    """The Float8Experts over the checkpoint's FP8 experts that replaces the fused experts module
    ename: (its parent, its name, the Float8Experts), for _load to put in place."""
    original = model.get_submodule(ename)
    num = getattr(original, "num_experts", None) or original.down_proj.shape[0]
    has_gate = getattr(original, "has_gate", True)
    if getattr(original, "is_transposed", False) or getattr(original, "has_bias", False) or \
            not getattr(original, "is_concatenated", True):
        raise fp8kit.Error(f"{ckpt.path}: experts module '{ename}' ({type(original).__name__}) stores its experts "
                           "transposed, interleaved or with biases; fp8kit's Float8Experts takes [experts, out, in] "
                           "concatenated gate/up without bias")
    new = Float8Experts(original, num, has_gate)
    fused_names = [k for k in parts if isinstance(k, str)]
    per_expert = [k for k in parts if not isinstance(k, str)]
    if fused_names and per_expert:
        raise fp8kit.Error(f"{ckpt.path}: experts '{ename}' are stored both as 3-D tensors ({_quoted(fused_names)}) and per "
                           "expert")
    first = "gate_up_proj" if has_gate else "up_proj"

    def layer(codes, scale, scheme, scaling, input_scale, wname):
        mname = wname[:-len(".weight")] if wname.endswith(".weight") else wname
        input_scaling, static = cfg.activation(mname, None, scheme, scaling, ckpt.where(wname))
        _check_k_groups(input_scaling, scaling, codes.shape[1], ckpt.where(wname))
        if _static(static, input_scale, input_scaling, ckpt, wname):  # each expert's stored input_scale
            return Float8StaticInputLinear.from_stored(codes, scale, scaling, _input_scale(ckpt, input_scale, stored),
                                                       None)
        return _inference_linear(codes, scale, scaling, input_scaling, None)

    if fused_names:
        if set(fused_names) != {first, "down_proj"}:
            raise fp8kit.Error(f"{ckpt.path}: experts '{ename}' have FP8 tensors {_quoted(sorted(fused_names))}, expected "
                               f"{first} and down_proj")
        for proj in (first, "down_proj"):
            wname = parts[proj]
            shape, scheme, scale, scaling, input_scale, _ = ckpt.fp8[wname]
            want = tuple(getattr(original, proj).shape)
            if shape != want:
                raise fp8kit.Error(f"{ckpt.where(wname)} has shape {list(shape)}, but the model's {_quoted(wname)} is "
                                   f"{list(want)}")
            codes = stored(wname, cast=False)
            raw = stored(scale, cast=False)
            new.register_buffer(proj, codes)
            new.register_buffer(scale.rpartition(".")[2], raw)
            e_, out, cols = shape
            # The matrix view's scaling [E * out, in] per expert: tensor -> one scale, channel -> rows,
            # block -> its grid (the C++ reader checked out % block rows == 0).
            per = raw.reshape(e_, -1)
            sub = {"tensor": "tensor", "channel": "row"}.get(scheme, scaling)
            for e in range(e_):
                s = _fp8_scale(per[e], scheme, out, cols, sub)
                (new.gate_up if proj == first else new.down)[e] = ([layer(codes[e], s, scheme, sub, input_scale, wname)]
                                                                  if proj == first else
                                                                  layer(codes[e], s, scheme, sub, input_scale, wname))
    else:
        sources = _expert_sources(model, ename)
        if sources is None or first not in sources or "down_proj" not in sources:
            raise fp8kit.Error(f"{ckpt.path}: per-expert FP8 tensors under '{ename}' (e.g. "
                               f"{_quoted(parts[per_expert[0]])}), but transformers' conversion mapping for this model type "
                               "names no per-expert sources for its fused experts")
        order = {first: sources[first], "down_proj": sources["down_proj"]}
        for e in range(num):
            expert = nn.Module()
            for proj, names in order.items():
                for p in names:
                    if (e, p) not in parts:
                        raise fp8kit.Error(f"{ckpt.path}: expert {e} of '{ename}' has no FP8 '{p}' "
                                           f"({ename}.{e}.{p}.weight)")
                    wname = parts[(e, p)]
                    shape, scheme, scale, scaling, input_scale, _ = ckpt.fp8[wname]
                    codes = stored(wname, cast=False)
                    expert.add_module(p, layer(codes, scale_of(wname, codes, scheme, scale, scaling), scheme, scaling,
                                               input_scale, wname))
            new.add_module(str(e), expert)
            new.gate_up[e] = [getattr(expert, p) for p in order[first]]
            new.down[e] = getattr(expert, order["down_proj"][0])
            gate_up_out = sum(m.out_features for m in new.gate_up[e])
            if gate_up_out != original.__getattr__(first).shape[1] or \
                    new.down[e].out_features != original.down_proj.shape[1]:
                raise fp8kit.Error(f"{ckpt.path}: expert {e} of '{ename}' does not match the model's {first} "
                                   f"{list(original.__getattr__(first).shape)} / down_proj "
                                   f"{list(original.down_proj.shape)}")
        extra = [parts[k] for k in per_expert if k[0] >= num or k[1] not in sum(order.values(), [])]
        if extra:
            raise fp8kit.Error(f"{ckpt.where(extra[0])}: no expert projection of the model loads it")
    return (*_parent(model, ename), new)


_SAFETENSORS_DTYPE = {torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.bfloat16: "BF16",
                      torch.float16: "F16", torch.float32: "F32", torch.float64: "F64"}


class _Converted(_Checkpoint):
    """A single file stored under a diffusion model's original names (Black Forest Labs' Flux,
    Stability's SD3, ...), as Diffusers' own from_single_file conversion gives it the model's names
    (the checkpoint_mapping_fn Diffusers keeps for the model's class): the FP8 codes go through that
    conversion as they are - it splits and joins rows (q, k, v from a fused qkv), and those are the
    rows' codes - and each weight's scale through the same conversion, as a column of per-row
    scales beside the codes: a weight whose rows end with one scale keeps it. The tensors are held
    in memory."""

    def __init__(self, source, model, mapping_fn):
        from diffusers.loaders.single_file_model import _get_mapping_function_kwargs
        self.path, self.qconfig, self.directory = source.path, None, False
        self._source, self._fn = source, mapping_fn.__name__
        kwargs = _get_mapping_function_kwargs(mapping_fn, config=getattr(model, "config", None))
        kwargs.pop("config", None)
        names = [n for n in source.file_of if n not in source.layout]

        def convert(tensors):
            try:
                return mapping_fn(checkpoint=tensors, config=getattr(model, "config", None), **kwargs)
            except Exception as e:
                raise fp8kit.Error(f"{source.path}: stored under other names than the model's, and Diffusers' "
                                   f"{self._fn} does not convert them ({type(e).__name__}: {_quoted(str(e))})") from None

        # The scales: a column [rows, 1] per FP8 weight (its scale per row; 1 where unscaled),
        # shape-only (meta) tensors for the rest, through the same conversion.
        columns = {}
        for n in names:
            shape = source.shape(n)
            if n in source.fp8 and not source.weight_only(n):
                raise fp8kit.Error(f"{source.where(n)}: scaled by {_quoted(source.fp8[n][2])} under the original names; "
                                   "fp8kit carries ComfyUI's per-tensor scale_weight through Diffusers' conversion")
            if len(shape) == 2 and (n in source.fp8 or source.unscaled_fp8(n)):
                # (ComfyUI's scale_weight is one value: the library refuses any other)
                scale = source.tensor(source.fp8[n][2]).to(torch.float64) if n in source.fp8 else torch.ones(())
                columns[n] = torch.full((shape[0], 1), float(scale), dtype=torch.float64)
            else:
                columns[n] = torch.empty(shape, device="meta")
        scaled = convert(columns)
        self._tensors = convert({n: source.tensor(n) for n in names})
        self.fp8, self.layout, self.file_of = {}, set(), {n: self.path for n in self._tensors}
        for n, t in list(self._tensors.items()):
            if t.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
                continue
            column = scaled.get(n)
            if column is None or column.is_meta or tuple(column.shape) != (t.shape[0], 1):
                raise fp8kit.Error(f"{self.where(n)}: Diffusers' {self._fn} does not carry its scale along "
                                   "(it changes more than the weight's rows)")
            per_row = column.reshape(-1).to(torch.float32)
            if not bool((per_row == per_row[0]).all()):
                raise fp8kit.Error(f"{self.where(n)}: Diffusers' {self._fn} joins rows of weights with different "
                                   "scales into it")
            if per_row[0] == 1:
                continue  # unscaled codes (or a scale of 1): their values, _load's unscaled path
            self._tensors[n + "_scale"] = per_row[:1]
            self.file_of[n + "_scale"] = self.path
            self.layout.add(n + "_scale")
            self.fp8[n] = (tuple(t.shape), "tensor", n + "_scale", "tensor", None, self.path)
        self.model_names = {k: k for k in self.file_of}

    def weight_only(self, name):
        return True  # every scale it carries is ComfyUI's (checked above)

    def tensor(self, name):
        return self._tensors[name]

    def dtype(self, name):
        return _SAFETENSORS_DTYPE.get(self._tensors[name].dtype, str(self._tensors[name].dtype))

    def shape(self, name):
        return tuple(self._tensors[name].shape)

    def where(self, name):
        return f"{self.path}: tensor {_quoted(name)} (the model's name, from Diffusers' {self._fn} of the file's)"


def _diffusers_names(model, ckpt):
    """ckpt as the model names its tensors: itself, or for a Diffusers model whose single file is
    stored under the original names, the _Converted checkpoint - when Diffusers' from_single_file
    would convert it (its _should_convert_state_dict_to_diffusers) and fewer than half of the
    file's tensors have the model's names (a file in Diffusers' names with a missing or extra
    tensor stays as it is: the load names that tensor)."""
    if not any(c.__module__.startswith("diffusers.") for c in type(model).__mro__):
        return ckpt  # not a Diffusers model (and diffusers not imported for it)
    try:
        from diffusers.loaders.single_file_model import (SINGLE_FILE_LOADABLE_CLASSES,
                                                         _get_single_file_loadable_mapping_class,
                                                         _should_convert_state_dict_to_diffusers)
    except ImportError:
        return ckpt
    mapping_class = _get_single_file_loadable_mapping_class(type(model))
    if mapping_class is None or ckpt.directory:
        return ckpt
    model_names = dict.fromkeys(model.state_dict())
    stored = [n for n in ckpt.file_of if n not in ckpt.layout]
    if not _should_convert_state_dict_to_diffusers(model_names, dict.fromkeys(stored)) or \
            2 * sum(n in model_names for n in stored) >= len(stored):
        return ckpt
    return _Converted(ckpt, model, SINGLE_FILE_LOADABLE_CLASSES[mapping_class]["checkpoint_mapping_fn"])


def load_fp8_checkpoint(model, path, *, torch_dtype=None, strict=True, fuse_siblings=True, fuse_gelu=True):
    """Loads an FP8 checkpoint (a .safetensors file, or a directory of shards with its config.json)
    into model, any nn.Module whose parameter names match the checkpoint's - or a Diffusers model
    whose single file keeps the original names, which Diffusers' own conversion gives it
    (_diffusers_names): each nn.Linear the checkpoint stores in FP8 becomes fp8kit.torch's
    inference layer holding the stored codes and scales as they are (see the module's docstring;
    plain float8_e4m3fn and ComfyUI's scaled fp8 weight-only); every other tensor goes to the
    parameter or buffer of its name (in torch_dtype, if given: float32, bfloat16 or float16, or
    "auto"; as from_pretrained's). strict: a tensor the model has no place for, or a
    parameter left on the meta device, is an error. fuse_siblings: as quantize_'s; fuse_gelu: as
    enable_layerwise_casting's (Diffusers' GELU modules, Flux's single blocks). Each
    layer's weight is packed at load as the codes' only copy, and the file pages the packing read
    handed back (_pack). Returns model."""
    path = fp8kit._path(path, "fp8kit.torch.load_fp8_checkpoint: path")
    # "auto" (transformers' idiom, as from_pretrained takes it): the checkpoint's dtypes.
    dtype = None if torch_dtype is None or isinstance(torch_dtype, str) and torch_dtype == "auto" else \
        _dtype(torch_dtype, "fp8kit.torch.load_fp8_checkpoint: torch_dtype")
    ckpt = _diffusers_names(model, _Checkpoint(path))
    _load(model, ckpt, dtype, strict)
    _finish(model, ckpt, fuse_siblings, strict, fuse_gelu)
    return model


def _tie(model, ckpt):
    """Tied parameters (a transformers lm_head) pointed at the loaded ones again, by transformers'
    own rule for a load (tie_weights given the tied names the checkpoint does not store): a pair
    whose one side the checkpoint stores is tied to it; a pair it stores both sides of stays
    untied unless they are equal - a config that says tie_word_embeddings over a checkpoint that
    stores its own lm_head runs that lm_head, as transformers does. A side loaded as an FP8 layer
    (codes, not a parameter) is never equal to the other: that pair stays untied."""
    if not hasattr(model, "tie_weights"):
        return
    tied = getattr(model, "all_tied_weights_keys", None)
    if tied is None:  # not a transformers 5 model: its own tie_weights
        model.tie_weights()
        return

    def parameter(name):
        owner, _, leaf = name.rpartition(".")
        return isinstance(getattr(_module(model, owner) if owner else model, leaf, None), nn.Parameter)

    stored = ckpt.model_names
    for target, source in list(tied.items()):
        if target in stored and source in stored and not (parameter(target) and parameter(source)):
            warnings.warn(f"{ckpt.path}: the config ties '{target}' to '{source}', but the checkpoint stores both "
                          f"(one as an FP8 layer): they stay untied, each as stored (set tie_word_embeddings=False in "
                          "config.json to say so)", stacklevel=3)
            tied.pop(target)
    missing = {name for pair in tied.items() for name in pair if name not in stored}
    model.tie_weights(missing_keys=missing, recompute_mapping=False)


def _finish(model, ckpt, fuse_siblings, strict, fuse_gelu=False):
    """After _load, what both loaders do: tied parameters pointed at the loaded ones again (_tie);
    strict: a parameter or buffer left on the meta device an error; the FP8 layers recorded for
    save_pretrained, a GELU after one put in its GEMM (fuse_gelu), grouped into siblings, and
    packed (_pack)."""
    path = ckpt.path
    _tie(model, ckpt)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if strict and left:
        raise fp8kit.Error(f"{path}: the checkpoint has no tensor for {', '.join(left[:8])}"
                           + (f" and {len(left) - 8} more" if len(left) > 8 else ""))
    _record_in_config(model, _fused_expert_layers(model))
    if fuse_gelu:
        _fuse_gelu(model)
    if fuse_siblings:
        _group_siblings(model)
    _pack(_fp8_layers(model))


def _attention_for(cls, asked):
    """The attn_implementation from_pretrained gives transformers: fp8kit's ("fp8kit", registered
    here) where asked and the class runs transformers' sdpa - fp8kit's function stands in for sdpa,
    whose semantics it has - else, for a class without sdpa (attention sinks, soft-capping, its own
    kernels), the class's own default (None)."""
    if asked != attention.NAME:
        return asked
    if cls is None or not getattr(cls, "_supports_sdpa", False):
        return None
    return attention.register_attention()


# transformers' from_pretrained options about how and where a model loads, which AutoConfig would
# otherwise take as config fields and so drop without a word: those that say what fp8kit does
# anyway are taken, the rest refused.
_LOADING_OPTIONS = ("device_map", "max_memory", "offload_folder", "offload_state_dict", "offload_buffers",
                    "quantization_config", "variant", "use_safetensors", "gguf_file", "from_tf", "from_flax",
                    "tp_plan", "tp_size", "device_mesh", "key_mapping", "low_cpu_mem_usage", "subfolder")


def _loading_options(kwargs, torch_dtype):
    """Takes transformers' loading options out of from_pretrained's kwargs: low_cpu_mem_usage (the
    model is always built on the meta device), use_safetensors=True and a device_map that puts the
    whole model on the CPU say what fp8kit does; every other one, or another value, is an
    fp8kit.Error naming it. So is a dtype given twice with two values (dtype=, torch_dtype=)."""
    for name in _LOADING_OPTIONS:
        if name not in kwargs:
            continue
        value = kwargs.pop(name)
        if name == "low_cpu_mem_usage" or (name == "use_safetensors" and value in (None, True)):
            continue
        if name == "device_map" and (value is None or str(value) == "cpu" or
                                     (isinstance(value, dict) and all(str(v) == "cpu" for v in value.values()))):
            continue
        raise fp8kit.Error(f"fp8kit.torch.from_pretrained: {name}={value!r} is not taken: fp8kit loads the "
                           "checkpoint's safetensors as stored, in the directory given, onto the CPU, with the "
                           "checkpoint's own quantization_config")
    given = {d for d in (torch_dtype, kwargs.get("dtype"), kwargs.get("torch_dtype")) if d is not None}
    if len(given) > 1:
        raise fp8kit.Error(f"fp8kit.torch.from_pretrained: two dtypes given ({', '.join(sorted(map(str, given)))}); "
                           "give one")


def from_pretrained(path, *, model_class=None, torch_dtype=None, fuse_siblings=True, attn_implementation="fp8kit", **kwargs):
    """A transformers model of an FP8 checkpoint directory, its FP8 Linear layers (and experts) on
    fp8kit's kernels with the stored codes and scales (see the module's docstring). The class is
    the one AutoModelForCausalLM picks for the config (model_class= to choose another:
    AutoModelForSeq2SeqLM's, a model class). Built on the meta device (accelerate's
    init_empty_weights), so no weight is ever made in high precision; non-FP8 tensors keep the
    checkpoint's dtype, or torch_dtype. fuse_siblings as quantize_'s. attn_implementation as
    transformers takes it; "fp8kit" (attention.py): decode steps' attention over the KV cache on
    fp8kit's kernel, the rest as "sdpa" (for a class that runs sdpa; else the class's default).
    kwargs go to AutoConfig.from_pretrained (config overrides), but for the loading options of
    transformers' from_pretrained (_loading_options says which are taken). Returns the model in
    eval mode."""
    import transformers
    from accelerate import init_empty_weights
    where = "fp8kit.torch.from_pretrained"
    path = fp8kit._path(path, f"{where}: path")
    _loading_options(kwargs, torch_dtype)
    if model_class is not None and not (isinstance(model_class, type) and (
            hasattr(model_class, "_from_config") or hasattr(model_class, "_model_mapping"))):
        raise fp8kit.Error(f"{where}: model_class is {_quoted(repr(model_class))}, expected a transformers model "
                           "class or an AutoModel class")
    if not os.path.isdir(path) or not _regular_file(os.path.join(path, "config.json"), where):
        raise fp8kit.Error(f"{where}: {_quoted(path)} is not a checkpoint directory (config.json, which the model is "
                           "built from, and *.safetensors); for a checkpoint without a config use "
                           "load_fp8_checkpoint on a model you build")
    ckpt = _Checkpoint(path)  # its tensors and quantization_config checked before transformers reads the config
    # The dtype the checkpoint keeps its other tensors in: checked before transformers reads it
    # (it takes any torch attribute's name).
    # A dtype asked for ("auto": the checkpoint's, as transformers takes it), else config.json's.
    asked = [d for d in (torch_dtype, kwargs.get("dtype"), kwargs.get("torch_dtype")) if d is not None and d != "auto"]
    named = asked[0] if asked else None
    config_file = os.path.join(path, "config.json")
    if named is None:  # a JSON object: _Checkpoint read it
        with open(config_file) as f:
            fields = _json(lambda: json.load(f), f"fp8kit.torch.from_pretrained: {config_file}")
        named = fields.get("dtype") or fields.get("torch_dtype") or "float32"
    dtype = _dtype(named, "fp8kit.torch.from_pretrained: " + ("dtype" if asked else config_file + ": dtype"))
    config = _read_by_transformers(lambda: transformers.AutoConfig.from_pretrained(path, **kwargs), config_file)
    # Read before any weight is: a file that is there but not a regular file is refused (a FIFO:
    # transformers 5 reports no such file, an open would block until a writer came); none: the
    # model's default.
    generation_file = os.path.join(path, "generation_config.json")
    generation = None
    if _regular_file(generation_file, "fp8kit.torch.from_pretrained"):
        generation = _read_by_transformers(lambda: transformers.GenerationConfig.from_pretrained(path), generation_file)
    # The quantization is fp8kit's to run: transformers must not apply its own quantizer.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    auto = model_class is None or (hasattr(model_class, "from_config") and model_class.__name__.startswith("Auto"))
    auto_class = transformers.AutoModelForCausalLM if model_class is None else model_class
    attn = _attention_for(auto_class._model_mapping.get(type(config), None) if auto else model_class, attn_implementation)
    with init_empty_weights():
        if auto:
            model = auto_class.from_config(config, dtype=dtype, attn_implementation=attn)
        else:
            model = model_class._from_config(config, dtype=dtype, attn_implementation=attn)
    # A tensor the model has no place for is an error, as load_fp8_checkpoint's (a static input
    # scale beside a kept module would go unread), but for those the class tells transformers to
    # pass over.
    _load(model, ckpt, dtype if asked else None, ignore=getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    _finish(model, ckpt, fuse_siblings, strict=True)
    if generation is not None:
        model.generation_config = generation
    model.eval()
    return model


def _regular_file(file, where):
    """Whether file is there: True for a regular file (or a link to one), False where nothing is;
    anything else (a FIFO, a device, a directory) an fp8kit.Error naming it - opening a FIFO blocks
    until a writer comes, so it is refused before anything opens it."""
    try:
        mode = os.stat(file).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:  # a link loop, no permission: there, but not readable as a file
        raise fp8kit.Error(f"{where}: {_quoted(file)} cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        raise fp8kit.Error(f"{where}: {_quoted(file)} is not a regular file (a FIFO, device or directory is never opened)")
    return True


def _read_by_transformers(read, file):
    """read() - transformers reading a file of the checkpoint (config.json, generation_config.json)
    - its error an fp8kit.Error naming the file, transformers' message quoted (it may hold the
    file's values, raw), the original chained."""
    try:
        return read()
    except Exception as e:  # noqa: BLE001 - whatever transformers raises on a malformed file
        raise fp8kit.Error(f"fp8kit.torch.from_pretrained: {file}: transformers does not take it "
                           f"({type(e).__name__}: {_quoted(str(e))})") from e
