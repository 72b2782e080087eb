"""``fp8mla info``: versions, device, compute capability and Triton's mode."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fp8mla.cli._common import add_command


def register(subparsers: Any) -> None:
    """Add the ``info`` parser to the ``fp8mla`` dispatcher."""
    p = add_command(
        subparsers,
        "info",
        help="versions, device and whether Triton runs compiled",
        description="Print fp8mla's, torch's and triton's versions, the device and its compute\n"
        "capability, and whether Triton kernels run compiled or interpreted.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``fp8mla info``: always 0."""
    from fp8mla.info import collect

    info = collect()
    print(json.dumps(info.to_dict(), indent=2) if args.json else info.format_text())
    return 0
