"""Variants of the SM90 few-row decode kernel (``kernels/mla_fewrows.py``) on the decode goal
cases, in one GPU run: each variant's compile-time options, its error against the float64
reference (4 requests), its CUDA-graph time (as ``fp8mla bench`` times small cases: replays
over rotated token placements) and the attention kernel's own device time (profiler, eager);
FlashInfer's bf16-pool path in the same run when ``FP8MLA_FLASHINFER`` names its folder.

    python benchmarks/probe_fewrows.py --json OUT/probe.json [--variants base pf-bulk ...]

Variants named ``probe-*`` are measurements, not answers (their outputs are wrong by design):
``nomath``: the producers alone (the consumers take each tile without math); ``cached``:
every tile reads the pool's first 64 rows (the loads hit the caches); ``nostore``: the
FP8 × FP8 kernel's output stores masked off (what their bytes cost); ``noqload``: its query
staged from ones instead of loaded (the program's start without the query's loads); ``xor``: the producers
convert and store one 128-column chunk (the XOR of the four) instead of four; ``nomax``: the
online softmax without row maxima (a constant reference: what the cross-warp reduction costs).

``--trace``: instead, eager calls per case with cycle stamps (``PROBE`` bit 8, the kernels'
``_stamp``) at each partition's steps, and the median cycles of each step per tile (the few-row
kernel's steps, or the FP8 × FP8 kernel's where the variant runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch

from fp8mla.attention import planner
from fp8mla.attention.targets import Target
from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs, random_pool
from fp8mla.bench.measure import Timing, copy_bandwidth_tbps, time_graph
from fp8mla.bench.runner import placements, reference_subset
from fp8mla.testing import rel_err
from probe_common import stamp_step as _step
from probe_common import stamped_trace

CASES = [Case(32, 32, 4096), Case(64, 16, 4096), Case(8, 32, 16384), Case(1, 32, 4096)]
VARIANTS: dict[str, dict[str, int]] = {
    "default": {},  # the kernel's own choice (-1: bulk prefetch and column softmax at 32 rows)
    "col-softmax": {"COL_SOFTMAX": 1},  # the softmax on whole token columns per thread
    "row-softmax": {"COL_SOFTMAX": 0},  # in the accumulator layout (cross-warp row maxima)
    "pf-lines": {"PF_MODE": 0},
    "pf-sector": {"PF_MODE": 1},
    "pf-bulk": {"PF_MODE": 2},
    "probe-nomath": {"PROBE": 1},
    "probe-nomath-pf-bulk": {"PROBE": 1, "PF_MODE": 2},
    "probe-cached": {"PROBE": 2},
    "probe-cached-nomath": {"PROBE": 3},
    "probe-xor": {"PROBE": 4},
    "probe-nomath-xor": {"PROBE": 5},
    "probe-cached-nomath-xor": {"PROBE": 7},
    "probe-nomax": {"PROBE": 16},
    # the FP8 × FP8 kernel (kernels/mla_fp8qk.py) and its options
    "fp8qk": {"KERNEL": "fp8qk"},
    "fp8qk-3stages": {"KERNEL": "fp8qk", "STAGES": 3},
    "fp8qk-parts2": {"KERNEL": "fp8qk", "QK_PARTS": 2},
    "fp8qk-parts1": {"KERNEL": "fp8qk", "QK_PARTS": 1},
    "probe-fp8qk-nomath": {"KERNEL": "fp8qk", "PROBE": 1},
    "probe-fp8qk-cached": {"KERNEL": "fp8qk", "PROBE": 2},
    "probe-fp8qk-cached-nomath": {"KERNEL": "fp8qk", "PROBE": 3},
    "probe-fp8qk-nostore": {"KERNEL": "fp8qk", "PROBE": 16},  # the output stores masked off
    "probe-fp8qk-noqload": {"KERNEL": "fp8qk", "PROBE": 4},  # the query not loaded (ones)
    # one consumer's products left out: the value warpgroups' (V loads and P·V), the score
    # warpgroup's (Q·Kᵀ but the RoPE part): which one slows the copier's pace
    "probe-fp8qk-novalue": {"KERNEL": "fp8qk", "PROBE": 32},
    "probe-fp8qk-noscore": {"KERNEL": "fp8qk", "PROBE": 64},
    # the value warpgroups' products on a zero operand: their tensor work without V's loads
    "probe-fp8qk-nov": {"KERNEL": "fp8qk", "PROBE": 128},
    # the split merge launched after the attention kernel ends, not as its programmatic dependent
    "merge-after": {"MERGE_AFTER": 1},
    # the merge a programmatic dependent, launched when the attention grid ends (no early trigger)
    "merge-at-end": {"LAUNCH_DEPENDENTS": 0},
    # the FP8 x FP8 kernel's merge scheduled from its start (default: after its last tile is scored)
    "merge-early": {"KERNEL": "fp8qk", "LAUNCH_DEPENDENTS": 1},
    # fewer splits than the planner's (one request of 32 heads: 64 splits of one tile each)
    "fewrows-32splits": {"KERNEL": "fewrows", "SPLITS": 32},
    "fp8qk-32splits": {"KERNEL": "fp8qk", "SPLITS": 32},
    "fp8qk-16splits": {"KERNEL": "fp8qk", "SPLITS": 16},
    # the split merge in other warps and columns per program than the planner's
    "merge-1warp": {"MERGE_WARPS": 1},
    "merge-2warps": {"MERGE_WARPS": 2},
    "merge-8warps": {"MERGE_WARPS": 8},
    "merge-4warps": {"MERGE_WARPS": 4},
    "merge-64cols": {"MERGE_BLOCK_D": 64},
    "merge-128cols": {"MERGE_BLOCK_D": 128},
    "merge-256cols": {"MERGE_BLOCK_D": 256},
    "merge-512cols": {"MERGE_BLOCK_D": 512},
}


def variant_runner(inp, options: dict[str, int | str]):
    """fp8mla on ``inp`` with the kernel named by ``options["KERNEL"]`` (default: the
    planner's few-row kernel) and its compile-time ``options`` overridden."""
    options = dict(options)
    kernel = options.pop("KERNEL", None)
    plain = options.pop("MERGE_AFTER", 0)
    plan_kw: dict[str, object] = {"kernel_config": kernel} if kernel else {}
    if "SPLITS" in options:
        plan_kw["num_splits"] = options.pop("SPLITS")
    merge_opts = {k[6:]: options.pop(k) for k in list(options) if k.startswith("MERGE_")}
    saved = planner.merge_warps, planner.merge_block_d
    if "WARPS" in merge_opts:
        warps = merge_opts.pop("WARPS")
        planner.merge_warps = lambda *a: warps
    if "BLOCK_D" in merge_opts:
        block_d = merge_opts.pop("BLOCK_D")
        planner.merge_block_d = lambda *a: block_d
    dependent = Target.dependent_launch
    if plain:  # every target plans an ordinary merge launch
        Target.dependent_launch = property(lambda self: False)
    try:  # a named variant runs in its table tile, never swapped for another kernel
        w = I.planned_wrapper(inp, inp.pool.dtype, **plan_kw)
    finally:
        Target.dependent_launch = dependent
        planner.merge_warps, planner.merge_block_d = saved
    launch = w._launch
    if merge_opts:  # the merge's compile-time options, bound before the first run
        from fp8mla.attention.kernel_launcher import ArgumentBinder
        from fp8mla.attention.launch import MERGE_CALL_ARGS

        launch.merge_fixed.update(merge_opts)
        launch._merge_bind = ArgumentBinder(launch.merge, launch.merge_fixed, MERGE_CALL_ARGS)
    if launch.variant.name not in ("fewrows", "fp8qk"):
        raise SystemExit(f"{inp.case.name}: planned {launch.variant.name}, not a few-row kernel")
    launch.kernel.options.update(options)
    ckv, kpe = inp.paged()
    out = torch.empty_like(inp.q_nope)
    s = inp.scale
    return lambda: w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out, ckv_scale=s, kpe_scale=s)


