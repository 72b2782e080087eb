"""benchmarks/probe_fewrows.py's reading of the few-row kernel's cycle stamps."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from probe_fewrows import trace_steps  # noqa: E402


def _stamps(programs: int = 3, tiles: int = 16, period: int = 3000) -> torch.Tensor:
    """Stamps of a steady pipeline: every step a fixed number of cycles after the tile's
    start, the two producers on alternate tiles, each program shifted in time."""
    t = torch.zeros(programs, 4, 64, 8, dtype=torch.int64)
    for pid in range(programs):
        for j in range(tiles):
            base = 10_000 * (pid + 1) + j * period
            # producer (part 2 + j % 2): start, buffer free, ready, loads issued, first chunk
            t[pid, 2 + j % 2, j, :5] = torch.tensor([-2000, -1500, -200, -1800, -1400]) + base
            # softmax: ready, S done, P handed over, P·V done, maxima, exp2, P slot, P stored
            t[pid, 0, j] = torch.tensor([0, 500, 800, 1200, 600, 700, 720, 760]) + base
            t[pid, 1, j, :2] = torch.tensor([850, 1250]) + base  # value: P taken, P·V done
    return t


def test_steps_are_the_stamp_differences():
    steps = trace_steps(_stamps())
    assert steps["tiles per program"] == 16
    assert steps["period (softmax ready to ready)"] == 3000
    assert steps["softmax: wait for the tile"] == 3000 - 1200
    assert steps["softmax: S = K·Qᵀ"] == 500
    assert steps["softmax: softmax, P handed over"] == 300
    assert steps["  row maxima (across the four warps)"] == 100
    assert steps["  fence, barrier, arrive"] == 40
    assert steps["softmax: O[0:256] += V·P"] == 400
    assert steps["value: O[256:512] += V·P"] == 400
    assert steps["producer: issue loads and prefetches"] == 200
    assert steps["producer: wait for the buffer"] == 300
    assert steps["producer: convert and store (incl. load wait)"] == 1300
    assert steps["producer: tile ready before the softmax takes it"] == 200
    assert steps["first tile: producer start to softmax start"] == 2000


def test_steps_without_both_stamps_are_none():
    t = _stamps()
    t[:, 0, :, 4:] = 0  # the fine softmax stamps unwritten
    t[:, 1] = 0  # no value warpgroup stamps (a probe without consumer math)
    steps = trace_steps(t)
    for name in ("  row maxima (across the four warps)", "  exp2, row sums",
                 "value: O[256:512] += V·P", "program: producer start to last P·V"):  # fmt: skip
        assert steps[name] is None, name
    assert steps["softmax: S = K·Qᵀ"] == 500
    assert steps["period (softmax ready to ready)"] == 3000
