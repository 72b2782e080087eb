"""Time one source revision of fp8mla on fixed decode cases (GPU), for before/after comparisons
of a change in the same device session: run it once per revision (``PYTHONPATH`` pointing at
that revision's ``src``) and compare the JSON files.

    python benchmarks/time_revision.py --label after --json OUT/after.json [--triton-tiles]
    python benchmarks/time_revision.py --sparse [CASES] --label after --json OUT/after.json

``--triton-tiles`` runs FP8 batches of up to 32 rows in the Triton 16-row tile an older planner
chose (``kernel_config="rows"``), so that a kernel change is timed on the same tile. Cases are
timed as ``fp8mla bench`` times them (CUDA-graph replays over rotated token placements for
small ones), with the same seeds in every revision.

``--sparse`` times sparse MLA instead (``fp8mla.SparseMLAWrapper`` as ``plan()`` chooses, on the
sparse bench's packed pool and index lists; default cases B128_H16_K2048, B128_H128_K2048,
B1_H32_K2048; other shapes by name, e.g. B128_H64_K2048, or T4096_H128_K2048_C32768: a
chunk whose lists come from its own 32K-token context): ten calls alternating two index
lists per CUDA-graph replay, each row with the relative error of its first tokens against the
float64 reference, so that a revision that times well but answers wrong shows in the same
file, and the same for lists with -1 entries, a ``topk_length`` and an empty row
(``edge_rel_err``, ``empty_row_ok``; one eager call). ``--sparse-lists in-place|compacted``
forces how the SM90 path reads the index lists (``sparse_sm90.plans_lists``; default: as the
plan decides), for revisions that have the choice; ``--sparse-kernel`` names ``plan()``'s
kernel (``pingpong8``: the SM90 FP8 ping-pong kernel's route, which the table does not choose).
Each sparse row also names the GPU, the date and the torch and Triton versions, which
``ab_sparse.py`` puts into the records it appends.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton

from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs, random_pool
from fp8mla.bench.measure import Timing, time_cuda, time_graph
from fp8mla.bench.runner import placements

CASES = [
    Case(64, 16, 4096),
    Case(32, 32, 4096),
    Case(1, 32, 4096),
    Case(64, 128, 4096),
    Case(8, 16, 8192, qo_len=4),
    Case(64, 16, 4096, kv_dtype=torch.bfloat16),
    Case(32, 32, 4096, kv_dtype=torch.bfloat16),
]


def runner(inp, triton_tiles: bool):
    kw = {}
    rows = inp.case.heads * inp.case.qo_len
    if triton_tiles and inp.case.kv_dtype.itemsize == 1 and rows <= 32:
        kw["kernel_config"] = "rows"
    return I.fp8mla_direct(inp, **kw)


def kernel_times(run, calls: int = 20) -> dict[str, float]:
    """Device µs per call of each kernel ``run`` launches (torch profiler, eager calls)."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0))
        if us > 0 and e.count >= calls:
            out[e.key[:48]] = round(us / calls, 2)
    return out


SPARSE_CASES = "B128_H16_K2048,B128_H128_K2048,B1_H32_K2048"


