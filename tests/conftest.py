"""Test set-up: Triton kernels run compiled on a CUDA GPU and interpreted on a CPU.

TRITON_INTERPRET must be set before any kernel module is imported, so it is decided here,
before collection imports the test modules.
"""

from __future__ import annotations

import os

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # the trace tools are testable without torch
    torch = None
    HAS_CUDA = False

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# the Gluon wgmma kernel runs on Hopper only (no interpreter)
IS_SM90 = HAS_CUDA and not INTERPRETED and torch.cuda.get_device_capability() == (9, 0)


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"
