"""The SM90 many-row kernels (``wgmma``: both consumer warpgroups on every tile;
``pingpong``: alternate tiles) on the many-row cases, in one GPU run, alternated A/B/A/B:
error against the float64 reference (4 requests), µs per call (CUDA-graph replays over rotated
token placements, ``do_bench`` for extend chunks, as ``fp8mla bench`` times them), TFLOP/s,
the kernel and grid that ran; FlashInfer's FP8 and bf16-pool
paths in the same run when ``FP8MLA_FLASHINFER`` names its folder.

    python benchmarks/probe_manyrows.py --json OUT/probe.json [--variants wgmma pingpong]

A variant is a tile (``plan(kernel_config=...)``) and compile-time options of its kernel
(``plan(kernel_options=...)``).
"""

from __future__ import annotations

import argparse
import os
from unittest import mock

import torch

from fp8mla.attention.planner import (
    FP8QK_TILE_32,
    PINGPONG8_TILE,
    PINGPONG64_TILE,
    PINGPONG_TILE,
    WGMMA_TILE,
)
from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.measure import copy_bandwidth_tbps
from probe_common import (
    VARIANT_COLUMNS,
    Pools,
    Rows,
    fp8mla_runner,
    measure,
)

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
        # two row tiles a request: 96 and 128 rows, one request of 128 heads
        Case(32, 32, 4096, qo_len=3),
        Case(8, 16, 8192, qo_len=8),
        Case(1, 128, 4096),
    )
}
# name: (tile, the kernel's compile-time options overridden)
VARIANTS = {
    "planned": (None, {}),  # the planner's choice
    "wgmma": (WGMMA_TILE, {}),
    "pingpong": (PINGPONG_TILE, {}),
    # 16-bit pools: 64-token tiles in two buffers released by column halves
    "pingpong64": (PINGPONG64_TILE, {}),
    # the FP8 producer loading one 128-column chunk ahead instead of the whole 32-token tile
    "pingpong-chunked": (PINGPONG_TILE, {"WHOLE_TILE": False}),
    # FP8 pools: the FP8 × FP8 kernel's 32-row tiles, and the ping-pong order on FP8 tiles
    "fp8qk": (FP8QK_TILE_32, {}),
    "pingpong8": (PINGPONG8_TILE, {}),
    # its scores in eight chains of 64 latent columns instead of four of 128
    "pingpong8-parts8": (PINGPONG8_TILE, {"QK_PARTS": 8}),
    # launched without the programmatic dependency (FP8MLA_DEPENDENT_LAUNCH=0 at plan())
    "pingpong8-nopdl": (PINGPONG8_TILE, {"DEPENDENT_LAUNCH": False}),
}


def variant_runner(inp, pool: torch.Tensor, variant: tuple) -> tuple[I.Runner, object]:
    """fp8mla in the variant's tile and compile-time options on ``pool`` (the option
    ``DEPENDENT_LAUNCH``: False plans it without programmatic dependent launch)."""
    config, options = variant
    options = dict(options)
    env = {}
    if "DEPENDENT_LAUNCH" in options:
        env["FP8MLA_DEPENDENT_LAUNCH"] = "1" if options.pop("DEPENDENT_LAUNCH") else "0"
    with mock.patch.dict(os.environ, env):
        return fp8mla_runner(inp, pool, kernel_config=config, kernel_options=options or None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--variants", nargs="+", default=[v for v in VARIANTS if v != "planned"])
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--kv-dtypes", nargs="+", default=["float8_e4m3fn", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds per case")
    args = ap.parse_args()
    dev = torch.device("cuda")
    copy = copy_bandwidth_tbps(dev)
    cases = [CASES[n] for n in args.cases]
    pools = Pools.for_cases(cases, dev)
    log = Rows()
    add = log.add

    for case in cases:
        inputs, ref, ref_rows, fl = pools.case_inputs(case)
        for kv_name in args.kv_dtypes:
            pool = pools.of(kv_name)
            base = dict(case=case.name, kv=kv_name)
            if (row := pools.flashinfer_row(inputs, pool, fl, base)) is not None:
                add(row)
            for rnd in range(args.rounds):
                for name in args.variants:
                    try:
                        made = [variant_runner(x, pool, VARIANTS[name]) for x in inputs]
                    except ValueError as exc:  # the variant cannot serve this pool
                        if rnd == 0:
                            add(dict(base, variant=name, error=str(exc)))
                        continue
                    rec = measure(made, ref, ref_rows, with_error=rnd == 0)
                    add(dict(base, variant=name, round=rnd, tflops=round(fl / rec["us"] / 1e6, 1), **rec))  # fmt: skip
                    del made
        del inputs
    log.write(args.json, copy_tbps=copy)
    log.print_table(
        f"copy {copy:.2f} TB/s; µs per call (CUDA graph; do_bench for extend chunks), TFLOP/s, "
        "rel err", [("case", -36), ("kv", -14), *VARIANT_COLUMNS],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
