"""tests/python/test_fsdp.py: fp8kit.torch's training layer under FSDP2 (torch.distributed.fsdp.
fully_shard) on CPU ranks (gloo, 127.0.0.1, a file store; started here, bounded in time, killed
on failure), with and without FP8 all-gather (fp8kit/torch/fsdp.py).

Oracles:
- The single-process reference: the same FP8 model replicated, each rank's micro-batch run through
  it in turn, the gradients averaged by hand, AdamW. With 2 ranks every operation is the same
  arithmetic (FSDP2's gradient average of two is one rounding, as the reference's), so the losses
  of 10 steps must be equal bit for bit - for each recipe, FP8 all-gather on and off, scales
  precomputed or not, reshard_after_forward True and False, and a module_filter_fn that leaves
  Linears in float32.
- The cast of the whole weight (fp8kit._recipe_quantize, as the layer without FSDP2 casts it):
  the codes and scales FSDP2 all-gathers must be those bits; a rank that casts its shard with its
  own amax (not all-reduced) gives others - shown here to fail the comparison.
- Bytes all-gathered per step (torch's CommDebugMode): FP8 at most 0.53x bfloat16's.
- torch.distributed.checkpoint: saved by the ranks and loaded into fresh ranks, the next loss
  is the one the saving ranks computed.

Run by scripts/test.sh (pytest, on the package scripts/setup.sh installed into .venv).
"""

import copy
import multiprocessing
import os
import traceback

import pytest

torch = pytest.importorskip("torch")  # fp8kit.torch is for torch users: without torch there is nothing to test
import fp8kit  # noqa: E402
import fp8kit.torch as f8  # noqa: E402

if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no gloo backend for torch.distributed", allow_module_level=True)

from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

STEPS, ROWS, SECONDS = 10, 8, 120  # steps, rows per rank's micro-batch, time a group of ranks may take


def make_model(recipe, fp8_all_gather, skip=None):
    """Two blocks Linear 64 -> 128 -> GELU -> 64, the same weights on every rank and in the reference;
    skip: the FQNs module_filter_fn refuses."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                                      torch.nn.Linear(128, 64)) for _ in range(2)])
    return f8.convert_to_float8_training(model, config=recipe, enable_fsdp_float8_all_gather=fp8_all_gather,
                                         module_filter_fn=None if skip is None else lambda m, fqn: fqn not in skip)


def batches(world):
    """Per step, per rank: (x, target) micro-batches of ROWS rows."""
    g = torch.Generator().manual_seed(1)
    return [[(torch.randn(ROWS, 64, generator=g), torch.randn(ROWS, 64, generator=g)) for _ in range(world)]
            for _ in range(STEPS)]


def loss_of(model, x, t):
    return torch.nn.functional.mse_loss(model(x), t)


def reference(recipe, world, skip=None, param_dtype=None):
    """The losses [step][rank] of one process: each rank's micro-batch through the one model, the
    gradients averaged as FSDP2 averages them. param_dtype bfloat16: FSDP2's MixedPrecisionPolicy
    (bfloat16 compute copy of float32 weights, gradients reduced in float32), done by hand."""
    model = make_model(recipe, False, skip)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in batches(world):
        run = model if param_dtype is None else _copy_in(model, param_dtype)
        grads, row = [], []
        for x, t in step:
            run.zero_grad()
            loss = loss_of(run, x if param_dtype is None else x.to(param_dtype), t)
            loss.backward()
            grads.append([p.grad.float() for p in run.parameters()])
            row.append(loss.item())
        for p, gs in zip(model.parameters(), zip(*grads)):
            p.grad = _average(gs)
        opt.step()
        losses.append(row)
    return losses


def _copy_in(model, dtype):
    return copy.deepcopy(model).to(dtype)


def _average(gs):
    total = gs[0].clone()
    for g in gs[1:]:
        total += g
    return total / len(gs)


# ---- the ranks ----

def sharded(case):
    """The case's model under FSDP2 (each block and the root) and its AdamW."""
    model = make_model(case["recipe"], case.get("fp8_all_gather", False), case.get("skip"))
    mp = MixedPrecisionPolicy(param_dtype=case.get("param_dtype"), reduce_dtype=torch.float32)
    reshard = case.get("reshard_after_forward", True)
    for block in model:
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_steps(model, opt, steps, rank, case):
    """AdamW steps on this rank's micro-batches; the losses."""
    losses = []
    for x, t in steps:
        x, t = x[rank], t[rank]
        opt.zero_grad()
        loss = loss_of(model, x if case.get("param_dtype") is None else x.to(case["param_dtype"]), t)
        loss.backward()
        opt.step()
        if case.get("precompute"):
            f8.precompute_float8_dynamic_scale_for_fsdp(model)
        losses.append(loss.item())
    return losses


def train(rank, world, case):
    """The losses [step] of this rank."""
    model, opt = sharded(case)
    return train_steps(model, opt, [tuple(zip(*s)) for s in batches(world)], rank, case)


def rank_main(rank, world, store, cases, out):
    fp8kit.set_num_threads(1)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = [globals()[case["run"]](rank, world, case) for case in cases]
        torch.save(results, f"{out}.{rank}")
        torch.distributed.barrier()
    except BaseException:
        with open(f"{out}.{rank}.err", "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)
    # Done: leave without tearing gloo down (test_training.py: its teardown aborted a rank now and then).
    os._exit(0)


def run_ranks(tmp_path, world, cases):
    """Starts world ranks running cases one after the other (one process group: starting ranks
    costs more than a case), waits at most SECONDS, kills any left; returns per case the ranks'
    results, or the first rank's error (its traceback) if one failed."""
    name = f"{len(os.listdir(tmp_path))}"
    store, out = str(tmp_path / f"store-{name}"), str(tmp_path / f"out-{name}")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, world, store, cases, out)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(SECONDS)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    errors = [open(f"{out}.{r}.err").read() for r in range(world) if os.path.exists(f"{out}.{r}.err")]
    if errors:
        return errors[0]
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return list(zip(*(torch.load(f"{out}.{r}") for r in range(world))))


PARITY = [  # (recipe, FP8 all-gather, precomputed scales, reshard_after_forward, module_filter_fn skips, param_dtype)
    ("tensorwise", True, False, True, None, None),
    ("tensorwise", True, True, False, None, None),
    ("tensorwise", True, True, True, {"0.0", "1.2"}, None),
    ("tensorwise", False, False, True, None, None),
    ("rowwise", False, False, False, None, None),
    ("tensorwise", False, False, False, None, torch.bfloat16),
]


def test_fsdp2_follows_the_single_process_reference_bit_for_bit(tmp_path):
    cases = [{"run": "train", "recipe": r, "fp8_all_gather": ag, "precompute": pre, "reshard_after_forward": re,
              "skip": skip, "param_dtype": dt} for r, ag, pre, re, skip, dt in PARITY]
    results = run_ranks(tmp_path, 2, cases)
    assert not isinstance(results, str), results
    for (recipe, ag, pre, re, skip, dt), ranks in zip(PARITY, results):
        got = [list(row) for row in zip(*ranks)]
        want = reference(recipe, 2, skip, dt)
        assert want[0][0] > want[-1][0] and want[0][1] > want[-1][1]  # it trains
        assert got == want, (recipe, ag, pre, re, skip, dt)
