"""Every kernel configuration the planners can select builds for every GPU target -- NVIDIA
SM80 … SM120 and AMD gfx90a … gfx1100 -- on a CPU, without spills above the limit or shared
memory over the target's limit (``fp8mla.tools.compile_matrix``).

The builds run once, in a subprocess: this test process runs kernels under
``TRITON_INTERPRET=1``, where ``@triton.jit`` functions cannot be compiled. They must pass on a
busy machine too, so nothing here races the clock:

- no limit on how long the builds take, only on how long none completes (a hang): the
  subprocess prints a line every 20 builds and at least once a minute while builds complete,
  and those lines are shown as they come (pytest's capture is bypassed for them);
- builds measured before (same kernel source, options, target, toolchain) are read back from
  the compile matrix's cache instead of rebuilt;
- the subprocess runs in its own process group, removed whatever way the test ends, and its
  build processes die with it (``PR_SET_PDEATHSIG``), so none outlives the test run;
- if the matrix cannot be built, the first test says why and the others skip, instead of one
  error per kernel.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import pytest

import fp8mla
from fp8mla.attention.targets import TARGETS
from fp8mla.tools.compile_matrix import all_jobs, available_targets
from fp8mla.tools.spill_limits import SPILL_LIMIT

AVAILABLE, MISSING = available_targets()
JOBS = all_jobs()
# No build completing for this long is a hang, not a slow machine (one build takes seconds to
# a minute or two on a loaded CPU).
STALL_SECONDS = float(os.environ.get("FP8MLA_MATRIX_STALL_S", 1800))


class MatrixFailed:
    """Why the matrix could not be built; said once (by the first test), then skipped."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.reported = False


def _say(request: pytest.FixtureRequest, line: str) -> None:
    """Show ``line`` on the terminal / CI log now, past pytest's output capture."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        print(line, file=sys.stderr, flush=True)
        return
    with capman.global_and_fixture_disabled():
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _stop(proc: subprocess.Popen) -> None:
    """End the subprocess and everything in its process group (the build processes)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            time.sleep(0.1)  # let the group's other members go too
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, if any
    except ProcessLookupError:
        pass
    proc.wait()


def _build(request: pytest.FixtureRequest, path: Path) -> str | None:
    """Run the matrix into ``path``; None on success, else why it failed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(fp8mla.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env["FP8MLA_DIE_WITH_PARENT"] = str(os.getpid())  # even if this process is killed
    cmd = [sys.executable, "-m", "fp8mla.tools.compile_matrix", "--targets", ",".join(AVAILABLE)]
    cmd += ["--json", str(path)]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: removed as one below
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    tail: deque[str] = deque(maxlen=60)
    try:
        while True:
            try:
                line = lines.get(timeout=STALL_SECONDS)
            except queue.Empty:
                return (
                    f"no build completed in {STALL_SECONDS:.0f} s: a hang "
                    f"(FP8MLA_MATRIX_STALL_S raises the limit); last lines:\n" + "\n".join(tail)
                )
            if line is None:
                break
            tail.append(line)
            if line.startswith("compile matrix:"):
                _say(request, line)
        code = proc.wait()
    finally:
        _stop(proc)
    if not path.exists():  # exit status 1 only says some rows failed; the tests name them
        return f"compile matrix did not run (exit {code}):\n" + "\n".join(tail)
    return None


@pytest.fixture(scope="module")
def matrix(request, tmp_path_factory) -> dict[str, dict] | MatrixFailed:
    if not AVAILABLE:
        pytest.skip("no Triton GPU backend can build here: " + "; ".join(MISSING.values()))
    path = tmp_path_factory.mktemp("compile_matrix") / "rows.json"
    why = _build(request, path)
    if why:
        return MatrixFailed(why)
    return {row["id"]: row for row in json.loads(path.read_text())}


@pytest.mark.parametrize("job", JOBS, ids=[j.id for j in JOBS])
def test_kernel_builds_within_limits(matrix, job):
    if isinstance(matrix, MatrixFailed):
        if matrix.reported:
            pytest.skip("the compile matrix did not build (see the first test's failure)")
        matrix.reported = True
        pytest.fail(matrix.message, pytrace=False)
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
    kernels = ("attention", "merge", "kv_write", "kv_stage", "ds_mla_pack", "sparse", "indexer",
               "q_quant")  # fmt: skip
    assert seen == {(t, k) for t in TARGETS for k in kernels}
    assert len({j.id for j in JOBS}) == len(JOBS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_build_processes_die_with_their_parent(tmp_path):
    """A build process whose parent is killed (SIGKILL: no cleanup runs) ends too."""
    pidfile = tmp_path / "worker.pid"
    script = f"""
