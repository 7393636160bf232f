"""fp8kit.torch.siblings: the Linear layers a model calls one after another on the same input
(q, k, v; gate, up), run as one GEMM at decode's few rows, each output bit for bit its own.

Checked by tests/python/test_torch.py (the siblings tests: every recipe against each layer alone,
stale parts, deepcopy, a transformers Llama decoding the same tokens).
"""
import re
import weakref

import torch

import fp8kit

from .ops import _fused_linear


def _state(m):
    """What a Float8InferenceLinear's packed weight is made of - its weight, weight_scale_inv and
    bias - and their version counters (an in-place write, load_state_dict, bumps one), as one flat
    tuple."""
    bias = m._parameters["bias"]
    buffers = m._buffers
    w, s = buffers["weight"], buffers["weight_scale_inv"]
    return w, s, bias, w._version, s._version, None if bias is None else bias._version


def _same_state(a, b):
    """Whether two _state tuples hold the same tensors (by identity: == on tensors is elementwise)
    at the same versions. Spelled out, not a generator over the pairs: a decode step checks a
    state for every layer, and a generator costs several times as much."""
    return a[0] is b[0] and a[1] is b[1] and a[2] is b[2] and a[3] == b[3] and a[4] == b[4] and a[5] == b[5]


class _Siblings:
    """Float8InferenceLinear children of one module with the same in_features, recipe, weight dtype
    and bias or none (quantize_ and enable_layerwise_casting group them), run as the model runs
    them: the layers it calls in a row on one tensor - attention's q, k and v projections, an MLP's
    gate and up - are seen doing so (a "run": the same tensor object at the same version counter),
    and from then on, where a call is memory-bound (at most MAX_ROWS rows), the run's first layer
    computes all of their outputs in one GEMM over the run's weights stacked [sum of N, K], and each
    later layer of the run, called on that tensor, gets its part. What a decode step gains: each
    weight is still read once, but in one stream per run instead of one per layer, and one call's
    fixed costs instead of three - which on a small CPU are large: the weight stream evicts the
    interpreter's and torch's code and data from L2, so each call's Python path runs from memory
    (measured in docs/PERF.md).

    Every output is the one the layer computes alone, bit for bit: an output column's sum reads only
    x and that column's weight row, in K order, whichever GEMM it is part of; the stacked weight keeps
    each layer's row, block (when the layers' N are whole 128-row blocks) or e8m0 scales, and a
    per-tensor scale becomes that layer's rows' scale (the GEMM scales each column by its own).
    A part is served only to the layer it was computed for, for the same tensor at the same version,
    and only while that layer's weight, scales and bias are the tensors, at the versions, the GEMM
    read; anything else - another input, an x written in place, a reloaded weight, an inference
    tensor (which has no version counter) - and the layer computes alone, as do calls of more rows
    (compute-bound: one GEMM gains nothing there, and its parts would need copying out)."""

    MAX_ROWS = 16

    def __init__(self, members):
        self.members = members  # the Float8InferenceLinear layers, in their parent's order
        self.plan = {}          # first member's index -> the run's indices, as last seen
        self._reset()

    def _reset(self):
        self.run = None    # (weakref of x, x's version, [indices]): the members called on x so far
        self.stash = None  # (that run, {index: (its part, the member's state)}): parts not yet served
        self.fused = {}    # run's indices -> (the members' states, FusedLinear, their out_features)

    def __getstate__(self):  # deepcopy and pickle: the members and the plan; not the GEMM nor outputs
        return {"members": self.members, "plan": self.plan}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    def _learn(self, run):
        """A run seen: its first member leads it from the next call on (a run of one: no plan), if
        the run's weights stack with their scales unchanged."""
        seen = tuple(run)
        if self.plan.get(run[0]) == seen:
            return
        block = re.fullmatch(r"block\((\d+)x\d+\)", self.members[run[0]].weight_scaling)
        if len(run) > 1 and (block is None or all(self.members[i].out_features % int(block[1]) == 0 for i in run[:-1])):
            self.plan[run[0]] = seen
        else:
            self.plan.pop(run[0], None)
        runs = set(self.plan.values())  # the stacked weights of runs no longer planned: freed
        self.fused = {r: f for r, f in self.fused.items() if r in runs}

    def _gemm(self, run):
        """The run's stacked weight as a FusedLinear, made again when a member's state changed."""
        states = [_state(self.members[i]) for i in run]
        cached = self.fused.get(run)
        if cached is None or not all(map(_same_state, cached[0], states)):
            mods = [self.members[i] for i in run]
            m0 = mods[0]
            codes = torch.cat([m.weight for m in mods])
            scaling = m0.weight_scaling
            if scaling == "tensor":  # one scale a layer: each of its rows takes it
                scales = torch.cat([m.weight_scale_inv.float().expand(m.out_features, 1) for m in mods])
                scaling = "row"
            else:
                scales = torch.cat([m.weight_scale_inv for m in mods])
            bias = None if m0.bias is None else torch.cat([m.bias.detach() for m in mods])
            sizes = [m.out_features for m in mods]
            gemm = _fused_linear(fp8kit.qtensor(codes, scales, scaling), m0.input_scaling, bias, sizes)
            cached = self.fused[run] = (states, gemm, sizes)
        return cached

    def __call__(self, i, x, dtype_index):
        """Member i's output for x (CPU, C-contiguous, of FusedLinear.out_dtypes[dtype_index]): its
        part of its run's GEMM; or None, and the member computes alone."""
        if x.is_inference():
            return None
        version = x._version
        run = self.run
        if run is not None and run[0]() is x and run[1] == version and i not in run[2]:
            run[2].append(i)  # a later member of the run: its part, if the first one computed it
            stash = self.stash  # read once: another thread may replace it (each GEMM releases the GIL)
            if stash is not None and stash[0] is run:
                got = stash[1].pop(i, None)
                if got is not None and _same_state(got[1], _state(self.members[i])):
                    return got[0]
            return None
        if run is not None:
            self._learn(run[2])
        run = self.run = (weakref.ref(x), version, [i])
        plan = self.plan.get(i)
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        if plan is None or not 0 < rows <= self.MAX_ROWS:
            return None
        states, gemm, sizes = self._gemm(plan)
        lead = x.shape[:-1]
        first = x.new_empty(*lead, sizes[0])  # each part C-contiguous, written by the extension
        addresses, served = [first.data_ptr()], {}
        for p in range(1, len(plan)):  # one loop, not three comprehensions
            part = x.new_empty(*lead, sizes[p])
            addresses.append(part.data_ptr())
            served[plan[p]] = (part, states[p])
        gemm.call_into_parts(x.data_ptr(), rows, k, dtype_index, addresses)
        self.stash = (run, served)
        return first
