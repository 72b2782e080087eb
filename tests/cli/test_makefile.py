"""``make demo`` on a fresh checkout says what it is installing before each install."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_every_install_step_is_announced(tmp_path):
    venv = tmp_path / "venv"
    recipe = subprocess.run(
        ["make", "-n", "-B", f"{venv}/.fp8mla-installed", f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    lines = recipe.splitlines()
    installs = [i for i, line in enumerate(lines) if "pip install" in line]
    assert len(installs) >= 4  # torch, triton + fp8mla; test tools and ruff on a host torch
    for i in installs:
        packages = re.findall(r"(torch==\S+|triton==\S+|pytest|ruff)", lines[i])
        said = " ".join(lines[max(0, i - 2) : i + 1])
        assert 'echo "fp8mla: installing' in said, lines[i]
        for package in packages:
            assert said.count(package) >= 2, (package, said)  # named in the echo too
    assert any("is ready" in line for line in lines)
    # the recipe is valid shell
    subprocess.run(["bash", "-n"], input=recipe, text=True, check=True, timeout=60)
