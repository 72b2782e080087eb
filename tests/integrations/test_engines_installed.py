"""The pinned engine packages are importable (or the registry was unreachable: one skip)."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from integrations.engines_path import ENGINES, UNREACHABLE


def test_pinned_engines_installed():
    if UNREACHABLE.is_file():
        pytest.skip(UNREACHABLE.read_text().strip())
    assert ENGINES.is_dir(), f"expected the engine packages in {ENGINES}: run `make test`"
    assert md.version("sglang") == "0.5.23"
    assert md.version("vllm") == "0.33.0"
