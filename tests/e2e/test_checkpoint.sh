#!/bin/sh
# tests/e2e/test_checkpoint.sh FP8KIT PYTHON SRCDIR: the checkpoint commands as a user meets them,
# on a model written by the safetensors Python package (tests/e2e/make_model.py): for every scheme,
# quantize -> PyTorch checks the community layout and the SQNR of its own float64 dequantization
# (tests/e2e/check_checkpoint.py, >= 25 dB) -> dequantize -> verify --min-sqnr 25; a directory of
# shards with its index, config.json and other files; IN never modified; failed runs exit 2 with
# one line and leave no OUT (nor temporaries); advise writes a policy (its decisions pinned by
# --min-speedup 0 / 1e9, never by timings) that quantize --policy applies, checked tensor by tensor.
# Exit 77 (skipped) only when numpy or safetensors is not installed (tests/oracle_skip.py's rule: a
# broken install fails); without torch only the two PyTorch checks are skipped, each said so.
set -u
fp8kit=$1
python=$2
src=$3
fails=0
n=0
check() {  # check DESCRIPTION COMMAND... : the command must succeed
    n=$((n + 1))
    if ! sh -c "$2"; then echo "FAIL: $1"; fails=$((fails + 1)); else echo "ok: $1"; fi
}
needs() {  # needs MODULE...: exit status 0 if installed, 77 if not, anything else if broken
    PYTHONPATH="$src/tests" "$python" -c "import sys; from oracle_skip import require; require(*sys.argv[1:])" "$@"
}
needs numpy safetensors; rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -ne 0 ] && { echo "FAIL: the Python oracles do not import"; exit 1; }
needs torch 2>/dev/null; have_torch=$?
[ $have_torch -ne 0 ] && [ $have_torch -ne 77 ] && { needs torch; echo "FAIL: torch is installed but does not import"; exit 1; }
torch_check() {  # torch_check DESCRIPTION COMMAND... : check, or say it is skipped without torch
    if [ $have_torch -eq 0 ]; then check "$@"; else echo "skipped (torch is not installed): $1"; fi
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$out" || exit 1

"$python" "$src/tests/e2e/make_model.py" m.safetensors || exit 1
"$python" "$src/tests/e2e/make_model.py" md --shards 3 || exit 1
sha256sum m.safetensors md/* >in.sum
sha256sum m.safetensors >m.sum

# tensor and channel in the default layout (compressed-tensors), block128 and mx32 in fp8kit's
# (the model's dims are not whole 128x128 blocks, which the hf-fp8 layout needs).
for scheme in tensor channel block128 mx32; do
    layout=auto
    case $scheme in block128 | mx32) layout=fp8kit ;; esac
    "$fp8kit" quantize m.safetensors "q_$scheme.safetensors" --scheme "$scheme" --layout $layout >"q_$scheme.out" 2>"q_$scheme.err"; rc=$?
    check "quantize --scheme $scheme exits 0 and prints the table" "[ $rc -eq 0 ] && grep -q 'SQNR dB' q_$scheme.out && grep -Eq '^model.layers.0.mlp.up_proj.weight +$scheme ' q_$scheme.out"
    torch_check "$scheme: torch reads the layout and dequantizes to >= 25 dB" "'$python' '$src/tests/e2e/check_checkpoint.py' m.safetensors q_$scheme.safetensors $scheme"
    "$fp8kit" inspect "q_$scheme.safetensors" >"i_$scheme.out" 2>&1; rc=$?
    check "inspect detects $scheme" "[ $rc -eq 0 ] && grep -q '^detected quantization: $scheme\$' i_$scheme.out"
    "$fp8kit" dequantize "q_$scheme.safetensors" "d_$scheme.safetensors" --dtype f32 >/dev/null 2>&1; rc=$?
    check "dequantize $scheme --dtype f32 exits 0" "[ $rc -eq 0 ]"
    "$fp8kit" verify m.safetensors "d_$scheme.safetensors" --min-sqnr 25 >"v_$scheme.out" 2>&1; rc=$?
    check "verify $scheme: every tensor >= 25 dB, kept ones exact" "[ $rc -eq 0 ] && grep -Eq '^lm_head.weight +inf +0\$' v_$scheme.out"
done
check "block128: weight_scale_inv [ceil(200/128), ceil(96/128)] = [2, 1]" "grep -Eq '^model.layers.0.mlp.up_proj.weight_scale_inv +F32 +\[2, 1\]' i_block128.out"
check "verify also reads the FP8 file directly (dequantizing through its scales)" "'$fp8kit' verify m.safetensors q_block128.safetensors --min-sqnr 25 >/dev/null"
"$fp8kit" verify m.safetensors q_tensor.safetensors --min-sqnr 45 >/dev/null 2>v.err; rc=$?
check "verify --min-sqnr above the SQNR: exit 4 naming the tensor" "[ $rc -eq 4 ] && grep -q 'weight: SQNR .* below --min-sqnr 45' v.err"

# A directory of shards: same shard names, index with the scales, config.json, other files copied.
"$fp8kit" quantize md qd --scheme block128 --layout fp8kit >qd.out 2>&1; rc=$?
check "quantize a shard directory exits 0" "[ $rc -eq 0 ]"
check "shards, index, config.json and tokenizer.json written" "[ -f qd/model-00003-of-00003.safetensors ] && [ -f qd/model.safetensors.index.json ] && cmp -s md/tokenizer.json qd/tokenizer.json"
check "index maps the scales to their weight's shard" "'$python' -c \"import json; m=json.load(open('qd/model.safetensors.index.json'))['weight_map']; assert m['model.layers.0.mlp.up_proj.weight_scale_inv'] == m['model.layers.0.mlp.up_proj.weight']\""
check "config.json keeps its fields and gains quantization_config" "'$python' -c \"import json; c=json.load(open('qd/config.json')); q=c['quantization_config']; assert c['model_type']=='llama' and q['quant_method']=='fp8kit' and q['weight_block_size']==[128,128] and q['fmt']=='e4m3'\""
torch_check "directory: torch checks the layout and SQNR" "'$python' '$src/tests/e2e/check_checkpoint.py' md qd block128"
"$fp8kit" dequantize qd dd --dtype bf16 >/dev/null 2>&1 && "$fp8kit" verify md dd --min-sqnr 25 >/dev/null 2>&1; rc=$?
check "directory: dequantize --dtype bf16 and verify >= 25 dB" "[ $rc -eq 0 ] && ! grep -q quantization_config dd/config.json"

# Failures: exit 2, one line, no OUT, no temporaries; IN untouched throughout.
"$fp8kit" quantize m.safetensors bad.safetensors --scheme block64 >/dev/null 2>e; rc=$?
check "unknown --scheme: exit 2, one line naming it, no OUT" "[ $rc -eq 2 ] && [ \$(wc -l <e) -eq 1 ] && grep -q block64 e && [ ! -e bad.safetensors ]"
head -c 300 m.safetensors >trunc.safetensors
"$fp8kit" quantize trunc.safetensors bad.safetensors >/dev/null 2>e; rc=$?
check "truncated input: exit 3 naming the file, no OUT" "[ $rc -eq 3 ] && grep -q 'trunc.safetensors' e && [ ! -e bad.safetensors ]"
cp -r md mbad && head -c 100 md/model-00003-of-00003.safetensors >mbad/model-00003-of-00003.safetensors
"$fp8kit" quantize mbad qbad >/dev/null 2>e; rc=$?
check "a bad shard: exit 3, no OUT directory and no temporary left" "[ $rc -eq 3 ] && [ ! -e qbad ] && [ -z \"\$(ls -a | grep '^qbad.tmp-')\" ]"
# A bad config.json: found when IN is opened, before any work.
cp -r md mcfg && printf '{bad' >mcfg/config.json
"$fp8kit" quantize mcfg qcfg >/dev/null 2>e; rc=$?
check "a bad config.json: exit 3 naming it, no OUT, no temporary" "[ $rc -eq 3 ] && grep -q 'config.json' e && [ ! -e qcfg ] && [ -z \"\$(ls -a | grep '^qcfg.tmp-')\" ]"
"$fp8kit" quantize md qd >/dev/null 2>e; rc=$?
check "an existing OUT directory is refused" "[ $rc -eq 2 ] && grep -q 'exists already' e"
"$fp8kit" quantize m.safetensors m.safetensors >/dev/null 2>e; rc=$?
check "OUT = IN is refused" "[ $rc -eq 2 ]"
"$fp8kit" quantize m.safetensors bad.safetensors --skip '(' >/dev/null 2>e; rc=$?
check "a bad --skip regex: exit 2" "[ $rc -eq 2 ] && grep -q 'not a regular expression' e && [ ! -e bad.safetensors ]"
"$fp8kit" quantize m.safetensors s.safetensors --scheme tensor --skip 'up_proj' >/dev/null 2>&1
check "--skip keeps matching weights in high precision" "'$fp8kit' inspect s.safetensors | grep -Eq '^model.layers.0.mlp.up_proj.weight +F32 '"
# advise -> policy -> quantize --policy. The FP8/f32 decision is made deterministic by the speed bar
# (--min-speedup 0: every layer passes it, 1e9: none does); the SQNR part is real (>= 25 dB).
"$fp8kit" advise --shapes 4x200x96,3x96x200 --min-speedup 0 --budget 0.01 --out pshape.json >adv.out 2>&1; rc=$?
check "advise --shapes exits 0 and prints one row per shape" "[ $rc -eq 0 ] && grep -Eq '^4x200x96 .* yes\$' adv.out && grep -Eq '^3x96x200 .* yes\$' adv.out"
check "advise --shapes policy: two shape layers, fp8 with recipe block, sqnr >= 25 dB in the reason" "'$python' -c \"
import json, re
p = json.load(open('pshape.json'))
assert p['format'] == 'fp8kit-policy' and p['version'] == 1, p
l = p['layers']
assert [x['weight_shape'] for x in l] == [[200, 96], [96, 200]], l
for x in l:
    assert x['fp8'] is True and x['recipe'] == 'block' and 'name' not in x, x
    assert float(re.search(r'sqnr ([0-9.]+) dB', x['reason']).group(1)) >= 25, x
\""
"$fp8kit" quantize m.safetensors pq.safetensors --scheme tensor --layout fp8kit --policy pshape.json >/dev/null 2>&1; rc=$?
"$fp8kit" inspect pq.safetensors >pq.out 2>&1
check "quantize --policy (shapes): [200,96] and [96,200] block128, [96,96] the --scheme default" "[ $rc -eq 0 ] &&
    grep -Eq '^model.layers.1.mlp.up_proj.weight_scale_inv +F32 +\[2, 1\]' pq.out &&
    grep -Eq '^model.layers.1.mlp.down_proj.weight_scale_inv +F32 +\[1, 2\]' pq.out &&
    grep -Eq '^model.layers.0.self_attn.q_proj.weight_scale +F32 +\[1\]' pq.out && grep -Eq '^lm_head.weight +F32 ' pq.out"
# weight_only: the weight per row, x not quantized. Its SQNR tells the two apart on these fixed
# N(0,1) samples: the weight's e4m3 rounding alone gives 31.0-31.3 dB, and casting x too adds an
# error of the same size (-3 dB: 28.1-28.3, what rowwise measures), so 30 dB sits between them.
"$fp8kit" advise --shapes 4x200x96,3x96x200 --recipe weight_only --min-speedup 0 --budget 0.01 --out pwo.json >/dev/null 2>&1; rc=$?
check "advise --recipe weight_only: recipe weight_only, sqnr >= 30 dB (x not quantized)" "[ $rc -eq 0 ] && '$python' -c \"
import json, re
l = json.load(open('pwo.json'))['layers']
assert len(l) == 2, l
for x in l:
    assert x['fp8'] is True and x['recipe'] == 'weight_only', x
    assert float(re.search(r'sqnr ([0-9.]+) dB', x['reason']).group(1)) >= 30, x
\""
"$fp8kit" quantize m.safetensors pw.safetensors --scheme tensor --policy pwo.json >/dev/null 2>&1; rc=$?
"$fp8kit" inspect pw.safetensors >pw.out 2>&1
check "quantize --policy weight_only: those weights per row (channel), the rest the --scheme default" "[ $rc -eq 0 ] &&
    grep -Eq '^model.layers.0.mlp.up_proj.weight_scale +F32 +\[200, 1\]' pw.out &&
    grep -Eq '^model.layers.0.mlp.down_proj.weight_scale +F32 +\[96, 1\]' pw.out &&
    grep -Eq '^model.layers.0.self_attn.q_proj.weight_scale +F32 +\[1\]' pw.out"
"$fp8kit" advise --model m.safetensors --tokens 5 --recipe mxfp8 --min-speedup 0 --budget 0.01 --out pmodel.json >/dev/null 2>&1; rc=$?
check "advise --model: one named layer per weight quantize converts (not embed, norm, lm_head), fp8 mxfp8" "[ $rc -eq 0 ] && '$python' -c \"
import json
l = json.load(open('pmodel.json'))['layers']
names = sorted(x['name'] for x in l)
want = sorted(f'model.layers.{i}.{w}.weight' for i in range(2) for w in ('self_attn.q_proj', 'self_attn.o_proj', 'mlp.up_proj', 'mlp.down_proj'))
assert names == want, names
assert all(x['fp8'] is True and x['recipe'] == 'mxfp8' for x in l), l
\""
"$fp8kit" quantize m.safetensors pm.safetensors --scheme tensor --policy pmodel.json --layout fp8kit >/dev/null 2>&1; rc=$?
check "quantize --policy (names): every layer mx32 with e8m0 scales" "[ $rc -eq 0 ] &&
    '$fp8kit' inspect pm.safetensors | grep -Eq '^model.layers.0.self_attn.o_proj.weight_scale +F8_E8M0 +\[96, 3\]'"
torch_check "quantize --policy (names): torch checks the mx32 layout" "'$python' '$src/tests/e2e/check_checkpoint.py' m.safetensors pm.safetensors mx32"
"$fp8kit" advise --model md --tokens 2 --min-speedup 1e9 --budget 0.01 --input-dtype bf16 --out pnone.json >/dev/null 2>&1; rc=$?
check "advise --model (a shard directory) with an unreachable speed bar: every layer fp8 false, recipe null" "[ $rc -eq 0 ] && '$python' -c \"
import json
l = json.load(open('pnone.json'))['layers']
assert len(l) == 8 and all(x['fp8'] is False and x['recipe'] is None and x['reason'].startswith('not faster') for x in l), l
\""
"$fp8kit" quantize md pnd --policy pnone.json >/dev/null 2>&1; rc=$?
check "quantize --policy all-no: no FP8 tensor written" "[ $rc -eq 0 ] && '$fp8kit' inspect pnd | grep -q '^detected quantization: none'"
# A hand-written policy: a module prefix, a name saying no ahead of a shape entry saying yes.
printf '%s\n' '{"format": "fp8kit-policy", "version": 1, "layers": [' \
    '  {"name": "model.layers.0.mlp", "fp8": true, "recipe": "rowwise"},' \
    '  {"name": "model.layers.1.mlp.up_proj.weight", "fp8": false},' \
    '  {"weight_shape": [200, 96], "fp8": true, "recipe": "tensorwise"}]}' >ph.json
"$fp8kit" quantize m.safetensors ph.safetensors --scheme block128 --layout fp8kit --policy ph.json >/dev/null 2>&1; rc=$?
"$fp8kit" inspect ph.safetensors >ph.out 2>&1
check "hand-written policy: prefix -> channel, named no -> kept, the rest block128" "[ $rc -eq 0 ] &&
    grep -Eq '^model.layers.0.mlp.up_proj.weight_scale +F32 +\[200, 1\]' ph.out &&
    grep -Eq '^model.layers.0.mlp.down_proj.weight_scale +F32 +\[96, 1\]' ph.out &&
    grep -Eq '^model.layers.1.mlp.up_proj.weight +F32 ' ph.out && ! grep -q 'layers.1.mlp.up_proj.weight_scale' ph.out &&
    grep -Eq '^model.layers.1.self_attn.q_proj.weight_scale_inv +F32 +\[1, 1\]' ph.out"
printf '{"format": "fp8kit-policy", "version": 1, "layers": [{"name": "x", "fp8": true}]}' >pbad.json
"$fp8kit" quantize m.safetensors pb.safetensors --policy pbad.json >/dev/null 2>e; rc=$?
check "a policy layer fp8 without a recipe: exit 3 (a malformed input file) naming the file, no OUT" "[ $rc -eq 3 ] && grep -q 'pbad.json' e && grep -q 'names no recipe' e && [ ! -e pb.safetensors ]"
"$fp8kit" advise --shapes 4x200 --out pa.json >/dev/null 2>e; rc=$?
check "advise --shapes not MxNxK: exit 2 naming it, no policy" "[ $rc -eq 2 ] && grep -q \"'4x200' is not MxNxK\" e && [ ! -e pa.json ]"
"$fp8kit" advise --shapes 4x8x8 --recipe foo --out pa.json >/dev/null 2>e; rc=$?
check "advise --recipe foo: exit 2 naming it and the recipes it takes, no policy" "[ $rc -eq 2 ] && grep -q -- \"--recipe: unknown recipe 'foo', expected tensorwise, rowwise, block, mxfp8 or weight_only\" e && [ ! -e pa.json ]"
"$fp8kit" advise --shapes 4x8x8 --model m.safetensors --out pa.json >/dev/null 2>e; rc=$?
check "advise with both --shapes and --model: exit 2" "[ $rc -eq 2 ] && grep -q 'exactly one of' e && [ ! -e pa.json ]"

# Each failure path of the commands (issue 17): one line naming what was wrong, the documented exit
# code (2 usage, 3 bad input, 4 failed check), and no output left.
"$fp8kit" quantize m.safetensors x.safetensors --format foo >/dev/null 2>e; rc=$?
check "quantize --format foo: exit 2 naming it, no OUT" "[ $rc -eq 2 ] && grep -q \"unknown FP8 format 'foo'\" e && [ ! -e x.safetensors ]"
"$fp8kit" dequantize m.safetensors x.safetensors --dtype i32 >/dev/null 2>e; rc=$?
check "dequantize --dtype i32: exit 2 naming it, no OUT" "[ $rc -eq 2 ] && grep -q -- '--dtype i32' e && [ ! -e x.safetensors ]"
ln -s m.safetensors alias.safetensors
"$fp8kit" dequantize m.safetensors ./alias.safetensors --dtype f32 >/dev/null 2>e; rc=$?
check "dequantize OUT == IN through a link: refused, IN intact" "[ $rc -ne 0 ] && grep -q 'same file as the input' e && sha256sum m.safetensors | cmp -s - m.sum"
"$python" - <<'PY' || exit 1
import numpy as np
from safetensors.numpy import load_file, save_file
t = load_file("m.safetensors")
save_file({k: v for k, v in t.items() if k != "lm_head.weight"}, "vmissing.safetensors")
save_file({**t, "lm_head.weight": np.zeros((3, 3), np.float32)}, "vshape.safetensors")
w = "model.layers.0.self_attn.q_proj.weight"
save_file({**t, w + "_scale": np.ones((1,), np.float32)}, "collide.safetensors")
PY
"$fp8kit" verify m.safetensors vmissing.safetensors >/dev/null 2>e; rc=$?
check "verify with a tensor missing from B: exit 4 naming it" "[ $rc -eq 4 ] && grep -q 'lm_head.weight: missing from vmissing.safetensors' e"
"$fp8kit" verify m.safetensors vshape.safetensors >/dev/null 2>e; rc=$?
check "verify with a shape mismatch: exit 4 naming both shapes" "[ $rc -eq 4 ] && grep -q 'lm_head.weight: shape \[64, 96\] in A, \[3, 3\] in B' e"
"$fp8kit" quantize collide.safetensors x.safetensors --scheme tensor >/dev/null 2>e; rc=$?
check "a weight whose scale name is taken: exit 3 naming both, no OUT" "[ $rc -eq 3 ] && grep -q 'q_proj.weight_scale. exists already' e && [ ! -e x.safetensors ]"
mkdir badidx && cp md/*.safetensors badidx/ && printf '{"weight_map": {"x": "nofile.safetensors"}}' >badidx/model.safetensors.index.json
"$fp8kit" quantize badidx x --scheme tensor >/dev/null 2>e; rc=$?
check "a shard index naming a missing shard: exit 3 naming it, no OUT" "[ $rc -eq 3 ] && grep -q 'nofile.safetensors' e && [ ! -e x ]"
check "IN files unchanged, byte for byte" "sha256sum m.safetensors md/* | cmp -s - in.sum"

echo "$(( n - fails )) passed, $fails failed"
[ $fails -eq 0 ]
