"""One error style across commands, ranges on every numeric option (checked before any work,
shown in --help), --version, and bare ``fp8mla``."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from fp8mla.cli import build_parser, main
from fp8mla.cli._common import Range

# fp8mla COMMAND: error: --flag: expected …, got …
STYLE = re.compile(
    r"fp8mla [a-z]+: error: (--[a-z-]+|TRACE|PATH)(, --[a-z-]+)*: expected .+, got .+\n"
)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command starts its work (the demo's run, the doctor's read)."""
    import fp8mla.demo
    import fp8mla.doctor

    def started(*args, **kwargs):
        raise AssertionError("the command started work before refusing its input")

    monkeypatch.setattr(fp8mla.demo, "run_demo", started)
    monkeypatch.setattr(fp8mla.doctor, "diagnose", started)


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--heads", "1000"],
        ["demo", "--pool-slots", str(10**30)],
        ["demo", "--pool-slots", "1e5"],
        ["demo", "--pool-slots", "0"],
        ["demo", "--batch", "100000"],
        ["demo", "--context", "-1"],
        ["demo", "--layers", "5000"],
        ["demo", "--steps", "0"],
        ["demo", "--hidden", "x"],
        ["demo", "--device", "cpu", "--pool-slots", "1000000000", "--layers", "1024"],
        ["demo", "--device", "cpu", "--context", "5000", "--pool-slots", "4000"],
        ["demo", "--save-trace", ""],
        ["doctor", "t.json", "--layers", "0"],
        ["doctor", "t.json", "--batch", "0"],
        ["doctor", "t.json", "--context", "99999999999"],
        ["doctor", "t.json", "--tp", "0"],
        ["doctor", "t.json", "--active-tokens", "-5"],
        ["doctor", ""],
        ["doctor", "t.json", "--html", ""],
        ["gap", "--model", "glm-5", "--gpu", "h200", "--tp", "0"],
        ["gap", "--model", "glm-5", "--gpu", "h200", "--tp", "3"],
        ["gap", "--model", "glm-5", "--gpu", "h200", "--batch", "0"],
        ["gap", "--model", "glm-5", "--gpu", "h200", "--context", "-1"],
        ["gap", "--model", "glm-5", "--gpu", "h200", "--pool-slots", str(10**30)],
        ["gap", "--model", "glm-5", "--gpu", "h200", "--measured-tpot", "0"],
        ["gap", "--model", "glm-5", "--gpu", "h200", "--measured-tpot", "nan"],
        ["gap", "--model", "glm-5", "--bandwidth", "1000"],
        ["gap", "--model", "glm-5", "--bandwidth", "-1"],
        ["gap", "--model", "glm-5", "--gpu", "h200", "--weights", "int4"],
        ["gap", "--model", "", "--gpu", "h200"],
        ["scan", ""],
        ["bench", "--out", ""],
    ],
)
def test_one_error_style_before_any_work(argv, capsys, no_work):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert STYLE.fullmatch(err), err
    assert "argument " not in err


def test_demo_names_the_flag_it_refuses(capsys, no_work):
    assert main(["demo", "--heads", "1000"]) == 2
    assert capsys.readouterr().err == (
        "fp8mla demo: error: --heads: expected an integer in 1–128, got 1000\n"
    )
    assert main(["demo", "--device", "cpu", "--pool-slots", "1000000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fp8mla demo: error: --pool-slots, --layers: expected the demo to fit")
    assert "576 B" in err


def test_gap_pool_slots_and_model_folder(tmp_path, capsys):
    assert main(["gap", "--model", "glm-5", "--gpu", "h200", "--pool-slots", "1" + "0" * 30]) == 2
    assert "of the gap" not in capsys.readouterr().out
    assert main(["gap", "--model", str(tmp_path), "--gpu", "h200"]) == 2
    assert capsys.readouterr().err == (
        f"fp8mla gap: error: --model: {tmp_path}: a directory without a config.json\n"
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_gap_refuses_a_fifo_config_without_waiting(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "fp8mla", "gap", "--model", str(fifo), "--gpu", "h200"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        f"fp8mla gap: error: --model: {fifo}: not a regular file: a FIFO (named pipe), not "
        f"read; pipes are read by fp8mla doctor\n"
    )


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_numeric_option_has_a_range_shown_in_help():
    seen = 0
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if action.type in (int, float):
                pytest.fail(f"fp8mla {name} {action.option_strings}: a number without a range")
            if isinstance(action.type, Range):
                seen += 1
                assert str(action.type) in action.help, (name, action.option_strings)
    assert seen >= 18


def test_version_and_bare_command(capsys):
    from fp8mla import __version__

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"fp8mla {__version__}\n"
    assert main(["--version"]) == 0
    capsys.readouterr()
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: fp8mla")
    assert err.splitlines()[-1] == (
        "fp8mla: error: expected a COMMAND (demo, doctor, scan, bench, gap, info); "
        "fp8mla --help says more"
    )


def test_bare_command_in_a_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "fp8mla"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith("usage: fp8mla")
