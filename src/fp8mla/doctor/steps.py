"""Decode-step segmentation, per-step time accounting, and the layer count.

Methods, in the order tried:

- ``markers``: ``ProfilerStep#N`` ranges (torch.profiler's schedule); a launch belongs to the
  step during which the host issued it.
- ``repeating-structure``: no markers (serving engines write none). The launch-name sequence
  of a decode loop repeats once per step; a launch that occurs exactly once per step (sampling,
  a graph replay, the logits GEMM) is an anchor whose spacing is the period. Steps are cut at
  the anchors, shifted to where the device idles longest within the period.
- ``idle-gaps``: no repeating structure, but clearly separated bursts of work.
- ``whole-trace``: none of the above; the trace is one window.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from fp8mla.doctor.records import Launch, Marker

__all__ = ["Segmentation", "Step", "infer_layers", "segment"]

_MIN_SCORE = 0.85  # share of positions where the sequence repeats after one period


@dataclass
class Step:
    """One decode step: its launches and its time window (µs)."""

    index: int
    name: str
    start: float
    end: float
    launches: list[Launch]
    busy: float = 0.0
    families: dict[str, list[float]] = field(default_factory=dict)  # family → [launches, µs]

    @property
    def wall(self) -> float:
        """Wall time of the step in µs."""
        return max(self.end - self.start, 0.0)

    @property
    def idle_share(self) -> float:
        """Share of the wall time with no launch running (0–1)."""
        return max(0.0, 1.0 - self.busy / self.wall) if self.wall > 0 else 0.0


@dataclass
class Segmentation:
    """The steps found, how (``method``), and a sentence on the evidence (``detail``)."""

    steps: list[Step]
    method: str
    detail: str


def _busy(launches: Sequence[Launch]) -> float:
    """Time covered by at least one launch (overlapping streams count once)."""
    total = 0.0
    cur_start = cur_end = None
    for launch in sorted(launches, key=lambda x: x.start):
        if cur_end is None or launch.start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = launch.start, launch.end
        elif launch.end > cur_end:
            cur_end = launch.end
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _finish(steps: list[Step]) -> list[Step]:
    steps = [s for s in steps if s.launches]
    for i, step in enumerate(steps):
        step.index = i
        step.busy = _busy(step.launches)
        fams: dict[str, list[float]] = {}
        for launch in step.launches:
            acc = fams.setdefault(launch.family, [0, 0.0])
            acc[0] += 1
            acc[1] += launch.dur
        step.families = fams
    return steps


def _by_markers(launches: list[Launch], markers: list[Marker]) -> Segmentation | None:
    best: dict[str, Marker] = {}
    for m in markers:  # the same step can be marked on several threads: keep the longest
        if m.name not in best or m.end - m.ts > best[m.name].end - best[m.name].ts:
            best[m.name] = m
    ordered = sorted(best.values(), key=lambda m: m.ts)
    starts = [m.ts for m in ordered]
    buckets: list[list[Launch]] = [[] for _ in ordered]
    assigned = 0
    for launch in launches:
        i = bisect.bisect_right(starts, launch.issue) - 1
        if i >= 0 and launch.issue < ordered[i].end:
            buckets[i].append(launch)
            assigned += 1
    if launches and assigned * 2 < len(launches):
        return None
    steps = []
    for m, bucket in zip(ordered, buckets):
        span_end = m.end
        if bucket:  # work issued in the step may run on the device after the marker closes
            first = min(x.start for x in bucket)
            last = max(x.end for x in bucket)
            span_end = m.ts + max(m.end - m.ts, last - first)
        steps.append(Step(0, m.name, m.ts, span_end, bucket))
    finished = _finish(steps)
    detail = f"{len(ordered)} ProfilerStep marker{'s' if len(ordered) != 1 else ''}"
    if len(finished) != len(ordered):
        detail += f", {len(finished)} with work"
    return Segmentation(finished, "markers", detail)


def _idle_before(launches: Sequence[Launch]) -> list[float]:
    """For each launch, the time since every earlier launch had finished (0 if overlapping)."""
    gaps = []
    horizon = None
    for launch in launches:
        gaps.append(0.0 if horizon is None else max(0.0, launch.start - horizon))
        horizon = launch.end if horizon is None else max(horizon, launch.end)
    return gaps


def _score(tokens: Sequence[int], period: int) -> float:
    n = len(tokens) - period
    if n <= 0:
        return 0.0
    stride = max(1, n // 20000)
    idx = range(0, n, stride)
    return sum(1 for i in idx if tokens[i] == tokens[i + period]) / len(idx)


def _anchor(tokens: Sequence[int]) -> tuple[int, list[int]] | None:
    """The longest regular period of some token that the whole sequence repeats with."""
    positions: dict[int, list[int]] = defaultdict(list)
    for i, tok in enumerate(tokens):
        positions[tok].append(i)
    n = len(tokens)
    candidates = []
    for pos in positions.values():
        if len(pos) < 2:
            continue
        gaps = [b - a for a, b in zip(pos, pos[1:])]
        period = round(statistics.median(gaps))
        if period < 2 or 2 * period > n:
            continue
        regular = sum(1 for g in gaps if abs(g - period) <= 0.1 * period) / len(gaps)
        if regular >= 0.8:
            candidates.append((period, len(pos), pos))
    candidates.sort(key=lambda c: (-c[0], c[1]))
    for period, _, pos in candidates:
        if _score(tokens, period) >= _MIN_SCORE:
            return period, pos
    return None


def _cut(launches: list[Launch], bounds: list[int], period: int | None) -> list[Step]:
    """Steps between consecutive boundaries; the partial head and tail only if full-sized."""
    segments = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    lengths = [b - a for a, b in segments]
    typical = period or (statistics.median(lengths) if lengths else 0)
    tol = max(1.0, 0.02 * typical)
    if bounds and bounds[0] > 0 and abs(bounds[0] - typical) <= tol:
        segments.insert(0, (0, bounds[0]))
    if (
        bounds
        and len(launches) - bounds[-1] > 0
        and abs(len(launches) - bounds[-1] - typical) <= tol
    ):
        segments.append((bounds[-1], len(launches)))
    steps = []
    for i, (a, b) in enumerate(segments):
        chunk = launches[a:b]
        start = chunk[0].start
        if i + 1 < len(segments) and segments[i + 1][0] == b:
            end = launches[b].start
        else:
            end = max(x.end for x in chunk)
        steps.append(Step(i, f"step {i}", start, end, chunk))
    return steps


def _by_structure(launches: list[Launch]) -> Segmentation | None:
    ids: dict[str, int] = {}
    tokens = [ids.setdefault(x.name, len(ids)) for x in launches]
    found = _anchor(tokens)
    if found is None:
        return None
    period, pos = found
    gaps = _idle_before(launches)
    sample = pos[:: max(1, len(pos) // 64)]
    best_shift, best_gap = 0, -1.0
    for shift in range(period):
        total = sum(gaps[p - shift] for p in sample if p - shift >= 0)
        if total > best_gap * 1.000001:
            best_shift, best_gap = shift, total
    bounds = sorted({p - best_shift for p in pos if p - best_shift >= 0})
    detail = (
        f"the launch sequence repeats every {period} launches "
        f"(anchor: {launches[pos[0]].name[:60]!r}, {len(pos)} occurrences)"
    )
    grouped = _super_period(bounds, gaps)
    if grouped is not None:  # the repeating unit was a layer: steps are k units apart
        bounds, k = grouped
        period *= k
        detail += f", {k} repeats per step (longer idle gaps every {k} repeats)"
    steps = _finish(_cut(launches, bounds, period))
    if len(steps) < 2:
        return None
    return Segmentation(steps, "repeating-structure", detail)


def _split(values: Sequence[float]) -> float | None:
    """A threshold separating a few clearly larger values (≥ 4× the rest), or None."""
    top = sorted(values, reverse=True)[:2000]
    best_i, best_ratio = 0, 0.0
    for i in range(1, len(top)):
        if top[i - 1] < 50.0:  # µs: shorter pauses are launch jitter, not step boundaries
            break
        ratio = top[i - 1] / max(top[i], 1e-3)
        if ratio > best_ratio:
            best_i, best_ratio = i, ratio
    return top[best_i - 1] if best_ratio >= 4.0 else None


def _super_period(bounds: list[int], gaps: list[float]) -> tuple[list[int], int] | None:
    """Boundaries every k-th of which follows a much longer idle gap: (those, k), or None."""
    if len(bounds) < 3:
        return None
    at_bounds = [gaps[b] for b in bounds]
    threshold = _split(at_bounds)
    if threshold is None:
        return None
    big = [j for j, g in enumerate(at_bounds) if g >= threshold]
    spacing = {b - a for a, b in zip(big, big[1:])}
    if len(big) < 2 or len(spacing) != 1:
        return None
    k = spacing.pop()
    return ([bounds[j] for j in big], k) if k >= 2 else None


def _by_gaps(launches: list[Launch]) -> Segmentation | None:
    gaps = _idle_before(launches)
    threshold = _split(gaps)
    if threshold is None:
        return None
    bounds = [i for i, g in enumerate(gaps) if g >= threshold]
    steps = _cut(launches, bounds, None)
    counts = [len(s.launches) for s in steps]
    if len(steps) < 2 or statistics.pstdev(counts) > 0.25 * statistics.mean(counts):
        return None
    detail = f"{len(bounds)} idle gaps of ≥ {threshold / 1000:.2f} ms split the work"
    return Segmentation(_finish(steps), "idle-gaps", detail)


def segment(launches: list[Launch], markers: list[Marker]) -> Segmentation:
    """Split the launches (in start order) into decode steps."""
    note = ""
    if markers:
        seg = _by_markers(launches, markers)
        if seg is not None and seg.steps:
            return seg
        note = "; ProfilerStep markers hold too few launches, ignored"
    for method in (_by_structure, _by_gaps):
        seg = method(launches)
        if seg is not None:
            seg.detail += note
            return seg
    if not launches:
        return Segmentation([], "whole-trace", "nothing to segment" + note)
    whole = Step(0, "trace", launches[0].start, max(x.end for x in launches), launches)
    return Segmentation(
        _finish([whole]),
        "whole-trace",
        "no markers, no repeating launch sequence, no idle gaps between bursts" + note,
    )


LAYER_SCORE = 0.6  # share of a step's launches that recur one layer later
MIN_LAYER_KERNELS = 3  # distinct kernels a layer repeats (a norm, a GEMM, attention, ...)
MAX_REPEATS = 4  # a kernel runs at most this many times per layer


def infer_layers(steps: list[Step]) -> tuple[int | None, str]:
    """The layer count of a step, or None when the step shows no layer structure.

    Each per-step launch count L is scored by the launches of kernels whose count is a small
    multiple of L (1–4 per layer); the largest L scoring within 10% of the best wins (78 for a
    78-layer model whose layers launch each kernel 1, 2 or 3 times: 2 and 39 score as well, 156
    far worse). A count is a layer count only if a layer looks like one: at least three
    different kernels repeat with it, GEMMs among them beside another kind of work, and they
    make up at least half of the step's launches. Training steps, optimizer loops and single
    benchmark kernels usually fail this and get no layer count.
    """
    if not steps:
        return None, "no steps"
    per_step: dict[str, list[int]] = defaultdict(list)
    family: dict[str, str] = {}
    for step in steps:
        counts = Counter(x.name for x in step.launches)
        for x in step.launches:
            family.setdefault(x.name, x.family)
        for name in counts.keys() | per_step.keys():
            per_step[name].append(counts.get(name, 0))
    typical = {
        name: round(statistics.median(c + [0] * (len(steps) - len(c))))
        for name, c in per_step.items()
    }
    typical = {name: c for name, c in typical.items() if c >= 2}
    if not typical:
        return None, "no layer structure: no kernel repeats within a step"
    launches = sum(len(s.launches) for s in steps) / len(steps)

    def members(candidate: int) -> list[str]:
        return [
            n for n, c in typical.items() if c % candidate == 0 and c // candidate <= MAX_REPEATS
        ]

    coverage = {
        candidate: sum(typical[n] for n in members(candidate))
        for candidate in set(typical.values())
    }
    best = max(coverage.values())
    ranked = sorted(
        coverage,
        key=lambda c: (coverage[c] < 0.9 * best, -c if coverage[c] >= 0.9 * best else -coverage[c]),
    )
    typical_step = sorted(steps, key=lambda s: len(s.launches))[len(steps) // 2]
    ids: dict[str, int] = {}
    tokens = [ids.setdefault(x.name, len(ids)) for x in typical_step.launches]
    for candidate in ranked:
        names = members(candidate)
        kinds = {family.get(n, "other") for n in names}
        if (
            len(names) >= MIN_LAYER_KERNELS
            and "gemm" in kinds
            and len(kinds) >= 2
            and coverage[candidate] * 2 >= launches
            and _layers_repeat(tokens, candidate, sum(typical[n] for n in names))
        ):
            return candidate, (
                f"{coverage[candidate] / launches:.0%} of a step's launches come from "
                f"{len(names)} kernels launched 1–{MAX_REPEATS} times per layer "
                f"({', '.join(sorted(k for k in kinds))})"
            )
    return None, (
        "no layer structure: no repeat count is shared by GEMMs and other kernels making up "
        "half of a step's launches in a sequence that repeats layer after layer"
    )


def _layers_repeat(tokens: Sequence[int], layers: int, member_launches: int) -> bool:
    """True when a step's launch sequence repeats with the period of one layer: the same
    kernel ``period`` launches later at most positions (not just counts that divide evenly)."""
    guesses = {
        round(member_launches / layers),
        *range(len(tokens) // layers - 1, -(-len(tokens) // layers) + 2),
    }
    return any(_score(tokens, p) >= LAYER_SCORE for p in guesses if p >= MIN_LAYER_KERNELS)
