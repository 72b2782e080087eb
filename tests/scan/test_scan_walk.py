"""Files, directory walks and installed packages, without importing or running scanned code."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fp8mla.scan import ScanError, scan_paths

BUG = "def forward_decode(pool, q):\n    return pool.get_key_buffer(0).to(q.dtype)\n"
GATHER = "def forward_extend(k_buffer, loc, q):\n    return k_buffer[loc].to(q.dtype)\n"
# Module code that must never run: it leaves a marker file behind and then fails.
BOOBY_TRAP = "open({marker!r}, 'w').write('executed')\nraise SystemExit('scanned code ran')\n"


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "engine"
    write(root / "attention" / "mla_backend.py", BUG)
    write(root / "attention" / "prefill.py", GATHER)
    write(root / "clean.py", "x = 1\n")
    write(root / "broken.py", "def f(:\n")
    write(root / "blob.py", b"\x7fELF\x02\x01\x01\x00\x00")
    write(root / ".hidden" / "skip.py", BUG)
    write(root / "__pycache__" / "skip.py", BUG)
    write(root / "notes.txt", "k_buffer.to(q.dtype)\n")
    return root


def test_directory_walk_scans_python_files_and_lists_unparsable_ones(tree: Path) -> None:
    result = scan_paths([tree])
    assert result.files_scanned == 3
    assert [(Path(f.path).name, f.kind) for f in result.findings] == [
        ("mla_backend.py", "whole_pool_cast"),
        ("prefill.py", "gathered_cast"),
    ]
    assert result.findings[0].function == "forward_decode"
    assert result.has_whole_pool_cast
    skipped = {Path(s.path).name: s.reason for s in result.skipped}
    assert set(skipped) == {"blob.py", "broken.py"}
    assert "binary" in skipped["blob.py"] and "syntax error" in skipped["broken.py"]


def test_files_and_directories_mix_without_duplicates(tree: Path) -> None:
    file = tree / "attention" / "mla_backend.py"
    result = scan_paths([file, tree / "attention", str(file)])
    assert result.files_scanned == 2
    assert len(result.findings) == 2


def test_an_explicit_file_is_scanned_whatever_its_extension(tmp_path: Path) -> None:
    script = write(tmp_path / "serve", BUG)
    assert [f.kind for f in scan_paths([script]).findings] == ["whole_pool_cast"]


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ScanError, match="no such file or directory"):
        scan_paths([tmp_path / "nope"])


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package importable from sys.path whose every module would leave a marker if run."""
    site = tmp_path / "site"
    marker = tmp_path / "executed"
    trap = BOOBY_TRAP.format(marker=str(marker))
    write(site / "fakeengine" / "__init__.py", trap)
    write(site / "fakeengine" / "layers" / "__init__.py", trap)
    write(site / "fakeengine" / "layers" / "attention" / "__init__.py", trap)
    write(site / "fakeengine" / "layers" / "attention" / "mla.py", trap + BUG)
    write(site / "fakeengine" / "utils.py", trap + GATHER)
    write(site / "fakemodule.py", trap + BUG)
    monkeypatch.syspath_prepend(str(site))
    return marker


@pytest.mark.parametrize(
    ("name", "files", "kinds"),
    [
        ("fakeengine", 5, ["whole_pool_cast", "gathered_cast"]),
        ("fakeengine.layers", 3, ["whole_pool_cast"]),
        ("fakeengine.layers.attention.mla", 1, ["whole_pool_cast"]),
        ("fakeengine.utils", 1, ["gathered_cast"]),
        ("fakemodule", 1, ["whole_pool_cast"]),
    ],
)
def test_installed_packages_are_located_not_imported(
    installed: Path, name: str, files: int, kinds: list[str]
) -> None:
    result = scan_paths([], package=name)
    assert result.files_scanned == files
    assert [f.kind for f in result.findings] == kinds
    assert not installed.exists(), "scanning ran the package's code"
    assert name.split(".")[0] not in sys.modules


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_package_fp8mla", "package not found"),
        ("fakeengine.nothing", "package not found"),
        ("fakeengine.utils.deeper", "package not found"),
        ("not-a-name", "not a package name"),
        ("sys", "no Python source"),
    ],
)
def test_unknown_packages_are_usage_errors(installed: Path, name: str, message: str) -> None:
    with pytest.raises(ScanError, match=message):
        scan_paths([], package=name)


def test_scanning_does_not_import_torch(tree: Path) -> None:
    code = (
        "import sys; from fp8mla.scan import scan_paths; "
        f"r = scan_paths([{str(tree)!r}]); "
        "assert r.findings and 'torch' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_single_path_string_is_one_path(tree: Path) -> None:
    assert scan_paths(str(tree / "clean.py")).files_scanned == 1
