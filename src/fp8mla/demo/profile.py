"""Profiling and timing of the demo's decode steps."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from fp8mla.demo.decode_loop import DecodeModel


def profile_steps(model: DecodeModel, h0: torch.Tensor, strategy: str, path: str) -> None:
    """Five eager steps under ``torch.profiler`` (wait 1, warm-up 1, record 3; shapes and
    Python stacks on), exported as a Chrome trace to ``path``. The profiler's own
    ``profiler_start``/``profiler_stop`` notes on stderr are dropped."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if model.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with _without_profiler_notes():
        with profile(
            activities=activities,
            record_shapes=True,
            with_stack=True,
            schedule=schedule(wait=1, warmup=1, active=3),
        ) as prof:
            for _ in range(5):
                model.step(h0.clone(), strategy)
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                prof.step()
        prof.export_chrome_trace(path)


def time_steps(
    model: DecodeModel, h0: torch.Tensor, strategy: str, steps: int, cuda_graph: bool
) -> float:
    """Milliseconds per decode step: CUDA-graph replays on a GPU (``cuda_graph``), else eager
    steps (synchronized) timed on the host."""
    if model.device.type != "cuda":
        model.step(h0.clone(), strategy)  # warm-up
        t = time.perf_counter()
        for _ in range(steps):
            model.step(h0.clone(), strategy)
        return (time.perf_counter() - t) * 1e3 / steps
    h = h0.clone()
    step = lambda: model.step(h, strategy)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and allocate outside capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    if cuda_graph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    else:
        run = step
    run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


# The profiler's own trace points, written to file descriptor 2 by its C++ side.
_PROFILER_NOTE = re.compile(r"^USDT:.*\bprofiler_(?:start|stop)\s*$")


@contextmanager
def _without_profiler_notes() -> Iterator[None]:
    """Drop the profiler's ``USDT: … profiler_start`` / ``profiler_stop`` lines from stderr;
    whatever else reaches file descriptor 2 meanwhile is passed on afterwards."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr descriptor to redirect
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [
                line
                for line in held.read().decode("utf-8", "replace").splitlines(keepends=True)
                if not _PROFILER_NOTE.match(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
