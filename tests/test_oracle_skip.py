#!/usr/bin/env python3
"""tests/test_oracle_skip.py: the skip rule of tests/oracle_skip.py cannot hide a failure.

Runs small oracles in fresh interpreters, with fake packages planted in a temporary folder:
a module that is not installed gives exit 77 and says which; a module that raises while being
imported, a package whose own import of a missing dependency fails, and an ImportError of a name
all give a failure (exit 1, not 77); an oracle that imports fine and then raises fails. Exit 0 when
every case behaves, 1 otherwise (printing each case).
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = [  # (what, module files to plant {name: source}, oracle body, expected exit)
    ("a module that is not installed: skipped", {}, "require('fp8kit_no_such_module')", 77),
    ("an installed module that raises on import: fails",
     {"fp8kit_raises.py": "raise RuntimeError('broken build')"}, "require('fp8kit_raises')", 1),
    ("an installed package missing its own dependency: fails",
     {"fp8kit_pkg/__init__.py": "import fp8kit_missing_dependency"}, "require('fp8kit_pkg')", 1),
    ("an ImportError of a name: fails",
     {"fp8kit_names.py": "from os import no_such_name"}, "require('fp8kit_names')", 1),
    ("a submodule of a missing package: skipped", {}, "require('fp8kit_absent.torch')", 77),
    ("an error after the imports: fails", {}, "require('os'); raise ValueError('oracle bug')", 1),
]


def main() -> int:
    bad = 0
    for what, files, body, want in CASES:
        with tempfile.TemporaryDirectory() as d:
            for name, src in files.items():
                os.makedirs(os.path.join(d, os.path.dirname(name)), exist_ok=True)
                with open(os.path.join(d, name), "w") as f:
                    f.write(src + "\n")
            code = f"import sys; sys.path[:0] = [{HERE!r}, {d!r}]\nfrom oracle_skip import require\n{body}\n"
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        ok = r.returncode == want and (want != 77 or "is not installed" in r.stderr)
        bad += not ok
        print(f"{'ok' if ok else 'FAIL'}: {what} (exit {r.returncode}, expected {want})")
        if not ok:
            print(r.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
