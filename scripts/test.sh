#!/bin/sh
# scripts/test.sh: every test. Sets up what is missing, then builds and runs:
#   release (g++, -Werror): all tests, the slow exhaustive ones (2^32 inputs) included;
#   clang (clang++, -Werror) and asan (ASan + UBSan): all but the slow ones;
#   windows-cross (MinGW-w64, tests under Wine) and arm64-cross (aarch64, tests under qemu-user):
#   the tests their test presets select (README, "Building elsewhere").
# Prints each preset's wall time. Exits non-zero if any build or test fails.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
status=0
for preset in release clang asan windows-cross arm64-cross; do
    echo "== $preset =="
    start=$(date +%s)
    if cmake --preset "$preset" >/dev/null && cmake --build --preset "$preset"; then
        ctest --preset "$preset" || status=1
    else
        echo "test.sh: the $preset build failed"
        status=1
    fi
    echo "== $preset: $(($(date +%s) - start)) s =="
done
exit $status
