"""fp8kit.torch.siblings: the Linear layers a model calls one after another on the same input
(q, k, v; gate, up), run in one call at decode's few rows, each from its own packed weight.

Checked by tests/python/test_torch.py (the siblings tests: every recipe against each layer alone,
stale parts, deepcopy, a transformers Llama decoding the same tokens).
"""
import weakref

import fp8kit

from .ops import _fused, _stamp


def _state(m):
    """What a Float8InferenceLinear's packed weight is made of - its weight, weight_scale_inv and
    bias - and their stamps (ops._stamp: version counter and data pointer), as one flat tuple."""
    bias = m._parameters["bias"]
    buffers = m._buffers
    w, s = buffers["weight"], buffers["weight_scale_inv"]
    return w, s, bias, (w._version, w.data_ptr(), s._version, s.data_ptr()), _stamp(bias)


def _same_state(a, b):
    """Whether two _state tuples hold the same tensors (by identity: == on tensors is elementwise)
    at the same stamps. Spelled out, not a generator over the pairs: a decode step checks a
    state for every layer, and a generator costs several times as much."""
    return a[0] is b[0] and a[1] is b[1] and a[2] is b[2] and a[3] == b[3] and a[4] == b[4]


class _Siblings:
    """Float8InferenceLinear children of one module with the same in_features, recipe, weight dtype
    and bias or none (quantize_ and enable_layerwise_casting group them), run as the model runs
    them: the layers it calls in a row on one tensor - attention's q, k and v projections, an MLP's
    gate and up - are seen doing so (a "run": the same tensor object at the same stamp: ops._stamp),
    and from then on, where a call is memory-bound (at most MAX_ROWS rows), the run's first layer
    computes all of their outputs in one call of the extension (call_each: the layers' GEMMs back
    to back, each from the layer's own packed weight - no stacked copy of the weights), and each
    later layer of the run, called on that tensor, gets its output. What a decode step gains: one
    call's fixed costs instead of three - which on a small CPU are large: each weight stream evicts
    the interpreter's and torch's code and data from L2, so each call's Python path runs from
    memory (measured in docs/PERF.md).

    Every output is the layer's own GEMM, bit for bit. An output is served only to the layer it was
    computed for, for the same tensor at the same stamp, and only while that layer's weight,
    scales and bias are the tensors, at the stamps, the GEMM read; anything else - another input,
    an x written in place, a reloaded weight, an inference tensor (which has no version counter) -
    and the layer computes alone, as do calls of more rows (compute-bound: one call gains nothing
    there)."""

    MAX_ROWS = 16

    def __init__(self, members):
        self.members = members  # the Float8InferenceLinear layers, in their parent's order
        self.plan = {}          # first member's index -> the run's indices, as last seen
        self._reset()

    def _reset(self):
        self.run = None    # (weakref of x, x's stamp, [indices]): the members called on x so far
        self.stash = None  # (that run, {index: (its output, the member's state)}): outputs not yet served

    def __getstate__(self):  # deepcopy and pickle: the members and the plan; not the outputs
        return {"members": self.members, "plan": self.plan}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()

    def _learn(self, run):
        """A run seen: its first member leads it from the next call on (a run of one: no plan)."""
        if len(run) > 1:
            self.plan[run[0]] = tuple(run)
        else:
            self.plan.pop(run[0], None)

    def __call__(self, i, x, dtype_index):
        """Member i's output for x (CPU, C-contiguous, of FusedLinear.out_dtypes[dtype_index]): from
        its run's call; or None, and the member computes alone."""
        if x.is_inference():
            return None
        version = _stamp(x)
        run = self.run
        if run is not None and run[0]() is x and run[1] == version and i not in run[2]:
            run[2].append(i)  # a later member of the run: its output, if the first one computed it
            stash = self.stash  # read once: another thread may replace it (each call releases the GIL)
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
        lead = x.shape[:-1]
        layers, addresses, outputs, served = [], [], [], {}
        for p in plan:  # one loop, not four comprehensions
            m = self.members[p]
            state = _state(m)  # before _fused: the tensors and stamps the FusedLinear is made of
            fused, n = _fused(state[0], state[1], m.weight_scaling, state[2], m.input_scaling, activation=m.activation)
            y = x.new_empty(*lead, n)  # C-contiguous, written by the extension
            layers.append(fused)
            addresses.append(y.data_ptr())
            outputs.append(y)
            served[p] = (y, state)
        fp8kit._fp8kit.call_each(layers, x.data_ptr(), rows, k, dtype_index, addresses)
        del served[plan[0]]
        self.stash = (run, served)
        return outputs[0]
