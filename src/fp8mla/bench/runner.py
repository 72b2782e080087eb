"""``fp8mla bench``: every implementation on the same inputs, one JSON line per measurement."""

from __future__ import annotations

import datetime as _dt
import gc
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.flashmla import flashmla_bf16kv, flashmla_fp8, load_flashmla
from fp8mla.bench.inputs import BenchInputs, build_inputs, random_pool
from fp8mla.bench.measure import (
    Timing,
    copy_bandwidth_tbps,
    flops,
    io_bytes,
    kv_bytes,
    matmul_tflops,
    time_cuda,
    time_graph,
    time_host,
)
from fp8mla.formats import dtype_name
from fp8mla.reference import mla_reference
from fp8mla.testing import rel_err

ALL_IMPLS = (
    "fp8mla",
    "fp8mla-bf16kv",
    "fp8mla-fp8q",
    "fp8mla-fp8q-fused",
    "fp8mla-fp8q-wgmma",  # the planned Gluon kernel's FP8-query build, where it has one
    "fp8mla-fp8q-pv8",  # ... with P·V on FP8 tensor cores too (P in e4m3), where it has them
    "full-pool-cast",
    "gather-then-cast",
    "torch-reference",
    "torch-sdpa",
    "sglang-triton",
    "flashinfer-fp8",
    "flashinfer-bf16kv",
    "flashmla-fp8",  # FP8 queries and P: its error is an order above the others'
    "flashmla-bf16kv",
)
CHECK_REQUESTS = 4  # requests compared with the float64 reference in each case


@dataclass
class Environment:
    gpu: str
    date: str
    torch: str
    triton: str
    copy_tbps: float
    matmul_tflops: float
    run: str  # the run's label (--run-id), to tell the runs of one results file apart
    started: str  # start time of the run

    @classmethod
    def measure(cls, device: torch.device, run_id: str | None = None) -> Environment:
        """The GPU, versions and ceilings; ``run_id`` labels the records (default: the start
        time)."""
        import triton

        started = _dt.datetime.now().isoformat("T", "seconds")
        return cls(
            gpu=torch.cuda.get_device_name(device),
            date=_dt.date.today().isoformat(),
            run=run_id or started,
            started=started,
            torch=torch.__version__,
            triton=triton.__version__,
            copy_tbps=copy_bandwidth_tbps(device),
            matmul_tflops=matmul_tflops(device),
        )


@dataclass
class BenchContext:
    env: Environment
    device: torch.device
    impls: Sequence[str] = ALL_IMPLS
    sglang_path: str | None = None
    flashinfer_path: str | None = None
    flashmla_path: str | None = None
    records: list[dict] = field(default_factory=list)
    _pools: dict[tuple[torch.dtype, int], torch.Tensor] = field(default_factory=dict)
    _bf16: dict[int, torch.Tensor] = field(default_factory=dict)
    _sglang: object = None
    _flashinfer: object = None
    _flashmla: object = None

    def pool(self, case: Case) -> torch.Tensor:
        key = (case.kv_dtype, case.slots_needed())
        if key not in self._pools:
            self._pools.clear()
            self._bf16.clear()
            gc.collect()
            torch.cuda.empty_cache()
            self._pools[key] = random_pool(key[1], key[0], self.device)
        return self._pools[key]

    def bf16_pool(self, pool: torch.Tensor) -> torch.Tensor:
        if pool.dtype == torch.bfloat16:
            return pool
        key = pool.data_ptr()
        if key not in self._bf16:
            self._bf16[key] = pool.to(torch.bfloat16)
        return self._bf16[key]

    def sglang(self):
        if self._sglang is None:
            self._sglang = I.load_sglang_decode(self.sglang_path)
        return self._sglang

    def flashinfer(self):
        if self._flashinfer is None:
            self._flashinfer = I.load_flashinfer(self.flashinfer_path)
        return self._flashinfer

    def flashmla(self):
        if self._flashmla is None:
            self._flashmla = load_flashmla(self.flashmla_path)
        return self._flashmla


TAIL_TOKENS = 16  # query tokens of a long extend chunk compared with the reference


