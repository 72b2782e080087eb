"""The ``fp8mla`` command line: thin subcommands over library functions.

Each subcommand lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``func`` (called with the parsed namespace, returning the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Subcommand modules, in the order ``fp8mla --help`` lists them.
_SUBCOMMANDS = ("demo", "doctor", "scan", "bench", "gap", "info")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fp8mla",
        description="MLA attention over an FP8 KV cache, and tools that find full-pool KV casts.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(f"fp8mla.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"fp8mla.cli.{name}":
                continue  # subcommand not part of this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("fp8mla: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
