"""How every command opens its inputs and writes its outputs: one place for both.

Inputs (:func:`open_input`): regular files only, unless the caller reads a stream; then a pipe
(``-`` for stdin, a process substitution ``<(zcat t.gz)``, a FIFO with a writer) is read too. A
FIFO without a writer, a device or a socket is refused with :class:`InputError` and never
blocks: the file is opened non-blocking and its type is checked on the open descriptor.

Outputs (:func:`check_output`, :func:`replace_atomically`): written to a temporary file beside
the target and renamed over it when complete, so an interrupted write leaves the old file, and
never over something that is not a regular file (a FIFO, ``/dev/full``, a directory).

Pure standard library (the doctor and the scanner import it without torch).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

__all__ = [
    "InputError",
    "InputFile",
    "check_output",
    "escape_controls",
    "file_kind",
    "open_input",
    "printable",
    "read_input",
    "replace_atomically",
]

STREAM_COMMANDS = ("doctor",)
"""The commands that read a trace or source from a pipe (``-``, ``<(...)``, a FIFO)."""


class InputError(ValueError):
    """An input that cannot be read: missing, a directory, a device, a FIFO without a writer.

    The message is one line, without the path (the caller names it).
    """


def printable(text: object) -> str:
    """``text`` on one line with control and other unprintable characters escaped (``\\x1b``),
    so that bytes from a damaged file never reach the terminal as they are."""
    return escape_controls(" ".join(str(text).split()))


def escape_controls(text: str) -> str:
    """``text`` with unprintable characters escaped (``\\x1b``), newlines and tabs kept: for
    reports that quote a file's content (kernel names, source lines)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def file_kind(mode: int) -> str:
    """``"a regular file"``, ``"a directory"``, ``"a FIFO (named pipe)"``, ... for ``st_mode``."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class InputFile:
    """A binary input opened by :func:`open_input`: ``read(n)``, ``close()``, ``size`` (bytes of
    a regular file, None for a stream) and ``stream`` (True for a pipe)."""

    def __init__(self, f, size: int | None, stream: bool, head: bytes = b"", own: bool = True):
        self._f = f
        self._head = head
        self._own = own
        self.size = size
        self.stream = stream

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left for ``n < 0``); ``b""`` at the end."""
        if self._head:
            if n < 0:
                head, self._head = self._head, b""
                return head + self._f.read()
            head, self._head = self._head[:n], self._head[n:]
            return head
        return self._f.read(n)

    def close(self) -> None:
        if self._own:
            self._f.close()

    def __enter__(self) -> InputFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "no such file"
    return f"cannot read ({exc.strerror or exc})"


def open_input(path: str | os.PathLike[str], *, streams: bool = False) -> InputFile:
    """Open ``path`` for reading in binary.

    ``streams``: also read a pipe: ``-`` (stdin), a process substitution (``/dev/fd/N``) or a
    FIFO that has a writer. Otherwise, and always for a FIFO without a writer, a device or a
    socket, raises :class:`InputError` without blocking. Also raises it for an empty path, a
    missing file, a directory and a file that cannot be read.
    """
    name = os.fspath(path)
    if name == "":
        raise InputError("expected a file path, got an empty string")
    if name == "-":
        if not streams:
            raise InputError("expected a file, got '-' (this command does not read stdin)")
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("expected a pipe on stdin for '-', got a terminal")
        return InputFile(sys.stdin.buffer, None, True, own=False)
    try:
        mode = os.stat(name).st_mode
    except OSError as exc:
        raise InputError(_os_reason(exc)) from None
    if not stat.S_ISREG(mode) and not (streams and stat.S_ISFIFO(mode)):
        if stat.S_ISDIR(mode):
            raise InputError("is a directory, expected a file")
        readers = ", ".join(f"fp8mla {c}" for c in STREAM_COMMANDS)
        hint = "" if streams or not stat.S_ISFIFO(mode) else f"; pipes are read by {readers}"
        raise InputError(f"not a regular file: {file_kind(mode)}, not read{hint}")
    try:
        # Non-blocking: opening a FIFO without a writer returns at once (a blocking open waits).
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise InputError(_os_reason(exc)) from None
    try:
        st = os.fstat(fd)  # the file opened, whatever the path pointed at when it was checked
        head = b""
        if stat.S_ISFIFO(st.st_mode) and streams:
            try:
                head = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer is there, its data is not (yet)
                head = None
            if head == b"":  # end of file at once: no writer, or one that wrote nothing
                raise InputError("a pipe with no writer and no data: nothing to read")
            head = head or b""
        elif not stat.S_ISREG(st.st_mode):
            raise InputError(f"not a regular file: {file_kind(st.st_mode)}, not read")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    if stat.S_ISFIFO(st.st_mode):
        return InputFile(f, None, True, head)
    return InputFile(f, st.st_size, False)


def read_input(path: str | os.PathLike[str], *, streams: bool = False) -> bytes:
    """The whole content of :func:`open_input`'s file."""
    with open_input(path, streams=streams) as f:
        try:
            return f.read()
        except OSError as exc:
            raise InputError(_os_reason(exc)) from None


def check_output(path: str | os.PathLike[str]) -> str | None:
    """Why an output cannot be written at ``path`` (an empty path, a directory, a FIFO or
    device, a missing folder, no permission), or None when it can. Nothing is created."""
    name = os.fspath(path)
    if name == "":
        return "expected a file path, got an empty string"
    target = os.path.realpath(name)  # a symbolic link: its target is replaced
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        return f"cannot check ({exc.strerror or exc})"
    if mode is not None and stat.S_ISDIR(mode):
        return "is a directory"
    if mode is not None and not stat.S_ISREG(mode):
        return f"is {file_kind(mode)}, not a regular file: not replaced"
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        return f"no such directory {os.path.dirname(os.path.abspath(name))}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot create files in {folder} (permission denied)"
    return None


@contextmanager
def replace_atomically(path: str | os.PathLike[str]) -> Iterator[str]:
    """``with replace_atomically("r.html") as tmp: write(tmp)``: the content is written to a
    temporary file beside ``path`` (same suffix, so ``.gz`` still means gzip) and renamed over
    ``path`` when the block ends without an exception; otherwise it is removed. Raises
    :class:`OSError` when ``path`` is not something a regular file may replace."""
    problem = check_output(path)
    if problem:
        raise OSError(errno.EINVAL, problem)
    target = os.path.realpath(os.fspath(path))
    folder, base = os.path.split(target)
    suffix = ".json.gz" if base.endswith(".json.gz") else os.path.splitext(base)[1]
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=f".tmp{suffix}", dir=folder)
    os.close(fd)
    try:
        yield tmp
        problem = check_output(target)  # still a regular file (or nothing) to replace?
        if problem:
            raise OSError(errno.EINVAL, problem)
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
