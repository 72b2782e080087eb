"""Same-run A/B tables of ``benchmarks/time_revision.py --sparse`` files, and their records.

    python benchmarks/ab_sparse.py OUT/*.json [--base main]
    python benchmarks/ab_sparse.py OUT/*.json --append benchmarks/results/GPU.jsonl --run s27c \\
        --revision main="main c924db8, as landed" --revision old="main 9d806c7" \\
        --tests main="tests/dsa: 439 passed" --tests old="as its s27a rows"

Each file is one timing of one source tree (its rows' ``label``); the files are taken in the
order given, which for alternating rounds (``run_ab_on_gpu.sh``) is the order they ran. The
table has one row a case and one column a tree, each with every timing's µs in order and the
change of its median against the ``--base`` tree's (default: the first label seen).

``--append FILE`` adds every timing to a results file as section ``sparse-ab`` records, one a
case and timing, each naming its run (``--run``), the tree it timed (``--revision
LABEL=TEXT``, one for every label) and that tree's GPU tests (``--tests LABEL=TEXT``). The
GPU, date, torch and Triton come from the rows (``time_revision.py`` writes them), or from
``--gpu`` / ``--date`` / ``--torch`` / ``--triton`` for files written before it did.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

TIMING = "cuda-graph x10, two index lists alternating (benchmarks/time_revision.py --sparse)"
ENV_KEYS = ("gpu", "date", "torch", "triton")


def load(paths: list[str]) -> list[dict]:
    """Every row of the files, in order, each with ``round``: its file's place among the
    files of its label (0, 1, ...)."""
    rows, seen = [], {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            file_rows = json.load(f)
        if not isinstance(file_rows, list) or not file_rows:
            raise ValueError(f"{path}: expected a non-empty list of time_revision.py rows")
        label = file_rows[0]["label"]
        n = seen[label] = seen.get(label, -1) + 1
        rows += [dict(r, round=n) for r in file_rows]
    return rows


def table(rows: list[dict], base: str | None = None) -> str:
    """The markdown A/B table of ``rows`` (µs a call; each tree's median against the
    base's)."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    base = base or labels[0]
    if base not in labels:
        raise ValueError(f"no rows of --base {base!r}; labels: {', '.join(labels)}")
    cases = list(dict.fromkeys(r["case"] for r in rows))
    us = {(r["case"], r["label"]): [] for r in rows}
    for r in rows:
        us[r["case"], r["label"]].append(r["us"])
    out = ["| case | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for case in cases:
        ref = us.get((case, base))
        cells = []
        for label in labels:
            vals = us.get((case, label))
            if not vals:
                cells.append("")
                continue
            text = ", ".join(f"{v:,.2f}" if v < 1000 else f"{v:,.1f}" for v in vals)
            if ref and label != base:
                change = statistics.median(vals) / statistics.median(ref) - 1
                text += f" ({change:+.1%})"
            cells.append(text)
        out.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def records(rows: list[dict], run: str, revision: dict, tests: dict, env: dict) -> list[dict]:
    """``rows`` as section ``sparse-ab`` records (see the module's docstring)."""
    from fp8mla.bench.sparse_cases import SPARSE_CASES, case_from_name

    known = {c.name: c for c in SPARSE_CASES}
    missing = sorted({r["label"] for r in rows} - set(revision))
    if missing:
        raise ValueError(f"--revision needed for {', '.join(missing)}")
    out = []
    for r in rows:
        case = known.get(r["case"]) or case_from_name(r["case"])
        where = {k: r.get(k) or env.get(k) for k in ENV_KEYS}
        lacking = [k for k, v in where.items() if not v]
        if lacking:
            raise ValueError(
                f"{r['case']} of {r['label']}: no {', '.join(lacking)} (--{lacking[0]})"
            )
        out.append(
            dict(section="sparse-ab", **where, timing=TIMING, page_size=case.page_size,
                 pool_slots=case.pool_slots, impl="fp8mla", case=r["case"], tokens=case.tokens,
                 heads=case.heads, topk=case.topk, us_median=r["us"], us_p20=r["p20"],
                 us_p80=r["p80"], gbps=round(r["tbps"] * 1000, 1), tflops=r["tflops"],
                 rel_err=r["rel_err"], lse_rel_err=r["lse_rel_err"],
                 edge_rel_err=r["edge_rel_err"], empty_row_ok=r["empty_row_ok"],
                 kernel=r["kernel"], splits=r["splits"], run=run,
                 revision=revision[r["label"]], tests=tests.get(r["label"], "not run"))
        )  # fmt: skip
    return out


def pairs(items: list[str], flag: str) -> dict:
    out = {}
    for item in items:
        label, sep, text = item.partition("=")
        if not sep or not label:
            raise ValueError(f"{flag} takes LABEL=TEXT, got {item!r}")
        out[label] = text
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="time_revision.py --sparse JSON files")
    ap.add_argument("--base", help="the tree the others are compared with (default: first)")
    ap.add_argument("--append", metavar="RESULTS", help="add the rows to this JSONL file")
    ap.add_argument("--run", help="the run's name in the records (with --append)")
    ap.add_argument("--revision", action="append", default=[], metavar="LABEL=TEXT")
    ap.add_argument("--tests", action="append", default=[], metavar="LABEL=TEXT")
    for key in ENV_KEYS:
        ap.add_argument(f"--{key}", help=f"the records' {key} where the rows lack it")
    args = ap.parse_args(argv)
    try:
        rows = load(args.files)
        print(table(rows, args.base))
        if args.append:
            if not args.run:
                ap.error("--append needs --run")
            env = {k: getattr(args, k) for k in ENV_KEYS}
            recs = records(rows, args.run, pairs(args.revision, "--revision"),
                           pairs(args.tests, "--tests"), env)  # fmt: skip
            with open(args.append, "a", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in recs)
            print(f"appended {len(recs)} records of run {args.run} to {args.append}")
    except (OSError, ValueError) as e:
        print(f"ab_sparse: {e}", file=sys.stderr)
        return 1
    except KeyError as e:
        print(f"ab_sparse: a row lacks {e}: not a time_revision.py --sparse file", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
