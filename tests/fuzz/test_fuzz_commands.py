"""Each command fed 200 random truncations and byte flips of the shipped traces, sources and a
model config: every run ends within its time limit with exit status 0/1 (a readable input) or
2 (a damaged one, one line on stderr), never a traceback and never the doctor's "cannot
analyse" (its catch-all for its own bugs).

The runs are in-process (``fp8mla.cli.main``: an exception escaping it is the traceback a user
would see, and fails the test); one run per command in a subprocess checks the same from the
outside. ``FP8MLA_FUZZ_SEED`` picks other inputs (the failure message names the seed and case).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fp8mla.cli import main
from fp8mla.gap.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]
TRACES = sorted((ROOT / "tests" / "data" / "traces").rglob("*.json.gz"))
SOURCES = sorted((ROOT / "tests" / "scan" / "fixtures").glob("*.py")) + [
    ROOT / "src" / "fp8mla" / "scan" / "visitor.py",
    ROOT / "src" / "fp8mla" / "doctor" / "load.py",
]
RUNS = 200
SECONDS = 30  # one run; the slowest intact trace takes under a second on an idle CPU
SEED = int(os.environ.get("FP8MLA_FUZZ_SEED", "52"))


class _TimeLimit(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    def expire(signum, frame):
        raise _TimeLimit(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _mutate(rng: random.Random, data: bytes) -> tuple[bytes, str, bool]:
    """(damaged bytes, what was done, whether the result is certainly damaged)."""
    if rng.random() < 0.5:
        cut = rng.randrange(0, len(data))
        return data[:cut], f"truncated to {cut} of {len(data)} bytes", True
    out = bytearray(data)
    flips = []
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] = rng.randrange(256)
        flips.append(i)
    return bytes(out), f"bytes {sorted(flips)} replaced", False


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with _time_limit(SECONDS), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _check(command: str, code: int, err: str, case: str, damaged: bool) -> None:
    where = f"fp8mla {command} on {case} (FP8MLA_FUZZ_SEED={SEED})"
    assert code in (0, 1, 2), f"{where}: exit {code}\n{err}"
    assert "Traceback" not in err and "FP8MLA_DEBUG" not in err, f"{where}:\n{err}"
    assert all(c.isprintable() for line in err.splitlines() for c in line), f"{where}: {err!r}"
    if damaged:  # exit 2, or with --allow-partial --fail-on: 1 (a partial report cannot pass)
        expected = (1, 2) if "--allow-partial" in case else (2,)
        assert code in expected, f"{where}: a damaged input exited {code}"
    if code == 2:
        last = err.splitlines()[-1] if err else ""
        assert last.startswith(f"fp8mla {command}: error: "), f"{where}: {err!r}"


def _inputs(kind: str) -> list[tuple[str, bytes, str]]:
    """(name, intact bytes, file suffix) of each shipped input of a kind."""
    if kind == "doctor":
        out = []
        for path in TRACES:
            raw = path.read_bytes()
            out.append((path.name, raw, ".json.gz"))
            if len(raw) < 400_000:  # the JSON itself, for damage the gzip check cannot catch
                out.append((path.name[:-3], gzip.decompress(raw), ".json"))
        return out
    if kind == "scan":
        return [(p.name, p.read_bytes(), ".py") for p in SOURCES]
    return [
        (f"{name}.config.json", json.dumps(cfg, indent=2).encode(), ".json")
        for name, (_, cfg, _) in PRESETS.items()
    ]


def _argv(command: str, path: str, rng: random.Random, tmp_path: Path) -> list[str]:
    if command == "doctor":
        extra = rng.choice([[], ["--json"], ["--allow-partial"], ["--allow-partial", "--json"],
                            ["--allow-partial", "--html", str(tmp_path / "r.html")]])  # fmt: skip
        return ["doctor", path, "--no-progress", "--fail-on", "high", *extra]
    if command == "scan":
        return ["scan", path, *rng.choice([[], ["--json"]])]
    return ["gap", "--model", path, "--gpu", "h200", "--measured-tpot", "90", "--pool-slots",
            "495552", *rng.choice([[], ["--json"]])]  # fmt: skip


@pytest.mark.parametrize("command", ["doctor", "scan", "gap"])
def test_damaged_inputs_end_with_0_1_or_2(command, tmp_path):
    rng = random.Random(f"{SEED}-{command}")
    inputs = _inputs(command)
    # small traces weigh more: the runs stay short, the large ones still come up
    weights = [1 / max(len(data), 50_000) ** 0.5 for _, data, _ in inputs]
    for run in range(RUNS):
        name, data, suffix = rng.choices(inputs, weights)[0]
        damaged_data, how, damaged = _mutate(rng, data)
        if damaged and suffix == ".json" and damaged_data.rstrip() == data.rstrip():
            damaged = False  # only trailing white space was cut
        if command != "doctor":
            damaged = False  # a cut source or config may still parse
        path = tmp_path / f"input{suffix}"
        path.write_bytes(damaged_data)
        argv = _argv(command, str(path), rng, tmp_path)
        case = f"run {run}: {name} {how}, {' '.join(argv[2:])}"
        try:
            code, _, err = _run(argv)
        except _TimeLimit as exc:
            pytest.fail(f"fp8mla {command} on {case}: {exc}")
        _check(command, code, err, case, damaged)


@pytest.mark.parametrize("command", ["doctor", "scan", "gap"])
def test_a_damaged_input_in_a_subprocess(command, tmp_path):
    rng = random.Random(f"{SEED}-{command}-subprocess")
    name, data, suffix = _inputs(command)[0]
    path = tmp_path / f"input{suffix}"
    path.write_bytes(data[: len(data) // 2])
    proc = subprocess.run(
        [sys.executable, "-m", "fp8mla", *_argv(command, str(path), rng, tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    _check(command, proc.returncode, proc.stderr, f"{name} cut in half", command == "doctor")
