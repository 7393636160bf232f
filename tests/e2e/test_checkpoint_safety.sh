#!/bin/sh
# tests/e2e/test_checkpoint_safety.sh FP8KIT PYTHON SRCDIR: what the checkpoint commands promise
# about their inputs and outputs, as a user meets it (issue 18):
#  - OUT is never IN, compared as files: the same path spelled ./x, ../dir/x, a symbolic or a hard
#    link, for quantize and dequantize, files and directories, even with --force; a directory
#    OUT never holds IN;
#  - OUT is checked before any work (a missing folder, an existing OUT without --force, a file
#    where a directory goes), exit 2; --force replaces an existing OUT of the same kind;
#  - SIGINT and SIGTERM during a run leave no OUT and no temporary (file and directory outputs);
#    SIGKILL leaves a temporary that the next run names and removes;
#  - NaN / Inf weights: quantize refuses them naming every tensor and its index (exit 3), or with
#    --keep-nonfinite keeps them in high precision and says so; verify fails (exit 4) listing
#    every failing tensor;
#  - metadata matches the data: FP8 input refused, nothing quantized -> no quantization_config,
#    kept tensors listed by module name, MoE routers kept;
#  - --json output parses, exit codes are in --help, no progress bar when stderr is not a
#    terminal, unknown subcommands are named.
# Exit 77 (skipped) without numpy / safetensors in PYTHON.
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
if ! "$python" -c "import numpy, safetensors" 2>/dev/null; then
    echo "skipped: $python lacks numpy / safetensors (scripts/setup.sh installs them)"
    exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$out" || exit 1
mkdir sub
"$python" "$src/tests/e2e/make_model.py" m.safetensors || exit 1
"$python" "$src/tests/e2e/make_model.py" md --shards 3 || exit 1
sha256sum m.safetensors md/* >in.sum
no_temps='[ -z "$(ls -a . sub | grep "\.tmp-")" ]'

# ---- OUT is never IN ----
ln -s m.safetensors link.safetensors
ln m.safetensors hard.safetensors
for o in ./m.safetensors ../"$(basename "$out")"/m.safetensors link.safetensors hard.safetensors; do
    "$fp8kit" quantize m.safetensors "$o" --scheme tensor --force >/dev/null 2>e; rc=$?
    check "quantize m.safetensors $o --force: refused as the same file (exit 2)" "[ $rc -eq 2 ] && grep -q 'same file as the input' e"
    "$fp8kit" dequantize "$o" m.safetensors --force >/dev/null 2>e; rc=$?
    check "dequantize $o m.safetensors --force: refused (exit 2)" "[ $rc -eq 2 ] && grep -q 'same file as the input' e"
done
(cd sub && "$fp8kit" quantize ../m.safetensors ../link.safetensors --force >/dev/null 2>../e); rc=$?
check "from another folder, ../link.safetensors: refused" "[ $rc -eq 2 ] && grep -q 'same file' e"
"$fp8kit" quantize md ./md/../md --force >/dev/null 2>e; rc=$?
check "a directory onto itself (md/../md), --force: refused" "[ $rc -eq 2 ] && grep -q 'same file as the input' e"
"$fp8kit" quantize md . --force >/dev/null 2>e; rc=$?
check "a directory output holding the input (.), --force: refused" "[ $rc -eq 2 ] && grep -q 'holds the input' e"
check "IN unchanged after all of that" "sha256sum m.safetensors md/* | cmp -s - in.sum"

# ---- OUT checked before any work; one rule for existing outputs ----
"$fp8kit" quantize md nodir/qd >/dev/null 2>e; rc=$?
check "a missing output folder: exit 2 naming it, nothing written" "[ $rc -eq 2 ] && grep -q \"folder '.*nodir' does not exist\" e && [ ! -e nodir ] && $no_temps"
"$fp8kit" quantize m.safetensors q.safetensors --scheme tensor >/dev/null 2>&1
cp q.safetensors q.before
"$fp8kit" quantize m.safetensors q.safetensors --scheme channel >/dev/null 2>e; rc=$?
check "an existing OUT file without --force: exit 2, untouched" "[ $rc -eq 2 ] && grep -q 'exists already (--force replaces it)' e && cmp -s q.safetensors q.before"
"$fp8kit" quantize m.safetensors q.safetensors --scheme channel --force >/dev/null 2>&1; rc=$?
check "--force replaces the file (now channel)" "[ $rc -eq 0 ] && '$fp8kit' inspect q.safetensors | grep -q '^detected quantization: channel$'"
"$fp8kit" quantize md qd --scheme tensor >/dev/null 2>&1
"$fp8kit" quantize md qd --scheme channel >/dev/null 2>e; rc=$?
check "an existing OUT directory without --force: exit 2, the same message" "[ $rc -eq 2 ] && grep -q 'exists already (--force replaces it)' e"
"$fp8kit" quantize md qd --scheme channel --force >/dev/null 2>&1; rc=$?
check "--force replaces the directory, nothing else left" "[ $rc -eq 0 ] && '$fp8kit' inspect qd | grep -q '^detected quantization: channel$' && $no_temps"
"$fp8kit" quantize md q.safetensors --force >/dev/null 2>e; rc=$?
check "--force does not replace a file by a directory" "[ $rc -eq 2 ] && grep -q 'replaces only the same kind' e"

# ---- interrupts ----
"$python" "$src/tests/e2e/make_big_model.py" big 6 || exit 1
for sig in INT TERM; do
    st=$("$python" "$src/tests/e2e/interrupt.py" $sig 'qbig.tmp-*/model-00001-of-00006.safetensors' -- "$fp8kit" quantize big qbig --scheme channel --layout fp8kit); rc=$?
    check "SIG$sig while writing a directory: the run ends by the signal, no OUT, no temporary" "[ $rc -eq 0 ] && [ '$st' -lt 0 ] && [ ! -e qbig ] && [ -z \"\$(ls | grep tmp-)\" ]"
