"""Kernel launches with their arguments bound at ``plan()``, through a small C extension.

Triton's launcher parses every argument of every launch (~45 for the attention kernels) and
wraps each launch in Python: for a decode step, several times the host time of the launch
itself (``docs/design/host.md``). :func:`bind` makes a :class:`Launch` from a kernel Triton compiled: the plan's
values fill a parameter block once, and :func:`launch` writes only the call's values (tensor
addresses, strides, lengths) and launches, the attention and the split merge in one call
(:func:`launcher`).

The extension (``csrc/``: ``tensor_fields.h``, ``bound.c``, ``fast_call.c``, ``module.c``) is
built on first use with Triton's own C build (the compiler and headers Triton's launchers
need; cached in Triton's cache). Where it cannot be built, or a kernel's compiled form is one
it does not handle (scratch memory, clusters, a parameter specialized on its value),
:func:`bind` returns None and the caller keeps Triton's path. ``FP8MLA_NATIVE_LAUNCH=0`` turns
it off.

run()'s C path reads each tensor's dtype, device, shape, strides and address. Through the
tensor's Python methods that is ~28 calls into PyTorch's argument parser per call; ``csrc/tensor_fields.cpp`` reads them through PyTorch's C++ API in one call per
tensor. It is built once against the installed PyTorch with the system's C++ compiler (seconds;
cached in Triton's cache); where it cannot be built the Python methods are used, with the
same checks. ``FP8MLA_NATIVE_FIELDS=0`` keeps the Python methods.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from fp8mla.attention.kernel_launcher import tensor_address

# compiled parameter type -> slot kind of csrc/bound.c (pointer, int64, int32, uint32, int8,
# uint8, float32)
_KINDS = {"i64": "L", "u64": "p", "i32": "i", "u32": "I", "i1": "b", "i8": "b", "u1": "B",
          "u8": "B", "fp32": "f", "f32": "f"}  # fmt: skip


_CSRC = Path(__file__).with_name("csrc")
# one translation unit, in this order (the header: TensorFields, shared with the accessor)
_SOURCES = ("tensor_fields.h", "bound.c", "fast_call.c", "module.c")


@lru_cache(maxsize=1)
def module() -> Any:
    """The built extension, or None (with one warning) where it cannot be built or is off."""
    if os.environ.get("FP8MLA_NATIVE_LAUNCH", "1") == "0":
        return None
    try:
        from triton.backends.nvidia import driver as nv
        from triton.runtime.build import compile_module_from_src

        src = "\n".join((_CSRC / name).read_text() for name in _SOURCES)
        mod = compile_module_from_src(
            src=src, name="fp8mla_launch", include_dirs=list(nv.include_dirs)
        )
    except Exception as exc:  # no compiler, headers or Triton build helper: Triton's path
        warnings.warn(
            f"fp8mla: bound kernel launches unavailable ({type(exc).__name__}: {exc}); "
            "launching through Triton",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    fields = fields_module()
    mod.set_fields(None if fields is None else fields.fields)
    return mod


def _torch_build_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags of a module built against the installed PyTorch."""
    import torch

    root = Path(torch.__file__).parent
    lib = str(root / "lib")
    abi = int(torch.compiled_with_cxx11_abi())
    cflags = ["-O2", "-std=c++17", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
              "-I" + sysconfig.get_paths()["include"], "-I" + str(root / "include")]  # fmt: skip
    ldflags = ["-shared", "-L" + lib, "-Wl,-rpath," + lib, "-lc10", "-ltorch_cpu", "-ltorch_python"]
    return cflags, ldflags


