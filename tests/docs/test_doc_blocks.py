"""Every Python block of the README and docs/ runs, and so does every shell block marked to run
on a CPU.

A block runs in a scratch folder holding what the docs name: ``trace.json.gz`` (the shared
GLM-5 full-cast trace), ``flashinfer_mla_backend.py`` and ``src/backend.py`` (the seed backend
of the scan tests) and ``tests/`` (the repository's, for the shell blocks' paths). A marker on
the line before a fence says how a block runs:

- ``<!-- run: cpu -->``: a shell block to run (each line exits 0 or 1, with no error on stderr);
- ``<!-- run: gpu only -->``: run only where CUDA is available;
- ``<!-- run: no (why) -->``: never run (say why).

Python blocks run unless marked otherwise; shell blocks only when marked ``run: cpu``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*run:\s*(cpu|gpu only|no\b[^>]*)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    marker: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            marker = _MARKER.match(lines[i - 1]) if i else None
            out.append(
                Block(
                    path,
                    i + 1,
                    m.group(1),
                    "\n".join(lines[i + 1 : end]) + "\n",
                    marker.group(1) if marker else None,
                )
            )
            i = end + 1
    return out


ALL = blocks()
PYTHON = [b for b in ALL if b.lang == "python"]
SHELL = [b for b in ALL if b.lang in ("sh", "bash", "console") and b.marker == "cpu"]


def _skip(block: Block) -> None:
    if block.marker and block.marker.startswith("no"):
        pytest.skip(f"marked not to run: {block.marker}")
    if block.marker == "gpu only":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("marked GPU only")


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    seed = ROOT / "tests" / "scan" / "fixtures" / "seed_mla_backend.py"
    shutil.copy(ROOT / "tests" / "data" / "traces" / "glm5_tp2_full_cast.json.gz",
                tmp_path / "trace.json.gz")  # fmt: skip
    shutil.copy(seed, tmp_path / "flashinfer_mla_backend.py")
    (tmp_path / "src").mkdir()
    shutil.copy(seed, tmp_path / "src" / "backend.py")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_docs_have_blocks_to_run():
    assert any(b.path.name == "README.md" for b in PYTHON)
    assert any(b.path.name == "README.md" for b in SHELL)
    assert {b.path.name for b in PYTHON} >= {"README.md", "doctor.md", "scan.md", "gap.md"}
    for b in ALL:  # a marker only where it means something
        if b.marker == "cpu":
            assert b.lang in ("sh", "bash", "console"), b.name


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.name)
def test_python_block_runs(block: Block, scratch: Path) -> None:
    _skip(block)
    code = compile(block.code, block.name, "exec")
    exec(code, {"__name__": "__main__"})  # noqa: S102 -- the docs' own examples


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.name)
def test_shell_block_runs(block: Block, scratch: Path) -> None:
    shim = scratch / "bin"
    shim.mkdir()
    exe = shim / "fp8mla"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fp8mla "$@"\n')
    exe.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    for line in block.code.splitlines():
        command = line.split("  #", 1)[0].strip()
        if not command or command.startswith("#"):
            continue
        proc = subprocess.run(
            ["bash", "-c", command],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode in (0, 1), (command, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr and "error:" not in proc.stderr, proc.stderr