done
"$python" "$src/tests/e2e/make_big_model.py" bigf.safetensors 6 || exit 1
"$fp8kit" quantize bigf.safetensors bigq.safetensors --scheme channel --layout fp8kit >/dev/null 2>&1
for sig in INT TERM; do
    st=$("$python" "$src/tests/e2e/interrupt.py" $sig 'bigd.safetensors.tmp-*' -- "$fp8kit" dequantize bigq.safetensors bigd.safetensors --dtype f32); rc=$?
    check "SIG$sig while writing a file: no OUT, no temporary" "[ $rc -eq 0 ] && [ '$st' -lt 0 ] && [ ! -e bigd.safetensors ] && [ -z \"\$(ls | grep tmp-)\" ]"
done
st=$("$python" "$src/tests/e2e/interrupt.py" KILL 'qbig.tmp-*/model-00001-of-00006.safetensors' -- "$fp8kit" quantize big qbig --scheme channel --layout fp8kit); rc=$?
check "SIGKILL leaves a temporary (no OUT)" "[ $rc -eq 0 ] && [ ! -e qbig ] && ls -d qbig.tmp-* >/dev/null 2>&1"
"$fp8kit" quantize big qbig --scheme channel --layout fp8kit >/dev/null 2>e; rc=$?
check "the next run names the temporary, removes it and succeeds" "[ $rc -eq 0 ] && grep -q 'removed .*qbig.tmp-[0-9]*-[0-9]*, a temporary left by an earlier run that was killed' e && [ -z \"\$(ls | grep tmp-)\" ] && [ -d qbig ]"
rm -rf big qbig bigf.safetensors bigq.safetensors

# ---- non-finite weights ----
"$python" - <<'PY' || exit 1
import numpy as np
from safetensors.numpy import save_file
from safetensors import safe_open
t = {}
with safe_open("m.safetensors", "np") as f:
    for k in f.keys():
        t[k] = f.get_tensor(k)
a = t["model.layers.0.mlp.up_proj.weight"].copy(); a[3, 5] = np.inf; a[7, 1] = -np.inf
b = t["model.layers.1.self_attn.q_proj.weight"].copy(); b[0, 2] = np.nan
t["model.layers.0.mlp.up_proj.weight"], t["model.layers.1.self_attn.q_proj.weight"] = a, b
t["model.layers.0.mlp.gate.weight"] = np.ones((4, 96), np.float32)  # an MoE router
save_file(t, "nf.safetensors", metadata={"format": "pt"})
PY
"$fp8kit" quantize nf.safetensors nfq.safetensors --scheme tensor >/dev/null 2>e; rc=$?
check "NaN / Inf weights: exit 3, every tensor named with its index, no OUT" "[ $rc -eq 3 ] && grep -q \"'model.layers.0.mlp.up_proj.weight' has +Inf at \[3, 5\] (2 non-finite values)\" e && grep -q \"'model.layers.1.self_attn.q_proj.weight' has NaN at \[0, 2\]\" e && [ ! -e nfq.safetensors ]"
"$fp8kit" quantize nf.safetensors nfq.safetensors --scheme tensor --keep-nonfinite >/dev/null 2>e; rc=$?
check "--keep-nonfinite: kept in high precision, said" "[ $rc -eq 0 ] && grep -q 'kept in high precision (--keep-nonfinite).*up_proj' e && '$fp8kit' inspect nfq.safetensors | grep -Eq '^model.layers.0.mlp.up_proj.weight +F32 '"
check "kept tensors listed by module name in ignore; the MoE router kept" "'$python' -c \"
import json; from safetensors import safe_open
q = json.loads(safe_open('nfq.safetensors', 'np').metadata()['quantization_config'])
assert q['quant_method'] == 'compressed-tensors', q
ig = q['ignore']
for m in ('lm_head', 'model.embed_tokens', 'model.layers.0.mlp.up_proj', 'model.layers.1.self_attn.q_proj', 'model.layers.0.mlp.gate'):
    assert m in ig, (m, ig)
