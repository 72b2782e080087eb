"""``fp8mla demo`` at a tiny shape: the strategies agree and the doctor finds the cast."""

from __future__ import annotations

import pytest

from fp8mla.cli import main
from fp8mla.demo import run_demo
from fp8mla.demo.config import CPU_DEFAULT, with_overrides


@pytest.fixture
def tiny(device):
    return with_overrides(
        CPU_DEFAULT,
        layers=3,
        heads=4,
        hidden=128,
        pool_slots=4000,
        context=96,
        batch=2,
        steps=1,
        mlp=128,
        device=device,
        cuda_graph=device == "cuda",
    )


def test_demo_strategies_agree_and_doctor_finds_the_cast(tiny, tmp_path, capfd):
    trace = tmp_path / "demo.json.gz"
    result = run_demo(tiny, save_trace=str(trace), progress=False)
    out, err = capfd.readouterr()
    assert "USDT" not in err and "profiler_start" not in err  # the profiler's own notes
    names = [r.name for r in result.rows]
    assert names == ["full-pool cast", "gather-then-cast", "fp8mla direct"]
    for row in result.rows:
        assert row.rel_err < 1e-2, row
        assert row.ms_per_step > 0 and row.bytes_per_step > 0
    full = result.rows[0]
    assert full.bytes_per_step > result.rows[2].bytes_per_step
    f = result.finding
    assert f is not None and f["kind"] == "pool_proportional_cast"
    assert f["calls_per_step"] == tiny.layers
    assert f["elements_per_call"] == tiny.pool_slots * 576
    assert "full_pool_cast" in (f["source"] or "")
    assert trace.exists()
    for name in names:
        assert name in out
    # what is compared against what, in the output
    flat = " ".join(out.split())
    assert (
        f"each strategy's hidden state after all {tiny.layers} layers against fp8mla direct's"
        in flat
    )
    check = result.attention
    assert check is not None and check.rel_err < 1e-2 and 0 < check.rounding < check.rel_err * 4
    assert f"relative error {check.rel_err:.1e}" in flat
    assert "against fp8mla.reference.mla_reference computed in float64" in flat
    if tiny.device == "cpu":
        assert check.what == "fp8mla's Triton kernel, run by Triton's CPU interpreter"
        assert "0 (same)" in out and "they say nothing about GPU kernel speed" in flat


def test_profiler_notes_are_dropped_and_other_stderr_kept(capfd):
    import os

    from fp8mla.demo.profile import _without_profiler_notes

    with _without_profiler_notes():
        os.write(
            2, b"USDT:2026-11-30 19:16:27 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        )
        os.write(2, b"a real warning\n")
        os.write(
            2, b"USDT:2026-11-30 19:16:37 1:1 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"
        )
    assert capfd.readouterr().err == "a real warning\n"


def test_demo_cli_rejects_bad_shapes(capsys):
    assert main(["demo", "--device", "cpu", "--context", "5000", "--pool-slots", "4000"]) == 2
    assert "pool-slots" in capsys.readouterr().err
    assert main(["demo", "--device", "cpu", "--layers", "0"]) == 2
