"""Tuning sweep (GPU): kernel orientation, tile shape, warps, stages and KV splits per case.

Checks every variant against the float64 reference on the same FP8 bytes, times it with
``do_bench`` and prints the best per case; ``--json PATH`` keeps every measurement. The
planner's table (``fp8mla.ops.planner``) is written from these results.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs, random_pool
from fp8mla.bench.measure import Timing, flops, kv_bytes, time_cuda, time_graph
from fp8mla.bench.runner import reference_subset
from fp8mla.ops.planner import KernelConfig
from fp8mla.testing import rel_err


def cfgs(*specs: tuple) -> list[KernelConfig]:
    """``(block_m, block_n, warps, stages, swap_ab, fp8_cvt)`` tuples → configs."""
    return [KernelConfig(bm, bn, w, st, swap, cvt) for bm, bn, w, st, swap, cvt in specs]


PTX_INT = ("ptx", "int")
CASES = [  # (case, configs, split counts); round 3: FP8 conversion × splits around one wave
    (
        Case(64, 16, 4096),
        cfgs(*[(16, 64, 8, 1, False, c) for c in PTX_INT], (16, 64, 8, 2, False, "int")),
        (2, 3, 4, 5, 6),
    ),
    (
        Case(64, 16, 4096, kv_dtype=torch.float8_e5m2),
        cfgs(*[(16, 64, 8, 1, False, c) for c in PTX_INT]),
        (2, 4),
    ),
    (
        Case(64, 16, 4096, kv_dtype=torch.bfloat16),
        cfgs((16, 64, 4, 2, False, "auto"), (16, 64, 8, 1, False, "auto")),
        (2, 3, 4, 6),
    ),
    (Case(1, 32, 4096), cfgs(*[(16, 64, 8, 1, False, c) for c in PTX_INT]), (16, 32, 64)),
    (Case(8, 16, 32768), cfgs(*[(16, 64, 8, 1, False, c) for c in PTX_INT]), (8, 16, 24, 33)),
    (Case(64, 128, 4096), cfgs(*[(64, 64, 8, 1, False, c) for c in PTX_INT]), (1, 2)),
    (Case(8, 16, 8192, qo_len=4), cfgs(*[(64, 64, 8, 1, False, c) for c in PTX_INT]), (8, 16, 32)),
]
GRAPH_BYTES = 1 << 30


def timed(case: Case, inputs: list, cfg: KernelConfig, splits: int):
    """Median µs per call: do_bench for large cases, CUDA-graph replays over rotated token
    placements for small ones (as ``fp8mla bench`` does)."""
    runners = [I.fp8mla_direct(x, num_splits=splits, kernel_config=cfg) for x in inputs]
    if len(runners) == 1:
        return runners[0], time_cuda(runners[0])
    t = time_graph(lambda: [r() for r in runners])
    n = len(runners)
    return runners[0], Timing(t.us_median / n, t.us_p20 / n, t.us_p80 / n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="first two configs per case")
    ap.add_argument("--cases", default=None, help="comma-separated case names to run")
    args = ap.parse_args()
    dev = torch.device("cuda")
    results = []
    pools: dict[torch.dtype, torch.Tensor] = {}
    for case, configs, split_counts in CASES:
        if args.cases and case.name not in args.cases.split(","):
            continue
        if case.kv_dtype not in pools:
            pools[case.kv_dtype] = random_pool(case.slots_needed(), case.kv_dtype, dev)
        inp = build_inputs(case, dev, pool=pools[case.kv_dtype])
        ref, rows = reference_subset(inp, 4)
        rot = min(64, -(-GRAPH_BYTES // kv_bytes(case)))
        inputs = [inp] + [
            build_inputs(case, dev, seed=i + 1, pool=inp.pool) for i in range(rot - 1)
        ]
        for cfg in configs[:2] if args.quick else configs:
            for splits in split_counts:
                try:
                    run, t = timed(case, inputs, cfg, splits)
                    out = run()
                    torch.cuda.synchronize()
                    err = rel_err(out[rows].float(), ref)
                except Exception as exc:  # noqa: BLE001 - report and go on with the sweep
                    print(f"{case.name} {cfg} splits={splits}: FAILED {exc!r}"[:300])
                    continue
                r = dict(
                    case=case.name,
                    swap=cfg.swap_ab,
                    cvt=cfg.fp8_cvt,
                    bm=cfg.block_m,
                    bn=cfg.block_n,
                    warps=cfg.num_warps,
                    stages=cfg.num_stages,
                    splits=splits,
                    us=round(t.us_median, 2),
                    p20=round(t.us_p20, 2),
                    p80=round(t.us_p80, 2),
                    gbps=round(kv_bytes(case) / t.us_median / 1e3, 1),
                    tflops=round(flops(case) / t.us_median / 1e6, 1),
                    rel_err=err,
                )
                results.append(r)
                print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print("\nbest per case:")
    for case, _, _ in CASES:
        rs = [r for r in results if r["case"] == case.name and r["rel_err"] < 3e-3]
        for r in sorted(rs, key=lambda r: r["us"])[:3]:
            kind = ("swap" if r["swap"] else "rows") + "/" + r["cvt"]
            print(
                f"{case.name:34} {kind:11} BM{r['bm']} BN{r['bn']} w{r['warps']} s{r['stages']} "
                f"splits {r['splits']:2}: {r['us']:8.1f} us {r['gbps']:7.0f} GB/s "
                f"{r['tflops']:6.1f} TFLOP/s err {r['rel_err']:.1e}"
            )
    bad = [r for r in results if not r["rel_err"] < 3e-3]
    print(f"{len(results)} variants, {len(bad)} over the 3e-3 error bar")
    return 0


if __name__ == "__main__":
    sys.exit(main())
