"""The seed scenario: a whole decode step's attention, 78 layers each with its own
495,552-slot FP8 pool, ``batch`` requests (1 in the seed trace) of 4,096 tokens and 32 heads,
captured in a CUDA graph."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import SEED_POOL_SLOTS, Case
from fp8mla.bench.inputs import build_inputs, random_pool
from fp8mla.bench.measure import time_graph
from fp8mla.bench.runner import BenchContext, record

SEED_IMPLS = ("fp8mla", "fp8mla-bf16kv", "full-pool-cast", "gather-then-cast", "sglang-triton")


def _layer_step(name: str, ctx: BenchContext, pools: list[torch.Tensor], inp) -> Callable[[], None]:
    """One decode step: attention of every layer over its own pool."""
    out = torch.empty_like(inp.q_nope)
    s = inp.scale
    if name == "fp8mla":
        w = I.planned_wrapper(inp, pools[0].dtype)
        views = [inp.paged(p) for p in pools]
        return lambda: [
            w.run(inp.q_nope, inp.q_pe, c, k, out=out, ckv_scale=s, kpe_scale=s) for c, k in views
        ]
    if name == "fp8mla-bf16kv":
        w = I.planned_wrapper(inp, torch.bfloat16)
        views = [inp.paged(p.to(torch.bfloat16)) for p in pools]
        return lambda: [w.run(inp.q_nope, inp.q_pe, c, k, out=out) for c, k in views]
    if name == "full-pool-cast":
        w = I.planned_wrapper(inp, torch.bfloat16)

        def step() -> None:
            for p in pools:
                c, k = inp.paged(p.to(torch.bfloat16))
                w.run(inp.q_nope, inp.q_pe, c, k, out=out, ckv_scale=s, kpe_scale=s)

        return step
    if name == "gather-then-cast":
        layer_runners = []
        for p in pools:
            inp.pool = p
            layer_runners.append(I.gather_then_cast(inp))
        return lambda: [r() for r in layer_runners]
    if name == "sglang-triton":
        module = ctx.sglang()
        layer_runners = []
        for p in pools:
            inp.pool = p
            layer_runners.append(I.sglang_triton(inp, module))
        return lambda: [r() for r in layer_runners]
    raise I.Unavailable(f"{name} is not part of the seed scenario")


def bench_seed(
    ctx: BenchContext,
    notes: list[str],
    layers: int = 78,
    heads: int = 32,
    context: int = 4096,
    pool_slots: int = SEED_POOL_SLOTS,
    batch: int = 1,
) -> None:
    goal = "<= 0.6 ms per step" if batch == 1 else "<= 2.5 ms per step"
    case = Case(batch, heads, context, pool_slots=pool_slots, goal=goal)
    pools = [random_pool(pool_slots, case.kv_dtype, ctx.device) for _ in range(layers)]
    inp = build_inputs(case, ctx.device, pool=pools[0])
    name = f"SEED_{layers}L_{case.name}"
    for impl in SEED_IMPLS:
        if impl not in ctx.impls:
            continue
        try:
            step = _layer_step(impl, ctx, pools, inp)
        except I.Unavailable as exc:
            notes.append(f"{name} {impl}: skipped ({exc})")
            continue
        t = time_graph(step)
        row = record(
            ctx, case, impl, t, None, layers=layers, us_per_layer=round(t.us_median / layers, 3)
        )
        row["case"] = name
        row["gbps"] = round(row["gbps"] * layers, 1)
        row["tflops"] = round(row["tflops"] * layers, 2)
        row["floor_us"] = round(row["floor_us"] * layers, 2)
        row["x_floor"] = round(t.us_median / row["floor_us"], 2)
        del step
        torch.cuda.empty_cache()
    del pools
    torch.cuda.empty_cache()
