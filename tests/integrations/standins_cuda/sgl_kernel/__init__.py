"""Test-only stand-in for ``sgl_kernel`` (GPU test machines without SGLang's compiled kernels).

On CUDA about 13 SGLang modules import ``sgl_kernel`` at module level (under ``if _is_cuda``)
for ops the MLA attention path through fp8mla, ``torch_native`` and SGLang's ``triton``
backend never calls. Importing works; calling any of its functions raises. Put on
``sys.path`` by ``tests/integrations/conftest.py`` only on CUDA when the real package is absent.
"""

from __future__ import annotations

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


def __getattr__(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Absent(f"sgl_kernel.{attr}")
