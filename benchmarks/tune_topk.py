"""The indexer's top-k selection (``fp8mla.dsa`` two-pass path, its second pass) timed over its
table's knobs on a GPU: the path (``topk_path``: the levels, the histogram threshold and one
gathering program a row, or the digits), the candidates one program selects from
(``select_entries``: the first level's chunk and a merge's input, so the number of levels),
the warps such a program takes (``entries_per_warp``), how it finds its k-th key
(``radix_bits``: 0, two bits a step; 5 or 8, a histogram of that many bits a step), and for
the digits path its chunk and warps (``digit_chunk``, ``digit_warps``: a variant's
SELECT_ENTRIES and WARPS name them). Every variant is checked against ``topk_reference`` on
the same logits (the positions must be equal: the selection is exact, ties to the lower
position).

    python benchmarks/tune_topk.py [--json OUT.json] [--reps 30] [--cases rows1_cols131072_k2048]
                                   [--variants histogram:8192:16:0,levels:8192:16:8]

Cases: one row of 131,072 positions (GLM-5 decode at 128K, one stream: latency-bound, one
program per chunk) and 64 rows of 32,768 (DeepSeek-V3.2 decode, 64 streams), k = 2,048,
random float32 logits. Each variant is timed in a CUDA graph (median of the replays); the
table's choice for the case is marked. Prints one line per variant and a summary per case.
Each variant compiles its kernels first (5-15 s on an H200 or H100): run a few at a time with
``--variants`` where a call's time is short.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from functools import partial

import torch

from fp8mla.bench.measure import time_graph
from fp8mla.dsa import indexer_launch as L
from fp8mla.dsa.indexer_plan import select_warps, topk_plan
from fp8mla.dsa.indexer_reference import topk_reference

CASES = [(1, 131072), (64, 32768)]  # (rows, positions a row)
K = 2048
# (path, select_entries, entries_per_warp, radix_bits): the levels with 32, 16, 8 and 4 warps
# a program at each size, the histogram path with 16 warps, and both at 16 warps with the
# k-th key found by histogram steps
VARIANTS = (
    [("digits", c, c // w, 0) for c, w in ((4096, 8), (4096, 4), (2048, 4), (2048, 8), (8192, 8))]
    + [("histogram", 8192, 512, rb) for rb in (0, 5, 8)]
    + [("levels", 8192, 512, rb) for rb in (5, 8)]
    + [("levels", se, se // w, 0) for se in (8192, 16384) for w in (32, 16, 8, 4)]
)


def variant_name(path: str, se: int, epw: int, rb: int) -> str:
    return f"{path}:{se}:{se // epw}:{rb}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--reps", type=int, default=30, help="graph replays timed per variant")
    ap.add_argument("--cases", default=None, help="comma-separated case names to run")
    ap.add_argument(
        "--variants",
        default=None,
        help="comma-separated PATH:SELECT_ENTRIES:WARPS:RADIX_BITS to run (default: all)",
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    base = L.launch_for(dev)
    rows_out = []
    variants = VARIANTS
    if args.variants:
        wanted = set(args.variants.split(","))
        variants = [v for v in VARIANTS if variant_name(*v) in wanted]
        if not variants:
            ap.error(f"--variants matches none of {[variant_name(*v) for v in VARIANTS]}")
    for rows, cols in CASES:
        name = f"rows{rows}_cols{cols}_k{K}"
        if args.cases and name not in args.cases.split(","):
            continue
        gen = torch.Generator(device=dev).manual_seed(rows * 7 + cols)
        logits = torch.randn(rows, cols, device=dev, generator=gen)
        lens = torch.full((rows,), cols, dtype=torch.int32, device=dev)
        want = topk_reference(logits, lens, K)
        for path, se, epw, rb in variants:
            table = replace(base.table, select_entries=se, entries_per_warp=epw, max_warps=32,
                            topk_path=path, radix_bits=rb)  # fmt: skip
            if path == "digits":  # select_entries / entries_per_warp name its chunk and warps
                table = replace(table, digit_chunk=se, digit_warps=se // epw)
            launch = replace(base, table=table)
            plan = topk_plan(rows, cols, K, launch.sms, se)
            warps = table.digit_warps if path == "digits" else select_warps(plan.chunk, table)
            out = torch.empty(rows, K, dtype=torch.int32, device=dev)
            launches = {"histogram": 3, "digits": 5}.get(path, 1 + len(plan.levels))
            row = {"case": name, "path": path, "select_entries": se, "warps": warps,
                   "radix_bits": rb,
                   "launches": launches, "gpu": torch.cuda.get_device_name()}  # fmt: skip
            row["current"] = launch == base or (  # the knobs the table takes for this case
                path == plan.path(base.table, rows, base.sms)
                and (
                    path == "digits"  # its grids find the k-th key by digits, not radix steps
                    or table.radix_bits == base.table.radix_bits
                )
                and (
                    (table.digit_chunk, table.digit_warps)
                    == (base.table.digit_chunk, base.table.digit_warps)
                    if path == "digits"
                    else (se, warps)
                    == (base.table.select_entries, select_warps(plan.chunk, base.table))
                )
            )
            try:
                call = partial(L.topk, logits, None, lens, K, out, launch)
                call()
                row["equal"] = bool(torch.equal(out, want))
                t = time_graph(call, args.reps)
                row["us"] = round(t.us_median, 2)
            except Exception as exc:  # a build the compiler rejects: reported, the rest run
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    print("\nbest per case (equal outputs only):")
    for rows, cols in CASES:
        name = f"rows{rows}_cols{cols}_k{K}"
        ok = [r for r in rows_out if r["case"] == name and r.get("equal") and "us" in r]
        cur = [r for r in ok if r["current"]]
        if ok:
            best = min(ok, key=lambda r: r["us"])
            now = f"{cur[0]['us']} us" if cur else "not measured"
            print(f"  {name}: best {best['us']} us ({best['path']}, select_entries "
                  f"{best['select_entries']}, {best['warps']} warps, radix_bits {best['radix_bits']}, "
                  f"{best['launches']} launches); current {now}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)
    return 0 if all(r.get("equal", True) for r in rows_out) else 1


if __name__ == "__main__":
    raise SystemExit(main())
