#!/bin/sh
# cmake/cross/wine-run.sh PREFIX PROGRAM [ARGS...]: runs a cross-built Windows program under Wine,
# in the Wine prefix PREFIX (inside the build folder). It is the windows-cross preset's
# CMAKE_CROSSCOMPILING_EMULATOR, so ctest and gtest_discover_tests run the tests through it. The
# prefix is made on first use under a lock, so that programs started in parallel do not each make
# it. Exits with the program's status. Once in a few hundred starts, with two tests starting at
# the same moment, wine exits non-zero within milliseconds and the program writes nothing (a
# fresh-clone run on 2026-11-24: a quantize test that passes natively, 4 ms, no output), or only
# wine's own complaint ("wine client error:0: recvmsg: Connection reset by peer", 2026-11-26, a
# golden-vector test, 30 ms); only such a start is made once more, with a line on stderr saying
# so - a program that wrote anything itself (stdout, or a stderr line not from wine) keeps its
# status. Also started once more: a run where wine itself was killed by a signal (status > 128; a
# CI run on 2026-11-26: a quantize test printed "[  PASSED  ]", then the shell reported
# "Segmentation fault"). Why that is wine's fault and never the program's: a Windows program's own
# crash is an exception Wine catches and reports, and its status is the NTSTATUS's low byte (a null
# read exits 5, abort() 3), never a signal. And a run that outlives FP8KIT_WINE_LIMIT seconds
# (300 unless set; the slowest test takes 3 s under Wine) is stopped and started once more: a CI run
# on 2026-11-27 hung in one test, the others passing beside it, until CI's 90 minutes ran out, and
# the same build's tests then passed in 30 s, four times in a row, here. A program that hangs each
# time fails with timeout's status 124 after two limits. Checked by the windows-cross tests.
set -eu
prefix=$1
shift
export WINEPREFIX="$prefix" WINEARCH=win64 WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
if [ ! -f "$prefix/system.reg" ]; then
    mkdir -p "$(dirname "$prefix")"
    flock "$prefix.lock" sh -c '[ -f "$WINEPREFIX/system.reg" ] || { timeout 300 wineboot --init && timeout 300 wineserver --wait; } >/dev/null 2>&1'
fi
limit=${FP8KIT_WINE_LIMIT:-300}
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
for attempt in 1 2; do
    status=0
    timeout --kill-after=10 "$limit" wine "$@" >"$out" 2>"$err" || status=$?
    if [ "$attempt" -eq 2 ]; then
        break
    elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        echo "wine-run.sh: $1 ran past $limit s under wine and was stopped (its last line: $(tail -n 1 "$out" | cut -c1-200)); starting it once more" >&2
    elif [ "$status" -gt 128 ]; then
        echo "wine-run.sh: wine was killed by signal $((status - 128)) running $1; starting it once more" >&2
    elif [ "$status" -eq 0 ] || [ -s "$out" ] || grep -qv '^wine' "$err"; then
        break
    else
        echo "wine-run.sh: wine exited $status before $1 wrote anything (a launch failure); starting it once more" >&2
    fi
done
cat "$out"
cat "$err" >&2
exit "$status"
