"""The SM90 many-row kernels (``wgmma``: both consumer warpgroups on every tile;
``pingpong``: alternate tiles) on the many-row cases, in one GPU run, alternated A/B/A/B:
error against the float64 reference (4 requests), CUDA-graph µs (replays over rotated token
placements, as ``fp8mla bench`` times small cases), TFLOP/s; FlashInfer's FP8 and bf16-pool
paths in the same run when ``FP8MLA_FLASHINFER`` names its folder.

    python benchmarks/probe_manyrows.py --json OUT/probe.json [--variants wgmma pingpong]
"""

from __future__ import annotations

import argparse

import torch

from fp8mla.attention.planner import PINGPONG_TILE, PINGPONG_TILE_64, WGMMA_TILE
from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs
from fp8mla.bench.measure import copy_bandwidth_tbps, flops, time_graph
from fp8mla.bench.runner import placements, reference_subset
from fp8mla.testing import rel_err
from probe_common import Pools, Rows

CASES = {
    c.name: c
    for c in (
        Case(64, 128, 4096),
        Case(8, 128, 16384),
        Case(64, 64, 4096),
        Case(1, 128, 32768 + 4096, qo_len=4096),
        # where 64-token tiles start to pay: 512 to 131,072 rows a request
        Case(8, 128, 8192, qo_len=4),
        Case(4, 128, 8192, qo_len=16),
        Case(2, 128, 16384 + 256, qo_len=256),
        Case(1, 32, 32768 + 4096, qo_len=4096),
    )
}
# name: (tile, the kernel's compile-time options overridden)
VARIANTS = {
    "wgmma": (WGMMA_TILE, {}),
    "pingpong": (PINGPONG_TILE, {}),
    # 16-bit pools: 64-token tiles in two buffers released by column halves
    "pingpong64": (PINGPONG_TILE_64, {}),
    # the FP8 producer loading one 128-column chunk ahead instead of the whole 32-token tile
    "pingpong-chunked": (PINGPONG_TILE, {"WHOLE_TILE": False}),
}


def fp8mla_run(inp, pool: torch.Tensor, variant: tuple) -> I.Runner:
    """fp8mla in the variant's tile and options on ``pool`` (the FP8 pool, or a bf16 pool of
    its values)."""
    config, options = variant
    w = I.planned_wrapper(inp, pool.dtype, kernel_config=config)
    w._launch.kernel.options.update(options)
    ckv, kpe = inp.paged(pool)
    out = torch.empty_like(inp.q_nope)
    kw = dict(ckv_scale=inp.scale, kpe_scale=inp.scale) if pool.dtype.itemsize == 1 else {}
    return lambda: w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out, **kw)


def flashinfer_row(fi, inputs, pool: torch.Tensor, fl: int, base: dict) -> dict:
    """FlashInfer on ``pool`` (its FP8 path on the FP8 pool, its bf16 path on the bf16 one)."""
    name = "flashinfer-fp8" if pool.dtype.itemsize == 1 else "flashinfer-bf16kv"
    try:
        runs = [I.flashinfer_wrapper(x, pool, fi) for x in inputs]
    except I.Unavailable as exc:
        return dict(base, variant=name, error=str(exc))
    us = graph_us(runs)
    return dict(base, variant=name, us=round(us, 2), tflops=round(fl / us / 1e6, 1))


def graph_us(runs) -> float:
    return time_graph(lambda rs=runs: [r() for r in rs], reps=20).us_median / len(runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--kv-dtypes", nargs="+", default=["float8_e4m3fn", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds per case")
    args = ap.parse_args()
    dev = torch.device("cuda")
    copy = copy_bandwidth_tbps(dev)
    cases = [CASES[n] for n in args.cases]
    pools = Pools.for_cases(cases, dev)
    fi = pools.flashinfer
    log = Rows()
    add = log.add

    for case in cases:
        inputs = [build_inputs(case, dev, seed=i, pool=pools.fp8) for i in range(placements(case))]
        ref, ref_rows = reference_subset(inputs[0], 4)
        fl = flops(case)
        for kv_name in args.kv_dtypes:
            pool = pools.of(kv_name)
            base = dict(case=case.name, kv=kv_name)
            if fi is not None:
                add(flashinfer_row(fi, inputs, pool, fl, base))
            for rnd in range(args.rounds):
                for name in args.variants:
                    try:
                        runs = [fp8mla_run(x, pool, VARIANTS[name]) for x in inputs]
                    except ValueError as exc:  # the variant cannot serve this pool
                        if rnd == 0:
                            add(dict(base, variant=name, error=str(exc)))
                        continue
                    out = runs[0]()
                    torch.cuda.synchronize()
                    err = rel_err(out[ref_rows].float(), ref) if rnd == 0 else None
                    us = graph_us(runs)
                    add(dict(base, variant=name, round=rnd, us=round(us, 2),
                             tflops=round(fl / us / 1e6, 1), rel_err=err and float(f"{err:.2e}")))  # fmt: skip
                    del runs
        del inputs
    log.write(args.json, copy_tbps=copy)
    print(f"\ncopy {copy:.2f} TB/s; µs per call (CUDA graph), TFLOP/s, rel err")
    for r in log.rows:
        print(f"{r['case']:<36} {r['kv']:<14} {r['variant']:<18} {r.get('round', ''):>2} "
              f"{r.get('us', r.get('error', ''))!s:>9} {r.get('tflops', '')!s:>7} {r.get('rel_err') or ''}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
