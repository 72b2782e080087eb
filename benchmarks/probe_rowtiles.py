"""FP8 requests of more than 32 query rows (64–128 heads, speculative tokens, short extend
chunks) on the FP8 × FP8 kernel in 32-row tiles against the wgmma kernel's 64-row tiles, in
one GPU run, alternated: error against the float64 reference (4 requests), µs per call as CUDA-graph
replays over rotated placements (as ``fp8mla bench``), TFLOP/s; the bf16 pool through fp8mla
and FlashInfer's bf16-pool path (when ``FP8MLA_FLASHINFER`` names its folder) beside them.
Sets the SM90 table's ``row_tiles_fp8``.

    python benchmarks/probe_rowtiles.py --json OUT/rowtiles.json [--cases ...] [--rounds 2]
"""

from __future__ import annotations

import argparse

import torch

from fp8mla.bench.cases import Case
from probe_common import VARIANT_COLUMNS, Pools, Rows, fp8mla_runner, measure, timed_us

CASES = {
    c.name: c
    for c in (
        Case(64, 128, 4096),
        Case(8, 128, 16384),
        Case(64, 64, 4096),
        Case(1, 128, 4096),
        Case(8, 16, 8192, qo_len=4),  # the bench's speculative case: 64 rows
        Case(32, 32, 4096, qo_len=2),
        Case(8, 16, 8192, qo_len=8),
        Case(8, 16, 8192, qo_len=16),  # 256 rows: row tiles read each token 8 times
        Case(8, 16, 8192, qo_len=32),  # 512 rows (64-row tiles: reuse 8, not staged)
        Case(1, 128, 32768 + 4096, qo_len=4096),  # an extend chunk, unstaged (CUDA graphs)
    )
}
VARIANTS = {
    "wgmma": dict(kernel_config="wgmma", stage_kv=False),
    "fp8qk-tiles": dict(kernel_config="fp8qk", stage_kv=False),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds per case")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cases = [CASES[n] for n in args.cases]
    pools = Pools.for_cases(cases, dev)
    log = Rows()
    for case in cases:
        inputs, ref, ref_rows, fl = pools.case_inputs(case)
        base = dict(case=case.name)

        def add(variant: str, us: float, base=base, fl=fl, **extra: object) -> None:
            log.add(dict(base, variant=variant, us=round(us, 2), tflops=round(fl / us * 1e-6, 1), **extra))  # fmt: skip

        if (row := pools.flashinfer_row(inputs, pools.bf16, fl, base)) is not None:
            log.add(row)
        add("fp8mla-bf16kv", timed_us([fp8mla_runner(x, pools.bf16)[0] for x in inputs]))
        for rnd in range(args.rounds):
            for name, kw in VARIANTS.items():
                made = [fp8mla_runner(x, pools.fp8, **kw) for x in inputs]
                rec = measure(made, ref, ref_rows, rnd == 0)
                add(name, rec.pop("us"), round=rnd, **rec)
                del made
        del inputs
    log.write(args.json)
    log.print_table(
        "µs per call (CUDA graph), TFLOP/s, rel err, kernel, grid",
        [("case", -32), *VARIANT_COLUMNS],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
