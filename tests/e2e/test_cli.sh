#!/bin/sh
# tests/e2e/test_cli.sh FP8KIT: the command line as a user meets it - help, version, the formats
# table (values from NUMERICS.md), bad input giving one line on stderr and exit code 2, and
# `bench quantize --quick --json` printing JSON lines; `train` (its table - each recipe's gap the
# mean of its seeds' gaps, with their 95% interval -, files with every seed's curve, no progress
# bar into a file, --policy's per-layer report), `generate` (the bytes, the rate on stderr), `bench generate` (a JSON line per model), and
# every refused argument of train, generate and advise: exit 2, one line naming the flag, nothing
# on stdout and nothing written.
set -u
fp8kit=$1
fails=0 passes=0
verdict() {  # verdict DESCRIPTION STATUS : STATUS 0 is a pass
    if [ "$2" -eq 0 ]; then echo "ok: $1"; passes=$((passes + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi
}
check() {  # check DESCRIPTION COMMAND : the command (a shell line) must succeed
    sh -c "$2"; verdict "$1" $?
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

# fp8kit train on a one-layer model for a few steps (the output format, its statistics and the
# files; the numerics are tests/nn's), then generate from the saved model.
"$fp8kit" train --steps 4 --layers 1 --width 32 --batch 2 --recipe f32,tensorwise --out "$out/train" >"$out/t" 2>"$out/e"; rc=$?
check "train: table with f32 and tensorwise, CSV, SVG and models written" "[ $rc -eq 0 ] && grep -Eq '^tensorwise +\|? *[0-9.]+' '$out/t' && [ \$(wc -l <'$out/train/losses.csv') -eq 5 ] && grep -q '<svg' '$out/train/losses.svg' && [ -s '$out/train/model_tensorwise.safetensors' ]"
check "train: stderr not a terminal - no progress bar, one line per run (2 recipes x 3 seeds)" "! grep -q \"\$(printf '\\r')\" '$out/e' && grep -Eq '^tensorwise +seed 3: 4 steps, loss [0-9.]+ \\([0-9.]+ s\\)\$' '$out/e' && [ \$(wc -l <'$out/e') -eq 7 ]"
# Three seeds by default, each its own initialisation: every run's curve in the CSV, the seeds'
# step-0 losses different. The table's gap is the mean of the three per-seed gaps it prints, and
# its +- the 95% half-width of Student's t with 2 degrees of freedom (4.303 s / sqrt 3).
check "train: the CSV has a column per recipe and seed, the seeds' first losses differ" "head -1 '$out/train/losses.csv' | grep -qx 'step,f32 seed 1,f32 seed 2,f32 seed 3,tensorwise seed 1,tensorwise seed 2,tensorwise seed 3' && [ \$(sed -n 2p '$out/train/losses.csv' | cut -d, -f2-4 | tr , '\\n' | sort -u | wc -l) -eq 3 ]"
awk '$1 == "f32" { f = ($3 == "+0.00%" && $4 == "-" && $5 == "-") }
     $1 == "tensorwise" { gap = $3; pm = $4; n = split($5, g, "/"); sub(/%/, "", gap); sub(/%/, "", pm)
         m = 0; for (i = 1; i <= n; i++) m += g[i] / n
         v = 0; for (i = 1; i <= n; i++) v += (g[i] - m) ^ 2 / (n - 1)
         ok = (n == 3 && (m - gap) ^ 2 < 0.01 ^ 2 && (4.303 * sqrt(v / 3) - pm) ^ 2 < 0.03 ^ 2) }
     END { exit !(f && ok) }' "$out/t"
verdict "train: f32's gap 0, tensorwise's gap the mean of its 3 seeds' and +- their 95% interval" $?
# Runs at a time share nothing: three at once write the bytes one at a time writes.
"$fp8kit" train --steps 4 --layers 1 --width 32 --batch 2 --recipe f32,tensorwise --jobs 1 --out "$out/j1" >/dev/null 2>&1 &&
"$fp8kit" train --steps 4 --layers 1 --width 32 --batch 2 --recipe f32,tensorwise --jobs 3 --out "$out/j3" >/dev/null 2>&1; rc=$?
check "train --jobs 3: the same losses and models as --jobs 1" "[ $rc -eq 0 ] && cmp -s '$out/j1/losses.csv' '$out/j3/losses.csv' && cmp -s '$out/j1/model_tensorwise.safetensors' '$out/j3/model_tensorwise.safetensors'"
"$fp8kit" train --steps 2 --layers 1 --width 32 --batch 2 --recipe f32,tensorwise --seeds 1 --jobs 1 --out "$out/t1" >"$out/t" 2>"$out/e"; rc=$?
check "train --seeds 1: one column per recipe, no interval from one seed" "[ $rc -eq 0 ] && head -1 '$out/t1/losses.csv' | grep -qx 'step,f32,tensorwise' && grep -Eq '^tensorwise +[0-9.]+ +[+-][0-9.]+% +- +- ' '$out/t'"
"$fp8kit" generate --model "$out/train/model_f32.safetensors" --prompt "The " --tokens 10 >"$out/g" 2>"$out/e"; rc=$?
check "generate: the prompt, 10 more bytes and a newline; the rate on stderr" "[ $rc -eq 0 ] && grep -q '^The ' '$out/g' && [ \$(wc -c <'$out/g') -eq 15 ] && grep -Eq '^10 bytes in [0-9.]+ s: [0-9.]+ tokens/s\$' '$out/e'"
# The saved model is a checkpoint like any other: quantized to FP8 (mx32), generate runs on it.
"$fp8kit" quantize "$out/train/model_f32.safetensors" "$out/train/model_f32_mx32.safetensors" --scheme mx32 >"$out/o" 2>"$out/e" &&
"$fp8kit" generate --model "$out/train/model_f32_mx32.safetensors" --prompt "The " --tokens 10 >"$out/g" 2>"$out/e"; rc=$?
check "quantize the trained model (mx32), generate from the FP8 file" "[ $rc -eq 0 ] && grep -q '^The ' '$out/g' && grep -q 'blocks.0.attn.qkv.weight *mx32' '$out/o'"
"$fp8kit" bench generate --model "$out/train/model_f32.safetensors" --model "$out/train/model_f32_mx32.safetensors" --tokens 5 --rounds 2 --json >"$out/bg" 2>"$out/e"; rc=$?
check "bench generate: a JSON line per model, the first the baseline (vs_first 1)" "[ $rc -eq 0 ] && [ \$(wc -l <'$out/bg') -eq 2 ] && head -1 '$out/bg' | grep -q '\"model\":\"$out/train/model_f32.safetensors\".*\"vs_first\":1.0}' && tail -1 '$out/bg' | grep -q 'model_f32_mx32.safetensors\".*\"tokens_per_s\":[0-9]'"
"$fp8kit" generate --model "$out/train/losses.csv" >"$out/g" 2>"$out/e"; rc=$?
check "generate from a file that is not a model: exit 3 (bad input) naming it" "[ $rc -eq 3 ] && grep -q 'losses.csv' '$out/e'"
"$fp8kit" train --recipe fp4 --steps 1 --out "$out/train" >"$out/o" 2>"$out/e"; rc=$?
check "train --recipe fp4: exit 2 naming the recipe" "[ $rc -eq 2 ] && grep -q \"unknown recipe 'fp4'\" '$out/e'"

# Refused arguments: exit 2, the message names the flag, nothing on stdout, no --out folder made.
# An input file the command cannot use (--data, --policy) is bad input instead: exit 3 (refused_input).
refused_with() {  # refused_with CODE DESCRIPTION NEEDLE ARGS...
    code=$1 what=$2 needle=$3
    shift 3
    rm -rf "$out/r"
    "$fp8kit" "$@" >"$out/o" 2>"$out/e"; rc=$?
    [ $rc -eq "$code" ] && grep -qF -- "$needle" "$out/e" && [ "$(wc -l <"$out/e")" -eq 1 ] && [ ! -s "$out/o" ] && [ ! -e "$out/r" ]
    verdict "$what: exit $code naming it, before any work or output" $?
    [ $rc -eq "$code" ] || cat "$out/e"
}
refused() { refused_with 2 "$@"; }
refused_input() { refused_with 3 "$@"; }
refused "train --steps 0" "--steps '0': expected an integer in [1, 10000000]" train --steps 0 --out "$out/r"
refused "train --steps -3" "--steps '-3': expected an integer in [1, 10000000]" train --steps -3 --out "$out/r"
refused "train --layers 0" "--layers '0': expected an integer in [1, 1024]" train --layers 0 --out "$out/r"
refused "train --width 0" "--width '0': expected an integer in [1, 65536]" train --width 0 --out "$out/r"
refused "train --batch -1" "--batch '-1': expected an integer in [1, 1000000]" train --batch -1 --out "$out/r"
refused "train --device tpu" "--device 'tpu': expected cpu or cuda" train --device tpu --out "$out/r"
# --device cuda: trains where a GPU is (a table row for tensorwise), else exit 2 saying why, before
# any work (this build without the CUDA backend, or the machine without a GPU or driver).
rm -rf "$out/r"
"$fp8kit" train --device cuda --steps 2 --layers 1 --width 32 --batch 2 --recipe tensorwise --out "$out/r" >"$out/o" 2>"$out/e"; rc=$?
check "train --device cuda: trains on the GPU, or exit 2 naming --device cuda and writing nothing" "{ [ $rc -eq 0 ] && grep -Eq '^tensorwise ' '$out/o'; } || { [ $rc -eq 2 ] && grep -q -- '--device cuda: ' '$out/e' && [ ! -s '$out/o' ] && [ ! -e '$out/r' ]; }"
refused "train --threads 0" "--threads '0': expected an integer in [1, 1024]" train --threads 0 --out "$out/r"
refused "train --seeds 0" "--seeds '0': expected an integer in [1, 1000]" train --seeds 0 --out "$out/r"
refused "train --jobs -1" "--jobs '-1': expected an integer in [0, 1024]" train --jobs -1 --out "$out/r"
refused "train --recipe ''" "--recipe '': an empty recipe name" train --recipe "" --out "$out/r"
refused "train --recipe foo" "--recipe: unknown recipe 'foo'" train --recipe foo --out "$out/r"
refused "train --recipe f32,,bf16" "--recipe 'f32,,bf16': an empty recipe name" train --recipe f32,,bf16 --out "$out/r"
refused "train --recipe f32," "--recipe 'f32,': an empty recipe name" train --recipe f32, --out "$out/r"
refused "train --recipe f32,f32" "--recipe: 'f32' given twice" train --recipe f32,f32 --out "$out/r"
refused "train --width 30 (not a multiple of the heads)" "--width 30 must be a multiple of the 4 attention heads" train --width 30 --out "$out/r"
refused_input "train --data missing" "--data: cannot open '$out/missing.txt'" train --data "$out/missing.txt" --out "$out/r"
printf 'too short' >"$out/short.txt"
refused_input "train --data too short" "--data '$out/short.txt': the training text has 9 bytes" train --data "$out/short.txt" --out "$out/r"
refused_input "train --policy missing" "$out/missing.json" train --policy "$out/missing.json" --out "$out/r"
refused "train --out ''" "--out: the path is empty" train --out ""
refused "train --out a file" "--out '$out/short.txt' exists and is not a directory" train --out "$out/short.txt"
refused "generate --tokens -5" "--tokens '-5': expected an integer in [1, 1000000]" generate --model "$out/train/model_f32.safetensors" --tokens -5
refused "generate --tokens 0" "--tokens '0': expected an integer in [1, 1000000]" generate --model "$out/train/model_f32.safetensors" --tokens 0
refused "bench generate --rounds 0" "--rounds '0': expected an integer in [1, 1000]" bench generate --model "$out/train/model_f32.safetensors" --rounds 0
refused "advise --tokens 0" "--tokens '0': expected an integer in [1, 2147483648]" advise --shapes 16x64x64 --tokens 0 --out "$out/r"
refused "advise --budget 0" "--budget" advise --shapes 16x64x64 --budget 0 --out "$out/r"
refused "advise --min-speedup -1" "--min-speedup" advise --shapes 16x64x64 --min-speedup -1 --out "$out/r"
refused "advise --recipe foo" "foo" advise --shapes 16x64x64 --recipe foo --out "$out/r"
refused "advise --recipe delayed" "--recipe delayed needs training state" advise --shapes 16x64x64 --recipe delayed --out "$out/r"
refused "advise --input-dtype f64" "--input-dtype f64: expected f32 or bf16" advise --shapes 16x64x64 --input-dtype f64 --out "$out/r"
refused "advise --shapes 16x64" "--shapes: '16x64' is not MxNxK" advise --shapes 16x64 --out "$out/r"
refused "advise --shapes 0x64x64" "--shapes M '0': expected an integer in [1, 2147483648]" advise --shapes 0x64x64 --out "$out/r"
refused "advise without --shapes or --model" "exactly one of --shapes and --model" advise --out "$out/r"
refused "advise --shapes and --model" "exactly one of --shapes and --model" advise --shapes 16x64x64 --model "$out/train/model_f32.safetensors" --out "$out/r"
refused "advise --out in a missing folder" "the folder '$out/nofolder' does not exist" advise --shapes 16x64x64 --out "$out/nofolder/p.json"
refused "advise --out the --model file" "is the same file as the input" advise --model "$out/train/model_f32.safetensors" --out "$out/train/model_f32.safetensors"
# A missing input file is bad input (exit 3, as the checkpoint commands), not a usage error.
"$fp8kit" advise --model "$out/missing.safetensors" --out "$out/r" >"$out/o" 2>"$out/e"; rc=$?
[ $rc -eq 3 ] && grep -qF -- "$out/missing.safetensors" "$out/e" && [ ! -s "$out/o" ] && [ ! -e "$out/r" ]
verdict "advise --model missing: exit 3 naming it, before any work or output" $?

# --policy: a policy by hand for the one-layer model - fc1 in FP8 (block), fc2 kept in float32;
# the report names each Linear, FP8 or not and why. With --recipe f32 it says it ignores it.
cat >"$out/policy.json" <<'JSON'
{"format": "fp8kit-policy", "version": 1, "layers": [
  {"name": "blocks.0.mlp.fc1", "fp8": true, "recipe": "block", "reason": "by hand: fc1 in FP8"},
  {"name": "blocks.0.mlp.fc2", "fp8": false, "reason": "by hand: fc2 stays float32"}]}
JSON
"$fp8kit" train --steps 2 --layers 1 --width 32 --batch 2 --recipe tensorwise --policy "$out/policy.json" --out "$out/p" >"$out/t" 2>"$out/e"; rc=$?
[ $rc -eq 0 ] && grep -q 'blocks.0.mlp.fc1: FP8 block - policy: by hand: fc1 in FP8' "$out/t" &&
    grep -q 'blocks.0.mlp.fc2: float32 - policy: by hand: fc2 stays float32' "$out/t" &&
    grep -q "blocks.0.attn.qkv: FP8 tensorwise - no policy entry: the run's recipe" "$out/t" &&
    grep -q 'lm_head: float32 - no policy entry: the output layer' "$out/t"
verdict "train --policy: each layer FP8 or not, its recipe and why" $?
"$fp8kit" train --steps 2 --layers 1 --width 32 --batch 2 --recipe f32 --policy "$out/policy.json" --out "$out/p" >"$out/t" 2>"$out/e"; rc=$?
check "train --policy --recipe f32: says f32 ignores it" "[ $rc -eq 0 ] && grep -q 'f32 ignores it' '$out/e'"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
