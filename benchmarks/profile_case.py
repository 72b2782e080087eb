"""Run one decode case a few times through the wrapper, for a profiler to attach to (GPU):
``ncu --kernel-name regex:mla_attn --launch-skip 2 --launch-count 1 python
benchmarks/profile_case.py 32 32 4096``."""

from __future__ import annotations

import sys

import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs


def main(argv: list[str]) -> int:
    batch, heads, context = (int(a) for a in argv[:3])
    case = Case(batch, heads, context)
    inp = build_inputs(case, torch.device("cuda"))
    run = I.fp8mla_direct(inp)
    for _ in range(4):
        run()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
