#!/bin/sh
# scripts/test.sh: every test. Sets up what is missing, then builds and runs:
#   release (g++, -Werror): all tests, the slow exhaustive ones (2^32 inputs) included;
#   clang (clang++, -Werror) and asan (ASan + UBSan): all but the slow ones.
# Exits non-zero if any build or test fails.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
status=0
for preset in release clang asan; do
    echo "== $preset =="
    if cmake --preset "$preset" >/dev/null && cmake --build --preset "$preset"; then
        ctest --preset "$preset" || status=1
    else
        echo "test.sh: the $preset build failed"
        status=1
    fi
done
exit $status
