"""Test-only stand-in for ``torchvision`` (CPU test machines only).

The registry's torchvision wheels link CUDA libraries and cannot load next to the CPU torch
wheel, yet SGLang and vLLM import ``torchvision.transforms`` at module level in their
multimodal processors, which the attention path never runs. This package satisfies those
imports; any use of an attribute raises. It is put on ``sys.path`` by
``tests/integrations/conftest.py`` only when no working torchvision is installed.
"""

from __future__ import annotations

import sys
import types

__version__ = "0.0.0+fp8mla-standin"


class _Absent:
    """Any attribute or call of a torchvision object: fails when used, not when imported."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is a test stand-in here (no image ops)")

    def __mro_entries__(self, bases):  # used as a base class: an empty class
        return (object,)

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self._name}>"


def _module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = []  # a package: submodules import
    mod.__getattr__ = lambda attr: (
        (_ for _ in ()).throw(AttributeError(attr))
        if attr.startswith("__")
        else _Absent(f"{name}.{attr}")
    )  # noqa: E501
    sys.modules[name] = mod
    return mod


for _sub in (
    "transforms",
    "transforms.functional",
    "transforms.v2",
    "transforms.v2.functional",
    "transforms.InterpolationMode",
    "io",
    "ops",
    "models",
    "utils",
    "datasets",
):
    _mod = _module(f"{__name__}.{_sub}")
    _parent, _, _leaf = _mod.__name__.rpartition(".")
    setattr(sys.modules[_parent], _leaf, _mod)


def __getattr__(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Absent(f"torchvision.{attr}")
