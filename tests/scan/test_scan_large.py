"""Inputs that must not hang the scan or exhaust memory: special files, huge sources, big trees."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fp8mla.cli import main
from fp8mla.scan import scan_paths, scan_source
from fp8mla.scan import source as source_module

SEED = Path(__file__).parent / "fixtures" / "seed_mla_backend.py"
BUG = "def forward_decode(pool, q):\n    return pool.get_key_buffer(0).to(q.dtype)\n"

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")


def _scan_in_child(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fp8mla", "scan", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@needs_fifo
def test_a_fifo_in_a_tree_or_given_directly_is_skipped_not_read(tmp_path: Path) -> None:
    (tmp_path / "backend.py").write_text(BUG)
    os.mkfifo(tmp_path / "x.py")
    # A child process: a scan that opened the FIFO would block until the timeout.
    proc = _scan_in_child([str(tmp_path), "--json"], timeout=60)
    data = json.loads(proc.stdout)
    (skipped,) = data["skipped"]
    assert skipped["path"].endswith("x.py")
    assert skipped["reason"].startswith("not a regular file: a FIFO (named pipe), not read")
    # Given alone, nothing can be scanned: exit 2, the skip note and the error on stderr.
    proc = _scan_in_child([str(tmp_path / "x.py"), "--json"], timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    note, error = proc.stderr.splitlines()
    assert note.startswith(f"fp8mla scan: skipped {tmp_path / 'x.py'}: not a regular file: a FIFO")
    assert error == "fp8mla scan: error: nothing could be scanned: 1 file skipped"


def test_sockets_and_devices_are_skipped(tmp_path: Path) -> None:
    sock_path = tmp_path / "s.py"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(sock_path))
    except OSError as exc:  # path too long on some systems
        pytest.skip(f"cannot bind a unix socket: {exc}")
    try:
        result = scan_paths([tmp_path])
        assert [s.reason for s in result.skipped] == ["not a regular file: a socket, not read"]
    finally:
        server.close()
    if os.path.exists("/dev/null"):
        (skipped,) = scan_paths(["/dev/null"]).skipped
        assert skipped.reason == "not a regular file: a character device, not read"


def _big_source(copies: int) -> str:
    seed = SEED.read_text().replace("from __future__ import annotations\n", "")
    parts = [seed.replace("class FlashInferMLA", f"class FlashInferMLA{i}_") for i in range(copies)]
    tricky = textwrap.dedent('''
        DOC = """
        def not_a_function():
            return pool.get_key_buffer(0).to(q.dtype)
        """


        @decorator
        def decorated(pool, q):
            return pool.get_key_buffer(0).to(q.dtype)
        ''')
    return "from __future__ import annotations\n" + tricky.join(parts)


def test_a_large_source_parsed_in_parts_finds_what_one_parse_finds(monkeypatch) -> None:
    text = _big_source(40)
    whole = scan_source(text, "big.py")
    monkeypatch.setattr(source_module, "PART_CHARS", 10_000)
    parsed = source_module.parse_source(text, "big.py")
    assert parsed.tree is None  # split, not parsed at once
    parts = scan_source(text, "big.py")
    assert [(f.line, f.kind, f.function, f.code) for f in parts] == [
        (f.line, f.kind, f.function, f.code) for f in whole
    ]
    assert len(whole) > 100
    list(parsed.trees())
    assert parsed.notes[0].endswith("parts") and not parsed.partial


def test_a_part_that_does_not_parse_is_left_out_and_said(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(source_module, "PART_CHARS", 2_000)
    monkeypatch.setattr(source_module, "MAX_PART_CHARS", 20_000)
    good = BUG * 200
    broken = "def broken(:\n    pass\n" + "x = 1\n" * 10
    path = tmp_path / "big.py"
    path.write_text(good + broken + good.replace("forward_decode", "after"))
    result = scan_paths([path])
    assert result.files_scanned == 1 and not result.skipped
    notes = [n.note for n in result.notes]
    assert any("not scanned (syntax error" in n for n in notes), notes
    found = {f.function for f in result.findings}
    assert {"forward_decode", "after"} <= found  # the parts around the bad one are scanned


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_twenty_megabytes_of_source_in_bounded_memory(tmp_path: Path) -> None:
    text = _big_source(1)
    path = tmp_path / "huge.py"
    with open(path, "w") as f:
        f.write(text)
        body = text.split("\n", 1)[1]
        written = len(text)
        i = 0
        while written < 20_000_000:
            chunk = body.replace("class FlashInferMLA", f"class Copy{i}_")
            f.write(chunk)
            written += len(chunk)
            i += 1
    # VmHWM: this process's peak RSS (ru_maxrss would include the forking pytest process's).
    code = (
        "from fp8mla.scan import scan_paths; "
        f"r = scan_paths([{str(path)!r}]); "
        "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')]; "
        "print(len(r.findings), r.notes[0].note, hwm[0])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    findings, *note, max_rss_kb = proc.stdout.split()
    assert int(findings) > 10_000
    assert "parsed in" in " ".join(note)
    assert int(max_rss_kb) < 500_000, f"peak RSS {int(max_rss_kb) / 1e3:.0f} MB"


def _tree(root: Path, n: int) -> None:
    for i in range(n):
        (root / f"m{i}.py").write_text("x = 1\n" if i % 2 else BUG)


def test_progress_on_large_trees(tmp_path: Path, capsys, monkeypatch) -> None:
    from fp8mla.scan import scanner

    _tree(tmp_path, 30)
    seen: list[tuple[int, int]] = []
    scan_paths([tmp_path], progress=lambda done, total, path: seen.append((done, total)))
    assert seen[-1] == (30, 30) and len(seen) == 30
    monkeypatch.setattr(scanner, "PROGRESS_FILES", 10)
    assert main(["scan", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "fp8mla scan [########################] 30/30  files" in err
    assert main(["scan", str(tmp_path), "--no-progress"]) == 1
    assert capsys.readouterr().err == ""


def test_findings_grouped_by_severity_and_min_severity(tmp_path: Path, capsys) -> None:
    (tmp_path / "a.py").write_text(
        "def f(k_buffer, loc, q):\n    return k_buffer[loc].float()\n" + BUG
    )
    assert main(["scan", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.index("== high (1) ==") < out.index("== low (1) ==")
    assert main(["scan", str(tmp_path), "--min-severity", "high", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [f["severity"] for f in data["findings"]] == ["high"]
    assert main(["scan", str(tmp_path), "--min-severity", "medium"]) == 1
    out = capsys.readouterr().out
    assert "low" not in out.split("==")[1] and "1 below --min-severity not shown" in out
    (tmp_path / "a.py").write_text("def f(k_buffer, loc, q):\n    return k_buffer[loc].float()\n")
    # exit status follows whole-pool casts, not what is shown
    assert main(["scan", str(tmp_path), "--min-severity", "high"]) == 0
