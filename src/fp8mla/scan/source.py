"""Read and parse one Python source file without importing or executing it."""

from __future__ import annotations

import ast
import io
import os
import tokenize
from dataclasses import dataclass


class UnparsableSource(Exception):
    """A file that is not Python source this interpreter can parse; ``str()`` says why."""


@dataclass(frozen=True)
class ParsedSource:
    """A parsed module and its decoded source lines."""

    tree: ast.Module
    lines: list[str]


def parse_source(source: str | bytes, filename: str = "<string>") -> ParsedSource:
    """Parse ``source`` (text, or bytes decoded per PEP 263 / BOM) into a :class:`ParsedSource`.

    Raises :class:`UnparsableSource` for syntax errors, undecodable bytes and binary content.
    """
    if isinstance(source, bytes):
        if b"\0" in source:
            raise UnparsableSource("binary file (contains NUL bytes)")
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
            text = source.decode(encoding)
        except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
            raise UnparsableSource(f"cannot decode: {exc}") from None
        text = text.removeprefix("\ufeff")
    else:
        text = source
    try:
        tree = ast.parse(text, filename=filename)
    except SyntaxError as exc:
        where = f"line {exc.lineno}: " if exc.lineno else ""
        raise UnparsableSource(f"syntax error, {where}{exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise UnparsableSource(f"cannot parse: {type(exc).__name__}: {exc}") from None
    return ParsedSource(tree, text.splitlines())


def read_source(path: str | os.PathLike[str]) -> ParsedSource:
    """Read and parse the file at ``path``.

    Raises :class:`FileNotFoundError` (and other :class:`OSError`) when it cannot be read, and
    :class:`UnparsableSource` when it is not parsable Python.
    """
    with open(path, "rb") as f:
        data = f.read()
    return parse_source(data, os.fspath(path))
