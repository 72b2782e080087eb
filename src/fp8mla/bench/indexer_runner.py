"""``fp8mla bench --sections indexer``: the lightning indexer (logits + top-k) beside vLLM's
Triton fallback on the same inputs, and the whole DSA layer beside dense fp8mla decode; one
JSON line per (case, implementation).

Cases that read more than ``GRAPH_BYTES`` of keys are timed with ``do_bench`` (L2 flushed
before each call); smaller ones as CUDA-graph replays cycling through ``LAYER_ROTATIONS``
requests on different pages, so that their keys come from memory, not from the L2. Each
implementation is checked on the first and last rows against float64 scores of the same bytes:
``rel_err`` for logits (largest error over the row's largest |logit|), ``topk_overlap`` for
positions (the fraction of the float64 top-k chosen).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from fp8mla.bench import indexer_impls as X
from fp8mla.bench.impls import Unavailable
from fp8mla.bench.indexer_cases import (
    LAYER_CASE,
    LAYER_ROTATIONS,
    IndexerCase,
    key_bytes,
    logits_bytes,
    logits_flops,
)
from fp8mla.bench.indexer_inputs import IndexerInputs, index_cache, indexer_inputs
from fp8mla.bench.measure import Timing, time_cuda, time_graph
from fp8mla.bench.runner import Environment
from fp8mla.dsa.indexer_reference import paged_mqa_logits_reference

INDEXER_IMPLS = ("fp8mla", "fp8mla-fused", "fp8mla-two-pass", "fp8mla-logits", "vllm-triton",
                 "vllm-triton-logits")  # fmt: skip
LAYER_IMPLS = ("fp8mla-dsa", "fp8mla-dense")
GRAPH_BYTES = 64 << 20  # cases reading fewer key bytes are timed as CUDA-graph replays


@dataclass
class IndexerContext:
    env: Environment
    device: torch.device
    impls: Sequence[str] = INDEXER_IMPLS
    vllm_path: str | None = None
    records: list[dict] = field(default_factory=list)
    _vllm: object = None

    def vllm(self):
        if self._vllm is None:
            self._vllm = X.load_vllm_indexer(self.vllm_path)
        return self._vllm


def make_runner(name: str, inp: IndexerInputs, ctx: IndexerContext) -> X.Runner:
    if name == "fp8mla":
        return X.fp8mla_topk(inp)
    if name == "fp8mla-fused":
        return X.fp8mla_topk(inp, fused=True)
    if name == "fp8mla-two-pass":
        return X.fp8mla_topk(inp, fused=False)
    if name == "fp8mla-logits":
        return X.fp8mla_logits(inp)
    if name == "vllm-triton":
        return X.vllm_topk(inp, ctx.vllm())
    if name == "vllm-triton-logits":
        return X.vllm_logits(inp, ctx.vllm())
    raise ValueError(f"expected an implementation in {INDEXER_IMPLS}, got {name!r}")


def indexer_record(ctx: IndexerContext, case: IndexerCase, impl: str, t: Timing,
                   **extra: object) -> dict:  # fmt: skip
    """One JSON line: time, key bytes read per second, the floor (keys at the copy bandwidth)
    and the logits' size (what the fused path does not write)."""
    env = ctx.env
    secs = t.us_median * 1e-6
    nbytes = key_bytes(case)
    floor_us = nbytes / (env.copy_tbps * 1e12) * 1e6
    row = {
        "section": "indexer", "gpu": env.gpu, "date": env.date, "torch": env.torch,
        "triton": env.triton, "case": case.name, "batch": case.batch, "next_n": case.next_n,
        "heads": case.heads, "context": case.context, "k": case.k, "impl": impl,
        "us_median": round(t.us_median, 3), "us_p20": round(t.us_p20, 3),
        "us_p80": round(t.us_p80, 3), "gbps": round(nbytes / secs / 1e9, 1),
        "tflops": round(logits_flops(case) / secs / 1e12, 2), "floor_us": round(floor_us, 2),
        "x_floor": round(t.us_median / floor_us, 2), "logits_bytes": logits_bytes(case),
        "copy_tbps": round(env.copy_tbps, 3), "goal": case.goal, "run": env.run,
    }  # fmt: skip
    row.update(extra)
    ctx.records.append(row)
    return row


def rotations(case: IndexerCase) -> int:
    return 1 if key_bytes(case) >= GRAPH_BYTES else LAYER_ROTATIONS


