"""The pinned engine packages are importable (or the registry was unreachable: one skip)."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from integrations.engines_path import ENGINES, ONLY, UNREACHABLE


@pytest.mark.parametrize("engine, version", [("sglang", "0.5.23"), ("vllm", "0.33.0")])
def test_pinned_engine_installed(engine, version):
    if UNREACHABLE.is_file():
        pytest.skip(UNREACHABLE.read_text().strip())
    if ONLY is not None and engine != ONLY:
        pytest.skip(f"{engine} is not carried in this run (FP8MLA_ENGINES_ONLY={ONLY})")
    assert ENGINES.is_dir(), f"expected the engine packages in {ENGINES}: run `make test`"
    assert md.version(engine) == version
