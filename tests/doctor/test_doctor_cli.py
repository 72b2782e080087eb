"""``fp8mla doctor``: exit codes, --json schema, --html, --fail-on, source lines, the floor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fp8mla.cli import main
from fp8mla.doctor.synth import SynthSpec, write_trace

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
FULL_CAST = str(TRACES / "glm5_tp2_full_cast.json.gz")
FINDING_KEYS = {
    "kind",
    "severity",
    "kernel",
    "calls_per_step",
    "elements_per_call",
    "src_dtype",
    "dst_dtype",
    "bytes_per_step",
    "time_per_step_ms",
    "share_of_step",
    "source",
    "suggestion",
}

BACKEND = """\
class FlashInferMLAAttnBackend:
    def forward_decode(self, q, layer, forward_batch):
        k_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        k_buffer = k_buffer.to(q.dtype)
        return self.decode_wrapper.run(q, k_buffer)

    def forward_extend(self, q, layer, forward_batch):
        k = self.token_to_kv_pool.get_key_buffer(layer.layer_id)[forward_batch.out_cache_loc]
        return k.to(q.dtype)
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    return write_trace(str(tmp_path_factory.mktemp("cli") / "t.json.gz"), SynthSpec(layers=4))


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(["doctor", *args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_json_schema(capsys):
    code, out, err = _run([FULL_CAST, "--json", "--no-progress"], capsys)
    assert code == 0 and not err
    report = json.loads(out)
    assert report["schema_version"] == 1
    assert {"count", "method", "mean_ms"} <= set(report["steps"])
    assert report["layers"] == 78
    for finding in report["findings"]:
        assert FINDING_KEYS <= set(finding)
        assert finding["severity"] in ("high", "medium", "low")
        assert 0.0 <= finding["share_of_step"] <= 1.0
    top = report["findings"][0]
    assert top["kind"] == "pool_proportional_cast"
    assert top["calls_per_step"] == 78 and top["elements_per_call"] == 285_437_952


def test_text_report(capsys, small):
    code, out, _ = _run([small], capsys)
    assert code == 0
    assert "1. [HIGH] Whole-pool float8_e4m3fn→bfloat16 cast every layer" in out
    assert "flashinfer_mla_backend.py(412): forward_decode" in out
    assert "Per step (mean of 3)" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/no/such/trace.json"], "no such file"),
        (["--layers", "x", FULL_CAST], "--layers: expected an integer in 1–1,024, got 'x'"),
        (["--layers", "0", FULL_CAST], "--layers: expected an integer in 1–1,024, got 0"),
        (["--gpu", "h200", FULL_CAST], "--gpu needs --model"),
    ],
)
def test_errors_are_one_line_exit_2(capsys, args, message):
    code, out, err = _run(args, capsys)
    assert code == 2 and not out
    assert message in err
    assert err.count("\n") == 1 and err.startswith("fp8mla doctor: error:")