def trace_case(inp, options: dict[str, int | str]) -> dict[str, float | None]:
    """Median cycles per tile of each partition's steps (middle tiles of every program), for
    the kernel ``options["KERNEL"]`` names (default: the planner's)."""
    opts = dict(options)
    kernel = opts.pop("KERNEL", None)
    w = I.planned_wrapper(inp, inp.pool.dtype, **({"kernel_config": kernel} if kernel else {}))
    variant = w._launch.variant.name
    if variant not in ("fewrows", "fp8qk"):
        raise SystemExit(f"{inp.case.name}: planned {variant}, not a few-row kernel")
    ckv, kpe = inp.paged()
    s = inp.scale
    trace = stamped_trace(
        w, lambda: w.run(inp.q_nope, inp.q_pe, ckv, kpe, ckv_scale=s, kpe_scale=s), opts,
        inp.pool.device,
    )  # fmt: skip
    steps = trace_steps_fp8qk(trace) if variant == "fp8qk" else trace_steps(trace)
    return dict(kernel=variant, **steps)


def trace_steps_fp8qk(trace: torch.Tensor) -> dict[str, float | None]:
    """Median cycles of the FP8 × FP8 kernel's steps from its stamps ``trace [programs, 4, 64,
    8]`` (part 0 the score warpgroup, 1-2 the value warpgroups, 3 the copier; events as
    ``kernels/fp8qk_score.py``, ``mla_fp8qk.py`` and ``fp8qk_stage.py`` number them): per
    tile over the middle tiles of every program, and once per program; a step no stamp
    measured is None. The score warpgroup's order is the pipelined one (the default; not
    token-group scales): tile ``j + 1``'s bytes awaited and its first products issued, tile
    ``j``'s softmax and P handoff, then the rest of tile ``j + 1``'s products."""
    t = trace.double().cpu()
    sc, v0, v1, cp = t[:, 0], t[:, 1], t[:, 2], t[:, 3]
    tiles = int((sc[:, :, 0] > 0).sum(1).max())
    last = min(tiles, 64)
    mid, nxt = slice(1, max(2, last - 1)), slice(2, max(3, last))

    end = (sc[:, :, 0] > 0).sum(1).clamp(min=1, max=64) - 1  # each program's last tile
    v0_last = v0[torch.arange(t.shape[0]), end, 1]
    return {
        "score: start -> query staged": _step(sc[:, 0, 6], sc[:, 0, 7]),
        "  score start -> value 0 start": _step(v0[:, 2, 6], sc[:, 0, 7]),
        "  value 0: start -> its query half staged": _step(v0[:, 2, 7], v0[:, 2, 6]),
        "  score start -> copier start": _step(cp[:, 0, 6], sc[:, 0, 7]),
        "  copier: start -> tile 0's page entries": _step(cp[:, 0, 3], cp[:, 0, 6]),
        "score: query staged -> tile 0 ready": _step(sc[:, 0, 0], sc[:, 0, 6]),
        "copier: tile 0 issued -> score has it": _step(sc[:, 0, 0], cp[:, 0, 2]),
        "copier: score start -> tile 0's empty wait": _step(cp[:, 0, 0], sc[:, 0, 7]),
        "score: tile j's S done -> tile j+1's bytes (wait)": _step(sc[:, nxt, 0], sc[:, mid, 1]),
        "score: tile j+1's first products issued": _step(sc[:, mid, 5], sc[:, nxt, 0]),
        "score: softmax of tile j": _step(sc[:, mid, 2], sc[:, mid, 5]),
        "score: wait for the P slot": _step(sc[:, mid, 3], sc[:, mid, 2]),
        "score: store P, arrive": _step(sc[:, mid, 4], sc[:, mid, 3]),
        "score: rest of tile j+1's S after the handoff": _step(sc[:, nxt, 1], sc[:, mid, 4]),
        "score: period": _step(sc[:, nxt, 0], sc[:, mid, 0]),
        "value 0: P ready -> P·V done": _step(v0[:, mid, 1], v0[:, mid, 0]),
        "value 0: P·V done -> next P ready (next operand built)": _step(
            v0[:, nxt, 0], v0[:, mid, 1]
        ),
        "value 1: P ready -> P·V done": _step(v1[:, mid, 1], v1[:, mid, 0]),
        "copier: wait for an empty stage": _step(cp[:, mid, 1], cp[:, mid, 0]),
        "copier: issue a tile": _step(cp[:, mid, 2], cp[:, mid, 1]),
        "copier: issued -> score has it": _step(sc[:, mid, 0], cp[:, mid, 2]),
        "copier: period": _step(cp[:, nxt, 2], cp[:, mid, 2]),
        "copier: tile j issued -> tile j+1's entries checked": _step(cp[:, nxt, 3], cp[:, mid, 2]),
        "copier: entries checked -> empty wait": _step(cp[:, mid, 0], cp[:, mid, 3]),
        "value 0: last P·V -> statistics": _step(v0[:, 0, 6], v0_last),
        "value 0: statistics -> output stored": _step(v0[:, 0, 7], v0[:, 0, 6]),
        "  statistics -> output reordered": _step(v0[:, 1, 6], v0[:, 0, 6]),
        "  reordered -> stores issued": _step(v0[:, 0, 7], v0[:, 1, 6]),
        "program: score start -> value 0 stored": _step(v0[:, 0, 7], sc[:, 0, 7]),
        "tiles per program": tiles,
    }


