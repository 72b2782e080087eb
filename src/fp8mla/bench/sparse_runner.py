"""``fp8mla bench --sections sparse``: sparse MLA attention beside its baselines, one JSON line
per (case, implementation), and the 78-layer CUDA-graph scenario of the one-stream case.

Every implementation reads the same pool (values identical across the packed cache and its bf16
twin: ``sparse_inputs``) and is compared with the float64 reference on the same bytes for a few
query tokens. Every case is timed as CUDA-graph replays, as the engines run their decode steps
(an eager call's launches would time the host). A replay cycles through :func:`rotations`
different index lists, so that consecutive calls read different rows (from memory, not from
the L2), and holds enough calls that the replay's own start is a small part of its time. An
implementation that cannot be captured is timed with
``do_bench`` (L2 flushed before each call) and its record says so.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from fp8mla.bench import sparse_impls as S
from fp8mla.bench.flashmla import load_flashmla
from fp8mla.bench.impls import Unavailable
from fp8mla.bench.measure import Timing, time_cuda, time_graph
from fp8mla.bench.runner import Environment
from fp8mla.bench.sparse_cases import (
    LAYERS_CASE,
    PACK_TOKENS,
    SPARSE_LAYERS,
    SPARSE_POOL_SLOTS,
    SparseCase,
    packed_bytes,
    sparse_flops,
)
from fp8mla.bench.sparse_inputs import SparseInputs, bf16_twin, packed_pool, sparse_inputs
from fp8mla.dsa.layout import NOPE_DIM
from fp8mla.dsa.reference import sparse_mla_reference
from fp8mla.testing import rel_err

# fp8mla-portable: the portable kernel on the packed pool where the planner takes another;
# fp8mla-pingpong8: the SM90 FP8 ping-pong kernel's sparse route (a plan names it)
SPARSE_IMPLS = ("fp8mla", "fp8mla-portable", "fp8mla-pingpong8", "fp8mla-bf16",
                "flashmla-sparse-fp8", "vllm-triton-sparse", "gather-dequant")  # fmt: skip
GRAPH_READ_BYTES = 1 << 30  # packed bytes one replay's calls read together, at least
ROTATIONS = 16  # index lists a replay cycles through, at most
CHECK_TOKENS = 4  # query tokens compared with the float64 reference per case


@dataclass
class SparseContext:
    env: Environment
    device: torch.device
    impls: Sequence[str] = SPARSE_IMPLS
    flashmla_path: str | None = None
    vllm_path: str | None = None
    records: list[dict] = field(default_factory=list)
    _pool: torch.Tensor | None = None
    _bf16: torch.Tensor | None = None
    _flashmla: object = None
    _vllm: object = None

    def pool(self, case: SparseCase) -> torch.Tensor:
        if self._pool is None or self._pool.shape[0] * self._pool.shape[1] != case.pool_slots:
            self._pool = self._bf16 = None
            gc.collect()
            torch.cuda.empty_cache()
            self._pool = packed_pool(case.pool_slots, case.page_size, self.device)
        return self._pool

    def bf16(self) -> torch.Tensor:
        if self._bf16 is None:
            self._bf16 = bf16_twin(self._pool)
        return self._bf16

    def flashmla(self):
        if self._flashmla is None:
            self._flashmla = load_flashmla(self.flashmla_path)
        return self._flashmla

    def vllm(self):
        if self._vllm is None:
            self._vllm = S.load_vllm_sparse(self.vllm_path)
        return self._vllm


def make_sparse_runner(name: str, inp: SparseInputs, ctx: SparseContext) -> S.Runner:
    if name == "fp8mla":
        return S.fp8mla_sparse(inp)
    if name == "fp8mla-portable":
        return S.fp8mla_sparse(inp, kernel="portable")
    if name == "fp8mla-pingpong8":
        return S.fp8mla_sparse(inp, kernel="pingpong8")
    if name == "fp8mla-bf16":
        return S.fp8mla_sparse(inp, ctx.bf16())
    if name == "flashmla-sparse-fp8":
        return S.flashmla_sparse(inp, ctx.flashmla())
    if name == "vllm-triton-sparse":
        return S.vllm_triton_sparse(inp, ctx.bf16(), ctx.vllm())
    if name == "gather-dequant":
        return S.gather_dequant(inp)
    raise ValueError(f"expected an implementation in {SPARSE_IMPLS}, got {name!r}")


def sparse_record(
    ctx: SparseContext, case: SparseCase, impl: str, t: Timing, err: float | None, **extra: object
) -> dict:
    """One JSON line: time, GB/s of packed bytes read (656 per entry per token), TFLOP/s,
    the ratio to the floor (bytes at the copy bandwidth or FLOPs at the matmul rate) and the
    error against float64 on the same bytes."""
    env = ctx.env
    secs = t.us_median * 1e-6
    nbytes, flops = packed_bytes(case), sparse_flops(case)
    floor_us = max(nbytes / (env.copy_tbps * 1e12), flops / (env.matmul_tflops * 1e12)) * 1e6
    row = {
        "section": "sparse",
        "gpu": env.gpu,
        "date": env.date,
        "torch": env.torch,
        "triton": env.triton,
        "case": case.name,
        "tokens": case.tokens,
        "batch": case.batch,
        "qo_len": case.qo_len,
        "heads": case.heads,
        "topk": case.topk,
        "page_size": case.page_size,
        "pool_slots": case.pool_slots,
        "impl": impl,
        "us_median": round(t.us_median, 3),
        "us_p20": round(t.us_p20, 3),
        "us_p80": round(t.us_p80, 3),
        "gbps": round(nbytes / secs / 1e9, 1),
        "tflops": round(flops / secs / 1e12, 2),
        "rel_err": None if err is None else float(f"{err:.3e}"),
        "copy_tbps": round(env.copy_tbps, 3),
        "matmul_tflops": round(env.matmul_tflops, 1),
        "floor_us": round(floor_us, 2),
        "x_floor": round(t.us_median / floor_us, 2),
        "goal": case.goal,
        "run": env.run,
    }
    row.update(extra)
    ctx.records.append(row)
    return row


def check_rows(case: SparseCase) -> list[int]:
    """Query tokens compared with the reference: first, middle, last."""
    picks = {0, 1, case.tokens // 2, case.tokens - 1}
    return sorted(t for t in picks if 0 <= t < case.tokens)[:CHECK_TOKENS]


def reference_rows(inp: SparseInputs, rows: list[int]) -> torch.Tensor:
    sel = torch.tensor(rows, device=inp.q.device)
    out, _ = sparse_mla_reference(inp.q_nope[sel], inp.q_pe[sel], inp.pool, inp.indices[sel],
                                  S.SM_SCALE)  # fmt: skip
    return out


def rotations(case: SparseCase) -> int:
    """Calls one CUDA-graph replay holds, each with its own index lists: enough to read
    ``GRAPH_READ_BYTES`` together (the replay's start, a few µs in which the GPU waits for the
    host, is then ~1% of a replay), between 2 and ``ROTATIONS``. The dense bench's rule
    (``runner.placements``) likewise."""
    return max(2, min(ROTATIONS, -(-GRAPH_READ_BYTES // max(packed_bytes(case), 1))))


def time_runners(runners: list[S.Runner], graph: bool) -> tuple[Timing, str]:
    """``do_bench`` of the first runner, or one CUDA graph replaying all of them (per-call
    time); a runner that cannot be captured falls back to ``do_bench``."""
    if graph:
        try:
            t = time_graph(lambda: [r() for r in runners])
            n = len(runners)
            return Timing(t.us_median / n, t.us_p20 / n, t.us_p80 / n), f"cuda-graph x{n}"
        except Exception:  # noqa: BLE001 - not capturable: timed eagerly instead
            torch.cuda.synchronize()
    return time_cuda(runners[0]), "do_bench"


def bench_sparse_case(ctx: SparseContext, case: SparseCase, notes: list[str]) -> None:
    """Check and time every implementation on one case."""
    pool = ctx.pool(case)
    inp = sparse_inputs(case, pool)
    rows = check_rows(case)
    ref = reference_rows(inp, rows)
    extra = [sparse_inputs(case, pool, seed=i + 1) for i in range(rotations(case) - 1)]
    for name in ctx.impls:
        try:
            runner = make_sparse_runner(name, inp, ctx)
            out = runner()
            torch.cuda.synchronize()
            runners = [runner] + [make_sparse_runner(name, x, ctx) for x in extra]
        except Unavailable as exc:
            notes.append(f"{case.name} {name}: skipped ({exc})")
            continue
        err = rel_err(out[rows].float(), ref)
        t, how = time_runners(runners, graph=True)
        kw: dict[str, object] = {}
        if name == "flashmla-sparse-fp8" and case.prefill:
            kernel = time_cuda(S.flashmla_kernel_only(inp, ctx.flashmla()))
            kw = dict(us_kernel=round(kernel.us_median, 3))
            notes.append(
                f"{case.name} flashmla-sparse-fp8: includes dequantizing the pool to bf16 "
                f"({case.pool_slots} slots, PyTorch ops); its kernel alone: "
                f"{kernel.us_median:.1f} us"
            )
        sparse_record(ctx, case, name, t, err, timing=how, **kw)
        del runner, runners, out
        torch.cuda.empty_cache()


LAYER_IMPLS = ("fp8mla", "fp8mla-bf16", "vllm-triton-sparse", "gather-dequant")


def bench_sparse_layers(ctx: SparseContext, notes: list[str], layers: int = SPARSE_LAYERS) -> None:
    """The one-stream case as a decode step of ``layers`` layers in one CUDA graph: one pool,
    a different index list per layer (so that the rows come from memory), time per layer."""
    case = LAYERS_CASE
    pool = ctx.pool(case)
    inputs = [sparse_inputs(case, pool, seed=100 + i) for i in range(layers)]
    name = f"LAYERS{layers}_{case.name}"
    for impl in LAYER_IMPLS:
        if impl not in ctx.impls:
            continue
        try:
            runners = [make_sparse_runner(impl, x, ctx) for x in inputs]
            step: Callable[[], object] = lambda rs=runners: [r() for r in rs]  # noqa: E731
            t = time_graph(step)
        except Unavailable as exc:
            notes.append(f"{name} {impl}: skipped ({exc})")
            continue
        per_layer = Timing(t.us_median / layers, t.us_p20 / layers, t.us_p80 / layers)
        row = sparse_record(ctx, case, impl, per_layer, None, timing=f"cuda-graph {layers} layers",
                            us_per_step=round(t.us_median, 3), layers=layers)  # fmt: skip
        row["case"] = name
        del runners
        torch.cuda.empty_cache()


def bench_pack(ctx: SparseContext, n: int = PACK_TOKENS) -> None:
    """``pack_ds_mla`` writing ``n`` bf16 rows at random slots of a cache of as many: GB/s
    counting the bytes read (rows, slots) and written (656 a token)."""
    from fp8mla.dsa.format import pack_ds_mla

    dev = ctx.device
    ckv = torch.randn(n, NOPE_DIM, device=dev).to(torch.bfloat16)
    kpe = torch.randn(n, 64, device=dev).to(torch.bfloat16)
    cache = torch.zeros(n // 64, 64, 656, dtype=torch.uint8, device=dev)
    slots = torch.randperm(n, device=dev)
    t = time_cuda(lambda: pack_ds_mla(ckv, kpe, cache, slots, validate=False))
    moved = n * (NOPE_DIM * 2 + 64 * 2 + 8 + 656)
    secs = t.us_median * 1e-6
    ctx.records.append({
        "gpu": ctx.env.gpu, "date": ctx.env.date, "torch": ctx.env.torch,
        "triton": ctx.env.triton, "case": f"PACK_N{n}", "impl": "fp8mla-pack",
        "tokens": n, "us_median": round(t.us_median, 3), "us_p20": round(t.us_p20, 3),
        "us_p80": round(t.us_p80, 3), "gbps": round(moved / secs / 1e9, 1),
        "copy_tbps": round(ctx.env.copy_tbps, 3), "run": ctx.env.run, "timing": "do_bench",
        "goal": ">= 2 TB/s", "section": "sparse", "rel_err": None,
    })  # fmt: skip


def run_sparse(
    ctx: SparseContext,
    cases: Sequence[SparseCase],
    notes: list[str],
    on_case: Callable[[str], None] | None = None,
    layers: int = SPARSE_LAYERS,
) -> None:
    """Every case, the layers scenario, then the packed writer; ``on_case(name)`` after each
    (progress, saving)."""
    for case in cases:
        bench_sparse_case(ctx, case, notes)
        if on_case:
            on_case(case.name)
    if layers:
        bench_sparse_layers(ctx, notes, layers)
        if on_case:
            on_case(f"{layers} layers")
    bench_pack(ctx, PACK_TOKENS if ctx.device.type == "cuda" else 1024)
    if on_case:
        on_case("packed writer")
    notes.append(f"sparse: every case reads random slots of one {SPARSE_POOL_SLOTS}-slot pool")
