"""A dependency-free progress line on stderr for long-running commands."""

from __future__ import annotations

import sys
import time
from types import TracebackType


class Progress:
    """``with Progress(total, "bench") as bar: ... bar.update(label)`` draws
    ``bench [######----] 12/30  B64_H16_L4096 (41 s)`` on a terminal; on a pipe it prints one
    line per step (or nothing with ``quiet``)."""

    def __init__(self, total: int, title: str, *, quiet: bool = False, width: int = 24) -> None:
        self.total = max(total, 1)
        self.title = title
        self.quiet = quiet
        self.width = width
        self.done = 0
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()

    def update(self, label: str = "", step: int = 1) -> None:
        self.done += step
        if self.quiet:
            return
        filled = int(self.width * min(self.done, self.total) / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        secs = time.monotonic() - self.start
        line = f"{self.title} [{bar}] {self.done}/{self.total}  {label} ({secs:.0f} s)"
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.tty and not self.quiet:
            sys.stderr.write("\n")
            sys.stderr.flush()
