"""The A/B tools of ``benchmarks/``: ``kernel_sass.py``'s SASS loops on a small listing of the
form ``cuobjdump -sass`` prints, and ``ab_sparse.py``'s table and records on
``time_revision.py --sparse`` files."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    if str(BENCH) not in sys.path:  # (the scripts import their siblings, as when run)
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listing(ops: list[str]) -> str:
    """``ops`` as cuobjdump's lines, 16 bytes apart from address 0."""
    return "\n".join(
        f"        /*{16 * i:04x}*/   {op} ;   /* 0x000000000000000000 */"
        for i, op in enumerate(ops)
    )


def kernel_listing() -> str:
    ops = ["USETMAXREG.DEALLOC.CTAPOOL 0x78", "MOV R1, c[0x0][0x28]"]  # 0x00, 0x10
    ops += ["LDG.E.128 R4, desc[UR4][R2.64]"] + ["HMUL2 R8, R4, R6"] * 3  # 0x20-0x50: loop A
    ops += ["@!P0 BRA 0x20"]  # 0x60
    ops += ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0"]  # 0x70: loop B starts
    ops += ["@!P0 BRA `(.L_x_3) 0xd0", "HFMA2.MMA R9, R8, R8, R9"]  # 0x80, 0x90
    ops += ["@!P1 BRA 0x70"]  # 0xa0: loop B ends
    ops += ["EXIT", "BRA 0xc0"]  # 0xb0, 0xc0 (a self-branch: one instruction)
    # 0xd0-0xf0: the wait's retry stub, spinning in place, then back to after its branch
    ops += ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0", "@!P0 BRA 0xd0", "BRA 0x90"]
    return listing(ops)


def test_kernel_sass_loops_and_partitions():
    ks = load("kernel_sass")
    sass = kernel_listing()
    code = ks.instructions(sass)
    assert [ins.address for ins in code] == [16 * i for i in range(16)]
    assert code[6].opcode == "BRA" and code[7].opcode == "SYNCS.PHASECHK.TRANS64.TRYWAIT"
    assert [ins.source for ins in ks.partitions(code)] == ["USETMAXREG.DEALLOC.CTAPOOL 0x78"]
    # loops A and B; not the retry stub's spin or its branch back into loop B
    assert ks.loops(code) == [(2, 6), (7, 10), (12, 12)]
    text = ks.report(sass, min_count=2, top=2).splitlines()
    assert len(text) == 3
    assert text[0].strip().startswith("0x00000 USETMAXREG")
    assert text[1].strip() == "loop 0x00020-0x00060: 5 instructions; HMUL2 3, LDG 1"
    assert text[2].strip().startswith("loop 0x00070-0x000a0: 4 instructions")


def rows(label: str, us: dict[str, float], env: bool = True) -> list[dict]:
    out = []
    for case, t in us.items():
        r = dict(label=label, case=case, us=t, p20=t - 1, p80=t + 1, tbps=0.75, tflops=320.0,
                 rel_err=1.66e-3, lse_rel_err=1.9e-7, edge_rel_err=1.67e-3,
                 edge_lse_rel_err=1.9e-7, empty_row_ok=True, kernel="pingpong", splits=1)  # fmt: skip
        if env:
            r.update(gpu="NVIDIA H100 80GB HBM3", date="2026-12-07", torch="2.11.0", triton="3.6.0")
        out.append(r)
    return out


@pytest.fixture
def ab_files(tmp_path):
    timings = [
        ("main", {"B128_H128_K2048_Q2": 450.0, "T2048_H128_K2048": 3500.0}),
        ("new", {"B128_H128_K2048_Q2": 420.0, "T2048_H128_K2048": 3300.0}),
        ("main", {"B128_H128_K2048_Q2": 454.0, "T2048_H128_K2048": 3520.0}),
        ("new", {"B128_H128_K2048_Q2": 418.0, "T2048_H128_K2048": 3340.0}),
    ]
    paths = []
    for i, (label, us) in enumerate(timings):
        p = tmp_path / f"{label}.{i}.json"
        p.write_text(json.dumps(rows(label, us)))
        paths.append(str(p))
    return paths


def test_ab_sparse_table(ab_files):
    ab = load("ab_sparse")
    text = ab.table(ab.load(ab_files)).splitlines()
    assert text[0] == "| case | main | new |"
    # medians 452 -> 419 (-7.3%) and 3,510 -> 3,320 (-5.4%), every timing in round order
    assert text[2] == "| B128_H128_K2048_Q2 | 450.00, 454.00 | 420.00, 418.00 (-7.3%) |"
    assert text[3] == "| T2048_H128_K2048 | 3,500.0, 3,520.0 | 3,300.0, 3,340.0 (-5.4%) |"
    flipped = ab.table(ab.load(ab_files), base="new").splitlines()
    assert flipped[2].endswith("| 450.00, 454.00 (+7.9%) | 420.00, 418.00 |")
    with pytest.raises(ValueError, match="no rows of --base"):
        ab.table(ab.load(ab_files), base="other")


