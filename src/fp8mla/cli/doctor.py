"""``fp8mla doctor``: diagnose a torch.profiler trace of a decode loop. See ``docs/doctor.md``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn

_EXAMPLE = """examples:
  fp8mla doctor trace.json.gz
  fp8mla doctor trace.json.gz --json > report.json
  fp8mla doctor traces/ --html report.html              # one report per rank + summary
  fp8mla doctor trace.json.gz --source-root ~/sglang/python
  fp8mla doctor trace.json.gz --model glm-5 --gpu h200 --tp 2 --context 3000"""


def _fail(message: str) -> NoReturn:
    """Bad usage: one line on stderr, exit status 2 (argparse's convention)."""
    print(f"fp8mla doctor: error: {message}", file=sys.stderr)
    sys.exit(2)


def register(subparsers: Any) -> None:
    """Add the ``doctor`` parser to the ``fp8mla`` dispatcher."""
    p = subparsers.add_parser(
        "doctor",
        help="find full-pool KV casts and other step costs in a torch.profiler trace",
        description=(
            "Read a torch.profiler Chrome trace (.json or .json.gz; a directory gives one report\n"
            "per rank and a summary), segment decode steps, and report what costs step time,\n"
            "most costly first, with the Python function that launched it and the fix."
        ),
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.error = _fail  # type: ignore[method-assign]  # one-line errors, exit 2
    p.add_argument("trace", metavar="TRACE", help="trace file or directory of per-rank traces")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    out.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    out.add_argument(
        "--no-progress", action="store_true", help="no progress lines on stderr for large traces"
    )
    out.add_argument(
        "--fail-on",
        choices=("high", "medium", "low"),
        help="exit with status 1 when a finding of this severity or worse exists",
    )
    hints = p.add_argument_group("analysis hints")
    hints.add_argument("--layers", type=int, help="layer count (default: inferred)")
    hints.add_argument(
        "--active-tokens",
        type=int,
        help="KV tokens the step's attention reads, all requests together",
    )
    hints.add_argument(
        "--context",
        type=int,
        help="tokens of context per request (active tokens when "
        "--active-tokens is not given; also the floor's context)",
    )
    hints.add_argument(
        "--batch",
        type=int,
        default=1,
        help="requests per step (default 1): with --context, the step attends to "
        "context × batch tokens; also the floor's batch",
    )
    src = p.add_argument_group("source lines (via fp8mla scan)")
    src.add_argument("--source-root", metavar="DIR", help="source tree of the traced code")
    src.add_argument("--package", metavar="NAME", help="installed package of the traced code")
    floor = p.add_argument_group("floor estimate (via fp8mla gap)")
    floor.add_argument("--model", help="model preset or config.json: adds the step's floor")
    floor.add_argument("--gpu", help="GPU preset for the floor (e.g. h200)")
    floor.add_argument("--weights", choices=("bf16", "fp8", "nvfp4"), default="fp8")
    floor.add_argument("--kv-dtype", choices=("bf16", "fp8_e4m3", "fp8_e5m2"), default="fp8_e4m3")
    floor.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``fp8mla doctor``: 0 on success, 1 for ``--fail-on`` findings, 2 on bad input."""
    from fp8mla.doctor import TraceError, diagnose, format_text, render_html
    from fp8mla.doctor.floor import attach_floor

    if args.gpu and not args.model:
        _fail("--gpu needs --model")
    active_tokens = args.active_tokens
    if active_tokens is None and args.context and args.batch > 1:
        active_tokens = args.context * args.batch  # every request attends to its context
    try:
        report = diagnose(
            args.trace,
            layers=args.layers,
            active_tokens=active_tokens,
            context=args.context,
            source_root=args.source_root,
            package=args.package,
            progress=not args.no_progress,
        )
    except TraceError as exc:
        _fail(str(exc))
    except Exception as exc:  # a bug must not look like a crash on the user's file
        if os.environ.get("FP8MLA_DEBUG"):
            raise
        _fail(
            f"cannot analyse {args.trace}: {type(exc).__name__}: {exc} "
            f"(set FP8MLA_DEBUG=1 for the traceback)"
        )
    floor_text = None
    if args.model:
        floor_text = attach_floor(
            report,
            args.model,
            args.gpu,
            weights=args.weights,
            kv_dtype=args.kv_dtype,
            tp=args.tp,
            batch=args.batch,
            context=args.context or 4096,
        )
    if args.html:
        try:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(render_html(report, floor_text))
        except OSError as exc:
            _fail(f"cannot write {args.html}: {exc.strerror or exc}")
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_text(report, floor_text))
    if args.fail_on:
        order = ("high", "medium", "low")
        worst = order[: order.index(args.fail_on) + 1]
        reports = report.get("ranks", [report])
        if any(f["severity"] in worst for r in reports for f in r.get("findings", [])):
            return 1
    return 0