def trace_steps(trace: torch.Tensor) -> dict[str, float | None]:
    """Median cycles of each step from the kernel's stamps ``trace [programs, 4, 64, 8]``
    (``_stamp``: part 0 softmax, 1 value, 2-3 the producers; events as the kernel numbers
    them; the value warpgroup's epilogue at tile 0, events 6-7), over the middle tiles of
    every program; a step no stamp measured is None."""
    t = trace.double().cpu()
    programs = t.shape[0]
    sm, va, prod = t[:, 0], t[:, 1], t[:, 2:]
    tiles = int((sm[:, :, 0] > 0).sum(1).max())
    p = torch.zeros(programs, 64, 5, dtype=torch.float64)  # the producers' stamps by tile
    p[:, 0::2], p[:, 1::2] = prod[:, 0, 0::2, :5], prod[:, 1, 1::2, :5]
    mid = slice(2, max(3, min(tiles, 64) - 2))
    prev = slice(1, max(2, min(tiles, 64) - 3))
    nxt = slice(3, max(4, min(tiles, 64) - 1))
    arange = torch.arange(programs)
    last = (sm[:, :, 0] > 0).sum(1).clamp(min=1, max=64) - 1  # each program's last tile
    return {
        "period (softmax ready to ready)": _step(sm[:, nxt, 0], sm[:, mid, 0]),
        "softmax: wait for the tile": _step(sm[:, mid, 0], sm[:, prev, 3]),
        "softmax: S = K·Qᵀ": _step(sm[:, mid, 1], sm[:, mid, 0]),
        "softmax: softmax, P handed over": _step(sm[:, mid, 2], sm[:, mid, 1]),
        "  row maxima (across the four warps)": _step(sm[:, mid, 4], sm[:, mid, 1]),
        "  exp2, row sums": _step(sm[:, mid, 5], sm[:, mid, 4]),
        "  wait for the P slot": _step(sm[:, mid, 6], sm[:, mid, 5]),
        "  store P and alpha": _step(sm[:, mid, 7], sm[:, mid, 6]),
        "  fence, barrier, arrive": _step(sm[:, mid, 2], sm[:, mid, 7]),
        "softmax: O[0:256] += V·P": _step(sm[:, mid, 3], sm[:, mid, 2]),
        "value: wait for P": _step(va[:, mid, 0], va[:, prev, 1]),
        "value: O[256:512] += V·P": _step(va[:, mid, 1], va[:, mid, 0]),
        "producer: issue loads and prefetches": _step(p[:, mid, 3], p[:, mid, 0]),
        "producer: wait for the buffer": _step(p[:, mid, 1], p[:, mid, 3]),
        "producer: first chunk (its loads' wait)": _step(p[:, mid, 4], p[:, mid, 1]),
        "producer: convert and store (incl. load wait)": _step(p[:, mid, 2], p[:, mid, 1]),
        "producer: tile ready before the softmax takes it": _step(sm[:, mid, 0], p[:, mid, 2]),
        "first tile: producer start to softmax start": _step(sm[:, 0, 0], p[:, 0, 0]),
        "program: producer start to last P·V": _step(va[:, min(tiles, 64) - 1, 1], p[:, 0, 0]),
        "value: last P·V -> statistics": _step(va[:, 0, 6], va[arange, last, 1]),
        "value: statistics -> output stores issued": _step(va[:, 0, 7], va[:, 0, 6]),
        "tiles per program": tiles,
    }


