"""Point a trace finding at source lines: the Python frame the trace names, found in a source
tree and scanned statically by ``fp8mla.scan``.

A frame such as ``sglang/srt/layers/attention/flashinfer_mla_backend.py(412): forward_decode``
names the file (as the profiler shortened it) and the function (the line is the function's first
line). The file is looked up under the source root by name, preferring the candidate sharing the
longest trailing path; the scan's findings inside that function become ``source_lines``.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from fp8mla.doctor.finding import CAST_KINDS, POOL_PROPORTIONAL_CAST

__all__ = ["attach_sources", "locate", "package_root"]

_FRAME = re.compile(r"^(?P<file>.+?\.py)\((?P<line>\d+)\): (?P<func>[\w<>.]+)$")
_SKIP_DIRS = frozenset(
    {
        ".git",
        "__pycache__",
        ".venv",
        "venv",
        "node_modules",
        ".tox",
        ".hg",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
    }
)
_MAX_FILES = 200_000


def package_root(package: str) -> str | None:
    """The directory above an importable package's source (so ``pkg/sub/mod.py`` resolves)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        location = next(iter(spec.submodule_search_locations), None)
        return os.path.dirname(os.path.abspath(location)) if location else None
    return os.path.dirname(os.path.abspath(spec.origin)) if spec.origin else None


def _index(root: str) -> dict[str, list[str]]:
    """File name → paths of the ``*.py`` files under ``root``."""
    found: dict[str, list[str]] = {}
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for name in filenames:
            if name.endswith(".py"):
                found.setdefault(name, []).append(os.path.join(dirpath, name))
                count += 1
        if count > _MAX_FILES:
            break
    return found


def locate(frame_file: str, index: dict[str, list[str]]) -> str | None:
    """The indexed path sharing the longest trailing path with ``frame_file``."""
    parts = frame_file.replace("\\", "/").split("/")
    best, best_score = None, 0
    for path in index.get(parts[-1], []):
        candidate = path.replace("\\", "/").split("/")
        score = 0
        for a, b in zip(reversed(parts), reversed(candidate)):
            if a != b:
                break
            score += 1
        if score > best_score:
            best, best_score = path, score
    return best


def _reports(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in report.get("ranks", [report]) if "findings" in r]


def attach_sources(
    report: dict[str, Any],
    *,
    source_root: str | os.PathLike[str] | None = None,
    package: str | None = None,
) -> None:
    """Add ``source_lines`` (``[{"path", "line", "code"}]``) to cast findings, in place.

    Problems (no such root, the package not importable, ``fp8mla.scan`` missing, the file not
    found) become entries of the report's ``warnings``, never exceptions.
    """
    warnings: list[str] = report.setdefault("warnings", [])
    roots = []
    if source_root is not None:
        root = os.fspath(source_root)
        if os.path.isdir(root):
            roots.append(root)
        else:
            warnings.append(f"--source-root {root}: not a directory")
    if package is not None:
        root = package_root(package)
        if root:
            roots.append(root)
        else:
            warnings.append(f"--package {package}: not importable here")
    if not roots:
        return
    try:
        from fp8mla.scan import scan_file
    except ImportError:
        warnings.append("fp8mla.scan is not available: cannot point findings at source lines")
        return
    index: dict[str, list[str]] = {}
    for root in roots:
        for name, paths in _index(root).items():
            index.setdefault(name, []).extend(paths)
    for rep in _reports(report):
        for finding in rep["findings"]:
            if finding["kind"] not in CAST_KINDS or not finding.get("source"):
                continue
            m = _FRAME.match(finding["source"])
            if not m:
                continue
            path = locate(m.group("file"), index)
            if path is None:
                finding["source_lines"] = []
                warnings.append(f"{m.group('file')}: not found under {', '.join(roots)}")
                continue
            func = m.group("func")
            try:
                scanned = scan_file(path)
            except OSError as exc:
                warnings.append(f"{path}: cannot scan ({exc})")
                continue
            matches = [s for s in scanned if s.function == func or s.function.endswith("." + func)]
            whole = [s for s in matches if s.kind == "whole_pool_cast"]
            if finding["kind"] == POOL_PROPORTIONAL_CAST and whole:
                matches = whole
            finding["source_file"] = path
            finding["source_lines"] = [
                {"path": s.path, "line": s.line, "code": s.code} for s in matches
            ]
