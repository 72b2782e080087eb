"""Many heads of one query token run as groups of at most 32 heads on the few-row kernels
(the FP8 × FP8 kernel at SM90), against the planner's choice for the whole request, in one
GPU run: the emulation that preceded the FP8 × FP8 kernel's row tiles
(docs/design/planner.md).

A request of 64 or 128 heads is, for the few-row kernels, 2 or 4 requests of 32 heads over
the same pages: this probe builds exactly that batch (the query and output viewed as
``[batch × groups, 32, D]``, each request's page-table entries repeated ``groups`` times,
adjacent in the grid so one request's groups read its KV close together in time) and times
it against the planner's choice for the whole request, FP8 and bf16 pools, FlashInfer's
bf16-pool path when ``FP8MLA_FLASHINFER`` names its folder. Errors against the float64
reference (4 requests); µs per call as CUDA-graph replays over rotated placements.

    python benchmarks/probe_headgroups.py --json OUT/headgroups.json [--cases ...]
"""

from __future__ import annotations

import argparse

import torch

from fp8mla.attention.functional import shared_workspace
from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper
from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from probe_common import VARIANT_COLUMNS, Pools, Rows, fp8mla_runner, measure

CASES = {c.name: c for c in (Case(64, 128, 4096), Case(8, 128, 16384), Case(64, 64, 4096))}
GROUP = 32  # heads per group: the few-row kernels' rows


def grouped_runner(inp, pool: torch.Tensor, num_splits: int | None = None):
    """fp8mla on ``inp``'s batch as ``heads / 32`` requests of 32 heads per request."""
    case = inp.case
    g = case.heads // GROUP
    dev = inp.q_nope.device
    n = case.batch * g
    pages = (inp.kv_indptr[1:] - inp.kv_indptr[:-1]).long()
    reps = pages.repeat_interleave(g)
    kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=dev)
    kv_indptr[1:] = torch.cumsum(reps, 0).to(torch.int32)
    first = inp.kv_indptr[:-1].long().repeat_interleave(g)
    shift = first - kv_indptr[:-1].long()
    pos = torch.arange(int(reps.sum()), device=dev) + shift.repeat_interleave(reps)
    kv_indices = inp.kv_indices[pos].to(torch.int32)
    kv_len = inp.kv_len.repeat_interleave(g).to(torch.int32)
    qo_indptr = torch.arange(n + 1, dtype=torch.int32, device=dev)
    w = BatchMLAPagedAttentionWrapper(shared_workspace(dev, I.WORKSPACE_BYTES), backend="triton")
    kw = {} if num_splits is None else dict(num_splits=num_splits)
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, GROUP, 512, 64, case.page_size, False,
           I.SM_SCALE, torch.bfloat16, pool.dtype, **kw)  # fmt: skip
    ckv, kpe = inp.paged(pool)
    qn = inp.q_nope.view(n, GROUP, 512)
    qp = inp.q_pe.view(n, GROUP, 64)
    out = torch.empty_like(inp.q_nope)
    ov = out.view(n, GROUP, 512)
    sc = dict(ckv_scale=inp.scale, kpe_scale=inp.scale) if pool.dtype.itemsize == 1 else {}
    return (lambda: (w.run(qn, qp, ckv, kpe, out=ov, **sc), out)[1]), w


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--kv-dtypes", nargs="+", default=["float8_e4m3fn", "bfloat16"])
    ap.add_argument("--splits", nargs="*", type=int, default=[], help="grouped: forced splits")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    dev = torch.device("cuda")
    cases = [CASES[n] for n in args.cases]
    pools = Pools.for_cases(cases, dev)
    log = Rows()
    for case in cases:
        inputs, ref, ref_rows, fl = pools.case_inputs(case)
        for kv_name in args.kv_dtypes:
            pool = pools.of(kv_name)
            base = dict(case=case.name, kv=kv_name)
            row = pools.flashinfer_row(inputs, pool, fl, base) if kv_name == "bfloat16" else None
            if row is not None:
                log.add(row)
            variants = {"whole": lambda x, p=pool: fp8mla_runner(x, p)}
            variants["groups"] = lambda x, p=pool: grouped_runner(x, p)
            for s in args.splits:
                variants[f"groups-s{s}"] = lambda x, s=s, p=pool: grouped_runner(x, p, s)
            for rnd in range(args.rounds):
                for name, make in variants.items():
                    made = [make(x) for x in inputs]
                    rec = measure(made, ref, ref_rows, rnd == 0)
                    log.add(dict(base, variant=name, round=rnd, tflops=round(fl / rec["us"] * 1e-6, 1), **rec))  # fmt: skip
                    del made
        del inputs
    log.write(args.json)
    log.print_table(
        "µs per call (CUDA graph), TFLOP/s, rel err, kernel, grid",
        [("case", -24), ("kv", -14), *VARIANT_COLUMNS],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