def reference_subset(inp: BenchInputs, n: int) -> tuple[torch.Tensor, slice]:
    """float64 reference output of the first ``n`` requests, and the output rows it covers.
    For a long extend chunk, only the chunk's last 16 query tokens (the same bottom-right
    causal rows; the full score matrix would not fit in memory)."""
    ckv, kpe = inp.paged()
    case = inp.case
    if case.qo_len > TAIL_TOKENS:
        rows = slice(case.qo_len - TAIL_TOKENS, case.qo_len)
        qo = torch.tensor([0, TAIL_TOKENS], dtype=torch.int32, device=inp.q_nope.device)
        out, _ = mla_reference(
            inp.q_nope[rows],
            inp.q_pe[rows],
            ckv,
            kpe,
            qo,
            inp.kv_indptr[:2],
            inp.kv_indices,
            inp.kv_len[:1],
            sm_scale=I.SM_SCALE,
            causal=True,
            ckv_scale=inp.scale,
            kpe_scale=inp.scale,
        )
        return out, rows
    n = min(n, case.batch)
    rows = slice(0, n * case.qo_len)
    out, _ = mla_reference(
        inp.q_nope[rows],
        inp.q_pe[rows],
        ckv,
        kpe,
        inp.qo_indptr[: n + 1],
        inp.kv_indptr[: n + 1],
        inp.kv_indices,
        inp.kv_len[:n],
        sm_scale=I.SM_SCALE,
        causal=case.qo_len > 1,
        ckv_scale=inp.scale,
        kpe_scale=inp.scale,
    )
    return out, rows


def make_runner(name: str, inp: BenchInputs, ctx: BenchContext) -> I.Runner:
    if name == "fp8mla":
        return I.fp8mla_direct(inp)
    if inp.pool.dtype == torch.bfloat16 and name != "torch-reference":
        raise I.Unavailable("FP8-pool comparison only")
    if name == "fp8mla-bf16kv":
        return I.fp8mla_bf16kv(inp, ctx.bf16_pool(inp.pool))
    if name.startswith("fp8mla-fp8q"):  # FP8 queries: quantized outside, or fused
        pv8 = name.endswith("pv8")
        return I.fp8mla_fp8q(inp, fused=name.endswith("fused"),
                             on_request=name.endswith("wgmma") or pv8, fp8_values=pv8)  # fmt: skip
    if name == "full-pool-cast":
        return I.full_pool_cast(inp)
    if name == "gather-then-cast":
        return I.gather_then_cast(inp)
    if name == "torch-reference":
        return I.torch_reference(inp)
    if name == "torch-sdpa":
        return I.torch_sdpa(inp)
    if name == "sglang-triton":
        if inp.page_size != 1:
            raise I.Unavailable("page size 1 only")
        return I.sglang_triton(inp, ctx.sglang())
    if name == "flashinfer-fp8":
        return I.flashinfer_wrapper(inp, inp.pool, ctx.flashinfer())
    if name == "flashinfer-bf16kv":
        return I.flashinfer_wrapper(inp, ctx.bf16_pool(inp.pool), ctx.flashinfer())
    if name == "flashmla-fp8":
        return flashmla_fp8(inp, ctx.flashmla())
    if name == "flashmla-bf16kv":
        return flashmla_bf16kv(inp, ctx.flashmla())
    raise ValueError(f"expected an implementation in {ALL_IMPLS}, got {name!r}")


def record(
    ctx: BenchContext, case: Case, impl: str, t: Timing, err: float | None, **extra: object
) -> dict:
    env = ctx.env
    secs = t.us_median * 1e-6
    floor_us = (
        max(io_bytes(case) / (env.copy_tbps * 1e12), flops(case) / (env.matmul_tflops * 1e12)) * 1e6
    )
    row = {
        "gpu": env.gpu,
        "date": env.date,
        "torch": env.torch,
        "triton": env.triton,
        "case": case.name,
        "batch": case.batch,
        "heads": case.heads,
        "context": case.context,
        "page_size": case.page_size,
        "kv_dtype": dtype_name(case.kv_dtype),
        "impl": impl,
        "us_median": round(t.us_median, 3),
        "us_p20": round(t.us_p20, 3),
        "us_p80": round(t.us_p80, 3),
        "gbps": round(kv_bytes(case) / secs / 1e9, 1),
        "tflops": round(flops(case) / secs / 1e12, 2),
        "rel_err": None if err is None else float(f"{err:.3e}"),
        "copy_tbps": round(env.copy_tbps, 3),
        "matmul_tflops": round(env.matmul_tflops, 1),
        "floor_us": round(floor_us, 2),
        "x_floor": round(t.us_median / floor_us, 2),
        "qo_len": case.qo_len,
        "pool_slots": case.slots_needed(),
        "goal": case.goal,
        "run": env.run,
        "started": env.started,
    }
    row.update(extra)
    ctx.records.append(row)
    return row


