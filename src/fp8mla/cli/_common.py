"""What every subcommand shares: how it is added to the dispatcher and how it refuses input.

Each subcommand module has ``register(subparsers)``, which calls :func:`add_command`, and
``run(args) -> int``, which imports what it needs inside the function (so ``fp8mla --help``
imports neither torch nor triton) and calls :func:`fail` for bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

__all__ = ["add_command", "check_writable", "fail", "positive_int"]


def fail(command: str | None, message: str) -> NoReturn:
    """Bad input: ``fp8mla COMMAND: error: MESSAGE`` on one line of stderr, exit status 2."""
    where = f"fp8mla {command}" if command else "fp8mla"
    message = " ".join(str(message).split())  # one line, whatever the message held
    print(f"{where}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def add_command(
    subparsers: Any,
    name: str,
    *,
    help: str,
    description: str,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """Add subcommand ``name``; its argument errors go through :func:`fail` (one line, exit 2)."""
    parser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.error = lambda message: fail(name, message)  # type: ignore[method-assign]
    return parser


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def check_writable(path: str) -> str | None:
    """Why a file cannot be written at ``path`` (a missing folder, a directory, no permission),
    or None when it can. Nothing is created or changed."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "is a directory"
    if not os.path.isdir(folder):
        return f"no such directory {folder}"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else "not writable (permission denied)"
    return None if os.access(folder, os.W_OK | os.X_OK) else f"cannot create files in {folder}"
