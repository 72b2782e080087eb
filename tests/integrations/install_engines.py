"""Install the pinned engine packages for tests/integrations into a target folder.

    python tests/integrations/install_engines.py --target .venv/engines

Everything in requirements-engines.txt goes in with ``pip install --no-deps --target``, apart
from fp8mla's environment (whose CPU torch the engines must not replace). When pip fails and
the package registry cannot be reached, the folder gets an ``UNREACHABLE`` file saying so and
the script exits 0: the integration tests then skip with that one line. Any other failure
fails the build.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-engines.txt"
STAMP = ".installed"
UNREACHABLE = "UNREACHABLE"


def _pip(*args: str, timeout: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def registry_reachable() -> bool:
    """Whether pip can list a pinned engine's releases (the registry answers)."""
    try:
        probe = _pip("index", "versions", "sglang", "--retries", "0", "--timeout", "15", timeout=60)
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, type=Path)
    args = ap.parse_args()
    target: Path = args.target
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if (target / STAMP).is_file() and (target / STAMP).read_text().strip() == digest:
        return 0
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    print(f"fp8mla: installing the pinned engine packages into {target} (no dependencies)")
    res = _pip(
        "install", "-q", "--no-deps", "--no-compile", "--target", str(target),
        "-r", str(REQUIREMENTS), timeout=1800,
    )  # fmt: skip
    if res.returncode == 0:
        (target / STAMP).write_text(digest + "\n")
        return 0
    if not registry_reachable():
        msg = "package registry unreachable: sglang==0.5.23 / vllm==0.33.0 not installed"
        (target / UNREACHABLE).write_text(msg + "\n")
        print(f"fp8mla: {msg}; the engine integration tests will skip")
        return 0
    sys.stderr.write(res.stdout[-4000:] + res.stderr[-4000:])
    return res.returncode


if __name__ == "__main__":
    raise SystemExit(main())
