"""Progress lines on stderr while a large trace is read."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from fp8mla.doctor.load import ProgressFn

LARGE_BYTES = 32 << 20  # smaller files are read too fast for progress to help


def stderr_progress(path: str, stream: TextIO | None = None) -> ProgressFn | None:
    """A progress callback printing ``reading FILE: 42% (120/290 MB, 3 s)``, or None for small
    files. On a terminal the line updates in place; otherwise a line every 10%."""
    try:
        if os.path.getsize(path) < LARGE_BYTES:
            return None
    except OSError:
        return None
    out = stream or sys.stderr
    tty = out.isatty()
    started = time.monotonic()
    state = {"last": -1}
    name = os.path.basename(path)

    def report(done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        step = 1 if tty else 10
        if pct // step == state["last"] // step and pct < 100:
            return
        if pct == state["last"]:
            return
        state["last"] = pct
        line = (
            f"fp8mla doctor: reading {name}: {pct}% "
            f"({done / 1e6:,.0f}/{total / 1e6:,.0f} MB, {time.monotonic() - started:.0f} s)"
        )
        if tty:
            out.write("\r" + line + ("\n" if pct >= 100 else ""))
        else:
            out.write(line + "\n")
        out.flush()

    return report
