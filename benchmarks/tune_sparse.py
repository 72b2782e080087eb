"""Time sparse MLA tiles, FP8 decodings and split counts on this GPU (the table's candidates).

    python benchmarks/tune_sparse.py [--cases B128_H16_K2048,B1_H32_K2048] [--json OUT.json]

For each case: the planner's choice, then every candidate of ``CANDIDATES`` for its head count
(with the integer and, on SM89+, the ``cvt`` e4m3 decoding), each at the planner's split count
and, for a few query tokens, at half and double of it, timed with ``do_bench`` (L2 flushed) on the bench's pool and
index lists; the fastest per case is printed last. Results inform ``dsa/sparse_plan.py``'s
tables; nothing here changes them.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from fp8mla.bench.measure import time_cuda
from fp8mla.bench.sparse_cases import SPARSE_CASES, packed_bytes, sparse_flops
from fp8mla.bench.sparse_impls import SM_SCALE, WORKSPACE_BYTES
from fp8mla.bench.sparse_inputs import packed_pool, sparse_inputs
from fp8mla.dsa.sparse import SparseMLAWrapper
from fp8mla.dsa.sparse_plan import SparseTile

# candidates by the heads they serve (block_h, block_n, warps, stages, occupancy, value
# split): the table's tile first, then the others that spill at most 128 B a thread on SM90
# under Triton 3.6 (wider KV steps, 8 warps, a third stage, two head groups of 16 rows)
CANDIDATES = {
    16: [(16, 32, 4, 2, 3, 1), (16, 32, 4, 3, 2, 1), (16, 32, 8, 2, 1, 1), (16, 32, 8, 3, 2, 1),
         (16, 64, 8, 2, 1, 1), (16, 64, 8, 3, 1, 1), (16, 16, 4, 3, 3, 1), (16, 16, 8, 2, 1, 1)],
    32: [(32, 32, 8, 2, 1, 1), (32, 16, 8, 2, 1, 1), (32, 16, 8, 3, 1, 1), (32, 32, 8, 3, 1, 1),
         (32, 64, 8, 2, 1, 1), (32, 16, 4, 3, 2, 1), (16, 32, 4, 3, 2, 1), (16, 32, 4, 2, 3, 1)],
    128: [(128, 16, 8, 2, 1, 2), (64, 16, 4, 3, 2, 2), (64, 16, 8, 3, 1, 2), (64, 32, 8, 2, 1, 2)],
}  # fmt: skip
# a split count of half and twice the planner's is tried for cases of at most this many
# query tokens (larger batches fill the GPU without splits)
SPLIT_TRIAL_TOKENS = 8


def candidates(heads: int) -> list[SparseTile]:
    key = 16 if heads <= 16 else 32 if heads <= 32 else 128
    return [SparseTile(*c[:4], occupancy=c[4], value_split=c[5]) for c in CANDIDATES[key]]


def time_one(inp, tile, cvt, splits):
    case = inp.case
    w = SparseMLAWrapper(torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"))
    w.plan(case.tokens, case.heads, case.topk, case.page_size, torch.bfloat16, SM_SCALE,
           tile=tile, num_splits=splits, fp8_cvt=cvt)  # fmt: skip
    out = torch.empty(case.tokens, case.heads, 512, dtype=torch.bfloat16, device="cuda")
    run = lambda: w.run(inp.q_nope, inp.q_pe, inp.pool, inp.indices, out=out)  # noqa: E731
    run()
    return time_cuda(run).us_median, w.launch_plan


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="B128_H16_K2048,B1_H32_K2048,B128_H128_K2048_Q2")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    wanted = args.cases.split(",")
    cases = [c for c in SPARSE_CASES if c.name in wanted]
    pool = packed_pool(cases[0].pool_slots, cases[0].page_size, torch.device("cuda"))
    # the integer moves and, where the GPU decodes e4m3 (SM89+), ``cvt``; "auto" is the table's
    cvts = ["int"] + (["ptx"] if torch.cuda.get_device_capability() >= (8, 9) else [])
    rows, best = [], {}
    for case in cases:
        inp = sparse_inputs(case, pool)
        base_us, plan = time_one(inp, None, "auto", None)
        trials = [(None, "auto", base_us, plan)]
        for tile in candidates(case.heads):
            for cvt in cvts:
                try:
                    us, p0 = time_one(inp, tile, cvt, None)
                    trials.append((tile, cvt, us, p0))
                    tries = {max(1, p0.num_splits // 2), p0.num_splits * 2}
                    for splits in tries if case.tokens <= SPLIT_TRIAL_TOKENS else ():
                        if splits != p0.num_splits:
                            trials.append((tile, cvt, *time_one(inp, tile, cvt, splits)))
                except Exception as exc:  # noqa: BLE001 - a tile that cannot run here
                    print(f"{case.name} {tile.name} {cvt}: {exc}", file=sys.stderr)
        for tile, cvt, us, pl in trials:
            row = dict(case=case.name, tile=pl.tile.name, cvt=cvt, splits=pl.num_splits,
                       us=round(us, 2), tbps=round(packed_bytes(case) / us / 1e6, 3),
                       tflops=round(sparse_flops(case) / us / 1e6, 1),
                       planner=tile is None)  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        best[case.name] = min((r for r in rows if r["case"] == case.name), key=lambda r: r["us"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("fastest per case:")
    for name, r in best.items():
        print(f"  {name}: {r['tile']} cvt={r['cvt']} splits={r['splits']}: {r['us']} us, "
              f"{r['tbps']} TB/s, {r['tflops']} TFLOP/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
