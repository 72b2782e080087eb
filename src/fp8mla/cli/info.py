"""``fp8mla info``: versions, device, compute capability and Triton's mode."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "info",
        help="versions, device and whether Triton runs compiled",
        description="Print fp8mla's, torch's and triton's versions, the device "
        "and its compute capability, and whether Triton kernels run compiled "
        "or interpreted.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from fp8mla.info import collect

    info = collect()
    print(json.dumps(info.to_dict(), indent=2) if args.json else info.format_text())
    return 0
