#!/usr/bin/env python3
"""tests/e2e/hostile_inputs.py: the hostile-input corpus of the `fp8kit` command, generated here
byte by byte (no file is committed) and run against the built command; the standard library only.

Each case writes its inputs into a fresh folder, runs one command (stdin closed, a timeout: a hang
fails) and checks: the exit code (0 success, 1 internal, 2 usage, 3 bad input, 4 check failed, 5
output failed - every code of `fp8kit --help` is produced here), that stderr holds the expected
message (naming the flag, file, tensor and rule), that no raw control character (ESC, C1, invalid
UTF-8) reaches stdout or stderr, and for a refused run that the folder is byte for byte what it
was (no output, no temporary, input untouched). The classes: numeric flags (overflow, NaN, inf,
empty, trailing characters, out of range, sizes beyond memory), shard indexes naming tensors
their shard lacks, scales (NaN, Inf, negative, zero, integer dtype, missing, contradicting the
config's scheme, e8m0 NaN), non-regular files (FIFOs as model, shard, data, policy), names and
configs holding escape sequences, outputs (inside the input, dangling links, a write failing),
NUL-padded headers. Then a property test: every numeric flag of every command is fed random
strings, judged against an independent strict parser (a valid value passes the flag and stops at
a later, known error; an invalid one is refused naming the flag).

Usage: hostile_inputs.py FP8KIT [SEED]   (ctest: cli_hostile_inputs)
"""
import hashlib
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

FP8KIT = os.path.abspath(sys.argv[1])
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 51
WORK = tempfile.mkdtemp(prefix="fp8kit-hostile-")
failures = []
passed = 0

# ---- writing safetensors files by hand ----

DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "F8_E4M3": 1, "F8_E8M0": 1}


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


def safetensors(path, tensors, metadata=None, pad=b" "):
    """tensors: [(name, dtype, shape, bytes)] in order; the header padded to 8 bytes with `pad`."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        assert len(raw) == DTYPE_SIZE[dtype] * math.prod(shape), name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += pad * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


E4M3_ONE = 0x38  # 1.0 in e4m3fn


def fp8_weight(name="layer.weight", rows=4, cols=8):
    return (name, "F8_E4M3", [rows, cols], bytes([E4M3_ONE]) * (rows * cols))


def fp8_model(path, scale=(1.0,), scale_shape=(1,), scale_dtype="F32", config=None, name="layer.weight", extra=()):
    """An FP8 weight [4, 8] with its scale; config: a quantization_config (JSON text) in the metadata."""
    raw = f32(*scale) if scale_dtype == "F32" else struct.pack("<%di" % len(scale), *[int(v) for v in scale])
    safetensors(path, [fp8_weight(name), (name + "_scale", scale_dtype, list(scale_shape), raw), *extra],
                None if config is None else {"quantization_config": config})


def float_model(path, names=("layer.weight",), rows=4, cols=8):
    safetensors(path, [(n, "F32", [rows, cols], f32(*[0.25 * (i % 7 - 3) for i in range(rows * cols)])) for n in names])


# ---- running the command ----

def run(args, cwd, timeout=60, limits=None):
    def child():
        if limits:
            for res, value in limits:
                resource.setrlimit(res, (value, value))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails (EFBIG) instead of killing
    try:
        p = subprocess.run([FP8KIT, *args], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                           preexec_fn=child if limits else None)
    except subprocess.TimeoutExpired:
        return None, b"", b"(timed out: the command hung)"
    return p.returncode, p.stdout, p.stderr


def snapshot(folder):
    """Every path under folder (links as links) with its content's hash."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, folder)
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
            else:
                out[rel] = "special" if not os.path.isdir(p) else "dir"
    return out


