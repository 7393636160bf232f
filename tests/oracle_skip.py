"""tests/oracle_skip.py: the one rule by which a Python oracle reports itself skipped (exit 77).

    from oracle_skip import require
    np, torch = require("numpy", "torch")

An oracle is skipped only when a module it needs is not installed: `import NAME` raising
ModuleNotFoundError for NAME itself (or its top-level package). Anything else - a module that is
installed but fails to import (a missing dependency inside it, an OSError from a shared library,
an ImportError of a name), and every exception after the imports - propagates, and the oracle
fails with the traceback. Checked by tests/test_oracle_skip.py (ctest oracle_skip_rule).
"""
import importlib
import sys

SKIP = 77


def require(*names):
    """The modules `names`, imported; exit 77 saying which is not installed."""
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if e.name not in (name, name.split(".")[0]):
                raise  # installed, but something it imports is missing: a broken install, a failure
            print(f"skipped: Python module '{name}' is not installed in {sys.executable} "
                  "(scripts/setup.sh installs it)", file=sys.stderr)
            sys.exit(SKIP)
    return modules[0] if len(modules) == 1 else modules
