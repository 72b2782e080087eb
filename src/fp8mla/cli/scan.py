"""``fp8mla scan``: find dtype casts of whole KV cache pools in Python source."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fp8mla._files import printable
from fp8mla.cli._common import add_command, fail, path_arg

_DESCRIPTION = """\
Statically find dtype casts applied to whole KV pool buffers (the per-step full-pool
copy), gather-then-cast sites, and attention wrappers planned with the query dtype as
the KV dtype. See docs/scan.md for the rules."""
_EPILOG = """\
exit status: 0 when no whole-pool cast is found, 1 when one is, 2 on usage errors or when
nothing could be scanned. Source is parsed, never imported or executed; files that do not
parse, and FIFOs, devices and sockets (never opened), are skipped with a note on stderr."""


def register(subparsers: Any) -> None:
    """Add the ``scan`` parser to the ``fp8mla`` dispatcher."""
    parser = add_command(
        subparsers,
        "scan",
        help="find casts of whole KV cache pools in Python source",
        description=_DESCRIPTION,
        epilog=_EPILOG,
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        type=path_arg,
        help="Python files or directories (regular files: pipes are not read)",
    )
    parser.add_argument(
        "--package", metavar="NAME", help="also scan an installed package, e.g. sglang"
    )
    parser.add_argument("--json", action="store_true", help="print findings as JSON")
    parser.add_argument(
        "--min-severity",
        choices=("high", "medium", "low"),
        default="low",
        help="show only findings of this severity or worse (default: low, all); the exit "
        "status still counts every whole-pool cast",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress line on stderr for large trees"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Scan ``args.paths`` and ``args.package``; print the report; return the exit status."""
    from fp8mla.scan import ScanError, scan_paths
    from fp8mla.scan.report import format_json, format_text

    if not args.paths and args.package is None:
        fail("scan", "give at least one PATH or --package NAME")
    try:
        result = scan_paths(args.paths, package=args.package, progress=not args.no_progress)
    except ScanError as exc:
        fail("scan", str(exc))
    for skipped in result.skipped:
        print(f"fp8mla scan: skipped {printable(skipped.path)}: {printable(skipped.reason)}",
              file=sys.stderr)  # fmt: skip
    if not result.files_scanned:
        if result.skipped:
            n = len(result.skipped)
            fail("scan", f"nothing could be scanned: {n} file{'s' if n > 1 else ''} skipped")
        fail("scan", f"no Python files (*.py) under {', '.join(_roots(args))}")
    result = result.at_least(args.min_severity)
    print(format_json(result) if args.json else format_text(result))
    return 1 if result.has_whole_pool_cast else 0


def _roots(args: argparse.Namespace) -> list[str]:
    return [*args.paths, *([f"package {args.package}"] if args.package else [])]