RAW_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def raw_controls(data):
    """What a terminal would act on: C0 controls but \\t and \\n, DEL, C1 controls, bytes that are not UTF-8."""
    if RAW_CONTROL.search(data):
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def case(title, setup, args, code, needle, *, unchanged=True, limits=None, check=None):
    """setup(folder) writes the inputs; args may use {d} for the folder. needle: a substring (or
    a list of them) stderr must hold; check(folder, stdout, stderr): a further condition."""
    global passed
    d = tempfile.mkdtemp(dir=WORK)
    setup(d)
    before = snapshot(d)
    rc, out, err = run([a.format(d=d) for a in args], d, limits=limits)
    needles = [needle] if isinstance(needle, str) else needle
    problems = []
    if rc != code:
        problems.append("exit %s, expected %d" % (rc, code))
    for n in needles:
        if n.format(d=d).encode() not in err:
            problems.append("stderr lacks %r" % n.format(d=d))
    if raw_controls(out) or raw_controls(err):
        problems.append("a raw control character reached the terminal")
    if unchanged and code != 0 and snapshot(d) != before:
        problems.append("the folder changed (an output, a temporary or an input touched)")
    if check and not problems and not check(d, out, err):
        problems.append("its check failed")
    if problems:
        failures.append("%s: %s\n    fp8kit %s\n    stderr: %s" % (title, "; ".join(problems), " ".join(args), err.decode("utf-8", "replace")[:600]))
    else:
        passed += 1


def nothing(_):
    pass


# ---- 1. numeric flags and sizes ----

def model_file(d):
    float_model(os.path.join(d, "m.safetensors"))


for flag, bad, cmd in [
    ("--tokens", "9223372036854775807", ["advise", "--model", "m.safetensors", "--out", "p.json"]),
    ("--tokens", "9223372036854775808", ["advise", "--model", "m.safetensors", "--out", "p.json"]),
    ("--tokens", "12abc", ["advise", "--model", "m.safetensors", "--out", "p.json"]),
    ("--budget", "inf", ["advise", "--model", "m.safetensors", "--out", "p.json"]),
    ("--budget", "nan", ["advise", "--model", "m.safetensors", "--out", "p.json"]),
    ("--min-speedup", "-1", ["advise", "--model", "m.safetensors", "--out", "p.json"]),
    ("--min-speedup", "1e999", ["advise", "--model", "m.safetensors", "--out", "p.json"]),
    ("--min-sqnr", "nan", ["verify", "m.safetensors", "m.safetensors"]),
    ("--min-sqnr", "", ["verify", "m.safetensors", "m.safetensors"]),
    ("--min-sqnr", "25dB", ["verify", "m.safetensors", "m.safetensors"]),
    ("--steps", "9223372036854775807", ["train", "--out", "o"]),
    ("--steps", "0x10", ["train", "--out", "o"]),
    ("--seed", "-1", ["train", "--out", "o"]),
    ("--seed", "+1", ["train", "--out", "o"]),
    ("--batch", "1000000000", ["train", "--out", "o"]),
    ("--layers", "2000", ["train", "--out", "o"]),
    ("--threads", "1e3", ["train", "--out", "o"]),
    ("--tokens", "9223372036854775807", ["generate", "--model", "m.safetensors"]),
    ("--tokens", " 5", ["generate", "--model", "m.safetensors"]),
    ("--rounds", "9223372036854775807", ["bench", "generate", "--model", "m.safetensors"]),
]:
    case("%s %s %r" % (cmd[0], flag, bad), model_file, cmd + [flag + "=" + bad if bad.startswith("-") else flag, *([] if bad.startswith("-") else [bad])],
         2, "%s '%s': expected" % (flag, bad))
case("advise --shapes with a trailing comma", nothing, ["advise", "--shapes", "16x128x128,", "--out", "p.json"], 2, "--shapes: '' is not MxNxK")
case("advise --shapes with an empty item", nothing, ["advise", "--shapes", "16x128x128,,4x4x4", "--out", "p.json"], 2, "--shapes: '' is not MxNxK")
case("advise --shapes M*N over 2^31", nothing, ["advise", "--shapes", "65536x65536x1", "--out", "p.json"], 2, "needs M*N, N*K, M*K <= 2^31")
case("advise --model with --tokens making M*K over 2^31", model_file,
     ["advise", "--model", "m.safetensors", "--tokens", "2147483648", "--out", "p.json"], 2, "--tokens 2147483648 with 'layer.weight' [4, 8] needs")
