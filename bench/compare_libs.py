#!/usr/bin/env python3
"""bench/compare_libs.py: two builds of libfp8kit timed call by call in one process.

    python3 bench/compare_libs.py BASE_TREE NEW_TREE [--rounds 400] [--threads 2]

Each TREE is a source checkout with a release build (`cmake --workflow --preset release`, so
TREE/build/release/libfp8kit.a). For each tree this compiles bench/compare_libs.cpp (of this
checkout) as a shim against the tree's headers and static library into a shared library with
local symbols, compiles the driver, and runs it: both builds loaded at once, every case called
base-new / new-base in alternation, results checked equal bit for bit before timing. Prints a
Markdown table (docs/PERF.md). Needs g++ (or $CXX) on an ELF platform (dlopen). Not run by ctest.

Why beside compare_builds.py: that one runs the two `fp8kit` commands one after the other, which
on a shared machine leaves +-20 % between runs of identical code; paired calls see the same
moment of the machine, so their ratio resolves the 3 % of issue 16 item 9.
"""
import argparse
import os
import subprocess
import sys
import tempfile

from compare_builds import cpu_model  # beside this file: the CPU line both comparisons print

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "compare_libs.cpp")


def compile_(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"compare_libs: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def shim(cxx, tree, out):
    build = os.path.join(tree, "build", "release")
    lib = os.path.join(build, "libfp8kit.a")
    if not os.path.isfile(lib):
        sys.exit(f"compare_libs: {lib} not found: build the tree first (cmake --workflow --preset release)")
    libs = [lib]
    gpt = os.path.join(build, "tools", "gpt", "libfp8kit_gpt.a")
    if os.path.isfile(gpt):
        libs.insert(0, gpt)  # the GPT application, where the tree has it outside the library
    compile_([cxx, "-O2", "-std=c++20", "-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-Bsymbolic",
              "-DFP8KIT_PAIR_SHIM", "-DFP8KIT_PAIR_EXPORT=__attribute__((visibility(\"default\")))",
              "-I", os.path.join(tree, "include"), "-I", os.path.join(build, "include"),
              "-I", os.path.join(tree, "tools"), SOURCE, "-Wl,--exclude-libs,ALL", *libs,
              *link_flags(build), "-o", out])


def link_flags(build):
    """What the static library needs linked after it (OpenMP; a build with the cuda backend:
    cuBLASLt and the CUDA runtime), from the Libs line of the tree's pkg-config file."""
    pc = os.path.join(build, "fp8kit.pc")
    if not os.path.isfile(pc):
        return ["-fopenmp"]
    with open(pc) as f:
        libs = next((line.split(":", 1)[1].split() for line in f if line.startswith("Libs:")), [])
    return [flag for flag in libs if flag not in ("-L${libdir}", "-lfp8kit")] or ["-fopenmp"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    cxx = os.environ.get("CXX", "g++")
    with tempfile.TemporaryDirectory() as tmp:
        base, new, driver = (os.path.join(tmp, n) for n in ("base.so", "new.so", "compare_libs"))
        shim(cxx, os.path.abspath(a.base), base)
        shim(cxx, os.path.abspath(a.new), new)
        compile_([cxx, "-O2", "-std=c++20", SOURCE, "-ldl", "-o", driver])
        print(f"CPU: {cpu_model()}\nbase: {a.base}\nnew:  {a.new}\n", flush=True)
        sys.exit(subprocess.run([driver, base, new, str(a.rounds), str(a.threads)], check=False).returncode)


if __name__ == "__main__":
    main()