def test_ab_sparse_records(ab_files, tmp_path):
    ab = load("ab_sparse")
    results = tmp_path / "results.jsonl"
    argv = ab_files + ["--append", str(results), "--run", "s99a", "--revision", "main=main abc",
                       "--revision", "new=branch def", "--tests", "new=tests: 37 passed"]  # fmt: skip
    assert ab.main(argv) == 0
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(recs) == 8
    q2 = [r for r in recs if r["case"] == "B128_H128_K2048_Q2" and r["revision"] == "branch def"]
    assert [r["us_median"] for r in q2] == [420.0, 418.0]
    r = q2[0]
    assert (r["section"], r["run"], r["tests"]) == ("sparse-ab", "s99a", "tests: 37 passed")
    assert (r["tokens"], r["heads"], r["topk"], r["page_size"]) == (256, 128, 2048, 64)
    assert (r["gpu"], r["gbps"], r["kernel"]) == ("NVIDIA H100 80GB HBM3", 750.0, "pingpong")
    assert {x["tests"] for x in recs if x["revision"] == "main abc"} == {"not run"}


def test_ab_sparse_errors(ab_files, tmp_path, capsys):
    ab = load("ab_sparse")
    results = tmp_path / "results.jsonl"
    # a label without its revision: nothing appended
    assert (
        ab.main(ab_files + ["--append", str(results), "--run", "s1", "--revision", "main=x"]) == 1
    )
    assert "--revision needed for new" in capsys.readouterr().err
    assert not results.exists()
    # rows written before time_revision.py recorded the machine need it named
    old = tmp_path / "old.json"
    old.write_text(json.dumps(rows("old", {"B128_H64_K2048": 123.0}, env=False)))
    args = [str(old), "--append", str(results), "--run", "s1", "--revision", "old=x"]
    assert ab.main(args) == 1
    assert "no gpu, date, torch, triton" in capsys.readouterr().err
    env = ["--gpu", "H100", "--date", "2026-12-01", "--torch", "2.11", "--triton", "3.6"]
    assert ab.main(args + env) == 0
    assert json.loads(results.read_text())["gpu"] == "H100"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"label": "x"}]))
    assert ab.main([str(bad)]) == 1
    assert "a row lacks 'case'" in capsys.readouterr().err


# A stand-in for the GPU machine's python3 in run_ab_on_gpu.sh: time_revision.py writes one
# row a case (sparse or dense by its arguments), pytest passes, xdist is absent, and the
# table tool runs for real.
FAKE_PYTHON = r"""#!/usr/bin/env bash
case "$*" in
  *time_revision.py*)
    label= json= kind=dense
    while [ $# -gt 0 ]; do
      case $1 in --label) label=$2; shift ;; --json) json=$2; shift ;; --sparse) kind=sparse ;; esac
      shift
    done
    sleep "${FAKE_SLEEP:-0}"
    echo "[{\"label\": \"$label\", \"case\": \"$kind-case\", \"us\": 10.0}]" > "$json" ;;
  *"-m pytest"*) echo "3 passed in 0.1s" ;;
  *"import xdist"*) exit 1 ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


def run_ab(tmp_path, **env):
    if shutil.which("bash") is None:
        pytest.skip("run_ab_on_gpu.sh needs bash")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    src = str(BENCH.parent / "src")
    run_env = dict(
        os.environ,
        PYTHON=str(fake),
        REAL_PYTHON=sys.executable,
        TREES=f"main={src} new={src}",
        **env,
    )
    out = tmp_path / "out"
    p = subprocess.run(
        ["bash", str(BENCH / "run_ab_on_gpu.sh"), str(out)],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return p, out


def test_run_ab_dense_leg(tmp_path):
    """``DENSE=1`` times the dense cases beside the sparse ones in every round, runs both
    test lists against the second tree, and prints one table for each."""
    p, out = run_ab(tmp_path, DENSE="1", REPS="2")
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("main", "new"):
        for r in (1, 2):
            assert json.loads((out / f"{name}.{r}.json").read_text())[0]["case"] == "sparse-case"
            dense = json.loads((out / f"{name}.dense.{r}.json").read_text())
            assert dense[0]["case"] == "dense-case"
    tests = (out / "tests.log").read_text()
    assert "== tests of new: tests/dsa/test_sparse_sm90.py" in tests
    assert "== tests of new: tests/attention/test_kernels.py" in tests
    assert "tests of main" not in tests
    assert "| sparse-case | 10.00, 10.00 | 10.00, 10.00 (+0.0%) |" in p.stdout
    assert "| dense-case | 10.00, 10.00 | 10.00, 10.00 (+0.0%) |" in p.stdout


def test_run_ab_budget_spent(tmp_path):
    """Past ``BUDGET`` every remaining step is skipped and named; what ran is still
    tabled."""
    p, out = run_ab(tmp_path, BUDGET="11", FAKE_SLEEP="2", REPS="2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (out / "main.1.json").exists()
    assert not (out / "new.2.json").exists()
    assert "new.2.json skipped (BUDGET spent)" in p.stdout
    assert "tests of new skipped (BUDGET spent)" in p.stdout
    assert "| sparse-case |" in p.stdout