def edge_check(w, inp, pool, n: int) -> dict:
    """The planned route on edited copies of the first ``n`` tokens' lists against float64
    (one eager call, not timed): every seventh entry -1, token 0 limited by ``topk_length`` to
    three quarters of its list, and token 1 (when there is one) all -1, which must give out 0
    and LSE +inf. The timed lists hold no -1 entry; this puts the masking of every timed
    route in the same file as its times."""
    from fp8mla.bench.sparse_impls import SM_SCALE
    from fp8mla.dsa.reference import sparse_mla_reference
    from fp8mla.testing import rel_err

    topk = inp.indices.shape[1]
    idx = inp.indices.clone()
    idx[:, 3::7] = -1
    if n > 1:
        idx[1] = -1
    length = torch.full((idx.shape[0],), topk, dtype=torch.int32, device=idx.device)
    length[0] = max(1, topk - topk // 4)
    out, lse = w.run(inp.q_nope, inp.q_pe, pool, idx, topk_length=length, return_lse=True)
    ref_o, ref_l = sparse_mla_reference(
        inp.q_nope[:n], inp.q_pe[:n], pool, idx[:n], SM_SCALE, topk_length=length[:n]
    )
    rows = [t for t in range(n) if t != 1]
    empty_ok = n < 2 or bool((out[1] == 0).all() and torch.isposinf(lse[1]).all())
    return dict(edge_rel_err=float(f"{rel_err(out[rows], ref_o[rows]):.3g}"),
                edge_lse_rel_err=float(f"{rel_err(lse[rows], ref_l[rows]):.3g}"),
                empty_row_ok=empty_ok)  # fmt: skip


def sparse_rows(label: str, names: str, check_tokens: int = 8, kernel: str = "auto") -> list[dict]:
    """Each sparse case of ``names`` (comma-separated: the bench's cases or any name of their
    form, ``fp8mla.bench.sparse_cases.case_from_name``): µs a call, TB/s of
    packed bytes, TFLOP/s and the relative error of the first ``check_tokens`` tokens."""
    from fp8mla.bench.sparse_cases import SPARSE_CASES as ALL
    from fp8mla.bench.sparse_cases import case_from_name, packed_bytes, sparse_flops
    from fp8mla.bench.sparse_impls import SM_SCALE, WORKSPACE_BYTES
    from fp8mla.bench.sparse_inputs import packed_pool, sparse_inputs
    from fp8mla.dsa.reference import sparse_mla_reference
    from fp8mla.dsa.sparse import SparseMLAWrapper
    from fp8mla.testing import rel_err

    known = {c.name: c for c in ALL}
    try:
        cases = [known.get(name) or case_from_name(name) for name in names.split(",")]
    except ValueError as e:
        raise SystemExit(f"{e}; the bench's cases: {list(known)}") from None
    dev = torch.device("cuda")
    env = dict(gpu=torch.cuda.get_device_name(dev), date=time.strftime("%Y-%m-%d"),
               torch=torch.__version__, triton=triton.__version__)  # fmt: skip
    pool = packed_pool(cases[0].pool_slots, cases[0].page_size, dev)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
    rows = []
    for case in cases:
        inp = sparse_inputs(case, pool)
        other = sparse_inputs(case, pool, seed=7).indices
        tokens = inp.q.shape[0]
        w = SparseMLAWrapper(workspace, use_cuda_graph=True)
        w.plan(
            tokens, case.heads, case.topk, case.page_size, torch.bfloat16, SM_SCALE, kernel=kernel
        )
        out = torch.empty(tokens, case.heads, 512, dtype=torch.bfloat16, device=dev)
        _, lse = w.run(inp.q_nope, inp.q_pe, pool, inp.indices, out=out, return_lse=True)
        n = min(check_tokens, tokens)
        ref_o, ref_l = sparse_mla_reference(
            inp.q_nope[:n], inp.q_pe[:n], pool, inp.indices[:n], SM_SCALE
        )
        err, lse_err = rel_err(out[:n], ref_o), rel_err(lse[:n], ref_l)
        edge = edge_check(w, inp, pool, n)

        def calls(w=w, inp=inp, other=other, out=out):
            for i in range(10):
                w.run(inp.q_nope, inp.q_pe, pool, other if i % 2 else inp.indices, out=out)

        t = time_graph(calls, reps=30)
        us = t.us_median / 10
        rows.append(dict(label=label, case=case.name, us=round(us, 2),
                         p20=round(t.us_p20 / 10, 2), p80=round(t.us_p80 / 10, 2),
                         tbps=round(packed_bytes(case) / us / 1e6, 3),
                         tflops=round(sparse_flops(case) / us / 1e6, 1),
                         rel_err=float(f"{err:.3g}"), lse_rel_err=float(f"{lse_err:.3g}"),
                         **edge,
                         kernel=w.launch_plan.kernel, splits=w.launch_plan.num_splits,
                         **env))  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--triton-tiles", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="also each kernel's device time")
    ap.add_argument("--sparse", nargs="?", const=SPARSE_CASES, default=None, metavar="CASES",
                    help="time sparse MLA cases instead (default: %(const)s)")  # fmt: skip
    ap.add_argument("--sparse-lists", choices=("plan", "in-place", "compacted"), default="plan",
                    help="how the SM90 sparse path reads the index lists")  # fmt: skip
    ap.add_argument(
        "--sparse-kernel",
        default="auto",
        help="plan()'s kernel for the sparse cases (auto, portable, fp8qk, pingpong8, pingpong)",
    )
    args = ap.parse_args()
    if args.sparse_lists != "plan":
        from fp8mla.dsa import sparse_sm90

        forced = args.sparse_lists == "in-place"
        sparse_sm90.plans_lists = lambda *plan_shape: forced
    if args.sparse:
        rows = sparse_rows(args.label, args.sparse, kernel=args.sparse_kernel)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        return 0
    dev = torch.device("cuda")
    pools: dict[torch.dtype, torch.Tensor] = {}
    rows = []
    for case in CASES:
        if case.kv_dtype not in pools:
            pools.clear()
            torch.cuda.empty_cache()
            pools[case.kv_dtype] = random_pool(case.slots_needed(), case.kv_dtype, dev)
        inputs = [
            build_inputs(case, dev, seed=i, pool=pools[case.kv_dtype])
            for i in range(placements(case))
        ]
        runs = [runner(x, args.triton_tiles) for x in inputs]
        if len(runs) == 1:
            t = time_cuda(runs[0])
        else:
            g = time_graph(lambda rs=runs: [r() for r in rs], reps=40)
            t = Timing(g.us_median / len(runs), g.us_p20 / len(runs), g.us_p80 / len(runs))
        rows.append(dict(label=args.label, case=case.name, us=round(t.us_median, 2),
                         p20=round(t.us_p20, 2), p80=round(t.us_p80, 2)))  # fmt: skip
        if args.kernels:
            rows[-1]["kernels"] = kernel_times(runs[0])
        print(json.dumps(rows[-1]), flush=True)
        del runs, inputs
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
