"""The SM90 many-row kernels (``wgmma``: both consumer warpgroups on every tile;
``pingpong``: alternate tiles) on the many-row cases, in one GPU run, alternated A/B/A/B:
error against the float64 reference (4 requests), µs per call (CUDA-graph replays over rotated
token placements, ``do_bench`` for extend chunks, as ``fp8mla bench`` times them), TFLOP/s,
the kernel and grid that ran; FlashInfer's FP8 and bf16-pool
paths in the same run when ``FP8MLA_FLASHINFER`` names its folder.

    python benchmarks/probe_manyrows.py --json OUT/probe.json [--variants wgmma pingpong]

Variants named ``probe8-*`` are measurements, not answers (their outputs are wrong by design).
``--trace [VARIANT …]``: instead, one eager call per case and variant of the FP8 ping-pong
kernel with cycle stamps (``PROBE`` bit 8), the median cycles of each of its steps and one
program's timeline of six tiles.
"""

from __future__ import annotations

import argparse
import json
import os
from unittest import mock

import torch

from fp8mla.attention.planner import (
    FP8QK_TILE_32,
    PINGPONG8_TILE,
    PINGPONG_TILE,
    PINGPONG_TILE_64,
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
    stamp_step,
    stamped_trace,
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
    "pingpong64": (PINGPONG_TILE_64, {}),
    # the FP8 producer loading one 128-column chunk ahead instead of the whole 32-token tile
    "pingpong-chunked": (PINGPONG_TILE, {"WHOLE_TILE": False}),
    # FP8 pools: the FP8 × FP8 kernel's 32-row tiles, and the ping-pong order on FP8 tiles
    "fp8qk": (FP8QK_TILE_32, {}),
    "pingpong8": (PINGPONG8_TILE, {}),
    # its scores in eight chains of 64 latent columns instead of four of 128
    "pingpong8-parts8": (PINGPONG8_TILE, {"QK_PARTS": 8}),
    # measurements (wrong answers): without the scores' products, every tile from the pool's
    # first rows (L2 hits), without the value operands' loads
    "probe8-noscores": (PINGPONG8_TILE, {"PROBE": 1}),
    "probe8-cached": (PINGPONG8_TILE, {"PROBE": 2}),
    "probe8-nooperand": (PINGPONG8_TILE, {"PROBE": 128}),
    "probe8-noscores-nooperand": (PINGPONG8_TILE, {"PROBE": 129}),
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
        run, w = fp8mla_runner(inp, pool, kernel_config=config)
    w._launch.kernel.options.update(options)
    return run, w


def trace_pp8(inp, pool: torch.Tensor, options: dict) -> dict:
    """Cycle stamps of the FP8 ping-pong kernel (``PROBE`` bit 8) in one eager call after a
    warm-up: the median cycles of each step over the middle tiles of every program, and one
    program's timeline of six tiles (each stamp relative to the first)."""
    run, w = variant_runner(inp, pool, (PINGPONG8_TILE, options))
    kernel_options = {k: v for k, v in options.items() if k != "DEPENDENT_LAUNCH"}
    return pp8_steps(stamped_trace(w, run, kernel_options, pool.device).double().cpu())


def pp8_steps(t: torch.Tensor) -> dict:
    """Steps of ``trace [programs, 4, 64, 8]``: parts 1-2 the consumers, whose own tile ``j``
    has events 0 start, 1 its bytes landed, 2 scores done, 3 the other's maximum of ``j - 1``
    in, 4 ``P_j`` published, 5 tile ``j - 1`` applied, 6 tile ``j`` applied, and event 7 at
    tiles 0-5 the program's start, loop end, stores, its query half staged, both halves
    staged, loop start; part 3 the copier (``fp8qk_stage._copier``: 3 entries checked, 0
    before the empty wait, 1 after, 2 issued, 6 at tile 0 its start); part 0 nanoseconds
    (:func:`pp8_edges`)."""
    c0, c1, cp = t[:, 1], t[:, 2], t[:, 3]
    own = torch.zeros(t.shape[0], 64, 8, dtype=torch.float64)  # each tile's owner's stamps
    own[:, 0::2], own[:, 1::2] = c0[:, 0::2], c1[:, 1::2]
    own[:, 0:6, 7] = 0  # (the program's stamps at tiles 0-5, event 7)
    tiles = int((own[:, :, 0] > 0).sum(1).max())
    mid = slice(4, max(5, tiles - 4))
    nxt = slice(6, max(7, tiles - 2))
    prev = slice(3, max(4, tiles - 5))

    steps = {
        "period (2 tiles, one consumer)": stamp_step(own[:, nxt, 0], own[:, mid, 0]),
        "wait for the bytes": stamp_step(own[:, mid, 1], own[:, mid, 0]),
        "scores": stamp_step(own[:, mid, 2], own[:, mid, 1]),
        "wait for the other's maximum": stamp_step(own[:, mid, 3], own[:, mid, 2]),
        "softmax, publish": stamp_step(own[:, mid, 4], own[:, mid, 3]),
        "apply the other's tile": stamp_step(own[:, mid, 5], own[:, mid, 4]),
        "apply the own tile": stamp_step(own[:, mid, 6], own[:, mid, 5]),
        "own tile applied -> next own tile": stamp_step(own[:, nxt, 0], own[:, mid, 6]),
        "other published j-1 -> own softmax starts": stamp_step(own[:, mid, 3], own[:, prev, 4]),
        "publish j-1 -> publish j": stamp_step(own[:, mid, 4], own[:, prev, 4]),
        "copier: empty wait": stamp_step(cp[:, mid, 1], cp[:, mid, 0]),
        "copier: issue": stamp_step(cp[:, mid, 2], cp[:, mid, 1]),
        "copier: issued -> consumer has the bytes": stamp_step(own[:, mid, 1], cp[:, mid, 2]),
        "program: start -> loop end (consumer 0)": stamp_step(c0[:, 1, 7], c0[:, 0, 7]),
        "program: loop end -> stored (consumer 0)": stamp_step(c0[:, 2, 7], c0[:, 1, 7]),
        "tiles": tiles,
    }
    steps.update(pp8_edges(t, own, steps["period (2 tiles, one consumer)"] or 0.0, tiles))
    p = int(t.shape[0] // 2)  # one program's timeline: tiles 20-25, each consumer's stamps
    base = float(own[p, 20, 0])
    line = {}
    for j in range(20, 26):
        line[f"tile {j} (consumer {j % 2})"] = [
            round(float(own[p, j, e]) - base) if own[p, j, e] > 0 else None for e in range(7)
        ]
    return dict(steps=steps, timeline=line)


def pp8_edges(t: torch.Tensor, own: torch.Tensor, period: float, tiles: int) -> dict:
    """Where a program's time goes outside its steady tiles (medians over programs): the
    first tiles' starts and bytes' waits from the consumer's start, the copier's first
    tiles, the end; from the nanosecond stamps (part 0: consumer ``r``'s events ``4r``
    start, ``4r + 1`` loop end, ``4r + 2`` stored) the clock and the programs' spread."""
    c0, cp = t[:, 1], t[:, 3]
    start = c0[:, 0, 7]

    def med(x: torch.Tensor) -> int:
        return round(float(x.median()))

    out = {
        "consumer 0: start -> query staged": med(c0[:, 3, 7] - start),
        "consumer 0: start -> both halves staged": med(c0[:, 4, 7] - start),
        "consumer 0: start -> loop start": med(c0[:, 5, 7] - start),
        "consumer 1: start -> query staged": med(t[:, 2, 3, 7] - t[:, 2, 0, 7]),
        "consumer 1 start - consumer 0 start": med(t[:, 2, 0, 7] - start),
        "copier start - consumer 0 start": med(cp[:, 0, 6] - start),
        "copier: start -> tile 0 entries checked": med(cp[:, 0, 3] - cp[:, 0, 6]),
    }
    for j in range(4):
        out[f"start -> tile {j} start"] = med(own[:, j, 0] - start)
        out[f"tile {j}: bytes wait"] = med(own[:, j, 1] - own[:, j, 0])
        out[f"copier: start -> tile {j} issued"] = med(cp[:, j, 2] - cp[:, 0, 6])
    out["start -> tile 4 start, less 2 periods"] = med(own[:, 4, 0] - start) - 2 * period
    last = tiles - 2 - tiles % 2  # an even tile near the end (consumer 0's)
    out["mean period (tiles 4 .. last)"] = med((own[:, last, 0] - own[:, 4, 0]) / ((last - 4) / 2))
    out["start -> loop end, less (tiles / 2) periods"] = (
        med(c0[:, 1, 7] - start) - tiles / 2 * period
    )
    out["consumer 0 loop end -> consumer 1 loop end"] = med(t[:, 2, 1, 7] - c0[:, 1, 7])
    out["consumer 0: loop end -> stored"] = med(c0[:, 2, 7] - c0[:, 1, 7])
    ns = t[:, 0, 0].double()
    if bool((ns[:, 0] > 0).all()):
        wall = ns[:, 2] - ns[:, 0]
        out["clock (GHz, consumer 0 start -> stored)"] = round(
            float(((c0[:, 2, 7] - start) / wall).median()), 3
        )
        out["program wall ns: median, max"] = [med(wall), round(float(wall.max()))]
        out["programs' starts: spread ns"] = round(float(ns[:, 0].max() - ns[:, 0].min()))
        out["programs' ends: spread ns"] = round(float(ns[:, 2].max() - ns[:, 2].min()))
        out["first start -> last end ns"] = round(float(ns[:, 2].max() - ns[:, 0].min()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--variants", nargs="+", default=[v for v in VARIANTS if v != "planned"])
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--kv-dtypes", nargs="+", default=["float8_e4m3fn", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds per case")
    ap.add_argument(
        "--trace", nargs="*", metavar="VARIANT",
        help="instead: cycle stamps of the FP8 ping-pong kernel in these variants (its options)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.trace is not None:
        return trace_main(args)
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


def trace_main(args) -> int:
    """``--trace``: the FP8 ping-pong kernel's steps per case and variant, into ``--json``."""
    dev = torch.device("cuda")
    cases = [CASES[n] for n in args.cases]
    pools = Pools.for_cases(cases, dev)
    out = []
    for case in cases:
        inp = pools.case_inputs(case)[0][0]
        for name in args.trace or ["pingpong8"]:
            tile, options = VARIANTS[name]
            if tile is not PINGPONG8_TILE:
                raise SystemExit(f"{name}: not the FP8 ping-pong kernel")
            rec = dict(case=case.name, variant=name, **trace_pp8(inp, pools.fp8, options))
            out.append(rec)
            print(f"{case.name} {name}", flush=True)
            for k, v in rec["steps"].items():
                print(f"  {k:48s} {v}")
            for k, v in rec["timeline"].items():
                print(f"  {k:22s} {v}")
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
