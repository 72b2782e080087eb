"""One decode shape's fp8mla ``run()`` called a few times eagerly, for an external profiler
(Nsight Compute, compute-sanitizer) to pick its kernels from:

    ncu --clock-control none -k regex:fp8qk --launch-skip 2 -c 1 --set full \\
        python benchmarks/profile_case.py --batch 32 --heads 32 --context 4096

The pool is the bench's (495,552 random FP8 slots, page size 1, random token placement);
``--kernel`` names a registry variant instead of the planner's choice.

``--sparse CASE`` runs one sparse MLA case of the sparse bench instead (``B128_H128_K2048_Q2``,
any name ``fp8mla.bench.sparse_cases.case_from_name`` reads), on its packed pool and lists;
``--kernel`` then names ``plan()``'s sparse route (``pingpong``, ``fp8qk``, ...)::

    ncu --clock-control none -k regex:pingpong --launch-skip 2 -c 1 --set full \\
        python benchmarks/profile_case.py --sparse B128_H128_K2048_Q2 --kernel pingpong
"""

from __future__ import annotations

import argparse

import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--kv-dtype", default="float8_e4m3fn", choices=["float8_e4m3fn", "bfloat16"])
    ap.add_argument("--kernel", help="a registry variant (default: the planner's choice)")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--sparse", metavar="CASE", help="a sparse MLA case instead of a decode shape")
    args = ap.parse_args()
    if args.sparse:
        return sparse_case(args.sparse, args.kernel or "auto", args.calls)
    case = Case(args.batch, args.heads, args.context, kv_dtype=getattr(torch, args.kv_dtype))
    dev = torch.device("cuda")
    inp = build_inputs(case, dev, seed=0)
    kw = {"kernel_config": args.kernel} if args.kernel else {}
    w = I.planned_wrapper(inp, inp.pool.dtype, **kw)
    ckv, kpe = inp.paged()
    out = torch.empty_like(inp.q_nope)
    for _ in range(args.calls):
        w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out, ckv_scale=inp.scale, kpe_scale=inp.scale)
    torch.cuda.synchronize()
    print(f"{case.name}: {w.launch_info.variant}, grid {w.launch_info.grid}, "
          f"{args.calls} calls")  # fmt: skip
    return 0


def sparse_case(name: str, kernel: str, calls: int) -> int:
    from fp8mla.bench.sparse_cases import case_from_name
    from fp8mla.bench.sparse_impls import SM_SCALE, WORKSPACE_BYTES
    from fp8mla.bench.sparse_inputs import packed_pool, sparse_inputs
    from fp8mla.dsa.sparse import SparseMLAWrapper

    case = case_from_name(name)
    dev = torch.device("cuda")
    pool = packed_pool(case.pool_slots, case.page_size, dev)
    inp = sparse_inputs(case, pool)
    tokens = inp.q.shape[0]
    w = SparseMLAWrapper(torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev))
    w.plan(tokens, case.heads, case.topk, case.page_size, torch.bfloat16, SM_SCALE, kernel=kernel)
    out = torch.empty(tokens, case.heads, 512, dtype=torch.bfloat16, device=dev)
    for _ in range(calls):
        w.run(inp.q_nope, inp.q_pe, pool, inp.indices, out=out)
    torch.cuda.synchronize()
    plan = w.launch_plan
    print(f"{case.name}: {plan.kernel}, {plan.num_splits} split(s), {calls} calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
