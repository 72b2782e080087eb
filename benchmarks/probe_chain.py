"""Where a decode call's time goes between kernels: CUDA-graph replays of one call repeated
over rotated token placements (as ``fp8mla bench`` times small cases), with parts of the call
left out, and the same chain of empty kernels.

    python benchmarks/probe_chain.py --json OUT/chain.json [--cases B1_H32_L4096_float8_e4m3fn]

Per case, µs per call: ``full`` (attention + split merge), ``attention`` (the merge not
launched: each attention grid waits for the one before it), ``merge`` (the attention not
launched: each merge waits for the merge before it, over the partials the first call left),
and ``empty-pdl`` / ``empty`` (two empty kernels per call, with and without programmatic
dependent launch, on the attention's and the merge's grids): what the grid boundaries alone
cost. The differences place the call's time: full − attention is what the merge adds,
full − merge what the attention adds, empty-pdl the floor of two dependent launches.
Measurements only: ``attention`` and ``merge`` outputs are wrong by design.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs, random_pool
from fp8mla.bench.measure import time_graph
from fp8mla.bench.runner import placements
from fp8mla.kernels.portable.grid_dependency import launch_next_grid, wait_prior_grid

CASES = {c.name: c for c in (Case(1, 32, 4096), Case(32, 32, 4096), Case(64, 16, 4096))}


@triton.jit
def _empty_kernel(x_ptr, WAIT: tl.constexpr, NEXT: tl.constexpr):
    if NEXT:
        launch_next_grid()
    if WAIT:
        wait_prior_grid()
    if tl.program_id(0) == 1_000_000:  # never: keeps the pointer argument
        tl.store(x_ptr, 0)


def part_runner(inp, part: str):
    """One call of fp8mla on ``inp`` with ``part`` ('full', 'attention', 'merge') launched."""
    w = I.planned_wrapper(inp, inp.pool.dtype)
    launch = w._launch
    ckv, kpe = inp.paged()
    out = torch.empty_like(inp.q_nope)
    s = inp.scale

    def call() -> None:
        w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out, ckv_scale=s, kpe_scale=s)

    call()  # compiled, bound, partials written
    if part != "full":  # run() through the launch object, whose parts are replaced below
        w._fast = [None] * 4
        w._bind_fast = lambda *a, **k: None
    if part == "attention":
        launch.merge = None
    elif part == "merge":
        if launch.merge is None:
            raise SystemExit(f"{inp.case.name}: no split merge to time")
        launch.fast = False  # Triton's path, whose attention launch is replaced below
        launch.kernel.launch = lambda *a, **k: None
        launch.kernel.launch_direct = lambda *a, **k: False
    return call, launch


def empty_runner(launch, pdl: bool):
    """The attention's and the merge's grids as two empty kernels."""
    x = torch.zeros(1, device="cuda")
    grids = [launch.kernel.grid] + ([launch.merge.grid] if launch.merge is not None else [])

    def call() -> None:
        for grid in grids:
            _empty_kernel[tuple(grid)](x, WAIT=pdl, NEXT=pdl, launch_pdl=pdl)

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    args = ap.parse_args()
    rows = []
    for name in args.cases:
        case = CASES[name]
        pool = random_pool(case.pool_slots, case.kv_dtype, torch.device("cuda"))
        n = placements(case)
        inps = [build_inputs(case, pool.device, seed=i, pool=pool) for i in range(n)]
        for part in ("full", "attention", "merge", "empty-pdl", "empty"):
            if part.startswith("empty"):
                _, launch = part_runner(inps[0], "full")
                calls = [empty_runner(launch, part == "empty-pdl")] * n
            else:
                calls = [part_runner(x, part)[0] for x in inps]
            t = time_graph(lambda cs=calls: [c() for c in cs])
            row = dict(case=name, part=part, calls=n, us=round(t.us_median / n, 2),
                       p20=round(t.us_p20 / n, 2), p80=round(t.us_p80 / n, 2))  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            del calls
        del inps, pool
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    print(f"\n{'case':<28} {'part':<10} µs per call")
    for r in rows:
        print(f"{r['case']:<28} {r['part']:<10} {r['us']:>8} ({r['p20']}–{r['p80']})")


if __name__ == "__main__":
    main()
