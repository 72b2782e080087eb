"""The test-only ``sgl_kernel`` stand-in: imports of any name work, calls raise, but for the
capability query SGLang's ``triton`` backend makes when it is built."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

STANDIN = Path(__file__).parent / "standins_cuda" / "sgl_kernel" / "__init__.py"


@pytest.fixture
def standin(monkeypatch):
    for name in [n for n in sys.modules if n == "sgl_kernel" or n.startswith("sgl_kernel.")]:
        monkeypatch.delitem(sys.modules, name)
    spec = importlib.util.spec_from_file_location(
        "sgl_kernel", STANDIN, submodule_search_locations=[str(STANDIN.parent)]
    )
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "sgl_kernel", mod)
    spec.loader.exec_module(mod)
    yield mod
    for name in [n for n in sys.modules if n.startswith("sgl_kernel.")]:
        sys.modules.pop(name, None)
    # its import hook serves sgl_kernel.* names: it must not outlive the test
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_Submodules"]


def test_capability_query_answers_other_names_raise(standin):
    from sgl_kernel.quantization import fp8_scaled_mm  # any submodule, any name
    from sgl_kernel.utils import is_arch_support_pdl

    assert is_arch_support_pdl() is False  # no CUDA here
    with pytest.raises(RuntimeError, match="stand-in"):
        fp8_scaled_mm()
    with pytest.raises(RuntimeError, match="stand-in"):
        standin.utils.some_kernel()
