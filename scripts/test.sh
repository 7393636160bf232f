#!/bin/sh
# scripts/test.sh: every test. Sets up what is missing, then builds and runs:
#   release (g++, -Werror): all tests, the slow exhaustive ones (2^32 inputs) included;
#   asan (clang++, -Werror, ASan + UBSan; the parser fuzzed with libFuzzer): all but the slow ones -
#   the clang++ build of every file and test, so the plain clang preset is not run again;
#   windows-cross (MinGW-w64, tests under Wine) and arm64-cross (aarch64, tests under qemu-user):
#   the tests their test presets select (docs/BUILDING.md, "Building elsewhere");
#   the Python package (pytest: tests/python/test_package.py, test_gemm.py, test_torch.py,
#   test_training.py, test_fsdp.py, test_layerwise.py, test_advise.py, test_fp8_checkpoints.py,
#   test_attention.py, test_layernorm.py; test_cuda.py, which skips without a GPU) that
#   setup.sh installed into .venv, two tests at a time (pytest-xdist), as the test presets run.
# Prints each preset's wall time, and ends with the skipped tests, each with its reason, and their
# count (scripts/skipped_tests.py). Exits non-zero if any build or test fails.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
status=0
rm -f build/*/ctest-junit.xml build/python/pytest-junit.xml
for preset in release asan windows-cross arm64-cross; do
    echo "== $preset =="
    start=$(date +%s)
    if cmake --preset "$preset" >/dev/null && cmake --build --preset "$preset"; then
        ctest --preset "$preset" --output-junit "$PWD/build/$preset/ctest-junit.xml" || status=1
    else
        echo "test.sh: the $preset build failed"
        status=1
    fi
    echo "== $preset: $(($(date +%s) - start)) s =="
done
# The Python package setup.sh built into .venv.
echo "== python =="
start=$(date +%s)
.venv/bin/python3 -m pytest -q -p no:cacheprovider -n 2 tests/python/test_package.py tests/python/test_gemm.py tests/python/test_torch.py tests/python/test_training.py tests/python/test_fsdp.py tests/python/test_layerwise.py tests/python/test_advise.py tests/python/test_fp8_checkpoints.py tests/python/test_attention.py tests/python/test_layernorm.py tests/python/test_cuda.py \
    --junitxml "$PWD/build/python/pytest-junit.xml" || status=1
echo "== python: $(($(date +%s) - start)) s =="
python3 scripts/skipped_tests.py build/*/ctest-junit.xml build/python/pytest-junit.xml
exit $status
