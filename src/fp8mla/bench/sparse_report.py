"""The sparse section's goals read off its JSON lines: one line per goal, met or missed.

python -m fp8mla.bench.sparse_report RESULTS.jsonl   # the last run's sparse records
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from fp8mla.bench.report import beside_goal, meets, print_last_run
from fp8mla.bench.sparse_cases import PACK_TOKENS, SPARSE_LAYERS


def _pick(records: Sequence[dict], case: str, impl: str) -> dict | None:
    found = [r for r in records if r.get("case") == case and r.get("impl") == impl]
    return found[-1] if found else None


def _speedup(records: Sequence[dict], case: str, other: str) -> float | None:
    ours, theirs = _pick(records, case, "fp8mla"), _pick(records, case, other)
    if ours is None or theirs is None:
        return None
    return theirs["us_median"] / ours["us_median"]


def goal_lines(records: Sequence[dict]) -> list[str]:
    """``case: what (measured) goal -> met / MISSED / not measured``, one line per goal."""
    lines = []

    def line(what: str, value: float | None, goal: float, unit: str, higher: bool) -> None:
        if value is None:
            lines.append(f"{what}: not measured (goal {goal:g}{unit})")
            return
        sign = ">=" if higher else "<="
        shown = beside_goal(value, goal, higher=higher)
        lines.append(f"{what}: {shown}{unit} (goal {sign} {goal:g}{unit}) -> "
                     f"{'met' if meets(value, goal, higher=higher) else 'MISSED'}")  # fmt: skip

    def value(case: str, impl: str, key: str, scale: float = 1.0) -> float | None:
        r = _pick(records, case, impl)
        return None if r is None or r.get(key) is None else r[key] * scale

    case = "B128_H16_K2048"
    line(f"{case} fp8mla packed TB/s", value(case, "fp8mla", "gbps", 1e-3), 2.5, " TB/s", True)
    line(f"{case} fp8mla time", value(case, "fp8mla", "us_median"), 69, " us", False)
    line(
        f"{case} vs vllm-triton-sparse", _speedup(records, case, "vllm-triton-sparse"), 2, "x", True
    )
    line(f"{case} vs gather-dequant", _speedup(records, case, "gather-dequant"), 3, "x", True)
    case = "B128_H128_K2048_Q2"
    line(f"{case} fp8mla TFLOP/s", value(case, "fp8mla", "tflops"), 450, "", True)
    line(f"{case} vs flashmla-sparse-fp8", _speedup(records, case, "flashmla-sparse-fp8"), 1.1, "x",
         True)  # fmt: skip
    case = "T4096_H128_K2048"
    line(f"{case} fp8mla TFLOP/s", value(case, "fp8mla", "tflops"), 450, "", True)
    case = f"LAYERS{SPARSE_LAYERS}_B1_H32_K2048"
    line(f"{case} fp8mla us per layer", value(case, "fp8mla", "us_median"), 10, " us", False)
    case = f"PACK_N{PACK_TOKENS}"
    line(f"{case} pack_ds_mla TB/s", value(case, "fp8mla-pack", "gbps", 1e-3), 2, " TB/s", True)
    errs = [r["rel_err"] for r in records if r.get("section") == "sparse" and r.get("impl") == "fp8mla"
            and r.get("rel_err") is not None]  # fmt: skip
    line("fp8mla worst error vs float64", max(errs) if errs else None, 3e-3, "", False)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return print_last_run(argv, "sparse_report", lambda r: r.get("section") == "sparse", goal_lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
