"""Bench output: JSON lines, a text table and a bandwidth plot."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path


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
