"""Every kernel configuration the planners can select builds for every GPU target -- NVIDIA
SM80 … SM120 and AMD gfx90a … gfx1100 -- on a CPU, without spills above the limit or shared
memory over the target's limit (``fp8mla.tools.compile_matrix``).

The builds run once, in a subprocess: this test process runs kernels under
``TRITON_INTERPRET=1``, where ``@triton.jit`` functions cannot be compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fp8mla
from fp8mla.attention.targets import TARGETS
from fp8mla.tools.compile_matrix import all_jobs, available_targets
from fp8mla.tools.spill_limits import SPILL_LIMIT

AVAILABLE, MISSING = available_targets()
JOBS = all_jobs()


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict[str, dict]:
    if not AVAILABLE:
        pytest.skip("no Triton GPU backend can build here: " + "; ".join(MISSING.values()))
    path = tmp_path_factory.mktemp("compile_matrix") / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(fp8mla.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-m",
        "fp8mla.tools.compile_matrix",
        "--targets",
        ",".join(AVAILABLE),
        "--json",
        str(path),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if not path.exists():  # exit status 1 only says some rows failed; the tests name them
        pytest.fail(f"compile matrix did not run (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return {row["id"]: row for row in json.loads(path.read_text())}


@pytest.mark.parametrize("job", JOBS, ids=[j.id for j in JOBS])
def test_kernel_builds_within_limits(matrix, job):
    backend = TARGETS[job.target].backend
    if job.target not in AVAILABLE:
        pytest.skip(f"{job.target}: {MISSING[backend]}")
    row = matrix[job.id]
    where = f"{job.target} {job.kernel} {job.variant}"
    assert not row["reason"].startswith("compile error"), f"{where}: {row['reason']}"
    assert row["spill_bytes"] <= job.spill_limit, (
        f"{where}: spills {row['spill_bytes']} B > {job.spill_limit} B"
    )
    assert row["smem_bytes"] <= row["limit_bytes"], (
        f"{where}: shared memory {row['smem_bytes']} B > {row['limit_bytes']} B"
    )
    assert row["ok"], f"{where}: {row['reason']}"


def test_spill_exceptions_carry_reasons():
    for job in JOBS:
        if job.spill_limit > SPILL_LIMIT:
            assert job.spill_reason, job.id


def test_every_target_and_kernel_is_in_the_matrix():
    seen = {(j.target, j.kernel) for j in JOBS}
    kernels = ("attention", "merge", "kv_write", "kv_stage", "ds_mla_pack")
    assert seen == {(t, k) for t in TARGETS for k in kernels}
    assert len({j.id for j in JOBS}) == len(JOBS)
