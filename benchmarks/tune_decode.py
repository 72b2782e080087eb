"""Tuning sweep (GPU): kernel, tile shape, warps, stages and KV splits per case.

Checks every variant against the float64 reference on the same KV bytes, times it as
``fp8mla bench`` does and prints the best per case; ``--json PATH`` keeps every measurement.
The planner's tables (``fp8mla.attention.planner``) are written from these results; the kernel
variants are the registry's (``fp8mla.attention.variants``). ``--set`` picks the sweep:
``decode`` (the default), ``many-rows`` (extend chunks, speculative tokens
and 128-head decode over FP8 KV), ``fp8-many`` (FP8 requests of more than 128 rows: the
wgmma tile against the FP8-tile kernels), ``wide-16bit`` (the same many-row tiles over a bf16
pool), ``wgmma`` (the Gluon SM90 kernel against the best Triton tiles) or ``fewrows``
(the few-row Gluon SM90 kernel's FP8 decoding and split counts against the 16-row
Triton tile).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from fp8mla.attention.config import KernelConfig
from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs, random_pool
from fp8mla.bench.measure import Timing, flops, kv_bytes, time_cuda, time_graph
from fp8mla.bench.runner import placements, reference_subset
from fp8mla.testing import rel_err


def cfgs(*specs: tuple) -> list[KernelConfig]:
    """``(block_m, block_n, warps, stages, fp8_cvt)`` tuples → ``rows`` configs."""
    return [KernelConfig(bm, bn, w, st, fp8_cvt=cvt) for bm, bn, w, st, cvt in specs]


PTX_INT = ("ptx", "int")
DECODE = [  # (case, configs, split counts); FP8 conversion × splits around one wave
    (
        Case(64, 16, 4096),
        cfgs(*[(16, 64, 8, 1, c) for c in PTX_INT], (16, 64, 8, 2, "int")),
        (2, 3, 4, 5, 6),
    ),
    (
        Case(64, 16, 4096, kv_dtype=torch.float8_e5m2),
        cfgs(*[(16, 64, 8, 1, c) for c in PTX_INT]),
        (2, 4),
    ),
    (
        Case(64, 16, 4096, kv_dtype=torch.bfloat16),
        cfgs((16, 64, 4, 2, "auto"), (16, 64, 8, 1, "auto")),
        (2, 3, 4, 6),
    ),
    (Case(1, 32, 4096), cfgs(*[(16, 64, 8, 1, c) for c in PTX_INT]), (16, 32, 64)),
    (Case(8, 16, 32768), cfgs(*[(16, 64, 8, 1, c) for c in PTX_INT]), (8, 16, 24, 33)),
    (Case(64, 128, 4096), cfgs(*[(64, 64, 8, 1, c) for c in PTX_INT]), (1, 2)),
    (Case(8, 16, 8192, qo_len=4), cfgs(*[(64, 64, 8, 1, c) for c in PTX_INT]), (8, 16, 32)),
]

ROWS64 = KernelConfig(64, 64, 8, 1)  # the 64-row tile the value split replaced for FP8


def vsplit(bm: int, bn: int, warps: int, stages: int, q_copy: bool = False) -> KernelConfig:
    return KernelConfig(bm, bn, warps, stages, variant="vsplit", q_fp16_copy=q_copy)


EXTEND = [Case(1, heads, 32768 + 4096, qo_len=4096) for heads in (128, 32)]
MANY_ROWS = [  # FP8 KV (None: the planner's split count)
    *[
        (
            case,
            [
                ROWS64,
                vsplit(128, 64, 8, 2),
                vsplit(128, 64, 8, 2, q_copy=True),
                vsplit(128, 64, 8, 1, q_copy=True),
                vsplit(128, 32, 8, 3, q_copy=True),
                vsplit(64, 32, 4, 3),
            ],
            (None,),
        )
        for case in EXTEND
    ],
    (
        Case(8, 16, 8192, qo_len=4),
        [vsplit(64, bn, 4, st) for bn in (16, 32) for st in (2, 3, 4)]
        + [KernelConfig(bm, 64, 8, 1) for bm in (64, 32, 16)],
        (8, 12, 16, 24, 32),
    ),
    (
        Case(64, 128, 4096),
        [ROWS64, vsplit(128, 64, 8, 2, q_copy=True), vsplit(64, 32, 4, 3)],
        (None,),
    ),
]
WIDE_16BIT = [  # bf16 KV: two-stage 128x64 value-split tiles need 295 KB
    (
        case,
        [ROWS64, vsplit(128, 32, 8, 2), vsplit(128, 32, 8, 1), vsplit(128, 64, 8, 1)]
        + [vsplit(64, 32, 4, 3)],
        (None,),
    )
    for case in (
        *[Case(1, c.heads, c.context, qo_len=c.qo_len, kv_dtype=torch.bfloat16) for c in EXTEND],
        Case(64, 128, 4096, kv_dtype=torch.bfloat16),
    )
]
WGMMA = [  # the Gluon kernel against the best Triton tiles, FP8 KV
    *[
        (
            case,
            [
                vsplit(128, 64, 8, 2, q_copy=True),
                KernelConfig(64, 64, 8, 1, variant="wgmma"),
                KernelConfig(64, 64, 8, 1, variant="wgmma", fp8_cvt="ptx"),
            ],
            (None,),
        )
        for case in (*EXTEND, Case(64, 128, 4096), Case(1, 128, 8192 + 2048, qo_len=2048))
    ],
    (
        Case(8, 16, 8192, qo_len=4),
        [vsplit(64, 32, 4, 3), KernelConfig(64, 64, 8, 1, variant="wgmma")]
        + [KernelConfig(64, 64, 8, 1, variant="wgmma", fp8_cvt="ptx")],
        (8, 16, 32),
    ),
]


def few(rows: int, cvt: str) -> KernelConfig:
    return KernelConfig(16 if rows <= 16 else 32, 64, 4, 1, variant="fewrows", fp8_cvt=cvt)


FEWROWS = [  # the few-row Gluon kernel (≤ 32 rows) against the 16-row Triton tile
    (
        case,
        [few(case.heads * case.qo_len, c) for c in PTX_INT] + [KernelConfig(16, 64, 8, 1)],
        splits,
    )
    for case, splits in (
        (Case(32, 32, 4096), (None, 2, 4, 8)),
        (Case(64, 16, 4096), (None, 1, 2, 4)),
        (Case(8, 32, 16384), (None, 8, 16, 32)),
        (Case(1, 32, 4096), (None, 16, 32, 64)),
        (Case(8, 16, 8192, qo_len=2), (None, 8, 16)),
    )
]
# FP8 KV, more than 128 rows a request (speculative tokens at 128 heads): the planner's wgmma
# tile against the ping-pong order on FP8 tiles (which the planner gives 65-128 rows only)
# and the FP8 × FP8 row tiles, unsplit and split
FP8_MANY = [
    (
        case,
        [
            KernelConfig(64, 64, 8, 1, variant="wgmma", fp8_cvt="ptx"),
            KernelConfig(64, 64, 4, 1, variant="pingpong8", fp8_cvt="ptx"),
            KernelConfig(32, 64, 4, 1, variant="fp8qk", fp8_cvt="ptx"),
        ],
        splits,
    )
    for case, splits in (
        (Case(64, 128, 4096, qo_len=2), (None, 1)),
        (Case(32, 128, 8192, qo_len=2), (None, 1, 2)),
        (Case(8, 128, 8192, qo_len=4), (None, 1, 2, 4)),
    )
]
SETS = {
    "decode": DECODE,
    "fp8-many": FP8_MANY,
    "many-rows": MANY_ROWS,
    "wide-16bit": WIDE_16BIT,
    "wgmma": WGMMA,
    "fewrows": FEWROWS,
}


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
    ap.add_argument("--set", default="decode", choices=sorted(SETS), help="which sweep")
    args = ap.parse_args()
    sweep = SETS[args.set]
    dev = torch.device("cuda")
    results = []
    pools: dict[torch.dtype, torch.Tensor] = {}
    for case, configs, split_counts in sweep:
        if args.cases and case.name not in args.cases.split(","):
            continue
        if case.kv_dtype not in pools:
            pools[case.kv_dtype] = random_pool(case.slots_needed(), case.kv_dtype, dev)
        inp = build_inputs(case, dev, pool=pools[case.kv_dtype])
        ref, rows = reference_subset(inp, 4)
        inputs = [inp] + [
            build_inputs(case, dev, seed=i + 1, pool=inp.pool) for i in range(placements(case) - 1)
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
                    variant=cfg.variant,
                    q_fp16_copy=cfg.q_fp16_copy,
                    cvt=cfg.fp8_cvt,
                    bm=cfg.block_m,
                    bn=cfg.block_n,
                    warps=cfg.num_warps,
                    stages=cfg.num_stages,
                    splits=splits if splits is not None else "planner",
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
    for case, _, _ in sweep:
        rs = [r for r in results if r["case"] == case.name and r["rel_err"] < 3e-3]
        for r in sorted(rs, key=lambda r: r["us"])[:3]:
            kind = r["variant"] + "/" + r["cvt"] + ("/q16" if r.get("q_fp16_copy") else "")
            print(
                f"{case.name:34} {kind:15} BM{r['bm']} BN{r['bn']} w{r['warps']} s{r['stages']} "
                f"splits {r['splits']:2}: {r['us']:8.1f} us {r['gbps']:7.0f} GB/s "
                f"{r['tflops']:6.1f} TFLOP/s err {r['rel_err']:.1e}"
            )
    bad = [r for r in results if not r["rel_err"] < 3e-3]
    print(f"{len(results)} variants, {len(bad)} over the 3e-3 error bar")
    return 0


if __name__ == "__main__":
    sys.exit(main())
