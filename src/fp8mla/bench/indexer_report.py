"""The indexer section's goals read off its JSON lines: one line per goal, met or missed.

python -m fp8mla.bench.indexer_report RESULTS.jsonl   # the last run's indexer records

Speed-ups compare records of the same timing (CUDA-graph replays where both have them, else
``do_bench``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from fp8mla.bench.indexer_cases import INDEXER_CASES, LAYER_CASE
from fp8mla.bench.report import beside_goal, meets, print_last_run


def _pick(records: Sequence[dict], case: str, impl: str, timing: str) -> dict | None:
    found = [r for r in records if r.get("case") == case and r.get("impl") == impl
             and r.get("timing", "").startswith(timing)]  # fmt: skip
    return found[-1] if found else None


def speedup(records: Sequence[dict], case: str, ours: str, theirs: str) -> tuple[float, str] | None:
    """``theirs / ours`` time and the timing it was read from."""
    for timing in ("cuda-graph", "do_bench"):
        a, b = _pick(records, case, ours, timing), _pick(records, case, theirs, timing)
        if a is not None and b is not None:
            return b["us_median"] / a["us_median"], timing
    return None


def goal_lines(records: Sequence[dict]) -> list[str]:
    """``case: what (measured) goal -> met / MISSED / not measured``, one line per goal."""
    lines = []

    def line(what: str, got: tuple[float, str] | None, goal: float, unit: str) -> None:
        if got is None:
            lines.append(f"{what}: not measured (goal >= {goal:g}{unit})")
            return
        value, timing = got
        shown = beside_goal(value, goal, higher=True)
        lines.append(f"{what}: {shown}{unit} ({timing}; goal >= {goal:g}{unit}) -> "
                     f"{'met' if meets(value, goal, higher=True) else 'MISSED'}")  # fmt: skip

    for case in INDEXER_CASES:
        line(f"{case.name} fp8mla logits+top-k vs vllm-triton (logits + torch.topk)",
             speedup(records, case.name, "fp8mla", "vllm-triton"), 2, "x")  # fmt: skip
        got = speedup(records, case.name, "fp8mla-logits", "vllm-triton-logits")
        if got is not None:
            lines.append(f"{case.name} logits alone vs vllm-triton-logits: {got[0]:.3g}x "
                         f"({got[1]})")  # fmt: skip
        for path in ("fp8mla-fused", "fp8mla-two-pass"):
            r = _pick(records, case.name, path, "cuda-graph") or _pick(
                records, case.name, path, "do_bench"
            )
            if r is not None:
                lines.append(f"{case.name} {path}: {r['us_median']:.1f} us ({r['timing']})")
    name = f"DSA_{LAYER_CASE.name}"
    line(f"{name} DSA layer vs dense fp8mla decode", speedup(records, name, "fp8mla-dsa",
                                                             "fp8mla-dense"), 5, "x")  # fmt: skip
    errs = [r["rel_err"] for r in records if r.get("section") == "indexer"
            and r.get("impl") == "fp8mla-logits" and r.get("rel_err") is not None]  # fmt: skip
    if errs:
        worst = max(errs)
        # the tests' bound on a GPU, whose tensor cores add FP8 products at FP8 precision
        lines.append(f"fp8mla logits worst error vs float64: {worst:.2e} (goal <= 5e-4) -> "
                     f"{'met' if worst <= 5e-4 else 'MISSED'}")  # fmt: skip
    overlaps = [r["topk_overlap"] for r in records if r.get("section") == "indexer"
                and r.get("impl", "").startswith("fp8mla") and "topk_overlap" in r]  # fmt: skip
    if overlaps:
        lines.append(f"fp8mla top-k overlap with the float64 top-k: worst {min(overlaps):.4f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return print_last_run(
        argv, "indexer_report", lambda r: r.get("section") == "indexer", goal_lines
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
