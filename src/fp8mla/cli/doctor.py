"""``fp8mla doctor``: diagnose a torch.profiler trace of a decode loop. See ``docs/doctor.md``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from fp8mla.cli._common import (
    ACTIVE_TOKENS,
    BATCH,
    CONTEXT,
    LAYERS,
    TP,
    add_command,
    check_writable,
    fail,
    path_arg,
)

_EXAMPLE = """examples:
  fp8mla doctor trace.json.gz
  fp8mla doctor trace.json.gz --json > report.json
  fp8mla doctor traces/ --html report.html              # one report per rank + summary
  fp8mla doctor trace.json.gz --source-root ~/sglang/python
  fp8mla doctor trace.json.gz --model glm-5 --gpu h200 --tp 2 --context 3000
  zcat trace.json.gz | fp8mla doctor -                  # a pipe: '-' or <(zcat trace.json.gz)

exit status: 0 a report, 1 a --fail-on finding (or a partial report), 2 bad input or a
damaged trace (truncated, corrupt: one line on stderr says where; --allow-partial analyses
the events before the damage and marks every total partial)."""


def register(subparsers: Any) -> None:
    """Add the ``doctor`` parser to the ``fp8mla`` dispatcher."""
    p = add_command(
        subparsers,
        "doctor",
        help="find full-pool KV casts and other step costs in a torch.profiler trace",
        description=(
            "Read a torch.profiler Chrome trace (.json or .json.gz, a file or a pipe; a directory\n"
            "gives one report per rank and a summary), segment decode steps, and report what\n"
            "costs step time, most costly first, with the Python function that launched it and\n"
            "the fix."
        ),
        epilog=_EXAMPLE,
    )
    p.add_argument(
        "trace",
        metavar="TRACE",
        type=path_arg,
        help="trace file, directory of per-rank traces, or a pipe ('-' for stdin)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    out.add_argument(
        "--html", metavar="FILE", type=path_arg, help="also write a self-contained HTML report"
    )
    out.add_argument(
        "--no-progress", action="store_true", help="no progress lines on stderr for large traces"
    )
    out.add_argument(
        "--fail-on",
        choices=("high", "medium", "low"),
        help="exit with status 1 when a finding of this severity or worse exists, or when "
        "the report is partial (--allow-partial on a damaged trace)",
    )
    out.add_argument(
        "--allow-partial",
        action="store_true",
        help="analyse the complete events before the damage of a truncated or corrupt trace "
        "(default: exit 2); every total is marked partial",
    )
    hints = p.add_argument_group("analysis hints")
    hints.add_argument(
        "--layers", type=LAYERS, metavar="N", help=f"layer count ({LAYERS}; default: inferred)"
    )
    hints.add_argument(
        "--active-tokens",
        type=ACTIVE_TOKENS,
        metavar="N",
        help=f"KV tokens the step's attention reads, all requests together ({ACTIVE_TOKENS})",
    )
    hints.add_argument(
        "--context",
        type=CONTEXT,
        metavar="N",
        help=f"tokens of context per request ({CONTEXT}; active tokens when "
        "--active-tokens is not given; also the floor's context)",
    )
    hints.add_argument(
        "--batch",
        type=BATCH,
        metavar="N",
        default=1,
        help=f"requests per step ({BATCH}; default 1): with --context, the step attends to "
        "context × batch tokens; also the floor's batch",
    )
    src = p.add_argument_group("source lines (via fp8mla scan)")
    src.add_argument(
        "--source-root", metavar="DIR", type=path_arg, help="source tree of the traced code"
    )
    src.add_argument("--package", metavar="NAME", help="installed package of the traced code")
    floor = p.add_argument_group("floor estimate (via fp8mla gap)")
    floor.add_argument(
        "--model", type=path_arg, help="model preset or config.json: adds the step's floor"
    )
    floor.add_argument("--gpu", help="GPU preset for the floor (e.g. h200)")
    floor.add_argument(
        "--weights",
        choices=("bf16", "fp8", "nvfp4"),
        default="fp8",
        help="weight format for the floor (default fp8)",
    )
    floor.add_argument(
        "--kv-dtype",
        choices=("bf16", "fp8_e4m3", "fp8_e5m2"),
        default="fp8_e4m3",
        help="KV pool format for the floor (default fp8_e4m3)",
    )
    floor.add_argument(
        "--tp", type=TP, metavar="N", default=1, help=f"tensor-parallel size ({TP}; default 1)"
    )
    p.set_defaults(func=run)


def _floor_spec(args: argparse.Namespace) -> Any:
    """The floor request, checked before the trace is read (None without --model)."""
    from fp8mla.doctor import FloorSpec

    if args.gpu and not args.model:
        fail("doctor", "--gpu needs --model")
    if not args.model:
        return None
    if not args.gpu:
        from fp8mla.gap import GPUS

        fail("doctor", f"--model needs --gpu (presets: {', '.join(GPUS)})")
    spec = FloorSpec(
        model=args.model,
        gpu=args.gpu,
        weights=args.weights,
        kv_dtype=args.kv_dtype,
        tp=args.tp,
        batch=args.batch,
        context=args.context or 4096,
    )
    try:
        spec.check()
    except (ValueError, OSError) as exc:
        fail("doctor", f"floor estimate (--model, --gpu, --tp, ...): {exc}")
    return spec


def run(args: argparse.Namespace) -> int:
    """Run ``fp8mla doctor``: 0 on success, 1 for ``--fail-on`` findings (or a partial report),
    2 on bad input or a damaged trace."""
    from fp8mla._files import replace_atomically
    from fp8mla.doctor import TraceError, diagnose, format_text, render_html

    floor = _floor_spec(args)
    if args.source_root is not None and not os.path.isdir(args.source_root):
        fail("doctor", f"--source-root {args.source_root}: not a directory")
    if args.package is not None:
        from fp8mla.doctor.sources import package_root

        if package_root(args.package) is None:
            fail("doctor", f"--package {args.package}: not importable here")
    problem = check_writable(args.html) if args.html else None
    if problem:
        fail("doctor", f"--html {args.html}: {problem}")
    if args.trace != "-" and not os.path.lexists(args.trace):
        fail("doctor", f"{args.trace}: no such file or directory")
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
            floor=floor,
            progress=not args.no_progress,
            allow_partial=args.allow_partial,
        )
    except TraceError as exc:
        fail("doctor", str(exc))
    except Exception as exc:  # a bug must not look like a crash on the user's file
        if os.environ.get("FP8MLA_DEBUG"):
            raise
        fail(
            "doctor",
            f"cannot analyse {args.trace}: {type(exc).__name__}: {exc} "
            f"(set FP8MLA_DEBUG=1 for the traceback)",
        )
    if args.html:
        try:
            with replace_atomically(args.html) as tmp, open(tmp, "w", encoding="utf-8") as f:
                f.write(render_html(report))
        except OSError as exc:
            fail("doctor", f"--html {args.html}: cannot write: {exc.strerror or exc}")
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_text(report))
    if args.fail_on:
        sys.stdout.flush()
        reports = report.get("ranks", [report])
        if any(r.get("partial") for r in reports):
            print(
                "fp8mla doctor: --fail-on: the report is partial (a damaged trace): it cannot pass",
                file=sys.stderr,
            )
            return 1
        order = ("high", "medium", "low")
        worst = order[: order.index(args.fail_on) + 1]
        if any(f["severity"] in worst for r in reports for f in r.get("findings", [])):
            return 1
    return 0
