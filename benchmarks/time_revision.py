"""Time one source revision of fp8mla on fixed decode cases (GPU), for before/after comparisons
of a change in the same device session: run it once per revision (``PYTHONPATH`` pointing at
that revision's ``src``) and compare the JSON files.

    python benchmarks/time_revision.py --label after --json OUT/after.json [--triton-tiles]

``--triton-tiles`` runs FP8 batches of up to 32 rows in the Triton 16-row tile an older planner
chose (``kernel_config="rows"``), so that a kernel change is timed on the same tile. Cases are
timed as ``fp8mla bench`` times them (CUDA-graph replays over rotated token placements for
small ones), with the same seeds in every revision.
"""

from __future__ import annotations

import argparse
import json

import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs, random_pool
from fp8mla.bench.measure import Timing, time_cuda, time_graph
from fp8mla.bench.runner import placements

CASES = [
    Case(64, 16, 4096),
    Case(32, 32, 4096),
    Case(1, 32, 4096),
    Case(64, 128, 4096),
    Case(8, 16, 8192, qo_len=4),
    Case(64, 16, 4096, kv_dtype=torch.bfloat16),
    Case(32, 32, 4096, kv_dtype=torch.bfloat16),
]


def runner(inp, triton_tiles: bool):
    kw = {}
    rows = inp.case.heads * inp.case.qo_len
    if triton_tiles and inp.case.kv_dtype.itemsize == 1 and rows <= 32:
        kw["kernel_config"] = "rows"
    return I.fp8mla_direct(inp, **kw)


def kernel_times(run, calls: int = 20) -> dict[str, float]:
    """Device µs per call of each kernel ``run`` launches (torch profiler, eager calls)."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0))
        if us > 0 and e.count >= calls:
            out[e.key[:48]] = round(us / calls, 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--triton-tiles", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="also each kernel's device time")
    args = ap.parse_args()
    dev = torch.device("cuda")
    pools: dict[torch.dtype, torch.Tensor] = {}
    rows = []
    for case in CASES:
        if case.kv_dtype not in pools:
            pools.clear()
            torch.cuda.empty_cache()
            pools[case.kv_dtype] = random_pool(case.slots_needed(), case.kv_dtype, dev)
        inputs = [
            build_inputs(case, dev, seed=i, pool=pools[case.kv_dtype])
            for i in range(placements(case))
        ]
        runs = [runner(x, args.triton_tiles) for x in inputs]
        if len(runs) == 1:
            t = time_cuda(runs[0])
        else:
            g = time_graph(lambda rs=runs: [r() for r in rs], reps=40)
            t = Timing(g.us_median / len(runs), g.us_p20 / len(runs), g.us_p80 / len(runs))
        rows.append(dict(label=args.label, case=case.name, us=round(t.us_median, 2),
                         p20=round(t.us_p20, 2), p80=round(t.us_p80, 2)))  # fmt: skip
        if args.kernels:
            rows[-1]["kernels"] = kernel_times(runs[0])
        print(json.dumps(rows[-1]), flush=True)
        del runs, inputs
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
