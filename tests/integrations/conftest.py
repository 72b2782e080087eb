"""Set-up for the engine integration tests: the real, pinned SGLang and vLLM packages.

They live in their own folder (``.venv/engines``, filled by ``install_engines.py`` from
``make test``; ``FP8MLA_ENGINES_PATH`` points elsewhere: the engine matrix's vLLM 0.34 folder
``.venv/engines-vllm-0.34``, which ``make test`` runs the vLLM tests against too, or a GPU
machine's carried copy) and are appended to ``sys.path`` by ``engines_path.use_engines``, so
fp8mla's own torch and Triton stay the ones imported. When the install found the package registry unreachable, only
``test_engines_installed.py`` is collected and it skips with that reason (one line).

Stand-ins (test-only, see ``use_engines``): ``standins/torchvision`` when no working
torchvision is installed; on CUDA, ``standins_cuda/sgl_kernel`` when SGLang's compiled kernels
are absent. The engine tests run after the rest of the suite, since importing an engine
configures process-wide state (logging, multiprocessing).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integrations.engines_path import HERE, UNREACHABLE, use_engines

collect_ignore: list[str] = []
if UNREACHABLE.is_file():
    collect_ignore = [
        p.name for p in HERE.glob("test_*.py") if p.name != "test_engines_installed.py"
    ]

_CUDA = use_engines()


def pytest_collection_modifyitems(config, items):
    """Run the engine tests last: importing an engine changes process-wide state."""
    mine = [it for it in items if HERE in Path(str(it.fspath)).parents]
    if mine:
        rest = [it for it in items if HERE not in Path(str(it.fspath)).parents]
        items[:] = rest + mine


@pytest.fixture(scope="session")
def engine_device() -> str:
    return "cuda" if _CUDA else "cpu"