@lru_cache(maxsize=1)
def fields_module() -> Any:
    """The C++ tensor-field accessor (``csrc/tensor_fields.cpp``), built once against the
    installed PyTorch and cached in Triton's cache; None (with one warning) where it cannot be
    built, or with ``FP8MLA_NATIVE_FIELDS=0``."""
    if os.environ.get("FP8MLA_NATIVE_FIELDS", "1") == "0":
        return None
    name = "fp8mla_fields"
    try:
        import importlib.util

        import torch
        from triton.runtime.cache import get_cache_manager

        src = (_CSRC / "tensor_fields.cpp").read_text()
        header = (_CSRC / "tensor_fields.h").read_text()
        cxx = os.environ.get("CXX", "c++")
        cflags, ldflags = _torch_build_flags()
        key = "\n".join([header, src, cxx, *cflags, *ldflags, torch.__version__, sys.version])
        cache = get_cache_manager(hashlib.sha256(key.encode()).hexdigest())
        filename = name + sysconfig.get_config_var("EXT_SUFFIX")
        path = cache.get_file(filename)
        if path is None:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, filename)
                cpp = os.path.join(tmp, name + ".cpp")
                Path(cpp).write_text(src)
                Path(tmp, "tensor_fields.h").write_text(header)
                subprocess.run([cxx, *cflags, cpp, "-o", out, *ldflags], check=True,
                               capture_output=True, text=True)  # fmt: skip
                path = cache.put(Path(out).read_bytes(), filename, binary=True)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    except Exception as exc:  # no C++ compiler or PyTorch headers: the Python methods
        detail = getattr(exc, "stderr", None) or exc
        warnings.warn(
            f"fp8mla: run()'s C path reads tensors through their Python methods "
            f"(the C++ accessor could not be built: {type(exc).__name__}: {str(detail)[-400:]})",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


@cache
def dtype_code(dtype: Any) -> int:
    """``dtype``'s code in the C++ accessor (PyTorch's ScalarType), -1 without it (looked up
    once per dtype)."""
    import torch

    mod = fields_module()
    return -1 if mod is None else mod.dtype_code(torch.empty(0, dtype=dtype))


def param_kinds(kernel: Any, names: Sequence[str], call: Sequence[str] = ()) -> str | None:
    """The slot kinds of ``kernel``'s parameters in order (its two scratch pointers last), or
    None when its compiled form is not one :func:`bind` handles: scratch memory, clusters,
    or a parameter of ``call`` (set per launch) that Triton compiled as a constant because of
    its value (an int equal to 1, None), which a later call's value could not change."""
    meta = getattr(kernel, "metadata", None)
    if (
        meta is None
        or getattr(meta, "global_scratch_size", 0)
        or getattr(meta, "profile_scratch_size", 0)
        or getattr(meta, "num_ctas", 1) != 1
        or getattr(meta, "tensordesc_meta", None)
    ):
        return None
    src = getattr(kernel, "src", None)
    sig = getattr(src, "signature", None)
    fn = getattr(src, "fn", None)
    if not isinstance(sig, dict) or list(sig) != list(names) or fn is None:
        return None
    declared = {p.name for p in fn.params if p.is_constexpr}
    kinds = []
    for name, ty in sig.items():
        if ty == "constexpr":
            if name not in declared and name in call:  # a later value would be lost
                return None
            continue
        if not isinstance(ty, str):
            return None
        kind = "p" if ty.startswith("*") else _KINDS.get(ty)
        if kind is None:
            return None
        kinds.append(kind)
    return "".join(kinds) + "pp"  # global and profile scratch: none


def bind(
    kernel: Any,
    grid: tuple[int, int, int],
    names: Sequence[str],
    values: dict[str, Any],
    call: Sequence[str],
) -> Any:
    """A :class:`Launch` of ``kernel`` (compiled by Triton) over ``grid``: every parameter
    not in ``call`` takes its value from ``values`` (tensors as addresses); a launch passes
    ``call``'s values in that order. None where the kernel or this build is not handled."""
    kinds = param_kinds(kernel, names, call)
    mod = module() if kinds is not None else None
    if mod is None or not isinstance(getattr(kernel, "function", None), int):
        return None
    sig = kernel.src.signature
    params = [n for n in names if sig[n] != "constexpr"]
    index = {n: k for k, n in enumerate(params)}
    init = [None if n in call else tensor_address(values[n]) for n in params] + [None, None]
    slots = [index.get(n, -1) for n in call]
    meta = kernel.metadata
    pdl = bool(getattr(meta, "launch_pdl", False))
    cooperative = bool(getattr(meta, "launch_cooperative_grid", False))
    return mod.Launch(
        int(kernel.function), tuple(grid), 32 * meta.num_warps, meta.shared, pdl, kinds, init,
        slots, cooperative,
    )  # fmt: skip


def launcher() -> Callable[[int, Any, Sequence[Any], Any, Sequence[Any] | None], bool]:
    """The extension's ``launch(stream, a, a_values, b, b_values) -> bool``: fills ``a`` with
    ``a_values`` and ``b`` (None: no second kernel) with ``b_values``, then launches both on
    ``stream``; False (nothing launched) when the thread has no current CUDA context. Call it
    only after :func:`bind` returned a Launch."""
    return module().launch


def fast_call(
    a: Any, b: Any, q_dtype: Any, kv_dtype: Any, device: int, tokens: int, heads: int,
    page_size: int, max_page: int, d_kpe: int, split: bool, nan_rows: bool, write_lse: bool,
    scale_tensors: bool, kv_itemsize: int, nan_address: int, partial_lse_address: int,
) -> Any:  # fmt: skip
    """``run()``'s common case in C: ``fast_run(spec, stream, q_nope, q_pe, ckv, kpe, out,
    lse, ckv_scale, kpe_scale)`` checks the call against the plan (plain tensors of the
    planned dtypes, shapes and device, unit last strides, addresses and strides of the bound
    specialization, page ids in range; the scales floats or None, or with ``scale_tensors``
    one-element fp32 tensors on the device), fills ``a`` (and ``b``, the merge, or None) and
    launches both; it returns False, launching nothing, for any call it does not take, which
    then goes through the Python path (its checks raise the errors)."""
    import torch

    mod = module()
    codes = [dtype_code(d) for d in (q_dtype, kv_dtype, torch.float32)]
    return mod.FastCall(
        a, b, torch.Tensor, q_dtype, kv_dtype, torch.float32, *codes, device, tokens, heads, page_size,
        max_page, d_kpe, split, nan_rows, write_lse, scale_tensors, kv_itemsize, nan_address,
        partial_lse_address,
    )  # fmt: skip


def fast_runner() -> Callable[..., bool]:
    """The extension's ``fast_run`` (see :func:`fast_call`)."""
    return module().fast_run
