"""``fp8mla gap`` on the command line: output, ``--json``, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fp8mla.cli import main

GLM5_TP2 = ["gap", "--model", "glm-5", "--tp", "2", "--gpu", "h200"]


def test_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*GLM5_TP2, "--measured-tpot", "93.6", "--pool-slots", "495552"]) == 0
    out = capsys.readouterr().out
    assert "floor per output token" in out
    assert "4.629 ms" in out  # floor, see test_gap_presets
    assert "88.971 ms" in out  # gap
    assert "15.6% of the gap" in out  # cast at the datasheet bandwidth
    assert "72.9% of the gap" in out  # cast at the H200's measured 1.03 TB/s
    assert "assumptions" in out


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "gap",
        "--model",
        "deepseek-v3",
        "--tp",
        "8",
        "--gpu",
        "h200",
        "--json",
        "--weights",
        "fp8",
        "--kv-dtype",
        "fp8_e5m2",
        "--batch",
        "1",
        "--context",
        "4096",
    ]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    for key in (
        "weight_bytes",
        "kv_bytes",
        "total_bytes",
        "bandwidth_tbps",
        "floor_ms",
        "measured_ms",
        "gap_ms",
        "cast_ms",
        "cast_share_of_gap",
    ):
        assert key in data
    assert data["kv_bytes"] == 4096 * 61 * 576
    assert data["floor_ms"] == pytest.approx(data["total_bytes"] / 4.8e9)


def test_bandwidth_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gap", "--model", "deepseek-v3", "--tp", "8", "--bandwidth", "4.27"]) == 0
    assert "4.27 TB/s (given (--bandwidth))" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["gap", "--model", "llama-3", "--gpu", "h200"],
        ["gap", "--model", "glm-5", "--tp", "3", "--gpu", "h200"],
        ["gap", "--model", "glm-5"],
        ["gap", "--model", "glm-5", "--gpu", "h200", "--bandwidth", "-1"],
    ],
)
def test_bad_values_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fp8mla gap: error:") and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["gap", "--gpu", "h200"],  # --model missing
        ["gap", "--model", "glm-5", "--tp", "two"],
        ["gap", "--model", "glm-5", "--weights", "int4"],
        ["gap", "--model", "glm-5", "--kv-dtype", "fp16"],
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fp8mla gap: error:") and err.count("\n") == 1


def test_gap_imports_no_torch() -> None:
    code = "import sys, fp8mla.gap, fp8mla.cli.gap; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
