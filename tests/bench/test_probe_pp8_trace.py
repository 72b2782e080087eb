"""benchmarks/probe_manyrows.py's reading of the FP8 ping-pong kernel's cycle stamps."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from probe_manyrows import pp8_steps  # noqa: E402

# a consumer's own tile: start, bytes landed, scores, other's maximum, published, the other's
# tile applied, its own applied (cycles after the tile's start)
OWN = [0, 300, 2300, 2500, 3600, 5400, 7300]


def _stamps(programs: int = 4, tiles: int = 64, period: int = 7600) -> torch.Tensor:
    """Stamps of a steady ping-pong: consumer ``j % 2`` owns tile ``j``, which starts half a
    period after tile ``j - 1``; the copier issues tile ``j`` 1,500 cycles before its owner
    has the bytes; each program shifted in time."""
    t = torch.zeros(programs, 4, 64, 8, dtype=torch.int64)
    for pid in range(programs):
        for j in range(tiles):
            base = 100_000 * (pid + 1) + j * (period // 2)
            t[pid, 1 + j % 2, j, :7] = torch.tensor(OWN) + base
            # copier: before the empty wait, after it, issued (event 3 unused here)
            t[pid, 3, j, :3] = torch.tensor([-2600, -1800, -1200]) + base
        start = 100_000 * (pid + 1) - 500
        t[pid, 1, 0, 7] = start  # consumer 0: program start, loop end, stored
        t[pid, 1, 1, 7] = start + 250_000
        t[pid, 1, 2, 7] = start + 255_000
        t[pid, 1, 3, 7] = start + 300  # its query half staged, both halves, loop start
        t[pid, 1, 4, 7] = start + 400
        t[pid, 1, 5, 7] = start + 450
        t[pid, 2, 0, 7] = start + 20  # consumer 1: start, its half staged, loop end
        t[pid, 2, 3, 7] = start + 380
        t[pid, 2, 1, 7] = start + 250_700
        t[pid, 3, 0, 6] = start - 100  # the copier's start
        # nanoseconds (part 0): consumer 0's start and stored, at 2 cycles a nanosecond
        t[pid, 0, 0, 0] = 1_000_000 + 64 * pid
        t[pid, 0, 0, 2] = 1_000_000 + 64 * pid + 127_500
    return t


def test_steps_are_the_stamp_differences():
    out = pp8_steps(_stamps().double())
    steps = out["steps"]
    assert steps["tiles"] == 64
    assert steps["period (2 tiles, one consumer)"] == 7600
    assert steps["wait for the bytes"] == 300
    assert steps["scores"] == 2000
    assert steps["wait for the other's maximum"] == 200
    assert steps["softmax, publish"] == 1100
    assert steps["apply the other's tile"] == 1800
    assert steps["apply the own tile"] == 1900
    assert steps["own tile applied -> next own tile"] == 7600 - 7300
    assert steps["other published j-1 -> own softmax starts"] == 2500 + 3800 - 3600
    assert steps["publish j-1 -> publish j"] == 3800
    assert steps["copier: empty wait"] == 800
    assert steps["copier: issue"] == 600
    assert steps["copier: issued -> consumer has the bytes"] == 1500
    assert steps["program: start -> loop end (consumer 0)"] == 250_000
    assert steps["program: loop end -> stored (consumer 0)"] == 5000
    # one program's timeline of tiles 20-25, relative to tile 20's start
    line = out["timeline"]
    assert line["tile 20 (consumer 0)"] == OWN
    assert line["tile 21 (consumer 1)"] == [3800 + x for x in OWN]


def test_unwritten_stamps_are_none():
    t = _stamps()
    t[:, 3] = 0  # no copier stamps
    steps = pp8_steps(t.double())["steps"]
    assert steps["copier: empty wait"] is None
    assert steps["copier: issued -> consumer has the bytes"] is None
    assert steps["scores"] == 2000
    assert steps["tiles"] == 64


def test_prologue_and_end():
    steps = pp8_steps(_stamps().double())["steps"]
    assert steps["consumer 0: start -> query staged"] == 300
    assert steps["consumer 0: start -> both halves staged"] == 400
    assert steps["consumer 0: start -> loop start"] == 450
    assert steps["consumer 1: start -> query staged"] == 360
    assert steps["consumer 1 start - consumer 0 start"] == 20
    assert steps["copier start - consumer 0 start"] == -100
    assert steps["start -> tile 0 start"] == 500
    assert steps["start -> tile 1 start"] == 500 + 3800
    assert steps["tile 1: bytes wait"] == 300
    assert steps["copier: start -> tile 0 issued"] == 500 - 1200 + 100
    # tile 4 starts two periods after tile 0: what is left is the time before tile 0
    assert steps["start -> tile 4 start, less 2 periods"] == 500
    assert steps["mean period (tiles 4 .. last)"] == 7600
    assert steps["start -> loop end, less (tiles / 2) periods"] == 250_000 - 32 * 7600
    assert steps["consumer 0 loop end -> consumer 1 loop end"] == 700
    assert steps["consumer 0: loop end -> stored"] == 5000
    assert steps["clock (GHz, consumer 0 start -> stored)"] == 2.0
    assert steps["program wall ns: median, max"] == [127_500, 127_500]
    assert steps["programs' starts: spread ns"] == 3 * 64
    assert steps["first start -> last end ns"] == 3 * 64 + 127_500


def test_without_nanosecond_stamps_no_clock():
    t = _stamps()
    t[:, 0] = 0
    steps = pp8_steps(t.double())["steps"]
    assert "clock (GHz, consumer 0 start -> stored)" not in steps
    assert steps["start -> tile 0 start"] == 500
