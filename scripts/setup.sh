#!/bin/sh
# scripts/setup.sh: install what fp8kit needs on a Debian machine - only what is missing, saying
# what it installs - and the Python test oracles into the project's own virtual environment.
# Safe to run again: it then installs nothing.
set -eu
cd "$(dirname "$0")/.."

# Build: compilers (g++ and clang++ with its OpenMP runtime), CMake + Ninja, GoogleTest, CLI11.
# Tests: python3 + venv for the oracles (ml_dtypes, numpy from PyPI), pkg-config for the
# install test.
packages="cmake ninja-build g++ clang libomp-dev libgtest-dev libcli11-dev pkg-config python3 python3-venv"

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
if ! "$venv/bin/python3" -c "import ml_dtypes, numpy" 2>/dev/null; then
    echo "setup: installing Python test oracles: $(tr '\n' ' ' < tests/requirements.txt)"
    "$venv/bin/python3" -m pip install -q --disable-pip-version-check -r tests/requirements.txt
else
    echo "setup: Python test oracles present"
fi
