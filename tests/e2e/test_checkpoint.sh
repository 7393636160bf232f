#!/bin/sh
# tests/e2e/test_checkpoint.sh FP8KIT PYTHON SRCDIR: the checkpoint commands as a user meets them,
# on a model written by the safetensors Python package (tests/e2e/make_model.py): for every scheme,
# quantize -> PyTorch checks the community layout and the SQNR of its own float64 dequantization
# (tests/e2e/check_checkpoint.py, >= 25 dB) -> dequantize -> verify --min-sqnr 25; a directory of
# shards with its index, config.json and other files; IN never modified; failed runs exit 2 with
# one line and leave no OUT (nor temporaries). Exit 77 (skipped) without the Python oracles.
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
if ! "$python" -c "import numpy, safetensors, torch" 2>/dev/null; then
    echo "skipped: $python lacks numpy / safetensors / torch (scripts/setup.sh installs them)"
    exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$out" || exit 1

"$python" "$src/tests/e2e/make_model.py" m.safetensors || exit 1
"$python" "$src/tests/e2e/make_model.py" md --shards 3 || exit 1
sha256sum m.safetensors md/* >in.sum

for scheme in tensor channel block128 mx32; do
    "$fp8kit" quantize m.safetensors "q_$scheme.safetensors" --scheme "$scheme" >"q_$scheme.out" 2>"q_$scheme.err"; rc=$?
    check "quantize --scheme $scheme exits 0 and prints the table" "[ $rc -eq 0 ] && grep -q 'SQNR dB' q_$scheme.out && grep -Eq '^model.layers.0.mlp.up_proj.weight +$scheme ' q_$scheme.out"
    check "$scheme: torch reads the layout and dequantizes to >= 25 dB" "'$python' '$src/tests/e2e/check_checkpoint.py' m.safetensors q_$scheme.safetensors $scheme"
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
check "verify --min-sqnr above the SQNR: exit 2 naming the tensor" "[ $rc -eq 2 ] && grep -q 'below --min-sqnr' v.err"

# A directory of shards: same shard names, index with the scales, config.json, other files copied.
"$fp8kit" quantize md qd --scheme block128 >qd.out 2>&1; rc=$?
check "quantize a shard directory exits 0" "[ $rc -eq 0 ]"
check "shards, index, config.json and tokenizer.json written" "[ -f qd/model-00003-of-00003.safetensors ] && [ -f qd/model.safetensors.index.json ] && cmp -s md/tokenizer.json qd/tokenizer.json"
check "index maps the scales to their weight's shard" "'$python' -c \"import json; m=json.load(open('qd/model.safetensors.index.json'))['weight_map']; assert m['model.layers.0.mlp.up_proj.weight_scale_inv'] == m['model.layers.0.mlp.up_proj.weight']\""
check "config.json keeps its fields and gains quantization_config" "'$python' -c \"import json; c=json.load(open('qd/config.json')); q=c['quantization_config']; assert c['model_type']=='llama' and q['quant_method']=='fp8' and q['weight_block_size']==[128,128] and q['fmt']=='e4m3'\""
check "directory: torch checks the layout and SQNR" "'$python' '$src/tests/e2e/check_checkpoint.py' md qd block128"
"$fp8kit" dequantize qd dd --dtype bf16 >/dev/null 2>&1 && "$fp8kit" verify md dd --min-sqnr 25 >/dev/null 2>&1; rc=$?
check "directory: dequantize --dtype bf16 and verify >= 25 dB" "[ $rc -eq 0 ] && ! grep -q quantization_config dd/config.json"

# Failures: exit 2, one line, no OUT, no temporaries; IN untouched throughout.
"$fp8kit" quantize m.safetensors bad.safetensors --scheme block64 >/dev/null 2>e; rc=$?
check "unknown --scheme: exit 2, one line naming it, no OUT" "[ $rc -eq 2 ] && [ \$(wc -l <e) -eq 1 ] && grep -q block64 e && [ ! -e bad.safetensors ]"
head -c 300 m.safetensors >trunc.safetensors
"$fp8kit" quantize trunc.safetensors bad.safetensors >/dev/null 2>e; rc=$?
check "truncated input: exit 2 naming the file, no OUT" "[ $rc -eq 2 ] && grep -q 'trunc.safetensors' e && [ ! -e bad.safetensors ]"
cp -r md mbad && head -c 100 md/model-00003-of-00003.safetensors >mbad/model-00003-of-00003.safetensors
"$fp8kit" quantize mbad qbad >/dev/null 2>e; rc=$?
check "a bad shard: exit 2, no OUT directory and no temporary left" "[ $rc -eq 2 ] && [ ! -e qbad ] && [ -z \"\$(ls -a | grep '^\.qbad')\" ]"
# A failure after the shards were written (config.json is read last): still nothing left.
cp -r md mcfg && printf '{bad' >mcfg/config.json
"$fp8kit" quantize mcfg qcfg >/dev/null 2>e; rc=$?
check "a failure after writing the shards: exit 2, no OUT, no temporary" "[ $rc -eq 2 ] && grep -q 'config.json' e && [ ! -e qcfg ] && [ -z \"\$(ls -a | grep '^\.qcfg')\" ]"
"$fp8kit" quantize md qd >/dev/null 2>e; rc=$?
check "an existing OUT directory is refused" "[ $rc -eq 2 ] && grep -q 'exists already' e"
"$fp8kit" quantize m.safetensors m.safetensors >/dev/null 2>e; rc=$?
check "OUT = IN is refused" "[ $rc -eq 2 ]"
"$fp8kit" quantize m.safetensors bad.safetensors --skip '(' >/dev/null 2>e; rc=$?
check "a bad --skip regex: exit 2" "[ $rc -eq 2 ] && grep -q 'not a regular expression' e && [ ! -e bad.safetensors ]"
"$fp8kit" quantize m.safetensors s.safetensors --scheme tensor --skip 'up_proj' >/dev/null 2>&1
check "--skip keeps matching weights in high precision" "'$fp8kit' inspect s.safetensors | grep -Eq '^model.layers.0.mlp.up_proj.weight +F32 '"
check "IN files unchanged, byte for byte" "sha256sum m.safetensors md/* | cmp -s - in.sum"

echo "$(( n - fails )) passed, $fails failed"
[ $fails -eq 0 ]
