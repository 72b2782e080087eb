"""The split merge (``kernels/merge.py``) alone, on the split plans of the decode goal cases:
the planner's launch (columns per program, splits per pass, 4 warps) beside alternatives,
each checked against a float64 merge of the same partials and timed as CUDA-graph replays of
``CALLS`` merge launches in a row (per launch: the graph's own launch latency, several µs,
is spread over them as an engine's per-step graph spreads it over its layers; the partials
stay in the L2 as they do after the attention kernel). The rate is the partials' bytes (read
once) over the time per launch.

    python benchmarks/probe_merge.py --json OUT/merge.json [--cases B32_H32_L4096 ...]

The planner's launch is marked ``*``; a row's ``err`` is the bf16 output's relative error
against the float64 merge (its own rounding is ~1.7e-3).
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from fp8mla.attention.planner import make_launch_plan, merge_block_s
from fp8mla.attention.targets import TARGETS
from fp8mla.bench.measure import time_graph
from fp8mla.kernels.portable.merge import _mla_merge_kernel
from fp8mla.testing import rel_err

# (requests, heads, context): the decode goal cases that split
CASES = [(32, 32, 4096), (64, 16, 4096), (8, 32, 16384), (1, 32, 4096)]
CALLS = 16  # merge launches per graph replay
BLOCK_D = (64, 128, 256, 512)
WARPS = (2, 4, 8)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def partials(splits: int, rows: int, device: torch.device, seed: int = 0):
    """Random normalized partials ``[splits, rows, 512]`` and base-2 LSEs ``[splits, rows]``,
    one split of every fourth row empty (LSE -inf, its partial NaN: never read into the sum)."""
    g = torch.Generator(device=device).manual_seed(seed)
    mid_o = torch.randn(splits, rows, 512, generator=g, device=device)
    mid_lse = torch.randn(splits, rows, generator=g, device=device) * 8.0
    if splits > 1:
        mid_lse[-1, ::4] = float("-inf")
        mid_o[-1, ::4] = float("nan")
    return mid_o, mid_lse


def merge64(mid_o: torch.Tensor, mid_lse: torch.Tensor) -> torch.Tensor:
    """float64 merge ``[rows, 512]``."""
    o, lse = mid_o.double(), mid_lse.double()
    live = lse > float("-inf")
    m = torch.where(live, lse, torch.full_like(lse, float("-inf"))).amax(0)
    w = torch.where(live, torch.exp2(lse - m), torch.zeros_like(lse))
    num = (w[..., None] * torch.where(live[..., None], o, torch.zeros_like(o))).sum(0)
    return num / w.sum(0)[:, None]


def merge_launch(mid_o, mid_lse, out, lse, qo, heads, per_request, block_d, block_s, warps):
    """``CALLS`` launches of the merge kernel over partials ``mid_o [splits, rows, 512]`` into
    ``out [batch, heads, 512]``, as a call without arguments (what the graph captures)."""
    splits, batch = mid_o.shape[0], out.shape[0]
    grid = (512 // block_d, per_request, batch)

    def launch():
        for _ in range(CALLS):
            _mla_merge_kernel[grid](
                mid_o, mid_lse, out, lse, qo, splits, heads, batch, mid_o.stride(0),
                mid_lse.stride(0), out.stride(0), out.stride(1), lse.stride(0), D=512,
                BLOCK_D=block_d, BLOCK_S=block_s, WRITE_LSE=True, num_warps=warps,
            )  # fmt: skip

    return launch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--cases", nargs="+", help="B{requests}_H{heads}_L{context} names")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows_out = []
    for batch, heads, context in CASES:
        name = f"B{batch}_H{heads}_L{context}"
        if args.cases and name not in args.cases:
            continue
        plan = make_launch_plan(
            batch=batch, num_heads=heads, max_qo_len=1, max_kv_len=context, sms=sms,
            max_splits_by_workspace=1 << 20, target=TARGETS["sm90"],
        )  # fmt: skip
        splits, per_request = plan.num_splits, plan.m_tiles * plan.config.block_m
        if splits == 1:
            print(f"{name}: one split, no merge")
            continue
        rows = batch * heads  # row = token × heads + head, one query token per request
        mid_o, mid_lse = partials(splits, rows, dev)
        want = merge64(mid_o, mid_lse).view(batch, heads, 512)
        out = torch.empty(batch, heads, 512, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(batch, heads, device=dev)
        qo = torch.arange(batch + 1, dtype=torch.int32, device=dev)
        planned = (plan.merge_block_d, merge_block_s(splits, plan.merge_block_d), 4)
        configs = {planned}
        for bd, nw in itertools.product(BLOCK_D, WARPS):
            for bs in {min(16, _pow2(splits)), merge_block_s(splits, bd)}:
                configs.add((bd, bs, nw))
        nbytes = mid_o.numel() * 4
        for bd, bs, nw in sorted(configs):
            launch = merge_launch(mid_o, mid_lse, out, lse, qo, heads, per_request, bd, bs, nw)
            out.zero_()
            launch()
            torch.cuda.synchronize()
            err = rel_err(out, want)
            t = time_graph(launch, reps=30)
            rec = dict(
                case=name, splits=splits, rows=rows, block_d=bd, block_s=bs, warps=nw,
                planned=(bd, bs, nw) == planned, us=round(t.us_median / CALLS, 2),
                tbps=round(nbytes * CALLS / t.us_median / 1e6, 2), err=float(f"{err:.2e}"),
            )  # fmt: skip
            rows_out.append(rec)
            print(json.dumps(rec), flush=True)
    with open(args.json, "w") as f:
        json.dump(dict(rows=rows_out), f, indent=1)
    print("\ncase                 splits  BLOCK_D BLOCK_S warps       µs   TB/s  err")
    for r in sorted(rows_out, key=lambda r: (r["case"], r["us"])):
        mark = "*" if r["planned"] else " "
        print(f"{r['case']:<20} {r['splits']:>6} {r['block_d']:>8} {r['block_s']:>7} "
              f"{r['warps']:>5} {r['us']:>8}{mark} {r['tbps']:>5} {r['err']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
