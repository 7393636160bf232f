#!/bin/sh
# tests/e2e/test_install.sh BUILD_DIR EXAMPLES_DIR CXX: install fp8kit into a temporary prefix and
# build the example against it twice, as users do - with find_package(fp8kit) and with
# pkg-config - then run both programs (the example checks its own results against NUMERICS.md).
set -eu
build=$1 examples=$2 cxx=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/include/fp8kit/fp8kit.hpp"
test -f "$tmp/prefix/include/fp8kit/version.hpp"

# 1. CMake package
cmake -S "$examples" -B "$tmp/cmake-build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/cmake-build" >/dev/null
"$tmp/cmake-build/quantize_roundtrip"

# 2. pkg-config
libdir=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -n 1)
PKG_CONFIG_PATH=$libdir
export PKG_CONFIG_PATH
# shellcheck disable=SC2046
"$cxx" -O2 "$examples/quantize_roundtrip.cpp" -o "$tmp/pc_example" $(pkg-config --cflags --libs fp8kit)
"$tmp/pc_example"
echo "1 passed, 0 failed"
