#!/bin/sh
# tests/e2e/test_cli.sh FP8KIT: the command line as a user meets it - help, version, the formats
# table (values from NUMERICS.md), bad input giving one line on stderr and exit code 2, and
# `bench quantize --quick --json` printing JSON lines.
set -u
fp8kit=$1
fails=0
check() {  # check DESCRIPTION COMMAND... : the command must succeed
    if ! sh -c "$2"; then echo "FAIL: $1"; fails=$((fails + 1)); else echo "ok: $1"; fi
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$fp8kit" --help >"$out/help" 2>&1; rc=$?
check "--help exits 0 and lists formats and bench" "[ $rc -eq 0 ] && grep -q formats '$out/help' && grep -q bench '$out/help'"
"$fp8kit" --version >"$out/version" 2>&1; rc=$?
check "--version prints the version" "[ $rc -eq 0 ] && grep -Eq '^fp8kit [0-9]+\.[0-9]+\.[0-9]+$' '$out/version'"

"$fp8kit" formats >"$out/formats" 2>&1; rc=$?
check "formats exits 0" "[ $rc -eq 0 ]"
check "e4m3fn row: bias 7, max 448, min subnormal 2^-9" "grep -E '^e4m3fn +4/3 +7 +448 ' '$out/formats' | grep -q '2^-9'"
check "e5m2 row: max 57344, Inf codes" "grep -E '^e5m2 +5/2 +15 +57344 ' '$out/formats' | grep -q '0x7c 0xfc'"
check "e4m3fnuz row: bias 8, max 240" "grep -Eq '^e4m3fnuz +4/3 +8 +240 ' '$out/formats'"
check "e5m2fnuz row: bias 16" "grep -Eq '^e5m2fnuz +5/2 +16 +57344 ' '$out/formats'"
check "e8m0fnu row: unsigned, max 2^127" "grep -E '^e8m0fnu +8/0 +127 +2\^127' '$out/formats' | grep -q unsigned"

"$fp8kit" formats --json >"$out/json" 2>&1; rc=$?
check "formats --json: one object per format" "[ $rc -eq 0 ] && [ \$(grep -c '^{\"format\":' '$out/json') -eq 5 ] && grep -q '\"bias\":7,\"max\":\"448\"' '$out/json'"

"$fp8kit" frobnicate >"$out/o" 2>"$out/e"; rc=$?
check "unknown subcommand: exit 2, one line on stderr" "[ $rc -eq 2 ] && [ \$(wc -l <'$out/e') -eq 1 ] && grep -q 'fp8kit: error' '$out/e'"
FP8KIT_ISA=avx9 "$fp8kit" formats >"$out/o" 2>"$out/e"; rc=$?
check "bad FP8KIT_ISA: exit 2 naming the value" "[ $rc -eq 2 ] && grep -q \"FP8KIT_ISA='avx9'\" '$out/e'"
"$fp8kit" bench >"$out/o" 2>"$out/e"; rc=$?
check "bench without a benchmark name: exit 2" "[ $rc -eq 2 ]"
# The one benchmark run here (~15 s on 2 idle cores, up to ~40 s on busy ones: 256 MiB inputs
# even with --quick); only its output format is checked, never its numbers.
"$fp8kit" bench quantize --quick --json >"$out/bq" 2>"$out/e"; rc=$?
check "bench quantize --quick --json: JSON lines of bench quantize" "[ $rc -eq 0 ] && grep -q '^{\"bench\":\"quantize\",' '$out/bq' && ! grep -qv '^{.*}$' '$out/bq'"

# fp8kit train on a one-layer model for a few steps (the output format and the files; the
# numerics are tests/nn's), then generate from the saved model.
"$fp8kit" train --steps 4 --layers 1 --width 32 --batch 2 --recipe f32,tensorwise --out "$out/train" >"$out/t" 2>"$out/e"; rc=$?
check "train: table with f32 and tensorwise, CSV, SVG and models written" "[ $rc -eq 0 ] && grep -Eq '^tensorwise +\|? *[0-9.]+' '$out/t' && [ \$(wc -l <'$out/train/losses.csv') -eq 5 ] && grep -q '<svg' '$out/train/losses.svg' && [ -s '$out/train/model_tensorwise.safetensors' ]"
"$fp8kit" generate --model "$out/train/model_f32.safetensors" --prompt "The " --tokens 10 >"$out/g" 2>"$out/e"; rc=$?
check "generate: the prompt and 10 more bytes" "[ $rc -eq 0 ] && grep -q '^The ' '$out/g'"
# The saved model is a checkpoint like any other: quantized to FP8 (mx32), generate runs on it.
"$fp8kit" quantize "$out/train/model_f32.safetensors" "$out/train/model_f32_mx32.safetensors" --scheme mx32 >"$out/o" 2>"$out/e" &&
"$fp8kit" generate --model "$out/train/model_f32_mx32.safetensors" --prompt "The " --tokens 10 >"$out/g" 2>"$out/e"; rc=$?
check "quantize the trained model (mx32), generate from the FP8 file" "[ $rc -eq 0 ] && grep -q '^The ' '$out/g' && grep -q 'blocks.0.attn.qkv.weight *mx32' '$out/o'"
"$fp8kit" generate --model "$out/train/losses.csv" >"$out/g" 2>"$out/e"; rc=$?
check "generate from a file that is not a model: exit 2 naming it" "[ $rc -eq 2 ] && grep -q 'losses.csv' '$out/e'"
"$fp8kit" train --recipe fp4 --steps 1 --out "$out/train" >"$out/o" 2>"$out/e"; rc=$?
check "train --recipe fp4: exit 2 naming the recipe" "[ $rc -eq 2 ] && grep -q \"unknown recipe 'fp4'\" '$out/e'"

echo "$(( 19 - fails )) passed, $fails failed"
[ $fails -eq 0 ]
