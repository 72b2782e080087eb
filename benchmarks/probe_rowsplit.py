"""Speculative decode (2–8 query tokens of 16–32 heads, 33–128 rows a request) run whole by
the many-row kernels against as parts of whole tokens for the few-row kernels
(``plan(split_rows=...)``), in one GPU run: error against the float64 reference (4
requests), µs per call as CUDA-graph replays over rotated placements (as ``fp8mla bench``),
the one-token decode of the same batch, FP8 and bf16 pools, FlashInfer's bf16-pool path when
``FP8MLA_FLASHINFER`` names its folder. Sets the SM90 table's ``split_rows_parts``.

    python benchmarks/probe_rowsplit.py --json OUT/rowsplit.json [--cases ...] [--rounds 2]
"""

from __future__ import annotations

import argparse

import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs
from fp8mla.bench.runner import placements, reference_subset
from fp8mla.testing import rel_err
from probe_common import Pools, Rows, fp8mla_runner, timed_us

CASES = {
    c.name: c
    for c in (
        Case(8, 16, 8192, qo_len=4),  # the bench's speculative case: 64 rows, 2 parts
        Case(32, 32, 4096, qo_len=2),  # GLM-5 at TP2 with one draft token: 64 rows
        Case(32, 16, 4096, qo_len=3),  # 48 rows: parts of 2 and 1 tokens
        Case(8, 16, 8192, qo_len=8),  # 128 rows, 4 parts
        Case(32, 32, 4096, qo_len=4),  # 128 rows, 4 parts
        Case(64, 16, 4096, qo_len=4),  # 64 rows, 128 parts
    )
}
VARIANTS = {"whole": dict(split_rows=False), "parts": dict(split_rows=True), "planner": {}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--kv-dtypes", nargs="+", default=["float8_e4m3fn", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds per case")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cases = [CASES[n] for n in args.cases]
    pools = Pools.for_cases(cases, dev)
    log = Rows()
    add = log.add

    for case in cases:
        one = Case(case.batch, case.heads, case.context)  # the one-token decode of the batch
        for kv_name in args.kv_dtypes:
            pool = pools.of(kv_name)
            base = dict(case=case.name, kv=kv_name)
            inputs = [build_inputs(case, dev, seed=i, pool=pools.fp8) for i in range(placements(case))]  # fmt: skip
            ref, ref_rows = reference_subset(inputs[0], 4)
            if pools.flashinfer is not None and kv_name == "bfloat16":
                try:
                    fi = pools.flashinfer
                    us = timed_us([I.flashinfer_wrapper(x, pools.bf16, fi) for x in inputs])
                    add(dict(base, variant="flashinfer-bf16kv", us=round(us, 2)))
                except I.Unavailable as exc:
                    add(dict(base, variant="flashinfer-bf16kv", error=str(exc)[:80]))
            singles = [build_inputs(one, dev, seed=i, pool=pools.fp8) for i in range(placements(one))]  # fmt: skip
            us = timed_us([fp8mla_runner(x, pool)[0] for x in singles])
            add(dict(base, variant="one-token decode", us=round(us, 2)))
            for rnd in range(args.rounds):
                for name, kw in VARIANTS.items():
                    made = [fp8mla_runner(x, pool, **kw) for x in inputs]
                    runs = [m[0] for m in made]
                    out = runs[0]()
                    torch.cuda.synchronize()
                    err = rel_err(out[ref_rows].float(), ref) if rnd == 0 else None
                    launch = made[0][1]._launch
                    add(dict(base, variant=name, round=rnd, us=round(timed_us(runs), 2),
                             rel_err=err and float(f"{err:.2e}"), kernel=launch.plan.config.variant,
                             grid=list(launch.kernel.grid)))  # fmt: skip
                    del made, runs
            del inputs, singles
    log.write(args.json)
    print("\nµs per call (CUDA graph), rel err, kernel, grid")
    for r in log.rows:
        print(f"{r['case']:<32} {r['kv']:<14} {r['variant']:<18} {r.get('round', ''):>2} "
              f"{r.get('us', r.get('error', ''))!s:>9} {r.get('rel_err') or '':>8} "
              f"{r.get('kernel', '')} {r.get('grid', '')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
