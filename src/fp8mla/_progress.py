"""The one progress display of the command line: a dependency-free line on stderr.

``Progress`` counts work items (benchmark cases, scanned files) or bytes (a trace being read).
On a terminal it redraws one line in place; on a pipe it prints a line per update, or, with
``every``, only when another share of the work is done, so logs stay short.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

__all__ = ["LARGE_FILE_BYTES", "Progress", "file_progress"]

LARGE_FILE_BYTES = 32 << 20  # smaller files are read too fast for progress to help


class Progress:
    """``with Progress(total, "bench") as bar: ... bar.update(label)`` draws
    ``bench [######----] 12/30  B64_H16_L4096 (41 s)`` on a terminal; on a pipe it prints one
    line per update (or one per ``every`` share of the total), nothing with ``quiet``.

    ``unit="MB"`` with ``scale=1e6`` shows byte counts as ``120/290 MB``.
    """

    def __init__(
        self,
        total: int,
        title: str,
        *,
        quiet: bool = False,
        width: int = 24,
        stream: TextIO | None = None,
        unit: str = "",
        scale: float = 1.0,
        every: float = 0.0,
    ) -> None:
        self.total = max(total, 1)
        self.title = title
        self.quiet = quiet
        self.width = width
        self.stream = stream or sys.stderr
        self.unit = unit
        self.scale = scale
        self.every = every
        self.done = 0
        self.start = time.monotonic()
        self.tty = self.stream.isatty()
        self._shown = -1.0  # share of the total at the last line printed
        self._open = False  # a terminal line is drawn and not yet ended

    def update(self, label: str = "", step: int = 1) -> None:
        """Count ``step`` more items done and redraw."""
        self.set(self.done + step, label)

    def set(self, done: int, label: str = "") -> None:
        """Set the amount done (items or bytes) and redraw."""
        self.done = done
        if self.quiet:
            return
        share = min(done, self.total) / self.total
        if self.every and share < 1.0 and share - self._shown < self.every:
            return
        if share == self._shown and share >= 1.0:
            return
        self._shown = share
        filled = int(self.width * share)
        bar = "#" * filled + "-" * (self.width - filled)
        if self.unit:
            count = f"{done / self.scale:,.0f}/{self.total / self.scale:,.0f} {self.unit}"
        else:
            count = f"{done}/{self.total}"
        secs = time.monotonic() - self.start
        tail = f"  {label}" if label else ""
        line = f"{self.title} [{bar}] {count}{tail} ({secs:.0f} s)"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self._open = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End a line drawn in place on a terminal."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def file_progress(
    path: str, title: str, *, stream: TextIO | None = None, min_bytes: int | None = None
) -> Callable[[int, int], None] | None:
    """A ``(bytes_done, bytes_total)`` callback drawing ``title [###---] 120/290 MB  reading
    FILE (3 s)``, or None for a file under ``min_bytes`` (default :data:`LARGE_FILE_BYTES`).
    On a pipe it prints a line every 10%; the line ends when the whole file is read."""
    threshold = LARGE_FILE_BYTES if min_bytes is None else min_bytes
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    if size < threshold:
        return None
    bar = Progress(size, title, stream=stream, unit="MB", scale=1e6, every=0.1)
    label = f"reading {os.path.basename(path)}"

    def report(done: int, total: int) -> None:
        bar.total = max(total, 1)
        bar.set(done, label)
        if done >= total:
            bar.close()

    return report
