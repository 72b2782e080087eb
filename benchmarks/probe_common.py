"""What the A/B probes (``probe_manyrows.py``, ``probe_stage.py``, ``probe_rowtiles.py``,
``probe_headgroups.py``) share: the FP8 pool and its bf16 copy, FlashInfer when
``FP8MLA_FLASHINFER`` names its folder, a case's inputs and reference, fp8mla planned on
either pool (through the public ``plan()``: ``kernel_config``, ``kernel_options``), timing over
rotated placements, one variant's measurement (``launch_info``: the kernel and grid that ran),
and the rows they print and write."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import Case
from fp8mla.bench.inputs import build_inputs, random_pool
from fp8mla.bench.measure import flops, time_cuda, time_graph
from fp8mla.bench.runner import placements, reference_subset
from fp8mla.testing import rel_err


@dataclass
class Pools:
    """One FP8 e4m3 pool holding every case, its bf16 copy (the same values) and FlashInfer."""

    fp8: torch.Tensor
    bf16: torch.Tensor
    flashinfer: object | None

    @classmethod
    def for_cases(cls, cases: list[Case], device: torch.device) -> Pools:
        fp8 = random_pool(max(c.slots_needed() for c in cases), torch.float8_e4m3fn, device)
        folder = os.environ.get("FP8MLA_FLASHINFER")
        return cls(fp8, fp8.to(torch.bfloat16), I.load_flashinfer(folder) if folder else None)

    def of(self, kv_name: str) -> torch.Tensor:
        return self.fp8 if kv_name == "float8_e4m3fn" else self.bf16

    def case_inputs(self, case: Case) -> tuple[list, torch.Tensor, torch.Tensor, float]:
        """A case's inputs over its timed placements in the FP8 pool, the float64 reference of
        4 requests of the first (its rows of the output: ``ref, ref_rows``) and its FLOPs."""
        dev = self.fp8.device
        inputs = [build_inputs(case, dev, seed=i, pool=self.fp8) for i in range(placements(case))]
        ref, ref_rows = reference_subset(inputs[0], 4)
        return inputs, ref, ref_rows, flops(case)

    def flashinfer_row(
        self, inputs: list, pool: torch.Tensor, fl: float, base: dict
    ) -> dict | None:
        """FlashInfer's row beside ``base``: its FP8 path on the FP8 pool, its bf16 path on the
        bf16 one (µs and TFLOP/s for ``fl`` FLOPs, or why it cannot run); None without it."""
        if self.flashinfer is None:
            return None
        name = "flashinfer-fp8" if pool.dtype.itemsize == 1 else "flashinfer-bf16kv"
        try:
            us = timed_us([I.flashinfer_wrapper(x, pool, self.flashinfer) for x in inputs])
        except I.Unavailable as exc:
            return dict(base, variant=name, error=str(exc))
        return dict(base, variant=name, us=round(us, 2), tflops=round(fl / us / 1e6, 1))


def fp8mla_runner(inp, pool: torch.Tensor, **plan_kw) -> tuple[I.Runner, object]:
    """fp8mla planned on ``pool`` (the FP8 pool with the inputs' scale, or a bf16 pool of its
    values), with ``plan()``'s overrides: the call and the wrapper."""
    w = I.planned_wrapper(inp, pool.dtype, **plan_kw)
    ckv, kpe = inp.paged(pool)
    out = torch.empty_like(inp.q_nope)
    kw = dict(ckv_scale=inp.scale, kpe_scale=inp.scale) if pool.dtype.itemsize == 1 else {}
    return (lambda: w.run(inp.q_nope, inp.q_pe, ckv, kpe, out=out, **kw)), w


def timed_us(runs: list[I.Runner]) -> float:
    """µs per call: CUDA-graph replays over the placements (as ``fp8mla bench`` times small
    cases), ``do_bench`` for a single one (extend chunks)."""
    if len(runs) == 1:
        return time_cuda(runs[0]).us_median
    return time_graph(lambda rs=runs: [r() for r in rs], reps=20).us_median / len(runs)


def measure(made: list[tuple[I.Runner, object]], ref, ref_rows, with_error: bool) -> dict:
    """One variant's runners over the placements (``(call, wrapper)`` as
    :func:`fp8mla_runner` returns them): µs per call, the first placement's error against the
    float64 ``ref`` of output rows ``ref_rows`` where ``with_error``, the kernel and its grid."""
    runs = [m[0] for m in made]
    out = runs[0]()
    torch.cuda.synchronize()
    err = rel_err(out[ref_rows].float(), ref) if with_error else None
    info = made[0][1].launch_info
    return dict(us=round(timed_us(runs), 2), rel_err=err and float(f"{err:.2e}"),
                kernel=info.variant, grid=list(info.grid))  # fmt: skip


# the table columns of a measured variant (:func:`measure`'s record, its round and TFLOP/s)
VARIANT_COLUMNS = [("variant", -18), ("round", 2), ("us", 9), ("tflops", 6), ("rel_err", 8),
                   ("kernel", -6), ("grid", -14)]  # fmt: skip


@dataclass
class Rows:
    """The probe's records: printed as JSON lines as they come, written at the end."""

    rows: list[dict] = field(default_factory=list)

    def add(self, rec: dict) -> None:
        self.rows.append(rec)
        print(json.dumps(rec), flush=True)

    def write(self, path: str, **extra: object) -> None:
        with open(path, "w") as f:
            json.dump(dict(extra, rows=self.rows), f, indent=1)

    def print_table(self, title: str, columns: list[tuple[str, int]]) -> None:
        """The records as a short table, printed last: ``columns`` as (key, width), a negative
        width left-aligned; a record without ``us`` shows its ``error`` there."""
        print(f"\n{title}")
        for r in self.rows:
            cells = []
            for key, width in columns:
                value = r.get(key, r.get("error") if key == "us" else None)
                text = "" if value is None else str(value)
                cells.append(f"{text:<{-width}}" if width < 0 else f"{text:>{width}}")
            print(" ".join(cells))
