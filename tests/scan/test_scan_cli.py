"""``fp8mla scan``: text and JSON reports, exit statuses, usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fp8mla.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
SEED = FIXTURES / "seed_mla_backend.py"
SCHEMA = {"path", "line", "function", "code", "kind", "severity", "suggestion"}


def run_scan(argv: list[str]) -> int:
    """``fp8mla scan ARGV``'s exit status."""
    return main(["scan", *argv])


def test_text_report_names_file_line_function_code_reason_and_fix(capsys) -> None:
    assert run_scan([str(SEED)]) == 1
    out = capsys.readouterr().out
    lines = SEED.read_text().splitlines()
    line = 1 + next(
        i for i, text in enumerate(lines) if "k_buffer[:, :, :512].to(q.dtype)," in text
    )
    assert f"{SEED}:{line}: high whole_pool_cast in FlashInferMLAAttnBackend.forward_decode" in out
    assert "    k_buffer[:, :, :512].to(q.dtype)," in out
    assert (
        "  why: `k_buffer[:, :, :512].to(q.dtype)` casts a whole KV pool buffer `k_buffer`" in out
    )
    assert "fix (3 whole_pool_cast sites): read the FP8 cache in-kernel: plan fp8mla." in out
    assert out.count("read the FP8 cache in-kernel") == 1  # one paragraph for the three sites
    assert "plan_kv_dtype_hint in FlashInferMLAIndicesUpdaterDecode.call_begin_forward" in out
    assert out.rstrip().endswith(
        "4 finding(s): 3 whole_pool_cast, 1 plan_kv_dtype_hint (1 file scanned)"
    )


def test_json_report_follows_the_schema(capsys) -> None:
    assert run_scan([str(FIXTURES), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["files_scanned"] == 3 and data["skipped"] == []
    assert data["findings"], "expected findings"
    for finding in data["findings"]:
        assert SCHEMA <= set(finding)
        assert finding["severity"] in {"high", "medium", "low"}
    kinds = {f["kind"] for f in data["findings"]}
    assert kinds == {"whole_pool_cast", "gathered_cast", "plan_kv_dtype_hint"}


def test_exit_status_is_zero_without_whole_pool_casts(tmp_path: Path, capsys) -> None:
    (tmp_path / "ok.py").write_text("def f(k_buffer, loc, q):\n    return k_buffer[loc].float()\n")
    (tmp_path / "bad.py").write_text("def f(:\n")
    assert run_scan([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "low gathered_cast in f" in out and "1 skipped" in out and "bad.py" not in out
    assert err.startswith(f"fp8mla scan: skipped {tmp_path / 'bad.py'}: syntax error, line 1")
    assert err.count("\n") == 1
    assert run_scan([str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["skipped"][0]["reason"].startswith("syntax error")


def test_nothing_found(tmp_path: Path, capsys) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    assert run_scan([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "no KV cache casts found (1 file scanned)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give at least one PATH or --package NAME"),
        (["/no/such/dir"], "no such file or directory: /no/such/dir"),
        (["--package", "no_such_package_fp8mla"], "package not found: no_such_package_fp8mla"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv: list[str], message: str, capsys) -> None:
    assert run_scan(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"fp8mla scan: error: {message}\n"


def test_module_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fp8mla", "scan", str(SEED), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["findings"][0]["kind"] == "whole_pool_cast"
    missing = subprocess.run(
        [sys.executable, "-m", "fp8mla", "scan", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2
    assert "Traceback" not in missing.stderr and len(missing.stderr.splitlines()) == 1
