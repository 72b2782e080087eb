"""Where the host time of eager ``run()`` goes (GPU): cProfile over back-to-back calls of the
1 × 32 × 4096 FP8 decode, the HOST case of ``fp8mla bench``."""

from __future__ import annotations

import cProfile
import pstats
import time

import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import HOST_CASE
from fp8mla.bench.inputs import build_inputs


def main() -> int:
    inp = build_inputs(HOST_CASE, torch.device("cuda"))
    run = I.fp8mla_direct(inp)
    for _ in range(20):
        run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        run()
    print(f"{(time.perf_counter() - start) / 200 * 1e6:.1f} us per eager run()")
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        run()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