case("train sizes beyond any memory: refused before a directory is made", nothing,
     ["train", "--layers", "1024", "--width", "65536", "--out", "o"], 2, ["--layers / --width / --batch", "GiB of memory"])
case("train --batch beyond memory", nothing, ["train", "--layers", "64", "--width", "4096", "--batch", "1000000", "--out", "o"], 2,
     "more than this machine's")
case("train --data ''", nothing, ["train", "--data", "", "--out", "o"], 2, "--data: the path is empty")
case("train --data DIR", lambda d: os.mkdir(os.path.join(d, "dir")), ["train", "--data", "dir", "--out", "o"], 3,
     "--data: dir: a directory, not a regular file")
case("quantize OUT ''", model_file, ["quantize", "m.safetensors", ""], 2, "OUT: the path is empty")
case("generate from a GPT file whose metadata asks for more memory than exists", lambda d: safetensors(
    os.path.join(d, "g.safetensors"), [("x", "F32", [1], f32(0))],
    {"fp8kit.model": "gpt", "gpt.layers": "1024", "gpt.width": "65536", "gpt.heads": "4", "gpt.context": "64", "gpt.vocab": "256"}),
     ["generate", "--model", "g.safetensors"], 3, ["g.safetensors", "GiB of memory"])

# ---- 2. shard indexes ----

def sharded(d, weight_map, shards):
    os.mkdir(os.path.join(d, "ck"))
    for fname, names in shards.items():
        float_model(os.path.join(d, "ck", fname), names)
    with open(os.path.join(d, "ck", "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def index_lies(d):
    sharded(d, {"a.weight": "s1.safetensors", "b.weight": "s1.safetensors"},
            {"s1.safetensors": ["a.weight"], "s2.safetensors": ["b.weight"]})


for cmd in (["inspect", "ck"], ["quantize", "ck", "out"], ["dequantize", "ck", "out"], ["verify", "ck", "ck"],
            ["advise", "--model", "ck", "--out", "p.json"]):
    case("%s: index names a tensor its shard does not hold" % cmd[0], index_lies, cmd, 3,
         "weight_map lists tensor 'b.weight' in 's1.safetensors', which does not hold it")
case("index names a shard that is a FIFO", lambda d: (sharded(d, {"a.weight": "s1.safetensors"}, {}),
                                                      os.mkfifo(os.path.join(d, "ck", "s1.safetensors"))),
     ["inspect", "ck"], 3, "s1.safetensors: a FIFO, not a regular file")
case("index names a shard whose name holds escapes", lambda d: sharded(d, {"a.weight": "s\x1b[2J.safetensors"}, {}),
     ["inspect", "ck"], 3, "weight_map['a.weight'] is 's\\x1b[2J.safetensors', a name holding control characters")
case("a shard whose name holds escapes, no index", lambda d: (os.mkdir(os.path.join(d, "ck")),
                                                              float_model(os.path.join(d, "ck", "\x9bx.safetensors"), ("a",))),
     ["inspect", "ck"], 3, "the shard '\\xc2\\x9bx.safetensors', a name holding control characters")
case("index weight_map value not a string, name with ESC", lambda d: sharded(d, {"\x1b[2Ja": 7}, {}), ["inspect", "ck"], 3,
     "weight_map['\\x1b[2Ja'] is not a file name")

# ---- 3. scales ----

CT_TENSOR = json.dumps({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": {"strategy": "tensor"}}}})
for title, kwargs, needle in [
    ("NaN scale", dict(scale=(float("nan"),)), "its scale 'layer.weight_scale' holds nan at [0]: a scale is finite and positive"),
    ("+Inf scale", dict(scale=(float("inf"),)), "holds inf at [0]: a scale is finite and positive"),
    ("negative scale", dict(scale=(-2.0,)), "holds -2 at [0]: a scale is finite and positive"),
    ("zero scale", dict(scale=(0.0,)), "holds 0 at [0]: a scale is finite and positive"),
    ("one negative row of a channel scale", dict(scale=(1, 1, -1, 1), scale_shape=(4, 1)), "holds -1 at [2, 0]"),
    ("integer scale", dict(scale=(1,), scale_dtype="I32"), "'layer.weight_scale' is i32 [1]: a scale is f32, bf16, f16 or e8m0"),
    ("a scale that contradicts the config's strategy", dict(scale=(1, 1, 1, 1), scale_shape=(4, 1), config=CT_TENSOR),
     "quantization_config says scheme 'tensor' for it, but its scale 'layer.weight_scale' is f32 [4, 1], expected f32/bf16/f16 [1]"),
    ("fp8kit config: a module's scheme contradicted", dict(config=json.dumps({"quant_method": "fp8kit", "schemes": {"layer": "channel"}})),
     "says scheme 'channel' for it, but its scale 'layer.weight_scale' is f32 [1], expected f32/bf16/f16 [4, 1]"),
    ("a scale no layout explains", dict(scale=(1, 1, 1), scale_shape=(3,)), "its scale 'layer.weight_scale' f32 [3] fits no layout"),
    # As many scales as the layout's grid, in another shape: each would scale another block.
    ("a block grid transposed", dict(scale=(1,) * 8, scale_shape=(4, 2), config=json.dumps(
        {"quant_method": "fp8kit", "schemes": {"layer": "block128"}, "weight_block_size": [2, 2]})),
     "says scheme 'block128' for it, but its scale 'layer.weight_scale' is f32 [4, 2], expected f32/bf16/f16 [2, 4] for blocks 2x2"),
    ("a group scale flattened", dict(scale=(1,) * 8, scale_shape=(8,), config=json.dumps(
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "strategy": "group", "group_size": 4}}}})),
     "says scheme 'group' for it, but its scale 'layer.weight_scale' is f32 [8], expected f32/bf16/f16 [4, in / group_size]"),
    ("static input scale negative", dict(extra=[("layer.input_scale", "F32", [1], f32(-1))]),
     "its static input scale 'layer.input_scale' holds -1 at [0]"),
]:
    for cmd in (["inspect", "q.safetensors"], ["dequantize", "q.safetensors", "d.safetensors"], ["verify", "q.safetensors", "q.safetensors"]):
        case("%s: %s" % (cmd[0], title), lambda d, k=kwargs: fp8_model(os.path.join(d, "q.safetensors"), **k), cmd, 3,
             ["q.safetensors: FP8 tensor 'layer.weight' [4, 8]", needle])

