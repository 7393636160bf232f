#!/bin/sh
# tests/e2e/test_losses_svg.sh FP8KIT [PNG]: `fp8kit train`'s losses.svg checked as a person sees
# it - rendered to PNG by rsvg-convert (librsvg2-bin, scripts/setup.sh) - and for what the chart
# must show: per recipe a raw and a smoothed curve and the held-out loss marked, and a y axis
# fitted to the later losses (its top tick below the step-0 loss, so the gaps at the end are not
# squeezed to the bottom). PNG: where to keep the rendering (to look at it). Exit 77 (skipped)
# only when rsvg-convert is not installed.
set -u
fp8kit=$1
keep=${2:-}
if ! command -v rsvg-convert >/dev/null 2>&1; then
    echo "skipped: rsvg-convert is not installed (scripts/setup.sh installs librsvg2-bin)"
    exit 77
fi
fails=0 passes=0
verdict() {  # verdict DESCRIPTION STATUS : STATUS 0 is a pass
    if [ "$2" -eq 0 ]; then echo "ok: $1"; passes=$((passes + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# 120 steps: at the training's peak lr (1e-3) this model's loss is then well below step 0's by the
# second half, which the axis check below needs. Each recipe's curve is its mean over the 3 seeds.
"$fp8kit" train --steps 120 --layers 1 --width 32 --batch 4 --recipe f32,bf16,tensorwise --out "$out/t" >"$out/o" 2>"$out/e"
verdict "train writes losses.svg" $?
svg=$out/t/losses.svg
rsvg-convert -o "$out/losses.png" "$svg" 2>"$out/e"
verdict "rsvg-convert renders it" $?
[ "$(od -An -tx1 -N8 "$out/losses.png" | tr -d ' \n')" = "89504e470d0a1a0a" ] && [ "$(wc -c <"$out/losses.png")" -gt 10000 ]
verdict "the rendering is a PNG of some substance" $?
[ -n "$keep" ] && cp "$out/losses.png" "$keep"
[ "$(grep -c 'class="raw"' "$svg")" -eq 3 ] && [ "$(grep -c 'class="smoothed"' "$svg")" -eq 3 ]
verdict "a raw and a smoothed curve per recipe" $?
[ "$(grep -c 'class="held-out"' "$svg")" -eq 3 ] && [ "$(grep -c ' - held-out [0-9]' "$svg")" -eq 3 ]
verdict "the held-out loss marked and given per recipe" $?
# The top y tick (the largest number right-aligned at the axis) against the step-0 loss.
top=$(sed -n 's/.*text-anchor="end">\([0-9.]*\)<.*/\1/p' "$svg" | sort -g | tail -1)
first=$(sed -n '2p' "$out/t/losses.csv" | cut -d, -f2)
awk -v top="$top" -v first="$first" 'BEGIN { exit !(top + 0 < first + 0 - 1) }'
verdict "y axis fitted to the later losses: top tick $top, step-0 loss $first" $?
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