def kernel_us(run) -> tuple[float | None, float | None]:
    """Device µs per call of the attention kernel and of the split merge (profiler, eager)."""
    from time_revision import kernel_times  # benchmarks/, beside this script

    times = kernel_times(run).items()
    attention = next((us for name, us in times if "fewrows" in name or "fp8qk" in name), None)
    merge = next((us for name, us in times if "merge" in name), None)
    return attention, merge


def graph_us(runs) -> Timing:
    t = time_graph(lambda rs=runs: [r() for r in rs], reps=30)
    n = len(runs)
    return Timing(t.us_median / n, t.us_p20 / n, t.us_p80 / n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--cases", nargs="+", help="case names (default: all four)")
    ap.add_argument("--trace", action="store_true", help="cycle stamps per step instead")
    ap.add_argument(
        "--kv-dtype", default="float8_e4m3fn", choices=["float8_e4m3fn", "bfloat16"],
        help="the pool's dtype (a bfloat16 pool holds the FP8 pool's values)",
    )  # fmt: skip
    args = ap.parse_args()
    kv_dtype = getattr(torch, args.kv_dtype)
    cases = [dataclasses.replace(c, kv_dtype=kv_dtype) for c in CASES]
    dev = torch.device("cuda")
    copy = copy_bandwidth_tbps(dev)
    fi = None
    if os.environ.get("FP8MLA_FLASHINFER"):
        fi = I.load_flashinfer(os.environ["FP8MLA_FLASHINFER"])
    fp8_pool = random_pool(max(c.slots_needed() for c in cases), torch.float8_e4m3fn, dev)
    bf16 = fp8_pool.to(torch.bfloat16) if fi is not None or kv_dtype != fp8_pool.dtype else None
    pool = fp8_pool if kv_dtype == fp8_pool.dtype else bf16
    rows: list[dict] = []
    if args.trace:
        for case in cases:
            if args.cases and case.name not in args.cases:
                continue
            inp = build_inputs(case, dev, seed=0, pool=pool)
            for name in args.variants:
                med = trace_case(inp, VARIANTS[name])
                rows.append(dict(case=case.name, variant=name, cycles=med))
                print(f"\n{case.name} {name} (median cycles per tile)")
                for k, v in med.items():
                    print(f"  {k:<50} {v}")
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
        return 0
    for case in cases:
        if args.cases and case.name not in args.cases:
            continue
        inputs = [build_inputs(case, dev, seed=i, pool=pool) for i in range(placements(case))]
        ref, ref_rows = reference_subset(inputs[0], 4)
        kv_bytes = case.batch * case.context * 576 * kv_dtype.itemsize
        floor_us = kv_bytes / (copy * 1e12) * 1e6  # as fp8mla bench: bytes / copy rate
        base = dict(case=case.name, floor_us=round(floor_us, 2))
        if fi is not None:
            runs = [I.flashinfer_wrapper(x, bf16, fi) for x in inputs]
            t = graph_us(runs)
            rows.append(dict(base, variant="flashinfer-bf16kv", us=round(t.us_median, 2)))
            print(json.dumps(rows[-1]), flush=True)
            del runs
        for name in args.variants:
            runs = [variant_runner(x, VARIANTS[name]) for x in inputs]
            out = runs[0]()
            torch.cuda.synchronize()
            err = None if name.startswith("probe") else rel_err(out[ref_rows].float(), ref)
            t = graph_us(runs)
            rec = dict(
                base, variant=name, options=VARIANTS[name], us=round(t.us_median, 2),
                p20=round(t.us_p20, 2), p80=round(t.us_p80, 2),
                tbps=round(kv_bytes / t.us_median / 1e6, 3),
                rel_err=err and float(f"{err:.2e}"),
            )  # fmt: skip
            rec["kernel_us"], rec["merge_us"] = kernel_us(runs[0])
            rows.append(rec)
            print(json.dumps(rec), flush=True)
            del runs
        del inputs
    with open(args.json, "w") as f:
        json.dump(dict(copy_tbps=copy, rows=rows), f, indent=1)
    print(f"\ncopy {copy:.2f} TB/s; µs (CUDA graph), attention and merge kernel µs (profiler), "
          "rel err")  # fmt: skip
    for r in rows:
        print(f"{r['case']:<28} {r['variant']:<20} {r['us']:>8} {r.get('kernel_us') or '':>8} "
              f"{r.get('merge_us') or '':>6} {r.get('rel_err') or ''}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