# A quantization_config that contradicts the FP8 tensors, or is malformed: refused, naming the file.
for title, group, needle in [
    ("a config group of 4-bit weights", {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor"}},
     ["quantization_config config_groups['g'].weights are", "not FP8 (num_bits 8, type float)"]),
    ("a config group's unknown strategy", {"targets": ["Linear"], "weights": {"strategy": "banana\x1b[31m"}},
     "config_groups['g'].weights strategy \"banana\\u001b[31m\", expected tensor, channel, group or block"),
    ("a config group that is a number", 7, "quantization_config config_groups['g'] is not an object"),
    # targets names the modules a group's strategy is for: read past, they would take another's
    ("a config group's targets null", {"targets": None, "weights": {"strategy": "tensor"}},
     "config_groups['g'].targets is null, expected a list of module names"),
    ("a config group's targets holding a number", {"targets": ["Linear", 7], "weights": {"strategy": "tensor"}},
     "config_groups['g'].targets is [\"Linear\",7], expected a list of module names"),
]:
    config = json.dumps({"quant_method": "compressed-tensors", "config_groups": {"g": group}})
    for cmd in (["inspect", "q.safetensors"], ["dequantize", "q.safetensors", "d.safetensors"]):
        case("%s: %s" % (cmd[0], title), lambda d, c=config: fp8_model(os.path.join(d, "q.safetensors"), config=c), cmd, 3,
             [needle] if isinstance(needle, str) else needle)
case("a quantized module's scale missing", lambda d: safetensors(os.path.join(d, "q.safetensors"), [fp8_weight()],
                                                                 {"quantization_config": CT_TENSOR}),
     ["dequantize", "q.safetensors", "d.safetensors"], 3,
     "'layer.weight' [4, 8] has no scale tensor ('layer.weight_scale' or 'layer.weight_scale_inv'), and the quantization_config says")
case("e8m0 scale holding its NaN code 0xff", lambda d: safetensors(
    os.path.join(d, "q.safetensors"), [fp8_weight(), ("layer.weight_scale", "F8_E8M0", [4, 1], bytes([127, 127, 255, 127]))]),
     ["inspect", "q.safetensors"], 3, "holds nan at [2, 0]")
# A code that is not a number (e4m3fn's 0x7f) in a weight: dequantize would write it as a NaN
# weight (before: exit 0, the NaN in the output); refused naming the tensor and the place.
case("dequantize: a weight holding a NaN code", lambda d: safetensors(
    os.path.join(d, "q.safetensors"), [("layer.weight", "F8_E4M3", [4, 8], bytes([E4M3_ONE]) * 19 + bytes([0x7F]) + bytes([E4M3_ONE]) * 12),
                                       ("layer.weight_scale", "F32", [1], f32(1.0))]),
     ["dequantize", "q.safetensors", "d.safetensors"], 3, "'layer.weight' holds the code 0x7f (not a number) at row 2, column 3")
case("a valid FP8 checkpoint is read (exit 0)", lambda d: fp8_model(os.path.join(d, "q.safetensors"), scale=(0.5,)),
     ["inspect", "q.safetensors"], 0, "", check=lambda d, out, err: b"tensor F8_E4M3" in out or b"tensor" in out)

# ---- 4. files that are not regular files: refused at once, never waited on ----

def fifo(name):
    return lambda d: os.mkfifo(os.path.join(d, name))


for title, setup, args, needle in [
    ("inspect FIFO", fifo("f"), ["inspect", "f"], "f: a FIFO, not a regular file"),
    ("quantize IN = FIFO", fifo("f"), ["quantize", "f", "o.safetensors"], "f: a FIFO"),
    ("verify B = FIFO", lambda d: (model_file(d), os.mkfifo(os.path.join(d, "f"))), ["verify", "m.safetensors", "f"], "f: a FIFO"),
    ("generate --model FIFO", fifo("f"), ["generate", "--model", "f"], "f: a FIFO"),
    ("advise --model FIFO", fifo("f"), ["advise", "--model", "f", "--out", "p.json"], "f: a FIFO"),
    ("train --data FIFO", fifo("f"), ["train", "--data", "f", "--steps", "1", "--out", "o"], "--data: f: a FIFO"),
    ("quantize --policy FIFO", lambda d: (model_file(d), os.mkfifo(os.path.join(d, "f"))),
     ["quantize", "m.safetensors", "o.safetensors", "--policy", "f"], "f: a FIFO"),
    ("config.json a FIFO", lambda d: (sharded(d, {"a.weight": "s1.safetensors"}, {"s1.safetensors": ["a.weight"]}),
                                      os.mkfifo(os.path.join(d, "ck", "config.json"))), ["inspect", "ck"], "config.json: a FIFO"),
    ("a device as input", nothing, ["inspect", "/dev/zero"], "/dev/zero: a device, not a regular file"),
]:
    case(title, setup, args, 3, needle)

# ---- 5. what files hold reaches the terminal escaped ----

ESC_NAME = "evil\x1b]0;pwned\x07\x1b[31m\u009b2J.weight"
ESC_SHOWN = "evil\\x1b]0;pwned\\x07\\x1b[31m\\xc2\\x9b2J.weight"
case("inspect: a tensor name with escape sequences", lambda d: float_model(os.path.join(d, "m.safetensors"), (ESC_NAME,)),
     ["inspect", "m.safetensors"], 0, "", check=lambda d, out, err: ESC_SHOWN.encode() in out)
case("verify: the name in the table and in the failure list", lambda d: (float_model(os.path.join(d, "a.safetensors"), (ESC_NAME,)),
                                                                         float_model(os.path.join(d, "b.safetensors"), ("other",))),
     ["verify", "a.safetensors", "b.safetensors"], 4, ESC_SHOWN + ": missing from b.safetensors",
     check=lambda d, out, err: ESC_SHOWN.encode() in out)
case("an error naming the tensor", lambda d: fp8_model(os.path.join(d, "q.safetensors"), scale=(-1.0,), name=ESC_NAME),
     ["dequantize", "q.safetensors", "d.safetensors"], 3, "FP8 tensor '" + ESC_SHOWN + "'")
case("quantize: a name with escapes in the table", lambda d: float_model(os.path.join(d, "m.safetensors"), (ESC_NAME,), rows=128, cols=128),
     ["quantize", "m.safetensors", "q.safetensors", "--scheme", "tensor"], 0, "", check=lambda d, out, err: ESC_SHOWN.encode() in out)
case("inspect: a malformed quantization_config with escapes", lambda d: safetensors(
    os.path.join(d, "m.safetensors"), [("w", "F32", [1], f32(1))], {"quantization_config": "{\x1b[2J not json \u009b"}),
     ["inspect", "m.safetensors"], 0, "", check=lambda d, out, err: b"(not JSON): {\\x1b[2J not json \\xc2\\x9b" in out)
case("a binary policy file", lambda d: (model_file(d), open(os.path.join(d, "p.json"), "wb").write(b"\x1b[2J\x9b\xff\x00{")),
     ["quantize", "m.safetensors", "q.safetensors", "--policy", "p.json"], 3, "p.json: not valid JSON")
case("a policy layer with a control character in its name, mistyped", lambda d: (model_file(d), open(os.path.join(d, "p.json"), "w").write(
    json.dumps({"format": "fp8kit-policy", "version": 1, "layers": [{"name": "\x1b[31mx", "fp8": "yes"}]}))),
     ["quantize", "m.safetensors", "q.safetensors", "--policy", "p.json"], 3, "has no boolean 'fp8'")
case("a policy whose version is a string (no internal error)", lambda d: (model_file(d), open(os.path.join(d, "p.json"), "w").write(
    json.dumps({"format": "fp8kit-policy", "version": "1", "layers": []}))),
     ["quantize", "m.safetensors", "q.safetensors", "--policy", "p.json"], 3, "unsupported version \"1\"")
case("a quantization_config whose quant_method is not a string (no internal error)", lambda d: safetensors(
    os.path.join(d, "m.safetensors"), [("w", "F32", [1], f32(1))], {"quantization_config": json.dumps({"quant_method": 7})}),
     ["inspect", "m.safetensors"], 0, "")
case("the unknown subcommand is escaped", nothing, ["\x1b[2Jx"], 2, "unknown subcommand '\\x1b[2Jx'")

# ---- 6. outputs ----

def directory_model(d):
    os.mkdir(os.path.join(d, "in"))
    float_model(os.path.join(d, "in", "model.safetensors"), rows=128, cols=128)


case("quantize DIR DIR/sub: the output inside the input", directory_model, ["quantize", "in", "in/sub"], 2, "in/sub is inside the input in")
case("quantize DIR DIR/./sub/../sub2", directory_model, ["quantize", "in", "./in/../in/sub2"], 2, "is inside the input")
case("advise --out inside the --model directory", directory_model, ["advise", "--model", "in", "--out", "in/p.json"], 2, "is inside the input")
case("a dangling symlink at OUT without --force", lambda d: (model_file(d), os.symlink("nowhere", os.path.join(d, "o.safetensors"))),
     ["quantize", "m.safetensors", "o.safetensors"], 2, "o.safetensors: the output exists already (--force replaces it)")
case("a FIFO at OUT without --force", lambda d: (model_file(d), os.mkfifo(os.path.join(d, "o.safetensors"))),
     ["dequantize", "m.safetensors", "o.safetensors"], 2, "the output exists already")
case("a dangling symlink at OUT with --force is replaced by the file", lambda d: (model_file(d), os.symlink("nowhere", os.path.join(d, "o.safetensors"))),
     ["quantize", "m.safetensors", "o.safetensors", "--force", "--quiet"], 0, "",
     check=lambda d, out, err: not os.path.islink(os.path.join(d, "o.safetensors")) and not os.path.exists(os.path.join(d, "nowhere")))
# A write that fails (a file-size limit: EFBIG, also for root): exit 5, nothing left, input untouched.
FSIZE = [(resource.RLIMIT_FSIZE, 4096)]
case("quantize: the output cannot be written", lambda d: float_model(os.path.join(d, "m.safetensors"), rows=256, cols=256),
     ["quantize", "m.safetensors", "q.safetensors", "--quiet"], 5, ["fp8kit: error writing the output: ", "q.safetensors"], limits=FSIZE)
case("dequantize a directory: the output cannot be written", lambda d: (directory_model(d), run(["quantize", "in", "q", "--quiet"], d)),
     ["dequantize", "q", "d", "--dtype", "f32", "--quiet"], 5, "error writing the output", limits=FSIZE)
# The limit lies above the 1 KiB registration file LLVM's OpenMP runtime (clang builds) maps in
# /dev/shm at start - below it the process dies of SIGBUS before fp8kit runs - and below the
# policy of these 16 shapes (about 3.3 KB).
SHAPES16 = ",".join(f"{m}x{n}x{k}" for m, n, k in ((4, 8, 8), (4, 8, 16), (4, 16, 8), (8, 8, 8), (4, 8, 24), (4, 24, 8),
                                                    (8, 16, 8), (16, 8, 8), (4, 32, 8), (4, 8, 32), (8, 8, 16), (8, 16, 16),
                                                    (16, 16, 8), (16, 8, 16), (4, 16, 16), (16, 16, 16)))
case("advise: the policy cannot be written", nothing, ["advise", "--shapes", SHAPES16, "--budget", "0.001", "--out", "p.json"], 5,
     "error writing the output", limits=[(resource.RLIMIT_FSIZE, 2048)])
case("a header padded with NUL bytes", lambda d: safetensors(os.path.join(d, "m.safetensors"), [("ab", "F32", [1], f32(1))], pad=b"\0"),
     ["inspect", "m.safetensors"], 3, "header holds a NUL byte at offset")
# Exit 1: memory running out past every size check (an address-space limit) is reported, not a crash.
with open(FP8KIT, "rb") as binary:
    sanitized = b"__asan_init" in binary.read()
if not sanitized:  # ASan reserves terabytes of address space and aborts on a failed allocation by design
    case("memory exhausted: exit 1 saying so", nothing, ["advise", "--shapes", "1x2147483648x1", "--budget", "0.001", "--out", "p.json"], 1,
         "out of memory", limits=[(resource.RLIMIT_AS, 2 << 30)])

# ---- property: every numeric flag of every command, random strings ----

INT_RE = re.compile(r"-?[0-9]+\Z")
REAL_RE = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\Z")
FLAGS = [  # (command, flag, kind, lo, hi, decoy args stopping a valid run before work, what the decoy prints)
    (["advise", "--model", "missing.safetensors", "--out", "p.json"], "--tokens", int, 1, 2**31, "missing.safetensors"),
    (["advise", "--model", "missing.safetensors", "--out", "p.json"], "--budget", float, 1e-6, 3600, "missing.safetensors"),
    (["advise", "--model", "missing.safetensors", "--out", "p.json"], "--min-speedup", float, 0, 1e12, "missing.safetensors"),
    (["verify", "missing.safetensors", "missing.safetensors"], "--min-sqnr", float, -1000, 1000, "missing.safetensors"),
    (["train", "--recipe", "nope", "--out", "o"], "--steps", int, 1, 10**7, "unknown recipe 'nope'"),
    (["train", "--recipe", "nope", "--out", "o"], "--layers", int, 1, 1024, "unknown recipe 'nope'"),
    (["train", "--recipe", "nope", "--out", "o"], "--width", int, 1, 65536, "unknown recipe 'nope'"),
    (["train", "--recipe", "nope", "--out", "o"], "--batch", int, 1, 10**6, "unknown recipe 'nope'"),
    (["train", "--recipe", "nope", "--out", "o"], "--threads", int, 1, 1024, "unknown recipe 'nope'"),
    (["train", "--recipe", "nope", "--out", "o"], "--seed", int, 0, 2**63 - 1, "unknown recipe 'nope'"),
    (["generate", "--model", "missing.safetensors"], "--tokens", int, 1, 10**6, "missing.safetensors"),
    (["generate", "--model", "missing.safetensors"], "--seed", int, 0, 2**63 - 1, "missing.safetensors"),
    (["bench", "generate", "--model", "missing.safetensors"], "--tokens", int, 1, 10**6, "missing.safetensors"),
    (["bench", "generate", "--model", "missing.safetensors"], "--rounds", int, 1, 1000, "missing.safetensors"),
]


def reference(text, kind, lo, hi):
    """True / False: whether a strict parser takes text for the flag; None: not judged (underflow)."""
    if kind is int:
        return bool(INT_RE.match(text)) and lo <= int(text) <= hi
    if not REAL_RE.match(text):
        return False
    v = float(text)
    if v == 0 and re.search(r"[1-9]", text.split("e")[0].split("E")[0]):
        return None  # underflows to 0: C++ reports it out of range, Python rounds; not a case of interest
    return math.isfinite(v) and lo <= v <= hi


def random_text(rng, kind, lo, hi):
    pick = rng.randrange(12)
    if pick == 0:
        return rng.choice(["", " ", "nan", "NaN", "inf", "-inf", "Infinity", "+1", "0x1f", "1_000", "١٢", "1e", "-", ".", "1.2.3",
                           "\t5", "5\n", "\x1b[2J", "9" * 40, "-" + "9" * 40, "1e400", "0.", ".5e1", "2 3", "4,5"])
    if pick == 1:
        return "".join(rng.choice("0123456789-+.eExX ,_abc\t\u00e9\u009b") for _ in range(rng.randrange(1, 12)))
    if pick in (2, 3):
        return str(rng.randint(int(lo) - 3, min(int(hi), 10**9) + 3))
    if pick == 4:
        return str(rng.choice([int(hi), int(hi) + 1, int(lo), int(lo) - 1, 2**63 - 1, 2**63, -2**63, -2**63 - 1]))
    if pick == 5:
        return repr(rng.uniform(lo, min(hi, 1e6)))
    if pick == 6:
        return "%de%d" % (rng.randint(-9, 9), rng.randint(-30, 30))
    if pick == 7:
        return str(rng.randint(0, 100)) + rng.choice(["x", "k", "%", " ", ".0", "e2", "s"])
    if pick == 8:
        return "%.17g" % rng.uniform(-1e4, 1e4)
    if pick == 9:
        return rng.choice(["-0", "0", "00001", "-00", "1.", "-.5", "1E3", "1e+3"])
    if pick == 10:
        return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(1, 6)))
    return str(rng.randint(-10**20, 10**20))


