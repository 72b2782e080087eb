"""Turn files, directories and installed package names into the list of files to scan.

Installed packages are located with :func:`importlib.util.find_spec` on the top-level name
only (which runs no package code); submodule paths are then resolved on disk, never imported.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path


class ScanError(ValueError):
    """A usage error: a path that does not exist or a package that cannot be found."""


# Directories a source walk never enters (besides hidden ones such as ``.git`` and ``.venv``).
_SKIP_DIRS = frozenset({"__pycache__", "node_modules"})


def _walk_dir(root: Path) -> list[Path]:
    """``*.py`` files under ``root`` in path order (a directory's files sort among its subdirs)."""
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS]
        files.extend(Path(dirpath, name) for name in filenames if name.endswith(".py"))
    return sorted(files, key=lambda p: p.parts)


def source_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Every file to scan under ``paths``, in order, without duplicates.

    A file is scanned whatever its extension; a directory contributes its ``*.py`` files,
    recursively, skipping hidden directories and ``__pycache__``. Raises :class:`ScanError` for
    a path that does not exist.
    """
    seen: set[Path] = set()
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ScanError(f"no such file or directory: {os.fspath(raw)}")
        for file in _walk_dir(path) if path.is_dir() else [path]:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                out.append(file)
    return out


def package_paths(name: str) -> list[Path]:
    """The source directories (or single module file) of the installed package ``name``.

    ``name`` may be dotted (``sglang.srt.layers``); only the top-level package is looked up
    through the import system, and nothing is imported. Raises :class:`ScanError` when the
    package is not installed or has no Python source.
    """
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise ScanError(f"not a package name: {name!r}")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError) as exc:
        raise ScanError(f"cannot locate package {parts[0]!r}: {exc}") from None
    if spec is None:
        raise ScanError(f"package not found: {name}")
    locations = [Path(p) for p in spec.submodule_search_locations or ()]
    if not locations:  # a single-module distribution
        origin = spec.origin or ""
        if len(parts) == 1 and origin.endswith(".py") and Path(origin).is_file():
            return [Path(origin)]
        raise ScanError(f"package {name} has no Python source to scan ({origin or 'no origin'})")
    for depth, part in enumerate(parts[1:], start=2):
        module = [loc / f"{part}.py" for loc in locations if (loc / f"{part}.py").is_file()]
        locations = [loc / part for loc in locations if (loc / part).is_dir()]
        if not locations and module and depth == len(parts):
            return module[:1]
        if not locations:
            raise ScanError(f"package not found: {name}")
    return locations