assert not any(x.endswith('.weight') for x in ig), ig
\""
"$fp8kit" verify m.safetensors nf.safetensors >/dev/null 2>e; rc=$?
check "verify: NaN / Inf in B fail (exit 4), every failing tensor listed" "[ $rc -eq 4 ] && grep -q '2 tensor(s) failed' e && grep -q 'up_proj.weight: +Inf at \[3, 5\] in B' e && grep -q 'q_proj.weight: NaN at \[0, 2\] in B' e"
"$fp8kit" verify m.safetensors nf.safetensors --json >v.json 2>/dev/null; rc=$?
check "verify --json: parses, two failures, exit 4" "[ $rc -eq 4 ] && '$python' -c \"import json; v = json.load(open('v.json')); assert v['failed'] == 2 and not v['ok'], v\""

# ---- metadata matches the data ----
"$fp8kit" quantize q.safetensors qq.safetensors --scheme block128 >/dev/null 2>e; rc=$?
check "FP8 input: refused, exit 3, not relabelled" "[ $rc -eq 3 ] && grep -q 'holds FP8 weights already' e && [ ! -e qq.safetensors ]"
"$fp8kit" quantize m.safetensors none.safetensors --skip '.*' >/dev/null 2>e; rc=$?
check "--skip '.*' quantizes nothing: no quantization_config, said" "[ $rc -eq 0 ] && grep -q 'no weight to quantize' e && '$python' -c \"
from safetensors import safe_open
assert 'quantization_config' not in safe_open('none.safetensors', 'np').metadata()\""
"$fp8kit" quantize m.safetensors x.safetensors --format e5m2 --layout compressed-tensors >/dev/null 2>e; rc=$?
check "e5m2 in a layout that stores e4m3fn only: exit 2" "[ $rc -eq 2 ] && grep -q 'e4m3fn only' e && [ ! -e x.safetensors ]"

# ---- automation ----
"$fp8kit" quantize m.safetensors j.safetensors --scheme channel --json >j.out 2>j.err; rc=$?
check "quantize --json: one JSON object; stderr has no progress bar (not a terminal)" "[ $rc -eq 0 ] && '$python' -c \"
import json; j = json.load(open('j.out')); assert j['quantization_config']['quant_method'] == 'compressed-tensors' and len(j['quantized']) == 8, j\" && ! grep -q '\[#' j.err"
"$fp8kit" inspect j.safetensors --json >i.json; rc=$?
check "inspect --json: parses, detects channel" "[ $rc -eq 0 ] && '$python' -c \"import json; j = json.load(open('i.json')); assert j['detected'] == ['channel'], j\""
"$fp8kit" advise --shapes 4x128x128 --min-speedup 0 --budget 0.01 --out pol.json --json >a.json 2>/dev/null; rc=$?
check "advise --json: one JSON object with the layer's decision" "[ $rc -eq 0 ] && '$python' -c \"
import json; j = json.load(open('a.json')); assert j['policy'] == 'pol.json' and len(j['layers']) == 1 and j['layers'][0]['fp8'] is True, j\""
"$fp8kit" advise --shapes 4x128x128 --min-speedup 0 --budget 0.01 --out pol.json >/dev/null 2>e; rc=$?
check "advise: an existing --out without --force: exit 2" "[ $rc -eq 2 ] && grep -q 'exists already' e"
"$fp8kit" quantize --help >h 2>&1
check "quantize --help lists the exit codes and examples" "grep -q '3 bad input' h && grep -q '4 a check failed' h && grep -q 'Examples' h"
"$fp8kit" quantise m.safetensors x >/dev/null 2>e; rc=$?
check "an unknown subcommand is named as one (exit 2)" "[ $rc -eq 2 ] && grep -q \"unknown subcommand 'quantise'\" e"
head -c 100 m.safetensors >t.safetensors
"$fp8kit" inspect t.safetensors >/dev/null 2>e; rc=$?
check "a malformed input file: exit 3 naming it" "[ $rc -eq 3 ] && grep -q 't.safetensors' e"
check "IN unchanged at the end" "sha256sum m.safetensors md/* | cmp -s - in.sum"

echo "$(( n - fails )) passed, $fails failed"
[ $fails -eq 0 ]