def case_inputs(case: IndexerCase, device: torch.device, count: int) -> list[IndexerInputs]:
    """``count`` calls of the case on disjoint pages of one cache."""
    per = -(-case.context // case.page_size)
    cache = index_cache(count * case.batch * per + 1, case.page_size, device)
    perm = torch.randperm(cache.shape[0], device=device)
    step = case.batch * per
    return [indexer_inputs(case, cache, seed=i, pages=perm[i * step : (i + 1) * step]
                           .view(case.batch, per)) for i in range(count)]  # fmt: skip


def check(inp: IndexerInputs, out: torch.Tensor, logits: bool) -> dict:
    """The first and last rows against float64 scores of the same bytes."""
    c = inp.case
    picks = sorted({0, c.batch - 1})
    rows = [b * c.next_n + n for b in picks for n in range(c.next_n)]
    sel = torch.tensor(picks, device=inp.q.device)
    ref = paged_mqa_logits_reference(inp.q[sel], inp.weights.view(c.batch, c.next_n, -1)[sel]
                                     .flatten(0, 1), inp.cache, inp.block_table[sel],
                                     inp.lens[sel], c.context)  # fmt: skip
    got = out[rows]
    if logits:
        fin = torch.isfinite(ref)
        err = (got.double() - ref).abs().masked_fill(~fin, 0).amax(1)
        scale = ref.abs().masked_fill(~fin, 0).amax(1).clamp_min(1e-30)
        return {"rel_err": float(f"{float((err / scale).max()):.3e}")}
    want = torch.topk(ref, c.k, dim=-1).indices
    overlap = []
    for i in range(len(rows)):
        a = set(got[i][got[i] >= 0].tolist())
        overlap.append(len(a & set(want[i].tolist())) / want.shape[1])
    return {"topk_overlap": round(min(overlap), 5)}


def time_runners(runners: list[X.Runner]) -> tuple[Timing, str]:
    """One CUDA graph replaying every runner (per-call time), or ``do_bench`` of one runner;
    a runner that cannot be captured is timed eagerly."""
    if len(runners) > 1:
        try:
            t = time_graph(lambda: [r() for r in runners])
            n = len(runners)
            return Timing(t.us_median / n, t.us_p20 / n, t.us_p80 / n), f"cuda-graph x{n}"
        except Exception:  # noqa: BLE001 - not capturable: timed eagerly instead
            torch.cuda.synchronize()
    return time_cuda(runners[0]), "do_bench"


def bench_indexer_case(ctx: IndexerContext, case: IndexerCase, notes: list[str]) -> None:
    inputs = case_inputs(case, ctx.device, rotations(case))
    for name in ctx.impls:
        try:
            runners = [make_runner(name, x, ctx) for x in inputs]
            out = runners[0]()
            torch.cuda.synchronize()
        except Unavailable as exc:
            notes.append(f"{case.name} {name}: skipped ({exc})")
            continue
        acc = check(inputs[0], out, name.endswith("logits"))
        t, how = time_runners(runners)
        indexer_record(ctx, case, name, t, timing=how, **acc)
        if len(runners) > 1:  # eager too: the launches' cost outside a graph
            indexer_record(ctx, case, name, time_cuda(runners[0]), timing="do_bench", **acc)
        del runners, out
        torch.cuda.empty_cache()
    del inputs
    gc.collect()
    torch.cuda.empty_cache()


def bench_dsa_layer(ctx: IndexerContext, notes: list[str], case: IndexerCase = LAYER_CASE) -> None:
    """The DSA layer (indexer + sparse attention over the packed MLA cache) beside dense fp8mla
    decode over the whole context, both as CUDA-graph replays over ``LAYER_ROTATIONS``
    requests, and each part of the DSA layer alone."""
    from fp8mla.bench.cases import Case
    from fp8mla.bench.impls import fp8mla_direct
    from fp8mla.bench.inputs import build_inputs, random_pool
    from fp8mla.bench.sparse_inputs import packed_pool

    dev = ctx.device
    inputs = case_inputs(case, dev, LAYER_ROTATIONS)
    pages = inputs[0].cache.shape[0]
    pool = packed_pool(pages * case.page_size, case.page_size, dev)
    g = torch.Generator(device=dev).manual_seed(7)
    q_mla = [torch.randn(case.rows, case.heads, 576, generator=g, device=dev).to(torch.bfloat16)
             for _ in inputs]  # fmt: skip
    layers = {
        "fp8mla-dsa": [X.fp8mla_dsa(x, pool, q) for x, q in zip(inputs, q_mla)],
        "fp8mla-dsa-indexer": [X.fp8mla_topk(x) for x in inputs],
    }
    for name, runners in layers.items():
        t, how = time_runners(runners)
        indexer_record(ctx, case, name, t, timing=how)
        indexer_record(ctx, case, name, time_cuda(runners[0]), timing="do_bench")
    del layers, pool
    gc.collect()
    torch.cuda.empty_cache()
    dense = Case(case.batch, case.heads, case.context, page_size=case.page_size,
                 pool_slots=LAYER_ROTATIONS * case.batch * case.context + case.page_size)  # fmt: skip
    kv = random_pool(dense.slots_needed(), dense.kv_dtype, dev)
    runners = [fp8mla_direct(build_inputs(dense, dev, seed=i, pool=kv))
               for i in range(LAYER_ROTATIONS)]  # fmt: skip
    t, how = time_runners(runners)
    indexer_record(ctx, case, "fp8mla-dense", t, timing=how, dense_case=dense.name)
    indexer_record(ctx, case, "fp8mla-dense", time_cuda(runners[0]), timing="do_bench",
                   dense_case=dense.name)  # fmt: skip
    for r in ctx.records[-6:]:
        r["case"] = f"DSA_{case.name}"
    notes.append(f"DSA_{case.name}: fp8mla-dsa = paged_topk (k={case.k}, slots) + sparse_mla over "
                 f"the packed cache; fp8mla-dense = decode over all {case.context} FP8 tokens")  # fmt: skip
    del runners, kv
    gc.collect()
    torch.cuda.empty_cache()


def run_indexer(
    ctx: IndexerContext,
    cases: Sequence[IndexerCase],
    notes: list[str],
    on_case: Callable[[str], None] | None = None,
    layer: bool = True,
) -> None:
    """Every case, then the DSA layer; ``on_case(name)`` after each (progress, saving)."""
    for case in cases:
        bench_indexer_case(ctx, case, notes)
        if on_case:
            on_case(case.name)
    if layer:
        bench_dsa_layer(ctx, notes)
        if on_case:
            on_case(f"DSA_{LAYER_CASE.name}")
