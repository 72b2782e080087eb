"""Scan entry points: one source string, one file, or many paths and an installed package."""

from __future__ import annotations

import os
from collections.abc import Sequence

from fp8mla.scan.findings import ScanFinding, ScanResult, SkippedFile
from fp8mla.scan.source import ParsedSource, UnparsableSource, parse_source, read_source
from fp8mla.scan.visitor import find_casts
from fp8mla.scan.walk import package_paths, source_files


def _find(parsed: ParsedSource, path: str) -> list[ScanFinding]:
    try:
        return find_casts(parsed.tree, path, parsed.lines)
    except RecursionError:
        raise UnparsableSource("expressions nested too deeply to walk") from None


def scan_source(source: str | bytes, path: str = "<string>") -> list[ScanFinding]:
    """Findings in Python ``source``, reported under ``path``.

    Raises :class:`~fp8mla.scan.source.UnparsableSource` when ``source`` does not parse.
    """
    return _find(parse_source(source, path), path)


def scan_file(path: str | os.PathLike[str]) -> list[ScanFinding]:
    """Findings in the Python file at ``path``, sorted by line.

    A file that does not parse (syntax error, bad encoding, binary) gives ``[]``; use
    :func:`scan_paths` to learn why. A missing or unreadable file raises :class:`OSError`.
    """
    try:
        return _find(read_source(path), os.fspath(path))
    except UnparsableSource:
        return []


def scan_paths(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], package: str | None = None
) -> ScanResult:
    """Scan files, directories (recursively, ``*.py``) and optionally an installed package.

    Files that do not parse or cannot be read are listed in ``ScanResult.skipped`` with the
    reason. Raises :class:`~fp8mla.scan.walk.ScanError` for a path that does not exist or a
    package that is not installed.
    """
    if isinstance(paths, str | os.PathLike):  # one path, not a sequence of characters
        paths = [paths]
    roots: list[str | os.PathLike[str]] = list(paths)
    if package is not None:
        roots.extend(package_paths(package))
    result = ScanResult()
    for file in source_files(roots):
        try:
            findings = _find(read_source(file), os.fspath(file))
        except (UnparsableSource, OSError) as exc:
            result.skipped.append(SkippedFile(os.fspath(file), str(exc) or type(exc).__name__))
            continue
        result.files_scanned += 1
        result.findings.extend(findings)
    return result
