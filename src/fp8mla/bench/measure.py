"""Timing, the two hardware ceilings, and the per-case byte and FLOP counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fp8mla.bench.cases import Case
from fp8mla.formats import HEAD_DIM_CKV, HEAD_DIM_KPE, element_size


@dataclass(frozen=True)
class Timing:
    us_median: float
    us_p20: float
    us_p80: float


def time_cuda(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100) -> Timing:
    """``triton.testing.do_bench`` medians with p20/p80; the L2 is flushed before every call,
    so each call reads its KV from device memory."""
    import triton.testing

    med, p20, p80 = triton.testing.do_bench(
        fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8]
    )
    return Timing(med * 1e3, p20 * 1e3, p80 * 1e3)


def time_host(fn: Callable[[], object], calls: int, warmup: int = 20, rounds: int = 5) -> Timing:
    """Host µs per call of ``calls`` back-to-back calls, read on the host clock before
    synchronizing (the launch queue does not fill at a few hundred calls): the median of
    ``rounds`` rounds, with the second-lowest and second-highest as p20/p80."""
    import time

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    samples.sort()
    return Timing(samples[rounds // 2], samples[1], samples[-2])


def time_graph(fn: Callable[[], object], reps: int = 20) -> Timing:
    """Capture ``fn`` in a CUDA graph and time its replays (median of ``reps`` events)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside capture (compilation, allocations)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]
    del graph
    return Timing(pick(0.5), pick(0.2), pick(0.8))


def copy_bandwidth_tbps(device: torch.device, nbytes: int = 1 << 31) -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    t = time_cuda(lambda: dst.copy_(src), rep_ms=200)
    return 2 * nbytes / (t.us_median * 1e-6) / 1e12


def matmul_tflops(device: torch.device, n: int = 8192) -> float:
    """Dense bf16 matrix product on random data."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t = time_cuda(lambda: a @ b, rep_ms=300)
    return 2 * n**3 / (t.us_median * 1e-6) / 1e12


def kv_bytes(case: Case) -> int:
    """Bytes of KV a decode call must read: every active token's 576 values once."""
    return case.tokens * (HEAD_DIM_CKV + HEAD_DIM_KPE) * element_size(case.kv_dtype)


def io_bytes(case: Case) -> int:
    """KV plus queries in and outputs out (bf16)."""
    rows = case.batch * case.qo_len * case.heads
    return kv_bytes(case) + rows * (HEAD_DIM_CKV + HEAD_DIM_KPE + HEAD_DIM_CKV) * 2


def flops(case: Case) -> int:
    """QKᵀ (576 wide) and PV (512 wide) over every (row, visible token) pair."""
    rows = case.batch * case.heads
    pairs = (
        sum(case.context - case.qo_len + 1 + i for i in range(case.qo_len))
        if case.qo_len > 1
        else case.context
    )
    return 2 * rows * pairs * (HEAD_DIM_CKV + HEAD_DIM_KPE + HEAD_DIM_CKV)
