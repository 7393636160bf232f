#!/bin/sh
# scripts/setup.sh: install what fp8kit needs on a Debian machine - only what is missing, saying
# what it installs - and the Python test oracles into the project's own virtual environment.
# Safe to run again: it then installs nothing.
set -eu
cd "$(dirname "$0")/.."

# Build: compilers (g++ and clang++ with its OpenMP runtime), CMake + Ninja, ccache (the presets'
# builds and the Python package's share one cache: FP8KIT_CCACHE), GoogleTest, CLI11,
# nlohmann-json (safetensors headers).
# Tests: python3 + venv for the oracles (ml_dtypes, numpy, safetensors from PyPI; PyTorch; and the FP8
# checkpoint producers and loaders transformers, compressed-tensors, llm-compressor, from
# tests/requirements-checkpoints.txt; the PyTorch FP8 peers torchao, optimum-quanto, Diffusers, from
# tests/requirements-peers.txt), pkg-config for the install test, librsvg2-bin (rsvg-convert)
# to render `fp8kit train`'s losses.svg as a person sees it.
# The Python package: python3-dev (Python.h, for the nanobind extension).
# Benchmarks only (bench_gemm's peers; the library never links them): OpenBLAS in its OpenMP
# build - on libgomp, as g++ builds fp8kit, so peers and fp8kit share one thread team instead of
# two spinning against each other (found through pkg-config) - and oneDNN.
packages="cmake ninja-build ccache g++ clang libomp-dev libgtest-dev libcli11-dev nlohmann-json3-dev pkg-config python3 python3-venv python3-dev librsvg2-bin libopenblas-openmp-dev libdnnl-dev"
# Cross builds (presets windows-cross, arm64-cross): MinGW-w64 g++ with POSIX threads (it has
# OpenMP) and Wine to run its programs; aarch64 g++ and qemu-user to run its programs.
packages="$packages g++-mingw-w64-x86-64-posix wine wine64 g++-aarch64-linux-gnu qemu-user"

missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing Debian packages:$missing"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
else
    echo "setup: Debian packages present"
fi

# The oracles, pinned, in .venv (never the system Python).
venv=.venv
if [ ! -x "$venv/bin/python3" ]; then
    echo "setup: creating $venv"
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python3" -c "import ml_dtypes, numpy, safetensors, pytest, xdist" 2>/dev/null; then
    echo "setup: installing Python test oracles: $(tr '\n' ' ' < tests/requirements.txt)"
    "$venv/bin/python3" -m pip install -q --disable-pip-version-check -r tests/requirements.txt
else
    echo "setup: Python test oracles present"
fi

# PyTorch for the torch._scaled_mm oracle, with --no-deps: tests/requirements-torch.txt says why.
# FP8KIT_NO_TORCH=1 leaves it out (tests/golden/test_torch_gemm.cpp then reports itself skipped).
torch_pin=$(sed -n 's/^torch==//p' tests/requirements-torch.txt)
torch_ok() {  # the pinned torch imports (with every library it links with)
    "$venv/bin/python3" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$torch_pin')" 2>/dev/null
}
if [ "${FP8KIT_NO_TORCH:-0}" = 1 ]; then
    echo "setup: FP8KIT_NO_TORCH=1: not installing PyTorch"
elif torch_ok; then
    echo "setup: PyTorch $torch_pin present"
else
    echo "setup: installing PyTorch $torch_pin without its CUDA dependencies (~1.1 GB)"
    "$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-deps -r tests/requirements-torch.txt
    if ! torch_ok; then
        echo "setup: no CUDA 13 toolkit for torch's libraries to link with: installing its runtime libraries (~2 GB)"
        "$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-deps -r tests/requirements-torch-cuda.txt
    fi
    if ! torch_ok; then
        echo "setup: torch $torch_pin does not import:" >&2
        "$venv/bin/python3" -c "import torch" >&2 || true
        exit 1
    fi
fi

# Packages that run on torch, installed --no-deps so that torch stays at its pin (their
# requirements file says why and lists what their imports need): a group is installed unless its
# imports already work, or FP8KIT_NO_TORCH=1 leaves torch out.
torch_group() {  # names, import statement, requirements file, size
    if [ "${FP8KIT_NO_TORCH:-0}" = 1 ]; then
        echo "setup: FP8KIT_NO_TORCH=1: not installing $1"
    elif "$venv/bin/python3" -c "import $2" >/dev/null 2>&1; then
        echo "setup: $1 present"
    else
        echo "setup: installing $1 ($3, $4)"
        "$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-deps -r "$3"
    fi
}
# The FP8 checkpoint ecosystem, for tests/python/test_checkpoint_ecosystem.py.
torch_group "transformers, compressed-tensors, llm-compressor" "transformers, compressed_tensors, llmcompressor" \
    tests/requirements-checkpoints.txt "~450 MB"
# The PyTorch FP8 peers, for tests/python and bench/bench_torch.py.
torch_group "torchao, optimum-quanto, diffusers" "torchao, optimum.quanto, diffusers" tests/requirements-peers.txt "~100 MB"

# The Python package (pyproject.toml, python/): its pinned build requirements, then `pip install .`
# without build isolation (nothing fetched at build time), built by CMake in build/python. Run every
# time, so that .venv holds the package of this checkout; an unchanged tree rebuilds nothing. With the
# presets' flags - warnings are errors, ccache - so that the release preset's build of the same library
# sources takes this build's objects from the cache (a plain `pip install .` sets neither).
if ! "$venv/bin/python3" -c "import scikit_build_core, nanobind" 2>/dev/null; then
    echo "setup: installing the Python package's build requirements: $(grep -v '^#' python/requirements-build.txt | tr '\n' ' ')"
    "$venv/bin/python3" -m pip install -q --disable-pip-version-check -r python/requirements-build.txt
fi
echo "setup: building the fp8kit Python package into $venv (build/python)"
"$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
    -C cmake.define.FP8KIT_WERROR=ON -C cmake.define.FP8KIT_CCACHE=ON .
