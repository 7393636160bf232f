#!/bin/sh
# tests/e2e/test_install.sh BUILD_DIR EXAMPLES_DIR CXX [CXXFLAGS]: install fp8kit into a temporary
# prefix and build the example against it twice, as users do - with find_package(fp8kit) and with
# pkg-config - then run both programs (the example checks its own result against NUMERICS.md).
# CXXFLAGS: the flags the library was built with that consumers must share (the sanitizers).
set -eu
build=$1 examples=$2 cxx=$3 flags=${4:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/log
run() {  # run a step quietly; on failure show its output
    if ! "$@" >"$log" 2>&1; then
        cat "$log"
        echo "FAILED: $*"
        exit 1
    fi
}

run cmake --install "$build" --prefix "$tmp/prefix"
test -f "$tmp/prefix/include/fp8kit/fp8kit.hpp"
test -f "$tmp/prefix/include/fp8kit/version.hpp"

# 1. CMake package
run cmake -S "$examples" -B "$tmp/cmake-build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags"
run cmake --build "$tmp/cmake-build"
"$tmp/cmake-build/quantize_roundtrip"

# 2. pkg-config
PKG_CONFIG_PATH=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -n 1)
export PKG_CONFIG_PATH
# shellcheck disable=SC2046,SC2086
run "$cxx" -O2 $flags "$examples/quantize_roundtrip.cpp" -o "$tmp/pc_example" $(pkg-config --cflags --libs fp8kit)
"$tmp/pc_example"
echo "1 passed, 0 failed"