import os, sys, time
from fp8mla.tools.build_runs import die_with_parent
parent = os.getpid()
child = os.fork()
if child == 0:
    die_with_parent(parent)
    open({str(pidfile)!r}, "w").write(str(os.getpid()))
    time.sleep(600)
    os._exit(0)
time.sleep(600)
"""
    src = str(Path(fp8mla.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=src)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "no worker started"
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while _alive(worker):
            assert time.monotonic() < deadline, "the build process outlived its parent"
            time.sleep(0.05)
    finally:
        _stop(proc)


def test_a_build_measured_before_is_read_back(tmp_path, monkeypatch):
    from fp8mla.tools import build_runs
    from fp8mla.tools.kernel_builds import Build, Resources

    class Kernel:
        cache_key = "source-hash-1"

    monkeypatch.setattr(Build, "function", lambda self: Kernel)
    builds = []

    def measure(build, target):
        builds.append(build)
        return Resources(ok=True, regs=96, spill_bytes=0, smem_bytes=1024, extra={"x": 1})

    monkeypatch.setattr(build_runs, "measure", measure)
    build = Build("fp8mla.kernels.merge:mla_merge_kernel", (("o_ptr", "bf16"),), (("D", 512),), 4)
    target = next(t for t in TARGETS.values() if t.backend == "hip")  # no ptxas needed
    first = build_runs.cached_measure(build, target, str(tmp_path))
    again = build_runs.cached_measure(build, target, str(tmp_path))
    assert first == again and len(builds) == 1  # read back, not rebuilt
    Kernel.cache_key = "source-hash-2"  # the kernel's source changed: built again
    build_runs.cached_measure(build, target, str(tmp_path))
    other = Build(build.kernel, build.pointers, build.constexprs, 8)  # other options: again
    build_runs.cached_measure(other, target, str(tmp_path))
    assert len(builds) == 3
    assert build_runs.cached_measure(other, target, None) == first and len(builds) == 4


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_fail_on_compile_passes_spills_and_fails_compile_errors(monkeypatch, tmp_path, capsys):
    """``--fail-on compile`` (another Triton's check, as ``make test`` runs the GPU machine's):
    a spill over its limit is noted, a build the compiler rejects fails the run."""
    from fp8mla.tools import compile_matrix as cm

    def rows(reasons):
        return [cm.Row("sm90", "attention", f"v{i}", 255, 200, 0, 1, not r, r)
                for i, r in enumerate(reasons)]  # fmt: skip

    out = str(tmp_path / "m.md")
    for reasons, fail_on, code in (
        (["", "spills 200 B > 128 B"], "compile", 0),
        (["", "spills 200 B > 128 B"], "any", 1),
        (["compile error: PassManager::run failed", ""], "compile", 1),
    ):
        monkeypatch.setattr(cm, "build_matrix", lambda *a, r=reasons, **k: rows(r))
        argv = ["--targets", "sm90", "--quiet", "--write", out, "--fail-on", fail_on]
        assert cm.main(argv) == code, (reasons, fail_on)
        err = capsys.readouterr().err
        assert ("FAILED" in err) == bool(code)
