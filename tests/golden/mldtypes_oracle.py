#!/usr/bin/env python3
"""tests/golden/mldtypes_oracle.py: ml_dtypes as an independent oracle for fp8kit.

Writes to stdout, for the FP8 format named on the command line:
  1. the 256 codes decoded by ml_dtypes, as little-endian float32 (1024 bytes);
  2. ml_dtypes' conversion (astype: round to nearest even, nonsaturating) of every float32
     bit pattern 0x00000000 .. 0xffffffff, in order: 2^32 bytes.
tests/golden/test_mldtypes.cpp reads this stream and compares every fp8kit path with it.
"""
import sys
import warnings

import ml_dtypes
import numpy as np

CHUNK = 1 << 24


def main() -> int:
    name = sys.argv[1]
    dtype = getattr(ml_dtypes, "float8_" + name)
    out = sys.stdout.buffer
    out.write(np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32).astype("<f4").tobytes())
    warnings.simplefilter("ignore")  # "invalid value encountered in cast" for NaN/Inf inputs
    base = np.arange(CHUNK, dtype=np.uint32)
    for start in range(0, 1 << 32, CHUNK):
        x = (base + np.uint32(start)).view(np.float32)
        out.write(x.astype(dtype).view(np.uint8).tobytes())
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
