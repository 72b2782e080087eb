"""The pinned engine packages are importable (or the registry was unreachable: one skip)."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from integrations.engines_path import ENGINES, UNREACHABLE, engine_pins


@pytest.mark.parametrize("engine, version", sorted(engine_pins().items()))
def test_pinned_engine_installed(engine, version):
    if UNREACHABLE.is_file():
        pytest.skip(UNREACHABLE.read_text().strip())
    assert ENGINES.is_dir(), f"expected the engine packages in {ENGINES}: run `make test`"
    assert md.version(engine) == version