rng = random.Random(SEED)
prop_dir = tempfile.mkdtemp(dir=WORK)
prop_cases = 0
for cmd, flag, kind, lo, hi, decoy in FLAGS:
    for _ in range(40):
        text = random_text(rng, kind, lo, hi)
        verdict = reference(text, kind, lo, hi)
        if verdict is None:
            continue
        args = cmd + ([flag + "=" + text] if text.startswith("-") else [flag, text])
        rc, out, err = run(args, prop_dir)
        prop_cases += 1
        shown = err.decode("utf-8", "replace")
        if verdict:
            ok = rc in (2, 3) and decoy in shown and (flag + " '") not in shown
        else:
            ok = rc == 2 and shown.startswith("fp8kit: error: " + flag + " '") and "expected" in shown
        if not ok or raw_controls(out) or raw_controls(err):
            failures.append("property: %s %r should be %s: exit %s, %r" % (flag, text, "taken" if verdict else "refused", rc, shown[:300]))
if os.listdir(prop_dir):
    failures.append("property: the runs left %s behind" % os.listdir(prop_dir))

shutil.rmtree(WORK, ignore_errors=True)
for f in failures:
    print("FAILED " + f)
print("%d cases passed, %d random flag values judged, %d failed (seed %d)" % (passed, prop_cases, len(failures), SEED))
sys.exit(1 if failures else 0)