GRAPH_BYTES = 1 << 30  # cases reading less KV than this are timed as CUDA-graph replays
MAX_ROTATIONS = 64
NOT_CAPTURABLE = ("torch-reference",)  # reads lengths on the host


def placements(case: Case) -> int:
    """Token placements a case is timed over: 1 (``do_bench``) for cases reading at least
    ``GRAPH_BYTES`` of KV and for extend chunks, which run for milliseconds with no launch
    overhead to hide; otherwise enough CUDA-graph replays over different placements that the
    KV is not served from L2."""
    if case.qo_len > 16:
        return 1
    return min(MAX_ROTATIONS, -(-GRAPH_BYTES // max(kv_bytes(case), 1)))


def bench_case(ctx: BenchContext, case: Case, notes: list[str]) -> None:
    """Check and time every implementation on one case.

    Large cases are timed with ``do_bench`` (L2 flushed before each call). Small ones would
    measure host launch overhead that way, so they are captured in a CUDA graph as engines run
    decode, over up to 64 different token placements in the pool (so the KV is not served
    from L2), and the replay time is divided by the number of calls."""
    inp = build_inputs(case, ctx.device, pool=ctx.pool(case))
    ref, rows = reference_subset(inp, CHECK_REQUESTS)
    rotations = placements(case)
    extra = (
        [build_inputs(case, ctx.device, seed=i + 1, pool=inp.pool) for i in range(rotations - 1)]
        if rotations > 1
        else []
    )
    for name in ctx.impls:
        try:
            runner = make_runner(name, inp, ctx)
            out = runner()
            torch.cuda.synchronize()
        except I.Unavailable as exc:
            notes.append(f"{case.name} {name}: skipped ({exc})")
            continue
        err = rel_err(out[rows].float(), ref)
        if rotations > 1 and name not in NOT_CAPTURABLE:
            runners = [runner] + [make_runner(name, x, ctx) for x in extra]
            t = time_graph(lambda rs=runners: [r() for r in rs])
            t = Timing(t.us_median / len(runners), t.us_p20 / len(runners), t.us_p80 / len(runners))
            record(ctx, case, name, t, err, timing=f"cuda-graph x{len(runners)}")
            del runners
        else:
            record(ctx, case, name, time_cuda(runner), err, timing="do_bench")
        del runner, out
        torch.cuda.empty_cache()
    del inp, extra


HOST_IMPLS = ("fp8mla", "flashinfer-fp8")
WARMUP_CALLS = 20


def bench_host(ctx: BenchContext, notes: list[str]) -> None:
    """Host cost of eager ``run()``: CPU time per call of ``HOST_CALLS`` back-to-back calls,
    read on the host clock before synchronizing (the launch queue does not fill at that
    count). Engines run extend/prefill and many decode batches eagerly."""

    from fp8mla.bench.cases import HOST_CALLS, HOST_CASE

    case = HOST_CASE
    inp = build_inputs(case, ctx.device, pool=ctx.pool(case))
    name = f"HOST_{case.name}"
    for impl in HOST_IMPLS:
        if impl not in ctx.impls:
            continue
        try:
            runner = make_runner(impl, inp, ctx)
        except I.Unavailable as exc:
            notes.append(f"{name} {impl}: skipped ({exc})")
            continue
        t = time_host(runner, HOST_CALLS, WARMUP_CALLS)
        row = record(ctx, case, impl, t, None, timing=f"host clock, {HOST_CALLS} eager calls")
        row.update(case=name, gbps=None, tflops=None, x_floor=None, floor_us=None)
        del runner
