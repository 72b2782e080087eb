"""benchmarks/probe_fewrows.py's reading of the few-row and FP8 × FP8 kernels' cycle stamps."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from probe_fewrows import trace_steps, trace_steps_fp8qk  # noqa: E402


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
        last = 10_000 * (pid + 1) + (tiles - 1) * period
        t[pid, 1, 0, 6:8] = torch.tensor([1350, 3350]) + last  # value: statistics, stored
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
    assert steps["value: last P·V -> statistics"] == 100
    assert steps["value: statistics -> output stores issued"] == 2000


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


def _fp8qk_stamps(programs: int = 2, tiles: int = 16, period: int = 2800) -> torch.Tensor:
    """Stamps of the FP8 × FP8 kernel in a steady pipeline, in the score warpgroup's pipelined
    order (events as the kernels number them: score 0 tile ready, 1 its S done, then during the
    next tile's iteration 5 softmax start, 2 softmax done, 3 P slot free, 4 P stored; 6 query
    staged, 7 start; value 0 P ready, 1 P·V done, 6 statistics, 7 stored, at tile 1 event 6
    reordered, at tile 2 events 6-7 its query staging; copier 0 before its empty wait, 1 after,
    2 issued, 3 page entries checked, at tile 0 event 6 its start)."""
    t = torch.zeros(programs, 4, 64, 8, dtype=torch.int64)
    for pid in range(programs):
        start = 100_000 * (pid + 1)
        t[pid, 0, 0, 7] = start
        t[pid, 0, 0, 6] = start + 5000
        for j in range(tiles):
            base = start + 6000 + j * period
            t[pid, 0, j, :2] = torch.tensor([0, 2000]) + base
            t[pid, 0, j, 2:6] = torch.tensor([1100, 1150, 1300, 100]) + base + period
            t[pid, 1, j, :2] = torch.tensor([2000, 3800]) + base
            t[pid, 2, j, :2] = torch.tensor([2000, 3700]) + base
            t[pid, 3, j, :4] = torch.tensor([-2900, -2800, -2100, -2950]) + base
        t[pid, 1, 0, 6] = start + 6000 + (tiles - 1) * period + 3900
        t[pid, 1, 0, 7] = t[pid, 1, 0, 6] + 6000
        t[pid, 1, 1, 6] = t[pid, 1, 0, 6] + 1200
        t[pid, 1, 2, 6:8] = torch.tensor([300, 4700]) + start
        t[pid, 3, 0, 6] = start + 250
    return t


def test_fp8qk_steps_are_the_stamp_differences():
    steps = trace_steps_fp8qk(_fp8qk_stamps())
    assert steps["tiles per program"] == 16
    assert steps["score: start -> query staged"] == 5000
    assert steps["score: query staged -> tile 0 ready"] == 1000
    assert steps["copier: tile 0 issued -> score has it"] == 2100
    assert steps["score: tile j's S done -> tile j+1's bytes (wait)"] == 800
    assert steps["score: tile j+1's first products issued"] == 100
    assert steps["score: softmax of tile j"] == 1000
    assert steps["score: wait for the P slot"] == 50
    assert steps["score: store P, arrive"] == 150
    assert steps["score: rest of tile j+1's S after the handoff"] == 700
    assert steps["score: period"] == 2800
    assert steps["value 0: P ready -> P·V done"] == 1800
    assert steps["value 0: P·V done -> next P ready (next operand built)"] == 1000
    assert steps["value 1: P ready -> P·V done"] == 1700
    assert steps["copier: wait for an empty stage"] == 100
    assert steps["copier: issue a tile"] == 700
    assert steps["value 0: last P·V -> statistics"] == 100
    assert steps["value 0: statistics -> output stored"] == 6000
    assert steps["  statistics -> output reordered"] == 1200
    assert steps["  reordered -> stores issued"] == 4800
    assert steps["  score start -> value 0 start"] == 300
    assert steps["  value 0: start -> its query half staged"] == 4400
    assert steps["  score start -> copier start"] == 250
    assert steps["  copier: start -> tile 0's page entries"] == 6000 - 2950 - 250
    assert steps["program: score start -> value 0 stored"] == 6000 + 15 * 2800 + 3900 + 6000
