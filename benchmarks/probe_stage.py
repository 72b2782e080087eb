"""FP8 pools read directly against staged once in fp16 (``plan(stage_kv=...)``), over batches
whose row tiles read each KV token from once to thousands of times, in one GPU run: error
against the float64 reference (4 requests), µs per call (CUDA-graph replays over rotated
placements as ``fp8mla bench`` times small cases; ``do_bench`` for extend chunks), whether
the plan staged, the reuse the planner computes, a bf16 pool through fp8mla, and
FlashInfer's bf16-pool path when ``FP8MLA_FLASHINFER`` names its folder. Sets the SM90
table's ``stage_min_reuse``.

    python benchmarks/probe_stage.py --json OUT/stage.json [--cases ...] [--rounds 2]
"""

from __future__ import annotations

import argparse

import torch

from fp8mla.attention.planner import stage_reuse
from fp8mla.bench.cases import Case
from fp8mla.testing import rel_err
from probe_common import Pools, Rows, fp8mla_runner, timed_us

E = 32768 + 4096
CASES = {
    c.name + (f"@{c.page_size}" if c.page_size != 1 else ""): c
    for c in (
        Case(1, 128, E, qo_len=4096),  # the extend goal: 8,192 tiles a token
        Case(1, 32, E, qo_len=4096),  # 2,048
        Case(1, 16, 8192 + 1024, qo_len=1024),  # 256
        Case(4, 16, 8192 + 256, qo_len=256),  # 64
        Case(8, 16, 8192 + 64, qo_len=64),  # 16
        Case(16, 16, 8192 + 32, qo_len=32, page_size=64),  # 8
        Case(8, 128, 8192 + 32, qo_len=32),  # 64
        Case(8, 16, 8192, qo_len=4),  # speculative: 1
        Case(64, 128, 4096),  # decode at 128 heads: 2
        Case(1, 128, E, qo_len=4096, page_size=64),  # the extend goal in pages of 64
    )
}


VARIANTS = {  # name: (pool, plan() overrides)
    "fp8-direct": ("float8_e4m3fn", dict(stage_kv=False)),
    "fp8-staged": ("float8_e4m3fn", dict(stage_kv=True)),
    "fp8-planner": ("float8_e4m3fn", {}),
    "bf16kv": ("bfloat16", {}),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds per case")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = ap.parse_args()
    dev = torch.device("cuda")
    cases = [CASES[n] for n in args.cases]
    pools = Pools.for_cases(cases, dev)
    log = Rows()
    add = log.add

    for case in cases:
        inputs, ref, ref_rows, fl = pools.case_inputs(case)
        q = [case.qo_len] * case.batch
        reuse = stage_reuse(q, [case.context] * case.batch, case.heads, 64,
                            case.batch * -(-case.context // case.page_size) * case.page_size)  # fmt: skip
        base = dict(case=case.name, page_size=case.page_size, reuse=round(reuse, 1))
        if (row := pools.flashinfer_row(inputs, pools.bf16, fl, base)) is not None:
            add(row)
        for rnd in range(args.rounds):
            for name in args.variants:
                pool, kw = pools.of(VARIANTS[name][0]), VARIANTS[name][1]
                try:
                    made = [fp8mla_runner(x, pool, **kw) for x in inputs]
                except ValueError as exc:  # e.g. the staged pages do not fit the workspace
                    add(dict(base, variant=name, round=rnd, error=str(exc)[:80]))
                    continue
                runs = [m[0] for m in made]
                out = runs[0]()
                torch.cuda.synchronize()
                err = rel_err(out[ref_rows].float(), ref) if rnd == 0 else None
                us = timed_us(runs)
                rec = dict(base, variant=name, round=rnd, us=round(us, 2),
                           tflops=round(fl / us / 1e6, 1), rel_err=err and float(f"{err:.2e}"),
                           staged=made[0][1].launch_info.staged)  # fmt: skip
                add(rec)
                del made, runs
        del inputs
    log.write(args.json)
    rows = log.rows
    print("\nµs per call, TFLOP/s, rel err, staged")
    for r in rows:
        print(f"{r['case']:<34} {r['page_size']:>3} {r['reuse']:>7} {r['variant']:<18} {r.get('round', ''):>2} "
              f"{r.get('us', r.get('error', ''))!s:>10} {r.get('tflops', '')!s:>7} "
              f"{r.get('rel_err') or '':>8} {r.get('staged', '')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
