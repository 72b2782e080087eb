"""Scan entry points: one source string, one file, or many paths and an installed package."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from fp8mla.scan.findings import FileNote, ScanFinding, ScanResult, SkippedFile
from fp8mla.scan.source import ParsedSource, UnparsableSource, parse_source, read_source
from fp8mla.scan.visitor import find_casts
from fp8mla.scan.walk import package_paths, source_files


def _find(parsed: ParsedSource, path: str) -> list[ScanFinding]:
    try:
        return find_casts(parsed.trees(), path, parsed.lines)
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
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    package: str | None = None,
    *,
    progress: bool | Callable[[int, int, str], None] = False,
) -> ScanResult:
    """Scan files, directories (recursively, ``*.py``) and optionally an installed package.

    Files that do not parse, cannot be read or are not regular files (FIFOs, sockets, devices)
    are listed in ``ScanResult.skipped`` with the reason; a large file parsed in parts, or only
    partly, gets an entry in ``ScanResult.notes``. ``progress``: True for a progress line on
    stderr when there are more than :data:`PROGRESS_FILES` files, or a callback ``(files_done,
    files_total, path)``. Raises :class:`~fp8mla.scan.walk.ScanError` for a path that does not
    exist or a package that is not installed.
    """
    if isinstance(paths, str | os.PathLike):  # one path, not a sequence of characters
        paths = [paths]
    roots: list[str | os.PathLike[str]] = list(paths)
    if package is not None:
        roots.extend(package_paths(package))
    files = source_files(roots)
    result = ScanResult()
    with _progress(progress, len(files)) as report:
        for done, file in enumerate(files, start=1):
            name = os.fspath(file)
            try:
                parsed = read_source(file)
                findings = _find(parsed, name)
            except (UnparsableSource, OSError) as exc:
                result.skipped.append(SkippedFile(name, _reason(exc)))
            else:
                result.files_scanned += 1
                result.findings.extend(findings)
                result.notes.extend(FileNote(name, note) for note in parsed.notes)
            report(done, len(files), name)
    return result


PROGRESS_FILES = 500  # fewer files are scanned too fast for progress to help


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot read: {exc.strerror}"
    return str(exc) or type(exc).__name__


@contextmanager
def _progress(
    progress: bool | Callable[[int, int, str], None], total: int
) -> Iterator[Callable[[int, int, str], None]]:
    if callable(progress):
        yield progress
        return
    if not progress or total < PROGRESS_FILES:
        yield lambda done, total, path: None
        return
    from fp8mla._progress import Progress

    with Progress(total, "fp8mla scan", every=0.1) as bar:
        yield lambda done, total, path: bar.set(done, "files")
