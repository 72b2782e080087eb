"""Damaged traces and special files: an error unless ``--allow-partial``, never a partial
answer that looks whole, never a hang, never an achieved bandwidth above the device's peak."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fp8mla.cli import main
from fp8mla.doctor import DamagedTrace, diagnose
from fp8mla.doctor.synth import SynthSpec, write_trace

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
FULL_CAST = TRACES / "glm5_tp2_full_cast.json.gz"
H200_PEAK_GBPS = 4800
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["doctor", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def cut_trace(tmp_path_factory) -> Path:
    """The issue's case: the first 590,000 bytes of the full-cast trace (about half)."""
    path = tmp_path_factory.mktemp("cut") / "cut.json.gz"
    path.write_bytes(FULL_CAST.read_bytes()[:590_000])
    return path


def test_truncated_trace_is_one_line_exit_2_naming_where_and_events(cut_trace, capsys):
    code, out, err = _run([str(cut_trace), "--fail-on", "high", "--no-progress"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    m = re.fullmatch(
        rf"fp8mla doctor: error: {re.escape(str(cut_trace))}: damaged trace: the gzip stream "
        r"ends early at byte 590,000, the file's end \(truncated file\); ([\d,]+) complete "
        r"events before it \(--allow-partial analyses them\)\n",
        err,
    )
    assert m, err
    assert int(m.group(1).replace(",", "")) > 1000


def test_allow_partial_marks_every_total_and_fails_fail_on(cut_trace, tmp_path, capsys):
    page = tmp_path / "r.html"
    args = [str(cut_trace), "--allow-partial", "--no-progress"]
    code, out, err = _run([*args, "--json", "--html", str(page)], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["partial"]["events_read"] > 1000
    assert "ends early at byte 590,000" in report["partial"]["damage"]
    assert report["steps"]["partial"]
    for row in (*report["findings"], *report["families"], *report["top_kernels"]):
        assert row["partial"], row
    html = page.read_text()
    assert "Partial report:" in html and html.count("(partial)") >= 4
    code, out, err = _run(args, capsys)
    assert code == 0
    assert "PARTIAL REPORT: the trace is damaged" in out
    assert "ms per step (partial)" in out and "Per step (mean of 3, partial)" in out
    # --fail-on cannot pass a trace it cannot judge, whatever the findings
    code, out, err = _run([*args, "--fail-on", "high"], capsys)
    assert code == 1
    assert err == (
        "fp8mla doctor: --fail-on: the report is partial (a damaged trace): it cannot pass\n"
    )


def test_no_achieved_bandwidth_above_the_device_peak(cut_trace, capsys):
    # The cut trace holds the CPU ops of the casts but not their kernels: the CPU op's time is
    # not the copy's, and dividing by it gave "15,659 GB/s achieved" on an H200 (peak 4.8 TB/s).
    report = diagnose(cut_trace, allow_partial=True)
    assert report["trace"]["device"] == "NVIDIA H200"
    for finding in report["findings"]:
        gbps = finding["bandwidth_gbps"]
        assert gbps is None or gbps <= H200_PEAK_GBPS, finding
    code, out, _ = _run([str(cut_trace), "--allow-partial", "--no-progress"], capsys)
    rates = [float(r.replace(",", "")) for r in re.findall(r"([\d,.]+) GB/s achieved", out)]
    assert all(rate <= H200_PEAK_GBPS for rate in rates), rates


def test_corrupt_gzip_names_the_bytes(tmp_path, capsys):
    data = bytearray(FULL_CAST.read_bytes())
    data[300_000:300_064] = bytes(64)
    path = tmp_path / "flipped.json.gz"
    path.write_bytes(bytes(data))
    code, out, err = _run([str(path), "--no-progress"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert re.search(r"damaged trace: corrupt gzip data in bytes [\d,]+–[\d,]+ of the file", err)
    assert "complete events before it" in err
    with pytest.raises(DamagedTrace):
        diagnose(path)


def test_truncated_plain_json_names_the_byte_offset(tmp_path, capsys):
    text = gzip.decompress(FULL_CAST.read_bytes())[:2_000_000]
    path = tmp_path / "cut.json"
    path.write_bytes(text)
    code, out, err = _run([str(path), "--no-progress"], capsys)
    assert code == 2 and out == ""
    assert "damaged trace: the file ends inside an event: the text ends at byte " in err
    offset = int(re.search(r"at byte ([\d,]+) of the file", err).group(1).replace(",", ""))
    assert 1_990_000 < offset <= 2_000_000


def test_a_damaged_rank_fails_the_directory(tmp_path, capsys):
    for rank in range(2):
        write_trace(str(tmp_path / f"rank{rank}.json.gz"), SynthSpec(layers=3, steps=2))
    damaged = tmp_path / "rank1.json.gz"
    damaged.write_bytes(damaged.read_bytes()[:-200])
    code, out, err = _run([str(tmp_path), "--no-progress"], capsys)
    assert code == 2 and f"{damaged}: damaged trace" in err
    code, out, err = _run([str(tmp_path), "--json", "--allow-partial"], capsys)
    report = json.loads(out)
    assert code == 0 and report["summary"]["partial"] == [str(damaged)]


# -- special files: never a hang, never a clobbered file --


@needs_fifo
def test_fifo_without_a_writer_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "trace.json.gz"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "fp8mla", "doctor", str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,  # a doctor that opened the FIFO for reading would block until this
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        f"fp8mla doctor: error: {fifo}: a pipe with no writer and no data: nothing to read\n"
    )


def test_a_pipe_is_read_as_a_stream(capsys):
    """``doctor <(zcat t.gz)`` names /dev/fd/N, a pipe: read it, don't call it empty."""
    read_end, write_end = os.pipe()
    data = FULL_CAST.read_bytes()

    def write() -> None:
        with os.fdopen(write_end, "wb") as f:
            f.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        code, out, err = _run([f"/dev/fd/{read_end}", "--json", "--no-progress"], capsys)
    finally:
        os.close(read_end)
        writer.join(timeout=30)
    assert code == 0, err
    report = json.loads(out)
    assert report["findings"][0]["kind"] == "pool_proportional_cast"
    assert report["partial"] is None


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_process_substitution_and_stdin(tmp_path):
    cmd = f'"{sys.executable}" -m fp8mla doctor <(zcat "{FULL_CAST}") --fail-on high'
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr  # the high finding, read from the pipe
    assert "[HIGH] Whole-pool float8_e4m3fn→bfloat16 cast every layer" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "fp8mla", "doctor", "-", "--json"],
        input=FULL_CAST.read_bytes(),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["findings"][0]["kind"] == "pool_proportional_cast"


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null")
def test_a_device_is_refused(capsys):
    code, out, err = _run(["/dev/null"], capsys)
    assert code == 2 and out == ""
    assert err == (
        "fp8mla doctor: error: /dev/null: not a regular file: a character device, not read\n"
    )


@needs_fifo
def test_html_never_replaces_a_fifo_and_empty_path_is_bad_input(tmp_path, capsys):
    fifo = tmp_path / "report.html"
    os.mkfifo(fifo)
    code, out, err = _run([str(FULL_CAST), "--html", str(fifo)], capsys)
    assert code == 2 and out == ""
    assert "--html" in err and "is a FIFO (named pipe), not a regular file" in err
    assert fifo.is_fifo()
    code, out, err = _run([str(FULL_CAST), "--html", ""], capsys)
    assert code == 2 and out == ""
    assert err == "fp8mla doctor: error: --html: expected a path, got an empty string\n"
    code, out, err = _run([""], capsys)
    assert (
        code == 2 and err == "fp8mla doctor: error: TRACE: expected a path, got an empty string\n"
    )


def test_html_is_written_beside_and_renamed(tmp_path, capsys):
    page = tmp_path / "report.html"
    page.write_text("old")
    os.chmod(page, 0o640)
    code, _, _ = _run([str(FULL_CAST), "--html", str(page), "--no-progress"], capsys)
    assert code == 0
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert oct(page.stat().st_mode & 0o777) == oct(0o640)  # the file's mode is kept
    assert sorted(os.listdir(tmp_path)) == ["report.html"]  # no temporary file left


def test_control_characters_in_names_are_escaped(tmp_path, capsys):
    code, out, err = _run([str(tmp_path / "t\x1b[2J.json")], capsys)
    assert code == 2 and "\x1b" not in err and "t\\x1b[2J.json" in err
