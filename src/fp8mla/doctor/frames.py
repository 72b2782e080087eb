"""Python frames as the profiler names them (``file.py(line): function``): which are the code
that launched work, and which belong to torch, triton or the standard library.

The line number is the function's first line (the code object's ``co_firstlineno``).
"""

from __future__ import annotations

import re

__all__ = ["is_framework", "parse_frame", "stack_frame"]

# Frames of these packages are never "the code that launched it": the search goes past them.
_FRAMEWORK = re.compile(
    r"^(?:<|torch/|torchgen/|functorch/|triton/|numpy/|_pytest/|pluggy/|typing_extensions)"
    r"|/(?:torch|triton|numpy)/"
)
_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
_STDLIB = frozenset(
    {
        "contextlib",
        "functools",
        "typing",
        "threading",
        "enum",
        "abc",
        "runpy",
        "asyncio",
        "concurrent",
        "selectors",
        "weakref",
        "copy",
        "inspect",
        "dataclasses",
        "collections",
        "queue",
        "multiprocessing",
        "os",
    }
)


def parse_frame(name: str) -> tuple[str, int, str] | None:
    """``"a/b.py(12): f"`` → ``("a/b.py", 12, "f")``; None for built-ins and other names."""
    m = _FRAME.match(name)
    return (m.group("file"), int(m.group("line")), m.group("func")) if m else None


def is_framework(name: str) -> bool:
    """True for built-ins (``<built-in ...>``), torch/triton/numpy and standard-library frames."""
    m = _FRAME.match(name)
    if not m:
        return True
    file = m.group("file")
    if _FRAMEWORK.search(file):
        return True
    if "/" not in file:  # the profiler prints the standard library as bare file names
        return file.rsplit(".", 1)[0] in _STDLIB
    return file.split("/", 1)[0] in _STDLIB


def stack_frame(stack: str) -> str | None:
    """The first (innermost) non-framework frame of a torch 1.x ``Call stack`` argument."""
    for part in re.split(r"[;\n]", stack):
        part = part.strip()
        if part and not is_framework(part):
            return part
    return None
