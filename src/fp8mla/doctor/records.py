"""Compact records of the trace events the doctor keeps, and the unified :class:`Launch`.

Times are microseconds relative to the first event of the trace (``base_us``), whatever unit
the file used. Each record keeps only the fields the analysis reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ThreadKey = tuple[Any, Any]
"""``(pid, tid)`` as the trace writes them (ints or strings)."""


@dataclass(slots=True)
class Kernel:
    """A GPU activity: a kernel, memcpy or memset (``kind``)."""

    ts: float
    dur: float
    name: str
    kind: str  # "kernel" | "memcpy" | "memset"
    corr: int | None
    ext: int | None
    grid: tuple[int, int, int] | None
    block: tuple[int, int, int] | None
    stream: Any
    nbytes: int | None


@dataclass(slots=True)
class RuntimeCall:
    """A CUDA/HIP runtime or driver call on a CPU thread (``cudaLaunchKernel``, ...)."""

    ts: float
    end: float
    tid: ThreadKey
    name: str
    corr: int | None
    ext: int | None


@dataclass(slots=True)
class Op:
    """A ``cpu_op`` (an ATen or custom operator), with the arguments ``record_shapes`` adds.

    ``types``, ``dims`` and ``concrete`` are the ``Input type``, ``Input Dims`` and ``Concrete
    Inputs`` arguments as (nested) tuples, shared between ops with equal arguments.
    """

    ts: float
    end: float
    tid: ThreadKey
    name: str
    ext: int | None
    types: tuple[Any, ...] | None
    dims: tuple[Any, ...] | None
    concrete: tuple[Any, ...] | None
    stack: str | None  # torch 1.x "Call stack" argument
    parent: Op | None = None
    copy: Op | None = None  # the copy_/_to_copy inside this op's subtree (CPU-only analysis)


@dataclass(slots=True)
class PyFrame:
    """A ``python_function`` event of user code (``with_stack=True``).

    Built-ins and torch/triton/standard-library frames are not kept: the innermost kept frame
    around a launch is then the user code that issued it.
    """

    ts: float
    end: float
    tid: ThreadKey
    name: str


@dataclass(slots=True)
class Marker:
    """A ``ProfilerStep#N`` range on a CPU thread."""

    ts: float
    end: float
    tid: ThreadKey
    name: str


@dataclass
class TraceData:
    """Everything :func:`fp8mla.doctor.collect.collect` keeps from one trace."""

    path: str
    metadata: dict[str, Any]
    kernels: list[Kernel] = field(default_factory=list)
    runtimes: list[RuntimeCall] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    frames: list[PyFrame] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    shapes: set[tuple[Any, ...]] = field(default_factory=set)  # distinct tensor shapes seen
    events: int = 0
    time_unit: str = "us"
    time_unit_reason: str = "Chrome trace default"
    truncated: bool = False
    damage: str | None = None  # what is damaged and where (a partial analysis)
    warnings: list[str] = field(default_factory=list)
    device: str | None = None
    unread_categories: dict[str, int] = field(default_factory=dict)  # complete events not read


@dataclass(slots=True)
class Launch:
    """One unit of work in a step: a GPU kernel/memcpy, or a top-level CPU op (CPU-only traces).

    ``start``/``end`` are when it ran (device time for kernels), ``issue`` when the host asked
    for it (the runtime call, or the op itself). ``op`` is the CPU op that launched it, when
    linked, ``copy`` the op describing a cast/copy, ``frame`` the Python frame (``file.py(line):
    function``) that issued it.
    """

    name: str
    family: str
    start: float
    end: float
    issue: float
    op: Op | None = None
    copy: Op | None = None
    frame: str | None = None
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    graph: bool = False
    nbytes: int | None = None
    kind: str = "kernel"

    @property
    def dur(self) -> float:
        """Duration in µs."""
        return self.end - self.start
