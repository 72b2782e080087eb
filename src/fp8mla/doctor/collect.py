"""One pass over the streamed events: keep compact records of the ones the analysis needs.

Category names differ between torch versions (``kernel``/``Kernel``, ``cpu_op``/``Operator``,
``cuda_runtime``/``Runtime``), and so do argument names (``External id``/``external id``,
``Input Dims``/``Input dims``); all are accepted. Timestamps are rebased to the first event and
converted to microseconds; a trace written in nanoseconds is recognized by its magnitudes.
Repeated values (names, shapes, grids, threads) are stored once.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Callable
from typing import Any

from fp8mla.doctor.errors import DamagedTrace, TraceError
from fp8mla.doctor.frames import is_framework
from fp8mla.doctor.load import ProgressFn, TraceReader
from fp8mla.doctor.records import Kernel, Marker, Op, PyFrame, RuntimeCall, TraceData

__all__ = ["collect", "device_name"]

_STEP_PREFIX = "ProfilerStep#"
_CATEGORY_KINDS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "runtime": "runtime",
    "hip_runtime": "runtime",
    "cpu_op": "op",
    "operator": "op",
    "python_function": "python",
    "python": "python",
    "user_annotation": "annotation",
}
# Ops whose arguments never matter here; dropping them keeps large traces small in memory.
_NO_ARGS = frozenset(
    {"aten::empty", "aten::resolve_conj", "aten::resolve_neg", "aten::detach", "aten::lift_fresh"}
)
_DEVICE_NAME = re.compile(r"""["']name["']\s*:\s*["']([^"']+)["']""")

Handler = Callable[[dict[str, Any]], None]


def _number(value: Any) -> float | None:
    if type(value) is float or type(value) is int:
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _int(value: Any) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def _freeze(value: Any) -> Any:
    """Lists → tuples, recursively (JSON arguments made hashable)."""
    if type(value) is list:
        return tuple(_freeze(v) for v in value)
    if type(value) is dict:
        return None
    return value


def device_name(metadata: dict[str, Any]) -> str | None:
    """The first GPU's name from ``deviceProperties`` (a list, or its repr as a string)."""
    props = metadata.get("deviceProperties")
    if isinstance(props, list):
        for p in props:
            if isinstance(p, dict) and isinstance(p.get("name"), str):
                return p["name"]
    if isinstance(props, str):
        m = _DEVICE_NAME.search(props)
        if m:
            return m.group(1)
    return None


class _Collector:
    """Turns event dicts into records; times stay in the file's unit until :meth:`finish`."""

    def __init__(self, data: TraceData) -> None:
        self.data = data
        self.base: float | None = None
        self.max_ts = 0.0
        self.integral = True
        self.dur_sample: list[float] = []
        self.interned: dict[Any, Any] = {}
        self.user_frames: dict[str, bool] = {}
        self.no_phase = 0  # events without a phase ("ph"): JSON objects, not trace events
        kinds = {
            "kernel": self._kernel,
            "memcpy": self._kernel,
            "memset": self._kernel,
            "runtime": self._runtime,
            "op": self._op,
            "python": self._python,
            "annotation": self._annotation,
        }
        self.kinds = kinds
        self.handlers: dict[str, Handler | None] = {}

    def feed(self, e: dict[str, Any]) -> None:
        """Keep what one event contributes (dispatch on its category)."""
        ph = e.get("ph")
        if ph != "X":
            if ph is None:  # not a trace event: counted, so that a file of none is refused
                self.no_phase += 1
            return
        cat = e.get("cat")
        if type(cat) is not str:
            return
        handler = self.handlers.get(cat, False)
        if handler is False:
            kind = _CATEGORY_KINDS.get(cat.lower())
            handler = self.handlers[cat] = self.kinds.get(kind) if kind else None
        if handler is not None:
            handler(e)
        else:
            unread = self.data.unread_categories
            unread[cat] = unread.get(cat, 0) + 1

    def _times(self, e: dict[str, Any], sample: bool = True) -> tuple[float, float] | None:
        ts = e.get("ts")
        dur = e.get("dur", 0)
        if type(ts) is not float and type(ts) is not int:
            ts = _number(ts)
            if ts is None:
                return None
        if type(dur) is not float and type(dur) is not int:
            dur = _number(dur) or 0
        if not -1e300 < ts < 1e300:  # NaN or infinite
            return None
        if not 0 < dur < 1e300:
            dur = 0
        if self.base is None:
            self.base = ts
        if self.integral and (type(ts) is float or type(dur) is float):
            self.integral = False
        if ts > self.max_ts:
            self.max_ts = ts
        if sample and dur > 0 and len(self.dur_sample) < 20000:
            self.dur_sample.append(dur)
        t = ts - self.base
        return t, t + dur

    def _intern(self, value: Any) -> Any:
        try:
            return self.interned.setdefault(value, value)
        except TypeError:  # unhashable (a dict inside): keep as is
            return value

    def _name(self, e: dict[str, Any]) -> str:
        name = e.get("name")
        if type(name) is not str:
            name = str(name)
        return self.interned.setdefault(name, name)

    def _thread(self, e: dict[str, Any]) -> tuple[Any, Any]:
        return self._intern((e.get("pid"), e.get("tid")))

    @staticmethod
    def _args(e: dict[str, Any]) -> dict[str, Any]:
        args = e.get("args")
        return args if type(args) is dict else {}

    def _python(self, e: dict[str, Any]) -> None:
        name = e.get("name")
        if type(name) is not str:
            return
        keep = self.user_frames.get(name)
        if keep is None:
            keep = self.user_frames[name] = not is_framework(name)
        if not keep:
            return
        times = self._times(e, sample=False)
        if times is not None:
            self.data.frames.append(PyFrame(times[0], times[1], self._thread(e), self._name(e)))

    def _op(self, e: dict[str, Any]) -> None:
        times = self._times(e)
        if times is None:
            return
        name = self._name(e)
        if name.startswith(_STEP_PREFIX):
            self.data.markers.append(Marker(times[0], times[1], self._thread(e), name))
            return
        args = self._args(e)
        types = dims = concrete = None
        if name not in _NO_ARGS:
            dims = args.get("Input Dims", args.get("Input dims"))
            if type(dims) is list:
                dims = self._intern(_freeze(dims))
                for shape in dims:
                    if type(shape) is tuple and len(shape) >= 2:
                        self.data.shapes.add(shape)
            else:
                dims = None
            types = args.get("Input type", args.get("Input types"))
            types = self._intern(_freeze(types)) if type(types) is list else None
            concrete = args.get("Concrete Inputs")
            concrete = self._intern(_freeze(concrete)) if type(concrete) is list else None
        stack = args.get("Call stack")
        self.data.ops.append(
            Op(
                times[0],
                times[1],
                self._thread(e),
                name,
                _int(args.get("External id", args.get("external id"))),
                types,
                dims,
                concrete,
                stack if type(stack) is str and stack else None,
            )
        )

    def _runtime(self, e: dict[str, Any]) -> None:
        times = self._times(e)
        if times is None:
            return
        args = self._args(e)
        self.data.runtimes.append(
            RuntimeCall(
                times[0],
                times[1],
                self._thread(e),
                self._name(e),
                _int(args.get("correlation")),
                _int(args.get("External id", args.get("external id"))),
            )
        )

    def _annotation(self, e: dict[str, Any]) -> None:
        name = e.get("name")
        if type(name) is str and name.startswith(_STEP_PREFIX):
            times = self._times(e, sample=False)
            if times is not None:
                self.data.markers.append(Marker(times[0], times[1], self._thread(e), name))

    def _kernel(self, e: dict[str, Any]) -> None:
        times = self._times(e)
        if times is None:
            return
        args = self._args(e)
        grid, block = args.get("grid"), args.get("block")
        grid = self._intern(tuple(grid)) if _is_dim3(grid) else None
        block = self._intern(tuple(block)) if _is_dim3(block) else None
        kind = _CATEGORY_KINDS[e["cat"].lower()]
        self.data.kernels.append(
            Kernel(
                times[0],
                times[1] - times[0],
                self._name(e),
                kind,
                _int(args.get("correlation")),
                _int(args.get("External id", args.get("external id"))),
                grid,
                block,
                self._intern(args.get("stream")) if type(args.get("stream")) is int else None,
                _int(args.get("bytes")),
            )
        )

    def finish(self) -> None:
        """Decide the time unit and convert every record to microseconds."""
        data = self.data
        median = statistics.median(self.dur_sample) if self.dur_sample else 0.0
        unit = data.metadata.get("displayTimeUnit")
        if self.max_ts > 1e17:
            reason = "timestamps above 1e17 are nanoseconds since the epoch"
        elif self.integral and median >= 500:
            reason = f"integer times with a median duration of {median:,.0f} (too long for µs)"
        elif self.integral and unit == "ns" and median >= 50:
            reason = "displayTimeUnit 'ns' with integer times"
        else:
            return
        data.time_unit, data.time_unit_reason = "ns", reason
        for rec in (*data.kernels, *data.runtimes, *data.ops, *data.frames, *data.markers):
            rec.ts *= 1e-3
            if isinstance(rec, Kernel):
                rec.dur *= 1e-3
            else:
                rec.end *= 1e-3


def _is_dim3(value: Any) -> bool:
    return (
        type(value) is list
        and len(value) == 3
        and type(value[0]) is int
        and type(value[1]) is int
        and type(value[2]) is int
    )


def collect(
    path: str | os.PathLike[str],
    progress: ProgressFn | None = None,
    *,
    allow_partial: bool = False,
) -> TraceData:
    """Stream one trace file and keep what the analysis needs.

    Raises :class:`~fp8mla.doctor.errors.TraceError` for a file that is not a usable trace, and
    :class:`~fp8mla.doctor.errors.DamagedTrace` for a damaged one (truncated, corrupt) unless
    ``allow_partial``: then the events before the damage are kept and ``data.truncated`` is set.
    """
    with TraceReader(path, progress) as reader:
        data = TraceData(path=os.fspath(path), metadata=reader.metadata)
        collector = _Collector(data)
        feed = collector.feed
        for event in reader:
            feed(event)
    data.events = reader.events
    data.truncated = reader.truncated
    data.damage = reader.damage
    if reader.truncated and (reader.events == 0 or not allow_partial):
        read = (
            f"{reader.events:,} complete events before it (--allow-partial analyses them)"
            if reader.events
            else "no complete events before it"
        )
        raise DamagedTrace(f"{data.path}: damaged trace: {reader.damage}; {read}")
    if reader.events == 0:
        raise TraceError(f"{data.path}: the trace holds no events")
    if collector.no_phase == reader.events:  # e.g. a JSON array of records of another kind
        raise TraceError(
            f"{data.path}: not a Chrome trace: none of its {reader.events:,} array elements is "
            f"a trace event (no 'ph' field)"
        )
    if reader.truncated:
        data.warnings.append(
            f"PARTIAL: the trace is damaged ({reader.damage}): only the {reader.events:,} "
            f"complete events before the damage are analysed, and every total covers only them"
        )
    collector.finish()
    data.device = device_name(reader.metadata)
    return data
