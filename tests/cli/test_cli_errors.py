"""One CLI style: bad input to any subcommand is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from fp8mla.cli import build_parser, main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--sections", "goals,nope"], "fp8mla bench: error: --sections: expected"),
        (["bench", "--nope"], "fp8mla bench: error: unrecognized arguments: --nope"),
        (["demo", "--layers", "0"], "fp8mla demo: error: --layers: expected an integer in 1–1,024"),
        (
            ["demo", "--device", "tpu"],
            "fp8mla demo: error: --device: expected one of 'cuda', 'cpu', got 'tpu'",
        ),
        (
            ["demo", "--device", "cpu", "--context", "5000", "--pool-slots", "4000"],
            "fp8mla demo: error: --pool-slots: expected batch × context <= --pool-slots (4,000)",
        ),
        (
            ["demo", "--device", "cpu", "--save-trace", "/no/such/dir/t.json"],
            "fp8mla demo: error: --save-trace /no/such/dir/t.json: no such directory",
        ),
        (["doctor"], "fp8mla doctor: error: the following arguments are required: TRACE"),
        (["doctor", "/no/such.json"], "fp8mla doctor: error: /no/such.json: no such file"),
        (["gap", "--model", "glm-5"], "fp8mla gap: error: give a GPU preset (--gpu)"),
        (
            ["gap", "--model", "glm-5", "--gpu", "a100"],
            "fp8mla gap: error: --gpu: unknown GPU 'a100'",
        ),
        (["scan"], "fp8mla scan: error: give at least one PATH or --package NAME"),
        (["info", "--nope"], "fp8mla info: error: unrecognized arguments: --nope"),
        (["nope"], "fp8mla: error: COMMAND: expected one of 'demo', 'doctor'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert not out
    assert err.startswith(message), err
    assert err.count("\n") == 1, err


def test_help_exits_0(capsys):
    for argv in (["--help"], ["doctor", "--help"], ["scan", "--help"], ["gap", "--help"]):
        assert main(argv) == 0
    assert "usage: fp8mla" in capsys.readouterr().out


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("command", ["demo", "doctor", "scan", "gap", "bench", "info"])
def test_every_option_has_help(command):
    missing = [
        a.option_strings or a.dest
        for a in _subparsers()[command]._actions
        if not (a.help and a.help.strip() and a.help != argparse.SUPPRESS)
    ]
    assert missing == []


def test_demo_help_names_every_option(capsys):
    assert main(["demo", "--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--layers", "--pool-slots", "--device", "--cuda-graph", "--save-trace"):
        assert option in text


def test_module_entry_point_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "fp8mla", "bench", "--sections", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("fp8mla bench: error:") and "Traceback" not in proc.stderr
