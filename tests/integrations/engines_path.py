"""Where the pinned engine packages live for these tests, and how they are put on sys.path.

Shared by ``conftest.py`` and the engine benchmarks (``benchmarks/bench_sglang_kit.py``,
``benchmarks/bench_vllm_step.py``; GPU machine runs). ``FP8MLA_ENGINES_PATH`` points at another
folder: a leg of ``make test``'s engine matrix (``.venv/engines-vllm-0.34``, whose pins
conflict with the default folder's) or a GPU machine's unpacked carry; ``FP8MLA_ENGINES_ONLY``
names the one engine such a folder holds. The folder's engine pins are read from the
``requirements.txt`` that ``install_engines.py`` leaves in it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENGINES = Path(os.environ.get("FP8MLA_ENGINES_PATH") or ROOT / ".venv" / "engines")
UNREACHABLE = ENGINES / "UNREACHABLE"
ONLY = os.environ.get("FP8MLA_ENGINES_ONLY") or None
PINS = ENGINES / "requirements.txt"  # the folder's requirements (install_engines.py)


def engine_pins() -> dict[str, str]:
    """The engines this folder pins, by name (``{"sglang": "0.5.23", "vllm": "0.33.0"}``);
    only ``FP8MLA_ENGINES_ONLY`` when that is set."""
    from integrations.install_engines import REQUIREMENTS
    from integrations.install_engines import engine_pins as read

    pins = read(PINS if PINS.is_file() else REQUIREMENTS)
    return {name: v for name, v in pins.items() if ONLY is None or name == ONLY}


def _torchvision_loads() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:  # a CUDA build next to a CPU torch
        sys.modules.pop("torchvision", None)
        return False
    return True


def use_engines() -> bool:
    """Put the engines and the test stand-ins on ``sys.path``; return whether CUDA is up.

    The engines' folder is APPENDED, so the environment's own packages (torch, Triton and
    whatever else it has) stay the ones imported. Stand-ins (test-only), each only when the
    real package cannot be imported: ``standins/torchvision`` (the registry's wheels link CUDA
    libraries; the engines import it at module level for image processing only) and, on CUDA,
    ``standins_cuda/sgl_kernel`` (imported at module level by SGLang modules whose ops the MLA
    attention path never calls). vLLM's CUDA platform imports its compiled extensions at
    start; the tests drive ``FP8MLAImpl`` directly, so its CPU platform is used everywhere
    (tensors may still be CUDA).
    """
    if ENGINES.is_dir() and not UNREACHABLE.is_file() and str(ENGINES) not in sys.path:
        sys.path.append(str(ENGINES))
    if not _torchvision_loads() and str(HERE / "standins") not in sys.path:
        sys.path.insert(0, str(HERE / "standins"))
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        cuda = False
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    standin = str(HERE / "standins_cuda")
    if cuda and importlib.util.find_spec("sgl_kernel") is None and standin not in sys.path:
        sys.path.insert(0, standin)
    return cuda
