"""Streaming reader for Chrome-trace JSON, plain or gzipped.

The file is never parsed as one document: a sliding text window moves over the (decompressed)
bytes and each element of the ``traceEvents`` array is decoded on its own with the C JSON scanner,
so memory stays proportional to the events the caller keeps, not to the file. The top-level
object's other members (``deviceProperties``, ``displayTimeUnit``, ...) are collected into
:attr:`TraceReader.metadata`; a bare JSON array of events is accepted too.

A file that ends early or is damaged (a truncated gzip stream, an interrupted write, flipped
bytes) yields every complete event before the damage and sets :attr:`TraceReader.truncated`;
:attr:`TraceReader.damage` says what is damaged and at which byte. Whether that is an error is
the caller's choice (:func:`fp8mla.doctor.collect.collect`). A pipe (``-``, ``<(zcat t.gz)``)
is read as a stream. Nothing read from the file is ever evaluated: JSON values only.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from fp8mla._files import InputError, InputFile, open_input
from fp8mla.doctor.errors import TraceError

__all__ = ["ProgressFn", "TraceReader"]

ProgressFn = Callable[[int, int], None]
"""Called as ``progress(bytes_done, bytes_total)`` (bytes of the file on disk)."""

_READ_BYTES = 1 << 22  # 4 MiB of file per read
_INFLATE_BYTES = 1 << 16  # gzip damage is located to within this many bytes of the file
_MAX_VALUE_CHARS = 64 << 20  # one event (or metadata value) larger than this is not a trace
_GZIP_MAGIC = b"\x1f\x8b"
_WS = re.compile(r"[ \t\n\r]*")
_WS_COMMA = re.compile(r"[ \t\n\r,]*")
_NUMBER_TAIL = re.compile(r"[0-9.eE+-]*\Z")
# Text at the end of a file that is a JSON token cut short (or nothing): the file was truncated.
_CUT_SHORT = re.compile(
    r"[ \t\n\r]*(?:t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?|n(?:u(?:ll?)?)?|N(?:aN?)?"
    r"|-?(?:I(?:n(?:f(?:i(?:n(?:i(?:ty?)?)?)?)?)?)?)?|-?[0-9.eE+-]*)[ \t\n\r]*"
)


class _Truncated(Exception):
    """The text ends inside a value."""


class _Invalid(Exception):
    """The text is not JSON at this position."""


class TraceReader:
    """Iterate over the event objects of one trace file.

    >>> reader = TraceReader("trace.json.gz")
    >>> for event in reader: ...
    >>> reader.metadata["deviceProperties"], reader.truncated, reader.warnings

    Raises :class:`~fp8mla.doctor.errors.TraceError` (on construction or while iterating) for a
    missing, unreadable, empty or non-trace file, a device, or a FIFO without a writer. Damage
    after at least one complete event is not raised here: iteration stops there and
    :attr:`truncated`, :attr:`damage` and :attr:`warnings` say so.
    """

    def __init__(self, path: str | os.PathLike[str], progress: ProgressFn | None = None) -> None:
        self.path = os.fspath(path)
        try:
            self._file: InputFile | None = open_input(self.path, streams=True)
        except InputError as exc:
            raise TraceError(f"{self.path}: {exc}") from None
        self.stream = self._file.stream
        self.size = self._file.size  # None for a pipe
        try:
            self._head = self._file.read(_READ_BYTES)
            while 0 < len(self._head) < 2:  # enough to see the gzip magic
                more = self._file.read(_READ_BYTES)
                if not more:
                    break
                self._head += more
        except OSError as exc:
            self.close()
            raise TraceError(f"{self.path}: cannot read ({exc.strerror or exc})") from None
        if not self._head:
            self.close()
            raise TraceError(f"{self.path}: empty file")
        self.gzipped = self._head[:2] == _GZIP_MAGIC
        self.progress = progress if self.size else None
        self.metadata: dict[str, Any] = {}
        self.truncated = False
        self.warnings: list[str] = []
        self.damage: str | None = None  # what is damaged and where, for the first damage
        self.events = 0
        self.found_events_array = False
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._chunks: Iterator[str] = iter(())
        self._text_bytes = 0  # bytes of (decompressed) text before the window

    def close(self) -> None:
        """Close the file (iteration closes it at its end)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- raw text -------------------------------------------------------------------------

    def _text_chunks(self) -> Iterator[str]:
        """Decoded text of the file, chunk by chunk; a damaged gzip stream ends it early."""
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        inflater = zlib.decompressobj(wbits=31) if self.gzipped else None
        f = self._file
        if f is None:
            raise TraceError(f"{self.path}: the file was closed before it was read")
        raw, self._head = self._head, b""
        done = 0
        try:
            while True:
                if not raw:
                    try:
                        raw = f.read(_READ_BYTES)
                    except OSError as exc:
                        self._damaged(f"read error at byte {done:,} of the file ({exc})")
                        break
                done += len(raw)
                if self.progress is not None:
                    self.progress(done, self.size or done)
                if inflater is None:
                    if not raw:
                        break
                    yield decode(raw)
                    raw = b""
                    continue
                if not raw:
                    if not inflater.eof:
                        self._damaged(
                            f"the gzip stream ends early at byte {done:,}, the file's end "
                            f"(truncated file)"
                        )
                    break
                start = done - len(raw)
                data = []
                try:
                    for i in range(0, len(raw), _INFLATE_BYTES):  # locate damage to a slice
                        piece = raw[i : i + _INFLATE_BYTES]
                        data.append(inflater.decompress(piece))
                        while inflater.eof and inflater.unused_data:  # concatenated members
                            rest = inflater.unused_data
                            inflater = zlib.decompressobj(wbits=31)
                            data.append(inflater.decompress(rest))
                except zlib.error as exc:
                    a, b = start + i, start + i + len(piece)
                    self._damaged(f"corrupt gzip data in bytes {a:,}–{b:,} of the file ({exc})")
                    if data:
                        yield decode(b"".join(data))
                    break
                raw = b""
                if data:
                    yield decode(b"".join(data))
            tail = decode(b"", final=True)
            if tail:
                yield tail
        finally:
            self.close()

    def _damaged(self, why: str) -> None:
        self.truncated = True
        self.warnings.append(why)
        if self.damage is None:
            self.damage = why

    def _offset(self) -> int:
        """Byte offset of the window position in the (decompressed) text."""
        return self._text_bytes + len(self._buf[: self._pos].encode("utf-8", "surrogatepass"))

    def _where(self) -> str:
        what = "decompressed JSON" if self.gzipped else "file"
        return f"at byte {self._offset():,} of the {what}"

    def _fill(self) -> bool:
        """Append the next chunk to the window; False at the end of the file."""
        for chunk in self._chunks:
            self._text_bytes += len(self._buf[: self._pos].encode("utf-8", "surrogatepass"))
            self._buf = self._buf[self._pos :] + chunk
            self._pos = 0
            return True
        self._eof = True
        return False

    def _peek(self, ws: re.Pattern[str]) -> str | None:
        """Skip ``ws`` and return the next character, or None at the end of the file."""
        while True:
            self._pos = ws.match(self._buf, self._pos).end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return None

    def _value(self, scan: Callable[[str, int], tuple[Any, int]]) -> Any:
        """Decode the JSON value at the window position, reading more text as needed."""
        while True:
            try:
                value, end = scan(self._buf, self._pos)
            except StopIteration as exc:  # .value: where a (possibly nested) value was due
                err_pos = exc.value if isinstance(exc.value, int) else self._pos
                error, open_string = "expected a JSON value", False
            except json.JSONDecodeError as exc:
                err_pos, error = exc.pos, exc.msg
                open_string = exc.msg.startswith("Unterminated string")
            else:
                # A number running into the window's end ("1.", "2e") may continue after it.
                if self._eof or not _NUMBER_TAIL.match(self._buf, end) or not self._fill():
                    self._pos = end
                    return value
                continue
            # An error well before the window's end is bad JSON, not a value cut by the window
            # (a literal or number cut short fails within a few characters of the end).
            if not open_string and err_pos < len(self._buf) - 16:
                raise _Invalid(error)
            if len(self._buf) - self._pos > _MAX_VALUE_CHARS:
                raise _Invalid(f"{error} (no complete value in {_MAX_VALUE_CHARS:,} characters)")
            if self._fill():
                continue
            # The whole file is in the window: what follows the error decides.
            if open_string or _CUT_SHORT.fullmatch(self._buf, err_pos):
                raise _Truncated
            raise _Invalid(error)

    # -- structure ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._chunks = self._text_chunks()
        scan = json.JSONDecoder().scan_once
        first = self._peek(_WS)
        if first == "\ufeff":  # byte-order mark
            self._pos += 1
            first = self._peek(_WS)
        if first is None:
            why = self.warnings[-1] if self.warnings else "empty file (no JSON)"
            raise TraceError(f"{self.path}: {why}")
        if first == "[":
            self._pos += 1
            self.found_events_array = True
            yield from self._events(scan)
        elif first == "{":
            self._pos += 1
            yield from self._object(scan)
        else:
            shown = ascii(self._buf[self._pos : self._pos + 16])  # control bytes escaped
            raise TraceError(
                f"{self.path}: not a Chrome trace (expected JSON starting with '{{' or '[', "
                f"found {shown})"
            )
        if not self.truncated:  # the rest of the file: white space, and a gzip stream's end
            if self._peek(_WS) is not None:
                self._damaged(f"unexpected text after the end of the JSON {self._where()}")
            self.close()
        if not self.found_events_array:
            if self.truncated:
                raise TraceError(
                    f"{self.path}: damaged trace: {self.damage}; no events before the damage"
                )
            raise TraceError(f"{self.path}: not a Chrome trace (no 'traceEvents' array)")

    def _object(self, scan: Callable[[str, int], tuple[Any, int]]) -> Iterator[dict[str, Any]]:
        """Members of the top-level object; the ``traceEvents`` array is streamed."""
        while True:
            c = self._peek(_WS_COMMA)
            if c is None:
                self._end_early("the top-level object is not closed")
                return
            if c == "}":
                self._pos += 1
                return
            try:
                key = self._value(scan) if c == '"' else None
                if not isinstance(key, str) or self._peek(_WS) != ":":
                    raise _Invalid("expected a member name")
                self._pos += 1
                c = self._peek(_WS)
                if key == "traceEvents" and c == "[":
                    self._pos += 1
                    self.found_events_array = True
                    yield from self._events(scan)
                    if self.truncated:
                        return
                    continue
                if c is None:
                    raise _Truncated
                self.metadata[key] = self._value(scan)
            except _Truncated:
                self._end_early("the file ends inside the top-level object")
                return
            except _Invalid as exc:
                if not self.found_events_array:
                    raise TraceError(f"{self.path}: not valid JSON ({exc})") from None
                self._damaged(f"invalid JSON after the events {self._where()} ({exc})")
                return

    def _events(self, scan: Callable[[str, int], tuple[Any, int]]) -> Iterator[dict[str, Any]]:
        """Elements of the events array; non-object elements are skipped."""
        skip = _WS_COMMA.match
        while True:
            # Fast path: decode whole events inside the window without leaving this loop.
            buf, pos = self._buf, self._pos
            limit = len(buf)
            while True:
                pos = skip(buf, pos).end()
                if pos >= limit or buf[pos] != "{":
                    break
                try:
                    event, end = scan(buf, pos)
                except (StopIteration, json.JSONDecodeError):
                    break
                if end >= limit:
                    break
                pos = end
                self.events += 1
                yield event
            self._pos = pos
            # Slow path: the window's end, the array's end, or something unusual.
            c = self._peek(_WS_COMMA)
            if c is None:
                self._end_early("the events array is not closed")
                return
            if c == "]":
                self._pos += 1
                return
            try:
                event = self._value(scan)
            except _Truncated:
                self._end_early("the file ends inside an event")
                return
            except _Invalid as exc:
                if self.events == 0:
                    raise TraceError(f"{self.path}: not valid JSON ({exc})") from None
                self._damaged(f"invalid JSON {self._where()} ({exc})")
                return
            if isinstance(event, dict):
                self.events += 1
                yield event

    def _end_early(self, why: str) -> None:
        if not self.truncated:  # a damaged gzip stream already said why
            self._damaged(f"{why}: the text ends {self._where()} (truncated file)")
