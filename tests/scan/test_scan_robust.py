"""``fp8mla scan`` when nothing can be scanned, where its notes go, and one fix paragraph per
distinct fix."""

from __future__ import annotations

from pathlib import Path

from fp8mla.cli import main
from fp8mla.scan import scan_paths
from fp8mla.scan.report import format_text

FIXTURES = Path(__file__).parent / "fixtures"


def test_nothing_scanned_is_exit_2_with_the_notes_on_stderr(tmp_path, capsys):
    (tmp_path / "a.py").write_bytes(b"def f(:\n")
    (tmp_path / "b.py").write_bytes(b"\x00\x01binary")
    for argv in ([str(tmp_path)], [str(tmp_path), "--json"]):
        assert main(["scan", *argv]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        a, b, error = err.splitlines()
        assert a.startswith(f"fp8mla scan: skipped {tmp_path / 'a.py'}: syntax error, line 1")
        assert b == f"fp8mla scan: skipped {tmp_path / 'b.py'}: binary file (contains NUL bytes)"
        assert error == "fp8mla scan: error: nothing could be scanned: 2 files skipped"


def test_an_empty_tree_is_exit_2(tmp_path, capsys):
    assert main(["scan", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err == f"fp8mla scan: error: no Python files (*.py) under {tmp_path}\n"
    )


def test_one_fix_paragraph_per_distinct_fix(capsys):
    result = scan_paths([FIXTURES])
    text = format_text(result)
    fixes = {f.suggestion for f in result.findings}
    assert len(result.findings) > 2 * len(fixes)  # many sites share a fix
    for fix in fixes:
        assert text.count(fix) == 1, fix
    paragraphs = [p for p in text.split("\n\n") if p.startswith("fix (")]
    assert len(paragraphs) == len(fixes)
    n = sum(f.kind == "whole_pool_cast" for f in result.findings)
    assert f"fix ({n} whole_pool_cast sites): read the FP8 cache in-kernel" in text
    # every site is still listed, under its fix
    for f in result.findings:
        assert f"{f.path}:{f.line}: {f.severity} {f.kind} in {f.function}" in text


def test_control_characters_from_a_file_are_escaped(tmp_path, capsys):
    src = tmp_path / "k\x1b[2Jv.py"
    src.write_text('def f(kv_cache, q):\n    return kv_cache.to(q.dtype)  # "\x1b[31m"\n')
    assert main(["scan", str(src)]) == 1
    out, _ = capsys.readouterr()
    assert "\x1b" not in out and "\\x1b[31m" in out and "k\\x1b[2Jv.py" in out
    bad = tmp_path / "x\x07.py"
    bad.write_text("def f(:\n")
    assert main(["scan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "\x07" not in err and "x\\x07.py" in err
