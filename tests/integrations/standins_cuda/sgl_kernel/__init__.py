"""Test-only stand-in for ``sgl_kernel`` (GPU test machines without SGLang's compiled kernels).

On CUDA, SGLang modules on the attention kit's import chain import ``sgl_kernel`` and its
submodules at module level (under ``if _is_cuda``; e.g. ``sglang.srt.layers.quantization``
does ``from sgl_kernel.quantization import ...``) for ops the MLA attention path through
fp8mla, ``torch_native`` and SGLang's ``triton`` backend never calls. Importing works, for
any submodule and any name; calling any of them raises, but for one capability query
(``sgl_kernel.utils.is_arch_support_pdl``, which SGLang's ``triton`` backend calls when it is
built: the H200 run of 2026-11-30 could not time that backend without it). Put on ``sys.path`` by
``tests/integrations/engines_path.py`` only on CUDA when the real package is absent.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+fp8mla-standin"


class _Absent:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: sgl_kernel is a test stand-in here")

    def __mro_entries__(self, bases):  # used as a base class: an empty class
        return (object,)

    def __bool__(self) -> bool:  # feature probes (`if sgl_kernel.x:`) see it as absent
        return False

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._name}>"


def _module_getattr(name: str):
    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{name}.{attr}")

    return __getattr__


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.<a>.<b>`` imports as an empty package of absent names."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = _module_getattr(spec.name)
        return mod

    def exec_module(self, module):
        pass


def _is_arch_support_pdl() -> bool:
    """``sgl_kernel.utils.is_arch_support_pdl``: a capability query, not a kernel (SGLang's
    ``triton`` backend asks it in its constructor): programmatic dependent launch needs SM90+."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


# the one real name: a module of absent names but for that query
utils = types.ModuleType(__name__ + ".utils")
utils.__path__ = []
utils.__getattr__ = _module_getattr(utils.__name__)
utils.is_arch_support_pdl = _is_arch_support_pdl
sys.modules.setdefault(utils.__name__, utils)

if not any(isinstance(f, _Submodules) for f in sys.meta_path):
    sys.meta_path.append(_Submodules())

__getattr__ = _module_getattr(__name__)
