"""Where a kernel's warps wait, from Nsight Compute's per-instruction warp-stall samples: the
share of all samples in each loop of the SASS (a backward branch's span, so a warp-specialized
kernel's producer and consumer loops come out apart) with its leading stall reasons, and the
instructions that hold the most samples::

    ncu --clock-control none -k regex:mla_pingpong --launch-skip 2 -c 1 --set full \\
        --import-source no -o rep python benchmarks/profile_case.py --sparse B128_H128_K2048_Q2
    ncu --import rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python benchmarks/ncu_stalls.py sass.csv [--top 20]

A stall on an instruction is charged to that instruction, which waits for what an earlier one
produced: a long-scoreboard stall on the first use of a loaded register is the load's latency
(``LDL`` reloads of spilled registers included), a ``TRYWAIT`` loop's samples its barrier's.

Where the page has the shared-memory wavefront columns (``--set full``), the report ends with
the shared loads and stores that take more wavefronts than their ideal (bank conflicts), each
with its ratio, and their share of all shared wavefronts.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from dataclasses import dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
WAVEFRONTS = "L1 Wavefronts Shared"
IDEAL = "L1 Wavefronts Shared Ideal"


@dataclass
class Instruction:
    address: int
    source: str
    samples: int
    executed: int
    stalls: Counter = field(default_factory=Counter)
    wavefronts: int = 0  # shared-memory wavefronts (0 where the page has no such column)
    ideal: int = 0  # ... and the fewest the accesses could take

    @property
    def opcode(self) -> str:
        """The mnemonic without its guard predicate (``@!P0 BRA`` → ``BRA``)."""
        words = self.source.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        return words[0].rstrip(";") if words else ""


def read_source_page(lines: list[str]) -> list[Instruction]:
    """The instructions of ``ncu --page source --csv --print-source sass`` output, in address
    order (a first line naming the kernel, if present, is skipped)."""
    rows = list(csv.reader(lines))
    start = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if start is None:
        raise ValueError("expected the source page's header (Address, Source, ...)")
    header = rows[start]
    col = {name: i for i, name in enumerate(header)}
    for needed in ("Address", "Source", SAMPLES, EXECUTED):
        if needed not in col:
            raise ValueError(f"expected a {needed!r} column, got {header[:6]}...")
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[start + 1 :]:
        if len(r) < len(header) or not r[col["Address"]].strip():
            continue

        def num(name: str, r: list[str] = r) -> int:
            text = r[col[name]].replace(",", "").strip()
            return int(float(text)) if text and text != "-" else 0

        out.append(
            Instruction(
                address=int(r[col["Address"]], 16),
                source=r[col["Source"]].strip(),
                samples=num(SAMPLES),
                executed=num(EXECUTED),
                stalls=Counter({h.removeprefix("stall_"): num(h) for h in reasons}),
                wavefronts=num(WAVEFRONTS) if WAVEFRONTS in col else 0,
                ideal=num(IDEAL) if IDEAL in col else 0,
            )
        )
    out.sort(key=lambda i: i.address)
    return out


def _target(code: list[Instruction], at: dict[int, int], k: int) -> int | None:
    """The instruction index a branch at ``k`` jumps to (None: not a branch, or outside)."""
    if not code[k].opcode.startswith("BRA"):
        return None
    m = re.search(r"0x([0-9a-f]+)", code[k].source)
    return at.get(int(m.group(1), 16)) if m else None


def loops(code: list[Instruction]) -> list[tuple[int, int]]:
    """``(first, last)`` instruction indices of the innermost loops: spans of a backward branch
    that hold no other such span. A barrier wait's retry stub, which ptxas places after the
    kernel's code (the wait branches forward to it; it retries the try-wait in place and
    branches back to just after that forward branch), makes neither a loop nor a span."""
    at = {ins.address: k for k, ins in enumerate(code)}
    spans = []
    for k in range(len(code)):
        t = _target(code, at, k)
        if t is None or t > k:
            continue
        retry_in_place = t >= k - 1 and "PHASECHK" in code[t].opcode
        came_from = _target(code, at, t - 1) if t > 0 else None
        returns = came_from is not None and k - 2 <= came_from <= k
        if not (retry_in_place or returns):
            spans.append((t, k))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    return sorted(set(inner))


def summary(code: list[Instruction], top: int = 15, min_share: float = 0.02) -> list[str]:
    """The report's lines: totals, each loop holding at least ``min_share`` of the samples,
    then the ``top`` instructions by samples."""
    total = sum(i.samples for i in code) or 1
    lines = [f"{len(code)} instructions, {total} samples, {sum(i.executed for i in code)} "
             f"warp-instructions executed"]  # fmt: skip

    def reasons(part: list[Instruction], n: int = 4) -> str:
        c: Counter = Counter()
        for ins in part:
            c.update(ins.stalls)
        got = sum(c.values()) or 1
        return ", ".join(f"{k} {100 * v / got:.0f}%" for k, v in c.most_common(n) if v)

    lines.append("loops (first-last instruction: share of samples, instructions, leading stalls):")
    for first, last in loops(code):
        part = code[first : last + 1]
        share = sum(i.samples for i in part) / total
        if share >= min_share:
            lines.append(f"  {first}-{last}: {100 * share:.1f}%, {len(part)} instructions, "
                         f"{reasons(part)}")  # fmt: skip
    lines.append(f"top {top} instructions (index: share, executed, instruction, stalls):")
    ranked = sorted(range(len(code)), key=lambda k: -code[k].samples)[:top]
    for k in ranked:
        ins = code[k]
        lines.append(f"  {k}: {100 * ins.samples / total:.1f}%, {ins.executed}, "
                     f"{ins.source[:64]}, {reasons([ins], 2)}")  # fmt: skip
    lines += conflicts(code)
    return lines


def conflicts(code: list[Instruction]) -> list[str]:
    """The shared-memory accesses that take more wavefronts than their ideal (bank
    conflicts), most excess first, and the excess's share of all shared wavefronts; nothing
    where the page has no wavefront counts."""
    total = sum(i.wavefronts for i in code)
    bad = [k for k, i in enumerate(code) if i.wavefronts > i.ideal > 0]
    if not total or not bad:
        return []
    excess = sum(code[k].wavefronts - code[k].ideal for k in bad)
    lines = [f"shared bank conflicts: {len(bad)} instructions, {100 * excess / total:.1f}% of "
             f"{total} shared wavefronts in excess (index: wavefronts / ideal, instruction):"]  # fmt: skip
    for k in sorted(bad, key=lambda k: code[k].ideal - code[k].wavefronts):
        ins = code[k]
        lines.append(f"  {k}: {ins.wavefronts / ins.ideal:.2f}x, {ins.source[:64]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    with open(args.csv, newline="") as f:
        code = read_source_page(f.read().splitlines())
    print("\n".join(summary(code, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
