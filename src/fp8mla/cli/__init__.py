"""The ``fp8mla`` command line: thin subcommands over library functions.

Each subcommand lives in its own module with ``register(subparsers)`` (adds its parser through
:func:`fp8mla.cli._common.add_command` and sets ``func``) and ``run(args) -> int`` (the exit
status). Bad input anywhere prints one line on stderr and exits 2 (:func:`~fp8mla.cli._common.fail`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fp8mla.cli._common import fail

# Subcommand modules, in the order ``fp8mla --help`` lists them.
_SUBCOMMANDS = ("demo", "doctor", "scan", "bench", "gap", "info")


def build_parser() -> argparse.ArgumentParser:
    from fp8mla import __version__

    parser = argparse.ArgumentParser(
        prog="fp8mla",
        description="MLA attention over an FP8 KV cache, and tools that find full-pool KV casts.",
        epilog="exit status: 0 success, 1 a finding (doctor --fail-on, scan), 2 bad or damaged "
        "input. Inputs must be regular files; only fp8mla doctor also reads a pipe ('-', "
        "<(zcat t.gz)).",
    )
    parser.error = lambda message: fail(None, message)  # type: ignore[method-assign]
    parser.add_argument("--version", action="version", version=f"fp8mla {__version__}")
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
    """Run the command line; returns the exit status (0 ok, 1 a finding, 2 bad input)."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the subcommand that was given them
            fail(getattr(args, "command", None), f"unrecognized arguments: {' '.join(extra)}")
        if not getattr(args, "func", None):
            parser.print_usage(sys.stderr)
            fail(None, f"expected a COMMAND ({', '.join(_SUBCOMMANDS)}); fp8mla --help says more")
        return int(args.func(args) or 0)
    except SystemExit as exc:  # --help, argument errors and fail() end here
        return exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        print("fp8mla: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
