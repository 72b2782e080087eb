"""Set-up for the engine integration tests: the real, pinned SGLang and vLLM packages.

They live in their own folder (``.venv/engines``, filled by ``install_engines.py`` from
``make test``; ``FP8MLA_ENGINES_PATH`` points elsewhere, e.g. a GPU machine's carried copy)
and are appended to ``sys.path`` here, so fp8mla's own torch and Triton stay the ones
imported. When the install found the package registry unreachable, only
``test_engines_installed.py`` is collected and it skips with that reason (one line).

Stand-ins (test-only): ``standins/torchvision`` when no working torchvision is installed (the
registry's wheels link CUDA libraries; the engines import it at module level for image
processing only); on CUDA, ``standins_cuda/sgl_kernel`` when SGLang's compiled kernels are
absent (imported at module level by modules whose ops the MLA attention path never calls). The engine tests run after the rest of the suite, since
importing an engine configures process-wide state (logging, multiprocessing).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from integrations.engines_path import ENGINES, HERE, UNREACHABLE

collect_ignore: list[str] = []
if UNREACHABLE.is_file():
    collect_ignore = [
        p.name for p in HERE.glob("test_*.py") if p.name != "test_engines_installed.py"
    ]
elif ENGINES.is_dir() and str(ENGINES) not in sys.path:
    sys.path.append(str(ENGINES))


def _torchvision_loads() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:  # a CUDA build next to a CPU torch
        sys.modules.pop("torchvision", None)
        return False
    return True


if not _torchvision_loads():
    sys.path.insert(0, str(HERE / "standins"))

try:
    import torch

    _CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _CUDA = False
# vLLM's CUDA platform imports its compiled extensions at start; the tests drive
# FP8MLAImpl directly, so vLLM's CPU platform is used everywhere (tensors may be CUDA).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
if _CUDA and importlib.util.find_spec("sgl_kernel") is None:
    sys.path.insert(0, str(HERE / "standins_cuda"))


def pytest_collection_modifyitems(config, items):
    """Run the engine tests last: importing an engine changes process-wide state."""
    mine = [it for it in items if HERE in Path(str(it.fspath)).parents]
    if mine:
        rest = [it for it in items if HERE not in Path(str(it.fspath)).parents]
        items[:] = rest + mine


@pytest.fixture(scope="session")
def engine_device() -> str:
    return "cuda" if _CUDA else "cpu"
