"""Read and parse one Python source file without importing or executing it.

A large file (over :data:`PART_CHARS` × 2 characters) is parsed in parts of about
:data:`PART_CHARS`, cut where a top-level ``def``/``class``/decorator starts, so memory stays
bounded (a syntax tree takes about 100 bytes per source character). A part that will not parse
alone grows to the next cut until it does, up to :data:`MAX_PART_CHARS`; what still does not
parse is left out, and the result says which lines.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field

from fp8mla._files import InputError, read_input

PART_CHARS = 1 << 20  # about 100 MB of syntax tree per part
MAX_PART_CHARS = 4 << 20  # one statement larger than this is not parsed
_TOP_LEVEL = re.compile(r"(?:async[ \t]+def|def|class)[ \t]|@")


class UnparsableSource(Exception):
    """A file that is not Python source this interpreter can parse; ``str()`` says why."""


@dataclass
class ParsedSource:
    """A parsed module and its decoded source lines.

    A large file is parsed in parts as :meth:`trees` is iterated (each part's tree can be
    dropped before the next is built); afterwards ``notes`` says how it was parsed, and
    ``partial`` whether some lines were left out.
    """

    tree: ast.Module | None
    lines: list[str]
    notes: list[str] = field(default_factory=list)
    partial: bool = False
    _text_lines: list[str] | None = field(default=None, repr=False)
    _filename: str = "<string>"

    def trees(self) -> Iterator[ast.Module]:
        """The module's trees in source order: one, or the parts of a large file.

        Raises :class:`UnparsableSource` when no part of a large file parses."""
        if self.tree is not None:
            yield self.tree
            return
        if self._text_lines is not None:
            yield from _parse_in_parts(self)


def _decode(source: bytes) -> str:
    if b"\0" in source:
        raise UnparsableSource("binary file (contains NUL bytes)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        text = source.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise UnparsableSource(f"cannot decode: {exc}") from None
    return text.removeprefix("\ufeff")


def _parse(text: str, filename: str) -> ast.Module:
    try:
        return ast.parse(text, filename=filename)
    except SyntaxError as exc:
        where = f"line {exc.lineno}: " if exc.lineno else ""
        raise UnparsableSource(f"syntax error, {where}{exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise UnparsableSource(f"cannot parse: {type(exc).__name__}: {exc}") from None


def parse_source(source: str | bytes, filename: str = "<string>") -> ParsedSource:
    """Parse ``source`` (text, or bytes decoded per PEP 263 / BOM) into a :class:`ParsedSource`.

    Raises :class:`UnparsableSource` for syntax errors, undecodable bytes and binary content.
    A large file is only split here; its parts are parsed by :meth:`ParsedSource.trees`.
    """
    text = _decode(source) if isinstance(source, bytes) else source
    if len(text) > 2 * PART_CHARS:
        lines = text.splitlines(keepends=True)
        return ParsedSource(
            None,
            [line.rstrip("\r\n") for line in lines],
            _text_lines=lines,
            _filename=filename,
        )
    return ParsedSource(_parse(text, filename), text.splitlines())


def _segments(lines: list[str]) -> list[tuple[int, int]]:
    """``(first, end)`` line ranges between the places a top-level ``def``/``class``/decorator
    starts a statement (not right after a decorator line)."""
    cuts = [0]
    previous = ""
    for i, line in enumerate(lines):
        if i and _TOP_LEVEL.match(line) and not previous.startswith("@"):
            cuts.append(i)
        if line.strip():
            previous = line
    cuts.append(len(lines))
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


# Syntax errors that a cut through an unfinished construct causes: grow the part instead.
_CUT_SHORT = ("unterminated", "was never closed", "unexpected EOF", "expected an indented block")


def _try_parse(
    lines: list[str], first: int, end: int, filename: str
) -> tuple[ast.Module | None, SyntaxError | None, str]:
    """Parse lines ``[first, end)``: (tree with absolute line numbers, None, "") or
    (None, the syntax error or None, why)."""
    try:
        tree = ast.parse("".join(lines[first:end]), filename=filename)
    except SyntaxError as exc:
        return None, exc, f"syntax error, line {(exc.lineno or 1) + first}: {exc.msg}"
    except (ValueError, RecursionError, MemoryError) as exc:
        return None, None, f"cannot parse: {type(exc).__name__}: {exc}"
    ast.increment_lineno(tree, first)
    return tree, None, ""


def _parse_in_parts(parsed: ParsedSource) -> Iterator[ast.Module]:
    """Trees of parts of about PART_CHARS characters, in order; a segment that does not parse
    (a real syntax error, or one statement over MAX_PART_CHARS) is left out with a note."""
    lines = parsed._text_lines or []
    segs = _segments(lines)
    chars = [sum(len(line) for line in lines[a:b]) for a, b in segs]
    filename = parsed._filename
    i = parts = 0
    while i < len(segs):
        j, size = i, 0
        while j < len(segs) and (j == i or size + chars[j] <= PART_CHARS):
            size += chars[j]
            j += 1
        tree, error, why = _try_parse(lines, segs[i][0], segs[j - 1][1], filename)
        # A cut through a string or bracket: grow segment by segment while that is the error.
        while tree is None and error is not None and error.msg.startswith(_CUT_SHORT):
            if j == len(segs) or size > MAX_PART_CHARS:
                break
            size += chars[j]
            j += 1
            tree, error, why = _try_parse(lines, segs[i][0], segs[j - 1][1], filename)
        if tree is not None:
            parts += 1
            yield tree
            del tree
            i = j
            continue
        bad = i  # the segment holding the error: the ones before it parse alone
        if error is not None and error.lineno is not None:
            line = segs[i][0] + error.lineno - 1
            bad = next((k for k in range(i, j) if segs[k][0] <= line < segs[k][1]), i)
        if bad > i:
            tree, _, _ = _try_parse(lines, segs[i][0], segs[bad][0], filename)
            if tree is not None:
                parts += 1
                yield tree
                del tree
                i = bad
                continue
        last = bad if error is not None and not error.msg.startswith(_CUT_SHORT) else j - 1
        first_line, end_line = segs[i][0] + 1, segs[last][1]
        parsed.notes.append(f"lines {first_line}–{end_line} not scanned ({why})")
        parsed.partial = True
        i = last + 1
    total = sum(chars)
    parsed.notes.insert(0, f"{total / 1e6:.1f} MB of source, parsed in {parts} parts")
    if not parts:
        raise UnparsableSource(f"no part parses: {parsed.notes[1]}")


def read_source(path: str | os.PathLike[str]) -> ParsedSource:
    """Read and parse the file at ``path``.

    Raises :class:`FileNotFoundError` (and other :class:`OSError`) when it cannot be read, and
    :class:`UnparsableSource` when it is not parsable Python or not a regular file (a FIFO,
    socket or device is never read: :func:`fp8mla._files.open_input`).
    """
    os.stat(path)  # a missing file is an OSError, as reading it would be
    try:
        data = read_input(path)
    except InputError as exc:
        raise UnparsableSource(str(exc)) from None
    return parse_source(data, os.fspath(path))
