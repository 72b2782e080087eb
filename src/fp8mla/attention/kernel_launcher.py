"""Launching one compiled Triton kernel again without Triton's per-launch work.

Triton's generic launcher binds and specializes every argument on every call (tens of
microseconds of host time for ~45 arguments). :class:`KernelLauncher` keeps the compiled kernel
of the first launch and calls it directly afterwards, as long as the call's tensors keep the
specialization it was compiled for (16-byte aligned pointers, strides divisible by 16: the
checks here); any other call takes Triton's path. :class:`ArgumentBinder` puts a call's values
into the kernel's positional order around the values a plan fixed. (``native.py`` goes
further: the parameters themselves bound in C.)
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Hashable, Sequence
from functools import reduce
from typing import Any

import torch

try:  # Triton's runtime settings (profiling hooks live there); a submodule, imported by name
    from triton import knobs as _knobs
except ImportError:  # older Triton: no hooks to respect, and no direct path either
    _knobs = None


class KernelLauncher:
    """One kernel with a fixed grid and launch options; arguments by name.

    ``launch(args, key)``: with a ``key`` (a hashable naming the specialization of the call's
    arguments), a kernel compiled by an earlier launch with the same key is called directly;
    with ``key=None`` every launch takes Triton's own path (the interpreter, profiling hooks,
    arguments outside the fast specialization)."""

    def __init__(
        self, fn: Any, grid: tuple[int, int, int], options: dict[str, int], device: int = 0
    ) -> None:
        self.fn = fn
        self.grid = grid
        self.options = options
        self.names: list[str] = list(getattr(fn, "arg_names", ()))
        self.defaults = {
            p.name: p.default for p in getattr(fn, "params", ()) if getattr(p, "has_default", False)
        }
        self._compiled: dict[Hashable, Any] = {}
        self._device = device  # CUDA index whose current stream a direct launch uses
        self.direct_launches = 0  # launches that skipped Triton's path (for tests)

    def launch(self, args: dict[str, Any], key: Hashable | None) -> None:
        """A launch through Triton's path (binding and specializing ``args`` by name); with a
        ``key``, later :meth:`launch_direct` calls of that key reuse its compiled kernel."""
        if key is not None and key in self._compiled and self._direct_ok():
            self.launch_direct(
                [args[n] if n in args else self.defaults[n] for n in self.names], key
            )
            return
        kernel = self.fn[self.grid](**args, **self.options)
        if key is not None and kernel is not None and hasattr(kernel, "packed_metadata"):
            self._compiled[key] = kernel

    def launch_direct(self, ordered: Sequence[Any], key: Hashable) -> bool:
        """Call the kernel compiled for ``key`` with every argument in parameter order;
        False (nothing launched) when there is none yet or a profiler hooks launches."""
        kernel = self._compiled.get(key)
        if kernel is None or not self._direct_ok():
            return False
        g0, g1, g2 = self.grid
        kernel.run(g0, g1, g2, current_stream(self._device), kernel.function,
                   kernel.packed_metadata, None, None, None, *ordered)  # fmt: skip
        self.direct_launches += 1
        return True

    @staticmethod
    def _direct_ok() -> bool:
        """Profilers hook Triton's launches: leave those to Triton's path. A hook is a
        callable, None, or (Triton 3.5+) a ``HookChain`` whose ``calls`` may be empty."""
        runtime = getattr(_knobs, "runtime", None)
        if runtime is None:
            return False
        for name in ("launch_enter_hook", "launch_exit_hook"):
            hook = getattr(runtime, name, None)
            if hook is not None and (not hasattr(hook, "calls") or hook.calls):
                return False
        return True


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device: int) -> int:
    """The raw handle of PyTorch's current CUDA stream on device ``device``."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device)
    return torch.cuda.current_stream(device).cuda_stream


class ArgumentBinder:
    """A kernel's positional arguments for a direct launch: the plan's values and defaults in
    a template, the call's values put into their positions (``call`` names them in order).

    Tensors go in as their device addresses (the plan's here, the call's by the caller):
    Triton's launcher takes an int as the address itself, where for a tensor it calls
    ``data_ptr()`` and asks the driver about the pointer (``cuPointerGetAttribute``), once
    per pointer argument of every launch. The plan's tensors stay referenced by the plan; the
    call's are the caller's, alive through the launch."""

    def __init__(self, launcher: KernelLauncher, fixed: dict[str, Any], call: tuple[str, ...]):
        names = launcher.names
        missing = [
            n for n in names if n not in fixed and n not in call and n not in launcher.defaults
        ]
        if missing:
            raise TypeError(
                f"expected every kernel argument bound at plan() or run(), got {missing} unbound"
            )
        # every parameter as an index into the call's values followed by the plan's
        self.plan_values = [
            tensor_address(fixed.get(n, launcher.defaults.get(n))) for n in names if n not in call
        ]
        planned = [n for n in names if n not in call]
        order = [call.index(n) if n in call else len(call) + planned.index(n) for n in names]
        self._gather = operator.itemgetter(*order)

    def __call__(self, vals: list[Any]) -> tuple[Any, ...]:
        """Every parameter's value in order, ``vals`` the call's (``len(call)`` of them)."""
        return self._gather(vals + self.plan_values)


def declared_options(fn: Any) -> set[str]:
    """The compile-time options ``fn`` declares with defaults (constexprs a plan may set
    through ``kernel_options``); under the interpreter, its upper-case parameters with
    defaults (an interpreted kernel keeps no parameter records)."""
    params = getattr(fn, "params", None)
    if params is not None:
        return {p.name for p in params if getattr(p, "is_constexpr", 0) and p.has_default}
    sig = inspect.signature(getattr(fn, "fn", fn)).parameters.values()
    return {p.name for p in sig if p.name.isupper() and p.default is not p.empty}


def tensor_address(value: Any) -> Any:
    """A tensor's device address; any other value as it is."""
    return value.data_ptr() if isinstance(value, torch.Tensor) else value


def aligned16(*tensors: torch.Tensor) -> bool:
    """All data pointers 16-byte aligned (Triton's pointer specialization)."""
    acc = 0
    for t in tensors:
        acc |= t.data_ptr()
    return acc & 15 == 0


def int_class(value: int) -> tuple[bool, bool, bool]:
    """What Triton's specialization makes of an int argument: whether it equals 1 (compiled
    as a constant), is divisible by 16, fits 32 bits. Calls alike in all three run the same
    compiled kernel."""
    return value == 1, value % 16 == 0, -(2**31) <= value < 2**31


def all16(values: Sequence[int]) -> bool:
    """All values divisible by 16 (Triton's integer specialization; 0 and 1 are not)."""
    return 0 not in values and reduce(operator.or_, values) & 15 == 0
