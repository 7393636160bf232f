"""tests/python/test_advise.py: fp8kit.torch.advise - per Linear, FP8 or not and which recipe,
and the policy file it writes, read back by the library's own reader (fp8kit::read_policy, the
one `fp8kit quantize --policy` and `fp8kit train --policy` use).

Speed is never asserted (docs: benchmarks measure it); what is checked is the decision rule
given the measurements - a speedup floor of 0 admits every layer, an SQNR floor above a layer's
reported SQNR refuses it as "not accurate" - and that the reported SQNR is the float64 one: a
tensorwise e4m3 GEMM of N(0, 1) data sits near 30 dB, between the 25 dB floor and the 50 dB of
bfloat16, and the floor of 25 applied to it passes.

Run by scripts/test.sh (pytest, on the package scripts/setup.sh installed into .venv).
"""
import json
import re

import pytest

torch = pytest.importorskip("torch")  # fp8kit.torch is for torch users: without torch there is nothing to test
import fp8kit  # noqa: E402
import fp8kit.torch as f8  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.up = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 128)
        self.unused = torch.nn.Linear(128, 128)  # never called by forward

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def sqnr_of(entry):
    return float(re.search(r"sqnr ([0-9.]+) dB", entry["reason"]).group(1))


def test_policy_written_is_the_one_the_library_reads(tmp_path):
    path = tmp_path / "policy.json"
    entries = f8.advise(Net(), (torch.randn(64, 128),), path, rounds=3, min_speedup=0.0)
    by_name = {e["name"]: e for e in entries}
    assert set(by_name) == {"up.weight", "down.weight", "unused.weight"}
    for name in ("up.weight", "down.weight"):
        e = by_name[name]
        # speed floor 0: only accuracy decides; e4m3 on N(0,1)-like data is well above 25 dB
        assert e["fp8"] and e["recipe"] in f8.RECIPES and "M=64" in e["reason"] and "3 rounds" in e["reason"]
        assert 25 < sqnr_of(e) < 45
    assert not by_name["unused.weight"]["fp8"] and "not run" in by_name["unused.weight"]["reason"]
    # The library's reader accepts the file and sees the same decisions.
    read = json.loads(fp8kit._fp8kit.read_policy(str(path)))
    assert read["format"] == "fp8kit-policy" and read["version"] == 1
    assert [(l["name"], l["fp8"], l["recipe"]) for l in read["layers"]] == \
        [(e["name"], e["fp8"], e["recipe"]) for e in entries]


def test_weight_only_is_a_recipe_the_policy_file_keeps(tmp_path):
    # advise may pick weight_only (x not quantized): the policy file names it and the library's
    # reader takes it back as that recipe (stored per row, input unquantized), not as rowwise. Its
    # SQNR is the weight's e4m3 rounding alone, above rowwise's (x in e4m3 too) on the same layer.
    path = tmp_path / "policy.json"
    net, x = Net(), (torch.randn(16, 128),)
    wo = {e["name"]: e for e in f8.advise(net, x, path, rounds=1, min_speedup=0.0, recipes=("weight_only",))}
    assert wo["up.weight"]["fp8"] and wo["up.weight"]["recipe"] == "weight_only"
    read = {l["name"]: l for l in json.loads(fp8kit._fp8kit.read_policy(str(path)))["layers"]}
    assert read["up.weight"]["recipe"] == "weight_only" and read["down.weight"]["recipe"] == "weight_only"
    rw = {e["name"]: e for e in f8.advise(net, x, rounds=1, min_speedup=0.0, recipes=("rowwise",))}
    assert sqnr_of(wo["up.weight"]) > sqnr_of(rw["up.weight"]) + 1.0


def test_sqnr_floor_above_a_layer_refuses_it():
    net, x = Net(), (torch.randn(32, 128),)
    first = {e["name"]: e for e in f8.advise(net, x, rounds=1, min_speedup=0.0, recipes=("tensorwise",))}
    floor = sqnr_of(first["up.weight"]) + 1.0  # SQNR does not depend on timing: the same next time
    again = {e["name"]: e for e in f8.advise(net, x, rounds=1, min_speedup=0.0, sqnr_floor=floor,
                                              recipes=("tensorwise",))}
    assert not again["up.weight"]["fp8"] and again["up.weight"]["reason"].startswith("not accurate")
    assert again["up.weight"]["recipe"] is None


@pytest.mark.parametrize("kwargs,needle", [
    ({"rounds": 0}, "rounds is '0', expected an int >= 1"),
    ({"rounds": 1.5}, "rounds is '1.5'"),
    ({"recipes": ("fastest",)}, "recipe 'fastest'"),
    ({"recipes": ()}, r"recipes is '\[\]', expected a non-empty tuple"),
    ({"recipes": "rowwise"}, "recipes is 'rowwise', expected a non-empty tuple"),
    ({"sqnr_floor": "25"}, "sqnr_floor is '25', expected a finite number"),
    ({"min_speedup": float("nan")}, "min_speedup is 'NaN', expected a finite number"),
    ({"path": "no-such-folder/p.json"}, "path 'no-such-folder/p.json': its folder does not exist"),
])
def test_bad_arguments_are_refused_naming_them_before_any_work(kwargs, needle, monkeypatch):
    # Each refused before the model runs and the timing rounds start (before: a missing folder
    # failed after every round; the others raised ZeroDivisionError, TypeError or nothing).
    monkeypatch.setattr(Net, "forward", lambda *_: pytest.fail("advise ran the model"))
    with pytest.raises(fp8kit.Error, match=needle):
        f8.advise(Net(), (torch.randn(4, 128),), **kwargs)
    with pytest.raises(fp8kit.Error, match="the model is a str, expected a torch.nn.Module"):
        f8.advise("model", (torch.randn(4, 128),))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_a_layer_without_weights_is_kept_and_said_so():
    net = torch.nn.Sequential(torch.nn.Linear(0, 8), torch.nn.Linear(8, 8))
    entries = f8.advise(net, (torch.randn(4, 0),), rounds=1, recipes=("tensorwise",))
    assert [(e["name"], e["fp8"]) for e in entries][0] == ("0.weight", False)
    assert entries[0]["reason"].startswith("no weights")


def test_a_policy_naming_fp8_without_a_recipe_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "fp8kit-policy", "version": 1, "layers": [{"name": "a.weight", "fp8": true}]}')
    with pytest.raises(fp8kit.Error, match="fp8 but names no recipe"):
        fp8kit._fp8kit.read_policy(str(bad))


def test_a_bfloat16_model_is_measured_not_converted():
    # advise times a float32 copy of a bfloat16 layer: the model itself stays bfloat16.
    net = Net().to(torch.bfloat16)
    entries = f8.advise(net, (torch.randn(16, 128).to(torch.bfloat16),), rounds=1, recipes=("tensorwise",))
    assert len(entries) == 3 and all(p.dtype == torch.bfloat16 for p in net.parameters())


def test_a_path_with_a_null_byte_is_refused_before_any_work(tmp_path, monkeypatch):
    # The C++ side would cut the path at the null byte and write another file (victim.json).
    monkeypatch.setattr(Net, "forward", lambda *_: pytest.fail("advise ran the model"))
    with pytest.raises(ValueError, match="advise: path: embedded null byte"):
        f8.advise(Net(), (torch.randn(4, 128),), str(tmp_path / "victim.json\x00.policy"), rounds=1)
    assert not (tmp_path / "victim.json").exists()
