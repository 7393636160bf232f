#!/bin/sh
# cmake/cross/wine-run.sh PREFIX PROGRAM [ARGS...]: runs a cross-built Windows program under Wine,
# in the Wine prefix PREFIX (inside the build folder). It is the windows-cross preset's
# CMAKE_CROSSCOMPILING_EMULATOR, so ctest and gtest_discover_tests run the tests through it. The
# prefix is made on first use under a lock, so that programs started in parallel do not each make
# it. Exits with the program's status. Checked by the windows-cross tests.
set -eu
prefix=$1
shift
export WINEPREFIX="$prefix" WINEARCH=win64 WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
if [ ! -f "$prefix/system.reg" ]; then
    mkdir -p "$(dirname "$prefix")"
    flock "$prefix.lock" sh -c '[ -f "$WINEPREFIX/system.reg" ] || { wineboot --init && wineserver --wait; } >/dev/null 2>&1'
fi
exec wine "$@"