def test_bad_files_exit_2_without_traceback(tmp_path):
    cases = {
        "garbage.json": b"garbage",
        "empty.json": b"",
        "binary.json.gz": b"\x1f\x8b\x00\x00",
        "not_trace.json": b'{"a": 1}',
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        proc = subprocess.run(
            [sys.executable, "-m", "fp8mla", "doctor", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, name
        assert "Traceback" not in proc.stderr
        assert proc.stderr.startswith("fp8mla doctor: error:") and proc.stderr.count("\n") == 1


def test_truncated_file_is_an_error_unless_partial_is_allowed(tmp_path, capsys, small):
    data = Path(small).read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: int(len(data) * 0.8)])
    code, out, err = _run([str(cut)], capsys)
    assert code == 2 and not out and err.count("\n") == 1
    assert err.startswith(f"fp8mla doctor: error: {cut}: damaged trace: the gzip stream ends early")
    assert "complete events before it (--allow-partial analyses them)" in err
    code, out, _ = _run([str(cut), "--allow-partial"], capsys)
    assert code == 0
    assert "PARTIAL REPORT: the trace is damaged" in out and "(partial)" in out


def test_fail_on(capsys, small):
    assert _run([small, "--fail-on", "high"], capsys)[0] == 1
    fp8 = str(TRACES / "external" / "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert _run([fp8, "--fail-on", "low"], capsys)[0] == 0


def test_html_output(tmp_path, capsys, small):
    page = tmp_path / "report.html"
    code, out, _ = _run([small, "--html", str(page)], capsys)
    assert code == 0 and out
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html
    assert "Whole-pool float8_e4m3fn→bfloat16 cast every layer" in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in html


def test_directory(tmp_path, capsys):
    for rank in range(2):
        write_trace(str(tmp_path / f"rank{rank}.json.gz"), SynthSpec(layers=3, steps=2))
    code, out, _ = _run([str(tmp_path), "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and len(report["ranks"]) == 2
    assert report["summary"]["findings"][0]["kind"] == "pool_proportional_cast"


def test_source_root_points_at_the_line(tmp_path, capsys, small):
    pytest.importorskip("fp8mla.scan")
    backend = tmp_path / "src" / "sglang" / "srt" / "layers" / "attention"
    backend.mkdir(parents=True)
    (backend / "flashinfer_mla_backend.py").write_text(BACKEND)
    decoy = tmp_path / "src" / "other" / "flashinfer_mla_backend.py"
    decoy.parent.mkdir()
    decoy.write_text("def forward_decode():\n    pass\n")
    code, out, _ = _run([small, "--json", "--source-root", str(tmp_path / "src")], capsys)
    finding = json.loads(out)["findings"][0]
    assert finding["source_file"] == str(backend / "flashinfer_mla_backend.py")
    assert finding["source_lines"] == [
        {
            "path": str(backend / "flashinfer_mla_backend.py"),
            "line": 4,
            "code": "k_buffer = k_buffer.to(q.dtype)",
        }
    ]
    code, out, _ = _run([small, "--source-root", str(tmp_path / "src")], capsys)
    assert "flashinfer_mla_backend.py:4: k_buffer = k_buffer.to(q.dtype)" in out


def test_source_root_problems_are_warnings_in_the_library(tmp_path, small):
    from fp8mla.doctor import diagnose

    report = diagnose(small, source_root=tmp_path / "missing", package="no_such_package_xyz")
    assert any("not a directory" in w for w in report["warnings"])
    assert any("not importable" in w for w in report["warnings"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source-root", "/no/such/root"], "--source-root /no/such/root: not a directory"),
        (["--package", "no_such_package_xyz"], "--package no_such_package_xyz: not importable"),
        (["--html", "/no/such/dir/r.html"], "--html /no/such/dir/r.html: no such directory"),
        (["--model", "no-such-model", "--gpu", "h200"], "unknown model"),
        (["--model", "glm-5", "--gpu", "a100"], "unknown GPU 'a100'"),
        (["--model", "glm-5"], "--model needs --gpu (presets: h100, h200"),
    ],
)
def test_bad_options_exit_2_before_reading_the_trace(capsys, args, message):
    # The trace does not exist: an option error must come first, before any work on it.
    code, out, err = _run(["/no/such/trace.json.gz", *args], capsys)
    assert code == 2 and not out
    assert err.startswith("fp8mla doctor: error: ") and err.count("\n") == 1
    assert message in err, err
    assert "--bandwidth" not in err


def test_floor_from_gap(capsys):
    pytest.importorskip("fp8mla.gap")
    code, out, _ = _run(
        [
            FULL_CAST,
            "--json",
            "--model",
            "glm-5",
            "--gpu",
            "h200",
            "--tp",
            "2",
            "--context",
            "3000",
        ],
        capsys,
    )
    report = json.loads(out)
    assert code == 0
    floor = report["floor"]
    assert floor["measured_ms"] == pytest.approx(report["steps"]["mean_ms"])
    assert floor["pool_slots"] == 495_552
    assert floor["floor_ms"] < floor["measured_ms"]
    code, out, _ = _run([FULL_CAST, "--model", "glm-5", "--gpu", "h200", "--tp", "2"], capsys)
    assert "floor per output token" in out


def test_doctor_imports_no_torch():
    code = textwrap.dedent("""
        import sys
        import fp8mla.doctor, fp8mla.cli.doctor, fp8mla.doctor.synth
        assert "torch" not in sys.modules and "triton" not in sys.modules, "torch imported"
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_package_locates_the_source(tmp_path, capsys, small, monkeypatch):
    pytest.importorskip("fp8mla.scan")
    backend = tmp_path / "sglang" / "srt" / "layers" / "attention"
    backend.mkdir(parents=True)
    for d in (tmp_path / "sglang", tmp_path / "sglang" / "srt"):
        (d / "__init__.py").write_text("")
    (backend / "flashinfer_mla_backend.py").write_text(BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))
    # an installed SGLang (the engine tests import the real one) must not shadow this package
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    code, out, _ = _run([small, "--json", "--package", "sglang"], capsys)
    finding = json.loads(out)["findings"][0]
    assert [line["line"] for line in finding["source_lines"]] == [4]


def test_progress_lines_for_large_files(capsys, small, monkeypatch):
    from fp8mla import _progress
    from fp8mla.doctor import diagnose

    monkeypatch.setattr(_progress, "LARGE_FILE_BYTES", 0)
    diagnose(small, progress=True)
    err = capsys.readouterr().err
    size_mb = f"{os.path.getsize(small) / 1e6:,.0f}"
    assert (
        f"fp8mla doctor [########################] {size_mb}/{size_mb} MB  reading t.json.gz" in err
    )
