"""``fp8mla demo``'s files: --save-trace never replaces a FIFO or device and is written whole
or not at all; without it the temporary folder is removed."""

from __future__ import annotations

import os
import tempfile

import pytest

from fp8mla.cli import main

TINY = ["--device", "cpu", "--layers", "2", "--heads", "4", "--hidden", "128",
        "--pool-slots", "2000", "--context", "64", "--batch", "2", "--steps", "1",
        "--no-progress"]  # fmt: skip


def _demo_folders(folder) -> list[str]:
    return [name for name in os.listdir(folder) if name.startswith("fp8mla-demo-")]


@pytest.fixture
def no_work(monkeypatch):
    import fp8mla.demo

    def started(*args, **kwargs):
        raise AssertionError("the demo started before refusing its input")

    monkeypatch.setattr(fp8mla.demo, "run_demo", started)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_save_trace_never_replaces_a_fifo(tmp_path, capsys, no_work):
    fifo = tmp_path / "trace.json.gz"
    os.mkfifo(fifo)
    assert main(["demo", *TINY, "--save-trace", str(fifo)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"fp8mla demo: error: --save-trace {fifo}: is a FIFO (named pipe), not a regular file: "
        f"not replaced\n"
    )
    assert fifo.is_fifo()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_save_trace_never_replaces_a_device(capsys, no_work):
    assert main(["demo", *TINY, "--save-trace", "/dev/full"]) == 2
    assert "is a character device, not a regular file" in capsys.readouterr().err
    assert not os.path.isfile("/dev/full")


def test_no_temporary_folder_is_left_and_a_kept_trace_is_whole(tmp_path, monkeypatch, capsys):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert main(["demo", *TINY]) == 0
    out = capsys.readouterr().out
    assert "trace: not kept (--save-trace PATH keeps it)" in out
    assert _demo_folders(scratch) == []  # no fp8mla-demo-* folder left behind
    kept = tmp_path / "kept" / "trace.json.gz"
    kept.parent.mkdir()
    kept.write_bytes(b"old")
    assert main(["demo", *TINY, "--save-trace", str(kept)]) == 0
    assert f"trace: {kept}" in capsys.readouterr().out
    assert kept.read_bytes()[:2] == b"\x1f\x8b"  # the new trace, gzipped, replaced the old
    assert os.listdir(kept.parent) == ["trace.json.gz"]  # no temporary file beside it
    assert _demo_folders(scratch) == []
