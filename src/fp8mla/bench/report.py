"""Bench output: JSON lines, a text table, the goal lines and a bandwidth plot.

python -m fp8mla.bench.report RESULTS.jsonl   # the goal lines of the file's last run
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fp8mla.bench.cases import Case


def gpu_slug(gpu: str) -> str:
    """The GPU's name as a file name: ``NVIDIA H200`` → ``nvidia-h200``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()


def results_path(out_dir: Path, gpu: str) -> Path:
    """The GPU's results file, which every run appends to: ``<out_dir>/<gpu slug>.jsonl``."""
    return out_dir / f"{gpu_slug(gpu)}.jsonl"


def append_jsonl(path: Path, records: Sequence[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def format_table(records: Sequence[dict]) -> str:
    head = (
        f"{'case':40} {'impl':19} {'us':>9} {'p20-p80':>15} {'GB/s':>7} {'TFLOP/s':>8} "
        f"{'xfloor':>6} {'rel_err':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        err = "-" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
        spread = f"{r['us_p20']:.1f}-{r['us_p80']:.1f}"
        num = lambda v, fmt, width: f"{v:{width}{fmt}}" if v is not None else f"{'-':>{width}}"
        lines.append(
            f"{r['case']:40} {r['impl']:19} {r['us_median']:9.1f} {spread:>15} "
            f"{num(r.get('gbps'), '.0f', 7)} {num(r.get('tflops'), '.1f', 8)} "
            f"{num(r.get('x_floor'), '.2f', 6)} {err:>8}"
        )
    return "\n".join(lines)


def plot_bandwidth(records: Sequence[dict], path: Path, impl: str = "fp8mla") -> bool:
    """Achieved KV bandwidth vs context, one line per batch size (16 heads, page size 1, FP8),
    with the measured copy bandwidth as the floor line. Returns False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [
        r
        for r in records
        if r.get("section") != "sparse"
        and r["impl"] == impl
        and r["heads"] == 16
        and r["page_size"] == 1
        and r["kv_dtype"].startswith("float8")
        and not r["case"].startswith("SEED")
    ]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for batch in sorted({r["batch"] for r in rows}):
        pts = sorted((r["context"], r["gbps"]) for r in rows if r["batch"] == batch)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"batch {batch}")
    copy = rows[0]["copy_tbps"] * 1e3
    ax.axhline(copy, color="k", linestyle="--", label=f"copy bandwidth {copy:.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("effective KV read (GB/s)")
    ax.set_title(f"{impl}: MLA decode, 16 heads, FP8 e4m3 pool ({rows[0]['gpu']})")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


@dataclass(frozen=True)
class GoalCheck:
    """One goal of a goal case, as its ``goal`` string states it: ``ours``'s time at most
    ``target`` µs (``kind`` "us"), its TFLOP/s at least ``target`` ("tflops"), its time at
    most ``target`` × ``other``'s ("x_time"), or ``other``'s time over its own at least
    ``target`` ("speedup"; above it when ``strict``)."""

    case: str
    kind: str
    target: float
    other: str = ""
    ours: str = "fp8mla"
    strict: bool = False
    note: str = ""


def _memory_bound(case: Case, us: float) -> list[GoalCheck]:
    name = case.name
    return [
        GoalCheck(name, "us", us),
        GoalCheck(name, "x_time", 0.5, "flashinfer-bf16kv"),
        GoalCheck(name, "speedup", 1.7, "fp8mla-bf16kv"),
    ]


def _fp8_queries(name: str) -> list[GoalCheck]:
    """The compute-bound FP8-query goals: 770 TFLOP/s and 1.25x FlashMLA's FP8 path."""
    return [
        GoalCheck(name, "tflops", 770, ours="fp8mla-fp8q"),
        GoalCheck(name, "speedup", 1.25, "flashmla-fp8", ours="fp8mla-fp8q"),
    ]


B64_H128 = Case(64, 128, 4096).name
B64_H64 = Case(64, 64, 4096).name
GOAL_CHECKS: list[GoalCheck] = [
    *_memory_bound(Case(32, 32, 4096), 30),
    *_memory_bound(Case(64, 16, 4096), 45),
    *_memory_bound(Case(8, 32, 16384), 30),
    GoalCheck(Case(1, 32, 4096).name, "us", 10),
    GoalCheck(B64_H128, "tflops", 500),
    GoalCheck(B64_H128, "us", 125),
    GoalCheck(B64_H128, "x_time", 0.93, "flashinfer-bf16kv"),
    GoalCheck(B64_H128, "us", 95, ours="fp8mla-fp8q"),
    *_fp8_queries(B64_H128),
    *_fp8_queries(Case(128, 128, 8192).name),
    *_fp8_queries(Case(64, 128, 4096, qo_len=2).name),
    *(
        GoalCheck(B64_H64, "speedup", 1.0, other, ours=ours, strict=True)
        for ours in ("fp8mla", "fp8mla-fp8q")
        for other in ("flashmla-fp8", "flashinfer-bf16kv")
    ),
]


def meets(value: float, goal: float, *, higher: bool, strict: bool = False) -> bool:
    """Whether ``value`` meets ``goal``: a floor with ``higher`` (``strict``: strictly above
    it), else a ceiling."""
    if higher:
        return value > goal if strict else value >= goal
    return value <= goal


def beside_goal(value: float, goal: float, *, higher: bool, strict: bool = False,
                spec: str = ".3g") -> str:  # fmt: skip
    """``value`` as ``spec`` formats it, with more digits (up to six more) where that rounding
    would land on the other side of ``goal`` than the value itself (:func:`meets`): 10.022
    against a ceiling of 10 reads ``10.02``, not ``10``, beside its "MISSED"."""
    m = re.fullmatch(r"\.(\d+)([fg])", spec)
    if m is None:
        raise ValueError(f"expected a spec of the form '.3g' or '.1f', got {spec!r}")
    digits, kind = int(m.group(1)), m.group(2)
    verdict = meets(value, goal, higher=higher, strict=strict)
    shown = format(value, spec)
    for more in range(1, 7):
        if meets(float(shown), goal, higher=higher, strict=strict) == verdict:
            break
        shown = format(value, f".{digits + more}{kind}")
    return shown


def _pick(records: Sequence[dict], case: str, impl: str) -> dict | None:
    found = [r for r in records if r.get("case") == case and r.get("impl") == impl]
    return found[-1] if found else None


def _err(row: dict) -> str:
    return "-" if row.get("rel_err") is None else f"{row['rel_err']:.1e}"


def goal_line(records: Sequence[dict], check: GoalCheck) -> str:
    """``case: what value (goal) -> met / MISSED / not measured``; comparisons name both
    implementations' errors against float64 beside their ratio."""
    short = check.case.removesuffix("_float8_e4m3fn")
    ours = f"{check.ours} ({check.note})" if check.note else check.ours
    t = f"{check.target:g}"
    what, goal = {
        "us": (f"{short} {ours} time", f"goal <= {t} us"),
        "tflops": (f"{short} {ours} TFLOP/s", f"goal >= {t}"),
        "x_time": (f"{short} {ours} time / {check.other}'s", f"goal <= {t}x"),
        "speedup": (
            f"{short} {ours} speedup over {check.other}",
            f"goal {'>' if check.strict else '>='} {t}x",
        ),
    }[check.kind]
    mine = _pick(records, check.case, check.ours)
    theirs = _pick(records, check.case, check.other) if check.other else None
    if mine is None or (check.other and theirs is None):
        return f"{what}: not measured ({goal})"
    higher = check.kind in ("tflops", "speedup")
    goal_side = dict(higher=higher, strict=check.strict and higher)

    if check.kind == "us":
        value = mine["us_median"]
        shown = f"{beside_goal(value, check.target, **goal_side, spec='.1f')} us"
    elif check.kind == "tflops":
        value = mine["tflops"]
        shown = f"{beside_goal(value, check.target, **goal_side, spec='.0f')} TFLOP/s"
    elif check.kind == "x_time":
        value = mine["us_median"] / theirs["us_median"]
        shown = (f"{beside_goal(value, check.target, **goal_side, spec='.2f')}x "
                 f"({mine['us_median']:.1f} / {theirs['us_median']:.1f} us)")  # fmt: skip
    else:
        value = theirs["us_median"] / mine["us_median"]
        shown = (f"{beside_goal(value, check.target, **goal_side, spec='.2f')}x "
                 f"({theirs['us_median']:.1f} / {mine['us_median']:.1f} us)")  # fmt: skip
    ok = meets(value, check.target, **goal_side)
    errs = f"; rel_err {check.ours} {_err(mine)}"
    if theirs is not None:
        errs += f", {check.other} {_err(theirs)}"
    return f"{what}: {shown} ({goal}{errs}) -> {'met' if ok else 'MISSED'}"


def goal_lines(records: Sequence[dict]) -> list[str]:
    """One line per goal of the goal cases (:data:`GOAL_CHECKS`), met or missed, from the
    goal section's records (a sweep case of the same shape carries no goal)."""
    goal_rows = [r for r in records if r.get("goal")]
    return [goal_line(goal_rows, check) for check in GOAL_CHECKS]


def print_last_run(
    argv: Sequence[str] | None,
    module: str,
    keep: Callable[[dict], bool],
    lines_of: Callable[[Sequence[dict]], list[str]],
) -> int:
    """The body of each ``python -m fp8mla.bench.<module> RESULTS.jsonl``: the records that
    ``keep`` selects, those of the last run among them, printed as ``lines_of`` words them."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(f"usage: python -m fp8mla.bench.{module} RESULTS.jsonl", file=sys.stderr)
        return 2
    rows = [json.loads(x) for x in Path(args[0]).read_text().splitlines() if x.strip()]
    rows = [r for r in rows if keep(r)]
    if rows:
        rows = [r for r in rows if r.get("run") == rows[-1].get("run")]
    print("\n".join(lines_of(rows)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    names = {check.case for check in GOAL_CHECKS}
    # the last run in the file that timed a goal case
    return print_last_run(argv, "report",
                          lambda r: r.get("case") in names and r.get("section") is None,
                          goal_lines)  # fmt: skip


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
