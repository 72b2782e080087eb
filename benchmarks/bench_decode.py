"""Decode benchmark (GPU): ``python benchmarks/bench_decode.py [fp8mla bench options]``.

The same as ``fp8mla bench``; see ``fp8mla bench --help``.
"""

import sys

from fp8mla.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
