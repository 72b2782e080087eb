"""What every subcommand shares: how it is added to the dispatcher, how it refuses input, and
the ranges its numeric options must fall in.

Each subcommand module has ``register(subparsers)``, which calls :func:`add_command`, and
``run(args) -> int``, which imports what it needs inside the function (so ``fp8mla --help``
imports neither torch nor triton) and calls :func:`fail` for bad input.

Every error reads ``fp8mla COMMAND: error: --flag: expected …, got …`` on one line of stderr
(exit status 2), whether argparse, a range check or the library found it.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Any, NoReturn

from fp8mla._files import check_output, printable

__all__ = [
    "ACTIVE_TOKENS",
    "BANDWIDTH_TBPS",
    "BATCH",
    "CONTEXT",
    "HEADS",
    "HIDDEN",
    "LAYERS",
    "POOL_SLOTS",
    "STEPS",
    "TP",
    "TPOT_MS",
    "Range",
    "add_command",
    "check_writable",
    "fail",
    "path_arg",
    "positive_int",
]

_ARGUMENT = re.compile(r"^argument ([^:]+): ")
_CHOICE = re.compile(r"invalid choice: (.+) \(choose from (.+)\)$")


def fail(command: str | None, message: str) -> NoReturn:
    """Bad input: ``fp8mla COMMAND: error: MESSAGE`` on one line of stderr, exit status 2.

    argparse's ``argument --flag: …`` becomes ``--flag: …``, like the commands' own checks;
    control characters (from a damaged file or a path) are escaped."""
    where = f"fp8mla {command}" if command else "fp8mla"
    message = _ARGUMENT.sub(r"\1: ", printable(message))
    message = _CHOICE.sub(r"expected one of \2, got \1", message)
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


class Range:
    """An ``argparse`` type: a number in ``[low, high]`` (``(low, high]`` with ``open_low``).

    ``str(range)`` is the range as the help shows it (``1–128``); a value outside it, or not a
    number, is refused as ``expected an integer in 1–128, got 1000``."""

    def __init__(
        self, low: float, high: float, *, integer: bool = True, open_low: bool = False
    ) -> None:
        self.low, self.high, self.integer, self.open_low = low, high, integer, open_low
        self.__name__ = "integer" if integer else "number"  # argparse names the type so

    def __str__(self) -> str:
        low = f"{self.low:,}" if self.integer else f"{self.low:g}"
        high = f"{self.high:,}" if self.integer else f"{self.high:g}"
        return f"above {low} to {high}" if self.open_low else f"{low}–{high}"

    def __call__(self, text: str) -> int | float:
        what = "an integer" if self.integer else "a number"
        try:
            value: int | float = int(text) if self.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} in {self}, got {text!r}") from None
        low_ok = value > self.low if self.open_low else value >= self.low
        if not (math.isfinite(value) and low_ok and value <= self.high):
            raise argparse.ArgumentTypeError(f"expected {what} in {self}, got {text}")
        return value

    def check(self, flag: str, value: float) -> str | None:
        """Why ``value`` (given to ``flag``) is out of range, or None."""
        try:
            self(str(value))
        except argparse.ArgumentTypeError as exc:
            return f"{flag}: {exc}"
        return None


# The ranges that make physical sense; the help of every option shows its own.
LAYERS = Range(1, 1024)  # decoder layers of a model
HEADS = Range(1, 128)  # query heads per GPU: the attention kernel's limit
HIDDEN = Range(1, 65_536)  # hidden size
POOL_SLOTS = Range(1, 2**31 - 1)  # slots of one layer's pool: int32 slot indices
CONTEXT = Range(1, 1 << 22)  # tokens of context per request (4,194,304)
BATCH = Range(1, 65_536)  # requests per decode step
ACTIVE_TOKENS = Range(1, (1 << 22) * 65_536)  # KV tokens a step reads: batch × context
STEPS = Range(1, 100_000)  # timed steps
TP = Range(1, 128)  # tensor-parallel size: at most one query head per GPU
TPOT_MS = Range(0, 100_000, integer=False, open_low=True)  # ms per output token
BANDWIDTH_TBPS = Range(0, 100, integer=False, open_low=True)  # memory bandwidth, TB/s


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def path_arg(text: str) -> str:
    """An ``argparse`` type: a path, never the empty string (which names no file)."""
    if text == "":
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def check_writable(path: str) -> str | None:
    """Why an output file cannot be written at ``path`` (an empty path, a directory, a FIFO or
    device, a missing folder, no permission), or None when it can. Nothing is created."""
    return check_output(path)
